-- Ordered delivery per key: commit_decision's ordering_key, the release of
-- the next command (ack, ack_many, resolve as published, skip_head), the
-- kinds ordered by run, blocked_keys, and the rules of check_state.
-- Start from an empty outbox (pg_regress created the extension already).
DROP EXTENSION outbox;
CREATE EXTENSION outbox;
\set VERBOSITY default
\set SHOW_CONTEXT never

-- The commands with a key, in their order: waiting ones have no due_at.
CREATE TEMP VIEW ks AS
SELECT ordering_key AS key, ordering_seq AS place, command_id, status,
	   CASE WHEN status = 'pending' AND due_at IS NULL THEN 'waiting'
			WHEN status = 'pending' THEN 'claimable' ELSE '' END AS state
  FROM outbox.commands WHERE ordering_key IS NOT NULL
 ORDER BY ordering_key, ordering_seq;
-- The tokens of this test's claims.
CREATE TEMP TABLE tk (command_id text, token text);
CREATE FUNCTION pg_temp.claim(worker text, n int4 DEFAULT 100)
RETURNS TABLE (command_id text, ordering_key text) LANGUAGE sql AS $$
	WITH c AS (SELECT * FROM outbox.claim(worker, n)),
		 i AS (INSERT INTO tk SELECT c.command_id, c.token FROM c)
	SELECT c.command_id, c.ordering_key FROM c ORDER BY 1
$$;
CREATE FUNCTION pg_temp.t(id text) RETURNS text LANGUAGE sql AS $$
	SELECT token FROM tk WHERE command_id = id ORDER BY ctid DESC LIMIT 1
$$;

-- Bad keys are refused with 22023, and nothing is recorded.
SELECT outbox.commit_decision('r0', 1, 'e', 'bad', 'k', '{}', ordering_key => '');
SELECT outbox.commit_decision('r0', 1, 'e', 'bad', 'k', '{}', ordering_key => repeat('k', 201));
SELECT * FROM outbox.commit_decisions('[{"run_id": "r0", "seq": 1, "event_kind": "e", "command_id": "bad", "command_kind": "k", "payload": {}, "ordering_key": ""}]');
SELECT * FROM outbox.commit_decisions('[{"run_id": "r0", "seq": 1, "event_kind": "e", "command_id": "bad", "command_kind": "k", "payload": {}, "ordering_key": 7}]');
SELECT outbox.skip_head('');
SELECT outbox.skip_head(NULL);
-- a key with a control character (it is echoed in messages and last_error)
SELECT outbox.commit_decision('r0', 1, 'e', 'bad', 'k', '{}', ordering_key => E'K\nforged: line');
SELECT * FROM outbox.commit_decisions('[{"run_id": "r0", "seq": 1, "event_kind": "e", "command_id": "ok", "command_kind": "k", "payload": {}, "ordering_key": "K"}, {"run_id": "r0", "seq": 2, "event_kind": "e", "command_id": "bad", "command_kind": "k", "payload": {}, "ordering_key": "K\u001b[2J"}]');
SELECT outbox.skip_head(E'K\x7f');
SELECT (SELECT count(*) FROM outbox.commands) AS commands, (SELECT count(*) FROM outbox.events) AS events;

-- A decision with a key holds the key's lock to the end of its transaction:
-- an advisory lock in a lock space of its own (objsubid 20290); one without
-- a key takes none.
BEGIN;
SELECT outbox.commit_decision('r0', 1, 'e', 'lk0', 'k', '{}');
SELECT count(*) AS key_locks FROM pg_locks WHERE locktype = 'advisory' AND pid = pg_backend_pid();
SELECT outbox.commit_decision('r0', 2, 'e', 'lk1', 'k', '{}', ordering_key => 'L');
SELECT locktype, objsubid, mode, granted FROM pg_locks WHERE locktype = 'advisory' AND pid = pg_backend_pid();
ROLLBACK;

