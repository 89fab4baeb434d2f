# Behaviour of outbox-relay, the reference publisher: NDJSON sinks (stdout,
# file), the HTTP sink (Idempotency-Key, 2xx ack, 408/429/5xx/timeouts
# retried through outbox.fail with backoff, 401/404 and an unreachable
# endpoint holding the batch without spending deliveries, other 4xx
# fatal), sink URLs that exit 2, the kinds
# filter, lease renewal during a slow delivery, SIGTERM (finish the batch
# in flight, exit 0), reconnection after a server restart, --help and the
# exit codes; ordered commands handed over by the acks (--handover).
#
# The HTTP endpoint is outbox-receiver (built next to the relay), which
# applies each command through outbox.inbox_accept, a business row and
# outbox.complete; its test hooks (test_status, test_sleep_ms, test_times
# in the payload) make it fail on purpose.

use strict;
use warnings;

use File::Basename qw(dirname);
use IO::Socket::INET;
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
my $receiver = "$src/src/outbox-receiver";
die "outbox-receiver not built at $receiver (run make)" unless -x $receiver;

my $tmp = PostgreSQL::Test::Utils::tempdir;

# Wait for a child to exit; its exit code, or undef after the timeout.
sub wait_exit
{
	my ($pid) = @_;
	my $deadline = time() + $PostgreSQL::Test::Utils::timeout_default;
	while (time() < $deadline)
	{
		my $r = waitpid($pid, WNOHANG);
		return $? >> 8 if $r == $pid;
		usleep(50_000);
	}
	kill 'KILL', $pid;
	waitpid($pid, 0);
	return undef;
}

# Wait until a file exists and is not empty.
sub wait_file
{
	my ($path) = @_;
	my $deadline = time() + $PostgreSQL::Test::Utils::timeout_default;
	while (time() < $deadline)
	{
		return 1 if -s $path;
		usleep(50_000);
	}
	return 0;
}

# Wait until a file matches a pattern.
sub wait_match
{
	my ($path, $re) = @_;
	my $deadline = time() + $PostgreSQL::Test::Utils::timeout_default;
	while (time() < $deadline)
	{
		return 1 if -e $path && slurp_file($path) =~ $re;
		usleep(50_000);
	}
	return 0;
}

# Run outbox-relay to completion; returns (exit code, stdout, stderr).
sub run_relay
{
	my (@args) = @_;
	my ($out, $err) = ('', '');
	IPC::Run::run([ 'outbox-relay', @args ], '<', \undef, '>', \$out, '2>', \$err,
		IPC::Run::timeout($PostgreSQL::Test::Utils::timeout_default));
	return ($? >> 8, $out, $err);
}

my $node = PostgreSQL::Test::Cluster->new('relay');
$node->init;
$node->append_conf(
	'postgresql.conf', qq(
shared_preload_libraries = 'outbox'
outbox.backoff_base = 100
outbox.backoff_max = 400
));
$node->start;
$node->safe_psql('postgres', 'CREATE EXTENSION outbox');
$node->safe_psql('postgres', 'CREATE TABLE biz (command_id text, payload jsonb)');
my $dsn = $node->connstr('postgres');

# Commit one decision per row: [command_id, kind, payload-json].
my $seq = 0;
sub produce
{
	my @rows = @_;
	my @sql;
	for my $r (@rows)
	{
		my ($id, $kind, $payload) = @$r;
		$seq++;
		my $qid = $id;
		$qid =~ s/'/''/g;
		$payload =~ s/'/''/g;
		push @sql,
		  "SELECT outbox.commit_decision('run-050', $seq, 'decided', '$qid', '$kind', '$payload');";
	}
	$node->safe_psql('postgres', join("\n", @sql));
}

sub sq { return $node->safe_psql('postgres', $_[0]); }

