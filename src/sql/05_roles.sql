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
