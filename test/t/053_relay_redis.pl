# outbox-relay's Redis Streams sink against redis-server (loopback, a port
# and a data directory of its own, AOF with appendfsync always so that
# what it confirmed survives its restart), read back with redis-cli XRANGE.
#
#  1. 2,000 commands from 2 relays competing for them: every command
#     exactly once in the stream, with its fields.
#  2. The server is killed in the middle of a batch: nothing is acked while it
#     is down, nothing is dead-lettered or spends a delivery, the outage is
#     logged once, and the relay resumes when the server is back.
#  3. Broker-side errors, sorted as the docs say: CLIENT PAUSE (no reply
#     within --timeout) and WRONGTYPE (the key is not a stream) hold the
#     batch instead of failing the commands.
# Conservation is clean at the end.

use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use FindBin;
use lib "$FindBin::RealBin/../perl";
use OutboxTest;
use OutboxBroker;

my $tmp = PostgreSQL::Test::Utils::tempdir;

ok(relay_has_sink('redis'), 'outbox-relay was built with the redis sink (libhiredis-dev)')
  or BAIL_OUT('no redis sink: install libhiredis-dev and rebuild');

my $node = outbox_node('redis', "outbox.backoff_base = 100\noutbox.backoff_max = 400\n");
$node->safe_psql('postgres', 'CREATE EXTENSION outbox');
my $dsn = $node->connstr('postgres');
sub sq { return $node->safe_psql('postgres', $_[0]); }

my $port = PostgreSQL::Test::Cluster::get_free_port();
my $rdir = "$tmp/redis";
mkdir $rdir or die "mkdir $rdir: $!";
my $redis_pid;

# redis-cli against our server; its output.
sub rcli
{
	my @args = @_;
	my $out = '';
	IPC::Run::run([ 'redis-cli', '-h', '127.0.0.1', '-p', $port, '--raw', @args ],
		'<', \undef, '>', \$out, '2>', "$tmp/redis-cli.err",
		IPC::Run::timeout($PostgreSQL::Test::Utils::timeout_default));
	chomp $out;
	return $out;
}

# Start the server (again) on our port and directory.
sub start_redis
{
	$redis_pid = track_pid(spawn("$tmp/redis.out", "$tmp/redis.err", 'redis-server',
		'--port', $port, '--bind', '127.0.0.1', '--protected-mode', 'yes',
		'--dir', $rdir, '--appendonly', 'yes', '--appendfsync', 'always', '--save', '',
		'--logfile', "$rdir/redis.log"));
	return wait_until(sub { rcli('PING') eq 'PONG' });
}

# Stop it (SIGTERM: it syncs its AOF and exits 0).
sub stop_redis
{
	kill 'TERM', $redis_pid;
	return wait_exit($redis_pid);
}

# The stream's entries: { id, command_id, run_id, seq, kind, deliveries,
# payload, header:NAME... }.  --raw prints the id and then the fields and
# values one a line; a field name never looks like an entry id.
sub entries
{
	my ($key) = @_;
	my @lines = split /\n/, rcli('XRANGE', $key, '-', '+');
	my @e;
	while (@lines)
	{
		my %e = (id => shift @lines);
		while (@lines && $lines[0] !~ /^\d+-\d+$/)
		{
			my $f = shift @lines;
			$e{$f} = shift @lines;
		}
		push @e, \%e;
	}
	return @e;
}

# Start a relay in the background.
sub relay
{
	my ($name, $sink, @args) = @_;
	return track_pid(spawn("$tmp/$name.out", "$tmp/$name.err", 'outbox-relay',
		'--dsn', $dsn, '--sink', $sink, '--worker', $name, '--poll', '0.2', @args));
}

ok(start_redis(), 'redis-server started');
my $sink = "redis://127.0.0.1:$port?stream=outbox";

# ---------------------------------------------------------------------------
# 1. 2,000 commands, 2 relays, exactly once
# ---------------------------------------------------------------------------
produce_runs($node, 'r1', 2000, 20, q{'ra'});
{
	my $ra = relay('relay-a', $sink, '--kinds', 'ra', '--batch', '100', '--drain');
	my $rb = relay('relay-b', $sink, '--kinds', 'ra', '--batch', '100', '--drain');
	is(wait_exit($ra), 0, '2 relays: the first drains and exits 0');
	is(wait_exit($rb), 0, '2 relays: the second drains and exits 0');
	is(sq("SELECT count(*) FROM outbox.commands WHERE kind = 'ra' AND status = 'published' AND deliveries = 1"),
		'2000', '2 relays: 2000 published, each on its first delivery');
	my @e = entries('outbox');
	my %seen;
	$seen{ $_->{command_id} }++ for @e;
	is(scalar(@e), 2000, '2 relays: 2000 entries in the stream');
	is(scalar(keys %seen), 2000, '2 relays: every command exactly once');
	my ($i) = grep { $_->{command_id} eq 'r1-r7-7' } @e;
	is_deeply([ @{$i}{qw(run_id kind deliveries payload)} ], [ 'r1-r7', 'ra', '1', '{"i": 7}' ],
		'an entry carries run_id, kind, deliveries and the payload');
	ok(!grep({ $_->{command_id} !~ /^r1-r(\d+)-\d+$/ || $_->{run_id} ne "r1-r$1" } @e),
		'every entry: run_id matches its command');
	is($i->{seq}, '7', 'an entry carries seq');
}

