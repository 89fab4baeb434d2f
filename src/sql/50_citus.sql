-- outbox install script, part 50: the outbox distributed on Citus.
--
-- outbox.distribute() makes the outbox's tables Citus tables, run once on
-- the coordinator: events, commands, receipts, inbox and purged hash
-- distributed by run_id in one co-location group (so that a run's event,
-- command, receipt and acceptances, and the business rows distributed with
-- them, live on one node), policies, consumers and lease_key reference
-- tables (a copy on every node: every node's claim reads the same
-- policies, and a token made on one node is checked on another with the
-- same key).  outbox.undistribute() puts the rows back into the local
-- tables.  docs/citus.md says what routes and what does not.
--
-- Keys.  A distributed table's unique keys must contain its distribution
-- column.  On a single server the keys stay those of part 00 (command_id
-- unique across runs, the key every API statement probes); _citus_keys
-- swaps them to (run_id, command_id) (and (run_id, consumer, command_id)
-- for the inbox) on every node before the tables are distributed, and
-- back after they are undistributed.  The constraints and indexes keep
-- their names, which the producer's duplicate checks read (src/producer.c).
--
-- Citus's own undistribute_table refuses an extension's tables, and
-- DROP EXTENSION does not remove their shards: undistribute() copies the
-- rows out, drops the shards and Citus's metadata with the functions
-- Citus's drop trigger uses, and puts the rows back; the utility hook of
-- src/citus.c runs it before DROP EXTENSION outbox on the coordinator.

-- The tables that are distributed by run_id, in the order they are
-- distributed (events first: the others join its co-location group), and
-- the reference tables.
CREATE FUNCTION @extschema@._citus_tables(reference pg_catalog.bool)
RETURNS pg_catalog.text[]
LANGUAGE sql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$
	SELECT CASE WHEN reference THEN ARRAY['policies', 'consumers', 'lease_key']
				ELSE ARRAY['events', 'commands', 'receipts', 'inbox', 'purged'] END
$$;
COMMENT ON FUNCTION @extschema@._citus_tables(pg_catalog.bool)
	IS 'the tables outbox.distribute() distributes by run_id (false) or makes reference tables (true)';

-- True when this database's outbox is distributed (Citus's metadata,
-- synced to every node, lists outbox.events).
CREATE FUNCTION @extschema@._distributed()
RETURNS pg_catalog.bool
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
	found pg_catalog.bool;
BEGIN
	IF pg_catalog.to_regclass('pg_catalog.pg_dist_partition') IS NULL THEN
		RETURN false;
	END IF;
	EXECUTE 'SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_dist_partition p
							 WHERE p.logicalrelid OPERATOR(pg_catalog.=) $1)'
	   INTO found USING '@extschema@.events'::pg_catalog.regclass;
	RETURN found;
END;
$$;
COMMENT ON FUNCTION @extschema@._distributed()
	IS 'true when the outbox''s tables are distributed on Citus';

