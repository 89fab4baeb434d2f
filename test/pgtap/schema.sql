-- Schema and constraints of the outbox extension.
BEGIN;
SELECT plan(66);

SELECT has_schema('outbox');
SELECT tables_are('outbox', ARRAY['events', 'commands', 'receipts', 'inbox', 'policies', 'purged', 'consumers', 'check_results', 'lease_key',
	'streams', 'subscriptions', 'stream_ticks', 'stream_log_0', 'stream_log_1', 'stream_log_2', 'stream_kept',
	'stream_receipts_0', 'stream_receipts_1', 'stream_receipts_2',
	'stream_purged', 'stream_rotation', 'stream_progress', 'stream_failures']);

-- events
SELECT columns_are('outbox', 'events', ARRAY['run_id', 'seq', 'kind', 'payload', 'command_id', 'created_at']);
SELECT col_is_pk('outbox', 'events', ARRAY['run_id', 'seq'], 'col_is_pk outbox, events, ARRAY[run_id, seq]');
SELECT col_type_is('outbox', 'events', 'payload', 'jsonb', 'col_type_is outbox, events, payload, jsonb');
SELECT col_not_null('outbox', 'events', 'kind', 'col_not_null outbox, events, kind');
SELECT index_is_unique('outbox', 'events', 'events_command_id_key');
SELECT col_has_check('outbox', 'events', 'seq', 'col_has_check outbox, events, seq');

-- commands
SELECT columns_are('outbox', 'commands', ARRAY['command_id', 'run_id', 'seq', 'kind', 'status', 'version',
	'deliveries', 'priority', 'available_at', 'due_at', 'lease_until', 'owner', 'created_at',
	'published_at', 'last_error', 'payload', 'decided_by', 'headers', 'ordering_key', 'ordering_seq',
	'ordering_tail']);
SELECT col_type_is('outbox', 'commands', 'headers', 'jsonb', 'the producer''s headers are jsonb');
-- No view (pg_monitor reads them all) shows or reads the producer's headers
-- (but the internal _stream_log, which nobody but the owner reads).
SELECT is((SELECT pg_catalog.count(*) FROM pg_catalog.pg_views
			WHERE schemaname = 'outbox' AND definition ~ 'headers' AND viewname <> '_stream_log'), 0::bigint,
	'no view of outbox reads commands.headers');
SELECT col_type_is('outbox', 'lease_key', 'key', 'bytea', 'the lease key is a bytea');
SELECT col_has_check('outbox', 'lease_key', 'key', 'the lease key is 16 bytes long');
SELECT col_is_pk('outbox', 'commands', 'command_id', 'col_is_pk outbox, commands, command_id');
SELECT col_type_is('outbox', 'commands', 'payload', 'jsonb', 'col_type_is outbox, commands, payload, jsonb');
SELECT col_type_is('outbox', 'commands', 'version', 'outbox', 'command_version', 'version is of the domain command_version');
SELECT domain_type_is('outbox', 'command_version', 'bigint', 'command_version is a bigint');
SELECT col_type_is('outbox', 'commands', 'deliveries', 'outbox', 'command_deliveries', 'deliveries is of the domain command_deliveries');
SELECT domain_type_is('outbox', 'command_deliveries', 'integer', 'command_deliveries is an integer');
SELECT domain_type_is('outbox', 'command_status', 'text', 'command_status is a text');
SELECT col_not_null('outbox', 'commands', 'status', 'col_not_null outbox, commands, status');
SELECT col_not_null('outbox', 'commands', 'payload', 'col_not_null outbox, commands, payload');
SELECT col_has_default('outbox', 'commands', 'status', 'col_has_default outbox, commands, status');
SELECT col_default_is('outbox', 'commands', 'status', 'pending'::text, 'new commands are pending');
SELECT col_type_is('outbox', 'commands', 'status', 'outbox', 'command_status', 'status is of the domain command_status');
SELECT indexes_are('outbox', 'commands', ARRAY['commands_pkey', 'commands_claim_idx', 'commands_lease_idx', 'commands_held_idx', 'commands_key_idx']);
SELECT is_indexed('outbox', 'commands', ARRAY['priority', 'due_at', 'created_at', 'kind'], 'claim index by priority and availability (and kind, for the metrics)');
SELECT is_indexed('outbox', 'commands', ARRAY['lease_until', 'kind'], 'lease index for takeovers (and kind, for the metrics)');
SELECT is((SELECT pg_get_expr(indpred, indrelid) FROM pg_index WHERE indexrelid = 'outbox.commands_claim_idx'::regclass),
	'(due_at IS NOT NULL)', 'claim index holds claimable rows only');
