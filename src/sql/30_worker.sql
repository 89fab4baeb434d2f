-- outbox install script, part 30: statistics and the background workers.
--
-- The counters and the worker slots live in shared memory (src/shared.c,
-- which also holds the functions below; docs/worker.md); these views read
-- them.  Without shared_preload_libraries
-- there are none: outbox.stats then shows one row of NULLs (unknown, not
-- zero) and outbox.workers one row with state 'not preloaded' that says
-- what to do, so that monitoring queries keep working.

-- Cumulative counters, one row.
CREATE FUNCTION @extschema@._stats(
	OUT enqueued pg_catalog.int8,
	OUT claimed pg_catalog.int8,
	OUT taken_over pg_catalog.int8,
	OUT acked pg_catalog.int8,
	OUT stale_refused pg_catalog.int8,
	OUT failed pg_catalog.int8,
	OUT dead_lettered pg_catalog.int8,
	OUT purged pg_catalog.int8,
	OUT wakeups pg_catalog.int8,
	OUT stats_reset pg_catalog.timestamptz)
RETURNS record
LANGUAGE c VOLATILE
AS 'MODULE_PATHNAME', 'outbox_stats';
COMMENT ON FUNCTION @extschema@._stats()
	IS 'the shared-memory counters behind outbox.stats';

CREATE VIEW @extschema@.stats AS
	SELECT s.enqueued, s.claimed, s.taken_over, s.acked, s.stale_refused,
		   s.failed, s.dead_lettered, s.purged, s.wakeups, s.stats_reset
	  FROM @extschema@._stats() s;
COMMENT ON VIEW @extschema@.stats
	IS 'cumulative counters since the last reset, cluster-wide (all NULL when outbox is not in shared_preload_libraries)';
COMMENT ON COLUMN @extschema@.stats.enqueued IS 'commands committed by producers (a prepared transaction''s at COMMIT PREPARED)';
COMMENT ON COLUMN @extschema@.stats.claimed IS 'leases granted by claim (takeovers included)';
COMMENT ON COLUMN @extschema@.stats.taken_over IS 'leases granted on a command whose previous lease had expired';
COMMENT ON COLUMN @extschema@.stats.acked IS 'commands acknowledged as published';
COMMENT ON COLUMN @extschema@.stats.stale_refused IS 'ack, fail or renew calls refused with lease_not_owned';
COMMENT ON COLUMN @extschema@.stats.failed IS 'deliveries reported failed';
COMMENT ON COLUMN @extschema@.stats.dead_lettered IS 'commands moved to dead (by fail or by the worker''s sweep)';
COMMENT ON COLUMN @extschema@.stats.purged IS 'commands removed by the retention purge (by the worker or by outbox.purge)';
COMMENT ON COLUMN @extschema@.stats.wakeups IS 'notifications sent by the workers on outbox.notify_channel';
COMMENT ON COLUMN @extschema@.stats.stats_reset IS 'time of the last outbox.stats_reset() (or of the server start)';

CREATE FUNCTION @extschema@.stats_reset()
RETURNS void
LANGUAGE c VOLATILE
AS 'MODULE_PATHNAME', 'outbox_stats_reset';
COMMENT ON FUNCTION @extschema@.stats_reset()
	IS 'zero the counters of outbox.stats (cluster-wide)';

-- Called by outbox.purge() (part 20) to count what it removed at commit.
CREATE FUNCTION @extschema@._count_purged(n pg_catalog.int4)
RETURNS void
LANGUAGE c VOLATILE
AS 'MODULE_PATHNAME', 'outbox_count_purged';
COMMENT ON FUNCTION @extschema@._count_purged(pg_catalog.int4)
	IS 'add n to outbox.stats.purged when the calling transaction commits';

-- Called by outbox.requeue() and outbox.resolve() (part 36), which make a
-- command claimable now: its commit wakes the worker, as an enqueue does.
CREATE FUNCTION @extschema@._wake_at_commit()
RETURNS void
LANGUAGE c VOLATILE
AS 'MODULE_PATHNAME', 'outbox_wake_at_commit';
COMMENT ON FUNCTION @extschema@._wake_at_commit()
	IS 'wake the background worker (and so the listening publishers) when the calling transaction commits';

