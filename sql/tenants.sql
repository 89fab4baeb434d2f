--
-- Tenants: what one role may do to another's commands.  Every attempt
-- across roles is refused with its own SQLSTATE and changes nothing; the
-- fingerprint of the tables is compared before and after each group.
--
DROP EXTENSION outbox;
CREATE EXTENSION outbox;
\set VERBOSITY terse

-- Two producers (checkout and refunds), two consumers (mailer and billing)
-- and a publisher, each a member of this database's group role.
CREATE ROLE regress_checkout;
CREATE ROLE regress_refunds;
CREATE ROLE regress_mailer;
CREATE ROLE regress_billing;
CREATE ROLE regress_relay;
DO $$
BEGIN
	EXECUTE format('GRANT %I TO regress_checkout, regress_refunds', outbox.role('producer'));
	EXECUTE format('GRANT %I TO regress_mailer, regress_billing', outbox.role('consumer'));
	EXECUTE format('GRANT %I TO regress_relay', outbox.role('publisher'));
END $$;

-- The SQLSTATE of a statement, run in a subtransaction that is rolled back
-- when it fails.
CREATE FUNCTION pg_temp.try(stmt text) RETURNS text LANGUAGE plpgsql AS $$
BEGIN
	EXECUTE stmt;
	RETURN '00000';
EXCEPTION WHEN OTHERS THEN
	RETURN SQLSTATE;
END $$;

-- A fingerprint of everything the outbox holds.
CREATE FUNCTION pg_temp.fingerprint() RETURNS text LANGUAGE sql AS $$
SELECT md5(concat_ws('|',
	(SELECT string_agg(t::text, ',' ORDER BY t::text) FROM outbox.events t),
	(SELECT string_agg(t::text, ',' ORDER BY t::text) FROM outbox.commands t),
	(SELECT string_agg(t::text, ',' ORDER BY t::text) FROM outbox.receipts t),
	(SELECT string_agg(t::text, ',' ORDER BY t::text) FROM outbox.inbox t),
	(SELECT string_agg(t::text, ',' ORDER BY t::text) FROM outbox.consumers t),
	(SELECT string_agg(t::text, ',' ORDER BY t::text) FROM outbox.policies t)))
$$;

-- A kind without deciders is open to every producer; once set_policy lists
-- them, the same session's next decision of the kind is refused.
SET ROLE regress_checkout;
SELECT outbox.commit_decision('order-40', 1, 'payout_requested', 'payout-40', 'payout', '{}');
RESET ROLE;
SELECT outbox.set_policy('payout', deciders => '{regress_refunds}');
SET ROLE regress_checkout;
SELECT pg_temp.try($$SELECT outbox.commit_decision('order-40', 2, 'payout_requested', 'payout-40b', 'payout', '{}')$$) AS decide_payout_after_policy;
RESET ROLE;

-- The administrator's setup: each consumer name belongs to its service,
-- refunds are decided by the refunds service only, and mail is completed
-- by the mailer only.
SELECT outbox.register_consumer('mailer', 'regress_mailer');
SELECT outbox.register_consumer('billing', 'regress_billing');
SELECT outbox.set_policy('refund', deciders => '{regress_refunds}');
SELECT outbox.set_policy('send_mail', completers => '{regress_mailer}');
SELECT kind, deciders, claimers, completers FROM outbox.policies ORDER BY kind;

SET ROLE regress_checkout;
SELECT outbox.commit_decision('order-41', 1, 'ordered', 'mail-41', 'send_mail', '{"to": "ann"}');
RESET ROLE;

--
-- 1. A producer pre-claims another service's command id.
--

-- With a deciders policy the checkout role cannot decide a refund at all.
SET ROLE regress_checkout;
SELECT pg_temp.try($$SELECT outbox.commit_decision('order-42', 1, 'refund_requested', 'refund-order-42', 'refund', '{"to": "mallory"}')$$) AS decide_refund;
SELECT pg_temp.try($$SELECT * FROM outbox.commit_decisions('[{"run_id": "order-42", "seq": 1, "event_kind": "e", "command_id": "refund-order-42", "command_kind": "refund", "payload": {}}]')$$) AS decide_refund_batch;
RESET ROLE;
SELECT count(*) AS refund_commands FROM outbox.commands WHERE command_id = 'refund-order-42';

-- Without one it can take the id under another kind first; the real
-- producer then gets a conflict (23505, commands_pkey), never the false of
-- a retry, and the detail says nothing of the other decision.
SET ROLE regress_checkout;
SELECT outbox.commit_decision('order-43', 1, 'refund_requested', 'refund-order-43', 'refund_note', '{"to": "mallory"}');
RESET ROLE;
SET ROLE regress_refunds;
CREATE FUNCTION pg_temp.conflict(stmt text) RETURNS text LANGUAGE plpgsql AS $$
DECLARE st text; con text; det text;
BEGIN
	EXECUTE stmt;
	RETURN 'recorded';
EXCEPTION WHEN unique_violation THEN
	GET STACKED DIAGNOSTICS st = RETURNED_SQLSTATE, con = CONSTRAINT_NAME, det = PG_EXCEPTION_DETAIL;
	RETURN st || ' ' || con || ': ' || det;
