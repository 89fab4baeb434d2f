-- outbox install script, part 90: roles and privileges.
--
-- Four group roles (cluster-wide, created when missing) carry the rights;
-- the DBA grants them to login roles.  PUBLIC gets nothing: not even USAGE
-- on the schema.  Nobody but the owner has a privilege on a table; the API
-- functions are SECURITY DEFINER and run as the owner.

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

REVOKE ALL ON SCHEMA @extschema@ FROM PUBLIC;
REVOKE ALL ON ALL TABLES IN SCHEMA @extschema@ FROM PUBLIC;
REVOKE ALL ON ALL FUNCTIONS IN SCHEMA @extschema@ FROM PUBLIC;

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

-- Helpers the SECURITY DEFINER functions call run as the owner; the
-- informational function is harmless for anyone with schema usage.
GRANT EXECUTE ON FUNCTION @extschema@.preloaded()
	TO outbox_producer, outbox_publisher, outbox_consumer, outbox_admin, pg_monitor;
