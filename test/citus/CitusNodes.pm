# Helpers of the TAP tests in test/citus: the three nodes test/run.sh's
# citus layer started (a coordinator and two workers on 127.0.0.1, citus and
# outbox preloaded), named by the environment:
#   CITUS_PORTS  "coordinator-port worker1-port worker2-port"
#   CITUS_DATA   the directory holding their data directories
#                (coordinator, worker1, worker2; each has server.log)
#   PGBIN        the directory of psql
# Each test file works in databases of its own, made with citus_database(),
# so that the files do not depend on one another's leftovers.
package CitusNodes;

use strict;
use warnings;
use Exporter 'import';
use IO::Socket::INET ();
use IPC::Run ();
use Test::More;
use Time::HiRes ();

our @EXPORT = qw(@NODES node_name node_of_port node_port citus_database psql safe_psql
  psql_ddl busiest_shard on_all poll_until log_has wait_for_log session session_query session_end
  start_node stop_node);

my @ports = split ' ', ($ENV{CITUS_PORTS} // '');
die "CITUS_PORTS must name three ports (test/run.sh citus sets it)\n"
  unless @ports == 3;
my @names = qw(coordinator worker1 worker2);

# Node indexes: 0 the coordinator, 1 and 2 the workers.
our @NODES = (0, 1, 2);

sub node_name { return $names[ $_[0] ] }

# The node listening on a port.
sub node_of_port
{
	my ($port) = @_;
	my ($node) = grep { $ports[$_] == $port } @NODES;
	die "no node listens on port $port\n" unless defined $node;
	return $node;
}

# The port a node listens on.
sub node_port { return $ports[ $_[0] ] }

# Start one more node, for a test of its own (a worker added to the
# cluster): a server in $CITUS_DATA/$name with the settings of the layer's
# nodes (test/run.sh, citus_start), on a free port of 127.0.0.1.  Returns
# its index for psql() and the others; it is not in @NODES (citus_database
# and on_all keep to the three nodes).  The caller stops it with
# stop_node, from an END block so that it stops whatever happens; the
# layer's citus_stop stops it too if it is still running.
sub start_node
{
	my ($name) = @_;
	my $data = "$ENV{CITUS_DATA}/$name";
	my $port;
	for (1 .. 100)
	{
		my $p = 20000 + int(rand(12000));    # below the ephemeral ports
		next if IO::Socket::INET->new(PeerAddr => '127.0.0.1', PeerPort => $p, Proto => 'tcp');
		my $l = IO::Socket::INET->new(LocalAddr => '127.0.0.1', LocalPort => $p, Listen => 1, ReuseAddr => 1)
		  or next;
		$l->close;
		$port = $p;
		last;
	}
	die "no free port\n" unless defined $port;
	my ($out, $err) = ('', '');
	IPC::Run::run([ "$ENV{PGBIN}/initdb", '-D', $data, '-A', 'trust', '-U', 'postgres', '--no-sync' ],
		'>', \$out, '2>', \$err)
	  or die "initdb $data failed: $err\n";
	open(my $fh, '>>', "$data/postgresql.conf") or die "$data/postgresql.conf: $!";
	print $fh join("\n",
		"port = $port",
		"listen_addresses = '127.0.0.1'",
		"unix_socket_directories = '$data'",
		"shared_preload_libraries = 'citus,outbox'",
		'outbox.naptime = 200',
		'max_prepared_transactions = 20',
		'max_worker_processes = 32',
		'wal_level = logical',
		"citus.node_conninfo = 'sslmode=disable'", '');
	close $fh;
	IPC::Run::run([ "$ENV{PGBIN}/pg_ctl", '-D', $data, '-l', "$data/server.log", '-w', 'start' ],
		'>', \$out, '2>', \$err)
	  or die "pg_ctl start $data failed: $err\n";
	push @ports, $port;
	push @names, $name;
	return $#ports;
}

# Stop a node start_node started: a fast shutdown, then SIGQUIT to the
# postmaster of its data directory if it is still there.
sub stop_node
{
	my ($node) = @_;
	my $data = "$ENV{CITUS_DATA}/$names[$node]";
	return unless -f "$data/postmaster.pid";
	my ($out, $err) = ('', '');
	IPC::Run::run([ "$ENV{PGBIN}/pg_ctl", '-D', $data, '-m', 'fast', '-w', '-t', '30', 'stop' ],
		'>', \$out, '2>', \$err);
	open(my $fh, '<', "$data/postmaster.pid") or return;
	my $pid = <$fh>;
	close $fh;
	chomp $pid if defined $pid;
	kill 'QUIT', $pid if $pid && $pid =~ /^\d+$/ && kill(0, $pid);
}

# Run SQL on a node through psql (unaligned, tuples only); returns
# (exit code, stdout, stderr), stdout without its last newline.
sub psql
{
	my ($node, $db, $sql) = @_;
	my ($out, $err) = ('', '');
	IPC::Run::run(
		[
			"$ENV{PGBIN}/psql", '-X', '-A', '-t', '-q',
			'-v', 'ON_ERROR_STOP=1',
			'-h', '127.0.0.1', '-p', $ports[$node], '-U', 'postgres',
			'-d', $db, '-f', '-'
		],
		'<', \$sql, '>', \$out, '2>', \$err);
	my $rc = $? >> 8;
	chomp $out;
	return ($rc, $out, $err);
}

# Run SQL that must succeed; returns its output (dies with the error).
sub safe_psql
{
	my ($node, $db, $sql) = @_;
	my ($rc, $out, $err) = psql($node, $db, $sql);
	die "psql on " . node_name($node) . " ($db) failed: $err\nSQL: $sql\n"
	  if $rc != 0;
	return $out;
}

# Run a statement that drops or moves the distributed outbox's shards
# (undistribute(), DROP EXTENSION) as psql does, once more if Citus's
# distributed deadlock detection canceled it while a node's background
# worker was in a round (docs/citus.md): as a DBA would.  Any other error,
# or a second cancel, is returned as it is.
sub psql_ddl
{
	my ($node, $db, $sql) = @_;
	my ($rc, $out, $err) = psql($node, $db, $sql);
	if ($rc != 0 && $err =~ /involved in a distributed deadlock/)
	{
		Test::More::diag("$sql canceled by Citus's deadlock detection; running it again");
		($rc, $out, $err) = psql($node, $db, $sql);
	}
	return ($rc, $out, $err);
}

# The shard of outbox.commands on the node at $port that holds the most
# unpublished commands (undef when none there holds any); the shard to use
# (that one, else any shard of the node); and how many unpublished
# commands the shard to use holds.
sub busiest_shard
{
	my ($db, $port) = @_;
	my %on_node = map { $_ => 1 } split /,/, safe_psql(0, $db, qq{
	SELECT string_agg(s.shardid::text, ',') FROM pg_dist_shard s
	  JOIN pg_dist_placement p ON p.shardid = s.shardid JOIN pg_dist_node n ON n.groupid = p.groupid
	 WHERE s.logicalrelid = 'outbox.commands'::regclass AND n.nodeport = $port});
	my ($busiest) = grep { $on_node{$_} } map { (split /\|/)[0] } split /\n/, safe_psql(0, $db, q{
	SELECT s || '|' || n FROM (
		SELECT get_shard_id_for_distribution_column('outbox.commands', run_id) AS s, count(*) AS n
		  FROM outbox.commands WHERE status <> 'published' GROUP BY 1) x ORDER BY n DESC, s});
	my $shard = $busiest // (keys %on_node)[0];
	my $left = safe_psql(0, $db, qq{
	SELECT count(*) FROM outbox.commands c WHERE c.status <> 'published'
	   AND get_shard_id_for_distribution_column('outbox.commands', c.run_id) = $shard});
	return ($busiest, $shard, $left);
}

# Run SQL on every node; returns the outputs, node by node.
sub on_all
{
	my ($db, $sql) = @_;
	return map { safe_psql($_, $db, $sql) } @NODES;
}

# A new database on every node with the citus extension, the coordinator
# knowing both workers.
sub citus_database
{
	my ($db) = @_;
	for my $node (@NODES)
	{
		safe_psql($node, 'postgres', qq{CREATE DATABASE "$db"});
		safe_psql($node, $db, 'CREATE EXTENSION citus');
	}
	safe_psql(0, $db,
		"SELECT citus_set_coordinator_host('127.0.0.1', $ports[0])");
	safe_psql(0, $db, "SELECT citus_add_node('127.0.0.1', $ports[$_])")
	  for (1, 2);
	return $db;
}

# Poll a query on a node until it returns $want (30 seconds at most).
sub poll_until
{
	my ($node, $db, $sql, $want) = @_;
	my $got;
	for (1 .. 300)
	{
		my ($rc, $out) = psql($node, $db, $sql);
		$got = $out;
		return 1 if $rc == 0 && $out eq $want;
		Time::HiRes::usleep(100_000);
	}
	diag(node_name($node) . ": $sql gave '" . ($got // '') . "', not '$want'");
	return 0;
}

# Whether a node's server log has a line matching $re.
sub log_has
{
	my ($node, $re) = @_;
	my $file = "$ENV{CITUS_DATA}/" . node_name($node) . "/server.log";
	open(my $fh, '<', $file) or die "$file: $!";
	while (my $line = <$fh>)
	{
		if ($line =~ $re)
		{
			close $fh;
			return 1;
		}
	}
	close $fh;
	return 0;
}

# Wait until a node's server log has a line matching $re (30 seconds at most).
sub wait_for_log
{
	my ($node, $re) = @_;
	for (1 .. 300)
	{
		return 1 if log_has($node, $re);
		Time::HiRes::usleep(100_000);
	}
	diag(node_name($node) . ": no log line matches $re");
	return 0;
}

# A psql session kept open (to hold a transaction while another runs).
sub session
{
	my ($node, $db) = @_;
	my $s = { in => '', out => '', err => '' };
	$s->{timer} = IPC::Run::timeout(30);
	$s->{h} = IPC::Run::start(
		[
			"$ENV{PGBIN}/psql", '-X', '-A', '-t', '-q',
			'-h', '127.0.0.1', '-p', $ports[$node], '-U', 'postgres',
			'-d', $db, '-f', '-'
		],
		'<', \$s->{in}, '>', \$s->{out}, '2>', \$s->{err}, $s->{timer});
	return $s;
}

# Run SQL in a session and wait for its output (without the last newline).
sub session_query
{
	my ($s, $sql) = @_;
	$s->{out} = '';
	$s->{in} .= "$sql\n\\echo __done__\n";
	$s->{timer}->start(30);
	$s->{h}->pump until $s->{out} =~ /__done__\n/;
	(my $out = $s->{out}) =~ s/__done__\n//;
	chomp $out;
	return $out;
}

# End a session.
sub session_end
{
	my ($s) = @_;
	$s->{in} .= "\\q\n";
	$s->{h}->finish;
}

1;
