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
		(ARRAY[@OUTBOX_STATUSES@]::pg_catalog.text[]));
CREATE DOMAIN @extschema@.command_version AS pg_catalog.int8
	CONSTRAINT command_version_check CHECK (VALUE OPERATOR(pg_catalog.>=) 1);
CREATE DOMAIN @extschema@.command_deliveries AS pg_catalog.int4
	CONSTRAINT command_deliveries_check CHECK (VALUE OPERATOR(pg_catalog.>=) 0);

-- The outbox.  Two partial indexes serve claim, one per source of
-- claimable rows: commands_claim_idx holds pending rows by priority and
-- availability (due_at is available_at while pending, NULL otherwise) and
-- commands_lease_idx holds sending rows by lease end (for takeovers and the
-- worker's sweep).  A claim adds one entry to each of commands_pkey and
-- commands_lease_idx, an ack one to commands_pkey only: the other indexes
-- (commands_held_idx, and commands_key_idx for the commands with an
-- ordering key) get none from the claim or ack of an unordered command, and
-- no field an ack changes appears in any key.  The fillfactor
-- leaves room on each page for the new row versions.  A lease's token is
-- not stored: it carries the claiming role, the version, the run_id and the
-- command_id, and a MAC of them and of the worker name under the key in
-- outbox.lease_key; ack, fail and renew find the row by commands_pkey.  A
-- claim writes no column that 0.1.0 did not write.
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
	decided_by	pg_catalog.oid,
	headers		pg_catalog.jsonb,
	ordering_key pg_catalog.text COLLATE pg_catalog."C",
	ordering_seq pg_catalog.int8,
	ordering_tail pg_catalog.bool,
	CONSTRAINT commands_pkey PRIMARY KEY (command_id)
) WITH (fillfactor = 80);

-- Both claim indexes carry kind as a non-key column (INCLUDE), so that
-- outbox.metrics_backlog() of part 45 counts the pending and the sending
-- commands by kind with index-only scans of them.  Not a key column: the
-- commands of one batch of decisions share their times, and among equal
-- keys a B-tree keeps the order of insertion (the heap TID), which is the
-- order in which the claim takes them; kind as a last key would put one
-- kind of such a batch before the other.  (An index with INCLUDE columns
-- is not deduplicated, so such a batch takes an entry per command.)
CREATE INDEX commands_claim_idx ON @extschema@.commands
	(priority DESC, due_at, created_at) INCLUDE (kind) WHERE due_at IS NOT NULL;
CREATE INDEX commands_lease_idx ON @extschema@.commands (lease_until) INCLUDE (kind)
	WHERE status OPERATOR(pg_catalog.=) 'sending';

-- The commands that are neither claimable nor leased and not published:
-- dead, uncertain, and waiting (pending behind an earlier command of their
-- ordering key, due_at NULL), by kind and status, for metrics_backlog with
-- an index-only scan (status is in the key, in the "C" collation like
-- every text key of the extension).  A command enters it when it is
-- decided waiting or goes dead or uncertain, and leaves it when it becomes
-- due or is requeued or resolved: a claim or an ack never writes to it,
-- and neither does the decision of a command that is due.  Its columns
-- and predicate are all in other indexes too (keys, INCLUDE columns or
-- predicates), so it makes no update that was HOT non-HOT.
CREATE INDEX commands_held_idx ON @extschema@.commands (kind, status COLLATE pg_catalog."C")
	WHERE status OPERATOR(pg_catalog.=) ANY (ARRAY['dead', 'uncertain']::pg_catalog.text[])
	   OR (status OPERATOR(pg_catalog.=) 'pending' AND due_at IS NULL);
COMMENT ON INDEX @extschema@.commands_held_idx
	IS 'dead, uncertain and waiting commands by kind and status (read by outbox.metrics_backlog with an index-only scan)';

-- The commands of each ordering key in their order (src/keys.c): the
-- producer reads a key's last command, the release of a published head its
-- next one.  A command without a key (ordering_key NULL) has no entry, so
-- unordered commands write nothing here.  Nor does a head in the two
-- states every ordered command passes through, pending and due, then
-- sending, unless it was its key's last command when it became the head
-- (ordering_tail): a head with commands waiting behind it is found through
-- them, so the release of the next command and its claim add no entry
-- here, and its ack one (published).  The key's last command is always in
-- the index (waiting, published, dead, uncertain, or marked).
CREATE INDEX commands_key_idx ON @extschema@.commands (ordering_key, decided_by, ordering_seq)
	WHERE ordering_key IS NOT NULL
	  AND (ordering_tail
		   OR (status OPERATOR(pg_catalog.=) 'pending' AND due_at IS NULL)
		   OR (status OPERATOR(pg_catalog.<>) 'pending' AND status OPERATOR(pg_catalog.<>) 'sending'));
