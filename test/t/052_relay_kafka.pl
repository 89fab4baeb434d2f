# outbox-relay's Kafka sink against a real Kafka protocol peer: the mock
# cluster of librdkafka (test/kafka-mock, on the loopback, a port of its
# own), read back with kcat.
#
#  1. 2,000 commands from 2 relays: every command exactly once in the
#     topic, with its metadata in Kafka headers, and in order per key
#     (run_id).  Each relay serves the runs of one kind, so each key has
#     one producer and its order is the claim order.  Commands of three
#     runs sharing an ordering key, from two relays: one partition, in
#     the decision order.
#  2. The broker goes down in the middle of a batch: nothing is acked
#     while it is down, nothing is dead-lettered or spends a delivery, the
#     relay logs the outage once and resumes when the broker returns.
#  3. Broker-side errors (rd_kafka_mock_push_request_errors) sorted as the
#     docs say: a retriable error is retried inside the idempotent
#     producer, an authorization error holds the batch, a message-size
#     error makes the command dead.
# Conservation is clean at the end.

use strict;
use warnings;

use File::Basename qw(dirname);
use IO::Handle;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use FindBin;
use lib "$FindBin::RealBin/../perl";
use OutboxTest;
use OutboxBroker;

my $src = $ENV{OUTBOX_SRC} // dirname(__FILE__) . '/../..';
my $mockbin = "$src/test/kafka-mock";
my $tmp = PostgreSQL::Test::Utils::tempdir;

ok(relay_has_sink('kafka'), 'outbox-relay was built with the kafka sink (librdkafka-dev)')
  or BAIL_OUT('no kafka sink: install librdkafka-dev and rebuild');
ok(-x $mockbin, 'test/kafka-mock is built') or BAIL_OUT("no $mockbin");

my $node = outbox_node('kafka', "outbox.backoff_base = 100\noutbox.backoff_max = 400\n");
$node->safe_psql('postgres', 'CREATE EXTENSION outbox');
my $dsn = $node->connstr('postgres');
sub sq { return $node->safe_psql('postgres', $_[0]); }

# The mock cluster: commands on its stdin, answers in $tmp/mock.out.
my ($mock_pid, $mock, $bootstrap) = start_kafka_mock($mockbin, $tmp, 'outbox', 4);
like($bootstrap, qr/^127\.0\.0\.1:\d+$/, 'mock cluster listens on the loopback');
my $sink = "kafka://$bootstrap/outbox";
my $mock_line = 0;

# Send a command to the mock and wait for its answer.
sub mock
{
	my ($cmd) = @_;
	$mock_line++;
	print $mock "$cmd\n";
	return wait_match("$tmp/mock.out", qr/^ok $mock_line$/m);
}

# The topic's messages: [key, partition, offset, headers{}, body].
sub topic
{
	my $out = `kcat -C -b '$bootstrap' -t outbox -o beginning -e -q -f '%k\\t%p\\t%o\\t%h\\t%s\\n' 2>'$tmp/kcat.err'`;
	my @m;
	for my $line (split /\n/, $out)
	{
		my ($k, $p, $o, $h, $s) = split /\t/, $line, 5;
		my %h = map { split /=/, $_, 2 } split /,/, $h;
		push @m, [ $k, $p, $o, \%h, $s ];
	}
	return @m;
}

# Start a relay in the background.
sub relay
{
	my ($name, @args) = @_;
	return track_pid(spawn("$tmp/$name.out", "$tmp/$name.err", 'outbox-relay',
		'--dsn', $dsn, '--sink', $sink, '--worker', $name, '--poll', '0.2', @args));
}