SELECT is((SELECT pg_get_expr(indpred, indrelid) FROM pg_index WHERE indexrelid = 'outbox.commands_lease_idx'::regclass),
	'((status)::text = ''sending''::text)', 'lease index holds sending rows only');
SELECT is((SELECT pg_get_expr(indpred, indrelid) FROM pg_index WHERE indexrelid = 'outbox.commands_held_idx'::regclass),
	'(((status)::text = ANY (ARRAY[''dead''::text, ''uncertain''::text])) OR (((status)::text = ''pending''::text) AND (due_at IS NULL)))',
	'held index holds the dead, uncertain and waiting commands only');
SELECT is((SELECT array_agg(pg_get_indexdef(indexrelid) ORDER BY indexrelid::regclass::text) FROM pg_index
			WHERE indexrelid IN ('outbox.commands_claim_idx'::regclass, 'outbox.commands_lease_idx'::regclass)),
	ARRAY['CREATE INDEX commands_claim_idx ON outbox.commands USING btree (priority DESC, due_at, created_at) INCLUDE (kind) WHERE (due_at IS NOT NULL)',
		  'CREATE INDEX commands_lease_idx ON outbox.commands USING btree (lease_until) INCLUDE (kind) WHERE ((status)::text = ''sending''::text)'],
	'both claim indexes carry kind as a non-key column (claim order unchanged), for the metrics');
SELECT is((SELECT pg_get_expr(indpred, indrelid) FROM pg_index WHERE indexrelid = 'outbox.commands_key_idx'::regclass),
	'((ordering_key IS NOT NULL) AND (ordering_tail OR (((status)::text = ''pending''::text) AND (due_at IS NULL)) OR (((status)::text <> ''pending''::text) AND ((status)::text <> ''sending''::text))))',
	'key index holds the commands with an ordering key that wait, are published, dead or uncertain, or are marked as their key''s last head');
SELECT ok((SELECT reloptions @> ARRAY['fillfactor=80'] FROM pg_class WHERE oid = 'outbox.commands'::regclass),
	'commands leaves room for new row versions');

-- receipts, inbox, policies, purged
SELECT indexes_are('outbox', 'policies', ARRAY['policies_pkey', 'policies_paused_idx', 'policies_claimers_idx', 'policies_deciders_idx', 'policies_stream_idx'],
	'policies: the key, and the paused and restricted kinds every claim reads');
SELECT col_is_pk('outbox', 'receipts', 'command_id', 'col_is_pk outbox, receipts, command_id');
SELECT col_not_null('outbox', 'receipts', 'outcome', 'col_not_null outbox, receipts, outcome');
SELECT col_is_pk('outbox', 'inbox', ARRAY['consumer', 'command_id'], 'col_is_pk outbox, inbox, ARRAY[consumer, command_id]');
SELECT col_is_pk('outbox', 'policies', 'kind', 'col_is_pk outbox, policies, kind');
SELECT col_has_check('outbox', 'policies', 'takeover', 'col_has_check outbox, policies, takeover');
SELECT col_is_pk('outbox', 'purged', 'command_id', 'col_is_pk outbox, purged, command_id');
SELECT columns_are('outbox', 'policies', ARRAY['kind', 'max_deliveries', 'backoff_base', 'backoff_max', 'lease',
	'takeover', 'paused', 'retention', 'deciders', 'claimers', 'completers', 'ordered_by_run', 'stream']);
SELECT col_is_pk('outbox', 'consumers', 'consumer', 'col_is_pk outbox, consumers, consumer');

-- constraints really hold (as the owner, bypassing the API)
SELECT throws_ok($$INSERT INTO outbox.commands (command_id, run_id, seq, kind, status, available_at, payload)
	VALUES ('x', 'r', 1, 'k', 'lost', now(), '{}')$$, '23514', NULL, 'status must be one of the five states');
INSERT INTO outbox.commands (command_id, run_id, seq, kind, available_at, payload)
	VALUES ('pt-valid', 'r', 1, 'k', now(), '{}');
