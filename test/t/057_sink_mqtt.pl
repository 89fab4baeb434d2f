# outbox-relay's MQTT sink against a real Mosquitto (Debian's mosquitto,
# started by the test on a loopback port of its own, persistence in its
# own directory): 2,000 commands from two relays at QoS 1 read back with
# mosquitto_sub from a persistent session, each exactly once, its MQTT 5
# user properties matching the body; QoS 2 (PUBCOMP); the broker stopped in
# the middle of a batch (nothing unconfirmed acked, nothing dead, recovery
# when it returns, every command at least once); a topic the broker's ACL
# denies and a wrong password (outages: commands held, not failed), the
# password from the environment; configuration errors at start-up;
# outbox.verify() clean at the end.

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

plan skip_all => 'outbox-relay was built without the mqtt sink (libmosquitto-dev)'
  unless relay_has_sink('mqtt');
my ($rc, $err, $out);

my $tmp = PostgreSQL::Test::Utils::tempdir;
my $node = OutboxBrokerServer::sink_test_node('mqtt');
my $dsn = $node->connstr('postgres');

my $mq = OutboxBrokerServer->new('mosquitto', "$tmp/mosquitto");
$mq->start;
my $port = $mq->port;
my $sink = "mqtt://127.0.0.1:$port/outbox/commands?qos=1";

# The reader: a persistent session (QoS 1) that the broker queues for.
my @reader = ('-c', '-i', 'outbox-reader', '-q', '1', '-t', 'outbox/commands');
($rc, $out) = $mq->mqtt_sub(@reader, '-E');
is($rc, 0, 'the reader session is subscribed');

# What the reader session got, up to $n messages (or all within a few
# seconds): command_id => count, and the number whose user properties do
# not match the body.
sub read_messages
{
	my ($n) = @_;
	my ($rc, $out) = $mq->mqtt_sub(@reader, '-F', '%P|%p', (defined $n ? ('-C', $n) : ()),
		'-W', defined $n ? 60 : 3);
	my %seen;
	my $bad = 0;
	for my $line (split /\n/, $out)
	{
		my ($props, $payload) = split(/\|/, $line, 2);
		next unless defined $payload;
		my $body = eval { decode_json($payload) } // {};
		my $id = $body->{command_id} // '';
		$bad++ unless $props =~ /\bcommand_id:\Q$id\E\b/ && $props =~ /\brun_id:\Q$body->{run_id}\E\b/;
		$seen{$id}++;
	}
	return (\%seen, $bad);
}

# ---------------------------------------------------------------------------
# Configuration errors: exit 2, one line
# ---------------------------------------------------------------------------
for my $case (
	[ "mqtt://127.0.0.1:$port/outbox/commands?qos=0", qr/qos=0 is refused/ ],
	[ "mqtt://127.0.0.1:$port/outbox/+", qr/must be a topic to publish to/ ],
	[ "mqtt://u:secret\@127.0.0.1:$port/outbox/commands", qr/password must not be in the URL/ ],
	[ "mqtt://127.0.0.1:$port/outbox/commands?retain=1", qr/unknown option "retain"/ ])
{
	my ($url, $re) = @$case;
	($rc, $err) = OutboxBrokerServer::relay_run('--dsn', $dsn, '--sink', $url, '--drain');
	is($rc, 2, "refused at start-up with exit 2: $re");
	like($err, $re, "says why: $re");
	unlike($err, qr/\n./, 'in one line');
}

# ---------------------------------------------------------------------------
# 2,000 commands, 2 relays, QoS 1: each exactly once
# ---------------------------------------------------------------------------
OutboxBrokerServer::produce($node, 'mqtt-a', 2000);
my @relays = map { [ OutboxBrokerServer::relay_start($tmp, "a$_", '--dsn', $dsn, '--sink', $sink,
			'--batch', 100, '--drain') ] } 1 .. 2;
is(OutboxBrokerServer::wait_exit($_->[0]), 0, 'relay drained and exited 0') for @relays;
is(OutboxBrokerServer::run_states($node, 'mqtt-a'), '2000 0 0', 'all 2,000 commands published');
my ($seen, $bad) = read_messages(2000);
is(scalar(keys %$seen), 2000, 'the reader got 2,000 distinct commands');
is(scalar(grep { $seen->{$_} != 1 } keys %$seen), 0, 'each once');
is($bad, 0, 'each with user properties command_id and run_id matching its body');
is(scalar(grep { !$seen->{$_} } OutboxBrokerServer::published_ids($node, 'mqtt-a')), 0,
	'every published command reached the reader');
($seen) = read_messages();
is(scalar(keys %$seen), 0, 'and nothing more: no duplicate');

