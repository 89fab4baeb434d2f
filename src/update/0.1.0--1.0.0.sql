-- outbox update script from 0.1.0 to 1.0.0, hand-written part.
--
-- The update script outbox--0.1.0--1.0.0.sql is this file followed by the
-- parts of src/sql/ after 00 and by 0.1.0--1.0.0.after.sql (see the
-- Makefile): this part saves the privileges of what stays, drops what
-- those parts create and brings the tables to 1.0.0's shape; they then
-- create the functions, types and views and make the grants exactly as a
-- fresh install does; the last part adds the data 1.0.0 needs and puts the
-- initial privileges right.  test/t/072_upgrade.pl checks that the result equals a
-- fresh install of 1.0.0, catalog and privileges, and that the data stays.
-- Every object is qualified, as in the install script.

\echo Use "ALTER EXTENSION outbox UPDATE TO '1.0.0'" to load this file. \quit

-- 0. The privileges of what stays: the tables, the domains and the schema.
-- A GRANT or REVOKE in an extension script records the object's whole ACL
-- as its initial privileges (pg_init_privs), and part 90 revokes from
-- PUBLIC on every table, domain and the schema: grants a DBA made since the
-- installation would become initial ones, which pg_dump leaves out.  The
-- ACLs and initial privileges are saved here (for this transaction) and
-- put right by the part that ends the script (0.1.0--1.0.0.after.sql).
SELECT pg_catalog.set_config('outbox_update.privileges', COALESCE((
	SELECT pg_catalog.jsonb_agg(pg_catalog.jsonb_build_object(
			'class', o.classid, 'oid', o.objid, 'acl', o.acl::pg_catalog.text,
			'init', i.initprivs::pg_catalog.text))
	  FROM (SELECT d.classid, d.objid, c.relacl AS acl
			  FROM pg_catalog.pg_depend d
			  JOIN pg_catalog.pg_class c ON c.oid OPERATOR(pg_catalog.=) d.objid
			 WHERE d.classid OPERATOR(pg_catalog.=) 'pg_catalog.pg_class'::pg_catalog.regclass
			   AND c.relkind OPERATOR(pg_catalog.=) 'r'
			   AND d.refclassid OPERATOR(pg_catalog.=) 'pg_catalog.pg_extension'::pg_catalog.regclass
			   AND d.refobjid OPERATOR(pg_catalog.=) e.oid
			   AND d.deptype OPERATOR(pg_catalog.=) 'e'
			UNION ALL
			SELECT d.classid, d.objid, t.typacl
			  FROM pg_catalog.pg_depend d
			  JOIN pg_catalog.pg_type t ON t.oid OPERATOR(pg_catalog.=) d.objid
			 WHERE d.classid OPERATOR(pg_catalog.=) 'pg_catalog.pg_type'::pg_catalog.regclass
			   AND t.typtype OPERATOR(pg_catalog.=) 'd'
			   AND d.refclassid OPERATOR(pg_catalog.=) 'pg_catalog.pg_extension'::pg_catalog.regclass
			   AND d.refobjid OPERATOR(pg_catalog.=) e.oid
			   AND d.deptype OPERATOR(pg_catalog.=) 'e'
			UNION ALL
			SELECT 'pg_catalog.pg_namespace'::pg_catalog.regclass, n.oid, n.nspacl
			  FROM pg_catalog.pg_namespace n
			 WHERE n.oid OPERATOR(pg_catalog.=) e.extnamespace) o
	  JOIN pg_catalog.pg_init_privs i
		ON i.classoid OPERATOR(pg_catalog.=) o.classid AND i.objoid OPERATOR(pg_catalog.=) o.objid
	   AND i.objsubid OPERATOR(pg_catalog.=) 0)::pg_catalog.text, '[]'), true)
  FROM pg_catalog.pg_extension e
 WHERE e.extname OPERATOR(pg_catalog.=) 'outbox';

