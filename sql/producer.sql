-- Producer API: commit_decision, commit_decisions, record_event.
-- Start from an empty outbox (pg_regress created the extension already).
DROP EXTENSION outbox;
CREATE EXTENSION outbox;

-- The classic decision: one event and one pending command.
SELECT outbox.commit_decision('run-1', 1, 'trip_requested', 'cmd-1', 'lock_budget', '{"amount": 900}');
SELECT run_id, seq, kind, command_id FROM outbox.events ORDER BY run_id, seq;
SELECT command_id, run_id, seq, kind, payload, status, version, deliveries, priority,
       owner IS NULL AS no_owner, lease_until IS NULL AS no_lease,
       due_at = available_at AS due_is_available, published_at IS NULL AS unpublished
  FROM outbox.commands;

-- Reusing the command id is refused with 23505 and leaves nothing behind.
\set VERBOSITY default
SELECT outbox.commit_decision('run-1', 2, 'trip_requested', 'cmd-1', 'lock_budget', '{"amount": 900}');
SELECT count(*) AS events_of_run_1 FROM outbox.events WHERE run_id = 'run-1';
-- Reusing (run_id, seq) is refused too.
SELECT outbox.commit_decision('run-1', 1, 'trip_requested', 'cmd-2', 'lock_budget', '{}');
SELECT count(*) AS commands FROM outbox.commands;

-- Optional extras: event payload, not-before time, priority; jsonb is canonical.
SELECT outbox.commit_decision('run-2', 1, 'mail_decided', 'cmd-2', 'send_mail',
       '{"b": 1, "a": 2}', event_payload => '{"why": "signup"}',
       not_before => now() + interval '1 hour', priority => 5);
SELECT command_id, payload, priority, available_at > now() AS delayed, due_at = available_at AS due
  FROM outbox.commands WHERE command_id = 'cmd-2';
SELECT payload FROM outbox.events WHERE run_id = 'run-2';

-- An event that decides no command.
SELECT outbox.record_event('run-1', 2, 'trip_approved');
SELECT outbox.record_event('run-1', 3, 'note', '{"text": "ok"}');
SELECT outbox.record_event('run-1', 2, 'trip_approved');
SELECT run_id, seq, kind, payload, command_id FROM outbox.events WHERE run_id = 'run-1' ORDER BY seq;

-- Atomicity: a rolled-back transaction leaves neither event nor command.
BEGIN;
SELECT outbox.commit_decision('run-3', 1, 'e', 'cmd-3', 'k', '{}');
ROLLBACK;
SELECT count(*) AS left_behind FROM outbox.events WHERE run_id = 'run-3';
SELECT count(*) AS left_behind FROM outbox.commands WHERE command_id = 'cmd-3';

-- A failed decision inside a savepoint leaves nothing; the rest commits.
BEGIN;
SELECT outbox.commit_decision('run-4', 1, 'e', 'cmd-4', 'k', '{}');
SAVEPOINT s;
SELECT outbox.commit_decision('run-4', 2, 'e', 'cmd-4', 'k', '{}');
ROLLBACK TO SAVEPOINT s;
COMMIT;
SELECT run_id, seq, command_id FROM outbox.events WHERE run_id = 'run-4';

-- Set-based form: one JSON array of decisions, a row per decision.
SELECT * FROM outbox.commit_decisions('[
  {"run_id": "run-5", "seq": 1, "event_kind": "e", "command_id": "cmd-5a", "command_kind": "k", "payload": {"n": 1}},
  {"run_id": "run-5", "seq": "2", "event_kind": "e", "command_id": "cmd-5b", "command_kind": "k", "payload": {"n": 2}, "priority": 1},
  {"run_id": "run-5", "seq": 3, "event_kind": "e", "command_id": "cmd-5c", "command_kind": "j", "payload": {"n": 3}, "priority": 2,
   "event_payload": {"why": 3}, "not_before": null}]');
SELECT command_id, seq, kind, payload, priority, status FROM outbox.commands
 WHERE run_id = 'run-5' ORDER BY command_id;
