-- Streams, the write-once path (docs/streams.md): the API and every error.
-- Start from an empty outbox (pg_regress created the extension already).
-- No background worker serves this database: the ticks are cut by
-- outbox.tick_streams(), as the worker does when a commit wakes it.
DROP EXTENSION outbox;
CREATE EXTENSION outbox;
\set VERBOSITY terse
SET intervalstyle = postgres;

-- The SQLSTATE and message of a statement (00000 when it succeeds).
CREATE FUNCTION pg_temp.err(stmt text) RETURNS text LANGUAGE plpgsql AS $$
BEGIN
	EXECUTE stmt;
	RETURN '00000';
EXCEPTION WHEN OTHERS THEN
	RETURN SQLSTATE || ': ' || SQLERRM;
END;
$$;
-- The batches claimed here, by name.
CREATE TEMP TABLE b (name text, command_id text, run_id text, kind text, payload jsonb, token text,
					 version bigint, deliveries int, ordering_key text, batch_id bigint, part int, ord int);
CREATE FUNCTION pg_temp.claim(name text, stream text, sub text, worker text, lease interval DEFAULT '1 hour')
RETURNS TABLE (command_id text, version bigint, deliveries int, batch_id bigint, part int)
LANGUAGE sql AS $$
	WITH c AS (SELECT x.*, row_number() OVER () AS ord
				 FROM outbox.claim_batch(stream, sub, worker, lease) x),
		 i AS (INSERT INTO b SELECT name, c.command_id, c.run_id, c.kind, c.payload, c.token, c.version,
									c.deliveries, c.ordering_key, c.batch_id, c.part, c.ord FROM c)
	SELECT c.command_id, c.version, c.deliveries, c.batch_id, c.part FROM c ORDER BY c.ord
$$;
CREATE FUNCTION pg_temp.tok(n text) RETURNS text LANGUAGE sql AS $$
	SELECT min(token) FROM b WHERE name = n
$$;

-- create_stream: arguments
SELECT pg_temp.err($$SELECT outbox.create_stream(NULL)$$);
SELECT pg_temp.err($$SELECT outbox.create_stream('')$$);
SELECT pg_temp.err($$SELECT outbox.create_stream('s', NULL)$$);
SELECT pg_temp.err($$SELECT outbox.create_stream('s', 0)$$);
SELECT pg_temp.err($$SELECT outbox.create_stream('s', 257)$$);
SELECT pg_temp.err($$SELECT outbox.create_stream('s', 4, 0)$$);
SELECT pg_temp.err($$SELECT outbox.create_stream('s', 4, NULL)$$);
SELECT outbox.create_stream('orders', 1, 100);
SELECT pg_temp.err($$SELECT outbox.create_stream('orders')$$);
SELECT stream, stream_id, partitions, batch_size FROM outbox.streams;

-- set_policy(stream =>): unknown, set, cleared ('' ), kept (NULL)
SELECT pg_temp.err($$SELECT outbox.set_policy('order.placed', stream => 'nope')$$);
SELECT outbox.set_policy('order.placed', stream => 'orders', backoff_base => '0', backoff_max => '0');
SELECT outbox.set_policy('order.paid', stream => 'orders', max_deliveries => 2,
						 backoff_base => '0', backoff_max => '0');
SELECT outbox.set_policy('mail', stream => 'orders');
SELECT outbox.set_policy('mail', stream => '');
SELECT outbox.set_policy('order.paid', lease => '1 minute');
SELECT kind, stream FROM outbox.policies ORDER BY kind;

-- create_subscription and drop_subscription: arguments
SELECT pg_temp.err($$SELECT outbox.create_subscription('nope', 'kafka')$$);
SELECT pg_temp.err($$SELECT outbox.create_subscription('orders', NULL)$$);
SELECT pg_temp.err($$SELECT outbox.create_subscription('orders', 'x', ARRAY[ARRAY['pg_monitor'::regrole]])$$);
SELECT pg_temp.err($$SELECT outbox.create_subscription('orders', 'x', ARRAY[NULL::regrole])$$);
SELECT outbox.create_subscription('orders', 'kafka');
SELECT pg_temp.err($$SELECT outbox.create_subscription('orders', 'kafka')$$);
SELECT pg_temp.err($$SELECT outbox.drop_subscription('nope')$$);
SELECT subscription, stream, start_tick FROM outbox.subscriptions;
SELECT subscription, part, acked_tick, batch_to FROM outbox.stream_progress ORDER BY 1, 2;

-- The producer: commit_decision appends to the log, nothing to commands.
SELECT outbox.commit_decision('r1', 1, 'placed', 'c1', 'order.placed', '{"n": 1}', ordering_key => 'cust-1');
SELECT outbox.commit_decision('r1', 2, 'placed', 'c2', 'order.placed', '{"n": 2}', ordering_key => 'cust-1');
SELECT outbox.commit_decision('r2', 1, 'placed', 'c3', 'order.placed', '{"n": 3}', headers => '{"traceparent": "t"}');
-- the same decision again: false, nothing added; another decision with the id: 23505
SELECT outbox.commit_decision('r1', 1, 'placed', 'c1', 'order.placed', '{"n": 1}', ordering_key => 'cust-1');
SELECT pg_temp.err($$SELECT outbox.commit_decision('r1', 9, 'placed', 'c1', 'order.placed', '{"n": 9}')$$);
SELECT pg_temp.err($$SELECT outbox.commit_decision('r9', 1, 'placed', 'c9', 'order.placed', '{}', not_before => now())$$);
-- a command id is unique across both paths
SELECT outbox.commit_decision('r3', 1, 'sent', 'm1', 'mail', '{}');
SELECT pg_temp.err($$SELECT outbox.commit_decision('r3', 2, 'placed', 'm1', 'order.placed', '{}')$$);
-- the set-based form: all stream kinds, or none
SELECT ord, command_id, recorded FROM outbox.commit_decisions('[
  {"run_id": "r4", "seq": 1, "event_kind": "paid", "command_id": "c4", "command_kind": "order.paid", "payload": {"n": 4}, "ordering_key": "cust-2"},
  {"run_id": "r4", "seq": 2, "event_kind": "paid", "command_id": "c5", "command_kind": "order.paid", "payload": {"n": 5}, "ordering_key": "cust-2"},
  {"run_id": "r1", "seq": 1, "event_kind": "placed", "command_id": "c1", "command_kind": "order.placed", "payload": {"n": 1}, "ordering_key": "cust-1"}]');
