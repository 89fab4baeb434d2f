# Index upkeep: an index of the extension's tables that a drained and
# purged backlog left mostly empty is rebuilt concurrently by the worker
# (same name, constraint kept, much smaller), but never while a transaction
# keeps the old entries alive; small indexes are left alone; what an
# interrupted rebuild leaves behind is dropped (and nothing else); a
# limit that would rebuild a fresh index is refused; and a rebuild that is
# waiting gives way to VACUUM and to DROP EXTENSION.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use FindBin;
use lib "$FindBin::RealBin/../perl";
use OutboxTest;

my $node = outbox_node('index_upkeep', qq{
outbox.naptime = '200ms'
outbox.retention = 0
outbox.purge_batch = 5000
outbox.index_check_interval = '1s'
outbox.index_bloat = 2
});
$node->safe_psql('postgres', 'CREATE EXTENSION outbox');
$node->poll_query_until('postgres', q{SELECT rounds > 0 FROM outbox.workers})
  or die 'no worker';

sub sql { return $node->safe_psql('postgres', $_[0]); }

is(sql(q{SELECT string_agg(name || ' ' || context || ' ' || coalesce(unit, '-') || ' ' || boot_val, ', ' ORDER BY name)
           FROM pg_settings WHERE name IN ('outbox.index_bloat', 'outbox.index_check_interval')}),
	'outbox.index_bloat sighup - 3, outbox.index_check_interval sighup ms 60000',
	'the two settings, reloadable, with their defaults');

sub filenode { return sql("SELECT relfilenode FROM pg_class WHERE oid = 'outbox.$_[0]'::regclass"); }

sub size_kb { return sql("SELECT pg_relation_size('outbox.$_[0]') / 1024"); }

# Wait until the worker has finished $n more rounds (each 200 ms, so five
# rounds span at least one index check).
sub wait_rounds
{
	my ($n) = @_;
	my $r = sql('SELECT rounds FROM outbox.workers');
	$node->poll_query_until('postgres', "SELECT rounds >= $r + $n FROM outbox.workers")
	  or die 'the worker stopped running rounds';
}

# 60,000 commands through the whole chain; the worker purges them all.
# Command ids are decided once, so each call takes a new prefix.
my $fills = 0;

sub fill_and_drain
{
	$fills++;
	sql(qq{SELECT count(outbox.commit_decision('fill$fills', g, 'e', 'fill$fills-' || g, 'k', '{}'))
	        FROM generate_series(1, 60000) g});
	for (1 .. 6)
	{
		sql(q{WITH c AS (SELECT array_agg(token) AS toks FROM outbox.claim('w', 10000))
		      SELECT count(*) FROM c, outbox.ack_many('w', c.toks)});
	}
	sql(q{SELECT count(outbox.complete(run_id, command_id)) FROM outbox.commands});
	$node->poll_query_until('postgres', q{SELECT count(*) = 0 FROM outbox.commands})
	  or die 'the purge did not finish';
}

my ($ret, $out, $err) = $node->psql('postgres', q{ALTER SYSTEM SET outbox.index_bloat = 1.2});
like($err, qr/outbox\.index_bloat must be 0 \(off\) or at least 1\.5/,
	'a limit that would rebuild a fresh index again is refused');

# Wait until no upkeep worker runs.
sub wait_upkeep_gone
{
	$node->poll_query_until('postgres',
		q{SELECT count(*) = 0 FROM pg_stat_activity WHERE backend_type = 'outbox upkeep'})
	  or die 'the upkeep worker did not exit';
}

# --- A held snapshot: the purged entries stay, nothing is rebuilt. --------
my $pkey_node = filenode('commands_pkey');
my $claim_node = filenode('commands_held_idx');
my $holder = $node->background_psql('postgres');
$holder->query_safe('BEGIN ISOLATION LEVEL REPEATABLE READ');
$holder->query_safe('SELECT 1');
fill_and_drain();
my $before = size_kb('commands_pkey');
cmp_ok($before, '>=', 2048, "the drained primary key is large ($before kB)");
sql('VACUUM outbox.commands, outbox.receipts');
wait_rounds(10);
is(filenode('commands_pkey'), $pkey_node,
	'not rebuilt while a transaction keeps the old entries alive');
# A rebuild started now would wait for the holder (and so not show in the
# file node): no upkeep worker may have been started at all.
is(sql(q{SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'outbox upkeep'}), '0',
	'no rebuild is even attempted while the old entries are alive');

# --- The holder ends: vacuum empties the pages, the worker rebuilds. ------
$holder->query_safe('COMMIT');
sql('VACUUM outbox.commands, outbox.receipts');
ok($node->poll_query_until('postgres',
		"SELECT relfilenode <> $pkey_node FROM pg_class WHERE oid = 'outbox.commands_pkey'::regclass"),
	'the primary key was rebuilt');
wait_upkeep_gone();
my $after = size_kb('commands_pkey');
cmp_ok($after * 8, '<=', $before, "it is much smaller ($before kB before, $after kB after)");
is(sql(q{SELECT count(*) FROM pg_constraint c JOIN pg_index i ON i.indexrelid = c.conindid
          WHERE c.conname = 'commands_pkey' AND c.contype = 'p'
            AND i.indisvalid AND i.indisprimary
            AND c.conindid = 'outbox.commands_pkey'::regclass}),
	'1', 'it is still the valid primary key of outbox.commands');
like(sql(q{SELECT string_agg(relname, ',') FROM pg_class
            WHERE relnamespace = 'outbox'::regnamespace AND relname LIKE '%\_cc%'}),
	qr/^$/, 'no rebuild leftover remains');
