-- Load :n commands the way a steady outbox holds them, as the table owner,
-- consistently with what the API would have written (the conservation
-- views stay empty): the published history first (with receipts), the
-- unfinished commands last, as they are the newest.
--
-- Per 1,000 commands: 985 published with a receipt, 9 pending ready,
-- 1 pending delayed, 1.8 sending (0.2 of them with an expired lease),
-- 2.5 dead, 0.5 uncertain.

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
	   CASE WHEN s.status = 'sending' THEN
			CASE WHEN s.r < 995200 THEN now() - interval '1 minute' ELSE now() + interval '1 hour' END END,
	   CASE WHEN s.status <> 'pending' THEN 'worker-' || (i % 4) END,
	   now() - interval '3 hours',
	   CASE WHEN s.status = 'published' THEN now() - interval '90 minutes' END,
	   CASE WHEN s.status IN ('dead', 'uncertain') THEN 'HTTP 500' END,
	   jsonb_build_object('n', i)
  FROM generate_series(1, :n) AS i,
	   LATERAL (SELECT (i::int8 * 1000000 / :n) AS r) AS q,
	   LATERAL (SELECT q.r,
					   CASE WHEN q.r < 985000 THEN 'published'
							WHEN q.r < 995000 THEN 'pending'
							WHEN q.r < 996800 THEN 'sending'
							WHEN q.r < 999500 THEN 'dead'
							ELSE 'uncertain' END AS status,
					   CASE WHEN q.r >= 994000 AND q.r < 995000 THEN now() + interval '1 hour'
							ELSE now() - interval '2 hours' + (i % 1000) * interval '1 second' END AS avail) AS s;

INSERT INTO outbox.receipts (command_id, outcome, completed_at, run_id)
SELECT 'cmd-' || i, 'done', now() - interval '80 minutes', 'run-' || (i / 100)
  FROM generate_series(1, :n) AS i
 WHERE (i::int8 * 1000000 / :n) < 985000;

VACUUM ANALYZE outbox.events;
VACUUM ANALYZE outbox.commands;
VACUUM ANALYZE outbox.receipts;
