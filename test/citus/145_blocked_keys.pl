# outbox.blocked_keys on a distributed outbox (docs/citus.md): keys whose
# commands sit on several shards, on both worker nodes, read from the
# coordinator, from each worker and by a pg_monitor login give the rows
# the same commands give on one server; a paused kind is seen through the
# reference table.  distribute() refuses an outbox holding unpublished
# commands with an ordering key (55000), whose release could not run on
# the shards.
use strict;
use warnings;
use FindBin;
use lib $FindBin::RealBin;
use CitusNodes;
use Test::More;

my $db = citus_database('citus_blocked');

# The SQLSTATE of a statement that must fail (psql's VERBOSITY verbose).
sub sqlstate
{
	my ($node, $d, $sql) = @_;
	my ($rc, $out, $err) = psql($node, $d, "\\set VERBOSITY verbose\n$sql");
	return $rc == 0 ? 'succeeded' : ($err =~ /ERROR:\s+([0-9A-Z]{5})/ ? $1 : $err);
}

my $rows = q{SELECT ordering_key || '|' || head_command_id || '|' || head_run_id || '|' || head_status
	|| '|' || since || '|' || waiting || '|' || decided_by || '|' || head_claimable
	  FROM outbox.blocked_keys ORDER BY ordering_key, decided_by};

# --- keys blocked on one server -----------------------------------------------------------
# Six keys of four commands each, every command in a run of its own (so a
# key's commands fall on several shards once distributed): K1's second
# command in a retry's backoff, K2's leased, K3's third due (its first two
# published), K4 to K6 leased at their first, K7 with a dead head.
# Leases and backoffs of an hour: nothing changes while the test reads.
safe_psql(0, $db, 'CREATE EXTENSION outbox');
safe_psql(0, $db, q{
	SELECT outbox.set_policy('ship', lease => '1 hour', backoff_base => '1 hour', backoff_max => '1 hour');
	DO $$ BEGIN
	FOR k IN 1..7 LOOP FOR i IN 1..4 LOOP
		PERFORM outbox.commit_decision('r-' || k || '-' || i, 1, 'e', 'c-' || k || '-' || i, 'ship', '{}',
									   ordering_key => 'K' || k);
	END LOOP; END LOOP;
	END $$;
	CREATE TEMP TABLE t AS SELECT * FROM outbox.claim('w', 100);
	SELECT count(outbox.ack('w', token)) FROM t WHERE command_id IN ('c-1-1', 'c-2-1', 'c-3-1');
	SELECT count(outbox.fail('w', token, 'bad', fatal => true)) FROM t WHERE command_id = 'c-7-1';
	DROP TABLE t;
	CREATE TEMP TABLE t AS SELECT * FROM outbox.claim('w', 100);
	SELECT count(outbox.fail('w', token, 'broker down')) FROM t WHERE command_id = 'c-1-2';
	SELECT count(outbox.ack('w', token)) FROM t WHERE command_id = 'c-3-2';});
my $single = safe_psql(0, $db, $rows);
is(scalar(() = $single =~ /^K/mg), 7, 'one server: seven keys blocked');
like($single, qr/^K1\|c-1-2\|r-1-2\|pending\|.*\|2\|postgres\|false$/m, '... K1 behind a head in backoff');
like($single, qr/^K3\|c-3-3\|r-3-3\|pending\|.*\|1\|postgres\|true$/m, '... K3 behind a claimable head');
like($single, qr/^K7\|c-7-1\|r-7-1\|dead\|.*\|3\|postgres\|false$/m, '... K7 behind a dead head');

# distribute() refuses while they are unpublished, and changes nothing.
is(sqlstate(0, $db, 'SELECT outbox.distribute()'), '55000',
	'distribute() with unpublished commands of an ordering key: 55000');
like((psql(0, $db, 'SELECT outbox.distribute()'))[2], qr/ordering key that are not published/,
	'... saying why');
is(safe_psql(0, $db, 'SELECT outbox._distributed()'), 'f', '... and nothing is distributed');
is(safe_psql(0, $db, $rows), $single, '... blocked_keys unchanged');

# --- the same rows on the distributed outbox ------------------------------------------------
# The commands and their events, as the API wrote them, taken out, the
# outbox distributed, and the rows put back through Citus (each to its
# run's shard): the state a cluster would reach if the release ran there.
my %saved;
for my $t (qw(events commands))
{
	$saved{$t} = safe_psql(0, $db, "COPY outbox.$t TO STDOUT");
}
safe_psql(0, $db, 'DELETE FROM outbox.commands; DELETE FROM outbox.events');
safe_psql(0, $db, 'SET citus.shard_count = 8; SELECT outbox.distribute()');
for my $t (qw(events commands))
{
	safe_psql(0, $db, "COPY outbox.$t FROM STDIN;\n$saved{$t}\n\\.\n");
}
is(safe_psql(0, $db, 'SELECT count(*) FROM outbox.commands'), '28', 'the 28 commands are in the shards');

# The heads and the keys' commands are on several shards, on both workers.
is(safe_psql(0, $db, q{
	SELECT count(DISTINCT get_shard_id_for_distribution_column('outbox.commands', c.run_id)) > 1
	   AND count(DISTINCT p.groupid) = 2
	  FROM outbox.blocked_keys b JOIN outbox.commands c ON c.run_id = b.head_run_id
	  JOIN pg_dist_placement p
		ON p.shardid = get_shard_id_for_distribution_column('outbox.commands', c.run_id)}),
	't', 'the heads are on several shards of both worker nodes');
is(safe_psql(0, $db, q{
	SELECT bool_and(n > 1) FROM (
		SELECT count(DISTINCT get_shard_id_for_distribution_column('outbox.commands', run_id)) AS n
		  FROM outbox.commands GROUP BY ordering_key) k}),
	't', 'each key\'s commands are on more than one shard');

for my $node (@NODES)
{
	is(safe_psql($node, $db, $rows), $single,
		'distributed, read on ' . node_name($node) . ': the rows of one server');
}

# A pg_monitor login reads it (the view's function runs as its owner).
safe_psql(0, $db, q{CREATE ROLE bk_monitor LOGIN IN ROLE pg_monitor});
is(safe_psql(0, $db, "SET ROLE bk_monitor;\n$rows"), $single, 'a pg_monitor login reads the same rows');
like((psql(0, $db, "CREATE ROLE bk_nobody LOGIN; SET ROLE bk_nobody; SELECT count(*) FROM outbox.blocked_keys"))[2],
	qr/permission denied/, 'a role without the right is refused');

# A paused kind (the reference table policies): no head is claimable.
safe_psql(0, $db, q{SELECT outbox.pause('ship')});
is(safe_psql(1, $db, q{SELECT string_agg(ordering_key, ',' ORDER BY ordering_key) FROM outbox.blocked_keys
	WHERE head_claimable}), '', 'ship paused: no head claimable (read on worker1)');
safe_psql(0, $db, q{SELECT outbox.resume('ship')});
is(safe_psql(2, $db, q{SELECT string_agg(ordering_key, ',' ORDER BY ordering_key) FROM outbox.blocked_keys
	WHERE head_claimable}), 'K3', 'resumed: K3\'s head is claimable again (read on worker2)');

# --- clean up ---------------------------------------------------------------------------
my ($rc, $out, $err) = psql_ddl(0, $db, 'DROP EXTENSION outbox');
is($rc, 0, 'DROP EXTENSION outbox') or diag($err);
safe_psql(0, $db, 'DROP ROLE bk_monitor; DROP ROLE bk_nobody');

done_testing();
