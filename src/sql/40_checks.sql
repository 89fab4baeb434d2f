-- outbox install script, part 40: the conservation checks and the DBA views.
--
-- Each invariant of the conservation contract has one check_<name> view that
-- returns the offending rows and is empty while the invariant holds;
-- outbox.conservation sums them up, one row per check, and outbox.verify()
-- turns them into an error.  All of them read one snapshot (one statement),
-- so a concurrent producer, publisher or purge never causes a false alarm:
-- an event and its command commit together, and the purge removes a command
-- and its receipt and writes the tombstone in one transaction.
--
-- Tombstones.  outbox.purge() leaves a row in outbox.purged for each command
-- it removes.  A tombstone excuses a missing command only when it matches
-- the event exactly (same command_id, run_id and seq); a command removed in
-- any other way has no tombstone and is reported.  A tombstone never excuses
-- a receipt (the purge removes the receipt with the command), and a
-- tombstone next to a live command with the same id is itself a violation.
--
-- Cost.  Every check is one pass over the tables it reads, matched on their
-- unique keys (command_id with its run_id everywhere, so that on a
-- distributed outbox every join is on the distribution column and runs
-- from the coordinator over the whole cluster, docs/citus.md; the events
-- also by (run_id, seq)) with
-- NOT EXISTS, which the planner turns into anti-joins: hash anti-joins for a
-- full check of a large outbox, index lookups (commands_pkey, receipts_pkey,
-- purged_pkey, events_pkey, events_command_id_key) when one side is small.
-- No check is a nested loop of scans; the cost grows linearly.
-- The views use only pg_catalog functions, so pg_monitor needs nothing but
-- SELECT on them; they never show a payload.  Every view that filters rows
-- is a security_barrier view: a reader's own function in a WHERE clause
-- runs only on the rows the view returns, never on those it filters out.