COMMENT ON INDEX @extschema@.commands_key_idx
	IS 'commands with an ordering key that are waiting, published, dead or uncertain, or marked as their key''s last head (ordering_tail), by key, deciding role and place in the key (read by the producer and the release of a head)';

-- One completion receipt per command.  run_id is the command's run: the
-- column a distributed outbox is sharded by (docs/citus.md); on a single
-- server command_id alone is the key, as it is unique across runs there.
CREATE TABLE @extschema@.receipts (
	command_id	pg_catalog.text COLLATE pg_catalog."C" NOT NULL,
	outcome		pg_catalog.text NOT NULL,
	detail		pg_catalog.jsonb,
	completed_at pg_catalog.timestamptz NOT NULL DEFAULT pg_catalog.now(),
	run_id		pg_catalog.text COLLATE pg_catalog."C" NOT NULL,
	CONSTRAINT receipts_pkey PRIMARY KEY (command_id)
);
-- Drives the retention purge, oldest receipt first.
CREATE INDEX receipts_completed_at_idx ON @extschema@.receipts (completed_at);

-- Commands a consumer has accepted (its deduplication memory), with the
-- command's run (the distribution column on Citus, as for receipts).
CREATE TABLE @extschema@.inbox (
	consumer	pg_catalog.text COLLATE pg_catalog."C" NOT NULL,
	command_id	pg_catalog.text COLLATE pg_catalog."C" NOT NULL,
	accepted_at pg_catalog.timestamptz NOT NULL DEFAULT pg_catalog.now(),
	run_id		pg_catalog.text COLLATE pg_catalog."C" NOT NULL,
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
	deciders	pg_catalog.regrole[],
	claimers	pg_catalog.regrole[],
	completers	pg_catalog.regrole[],
	ordered_by_run pg_catalog.bool NOT NULL DEFAULT false,
	stream		pg_catalog.text COLLATE pg_catalog."C",
	CONSTRAINT policies_pkey PRIMARY KEY (kind),
	CONSTRAINT policies_takeover_check CHECK (takeover OPERATOR(pg_catalog.=) ANY
		(ARRAY['auto', 'manual']::pg_catalog.text[])),
	CONSTRAINT policies_max_deliveries_check CHECK (max_deliveries OPERATOR(pg_catalog.>=) 1)
);

-- The paused kinds and the kinds with claimers, read once by every claim.
CREATE INDEX policies_paused_idx ON @extschema@.policies (kind) WHERE paused;
CREATE INDEX policies_claimers_idx ON @extschema@.policies (kind) WHERE claimers IS NOT NULL;
-- Whether any kind has deciders, read once per backend by the producer
-- until set_policy says the policies changed.
CREATE INDEX policies_deciders_idx ON @extschema@.policies (kind) WHERE deciders IS NOT NULL;
-- The kinds written to a stream, read once per backend by the producer.
CREATE INDEX policies_stream_idx ON @extschema@.policies (kind) WHERE stream IS NOT NULL;

-- Consumer names, each registered to the role whose members may use it in
-- inbox_accept.
CREATE TABLE @extschema@.consumers (
	consumer	pg_catalog.text COLLATE pg_catalog."C" NOT NULL,
	role		pg_catalog.regrole NOT NULL,
	registered_at pg_catalog.timestamptz NOT NULL DEFAULT pg_catalog.now(),
	CONSTRAINT consumers_pkey PRIMARY KEY (consumer)
);

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

-- The conservation checks as the background worker last counted them
-- (outbox.metrics_checks() and _check_run() of part 45 say how).  One row
-- per check view of part 40.  Not dumped: a restored database has NULL
-- counts until its worker counts again.
CREATE TABLE @extschema@.check_results (
	check_name	pg_catalog.text COLLATE pg_catalog."C" NOT NULL,
	severity	pg_catalog.text NOT NULL,
	violations	pg_catalog.int8,
	computed_at pg_catalog.timestamptz,
	duration_seconds pg_catalog.float8,
	CONSTRAINT check_results_pkey PRIMARY KEY (check_name)
);
COMMENT ON TABLE @extschema@.check_results
	IS 'per conservation check: violations counted by the background worker, when, and how long the count took';
