-- outbox update script from 0.1.0 to 1.0.0, hand-written last part (after
-- the parts of src/sql/, see the Makefile).
--
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
