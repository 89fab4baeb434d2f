-- outbox install script, part 10: the producer, publisher and consumer API
-- (C functions).  All are SECURITY INVOKER with a pinned search_path, so
-- current_user at the call site is the role a call is made by; their C
-- body switches to the function's owner (OutboxCallAsOwner, src/args.c) and
-- is told the calling role.  The callers hold only EXECUTE (see part 90),
-- never a table privilege.
--
-- Their statements run as saved plans through OutboxExecute (src/outbox.c),
-- which keeps the planner on the index plans whenever a plan is (re)made.
--
-- A C function whose arguments or result changed between versions gets a
-- new symbol with the version suffix (outbox_ack_1_0), as
-- pg_stat_statements does: between the installation of a new library and
-- ALTER EXTENSION outbox UPDATE, an older declaration then fails with
-- "could not find function" instead of handing the new code arguments of
-- other types.

-- Producer -----------------------------------------------------------------

CREATE FUNCTION @extschema@.commit_decision(
	run_id pg_catalog.text,
	seq pg_catalog.int8,
	event_kind pg_catalog.text,
	command_id pg_catalog.text,
	command_kind pg_catalog.text,
	payload pg_catalog.jsonb,
	event_payload pg_catalog.jsonb DEFAULT NULL,
	not_before pg_catalog.timestamptz DEFAULT NULL,
	priority pg_catalog.int4 DEFAULT 0,
	headers pg_catalog.jsonb DEFAULT NULL,
	ordering_key pg_catalog.text DEFAULT NULL)
RETURNS pg_catalog.bool
LANGUAGE c VOLATILE SECURITY INVOKER
SET search_path = pg_catalog, pg_temp
AS 'MODULE_PATHNAME', 'outbox_commit_decision_1_0';
COMMENT ON FUNCTION @extschema@.commit_decision(pg_catalog.text, pg_catalog.int8, pg_catalog.text, pg_catalog.text, pg_catalog.text, pg_catalog.jsonb, pg_catalog.jsonb, pg_catalog.timestamptz, pg_catalog.int4, pg_catalog.jsonb, pg_catalog.text)
	IS 'record an event and the command it decides, atomically, in the caller''s transaction; false when the same role recorded the same decision before';

CREATE TYPE @extschema@.decision_result AS (
	ord			pg_catalog.int4,
	command_id	pg_catalog.text,
	recorded	pg_catalog.bool
);
COMMENT ON TYPE @extschema@.decision_result IS 'outcome of one decision of commit_decisions: recorded, or false for a retry of the caller''s own decision';

CREATE FUNCTION @extschema@.commit_decisions(decisions pg_catalog.jsonb)
RETURNS SETOF @extschema@.decision_result
LANGUAGE c VOLATILE SECURITY INVOKER
SET search_path = pg_catalog, pg_temp
ROWS 100
AS 'MODULE_PATHNAME', 'outbox_commit_decisions_1_0';
COMMENT ON FUNCTION @extschema@.commit_decisions(pg_catalog.jsonb)
	IS 'record many decisions (a JSON array of objects) in one call; all or none; a row per decision';

-- Internal: tell every backend, at commit, that the policies changed (the
-- producer keeps whether any kind has deciders until then).
CREATE FUNCTION @extschema@._policies_changed()
RETURNS void
LANGUAGE c VOLATILE
AS 'MODULE_PATHNAME', 'outbox_policies_changed';
COMMENT ON FUNCTION @extschema@._policies_changed()
	IS 'internal: a relcache invalidation of outbox.policies at commit (set_policy calls it)';

-- Internal: whether a role may act on a kind whose policy lists roles.
CREATE FUNCTION @extschema@._may(roles pg_catalog.regrole[], caller pg_catalog.oid)
RETURNS pg_catalog.bool
LANGUAGE c STABLE PARALLEL SAFE
AS 'MODULE_PATHNAME', 'outbox_may';
COMMENT ON FUNCTION @extschema@._may(pg_catalog.regrole[], pg_catalog.oid)
	IS 'internal: whether caller is a member of one of roles (NULL: anyone) or an outbox admin of this database';