INSERT INTO @extschema@.check_results (check_name, severity) VALUES
	('decisions_without_command', 'error'),
	('orphan_commands', 'error'),
	('orphan_receipts', 'error'),
	('state', 'error'),
	('receipt_overdue', 'warning');

-- The database's lease key: 16 random bytes (from gen_random_uuid, which
-- draws on pg_strong_random, hashed to 128 bits), the key of the lease
-- tokens' MAC.  One row; only the owner reads it.  Not registered for
-- pg_dump: a restore makes a key of its own (the tokens of the dumped
-- leases fail, and the leases are taken over once they end).
CREATE TABLE @extschema@.lease_key (
	one			pg_catalog.bool NOT NULL DEFAULT true,
	key			pg_catalog.bytea NOT NULL,
	made_at		pg_catalog.timestamptz NOT NULL DEFAULT pg_catalog.now(),
	CONSTRAINT lease_key_pkey PRIMARY KEY (one),
	CONSTRAINT lease_key_one CHECK (one),
	CONSTRAINT lease_key_length CHECK (pg_catalog.length(key) OPERATOR(pg_catalog.=) 16)
);
INSERT INTO @extschema@.lease_key (key)
	SELECT pg_catalog.substring(pg_catalog.sha256(pg_catalog.uuid_send(pg_catalog.gen_random_uuid())
		OPERATOR(pg_catalog.||) pg_catalog.uuid_send(pg_catalog.gen_random_uuid())), 1, 16);
COMMENT ON TABLE @extschema@.lease_key
	IS 'the key of the lease tokens'' MAC (one row, read by the owner only; outbox.rotate_lease_key() replaces it)';

