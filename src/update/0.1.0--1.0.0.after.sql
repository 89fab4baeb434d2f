-- outbox update script from 0.1.0 to 1.0.0, hand-written last part (after
-- the parts of src/sql/, see the Makefile).
--
-- The cluster-wide group roles of 0.1.0 (outbox_producer, ...) get nothing
-- from 1.0.0, whose roles are this database's (part 05): what they still
-- hold here (USAGE on the schema; the functions and types were made again
-- without them) is revoked, and a WARNING names the members of each, with
-- the GRANT of this database's role that gives them back what they had.
-- The roles themselves stay: other databases may still run 0.1.0.
DO $$
DECLARE
	c pg_catalog.text;
	old pg_catalog.name;
	members pg_catalog.text;
	grants pg_catalog.text := '';
BEGIN
	FOREACH c IN ARRAY ARRAY['producer', 'publisher', 'consumer', 'admin']
	LOOP
		old := pg_catalog.concat('outbox_', c);
		CONTINUE WHEN NOT EXISTS (SELECT 1 FROM pg_catalog.pg_roles r WHERE r.rolname OPERATOR(pg_catalog.=) old);
		EXECUTE pg_catalog.format('REVOKE ALL ON SCHEMA @extschema@ FROM %I', old);
		EXECUTE pg_catalog.format('REVOKE ALL ON ALL TABLES IN SCHEMA @extschema@ FROM %I', old);
		EXECUTE pg_catalog.format('REVOKE ALL ON ALL FUNCTIONS IN SCHEMA @extschema@ FROM %I', old);
		EXECUTE pg_catalog.format('REVOKE ALL ON DOMAIN @extschema@.command_status, @extschema@.command_version, @extschema@.command_deliveries FROM %I', old);
		SELECT pg_catalog.string_agg(pg_catalog.quote_ident(m.rolname), ', ' ORDER BY m.rolname) INTO members
		  FROM pg_catalog.pg_auth_members a
		  JOIN pg_catalog.pg_roles g ON g.oid OPERATOR(pg_catalog.=) a.roleid
		  JOIN pg_catalog.pg_roles m ON m.oid OPERATOR(pg_catalog.=) a.member
		 WHERE g.rolname OPERATOR(pg_catalog.=) old;
		IF members IS NOT NULL THEN
			grants := pg_catalog.concat(grants, pg_catalog.format('GRANT %I TO %s; ', @extschema@.role(c), members));
		END IF;
	END LOOP;
	IF grants OPERATOR(pg_catalog.<>) '' THEN
		RAISE WARNING 'the roles outbox_producer, outbox_publisher, outbox_consumer and outbox_admin of 0.1.0 have no rights in this database any more'
			USING DETAIL = pg_catalog.rtrim(grants),
				  HINT = 'Run these GRANTs to give their members the rights they had, through this database''s roles.';
	END IF;
END;
$$;

-- The consumer names 0.1.0's inbox holds are registered to this
-- database's consumer role: every consumer may go on using them, as under
-- 0.1.0; outbox.register_consumer gives a name to a narrower role.
INSERT INTO @extschema@.consumers (consumer, role)
SELECT DISTINCT i.consumer, @extschema@.role('consumer')::pg_catalog.regrole
  FROM @extschema@.inbox i;

-- Put right the initial privileges of the tables, domains and the schema
-- (saved by part 0 of 0.1.0--1.0.0.sql): the update's GRANTs and REVOKEs
-- recorded their whole ACLs, a DBA's grants included.  The initial
-- privileges become the ACL as it is now without the entries that were in
-- the ACL but not in the initial privileges before the update (the DBA's),
-- which is what a fresh install records; the ACLs themselves, the DBA's
-- grants included, stay as they are.
DO $$
DECLARE
	o pg_catalog.jsonb;
	acl pg_catalog.aclitem[];
	dba pg_catalog.aclitem[];
	init pg_catalog.aclitem[];
BEGIN
	FOR o IN
		SELECT x.value
		  FROM pg_catalog.jsonb_array_elements(
			  pg_catalog.current_setting('outbox_update.privileges')::pg_catalog.jsonb) x
	LOOP
		SELECT pg_catalog.array_agg(a.item) INTO dba
		  FROM pg_catalog.unnest(pg_catalog.jsonb_extract_path_text(o, 'acl')::pg_catalog.aclitem[]) AS a(item)
		 WHERE NOT a.item OPERATOR(pg_catalog.=) ANY
			   (pg_catalog.jsonb_extract_path_text(o, 'init')::pg_catalog.aclitem[]);
		CONTINUE WHEN dba IS NULL;
		SELECT COALESCE(c.relacl, t.typacl, n.nspacl) INTO acl
		  FROM (SELECT pg_catalog.jsonb_extract_path_text(o, 'class')::pg_catalog.oid AS classid,
					   pg_catalog.jsonb_extract_path_text(o, 'oid')::pg_catalog.oid AS objid) k
		  LEFT JOIN pg_catalog.pg_class c
			ON k.classid OPERATOR(pg_catalog.=) 'pg_catalog.pg_class'::pg_catalog.regclass
		   AND c.oid OPERATOR(pg_catalog.=) k.objid
		  LEFT JOIN pg_catalog.pg_type t
			ON k.classid OPERATOR(pg_catalog.=) 'pg_catalog.pg_type'::pg_catalog.regclass
		   AND t.oid OPERATOR(pg_catalog.=) k.objid
		  LEFT JOIN pg_catalog.pg_namespace n
			ON k.classid OPERATOR(pg_catalog.=) 'pg_catalog.pg_namespace'::pg_catalog.regclass
		   AND n.oid OPERATOR(pg_catalog.=) k.objid;
		SELECT pg_catalog.array_agg(a.item ORDER BY a.ord) INTO init
		  FROM pg_catalog.unnest(acl) WITH ORDINALITY AS a(item, ord)
		 WHERE NOT a.item OPERATOR(pg_catalog.=) ANY (dba);
		UPDATE pg_catalog.pg_init_privs i
		   SET initprivs = COALESCE(init, ARRAY[]::pg_catalog.aclitem[])
		 WHERE i.classoid OPERATOR(pg_catalog.=) pg_catalog.jsonb_extract_path_text(o, 'class')::pg_catalog.oid
		   AND i.objoid OPERATOR(pg_catalog.=) pg_catalog.jsonb_extract_path_text(o, 'oid')::pg_catalog.oid
		   AND i.objsubid OPERATOR(pg_catalog.=) 0;
	END LOOP;
	PERFORM pg_catalog.set_config('outbox_update.privileges', '', true);
END;
$$;
