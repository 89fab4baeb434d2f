-- outbox install script, part 36: the operator's requeue and resolve, for
-- the commands of both paths: a dead or uncertain command of
-- outbox.commands (the row path), and a stream command that went dead in a
-- subscription (a row of outbox.stream_failures, part 35).  They are
-- PL/pgSQL, SECURITY DEFINER, like part 20; they come after part 35, whose
-- functions they call, so that the parts call each other one way only.
--
-- Which command: (run_id, command_id) names it wherever it is.  With
-- subscription NULL, a command of outbox.commands is handled as it always
-- was, and a stream command in every subscription of its stream in which
-- it is dead (55000 when it is dead in none); a subscription names one
-- subscription only (42704 for an unknown one or one of another stream,
-- 55000 for a command of outbox.commands).  docs/streams.md, "Decisions",
-- says why.
--
-- Locking.  The row path locks the command's row (FOR NO KEY UPDATE), as
-- ack and fail do.  The stream path locks the progress row of the
-- command's partition in each subscription (FOR UPDATE, in subscription
-- order: claim_batch skips it meanwhile, ack_batch and renew_batch wait),
-- then the failure row, so it never races a claim or an ack over the
-- failures of that partition.

-- The stream part of requeue and resolve: settle the command (run_id,
-- command_id) as resolution ('retry': due now, its deliveries kept;
-- 'published': it leaves the failures, and the next command of its key is
-- released; 'dead': it stays dead, with "resolved as dead" appended to its
-- error) in subscription sub, or in every subscription of its stream in
-- which it is dead when sub is NULL.  Errors: 42704 unknown subscription or
-- one of another stream; 55000 a command dead in none of them, purged, or
-- of outbox.commands; OB002 unknown command.  hint is the 55000's hint.
CREATE FUNCTION @extschema@._stream_settle(
	run_id pg_catalog.text, command_id pg_catalog.text, sub pg_catalog.text,
	resolution pg_catalog.text, hint pg_catalog.text, now_ts pg_catalog.timestamptz)
RETURNS void
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
	c record;
	p record;
	f record;
	had pg_catalog.bool;
	n pg_catalog.int4 := 0;
	states pg_catalog.text[] := '{}';