# The producer's headers and seq arrive as MQTT 5 user properties
# (mosquitto_sub -F %P prints them as key:value).
$node->safe_psql('postgres', q{SELECT outbox.commit_decision('mqtt-h', 9, 'decided', 'mqtt-h-1', 'broker', '{}',
	headers => '{"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", "x-correlation-id": "corr-m"}')});
($rc, $err) = OutboxBrokerServer::relay_run('--dsn', $dsn, '--sink', $sink, '--drain', '--worker', 'h1');
is($rc, 0, 'headers: the relay drains') or diag($err);
($rc, $out) = $mq->mqtt_sub(@reader, '-F', '%P', '-C', 1, '-W', 60);
like($out, qr/\btraceparent:00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01/, 'headers: traceparent arrives as a user property');
like($out, qr/\bx-correlation-id:corr-m\b/, 'headers: x-correlation-id arrives');
like($out, qr/\bseq:9\b/, 'headers: seq is a user property');
like($out, qr/\bcommand_id:mqtt-h-1\b/, 'headers: of the command');

# QoS 2: acked after PUBCOMP
OutboxBrokerServer::produce($node, 'mqtt-q2', 20, 'qos2');
($rc, $out) = $mq->mqtt_sub('-c', '-i', 'outbox-reader-2', '-q', '2', '-t', 'outbox/qos2', '-E');
($rc, $err) = OutboxBrokerServer::relay_run('--dsn', $dsn, '--kinds', 'qos2', '--drain', '--worker', 'q2',
	'--sink', "mqtt://127.0.0.1:$port/outbox/qos2?qos=2");
is($rc, 0, 'QoS 2 relay drained');
is(OutboxBrokerServer::run_states($node, 'mqtt-q2'), '20 0 0', 'QoS 2: all published');
($rc, $out) = $mq->mqtt_sub('-c', '-i', 'outbox-reader-2', '-q', '2', '-t', 'outbox/qos2',
	'-C', 20, '-W', 60);
is(scalar(() = $out =~ /"command_id": ?"mqtt-q2-\d+"/g), 20, 'QoS 2: the reader got the 20');

# ---------------------------------------------------------------------------
# The broker stopped mid-batch, restarted: nothing unconfirmed acked,
# nothing dead, recovery, every command at least once
# ---------------------------------------------------------------------------
OutboxBrokerServer::produce($node, 'mqtt-b', 1000);
@relays = map { [ OutboxBrokerServer::relay_start($tmp, "b$_", '--dsn', $dsn, '--sink', $sink,
			'--batch', 100, '--timeout', 3) ] } 1 .. 2;
ok(OutboxBrokerServer::wait_sql($node,
	"SELECT count(*) = 1000 FROM outbox.commands WHERE run_id = 'mqtt-b' AND status = 'published'"),
	'relays published the first half of run b');
# freeze the broker, let the relays claim and publish into it, then stop it
$mq->freeze;
OutboxBrokerServer::produce($node, 'mqtt-b', 1000, 'broker', 1001);
ok(OutboxBrokerServer::wait_sql($node,
	"SELECT count(*) > 0 FROM outbox.commands WHERE run_id = 'mqtt-b' AND status = 'sending'"),
	'relays hold a batch in flight');
my @acked_before = OutboxBrokerServer::published_ids($node, 'mqtt-b');
is(scalar(@acked_before), 1000, 'nothing acked while the broker is frozen');
$mq->stop;
usleep(1_500_000);
is(OutboxBrokerServer::run_states($node, 'mqtt-b') =~ s/ \d+$//r, '1000 0',
	'nothing more acked, nothing dead while the broker is down');
$mq->start;
ok(OutboxBrokerServer::wait_sql($node,
	"SELECT count(*) = 2000 FROM outbox.commands WHERE run_id = 'mqtt-b' AND status = 'published'"),
	'the relays recovered when the broker returned');
kill 'TERM', $_->[0] for @relays;
is(OutboxBrokerServer::wait_exit($_->[0]), 0, 'relay exits 0 on SIGTERM') for @relays;
is(OutboxBrokerServer::run_states($node, 'mqtt-b'), '2000 0 0', 'run b: all published, none dead');
like(OutboxBrokerServer::slurp($relays[0][1]) . OutboxBrokerServer::slurp($relays[1][1]),
	qr/sink unavailable: .*(connect|PUBACK)/, 'the outage was logged as such');
($seen, $bad) = read_messages(2000);
my ($more, $bad_more) = read_messages();
$seen->{$_} += $more->{$_} for keys %$more;
$bad += $bad_more;
is(scalar(grep { !$seen->{$_} } OutboxBrokerServer::published_ids($node, 'mqtt-b')), 0,
	'every command of run b reached the reader (at least once)');