SELECT seq, payload FROM outbox.events WHERE run_id = 'run-5' ORDER BY seq;
SELECT * FROM outbox.commit_decisions('[]');
-- The same batch again is a retry: no error, no second row, recorded = false;
-- a batch mixing retries and new decisions records the new ones.
SELECT * FROM outbox.commit_decisions('[
  {"run_id": "run-5", "seq": 1, "event_kind": "e", "command_id": "cmd-5a", "command_kind": "k", "payload": {"n": 1}},
  {"run_id": "run-5", "seq": 4, "event_kind": "e", "command_id": "cmd-5d", "command_kind": "k", "payload": {"n": 4}}]');
SELECT count(*) AS run_5_events, count(c.command_id) AS run_5_commands
  FROM outbox.events e LEFT JOIN outbox.commands c USING (command_id) WHERE e.run_id = 'run-5';
-- All or nothing: one conflict rejects the whole call.
SELECT * FROM outbox.commit_decisions('[
  {"run_id": "run-6", "seq": 1, "event_kind": "e", "command_id": "cmd-6", "command_kind": "k", "payload": {}},
  {"run_id": "run-6", "seq": 2, "event_kind": "e", "command_id": "cmd-1", "command_kind": "k", "payload": {}}]');
SELECT * FROM outbox.commit_decisions('[
  {"run_id": "run-6", "seq": 1, "event_kind": "e", "command_id": "cmd-6", "command_kind": "k", "payload": {}},
  {"run_id": "run-6", "seq": 1, "event_kind": "e", "command_id": "cmd-6b", "command_kind": "k", "payload": {}}]');
SELECT * FROM outbox.commit_decisions('[
  {"run_id": "run-6", "seq": 1, "event_kind": "e", "command_id": "cmd-6", "command_kind": "k", "payload": {}},
  {"run_id": "run-6", "seq": 2, "event_kind": "e", "command_id": "cmd-6", "command_kind": "k", "payload": {}}]');
SELECT count(*) AS run_6_rows FROM outbox.events WHERE run_id = 'run-6';
SELECT * FROM outbox.commit_decisions('{"run_id": "run-6"}');
SELECT * FROM outbox.commit_decisions('[{"run_id": "run-6", "seq": 1, "event_kind": "e", "command_id": "cmd-6", "command_kind": "k"}]');
SELECT * FROM outbox.commit_decisions('[{"run_id": "run-6", "seq": 1, "event_kind": "e", "command_id": "cmd-6", "command_kind": "k", "payload": {}, "prio": 1}]');
SELECT * FROM outbox.commit_decisions('[{"run_id": "run-6", "seq": 1.5, "event_kind": "e", "command_id": "cmd-6", "command_kind": "k", "payload": {}}]');
SELECT * FROM outbox.commit_decisions('[{"run_id": "run-6", "seq": -1, "event_kind": "e", "command_id": "cmd-6", "command_kind": "k", "payload": {}}]');
SELECT * FROM outbox.commit_decisions('[{"run_id": "run-6", "seq": 1, "event_kind": "e", "command_id": "", "command_kind": "k", "payload": {}}]');
SELECT * FROM outbox.commit_decisions(NULL);
SELECT count(*) AS run_6_rows FROM outbox.events WHERE run_id = 'run-6';

-- A repeat is named by its positions (1-based), the earliest repeat of the
-- batch first, before anything is inserted: here the command id of the
-- fourth is also stored already, and the repeat is what is reported.
SELECT * FROM outbox.commit_decisions('[
  {"run_id": "run-7", "seq": 1, "event_kind": "e", "command_id": "cmd-7d", "command_kind": "k", "payload": {}},
  {"run_id": "run-7", "seq": 2, "event_kind": "e", "command_id": "cmd-7b", "command_kind": "k", "payload": {}},
  {"run_id": "run-7", "seq": 3, "event_kind": "e", "command_id": "cmd-1", "command_kind": "k", "payload": {}},
  {"run_id": "run-7", "seq": 4, "event_kind": "e", "command_id": "cmd-7b", "command_kind": "k", "payload": {}}]');
