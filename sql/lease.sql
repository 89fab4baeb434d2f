-- Lease protocol: claim, ack, fail, renew, sweep, policies, requeue, resolve.
-- Start from an empty outbox (pg_regress created the extension already).
DROP EXTENSION outbox;
CREATE EXTENSION outbox;
\set VERBOSITY default
\set SHOW_CONTEXT never
SET intervalstyle = postgres;

-- The tokens the claims of this test got, and a claim that keeps them:
-- t(command_id, version) is the token of that lease, or a made-up one (of
-- this role and that version, with a MAC of zeros) for a lease no claim
-- handed out.
CREATE TEMP TABLE tk (command_id text, version bigint, token text);
CREATE FUNCTION pg_temp.claim(worker text, batch_size int4 DEFAULT 100,
							  lease interval DEFAULT NULL, kinds text[] DEFAULT NULL)
RETURNS SETOF outbox.lease LANGUAGE sql AS $$
	WITH c AS (SELECT * FROM outbox.claim(worker, batch_size, lease, kinds)),
		 i AS (INSERT INTO tk SELECT c.command_id, c.version, c.token FROM c)
	SELECT * FROM c
$$;
CREATE FUNCTION pg_temp.t(id text, v bigint) RETURNS text LANGUAGE sql AS $$
	SELECT COALESCE((SELECT token FROM tk WHERE command_id = id AND version = v),
					repeat('0', 32) || ':' || current_user::regrole::oid || ':' || v || ':1:r:' || id)
$$;

SELECT count(*) FILTER (WHERE recorded) AS commit_decisions FROM outbox.commit_decisions('[
  {"run_id": "r", "seq": 1, "event_kind": "e", "command_id": "c1", "command_kind": "mail", "payload": {"n": 1}},
  {"run_id": "r", "seq": 2, "event_kind": "e", "command_id": "c2", "command_kind": "mail", "payload": {"n": 2}},
  {"run_id": "r", "seq": 3, "event_kind": "e", "command_id": "c3", "command_kind": "budget", "payload": {"n": 3}},
  {"run_id": "r", "seq": 4, "event_kind": "e", "command_id": "c4", "command_kind": "mail", "payload": {"n": 4}, "priority": 9}]');
SELECT outbox.commit_decision('r', 5, 'e', 'c5', 'mail', '{"n": 5}', not_before => now() + interval '1 hour');

-- claim: highest priority first, then availability; bumps version and deliveries.
SELECT command_id, run_id, kind, payload, version, deliveries,
       lease_until > clock_timestamp() + interval '50 seconds' AS lease_ok
  FROM pg_temp.claim('A', 2, interval '1 minute');
SELECT command_id, status, owner, version, deliveries, due_at IS NULL AS out_of_claim_index
  FROM outbox.commands ORDER BY command_id;
-- kinds filter
SELECT command_id FROM pg_temp.claim('B', 10, interval '1 minute', ARRAY['budget']);
-- live leases and delayed commands are not handed out again
SELECT command_id FROM pg_temp.claim('B', 10, interval '1 minute');
SELECT command_id FROM pg_temp.claim('B', 10);

-- ack with the current token
SELECT outbox.ack('A', pg_temp.t('c4', 2));
SELECT command_id, status, version, owner, published_at IS NOT NULL AS has_published_at,
       lease_until IS NULL AS no_lease
  FROM outbox.commands WHERE command_id = 'c4';
-- stale tokens: every reason, nothing changes
SELECT outbox.ack('A', pg_temp.t('c4', 2));
SELECT outbox.ack('B', pg_temp.t('c1', 2));
SELECT outbox.ack('A', pg_temp.t('c1', 1));
SELECT outbox.ack('A', pg_temp.t('nope', 1));
SELECT command_id, status, version FROM outbox.commands WHERE command_id IN ('c1', 'c4') ORDER BY 1;

-- renew keeps the token and extends the lease
SELECT outbox.renew('A', pg_temp.t('c1', 2), interval '2 hours') > clock_timestamp() + interval '1 hour' AS extended;
SELECT version, lease_until > clock_timestamp() + interval '1 hour' AS long_lease
  FROM outbox.commands WHERE command_id = 'c1';
SELECT outbox.renew('B', pg_temp.t('c1', 2), interval '1 minute');
SELECT outbox.renew('A', pg_temp.t('c1', 3));

