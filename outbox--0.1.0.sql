-- outbox install script, part 00: tables and indexes.
--
-- The install script outbox--<version>.sql is the concatenation of the files
-- in src/sql/ in name order (see the Makefile).  Every object is qualified;
-- nothing here depends on the caller's search_path.

\echo Use "CREATE EXTENSION outbox" to load this file. \quit

-- Identifiers (run, command, kind, consumer) are compared byte by byte:
-- their columns use the "C" collation, so the btree keys that every claim,
-- ack and receipt probe compare with memcmp instead of the locale's
-- strcoll, and an operating-system collation update can never reorder (and
-- so corrupt) their indexes.  Comparisons with text of the default
-- collation (parameters, literals, a caller's columns) take "C".
--
-- The event log of each run.  An event that decided a command records the
-- command's id in command_id.
CREATE TABLE @extschema@.events (
	run_id		pg_catalog.text COLLATE pg_catalog."C" NOT NULL,
	seq			pg_catalog.int8 NOT NULL,
	kind		pg_catalog.text COLLATE pg_catalog."C" NOT NULL,
	payload		pg_catalog.jsonb,
	command_id	pg_catalog.text COLLATE pg_catalog."C",
	created_at	pg_catalog.timestamptz NOT NULL DEFAULT pg_catalog.now(),
	CONSTRAINT events_pkey PRIMARY KEY (run_id, seq),
	CONSTRAINT events_seq_check CHECK (seq OPERATOR(pg_catalog.>=) 0)
);
CREATE UNIQUE INDEX events_command_id_key ON @extschema@.events (command_id)
	WHERE command_id IS NOT NULL;

-- The value rules of outbox.commands are domains rather than CHECK
-- constraints of the table: PostgreSQL reads and plans a table's CHECK
-- constraints afresh for every statement that writes the table (the three
-- of commands took about 4% of the backend's time at a batch of 10), and a
-- domain's check once per session.  Operators, parameters and casts treat
-- them as their base types; the views (part 40) show the columns cast to
-- those, since no role is granted USAGE on the domains.  The statuses come
-- from OUTBOX_STATUSES in src/outbox.h (the Makefile fills them in).
CREATE DOMAIN @extschema@.command_status AS pg_catalog.text
	CONSTRAINT command_status_check CHECK (VALUE OPERATOR(pg_catalog.=) ANY
		(ARRAY['pending', 'sending', 'published', 'dead', 'uncertain']::pg_catalog.text[]));
CREATE DOMAIN @extschema@.command_version AS pg_catalog.int8
	CONSTRAINT command_version_check CHECK (VALUE OPERATOR(pg_catalog.>=) 1);
CREATE DOMAIN @extschema@.command_deliveries AS pg_catalog.int4
	CONSTRAINT command_deliveries_check CHECK (VALUE OPERATOR(pg_catalog.>=) 0);

-- The outbox.  Two partial indexes serve claim, one per source of
-- claimable rows: commands_claim_idx holds pending rows by priority and
-- availability (due_at is available_at while pending, NULL otherwise) and
-- commands_lease_idx holds sending rows by lease end (for takeovers and the
-- worker's sweep).  A claim adds one entry to each of commands_pkey and
-- commands_lease_idx, an ack one to commands_pkey only: no other index
-- exists, and no field an ack changes appears in any key.  The fillfactor
-- leaves room on each page for the new row versions.
CREATE TABLE @extschema@.commands (
	command_id	pg_catalog.text COLLATE pg_catalog."C" NOT NULL,
	run_id		pg_catalog.text COLLATE pg_catalog."C" NOT NULL,
	seq			pg_catalog.int8 NOT NULL,
	kind		pg_catalog.text COLLATE pg_catalog."C" NOT NULL,
	status		@extschema@.command_status NOT NULL DEFAULT 'pending',
	version		@extschema@.command_version NOT NULL DEFAULT 1,
	deliveries	@extschema@.command_deliveries NOT NULL DEFAULT 0,
	priority	pg_catalog.int4 NOT NULL DEFAULT 0,
	available_at pg_catalog.timestamptz NOT NULL,
	due_at		pg_catalog.timestamptz,
	lease_until pg_catalog.timestamptz,
	owner		pg_catalog.text,
	created_at	pg_catalog.timestamptz NOT NULL DEFAULT pg_catalog.now(),
	published_at pg_catalog.timestamptz,
	last_error	pg_catalog.text,
	payload		pg_catalog.jsonb NOT NULL,
	CONSTRAINT commands_pkey PRIMARY KEY (command_id)
) WITH (fillfactor = 80);

CREATE INDEX commands_claim_idx ON @extschema@.commands
	(priority DESC, due_at, created_at) WHERE due_at IS NOT NULL;
CREATE INDEX commands_lease_idx ON @extschema@.commands (lease_until)
	WHERE status OPERATOR(pg_catalog.=) 'sending';

-- One completion receipt per command.
CREATE TABLE @extschema@.receipts (
	command_id	pg_catalog.text COLLATE pg_catalog."C" NOT NULL,
	outcome		pg_catalog.text NOT NULL,
	detail		pg_catalog.jsonb,
	completed_at pg_catalog.timestamptz NOT NULL DEFAULT pg_catalog.now(),
	CONSTRAINT receipts_pkey PRIMARY KEY (command_id)
);
-- Drives the retention purge, oldest receipt first.
CREATE INDEX receipts_completed_at_idx ON @extschema@.receipts (completed_at);

-- Commands a consumer has accepted (its deduplication memory).
CREATE TABLE @extschema@.inbox (
	consumer	pg_catalog.text COLLATE pg_catalog."C" NOT NULL,
	command_id	pg_catalog.text COLLATE pg_catalog."C" NOT NULL,
	accepted_at pg_catalog.timestamptz NOT NULL DEFAULT pg_catalog.now(),
	CONSTRAINT inbox_pkey PRIMARY KEY (consumer, command_id)
);

-- Per-kind overrides of the outbox.* settings.  NULL means "use the GUC".
CREATE TABLE @extschema@.policies (
	kind		pg_catalog.text COLLATE pg_catalog."C" NOT NULL,
	max_deliveries pg_catalog.int4,
	backoff_base pg_catalog.interval,
	backoff_max pg_catalog.interval,
	lease		pg_catalog.interval,
	takeover	pg_catalog.text NOT NULL DEFAULT 'auto',
	paused		pg_catalog.bool NOT NULL DEFAULT false,
	retention	pg_catalog.interval,
	CONSTRAINT policies_pkey PRIMARY KEY (kind),
	CONSTRAINT policies_takeover_check CHECK (takeover OPERATOR(pg_catalog.=) ANY
		(ARRAY['auto', 'manual']::pg_catalog.text[])),
	CONSTRAINT policies_max_deliveries_check CHECK (max_deliveries OPERATOR(pg_catalog.>=) 1)
);

-- The paused kinds, read once by every claim.
CREATE INDEX policies_paused_idx ON @extschema@.policies (kind) WHERE paused;

-- Tombstones of purged commands: what the retention purge removed, so that
-- the conservation checks can tell a purged command from a lost one.  Only
-- the purge writes here, and only for a published command with a receipt.
CREATE TABLE @extschema@.purged (
	command_id	pg_catalog.text COLLATE pg_catalog."C" NOT NULL,
	run_id		pg_catalog.text COLLATE pg_catalog."C" NOT NULL,
	seq			pg_catalog.int8 NOT NULL,
	kind		pg_catalog.text COLLATE pg_catalog."C" NOT NULL,
	published_at pg_catalog.timestamptz NOT NULL,
	outcome		pg_catalog.text NOT NULL,
	purged_at	pg_catalog.timestamptz NOT NULL DEFAULT pg_catalog.now(),
	CONSTRAINT purged_pkey PRIMARY KEY (command_id)
);

SELECT pg_catalog.pg_extension_config_dump('@extschema@.events', '');
SELECT pg_catalog.pg_extension_config_dump('@extschema@.commands', '');
SELECT pg_catalog.pg_extension_config_dump('@extschema@.receipts', '');
SELECT pg_catalog.pg_extension_config_dump('@extschema@.inbox', '');
SELECT pg_catalog.pg_extension_config_dump('@extschema@.policies', '');
SELECT pg_catalog.pg_extension_config_dump('@extschema@.purged', '');

COMMENT ON TABLE @extschema@.events IS 'event log of each run; command_id names the command an event decided';
COMMENT ON TABLE @extschema@.commands IS 'the outbox: one row per command, with its lease and delivery state';
COMMENT ON TABLE @extschema@.receipts IS 'one durable completion receipt per command';
COMMENT ON TABLE @extschema@.inbox IS 'commands each consumer has accepted, for exactly-once effects';
COMMENT ON TABLE @extschema@.policies IS 'per-kind overrides: max deliveries, backoff, lease, takeover mode, pause, retention';
COMMENT ON TABLE @extschema@.purged IS 'tombstones of commands removed by the retention purge';
COMMENT ON DOMAIN @extschema@.command_status IS 'a command''s status: pending, sending, published, dead or uncertain';
COMMENT ON DOMAIN @extschema@.command_version IS 'a command''s version, the second half of its lease token (at least 1)';
COMMENT ON DOMAIN @extschema@.command_deliveries IS 'how many times a command was handed to a publisher (not negative)';
COMMENT ON COLUMN @extschema@.commands.due_at IS 'available_at while the command is pending, NULL otherwise (the key of the claim index)';
-- outbox install script, part 05: the four group roles, created when
-- missing (roles are cluster-wide: a second database reuses them).  Later
-- parts grant to them; part 90 holds the privilege model.

DO $$
DECLARE
	r pg_catalog.text;
BEGIN
	FOREACH r IN ARRAY ARRAY['outbox_producer', 'outbox_publisher', 'outbox_consumer', 'outbox_admin']
	LOOP
		IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_roles WHERE rolname OPERATOR(pg_catalog.=) r) THEN
			EXECUTE pg_catalog.format('CREATE ROLE %I NOLOGIN', r);
		END IF;
	END LOOP;
END;
$$;
-- outbox install script, part 10: the producer, publisher and consumer API
-- (C functions).  All are SECURITY DEFINER with a pinned search_path: the
-- callers hold only EXECUTE (see part 90), never a table privilege.
--
-- Their statements run as saved plans through OutboxExecute (src/outbox.c),
-- which keeps the planner on the index plans whenever a plan is (re)made.

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
	priority pg_catalog.int4 DEFAULT 0)
RETURNS void
LANGUAGE c VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS 'MODULE_PATHNAME', 'outbox_commit_decision';
COMMENT ON FUNCTION @extschema@.commit_decision(pg_catalog.text, pg_catalog.int8, pg_catalog.text, pg_catalog.text, pg_catalog.text, pg_catalog.jsonb, pg_catalog.jsonb, pg_catalog.timestamptz, pg_catalog.int4)
	IS 'record an event and the command it decides, atomically, in the caller''s transaction';

CREATE FUNCTION @extschema@.commit_decisions(
	run_ids pg_catalog.text[],
	seqs pg_catalog.int8[],
	event_kinds pg_catalog.text[],
	command_ids pg_catalog.text[],
	command_kinds pg_catalog.text[],
	payloads pg_catalog.jsonb[],
	event_payloads pg_catalog.jsonb[] DEFAULT NULL,
	not_before pg_catalog.timestamptz[] DEFAULT NULL,
	priorities pg_catalog.int4[] DEFAULT NULL)
RETURNS pg_catalog.int4
LANGUAGE c VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS 'MODULE_PATHNAME', 'outbox_commit_decisions';
COMMENT ON FUNCTION @extschema@.commit_decisions(pg_catalog.text[], pg_catalog.int8[], pg_catalog.text[], pg_catalog.text[], pg_catalog.text[], pg_catalog.jsonb[], pg_catalog.jsonb[], pg_catalog.timestamptz[], pg_catalog.int4[])
	IS 'record many decisions (parallel arrays) in one call; all or none';

CREATE FUNCTION @extschema@.record_event(
	run_id pg_catalog.text,
	seq pg_catalog.int8,
	kind pg_catalog.text,
	payload pg_catalog.jsonb DEFAULT NULL)
RETURNS void
LANGUAGE c VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS 'MODULE_PATHNAME', 'outbox_record_event';
COMMENT ON FUNCTION @extschema@.record_event(pg_catalog.text, pg_catalog.int8, pg_catalog.text, pg_catalog.jsonb)
	IS 'record an event that decides no command';

-- Publisher ----------------------------------------------------------------

CREATE TYPE @extschema@.lease AS (
	command_id	pg_catalog.text,
	run_id		pg_catalog.text,
	kind		pg_catalog.text,
	payload		pg_catalog.jsonb,
	version		pg_catalog.int8,
	deliveries	pg_catalog.int4,
	lease_until pg_catalog.timestamptz
);
COMMENT ON TYPE @extschema@.lease IS 'a claimed command: the token (command_id, version) and what to send';

CREATE FUNCTION @extschema@.claim(
	worker pg_catalog.text,
	batch_size pg_catalog.int4 DEFAULT 100,
	lease pg_catalog.interval DEFAULT NULL,
	kinds pg_catalog.text[] DEFAULT NULL)
RETURNS SETOF @extschema@.lease
LANGUAGE c VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
ROWS 100
AS 'MODULE_PATHNAME', 'outbox_claim';
COMMENT ON FUNCTION @extschema@.claim(pg_catalog.text, pg_catalog.int4, pg_catalog.interval, pg_catalog.text[])
	IS 'lease up to batch_size available commands (pending, or sending with an expired lease) to worker';

CREATE FUNCTION @extschema@.ack(
	command_id pg_catalog.text,
	worker pg_catalog.text,
	version pg_catalog.int8)
RETURNS void
LANGUAGE c VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS 'MODULE_PATHNAME', 'outbox_ack';
COMMENT ON FUNCTION @extschema@.ack(pg_catalog.text, pg_catalog.text, pg_catalog.int8)
	IS 'mark a leased command published; raises lease_not_owned for a stale token';

CREATE TYPE @extschema@.ack_result AS (
	command_id	pg_catalog.text,
	acked		pg_catalog.bool,
	reason		pg_catalog.text
);
COMMENT ON TYPE @extschema@.ack_result IS 'outcome of one command of a batch ack: acked, or why not';

CREATE FUNCTION @extschema@.ack(
	worker pg_catalog.text,
	command_ids pg_catalog.text[],
	versions pg_catalog.int8[])
RETURNS SETOF @extschema@.ack_result
LANGUAGE c VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
ROWS 100
AS 'MODULE_PATHNAME', 'outbox_ack_batch';
COMMENT ON FUNCTION @extschema@.ack(pg_catalog.text, pg_catalog.text[], pg_catalog.int8[])
	IS 'mark a batch of leased commands published; reports stale tokens per command instead of raising';

-- Internal: the batch ack's test of a row's token against its arrays.
CREATE FUNCTION @extschema@._ack_token(
	command_ids pg_catalog.text[],
	versions pg_catalog.int8[],
	command_id pg_catalog.text,
	version pg_catalog.int8)
RETURNS pg_catalog.bool
LANGUAGE c IMMUTABLE PARALLEL SAFE
AS 'MODULE_PATHNAME', 'outbox_ack_token';
COMMENT ON FUNCTION @extschema@._ack_token(pg_catalog.text[], pg_catalog.int8[], pg_catalog.text, pg_catalog.int8)
	IS 'internal: whether (command_id, version) is one of the pairs of the two arrays (used by the batch ack)';

CREATE FUNCTION @extschema@.fail(
	command_id pg_catalog.text,
	worker pg_catalog.text,
	version pg_catalog.int8,
	error pg_catalog.text,
	fatal pg_catalog.bool DEFAULT false)
RETURNS pg_catalog.text
LANGUAGE c VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS 'MODULE_PATHNAME', 'outbox_fail';
COMMENT ON FUNCTION @extschema@.fail(pg_catalog.text, pg_catalog.text, pg_catalog.int8, pg_catalog.text, pg_catalog.bool)
	IS 'report a failed delivery: back to pending after a backoff, or dead; returns the new status';

CREATE FUNCTION @extschema@.renew(
	command_id pg_catalog.text,
	worker pg_catalog.text,
	version pg_catalog.int8,
	lease pg_catalog.interval DEFAULT NULL)
RETURNS pg_catalog.timestamptz
LANGUAGE c VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS 'MODULE_PATHNAME', 'outbox_renew';
COMMENT ON FUNCTION @extschema@.renew(pg_catalog.text, pg_catalog.text, pg_catalog.int8, pg_catalog.interval)
	IS 'extend a lease held with the current token; returns the new lease end';

-- Consumer -----------------------------------------------------------------

CREATE FUNCTION @extschema@.complete(
	command_id pg_catalog.text,
	outcome pg_catalog.text DEFAULT 'done',
	detail pg_catalog.jsonb DEFAULT NULL)
RETURNS pg_catalog.bool
LANGUAGE c VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS 'MODULE_PATHNAME', 'outbox_complete';
COMMENT ON FUNCTION @extschema@.complete(pg_catalog.text, pg_catalog.text, pg_catalog.jsonb)
	IS 'record the completion receipt of a command; true the first time, false on a repeat';

CREATE FUNCTION @extschema@.inbox_accept(
	consumer pg_catalog.text,
	command_id pg_catalog.text)
RETURNS pg_catalog.bool
LANGUAGE c VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS 'MODULE_PATHNAME', 'outbox_inbox_accept';
COMMENT ON FUNCTION @extschema@.inbox_accept(pg_catalog.text, pg_catalog.text)
	IS 'true the first time consumer accepts command_id, false on every redelivery';

-- Sweep of expired leases that claim will not take over (the worker calls it
-- every round; an administrator may call it when the worker is not running).
CREATE FUNCTION @extschema@.sweep(batch_size pg_catalog.int4 DEFAULT 1000)
RETURNS pg_catalog.int4
LANGUAGE c VOLATILE SECURITY DEFINER
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
-- outbox install script, part 20: the administrator API.  These run rarely,
-- so they are PL/pgSQL; like the C API they are SECURITY DEFINER with a
-- pinned search_path and qualify every object they use.

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
	ELSIF pg_catalog.octet_length(value) OPERATOR(pg_catalog.>) 200 THEN
		RAISE EXCEPTION '% is too long', name USING ERRCODE = 'invalid_parameter_value',
			DETAIL = pg_catalog.format('The value is %s bytes long; the limit is 200 bytes.',
									   pg_catalog.octet_length(value));
	END IF;
END;
$$;

CREATE FUNCTION @extschema@.requeue(command_id pg_catalog.text)
RETURNS void
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
	st pg_catalog.text;
	-- One reading of the clock: available_at and due_at must be equal.
	now_ts pg_catalog.timestamptz := pg_catalog.clock_timestamp();
BEGIN
	PERFORM @extschema@._require_id(command_id, 'command_id');
	SELECT c.status INTO st FROM @extschema@.commands c
	 WHERE c.command_id OPERATOR(pg_catalog.=) requeue.command_id FOR NO KEY UPDATE;
	IF NOT FOUND THEN
		RAISE EXCEPTION 'command "%" does not exist', command_id
			USING ERRCODE = 'undefined_object';
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
END;
$$;
COMMENT ON FUNCTION @extschema@.requeue(pg_catalog.text)
	IS 'bring a dead or uncertain command back to pending (one more delivery attempt)';

CREATE FUNCTION @extschema@.resolve(command_id pg_catalog.text, resolution pg_catalog.text)
RETURNS void
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
	st pg_catalog.text;
	-- One reading of the clock: a retried command's available_at and due_at
	-- must be equal.
	now_ts pg_catalog.timestamptz := pg_catalog.clock_timestamp();
BEGIN
	PERFORM @extschema@._require_id(command_id, 'command_id');
	PERFORM @extschema@._require(resolution, 'resolution');
	IF resolution OPERATOR(pg_catalog.<>) ALL (ARRAY['published', 'retry', 'dead']) THEN
		RAISE EXCEPTION 'resolution must be published, retry or dead'
			USING ERRCODE = 'invalid_parameter_value',
				  DETAIL = pg_catalog.format('The value was "%s".', resolution);
	END IF;
	SELECT c.status INTO st FROM @extschema@.commands c
	 WHERE c.command_id OPERATOR(pg_catalog.=) resolve.command_id FOR NO KEY UPDATE;
	IF NOT FOUND THEN
		RAISE EXCEPTION 'command "%" does not exist', command_id
			USING ERRCODE = 'undefined_object';
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
END;
$$;
COMMENT ON FUNCTION @extschema@.resolve(pg_catalog.text, pg_catalog.text)
	IS 'settle an uncertain command: published (it was sent), retry (send again) or dead';

CREATE FUNCTION @extschema@.set_policy(
	kind pg_catalog.text,
	max_deliveries pg_catalog.int4 DEFAULT NULL,
	backoff_base pg_catalog.interval DEFAULT NULL,
	backoff_max pg_catalog.interval DEFAULT NULL,
	lease pg_catalog.interval DEFAULT NULL,
	takeover pg_catalog.text DEFAULT NULL,
	retention pg_catalog.interval DEFAULT NULL)
RETURNS void
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
	-- Calling into the module first defines the outbox.* settings read below.
	loaded pg_catalog.bool := @extschema@.preloaded();
BEGIN
	PERFORM @extschema@._require_id(kind, 'kind');
	IF max_deliveries OPERATOR(pg_catalog.<) 1 THEN
		RAISE EXCEPTION 'max_deliveries must be at least 1'
			USING ERRCODE = 'invalid_parameter_value';
	END IF;
	IF backoff_base OPERATOR(pg_catalog.<) '0'::pg_catalog.interval
	   OR backoff_max OPERATOR(pg_catalog.<) '0'::pg_catalog.interval
	   OR retention OPERATOR(pg_catalog.<) '0'::pg_catalog.interval THEN
		RAISE EXCEPTION 'backoff and retention must not be negative'
			USING ERRCODE = 'invalid_parameter_value';
	END IF;
	-- Longer ones mean "never" anyway, and would overflow the time arithmetic.
	IF backoff_base OPERATOR(pg_catalog.>) '100 years'::pg_catalog.interval
	   OR backoff_max OPERATOR(pg_catalog.>) '100 years'::pg_catalog.interval
	   OR retention OPERATOR(pg_catalog.>) '100 years'::pg_catalog.interval THEN
		RAISE EXCEPTION 'backoff and retention must not be longer than 100 years'
			USING ERRCODE = 'invalid_parameter_value';
	END IF;
	IF lease OPERATOR(pg_catalog.<=) '0'::pg_catalog.interval THEN
		RAISE EXCEPTION 'lease must be positive'
			USING ERRCODE = 'invalid_parameter_value';
	END IF;
	IF lease OPERATOR(pg_catalog.>)
			pg_catalog.current_setting('outbox.max_lease')::pg_catalog.interval THEN
		RAISE EXCEPTION 'lease is longer than outbox.max_lease'
			USING ERRCODE = 'invalid_parameter_value';
	END IF;
	IF takeover OPERATOR(pg_catalog.<>) ALL (ARRAY['auto', 'manual']) THEN
		RAISE EXCEPTION 'takeover must be auto or manual'
			USING ERRCODE = 'invalid_parameter_value',
				  DETAIL = pg_catalog.format('The value was "%s".', takeover);
	END IF;
	INSERT INTO @extschema@.policies AS p
		(kind, max_deliveries, backoff_base, backoff_max, lease, takeover, retention)
	VALUES (kind, max_deliveries, backoff_base, backoff_max, lease,
			COALESCE(takeover, 'auto'), retention)
	ON CONFLICT ON CONSTRAINT policies_pkey DO UPDATE
	   SET max_deliveries = COALESCE(EXCLUDED.max_deliveries, p.max_deliveries),
		   backoff_base = COALESCE(EXCLUDED.backoff_base, p.backoff_base),
		   backoff_max = COALESCE(EXCLUDED.backoff_max, p.backoff_max),
		   lease = COALESCE(EXCLUDED.lease, p.lease),
		   takeover = COALESCE(set_policy.takeover, p.takeover),
		   retention = COALESCE(EXCLUDED.retention, p.retention);
END;
$$;
COMMENT ON FUNCTION @extschema@.set_policy(pg_catalog.text, pg_catalog.int4, pg_catalog.interval, pg_catalog.interval, pg_catalog.interval, pg_catalog.text, pg_catalog.interval)
	IS 'set per-kind overrides; a NULL (or omitted) argument keeps the current value';

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
	steer CONSTANT pg_catalog.text[] := ARRAY['enable_seqscan', 'enable_bitmapscan', 'enable_sort', 'jit'];
	saved pg_catalog.text[];
BEGIN
	IF lim OPERATOR(pg_catalog.<) 1 THEN
		RAISE EXCEPTION 'batch_size must be positive' USING ERRCODE = 'invalid_parameter_value';
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

CREATE VIEW @extschema@.workers AS
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
	@extschema@._workers(),
	@extschema@._request_worker()
	FROM PUBLIC;
REVOKE ALL ON @extschema@.stats, @extschema@.workers FROM PUBLIC;

-- The views call their functions with the reader's rights.
GRANT EXECUTE ON FUNCTION @extschema@._stats(), @extschema@._workers()
	TO pg_monitor, outbox_admin;
GRANT SELECT ON @extschema@.stats, @extschema@.workers TO pg_monitor, outbox_admin;
GRANT EXECUTE ON FUNCTION @extschema@.stats_reset() TO outbox_admin;
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
-- unique keys (command_id everywhere; the events also by (run_id, seq)) with
-- NOT EXISTS, which the planner turns into anti-joins: hash anti-joins for a
-- full check of a large outbox, index lookups (commands_pkey, receipts_pkey,
-- purged_pkey, events_pkey, events_command_id_key) when one side is small.
-- No check is a nested loop of scans; the cost grows linearly.
-- The views use only pg_catalog functions, so pg_monitor needs nothing but
-- SELECT on them; they never show a payload.


-- Invariant 1: every event that decided a command has that command, or the
-- tombstone the purge left for exactly that event's command.
CREATE VIEW @extschema@.check_decisions_without_command AS
SELECT e.run_id, e.seq, e.kind, e.command_id, e.created_at
  FROM @extschema@.events e
 WHERE e.command_id IS NOT NULL
   AND NOT EXISTS (SELECT 1 FROM @extschema@.commands c
					WHERE c.command_id OPERATOR(pg_catalog.=) e.command_id)
   AND NOT EXISTS (SELECT 1 FROM @extschema@.purged p
					WHERE p.command_id OPERATOR(pg_catalog.=) e.command_id
					  AND p.run_id OPERATOR(pg_catalog.=) e.run_id
					  AND p.seq OPERATOR(pg_catalog.=) e.seq);
COMMENT ON VIEW @extschema@.check_decisions_without_command
	IS 'conservation check (error): events that decided a command that neither exists nor was purged; empty when healthy';

-- Invariant 2: every command traces to its source event, and that event
-- names this command.  events.command_id is unique, so "the event
-- (run_id, seq) names c" is the same as "the event naming c is
-- (run_id, seq)": the anti-join runs on command_id.
CREATE VIEW @extschema@.check_orphan_commands AS
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
					  AND s.seq OPERATOR(pg_catalog.=) c.seq);
