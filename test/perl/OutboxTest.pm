# Helpers shared by the Perl TAP tests in test/t.
package OutboxTest;

use strict;
use warnings;
use Exporter 'import';
use POSIX ();
use Cwd ();
use File::Basename ();
use File::Path ();
use FindBin;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils ();

our @EXPORT = qw(outbox_node spawn outbox_release_install outbox_use_install);
our @EXPORT_OK = qw(notifications_after wait_notification);

# A started cluster that preloads outbox; $extra lines go to postgresql.conf,
# %params to PostgreSQL::Test::Cluster->new (install_path).
sub outbox_node
{
	my ($name, $extra, %params) = @_;
	my $node = PostgreSQL::Test::Cluster->new($name, %params);
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

# The commit each released version was built from.  outbox--VERSION.sql in
# the repository is that commit's install script, kept verbatim.
our %RELEASES = ('0.1.0' => '38cd9ad42e8aba9c0ecb19cc22a5ef132785aabb');

# An installation of PostgreSQL that offers the released VERSION of outbox
# instead of this build, for the upgrade tests: a copy of the bindir,
# pkglibdir and sharedir of pg_config ($ENV{PG_CONFIG} or the one on PATH)
# with the release's outbox.so, control file and install script, built
# from its commit (git archive of $ENV{OUTBOX_GIT_DIR}, default the source
# tree).  Made once per test run under tmp_check.  Returns the install_path
# for PostgreSQL::Test::Cluster->new and the directory of the built
# release (its sources and install script); dies when it cannot be made.
sub outbox_release_install
{
	my ($version) = @_;
	my $commit = $RELEASES{$version} // die "no release $version";
	my $dir = Cwd::abs_path($PostgreSQL::Test::Utils::tmp_check) . "/release-$version";
	my $pg_config = $ENV{PG_CONFIG} // 'pg_config';
	my %conf;
	foreach my $k (qw(bindir pkglibdir sharedir))
	{
		chomp($conf{$k} = qx{'$pg_config' --$k});
		die "$pg_config --$k failed" if $? || !$conf{$k};
	}
	# the common parent of the three: the copy keeps their relative places,
	# so that the relocatable binaries find their libraries and scripts
	my @parts = map { [ split m{/}, $_ ] } values %conf;
	my @root;
	for (my $i = 0;; $i++)
	{
		my $c = $parts[0][$i];
		last if !defined $c || grep { !defined $_->[$i] || $_->[$i] ne $c } @parts;
		push @root, $c;
	}
	my $root = join('/', @root);
	my %copy = map { $_ => "$dir/root" . substr($conf{$_}, length $root) } keys %conf;
	my $install_path = File::Basename::dirname($copy{bindir});
	return ($install_path, "$dir/src") if -e "$dir/done";

	File::Path::rmtree($dir);
	File::Path::make_path("$dir/src");
	my $git = $ENV{OUTBOX_GIT_DIR} // "$FindBin::RealBin/../..";
	system("git -c safe.directory='*' -C '$git' archive $commit | tar -x -C '$dir/src'") == 0
	  or die "cannot read the sources of $version (commit $commit) from the git repository $git:"
	  . " set OUTBOX_GIT_DIR to a clone of outbox";
	system("make -s -C '$dir/src' PG_CONFIG='$pg_config' outbox.so outbox--$version.sql"
		  . " >'$dir/build.log' 2>&1") == 0
	  or die "cannot build outbox $version, see $dir/build.log";
	foreach my $k (keys %copy)
	{
		File::Path::make_path(File::Basename::dirname($copy{$k}));
		system('cp', '-a', $conf{$k}, $copy{$k}) == 0 or die "cannot copy $conf{$k}";
	}
	unlink glob("$copy{sharedir}/extension/outbox*"), "$copy{pkglibdir}/outbox.so";
	foreach my $f ([ "outbox.so", $copy{pkglibdir} ],
		[ "outbox.control", "$copy{sharedir}/extension" ],
		[ "outbox--$version.sql", "$copy{sharedir}/extension" ])
	{
		system('cp', "$dir/src/$f->[0]", "$f->[1]/") == 0 or die "cannot install $f->[0]";
	}
	open(my $fh, '>', "$dir/done") or die;
	close($fh);
	return ($install_path, "$dir/src");
}

# Let a stopped node run with the binaries of another installation
# (outbox_release_install, or undef for the one on PATH) from its next
# start on: PostgreSQL::Test::Cluster keeps the install_path it was made
# with in this field.
sub outbox_use_install
{
	my ($node, $install_path) = @_;
	$node->{_install_path} = $install_path;
	return;
}

# How many notifications on the channel "outbox" psql printed after the
# background session $listener (which LISTENs there) ran $query.
sub notifications_after
{
	my ($listener, $query) = @_;
	my $out = $listener->query_safe($query);
	my @got = ($out =~ /Asynchronous notification "outbox" received/g);
	return scalar @got;
}

# Wait (at most $limit seconds) for a notification on $listener; returns
# how many came.
sub wait_notification
{
	my ($listener, $limit) = @_;
	my $deadline = time + $limit;
	my $n = 0;
	while (($n = notifications_after($listener, 'SELECT pg_sleep(0.02)')) == 0
		   && time < $deadline)
	{
	}
	return $n;
}

1;
