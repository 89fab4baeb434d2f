# With Citus loaded and the outbox's tables not distributed (as CREATE
# EXTENSION leaves them), each node's own outbox works as on a single
# server: on the coordinator and on a worker, a decision is committed,
# claimed, acked, completed and accepted once, verify() is silent, and each
# node's outbox worker runs its rounds without an error.  On the coordinator
# a transaction that writes a business row into a distributed table and
# commits a decision into the local outbox is all or nothing when it ends
# normally (ROLLBACK leaves nothing on any node), but Citus commits it in
# one phase (the worker's COMMIT first, then the coordinator's own), not
# with two-phase commit: docs/citus.md says why the outbox must be
# co-located with the business rows instead.
use strict;
use warnings;
use FindBin;
use lib $FindBin::RealBin;
use CitusNodes;
use Test::More;

my $db = citus_database('citus_local');
safe_psql(0, $db, 'CREATE EXTENSION outbox');

# --- the API on each node's local tables --------------------------------------------------
for my $node (0, 1)
{
	my $n = node_name($node);
	my $c = "$n-c1";
	# the counters are the node's (every database's): compare with before
	my $stats = 'SELECT enqueued, claimed, acked FROM outbox.stats';
	my @before = split /\|/, safe_psql($node, $db, $stats);
	safe_psql($node, $db,
		qq{SELECT outbox.commit_decision('$n-run', 1, 'placed', '$c', 'mail', '{"n": 1}')});
	my $tok = safe_psql($node, $db,
		q{SELECT token FROM outbox.claim('pub', 10, interval '1 minute')});
	is(safe_psql($node, $db,
		q{SELECT string_agg(command_id || '/' || version, ',') FROM outbox.commands WHERE status = 'sending'}),
		"$c/2", "$n: claim leases the decision's command");
	my ($rc, undef, $err) = psql($node, $db, qq{SELECT outbox.ack('other', \$t\$$tok\$t\$)});
	like($err, qr/ERROR:  lease_not_owned/, "$n: an ack by another publisher is refused");
	safe_psql($node, $db, qq{SELECT outbox.ack('pub', \$t\$$tok\$t\$)});
	is(safe_psql($node, $db, qq{SELECT status FROM outbox.commands WHERE command_id = '$c'}),
		'published', "$n: ack publishes it");
	is(safe_psql($node, $db, qq{SELECT outbox.complete('$n-run', '$c'), outbox.complete('$n-run', '$c')}),
		't|f', "$n: complete records one receipt");
	safe_psql($node, $db, q{SELECT outbox.register_consumer('shop', outbox.role('consumer')::regrole)});
	is(safe_psql($node, $db,
		qq{SELECT outbox.inbox_accept('shop', '$n-run', '$c'), outbox.inbox_accept('shop', '$n-run', '$c')}),
		't|f', "$n: inbox_accept accepts once");
	($rc, undef, $err) = psql($node, $db, 'SELECT outbox.verify(true)');
	is($rc . $err, '0', "$n: verify() is silent");
	my @after = split /\|/, safe_psql($node, $db, $stats);
	is(join('|', map { $after[$_] - $before[$_] } 0 .. 2),
		'1|1|1', "$n: the counters saw one decision, claim and ack");
}
is(safe_psql(2, $db, 'SELECT count(*) FROM outbox.commands'), '0',
	"worker2's outbox is its own: it holds nothing");

for my $node (@NODES)
{
	my $rounds = safe_psql($node, $db,
		'SELECT rounds FROM outbox.workers WHERE database = current_database()');
	ok(poll_until($node, $db, qq{SELECT rounds > $rounds + 2 AND last_error IS NULL
		FROM outbox.workers WHERE database = current_database()}, 't'),
		node_name($node) . "'s outbox worker runs its rounds without an error");
}

# --- a business row on a worker, the decision on the coordinator --------------------------
safe_psql(0, $db, q{CREATE TABLE orders (run_id text PRIMARY KEY, total int);
	SELECT create_distributed_table('orders', 'run_id')});
my $both = q{SELECT (SELECT count(*) FROM orders WHERE run_id = 'o-1') || '|' ||
	(SELECT count(*) FROM outbox.commands WHERE run_id = 'o-1')};
my $txn = q{BEGIN;
	INSERT INTO orders VALUES ('o-1', 10);
	SELECT outbox.commit_decision('o-1', 1, 'placed', 'o-1-ship', 'ship', '{}');
	%s;};
safe_psql(0, $db, sprintf($txn, 'ROLLBACK'));
is(safe_psql(0, $db, $both), '0|0', 'rolled back: neither the order nor the command');
is(join(',', map { safe_psql($_, $db, q{SELECT count(*) FROM outbox.commands WHERE run_id = 'o-1'}) } 1, 2),
	'0,0', 'rolled back: no command on any worker');
my ($rc, undef, $err) = psql(0, $db,
	"SET citus.log_remote_commands = on;\n" . sprintf($txn, 'COMMIT'));
is($rc, 0, 'business row and decision commit together') or diag($err);
is(safe_psql(0, $db, $both), '1|1', 'committed: the order and the command');
like($err, qr/issuing COMMIT\b/, 'the worker holding the order commits with a plain COMMIT');
unlike($err, qr/PREPARE TRANSACTION/,
	'no two-phase commit: the outbox on the coordinator is not a participant');

done_testing();
