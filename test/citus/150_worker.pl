# The background worker and the administrator's calls on a distributed
# outbox (docs/citus.md): the purge per shard on each worker node (the
# worker's purge turn and outbox.purge() called on a node; refused on the
# coordinator), tombstones in the co-located shard, nothing purged without
# its receipt; the due look over each node's shards, so that relays
# LISTENing on the worker nodes with a poll interval longer than the test
# are woken for commits from the coordinator, a not_before reaching its
# time and expired leases; the conservation views, verify(), the checks'
# counts and metrics_backlog() from the coordinator over the whole cluster,
# not counted on the worker nodes; resolve, requeue and rotate_lease_key
# from the coordinator, the rotation refusing the old tokens in sessions of
# every node; a session whose next claim serves a shard moved to its node;
# the index upkeep rebuilding a worker's bloated shard index; sessions
# opened before distribute() and undistribute() that see the change (the
# cached answers of src/citus.c are invalidated).
use strict;
use warnings;
use FindBin;
use lib $FindBin::RealBin;
use CitusNodes;
use IPC::Run ();
use Test::More;
use Time::HiRes ();

my $db = citus_database('citus_worker');
my @ports = split ' ', $ENV{CITUS_PORTS};

# The SQLSTATE of a statement that must fail (psql's VERBOSITY verbose).
sub sqlstate
{
	my ($node, $sql) = @_;
	my ($rc, $out, $err) = psql($node, $db, "\\set VERBOSITY verbose\n$sql");
	return $rc == 0 ? 'succeeded' : ($err =~ /ERROR:\s+([0-9A-Z]{5})/ ? $1 : $err);
}

# The node (1 or 2) holding a run.
sub node_of_run
{
	my ($run) = @_;
	return node_of_port(safe_psql(0, $db, qq{
		SELECT n.nodeport FROM pg_dist_placement p JOIN pg_dist_node n ON n.groupid = p.groupid
		 WHERE p.shardid = get_shard_id_for_distribution_column('outbox.commands', '$run')}));
}

# Claim and ack every due command of some kinds on both workers.
sub publish_all
{
	my ($kinds) = @_;
	my $n = 0;
	for my $node (1, 2)
	{
		$n += safe_psql($node, $db, qq{
			SELECT count(outbox.ack('pub', token)) FROM outbox.claim('pub', 1000, kinds => '$kinds')});
	}
	return $n;
}

# The coordinator's worker counts the checks every second in this file.
safe_psql(0, 'postgres', q{ALTER SYSTEM SET outbox.check_interval = '1s'; SELECT pg_reload_conf()});
END
{
	psql(0, 'postgres', q{ALTER SYSTEM RESET outbox.check_interval; SELECT pg_reload_conf()});
	psql(1, 'postgres', q{ALTER SYSTEM RESET outbox.index_check_interval; SELECT pg_reload_conf()});
}

safe_psql(0, $db, 'CREATE EXTENSION outbox');

# Sessions opened before distribute(), each having made a call that reads
# whether the outbox is distributed (not yet): the cached answer must
# follow the change.
my $s1 = session(1, $db);
my $s0 = session(0, $db);
is(session_query($s1, q{SELECT count(*) FROM outbox.claim('early', 5);}), '0',
	'a session on worker1 claims from its own, empty, outbox before distribute()');
is(session_query($s0, q{SELECT count(*) FROM outbox.claim('early', 5);}), '0',
	'a session on the coordinator likewise');

safe_psql(0, $db, q{SELECT outbox.set_policy('ship', max_deliveries => 5)});
safe_psql(0, $db, 'SET citus.shard_count = 8; SELECT outbox.distribute()');
my $distributed_at = safe_psql(0, $db, 'SELECT extract(epoch FROM now())');
for my $node (1, 2)
{
	is(safe_psql($node, $db, q{SELECT count(*) FROM outbox.metrics_checks() WHERE violations IS NOT NULL
		OR computed_timestamp_seconds <> 0}), '0',
		node_name($node) . '\'s counts of its local tables are forgotten by distribute()');
}

# 60 decisions from the coordinator.
safe_psql(0, $db, q{SELECT count(*) FROM (SELECT outbox.commit_decision('p-' || g, 1, 'placed', 'ship-p-' || g,
	'ship', '{}') FROM generate_series(1, 60) g) s});
