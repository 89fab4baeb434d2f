# The application examples of examples/ (Python with Debian's psycopg 3,
# Node.js with node-postgres from npm) against a live cluster, each in a
# database of its own set up by examples/setup.sql:
#   * the producer places orders; every order has its command;
#   * publisher A claims a batch under a short lease and holds it unconfirmed
#     until the lease has run out; publisher B takes the batch over (and
#     claims the rest), sends and acks it; then A's broker confirms, A's acks
#     meet stale tokens (OB001), A drops those commands and goes on;
#   * the consumer gets every message of both publishers (the taken-over ones
#     twice), and once more as a redelivery: one charge and one receipt per
#     command, written in the same transaction.
# Then test/node/driver_checks.js and test/python/driver_checks.py show what
# node-postgres and psycopg make of the API (docs/drivers.md): int8, jsonb,
# the lease interval, ack and ack_many without casts, constraint names,
# aborted transactions and savepoints.  Everything is checked from the
# database or from what the driver returned.
#
# node-postgres is installed with npm from examples/node/package.json (an
# exact version) into this test's own directory; the interpreter for Python
# is OUTBOX_PYTHON, by default Debian's /usr/bin/python3 (python3-psycopg).
use strict;
use warnings;
use File::Copy qw(copy);
use IPC::Run;
use JSON::PP;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use FindBin;
use lib "$FindBin::RealBin/../perl";
use OutboxTest;

my $src = $ENV{OUTBOX_SRC} // "$FindBin::RealBin/../..";
my $examples = "$src/examples";
-f "$examples/setup.sql" or BAIL_OUT("no examples/ in $src (set OUTBOX_SRC to the checkout)");
my $python = $ENV{OUTBOX_PYTHON} // '/usr/bin/python3';
my $timeout = $PostgreSQL::Test::Utils::timeout_default;

# The commands of one run: more than the publishers' batch of 10, so that B
# takes over A's whole batch and claims the rest itself.
my $count = 12;
my $batch = 10;

# SQLSTATE of a stale lease token.
my $lease_not_owned = 'OB001';

# The worker is kept out of the example databases: no sweep runs behind the
# staged takeover's back.
my $node = outbox_node('examples', "outbox.databases = 'postgres'\n");

# node-postgres, at the version examples/node/package.json pins, installed
# into a copy of examples/node in this test's directory (npm's cache too).
my $tmp = PostgreSQL::Test::Utils::tempdir;
my $nodedir = "$tmp/node";
mkdir $nodedir or die "mkdir $nodedir: $!";
copy("$examples/node/$_", "$nodedir/$_") or die "copy $_: $!"
  for qw(package.json producer.js publisher.js consumer.js);
copy("$src/test/node/driver_checks.js", "$nodedir/driver_checks.js") or die "copy driver_checks.js: $!";
my $pinned = decode_json(slurp_file("$nodedir/package.json"))->{dependencies}{pg};
like($pinned, qr/^\d+\.\d+\.\d+$/, "package.json pins pg to one version ($pinned)");
{
	local $ENV{HOME} = $tmp;
	local $ENV{npm_config_cache} = "$tmp/npm-cache";
	local $ENV{npm_config_update_notifier} = 'false';
	my ($out, $err);
	my $ok = IPC::Run::run([ 'npm', 'install', '--no-audit', '--no-fund', '--loglevel=error' ],
		'<', \undef, '>', \$out, '2>', \$err, init => sub { chdir $nodedir or die "chdir: $!" },
		IPC::Run::timeout(600));
	ok($ok, 'npm install of the Node.js example') or diag($err);
	my $installed = -f "$nodedir/node_modules/pg/package.json"
	  ? decode_json(slurp_file("$nodedir/node_modules/pg/package.json"))->{version} : 'none';
	is($installed, $pinned, 'npm installed pg at the pinned version');
}

# The command line of one part of one language's example.
sub example
{
	my ($lang, $part, @args) = @_;
	return $lang eq 'python'
	  ? [ $python, "$examples/python/$part.py", @args ]
	  : [ 'node', "$nodedir/$part.js", @args ];
}

# Run a command to its end as login role $role of database $db, standard
# input $in; returns (success, stdout, stderr).
sub run_as
{
	my ($role, $db, $in, $cmd) = @_;
	my ($out, $err) = ('', '');
	local @ENV{qw(PGHOST PGPORT PGDATABASE PGUSER)} = ($node->host, $node->port, $db, $role);
	my $ok = IPC::Run::run($cmd, '<', \$in, '>', \$out, '2>', \$err, IPC::Run::timeout($timeout));
	return ($ok, $out, $err);
}

