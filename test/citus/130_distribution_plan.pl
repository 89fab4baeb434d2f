# The facts docs/citus.md builds on, measured on the cluster, so that the
# page states only what runs.  Nothing here uses outbox.distribute()
# (test/citus/140_distribute.pl does).
#
#  - The extension's tables, as CREATE EXTENSION makes them (a single
#    server's keys), cannot be distributed by run_id: their unique keys
#    lack it (outbox.distribute() swaps the keys first).
#  - The planned shape (every key starting with run_id; scratch tables in
#    schema plan) distributes co-located, policies as a reference table.
#  - The coordinator's own relation of a distributed table holds no rows
#    (a direct index scan of it, as le_any_expired does, finds nothing).
#  - With generic plans (the extension saves every plan generic), Citus
#    refuses multi-shard parameterised SELECTs and the claim's locking
#    subquery, but runs single-table statements with run_id = $n (its fast
#    path); so does a two-step claim of one run.  Custom plans route more,
#    but not row locks over several shards.
#  - A worker node lists its own shards from Citus's metadata.
#  - Directly on a worker's shard, the two-step claim skips exactly the rows
#    another session holds; a function delegated by an anchor key runs it
#    on the node owning that shard, one statement from the coordinator.
#  - A business row and a decision of one run commit on one node with one
#    plain COMMIT (delegated function or coordinator transaction); two runs
#    on two nodes take two-phase commit.
#  - The conservation checks' anti-joins run across the cluster on
#    (run_id, command_id), not on command_id alone.
#  - Distributing an extension table by hand hides the rows a worker's own
#    copy held, breaks the background worker,
#    undistribute_table refuses it, and DROP EXTENSION then leaves its
#    shards behind, which block the next CREATE EXTENSION.
use strict;
use warnings;
use FindBin;
use lib $FindBin::RealBin;
use CitusNodes;
use Test::More;

my $db = citus_database('citus_plan');
safe_psql(0, $db, 'CREATE EXTENSION outbox');

# --- the tables as they are ------------------------------------------------------------------
for my $t (qw(events commands receipts inbox purged))
{
	my (undef, undef, $err) = psql(0, $db,
		"SELECT create_distributed_table('outbox.$t', 'run_id')");
	like($err, qr/cannot create constraint on "$t"/,
		"outbox.$t, keyed as on a single server, cannot be distributed by run_id: a unique key lacks it");
}

# --- the planned shape ------------------------------------------------------------------------
safe_psql(0, $db, q{
	SET citus.shard_count = 8;
	CREATE SCHEMA plan;
	CREATE TABLE plan.events (
		run_id text COLLATE "C" NOT NULL, seq int8 NOT NULL, kind text COLLATE "C" NOT NULL,
		payload jsonb, command_id text COLLATE "C",
		created_at timestamptz NOT NULL DEFAULT now(),
		PRIMARY KEY (run_id, seq));
	CREATE UNIQUE INDEX ON plan.events (run_id, command_id) WHERE command_id IS NOT NULL;
	CREATE TABLE plan.commands (LIKE outbox.commands INCLUDING DEFAULTS) WITH (fillfactor = 80);
	ALTER TABLE plan.commands ADD PRIMARY KEY (run_id, command_id);
	CREATE INDEX ON plan.commands (priority DESC, due_at, created_at) WHERE due_at IS NOT NULL;
	CREATE INDEX ON plan.commands (lease_until) WHERE status = 'sending';
	CREATE TABLE plan.receipts (
		run_id text COLLATE "C" NOT NULL, command_id text COLLATE "C" NOT NULL,
		outcome text NOT NULL, detail jsonb, completed_at timestamptz NOT NULL DEFAULT now(),
		PRIMARY KEY (run_id, command_id));
	CREATE TABLE plan.inbox (
		run_id text COLLATE "C" NOT NULL, consumer text COLLATE "C" NOT NULL,
		command_id text COLLATE "C" NOT NULL, accepted_at timestamptz NOT NULL DEFAULT now(),
		PRIMARY KEY (run_id, consumer, command_id));
	CREATE TABLE plan.purged (LIKE outbox.purged INCLUDING DEFAULTS);
	ALTER TABLE plan.purged ADD PRIMARY KEY (run_id, command_id);
	CREATE TABLE plan.policies (LIKE outbox.policies INCLUDING ALL);
	CREATE TABLE public.orders (run_id text COLLATE "C" PRIMARY KEY, total int);
	SELECT create_distributed_table('plan.events', 'run_id');
	SELECT create_distributed_table('plan.commands', 'run_id', colocate_with => 'plan.events');
	SELECT create_distributed_table('plan.receipts', 'run_id', colocate_with => 'plan.events');
	SELECT create_distributed_table('plan.inbox', 'run_id', colocate_with => 'plan.events');
	SELECT create_distributed_table('plan.purged', 'run_id', colocate_with => 'plan.events');
	SELECT create_reference_table('plan.policies');
	SELECT create_distributed_table('public.orders', 'run_id', colocate_with => 'plan.events');
});
is(safe_psql(0, $db, q{SELECT count(DISTINCT colocationid) || '/' || count(*) FROM pg_dist_partition
	WHERE logicalrelid::text IN ('plan.events', 'plan.commands', 'plan.receipts',
		'plan.inbox', 'plan.purged', 'orders') AND partmethod = 'h'}),
	'1/6', 'keyed by run_id first, the five tables and a business table distribute co-located');
