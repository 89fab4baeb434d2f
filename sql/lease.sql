-- Lease protocol: claim, ack, fail, renew, sweep, policies, requeue, resolve.
-- Start from an empty outbox (pg_regress created the extension already).
DROP EXTENSION outbox;
CREATE EXTENSION outbox;
\set VERBOSITY default
\set SHOW_CONTEXT never
SET intervalstyle = postgres;

SELECT count(*) FILTER (WHERE recorded) AS commit_decisions FROM outbox.commit_decisions('[
  {"run_id": "r", "seq": 1, "event_kind": "e", "command_id": "c1", "command_kind": "mail", "payload": {"n": 1}},
  {"run_id": "r", "seq": 2, "event_kind": "e", "command_id": "c2", "command_kind": "mail", "payload": {"n": 2}},
  {"run_id": "r", "seq": 3, "event_kind": "e", "command_id": "c3", "command_kind": "budget", "payload": {"n": 3}},
  {"run_id": "r", "seq": 4, "event_kind": "e", "command_id": "c4", "command_kind": "mail", "payload": {"n": 4}, "priority": 9}]');
SELECT outbox.commit_decision('r', 5, 'e', 'c5', 'mail', '{"n": 5}', not_before => now() + interval '1 hour');

-- claim: highest priority first, then availability; bumps version and deliveries.
SELECT command_id, run_id, kind, payload, version, deliveries,
       lease_until > clock_timestamp() + interval '50 seconds' AS lease_ok
  FROM outbox.claim('A', 2, interval '1 minute');
SELECT command_id, status, owner, version, deliveries, due_at IS NULL AS out_of_claim_index
  FROM outbox.commands ORDER BY command_id;
-- kinds filter
SELECT command_id FROM outbox.claim('B', 10, interval '1 minute', ARRAY['budget']);
-- live leases and delayed commands are not handed out again
SELECT command_id FROM outbox.claim('B', 10, interval '1 minute');
SELECT command_id FROM outbox.claim('B', 10);

-- ack with the current token
SELECT outbox.ack('c4', 'A', 2);
SELECT command_id, status, version, owner, published_at IS NOT NULL AS has_published_at,
       lease_until IS NULL AS no_lease
  FROM outbox.commands WHERE command_id = 'c4';
-- stale tokens: every reason, nothing changes
SELECT outbox.ack('c4', 'A', 2);
SELECT outbox.ack('c1', 'B', 2);
SELECT outbox.ack('c1', 'A', 1);
SELECT outbox.ack('nope', 'A', 1);
SELECT command_id, status, version FROM outbox.commands WHERE command_id IN ('c1', 'c4') ORDER BY 1;

-- renew keeps the token and extends the lease
SELECT outbox.renew('c1', 'A', 2, interval '2 hours') > clock_timestamp() + interval '1 hour' AS extended;
SELECT version, lease_until > clock_timestamp() + interval '1 hour' AS long_lease
  FROM outbox.commands WHERE command_id = 'c1';
SELECT outbox.renew('c1', 'B', 2, interval '1 minute');
SELECT outbox.renew('c1', 'A', 3);

-- fail: back to pending after a backoff, token spent
SET outbox.backoff_base = '10s';
SELECT outbox.fail('c1', 'A', 2, 'connection refused');
SELECT command_id, status, version, owner IS NULL AS no_owner, lease_until IS NULL AS no_lease,
       available_at > clock_timestamp() + interval '4 seconds' AS backed_off,
       available_at < clock_timestamp() + interval '11 seconds' AS within_cap,
       due_at = available_at AS claimable_later, last_error
  FROM outbox.commands WHERE command_id = 'c1';
SELECT outbox.fail('c1', 'A', 2, 'again');
RESET outbox.backoff_base;
-- fatal failure: dead at once, error kept
SELECT outbox.fail('c3', 'B', 2, 'HTTP 400 bad request', fatal => true);
SELECT command_id, status, deliveries, last_error, due_at IS NULL AS unclaimable
  FROM outbox.commands WHERE command_id = 'c3';
