# outbox-relay --citus on a real Citus cluster (docs/citus.md, docs/relay.md):
# pointed at the coordinator, a relay runs one child relay per node that
# holds shards of the distributed outbox.  Its refusals (no Citus, a shared
# stdout, a bad --citus-refresh) and the undistributed outbox (one relay on
# the coordinator); then a relay killed with kill -9 (the supervisor and its
# children, by pid) in the middle of its batches on both workers, its leases
# taken over on every shard by two other relays --citus draining through the
# coordinator into outbox-receiver, while commands keep coming; a child
# killed and started again by its supervisor; a shard group moved
# (citus_move_shard_placement) and a rebalance (citus_rebalance_start, the
# coordinator made to take shards) in the middle of the drain, the
# supervisors finding the coordinator's new shards; every command
# delivered, applied once, duplicates only with their command_id;
# verify() clean over the whole cluster; --drain with a file per node, as
# a role that is only a publisher; the metrics port of each child.
# (Business rows with their decisions, 200 runs, through a distributed
# function and from the coordinator, and the rollbacks, are test 140's.)
use strict;
use warnings;
use FindBin;
use lib $FindBin::RealBin;
use CitusNodes;
use IO::Socket::INET ();
use IPC::Run ();
use POSIX ();
use Test::More;
use Time::HiRes ();

my @ports = split ' ', $ENV{CITUS_PORTS};
my $relay = -x 'src/outbox-relay' ? 'src/outbox-relay' : 'outbox-relay';
my $receiver = 'src/outbox-receiver';
die "outbox-receiver not built at $receiver (run make)" unless -x $receiver;
my $dir = "$ENV{CITUS_DATA}/relay-160";
mkdir $dir;

# Every process this file starts, killed at the end whatever happens.
my @spawned;
my $producer_pid;
my @supervisor_logs;
END
{
	my @pids = grep { $_ } @spawned, $producer_pid;
	for my $log (@supervisor_logs)
	{
		my ($c) = children($log);
		push @pids, values %$c;
	}
	kill 'KILL', grep { alive($_) } @pids;
}

# Whether a process exists and is not a zombie.
sub alive
{
	my ($pid) = @_;
	open(my $fh, '<', "/proc/$pid/stat") or return 0;
	my $stat = <$fh> // '';
	close $fh;
	return $stat !~ /^\d+ \(.*\) Z/;
}

# Start a program in the background, stdout and stderr appended to files.
sub spawn
{
	my ($out, $err, @cmd) = @_;
	my $pid = fork() // die "fork: $!";
	if ($pid == 0)
	{
		open(STDIN, '<', '/dev/null');
		open(STDOUT, '>>', $out) or POSIX::_exit(127);
		open(STDERR, '>>', $err) or POSIX::_exit(127);
		exec(@cmd) or POSIX::_exit(127);
	}
	push @spawned, $pid;
	return $pid;
}

