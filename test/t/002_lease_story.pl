# The classic lease story, with real time and short leases, told by two
# publisher roles: pub1's worker relay-A claims cmd-1; a claim before A's
# lease expires gets nothing; pub2 tries every forgery the 0.1.0 API let
# through (a guessed token, the version an error used to print, the 0.1.0
# call itself, A's real token from another role, a renewal to hold the lease
# forever, a fatal fail); each is refused with OB001 and changes nothing,
# and no error names the holder, its version or its token.  After expiry
# pub2's relay-B takes cmd-1 over; A's late ack is refused; B's ack
# succeeds; the command ends published with deliveries = 2.  A member of
# the database's outbox admin role may use another role's token.
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

# This database's publisher and admin group roles.
my $pubrole = $node->safe_psql('postgres',
	q{SELECT COALESCE(to_regrole(current_database() || '_outbox_publisher')::text, 'outbox_publisher')});
my $admrole = $node->safe_psql('postgres', q{SELECT current_database() || '_outbox_admin'});
$node->safe_psql('postgres', qq{
	DO \$\$ BEGIN
		IF to_regrole('$admrole') IS NULL THEN CREATE ROLE "$admrole" NOLOGIN; END IF;
	END \$\$;
	CREATE ROLE pub1; CREATE ROLE pub2; CREATE ROLE ops;
	GRANT "$pubrole" TO pub1, pub2, ops;
	GRANT "$admrole" TO ops;
});

$node->safe_psql('postgres',
	q{SELECT outbox.commit_decision('run-1', 1, 'trip_requested', 'cmd-1', 'lock_budget', '{"amount": 900}')});

# Run SQL as a role; return (rc, stdout, stderr).
sub as_role
{
	my ($role, $sql) = @_;
	my ($out, $err);
	my $rc = $node->psql('postgres', "SET ROLE $role;\n$sql", stdout => \$out, stderr => \$err);
	return ($rc, $out, $err);
}

# What cmd-1's row holds now (its lease included).
my $row_sql = q{SELECT status || ' ' || owner || ' v' || version || ' d' || deliveries || ' ' || lease_until
				  FROM outbox.commands WHERE command_id = 'cmd-1'};

my ($rc, $out, $err) = as_role('pub1',
	q{SELECT command_id || ' v' || version || ' ' || token FROM outbox.claim('relay-A', 10, interval '3 seconds')});
is($rc, 0, 'pub1 claims');
my ($claimed, $tokA) = $out =~ /^(cmd-1 v2) (\S+)$/;
is($claimed, 'cmd-1 v2', 'relay-A claims cmd-1 with a 3 second lease');
like($tokA, qr/^[0-9a-f]{32}:[0-9]+:2:5:run-1:cmd-1$/, 'the token is a 128-bit MAC, the role, the version, the run_id and the command_id');
my ($secret) = $tokA =~ /^([0-9a-f]{32})/;
is($node->safe_psql('postgres', q{SELECT count(*) FROM outbox.claim('B', 10, interval '30 seconds')}),
	'0', 'nobody gets cmd-1 while relay-A holds a live lease');
my $before = $node->safe_psql('postgres', $row_sql);

# Every forgery pub2 tries: refused with OB001 and telling nothing.
my @forgeries = (
	[ 'ack with a guessed token', q{SELECT outbox.ack('guess', repeat('0', 32) || ':' || 'pub2'::regrole::oid || ':2:5:run-1:cmd-1')} ],
	[ 'ack under the holder name with a guessed token',
		q{SELECT outbox.ack('relay-A', repeat('0', 32) || ':' || 'pub2'::regrole::oid || ':2:5:run-1:cmd-1')} ],
	[ 'ack with the version as the secret',
		q{SELECT outbox.ack('relay-A', lpad('2', 32, '0') || ':' || 'pub1'::regrole::oid || ':2:5:run-1:cmd-1')} ],
	[ 'ack with the right token from another role', qq{SELECT outbox.ack('relay-A', '$tokA')} ],
	[ 'ack_many with the right token from another role',
		qq{SELECT CASE WHEN acked THEN 'acked' ELSE 'refused' END FROM outbox.ack_many('relay-A', ARRAY['$tokA'])} ],
	[ 'renew with a guessed token', q{SELECT outbox.renew('relay-A', repeat('f', 32) || ':' || 'pub2'::regrole::oid || ':2:5:run-1:cmd-1', interval '1 day')} ],
	[ 'renew with the right token from another role', qq{SELECT outbox.renew('relay-A', '$tokA', interval '1 day')} ],
	[ 'fatal fail with a guessed token',
		q{SELECT outbox.fail('relay-A', repeat('1', 32) || ':' || 'pub1'::regrole::oid || ':2:5:run-1:cmd-1', 'x', true)} ],
	[ 'fatal fail with the right token from another role',
		qq{SELECT outbox.fail('relay-A', '$tokA', 'x', true)} ]);
