# pg_dump and pg_restore keep every command, lease, receipt, tombstone,
# inbox row, policy and stream (its log, progress and failures; a batch
# acked before the dump is not delivered again, the command decided after
# it is, with one decided after the restore): an outbox with commands in
# every state is dumped
# (custom format) and restored into a fresh database of the same cluster
# and into a fresh cluster; each table's rows are equal, the privileges
# too, the conservation checks are clean, and the API goes on where it
# stopped (a pending command is claimed and acked).  The lease key is not
# dumped (docs/design-decisions.md): the restored lease's old token is
# refused with OB001, and the lease is taken over once it ends.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use FindBin;
use lib "$FindBin::RealBin/../perl";
use OutboxTest;

my $node = outbox_node('dump', qq{
outbox.naptime = '200ms'
});

sub sql { my ($n, $db, $q) = @_; return $n->safe_psql($db, $q); }

$node->safe_psql('postgres', q{
CREATE ROLE auditor;
CREATE DATABASE src;
});
sql($node, 'src', q{
CREATE EXTENSION outbox;
-- a grant of the DBA's on an extension object
GRANT SELECT ON outbox.dead_letters TO auditor;

-- policies, one of them paused
SELECT outbox.set_policy('k-manual', takeover => 'manual', max_deliveries => 5,
	backoff_base => '2 seconds', backoff_max => '1 minute', lease => '10 minutes',
	retention => '30 days');
SELECT outbox.set_policy('k-retry', backoff_base => '1 hour', backoff_max => '2 hours');
SELECT outbox.pause('k-paused');

-- a tombstone: published, receipt, purged (first, as the purge takes every
-- published command with a receipt)
SELECT outbox.commit_decision('run-a', 1, 'decided', 'd-purged', 'k-purge', '{"n": 1}');
SELECT outbox.ack('w1', token) FROM outbox.claim('w1', 1, kinds => '{k-purge}');
SELECT outbox.complete('run-a', 'd-purged', 'done', '{"ref": "x-1"}');
SELECT outbox.register_consumer('consumer-1', 'auditor');
SELECT outbox.register_consumer('consumer-2', current_user::text::regrole);
SELECT outbox.inbox_accept('consumer-2', 'run-a', 'd-purged');
});
sql($node, 'src', q{SELECT outbox.purge(10, '0 seconds')});
sql($node, 'src', q{
-- pending now, pending later (with an event payload and a priority), paused
SELECT outbox.commit_decision('run-a', 2, 'decided', 'd-pending', 'k-pending', '{"n": 2}');
SELECT outbox.commit_decision('run-a', 3, 'decided', 'd-later', 'k-later', '{"n": 3}',
	'{"why": "later"}', now() + interval '1 day', 7);
SELECT outbox.commit_decision('run-a', 4, 'decided', 'd-paused', 'k-paused', '{"n": 4}');
-- sending, with a live lease
SELECT outbox.commit_decision('run-b', 1, 'decided', 'd-sending', 'k-send', '{"n": 5}');
-- (its token kept in a table of the application, dumped with it)
CREATE TABLE public.sending_token AS SELECT token FROM outbox.claim('w1', 1, '1 hour', '{k-send}');
-- published without and with a receipt; inbox rows
SELECT outbox.commit_decision('run-b', 2, 'decided', 'd-pub', 'k-pub', '{"n": 6}');
SELECT outbox.commit_decision('run-b', 3, 'decided', 'd-pub-r', 'k-pub', '{"n": 7}');
SELECT count(*) FROM outbox.ack_many('w2', ARRAY(SELECT token FROM outbox.claim('w2', 2, kinds => '{k-pub}')));
SELECT outbox.complete('run-b', 'd-pub-r', 'failed', '{"code": 42, "text": "déjà vu \u2603"}');
SELECT outbox.inbox_accept('consumer-1', 'run-b', 'd-pub-r');
SELECT outbox.inbox_accept('consumer-2', 'run-b', 'd-pub-r');
-- dead, with a long error of multibyte characters (cut at 4 kB)
SELECT outbox.commit_decision('run-b', 4, 'decided', 'd-dead', 'k-dead', '{"n": 8}');
SELECT outbox.fail('w1', token, 'x' || repeat('é', 3000), true) FROM outbox.claim('w1', 1, kinds => '{k-dead}');
-- back to pending after a failed delivery (an hour of backoff)
SELECT outbox.commit_decision('run-b', 5, 'decided', 'd-retry', 'k-retry', '{"n": 9}');
SELECT outbox.fail('w1', token, 'timeout') FROM outbox.claim('w1', 1, kinds => '{k-retry}');
-- a lease of a manual kind that runs out: uncertain
SELECT outbox.commit_decision('run-c', 1, 'decided', 'd-unc', 'k-manual', '{"n": 10}');
SELECT count(*) FROM outbox.claim('w3', 1, '1 millisecond', '{k-manual}');
-- events that decide nothing; odd ids
SELECT outbox.record_event('run-c', 2, 'note', '{"text": "nothing decided"}');
SELECT outbox.commit_decision(U&'run-\+01F680', 1, 'decided', U&'d-\00E9\0301-\202E', 'k-later',
	'{"emoji": "🚀"}', not_before => now() + interval '1 day');
});
$node->poll_query_until('src', q{
SELECT outbox.sweep() >= 0
   AND (SELECT status = 'uncertain' FROM outbox.commands WHERE command_id = 'd-unc')})
  or die 'd-unc never became uncertain';

