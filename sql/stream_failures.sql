-- Streams: failed, dead and repeatedly taken-over commands (docs/streams.md,
-- "Failures"): requeue and resolve of a command dead in a subscription,
-- the delivery limit of a batch's takeovers, the cut of error texts, and
-- the lease errors' details, each as the row path has them.  The checks
-- stay exact after every step.
DROP EXTENSION outbox;
CREATE EXTENSION outbox;
\set VERBOSITY terse
SET intervalstyle = postgres;

-- The SQLSTATE, message and detail of a statement (00000 when it succeeds).
CREATE FUNCTION pg_temp.err(stmt text) RETURNS text LANGUAGE plpgsql AS $$
DECLARE
	d text;
BEGIN
	EXECUTE stmt;
	RETURN '00000';
EXCEPTION WHEN OTHERS THEN
	GET STACKED DIAGNOSTICS d = PG_EXCEPTION_DETAIL;
	RETURN SQLSTATE || ': ' || SQLERRM || CASE WHEN d <> '' THEN ' | ' || d ELSE '' END;
END;
$$;
-- Claim a batch of sub as worker; remember its token under name.
CREATE TEMP TABLE b (name text, token text);
CREATE FUNCTION pg_temp.claim(name text, stream text, sub text, worker text, lease interval DEFAULT '1 hour')
RETURNS TABLE (command_id text, version bigint, deliveries int)
LANGUAGE sql AS $$
	WITH c AS (SELECT x.*, row_number() OVER () AS ord
				 FROM outbox.claim_batch(stream, sub, worker, lease) x),
		 i AS (INSERT INTO b SELECT DISTINCT name, c.token FROM c)
	SELECT c.command_id, c.version, c.deliveries FROM c ORDER BY c.ord
$$;
CREATE FUNCTION pg_temp.tok(n text) RETURNS text LANGUAGE sql AS $$
	SELECT min(token) FROM b WHERE name = n
$$;
-- The failures of a subscription, and whether the checks are clean.
CREATE FUNCTION pg_temp.failed(sub text)
RETURNS TABLE (command_id text, status text, deliveries int, in_batch bool, last_error text)
LANGUAGE sql AS $$
	SELECT f.command_id, f.status, f.deliveries, f.in_batch, f.last_error
	  FROM outbox.stream_failed f WHERE f.subscription = sub ORDER BY f.command_id
$$;
CREATE FUNCTION pg_temp.clean() RETURNS text LANGUAGE sql AS $$
	SELECT CASE WHEN NOT EXISTS (SELECT 1 FROM outbox.check_stream_state)
				 AND NOT EXISTS (SELECT 1 FROM outbox.conservation WHERE violations > 0)
				THEN 'clean' ELSE 'NOT CLEAN' END
$$;

-- Leases: the same refusals, with the same details, as the row path's.
SELECT outbox.create_stream('leases', 1);
SELECT outbox.create_subscription('leases', 'l');
SELECT pg_temp.err($$SELECT * FROM outbox.claim_batch('leases', 'l', 'w', '100 years')$$) AS stream,
	   pg_temp.err($$SELECT * FROM outbox.claim('w', 1, '100 years')$$) AS row_path;
SELECT pg_temp.err($$SELECT * FROM outbox.claim_batch('leases', 'l', 'w', '-1 second')$$) AS stream,
	   pg_temp.err($$SELECT * FROM outbox.claim('w', 1, '-1 second')$$) AS row_path;
SELECT pg_temp.err($$SELECT * FROM outbox.claim_batch('leases', 'l', 'w', '3000 years')$$) AS stream,
	   pg_temp.err($$SELECT * FROM outbox.claim('w', 1, '3000 years')$$) AS row_path;
SELECT pg_temp.err($$SELECT * FROM outbox.claim_batch('leases', 'l', 'w', '-3000 years 1 second')$$) AS stream,
	   pg_temp.err($$SELECT * FROM outbox.claim('w', 1, '-3000 years 1 second')$$) AS row_path;
SELECT outbox.drop_subscription('l');