-- This node's shards of the distributed outbox: for each shard of
-- commands, the co-located shards of receipts, purged and inbox (same hash range;
-- a shard group lives on one node) and this node's copy of policies, as
-- qualified names of plain tables here.  None on the coordinator.  Read
-- from Citus's metadata at each call (a shard moved here or away is seen
-- at once); outbox.purge() runs its statement against each, and the index
-- upkeep looks after them (src/upkeep.c).
CREATE FUNCTION @extschema@._citus_local_shards()
RETURNS TABLE (commands pg_catalog.text, receipts pg_catalog.text, purged pg_catalog.text,
			   policies pg_catalog.text, inbox pg_catalog.text)
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
	RETURN QUERY EXECUTE
	'SELECT ''@extschema@.commands_'' OPERATOR(pg_catalog.||) c.shardid,
			''@extschema@.receipts_'' OPERATOR(pg_catalog.||) r.shardid,
			''@extschema@.purged_'' OPERATOR(pg_catalog.||) u.shardid,
			''@extschema@.policies_'' OPERATOR(pg_catalog.||)
			(SELECT y.shardid FROM pg_catalog.pg_dist_shard y
			   JOIN pg_catalog.pg_dist_placement yp ON yp.shardid OPERATOR(pg_catalog.=) y.shardid
			  WHERE y.logicalrelid OPERATOR(pg_catalog.=) ''@extschema@.policies''::pg_catalog.regclass
				AND yp.groupid OPERATOR(pg_catalog.=) g.groupid),
			''@extschema@.inbox_'' OPERATOR(pg_catalog.||) i.shardid
	   FROM pg_catalog.pg_dist_local_group g
	   JOIN pg_catalog.pg_dist_placement cp ON cp.groupid OPERATOR(pg_catalog.=) g.groupid
	   JOIN pg_catalog.pg_dist_shard c ON c.shardid OPERATOR(pg_catalog.=) cp.shardid
		AND c.logicalrelid OPERATOR(pg_catalog.=) ''@extschema@.commands''::pg_catalog.regclass
	   JOIN pg_catalog.pg_dist_shard r ON r.logicalrelid OPERATOR(pg_catalog.=) ''@extschema@.receipts''::pg_catalog.regclass
		AND r.shardminvalue OPERATOR(pg_catalog.=) c.shardminvalue
	   JOIN pg_catalog.pg_dist_shard u ON u.logicalrelid OPERATOR(pg_catalog.=) ''@extschema@.purged''::pg_catalog.regclass
		AND u.shardminvalue OPERATOR(pg_catalog.=) c.shardminvalue
	   JOIN pg_catalog.pg_dist_shard i ON i.logicalrelid OPERATOR(pg_catalog.=) ''@extschema@.inbox''::pg_catalog.regclass
		AND i.shardminvalue OPERATOR(pg_catalog.=) c.shardminvalue
	  ORDER BY c.shardid';
END;
$$;
COMMENT ON FUNCTION @extschema@._citus_local_shards()
	IS 'this node''s shards of the distributed outbox: each shard of commands with its co-located receipts and purged shards and this node''s copy of policies';