-- Streams, the write-once path (docs/streams.md).  A kind with a stream
-- (policies.stream) has its commands appended to the stream log instead of
-- outbox.commands: three tables used in turn (stream_log_0..2, the
-- current one named by stream_rotation), each row written once and never
-- updated, removed a whole table at a time by TRUNCATE.  The tables are
-- made here, not at run time, so that they are members of the extension
-- (pg_dump keeps their rows).  A row carries the writing transaction's id
-- (xid, pg_current_xact_id()), the partition (a hash of the ordering key,
-- else of the run_id, modulo the stream's partitions) and the command.
-- command_id stays unique through events_command_id_key (every command has
-- its event), so the log has no unique index: one index serves the batches
-- (stream, partition, xid) and one finds a command by id (receipts,
-- retries of the producer, the checks).  part_ticks[part + 1] is the last
-- tick in which partition part got commands (0: none yet), written by the
-- tick, so that a claim goes straight to a partition with work.
CREATE TABLE @extschema@.streams (
	stream		pg_catalog.text COLLATE pg_catalog."C" NOT NULL,
	stream_id	pg_catalog.int4 NOT NULL,
	partitions	pg_catalog.int4 NOT NULL,
	batch_size	pg_catalog.int4 NOT NULL,
	created_at	pg_catalog.timestamptz NOT NULL DEFAULT pg_catalog.now(),
	part_ticks	pg_catalog.int8[] NOT NULL DEFAULT '{}',
	CONSTRAINT streams_pkey PRIMARY KEY (stream),
	CONSTRAINT streams_stream_id_key UNIQUE (stream_id),
	CONSTRAINT streams_partitions_check CHECK (partitions OPERATOR(pg_catalog.>=) 1 AND partitions OPERATOR(pg_catalog.<=) 256),
	CONSTRAINT streams_batch_size_check CHECK (batch_size OPERATOR(pg_catalog.>=) 1)
);

-- The subscriptions of the streams: each publishes every command of its
-- stream decided after the tick it starts at (start_tick).
CREATE TABLE @extschema@.subscriptions (
	subscription pg_catalog.text COLLATE pg_catalog."C" NOT NULL,
	stream		pg_catalog.text COLLATE pg_catalog."C" NOT NULL,
	claimers	pg_catalog.regrole[],
	start_tick	pg_catalog.int8 NOT NULL,
	created_at	pg_catalog.timestamptz NOT NULL DEFAULT pg_catalog.now(),
	CONSTRAINT subscriptions_pkey PRIMARY KEY (subscription)
);
CREATE INDEX subscriptions_stream_idx ON @extschema@.subscriptions (stream);

-- The ticks of each stream: the snapshot (pg_current_snapshot()) the
-- background worker took when it cut the tick, and the log's id sequence
-- then (for the size of a batch).  A batch of a partition is the commands
-- of that partition visible in one tick's snapshot and not in an earlier
-- one's, so a transaction that commits late is in the first tick that
-- sees it, never skipped.
CREATE TABLE @extschema@.stream_ticks (
	stream_id	pg_catalog.int4 NOT NULL,
	tick		pg_catalog.int8 NOT NULL,
	snap		pg_catalog.pg_snapshot NOT NULL,
	last_id		pg_catalog.int8 NOT NULL,
	made_at		pg_catalog.timestamptz NOT NULL DEFAULT pg_catalog.now(),
	CONSTRAINT stream_ticks_pkey PRIMARY KEY (stream_id, tick)
);

-- The order of the log (ids from one sequence: a transaction's commands in
-- their order, and a command decided after another committed comes after it).
CREATE SEQUENCE @extschema@.stream_log_id_seq;

CREATE TABLE @extschema@.stream_log_0 (
	id			pg_catalog.int8 NOT NULL,
	xid			pg_catalog.xid8 NOT NULL,
	stream_id	pg_catalog.int4 NOT NULL,
	part		pg_catalog.int4 NOT NULL,
	command_id	pg_catalog.text COLLATE pg_catalog."C" NOT NULL,
	run_id		pg_catalog.text COLLATE pg_catalog."C" NOT NULL,
	seq			pg_catalog.int8 NOT NULL,
	kind		pg_catalog.text COLLATE pg_catalog."C" NOT NULL,
	payload		pg_catalog.jsonb NOT NULL,
	headers		pg_catalog.jsonb,
	ordering_key pg_catalog.text COLLATE pg_catalog."C",
	decided_by	pg_catalog.oid,
	created_at	pg_catalog.timestamptz NOT NULL DEFAULT pg_catalog.now()
);
CREATE INDEX stream_log_0_batch_idx ON @extschema@.stream_log_0 (stream_id, part, xid);
CREATE INDEX stream_log_0_command_idx ON @extschema@.stream_log_0 (command_id);
CREATE TABLE @extschema@.stream_log_1 (
	id			pg_catalog.int8 NOT NULL,
	xid			pg_catalog.xid8 NOT NULL,
	stream_id	pg_catalog.int4 NOT NULL,
	part		pg_catalog.int4 NOT NULL,
	command_id	pg_catalog.text COLLATE pg_catalog."C" NOT NULL,
	run_id		pg_catalog.text COLLATE pg_catalog."C" NOT NULL,
	seq			pg_catalog.int8 NOT NULL,
	kind		pg_catalog.text COLLATE pg_catalog."C" NOT NULL,
	payload		pg_catalog.jsonb NOT NULL,
	headers		pg_catalog.jsonb,
	ordering_key pg_catalog.text COLLATE pg_catalog."C",
	decided_by	pg_catalog.oid,
	created_at	pg_catalog.timestamptz NOT NULL DEFAULT pg_catalog.now()
);
CREATE INDEX stream_log_1_batch_idx ON @extschema@.stream_log_1 (stream_id, part, xid);
CREATE INDEX stream_log_1_command_idx ON @extschema@.stream_log_1 (command_id);
CREATE TABLE @extschema@.stream_log_2 (
	id			pg_catalog.int8 NOT NULL,
	xid			pg_catalog.xid8 NOT NULL,
	stream_id	pg_catalog.int4 NOT NULL,
	part		pg_catalog.int4 NOT NULL,
	command_id	pg_catalog.text COLLATE pg_catalog."C" NOT NULL,
	run_id		pg_catalog.text COLLATE pg_catalog."C" NOT NULL,
	seq			pg_catalog.int8 NOT NULL,
	kind		pg_catalog.text COLLATE pg_catalog."C" NOT NULL,
	payload		pg_catalog.jsonb NOT NULL,
	headers		pg_catalog.jsonb,
	ordering_key pg_catalog.text COLLATE pg_catalog."C",
	decided_by	pg_catalog.oid,
	created_at	pg_catalog.timestamptz NOT NULL DEFAULT pg_catalog.now()
);
CREATE INDEX stream_log_2_batch_idx ON @extschema@.stream_log_2 (stream_id, part, xid);
CREATE INDEX stream_log_2_command_idx ON @extschema@.stream_log_2 (command_id);
-- The receipts of the stream commands in each log table (complete() of a
-- command in stream_log_N writes stream_receipts_N), truncated with their
-- log table by the rotation: no receipt of a stream command is ever
-- deleted row by row, so a held xmin horizon leaves no dead index entries
-- behind.  A command the rotation kept (stream_kept) has its receipt in
-- outbox.receipts, moved there with it.  Columns as in outbox.receipts.
CREATE TABLE @extschema@.stream_receipts_0 (
	command_id	pg_catalog.text COLLATE pg_catalog."C" NOT NULL,
	outcome		pg_catalog.text NOT NULL,
	detail		pg_catalog.jsonb,
	completed_at pg_catalog.timestamptz NOT NULL DEFAULT pg_catalog.now(),
	run_id		pg_catalog.text COLLATE pg_catalog."C" NOT NULL,
	CONSTRAINT stream_receipts_0_pkey PRIMARY KEY (command_id)
);
CREATE TABLE @extschema@.stream_receipts_1 (
	command_id	pg_catalog.text COLLATE pg_catalog."C" NOT NULL,
	outcome		pg_catalog.text NOT NULL,
	detail		pg_catalog.jsonb,
	completed_at pg_catalog.timestamptz NOT NULL DEFAULT pg_catalog.now(),
	run_id		pg_catalog.text COLLATE pg_catalog."C" NOT NULL,
	CONSTRAINT stream_receipts_1_pkey PRIMARY KEY (command_id)
);
CREATE TABLE @extschema@.stream_receipts_2 (
	command_id	pg_catalog.text COLLATE pg_catalog."C" NOT NULL,
	outcome		pg_catalog.text NOT NULL,
	detail		pg_catalog.jsonb,
	completed_at pg_catalog.timestamptz NOT NULL DEFAULT pg_catalog.now(),
	run_id		pg_catalog.text COLLATE pg_catalog."C" NOT NULL,
	CONSTRAINT stream_receipts_2_pkey PRIMARY KEY (command_id)
);
-- Commands a rotation kept (stragglers: not yet completed, or failed in a
-- subscription, or within retention), moved out of a log table before it
-- was truncated; removed by the rotation once they are done.
CREATE TABLE @extschema@.stream_kept (
	id			pg_catalog.int8 NOT NULL,
	xid			pg_catalog.xid8 NOT NULL,
	stream_id	pg_catalog.int4 NOT NULL,
	part		pg_catalog.int4 NOT NULL,
	command_id	pg_catalog.text COLLATE pg_catalog."C" NOT NULL,
	run_id		pg_catalog.text COLLATE pg_catalog."C" NOT NULL,
	seq			pg_catalog.int8 NOT NULL,
	kind		pg_catalog.text COLLATE pg_catalog."C" NOT NULL,
	payload		pg_catalog.jsonb NOT NULL,
	headers		pg_catalog.jsonb,
	ordering_key pg_catalog.text COLLATE pg_catalog."C",
	decided_by	pg_catalog.oid,
	created_at	pg_catalog.timestamptz NOT NULL DEFAULT pg_catalog.now()
);
CREATE INDEX stream_kept_batch_idx ON @extschema@.stream_kept (stream_id, part, xid);
CREATE INDEX stream_kept_command_idx ON @extschema@.stream_kept (command_id);
-- Tombstones of the stream commands the rotation removed (outbox.purged
-- holds those of outbox.commands): one row per chunk of up to 1,000
-- commands of one rotation step, in the order of their created_at, with
-- each command's id, run, seq, kind, created_at (published_at in the view
-- outbox.stream_purged_commands) and outcome as parallel arrays, which are
-- stored compressed.  A chunk costs a few bytes of WAL per command where a
-- row of outbox.purged with its index entry costs about 230; a command is
-- found from its event (events_command_id_key: its created_at, the same
-- transaction's now() as its log row's) through the chunks whose range of
-- created_at holds it (_stream_purged).  The key is unique because command
-- ids are.
CREATE TABLE @extschema@.stream_purged (
	first_created pg_catalog.timestamptz NOT NULL,
	last_created pg_catalog.timestamptz NOT NULL,
	first_command pg_catalog.text COLLATE pg_catalog."C" NOT NULL,
	stream_id	pg_catalog.int4 NOT NULL,
	commands	pg_catalog.int4 NOT NULL,
	command_ids pg_catalog.text[] COLLATE pg_catalog."C" NOT NULL,
	run_ids		pg_catalog.text[] COLLATE pg_catalog."C" NOT NULL,
	seqs		pg_catalog.int8[] NOT NULL,
	kinds		pg_catalog.text[] COLLATE pg_catalog."C" NOT NULL,
	created_ats pg_catalog.timestamptz[] NOT NULL,
	outcomes	pg_catalog.text[] NOT NULL,
	purged_at	pg_catalog.timestamptz NOT NULL DEFAULT pg_catalog.now(),
	CONSTRAINT stream_purged_pkey PRIMARY KEY (last_created, first_command)
);