SELECT * FROM outbox.commit_decisions('[
  {"run_id": "run-7", "seq": 1, "event_kind": "e", "command_id": "c7a", "command_kind": "k", "payload": {}},
  {"run_id": "run-8", "seq": 1, "event_kind": "e", "command_id": "c7b", "command_kind": "k", "payload": {}},
  {"run_id": "run-7", "seq": 2, "event_kind": "e", "command_id": "c7c", "command_kind": "k", "payload": {}},
  {"run_id": "run-8", "seq": "1", "event_kind": "e", "command_id": "c7d", "command_kind": "k", "payload": {}},
  {"run_id": "run-7", "seq": 1, "event_kind": "e", "command_id": "c7e", "command_kind": "k", "payload": {}}]');
SELECT count(*) AS run_7_rows FROM outbox.events WHERE run_id IN ('run-7', 'run-8');

-- The single form's retry: the same decision by the same role is answered
-- false, without an error and without a second row; anything else that
-- reuses the id is a conflict (23505), whatever it differs in.
SELECT outbox.commit_decision('run-1', 1, 'trip_requested', 'cmd-1', 'lock_budget', '{"amount": 900}') AS retry;
SELECT outbox.commit_decision('run-1', 1, 'trip_requested', 'cmd-1', 'lock_budget', '{"amount": 901}') AS other_payload;
SELECT outbox.commit_decision('run-1', 1, 'trip_decided', 'cmd-1', 'lock_budget', '{"amount": 900}') AS other_event_kind;
SELECT outbox.commit_decision('run-1', 1, 'trip_requested', 'cmd-1', 'unlock', '{"amount": 900}') AS other_command_kind;
SELECT outbox.commit_decision('run-9', 1, 'trip_requested', 'cmd-1', 'lock_budget', '{"amount": 900}') AS other_run;
SELECT count(*) AS cmd_1_events FROM outbox.events WHERE command_id = 'cmd-1';

-- A taken key keeps its constraint's name: a client tells a taken command
-- id from a taken (run_id, seq) without reading the message.
CREATE FUNCTION pg_temp.taken(call text) RETURNS text LANGUAGE plpgsql AS $$
DECLARE st text; tab text; con text;
BEGIN
  EXECUTE call;
  RETURN 'recorded';
EXCEPTION WHEN unique_violation THEN
  GET STACKED DIAGNOSTICS st = RETURNED_SQLSTATE, tab = TABLE_NAME, con = CONSTRAINT_NAME;
  RETURN st || ' ' || tab || '.' || con;
END $$;
SELECT pg_temp.taken($$SELECT outbox.commit_decision('run-x', 1, 'e', 'cmd-1', 'k', '{}')$$) AS command_id,
       pg_temp.taken($$SELECT outbox.commit_decision('run-1', 1, 'e', 'cmd-x', 'k', '{}')$$) AS run_seq,
       pg_temp.taken($$SELECT outbox.record_event('run-1', 1, 'e')$$) AS event,
       pg_temp.taken($$SELECT outbox.commit_decisions('[{"run_id": "run-x", "seq": 1, "event_kind": "e",
                        "command_id": "cmd-1", "command_kind": "k", "payload": {}}]')$$) AS batch_command_id,
       pg_temp.taken($$SELECT outbox.commit_decisions('[{"run_id": "run-1", "seq": 1, "event_kind": "e",
                        "command_id": "cmd-x", "command_kind": "k", "payload": {}}]')$$) AS batch_run_seq;
-- A command whose row is gone (purged: only its event and tombstone stay)
-- is still taken, through the events' index of command ids.
BEGIN;
DELETE FROM outbox.commands WHERE command_id = 'cmd-2';
SELECT pg_temp.taken($$SELECT outbox.commit_decision('run-y', 1, 'e', 'cmd-2', 'k', '{}')$$) AS purged_command_id;
ROLLBACK;
-- A unique index that is not the extension's keeps its own error.
BEGIN;
CREATE UNIQUE INDEX commands_one_kind_idx ON outbox.commands (kind) WHERE kind = 'only-one';
SELECT outbox.commit_decision('run-z', 1, 'e', 'cmd-z1', 'only-one', '{}');
\set VERBOSITY terse
SELECT outbox.commit_decision('run-z', 2, 'e', 'cmd-z2', 'only-one', '{}');
\set VERBOSITY default
ROLLBACK;
SELECT count(*) AS run_x_y_z_rows FROM outbox.events WHERE run_id IN ('run-x', 'run-y', 'run-z');

