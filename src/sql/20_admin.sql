-- outbox install script, part 20: the administrator API.  These run rarely,
-- so they are PL/pgSQL; they are SECURITY DEFINER with a pinned search_path
-- (the C API gets the same rights from OutboxCallAsOwner, see part 10) and
-- qualify every object they use.

-- Raise 22004 when a required argument is NULL.
CREATE FUNCTION @extschema@._require(value pg_catalog.anyelement, name pg_catalog.text)
RETURNS void
LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
	IF value IS NULL THEN
		RAISE EXCEPTION '% must not be null', name USING ERRCODE = 'null_value_not_allowed';
	END IF;
END;
$$;

-- Check an identifier argument: not NULL, not empty, at most
-- OUTBOX_MAX_ID_LEN bytes (src/outbox.h; the Makefile fills it in).
CREATE FUNCTION @extschema@._require_id(value pg_catalog.text, name pg_catalog.text)
RETURNS void
LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
	IF value IS NULL THEN
		RAISE EXCEPTION '% must not be null', name USING ERRCODE = 'null_value_not_allowed';
	ELSIF value OPERATOR(pg_catalog.=) '' THEN
		RAISE EXCEPTION '% must not be empty', name USING ERRCODE = 'invalid_parameter_value';
	ELSIF pg_catalog.octet_length(value) OPERATOR(pg_catalog.>) @OUTBOX_MAX_ID_LEN@ THEN
		RAISE EXCEPTION '% is too long', name USING ERRCODE = 'invalid_parameter_value',
			DETAIL = pg_catalog.format('The value is %s bytes long; the limit is @OUTBOX_MAX_ID_LEN@ bytes.',
									   pg_catalog.octet_length(value));
	END IF;
END;
$$;

-- Return when the command is stored under run_id; else raise 55000 for one
-- that was purged (it was published and completed), OB002 for one that is
-- unknown.
CREATE FUNCTION @extschema@._require_command(run_id pg_catalog.text, command_id pg_catalog.text)
RETURNS void
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
	IF EXISTS (SELECT 1 FROM @extschema@.commands c
				WHERE c.command_id OPERATOR(pg_catalog.=) _require_command.command_id
				  AND c.run_id OPERATOR(pg_catalog.=) _require_command.run_id) THEN
		RETURN;
	END IF;
	IF EXISTS (SELECT 1 FROM @extschema@.purged p
				WHERE p.command_id OPERATOR(pg_catalog.=) _require_command.command_id
				  AND p.run_id OPERATOR(pg_catalog.=) _require_command.run_id) THEN
		RAISE EXCEPTION 'command "%" was purged', command_id
			USING ERRCODE = 'object_not_in_prerequisite_state',
				  DETAIL = 'It was published and completed, and the retention purge removed it.';
	END IF;
	RAISE EXCEPTION 'unknown_command: command "%" of run "%" does not exist', command_id, run_id
		USING ERRCODE = 'OB002',
			  DETAIL = 'No command of that run has this id, and none was purged.';
END;
$$;

CREATE FUNCTION @extschema@.requeue(run_id pg_catalog.text, command_id pg_catalog.text)
RETURNS void
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
	st pg_catalog.text;
	-- One reading of the clock: available_at and due_at must be equal.
	now_ts pg_catalog.timestamptz := pg_catalog.clock_timestamp();
BEGIN
	PERFORM @extschema@._require_id(run_id, 'run_id');
	PERFORM @extschema@._require_id(command_id, 'command_id');
	SELECT c.status INTO st FROM @extschema@.commands c
	 WHERE c.command_id OPERATOR(pg_catalog.=) requeue.command_id
	   AND c.run_id OPERATOR(pg_catalog.=) requeue.run_id FOR NO KEY UPDATE;
	IF NOT FOUND THEN
		PERFORM @extschema@._require_command(run_id, command_id);
	END IF;
	IF st OPERATOR(pg_catalog.<>) ALL (ARRAY['dead', 'uncertain']) THEN
		RAISE EXCEPTION 'command "%" is %, not dead or uncertain', command_id, st
			USING ERRCODE = 'object_not_in_prerequisite_state',
				  HINT = 'Only dead and uncertain commands can be requeued.';
	END IF;
	UPDATE @extschema@.commands c
	   SET status = 'pending', owner = NULL, lease_until = NULL,
		   available_at = now_ts,
		   due_at = now_ts,
		   version = c.version OPERATOR(pg_catalog.+) 1
	 WHERE c.command_id OPERATOR(pg_catalog.=) requeue.command_id;
	-- Claimable now: the commit wakes the worker, which notifies publishers.
	PERFORM @extschema@._wake_at_commit();