CREATE FUNCTION @extschema@.record_event(
	run_id pg_catalog.text,
	seq pg_catalog.int8,
	kind pg_catalog.text,
	payload pg_catalog.jsonb DEFAULT NULL)
RETURNS void
LANGUAGE c VOLATILE SECURITY INVOKER
SET search_path = pg_catalog, pg_temp
AS 'MODULE_PATHNAME', 'outbox_record_event';
COMMENT ON FUNCTION @extschema@.record_event(pg_catalog.text, pg_catalog.int8, pg_catalog.text, pg_catalog.jsonb)
	IS 'record an event that decides no command';

-- Publisher ----------------------------------------------------------------

CREATE TYPE @extschema@.lease AS (
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
	ordering_key pg_catalog.text
);
COMMENT ON TYPE @extschema@.lease IS 'a claimed command: what to send, and the token that ack, fail and renew require';

CREATE FUNCTION @extschema@.claim(
	worker pg_catalog.text,
	batch_size pg_catalog.int4 DEFAULT 100,
	lease pg_catalog.interval DEFAULT NULL,
	kinds pg_catalog.text[] DEFAULT NULL)
RETURNS SETOF @extschema@.lease
LANGUAGE c VOLATILE SECURITY INVOKER
SET search_path = pg_catalog, pg_temp
ROWS 100
AS 'MODULE_PATHNAME', 'outbox_claim_1_0';
COMMENT ON FUNCTION @extschema@.claim(pg_catalog.text, pg_catalog.int4, pg_catalog.interval, pg_catalog.text[])
	IS 'lease up to batch_size available commands (pending, or sending with an expired lease) to worker';

