# The outbox distributed on a real Citus cluster (docs/citus.md):
# outbox.distribute() and its refusals; business row + decision, 200 runs,
# through a distributed function (one statement to one node, committed
# there) and from the coordinator (one node, one-phase commit), rollbacks
# leaving nothing on any node; two outbox-relays draining through the
# worker nodes (each claims from the shards it holds), the leases of a
# publisher that died mid-batch taken over on every shard, a shard group
# moved (citus_move_shard_placement) in the middle of the drain; verify()
# from the coordinator over the whole cluster, clean, and catching a
# violation on a worker; undistribute() and DROP EXTENSION leaving every
# node as it was.
use strict;
use warnings;
use FindBin;
use lib $FindBin::RealBin;
use CitusNodes;
use IPC::Run ();
use Test::More;
use Time::HiRes ();

my $db = citus_database('citus_distribute');
my @ports = split ' ', $ENV{CITUS_PORTS};

# Each node's relations, types and functions outside the system schemas,
# shards included (as in 110_install.pl).
my $catalog = q{
	SET citus.override_table_visibility TO off;
	SELECT string_agg(o, ' ' ORDER BY o) FROM (
		SELECT 'rel:' || n.nspname || '.' || c.relname AS o
		  FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
		 WHERE n.nspname NOT IN ('pg_catalog', 'information_schema', 'pg_toast')
		UNION ALL
		SELECT 'type:' || n.nspname || '.' || t.typname
		  FROM pg_type t JOIN pg_namespace n ON n.oid = t.typnamespace
		 WHERE n.nspname NOT IN ('pg_catalog', 'information_schema', 'pg_toast')
		UNION ALL
		SELECT 'proc:' || n.nspname || '.' || p.proname
		  FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
		 WHERE n.nspname NOT IN ('pg_catalog', 'information_schema')
	) objects};
my @before = on_all($db, $catalog);

# The SQLSTATE of a statement that must fail (psql's VERBOSITY verbose).
sub sqlstate
{
	my ($node, $d, $sql) = @_;
	my ($rc, $out, $err) = psql($node, $d, "\\set VERBOSITY verbose\n$sql");
	return $rc == 0 ? 'succeeded' : ($err =~ /ERROR:\s+([0-9A-Z]{5})/ ? $1 : $err);
}

# --- refusals ------------------------------------------------------------------------------
# Without Citus: a database of the coordinator with the outbox only.
safe_psql(0, 'postgres', 'CREATE DATABASE citus_none');
safe_psql(0, 'citus_none', 'CREATE EXTENSION outbox');
is(sqlstate(0, 'citus_none', 'SELECT outbox.distribute()'), '55000',
	'distribute() without Citus: 55000');
like((psql(0, 'citus_none', 'SELECT outbox.distribute()'))[2], qr/needs Citus/,
	'... saying that it needs Citus');
safe_psql(0, 'postgres', 'DROP DATABASE citus_none');

safe_psql(0, $db, 'CREATE EXTENSION outbox');
is(sqlstate(1, $db, 'SELECT outbox.distribute()'), '55000',
	'distribute() on a worker: 55000');
like((psql(1, $db, 'SELECT outbox.distribute()'))[2], qr/coordinator only/,
	'... saying that it runs on the coordinator only');
is(sqlstate(0, $db, 'SELECT outbox.undistribute()'), '55000',
	'undistribute() of an outbox that is not distributed: 55000');
is(sqlstate(0, $db, q{SELECT outbox.distribute(colocate_with => 'no_such_table')}), '22023',
	'distribute() with a colocate_with that names no table: 22023');

# A worker's own outbox with a row: refused, nothing changed.
safe_psql(1, $db, q{SELECT outbox.set_policy('local-kind', max_deliveries => 3)});
is(sqlstate(0, $db, 'SELECT outbox.distribute()'), '55000',
	'distribute() while a worker\'s own outbox holds rows: 55000');