# Run one part of one language's example to its end.
sub run_part
{
	my ($lang, $role, $db, $in, $part, @args) = @_;
	return run_as($role, $db, $in, example($lang, $part, @args));
}

# Run a driver check script as drv_app of database drivers and compare its
# "name: value" lines with @want ([name, value, description] each).
sub driver_checks
{
	my ($lang, $cmd, @want) = @_;
	my ($ok, $out, $err) = run_as('drv_app', 'drivers', '', $cmd);
	ok($ok, "$lang: the driver checks run") or diag($err);
	my %got = map { /^([^:]+): (.*)$/ ? ($1 => $2) : () } split /\n/, $out;
	is($got{ $_->[0] } // '(missing)', $_->[1], "$lang: $_->[2]") foreach @want;
}

sub lines { my ($s) = @_; return scalar(() = $s =~ /\n/g); }

foreach my $lang ('python', 'node')
{
	my $db = "shop_$lang";
	my $run = "$lang-run";
	$node->safe_psql('postgres', "CREATE DATABASE $db");
	$node->safe_psql($db, 'CREATE EXTENSION outbox');
	my ($rc, $stdout, $stderr) = $node->psql($db, slurp_file("$examples/setup.sql"),
		extra_params => [ '-v', 'ON_ERROR_STOP=1' ]);
	is($rc, 0, "$lang: examples/setup.sql runs") or diag($stderr);
	# (the shop_* login roles belong to the cluster: the second database's
	# setup reuses them and grants them this database's group roles)

	# Producer: every order has its command; a second run is a retry.
	my ($ok, $out, $err) = run_part($lang, 'shop_producer', $db, '', 'producer', $run, $count);
	ok($ok, "$lang: the producer succeeds") or diag($err);
	like($err, qr/, 0 decisions already recorded/, "$lang: every decision was recorded by this run");
	# Its retry records nothing new: commit_decision(s) answer false.
	($ok, $out, $err) = run_part($lang, 'shop_producer', $db, '', 'producer', $run, $count);
	ok($ok, "$lang: the producer's retry succeeds") or diag($err);
	like($err, qr/, $count decisions already recorded/, "$lang: the retry finds all $count decisions recorded");
	is($node->safe_psql($db, q{SELECT (SELECT count(*) FROM shop_orders) || ' ' || (SELECT count(*) FROM outbox.commands)
			|| ' ' || (SELECT count(*) FROM outbox.events)}),
		"$count $count $count", "$lang: still $count orders, commands and events after the retry");
	is( $node->safe_psql(
			$db, qq{SELECT count(*) FROM shop_orders o
			 JOIN outbox.commands c ON c.command_id = o.order_id || '/charge'
			WHERE c.run_id = '$run' AND c.status = 'pending' AND c.kind = 'charge_card'
			  AND c.payload = jsonb_build_object('order_id', o.order_id, 'amount_cents', o.amount_cents)}),
		$count, "$lang: $count orders, each with its pending charge_card command");

	# Publisher A claims a batch under a 2-second lease; its broker holds
	# the confirmations back.
	my ($a_in, $a_out, $a_err) = ('', '', '');
	my $a;
	{
		local @ENV{qw(PGHOST PGPORT PGDATABASE PGUSER)} = ($node->host, $node->port, $db, 'shop_publisher');
		$a = IPC::Run::start(example($lang, 'publisher', 'A', 2),
			'<', \$a_in, '>', \$a_out, '2>', \$a_err, IPC::Run::timeout($timeout));
	}
	$a->pump while lines($a_out) < $batch;
	is(lines($a_out), $batch, "$lang: publisher A sent a batch of $batch and waits for its broker");
	is($node->safe_psql($db, q{SELECT count(*) FROM outbox.commands WHERE status = 'sending' AND owner = 'A'}),
		$batch, "$lang: A holds $batch leases");
	$node->poll_query_until($db,
		q{SELECT count(*) = 0 FROM outbox.commands WHERE status = 'sending' AND lease_until >= clock_timestamp()})
	  or die "A's leases never expired";

	# Publisher B takes A's batch over and claims the rest; its broker
	# confirms everything at once.
	my ($b_ok, $b_out, $b_err) = run_part($lang, 'shop_publisher', $db, "ok\n" x $count, 'publisher', 'B', 60);
	ok($b_ok, "$lang: publisher B succeeds") or diag($b_err);
	is(lines($b_out), $count, "$lang: B sent all $count commands");
	my $after_b = $node->safe_psql($db,
		q{SELECT status || ' ' || owner || ' d' || deliveries || ' ' || count(*)
			FROM outbox.commands GROUP BY status, owner, deliveries ORDER BY 1});
	is($after_b, "published B d1 " . ($count - $batch) . "\npublished B d2 $batch",
		"$lang: B published all, $batch of them taken over from A");

	# A's broker confirms now: every ack of A meets a stale token.
	$a_in .= "ok\n" x $batch;
	my $a_ok = eval { $a->finish };
	ok($a_ok, "$lang: publisher A goes on after its stale acks and ends cleanly") or diag($a_err);
	is(scalar(() = $a_err =~ /\b$lease_not_owned\b/g), $batch,
		"$lang: A saw $lease_not_owned for each of its $batch acks and dropped the command");
	is($node->safe_psql($db,
			q{SELECT status || ' ' || owner || ' d' || deliveries || ' ' || count(*)
				FROM outbox.commands GROUP BY status, owner, deliveries ORDER BY 1}),
		$after_b, "$lang: A's stale acks changed nothing");

	# Consumer: both publishers' messages (the taken-over ones twice), then
	# all of them once more: one charge and one receipt per command.
	my $messages = $a_out . $b_out;
	is(lines($messages), $count + $batch, "$lang: the consumer gets " . ($count + $batch) . " messages");
	foreach my $round ('first delivery', 'redelivery')
	{
		($ok, $out, $err) = run_part($lang, 'shop_consumer', $db, $messages, 'consumer');
		ok($ok, "$lang: the consumer succeeds ($round)") or diag($err);
		is( $node->safe_psql(
				$db, qq{SELECT (SELECT count(*) FROM shop_charges) || ' charges, '
				 || (SELECT count(DISTINCT command_id) FROM shop_charges) || ' commands charged, '
				 || (SELECT count(*) FROM outbox.receipts WHERE outcome = 'done') || ' receipts, '
				 || (SELECT count(*) FROM outbox.inbox WHERE consumer = 'billing') || ' accepted'}),
			"$count charges, $count commands charged, $count receipts, $count accepted",
			"$lang: one charge, one receipt and one inbox entry per command ($round)");
	}
	is( $node->safe_psql(
			$db, q{SELECT count(*) FROM outbox.receipts r
			 JOIN shop_charges ch ON ch.command_id = r.command_id
			 JOIN shop_orders o ON o.order_id = ch.order_id AND o.amount_cents = ch.amount_cents
			WHERE (r.detail->>'charge_id')::bigint = ch.id}),
		$count, "$lang: each receipt names the charge of its own order (written together)");
	is($node->safe_psql($db, q{SELECT string_agg(check_name, ', ') FROM outbox.conservation
			WHERE severity = 'error' AND violations > 0}),
		'', "$lang: the conservation checks are clean");
}

# What node-postgres makes of the API (docs/drivers.md), in a database of
# its own, as a role that produces, publishes and consumes.
$node->safe_psql('postgres', 'CREATE DATABASE drivers');
$node->safe_psql('drivers', 'CREATE EXTENSION outbox');
$node->safe_psql('drivers', q{CREATE ROLE drv_app LOGIN;
	CREATE ROLE drv_other;
	SELECT format('GRANT %I, %I, %I TO drv_app', outbox.role('producer'), outbox.role('publisher'),
		outbox.role('consumer')) \gexec
	SELECT outbox.register_consumer('drv-consumer', 'drv_app');
	SELECT outbox.register_consumer('other-consumer', 'drv_other');});
is($node->safe_psql('drivers', q{SELECT string_agg(proname || '/' || pronargs, ', ') FROM (
		SELECT proname, pronargs FROM pg_proc WHERE pronamespace = 'outbox'::regnamespace
		 GROUP BY proname, pronargs HAVING count(*) > 1) AS same}),
	'', 'no two functions of the API have one name and one number of arguments');
driver_checks(
	'node', [ 'node', "$nodedir/driver_checks.js" ],
	[ 'seq', 'string 9007199254740993', 'int8 comes back as a string, exact beyond 2^53' ],
	[ 'version', 'string', 'version (int8) is a string' ],
	[ 'deliveries', 'number', 'deliveries (int4) is a number' ],
	[ 'payload', '{"n":1}', 'a jsonb payload from a plain object comes back parsed' ],
	[ 'lease_until', 'Date', 'lease_until (timestamptz) is a Date' ],
	[ 'ack of a forged token', 'OB001', 'ack($1, $2) resolves without a cast; a forged token is OB001' ],
	[ 'ack_many', 'true/null false/invalid_token', 'ack_many($1, $2) takes a JS array of tokens' ],
	[ 'ack after ack_many', 'OB001', 'a token acked by ack_many is stale for ack' ],
	[ 'same command id', '23505 commands_pkey', 'a taken command id: 23505 naming commands_pkey' ],
	[ 'same event', '23505 events_pkey', 'a taken (run_id, seq): 23505 naming events_pkey' ],
	[ 'same decision again', 'false', "the same role's same decision again is a retry: false, no error" ],
	[ 'batch', '1:b-1:true 2:b-2:true', 'commit_decisions takes JSON.stringify of an array, seq as a string' ],
	[ 'batch again', 'false false', 'the same batch again: a row per decision, recorded false' ],
	[ 'repeat within a batch', '23505 1,3', 'a repeat within a batch: 23505 naming both positions' ],
	[ 'empty batch', '0', 'an empty batch' ],
	[ 'array as jsonb', '22P02', 'a JS array as jsonb is refused (sent as an array literal)' ],
	[ 'stringified array as jsonb', 'no error', 'JSON.stringify of an array is taken as jsonb' ],
	[ 'lease as an object', 'under a minute', 'a JS object as a lease becomes seconds (the trap drivers.md shows)' ],
	[ 'lease as text', 'over a minute', 'a lease as text is what it says' ],
	[ 'accept', 'true', 'inbox_accept(consumer, run_id, command_id) the first time: true' ],
	[ 'accept again', 'false', 'inbox_accept again: false' ],
	[ 'accept an unknown command', 'OB002', 'inbox_accept of an unknown command: OB002' ],
	[ 'accept for an unregistered consumer', 'OB003', 'inbox_accept for an unregistered consumer: OB003' ],
	[ "accept for another role's consumer", 'OB004', "inbox_accept under another role's consumer name: OB004" ],
	[ 'complete an unknown command', 'OB002', 'complete of an unknown command: OB002' ],
	[ 'complete', 'true', 'complete(run_id, command_id, outcome, detail) with a JS object as detail' ],
	[ 'fail of a long error', 'drv-6 pending', 'fail takes an error text over 4,096 bytes' ],
	[ 'after an error in a transaction', '25P02', 'a failed call aborts the transaction' ],
	[ 'after a rolled back savepoint', 'no error', 'a savepoint keeps the transaction' ],
);
is($node->safe_psql('drivers', q{SELECT octet_length(last_error) <= 4096 AND last_error LIKE '%é [... cut]'
		FROM outbox.commands WHERE command_id = 'drv-6'}),
	't', "node: fail's long error is kept cut at a character boundary, and marked as cut");

# The same for psycopg 3.
driver_checks(
	'python', [ $python, "$src/test/python/driver_checks.py" ],
	[ 'bare dict as jsonb', 'driver: ProgrammingError', 'a bare dict is refused by the driver (Jsonb() is needed)' ],
	[ 'seq', 'int 9007199254740993', 'int8 is an int, exact beyond 2^53' ],
	[ 'payload', "dict {'n': 1}", 'a jsonb payload comes back as a dict' ],
	[ 'lease_until', 'aware datetime', 'lease_until (timestamptz) is an aware datetime' ],
	[ 'timedelta lease', 'over 4 minutes', 'a timedelta is the lease it says' ],
	[ 'ack of a forged token', 'OB001', 'a forged token is OB001' ],
	[ 'ack', 'no error', "ack with claim's token" ],
	[ 'same decision again', 'False', "the same role's same decision again is a retry: False, no error" ],
	[ 'same command id', '23505 commands_pkey', 'a taken command id: 23505 naming commands_pkey' ],
	[ '1 mon', '30 days', 'an interval of a month comes back as 30 days' ],
	[ 'naive datetime is UTC', 'False', "a naive datetime is read in the session's TimeZone" ],
	[ 'aware datetime is UTC', 'True', 'an aware datetime is what it says' ],
	[ 'in a savepoint', 'OB001', 'a nested transaction block is a savepoint the error undoes' ],
	[ 'after the savepoint', 'no error', 'the outer transaction goes on after the savepoint' ],
);

$node->stop;
done_testing();
