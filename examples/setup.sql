-- The shop of the examples: run once per database, as a superuser, after
-- CREATE EXTENSION outbox (psql -v ON_ERROR_STOP=1 -f examples/setup.sql).
--
-- Three login roles, one per part (created when missing: roles belong to
-- the cluster), each a member of this database's outbox group role for its
-- part (outbox.role() names it: <database>_outbox_producer ...), and
-- the two business tables: the producer's orders and the consumer's
-- charges.  A charge has no unique key of its own on purpose: what keeps it
-- to one per command is the consumer's inbox.

SELECT format('CREATE ROLE %I LOGIN', r)
  FROM unnest(ARRAY['shop_producer', 'shop_publisher', 'shop_consumer']) AS r
 WHERE NOT EXISTS (SELECT FROM pg_roles WHERE rolname = r) \gexec
SELECT format('GRANT %I TO %I', outbox.role(capability), 'shop_' || capability)
  FROM unnest(ARRAY['producer', 'publisher', 'consumer']) AS capability \gexec
-- The consumer's name, under which only shop_consumer may accept commands.
SELECT outbox.register_consumer('billing', 'shop_consumer');

CREATE TABLE shop_orders (
	order_id	text PRIMARY KEY,
	amount_cents bigint NOT NULL,
	placed_at	timestamptz NOT NULL DEFAULT now()
);
GRANT SELECT, INSERT ON shop_orders TO shop_producer;

CREATE TABLE shop_charges (
	id			bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
	command_id	text NOT NULL,
	order_id	text NOT NULL,
	amount_cents bigint NOT NULL,
	charged_at	timestamptz NOT NULL DEFAULT now()
);
GRANT SELECT, INSERT ON shop_charges TO shop_consumer;