-- Bad input: every argument, a clear error, nothing changed.
SELECT outbox.commit_decision(NULL, 1, 'e', 'c', 'k', '{}');
SELECT outbox.commit_decision('r', NULL, 'e', 'c', 'k', '{}');
SELECT outbox.commit_decision('r', 1, NULL, 'c', 'k', '{}');
SELECT outbox.commit_decision('r', 1, 'e', NULL, 'k', '{}');
SELECT outbox.commit_decision('r', 1, 'e', 'c', NULL, '{}');
SELECT outbox.commit_decision('r', 1, 'e', 'c', 'k', NULL);
SELECT outbox.commit_decision('r', 1, 'e', 'c', 'k', '{}', priority => NULL);
SELECT outbox.commit_decision('', 1, 'e', 'c', 'k', '{}');
SELECT outbox.commit_decision('r', 1, 'e', '', 'k', '{}');
SELECT outbox.commit_decision('r', 1, '', 'c', 'k', '{}');
SELECT outbox.commit_decision('r', 1, 'e', 'c', '', '{}');
SELECT outbox.commit_decision('r', -1, 'e', 'c', 'k', '{}');
SELECT outbox.commit_decision(repeat('r', 201), 1, 'e', 'c', 'k', '{}');
SELECT outbox.commit_decision('r', 1, 'e', repeat('c', 201), 'k', '{}');
-- 200 bytes is the limit: multibyte characters count in bytes.
SELECT outbox.commit_decision('r', 1, 'e', repeat('é', 101), 'k', '{}');
SET outbox.max_payload_bytes = 1024;
SELECT outbox.commit_decision('r', 1, 'e', 'c', 'k', jsonb_build_object('x', repeat('x', 2000)));
SELECT outbox.commit_decision('r', 1, 'e', 'c', 'k', '{}', event_payload => jsonb_build_object('x', repeat('x', 2000)));
RESET outbox.max_payload_bytes;
SELECT outbox.commit_decision('r', 1, 'e', 'c', 'k', (repeat('[', 65) || repeat(']', 65))::jsonb);
-- 64 levels are fine.
SELECT outbox.commit_decision('r-deep', 1, 'e', 'c-deep', 'k', (repeat('[', 64) || repeat(']', 64))::jsonb);
SELECT outbox.record_event(NULL, 1, 'k');
SELECT outbox.record_event('r', NULL, 'k');
SELECT outbox.record_event('r', 1, NULL);
SELECT outbox.record_event('r', -5, 'k');
SELECT count(*) AS events_of_r FROM outbox.events WHERE run_id = 'r';
SELECT count(*) AS commands_c FROM outbox.commands WHERE command_id = 'c';
-- Scalars, arrays and odd Unicode are accepted payloads and identifiers.
SELECT outbox.commit_decision('rün-✓', 1, 'é', 'cmd-☃', 'k', '"just a string"');
SELECT command_id, payload FROM outbox.commands WHERE run_id = 'rün-✓';
-- Caller identity: the API is SECURITY INVOKER and runs its body as the
-- owner.  A role holding only the group role decides (no table privilege
-- needed), and it is itself again after the call, after a failed one too.
CREATE ROLE regress_producer;
DO $$ BEGIN EXECUTE format('GRANT %I TO regress_producer', outbox.role('producer')); END $$;
SET ROLE regress_producer;
SELECT outbox.commit_decision('r-caller', 1, 'e', 'c-caller', 'k', '{}');
SELECT current_user;
BEGIN;
SAVEPOINT s;
SELECT outbox.commit_decision('r-caller', 1, 'e', 'c-caller', 'k', '{}');
ROLLBACK TO SAVEPOINT s;
SELECT current_user;
COMMIT;
SELECT outbox.commit_decision('r-caller', 2, 'e', 'c-caller', 'k', '{}');
SELECT current_user;
SELECT count(*) FROM outbox.commands;
RESET ROLE;
SELECT count(*) AS commands_of_caller FROM outbox.commands WHERE run_id = 'r-caller';
DROP ROLE regress_producer;
-- Headers: a JSON object of strings, stored with the command and handed out
-- by claim.  Bad ones are refused (22023 shape, 54000 limits) and change
-- nothing.
\set VERBOSITY default
SELECT outbox.commit_decision('r-h', 1, 'e', 'c-h1', 'k-h', '{}', headers => '{"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", "content-type": "application/json"}');
SELECT outbox.commit_decision('r-h', 2, 'e', 'c-h2', 'k-h', '{}');
SELECT command_id, headers FROM outbox.commands WHERE run_id = 'r-h' ORDER BY seq;
-- A retry with other headers is the same decision; the stored ones stay.
SELECT outbox.commit_decision('r-h', 1, 'e', 'c-h1', 'k-h', '{}', headers => '{"traceparent": "other"}');
SELECT headers->>'traceparent' AS kept FROM outbox.commands WHERE command_id = 'c-h1';
SELECT outbox.commit_decision('r-h', 3, 'e', 'c-h3', 'k-h', '{}', headers => '[]');
SELECT outbox.commit_decision('r-h', 3, 'e', 'c-h3', 'k-h', '{}', headers => '"x"');
SELECT outbox.commit_decision('r-h', 3, 'e', 'c-h3', 'k-h', '{}', headers => '{"n": 1}');
SELECT outbox.commit_decision('r-h', 3, 'e', 'c-h3', 'k-h', '{}', headers => '{"a b": "x"}');
SELECT outbox.commit_decision('r-h', 3, 'e', 'c-h3', 'k-h', '{}', headers => '{"": "x"}');
SELECT outbox.commit_decision('r-h', 3, 'e', 'c-h3', 'k-h', '{}', headers => '{"x-a": "line\r\nInjected: 1"}');
SELECT outbox.commit_decision('r-h', 3, 'e', 'c-h3', 'k-h', '{}', headers => '{"Host": "evil"}');
SELECT outbox.commit_decision('r-h', 3, 'e', 'c-h3', 'k-h', '{}', headers => '{"transfer-encoding": "chunked"}');
SELECT outbox.commit_decision('r-h', 3, 'e', 'c-h3', 'k-h', '{}', headers => '{"X-Id": "1", "x-id": "2"}');
SELECT outbox.commit_decision('r-h', 3, 'e', 'c-h3', 'k-h', '{}', headers => ('{"' || repeat('n', 65) || '": "x"}')::jsonb);
SELECT outbox.commit_decision('r-h', 3, 'e', 'c-h3', 'k-h', '{}',
	headers => (SELECT jsonb_object_agg('h' || i, 'v') FROM generate_series(1, 33) i));