COMMENT ON VIEW @extschema@.check_orphan_commands
	IS 'conservation check (error): commands whose source event (run_id, seq) is missing or does not name them; empty when healthy';
COMMENT ON COLUMN @extschema@.check_orphan_commands.problem
	IS 'event_missing, event_decided_nothing or event_decided_other (event_command_id names it)';

-- Invariant 3: every receipt references an existing command.  The purge
-- removes a receipt with its command, so a tombstone does not excuse one;
-- the purged column tells a receipt the purge left behind from one that
-- never had a command.
CREATE VIEW @extschema@.check_orphan_receipts AS
SELECT r.command_id, r.outcome, r.completed_at,
	   EXISTS (SELECT 1 FROM @extschema@.purged p
				WHERE p.command_id OPERATOR(pg_catalog.=) r.command_id) AS purged
  FROM @extschema@.receipts r
 WHERE NOT EXISTS (SELECT 1 FROM @extschema@.commands c
					WHERE c.command_id OPERATOR(pg_catalog.=) r.command_id);
COMMENT ON VIEW @extschema@.check_orphan_receipts
	IS 'conservation check (error): receipts whose command does not exist; empty when healthy';

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
--   pending_not_claimable             pending, due_at NULL or <> available_at
--                                     (claim would never see it: a lost command)
--   claimable_while_not_pending       not pending, due_at is set (claim would
--                                     hand it out again)
--   dead_without_error                dead or uncertain, last_error is NULL
--   purged_but_present                a tombstone exists for this live command
--                                     (a terminal, purged command came back)
-- The flags are computed in the subquery; their disjunction filters the scan
-- and the rules array is built for the offending rows only.  Tombstones are
-- hashed and probed by the one scan of commands.
CREATE VIEW @extschema@.check_state AS
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
		   CASE WHEN f.r11 THEN 'purged_but_present' END]::pg_catalog.text[], NULL) AS rules,
	   f.owner, f.version::pg_catalog.int8 AS version, f.deliveries::pg_catalog.int4 AS deliveries,
	   f.lease_until, f.published_at,
	   f.available_at, f.due_at
  FROM (SELECT c.command_id, c.status, c.owner, c.version, c.deliveries,
			   c.lease_until, c.published_at, c.available_at, c.due_at,
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
				   AND (c.due_at IS NULL
						OR c.due_at OPERATOR(pg_catalog.<>) c.available_at) AS r8,
			   c.status OPERATOR(pg_catalog.<>) 'pending' AND c.due_at IS NOT NULL AS r9,
			   c.status OPERATOR(pg_catalog.=) ANY (ARRAY['dead', 'uncertain']::pg_catalog.text[])
				   AND c.last_error IS NULL AS r10,
			   p.command_id IS NOT NULL AS r11
		  FROM @extschema@.commands c
		  LEFT JOIN @extschema@.purged p
			ON p.command_id OPERATOR(pg_catalog.=) c.command_id) f
 WHERE f.r1 OR f.r2 OR f.r3 OR f.r4 OR f.r5 OR f.r6 OR f.r7 OR f.r8 OR f.r9
	OR f.r10 OR f.r11;
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
CREATE VIEW @extschema@.check_receipt_overdue AS
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
					WHERE r.command_id OPERATOR(pg_catalog.=) c.command_id);