-- The statement trigger on the reference table lease_key (and, through
-- Citus, on every node's copy of it): at the commit of a rotation each
-- node's backends read the new key (src/citus.c).
CREATE FUNCTION @extschema@._citus_lease_key_changed()
RETURNS trigger
LANGUAGE c
AS 'MODULE_PATHNAME', 'outbox_citus_lease_key_changed';
COMMENT ON FUNCTION @extschema@._citus_lease_key_changed()
	IS 'trigger on every node''s copy of the reference table lease_key: that node''s backends read the key again at commit';

-- The statement trigger on outbox.commands (and, through Citus, on each
-- of its shards): an insert into a shard wakes that node's worker at its
-- commit (src/shared.c), also for a decision routed from the coordinator.
CREATE FUNCTION @extschema@._citus_commands_inserted()
RETURNS trigger
LANGUAGE c
AS 'MODULE_PATHNAME', 'outbox_citus_commands_inserted';
COMMENT ON FUNCTION @extschema@._citus_commands_inserted()
	IS 'trigger on every shard of commands: wake that node''s worker when the inserting transaction commits';

-- This node's local copies to the keys of a distributed outbox (true) or
-- of a single server (false).  Idempotent: a node already in that shape
-- is left alone.  On a worker the tables may be a distributed table's
-- shells: the DDL changes the shell only (Citus's DDL propagation is off
-- for it), since the shards are made from the coordinator's definition.
CREATE FUNCTION @extschema@._citus_keys(distributed pg_catalog.bool)
RETURNS pg_catalog.bool
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
	propagation pg_catalog.text := pg_catalog.current_setting('citus.enable_ddl_propagation', true);
BEGIN
	IF (SELECT i.indnatts OPERATOR(pg_catalog.=) 2 FROM pg_catalog.pg_index i
		 WHERE i.indexrelid OPERATOR(pg_catalog.=) '@extschema@.commands_pkey'::pg_catalog.regclass)
	   OPERATOR(pg_catalog.=) distributed THEN
		RETURN false;
	END IF;
	IF propagation IS NOT NULL THEN
		PERFORM pg_catalog.set_config('citus.enable_ddl_propagation', 'off', true);
	END IF;
	IF distributed THEN
		ALTER TABLE @extschema@.commands DROP CONSTRAINT commands_pkey,
			ADD CONSTRAINT commands_pkey PRIMARY KEY (run_id, command_id);
		ALTER TABLE @extschema@.receipts DROP CONSTRAINT receipts_pkey,
			ADD CONSTRAINT receipts_pkey PRIMARY KEY (run_id, command_id);
		ALTER TABLE @extschema@.inbox DROP CONSTRAINT inbox_pkey,
			ADD CONSTRAINT inbox_pkey PRIMARY KEY (run_id, consumer, command_id);
		ALTER TABLE @extschema@.purged DROP CONSTRAINT purged_pkey,
			ADD CONSTRAINT purged_pkey PRIMARY KEY (run_id, command_id);
		DROP INDEX @extschema@.events_command_id_key;
		CREATE UNIQUE INDEX events_command_id_key ON @extschema@.events (run_id, command_id)
			WHERE command_id IS NOT NULL;
	ELSE
		ALTER TABLE @extschema@.commands DROP CONSTRAINT commands_pkey,
			ADD CONSTRAINT commands_pkey PRIMARY KEY (command_id);
		ALTER TABLE @extschema@.receipts DROP CONSTRAINT receipts_pkey,
			ADD CONSTRAINT receipts_pkey PRIMARY KEY (command_id);
		ALTER TABLE @extschema@.inbox DROP CONSTRAINT inbox_pkey,
			ADD CONSTRAINT inbox_pkey PRIMARY KEY (consumer, command_id);
		ALTER TABLE @extschema@.purged DROP CONSTRAINT purged_pkey,
			ADD CONSTRAINT purged_pkey PRIMARY KEY (command_id);
		DROP INDEX @extschema@.events_command_id_key;
		CREATE UNIQUE INDEX events_command_id_key ON @extschema@.events (command_id)
			WHERE command_id IS NOT NULL;
	END IF;
	IF propagation IS NOT NULL THEN
		PERFORM pg_catalog.set_config('citus.enable_ddl_propagation', propagation, true);
	END IF;
	RETURN true;
END;
$$;
COMMENT ON FUNCTION @extschema@._citus_keys(pg_catalog.bool)
	IS 'bring this node''s outbox tables to the keys of a distributed outbox (true) or a single server (false)';

-- Refuse (55000) unless Citus is installed here and this is its
-- coordinator.
CREATE FUNCTION @extschema@._citus_require_coordinator(what pg_catalog.text)
RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
	coordinator pg_catalog.bool;
BEGIN
	IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_extension e
					WHERE e.extname OPERATOR(pg_catalog.=) 'citus') THEN
		RAISE EXCEPTION '% needs Citus', what
			USING ERRCODE = 'object_not_in_prerequisite_state',
				  DETAIL = 'The extension citus is not installed in this database.',
				  HINT = 'Without Citus the outbox''s tables are the single server''s, as CREATE EXTENSION made them.';
	END IF;
	EXECUTE 'SELECT pg_catalog.citus_is_coordinator()' INTO coordinator;
	IF NOT coordinator THEN
		RAISE EXCEPTION '% runs on the Citus coordinator only', what
			USING ERRCODE = 'object_not_in_prerequisite_state',
				  DETAIL = 'This node is a Citus worker.';
	END IF;
END;
$$;
COMMENT ON FUNCTION @extschema@._citus_require_coordinator(pg_catalog.text)
	IS 'raise 55000 unless Citus is installed and this is its coordinator';

-- Run a query on every worker (run_command_on_workers) and return the
-- results; a node that fails the query stops the caller with its error.
CREATE FUNCTION @extschema@._citus_on_workers(query pg_catalog.text)
RETURNS TABLE (node pg_catalog.text, result pg_catalog.text)
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
	r record;
BEGIN
	FOR r IN EXECUTE 'SELECT w.nodename, w.nodeport, w.success, w.result
						FROM pg_catalog.run_command_on_workers($1) w
					   ORDER BY w.nodename, w.nodeport' USING query
	LOOP
		IF NOT r.success THEN
			RAISE EXCEPTION 'worker %:% failed: %', r.nodename, r.nodeport, r.result
				USING ERRCODE = 'object_not_in_prerequisite_state';
		END IF;
		node := pg_catalog.concat(r.nodename, ':', r.nodeport);
		result := r.result;
		RETURN NEXT;
	END LOOP;
END;
$$;
COMMENT ON FUNCTION @extschema@._citus_on_workers(pg_catalog.text)
	IS 'run a query on every Citus worker, raising the first node''s failure';

CREATE FUNCTION @extschema@.distribute(colocate_with pg_catalog.text DEFAULT NULL)
RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
	version pg_catalog.text := (SELECT e.extversion FROM pg_catalog.pg_extension e
								 WHERE e.extname OPERATOR(pg_catalog.=) 'outbox');
	group_of pg_catalog.text := COALESCE(distribute.colocate_with, 'default');
	r record;
	t pg_catalog.text;