SELECT outbox.commit_decision('r-h', 3, 'e', 'c-h3', 'k-h', '{}', headers => jsonb_build_object('big', repeat('v', 4094)));
-- At the limits: 32 headers, 4096 bytes of names and values.
SELECT outbox.commit_decision('r-h', 3, 'e', 'c-h3', 'k-h', '{}',
	headers => (SELECT jsonb_object_agg('h' || i, 'v') FROM generate_series(1, 32) i));
SELECT outbox.commit_decision('r-h', 4, 'e', 'c-h4', 'k-h', '{}', headers => jsonb_build_object('big', repeat('v', 4093)));
SELECT outbox.commit_decision('r-h', 5, 'e', 'c-h5', 'k-h', '{}', headers => 'null');
SELECT command_id, jsonb_typeof(headers) AS headers FROM outbox.commands WHERE run_id = 'r-h' ORDER BY seq;
-- The batch form: key "headers", checked per decision, all or none.
SELECT * FROM outbox.commit_decisions('[{"run_id": "r-hb", "seq": 1, "event_kind": "e", "command_id": "c-hb1", "command_kind": "k-h", "payload": {}, "headers": {"x-correlation-id": "abc"}},
	{"run_id": "r-hb", "seq": 2, "event_kind": "e", "command_id": "c-hb2", "command_kind": "k-h", "payload": {}, "headers": {"Connection": "close"}}]');
SELECT * FROM outbox.commit_decisions('[{"run_id": "r-hb", "seq": 1, "event_kind": "e", "command_id": "c-hb1", "command_kind": "k-h", "payload": {}, "headers": {"x-correlation-id": "abc"}},
	{"run_id": "r-hb", "seq": 2, "event_kind": "e", "command_id": "c-hb2", "command_kind": "k-h", "payload": {}, "headers": "x"}]');