COMMENT ON VIEW @extschema@.check_receipt_overdue
	IS 'conservation check (warning): published commands without a receipt for longer than outbox.receipt_overdue; empty when healthy';

-- One row per check.  Each check view returns one row per offending command
-- and is read once (a materialized CTE):
-- violations counts its rows, sample holds up to five of the offending
-- command ids, smallest first.
CREATE VIEW @extschema@.conservation AS
WITH d AS MATERIALIZED (SELECT v.command_id AS id FROM @extschema@.check_decisions_without_command v),
	 o AS MATERIALIZED (SELECT v.command_id AS id FROM @extschema@.check_orphan_commands v),
	 r AS MATERIALIZED (SELECT v.command_id AS id FROM @extschema@.check_orphan_receipts v),
	 s AS MATERIALIZED (SELECT v.command_id AS id FROM @extschema@.check_state v),
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
	 (SELECT pg_catalog.count(*) FROM s),
	 ARRAY(SELECT s.id FROM s ORDER BY s.id LIMIT 5),
	 'every command''s status agrees with its owner, lease, publish time, deliveries and version'),
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
CREATE VIEW @extschema@.leases AS
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
CREATE VIEW @extschema@.dead_letters AS
SELECT c.command_id, c.run_id, c.seq, c.kind, c.status::pg_catalog.text AS status,
	   c.deliveries::pg_catalog.int4 AS deliveries, c.version::pg_catalog.int8 AS version,
	   c.owner, c.last_error, c.created_at, c.available_at
  FROM @extschema@.commands c
 WHERE c.status OPERATOR(pg_catalog.=) ANY (ARRAY['dead', 'uncertain']::pg_catalog.text[]);