BEGIN
	IF sub IS NOT NULL AND NOT EXISTS (SELECT 1 FROM @extschema@.subscriptions u
										WHERE u.subscription OPERATOR(pg_catalog.=) sub) THEN
		RAISE EXCEPTION 'subscription "%" does not exist', sub
			USING ERRCODE = 'undefined_object';
	END IF;
	SELECT l.stream_id, l.part, l.xid, t.stream INTO c
	  FROM @extschema@._stream_log l
	  LEFT JOIN @extschema@.streams t ON t.stream_id OPERATOR(pg_catalog.=) l.stream_id
	 WHERE l.command_id OPERATOR(pg_catalog.=) _stream_settle.command_id
	   AND l.run_id OPERATOR(pg_catalog.=) _stream_settle.run_id
	 LIMIT 1;
	IF NOT FOUND THEN
		-- purged (55000) or unknown (OB002); else it is of outbox.commands
		PERFORM @extschema@._require_command(run_id, command_id);
		RAISE EXCEPTION 'command "%" is not a stream command', command_id
			USING ERRCODE = 'object_not_in_prerequisite_state',
				  DETAIL = 'It is in outbox.commands, which has no subscriptions.',
				  HINT = 'Leave subscription out for a command of outbox.commands.';
	END IF;
	IF sub IS NOT NULL AND NOT EXISTS (SELECT 1 FROM @extschema@.subscriptions u
										WHERE u.subscription OPERATOR(pg_catalog.=) sub
										  AND u.stream OPERATOR(pg_catalog.=) c.stream) THEN
		RAISE EXCEPTION 'subscription "%" is not a subscription of stream "%"', sub, c.stream
			USING ERRCODE = 'undefined_object',
				  DETAIL = pg_catalog.format('Command "%s" is in stream "%s".', command_id, c.stream);
	END IF;
	FOR p IN
		SELECT q.subscription::pg_catalog.text AS subscription, q.acked_tick, q.batch_to
		  FROM @extschema@.stream_progress q
		  JOIN @extschema@.subscriptions u ON u.subscription OPERATOR(pg_catalog.=) q.subscription
		 WHERE u.stream OPERATOR(pg_catalog.=) c.stream
		   AND q.part OPERATOR(pg_catalog.=) c.part
		   AND (sub IS NULL OR q.subscription OPERATOR(pg_catalog.=) sub)
		 ORDER BY q.subscription
		   FOR UPDATE OF q
	LOOP
		SELECT x.state, x.batch_id, x.ordering_key, x.decided_by INTO f
		  FROM @extschema@.stream_failures x
		 WHERE x.subscription OPERATOR(pg_catalog.=) p.subscription
		   AND x.command_id OPERATOR(pg_catalog.=) _stream_settle.command_id
		   FOR UPDATE;
		had := FOUND;
		IF NOT had OR f.state OPERATOR(pg_catalog.<>) 'dead' THEN
			-- its state in this subscription, as the checks derive it
			states := states OPERATOR(pg_catalog.||) pg_catalog.format('%s in subscription "%s"',
				CASE WHEN had AND f.batch_id IS NOT NULL THEN 'sending'
					 WHEN had THEN f.state
					 WHEN pg_catalog.pg_visible_in_snapshot(c.xid, @extschema@._stream_snap(c.stream_id, p.acked_tick))
					 THEN 'published'
					 WHEN p.batch_to IS NOT NULL
						  AND pg_catalog.pg_visible_in_snapshot(c.xid, @extschema@._stream_snap(c.stream_id, p.batch_to))
					 THEN 'sending'
					 ELSE 'pending' END, p.subscription);
			CONTINUE;
		END IF;
		n := n OPERATOR(pg_catalog.+) 1;
		IF resolution OPERATOR(pg_catalog.=) 'retry' THEN
			UPDATE @extschema@.stream_failures x SET state = 'retry', available_at = now_ts
			 WHERE x.subscription OPERATOR(pg_catalog.=) p.subscription
			   AND x.command_id OPERATOR(pg_catalog.=) _stream_settle.command_id;
		ELSIF resolution OPERATOR(pg_catalog.=) 'published' THEN
			-- published in this subscription: its partition's progress has
			-- acked past it (a command goes dead at an ack or when its
			-- batch is closed)
			DELETE FROM @extschema@.stream_failures x
			 WHERE x.subscription OPERATOR(pg_catalog.=) p.subscription
			   AND x.command_id OPERATOR(pg_catalog.=) _stream_settle.command_id;
			PERFORM @extschema@._stream_release_key(p.subscription, f.ordering_key, f.decided_by, now_ts);
		ELSE
			UPDATE @extschema@.stream_failures x
			   SET last_error = CASE WHEN x.last_error IS NULL THEN 'resolved as dead'
									 ELSE @extschema@._error_text(x.last_error, '; resolved as dead') END
			 WHERE x.subscription OPERATOR(pg_catalog.=) p.subscription
			   AND x.command_id OPERATOR(pg_catalog.=) _stream_settle.command_id;
		END IF;
	END LOOP;
	IF n OPERATOR(pg_catalog.=) 0 THEN
		IF pg_catalog.cardinality(states) OPERATOR(pg_catalog.=) 1 THEN
			RAISE EXCEPTION 'command "%" is %, not dead', command_id, states[1]
				USING ERRCODE = 'object_not_in_prerequisite_state', HINT = hint;
		END IF;
		RAISE EXCEPTION 'command "%" is dead in no subscription of stream "%"', command_id, c.stream
			USING ERRCODE = 'object_not_in_prerequisite_state',
				  DETAIL = CASE WHEN pg_catalog.cardinality(states) OPERATOR(pg_catalog.=) 0
								THEN 'The stream has no subscription.'
								ELSE 'It is ' OPERATOR(pg_catalog.||) pg_catalog.array_to_string(states, ', ')
									 OPERATOR(pg_catalog.||) '.' END,
				  HINT = hint;
	END IF;
	-- The commit wakes the worker, which notifies publishers: the command
	-- may be claimable now, and a claim may have skipped the progress rows
	-- this held.
	PERFORM @extschema@._wake_at_commit();
END;
$$;
COMMENT ON FUNCTION @extschema@._stream_settle(pg_catalog.text, pg_catalog.text, pg_catalog.text, pg_catalog.text, pg_catalog.text, pg_catalog.timestamptz)
	IS 'internal: requeue or resolve a stream command that is dead in a subscription (in every one when sub is NULL)';

CREATE FUNCTION @extschema@.requeue(
	run_id pg_catalog.text,
	command_id pg_catalog.text,
	subscription pg_catalog.text DEFAULT NULL)
RETURNS void
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
	st pg_catalog.text;
	row_path pg_catalog.bool := false;
	-- One reading of the clock: available_at and due_at must be equal.
	now_ts pg_catalog.timestamptz := pg_catalog.clock_timestamp();
BEGIN
	PERFORM @extschema@._require_id(run_id, 'run_id');
	PERFORM @extschema@._require_id(command_id, 'command_id');
	IF requeue.subscription IS NOT NULL THEN
		PERFORM @extschema@._require_id(requeue.subscription, 'subscription');
	ELSE
		SELECT c.status INTO st FROM @extschema@.commands c
		 WHERE c.command_id OPERATOR(pg_catalog.=) requeue.command_id
		   AND c.run_id OPERATOR(pg_catalog.=) requeue.run_id FOR NO KEY UPDATE;
		row_path := FOUND;
	END IF;
	IF NOT row_path THEN
		-- a stream command (else 55000 or OB002)
		PERFORM @extschema@._stream_settle(run_id, command_id, requeue.subscription, 'retry',
										   'Only dead commands of a stream can be requeued.', now_ts);
		RETURN;
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
	 WHERE c.command_id OPERATOR(pg_catalog.=) requeue.command_id
	   AND c.run_id OPERATOR(pg_catalog.=) requeue.run_id;
	-- Claimable now: the commit wakes the worker, which notifies publishers.
	PERFORM @extschema@._wake_at_commit();
