-- outbox install script, part 45: metrics for monitoring systems.
--
-- The DBA views of part 40 (backlog, leases, dead_letters) aggregate the
-- whole of outbox.commands; on a table of ten million mostly finished
-- commands a scrape every 15 seconds cannot afford that.
-- outbox.metrics_backlog() gives the same figures from the partial indexes
-- of the unfinished commands, with index-only scans, so that its cost
-- grows with the commands that are not finished (the backlog) and never
-- with the published history:
--
--   pending, due      commands_claim_idx  (due_at IS NOT NULL; kind INCLUDEd)
--   sending           commands_lease_idx  (status = 'sending'; kind INCLUDEd)
--   waiting, dead     commands_held_idx   (the rest: no claim or ack writes
--   and uncertain                          to it)
--
-- outbox.metrics_checks() gives the conservation checks as the background
-- worker last counted them.
--
-- Published commands are not counted by kind: that count would read every
-- row that is kept for retention.  monitoring/queries.yaml (the queries of
-- prometheus-postgres-exporter) calls both; docs/monitoring.md shows the
-- plans.  They are SECURITY DEFINER because no role but the owner reads
-- the tables; they return counts, times and check names only, never a
-- command's id, payload or error, and are granted to pg_monitor.

-- The indexes metrics_backlog reads and the table check_results that
-- metrics_checks reads are in part 00 with the other tables and indexes
-- (an update script runs the parts after 00 again, and keeps the tables
-- and their indexes).

-- Per kind, status and state, the commands that are not published, and the
-- age of the oldest one where an age means something; each index is read
-- once, and the rows come by kind, status and state:
--
--   status     state    commands                         oldest_age_seconds
--   pending    ready    claimable now                    since the oldest became claimable
--   pending    delayed  waiting for their not-before     0
--   pending    waiting  behind an earlier command of     0
--                       their ordering key
--   sending    live     leases that have not ended       0
--   sending    expired  leases that ended without ack    since the oldest lease ended
--   dead       held     deliveries used up, or fatal     0
--   uncertain  held     expired under manual takeover    0
--
-- A (kind, status, state) with no command has no row.  The heap is read
-- only for pages that are not all-visible in the visibility map
-- (autovacuum sets them; "Heap Fetches" in the plan).  Each aggregate is
-- evaluated for every index entry read, so the pending and the sending
-- commands are counted with one filter each: the delayed ones and the
-- live leases are the rest (of the leases with an end), and the oldest
-- due_at (lease_until) is the oldest ready command (expired lease)
-- whenever there is one.
CREATE FUNCTION @extschema@.metrics_backlog(
	OUT kind pg_catalog.text,
	OUT status pg_catalog.text,
	OUT state pg_catalog.text,
	OUT commands pg_catalog.int8,
	OUT oldest_age_seconds pg_catalog.float8)
RETURNS SETOF record
LANGUAGE sql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
ROWS 30
AS $$
WITH p AS (
	SELECT c.kind, pg_catalog.count(*) AS n,
		   pg_catalog.count(*) FILTER (WHERE c.due_at OPERATOR(pg_catalog.<=) pg_catalog.now()) AS ready,
		   pg_catalog.min(c.due_at) AS oldest
	  FROM @extschema@.commands c
	 WHERE c.due_at IS NOT NULL
	 GROUP BY c.kind),
s AS (
	SELECT c.kind, pg_catalog.count(c.lease_until) AS n,
		   pg_catalog.count(*) FILTER (WHERE c.lease_until OPERATOR(pg_catalog.<=) pg_catalog.now()) AS expired,
		   pg_catalog.min(c.lease_until) AS oldest
	  FROM @extschema@.commands c
	 WHERE c.status OPERATOR(pg_catalog.=) 'sending'
	 GROUP BY c.kind),
h AS (
	SELECT c.kind, c.status COLLATE pg_catalog."C" AS status, pg_catalog.count(*) AS n
	  FROM @extschema@.commands c
	 WHERE c.status OPERATOR(pg_catalog.=) ANY (ARRAY['dead', 'uncertain']::pg_catalog.text[])
		OR (c.status OPERATOR(pg_catalog.=) 'pending' AND c.due_at IS NULL)
	 GROUP BY c.kind, c.status COLLATE pg_catalog."C")
SELECT x.kind, x.status, x.state, x.n, COALESCE(x.age, 0)
  FROM (SELECT p.kind, 'pending'::pg_catalog.text AS status, 1 AS o, 'ready'::pg_catalog.text AS state,
			   p.ready AS n,
			   pg_catalog.date_part('epoch', pg_catalog.now() OPERATOR(pg_catalog.-) p.oldest) AS age
		  FROM p
		UNION ALL
		SELECT p.kind, 'pending', 2, 'delayed', p.n OPERATOR(pg_catalog.-) p.ready, NULL FROM p
		UNION ALL
		SELECT s.kind, 'sending', 4, 'live', s.n OPERATOR(pg_catalog.-) s.expired, NULL FROM s
		UNION ALL
		SELECT s.kind, 'sending', 5, 'expired', s.expired,
			   pg_catalog.date_part('epoch', pg_catalog.now() OPERATOR(pg_catalog.-) s.oldest)
		  FROM s
		UNION ALL
		SELECT h.kind, h.status::pg_catalog.text,
			   CASE WHEN h.status OPERATOR(pg_catalog.=) 'pending' THEN 3 ELSE 6 END,
			   CASE WHEN h.status OPERATOR(pg_catalog.=) 'pending' THEN 'waiting' ELSE 'held' END,
			   h.n, NULL
		  FROM h) x
 WHERE x.n OPERATOR(pg_catalog.>) 0
 ORDER BY x.kind, x.status COLLATE pg_catalog."C", x.o
