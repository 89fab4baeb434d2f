# outbox-relay --metrics against the relay's real behaviour: the values of
# /metrics after deliveries to outbox-receiver that fail some commands on
# purpose (503 once: retried; 422: fatal), an outage of the endpoint (the
# sink goes down, the outage counter and the held commands are counted, the
# sink comes back up), and a lease taken over while the relay was stopped
# (the stale refusal, SQLSTATE OB001).  promtool check metrics accepts the
# page.

use strict;
use warnings;

use File::Basename qw(dirname);
use HTTP::Tiny;
use IPC::Run;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use FindBin;
use lib "$FindBin::RealBin/../perl";
use OutboxTest;
use OutboxBroker;

my $src = $ENV{OUTBOX_SRC} // dirname(__FILE__) . '/../..';
my $receiver = "$src/src/outbox-receiver";
die "outbox-receiver not built at $receiver (run make)" unless -x $receiver;
my $tmp = PostgreSQL::Test::Utils::tempdir;

my $node = outbox_node('metrics', "outbox.backoff_base = 100\noutbox.backoff_max = 400\n");
$node->safe_psql('postgres', 'CREATE EXTENSION outbox');
$node->safe_psql('postgres', q{SELECT outbox.register_consumer('m059', current_user::text::regrole)});
$node->safe_psql('postgres', 'CREATE TABLE biz (command_id text NOT NULL, payload jsonb)');
my $dsn = $node->connstr('postgres');
sub sq { return $node->safe_psql('postgres', $_[0]); }

# The receiver, on a port of its own so that it can be restarted there.
my $rport = PostgreSQL::Test::Cluster::get_free_port();
my $rgen = 0;
sub start_receiver
{
	$rgen++;
	unlink("$tmp/receiver.port");
	my $pid = track_pid(spawn("$tmp/receiver$rgen.out", "$tmp/receiver$rgen.err", $receiver,
		'--port', $rport, '--port-file', "$tmp/receiver.port", '--dsn', $dsn,
		'--table', 'biz', '--consumer', 'm059'));
	wait_match("$tmp/receiver.port", qr/^\d+$/m) or die 'the receiver did not start';
	return $pid;
}
my $rpid = start_receiver();

my $mport = PostgreSQL::Test::Cluster::get_free_port();
my $err = "$tmp/relay.err";
my $relay = track_pid(spawn("$tmp/relay.out", $err, 'outbox-relay', '--dsn', $dsn,
	'--sink', "http://127.0.0.1:$rport/apply", '--worker', 'relay-059', '--batch', '10',
	'--lease', '2', '--poll', '0.2', '--timeout', '10', '--metrics', "127.0.0.1:$mport", '-v'));

my $http = HTTP::Tiny->new(timeout => 5);
my $page = '';

# Scrape /metrics: {'name{labels}' => value}, the page kept in $page.
sub scrape
{
	my $r = $http->get("http://127.0.0.1:$mport/metrics");
	return {} unless $r->{success};
	$page = $r->{content};
	my %m;
	for (split /\n/, $page)
	{
		next if /^#/;
		my ($k, $v) = /^(\S+) (\S+)$/ or next;
		$m{$k} = $v;
	}
	return \%m;
}

# Wait until series $k has value $v (numerically); its last value.
sub wait_metric
{
	my ($k, $v) = @_;
	my $last;
	wait_until(sub { $last = scrape()->{$k}; defined $last && $last == $v });
	return $last;
}

# Commit commands of kind m in one transaction: [id, payload]...
sub produce
{
	my $seq = sq("SELECT coalesce(max(seq), 0) FROM outbox.events WHERE run_id = 'r059'");
	sq(join("\n", 'BEGIN;', (map {
		$seq++;
		"SELECT outbox.commit_decision('r059', $seq, 'decided', '$_->[0]', 'm', '$_->[1]');"
	} @_), 'COMMIT;'));
}

