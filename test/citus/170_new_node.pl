# A worker node added after outbox.distribute() (docs/citus.md): a third
# worker, started by this file (its own port and data directory, stopped at
# the end whatever happens), joins with citus_add_node.  Citus creates the
# extension there; the node's outbox worker starts and gives the node's
# copies the distributed outbox's keys; citus_rebalance_start moves shard
# groups onto it; decisions through a distributed function commit there;
# a claim there takes only its shards, and a lease taken over there fences
# the first holder's token (OB001) from the coordinator, a key rotation on
# the coordinator fences a token made there; the node's worker sweeps its
# expired leases; an outbox-relay --citus started before the node was
# added finds it and drains its shards; verify() is clean; DROP EXTENSION
# leaves no shard on it.
use strict;
use warnings;
use FindBin;
use lib $FindBin::RealBin;
use CitusNodes;
use IPC::Run ();
use POSIX ();
use Test::More;
use Time::HiRes ();

my $relay = -x 'src/outbox-relay' ? 'src/outbox-relay' : 'outbox-relay';
my $dir = "$ENV{CITUS_DATA}/relay-170";
mkdir $dir;

# The third worker and the relay: stopped at the end, whatever happens.
my $w3;
my $relay_pid;
END
{
	my $status = $?;
	if ($relay_pid)
	{
		kill 'TERM', $relay_pid;
		waitpid($relay_pid, 0);
	}
	stop_node($w3) if defined $w3;
	$? = $status;
}

sub slurp
{
	my ($f) = @_;
	open(my $fh, '<', $f) or return '';
	local $/;
	my $s = <$fh>;
	close $fh;
	return $s;
}

# The SQLSTATE of a statement that must fail (psql's VERBOSITY verbose).
sub sqlstate
{
	my ($node, $d, $sql) = @_;
	my ($rc, $out, $err) = psql($node, $d, "\\set VERBOSITY verbose\n$sql");
	return $rc == 0 ? 'succeeded' : ($err =~ /ERROR:\s+([0-9A-Z]{5})/ ? $1 : $err);
}

# --- a distributed outbox on the coordinator and two workers ----------------------------------
my $db = citus_database('citus_new_node');
my $coord = 'host=127.0.0.1 port=' . node_port(0) . " user=postgres dbname=$db";
safe_psql(0, $db, 'CREATE EXTENSION outbox');
safe_psql(0, $db, q{SELECT outbox.set_policy('ship', max_deliveries => 50)});
safe_psql(0, $db, q{SELECT outbox.set_policy('fence', max_deliveries => 50)});
safe_psql(0, $db, 'SET citus.shard_count = 8; SELECT outbox.distribute()');
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
safe_psql(0, $db, q{SELECT count(*) FROM (SELECT outbox.commit_decision('before-' || g, 1, 'placed',
	'ship-before-' || g, 'ship', '{}') FROM generate_series(1, 200) g) s});

# A relay --citus through the coordinator, before the node exists: it
# serves the two workers, and reads pg_dist_node every second.
my $rlog = "$dir/relay.log";
$relay_pid = fork() // die "fork: $!";
if ($relay_pid == 0)
{
	open(STDIN, '<', '/dev/null');
	open(STDOUT, '>>', "$dir/relay.out") or POSIX::_exit(127);
	open(STDERR, '>>', $rlog) or POSIX::_exit(127);
	exec($relay, '--citus', '--dsn', $coord, '--sink', "file:$dir/out.ndjson", '--poll', '0.2',
		'--citus-refresh', '1', '--worker', 'late', '--kinds', 'ship') or POSIX::_exit(127);
}
ok(poll_until(0, $db, q{SELECT count(*) FROM outbox.commands WHERE status <> 'published'}, '0'),
	'the relay drains the two workers');

# --- the third worker joins -------------------------------------------------------------------
$w3 = start_node('worker3');
my $p3 = node_port($w3);
safe_psql($w3, 'postgres', qq{CREATE DATABASE "$db"});
safe_psql($w3, $db, 'CREATE EXTENSION citus');
safe_psql(0, $db, "SELECT citus_add_node('127.0.0.1', $p3)");
is(safe_psql($w3, $db, q{SELECT extversion FROM pg_extension WHERE extname = 'outbox'}),
	safe_psql(0, $db, q{SELECT extversion FROM pg_extension WHERE extname = 'outbox'}),
	'citus_add_node: the new node has the coordinator\'s version of the outbox');
