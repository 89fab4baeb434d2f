# outbox-relay's NATS JetStream sink against a real nats-server -js
# (Debian's nats-server, started by the test on loopback ports of its own,
# its own store directory): 2,000 commands from two relays read back
# through the JetStream API (and counted by the monitoring endpoint), each
# exactly once, its Nats-Msg-Id the command_id; a duplicate dropped by the
# stream's window; the server killed in the middle of a batch (nothing
# unconfirmed acked, nothing dead, recovery, still each exactly once); the
# stream removed under a running relay (an outage: commands held, not
# failed, recovery when it is back); a subject no stream captures, and a
# server without JetStream, refused at start-up; outbox.verify() clean at
# the end.

use strict;
use warnings;

use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(usleep);
use JSON::PP;
use FindBin;
use lib "$FindBin::RealBin/../perl";
use OutboxBrokerServer;
use OutboxBroker qw(relay_has_sink conservation_clean wait_match);

plan skip_all => 'outbox-relay was built without the nats sink (libnats-dev)'
  unless relay_has_sink('nats');
my ($rc, $err);

my $tmp = PostgreSQL::Test::Utils::tempdir;
my $node = OutboxBrokerServer::sink_test_node('nats');
my $dsn = $node->connstr('postgres');

my $ns = OutboxBrokerServer->new('nats', "$tmp/nats");
$ns->start;
$ns->js_stream_create('OUTBOX', ['outbox.>'], 600);
my $port = $ns->port;
my $sink = "nats://127.0.0.1:$port/outbox.commands";