# A stream: s1 and s2 published (a batch acked), s3 failed (a retry an
# hour away), s4 decided after the last batch.
sql($node, 'src', q{
SELECT outbox.create_stream('st', 1, 100);
SELECT outbox.set_policy('k-stream', stream => 'st', backoff_base => '1 hour', backoff_max => '1 hour');
SELECT outbox.create_subscription('st', 'st-sub');
SELECT outbox.commit_decision('run-s', i, 'e', 's' || i, 'k-stream', jsonb_build_object('n', i))
  FROM generate_series(1, 3) i;
SELECT outbox.tick_streams();
});
is( sql($node, 'src', q{
CREATE TEMP TABLE sb AS SELECT * FROM outbox.claim_batch('st', 'st-sub', 'w-s');
SELECT outbox.ack_batch('w-s', (SELECT min(token) FROM sb), ARRAY['s3'], ARRAY['later']);
SELECT outbox.commit_decision('run-s', 4, 'e', 's4', 'k-stream', '{"n": 4}');}),
	"2
t", 'the source has a stream with a batch acked and a command after it');
is( sql($node, 'src', q{SELECT outbox.complete('run-s', 's1', 'done', '{"ref": "s-1"}');
SELECT count(*) FROM outbox._stream_receipts WHERE command_id = 's1';}),
	"t\n1", '... and a receipt of a stream command, next to its log table');

is( sql($node, 'src', q{SELECT string_agg(status, ',' ORDER BY status) FROM
		(SELECT DISTINCT status FROM outbox.commands) s}),
	'dead,pending,published,sending,uncertain', 'the source holds commands in every state');
is(sql($node, 'src', 'SELECT count(*) FROM outbox.purged'), '1', '... and a tombstone');

# Every table, ordered by its key, as text; then the privileges of every
# object of the schema.
my %keys = (
	events   => 'run_id, seq',
	commands => 'command_id',
	receipts => 'command_id',
	inbox    => 'consumer, command_id',
	policies => 'kind',
	purged   => 'command_id',
	consumers => 'consumer',
	streams  => 'stream',
	subscriptions => 'subscription',
	stream_log_0 => 'id',
	stream_receipts_0 => 'command_id',
	stream_receipts_1 => 'command_id',
	stream_receipts_2 => 'command_id',
	stream_progress => 'subscription, part',
	stream_failures => 'subscription, command_id');

sub table_rows
{
	my ($n, $db, $table) = @_;
	return sql($n, $db,
		"SELECT count(*) || E'\\n' || coalesce(string_agg(t::text, E'\\n' ORDER BY $keys{$table}), '')"
		  . " FROM outbox.$table t");
}

sub privileges
{
	my ($n, $db) = @_;
	return sql($n, $db, q{
-- this database's group roles under one name, to compare databases
SELECT string_agg(replace(x, current_database() || '_outbox_', '<db>_outbox_'), E'\n' ORDER BY x) FROM (
	SELECT p.oid::regprocedure::text || ' ' || coalesce(p.proacl::text, 'default') AS x
	  FROM pg_proc p WHERE p.pronamespace = 'outbox'::regnamespace
	UNION ALL
	SELECT c.oid::regclass::text || ' ' || coalesce(c.relacl::text, 'default')
	  FROM pg_class c WHERE c.relnamespace = 'outbox'::regnamespace AND c.relkind IN ('r', 'v')
	UNION ALL
	SELECT t.oid::regtype::text || ' ' || coalesce(t.typacl::text, 'default')
	  FROM pg_type t LEFT JOIN pg_class c ON c.oid = t.typrelid
	 WHERE t.typnamespace = 'outbox'::regnamespace AND (c.relkind = 'c' OR t.typtype = 'd')
	UNION ALL
	SELECT 'schema ' || coalesce(nspacl::text, 'default') FROM pg_namespace WHERE nspname = 'outbox') s});
}

my %before = map { $_ => table_rows($node, 'src', $_) } sort keys %keys;
my $privs_before = privileges($node, 'src');
like($privs_before, qr/dead_letters .*auditor=r/, "the DBA's grant is there to be dumped");

my $dump = $node->basedir . '/outbox.dump';
$node->command_ok([ 'pg_dump', '-Fc', '-f', $dump, '-d', $node->connstr('src') ], 'pg_dump -Fc');

# Restore into a fresh database of the same cluster and into a fresh
# cluster (the DBA's role exists in both): CREATE EXTENSION of the restore
# creates the group roles of the new database, and the privileges are the
# source's with those roles in place of the source database's.
my $other = outbox_node('restored', qq{
outbox.naptime = '200ms'
});
$other->safe_psql('postgres', 'CREATE ROLE auditor');

foreach my $target ([ $node, 'same cluster' ], [ $other, 'fresh cluster' ])
{
	my ($n, $where) = @$target;
	$n->safe_psql('postgres', 'CREATE DATABASE dst');
	$n->command_ok([ 'pg_restore', '--exit-on-error', '-d', $n->connstr('dst'), $dump ],
		"pg_restore into a fresh database ($where)");

	foreach my $table (sort keys %keys)
	{
		is(table_rows($n, 'dst', $table), $before{$table}, "$where: outbox.$table restored row for row");
	}
	is(privileges($n, 'dst'), $privs_before, "$where: the privileges are restored, the DBA's grant too");
	is( sql($n, 'dst', q{SELECT string_agg(check_name || '=' || violations, ',' ORDER BY check_name)
			FROM outbox.conservation WHERE violations > 0}),
		'', "$where: the conservation checks are clean");
	is(sql($n, 'dst', 'SELECT outbox.verify(true)'), '', "$where: verify() passes");

	# The API goes on: the restored lease's token is refused (a new lease
	# key), the pending command is claimed and acked, a receipt completes
	# d-pub.
	is( sql($n, 'dst', q{
CREATE FUNCTION pg_temp.old_ack() RETURNS text LANGUAGE plpgsql AS $f$
BEGIN
	PERFORM outbox.ack('w1', (SELECT token FROM public.sending_token));
	RETURN 'acked';
EXCEPTION WHEN SQLSTATE 'OB001' THEN
	RETURN 'refused (OB001)';
END $f$;
SELECT pg_temp.old_ack();
CREATE TEMP TABLE l9 AS SELECT * FROM outbox.claim('w9', 10, kinds => '{k-pending,k-paused}');
SELECT command_id || ' v' || version FROM l9;
SELECT 'acked' FROM outbox.ack('w9', (SELECT token FROM l9)) a;
SELECT outbox.complete('run-b', 'd-pub');
SELECT outbox.complete('run-a', 'd-purged');
SELECT string_agg(command_id || ':' || status, ',' ORDER BY command_id) FROM outbox.commands
 WHERE command_id IN ('d-sending', 'd-pending', 'd-paused');}),
		"refused (OB001)\nd-pending v2\nacked\nt\nf\nd-paused:pending,d-pending:published,d-sending:sending",
		"$where: the API works on the restored outbox (paused kinds stay paused, the tombstone still answers)");
	# The stream goes on: the acked batch is not delivered again; s4 and
	# s5 (decided after the restore) are, in order, in the next batch.
	is( sql($n, 'dst', q{
SELECT outbox.commit_decision('run-s', 5, 'e', 's5', 'k-stream', '{"n": 5}');
SELECT outbox.tick_streams() >= 0;
CREATE TEMP TABLE sb AS SELECT * FROM outbox.claim_batch('st', 'st-sub', 'w-s');
SELECT string_agg(command_id, ',' ORDER BY batch_id, command_id) FROM sb;
SELECT outbox.ack_batch('w-s', (SELECT min(token) FROM sb));
SELECT status FROM outbox.stream_failed WHERE command_id = 's3';
SELECT outbox.complete('run-s', 's1', 'done');}),
		"t
t
s4,s5
2
retry
f",
		"$where: the stream goes on from where it was dumped (its receipt still answers)");
	is( sql($n, 'dst', q{SELECT string_agg(check_name || '=' || violations, ',' ORDER BY check_name)
			FROM outbox.conservation WHERE violations > 0}),
		'', "$where: still clean afterwards");
}

# The fresh cluster got the group roles from the restore.
is( $other->safe_psql('postgres', q{SELECT string_agg(rolname, ',' ORDER BY rolname) FROM pg_roles
		WHERE rolname LIKE '%outbox\_%' AND NOT rolcanlogin}),
	'dst_outbox_admin,dst_outbox_consumer,dst_outbox_producer,dst_outbox_publisher',
	'the restore created the group roles of its database in the fresh cluster');

$other->stop;
$node->stop;
done_testing();
