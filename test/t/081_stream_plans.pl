# The stream statements that find a batch's retries use the index by batch
# (stream_failures_batch_idx), however many failures the subscription
# holds and whatever stream_failures looked like when the session made its
# saved plans.  One session runs a stream cycle (decide, tick, claim a
# batch, fail all of it, claim its retries again, ack them) while the
# tables are empty, fills stream_failures with 20,000 failures of the same
# subscription and partition (dead ones, and retries due in a day), and
# runs the cycle again with auto_explain logging every nested statement's
# plan; then once more after ANALYZE.  Read through the primary key
# (subscription, command_id) with a filter on the batch, the claim of the
# retries and their ack would read every failure of the subscription.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use FindBin;
use lib "$FindBin::RealBin/../perl";
use OutboxTest;

# No autovacuum: nothing may re-plan behind the test's back.
my $node = outbox_node('stream_plans', "autovacuum = off\n");
$node->safe_psql('postgres', q{
CREATE EXTENSION outbox;
SELECT outbox.create_stream('s', partitions => 1, batch_size => 100);
SELECT outbox.set_policy('k', stream => 's', backoff_base => '0', backoff_max => '0');
SELECT outbox.create_subscription('s', 'sub');
});

# One cycle on ten commands of run $p: every command fails once (retryable,
# due at once), is claimed again with its batch's retries, and is acked.
sub cycle
{
	my ($p) = @_;
	return qq{
SELECT count(*) FROM (SELECT outbox.commit_decision('run-$p', g, 'e', '$p-' || g, 'k', '{}')
						FROM generate_series(1, 10) g) d;
SELECT outbox.tick_streams() >= 0;
CREATE TEMP TABLE b AS SELECT * FROM outbox.claim_batch('s', 'sub', 'w');
SELECT count(*) = 10 AS claimed_ten FROM b;
SELECT outbox.ack_batch('w', (SELECT min(token) FROM b), ARRAY(SELECT command_id FROM b),
						ARRAY(SELECT 'later' FROM b)) = 0 AS failed_all;
DROP TABLE b;
SELECT outbox.tick_streams() >= 0;
CREATE TEMP TABLE b AS SELECT * FROM outbox.claim_batch('s', 'sub', 'w');
SELECT count(*) = 10 AND bool_and(command_id LIKE '$p-%') AS reclaimed_ten FROM b;
SELECT outbox.ack_batch('w', (SELECT min(token) FROM b)) = 10 AS acked_ten;
DROP TABLE b;
SELECT count(*) = 0 AS no_failure_of_the_run_left FROM outbox.stream_failures WHERE run_id = 'run-$p';
SELECT 'cycle $p done';
};
}

my $fill = q{
INSERT INTO outbox.stream_failures (subscription, command_id, part, state, batch_id, deliveries,
	available_at, log_id, xid, stream_id, run_id, seq, kind, payload, created_at)
SELECT 'sub', 'fill-' || g, 0, CASE WHEN g % 2 = 0 THEN 'dead' ELSE 'retry' END, NULL, 5,
	   now() + interval '1 day', -g, '1'::xid8, (SELECT stream_id FROM outbox.streams WHERE stream = 's'),
	   'fill-' || g / 100, g % 100, 'k', '{}', now()
  FROM generate_series(1, 20000) g;
};

my $script = q{
ANALYZE outbox.stream_failures;
LOAD 'auto_explain';
SET auto_explain.log_nested_statements = on;
SET auto_explain.log_level = notice;
SET client_min_messages = notice;
SET auto_explain.log_min_duration = -1;
} . cycle('empty') . $fill . q{
SET auto_explain.log_min_duration = 0;
} . cycle('filled') . q{
ANALYZE;
} . cycle('analyzed');

my ($rc, $out, $err) = $node->psql('postgres', $script, on_error_stop => 1);
is($rc, 0, 'every cycle ran') or diag($err);
like($out, qr/cycle analyzed done/, 'the script ran to its end');
unlike($out, qr/^f$/m, 'each cycle claimed, failed, claimed again and acked its ten commands');

my ($filled, $analyzed) = split /Query Text: SELECT 'cycle filled done'/, $err;
for my $p (['filled', $filled], ['analyzed', $analyzed])
{
	my ($name, $log) = @$p;
	my @plans = split /NOTICE:  duration: /, $log // '';
	shift @plans;
	my @batch = grep { /stream_failures[^\n]*\n(?:[^\n]*\n)*?[^\n]*batch_id = / } @plans;
	cmp_ok(scalar(@batch), '>=', 2,
		"$name: auto_explain logged the statements that read stream_failures by batch");

	# (the test's own count of a run's failures left reads the table)
	my @bad = grep { /(?:Seq Scan|Bitmap Heap Scan) on stream_failures\b/ && !/AS no_failure_of_the_run_left/ } @plans;
	is(scalar(@bad), 0, "$name: no plan reads stream_failures with a sequential or bitmap scan")
	  or diag(join("\n----\n", @bad));

	my @walk = grep { /Index Scan using stream_failures_pkey on stream_failures\b[^\n]*\n(?:\s+Index Cond:[^\n]*\n)?\s+Filter:[^\n]*batch_id = / } @plans;
	is(scalar(@walk), 0, "$name: no statement finds a batch's failures by walking the subscription's failures in stream_failures_pkey")
	  or diag(join("\n----\n", @walk));

	ok((grep { /Query Text: SELECT outbox\.claim_batch/ || /ORDER BY x\.id/ } @plans)
		&& (grep { /Index Scan using stream_failures_batch_idx on stream_failures[^\n]*\n\s+Index Cond: \(\(subscription = [^\n]*part = [^\n]*batch_id = / } @plans),
		"$name: the batch's retries are read from stream_failures_batch_idx by subscription, part and batch");
	ok((grep { /Query Text:\s+DELETE FROM outbox\.stream_failures f(?:.*\n)+?.*Index Scan using stream_failures_batch_idx/ } @plans),
		"$name: the ack deletes the batch's published retries through stream_failures_batch_idx");
}

$node->stop;
done_testing();