-- Key A gets three commands (two runs), key B one, and one has no key:
-- only the heads and the unordered one are claimable.
SELECT outbox.commit_decision('r1', 1, 'e', 'a1', 'k', '{}', ordering_key => 'A');
SELECT outbox.commit_decision('r1', 2, 'e', 'a2', 'k', '{}', ordering_key => 'A');
SELECT outbox.commit_decision('r2', 1, 'e', 'a3', 'k', '{}', ordering_key => 'A');
SELECT outbox.commit_decision('r2', 2, 'e', 'b1', 'k', '{}', ordering_key => 'B');
SELECT outbox.commit_decision('r2', 3, 'e', 'u1', 'k', '{}');
-- a retry of a decision with a key records nothing and keeps its place
SELECT outbox.commit_decision('r1', 2, 'e', 'a2', 'k', '{}', ordering_key => 'A');
SELECT * FROM ks;
SELECT ordering_key IS NULL AS no_key, ordering_seq IS NULL AS no_place, due_at = available_at AS claimable
  FROM outbox.commands WHERE command_id = 'u1';
SELECT * FROM pg_temp.claim('w');
SELECT * FROM pg_temp.claim('w');

-- The ack of an unordered command takes no lock (rolled back: u1 stays leased).
BEGIN;
SELECT outbox.ack('w', pg_temp.t('u1'));
SELECT count(*) AS key_locks FROM pg_locks WHERE locktype = 'advisory' AND pid = pg_backend_pid();
ROLLBACK;
-- The ack of a head releases the next command of its key, in order.
SELECT outbox.ack('w', pg_temp.t('a1'));
SELECT * FROM ks;
SELECT * FROM pg_temp.claim('w');
-- A head in backoff keeps the rest of its key waiting: blocked_keys says so.
SELECT outbox.fail('w', pg_temp.t('a2'), 'broker down');
SELECT * FROM pg_temp.claim('w');
-- since: when the key last moved (a1's ack), not the end of the backoff.
SELECT ordering_key, head_command_id, head_run_id, head_status,
	   since = (SELECT published_at FROM outbox.commands WHERE command_id = 'a1') AS since_a1_acked,
	   waiting
  FROM outbox.blocked_keys;
-- (the backoff ends)
UPDATE outbox.commands SET available_at = now(), due_at = now() WHERE command_id = 'a2';
SELECT command_id FROM pg_temp.claim('w');
-- Dead, and requeued, the head is still the head.
SELECT outbox.fail('w', pg_temp.t('a2'), 'bad message', fatal => true);
SELECT ordering_key, head_command_id, head_status,
	   since = (SELECT published_at FROM outbox.commands WHERE command_id = 'a1') AS since_a1_acked,
	   waiting
  FROM outbox.blocked_keys;
SELECT outbox.requeue('r1', 'a2');
SELECT * FROM ks;
SELECT command_id FROM pg_temp.claim('w');
SELECT outbox.fail('w', pg_temp.t('a2'), 'bad message again', fatal => true);

-- skip_head: only a dead head; it leaves the key and the next is released.
SELECT outbox.skip_head('B');
SELECT outbox.skip_head('nokey');
SELECT outbox.skip_head('A');
SELECT status, ordering_key, ordering_seq, last_error FROM outbox.commands WHERE command_id = 'a2';
SELECT * FROM ks;
SELECT count(*) FROM outbox.blocked_keys;

-- ack_many releases the next command of every key it publishes a head of.
SELECT outbox.commit_decision('r2', 4, 'e', 'b2', 'k', '{}', ordering_key => 'B');
SELECT * FROM pg_temp.claim('w');
SELECT command_id, acked FROM outbox.ack_many('w', ARRAY[pg_temp.t('a3'), pg_temp.t('b1')]) ORDER BY 1;
SELECT * FROM ks;
-- a key whose commands are all published takes a new one as its head
SELECT * FROM pg_temp.claim('w');
SELECT outbox.ack('w', pg_temp.t('b2'));
SELECT outbox.commit_decision('r2', 5, 'e', 'b3', 'k', '{}', ordering_key => 'B');
SELECT * FROM ks WHERE key = 'B';

-- resolve as published releases the next command; as retry it keeps the head.
SELECT outbox.set_policy('manual', takeover => 'manual');
SELECT outbox.commit_decision('r3', 1, 'e', 'c1', 'manual', '{}', ordering_key => 'C');
SELECT outbox.commit_decision('r3', 2, 'e', 'c2', 'manual', '{}', ordering_key => 'C');
SELECT * FROM pg_temp.claim('w');
-- (an expired lease of a manual kind, as the sweep leaves it)
UPDATE outbox.commands
   SET status = 'uncertain', lease_until = NULL, version = version + 1, last_error = 'expired'
 WHERE command_id IN ('c1', 'b3');
-- since: a key's first command has stood still since it was decided
SELECT ordering_key, head_command_id, head_status,
	   since = (SELECT created_at FROM outbox.commands WHERE command_id = 'c1') AS since_decided,
	   waiting
  FROM outbox.blocked_keys;
-- and so has one decided after its key's last ack (rolled back: nothing
-- waits behind b3 afterwards)
BEGIN;
SELECT outbox.commit_decision('r2', 6, 'e', 'b4', 'k', '{}', ordering_key => 'B');
SELECT ordering_key, head_command_id, head_status,
	   since = (SELECT created_at FROM outbox.commands WHERE command_id = 'b3') AS since_decided,
	   since > (SELECT published_at FROM outbox.commands WHERE command_id = 'b2') AS after_b2_acked,
	   waiting
  FROM outbox.blocked_keys WHERE ordering_key = 'B';