cmp_ok(size_kb('commands_held_idx'), '<', 1024, 'the index of held commands is under 1 MB');
is(filenode('commands_held_idx'), $claim_node, 'an index under 1 MB is left alone');
my $log = slurp_file($node->logfile);
like($log, qr/outbox upkeep rebuilt index "commands_pkey": \d+ kB before, \d+ kB after/,
	'the rebuild is logged');
# (measured after the indexes of outbox.commands, so it may come a step later)
ok(eval { $node->wait_for_log(qr/outbox upkeep rebuilt index "receipts_pkey"/); 1 },
	'the receipts primary key was rebuilt too');
wait_upkeep_gone();

# The chain still works on the rebuilt indexes.
sql(q{SELECT outbox.commit_decision('r2', 1, 'e', 'after-1', 'k', '{}')});
is(sql(q{CREATE TABLE after_lease AS SELECT * FROM outbox.claim('w', 10);
	SELECT command_id || ' ' || version FROM after_lease}), 'after-1 2',
	'claim after the rebuild');
is(sql(q{SELECT count(*) FROM outbox.ack_many('w', ARRAY(SELECT token FROM after_lease)) WHERE acked}),
	'1', 'ack after the rebuild');
is(sql(q{SELECT outbox.complete('r2', 'after-1')}), 't', 'receipt after the rebuild');

# --- Leftovers of an interrupted rebuild are dropped; other indexes stay. -
sql(q{CREATE INDEX commands_pkey_ccnew ON outbox.commands (command_id);
      CREATE INDEX mine_idx ON outbox.commands (kind);
      UPDATE pg_index SET indisvalid = false
       WHERE indexrelid IN ('outbox.commands_pkey_ccnew'::regclass, 'outbox.mine_idx'::regclass)});
ok($node->poll_query_until('postgres',
		q{SELECT to_regclass('outbox.commands_pkey_ccnew') IS NULL}),
	'an invalid _ccnew index is dropped');
wait_upkeep_gone();
is(sql(q{SELECT to_regclass('outbox.mine_idx') IS NOT NULL}), 't',
	'an invalid index of another name is not touched');
sql('DROP INDEX outbox.mine_idx');

# --- A reload never postpones the next measure; a shorter interval applies
# at once. -----------------------------------------------------------------
sub plant_ccnew
{
	sql(q{CREATE INDEX commands_pkey_ccnew ON outbox.commands (command_id);
	      UPDATE pg_index SET indisvalid = false
	       WHERE indexrelid = 'outbox.commands_pkey_ccnew'::regclass});
}
plant_ccnew();
sql(q{ALTER SYSTEM SET outbox.index_check_interval = '1h'; SELECT pg_reload_conf()});
ok($node->poll_query_until('postgres',
		q{SELECT to_regclass('outbox.commands_pkey_ccnew') IS NULL}),
	'a reload to a longer interval does not postpone the measure already due');
wait_upkeep_gone();
sleep(2);    # a measure that overlapped the reload may have set the next one a second away
plant_ccnew();
sleep(3);
is(sql(q{SELECT to_regclass('outbox.commands_pkey_ccnew') IS NOT NULL}), 't',
	'with an hour between measures, a new leftover stays for now');
sql(q{ALTER SYSTEM SET outbox.index_check_interval = '1s'; SELECT pg_reload_conf()});
ok($node->poll_query_until('postgres',
		q{SELECT to_regclass('outbox.commands_pkey_ccnew') IS NULL}),
	'a reload to a shorter interval brings the next measure forward');
wait_upkeep_gone();

# --- A waiting rebuild gives way to DROP EXTENSION. -----------------------
# Make the bloat with the upkeep off, then hold a snapshot (no lock on the
# extension's tables) that the rebuild must wait for, and turn it on.
sql(q{ALTER SYSTEM SET outbox.index_bloat = 0; SELECT pg_reload_conf()});
wait_rounds(2);
fill_and_drain();
sql('VACUUM outbox.commands, outbox.receipts');
$holder->query_safe('BEGIN ISOLATION LEVEL REPEATABLE READ');
$holder->query_safe('SELECT 1');
sql(q{ALTER SYSTEM SET outbox.index_bloat = 2; SELECT pg_reload_conf()});
# Wait until an upkeep worker waits for the held snapshot.
sub wait_upkeep_waiting
{
	return $node->poll_query_until('postgres',
		q{SELECT count(*) > 0 FROM pg_stat_activity
		   WHERE backend_type = 'outbox upkeep' AND wait_event = 'virtualxid'});
}

sub stopped_count
{
	my @n = (slurp_file($node->logfile) =~ /stopped its index upkeep: another session is waiting for a lock/g);
	return scalar @n;
}

ok(wait_upkeep_waiting(), 'the rebuild waits for the held snapshot');
my $stopped = stopped_count();
($ret, $out, $err) = $node->psql('postgres',
	q{SET statement_timeout = '60s'; VACUUM outbox.commands});
is($ret, 0, 'VACUUM is not blocked by the waiting rebuild') or diag($err);
cmp_ok(stopped_count(), '>', $stopped, 'the worker stopped the rebuild and says why');

ok(wait_upkeep_waiting(), 'the next rebuild (after dropping the leftover) waits again');
$stopped = stopped_count();
($ret, $out, $err) = $node->psql('postgres',
	q{SET statement_timeout = '60s'; DROP EXTENSION outbox});
is($ret, 0, 'DROP EXTENSION is not blocked by the waiting rebuild') or diag($err);
is(sql(q{SELECT to_regclass('outbox.commands') IS NULL}), 't', 'the extension is gone');
cmp_ok(stopped_count(), '>', $stopped, 'the worker stopped that rebuild too');
$holder->query_safe('COMMIT');
$holder->quit;

done_testing();
