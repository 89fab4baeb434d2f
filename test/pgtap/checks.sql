-- The conservation checks and DBA views from the schema angle: they exist
-- with their columns, belong to the extension, are documented, show no
-- payload, are readable by pg_monitor and this database's admin role only, and hold on a
-- working outbox; verify() raises 23000 on a fault.
BEGIN;
SELECT plan(36);

CREATE TEMP TABLE my_views (name) AS
VALUES ('check_decisions_without_command'), ('check_orphan_commands'), ('check_orphan_receipts'),
	   ('check_state'), ('check_receipt_overdue'), ('conservation'), ('backlog'), ('leases'),
	   ('dead_letters'), ('blocked_keys');

-- Existence and shape -------------------------------------------------------

SELECT has_view('outbox', 'check_decisions_without_command', 'check_decisions_without_command exists');
SELECT has_view('outbox', 'check_orphan_commands', 'check_orphan_commands exists');
SELECT has_view('outbox', 'check_orphan_receipts', 'check_orphan_receipts exists');
SELECT has_view('outbox', 'check_state', 'check_state exists');
SELECT has_view('outbox', 'check_receipt_overdue', 'check_receipt_overdue exists');
SELECT has_view('outbox', 'conservation', 'conservation exists');
SELECT has_view('outbox', 'backlog', 'backlog exists');
SELECT has_view('outbox', 'leases', 'leases exists');
SELECT has_view('outbox', 'dead_letters', 'dead_letters exists');
SELECT has_view('outbox', 'blocked_keys', 'blocked_keys exists');

SELECT columns_are('outbox', 'check_decisions_without_command',
	ARRAY['run_id', 'seq', 'kind', 'command_id', 'created_at']);
SELECT columns_are('outbox', 'check_orphan_commands',
	ARRAY['command_id', 'run_id', 'seq', 'kind', 'status', 'event_command_id', 'problem']);
SELECT columns_are('outbox', 'check_orphan_receipts',
	ARRAY['command_id', 'outcome', 'completed_at', 'purged']);
SELECT columns_are('outbox', 'check_state',
	ARRAY['command_id', 'status', 'rules', 'owner', 'version', 'deliveries', 'lease_until',
		  'published_at', 'available_at', 'due_at', 'ordering_key', 'ordering_seq']);
SELECT columns_are('outbox', 'check_receipt_overdue',
	ARRAY['command_id', 'run_id', 'seq', 'kind', 'owner', 'published_at', 'waiting']);
SELECT columns_are('outbox', 'conservation',
	ARRAY['check_name', 'severity', 'violations', 'sample', 'description']);
SELECT columns_are('outbox', 'backlog',
	ARRAY['kind', 'status', 'commands', 'delayed', 'oldest_available_at', 'oldest_available_age']);
SELECT columns_are('outbox', 'leases',
	ARRAY['command_id', 'kind', 'holder', 'version', 'deliveries', 'lease_until', 'expired',
		  'time_left', 'takeover']);
SELECT columns_are('outbox', 'dead_letters',
	ARRAY['command_id', 'run_id', 'seq', 'kind', 'status', 'deliveries', 'version', 'owner',
		  'last_error', 'created_at', 'available_at']);
SELECT columns_are('outbox', 'blocked_keys',
	ARRAY['ordering_key', 'head_command_id', 'head_run_id', 'head_status', 'since', 'waiting', 'decided_by', 'head_claimable']);
SELECT is((SELECT reloptions @> ARRAY['security_barrier=true'] FROM pg_class WHERE oid = 'outbox.blocked_keys'::regclass),
	true, 'blocked_keys is a security_barrier view');

SELECT col_type_is('outbox', 'conservation', 'violations', 'bigint', 'conservation.violations is a bigint');
-- The views show the commands' status, version and deliveries in their base
-- types, not the domains of outbox.commands (which no role may use): a
-- reader can copy any view into a table or view of its own.
SELECT is(ARRAY(SELECT c.relname || '.' || a.attname || ' ' || pg_catalog.format_type(a.atttypid, a.atttypmod)
				  FROM pg_attribute a
				  JOIN pg_class c ON c.oid = a.attrelid
				  JOIN pg_type t ON t.oid = a.atttypid
				 WHERE c.relnamespace = 'outbox'::regnamespace AND c.relkind = 'v'
				   AND a.attnum > 0 AND t.typnamespace = 'outbox'::regnamespace
				 ORDER BY 1),
		  '{}'::text[], 'no view column is of a type of the extension');
SELECT col_type_is('outbox', 'conservation', 'sample', 'text[]', 'conservation.sample is a text[]');
SELECT function_returns('outbox', 'verify', ARRAY['boolean'], 'void', 'verify(boolean) returns void');

SELECT results_eq(
	$$SELECT check_name, severity FROM outbox.conservation$$,
	$$VALUES ('decisions_without_command', 'error'), ('orphan_commands', 'error'),
			 ('orphan_receipts', 'error'), ('state', 'error'), ('receipt_overdue', 'warning')$$,
	'conservation has one row per invariant, in order, with its severity');

-- Membership, documentation, no payload --------------------------------------

