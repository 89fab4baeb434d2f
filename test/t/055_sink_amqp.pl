# outbox-relay's AMQP sink against a real RabbitMQ (Debian's rabbitmq-server,
# started by the test on loopback ports of its own): 2,000 commands from
# two relays read back with amqp-consume, each exactly once; the broker
# killed in the middle of a batch (nothing unconfirmed acked, nothing dead,
# recovery when it returns); the exchange deleted under the relays (an
# outage: commands held, not failed), a refused login (an outage as well)
# and an unroutable routing key (a retryable failure of the command);
# configuration errors at start-up;
# outbox.verify() clean at the end.

use strict;
use warnings;

use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(usleep);
use FindBin;
use lib "$FindBin::RealBin/../perl";
use OutboxBrokerServer;
use OutboxBroker qw(relay_has_sink conservation_clean wait_match);

plan skip_all => 'outbox-relay was built without the amqp sink (librabbitmq-dev)'
  unless relay_has_sink('amqp');
my ($rc, $err);

my $tmp = PostgreSQL::Test::Utils::tempdir;
my $node = OutboxBrokerServer::sink_test_node('amqp');
my $dsn = $node->connstr('postgres');

my $mq = OutboxBrokerServer->new('rabbitmq', "$tmp/rabbitmq");
$mq->start;
$mq->rabbit_declare([ [ 'outbox', 'direct' ] ], [ ['commands'] ],
	[ [ 'outbox', 'commands', 'cmd' ] ]);
my $port = $mq->port;
my $sink = "amqp://guest\@127.0.0.1:$port?exchange=outbox&routing_key=cmd";
$ENV{OUTBOX_RELAY_AMQP_PASSWORD} = 'guest';

# Every message of the queue, consumed: command_id => count.
sub consume_all
{
	my ($expect) = @_;
	my $n = $mq->rabbit_queue_length('commands');
	my %seen;
	for my $body ($mq->rabbit_consume('commands', $n))
	{
		$seen{$1}++ if $body =~ /"command_id":\s*"([^"]+)"/;
	}
	return \%seen;
}

# ---------------------------------------------------------------------------
# Configuration errors: exit 2, one line, before any delivery
# ---------------------------------------------------------------------------
for my $case (
	[ "amqp://guest\@127.0.0.1:$port?routing_key=cmd", qr/option "exchange" is required/ ],
	[ "amqp://guest:secret\@127.0.0.1:$port?exchange=outbox&routing_key=cmd",
		qr/password must not be in the URL/ ],
	[ "amqp://127.0.0.1:$port?exchange=outbox&routing_key=cmd&window=0",
		qr/option "window" must be an integer/ ],
	[ "amqp://127.0.0.1:$port?exchange=outbox&routing_key=cmd&bogus=1", qr/unknown option "bogus"/ ])
{
	my ($url, $re) = @$case;
	($rc, $err) = OutboxBrokerServer::relay_run('--dsn', $dsn, '--sink', $url, '--drain');
	is($rc, 2, "bad URL exits 2: $re");
	like($err, $re, "bad URL says why: $re");
	unlike($err, qr/secret/, 'the password is not repeated') if $url =~ /secret/;
}

# ---------------------------------------------------------------------------
# 2,000 commands, 2 relays: each exactly once in the queue
# ---------------------------------------------------------------------------
OutboxBrokerServer::produce($node, 'amqp-a', 2000);
my @relays = map { [ OutboxBrokerServer::relay_start($tmp, "a$_", '--dsn', $dsn, '--sink', $sink,
			'--batch', 100, '--drain') ] } 1 .. 2;
is(OutboxBrokerServer::wait_exit($_->[0]), 0, 'relay drained and exited 0') for @relays;
is(OutboxBrokerServer::run_states($node, 'amqp-a'), '2000 0 0', 'all 2,000 commands published');
my $seen = consume_all();
is(scalar(keys %$seen), 2000, 'the queue holds 2,000 distinct commands');
is(scalar(grep { $seen->{$_} != 1 } keys %$seen), 0, 'each exactly once');
is(scalar(grep { !$seen->{$_} } OutboxBrokerServer::published_ids($node, 'amqp-a')), 0,
	'every published command is in the queue');
