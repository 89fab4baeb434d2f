--
-- Conservation checks and DBA views.
--
-- A healthy database holding commands in every state makes every check
-- empty; each check then fires on a deliberate fault (made as the table
-- owner, inside a transaction that is rolled back) and reports exactly the
-- faulty rows; verify() raises naming the violated checks; a purge of old
-- completed commands leaves every check at zero, while a command deleted in
-- any other way is still reported.
--

-- A clean slate: other tests leave commands behind.
DROP EXTENSION outbox;
CREATE EXTENSION outbox;
-- Error contexts name plpgsql line numbers: keep them out of the output.
\set SHOW_CONTEXT never

-- Expired leases of k-uncertain and k-resolved go to uncertain; a failed
-- k-retry waits an hour.
SELECT outbox.set_policy('k-uncertain', takeover => 'manual');
SELECT outbox.set_policy('k-resolved', takeover => 'manual');
SELECT outbox.set_policy('k-retry', backoff_base => interval '1 hour', backoff_max => interval '1 hour');

-- An event that decides nothing, and one decision per target state.
SELECT outbox.record_event('run-1', 0, 'started');
SELECT count(*) AS decided
  FROM (SELECT outbox.commit_decision('run-1', v.seq, 'decided', 'c-' || v.state,
									  'k-' || v.state, jsonb_build_object('state', v.state),
									  not_before => CASE WHEN v.state = 'delayed'
														 THEN now() + interval '1 day' END)
		  FROM (VALUES (1, 'pending'), (2, 'delayed'), (3, 'retry'), (4, 'requeued'),
					   (5, 'sending'), (6, 'published'), (7, 'receipted'), (8, 'dead'),
					   (9, 'uncertain'), (10, 'resolved'), (11, 'purged'), (12, 'early'))
			   AS v(seq, state)) AS d;

-- One claim for everything that goes through a lease of an hour.
CREATE TEMP TABLE lease AS
SELECT command_id, token
  FROM outbox.claim('w1', 10, interval '1 hour',
					ARRAY['k-retry', 'k-requeued', 'k-sending', 'k-published', 'k-receipted',
						  'k-dead', 'k-purged', 'k-early']);
SELECT command_id FROM lease ORDER BY command_id;

SELECT outbox.fail('w1', (SELECT token FROM lease WHERE command_id = 'c-retry'), 'timeout');
SELECT outbox.fail('w1', (SELECT token FROM lease WHERE command_id = 'c-requeued'),
				   'HTTP 400', fatal => true);
SELECT outbox.requeue('run-1', 'c-requeued');
SELECT outbox.fail('w1', (SELECT token FROM lease WHERE command_id = 'c-dead'),
				   'HTTP 410', fatal => true);
SELECT outbox.ack('w1', token)
  FROM lease WHERE command_id IN ('c-published', 'c-receipted', 'c-purged') ORDER BY command_id;
-- The consumer completes c-early before the publisher acks (it never does).
SELECT outbox.complete('run-1', 'c-early');

-- c-purged is completed and purged at once; nothing else qualifies yet.
SELECT outbox.complete('run-1', 'c-purged');
SELECT outbox.purge(older_than => interval '0');
SELECT outbox.complete('run-1', 'c-receipted', 'done', '{"ref": 7}');

-- A short lease of a manual-takeover kind expires and is swept to uncertain.
CREATE TEMP TABLE short AS
SELECT command_id, lease_until
  FROM outbox.claim('w2', 10, interval '1 millisecond', ARRAY['k-uncertain', 'k-resolved']);
SELECT count(*) AS claimed FROM short;
DO $$
BEGIN
	WHILE clock_timestamp() <= (SELECT max(lease_until) FROM short) LOOP
		PERFORM pg_sleep(0.001);
	END LOOP;
END;
$$;
-- (The background worker may sweep them first: only the outcome is shown.)
SELECT outbox.sweep() >= 0 AS swept;
SELECT outbox.resolve('run-1', 'c-resolved', 'published');

SELECT command_id, status, version, deliveries, owner, lease_until IS NOT NULL AS leased,
	   due_at IS NOT NULL AS due, published_at IS NOT NULL AS published_at_set,
	   last_error
  FROM outbox.commands ORDER BY command_id;
SELECT command_id, outcome, detail FROM outbox.receipts ORDER BY command_id;
SELECT command_id, run_id, seq, kind, outcome FROM outbox.purged ORDER BY command_id;

-- Healthy: every check is empty, verify() is silent.
SELECT check_name, severity, violations, sample FROM outbox.conservation;
SELECT (SELECT count(*) FROM outbox.check_decisions_without_command) AS decisions,
	   (SELECT count(*) FROM outbox.check_orphan_commands) AS orphan_commands,
	   (SELECT count(*) FROM outbox.check_orphan_receipts) AS orphan_receipts,
	   (SELECT count(*) FROM outbox.check_state) AS state,
	   (SELECT count(*) FROM outbox.check_receipt_overdue) AS overdue;
