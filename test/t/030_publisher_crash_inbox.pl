# A publisher killed after sending and before acking.  Publisher A (a psql
# session) claims five commands with a short lease and delivers them to a
# consumer, which applies each in one transaction: inbox_accept, a business
# row, complete.  A's backend is then killed before it acks.  Once the lease
# has expired, publisher B takes the commands over and delivers them again;
# the consumer's inbox turns the redeliveries into no-ops, so each command
# has exactly one business row.  A's late ack is refused, B's is accepted,
# and the conservation views stay empty throughout.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use FindBin;
use lib "$FindBin::RealBin/../perl";
use OutboxTest;

my $node = outbox_node('crash_inbox');
$node->safe_psql('postgres', 'CREATE EXTENSION outbox');

# The consumer's business table has no unique key: only the inbox keeps a
# redelivered command from shipping twice.
$node->safe_psql('postgres',
	'CREATE TABLE shipments (command_id text NOT NULL, qty int NOT NULL)');

$node->safe_psql('postgres', q{
	SELECT outbox.commit_decision('order-run', i, 'order_placed', 'ship-' || i, 'ship',
								  jsonb_build_object('qty', i))
	  FROM generate_series(1, 5) AS i;
	SELECT outbox.register_consumer('shipping', current_user::text::regrole)});

# The consumer: one transaction per delivered message, doing the business
# write only when the inbox accepts the command.  Returns what inbox_accept
# and complete answered, as "t t" or "f f".
sub consume
{
	my ($id, $qty) = @_;
	my $out = $node->safe_psql('postgres', qq{
		BEGIN;
		WITH a AS (SELECT outbox.inbox_accept('shipping', 'order-run', '$id') AS ok),
			 w AS (INSERT INTO shipments (command_id, qty) SELECT '$id', $qty FROM a WHERE a.ok)
		SELECT ok FROM a;
		SELECT outbox.complete('order-run', '$id', 'shipped');
		COMMIT;});
	return join(' ', split /\n/, $out);
}

# Sum of violations over all conservation checks, and the names of those
# with violations.
sub conservation
{
	return $node->safe_psql('postgres', q{
		SELECT sum(violations) || coalesce(' ' || string_agg(check_name, ',')
										   FILTER (WHERE violations > 0), '')
		  FROM outbox.conservation});
}

# Publisher A claims everything with a 3-second lease and sends it.
my $pub_a = $node->background_psql('postgres');
my $a_pid = $pub_a->query_safe('SELECT pg_backend_pid()');
my @leases_a = map { [ split /\|/ ] } split /\n/, $pub_a->query_safe(q{
	SELECT command_id, token, payload->>'qty'
	  FROM outbox.claim('pub-a', 10, interval '3 seconds') ORDER BY command_id});
is(scalar @leases_a, 5, 'publisher A claims the five commands');

my @first = map { consume($_->[0], $_->[2]) } @leases_a;
is_deeply(\@first, [ ('t t') x 5 ],
	'the consumer accepts and completes each command on first delivery');

# A dies before it acks.
$node->safe_psql('postgres', "SELECT pg_terminate_backend($a_pid)");
$node->poll_query_until('postgres',
	"SELECT count(*) = 0 FROM pg_stat_activity WHERE pid = $a_pid")
  or die 'publisher A never went away';
$pub_a->quit;

is( $node->safe_psql('postgres',
		q{SELECT count(*) || ' ' || min(holder) FROM outbox.leases}),
	'5 pub-a',
	'the commands stay leased to the dead publisher: no ack arrived');
is(conservation(), '0', 'a dead publisher with live leases violates nothing');

# After the lease expires, publisher B takes over and redelivers.
$node->poll_query_until('postgres',
	q{SELECT count(*) = 5 AND bool_and(expired) FROM outbox.leases WHERE holder = 'pub-a'})
  or die 'the leases of publisher A never expired';
is(conservation(), '0', 'expired leases violate nothing');

my @leases_b = map { [ split /\|/ ] } split /\n/, $node->safe_psql('postgres', q{
	SELECT command_id, token, payload->>'qty', deliveries
	  FROM outbox.claim('pub-b', 10, interval '30 seconds') ORDER BY command_id});
is(scalar @leases_b, 5, 'publisher B takes the five commands over');
is_deeply([ map { $_->[3] } @leases_b ], [ (2) x 5 ], 'each is in its second delivery');

my @second = map { consume($_->[0], $_->[2]) } @leases_b;
is_deeply(\@second, [ ('f f') x 5 ],
	'the redeliveries are recognised by the inbox and the receipt');

# A's token is stale; B acks the batch.
my ($rc, $out, $err) = $node->psql('postgres',
"\\set VERBOSITY verbose\nSELECT outbox.ack('pub-a', '$leases_a[0][1]')");
isnt($rc, 0, "A's late ack fails");
like($err, qr/OB001: lease_not_owned/, 'A is told lease_not_owned');

my $tokens = join(',', map { "'$_->[1]'" } @leases_b);
is( $node->safe_psql('postgres',
		"SELECT count(*) FILTER (WHERE acked) FROM outbox.ack_many('pub-b', ARRAY[$tokens])"
	),
	'5',
	'B acks the batch');

# One business outcome per command.
is( $node->safe_psql('postgres',
		q{SELECT count(*) || ' ' || count(DISTINCT command_id) || ' ' || sum(qty) FROM shipments}),
	'5 5 15',
	'exactly one business row per command');
is($node->safe_psql('postgres', q{SELECT count(*) FROM outbox.inbox WHERE consumer = 'shipping'}),
	'5', 'one inbox entry per command');
is( $node->safe_psql('postgres',
		q{SELECT string_agg(status || '/' || deliveries || '/' || owner, ',' ORDER BY command_id)
		    FROM outbox.commands}),
	join(',', ('published/2/pub-b') x 5),
	'every command ends published by B after two deliveries');
is( $node->safe_psql('postgres',
		q{SELECT count(*) || ' ' || min(outcome) FROM outbox.receipts}),
	'5 shipped', 'one receipt per command');

is(conservation(), '0', 'the conservation views are empty');
is( $node->safe_psql('postgres', q{
		SELECT (SELECT count(*) FROM outbox.check_decisions_without_command)
			 + (SELECT count(*) FROM outbox.check_orphan_commands)
			 + (SELECT count(*) FROM outbox.check_orphan_receipts)
			 + (SELECT count(*) FROM outbox.check_state)
			 + (SELECT count(*) FROM outbox.check_receipt_overdue)}),
	'0', 'every check view is empty');
($rc, $out, $err) = $node->psql('postgres', 'SELECT outbox.verify(include_warnings => true)');
is($rc, 0, 'verify() is silent');
is($err, '', 'verify() warns about nothing');

$node->stop;
done_testing();
