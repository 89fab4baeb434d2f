--
-- The consumer API: complete() records one receipt per command,
-- inbox_accept() remembers which commands a consumer has accepted.  Every
-- error message is pinned here.
--

-- A clean slate: other tests leave commands behind.
DROP EXTENSION outbox;
CREATE EXTENSION outbox;

-- The SQLSTATE and message of a statement that fails.
CREATE FUNCTION pg_temp.state(stmt text) RETURNS text LANGUAGE plpgsql AS $$
BEGIN
	EXECUTE stmt;
	RETURN 'ok';
EXCEPTION WHEN OTHERS THEN
	RETURN SQLSTATE || ': ' || SQLERRM;
END $$;

SELECT outbox.commit_decision('run-c', 1, 'ordered', 'ship-1', 'ship', '{"qty": 1}');
SELECT outbox.commit_decision('run-c', 2, 'ordered', 'ship-2', 'ship', '{"qty": 2}');
SELECT outbox.commit_decision('run-c', 3, 'ordered', 'ship-3', 'ship', '{"qty": 3}');
SELECT outbox.commit_decision('run-d', 1, 'ordered', 'ship-4', 'ship', '{"qty": 4}');

--
-- complete()
--

-- True the first time (a command needs not be published yet: the consumer
-- may finish before the publisher's ack arrives).
SELECT outbox.complete('run-c', 'ship-1');
-- False on a repeat with the same outcome, whatever the detail.
SELECT outbox.complete('run-c', 'ship-1');
SELECT outbox.complete('run-c', 'ship-1', 'done');
SELECT outbox.complete('run-c', 'ship-1', 'done', '{"again": true}');
-- A repeat with another outcome is a conflict.
SELECT outbox.complete('run-c', 'ship-1', 'failed');
-- Outcome and detail are the caller's.
SELECT outbox.complete('run-c', 'ship-2', 'rejected', '{"reason": "out of stock", "codes": [1, 2]}');
SELECT outbox.complete('run-c', 'ship-2', 'rejected');
SELECT command_id, outcome, detail FROM outbox.receipts ORDER BY command_id;

-- An unknown command has no receipt (OB002); nothing is written.  A command
-- is addressed by its run too: another run's command is unknown.
SELECT pg_temp.state($$SELECT outbox.complete('run-c', 'ship-404')$$);
SELECT outbox.complete('run-c', 'ship-4');
SELECT outbox.complete('run-x', 'ship-1');
SELECT count(*) FROM outbox.receipts WHERE command_id IN ('ship-404', 'ship-4');

-- The receipt belongs to the caller's transaction.
BEGIN;
SELECT outbox.complete('run-c', 'ship-3', 'done');
ROLLBACK;
SELECT count(*) FROM outbox.receipts WHERE command_id = 'ship-3';
BEGIN;
SELECT outbox.complete('run-c', 'ship-3', 'done');
SELECT outbox.complete('run-c', 'ship-3', 'done');
COMMIT;
SELECT command_id, outcome FROM outbox.receipts WHERE command_id = 'ship-3';

-- Bad arguments: errors, and nothing written.
SELECT outbox.complete(NULL, 'ship-1');
SELECT outbox.complete('', 'ship-1');
SELECT outbox.complete('run-c', NULL);
SELECT outbox.complete('run-c', '');
SELECT outbox.complete('run-c', repeat('x', 201));
SELECT outbox.complete('run-c', 'ship-1', NULL);
SELECT outbox.complete('run-c', 'ship-1', '');
SELECT outbox.complete('run-c', 'ship-1', repeat('o', 201));
SET outbox.max_payload_bytes = 64;
SELECT outbox.complete('run-c', 'ship-1', 'done', jsonb_build_object('note', repeat('n', 100)));
RESET outbox.max_payload_bytes;
SELECT outbox.complete('run-c', 'ship-1', 'done', (repeat('[', 65) || repeat(']', 65))::jsonb);
-- At the limits: a 200-byte id is fine (and unknown here), so is a nested detail.
SELECT outbox.complete('run-c', repeat('x', 200));
SELECT outbox.complete('run-c', 'ship-1', 'done', (repeat('[', 64) || repeat(']', 64))::jsonb);
SELECT count(*) AS receipts FROM outbox.receipts;

-- After the purge the tombstone answers repeats: same outcome false,
-- another outcome a conflict, and no receipt comes back.
SELECT outbox.ack('w1', token)
  FROM outbox.claim('w1', 10, interval '1 hour') WHERE command_id = 'ship-1';
SELECT outbox.purge(older_than => interval '0');
SELECT command_id, outcome FROM outbox.purged;
SELECT outbox.complete('run-c', 'ship-1');
SELECT outbox.complete('run-c', 'ship-1', 'failed');
SELECT count(*) FROM outbox.receipts WHERE command_id = 'ship-1';

--
-- inbox_accept()
--

-- Consumer names are registered to a role by an administrator; here to the
-- current (superuser) role.
SELECT outbox.register_consumer('billing', current_user::text::regrole);
SELECT outbox.register_consumer('shipping', current_user::text::regrole);
SELECT outbox.register_consumer('billing', current_user::text::regrole);
SELECT consumer, role = current_user::text::regrole AS mine FROM outbox.consumers ORDER BY consumer;

-- True the first time a consumer sees a command, false on every redelivery;
-- each consumer has its own memory.
SELECT outbox.inbox_accept('billing', 'run-c', 'ship-2');
SELECT outbox.inbox_accept('billing', 'run-c', 'ship-2');
SELECT outbox.inbox_accept('billing', 'run-c', 'ship-2');
SELECT outbox.inbox_accept('shipping', 'run-c', 'ship-2');
-- The command must be known: in the outbox under that run, or purged with
-- a tombstone (ship-1); anything else is OB002, an unregistered consumer
-- name OB003.
SELECT outbox.inbox_accept('billing', 'run-c', 'ship-1');
SELECT pg_temp.state($$SELECT outbox.inbox_accept('billing', 'run-c', 'elsewhere-1')$$);
SELECT pg_temp.state($$SELECT outbox.inbox_accept('billing', 'run-x', 'ship-2')$$);
SELECT pg_temp.state($$SELECT outbox.inbox_accept('nobody', 'run-c', 'ship-2')$$);
SELECT consumer, command_id FROM outbox.inbox ORDER BY consumer, command_id;

-- Exactly-once effect: the acceptance commits or rolls back with the
-- business write of the same transaction.
CREATE TABLE shipments (command_id text, qty int);
BEGIN;
INSERT INTO shipments SELECT 'ship-3', 3 WHERE outbox.inbox_accept('shipping', 'run-c', 'ship-3');
ROLLBACK;
BEGIN;
INSERT INTO shipments SELECT 'ship-3', 3 WHERE outbox.inbox_accept('shipping', 'run-c', 'ship-3');
COMMIT;
BEGIN;
INSERT INTO shipments SELECT 'ship-3', 3 WHERE outbox.inbox_accept('shipping', 'run-c', 'ship-3');
COMMIT;
SELECT command_id, qty FROM shipments;
DROP TABLE shipments;

-- Bad arguments.
SELECT outbox.inbox_accept('billing', NULL, 'ship-2');
SELECT outbox.inbox_accept(NULL, 'run-c', 'ship-2');
SELECT outbox.inbox_accept('', 'run-c', 'ship-2');
SELECT outbox.inbox_accept(repeat('c', 201), 'run-c', 'ship-2');
SELECT outbox.inbox_accept('billing', 'run-c', NULL);
SELECT outbox.inbox_accept('billing', 'run-c', '');
SELECT outbox.inbox_accept('billing', 'run-c', repeat('x', 201));
SELECT outbox.inbox_accept(repeat('c', 200), 'run-c', repeat('x', 200));
SELECT outbox.register_consumer(NULL, current_user::text::regrole);
SELECT outbox.register_consumer('billing', NULL);
SELECT outbox.register_consumer(repeat('c', 201), current_user::text::regrole);
SELECT count(*) AS inbox FROM outbox.inbox;

--
-- Privileges: a consumer calls the consumer API and nothing else; it never
-- reads the tables.
--
CREATE ROLE regress_consumer;
DO $$ BEGIN EXECUTE format('GRANT %I TO regress_consumer', outbox.role('consumer')); END $$;
CREATE ROLE regress_stranger;
SELECT outbox.register_consumer('mailer', 'regress_consumer');
-- A name belongs to one role: registering it to another is refused.
SELECT outbox.register_consumer('mailer', 'regress_stranger');
SET ROLE regress_consumer;
SELECT outbox.complete('run-c', 'ship-3');
SELECT outbox.inbox_accept('mailer', 'run-c', 'ship-3');
-- Another role's consumer name is refused (OB004), and only an
-- administrator registers names.
SELECT pg_temp.state($$SELECT outbox.inbox_accept('billing', 'run-c', 'ship-3')$$);
SELECT outbox.register_consumer('billing', 'regress_consumer');
SELECT * FROM outbox.receipts;
SELECT * FROM outbox.inbox;
SELECT * FROM outbox.claim('w1');
RESET ROLE;
SET ROLE regress_stranger;
SELECT outbox.complete('run-c', 'ship-3');
SELECT outbox.inbox_accept('mailer', 'run-c', 'ship-3');
RESET ROLE;
SELECT consumer, command_id FROM outbox.inbox WHERE consumer IN ('mailer', 'billing') AND command_id = 'ship-3';
SELECT outbox.unregister_consumer('mailer'), outbox.unregister_consumer('mailer');
SELECT outbox.inbox_accept('mailer', 'run-c', 'ship-3');
DROP ROLE regress_consumer, regress_stranger;

-- The consumer's writes kept every conservation check at zero.
SELECT check_name, violations FROM outbox.conservation;