# Wait for a spawned process to exit; its exit status, or undef (killed
# after $secs seconds).
sub wait_exit
{
	my ($pid, $secs) = @_;
	for (1 .. ($secs // 60) * 10)
	{
		return $? >> 8 if waitpid($pid, POSIX::WNOHANG()) == $pid;
		Time::HiRes::usleep(100_000);
	}
	kill 'KILL', $pid;
	waitpid($pid, 0);
	return undef;
}

# Run a relay to its end; (exit status, its stderr).
sub run_relay
{
	my (@args) = @_;
	my ($o, $e) = ('', '');
	IPC::Run::run([ $relay, @args ], '<', \undef, '>', \$o, '2>', \$e, IPC::Run::timeout(120));
	return ($? >> 8, $e);
}

sub slurp
{
	my ($f) = @_;
	open(my $fh, '<', $f) or return '';
	local $/;
	my $s = <$fh>;
	close $fh;
	return $s;
}

# The children a supervisor's log names: { port => pid } of the last
# started on each node, and { port => slot }.
sub children
{
	my ($log) = @_;
	my (%pid, %slot);
	for (split /\n/, slurp($log // ''))
	{
		if (/--citus: node 127\.0\.0\.1:(\d+): relay (\d+) started \(slot (\d+)\)/)
		{
			$pid{$1} = $2;
			$slot{$1} = $3;
		}
	}
	return (\%pid, \%slot);
}

# Poll a Perl condition (up to $secs seconds).
sub wait_for
{
	my ($secs, $what, $cond) = @_;
	for (1 .. $secs * 5)
	{
		return 1 if $cond->();
		Time::HiRes::usleep(200_000);
	}
	diag("gave up waiting for $what");
	return 0;
}

# A query over the killed relay's leases (c: run_id, command_id, shard,
# delivered: the receiver has its receipt) and the node holding each (n).
# The leases are read first, in a CTE: Citus joins no distributed table
# with its metadata tables directly.
sub victim_leases
{
	my ($select) = @_;
	return qq{
		WITH c AS MATERIALIZED (
			SELECT c.run_id, c.command_id,
				   get_shard_id_for_distribution_column('outbox.commands', c.run_id) AS shard,
				   EXISTS (SELECT 1 FROM outbox.receipts r
							WHERE r.run_id = c.run_id AND r.command_id = c.command_id) AS delivered
			  FROM outbox.commands c WHERE c.status = 'sending' AND c.owner LIKE 'victim@%')
		SELECT $select FROM c JOIN pg_dist_placement p ON p.shardid = c.shard
		  JOIN pg_dist_node n ON n.groupid = p.groupid};
}

# --- refusals --------------------------------------------------------------------------
safe_psql(0, 'postgres', 'CREATE DATABASE citus_relay_none');
safe_psql(0, 'citus_relay_none', 'CREATE EXTENSION outbox');
my ($rc, $err) = run_relay('--citus', '--dsn', "host=127.0.0.1 port=$ports[0] user=postgres dbname=citus_relay_none",
	'--sink', "file:$dir/none.ndjson", '--drain');
is($rc, 1, '--citus on a database without Citus: exit 1');
like($err, qr/--citus: database "citus_relay_none" has no Citus/, '... saying that it has no Citus');
safe_psql(0, 'postgres', 'DROP DATABASE citus_relay_none');

my $db = citus_database('citus_relay');
my $coord = "host=127.0.0.1 port=$ports[0] user=postgres dbname=$db";
($rc, $err) = run_relay('--citus', '--dsn', $coord, '--sink', "file:$dir/x.ndjson", '--drain');
is($rc, 1, '--citus on a database without the outbox: exit 1');
like($err, qr/has no outbox extension/, '... saying so');
($rc, $err) = run_relay('--citus', '--citus-refresh', '0', '--dsn', $coord, '--sink', 'stdout');
is($rc, 2, '--citus-refresh 0: exit 2');
($rc, $err) = run_relay('--citus', '--dsn', $coord, '--sink', 'stdout', '--drain');
is($rc, 2, '--citus with the stdout sink on a pipe: exit 2');
like($err, qr/stdout sink would be shared/, '... saying that the nodes\' relays would share it');

# --- an outbox not distributed: one relay, on the coordinator's own tables -------------------
safe_psql(0, $db, 'CREATE EXTENSION outbox');
safe_psql(0, $db, q{SELECT outbox.set_policy('ship', max_deliveries => 50)});
safe_psql(0, $db, q{SELECT count(*) FROM (SELECT outbox.commit_decision('pre-' || g, 1, 'placed', 'ship-pre-' || g,
	'ship', '{}') FROM generate_series(1, 5) g) s});
($rc, $err) = run_relay('--citus', '--dsn', $coord, '--sink', "file:$dir/pre.ndjson", '--drain', '--worker', 'pre');
is($rc, 0, '--citus --drain on an undistributed outbox: exit 0') or diag($err);
like($err, qr/coordinator \(outbox not distributed\): relay \d+ started \(slot 0\)/,
	'... one relay, on the coordinator');
is(scalar(() = slurp("$dir/pre.ndjson.0") =~ /"command_id":"ship-pre-/g), 5,
	'... which published the 5 commands into the sink\'s file of slot 0');
is(safe_psql(0, $db, q{SELECT string_agg(DISTINCT owner || ':' || status, ',') FROM outbox.commands}),
	'pre:published', '... under the worker name given');

# --- distribute, produce --------------------------------------------------------------------
safe_psql(0, $db, 'SET citus.shard_count = 8; SELECT outbox.distribute()');
safe_psql(0, $db, q{SELECT outbox.register_consumer('outbox-receiver', 'postgres')});
# Each delivery takes the receiver 10 ms, so that batches last.
safe_psql(0, $db, q{SELECT count(*) FROM (SELECT outbox.commit_decision('bulk-' || g, 1, 'placed',
	'ship-bulk-' || g, 'ship', '{"test_sleep_ms": 10}') FROM generate_series(1, 600) g) s});
my %log_at = map { $_ => -s "$ENV{CITUS_DATA}/" . node_name($_) . '/server.log' } @NODES;

my $rpid = spawn("$dir/receiver.out", "$dir/receiver.err", $receiver, '--port-file', "$dir/receiver.port",
	'--dsn', $coord, '--log', "$dir/receiver.log");
ok(wait_for(30, 'the receiver', sub { -s "$dir/receiver.port" }), 'the receiver listens');
(my $rport = slurp("$dir/receiver.port")) =~ s/\s+//g;
my $sink = "http://127.0.0.1:$rport/";
my @common = ('--dsn', $coord, '--sink', $sink, '--poll', '0.2', '--lease', '5', '--citus-refresh', '1');

# --- a relay killed in the middle of its batches ----------------------------------------------
my $vlog = "$dir/victim.log";
push @supervisor_logs, $vlog;
my $victim = spawn("$dir/victim.out", $vlog, $relay, '--citus', @common, '--worker', 'victim', '--batch', '100');
ok(wait_for(60, 'the victim\'s batches on both workers', sub {
	(psql(0, $db, victim_leases(q{count(DISTINCT n.nodeport) || ' '
		|| count(DISTINCT n.nodeport) FILTER (WHERE c.delivered)})))[1] eq '2 2' }),
	'the relay has batches in flight on both workers, partly delivered');
my ($vchildren) = children($vlog);
is(join(' ', sort keys %$vchildren), join(' ', sort @ports[1, 2]),
	'its supervisor started a relay for each worker');
kill 'KILL', $victim, values %$vchildren;
waitpid($victim, 0);
my @victim_leases = split /\n/, safe_psql(0, $db, victim_leases(
	q{c.run_id || '|' || c.command_id || '|' || n.nodeport || '|' || c.shard || '|' || c.delivered}));
my (%victim_shards, @victim_delivered);
for (@victim_leases)
{
	my ($run, $id, $port, $shard, $delivered) = split /\|/;
	$victim_shards{$port}{$shard} = 1;
	push @victim_delivered, $id if $delivered eq 'true';
}
note(scalar(@victim_leases) . ' leases held by the killed relay, ' . scalar(@victim_delivered)
	  . ' of them delivered and not acked');
ok(@victim_delivered > 0, 'some of them were delivered, not acked: the relay died in the middle of its batches');
ok(keys %{ $victim_shards{ $ports[1] } } >= 2 && keys %{ $victim_shards{ $ports[2] } } >= 2,
	'the killed relay held leases on several shards of each worker')
  or diag(explain(\%victim_shards));
ok(wait_for(10, 'the killed children', sub { !grep { alive($_) } values %$vchildren }),
	'the supervisor and its children are gone');

# --- two relays draining through the coordinator, commands still coming -----------------------
my %logs = map { $_ => "$dir/relay-$_.log" } (1, 2);
my %sup;
push @supervisor_logs, values %logs;
$sup{1} = spawn("$dir/relay-1.out", $logs{1}, $relay, '--citus', @common, '--worker', 'relay-1', '--batch', '10');
# relay-2 serves each child's metrics on a port of its own: BASE + slot.
# The children bind them only after others have opened connections, so
# BASE is taken below the kernel's ephemeral range (32768 and up), where
# an outgoing connection cannot take one of them in between.
my $mbase;
for (1 .. 50)
{
	my $p = 20000 + int(rand(12000));
	my @s = map { IO::Socket::INET->new(LocalAddr => '127.0.0.1', LocalPort => $p + $_, Listen => 1, ReuseAddr => 1) } 0 .. 2;
	my $free = !grep { !defined } @s;
	$_ && $_->close for @s;
	if ($free) { $mbase = $p; last; }
}
$sup{2} = spawn("$dir/relay-2.out", $logs{2}, $relay, '--citus', @common, '--worker', 'relay-2', '--batch', '10',
	'--metrics', "127.0.0.1:$mbase");

# A producer of single-run decisions from the coordinator until told to stop.
my $stop_file = "$dir/producer.stop";
$producer_pid = fork() // die "fork: $!";
if ($producer_pid == 0)
{
	my ($i, $ok, $failed) = (0, 0, 0);
	until (-e $stop_file)
	{
		my $sql = join('', map {
			$i++;
			"SELECT outbox.commit_decision('live-$i', 1, 'placed', 'ship-live-$i', 'ship', '{\"test_sleep_ms\": 10}');\n"
		} 1 .. 10);
		my ($r) = psql(0, $db, $sql);
		$r == 0 ? $ok++ : $failed++;
		Time::HiRes::usleep(500_000);
	}
	open(my $fh, '>', "$dir/producer.result");
	print $fh "$ok $failed\n";
	close $fh;
	POSIX::_exit(0);
}

ok(wait_for(60, 'the takeover', sub {
	my $list = join(',', map { my @f = split /\|/; "('$f[0]','$f[1]')" } @victim_leases);
	(psql(0, $db, qq{SELECT count(*) FROM outbox.commands
		WHERE (run_id, command_id) IN ($list) AND (owner LIKE 'victim@%' OR status <> 'published')}))[1] eq '0' }),
	'the killed relay\'s leases are taken over and published');

# kill -9 one child of relay-1 while it has a batch: its supervisor starts another
my ($c1) = children($logs{1});
my $w1 = $ports[1];
ok(wait_for(60, 'a batch of relay-1 on worker1', sub {
	(psql(0, $db, qq{SELECT count(*) > 0 FROM outbox.commands
		WHERE status = 'sending' AND owner = 'relay-1\@127.0.0.1:$w1'}))[1] eq 't' }),
	'relay-1\'s child on worker1 has a batch');
kill 'KILL', $c1->{$w1};
ok(wait_for(30, 'the restart', sub { my ($c) = children($logs{1}); ($c->{$w1} // 0) != $c1->{$w1} }),
	'its supervisor starts a relay for worker1 again');
like(slurp($logs{1}), qr/node 127\.0\.0\.1:$w1: relay $c1->{$w1} was killed by signal 9/,
	'... after logging that the child was killed');

# --- a shard move and a rebalance in the middle of the drain ------------------------------------
# A backlog to drain while the shards move: 20 ms a delivery.
sub backlog
{
	my ($prefix) = @_;
	safe_psql(0, $db, qq{SELECT count(*) FROM (SELECT outbox.commit_decision('$prefix-' || g, 1, 'placed',
		'ship-$prefix-' || g, 'ship', '{"test_sleep_ms": 20}') FROM generate_series(1, 600) g) s});
}
backlog('mid1');
my ($busiest, $shard, $left) = busiest_shard($db, $ports[1]);
ok(defined $busiest, 'a shard on worker1 has unpublished commands');
note("$left commands of the shard to move are unpublished when it starts moving");
my ($mrc, $mout, $merr) = psql(0, $db, qq{
	SELECT citus_move_shard_placement($shard, '127.0.0.1', $ports[1], '127.0.0.1', $ports[2],
									  shard_transfer_mode => 'block_writes')});
is($mrc, 0, 'a shard group moves from worker1 to worker2 during the drain') or diag($merr);

backlog('mid2');
my $unpublished = safe_psql(0, $db, q{SELECT count(*) FROM outbox.commands WHERE status <> 'published'});
ok($unpublished > 0, 'commands are unpublished when the rebalance starts');
note("$unpublished unpublished when the rebalance starts");
my ($brc, $bout, $berr) = psql(0, $db, qq{
	SELECT citus_set_node_property('127.0.0.1', $ports[0], 'shouldhaveshards', true);
	SELECT citus_rebalance_start(shard_transfer_mode => 'block_writes');
	SELECT citus_rebalance_wait();
	SELECT state FROM pg_dist_background_job ORDER BY job_id DESC LIMIT 1});
is($brc, 0, 'citus_rebalance_start and citus_rebalance_wait') or diag($berr);
like($bout, qr/finished$/, '... the rebalance job finished');
note(safe_psql(0, $db, q{SELECT count(*) FROM outbox.commands WHERE status <> 'published'})
	  . ' unpublished when the rebalance ended');
my $moved = safe_psql(0, $db, qq{
	SELECT count(*) FROM pg_dist_shard s JOIN pg_dist_placement p ON p.shardid = s.shardid
	 WHERE s.logicalrelid = 'outbox.commands'::regclass AND p.groupid = 0});
ok($moved > 0, 'the rebalancer moved shards onto the coordinator');
note("$moved shards of outbox.commands on the coordinator after the rebalance");
ok(wait_for(30, 'relays for the coordinator', sub {
	my ($a) = children($logs{1});
	my ($b) = children($logs{2});
	$a->{ $ports[0] } && $b->{ $ports[0] } }),
	'both supervisors start a relay for the coordinator, which holds shards now');
ok(wait_for(120, 'a command published on the coordinator', sub {
	(psql(0, $db, qq{SELECT count(*) > 0 FROM outbox.commands
		WHERE status = 'published' AND owner LIKE 'relay-_\@127.0.0.1:$ports[0]'}))[1] eq 't' }),
	'the coordinator\'s shards are claimed and published by its relays');

# metrics: each child of relay-2 on BASE + its slot
my (undef, $slots) = children($logs{2});
my $metrics_ok = 0;
for my $port (@ports)
{
	my $s = IO::Socket::INET->new(PeerAddr => '127.0.0.1', PeerPort => $mbase + $slots->{$port}, Timeout => 5);
	next unless $s;
	print $s "GET /metrics HTTP/1.0\r\nHost: localhost\r\n\r\n";
	local $/;
	my $page = <$s> // '';
	$metrics_ok++ if $page =~ /outbox_relay_info\{worker="relay-2\@127\.0\.0\.1:$port"/;
}
is($metrics_ok, 3, 'each child of relay-2 serves its metrics on the base port + its slot, under its worker name');

# stop producing, then drain
open(my $sf, '>', $stop_file);
close $sf;
waitpid($producer_pid, 0);
my ($made, $made_failed) = split ' ', slurp("$dir/producer.result");
ok($made > 0, 'commands were produced during the drain, the move and the rebalance');
note("producer: $made statements of 10 decisions committed, $made_failed failed");
ok(wait_for(300, 'the drain', sub {
	(psql(0, $db, q{SELECT count(*) FROM outbox.commands WHERE status <> 'published'}))[1] eq '0' }),
	'the relays drain every command');
for my $r (1, 2)
{
	my ($c) = children($logs{$r});
	kill 'TERM', $sup{$r};
	is(wait_exit($sup{$r}, 60), 0, "relay-$r stops on SIGTERM with status 0");
	ok(!grep({ alive($_) } values %$c), "... and its children with it");
	like(slurp($logs{$r}), qr/--citus: summary: nodes=3 exit=0/, '... its summary names three nodes');
}

# --- what was delivered ------------------------------------------------------------------------
my %ids = map { $_ => 1 } split /\n/, safe_psql(0, $db,
	q{SELECT command_id FROM outbox.commands WHERE run_id NOT LIKE 'pre-%'});
my $total = keys %ids;
note("$total commands published through the receiver");
my (%accepted, %lines, @unknown);
for (split /\n/, slurp("$dir/receiver.log"))
{
	my ($id, $deliveries, $status, $acc) = split /\t/;
	push @unknown, $id unless $ids{$id};
	next unless $status eq '200';
	$lines{$id}++;
	$accepted{$id}++ if $acc eq '1';
}
is(scalar(@unknown), 0, 'every delivery names a command of the outbox (its command_id)')
  or diag(join(' ', @unknown[0 .. ($#unknown < 5 ? $#unknown : 5)]));
is(scalar(grep { !$lines{$_} } keys %ids), 0, 'every command was delivered at least once');
is(scalar(grep { ($accepted{$_} // 0) != 1 } keys %ids), 0,
	'each was applied exactly once: the others were duplicates of the same command_id');
my $dups = 0;
$dups += $lines{$_} - 1 for keys %lines;
note("$dups duplicate deliveries");
is(scalar(grep { ($lines{$_} // 0) < 2 } @victim_delivered), 0,
	'what the killed relay delivered without an ack was delivered again');
is(safe_psql(0, $db, q{SELECT count(*) || ' ' || count(DISTINCT (i.run_id, i.command_id))
	FROM outbox.inbox i JOIN outbox.commands c ON c.run_id = i.run_id AND c.command_id = i.command_id}),
	"$total $total", 'the inbox holds each command once, with its run');
is(safe_psql(0, $db, q{SELECT string_agg(DISTINCT split_part(owner, '@', 1), ' ') || ' '
		|| count(DISTINCT split_part(owner, '@', 2))
	FROM outbox.commands WHERE run_id NOT LIKE 'pre-%' AND owner NOT LIKE 'victim@%'}), 'relay-1 relay-2 3',
	'the commands were published by both relays (and what the killed relay acked by itself), on all three nodes');
($rc, undef, $err) = psql(0, $db, 'SELECT outbox.verify(include_warnings => true)');
is($rc, 0, 'verify() on the coordinator is clean over the whole cluster') or diag($err);

# --- --drain with a file per node, as a role that is only a publisher ----------------------------
safe_psql(0, $db, q{SELECT count(*) FROM (SELECT outbox.commit_decision('drain-' || g, 1, 'placed',
	'ship-drain-' || g, 'ship', '{}') FROM generate_series(1, 60) g) s});
safe_psql(0, $db, q{CREATE ROLE relay_160 LOGIN;
	SELECT format('GRANT %I TO relay_160', outbox.role('publisher')) \gexec});
($rc, $err) = run_relay('--citus', '--dsn', "host=127.0.0.1 port=$ports[0] user=relay_160 dbname=$db",
	'--sink', "file:$dir/drain.ndjson", '--drain', '--worker', 'drainer');
is($rc, 0, '--citus --drain: exit 0 when every node\'s relay found nothing') or diag($err);
my @per_node = map { scalar(() = slurp("$dir/drain.ndjson.$_") =~ /"command_id":"ship-drain-/g) } 0 .. 2;
is($per_node[0] + $per_node[1] + $per_node[2], 60, 'the 60 commands are in the files of the three slots');
is(scalar(grep { $_ > 0 } @per_node), 3, '... each node\'s in a file of its own') or diag("@per_node");
is(safe_psql(0, $db, q{SELECT count(*) FROM outbox.commands WHERE status <> 'published'}), '0',
	'... all published');
is(safe_psql(0, $db, q{SELECT string_agg(DISTINCT split_part(owner, '@', 1), ',') FROM outbox.commands
	WHERE run_id LIKE 'drain-%'}), 'drainer', '... under the worker names drainer@HOST:PORT');

for my $node (@NODES)
{
	my $file = "$ENV{CITUS_DATA}/" . node_name($node) . '/server.log';
	open(my $fh, '<', $file) or die "$file: $!";
	seek($fh, $log_at{$node}, 0);
	my @hits = grep { /ERROR:.*(could not create distributed plan|FOR UPDATE\/SHARE|complex joins)/ } <$fh>;
	close $fh;
	is(scalar(@hits), 0, node_name($node) . '\'s log has no Citus planning error')
	  or diag(join('', @hits[0 .. ($#hits < 4 ? $#hits : 4)]));
}

kill 'TERM', $rpid;
wait_exit($rpid, 30);
done_testing();