# The producer's headers arrive as fields header:NAME (redis-cli XRANGE).
{
	sq(q{SELECT outbox.commit_decision('rh-run', 5, 'decided', 'rh-1', 'rh', '{}',
		headers => '{"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", "content-type": "text/plain"}')});
	is(wait_exit(relay('relay-h', $sink, '--kinds', 'rh', '--drain')), 0, 'headers: the relay drains');
	my ($h) = grep { $_->{command_id} eq 'rh-1' } entries('outbox');
	is($h->{'header:traceparent'}, '00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01',
		'headers: traceparent arrives as the field header:traceparent');
	is($h->{'header:content-type'}, 'text/plain', 'headers: content-type arrives');
	is($h->{seq}, '5', 'headers: with seq');
	is($h->{payload}, '{}', 'headers: the payload field is unchanged');
}

# ---------------------------------------------------------------------------
# 2. The server stops mid-batch, and comes back
# ---------------------------------------------------------------------------
produce_runs($node, 'r2', 2000, 6, q{'rd'});
{
	my $err = "$tmp/relay-down.err";
	my $pid = relay('relay-down', $sink, '--kinds', 'rd', '--batch', '50', '--timeout', '2',
		'--connect-timeout', '1', '--lease', '2', '-v');
	ok($node->poll_query_until('postgres',
		"SELECT count(*) >= 100 FROM outbox.commands WHERE kind = 'rd' AND status = 'published'"),
		'down: the relay is publishing');
	# freeze the server, let the relay claim more work and send it, then
	# kill the server: the XADDs of the batch in flight are never answered
	is(rcli('CLIENT', 'PAUSE', '60000', 'WRITE'), 'OK', 'down: writes paused');
	produce_runs($node, 'r2b', 1000, 6, q{'rd'});
	ok($node->poll_query_until('postgres',
		"SELECT count(*) > 0 FROM outbox.commands WHERE kind = 'rd' AND status = 'sending'"),
		'down: a batch is in flight');
	kill 'KILL', $redis_pid;
	wait_exit($redis_pid);
	ok(rcli('PING') ne 'PONG', 'down: redis-server killed');
	ok(wait_match($err, qr/sink unavailable: redis 127\.0\.0\.1:$port: .*holding \d+ commands?, claiming paused/),
		'down: the outage is logged');
	my $acked = sq("SELECT count(*) FROM outbox.commands WHERE kind = 'rd' AND status = 'published'");
	ok($acked < 3000, "down: the outage came in the middle ($acked of 3000 acked)");
	ok(wait_match($err, qr/sink unavailable; pausing 2\.0s/), 'down: the held batch is retried with backoff');
	ok(sq("SELECT count(*) FROM outbox.commands WHERE kind = 'rd' AND status = 'sending' AND lease_until > now()") > 0,
		'down: the held leases are renewed');
	is(sq("SELECT count(*) FROM outbox.commands WHERE kind = 'rd' AND status = 'published'"),
		$acked, 'down: nothing acked while the server is down');
	is(sq("SELECT count(*) FROM outbox.commands WHERE kind = 'rd' AND (status = 'dead' OR deliveries > 1)"),
		'0', 'down: nothing dead, no delivery spent');
	ok(start_redis(), 'down: redis-server restarted');
	ok($node->poll_query_until('postgres',
		"SELECT count(*) = 3000 FROM outbox.commands WHERE kind = 'rd' AND status = 'published'"),
		'down: all published after the server returned');
	kill 'TERM', $pid;
	is(wait_exit($pid), 0, 'down: SIGTERM exits 0');
	my $log = slurp_file($err);
	is(scalar(() = $log =~ /sink unavailable:/g), 1, 'down: the outage logged once');
	like($log, qr/sink redis:\/\/\S+ .*is available again/, 'down: the recovery logged');
	is(sq("SELECT count(*) FROM outbox.commands WHERE kind = 'rd' AND deliveries = 1"),
		'3000', 'down: every command published on its first delivery');
	my %seen;
	$seen{ $_->{command_id} }++ for grep { $_->{command_id} =~ /^r2b?-/ } entries('outbox');
	is(scalar(keys %seen), 3000, 'down: every command in the stream (what was confirmed survived the restart)');
	note(scalar(grep { $seen{$_} > 1 } keys %seen) . ' command(s) in the stream twice (same command_id)');
}