# ---------------------------------------------------------------------------
# Command line and exit codes
# ---------------------------------------------------------------------------
program_help_ok('outbox-relay');
program_version_ok('outbox-relay');
{
	my ($rc, $out, $err) = run_relay('--help');
	like($out, qr/--dsn=CONNINFO.*--sink=SINK.*--batch=N.*--lease=SECONDS.*--kinds=K1,K2.*--worker=NAME.*--poll=SECONDS/s,
		'--help lists the documented options');
	like($out, qr/Exit status:.*\b0\b.*\b1\b.*\b2\b/s, '--help documents the exit codes');
	like($out, qr/^Sinks \(built with: stdout file http\b[^)]*\):\n  stdout .*^  file:PATH .*^  http\(s\):\/\/URL /ms,
		'--help lists the sinks built in, each with its URL form');

	($rc, $out, $err) = run_relay('--dsn', $dsn);
	is($rc, 2, 'no --sink: exit 2');
	like($err, qr/--sink is required/, 'no --sink: says so');

	($rc, $out, $err) = run_relay('--sink', 'ftp://x');
	is($rc, 2, 'unknown sink: exit 2');
	like($err, qr/invalid sink "ftp:\/\/x"/, 'unknown sink: says so');

	($rc, $out, $err) = run_relay('--sink', 'stdout', '--batch', '0');
	is($rc, 2, '--batch 0: exit 2');

	($rc, $out, $err) = run_relay('--sink', 'stdout', '--lease', '-1');
	is($rc, 2, 'negative --lease: exit 2');

	($rc, $out, $err) = run_relay('--sink', 'stdout', '--kinds', 'a,,b');
	is($rc, 2, 'empty kind in --kinds: exit 2');

	($rc, $out, $err) = run_relay('--sink', 'stdout', '--dsn', 'nosuchoption=1');
	is($rc, 2, 'malformed --dsn: exit 2');
	like($err, qr/invalid --dsn/, 'malformed --dsn: says so');

	($rc, $out, $err) = run_relay('--sink', 'stdout', '--bogus');
	is($rc, 2, 'unknown option: exit 2');

	$node->safe_psql('postgres', 'CREATE DATABASE noext');
	($rc, $out, $err) = run_relay('--dsn', $node->connstr('noext'), '--sink', 'stdout', '--drain');
	is($rc, 1, 'database without the extension: exit 1');
	like($err, qr/prepare failed: .*SQLSTATE (3F000|42883)/, 'database without the extension: says why');
	like($err, qr/summary: .* exit=1/, 'summary line printed on a runtime error');

	($rc, $out, $err) = run_relay('--dsn', $dsn, '--sink', "file:$tmp/no/such/dir/out.ndjson");
	is($rc, 1, 'unwritable file sink: exit 1');
	like($err, qr/could not open file/, 'unwritable file sink: says why');

	# A broker sink's password_file that cannot be read: exit 1 at start-up
	# (the sink could not be opened), naming the sink and the file.
	for my $url ("redis://127.0.0.1:1/0?stream=s&password_file=$tmp/no.pw",
		"amqp://u\@127.0.0.1:1?exchange=x&routing_key=k&password_file=$tmp/no.pw",
		"mqtt://u\@127.0.0.1:1/t?password_file=$tmp/no.pw")
	{
		my ($scheme) = $url =~ /^(\w+):/;
		($rc, $out, $err) = run_relay('--dsn', $dsn, '--sink', $url, '--drain');
		is($rc, 1, "$scheme sink, unreadable password_file: exit 1");
		like($err, qr/could not open the $scheme sink's password_file "\Q$tmp\E\/no\.pw": No such file/,
			"$scheme sink, unreadable password_file: says which file");
	}

	($rc, $out, $err) = run_relay('--dsn', $dsn, '--sink', 'stdout', '--drain', '--batch', '20000');
	is($rc, 1, 'batch over outbox.max_batch: exit 1');
	like($err, qr/batch_size must be between 1 and/, 'batch over outbox.max_batch: server message shown');
}

# ---------------------------------------------------------------------------
# --claim-commit and --ack-commit
# ---------------------------------------------------------------------------
{
	my ($rc, $out, $err) = run_relay('--sink', 'stdout', '--claim-commit', 'later');
	is($rc, 2, '--claim-commit later: exit 2');
	like($err, qr/invalid value "later" for --claim-commit/, '--claim-commit later: says so');
	($rc, $out, $err) = run_relay('--sink', 'stdout', '--ack-commit', '');
	is($rc, 2, '--ack-commit with an empty value: exit 2');

	# With a synchronous standby that never comes, a commit that waits for
	# its flush waits for the standby forever: the relay drains only if
	# neither its claims nor its acks wait.
	sq(join("\n", map { "SELECT outbox.commit_decision('run-cm', $_, 'decided', 'cm-$_', 'commitmode', '{}');" } 1 .. 3));
	sq(q{ALTER SYSTEM SET synchronous_standby_names = 'nosuch'; SELECT pg_reload_conf()});
	($rc, $out, $err) = run_relay('--dsn', $dsn, '--sink', "file:$tmp/commitmode.ndjson",
		'--kinds', 'commitmode', '--ack-commit', 'async', '--drain', '--batch', '2');
	sq(q{ALTER SYSTEM RESET synchronous_standby_names; SELECT pg_reload_conf()});
	is($rc, 0, 'claims (async by default) and --ack-commit async wait for no flush: exit 0');
	like($err, qr/summary: .*claimed=3 delivered=3 acked=3 /, 'all three delivered and acked');
	ok($node->poll_query_until('postgres',
		"SELECT count(*) = 3 FROM outbox.commands WHERE kind = 'commitmode' AND status = 'published'"),
		'the asynchronous acks are applied');
}

# ---------------------------------------------------------------------------
# NDJSON to a file and to stdout
# ---------------------------------------------------------------------------
my @tricky = (
	[ 'nd-plain', 'mail', '{"to": "a@example.com", "n": 1}' ],
	[ qq(nd-"quoted"\\back), 'mail', '{"s": "quote \" backslash \\\\ slash /"}' ],
	[ "nd-tab\there", 'mail', '{"s": "line1\nline2\ttab \u0001 ctrl"}' ],
	[ 'nd-unicode-é', 'sms', '{"s": "héllo wörld ✓", "a": [1, 2.5, null, true]}' ],
	[ 'nd-empty', 'sms', '{}' ],);
