# Every SQL example of the documentation runs as written.
#
# The files: README.md, every docs/*.md (found afresh on each run, so a new
# file is tested without touching this one) and bench/README.md.  From each
# file every fenced block whose info string is sql (or psql, pgsql,
# postgresql, plpgsql) is taken, in order, and the blocks of one file run
# one after another in ONE psql session (as a reader pasting them into psql
# would), on a fresh database of a cluster that preloads outbox.  The
# database has the extension already, unless one of the file's blocks
# creates it (CREATE EXTENSION outbox): then it starts without.  Roles a
# file creates are dropped after it, so two files may create the same role.
# The worker is kept out of these databases (outbox.databases), so no sweep
# or purge runs behind an example's back.
#
# Conventions for writing examples (also in docs/internals.md, "Examples in
# the documentation"):
#   * A statement that is meant to fail ends its last line (the one with the
#     semicolon) with the comment  -- error: SQLSTATE  (for example
#     "-- error: 23505").  It must fail with exactly that SQLSTATE; every
#     other statement must run without an error.
#   * <!-- sql-setup ... --> (an HTML comment, invisible when rendered) holds
#     SQL that runs just before the next sql block, for what a reader has
#     anyway but the page does not show.  Use it sparingly.
#   * A fenced block with the info string "output" right after an sql block
#     is what psql prints for it: its lines are compared with psql's output
#     (standard output; lines starting with ERROR:, WARNING:, DETAIL:,
#     HINT: or NOTICE: with the messages, without the SQLSTATE), ignoring
#     blank lines and trailing spaces.
#   * Anything that is not SQL (plans, shell, output not meant to be
#     checked) goes in blocks of another info string (text, sh).
#
# One ok per block: "README.md block 3 (line 120)".  At the end of each file
# the error-class conservation checks must be clean; after README.md a
# completion receipt must exist (its "Getting started" ends with one).
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use File::Basename qw(dirname);
use File::Spec;
use FindBin;
use IPC::Run;
use lib "$FindBin::RealBin/../perl";
use OutboxTest;

# The checkout: OUTBOX_SRC (set by test/run.sh, which runs a copy of test/),
# else the directory above test/.
my $src = $ENV{OUTBOX_SRC} // "$FindBin::RealBin/../..";
-f "$src/README.md" or BAIL_OUT("no README.md in $src (set OUTBOX_SRC to the checkout)");

my @files = ('README.md');
push @files, map { File::Spec->abs2rel($_, $src) } sort glob("$src/docs/*.md");
push @files, 'bench/README.md' if -f "$src/bench/README.md";

my $sql_lang = qr/^(?:sql|psql|pgsql|postgresql|plpgsql)$/i;
my $msg_line = qr/^(?:ERROR|WARNING|DETAIL|HINT|NOTICE|INFO):/;

# Split a Markdown file into its sql blocks: a list of hashes with line (of
# the opening fence), sql (the text), setup (from a preceding sql-setup
# comment) and output (the lines of a following output block, or undef).
# Dies on what the test cannot run faithfully: an unterminated fence, an
# indented sql block, an output block that follows no sql block.
sub parse_blocks
{
	my ($file) = @_;
	open(my $fh, '<', "$src/$file") or die "cannot read $src/$file: $!";
	my @lines = <$fh>;
	close($fh);
	chomp(@lines);

	my (@blocks, $setup, $last_closed_sql);
	my $i = 0;
	while ($i < @lines)
	{
		my $l = $lines[$i];
		if ($l =~ /^\s*<!--\s*sql-setup\b(.*)$/)
		{
			my $rest = $1;
			my @s;
			my $start = $i;
			# the comment's text up to -->
			while (1)
			{
				if ($rest =~ /^(.*?)-->/)
				{
					push @s, $1;
					last;
				}
				push @s, $rest;
				$i++;
				die "$file:" . ($start + 1) . ": unterminated sql-setup comment\n"
				  if $i >= @lines;
				$rest = $lines[$i];
			}
			$setup = join("\n", @s);
			$last_closed_sql = undef;
			$i++;
			next;
		}
		if ($l =~ /^(\s*)(`{3,}|~{3,})\s*([^\s`]*)/)
		{
			my ($indent, $fence, $lang) = ($1, $2, $3);
			my $start = $i;
			my @body;
			$i++;
			while ($i < @lines && $lines[$i] !~ /^\s*\Q$fence\E\s*$/)
			{
				push @body, $lines[$i];
				$i++;
			}
			die "$file:" . ($start + 1) . ": unterminated code block\n" if $i >= @lines;
			$i++;
			if ($lang =~ $sql_lang)
			{
				die "$file:" . ($start + 1) . ": indented sql block (write it at the start of the line)\n"
				  if $indent ne '';
				push @blocks,
				  {
					line => $start + 1,
					sql => join("\n", @body),
					setup => $setup,
					output => undef
				  };
				$setup = undef;
				$last_closed_sql = $blocks[-1];
			}
			elsif ($lang eq 'output')
			{
				die "$file:" . ($start + 1) . ": an output block must follow an sql block\n"
				  unless $last_closed_sql && !defined $last_closed_sql->{output};
				$last_closed_sql->{output} = [@body];
				$last_closed_sql = undef;
			}
			else
			{
				$last_closed_sql = undef;
			}
			next;
		}
		# Only blank lines and prose may sit between an sql block and its
		# output; a heading ends the pairing.
		$last_closed_sql = undef if $l =~ /^#/;
		$i++;
	}
	die "$file: an sql-setup comment precedes no sql block\n" if defined $setup;
	return @blocks;
}

