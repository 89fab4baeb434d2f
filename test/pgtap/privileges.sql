-- Privileges of the outbox extension, checked from the catalog.
--
-- The table "expected" below lists every function, relation and type of the
-- schema outbox with the roles that may use it.  The catalog must hold
-- exactly these objects (a new function cannot slip through without a row
-- here), each object's privileges must be exactly the listed ones (for the
-- four group roles, pg_monitor and PUBLIC), and a call made by a login role
-- that is a member of each group role must succeed when allowed and fail
-- with 42501 otherwise.  Every call runs in a subtransaction that is rolled
-- back, so the calls do not disturb each other.
BEGIN;
SELECT plan(270);

-- Objects and who may use them.  Functions by signature (regprocedure),
-- relations by name (SELECT is the only privilege ever granted on one),
-- types by name (USAGE).  call is a statement that succeeds for the
-- listed roles.
CREATE TEMP TABLE expected (
	object		text PRIMARY KEY,
	kind		text NOT NULL CHECK (kind IN ('function', 'relation', 'type')),
	grantees	text[] NOT NULL,
	secdef		bool,
	call		text NOT NULL
);
INSERT INTO expected VALUES
	-- producer
	('outbox.commit_decision(text,bigint,text,text,text,jsonb,jsonb,timestamp with time zone,integer,jsonb,text)',
	 'function', '{outbox_producer}', false,
	 $$SELECT outbox.commit_decision('pt-run', 10, 'e', 'pt-new', 'k', '{}')$$),
	('outbox.commit_decisions(jsonb)',
	 'function', '{outbox_producer}', false,
	 $$SELECT count(*) FROM outbox.commit_decisions('[{"run_id": "pt-run", "seq": 11, "event_kind": "e", "command_id": "pt-new-2", "command_kind": "k", "payload": {}}]')$$),
	('outbox.record_event(text,bigint,text,jsonb)',
	 'function', '{outbox_producer}', false,
	 $$SELECT outbox.record_event('pt-run', 12, 'note')$$),
	-- publisher
	('outbox.claim(text,integer,interval,text[])',
	 'function', '{outbox_publisher}', false,
	 $$SELECT count(*) FROM outbox.claim('pt-w2', 1, kinds => '{pt-none}')$$),
	('outbox.ack(text,text)',
	 'function', '{outbox_publisher}', false,
	 $$SELECT outbox.ack('pt-w3', (SELECT token FROM outbox.claim('pt-w3', 1, kinds => '{pt-kind-fresh}')))$$),
	('outbox.ack_many(text,text[])',
	 'function', '{outbox_publisher}', false,
	 $$SELECT count(*) FROM outbox.ack_many('pt-w3', ARRAY(SELECT token FROM outbox.claim('pt-w3', 1, kinds => '{pt-kind-fresh}')))$$),
	('outbox.ack_handover(text,text[],integer,interval,text[])',
	 'function', '{outbox_publisher}', false,
	 $$SELECT count(*) FROM outbox.ack_handover('pt-w3', ARRAY(SELECT token FROM outbox.claim('pt-w3', 1, kinds => '{pt-kind-fresh}')))$$),
	('outbox.fail(text,text,text,boolean)',
	 'function', '{outbox_publisher}', false,
	 $$SELECT outbox.fail('pt-w3', (SELECT token FROM outbox.claim('pt-w3', 1, kinds => '{pt-kind-fresh}')), 'boom')$$),
	('outbox.renew(text,text,interval)',
	 'function', '{outbox_publisher}', false,
	 $$SELECT outbox.renew('pt-w3', (SELECT token FROM outbox.claim('pt-w3', 1, kinds => '{pt-kind-fresh}')))$$),
	('outbox.claim_batch(text,text,text,interval)',
	 'function', '{outbox_publisher}', false,
	 $$SELECT count(*) FROM outbox.claim_batch('pt-stream', 'pt-sub', 'pt-w6')$$),
	('outbox.ack_batch(text,text,text[],text[],boolean[])',
	 'function', '{outbox_publisher}', false,
	 $$SELECT outbox.ack_batch('pt-w6', (SELECT token FROM outbox.claim_batch('pt-stream', 'pt-sub', 'pt-w6') LIMIT 1))$$),
	('outbox.renew_batch(text,text,interval)',
	 'function', '{outbox_publisher}', false,
	 $$SELECT outbox.renew_batch('pt-w6', (SELECT token FROM outbox.claim_batch('pt-stream', 'pt-sub', 'pt-w6') LIMIT 1))$$),
	-- consumer
	('outbox.complete(text,text,text,jsonb)',
	 'function', '{outbox_consumer}', false,
	 $$SELECT outbox.complete('pt-run', 'pt-live')$$),
	('outbox.inbox_accept(text,text,text)',
	 'function', '{outbox_consumer}', false,
	 $$SELECT outbox.inbox_accept('pt-consumer', 'pt-run', 'pt-live')$$),
	-- administrator
	('outbox.requeue(text,text,text)',
	 'function', '{outbox_admin}', true,
	 $$SELECT outbox.requeue('pt-run', 'pt-dead')$$),
	('outbox.resolve(text,text,text,text)',
	 'function', '{outbox_admin}', true,
	 $$SELECT outbox.resolve('pt-run', 'pt-unc', 'retry')$$),
	('outbox.register_consumer(text,regrole)',
	 'function', '{outbox_admin}', true,
	 $$SELECT outbox.register_consumer('pt-consumer-2', 'pg_monitor')$$),
	('outbox.unregister_consumer(text)',
	 'function', '{outbox_admin}', true,
	 $$SELECT outbox.unregister_consumer('pt-consumer')$$),
	('outbox.skip_head(text,regrole)',
	 'function', '{outbox_admin}', false,
	 $$SELECT outbox.skip_head('pt-key')$$),
	('outbox.set_policy(text,integer,interval,interval,interval,text,interval,regrole[],regrole[],regrole[],boolean,text)',
	 'function', '{outbox_admin}', true,
	 $$SELECT outbox.set_policy('pt-kind-x', max_deliveries => 3)$$),
	('outbox.create_stream(text,integer,integer)',
	 'function', '{outbox_admin}', true,
	 $$SELECT outbox.create_stream('pt-stream-2')$$),
	('outbox.create_subscription(text,text,regrole[])',
	 'function', '{outbox_admin}', true,
	 $$SELECT outbox.create_subscription('pt-stream', 'pt-sub-2')$$),
	('outbox.drop_subscription(text)',
	 'function', '{outbox_admin}', true,
	 $$SELECT outbox.drop_subscription('pt-sub')$$),
	('outbox.tick_streams()',
	 'function', '{outbox_admin}', false,
	 $$SELECT outbox.tick_streams()$$),
	('outbox.rotate_streams()',
	 'function', '{outbox_admin}', true,
	 $$SELECT outbox.rotate_streams()$$),
	('outbox.pause(text)',
	 'function', '{outbox_admin}', true,
	 $$SELECT outbox.pause('pt-kind-x')$$),
	('outbox.resume(text)',
	 'function', '{outbox_admin}', true,
	 $$SELECT outbox.resume('pt-kind-x')$$),
	('outbox.purge(integer,interval)',
	 'function', '{outbox_admin}', true,
	 $$SELECT outbox.purge()$$),
	('outbox.sweep(integer)',
	 'function', '{outbox_admin}', false,
	 $$SELECT outbox.sweep()$$),
	('outbox.rotate_lease_key()',
	 'function', '{outbox_admin}', false,
	 $$SELECT outbox.rotate_lease_key()$$),
	('outbox.stats_reset()',
	 'function', '{outbox_admin}', false,
	 $$SELECT outbox.stats_reset()$$),
	-- monitoring
	('outbox.verify(boolean)',
	 'function', '{outbox_admin,pg_monitor}', false,
	 $$SELECT outbox.verify()$$),
	('outbox.metrics_backlog()',
	 'function', '{outbox_admin,pg_monitor}', true,
	 $$SELECT count(*) FROM outbox.metrics_backlog()$$),
	('outbox.role(text)',
	 'function', '{outbox_producer,outbox_publisher,outbox_consumer,outbox_admin,pg_monitor}', false,
	 $$SELECT outbox.role('admin')$$),
	('outbox.metrics_checks()',
	 'function', '{outbox_admin,pg_monitor}', true,
	 $$SELECT count(*) FROM outbox.metrics_checks()$$),
	('outbox.preloaded()',
	 'function', '{outbox_producer,outbox_publisher,outbox_consumer,outbox_admin,pg_monitor}', false,
	 $$SELECT outbox.preloaded()$$),
	-- internal: the views outbox.stats and outbox.workers call these with
	-- the reader's rights; the others only run as the owner
	('outbox._stats()',
	 'function', '{outbox_admin,pg_monitor}', false,
	 $$SELECT count(*) FROM outbox._stats()$$),
	('outbox._workers()',
	 'function', '{outbox_admin,pg_monitor}', false,
	 $$SELECT count(*) FROM outbox._workers()$$),
	('outbox._blocked_keys()',
	 'function', '{outbox_admin,pg_monitor}', true,
	 $$SELECT count(*) FROM outbox._blocked_keys()$$),
	('outbox._siphash(bytea,bytea,integer)',
	 'function', '{}', false,
	 $$SELECT outbox._siphash('\x000102030405060708090a0b0c0d0e0f', '', 16)$$),
	('outbox._policies_changed()',
	 'function', '{}', false,
	 $$SELECT outbox._policies_changed()$$),
	('outbox._may(regrole[],oid)',
	 'function', '{}', false,
	 $$SELECT outbox._may('{}', 0)$$),
	('outbox._release_key(text,bigint,oid)',
	 'function', '{}', false,
	 $$SELECT outbox._release_key('pt-key', 1, 0)$$),
	('outbox._require(anyelement,text)',
	 'function', '{}', false,
	 $$SELECT outbox._require(1, 'x')$$),
	('outbox._require_command(text,text)',
	 'function', '{}', false,
	 $$SELECT outbox._require_command('pt-run', 'pt-dead')$$),
	('outbox._require_id(text,text)',
	 'function', '{}', false,
	 $$SELECT outbox._require_id('a', 'x')$$),
	('outbox._count_purged(integer)',
	 'function', '{}', false,
	 $$SELECT outbox._count_purged(0)$$),
	('outbox._wake_at_commit()',
	 'function', '{}', false,
	 $$SELECT outbox._wake_at_commit()$$),
	('outbox._request_worker()',
	 'function', '{}', false,
	 $$SELECT outbox._request_worker()$$),
	-- streams (src/sql/60_streams.sql): the owner only
	('outbox._stream_tick(integer)',
	 'function', '{}', false,
	 $$SELECT outbox._stream_tick(0)$$),
	('outbox._stream_rotate(integer)',
	 'function', '{}', false,
	 $$SELECT outbox._stream_rotate(0)$$),
	('outbox._stream_move_on()',
	 'function', '{}', false,
	 $$SELECT outbox._stream_move_on()$$),
	('outbox._stream_purged(text,text)',
	 'function', '{}', false,
	 $$SELECT count(*) FROM outbox._stream_purged('r', 'c')$$),
	('outbox._stream_acked()',
	 'function', '{}', false,
	 $$SELECT count(*) FROM outbox._stream_acked()$$),
	('outbox._stream_batch_rows(text,integer,bigint,integer,pg_snapshot,pg_snapshot,integer)',
	 'function', '{}', false,
	 $$SELECT count(*) FROM outbox._stream_batch_rows('pt-sub', 0, 1, 1, '1:1:', '1:1:', 1)$$),
	('outbox._stream_snap(integer,bigint)',
	 'function', '{}', false,
	 $$SELECT outbox._stream_snap(1, 0)$$),
	('outbox._stream_snapshot(pg_snapshot)',
	 'function', '{}', false,
	 $$SELECT outbox._stream_snapshot(pg_current_snapshot())$$),
	('outbox._ack_batch(text,integer,bigint,integer,text,bigint,text[],text[],boolean[])',
	 'function', '{}', false,
	 $$SELECT outbox._ack_batch('pt-sub', 0, 1, 1, 'pt-w7', 1, NULL, NULL, NULL)$$),
	('outbox._stream_published_retries(text,integer,bigint,timestamp with time zone)',
	 'function', '{}', false,
	 $$SELECT outbox._stream_published_retries('pt-sub', 0, 1, now())$$),
	('outbox._stream_takeover_cap(text,integer,integer,timestamp with time zone)',
	 'function', '{}', false,
	 $$SELECT outbox._stream_takeover_cap('pt-sub', 0, 1, now())$$),
	('outbox._stream_release_key(text,text,oid,timestamp with time zone)',
	 'function', '{}', false,
	 $$SELECT outbox._stream_release_key('pt-sub', 'pt-key', 0, now())$$),
	('outbox._stream_settle(text,text,text,text,text,timestamp with time zone)',
	 'function', '{}', false,
	 -- (pt-s1 is dead nowhere: 55000, which the block takes as success)
	 $c$DO $d$ BEGIN PERFORM outbox._stream_settle('pt-run', 'pt-s1', NULL, 'retry', 'h', now());
		EXCEPTION WHEN object_not_in_prerequisite_state THEN NULL; END $d$$c$),
	('outbox._error_text(text,text)',
	 'function', '{}', false,
	 $$SELECT outbox._error_text('boom')$$),
	-- Citus (src/sql/50_citus.sql): the owner only
	('outbox.distribute(text)',
	 'function', '{}', false,
	 -- (without Citus they raise 55000, which the block takes as success)
	 $c$DO $d$ BEGIN PERFORM outbox.distribute(); EXCEPTION WHEN object_not_in_prerequisite_state THEN NULL; END $d$$c$),
	('outbox.undistribute()',
	 'function', '{}', false,
	 $c$DO $d$ BEGIN PERFORM outbox.undistribute(); EXCEPTION WHEN object_not_in_prerequisite_state THEN NULL; END $d$$c$),
	('outbox._citus_tables(boolean)',
	 'function', '{}', false,
	 $$SELECT outbox._citus_tables(true)$$),
	('outbox._distributed()',
	 'function', '{}', false,
	 $$SELECT outbox._distributed()$$),
	('outbox._citus_keys(boolean)',
	 'function', '{}', false,
	 $$SELECT outbox._citus_keys(false)$$),
	('outbox._citus_require_coordinator(text)',
	 'function', '{}', false,
	 $c$DO $d$ BEGIN PERFORM outbox._citus_require_coordinator('x'); EXCEPTION WHEN object_not_in_prerequisite_state THEN NULL; END $d$$c$),
	('outbox._citus_on_workers(text)',
	 'function', '{}', false,
	 $c$DO $d$ BEGIN PERFORM outbox._citus_on_workers('SELECT 1'); EXCEPTION WHEN undefined_function THEN NULL; END $d$$c$),
	('outbox._before_drop()',
	 'function', '{}', false,
	 $$SELECT outbox._before_drop()$$),
	('outbox._citus_local_shards()',
	 'function', '{}', false,
	 $c$DO $d$ BEGIN PERFORM outbox._citus_local_shards(); EXCEPTION WHEN undefined_table THEN NULL; END $d$$c$),
	('outbox._citus_lease_key_changed()',
	 'function', '{}', false,
	 $c$DO $d$ BEGIN CREATE TEMP TABLE pt_lk (x int);
		CREATE TRIGGER pt_lk AFTER INSERT ON pt_lk FOR EACH STATEMENT EXECUTE FUNCTION outbox._citus_lease_key_changed();
		INSERT INTO pt_lk VALUES (1); END $d$$c$),
	('outbox._citus_commands_inserted()',
	 'function', '{}', false,
	 $c$DO $d$ BEGIN CREATE TEMP TABLE pt_ci (x int);
		CREATE TRIGGER pt_ci AFTER INSERT ON pt_ci FOR EACH STATEMENT EXECUTE FUNCTION outbox._citus_commands_inserted();
		INSERT INTO pt_ci VALUES (1); END $d$$c$),
	('outbox._check_run(integer)',
	 'function', '{}', false,
	 $$SELECT outbox._check_run(99)$$),
	-- tables: nobody but the owner reads or writes them
	('outbox.events', 'relation', '{}', NULL,
	 $$WITH d AS (DELETE FROM outbox.events RETURNING 1) SELECT count(*) FROM d$$),
	('outbox.commands', 'relation', '{}', NULL,
	 $$WITH d AS (DELETE FROM outbox.commands RETURNING 1) SELECT count(*) FROM d$$),
	('outbox.receipts', 'relation', '{}', NULL,
	 $$WITH d AS (DELETE FROM outbox.receipts RETURNING 1) SELECT count(*) FROM d$$),
	('outbox.inbox', 'relation', '{}', NULL,
	 $$WITH d AS (DELETE FROM outbox.inbox RETURNING 1) SELECT count(*) FROM d$$),
	('outbox.policies', 'relation', '{}', NULL,
	 $$WITH d AS (DELETE FROM outbox.policies RETURNING 1) SELECT count(*) FROM d$$),
	('outbox.consumers', 'relation', '{}', NULL,
	 $$WITH d AS (DELETE FROM outbox.consumers RETURNING 1) SELECT count(*) FROM d$$),
	('outbox.purged', 'relation', '{}', NULL,
	 $$WITH d AS (DELETE FROM outbox.purged RETURNING 1) SELECT count(*) FROM d$$),
	('outbox.check_results', 'relation', '{}', NULL,
	 $$WITH d AS (DELETE FROM outbox.check_results RETURNING 1) SELECT count(*) FROM d$$),
	('outbox.lease_key', 'relation', '{}', NULL,
	 $$SELECT count(*) FROM outbox.lease_key$$),
	('outbox.streams', 'relation', '{}', NULL,
	 $$SELECT count(*) FROM outbox.streams$$),
	('outbox.subscriptions', 'relation', '{}', NULL,
	 $$SELECT count(*) FROM outbox.subscriptions$$),
	('outbox.stream_ticks', 'relation', '{}', NULL,
	 $$SELECT count(*) FROM outbox.stream_ticks$$),
	('outbox.stream_log_0', 'relation', '{}', NULL,
	 $$SELECT count(*) FROM outbox.stream_log_0$$),
	('outbox.stream_log_1', 'relation', '{}', NULL,
	 $$SELECT count(*) FROM outbox.stream_log_1$$),
	('outbox.stream_log_2', 'relation', '{}', NULL,
	 $$SELECT count(*) FROM outbox.stream_log_2$$),
	('outbox.stream_kept', 'relation', '{}', NULL,
	 $$SELECT count(*) FROM outbox.stream_kept$$),
	('outbox.stream_receipts_0', 'relation', '{}', NULL,
	 $$SELECT count(*) FROM outbox.stream_receipts_0$$),
	('outbox.stream_receipts_1', 'relation', '{}', NULL,
	 $$SELECT count(*) FROM outbox.stream_receipts_1$$),
	('outbox.stream_receipts_2', 'relation', '{}', NULL,
	 $$SELECT count(*) FROM outbox.stream_receipts_2$$),
	('outbox.stream_purged', 'relation', '{}', NULL,
	 $$SELECT count(*) FROM outbox.stream_purged$$),
	('outbox.stream_purged_commands', 'relation', '{outbox_admin,pg_monitor}', NULL,
	 $$SELECT count(*) FROM outbox.stream_purged_commands$$),
	('outbox.stream_rotation', 'relation', '{}', NULL,
	 $$SELECT count(*) FROM outbox.stream_rotation$$),
	('outbox.stream_progress', 'relation', '{}', NULL,
	 $$SELECT count(*) FROM outbox.stream_progress$$),
	('outbox.stream_failures', 'relation', '{}', NULL,
	 $$SELECT count(*) FROM outbox.stream_failures$$),
	('outbox.stream_log_id_seq', 'relation', '{}', NULL,
	 $$SELECT count(*) FROM outbox.stream_log_id_seq$$),
	('outbox._stream_log', 'relation', '{}', NULL,
	 $$SELECT count(*) FROM outbox._stream_log$$),
	('outbox._stream_receipts', 'relation', '{}', NULL,
	 $$SELECT count(*) FROM outbox._stream_receipts$$),
	-- views: monitoring roles read them
	('outbox.stats', 'relation', '{outbox_admin,pg_monitor}', NULL,
	 $$SELECT count(*) FROM outbox.stats$$),
	('outbox.workers', 'relation', '{outbox_admin,pg_monitor}', NULL,
	 $$SELECT count(*) FROM outbox.workers$$),
	('outbox.check_decisions_without_command', 'relation', '{outbox_admin,pg_monitor}', NULL,
	 $$SELECT count(*) FROM outbox.check_decisions_without_command$$),
	('outbox.check_orphan_commands', 'relation', '{outbox_admin,pg_monitor}', NULL,
	 $$SELECT count(*) FROM outbox.check_orphan_commands$$),
	('outbox.check_orphan_receipts', 'relation', '{outbox_admin,pg_monitor}', NULL,
	 $$SELECT count(*) FROM outbox.check_orphan_receipts$$),
	('outbox.blocked_keys', 'relation', '{outbox_admin,pg_monitor}', NULL,
	 $$SELECT count(*) FROM outbox.blocked_keys$$),
	('outbox.check_state', 'relation', '{outbox_admin,pg_monitor}', NULL,
	 $$SELECT count(*) FROM outbox.check_state$$),
	('outbox.check_receipt_overdue', 'relation', '{outbox_admin,pg_monitor}', NULL,
	 $$SELECT count(*) FROM outbox.check_receipt_overdue$$),
	('outbox.conservation', 'relation', '{outbox_admin,pg_monitor}', NULL,
	 $$SELECT count(*) FROM outbox.conservation$$),
	('outbox.backlog', 'relation', '{outbox_admin,pg_monitor}', NULL,
	 $$SELECT count(*) FROM outbox.backlog$$),
	('outbox.leases', 'relation', '{outbox_admin,pg_monitor}', NULL,
	 $$SELECT count(*) FROM outbox.leases$$),
	('outbox.dead_letters', 'relation', '{outbox_admin,pg_monitor}', NULL,
	 $$SELECT count(*) FROM outbox.dead_letters$$),
	('outbox.check_stream_state', 'relation', '{outbox_admin,pg_monitor}', NULL,
	 $$SELECT count(*) FROM outbox.check_stream_state$$),
	('outbox.stream_lag', 'relation', '{outbox_admin,pg_monitor}', NULL,
	 $$SELECT count(*) FROM outbox.stream_lag$$),
	('outbox.stream_batches', 'relation', '{outbox_admin,pg_monitor}', NULL,
	 $$SELECT count(*) FROM outbox.stream_batches$$),
	('outbox.stream_failed', 'relation', '{outbox_admin,pg_monitor}', NULL,
	 $$SELECT count(*) FROM outbox.stream_failed$$),
	('outbox.horizon', 'relation', '{outbox_admin,pg_monitor}', NULL,
	 $$SELECT count(*) FROM outbox.horizon$$),
	-- result types of the publisher API
	('outbox.lease', 'type', '{outbox_publisher}', NULL,
	 $$CREATE FUNCTION pg_temp.pt_uses_type(outbox.lease) RETURNS int LANGUAGE sql AS 'SELECT 1'$$),
	('outbox.ack_result', 'type', '{outbox_publisher}', NULL,
	 $$CREATE FUNCTION pg_temp.pt_uses_type(outbox.ack_result) RETURNS int LANGUAGE sql AS 'SELECT 1'$$),
	('outbox.handover_result', 'type', '{outbox_publisher}', NULL,
	 $$CREATE FUNCTION pg_temp.pt_uses_type(outbox.handover_result) RETURNS int LANGUAGE sql AS 'SELECT 1'$$),
	('outbox.stream_lease', 'type', '{outbox_publisher}', NULL,
	 $$CREATE FUNCTION pg_temp.pt_uses_type(outbox.stream_lease) RETURNS int LANGUAGE sql AS 'SELECT 1'$$),
	('outbox.decision_result', 'type', '{outbox_producer}', NULL,
	 $$CREATE FUNCTION pg_temp.pt_uses_type(outbox.decision_result) RETURNS int LANGUAGE sql AS 'SELECT 1'$$),
	('outbox.command_status', 'type', '{}', NULL,
	 $$CREATE FUNCTION pg_temp.pt_uses_type(outbox.command_status) RETURNS int LANGUAGE sql AS 'SELECT 1'$$),
	('outbox.command_version', 'type', '{}', NULL,
	 $$CREATE FUNCTION pg_temp.pt_uses_type(outbox.command_version) RETURNS int LANGUAGE sql AS 'SELECT 1'$$),
	('outbox.command_deliveries', 'type', '{}', NULL,
	 $$CREATE FUNCTION pg_temp.pt_uses_type(outbox.command_deliveries) RETURNS int LANGUAGE sql AS 'SELECT 1'$$);