-- Error texts: cut at OUTBOX_MAX_ERROR_LEN bytes on a character boundary,
-- with a mark, as fail cuts them; short ones are kept whole.
SELECT outbox.create_stream('st', 1);
SELECT outbox.set_policy('st.k', stream => 'st', backoff_base => '0', backoff_max => '0');
SELECT outbox.create_subscription('st', 'kafka');
SELECT outbox.commit_decision('r', 1, 'e', 'long', 'st.k', '{}');
SELECT outbox.commit_decision('r', 2, 'e', 'row-long', 'row.k', '{}');
SELECT outbox.tick_streams();
SELECT * FROM pg_temp.claim('t0', 'st', 'kafka', 'w');
-- (6001 bytes: the 2042nd 'é' ends at byte 4085, the next one would end
-- past the 4086 left before the mark)
SELECT outbox.ack_batch('w', pg_temp.tok('t0'), ARRAY['long'], ARRAY['x' || repeat('é', 3000)],
						ARRAY[true]) AS published;
SELECT outbox.fail('w', token, 'x' || repeat('é', 3000)) FROM outbox.claim('w', 1, kinds => '{row.k}');
SELECT octet_length(f.last_error) AS bytes, right(f.last_error, 11) AS tail,
	   f.last_error = c.last_error AS as_the_row_path
  FROM outbox.stream_failures f, outbox.commands c
 WHERE f.command_id = 'long' AND c.command_id = 'row-long';
SELECT outbox._error_text('short') AS kept, outbox._error_text(NULL) IS NULL AS null_kept;
DELETE FROM outbox.commands WHERE command_id = 'row-long';
DELETE FROM outbox.events WHERE command_id = 'row-long';
-- Resolved as dead, a cut error keeps the note: the error is cut further
-- so that "; resolved as dead" fits after its mark, within the 4,096 bytes.
SELECT outbox.resolve('r', 'long', 'dead');
SELECT octet_length(f.last_error) AS bytes, right(f.last_error, 28) AS tail
  FROM outbox.stream_failures f WHERE f.command_id = 'long';
SELECT octet_length(outbox._error_text(repeat('x', 4078), '; resolved as dead')) AS fits,
	   right(outbox._error_text(repeat('x', 4079), '; resolved as dead'), 28) AS cut,
	   outbox._error_text('boom', NULL) AS no_note;
SELECT outbox.resolve('r', 'long', 'published');

-- requeue and resolve of stream commands.  Two subscriptions; d1 (key K)
-- goes dead in kafka and is published in hook; d2, of the same key, waits
-- behind it in kafka.
SELECT outbox.create_subscription('st', 'hook');
SELECT outbox.commit_decision('r', 3, 'e', 'd1', 'st.k', '{}', ordering_key => 'K');
SELECT outbox.tick_streams();
SELECT * FROM pg_temp.claim('t2', 'st', 'kafka', 'w');
SELECT outbox.ack_batch('w', pg_temp.tok('t2'), ARRAY['d1'], ARRAY['HTTP 400'], ARRAY[true]) AS published;
SELECT * FROM pg_temp.claim('h1', 'st', 'hook', 'w');
SELECT outbox.ack_batch('w', pg_temp.tok('h1')) AS published;
SELECT outbox.commit_decision('r', 4, 'e', 'd2', 'st.k', '{}', ordering_key => 'K');
SELECT outbox.tick_streams();
SELECT count(*) AS claimed FROM pg_temp.claim('t3', 'st', 'kafka', 'w');
SELECT * FROM pg_temp.failed('kafka');
SELECT pg_temp.clean();

