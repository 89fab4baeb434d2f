-- outbox install script, part 05: the four group roles of this database.
--
-- Roles are cluster-wide, but a grant to a role reaches every database
-- that grants it something; so each database that installs the extension
-- gets its own group roles, named after it, created when missing:
--   <db>_outbox_producer, <db>_outbox_publisher, <db>_outbox_consumer,
--   <db>_outbox_admin
-- where <db> is current_database().  outbox.role(capability) names them.
-- Nothing is ever granted to a role of another database, nor to the
-- cluster-wide outbox_* roles of version 0.1.0.  Later parts grant to these
-- roles; part 90 holds the privilege model.

-- This database's group role for a capability: producer, publisher,
-- consumer or admin.
CREATE FUNCTION @extschema@.role(capability pg_catalog.text)
RETURNS pg_catalog.name
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
	r pg_catalog.name;
BEGIN
	IF capability IS NULL THEN
		RAISE EXCEPTION 'capability must not be null' USING ERRCODE = 'null_value_not_allowed';
	END IF;
	IF capability OPERATOR(pg_catalog.<>) ALL (ARRAY['producer', 'publisher', 'consumer', 'admin']) THEN
		RAISE EXCEPTION 'capability must be producer, publisher, consumer or admin'
			USING ERRCODE = 'invalid_parameter_value',
				  DETAIL = pg_catalog.format('The value was "%s".', capability);
	END IF;
	r := pg_catalog.current_database() OPERATOR(pg_catalog.||) '_outbox_' OPERATOR(pg_catalog.||) capability;
	RETURN r;
END;
$$;
COMMENT ON FUNCTION @extschema@.role(pg_catalog.text)
	IS 'this database''s group role for a capability: producer, publisher, consumer or admin';

DO $$
DECLARE
	c pg_catalog.text;
	r pg_catalog.text;
BEGIN
	-- The longest name, <db>_outbox_publisher, must fit in a role name
	-- (NAMEDATALEN - 1 bytes) uncut: a cut name could be another
	-- database's.
	IF pg_catalog.octet_length(pg_catalog.current_database() OPERATOR(pg_catalog.||) '_outbox_publisher')
	   OPERATOR(pg_catalog.>) 63 THEN
		RAISE EXCEPTION 'database name "%" is too long for the outbox group roles',
			pg_catalog.current_database()
			USING ERRCODE = 'name_too_long',
				  DETAIL = 'The group roles are named <database>_outbox_publisher and so on, at most 63 bytes; the database name may have at most 46 bytes.',
				  HINT = 'Install the extension in a database with a shorter name.';
	END IF;
	FOREACH c IN ARRAY ARRAY['producer', 'publisher', 'consumer', 'admin']
	LOOP
		r := @extschema@.role(c);
		IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_roles WHERE rolname OPERATOR(pg_catalog.=) r) THEN
			EXECUTE pg_catalog.format('CREATE ROLE %I NOLOGIN', r);
		END IF;
	END LOOP;
END;
$$;
