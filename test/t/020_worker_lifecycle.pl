# The background worker's life: started by CREATE EXTENSION, stopped by
# DROP EXTENSION, out of the way of DROP DATABASE and the other commands
# that need a database to themselves, reloaded by SIGHUP, stopped by
# SIGTERM and restarted by the launcher, back after kill -9 (a crash
# restart of the server) and after an immediate stop; and, without
# shared_preload_libraries, an API that works and views that say why no
# worker runs.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use FindBin;
use lib "$FindBin::RealBin/../perl";
use OutboxTest;
use Time::HiRes qw(time);

my $node = outbox_node('worker_life', qq{
outbox.naptime = '200ms'
restart_after_crash = on
});

# The pid of the worker serving $db, or '' when there is none.
sub worker_pid
{
	my ($db) = @_;
	return $node->safe_psql('postgres', qq{
		SELECT pid FROM pg_stat_activity
		 WHERE backend_type = 'outbox worker' AND datname = '$db'});
}

# Wait until a worker other than $old serves $db and has done a round;
# return its pid.
sub wait_worker
{
	my ($db, $old) = @_;
	$old //= 0;
	$node->poll_query_until('postgres', qq{
		SELECT count(*) = 1 FROM pg_stat_activity
		 WHERE backend_type = 'outbox worker' AND datname = '$db'
		   AND application_name = 'outbox worker' AND pid <> $old})
	  or die "no worker for $db";
	my $pid = worker_pid($db);
	$node->poll_query_until($db, qq{
		SELECT rounds > 0 FROM outbox.workers WHERE pid = $pid})
	  or die "worker $pid of $db did no round";
	return $pid;
}

sub wait_no_worker
{
	my ($db) = @_;
	return $node->poll_query_until('postgres', qq{
		SELECT count(*) = 0 FROM pg_stat_activity
		 WHERE backend_type = 'outbox worker' AND datname = '$db'});
}

# A command whose lease has run out with its deliveries used up: the
# worker's sweep is the only thing that will make it dead.
sub seed_expiring
{
	my ($db, $id) = @_;
	$node->safe_psql($db, qq{
		SELECT outbox.set_policy('life', max_deliveries => 1);
		SELECT outbox.commit_decision('run-$id', 1, 'e', '$id', 'life', '{}');
		SELECT count(*) FROM outbox.claim('w', 1, interval '300 ms', ARRAY['life']);});
}

sub wait_dead
{
	my ($db, $id) = @_;
	return $node->poll_query_until($db, qq{
		SELECT status = 'dead' FROM outbox.commands WHERE command_id = '$id'});
}

# --- the launcher ------------------------------------------------------------
is($node->safe_psql('postgres', q{
	SELECT count(*) FROM pg_stat_activity
	 WHERE backend_type = 'outbox launcher' AND application_name = 'outbox launcher'
	   AND datname IS NULL}),
	'1', 'one launcher runs, connected to no database');

# --- CREATE EXTENSION starts a worker, DROP EXTENSION stops it --------------
$node->safe_psql('postgres', 'CREATE DATABASE app');
my $t0 = time;
$node->safe_psql('app', 'CREATE EXTENSION outbox');
my $pid = wait_worker('app');
cmp_ok(time - $t0, '<', 5, 'CREATE EXTENSION is served within a few seconds');
is($node->safe_psql('app', qq{
	SELECT database || ' ' || (state IN ('idle', 'running')) || ' ' || (naptime = '200ms')
	  FROM outbox.workers WHERE pid = $pid}),
	'app true true', 'outbox.workers shows the worker of app');

$t0 = time;
$node->safe_psql('app', 'DROP EXTENSION outbox');
cmp_ok(time - $t0, '<', 5, 'DROP EXTENSION is not held up by the worker');
ok(wait_no_worker('app'), 'the worker stops after DROP EXTENSION');

$node->safe_psql('app', 'CREATE EXTENSION outbox');
$pid = wait_worker('app');
ok($pid, 'a new CREATE EXTENSION starts a worker again');

# --- commands that need the database to themselves ----------------------------
$node->safe_psql('postgres', 'CREATE DATABASE doomed');
$node->safe_psql('doomed', 'CREATE EXTENSION outbox');
wait_worker('doomed');
my ($rc, $out, $err) = $node->psql('postgres', 'DROP DATABASE doomed');
is($rc, 0, 'DROP DATABASE succeeds while its worker runs') or diag $err;
ok(wait_no_worker('doomed'), 'no worker is left for the dropped database');

($rc, $out, $err) = $node->psql('postgres', 'CREATE DATABASE app_copy TEMPLATE app');
is($rc, 0, 'CREATE DATABASE ... TEMPLATE a served database succeeds') or diag $err;
$pid = wait_worker('app');
ok(wait_worker('app_copy'), 'the copy, which has the extension, gets a worker of its own');

