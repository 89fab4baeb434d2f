# The files of src/ (not src/relay) call each other in layers that only
# point down: the graph of which file calls a function defined in which
# other file, built from universal-ctags (where each non-static function is
# defined) and cscope (who calls it), has no cycle, so in particular no two
# files call each other.  Every file also opens with a header that says
# what it owns and names its locking.  Calls through function pointers (the
# duty table, the transaction runner) are not in the graph: they are how a
# lower layer calls back into one above it.
use strict;
use warnings;
use PostgreSQL::Test::Utils;
use Test::More;
use FindBin;

my $src = ($ENV{OUTBOX_SRC} // "$FindBin::RealBin/../..") . '/src';
my $dir = PostgreSQL::Test::Utils::tempdir;
opendir(my $dh, $src) or die "cannot read $src: $!";
my @files = sort grep { /\.c$/ } readdir($dh);
closedir($dh);
cmp_ok(scalar(@files), '>=', 10, 'the C files of src/ are found');

# Where each function visible to other files is defined.
my %def;
my $tags = `cd '$src' && ctags -f - --c-kinds=f --fields=+f @files`;
die 'ctags failed' if $? != 0;
foreach my $line (split /\n/, $tags)
{
	my @f = split /\t/, $line;
	next if grep { $_ eq 'file:' } @f;    # static
	$def{ $f[0] } = $f[1];
}
cmp_ok(scalar(keys %def), '>=', 30, 'ctags finds the cross-file functions');

# Who calls each of them (cscope: functions calling this function).
my $db = "$dir/cscope.out";
system("cd '$src' && cscope -b -k -f '$db' @files outbox.h") == 0
  or die 'cscope failed';
my %edge;
foreach my $fn (sort keys %def)
{
	my $out = `cd '$src' && cscope -d -f '$db' -L -3 '$fn'`;
	die "cscope -L -3 $fn failed" if $? != 0;
	foreach my $line (split /\n/, $out)
	{
		my ($file) = split / /, $line;
		next if !defined $file || $file eq $def{$fn} || $file !~ /\.c$/;
		$edge{$file}{ $def{$fn} }{$fn} = 1;
	}
}
foreach my $from (sort keys %edge)
{
	note "$from -> " . join(', ',
		map { "$_ (" . join(' ', sort keys %{ $edge{$from}{$_} }) . ')' }
		  sort keys %{ $edge{$from} });
}
ok(exists $edge{'lease.c'}{'shared.c'}, 'the graph holds a known edge (lease.c calls shared.c)');

# Depth-first search for a cycle.
my %state;    # 1: on the path, 2: done
my @cycle;
sub visit
{
	my ($f, @path) = @_;
	return 0 if ($state{$f} // 0) == 2;
	if (($state{$f} // 0) == 1)
	{
		my $i = 0;
		$i++ while $path[$i] ne $f;
		@cycle = (@path[ $i .. $#path ], $f);
		return 1;
	}
	$state{$f} = 1;
	foreach my $to (sort keys %{ $edge{$f} // {} })
	{
		return 1 if visit($to, @path, $f);
	}
	$state{$f} = 2;
	return 0;
}
my $found = 0;
foreach my $f (@files)
{
	last if ($found = visit($f));
}
ok(!$found, 'no cycle in the file call graph')
  or diag('cycle: ' . join(' -> ', @cycle));

my @mutual;
foreach my $a (sort keys %edge)
{
	foreach my $b (sort keys %{ $edge{$a} })
	{
		push @mutual, "$a <-> $b" if $a lt $b && exists $edge{$b}{$a};
	}
}
is(join(', ', @mutual), '', 'no two files call each other');

# Each file's header says what it owns and, for the files outside the
# SQL-callable API (whose headers state their lease protocol), how it locks.
foreach my $f (@files)
{
	open(my $fh, '<', "$src/$f") or die "cannot read $f: $!";
	local $/;
	my $text = <$fh>;
	close($fh);
	my ($header) = $text =~ m{\A(/\*-+\n.*?\*/)}s;
	my $api = $f =~ /^(producer|lease|consumer)\.c$/;
	ok(defined $header && $header =~ /^ \* \Q$f\E\n/m
		  && ($api || $header =~ /^ \* Locking[.:]/m),
		"$f opens with a header naming the file" . ($api ? '' : ' and its locking'));
}

done_testing();