SELECT outbox.verify();
SELECT outbox.verify(include_warnings => true);

-- The DBA views.
SELECT kind, status, commands, delayed, oldest_available_age IS NOT NULL AS has_age
  FROM outbox.backlog ORDER BY kind, status;
SELECT command_id, kind, holder, version, deliveries, expired, time_left > interval '0' AS time_left,
	   takeover
  FROM outbox.leases ORDER BY command_id;
SELECT command_id, status, deliveries, owner, last_error FROM outbox.dead_letters ORDER BY command_id;

--
-- Invariant 1: a command deleted behind its event is reported; so is its
-- receipt.  The purged c-purged is not.
--
BEGIN;
DELETE FROM outbox.commands WHERE command_id IN ('c-pending', 'c-receipted');
SELECT run_id, seq, kind, command_id FROM outbox.check_decisions_without_command ORDER BY seq;
SELECT command_id, outcome, purged FROM outbox.check_orphan_receipts ORDER BY command_id;
SELECT check_name, violations, sample FROM outbox.conservation WHERE violations > 0;
ROLLBACK;

-- A tombstone excuses only the very event it records: one for another
-- event does not hide a lost command; and without its tombstone a purged
-- command is reported like any lost one.
BEGIN;
DELETE FROM outbox.commands WHERE command_id = 'c-pending';
INSERT INTO outbox.purged (command_id, run_id, seq, kind, published_at, outcome)
VALUES ('c-pending', 'run-1', 6, 'k-pending', now(), 'done');
DELETE FROM outbox.purged WHERE command_id = 'c-purged';
SELECT run_id, seq, kind, command_id FROM outbox.check_decisions_without_command ORDER BY seq;
ROLLBACK;

--
-- Invariant 2: commands whose source event is missing, decided nothing, or
-- decided another command.
--
BEGIN;
DELETE FROM outbox.events WHERE command_id = 'c-dead';
UPDATE outbox.commands SET seq = 0 WHERE command_id = 'c-sending';
UPDATE outbox.commands SET seq = 6 WHERE command_id = 'c-delayed';
SELECT command_id, run_id, seq, status, event_command_id, problem
  FROM outbox.check_orphan_commands ORDER BY command_id;
SELECT check_name, violations, sample FROM outbox.conservation WHERE violations > 0;
ROLLBACK;

--
-- Invariant 3: a receipt for a command that never existed, and one the
-- purge should have taken with its command.
--
BEGIN;
INSERT INTO outbox.receipts (command_id, outcome, run_id) VALUES ('c-ghost', 'done', 'run-1'), ('c-purged', 'done', 'run-1');
SELECT command_id, outcome, purged FROM outbox.check_orphan_receipts ORDER BY command_id;
SELECT check_name, violations, sample FROM outbox.conservation WHERE violations > 0;
ROLLBACK;

--
-- Invariant 4: one fault per rule (c-uncertain breaks two).
--
BEGIN;
UPDATE outbox.commands SET owner = NULL WHERE command_id = 'c-sending';
UPDATE outbox.commands SET lease_until = NULL WHERE command_id = 'c-early';
UPDATE outbox.commands SET lease_until = now() + interval '1 hour' WHERE command_id = 'c-dead';
UPDATE outbox.commands SET published_at = NULL WHERE command_id = 'c-published';
UPDATE outbox.commands SET published_at = now() WHERE command_id = 'c-pending';
UPDATE outbox.commands SET deliveries = 0, last_error = NULL WHERE command_id = 'c-uncertain';
UPDATE outbox.commands SET version = 1 WHERE command_id = 'c-resolved';
UPDATE outbox.commands SET due_at = NULL WHERE command_id = 'c-delayed';
UPDATE outbox.commands SET due_at = available_at + interval '1 minute' WHERE command_id = 'c-retry';
UPDATE outbox.commands SET due_at = now() WHERE command_id = 'c-receipted';
INSERT INTO outbox.purged (command_id, run_id, seq, kind, published_at, outcome)
VALUES ('c-requeued', 'run-1', 4, 'k-requeued', now(), 'done');
SELECT command_id, status, rules FROM outbox.check_state ORDER BY command_id;
SELECT check_name, violations, sample FROM outbox.conservation WHERE violations > 0;
SELECT outbox.verify();
ROLLBACK;

--
-- Invariant 5 (warning class): published two hours ago without a receipt.
--
BEGIN;
UPDATE outbox.commands SET published_at = published_at - interval '2 hours'
 WHERE command_id IN ('c-published', 'c-receipted', 'c-resolved');