-- Internal: SipHash-2-4 (the lease tokens' MAC), for the test of its vectors.
CREATE FUNCTION @extschema@._siphash(key pg_catalog.bytea, message pg_catalog.bytea, bytes pg_catalog.int4)
RETURNS pg_catalog.bytea
LANGUAGE c IMMUTABLE PARALLEL SAFE
AS 'MODULE_PATHNAME', 'outbox_siphash';
COMMENT ON FUNCTION @extschema@._siphash(pg_catalog.bytea, pg_catalog.bytea, pg_catalog.int4)
	IS 'internal: SipHash-2-4 of message under a 16-byte key, 8 or 16 bytes (the MAC of the lease tokens)';

-- Internal: an error text fit for last_error, cut as fail cuts it (at most
-- OUTBOX_MAX_ERROR_LEN bytes, on a character boundary, ending with
-- " [... cut]"); with a note, the error is cut so that the note, appended,
-- fits too.  The stream path's failures use it.
CREATE FUNCTION @extschema@._error_text(error pg_catalog.text, note pg_catalog.text DEFAULT NULL)
RETURNS pg_catalog.text
LANGUAGE c IMMUTABLE PARALLEL SAFE
AS 'MODULE_PATHNAME', 'outbox_error_text';
COMMENT ON FUNCTION @extschema@._error_text(pg_catalog.text, pg_catalog.text)
	IS 'internal: an error text cut to at most OUTBOX_MAX_ERROR_LEN bytes on a character boundary, with a mark; with a note, cut so that the note appended fits too';

-- Admin: a new lease key; every token handed out before is refused.
CREATE FUNCTION @extschema@.rotate_lease_key()
RETURNS void
LANGUAGE c VOLATILE SECURITY INVOKER
SET search_path = pg_catalog, pg_temp
AS 'MODULE_PATHNAME', 'outbox_rotate_lease_key';
COMMENT ON FUNCTION @extschema@.rotate_lease_key()
	IS 'replace the lease key: every live lease''s token is refused (OB001) and the lease is taken over once it ends';

CREATE FUNCTION @extschema@.ack(
	worker pg_catalog.text,
	token pg_catalog.text)
RETURNS void
LANGUAGE c VOLATILE SECURITY INVOKER
SET search_path = pg_catalog, pg_temp
AS 'MODULE_PATHNAME', 'outbox_ack_1_0';
COMMENT ON FUNCTION @extschema@.ack(pg_catalog.text, pg_catalog.text)
	IS 'mark a leased command published; raises OB001 (lease_not_owned) for a token the caller does not hold';

CREATE TYPE @extschema@.ack_result AS (
	command_id	pg_catalog.text,
	run_id		pg_catalog.text,
	acked		pg_catalog.bool,
	reason		pg_catalog.text
);
COMMENT ON TYPE @extschema@.ack_result IS 'outcome of one token of ack_many: acked, or why not (lease_not_owned, invalid_token)';

CREATE FUNCTION @extschema@.ack_many(
	worker pg_catalog.text,
	tokens pg_catalog.text[])
RETURNS SETOF @extschema@.ack_result
LANGUAGE c VOLATILE SECURITY INVOKER
SET search_path = pg_catalog, pg_temp
ROWS 100
AS 'MODULE_PATHNAME', 'outbox_ack_many';
COMMENT ON FUNCTION @extschema@.ack_many(pg_catalog.text, pg_catalog.text[])
	IS 'mark a batch of leased commands published; reports each refused token instead of raising';

CREATE TYPE @extschema@.handover_result AS (
	command_id	pg_catalog.text,
	run_id		pg_catalog.text,
	acked		pg_catalog.bool,
	reason		pg_catalog.text,
	seq			pg_catalog.int8,
	kind		pg_catalog.text,
	payload		pg_catalog.jsonb,
	token		pg_catalog.text,
	version		pg_catalog.int8,
	deliveries	pg_catalog.int4,
	lease_until pg_catalog.timestamptz,
	headers		pg_catalog.jsonb,
	ordering_key pg_catalog.text
);
COMMENT ON TYPE @extschema@.handover_result IS 'a row of ack_handover: the outcome of one token (as ack_result; token NULL), or a lease handed over (acked NULL; the lease''s columns)';

-- ack_many that hands the acked heads' next commands over to the caller
-- (src/keys.c, OutboxHandOverNext): each is leased to worker, in the same
-- statement, when a claim(worker, batch_size, lease, kinds) by the caller
-- could lease it now; otherwise it is released as ack_many releases it.
CREATE FUNCTION @extschema@.ack_handover(
	worker pg_catalog.text,
	tokens pg_catalog.text[],
	batch_size pg_catalog.int4 DEFAULT 100,
	lease pg_catalog.interval DEFAULT NULL,
	kinds pg_catalog.text[] DEFAULT NULL)
RETURNS SETOF @extschema@.handover_result
LANGUAGE c VOLATILE SECURITY INVOKER
SET search_path = pg_catalog, pg_temp
ROWS 200
AS 'MODULE_PATHNAME', 'outbox_ack_handover';
COMMENT ON FUNCTION @extschema@.ack_handover(pg_catalog.text, pg_catalog.text[], pg_catalog.int4, pg_catalog.interval, pg_catalog.text[])
	IS 'ack_many that leases the next command of each acked ordering key''s head to worker when a claim by the caller could take it now; a row per token, then a row per lease handed over';

CREATE FUNCTION @extschema@.fail(
	worker pg_catalog.text,
	token pg_catalog.text,
	error pg_catalog.text,
	fatal pg_catalog.bool DEFAULT false)
RETURNS pg_catalog.text
LANGUAGE c VOLATILE SECURITY INVOKER
SET search_path = pg_catalog, pg_temp
AS 'MODULE_PATHNAME', 'outbox_fail_1_0';
COMMENT ON FUNCTION @extschema@.fail(pg_catalog.text, pg_catalog.text, pg_catalog.text, pg_catalog.bool)
	IS 'report a failed delivery: back to pending after a backoff, or dead; returns the new status';

CREATE FUNCTION @extschema@.renew(
	worker pg_catalog.text,
	token pg_catalog.text,
	lease pg_catalog.interval DEFAULT NULL)
RETURNS pg_catalog.timestamptz
LANGUAGE c VOLATILE SECURITY INVOKER
SET search_path = pg_catalog, pg_temp
AS 'MODULE_PATHNAME', 'outbox_renew_1_0';
COMMENT ON FUNCTION @extschema@.renew(pg_catalog.text, pg_catalog.text, pg_catalog.interval)
	IS 'extend a lease held with its token; returns the new lease end';

-- Ordering keys (src/keys.c) -------------------------------------------------

-- Admin: take a dead head out of its key and release the next command.  A
-- key belongs to the role that decides: decided_by NULL is the one role with
-- an unfinished command on the key.
CREATE FUNCTION @extschema@.skip_head(ordering_key pg_catalog.text, decided_by pg_catalog.regrole DEFAULT NULL)
RETURNS pg_catalog.text
LANGUAGE c VOLATILE SECURITY INVOKER
SET search_path = pg_catalog, pg_temp
AS 'MODULE_PATHNAME', 'outbox_skip_head';
COMMENT ON FUNCTION @extschema@.skip_head(pg_catalog.text, pg_catalog.regrole)
	IS 'take the dead head of an ordering key (of the role decided_by) out of the key and make the next command claimable; returns the skipped command_id';

-- Internal: release the command after a published head (resolve calls it).
CREATE FUNCTION @extschema@._release_key(ordering_key pg_catalog.text, ordering_seq pg_catalog.int8, decided_by pg_catalog.oid)
RETURNS void
LANGUAGE c VOLATILE
AS 'MODULE_PATHNAME', 'outbox_release_key';
COMMENT ON FUNCTION @extschema@._release_key(pg_catalog.text, pg_catalog.int8, pg_catalog.oid)
	IS 'internal: under the key''s lock, make the command after ordering_seq of the key (decided_by, ordering_key) claimable if it waits';

-- Consumer -----------------------------------------------------------------

CREATE FUNCTION @extschema@.complete(
	run_id pg_catalog.text,
	command_id pg_catalog.text,
	outcome pg_catalog.text DEFAULT 'done',
	detail pg_catalog.jsonb DEFAULT NULL)
RETURNS pg_catalog.bool
LANGUAGE c VOLATILE SECURITY INVOKER
SET search_path = pg_catalog, pg_temp
AS 'MODULE_PATHNAME', 'outbox_complete_1_0';
COMMENT ON FUNCTION @extschema@.complete(pg_catalog.text, pg_catalog.text, pg_catalog.text, pg_catalog.jsonb)
	IS 'record the completion receipt of a command; true the first time, false on a repeat';

CREATE FUNCTION @extschema@.inbox_accept(
	consumer pg_catalog.text,
	run_id pg_catalog.text,
	command_id pg_catalog.text)
RETURNS pg_catalog.bool
LANGUAGE c VOLATILE SECURITY INVOKER
SET search_path = pg_catalog, pg_temp
AS 'MODULE_PATHNAME', 'outbox_inbox_accept_1_0';
COMMENT ON FUNCTION @extschema@.inbox_accept(pg_catalog.text, pg_catalog.text, pg_catalog.text)
	IS 'true the first time consumer (registered to a role of the caller) accepts the command, false on every redelivery';

-- Sweep of expired leases that claim will not take over (the worker calls it
-- every round; an administrator may call it when the worker is not running).
CREATE FUNCTION @extschema@.sweep(batch_size pg_catalog.int4 DEFAULT 1000)
RETURNS pg_catalog.int4
LANGUAGE c VOLATILE SECURITY INVOKER
SET search_path = pg_catalog, pg_temp
AS 'MODULE_PATHNAME', 'outbox_sweep';
COMMENT ON FUNCTION @extschema@.sweep(pg_catalog.int4)
	IS 'settle expired leases claim will not take over: to dead (deliveries used up) or uncertain (manual takeover)';

CREATE FUNCTION @extschema@.preloaded()
RETURNS pg_catalog.bool
LANGUAGE c STABLE
AS 'MODULE_PATHNAME', 'outbox_preloaded';
COMMENT ON FUNCTION @extschema@.preloaded()
	IS 'true when the library is in shared_preload_libraries (statistics and worker available)';
