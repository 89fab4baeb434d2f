# The API's statements use their indexes on a filled table, whatever the
# table looked like when the session made its saved plans.  One session
# calls every producer, publisher, consumer and administrator function while
# the tables are empty (the plans are made then), fills the tables with
# 100,000 pending and 50,000 published commands and 200 ordering keys of 100
# commands (one head each, the rest waiting), and calls them all again
# with auto_explain logging every nested statement's plan; then once more
# after ANALYZE (plans re-made with statistics).  No plan may read a table
# of the extension with a sequential or bitmap scan.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use FindBin;
use lib "$FindBin::RealBin/../perl";
use OutboxTest;

# No autovacuum: nothing may re-plan behind the test's back.
my $node = outbox_node('plans', "autovacuum = off\n");
$node->safe_psql('postgres', 'CREATE EXTENSION outbox');

# Every API function once, on commands of a kind named after phase $p (the
# claim asks for that kind only).
sub calls
{
	my ($p) = @_;
	return qq{
SELECT outbox.commit_decision('run-$p', 1, 'e', '$p-1', 'k-$p', '{}', NULL, NULL, 1);
SELECT * FROM outbox.commit_decisions('[{"run_id": "run-$p", "seq": 2, "event_kind": "e", "command_id": "$p-2",
	"command_kind": "k-$p", "payload": {}, "priority": 1},
	{"run_id": "run-$p", "seq": 3, "event_kind": "e", "command_id": "$p-3", "command_kind": "k-$p",
	"payload": {}, "priority": 1}]');
SELECT outbox.record_event('run-$p', 4, 'e');
CREATE TEMP TABLE l AS SELECT * FROM outbox.claim('w-$p', 10, NULL, ARRAY['k-$p']);
SELECT count(*) = 3 AS claimed_three FROM l;
SELECT outbox.commit_decision('run-$p', 5, 'e', '$p-4', 'k-$p', '{}');
SELECT count(*) = 1 AS leased_one FROM outbox.claim('x-$p', 1, interval '1 millisecond', ARRAY['k-$p']);
SELECT pg_sleep(0.01);
SELECT count(*) = 1 AS took_over_one FROM outbox.claim('y-$p', 1, interval '1 hour', ARRAY['k-$p']);
SELECT outbox.renew('w-$p', (SELECT token FROM l WHERE command_id = '$p-1'));
SELECT outbox.ack('w-$p', (SELECT token FROM l WHERE command_id = '$p-1'));
SELECT count(*) FROM outbox.ack_many('w-$p', ARRAY[(SELECT token FROM l WHERE command_id = '$p-2'),
	(SELECT token FROM l WHERE command_id = '$p-1'), 'not a token']);
SELECT count(*) FROM outbox.ack_many('w-$p', ARRAY(SELECT (SELECT token FROM l WHERE command_id = '$p-2') FROM generate_series(1, 200) g));
DO \$\$ BEGIN PERFORM outbox.ack('w-$p', (SELECT token FROM l WHERE command_id = '$p-1')); EXCEPTION WHEN SQLSTATE 'OB001' THEN NULL; END \$\$;
SELECT outbox.fail('w-$p', (SELECT token FROM l WHERE command_id = '$p-3'), 'boom', true);
SELECT outbox.requeue('run-$p', '$p-3');
SELECT outbox.complete('run-$p', '$p-1');
SELECT outbox.register_consumer('consumer', current_user::text::regrole);
SELECT outbox.inbox_accept('consumer', 'run-$p', '$p-1');
SELECT outbox.sweep();
SELECT outbox.purge(10, interval '0');
DROP TABLE l;
SELECT outbox.commit_decision('run-$p', 6, 'e', '$p-o1', 'o-$p', '{}', ordering_key => 'key-$p');
SELECT * FROM outbox.commit_decisions('[{"run_id": "run-$p", "seq": 7, "event_kind": "e", "command_id": "$p-o2",
	"command_kind": "o-$p", "payload": {}, "ordering_key": "key-$p"},
	{"run_id": "run-$p", "seq": 8, "event_kind": "e", "command_id": "$p-o3", "command_kind": "o-$p",
	"payload": {}, "ordering_key": "key-$p"}]');
