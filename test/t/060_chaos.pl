# Chaos suite: nothing committed is lost, nothing rolled back is delivered,
# and every command takes effect exactly once, while publishers are killed
# with kill -9 and the server is stopped in immediate mode.
#
# 4 producers commit 20,000 decisions in transactions of 1 to 4 decisions,
# 10% of the transactions rolled back, lightly paced.  4 outbox-relay
# processes deliver to outbox-receiver, which applies each command in one
# transaction: outbox.inbox_accept, a business row, outbox.complete (and
# takes a few milliseconds per command, so that the relays stay busy and a
# kill lands mid-batch).  Every one to three seconds a random relay is
# killed with kill -9 and restarted; once, when about half of the
# decisions are committed, the server is stopped in immediate mode and
# started again.  The relays keep up to 4 requests in flight each.
#
# Then every command is classified, Jepsen-style, from three independent
# records: what the producers were told (committed, rolled back, or unknown
# when the connection died during COMMIT), what is in the database, and
# what the receiver saw:
#   ok          committed, published, applied once, receipt present
#   lost        committed (or present) but not published, not applied, or
#               without its receipt
#   unexpected  rolled back (or never produced) yet present, delivered or
#               applied; or applied twice
#   duplicated  deliveries answered 2xx beyond the first (absorbed by the
#               inbox), bounded by one batch per kill -9, plus one batch per
#               relay for the server stop
# and the extension's own checks must agree: outbox.conservation all zero
# and amcheck clean on every index of the extension.
#
# With OUTBOX_CHAOS_SINK=kafka (test 061_chaos_kafka.pl runs this file so)
# the relays publish to librdkafka's mock cluster (test/kafka-mock, as in
# test 052) instead, the broker answering 20 ms late so
# that the kills land mid-batch; what the broker holds is read back with
# kcat, and a command counts as delivered once per message carrying its
# command_id header: lost when committed but not in the topic, unexpected
# when rolled back yet in the topic, duplicated beyond its first message.
#
# With OUTBOX_CHAOS_STREAM=1 (tests 067 and 068 run this file so) the kind
# is written once into a stream of 4 partitions and batches of 20, and the
# relays publish its subscription (--stream, --subscription): the same
# chaos, the same classification, from the subscription's per-command
# status instead of outbox.commands.

use strict;
use warnings;

use File::Basename qw(dirname);
use POSIX qw(WNOHANG);
use Time::HiRes qw(usleep time);
use IPC::Run;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use FindBin;
use lib "$FindBin::RealBin/../perl";
use OutboxTest;
use OutboxBroker;

