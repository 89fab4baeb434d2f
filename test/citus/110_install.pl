# On a real Citus cluster (a coordinator and two workers): CREATE EXTENSION
# outbox run on the coordinator reaches both workers through Citus's
# two-phase commit (PREPARE TRANSACTION on each worker, then COMMIT
# PREPARED), and an outbox background worker then serves the database on
# every node; DROP EXTENSION stops them and leaves each node's catalog as it
# was before (no relation, type or function left behind); installed again
# after that, when each node's launcher waits for a request rather than
# probing, the worker nodes' workers are started by the request the install
# left at PREPARE TRANSACTION: published right after COMMIT PREPARED by the
# utility hook of src/shared.c, or at the launcher's next wake-up, which
# looks for finished prepared transactions too.  (Either path alone passes
# this test; with both disabled it fails.)
use strict;
use warnings;
use FindBin;
use lib $FindBin::RealBin;
use CitusNodes;
use Test::More;

my $db = citus_database('citus_install');

# What a node's catalog holds outside the system schemas: relations, types,
# functions, schemas (one line each), to compare before and after.
# Citus hides shards from catalog queries unless told not to.
my $catalog = q{
	SET citus.override_table_visibility TO off;
	SELECT string_agg(o, ' ' ORDER BY o) FROM (
		SELECT 'rel:' || n.nspname || '.' || c.relname AS o
		  FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
		 WHERE n.nspname NOT IN ('pg_catalog', 'information_schema', 'pg_toast')
		UNION ALL
		SELECT 'type:' || n.nspname || '.' || t.typname
		  FROM pg_type t JOIN pg_namespace n ON n.oid = t.typnamespace
		 WHERE n.nspname NOT IN ('pg_catalog', 'information_schema', 'pg_toast')
		UNION ALL
		SELECT 'proc:' || n.nspname || '.' || p.proname
		  FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
		 WHERE n.nspname NOT IN ('pg_catalog', 'information_schema')
		UNION ALL
		SELECT 'schema:' || nspname FROM pg_namespace
		 WHERE nspname NOT IN ('outbox') AND nspname NOT LIKE 'pg\_%'
	) objects};
my @before = on_all($db, $catalog);

my $serving = q{SELECT count(*) FROM pg_stat_activity
	WHERE application_name = 'outbox worker' AND datname = current_database()};

# --- install: propagated with two-phase commit ---------------------------------------------
my ($rc, $out, $err) = psql(0, $db,
	"SET citus.log_remote_commands = on;\nCREATE EXTENSION outbox;");
is($rc, 0, 'CREATE EXTENSION outbox on the coordinator succeeds')
  or diag($err);
my %prepared;
while ($err =~ /issuing PREPARE TRANSACTION '([^']+)'\s*\n\s*DETAIL:\s+on server \S+:(\d+)/g)
{
	$prepared{$2} = $1;
}
my @ports = split ' ', $ENV{CITUS_PORTS};
ok(exists $prepared{ $ports[$_] },
	node_name($_) . ' receives the extension in a prepared transaction')
  for (1, 2);
like($err, qr/issuing COMMIT PREPARED '\Q$prepared{$ports[1]}\E'/,
	'the coordinator commits it with COMMIT PREPARED')
  if exists $prepared{ $ports[1] };

my $version = safe_psql(0, $db,
	q{SELECT default_version FROM pg_available_extensions WHERE name = 'outbox'});
for my $node (@NODES)
{
	is(safe_psql($node, $db, q{SELECT extversion FROM pg_extension WHERE extname = 'outbox'}),
		$version, node_name($node) . " has outbox $version");
	ok(poll_until($node, $db, q{SELECT count(*) FROM outbox.workers
		WHERE database = current_database() AND state IN ('idle', 'running')}, '1'),
		node_name($node) . ' runs an outbox worker for the database');
	ok(wait_for_log($node, qr/outbox worker for database "$db" started/),
		node_name($node) . ' logs the start of the worker');
}

# --- drop: nothing left on any node ---------------------------------------------------------
safe_psql(0, $db, 'DROP EXTENSION outbox');
my @after = on_all($db, $catalog);
for my $node (@NODES)
{
	is(safe_psql($node, $db, q{SELECT count(*) FROM pg_extension WHERE extname = 'outbox'}),
		'0', node_name($node) . ' no longer has the extension');
	is($after[$node], $before[$node],
		node_name($node) . ' has the same relations, types and functions as before the install');
	is(safe_psql($node, $db, q{SET citus.override_table_visibility TO off;
		SELECT count(*) FROM pg_class c
		JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = 'outbox'}),
		'0', node_name($node) . ' has no relation left in schema outbox');
	is(safe_psql($node, $db, q{SELECT count(*) FROM pg_namespace WHERE nspname = 'outbox'}),
		'1', node_name($node) . ' keeps the empty schema outbox (the extension does not own it)');
	ok(wait_for_log($node, qr/outbox worker for database "$db" is stopping: the extension was dropped/),
		node_name($node) . "'s worker stops");
	ok(poll_until($node, $db, $serving, '0'), node_name($node) . ' serves the database no more');
}

# --- installed again: the workers start from COMMIT PREPARED --------------------------------
# Each launcher now waits for a request naming the database (it does not
# probe a database whose worker found the extension dropped), so on the
# worker nodes only the request kept at PREPARE TRANSACTION, published once
# COMMIT PREPARED has committed it, can start a worker.
($rc, $out, $err) = psql(0, $db,
	"SET citus.log_remote_commands = on;\nCREATE EXTENSION outbox;");
is($rc, 0, 'CREATE EXTENSION outbox again') or diag($err);
like($err, qr/issuing COMMIT PREPARED/, 'again committed with COMMIT PREPARED');
for my $node (@NODES)
{
	ok(poll_until($node, $db, $serving, '1'),
		node_name($node) . ' serves the database again');
}

safe_psql(0, $db, 'DROP EXTENSION outbox');
is(join(',', on_all($db, q{SELECT count(*) FROM pg_extension WHERE extname = 'outbox'})),
	'0,0,0', 'dropped again on every node');

done_testing();