produce(@tricky);
{
	my ($rc, $out, $err) =
	  run_relay('--dsn', $dsn, '--sink', "file:$tmp/out.ndjson", '--drain', '--batch', '2');
	is($rc, 0, 'file sink with --drain: exit 0');
	like($err, qr/summary: .*claimed=5 delivered=5 acked=5 .*exit=0/, 'file sink: summary counts');
	my @lines = split /\n/, slurp_file("$tmp/out.ndjson");
	is(scalar(@lines), 5, 'file sink: one line per command');
	# byte strings on both sides: the file is UTF-8, so is this script
	my $json = JSON::PP->new;
	my %got;
	for my $l (@lines)
	{
		my $o = eval { $json->decode($l) };
		ok($o, "line is valid JSON: $l") or next;
		is_deeply([ sort keys %$o ], [qw(command_id deliveries kind payload run_id seq)],
			'line has exactly the documented fields');
		$got{ $o->{command_id} } = $o;
	}
	for my $t (@tricky)
	{
		my ($id, $kind, $payload) = @$t;
		my $o = $got{$id};
		ok($o, "command \"$id\" written") or next;
		is($o->{kind}, $kind, "kind of \"$id\"");
		is($o->{run_id}, 'run-050', "run_id of \"$id\"");
		is($o->{deliveries}, 1, "deliveries of \"$id\"");
		is_deeply($o->{payload}, $json->decode($payload),
			"payload of \"$id\" round-trips");
	}
	is(sq("SELECT count(*) FROM outbox.commands WHERE run_id = 'run-050' AND status = 'published'"),
		'5', 'file sink: all published');
}
# ---------------------------------------------------------------------------
# Ordered commands: the ack of a batch hands the keys' next commands over
# (outbox.ack_handover), and the relay delivers them next, in key order;
# with --handover off every command is claimed
# ---------------------------------------------------------------------------
for my $mode ('on', 'off')
{
	sq(qq{SELECT count(outbox.commit_decision('run-ho-$mode-' || k, s, 'decided', 'ho-$mode-' || k || '-' || s,
											  'mail', '{}', ordering_key => 'hk-$mode-' || k))
			FROM (SELECT s, k FROM generate_series(1, 5) s, generate_series(1, 3) k ORDER BY s, k) d});
	my ($rc, $out, $err) =
	  run_relay('--dsn', $dsn, '--sink', 'stdout', '--drain', '--batch', '10', '--handover', $mode);
	is($rc, 0, "ordered, --handover $mode: exit 0");
	my %seqs;
	for my $l (split /\n/, $out)
	{
		my $o = JSON::PP->new->decode($l);
		push @{ $seqs{ $o->{run_id} } }, $o->{seq};
	}
	is_deeply(\%seqs, { map { ("run-ho-$mode-$_" => [ 1 .. 5 ]) } 1 .. 3 },
		"ordered, --handover $mode: each key's commands once, in order");
	like($err, qr/summary: .*claimed=15 delivered=15 acked=15 handed=@{[ $mode eq 'on' ? 12 : 0 ]} /,
		"ordered, --handover $mode: " . ($mode eq 'on' ? '12 of the 15 handed over by the acks' : 'none handed over'));
	is(sq(qq{SELECT string_agg(DISTINCT status || ' ' || version || ' ' || deliveries, ',')
			   FROM outbox.commands WHERE run_id LIKE 'run-ho-$mode-%'}),
		'published 3 1', "ordered, --handover $mode: each command leased once, then acked");
}

produce([ 'std-1', 'mail', '{"k": 1}' ], [ 'std-2', 'mail', '{"k": 2}' ]);
{
	my ($rc, $out, $err) = run_relay('--dsn', $dsn, '--sink', 'stdout', '--drain');
	is($rc, 0, 'stdout sink: exit 0');
	my @ids = map { JSON::PP->new->decode($_)->{command_id} } split /\n/, $out;
	is_deeply([ sort @ids ], [ 'std-1', 'std-2' ], 'stdout sink: NDJSON on stdout, logs on stderr');
	unlike($err, qr/"command_id"/, 'stdout sink: no data on stderr');
}

# A file that cannot take the data: the batch goes back (retryable), exit 1.
produce([ 'full-1', 'mail', '{}' ]);
{
	my ($rc, $out, $err) = run_relay('--dsn', $dsn, '--sink', 'file:/dev/full', '--drain');
	is($rc, 1, 'write error on the file sink: exit 1');
	is(sq("SELECT status || ' ' || deliveries || ' ' || (last_error LIKE '%No space left%') FROM outbox.commands WHERE command_id = 'full-1'"),
		'pending 1 true', 'write error: command back to pending with the error');
	sq("SELECT outbox.requeue('full-1')") if 0;
}
# deliver it, so later checks start clean
ok($node->poll_query_until('postgres',
	"SELECT available_at <= clock_timestamp() FROM outbox.commands WHERE command_id = 'full-1'"),
	'backoff of full-1 over');
run_relay('--dsn', $dsn, '--sink', "file:$tmp/rest.ndjson", '--drain');