END;
$$;
COMMENT ON FUNCTION @extschema@.requeue(pg_catalog.text, pg_catalog.text)
	IS 'bring a dead or uncertain command back to pending (one more delivery attempt)';

CREATE FUNCTION @extschema@.resolve(run_id pg_catalog.text, command_id pg_catalog.text, resolution pg_catalog.text)
RETURNS void
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
	st pg_catalog.text;
	okey pg_catalog.text;
	oseq pg_catalog.int8;
	orole pg_catalog.oid;
	-- One reading of the clock: a retried command's available_at and due_at
	-- must be equal.
	now_ts pg_catalog.timestamptz := pg_catalog.clock_timestamp();
BEGIN
	PERFORM @extschema@._require_id(run_id, 'run_id');
	PERFORM @extschema@._require_id(command_id, 'command_id');
	PERFORM @extschema@._require(resolution, 'resolution');
	IF resolution OPERATOR(pg_catalog.<>) ALL (ARRAY['published', 'retry', 'dead']) THEN
		RAISE EXCEPTION 'resolution must be published, retry or dead'
			USING ERRCODE = 'invalid_parameter_value',
				  DETAIL = pg_catalog.format('The value was "%s".', resolution);
	END IF;
	SELECT c.status, c.ordering_key, c.ordering_seq, c.decided_by INTO st, okey, oseq, orole FROM @extschema@.commands c
	 WHERE c.command_id OPERATOR(pg_catalog.=) resolve.command_id
	   AND c.run_id OPERATOR(pg_catalog.=) resolve.run_id FOR NO KEY UPDATE;
	IF NOT FOUND THEN
		PERFORM @extschema@._require_command(run_id, command_id);
	END IF;
	IF st OPERATOR(pg_catalog.<>) 'uncertain' THEN
		RAISE EXCEPTION 'command "%" is %, not uncertain', command_id, st
			USING ERRCODE = 'object_not_in_prerequisite_state',
				  HINT = 'Only uncertain commands are resolved; use requeue for dead ones.';
	END IF;
	UPDATE @extschema@.commands c
	   SET status = CASE WHEN resolution OPERATOR(pg_catalog.=) 'retry' THEN 'pending' ELSE resolution END,
		   published_at = CASE WHEN resolution OPERATOR(pg_catalog.=) 'published'
							   THEN now_ts END,
		   owner = CASE WHEN resolution OPERATOR(pg_catalog.=) 'retry' THEN NULL ELSE c.owner END,
		   lease_until = NULL,
		   available_at = CASE WHEN resolution OPERATOR(pg_catalog.=) 'retry'
							   THEN now_ts ELSE c.available_at END,
		   due_at = CASE WHEN resolution OPERATOR(pg_catalog.=) 'retry'
						 THEN now_ts END,
		   last_error = CASE WHEN resolution OPERATOR(pg_catalog.=) 'dead'
							 THEN pg_catalog.concat_ws('; ', c.last_error, 'resolved as dead')
							 ELSE c.last_error END,
		   version = c.version OPERATOR(pg_catalog.+) 1
	 WHERE c.command_id OPERATOR(pg_catalog.=) resolve.command_id;
	-- A published head of an ordering key releases the next command (and
	-- the commit wakes the worker); a retry is claimable now, likewise.
	IF resolution OPERATOR(pg_catalog.=) 'published' AND okey IS NOT NULL THEN
		PERFORM @extschema@._release_key(okey, oseq, orole);
	ELSIF resolution OPERATOR(pg_catalog.=) 'retry' THEN
		PERFORM @extschema@._wake_at_commit();
	END IF;
END;
$$;
COMMENT ON FUNCTION @extschema@.resolve(pg_catalog.text, pg_catalog.text, pg_catalog.text)
	IS 'settle an uncertain command: published (it was sent), retry (send again) or dead';