my $KAFKA = ($ENV{OUTBOX_CHAOS_SINK} // 'http') eq 'kafka';
my $STREAM = $ENV{OUTBOX_CHAOS_STREAM} ? 1 : 0;
# The receipts: a stream command's is next to its log table
# (outbox._stream_receipts) until the rotation keeps or removes it.
my $RECEIPTS = $STREAM
  ? '(SELECT command_id FROM outbox.receipts UNION ALL SELECT command_id FROM outbox._stream_receipts)'
  : 'outbox.receipts';

my $src = $ENV{OUTBOX_SRC} // dirname(__FILE__) . '/../..';
my $receiver = "$src/src/outbox-receiver";
die "outbox-receiver not built at $receiver (run make)" unless -x $receiver;
if ($KAFKA)
{
	ok(relay_has_sink('kafka'), 'outbox-relay was built with the kafka sink')
	  or BAIL_OUT('no kafka sink: install librdkafka-dev and rebuild');
}

my $PRODUCERS = 4;
my $DECISIONS = 20_000;
my $ROLLBACK = 0.10;
my $RELAYS = 4;
my $BATCH = 20;
my $LEASE = 3;
my $DEADLINE = 240;    # seconds for the whole chaos phase
my $PACE = 0.004;      # seconds each producer sleeps between transactions
my $APPLY_MS = 3;      # the receiver's extra time per delivery, keeps relays busy

my $tmp = PostgreSQL::Test::Utils::tempdir;
my $started = time();

my $node = PostgreSQL::Test::Cluster->new('chaos');
$node->init;
$node->append_conf(
	'postgresql.conf', qq(
shared_preload_libraries = 'outbox'
max_connections = 60
outbox.backoff_base = 100
outbox.backoff_max = 1000
outbox.max_deliveries = 1000
log_min_messages = warning
));
$node->start;
$node->safe_psql('postgres', 'CREATE EXTENSION outbox');
# The receiver's consumer name belongs to the role it connects as.
$node->safe_psql('postgres', q{SELECT outbox.register_consumer('chaos', current_user::text::regrole)});
$node->safe_psql('postgres', 'CREATE EXTENSION amcheck');
$node->safe_psql('postgres',
	'CREATE TABLE biz (command_id text NOT NULL, payload jsonb, applied_at timestamptz DEFAULT clock_timestamp())');
my $dsn = $node->connstr('postgres');

# Where each command's status is: (command_id, status, deliveries), and
# what runs before a query of it ($S).
my $STATUS_SQL = 'SELECT command_id, status, deliveries FROM outbox.commands';
my $S = '';
if ($STREAM)
{
	$node->safe_psql('postgres', qq{SELECT outbox.create_stream('chaos', 4, $BATCH);
SELECT outbox.create_subscription('chaos', 'chaos');
SELECT outbox.set_policy('chaos', stream => 'chaos');});
	# every command of the stream's log: published when its partition's
	# acked tick sees it, unless it failed in the subscription (retry,
	# waiting or dead, with its deliveries)
	$STATUS_SQL = q{SELECT l.command_id,
       coalesce(f.status, CASE WHEN pg_catalog.pg_visible_in_snapshot(l.xid, k.snap) THEN 'published' ELSE 'pending' END) AS status,
       coalesce(f.deliveries, 1) AS deliveries
  FROM outbox._stream_log l
  JOIN outbox.streams t ON t.stream_id = l.stream_id AND t.stream = 'chaos'
  JOIN outbox.stream_progress p ON p.subscription = 'chaos' AND p.part = l.part
  JOIN outbox.stream_ticks k ON k.stream_id = l.stream_id AND k.tick = p.acked_tick
  LEFT JOIN outbox.stream_failed f ON f.subscription = 'chaos' AND f.command_id = l.command_id};
	# the log's statistics lag behind it during the chaos, and a nested
	# loop over the log once took 75 s of the check loop's time
	$S = 'SET enable_nestloop = off; ';
}

# One query, errors tolerated (the server may be down): its output or undef.
sub try_query
{
	my ($sql) = @_;
	my ($ret, $out, $err) = $node->psql('postgres', $sql);
	return $ret == 0 ? $out : undef;
}

# ---------------------------------------------------------------------------
# Producers.  Each is a child process that feeds psql a script of its
# transactions; psql echoes a marker after each COMMIT or ROLLBACK, so the
# producer knows which transactions were acknowledged.  When the server goes
# away, the transaction in flight is "unknown" (its commit may or may not
# have happened) and the producer resumes after it once the server is back.
# It writes one line per command: id, committed | rolledback | unknown.
# ---------------------------------------------------------------------------
sub producer
{
	my ($p) = @_;
	my $per = $DECISIONS / $PRODUCERS;
	my @tx;
	my $n = 0;

	srand(7919 * $p);
	while ($n < $per)
	{
		my $size = 1 + int(rand(4));
		$size = $per - $n if $n + $size > $per;
		push @tx, { first => $n, size => $size, rb => (rand() < $ROLLBACK ? 1 : 0) };
		$n += $size;
	}

	my %status;
	my $next = 0;
	my $give_up = time() + $DEADLINE;
	while ($next < @tx && time() < $give_up)
	{
		my $script = "$tmp/producer-$p.sql";
		open(my $fh, '>', $script) or die;
		print $fh "\\echo START\n";
		for my $t ($next .. $#tx)
		{
			my $x = $tx[$t];
			print $fh "BEGIN;\n";
			for my $k ($x->{first} .. $x->{first} + $x->{size} - 1)
			{
				printf $fh
				  "SELECT outbox.commit_decision('run-p%d', %d, 'decided', 'p%d-%05d', 'chaos', '{\"p\": %d, \"n\": %d, \"test_sleep_ms\": %d}');\n",
				  $p, $k, $p, $k, $p, $k, $APPLY_MS;
			}
			print $fh ($x->{rb} ? "ROLLBACK;\n" : "COMMIT;\n");
			print $fh "\\echo T $t\n";
			# pace the producers, so that the chaos has time to happen
			print $fh "SELECT pg_catalog.pg_sleep($PACE);\n";
		}
		close($fh);

		my ($out, $err) = ('', '');
		IPC::Run::run([ 'psql', '-X', '-q', '-v', 'ON_ERROR_STOP=1', '-o', '/dev/null',
				'-d', $dsn, '-f', $script ],
			'<', \undef, '>', \$out, '2>', \$err);
		my $rc = $? >> 8;
		my $connected = $out =~ /^START$/m;
		my $last = $next - 1;
		while ($out =~ /^T (\d+)$/mg) { $last = $1; }
		for my $t ($next .. $last)
		{
			$status{$t} = $tx[$t]{rb} ? 'rolledback' : 'committed';
		}
		$next = $last + 1;
		last if $rc == 0 && $next >= @tx;
		# psql exits 2 when the connection goes, but 3 (ON_ERROR_STOP) when
		# the statement in flight is the one that learns of it
		my $conn_lost = $err =~
		  /server closed the connection|terminating connection|connection to server was lost|no connection to the server|could not (send|receive) data/;
		if ($rc == 3 && !$conn_lost)
		{
			# an SQL error that is not a lost connection: a bug
			open(my $e, '>>', "$tmp/producer-$p.errors");
			print $e "transaction $next: $err";
			close($e);
			$status{$next} = 'error';
			$next++;
			next;
		}
		if ($connected && $next < @tx)
		{
			# the connection died inside transaction $next
			$status{$next} = $tx[$next]{rb} ? 'rolledback' : 'unknown';
			$next++;
		}
		usleep(100_000) unless $connected;    # server still down
	}

	open(my $res, '>', "$tmp/producer-$p.result") or die;
	for my $t (0 .. $#tx)
	{
		my $st = $status{$t} // 'notrun';
		printf $res "p%d-%05d\t%s\n", $p, $_, $st
		  for $tx[$t]{first} .. $tx[$t]{first} + $tx[$t]{size} - 1;
	}
	close($res);
}

# ---------------------------------------------------------------------------
# Receiver and relays.
# ---------------------------------------------------------------------------
my $rlog = "$tmp/receiver.log";
my ($rpid, $port, $mock, $mock_pid, $bootstrap);
if ($KAFKA)
{
	my $mockbin = "$src/test/kafka-mock";
	($mock_pid, $mock, $bootstrap) = start_kafka_mock($mockbin, $tmp, 'chaos', 4);
	print $mock "rtt 20\n";
	ok(wait_match("$tmp/mock.out", qr/^ok 1$/m), 'the broker answers 20 ms late');
}
else
{
$rpid = spawn("$tmp/receiver.out", "$tmp/receiver.err", $receiver,
	'--port-file', "$tmp/receiver.port", '--dsn', $dsn, '--table', 'biz',
	'--consumer', 'chaos', '--log', $rlog);
my $wait_until = time() + $PostgreSQL::Test::Utils::timeout_default;
usleep(50_000) while !-s "$tmp/receiver.port" && time() < $wait_until;
ok(-s "$tmp/receiver.port", 'receiver listening');
$port = slurp_file("$tmp/receiver.port");
chomp $port;
}

my @relay_pid;
my @relay_gen = (0) x $RELAYS;
sub start_relay
{
	my ($i) = @_;
	my $name = "relay$i-g$relay_gen[$i]";
	$relay_gen[$i]++;
	$relay_pid[$i] = spawn("$tmp/$name.out", "$tmp/$name.err", 'outbox-relay',
		'--dsn', $dsn, '--sink', ($KAFKA ? "kafka://$bootstrap/chaos" : "http://127.0.0.1:$port/apply"),
		($STREAM ? ('--stream', 'chaos', '--subscription', 'chaos') : ('--batch', $BATCH)), '--lease', $LEASE, '--poll', '0.5', '--concurrency', 4,
		'--timeout', '5', '--worker', $name, ($STREAM ? ('-v') : ()));
}
start_relay($_) for 0 .. $RELAYS - 1;

my @prod_pid;
for my $p (1 .. $PRODUCERS)
{
	my $pid = fork() // die "fork: $!";
	if ($pid == 0)
	{
		producer($p);
		POSIX::_exit(0);
	}
	push @prod_pid, $pid;
}

# ---------------------------------------------------------------------------
# Chaos.
# ---------------------------------------------------------------------------
my $kills = 0;
my $crashed = 0;
my $unexpected_exits = 0;
my $producers_left = $PRODUCERS;
my $next_kill = time() + 1 + rand(2);
my $next_check = 0;
my $all_done = 0;
my $crash_at = $DECISIONS * (1 - $ROLLBACK) / 2;
my $production_secs;

while (time() - $started < $DEADLINE)
{
	for my $pid (@prod_pid)
	{
		next unless $pid;
		if (waitpid($pid, WNOHANG) == $pid)
		{
			$pid = 0;
			$producers_left--;
			$production_secs = time() - $started if $producers_left == 0;
		}
	}
	for my $i (0 .. $RELAYS - 1)
	{
		if (waitpid($relay_pid[$i], WNOHANG) == $relay_pid[$i])
		{
			diag("relay $i exited on its own with status " . ($? >> 8));
			$unexpected_exits++;
			start_relay($i);
		}
	}

	if (time() >= $next_check)
	{
		$next_check = time() + 0.25;
		my $c = try_query(
			"${S}SELECT count(*) || ' ' || count(*) FILTER (WHERE status <> 'published') FROM ($STATUS_SQL) c");
		if (defined $c && $c =~ /^(\d+) (\d+)$/)
		{
			my ($total, $open) = ($1, $2);
			if (!$crashed && $total >= $crash_at)
			{
				note("stopping the server in immediate mode at $total commands");
				$node->stop('immediate');
				$node->start;
				$crashed = 1;
			}
			if ($producers_left == 0 && $open == 0)
			{
				$all_done = 1;
				last;
			}
		}
	}

	if (time() >= $next_kill)
	{
		my $i = int(rand($RELAYS));
		kill 'KILL', $relay_pid[$i];
		waitpid($relay_pid[$i], 0);
		$kills++;
		start_relay($i);
		$next_kill = time() + 1 + rand(2);
	}
	usleep(50_000);
}
my $chaos_secs = time() - $started;

ok($all_done, 'every committed command published before the deadline');
ok($crashed, 'the server was stopped in immediate mode once');
cmp_ok($kills, '>=', 3, "relays were killed with kill -9 ($kills times)");
is($unexpected_exits, 0, 'no relay exited on its own');

# Stop: the relays exit 0 on SIGTERM; the producers are done.
for my $i (0 .. $RELAYS - 1)
{
	kill 'TERM', $relay_pid[$i];
}
for my $i (0 .. $RELAYS - 1)
{
	waitpid($relay_pid[$i], 0);
	is($? >> 8, 0, "relay $i exits 0 on SIGTERM");
}
for my $pid (grep { $_ } @prod_pid)
{
	kill 'KILL', $pid;
	waitpid($pid, 0);
}
if ($KAFKA)
{
	# what the broker holds: one line per message, its command_id header
	my $out = `kcat -C -b '$bootstrap' -t chaos -o beginning -e -q -f '%h\\n' 2>'$tmp/kcat.err'`;
	open(my $fh, '>', $rlog) or die;
	for my $line (split /\n/, $out)
	{
		my %h = map { split /=/, $_, 2 } split /,/, $line;
		print $fh "$h{command_id}\t$h{deliveries}\t200\n" if defined $h{command_id};
	}
	close($fh);
	ok(close($mock), 'mock cluster stopped');
	untrack_pid($mock_pid);
}
else
{
	kill 'TERM', $rpid;
	waitpid($rpid, 0);
}

# ---------------------------------------------------------------------------
# Classification.
# ---------------------------------------------------------------------------
my %produced;
for my $p (1 .. $PRODUCERS)
{
	my $f = "$tmp/producer-$p.result";
	ok(-f $f, "producer $p finished") or next;
	for (split /\n/, slurp_file($f))
	{
		my ($id, $st) = split /\t/;
		$produced{$id} = $st;
	}
	ok(!-e "$tmp/producer-$p.errors", "producer $p saw no SQL error")
	  or diag(slurp_file("$tmp/producer-$p.errors"));
}
my %by_status;
$by_status{$_}++ for values %produced;
is(scalar(keys %produced), $DECISIONS, 'every decision accounted for by its producer');
is($by_status{notrun} // 0, 0, 'every producer ran all its transactions');
cmp_ok($by_status{rolledback} // 0, '>', $DECISIONS * $ROLLBACK / 2, 'rolled-back decisions were produced');

my %cmd;
for (split /\n/, $node->safe_psql('postgres', "$S$STATUS_SQL"))
{
	my ($id, $st, $d) = split /\|/;
	$cmd{$id} = { status => $st, deliveries => $d };
}
my %applied;
for (split /\n/, $node->safe_psql('postgres', "SELECT command_id, count(*) FROM biz GROUP BY 1"))
{
	my ($id, $n) = split /\|/;
	$applied{$id} = $n;
}
my %receipt = map { $_ => 1 } split /\n/,
  $node->safe_psql('postgres', "SELECT command_id FROM $RECEIPTS r");
my %acked_deliveries;
for (split /\n/, slurp_file($rlog))
{
	my ($id, $d, $status) = split /\t/;
	$acked_deliveries{$id}++ if $status == 200;
}

if ($KAFKA)
{
	# no consumer applies anything: the broker's copy is the record, and a
	# command is "applied" (and "receipted") once when it is in the topic
	%applied = map { $_ => 1 } keys %acked_deliveries;
	%receipt = %applied;
}

my ($ok, $lost, $unexpected, $duplicated, $recovered) = (0, 0, 0, 0, 0);
my (@lost, @unexpected);
my %all = map { $_ => 1 } (keys %produced, keys %cmd, keys %applied, keys %acked_deliveries);
for my $id (sort keys %all)
{
	my $p = $produced{$id} // 'never';
	my $c = $cmd{$id};
	my $a = $applied{$id} // 0;
	my $d = $acked_deliveries{$id} // 0;

	$duplicated += $d - 1 if $d > 1;
	if ($p eq 'rolledback' || $p eq 'never' || $p eq 'error')
	{
		# must leave no trace at all
		if ($c || $a || $d || $receipt{$id})
		{
			$unexpected++;
			push @unexpected, "$id ($p)";
		}
		next;
	}
	if ($p eq 'unknown' && !$c && !$a && !$d)
	{
		next;    # the commit did not happen, and nothing was delivered
	}
	if (!$c || $c->{status} ne 'published' || $a == 0 || !$receipt{$id} || $d == 0)
	{
		$lost++;
		push @lost, "$id (" . ($c ? $c->{status} : 'missing') . ", applied $a, receipt "
		  . ($receipt{$id} ? 'yes' : 'no') . ", deliveries $d)";
		next;
	}
	if ($a > 1)
	{
		$unexpected++;
		push @unexpected, "$id (applied $a times)";
		next;
	}
	$recovered++ if $p eq 'unknown';
	$ok++;
}

# A stream's batches are cut at ticks, about $BATCH commands per partition:
# the bound counts the largest batch a relay claimed (its -v log: "claimed
# N", or "claimed N ahead" for the batch claimed while another was being
# delivered).  A kill still costs one batch: the ack of the batch before
# the one in delivery was written to the socket before it, so the server
# gets it and commits it even when the relay dies.
my $batch_max = $BATCH;
if ($STREAM)
{
	for my $f (glob("$tmp/relay*.err"))
	{
		my $log = slurp_file($f);
		while ($log =~ /claimed (\d+)(?: ahead)?$/mg)
		{
			$batch_max = $1 if $1 > $batch_max;
		}
	}
}
my $bound = ($kills + $RELAYS) * $batch_max;
diag(sprintf(
	"chaos (%s%s): ok=%d lost=%d unexpected=%d duplicated=%d (bound %d: (%d kills + %d relays) x batch %d); "
	  . "committed=%d rolledback=%d unknown=%d (recovered %d); production %.1fs, all published %.1fs",
	$KAFKA ? 'kafka' : 'http', $STREAM ? ', stream' : '', $ok, $lost, $unexpected, $duplicated, $bound, $kills, $RELAYS, $batch_max,
	$by_status{committed} // 0, $by_status{rolledback} // 0, $by_status{unknown} // 0,
	$recovered, $production_secs // -1, $chaos_secs));

is($lost, 0, 'lost = 0: every committed command published and applied')
  or diag('lost: ' . join(', ', @lost[ 0 .. ($#lost < 9 ? $#lost : 9) ]));
is($unexpected, 0, 'unexpected = 0: no rolled-back command delivered, none applied twice')
  or diag('unexpected: ' . join(', ', @unexpected[ 0 .. ($#unexpected < 9 ? $#unexpected : 9) ]));
cmp_ok($duplicated, '<=', $bound, 'duplicated deliveries within the bound');
is($ok, ($by_status{committed} // 0) + $recovered, 'ok = every committed command (and every recovered one)');

is($node->safe_psql('postgres',
	"${S}SELECT count(*) FROM ($STATUS_SQL) c WHERE NOT EXISTS (SELECT 1 FROM $RECEIPTS r WHERE r.command_id = c.command_id)"),
	'0', 'every command has its receipt') unless $KAFKA;
is($node->safe_psql('postgres', "${S}SELECT count(*) FROM ($STATUS_SQL) c WHERE status <> 'published'"),
	'0', 'no command dead, uncertain or left behind');
is($node->safe_psql('postgres',
	"SELECT count(*) FROM outbox.inbox i WHERE i.consumer = 'chaos' AND NOT EXISTS (SELECT 1 FROM biz b WHERE b.command_id = i.command_id)"),
	'0', 'inbox and business table agree') unless $KAFKA;

# The extension's own invariant checks.
if ($node->safe_psql('postgres', "SELECT to_regclass('outbox.conservation') IS NOT NULL") eq 't')
{
	is($node->safe_psql('postgres',
		'SELECT coalesce(sum(violations), 0) FROM outbox.conservation'),
		'0', 'outbox.conservation: all zero')
	  or diag($node->safe_psql('postgres', 'SELECT * FROM outbox.conservation'));
}
else
{
	note('outbox.conservation does not exist yet: checking the invariants directly');
	my %inv = (
		'event without its command' =>
		  "SELECT count(*) FROM outbox.events e WHERE e.command_id IS NOT NULL AND NOT EXISTS (SELECT 1 FROM outbox.commands c WHERE c.command_id = e.command_id)",
		'command without its event' =>
		  "SELECT count(*) FROM outbox.commands c WHERE NOT EXISTS (SELECT 1 FROM outbox.events e WHERE e.run_id = c.run_id AND e.seq = c.seq AND e.command_id = c.command_id)",
		'receipt without its command' =>
		  "SELECT count(*) FROM outbox.receipts r WHERE NOT EXISTS (SELECT 1 FROM outbox.commands c WHERE c.command_id = r.command_id)",
		'inconsistent status' =>
		  "SELECT count(*) FROM outbox.commands WHERE (status = 'sending' AND (owner IS NULL OR lease_until IS NULL)) OR (status = 'published' AND (published_at IS NULL OR deliveries < 1))",);
	for my $name (sort keys %inv)
	{
		is($node->safe_psql('postgres', $inv{$name}), '0', "invariant: no $name");
	}
}

{
	my ($vrc, $vout, $verr) = $node->psql('postgres', 'SELECT outbox.verify()');
	is($vrc, 0, 'outbox.verify() passes') or diag($verr);
}

# amcheck on every B-tree index of the extension.
my ($ret, $checked, $amerr) = $node->psql('postgres',
	"SELECT count(*) FROM (SELECT bt_index_check(c.oid, true) FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid JOIN pg_am a ON a.oid = c.relam JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = 'outbox' AND a.amname = 'btree') s");
is($ret, 0, 'amcheck: bt_index_check (heapallindexed) passes on the extension\'s indexes')
  or diag($amerr);
cmp_ok($checked, '>=', 8, "amcheck: $checked indexes checked");

$node->stop;
done_testing();