is(safe_psql(0, $db, 'SELECT outbox._distributed()'), 'f', '... and nothing is distributed');
safe_psql(1, $db, q{DELETE FROM outbox.policies});

# --- distribute ----------------------------------------------------------------------------
safe_psql(0, $db, q{SELECT outbox.set_policy('ship', max_deliveries => 5)});
safe_psql(0, $db, 'SET citus.shard_count = 8; SELECT outbox.distribute()');
is(safe_psql(0, $db, q{
	SELECT string_agg(logicalrelid::text || ':' || partmethod::text || ':'
		|| CASE WHEN partmethod = 'h' THEN column_to_column_name(logicalrelid, partkey) ELSE '-' END,
		' ' ORDER BY logicalrelid::text)
	  FROM pg_dist_partition WHERE logicalrelid::text LIKE 'outbox.%'}),
	'outbox.commands:h:run_id outbox.consumers:n:- outbox.events:h:run_id outbox.inbox:h:run_id '
	  . 'outbox.lease_key:n:- outbox.policies:n:- outbox.purged:h:run_id outbox.receipts:h:run_id',
	'events, commands, receipts, inbox, purged by run_id; policies, consumers, lease_key reference tables');
is(safe_psql(0, $db, q{
	SELECT count(DISTINCT colocationid) FROM pg_dist_partition
	 WHERE logicalrelid::text LIKE 'outbox.%' AND partmethod = 'h'}),
	'1', 'the five distributed tables are co-located');
is(safe_psql(0, $db, q{SELECT kind || ':' || max_deliveries FROM outbox.policies}), 'ship:5',
	'the coordinator\'s policy is in the reference table');
# every node's copies have the keys of a distributed outbox
for my $node (@NODES)
{
	is(safe_psql($node, $db, q{
		SELECT string_agg(indexrelid::regclass::text || '(' || pg_get_indexdef(indexrelid, 1, true)
			|| ',' || pg_get_indexdef(indexrelid, 2, true) || ')', ' ' ORDER BY indexrelid::regclass::text)
		  FROM pg_index
		 WHERE indexrelid IN ('outbox.commands_pkey'::regclass, 'outbox.receipts_pkey'::regclass,
							  'outbox.purged_pkey'::regclass, 'outbox.events_command_id_key'::regclass)}),
		'outbox.commands_pkey(run_id,command_id) outbox.events_command_id_key(run_id,command_id) '
		  . 'outbox.purged_pkey(run_id,command_id) outbox.receipts_pkey(run_id,command_id)',
		node_name($node) . '\'s copies are keyed by (run_id, command_id)');
}
is(sqlstate(0, $db, 'SELECT outbox.distribute()'), '55000', 'distribute() twice: 55000');
like((psql(0, $db, 'SELECT outbox.distribute()'))[2], qr/distributed already/, '... distributed already');

# Where each server log ends now: the Citus planning errors looked for
# below are those after this point (other files, and the refusals above,
# write errors of their own).
my %log_at = map { $_ => -s "$ENV{CITUS_DATA}/" . node_name($_) . '/server.log' } @NODES;
sub log_since
{
	my ($node, $re) = @_;
	my $file = "$ENV{CITUS_DATA}/" . node_name($node) . '/server.log';
	open(my $fh, '<', $file) or die "$file: $!";
	seek($fh, $log_at{$node}, 0);
	my @hits = grep { $_ =~ $re } <$fh>;
	close $fh;
	return @hits;
}