SELECT outbox.ack('c3', 'B', 3);

-- batch ack: per-command outcome, stale ones reported, not raised
SELECT * FROM outbox.ack('C', ARRAY['c2', 'c5'], ARRAY[2, 1]::bigint[]);
SELECT * FROM outbox.ack('B', ARRAY['c2', 'c4', 'c3', 'zz', 'c5'], ARRAY[2, 3, 3, 1, 1]::bigint[]);
SELECT * FROM outbox.ack('B', '{}'::text[], '{}'::bigint[]);
-- the batch ack's internal token test, with arrays that differ per row
SELECT a, v, outbox._ack_token(a, v, 'x', 2) AS holds
  FROM (VALUES (ARRAY['x', 'y'], ARRAY[1, 2]::bigint[]), (ARRAY['y', 'x'], ARRAY[1, 2]::bigint[]),
               (ARRAY['x', NULL], ARRAY[2, 2]::bigint[]), ('{}', '{}')) t(a, v);
SELECT outbox._ack_token(a, v, 'x', 1) FROM (VALUES (ARRAY['x'], ARRAY[1, 2]::bigint[])) t(a, v);
SELECT outbox._ack_token(a, v, 'x', 1) FROM (VALUES (ARRAY['x', 'y'], ARRAY[1, NULL]::bigint[])) t(a, v);
SELECT outbox._ack_token(a, v, 'x', 1) FROM (VALUES ('{{x},{y}}'::text[], '{{1},{2}}'::bigint[])) t(a, v);
-- and with arrays that a PL/pgSQL variable changes between calls of one
-- expression (which keeps its state across the loop)
DO $$
DECLARE
	ids text[];
	vers bigint[];
	r text := '';
BEGIN
	FOR i IN 1..3 LOOP
		ids := ARRAY['x' || i];
		vers := ARRAY[1::bigint];
		r := r || outbox._ack_token(ids, vers, 'x2', 1)::text || ' ';
	END LOOP;
	RAISE NOTICE 'holds: %', r;
END $$;
SELECT command_id, status, version FROM outbox.commands ORDER BY command_id;

-- takeover: an expired lease goes to the next claimer; the old holder is refused
SELECT outbox.commit_decision('r', 6, 'e', 'c6', 'mail', '{}');
SELECT command_id, version FROM outbox.claim('A', 1, interval '1 millisecond');
SELECT pg_sleep(0.05);
SELECT command_id, version, deliveries FROM outbox.claim('B', 1, interval '1 minute');
SELECT outbox.ack('c6', 'A', 2);
SELECT outbox.renew('c6', 'A', 2);
SELECT outbox.fail('c6', 'A', 2, 'late');
SELECT outbox.ack('c6', 'B', 3);
SELECT command_id, status, owner, version, deliveries FROM outbox.commands WHERE command_id = 'c6';

-- an ack after expiry but before any takeover is accepted (the token is current)
SELECT outbox.commit_decision('r', 7, 'e', 'c7', 'mail', '{}');
SELECT command_id, version FROM outbox.claim('A', 1, interval '1 millisecond');
SELECT pg_sleep(0.05);
SELECT outbox.ack('c7', 'A', 2);
-- the same worker claiming again after expiry gets a new token; the old one is stale
SELECT outbox.commit_decision('r', 8, 'e', 'c8', 'mail', '{}');
SELECT command_id, version FROM outbox.claim('A', 1, interval '1 millisecond');
SELECT pg_sleep(0.05);
SELECT command_id, version FROM outbox.claim('A', 1, interval '1 minute');
SELECT outbox.ack('c8', 'A', 2);
SELECT outbox.ack('c8', 'A', 3);