CREATE TEMP TABLE lo AS SELECT * FROM outbox.claim('w-$p', 10, NULL, ARRAY['o-$p']);
SELECT count(*) = 1 AS claimed_the_head FROM lo;
SELECT outbox.ack('w-$p', (SELECT token FROM lo));
SELECT count(*) = 1 AS acked_the_next FROM outbox.ack_many('w-$p', ARRAY(SELECT token FROM outbox.claim('w-$p', 10, NULL, ARRAY['o-$p'])));
SELECT outbox.fail('w-$p', (SELECT token FROM outbox.claim('w-$p', 10, NULL, ARRAY['o-$p'])), 'boom', true);
SELECT outbox.skip_head('key-$p') = '$p-o3' AS skipped;
DROP TABLE lo;
SELECT 'phase $p done';
};
}

my $fill = q{
INSERT INTO outbox.events (run_id, seq, kind, command_id)
SELECT 'fill-' || g / 100, g % 100, 'e', 'fill-' || g FROM generate_series(1, 150000) g;
INSERT INTO outbox.commands (command_id, run_id, seq, kind, payload, available_at, due_at)
SELECT 'fill-' || g, 'fill-' || g / 100, g % 100, 'k', '{}', now(), now() FROM generate_series(1, 100000) g;
INSERT INTO outbox.commands (command_id, run_id, seq, kind, payload, available_at, status, version, deliveries,
							 owner, published_at)
SELECT 'fill-' || g, 'fill-' || g / 100, g % 100, 'k', '{}', now(), 'published', 3, 1, 'w', now()
  FROM generate_series(100001, 150000) g;
INSERT INTO outbox.receipts (command_id, outcome, completed_at)
SELECT 'fill-' || g, 'done', now() + interval '1 day' FROM generate_series(100001, 150000) g;
INSERT INTO outbox.inbox (consumer, command_id) SELECT 'consumer', 'fill-' || g FROM generate_series(100001, 150000) g;
-- 200 ordering keys of 100 commands each: the head claimable, the rest waiting
INSERT INTO outbox.events (run_id, seq, kind, command_id)
SELECT 'fillo-' || g / 100, g % 100, 'e', 'fillo-' || g FROM generate_series(0, 19999) g;
INSERT INTO outbox.commands (command_id, run_id, seq, kind, payload, available_at, due_at, ordering_key, ordering_seq)
SELECT 'fillo-' || g, 'fillo-' || g / 100, g % 100, 'o', '{}', now(), CASE WHEN g % 100 = 0 THEN now() END,
	   'fk-' || g / 100, g % 100 + 1
  FROM generate_series(0, 19999) g;
};

my $script = q{
-- The plans of the first phase are made on empty tables that ANALYZE has
-- seen empty (the statistics say 0 rows, as after a drained outbox).
ANALYZE outbox.commands, outbox.events, outbox.receipts, outbox.inbox, outbox.purged;
LOAD 'auto_explain';
SET auto_explain.log_nested_statements = on;
SET auto_explain.log_level = notice;
SET client_min_messages = notice;
SET auto_explain.log_min_duration = -1;
} . calls('empty') . $fill . q{
SET auto_explain.log_min_duration = 0;
} . calls('filled') . q{
ANALYZE;
-- A rebuild gives the lease index a new OID: claim's look for expired
-- leases must find the new index (else it would fall back to the plan with
-- the takeover part, which the plan checks below catch).
REINDEX INDEX CONCURRENTLY outbox.commands_lease_idx;
} . calls('analyzed') . q{
-- purge() turns planner settings off for its own statement only: inside
-- the caller's transaction (where a local setting would still show) they
-- are back as they were.
BEGIN;
SELECT outbox.purge(10, interval '0') >= 0;
SELECT 'settings after purge: ' || current_setting('enable_seqscan') || ' ' || current_setting('enable_sort')
	|| ' ' || current_setting('enable_bitmapscan') || ' ' || current_setting('jit');
COMMIT;
};

my ($rc, $out, $err) = $node->psql('postgres', $script, on_error_stop => 1);
is($rc, 0, 'every call of the three phases ran') or diag($err);
like($out, qr/phase analyzed done/, 'the script ran to its end');
unlike($out, qr/^f$/m, 'each phase claimed its own three commands');
like($out, qr/settings after purge: on on on on/, "purge() leaves the caller's planner settings as they were");

# The plans auto_explain logged, one per statement, in the two phases that
# log: plans made on empty tables ("filled"), plans re-made after ANALYZE.
my ($filled, $analyzed) = split /Query Text: SELECT 'phase filled done'/, $err;
my %phase;
for my $p (['filled', $filled], ['analyzed', $analyzed])
{
	my @plans = split /NOTICE:  duration: /, $p->[1] // '';
	shift @plans;
	$phase{ $p->[0] } = \@plans;
}