-- The background workers, one row per slot in use (every database).
CREATE FUNCTION @extschema@._workers(
	OUT dboid pg_catalog.oid,
	OUT pid pg_catalog.int4,
	OUT state pg_catalog.text,
	OUT started_at pg_catalog.timestamptz,
	OUT last_run pg_catalog.timestamptz,
	OUT rounds pg_catalog.int8,
	OUT naptime pg_catalog.interval,
	OUT last_purged pg_catalog.int8,
	OUT last_error pg_catalog.text,
	OUT last_error_at pg_catalog.timestamptz)
RETURNS SETOF record
LANGUAGE c VOLATILE
ROWS 8
AS 'MODULE_PATHNAME', 'outbox_workers';
COMMENT ON FUNCTION @extschema@._workers()
	IS 'the shared-memory worker slots behind outbox.workers';

CREATE VIEW @extschema@.workers WITH (security_barrier) AS
	SELECT d.datname AS database, w.pid, w.state, w.started_at, w.last_run,
		   w.rounds, w.naptime, w.last_purged, w.last_error, w.last_error_at
	  FROM @extschema@._workers() w
	  LEFT JOIN pg_catalog.pg_database d ON d.oid OPERATOR(pg_catalog.=) w.dboid;
COMMENT ON VIEW @extschema@.workers
	IS 'the outbox background workers of the cluster: one row per database served (state ''not preloaded'' when outbox is not in shared_preload_libraries)';
COMMENT ON COLUMN @extschema@.workers.database IS 'database the worker serves';
COMMENT ON COLUMN @extschema@.workers.pid IS 'process id of the worker (NULL while not running)';
COMMENT ON COLUMN @extschema@.workers.state IS 'starting, idle (napping), running (doing its duties), stopped (exited; the launcher restarts it), or not preloaded';
COMMENT ON COLUMN @extschema@.workers.started_at IS 'when the running worker started';
COMMENT ON COLUMN @extschema@.workers.last_run IS 'when the worker last finished a round of its duties';
COMMENT ON COLUMN @extschema@.workers.rounds IS 'rounds of duties done since the worker started';
COMMENT ON COLUMN @extschema@.workers.naptime IS 'the outbox.naptime the worker is using';
COMMENT ON COLUMN @extschema@.workers.last_purged IS 'commands purged in the last round';
COMMENT ON COLUMN @extschema@.workers.last_error IS 'the last error of the worker''s duties (also in the server log)';
COMMENT ON COLUMN @extschema@.workers.last_error_at IS 'when last_error happened';

-- Ask the launcher to serve this database when the installation commits
-- (inside a prepared transaction: when it is committed).  Without this, a
-- new installation would wait for the launcher's next look at the
-- database, which only probes databases it has not seen.
CREATE FUNCTION @extschema@._request_worker()
RETURNS void
LANGUAGE c VOLATILE
AS 'MODULE_PATHNAME', 'outbox_request_worker';
COMMENT ON FUNCTION @extschema@._request_worker()
	IS 'ask the launcher for a worker in this database once the transaction commits';

SELECT @extschema@._request_worker();

-- Privileges (the roles come from part 05).
REVOKE ALL ON FUNCTION
	@extschema@._stats(),
	@extschema@.stats_reset(),
	@extschema@._count_purged(pg_catalog.int4),
	@extschema@._wake_at_commit(),
	@extschema@._workers(),
	@extschema@._request_worker()
	FROM PUBLIC;
REVOKE ALL ON @extschema@.stats, @extschema@.workers FROM PUBLIC;

-- The views call their functions with the reader's rights.
DO $$
DECLARE
	admin CONSTANT pg_catalog.text := pg_catalog.quote_ident(@extschema@.role('admin'));
BEGIN
	EXECUTE 'GRANT EXECUTE ON FUNCTION @extschema@._stats(), @extschema@._workers() TO pg_monitor, ' OPERATOR(pg_catalog.||) admin;
	EXECUTE 'GRANT SELECT ON @extschema@.stats, @extschema@.workers TO pg_monitor, ' OPERATOR(pg_catalog.||) admin;
	EXECUTE 'GRANT EXECUTE ON FUNCTION @extschema@.stats_reset() TO ' OPERATOR(pg_catalog.||) admin;
END;
$$;
