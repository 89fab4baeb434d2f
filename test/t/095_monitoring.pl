# Monitoring end to end: the shipped files of monitoring/ are checked
# (promtool check rules and config, promtool test rules, the Grafana
# dashboard's JSON and metric names), then a live chain runs on loopback:
# a cluster with traffic (acked commands, a dead letter, an expired lease,
# a stale ack, a delayed and an unclaimed command, a published command
# without its receipt), the background worker counting the conservation
# checks every second (outbox.check_interval), outbox-relay --metrics,
# prometheus-postgres-exporter (the shipped queries.yaml) as a role that is
# only a member of pg_monitor, and prometheus scraping them with a copy of
# the shipped prometheus.yml (test ports, a 1 s scrape and evaluation
# interval) and of alerts.yml (every "for:" 0s, the age thresholds 1 s and
# the checks' age threshold 10 s, so that alerts fire within seconds).  At
# the end the worker's checks are spaced an hour apart, and their counts
# must be reported stale.  The series and the alerts are read back through
# Prometheus's HTTP API.  Every process started here is stopped by pid at
# the end, also on failure.

use strict;
use warnings;

use File::Basename qw(dirname);
use HTTP::Tiny;
use JSON::PP;
use POSIX qw(WNOHANG);
use Time::HiRes qw(usleep);
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use FindBin;
use lib "$FindBin::RealBin/../perl";
use OutboxTest;

my $src = $ENV{OUTBOX_SRC} // dirname(__FILE__) . '/../..';
my $mon = "$src/monitoring";
my $tmp = PostgreSQL::Test::Utils::tempdir;
my $http = HTTP::Tiny->new(timeout => 10);
my $json = JSON::PP->new;

for my $prog (qw(promtool prometheus prometheus-postgres-exporter))
{
	my $found = grep { -x "$_/$prog" } split /:/, $ENV{PATH};
	BAIL_OUT("$prog is not installed (package list: test/lib.sh)") unless $found;
}

# Processes to stop at the end: name => pid.
my %procs;
END
{
	local $?;					# keep the test's exit status
	for my $name (sort keys %procs)
	{
		my $pid = $procs{$name};
		next unless $pid && kill(0, $pid);
		kill 'TERM', $pid;
		my $deadline = time() + 10;
		while (time() < $deadline && waitpid($pid, WNOHANG) == 0)
		{
			usleep(50_000);
		}
		if (waitpid($pid, WNOHANG) == 0)
		{
			kill 'KILL', $pid;
			waitpid($pid, 0);
		}
	}
}


sub spew
{
	my ($path, $s) = @_;
	open(my $fh, '>', $path) or die "$path: $!";
	print $fh $s;
	close($fh);
}

# ---------------------------------------------------------------------------
# The shipped files
# ---------------------------------------------------------------------------
{
	my ($out, $err) = ('', '');
	my $ok = IPC::Run::run([ 'promtool', 'check', 'rules', "$mon/alerts.yml" ],
		'>', \$out, '2>', \$err);
	ok($ok, 'promtool check rules monitoring/alerts.yml') or diag("$out$err");
	$ok = IPC::Run::run([ 'promtool', 'check', 'config', "$mon/prometheus.yml" ],
		'>', \$out, '2>', \$err);
	ok($ok, 'promtool check config monitoring/prometheus.yml') or diag("$out$err");
	# promtool test rules resolves rule_files relative to the test file
	$ok = IPC::Run::run([ 'promtool', 'test', 'rules', "$mon/alerts_test.yml" ],
		'>', \$out, '2>', \$err);
	ok($ok, 'promtool test rules monitoring/alerts_test.yml: every alert fires and stays silent where it should')
	  or diag("$out$err");
	like($out . $err, qr/SUCCESS/, 'promtool reports success');
}

