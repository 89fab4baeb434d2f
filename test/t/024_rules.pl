# The rules both languages enforce are defined once, in src/outbox.h, and
# the installed extension agrees with them: the identifier limit (C checks
# and PL/pgSQL _require_id, at the same byte), the statuses (the domain
# outbox.command_status, and every status literal the C and SQL sources
# compare with or write), and the planner settings the C statements and
# outbox.purge() turn off.  Changing one side alone fails here.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use FindBin;
use lib "$FindBin::RealBin/../perl";
use OutboxTest;

my $src = ($ENV{OUTBOX_SRC} // "$FindBin::RealBin/../..") . '/src';


my $h = slurp_file("$src/outbox.h");
my ($max_id) = $h =~ /^#define OUTBOX_MAX_ID_LEN\s+(\d+)\s*$/m;
my ($statuses) = $h =~ /^#define OUTBOX_STATUSES\s+(.*?)\s*$/m;
my ($steering) = $h =~ /^#define OUTBOX_PLANNER_STEERING\(X\)\s+(.*?)\s*$/m;
ok(defined $max_id && defined $statuses && defined $steering,
	'outbox.h defines the three rules on one line each');
my @statuses = $statuses =~ /"([a-z_]+)"/g;
my @steer = $steering =~ /"([a-z_]+)"/g;
cmp_ok(scalar(@statuses), '>=', 5, 'the statuses are read');
cmp_ok(scalar(@steer), '>=', 4, 'the planner settings are read');

my $node = outbox_node('rules');
$node->safe_psql('postgres', 'CREATE EXTENSION outbox');
sub sql { return $node->safe_psql('postgres', $_[0]); }

# --- the identifier limit -----------------------------------------------------------
sub id_error
{
	my ($query) = @_;
	my ($rc, $out, $err) = $node->psql('postgres', $query, extra_params => ['-v', 'VERBOSITY=default']);
	return $err;
}
my $long = 'x' x ($max_id + 1);
my $fits = 'x' x $max_id;
like(id_error(qq{SELECT outbox.commit_decision('r', 1, 'e', '$long', 'k', '{}')}),
	qr/command_id is too long.*the limit is $max_id bytes/s,
	"C refuses an id of OUTBOX_MAX_ID_LEN + 1 bytes");
like(id_error(qq{SELECT outbox.requeue('r', '$long')}),
	qr/command_id is too long.*the limit is $max_id bytes/s,
	"PL/pgSQL refuses the same id");
sql(qq{SELECT outbox.commit_decision('r', 1, 'e', '$fits', 'k', '{}')});
is(sql(qq{SELECT count(*) FROM outbox.commands WHERE command_id = '$fits'}), '1',
	'C accepts an id of OUTBOX_MAX_ID_LEN bytes');
unlike(id_error(qq{SELECT outbox.requeue('r', '$fits')}), qr/too long/,
	'PL/pgSQL accepts it too');

# --- the statuses ----------------------------------------------------------------------
my $def = sql(q{SELECT pg_get_constraintdef(c.oid) FROM pg_constraint c
	WHERE c.contypid = 'outbox.command_status'::regtype});
is(join(',', sort($def =~ /'([a-z_]+)'/g)), join(',', sort @statuses),
	'the domain command_status holds exactly OUTBOX_STATUSES');

# Every status literal of the sources: compared or assigned in SQL text (C
# strings or install-script parts), or compared with strcmp in C.
my %known = map { $_ => 1 } @statuses;
my (%used, @unknown);
opendir(my $dh, $src) or die;
my @c = map { "$src/$_" } grep { /\.c$/ } readdir($dh);
closedir($dh);
opendir($dh, "$src/sql") or die;
my @s = map { "$src/sql/$_" } grep { /\.sql$/ } readdir($dh);
closedir($dh);
foreach my $file (@c, @s)
{
	foreach my $line (split /\n/, slurp_file($file))
	{
		my @lit;
		push @lit, $line =~ /status\s*(?:=|OPERATOR\(pg_catalog\.(?:=|<>)\))\s*'([a-z_]+)'/g;
		push @lit, $line =~ /strcmp\(status,\s*"([a-z_]+)"\)/g;
		if ($line =~ /status\s+OPERATOR\(pg_catalog\.=\)\s+ANY\s*\(ARRAY\[([^\]]*)\]/)
		{
			my $list = $1;
			push @lit, $list =~ /'([a-z_]+)'/g;
		}
		if ($line =~ /SET status = CASE/)
		{
			push @lit, $line =~ /(?:THEN|ELSE)\s+'([a-z_]+)'/g;
		}
		foreach my $l (@lit)
		{
			$used{$l}++;
			push @unknown, "$file: $l" if !$known{$l};
		}
	}
}
cmp_ok(scalar(keys %used), '>=', 5, 'status literals are found in the sources');
is(join('; ', @unknown), '', 'every status literal of the sources is one of OUTBOX_STATUSES');

# --- the planner settings ------------------------------------------------------------
my $purge = sql(q{SELECT prosrc FROM pg_proc WHERE oid = 'outbox.purge(int4, interval)'::regprocedure});
my ($array) = $purge =~ /steer CONSTANT pg_catalog\.text\[\] := ARRAY\[([^\]]*)\]/;
ok(defined $array, 'outbox.purge() has its list of planner settings');
is(join(',', ($array // '') =~ /'([a-z_]+)'/g), join(',', @steer),
	'outbox.purge() turns off exactly the settings OUTBOX_PLANNER_STEERING lists');
is(sql(q{SELECT count(*) FROM pg_settings WHERE name = ANY (ARRAY['}
	  . join("', '", @steer) . q{'])}), scalar(@steer),
	'each of them is a setting of the server');
is(sql(q{SELECT count(*) FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
	WHERE n.nspname = 'outbox' AND p.prosrc LIKE '%@OUTBOX%'}), '0',
	'no placeholder is left in the installed functions');

$node->stop;
done_testing();