($rc, $out, $err) = $node->psql('postgres', 'ALTER DATABASE app_copy RENAME TO app_renamed');
is($rc, 0, 'ALTER DATABASE RENAME succeeds while its worker runs') or diag $err;
ok(wait_worker('app_renamed'), 'the renamed database is served again');
$node->safe_psql('postgres', 'DROP DATABASE app_renamed');

# --- outbox.databases restricts the set of databases served ------------------
$node->safe_psql('postgres', q{ALTER SYSTEM SET outbox.databases = 'postgres'; SELECT pg_reload_conf()});
ok(wait_no_worker('app'), 'a database left out of outbox.databases loses its worker');
$node->safe_psql('postgres', q{ALTER SYSTEM RESET outbox.databases; SELECT pg_reload_conf()});
$pid = wait_worker('app');
ok($pid, 'and gets it back when listed again');

# --- SIGHUP changes the nap time of the running worker ------------------------
$node->safe_psql('postgres', q{ALTER SYSTEM SET outbox.naptime = '10min'; SELECT pg_reload_conf()});
$node->poll_query_until('app', qq{SELECT naptime = '10min' FROM outbox.workers WHERE pid = $pid})
  or die 'the worker never took the 10 minute nap time';
my $rounds = $node->safe_psql('app', qq{SELECT rounds FROM outbox.workers WHERE pid = $pid});
$node->safe_psql('postgres', q{ALTER SYSTEM SET outbox.naptime = '50ms'; SELECT pg_reload_conf()});
ok( $node->poll_query_until('app', qq{
		SELECT naptime = '50ms' AND rounds >= $rounds + 20 FROM outbox.workers WHERE pid = $pid}),
	'after a reload the same worker runs a round every 50 ms instead of every 10 minutes');
is(worker_pid('app'), $pid, 'the reload did not restart the worker');
$node->safe_psql('postgres', q{ALTER SYSTEM RESET outbox.naptime; SELECT pg_reload_conf()});
$node->poll_query_until('app', qq{SELECT naptime = '200ms' FROM outbox.workers WHERE pid = $pid})
  or die 'nap time not restored';

# --- SIGTERM stops the worker promptly; the launcher starts a new one ---------
$t0 = time;
$node->safe_psql('postgres', "SELECT pg_terminate_backend($pid)");
$node->poll_query_until('postgres', "SELECT count(*) = 0 FROM pg_stat_activity WHERE pid = $pid")
  or die 'worker ignored SIGTERM';
cmp_ok(time - $t0, '<', 2, 'SIGTERM stops the worker promptly');
my $new = wait_worker('app', $pid);
cmp_ok(time - $t0, '<', 10, 'the launcher restarts it within a few seconds');

# --- kill -9: the server restarts every backend; the worker comes back -------
seed_expiring('app', 'after-kill');
$t0 = time;
kill 'KILL', $new;
$pid = wait_worker('app', $new);
ok(wait_dead('app', 'after-kill'), 'after kill -9 a new worker dead-letters the expired lease');
cmp_ok(time - $t0, '<', 20, 'and is back within seconds of the crash restart');
ok($node->log_contains('terminating any other active server processes'),
	'kill -9 did crash-restart the server');

# --- immediate stop and start ---------------------------------------------------
seed_expiring('app', 'after-stop');
$node->stop('immediate');
$node->start;
$t0 = time;
$pid = wait_worker('app');
ok(wait_dead('app', 'after-stop'), 'after an immediate stop and start the worker does its duties');
cmp_ok(time - $t0, '<', 20, 'within seconds of the start');

# --- without shared_preload_libraries ---------------------------------------------
$node->stop;
$node->append_conf('postgresql.conf', "shared_preload_libraries = ''");
$node->start;
is($node->safe_psql('app', q{
	SELECT outbox.commit_decision('np', 1, 'e', 'np-1', 'k', '{}');
	SELECT count(*) FROM outbox.ack('w', (SELECT token FROM outbox.claim('w', 10, NULL, ARRAY['k'])));
	SELECT status || ' ' || outbox.preloaded() FROM outbox.commands WHERE command_id = 'np-1'}),
	"t\n1\npublished false", 'without preloading the API works');
is($node->safe_psql('app', q{
	SELECT database || ' | ' || state || ' | ' || last_error || ' | ' || (pid IS NULL)
	  FROM outbox.workers}),
	'app | not preloaded | outbox is not in shared_preload_libraries, so no background worker runs: add it and restart the server | true',
	'outbox.workers says that no worker runs and why');
is($node->safe_psql('app', q{
	SELECT count(*) || ' ' || bool_and(enqueued IS NULL AND wakeups IS NULL AND stats_reset IS NULL)
	  FROM outbox.stats}),
	'1 true', 'outbox.stats is one row of NULLs: the counters are unknown, not zero');
($rc, $out, $err) = $node->psql('app', 'SELECT outbox.stats_reset()');
like($err, qr/outbox statistics are not available/, 'stats_reset says the statistics are not available');
is($node->safe_psql('postgres', q{
	SELECT count(*) FROM pg_stat_activity WHERE backend_type LIKE 'outbox%'}),
	'0', 'no launcher and no worker run');

$node->stop;
done_testing();