is(session_query($s1, q{SELECT count(*) > 0 FROM outbox.claim('early', 5, lease => '1 second');}), 't',
	'the session on worker1 from before distribute() now claims from its shards');
session_query($s0, q{SELECT count(*) FROM outbox.claim('early', 5);});
like($s0->{err}, qr/holds no shard/,
	'the session on the coordinator from before distribute() is refused as on a distributed outbox');

# --- purge ----------------------------------------------------------------------------------
# (the leases of 'early' end, and are taken over)
Time::HiRes::usleep(1_200_000);
is(publish_all('{ship}'), '60', 'the 60 commands published on the two workers');
is(safe_psql(0, $db, join('', map { "SELECT outbox.complete('p-$_', 'ship-p-$_');\n" } 1 .. 40)),
	join("\n", ('t') x 40), 'receipts for 40 of them, from the coordinator');
is(sqlstate(0, q{SELECT outbox.purge(older_than => '0')}), '55000',
	'purge() on the coordinator, which holds no shard: 55000');
like((psql(0, $db, q{SELECT outbox.purge(older_than => '0')}))[2], qr/Purge on the worker nodes/,
	'... saying where to purge');
my %held;
$held{ node_of_run("p-$_") }++ for 1 .. 40;
my $p1 = safe_psql(1, $db, q{SELECT outbox.purge(5, older_than => '0')});
is($p1, '5', 'purge(5) on worker1 purges a batch of 5');
$p1 += safe_psql(1, $db, q{SELECT outbox.purge(older_than => '0')});
my $p2 = safe_psql(2, $db, q{SELECT outbox.purge(older_than => '0')});
is("$p1 $p2", ($held{1} // 0) . ' ' . ($held{2} // 0),
	'each worker purges the completed commands of the shards it holds');
ok($p1 > 0 && $p2 > 0, "... both purged some ($p1 and $p2)");
is(safe_psql(0, $db, q{
	SELECT count(*) FROM outbox.purged p
	  JOIN outbox.events e ON e.run_id = p.run_id AND e.seq = p.seq AND e.command_id = p.command_id
	 WHERE p.run_id LIKE 'p-%'}), '40', 'a tombstone for each, matching its event (co-located)');
is(safe_psql(0, $db, q{SELECT (SELECT count(*) FROM outbox.receipts) || ' '
	|| (SELECT count(*) FROM outbox.commands WHERE run_id LIKE 'p-%') || ' '
	|| (SELECT count(*) FROM outbox.commands c WHERE run_id LIKE 'p-%'
		AND EXISTS (SELECT 1 FROM outbox.receipts r WHERE r.run_id = c.run_id))}),
	'0 20 0', 'the receipts went with their commands; the 20 published without a receipt are kept');
my ($rc, $out, $err) = psql(0, $db, 'SELECT outbox.verify(include_warnings => true)');
is($rc, 0, 'verify() on the coordinator is clean after the purges') or diag($err);

# The workers' purge turn: a kind whose retention is over at once.
safe_psql(0, $db, q{SELECT outbox.set_policy('quick', retention => '0 seconds');
	SELECT count(*) FROM (SELECT outbox.commit_decision('q-' || g, 1, 'placed', 'quick-q-' || g,
		'quick', '{}') FROM generate_series(1, 30) g) s});
is(publish_all('{quick}'), '30', 'the 30 commands of kind quick published');
safe_psql(0, $db, join('', map { "SELECT outbox.complete('q-$_', 'quick-q-$_');\n" } 1 .. 20));
ok(poll_until(0, $db, q{SELECT count(*) FROM outbox.purged WHERE run_id LIKE 'q-%'}, '20'),
	'the workers\' purge turns purge the 20 completed commands of kind quick');
is(safe_psql(0, $db, q{SELECT count(*) || ' ' || bool_and(status = 'published') FROM outbox.commands
	WHERE run_id LIKE 'q-%'}), '10 true', '... and keep the 10 without a receipt');
my %turn;
$turn{ node_of_run("q-$_") }++ for 1 .. 20;
ok(($turn{1} // 0) > 0 && ($turn{2} // 0) > 0, 'the purged ones were on both workers');

# --- wake-ups -------------------------------------------------------------------------------
# A publisher leases 10 commands on the workers for 8 seconds and dies.
safe_psql(0, $db, q{SELECT count(*) FROM (SELECT outbox.commit_decision('l-' || g, 1, 'placed', 'wake-l-' || g,
	'wake', '{}') FROM generate_series(1, 10) g) s});
my $dead = 0;
$dead += safe_psql($_, $db, q{SELECT count(*) FROM outbox.claim('dead-pub', 100, lease => '8 seconds', kinds => '{wake}')})
  for (1, 2);
is($dead, 10, 'a publisher that dies holds 10 leases of 8 seconds');

# Two relays on the workers that poll every 600 seconds: only the
# notifications of the workers' due looks can make them claim during
# this test.
my $relay = -x 'src/outbox-relay' ? 'src/outbox-relay' : 'outbox-relay';
my $dir = "$ENV{CITUS_DATA}/relay-150";
mkdir $dir;
my (%relays, %err);
for my $node (1, 2)
{
	my $o = '';
	$err{$node} = '';
	$relays{$node} = IPC::Run::start(
		[
			$relay, '--dsn', "host=127.0.0.1 port=$ports[$node] user=postgres dbname=$db",
			'--sink', "file:$dir/sink-$node.ndjson", '--worker', "relay-$node",
			'--kinds', 'wake', '--batch', '50', '--poll', '600', '--verbose'
		],
		'>', \$o, '2>', \$err{$node});
}
for my $node (1, 2)
{
	my $ok = 0;
	for (1 .. 100)
	{
		$relays{$node}->pump_nb;
		if ($err{$node} =~ /listening on channel/) { $ok = 1; last }
		Time::HiRes::usleep(100_000);
	}
	ok($ok, "the relay on worker$node listens") or diag($err{$node});
}
# their first claim (at start) is over
Time::HiRes::usleep(1_000_000);
is(safe_psql(0, $db, q{SELECT count(*) FROM outbox.commands WHERE kind = 'wake' AND owner LIKE 'relay-%'}),
	'0', 'the relays found nothing to claim at their start');

my $t0 = Time::HiRes::time();
safe_psql(0, $db, q{SELECT count(*) FROM (SELECT outbox.commit_decision('w-' || g, 1, 'placed', 'wake-w-' || g,
	'wake', '{}') FROM generate_series(1, 20) g) s});
ok(poll_until(0, $db, q{SELECT count(*) FROM outbox.commands WHERE run_id LIKE 'w-%' AND status = 'published'}, '20'),
	'20 decisions from the coordinator are published by relays polling every 600 s');
note(sprintf('published %.1f s after the commit', Time::HiRes::time() - $t0));
my %w;
$w{ node_of_run("w-$_") }++ for 1 .. 20;
ok(($w{1} // 0) > 0 && ($w{2} // 0) > 0, '... from shards on both workers');

safe_psql(0, $db, q{SELECT outbox.commit_decision('nb-1', 1, 'placed', 'wake-nb-1', 'wake', '{}',
	not_before => now() + interval '3 seconds')});
$t0 = Time::HiRes::time();
ok(poll_until(0, $db, q{SELECT status FROM outbox.commands WHERE run_id = 'nb-1'}, 'published'),
	'a decision with a not_before 3 s ahead is published when its time comes');
note(sprintf('published %.1f s after the commit', Time::HiRes::time() - $t0));
is(safe_psql(0, $db, q{SELECT published_at >= available_at FROM outbox.commands WHERE run_id = 'nb-1'}), 't',
	'... not before it');
ok(poll_until(0, $db, q{SELECT count(*) FROM outbox.commands WHERE run_id LIKE 'l-%' AND status = 'published'
	AND owner LIKE 'relay-%'}, '10'),
	'the dead publisher\'s 10 leases are taken over when they expire');
# Coordinator transactions that run 3 s before their commit, longer than
# the due look goes back for decisions routed from the coordinator: the
# look cannot find them, and nothing else is due to wake the relays; the
# trigger on the shards wakes the worker of the node each commits on, at
# its commit (one run: one node, one-phase; runs on both workers:
# two-phase, woken at COMMIT PREPARED).
is(safe_psql(0, $db, q{SELECT count(*) FROM outbox.commands WHERE status IN ('pending', 'sending')}), '0',
	'nothing is pending or leased now');
my ($one, $two) = ('', '');
for my $g (1 .. 40)
{
	$one = "lt1-$g" if !$one && node_of_run("lt1-$g") == 1;
}
my $runs2 = join(', ', map { "'lt2-$_'" } 1 .. 6);
my $nodes2 = join('', sort map { node_of_run("lt2-$_") } 1 .. 6);
like($nodes2, qr/1.*2/, 'the second transaction\'s runs are on both workers');
my ($lrc, $lout, $lerr) = psql(0, $db, qq{
	BEGIN;
	SELECT outbox.commit_decision('$one', 1, 'placed', 'wake-$one', 'wake', '{}');
	SELECT pg_sleep(3);
	COMMIT;
	SET citus.log_remote_commands = on;
	BEGIN;
	SELECT count(*) FROM (SELECT outbox.commit_decision(r, 1, 'placed', 'wake-' || r, 'wake', '{}')
							FROM unnest(ARRAY[$runs2]) r) s;
	SELECT pg_sleep(3);
	COMMIT;});
is($lrc, 0, 'a one-run and a two-node transaction, each 3 s long, commit') or diag($lerr);
like($lerr, qr/issuing COMMIT PREPARED/, '... the second with two-phase commit');
ok(poll_until(0, $db, q{SELECT count(*) FROM outbox.commands WHERE run_id LIKE 'lt%' AND status = 'published'}, '7'),
	'their 7 decisions are published by the relays polling every 600 s');
for my $node (1, 2)
{
	$relays{$node}->signal('TERM');
	$relays{$node}->finish;
}

# --- checks, views and metrics from the coordinator -----------------------------------------
ok(poll_until(0, $db, qq{SELECT count(*) FROM outbox.metrics_checks()
	WHERE violations = 0 AND computed_timestamp_seconds > $distributed_at}, '5'),
	'the coordinator\'s worker counts the five checks over the cluster: no violation');
safe_psql(0, $db, q{CREATE TABLE public.saved_event AS SELECT * FROM outbox.events WHERE run_id = 'p-50';
	DELETE FROM outbox.events WHERE run_id = 'p-50'});
ok(poll_until(0, $db, q{SELECT violations FROM outbox.metrics_checks() WHERE check_name = 'orphan_commands'}, '1'),
	'a command whose event went missing on a worker is counted by the coordinator\'s worker');
is(safe_psql(0, $db, q{SELECT violations || ' ' || sample::text FROM outbox.conservation WHERE check_name = 'orphan_commands'}),
	'1 {ship-p-50}', 'outbox.conservation on the coordinator shows it');
like((psql(0, $db, 'SELECT outbox.verify()'))[2], qr/orphan_commands found 1 violation/,
	'verify() on the coordinator raises it');
safe_psql(0, $db, q{INSERT INTO outbox.events SELECT * FROM public.saved_event; DROP TABLE public.saved_event});
ok(poll_until(0, $db, q{SELECT violations FROM outbox.metrics_checks() WHERE check_name = 'orphan_commands'}, '0'),
	'... and no longer once the event is back');
for my $node (1, 2)
{
	is(safe_psql($node, $db, q{SELECT count(*) FROM outbox.metrics_checks() WHERE violations IS NOT NULL}), '0',
		node_name($node) . '\'s worker counts no check of the distributed tables');
}

# The backlog of a kind, in known states, from the coordinator.
safe_psql(0, $db, q{
	SELECT count(*) FROM (SELECT outbox.commit_decision('h-' || g, 1, 'placed', 'hold-h-' || g,
		'hold', '{}') FROM generate_series(1, 7) g) s;
	SELECT count(*) FROM (SELECT outbox.commit_decision('hd-' || g, 1, 'placed', 'hold-hd-' || g,
		'hold', '{}', not_before => now() + interval '1 hour') FROM generate_series(1, 3) g) s});
my $live = 0;
for my $node (1, 2)
{
	$live += safe_psql($node, $db, q{SELECT count(*) FROM outbox.claim('holder', 1, lease => '10 minutes', kinds => '{hold}');});
}
is($live, 2, 'two commands of kind hold leased, one on each worker');
is(safe_psql(0, $db, q{SELECT string_agg(status || ':' || state || ':' || commands, ' ' ORDER BY status, state)
	FROM outbox.metrics_backlog() WHERE kind = 'hold'}),
	'pending:delayed:3 pending:ready:5 sending:live:2',
	'metrics_backlog() on the coordinator counts the whole cluster');
is(safe_psql(0, $db, q{SELECT string_agg(status || ':' || commands || ':' || delayed, ' ' ORDER BY status)
	FROM outbox.backlog WHERE kind = 'hold'}), 'pending:8:3 sending:2:0',
	'outbox.backlog on the coordinator likewise');
is(safe_psql(0, $db, q{SELECT count(*) FROM outbox.leases WHERE kind = 'hold' AND NOT expired}), '2',
	'outbox.leases on the coordinator lists both leases');

# --- resolve, requeue -----------------------------------------------------------------------
safe_psql(0, $db, q{SELECT outbox.set_policy('manual', takeover => 'manual', max_deliveries => 1);
	SELECT count(*) FROM (SELECT outbox.commit_decision('m-' || g, 1, 'placed', 'manual-m-' || g,
		'manual', '{}') FROM generate_series(1, 3) g) s});
my $m = 0;
$m += safe_psql($_, $db, q{SELECT count(*) FROM outbox.claim('lost', 10, lease => '1 second', kinds => '{manual}')})
  for (1, 2);
is($m, 3, 'three commands of a manual kind leased');
ok(poll_until(0, $db, q{SELECT count(*) FROM outbox.dead_letters WHERE status = 'uncertain' AND kind = 'manual'}, '3'),
	'their expired leases are settled uncertain by the workers\' sweeps');
($rc, $out, $err) = psql(0, $db, q{
	SELECT outbox.resolve('m-1', 'manual-m-1', 'published');
	SELECT outbox.resolve('m-2', 'manual-m-2', 'retry');
	SELECT outbox.resolve('m-3', 'manual-m-3', 'dead');});
is($rc, 0, 'resolve published, retry and dead from the coordinator') or diag($err);
is(safe_psql(0, $db, q{SELECT string_agg(run_id || ':' || status || ':' || (published_at IS NOT NULL)
		|| ':' || (due_at IS NOT NULL) || ':' || coalesce(owner, '-'), ' ' ORDER BY run_id)
	FROM outbox.commands WHERE kind = 'manual'}),
	'm-1:published:true:false:lost m-2:pending:false:true:- m-3:dead:false:false:lost',
	'... each settled as asked');
like(safe_psql(0, $db, q{SELECT last_error FROM outbox.commands WHERE run_id = 'm-3'}), qr/; resolved as dead$/,
	'... the dead one says so after its error');
is(sqlstate(0, q{SELECT outbox.resolve('m-1', 'manual-m-1', 'dead')}), '55000',
	'resolve of a command that is not uncertain: 55000');
is(sqlstate(0, q{SELECT outbox.resolve('m-9', 'manual-m-9', 'dead')}), 'OB002',
	'resolve of an unknown command: OB002');
is(sqlstate(0, q{SELECT outbox.resolve('p-1', 'ship-p-1', 'dead')}), '55000',
	'resolve of a purged command: 55000');
safe_psql(0, $db, q{SELECT outbox.requeue('m-3', 'manual-m-3')});
is(safe_psql(0, $db, q{SELECT status || ':' || (due_at = available_at) FROM outbox.commands WHERE run_id = 'm-3'}),
	'pending:true', 'requeue from the coordinator makes the dead one pending');
my $mq = 0;
$mq += safe_psql($_, $db, q{SELECT count(outbox.ack('again', token)) FROM outbox.claim('again', 10, kinds => '{manual}')})
  for (1, 2);
is($mq, 2, 'the retried and the requeued command are claimed and acked on their nodes');

# --- rotate_lease_key -----------------------------------------------------------------------
safe_psql(0, $db, q{SELECT count(*) FROM (SELECT outbox.commit_decision('k-' || g, 1, 'placed', 'rot-k-' || g,
	'rot', '{}') FROM generate_series(1, 20) g) s});
my @tokens;
push @tokens, split(/\n/, safe_psql($_, $db, q{SELECT token FROM outbox.claim('rot-pub', 1, kinds => '{rot}')}))
  for (1, 2);
is(scalar(@tokens), 2, 'a lease on each worker');
# A session on every node that has checked both tokens (and keeps the key).
my @s = map { session($_, $db) } @NODES;
my $renew = join('', map { "SELECT outbox.renew('rot-pub', '$_') IS NOT NULL;\n" } @tokens);
for my $node (@NODES)
{
	is(session_query($s[$node], $renew), "t\nt", node_name($node) . ' accepts both tokens');
}
my $old_key = safe_psql(0, $db, q{SELECT encode(key, 'hex') FROM outbox.lease_key});
($rc, $out, $err) = psql(0, $db, "SET citus.log_remote_commands = on;\nSELECT outbox.rotate_lease_key()");
is($rc, 0, 'rotate_lease_key() on the coordinator') or diag($err);
like($err, qr/COMMIT PREPARED/, '... writing every node\'s copy of lease_key, with two-phase commit');
my %keys = map { safe_psql($_, $db, q{SELECT encode(key, 'hex') FROM outbox.lease_key}) => 1 } @NODES;
is(join(' ', map { $_ eq $old_key ? 'old' : 'new' } keys %keys), 'new', 'every node reads the one new key');
for my $node (@NODES)
{
	$s[$node]->{err} = '';
	session_query($s[$node], join('', map { "SELECT outbox.renew('rot-pub', '$_');\n" } @tokens));
	my @refused = ($s[$node]->{err} =~ /lease_not_owned/g);
	is(scalar(@refused), 2,
		'after the rotation, the session on ' . node_name($node) . ' refuses both old tokens')
	  or diag($s[$node]->{err});
}
my @new;
push @new, split(/\n/, safe_psql($_, $db, q{SELECT token FROM outbox.claim('rot-pub', 1, kinds => '{rot}')}))
  for (1, 2);
for my $node (@NODES)
{
	is(session_query($s[$node], join('', map { "SELECT outbox.renew('rot-pub', '$_') IS NOT NULL;\n" } @new)),
		"t\nt", node_name($node) . ' accepts the tokens made under the new key');
}
session_end($_) for @s;

# --- a shard moved under a session that claimed before ----------------------------------------
safe_psql(0, $db, q{SELECT count(*) FROM (SELECT outbox.commit_decision('mv-' || g, 1, 'placed', 'move-mv-' || g,
	'move', '{}') FROM generate_series(1, 40) g) s});
my %on_w1 = map { $_ => 1 } split /,/, safe_psql(0, $db, qq{
	SELECT string_agg(s.shardid::text, ',') FROM pg_dist_shard s
	  JOIN pg_dist_placement p ON p.shardid = s.shardid JOIN pg_dist_node n ON n.groupid = p.groupid
	 WHERE s.logicalrelid = 'outbox.commands'::regclass AND n.nodeport = $ports[1]});
my %per_shard = map { split /\|/ } split /\n/, safe_psql(0, $db, q{
	SELECT s || '|' || n FROM (SELECT get_shard_id_for_distribution_column('outbox.commands', run_id) AS s,
		count(*) AS n FROM outbox.commands WHERE kind = 'move' GROUP BY 1) x});
my ($moved) = sort { $per_shard{$b} <=> $per_shard{$a} || $a <=> $b } grep { $on_w1{$_} } keys %per_shard;
ok(defined $moved, 'a shard on worker1 holds commands of kind move');
my $on_w2 = 0;
$on_w2 += $per_shard{$_} for grep { !$on_w1{$_} } keys %per_shard;
my $s2 = session(2, $db);
is(session_query($s2, q{SELECT count(*) FROM outbox.claim('mover', 100, kinds => '{move}');}), $on_w2,
	'a session on worker2 claims the commands of its own shards');
($rc, $out, $err) = psql(0, $db, qq{
	SELECT citus_move_shard_placement($moved, '127.0.0.1', $ports[1], '127.0.0.1', $ports[2],
									  shard_transfer_mode => 'block_writes')});
is($rc, 0, 'that shard group moves from worker1 to worker2') or diag($err);
is(session_query($s2, q{SELECT count(*) FROM outbox.claim('mover', 100, kinds => '{move}');}), $per_shard{$moved},
	'the same session\'s next claim serves the shard moved in (its shard list was invalidated)');
session_end($s2);
my $left_w1 = 0;
$left_w1 += $per_shard{$_} for grep { $on_w1{$_} && $_ != $moved } keys %per_shard;
is(safe_psql(1, $db, q{SELECT count(*) FROM outbox.claim('mover', 100, kinds => '{move}')}), $left_w1,
	'worker1 claims those of the shards it kept, none of the moved one');

# --- index upkeep of a worker's shards --------------------------------------------------------
# 60,000 rows through one of worker1's shards of commands (written into
# the shard directly, then deleted and vacuumed) leave its primary key's
# index mostly empty: worker1's worker rebuilds it.
my ($bloated) = grep { $_ != $moved } sort { $a <=> $b } keys %on_w1;
my $w1_log = "$ENV{CITUS_DATA}/" . node_name(1) . '/server.log';
my $w1_at = -s $w1_log;
safe_psql(1, $db, qq{
	INSERT INTO outbox.commands_$bloated (command_id, run_id, seq, kind, available_at, due_at, payload)
	SELECT 'bloat-' || g, 'bloat-' || g, 1, 'bloat', now(), now(), '{}' FROM generate_series(1, 60000) g;
	DELETE FROM outbox.commands_$bloated WHERE kind = 'bloat';
	VACUUM outbox.commands_$bloated;});
my $kb_before = safe_psql(1, $db, "SELECT pg_relation_size('outbox.commands_pkey_$bloated') / 1024");
ok($kb_before >= 1024, "the shard's primary key index takes $kb_before kB");
safe_psql(1, 'postgres', q{ALTER SYSTEM SET outbox.index_check_interval = '1s'; SELECT pg_reload_conf()});
my $rebuilt = 0;
for (1 .. 600)
{
	open(my $fh, '<', $w1_log) or die "$w1_log: $!";
	seek($fh, $w1_at, 0);
	$rebuilt = grep { /outbox upkeep rebuilt index "commands_pkey_$bloated"/ } <$fh>;
	close $fh;
	last if $rebuilt;
	Time::HiRes::usleep(100_000);
}
psql(1, 'postgres', q{ALTER SYSTEM RESET outbox.index_check_interval; SELECT pg_reload_conf()});
ok($rebuilt, "worker1's outbox worker rebuilt the shard's index commands_pkey_$bloated");
cmp_ok(safe_psql(1, $db, "SELECT pg_relation_size('outbox.commands_pkey_$bloated') / 1024"), '<', $kb_before / 4,
	'... which is much smaller now');
is(safe_psql(1, $db, qq{SELECT count(*) FROM pg_index WHERE indexrelid = 'outbox.commands_pkey_$bloated'::regclass
	AND indisvalid AND indisprimary}), '1', '... a valid primary key still');

# --- nothing went wrong in the workers' rounds ---------------------------------------------
for my $node (@NODES)
{
	is(safe_psql($node, $db, q{SELECT coalesce(last_error, '') FROM outbox.workers WHERE database = current_database()}), '',
		node_name($node) . '\'s outbox worker had no failed round');
}
is(safe_psql(0, $db, q{SELECT last_purged FROM outbox.workers WHERE database = current_database()}), '0', 'the coordinator\'s worker purged nothing');

# --- undistribute: the sessions from before see their own tables again ---------------------
($rc, $out, $err) = psql_ddl(0, $db, 'SELECT outbox.undistribute()');
is($rc, 0, 'undistribute() succeeds') or diag($err);
$s1->{err} = '';
is(session_query($s1, q{SELECT count(*) FROM outbox.claim('late', 5);}), '0',
	'the session on worker1 claims from its own, empty, outbox again');
is($s1->{err}, '', '... without an error');
is(session_query($s0, q{SELECT count(*) FROM outbox.claim('late', 1, kinds => '{hold}');}), '1',
	'the session on the coordinator claims from the coordinator\'s tables again');
session_end($s1);
session_end($s0);
($rc, $out, $err) = psql(0, $db, 'SELECT outbox.verify()');
is($rc, 0, 'verify() is clean on the single node') or diag($err);
is(safe_psql(0, $db, q{SELECT count(*) FROM outbox.purged}), '60', 'the 60 tombstones are back on the coordinator');
($rc, $out, $err) = psql_ddl(0, $db, 'DROP EXTENSION outbox');
is($rc, 0, 'DROP EXTENSION outbox') or diag($err);

done_testing();
