# Helpers shared by the Perl TAP tests in test/t.
package OutboxTest;

use strict;
use warnings;
use Exporter 'import';
use POSIX ();
use PostgreSQL::Test::Cluster;

our @EXPORT = qw(outbox_node spawn);

# A started cluster that preloads outbox; $extra lines go to postgresql.conf.
sub outbox_node
{
	my ($name, $extra) = @_;
	my $node = PostgreSQL::Test::Cluster->new($name);
	$node->init;
	$node->append_conf('postgresql.conf',
		"shared_preload_libraries = 'outbox'\n" . ($extra // ''));
	$node->start;
	return $node;
}

# Start a program in the background, stdout and stderr appended to files.
sub spawn
{
	my ($out, $err, @cmd) = @_;
	my $pid = fork() // die "fork: $!";
	if ($pid == 0)
	{
		# never return into the test (its END blocks would stop the node)
		open(STDIN, '<', '/dev/null') or POSIX::_exit(127);
		open(STDOUT, '>>', $out) or POSIX::_exit(127);
		open(STDERR, '>>', $err) or POSIX::_exit(127);
		exec(@cmd) or POSIX::_exit(127);
	}
	return $pid;
}

1;