END $$;
SELECT pg_temp.conflict($$SELECT outbox.commit_decision('order-43', 1, 'refund_requested', 'refund-order-43', 'refund', '{"to": "ann"}')$$) AS real_producer;
-- The same decision made by another role is not a retry either.
SELECT pg_temp.conflict($$SELECT outbox.commit_decision('order-43', 1, 'refund_requested', 'refund-order-43', 'refund_note', '{"to": "mallory"}')$$) AS same_decision_other_role;
-- The real producer's own decision, and its retry.
SELECT outbox.commit_decision('order-44', 1, 'refund_requested', 'refund-order-44', 'refund', '{"to": "ann"}') AS recorded;
SELECT outbox.commit_decision('order-44', 1, 'refund_requested', 'refund-order-44', 'refund', '{"to": "ann"}') AS recorded_again;
RESET ROLE;
SELECT command_id, payload, decided_by::regrole FROM outbox.commands
 WHERE command_id LIKE 'refund-%' ORDER BY command_id;

-- The caller is current_user where the call is made: a SECURITY DEFINER
-- function of the refunds service decides as its owner.
CREATE FUNCTION public.refund_via_definer(id text) RETURNS boolean
LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog
AS $$ SELECT outbox.commit_decision('order-45', 1, 'refund_requested', id, 'refund', '{}') $$;
ALTER FUNCTION public.refund_via_definer(text) OWNER TO regress_refunds;
GRANT EXECUTE ON FUNCTION public.refund_via_definer(text) TO regress_checkout;
SET ROLE regress_checkout;
SELECT public.refund_via_definer('refund-order-45');
RESET ROLE;
SELECT command_id, decided_by::regrole FROM outbox.commands WHERE command_id = 'refund-order-45';
DROP FUNCTION public.refund_via_definer(text);

--
-- 2. Consumers.
--
CREATE TEMP TABLE before AS SELECT pg_temp.fingerprint() AS f;
SET ROLE regress_billing;
-- another consumer's name: OB004
SELECT pg_temp.try($$SELECT outbox.inbox_accept('mailer', 'order-41', 'mail-41')$$) AS other_consumer;
-- a name nobody registered: OB003
SELECT pg_temp.try($$SELECT outbox.inbox_accept('mailer-2', 'order-41', 'mail-41')$$) AS unregistered;
-- a command that does not exist, or of another run: OB002
SELECT pg_temp.try($$SELECT outbox.inbox_accept('billing', 'order-41', 'mail-99')$$) AS no_such_command;
SELECT pg_temp.try($$SELECT outbox.inbox_accept('billing', 'order-42', 'mail-41')$$) AS other_run;
-- completing a kind only the mailer may complete: 42501
SELECT pg_temp.try($$SELECT outbox.complete('order-41', 'mail-41', 'rejected')$$) AS complete_other_kind;
SELECT pg_temp.try($$SELECT outbox.complete('order-41', 'mail-99', 'rejected')$$) AS complete_unknown;
-- registering names is for administrators
SELECT pg_temp.try($$SELECT outbox.register_consumer('mailer-2', 'regress_billing')$$) AS register;
SELECT pg_temp.try($$SELECT outbox.unregister_consumer('mailer')$$) AS unregister;
RESET ROLE;
SELECT f = pg_temp.fingerprint() AS unchanged FROM before;

-- The mailer does what billing could not.
SET ROLE regress_mailer;
SELECT outbox.inbox_accept('mailer', 'order-41', 'mail-41') AS accepted;
SELECT outbox.complete('order-41', 'mail-41') AS completed;
RESET ROLE;
SELECT consumer, command_id FROM outbox.inbox ORDER BY consumer, command_id;
SELECT command_id, outcome FROM outbox.receipts ORDER BY command_id;

--
-- 3. Publishers: claim never hands out a kind the caller may not claim,
-- and naming one is refused.
--
SELECT outbox.set_policy('send_mail', claimers => '{}');
SELECT outbox.commit_decision('order-46', 1, 'ordered', 'mail-46', 'send_mail', '{}');
SET ROLE regress_relay;
SELECT command_id FROM outbox.claim('relay-1', 100, kinds => '{refund_note}') ORDER BY command_id;
RESET ROLE;
DROP TABLE before;
CREATE TEMP TABLE before AS SELECT pg_temp.fingerprint() AS f;
SET ROLE regress_relay;
SELECT pg_temp.try($$SELECT * FROM outbox.claim('relay-1', 100, kinds => '{send_mail}')$$) AS claim_forbidden_kind;
SELECT pg_temp.try($$SELECT * FROM outbox.claim('relay-1', 100, kinds => '{refund_note,send_mail}')$$) AS claim_with_forbidden_kind;
RESET ROLE;
SELECT f = pg_temp.fingerprint() AS unchanged FROM before;
SELECT command_id, status FROM outbox.commands WHERE kind = 'send_mail' ORDER BY command_id;
SET ROLE regress_relay;
SELECT count(*) AS claimed_without_mail FROM outbox.claim('relay-1', 100)
 WHERE kind = 'send_mail';
RESET ROLE;
SELECT command_id, status FROM outbox.commands WHERE kind = 'send_mail' ORDER BY command_id;
-- An empty list leaves the kind to the administrators.
SELECT command_id FROM outbox.claim('admin-relay', 100, kinds => '{send_mail}');

--
-- 4. Policies are validated and kept: NULL keeps the current lists.
--
SELECT outbox.set_policy('send_mail', max_deliveries => 3);
SELECT kind, deciders, claimers, completers, max_deliveries FROM outbox.policies ORDER BY kind;

DROP OWNED BY regress_checkout, regress_refunds, regress_mailer, regress_billing, regress_relay;
DROP ROLE regress_checkout, regress_refunds, regress_mailer, regress_billing, regress_relay;
SELECT check_name, violations FROM outbox.conservation WHERE violations > 0;
