-- Hostile input: every API function against NULLs in every argument, empty
-- and oversized ids, multi-megabyte and deeply nested payloads, odd Unicode
-- (accepted), negative, zero and huge leases, batch sizes 0, -1 and
-- 2^31-1, malformed and forged lease tokens, arrays with NULLs and 2-D
-- arrays.  Each case runs in a subtransaction that is
-- always rolled back (an accepted call too) and reports its SQLSTATE; the
-- tables must be the same afterwards and the server must still be up.
DROP EXTENSION outbox;
CREATE EXTENSION outbox;
\set VERBOSITY terse

-- Fixtures: h-pending; h-live leased to w1 at version 2 (its token in
-- tok); h-pub published with a receipt; h-dead dead; h-unc uncertain.
CREATE TEMP TABLE tok (command_id text PRIMARY KEY, token text NOT NULL);
DO $$
BEGIN
	PERFORM outbox.commit_decision('h-run', 1, 'e', 'h-pending', 'k', '{"n": 1}');
	PERFORM outbox.commit_decision('h-run', 2, 'e', 'h-live', 'k-live', '{"n": 2}');
	PERFORM outbox.commit_decision('h-run', 3, 'e', 'h-pub', 'k-pub', '{"n": 3}');
	PERFORM outbox.commit_decision('h-run', 4, 'e', 'h-dead', 'k-dead', '{"n": 4}');
	PERFORM outbox.commit_decision('h-run', 5, 'e', 'h-unc', 'k-unc', '{"n": 5}');
	INSERT INTO tok SELECT command_id, token FROM outbox.claim('w1', 1, '1 hour', '{k-live}');
	INSERT INTO tok SELECT command_id, token FROM outbox.claim('w1', 1, '1 hour', '{k-pub}');
	PERFORM outbox.ack('w1', (SELECT token FROM tok WHERE command_id = 'h-pub'));
	PERFORM outbox.complete('h-run', 'h-pub');
	PERFORM outbox.register_consumer('c1', current_user::text::regrole);
	PERFORM outbox.register_consumer((SELECT U&'cmd-\+01F680-\202E-e\0301-\200D-\FEFF-\+10FFFF'), current_user::text::regrole);
	PERFORM outbox.inbox_accept('c1', 'h-run', 'h-pub');
	INSERT INTO tok SELECT command_id, token FROM outbox.claim('w1', 1, '1 hour', '{k-dead}');
	PERFORM outbox.fail('w1', (SELECT token FROM tok WHERE command_id = 'h-dead'), 'rejected', true);
	PERFORM outbox.claim('w1', 1, '1 hour', '{k-unc}');
	UPDATE outbox.commands
	   SET status = 'uncertain', lease_until = NULL, version = version + 1,
		   last_error = 'lease of worker w1 expired; kind k-unc needs a manual takeover'
	 WHERE command_id = 'h-unc';
	PERFORM outbox.set_policy('k-unc', takeover => 'manual');
END;
$$;
SELECT command_id, status, version FROM outbox.commands ORDER BY command_id;

-- What the tables hold now, and when the server started.
CREATE TABLE hostile_before AS
SELECT 'events' AS tbl, coalesce(md5(string_agg(t::text, E'\n' ORDER BY t::text)), 'empty') AS digest, count(*) AS n FROM outbox.events t
UNION ALL SELECT 'commands', coalesce(md5(string_agg(t::text, E'\n' ORDER BY t::text)), 'empty'), count(*) FROM outbox.commands t
UNION ALL SELECT 'receipts', coalesce(md5(string_agg(t::text, E'\n' ORDER BY t::text)), 'empty'), count(*) FROM outbox.receipts t
UNION ALL SELECT 'inbox', coalesce(md5(string_agg(t::text, E'\n' ORDER BY t::text)), 'empty'), count(*) FROM outbox.inbox t
UNION ALL SELECT 'policies', coalesce(md5(string_agg(t::text, E'\n' ORDER BY t::text)), 'empty'), count(*) FROM outbox.policies t
UNION ALL SELECT 'purged', coalesce(md5(string_agg(t::text, E'\n' ORDER BY t::text)), 'empty'), count(*) FROM outbox.purged t
UNION ALL SELECT 'consumers', coalesce(md5(string_agg(t::text, E'\n' ORDER BY t::text)), 'empty'), count(*) FROM outbox.consumers t
UNION ALL SELECT 'postmaster', pg_postmaster_start_time()::text, 0;

-- Run one statement in a subtransaction that is always rolled back; return
-- its SQLSTATE (00000 when it succeeded) and message.
CREATE FUNCTION pg_temp.attempt(stmt text, OUT state text, OUT message text)
LANGUAGE plpgsql AS $$
BEGIN
	BEGIN
		EXECUTE stmt;
		RAISE SQLSTATE 'HOK00';
	EXCEPTION WHEN OTHERS THEN
		state := SQLSTATE;
		message := SQLERRM;
	END;
	IF state = 'HOK00' THEN
		state := '00000';
		message := '';
	END IF;
END;
$$;