-- What 0.1.0 itself granted on the schema is revoked, for part 90 to grant
-- again in the order of a fresh install (an ACL's order shows in the
-- catalog and in pg_dump's output).
DO $$
DECLARE
	g record;
BEGIN
	FOR g IN
		SELECT DISTINCT a.grantee
		  FROM pg_catalog.pg_extension e
		  JOIN pg_catalog.pg_namespace n ON n.oid OPERATOR(pg_catalog.=) e.extnamespace
		  JOIN pg_catalog.pg_init_privs i
			ON i.classoid OPERATOR(pg_catalog.=) 'pg_catalog.pg_namespace'::pg_catalog.regclass
		   AND i.objoid OPERATOR(pg_catalog.=) n.oid
		 CROSS JOIN LATERAL pg_catalog.aclexplode(i.initprivs) a
		 WHERE e.extname OPERATOR(pg_catalog.=) 'outbox'
		   AND a.grantee OPERATOR(pg_catalog.<>) n.nspowner
		   AND a.grantee OPERATOR(pg_catalog.<>) 0
	LOOP
		EXECUTE pg_catalog.format('REVOKE ALL ON SCHEMA @extschema@ FROM %I', pg_catalog.pg_get_userbyid(g.grantee));
	END LOOP;
END;
$$;

-- 1. Drop the extension's views, functions and standalone composite types;
-- the tables, their indexes and the domains their columns use stay.  The
-- parts that follow create every one of them again (also those whose
-- definition did not change), so that an object removed or renamed in
-- 1.0.0 is gone and the privileges are the ones a fresh install grants.
--
-- Grants a DBA made on these objects beyond the extension's own (initial)
-- privileges go with them: a WARNING lists each one as the GRANT statement
-- to run again after the update.  An object of the DBA's that depends on
-- one of them (a view over outbox.backlog) stops the update with 2BP01,
-- changing nothing.  The tables keep their rows and grants.
DO $$
DECLARE
	ext pg_catalog.oid := (SELECT e.oid FROM pg_catalog.pg_extension e
							WHERE e.extname OPERATOR(pg_catalog.=) 'outbox');
	views pg_catalog.text;
	funcs pg_catalog.text;
	types pg_catalog.text;
	regrants pg_catalog.text;
	msg pg_catalog.text;
	det pg_catalog.text;
BEGIN
	WITH m AS (
	SELECT o.kind, o.name, o.acl, i.initprivs
	  FROM (SELECT 'VIEW' AS kind,
				   pg_catalog.format('%I.%I', n.nspname, c.relname) AS name,
				   c.relacl AS acl, d.classid, d.objid
			  FROM pg_catalog.pg_depend d
			  JOIN pg_catalog.pg_class c ON c.oid OPERATOR(pg_catalog.=) d.objid
			  JOIN pg_catalog.pg_namespace n ON n.oid OPERATOR(pg_catalog.=) c.relnamespace
			 WHERE d.classid OPERATOR(pg_catalog.=) 'pg_catalog.pg_class'::pg_catalog.regclass
			   AND c.relkind OPERATOR(pg_catalog.=) 'v'
			   AND d.refclassid OPERATOR(pg_catalog.=) 'pg_catalog.pg_extension'::pg_catalog.regclass
			   AND d.refobjid OPERATOR(pg_catalog.=) ext
			   AND d.deptype OPERATOR(pg_catalog.=) 'e'
			UNION ALL
			-- each argument type written with its schema: nothing is
			-- looked up through search_path
			SELECT 'FUNCTION',
				   pg_catalog.format('%I.%I(%s)', n.nspname, p.proname,
					   (SELECT pg_catalog.string_agg(pg_catalog.format('%I.%I', tn.nspname, t.typname), ', '
													 ORDER BY a.ord)
						  FROM pg_catalog.unnest(p.proargtypes::pg_catalog.oid[]) WITH ORDINALITY AS a(typ, ord)
						  JOIN pg_catalog.pg_type t ON t.oid OPERATOR(pg_catalog.=) a.typ
						  JOIN pg_catalog.pg_namespace tn ON tn.oid OPERATOR(pg_catalog.=) t.typnamespace)),
				   p.proacl, d.classid, d.objid
			  FROM pg_catalog.pg_depend d
			  JOIN pg_catalog.pg_proc p ON p.oid OPERATOR(pg_catalog.=) d.objid
			  JOIN pg_catalog.pg_namespace n ON n.oid OPERATOR(pg_catalog.=) p.pronamespace
			 WHERE d.classid OPERATOR(pg_catalog.=) 'pg_catalog.pg_proc'::pg_catalog.regclass
			   AND d.refclassid OPERATOR(pg_catalog.=) 'pg_catalog.pg_extension'::pg_catalog.regclass
			   AND d.refobjid OPERATOR(pg_catalog.=) ext
			   AND d.deptype OPERATOR(pg_catalog.=) 'e'
			UNION ALL
			SELECT 'TYPE', pg_catalog.format('%I.%I', n.nspname, t.typname),
				   t.typacl, d.classid, d.objid
			  FROM pg_catalog.pg_depend d
			  JOIN pg_catalog.pg_type t ON t.oid OPERATOR(pg_catalog.=) d.objid
			  JOIN pg_catalog.pg_class c ON c.oid OPERATOR(pg_catalog.=) t.typrelid
			  JOIN pg_catalog.pg_namespace n ON n.oid OPERATOR(pg_catalog.=) t.typnamespace
			 WHERE d.classid OPERATOR(pg_catalog.=) 'pg_catalog.pg_type'::pg_catalog.regclass
			   AND c.relkind OPERATOR(pg_catalog.=) 'c'
			   AND d.refclassid OPERATOR(pg_catalog.=) 'pg_catalog.pg_extension'::pg_catalog.regclass
			   AND d.refobjid OPERATOR(pg_catalog.=) ext
			   AND d.deptype OPERATOR(pg_catalog.=) 'e') o
	  LEFT JOIN pg_catalog.pg_init_privs i
		ON i.classoid OPERATOR(pg_catalog.=) o.classid AND i.objoid OPERATOR(pg_catalog.=) o.objid
	   AND i.objsubid OPERATOR(pg_catalog.=) 0)
	SELECT
	-- the grants beyond the initial privileges (PUBLIC is grantee 0)
	(SELECT pg_catalog.string_agg(pg_catalog.format('GRANT %s ON %s %s TO %s%s;',
				g.privilege_type,
				CASE WHEN m.kind OPERATOR(pg_catalog.=) 'VIEW' THEN 'TABLE' ELSE m.kind END,
				m.name,
				CASE WHEN g.grantee OPERATOR(pg_catalog.=) 0 THEN 'PUBLIC'
					 ELSE pg_catalog.quote_ident(pg_catalog.pg_get_userbyid(g.grantee)) END,
				CASE WHEN g.is_grantable THEN ' WITH GRANT OPTION' ELSE '' END),
			' ' ORDER BY m.name, g.grantee, g.privilege_type)
	   FROM m
	  CROSS JOIN LATERAL pg_catalog.aclexplode(m.acl) g
	  WHERE NOT EXISTS (SELECT 1 FROM pg_catalog.aclexplode(m.initprivs) ip
						 WHERE ip.grantee OPERATOR(pg_catalog.=) g.grantee
						   AND ip.privilege_type OPERATOR(pg_catalog.=) g.privilege_type
						   AND ip.is_grantable OPERATOR(pg_catalog.=) g.is_grantable)),
	(SELECT pg_catalog.string_agg(m.name, ', ') FROM m WHERE m.kind OPERATOR(pg_catalog.=) 'VIEW'),
	(SELECT pg_catalog.string_agg(m.name, ', ') FROM m WHERE m.kind OPERATOR(pg_catalog.=) 'FUNCTION'),
	(SELECT pg_catalog.string_agg(m.name, ', ') FROM m WHERE m.kind OPERATOR(pg_catalog.=) 'TYPE')
	  INTO regrants, views, funcs, types;

	IF regrants IS NOT NULL THEN
		-- (a WARNING: ALTER EXTENSION does not show NOTICEs)
		RAISE WARNING 'the update recreates the views and functions of the extension, without these grants made after its installation'
			USING DETAIL = regrants,
				  HINT = 'Run them again after the update.';
	END IF;

	BEGIN
		-- views use functions, functions return types: in that order, each
		-- kind in one statement (dependencies among them do not matter)
		IF views IS NOT NULL THEN
			EXECUTE pg_catalog.format('DROP VIEW %s', views);
		END IF;
		IF funcs IS NOT NULL THEN
			EXECUTE pg_catalog.format('DROP FUNCTION %s', funcs);
		END IF;
		IF types IS NOT NULL THEN
			EXECUTE pg_catalog.format('DROP TYPE %s', types);
		END IF;
	EXCEPTION WHEN dependent_objects_still_exist THEN
		GET STACKED DIAGNOSTICS msg = MESSAGE_TEXT;
		GET STACKED DIAGNOSTICS det = PG_EXCEPTION_DETAIL;
		RAISE EXCEPTION '%', msg
			USING ERRCODE = 'dependent_objects_still_exist', DETAIL = det,
				  HINT = 'The update recreates the views and functions of the extension: drop the objects that depend on them, update, and create them again.';
	END;
END;
$$;

-- 2. The tables, as part 00 of 1.0.0 makes them: columns added at the end
-- of each table, new tables registered for pg_dump, their comments.

-- The role that decided a command.  NULL for the decisions recorded by
-- 0.1.0, which kept no role: a repeat of one of them is a conflict (23505),
-- never an idempotent retry, since nobody can tell whose it was.
ALTER TABLE @extschema@.commands ADD COLUMN decided_by pg_catalog.oid;
COMMENT ON COLUMN @extschema@.commands.decided_by IS 'the role that decided the command (current_user of the commit_decision call)';

-- Lease tokens: the database's lease key, as part 00 makes it.  A lease
-- live at the update was handed out by 0.1.0's claim, which made no token:
-- nobody can ack, fail or renew it; it runs to its end and is then taken
-- over by claim (or swept, as any expired lease), its delivery counted
-- (docs/reference.md, "Upgrading from 0.1.0").
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
-- The producer's headers.  NULL for the commands decided before the update.
ALTER TABLE @extschema@.commands ADD COLUMN headers pg_catalog.jsonb;
COMMENT ON COLUMN @extschema@.commands.headers IS 'the producer''s headers (a JSON object of strings, or NULL), handed to the relay by claim and shown in no view';
COMMENT ON DOMAIN @extschema@.command_version IS 'a command''s version: bumped by every change of its lease, for ordering and diagnostics (at least 1)';

-- Per-kind authorization: NULL (every member of the database's group
-- role) for the kinds of 0.1.0, which is what 0.1.0 allowed.
ALTER TABLE @extschema@.policies
	ADD COLUMN deciders pg_catalog.regrole[],
	ADD COLUMN claimers pg_catalog.regrole[],
	ADD COLUMN completers pg_catalog.regrole[];
COMMENT ON COLUMN @extschema@.policies.deciders IS 'roles whose members may decide commands of the kind (NULL: every producer; empty: admins only)';
COMMENT ON COLUMN @extschema@.policies.claimers IS 'roles whose members may claim commands of the kind (NULL: every publisher; empty: admins only)';
COMMENT ON COLUMN @extschema@.policies.completers IS 'roles whose members may complete commands of the kind (NULL: every consumer; empty: admins only)';
-- The kinds with claimers, read by every claim, and with deciders, read
-- by the producer's cache (no 0.1.0 policy has any).
CREATE INDEX policies_claimers_idx ON @extschema@.policies (kind) WHERE claimers IS NOT NULL;
CREATE INDEX policies_deciders_idx ON @extschema@.policies (kind) WHERE deciders IS NOT NULL;

-- Consumer names (the names 0.1.0's inbox holds are registered by the last
-- part, once this database's consumer role exists).
CREATE TABLE @extschema@.consumers (
	consumer	pg_catalog.text COLLATE pg_catalog."C" NOT NULL,
	role		pg_catalog.regrole NOT NULL,
	registered_at pg_catalog.timestamptz NOT NULL DEFAULT pg_catalog.now(),
	CONSTRAINT consumers_pkey PRIMARY KEY (consumer)
);
SELECT pg_catalog.pg_extension_config_dump('@extschema@.consumers', '');
COMMENT ON TABLE @extschema@.consumers IS 'consumer names, each registered to the role whose members may accept commands under it';

-- The metrics' indexes: kind INCLUDEd in both claim indexes (the pending
-- and the sending commands by kind), and 0.1.0's index of the dead and
-- uncertain commands made again to hold the waiting ones too (part 00).
DROP INDEX @extschema@.commands_claim_idx;
CREATE INDEX commands_claim_idx ON @extschema@.commands
	(priority DESC, due_at, created_at) INCLUDE (kind) WHERE due_at IS NOT NULL;
DROP INDEX @extschema@.commands_lease_idx;
CREATE INDEX commands_lease_idx ON @extschema@.commands (lease_until) INCLUDE (kind)
	WHERE status OPERATOR(pg_catalog.=) 'sending';
DROP INDEX @extschema@.commands_held_idx;
CREATE INDEX commands_held_idx ON @extschema@.commands (kind, status COLLATE pg_catalog."C")
	WHERE status OPERATOR(pg_catalog.=) ANY (ARRAY['dead', 'uncertain']::pg_catalog.text[])
	   OR (status OPERATOR(pg_catalog.=) 'pending' AND due_at IS NULL);
COMMENT ON INDEX @extschema@.commands_held_idx
	IS 'dead, uncertain and waiting commands by kind and status (read by outbox.metrics_backlog with an index-only scan)';

-- The conservation checks as the background worker counts them (NULL
-- until its first count after the update).
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

-- Ordered delivery per key: no command of 0.1.0 has a key, no kind is
-- ordered by run.
ALTER TABLE @extschema@.commands
	ADD COLUMN ordering_key pg_catalog.text COLLATE pg_catalog."C",
	ADD COLUMN ordering_seq pg_catalog.int8,
	ADD COLUMN ordering_tail pg_catalog.bool;
COMMENT ON COLUMN @extschema@.commands.ordering_key IS 'the ordering key: commands sharing one leave one at a time, in ordering_seq order (NULL: unordered)';
COMMENT ON COLUMN @extschema@.commands.ordering_seq IS 'the command''s place among the commands of its ordering key (NULL without a key)';
COMMENT ON COLUMN @extschema@.commands.ordering_tail IS 'true when the command became the head of its ordering key as the key''s last command, which keeps it in commands_key_idx (NULL otherwise)';
CREATE INDEX commands_key_idx ON @extschema@.commands (ordering_key, decided_by, ordering_seq)
	WHERE ordering_key IS NOT NULL
	  AND (ordering_tail
		   OR (status OPERATOR(pg_catalog.=) 'pending' AND due_at IS NULL)
		   OR (status OPERATOR(pg_catalog.<>) 'pending' AND status OPERATOR(pg_catalog.<>) 'sending'));
COMMENT ON INDEX @extschema@.commands_key_idx
	IS 'commands with an ordering key that are waiting, published, dead or uncertain, or marked as their key''s last head (ordering_tail), by key, deciding role and place in the key (read by the producer and the release of a head)';
-- (added without a default, then filled: a column added with a default
-- keeps it as the "missing value" of the rows stored before, which a fresh
-- install's table does not have)
ALTER TABLE @extschema@.policies ADD COLUMN ordered_by_run pg_catalog.bool;
UPDATE @extschema@.policies SET ordered_by_run = false;
ALTER TABLE @extschema@.policies
	ALTER COLUMN ordered_by_run SET DEFAULT false,
	ALTER COLUMN ordered_by_run SET NOT NULL;
COMMENT ON COLUMN @extschema@.commands.due_at IS 'available_at while the command is pending and not waiting behind an earlier command of its ordering key, NULL otherwise (the key of the claim index)';
COMMENT ON COLUMN @extschema@.policies.ordered_by_run IS 'a command of the kind decided without an ordering key is ordered by its run_id';
-- The run of each receipt and each acceptance (the distribution column on
-- Citus).  0.1.0 recorded a receipt only for a stored command and removed
-- it with the command, so every receipt finds its run in outbox.commands;
-- an acceptance finds it there or in a tombstone.  0.1.0 accepted any id,
-- known or not: an acceptance of a command neither stored nor purged gets
-- the empty run_id, which no command can have (ids are never empty), so it
-- keeps deduplicating by (consumer, command_id) as before.
ALTER TABLE @extschema@.receipts ADD COLUMN run_id pg_catalog.text COLLATE pg_catalog."C";
UPDATE @extschema@.receipts r SET run_id = c.run_id
  FROM @extschema@.commands c WHERE c.command_id OPERATOR(pg_catalog.=) r.command_id;
UPDATE @extschema@.receipts SET run_id = '' WHERE run_id IS NULL;
ALTER TABLE @extschema@.receipts ALTER COLUMN run_id SET NOT NULL;
ALTER TABLE @extschema@.inbox ADD COLUMN run_id pg_catalog.text COLLATE pg_catalog."C";
UPDATE @extschema@.inbox i SET run_id = c.run_id
  FROM @extschema@.commands c WHERE c.command_id OPERATOR(pg_catalog.=) i.command_id;
UPDATE @extschema@.inbox i SET run_id = p.run_id
  FROM @extschema@.purged p
 WHERE i.run_id IS NULL AND p.command_id OPERATOR(pg_catalog.=) i.command_id;
UPDATE @extschema@.inbox SET run_id = '' WHERE run_id IS NULL;
ALTER TABLE @extschema@.inbox ALTER COLUMN run_id SET NOT NULL;
COMMENT ON COLUMN @extschema@.receipts.run_id IS 'the run of the completed command (the distribution column on Citus)';
COMMENT ON COLUMN @extschema@.inbox.run_id IS 'the run of the accepted command (the distribution column on Citus; empty for an acceptance 0.1.0 recorded of a command it did not know)';

-- Streams (docs/streams.md): the kind's stream, NULL for every kind of
-- 0.1.0; the tables as part 00 makes them.
ALTER TABLE @extschema@.policies ADD COLUMN stream pg_catalog.text COLLATE pg_catalog."C";
CREATE INDEX policies_stream_idx ON @extschema@.policies (kind) WHERE stream IS NOT NULL;
COMMENT ON COLUMN @extschema@.policies.stream IS 'the stream the kind''s commands are written to once (NULL: outbox.commands)';
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

-- 3. The parts of src/sql/ after 00 follow: roles, functions, types,
-- views, comments and privileges, as in a fresh install; then
-- 0.1.0--1.0.0.after.sql.