my $tables = qr/(?:commands|events|receipts|inbox|purged|policies)/;
for my $name ('filled', 'analyzed')
{
	my @plans = @{ $phase{$name} };
	cmp_ok(scalar(grep { /Query Text: (?:UPDATE|INSERT|DELETE|WITH|SELECT)/ && !/Query Text: SELECT outbox\./ } @plans),
		'>=', 15, "$name: auto_explain logged the plans of the API's nested statements");

	my @bad = grep { /(?:Seq Scan|Bitmap Heap Scan) on $tables\b/ } @plans;
	is(scalar(@bad), 0, "$name: no plan reads a table of the extension with a sequential or bitmap scan")
	  or diag(join("\n----\n", @bad));

	# A statement that names its row by command_id probes the primary key; a
	# plan that reads the lease index and filters on command_id walks every
	# leased row instead.
	my @walk = grep { /Index Scan using commands_lease_idx on commands\b[^\n]*\n(?:\s+Index Cond:[^\n]*\n)?\s+Filter:[^\n]*command_id = / } @plans;
	is(scalar(@walk), 0, "$name: no statement finds a command by walking commands_lease_idx")
	  or diag(join("\n----\n", @walk));

	# No plan reads a whole index of outbox.commands (an index scan without
	# an index condition): with statistics that make the table look tiny,
	# a join of an array argument to the table could read all of it for each
	# element.
	my @full = grep { /Index (?:Only )?Scan(?: Backward)? using commands_\w+ on commands\b[^\n]*\n(?!\s+Index Cond:)/ } @plans;
	is(scalar(@full), 0, "$name: no plan reads a whole index of outbox.commands")
	  or diag(join("\n----\n", @full));

	# The batch ack reads its rows by key (commands_pkey, command_id = ANY);
	# a small batch tests them against the tokens' arrays and joins nothing,
	# a large one joins them to the tokens with a hash join: no nested loop
	# whose rescans read either side again.
	my @ack = grep { /Query Text: UPDATE outbox\.commands t\s+SET status = 'published'/ } @plans;
	my @small = grep { !/ROWS FROM/ } @ack;
	my @large = grep { /ROWS FROM/ } @ack;
	ok(@small >= 1 && @large >= 1, "$name: both forms of the batch ack were logged");
	my @ackbad = grep { !/\n\s+->\s+Index Scan using commands_pkey on commands t[^\n]*\n\s+Index Cond: \(command_id = ANY \(\$2\)\)/ } @ack;
	push @ackbad, grep { /Join|Nested Loop/ } @small;
	push @ackbad, grep { /Nested Loop/ || !/Hash Join/ } @large;
	is(scalar(@ackbad), 0, "$name: the batch ack reads its rows from commands_pkey by the tokens' keys (a small one with no join, a large one by a hash join)")
	  or diag(join("\n----\n", @ackbad));

	# The hot statements read their own index (spot checks of the plans that
	# matter most for throughput).
	# claim without an expired lease (no takeover part), and with one.
	ok((grep { /Update on commands t.*\n\s+CTE pd(?:.*\n)+?\s+->\s+Index Scan using commands_claim_idx(?:.*\n)+?\s+->\s+Tid Scan on commands t/ } @plans),
		"$name: claim reads commands_claim_idx and updates the rows it locked by their ctid (no second key lookup)");
	ok((grep { /Update on commands t.*\n\s+CTE tk(?:.*\n)+?\s+->\s+Index Scan using commands_lease_idx(?:.*\n)+?\s+CTE pd(?:.*\n)+?\s+->\s+Index Scan using commands_claim_idx(?:.*\n)+?\s+->\s+Tid Scan on commands t/ } @plans),
		"$name: a claim that finds an expired lease reads commands_lease_idx, then commands_claim_idx, then its rows by ctid");
	ok((grep { /Query Text: UPDATE outbox.commands\s+SET status = 'published'(?:.*\n)+?.*Index Scan using commands_pkey/ } @plans),
		"$name: ack probes commands_pkey");
	ok((grep { /Index Scan using commands_lease_idx/ } @plans), "$name: takeovers and the sweep read commands_lease_idx");
	ok((grep { /Index Scan using receipts_completed_at_idx/ } @plans), "$name: the purge reads receipts_completed_at_idx");
}

$node->stop;
done_testing();