-- fail: back to pending after a backoff, token spent
SET outbox.backoff_base = '10s';
SELECT outbox.fail('A', pg_temp.t('c1', 2), 'connection refused');
SELECT command_id, status, version, owner IS NULL AS no_owner, lease_until IS NULL AS no_lease,
       available_at > clock_timestamp() + interval '4 seconds' AS backed_off,
       available_at < clock_timestamp() + interval '11 seconds' AS within_cap,
       due_at = available_at AS claimable_later, last_error
  FROM outbox.commands WHERE command_id = 'c1';
SELECT outbox.fail('A', pg_temp.t('c1', 2), 'again');
RESET outbox.backoff_base;
-- fatal failure: dead at once, error kept
SELECT outbox.fail('B', pg_temp.t('c3', 2), 'HTTP 400 bad request', fatal => true);
SELECT command_id, status, deliveries, last_error, due_at IS NULL AS unclaimable
  FROM outbox.commands WHERE command_id = 'c3';
SELECT outbox.ack('B', pg_temp.t('c3', 3));

-- batch ack: per-command outcome, stale ones reported, not raised
SELECT * FROM outbox.ack_many('C', ARRAY[pg_temp.t('c2', 2), pg_temp.t('c5', 1)]);
SELECT * FROM outbox.ack_many('B', ARRAY[pg_temp.t('c2', 2), pg_temp.t('c4', 3), pg_temp.t('c3', 3), pg_temp.t('zz', 1), pg_temp.t('c5', 1)]);
SELECT * FROM outbox.ack_many('B', '{}');
-- malformed tokens are reported as such, in the tokens' order
SELECT * FROM outbox.ack_many('B', ARRAY['', 'x', repeat('0', 32) || ':0::c2', repeat('0', 32) || ':9:r:c2',
										 repeat('g', 32) || ':1:r:c2', repeat('0', 32) || ':1:r:']);
-- a token names its run: the right MAC under another run_id is refused
SELECT outbox.commit_decision('r', 40, 'e', 'c40', 'mail', '{}');
SELECT command_id, run_id, seq, version FROM pg_temp.claim('A', 1, interval '1 minute', ARRAY['mail']);
SELECT outbox.ack('A', replace(pg_temp.t('c40', 2), ':1:r:', ':1:q:'));
SELECT * FROM outbox.ack_many('A', ARRAY[replace(pg_temp.t('c40', 2), ':1:r:', ':1:q:')]);
-- the token is opaque text: 32 hex digits of MAC, the claiming role's oid,
-- the version, the run_id's length, the run_id and the command_id; no view
-- shows it
SELECT pg_temp.t('c40', 2) ~ ('^[0-9a-f]{32}:' || current_user::regrole::oid || ':2:1:r:c40$') AS token_form;
-- a genuine token changed in its role, its version or its MAC is refused,
-- and so is the token under another worker name
SELECT outbox.ack('A', regexp_replace(pg_temp.t('c40', 2), ':[0-9]+:2:', ':4242:2:'));
SELECT outbox.ack('A', replace(pg_temp.t('c40', 2), ':2:1:r:', ':3:1:r:'));
SELECT outbox.ack('A', translate(substr(pg_temp.t('c40', 2), 1, 1), '0123456789abcdef', '123456789abcdef0')
					   || substr(pg_temp.t('c40', 2), 2));
SELECT outbox.ack('A2', pg_temp.t('c40', 2));
SELECT * FROM outbox.ack_many('A', ARRAY[replace(pg_temp.t('c40', 2), ':2:1:r:', ':3:1:r:')]);
SELECT count(*) AS view_columns_showing_a_token
  FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid
 WHERE c.relnamespace = 'outbox'::regnamespace AND c.relkind = 'v'
   AND a.attname IN ('token', 'key', 'mac');
SELECT count(*) AS views_reading_the_secret
  FROM pg_views WHERE schemaname = 'outbox' AND definition ~ 'lease_key';
SELECT outbox.ack('A', pg_temp.t('c40', 2));
SELECT command_id, status, version FROM outbox.commands ORDER BY command_id;

-- takeover: an expired lease goes to the next claimer; the old holder is refused
SELECT outbox.commit_decision('r', 6, 'e', 'c6', 'mail', '{}');
SELECT command_id, version FROM pg_temp.claim('A', 1, interval '1 millisecond');
SELECT pg_sleep(0.05);
SELECT command_id, version, deliveries FROM pg_temp.claim('B', 1, interval '1 minute');
SELECT outbox.ack('A', pg_temp.t('c6', 2));
SELECT outbox.renew('A', pg_temp.t('c6', 2));
SELECT outbox.fail('A', pg_temp.t('c6', 2), 'late');
SELECT outbox.ack('B', pg_temp.t('c6', 3));
SELECT command_id, status, owner, version, deliveries FROM outbox.commands WHERE command_id = 'c6';

