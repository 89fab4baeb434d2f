# An immediate server crash under load loses no committed command, keeps
# every lease fenced, and leaves the conservation views empty.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use FindBin;
use lib "$FindBin::RealBin/../perl";
use OutboxTest;

my $node = outbox_node('crash', "max_connections = 30\n");
$node->safe_psql('postgres', 'CREATE EXTENSION outbox');

# Load from the side: two pgbench runs of two producers each, committing decisions until the crash cuts them off (their outcome is not known to the test).
my @bench;
for my $p (1 .. 2)
{
	my ($out, $err) = ('', '');
	my $script = "${PostgreSQL::Test::Utils::tmp_check}/producer$p.sql";
	PostgreSQL::Test::Utils::append_to_file($script,
		"\\set n random(1, 1000000000)\n"
		  . "SELECT outbox.commit_decision('bg$p-' || :client_id, :n, 'e', 'bg$p-' || :client_id || '-' || :n, 'k', '{}');\n");
	push @bench, IPC::Run::start(
		[ 'pgbench', '-n', '-c', '2', '-T', '60', '-f', $script, '-d', $node->connstr('postgres') ],
		'>', \$out, '2>', \$err);
}

# In the foreground: decisions whose commit the client saw, and a publisher
# claiming and acking as it goes.
my $producer = $node->background_psql('postgres');
my $publisher = $node->background_psql('postgres');
$publisher->query_safe('CREATE TEMP TABLE c (command_id text, token text)');
my @committed;
for my $i (1 .. 600)
{
	$producer->query_safe("SELECT outbox.commit_decision('fg', $i, 'e', 'fg-$i', 'k', jsonb_build_object('i', $i))");
	push @committed, "fg-$i";
	if ($i % 50 == 0)
	{
		$publisher->query_safe(q{
			TRUNCATE c;
			INSERT INTO c SELECT command_id, token FROM outbox.claim('fg-pub', 40, interval '1 hour');
			SELECT count(*) FROM outbox.ack_many('fg-pub', ARRAY(SELECT token FROM c)) WHERE acked});
	}
}
# One more claim whose lease is live at the crash (its tokens kept in a table).
$publisher->query_safe(q{CREATE TABLE live_tokens AS SELECT command_id, token FROM outbox.claim('fg-pub', 25, interval '1 hour')});

$node->stop('immediate');
$producer->quit;
$publisher->quit;
$_->finish for @bench;
$node->start;

my $present = $node->safe_psql('postgres',
	"SELECT count(*) FROM outbox.commands WHERE command_id = ANY (ARRAY['" . join("','", @committed) . "'])");
is($present, scalar(@committed), 'every decision the client saw committed survived the crash');
is($node->safe_psql('postgres', q{SELECT count(*) FROM outbox.events e WHERE e.run_id = 'fg'}),
	scalar(@committed), 'with its event');
cmp_ok($node->safe_psql('postgres', q{SELECT count(*) FROM outbox.commands WHERE run_id LIKE 'bg%'}),
	'>', 0, 'the background producers had committed too');
is($node->safe_psql('postgres', q{SELECT count(*) FROM outbox.commands WHERE status = 'sending' AND owner = 'fg-pub'}),
	'25', 'the live leases survived with their holder');
is($node->safe_psql('postgres', q{SELECT coalesce(sum(violations), -1) FROM outbox.conservation}),
	'0', 'the conservation views are empty after recovery');
is($node->safe_psql('postgres', q{SELECT count(*) FROM outbox.events e
	WHERE e.command_id IS NOT NULL AND NOT EXISTS (SELECT 1 FROM outbox.commands c WHERE c.command_id = e.command_id)}),
	'0', 'no event lost its command (checked directly as well)');

# The recovered outbox keeps working and stays fenced.
$node->safe_psql('postgres', q{UPDATE outbox.commands SET lease_until = clock_timestamp() - interval '1 second' WHERE owner = 'fg-pub' AND status = 'sending'});
is($node->safe_psql('postgres', q{SELECT count(*) FROM outbox.claim('after', 10000, interval '1 minute') WHERE deliveries = 2}),
	'25', 'the expired leases of the crashed publisher are taken over');
my ($rc, $out, $err) = $node->psql('postgres',
	q{\set VERBOSITY verbose
	  SELECT outbox.ack('fg-pub', token) FROM live_tokens LIMIT 1});
like($err, qr/OB001: lease_not_owned/, 'the crashed publisher cannot ack what was taken over');

$node->stop;
done_testing();