COMMENT ON VIEW @extschema@.dead_letters
	IS 'dead and uncertain commands with their last error; requeue or resolve them';

-- Privileges: monitoring roles read, nobody else.
-- What holds the vacuum horizon back: open transactions, prepared
-- transactions and replication slots with an xmin, oldest first.  While one
-- of them lives, vacuum cannot remove the dead row versions that claims and
-- acks leave behind, and the claim index grows.
CREATE VIEW @extschema@.horizon AS
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
	@extschema@.horizon
	FROM PUBLIC;
REVOKE ALL ON FUNCTION @extschema@.verify(pg_catalog.bool) FROM PUBLIC;

GRANT SELECT ON
	@extschema@.check_decisions_without_command, @extschema@.check_orphan_commands,
	@extschema@.check_orphan_receipts, @extschema@.check_state,
	@extschema@.check_receipt_overdue, @extschema@.conservation,
	@extschema@.backlog, @extschema@.leases, @extschema@.dead_letters,
	@extschema@.horizon
	TO pg_monitor, outbox_admin;
GRANT EXECUTE ON FUNCTION @extschema@.verify(pg_catalog.bool) TO pg_monitor, outbox_admin;
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
GRANT EXECUTE ON FUNCTION @extschema@.metrics_backlog() TO pg_monitor, outbox_admin;
-- outbox install script, part 90: roles and privileges.
--
-- Four group roles (cluster-wide, created when missing) carry the rights;
-- the DBA grants them to login roles:
--   outbox_producer   commit_decision, commit_decisions, record_event
--   outbox_publisher  claim, ack (both forms), fail, renew
--   outbox_consumer   complete, inbox_accept
--   outbox_admin      requeue, resolve, set_policy, pause, resume, purge,
--                     sweep, stats_reset, verify and every view
-- pg_monitor reads the views and may call verify().  PUBLIC gets nothing,
-- not even USAGE on the schema.  Nobody but the owner has a privilege on a
-- table: the API functions are SECURITY DEFINER, run as the owner and pin
-- search_path to pg_catalog, pg_temp.  Internal helpers (names starting
-- with "_") are called by those functions as the owner and granted to
-- nobody, except _stats() and _workers(), which the views outbox.stats and
-- outbox.workers call with the reader's rights.
--
-- Parts 30 and 40 grant their own objects; the REVOKEs below are the safety
-- net for everything in the schema, and test/pgtap/privileges.sql checks
-- the whole matrix from the catalog.
--
-- Before granting, this part makes sure the privileges will be exactly
-- these: it takes back what the installing role's default privileges gave
-- other roles, and refuses a schema that an untrusted role owns or may
-- create objects in, or that holds objects which are not the extension's.
-- An update script that creates objects must do the same.