CREATE FUNCTION @extschema@.set_policy(
	kind pg_catalog.text,
	max_deliveries pg_catalog.int4 DEFAULT NULL,
	backoff_base pg_catalog.interval DEFAULT NULL,
	backoff_max pg_catalog.interval DEFAULT NULL,
	lease pg_catalog.interval DEFAULT NULL,
	takeover pg_catalog.text DEFAULT NULL,
	retention pg_catalog.interval DEFAULT NULL,
	deciders pg_catalog.regrole[] DEFAULT NULL,
	claimers pg_catalog.regrole[] DEFAULT NULL,
	completers pg_catalog.regrole[] DEFAULT NULL,
	ordered_by_run pg_catalog.bool DEFAULT NULL,
	stream pg_catalog.text DEFAULT NULL)
RETURNS void
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
	-- Calling into the module first defines the outbox.* settings read below.
	loaded pg_catalog.bool := @extschema@.preloaded();
	-- The bounds are compared on the times they lead to, as claim does:
	-- an interval's months and days have no fixed length, so comparing
	-- intervals ('1000 mons -29999 days' < '1 day') would count a month as
	-- 30 days.
	t0 pg_catalog.timestamptz := pg_catalog.now();
	t_base pg_catalog.timestamptz;
	t_max pg_catalog.timestamptz;
	t_lease pg_catalog.timestamptz;
	t_ret pg_catalog.timestamptz;
	t_cap pg_catalog.timestamptz;
	t_century pg_catalog.timestamptz;