SELECT count(*) AS batch_commands FROM outbox.commands WHERE run_id = 'r-hb';
SELECT * FROM outbox.commit_decisions('[{"run_id": "r-hb", "seq": 1, "event_kind": "e", "command_id": "c-hb1", "command_kind": "k-h", "payload": {}, "headers": {"x-correlation-id": "abc"}},
	{"run_id": "r-hb", "seq": 2, "event_kind": "e", "command_id": "c-hb2", "command_kind": "k-h", "payload": {}, "headers": null},
	{"run_id": "r-hb", "seq": 3, "event_kind": "e", "command_id": "c-hb3", "command_kind": "k-h", "payload": {}}]');
SELECT command_id, headers FROM outbox.commands WHERE run_id = 'r-hb' ORDER BY seq;
-- claim returns them as its last field.
SELECT command_id, jsonb_typeof(headers) AS headers, headers->>'traceparent' AS traceparent,
       headers->>'x-correlation-id' AS correlation FROM outbox.claim('w-h', 10, kinds => '{k-h}') ORDER BY command_id;

-- The common decision is written without SQL statements (docs/internals.md);
-- a table with a trigger (a superuser's) takes the statements, and the
-- trigger fires.  Both write the same rows: the same defaults, the same
-- times (one transaction), the same decider.
BEGIN;
CREATE TABLE public.seen_rows (tab text, command_id text);
CREATE FUNCTION public.note_row() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN INSERT INTO public.seen_rows VALUES (TG_TABLE_NAME, NEW.command_id); RETURN NEW; END $$;
CREATE TRIGGER note_event AFTER INSERT ON outbox.events FOR EACH ROW EXECUTE FUNCTION public.note_row();
SELECT outbox.commit_decision('r-w1', 1, 'e', 'c-w1', 'k-w', '{"n": 1}', event_payload => '{"e": 1}',
       priority => 3, headers => '{"x-a": "b"}');
SELECT * FROM outbox.commit_decisions('[{"run_id": "r-w2", "seq": 1, "event_kind": "e", "command_id": "c-w2",
       "command_kind": "k-w", "payload": {"n": 1}, "event_payload": {"e": 1}, "priority": 3, "headers": {"x-a": "b"}}]');
DROP TRIGGER note_event ON outbox.events;
SELECT outbox.commit_decision('r-w3', 1, 'e', 'c-w3', 'k-w', '{"n": 1}', event_payload => '{"e": 1}',
       priority => 3, headers => '{"x-a": "b"}');
SELECT * FROM outbox.commit_decisions('[{"run_id": "r-w4", "seq": 1, "event_kind": "e", "command_id": "c-w4",
       "command_kind": "k-w", "payload": {"n": 1}, "event_payload": {"e": 1}, "priority": 3, "headers": {"x-a": "b"}}]');
SELECT * FROM public.seen_rows ORDER BY command_id;
SELECT count(*) AS commands, count(DISTINCT to_jsonb(c) - '{command_id,run_id}'::text[]) AS distinct_rows,
       bool_and(c.created_at = now() AND c.available_at = now() AND c.due_at = now()) AS times_now,
       bool_and(c.decided_by = current_user::regrole) AS decided_by_caller
  FROM outbox.commands c WHERE c.kind = 'k-w';
SELECT count(*) AS events, count(DISTINCT to_jsonb(e) - '{command_id,run_id}'::text[]) AS distinct_rows
  FROM outbox.events e WHERE e.run_id LIKE 'r-w_';
-- A retry is answered false on either path; a conflict names its constraint.
SELECT outbox.commit_decision('r-w3', 1, 'e', 'c-w3', 'k-w', '{"n": 1}') AS retry;
SELECT * FROM outbox.commit_decisions('[{"run_id": "r-w4", "seq": 1, "event_kind": "e", "command_id": "c-w4",
       "command_kind": "k-w", "payload": {"n": 1}}]');
SELECT pg_temp.taken($$SELECT outbox.commit_decision('r-w3', 2, 'e', 'c-w3', 'k-w', '{}')$$) AS command_id,
       pg_temp.taken($$SELECT outbox.commit_decision('r-w3', 1, 'e', 'c-w5', 'k-w', '{}')$$) AS run_seq;