# The lines of $text that are not blank, with trailing spaces removed.
sub norm
{
	return grep { $_ ne '' } map { (my $x = $_) =~ s/\s+$//; $x } @_;
}

my $node = outbox_node('docs', "outbox.databases = 'postgres'\n");
my ($host, $port) = ($node->host, $node->port);

my $n = 0;
foreach my $file (@files)
{
	my @blocks = eval { parse_blocks($file) };
	if ($@)
	{
		fail("$file can be read: $@");
		next;
	}
	if (!@blocks)
	{
		note("$file: no sql blocks");
		next;
	}

	$n++;
	my $db = "docs_$n";
	my $creates = grep { $_->{sql} =~ /\bCREATE\s+EXTENSION\s+(?:IF\s+NOT\s+EXISTS\s+)?"?outbox\b/i } @blocks;
	$node->safe_psql('postgres', "CREATE DATABASE $db");
	$node->safe_psql($db, 'CREATE EXTENSION outbox') unless $creates;
	my $roles_before = $node->safe_psql('postgres',
		'SELECT string_agg(quote_ident(rolname), \',\' ORDER BY rolname) FROM pg_roles');
	my %had = map { $_ => 1 } split /,/, $roles_before;

	# One script: each block preceded by a marker line on standard output,
	# its setup before the marker (so the setup's output is not the block's).
	# psql reports each message with the script line of the statement.
	my @script = ('\set VERBOSITY verbose', '\set SHOW_CONTEXT never');
	my @range;    # per block: [first script line, last script line]
	foreach my $k (0 .. $#blocks)
	{
		my $blk = $blocks[$k];
		push @script, "\\echo '<<<setup $k>>>'", split(/\n/, $blk->{setup}) if defined $blk->{setup};
		push @script, "\\echo '<<<block $k>>>'";
		my $first = @script + 1;
		push @script, split(/\n/, $blk->{sql}, -1);
		# a block that does not end its last statement leaves it to the next
		push @script, ';' if $blk->{sql} !~ /;\s*(--[^\n]*)?\s*$/s;
		$range[$k] = [ $first, scalar(@script) ];
	}
	push @script, "\\echo '<<<end>>>'";
	my $script_file = PostgreSQL::Test::Utils::tempdir() . "/docs_$n.sql";
	open(my $sf, '>', $script_file) or die "cannot write $script_file: $!";
	print $sf join("\n", @script), "\n";
	close($sf);

	my ($out, $err) = ('', '');
	# (a block that hangs ends the test after the usual timeout)
	IPC::Run::run([ 'psql', '-X', '-h', $host, '-p', $port, '-d', $db,
					'-v', 'ON_ERROR_STOP=0', '-f', $script_file ],
				  '<', \undef, '>', \$out, '2>', \$err,
				  IPC::Run::timeout($PostgreSQL::Test::Utils::timeout_default));

	# Standard output per block.
	my %stdout;
	my $cur;
	foreach my $l (split /\n/, $out)
	{
		if ($l =~ /^<<<(setup|block) (\d+)>>>$/)
		{
			$cur = $1 eq 'block' ? $2 : undef;
			next;
		}
		if ($l eq '<<<end>>>')
		{
			$cur = undef;
			next;
		}
		push @{ $stdout{$cur} }, $l if defined $cur;
	}

	# Messages per script line: [line, severity, sqlstate, text lines].
	my @msgs;
	foreach my $l (split /\n/, $err)
	{
		if ($l =~ /^psql:[^:]*:(\d+): (ERROR|FATAL|PANIC|WARNING|NOTICE|INFO|DETAIL|HINT):\s+(.*)$/)
		{
			my ($line, $sev, $text) = ($1, $2, $3);
			my $code = '';
			$code = $1 if $text =~ s/^([0-9A-Z]{5}): //;
			push @msgs, { line => $line, sev => $sev, code => $code, text => ["$sev:  $text"] };
		}
		elsif ($l =~ /^psql:[^:]*:(\d+): (.*)$/)
		{
			# anything else psql says about a line (a lost connection, a
			# bad meta-command) is an error of that line
			push @msgs, { line => $1, sev => 'OTHER', code => '', text => [$2] };
		}
		elsif (@msgs && $l =~ /^(DETAIL|HINT):\s+(.*)$/)
		{
			push @{ $msgs[-1]{text} }, "$1:  $2";
		}
		elsif (@msgs)
		{
			# the rest of a message: LINE n:, the caret, LOCATION:, QUERY:
			next;
		}
		else
		{
			push @msgs, { line => 0, sev => 'OTHER', code => '', text => [$l] };
		}
	}

	foreach my $k (0 .. $#blocks)
	{
		my $blk = $blocks[$k];
		my ($first, $last) = @{ $range[$k] };
		my $setup_first = $k == 0 ? 0 : $range[ $k - 1 ][1] + 1;
		my $name = "$file block " . ($k + 1) . " (line $blk->{line})";
		my @problems;

		# The markers: script line => SQLSTATE.
		my %want;
		my @sql_lines = split(/\n/, $blk->{sql}, -1);
		foreach my $j (0 .. $#sql_lines)
		{
			$want{ $first + $j } = uc($1) if $sql_lines[$j] =~ /--\s*error:\s*([0-9A-Za-z]{5})\s*$/;
		}
		my %got;
		foreach my $m (@msgs)
		{
			next unless $m->{sev} =~ /^(ERROR|FATAL|PANIC|OTHER)$/;
			next unless $m->{line} >= $setup_first && $m->{line} <= $last;
			if ($m->{line} < $first)
			{
				push @problems, "its setup failed: $m->{text}[0]";
				next;
			}
			$got{ $m->{line} } = $m->{code};
			my $md_line = $blk->{line} + 1 + $m->{line} - $first;
			if (!exists $want{ $m->{line} })
			{
				push @problems, "unexpected error at $file:$md_line: $m->{code} $m->{text}[0]";
			}
			elsif ($want{ $m->{line} } ne $m->{code})
			{
				push @problems,
				  "$file:$md_line failed with $m->{code}, not $want{$m->{line}}: $m->{text}[0]";
			}
		}
		foreach my $line (sort { $a <=> $b } keys %want)
		{
			my $md_line = $blk->{line} + 1 + $line - $first;
			push @problems, "$file:$md_line was to fail with $want{$line} and did not"
			  unless exists $got{$line};
		}
		push @problems, 'psql stopped before the block ended'
		  unless $out =~ /^<<<end>>>$/m;

		if (defined $blk->{output})
		{
			my @want_out = norm(grep { !/$msg_line/ } @{ $blk->{output} });
			my @want_msg = norm(grep { /$msg_line/ } @{ $blk->{output} });
			my @got_out = norm(@{ $stdout{$k} // [] });
			my $w = join("\n", @want_out);
			my $g = join("\n", @got_out);
			# (shown as psql printed it, blank lines included)
			push @problems, "its output differs:\n--- shown\n$w\n--- printed\n"
			  . join("\n", map { s/\s+$//r } @{ $stdout{$k} // [] })
			  if $w ne $g;
			if (@want_msg)
			{
				my @got_msg = norm(map { @{ $_->{text} } }
					  grep { $_->{line} >= $first && $_->{line} <= $last } @msgs);
				$w = join("\n", @want_msg);
				$g = join("\n", @got_msg);
				push @problems, "its messages differ:\n--- shown\n$w\n--- printed\n$g" if $w ne $g;
			}
		}
		ok(!@problems, $name) or diag(join("\n", @problems));
	}

	# No example leaves a broken outbox behind.
	is( $node->safe_psql($db, q{
			SELECT coalesce(string_agg(check_name || '=' || violations, ', '), 'clean')
			  FROM outbox.conservation WHERE severity = 'error' AND violations > 0}),
		'clean', "$file leaves the conservation checks clean");
	if ($file eq 'README.md')
	{
		is($node->safe_psql($db, q{
				SELECT count(*) > 0 FROM outbox.receipts r
				  JOIN outbox.commands c USING (command_id)
				 WHERE c.status = 'published'}),
			't', 'README.md: Getting started ends with a published command and its receipt');
	}

	$node->safe_psql('postgres', "DROP DATABASE $db WITH (FORCE)");
	my @new = grep { !$had{$_} } split /,/,
	  $node->safe_psql('postgres',
		'SELECT string_agg(quote_ident(rolname), \',\' ORDER BY rolname) FROM pg_roles');
	$node->safe_psql('postgres', "DROP ROLE $_") foreach @new;
}

ok($n > 0, 'some documentation file has sql blocks');

$node->stop;
done_testing();