ok(wait_until(sub { scrape()->{'outbox_relay_database_connected'} }), 'the relay serves /metrics');

# --- deliveries, some failing on purpose ------------------------------------
produce((map { [ "ok-$_", '{}' ] } 1 .. 20),
	(map { [ "retry-$_", '{"test_status": 503, "test_times": 1}' ] } 1 .. 3),
	(map { [ "fatal-$_", '{"test_status": 422}' ] } 1 .. 2));
ok($node->poll_query_until('postgres',
	"SELECT count(*) = 25 FROM outbox.commands WHERE status IN ('published', 'dead')"),
	'the 25 commands are published or dead');
is(sq("SELECT count(*) FILTER (WHERE status = 'published') || ' ' || count(*) FILTER (WHERE status = 'dead') FROM outbox.commands"),
	'23 2', '23 published, 2 dead');
is(wait_metric('outbox_relay_acked_total', 23), 23, 'acked_total: 23');
my $m = scrape();
is($m->{'outbox_relay_claimed_total'}, 28, 'claimed_total: 28 (25, and the 3 retried once more)');
is($m->{'outbox_relay_delivered_total'}, 23, 'delivered_total: 23');
is($m->{'outbox_relay_failed_total{outcome="retry"}'}, 3, 'failed_total{outcome="retry"}: 3');
is($m->{'outbox_relay_failed_total{outcome="dead"}'}, 2, 'failed_total{outcome="dead"}: 2');
is($m->{'outbox_relay_sink_failures_total{class="retry"}'}, 3, 'sink_failures_total{class="retry"}: the 3 answered 503');
is($m->{'outbox_relay_sink_failures_total{class="fatal"}'}, 2, 'sink_failures_total{class="fatal"}: the 2 answered 422');
is($m->{'outbox_relay_sink_failures_total{class="outage"}'}, 0, 'sink_failures_total{class="outage"}: 0');
is($m->{'outbox_relay_sink_up{scheme="http"}'}, 1, 'sink_up{scheme="http"}: 1');
is($m->{'outbox_relay_sink_outages_total{scheme="http"}'}, 0, 'sink_outages_total: 0');
is($m->{'outbox_relay_stale_refused_total'}, 0, 'stale_refused_total: 0');
is($m->{'outbox_relay_in_flight'}, 0, 'in_flight: 0');
cmp_ok($m->{'outbox_relay_last_ack_timestamp_seconds'}, '>', time() - 600, 'last_ack_timestamp_seconds: recent');
is($m->{'outbox_relay_batch_duration_seconds_count'}, $m->{'outbox_relay_batches_total'},
	'batch_duration_seconds_count = batches_total');
is($m->{'outbox_relay_sink_confirm_duration_seconds_count'}, $m->{'outbox_relay_batches_total'},
	'sink_confirm_duration_seconds_count = batches_total (no outage yet)');
is($m->{'outbox_relay_sink_confirm_duration_seconds_bucket{le="+Inf"}'},
	$m->{'outbox_relay_sink_confirm_duration_seconds_count'}, 'the +Inf bucket holds every observation');
cmp_ok($m->{'outbox_relay_sink_confirm_duration_seconds_sum'}, '<=', $m->{'outbox_relay_batch_duration_seconds_sum'},
	'the sink time is part of the batch time');

# The page passes promtool's checks of the exposition format.
{
	my ($out, $perr) = ('', '');
	IPC::Run::run([ 'promtool', 'check', 'metrics' ], '<', \$page, '>', \$out, '2>', \$perr);
	is($? >> 8, 0, 'promtool check metrics accepts the page') or diag("$out$perr");
}