# ---------------------------------------------------------------------------
# Kinds filter
# ---------------------------------------------------------------------------
produce([ 'kind-a', 'ka', '{}' ], [ 'kind-b', 'kb', '{}' ], [ 'kind-c', 'kc', '{}' ]);
{
	my ($rc, $out, $err) = run_relay('--dsn', $dsn, '--sink', 'stdout', '--drain', '--kinds', 'ka,kc');
	is($rc, 0, 'kinds filter: exit 0');
	my @ids = sort map { JSON::PP->new->decode($_)->{command_id} } split /\n/, $out;
	is_deeply(\@ids, [ 'kind-a', 'kind-c' ], 'kinds filter: only the named kinds delivered');
	is(sq("SELECT string_agg(command_id || '=' || status, ',' ORDER BY command_id) FROM outbox.commands WHERE command_id LIKE 'kind-%'"),
		'kind-a=published,kind-b=pending,kind-c=published', 'kinds filter: the other kind stays pending');
	($rc, $out, $err) = run_relay('--dsn', $dsn, '--sink', 'stdout', '--drain', '--kinds', 'kb');
	is($out =~ tr/\n//, 1, 'kinds filter: the other kind delivered by its own relay');
}

# ---------------------------------------------------------------------------
# HTTP sink
# ---------------------------------------------------------------------------
my $rlog = "$tmp/receiver.log";
# The receiver's consumer name belongs to the role it connects as.
sq("SELECT outbox.register_consumer('outbox-receiver', current_user::text::regrole)");
my $rpid = spawn("$tmp/receiver.out", "$tmp/receiver.err", $receiver,
	'--port-file', "$tmp/receiver.port", '--dsn', $dsn, '--table', 'biz', '--log', $rlog);
ok(wait_file("$tmp/receiver.port"), 'receiver listening');
my $port = slurp_file("$tmp/receiver.port");
chomp $port;
my $url = "http://127.0.0.1:$port/hook";

produce(
	[ 'h-ok-1', 'hook', '{"n": 1}' ],
	[ 'h-ok-2', 'hook', '{"n": 2}' ],
	[ 'h-503', 'hook', '{"test_status": 503, "test_times": 2}' ],
	[ 'h-500', 'hook', '{"test_status": 500, "test_times": 1}' ],
	[ 'h-429', 'hook', '{"test_status": 429, "test_times": 1}' ],
	[ 'h-408', 'hook', '{"test_status": 408, "test_times": 1}' ],
	[ 'h-timeout', 'hook', '{"test_sleep_ms": 2500, "test_times": 1}' ],
	[ 'h-422', 'hook', '{"test_status": 422}' ],
	[ 'h-301', 'hook', '{"test_status": 301, "test_times": 1}' ]);
{
	my $err = "$tmp/relay-http.err";
	my $pid = spawn("$tmp/relay-http.out", $err, 'outbox-relay', '--dsn', $dsn,
		'--sink', $url, '--timeout', '1', '--poll', '0.2', '--kinds', 'hook', '--worker', 'http-relay');
	ok($node->poll_query_until('postgres',
		"SELECT count(*) FILTER (WHERE status IN ('published', 'dead')) = 9 FROM outbox.commands WHERE kind = 'hook'"),
		'HTTP: every command settled');
	kill 'TERM', $pid;
	is(wait_exit($pid), 0, 'HTTP relay: SIGTERM exits 0');
	my $errtxt = slurp_file($err);
	like($errtxt, qr/summary: worker=http-relay .*exit=0/, 'HTTP relay: summary line');

	my %st = map { split /\|/ } split /\n/,
	  sq("SELECT command_id, status || ' ' || deliveries FROM outbox.commands WHERE kind = 'hook'");
	is($st{'h-ok-1'}, 'published 1', '2xx: acked on the first delivery');
	is($st{'h-ok-2'}, 'published 1', '2xx: acked on the first delivery (2)');
	is($st{'h-503'}, 'published 3', '503 twice: retried through fail, then acked');
	is($st{'h-500'}, 'published 2', '500: retried');
	is($st{'h-429'}, 'published 2', '429: retried');
	is($st{'h-408'}, 'published 2', '408: retried');
	is($st{'h-301'}, 'published 2', 'a redirect is not followed and is retried');
	is($st{'h-timeout'}, 'published 2', 'timeout: retried');
	is($st{'h-422'}, 'dead 1', '422: fatal, dead at once');
	like(sq("SELECT last_error FROM outbox.commands WHERE command_id = 'h-422'"),
		qr/^HTTP 422 from \Q$url\E/, '422: last_error names the status');
	like(sq("SELECT last_error FROM outbox.commands WHERE command_id = 'h-timeout'"),
		qr/[Tt]imeout/, 'timeout: last_error says so');
	like(sq("SELECT last_error FROM outbox.commands WHERE command_id = 'h-503'"),
		qr/^HTTP 503/, '503: last_error names the status');

	# the retries waited for the backoff: fail() moved available_at, and
	# the attempts were spaced by at least the minimum backoff (base/2)
	is(sq("SELECT count(*) FROM outbox.commands WHERE kind = 'hook' AND available_at > created_at AND deliveries > 1"),
		'6', 'retried commands were made available again only after a backoff');

	# the receiver saw the Idempotency-Key of every delivery (it answers 400
	# without one, which would have made the command dead)
	my @log = map { [ split /\t/ ] } split /\n/, slurp_file($rlog);
	my %key_seen = map { $_->[0] => 1 } @log;
	is_deeply([ sort keys %key_seen ],
		[ sort qw(h-ok-1 h-ok-2 h-503 h-500 h-429 h-408 h-timeout h-422 h-301) ],
		'Idempotency-Key carried the command_id of every delivery');
	my %deliveries_logged;
	$deliveries_logged{ $_->[0] }{ $_->[1] }++ for @log;
	is_deeply([ sort { $a <=> $b } keys %{ $deliveries_logged{'h-503'} } ], [ 1, 2, 3 ],
		'body carries the delivery number');
	my @t503 = map { $_->[4] } grep { $_->[0] eq 'h-503' } @log;
	ok($t503[1] - $t503[0] >= 50 && $t503[2] - $t503[1] >= 50,
		'retries of h-503 spaced by the backoff (' . join(', ', map { $t503[$_] - $t503[$_ - 1] } 1 .. 2) . ' ms)');

	# exactly once in the business table and one receipt per published command
	is(sq("SELECT count(*) || ' ' || count(DISTINCT command_id) FROM biz WHERE command_id LIKE 'h-%'"),
		'8 8', 'business rows: one per published command');
	is(sq("SELECT count(*) FROM outbox.receipts WHERE command_id LIKE 'h-%'"), '8',
		'receipts recorded by the receiver');
}

# --concurrency: the requests of a batch overlap.  Each takes 1.5 s at the
# receiver; one at a time, the four would finish at least 4.5 s apart.
produce(map { [ "conc-$_", 'conc', '{"test_sleep_ms": 1500}' ] } 1 .. 4);
{
	my ($rc, $out, $err) = run_relay('--dsn', $dsn, '--sink', $url, '--kinds', 'conc',
		'--concurrency', '4', '--drain');
	is($rc, 0, '--concurrency 4: exit 0');
	is(sq("SELECT count(*) FROM outbox.commands WHERE kind = 'conc' AND status = 'published' AND deliveries = 1"),
		'4', '--concurrency 4: all delivered once');
	my @t = sort { $a <=> $b } map { (split /\t/)[4] } grep { /^conc-/ } split /\n/, slurp_file($rlog);
	is(scalar(@t), 4, '--concurrency 4: four requests');
	cmp_ok($t[-1] - $t[0], '<', 1500, '--concurrency 4: the requests were in flight together');
}

# A command id is producer text: a newline in it cannot forge a line of the
# relay's log.  The endpoint refuses the command (404), and the relay logs
# it dead with the id escaped.
produce([ "lf-1\noutbox-relay[1]: forged line", 'lf', '{"test_status": 404}' ]);
{
	my ($rc, $out, $err) = run_relay('--dsn', $dsn, '--sink', $url, '--kinds', 'lf', '--drain');
	is($rc, 0, 'a refused command with a newline in its id: exit 0');
	is(sq("SELECT status FROM outbox.commands WHERE kind = 'lf'"), 'dead', 'the command is dead');
	like($err, qr/^outbox-relay\[\d+\]: command "lf-1\\x0Aoutbox-relay\[1\]: forged line" is dead/m,
		'the log names the id with its newline escaped');
	unlike($err, qr/^outbox-relay\[1\]: forged line/m, 'no forged line in the log');
	unlike($err, qr/[0-9a-f]{32}:/, 'no token in the log');
}

# The endpoint is unreachable: the command fails (retryable) and the relay
# backs off instead of spinning.
produce([ 'down-1', 'down', '{}' ], [ 'down-2', 'down', '{}' ]);
{
	# No delivery is spent on an endpoint that is unreachable or refuses
	# the relay (401, 403, 404): the relay holds the batch (renewing its
	# leases), stops claiming, logs one line and retries with backoff; on
	# SIGTERM it hands the commands back as retryable.
	my $deadport = PostgreSQL::Test::Cluster::get_free_port();
	my $err = "$tmp/relay-down.err";
	my $pid = spawn("$tmp/relay-down.out", $err, 'outbox-relay', '--dsn', $dsn,
		'--sink', "http://127.0.0.1:$deadport/", '--kinds', 'down', '--poll', '0.2',
		'--lease', '1');
	ok(wait_match($err, qr/sink unavailable: .*Couldn't connect to server.*holding 2 commands, claiming paused/),
		'unreachable endpoint: one line says the sink is unavailable and the batch is held');
	# the held leases outlive their 1 s by being renewed
	ok($node->poll_query_until('postgres',
		"SELECT count(*) = 2 FROM outbox.commands WHERE kind = 'down' AND status = 'sending' AND lease_until > created_at + interval '4 seconds'"),
		'unreachable endpoint: the held leases are renewed');
	is(sq("SELECT count(*) FROM outbox.commands WHERE kind = 'down' AND (deliveries <> 1 OR last_error IS NOT NULL)"),
		'0', 'unreachable endpoint: no delivery spent, nothing failed while held');
	kill 'TERM', $pid;
	is(wait_exit($pid), 0, 'unreachable endpoint: SIGTERM exits 0');
	my $log = slurp_file($err);
	is(scalar(() = $log =~ /sink unavailable/g), 1, 'unreachable endpoint: the outage is logged once');
	is(sq("SELECT count(*) FROM outbox.commands WHERE kind = 'down' AND status = 'pending' AND deliveries = 1"),
		'2', 'unreachable endpoint: released on SIGTERM, pending for a retry');
	like(sq("SELECT string_agg(last_error, '|') FROM outbox.commands WHERE kind = 'down'"),
		qr/Couldn't connect to server/, 'unreachable endpoint: the connection error is recorded');
}

# 401 and 404 are about the relay (credentials, the URL), not the command:
# held like an outage, never dead, and delivered once the endpoint answers
# again.  The receiver answers auth-1's first delivery with 401 and
# auth-2's first two with 404.
produce([ 'auth-1', 'auth', '{"test_status": 401, "test_times": 1}' ],
	[ 'auth-2', 'auth', '{"test_status": 404, "test_times": 2}' ]);
{
	my $states = "SELECT string_agg(status || ' ' || deliveries, ',' ORDER BY command_id) FROM outbox.commands WHERE kind = 'auth'";
	my $err = "$tmp/relay-401.err";
	my $pid = spawn("$tmp/relay-401.out", $err, 'outbox-relay', '--dsn', $dsn,
		'--sink', $url, '--kinds', 'auth', '--poll', '0.2');
	ok(wait_match($err, qr/sink unavailable: HTTP 401 from/), '401: the sink is unavailable');
	kill 'TERM', $pid;
	is(wait_exit($pid), 0, '401: SIGTERM exits 0');
	is(sq($states), 'pending 1,pending 1', '401: nothing dead, both back to pending after one delivery');

	$err = "$tmp/relay-404.err";
	$pid = spawn("$tmp/relay-404.out", $err, 'outbox-relay', '--dsn', $dsn,
		'--sink', $url, '--kinds', 'auth', '--poll', '0.2');
	ok(wait_match($err, qr/sink unavailable: HTTP 404 from/), '404: the sink is unavailable');
	kill 'TERM', $pid;
	is(wait_exit($pid), 0, '404: SIGTERM exits 0');
	# auth-1 may or may not have been in that relay's batch (it depends on
	# the backoffs the first relay's release drew)
	is(sq("SELECT status || ' ' || deliveries FROM outbox.commands WHERE command_id = 'auth-2'"),
		'pending 2', '404: auth-2 held and handed back, not dead');
	is(sq("SELECT count(*) FROM outbox.commands WHERE kind = 'auth' AND status = 'dead'"), '0',
		'404: nothing dead');

	$err = "$tmp/relay-auth.err";
	$pid = spawn("$tmp/relay-auth.out", $err, 'outbox-relay', '--dsn', $dsn,
		'--sink', $url, '--kinds', 'auth', '--poll', '0.2');
	ok($node->poll_query_until('postgres', "SELECT count(*) = 2 FROM outbox.commands WHERE kind = 'auth' AND status = 'published'"),
		'endpoint answering again: both published');
	kill 'TERM', $pid;
	is(wait_exit($pid), 0, 'endpoint answering again: SIGTERM exits 0');
	is(sq("SELECT status || ' ' || deliveries FROM outbox.commands WHERE command_id = 'auth-2'"),
		'published 3', 'endpoint answering again: one delivery per relay, none spent on the outage');
}

# Sink URLs that cannot work end the relay at start-up: exit 2, one line.
for my $bad ('http://', 'http://[::1', 'ftp://x', 'file:')
{
	my ($rc, $out, $err) = run_relay('--dsn', $dsn, '--sink', $bad);
	is($rc, 2, "--sink '$bad': exit 2");
	is(scalar(split /\n/, $err), 1, "--sink '$bad': one line") or diag($err);
}
{
	my ($rc, $out, $err) = run_relay('--sink', 'stdout', '--dsn', 'port=abc');
	is($rc, 2, "--dsn 'port=abc': exit 2");
	like($err, qr/invalid port number "abc"/, "--dsn 'port=abc': says so");
}

# ---------------------------------------------------------------------------
# Lease renewal during a slow delivery
# ---------------------------------------------------------------------------
produce([ 'slow-renew', 'slow', '{"test_sleep_ms": 3500}' ]);
{
	my $err = "$tmp/relay-renew.err";
	my $pid = spawn("$tmp/relay-renew.out", $err, 'outbox-relay', '--dsn', $dsn,
		'--sink', $url, '--kinds', 'slow', '--lease', '2', '--timeout', '20',
		'--worker', 'renewer', '--poll', '0.2');
	ok($node->poll_query_until('postgres',
		"SELECT status = 'sending' FROM outbox.commands WHERE command_id = 'slow-renew'"),
		'slow delivery claimed');
	my $first = sq("SELECT lease_until FROM outbox.commands WHERE command_id = 'slow-renew'");
	ok($node->poll_query_until('postgres',
		"SELECT clock_timestamp() > '$first'::timestamptz"),
		'the first lease has run out');
	is(sq("SELECT count(*) FROM outbox.claim('thief', 10, '10 s', ARRAY['slow'])"), '0',
		'renewed lease: another worker cannot take the command over');
	is(sq("SELECT owner || ' ' || (lease_until > '$first'::timestamptz) FROM outbox.commands WHERE command_id = 'slow-renew'"),
		'renewer true', 'lease renewed by its holder');
	ok($node->poll_query_until('postgres',
		"SELECT status = 'published' FROM outbox.commands WHERE command_id = 'slow-renew'"),
		'slow delivery acked');
	is(sq("SELECT deliveries FROM outbox.commands WHERE command_id = 'slow-renew'"), '1',
		'slow delivery: delivered once');
	kill 'TERM', $pid;
	is(wait_exit($pid), 0, 'renewing relay: exit 0');
	like(slurp_file($err), qr/summary: .*renewed=[1-9]/, 'summary counts the renewals');
}

# ---------------------------------------------------------------------------
# SIGTERM: stop claiming, finish the batches in hand (the one in flight and
# the one claimed ahead while it was delivered), exit 0.  A second signal
# interrupts the delivery and fails the command (retryable), and gives the
# batch claimed ahead back undelivered (retryable too).
# ---------------------------------------------------------------------------
produce([ 'term-slow', 'term', '{"test_sleep_ms": 1500}' ]);
produce([ 'term-next', 'term', '{}' ]);
produce([ 'term-third', 'term', '{}' ]);
{
	my $err = "$tmp/relay-term.err";
	my $pid = spawn("$tmp/relay-term.out", $err, 'outbox-relay', '--dsn', $dsn,
		'--sink', $url, '--kinds', 'term', '--batch', '1', '--poll', '0.2');
	ok($node->poll_query_until('postgres',
		"SELECT status = 'sending' FROM outbox.commands WHERE command_id = 'term-slow'"),
		'SIGTERM: slow delivery in flight');
	ok($node->poll_query_until('postgres',
		"SELECT status = 'sending' FROM outbox.commands WHERE command_id = 'term-next'"),
		'SIGTERM: the next batch claimed ahead meanwhile');
	kill 'TERM', $pid;
	is(wait_exit($pid), 0, 'SIGTERM: exit 0');
	is(sq("SELECT status || ' ' || deliveries FROM outbox.commands WHERE command_id = 'term-slow'"),
		'published 1', 'SIGTERM: the delivery in flight was finished and acked');
	is(sq("SELECT status || ' ' || deliveries FROM outbox.commands WHERE command_id = 'term-next'"),
		'published 1', 'SIGTERM: the batch claimed ahead was delivered and acked too');
	is(sq("SELECT status || ' ' || deliveries FROM outbox.commands WHERE command_id = 'term-third'"),
		'pending 0', 'SIGTERM: nothing claimed after the signal');
	like(slurp_file($err), qr/stop requested.*summary: .*exit=0/s, 'SIGTERM: logged and summarized');
}
sq("UPDATE outbox.commands SET payload = '{\"test_sleep_ms\": 20000}' WHERE command_id = 'term-third'");
produce([ 'term-fourth', 'term', '{}' ]);
{
	my $err = "$tmp/relay-term2.err";
	my $pid = spawn("$tmp/relay-term2.out", $err, 'outbox-relay', '--dsn', $dsn,
		'--sink', $url, '--kinds', 'term', '--batch', '1', '--timeout', '30', '--poll', '0.2');
	ok($node->poll_query_until('postgres',
		"SELECT status = 'sending' FROM outbox.commands WHERE command_id = 'term-third'"),
		'second SIGTERM: slow delivery in flight');
	ok($node->poll_query_until('postgres',
		"SELECT status = 'sending' FROM outbox.commands WHERE command_id = 'term-fourth'"),
		'second SIGTERM: the next batch claimed ahead');
	kill 'TERM', $pid;
	usleep(100_000);
	kill 'TERM', $pid;
	is(wait_exit($pid), 0, 'second SIGTERM: exit 0');
	is(sq("SELECT status || ' ' || deliveries || ' ' || last_error FROM outbox.commands WHERE command_id = 'term-third'"),
		'pending 1 delivery interrupted: the relay was stopped',
		'second SIGTERM: the delivery in flight was failed as retryable');
	is(sq("SELECT status || ' ' || deliveries || ' ' || last_error FROM outbox.commands WHERE command_id = 'term-fourth'"),
		'pending 1 delivery not attempted: the relay was interrupted',
		'second SIGTERM: the batch claimed ahead was given back undelivered, retryable');
}

# ---------------------------------------------------------------------------
# SIGHUP reopens a file sink (log rotation).
# ---------------------------------------------------------------------------
{
	my $f = "$tmp/hup.ndjson";
	my $pid = spawn("$tmp/relay-hup.out", "$tmp/relay-hup.err", 'outbox-relay', '--dsn', $dsn,
		'--sink', "file:$f", '--kinds', 'hup', '--poll', '0.2');
	produce([ 'hup-1', 'hup', '{}' ]);
	ok($node->poll_query_until('postgres',
		"SELECT status = 'published' FROM outbox.commands WHERE command_id = 'hup-1'"),
		'SIGHUP: first command delivered');
	rename($f, "$f.1") or die;
	kill 'HUP', $pid;
	produce([ 'hup-2', 'hup', '{}' ]);
	ok($node->poll_query_until('postgres',
		"SELECT status = 'published' FROM outbox.commands WHERE command_id = 'hup-2'"),
		'SIGHUP: second command delivered');
	kill 'TERM', $pid;
	is(wait_exit($pid), 0, 'SIGHUP: relay kept running, exit 0 on SIGTERM');
	like(slurp_file("$f.1"), qr/\A\{"command_id":"hup-1"[^\n]*\n\z/, 'SIGHUP: the rotated file has the first line only');
	like(slurp_file($f), qr/\A\{"command_id":"hup-2"[^\n]*\n\z/, 'SIGHUP: the reopened file has the second');
}

# ---------------------------------------------------------------------------
# Privileges: membership in the database's publisher role
# (postgres_outbox_publisher here) is all the relay needs; a role
# without it is refused with a clear error and exit 1.
# ---------------------------------------------------------------------------
sq("CREATE ROLE relay_login LOGIN IN ROLE postgres_outbox_publisher; CREATE ROLE nobody_login LOGIN");
produce([ 'role-1', 'rolek', '{}' ]);
{
	my ($rc, $out, $err) = run_relay('--dsn', "$dsn user=nobody_login", '--sink', 'stdout', '--drain');
	is($rc, 1, 'role without the publisher role: exit 1');
	like($err, qr/permission denied .*SQLSTATE 42501/, 'role without the publisher role: says why');
	($rc, $out, $err) = run_relay('--dsn', "$dsn user=relay_login", '--sink', 'stdout', '--drain',
		'--kinds', 'rolek');
	is($rc, 0, 'publisher role member: exit 0');
	like($out, qr/"command_id":"role-1"/, 'publisher role member: delivers');
}

# ---------------------------------------------------------------------------
# Wake-ups: with a long poll, the notification the background worker sends
# after a commit is what gets the command delivered.
# ---------------------------------------------------------------------------
{
	my $err = "$tmp/relay-listen.err";
	my $pid = spawn("$tmp/relay-listen.out", $err, 'outbox-relay', '--dsn', $dsn,
		'--sink', "file:$tmp/listen.ndjson", '--kinds', 'wake', '--poll', '600');
	# LISTEN comes before the first claim: once that claim is over, the
	# relay is waiting for a notification (or 600 s)
	ok($node->poll_query_until('postgres',
		"SELECT count(*) = 1 FROM pg_stat_activity WHERE state = 'idle' AND query LIKE '%outbox.claim(\$1, \$2, pg_catalog.make_interval%'"),
		'listening relay connected and idle');
	produce([ 'wake-1', 'wake', '{}' ]);
	ok($node->poll_query_until('postgres',
		"SELECT status = 'published' FROM outbox.commands WHERE command_id = 'wake-1'"),
		'notified relay delivered the command');
	kill 'TERM', $pid;
	is(wait_exit($pid), 0, 'listening relay: exit 0');
	like(slurp_file($err), qr/summary: .*batches=1 .*wakeups=[1-9]/, 'delivered on a wake-up, not by polling');
}

# ---------------------------------------------------------------------------
# Reconnection after a server restart; the relay works by polling alone.
# ---------------------------------------------------------------------------
{
	my $err = "$tmp/relay-restart.err";
	my $out = "$tmp/relay-restart.ndjson";
	my $pid = spawn("$tmp/relay-restart.out", $err, 'outbox-relay', '--dsn', $dsn,
		'--sink', "file:$out", '--kinds', 'rs', '--poll', '0.2');
	produce([ 'rs-before', 'rs', '{}' ]);
	ok($node->poll_query_until('postgres',
		"SELECT status = 'published' FROM outbox.commands WHERE command_id = 'rs-before'"),
		'restart: delivered before the restart');
	$node->restart;
	produce([ 'rs-after', 'rs', '{}' ]);
	ok($node->poll_query_until('postgres',
		"SELECT status = 'published' FROM outbox.commands WHERE command_id = 'rs-after'"),
		'restart: delivered after the restart');
	$node->stop('immediate');
	$node->start;
	produce([ 'rs-crash', 'rs', '{}' ]);
	ok($node->poll_query_until('postgres',
		"SELECT status = 'published' FROM outbox.commands WHERE command_id = 'rs-crash'"),
		'restart: delivered after an immediate stop');
	kill 'TERM', $pid;
	is(wait_exit($pid), 0, 'restart: exit 0');
	my $e = slurp_file($err);
	like($e, qr/connection lost/, 'restart: the loss was logged');
	like($e, qr/summary: .*reconnects=[2-9]/, 'restart: reconnected twice');
	my @ids = map { JSON::PP->new->decode($_)->{command_id} } split /\n/, slurp_file($out);
	is_deeply([ sort @ids ], [qw(rs-after rs-before rs-crash)], 'restart: each command written once');
}

# ---------------------------------------------------------------------------
# The producer's headers as HTTP request headers, under their own names;
# the relay's own headers (Content-Type, Idempotency-Key, --header) keep
# their values, and a framing header is never sent even if the table holds
# one (the server refuses it at commit_decision; a superuser's UPDATE gets
# it in here).  A small HTTP server of the test's own records each request.
# ---------------------------------------------------------------------------
{
	my $lsock = IO::Socket::INET->new(LocalAddr => '127.0.0.1', LocalPort => 0, Listen => 5,
		ReuseAddr => 1) or die "listen: $!";
	my $hport = $lsock->sockport;
	my $hpid = fork() // die "fork: $!";
	if ($hpid == 0)
	{
		open(my $log, '>', "$tmp/http-heads.txt") or POSIX::_exit(1);
		$log->autoflush(1);
		while (my $c = $lsock->accept)
		{
			my $head = '';
			while (defined(my $l = <$c>))
			{
				last if $l eq "\r\n";
				$head .= $l;
			}
			my ($len) = $head =~ /^Content-Length:\s*(\d+)/mi;
			my $body = '';
			read($c, $body, $len // 0);
			print $log $head, "body: $body\n\n";
			print $c "HTTP/1.1 200 OK\r\nContent-Length: 0\r\nConnection: close\r\n\r\n";
			close $c;
		}
		POSIX::_exit(0);
	}
	close $lsock;
	sq(q{SELECT outbox.commit_decision('run-hh', 1, 'decided', 'hh-1', 'hh', '{}',
		headers => '{"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", "Content-Type": "text/plain", "X-Team": "producer", "x-empty": ""}')});
	sq(q{UPDATE outbox.commands SET headers = headers || '{"Host": "evil.example", "Transfer-Encoding": "chunked"}'
		WHERE command_id = 'hh-1'});
	my ($rc, $out, $err) = run_relay('--dsn', $dsn, '--sink', "http://127.0.0.1:$hport/hook", '--kinds', 'hh',
		'--drain', '--header', 'X-Team: ops');
	is($rc, 0, 'headers: the relay drains') or diag($err);
	kill 'TERM', $hpid;
	waitpid($hpid, 0);
	my $req = slurp_file("$tmp/http-heads.txt");
	my ($head) = split /^body: /m, $req;
	like($req, qr/^traceparent: 00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01\r$/m, 'headers: traceparent is a request header');
	like($req, qr/^x-empty:\s*\r$/m, 'headers: an empty value is sent empty');
	like($req, qr/^X-Team: ops\r$/m, 'headers: a --header keeps its value');
	unlike($req, qr/^X-Team: producer/m, 'headers: the producer\'s value of a --header is not sent');
	like($req, qr/^Content-Type: application\/json\r$/m, 'headers: Content-Type stays application/json');
	unlike($head, qr/text\/plain|evil\.example|chunked/, 'headers: no producer Content-Type, Host or Transfer-Encoding');
	like($req, qr/^Host: 127\.0\.0\.1:$hport\r$/m, 'headers: Host is the endpoint\'s');
	like($req, qr/^body: \{"command_id":"hh-1","run_id":"run-hh","seq":1,"kind":"hh",.*"headers":\{/m,
		'headers: the body has seq and the headers');
	is(sq("SELECT status FROM outbox.commands WHERE command_id = 'hh-1'"), 'published', 'headers: acked');
}

kill 'TERM', $rpid;
waitpid($rpid, 0);
$node->stop;
done_testing();