# ---------------------------------------------------------------------------
# 1. 2,000 commands, 2 relays, exactly once, in order per key
# ---------------------------------------------------------------------------
produce_runs($node, 'k1', 2000, 20, q{CASE WHEN r % 2 = 0 THEN 'ka' ELSE 'kb' END});
{
	my $ra = relay('relay-a', '--kinds', 'ka', '--batch', '100', '--drain');
	my $rb = relay('relay-b', '--kinds', 'kb', '--batch', '100', '--drain');
	is(wait_exit($ra), 0, '2 relays: the first drains and exits 0');
	is(wait_exit($rb), 0, '2 relays: the second drains and exits 0');
	is(sq("SELECT count(*) FROM outbox.commands WHERE command_id LIKE 'k1-%' AND status = 'published' AND deliveries = 1"),
		'2000', '2 relays: 2000 published, each on its first delivery');

	my @m = grep { $_->[3]{command_id} =~ /^k1-/ } topic();
	my %seen;
	$seen{ $_->[3]{command_id} }++ for @m;
	is(scalar(@m), 2000, '2 relays: 2000 messages in the topic');
	is(scalar(keys %seen), 2000, '2 relays: every command exactly once');
	is(scalar(grep { $_->[4] =~ /"command_id":"\Q$_->[3]{command_id}\E"/ } @m), 2000,
		'the command_id header matches the body');
	is(scalar(grep { $_->[0] eq $_->[3]{run_id} && $_->[3]{deliveries} eq '1'
		  && $_->[3]{kind} =~ /^k[ab]$/ && $_->[3]{'content-type'} eq 'application/json' } @m),
		2000, 'key = run_id; headers run_id, kind, deliveries, content-type');

	# per key: one partition, and the commands in their commit order
	my (%part, %last, $disorder, $split);
	for my $msg (sort { $a->[1] <=> $b->[1] || $a->[2] <=> $b->[2] } @m)
	{
		my ($k, $p) = @$msg;
		my ($i) = $msg->[3]{command_id} =~ /-(\d+)$/;
		$split++ if defined $part{$k} && $part{$k} != $p;
		$part{$k} = $p;
		$disorder++ if defined $last{$k} && $last{$k} > $i;
		$last{$k} = $i;
	}
	is(scalar(keys %part), 20, '20 keys');
	ok(!$split, 'each key in one partition');
	ok(!$disorder, 'each key in commit order') or diag("$disorder out of order");
	ok(scalar(keys %{ { map { $_ => 1 } values %part } }) > 1, 'the keys are spread over partitions');
}

# ---------------------------------------------------------------------------
# 1b. The producer's headers and seq arrive as Kafka headers (kcat %h)
# ---------------------------------------------------------------------------
sq(q{SELECT outbox.commit_decision('kh-run', 41, 'decided', 'kh-1', 'kh', '{}',
	headers => '{"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", "x-correlation-id": "corr-kh", "kind": "spoof"}')});