ROLLBACK;
-- A column a superuser made NOT NULL is enforced on the direct path too
-- (23502, as the statement would refuse it), and nothing is written.
BEGIN;
DELETE FROM outbox.events WHERE payload IS NULL;
ALTER TABLE outbox.events ALTER COLUMN payload SET NOT NULL;
SELECT outbox.commit_decision('r-nn', 1, 'e', 'c-nn', 'k-w', '{"n": 1}');
ROLLBACK;
SELECT count(*) AS written FROM outbox.commands WHERE command_id = 'c-nn';
-- A column a superuser gave another type takes the statements, which
-- convert the value (the direct writer would store the jsonb as it is).
BEGIN;
ALTER TABLE outbox.commands ALTER COLUMN headers TYPE json USING headers::json;
SELECT outbox.commit_decision('r-ty', 1, 'e', 'c-ty', 'k-w', '{"n": 1}', headers => '{"x-a": "b"}');
SELECT * FROM outbox.commit_decisions('[{"run_id": "r-ty2", "seq": 1, "event_kind": "e", "command_id": "c-ty2",
       "command_kind": "k-w", "payload": {"n": 1}, "headers": {"x-a": "c"}}]');
SELECT command_id, headers::text AS headers FROM outbox.commands WHERE run_id LIKE 'r-ty%' ORDER BY command_id;
ROLLBACK;
-- A CHECK constraint that is not events_seq_check (here in its place)
-- sends the call to the statements, which check it (23514).
BEGIN;
ALTER TABLE outbox.events DROP CONSTRAINT events_seq_check;
ALTER TABLE outbox.events ADD CONSTRAINT events_kind_check CHECK (kind <> 'forbidden');
\set VERBOSITY terse
SELECT outbox.commit_decision('r-ck', 1, 'forbidden', 'c-ck', 'k-w', '{"n": 1}');
\set VERBOSITY default
ROLLBACK;
SELECT count(*) AS written FROM outbox.commands WHERE command_id = 'c-ck';
-- One decision twice in one statement: the second call is the first's
-- retry (false), on every path (the direct writer, an ordering key, a
-- stream, the batch), and nothing is written twice; another decision under
-- the same id in the same statement is a conflict (23505).
BEGIN;
SELECT outbox.create_stream('s-twice');
SELECT outbox.set_policy('k-twice-s', stream => 's-twice');
SELECT outbox.commit_decision('r-tw1', 1, 'e', 'c-tw1', 'k-w', '{"n": 1}') AS first,
       outbox.commit_decision('r-tw1', 1, 'e', 'c-tw1', 'k-w', '{"n": 1}') AS again;
SELECT outbox.commit_decision('r-tw2', 1, 'e', 'c-tw2', 'k-w', '{"n": 1}', ordering_key => 'key-tw') AS first,
       outbox.commit_decision('r-tw2', 1, 'e', 'c-tw2', 'k-w', '{"n": 1}', ordering_key => 'key-tw') AS again;
SELECT outbox.commit_decision('r-tw3', 1, 'e', 'c-tw3', 'k-twice-s', '{"n": 1}') AS first,
       outbox.commit_decision('r-tw3', 1, 'e', 'c-tw3', 'k-twice-s', '{"n": 1}') AS again;
SELECT a.recorded AS first, b.recorded AS again
  FROM outbox.commit_decisions('[{"run_id": "r-tw4", "seq": 1, "event_kind": "e", "command_id": "c-tw4",
                                  "command_kind": "k-w", "payload": {"n": 1}}]') a,
       outbox.commit_decisions('[{"run_id": "r-tw4", "seq": 1, "event_kind": "e", "command_id": "c-tw4",
                                  "command_kind": "k-w", "payload": {"n": 1}}]') b;
SELECT a.recorded AS first, b.recorded AS again
  FROM outbox.commit_decisions('[{"run_id": "r-tw5", "seq": 1, "event_kind": "e", "command_id": "c-tw5",
                                  "command_kind": "k-twice-s", "payload": {"n": 1}}]') a,
       outbox.commit_decisions('[{"run_id": "r-tw5", "seq": 1, "event_kind": "e", "command_id": "c-tw5",
                                  "command_kind": "k-twice-s", "payload": {"n": 1}}]') b;