BEGIN
	PERFORM @extschema@._require_id(kind, 'kind');
	BEGIN
		t_base := t0 OPERATOR(pg_catalog.+) backoff_base;
		t_max := t0 OPERATOR(pg_catalog.+) backoff_max;
		t_lease := t0 OPERATOR(pg_catalog.+) lease;
		t_ret := t0 OPERATOR(pg_catalog.+) retention;
		t_cap := t0 OPERATOR(pg_catalog.+) pg_catalog.current_setting('outbox.max_lease')::pg_catalog.interval;
		t_century := t0 OPERATOR(pg_catalog.+) '100 years'::pg_catalog.interval;
	EXCEPTION WHEN datetime_field_overflow THEN
		RAISE EXCEPTION 'backoff, lease and retention must not be longer than 100 years'
			USING ERRCODE = 'invalid_parameter_value';
	END;
	IF max_deliveries OPERATOR(pg_catalog.<) 1 THEN
		RAISE EXCEPTION 'max_deliveries must be at least 1'
			USING ERRCODE = 'invalid_parameter_value';
	END IF;
	IF t_base OPERATOR(pg_catalog.<) t0
	   OR t_max OPERATOR(pg_catalog.<) t0
	   OR t_ret OPERATOR(pg_catalog.<) t0 THEN
		RAISE EXCEPTION 'backoff and retention must not be negative'
			USING ERRCODE = 'invalid_parameter_value';
	END IF;
	-- Longer ones mean "never" anyway, and would overflow the time arithmetic.
	IF t_base OPERATOR(pg_catalog.>) t_century
	   OR t_max OPERATOR(pg_catalog.>) t_century
	   OR t_ret OPERATOR(pg_catalog.>) t_century THEN
		RAISE EXCEPTION 'backoff and retention must not be longer than 100 years'
			USING ERRCODE = 'invalid_parameter_value';
	END IF;
	IF t_lease OPERATOR(pg_catalog.<=) t0 THEN
		RAISE EXCEPTION 'lease must be positive'
			USING ERRCODE = 'invalid_parameter_value';
	END IF;
	IF t_lease OPERATOR(pg_catalog.>) t_cap THEN
		RAISE EXCEPTION 'lease is longer than outbox.max_lease'
			USING ERRCODE = 'invalid_parameter_value';
	END IF;
	IF pg_catalog.array_ndims(deciders) OPERATOR(pg_catalog.>) 1
	   OR pg_catalog.array_ndims(claimers) OPERATOR(pg_catalog.>) 1
	   OR pg_catalog.array_ndims(completers) OPERATOR(pg_catalog.>) 1 THEN
		RAISE EXCEPTION 'deciders, claimers and completers must be one-dimensional arrays'
			USING ERRCODE = 'array_subscript_error';
	END IF;
	IF pg_catalog.array_position(deciders, NULL) IS NOT NULL
	   OR pg_catalog.array_position(claimers, NULL) IS NOT NULL
	   OR pg_catalog.array_position(completers, NULL) IS NOT NULL THEN
		RAISE EXCEPTION 'deciders, claimers and completers must not contain nulls'
			USING ERRCODE = 'null_value_not_allowed';
	END IF;
	IF takeover OPERATOR(pg_catalog.<>) ALL (ARRAY['auto', 'manual']) THEN
		RAISE EXCEPTION 'takeover must be auto or manual'
			USING ERRCODE = 'invalid_parameter_value',
				  DETAIL = pg_catalog.format('The value was "%s".', takeover);
	END IF;
	-- A stream: NULL keeps the kind's, '' clears it, a name must exist.
	IF set_policy.stream OPERATOR(pg_catalog.<>) '' AND NOT EXISTS (
		SELECT 1 FROM @extschema@.streams s WHERE s.stream OPERATOR(pg_catalog.=) set_policy.stream) THEN
		RAISE EXCEPTION 'stream "%" does not exist', set_policy.stream
			USING ERRCODE = 'undefined_object',
				  HINT = 'Create it with outbox.create_stream.';
	END IF;
	INSERT INTO @extschema@.policies AS p
		(kind, max_deliveries, backoff_base, backoff_max, lease, takeover, retention,
		 deciders, claimers, completers, ordered_by_run, stream)
	VALUES (kind, max_deliveries, backoff_base, backoff_max, lease,
			COALESCE(takeover, 'auto'), retention, deciders, claimers, completers,
			COALESCE(set_policy.ordered_by_run, false), CASE WHEN set_policy.stream OPERATOR(pg_catalog.=) '' THEN NULL ELSE set_policy.stream END)
	ON CONFLICT ON CONSTRAINT policies_pkey DO UPDATE
	   SET max_deliveries = COALESCE(EXCLUDED.max_deliveries, p.max_deliveries),
		   backoff_base = COALESCE(EXCLUDED.backoff_base, p.backoff_base),
		   backoff_max = COALESCE(EXCLUDED.backoff_max, p.backoff_max),
		   lease = COALESCE(EXCLUDED.lease, p.lease),
		   takeover = COALESCE(set_policy.takeover, p.takeover),
		   retention = COALESCE(EXCLUDED.retention, p.retention),
		   deciders = COALESCE(EXCLUDED.deciders, p.deciders),
		   claimers = COALESCE(EXCLUDED.claimers, p.claimers),
		   completers = COALESCE(EXCLUDED.completers, p.completers),
		   ordered_by_run = COALESCE(set_policy.ordered_by_run, p.ordered_by_run),
		   stream = CASE WHEN set_policy.stream IS NULL THEN p.stream
						 ELSE CASE WHEN set_policy.stream OPERATOR(pg_catalog.=) '' THEN NULL ELSE set_policy.stream END END;
	-- The producers keep the deciders, the kinds ordered by run and the
	-- kinds' streams.
	IF deciders IS NOT NULL OR set_policy.ordered_by_run IS NOT NULL
	   OR set_policy.stream IS NOT NULL THEN
		PERFORM @extschema@._policies_changed();
	END IF;
END;
$$;
COMMENT ON FUNCTION @extschema@.set_policy(pg_catalog.text, pg_catalog.int4, pg_catalog.interval, pg_catalog.interval, pg_catalog.interval, pg_catalog.text, pg_catalog.interval, pg_catalog.regrole[], pg_catalog.regrole[], pg_catalog.regrole[], pg_catalog.bool, pg_catalog.text)
	IS 'set per-kind overrides, who may decide, claim and complete the kind, whether its commands are ordered by run, and the stream it is written to (empty: none); a NULL (or omitted) argument keeps the current value';

CREATE FUNCTION @extschema@.register_consumer(consumer pg_catalog.text, role pg_catalog.regrole)
RETURNS void
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
	holder pg_catalog.regrole;
