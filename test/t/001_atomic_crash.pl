# Atomic intent survives exceptions and crashes:
# - an exception in the middle of a transaction that already called
#   commit_decision leaves neither the event nor the command;
# - a server killed with SIGKILL right after a commit keeps both.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use FindBin;
use lib "$FindBin::RealBin/../perl";
use OutboxTest;

my $node = outbox_node('atomic');
$node->safe_psql('postgres', 'CREATE EXTENSION outbox');

sub counts
{
	my ($run) = @_;
	return $node->safe_psql('postgres',
		"SELECT (SELECT count(*) FROM outbox.events WHERE run_id = '$run') || '/' || "
		  . "(SELECT count(*) FROM outbox.commands WHERE run_id = '$run')");
}

# An error after the decision, in the same transaction.
my ($rc, $out, $err) = $node->psql('postgres', q{
	BEGIN;
	SELECT outbox.commit_decision('run-x', 1, 'trip_requested', 'cmd-x', 'lock_budget', '{"amount": 900}');
	SELECT 1 / 0;
	COMMIT;
});
like($err, qr/division by zero/, 'the transaction failed after the decision');
is(counts('run-x'), '0/0', 'an error mid-transaction leaves neither event nor command');

# An exception raised inside a function after the decision.
($rc, $out, $err) = $node->psql('postgres', q{
	DO $$
	BEGIN
		PERFORM outbox.commit_decision('run-y', 1, 'e', 'cmd-y', 'k', '{}');
		PERFORM outbox.record_event('run-y', 2, 'after');
		RAISE EXCEPTION 'business rule broken';
	END;
	$$;
});
like($err, qr/business rule broken/, 'the function raised after the decision');
is(counts('run-y'), '0/0', 'an exception after commit_decision leaves nothing');

# The session dies in the middle of the transaction.
my $bg = $node->background_psql('postgres');
$bg->query_safe(q{BEGIN});
$bg->query_safe(q{SELECT outbox.commit_decision('run-z', 1, 'e', 'cmd-z', 'k', '{}')});
my $bgpid = $bg->query_safe('SELECT pg_backend_pid()');
$node->safe_psql('postgres', "SELECT pg_terminate_backend($bgpid)");
$bg->quit;
$node->poll_query_until('postgres', "SELECT count(*) = 0 FROM pg_stat_activity WHERE pid = $bgpid")
  or die 'backend did not exit';
is(counts('run-z'), '0/0', 'a session killed mid-transaction leaves nothing');

# Committed decisions survive SIGKILL of the whole server right after COMMIT.
$node->safe_psql('postgres', q{
	SELECT outbox.commit_decision('run-k', g, 'e', 'cmd-k-' || g, 'k', jsonb_build_object('g', g))
	  FROM generate_series(1, 50) g;
});
$node->safe_psql('postgres', q{SELECT outbox.commit_decision('run-k', 51, 'e', 'cmd-k-51', 'k', '{}')});
my $pid = $node->{_pid};
# The postmaster leads its own process group: kill it and all its children.
kill 'KILL', -$pid;
for (1 .. 300)
{
	last unless kill(0, -$pid);
	select(undef, undef, undef, 0.1);
}
ok(!kill(0, -$pid), 'the server and all its processes are gone');
$node->{_pid} = undef;
$node->start;
is(counts('run-k'), '51/51', 'every committed decision survived SIGKILL: events and commands');
is($node->safe_psql('postgres',
	q{SELECT count(*) FROM outbox.events e JOIN outbox.commands c ON c.command_id = e.command_id
	   WHERE e.run_id = 'run-k' AND c.status = 'pending' AND c.seq = e.seq}),
	'51', 'each event still names its pending command');

$node->stop;
done_testing();