is($node->safe_psql('postgres', "SELECT max(deliveries) FROM outbox.commands WHERE run_id = 'amqp-a'"),
	'1', 'one delivery each');

# ---------------------------------------------------------------------------
# The producer's headers and seq arrive in the message's headers table.
# amqp-consume and amqp-get print bodies only, so test/amqp-peek (a
# librabbitmq basic.get) reads the properties back.
# ---------------------------------------------------------------------------
{
	my $peek = ($ENV{OUTBOX_SRC} // "$FindBin::RealBin/../..") . '/test/amqp-peek';
	ok(-x $peek, 'test/amqp-peek is built') or diag("no $peek");
	$node->safe_psql('postgres', q{SELECT outbox.commit_decision('amqp-h', 3, 'decided', 'amqp-h-1', 'hdr', '{}',
		headers => '{"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", "x-correlation-id": "corr-a", "seq": "spoof"}')});
	($rc, $err) = OutboxBrokerServer::relay_run('--dsn', $dsn, '--sink', $sink, '--kinds', 'hdr', '--drain',
		'--worker', 'h1');
	is($rc, 0, 'headers: the relay drains') or diag($err);
	my $out = `'$peek' 127.0.0.1 $port commands 10`;
	is($? >> 8, 0, 'headers: amqp-peek read the queue');
	my %h = map { split /=/, $_, 2 } grep { /=/ } split /\t/, (split /\n/, $out)[0] // '';
	is($h{message_id}, 'amqp-h-1', 'headers: message_id is the command_id');
	is($h{traceparent}, '00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01', 'headers: traceparent arrives in the headers table');
	is($h{'x-correlation-id'}, 'corr-a', 'headers: x-correlation-id arrives');
	is($h{seq}, '3', 'headers: seq is in the headers table (the producer\'s "seq" does not replace it)');
	is(scalar(split /\n/, $out), 1, 'headers: one message');
	ok(!exists $h{'p:correlation_id'}, 'headers: x-correlation-id sets no correlation_id property');
	is($h{'p:content_type'}, 'application/json', 'headers: content_type is the body\'s');

	# the standard names also set the basic properties
	$node->safe_psql('postgres', q{SELECT outbox.commit_decision('amqp-p', 1, 'decided', 'amqp-p-1', 'hdr', '{}',
		headers => '{"correlation-id": "corr-1", "reply_to": "replies", "priority": "7", "content-type": "application/vnd.acme+json", "expiration": "60000"}')});
	$node->safe_psql('postgres', q{SELECT outbox.commit_decision('amqp-p', 2, 'decided', 'amqp-p-2', 'hdr', '{}',
		headers => '{"correlation_id": "corr-2", "Correlation-ID": "corr-2b", "priority": "300"}')});
	($rc, $err) = OutboxBrokerServer::relay_run('--dsn', $dsn, '--sink', $sink, '--kinds', 'hdr', '--drain',
		'--worker', 'h2');
	is($rc, 0, 'properties: the relay drains') or diag($err);
	$out = `'$peek' 127.0.0.1 $port commands 10`;
	is($? >> 8, 0, 'properties: amqp-peek read the queue');
	my %m;
	for my $line (split /\n/, $out)
	{
		my %f = map { split /=/, $_, 2 } grep { /=/ } split /\t/, $line;
		$m{ $f{message_id} } = \%f;
	}
	is(join(',', sort keys %m), 'amqp-p-1,amqp-p-2', 'properties: both messages');
	is($m{'amqp-p-1'}{'p:correlation_id'}, 'corr-1', 'properties: correlation-id sets correlation_id');
	is($m{'amqp-p-1'}{'p:reply_to'}, 'replies', 'properties: reply_to sets reply_to');
	is($m{'amqp-p-1'}{'p:priority'}, '7', 'properties: priority sets priority');
	is($m{'amqp-p-1'}{'p:content_type'}, 'application/json',
		'properties: the producer\'s content-type does not replace the body\'s content_type');
	is($m{'amqp-p-1'}{'content-type'}, 'application/vnd.acme+json',
		'properties: the producer\'s content-type stays in the headers table');
	ok(!exists $m{'amqp-p-1'}{'p:expiration'}, 'properties: expiration sets no TTL');
	is($m{'amqp-p-1'}{'correlation-id'}, 'corr-1', 'properties: the header stays in the headers table too');
	is($m{'amqp-p-2'}{'p:correlation_id'}, 'corr-2b',
		'properties: correlation-id wins over correlation_id');
	ok(!exists $m{'amqp-p-2'}{'p:priority'}, 'properties: a priority over 255 sets no property');
}

# ---------------------------------------------------------------------------
# The broker killed mid-batch, restarted: nothing unconfirmed acked,
# nothing dead, recovery
# ---------------------------------------------------------------------------
OutboxBrokerServer::produce($node, 'amqp-b', 1000);
@relays = map { [ OutboxBrokerServer::relay_start($tmp, "b$_", '--dsn', $dsn, '--sink', $sink,
			'--batch', 100, '--timeout', 3) ] } 1 .. 2;
ok(OutboxBrokerServer::wait_sql($node,
	"SELECT count(*) = 1000 FROM outbox.commands WHERE run_id = 'amqp-b' AND status = 'published'"),
	'relays published the first half of run b');
# freeze the broker, let the relays claim and publish into it, then kill it
$mq->freeze;
OutboxBrokerServer::produce($node, 'amqp-b', 1000, 'broker', 1001);
ok(OutboxBrokerServer::wait_sql($node,
	"SELECT count(*) > 0 FROM outbox.commands WHERE run_id = 'amqp-b' AND status = 'sending'"),
	'relays hold a batch in flight');
$mq->kill9;
my @acked_before = OutboxBrokerServer::published_ids($node, 'amqp-b');
usleep(1_500_000);
is(OutboxBrokerServer::run_states($node, 'amqp-b') =~ s/ \d+$//r, '1000 0',
	'nothing unconfirmed acked, nothing dead while the broker is down');
$mq->start;
ok(OutboxBrokerServer::wait_sql($node,
	"SELECT count(*) = 2000 FROM outbox.commands WHERE run_id = 'amqp-b' AND status = 'published'"),
	'the relays recovered when the broker returned');
kill 'TERM', $_->[0] for @relays;
is(OutboxBrokerServer::wait_exit($_->[0]), 0, 'relay exits 0 on SIGTERM') for @relays;
is(OutboxBrokerServer::run_states($node, 'amqp-b'), '2000 0 0', 'run b: all published, none dead');
like(OutboxBrokerServer::slurp($relays[0][1]) . OutboxBrokerServer::slurp($relays[1][1]),
	qr/sink unavailable: .*(connection|confirm)/, 'the outage was logged as such');
$seen = consume_all();
is(scalar(grep { !$seen->{$_} } OutboxBrokerServer::published_ids($node, 'amqp-b')), 0,
	'every published command of run b is in the queue (acked only after the confirm)');
is(scalar(grep { !$seen->{$_} } @acked_before), 0,
	'including those acked before the kill (persisted)');
is(scalar(grep { !/^amqp-b-\d{5}$/ } keys %$seen), 0, 'nothing else in the queue');
cmp_ok($node->safe_psql('postgres',
	"SELECT max(deliveries) FROM outbox.commands WHERE run_id = 'amqp-b'"), '<=', 2,
	'the outage spent no deliveries (at most one more than a clean run)');

# ---------------------------------------------------------------------------
# Broker-side errors: the exchange deleted (an outage), an unroutable key
# (a retryable failure of the command)
# ---------------------------------------------------------------------------
OutboxBrokerServer::produce($node, 'amqp-c', 600);
$mq->rabbit_delete_exchange('outbox');
my ($pid_c, $err_c) = OutboxBrokerServer::relay_start($tmp, 'c1', '--dsn', $dsn, '--sink', $sink,
	'--batch', 50, '--drain', '--kinds', 'broker');
my $logged = 0;
for (1 .. 300)
{
	$logged = 1, last if OutboxBrokerServer::slurp($err_c) =~ /sink unavailable: .*404/;
	usleep(100_000);
}
ok($logged, 'a deleted exchange is an outage (404 NOT_FOUND), logged once')
  or diag(OutboxBrokerServer::slurp($err_c));
is($node->safe_psql('postgres',
	"SELECT count(*) FROM outbox.commands WHERE run_id = 'amqp-c' AND status = 'dead'"), '0',
	'no command dead-lettered for it');
# The definitions are imported one after the other: a message published
# between the exchange and its binding is returned (unroutable), which is a
# retryable failure with a backoff, and --drain would exit before it is
# due.  The relay is stopped while they are imported, so that it sees the
# exchange come back with its binding.
kill 'STOP', $pid_c;
$mq->rabbit_declare([ [ 'outbox', 'direct' ] ], [ ['commands'] ],
	[ [ 'outbox', 'commands', 'cmd' ] ]);
kill 'CONT', $pid_c;
is(OutboxBrokerServer::wait_exit($pid_c), 0, 'the relay recovered once the exchange was back');
is(OutboxBrokerServer::run_states($node, 'amqp-c'), '600 0 0', 'run c: all published')
  or diag($node->safe_psql('postgres', q{
	SELECT status, deliveries, last_error, count(*)
	FROM outbox.commands WHERE run_id = 'amqp-c' AND status <> 'published'
	GROUP BY 1, 2, 3 }));
like(OutboxBrokerServer::slurp($err_c), qr/available again/, 'the recovery was logged');
$seen = consume_all();
is(scalar(grep { !$seen->{$_} } OutboxBrokerServer::published_ids($node, 'amqp-c')), 0,
	'every command of run c is in the queue');

# a refused login is an outage too: nothing is spent on it
OutboxBrokerServer::produce($node, 'amqp-e', 3, 'login');
open(my $pw, '>', "$tmp/wrong.pw") or die;
print $pw "not-the-password\n";
close($pw);
my ($pid_e, $err_e) = OutboxBrokerServer::relay_start($tmp, 'e1', '--dsn', $dsn, '--kinds', 'login',
	'--sink', "amqp://guest\@127.0.0.1:$port?exchange=outbox&routing_key=cmd&password_file=$tmp/wrong.pw");
ok(wait_match($err_e, qr/sink unavailable: could not log in to 127.0.0.1:\d+ as "guest"/),
	'a refused login is an outage, logged')
  or diag(OutboxBrokerServer::slurp($err_e));
unlike(OutboxBrokerServer::slurp($err_e), qr/not-the-password/, 'the password is not logged');
kill 'TERM', $pid_e;
is(OutboxBrokerServer::wait_exit($pid_e), 0, 'relay e1 exits 0 on SIGTERM');
is($node->safe_psql('postgres',
	"SELECT string_agg(DISTINCT status::text || ' ' || deliveries, ',') FROM outbox.commands WHERE run_id = 'amqp-e'"),
	'pending 1', 'held and handed back: pending, one delivery, not dead');

# the password from a file; an unroutable routing key
open($pw, '>', "$tmp/guest.pw") or die;
print $pw "guest\n";
close($pw);
OutboxBrokerServer::produce($node, 'amqp-d', 3, 'lost');
($rc, $err) = OutboxBrokerServer::relay_run('--dsn', $dsn, '--kinds', 'lost', '--drain', '--worker', 'd1',
	'--sink', "amqp://guest\@127.0.0.1:$port?exchange=outbox&routing_key=nowhere&password_file=$tmp/guest.pw");
is($rc, 0, 'relay with an unroutable key exits 0');
is($node->safe_psql('postgres',
	"SELECT string_agg(DISTINCT status::text || ' ' || (last_error LIKE 'unroutable:%')::text, ',') FROM outbox.commands WHERE run_id = 'amqp-d'"),
	'pending true', 'an unroutable message is a retryable failure (basic.return), not an ack');
is($mq->rabbit_queue_length('commands'), '0', 'and nothing reached the queue');

# ---------------------------------------------------------------------------
# Conservation
# ---------------------------------------------------------------------------
conservation_clean($node, 'after the AMQP runs');

$mq->stop;
ok(!$mq->running, 'broker stopped');
$node->stop;
done_testing();