BEGIN
	PERFORM @extschema@._citus_require_coordinator('outbox.distribute()');
	IF @extschema@._distributed() THEN
		RAISE EXCEPTION 'the outbox is distributed already'
			USING ERRCODE = 'object_not_in_prerequisite_state',
				  HINT = 'outbox.undistribute() makes its tables local again.';
	END IF;
	IF distribute.colocate_with IS NOT NULL THEN
		IF pg_catalog.to_regclass(distribute.colocate_with) IS NULL THEN
			RAISE EXCEPTION 'colocate_with names no table: %', distribute.colocate_with
				USING ERRCODE = 'invalid_parameter_value';
		END IF;
		EXECUTE 'SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_dist_partition p
								 WHERE p.logicalrelid OPERATOR(pg_catalog.=) $1
								   AND p.partmethod OPERATOR(pg_catalog.=) ''h'')'
		   INTO r USING pg_catalog.to_regclass(distribute.colocate_with);
		IF NOT r.exists THEN
			RAISE EXCEPTION 'colocate_with must name a hash-distributed table: %', distribute.colocate_with
				USING ERRCODE = 'invalid_parameter_value';
		END IF;
	END IF;
	-- A command with an ordering key that is not published yet would be
	-- stuck: releasing the next command of its key is a statement over the
	-- key's commands, which sit on several shards (Citus refuses it), and
	-- ordered delivery is refused on a distributed outbox.
	IF EXISTS (SELECT 1 FROM @extschema@.commands c
				WHERE c.ordering_key IS NOT NULL
				  AND c.status OPERATOR(pg_catalog.<>) 'published') THEN
		RAISE EXCEPTION 'the outbox holds commands with an ordering key that are not published'
			USING ERRCODE = 'object_not_in_prerequisite_state',
				  DETAIL = 'Ordered delivery is not supported on a distributed outbox: the release of a key''s next command could not run there.',
				  HINT = 'Let the publishers deliver them first (a dead head: outbox.requeue or outbox.skip_head, an uncertain one: outbox.resolve); outbox.blocked_keys lists the keys that wait.';
	END IF;
	-- Every worker has this version, and its own outbox holds nothing that
	-- the distributed tables would hide (its lease key stays, unread, and
	-- comes back with undistribute()).
	FOR r IN SELECT w.node, w.result FROM @extschema@._citus_on_workers(
		'SELECT COALESCE((SELECT e.extversion FROM pg_catalog.pg_extension e WHERE e.extname = ''outbox''), ''none'')
		 || '' '' || ((SELECT count(*) FROM outbox.events) + (SELECT count(*) FROM outbox.commands)
		 + (SELECT count(*) FROM outbox.receipts) + (SELECT count(*) FROM outbox.inbox)
		 + (SELECT count(*) FROM outbox.purged) + (SELECT count(*) FROM outbox.policies)
		 + (SELECT count(*) FROM outbox.consumers))') w
	LOOP
		IF pg_catalog.split_part(r.result, ' ', 1) OPERATOR(pg_catalog.<>) version THEN
			RAISE EXCEPTION 'worker % has outbox %, the coordinator %', r.node,
				pg_catalog.split_part(r.result, ' ', 1), version
				USING ERRCODE = 'object_not_in_prerequisite_state';
		END IF;
		IF pg_catalog.split_part(r.result, ' ', 2) OPERATOR(pg_catalog.<>) '0' THEN
			RAISE EXCEPTION 'worker %''s own outbox holds % rows', r.node, pg_catalog.split_part(r.result, ' ', 2)
				USING ERRCODE = 'object_not_in_prerequisite_state',
					  DETAIL = 'Distributed tables would hide them: the worker''s tables become the distributed tables'' shells.',
					  HINT = 'Drain and purge that node''s outbox, or move its rows to the coordinator, first.';
		END IF;
	END LOOP;
	-- The workers' copies first: run_command_on_workers commits on each
	-- worker by itself, outside this transaction, so it must not wait for
	-- locks this transaction takes there.  Should the rest fail, they are
	-- put back.
	PERFORM @extschema@._citus_on_workers('SELECT outbox._citus_keys(true)');
	-- The workers' own counts of the checks are of their local tables,
	-- which the shards replace: forgotten (the coordinator's worker counts
	-- the distributed outbox, outbox.metrics_checks() there).
	PERFORM @extschema@._citus_on_workers(
		'UPDATE outbox.check_results SET violations = NULL, computed_at = NULL, duration_seconds = NULL');
	BEGIN
		PERFORM @extschema@._citus_keys(true);
		FOREACH t IN ARRAY @extschema@._citus_tables(true)
		LOOP
			EXECUTE 'SELECT pg_catalog.create_reference_table($1)'
			  USING pg_catalog.format('@extschema@.%I', t)::pg_catalog.regclass;
		END LOOP;
		-- A rotation of the key must reach every node's backends: Citus
		-- puts the trigger on each node's copy of lease_key (it allows
		-- triggers on reference tables only when told to).
		PERFORM pg_catalog.set_config('citus.enable_unsafe_triggers', 'on', true);
		CREATE TRIGGER lease_key_changed
			AFTER INSERT OR UPDATE OR DELETE ON @extschema@.lease_key
			FOR EACH STATEMENT EXECUTE FUNCTION @extschema@._citus_lease_key_changed();
		FOREACH t IN ARRAY @extschema@._citus_tables(false)
		LOOP
			EXECUTE 'SELECT pg_catalog.create_distributed_table($1, ''run_id'', colocate_with => $2)'
			  USING pg_catalog.format('@extschema@.%I', t)::pg_catalog.regclass, group_of;
			group_of := '@extschema@.events';
		END LOOP;
		-- A decision routed from the coordinator wakes the worker of the
		-- node it commits on (Citus puts the trigger on every shard).
		CREATE TRIGGER commands_inserted
			AFTER INSERT ON @extschema@.commands
			FOR EACH STATEMENT EXECUTE FUNCTION @extschema@._citus_commands_inserted();
		-- The coordinator's relations keep the rows they held, now copied
		-- into the shards: empty them (Citus reads the shards only).
		FOREACH t IN ARRAY @extschema@._citus_tables(true) OPERATOR(pg_catalog.||) @extschema@._citus_tables(false)
		LOOP
			EXECUTE 'SELECT pg_catalog.truncate_local_data_after_distributing_table($1)'
			  USING pg_catalog.format('@extschema@.%I', t)::pg_catalog.regclass;
		END LOOP;
	EXCEPTION WHEN OTHERS THEN
		PERFORM @extschema@._citus_on_workers('SELECT outbox._citus_keys(false)');
		RAISE;
	END;