ROLLBACK;
SELECT outbox.resolve('r3', 'c1', 'retry');
SELECT * FROM ks WHERE key = 'C';
SELECT command_id FROM pg_temp.claim('w');
UPDATE outbox.commands
   SET status = 'uncertain', lease_until = NULL, version = version + 1, last_error = 'expired'
 WHERE command_id = 'c1';
SELECT outbox.resolve('r3', 'c1', 'published');
SELECT * FROM ks WHERE key = 'C';

-- A kind ordered by run: commands without a key get their run_id; one
-- with a key keeps it.  A batch places a run's commands of a key in seq
-- order, and the runs in the order of the batch.
SELECT outbox.set_policy('trip', ordered_by_run => true);
SELECT ordered_by_run FROM outbox.policies WHERE kind = 'trip';
SELECT outbox.set_policy('trip', max_deliveries => 3);
SELECT ordered_by_run FROM outbox.policies WHERE kind = 'trip';
SELECT outbox.commit_decision('t1', 1, 'e', 't1-1', 'trip', '{}');
SELECT outbox.commit_decision('t1', 2, 'e', 't1-2', 'trip', '{}', ordering_key => 'D');
SELECT ord, command_id, recorded FROM outbox.commit_decisions('[
  {"run_id": "t1", "seq": 4, "event_kind": "e", "command_id": "t1-4", "command_kind": "trip", "payload": {}},
  {"run_id": "t2", "seq": 1, "event_kind": "e", "command_id": "t2-1", "command_kind": "k", "payload": {}, "ordering_key": "t1"},
  {"run_id": "t1", "seq": 3, "event_kind": "e", "command_id": "t1-3", "command_kind": "trip", "payload": {}},
  {"run_id": "t3", "seq": 1, "event_kind": "e", "command_id": "t3-1", "command_kind": "k", "payload": {}},
  {"run_id": "t4", "seq": 1, "event_kind": "e", "command_id": "t4-1", "command_kind": "k", "payload": {}, "ordering_key": "E"},
  {"run_id": "t4", "seq": 2, "event_kind": "e", "command_id": "t4-2", "command_kind": "k", "payload": {}, "ordering_key": "E"}]');
SELECT * FROM ks WHERE key IN ('t1', 'D', 'E');
-- a batch with a retry: the retry keeps its place, the new decision takes the next
SELECT ord, command_id, recorded FROM outbox.commit_decisions('[
  {"run_id": "t4", "seq": 2, "event_kind": "e", "command_id": "t4-2", "command_kind": "k", "payload": {}, "ordering_key": "E"},
  {"run_id": "t4", "seq": 3, "event_kind": "e", "command_id": "t4-3", "command_kind": "k", "payload": {}, "ordering_key": "E"}]');