-- Default privileges (ALTER DEFAULT PRIVILEGES) of the installing role have
-- added their grants to every object of the script, the schema too when
-- CREATE EXTENSION made it.  Take back those given to other roles (PUBLIC's
-- go below), so that the privileges are exactly the ones granted here and
-- in parts 30 and 40; refuse when they name a role of the matrix, whose
-- intended grants cannot be told from the default ones.
DO $$
DECLARE
	installer pg_catalog.oid := (SELECT e.extowner FROM pg_catalog.pg_extension e
								  WHERE e.extname OPERATOR(pg_catalog.=) 'outbox');
	g record;
	t record;
BEGIN
	FOR g IN
		SELECT DISTINCT r.rolname
		  FROM pg_catalog.pg_default_acl d
		 CROSS JOIN LATERAL pg_catalog.aclexplode(d.defaclacl) a
		  JOIN pg_catalog.pg_roles r ON r.oid OPERATOR(pg_catalog.=) a.grantee
		 WHERE d.defaclrole OPERATOR(pg_catalog.=) installer
		   AND d.defaclnamespace OPERATOR(pg_catalog.=)
			   ANY (ARRAY[0::pg_catalog.oid, '@extschema@'::pg_catalog.regnamespace::pg_catalog.oid])
		   AND a.grantee OPERATOR(pg_catalog.<>) installer
		 ORDER BY r.rolname
	LOOP
		IF g.rolname OPERATOR(pg_catalog.=) ANY (ARRAY['outbox_producer', 'outbox_publisher',
			'outbox_consumer', 'outbox_admin', 'pg_monitor']::pg_catalog.name[]) THEN
			RAISE EXCEPTION 'the default privileges of role "%" grant privileges to role "%"',
				pg_catalog.pg_get_userbyid(installer), g.rolname
				USING ERRCODE = 'insufficient_privilege',
					  HINT = 'Remove them with ALTER DEFAULT PRIVILEGES ... REVOKE before creating the extension.';
		END IF;
		EXECUTE pg_catalog.format('REVOKE ALL ON SCHEMA @extschema@ FROM %I', g.rolname);
		EXECUTE pg_catalog.format('REVOKE ALL ON ALL TABLES IN SCHEMA @extschema@ FROM %I', g.rolname);
		EXECUTE pg_catalog.format('REVOKE ALL ON ALL SEQUENCES IN SCHEMA @extschema@ FROM %I', g.rolname);
		EXECUTE pg_catalog.format('REVOKE ALL ON ALL FUNCTIONS IN SCHEMA @extschema@ FROM %I', g.rolname);
		-- standalone types (a table's row type, array and multirange types
		-- have no privileges of their own)
		FOR t IN
			SELECT ty.oid::pg_catalog.regtype AS name
			  FROM pg_catalog.pg_type ty
			  LEFT JOIN pg_catalog.pg_class c ON c.oid OPERATOR(pg_catalog.=) ty.typrelid
			 WHERE ty.typnamespace OPERATOR(pg_catalog.=) '@extschema@'::pg_catalog.regnamespace
			   AND ty.typcategory OPERATOR(pg_catalog.<>) 'A'
			   AND ty.typtype OPERATOR(pg_catalog.<>) 'm'
			   AND (c.oid IS NULL OR c.relkind OPERATOR(pg_catalog.=) 'c')
		LOOP
			EXECUTE pg_catalog.format('REVOKE ALL ON TYPE %s FROM %I', t.name, g.rolname);
		END LOOP;
		-- (a WARNING: CREATE EXTENSION does not show NOTICEs)
		RAISE WARNING 'revoked what the default privileges of role "%" granted role "%" on the objects of schema "@extschema@"',
			pg_catalog.pg_get_userbyid(installer), g.rolname;
	END LOOP;