SELECT throws_ok($$UPDATE outbox.commands SET status = 'lost' WHERE command_id = 'pt-valid'$$,
	'23514', NULL, 'no update makes a status outside the five states');
DELETE FROM outbox.commands WHERE command_id = 'pt-valid';
SELECT throws_ok($$INSERT INTO outbox.commands (command_id, run_id, seq, kind, version, available_at, payload)
	VALUES ('x', 'r', 1, 'k', 0, now(), '{}')$$, '23514', NULL, 'version starts at 1');
SELECT throws_ok($$INSERT INTO outbox.commands (command_id, run_id, seq, kind, deliveries, available_at, payload)
	VALUES ('x', 'r', 1, 'k', -1, now(), '{}')$$, '23514', NULL, 'deliveries are not negative');
SELECT throws_ok($$INSERT INTO outbox.events (run_id, seq, kind) VALUES ('r', -1, 'k')$$, '23514', NULL,
	'seq is not negative');
SELECT throws_ok($$INSERT INTO outbox.policies (kind, takeover) VALUES ('k', 'never')$$, '23514', NULL,
	'takeover is auto or manual');
SELECT throws_ok($$INSERT INTO outbox.policies (kind, max_deliveries) VALUES ('k', 0)$$, '23514', NULL,
	'max_deliveries is at least 1');
SELECT lives_ok($$SELECT outbox.commit_decision('pgtap-run', 1, 'e', 'pgtap-cmd', 'k', '{}')$$, 'a decision goes in');
SELECT throws_ok($$INSERT INTO outbox.events (run_id, seq, kind, command_id) VALUES ('pgtap-run', 2, 'e', 'pgtap-cmd')$$,
	'23505', NULL, 'a command id is decided by one event only');

-- every data table is dumped with the extension
SELECT set_eq($$SELECT unnest(extconfig)::regclass::text FROM pg_extension WHERE extname = 'outbox'$$,
	ARRAY['outbox.events', 'outbox.commands', 'outbox.receipts', 'outbox.inbox', 'outbox.policies', 'outbox.purged',
		  'outbox.consumers', 'outbox.streams', 'outbox.subscriptions', 'outbox.stream_ticks',
		  'outbox.stream_log_id_seq', 'outbox.stream_log_0', 'outbox.stream_log_1', 'outbox.stream_log_2',
		  'outbox.stream_kept', 'outbox.stream_receipts_0', 'outbox.stream_receipts_1', 'outbox.stream_receipts_2',
		  'outbox.stream_purged', 'outbox.stream_progress', 'outbox.stream_failures'],
	'every data table is registered with pg_extension_config_dump');

-- streams: the log is written once, with two indexes per table and no
-- unique one (command ids stay unique through events_command_id_key)
SELECT is((SELECT pg_catalog.array_agg(c.relname || ':' || (SELECT count(*) FROM pg_index i WHERE i.indrelid = c.oid)
		|| ':' || (SELECT count(*) FROM pg_index i WHERE i.indrelid = c.oid AND i.indisunique) ORDER BY c.relname)
	FROM pg_class c WHERE c.relnamespace = 'outbox'::regnamespace AND c.relname ~ '^stream_(log_[012]|kept)$'),
	ARRAY['stream_kept:2:0', 'stream_log_0:2:0', 'stream_log_1:2:0', 'stream_log_2:2:0'],
	'each stream log table has two indexes, none unique');
-- the receipts of each log table: keyed by command_id, as outbox.receipts
SELECT is((SELECT pg_catalog.array_agg(c.relname || ':' || (SELECT count(*) FROM pg_index i WHERE i.indrelid = c.oid AND i.indisprimary)
	ORDER BY c.relname)
	FROM pg_class c WHERE c.relnamespace = 'outbox'::regnamespace AND c.relname ~ '^stream_receipts_[012]$'),
	ARRAY['stream_receipts_0:1', 'stream_receipts_1:1', 'stream_receipts_2:1'],
	'each stream log table has its receipts table, keyed by command_id');
SELECT ok((SELECT reloptions @> ARRAY['fillfactor=50'] FROM pg_class WHERE oid = 'outbox.stream_progress'::regclass),
	'stream_progress leaves room for the new versions of its rows (HOT updates)');