is($bad, 0, 'duplicates, if any, carry the same command_id');
is(scalar(grep { !/^mqtt-b-\d{5}$/ } keys %$seen), 0, 'nothing else');
cmp_ok($node->safe_psql('postgres',
	"SELECT max(deliveries) FROM outbox.commands WHERE run_id = 'mqtt-b'"), '<=', 2,
	'the outage spent no deliveries');

# ---------------------------------------------------------------------------
# A topic the broker's ACL denies: PUBACK "not authorized", an outage
# ---------------------------------------------------------------------------
# a broker of its own for it (Mosquitto 2.0.11 applies an ACL file to the
# sessions it restores after a restart as if they were not anonymous, so
# the broker above has none): anonymous clients may use outbox/commands only
my $mq_acl = OutboxBrokerServer->new('mosquitto', "$tmp/mosquitto-acl",
	acl => "topic readwrite outbox/commands\n");
$mq_acl->start;
OutboxBrokerServer::produce($node, 'mqtt-d', 5, 'denied');
my ($pid_d, $err_d) = OutboxBrokerServer::relay_start($tmp, 'd1', '--dsn', $dsn, '--kinds', 'denied',
	'--sink', "mqtt://127.0.0.1:" . $mq_acl->port . "/outbox/denied?qos=1");
ok(wait_match($err_d, qr/sink unavailable: .*not authori[sz]ed/i),
	'a denied topic is an outage (PUBACK 0x87), logged')
  or diag(OutboxBrokerServer::slurp($err_d));
is($node->safe_psql('postgres',
	"SELECT count(*) FROM outbox.commands WHERE run_id = 'mqtt-d' AND status IN ('dead', 'published')"),
	'0', 'nothing dead-lettered, nothing acked');
kill 'TERM', $pid_d;
is(OutboxBrokerServer::wait_exit($pid_d), 0, 'relay d1 exits 0 on SIGTERM');
is($node->safe_psql('postgres',
	"SELECT string_agg(DISTINCT status::text, ',') FROM outbox.commands WHERE run_id = 'mqtt-d'"),
	'pending', 'the held commands went back, retryable');

# ---------------------------------------------------------------------------
# Authentication: the password from the environment; a wrong one is an
# outage (CONNACK refused), not the commands' fault
# ---------------------------------------------------------------------------
my $mq_auth = OutboxBrokerServer->new('mosquitto', "$tmp/mosquitto-auth",
	users => { relay => 'right-password' });
$mq_auth->start;
my $auth_sink = 'mqtt://relay@127.0.0.1:' . $mq_auth->port . '/outbox/commands';
OutboxBrokerServer::produce($node, 'mqtt-e', 3, 'login');
{
	local $ENV{OUTBOX_RELAY_MQTT_PASSWORD} = 'wrong-password';
	my ($pid_e, $err_e) = OutboxBrokerServer::relay_start($tmp, 'e1', '--dsn', $dsn, '--kinds', 'login',
		'--sink', $auth_sink);
	ok(wait_match($err_e, qr/sink unavailable: the broker at \S+ refused the connection: Not authori[sz]ed/i),
		'a wrong password is an outage (CONNACK refused), logged')
	  or diag(OutboxBrokerServer::slurp($err_e));
	unlike(OutboxBrokerServer::slurp($err_e), qr/wrong-password/, 'the password is not logged');
	kill 'TERM', $pid_e;
	is(OutboxBrokerServer::wait_exit($pid_e), 0, 'relay e1 exits 0 on SIGTERM');
	is($node->safe_psql('postgres',
		"SELECT string_agg(DISTINCT status::text || ' ' || deliveries, ',') FROM outbox.commands WHERE run_id = 'mqtt-e'"),
		'pending 1', 'held and handed back: pending, one delivery, not dead');
}
{
	local $ENV{OUTBOX_RELAY_MQTT_PASSWORD} = 'right-password';
	# the handed-back commands are claimable again after their backoff;
	# a --drain relay started before that would stop short of them
	ok(OutboxBrokerServer::wait_sql($node,
		"SELECT bool_and(available_at <= now()) FROM outbox.commands WHERE run_id = 'mqtt-e'"),
		'the held commands are available again');
	($rc, $err) = OutboxBrokerServer::relay_run('--dsn', $dsn, '--kinds', 'login', '--drain',
		'--worker', 'e2', '--sink', $auth_sink);
	is($rc, 0, 'with the right password from the environment: exit 0');
	is(OutboxBrokerServer::run_states($node, 'mqtt-e'), '3 0 0', 'and published');
}
$mq_auth->stop;

conservation_clean($node, 'after the MQTT runs');

$mq->stop;
$mq_acl->stop;
ok(!$mq->running && !$mq_acl->running, 'brokers stopped');
$node->stop;
done_testing();