-- an ack after expiry but before any takeover is accepted (the token is current)
SELECT outbox.commit_decision('r', 7, 'e', 'c7', 'mail', '{}');
SELECT command_id, version FROM pg_temp.claim('A', 1, interval '1 millisecond');
SELECT pg_sleep(0.05);
SELECT outbox.ack('A', pg_temp.t('c7', 2));
-- the same worker claiming again after expiry gets a new token; the old one is stale
SELECT outbox.commit_decision('r', 8, 'e', 'c8', 'mail', '{}');
SELECT command_id, version FROM pg_temp.claim('A', 1, interval '1 millisecond');
SELECT pg_sleep(0.05);
SELECT command_id, version FROM pg_temp.claim('A', 1, interval '1 minute');
SELECT outbox.ack('A', pg_temp.t('c8', 2));
SELECT outbox.ack('A', pg_temp.t('c8', 3));

-- a takeover after the lease index was rebuilt under a new OID: the claim's
-- look for expired leases finds the new index
SELECT outbox.commit_decision('rx', 1, 'e', 'cx1', 'mail', '{}');
SELECT command_id, version FROM pg_temp.claim('A', 1, interval '1 millisecond');
SELECT 'outbox.commands_lease_idx'::regclass::oid AS lease_idx_before \gset
REINDEX INDEX CONCURRENTLY outbox.commands_lease_idx;
SELECT 'outbox.commands_lease_idx'::regclass::oid <> :lease_idx_before AS rebuilt;
SELECT pg_sleep(0.05);
SELECT command_id, version, deliveries FROM pg_temp.claim('B', 1, interval '1 minute');
SELECT outbox.ack('B', pg_temp.t('cx1', 3));

-- max deliveries: the last failure dead-letters; an exhausted expired lease is
-- not taken over and the sweep dead-letters it
SELECT outbox.set_policy('budget', max_deliveries => 2, backoff_base => '0 seconds', backoff_max => '0 seconds');
SELECT outbox.commit_decision('r', 9, 'e', 'c9', 'budget', '{}');
SELECT command_id, version FROM pg_temp.claim('A', 1, kinds => ARRAY['budget']);
SELECT outbox.fail('A', pg_temp.t('c9', 2), 'try 1');
SELECT command_id, version, deliveries FROM pg_temp.claim('A', 1, kinds => ARRAY['budget']);
SELECT outbox.fail('A', pg_temp.t('c9', 4), 'try 2');
SELECT command_id, status, deliveries, last_error FROM outbox.commands WHERE command_id = 'c9';
SELECT outbox.commit_decision('r', 10, 'e', 'c10', 'budget', '{}');
SELECT command_id FROM pg_temp.claim('A', 1, interval '1 millisecond', ARRAY['budget']);
SELECT pg_sleep(0.05);
SELECT command_id FROM pg_temp.claim('B', 1, interval '1 millisecond', ARRAY['budget']);
SELECT pg_sleep(0.05);
SELECT command_id FROM pg_temp.claim('C', 1, interval '1 minute', ARRAY['budget']);
SELECT outbox.sweep();
SELECT command_id, status, deliveries, last_error FROM outbox.commands WHERE command_id = 'c10';

-- requeue brings a dead command back for one more delivery
SELECT outbox.requeue('r', 'c10');
SELECT command_id, status, version, owner IS NULL AS no_owner, due_at = available_at AS claimable
  FROM outbox.commands WHERE command_id = 'c10';
SELECT command_id, deliveries FROM pg_temp.claim('A', 1, kinds => ARRAY['budget']);
SELECT outbox.requeue('r', 'c10');
SELECT outbox.requeue('r', 'nope');
SELECT outbox.requeue('r', NULL);