SELECT * FROM ks WHERE key = 'E';
SELECT ordering_key IS NULL AS no_key, due_at IS NOT NULL AS claimable FROM outbox.commands WHERE command_id = 't3-1';
SELECT outbox.set_policy('trip', ordered_by_run => false);
SELECT outbox.commit_decision('t1', 5, 'e', 't1-5', 'trip', '{}');
SELECT ordering_key IS NULL AS no_key FROM outbox.commands WHERE command_id = 't1-5';

-- A not-before time applies to the head: a waiting command released
-- before its time stays pending until then (blocked_keys names the key
-- while something waits behind it).
SELECT outbox.commit_decision('r5', 1, 'e', 'f1', 'k', '{}', ordering_key => 'F');
SELECT outbox.commit_decision('r5', 2, 'e', 'f2', 'k', '{}', not_before => now() + interval '1 hour', ordering_key => 'F');
SELECT outbox.commit_decision('r5', 3, 'e', 'f3', 'k', '{}', ordering_key => 'F');
SELECT command_id FROM pg_temp.claim('w') WHERE ordering_key = 'F';
SELECT outbox.ack('w', pg_temp.t('f1'));
SELECT command_id, due_at > now() AS later FROM outbox.commands WHERE command_id = 'f2';
SELECT ordering_key, head_command_id, head_status,
	   since = (SELECT published_at FROM outbox.commands WHERE command_id = 'f1') AS since_f1_acked,
	   waiting
  FROM outbox.blocked_keys WHERE ordering_key = 'F';

-- The outbox as it stands breaks no rule.
SELECT count(*) AS violations FROM outbox.check_state;

-- Each rule of ordered delivery fires on a row changed by hand.
-- G: g1 the head (pending), g2 waiting behind it.
SELECT outbox.commit_decision('r6', 1, 'e', 'g1', 'k', '{}', ordering_key => 'G');
SELECT outbox.commit_decision('r6', 2, 'e', 'g2', 'k', '{}', ordering_key => 'G');
BEGIN;
-- the head leaves its key without releasing the next
UPDATE outbox.commands SET ordering_key = NULL, ordering_seq = NULL WHERE command_id = 'g1';
SELECT command_id, rules FROM outbox.check_state;
ROLLBACK;
BEGIN;
-- a second head
UPDATE outbox.commands SET due_at = available_at WHERE command_id = 'g2';
SELECT command_id, rules FROM outbox.check_state;
ROLLBACK;
BEGIN;
-- published before its predecessor
UPDATE outbox.commands
   SET status = 'published', published_at = now(), due_at = NULL, deliveries = 1, version = 2
 WHERE command_id = 'g2';
SELECT command_id, rules FROM outbox.check_state;
SELECT check_name, violations, sample FROM outbox.conservation WHERE violations > 0;
SELECT outbox.verify();
ROLLBACK;
BEGIN;
-- a key without a place, a place without a key
UPDATE outbox.commands SET ordering_seq = NULL WHERE command_id = 'g2';
UPDATE outbox.commands SET ordering_key = NULL WHERE command_id = 'u1';
UPDATE outbox.commands SET ordering_seq = 1 WHERE command_id = 'u1';
SELECT command_id, rules FROM outbox.check_state ORDER BY command_id;
ROLLBACK;
BEGIN;
-- two commands in one place
UPDATE outbox.commands SET ordering_seq = (SELECT ordering_seq FROM outbox.commands WHERE command_id = 'g1')
 WHERE command_id = 'g2';