END;
$$;

-- The schema must be trustworthy.  CREATE EXTENSION reuses an existing
-- schema named outbox, and whoever owns it could drop the whole outbox with
-- DROP SCHEMA ... CASCADE or add objects next to ours; whoever may create
-- objects in it could add overloads of our functions.  So the owner must be
-- a superuser, no other role may have CREATE on it, and it must hold
-- nothing but the extension's objects.
DO $$
DECLARE
	owner_name pg_catalog.text;
	owner_super pg_catalog.bool;
	creators pg_catalog.text;
	strays pg_catalog.text;
BEGIN
	SELECT r.rolname, r.rolsuper INTO owner_name, owner_super
	  FROM pg_catalog.pg_namespace n
	  JOIN pg_catalog.pg_roles r ON r.oid OPERATOR(pg_catalog.=) n.nspowner
	 WHERE n.nspname OPERATOR(pg_catalog.=) '@extschema@';
	IF NOT owner_super THEN
		RAISE EXCEPTION 'schema "@extschema@" is owned by role "%", which is not a superuser', owner_name
			USING ERRCODE = 'insufficient_privilege',
				  HINT = 'Drop the schema, or make a superuser its owner, before creating the extension.';
	END IF;
	SELECT pg_catalog.string_agg(COALESCE(r.rolname::pg_catalog.text, 'PUBLIC'), ', ' ORDER BY r.rolname)
	  INTO creators
	  FROM pg_catalog.pg_namespace n
	 CROSS JOIN LATERAL pg_catalog.aclexplode(n.nspacl) a
	  LEFT JOIN pg_catalog.pg_roles r ON r.oid OPERATOR(pg_catalog.=) a.grantee
	 WHERE n.nspname OPERATOR(pg_catalog.=) '@extschema@'
	   AND a.privilege_type OPERATOR(pg_catalog.=) 'CREATE'
	   AND NOT COALESCE(r.rolsuper, false);
	IF creators IS NOT NULL THEN
		RAISE EXCEPTION 'roles other than superusers may create objects in schema "@extschema@": %', creators
			USING ERRCODE = 'insufficient_privilege',
				  HINT = 'Revoke CREATE on the schema from them before creating the extension.';
	END IF;
	SELECT pg_catalog.string_agg(pg_catalog.pg_describe_object(o.classid, o.objid, 0), ', '
								 ORDER BY pg_catalog.pg_describe_object(o.classid, o.objid, 0))
	  INTO strays
	  FROM (SELECT 'pg_catalog.pg_proc'::pg_catalog.regclass AS classid, p.oid AS objid
			  FROM pg_catalog.pg_proc p
			 WHERE p.pronamespace OPERATOR(pg_catalog.=) '@extschema@'::pg_catalog.regnamespace
			UNION ALL
			SELECT 'pg_catalog.pg_operator'::pg_catalog.regclass, o.oid
			  FROM pg_catalog.pg_operator o
			 WHERE o.oprnamespace OPERATOR(pg_catalog.=) '@extschema@'::pg_catalog.regnamespace
			UNION ALL
			SELECT 'pg_catalog.pg_class'::pg_catalog.regclass, c.oid
			  FROM pg_catalog.pg_class c
			 WHERE c.relnamespace OPERATOR(pg_catalog.=) '@extschema@'::pg_catalog.regnamespace
			   AND c.relkind OPERATOR(pg_catalog.=) ANY (ARRAY['r', 'p', 'v', 'm', 'f', 'S']::pg_catalog.char[])
			UNION ALL
			SELECT 'pg_catalog.pg_type'::pg_catalog.regclass, t.oid
			  FROM pg_catalog.pg_type t
			  LEFT JOIN pg_catalog.pg_class c ON c.oid OPERATOR(pg_catalog.=) t.typrelid
			 WHERE t.typnamespace OPERATOR(pg_catalog.=) '@extschema@'::pg_catalog.regnamespace
			   AND t.typcategory OPERATOR(pg_catalog.<>) 'A'
			   AND t.typtype OPERATOR(pg_catalog.<>) 'm'
			   AND (c.oid IS NULL OR c.relkind OPERATOR(pg_catalog.=) 'c')) o
	 WHERE NOT EXISTS (SELECT 1 FROM pg_catalog.pg_depend d
						WHERE d.classid OPERATOR(pg_catalog.=) o.classid
						  AND d.objid OPERATOR(pg_catalog.=) o.objid
						  AND d.refclassid OPERATOR(pg_catalog.=) 'pg_catalog.pg_extension'::pg_catalog.regclass
						  AND d.deptype OPERATOR(pg_catalog.=) 'e'
						  AND d.refobjid OPERATOR(pg_catalog.=)
							  (SELECT e.oid FROM pg_catalog.pg_extension e
								WHERE e.extname OPERATOR(pg_catalog.=) 'outbox'));
	IF strays IS NOT NULL THEN
		RAISE EXCEPTION 'schema "@extschema@" holds objects that are not part of the extension: %', strays
			USING ERRCODE = 'insufficient_privilege',
				  HINT = 'Move or drop them before creating the extension.';
	END IF;