-- manual takeover: an expired lease is not taken over; sweep holds it as uncertain
SELECT outbox.set_policy('wire', takeover => 'manual');
SELECT outbox.commit_decision('r', 11, 'e', 'c11', 'wire', '{}');
SELECT command_id FROM pg_temp.claim('A', 1, interval '1 millisecond', ARRAY['wire']);
SELECT pg_sleep(0.05);
SELECT command_id FROM pg_temp.claim('B', 1, interval '1 minute', ARRAY['wire']);
SELECT outbox.sweep();
SELECT command_id, status, owner, last_error FROM outbox.commands WHERE command_id = 'c11';
SELECT outbox.ack('A', pg_temp.t('c11', 2));
SELECT outbox.resolve('r', 'c11', 'retry');
SELECT command_id, status FROM outbox.commands WHERE command_id = 'c11';
SELECT command_id, version FROM pg_temp.claim('B', 1, interval '1 millisecond', ARRAY['wire']);
SELECT pg_sleep(0.05);
SELECT outbox.sweep();
SELECT outbox.resolve('r', 'c11', 'published');
SELECT command_id, status, published_at IS NOT NULL AS has_published_at FROM outbox.commands WHERE command_id = 'c11';
SELECT outbox.resolve('r', 'c11', 'dead');
SELECT outbox.resolve('r', 'c11', 'maybe');
SELECT outbox.resolve('r', 'nope', 'dead');

-- pause / resume
SELECT outbox.pause('mail');
SELECT outbox.commit_decision('r', 12, 'e', 'c12', 'mail', '{}');
SELECT command_id FROM pg_temp.claim('A', 10);
SELECT outbox.resume('mail');
SELECT command_id FROM pg_temp.claim('A', 10);
SELECT kind, max_deliveries, backoff_base, backoff_max, takeover, paused FROM outbox.policies ORDER BY kind;
-- versions older and newer than the lease the worker holds (c12 is at
-- version 2) are refused as stale
SELECT * FROM outbox.ack_many('A', ARRAY[pg_temp.t('c12', 1), pg_temp.t('c12', 3)]);
-- a token repeated in one batch ack is acked once
SELECT * FROM outbox.ack_many('A', ARRAY[pg_temp.t('c12', 2), pg_temp.t('c12', 2)]);
SELECT outbox.set_policy('mail', takeover => 'sometimes');
SELECT outbox.set_policy('mail', max_deliveries => 0);
SELECT outbox.set_policy('mail', lease => '0 seconds');
SELECT outbox.set_policy('mail', lease => '1000 days');
SELECT outbox.set_policy(NULL);
SELECT outbox.pause('');

-- bad input: a clear error and no change
SELECT outbox.claim(NULL);
SELECT outbox.claim('');
SELECT outbox.claim(repeat('w', 201));
SELECT outbox.claim('A', 0);
SELECT outbox.claim('A', -1);
SELECT outbox.claim('A', 2147483647);
SELECT outbox.claim('A', NULL);
SELECT outbox.claim('A', 1, interval '0 seconds');
SELECT outbox.claim('A', 1, interval '-1 second');
SELECT outbox.claim('A', 1, interval '1000 years');
SELECT outbox.claim('A', 1, NULL, ARRAY[NULL]::text[]);
SELECT outbox.claim('A', 1, interval '1000 mons -29999 days');
SELECT outbox.claim('A', 1, interval '1 mon -31 days');
SELECT outbox.claim('A', 1, interval '3000 years -1095000 days');
SELECT outbox.ack(NULL, pg_temp.t('c1', 1));
SELECT outbox.ack('', pg_temp.t('c1', 1));
SELECT outbox.ack('A', NULL);
SELECT outbox.ack('A', '');
SELECT outbox.ack('A', 'c1');
SELECT outbox.ack('A', repeat('0', 32) || ':1:r:' || repeat('c', 201));
SELECT outbox.ack_many('A', NULL);
SELECT outbox.ack_many('A', ARRAY[NULL]);
SELECT outbox.ack_many('A', '{{a},{b}}');
SELECT outbox.ack_many(NULL, ARRAY[pg_temp.t('c1', 1)]);
SET outbox.max_batch = 2;
SELECT outbox.ack_many('A', array_fill(pg_temp.t('c1', 1), ARRAY[3]));
RESET outbox.max_batch;
SELECT outbox.fail('A', pg_temp.t('c1', 1), NULL);
SELECT outbox.fail('A', pg_temp.t('c1', 1), 'x', NULL);
SELECT outbox.fail('A', NULL, 'x');
SELECT outbox.fail('A', 'x', 'x');
SELECT outbox.renew('A', pg_temp.t('c1', 1), interval '0 seconds');
SELECT outbox.renew('A', pg_temp.t('c1', 1), interval '1000 mons -29999 days');
SELECT outbox.renew('A', NULL);
SELECT outbox.sweep(0);
SELECT command_id, status, version, deliveries FROM outbox.commands ORDER BY command_id;

