# outbox-relay on a stream (issue 20, the write-once path): --stream NAME
# --subscription NAME against a real server.
#
#  0. Misuse: --stream or --subscription alone, or with --kinds, exits 2
#     with one line, before connecting.
#  1. One stream, three subscriptions created before anything is produced
#     (fan-out): "web" drained by 2 relays into outbox-receiver (which
#     applies each command: inbox_accept, a business row, complete), "out"
#     by 2 relays to stdout, "kafka" by 2 relays into librdkafka's mock
#     cluster (test/kafka-mock, read back with kcat).  2,000 commands over
#     20 runs, and a few the endpoint fails (HTTP 500 once: retried; 422:
#     dead).  Every subscription gets every command exactly once (the
#     failed ones once more after their failure), on Kafka in order per
#     key; the relays named the failures in their ack (the retried ones
#     arrive again with deliveries 2, the fatal one is dead for "web" only).
#  2. A relay whose batch was taken over (stopped with SIGSTOP past its
#     lease, the batch claimed by another relay) has its ack refused
#     (OB001): it logs one line, keeps running, and exits 0 on SIGTERM.
#  3. A failed command with an ordering key: the later commands of its key
#     in the same batch are named failed too, and all of them are delivered
#     again in the key's order.
# Conservation is clean at the end (outbox.conservation, outbox.verify()).

use strict;
use warnings;

use File::Basename qw(dirname);
use IO::Handle;
use Time::HiRes qw(usleep);
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use FindBin;
use lib "$FindBin::RealBin/../perl";
use OutboxTest;
use OutboxBroker;

my $src = $ENV{OUTBOX_SRC} // dirname(__FILE__) . '/../..';
my $receiver = "$src/src/outbox-receiver";
my $mockbin = "$src/test/kafka-mock";
my $tmp = PostgreSQL::Test::Utils::tempdir;
ok(-x $receiver, 'outbox-receiver is built') or BAIL_OUT("no $receiver");
ok(relay_has_sink('kafka'), 'outbox-relay was built with the kafka sink (librdkafka-dev)')
  or BAIL_OUT('no kafka sink: install librdkafka-dev and rebuild');
ok(-x $mockbin, 'test/kafka-mock is built') or BAIL_OUT("no $mockbin");

# ---------------------------------------------------------------------------
# 0. Misuse
# ---------------------------------------------------------------------------
for my $case (
	[ [ '--stream', 's' ], qr/--stream needs --subscription/ ],
	[ [ '--subscription', 's' ], qr/--subscription needs --stream/ ],
	[ [ '--stream', 's', '--subscription', 's', '--kinds', 'a' ], qr/--kinds cannot be used with --stream/ ],
	[ [ '--stream', 's', '--subscription', 's', '--citus' ], qr/--citus cannot be used with --stream/ ],
	[ [ '--stream', '', '--subscription', 's' ], qr/invalid value "" for --stream/ ])
{
	my ($args, $re) = @$case;
	my ($out, $err) = ('', '');
	IPC::Run::run([ 'outbox-relay', '--sink', 'stdout', '--dsn', 'host=/nonexistent', @$args ],
		'<', \undef, '>', \$out, '2>', \$err);
	my $what = join(' ', @$args);
	is($? >> 8, 2, "misuse ($what): exit 2");
	my @lines = grep { !/Try "outbox-relay --help"/ } split /\n/, $err;
	ok(@lines == 1 && $lines[0] =~ $re, "misuse ($what): one line saying so") or diag($err);
	is($out, '', "misuse ($what): nothing on stdout");
}

my $node = outbox_node('stream', "outbox.backoff_base = 100\noutbox.backoff_max = 400\n");
$node->safe_psql('postgres', 'CREATE EXTENSION outbox');
my $dsn = $node->connstr('postgres');
sub sq { return $node->safe_psql('postgres', $_[0]); }

sq(q{SELECT outbox.register_consumer('web', current_user::text::regrole)});
sq('CREATE TABLE biz (command_id text NOT NULL, payload jsonb)');
sq(q{SELECT outbox.create_stream('s1', 4, 50)});
sq(q{SELECT outbox.create_subscription('s1', sub) FROM unnest(ARRAY['web', 'out', 'kafka']) sub});
sq(q{SELECT outbox.set_policy('sk', stream => 's1')});