$$;
COMMENT ON FUNCTION @extschema@.metrics_backlog()
	IS 'per kind, status and state (ready, delayed, waiting, live, expired, held): the commands that are not published and the age in seconds of the oldest ready command or expired lease; index-only scans of commands_claim_idx, commands_lease_idx and commands_held_idx';

REVOKE ALL ON FUNCTION @extschema@.metrics_backlog() FROM PUBLIC;
DO $$
BEGIN
	EXECUTE 'GRANT EXECUTE ON FUNCTION @extschema@.metrics_backlog() TO pg_monitor, '
		OPERATOR(pg_catalog.||) pg_catalog.quote_ident(@extschema@.role('admin'));
END;
$$;

-- The conservation checks, computed by the background worker.  Each check
-- view reads its tables whole (seconds per million commands), too much for
-- a scrape every 15 seconds; the worker counts each check's rows every
-- outbox.check_interval, one check per transaction (duties.c, duty
-- "checks"), and keeps the count here with when it was computed.  The
-- views and outbox.verify() are unchanged and always exact; these rows are
-- as of computed_at.  One row per check, made here: a check added to
-- outbox.conservation gets a row here too (test 095 compares the two).
-- violations and computed_at are NULL until the first count.  Not dumped
-- (pg_dump leaves an extension's tables out): a restored database has the
-- NULL rows until its worker counts.
-- (The table check_results is in part 00.)

-- Count the rows of the n-th check (by name; 1-based) into check_results
-- and return the number of checks, so that the worker knows when a turn is
-- done; an n past the last counts nothing.  computed_at is the time just
-- before the count's snapshot.  Called by the worker only (the owner's
-- rights; granted to nobody).
CREATE FUNCTION @extschema@._check_run(n pg_catalog.int4)
RETURNS pg_catalog.int4
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
	total pg_catalog.int4;
	chk pg_catalog.text;
	found_n pg_catalog.int8;
	t0 pg_catalog.timestamptz;
BEGIN
	SELECT pg_catalog.count(*) INTO total FROM @extschema@.check_results;
	SELECT r.check_name INTO chk FROM @extschema@.check_results r
	 ORDER BY r.check_name OFFSET n OPERATOR(pg_catalog.-) 1 LIMIT 1;
	IF chk IS NOT NULL THEN
		t0 := pg_catalog.clock_timestamp();
		EXECUTE pg_catalog.format('SELECT pg_catalog.count(*) FROM @extschema@.%I', 'check_' OPERATOR(pg_catalog.||) chk)
		   INTO found_n;
		-- the check state counts the streams' rules too (part 40)
		IF chk OPERATOR(pg_catalog.=) 'state' THEN
			found_n := found_n OPERATOR(pg_catalog.+)
				(SELECT pg_catalog.count(*) FROM @extschema@.check_stream_state);
		END IF;
		UPDATE @extschema@.check_results r
		   SET violations = found_n, computed_at = t0,
			   duration_seconds = pg_catalog.date_part('epoch', pg_catalog.clock_timestamp() OPERATOR(pg_catalog.-) t0)
		 WHERE r.check_name OPERATOR(pg_catalog.=) chk;
	END IF;
	RETURN total;
END;
$$;
COMMENT ON FUNCTION @extschema@._check_run(pg_catalog.int4)
	IS 'internal: the background worker counts the n-th conservation check into outbox.check_results';
REVOKE ALL ON FUNCTION @extschema@._check_run(pg_catalog.int4) FROM PUBLIC;

-- The worker's last counts, per check: violations (NULL before the first
-- count), the Unix time of the count (0: never) and how long it took.
-- Reads the five rows of check_results only.
CREATE FUNCTION @extschema@.metrics_checks(
	OUT check_name pg_catalog.text,
	OUT severity pg_catalog.text,
	OUT violations pg_catalog.int8,
	OUT computed_timestamp_seconds pg_catalog.float8,
	OUT duration_seconds pg_catalog.float8)
RETURNS SETOF record
LANGUAGE sql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
ROWS 5
AS $$
SELECT r.check_name, r.severity, r.violations,
	   COALESCE(pg_catalog.date_part('epoch', r.computed_at), 0),
	   COALESCE(r.duration_seconds, 0)
  FROM @extschema@.check_results r
 ORDER BY r.check_name
$$;
COMMENT ON FUNCTION @extschema@.metrics_checks()
	IS 'per conservation check: the violations the background worker last counted (NULL: not yet), the Unix time of that count (0: never) and its duration in seconds';
REVOKE ALL ON FUNCTION @extschema@.metrics_checks() FROM PUBLIC;
DO $$
BEGIN
	EXECUTE 'GRANT EXECUTE ON FUNCTION @extschema@.metrics_checks() TO pg_monitor, '
		OPERATOR(pg_catalog.||) pg_catalog.quote_ident(@extschema@.role('admin'));
END;
$$;
