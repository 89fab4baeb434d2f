-- Load :n commands in every state, as the table owner, consistently with
-- what the API would have written (the conservation views must stay empty),
-- plus :n / 10 purged commands (events with a tombstone and no command).
--
-- Per 100 commands: 10 pending, 5 sending, 70 published with a receipt,
-- 10 published recently without a receipt, 4 dead, 1 uncertain.

\set ON_ERROR_STOP on

INSERT INTO outbox.events (run_id, seq, kind, command_id, created_at)
SELECT 'run-' || (i / 100), i % 100, 'decided', 'cmd-' || i, now() - interval '3 hours'
  FROM generate_series(1, :n) AS i;

INSERT INTO outbox.commands (command_id, run_id, seq, kind, status, version, deliveries,
							 priority, available_at, due_at, lease_until, owner, created_at,
							 published_at, last_error, payload)
SELECT 'cmd-' || i, 'run-' || (i / 100), i % 100, 'kind-' || (i % 7), s.status,
	   CASE s.status WHEN 'pending' THEN 1 WHEN 'sending' THEN 2 WHEN 'published' THEN 3
					 ELSE 21 END,
	   CASE s.status WHEN 'pending' THEN 0 WHEN 'sending' THEN 1 WHEN 'published' THEN 1
					 ELSE 10 END,
	   0, s.avail,
	   CASE WHEN s.status = 'pending' THEN s.avail END,
	   CASE WHEN s.status = 'sending' THEN now() + interval '1 hour' END,
	   CASE WHEN s.status <> 'pending' THEN 'worker-' || (i % 4) END,
	   now() - interval '3 hours',
	   CASE WHEN s.status = 'published' THEN s.pub END,
	   CASE WHEN s.status IN ('dead', 'uncertain') THEN 'HTTP 500' END,
	   jsonb_build_object('n', i)
  FROM generate_series(1, :n) AS i,
	   LATERAL (SELECT CASE WHEN i % 100 < 10 THEN 'pending'
							WHEN i % 100 < 15 THEN 'sending'
							WHEN i % 100 < 95 THEN 'published'
							WHEN i % 100 < 99 THEN 'dead'
							ELSE 'uncertain' END AS status,
					   now() - interval '2 hours' - (i % 1000) * interval '1 second' AS avail,
					   CASE WHEN i % 100 < 85 THEN now() - interval '90 minutes'
							ELSE now() - interval '1 minute' END AS pub) AS s;

INSERT INTO outbox.receipts (command_id, outcome, completed_at, run_id)
SELECT 'cmd-' || i, 'done', now() - interval '80 minutes', 'run-' || (i / 100)
  FROM generate_series(1, :n) AS i
 WHERE i % 100 >= 15 AND i % 100 < 85;

INSERT INTO outbox.events (run_id, seq, kind, command_id, created_at)
SELECT 'old-' || (i / 100), i % 100, 'decided', 'old-' || i, now() - interval '30 days'
  FROM generate_series(1, :n / 10) AS i;

INSERT INTO outbox.purged (command_id, run_id, seq, kind, published_at, outcome, purged_at)
SELECT 'old-' || i, 'old-' || (i / 100), i % 100, 'kind-' || (i % 7),
	   now() - interval '29 days', 'done', now() - interval '1 day'
  FROM generate_series(1, :n / 10) AS i;

VACUUM ANALYZE outbox.events;
VACUUM ANALYZE outbox.commands;
VACUUM ANALYZE outbox.receipts;
VACUUM ANALYZE outbox.purged;