# --- business row + decision ---------------------------------------------------------------
safe_psql(0, $db, q{
	CREATE TABLE public.orders (run_id text COLLATE "C" PRIMARY KEY, total int NOT NULL);
	SELECT create_distributed_table('public.orders', 'run_id', colocate_with => 'outbox.events');
	CREATE FUNCTION public.place_order(run text, total int) RETURNS boolean LANGUAGE plpgsql AS $f$
	BEGIN
		INSERT INTO public.orders VALUES (run, total);
		RETURN outbox.commit_decision(run, 1, 'placed', 'ship-' || run, 'ship',
									  jsonb_build_object('total', total));
	END $f$;
	SELECT create_distributed_function('public.place_order(text, int)', 'run',
									   colocate_with => 'outbox.events');});

# 100 runs through the distributed function, each one statement to one node.
my ($rc, $out, $err) = psql(0, $db, "SET citus.log_remote_commands = on;\n"
	  . join('', map { "SELECT public.place_order('fn-$_', $_);\n" } 1 .. 100));
is($rc, 0, '100 orders placed through the distributed function') or diag($err);
my @sent = ($err =~ /issuing SELECT public\.place_order/g);
is(scalar(@sent), 100, 'each call is sent to a worker as one statement');
unlike($err, qr/PREPARE TRANSACTION/, 'none is committed with two-phase commit');
is($out, join("\n", ('t') x 100), 'each decision is recorded');

# 100 runs from the coordinator, in transactions that write the business row.
($rc, $out, $err) = psql(0, $db, "SET citus.log_remote_commands = on;\n"
	  . join('', map {
		  "BEGIN;\nINSERT INTO public.orders VALUES ('co-$_', $_);\n"
			. "SELECT outbox.commit_decision('co-$_', 1, 'placed', 'ship-co-$_', 'ship', '{\"total\": $_}');\nCOMMIT;\n"
	  } 1 .. 100));
is($rc, 0, '100 orders placed from the coordinator') or diag($err);
unlike($err, qr/PREPARE TRANSACTION/,
	'the coordinator\'s transactions commit on one node, in one phase');
my @commits = ($err =~ /issuing COMMIT\b/g);
is(scalar(@commits), 100, 'one COMMIT to one node per transaction');

# Rollbacks: through the function and from the coordinator.
safe_psql(0, $db, join('', map {
	"BEGIN;\nSELECT public.place_order('rb-fn-$_', $_);\nROLLBACK;\n"
	  . "BEGIN;\nINSERT INTO public.orders VALUES ('rb-co-$_', $_);\n"
	  . "SELECT outbox.commit_decision('rb-co-$_', 1, 'placed', 'ship-rb-co-$_', 'ship', '{}');\nROLLBACK;\n"
} 1 .. 10));
for my $node (1, 2)
{
	# the shards themselves, on the node that holds them
	is(safe_psql($node, $db, q{
		SET citus.override_table_visibility TO off;
		SELECT coalesce(sum(n), 0) FROM (
			SELECT (xpath('/row/n/text()', query_to_xml(format(
				'SELECT count(*) AS n FROM %I.%I WHERE run_id LIKE ''rb-%%''', n.nspname, c.relname),
				false, true, '')))[1]::text::int AS n
			  FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
			 WHERE c.relkind = 'r' AND c.relname ~ '^(orders|events|commands)_[0-9]+$') s}),
		'0', node_name($node) . ' holds nothing of the rolled-back runs');
}
is(safe_psql(0, $db, q{
	SELECT count(*) FROM public.orders o
	  JOIN outbox.events e ON e.run_id = o.run_id
	  JOIN outbox.commands c ON c.run_id = o.run_id AND c.command_id = e.command_id}),
	'200', 'the 200 orders, events and commands join on run_id, co-located');
is(safe_psql(0, $db, q{
	SELECT count(DISTINCT colocationid) FROM pg_dist_partition
	 WHERE logicalrelid IN ('public.orders'::regclass, 'outbox.events'::regclass, 'outbox.commands'::regclass)}),
	'1', 'the business table is in the outbox\'s co-location group');
is(safe_psql(0, $db, q{SELECT outbox.commit_decision('fn-1', 1, 'placed', 'ship-fn-1', 'ship', '{"total": 1}')}),
	'f', 'a retry of a decision, from the coordinator, is recognised');
