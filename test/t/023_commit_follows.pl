# Counters and wake-ups follow what commits: a savepoint rolled back takes
# its counts with it (commit_decision, claim, ack; nested savepoints; a
# PL/pgSQL exception block), a released one keeps them; a prepared
# transaction counts and wakes the LISTENing publisher when COMMIT PREPARED
# runs in another session, although it started long before the worker's
# last look, and counts nothing after ROLLBACK PREPARED; a transaction
# prepared before a restart still wakes the publisher when it is committed
# after it; a database whose extension was installed inside a prepared
# transaction gets its worker.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use FindBin;
use lib "$FindBin::RealBin/../perl";
use OutboxTest qw(:DEFAULT notifications_after wait_notification);
use Time::HiRes qw(time);

# A one-minute nap: only a commit's wake-up or the due check can announce.
my $node = outbox_node('commit_follows', qq{
max_prepared_transactions = 4
outbox.naptime = '1min'
});
$node->safe_psql('postgres', 'CREATE EXTENSION outbox');

sub sql { return $node->safe_psql('postgres', $_[0]); }

$node->poll_query_until('postgres', q{SELECT rounds > 0 FROM outbox.workers})
  or die 'no worker';

# The counters this test moves (the worker moves none of them).
sub counts
{
	return sql(q{SELECT enqueued || ' ' || claimed || ' ' || acked FROM outbox.stats});
}

# Run $body and return how the three counters moved.
sub moved
{
	my ($body) = @_;
	my @before = split / /, counts();
	sql($body);
	my @after = split / /, counts();
	return join ' ', map { $after[$_] - $before[$_] } 0 .. 2;
}

# --- savepoints --------------------------------------------------------------------
is(moved(q{BEGIN;
	SAVEPOINT s;
	SELECT outbox.commit_decision('sp', 1, 'e', 'sp-1', 'sp', '{}');
	ROLLBACK TO SAVEPOINT s;
	COMMIT}), '0 0 0', 'a decision in a rolled-back savepoint is not counted');
is(sql(q{SELECT count(*) FROM outbox.commands WHERE command_id = 'sp-1'}), '0',
	'(and it is not there)');
is(moved(q{BEGIN;
	SAVEPOINT s;
	SELECT outbox.commit_decision('sp', 2, 'e', 'sp-2', 'sp', '{}');
	RELEASE SAVEPOINT s;
	COMMIT}), '1 0 0', 'a decision in a released savepoint is counted once');
is(moved(q{BEGIN;
	SAVEPOINT a;
	SAVEPOINT b;
	SELECT outbox.commit_decision('sp', 3, 'e', 'sp-3', 'sp', '{}');
	RELEASE SAVEPOINT b;
	ROLLBACK TO SAVEPOINT a;
	SELECT outbox.commit_decision('sp', 4, 'e', 'sp-4', 'sp', '{}');
	COMMIT}), '1 0 0', 'a released savepoint inside a rolled-back one is not counted');
is(moved(q{DO $$
BEGIN
	BEGIN
		PERFORM outbox.commit_decision('sp', 5, 'e', 'sp-5', 'sp', '{}');
		RAISE EXCEPTION 'undo';
	EXCEPTION WHEN raise_exception THEN
		NULL;
	END;
	PERFORM outbox.commit_decision('sp', 6, 'e', 'sp-6', 'sp', '{}');
END $$}), '1 0 0', 'a decision in a PL/pgSQL block that failed is not counted');

is(moved(q{BEGIN;
	SAVEPOINT s;
	SELECT count(*) FROM outbox.claim('p', 10, NULL, ARRAY['sp']);
	ROLLBACK TO SAVEPOINT s;
	COMMIT}), '0 0 0', 'a claim in a rolled-back savepoint is not counted');
is(moved(q{BEGIN;
	SAVEPOINT s;
	CREATE TABLE sp_lease AS SELECT * FROM outbox.claim('p', 1, NULL, ARRAY['sp']);
	RELEASE SAVEPOINT s;
	COMMIT}), '0 1 0', 'a claim in a released savepoint is counted');
my $tok = sql(q{SELECT token FROM sp_lease});
is(moved(qq{BEGIN;
	SAVEPOINT s;
	SELECT outbox.ack('p', '$tok');
	ROLLBACK TO SAVEPOINT s;
	COMMIT}), '0 0 0', 'an ack in a rolled-back savepoint is not counted');