# ---------------------------------------------------------------------------
# 3. Broker-side errors and their classification
# ---------------------------------------------------------------------------
{
	# CLIENT PAUSE: the XADDs get no reply within --timeout
	is(rcli('CLIENT', 'PAUSE', '4000', 'WRITE'), 'OK', 'pause: writes paused for 4 s');
	$node->safe_psql('postgres',
		"SELECT outbox.commit_decision('r3', 1, 'decided', 'r3-paused', 'rp', '{}')");
	my $err = "$tmp/relay-pause.err";
	my $pid = relay('relay-pause', $sink, '--kinds', 'rp', '--timeout', '1');
	ok($node->poll_query_until('postgres',
		"SELECT status = 'published' FROM outbox.commands WHERE command_id = 'r3-paused'"),
		'pause: published once the pause is over');
	kill 'TERM', $pid;
	is(wait_exit($pid), 0, 'pause: exit 0');
	like(slurp_file($err), qr/sink unavailable: redis 127\.0\.0\.1:$port: no reply within 1\.0s/,
		'pause: no reply is the sink being unavailable, not the command failing');
	is(sq("SELECT deliveries || ' ' || coalesce(last_error, '-') FROM outbox.commands WHERE command_id = 'r3-paused'"),
		'1 -', 'pause: no delivery spent, nothing failed');
	is(scalar(grep { $_->{command_id} eq 'r3-paused' } entries('outbox')), 1, 'pause: in the stream once');

	# WRONGTYPE: the key is not a stream (an operator's mistake)
	is(rcli('SET', 'notastream', 'x'), 'OK', 'wrongtype: a string key');
	$node->safe_psql('postgres',
		"SELECT outbox.commit_decision('r3', 2, 'decided', 'r3-wrongtype', 'rw', '{}')");
	$err = "$tmp/relay-wrongtype.err";
	$pid = relay('relay-wrongtype', "redis://127.0.0.1:$port/0?stream=notastream", '--kinds', 'rw');
	ok(wait_match($err, qr/sink unavailable: redis stream notastream: WRONGTYPE/),
		'wrongtype: the sink is unavailable');
	kill 'TERM', $pid;
	is(wait_exit($pid), 0, 'wrongtype: exit 0');
	like(sq("SELECT status || ' ' || deliveries || ' ' || last_error FROM outbox.commands WHERE command_id = 'r3-wrongtype'"),
		qr/^pending 1 delivery not attempted: the sink was unavailable: redis stream notastream: WRONGTYPE/,
		'wrongtype: handed back on SIGTERM, not dead, one delivery');
	ok($node->poll_query_until('postgres',
		"SELECT available_at <= now() FROM outbox.commands WHERE command_id = 'r3-wrongtype'"),
		'wrongtype: available again after the backoff');
	$pid = relay('relay-db1', "redis://127.0.0.1:$port/1?stream=outbox", '--kinds', 'rw', '--drain');
	is(wait_exit($pid), 0, 'wrongtype: a relay with the right URL drains');
	is(sq("SELECT status FROM outbox.commands WHERE command_id = 'r3-wrongtype'"), 'published',
		'wrongtype: published to a stream once the URL is right');
	is(rcli('-n', '1', 'XLEN', 'outbox'), '1', 'database /1 of the URL was selected');
}

# A bad Redis URL ends the relay at start-up (exit 2, one line).
for my $bad ('redis://', "redis://127.0.0.1:$port", "redis://127.0.0.1:$port?stream=s&maxlen=x",
	"redis://u:secret\@127.0.0.1:$port?stream=s", "redis://127.0.0.1:$port/x?stream=s",
	"redis://127.0.0.1:$port?stream=s&bogus=1")
{
	my $out = `outbox-relay --dsn '$dsn' --sink '$bad' 2>&1`;
	is($? >> 8, 2, "--sink '$bad': exit 2");
	is(scalar(split /\n/, $out), 1, "--sink '$bad': one line") or diag($out);
	unlike($out, qr/secret/, "--sink '$bad': no password in the message");
}

conservation_clean($node, 'redis');
is(stop_redis(), 0, 'redis-server stopped');
$node->stop;
done_testing();