SELECT (SELECT count(*) FROM outbox.commands WHERE run_id LIKE 'r-tw%') AS commands,
       (SELECT count(*) FROM outbox._stream_log WHERE run_id LIKE 'r-tw%') AS stream_log,
       (SELECT count(*) FROM outbox.events WHERE run_id LIKE 'r-tw%') AS events;
\set VERBOSITY terse
SELECT outbox.commit_decision('r-tw6', 1, 'e', 'c-tw6', 'k-w', '{"n": 1}'),
       outbox.commit_decision('r-tw6', 2, 'e', 'c-tw6', 'k-w', '{"n": 1}');
\set VERBOSITY default
ROLLBACK;

-- A decision may also be a JSON array of its values, in the order of
-- commit_decision's parameters (run_id, seq, event_kind, command_id,
-- command_kind, payload, then optionally event_payload, not_before,
-- priority, headers, ordering_key); the forms mix within one call.
SELECT * FROM outbox.commit_decisions('[
  ["run-a1", 1, "e", "cmd-a1", "k", {"n": 1}],
  ["run-a1", "2", "e", "cmd-a2", "k", {"n": 2}, {"why": 2}, null, 3],
  {"run_id": "run-a1", "seq": 3, "event_kind": "e", "command_id": "cmd-a3", "command_kind": "k", "payload": {"n": 3}}]');
SELECT command_id, seq, kind, payload, priority, headers FROM outbox.commands
 WHERE run_id = 'run-a1' ORDER BY command_id;
SELECT seq, payload FROM outbox.events WHERE run_id = 'run-a1' ORDER BY seq;
-- a retry answers false; another decision holding an id is a conflict;
-- a repeat within the batch is named by its positions
SELECT * FROM outbox.commit_decisions('[["run-a1", 1, "e", "cmd-a1", "k", {"n": 1}], ["run-a1", 4, "e", "cmd-a4", "k", {}]]');
SELECT * FROM outbox.commit_decisions('[["run-a2", 1, "e", "cmd-a1", "k", {}]]');
SELECT * FROM outbox.commit_decisions('[["run-a3", 1, "e", "cmd-a5", "k", {}], ["run-a3", 2, "e", "cmd-a5", "k", {}]]');
-- too few or too many values, a value of the wrong type, a NULL where a
-- value is required, an element that is neither form: 22023 / 22004
SELECT * FROM outbox.commit_decisions('[["run-a3", 1, "e", "cmd-a6", "k"]]');
SELECT * FROM outbox.commit_decisions('[["run-a3", 1, "e", "cmd-a6", "k", {}, null, null, 0, null, "key", 1]]');
SELECT * FROM outbox.commit_decisions('[["run-a3", 1, "e", "cmd-a6", 7, {}]]');
SELECT * FROM outbox.commit_decisions('[["run-a3", 1.5, "e", "cmd-a6", "k", {}]]');
SELECT * FROM outbox.commit_decisions('[["run-a3", null, "e", "cmd-a6", "k", {}]]');
SELECT * FROM outbox.commit_decisions('[["run-a3", 1, "e", "cmd-a6", "k", {}], 5]');
SELECT count(*) AS run_a3_rows FROM outbox.events WHERE run_id = 'run-a3';
-- headers and an ordering key by position (the keyed statements)
SELECT * FROM outbox.commit_decisions('[["run-a4", 1, "e", "cmd-a7", "k", {}, null, null, null, {"x-a": "b"}, "key-a"]]');
SELECT command_id, ordering_key, ordering_seq, headers FROM outbox.commands WHERE run_id = 'run-a4';
-- The batch's direct writer enforces a NOT NULL a superuser added too
-- (23502), before it inserts anything.
BEGIN;
DELETE FROM outbox.events WHERE payload IS NULL;
ALTER TABLE outbox.events ALTER COLUMN payload SET NOT NULL;
SELECT * FROM outbox.commit_decisions('[["r-nnb", 1, "e", "c-nnb1", "k-w", {}, {"n": 1}], ["r-nnb", 2, "e", "c-nnb2", "k-w", {}]]');
ROLLBACK;
SELECT count(*) AS written FROM outbox.commands WHERE run_id = 'r-nnb';