foreach my $f (@forgeries)
{
	my ($name, $sql) = @$f;
	($rc, $out, $err) = as_role('pub2', "\\set VERBOSITY verbose\n$sql");
	if ($name =~ /^ack_many/)
	{
		is($out, 'refused', "$name: reported refused, not raised");
		next;
	}
	isnt($rc, 0, "$name: refused");
	like($err, qr/ERROR:  OB001: lease_not_owned: worker "[^"]+" does not hold command "cmd-1"/, "$name: OB001");
	unlike($err, qr/version|\Q$secret\E|taken over by/, "$name: the error shows no version, token or holder");
}
# The 0.1.0 call that the issue's attacker made does not exist any more.
($rc, $out, $err) = as_role('pub2', q{SELECT outbox.ack('cmd-1', 'relay-A', 2)});
like($err, qr/function outbox\.ack\(unknown, unknown, integer\) does not exist/, 'the (command_id, worker, version) ack is gone');
# Renew forever: the holder itself may not go past outbox.max_lease, nor
# with months counted as 30 days.
($rc, $out, $err) = as_role('pub1', qq{SELECT outbox.renew('relay-A', '$tokA', interval '1000 mons -29999 days')});
like($err, qr/lease is longer than outbox.max_lease/, 'a renewal of 437 days written as months is refused');
is($node->safe_psql('postgres', $row_sql), $before, 'no forgery changed cmd-1 (status, holder, version, lease end)');

$node->poll_query_until('postgres', q{SELECT lease_until < clock_timestamp() FROM outbox.commands WHERE command_id = 'cmd-1'})
  or die 'lease never expired';

($rc, $out, $err) = as_role('pub2',
	q{SELECT command_id || ' v' || version || ' d' || deliveries || ' ' || token FROM outbox.claim('relay-B', 10, interval '30 seconds')});
my ($took, $tokB) = $out =~ /^(\S+ v\d+ d\d+) (\S+)$/;
is($took, 'cmd-1 v3 d2', 'after expiry relay-B takes cmd-1 over with a new token');
isnt($tokB, $tokA, 'the takeover has a new token');

($rc, $out, $err) = as_role('pub1', qq{\\set VERBOSITY verbose\nSELECT outbox.ack('relay-A', '$tokA')});
isnt($rc, 0, "relay-A's late ack fails");
like($err, qr/OB001: lease_not_owned: worker "relay-A" does not hold command "cmd-1"/, 'relay-A is told lease_not_owned');
unlike($err, qr/relay-B|version/, 'the error names neither the new holder nor its version');
($rc, $out, $err) = as_role('pub1', qq{SELECT outbox.ack('relay-B', '$tokB')});
like($err, qr/lease_not_owned/, "pub1 cannot use relay-B's token either");

($rc, $out, $err) = as_role('pub2', qq{SELECT outbox.ack('relay-B', '$tokB')});
is($rc, 0, "relay-B's ack succeeds");
is($node->safe_psql('postgres', q{SELECT status || ' ' || deliveries || ' ' || owner FROM outbox.commands WHERE command_id = 'cmd-1'}),
	'published 2 relay-B', 'cmd-1 ends published with deliveries = 2');

# A member of the admin role may act on another role's lease with its token
# (and the worker's name), for repairs.
$node->safe_psql('postgres', q{SELECT outbox.commit_decision('run-1', 2, 'e', 'cmd-2', 'lock_budget', '{}')});
($rc, $out, $err) = as_role('pub1', q{SELECT token FROM outbox.claim('relay-A', 10, interval '1 minute')});
my $tok2 = $out;
($rc, $out, $err) = as_role('ops', qq{SELECT outbox.renew('relay-A', '$tok2', interval '2 minutes') > now() + interval '90 seconds'});
is($out, 't', 'an outbox admin renews another role\'s lease with its token');
($rc, $out, $err) = as_role('ops', qq{SELECT outbox.ack('relay-A', '$tok2')});
is($rc, 0, 'an outbox admin acks it');
is($node->safe_psql('postgres', q{SELECT status FROM outbox.commands WHERE command_id = 'cmd-2'}),
	'published', 'cmd-2 is published');

$node->stop;
done_testing();