-- claim hands out its batch in claim order, whatever the rows' physical
-- order: takeovers first, then by priority (o-mid is older than o-high)
SELECT outbox.commit_decision('order', 1, 'e', 'o-low', 'order', '{}');
SELECT count(*) FROM pg_temp.claim('A', 1, interval '1 millisecond', ARRAY['order']);
SELECT pg_sleep(0.05);
SELECT outbox.commit_decision('order', 2, 'e', 'o-mid', 'order', '{}', priority => 3);
SELECT outbox.commit_decision('order', 3, 'e', 'o-high', 'order', '{}', priority => 5);
SELECT command_id, deliveries FROM pg_temp.claim('B', 10, interval '1 minute', ARRAY['order']);

-- requeue and resolve('retry') read the clock once: available_at and due_at
-- of the command they make pending are equal (300 of each, so that two
-- readings of the clock would differ for some)
INSERT INTO outbox.commands (command_id, run_id, seq, kind, payload, available_at, status, version,
							 deliveries, owner, last_error)
SELECT 'clk-' || g, 'clk', g, 'clk', '{}', now(), CASE WHEN g % 2 = 0 THEN 'dead' ELSE 'uncertain' END,
	   2, 1, 'w', 'x'
  FROM generate_series(1, 600) g;
SELECT count(*) FROM (SELECT outbox.requeue(run_id, command_id) FROM outbox.commands
					   WHERE kind = 'clk' AND status = 'dead') r;
SELECT count(*) FROM (SELECT outbox.resolve(run_id, command_id, 'retry') FROM outbox.commands
					   WHERE kind = 'clk' AND status = 'uncertain') r;
SELECT count(*) AS pending, count(*) FILTER (WHERE due_at IS DISTINCT FROM available_at) AS due_differs
  FROM outbox.commands WHERE kind = 'clk';

-- an index made by hand under the name commands_lease_idx that holds fewer
-- rows than the extension's: claim does not trust it to say that no lease
-- has expired, and still takes over
DROP INDEX outbox.commands_lease_idx;
CREATE INDEX commands_lease_idx ON outbox.commands (lease_until)
	WHERE status = 'sending' AND kind = 'no such kind';
SELECT outbox.commit_decision('hand', 1, 'e', 'h1', 'hand', '{}');
SELECT command_id, version FROM pg_temp.claim('A', 1, interval '1 millisecond', ARRAY['hand']);
SELECT pg_sleep(0.05);
SELECT command_id, version, deliveries FROM pg_temp.claim('B', 1, interval '1 minute', ARRAY['hand']);
DROP INDEX outbox.commands_lease_idx;
CREATE INDEX commands_lease_idx ON outbox.commands (lease_until) WHERE status = 'sending';

-- the lease key: one row of 16 bytes, read by the owner only; a rotation
-- refuses every token handed out before (OB001), and the lease is taken
-- over once it ends
SELECT count(*) AS keys, min(length(key)) AS key_bytes FROM outbox.lease_key;
SELECT has_table_privilege(outbox.role('admin'), 'outbox.lease_key', 'SELECT') AS admin_reads_the_key,
	   has_table_privilege('pg_monitor', 'outbox.lease_key', 'SELECT') AS monitor_reads_the_key;
SELECT outbox.commit_decision('rot', 1, 'e', 'rot1', 'rot', '{}');
SELECT outbox.commit_decision('rot', 2, 'e', 'rot2', 'rot', '{}');
SELECT command_id, version FROM pg_temp.claim('A', 2, interval '1 millisecond', ARRAY['rot']);
SELECT outbox.rotate_lease_key();
SELECT outbox.renew('A', pg_temp.t('rot1', 2), interval '1 minute');
SELECT pg_sleep(0.05);
SELECT command_id, version FROM pg_temp.claim('A', 2, interval '1 minute', ARRAY['rot']) ORDER BY 1;
SELECT outbox.ack('A', pg_temp.t('rot1', 2));
SELECT outbox.ack('A', pg_temp.t('rot1', 3));
SELECT * FROM outbox.ack_many('A', ARRAY[pg_temp.t('rot2', 2), pg_temp.t('rot2', 3)]);
SELECT command_id, status, version FROM outbox.commands WHERE kind = 'rot' ORDER BY 1;
