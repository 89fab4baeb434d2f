# outbox-relay's idle probe (--probe-interval): a relay with nothing to
# deliver probes its sink's broker, so that outbox_relay_sink_up on
# /metrics says whether the broker is there also when nothing is being
# delivered.  For each broker sink the relay was built with (Redis, NATS
# JetStream, Mosquitto; brokers of the test's own on 127.0.0.1): the relay
# delivers a few commands, goes idle, the broker is stopped (sink_up 0, one
# outage counted, one line logged, nothing claimed or failed meanwhile),
# started again (sink_up 1, logged), and the relay delivers again.  The
# HTTP sink's probe (a connection, no request) against a listening socket
# that comes and goes.  Conservation is clean at the end.

use strict;
use warnings;

use HTTP::Tiny;
use IO::Socket::INET;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use FindBin;
use lib "$FindBin::RealBin/../perl";
use OutboxTest;
use OutboxBroker;
use OutboxBrokerServer;

my $tmp = PostgreSQL::Test::Utils::tempdir;
my $node = OutboxBrokerServer::sink_test_node('probe');
my $dsn = $node->connstr('postgres');
sub sq { return $node->safe_psql('postgres', $_[0]); }
my $http = HTTP::Tiny->new(timeout => 5);

# Scrape a relay's /metrics: {'name{labels}' => value}.
sub scrape
{
	my ($mport) = @_;
	my $r = $http->get("http://127.0.0.1:$mport/metrics");
	return {} unless $r->{success};
	my %m;
	for (split /\n/, $r->{content})
	{
		next if /^#/;
		my ($k, $v) = /^(\S+) (\S+)$/ or next;
		$m{$k} = $v;
	}
	return \%m;
}

# Wait until series $k of the relay at $mport has value $v; its last value.
sub wait_metric
{
	my ($mport, $k, $v) = @_;
	my $last;
	wait_until(sub { $last = scrape($mport)->{$k}; defined $last && $last == $v });
	return $last;
}

# Start an idle relay with a 0.3 s probe interval and /metrics: (pid,
# metrics port, stderr file).
sub probing_relay
{
	my ($name, $sink, @args) = @_;
	my $mport = PostgreSQL::Test::Cluster::get_free_port();
	my $err = "$tmp/$name.err";
	my $pid = track_pid(spawn("$tmp/$name.out", $err, 'outbox-relay', '--dsn', $dsn,
		'--sink', $sink, '--worker', $name, '--kinds', $name, '--poll', '0.2',
		'--probe-interval', '0.3', '--connect-timeout', '2', '--timeout', '5',
		'--metrics', "127.0.0.1:$mport", @args));
	return ($pid, $mport, $err);
}

# Commit $n commands of kind $kind (run $kind).
sub produce
{
	my ($kind, $n, $first) = @_;
	my $last = $first + $n - 1;
	sq(qq{SELECT outbox.commit_decision('$kind', s, 'decided', format('%s-%s', '$kind', s), '$kind', '{}')
		FROM generate_series($first, $last) s});
}

# Published and other commands of kind $kind: "P O".
sub states
{
	my ($kind) = @_;
	return sq(qq{SELECT count(*) FILTER (WHERE status = 'published') || ' ' ||
		count(*) FILTER (WHERE status <> 'published') FROM outbox.commands WHERE kind = '$kind'});
}

# A bad interval is a usage error.
{
	my ($rc, $err) = OutboxBrokerServer::relay_run('--dsn', $dsn, '--sink', 'stdout',
		'--probe-interval', '-1', '--drain');
	is($rc, 2, '--probe-interval -1: exit 2');
	like($err, qr/invalid value "-1" for --probe-interval/, '--probe-interval -1: says why');
}

# The brokers: name, the relay's sink, start, stop.
my @brokers;
if (relay_has_sink('redis'))
{
	my $port = PostgreSQL::Test::Cluster::get_free_port();
	my $dir = "$tmp/redis";
	mkdir $dir or die "mkdir $dir: $!";
	my $pid;
	my $ping = sub {
		my $out = '';
		IPC::Run::run([ 'redis-cli', '-h', '127.0.0.1', '-p', $port, 'PING' ],
			'<', \undef, '>', \$out, '2>', "$tmp/redis-cli.err");
		return $out =~ /PONG/;
	};
	push @brokers, {
		name => 'redis',
		sink => "redis://127.0.0.1:$port?stream=probe",
		start => sub {
			$pid = track_pid(spawn("$tmp/redis.out", "$tmp/redis.err", 'redis-server',
				'--port', $port, '--bind', '127.0.0.1', '--dir', $dir, '--save', '',
				'--appendonly', 'no', '--logfile', "$dir/redis.log"));
			wait_until($ping) or die 'redis-server did not start';
		},
		stop => sub {
			kill 'TERM', $pid;
			defined(wait_exit($pid)) or die 'redis-server did not stop';
			untrack_pid($pid);
		} };
}
if (relay_has_sink('nats'))
{
	my $ns = OutboxBrokerServer->new('nats', "$tmp/nats");
	my $created = 0;
	push @brokers, {
		name => 'nats',
		sink => undef,
		start => sub {
			$ns->start;
			$ns->js_stream_create('PROBE', ['probe.>'], 600) unless $created++;
		},
		stop => sub { $ns->stop },
		server => $ns,
		path => '/probe.commands' };
}
if (relay_has_sink('mqtt'))
{
	my $mq = OutboxBrokerServer->new('mosquitto', "$tmp/mosquitto");
	push @brokers, {
		name => 'mqtt',
		sink => undef,
		start => sub { $mq->start },
		stop => sub { $mq->stop },
		server => $mq,
		path => '/probe/commands?qos=1' };
}

