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
				  AND p.run_id OPERATOR(pg_catalog.=) _require_command.run_id)
	   OR EXISTS (SELECT 1 FROM @extschema@._stream_purged(_require_command.run_id, _require_command.command_id)) THEN
		RAISE EXCEPTION 'command "%" was purged', command_id
			USING ERRCODE = 'object_not_in_prerequisite_state',
				  DETAIL = 'It was published and completed, and the retention purge removed it.';
	END IF;
	RAISE EXCEPTION 'unknown_command: command "%" of run "%" does not exist', command_id, run_id
		USING ERRCODE = 'OB002',
			  DETAIL = 'No command of that run has this id, and none was purged.';
END;
$$;

-- requeue and resolve: part 36 (they reach the stream commands of part 35).

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
	distributed pg_catalog.bool := @extschema@._distributed();
	coordinator pg_catalog.bool;
	sh record;
	k pg_catalog.int4;
BEGIN
	IF lim OPERATOR(pg_catalog.<) 1 THEN
		RAISE EXCEPTION 'batch_size must be positive' USING ERRCODE = 'invalid_parameter_value';
	END IF;
	IF distributed THEN
		EXECUTE 'SELECT pg_catalog.citus_is_coordinator()' INTO coordinator;
		IF coordinator THEN
			RAISE EXCEPTION 'the coordinator holds no shard of the distributed outbox'
				USING ERRCODE = 'object_not_in_prerequisite_state',
					  DETAIL = 'Citus refuses row locks in a statement over several shards (docs/citus.md).',
					  HINT = 'Purge on the worker nodes: each purges the shards it holds, and so does its background worker.';
		END IF;
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
	IF distributed THEN
		-- A distributed outbox on a worker node: the same statement against
		-- each of this node's shards (plain tables here, where the row
		-- locks work), until the batch is done.  The shards of commands,
		-- receipts and purged are co-located, so a command, its receipt
		-- and its tombstone are on one node; command_id is unique per run.
		n := 0;
		FOR sh IN SELECT * FROM @extschema@._citus_local_shards()
		LOOP
			EXIT WHEN n OPERATOR(pg_catalog.>=) lim;
			EXECUTE pg_catalog.format('
	WITH victims AS (
		SELECT c.command_id, c.run_id, c.seq, c.kind, c.published_at, r.outcome
		  FROM %1$s r
		  JOIN %2$s c ON c.run_id OPERATOR(pg_catalog.=) r.run_id
					 AND c.command_id OPERATOR(pg_catalog.=) r.command_id
		 WHERE r.completed_at OPERATOR(pg_catalog.<) (pg_catalog.now() OPERATOR(pg_catalog.-) $1)
		   AND c.status OPERATOR(pg_catalog.=) ''published''
		   AND c.published_at IS NOT NULL
		   AND GREATEST(c.published_at, r.completed_at)
			   OPERATOR(pg_catalog.<) (pg_catalog.now() OPERATOR(pg_catalog.-)
			   COALESCE(CASE WHEN $2 THEN
					(SELECT p.retention FROM %3$s p
					  WHERE p.kind OPERATOR(pg_catalog.=) c.kind) END, $3))
		 ORDER BY r.completed_at
		 LIMIT $4
		   FOR UPDATE OF c, r SKIP LOCKED),
	tomb AS (
		INSERT INTO %4$s AS t (command_id, run_id, seq, kind, published_at, outcome)
		SELECT v.command_id, v.run_id, v.seq, v.kind, v.published_at, v.outcome FROM victims v
		RETURNING t.command_id, t.run_id),
	gone_r AS (
		DELETE FROM %1$s r USING tomb
		 WHERE r.run_id OPERATOR(pg_catalog.=) tomb.run_id
		   AND r.command_id OPERATOR(pg_catalog.=) tomb.command_id)
	DELETE FROM %2$s c USING tomb
	 WHERE c.run_id OPERATOR(pg_catalog.=) tomb.run_id
	   AND c.command_id OPERATOR(pg_catalog.=) tomb.command_id',
				sh.receipts, sh.commands, sh.policies, sh.purged)
			USING cutoff_ret, older_than IS NULL, dflt, lim OPERATOR(pg_catalog.-) n;
			GET DIAGNOSTICS k = ROW_COUNT;
			n := n OPERATOR(pg_catalog.+) k;
		END LOOP;
		PERFORM pg_catalog.set_config(steer[i], saved[i], true)
		   FROM pg_catalog.generate_subscripts(steer, 1) AS i;
		PERFORM @extschema@._count_purged(n);
		RETURN n;
	END IF;
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