-- The table names the group roles by capability (outbox_producer stands
-- for outbox.role('producer'), this database's <db>_outbox_producer).
UPDATE expected
   SET grantees = ARRAY(SELECT CASE WHEN g LIKE 'outbox\_%' THEN outbox.role(substr(g, 8))::text ELSE g END
						  FROM unnest(grantees) WITH ORDINALITY AS u(g, i) ORDER BY i);

-- The catalog's objects, named the way the table names them.
CREATE TEMP VIEW actual_objects AS
SELECT p.oid::regprocedure::text AS object, 'function' AS kind, p.oid
  FROM pg_proc p
 WHERE p.pronamespace = 'outbox'::regnamespace
UNION ALL
SELECT c.oid::regclass::text, 'relation', c.oid
  FROM pg_class c
 WHERE c.relnamespace = 'outbox'::regnamespace
   AND c.relkind IN ('r', 'p', 'v', 'm', 'f', 'S')
UNION ALL
SELECT t.oid::regtype::text, 'type', t.oid
  FROM pg_type t
 WHERE t.typnamespace = 'outbox'::regnamespace
   AND t.typcategory <> 'A'
   AND (t.typrelid = 0
		OR (SELECT c.relkind FROM pg_class c WHERE c.oid = t.typrelid) = 'c');

-- The roles that get privileges, and PUBLIC.
CREATE TEMP TABLE grantee_roles (r text);
INSERT INTO grantee_roles VALUES
	(outbox.role('producer')), (outbox.role('publisher')), (outbox.role('consumer')), (outbox.role('admin')),
	('pg_monitor'), ('public');

-- Login roles, one per group role, one with none (rolled back at the end).
SELECT format('CREATE ROLE pt_%s LOGIN IN ROLE %I', c, outbox.role(c))
  FROM unnest(ARRAY['producer', 'publisher', 'consumer', 'admin']) c
\gexec
CREATE ROLE pt_monitor LOGIN IN ROLE pg_monitor;
CREATE ROLE pt_nobody LOGIN;
CREATE TEMP TABLE login_roles (login text, grp text);
INSERT INTO login_roles VALUES
	('pt_producer', outbox.role('producer')), ('pt_publisher', outbox.role('publisher')),
	('pt_consumer', outbox.role('consumer')), ('pt_admin', outbox.role('admin')),
	('pt_monitor', 'pg_monitor'), ('pt_nobody', NULL);

-- Run stmt as role who (NULL: as the current user) in a subtransaction that
-- is always rolled back; return its SQLSTATE, 00000 for success.
CREATE FUNCTION pg_temp.try_as(who text, stmt text) RETURNS text
LANGUAGE plpgsql AS $$
DECLARE
	state text;
BEGIN
	BEGIN
		IF who IS NOT NULL THEN
			EXECUTE format('SET LOCAL ROLE %I', who);
		END IF;
		EXECUTE stmt;
		RAISE SQLSTATE 'PTOK0';
	EXCEPTION WHEN OTHERS THEN
		state := SQLSTATE;
	END;
	RETURN CASE WHEN state = 'PTOK0' THEN '00000' ELSE state END;
END;
$$;

-- Commands the calls work on: pt-live leased to pt-w at version 2, pt-dead
-- dead, pt-unc uncertain (as the sweep leaves an expired manual lease),
-- pt-fresh pending (the publisher calls claim it and use its token in one
-- statement, as whichever role runs them), pt-key an ordering key with a
-- dead head.
DO $$
BEGIN
	PERFORM outbox.commit_decision('pt-run', 1, 'e', 'pt-live', 'pt-kind-live', '{}');
	PERFORM outbox.commit_decision('pt-run', 2, 'e', 'pt-dead', 'pt-kind-dead', '{}');
	PERFORM outbox.commit_decision('pt-run', 3, 'e', 'pt-unc', 'pt-kind-unc', '{}');
	PERFORM outbox.commit_decision('pt-run', 4, 'e', 'pt-fresh', 'pt-kind-fresh', '{}');
	-- pt-key: an ordering key whose head (pt-key-1) is dead, with one
	-- command waiting behind it, for skip_head.
	PERFORM outbox.commit_decision('pt-run', 5, 'e', 'pt-key-1', 'pt-kind-key', '{}', ordering_key => 'pt-key');
	PERFORM outbox.commit_decision('pt-run', 6, 'e', 'pt-key-2', 'pt-kind-key', '{}', ordering_key => 'pt-key');
	PERFORM outbox.fail('pt-w', (SELECT token FROM outbox.claim('pt-w', 1, kinds => '{pt-kind-key}')),
						'boom', fatal => true);
	-- pt-consumer is the consumer role's name (the calls run as members).
	PERFORM outbox.register_consumer('pt-consumer', outbox.role('consumer')::text::regrole);
	PERFORM outbox.claim('pt-w', 1, kinds => '{pt-kind-live}');
	PERFORM outbox.fail('pt-w', (SELECT token FROM outbox.claim('pt-w', 1, kinds => '{pt-kind-dead}')),
						'boom', fatal => true);
	PERFORM outbox.claim('pt-w', 1, kinds => '{pt-kind-unc}');
	-- pt-stream: a stream with one command in a tick, for the batch calls.
	PERFORM outbox.create_stream('pt-stream', 1, 10);
	PERFORM outbox.set_policy('pt-kind-stream', stream => 'pt-stream');
	PERFORM outbox.create_subscription('pt-stream', 'pt-sub');
	PERFORM outbox.commit_decision('pt-run', 7, 'e', 'pt-s1', 'pt-kind-stream', '{}');
	-- (a tick sees only committed transactions: this one's, made by hand,
	-- sees the test's own transaction as committed)
	INSERT INTO outbox.stream_ticks (stream_id, tick, snap, last_id)
	SELECT s.stream_id, 1, outbox._stream_snapshot(format('%s:%s:', pg_current_xact_id()::text::bigint + 1,
								  pg_current_xact_id()::text::bigint + 1)::pg_snapshot), 1
	  FROM outbox.streams s WHERE s.stream = 'pt-stream';
	-- (and says that it gave the stream's partition commands, as a tick does)
	UPDATE outbox.streams SET part_ticks = '{1}' WHERE stream = 'pt-stream';
	UPDATE outbox.commands
	   SET status = 'uncertain', lease_until = NULL, version = version + 1,
		   last_error = 'lease of worker pt-w expired; kind pt-kind-unc needs a manual takeover'
	 WHERE command_id = 'pt-unc';
END;
$$;

-- 1-3: the catalog holds exactly the listed objects.
SELECT set_eq($$SELECT object FROM actual_objects WHERE kind = 'function'$$,
			  $$SELECT object FROM expected WHERE kind = 'function'$$,
			  'every function of the schema is in the privilege table, and only those');
SELECT set_eq($$SELECT object FROM actual_objects WHERE kind = 'relation'$$,
			  $$SELECT object FROM expected WHERE kind = 'relation'$$,
			  'every table and view of the schema is in the privilege table, and only those');
SELECT set_eq($$SELECT object FROM actual_objects WHERE kind = 'type'$$,
			  $$SELECT object FROM expected WHERE kind = 'type'$$,
			  'every standalone type of the schema is in the privilege table, and only those');

-- 4: nothing in the schema but the extension's own objects.
SELECT is(ARRAY(SELECT a.object FROM actual_objects a
				 WHERE NOT EXISTS (SELECT 1 FROM pg_depend d
									WHERE d.objid = a.oid
									  AND d.refclassid = 'pg_extension'::regclass
									  AND d.refobjid = (SELECT oid FROM pg_extension WHERE extname = 'outbox')
									  AND d.deptype = 'e')
				 ORDER BY 1),
		  '{}'::text[], 'every object of the schema belongs to the extension');

-- 5: the schema: USAGE for the group roles and pg_monitor, CREATE for the owner only.
SELECT is(ARRAY(SELECT CASE WHEN a.grantee = 0 THEN 'PUBLIC' ELSE a.grantee::regrole::text END
					   || ':' || a.privilege_type
				  FROM pg_namespace n, aclexplode(n.nspacl) a
				 WHERE n.nspname = 'outbox' AND a.grantee <> n.nspowner
				 ORDER BY 1),
		  ARRAY(SELECT r || ':USAGE' FROM grantee_roles WHERE r <> 'public' ORDER BY 1),
		  'schema outbox: USAGE for the group roles and pg_monitor, nothing for PUBLIC');

-- 6-56: each object's privileges, for the group roles, pg_monitor and PUBLIC.
SELECT is(CASE WHEN a.oid IS NULL THEN NULL ELSE
			  ARRAY(SELECT g.r FROM grantee_roles g
					 WHERE has_function_privilege(g.r, a.oid, 'EXECUTE')
					 ORDER BY 1) END,
		  ARRAY(SELECT x FROM unnest(e.grantees) x ORDER BY 1),
		  'EXECUTE on ' || e.object)
  FROM expected e
  LEFT JOIN actual_objects a ON a.object = e.object AND a.kind = e.kind
 WHERE e.kind = 'function'
 ORDER BY e.object;

SELECT is(CASE WHEN a.oid IS NULL THEN NULL ELSE
			  ARRAY(SELECT g.r || ':' || p.priv
					  FROM grantee_roles g,
						   unnest(ARRAY['SELECT', 'INSERT', 'UPDATE', 'DELETE', 'TRUNCATE',
										'REFERENCES', 'TRIGGER']) p(priv)
					 WHERE CASE WHEN p.priv IN ('SELECT', 'INSERT', 'UPDATE', 'REFERENCES')
								THEN has_any_column_privilege(g.r, a.oid, p.priv)
								ELSE has_table_privilege(g.r, a.oid, p.priv) END
					 ORDER BY 1) END,
		  ARRAY(SELECT x || ':SELECT' FROM unnest(e.grantees) x ORDER BY 1),
		  'privileges on ' || e.object)
  FROM expected e
  LEFT JOIN actual_objects a ON a.object = e.object AND a.kind = e.kind
 WHERE e.kind = 'relation'
 ORDER BY e.object;

SELECT is(CASE WHEN a.oid IS NULL THEN NULL ELSE
			  ARRAY(SELECT g.r FROM grantee_roles g
					 WHERE has_type_privilege(g.r, a.oid, 'USAGE')
					 ORDER BY 1) END,
		  ARRAY(SELECT x FROM unnest(e.grantees) x ORDER BY 1),
		  'USAGE on type ' || e.object)
  FROM expected e
  LEFT JOIN actual_objects a ON a.object = e.object AND a.kind = e.kind
 WHERE e.kind = 'type'
 ORDER BY e.object;

-- 57: no ACL entry (table or column) lets anyone but the owner write.
SELECT is(ARRAY(SELECT c.relname || ':' || a.grantee::regrole::text || ':' || a.privilege_type
				  FROM pg_class c, aclexplode(c.relacl) a
				 WHERE c.relnamespace = 'outbox'::regnamespace
				   AND a.grantee <> c.relowner AND a.privilege_type <> 'SELECT'
				UNION ALL
				SELECT c.relname || '.' || t.attname || ':' || a.grantee::regrole::text || ':' || a.privilege_type
				  FROM pg_class c
				  JOIN pg_attribute t ON t.attrelid = c.oid, aclexplode(t.attacl) a
				 WHERE c.relnamespace = 'outbox'::regnamespace
				   AND a.grantee <> c.relowner
				 ORDER BY 1),
		  '{}'::text[], 'nobody but the owner may write a table (no table or column grant)');

-- 58: PUBLIC appears in no ACL, and no ACL is left at its default (which
-- would let PUBLIC execute a function or use a type).
SELECT is(ARRAY(SELECT a.object FROM actual_objects a
				 WHERE CASE a.kind
						   WHEN 'function' THEN (SELECT p.proacl IS NULL
													 OR EXISTS (SELECT 1 FROM aclexplode(p.proacl) x WHERE x.grantee = 0)
												   FROM pg_proc p WHERE p.oid = a.oid)
						   WHEN 'relation' THEN (SELECT c.relacl IS NULL
													 OR EXISTS (SELECT 1 FROM aclexplode(c.relacl) x WHERE x.grantee = 0)
												   FROM pg_class c WHERE c.oid = a.oid)
						   ELSE (SELECT t.typacl IS NULL
										OR EXISTS (SELECT 1 FROM aclexplode(t.typacl) x WHERE x.grantee = 0)
								   FROM pg_type t WHERE t.oid = a.oid) END
				 ORDER BY 1),
		  '{}'::text[], 'PUBLIC has no privilege on any object, explicitly');

-- 59: the SECURITY DEFINER functions are exactly the listed ones.
SELECT is(ARRAY(SELECT a.object FROM actual_objects a JOIN pg_proc p ON p.oid = a.oid
				 WHERE p.prosecdef ORDER BY 1),
		  ARRAY(SELECT e.object FROM expected e WHERE e.secdef ORDER BY 1),
		  'SECURITY DEFINER: the producer, publisher, consumer and administrator API');

-- 60: each of them, and each C function of the API (SECURITY INVOKER, its
-- body run as the owner by OutboxCallAsOwner), pins search_path to
-- pg_catalog, pg_temp.
SELECT is(ARRAY(SELECT p.oid::regprocedure::text || ' ' || coalesce(p.proconfig::text, 'no settings')
				  FROM pg_proc p JOIN pg_language l ON l.oid = p.prolang
				 WHERE p.pronamespace = 'outbox'::regnamespace
				   AND (p.prosecdef OR (l.lanname = 'c' AND p.proconfig IS NOT NULL))
				   AND p.proconfig IS DISTINCT FROM '{"search_path=pg_catalog, pg_temp"}'::text[]
				 ORDER BY 1),
		  '{}'::text[], 'every SECURITY DEFINER function and C API function has search_path = pg_catalog, pg_temp and nothing else');

-- 60a: the C API is SECURITY INVOKER (current_user at the call site is the
-- caller) and these are its functions.
SELECT is(ARRAY(SELECT p.oid::regprocedure::text || CASE WHEN p.prosecdef THEN ' SECURITY DEFINER' ELSE '' END
				  FROM pg_proc p JOIN pg_language l ON l.oid = p.prolang
				 WHERE p.pronamespace = 'outbox'::regnamespace AND l.lanname = 'c'
				   AND p.proconfig IS NOT NULL
				 ORDER BY 1),
		  ARRAY(SELECT e.object FROM expected e JOIN pg_proc p ON p.oid = e.object::regprocedure
						JOIN pg_language l ON l.oid = p.prolang
				 WHERE e.kind = 'function' AND l.lanname = 'c' AND e.object NOT LIKE 'outbox.\_%'
				   AND e.object NOT IN ('outbox.preloaded()', 'outbox.stats_reset()')
				 ORDER BY 1),
		  'the C API functions are SECURITY INVOKER with a pinned search_path');

-- 61: so does every function written in SQL or PL/pgSQL.
SELECT is(ARRAY(SELECT p.oid::regprocedure::text
				  FROM pg_proc p JOIN pg_language l ON l.oid = p.prolang
				 WHERE p.pronamespace = 'outbox'::regnamespace AND l.lanname <> 'c'
				   AND NOT coalesce('search_path=pg_catalog, pg_temp' = ANY (p.proconfig), false)
				 ORDER BY 1),
		  '{}'::text[], 'every SQL and PL/pgSQL function pins search_path');

-- 62: the SECURITY DEFINER functions and the C API run as the extension's
-- owner, a superuser.
SELECT is(ARRAY(SELECT p.oid::regprocedure::text || ' owned by ' || p.proowner::regrole::text
				  FROM pg_proc p
				  JOIN pg_language l ON l.oid = p.prolang
				 WHERE p.pronamespace = 'outbox'::regnamespace
				   AND (p.prosecdef OR (l.lanname = 'c' AND p.proconfig IS NOT NULL))
				   AND (p.proowner <> (SELECT extowner FROM pg_extension WHERE extname = 'outbox')
						OR NOT (SELECT rolsuper FROM pg_roles WHERE oid = p.proowner))
				 ORDER BY 1),
		  '{}'::text[], 'SECURITY DEFINER and C API functions are owned by the extension owner');

-- 63: internal helpers are granted to none of the four roles, except the
-- three the views call.
SELECT is(ARRAY(SELECT a.object || ':' || g.r
				  FROM actual_objects a, grantee_roles g
				 WHERE a.kind = 'function' AND a.object LIKE 'outbox.\_%'
				   AND g.r NOT IN ('pg_monitor', 'public')
				   AND has_function_privilege(g.r, a.oid, 'EXECUTE')
				 ORDER BY 1),
		  ARRAY['outbox._blocked_keys():' || outbox.role('admin'), 'outbox._stats():' || outbox.role('admin'),
				'outbox._workers():' || outbox.role('admin')],
		  'internal helpers: only _blocked_keys, _stats and _workers, for the admin role (the views need them)');

-- 64: the group roles cannot log in and hold no special attribute.
SELECT is(ARRAY(SELECT r.rolname::text FROM pg_roles r
				 WHERE r.rolname IN (SELECT g.r FROM grantee_roles g WHERE g.r LIKE '%\_outbox\_%')
				   AND NOT (r.rolcanlogin OR r.rolsuper OR r.rolcreaterole OR r.rolcreatedb
							OR r.rolreplication OR r.rolbypassrls)
				 ORDER BY 1),
		  ARRAY(SELECT current_database() || '_outbox_' || c
				  FROM unnest(ARRAY['admin', 'consumer', 'producer', 'publisher']) c ORDER BY 1),
		  'the four group roles of this database exist, NOLOGIN, with no special attribute');

-- 64a: every privilege on an object of the schema goes to the owner, this
-- database's group roles or pg_monitor: none to a role of another database
-- or to the cluster-wide roles of 0.1.0.
SELECT is(ARRAY(SELECT DISTINCT a.grantee::regrole::text
				  FROM (SELECT p.proacl AS acl, p.proowner AS owner FROM pg_proc p
						 WHERE p.pronamespace = 'outbox'::regnamespace
						UNION ALL
						SELECT c.relacl, c.relowner FROM pg_class c
						 WHERE c.relnamespace = 'outbox'::regnamespace
						UNION ALL
						SELECT t.typacl, t.typowner FROM pg_type t
						 WHERE t.typnamespace = 'outbox'::regnamespace
						UNION ALL
						SELECT n.nspacl, n.nspowner FROM pg_namespace n
						 WHERE n.nspname = 'outbox') o, aclexplode(o.acl) a
				 WHERE a.grantee <> o.owner
				   AND a.grantee::regrole::text NOT IN (SELECT g.r FROM grantee_roles g)
				 ORDER BY 1),
		  '{}'::text[], 'no privilege goes to a role of another database');

-- 65: every listed call succeeds as the owner (so a 42501 below is a
-- privilege refusal, not a broken statement).
SELECT is(ARRAY(SELECT e.object || ' ' || pg_temp.try_as(NULL, e.call)
				  FROM expected e
				 WHERE pg_temp.try_as(NULL, e.call) <> '00000'
				 ORDER BY 1),
		  '{}'::text[], 'every listed call succeeds as the owner');

-- 66-116: each login role's call: 00000 when its group role is listed, else 42501.
SELECT is(ARRAY(SELECT l.login || ':' || pg_temp.try_as(l.login, e.call)
				  FROM login_roles l ORDER BY l.login),
		  ARRAY(SELECT l.login || ':' || CASE WHEN l.grp = ANY (e.grantees) THEN '00000' ELSE '42501' END
				  FROM login_roles l ORDER BY l.login),
		  'called as each role: ' || e.object)
  FROM expected e
 ORDER BY e.object;

SELECT * FROM finish();
ROLLBACK;