END;
$$;

-- PUBLIC: nothing on the schema, its relations, functions and types.
REVOKE ALL ON SCHEMA @extschema@ FROM PUBLIC;
REVOKE ALL ON ALL TABLES IN SCHEMA @extschema@ FROM PUBLIC;
REVOKE ALL ON ALL FUNCTIONS IN SCHEMA @extschema@ FROM PUBLIC;
REVOKE ALL ON TYPE @extschema@.lease, @extschema@.ack_result, @extschema@.command_status,
	@extschema@.command_version, @extschema@.command_deliveries FROM PUBLIC;

GRANT USAGE ON SCHEMA @extschema@ TO outbox_producer, outbox_publisher, outbox_consumer, outbox_admin, pg_monitor;

GRANT EXECUTE ON FUNCTION
	@extschema@.commit_decision(pg_catalog.text, pg_catalog.int8, pg_catalog.text, pg_catalog.text, pg_catalog.text, pg_catalog.jsonb, pg_catalog.jsonb, pg_catalog.timestamptz, pg_catalog.int4),
	@extschema@.commit_decisions(pg_catalog.text[], pg_catalog.int8[], pg_catalog.text[], pg_catalog.text[], pg_catalog.text[], pg_catalog.jsonb[], pg_catalog.jsonb[], pg_catalog.timestamptz[], pg_catalog.int4[]),
	@extschema@.record_event(pg_catalog.text, pg_catalog.int8, pg_catalog.text, pg_catalog.jsonb)
	TO outbox_producer;