# The database metric names queries.yaml defines: <key>_<column> for each
# column that is not a label.
my %db_metrics;
{
	my ($key, $col);
	for my $line (split /\n/, slurp_file("$mon/queries.yaml"))
	{
		if ($line =~ /^([a-z_]+):\s*$/) { $key = $1; next; }
		if ($line =~ /^    - ([a-z_]+):\s*$/) { $col = $1; next; }
		if ($line =~ /^\s+usage:\s*"(\w+)"/ && defined $key && defined $col)
		{
			$db_metrics{"${key}_$col"} = 1 if $1 ne 'LABEL';
			undef $col;
		}
	}
}
ok(scalar(keys %db_metrics) >= 20, 'queries.yaml defines the database metrics')
  or diag(join(' ', sort keys %db_metrics));

# ---------------------------------------------------------------------------
# A cluster with traffic
# ---------------------------------------------------------------------------
my $node = outbox_node('monitoring', qq{
outbox.naptime = '200ms'
outbox.receipt_overdue = 1
outbox.check_interval = '1s'
});
$node->safe_psql('postgres', q{
	CREATE EXTENSION outbox;
	CREATE ROLE scraper LOGIN IN ROLE pg_monitor;
});
my $dsn = $node->connstr('postgres');
sub sq { return $node->safe_psql('postgres', $_[0]); }

my $n_mail = 25;
my $relay_port = PostgreSQL::Test::Cluster::get_free_port();
my $relay_metrics = "127.0.0.1:$relay_port";
$procs{relay} = spawn("$tmp/relay.out", "$tmp/relay.err", 'outbox-relay',
	'--dsn', $dsn, '--sink', "file:$tmp/relay.ndjson", '--kinds', 'mail',
	'--worker', 'relay-095', '--poll', '0.2', '--batch', '10',
	'--metrics', $relay_metrics);

sq(join("\n", map {
	"SELECT outbox.commit_decision('run-095', $_, 'decided', 'mail-$_', 'mail', '{\"n\": $_}');"
} 1 .. $n_mail));
$node->poll_query_until('postgres', qq{
	SELECT count(*) = $n_mail FROM outbox.commands WHERE kind = 'mail' AND status = 'published'})
  or die 'the relay did not publish the mail commands';
# The relay's endpoint itself: the exposition format, a 404 elsewhere, and
# the errors of --metrics.
{
	my $r = $http->get("http://$relay_metrics/metrics");
	is($r->{status}, 200, 'the relay serves /metrics');
	like($r->{headers}{'content-type'}, qr{^text/plain; version=0\.0\.4}, 'in the text exposition format');
	like($r->{content}, qr/^# TYPE outbox_relay_acked_total counter\noutbox_relay_acked_total $n_mail\n/m,
		'with typed counters');
	is($http->get("http://$relay_metrics/other")->{status}, 404, 'and nothing else');
	my ($out, $err) = ('', '');
	IPC::Run::run([ 'outbox-relay', '--sink', 'stdout', '--metrics', '9400' ],
		'<', \undef, '>', \$out, '2>', \$err);
	is($? >> 8, 2, '--metrics without a host: exit 2');
	like($err, qr/HOST:PORT is expected/, '--metrics without a host: says so');
	IPC::Run::run([ 'outbox-relay', '--dsn', $dsn, '--sink', 'stdout', '--metrics', $relay_metrics ],
		'<', \undef, '>', \$out, '2>', \$err, IPC::Run::timeout(60));
	is($? >> 8, 1, '--metrics on a port in use: exit 1');
	like($err, qr/could not listen on --metrics address/, '--metrics on a port in use: says so');
}

# every published command gets its receipt but one: that one becomes
# overdue after outbox.receipt_overdue (1 s)
sq(join("\n", map { "SELECT outbox.complete('run-095', 'mail-$_');" } 2 .. $n_mail));