-- Refused, changing nothing: 42704, 55000, OB002, 22023, 22004.
SELECT pg_temp.err($$SELECT outbox.requeue('r', 'd1', 'nope')$$);
SELECT pg_temp.err($$SELECT outbox.requeue('r', 'd1', 'hook')$$);
SELECT pg_temp.err($$SELECT outbox.requeue('r', 'd2')$$);
SELECT pg_temp.err($$SELECT outbox.requeue('r', 'nope')$$);
SELECT pg_temp.err($$SELECT outbox.requeue('r', 'nope', 'kafka')$$);
SELECT pg_temp.err($$SELECT outbox.requeue('x', 'd1')$$);
SELECT pg_temp.err($$SELECT outbox.requeue('r', 'd1', '')$$);
SELECT pg_temp.err($$SELECT outbox.requeue(NULL, 'd1')$$);
SELECT outbox.create_stream('other', 1);
SELECT outbox.create_subscription('other', 'elsewhere');
SELECT pg_temp.err($$SELECT outbox.requeue('r', 'd1', 'elsewhere')$$);
SELECT pg_temp.err($$SELECT outbox.resolve('r', 'd1', 'maybe')$$);
SELECT pg_temp.err($$SELECT outbox.resolve('r', 'd1', 'published', 'hook')$$);
SELECT outbox.commit_decision('r', 5, 'e', 'row-dead', 'row.k', '{}');
SELECT outbox.fail('w', token, 'boom', fatal => true) FROM outbox.claim('w', 1, kinds => '{row.k}');
SELECT pg_temp.err($$SELECT outbox.requeue('r', 'row-dead', 'kafka')$$);
SELECT pg_temp.err($$SELECT outbox.resolve('r', 'row-dead', 'retry', 'kafka')$$);
-- (the row path is unchanged: requeue without a subscription, and resolve
-- of a dead command of outbox.commands is refused)
SELECT pg_temp.err($$SELECT outbox.resolve('r', 'row-dead', 'published')$$);
SELECT outbox.requeue('r', 'row-dead');
SELECT status FROM outbox.commands WHERE command_id = 'row-dead';
SELECT * FROM pg_temp.failed('kafka');

-- requeue: the dead command retries now (its deliveries kept), and the
-- command behind it waits on; once requeued, it is dead nowhere.
SELECT outbox.requeue('r', 'd1');
SELECT * FROM pg_temp.failed('kafka');
SELECT pg_temp.clean();
SELECT pg_temp.err($$SELECT outbox.requeue('r', 'd1')$$);
-- it is claimed again, with one delivery more, and fails for good again
SELECT * FROM pg_temp.claim('t4', 'st', 'kafka', 'w');
SELECT outbox.ack_batch('w', pg_temp.tok('t4'), ARRAY['d1'], ARRAY['HTTP 400 again'], ARRAY[true]) AS published;
SELECT * FROM pg_temp.failed('kafka');

-- resolve: dead (stays dead, marked), then published (it leaves the
-- failures and releases d2, which is claimed next).
SELECT outbox.resolve('r', 'd1', 'dead', 'kafka');
SELECT * FROM pg_temp.failed('kafka');
SELECT outbox.resolve('r', 'd1', 'published');
SELECT * FROM pg_temp.failed('kafka');
SELECT pg_temp.clean();
SELECT * FROM pg_temp.claim('t5', 'st', 'kafka', 'w');
SELECT outbox.ack_batch('w', pg_temp.tok('t5')) AS published;
SELECT count(*) AS failures FROM outbox.stream_failures WHERE subscription = 'kafka';
SELECT pg_temp.err($$SELECT outbox.resolve('r', 'd1', 'published')$$);
-- resolve as retry is requeue
SELECT outbox.commit_decision('r', 6, 'e', 'd3', 'st.k', '{}');
SELECT outbox.tick_streams();
SELECT * FROM pg_temp.claim('t6', 'st', 'kafka', 'w');
SELECT outbox.ack_batch('w', pg_temp.tok('t6'), ARRAY['d3'], ARRAY['no'], ARRAY[true]) AS published;
SELECT outbox.resolve('r', 'd3', 'retry');
SELECT * FROM pg_temp.failed('kafka');
SELECT * FROM pg_temp.claim('t7', 'st', 'kafka', 'w');
SELECT outbox.ack_batch('w', pg_temp.tok('t7')) AS published;
-- in every subscription where it is dead, when none is named
SELECT outbox.commit_decision('r', 7, 'e', 'd4', 'st.k', '{}');
SELECT outbox.tick_streams();
SELECT * FROM pg_temp.claim('t8', 'st', 'kafka', 'w');
SELECT outbox.ack_batch('w', pg_temp.tok('t8'), ARRAY['d4'], ARRAY['k'], ARRAY[true]) AS published;
SELECT count(*) FROM pg_temp.claim('h2', 'st', 'hook', 'w');
SELECT outbox.ack_batch('w', pg_temp.tok('h2'), ARRAY['d4'], ARRAY['h'], ARRAY[true]) AS published;
SELECT outbox.resolve('r', 'd4', 'published');
SELECT count(*) AS failures FROM outbox.stream_failures;
SELECT pg_temp.clean();
SELECT outbox.verify();

