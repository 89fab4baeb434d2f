# The classic lease story, with real time and short leases: worker A claims
# cmd-1; B's claim before A's lease expires gets nothing; after expiry B takes
# it over; A's ack is refused with lease_not_owned; B's ack succeeds; the
# command ends published with deliveries = 2.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use FindBin;
use lib "$FindBin::RealBin/../perl";
use OutboxTest;

my $node = outbox_node('lease');
$node->safe_psql('postgres', 'CREATE EXTENSION outbox');
$node->safe_psql('postgres',
	q{SELECT outbox.commit_decision('run-1', 1, 'trip_requested', 'cmd-1', 'lock_budget', '{"amount": 900}')});

is($node->safe_psql('postgres', q{SELECT command_id || ' v' || version FROM outbox.claim('A', 10, interval '2 seconds')}),
	'cmd-1 v2', 'A claims cmd-1 with a 2 second lease');
is($node->safe_psql('postgres', q{SELECT count(*) FROM outbox.claim('B', 10, interval '30 seconds')}),
	'0', 'B gets nothing while A holds a live lease');

$node->poll_query_until('postgres', q{SELECT lease_until < clock_timestamp() FROM outbox.commands WHERE command_id = 'cmd-1'})
  or die 'lease never expired';

is($node->safe_psql('postgres', q{SELECT command_id || ' v' || version || ' d' || deliveries FROM outbox.claim('B', 10, interval '30 seconds')}),
	'cmd-1 v3 d2', 'after expiry B takes cmd-1 over with a new token');

my ($rc, $out, $err) = $node->psql('postgres', q{SELECT outbox.ack('cmd-1', 'A', 2)});
isnt($rc, 0, "A's late ack fails");
like($err, qr/lease_not_owned: worker "A" does not hold command "cmd-1" at version 2/, 'A is told lease_not_owned');
like($err, qr/taken over by worker "B"/, 'the detail names the new holder');

is($node->safe_psql('postgres', q{SELECT outbox.ack('cmd-1', 'B', 3)}), '', "B's ack succeeds");
is($node->safe_psql('postgres', q{SELECT status || ' ' || deliveries || ' ' || owner FROM outbox.commands WHERE command_id = 'cmd-1'}),
	'published 2 B', 'cmd-1 ends published with deliveries = 2');

$node->stop;
done_testing();