SELECT pg_temp.err($$SELECT * FROM outbox.commit_decisions('[
  {"run_id": "r5", "seq": 1, "event_kind": "e", "command_id": "c6", "command_kind": "order.paid", "payload": {}},
  {"run_id": "r5", "seq": 2, "event_kind": "e", "command_id": "m2", "command_kind": "mail", "payload": {}}]')$$);
SELECT pg_temp.err($$SELECT * FROM outbox.commit_decisions('[
  {"run_id": "r5", "seq": 1, "event_kind": "e", "command_id": "c6", "command_kind": "order.paid", "payload": {}, "not_before": "2030-01-01T00:00:00Z"}]')$$);
SELECT (SELECT count(*) FROM outbox.commands) AS commands,
	   (SELECT count(*) FROM outbox._stream_log) AS logged,
	   (SELECT count(*) FROM outbox.stream_log_0) AS in_table_0;
-- one key, one partition; the log's order is the decisions' order
SELECT command_id, part, ordering_key FROM outbox._stream_log ORDER BY id;

-- Nothing is claimable before a tick; the tick sees the commits.
SELECT count(*) FROM outbox.claim_batch('orders', 'kafka', 'w1');
SELECT outbox.tick_streams();
SELECT outbox.tick_streams();

-- claim_batch: arguments and rights
SELECT pg_temp.err($$SELECT * FROM outbox.claim_batch('nope', 'kafka', 'w1')$$);
SELECT pg_temp.err($$SELECT * FROM outbox.claim_batch('orders', 'nope', 'w1')$$);
SELECT outbox.create_stream('other');
SELECT outbox.create_subscription('other', 'webhook-other');
SELECT pg_temp.err($$SELECT * FROM outbox.claim_batch('orders', 'webhook-other', 'w1')$$);
SELECT pg_temp.err($$SELECT * FROM outbox.claim_batch('orders', 'kafka', NULL)$$);
SELECT pg_temp.err($$SELECT * FROM outbox.claim_batch('orders', 'kafka', 'w1', '-1 second')$$);
SELECT pg_temp.err($$SELECT * FROM outbox.claim_batch('orders', 'kafka', 'w1', '100 years')$$);
SELECT format('CREATE ROLE regress_stream_pub IN ROLE %I', outbox.role('publisher')) \gexec
SELECT outbox.create_subscription('orders', 'restricted', ARRAY['pg_monitor'::regrole]);
SET ROLE regress_stream_pub;
SELECT pg_temp.err($$SELECT * FROM outbox.claim_batch('orders', 'restricted', 'w1')$$);
RESET ROLE;

-- A batch: the partition's commands in log order, one token, version 1.
SELECT * FROM pg_temp.claim('k1', 'orders', 'kafka', 'w1');
SELECT count(DISTINCT token) AS tokens, bool_and(token ~ '^[0-9a-f]{32}:') AS opaque FROM b WHERE name = 'k1';
-- one batch per partition at a time: nothing for another claim
SELECT count(*) FROM outbox.claim_batch('orders', 'kafka', 'w2');
SELECT subscription, part, holder, version, deliveries, commands, expired FROM outbox.stream_batches ORDER BY part;

-- ack_batch: refused tokens change nothing (OB001)
SELECT pg_temp.err($$SELECT outbox.ack_batch('w1', 'garbage')$$);
SELECT pg_temp.err($$SELECT outbox.ack_batch('w1', NULL)$$);
SELECT pg_temp.err($$SELECT outbox.ack_batch('w2', pg_temp.tok('k1'))$$);
SELECT pg_temp.err(format($$SELECT outbox.ack_batch('w1', %L)$$,
	repeat('0', 32) || substr(pg_temp.tok('k1'), 33)));
SELECT pg_temp.err(format($$SELECT outbox.ack_batch('w1', %L)$$,
	regexp_replace(pg_temp.tok('k1'), ':kafka$', ':webhook')));
-- bad failure lists: 22023, 22004, 2202E
SELECT pg_temp.err($$SELECT outbox.ack_batch('w1', pg_temp.tok('k1'), ARRAY['nope'])$$);
SELECT pg_temp.err($$SELECT outbox.ack_batch('w1', pg_temp.tok('k1'), ARRAY['c1'], ARRAY['a', 'b'])$$);
SELECT pg_temp.err($$SELECT outbox.ack_batch('w1', pg_temp.tok('k1'), ARRAY['c1', 'c1'])$$);
SELECT pg_temp.err($$SELECT outbox.ack_batch('w1', pg_temp.tok('k1'), ARRAY[NULL::text])$$);
SELECT pg_temp.err($$SELECT outbox.ack_batch('w1', pg_temp.tok('k1'), ARRAY[ARRAY['c1']])$$);
SELECT subscription, part, holder, version, commands FROM outbox.stream_batches ORDER BY part;
SELECT count(*) AS failures FROM outbox.stream_failures;

-- renew_batch extends the lease of the holder only
SELECT outbox.renew_batch('w1', pg_temp.tok('k1'), '2 hours') > now() + interval '90 minutes' AS renewed;
SELECT pg_temp.err($$SELECT outbox.renew_batch('w2', pg_temp.tok('k1'))$$);
SELECT pg_temp.err($$SELECT outbox.renew_batch('w1', pg_temp.tok('k1'), '0 seconds')$$);

-- The ack: c1 failed (a retry), the others published; a second ack: OB001.
SELECT outbox.ack_batch('w1', pg_temp.tok('k1'), ARRAY['c1'], ARRAY['broker said no']) AS published;
SELECT pg_temp.err($$SELECT outbox.ack_batch('w1', pg_temp.tok('k1'))$$);
SELECT subscription, command_id, status, deliveries, in_batch, last_error FROM outbox.stream_failed;
SELECT subscription, part, ticks_behind, batch_open, published FROM outbox.stream_lag
 WHERE subscription = 'kafka' ORDER BY 1, 2;

-- A later command of c1's key waits behind it; the retry comes in the next
-- batch with its own delivery count.
SELECT outbox.commit_decision('r1', 3, 'placed', 'c7', 'order.placed', '{"n": 7}', ordering_key => 'cust-1');
SELECT outbox.commit_decision('r6', 1, 'placed', 'c8', 'order.placed', '{"n": 8}');
SELECT outbox.tick_streams();
SELECT * FROM pg_temp.claim('k2', 'orders', 'kafka', 'w1');
SELECT subscription, command_id, status, deliveries, in_batch FROM outbox.stream_failed ORDER BY command_id;
SELECT outbox.ack_batch('w1', pg_temp.tok('k2')) AS published;
-- c1 published: c7 is released (a retry due now) and comes next
SELECT subscription, command_id, status FROM outbox.stream_failed ORDER BY command_id;
SELECT * FROM pg_temp.claim('k3', 'orders', 'kafka', 'w1');
SELECT outbox.ack_batch('w1', pg_temp.tok('k3')) AS published;
SELECT count(*) AS failures FROM outbox.stream_failures;

-- Dead: deliveries used up (order.paid: 2), or fatal.
SELECT outbox.commit_decision('r7', 1, 'paid', 'c9', 'order.paid', '{"n": 9}');
SELECT outbox.commit_decision('r7', 2, 'paid', 'c10', 'order.paid', '{"n": 10}');
SELECT outbox.tick_streams();
SELECT * FROM pg_temp.claim('k4', 'orders', 'kafka', 'w1');
SELECT outbox.ack_batch('w1', pg_temp.tok('k4'), ARRAY['c9', 'c10'], ARRAY['e-c9', 'e-c10'],
						ARRAY[false, true]) AS published;
SELECT command_id, status, deliveries, last_error FROM outbox.stream_failed ORDER BY command_id;
SELECT * FROM pg_temp.claim('k5', 'orders', 'kafka', 'w1');
SELECT outbox.ack_batch('w1', pg_temp.tok('k5'), ARRAY['c9'], ARRAY['still no']) AS published;
SELECT command_id, status, deliveries, last_error FROM outbox.stream_failed ORDER BY command_id;
SELECT count(*) FROM outbox.claim_batch('orders', 'kafka', 'w1');

-- Takeover: an expired batch goes to the next claim with a new version and
-- token, its deliveries counted; the old holder's ack is refused.
SELECT outbox.commit_decision('r8', 1, 'placed', 'c11', 'order.placed', '{"n": 11}');
SELECT outbox.tick_streams();
SELECT count(*) FROM pg_temp.claim('k9', 'orders', 'kafka', 'w1', '10 milliseconds');
SELECT pg_sleep(0.05);
SELECT command_id, version, deliveries FROM pg_temp.claim('k10', 'orders', 'kafka', 'w2');
SELECT pg_temp.err($$SELECT outbox.ack_batch('w1', pg_temp.tok('k9'))$$);
SELECT pg_temp.err($$SELECT outbox.renew_batch('w1', pg_temp.tok('k9'))$$);
SELECT pg_temp.tok('k9') <> pg_temp.tok('k10') AS new_token;
SELECT outbox.ack_batch('w2', pg_temp.tok('k10')) AS published;

-- A claim whose commit is lost (a crash before an asynchronous commit
-- reached the disk; here rolled back) is made again with the same batch
-- id, version and worker name, over more commands: it has another token,
-- and the lost claim's token is refused (OB001), changing nothing.
SELECT outbox.commit_decision('r8', 2, 'placed', 'c11b', 'order.placed', '{"n": 111}');
SELECT outbox.tick_streams();
BEGIN;
SELECT min(token) AS lost_token, min(batch_id) AS lost_batch, count(*) AS lost_n
  FROM outbox.claim_batch('orders', 'kafka', 'w1') \gset
ROLLBACK;
SELECT :lost_n AS lost_commands;
SELECT outbox.commit_decision('r8', 3, 'placed', 'c11c', 'order.placed', '{"n": 112}');
SELECT outbox.tick_streams();
SELECT command_id, version, deliveries, batch_id = :lost_batch AS same_batch
  FROM pg_temp.claim('k11', 'orders', 'kafka', 'w1');
SELECT pg_temp.tok('k11') <> :'lost_token' AS new_token;
SELECT pg_temp.err(format($$SELECT outbox.ack_batch('w1', %L)$$, :'lost_token'));
SELECT pg_temp.err(format($$SELECT outbox.ack_batch('w1', %L, ARRAY['c11b'])$$, :'lost_token'));
SELECT pg_temp.err(format($$SELECT outbox.renew_batch('w1', %L)$$, :'lost_token'));
SELECT subscription, part, holder, version, commands FROM outbox.stream_batches
 WHERE subscription = 'kafka' ORDER BY part;
SELECT count(*) AS failures FROM outbox.stream_failures WHERE command_id LIKE 'c11%';
SELECT outbox.ack_batch('w1', pg_temp.tok('k11')) AS published;
SELECT count(*) FILTER (WHERE claim_nonce IS NOT NULL) AS nonces_left
  FROM outbox.stream_progress WHERE batch_to IS NULL;

-- Fan-out: a second subscription publishes what is decided after it; the
-- first one keeps its own progress.
SELECT outbox.create_subscription('orders', 'webhook');
SELECT outbox.commit_decision('r9', 1, 'placed', 'c12', 'order.placed', '{"n": 12}');
SELECT outbox.tick_streams();
SELECT command_id, version, deliveries FROM pg_temp.claim('w-a', 'orders', 'webhook', 'h1');
SELECT command_id, version, deliveries FROM pg_temp.claim('k-a', 'orders', 'kafka', 'w1');
SELECT outbox.ack_batch('h1', pg_temp.tok('w-a')) AS webhook, outbox.ack_batch('w1', pg_temp.tok('k-a')) AS kafka;

-- Partitions: commands spread by key (else run) over the partitions;
-- concurrent publishers each get a partition of their own.
SELECT outbox.create_stream('spread', 4);
SELECT outbox.set_policy('spread.k', stream => 'spread');
SELECT outbox.create_subscription('spread', 'all');
SELECT count(*) FILTER (WHERE recorded) FROM outbox.commit_decisions(
	(SELECT jsonb_agg(jsonb_build_object('run_id', 'sr' || i, 'seq', 1, 'event_kind', 'e',
			'command_id', 'sp' || i, 'command_kind', 'spread.k', 'payload', '{}'::jsonb))
	   FROM generate_series(1, 16) i));
SELECT outbox.tick_streams();
SELECT count(DISTINCT part) > 1 AS spread FROM outbox._stream_log WHERE stream_id = 3;
SELECT count(*) FROM pg_temp.claim('s1', 'spread', 'all', 'p1');
SELECT count(*) FROM pg_temp.claim('s2', 'spread', 'all', 'p2');
SELECT count(*) FROM pg_temp.claim('s3', 'spread', 'all', 'p3');
SELECT count(*) FROM pg_temp.claim('s4', 'spread', 'all', 'p4');
SELECT count(DISTINCT part) = count(DISTINCT name) AS one_partition_each,
	   count(*) AS commands, count(DISTINCT command_id) AS distinct_commands
  FROM b WHERE name IN ('s1', 's2', 's3', 's4');
SELECT sum(outbox.ack_batch('p' || substr(name, 2), token)) AS published
  FROM (SELECT DISTINCT name, token FROM b WHERE name IN ('s1', 's2', 's3', 's4')) x;

-- Receipts and the inbox for stream commands.
SELECT outbox.complete('r1', 'c1');
SELECT outbox.complete('r1', 'c1');
SELECT pg_temp.err($$SELECT outbox.complete('r1', 'c1', 'failed')$$);
SELECT pg_temp.err($$SELECT outbox.complete('r2', 'c1')$$);
SELECT outbox.register_consumer('billing', current_user::regrole);
SELECT outbox.inbox_accept('billing', 'r1', 'c2');
SELECT outbox.inbox_accept('billing', 'r1', 'c2');

-- Conservation: clean, and a broken stream state is reported.
SELECT outbox.verify();
SELECT check_name, violations FROM outbox.conservation ORDER BY 1;
UPDATE outbox.stream_failures SET last_error = NULL WHERE command_id = 'c10';
UPDATE outbox.stream_progress SET owner = 'ghost' WHERE subscription = 'webhook' AND part = 0;
SELECT subscription, part, command_id, status, rules FROM outbox.check_stream_state ORDER BY 1, 2, 3;
SELECT check_name, violations, sample FROM outbox.conservation WHERE check_name = 'state';
SELECT pg_temp.err($$SELECT outbox.verify()$$);
UPDATE outbox.stream_failures SET last_error = 'e-c10' WHERE command_id = 'c10';
UPDATE outbox.stream_progress SET owner = NULL WHERE subscription = 'webhook' AND part = 0;
SELECT outbox.verify();

-- Rotation: the next log table is emptied once its commands are past
-- retention; done ones leave tombstones, stragglers move to stream_kept.
-- (Set by hand here: table 1 holds a done command, c8, and c9, dead in a
-- subscription and of a kind with completers: a straggler until it is
-- requeued or its subscription dropped, and its receipt is in.)
SELECT outbox.drop_subscription('restricted');
SELECT outbox.set_policy('order.placed', retention => '0');
SELECT outbox.set_policy('order.paid', retention => '0', completers => '{}');
INSERT INTO outbox.stream_log_1 SELECT * FROM outbox.stream_log_0 WHERE command_id IN ('c8', 'c9');
DELETE FROM outbox.stream_log_0 WHERE command_id IN ('c8', 'c9');
SELECT outbox.rotate_streams() AS left_the_log;
SELECT (SELECT count(*) FROM outbox.stream_log_1) AS table_1,
	   (SELECT string_agg(command_id, ',') FROM outbox.stream_kept) AS kept,
	   (SELECT string_agg(command_id || ':' || outcome, ',') FROM outbox.stream_purged_commands) AS tombstones,
	   (SELECT count(*) FROM outbox.purged) AS row_tombstones;
SELECT current FROM outbox.stream_rotation;
SELECT outbox.verify();
SELECT outbox.complete('r7', 'c9', 'done');
SELECT outbox.rotate_streams() AS left_the_log;
SELECT outbox.drop_subscription('kafka');
SELECT outbox.rotate_streams() AS left_the_log;
SELECT (SELECT count(*) FROM outbox.stream_kept) AS kept,
	   (SELECT string_agg(command_id || ':' || outcome, ',' ORDER BY command_id) FROM outbox.stream_purged_commands) AS tombstones;
SELECT outbox.verify();
-- A purged stream command is known by its tombstone: complete repeats its
-- outcome (another is refused), inbox_accept takes it, requeue says it was
-- purged; its tombstone excuses its event and no other.
SELECT outbox.complete('r7', 'c9', 'done') AS again;
SELECT pg_temp.err($$SELECT outbox.complete('r7', 'c9', 'other')$$);
SELECT pg_temp.err($$SELECT outbox.complete('r7', 'nosuch', 'done')$$);
SELECT pg_temp.err($$SELECT outbox.complete('r-other', 'c9', 'done')$$);
SELECT outbox.inbox_accept('billing', 'r7', 'c9') AS accepted;
SELECT pg_temp.err($$SELECT outbox.requeue('r7', 'c9')$$);
SELECT first_command, commands, cardinality(command_ids) AS ids FROM outbox.stream_purged ORDER BY 1;
UPDATE outbox.stream_purged SET seqs[1] = seqs[1] + 100 WHERE first_command = 'c9';
SELECT run_id, seq, command_id FROM outbox.check_decisions_without_command;
UPDATE outbox.stream_purged SET seqs[1] = seqs[1] - 100 WHERE first_command = 'c9';
SELECT outbox.verify();

-- drop_subscription took its progress and failures with it.
SELECT (SELECT count(*) FROM outbox.stream_progress WHERE subscription = 'kafka') AS progress,
	   (SELECT count(*) FROM outbox.stream_failures WHERE subscription = 'kafka') AS failures;
SELECT outbox.verify();

-- A subscription dropped while a batch is leased and created again under
-- its name (batch ids start at 1 again): the old holder's token does not
-- ack the new subscription's batch 1, which holds a command it never saw.
SELECT outbox.create_stream('replay', 1);
SELECT outbox.set_policy('replay.k', stream => 'replay');
SELECT outbox.create_subscription('replay', 'again');
SELECT outbox.commit_decision('rr', 1, 'e', 'rc1', 'replay.k', '{}');
SELECT outbox.tick_streams();
SELECT * FROM pg_temp.claim('old', 'replay', 'again', 'w');
SELECT outbox.drop_subscription('again');
SELECT outbox.create_subscription('replay', 'again');
SELECT outbox.commit_decision('rr', 2, 'e', 'rc2', 'replay.k', '{}');
SELECT outbox.tick_streams();
SELECT * FROM pg_temp.claim('new', 'replay', 'again', 'w');
SELECT pg_temp.err(format('SELECT outbox.ack_batch(%L, %L)', 'w', pg_temp.tok('old')));
SELECT pg_temp.err(format('SELECT outbox.renew_batch(%L, %L)', 'w', pg_temp.tok('old')));
SELECT batch_id, version, holder FROM outbox.stream_batches WHERE subscription = 'again';
SELECT outbox.ack_batch('w', pg_temp.tok('new')) AS published;
SELECT outbox.drop_subscription('again');
DROP ROLE regress_stream_pub;
-- A drain finds every command that is committed and ticked: a partition
-- whose batch end is capped (batch_size) at a tick with nothing of its own
-- is looked at again from there in the same claim, not left behind until
-- the next one.  Two partitions, batches of 1: tick 1 holds four commands
-- of partition 0, tick 2 one of partition 1.
SELECT outbox.create_stream('capped', 2, 1);
SELECT outbox.create_subscription('capped', 'capped-sub');
SELECT outbox.set_policy('capped.k', stream => 'capped');
CREATE TEMP TABLE capped_keys AS
SELECT 'key-' || g AS k, (hashtext('key-' || g) & 2147483647) % 2 AS part
  FROM generate_series(1, 40) g;
SELECT count(outbox.commit_decision('cap-' || k, 1, 'e', 'cap-' || k, 'capped.k', '{}', ordering_key => k))
  FROM (SELECT k FROM capped_keys WHERE part = 0 ORDER BY k LIMIT 4) x;
SELECT outbox.tick_streams();
SELECT count(outbox.commit_decision('cap-' || k, 1, 'e', 'cap-' || k, 'capped.k', '{}', ordering_key => k))
  FROM (SELECT k FROM capped_keys WHERE part = 1 ORDER BY k LIMIT 1) x;
SELECT outbox.tick_streams();
-- claim and ack until a claim finds nothing, as outbox-relay --drain does
CREATE FUNCTION pg_temp.drain(stream text, sub text) RETURNS TABLE (batches int, commands int)
LANGUAGE plpgsql AS $$
DECLARE
	t text;
	n int;
BEGIN
	batches := 0;
	commands := 0;
	LOOP
		SELECT min(c.token), count(*) INTO t, n FROM outbox.claim_batch(stream, sub, 'w-drain') c;
		EXIT WHEN n = 0;
		PERFORM outbox.ack_batch('w-drain', t);
		batches := batches + 1;
		commands := commands + n;
	END LOOP;
	RETURN NEXT;
END;
$$;
SELECT * FROM pg_temp.drain('capped', 'capped-sub');
SELECT part, acked_tick, ticks_behind, batch_open, published
  FROM outbox.stream_lag WHERE subscription = 'capped-sub' ORDER BY part;
SELECT count(*) AS left_to_claim FROM outbox.claim_batch('capped', 'capped-sub', 'w-drain');
SELECT outbox.drop_subscription('capped-sub');
SELECT outbox.verify();

-- A rotation step reads the subscriptions' progress once, not once per log
-- row (a progress row is updated at every claim and ack: while the xmin
-- horizon is held back, each read of it walks every version since):
-- 1,000 published commands in the next log table, and the scans of
-- stream_progress during the step that truncates it are counted.
SELECT outbox.create_stream('wide', 1, 1000);
SELECT outbox.create_subscription('wide', 'wide-sub');
SELECT outbox.set_policy('wide.k', stream => 'wide', retention => '0');
SELECT count(*) FILTER (WHERE recorded) FROM outbox.commit_decisions(
	(SELECT jsonb_agg(jsonb_build_object('run_id', 'wr', 'seq', i, 'event_kind', 'e',
			'command_id', 'wide-' || i, 'command_kind', 'wide.k', 'payload', '{}'::jsonb))
	   FROM generate_series(1, 1000) i));
SELECT outbox.tick_streams();
SELECT * FROM pg_temp.drain('wide', 'wide-sub');
SELECT format('outbox.stream_log_%s', current) AS cur_table,
	   format('outbox.stream_log_%s', (current + 1) % 3) AS next_table
  FROM outbox.stream_rotation \gset
INSERT INTO :next_table SELECT * FROM :cur_table WHERE command_id LIKE 'wide-%';
DELETE FROM :cur_table WHERE command_id LIKE 'wide-%';
SELECT count(*) FILTER (WHERE command_id LIKE 'wide-%') AS wide,
	   count(*) FILTER (WHERE command_id NOT LIKE 'wide-%') AS others
  FROM :next_table;
SELECT pg_stat_force_next_flush();
SELECT seq_scan + COALESCE(idx_scan, 0) AS scans_before
  FROM pg_stat_user_tables WHERE relid = 'outbox.stream_progress'::regclass \gset
SELECT outbox.rotate_streams() AS left_the_log;
SELECT pg_stat_force_next_flush();
SELECT seq_scan + COALESCE(idx_scan, 0) - :scans_before < 100 AS progress_read_once
  FROM pg_stat_user_tables WHERE relid = 'outbox.stream_progress'::regclass;
SELECT count(*) AS next_table_left FROM :next_table;
SELECT count(*) AS wide_tombstones FROM outbox.stream_purged_commands WHERE command_id LIKE 'wide-%';
SELECT outbox.drop_subscription('wide-sub');
SELECT outbox.verify();

-- Receipts of stream commands live next to their log table
-- (stream_receipts_N for stream_log_N) and leave with it: the rotation
-- truncates both, deletes no receipt row by row, and moves a kept
-- command's receipt to outbox.receipts.  rx1 is done (published, its
-- receipt in), rx2 failed in the subscription (kept, with its receipt),
-- rx3 has no receipt yet (kept, without one).
SELECT outbox.create_stream('rc', 1);
SELECT outbox.create_subscription('rc', 'rc-sub');
SELECT outbox.set_policy('rc.k', stream => 'rc', retention => '0', completers => ARRAY[current_user::regrole]);
SELECT count(*) FILTER (WHERE recorded) FROM outbox.commit_decisions(
	(SELECT jsonb_agg(jsonb_build_object('run_id', 'rx-run', 'seq', i, 'event_kind', 'e',
			'command_id', 'rx' || i, 'command_kind', 'rc.k', 'payload', '{}'::jsonb))
	   FROM generate_series(1, 3) i));
SELECT outbox.tick_streams();
SELECT count(*) FROM pg_temp.claim('rc', 'rc', 'rc-sub', 'w-rc');
SELECT outbox.ack_batch('w-rc', (SELECT min(token) FROM b WHERE name = 'rc'), ARRAY['rx2'], ARRAY['later']);
-- (Moved by hand into the next log table, which the rotation empties
-- next, emptied by the step above.)
SELECT format('outbox.stream_log_%s', current) AS rc_cur,
	   format('outbox.stream_log_%s', (current + 1) % 3) AS rc_log,
	   format('outbox.stream_receipts_%s', (current + 1) % 3) AS rc_receipts
  FROM outbox.stream_rotation \gset
INSERT INTO :rc_log SELECT * FROM :rc_cur WHERE command_id LIKE 'rx_';
DELETE FROM :rc_cur WHERE command_id LIKE 'rx_';
SELECT count(*) AS next_table FROM :rc_log;
-- complete() writes a stream command's receipt next to it, once: a repeat
-- with the same outcome is false, with another one 23505.
SELECT outbox.complete('rx-run', 'rx1', 'done') AS first, outbox.complete('rx-run', 'rx1', 'done') AS again;
SELECT pg_temp.err($$SELECT outbox.complete('rx-run', 'rx1', 'other')$$);
SELECT outbox.complete('rx-run', 'rx2', 'done');
SELECT (SELECT string_agg(command_id || ':' || outcome, ',' ORDER BY command_id) FROM :rc_receipts) AS next_to_log,
	   (SELECT count(*) FROM outbox.receipts WHERE command_id LIKE 'rx_') AS in_receipts;
-- A receipt in a log table's receipts without its command there is an orphan.
INSERT INTO :rc_receipts (command_id, outcome, run_id) VALUES ('rx-ghost', 'done', 'rx-run');
SELECT command_id, purged FROM outbox.check_orphan_receipts;
DELETE FROM :rc_receipts WHERE command_id = 'rx-ghost';
SELECT outbox.verify();
SELECT relfilenode AS rc_node FROM pg_class WHERE oid = :'rc_receipts'::regclass \gset
SELECT pg_stat_force_next_flush();
BEGIN;
SELECT outbox.rotate_streams() AS left_the_log;
SELECT relname, n_tup_ins, n_tup_del FROM pg_stat_xact_user_tables
 WHERE schemaname = 'outbox' AND relname ~ '^(stream_)?receipts' ORDER BY relname;
COMMIT;
SELECT (SELECT count(*) FROM :rc_log) AS log_left,
	   (SELECT count(*) FROM :rc_receipts) AS receipts_left,
	   (SELECT relfilenode <> :rc_node FROM pg_class WHERE oid = :'rc_receipts'::regclass) AS truncated,
	   (SELECT string_agg(command_id, ',' ORDER BY command_id) FROM outbox.stream_kept WHERE command_id LIKE 'rx_') AS kept,
	   (SELECT string_agg(command_id || ':' || outcome, ',') FROM outbox.receipts WHERE command_id LIKE 'rx_') AS moved,
	   (SELECT string_agg(command_id || ':' || outcome, ',') FROM outbox.stream_purged_commands WHERE command_id LIKE 'rx_') AS tombstones;
-- A consumer's duplicate check still says completed: rx1 by its
-- tombstone, rx2 by its receipt moved with it; rx3 is completed now, and
-- its receipt goes to outbox.receipts (its command is kept).
SELECT outbox.complete('rx-run', 'rx1', 'done') AS rx1_again, outbox.complete('rx-run', 'rx2', 'done') AS rx2_again;
SELECT pg_temp.err($$SELECT outbox.complete('rx-run', 'rx1', 'other')$$);
SELECT pg_temp.err($$SELECT outbox.complete('rx-run', 'rx2', 'other')$$);
SELECT outbox.complete('rx-run', 'rx3', 'done') AS rx3_first, outbox.complete('rx-run', 'rx3', 'done') AS rx3_again;
SELECT string_agg(command_id || ':' || outcome, ',' ORDER BY command_id) AS receipts
  FROM outbox.receipts WHERE command_id LIKE 'rx_';
SELECT outbox.verify();
SELECT outbox.drop_subscription('rc-sub');

-- The single stream decision is written without SQL (docs/internals.md)
-- while no kind has deciders: an error of an index a superuser added
-- names no internal statement, where the statement's names it; a trigger
-- on a log table sends the call to the statement, which writes the same
-- rows (the same partition for the same key, the writer's transaction id
-- plus xid_base, the transaction's now(), the deciding role).  A
-- read-only transaction is refused (25006) on either path.
CREATE FUNCTION pg_temp.ctx(stmt text) RETURNS text LANGUAGE plpgsql AS $$
DECLARE
	c text;
	con text;
BEGIN
	EXECUTE stmt;
	RETURN '00000';
EXCEPTION WHEN OTHERS THEN
	GET STACKED DIAGNOSTICS c = PG_EXCEPTION_CONTEXT, con = CONSTRAINT_NAME;
	RETURN format('%s %s, internal statement: %s', SQLSTATE, con, c LIKE '%INSERT INTO outbox.%');
END;
$$;
BEGIN;
SELECT outbox.create_stream('direct', 3);
SELECT outbox.set_policy('direct.k', stream => 'direct');
SELECT format('outbox.stream_log_%s', current) AS cur_table FROM outbox.stream_rotation \gset
CREATE UNIQUE INDEX direct_payload_key ON :cur_table (payload) WHERE kind = 'direct.k';
SELECT outbox.commit_decision('rd', 1, 'e', 'cd1', 'direct.k', '{"n": 1}', '{"e": 1}',
	   headers => '{"x-a": "b"}', ordering_key => 'kd');
SELECT pg_temp.ctx($$SELECT outbox.commit_decision('rd', 2, 'e', 'cd2', 'direct.k', '{"n": 1}')$$) AS direct;
SELECT pg_temp.ctx($$SELECT outbox.commit_decision('rd', 1, 'e', 'cd2', 'direct.k', '{"n": 2}')$$) AS direct_run_seq;
SELECT outbox.commit_decision('rd', 1, 'e', 'cd1', 'direct.k', '{"n": 1}', ordering_key => 'kd') AS direct_retry;
SELECT pg_temp.ctx($$SELECT outbox.commit_decision('rd', 3, 'e', 'cd1', 'direct.k', '{"n": 3}')$$) AS direct_conflict;
-- the batch form likewise (a retry among new decisions, then a conflict)
SELECT ord, command_id, recorded FROM outbox.commit_decisions('[
  {"run_id": "rd", "seq": 6, "event_kind": "e", "command_id": "cd6", "command_kind": "direct.k", "payload": {"n": 6},
   "event_payload": {"e": 1}, "headers": {"x-a": "b"}, "ordering_key": "kd"},
  {"run_id": "rd", "seq": 1, "event_kind": "e", "command_id": "cd1", "command_kind": "direct.k", "payload": {"n": 1}, "ordering_key": "kd"}]');
SELECT pg_temp.ctx($$SELECT * FROM outbox.commit_decisions('[
  {"run_id": "rd", "seq": 7, "event_kind": "e", "command_id": "cd7", "command_kind": "direct.k", "payload": {"n": 1}}]')$$) AS direct_batch;
SELECT pg_temp.ctx($$SELECT * FROM outbox.commit_decisions('[
  {"run_id": "rd", "seq": 8, "event_kind": "e", "command_id": "cd6", "command_kind": "direct.k", "payload": {"n": 8}}]')$$) AS direct_batch_conflict;
CREATE FUNCTION public.keep_row() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN RETURN NEW; END $$;
CREATE TRIGGER keep_row BEFORE INSERT ON outbox.stream_log_2 FOR EACH ROW EXECUTE FUNCTION public.keep_row();
SELECT outbox.commit_decision('rd', 4, 'e', 'cd4', 'direct.k', '{"n": 4}', '{"e": 1}',
	   headers => '{"x-a": "b"}', ordering_key => 'kd');
SELECT pg_temp.ctx($$SELECT outbox.commit_decision('rd', 5, 'e', 'cd5', 'direct.k', '{"n": 1}')$$) AS statement;
SELECT outbox.commit_decision('rd', 4, 'e', 'cd4', 'direct.k', '{"n": 4}', ordering_key => 'kd') AS statement_retry;
SELECT ord, command_id, recorded FROM outbox.commit_decisions('[
  {"run_id": "rd", "seq": 9, "event_kind": "e", "command_id": "cd9", "command_kind": "direct.k", "payload": {"n": 9},
   "event_payload": {"e": 1}, "headers": {"x-a": "b"}, "ordering_key": "kd"}]');
SELECT pg_temp.ctx($$SELECT * FROM outbox.commit_decisions('[
  {"run_id": "rd", "seq": 10, "event_kind": "e", "command_id": "cd10", "command_kind": "direct.k", "payload": {"n": 1}}]')$$) AS statement_batch;
-- with deciders in the policies, the statement, which checks them (42501)
DROP TRIGGER keep_row ON outbox.stream_log_2;
SELECT outbox.set_policy('direct.k2', stream => 'direct', deciders => '{}');
SELECT format('CREATE ROLE regress_stream_prod IN ROLE %I', outbox.role('producer')) \gexec
SET ROLE regress_stream_prod;
SELECT pg_temp.err($$SELECT outbox.commit_decision('rd2', 1, 'e', 'cd2-1', 'direct.k2', '{}')$$) AS forbidden;
SELECT pg_temp.ctx($$SELECT outbox.commit_decision('rd', 11, 'e', 'cd11', 'direct.k', '{"n": 1}')$$) AS deciders;
RESET ROLE;
SELECT outbox.commit_decision('rd2', 1, 'e', 'cd2-1', 'direct.k2', '{}') AS admin_decides;
SELECT outbox.set_policy('direct.k2', stream => '');
SELECT count(*) AS logged, count(DISTINCT to_jsonb(l) - '{id,command_id,seq,payload}'::text[]) AS distinct_rows,
	   bool_and(l.part = (hashtext('kd') & 2147483647) % 3) AS part_of_key,
	   bool_and(l.xid = (pg_current_xact_id()::text::int8 + r.xid_base)::text::xid8) AS xid,
	   bool_and(l.created_at = now() AND l.decided_by = current_user::regrole) AS now_and_role,
	   bool_and(l.stream_id = s.stream_id) AS stream_id,
	   (SELECT count(*) FROM :cur_table c WHERE c.kind = 'direct.k') AS in_current,
	   max(l.id) > min(l.id) AS ids_in_order
  FROM outbox._stream_log l CROSS JOIN outbox.stream_rotation r
  JOIN outbox.streams s ON s.stream = 'direct'
 WHERE l.kind = 'direct.k';
SELECT count(*) AS events, count(DISTINCT to_jsonb(e) - '{command_id,seq}'::text[]) AS distinct_rows,
	   bool_and(e.created_at = now()) AS times_now
  FROM outbox.events e WHERE e.run_id = 'rd';
ROLLBACK;
BEGIN READ ONLY;
SELECT pg_temp.err($$SELECT outbox.commit_decision('ro', 1, 'e', 'ro-1', 'order.placed', '{}')$$) AS stream_read_only;
SELECT pg_temp.err($$SELECT outbox.commit_decision('ro', 2, 'e', 'ro-2', 'mail', '{}')$$) AS row_read_only;
SELECT pg_temp.err($$SELECT * FROM outbox.commit_decisions('[["ro", 3, "e", "ro-3", "mail", {}]]')$$) AS batch_read_only;
ROLLBACK;

-- The rotation counts a table again under its lock with a fresh snapshot:
-- a transaction that reads one snapshot is refused (25000), changing
-- nothing.
BEGIN ISOLATION LEVEL REPEATABLE READ;
SELECT outbox.rotate_streams();
ROLLBACK;

-- The tick refuses to probe a batch index that is not valid (55000): it
-- would not see the rows the index lacks.  Nothing is cut.
BEGIN;
SELECT count(*) AS ticks_before FROM outbox.stream_ticks \gset
UPDATE pg_index SET indisvalid = false WHERE indexrelid = 'outbox.stream_log_0_batch_idx'::regclass;
SELECT pg_temp.err($$SELECT outbox.tick_streams()$$) AS invalid_index;
SELECT count(*) = :ticks_before AS nothing_cut FROM outbox.stream_ticks;
ROLLBACK;

-- A claim that finds nothing writes nothing: a partition that got no
-- commands since its acked tick keeps it, and the lag view counts it
-- caught up (at the last tick); the worker's move on, before each rotation
-- step (here called by hand), moves it to the last tick.
SELECT outbox.create_stream('idle', 2, 10);
SELECT outbox.create_subscription('idle', 'idle_sub');
SELECT outbox.set_policy('idle.kind', stream => 'idle');
SELECT outbox.commit_decision('ri', 1, 'e', 'ri-1', 'idle.kind', '{}');
SELECT outbox.tick_streams() > 0 AS ticked;
SELECT count(*) AS claimed FROM pg_temp.claim('idle-1', 'idle', 'idle_sub', 'w');
SELECT outbox.ack_batch('w', (SELECT min(token) FROM b WHERE name = 'idle-1'), NULL, NULL, NULL) AS acked;
SELECT outbox.commit_decision('ri', 2, 'e', 'ri-2', 'idle.kind', '{}');
SELECT outbox.tick_streams() > 0 AS ticked;
SELECT count(*) AS claimed FROM pg_temp.claim('idle-2', 'idle', 'idle_sub', 'w');
SELECT outbox.ack_batch('w', (SELECT min(token) FROM b WHERE name = 'idle-2'), NULL, NULL, NULL) AS acked;
SELECT count(*) AS claimed FROM pg_temp.claim('idle-3', 'idle', 'idle_sub', 'w');
CREATE TEMP TABLE idle_last AS
SELECT max(k.tick) AS tick FROM outbox.stream_ticks k JOIN outbox.streams t USING (stream_id)
 WHERE t.stream = 'idle';
SELECT p.part, p.acked_tick = l.tick AS at_last_tick, p.acked_tick < l.tick AS behind
  FROM outbox.stream_progress p, idle_last l WHERE p.subscription = 'idle_sub' ORDER BY p.part;
SELECT s.part, s.acked_tick = l.tick AS at_last_tick, s.ticks_behind, s.ids_behind, s.lag
  FROM outbox.stream_lag s, idle_last l WHERE s.subscription = 'idle_sub' ORDER BY s.part;
SELECT outbox._stream_move_on() AS moved;
SELECT p.part, p.acked_tick = l.tick AS at_last_tick
  FROM outbox.stream_progress p, idle_last l WHERE p.subscription = 'idle_sub' ORDER BY p.part;
-- a partition with a command after its acked tick is behind, and does not move
SELECT outbox.commit_decision('ri', 3, 'e', 'ri-3', 'idle.kind', '{}');
SELECT outbox.tick_streams() > 0 AS ticked;
SELECT outbox._stream_move_on() AS moved;
SELECT s.part, s.ticks_behind FROM outbox.stream_lag s WHERE s.subscription = 'idle_sub' ORDER BY s.part;
SELECT count(*) AS claimed FROM pg_temp.claim('idle-4', 'idle', 'idle_sub', 'w');

-- A claim whose partition's acked tick is gone (only a hand edit can do
-- that) is refused as corrupted data (XX001), leasing nothing.
BEGIN;
SELECT outbox.create_stream('gone', 1, 10);
SELECT outbox.create_subscription('gone', 'gone_sub');
SELECT outbox.set_policy('gone.kind', stream => 'gone');
SELECT outbox.commit_decision('rg', 1, 'e', 'rg-1', 'gone.kind', '{}');
SELECT outbox.tick_streams() > 0 AS ticked;
DELETE FROM outbox.stream_ticks k USING outbox.streams t
 WHERE k.stream_id = t.stream_id AND t.stream = 'gone' AND k.tick = 0;
SELECT pg_temp.err($$SELECT * FROM outbox.claim_batch('gone', 'gone_sub', 'w')$$) AS acked_tick_missing;
SELECT count(*) AS open_batches FROM outbox.stream_batches WHERE subscription = 'gone_sub';
ROLLBACK;

-- A claim writes its tick and its lease without statements; a table with
-- a trigger gets the statement instead, which fires it, and a claim in a
-- read-only transaction is refused (25006), leasing nothing.
SELECT outbox.create_stream('trig', 1, 10);
SELECT outbox.create_subscription('trig', 'trig_sub');
SELECT outbox.set_policy('trig.kind', stream => 'trig');
CREATE FUNCTION public.note_row() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN RAISE NOTICE '% on %', TG_OP, TG_TABLE_NAME; RETURN NEW; END $$;
CREATE TRIGGER note_row BEFORE INSERT ON outbox.stream_ticks FOR EACH ROW EXECUTE FUNCTION public.note_row();
CREATE TRIGGER note_row BEFORE UPDATE ON outbox.streams FOR EACH ROW EXECUTE FUNCTION public.note_row();
CREATE TRIGGER note_row BEFORE UPDATE ON outbox.stream_progress FOR EACH ROW EXECUTE FUNCTION public.note_row();
SELECT outbox.commit_decision('rt', 1, 'e', 'rt-1', 'trig.kind', '{}');
SELECT outbox.tick_streams() > 0 AS ticked;
SELECT command_id, version, deliveries FROM pg_temp.claim('trig-1', 'trig', 'trig_sub', 'w');
SELECT outbox.ack_batch('w', (SELECT min(token) FROM b WHERE name = 'trig-1')) AS published;
DROP TRIGGER note_row ON outbox.stream_ticks;
DROP TRIGGER note_row ON outbox.streams;
DROP TRIGGER note_row ON outbox.stream_progress;
DROP FUNCTION public.note_row();
SELECT outbox.commit_decision('rt', 2, 'e', 'rt-2', 'trig.kind', '{}');
SELECT outbox.tick_streams() > 0 AS ticked;
BEGIN READ ONLY;
SELECT pg_temp.err($$SELECT * FROM outbox.claim_batch('trig', 'trig_sub', 'w')$$) AS read_only;
ROLLBACK;
SELECT command_id, version, deliveries FROM pg_temp.claim('trig-2', 'trig', 'trig_sub', 'w');
SELECT subscription, part, batch_to IS NOT NULL AS open, version, owner, deliveries, batch_rows
  FROM outbox.stream_progress WHERE subscription = 'trig_sub';

-- Claims in one REPEATABLE READ transaction see what the claims before
-- them leased: the second takes the other partition, the third nothing.
SELECT outbox.create_stream('rr', 2, 100);
SELECT outbox.create_subscription('rr', 'rr_sub');
SELECT outbox.set_policy('rr.kind', stream => 'rr');
SELECT count(*) AS decided FROM (SELECT outbox.commit_decision('rr' || i, 1, 'e', 'rr-' || i, 'rr.kind', '{}')
                                   FROM generate_series(1, 6) i) d;
SELECT outbox.tick_streams() > 0 AS ticked;
BEGIN ISOLATION LEVEL REPEATABLE READ;
SELECT count(*) AS commands, count(DISTINCT part) AS partitions FROM pg_temp.claim('rr-1', 'rr', 'rr_sub', 'w');
SELECT count(*) AS commands, count(DISTINCT part) AS partitions FROM pg_temp.claim('rr-2', 'rr', 'rr_sub', 'w');
SELECT count(*) AS commands FROM pg_temp.claim('rr-3', 'rr', 'rr_sub', 'w');
COMMIT;
SELECT count(*) AS claimed, count(DISTINCT command_id) AS distinct_commands, count(DISTINCT part) AS partitions
  FROM b WHERE name IN ('rr-1', 'rr-2');

-- A column the claim writes whose type was changed by hand sends the
-- write to the statement, which coerces the value; one the claim reads is
-- refused (55000), leasing nothing.
SELECT outbox.create_stream('alt', 1, 10);
SELECT outbox.create_subscription('alt', 'alt_sub');
SELECT outbox.set_policy('alt.kind', stream => 'alt');
SELECT outbox.commit_decision('ra', 1, 'e', 'ra-1', 'alt.kind', '{}');
SELECT outbox.tick_streams() > 0 AS ticked;
BEGIN;
ALTER TABLE outbox.subscriptions ALTER COLUMN created_at TYPE timestamp;
SELECT pg_temp.err($$SELECT * FROM outbox.claim_batch('alt', 'alt_sub', 'w')$$) AS altered_read;
ROLLBACK;
BEGIN;
ALTER TABLE outbox.stream_progress ALTER COLUMN claim_nonce TYPE numeric;
SELECT command_id, version, deliveries FROM pg_temp.claim('alt-1', 'alt', 'alt_sub', 'w');
SELECT batch_to IS NOT NULL AS open, owner, claim_nonce IS NOT NULL AS nonce, batch_rows
  FROM outbox.stream_progress WHERE subscription = 'alt_sub';
ROLLBACK;