-- a takeover after the lease index was rebuilt under a new OID: the claim's
-- look for expired leases finds the new index
SELECT outbox.commit_decision('rx', 1, 'e', 'cx1', 'mail', '{}');
SELECT command_id, version FROM outbox.claim('A', 1, interval '1 millisecond');
SELECT 'outbox.commands_lease_idx'::regclass::oid AS lease_idx_before \gset
REINDEX INDEX CONCURRENTLY outbox.commands_lease_idx;
SELECT 'outbox.commands_lease_idx'::regclass::oid <> :lease_idx_before AS rebuilt;
SELECT pg_sleep(0.05);
SELECT command_id, version, deliveries FROM outbox.claim('B', 1, interval '1 minute');
SELECT outbox.ack('cx1', 'B', 3);

-- max deliveries: the last failure dead-letters; an exhausted expired lease is
-- not taken over and the sweep dead-letters it
SELECT outbox.set_policy('budget', max_deliveries => 2, backoff_base => '0 seconds', backoff_max => '0 seconds');
SELECT outbox.commit_decision('r', 9, 'e', 'c9', 'budget', '{}');
SELECT command_id, version FROM outbox.claim('A', 1, kinds => ARRAY['budget']);
SELECT outbox.fail('c9', 'A', 2, 'try 1');
SELECT command_id, version, deliveries FROM outbox.claim('A', 1, kinds => ARRAY['budget']);
SELECT outbox.fail('c9', 'A', 4, 'try 2');
SELECT command_id, status, deliveries, last_error FROM outbox.commands WHERE command_id = 'c9';
SELECT outbox.commit_decision('r', 10, 'e', 'c10', 'budget', '{}');
SELECT command_id FROM outbox.claim('A', 1, interval '1 millisecond', ARRAY['budget']);
SELECT pg_sleep(0.05);
SELECT command_id FROM outbox.claim('B', 1, interval '1 millisecond', ARRAY['budget']);
SELECT pg_sleep(0.05);
SELECT command_id FROM outbox.claim('C', 1, interval '1 minute', ARRAY['budget']);
SELECT outbox.sweep();
SELECT command_id, status, deliveries, last_error FROM outbox.commands WHERE command_id = 'c10';

-- requeue brings a dead command back for one more delivery
SELECT outbox.requeue('c10');
SELECT command_id, status, version, owner IS NULL AS no_owner, due_at = available_at AS claimable
  FROM outbox.commands WHERE command_id = 'c10';
SELECT command_id, deliveries FROM outbox.claim('A', 1, kinds => ARRAY['budget']);
SELECT outbox.requeue('c10');
SELECT outbox.requeue('nope');
SELECT outbox.requeue(NULL);

-- manual takeover: an expired lease is not taken over; sweep holds it as uncertain
SELECT outbox.set_policy('wire', takeover => 'manual');
SELECT outbox.commit_decision('r', 11, 'e', 'c11', 'wire', '{}');
SELECT command_id FROM outbox.claim('A', 1, interval '1 millisecond', ARRAY['wire']);
SELECT pg_sleep(0.05);
SELECT command_id FROM outbox.claim('B', 1, interval '1 minute', ARRAY['wire']);
SELECT outbox.sweep();
SELECT command_id, status, owner, last_error FROM outbox.commands WHERE command_id = 'c11';
SELECT outbox.ack('c11', 'A', 2);
SELECT outbox.resolve('c11', 'retry');
SELECT command_id, status FROM outbox.commands WHERE command_id = 'c11';
SELECT command_id, version FROM outbox.claim('B', 1, interval '1 millisecond', ARRAY['wire']);
SELECT pg_sleep(0.05);
SELECT outbox.sweep();
SELECT outbox.resolve('c11', 'published');
SELECT command_id, status, published_at IS NOT NULL AS has_published_at FROM outbox.commands WHERE command_id = 'c11';
SELECT outbox.resolve('c11', 'dead');
SELECT outbox.resolve('c11', 'maybe');
SELECT outbox.resolve('nope', 'dead');