# The other kinds are driven by hand (the relay only claims mail).
sq(q{
	SELECT outbox.commit_decision('run-095', 100, 'decided', 'doomed-1', 'doomed', '{}');
	SELECT outbox.commit_decision('run-095', 101, 'decided', 'stuck-1', 'stuck', '{}');
	SELECT outbox.commit_decision('run-095', 102, 'decided', 'later-1', 'later', '{}', NULL,
								  now() + interval '1 day');
	SELECT outbox.commit_decision('run-095', 103, 'decided', 'parked-1', 'parked', '{}');
	SELECT outbox.commit_decision('run-095', 104, 'decided', 'stale-1', 'stale', '{}');
});
# a dead letter: a fatal failure
sq(q{
	SELECT outbox.fail('hand', l.token, 'HTTP 410', true)
	  FROM outbox.claim('hand', 1, kinds => '{doomed}') l;
});
# an expired lease nobody takes over
sq(q{SELECT count(*) FROM outbox.claim('hand', 1, '1 second', '{stuck}')});

$node->poll_query_until('postgres', q{
	SELECT violations = 1 FROM outbox.conservation WHERE check_name = 'receipt_overdue'})
  or die 'the receipt of mail-1 did not become overdue';
$node->poll_query_until('postgres', q{
	SELECT count(*) = 1 FROM outbox.leases WHERE kind = 'stuck' AND expired});


# ---------------------------------------------------------------------------
# The exporter (shipped queries.yaml, a pg_monitor-only role) and prometheus
# ---------------------------------------------------------------------------
my $exporter_port = PostgreSQL::Test::Cluster::get_free_port();
{
	local $ENV{DATA_SOURCE_NAME} = sprintf('host=%s port=%d user=scraper dbname=postgres sslmode=disable',
		$node->host, $node->port);
	$procs{exporter} = spawn("$tmp/exporter.out", "$tmp/exporter.err",
		'prometheus-postgres-exporter', "--extend.query-path=$mon/queries.yaml",
		"--web.listen-address=127.0.0.1:$exporter_port",
		'--disable-default-metrics', '--disable-settings-metrics');
}

# Copies of the shipped configuration with the test's ports and intervals.
my $prom_port = PostgreSQL::Test::Cluster::get_free_port();
{
	my $conf = slurp_file("$mon/prometheus.yml");
	my $n = ($conf =~ s/\["127\.0\.0\.1:9187"\]/["127.0.0.1:$exporter_port"]/g);
	$n += ($conf =~ s/\["127\.0\.0\.1:9400"\]/["127.0.0.1:$relay_port"]/g);
	$conf =~ s/(scrape_interval|evaluation_interval|scrape_timeout): \S+/$1: 1s/g;
	is($n, 2, 'the shipped prometheus.yml names the exporter and the relay');
	spew("$tmp/prometheus.yml", $conf);

	my $rules = slurp_file("$mon/alerts.yml");
	$rules =~ s/^(\s+)for: \S+$/${1}for: 0s/mg;
	for my $t (qw(oldest_ready_seconds expired_lease_seconds))
	{
		$rules =~ s/(record: outbox:threshold:$t\n\s+expr: )vector\(\d+\)/${1}vector(1)/
		  or die "no threshold $t in alerts.yml";
	}
	$rules =~ s/(record: outbox:threshold:check_age_seconds\n\s+expr: )vector\(\d+\)/${1}vector(10)/
	  or die 'no threshold check_age_seconds in alerts.yml';
	spew("$tmp/alerts.yml", $rules);
}
$procs{prometheus} = spawn("$tmp/prometheus.out", "$tmp/prometheus.err", 'prometheus',
	"--config.file=$tmp/prometheus.yml", "--storage.tsdb.path=$tmp/prometheus-data",
	"--web.listen-address=127.0.0.1:$prom_port");

# Prometheus's HTTP API.
sub api
{
	my ($path, %form) = @_;
	my $url = "http://127.0.0.1:$prom_port$path";
	$url .= '?' . $http->www_form_urlencode(\%form) if %form;
	my $r = $http->get($url);
	return undef unless $r->{success};
	my $d = eval { $json->decode($r->{content}) };
	return ($d && $d->{status} eq 'success') ? $d->{data} : undef;
}

# The value of an instant query returning one series, or undef.
sub value1
{
	my ($q) = @_;
	my $d = api('/api/v1/query', query => $q);
	return undef unless $d && @{ $d->{result} } == 1;
	return $d->{result}[0]{value}[1];
}