SHOW outbox.receipt_overdue;
SELECT command_id, kind, owner, waiting > interval '2 hours' AS waiting
  FROM outbox.check_receipt_overdue ORDER BY command_id;
SET LOCAL outbox.receipt_overdue = '3h';
SELECT count(*) AS overdue FROM outbox.check_receipt_overdue;
SET LOCAL outbox.receipt_overdue = '1min';
SELECT count(*) AS overdue FROM outbox.check_receipt_overdue;
SELECT check_name, severity, violations, sample FROM outbox.conservation WHERE violations > 0;
-- A warning-class check only warns, unless asked to fail.
SELECT outbox.verify();
SELECT outbox.verify(include_warnings => true);
ROLLBACK;

--
-- Several faults at once: verify() names every violated check.
--
BEGIN;
DELETE FROM outbox.commands WHERE command_id = 'c-pending';
DELETE FROM outbox.events WHERE command_id = 'c-dead';
INSERT INTO outbox.receipts (command_id, outcome, run_id) VALUES ('c-ghost', 'done', 'run-1');
UPDATE outbox.commands SET lease_until = NULL WHERE command_id = 'c-sending';
UPDATE outbox.commands SET published_at = published_at - interval '2 hours'
 WHERE command_id = 'c-published';
SELECT outbox.verify();
ROLLBACK;

SELECT outbox.verify(NULL);

--
-- Privileges: pg_monitor and the admin role read the views and run verify();
-- anybody else is refused.
--
CREATE ROLE regress_checks_monitor IN ROLE pg_monitor;
CREATE ROLE regress_checks_admin;
DO $$ BEGIN EXECUTE format('GRANT %I TO regress_checks_admin', outbox.role('admin')); END $$;
CREATE ROLE regress_checks_nobody;
SET ROLE regress_checks_monitor;
SELECT check_name, violations FROM outbox.conservation;
SELECT outbox.verify();
SELECT count(*) FROM outbox.check_state;
SELECT count(*) FROM outbox.backlog;
SELECT count(*) FROM outbox.leases;
SELECT count(*) FROM outbox.dead_letters;
SELECT count(*) FROM outbox.commands;
RESET ROLE;
SET ROLE regress_checks_admin;
SELECT sum(violations) FROM outbox.conservation;
SELECT outbox.verify();
RESET ROLE;
SET ROLE regress_checks_nobody;
SELECT * FROM outbox.conservation;
SELECT outbox.verify();
RESET ROLE;
DROP ROLE regress_checks_monitor, regress_checks_admin, regress_checks_nobody;
-- blocked_keys reads its rows through outbox._blocked_keys(): a role
-- given SELECT on the view by hand needs EXECUTE on the function too
-- (docs/reference.md, outbox.blocked_keys).
CREATE ROLE regress_checks_viewer;
GRANT USAGE ON SCHEMA outbox TO regress_checks_viewer;
GRANT SELECT ON outbox.blocked_keys TO regress_checks_viewer;
SET ROLE regress_checks_viewer;
SELECT count(*) FROM outbox.blocked_keys;
RESET ROLE;
GRANT EXECUTE ON FUNCTION outbox._blocked_keys() TO regress_checks_viewer;
SET ROLE regress_checks_viewer;
SELECT count(*) FROM outbox.blocked_keys;
RESET ROLE;
REVOKE ALL ON FUNCTION outbox._blocked_keys() FROM regress_checks_viewer;
REVOKE ALL ON outbox.blocked_keys FROM regress_checks_viewer;
REVOKE ALL ON SCHEMA outbox FROM regress_checks_viewer;
DROP ROLE regress_checks_viewer;

--
-- Purge of old completed commands: every check stays at zero.  A command
-- removed without the purge is still reported.
--
SELECT outbox.complete('run-1', 'c-published');
SELECT outbox.complete('run-1', 'c-resolved');
SELECT outbox.purge(older_than => interval '0');
SELECT command_id, run_id, seq, outcome FROM outbox.purged ORDER BY command_id;
SELECT command_id, status FROM outbox.commands ORDER BY command_id;
SELECT count(*) AS receipts FROM outbox.receipts;
SELECT check_name, violations, sample FROM outbox.conservation;
SELECT outbox.verify();
BEGIN;
DELETE FROM outbox.commands WHERE command_id = 'c-dead';
SELECT run_id, seq, command_id FROM outbox.check_decisions_without_command;
ROLLBACK;
-- What holds the vacuum horizon back: at least this session's own snapshot.
SELECT source, role IS NOT NULL AS has_role, xmin_age >= 0 AS aged
  FROM outbox.horizon WHERE holder = pg_backend_pid()::text;
