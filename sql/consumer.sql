--
-- The consumer API: complete() records one receipt per command,
-- inbox_accept() remembers which commands a consumer has accepted.  Every
-- error message is pinned here.
--

-- A clean slate: other tests leave commands behind.
DROP EXTENSION outbox;
CREATE EXTENSION outbox;

SELECT outbox.commit_decision('run-c', 1, 'ordered', 'ship-1', 'ship', '{"qty": 1}');
SELECT outbox.commit_decision('run-c', 2, 'ordered', 'ship-2', 'ship', '{"qty": 2}');
SELECT outbox.commit_decision('run-c', 3, 'ordered', 'ship-3', 'ship', '{"qty": 3}');

--
-- complete()
--

-- True the first time (a command needs not be published yet: the consumer
-- may finish before the publisher's ack arrives).
SELECT outbox.complete('ship-1');
-- False on a repeat with the same outcome, whatever the detail.
SELECT outbox.complete('ship-1');
SELECT outbox.complete('ship-1', 'done');
SELECT outbox.complete('ship-1', 'done', '{"again": true}');
-- A repeat with another outcome is a conflict.
SELECT outbox.complete('ship-1', 'failed');
-- Outcome and detail are the caller's.
SELECT outbox.complete('ship-2', 'rejected', '{"reason": "out of stock", "codes": [1, 2]}');
SELECT outbox.complete('ship-2', 'rejected');
SELECT command_id, outcome, detail FROM outbox.receipts ORDER BY command_id;

-- An unknown command has no receipt; nothing is written.
SELECT outbox.complete('ship-404');
SELECT count(*) FROM outbox.receipts WHERE command_id = 'ship-404';

-- The receipt belongs to the caller's transaction.
BEGIN;
SELECT outbox.complete('ship-3', 'done');
ROLLBACK;
SELECT count(*) FROM outbox.receipts WHERE command_id = 'ship-3';
BEGIN;
SELECT outbox.complete('ship-3', 'done');
SELECT outbox.complete('ship-3', 'done');
COMMIT;
SELECT command_id, outcome FROM outbox.receipts WHERE command_id = 'ship-3';

-- Bad arguments: errors, and nothing written.
SELECT outbox.complete(NULL);
SELECT outbox.complete('');
SELECT outbox.complete(repeat('x', 201));
SELECT outbox.complete('ship-1', NULL);
SELECT outbox.complete('ship-1', '');
SELECT outbox.complete('ship-1', repeat('o', 201));
SET outbox.max_payload_bytes = 64;
SELECT outbox.complete('ship-1', 'done', jsonb_build_object('note', repeat('n', 100)));
RESET outbox.max_payload_bytes;
SELECT outbox.complete('ship-1', 'done', (repeat('[', 65) || repeat(']', 65))::jsonb);
-- At the limits: a 200-byte id is fine (and unknown here), so is a nested detail.
SELECT outbox.complete(repeat('x', 200));
SELECT outbox.complete('ship-1', 'done', (repeat('[', 64) || repeat(']', 64))::jsonb);
SELECT count(*) AS receipts FROM outbox.receipts;

-- After the purge the tombstone answers repeats: same outcome false,
-- another outcome a conflict, and no receipt comes back.
SELECT outbox.ack('w1', token)
  FROM outbox.claim('w1', 10, interval '1 hour') WHERE command_id = 'ship-1';
SELECT outbox.purge(older_than => interval '0');
SELECT command_id, outcome FROM outbox.purged;
SELECT outbox.complete('ship-1');
SELECT outbox.complete('ship-1', 'failed');
SELECT count(*) FROM outbox.receipts WHERE command_id = 'ship-1';

--
-- inbox_accept()
--

-- True the first time a consumer sees a command, false on every redelivery;
-- each consumer has its own memory.
SELECT outbox.inbox_accept('billing', 'ship-2');
SELECT outbox.inbox_accept('billing', 'ship-2');
SELECT outbox.inbox_accept('billing', 'ship-2');
SELECT outbox.inbox_accept('shipping', 'ship-2');
-- The inbox does not need the command to be in this database's outbox (the
-- producer may live elsewhere), nor to exist any more (purged).
SELECT outbox.inbox_accept('billing', 'elsewhere-1');
SELECT outbox.inbox_accept('billing', 'ship-1');
SELECT consumer, command_id FROM outbox.inbox ORDER BY consumer, command_id;

-- Exactly-once effect: the acceptance commits or rolls back with the
-- business write of the same transaction.
CREATE TABLE shipments (command_id text, qty int);
BEGIN;
INSERT INTO shipments SELECT 'ship-3', 3 WHERE outbox.inbox_accept('shipping', 'ship-3');
ROLLBACK;
BEGIN;
INSERT INTO shipments SELECT 'ship-3', 3 WHERE outbox.inbox_accept('shipping', 'ship-3');
COMMIT;
BEGIN;
INSERT INTO shipments SELECT 'ship-3', 3 WHERE outbox.inbox_accept('shipping', 'ship-3');
COMMIT;
SELECT command_id, qty FROM shipments;
DROP TABLE shipments;

-- Bad arguments.
SELECT outbox.inbox_accept(NULL, 'ship-2');
SELECT outbox.inbox_accept('', 'ship-2');
SELECT outbox.inbox_accept(repeat('c', 201), 'ship-2');
SELECT outbox.inbox_accept('billing', NULL);
SELECT outbox.inbox_accept('billing', '');
SELECT outbox.inbox_accept('billing', repeat('x', 201));
SELECT outbox.inbox_accept(repeat('c', 200), repeat('x', 200));
SELECT count(*) AS inbox FROM outbox.inbox;

--
-- Privileges: a consumer calls the consumer API and nothing else; it never
-- reads the tables.
--
CREATE ROLE regress_consumer;
DO $$ BEGIN EXECUTE format('GRANT %I TO regress_consumer', outbox.role('consumer')); END $$;
CREATE ROLE regress_stranger;
SET ROLE regress_consumer;
SELECT outbox.complete('ship-3');
SELECT outbox.inbox_accept('billing', 'ship-3');
SELECT * FROM outbox.receipts;
SELECT * FROM outbox.inbox;
SELECT * FROM outbox.claim('w1');
RESET ROLE;
SET ROLE regress_stranger;
SELECT outbox.complete('ship-3');
SELECT outbox.inbox_accept('billing', 'ship-3');
RESET ROLE;
DROP ROLE regress_consumer, regress_stranger;

-- The consumer's writes kept every conservation check at zero.
SELECT check_name, violations FROM outbox.conservation;