# --- the endpoint goes away: the sink is down --------------------------------
kill 'TERM', $rpid;
is(wait_exit($rpid), 0, 'outage: the receiver stopped');
produce(map { [ "held-$_", '{}' ] } 1 .. 5);
is(wait_metric('outbox_relay_sink_up{scheme="http"}', 0), 0, 'outage: sink_up 0');
$m = scrape();
is($m->{'outbox_relay_sink_outages_total{scheme="http"}'}, 1, 'outage: sink_outages_total 1');
is($m->{'outbox_relay_in_flight'}, 5, 'outage: the 5 held commands in flight');
cmp_ok($m->{'outbox_relay_sink_failures_total{class="outage"}'}, '>=', 1,
	'outage: sink_failures_total{class="outage"} counts the delivery that found the endpoint down');
is($m->{'outbox_relay_acked_total'}, 23, 'outage: nothing more acked');
is($m->{'outbox_relay_failed_total{outcome="retry"}'} + $m->{'outbox_relay_failed_total{outcome="dead"}'}, 5,
	'outage: nothing failed through outbox.fail');
ok(wait_match($err, qr/sink unavailable; pausing 1\.0s/), 'outage: the relay retried the held batch');
my $outage_failures = scrape()->{'outbox_relay_sink_failures_total{class="outage"}'};
# the HTTP sink tries the first command, finds the endpoint down and holds
# the rest untried: one outage failure per attempt
cmp_ok($outage_failures, '>=', 2, "outage: every attempt during the outage counted ($outage_failures)");
$rpid = start_receiver();
is(wait_metric('outbox_relay_acked_total', 28), 28, 'outage over: the 5 held commands acked');
$m = scrape();
is($m->{'outbox_relay_sink_up{scheme="http"}'}, 1, 'outage over: sink_up 1');
is($m->{'outbox_relay_sink_outages_total{scheme="http"}'}, 1, 'outage over: still one outage');
is($m->{'outbox_relay_in_flight'}, 0, 'outage over: nothing in flight');
is(sq("SELECT count(*) FROM outbox.commands WHERE command_id LIKE 'held-%' AND status = 'published' AND deliveries = 1"),
	'5', 'outage over: published on their first delivery');
is($m->{'outbox_relay_sink_confirm_duration_seconds_count'}, $m->{'outbox_relay_batches_total'},
	'the deliveries that found the sink down are not in the confirm histogram');

# --- a lease taken over while the relay was stopped: a stale refusal ---------
produce([ 'slow-1', '{"test_sleep_ms": 2500}' ]);
ok($node->poll_query_until('postgres', "SELECT status = 'sending' FROM outbox.commands WHERE command_id = 'slow-1'"),
	'stale: the slow command is being delivered');
kill 'STOP', $relay;
ok($node->poll_query_until('postgres', "SELECT count(*) = 1 FROM outbox.claim('thief', 1, '1 second', '{m}')"),
	'stale: another worker took the lease over once it expired');
kill 'CONT', $relay;
is(wait_metric('outbox_relay_stale_refused_total', 1), 1, 'stale: stale_refused_total 1');
ok($node->poll_query_until('postgres', "SELECT status = 'published' FROM outbox.commands WHERE command_id = 'slow-1'"),
	'stale: published once the thief\'s lease expired');
is(wait_metric('outbox_relay_acked_total', 29), 29, 'stale: acked on the second delivery');

# The final page passes promtool too.
scrape();
{
	my ($out, $perr) = ('', '');
	IPC::Run::run([ 'promtool', 'check', 'metrics' ], '<', \$page, '>', \$out, '2>', \$perr);
	is($? >> 8, 0, 'promtool check metrics accepts the page after the outage') or diag("$out$perr");
}
like($page, qr/^# TYPE outbox_relay_sink_confirm_duration_seconds histogram$/m, 'the confirm latency is a histogram');

kill 'TERM', $relay;
is(wait_exit($relay), 0, 'the relay exits 0 on SIGTERM');
kill 'TERM', $rpid;
wait_exit($rpid);
conservation_clean($node, 'metrics');
$node->stop;
done_testing();