-- Which log table the producers append to, and when it became the one;
-- and the base added to every transaction id the streams store (xid_base:
-- four times the microseconds since 1970 at the installation), so that the
-- ids of a cluster the stream is restored into (a later installation)
-- come after those of the dumped one, whatever either cluster's
-- transaction counter (docs/streams.md).  One row, made here; not
-- registered for pg_dump (a restore starts appending to table 0, a batch
-- reads all three; pg_upgrade keeps the row and the transaction ids).
CREATE TABLE @extschema@.stream_rotation (
	one			pg_catalog.bool NOT NULL DEFAULT true,
	current		pg_catalog.int4 NOT NULL,
	switched_at pg_catalog.timestamptz NOT NULL DEFAULT pg_catalog.now(),
	xid_base	pg_catalog.int8 NOT NULL,
	CONSTRAINT stream_rotation_pkey PRIMARY KEY (one),
	CONSTRAINT stream_rotation_one CHECK (one),
	CONSTRAINT stream_rotation_current_check CHECK (current OPERATOR(pg_catalog.>=) 0 AND current OPERATOR(pg_catalog.<=) 2)
);
INSERT INTO @extschema@.stream_rotation (current, xid_base)
VALUES (0, (pg_catalog.date_part('epoch', pg_catalog.clock_timestamp()) OPERATOR(pg_catalog.*) 4000000)::pg_catalog.int8);