GRANT EXECUTE ON FUNCTION
	@extschema@.claim(pg_catalog.text, pg_catalog.int4, pg_catalog.interval, pg_catalog.text[]),
	@extschema@.ack(pg_catalog.text, pg_catalog.text, pg_catalog.int8),
	@extschema@.ack(pg_catalog.text, pg_catalog.text[], pg_catalog.int8[]),
	@extschema@.fail(pg_catalog.text, pg_catalog.text, pg_catalog.int8, pg_catalog.text, pg_catalog.bool),
	@extschema@.renew(pg_catalog.text, pg_catalog.text, pg_catalog.int8, pg_catalog.interval)
	TO outbox_publisher;
-- The result types of claim and the batch ack, for publishers that wrap
-- these calls in functions of their own.
GRANT USAGE ON TYPE @extschema@.lease, @extschema@.ack_result TO outbox_publisher;

GRANT EXECUTE ON FUNCTION
	@extschema@.complete(pg_catalog.text, pg_catalog.text, pg_catalog.jsonb),
	@extschema@.inbox_accept(pg_catalog.text, pg_catalog.text)
	TO outbox_consumer;

GRANT EXECUTE ON FUNCTION
	@extschema@.requeue(pg_catalog.text),
	@extschema@.resolve(pg_catalog.text, pg_catalog.text),
	@extschema@.set_policy(pg_catalog.text, pg_catalog.int4, pg_catalog.interval, pg_catalog.interval, pg_catalog.interval, pg_catalog.text, pg_catalog.interval),
	@extschema@.pause(pg_catalog.text),
	@extschema@.resume(pg_catalog.text),
	@extschema@.purge(pg_catalog.int4, pg_catalog.interval),
	@extschema@.sweep(pg_catalog.int4)
	TO outbox_admin;

-- The informational function is harmless for anyone with schema usage.
GRANT EXECUTE ON FUNCTION @extschema@.preloaded()
	TO outbox_producer, outbox_publisher, outbox_consumer, outbox_admin, pg_monitor;