is(safe_psql(0, $db, q{SELECT partmethod FROM pg_dist_partition WHERE logicalrelid = 'plan.policies'::regclass}),
	'n', 'policies becomes a reference table');

# --- statements with generic plans ------------------------------------------------------------
# Each check prepares one statement in a session that forces generic plans,
# as the extension's saved plans are, and executes it.
sub generic
{
	my ($decl, $exec, $mode) = @_;
	$mode //= 'force_generic_plan';
	my ($rc, $out, $err) = psql(0, $db, qq{\\set VERBOSITY terse
		SET plan_cache_mode = $mode;
		PREPARE s$decl;
		$exec});
	return $rc == 0 ? "ok:$out" : $err;
}
safe_psql(0, $db, q{
	INSERT INTO plan.commands (command_id, run_id, seq, kind, available_at, due_at, payload)
	SELECT 'k' || i, 'run-' || (i % 40), i, 'mail', now(), now(), '{}'
	  FROM generate_series(1, 200) i});
is(safe_psql(0, $db, q{SELECT pg_relation_size('plan.commands') || '|' || count(*) FROM plan.commands}),
	'0|200', "the coordinator's own relation of a distributed table is empty: the rows are in the shards");
is(generic(q{(text, text) AS INSERT INTO plan.events (run_id, seq, kind, command_id)
	VALUES ($1, 1, 'placed', $2)}, q{EXECUTE s('run-1', 'k1');}),
	'ok:', 'a parameterised single-row INSERT runs');
like(generic(q{(timestamptz, int) AS SELECT command_id FROM plan.commands
	WHERE due_at <= $1 ORDER BY priority DESC, due_at LIMIT $2}, q{EXECUTE s(now(), 10);}),
	qr/could not create distributed plan/,
	'a multi-shard parameterised SELECT is refused');
like(generic(q{(timestamptz, int) AS SELECT command_id FROM plan.commands
	WHERE due_at <= $1 ORDER BY priority DESC, due_at LIMIT $2 FOR NO KEY UPDATE SKIP LOCKED},
	q{EXECUTE s(now(), 10);}),
	qr/could not create distributed plan/,
	"the claim's locking scan over every shard is refused");
my (undef, undef, $err) = psql(0, $db, q{SELECT command_id FROM plan.commands
	WHERE due_at <= now() ORDER BY priority DESC, due_at LIMIT 10 FOR NO KEY UPDATE SKIP LOCKED});
like($err, qr{could not run distributed query with FOR UPDATE/SHARE commands},
	'even unparameterised, row locks over several shards are refused');