# What subscription $sub has not finished, after a tick of the streams (so
# that every commit is in one): its partitions behind the last tick or with
# an open batch (outbox.stream_lag), and its failed commands still to retry
# or waiting (outbox.stream_failed); "0" when it has published everything.
sub left
{
	my ($sub) = @_;
	sq('SELECT outbox.tick_streams()');
	return sq("SELECT (SELECT count(*) FROM outbox.stream_lag WHERE subscription = '$sub' AND (ticks_behind > 0 OR batch_open))
  + (SELECT count(*) FROM outbox.stream_failed WHERE subscription = '$sub' AND status <> 'dead')");
}

# The receiver: applies every command (inbox_accept, biz, complete).
my $rpid = track_pid(spawn("$tmp/receiver.out", "$tmp/receiver.err", $receiver,
	'--port-file', "$tmp/receiver.port", '--dsn', $dsn, '--table', 'biz',
	'--consumer', 'web', '--log', "$tmp/receiver.log"));
ok(wait_until(sub { -s "$tmp/receiver.port" }), 'receiver listening');
my $port = slurp_file("$tmp/receiver.port");
chomp $port;

# The mock cluster.
my ($mock_pid, $mock, $bootstrap) = start_kafka_mock($mockbin, $tmp, 'outbox', 4);

my %sink = (
	web => "http://127.0.0.1:$port/apply",
	out => 'stdout',
	kafka => "kafka://$bootstrap/outbox");

# A relay of subscription $sub (of stream s1, or of $stream{$sub}).
my %stream;
sub relay
{
	my ($name, $sub, @args) = @_;
	return track_pid(spawn("$tmp/$name.out", "$tmp/$name.err", 'outbox-relay',
		'--dsn', $dsn, '--sink', $sink{$sub}, '--worker', $name, '--poll', '0.2',
		'--stream', $stream{$sub} // 's1', '--subscription', $sub, @args));
}

# ---------------------------------------------------------------------------
# 1. Three subscriptions, two relays each
# ---------------------------------------------------------------------------
my %relays;
for my $sub (qw(web out kafka))
{
	$relays{$sub} = [ map { relay("$sub-$_", $sub, '--lease', '30') } 1 .. 2 ];
}
produce_runs($node, 'st', 2000, 20, q{'sk'});
# three that the endpoint fails: twice retryable (once), one fatal
sq(q{SELECT outbox.commit_decision('st-f', 1, 'decided', 'st-f-retry1', 'sk', '{"test_status": 500, "test_times": 1}')});
sq(q{SELECT outbox.commit_decision('st-f', 2, 'decided', 'st-f-retry2', 'sk', '{"test_status": 500, "test_times": 1}')});
sq(q{SELECT outbox.commit_decision('st-f', 3, 'decided', 'st-f-fatal', 'sk', '{"test_status": 422}')});
my $total = 2003;

for my $sub (qw(web out kafka))
{
	ok(wait_until(sub { left($sub) eq '0' }), "$sub: nothing left to publish")
	  or diag(sq("SELECT * FROM outbox.stream_lag"));
}
for my $sub (qw(web out kafka))
{
	for my $pid (@{ $relays{$sub} })
	{
		kill 'TERM', $pid;
		is(wait_exit($pid), 0, "$sub: a relay exits 0 on SIGTERM");
	}
}

# each of the two relays of a subscription took its share
for my $sub (qw(web out kafka))
{
	my @claimed = map { slurp_file("$tmp/$sub-$_.err") =~ /summary: .* claimed=(\d+) / ? $1 : 0 } 1 .. 2;
	ok($claimed[0] > 0 && $claimed[1] > 0, "$sub: both relays published (claimed $claimed[0] and $claimed[1])");
}

# web: what the receiver saw, per command: [deliveries, status]
my %web;
for (split /\n/, slurp_file("$tmp/receiver.log"))
{
	my ($id, $d, $status) = split /\t/;
	push @{ $web{$id} }, [ $d, $status ];
}
is(scalar(keys %web), $total, "web: every command reached the endpoint");
is(scalar(grep { $_ =~ /^st-r/ && @{ $web{$_} } == 1 && $web{$_}[0][1] == 200 } keys %web), 2000,
	'web: each of the 2000 commands exactly once, answered 200');
is(join(' ', map { "$_->[0]:$_->[1]" } @{ $web{'st-f-retry1'} // [] }), '1:500 2:200',
	'web: a failed delivery named in the ack is retried (deliveries 2) and then acked');
is(join(' ', map { "$_->[0]:$_->[1]" } @{ $web{'st-f-retry2'} // [] }), '1:500 2:200',
	'web: the second failed delivery of a batch too');
is(join(' ', map { "$_->[0]:$_->[1]" } @{ $web{'st-f-fatal'} // [] }), '1:422',
	'web: a fatal failure is not retried');
is(sq(q{SELECT count(*) FROM biz WHERE command_id LIKE 'st-%'}), '2002', 'web: 2002 applied once each (the 422 one not)');
is(sq(q{SELECT count(DISTINCT command_id) FROM biz}), '2002', 'web: none applied twice');
is(sq(q{SELECT count(*) FROM outbox.stream_failed WHERE status = 'dead' AND subscription = 'web' AND command_id = 'st-f-fatal'}), '1',
	'web: the fatal one is dead for its subscription');
is(sq(q{SELECT count(*) FROM outbox.stream_failed WHERE subscription <> 'web'}), '0',
	'the other subscriptions have no failed command');

# out: the relays' stdout
my %out;
for my $f (glob("$tmp/out-*.out"))
{
	for (split /\n/, slurp_file($f))
	{
		$out{$1}++ if /"command_id":"([^"]+)"/;
	}
}
is(scalar(keys %out), $total, 'out: every command on stdout');
is(scalar(grep { $out{$_} == 1 } keys %out), $total, 'out: each exactly once');

# kafka: the topic
my $kc = `kcat -C -b '$bootstrap' -t outbox -o beginning -e -q -f '%k\\t%p\\t%o\\t%h\\n' 2>'$tmp/kcat.err'`;
my (%kafka, %part, %last, $disorder, $split);
my @m;
for my $line (split /\n/, $kc)
{
	my ($k, $p, $o, $h) = split /\t/, $line, 4;
	my %h = map { split /=/, $_, 2 } split /,/, $h;
	push @m, [ $k, $p, $o, $h{command_id}, $h{seq} // '' ];
}
$kafka{ $_->[3] }++ for @m;
is(scalar(keys %kafka), $total, 'kafka: every command in the topic');
is(scalar(grep { $kafka{$_} == 1 } keys %kafka), $total, 'kafka: each exactly once');
($disorder, $split) = (0, 0);
for my $msg (sort { $a->[1] <=> $b->[1] || $a->[2] <=> $b->[2] } @m)
{
	my ($k, $p, undef, $id) = @$msg;
	next unless $id =~ /^st-r\d+-(\d+)$/;
	my $i = $1;
	$split++ if defined $part{$k} && $part{$k} != $p;
	$part{$k} = $p;
	$disorder++ if defined $last{$k} && $last{$k} > $i;
	$last{$k} = $i;
}
is(scalar(keys %part), 20, 'kafka: 20 keys (run_id)');
is($split, 0, 'kafka: each key in one partition');
is($disorder, 0, 'kafka: in commit order per key, from 2 relays');

# fan-out: the same commands everywhere
is(join(',', sort keys %out), join(',', sort keys %web), 'fan-out: out got what web got');
is(join(',', sort keys %kafka), join(',', sort keys %web), 'fan-out: kafka got what web got');

# the relays' summaries: the fatal one and the retried ones counted on web
my $sum = join('', map { slurp_file("$tmp/web-$_.err") } 1 .. 2);
like($sum, qr/deliver(y|ies) failed \(first error: HTTP 5\d\d|deliver(y|ies) failed \(first error: HTTP 422/,
	'web: the relays logged the failed deliveries');

# ---------------------------------------------------------------------------
# 2. A taken-over batch: the late ack is refused and changes nothing
# ---------------------------------------------------------------------------
sq(q{SELECT outbox.create_stream('s2', 1, 10)});
sq(q{SELECT outbox.create_subscription('s2', 'late')});
sq(q{SELECT outbox.set_policy('lk', stream => 's2')});
$sink{late} = "http://127.0.0.1:$port/apply";
# the first delivery of each takes 1.5 s at the receiver: the first relay
# is stopped in the middle of it, past its 1 s lease
sq(q{SELECT outbox.commit_decision('lt', i, 'decided', 'lt-' || i, 'lk', '{"test_sleep_ms": 1500, "test_times": 1}') FROM generate_series(1, 3) i});
my $a = track_pid(spawn("$tmp/late-a.out", "$tmp/late-a.err", 'outbox-relay',
	'--dsn', $dsn, '--sink', $sink{late}, '--worker', 'late-a', '--poll', '0.2', '-v',
	'--stream', 's2', '--subscription', 'late', '--lease', '1', '--timeout', '10'));
ok(wait_match("$tmp/late-a.err", qr/claimed 3$/m), 'late: the first relay claimed the batch');
usleep(200_000);
kill 'STOP', $a;
sleep 2;    # past the lease
my $b = track_pid(spawn("$tmp/late-b.out", "$tmp/late-b.err", 'outbox-relay',
	'--dsn', $dsn, '--sink', $sink{late}, '--worker', 'late-b', '--poll', '0.2',
	'--stream', 's2', '--subscription', 'late', '--lease', '30', '--drain'));
is(wait_exit($b), 0, 'late: the second relay takes the batch over, delivers it and exits');
is(left('late'), '0', 'late: the batch is published by the second relay');
kill 'CONT', $a;
ok(wait_match("$tmp/late-a.err", qr/(ack|renewal) of a batch of \d+ commands? refused: another worker owns the batch now/),
	'late: the stale relay logs that its batch was taken over');
usleep(300_000);
ok(kill(0, $a), 'late: the stale relay keeps running');
kill 'TERM', $a;
is(wait_exit($a), 0, 'late: and exits 0 on SIGTERM');
like(slurp_file("$tmp/late-a.err"), qr/summary: .* stale=([1-9]\d*) /, 'late: its refused batch is counted as stale');
is(sq(q{SELECT count(*) || ' ' || count(DISTINCT command_id) FROM biz WHERE command_id LIKE 'lt-%'}), '3 3',
	'late: each command applied once');

# ---------------------------------------------------------------------------
# 3. A key's order across a failure: the later commands of the failed one's
#    ordering key in the same batch go back with it
# ---------------------------------------------------------------------------
sq(q{SELECT outbox.create_stream('s3', 1, 10)});
sq(q{SELECT outbox.create_subscription('s3', 'keyed')});
sq(q{SELECT outbox.set_policy('kk', stream => 's3')});
$sink{keyed} = "http://127.0.0.1:$port/apply";
$stream{keyed} = 's3';
# one transaction, so one batch: kc-1 fails once, kc-2 and kc-3 follow it
# on key k1, kc-4 is of another key
sq(q{BEGIN;
SELECT outbox.commit_decision('kr', i, 'decided', 'kc-' || i, 'kk',
	(CASE WHEN i = 1 THEN '{"test_status": 500, "test_times": 1}' ELSE '{}' END)::jsonb,
	ordering_key => CASE WHEN i = 4 THEN 'other' ELSE 'k1' END)
  FROM generate_series(1, 4) i;
COMMIT;});
my $k = relay('keyed-1', 'keyed', '-v');
ok(wait_until(sub { left('keyed') eq '0' }), 'keyed: everything published after the retry');
kill 'TERM', $k;
is(wait_exit($k), 0, 'keyed: the relay exits 0');
my @arrivals = grep { $_->[0] =~ /^kc-/ } map { [ split /\t/ ] } split /\n/, slurp_file("$tmp/receiver.log");
my %n;
$n{ $_->[0] }++ for @arrivals;
is(join(' ', map { $n{"kc-$_"} // 0 } 1 .. 4), '2 2 2 1',
	'keyed: the failed command and the two after it on its key are delivered again, the other key once');
my %last;
$last{ $arrivals[$_][0] } = $_ for 0 .. $#arrivals;
ok($last{'kc-1'} < $last{'kc-2'} && $last{'kc-2'} < $last{'kc-3'},
	'keyed: the last deliveries of key k1 arrive in its order')
  or diag(join(' ', map { "$_->[0]:$_->[1]:$_->[2]" } @arrivals));
like(slurp_file("$tmp/keyed-1.err"), qr/"kc-2" goes back after the failure of "kc-1" \(same ordering key\)/,
	'keyed: the relay logged why kc-2 went back');

kill 'TERM', $rpid;
wait_exit($rpid);
close($mock);
untrack_pid($mock_pid);

conservation_clean($node, 'the end');
$node->stop;
done_testing();