# Wait until a query returns one series (and, with $want, that value).
sub wait_value
{
	my ($q, $want) = @_;
	my $deadline = time() + $PostgreSQL::Test::Utils::timeout_default;
	my $v;
	while (time() < $deadline)
	{
		$v = value1($q);
		return $v if defined $v && (!defined $want || $v == $want);
		usleep(250_000);
	}
	return $v;
}

# The alerts, as "name{label=value,...}:state" for the given labels.
sub alerts
{
	my $d = api('/api/v1/alerts') or return ();
	return map {
		my $l = $_->{labels};
		my $extra = join(',', map { "$_=$l->{$_}" } grep { /^(kind|check|database|source)$/ } sort keys %$l);
		"$l->{alertname}" . ($extra ne '' ? "{$extra}" : '') . ":$_->{state}"
	} @{ $d->{alerts} };
}

sub wait_alert
{
	my ($want) = @_;
	my $deadline = time() + $PostgreSQL::Test::Utils::timeout_default;
	while (time() < $deadline)
	{
		return 1 if grep { /^\Q$want\E:(pending|firing)$/ } alerts();
		usleep(250_000);
	}
	return 0;
}

is(wait_value('up{job="outbox-postgres"}', 1), 1, 'prometheus scrapes the exporter');
is(wait_value('up{job="outbox-relay"}', 1), 1, 'prometheus scrapes the relay');
is(wait_value('outbox_worker_up', 1), 1, 'outbox_worker_up is 1 (read as a pg_monitor-only role)');
# The stale ack comes once Prometheus scrapes, so that its counter
# increases within the alert's window.
# a stale ack: a lease taken over, then acked by its first holder
my $t1 = sq(q{SELECT token FROM outbox.claim('first', 1, '1 second', '{stale}')});
$node->poll_query_until('postgres', q{
	SELECT count(*) = 1 FROM outbox.leases WHERE kind = 'stale' AND expired});
sq(q{SELECT count(*) FROM outbox.claim('second', 1, '1 hour', '{stale}')});
is(sq(qq{SELECT count(*) FROM outbox.ack_many('first', ARRAY['$t1']) WHERE NOT acked}),
	'1', 'the first holder\'s ack is refused as stale');

# The database state the metrics must show (it no longer changes).
my %stats;
{
	my @cols = qw(enqueued claimed taken_over acked stale_refused failed dead_lettered purged);
	my @v = split /\|/, sq('SELECT ' . join(', ', @cols) . ' FROM outbox.stats');
	@stats{@cols} = @v;
}
cmp_ok($stats{acked}, '>=', $n_mail, 'outbox.stats counted the acks');
cmp_ok($stats{stale_refused}, '>=', 1, 'outbox.stats counted the stale ack');

ok(!grep({ /error/ && !/level=info/ } split /\n/, slurp_file("$tmp/exporter.err")),
	'the exporter logs no query error') or diag(slurp_file("$tmp/exporter.err"));

# The worker's counts of the conservation checks: one row per check of
# outbox.conservation with its severity, and (the state no longer
# changes) the same violations as the views once the worker has counted.
is(sq(q{SELECT string_agg(check_name || ':' || severity, ' ' ORDER BY check_name) FROM outbox.metrics_checks()}),
	sq(q{SELECT string_agg(check_name || ':' || severity, ' ' ORDER BY check_name) FROM outbox.conservation}),
	'outbox.metrics_checks() has one row per conservation check, with its severity');
ok($node->poll_query_until('postgres', q{
	SELECT bool_and(m.violations IS NOT DISTINCT FROM c.violations
					AND m.computed_timestamp_seconds > date_part('epoch', now()) - 60)
	  FROM outbox.conservation c JOIN outbox.metrics_checks() m USING (check_name)}),
	'the worker counts every check into outbox.check_results, equal to outbox.conservation');
is(sq(q{SELECT violations FROM outbox.metrics_checks() WHERE check_name = 'receipt_overdue'}), '1',
	'the worker counted the overdue receipt');