SELECT throws_ok($$INSERT INTO outbox.streams (stream, stream_id, partitions, batch_size) VALUES ('x', 99, 257, 1)$$,
	'23514', NULL, 'a stream has at most 256 partitions');

-- extension properties
SELECT is((SELECT extrelocatable FROM pg_extension WHERE extname = 'outbox'), false, 'not relocatable');
SELECT is((SELECT extnamespace::regnamespace::text FROM pg_extension WHERE extname = 'outbox'), 'outbox', 'lives in schema outbox');
SELECT has_function('outbox', 'commit_decision', ARRAY['text', 'bigint', 'text', 'text', 'text', 'jsonb', 'jsonb', 'timestamp with time zone', 'integer', 'jsonb', 'text']);
SELECT has_function('outbox', 'claim', ARRAY['text', 'integer', 'interval', 'text[]']);
SELECT is((SELECT count(*)::int FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
	WHERE n.nspname = 'outbox' AND p.proisstrict), 0, 'no API function is STRICT');
SELECT is((SELECT count(*)::int FROM pg_description d JOIN pg_class c ON c.oid = d.objoid AND d.classoid = 'pg_class'::regclass
	JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = 'outbox' AND c.relkind = 'r' AND d.objsubid = 0), 23,
	'every table has a comment');

-- identifiers compare byte by byte: every run, command, kind and consumer
-- column of the data tables has the "C" collation (and no other text
-- column does)
SELECT set_eq($$SELECT c.relname || '.' || a.attname FROM pg_attribute a
	JOIN pg_class c ON c.oid = a.attrelid JOIN pg_namespace n ON n.oid = c.relnamespace
	WHERE n.nspname = 'outbox' AND c.relkind = 'r' AND a.attnum > 0 AND NOT a.attisdropped
	  AND a.attcollation = 'pg_catalog."C"'::regcollation$$,
	ARRAY['events.run_id', 'events.kind', 'events.command_id', 'commands.command_id', 'commands.run_id',
		  'commands.kind', 'commands.ordering_key', 'receipts.command_id', 'receipts.run_id', 'inbox.consumer', 'inbox.command_id',
		  'inbox.run_id', 'policies.kind',
		  'purged.command_id', 'purged.run_id', 'purged.kind', 'consumers.consumer',
		  'check_results.check_name', 'policies.stream', 'streams.stream', 'subscriptions.subscription',
		  'subscriptions.stream',
		  'stream_log_0.command_id', 'stream_log_0.run_id', 'stream_log_0.kind', 'stream_log_0.ordering_key',
		  'stream_log_1.command_id', 'stream_log_1.run_id', 'stream_log_1.kind', 'stream_log_1.ordering_key',
		  'stream_log_2.command_id', 'stream_log_2.run_id', 'stream_log_2.kind', 'stream_log_2.ordering_key',
		  'stream_kept.command_id', 'stream_kept.run_id', 'stream_kept.kind', 'stream_kept.ordering_key',
		  'stream_receipts_0.command_id', 'stream_receipts_0.run_id', 'stream_receipts_1.command_id',
		  'stream_receipts_1.run_id', 'stream_receipts_2.command_id', 'stream_receipts_2.run_id',
		  'stream_purged.first_command', 'stream_purged.command_ids', 'stream_purged.run_ids', 'stream_purged.kinds',
		  'stream_progress.subscription', 'stream_failures.subscription', 'stream_failures.command_id',
		  'stream_failures.run_id', 'stream_failures.kind', 'stream_failures.ordering_key'],
	'identifier columns use the "C" collation');
SELECT is((SELECT pg_catalog.array_agg(i.indexrelid::regclass::text ORDER BY 1) FROM pg_index i
	JOIN pg_class c ON c.oid = i.indrelid JOIN pg_namespace n ON n.oid = c.relnamespace
	WHERE n.nspname = 'outbox' AND i.indcollation::oid[] && ARRAY[100::oid]), NULL,
	'no index of the extension sorts text in the database''s collation');

-- the failed commands a batch re-delivers are read by their batch, not by
-- walking every failure of the subscription
SELECT has_index('outbox', 'stream_failures', 'stream_failures_batch_idx',
	ARRAY['subscription', 'part', 'batch_id'], 'stream_failures has an index by batch');

SELECT * FROM finish();
ROLLBACK;