-- Values used by many cases.
CREATE TEMP TABLE v AS
SELECT (SELECT token FROM tok WHERE command_id = 'h-live') AS live,	-- h-live's token
	   (SELECT token FROM tok WHERE command_id = 'h-pub') AS spent,	-- h-pub's, acked
	   (SELECT regexp_replace(token, '^.{32}', repeat('0', 32)) FROM tok
		 WHERE command_id = 'h-live') AS guessed,		-- h-live's, a wrong secret
	   repeat('x', 201) AS long_id,						-- one byte over the limit
	   repeat('x', 200) AS max_id,						-- at the limit
	   repeat(U&'\00E9', 100) || 'x' AS long_mb_id,	-- 201 bytes, 101 characters
	   repeat('x', 1048576) AS huge_id,					-- 1 MB
	   U&'cmd-\+01F680-\202E-e\0301-\200D-\FEFF-\+10FFFF' AS odd_id,
	   jsonb_build_object('s', repeat('x', 3 * 1024 * 1024)) AS big_payload,
	   jsonb_build_object('s', repeat('x', 1000000)) AS near_limit_payload,
	   (repeat('[', 65) || repeat(']', 65))::jsonb AS deep_payload,
	   (repeat('{"a":', 1000) || '1' || repeat('}', 1000))::jsonb AS very_deep_payload,
	   (repeat('[', 64) || repeat(']', 64))::jsonb AS depth_64_payload;