END;
$$;
COMMENT ON FUNCTION @extschema@.requeue(pg_catalog.text, pg_catalog.text, pg_catalog.text)
	IS 'bring a dead or uncertain command back to pending (one more delivery attempt); a stream command that is dead in a subscription (in every one, or in the one named) back to retry';

CREATE FUNCTION @extschema@.resolve(
	run_id pg_catalog.text,
	command_id pg_catalog.text,
	resolution pg_catalog.text,
	subscription pg_catalog.text DEFAULT NULL)
RETURNS void
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
	st pg_catalog.text;
	okey pg_catalog.text;
	oseq pg_catalog.int8;
	orole pg_catalog.oid;
	row_path pg_catalog.bool := false;
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
	IF resolve.subscription IS NOT NULL THEN
		PERFORM @extschema@._require_id(resolve.subscription, 'subscription');
	ELSE
		SELECT c.status, c.ordering_key, c.ordering_seq, c.decided_by INTO st, okey, oseq, orole FROM @extschema@.commands c
		 WHERE c.command_id OPERATOR(pg_catalog.=) resolve.command_id
		   AND c.run_id OPERATOR(pg_catalog.=) resolve.run_id FOR NO KEY UPDATE;
		row_path := FOUND;
	END IF;
	IF NOT row_path THEN
		-- a stream command (else 55000 or OB002): a dead one is resolved
		-- (the stream path has no uncertain commands)
		PERFORM @extschema@._stream_settle(run_id, command_id, resolve.subscription, resolution,
										   'Only dead commands of a stream are resolved.', now_ts);
		RETURN;
	END IF;
	IF st OPERATOR(pg_catalog.<>) 'uncertain' THEN
		RAISE EXCEPTION 'command "%" is %, not uncertain', command_id, st
			USING ERRCODE = 'object_not_in_prerequisite_state',
				  HINT = 'Only uncertain commands are resolved; use requeue for dead ones.';
	END IF;
	-- One statement per resolution, every value a parameter or an immutable
	-- expression of the row: Citus routes it by the run (it refuses a CASE
	-- or COALESCE over a stable function in a distributed UPDATE).
	IF resolution OPERATOR(pg_catalog.=) 'published' THEN
		UPDATE @extschema@.commands c
		   SET status = 'published', published_at = now_ts, lease_until = NULL, due_at = NULL,
			   version = c.version OPERATOR(pg_catalog.+) 1
		 WHERE c.command_id OPERATOR(pg_catalog.=) resolve.command_id
		   AND c.run_id OPERATOR(pg_catalog.=) resolve.run_id;
	ELSIF resolution OPERATOR(pg_catalog.=) 'retry' THEN
		UPDATE @extschema@.commands c
		   SET status = 'pending', published_at = NULL, owner = NULL, lease_until = NULL,
			   available_at = now_ts, due_at = now_ts,
			   version = c.version OPERATOR(pg_catalog.+) 1
		 WHERE c.command_id OPERATOR(pg_catalog.=) resolve.command_id
		   AND c.run_id OPERATOR(pg_catalog.=) resolve.run_id;
	ELSE
		UPDATE @extschema@.commands c
		   SET status = 'dead', published_at = NULL, lease_until = NULL, due_at = NULL,
			   last_error = COALESCE(c.last_error OPERATOR(pg_catalog.||) '; ', '')
							OPERATOR(pg_catalog.||) 'resolved as dead',
			   version = c.version OPERATOR(pg_catalog.+) 1
		 WHERE c.command_id OPERATOR(pg_catalog.=) resolve.command_id
		   AND c.run_id OPERATOR(pg_catalog.=) resolve.run_id;
	END IF;
	-- A published head of an ordering key releases the next command (and
	-- the commit wakes the worker); a retry is claimable now, likewise.
	IF resolution OPERATOR(pg_catalog.=) 'published' AND okey IS NOT NULL THEN
		PERFORM @extschema@._release_key(okey, oseq, orole);
	ELSIF resolution OPERATOR(pg_catalog.=) 'retry' THEN
		PERFORM @extschema@._wake_at_commit();
	END IF;
END;
$$;
COMMENT ON FUNCTION @extschema@.resolve(pg_catalog.text, pg_catalog.text, pg_catalog.text, pg_catalog.text)
	IS 'settle an uncertain command, or a stream command that is dead in a subscription: published (it was sent), retry (send again) or dead';