sq(q{SELECT outbox.commit_decision('kh-run', 42, 'decided', 'kh-2', 'kh', '{}')});
{
	is(wait_exit(relay('relay-h', '--kinds', 'kh', '--drain')), 0, 'headers: the relay drains');
	my %m = map { $_->[3]{command_id} => $_ } grep { $_->[3]{command_id} =~ /^kh-/ } topic();
	is($m{'kh-1'}[3]{traceparent}, '00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01',
		'headers: traceparent arrives as a Kafka header');
	is($m{'kh-1'}[3]{'x-correlation-id'}, 'corr-kh', 'headers: x-correlation-id arrives');
	is($m{'kh-1'}[3]{kind}, 'kh', 'headers: a producer header named like the relay\'s keeps the relay\'s value');
	is($m{'kh-1'}[3]{seq}, '41', 'headers: seq is a Kafka header');
	is($m{'kh-2'}[3]{seq}, '42', 'headers: seq of a command without headers');
	ok(!exists $m{'kh-2'}[3]{traceparent}, 'headers: none for a command without');
	ok(!exists $m{'kh-1'}[3]{ordering_key}, 'headers: no ordering_key for an unordered command');
	like($m{'kh-1'}[4], qr/"seq":41,.*"headers":\{"kind": "spoof", "traceparent": /,
		'headers: seq and the headers are in the JSON object too');
}

# ---------------------------------------------------------------------------
# 1c. One ordering key across several runs: the key is the message key, so
#     the commands land in one partition, in their decision order, even
#     from two relays
# ---------------------------------------------------------------------------
sq(q{SELECT outbox.commit_decision('ko-' || s % 3, s, 'decided', 'ko-' || s, 'ko', jsonb_build_object('s', s),
								   ordering_key => 'acct-7')
	   FROM generate_series(1, 30) s});
{
	my $ra = relay('relay-oa', '--kinds', 'ko', '--batch', '10', '--drain');
	my $rb = relay('relay-ob', '--kinds', 'ko', '--batch', '10', '--drain');
	is(wait_exit($ra), 0, 'ordering key: the first relay exits 0');
	is(wait_exit($rb), 0, 'ordering key: the second relay exits 0');
	ok($node->poll_query_until('postgres',
		"SELECT count(*) = 30 FROM outbox.commands WHERE kind = 'ko' AND status = 'published'"),
		'ordering key: all 30 published');
	my @m = sort { $a->[2] <=> $b->[2] } grep { $_->[3]{command_id} =~ /^ko-/ } topic();
	is(scalar(@m), 30, 'ordering key: 30 messages');
	is(scalar(grep { $_->[0] eq 'acct-7' && ($_->[3]{ordering_key} // '') eq 'acct-7' } @m), 30,
		'ordering key: key = ordering key; header ordering_key');
	is(scalar(keys %{ { map { $_->[1] => 1 } @m } }), 1, 'ordering key: one partition for three runs');
	is(join(',', map { $_->[3]{command_id} =~ s/^ko-//r } @m), join(',', 1 .. 30),
		'ordering key: the partition holds them in the decision order');
}

# ---------------------------------------------------------------------------
# 2. The broker goes down mid-batch, and comes back
# ---------------------------------------------------------------------------
produce_runs($node, 'k2', 600, 6, q{'kd'});
{
	my $err = "$tmp/relay-down.err";
	# slow answers keep each batch in flight long enough to fail it midway;
	# set before the relay starts, or a quick relay drains all 600 before
	# the first slow answer
	ok(mock('rtt 300'), 'down: the broker answers 300 ms late');
	my $pid = relay('relay-down', '--kinds', 'kd', '--batch', '50', '--timeout', '2', '--lease', '2', '-v');
	ok($node->poll_query_until('postgres',
		"SELECT count(*) >= 100 FROM outbox.commands WHERE kind = 'kd' AND status = 'published'"),
		'down: the relay is publishing');
	ok($node->poll_query_until('postgres',
		"SELECT count(*) > 0 FROM outbox.commands WHERE kind = 'kd' AND status = 'sending'"),
		'down: a batch is in flight');
	ok(mock('down'), 'down: the broker is down');
	ok(wait_match($err, qr/sink unavailable: kafka outbox: .*holding \d+ commands?, claiming paused/),
		'down: the outage is logged');
	my $acked = sq("SELECT count(*) FROM outbox.commands WHERE kind = 'kd' AND status = 'published'");
	ok($acked < 600, "down: the outage came in the middle ($acked of 600 acked)");
	# the relay tries the held batch again and again while the broker is
	# down; the leases of 2 s it holds stay alive
	ok(wait_match($err, qr/sink unavailable; pausing 2\.0s/), 'down: the held batch is retried with backoff');
	ok(sq("SELECT count(*) FROM outbox.commands WHERE kind = 'kd' AND status = 'sending' AND lease_until > now()") > 0,
		'down: the held leases are renewed');
	is(sq("SELECT count(*) FROM outbox.commands WHERE kind = 'kd' AND status = 'published'"),
		$acked, 'down: nothing acked while the broker cannot confirm');
	is(sq("SELECT count(*) FROM outbox.commands WHERE kind = 'kd' AND (status = 'dead' OR deliveries > 1)"),
		'0', 'down: nothing dead, no delivery spent');
	ok(mock('rtt 0') && mock('up'), 'down: the broker is back');
	ok($node->poll_query_until('postgres',
		"SELECT count(*) = 600 FROM outbox.commands WHERE kind = 'kd' AND status = 'published'"),
		'down: all published after the broker returned');
	kill 'TERM', $pid;
	is(wait_exit($pid), 0, 'down: SIGTERM exits 0');
	my $log = slurp_file($err);
	is(scalar(() = $log =~ /sink unavailable:/g), 1, 'down: the outage logged once');
	like($log, qr/sink kafka:\/\/\S+ .*is available again/, 'down: the recovery logged');
	is(sq("SELECT count(*) FROM outbox.commands WHERE kind = 'kd' AND deliveries = 1"),
		'600', 'down: every command published on its first delivery');

	my %seen;
	$seen{ $_->[3]{command_id} }++ for grep { $_->[3]{command_id} =~ /^k2-/ } topic();
	is(scalar(keys %seen), 600, 'down: every command in the topic');
	my @dups = grep { $seen{$_} > 1 } keys %seen;
	note(scalar(@dups) . ' command(s) published twice across the outage (same command_id)');
}

# ---------------------------------------------------------------------------
# 3. Broker-side errors and their classification
# ---------------------------------------------------------------------------
# Kafka error codes (Kafka protocol): 19 NOT_ENOUGH_REPLICAS (retriable),
# 29 TOPIC_AUTHORIZATION_FAILED, 10 MESSAGE_TOO_LARGE.
{
	$node->safe_psql('postgres',
		"SELECT outbox.commit_decision('k3', 1, 'decided', 'k3-retriable', 'ke1', '{}')");
	ok(mock('error 0 19 3'), 'retriable: three Produce requests will fail');
	my $pid = relay('relay-e1', '--kinds', 'ke1', '--drain');
	is(wait_exit($pid), 0, 'retriable: exit 0');
	is(sq("SELECT status || ' ' || deliveries || ' ' || coalesce(last_error, '-') FROM outbox.commands WHERE command_id = 'k3-retriable'"),
		'published 1 -', 'retriable: retried inside the producer, published on the first delivery');

	$node->safe_psql('postgres',
		"SELECT outbox.commit_decision('k3', 2, 'decided', 'k3-authz', 'ke2', '{}')");
	ok(mock('error 0 29 2'), 'authorization: two Produce requests will fail');
	my $err = "$tmp/relay-e2.err";
	$pid = relay('relay-e2', '--kinds', 'ke2');
	ok($node->poll_query_until('postgres',
		"SELECT status = 'published' FROM outbox.commands WHERE command_id = 'k3-authz'"),
		'authorization: published once the broker allows it');
	kill 'TERM', $pid;
	is(wait_exit($pid), 0, 'authorization: exit 0');
	like(slurp_file($err), qr/sink unavailable: kafka outbox: Broker: Topic authorization failed/,
		'authorization: the sink was unavailable, not the command');
	is(sq("SELECT deliveries FROM outbox.commands WHERE command_id = 'k3-authz'"), '1',
		'authorization: no delivery spent');

	$node->safe_psql('postgres',
		"SELECT outbox.commit_decision('k3', 3, 'decided', 'k3-toolarge', 'ke3', '{}')");
	ok(mock('error 0 10 1'), 'message too large: one Produce request will fail');
	$pid = relay('relay-e3', '--kinds', 'ke3', '--drain');
	is(wait_exit($pid), 0, 'message too large: exit 0');
	like(sq("SELECT status || ' ' || deliveries || ' ' || last_error FROM outbox.commands WHERE command_id = 'k3-toolarge'"),
		qr/^dead 1 kafka outbox: Broker: Message size too large/, 'message too large: fatal, dead at once');
	unlike(slurp_file("$tmp/relay-e3.err"), qr/sink unavailable/, 'message too large: the sink stayed available');
}

# A bad Kafka URL ends the relay at start-up (exit 2, one line).
for my $bad ('kafka://', "kafka://$bootstrap/", "kafka://$bootstrap/bad topic", "kafka://$bootstrap/t?linger=5",
	"kafka://$bootstrap/t?config=$tmp/nonexistent")
{
	my $out = `outbox-relay --dsn '$dsn' --sink '$bad' 2>&1`;
	is($? >> 8, 2, "--sink '$bad': exit 2");
	is(scalar(split /\n/, $out), 1, "--sink '$bad': one line") or diag($out);
}

conservation_clean($node, 'kafka');

ok(close($mock), 'mock cluster stopped');
untrack_pid($mock_pid);
$node->stop;
done_testing();