is(sq(q{SELECT count(*) FROM outbox.workers WHERE last_error IS NOT NULL}), '0',
	'the worker\'s counts raised no error');

# --- the database's series ---------------------------------------------
is(wait_value('outbox_backlog_commands{kind="doomed",status="dead",state="held"}', 1), 1,
	'the dead letter is counted');
is(wait_value('outbox_backlog_commands{kind="stuck",status="sending",state="expired"}', 1), 1,
	'the expired lease is counted');
cmp_ok(value1('outbox_backlog_oldest_age_seconds{kind="stuck",state="expired"}') // 0, '>', 0,
	'the expired lease has an age');
is(wait_value('outbox_backlog_commands{kind="stale",status="sending",state="live"}', 1), 1,
	'the taken-over lease is live');
is(wait_value('outbox_backlog_commands{kind="later",status="pending",state="delayed"}', 1), 1,
	'the delayed command is counted as delayed');
is(wait_value('outbox_backlog_commands{kind="parked",status="pending",state="ready"}', 1), 1,
	'the unclaimed command is counted as ready');
cmp_ok(value1('outbox_backlog_oldest_age_seconds{kind="parked",state="ready"}') // 0, '>', 0,
	'the oldest ready command has an age');
is(value1('count(outbox_backlog_commands{kind="mail"})') // 'none', 'none',
	'no backlog series for a kind that is all published');
for my $c (sort keys %stats)
{
	is(wait_value("outbox_${c}_total", $stats{$c}), $stats{$c},
		"outbox_${c}_total equals outbox.stats.$c ($stats{$c})");
}
is(wait_value('outbox_conservation_violations{check="receipt_overdue"}', 1), 1,
	'the overdue receipt is a receipt_overdue violation');
is(value1('sum(outbox_conservation_violations{severity="error"})'), 0,
	'no error-class conservation violation');
is(value1('count(outbox_conservation_violations)'), 5, 'one series per conservation check');
cmp_ok(value1('min(outbox_conservation_computed_timestamp_seconds)') // 0, '>', 0,
	'every check has the time of its last count');
is(value1('count(outbox_conservation_duration_seconds >= 0)'), 5,
	'every check has the duration of its last count');
is(value1('count(outbox_horizon_xmin_age)'), 3, 'one horizon series per source');
cmp_ok(value1('outbox_worker_last_round_timestamp_seconds') // 0, '>', 0,
	'the worker\'s last round has a time');