CREATE TEMP TABLE cases (n serial, name text, expected text, stmt text);
INSERT INTO cases (name, expected, stmt) VALUES
-- commit_decision(run_id, seq, event_kind, command_id, command_kind, payload, event_payload, not_before, priority)
('cd: null run_id', '22004', $$SELECT outbox.commit_decision(NULL, 1, 'e', 'n1', 'k', '{}')$$),
('cd: null seq', '22004', $$SELECT outbox.commit_decision('r', NULL, 'e', 'n1', 'k', '{}')$$),
('cd: null event_kind', '22004', $$SELECT outbox.commit_decision('r', 1, NULL, 'n1', 'k', '{}')$$),
('cd: null command_id', '22004', $$SELECT outbox.commit_decision('r', 1, 'e', NULL, 'k', '{}')$$),
('cd: null command_kind', '22004', $$SELECT outbox.commit_decision('r', 1, 'e', 'n1', NULL, '{}')$$),
('cd: null payload', '22004', $$SELECT outbox.commit_decision('r', 1, 'e', 'n1', 'k', NULL)$$),
('cd: null event_payload (optional)', '00000', $$SELECT outbox.commit_decision('r', 1, 'e', 'n1', 'k', '{}', NULL)$$),
('cd: null not_before (now)', '00000', $$SELECT outbox.commit_decision('r', 1, 'e', 'n1', 'k', '{}', NULL, NULL)$$),
('cd: null priority', '22004', $$SELECT outbox.commit_decision('r', 1, 'e', 'n1', 'k', '{}', NULL, NULL, NULL)$$),
('cd: empty run_id', '22023', $$SELECT outbox.commit_decision('', 1, 'e', 'n1', 'k', '{}')$$),
('cd: empty event_kind', '22023', $$SELECT outbox.commit_decision('r', 1, '', 'n1', 'k', '{}')$$),
('cd: empty command_id', '22023', $$SELECT outbox.commit_decision('r', 1, 'e', '', 'k', '{}')$$),
('cd: empty command_kind', '22023', $$SELECT outbox.commit_decision('r', 1, 'e', 'n1', '', '{}')$$),
('cd: run_id of 201 bytes', '22023', $$SELECT outbox.commit_decision((SELECT long_id FROM v), 1, 'e', 'n1', 'k', '{}')$$),
('cd: command_id of 201 bytes', '22023', $$SELECT outbox.commit_decision('r', 1, 'e', (SELECT long_id FROM v), 'k', '{}')$$),
('cd: command_id of 101 chars, 201 bytes', '22023', $$SELECT outbox.commit_decision('r', 1, 'e', (SELECT long_mb_id FROM v), 'k', '{}')$$),
('cd: command_id of 1 MB', '22023', $$SELECT outbox.commit_decision('r', 1, 'e', (SELECT huge_id FROM v), 'k', '{}')$$),
('cd: command_kind of 201 bytes', '22023', $$SELECT outbox.commit_decision('r', 1, 'e', 'n1', (SELECT long_id FROM v), '{}')$$),
('cd: ids of 200 bytes', '00000', $$SELECT outbox.commit_decision((SELECT max_id FROM v), 1, (SELECT max_id FROM v), (SELECT max_id FROM v), (SELECT max_id FROM v), '{}')$$),
('cd: odd Unicode ids and payload', '00000', $$SELECT outbox.commit_decision((SELECT odd_id FROM v), 1, (SELECT odd_id FROM v), (SELECT odd_id FROM v), (SELECT odd_id FROM v), jsonb_build_object((SELECT odd_id FROM v), (SELECT odd_id FROM v)))$$),
('cd: invalid UTF-8 cannot be made', '22021', $$SELECT outbox.commit_decision('r', 1, 'e', convert_from('\xc328'::bytea, 'UTF8'), 'k', '{}')$$),
('cd: NUL in a payload string', '22P05', $$SELECT outbox.commit_decision('r', 1, 'e', 'n1', 'k', '{"s": "\u0000"}')$$),
('cd: lone surrogate in a payload', '22P02', $$SELECT outbox.commit_decision('r', 1, 'e', 'n1', 'k', '{"s": "\ud800"}')$$),
('cd: seq -1', '22023', $$SELECT outbox.commit_decision('r', -1, 'e', 'n1', 'k', '{}')$$),
('cd: seq 0', '00000', $$SELECT outbox.commit_decision('r', 0, 'e', 'n1', 'k', '{}')$$),
('cd: seq 2^63-1', '00000', $$SELECT outbox.commit_decision('r', 9223372036854775807, 'e', 'n1', 'k', '{}')$$),
('cd: 3 MB payload', '54000', $$SELECT outbox.commit_decision('r', 1, 'e', 'n1', 'k', (SELECT big_payload FROM v))$$),
('cd: 1 MB payload, under the limit', '00000', $$SELECT outbox.commit_decision('r', 1, 'e', 'n1', 'k', (SELECT near_limit_payload FROM v))$$),
('cd: payload nested 65 deep', '54000', $$SELECT outbox.commit_decision('r', 1, 'e', 'n1', 'k', (SELECT deep_payload FROM v))$$),
('cd: payload nested 1000 deep', '54000', $$SELECT outbox.commit_decision('r', 1, 'e', 'n1', 'k', (SELECT very_deep_payload FROM v))$$),
('cd: payload nested 64 deep', '00000', $$SELECT outbox.commit_decision('r', 1, 'e', 'n1', 'k', (SELECT depth_64_payload FROM v))$$),
('cd: 3 MB event_payload', '54000', $$SELECT outbox.commit_decision('r', 1, 'e', 'n1', 'k', '{}', (SELECT big_payload FROM v))$$),
('cd: event_payload nested 65 deep', '54000', $$SELECT outbox.commit_decision('r', 1, 'e', 'n1', 'k', '{}', (SELECT deep_payload FROM v))$$),
('cd: not_before -infinity', '22023', $$SELECT outbox.commit_decision('r', 1, 'e', 'n1', 'k', '{}', NULL, '-infinity')$$),
('cd: not_before infinity', '22023', $$SELECT outbox.commit_decision('r', 1, 'e', 'n1', 'k', '{}', NULL, 'infinity')$$),
('cd: priority extremes', '00000', $$SELECT outbox.commit_decision('r', 1, 'e', 'n1', 'k', '{}', NULL, NULL, -2147483648), outbox.commit_decision('r', 2, 'e', 'n2', 'k', '{}', NULL, NULL, 2147483647)$$),
('cd: existing command_id', '23505', $$SELECT outbox.commit_decision('r', 1, 'e', 'h-live', 'k', '{}')$$),
('cd: existing (run_id, seq)', '23505', $$SELECT outbox.commit_decision('h-run', 1, 'e', 'n1', 'k', '{}')$$),
-- commit_decisions(decisions jsonb): a JSON array of objects
('cds: null decisions', '22004', $$SELECT outbox.commit_decisions(NULL)$$),
('cds: an object, not an array', '22023', $$SELECT outbox.commit_decisions('{"run_id": "r", "seq": 1, "event_kind": "e", "command_id": "n1", "command_kind": "k", "payload": {}}')$$),
('cds: a scalar', '22023', $$SELECT outbox.commit_decisions('1')$$),
('cds: an element that is not an object', '22023', $$SELECT outbox.commit_decisions('[{"run_id": "r", "seq": 1, "event_kind": "e", "command_id": "n1", "command_kind": "k", "payload": {}}, 1]')$$),
('cds: an element that is an array', '22023', $$SELECT outbox.commit_decisions('[[]]')$$),
('cds: missing run_id', '22004', $$SELECT outbox.commit_decisions('[{"seq": 1, "event_kind": "e", "command_id": "n1", "command_kind": "k", "payload": {}}]')$$),
('cds: null seq', '22004', $$SELECT outbox.commit_decisions('[{"run_id": "r", "seq": null, "event_kind": "e", "command_id": "n1", "command_kind": "k", "payload": {}}]')$$),
('cds: missing event_kind', '22004', $$SELECT outbox.commit_decisions('[{"run_id": "r", "seq": 1, "command_id": "n1", "command_kind": "k", "payload": {}}]')$$),
('cds: missing command_id', '22004', $$SELECT outbox.commit_decisions('[{"run_id": "r", "seq": 1, "event_kind": "e", "command_kind": "k", "payload": {}}]')$$),
('cds: missing command_kind', '22004', $$SELECT outbox.commit_decisions('[{"run_id": "r", "seq": 1, "event_kind": "e", "command_id": "n1", "payload": {}}]')$$),
('cds: missing payload', '22004', $$SELECT outbox.commit_decisions('[{"run_id": "r", "seq": 1, "event_kind": "e", "command_id": "n1", "command_kind": "k"}]')$$),
('cds: an unknown key', '22023', $$SELECT outbox.commit_decisions('[{"run_id": "r", "seq": 1, "event_kind": "e", "command_id": "n1", "command_kind": "k", "payload": {}, "version": 1}]')$$),
('cds: run_id a number', '22023', $$SELECT outbox.commit_decisions('[{"run_id": 5, "seq": 1, "event_kind": "e", "command_id": "n1", "command_kind": "k", "payload": {}}]')$$),
('cds: seq a string', '00000', $$SELECT outbox.commit_decisions('[{"run_id": "r", "seq": "9223372036854775807", "event_kind": "e", "command_id": "n1", "command_kind": "k", "payload": {}}]')$$),
('cds: seq not a number', '22P02', $$SELECT outbox.commit_decisions('[{"run_id": "r", "seq": "x", "event_kind": "e", "command_id": "n1", "command_kind": "k", "payload": {}}]')$$),
('cds: seq a fraction', '22023', $$SELECT outbox.commit_decisions('[{"run_id": "r", "seq": 1.5, "event_kind": "e", "command_id": "n1", "command_kind": "k", "payload": {}}]')$$),
('cds: seq a boolean', '22023', $$SELECT outbox.commit_decisions('[{"run_id": "r", "seq": true, "event_kind": "e", "command_id": "n1", "command_kind": "k", "payload": {}}]')$$),
('cds: seq over 2^63', '22003', $$SELECT outbox.commit_decisions('[{"run_id": "r", "seq": "9223372036854775808", "event_kind": "e", "command_id": "n1", "command_kind": "k", "payload": {}}]')$$),
('cds: seq -1', '22023', $$SELECT outbox.commit_decisions('[{"run_id": "r", "seq": -1, "event_kind": "e", "command_id": "n1", "command_kind": "k", "payload": {}}]')$$),
('cds: optional keys null', '00000', $$SELECT outbox.commit_decisions('[{"run_id": "r", "seq": 1, "event_kind": "e", "command_id": "n1", "command_kind": "k", "payload": {}, "event_payload": null, "not_before": null, "priority": null}]')$$),
('cds: every key', '00000', $$SELECT outbox.commit_decisions('[{"run_id": "r", "seq": 1, "event_kind": "e", "command_id": "n1", "command_kind": "k", "payload": {}, "event_payload": {"a": 1}, "not_before": "2000-01-01 00:00:00+00", "priority": -2147483648}]')$$),
('cds: priority a string', '22023', $$SELECT outbox.commit_decisions('[{"run_id": "r", "seq": 1, "event_kind": "e", "command_id": "n1", "command_kind": "k", "payload": {}, "priority": "1"}]')$$),
('cds: priority over 2^31', '22003', $$SELECT outbox.commit_decisions('[{"run_id": "r", "seq": 1, "event_kind": "e", "command_id": "n1", "command_kind": "k", "payload": {}, "priority": 2147483648}]')$$),
('cds: not_before a number', '22023', $$SELECT outbox.commit_decisions('[{"run_id": "r", "seq": 1, "event_kind": "e", "command_id": "n1", "command_kind": "k", "payload": {}, "not_before": 1}]')$$),
('cds: not_before not a time', '22007', $$SELECT outbox.commit_decisions('[{"run_id": "r", "seq": 1, "event_kind": "e", "command_id": "n1", "command_kind": "k", "payload": {}, "not_before": "soon"}]')$$),
('cds: not_before -infinity', '22023', $$SELECT outbox.commit_decisions('[{"run_id": "r", "seq": 1, "event_kind": "e", "command_id": "n1", "command_kind": "k", "payload": {}, "not_before": "-infinity"}]')$$),
('cds: empty array', '00000', $$SELECT outbox.commit_decisions('[]')$$),
('cds: 10001 decisions (outbox.max_batch)', '54000', $$SELECT outbox.commit_decisions((SELECT jsonb_agg(jsonb_build_object('run_id', 'r', 'seq', i, 'event_kind', 'e', 'command_id', 'n' || i, 'command_kind', 'k', 'payload', '{}'::jsonb)) FROM generate_series(1, 10001) i))$$),
('cds: empty id element', '22023', $$SELECT outbox.commit_decisions('[{"run_id": "r", "seq": 1, "event_kind": "e", "command_id": "", "command_kind": "k", "payload": {}}]')$$),
('cds: id element of 201 bytes', '22023', $$SELECT outbox.commit_decisions(jsonb_build_array(jsonb_build_object('run_id', (SELECT long_id FROM v), 'seq', 1, 'event_kind', 'e', 'command_id', 'n1', 'command_kind', 'k', 'payload', '{}'::jsonb)))$$),
('cds: 3 MB payload element', '54000', $$SELECT outbox.commit_decisions(jsonb_build_array(jsonb_build_object('run_id', 'r', 'seq', 1, 'event_kind', 'e', 'command_id', 'n1', 'command_kind', 'k', 'payload', (SELECT big_payload FROM v))))$$),
('cds: deep event_payload element', '54000', $$SELECT outbox.commit_decisions(jsonb_build_array(jsonb_build_object('run_id', 'r', 'seq', 1, 'event_kind', 'e', 'command_id', 'n1', 'command_kind', 'k', 'payload', '{}'::jsonb, 'event_payload', (SELECT deep_payload FROM v))))$$),
('cds: command_id repeated in the batch', '23505', $$SELECT outbox.commit_decisions('[{"run_id": "r", "seq": 1, "event_kind": "e", "command_id": "n1", "command_kind": "k", "payload": {}}, {"run_id": "r", "seq": 2, "event_kind": "e", "command_id": "n1", "command_kind": "k", "payload": {}}]')$$),
('cds: (run_id, seq) repeated in the batch', '23505', $$SELECT outbox.commit_decisions('[{"run_id": "r", "seq": 1, "event_kind": "e", "command_id": "n1", "command_kind": "k", "payload": {}}, {"run_id": "r", "seq": 1, "event_kind": "e", "command_id": "n2", "command_kind": "k", "payload": {}}]')$$),
('cds: existing command_id', '23505', $$SELECT outbox.commit_decisions('[{"run_id": "r", "seq": 1, "event_kind": "e", "command_id": "h-live", "command_kind": "k", "payload": {}}]')$$),
-- record_event(run_id, seq, kind, payload)
('re: null run_id', '22004', $$SELECT outbox.record_event(NULL, 1, 'note')$$),
('re: null seq', '22004', $$SELECT outbox.record_event('r', NULL, 'note')$$),
('re: null kind', '22004', $$SELECT outbox.record_event('r', 1, NULL)$$),
('re: null payload (optional)', '00000', $$SELECT outbox.record_event('r', 1, 'note', NULL)$$),
('re: empty kind', '22023', $$SELECT outbox.record_event('r', 1, '')$$),
('re: run_id of 201 bytes', '22023', $$SELECT outbox.record_event((SELECT long_id FROM v), 1, 'note')$$),
('re: seq -1', '22023', $$SELECT outbox.record_event('r', -1, 'note')$$),
('re: 3 MB payload', '54000', $$SELECT outbox.record_event('r', 1, 'note', (SELECT big_payload FROM v))$$),
('re: payload nested 1000 deep', '54000', $$SELECT outbox.record_event('r', 1, 'note', (SELECT very_deep_payload FROM v))$$),
('re: existing (run_id, seq)', '23505', $$SELECT outbox.record_event('h-run', 1, 'note')$$),
-- claim(worker, batch_size, lease, kinds)
('claim: null worker', '22004', $$SELECT * FROM outbox.claim(NULL)$$),
('claim: empty worker', '22023', $$SELECT * FROM outbox.claim('')$$),
('claim: worker of 201 bytes', '22023', $$SELECT * FROM outbox.claim((SELECT long_id FROM v))$$),
('claim: odd Unicode worker', '00000', $$SELECT * FROM outbox.claim((SELECT odd_id FROM v))$$),
('claim: null batch_size', '22004', $$SELECT * FROM outbox.claim('w2', NULL)$$),
('claim: batch_size 0', '22023', $$SELECT * FROM outbox.claim('w2', 0)$$),
('claim: batch_size -1', '22023', $$SELECT * FROM outbox.claim('w2', -1)$$),
('claim: batch_size 2^31-1', '22023', $$SELECT * FROM outbox.claim('w2', 2147483647)$$),
('claim: batch_size 10000 (outbox.max_batch)', '00000', $$SELECT * FROM outbox.claim('w2', 10000)$$),
('claim: null lease (default)', '00000', $$SELECT * FROM outbox.claim('w2', 1, NULL)$$),
('claim: lease 0', '22023', $$SELECT * FROM outbox.claim('w2', 1, '0')$$),
('claim: lease -1 second', '22023', $$SELECT * FROM outbox.claim('w2', 1, '-1 second')$$),
('claim: lease 1 month -31 days', '22023', $$SELECT * FROM outbox.claim('w2', 1, '1 month -31 days')$$),
('claim: lease 1000000 years', '22023', $$SELECT * FROM outbox.claim('w2', 1, '1000000 years')$$),
('claim: lease 178000000 years', '22023', $$SELECT * FROM outbox.claim('w2', 1, '178000000 years')$$),
('claim: lease longer than max_lease', '22023', $$SELECT * FROM outbox.claim('w2', 1, '1 day 1 second')$$),
('claim: lease 1000 months -29999 days (437 days)', '22023', $$SELECT * FROM outbox.claim('w2', 1, '1000 mons -29999 days')$$),
('claim: lease 1 microsecond', '00000', $$SELECT * FROM outbox.claim('w2', 1, '1 microsecond')$$),
('claim: NULL in kinds', '22004', $$SELECT * FROM outbox.claim('w2', 1, NULL, '{k,NULL}')$$),
('claim: 2-D kinds', '2202E', $$SELECT * FROM outbox.claim('w2', 1, NULL, '{{k},{k-live}}')$$),
('claim: empty kinds', '00000', $$SELECT * FROM outbox.claim('w2', 1, NULL, '{}')$$),
('claim: empty and oversized kind names', '00000', $$SELECT * FROM outbox.claim('w2', 1, NULL, ARRAY['', (SELECT huge_id FROM v)])$$),
-- ack(worker, token)
('ack: null worker', '22004', $$SELECT outbox.ack(NULL, (SELECT live FROM v))$$),
('ack: null token', '22004', $$SELECT outbox.ack('w1', NULL)$$),
('ack: empty worker', '22023', $$SELECT outbox.ack('', (SELECT live FROM v))$$),
('ack: worker of 201 bytes', '22023', $$SELECT outbox.ack((SELECT long_id FROM v), (SELECT live FROM v))$$),
('ack: empty token', 'OB001', $$SELECT outbox.ack('w1', '')$$),
('ack: token of 1 MB', 'OB001', $$SELECT outbox.ack('w1', (SELECT huge_id FROM v))$$),
('ack: odd Unicode token', 'OB001', $$SELECT outbox.ack('w1', (SELECT odd_id FROM v))$$),
('ack: a guessed secret', 'OB001', $$SELECT outbox.ack('w1', (SELECT guessed FROM v))$$),
('ack: a spent token', 'OB001', $$SELECT outbox.ack('w1', (SELECT spent FROM v))$$),
('ack: another worker', 'OB001', $$SELECT outbox.ack('w2', (SELECT live FROM v))$$),
('ack: the current token', '00000', $$SELECT outbox.ack('w1', (SELECT live FROM v))$$),
-- ack_many(worker, tokens)
('ack_many: null worker', '22004', $$SELECT * FROM outbox.ack_many(NULL, ARRAY[(SELECT live FROM v)])$$),
('ack_many: null tokens', '22004', $$SELECT * FROM outbox.ack_many('w1', NULL)$$),
('ack_many: NULL in tokens', '22004', $$SELECT * FROM outbox.ack_many('w1', ARRAY[(SELECT live FROM v), NULL])$$),
('ack_many: 2-D tokens', '2202E', $$SELECT * FROM outbox.ack_many('w1', '{{a},{b}}')$$),
('ack_many: empty worker', '22023', $$SELECT * FROM outbox.ack_many('', ARRAY[(SELECT live FROM v)])$$),
('ack_many: empty array', '00000', $$SELECT * FROM outbox.ack_many('w1', '{}')$$),
('ack_many: malformed, guessed and spent tokens', '00000', $$SELECT * FROM outbox.ack_many('w1', ARRAY['', (SELECT huge_id FROM v), (SELECT guessed FROM v), (SELECT spent FROM v)])$$),
('ack_many: 10001 tokens (outbox.max_batch)', '54000', $$SELECT * FROM outbox.ack_many('w1', array_fill((SELECT live FROM v), '{10001}'))$$),
('ack_many: the same token twice', '00000', $$SELECT * FROM outbox.ack_many('w1', ARRAY[(SELECT live FROM v), (SELECT live FROM v)])$$),
-- fail(worker, token, error, fatal)
('fail: null worker', '22004', $$SELECT outbox.fail(NULL, (SELECT live FROM v), 'x')$$),
('fail: null token', '22004', $$SELECT outbox.fail('w1', NULL, 'x')$$),
('fail: null error', '22004', $$SELECT outbox.fail('w1', (SELECT live FROM v), NULL)$$),
('fail: null fatal', '22004', $$SELECT outbox.fail('w1', (SELECT live FROM v), 'x', NULL)$$),
('fail: worker of 201 bytes', '22023', $$SELECT outbox.fail((SELECT long_id FROM v), (SELECT live FROM v), 'x')$$),
('fail: a guessed secret, fatal', 'OB001', $$SELECT outbox.fail('w1', (SELECT guessed FROM v), 'x', true)$$),
('fail: another worker, fatal', 'OB001', $$SELECT outbox.fail('w2', (SELECT live FROM v), 'x', true)$$),
('fail: malformed token', 'OB001', $$SELECT outbox.fail('w1', 'h-live', 'x')$$),
('fail: empty error', '00000', $$SELECT outbox.fail('w1', (SELECT live FROM v), '')$$),
('fail: 1 MB error, cut with a mark, kept whole characters', '00000', $c$DO $x$
BEGIN
	PERFORM outbox.fail('w1', (SELECT live FROM v), 'x' || repeat(U&'\00E9', 500000), true);
	PERFORM convert_from(textsend(last_error), 'UTF8') FROM outbox.commands WHERE command_id = 'h-live';
	IF (SELECT octet_length(last_error) FROM outbox.commands WHERE command_id = 'h-live') NOT BETWEEN 4000 AND 4096 THEN
		RAISE 'last_error was not cut to at most 4096 bytes';
	END IF;
	IF (SELECT last_error NOT LIKE '%[... cut]' FROM outbox.commands WHERE command_id = 'h-live') THEN
		RAISE 'last_error does not end with the cut mark';
	END IF;
END;
$x$$c$),
-- renew(worker, token, lease)
('renew: null worker', '22004', $$SELECT outbox.renew(NULL, (SELECT live FROM v))$$),
('renew: null token', '22004', $$SELECT outbox.renew('w1', NULL)$$),
('renew: null lease (default)', '00000', $$SELECT outbox.renew('w1', (SELECT live FROM v), NULL)$$),
('renew: a guessed secret', 'OB001', $$SELECT outbox.renew('w1', (SELECT guessed FROM v), '1 day')$$),
('renew: another worker', 'OB001', $$SELECT outbox.renew('w2', (SELECT live FROM v), '1 day')$$),
('renew: lease 0', '22023', $$SELECT outbox.renew('w1', (SELECT live FROM v), '0')$$),
('renew: lease -1 day', '22023', $$SELECT outbox.renew('w1', (SELECT live FROM v), '-1 day')$$),
('renew: lease 1 month -31 days', '22023', $$SELECT outbox.renew('w1', (SELECT live FROM v), '1 month -31 days')$$),
('renew: lease 1000 months -29999 days (437 days)', '22023', $$SELECT outbox.renew('w1', (SELECT live FROM v), '1000 mons -29999 days')$$),
('renew: lease 1000000 years', '22023', $$SELECT outbox.renew('w1', (SELECT live FROM v), '1000000 years')$$),
('renew: a published command', 'OB001', $$SELECT outbox.renew('w1', (SELECT spent FROM v))$$),
-- complete(run_id, command_id, outcome, detail)
('complete: null run_id', '22004', $$SELECT outbox.complete(NULL, 'h-live')$$),
('complete: null command_id', '22004', $$SELECT outbox.complete('h-run', NULL)$$),
('complete: null outcome', '22004', $$SELECT outbox.complete('h-run', 'h-live', NULL)$$),
('complete: null detail (optional)', '00000', $$SELECT outbox.complete('h-run', 'h-live', 'done', NULL)$$),
('complete: empty run_id', '22023', $$SELECT outbox.complete('', 'h-live')$$),
('complete: empty command_id', '22023', $$SELECT outbox.complete('h-run', '')$$),
('complete: empty outcome', '22023', $$SELECT outbox.complete('h-run', 'h-live', '')$$),
('complete: outcome of 201 bytes', '22023', $$SELECT outbox.complete('h-run', 'h-live', (SELECT long_id FROM v))$$),
('complete: 3 MB detail', '54000', $$SELECT outbox.complete('h-run', 'h-live', 'done', (SELECT big_payload FROM v))$$),
('complete: detail nested 65 deep', '54000', $$SELECT outbox.complete('h-run', 'h-live', 'done', (SELECT deep_payload FROM v))$$),
('complete: unknown command', 'OB002', $$SELECT outbox.complete('h-run', 'nope')$$),
('complete: another run''s command', 'OB002', $$SELECT outbox.complete('h-other', 'h-live')$$),
('complete: another outcome than the receipt''s', '23505', $$SELECT outbox.complete('h-run', 'h-pub', 'failed')$$),
-- inbox_accept(consumer, run_id, command_id)
('inbox: null consumer', '22004', $$SELECT outbox.inbox_accept(NULL, 'h-run', 'h-pub')$$),
('inbox: null run_id', '22004', $$SELECT outbox.inbox_accept('c1', NULL, 'h-pub')$$),
('inbox: null command_id', '22004', $$SELECT outbox.inbox_accept('c1', 'h-run', NULL)$$),
('inbox: empty consumer', '22023', $$SELECT outbox.inbox_accept('', 'h-run', 'h-pub')$$),
('inbox: command_id of 201 bytes', '22023', $$SELECT outbox.inbox_accept('c1', 'h-run', (SELECT long_id FROM v))$$),
('inbox: consumer of 1 MB', '22023', $$SELECT outbox.inbox_accept((SELECT huge_id FROM v), 'h-run', 'h-pub')$$),
('inbox: odd Unicode consumer', '00000', $$SELECT outbox.inbox_accept((SELECT odd_id FROM v), 'h-run', 'h-live')$$),
('inbox: unknown command', 'OB002', $$SELECT outbox.inbox_accept('c1', 'h-run', (SELECT odd_id FROM v))$$),
('inbox: another run''s command', 'OB002', $$SELECT outbox.inbox_accept('c1', 'h-other', 'h-pub')$$),
('inbox: unregistered consumer', 'OB003', $$SELECT outbox.inbox_accept('c2', 'h-run', 'h-pub')$$),
('inbox: a repeat', '00000', $$SELECT outbox.inbox_accept('c1', 'h-run', 'h-pub')$$),
-- register_consumer(consumer, role), unregister_consumer(consumer)
('register: null consumer', '22004', $$SELECT outbox.register_consumer(NULL, current_user::text::regrole)$$),
('register: null role', '22004', $$SELECT outbox.register_consumer('c2', NULL)$$),
('register: empty consumer', '22023', $$SELECT outbox.register_consumer('', current_user::text::regrole)$$),
('register: consumer of 201 bytes', '22023', $$SELECT outbox.register_consumer((SELECT long_id FROM v), current_user::text::regrole)$$),
('register: to another role', '23505', $$SELECT outbox.register_consumer('c1', 'pg_monitor')$$),
('register: unknown role', '42704', $$SELECT outbox.register_consumer('c2', 'no_such_role')$$),
('unregister: null', '22004', $$SELECT outbox.unregister_consumer(NULL)$$),
('unregister: unknown', '00000', $$SELECT outbox.unregister_consumer('c2')$$),
-- sweep(batch_size)
('sweep: null batch_size', '22004', $$SELECT outbox.sweep(NULL)$$),
('sweep: batch_size 0', '22023', $$SELECT outbox.sweep(0)$$),
('sweep: batch_size -1', '22023', $$SELECT outbox.sweep(-1)$$),
('sweep: batch_size 2^31-1', '22023', $$SELECT outbox.sweep(2147483647)$$),
('sweep: batch_size 1', '00000', $$SELECT outbox.sweep(1)$$),
-- purge(batch_size, older_than)
('purge: nulls (defaults)', '00000', $$SELECT outbox.purge(NULL, NULL)$$),
('purge: batch_size 0', '22023', $$SELECT outbox.purge(0)$$),
('purge: batch_size -1', '22023', $$SELECT outbox.purge(-1)$$),
('purge: batch_size 2^31-1', '00000', $$SELECT outbox.purge(2147483647)$$),
('purge: older_than -1 second', '22023', $$SELECT outbox.purge(NULL, '-1 second')$$),
('purge: older_than 1000000 years', '22023', $$SELECT outbox.purge(NULL, '1000000 years')$$),
('purge: older_than 0', '00000', $$SELECT outbox.purge(NULL, '0')$$),
-- requeue(run_id, command_id)
('requeue: null run_id', '22004', $$SELECT outbox.requeue(NULL, 'h-dead')$$),
('requeue: null command_id', '22004', $$SELECT outbox.requeue('h-run', NULL)$$),
('requeue: empty', '22023', $$SELECT outbox.requeue('h-run', '')$$),
('requeue: 201 bytes', '22023', $$SELECT outbox.requeue('h-run', (SELECT long_id FROM v))$$),
('requeue: unknown command', 'OB002', $$SELECT outbox.requeue('h-run', 'nope')$$),
('requeue: another run''s command', 'OB002', $$SELECT outbox.requeue('h-other', 'h-dead')$$),
('requeue: a pending command', '55000', $$SELECT outbox.requeue('h-run', 'h-pending')$$),
('requeue: a dead command', '00000', $$SELECT outbox.requeue('h-run', 'h-dead')$$),
-- resolve(run_id, command_id, resolution)
('resolve: null run_id', '22004', $$SELECT outbox.resolve(NULL, 'h-unc', 'retry')$$),
('resolve: null command_id', '22004', $$SELECT outbox.resolve('h-run', NULL, 'retry')$$),
('resolve: null resolution', '22004', $$SELECT outbox.resolve('h-run', 'h-unc', NULL)$$),
('resolve: empty command_id', '22023', $$SELECT outbox.resolve('h-run', '', 'retry')$$),
('resolve: unknown resolution', '22023', $$SELECT outbox.resolve('h-run', 'h-unc', 'maybe')$$),
('resolve: resolution of 1 MB', '22023', $$SELECT outbox.resolve('h-run', 'h-unc', (SELECT huge_id FROM v))$$),
('resolve: unknown command', 'OB002', $$SELECT outbox.resolve('h-run', 'nope', 'retry')$$),
('resolve: another run''s command', 'OB002', $$SELECT outbox.resolve('h-other', 'h-unc', 'retry')$$),
('resolve: a dead command', '55000', $$SELECT outbox.resolve('h-run', 'h-dead', 'retry')$$),
('resolve: an uncertain command', '00000', $$SELECT outbox.resolve('h-run', 'h-unc', 'published')$$),
-- set_policy(kind, max_deliveries, backoff_base, backoff_max, lease, takeover, retention)
('policy: null kind', '22004', $$SELECT outbox.set_policy(NULL)$$),
('policy: empty kind', '22023', $$SELECT outbox.set_policy('')$$),
('policy: kind of 201 bytes', '22023', $$SELECT outbox.set_policy((SELECT long_id FROM v))$$),
('policy: max_deliveries 0', '22023', $$SELECT outbox.set_policy('k', max_deliveries => 0)$$),
('policy: max_deliveries -1', '22023', $$SELECT outbox.set_policy('k', max_deliveries => -1)$$),
('policy: max_deliveries 2^31-1', '00000', $$SELECT outbox.set_policy('k', max_deliveries => 2147483647)$$),
('policy: backoff_base -1 second', '22023', $$SELECT outbox.set_policy('k', backoff_base => '-1 second')$$),
('policy: backoff_base 1000000 years', '22023', $$SELECT outbox.set_policy('k', backoff_base => '1000000 years')$$),
('policy: backoff_max 1000000 years', '22023', $$SELECT outbox.set_policy('k', backoff_max => '1000000 years')$$),
('policy: lease 0', '22023', $$SELECT outbox.set_policy('k', lease => '0')$$),
('policy: lease -1 second', '22023', $$SELECT outbox.set_policy('k', lease => '-1 second')$$),
('policy: lease 1000000 years', '22023', $$SELECT outbox.set_policy('k', lease => '1000000 years')$$),
('policy: lease 1000 months -29999 days (437 days)', '22023', $$SELECT outbox.set_policy('k', lease => '1000 mons -29999 days')$$),
('policy: lease -1 month 28 days (never positive)', '22023', $$SELECT outbox.set_policy('k', lease => '-1 mon 28 days')$$),
('policy: backoff_base 1201 months -1 day (over 100 years)', '22023', $$SELECT outbox.set_policy('k', backoff_base => '1201 mons -1 day')$$),
('policy: retention 178000000 years (timestamp overflow)', '22023', $$SELECT outbox.set_policy('k', retention => '178000000 years')$$),
('policy: unknown takeover', '22023', $$SELECT outbox.set_policy('k', takeover => 'never')$$),
('policy: retention -1 second', '22023', $$SELECT outbox.set_policy('k', retention => '-1 second')$$),
('policy: retention 1000000 years', '22023', $$SELECT outbox.set_policy('k', retention => '1000000 years')$$),
('policy: retention 100 years', '00000', $$SELECT outbox.set_policy('k', retention => '100 years')$$),
('policy: all NULL but kind', '00000', $$SELECT outbox.set_policy('k', NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL)$$),
('policy: NULL in deciders', '22004', $$SELECT outbox.set_policy('k', deciders => ARRAY[NULL]::regrole[])$$),
('policy: 2-D claimers', '2202E', $$SELECT outbox.set_policy('k', claimers => '{{pg_monitor}}')$$),
('policy: unknown role in completers', '42704', $$SELECT outbox.set_policy('k', completers => '{no_such_role}')$$),
('policy: empty lists (admins only)', '00000', $$SELECT outbox.set_policy('k', deciders => '{}', claimers => '{}', completers => '{}')$$),
('policy: a list of roles', '00000', $$SELECT outbox.set_policy('k', deciders => '{pg_monitor,pg_read_all_data}')$$),
-- pause(kind), resume(kind)
('pause: null', '22004', $$SELECT outbox.pause(NULL)$$),
('pause: empty', '22023', $$SELECT outbox.pause('')$$),
('pause: 201 bytes', '22023', $$SELECT outbox.pause((SELECT long_id FROM v))$$),
('pause: odd Unicode', '00000', $$SELECT outbox.pause((SELECT odd_id FROM v))$$),
('resume: null', '22004', $$SELECT outbox.resume(NULL)$$),
('resume: empty', '22023', $$SELECT outbox.resume('')$$),
('resume: 1 MB', '22023', $$SELECT outbox.resume((SELECT huge_id FROM v))$$),
-- verify(include_warnings)
('verify: null', '22004', $$SELECT outbox.verify(NULL)$$),
('verify: healthy', '00000', $$SELECT outbox.verify(true)$$);