BEGIN
	PERFORM @extschema@._require_id(consumer, 'consumer');
	PERFORM @extschema@._require(role, 'role');
	INSERT INTO @extschema@.consumers AS r (consumer, role)
	VALUES (consumer, role)
	ON CONFLICT ON CONSTRAINT consumers_pkey DO NOTHING;
	IF NOT FOUND THEN
		SELECT r.role INTO holder FROM @extschema@.consumers r
		 WHERE r.consumer OPERATOR(pg_catalog.=) register_consumer.consumer;
		IF holder OPERATOR(pg_catalog.<>) role THEN
			RAISE EXCEPTION 'consumer "%" is registered to another role', consumer
				USING ERRCODE = 'unique_violation', CONSTRAINT = 'consumers_pkey',
					  SCHEMA = '@extschema@', TABLE = 'consumers',
					  HINT = 'Unregister it first (outbox.unregister_consumer) to give it to another role.';
		END IF;
	END IF;
END;
$$;
COMMENT ON FUNCTION @extschema@.register_consumer(pg_catalog.text, pg_catalog.regrole)
	IS 'register a consumer name to the role whose members may accept commands under it (again with the same role: no change)';

CREATE FUNCTION @extschema@.unregister_consumer(consumer pg_catalog.text)
RETURNS pg_catalog.bool
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
	PERFORM @extschema@._require_id(consumer, 'consumer');
	DELETE FROM @extschema@.consumers r WHERE r.consumer OPERATOR(pg_catalog.=) unregister_consumer.consumer;
	RETURN FOUND;
END;
$$;
COMMENT ON FUNCTION @extschema@.unregister_consumer(pg_catalog.text)
	IS 'remove a consumer name''s registration (its inbox stays); false if it was not registered';

CREATE FUNCTION @extschema@.pause(kind pg_catalog.text)
RETURNS void
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
	PERFORM @extschema@._require_id(kind, 'kind');
	INSERT INTO @extschema@.policies AS p (kind, paused) VALUES (kind, true)
	ON CONFLICT ON CONSTRAINT policies_pkey DO UPDATE SET paused = true;
END;
$$;
COMMENT ON FUNCTION @extschema@.pause(pg_catalog.text)
	IS 'stop claim from handing out commands of this kind (leases already granted run on)';

CREATE FUNCTION @extschema@.resume(kind pg_catalog.text)
RETURNS void
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
	PERFORM @extschema@._require_id(kind, 'kind');
	UPDATE @extschema@.policies p SET paused = false
	 WHERE p.kind OPERATOR(pg_catalog.=) resume.kind;
END;
$$;
COMMENT ON FUNCTION @extschema@.resume(pg_catalog.text)
	IS 'let claim hand out commands of a paused kind again';

-- The retention rule (guarantee 6): remove up to batch_size commands that
-- are published, have a receipt, and whose publication and receipt are both
-- older than the retention (the kind's, else outbox.retention, else the
-- argument when given).  Each removal leaves a tombstone in outbox.purged
-- and takes the receipt with it.  Returns the number of commands purged.
CREATE FUNCTION @extschema@.purge(
	batch_size pg_catalog.int4 DEFAULT NULL,
	older_than pg_catalog.interval DEFAULT NULL)
RETURNS pg_catalog.int4
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
	-- Calling into the module first defines the outbox.* settings read below.
	loaded pg_catalog.bool := @extschema@.preloaded();
	n pg_catalog.int4;
	lim pg_catalog.int4 := COALESCE(batch_size,
		pg_catalog.current_setting('outbox.purge_batch')::pg_catalog.int4);
	dflt pg_catalog.interval := COALESCE(older_than,
		pg_catalog.current_setting('outbox.retention')::pg_catalog.interval);
	cutoff_ret pg_catalog.interval;
	-- The planner settings the victims query runs under (see below): the
	-- C functions' list, OUTBOX_PLANNER_STEERING of src/outbox.h.
	steer CONSTANT pg_catalog.text[] := ARRAY[@OUTBOX_PLANNER_STEERING@];
	saved pg_catalog.text[];