-- pause / resume
SELECT outbox.pause('mail');
SELECT outbox.commit_decision('r', 12, 'e', 'c12', 'mail', '{}');
SELECT command_id FROM outbox.claim('A', 10);
SELECT outbox.resume('mail');
SELECT command_id FROM outbox.claim('A', 10);
SELECT kind, max_deliveries, backoff_base, backoff_max, takeover, paused FROM outbox.policies ORDER BY kind;
-- versions older and newer than the lease the worker holds (c12 is at
-- version 2) are refused as stale
SELECT * FROM outbox.ack('A', ARRAY['c12', 'c12'], ARRAY[1, 3]::bigint[]);
-- a token repeated in one batch ack is acked once
SELECT * FROM outbox.ack('A', ARRAY['c12', 'c12'], ARRAY[2, 2]::bigint[]);
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
SELECT outbox.ack(NULL, 'A', 1);
SELECT outbox.ack('c1', NULL, 1);
SELECT outbox.ack('c1', 'A', NULL::bigint);
SELECT outbox.ack('c1', 'A', 0);
SELECT outbox.ack('c1', 'A', -1);
SELECT outbox.ack('c1', 'A', 9223372036854775807);
SELECT outbox.ack('A', ARRAY['c1'], ARRAY[1, 2]::bigint[]);
SELECT outbox.ack('A', ARRAY['c1', NULL], ARRAY[1, 2]::bigint[]);
SELECT outbox.ack('A', ARRAY['c1'], ARRAY[NULL]::bigint[]);
SELECT outbox.ack('A', NULL::text[], ARRAY[1]::bigint[]);
SELECT outbox.ack(NULL, ARRAY['c1'], ARRAY[1]::bigint[]);
SELECT outbox.fail('c1', 'A', 1, NULL);
SELECT outbox.fail('c1', 'A', 1, 'x', NULL);
SELECT outbox.renew('c1', 'A', 1, interval '0 seconds');
SELECT outbox.sweep(0);
SELECT command_id, status, version, deliveries FROM outbox.commands ORDER BY command_id;

-- claim hands out its batch in claim order, whatever the rows' physical
-- order: takeovers first, then by priority (o-mid is older than o-high)
SELECT outbox.commit_decision('order', 1, 'e', 'o-low', 'order', '{}');
SELECT count(*) FROM outbox.claim('A', 1, interval '1 millisecond', ARRAY['order']);
SELECT pg_sleep(0.05);
SELECT outbox.commit_decision('order', 2, 'e', 'o-mid', 'order', '{}', priority => 3);
SELECT outbox.commit_decision('order', 3, 'e', 'o-high', 'order', '{}', priority => 5);
SELECT command_id, deliveries FROM outbox.claim('B', 10, interval '1 minute', ARRAY['order']);

-- requeue and resolve('retry') read the clock once: available_at and due_at
-- of the command they make pending are equal (300 of each, so that two
-- readings of the clock would differ for some)
INSERT INTO outbox.commands (command_id, run_id, seq, kind, payload, available_at, status, version,
							 deliveries, owner, last_error)
SELECT 'clk-' || g, 'clk', g, 'clk', '{}', now(), CASE WHEN g % 2 = 0 THEN 'dead' ELSE 'uncertain' END,
	   2, 1, 'w', 'x'
  FROM generate_series(1, 600) g;
SELECT count(*) FROM (SELECT outbox.requeue(command_id) FROM outbox.commands
					   WHERE kind = 'clk' AND status = 'dead') r;
SELECT count(*) FROM (SELECT outbox.resolve(command_id, 'retry') FROM outbox.commands
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
SELECT command_id, version FROM outbox.claim('A', 1, interval '1 millisecond', ARRAY['hand']);
SELECT pg_sleep(0.05);
SELECT command_id, version, deliveries FROM outbox.claim('B', 1, interval '1 minute', ARRAY['hand']);
DROP INDEX outbox.commands_lease_idx;
CREATE INDEX commands_lease_idx ON outbox.commands (lease_until) WHERE status = 'sending';