SELECT is(
	(SELECT count(*)::int FROM pg_catalog.pg_class c
	  WHERE c.oid IN (SELECT ('outbox.' || name)::regclass FROM my_views)
		AND NOT EXISTS (SELECT 1 FROM pg_catalog.pg_depend d
						 WHERE d.classid = 'pg_class'::regclass AND d.objid = c.oid
						   AND d.refclassid = 'pg_extension'::regclass AND d.deptype = 'e')),
	0, 'every view here belongs to the extension');
SELECT is(
	(SELECT array_agg(c.relname::text ORDER BY c.relname) FROM pg_catalog.pg_class c
	  WHERE c.oid IN (SELECT ('outbox.' || name)::regclass FROM my_views)
		AND pg_catalog.obj_description(c.oid, 'pg_class') IS NULL),
	NULL, 'every view here has a comment');
SELECT is(
	(SELECT array_agg(a.attrelid::regclass::text ORDER BY 1) FROM pg_catalog.pg_attribute a
	   JOIN pg_catalog.pg_class c ON c.oid = a.attrelid
	  WHERE c.oid IN (SELECT ('outbox.' || name)::regclass FROM my_views)
		AND a.attname = 'payload'),
	NULL, 'no view here shows a payload');

-- Privileges ----------------------------------------------------------------

SELECT set_eq(
	$$SELECT v.relname::text, r.role
		FROM pg_catalog.pg_class v,
			 unnest(ARRAY['public', 'pg_monitor', outbox.role('admin'), outbox.role('producer'),
						  outbox.role('publisher'), outbox.role('consumer')]) AS r(role)
	   WHERE v.oid IN (SELECT ('outbox.' || name)::regclass FROM my_views)
		 AND has_table_privilege(r.role, v.oid, 'SELECT')$$,
	$$SELECT v, r
		FROM my_views AS m(v),
			 unnest(ARRAY['pg_monitor', outbox.role('admin')]) AS r$$,
	'pg_monitor and the admin role read every view here; public and the other roles none');
SELECT is(
	(SELECT count(*)::int
	   FROM pg_catalog.pg_class v,
			unnest(ARRAY['public', 'pg_monitor', outbox.role('admin'), outbox.role('producer'),
						 outbox.role('publisher'), outbox.role('consumer')]) AS r(role),
			unnest(ARRAY['INSERT', 'UPDATE', 'DELETE', 'TRUNCATE', 'REFERENCES', 'TRIGGER']) AS p(priv)
	  WHERE v.oid IN (SELECT ('outbox.' || name)::regclass FROM my_views)
		AND has_table_privilege(r.role, v.oid, p.priv)),
	0, 'nobody writes through the views here');
SELECT is(
	(SELECT array_agg(r.role::text ORDER BY r.role)
	   FROM unnest(ARRAY['public', 'pg_monitor', outbox.role('admin'), outbox.role('producer'),
						 outbox.role('publisher'), outbox.role('consumer')]) AS r(role)
	  WHERE has_function_privilege(r.role, 'outbox.verify(boolean)', 'EXECUTE')),
	ARRAY(SELECT r FROM unnest(ARRAY[outbox.role('admin')::text, 'pg_monitor']) r ORDER BY 1),
	'verify() is for pg_monitor and the admin role only');

-- Behaviour -----------------------------------------------------------------

-- A working outbox: decide, claim, ack, complete, fail, purge.
CREATE TEMP TABLE tap_lease (command_id text, token text);
DO $$
BEGIN
	PERFORM outbox.commit_decision('tap-run', i, 'decided', 'tap-' || i, 'tap', '{}')
	   FROM generate_series(1, 6) AS i;
	INSERT INTO tap_lease
	SELECT command_id, token FROM outbox.claim('tap-w', 5, interval '1 hour', ARRAY['tap']);
	PERFORM outbox.ack('tap-w', token)
	   FROM tap_lease WHERE command_id IN ('tap-1', 'tap-2', 'tap-3');
	PERFORM outbox.fail('tap-w', token, 'boom', true)
	   FROM tap_lease WHERE command_id = 'tap-4';
	PERFORM outbox.complete('tap-run', 'tap-1'), outbox.complete('tap-run', 'tap-2');
	PERFORM outbox.purge(older_than => interval '0');
END;
$$;

SELECT is((SELECT sum(violations)::int FROM outbox.conservation), 0,
		  'every check is empty on a working outbox with purged commands');
SELECT lives_ok('SELECT outbox.verify(include_warnings => true)', 'verify() is silent when all holds');

-- A receipt without a command, and a command deleted without the purge.
INSERT INTO outbox.receipts (command_id, outcome, run_id) VALUES ('tap-ghost', 'done', 'tap-run');
DELETE FROM outbox.commands WHERE command_id = 'tap-6';
SELECT results_eq(
	$$SELECT check_name, violations, sample FROM outbox.conservation WHERE violations > 0$$,
	$$VALUES ('decisions_without_command', 1::bigint, ARRAY['tap-6' COLLATE "C"]),
			 ('orphan_receipts', 1::bigint, ARRAY['tap-ghost' COLLATE "C"])$$,
	'each fault is reported by its check, with its id');
SELECT throws_ok('SELECT outbox.verify()', '23000',
				 'outbox conservation violated: decisions_without_command, orphan_receipts',
				 'verify() raises 23000 naming the violated checks');

SELECT * FROM finish();
ROLLBACK;