BEGIN
	IF lim OPERATOR(pg_catalog.<) 1 THEN
		RAISE EXCEPTION 'batch_size must be positive' USING ERRCODE = 'invalid_parameter_value';
	END IF;
	IF @extschema@._distributed() THEN
		RAISE EXCEPTION 'outbox.purge() does not run on a distributed outbox'
			USING ERRCODE = 'feature_not_supported',
				  DETAIL = 'Citus refuses row locks in a statement over several shards (docs/citus.md).';
	END IF;
	IF dflt OPERATOR(pg_catalog.<) '0'::pg_catalog.interval THEN
		RAISE EXCEPTION 'older_than must not be negative' USING ERRCODE = 'invalid_parameter_value';
	END IF;
	IF dflt OPERATOR(pg_catalog.>) '100 years'::pg_catalog.interval THEN
		RAISE EXCEPTION 'older_than must not be longer than 100 years'
			USING ERRCODE = 'invalid_parameter_value';
	END IF;
	-- Driven by receipts_completed_at_idx: only receipts older than the
	-- shortest retention in force are read, oldest first, so a purge that
	-- finds nothing costs one index probe however many receipts are young.
	IF older_than IS NULL THEN
		SELECT LEAST(dflt, pg_catalog.min(p.retention)) INTO cutoff_ret
		  FROM @extschema@.policies p;
	ELSE
		cutoff_ret := dflt;
	END IF;
	-- The victims query has one good plan, receipts_completed_at_idx in
	-- order with a primary-key probe of commands per receipt; with
	-- statistics that misjudge how many receipts are old enough, the
	-- planner preferred a sequential scan of commands and a sort.  Like the
	-- C functions, run it with those ruled out (and JIT off), and put the
	-- caller's settings back afterwards (an error rolls them back anyway).
	saved := ARRAY(SELECT pg_catalog.current_setting(steer[i])
					 FROM pg_catalog.generate_subscripts(steer, 1) AS i ORDER BY i);
	PERFORM pg_catalog.set_config(steer[i], 'off', true)
	   FROM pg_catalog.generate_subscripts(steer, 1) AS i;
	WITH victims AS (
		SELECT c.command_id, c.run_id, c.seq, c.kind, c.published_at, r.outcome
		  FROM @extschema@.receipts r
		  JOIN @extschema@.commands c ON c.command_id OPERATOR(pg_catalog.=) r.command_id
		 WHERE r.completed_at OPERATOR(pg_catalog.<)
			   (pg_catalog.now() OPERATOR(pg_catalog.-) cutoff_ret)
		   AND c.status OPERATOR(pg_catalog.=) 'published'
		   AND c.published_at IS NOT NULL
		   AND GREATEST(c.published_at, r.completed_at)
			   OPERATOR(pg_catalog.<) (pg_catalog.now() OPERATOR(pg_catalog.-)
			   COALESCE(CASE WHEN older_than IS NULL THEN
					(SELECT p.retention FROM @extschema@.policies p
					  WHERE p.kind OPERATOR(pg_catalog.=) c.kind) END, dflt))
		 ORDER BY r.completed_at
		 LIMIT lim
		   FOR UPDATE OF c, r SKIP LOCKED),
	tomb AS (
		INSERT INTO @extschema@.purged (command_id, run_id, seq, kind, published_at, outcome)
		SELECT v.command_id, v.run_id, v.seq, v.kind, v.published_at, v.outcome FROM victims v
		RETURNING purged.command_id),
	gone_r AS (
		DELETE FROM @extschema@.receipts r USING tomb
		 WHERE r.command_id OPERATOR(pg_catalog.=) tomb.command_id)
	DELETE FROM @extschema@.commands c USING tomb
	 WHERE c.command_id OPERATOR(pg_catalog.=) tomb.command_id;
	GET DIAGNOSTICS n = ROW_COUNT;
	PERFORM pg_catalog.set_config(steer[i], saved[i], true)
	   FROM pg_catalog.generate_subscripts(steer, 1) AS i;
	-- Counted in outbox.stats when (and only if) this transaction commits.
	PERFORM @extschema@._count_purged(n);
	RETURN n;
END;
$$;
COMMENT ON FUNCTION @extschema@.purge(pg_catalog.int4, pg_catalog.interval)
	IS 'remove up to batch_size published commands with a receipt older than the retention; returns the count';
