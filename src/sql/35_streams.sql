-- outbox install script, part 35: streams, the write-once path
-- (docs/streams.md).
--
-- The administrator's functions (create_stream, create_subscription,
-- drop_subscription) are PL/pgSQL, SECURITY DEFINER, like part 20.  The
-- publisher's calls (claim_batch, ack_batch, renew_batch) are C
-- (src/stream.c): their body runs as the owner (OutboxCallAsOwner), makes
-- and checks the batch token, and calls the internal functions below
-- (_ack_batch, for an ack with failures; an ack without them, claim_batch's
-- body and renew_batch's statement are C too, src/stream.c and
-- src/stream_claim.c), which nobody else may call.
-- The producer's path is in C (commit_decision on a kind with a stream,
-- src/stream.c); the worker cuts the ticks in C too (OutboxStreamTick).
--
-- Locking.  The stream's row (outbox.streams) is locked FOR UPDATE by
-- create_subscription and by the tick of that stream, so a subscription
-- starts at a tick that no concurrent tick overtakes.  claim_batch locks one
-- progress row (stream_progress) at a time, FOR UPDATE SKIP LOCKED, so
-- concurrent publishers of one subscription take different partitions and
-- never wait for each other; ack_batch and renew_batch change that row
-- only while it holds the token's batch, version, claim nonce and worker
-- (READ COMMITTED re-checks the WHERE clause on the newest row version), so of a
-- takeover and a late ack exactly one wins.

-- Every row of the stream log, wherever it is (the three log tables and
-- the rows a rotation kept).  Internal.
CREATE VIEW @extschema@._stream_log AS
SELECT l.id, l.xid, l.stream_id, l.part, l.command_id, l.run_id, l.seq, l.kind,
	   l.payload, l.headers, l.ordering_key, l.decided_by, l.created_at
  FROM @extschema@.stream_log_0 l
UNION ALL
SELECT l.id, l.xid, l.stream_id, l.part, l.command_id, l.run_id, l.seq, l.kind,
	   l.payload, l.headers, l.ordering_key, l.decided_by, l.created_at
  FROM @extschema@.stream_log_1 l
UNION ALL
SELECT l.id, l.xid, l.stream_id, l.part, l.command_id, l.run_id, l.seq, l.kind,
	   l.payload, l.headers, l.ordering_key, l.decided_by, l.created_at
  FROM @extschema@.stream_log_2 l
UNION ALL
SELECT l.id, l.xid, l.stream_id, l.part, l.command_id, l.run_id, l.seq, l.kind,
	   l.payload, l.headers, l.ordering_key, l.decided_by, l.created_at
  FROM @extschema@.stream_kept l;
COMMENT ON VIEW @extschema@._stream_log
	IS 'internal: every row of the stream log (the three log tables and the kept rows)';

-- Every receipt of a stream command: those of the commands in the three
-- log tables (stream_receipts_0..2, truncated with their table) and those
-- of the kept commands, in outbox.receipts.  Internal.
CREATE VIEW @extschema@._stream_receipts AS
SELECT r.command_id, r.outcome, r.detail, r.completed_at, r.run_id
  FROM @extschema@.stream_receipts_0 r
UNION ALL
SELECT r.command_id, r.outcome, r.detail, r.completed_at, r.run_id
  FROM @extschema@.stream_receipts_1 r
UNION ALL
SELECT r.command_id, r.outcome, r.detail, r.completed_at, r.run_id
  FROM @extschema@.stream_receipts_2 r;
COMMENT ON VIEW @extschema@._stream_receipts
	IS 'internal: the receipts of the commands in the three stream log tables (a kept command''s is in outbox.receipts)';