is(sqlstate(0, $db, q{SELECT outbox.commit_decision('fn-1', 1, 'placed', 'ship-fn-1', 'ship', '{"total": 2}')}),
	'23505', 'a conflicting repeat is 23505');

# A batch over several runs: each decision routed to its run's node.
is(safe_psql(0, $db, q{SELECT string_agg(command_id || ':' || recorded, ' ' ORDER BY ord)
	FROM outbox.commit_decisions('[
		{"run_id": "co-1", "seq": 1, "event_kind": "placed", "command_id": "ship-co-1",
		 "command_kind": "ship", "payload": {"total": 1}},
		{"run_id": "batch-1", "seq": 1, "event_kind": "placed", "command_id": "ship-batch-1",
		 "command_kind": "ship", "payload": {}},
		{"run_id": "batch-2", "seq": 1, "event_kind": "placed", "command_id": "ship-batch-2",
		 "command_kind": "ship", "payload": {}}]')}),
	'ship-co-1:false ship-batch-1:true ship-batch-2:true',
	'commit_decisions over several runs: a retry recognised, two recorded');

# Ordered delivery is refused on a distributed outbox (a key's lock lives on
# one node), for a key given and for a kind ordered by run, single and batch,
# and nothing is recorded.
is(sqlstate(0, $db, q{SELECT outbox.commit_decision('ord-1', 1, 'placed', 'ship-ord-1', 'ship', '{}',
		ordering_key => 'k-1')}), '0A000', 'a decision with an ordering key on a distributed outbox: 0A000');
is(sqlstate(0, $db, q{BEGIN; SELECT outbox.set_policy('ship_ordered', ordered_by_run => true);
		SELECT outbox.commit_decision('ord-2', 1, 'placed', 'ship-ord-2', 'ship_ordered', '{}'); COMMIT}),
	'0A000', 'a decision of a kind ordered by run on a distributed outbox: 0A000');
is(sqlstate(0, $db, q{SELECT * FROM outbox.commit_decisions('[
		{"run_id": "ord-3", "seq": 1, "event_kind": "placed", "command_id": "ship-ord-3",
		 "command_kind": "ship", "payload": {}, "ordering_key": "k-3"}]')}),
	'0A000', 'a batch with an ordering key on a distributed outbox: 0A000');
is(safe_psql(0, $db, q{SELECT (SELECT count(*) FROM outbox.commands WHERE run_id LIKE 'ord-%')
		+ (SELECT count(*) FROM outbox.events WHERE run_id LIKE 'ord-%')}), '0',
	'the refused ordered decisions recorded nothing');

# A kind restricted to deciders, on the routed path: a producer outside the
# list is refused (42501) from the coordinator and on a worker and records
# nothing; a listed one records (the list is read from the reference table
# on the run's node at every call).
safe_psql(0, $db, q{CREATE ROLE dec_ok LOGIN; CREATE ROLE dec_no LOGIN;
	SELECT format('GRANT %I TO dec_ok, dec_no', outbox.role('producer')) \gexec
	SELECT outbox.set_policy('ship_listed', deciders => ARRAY['dec_ok']::regrole[])});
for my $node (0, 1)
{
	my $where = $node == 0 ? 'from the coordinator' : 'on a worker';
	is(sqlstate($node, $db, "SET ROLE dec_no; SELECT outbox.commit_decision('dec-no-$node', 1, 'placed',
		'ship-dec-no-$node', 'ship_listed', '{}')"), '42501', "a producer outside the kind's deciders, $where: 42501");
	# (rolled back: the later counts are of the other commands)
	is(safe_psql($node, $db, "BEGIN; SET ROLE dec_ok; SELECT outbox.commit_decision('dec-ok-$node', 1, 'placed',
		'ship-dec-ok-$node', 'ship_listed', '{}'); RESET ROLE;
		SELECT count(*) FROM outbox.commands c JOIN outbox.events e USING (run_id, command_id)
		 WHERE run_id = 'dec-ok-$node'; ROLLBACK"), "t\n1", "a listed decider, $where: recorded");
}
is(safe_psql(0, $db, q{SELECT (SELECT count(*) FROM outbox.commands WHERE run_id LIKE 'dec-%')
		+ (SELECT count(*) FROM outbox.events WHERE run_id LIKE 'dec-%')}), '0',
	'the refused decisions recorded nothing');

# --- claims, a publisher that dies, two relays, a shard move ------------------------------
# More commands, decided from the coordinator.
safe_psql(0, $db, q{
	SELECT count(*) FROM (SELECT outbox.commit_decision('bulk-' || g, 1, 'placed', 'ship-bulk-' || g,
			'ship', '{}') FROM generate_series(1, 398) g) s});
is(sqlstate(0, $db, q{SELECT * FROM outbox.claim('on-coordinator', 10)}), '55000',
	'a claim on the coordinator, which holds no shard: 55000');
# A publisher claims on both workers and dies without acking (its leases
# end after two seconds).
my %dead;
my @dead_ids;
for my $node (1, 2)
{
	my @ids = split /\n/, safe_psql($node, $db,
		q{SELECT command_id FROM outbox.claim('dead-relay', 20, lease => '2 seconds')});
	$dead{$node} = scalar(@ids);
	push @dead_ids, @ids;
}
is("$dead{1} $dead{2}", '20 20', 'the dying publisher leased 20 commands on each worker');
my $dead_list = join(',', map { "'$_'" } @dead_ids);
is(safe_psql(0, $db, q{
	SELECT count(DISTINCT get_shard_id_for_distribution_column('outbox.commands', run_id))
	  FROM outbox.commands WHERE owner = 'dead-relay'}) > 1 ? 'many' : 'one',
	'many', '... from several shards');

# Two relays, one on each worker.
my $relay = -x 'src/outbox-relay' ? 'src/outbox-relay' : 'outbox-relay';
my $dir = "$ENV{CITUS_DATA}/relay-140";
mkdir $dir;
my %relays;
for my $node (1, 2)
{
	my ($o, $e) = ('', '');
	$relays{$node} = IPC::Run::start(
		[
			$relay, '--dsn', "host=127.0.0.1 port=$ports[$node] user=postgres dbname=$db",
			'--sink', "file:$dir/sink-$node.ndjson", '--worker', "relay-$node",
			'--batch', '10', '--poll', '0.2', '--lease', '30'
		],
		'>', \$o, '2>', \$e);
}
my $total = safe_psql(0, $db, 'SELECT count(*) FROM outbox.commands');
is($total, '600', '600 commands to publish');
ok(poll_until(0, $db, q{SELECT count(*) >= 150 FROM outbox.commands WHERE status = 'published'}, 't'),
	'the relays are publishing');

# Move the co-located shards of the worker1 shard with the most unpublished
# commands to worker2, while the relays run.
my ($busiest, $shard, $left) = busiest_shard($db, $ports[1]);
ok(defined $busiest, 'a shard on worker1 still has unpublished commands');
($rc, $out, $err) = psql(0, $db, qq{
	SELECT citus_move_shard_placement($shard, '127.0.0.1', $ports[1], '127.0.0.1', $ports[2],
									  shard_transfer_mode => 'block_writes')});
is($rc, 0, 'a shard group moves from worker1 to worker2 during the drain') or diag($err);
note("$left commands of the moved shard were unpublished when it moved");
is(safe_psql(0, $db, qq{
	SELECT n.nodeport FROM pg_dist_placement p JOIN pg_dist_node n ON n.groupid = p.groupid
	 WHERE p.shardid = $shard}), $ports[2], 'the shard is on worker2 now');

ok(poll_until(0, $db, q{SELECT count(*) FROM outbox.commands WHERE status <> 'published'}, '0'),
	'the relays drain every command');
for my $node (1, 2)
{
	$relays{$node}->signal('TERM');
	$relays{$node}->finish;
}
is(safe_psql(0, $db, qq{
	SELECT count(*) || ' ' || bool_and(deliveries >= 2) || ' ' || bool_and(owner LIKE 'relay-%')
		   || ' ' || bool_and(status = 'published')
	  FROM outbox.commands WHERE command_id IN ($dead_list)}),
	'40 true true true', 'the dead publisher\'s 40 leases were taken over by the relays and published');
my %seen;
for my $node (1, 2)
{
	open(my $fh, '<', "$dir/sink-$node.ndjson") or die "sink-$node: $!";
	while (my $line = <$fh>)
	{
		$seen{$1}++ if $line =~ /"command_id":"([^"]+)"/;
	}
	close $fh;
}
is(scalar(keys %seen), 600, 'the two sinks hold all 600 commands');
is(safe_psql(0, $db, q{SELECT count(DISTINCT owner) FROM outbox.commands}), '2',
	'both relays published');

# --- verify ----------------------------------------------------------------------------------
my @fn = map { [split /\|/] } split /\n/, safe_psql(0, $db,
	q{SELECT run_id || '|' || command_id FROM outbox.commands WHERE run_id LIKE 'fn-%'});
is(safe_psql(0, $db, join('', map { "SELECT outbox.complete('$_->[0]', '$_->[1]');\n" } @fn)),
	join("\n", ('t') x 100),
	'receipts for the function\'s 100 commands, completed from the coordinator');
is(safe_psql(0, $db, q{SELECT count(*) FROM outbox.receipts r
		JOIN outbox.commands c ON c.run_id = r.run_id AND c.command_id = r.command_id}), '100',
	'each receipt carries its command\'s run_id');
($rc, $out, $err) = psql(0, $db, 'SELECT outbox.verify(include_warnings => true)');
is($rc, 0, 'verify() on the coordinator is clean over the whole cluster') or diag($err);
($rc, $out, $err) = psql(0, $db, q{
	BEGIN;
	DELETE FROM outbox.events WHERE run_id = 'co-7';
	SELECT outbox.verify();
	ROLLBACK;});
like($err, qr/orphan_commands/, 'verify() sees a command whose event went missing on a worker');

# More of the API on the distributed tables: a registered consumer's
# acceptances, an event deciding nothing, a dead command requeued from the
# coordinator (settled by its worker's sweep) and then published.
safe_psql(0, $db, q{SELECT outbox.register_consumer('mailer', 'postgres')});
is(safe_psql(0, $db, q{SELECT outbox.inbox_accept('mailer', 'fn-1', 'ship-fn-1');
	SELECT outbox.inbox_accept('mailer', 'fn-1', 'ship-fn-1')}), "t\nf",
	'inbox_accept: true the first time, false after');
is(safe_psql(0, $db, q{SELECT count(*) FROM outbox.inbox WHERE run_id = 'fn-1'}), '1',
	'... the acceptance carries its run_id');
safe_psql(0, $db, q{SELECT outbox.record_event('fn-1', 2, 'noted', '{}')});
is(safe_psql(0, $db, q{SELECT count(*) FROM outbox.events WHERE run_id = 'fn-1'}), '2',
	'record_event adds an event to the run');
safe_psql(0, $db, q{SELECT outbox.set_policy('once', max_deliveries => 1);
	SELECT outbox.commit_decision('dl-1', 1, 'placed', 'ship-dl-1', 'once', '{}')});
my $dl_port = safe_psql(0, $db, q{SELECT n.nodeport FROM pg_dist_placement p JOIN pg_dist_node n ON n.groupid = p.groupid
	WHERE p.shardid = get_shard_id_for_distribution_column('outbox.commands', 'dl-1')});
my $dl_node = node_of_port($dl_port);
is(safe_psql($dl_node, $db, q{SELECT count(*) FROM outbox.claim('once-relay', 10, lease => '1 second', kinds => '{once}')}),
	'1', 'the command of a kind with one delivery is claimed on its node');
ok(poll_until(0, $db, q{SELECT status FROM outbox.commands WHERE run_id = 'dl-1'}, 'dead'),
	'its expired lease is settled dead by the sweep of its node\'s worker');
safe_psql(0, $db, q{SELECT outbox.requeue('dl-1', 'ship-dl-1')});
is(safe_psql(0, $db, q{SELECT status FROM outbox.commands WHERE run_id = 'dl-1'}), 'pending',
	'requeue from the coordinator makes it pending again');
is(safe_psql($dl_node, $db, q{SELECT count(outbox.ack('once-relay', token))
	FROM outbox.claim('once-relay', 10, kinds => '{once}')}), '1', '... and it is claimed and acked again');

for my $node (@NODES)
{
	my @hits = log_since($node, qr/ERROR:.*(could not create distributed plan|FOR UPDATE\/SHARE|complex joins|distributed query from a query on a shard)/);
	is(scalar(@hits), 0,
		node_name($node) . '\'s log has no Citus planning error (the workers\' rounds, the relays)')
	  or diag(join('', @hits[0 .. ($#hits < 4 ? $#hits : 4)]));
}

# --- undistribute, drop ---------------------------------------------------------------------
($rc, $out, $err) = psql_ddl(0, $db, 'SELECT outbox.undistribute()');
is($rc, 0, 'undistribute() succeeds') or diag($err);
is(safe_psql(0, $db, q{SELECT count(*) FROM pg_dist_partition WHERE logicalrelid::text LIKE 'outbox.%'}),
	'0', 'nothing of the outbox is distributed');
is(safe_psql(0, $db, q{SELECT count(*) || ' ' || count(*) FILTER (WHERE status = 'published') FROM outbox.commands}),
	'601 601', 'the coordinator\'s own tables hold the 601 commands');
is(safe_psql(0, $db, q{SELECT count(*) FROM outbox.receipts}), '100', '... and the 100 receipts');
($rc, $out, $err) = psql(0, $db, 'SELECT outbox.verify()');
is($rc, 0, 'verify() is clean on the single node') or diag($err);
for my $node (@NODES)
{
	is(safe_psql($node, $db, q{SELECT pg_get_indexdef('outbox.commands_pkey'::regclass, 0, true) LIKE '%(command_id)'}),
		't', node_name($node) . '\'s copies have the single server\'s keys again');
}

safe_psql(0, $db, 'SET citus.shard_count = 4; SELECT outbox.distribute()');
is(safe_psql(0, $db, 'SELECT count(*) FROM outbox.commands'), '601',
	'distributed again, with the rows');
safe_psql(0, $db, 'DROP TABLE public.orders; DROP FUNCTION public.place_order(text, int)');
($rc, $out, $err) = psql_ddl(0, $db, 'DROP EXTENSION outbox');
is($rc, 0, 'DROP EXTENSION outbox on a distributed outbox') or diag($err);
# the business table's copies that the shard move left on worker1 wait
# for Citus's deferred cleanup (the outbox's went with undistribute())
safe_psql(0, $db, 'CALL citus_cleanup_orphaned_resources()');
my @after = on_all($db, $catalog);
for my $node (@NODES)
{
	is($after[$node], $before[$node],
		node_name($node) . ' holds no relation, type or function of the outbox, no shard');
}
($rc, $out, $err) = psql(0, $db, 'CREATE EXTENSION outbox');
is($rc, 0, 'CREATE EXTENSION outbox works again afterwards') or diag($err);
safe_psql(0, $db, 'DROP EXTENSION outbox');

done_testing();