# The stream's messages: command_id => count; also checks each message's
# Nats-Msg-Id against its body.  Returns (counts, mismatches).
sub stream_ids
{
	my %seen;
	my $bad = 0;
	for my $m ($ns->js_stream_messages('OUTBOX'))
	{
		my $body = eval { decode_json($m->{data}) } // {};
		my $id = $body->{command_id} // '';
		$bad++ unless ($m->{headers}{'Nats-Msg-Id'} // '') eq $id
		  && ($m->{headers}{'Outbox-Command-Id'} // '') eq $id
		  && ($m->{headers}{'Outbox-Run-Id'} // '') eq ($body->{run_id} // '-');
		$seen{$id}++;
	}
	return (\%seen, $bad);
}

# ---------------------------------------------------------------------------
# Configuration errors: exit 2, one line
# ---------------------------------------------------------------------------
for my $case (
	[ "nats://127.0.0.1:$port/plain.subject", qr/no JetStream stream captures subject "plain.subject"/ ],
	[ "nats://127.0.0.1:$port/outbox.*", qr/must be a subject to publish to/ ],
	[ "nats://u:secret\@127.0.0.1:$port/outbox.commands", qr/password must not be in the URL/ ],
	[ "nats://127.0.0.1:$port/outbox.commands?window=x", qr/option "window" must be an integer/ ])
{
	my ($url, $re) = @$case;
	($rc, $err) = OutboxBrokerServer::relay_run('--dsn', $dsn, '--sink', $url, '--drain');
	is($rc, 2, "refused at start-up with exit 2: $re");
	like($err, $re, "says why: $re");
	unlike($err, qr/\n./, 'in one line');
}

# a server without JetStream: every publish would be lost, exit 2 too
my $plain = OutboxBrokerServer->new('nats', "$tmp/nats-plain", jetstream => 0);
$plain->start;
($rc, $err) = OutboxBrokerServer::relay_run('--dsn', $dsn, '--drain',
	'--sink', 'nats://127.0.0.1:' . $plain->port . '/outbox.commands');
is($rc, 2, 'a server without JetStream: exit 2');
like($err, qr/has no JetStream/, 'a server without JetStream: says so');
$plain->stop;

# ---------------------------------------------------------------------------
# 2,000 commands, 2 relays: each exactly once in the stream
# ---------------------------------------------------------------------------
OutboxBrokerServer::produce($node, 'nats-a', 2000);
my @relays = map { [ OutboxBrokerServer::relay_start($tmp, "a$_", '--dsn', $dsn, '--sink', $sink,
			'--batch', 100, '--drain') ] } 1 .. 2;
is(OutboxBrokerServer::wait_exit($_->[0]), 0, 'relay drained and exited 0') for @relays;
is(OutboxBrokerServer::run_states($node, 'nats-a'), '2000 0 0', 'all 2,000 commands published');
my $jsz = $ns->monitor('/jsz?streams=true');
my ($st) = map { @{ $_->{stream_detail} // [] } } @{ $jsz->{account_details} // [] };
is($st && $st->{state}{messages}, 2000, 'the monitoring endpoint counts 2,000 messages in the stream');
my ($seen, $bad) = stream_ids();
is(scalar(keys %$seen), 2000, 'the stream holds 2,000 distinct commands');
is(scalar(grep { $seen->{$_} != 1 } keys %$seen), 0, 'each exactly once');
is($bad, 0, 'each with Nats-Msg-Id and Outbox-* headers matching its body');
is(scalar(grep { !$seen->{$_} } OutboxBrokerServer::published_ids($node, 'nats-a')), 0,
	'every published command is in the stream');

# the duplicate window: the same Nats-Msg-Id again is dropped
my $ack = $ns->js_request('outbox.commands', '{"again":true}', { 'Nats-Msg-Id' => 'nats-a-00001' });
ok($ack->{duplicate}, 'a redelivery with the same Nats-Msg-Id is a duplicate PubAck');
is($ns->js_stream_state('OUTBOX')->{messages}, 2000, 'and is not stored');

# ---------------------------------------------------------------------------
# The server killed mid-batch, restarted: nothing unconfirmed acked,
# nothing dead, recovery, duplicates dropped
# ---------------------------------------------------------------------------
OutboxBrokerServer::produce($node, 'nats-b', 1000);
@relays = map { [ OutboxBrokerServer::relay_start($tmp, "b$_", '--dsn', $dsn, '--sink', $sink,
			'--batch', 100, '--timeout', 3) ] } 1 .. 2;
ok(OutboxBrokerServer::wait_sql($node,
	"SELECT count(*) = 1000 FROM outbox.commands WHERE run_id = 'nats-b' AND status = 'published'"),
	'relays published the first half of run b');
# freeze the server, let the relays claim and publish into it, then kill it
$ns->freeze;
OutboxBrokerServer::produce($node, 'nats-b', 1000, 'broker', 1001);
ok(OutboxBrokerServer::wait_sql($node,
	"SELECT count(*) > 0 FROM outbox.commands WHERE run_id = 'nats-b' AND status = 'sending'"),
	'relays hold a batch in flight');
$ns->kill9;
my @acked_before = OutboxBrokerServer::published_ids($node, 'nats-b');
usleep(1_500_000);
is(OutboxBrokerServer::run_states($node, 'nats-b') =~ s/ \d+$//r, '1000 0',
	'nothing unconfirmed acked, nothing dead while the server is down');
$ns->start;
ok(OutboxBrokerServer::wait_sql($node,
	"SELECT count(*) = 2000 FROM outbox.commands WHERE run_id = 'nats-b' AND status = 'published'"),
	'the relays recovered when the server returned');
kill 'TERM', $_->[0] for @relays;
is(OutboxBrokerServer::wait_exit($_->[0]), 0, 'relay exits 0 on SIGTERM') for @relays;
is(OutboxBrokerServer::run_states($node, 'nats-b'), '2000 0 0', 'run b: all published, none dead');
like(OutboxBrokerServer::slurp($relays[0][1]) . OutboxBrokerServer::slurp($relays[1][1]),
	qr/sink unavailable: .*(connection|PubAck)/, 'the outage was logged as such');
cmp_ok($node->safe_psql('postgres',
	"SELECT max(deliveries) FROM outbox.commands WHERE run_id = 'nats-b'"), '<=', 2,
	'the outage spent no deliveries');
($seen, $bad) = stream_ids();
is(scalar(grep { !$seen->{$_} } OutboxBrokerServer::published_ids($node, 'nats-b')), 0,
	'every published command of run b is in the stream (acked only after the PubAck)');
is(scalar(grep { !$seen->{$_} } @acked_before), 0, 'including those acked before the kill');
is(scalar(grep { /^nats-b/ && $seen->{$_} != 1 } keys %$seen), 0,
	'each exactly once: republished ones dropped by Nats-Msg-Id');
is($bad, 0, 'headers match');

# ---------------------------------------------------------------------------
# The producer's headers and seq arrive as NATS headers (read back with the
# JetStream API, STREAM.MSG.GET); a producer's Nats-* header is not passed on
# ---------------------------------------------------------------------------
$node->safe_psql('postgres', q{SELECT outbox.commit_decision('nats-h', 7, 'decided', 'nats-h-1', 'hdr', '{}',
	headers => '{"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", "Nats-Expected-Stream": "OTHER", "x-correlation-id": "corr-n"}')});
($rc, $err) = OutboxBrokerServer::relay_run('--dsn', $dsn, '--sink', $sink, '--kinds', 'hdr', '--drain',
	'--worker', 'h1');
is($rc, 0, 'headers: the relay drains') or diag($err);
my ($hm) = grep { ($_->{headers}{'Outbox-Command-Id'} // '') eq 'nats-h-1' } $ns->js_stream_messages('OUTBOX');
is($hm->{headers}{traceparent}, '00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01', 'headers: traceparent arrives as a NATS header');
is($hm->{headers}{'x-correlation-id'}, 'corr-n', 'headers: x-correlation-id arrives');
is($hm->{headers}{'Outbox-Seq'}, '7', 'headers: Outbox-Seq carries seq');
ok(!exists $hm->{headers}{'Nats-Expected-Stream'}, 'headers: a producer Nats-* header is not passed on');

# ---------------------------------------------------------------------------
# The stream removed under a running relay: an outage, then recovery
# ---------------------------------------------------------------------------
my ($pid_c, $err_c) = OutboxBrokerServer::relay_start($tmp, 'c1', '--dsn', $dsn, '--sink', $sink,
	'--batch', 50);
ok(wait_match($err_c, qr/listening/), 'relay c1 started');
$ns->js_stream_delete('OUTBOX');
OutboxBrokerServer::produce($node, 'nats-c', 300);
ok(wait_match($err_c, qr/sink unavailable: .*no JetStream stream captures subject "outbox.commands"/),
	'a removed stream is an outage (no responders), logged')
  or diag(OutboxBrokerServer::slurp($err_c));
is($node->safe_psql('postgres',
	"SELECT count(*) FROM outbox.commands WHERE run_id = 'nats-c' AND status IN ('dead', 'published')"),
	'0', 'nothing dead-lettered, nothing acked');
$ns->js_stream_create('OUTBOX', ['outbox.>'], 600);
ok(OutboxBrokerServer::wait_sql($node,
	"SELECT count(*) = 300 FROM outbox.commands WHERE run_id = 'nats-c' AND status = 'published'"),
	'recovered once the stream was back: run c published');
ok(wait_match($err_c, qr/available again/), 'the recovery was logged');
kill 'TERM', $pid_c;
is(OutboxBrokerServer::wait_exit($pid_c), 0, 'relay c1 exits 0 on SIGTERM');
($seen, $bad) = stream_ids();
is(scalar(grep { ($seen->{$_} // 0) != 1 } OutboxBrokerServer::published_ids($node, 'nats-c')), 0,
	'every command of run c is in the new stream, once');
is($node->safe_psql('postgres',
	"SELECT count(*) FROM outbox.commands WHERE run_id LIKE 'nats-%' AND status = 'dead'"), '0',
	'no command of any run is dead');

conservation_clean($node, 'after the NATS runs');

$ns->stop;
ok(!$ns->running, 'server stopped');
$node->stop;
done_testing();