-- The leased commands of a batch, as claim_batch returns them (the token
-- is the C function's to add).
CREATE TYPE @extschema@.stream_lease AS (
	command_id	pg_catalog.text,
	run_id		pg_catalog.text,
	seq			pg_catalog.int8,
	kind		pg_catalog.text,
	payload		pg_catalog.jsonb,
	token		pg_catalog.text,
	version		pg_catalog.int8,
	deliveries	pg_catalog.int4,
	lease_until pg_catalog.timestamptz,
	headers		pg_catalog.jsonb,
	ordering_key pg_catalog.text,
	batch_id	pg_catalog.int8,
	part		pg_catalog.int4
);
COMMENT ON TYPE @extschema@.stream_lease
	IS 'a command of a leased stream batch: the columns of outbox.lease (token and version are the batch''s), then batch_id and part';

-- A snapshot in the streams' transaction ids: every id of snap plus the
-- installation's xid_base (outbox.stream_rotation).
CREATE FUNCTION @extschema@._stream_snapshot(snap pg_catalog.pg_snapshot)
RETURNS pg_catalog.pg_snapshot
LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
SELECT pg_catalog.format('%s:%s:%s',
		pg_catalog.pg_snapshot_xmin(_stream_snapshot.snap)::pg_catalog.text::pg_catalog.int8 OPERATOR(pg_catalog.+) r.xid_base,
		pg_catalog.pg_snapshot_xmax(_stream_snapshot.snap)::pg_catalog.text::pg_catalog.int8 OPERATOR(pg_catalog.+) r.xid_base,
		COALESCE((SELECT pg_catalog.string_agg((x::pg_catalog.text::pg_catalog.int8 OPERATOR(pg_catalog.+) r.xid_base)::pg_catalog.text,
												',' ORDER BY x)
					FROM pg_catalog.pg_snapshot_xip(_stream_snapshot.snap) x), ''))::pg_catalog.pg_snapshot
  FROM @extschema@.stream_rotation r
$$;

-- Admin ------------------------------------------------------------------

CREATE FUNCTION @extschema@.create_stream(
	stream pg_catalog.text,
	partitions pg_catalog.int4 DEFAULT 4,
	batch_size pg_catalog.int4 DEFAULT 1000)
RETURNS void
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
	sid pg_catalog.int4;
	x pg_catalog.xid8;
BEGIN
	PERFORM @extschema@._require_id(stream, 'stream');
	PERFORM @extschema@._require(partitions, 'partitions');
	PERFORM @extschema@._require(batch_size, 'batch_size');
	IF partitions OPERATOR(pg_catalog.<) 1 OR partitions OPERATOR(pg_catalog.>) 256 THEN
		RAISE EXCEPTION 'partitions must be between 1 and 256'
			USING ERRCODE = 'invalid_parameter_value',
				  DETAIL = pg_catalog.format('The value was %s.', partitions);
	END IF;
	IF batch_size OPERATOR(pg_catalog.<) 1 OR batch_size OPERATOR(pg_catalog.>) 100000 THEN
		RAISE EXCEPTION 'batch_size must be between 1 and 100000'
			USING ERRCODE = 'invalid_parameter_value',
				  DETAIL = pg_catalog.format('The value was %s.', batch_size);
	END IF;
	LOCK TABLE @extschema@.streams IN SHARE ROW EXCLUSIVE MODE;
	IF EXISTS (SELECT 1 FROM @extschema@.streams s WHERE s.stream OPERATOR(pg_catalog.=) create_stream.stream) THEN
		RAISE EXCEPTION 'stream "%" already exists', stream
			USING ERRCODE = 'duplicate_object';
	END IF;
	SELECT COALESCE(pg_catalog.max(s.stream_id), 0) OPERATOR(pg_catalog.+) 1 INTO sid FROM @extschema@.streams s;
	INSERT INTO @extschema@.streams (stream, stream_id, partitions, batch_size, part_ticks)
	VALUES (stream, sid, partitions, batch_size,
			pg_catalog.array_fill(0::pg_catalog.int8, ARRAY[partitions]));
	-- Tick 0 sees exactly the transactions finished before every running
	-- one began (xid < xmin of the current snapshot): none of them can
	-- have written to a stream that did not exist.
	x := pg_catalog.pg_snapshot_xmin(pg_catalog.pg_current_snapshot());
	INSERT INTO @extschema@.stream_ticks (stream_id, tick, snap, last_id)
	VALUES (sid, 0, @extschema@._stream_snapshot(pg_catalog.format('%s:%s:', x, x)::pg_catalog.pg_snapshot),
			(SELECT q.last_value FROM @extschema@.stream_log_id_seq q));
END;
$$;
COMMENT ON FUNCTION @extschema@.create_stream(pg_catalog.text, pg_catalog.int4, pg_catalog.int4)
	IS 'create a stream of partitions partitions (1 to 256), cut into batches of about batch_size commands per partition';

CREATE FUNCTION @extschema@.create_subscription(
	stream pg_catalog.text,
	subscription pg_catalog.text,
	claimers pg_catalog.regrole[] DEFAULT NULL)
RETURNS void
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
	s record;
	start pg_catalog.int8;
BEGIN
	PERFORM @extschema@._require_id(stream, 'stream');
	PERFORM @extschema@._require_id(subscription, 'subscription');
	IF pg_catalog.array_ndims(claimers) OPERATOR(pg_catalog.>) 1 THEN
		RAISE EXCEPTION 'claimers must be a one-dimensional array'
			USING ERRCODE = 'array_subscript_error';
	END IF;
	IF pg_catalog.array_position(claimers, NULL) IS NOT NULL THEN
		RAISE EXCEPTION 'claimers must not contain nulls'
			USING ERRCODE = 'null_value_not_allowed';
	END IF;
	-- The stream's row: no tick of it is cut while this runs.
	SELECT t.stream_id, t.partitions INTO s FROM @extschema@.streams t
	 WHERE t.stream OPERATOR(pg_catalog.=) create_subscription.stream FOR UPDATE;
	IF NOT FOUND THEN
		RAISE EXCEPTION 'stream "%" does not exist', stream
			USING ERRCODE = 'undefined_object';
	END IF;
	IF EXISTS (SELECT 1 FROM @extschema@.subscriptions u
				WHERE u.subscription OPERATOR(pg_catalog.=) create_subscription.subscription) THEN
		RAISE EXCEPTION 'subscription "%" already exists', subscription
			USING ERRCODE = 'duplicate_object';
	END IF;
	-- The first subscription of a stream publishes everything in it (from
	-- tick 0); a later one what is decided after it, that is after the
	-- stream's last tick.
	IF EXISTS (SELECT 1 FROM @extschema@.subscriptions u
				WHERE u.stream OPERATOR(pg_catalog.=) create_subscription.stream) THEN
		SELECT pg_catalog.max(k.tick) INTO start FROM @extschema@.stream_ticks k
		 WHERE k.stream_id OPERATOR(pg_catalog.=) s.stream_id;
	ELSE
		-- (tick 0, unless the ticks before the oldest one still needed
		-- were removed while the stream had no subscription... which it
		-- cannot: they are removed only behind a subscription's progress)
		SELECT pg_catalog.min(k.tick) INTO start FROM @extschema@.stream_ticks k
		 WHERE k.stream_id OPERATOR(pg_catalog.=) s.stream_id;
	END IF;
	-- (created_at from the clock, not the transaction's start: the batch
	-- tokens' MAC covers it, so that one dropped and created again in one
	-- transaction refuses the old one's tokens too)
	INSERT INTO @extschema@.subscriptions (subscription, stream, claimers, start_tick, created_at)
	VALUES (subscription, stream, claimers, start, pg_catalog.clock_timestamp());
	INSERT INTO @extschema@.stream_progress (subscription, part, acked_tick)
	SELECT subscription, g.p, start
	  FROM pg_catalog.generate_series(0, s.partitions OPERATOR(pg_catalog.-) 1) AS g(p);
END;
$$;
COMMENT ON FUNCTION @extschema@.create_subscription(pg_catalog.text, pg_catalog.text, pg_catalog.regrole[])
	IS 'subscribe to a stream: publish every command decided after now (the first subscription: every command of the stream); claimers NULL lets every publisher claim its batches';

CREATE FUNCTION @extschema@.drop_subscription(subscription pg_catalog.text)
RETURNS void
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
	PERFORM @extschema@._require_id(subscription, 'subscription');
	DELETE FROM @extschema@.subscriptions u
	 WHERE u.subscription OPERATOR(pg_catalog.=) drop_subscription.subscription;
	IF NOT FOUND THEN
		RAISE EXCEPTION 'subscription "%" does not exist', subscription
			USING ERRCODE = 'undefined_object';
	END IF;
	DELETE FROM @extschema@.stream_progress p
	 WHERE p.subscription OPERATOR(pg_catalog.=) drop_subscription.subscription;
	DELETE FROM @extschema@.stream_failures f
	 WHERE f.subscription OPERATOR(pg_catalog.=) drop_subscription.subscription;
END;
$$;
COMMENT ON FUNCTION @extschema@.drop_subscription(pg_catalog.text)
	IS 'drop a subscription with its progress, leases and failed commands';

-- Worker -------------------------------------------------------------------

-- Cut a tick of every stream that has commands its last tick does not see
-- (committed since, or by a transaction that was running then); returns
-- how many ticks were cut, -1 when there is no stream at all, and -2 - n
-- when n were cut and a stream was skipped because another transaction
-- was ticking it (its tick may not see a commit that this one would: the
-- worker tries again).  The background worker runs it when a commit that
-- appended to a stream wakes it (and every outbox.naptime), and notifies
-- the publishers from the same transaction; claim_batch runs it when
-- commits wait for a tick, before it claims.  C (OutboxStreamTick,
-- src/stream.c): per stream, its row locked (SKIP LOCKED), its last tick
-- read, then in one snapshot an index probe per partition and log table
-- for a row the last tick does not see (from its xmax on, or of a
-- transaction running then), and the tick written with that snapshot,
-- the partitions found recorded in streams.part_ticks.
CREATE FUNCTION @extschema@._stream_tick(unused pg_catalog.int4 DEFAULT 0)
RETURNS pg_catalog.int4
LANGUAGE c VOLATILE
AS 'MODULE_PATHNAME', 'outbox_stream_tick';
COMMENT ON FUNCTION @extschema@._stream_tick(pg_catalog.int4)
	IS 'internal: cut a tick of every stream with commands its last tick does not see (the background worker calls it at a commit''s wake-up)';

-- Admin and tests: cut the ticks now, without the worker.  C
-- (src/stream.c): the tick the worker and claim_batch cut
-- (OutboxStreamTick), run as the extension's owner.
CREATE FUNCTION @extschema@.tick_streams()
RETURNS pg_catalog.int4
LANGUAGE c VOLATILE SECURITY INVOKER
SET search_path = pg_catalog, pg_temp
AS 'MODULE_PATHNAME', 'outbox_tick_streams';
COMMENT ON FUNCTION @extschema@.tick_streams()
	IS 'cut a tick of every stream with new commands now (the background worker does it when commits wake it); returns the number of ticks cut';

-- Publisher (internal: claim_batch, ack_batch, renew_batch of src/stream.c) --

-- The commands of batch batch_id of (subscription, part): those of the
-- partition visible in snapshot sb and not in sa that are not in the
-- subscription's failures, and the retries marked with the batch, in log
-- order.
CREATE FUNCTION @extschema@._stream_batch_rows(
	sub pg_catalog.text, p_part pg_catalog.int4, p_batch pg_catalog.int8,
	p_stream pg_catalog.int4, sa pg_catalog.pg_snapshot, sb pg_catalog.pg_snapshot,
	p_deliveries pg_catalog.int4)
RETURNS TABLE (id pg_catalog.int8, command_id pg_catalog.text, run_id pg_catalog.text,
			   seq pg_catalog.int8, kind pg_catalog.text, payload pg_catalog.jsonb,
			   deliveries pg_catalog.int4, headers pg_catalog.jsonb, ordering_key pg_catalog.text)
LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
SELECT x.id, x.command_id, x.run_id, x.seq, x.kind, x.payload, x.deliveries, x.headers, x.ordering_key
  FROM (SELECT l.id, l.command_id::pg_catalog.text AS command_id, l.run_id::pg_catalog.text AS run_id,
			   l.seq, l.kind::pg_catalog.text AS kind, l.payload, _stream_batch_rows.p_deliveries AS deliveries, l.headers,
			   l.ordering_key::pg_catalog.text AS ordering_key
		  FROM @extschema@._stream_log l
		 WHERE l.stream_id OPERATOR(pg_catalog.=) _stream_batch_rows.p_stream
		   AND l.part OPERATOR(pg_catalog.=) _stream_batch_rows.p_part
		   AND l.xid OPERATOR(pg_catalog.>=) pg_catalog.pg_snapshot_xmin(_stream_batch_rows.sa)
		   AND l.xid OPERATOR(pg_catalog.<) pg_catalog.pg_snapshot_xmax(_stream_batch_rows.sb)
		   AND pg_catalog.pg_visible_in_snapshot(l.xid, _stream_batch_rows.sb)
		   AND NOT pg_catalog.pg_visible_in_snapshot(l.xid, _stream_batch_rows.sa)
		   AND NOT EXISTS (SELECT 1 FROM @extschema@.stream_failures f
							WHERE f.subscription OPERATOR(pg_catalog.=) _stream_batch_rows.sub
							  AND f.command_id OPERATOR(pg_catalog.=) l.command_id)
		UNION ALL
		SELECT f.log_id, f.command_id, f.run_id, f.seq, f.kind, f.payload, f.deliveries, f.headers,
			   f.ordering_key
		  FROM @extschema@.stream_failures f
		 WHERE f.subscription OPERATOR(pg_catalog.=) _stream_batch_rows.sub
		   AND f.part OPERATOR(pg_catalog.=) _stream_batch_rows.p_part
		   AND f.batch_id OPERATOR(pg_catalog.=) _stream_batch_rows.p_batch) x
 ORDER BY x.id
$$;

-- The snapshot of a stream's tick.
CREATE FUNCTION @extschema@._stream_snap(p_stream pg_catalog.int4, p_tick pg_catalog.int8)
RETURNS pg_catalog.pg_snapshot
LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
SELECT k.snap FROM @extschema@.stream_ticks k
 WHERE k.stream_id OPERATOR(pg_catalog.=) _stream_snap.p_stream AND k.tick OPERATOR(pg_catalog.=) _stream_snap.p_tick
$$;

-- The delivery limit of an expired batch, before claim_batch takes it over
-- (step 2 of claim_batch, src/stream_claim.c; the caller holds the progress row).  A batch
-- whose holder disappeared was delivered once more each time: a fresh
-- command as often as the batch (stream_progress.deliveries), a retry as
-- often as its own count.  When one of its commands has used up its kind's
-- max_deliveries (outbox.max_deliveries by default), the batch is not
-- delivered whole again: a poison command that crashes every relay would be
-- taken over forever, and the good commands with it would never get
-- through.  Every command of the batch goes to the subscription's failures
-- instead, and
--   * a batch of one command: it is dead (the partition moves on: its
--     progress is acked past the batch, and true is returned);
--   * a larger batch is halved: the first half (in log order) stays the
--     batch, as retries marked with it, and is taken over as usual (false
--     is returned); the second half retries at once in later batches of the
--     partition, each command waiting (behind the earlier one of its
--     ordering key) when an earlier command of its key is unfinished.
-- So a poison command is alone in a batch after about log2(batch size)
-- more takeovers and dies alone; the others are delivered.  Returns false
-- (nothing to do) when no command has used up its deliveries, or p_part is
-- NULL.
CREATE FUNCTION @extschema@._stream_takeover_cap(
	sub pg_catalog.text, p_part pg_catalog.int4, p_stream pg_catalog.int4,
	now_ts pg_catalog.timestamptz)
RETURNS pg_catalog.bool
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
	pr record;
	ids pg_catalog.text[];
	spent pg_catalog.bool;
	n pg_catalog.int4;
	keep pg_catalog.int4;
	msg pg_catalog.text;
	dflt pg_catalog.int4 := pg_catalog.current_setting('outbox.max_deliveries')::pg_catalog.int4;
BEGIN
	IF p_part IS NULL THEN
		RETURN false;
	END IF;
	SELECT p.batch_id, p.acked_tick, p.batch_to, p.deliveries, p.owner, p.batch_retries INTO pr
	  FROM @extschema@.stream_progress p
	 WHERE p.subscription OPERATOR(pg_catalog.=) sub AND p.part OPERATOR(pg_catalog.=) p_part
	   AND p.batch_to IS NOT NULL;
	IF NOT FOUND THEN
		RETURN false;
	END IF;
	-- Usually nothing is used up: without retries every command has the
	-- batch's deliveries, below every kind's limit (no read of the log).
	IF pr.batch_retries OPERATOR(pg_catalog.=) 0
	   AND pr.deliveries OPERATOR(pg_catalog.<) LEAST(dflt, (SELECT pg_catalog.min(q.max_deliveries)
															 FROM @extschema@.policies q)) THEN
		RETURN false;
	END IF;
	SELECT pg_catalog.array_agg(b.command_id ORDER BY b.id),
		   COALESCE(pg_catalog.bool_or(b.deliveries OPERATOR(pg_catalog.>=)
				COALESCE((SELECT q.max_deliveries FROM @extschema@.policies q
						   WHERE q.kind OPERATOR(pg_catalog.=) b.kind), dflt)), false)
	  INTO ids, spent
	  FROM @extschema@._stream_batch_rows(sub, p_part, pr.batch_id, p_stream,
			@extschema@._stream_snap(p_stream, pr.acked_tick),
			@extschema@._stream_snap(p_stream, pr.batch_to), pr.deliveries) b;
	IF NOT spent THEN
		RETURN false;
	END IF;
	n := pg_catalog.cardinality(ids);
	keep := (n OPERATOR(pg_catalog.+) 1) OPERATOR(pg_catalog./) 2;
	-- (the row path's text for a dead one, src/lease.c's sweep)
	msg := CASE WHEN n OPERATOR(pg_catalog.=) 1 THEN 'lease of worker %s expired after %s deliveries'
				ELSE 'lease of worker %s expired after %s deliveries; its batch of '
					 OPERATOR(pg_catalog.||) n OPERATOR(pg_catalog.||) ' commands was split' END;
	-- The batch's retries, then its fresh commands (copied from the log):
	-- the first half marked with the batch, the others due now.
	UPDATE @extschema@.stream_failures f
	   SET batch_id = CASE WHEN a.i OPERATOR(pg_catalog.<=) keep AND n OPERATOR(pg_catalog.>) 1 THEN pr.batch_id END,
		   state = CASE WHEN n OPERATOR(pg_catalog.=) 1 THEN 'dead' ELSE 'retry' END,
		   available_at = now_ts, last_error = pg_catalog.format(msg, pr.owner, f.deliveries), failed_at = now_ts
	  FROM pg_catalog.unnest(ids) WITH ORDINALITY AS a(command_id, i)
	 WHERE f.subscription OPERATOR(pg_catalog.=) sub
	   AND f.command_id OPERATOR(pg_catalog.=) a.command_id;
	INSERT INTO @extschema@.stream_failures
		(subscription, command_id, part, state, batch_id, deliveries, available_at, last_error,
		 log_id, xid, stream_id, run_id, seq, kind, payload, headers, ordering_key, decided_by, created_at)
	SELECT sub, l.command_id, p_part, CASE WHEN n OPERATOR(pg_catalog.=) 1 THEN 'dead' ELSE 'retry' END,
		   CASE WHEN a.i OPERATOR(pg_catalog.<=) keep AND n OPERATOR(pg_catalog.>) 1 THEN pr.batch_id END,
		   pr.deliveries, now_ts, pg_catalog.format(msg, pr.owner, pr.deliveries),
		   l.id, l.xid, l.stream_id, l.run_id, l.seq, l.kind, l.payload, l.headers, l.ordering_key,
		   l.decided_by, l.created_at
	  FROM pg_catalog.unnest(ids) WITH ORDINALITY AS a(command_id, i)
	  CROSS JOIN LATERAL (SELECT k.* FROM @extschema@._stream_log k
						   WHERE k.command_id OPERATOR(pg_catalog.=) a.command_id
							 AND k.stream_id OPERATOR(pg_catalog.=) p_stream
						   LIMIT 1) l
	 WHERE NOT EXISTS (SELECT 1 FROM @extschema@.stream_failures f
						WHERE f.subscription OPERATOR(pg_catalog.=) sub
						  AND f.command_id OPERATOR(pg_catalog.=) a.command_id);
	IF n OPERATOR(pg_catalog.=) 1 THEN
		-- dead: the partition moves on past the batch
		UPDATE @extschema@.stream_progress p
		   SET acked_tick = p.batch_to, batch_to = NULL, owner = NULL, role = NULL,
			   claim_nonce = NULL, lease_until = NULL, acked_at = now_ts
		 WHERE p.subscription OPERATOR(pg_catalog.=) sub AND p.part OPERATOR(pg_catalog.=) p_part;
		RETURN true;
	END IF;
	-- The second half keeps per-key order: a command with an earlier
	-- unfinished command of its key waits behind it.
	UPDATE @extschema@.stream_failures f SET state = 'waiting'
	  FROM pg_catalog.unnest(ids[keep OPERATOR(pg_catalog.+) 1:n]) AS a(command_id)
	 WHERE f.subscription OPERATOR(pg_catalog.=) sub
	   AND f.command_id OPERATOR(pg_catalog.=) a.command_id
	   AND f.ordering_key IS NOT NULL
	   AND EXISTS (SELECT 1 FROM @extschema@.stream_failures w
				    WHERE w.subscription OPERATOR(pg_catalog.=) sub
					  AND w.ordering_key OPERATOR(pg_catalog.=) f.ordering_key
					  AND w.decided_by OPERATOR(pg_catalog.=) f.decided_by
					  AND w.log_id OPERATOR(pg_catalog.<) f.log_id);
	UPDATE @extschema@.stream_progress p SET batch_rows = keep, batch_retries = keep
	 WHERE p.subscription OPERATOR(pg_catalog.=) sub AND p.part OPERATOR(pg_catalog.=) p_part;
	RETURN false;
END;
$$;

-- ack_batch's body when failed, errors or fatal is not empty, for a token
-- whose MAC and role the caller checked (an ack without failures is one
-- statement in src/stream.c): check the arrays, then mark the batch
-- published except the failed commands, which go to retry (with the kind's
-- backoff) or dead (deliveries used up, or fatal).  Returns the number
-- published, NULL when the batch is not held at this version and claim
-- nonce by worker (the caller raises OB001).
CREATE FUNCTION @extschema@._ack_batch(
	subscription pg_catalog.text, part pg_catalog.int4, batch_id pg_catalog.int8,
	version pg_catalog.int4, worker pg_catalog.text, nonce pg_catalog.int8,
	failed pg_catalog.text[], errors pg_catalog.text[], fatal pg_catalog.bool[])
RETURNS pg_catalog.int8
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
	-- (no preloaded() here: only ack_batch, in the module, calls this, and
	-- the module defines the outbox.* settings read below)
	pr record;
	nf pg_catalog.int4 := COALESCE(pg_catalog.cardinality(failed), 0);
	sid pg_catalog.int4;
	sa pg_catalog.pg_snapshot;
	sb pg_catalog.pg_snapshot;
	i pg_catalog.int4;
	found_ids pg_catalog.int4;
	now_ts pg_catalog.timestamptz := pg_catalog.clock_timestamp();
BEGIN
	IF pg_catalog.array_ndims(failed) OPERATOR(pg_catalog.>) 1
	   OR pg_catalog.array_ndims(errors) OPERATOR(pg_catalog.>) 1
	   OR pg_catalog.array_ndims(fatal) OPERATOR(pg_catalog.>) 1 THEN
		RAISE EXCEPTION 'failed, errors and fatal must be one-dimensional arrays'
			USING ERRCODE = 'array_subscript_error';
	END IF;
	IF pg_catalog.array_position(failed, NULL) IS NOT NULL THEN
		RAISE EXCEPTION 'failed must not contain nulls' USING ERRCODE = 'null_value_not_allowed';
	END IF;
	IF (errors IS NOT NULL AND COALESCE(pg_catalog.cardinality(errors), 0) OPERATOR(pg_catalog.<>) nf)
	   OR (fatal IS NOT NULL AND COALESCE(pg_catalog.cardinality(fatal), 0) OPERATOR(pg_catalog.<>) nf) THEN
		RAISE EXCEPTION 'errors and fatal must have as many elements as failed'
			USING ERRCODE = 'invalid_parameter_value',
				  DETAIL = pg_catalog.format('failed has %s, errors %s, fatal %s.', nf,
											 COALESCE(pg_catalog.cardinality(errors), 0),
											 COALESCE(pg_catalog.cardinality(fatal), 0));
	END IF;
	IF nf OPERATOR(pg_catalog.>) 0 AND
	   (SELECT pg_catalog.count(DISTINCT x) FROM pg_catalog.unnest(failed) x) OPERATOR(pg_catalog.<>) nf THEN
		RAISE EXCEPTION 'failed must not name a command twice' USING ERRCODE = 'invalid_parameter_value';
	END IF;

	-- With failures: hold the row first, then record them.
	SELECT p.acked_tick, p.batch_to, p.batch_rows, p.batch_retries, p.deliveries INTO pr
	  FROM @extschema@.stream_progress p
	 WHERE p.subscription OPERATOR(pg_catalog.=) _ack_batch.subscription
	   AND p.part OPERATOR(pg_catalog.=) _ack_batch.part
	   AND p.batch_id OPERATOR(pg_catalog.=) _ack_batch.batch_id
	   AND p.version OPERATOR(pg_catalog.=) _ack_batch.version
	   AND p.claim_nonce OPERATOR(pg_catalog.=) nonce
	   AND p.owner OPERATOR(pg_catalog.=) worker
	   AND p.batch_to IS NOT NULL
	   FOR UPDATE;
	IF NOT FOUND THEN
		RETURN NULL;
	END IF;
	SELECT t.stream_id INTO sid FROM @extschema@.subscriptions u
	  JOIN @extschema@.streams t ON t.stream OPERATOR(pg_catalog.=) u.stream
	 WHERE u.subscription OPERATOR(pg_catalog.=) _ack_batch.subscription;
	sa := @extschema@._stream_snap(sid, pr.acked_tick);
	sb := @extschema@._stream_snap(sid, pr.batch_to);
	-- One statement reads the batch's commands once: each failed command
	-- must be one of them (else nothing is written and 22023 is raised);
	-- the failed retries go back to retry or dead, the failed fresh
	-- commands enter the failures.  Their deliveries: the batch's (fresh)
	-- or their own (retries, counted by the claim).
	WITH r AS MATERIALIZED (
		SELECT b.* FROM @extschema@._stream_batch_rows(subscription, part, batch_id, sid, sa, sb, pr.deliveries) b),
	 a AS (
		SELECT x.command_id, x.ord, errors[x.ord] AS error, COALESCE(fatal[x.ord], false) AS fatal
		  FROM pg_catalog.unnest(failed) WITH ORDINALITY AS x(command_id, ord)),
	 miss AS (
		SELECT pg_catalog.min(a.ord) AS ord FROM a
		 WHERE NOT EXISTS (SELECT 1 FROM r WHERE r.command_id OPERATOR(pg_catalog.=) a.command_id)),
	 f AS (
		SELECT r.id, r.command_id, r.run_id, r.seq, r.kind, r.payload, r.deliveries, r.headers,
			   r.ordering_key, a.error, a.fatal, l.xid, l.stream_id, l.decided_by, l.created_at,
			   COALESCE((SELECT p.max_deliveries FROM @extschema@.policies p
						  WHERE p.kind OPERATOR(pg_catalog.=) r.kind),
						pg_catalog.current_setting('outbox.max_deliveries')::pg_catalog.int4) AS maxd,
			   COALESCE((SELECT p.backoff_base FROM @extschema@.policies p
						  WHERE p.kind OPERATOR(pg_catalog.=) r.kind),
						pg_catalog.current_setting('outbox.backoff_base')::pg_catalog.interval) AS bb,
			   COALESCE((SELECT p.backoff_max FROM @extschema@.policies p
						  WHERE p.kind OPERATOR(pg_catalog.=) r.kind),
						pg_catalog.current_setting('outbox.backoff_max')::pg_catalog.interval) AS bm
		  FROM r
		  JOIN a ON a.command_id OPERATOR(pg_catalog.=) r.command_id
		  LEFT JOIN LATERAL (SELECT g.xid, g.stream_id, g.decided_by, g.created_at
							   FROM @extschema@.stream_failures g
							  WHERE g.subscription OPERATOR(pg_catalog.=) _ack_batch.subscription
								AND g.command_id OPERATOR(pg_catalog.=) r.command_id
							 UNION ALL
							 SELECT k.xid, k.stream_id, k.decided_by, k.created_at
							   FROM @extschema@._stream_log k
							  WHERE k.command_id OPERATOR(pg_catalog.=) r.command_id
							  LIMIT 1) l ON true),
	 ins AS (
		INSERT INTO @extschema@.stream_failures AS x
			(subscription, command_id, part, state, batch_id, deliveries, available_at, last_error,
			 log_id, xid, stream_id, run_id, seq, kind, payload, headers, ordering_key, decided_by, created_at)
		SELECT _ack_batch.subscription, f.command_id, _ack_batch.part,
			   CASE WHEN f.fatal OR f.deliveries OPERATOR(pg_catalog.>=) f.maxd THEN 'dead' ELSE 'retry' END,
			   NULL, f.deliveries,
			   now_ts OPERATOR(pg_catalog.+) LEAST(f.bm, f.bb OPERATOR(pg_catalog.*)
					pg_catalog.power(2, LEAST(GREATEST(f.deliveries OPERATOR(pg_catalog.-) 1, 0), 30)::pg_catalog.float8)),
			   @extschema@._error_text(COALESCE(f.error, 'failed')),
			   f.id, f.xid, f.stream_id, f.run_id, f.seq, f.kind,
			   f.payload, f.headers, f.ordering_key, f.decided_by, f.created_at
		  FROM f
		 WHERE (SELECT miss.ord FROM miss) IS NULL
		ON CONFLICT ON CONSTRAINT stream_failures_pkey DO UPDATE
		   SET state = EXCLUDED.state, batch_id = NULL, available_at = EXCLUDED.available_at,
			   last_error = EXCLUDED.last_error, failed_at = now_ts
		RETURNING 1)
	SELECT (SELECT miss.ord FROM miss), (SELECT pg_catalog.count(*) FROM ins) INTO i, found_ids;
	IF i IS NOT NULL THEN
		RAISE EXCEPTION 'command "%" is not in this batch', failed[i]
			USING ERRCODE = 'invalid_parameter_value',
				  DETAIL = pg_catalog.format('Element %s of failed names a command the batch does not hold.', i);
	END IF;
	-- the retries that did not fail were published
	IF pr.batch_retries OPERATOR(pg_catalog.>) 0 THEN
		PERFORM @extschema@._stream_published_retries(subscription, part, batch_id, now_ts);
	END IF;
	UPDATE @extschema@.stream_progress p
	   SET acked_tick = p.batch_to, batch_to = NULL, owner = NULL, role = NULL,
		   claim_nonce = NULL, lease_until = NULL,
		   published = p.published OPERATOR(pg_catalog.+) (p.batch_rows OPERATOR(pg_catalog.-) nf),
		   acked_at = now_ts
	 WHERE p.subscription OPERATOR(pg_catalog.=) _ack_batch.subscription
	   AND p.part OPERATOR(pg_catalog.=) _ack_batch.part;
	RETURN pr.batch_rows OPERATOR(pg_catalog.-) nf;
END;
$$;

-- A failed command of ordering key okey (of role orole) left the failures
-- of subscription sub (published): the first command waiting behind the
-- key becomes due, unless another command of the key is still unfinished
-- (retry or dead).  Returns whether one became due.
CREATE FUNCTION @extschema@._stream_release_key(
	sub pg_catalog.text, okey pg_catalog.text, orole pg_catalog.oid, now_ts pg_catalog.timestamptz)
RETURNS pg_catalog.bool
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
	IF okey IS NULL OR EXISTS (SELECT 1 FROM @extschema@.stream_failures f
								WHERE f.subscription OPERATOR(pg_catalog.=) sub
								  AND f.ordering_key OPERATOR(pg_catalog.=) okey
								  AND f.decided_by OPERATOR(pg_catalog.=) orole
								  AND f.state OPERATOR(pg_catalog.<>) 'waiting') THEN
		RETURN false;
	END IF;
	UPDATE @extschema@.stream_failures f SET state = 'retry', available_at = now_ts
	 WHERE f.subscription OPERATOR(pg_catalog.=) sub
	   AND f.command_id OPERATOR(pg_catalog.=) (
		   SELECT w.command_id FROM @extschema@.stream_failures w
			WHERE w.subscription OPERATOR(pg_catalog.=) sub
			  AND w.ordering_key OPERATOR(pg_catalog.=) okey
			  AND w.decided_by OPERATOR(pg_catalog.=) orole
			ORDER BY w.log_id LIMIT 1);
	RETURN FOUND;
END;
$$;

-- The retries of an acked batch that did not fail were published: they
-- leave the failures, and the first command waiting behind each one's key
-- becomes due (when nothing else of the key is unfinished).
CREATE FUNCTION @extschema@._stream_published_retries(
	subscription pg_catalog.text, part pg_catalog.int4, batch_id pg_catalog.int8,
	now_ts pg_catalog.timestamptz)
RETURNS void
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
	k record;
BEGIN
	FOR k IN
		DELETE FROM @extschema@.stream_failures f
		 WHERE f.subscription OPERATOR(pg_catalog.=) _stream_published_retries.subscription
		   AND f.part OPERATOR(pg_catalog.=) _stream_published_retries.part
		   AND f.batch_id OPERATOR(pg_catalog.=) _stream_published_retries.batch_id
		RETURNING f.ordering_key, f.decided_by
	LOOP
		PERFORM @extschema@._stream_release_key(subscription, k.ordering_key, k.decided_by, now_ts);
	END LOOP;
END;
$$;

-- The publisher's calls (C, src/stream.c).

CREATE FUNCTION @extschema@.claim_batch(
	stream pg_catalog.text,
	subscription pg_catalog.text,
	worker pg_catalog.text,
	lease pg_catalog.interval DEFAULT NULL)
RETURNS SETOF @extschema@.stream_lease
LANGUAGE c VOLATILE SECURITY INVOKER
SET search_path = pg_catalog, pg_temp
ROWS 1000
AS 'MODULE_PATHNAME', 'outbox_claim_batch';
COMMENT ON FUNCTION @extschema@.claim_batch(pg_catalog.text, pg_catalog.text, pg_catalog.text, pg_catalog.interval)
	IS 'lease the next batch of one partition of a stream''s subscription (or take over an expired one) to worker; its commands in log order, each with the batch''s token';

CREATE FUNCTION @extschema@.ack_batch(
	worker pg_catalog.text,
	token pg_catalog.text,
	failed pg_catalog.text[] DEFAULT NULL,
	errors pg_catalog.text[] DEFAULT NULL,
	fatal pg_catalog.bool[] DEFAULT NULL)
RETURNS pg_catalog.int8
LANGUAGE c VOLATILE SECURITY INVOKER
SET search_path = pg_catalog, pg_temp
AS 'MODULE_PATHNAME', 'outbox_ack_batch';
COMMENT ON FUNCTION @extschema@.ack_batch(pg_catalog.text, pg_catalog.text, pg_catalog.text[], pg_catalog.text[], pg_catalog.bool[])
	IS 'mark a leased stream batch published except the failed commands (retry or dead, per their kind''s policy); returns the number published; OB001 for a token the caller does not hold';

CREATE FUNCTION @extschema@.renew_batch(
	worker pg_catalog.text,
	token pg_catalog.text,
	lease pg_catalog.interval DEFAULT NULL)
RETURNS pg_catalog.timestamptz
LANGUAGE c VOLATILE SECURITY INVOKER
SET search_path = pg_catalog, pg_temp
AS 'MODULE_PATHNAME', 'outbox_renew_batch';
COMMENT ON FUNCTION @extschema@.renew_batch(pg_catalog.text, pg_catalog.text, pg_catalog.interval)
	IS 'extend the lease of a stream batch held with its token; returns the new lease end';

-- Rotation ------------------------------------------------------------------

-- The tombstones of the stream commands the rotation removed, one row per
-- command, with the columns of outbox.purged.
CREATE VIEW @extschema@.stream_purged_commands AS
SELECT u.command_id, u.run_id, u.seq, u.kind, u.published_at, u.outcome, c.purged_at
  FROM @extschema@.stream_purged c
 CROSS JOIN LATERAL ROWS FROM (pg_catalog.unnest(c.command_ids), pg_catalog.unnest(c.run_ids),
		pg_catalog.unnest(c.seqs), pg_catalog.unnest(c.kinds), pg_catalog.unnest(c.created_ats),
		pg_catalog.unnest(c.outcomes)) AS u(command_id, run_id, seq, kind, published_at, outcome);
COMMENT ON VIEW @extschema@.stream_purged_commands
	IS 'tombstones of the stream commands removed by the rotation, one row per command (the columns of outbox.purged)';

-- The tombstone of stream command p_command of run p_run, if the rotation
-- removed it: its seq, kind and outcome (no row otherwise).  Found from its
-- event, whose created_at is its log row's, through the chunks whose range
-- of created_at holds it: one probe of events_command_id_key and a range
-- scan of stream_purged_pkey, whatever the number of tombstones.  Without
-- any stream tombstone it reads nothing else (so neither the events: on a
-- distributed outbox, which has no streams, it stays a local query).
CREATE FUNCTION @extschema@._stream_purged(p_run pg_catalog.text, p_command pg_catalog.text)
RETURNS TABLE (seq pg_catalog.int8, kind pg_catalog.text, outcome pg_catalog.text)
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
	IF NOT EXISTS (SELECT 1 FROM @extschema@.stream_purged) THEN
		RETURN;
	END IF;
	RETURN QUERY
SELECT c.seqs[x.i], c.kinds[x.i]::pg_catalog.text, c.outcomes[x.i]
  FROM @extschema@.events e
  JOIN @extschema@.stream_purged c
	ON c.last_created OPERATOR(pg_catalog.>=) e.created_at
   AND c.first_created OPERATOR(pg_catalog.<=) e.created_at
 CROSS JOIN LATERAL (SELECT pg_catalog.array_position(c.command_ids, e.command_id) AS i) x
 WHERE e.command_id OPERATOR(pg_catalog.=) _stream_purged.p_command
   AND e.run_id OPERATOR(pg_catalog.=) _stream_purged.p_run
   AND x.i IS NOT NULL
   AND c.run_ids[x.i] OPERATOR(pg_catalog.=) _stream_purged.p_run
 LIMIT 1;
END;
$$;

-- What the rotation needs to tell whether a log row is done, read once per
-- step: for each (stream, partition) that has progress rows, the number of
-- subscriptions of the stream and the snapshots of their acked ticks in
-- that partition.  A log row (of stream stream_id, partition part, written
-- by transaction xid, of kind kind) is done when it is visible in as many
-- of these snapshots as its stream has subscriptions (every subscription
-- has acked past it; the stream has one at all: the first one publishes
-- what is in it), no subscription holds it as failed (retry, dead or
-- waiting: a dead command stays, as a dead row of outbox.commands does),
-- and a kind with completers has its receipt (_stream_rotate's
-- expression).  The rotation joins its rows to this instead of looking up
-- the progress and ticks for each row: those are updated at every claim
-- and ack, and while a transaction holds the xmin horizon back each
-- lookup walks all the versions since, so that a step over one table took
-- minutes, holding the horizon back itself all the while.
CREATE FUNCTION @extschema@._stream_acked()
RETURNS TABLE (stream_id pg_catalog.int4, part pg_catalog.int4, subs pg_catalog.int8,
			   snaps pg_catalog.pg_snapshot[])
LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
SELECT t.stream_id, p.part,
	   (SELECT pg_catalog.count(*) FROM @extschema@.subscriptions w
		 WHERE w.stream OPERATOR(pg_catalog.=) t.stream),
	   pg_catalog.array_agg(k.snap) FILTER (WHERE k.snap IS NOT NULL)
  FROM @extschema@.streams t
  JOIN @extschema@.subscriptions u ON u.stream OPERATOR(pg_catalog.=) t.stream
  JOIN @extschema@.stream_progress p ON p.subscription OPERATOR(pg_catalog.=) u.subscription
  LEFT JOIN @extschema@.stream_ticks k
	ON k.stream_id OPERATOR(pg_catalog.=) t.stream_id AND k.tick OPERATOR(pg_catalog.=) p.acked_tick
 GROUP BY t.stream_id, t.stream, p.part
$$;

-- The partitions without a batch that got no commands since their acked
-- tick move on to their stream's last tick (the background worker, before
-- each rotation step, in a transaction of its own, after which it notifies
-- a publisher whose claim found nothing meanwhile: a claim skips the rows
-- this holds).
-- part_ticks and the last tick are read in one snapshot, so a partition
-- moved on had no command in any tick up to that one.  A claim never
-- waits for it: such a partition is not claimable, the lag view counts it
-- caught up, and the move keeps the ticks the partitions still need few
-- (the rotation removes the ticks older than every acked one).  Returns
-- the number of partitions moved.
CREATE FUNCTION @extschema@._stream_move_on()
RETURNS pg_catalog.int4
LANGUAGE sql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
WITH m AS (
	SELECT t.stream, t.part_ticks,
		   (SELECT pg_catalog.max(k.tick) FROM @extschema@.stream_ticks k
			 WHERE k.stream_id OPERATOR(pg_catalog.=) t.stream_id) AS t_max
	  FROM @extschema@.streams t),
 c AS (
	SELECT p.subscription, p.part, m.t_max
	  FROM @extschema@.stream_progress p
	  JOIN @extschema@.subscriptions u ON u.subscription OPERATOR(pg_catalog.=) p.subscription
	  JOIN m ON m.stream OPERATOR(pg_catalog.=) u.stream
	 WHERE p.batch_to IS NULL
	   AND p.acked_tick OPERATOR(pg_catalog.<) m.t_max
	   AND p.acked_tick OPERATOR(pg_catalog.>=)
		   COALESCE(m.part_ticks[p.part OPERATOR(pg_catalog.+) 1], 0)
	   FOR UPDATE OF p SKIP LOCKED),
 v AS (
	UPDATE @extschema@.stream_progress p SET acked_tick = c.t_max
	  FROM c
	 WHERE p.subscription OPERATOR(pg_catalog.=) c.subscription
	   AND p.part OPERATOR(pg_catalog.=) c.part
	RETURNING 1)
SELECT pg_catalog.count(*)::pg_catalog.int4 FROM v
$$;
COMMENT ON FUNCTION @extschema@._stream_move_on()
	IS 'internal: move the stream partitions with nothing after their acked tick on to the last tick (the background worker calls it before each rotation step)';

-- One step of the rotation; returns the number of commands that left the
-- log.  Three log tables take the appends in turn (stream_rotation.current).
-- The next one (which takes over at the next switch) is emptied once every
-- command in it is past its kind's retention: the commands that are done
-- (_stream_acked) leave tombstones in outbox.stream_purged, one row per
-- chunk of up to 1,000 of them, with their receipts' outcomes; the others,
-- stragglers, are copied to
-- stream_kept, so that one slow subscription or a missing receipt never
-- pins a table; then, under ACCESS EXCLUSIVE locks on the table and its
-- receipts (stream_receipts_N) waited for at most
-- 100 ms (a producer, claim or complete() holding the table makes the step
-- try again later, and every change of the step is rolled back), the table
-- and its receipts are checked to hold only the rows seen (a transaction
-- that appended or completed late makes the step try again), the kept
-- commands' receipts are copied to outbox.receipts, and both tables are
-- truncated together: no receipt of a stream command in a log table is
-- deleted row by row.  The producers (src/producer.c, the stream writer as
-- the statement) lock all three tables before they read which one is
-- current, so once the lock is held no producer can still
-- append to the table from before the switch that retired it.  The switch
-- to the next table comes once the current one has taken the appends for
-- outbox.stream_rotation and the next is empty.  Kept rows that became done
-- and are past retention leave the same way, outbox.purge_batch at a time.
CREATE FUNCTION @extschema@._stream_rotate(unused pg_catalog.int4 DEFAULT 0)
RETURNS pg_catalog.int4
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
	loaded pg_catalog.bool := @extschema@.preloaded();
	cur pg_catalog.int4;
	sw pg_catalog.timestamptz;
	nxt pg_catalog.int4;
	nm pg_catalog.text;
	rn pg_catalog.text;
	dflt pg_catalog.interval := pg_catalog.current_setting('outbox.retention')::pg_catalog.interval;
	every pg_catalog.interval := pg_catalog.current_setting('outbox.stream_rotation')::pg_catalog.interval;
	lim pg_catalog.int4 := pg_catalog.current_setting('outbox.purge_batch')::pg_catalog.int4;
	busy pg_catalog.bool;
	young pg_catalog.bool;
	kept pg_catalog.int8;
	gone pg_catalog.int8;
	receipted pg_catalog.int8;
	total pg_catalog.int8;
	n pg_catalog.int4 := 0;
	saved_timeout pg_catalog.text := pg_catalog.current_setting('lock_timeout');
BEGIN
	-- The step counts a table again once it holds its lock, and only a
	-- snapshot taken after the lock sees every row appended before it: in
	-- a transaction that reads one snapshot, a row committed in between by
	-- a producer would be truncated uncounted.
	IF pg_catalog.current_setting('transaction_isolation') OPERATOR(pg_catalog.<>) 'read committed' THEN
		RAISE EXCEPTION 'the stream rotation must run in a READ COMMITTED transaction'
			USING ERRCODE = 'invalid_transaction_state',
				  DETAIL = pg_catalog.format('The transaction is %s.', pg_catalog.current_setting('transaction_isolation'));
	END IF;
	SELECT r.current, r.switched_at INTO cur, sw FROM @extschema@.stream_rotation r FOR UPDATE SKIP LOCKED;
	IF NOT FOUND THEN
		RETURN 0;
	END IF;

	-- The kept rows that are done and past retention.
	WITH a AS MATERIALIZED (SELECT * FROM @extschema@._stream_acked()),
	 v AS (
		SELECT l.stream_id, l.command_id, l.run_id, l.seq, l.kind, l.created_at
		  FROM @extschema@.stream_kept l
		  LEFT JOIN a ON a.stream_id OPERATOR(pg_catalog.=) l.stream_id AND a.part OPERATOR(pg_catalog.=) l.part
		  LEFT JOIN @extschema@.receipts r
			ON r.command_id OPERATOR(pg_catalog.=) l.command_id AND r.run_id OPERATOR(pg_catalog.=) l.run_id
		 WHERE l.created_at OPERATOR(pg_catalog.<) (pg_catalog.now() OPERATOR(pg_catalog.-)
				COALESCE((SELECT p.retention FROM @extschema@.policies p
						   WHERE p.kind OPERATOR(pg_catalog.=) l.kind), dflt))
		   AND COALESCE(a.subs OPERATOR(pg_catalog.=) (SELECT pg_catalog.count(*) FROM pg_catalog.unnest(a.snaps) AS s(snap)
							 WHERE pg_catalog.pg_visible_in_snapshot(l.xid, s.snap)), false)
		   AND NOT l.command_id OPERATOR(pg_catalog.=) ANY (SELECT f.command_id FROM @extschema@.stream_failures f)
		   AND (NOT l.kind OPERATOR(pg_catalog.=) ANY (SELECT q.kind FROM @extschema@.policies q
													 WHERE q.completers IS NOT NULL)
				OR r.command_id IS NOT NULL)
		 LIMIT lim
		   FOR UPDATE OF l SKIP LOCKED),
	 t AS (
		INSERT INTO @extschema@.stream_purged
			(first_created, last_created, first_command, stream_id, commands, command_ids, run_ids,
			 seqs, kinds, created_ats, outcomes)
		SELECT pg_catalog.min(g.created_at), pg_catalog.max(g.created_at),
			   (pg_catalog.array_agg(g.command_id ORDER BY g.created_at, g.command_id))[1],
			   g.stream_id, pg_catalog.count(*),
			   pg_catalog.array_agg(g.command_id ORDER BY g.created_at, g.command_id),
			   pg_catalog.array_agg(g.run_id ORDER BY g.created_at, g.command_id),
			   pg_catalog.array_agg(g.seq ORDER BY g.created_at, g.command_id),
			   pg_catalog.array_agg(g.kind ORDER BY g.created_at, g.command_id),
			   pg_catalog.array_agg(g.created_at ORDER BY g.created_at, g.command_id),
			   pg_catalog.array_agg(g.outcome ORDER BY g.created_at, g.command_id)
		  FROM (SELECT v.*, COALESCE(r.outcome, 'published') AS outcome,
					   (pg_catalog.row_number() OVER (PARTITION BY v.stream_id ORDER BY v.created_at, v.command_id)
						OPERATOR(pg_catalog.-) 1) OPERATOR(pg_catalog./) 1000 AS chunk
				  FROM v LEFT JOIN @extschema@.receipts r
					ON r.command_id OPERATOR(pg_catalog.=) v.command_id AND r.run_id OPERATOR(pg_catalog.=) v.run_id) g
		 GROUP BY g.stream_id, g.chunk),
	 d AS (
		DELETE FROM @extschema@.receipts r USING v
		 WHERE r.command_id OPERATOR(pg_catalog.=) v.command_id AND r.run_id OPERATOR(pg_catalog.=) v.run_id)
	DELETE FROM @extschema@.stream_kept l USING v
	 WHERE l.command_id OPERATOR(pg_catalog.=) v.command_id;
	GET DIAGNOSTICS gone = ROW_COUNT;
	n := n OPERATOR(pg_catalog.+) gone::pg_catalog.int4;

	-- Empty the next table.
	nxt := (cur OPERATOR(pg_catalog.+) 1) OPERATOR(pg_catalog.%) 3;
	nm := pg_catalog.format('@extschema@.%I', 'stream_log_' OPERATOR(pg_catalog.||) nxt);
	rn := pg_catalog.format('@extschema@.%I', 'stream_receipts_' OPERATOR(pg_catalog.||) nxt);
	EXECUTE pg_catalog.format('SELECT EXISTS (SELECT 1 FROM %s)', nm) INTO busy;
	IF busy THEN
		EXECUTE pg_catalog.format(
			'SELECT EXISTS (SELECT 1 FROM %s l'
			'  WHERE l.created_at OPERATOR(pg_catalog.>=) (pg_catalog.now() OPERATOR(pg_catalog.-)'
			'        COALESCE((SELECT p.retention FROM @extschema@.policies p'
			'                   WHERE p.kind OPERATOR(pg_catalog.=) l.kind), $1)))', nm)
			USING dflt INTO young;
		IF young THEN
			RETURN n;
		END IF;
		BEGIN
			EXECUTE pg_catalog.format(
				'WITH a AS MATERIALIZED (SELECT * FROM @extschema@._stream_acked()),'
				' x AS MATERIALIZED ('
				'  SELECT l.*, COALESCE(a.subs OPERATOR(pg_catalog.=) (SELECT pg_catalog.count(*)'
				'           FROM pg_catalog.unnest(a.snaps) AS s(snap)'
				'          WHERE pg_catalog.pg_visible_in_snapshot(l.xid, s.snap)), false)'
				'         AND NOT l.command_id OPERATOR(pg_catalog.=) ANY (SELECT f.command_id FROM @extschema@.stream_failures f)'
				'         AND (NOT l.kind OPERATOR(pg_catalog.=) ANY (SELECT q.kind FROM @extschema@.policies q'
				'                                                  WHERE q.completers IS NOT NULL)'
				'              OR r.command_id IS NOT NULL) AS done,'
				'         r.outcome AS receipt_outcome'
				'    FROM %1$s l'
				'    LEFT JOIN a ON a.stream_id OPERATOR(pg_catalog.=) l.stream_id AND a.part OPERATOR(pg_catalog.=) l.part'
				'    LEFT JOIN %2$s r'
				'      ON r.command_id OPERATOR(pg_catalog.=) l.command_id AND r.run_id OPERATOR(pg_catalog.=) l.run_id),'
				' k AS ('
				'  INSERT INTO @extschema@.stream_kept (id, xid, stream_id, part, command_id, run_id, seq, kind,'
				'         payload, headers, ordering_key, decided_by, created_at)'
				'  SELECT x.id, x.xid, x.stream_id, x.part, x.command_id, x.run_id, x.seq, x.kind,'
				'         x.payload, x.headers, x.ordering_key, x.decided_by, x.created_at'
				'    FROM x WHERE NOT x.done RETURNING 1),'
				' t AS ('
				'  INSERT INTO @extschema@.stream_purged'
				'         (first_created, last_created, first_command, stream_id, commands, command_ids, run_ids,'
				'          seqs, kinds, created_ats, outcomes)'
				'  SELECT pg_catalog.min(g.created_at), pg_catalog.max(g.created_at),'
				'         (pg_catalog.array_agg(g.command_id ORDER BY g.created_at, g.command_id))[1],'
				'         g.stream_id, pg_catalog.count(*),'
				'         pg_catalog.array_agg(g.command_id ORDER BY g.created_at, g.command_id),'
				'         pg_catalog.array_agg(g.run_id ORDER BY g.created_at, g.command_id),'
				'         pg_catalog.array_agg(g.seq ORDER BY g.created_at, g.command_id),'
				'         pg_catalog.array_agg(g.kind ORDER BY g.created_at, g.command_id),'
				'         pg_catalog.array_agg(g.created_at ORDER BY g.created_at, g.command_id),'
				'         pg_catalog.array_agg(g.outcome ORDER BY g.created_at, g.command_id)'
				'    FROM (SELECT x.stream_id, x.command_id, x.run_id, x.seq, x.kind, x.created_at,'
				'                 COALESCE(x.receipt_outcome, ''published'') AS outcome,'
				'                 (pg_catalog.row_number() OVER (PARTITION BY x.stream_id ORDER BY x.created_at, x.command_id)'
				'                  OPERATOR(pg_catalog.-) 1) OPERATOR(pg_catalog./) 1000 AS chunk'
				'            FROM x WHERE x.done) g'
				'   GROUP BY g.stream_id, g.chunk)'
				'SELECT (SELECT pg_catalog.count(*) FROM k), (SELECT pg_catalog.count(*) FROM x WHERE x.done),'
				'       (SELECT pg_catalog.count(*) FROM x WHERE x.receipt_outcome IS NOT NULL)', nm, rn)
				INTO kept, gone, receipted;
			PERFORM pg_catalog.set_config('lock_timeout', '100ms', true);
			EXECUTE pg_catalog.format('LOCK TABLE %s, %s IN ACCESS EXCLUSIVE MODE', nm, rn);
			PERFORM pg_catalog.set_config('lock_timeout', saved_timeout, true);
			EXECUTE pg_catalog.format('SELECT pg_catalog.count(*) FROM %s', nm) INTO total;
			IF total OPERATOR(pg_catalog.<>) (kept OPERATOR(pg_catalog.+) gone) THEN
				RAISE EXCEPTION 'a late append' USING ERRCODE = 'lock_not_available';
			END IF;
			-- every receipt of the table is one of a row seen above (complete()
			-- writes one only next to its command), so the same count is the
			-- same receipts: a late one makes the step try again
			EXECUTE pg_catalog.format('SELECT pg_catalog.count(*) FROM %s', rn) INTO total;
			IF total OPERATOR(pg_catalog.<>) receipted THEN
				RAISE EXCEPTION 'a late receipt' USING ERRCODE = 'lock_not_available';
			END IF;
			-- the kept commands take their receipts along
			EXECUTE pg_catalog.format(
				'INSERT INTO @extschema@.receipts (command_id, outcome, detail, completed_at, run_id)'
				' SELECT r.command_id, r.outcome, r.detail, r.completed_at, r.run_id FROM %s r'
				'  WHERE EXISTS (SELECT 1 FROM @extschema@.stream_kept k'
				'                 WHERE k.command_id OPERATOR(pg_catalog.=) r.command_id'
				'                   AND k.run_id OPERATOR(pg_catalog.=) r.run_id)', rn);
			EXECUTE pg_catalog.format('TRUNCATE %s, %s', nm, rn);
			n := n OPERATOR(pg_catalog.+) gone::pg_catalog.int4;
		EXCEPTION WHEN lock_not_available THEN
			-- (the block's changes are rolled back) try again at the next step
			PERFORM pg_catalog.set_config('lock_timeout', saved_timeout, true);
			RETURN n;
		END;
	END IF;

	-- Switch when the current table has had its time.
	EXECUTE pg_catalog.format('SELECT EXISTS (SELECT 1 FROM %s)',
		pg_catalog.format('@extschema@.%I', 'stream_log_' OPERATOR(pg_catalog.||) cur)) INTO busy;
	IF busy AND (pg_catalog.clock_timestamp() OPERATOR(pg_catalog.-) sw) OPERATOR(pg_catalog.>=) every THEN
		UPDATE @extschema@.stream_rotation SET current = nxt, switched_at = pg_catalog.clock_timestamp();
	END IF;
	-- the ticks no subscription needs any more (older than every acked tick)
	DELETE FROM @extschema@.stream_ticks k
	 WHERE k.tick OPERATOR(pg_catalog.<) (
			SELECT pg_catalog.min(LEAST(p.acked_tick, COALESCE(p.batch_to, p.acked_tick)))
			  FROM @extschema@.stream_progress p
			  JOIN @extschema@.subscriptions u ON u.subscription OPERATOR(pg_catalog.=) p.subscription
			  JOIN @extschema@.streams t ON t.stream OPERATOR(pg_catalog.=) u.stream
			 WHERE t.stream_id OPERATOR(pg_catalog.=) k.stream_id)
	   AND k.tick OPERATOR(pg_catalog.<) (SELECT pg_catalog.max(m.tick) FROM @extschema@.stream_ticks m
										   WHERE m.stream_id OPERATOR(pg_catalog.=) k.stream_id);
	RETURN n;
END;
$$;
COMMENT ON FUNCTION @extschema@._stream_rotate(pg_catalog.int4)
	IS 'internal: one step of the stream log''s rotation (the background worker calls it every outbox.naptime)';

-- Admin and tests: one step of the rotation now.
CREATE FUNCTION @extschema@.rotate_streams()
RETURNS pg_catalog.int4
LANGUAGE sql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$ SELECT @extschema@._stream_rotate(0) $$;
COMMENT ON FUNCTION @extschema@.rotate_streams()
	IS 'one step of the stream log''s rotation now (the background worker runs it every outbox.naptime); returns the number of commands that left the log';

-- Views for the DBA ---------------------------------------------------------

-- Per subscription and partition: how far it has acked, how far behind the
-- stream's last tick that is (ticks, and the log ids between the two ticks:
-- the commands of the whole stream decided in between, an estimate of the
-- backlog that reads no log row), how long the oldest tick not acked has
-- waited, and how many commands it published.  A partition without a batch
-- and without commands after its acked tick (part_ticks) is caught up: it
-- shows the last tick, as after the worker's move on (_stream_move_on).
CREATE VIEW @extschema@.stream_lag AS
SELECT u.stream::pg_catalog.text AS stream, p.subscription::pg_catalog.text AS subscription, p.part,
	   e.acked_tick, lt.tick OPERATOR(pg_catalog.-) e.acked_tick AS ticks_behind,
	   GREATEST(lt.last_id OPERATOR(pg_catalog.-) at.last_id, 0) AS ids_behind,
	   CASE WHEN lt.tick OPERATOR(pg_catalog.>) e.acked_tick
			THEN pg_catalog.now() OPERATOR(pg_catalog.-) nt.made_at END AS lag,
	   p.batch_to IS NOT NULL AS batch_open, p.published, p.acked_at
  FROM @extschema@.stream_progress p
  JOIN @extschema@.subscriptions u ON u.subscription OPERATOR(pg_catalog.=) p.subscription
  JOIN @extschema@.streams t ON t.stream OPERATOR(pg_catalog.=) u.stream
  LEFT JOIN LATERAL (SELECT k.tick, k.last_id FROM @extschema@.stream_ticks k
					  WHERE k.stream_id OPERATOR(pg_catalog.=) t.stream_id
					  ORDER BY k.tick DESC LIMIT 1) lt ON true
  CROSS JOIN LATERAL (SELECT CASE WHEN p.batch_to IS NULL
									AND p.acked_tick OPERATOR(pg_catalog.>=)
										COALESCE(t.part_ticks[p.part OPERATOR(pg_catalog.+) 1], 0)
							   THEN GREATEST(p.acked_tick, lt.tick)
							   ELSE p.acked_tick END AS acked_tick) e
  LEFT JOIN @extschema@.stream_ticks at
	ON at.stream_id OPERATOR(pg_catalog.=) t.stream_id AND at.tick OPERATOR(pg_catalog.=) e.acked_tick
  LEFT JOIN @extschema@.stream_ticks nt
	ON nt.stream_id OPERATOR(pg_catalog.=) t.stream_id
   AND nt.tick OPERATOR(pg_catalog.=) (e.acked_tick OPERATOR(pg_catalog.+) 1);
COMMENT ON VIEW @extschema@.stream_lag
	IS 'per stream subscription and partition: acked tick, ticks and log ids behind the last tick, age of the oldest tick not acked, commands published';

-- The open batches: holder, version, deliveries, size, lease end.
CREATE VIEW @extschema@.stream_batches AS
SELECT u.stream::pg_catalog.text AS stream, p.subscription::pg_catalog.text AS subscription, p.part,
	   p.batch_id, p.acked_tick AS from_tick, p.batch_to AS to_tick, p.owner AS holder,
	   p.version, p.deliveries, p.batch_rows AS commands, p.batch_retries AS retries,
	   p.lease_until, p.lease_until OPERATOR(pg_catalog.<=) pg_catalog.now() AS expired,
	   p.lease_until OPERATOR(pg_catalog.-) pg_catalog.now() AS time_left
  FROM @extschema@.stream_progress p
  JOIN @extschema@.subscriptions u ON u.subscription OPERATOR(pg_catalog.=) p.subscription
 WHERE p.batch_to IS NOT NULL;
COMMENT ON VIEW @extschema@.stream_batches
	IS 'open stream batches: holder, version (takeovers + 1), deliveries, number of commands and retries, lease end';

-- The failed stream commands of each subscription: retry (with when),
-- dead, or waiting behind an earlier failed command of their key.
CREATE VIEW @extschema@.stream_failed AS
SELECT f.subscription::pg_catalog.text AS subscription, f.command_id::pg_catalog.text AS command_id,
	   f.run_id::pg_catalog.text AS run_id, f.seq, f.kind::pg_catalog.text AS kind, f.part, f.state AS status,
	   f.deliveries, f.available_at, f.batch_id IS NOT NULL AS in_batch,
	   f.ordering_key::pg_catalog.text AS ordering_key, f.last_error, f.failed_at, f.created_at
  FROM @extschema@.stream_failures f;
COMMENT ON VIEW @extschema@.stream_failed
	IS 'stream commands that failed in a subscription: retry (due at available_at), dead, or waiting behind their ordering key';

-- Privileges (part 90 holds the model).
REVOKE ALL ON @extschema@._stream_log, @extschema@._stream_receipts, @extschema@.stream_lag, @extschema@.stream_batches,
	@extschema@.stream_failed, @extschema@.stream_purged_commands FROM PUBLIC;
REVOKE ALL ON SEQUENCE @extschema@.stream_log_id_seq FROM PUBLIC;
REVOKE ALL ON TYPE @extschema@.stream_lease FROM PUBLIC;
REVOKE ALL ON FUNCTION
	@extschema@.create_stream(pg_catalog.text, pg_catalog.int4, pg_catalog.int4),
	@extschema@.create_subscription(pg_catalog.text, pg_catalog.text, pg_catalog.regrole[]),
	@extschema@.drop_subscription(pg_catalog.text),
	@extschema@.tick_streams(),
	@extschema@._stream_tick(pg_catalog.int4),
	@extschema@.rotate_streams(),
	@extschema@._stream_rotate(pg_catalog.int4),
	@extschema@._stream_move_on(),
	@extschema@._stream_purged(pg_catalog.text, pg_catalog.text),
	@extschema@._stream_acked(),
	@extschema@._stream_batch_rows(pg_catalog.text, pg_catalog.int4, pg_catalog.int8, pg_catalog.int4, pg_catalog.pg_snapshot, pg_catalog.pg_snapshot, pg_catalog.int4),
	@extschema@._stream_snap(pg_catalog.int4, pg_catalog.int8),
	@extschema@._stream_snapshot(pg_catalog.pg_snapshot),
	@extschema@._ack_batch(pg_catalog.text, pg_catalog.int4, pg_catalog.int8, pg_catalog.int4, pg_catalog.text, pg_catalog.int8, pg_catalog.text[], pg_catalog.text[], pg_catalog.bool[]),
	@extschema@._stream_published_retries(pg_catalog.text, pg_catalog.int4, pg_catalog.int8, pg_catalog.timestamptz),
	@extschema@.claim_batch(pg_catalog.text, pg_catalog.text, pg_catalog.text, pg_catalog.interval),
	@extschema@.ack_batch(pg_catalog.text, pg_catalog.text, pg_catalog.text[], pg_catalog.text[], pg_catalog.bool[]),
	@extschema@.renew_batch(pg_catalog.text, pg_catalog.text, pg_catalog.interval)
	FROM PUBLIC;

DO $$
DECLARE
	publisher CONSTANT pg_catalog.text := pg_catalog.quote_ident(@extschema@.role('publisher'));
	admin CONSTANT pg_catalog.text := pg_catalog.quote_ident(@extschema@.role('admin'));
BEGIN
	EXECUTE 'GRANT EXECUTE ON FUNCTION
	@extschema@.claim_batch(pg_catalog.text, pg_catalog.text, pg_catalog.text, pg_catalog.interval),
	@extschema@.ack_batch(pg_catalog.text, pg_catalog.text, pg_catalog.text[], pg_catalog.text[], pg_catalog.bool[]),
	@extschema@.renew_batch(pg_catalog.text, pg_catalog.text, pg_catalog.interval)
	TO ' OPERATOR(pg_catalog.||) publisher;
	EXECUTE 'GRANT USAGE ON TYPE @extschema@.stream_lease TO ' OPERATOR(pg_catalog.||) publisher;
	EXECUTE 'GRANT EXECUTE ON FUNCTION
	@extschema@.create_stream(pg_catalog.text, pg_catalog.int4, pg_catalog.int4),
	@extschema@.create_subscription(pg_catalog.text, pg_catalog.text, pg_catalog.regrole[]),
	@extschema@.drop_subscription(pg_catalog.text),
	@extschema@.tick_streams(),
	@extschema@.rotate_streams()
	TO ' OPERATOR(pg_catalog.||) admin;
	EXECUTE 'GRANT SELECT ON @extschema@.stream_lag, @extschema@.stream_batches, @extschema@.stream_failed,
	@extschema@.stream_purged_commands
	TO pg_monitor, ' OPERATOR(pg_catalog.||) admin;
END;
$$;