-- The progress and the batch lease of each (subscription, partition): one
-- row, updated by claim_batch (a new batch, or a takeover: version + 1)
-- and by ack_batch (acked_tick moves to the batch's end).  Every command of
-- the partition visible in the snapshot of acked_tick is done for the
-- subscription: published, or in stream_failures.  A batch is open while
-- batch_to is set: the commands visible in batch_to's snapshot and not in
-- acked_tick's, plus the retries marked with its batch_id.  claim_nonce
-- is a random value drawn at each claim and takeover (src/stream.c), in
-- the token and required by ack_batch and renew_batch, so that a claim
-- whose commit was lost and made again gets another token.
CREATE TABLE @extschema@.stream_progress (
	subscription pg_catalog.text COLLATE pg_catalog."C" NOT NULL,
	part		pg_catalog.int4 NOT NULL,
	acked_tick	pg_catalog.int8 NOT NULL,
	batch_id	pg_catalog.int8 NOT NULL DEFAULT 0,
	batch_to	pg_catalog.int8,
	version		pg_catalog.int4 NOT NULL DEFAULT 0,
	owner		pg_catalog.text,
	role		pg_catalog.oid,
	claim_nonce pg_catalog.int8,
	lease_until pg_catalog.timestamptz,
	deliveries	pg_catalog.int4 NOT NULL DEFAULT 0,
	batch_rows	pg_catalog.int4 NOT NULL DEFAULT 0,
	batch_retries pg_catalog.int4 NOT NULL DEFAULT 0,
	published	pg_catalog.int8 NOT NULL DEFAULT 0,
	acked_at	pg_catalog.timestamptz,
	CONSTRAINT stream_progress_pkey PRIMARY KEY (subscription, part)
) WITH (fillfactor = 50);

-- The commands of a stream that failed in a subscription (ack_batch's
-- failed[]), kept whole so that a retry needs no log table: retry (due at
-- available_at, delivered again in a later batch of its partition), dead
-- (deliveries used up, or fatal), or waiting (behind an unfinished command
-- of its ordering key in this subscription).  A command leaves the table
-- when a batch that re-delivered it is acked without it failing.
CREATE TABLE @extschema@.stream_failures (
	subscription pg_catalog.text COLLATE pg_catalog."C" NOT NULL,
	command_id	pg_catalog.text COLLATE pg_catalog."C" NOT NULL,
	part		pg_catalog.int4 NOT NULL,
	state		pg_catalog.text NOT NULL,
	batch_id	pg_catalog.int8,
	deliveries	pg_catalog.int4 NOT NULL,
	available_at pg_catalog.timestamptz NOT NULL,
	last_error	pg_catalog.text,
	failed_at	pg_catalog.timestamptz NOT NULL DEFAULT pg_catalog.now(),
	log_id		pg_catalog.int8 NOT NULL,
	xid			pg_catalog.xid8 NOT NULL,
	stream_id	pg_catalog.int4 NOT NULL,
	run_id		pg_catalog.text COLLATE pg_catalog."C" NOT NULL,
	seq			pg_catalog.int8 NOT NULL,
	kind		pg_catalog.text COLLATE pg_catalog."C" NOT NULL,
	payload		pg_catalog.jsonb NOT NULL,
	headers		pg_catalog.jsonb,
	ordering_key pg_catalog.text COLLATE pg_catalog."C",
	decided_by	pg_catalog.oid,
	created_at	pg_catalog.timestamptz NOT NULL,
	CONSTRAINT stream_failures_pkey PRIMARY KEY (subscription, command_id),
	CONSTRAINT stream_failures_state_check CHECK (state OPERATOR(pg_catalog.=) ANY
		(ARRAY['retry', 'dead', 'waiting']::pg_catalog.text[]))
);
CREATE INDEX stream_failures_due_idx ON @extschema@.stream_failures (subscription, part, available_at)
	WHERE state OPERATOR(pg_catalog.=) 'retry';
CREATE INDEX stream_failures_key_idx ON @extschema@.stream_failures (subscription, ordering_key, decided_by, log_id)
	WHERE ordering_key IS NOT NULL;
-- the failed commands a batch re-delivers (claim, takeover, ack): without
-- it every batch read all of the subscription's failures.
CREATE INDEX stream_failures_batch_idx ON @extschema@.stream_failures (subscription, part, batch_id)
	WHERE batch_id IS NOT NULL;

SELECT pg_catalog.pg_extension_config_dump('@extschema@.streams', '');
SELECT pg_catalog.pg_extension_config_dump('@extschema@.subscriptions', '');
SELECT pg_catalog.pg_extension_config_dump('@extschema@.stream_ticks', '');
SELECT pg_catalog.pg_extension_config_dump('@extschema@.stream_log_id_seq', '');
SELECT pg_catalog.pg_extension_config_dump('@extschema@.stream_log_0', '');
SELECT pg_catalog.pg_extension_config_dump('@extschema@.stream_log_1', '');
SELECT pg_catalog.pg_extension_config_dump('@extschema@.stream_log_2', '');
SELECT pg_catalog.pg_extension_config_dump('@extschema@.stream_kept', '');
SELECT pg_catalog.pg_extension_config_dump('@extschema@.stream_receipts_0', '');
SELECT pg_catalog.pg_extension_config_dump('@extschema@.stream_receipts_1', '');
SELECT pg_catalog.pg_extension_config_dump('@extschema@.stream_receipts_2', '');
SELECT pg_catalog.pg_extension_config_dump('@extschema@.stream_purged', '');
SELECT pg_catalog.pg_extension_config_dump('@extschema@.stream_progress', '');
SELECT pg_catalog.pg_extension_config_dump('@extschema@.stream_failures', '');
COMMENT ON TABLE @extschema@.streams IS 'the streams: kinds written once to an insert-only log, read in batches by subscriptions';
COMMENT ON TABLE @extschema@.subscriptions IS 'the subscriptions of the streams, each with its own progress, batches and leases';
COMMENT ON TABLE @extschema@.stream_ticks IS 'the ticks of each stream: the snapshots that cut its log into batches';
COMMENT ON TABLE @extschema@.stream_log_0 IS 'stream log, table 0 of 3 (insert-only; truncated by the rotation)';
COMMENT ON TABLE @extschema@.stream_log_1 IS 'stream log, table 1 of 3 (insert-only; truncated by the rotation)';
COMMENT ON TABLE @extschema@.stream_log_2 IS 'stream log, table 2 of 3 (insert-only; truncated by the rotation)';
COMMENT ON TABLE @extschema@.stream_kept IS 'stream commands a rotation moved out of a log table before truncating it';
COMMENT ON TABLE @extschema@.stream_receipts_0 IS 'receipts of the commands in stream_log_0 (truncated with it by the rotation)';
COMMENT ON TABLE @extschema@.stream_receipts_1 IS 'receipts of the commands in stream_log_1 (truncated with it by the rotation)';
COMMENT ON TABLE @extschema@.stream_receipts_2 IS 'receipts of the commands in stream_log_2 (truncated with it by the rotation)';
COMMENT ON TABLE @extschema@.stream_purged IS 'tombstones of stream commands removed by the rotation, in chunks of parallel arrays';
COMMENT ON TABLE @extschema@.stream_rotation IS 'the log table the producers append to (one row)';
COMMENT ON TABLE @extschema@.stream_progress IS 'per subscription and partition: the last acked tick and the open batch''s lease';
COMMENT ON TABLE @extschema@.stream_failures IS 'stream commands that failed in a subscription: retry, dead, or waiting behind their ordering key';

SELECT pg_catalog.pg_extension_config_dump('@extschema@.events', '');
SELECT pg_catalog.pg_extension_config_dump('@extschema@.commands', '');
SELECT pg_catalog.pg_extension_config_dump('@extschema@.receipts', '');
SELECT pg_catalog.pg_extension_config_dump('@extschema@.inbox', '');
SELECT pg_catalog.pg_extension_config_dump('@extschema@.policies', '');
SELECT pg_catalog.pg_extension_config_dump('@extschema@.purged', '');
SELECT pg_catalog.pg_extension_config_dump('@extschema@.consumers', '');

COMMENT ON TABLE @extschema@.events IS 'event log of each run; command_id names the command an event decided';
COMMENT ON TABLE @extschema@.commands IS 'the outbox: one row per command, with its lease and delivery state';
COMMENT ON TABLE @extschema@.receipts IS 'one durable completion receipt per command';
COMMENT ON TABLE @extschema@.inbox IS 'commands each consumer has accepted, for exactly-once effects';
COMMENT ON TABLE @extschema@.policies IS 'per-kind overrides: max deliveries, backoff, lease, takeover mode, pause, retention';
COMMENT ON TABLE @extschema@.consumers IS 'consumer names, each registered to the role whose members may accept commands under it';
COMMENT ON COLUMN @extschema@.commands.decided_by IS 'the role that decided the command (current_user of the commit_decision call)';
COMMENT ON COLUMN @extschema@.policies.deciders IS 'roles whose members may decide commands of the kind (NULL: every producer; empty: admins only)';
COMMENT ON COLUMN @extschema@.policies.claimers IS 'roles whose members may claim commands of the kind (NULL: every publisher; empty: admins only)';
COMMENT ON COLUMN @extschema@.policies.completers IS 'roles whose members may complete commands of the kind (NULL: every consumer; empty: admins only)';
COMMENT ON COLUMN @extschema@.receipts.run_id IS 'the run of the completed command (the distribution column on Citus)';
COMMENT ON COLUMN @extschema@.inbox.run_id IS 'the run of the accepted command (the distribution column on Citus; empty for an acceptance 0.1.0 recorded of a command it did not know)';
COMMENT ON TABLE @extschema@.purged IS 'tombstones of commands removed by the retention purge';
COMMENT ON DOMAIN @extschema@.command_status IS 'a command''s status: pending, sending, published, dead or uncertain';
COMMENT ON DOMAIN @extschema@.command_version IS 'a command''s version: bumped by every change of its lease, for ordering and diagnostics (at least 1)';
COMMENT ON DOMAIN @extschema@.command_deliveries IS 'how many times a command was handed to a publisher (not negative)';
COMMENT ON COLUMN @extschema@.commands.headers IS 'the producer''s headers (a JSON object of strings, or NULL), handed to the relay by claim and shown in no view';
COMMENT ON COLUMN @extschema@.commands.ordering_key IS 'the ordering key: commands sharing one leave one at a time, in ordering_seq order (NULL: unordered)';
COMMENT ON COLUMN @extschema@.commands.ordering_seq IS 'the command''s place among the commands of its ordering key (NULL without a key)';
COMMENT ON COLUMN @extschema@.commands.ordering_tail IS 'true when the command became the head of its ordering key as the key''s last command, which keeps it in commands_key_idx (NULL otherwise)';
COMMENT ON COLUMN @extschema@.policies.ordered_by_run IS 'a command of the kind decided without an ordering key is ordered by its run_id';
COMMENT ON COLUMN @extschema@.commands.due_at IS 'available_at while the command is pending and not waiting behind an earlier command of its ordering key, NULL otherwise (the key of the claim index)';
COMMENT ON COLUMN @extschema@.policies.stream IS 'the stream the kind''s commands are written to once (NULL: outbox.commands)';