is(moved(qq{BEGIN;
	SAVEPOINT s;
	SELECT outbox.ack('p', '$tok');
	RELEASE SAVEPOINT s;
	COMMIT}), '0 0 1', 'an ack in a released savepoint is counted');

# --- two-phase commit ------------------------------------------------------------------
my $listener = $node->background_psql('postgres');
$listener->query_safe('LISTEN outbox');

# The worker's start-up notification and the savepoints' are past.
wait_notification($listener, 10);
notifications_after($listener, 'SELECT pg_sleep(0.6)');
notifications_after($listener, 'SELECT 1');

# A transaction that starts, waits past two of the worker's looks at what
# is due, enqueues and prepares: its command's due time is its start.
sub prepare_decision
{
	my ($gid, $seq) = @_;
	sql(qq{BEGIN;
		SELECT pg_sleep(1.2);
		SELECT outbox.commit_decision('tp', $seq, 'e', '$gid', 'tp', '{}');
		PREPARE TRANSACTION '$gid'});
}

my $before = counts();
prepare_decision('tp-rollback', 1);
sql(q{ROLLBACK PREPARED 'tp-rollback'});
is(counts(), $before, 'ROLLBACK PREPARED counts nothing');

prepare_decision('tp-commit', 2);
is(notifications_after($listener, 'SELECT pg_sleep(0.6)'), 0, 'a prepared decision wakes nobody yet');
is(counts(), $before, 'and is not counted yet');
sql(q{COMMIT PREPARED 'tp-commit'});
ok(wait_notification($listener, 10) >= 1,
	'COMMIT PREPARED from another session wakes the listening publisher');
my @b = split / /, $before;
my @a = split / /, counts();
is($a[0] - $b[0], 1, 'and counts the decision once');
notifications_after($listener, 'SELECT pg_sleep(1.1)');    # two more looks of the worker
@a = split / /, counts();
is($a[0] - $b[0], 1, 'still once after the worker looked again');
is(sql(q{SELECT count(*) FROM outbox.claim('p', 10, NULL, ARRAY['tp'])}), '1',
	'the committed command can be claimed');
$listener->quit;

# --- prepared before a restart, committed after it -----------------------------------------
prepare_decision('tp-restart', 3);
$node->restart;
$node->poll_query_until('postgres', q{SELECT rounds > 0 FROM outbox.workers})
  or die 'no worker after the restart';
$listener = $node->background_psql('postgres');
$listener->query_safe('LISTEN outbox');
notifications_after($listener, 'SELECT pg_sleep(1.1)');    # the start-up notification, if any, is past
notifications_after($listener, 'SELECT 1');
sql(q{COMMIT PREPARED 'tp-restart'});
ok(wait_notification($listener, 10) >= 1,
	'a transaction prepared before a restart wakes the publisher when committed after it');
$listener->quit;

# --- an extension installed inside a prepared transaction gets its worker ----------------
sub app_workers
{
	return sql(q{SELECT count(*) FROM outbox.workers WHERE database = 'app'
		AND state IN ('idle', 'running')});
}
sql('CREATE DATABASE app');
$node->safe_psql('app', 'CREATE EXTENSION outbox');
$node->poll_query_until('postgres', q{SELECT count(*) = 1 FROM outbox.workers
	WHERE database = 'app' AND state IN ('idle', 'running')})
  or die 'no worker in app';
$node->safe_psql('app', 'DROP EXTENSION outbox');
$node->poll_query_until('postgres', q{SELECT count(*) = 0 FROM outbox.workers WHERE database = 'app'})
  or die 'the worker of app did not stop';
$node->safe_psql('app', q{BEGIN; CREATE EXTENSION outbox; PREPARE TRANSACTION 'ext'});
is(app_workers(), '0', 'a prepared CREATE EXTENSION starts no worker');
$node->safe_psql('app', q{COMMIT PREPARED 'ext'});
ok($node->poll_query_until('postgres', q{SELECT count(*) = 1 FROM outbox.workers
	WHERE database = 'app' AND state IN ('idle', 'running')}, 't'),
	'after COMMIT PREPARED the database gets its worker');

$node->stop;
done_testing();
