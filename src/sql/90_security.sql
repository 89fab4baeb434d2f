-- outbox install script, part 90: roles and privileges.
--
-- Four group roles of this database (part 05: <db>_outbox_producer and so
-- on, named by outbox.role(capability)) carry the rights; the DBA grants
-- them to login roles:
--   producer   commit_decision, commit_decisions, record_event
--   publisher  claim, ack (both forms), fail, renew
--   consumer   complete, inbox_accept
--   admin      requeue, resolve, skip_head, set_policy, register_consumer,
--              unregister_consumer, pause, resume, purge, sweep,
--              stats_reset, verify and every view
-- Within these, a kind's policy may narrow who decides, claims and
-- completes it, and a consumer name belongs to the role it is registered
-- to (src/authz.c).
-- pg_monitor reads the views and may call verify().  PUBLIC gets nothing,
-- not even USAGE on the schema, and no role of another database gets
-- anything.  Nobody but the owner has a privilege on a table: the API
-- functions run their body as the owner (the C ones through
-- OutboxCallAsOwner, the PL/pgSQL ones as SECURITY DEFINER) and pin
-- search_path to pg_catalog, pg_temp.  Internal helpers (names starting
-- with "_") are called by those functions as the owner and granted to
-- nobody, except _stats() and _workers(), which the views outbox.stats and
-- outbox.workers call with the reader's rights, and _blocked_keys()
-- (SECURITY DEFINER), which the view outbox.blocked_keys calls.
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
		IF g.rolname OPERATOR(pg_catalog.=) ANY (ARRAY[@extschema@.role('producer'), @extschema@.role('publisher'),
			@extschema@.role('consumer'), @extschema@.role('admin'), 'pg_monitor']::pg_catalog.name[]) THEN
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
REVOKE ALL ON TYPE @extschema@.lease, @extschema@.ack_result, @extschema@.handover_result, @extschema@.decision_result, @extschema@.command_status,
	@extschema@.command_version, @extschema@.command_deliveries FROM PUBLIC;

-- The grants name this database's roles (part 05).
DO $$
DECLARE
	producer CONSTANT pg_catalog.text := pg_catalog.quote_ident(@extschema@.role('producer'));
	publisher CONSTANT pg_catalog.text := pg_catalog.quote_ident(@extschema@.role('publisher'));
	consumer CONSTANT pg_catalog.text := pg_catalog.quote_ident(@extschema@.role('consumer'));
	admin CONSTANT pg_catalog.text := pg_catalog.quote_ident(@extschema@.role('admin'));
BEGIN
	EXECUTE 'GRANT USAGE ON SCHEMA @extschema@ TO ' OPERATOR(pg_catalog.||) pg_catalog.concat_ws(', ', producer, publisher, consumer, admin, 'pg_monitor');

	EXECUTE 'GRANT EXECUTE ON FUNCTION
	@extschema@.commit_decision(pg_catalog.text, pg_catalog.int8, pg_catalog.text, pg_catalog.text, pg_catalog.text, pg_catalog.jsonb, pg_catalog.jsonb, pg_catalog.timestamptz, pg_catalog.int4, pg_catalog.jsonb, pg_catalog.text),
	@extschema@.commit_decisions(pg_catalog.jsonb),
	@extschema@.record_event(pg_catalog.text, pg_catalog.int8, pg_catalog.text, pg_catalog.jsonb)
	TO ' OPERATOR(pg_catalog.||) producer;
	-- The result type of the batch decision.
	EXECUTE 'GRANT USAGE ON TYPE @extschema@.decision_result TO ' OPERATOR(pg_catalog.||) producer;

	EXECUTE 'GRANT EXECUTE ON FUNCTION
	@extschema@.claim(pg_catalog.text, pg_catalog.int4, pg_catalog.interval, pg_catalog.text[]),
	@extschema@.ack(pg_catalog.text, pg_catalog.text),
	@extschema@.ack_many(pg_catalog.text, pg_catalog.text[]),
	@extschema@.ack_handover(pg_catalog.text, pg_catalog.text[], pg_catalog.int4, pg_catalog.interval, pg_catalog.text[]),
	@extschema@.fail(pg_catalog.text, pg_catalog.text, pg_catalog.text, pg_catalog.bool),
	@extschema@.renew(pg_catalog.text, pg_catalog.text, pg_catalog.interval)
	TO ' OPERATOR(pg_catalog.||) publisher;
	-- The result types of claim, ack_many and ack_handover, for publishers
	-- that wrap these calls in functions of their own.
	EXECUTE 'GRANT USAGE ON TYPE @extschema@.lease, @extschema@.ack_result, @extschema@.handover_result TO ' OPERATOR(pg_catalog.||) publisher;

	EXECUTE 'GRANT EXECUTE ON FUNCTION
	@extschema@.complete(pg_catalog.text, pg_catalog.text, pg_catalog.text, pg_catalog.jsonb),
	@extschema@.inbox_accept(pg_catalog.text, pg_catalog.text, pg_catalog.text)
	TO ' OPERATOR(pg_catalog.||) consumer;

	EXECUTE 'GRANT EXECUTE ON FUNCTION
	@extschema@.requeue(pg_catalog.text, pg_catalog.text, pg_catalog.text),
	@extschema@.resolve(pg_catalog.text, pg_catalog.text, pg_catalog.text, pg_catalog.text),
	@extschema@.set_policy(pg_catalog.text, pg_catalog.int4, pg_catalog.interval, pg_catalog.interval, pg_catalog.interval, pg_catalog.text, pg_catalog.interval, pg_catalog.regrole[], pg_catalog.regrole[], pg_catalog.regrole[], pg_catalog.bool, pg_catalog.text),
	@extschema@.skip_head(pg_catalog.text, pg_catalog.regrole),
	@extschema@.register_consumer(pg_catalog.text, pg_catalog.regrole),
	@extschema@.unregister_consumer(pg_catalog.text),
	@extschema@.pause(pg_catalog.text),
	@extschema@.resume(pg_catalog.text),
	@extschema@.purge(pg_catalog.int4, pg_catalog.interval),
	@extschema@.sweep(pg_catalog.int4),
	@extschema@.rotate_lease_key()
	TO ' OPERATOR(pg_catalog.||) admin;

	-- The informational functions are harmless for anyone with schema usage.
	EXECUTE 'GRANT EXECUTE ON FUNCTION @extschema@.preloaded(), @extschema@.role(pg_catalog.text) TO '
		OPERATOR(pg_catalog.||) pg_catalog.concat_ws(', ', producer, publisher, consumer, admin, 'pg_monitor');
END;
$$;