END;
$$;
COMMENT ON FUNCTION @extschema@.distribute(pg_catalog.text)
	IS 'distribute the outbox on Citus (on the coordinator): events, commands, receipts, inbox and purged by run_id, co-located (with colocate_with''s group when given), policies, consumers and lease_key as reference tables';

CREATE FUNCTION @extschema@.undistribute()
RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
	t pg_catalog.text;
	rel pg_catalog.regclass;
	r record;
	ok pg_catalog.bool;
	res pg_catalog.text;
BEGIN
	PERFORM @extschema@._citus_require_coordinator('outbox.undistribute()');
	IF NOT @extschema@._distributed() THEN
		RAISE EXCEPTION 'the outbox is not distributed'
			USING ERRCODE = 'object_not_in_prerequisite_state';
	END IF;
	-- The copies a shard move left behind for Citus's deferred cleanup
	-- (pg_dist_cleanup): dropped now on their nodes, since DROP EXTENSION
	-- would fail on them there.  (CALL citus_cleanup_orphaned_resources()
	-- would do it, but refuses to run inside a transaction block.)  Citus
	-- takes a copy for a shard by its name, so the drop says it is meant.
	FOR r IN EXECUTE 'SELECT c.record_id, c.object_name, n.nodename, n.nodeport
						FROM pg_catalog.pg_dist_cleanup c
						JOIN pg_catalog.pg_dist_node n ON n.groupid OPERATOR(pg_catalog.=) c.node_group_id
					   WHERE c.object_type OPERATOR(pg_catalog.=) 1
						 AND c.object_name LIKE ''@extschema@.%'''
	LOOP
		EXECUTE 'SELECT w.success, w.result FROM pg_catalog.master_run_on_worker($1, $2, $3, false) w'
		   INTO ok, res
		  USING ARRAY[r.nodename], ARRAY[r.nodeport],
				ARRAY[pg_catalog.format('SET citus.enable_manual_changes_to_shards = on; DROP TABLE IF EXISTS %s',
										r.object_name)];
		IF NOT ok THEN
			RAISE EXCEPTION 'worker %:% failed: %', r.nodename, r.nodeport, res
				USING ERRCODE = 'object_not_in_prerequisite_state';
		END IF;
		EXECUTE 'DELETE FROM pg_catalog.pg_dist_cleanup c WHERE c.record_id OPERATOR(pg_catalog.=) $1'
		  USING r.record_id;
	END LOOP;
	-- The workers' shells first (outside this transaction, as in
	-- distribute()), put back should the rest fail.  A shell's keys hold
	-- nothing: the shards keep theirs until they are dropped.
	PERFORM @extschema@._citus_on_workers('SELECT outbox._citus_keys(false)');
	BEGIN
		-- distribute()'s trigger, from every node's copy of lease_key
		PERFORM pg_catalog.set_config('citus.enable_unsafe_triggers', 'on', true);
		DROP TRIGGER IF EXISTS lease_key_changed ON @extschema@.lease_key;
		DROP TRIGGER IF EXISTS commands_inserted ON @extschema@.commands;
		FOREACH t IN ARRAY @extschema@._citus_tables(false) OPERATOR(pg_catalog.||) @extschema@._citus_tables(true)
		LOOP
			rel := pg_catalog.format('@extschema@.%I', t)::pg_catalog.regclass;
			-- the rows, read from the shards
			EXECUTE pg_catalog.format('CREATE TEMP TABLE %I ON COMMIT DROP AS SELECT * FROM @extschema@.%I',
									  '_outbox_' OPERATOR(pg_catalog.||) t, t);
			-- the worker nodes' metadata (their copies stay: the extension
			-- owns them), the shards, the coordinator's metadata
			PERFORM pg_catalog.master_remove_distributed_table_metadata_from_workers(rel, '@extschema@', t);
			PERFORM pg_catalog.citus_drop_all_shards(rel, '@extschema@', t, drop_shards_metadata_only => false);
			PERFORM pg_catalog.master_remove_partition_metadata(rel, '@extschema@', t);
			PERFORM pg_catalog.master_unmark_object_distributed('pg_catalog.pg_class'::pg_catalog.regclass, rel, 0);
		END LOOP;
		-- 23505 here: a command_id used by two runs, which a single server
		-- does not allow
		PERFORM @extschema@._citus_keys(false);
		FOREACH t IN ARRAY @extschema@._citus_tables(false) OPERATOR(pg_catalog.||) @extschema@._citus_tables(true)
		LOOP
			EXECUTE pg_catalog.format('INSERT INTO @extschema@.%I SELECT * FROM %I', t, '_outbox_' OPERATOR(pg_catalog.||) t);
			EXECUTE pg_catalog.format('DROP TABLE %I', '_outbox_' OPERATOR(pg_catalog.||) t);
		END LOOP;
	EXCEPTION WHEN OTHERS THEN
		PERFORM @extschema@._citus_on_workers('SELECT outbox._citus_keys(true)');
		RAISE;
	END;
END;
$$;
COMMENT ON FUNCTION @extschema@.undistribute()
	IS 'make the distributed outbox''s tables local to the coordinator again, with their rows (on the coordinator)';

-- Called by the utility hook of src/citus.c before DROP EXTENSION outbox:
-- on the coordinator of a distributed outbox, undistribute it, so that no
-- shard stays behind on any node.
CREATE FUNCTION @extschema@._before_drop()
RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
	coordinator pg_catalog.bool;
BEGIN
	IF NOT @extschema@._distributed() THEN
		RETURN;
	END IF;
	EXECUTE 'SELECT pg_catalog.citus_is_coordinator()' INTO coordinator;
	IF coordinator THEN
		-- Citus runs DROP EXTENSION only in a transaction that opened no
		-- parallel connections to the shards
		PERFORM pg_catalog.set_config('citus.multi_shard_modify_mode', 'sequential', true);
		PERFORM @extschema@.undistribute();
	END IF;
END;
$$;
COMMENT ON FUNCTION @extschema@._before_drop()
	IS 'before DROP EXTENSION outbox: undistribute a distributed outbox (on the coordinator)';
