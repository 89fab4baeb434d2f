# Helpers of the relay's broker tests (test/t/05x_relay_*.pl): processes
# that are stopped even when the test dies, waits on conditions, the
# commands of a test run, and the end-of-test conservation check.
package OutboxBroker;

use strict;
use warnings;
use Exporter 'import';
use POSIX ();
use Time::HiRes qw(usleep);
use PostgreSQL::Test::Utils;
use Test::More;

our @EXPORT = qw(track_pid untrack_pid wait_exit wait_match wait_until
  relay_has_sink produce_runs conservation_clean start_kafka_mock);

my @tracked;

# Remember a child to kill (SIGKILL) at exit if it is still running.
sub track_pid { push @tracked, @_; return $_[0]; }

# Forget a child that has exited.
sub untrack_pid { my %gone = map { $_ => 1 } @_; @tracked = grep { !$gone{$_} } @tracked; }

END
{
	local $?;
	for my $pid (@tracked)
	{
		kill 'KILL', $pid;
		waitpid($pid, 0);
	}
}

# Wait for a child to exit; its exit code, or undef after the timeout
# (the child is then killed).
sub wait_exit
{
	my ($pid) = @_;
	my $deadline = time() + $PostgreSQL::Test::Utils::timeout_default;
	while (time() < $deadline)
	{
		my $r = waitpid($pid, POSIX::WNOHANG());
		if ($r == $pid)
		{
			untrack_pid($pid);
			return $? >> 8;
		}
		usleep(50_000);
	}
	kill 'KILL', $pid;
	waitpid($pid, 0);
	untrack_pid($pid);
	return undef;
}

# Wait until a file matches a pattern; true if it did.
sub wait_match
{
	my ($path, $re) = @_;
	return wait_until(sub { -e $path && slurp_file($path) =~ $re });
}

# Wait until a sub returns true; true if it did.
sub wait_until
{
	my ($cond) = @_;
	my $deadline = time() + $PostgreSQL::Test::Utils::timeout_default;
	while (time() < $deadline)
	{
		return 1 if $cond->();
		usleep(100_000);
	}
	return 0;
}

# True when outbox-relay on PATH was built with the sink NAME.
sub relay_has_sink
{
	my ($name) = @_;
	my $help = `outbox-relay --help`;
	return $help =~ /^Sinks \(built with: [^)]*\b\Q$name\E\b/m;
}

# Commit $n commands, one transaction each, spread over $runs runs named
# "$prefix-rR": command "$prefix-rR-I" is the I-th command overall, of
# kind $kind_of->(R).  Returns nothing.
sub produce_runs
{
	my ($node, $prefix, $n, $runs, $kind_sql) = @_;
	$node->safe_psql('postgres', qq{
DO \$\$
DECLARE r int;
BEGIN
	FOR i IN 1..$n LOOP
		r := i % $runs;
		PERFORM outbox.commit_decision('$prefix-r' || r, i, 'decided',
			'$prefix-r' || r || '-' || i, $kind_sql, pg_catalog.jsonb_build_object('i', i));
		COMMIT;
	END LOOP;
END
\$\$;});
}

# The extension's conservation checks are all clean.
sub conservation_clean
{
	my ($node, $what) = @_;
	is($node->safe_psql('postgres', 'SELECT coalesce(sum(violations), 0) FROM outbox.conservation'),
		'0', "$what: outbox.conservation all zero")
	  or diag($node->safe_psql('postgres', 'SELECT * FROM outbox.conservation'));
	my ($rc, $out, $err) = $node->psql('postgres', 'SELECT outbox.verify()');
	is($rc, 0, "$what: outbox.verify() passes") or diag($err);
}

# Start librdkafka's mock cluster (test/kafka-mock) with the topic $topic
# of $partitions partitions, its answers in $tmp/mock.out and its errors in
# $tmp/mock.err, stopped at exit; checks that it started.  Returns its pid,
# the (autoflushed) pipe to its commands, and its bootstrap address.
sub start_kafka_mock
{
	my ($mockbin, $tmp, $topic, $partitions) = @_;
	my $pid = open(my $mock, '|-', "exec '$mockbin' $topic $partitions > '$tmp/mock.out' 2> '$tmp/mock.err'")
	  // die "kafka-mock: $!";
	track_pid($pid);
	$mock->autoflush(1);
	ok(wait_match("$tmp/mock.out", qr/^bootstrap \S+/m), 'mock cluster started');
	my ($bootstrap) = slurp_file("$tmp/mock.out") =~ /^bootstrap (\S+)/m;
	return ($pid, $mock, $bootstrap);
}

1;