SELECT command_id, rules FROM outbox.check_state ORDER BY command_id;
ROLLBACK;
BEGIN;
-- the last head of a key not marked: a producer would not see it
SELECT outbox.commit_decision('r6', 4, 'e', 'h1', 'k', '{}', ordering_key => 'H');
SELECT command_id, ordering_tail FROM outbox.commands WHERE command_id IN ('g1', 'g2', 'h1') ORDER BY 1;
UPDATE outbox.commands SET ordering_tail = NULL WHERE command_id IN ('g1', 'h1');
SELECT command_id, rules FROM outbox.check_state;
ROLLBACK;
-- The new head of an idle key is marked as its last command (m1), and so
-- is a released command with nothing behind it (m2, released by m1's ack),
-- so that a command appended while it is leased waits behind it; one
-- released with a command behind it is not (m3, m4 waiting).
BEGIN;
SELECT outbox.commit_decision('r7', 1, 'e', 'm1', 'k', '{}', ordering_key => 'M');
SELECT outbox.commit_decision('r7', 2, 'e', 'm2', 'k', '{}', ordering_key => 'M');
SELECT outbox.ack('w', pg_temp.t('m1')) FROM pg_temp.claim('w') WHERE command_id = 'm1';
SELECT command_id FROM pg_temp.claim('w') WHERE ordering_key = 'M';
SELECT outbox.commit_decision('r7', 3, 'e', 'm3', 'k', '{}', ordering_key => 'M');
SELECT outbox.commit_decision('r7', 4, 'e', 'm4', 'k', '{}', ordering_key => 'M');
SELECT command_id, status, due_at IS NULL AS waits, ordering_tail FROM outbox.commands
 WHERE ordering_key = 'M' ORDER BY ordering_seq;
SELECT outbox.ack('w', pg_temp.t('m2'));
SELECT command_id, status, due_at IS NULL AS waits, ordering_tail FROM outbox.commands
 WHERE ordering_key = 'M' ORDER BY ordering_seq;
SELECT count(*) AS violations FROM outbox.check_state;
ROLLBACK;
-- A batch marks the head of an idle key only when it is the key's only new
-- command (N: n1 alone; P: p1 with p2 behind it, not marked).
BEGIN;
SELECT count(*) FROM outbox.commit_decisions('[
  {"run_id": "r8", "seq": 1, "event_kind": "e", "command_id": "n1", "command_kind": "k", "payload": {}, "ordering_key": "N"},
  {"run_id": "r8", "seq": 2, "event_kind": "e", "command_id": "p1", "command_kind": "k", "payload": {}, "ordering_key": "P"},
  {"run_id": "r8", "seq": 3, "event_kind": "e", "command_id": "u8", "command_kind": "k", "payload": {}},
  {"run_id": "r8", "seq": 4, "event_kind": "e", "command_id": "p2", "command_kind": "k", "payload": {}, "ordering_key": "P"}]');
SELECT command_id, ordering_key, ordering_seq, due_at IS NULL AS waits, ordering_tail FROM outbox.commands
 WHERE command_id IN ('n1', 'p1', 'p2', 'u8') ORDER BY 1;
SELECT count(*) AS violations FROM outbox.check_state;
ROLLBACK;
-- and an unordered pending command without due_at is still lost
SELECT outbox.commit_decision('r6', 3, 'e', 'u2', 'k', '{}');
BEGIN;
UPDATE outbox.commands SET due_at = NULL WHERE command_id = 'u2';
SELECT command_id, rules FROM outbox.check_state;
ROLLBACK;
SELECT count(*) AS violations FROM outbox.check_state;

-- The purge removes published commands only: the waiting ones stay.
SELECT outbox.complete(run_id, command_id) FROM outbox.commands WHERE status = 'published' ORDER BY command_id;
SELECT outbox.purge(older_than => interval '0') > 0 AS purged;
SELECT * FROM ks;
SELECT count(*) AS violations FROM outbox.check_state;

-- A key belongs to the role that decides: two roles using one key string
-- get two independent keys, and a producer allowed only for kind ord_a
-- cannot hold a key of kind ord_b (given, or ord_b's run_id).
CREATE ROLE regress_ord_a;
CREATE ROLE regress_ord_b;
SELECT format('GRANT %I TO regress_ord_a, regress_ord_b', outbox.role('producer')) \gexec
SELECT outbox.set_policy('ord_a', deciders => '{regress_ord_a}');
SELECT outbox.set_policy('ord_b', deciders => '{regress_ord_b}', ordered_by_run => true);
CREATE TEMP VIEW kr AS
SELECT command_id, kind, ordering_key AS key, ordering_seq AS place, decided_by::regrole AS role,
	   CASE WHEN status = 'pending' AND due_at IS NULL THEN 'waiting'
			WHEN status = 'pending' THEN 'claimable' ELSE status::text END AS state
  FROM outbox.commands WHERE kind LIKE 'ord\__' ORDER BY command_id;
GRANT SELECT ON kr TO PUBLIC;
SET ROLE regress_ord_b;
SELECT outbox.commit_decision('tb', 1, 'e', 'tb1', 'ord_b', '{}', ordering_key => 'T');
RESET ROLE;
SET ROLE regress_ord_a;
SELECT outbox.commit_decision('ta', 1, 'e', 'ta1', 'ord_a', '{}', not_before => '2099-01-01', ordering_key => 'T');
SELECT outbox.commit_decision('ta', 2, 'e', 'ta2', 'ord_a', '{}', not_before => '2099-01-01', ordering_key => 'tb');
RESET ROLE;
SET ROLE regress_ord_b;
SELECT outbox.commit_decision('tb', 2, 'e', 'tb2', 'ord_b', '{}', ordering_key => 'T');
SELECT outbox.commit_decision('tb', 3, 'e', 'tb3', 'ord_b', '{}');
SELECT outbox.commit_decision('tb', 4, 'e', 'tb4', 'ord_b', '{}');
RESET ROLE;
SELECT * FROM kr;
-- ord_b's heads are published; its next commands come free, whatever ord_a holds
SELECT count(*) AS acked
  FROM (SELECT outbox.ack('w', c.token) FROM outbox.claim('w', 10, kinds => ARRAY['ord_b']) c) a;
SELECT * FROM kr;
SELECT ordering_key, decided_by, head_command_id, waiting FROM outbox.blocked_keys WHERE ordering_key IN ('T', 'tb') ORDER BY 1, 2;
-- one key string of two roles: two locks
BEGIN;
SET LOCAL ROLE regress_ord_a;
SELECT outbox.commit_decision('ta', 3, 'e', 'ta3', 'ord_a', '{}', ordering_key => 'L2');
RESET ROLE;
SET LOCAL ROLE regress_ord_b;
SELECT outbox.commit_decision('tb', 5, 'e', 'tb5', 'ord_b', '{}', ordering_key => 'L2');
RESET ROLE;
SELECT count(*) AS key_locks FROM pg_locks WHERE locktype = 'advisory' AND objsubid = 20290 AND pid = pg_backend_pid();
ROLLBACK;
-- skip_head names the role when two have unfinished commands on a key
SELECT outbox.skip_head('T');
SELECT outbox.skip_head('T', 'regress_ord_a');
BEGIN;
UPDATE outbox.commands SET status = 'dead', due_at = NULL, deliveries = 1, version = 2, last_error = 'x'
 WHERE command_id = 'ta1';
SELECT outbox.skip_head('T', 'regress_ord_a');
SELECT * FROM kr;
ROLLBACK;
SELECT outbox.skip_head('T', 'regress_ord_b');
SELECT outbox.skip_head('tb');
-- The lock of a key is hashed under the database's lease key: the tag
-- in pg_locks changes when the key is rotated.
BEGIN;
SELECT outbox.commit_decision('tr', 1, 'e', 'tr1', 'k', '{}', ordering_key => 'R');
SELECT classid AS tag1_hi, objid AS tag1_lo FROM pg_locks
 WHERE locktype = 'advisory' AND objsubid = 20290 AND pid = pg_backend_pid() \gset
ROLLBACK;
SELECT outbox.rotate_lease_key();
BEGIN;
SELECT outbox.commit_decision('tr', 1, 'e', 'tr1', 'k', '{}', ordering_key => 'R');
SELECT (classid, objid) <> (:tag1_hi, :tag1_lo) AS tag_changed FROM pg_locks
 WHERE locktype = 'advisory' AND objsubid = 20290 AND pid = pg_backend_pid();
ROLLBACK;
SELECT count(*) AS violations FROM outbox.check_state;
DROP VIEW kr;
DELETE FROM outbox.commands WHERE kind LIKE 'ord\__';
DELETE FROM outbox.events WHERE run_id IN ('ta', 'tb');
DELETE FROM outbox.policies WHERE kind LIKE 'ord\__';
SELECT format('REVOKE %I FROM regress_ord_a, regress_ord_b', outbox.role('producer')) \gexec
DROP ROLE regress_ord_a;
DROP ROLE regress_ord_b;

-- blocked_keys lists every key with commands waiting behind its head: also
-- one whose head is pending and due but never claimed (head_claimable).
SELECT outbox.commit_decision('tn', 1, 'e', 'tn1', 'k', '{}', ordering_key => 'N');
SELECT outbox.commit_decision('tn', 2, 'e', 'tn2', 'k', '{}', ordering_key => 'N');
SELECT ordering_key, head_command_id, head_status, waiting, head_claimable
  FROM outbox.blocked_keys WHERE ordering_key = 'N';
SELECT outbox.pause('k');
SELECT ordering_key, head_status, head_claimable FROM outbox.blocked_keys WHERE ordering_key = 'N';
SELECT outbox.resume('k');
DELETE FROM outbox.commands WHERE run_id = 'tn';
DELETE FROM outbox.events WHERE run_id = 'tn';

-- ack_handover: the acked head's next command is leased to the caller in
-- the ack's statement when a claim by the caller could take it now
-- (kind not paused, claimers admit the caller, not_before passed, in the
-- caller's kinds, within batch_size); otherwise it is released as ack_many
-- releases it.  Refused and stale tokens hand nothing over.
CREATE ROLE regress_ho_pub;
CREATE ROLE regress_ho_other;
SELECT format('GRANT %I TO regress_ho_pub', outbox.role('publisher')) \gexec
CREATE TABLE ho_tok (command_id text, token text);
GRANT ALL ON ho_tok TO regress_ho_pub;
CREATE VIEW ho AS
SELECT command_id, kind, status, owner, version, deliveries,
       CASE WHEN status = 'pending' AND due_at IS NULL THEN 'waiting'
            WHEN status = 'pending' AND due_at > now() THEN 'later'
            WHEN status = 'pending' THEN 'claimable' ELSE '' END AS state
  FROM outbox.commands WHERE run_id LIKE 'ho%' ORDER BY command_id;
GRANT SELECT ON ho TO regress_ho_pub;
SELECT outbox.set_policy('ho_r', claimers => '{regress_ho_other}');
SELECT outbox.commit_decision('ho-a', s, 'e', 'ha' || s, 'ho_a', '{}', ordering_key => 'HA') FROM generate_series(1, 3) s;
SELECT outbox.commit_decision('ho-p', 1, 'e', 'hp1', 'ho_a', '{}', ordering_key => 'HP');
SELECT outbox.commit_decision('ho-p', 2, 'e', 'hp2', 'ho_p', '{}', ordering_key => 'HP');
SELECT outbox.commit_decision('ho-r', 1, 'e', 'hr1', 'ho_a', '{}', ordering_key => 'HR');
SELECT outbox.commit_decision('ho-r', 2, 'e', 'hr2', 'ho_r', '{}', ordering_key => 'HR');
SELECT outbox.commit_decision('ho-n', 1, 'e', 'hn1', 'ho_a', '{}', ordering_key => 'HN');
SELECT outbox.commit_decision('ho-n', 2, 'e', 'hn2', 'ho_a', '{}', ordering_key => 'HN',
							  not_before => now() + interval '1 hour');
SELECT outbox.commit_decision('ho-k', 1, 'e', 'hk1', 'ho_a', '{}', ordering_key => 'HK');
SELECT outbox.commit_decision('ho-k', 2, 'e', 'hk2', 'ho_k', '{}', ordering_key => 'HK');
SELECT outbox.pause('ho_p');
SET ROLE regress_ho_pub;
INSERT INTO ho_tok SELECT command_id, token FROM outbox.claim('w', 10, kinds => '{ho_a}');
SELECT string_agg(command_id, ',' ORDER BY command_id) AS claimed FROM ho_tok;
-- the heads are acked; only ha2 is handed over (hp2's kind is paused, hr2's
-- claimers do not admit the caller, hn2 is not due, hk2 is not in kinds)
CREATE TEMP TABLE ho_res AS
SELECT * FROM outbox.ack_handover('w', ARRAY(SELECT token FROM ho_tok ORDER BY command_id), 10, NULL, '{ho_a}')
  WITH ORDINALITY;
SELECT ordinality, command_id, acked, reason, kind, version, deliveries, token IS NOT NULL AS leased,
       lease_until > now() AS lease_ahead, ordering_key
  FROM ho_res ORDER BY ordinality;
SELECT * FROM ho;
-- the same tokens again: refused, nothing handed over
SELECT command_id, acked, reason, token IS NOT NULL AS leased
  FROM outbox.ack_handover('w', ARRAY(SELECT token FROM ho_tok ORDER BY command_id), 10, NULL, '{ho_a}');
SELECT command_id, acked, reason FROM outbox.ack_handover('w', ARRAY['not a token']);
-- the handed-over token under another worker name: refused
SELECT command_id, acked, reason FROM outbox.ack_handover('v', ARRAY(SELECT token FROM ho_res WHERE token IS NOT NULL));
SELECT command_id, status, owner FROM ho WHERE command_id = 'ha3';
-- the handed-over lease is an ordinary lease: renewed, and its ack hands
-- ha3 over in turn
SELECT outbox.renew('w', token) > now() AS renewed FROM ho_res WHERE token IS NOT NULL;
SELECT command_id, acked, version, token IS NOT NULL AS leased
  FROM outbox.ack_handover('w', ARRAY(SELECT token FROM ho_res WHERE token IS NOT NULL));
-- batch_size bounds the hand-over: one of the two keys is handed over,
-- the other released
RESET ROLE;
SELECT outbox.commit_decision('ho-b' || k, s, 'e', 'hb' || k || s, 'ho_a', '{}', ordering_key => 'HB' || k)
  FROM unnest(ARRAY['x', 'y']) k, generate_series(1, 2) s;
SET ROLE regress_ho_pub;
TRUNCATE ho_tok;
INSERT INTO ho_tok SELECT command_id, token FROM outbox.claim('w', 10, kinds => '{ho_a}');
SELECT string_agg(command_id, ',' ORDER BY command_id) AS claimed FROM ho_tok;
SELECT count(*) FILTER (WHERE acked) AS acked, count(token) AS handed
  FROM outbox.ack_handover('w', ARRAY(SELECT token FROM ho_tok), batch_size => 1);
SELECT string_agg(command_id || ' ' || status || ' ' || state, ', ' ORDER BY command_id) AS next
  FROM ho WHERE command_id IN ('hbx2', 'hby2');
-- a kind the caller may not claim is refused, and bad arguments
SELECT * FROM outbox.ack_handover('w', '{}', 10, NULL, '{ho_r}');
SELECT * FROM outbox.ack_handover('w', '{}', 0);
SELECT * FROM outbox.ack_handover('w', '{}', NULL);
SELECT * FROM outbox.ack_handover('w', '{}', 10, interval '-1 s');
SELECT * FROM outbox.ack_handover('w', '{}', 10, NULL, '{{a}}');
RESET ROLE;
SELECT count(*) AS violations FROM outbox.check_state;
DROP TABLE ho_res;
DROP VIEW ho;
DROP TABLE ho_tok;
SELECT outbox.resume('ho_p');
DELETE FROM outbox.commands WHERE run_id LIKE 'ho%';
DELETE FROM outbox.events WHERE run_id LIKE 'ho%';
DELETE FROM outbox.policies WHERE kind LIKE 'ho\__';
SELECT format('REVOKE %I FROM regress_ho_pub', outbox.role('publisher')) \gexec
DROP ROLE regress_ho_pub;
DROP ROLE regress_ho_other;

-- Leave an empty outbox behind.
DROP VIEW ks;
DROP EXTENSION outbox;
CREATE EXTENSION outbox;