-- The delivery limit of a batch's takeovers.  cap.k has max_deliveries 2;
-- a batch of q1, q2 (key K2), q3 (key K2), q4 whose holder disappears at
-- every delivery: after its 2 deliveries it is halved, then halved again,
-- until the command left alone dies alone; the others are delivered, q3
-- after q2.
SELECT outbox.create_stream('capst', 1);
SELECT outbox.set_policy('cap.k', stream => 'capst', max_deliveries => 2);
SELECT outbox.create_subscription('capst', 'c');
SELECT outbox.commit_decision('q', 1, 'e', 'q1', 'cap.k', '{}');
SELECT outbox.commit_decision('q', 2, 'e', 'q2', 'cap.k', '{}', ordering_key => 'K2');
SELECT outbox.commit_decision('q', 3, 'e', 'q3', 'cap.k', '{}', ordering_key => 'K2');
SELECT outbox.commit_decision('q', 4, 'e', 'q4', 'cap.k', '{}');
SELECT outbox.tick_streams();
SELECT * FROM pg_temp.claim('c1', 'capst', 'c', 'w1', '10 milliseconds');
SELECT pg_sleep(0.05);
SELECT * FROM pg_temp.claim('c2', 'capst', 'c', 'w2', '10 milliseconds');
SELECT pg_sleep(0.05);
-- deliveries used up: halved (q1 and q2 stay the batch, taken over)
SELECT * FROM pg_temp.claim('c3', 'capst', 'c', 'w3', '10 milliseconds');
SELECT * FROM pg_temp.failed('c');
SELECT version, deliveries, commands, retries FROM outbox.stream_batches WHERE subscription = 'c';
SELECT pg_temp.clean();
SELECT pg_temp.err(format('SELECT outbox.ack_batch(%L, %L)', 'w2', pg_temp.tok('c2')));
SELECT pg_sleep(0.05);
SELECT * FROM pg_temp.claim('c4', 'capst', 'c', 'w4', '10 milliseconds');
SELECT * FROM pg_temp.failed('c');
SELECT pg_temp.clean();
SELECT pg_sleep(0.05);
-- q1 alone, used up: dead; the partition moves on and the same claim
-- opens the next batch (the retries due)
SELECT * FROM pg_temp.claim('c5', 'capst', 'c', 'w5');
SELECT * FROM pg_temp.failed('c');
SELECT pg_temp.clean();
SELECT outbox.ack_batch('w5', pg_temp.tok('c5')) AS published;
SELECT * FROM pg_temp.claim('c6', 'capst', 'c', 'w6');
SELECT outbox.ack_batch('w6', pg_temp.tok('c6')) AS published;
SELECT * FROM pg_temp.failed('c');
SELECT count(*) AS left_to_claim FROM outbox.claim_batch('capst', 'c', 'w7');
SELECT pg_temp.clean();
-- the dead one is requeued like any other
SELECT outbox.requeue('q', 'q1');
SELECT * FROM pg_temp.claim('c7', 'capst', 'c', 'w7');
SELECT outbox.ack_batch('w7', pg_temp.tok('c7')) AS published;
SELECT count(*) AS failures FROM outbox.stream_failures WHERE subscription = 'c';
SELECT outbox.verify();

-- A command dead by a fatal failure keeps, once requeued, the deliveries
-- it had left (as on the row path): one more failure that is not fatal
-- makes it a retry, not dead; one that used them up goes dead again at
-- its next failure (d1 and q1 above).
SELECT outbox.create_stream('fatalst', 1);
SELECT outbox.set_policy('fatalst.k', stream => 'fatalst', max_deliveries => 3,
						 backoff_base => '0', backoff_max => '0');
SELECT outbox.create_subscription('fatalst', 'fs');
SELECT outbox.commit_decision('fr', 1, 'e', 'f1', 'fatalst.k', '{}');
SELECT outbox.tick_streams();
SELECT * FROM pg_temp.claim('f1', 'fatalst', 'fs', 'w');
SELECT outbox.ack_batch('w', pg_temp.tok('f1'), ARRAY['f1'], ARRAY['HTTP 400'], ARRAY[true]) AS published;
SELECT outbox.requeue('fr', 'f1');
SELECT * FROM pg_temp.claim('f2', 'fatalst', 'fs', 'w');
SELECT outbox.ack_batch('w', pg_temp.tok('f2'), ARRAY['f1'], ARRAY['HTTP 503']) AS published;
SELECT * FROM pg_temp.failed('fs');
SELECT pg_temp.clean();