-- Run them all, then show each case's expected and actual SQLSTATE.
CREATE TEMP TABLE results AS
SELECT c.n, c.name, c.expected, r.state AS got, r.state = c.expected AS ok, r.message
  FROM cases c, LATERAL pg_temp.attempt(c.stmt) r;
SELECT n, name AS "case", expected, got, ok, message FROM results ORDER BY n;

-- How many cases and functions, and how many went otherwise than expected.
SELECT count(*) AS cases, count(DISTINCT split_part(name, ':', 1)) AS functions,
	   count(*) FILTER (WHERE NOT ok) AS unexpected
  FROM results;

-- The tables are unchanged, and the server did not restart.
SELECT b.tbl, b.n,
	   b.digest = CASE b.tbl
		   WHEN 'events' THEN (SELECT coalesce(md5(string_agg(t::text, E'\n' ORDER BY t::text)), 'empty') FROM outbox.events t)
		   WHEN 'commands' THEN (SELECT coalesce(md5(string_agg(t::text, E'\n' ORDER BY t::text)), 'empty') FROM outbox.commands t)
		   WHEN 'receipts' THEN (SELECT coalesce(md5(string_agg(t::text, E'\n' ORDER BY t::text)), 'empty') FROM outbox.receipts t)
		   WHEN 'inbox' THEN (SELECT coalesce(md5(string_agg(t::text, E'\n' ORDER BY t::text)), 'empty') FROM outbox.inbox t)
		   WHEN 'policies' THEN (SELECT coalesce(md5(string_agg(t::text, E'\n' ORDER BY t::text)), 'empty') FROM outbox.policies t)
		   WHEN 'purged' THEN (SELECT coalesce(md5(string_agg(t::text, E'\n' ORDER BY t::text)), 'empty') FROM outbox.purged t)
		   WHEN 'consumers' THEN (SELECT coalesce(md5(string_agg(t::text, E'\n' ORDER BY t::text)), 'empty') FROM outbox.consumers t)
		   WHEN 'postmaster' THEN pg_postmaster_start_time()::text END AS unchanged
  FROM hostile_before b
 ORDER BY b.tbl;
SELECT count(*) AS conservation_violations FROM outbox.conservation WHERE violations > 0;

DROP TABLE hostile_before;
