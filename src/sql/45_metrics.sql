-- outbox install script, part 45: metrics for monitoring systems.
--
-- The DBA views of part 40 (backlog, leases, dead_letters) aggregate the
-- whole of outbox.commands; on a table of ten million mostly finished
-- commands a scrape every 15 seconds cannot afford that.
-- outbox.metrics_backlog() gives the same figures from the partial indexes,
-- so that its cost grows
-- with the commands that are not finished (the backlog) and never with the
-- published history:
--
--   pending rows       commands_claim_idx  (due_at IS NOT NULL)
--   sending rows       commands_lease_idx  (status = 'sending')
--   dead and uncertain commands_held_idx   (below)
--
-- Published commands are not counted by kind: that count would read every
-- row that is kept for retention.  monitoring/queries.yaml (the queries of
-- prometheus-postgres-exporter) calls it; docs/monitoring.md shows its
-- plan.  It is SECURITY DEFINER because no role but the owner reads
-- outbox.commands; it returns counts and ages only, never a command's id,
-- payload or error, and is granted to pg_monitor.

-- Commands that need a human, by kind and status (the key holds both, in
-- the "C" collation like every text key of the extension, so
-- metrics_backlog counts them with an index-only scan).  Only dead and
-- uncertain rows have an entry, so claims and acks never write to this
-- index: a command enters it when it goes dead or uncertain and leaves it
-- when it is requeued or resolved.  (status is already part of
-- commands_lease_idx's predicate, so this index makes no update that was
-- HOT non-HOT.)
CREATE INDEX commands_held_idx ON @extschema@.commands (kind, status COLLATE pg_catalog."C")
	WHERE status OPERATOR(pg_catalog.=) ANY (ARRAY['dead', 'uncertain']::pg_catalog.text[]);
COMMENT ON INDEX @extschema@.commands_held_idx
	IS 'dead and uncertain commands by kind and status (read by outbox.metrics_backlog)';

-- Per kind, status and state, the commands that are not published, and the
-- age of the oldest one where an age means something.  Each status is read
-- from its own partial index, once:
--
--   status     state    commands                         oldest_age_seconds
--   pending    ready    claimable now                    since the oldest became claimable
--   pending    delayed  waiting for their not-before     0
--   sending    live     leases that have not ended       0
--   sending    expired  leases that ended without ack    since the oldest lease ended
--   dead       held     deliveries used up, or fatal     0
--   uncertain  held     expired under manual takeover    0
--
-- A (kind, status, state) with no command has no row.
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
	SELECT c.kind,
		   pg_catalog.count(*) FILTER (WHERE c.due_at OPERATOR(pg_catalog.<=) pg_catalog.now()) AS ready,
		   pg_catalog.count(*) FILTER (WHERE c.due_at OPERATOR(pg_catalog.>) pg_catalog.now()) AS delayed,
		   pg_catalog.min(c.due_at) FILTER (WHERE c.due_at OPERATOR(pg_catalog.<=) pg_catalog.now()) AS oldest
	  FROM @extschema@.commands c
	 WHERE c.due_at IS NOT NULL
	 GROUP BY c.kind),
s AS (
	SELECT c.kind,
		   pg_catalog.count(*) FILTER (WHERE c.lease_until OPERATOR(pg_catalog.>) pg_catalog.now()) AS live,
		   pg_catalog.count(*) FILTER (WHERE c.lease_until OPERATOR(pg_catalog.<=) pg_catalog.now()) AS expired,
		   pg_catalog.min(c.lease_until) FILTER (WHERE c.lease_until OPERATOR(pg_catalog.<=) pg_catalog.now()) AS oldest
	  FROM @extschema@.commands c
	 WHERE c.status OPERATOR(pg_catalog.=) 'sending'
	 GROUP BY c.kind),
h AS (
	SELECT c.kind, c.status::pg_catalog.text AS status, pg_catalog.count(*) AS n
	  FROM @extschema@.commands c
	 WHERE c.status OPERATOR(pg_catalog.=) ANY (ARRAY['dead', 'uncertain']::pg_catalog.text[])
	 GROUP BY c.kind, c.status)
SELECT x.kind, x.status, x.state, x.n, COALESCE(x.age, 0)
  FROM (SELECT p.kind, 'pending'::pg_catalog.text AS status, 'ready'::pg_catalog.text AS state,
			   p.ready AS n,
			   pg_catalog.date_part('epoch', pg_catalog.now() OPERATOR(pg_catalog.-) p.oldest) AS age
		  FROM p
		UNION ALL
		SELECT p.kind, 'pending', 'delayed', p.delayed, NULL FROM p
		UNION ALL
		SELECT s.kind, 'sending', 'live', s.live, NULL FROM s
		UNION ALL
		SELECT s.kind, 'sending', 'expired', s.expired,
			   pg_catalog.date_part('epoch', pg_catalog.now() OPERATOR(pg_catalog.-) s.oldest)
		  FROM s
		UNION ALL
		SELECT h.kind, h.status, 'held', h.n, NULL FROM h) x
 WHERE x.n OPERATOR(pg_catalog.>) 0
$$;
COMMENT ON FUNCTION @extschema@.metrics_backlog()
	IS 'per kind, status and state (ready, delayed, live, expired, held): the commands that are not published and the age in seconds of the oldest ready command or expired lease; read from the partial indexes only';

REVOKE ALL ON FUNCTION @extschema@.metrics_backlog() FROM PUBLIC;
DO $$
BEGIN
	EXECUTE 'GRANT EXECUTE ON FUNCTION @extschema@.metrics_backlog() TO pg_monitor, '
		OPERATOR(pg_catalog.||) pg_catalog.quote_ident(@extschema@.role('admin'));
END;
$$;