like(generic(q{(int) AS WITH c AS (SELECT run_id, command_id FROM plan.commands
	WHERE due_at <= now() LIMIT $1) UPDATE plan.commands t SET owner = 'x' FROM c
	WHERE t.run_id = c.run_id AND t.command_id = c.command_id}, q{EXECUTE s(10);}),
	qr/could not create distributed plan/,
	'a claim-like CTE over every shard is refused');
like(generic(q{(text, int) AS SELECT array_agg(command_id) FROM (SELECT command_id
	FROM plan.commands WHERE run_id = $1 LIMIT $2 FOR NO KEY UPDATE SKIP LOCKED) s},
	q{EXECUTE s('run-1', 10);}),
	qr/could not create distributed plan/,
	'even with run_id = $1, a statement with a subquery is refused');
is(generic(q{(text, timestamptz, int) AS SELECT count(*) FROM plan.commands
	WHERE run_id = $1 AND due_at <= $2}, q{EXECUTE s('run-1', now(), 10);}),
	'ok:5', 'a single-table SELECT with run_id = $1 runs');

# The two-step claim of one run: lock the run's due commands, then lease
# them by key; both statements single-table with run_id = $1.
my $two_step = generic(q{(text, timestamptz, int) AS SELECT command_id FROM plan.commands
		WHERE run_id = $1 AND due_at <= $2 ORDER BY priority DESC, due_at, created_at
		LIMIT $3 FOR NO KEY UPDATE SKIP LOCKED;
	PREPARE lease (text, text[], text) AS UPDATE plan.commands
		SET status = 'sending', owner = $3, due_at = NULL, version = version + 1,
		    deliveries = deliveries + 1, lease_until = now() + interval '1 minute'
		WHERE run_id = $1 AND command_id = ANY ($2) RETURNING command_id, version},
	q{BEGIN;
	EXECUTE s('run-7', now(), 10);
	EXECUTE lease('run-7', '{k7,k47,k87,k127,k167}', 'pub');
	COMMIT;});