-- Invariant 1: every event that decided a command has that command (in
-- outbox.commands, or in the stream log for a kind with a stream), or the
-- tombstone the purge (or the streams' rotation, stream_purged) left for
-- exactly that event's command.
CREATE VIEW @extschema@.check_decisions_without_command WITH (security_barrier) AS
SELECT e.run_id, e.seq, e.kind, e.command_id, e.created_at
  FROM @extschema@.events e
  LEFT JOIN (SELECT x.command_id, x.run_id FROM @extschema@._stream_log x) l
	ON l.command_id OPERATOR(pg_catalog.=) e.command_id
   AND l.run_id OPERATOR(pg_catalog.=) e.run_id
  LEFT JOIN (SELECT x.command_id, x.run_id, x.seq FROM @extschema@.stream_purged_commands x) t
	ON t.command_id OPERATOR(pg_catalog.=) e.command_id
   AND t.run_id OPERATOR(pg_catalog.=) e.run_id
   AND t.seq OPERATOR(pg_catalog.=) e.seq
 WHERE e.command_id IS NOT NULL
   AND NOT EXISTS (SELECT 1 FROM @extschema@.commands c
					WHERE c.command_id OPERATOR(pg_catalog.=) e.command_id
					  AND c.run_id OPERATOR(pg_catalog.=) e.run_id)
   AND l.command_id IS NULL
   AND t.command_id IS NULL
   AND NOT EXISTS (SELECT 1 FROM @extschema@.purged p
					WHERE p.command_id OPERATOR(pg_catalog.=) e.command_id
					  AND p.run_id OPERATOR(pg_catalog.=) e.run_id
					  AND p.seq OPERATOR(pg_catalog.=) e.seq);
COMMENT ON VIEW @extschema@.check_decisions_without_command
	IS 'conservation check (error): events that decided a command that neither exists nor was purged; empty when healthy';

-- Invariant 2: every command (in outbox.commands or in the stream log,
-- status 'stream') traces to its source event, and that event names this
-- command.  (The stream log is matched by anti-joins to a subquery, in
-- invariants 1 and 3 too, not by NOT EXISTS: Citus plans a local table
-- only in a subquery, and no correlated subquery over one.  The events'
-- key is (run_id, seq), so "no event (run_id, seq) names the command" is
-- "the event at (run_id, seq) is missing or names another".)  events.command_id is unique, so "the event
-- (run_id, seq) names c" is the same as "the event naming c is
-- (run_id, seq)": the anti-join runs on command_id.
CREATE VIEW @extschema@.check_orphan_commands WITH (security_barrier) AS
SELECT c.command_id, c.run_id, c.seq, c.kind, c.status::pg_catalog.text AS status,
	   e.command_id AS event_command_id,
	   CASE WHEN e.run_id IS NULL THEN 'event_missing'
			WHEN e.command_id IS NULL THEN 'event_decided_nothing'
			ELSE 'event_decided_other' END::pg_catalog.text AS problem
  FROM @extschema@.commands c
  LEFT JOIN @extschema@.events e
	ON e.run_id OPERATOR(pg_catalog.=) c.run_id
   AND e.seq OPERATOR(pg_catalog.=) c.seq
 WHERE NOT EXISTS (SELECT 1 FROM @extschema@.events s
					WHERE s.command_id OPERATOR(pg_catalog.=) c.command_id
					  AND s.run_id OPERATOR(pg_catalog.=) c.run_id
					  AND s.seq OPERATOR(pg_catalog.=) c.seq)
UNION ALL
SELECT c.command_id, c.run_id, c.seq, c.kind, 'stream'::pg_catalog.text,
	   e.command_id,
	   CASE WHEN e.run_id IS NULL THEN 'event_missing'
			WHEN e.command_id IS NULL THEN 'event_decided_nothing'
			ELSE 'event_decided_other' END::pg_catalog.text
  FROM (SELECT x.command_id, x.run_id, x.seq, x.kind FROM @extschema@._stream_log x) c
  LEFT JOIN @extschema@.events e
	ON e.run_id OPERATOR(pg_catalog.=) c.run_id
   AND e.seq OPERATOR(pg_catalog.=) c.seq
 WHERE e.command_id IS NULL OR e.command_id OPERATOR(pg_catalog.<>) c.command_id;
COMMENT ON VIEW @extschema@.check_orphan_commands
	IS 'conservation check (error): commands whose source event (run_id, seq) is missing or does not name them; empty when healthy';
COMMENT ON COLUMN @extschema@.check_orphan_commands.problem
	IS 'event_missing, event_decided_nothing or event_decided_other (event_command_id names it)';

-- Invariant 3: every receipt references an existing command.  The purge
-- removes a receipt with its command, so a tombstone does not excuse one;
-- the purged column tells a receipt the purge left behind from one that
-- never had a command.  A receipt of a stream command in a log table
-- (stream_receipts_N) must have its command in that same table
-- (stream_log_N), with which the rotation truncates it.
CREATE VIEW @extschema@.check_orphan_receipts WITH (security_barrier) AS
SELECT r.command_id, r.outcome, r.completed_at,
	   EXISTS (SELECT 1 FROM @extschema@.purged p
				WHERE p.command_id OPERATOR(pg_catalog.=) r.command_id
				  AND p.run_id OPERATOR(pg_catalog.=) r.run_id)
	   OR t.command_id IS NOT NULL AS purged
  FROM @extschema@.receipts r
  LEFT JOIN (SELECT x.command_id, x.run_id FROM @extschema@._stream_log x) l
	ON l.command_id OPERATOR(pg_catalog.=) r.command_id
   AND l.run_id OPERATOR(pg_catalog.=) r.run_id
  LEFT JOIN (SELECT x.command_id, x.run_id FROM @extschema@.stream_purged_commands x) t
	ON t.command_id OPERATOR(pg_catalog.=) r.command_id
   AND t.run_id OPERATOR(pg_catalog.=) r.run_id
 WHERE NOT EXISTS (SELECT 1 FROM @extschema@.commands c
					WHERE c.command_id OPERATOR(pg_catalog.=) r.command_id
					  AND c.run_id OPERATOR(pg_catalog.=) r.run_id)
   AND l.command_id IS NULL
UNION ALL
SELECT r.command_id, r.outcome, r.completed_at,
	   t.command_id IS NOT NULL
  FROM (SELECT x.command_id, x.run_id, x.outcome, x.completed_at, 0 AS n FROM @extschema@.stream_receipts_0 x
		UNION ALL
		SELECT x.command_id, x.run_id, x.outcome, x.completed_at, 1 FROM @extschema@.stream_receipts_1 x
		UNION ALL
		SELECT x.command_id, x.run_id, x.outcome, x.completed_at, 2 FROM @extschema@.stream_receipts_2 x) r
  LEFT JOIN (SELECT x.command_id, x.run_id, 0 AS n FROM @extschema@.stream_log_0 x
			 UNION ALL
			 SELECT x.command_id, x.run_id, 1 FROM @extschema@.stream_log_1 x
			 UNION ALL
			 SELECT x.command_id, x.run_id, 2 FROM @extschema@.stream_log_2 x) l
	ON l.command_id OPERATOR(pg_catalog.=) r.command_id
   AND l.run_id OPERATOR(pg_catalog.=) r.run_id
   AND l.n OPERATOR(pg_catalog.=) r.n
  LEFT JOIN (SELECT x.command_id, x.run_id FROM @extschema@.stream_purged_commands x) t
	ON t.command_id OPERATOR(pg_catalog.=) r.command_id
   AND t.run_id OPERATOR(pg_catalog.=) r.run_id
 WHERE l.command_id IS NULL;
COMMENT ON VIEW @extschema@.check_orphan_receipts
	IS 'conservation check (error): receipts whose command does not exist; empty when healthy';

-- Invariant 4, streams (docs/streams.md).  A stream command's state in a
-- subscription is derived, never stored: failed (retry, dead or waiting:
-- its row in stream_failures), else published (its transaction visible in
-- the snapshot of the acked tick of its partition), else pending (sending
-- while the open batch holds it).  The rules below make that derivation
-- exact: each command of a subscription is in one state only.  One row per
-- offending failure row (command_id set) or progress row (command_id NULL):
--   stream_failure_without_command     the failed command is in no log table
--   stream_failure_wrong_partition     it is of another partition or stream
--   stream_failure_not_reached         its partition's progress (acked tick,
--                                      or the open batch's end) does not see
--                                      it: it would be pending and failed
--   stream_retry_outside_batch         marked for a batch that is not open
--   stream_waiting_without_predecessor waiting, with no earlier failed
--                                      command of its key: nothing releases it
--   stream_dead_without_error          dead, last_error is NULL
--   stream_progress_without_subscription
--   stream_partition_unknown           a progress row of no partition of the
--                                      stream, or a partition without one
--   stream_batch_without_lease         a batch is open without owner, lease,
--                                      version or delivery
--   stream_lease_without_batch         an owner or lease with no open batch
--   stream_tick_missing                the acked tick or the batch's end is
--                                      no tick of the stream
--   stream_progress_before_start       acked before the subscription's start
CREATE VIEW @extschema@.check_stream_state WITH (security_barrier) AS
SELECT f.subscription::pg_catalog.text AS subscription, f.part, f.command_id,
	   f.state AS status,
	   pg_catalog.array_remove(ARRAY[
		   CASE WHEN l.command_id IS NULL THEN 'stream_failure_without_command' END,
		   CASE WHEN l.command_id IS NOT NULL AND (l.part OPERATOR(pg_catalog.<>) f.part
				OR l.stream_id OPERATOR(pg_catalog.<>) t.stream_id OR t.stream_id IS NULL)
				THEN 'stream_failure_wrong_partition' END,
		   CASE WHEN NOT COALESCE(pg_catalog.pg_visible_in_snapshot(f.xid, k.snap), false)
				THEN 'stream_failure_not_reached' END,
		   CASE WHEN f.batch_id IS NOT NULL AND NOT COALESCE(p.batch_to IS NOT NULL
				AND p.batch_id OPERATOR(pg_catalog.=) f.batch_id, false)
				THEN 'stream_retry_outside_batch' END,
		   CASE WHEN f.state OPERATOR(pg_catalog.=) 'waiting'
				AND NOT EXISTS (SELECT 1 FROM @extschema@.stream_failures w
								 WHERE w.subscription OPERATOR(pg_catalog.=) f.subscription
								   AND w.ordering_key OPERATOR(pg_catalog.=) f.ordering_key
								   AND w.decided_by OPERATOR(pg_catalog.=) f.decided_by
								   AND w.log_id OPERATOR(pg_catalog.<) f.log_id)
				THEN 'stream_waiting_without_predecessor' END,
		   CASE WHEN f.state OPERATOR(pg_catalog.=) 'dead' AND f.last_error IS NULL
				THEN 'stream_dead_without_error' END]::pg_catalog.text[], NULL) AS rules
  FROM @extschema@.stream_failures f
  LEFT JOIN @extschema@.subscriptions u ON u.subscription OPERATOR(pg_catalog.=) f.subscription
  LEFT JOIN @extschema@.streams t ON t.stream OPERATOR(pg_catalog.=) u.stream
  LEFT JOIN @extschema@.stream_progress p
	ON p.subscription OPERATOR(pg_catalog.=) f.subscription AND p.part OPERATOR(pg_catalog.=) f.part
  LEFT JOIN @extschema@.stream_ticks k
	ON k.stream_id OPERATOR(pg_catalog.=) t.stream_id
   AND k.tick OPERATOR(pg_catalog.=) COALESCE(p.batch_to, p.acked_tick)
  LEFT JOIN LATERAL (SELECT x.command_id, x.part, x.stream_id FROM @extschema@._stream_log x
					  WHERE x.command_id OPERATOR(pg_catalog.=) f.command_id LIMIT 1) l ON true
 WHERE l.command_id IS NULL
	OR l.part OPERATOR(pg_catalog.<>) f.part OR t.stream_id IS NULL
	OR l.stream_id OPERATOR(pg_catalog.<>) t.stream_id
	OR NOT COALESCE(pg_catalog.pg_visible_in_snapshot(f.xid, k.snap), false)
	OR (f.batch_id IS NOT NULL AND NOT COALESCE(p.batch_to IS NOT NULL
		AND p.batch_id OPERATOR(pg_catalog.=) f.batch_id, false))
	OR (f.state OPERATOR(pg_catalog.=) 'waiting'
		AND NOT EXISTS (SELECT 1 FROM @extschema@.stream_failures w
						 WHERE w.subscription OPERATOR(pg_catalog.=) f.subscription
						   AND w.ordering_key OPERATOR(pg_catalog.=) f.ordering_key
						   AND w.decided_by OPERATOR(pg_catalog.=) f.decided_by
						   AND w.log_id OPERATOR(pg_catalog.<) f.log_id))
	OR (f.state OPERATOR(pg_catalog.=) 'dead' AND f.last_error IS NULL)
UNION ALL
SELECT q.subscription, q.part, NULL::pg_catalog.text COLLATE pg_catalog."C", NULL, q.rules
  FROM (SELECT COALESCE(p.subscription, u.subscription)::pg_catalog.text AS subscription,
			   COALESCE(p.part, g.part) AS part,
			   pg_catalog.array_remove(ARRAY[
				   CASE WHEN p.subscription IS NOT NULL AND u.subscription IS NULL
						THEN 'stream_progress_without_subscription' END,
				   CASE WHEN p.subscription IS NULL OR g.part IS NULL
						THEN 'stream_partition_unknown' END,
				   CASE WHEN p.batch_to IS NOT NULL AND (p.owner IS NULL OR p.lease_until IS NULL
						OR p.version OPERATOR(pg_catalog.<) 1 OR p.deliveries OPERATOR(pg_catalog.<) 1)
						THEN 'stream_batch_without_lease' END,
				   CASE WHEN p.batch_to IS NULL AND (p.owner IS NOT NULL OR p.lease_until IS NOT NULL)
						THEN 'stream_lease_without_batch' END,
				   CASE WHEN p.subscription IS NOT NULL AND u.subscription IS NOT NULL
						AND (NOT EXISTS (SELECT 1 FROM @extschema@.stream_ticks k
										  WHERE k.stream_id OPERATOR(pg_catalog.=) t.stream_id
											AND k.tick OPERATOR(pg_catalog.=) p.acked_tick)
							 OR (p.batch_to IS NOT NULL
								 AND NOT EXISTS (SELECT 1 FROM @extschema@.stream_ticks k
												  WHERE k.stream_id OPERATOR(pg_catalog.=) t.stream_id
													AND k.tick OPERATOR(pg_catalog.=) p.batch_to)))
						THEN 'stream_tick_missing' END,
				   CASE WHEN p.acked_tick OPERATOR(pg_catalog.<) u.start_tick
						THEN 'stream_progress_before_start' END]::pg_catalog.text[], NULL) AS rules
		  FROM (SELECT u.subscription, u.stream, u.start_tick, gs.part
				  FROM @extschema@.subscriptions u
				  JOIN @extschema@.streams t ON t.stream OPERATOR(pg_catalog.=) u.stream
				 CROSS JOIN LATERAL pg_catalog.generate_series(0, t.partitions OPERATOR(pg_catalog.-) 1) AS gs(part)) g
		  FULL JOIN @extschema@.stream_progress p
			ON p.subscription OPERATOR(pg_catalog.=) g.subscription AND p.part OPERATOR(pg_catalog.=) g.part
		  LEFT JOIN @extschema@.subscriptions u
			ON u.subscription OPERATOR(pg_catalog.=) COALESCE(p.subscription, g.subscription)
		  LEFT JOIN @extschema@.streams t ON t.stream OPERATOR(pg_catalog.=) u.stream) q
 WHERE pg_catalog.cardinality(q.rules) OPERATOR(pg_catalog.>) 0;
COMMENT ON VIEW @extschema@.check_stream_state
	IS 'conservation check (error, counted in the check state): stream failures and progress rows whose fields disagree, with the rules they break; empty when healthy';

-- Invariant 4: the state of each command is consistent.  One row per
-- inconsistent command; rules lists every rule it breaks:
--   sending_without_owner             sending, owner is NULL
--   sending_without_lease             sending, lease_until is NULL
--   lease_while_not_sending           not sending, lease_until is set
--   published_without_time            published, published_at is NULL
--   publish_time_while_not_published  not published, published_at is set
--   claimed_without_delivery          not pending (so claimed), deliveries = 0
--   version_behind_deliveries         version < deliveries + 1 (each claim
--                                     bumps both, every other change version)
--   pending_not_claimable             pending, due_at <> available_at, or
--                                     due_at NULL without an ordering key
--                                     (claim would never see it: a lost command)
--   claimable_while_not_pending       not pending, due_at is set (claim would
--                                     hand it out again)
--   dead_without_error                dead or uncertain, last_error is NULL
--   purged_but_present                a tombstone exists for this live command
--                                     (a terminal, purged command came back)
-- and the rules of ordered delivery (src/keys.c), where a command's
-- predecessor is an unfinished command of its key with an earlier place
-- (ordering_seq): a waiting command is pending with due_at NULL.  A key is
-- (decided_by, ordering_key): a key belongs to the role that decides.
--   waiting_without_predecessor       waiting, and no predecessor: nothing
--                                     would ever release it (a stuck key)
--   claimable_behind_predecessor      not published and not waiting, with a
--                                     predecessor: a second head of its key
--   published_out_of_order            published, with a predecessor
--   key_without_place                 one of ordering_key and ordering_seq
--                                     is NULL, the other not
--   place_taken                       another command has the same key
--                                     (role and key) and place
--   unmarked_last_head                pending and due, or sending, the last
--                                     unfinished command of its key, and
--                                     ordering_tail not true: it is not in
--                                     commands_key_idx, so a producer would
--                                     make a second head behind it
-- The flags are computed in the subquery; their disjunction filters the scan
-- and the rules array is built for the offending rows only.  Tombstones are
-- hashed and probed by the one scan of commands, and so are the keys' first
-- and last unfinished places (h) and the places held twice (d), each one pass over
-- the commands with a key.  (The streams' rules are check_stream_state,
-- above, counted with these as the check "state".)
CREATE VIEW @extschema@.check_state WITH (security_barrier) AS
SELECT f.command_id, f.status::pg_catalog.text AS status,
	   pg_catalog.array_remove(ARRAY[
		   CASE WHEN f.r1 THEN 'sending_without_owner' END,
		   CASE WHEN f.r2 THEN 'sending_without_lease' END,
		   CASE WHEN f.r3 THEN 'lease_while_not_sending' END,
		   CASE WHEN f.r4 THEN 'published_without_time' END,
		   CASE WHEN f.r5 THEN 'publish_time_while_not_published' END,
		   CASE WHEN f.r6 THEN 'claimed_without_delivery' END,
		   CASE WHEN f.r7 THEN 'version_behind_deliveries' END,
		   CASE WHEN f.r8 THEN 'pending_not_claimable' END,
		   CASE WHEN f.r9 THEN 'claimable_while_not_pending' END,
		   CASE WHEN f.r10 THEN 'dead_without_error' END,
		   CASE WHEN f.r11 THEN 'purged_but_present' END,
		   CASE WHEN f.r12 THEN 'waiting_without_predecessor' END,
		   CASE WHEN f.r13 THEN 'claimable_behind_predecessor' END,
		   CASE WHEN f.r14 THEN 'published_out_of_order' END,
		   CASE WHEN f.r15 THEN 'key_without_place' END,
		   CASE WHEN f.r16 THEN 'place_taken' END,
		   CASE WHEN f.r17 THEN 'unmarked_last_head' END]::pg_catalog.text[], NULL) AS rules,
	   f.owner, f.version::pg_catalog.int8 AS version, f.deliveries::pg_catalog.int4 AS deliveries,
	   f.lease_until, f.published_at,
	   f.available_at, f.due_at, f.ordering_key, f.ordering_seq
  FROM (SELECT c.command_id, c.status, c.owner, c.version, c.deliveries,
			   c.lease_until, c.published_at, c.available_at, c.due_at,
			   c.ordering_key::pg_catalog.text AS ordering_key, c.ordering_seq,
			   c.status OPERATOR(pg_catalog.=) 'sending' AND c.owner IS NULL AS r1,
			   c.status OPERATOR(pg_catalog.=) 'sending' AND c.lease_until IS NULL AS r2,
			   c.status OPERATOR(pg_catalog.<>) 'sending' AND c.lease_until IS NOT NULL AS r3,
			   c.status OPERATOR(pg_catalog.=) 'published' AND c.published_at IS NULL AS r4,
			   c.status OPERATOR(pg_catalog.<>) 'published' AND c.published_at IS NOT NULL AS r5,
			   c.status OPERATOR(pg_catalog.<>) 'pending'
				   AND c.deliveries OPERATOR(pg_catalog.=) 0 AS r6,
			   c.version OPERATOR(pg_catalog.<)
				   (c.deliveries::pg_catalog.int8 OPERATOR(pg_catalog.+) 1) AS r7,
			   c.status OPERATOR(pg_catalog.=) 'pending'
				   AND ((c.due_at IS NULL AND c.ordering_key IS NULL)
						OR c.due_at OPERATOR(pg_catalog.<>) c.available_at) AS r8,
			   c.status OPERATOR(pg_catalog.<>) 'pending' AND c.due_at IS NOT NULL AS r9,
			   c.status OPERATOR(pg_catalog.=) ANY (ARRAY['dead', 'uncertain']::pg_catalog.text[])
				   AND c.last_error IS NULL AS r10,
			   p.command_id IS NOT NULL AS r11,
			   c.status OPERATOR(pg_catalog.=) 'pending' AND c.due_at IS NULL
				   AND c.ordering_key IS NOT NULL
				   AND NOT COALESCE(h.first OPERATOR(pg_catalog.<) c.ordering_seq, false) AS r12,
			   c.status OPERATOR(pg_catalog.<>) 'published'
				   AND NOT (c.status OPERATOR(pg_catalog.=) 'pending' AND c.due_at IS NULL)
				   AND COALESCE(h.first OPERATOR(pg_catalog.<) c.ordering_seq, false) AS r13,
			   c.status OPERATOR(pg_catalog.=) 'published'
				   AND COALESCE(h.first OPERATOR(pg_catalog.<) c.ordering_seq, false) AS r14,
			   (c.ordering_key IS NULL) OPERATOR(pg_catalog.<>) (c.ordering_seq IS NULL) AS r15,
			   d.ordering_key IS NOT NULL AS r16,
			   c.ordering_tail IS NOT TRUE
				   AND (c.status OPERATOR(pg_catalog.=) 'sending'
						OR (c.status OPERATOR(pg_catalog.=) 'pending' AND c.due_at IS NOT NULL))
				   AND COALESCE(h.last OPERATOR(pg_catalog.=) c.ordering_seq, false) AS r17
		  FROM @extschema@.commands c
		  LEFT JOIN @extschema@.purged p
			ON p.command_id OPERATOR(pg_catalog.=) c.command_id
		   AND p.run_id OPERATOR(pg_catalog.=) c.run_id
		  LEFT JOIN (SELECT k.ordering_key, k.decided_by, pg_catalog.min(k.ordering_seq) AS first,
							pg_catalog.max(k.ordering_seq) AS last
					   FROM @extschema@.commands k
					  WHERE k.ordering_key IS NOT NULL
						AND k.status OPERATOR(pg_catalog.<>) 'published'
					  GROUP BY k.ordering_key, k.decided_by) h
			ON h.ordering_key OPERATOR(pg_catalog.=) c.ordering_key
		   AND h.decided_by OPERATOR(pg_catalog.=) c.decided_by
		  LEFT JOIN (SELECT k.ordering_key, k.decided_by, k.ordering_seq
					   FROM @extschema@.commands k
					  WHERE k.ordering_key IS NOT NULL
					  GROUP BY k.ordering_key, k.decided_by, k.ordering_seq
					 HAVING pg_catalog.count(*) OPERATOR(pg_catalog.>) 1) d
			ON d.ordering_key OPERATOR(pg_catalog.=) c.ordering_key
		   AND d.decided_by OPERATOR(pg_catalog.=) c.decided_by
		   AND d.ordering_seq OPERATOR(pg_catalog.=) c.ordering_seq) f
 WHERE f.r1 OR f.r2 OR f.r3 OR f.r4 OR f.r5 OR f.r6 OR f.r7 OR f.r8 OR f.r9
	OR f.r10 OR f.r11 OR f.r12 OR f.r13 OR f.r14 OR f.r15 OR f.r16 OR f.r17;
COMMENT ON VIEW @extschema@.check_state
	IS 'conservation check (error): commands whose status and fields disagree, with the rules they break; empty when healthy';
COMMENT ON COLUMN @extschema@.check_state.rules
	IS 'the broken rules (see the README, section Monitoring)';

-- Invariant 5 (warning class): a published command waits for its receipt no
-- longer than outbox.receipt_overdue.  The setting is defined once the
-- module is loaded in the session (always, when it is preloaded); before
-- that a value from the configuration is still seen (as written, a bare
-- number meaning seconds), and without any the threshold is one hour.  It is
-- computed once per query (an uncorrelated subquery), not once per row.
CREATE VIEW @extschema@.check_receipt_overdue WITH (security_barrier) AS
SELECT c.command_id, c.run_id, c.seq, c.kind, c.owner, c.published_at,
	   pg_catalog.now() OPERATOR(pg_catalog.-) c.published_at AS waiting
  FROM @extschema@.commands c
 WHERE c.status OPERATOR(pg_catalog.=) 'published'
   AND c.published_at OPERATOR(pg_catalog.<)
	   (SELECT pg_catalog.now() OPERATOR(pg_catalog.-)
			   CASE WHEN s.v IS NULL OR s.v OPERATOR(pg_catalog.=) ''
					THEN '1 hour'::pg_catalog.interval
					ELSE s.v::pg_catalog.interval END
		  FROM (SELECT pg_catalog.current_setting('outbox.receipt_overdue', true) AS v) s)
   AND NOT EXISTS (SELECT 1 FROM @extschema@.receipts r
					WHERE r.command_id OPERATOR(pg_catalog.=) c.command_id
					  AND r.run_id OPERATOR(pg_catalog.=) c.run_id);
COMMENT ON VIEW @extschema@.check_receipt_overdue
	IS 'conservation check (warning): published commands without a receipt for longer than outbox.receipt_overdue; empty when healthy';

-- One row per check.  Each check view returns one row per offending command
-- and is read once (a materialized CTE):
-- violations counts its rows, sample holds up to five of the offending
-- command ids, smallest first.
CREATE VIEW @extschema@.conservation WITH (security_barrier) AS
WITH d AS MATERIALIZED (SELECT v.command_id AS id FROM @extschema@.check_decisions_without_command v),
	 o AS MATERIALIZED (SELECT v.command_id AS id FROM @extschema@.check_orphan_commands v),
	 r AS MATERIALIZED (SELECT v.command_id AS id FROM @extschema@.check_orphan_receipts v),
	 s AS MATERIALIZED (SELECT v.command_id AS id FROM @extschema@.check_state v),
	 ss AS MATERIALIZED (SELECT v.command_id AS id FROM @extschema@.check_stream_state v),
	 w AS MATERIALIZED (SELECT v.command_id AS id FROM @extschema@.check_receipt_overdue v)
SELECT x.check_name, x.severity, x.violations, x.sample, x.description
  FROM (VALUES
	('decisions_without_command'::pg_catalog.text, 'error'::pg_catalog.text,
	 (SELECT pg_catalog.count(*) FROM d),
	 ARRAY(SELECT d.id FROM d ORDER BY d.id LIMIT 5),
	 'every event that decided a command has that command, or its purge tombstone'::pg_catalog.text),
	('orphan_commands', 'error',
	 (SELECT pg_catalog.count(*) FROM o),
	 ARRAY(SELECT o.id FROM o ORDER BY o.id LIMIT 5),
	 'every command traces to its source run and event'),
	('orphan_receipts', 'error',
	 (SELECT pg_catalog.count(*) FROM r),
	 ARRAY(SELECT r.id FROM r ORDER BY r.id LIMIT 5),
	 'every receipt references an existing command'),
	('state', 'error',
	 (SELECT pg_catalog.count(*) FROM s) OPERATOR(pg_catalog.+) (SELECT pg_catalog.count(*) FROM ss),
	 ARRAY(SELECT u.id FROM (SELECT s.id FROM s UNION ALL SELECT ss.id FROM ss) u ORDER BY u.id LIMIT 5),
	 'every command''s status agrees with its owner, lease, publish time, deliveries and version, and with the order of its ordering key; every stream command is in one state per subscription'),
	('receipt_overdue', 'warning',
	 (SELECT pg_catalog.count(*) FROM w),
	 ARRAY(SELECT w.id FROM w ORDER BY w.id LIMIT 5),
	 'no published command has waited longer than outbox.receipt_overdue for its receipt'))
	AS x(check_name, severity, violations, sample, description);
COMMENT ON VIEW @extschema@.conservation
	IS 'one row per conservation check: severity, number of violations (0 when healthy) and up to five offending command ids';

-- Raise 23000 (integrity_constraint_violation) naming every violated
-- error-class check, with a sample of ids per check in the detail.  A
-- violated warning-class check only emits a WARNING, unless
-- include_warnings is true.  Silent when everything holds.  SECURITY
-- INVOKER: the caller needs SELECT on outbox.conservation.
CREATE FUNCTION @extschema@.verify(include_warnings pg_catalog.bool DEFAULT false)
RETURNS void
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
	c record;
	failed pg_catalog.text[] := '{}';
	details pg_catalog.text[] := '{}';
	line pg_catalog.text;
BEGIN
	IF include_warnings IS NULL THEN
		RAISE EXCEPTION 'include_warnings must not be null'
			USING ERRCODE = 'null_value_not_allowed';
	END IF;
	FOR c IN SELECT v.check_name, v.severity, v.violations, v.sample
			   FROM @extschema@.conservation v
			  WHERE v.violations OPERATOR(pg_catalog.>) 0
	LOOP
		line := pg_catalog.format('Check %s found %s violation%s, among them %s.',
								  c.check_name, c.violations,
								  CASE WHEN c.violations OPERATOR(pg_catalog.=) 1 THEN '' ELSE 's' END,
								  pg_catalog.array_to_string(c.sample, ', '));
		IF c.severity OPERATOR(pg_catalog.=) 'error' OR include_warnings THEN
			failed := failed OPERATOR(pg_catalog.||) c.check_name;
			details := details OPERATOR(pg_catalog.||) line;
		ELSE
			RAISE WARNING 'outbox conservation check % found % violation%', c.check_name, c.violations,
				CASE WHEN c.violations OPERATOR(pg_catalog.=) 1 THEN '' ELSE 's' END
				USING DETAIL = line,
					  HINT = pg_catalog.format('See the view outbox.check_%s.', c.check_name);
		END IF;
	END LOOP;
	IF pg_catalog.cardinality(failed) OPERATOR(pg_catalog.>) 0 THEN
		RAISE EXCEPTION 'outbox conservation violated: %', pg_catalog.array_to_string(failed, ', ')
			USING ERRCODE = 'integrity_constraint_violation',
				  DETAIL = pg_catalog.array_to_string(details, E'\n'),
				  HINT = 'Each check has a view outbox.check_<name> listing the offending rows.';
	END IF;
END;
$$;
COMMENT ON FUNCTION @extschema@.verify(pg_catalog.bool)
	IS 'raise integrity_constraint_violation (23000) naming every violated conservation check; warnings only warn unless include_warnings';

-- DBA views ------------------------------------------------------------------

-- Per kind and status: how many commands, how many pending ones wait for
-- their not-before time, and how long the oldest available one has been
-- available (for pending rows: the oldest command waiting to be claimed).
CREATE VIEW @extschema@.backlog AS
SELECT c.kind, c.status::pg_catalog.text AS status,
	   pg_catalog.count(*) AS commands,
	   pg_catalog.count(*) FILTER (WHERE c.status OPERATOR(pg_catalog.=) 'pending'
								   AND c.available_at OPERATOR(pg_catalog.>) pg_catalog.now()) AS delayed,
	   pg_catalog.min(c.available_at) AS oldest_available_at,
	   pg_catalog.now() OPERATOR(pg_catalog.-)
		   pg_catalog.min(c.available_at) FILTER (WHERE c.available_at OPERATOR(pg_catalog.<=) pg_catalog.now())
		   AS oldest_available_age
  FROM @extschema@.commands c
 GROUP BY c.kind, c.status;
COMMENT ON VIEW @extschema@.backlog
	IS 'per kind and status: number of commands, delayed pending ones, and the age of the oldest available one';

-- Every sending command: its holder and token, and how long the lease has
-- left (negative: expired that long ago).  takeover says what happens to an
-- expired lease: auto (the next claim takes it over) or manual (the worker
-- moves it to uncertain).
CREATE VIEW @extschema@.leases WITH (security_barrier) AS
SELECT c.command_id, c.kind, c.owner AS holder, c.version::pg_catalog.int8 AS version,
	   c.deliveries::pg_catalog.int4 AS deliveries, c.lease_until,
	   c.lease_until OPERATOR(pg_catalog.<=) pg_catalog.now() AS expired,
	   c.lease_until OPERATOR(pg_catalog.-) pg_catalog.now() AS time_left,
	   COALESCE(p.takeover, 'auto') AS takeover
  FROM @extschema@.commands c
  LEFT JOIN @extschema@.policies p ON p.kind OPERATOR(pg_catalog.=) c.kind
 WHERE c.status OPERATOR(pg_catalog.=) 'sending';
COMMENT ON VIEW @extschema@.leases
	IS 'sending commands: holder, token (version), lease end, whether it expired and the time left';

-- Commands that need a human: dead (deliveries used up or a fatal failure)
-- and uncertain (an expired lease of a manual-takeover kind).
CREATE VIEW @extschema@.dead_letters WITH (security_barrier) AS
SELECT c.command_id, c.run_id, c.seq, c.kind, c.status::pg_catalog.text AS status,
	   c.deliveries::pg_catalog.int4 AS deliveries, c.version::pg_catalog.int8 AS version,
	   c.owner, c.last_error, c.created_at, c.available_at
  FROM @extschema@.commands c
 WHERE c.status OPERATOR(pg_catalog.=) ANY (ARRAY['dead', 'uncertain']::pg_catalog.text[]);
COMMENT ON VIEW @extschema@.dead_letters
	IS 'dead and uncertain commands with their last error; requeue or resolve them';

-- Ordering keys with commands waiting: one row per key (decided_by,
-- ordering_key: a key belongs to the role that decides) with at least one
-- command waiting behind its head (its first command that is not
-- published), whatever the head's status: a head that cannot be claimed
-- now (pending in a retry's backoff or before its not-before time, of a
-- paused kind; sending; dead; uncertain) has head_claimable false, and so
-- has a head that is itself waiting (a stuck key, see check_state); a
-- pending head that is due, of a kind not paused, has head_claimable true:
-- it may be claimed now, and one that stays so while since grows is a
-- head no publisher claims (none may claim its kind).  since is when the
-- key last moved: when its previous command was published (the
-- published_at of the key's command just before the head), or the head's
-- created_at if that is later (or the key has no earlier command left: a
-- key's first command, or the earlier ones purged).  A head skipped by
-- skip_head left the key and does not count.  Read from what the calls
-- write already (nothing is written for it).  One pass over the
-- unfinished commands with a key (the published history is not read),
-- sorted by key and place (the head is the first of its key: a head with
-- commands behind it is not in commands_key_idx), and one probe of
-- commands_key_idx for each key listed: the place before its head (a
-- published command, which the index holds).  On a distributed outbox
-- (docs/citus.md), where Citus plans no such probe, the same rows come
-- from multi-shard steps instead (below).  The view reads the rows from
-- _blocked_keys(), SECURITY DEFINER as the API is, granted to the view's
-- readers.
CREATE FUNCTION @extschema@._blocked_keys()
RETURNS TABLE (ordering_key pg_catalog.text, head_command_id pg_catalog.text,
			   head_run_id pg_catalog.text, head_status pg_catalog.text,
			   since pg_catalog.timestamptz, waiting pg_catalog.int8,
			   decided_by pg_catalog.regrole, head_claimable pg_catalog.bool)
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
	IF NOT @extschema@._distributed() THEN
		RETURN QUERY
		SELECT h.ordering_key::pg_catalog.text AS ordering_key, h.command_id AS head_command_id,
			   h.run_id AS head_run_id, h.status::pg_catalog.text AS head_status,
			   GREATEST(h.created_at,
					(SELECT p.published_at FROM @extschema@.commands p
					  WHERE p.ordering_key OPERATOR(pg_catalog.=) h.ordering_key
						AND p.decided_by OPERATOR(pg_catalog.=) h.decided_by
						AND p.ordering_seq OPERATOR(pg_catalog.<) h.ordering_seq
						AND (p.ordering_tail
							 OR (p.status OPERATOR(pg_catalog.=) 'pending' AND p.due_at IS NULL)
							 OR (p.status OPERATOR(pg_catalog.<>) 'pending' AND p.status OPERATOR(pg_catalog.<>) 'sending'))
					  ORDER BY p.ordering_seq DESC LIMIT 1)) AS since,
			   h.waiting, h.decided_by::pg_catalog.regrole AS decided_by,
			   (h.status OPERATOR(pg_catalog.=) 'pending'
				AND h.due_at OPERATOR(pg_catalog.<=) pg_catalog.now()
				AND NOT EXISTS (SELECT 1 FROM @extschema@.policies p
								 WHERE p.kind OPERATOR(pg_catalog.=) h.kind AND p.paused)) AS head_claimable
		  FROM (SELECT k.ordering_key, k.decided_by, k.ordering_seq, k.command_id, k.run_id, k.status,
					   k.created_at, k.due_at, k.kind,
					   pg_catalog.row_number() OVER (PARTITION BY k.ordering_key, k.decided_by
													 ORDER BY k.ordering_seq) AS place,
					   pg_catalog.count(*) FILTER (WHERE k.status OPERATOR(pg_catalog.=) 'pending'
												   AND k.due_at IS NULL)
						   OVER (PARTITION BY k.ordering_key, k.decided_by) AS waiting
				  FROM @extschema@.commands k
				 WHERE k.ordering_key IS NOT NULL
				   AND k.status OPERATOR(pg_catalog.<>) 'published') h
		 WHERE h.place OPERATOR(pg_catalog.=) 1
		   AND h.waiting OPERATOR(pg_catalog.>) (CASE WHEN h.status OPERATOR(pg_catalog.=) 'pending'
														AND h.due_at IS NULL THEN 1 ELSE 0 END);
		RETURN;
	END IF;
	-- Distributed: no correlated probe (Citus plans none over a shard's
	-- rows), but four steps it runs as multi-shard queries, each one
	-- materialized as an intermediate result: the unfinished commands with
	-- a key, gathered from every shard; their heads, on the node that
	-- asks; for each head's key, the highest place before the head that
	-- commands_key_idx holds, aggregated on each shard and merged; that
	-- command's published_at.
	RETURN QUERY
	WITH k AS MATERIALIZED (
		SELECT c.ordering_key, c.decided_by, c.ordering_seq, c.command_id, c.run_id, c.status,
			   c.created_at, c.due_at, c.kind
		  FROM @extschema@.commands c
		 WHERE c.ordering_key IS NOT NULL
		   AND c.status OPERATOR(pg_catalog.<>) 'published'),
	h AS MATERIALIZED (
		SELECT w.* FROM (
			SELECT k.*, pg_catalog.row_number() OVER (PARTITION BY k.ordering_key, k.decided_by
													  ORDER BY k.ordering_seq) AS place,
				   pg_catalog.count(*) FILTER (WHERE k.status OPERATOR(pg_catalog.=) 'pending'
											   AND k.due_at IS NULL)
					   OVER (PARTITION BY k.ordering_key, k.decided_by) AS waiting
			  FROM k) w
		 WHERE w.place OPERATOR(pg_catalog.=) 1
		   AND w.waiting OPERATOR(pg_catalog.>) (CASE WHEN w.status OPERATOR(pg_catalog.=) 'pending'
														  AND w.due_at IS NULL THEN 1 ELSE 0 END)),
	b AS MATERIALIZED (
		SELECT p.ordering_key, p.decided_by, pg_catalog.max(p.ordering_seq) AS ordering_seq
		  FROM @extschema@.commands p
		  JOIN h ON p.ordering_key OPERATOR(pg_catalog.=) h.ordering_key
			AND p.decided_by OPERATOR(pg_catalog.=) h.decided_by
			AND p.ordering_seq OPERATOR(pg_catalog.<) h.ordering_seq
		 WHERE p.ordering_key IS NOT NULL
		   AND (p.ordering_tail
				OR (p.status OPERATOR(pg_catalog.=) 'pending' AND p.due_at IS NULL)
				OR (p.status OPERATOR(pg_catalog.<>) 'pending' AND p.status OPERATOR(pg_catalog.<>) 'sending'))
		 GROUP BY p.ordering_key, p.decided_by),
	s AS MATERIALIZED (
		SELECT p.ordering_key, p.decided_by, p.published_at
		  FROM @extschema@.commands p
		  JOIN b ON p.ordering_key OPERATOR(pg_catalog.=) b.ordering_key
			AND p.decided_by OPERATOR(pg_catalog.=) b.decided_by
			AND p.ordering_seq OPERATOR(pg_catalog.=) b.ordering_seq
		 WHERE p.ordering_key IS NOT NULL)
	SELECT h.ordering_key::pg_catalog.text, h.command_id, h.run_id, h.status::pg_catalog.text,
		   GREATEST(h.created_at, s.published_at), h.waiting, h.decided_by::pg_catalog.regrole,
		   (h.status OPERATOR(pg_catalog.=) 'pending'
			AND h.due_at OPERATOR(pg_catalog.<=) pg_catalog.now()
			AND NOT EXISTS (SELECT 1 FROM @extschema@.policies y
							 WHERE y.kind OPERATOR(pg_catalog.=) h.kind AND y.paused))
	  FROM h
	  LEFT JOIN s ON s.ordering_key OPERATOR(pg_catalog.=) h.ordering_key
		AND s.decided_by OPERATOR(pg_catalog.=) h.decided_by;
END;
$$;
COMMENT ON FUNCTION @extschema@._blocked_keys()
	IS 'the rows of the view outbox.blocked_keys, on one server or on a distributed outbox';

CREATE VIEW @extschema@.blocked_keys WITH (security_barrier) AS
SELECT b.ordering_key, b.head_command_id, b.head_run_id, b.head_status, b.since,
	   b.waiting, b.decided_by, b.head_claimable
  FROM @extschema@._blocked_keys() b;
COMMENT ON VIEW @extschema@.blocked_keys
	IS 'ordering keys with commands waiting behind their head, with the head''s status and whether it may be claimed now (head_claimable)';

-- Privileges: monitoring roles read, nobody else.
-- What holds the vacuum horizon back: open transactions, prepared
-- transactions and replication slots with an xmin, oldest first.  While one
-- of them lives, vacuum cannot remove the dead row versions that claims and
-- acks leave behind, and the claim index grows.
CREATE VIEW @extschema@.horizon WITH (security_barrier) AS
SELECT 'transaction'::pg_catalog.text AS source, a.pid::pg_catalog.text AS holder,
	   a.usename::pg_catalog.text AS role, a.datname::pg_catalog.text AS database,
	   a.state::pg_catalog.text AS state, pg_catalog.age(a.backend_xmin) AS xmin_age,
	   pg_catalog.now() OPERATOR(pg_catalog.-) a.xact_start AS open_for
  FROM pg_catalog.pg_stat_activity a
 WHERE a.backend_xmin IS NOT NULL
UNION ALL
SELECT 'prepared transaction', p.gid, p.owner::pg_catalog.text, p.database::pg_catalog.text,
	   NULL, pg_catalog.age(p.transaction),
	   pg_catalog.now() OPERATOR(pg_catalog.-) p.prepared
  FROM pg_catalog.pg_prepared_xacts p
UNION ALL
SELECT 'replication slot', s.slot_name::pg_catalog.text, NULL, s.database::pg_catalog.text,
	   CASE WHEN s.active THEN 'active' ELSE 'inactive' END,
	   pg_catalog.age(COALESCE(s.xmin, s.catalog_xmin)), NULL
  FROM pg_catalog.pg_replication_slots s
 WHERE s.xmin IS NOT NULL OR s.catalog_xmin IS NOT NULL
 ORDER BY 6 DESC;
COMMENT ON VIEW @extschema@.horizon
	IS 'what holds the vacuum horizon back (transactions, prepared transactions, replication slots), oldest first';

REVOKE ALL ON
	@extschema@.check_decisions_without_command, @extschema@.check_orphan_commands,
	@extschema@.check_orphan_receipts, @extschema@.check_state,
	@extschema@.check_receipt_overdue, @extschema@.conservation,
	@extschema@.backlog, @extschema@.leases, @extschema@.dead_letters,
	@extschema@.horizon, @extschema@.blocked_keys, @extschema@.check_stream_state
	FROM PUBLIC;
REVOKE ALL ON FUNCTION @extschema@.verify(pg_catalog.bool), @extschema@._blocked_keys() FROM PUBLIC;

DO $$
DECLARE
	admin CONSTANT pg_catalog.text := pg_catalog.quote_ident(@extschema@.role('admin'));
BEGIN
	EXECUTE 'GRANT SELECT ON
	@extschema@.check_decisions_without_command, @extschema@.check_orphan_commands,
	@extschema@.check_orphan_receipts, @extschema@.check_state,
	@extschema@.check_receipt_overdue, @extschema@.conservation,
	@extschema@.backlog, @extschema@.leases, @extschema@.dead_letters,
	@extschema@.horizon, @extschema@.blocked_keys, @extschema@.check_stream_state
	TO pg_monitor, ' OPERATOR(pg_catalog.||) admin;
	EXECUTE 'GRANT EXECUTE ON FUNCTION @extschema@.verify(pg_catalog.bool), @extschema@._blocked_keys()
	TO pg_monitor, ' OPERATOR(pg_catalog.||) admin;
END;
$$;