is(safe_psql($w3, $db, 'SELECT outbox._distributed()'), 't', '... and sees the outbox distributed');
ok(wait_for_log($w3, qr/outbox worker for database "$db" started/), '... its outbox worker started');
my $keys = q{
	SELECT string_agg(indexrelid::regclass::text || '(' || pg_get_indexdef(indexrelid, 1, true)
		|| ',' || pg_get_indexdef(indexrelid, 2, true) || ')', ' ' ORDER BY indexrelid::regclass::text)
	  FROM pg_index
	 WHERE indexrelid IN ('outbox.commands_pkey'::regclass, 'outbox.receipts_pkey'::regclass,
						  'outbox.purged_pkey'::regclass, 'outbox.events_command_id_key'::regclass)};
ok(poll_until($w3, $db, $keys,
	'outbox.commands_pkey(run_id,command_id) outbox.events_command_id_key(run_id,command_id) '
	  . 'outbox.purged_pkey(run_id,command_id) outbox.receipts_pkey(run_id,command_id)'),
	'... and gave the node\'s copies the keys of the distributed outbox');
ok(log_has($w3, qr/this node's tables now have the keys of the distributed outbox/),
	'... saying so in its log');
is(safe_psql($w3, $db, q{SELECT pg_get_indexdef('outbox.inbox_pkey'::regclass)}) =~ /\(run_id, consumer, command_id\)/
	? 1 : 0, 1, '... the inbox\'s too');

# --- shards onto it ---------------------------------------------------------------------------
my ($rc, $out, $err) = psql(0, $db, q{
	SELECT citus_rebalance_start(shard_transfer_mode => 'block_writes');
	SELECT citus_rebalance_wait();
	SELECT state FROM pg_dist_background_job ORDER BY job_id DESC LIMIT 1});
is($rc, 0, 'citus_rebalance_start and citus_rebalance_wait') or diag($err);
like($out, qr/finished$/, '... the rebalance job finished');
my $on_w3 = qq{
	SELECT count(*) FROM pg_dist_shard s JOIN pg_dist_placement p ON p.shardid = s.shardid
	  JOIN pg_dist_node n ON n.groupid = p.groupid
	 WHERE s.logicalrelid = 'outbox.commands'::regclass AND n.nodeport = $p3};
my $moved = safe_psql(0, $db, $on_w3);
ok($moved >= 2, "the rebalance moved shard groups onto the new node ($moved of 8)");
is(safe_psql($w3, $db, 'SELECT count(*) FROM outbox._citus_local_shards()'), $moved,
	'the new node lists those shards as its own');
is(safe_psql($w3, $db, q{SELECT count(*) FROM outbox.policies WHERE kind IN ('ship', 'fence')}), '2',
	'the reference table policies has its copy there');

# Runs whose shard is on the new node.
my @runs = split /\n/, safe_psql(0, $db, qq{
	SELECT r FROM (SELECT 'w3-' || g AS r FROM generate_series(1, 400) g) x
	 WHERE get_shard_id_for_distribution_column('outbox.commands', r) IN (
		SELECT s.shardid FROM pg_dist_shard s JOIN pg_dist_placement p ON p.shardid = s.shardid
		  JOIN pg_dist_node n ON n.groupid = p.groupid
		 WHERE s.logicalrelid = 'outbox.commands'::regclass AND n.nodeport = $p3)
	 ORDER BY r LIMIT 30});
is(scalar(@runs), 30, '30 runs that fall on the new node');

# Business row + decision through the distributed function: sent to the
# new node, committed there.
my $sent = 0;
for my $run (@runs[0 .. 19])
{
	my ($r, $o, $e) = psql(0, $db, "SET citus.log_remote_commands = on;\nSELECT public.place_order('$run', 10)");
	$sent++ if $r == 0 && $o eq 't' && $e =~ /issuing SELECT public\.place_order.*\n.*127\.0\.0\.1:$p3\b/;
}
is($sent, 20, 'place_order for 20 runs of the new node: one statement sent to it, each');
is(safe_psql($w3, $db, qq{SET citus.override_table_visibility = off;
	SELECT (SELECT count(*) FROM (SELECT 1 FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
		WHERE n.nspname = 'outbox' AND c.relname ~ '^commands_[0-9]+\$') x)}), $moved,
	'the new node holds a shard of commands for each shard group moved there');
is(safe_psql(0, $db, q{SELECT count(*) FROM public.orders o JOIN outbox.commands c
	ON c.run_id = o.run_id AND c.command_id = 'ship-' || o.run_id WHERE o.run_id LIKE 'w3-%'}), '20',
	'each order has its command');

# --- leases and fencing on the new node -------------------------------------------------------
# Kinds fence and once (one delivery), which the relay does not claim.
safe_psql(0, $db, q{SELECT outbox.set_policy('once', max_deliveries => 1)});
safe_psql(0, $db, qq{SELECT outbox.commit_decision('$runs[20]', 1, 'placed', 'fence-1', 'fence', '{}')});
is(sqlstate(0, $db, q{SELECT count(*) FROM outbox.claim('pub-a', 10, kinds => '{fence}')}), '55000',
	'a claim on the coordinator: 55000');
my $token_a = safe_psql($w3, $db, q{SELECT token FROM outbox.claim('pub-a', 1, lease => '1 second',
	kinds => '{fence}') WHERE command_id = 'fence-1'});
like($token_a, qr/:fence-1$/, 'a claim on the new node leases fence-1');
ok(poll_until(0, $db, q{SELECT lease_until < now() FROM outbox.commands WHERE command_id = 'fence-1'}, 't'),
	'... for a second');
my $token_b = safe_psql($w3, $db, q{SELECT token FROM outbox.claim('pub-b', 1, kinds => '{fence}')
	WHERE command_id = 'fence-1'});
like($token_b, qr/:fence-1$/, 'pub-b takes the expired lease over on the new node');
is(sqlstate(0, $db, "SELECT outbox.ack('pub-a', '$token_a')"), 'OB001',
	'the first holder\'s ack, from the coordinator: OB001 (fenced)');
is(sqlstate($w3, $db, "SELECT outbox.ack('pub-a', '$token_a')"), 'OB001', '... and on the new node: OB001');
($rc, $out, $err) = psql(0, $db, "SELECT outbox.ack('pub-b', '$token_b')");
is($rc, 0, 'pub-b\'s ack from the coordinator') or diag($err);
is(safe_psql($w3, $db, q{SELECT status || ':' || owner FROM outbox.commands WHERE command_id = 'fence-1'}),
	'published:pub-b', '... publishes fence-1, pub-b\'s');

# The new node's worker sweeps its shards: a lease with no delivery left
# that expires is settled (dead).
safe_psql(0, $db, qq{SELECT outbox.commit_decision('$runs[21]', 1, 'placed', 'once-1', 'once', '{}')});
like(safe_psql($w3, $db, q{SELECT token FROM outbox.claim('pub-a', 1, lease => '1 second', kinds => '{once}')}),
	qr/:once-1$/, 'a claim on the new node leases once-1, its only delivery');
ok(poll_until(0, $db, q{SELECT status FROM outbox.commands WHERE command_id = 'once-1'}, 'dead'),
	'the new node\'s worker sweeps the expired lease: dead');
safe_psql(0, $db, qq{SELECT outbox.requeue('$runs[21]', 'once-1')});
my $token_o = safe_psql($w3, $db, q{SELECT token FROM outbox.claim('pub-a', 1, kinds => '{once}')});
($rc, $out, $err) = psql(0, $db, "SELECT outbox.ack('pub-a', '$token_o')");
is($rc, 0, '... requeued from the coordinator, claimed and acked') or diag($err);

# A key rotation on the coordinator fences a token made on the new node.
safe_psql(0, $db, qq{SELECT outbox.commit_decision('$runs[22]', 1, 'placed', 'fence-2', 'fence', '{}')});
my $token_c = safe_psql($w3, $db, q{SELECT token FROM outbox.claim('pub-c', 1, lease => '1 second',
	kinds => '{fence}') WHERE command_id = 'fence-2'});
like($token_c, qr/:fence-2$/, 'a claim on the new node leases fence-2');
($rc, $out, $err) = psql(0, $db, 'SELECT outbox.rotate_lease_key()');
is($rc, 0, 'rotate_lease_key() on the coordinator') or diag($err);
is(sqlstate($w3, $db, "SELECT outbox.ack('pub-c', '$token_c')"), 'OB001',
	'a token made on the new node under the old key is refused there: OB001');
ok(poll_until(0, $db, q{SELECT lease_until < now() FROM outbox.commands WHERE command_id = 'fence-2'}, 't'),
	'its lease ends');
my $token_d = safe_psql($w3, $db, q{SELECT token FROM outbox.claim('pub-c', 1, kinds => '{fence}')
	WHERE command_id = 'fence-2'});
($rc, $out, $err) = psql(0, $db, "SELECT outbox.ack('pub-c', '$token_d')");
is($rc, 0, '... claimed again under the new key and acked from the coordinator') or diag($err);

# --- the relay finds the node and drains its shards -------------------------------------------
safe_psql(0, $db, q{SELECT count(*) FROM (SELECT outbox.commit_decision('after-' || g, 1, 'placed',
	'ship-after-' || g, 'ship', '{}') FROM generate_series(1, 200) g) s});
ok(poll_until(0, $db, q{SELECT count(*) FROM outbox.commands WHERE status <> 'published'}, '0'),
	'every command published');
like(slurp($rlog), qr/--citus: node 127\.0\.0\.1:$p3: relay \d+ started/,
	'the relay started a relay for the new node');
my $w3_published = safe_psql($w3, $db, qq{SELECT count(*) FROM outbox.commands c
	 WHERE c.owner = 'late\@127.0.0.1:$p3' AND c.status = 'published'
	   AND get_shard_id_for_distribution_column('outbox.commands', c.run_id) IN (
		SELECT s.shardid FROM pg_dist_shard s JOIN pg_dist_placement p ON p.shardid = s.shardid
		  JOIN pg_dist_node n ON n.groupid = p.groupid
		 WHERE s.logicalrelid = 'outbox.commands'::regclass AND n.nodeport = $p3)});
ok($w3_published >= 20, "the new node's relay published its shards' commands ($w3_published)");
is(safe_psql(0, $db, qq{SELECT count(*) FROM outbox.commands c
	 WHERE c.owner = 'late\@127.0.0.1:$p3'
	   AND get_shard_id_for_distribution_column('outbox.commands', c.run_id) NOT IN (
		SELECT s.shardid FROM pg_dist_shard s JOIN pg_dist_placement p ON p.shardid = s.shardid
		  JOIN pg_dist_node n ON n.groupid = p.groupid
		 WHERE s.logicalrelid = 'outbox.commands'::regclass AND n.nodeport = $p3)}), '0',
	'... and nothing of the other nodes\' shards');
my ($slot) = slurp($rlog) =~ /node 127\.0\.0\.1:$p3: relay \d+ started \(slot (\d+)\)/;
my $lines = () = slurp("$dir/out.ndjson." . ($slot // 'none')) =~ /"command_id":/g;
ok($lines >= $w3_published, "... into its slot's file ($lines lines)");
is(safe_psql(0, $db, 'SELECT count(*) FROM outbox.commands'), '423', '423 commands in all');

($rc, $out, $err) = psql(0, $db, 'SELECT outbox.verify()');
is($rc, 0, 'verify() over the four nodes is clean') or diag($err);
is(safe_psql($w3, $db, q{SELECT coalesce(last_error, '') FROM outbox.workers WHERE database = current_database()}),
	'', 'the new node\'s outbox worker had no failed round');

kill 'TERM', $relay_pid;
waitpid($relay_pid, 0);
$relay_pid = undef;

# --- clean up: nothing left on the new node ---------------------------------------------------
safe_psql(0, $db, 'DROP FUNCTION public.place_order(text, int); DROP TABLE public.orders');
($rc, $out, $err) = psql_ddl(0, $db, 'DROP EXTENSION outbox');
is($rc, 0, 'DROP EXTENSION outbox on the coordinator') or diag($err);
is(safe_psql($w3, $db, q{SET citus.override_table_visibility = off;
	SELECT count(*) FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = 'outbox'}),
	'0', 'no relation of the outbox is left on the new node');
is(safe_psql($w3, $db, q{SELECT count(*) FROM pg_extension WHERE extname = 'outbox'}), '0',
	'... nor the extension');
safe_psql(0, $db, "SELECT citus_remove_node('127.0.0.1', $p3)");

done_testing();