for my $b (@brokers)
{
	my $name = $b->{name};
	$b->{start}->();
	my $sink = $b->{sink} // $b->{server}->url . $b->{path};
	my ($pid, $mport, $err) = probing_relay("probe-$name", $sink);

	produce("probe-$name", 5, 1);
	ok($node->poll_query_until('postgres',
		"SELECT count(*) = 5 FROM outbox.commands WHERE kind = 'probe-$name' AND status = 'published'"),
		"$name: the relay delivers");
	is(wait_metric($mport, "outbox_relay_sink_up{scheme=\"$name\"}", 1), 1,
		"$name: sink_up 1 while the broker is up");

	# the relay is idle: nothing to deliver, so only the probe can notice
	$b->{stop}->();
	is(wait_metric($mport, "outbox_relay_sink_up{scheme=\"$name\"}", 0), 0,
		"$name: broker stopped while the relay is idle: sink_up 0");
	my $m = scrape($mport);
	is($m->{"outbox_relay_sink_outages_total{scheme=\"$name\"}"}, 1, "$name: one outage counted");
	is($m->{outbox_relay_in_flight}, 0, "$name: nothing in flight meanwhile");
	is($m->{'outbox_relay_sink_failures_total{class="outage"}'}, 0,
		"$name: no command was held: the probe is no delivery");
	ok(wait_match($err, qr/idle probe: sink unavailable: /), "$name: the outage is logged");
	is(states("probe-$name"), '5 0', "$name: nothing claimed or failed during the outage");

	$b->{start}->();
	is(wait_metric($mport, "outbox_relay_sink_up{scheme=\"$name\"}", 1), 1,
		"$name: broker back: sink_up 1");
	ok(wait_match($err, qr/idle probe: sink \S+.* is available again/), "$name: the return is logged");
	my @down = (OutboxBrokerServer::slurp($err) =~ /idle probe: sink unavailable/g);
	is(scalar(@down), 1, "$name: the outage is logged once");

	produce("probe-$name", 5, 6);
	ok($node->poll_query_until('postgres',
		"SELECT count(*) = 10 FROM outbox.commands WHERE kind = 'probe-$name' AND status = 'published'"),
		"$name: the relay delivers again after the broker's return");
	is(sq("SELECT max(deliveries) FROM outbox.commands WHERE kind = 'probe-$name'"), '1',
		"$name: every command on its first delivery");

	kill 'TERM', $pid;
	is(wait_exit($pid), 0, "$name: the relay exits 0 on SIGTERM");
	untrack_pid($pid);
	$b->{stop}->();
}

# ---------------------------------------------------------------------------
# HTTP: a connection is the probe (no request: a request could have
# effects); an endpoint that does not listen is down
# ---------------------------------------------------------------------------
{
	my $port = PostgreSQL::Test::Cluster::get_free_port();
	my ($pid, $mport, $err) = probing_relay('probe-http', "http://127.0.0.1:$port/apply");
	is(wait_metric($mport, 'outbox_relay_sink_up{scheme="http"}', 0), 0,
		'http: nothing listens: sink_up 0');
	my $listener = IO::Socket::INET->new(LocalAddr => '127.0.0.1', LocalPort => $port,
		Listen => 16, ReuseAddr => 1) or die "listen on $port: $!";
	is(wait_metric($mport, 'outbox_relay_sink_up{scheme="http"}', 1), 1,
		'http: the endpoint listens: sink_up 1');
	# the probe sent nothing: no request reached the endpoint
	my $conn = $listener->accept;
	my $got = '';
	if ($conn)
	{
		$conn->blocking(0);
		$conn->sysread($got, 4096);
	}
	is($got // '', '', 'http: the probe connected and sent no request');
	close($conn) if $conn;
	close($listener);
	is(wait_metric($mport, 'outbox_relay_sink_up{scheme="http"}', 0), 0,
		'http: the endpoint is gone: sink_up 0');
	is(sq("SELECT count(*) FROM outbox.commands WHERE kind = 'probe-http'"), '0',
		'http: nothing was claimed');
	kill 'TERM', $pid;
	is(wait_exit($pid), 0, 'http: the relay exits 0 on SIGTERM');
	untrack_pid($pid);
}

conservation_clean($node, "058");

$node->stop;
done_testing();