my @claimed = sort map { s/^ok://r } split /\n/, $two_step;
is(join(',', @claimed), 'k127,k127|2,k167,k167|2,k47,k47|2,k7,k7|2,k87,k87|2',
	'the two-step claim of one run locks and leases its 5 commands with generic plans')
  or diag($two_step);

like(generic(q{(text, text[]) AS UPDATE plan.commands SET owner = 'x'
	WHERE run_id = $1 AND command_id = ANY ($2) RETURNING command_id || '/' || version},
	q{EXECUTE s('run-8', '{k8}');}),
	qr/could not create distributed plan/,
	'but not with a RETURNING expression that calls a stable function (text || int8) on its columns');

# Custom plans (values in place of the parameters) route the statement
# with a subquery, but still refuse row locks over several shards.
is(generic(q{(text, int) AS SELECT count(*) FROM (SELECT command_id
	FROM plan.commands WHERE run_id = $1 LIMIT $2 FOR NO KEY UPDATE SKIP LOCKED) s},
	q{EXECUTE s('run-2', 10);}, 'force_custom_plan'),
	'ok:5', 'with custom plans, the statement with a subquery and run_id = $1 runs');
like(generic(q{(timestamptz, int) AS SELECT command_id FROM plan.commands
	WHERE due_at <= $1 ORDER BY priority DESC, due_at LIMIT $2 FOR NO KEY UPDATE SKIP LOCKED},
	q{EXECUTE s(now(), 10);}, 'force_custom_plan'),
	qr{could not run distributed query with FOR UPDATE/SHARE commands},
	"with custom plans, the claim's locking scan over every shard is still refused");

# --- one shard at a time -----------------------------------------------------------------------
my $shardid = safe_psql(0, $db, q{
	SELECT get_shard_id_for_distribution_column('plan.commands', run_id) FROM plan.commands
	 WHERE due_at IS NOT NULL GROUP BY 1 ORDER BY count(*) DESC, 1 LIMIT 1});
# where a shard is: its name and its node's port
my $where = q{SELECT shard_name('plan.commands'::regclass, p.shardid) || '|' || n.nodeport
	FROM pg_dist_placement p JOIN pg_dist_node n USING (groupid) WHERE p.shardid = %s};
my ($shard, $port) = split /\|/, safe_psql(0, $db, sprintf($where, $shardid));
my $owner = node_of_port($port);
my $due = safe_psql($owner, $db, "SELECT count(*) FROM $shard WHERE due_at IS NOT NULL");
cmp_ok($due, '>', 5, "the shard $shard has more than 5 due commands on " . node_name($owner));
my $pick = qq{PREPARE pick (int) AS SELECT string_agg(command_id, ',' ORDER BY command_id)
	FROM (SELECT command_id FROM $shard WHERE due_at <= now()
		   ORDER BY priority DESC, due_at, created_at LIMIT \$1 FOR NO KEY UPDATE SKIP LOCKED) s;};
my $a = session($owner, $db);
session_query($a, "SET plan_cache_mode = force_generic_plan; $pick BEGIN;");
my @held = split /,/, session_query($a, 'EXECUTE pick(5);');
my @rest = split /,/, safe_psql($owner, $db,
	"SET plan_cache_mode = force_generic_plan; $pick EXECUTE pick(1000);");
my %held = map { $_ => 1 } @held;
is(scalar(@held), 5, 'on the shard, a session locks 5 due commands');
is(scalar(@rest), $due - 5, 'another session gets all the others');
is(scalar(grep { $held{$_} } @rest), 0, '... and none of those the first holds');
session_query($a, 'COMMIT;');
session_end($a);

# A worker node finds its own shards in Citus's metadata (synced to it).
my @ports = split ' ', $ENV{CITUS_PORTS};
for my $node (1, 2)
{
	my $local = safe_psql($node, $db, q{
		SELECT string_agg(shard_name('plan.commands'::regclass, s.shardid), ',' ORDER BY s.shardid)
		  FROM pg_dist_shard s JOIN pg_dist_placement p USING (shardid)
		 WHERE s.logicalrelid = 'plan.commands'::regclass
		   AND p.groupid = (SELECT groupid FROM pg_dist_local_group)});
	my $placed = safe_psql(0, $db, qq{
		SELECT string_agg(shard_name('plan.commands'::regclass, s.shardid), ',' ORDER BY s.shardid)
		  FROM pg_dist_shard s JOIN pg_dist_placement p USING (shardid)
		  JOIN pg_dist_node n USING (groupid)
		 WHERE s.logicalrelid = 'plan.commands'::regclass AND n.nodeport = $ports[$node]});
	ok($local ne '' && $local eq $placed,
		node_name($node) . ' lists its own shards of commands from the metadata, as the coordinator places them');
}

# From the coordinator: a function delegated by an anchor key (any run_id
# whose hash falls in the shard) runs the claim on the node owning the shard.
safe_psql(0, $db, q{
	CREATE FUNCTION plan.claim_shard(anchor text, owner text, n int)
	RETURNS SETOF text LANGUAGE plpgsql AS $f$
	DECLARE
		shard text := shard_name('plan.commands'::regclass,
			get_shard_id_for_distribution_column('plan.commands', anchor));
	BEGIN
		RETURN QUERY EXECUTE format(
			'WITH pick AS (SELECT ctid FROM %s WHERE due_at <= now()
			   ORDER BY priority DESC, due_at, created_at LIMIT $2 FOR NO KEY UPDATE SKIP LOCKED)
			 UPDATE %s t SET status = ''sending'', owner = $1, due_at = NULL,
				version = t.version + 1, deliveries = t.deliveries + 1,
				lease_until = now() + interval ''1 minute''
			  WHERE t.ctid = ANY (ARRAY(SELECT ctid FROM pick))
			 RETURNING t.run_id::text', shard, shard) USING owner, n;
	END $f$;
	SELECT create_distributed_function('plan.claim_shard(text, text, int)', 'anchor',
		colocate_with => 'plan.commands');});
my $anchor = safe_psql(0, $db, qq{SELECT 'anchor-' || i FROM generate_series(1, 1000) i
	WHERE shard_name('plan.commands'::regclass,
		get_shard_id_for_distribution_column('plan.commands', 'anchor-' || i)) = '$shard'
	LIMIT 1});
my ($rc, $out);
($rc, $out, $err) = psql(0, $db, "SET citus.log_remote_commands = on;
	SELECT plan.claim_shard('$anchor', 'pub', 3);");
my @runs = split /\n/, $out;
is(scalar(@runs), 3, 'the delegated claim leases 3 commands');
my @wrong = grep { safe_psql(0, $db, "SELECT shard_name('plan.commands'::regclass,
	get_shard_id_for_distribution_column('plan.commands', '$_'))") ne $shard } @runs;
is(scalar(@wrong), 0, '... all of them from that shard');
my @sent = ($err =~ /issuing (.*)\n\s*DETAIL:\s+on server \S+:(\d+)/g);
is(scalar(@sent) . ':' . ($sent[1] // ''), "2:$port",
	'... sent as one statement to the node owning the shard');

# --- a business row and its decision ------------------------------------------------------------
safe_psql(0, $db, q{
	CREATE FUNCTION plan.place_order(run text, total int) RETURNS void LANGUAGE sql AS $f$
		INSERT INTO public.orders VALUES (run, total);
		INSERT INTO plan.events (run_id, seq, kind, command_id) VALUES (run, 1, 'placed', run || '-ship');
		INSERT INTO plan.commands (command_id, run_id, seq, kind, available_at, due_at, payload)
		VALUES (run || '-ship', run, 1, 'ship', now(), now(), '{}');
	$f$;
	SELECT create_distributed_function('plan.place_order(text, int)', 'run',
		colocate_with => 'plan.events');});
($rc, $out, $err) = psql(0, $db, q{SET citus.log_remote_commands = on;
	SELECT plan.place_order('fn-1', 10);});
my @issued = ($err =~ /issuing ([A-Z]+[^\n]*)/g);
is(scalar(@issued) . ':' . ($issued[0] =~ /^SELECT plan\.place_order/ ? 'call' : $issued[0]),
	'1:call', 'a distributed function writes the order and the decision on its node in one call');
is(safe_psql(0, $db, q{SELECT (SELECT count(*) FROM orders WHERE run_id = 'fn-1') || '|' ||
	(SELECT count(*) FROM plan.events WHERE run_id = 'fn-1') || '|' ||
	(SELECT count(*) FROM plan.commands WHERE run_id = 'fn-1')}), '1|1|1',
	'... and they are committed there');
($rc, $out, $err) = psql(0, $db, q{SET citus.log_remote_commands = on;
	BEGIN;
	INSERT INTO public.orders VALUES ('tx-1', 10);
	INSERT INTO plan.events (run_id, seq, kind, command_id) VALUES ('tx-1', 1, 'placed', 'tx-1-ship');
	INSERT INTO plan.commands (command_id, run_id, seq, kind, available_at, due_at, payload)
	VALUES ('tx-1-ship', 'tx-1', 1, 'ship', now(), now(), '{}');
	COMMIT;});
is($rc, 0, 'a coordinator transaction writes the order and the decision of one run');
my %nodes = map { $_ => 1 } ($err =~ /DETAIL:\s+on server \S+:(\d+)/g);
is(scalar(keys %nodes), 1, '... on one node');
like($err, qr/issuing COMMIT\b/, '... committed with one plain COMMIT');
unlike($err, qr/PREPARE TRANSACTION/, '... without two-phase commit');
my @two = split /\n/, safe_psql(0, $db, q{
	SELECT r FROM (SELECT 'tx2-' || i AS r FROM generate_series(1, 100) i) x
	 ORDER BY (SELECT n.nodeport FROM pg_dist_placement p JOIN pg_dist_node n USING (groupid)
			    WHERE p.shardid = get_shard_id_for_distribution_column('orders', r)), r});
($rc, $out, $err) = psql(0, $db, qq{SET citus.log_remote_commands = on;
	BEGIN;
	INSERT INTO public.orders VALUES ('$two[0]', 1), ('$two[-1]', 1);
	COMMIT;});
is(scalar(() = $err =~ /issuing PREPARE TRANSACTION/g), 2,
	'two runs on two nodes in one transaction take two-phase commit');

# --- joins of the conservation checks ----------------------------------------------------------
# one event that names a command that does not exist
safe_psql(0, $db, q{INSERT INTO plan.events (run_id, seq, kind, command_id)
	VALUES ('run-3', 9, 'placed', 'missing')});
(undef, undef, $err) = psql(0, $db, q{SELECT count(*) FROM plan.events e
	WHERE e.command_id IS NOT NULL
	  AND NOT EXISTS (SELECT 1 FROM plan.commands c WHERE c.command_id = e.command_id)});
like($err, qr/complex joins are only supported when all distributed tables are co-located and joined on their distribution columns/,
	'an anti-join of events and commands on command_id alone is refused');
is(safe_psql(0, $db, q{SELECT count(*) FROM plan.events e
	WHERE e.command_id IS NOT NULL
	  AND NOT EXISTS (SELECT 1 FROM plan.commands c
					   WHERE c.run_id = e.run_id AND c.command_id = e.command_id)}),
	'1', 'on (run_id, command_id) it runs across the cluster (the one event without a command)');

# --- an extension table distributed by hand ------------------------------------------------------
my $hand = citus_database('citus_by_hand');
safe_psql(0, $hand, 'CREATE EXTENSION outbox');
# a row in worker1's own copy of receipts, written there before
safe_psql(1, $hand, q{INSERT INTO outbox.receipts (command_id, outcome, run_id) VALUES ('local-1', 'done', 'run-l')});
safe_psql(0, $hand, q{SET citus.shard_count = 4;
	SELECT create_distributed_table('outbox.receipts', 'command_id');
	SELECT create_reference_table('outbox.policies');});
is(safe_psql(1, $hand, q{SELECT count(*) || '|' || (pg_relation_size('outbox.receipts') > 0)
	FROM outbox.receipts}), '0|true',
	"distributed, receipts on worker1 reads the shards: the row of worker1's own copy is hidden, not moved");
for my $node (@NODES)
{
	# (with custom plans, src/citus.c, Citus's refusals vary by statement:
	# the sweep's locks, a stable function in its CASE, a plan)
	ok(poll_until($node, $hand, q{SELECT last_error ~ '(could not create distributed plan|FOR UPDATE/SHARE|non-IMMUTABLE functions)'
		FROM outbox.workers WHERE database = current_database()}, 't'),
		node_name($node) . "'s outbox worker then fails its rounds");
}
(undef, undef, $err) = psql(0, $hand, q{SELECT undistribute_table('outbox.receipts')});
like($err, qr/cannot alter table because an extension depends on it/,
	'undistribute_table refuses an extension table');
safe_psql(0, $hand, 'DROP EXTENSION outbox');
my $shards = q{SET citus.override_table_visibility TO off;
	SELECT count(*) FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
	 WHERE n.nspname = 'outbox' AND c.relkind = 'r'};
my @left = on_all($hand, $shards);
cmp_ok($left[$_], '>', 0, 'DROP EXTENSION leaves shards behind on ' . node_name($_))
  for (1, 2);
(undef, undef, $err) = psql(0, $hand, 'CREATE EXTENSION outbox');
like($err, qr/schema "outbox" holds objects that are not part of the extension/,
	'and they block the next CREATE EXTENSION');
# Leave nothing: drop the leftover shards on every node.
for my $node (@NODES)
{
	safe_psql($node, $hand, q{SET citus.override_table_visibility TO off;
		DO $$DECLARE r record; BEGIN
			FOR r IN SELECT c.oid::regclass AS t FROM pg_class c
			  JOIN pg_namespace n ON n.oid = c.relnamespace
			 WHERE n.nspname = 'outbox' AND c.relkind = 'r'
			LOOP EXECUTE format('DROP TABLE %s', r.t); END LOOP; END$$;});
}
is(join(',', on_all($hand, $shards)), '0,0,0', 'the leftovers dropped by hand');

done_testing();