# --- the relay's series ---------------------------------------------------
is(wait_value('outbox_relay_acked_total', $n_mail), $n_mail, "the relay acked $n_mail");
is(value1('outbox_relay_claimed_total'), $n_mail, "the relay claimed $n_mail");
is(value1('outbox_relay_delivered_total'), $n_mail, "the relay delivered $n_mail");
is(value1('sum(outbox_relay_failed_total)'), 0, 'the relay failed nothing');
is(value1('outbox_relay_in_flight'), 0, 'nothing in flight');
is(value1('outbox_relay_database_connected'), 1, 'the relay is connected');
cmp_ok(value1('outbox_relay_last_ack_timestamp_seconds') // 0, '>', 0, 'the last ack has a time');
is(value1('outbox_relay_batch_duration_seconds_count - outbox_relay_batches_total'), 0,
	'one batch duration observation per batch');
is(value1('sum(outbox_relay_batch_duration_seconds_bucket{le="+Inf"}) - sum(outbox_relay_batch_duration_seconds_count)'), 0,
	'the histogram\'s +Inf bucket holds every observation');
is(value1('count(outbox_relay_info{worker="relay-095"})'), 1, 'the relay names its worker');

# Every metric name the exporter and the relay export is documented and
# every documented database metric is exported.
my %exported;
{
	my $d = api('/api/v1/label/__name__/values') // [];
	$exported{$_} = 1 for grep { /^outbox_/ } @$d;
}
my @missing = grep { !$exported{$_} } sort keys %db_metrics;
is_deeply(\@missing, [], 'every metric of queries.yaml is exported');
my $doc = -f "$src/docs/monitoring.md" ? slurp_file("$src/docs/monitoring.md") : '';
my @undocumented = grep {
	my $base = $_;
	$base =~ s/_(bucket|sum|count)$// if $base =~ /^outbox_relay_\w+_duration_seconds_/;
	index($doc, $base) < 0
} sort keys %exported;
is_deeply(\@undocumented, [], 'every exported metric is documented in docs/monitoring.md');

# --- the Grafana dashboard -------------------------------------------------
{
	my $dash = eval { $json->decode(slurp_file("$mon/grafana-dashboard.json")) };
	ok($dash, 'monitoring/grafana-dashboard.json is valid JSON') or diag($@);
	my @exprs;
	my @todo = @{ $dash->{panels} // [] };
	while (my $p = shift @todo)
	{
		push @todo, @{ $p->{panels} // [] };
		push @exprs, map { $_->{expr} } grep { defined $_->{expr} } @{ $p->{targets} // [] };
	}
	cmp_ok(scalar(@exprs), '>=', 15, 'the dashboard has its queries');
	my %known = (%exported, up => 1);
	my @unknown;
	for my $e (@exprs)
	{
		(my $s = $e) =~ s/"[^"]*"//g;	# label values
		$s =~ s/\{[^}]*\}//g;			# matchers
		$s =~ s/\[[^\]]*\]//g;			# ranges
		$s =~ s/\b(?:by|without|on|ignoring)\s*\([^)]*\)//g;	# grouping labels
		for my $name ($s =~ /\b([a-z_][a-z0-9_:]*)\b(?!\s*\()/g)
		{
			next unless $name =~ /^outbox_/ || $name eq 'up';
			push @unknown, "$name in: $e" unless $known{$name};
		}
	}
	is_deeply(\@unknown, [], 'every dashboard query names exported metrics only');
}

# --- the alerts --------------------------------------------------------------
for my $a ('OutboxDeadLetters{kind=doomed}', 'OutboxExpiredLeases{kind=stuck}',
	'OutboxOldestReadyCommandTooOld{kind=parked}', 'OutboxReceiptsOverdue',
	'OutboxStaleRefusals')
{
	ok(wait_alert($a), "alert $a is pending or firing");
}
my @wrong = grep {
	/^(OutboxConservationViolated|OutboxConservationChecksStale|OutboxWorkerDown|OutboxWorkerStalled|OutboxExporterDown|OutboxRelayDown|OutboxRelayNotAcking|OutboxRelaySinkDown|OutboxBacklogTooLarge|OutboxUncertainCommands|OutboxVacuumHorizonHeld)/
	  || /^OutboxOldestReadyCommandTooOld\{kind=(?!parked)/
	  || /^OutboxExpiredLeases\{kind=(?!stuck)/
} alerts();
is_deeply(\@wrong, [], 'no other alert is active');

# --- a relay that stops -----------------------------------------------------
kill 'TERM', $procs{relay};
waitpid($procs{relay}, 0);
is($? >> 8, 0, 'the relay stopped on SIGTERM with exit 0');
delete $procs{relay};
is(wait_value('up{job="outbox-relay"}', 0), 0, 'prometheus sees the relay down');
ok(wait_alert('OutboxRelayDown'), 'alert OutboxRelayDown is pending or firing');

# --- counts of the checks that go stale ------------------------------------
my $counted = sq(q{SELECT max(computed_timestamp_seconds) FROM outbox.metrics_checks()});
$node->safe_psql('postgres', q{ALTER SYSTEM SET outbox.check_interval = '1h'; SELECT pg_reload_conf();});
ok(wait_alert('OutboxConservationChecksStale'),
	'alert OutboxConservationChecksStale is pending or firing once the worker counts no more');
cmp_ok(value1('max(outbox_conservation_computed_timestamp_seconds)') // 0, '>=', $counted,
	'the stale counts are still exported, with their time');

done_testing();
