# A real upgrade, and installing into more than one database.
#
# The server first runs the released 0.1.0 (its outbox.so and install
# script, built from the commit it was released from: OutboxTest's
# outbox_release_install).  A database installs it and gets commands in
# every state through 0.1.0's API: pending (due, later, of a paused kind,
# back after a failed delivery), sending under live leases (one that
# outlasts the test, one that expires after the update), published with and
# without a receipt, dead, uncertain, purged (a tombstone), inbox rows,
# policies, a DBA's grants on a table and on a view.  Then the server is
# restarted with this build, as a package upgrade does, and ALTER EXTENSION
# outbox UPDATE runs.  Checked after it:
# - every row of every table is there with the same values in 0.1.0's
#   columns (so every command keeps its state);
# - the schema equals a fresh install's: a catalog description of every
#   member and relation of the schema (below), a normalized
#   pg_dump --schema-only --binary-upgrade (which writes out each member of
#   the extension with its ACL and initial privileges), and pg_extension's
#   dump registrations (extconfig, extcondition); the description is
#   checked to notice a changed grant, setting, default, index or comment;
#   it shows each ACL as the sorted set of its entries (their order means
#   nothing; a DBA's grant on the schema comes first in the updated ACL);
# - the DBA's grant on the table stays, the one on the view is named in a
#   WARNING to be run again; a view of the DBA's over one of the
#   extension's stops the update (2BP01) before it changes anything;
# - live leases behave as docs/reference.md ("Upgrading from 0.1.0") says:
#   no token, not handed out again while they last, not acked by the 0.1.0
#   call nor by a made-up token, taken over by claim once expired (the
#   delivery counted) and acked with the new token;
# - 0.1.0's cluster-wide roles lose every right (the WARNING's GRANT gives
#   their members them back), the inbox's consumer names are registered to
#   the database's consumer role, 0.1.0's decisions have no deciding role
#   (a repeat is a 23505 conflict), its policies restrict nobody;
# - the API goes on; the checks are clean.
# Every version the server offers is updated the same way (with only the
# frozen 0.1.0 and the current version, that is 0.1.0).
#
# Installing into a second database of the cluster creates that database's
# group roles, gives the same schema (the databases' role names aside), and
# dropping the extension in one database leaves the roles and the other
# database alone; installing again reuses the roles.  Default
# privileges of the installing role for other roles are taken back (the
# schema again equals a fresh install's); for a role of the privilege
# matrix they make the installation fail.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use FindBin;
use lib "$FindBin::RealBin/../perl";
use OutboxTest;
use IPC::Run;

my $srcdir = "$FindBin::RealBin/../..";
my ($release, $release_src) = outbox_release_install('0.1.0');
is(slurp_file("$srcdir/outbox--0.1.0.sql"), slurp_file("$release_src/outbox--0.1.0.sql"),
	'outbox--0.1.0.sql is the install script of the released 0.1.0');

my $node = outbox_node('upgrade', qq{
outbox.naptime = '200ms'
}, install_path => $release);

sub sql { my ($db, $q) = @_; return $node->safe_psql($db, $q); }

# One line per fact, sorted; newlines inside a fact are escaped.
my $describe = q{
WITH ext AS (SELECT e.oid, e.extconfig, e.extcondition, e.extrelocatable, e.extnamespace
			   FROM pg_extension e WHERE e.extname = 'outbox'),
	 members AS (SELECT d.classid, d.objid, d.objsubid FROM pg_depend d, ext
				  WHERE d.refclassid = 'pg_extension'::regclass AND d.refobjid = ext.oid
					AND d.deptype = 'e'),
	 rels AS (SELECT c.* FROM pg_class c WHERE c.relnamespace = 'outbox'::regnamespace),
	 facts AS (
	SELECT 'member ' || o.type || ' ' || o.identity AS f
	  FROM members m, pg_identify_object(m.classid, m.objid, m.objsubid) o
	UNION ALL
	SELECT 'extension relocatable=' || e.extrelocatable || ' schema=' || e.extnamespace::regnamespace
		   || ' config=' || coalesce((SELECT string_agg(c::regclass::text || ':' || coalesce(w, ''), ',' ORDER BY c::regclass::text)
										FROM unnest(e.extconfig, e.extcondition) u(c, w)), '')
	  FROM ext e
	UNION ALL
	SELECT 'schema owner=' || n.nspowner::regrole || ' acl=' || coalesce((SELECT array_agg(replace(x::text, current_database() || '_outbox_', '<db>_outbox_') ORDER BY replace(x::text, current_database() || '_outbox_', '<db>_outbox_')) FROM unnest(n.nspacl) x)::text, '')
		   || ' comment=' || coalesce(obj_description(n.oid, 'pg_namespace'), '')
	  FROM pg_namespace n WHERE n.nspname = 'outbox'
	UNION ALL
	SELECT 'relation ' || c.oid::regclass || ' kind=' || c.relkind::text || ' persistence=' || c.relpersistence::text
		   || ' owner=' || c.relowner::regrole || ' options=' || coalesce(c.reloptions::text, '')
		   || ' acl=' || coalesce((SELECT array_agg(replace(x::text, current_database() || '_outbox_', '<db>_outbox_') ORDER BY replace(x::text, current_database() || '_outbox_', '<db>_outbox_')) FROM unnest(c.relacl) x)::text, '') || ' rls=' || c.relrowsecurity || c.relforcerowsecurity
		   || ' replident=' || c.relreplident::text
		   || ' comment=' || coalesce(obj_description(c.oid, 'pg_class'), '')
	  FROM rels c
	UNION ALL
	SELECT 'column ' || c.oid::regclass || ' ' || a.attnum || ' ' || a.attname || ' '
		   || format_type(a.atttypid, a.atttypmod) || ' notnull=' || a.attnotnull
		   || ' default=' || coalesce(pg_get_expr(ad.adbin, ad.adrelid), '')
		   || ' identity=' || a.attidentity::text || ' generated=' || a.attgenerated::text
		   || ' collation=' || coalesce(a.attcollation::regcollation::text, '')
		   || ' storage=' || a.attstorage::text || ' acl=' || coalesce((SELECT array_agg(replace(x::text, current_database() || '_outbox_', '<db>_outbox_') ORDER BY replace(x::text, current_database() || '_outbox_', '<db>_outbox_')) FROM unnest(a.attacl) x)::text, '')
		   || ' comment=' || coalesce(col_description(c.oid, a.attnum), '')
	  FROM rels c JOIN pg_attribute a ON a.attrelid = c.oid
	  LEFT JOIN pg_attrdef ad ON ad.adrelid = c.oid AND ad.adnum = a.attnum
	 WHERE a.attnum > 0 AND NOT a.attisdropped
	UNION ALL
	SELECT 'constraint ' || c.oid::regclass || ' ' || k.conname || ' ' || pg_get_constraintdef(k.oid)
		   || ' deferrable=' || k.condeferrable || k.condeferred
	  FROM rels c JOIN pg_constraint k ON k.conrelid = c.oid
	UNION ALL
	SELECT 'index ' || pg_get_indexdef(i.indexrelid) || ' options=' || coalesce(ic.reloptions::text, '')
	  FROM rels c JOIN pg_index i ON i.indrelid = c.oid JOIN pg_class ic ON ic.oid = i.indexrelid
	UNION ALL
	SELECT 'trigger ' || pg_get_triggerdef(t.oid) || ' enabled=' || t.tgenabled::text
	  FROM rels c JOIN pg_trigger t ON t.tgrelid = c.oid WHERE NOT t.tgisinternal
	UNION ALL
	SELECT 'policy ' || c.oid::regclass || ' ' || p.polname || ' ' || p.polcmd::text || ' ' || p.polpermissive
		   || ' ' || coalesce(pg_get_expr(p.polqual, p.polrelid), '') || ' '
		   || coalesce(pg_get_expr(p.polwithcheck, p.polrelid), '') || ' ' || p.polroles::text
	  FROM rels c JOIN pg_policy p ON p.polrelid = c.oid
	UNION ALL
	SELECT 'rule ' || pg_get_ruledef(r.oid)
	  FROM rels c JOIN pg_rewrite r ON r.ev_class = c.oid WHERE r.rulename <> '_RETURN'
	UNION ALL
	SELECT 'view ' || c.oid::regclass || ' ' || pg_get_viewdef(c.oid)
	  FROM rels c WHERE c.relkind::text IN ('v', 'm')
	UNION ALL
	SELECT 'sequence ' || s.seqrelid::regclass || ' ' || s.seqtypid::regtype || ' ' || s.seqstart || ' '
		   || s.seqincrement || ' ' || s.seqmax || ' ' || s.seqmin || ' ' || s.seqcache || ' ' || s.seqcycle
	  FROM rels c JOIN pg_sequence s ON s.seqrelid = c.oid
	UNION ALL
	SELECT 'function ' || p.oid::regprocedure || ' owner=' || p.proowner::regrole
		   || ' acl=' || coalesce((SELECT array_agg(replace(x::text, current_database() || '_outbox_', '<db>_outbox_') ORDER BY replace(x::text, current_database() || '_outbox_', '<db>_outbox_')) FROM unnest(p.proacl) x)::text, '')
		   || ' comment=' || coalesce(obj_description(p.oid, 'pg_proc'), '') || ' '
		   || CASE WHEN p.prokind IN ('f', 'p') THEN pg_get_functiondef(p.oid)
				   ELSE p.prokind::text || ' ' || p.prosrc END
	  FROM pg_proc p WHERE p.pronamespace = 'outbox'::regnamespace
	UNION ALL
	SELECT 'function-flags ' || p.oid::regprocedure || ' secdef=' || p.prosecdef
		   || ' config=' || coalesce(p.proconfig::text, '') || ' strict=' || p.proisstrict
		   || ' volatile=' || p.provolatile::text || ' parallel=' || p.proparallel::text
		   || ' leakproof=' || p.proleakproof || ' cost=' || p.procost || ' rows=' || p.prorows
		   || ' lang=' || l.lanname || ' src=' || p.prosrc || ' bin=' || coalesce(p.probin, '')
	  FROM pg_proc p JOIN pg_language l ON l.oid = p.prolang
	 WHERE p.pronamespace = 'outbox'::regnamespace
	UNION ALL
	SELECT 'type ' || t.oid::regtype || ' ' || t.typtype::text || ' owner=' || t.typowner::regrole
		   || ' acl=' || coalesce((SELECT array_agg(replace(x::text, current_database() || '_outbox_', '<db>_outbox_') ORDER BY replace(x::text, current_database() || '_outbox_', '<db>_outbox_')) FROM unnest(t.typacl) x)::text, '')
		   || ' comment=' || coalesce(obj_description(t.oid, 'pg_type'), '')
	  FROM pg_type t WHERE t.typnamespace = 'outbox'::regnamespace
	UNION ALL
	SELECT 'operator ' || o.oid::regoperator || ' ' || o.oprcode::regprocedure
	  FROM pg_operator o WHERE o.oprnamespace = 'outbox'::regnamespace
	UNION ALL
	SELECT 'initprivs ' || o.type || ' ' || o.identity || ' ' || i.privtype::text || ' '
		   || (SELECT array_agg(replace(x::text, current_database() || '_outbox_', '<db>_outbox_') ORDER BY replace(x::text, current_database() || '_outbox_', '<db>_outbox_')) FROM unnest(i.initprivs) x)::text
	  FROM pg_init_privs i, members m, pg_identify_object(i.classoid, i.objoid, i.objsubid) o
	 WHERE i.classoid = m.classid AND i.objoid = m.objid AND i.objsubid = m.objsubid
	UNION ALL
	SELECT 'role ' || r.rolname || ' login=' || r.rolcanlogin || ' super=' || r.rolsuper
	  FROM pg_roles r
	 WHERE r.rolname IN (SELECT current_database() || '_outbox_' || c
						   FROM unnest(ARRAY['producer', 'publisher', 'consumer', 'admin']) c)),
-- this database's group roles under one name, to compare databases
named AS (SELECT replace(replace(f, current_database() || '_outbox_', '<db>_outbox_'), E'\n', '\n') AS f
			FROM facts)
SELECT string_agg(f, E'\n' ORDER BY f COLLATE "C") FROM named;
};

# The lines of $a missing from $b, prefixed "-", and those of $b missing
# from $a, prefixed "+".
sub difference
{
	my ($a, $b) = @_;
	my %a = map { $_ => 1 } split /\n/, $a;
	my %b = map { $_ => 1 } split /\n/, $b;
	return join("\n",
		(map { "- $_" } grep { !$b{$_} } sort keys %a),
		(map { "+ $_" } grep { !$a{$_} } sort keys %b));
}


sub describe { my ($db) = @_; return sql($db, $describe); }

# pg_dump --schema-only --binary-upgrade writes every member of the
# extension, its ACL and its initial privileges; the object ids, frozen
# xids and the dump registrations' oids (compared through pg_extension)
# differ from one database to another.
sub schema_dump
{
	my ($db) = @_;
	my ($out, $err);
	IPC::Run::run([ 'pg_dump', '--schema-only', '--binary-upgrade', '-d', $node->connstr($db) ],
		'>', \$out, '2>', \$err)
	  or die "pg_dump $db: $err";
	my @lines = grep { !/binary_upgrade_set_next_|^\\(?:un)?restrict / } split /\n/, $out;
	foreach (@lines)
	{
		s/relfrozenxid = '\d+', relminmxid = '\d+'/relfrozenxid = 'X', relminmxid = 'X'/;
		s/^WHERE oid = '\d+';$/WHERE oid = 'toast';/;
		s/^(SELECT pg_catalog\.binary_upgrade_create_empty_extension\(.*)'\{[0-9,]*\}'/$1'{oids}'/;
		s/\b\Q$db\E_outbox_/<db>_outbox_/g;
	}
	return join("\n", @lines);
}

# A test that two texts are equal, showing a unified diff when not.
sub is_text
{
	my ($got, $expected, $name) = @_;
	return pass($name) if $got eq $expected;
	my $dir = PostgreSQL::Test::Utils::tempdir();
	PostgreSQL::Test::Utils::append_to_file("$dir/expected", "$expected\n");
	PostgreSQL::Test::Utils::append_to_file("$dir/got", "$got\n");
	fail($name);
	diag(scalar qx{diff -u '$dir/expected' '$dir/got'});
	return 0;
}

my $registrations = q{
SELECT coalesce(string_agg(c::regclass::text || ':' || w, ',' ORDER BY c::regclass::text), '')
  FROM pg_extension e, unnest(e.extconfig, e.extcondition) u(c, w) WHERE e.extname = 'outbox'};

# ---------------------------------------------------------------------------
# 1. 0.1.0, running its own binaries, filled through its own API.

is(sql('postgres', q{SELECT string_agg(version, ',') FROM pg_available_extension_versions WHERE name = 'outbox'}),
	'0.1.0', 'the server runs the released 0.1.0');
sql('postgres', 'CREATE ROLE auditor; CREATE DATABASE old');
# 0.1.0's group roles are cluster-wide (created by CREATE EXTENSION below)
sql('old', q{
CREATE EXTENSION outbox;
-- a DBA's grants: on the schema and a table (kept) and on a view
-- (recreated by the update)
GRANT USAGE ON SCHEMA outbox TO auditor;
GRANT SELECT ON outbox.receipts TO auditor;
GRANT SELECT ON outbox.dead_letters TO auditor;

-- a publisher's login role, a member of 0.1.0's cluster-wide group role
CREATE ROLE relay_a LOGIN IN ROLE outbox_publisher;

-- policies, one of them paused
SELECT outbox.set_policy('k-manual', takeover => 'manual', max_deliveries => 5,
	backoff_base => '2 seconds', backoff_max => '1 minute', lease => '10 minutes',
	retention => '30 days');
SELECT outbox.set_policy('k-retry', backoff_base => '1 hour', backoff_max => '2 hours');
SELECT outbox.pause('k-paused');

-- a tombstone: published, receipt, purged (first: the purge takes every
-- published command with a receipt)
SELECT outbox.commit_decision('run-a', 1, 'decided', 'd-purged', 'k-purge', '{"n": 1}');
SELECT count(*) FROM outbox.claim('w1', 1, kinds => '{k-purge}');
SELECT outbox.ack('d-purged', 'w1', 2);
SELECT outbox.complete('d-purged', 'done', '{"ref": "x-1"}');
SELECT outbox.inbox_accept('consumer-1', 'd-purged');
});
sql('old', q{SELECT outbox.purge(10, '0 seconds')});
sql('old', q{
-- pending now, pending later (with an event payload and a priority), paused
SELECT outbox.commit_decision('run-a', 2, 'decided', 'd-pending', 'k-pending', '{"n": 2}');
SELECT outbox.commit_decision('run-a', 3, 'decided', 'd-later', 'k-later', '{"n": 3}',
	'{"why": "later"}', now() + interval '1 day', 7);
SELECT outbox.commit_decision('run-a', 4, 'decided', 'd-paused', 'k-paused', '{"n": 4}');
-- sending: a lease that outlasts the test, one that ends soon after the update
SELECT outbox.commit_decision('run-b', 1, 'decided', 'd-sending', 'k-send', '{"n": 5}');
SELECT count(*) FROM outbox.claim('w1', 1, '1 hour', '{k-send}');
SELECT outbox.commit_decision('run-b', 6, 'decided', 'd-expiring', 'k-expire', '{"n": 11}');
SELECT count(*) FROM outbox.claim('w1', 1, '5 seconds', '{k-expire}');
-- published without and with a receipt; inbox rows
SELECT outbox.commit_decision('run-b', 2, 'decided', 'd-pub', 'k-pub', '{"n": 6}');
SELECT outbox.commit_decision('run-b', 3, 'decided', 'd-pub-r', 'k-pub', '{"n": 7}');
SELECT count(*) FROM outbox.claim('w2', 2, kinds => '{k-pub}');
SELECT count(*) FROM outbox.ack('w2', '{d-pub,d-pub-r}'::text[], '{2,2}'::bigint[]);
SELECT outbox.complete('d-pub-r', 'failed', '{"code": 42}');
SELECT outbox.inbox_accept('consumer-1', 'd-pub-r');
SELECT outbox.inbox_accept('consumer-2', 'd-pub-r');
-- dead
SELECT outbox.commit_decision('run-b', 4, 'decided', 'd-dead', 'k-dead', '{"n": 8}');
SELECT count(*) FROM outbox.claim('w1', 1, kinds => '{k-dead}');
SELECT outbox.fail('d-dead', 'w1', 2, 'gone', true);
-- back to pending after a failed delivery (an hour of backoff)
SELECT outbox.commit_decision('run-b', 5, 'decided', 'd-retry', 'k-retry', '{"n": 9}');
SELECT count(*) FROM outbox.claim('w1', 1, kinds => '{k-retry}');
SELECT outbox.fail('d-retry', 'w1', 2, 'timeout');
-- a lease of a manual kind that runs out: uncertain
SELECT outbox.commit_decision('run-c', 1, 'decided', 'd-unc', 'k-manual', '{"n": 10}');
SELECT count(*) FROM outbox.claim('w3', 1, '1 millisecond', '{k-manual}');
-- an event that decides nothing
SELECT outbox.record_event('run-c', 2, 'note', '{"text": "nothing decided"}');
});
$node->poll_query_until('old', q{
SELECT outbox.sweep() >= 0
   AND (SELECT status = 'uncertain' FROM outbox.commands WHERE command_id = 'd-unc')})
  or die 'd-unc never became uncertain';
is( sql('old', q{SELECT string_agg(command_id || ':' || status, ',' ORDER BY command_id) FROM outbox.commands}),
	'd-dead:dead,d-expiring:sending,d-later:pending,d-paused:pending,d-pending:pending,'
	  . 'd-pub:published,d-pub-r:published,d-retry:pending,d-sending:sending,d-unc:uncertain',
	'0.1.0 holds commands in every state');
is(sql('old', 'SELECT count(*) FROM outbox.purged'), '1', '... and a tombstone');

# Every table as text, ordered by its key, in 0.1.0's columns.
my %keys = (
	events   => 'run_id, seq',
	commands => 'command_id',
	receipts => 'command_id',
	inbox    => 'consumer, command_id',
	policies => 'kind',
	purged   => 'command_id');
my %rows_query;
foreach my $t (sort keys %keys)
{
	my $cols = sql('old', qq{SELECT string_agg(quote_ident(attname), ', ' ORDER BY attnum) FROM pg_attribute
		WHERE attrelid = 'outbox.$t'::regclass AND attnum > 0 AND NOT attisdropped});
	$rows_query{$t} = "SELECT count(*) || E'\\n' || coalesce(string_agg(row($cols)::text, E'\\n'"
	  . " ORDER BY $keys{$t}), '') FROM outbox.$t";
}
my %before = map { $_ => sql('old', $rows_query{$_}) } sort keys %keys;
my $acl_before = sql('old', q{SELECT relacl FROM pg_class WHERE oid = 'outbox.receipts'::regclass});

# ---------------------------------------------------------------------------
# 2. The package upgrade: the same server restarted with this build.

$node->stop;
outbox_use_install($node, undef);
$node->start;

# Until the update, the 0.1.0 declarations of the functions whose arguments
# or result changed find no symbol in this library (their 1.0 symbols carry
# the version): a clean error, never the new code reading arguments of
# other types.
foreach my $call (
	q{SELECT outbox.fail('u-1', 'w', 2, 'e')},
	q{SELECT outbox.renew('u-1', 'w', 2)},
	q{SELECT outbox.ack('u-1', 'w', 2)},
	q{SELECT outbox.commit_decisions('{r}', '{1}', '{e}', '{c}', '{k}', '{"{}"}')},
	q{SELECT count(*) FROM outbox.claim('w', 1)},
	q{SELECT outbox.complete('u-1')},
	q{SELECT outbox.inbox_accept('c', 'u-1')})
{
	my ($rc, $out, $err) = $node->psql('old', "\\set VERBOSITY verbose\n$call");
	like($err, qr/ERROR:  42883: could not find function "outbox_\w+" in file/,
		"before the update, 0.1.0's $call fails with 42883");
}
is($node->safe_psql('old', 'SELECT 1'), '1', '... and the server is still up');
my @versions = split /\n/, sql('postgres', q{
SELECT version FROM pg_available_extension_versions WHERE name = 'outbox'
 ORDER BY string_to_array(version, '.')::int[]});
my $newest = sql('postgres', q{SELECT default_version FROM pg_available_extensions WHERE name = 'outbox'});
ok(scalar(@versions) >= 2 && $versions[0] eq '0.1.0' && $versions[-1] eq $newest,
	'this build offers ' . join(', ', @versions) . "; default $newest");

# A fresh install of the default version is the reference; for the
# updated database, a fresh install with the DBA's grant on a table.
sql('postgres', 'CREATE DATABASE fresh');
sql('fresh', 'CREATE EXTENSION outbox');
my $reference = describe('fresh');
my $reference_dump = schema_dump('fresh');
my $reference_registrations = sql('fresh', $registrations);
sql('postgres', 'CREATE DATABASE fresh_dba');
sql('fresh_dba', 'CREATE EXTENSION outbox; GRANT USAGE ON SCHEMA outbox TO auditor; GRANT SELECT ON outbox.receipts TO auditor');
my $reference_dba = describe('fresh_dba');
my $reference_dba_dump = schema_dump('fresh_dba');
like($reference, qr/^function-flags outbox\.claim\(.*secdef=false config=\{"search_path=pg_catalog, pg_temp"\}/m,
	'the description covers function settings');
like($reference, qr/^initprivs function outbox\.claim\(.*<db>_outbox_publisher=X/m,
	'the description covers initial privileges');
like($reference_dump, qr/binary_upgrade_set_record_init_privs\(true\);\n(?:[^\n]*\n)*?GRANT ALL ON FUNCTION outbox\.claim\([^\n]*TO <db>_outbox_publisher;\n/,
	'the dump covers initial privileges');

# The comparison notices a change of each kind.
my @mutations = (
	[ 'a grant', 'GRANT EXECUTE ON FUNCTION outbox.sweep(int) TO PUBLIC' ],
	[ 'a setting', 'ALTER FUNCTION outbox.claim(text, int, interval, text[]) RESET search_path' ],
	[ 'SECURITY DEFINER', 'ALTER FUNCTION outbox.record_event(text, bigint, text, jsonb) SECURITY DEFINER' ],
	[ 'a default', 'ALTER TABLE outbox.commands ALTER COLUMN priority SET DEFAULT 1' ],
	[ 'an index', 'CREATE INDEX commands_kind_idx ON outbox.commands (kind)' ],
	[ 'a comment', q{COMMENT ON TABLE outbox.inbox IS 'changed'} ],
	[ 'a dump registration', q{UPDATE pg_extension SET extconfig = extconfig || 'outbox.stats'::regclass::oid,
		extcondition = extcondition || ''::text WHERE extname = 'outbox'} ],
	[ 'a column', 'ALTER TABLE outbox.receipts ADD COLUMN extra int' ]);
foreach my $m (@mutations)
{
	my ($what, $ddl) = @$m;
	my $changed = sql('fresh', "BEGIN;\n$ddl;\n$describe\nROLLBACK;");
	isnt(difference($reference, $changed), '', "the comparison notices $what");
}

# ---------------------------------------------------------------------------
# 3. ALTER EXTENSION outbox UPDATE.

is(sql('old', q{SELECT extversion FROM pg_extension WHERE extname = 'outbox'}), '0.1.0',
	'before the update the database has 0.1.0');
# An object of the DBA's over a view of the extension stops the update,
# which changes nothing.
sql('old', 'CREATE VIEW public.my_backlog AS SELECT * FROM outbox.backlog');
my ($rc, $out, $err) = $node->psql('old', 'ALTER EXTENSION outbox UPDATE');
like($err, qr/ERROR:  cannot drop desired object\(s\) because other objects depend on them\nDETAIL:  view public\.my_backlog depends on view backlog\nHINT:  The update recreates the views and functions of the extension: drop the objects that depend on them/,
	'a view of the DBA over outbox.backlog stops the update, saying what to do');
is(sql('old', q{SELECT extversion FROM pg_extension WHERE extname = 'outbox'}), '0.1.0', '... which changed nothing');
sql('old', 'DROP VIEW public.my_backlog');

($rc, $out, $err) = $node->psql('old', 'ALTER EXTENSION outbox UPDATE');
is($rc, 0, 'ALTER EXTENSION outbox UPDATE') or diag $err;
like($err, qr/WARNING:  the update recreates the views and functions of the extension, without these grants.*\nDETAIL:  GRANT SELECT ON TABLE outbox\.dead_letters TO auditor;\n/,
	"... naming the DBA's grant on a view to run again");
like($err, qr/WARNING:  the roles outbox_producer, outbox_publisher, outbox_consumer and outbox_admin of 0\.1\.0 have no rights in this database any more\nDETAIL:  GRANT old_outbox_publisher TO relay_a;\n/,
	"... and the GRANT of this database's role for the members of 0.1.0's roles");
is(sql('old', q{SELECT extversion FROM pg_extension WHERE extname = 'outbox'}), $newest,
	"... which reaches $newest");
is( sql('old', q{SELECT count(*) FROM pg_roles r WHERE r.rolname LIKE 'outbox\_%'
		AND (has_schema_privilege(r.oid, 'outbox', 'USAGE') OR EXISTS (SELECT FROM pg_proc p
			WHERE p.pronamespace = 'outbox'::regnamespace AND has_function_privilege(r.oid, p.oid, 'EXECUTE')))}),
	'0', "0.1.0's cluster-wide roles have no rights left in the updated database");
is(sql('old', q{SELECT string_agg(consumer || ' ' || role::text, ',' ORDER BY consumer) FROM outbox.consumers}),
	'consumer-1 old_outbox_consumer,consumer-2 old_outbox_consumer',
	"the inbox's consumer names are registered to the database's consumer role");
is(difference($reference_dba, describe('old')), '',
	"the updated catalog equals a fresh install's (with the DBA's grant on a table)");
is_text(schema_dump('old'), $reference_dba_dump, "pg_dump of the schema equals a fresh install's");
is(sql('old', $registrations), $reference_registrations,
	'the tables registered for pg_dump are a fresh install\'s: ' . $reference_registrations);

foreach my $t (sort keys %keys)
{
	is(sql('old', $rows_query{$t}), $before{$t}, "outbox.$t: every row kept, 0.1.0's columns unchanged");
}
is(sql('old', q{SELECT relacl FROM pg_class WHERE oid = 'outbox.receipts'::regclass}), $acl_before,
	"the DBA's grant on a table stays");
is(sql('old', q{SELECT has_table_privilege('auditor', 'outbox.dead_letters', 'SELECT')}), 'f',
	"the one on a view is gone (the WARNING said so)");
is( sql('old', q{SELECT coalesce(string_agg(check_name, ','), 'clean') FROM outbox.conservation WHERE violations > 0}),
	'clean', 'the conservation checks are clean after the update');
is(sql('old', 'SELECT outbox.verify(true)'), '', 'verify() passes');

# ---------------------------------------------------------------------------
# 4. Live leases and the API after the update.

is( sql('old', q{SELECT coalesce(string_agg(command_id, ','), 'none') FROM outbox.claim('w-new', 100,
		kinds => '{k-send}')}),
	'none', "a live lease of 0.1.0 is not handed out again while it lasts");
is(sql('old', q{SELECT count(*) || ' ' || min(length(key)) FROM outbox.lease_key}),
	'1 16', '... and the update made a lease key (16 bytes), under which 0.1.0 made no token');
($rc, $out, $err) = $node->psql('old', q{SELECT outbox.ack('d-sending', 'w1', 2)});
like($err, qr/ERROR:  function outbox\.ack\(unknown, unknown, integer\) does not exist/,
	"its holder's 0.1.0 call is gone");
($rc, $out, $err) = $node->psql('old',
	q{SELECT outbox.ack('w1', repeat('0', 32) || ':' || current_user::regrole::oid || ':2:5:run-b:d-sending')});
like($err, qr/ERROR:  lease_not_owned: worker "w1" does not hold command "d-sending"/,
	'... and no token of the new API acks it (OB001)');
is(sql('old', q{SELECT status || ' ' || owner || ' v' || version FROM outbox.commands WHERE command_id = 'd-sending'}),
	'sending w1 v2', '... which changed nothing');

$node->poll_query_until('old', q{SELECT lease_until < now() FROM outbox.commands WHERE command_id = 'd-expiring'})
  or die 'the lease of d-expiring never ended';
my ($lease, $token) = split /\|/, sql('old', q{SELECT command_id || ' v' || version || ' deliveries=' || deliveries,
		token FROM outbox.claim('w-new', 10, kinds => '{k-expire}')});
is($lease, 'd-expiring v3 deliveries=2',
	'once expired, a lease of 0.1.0 is taken over by claim, its delivery counted');
is(sql('old', qq{SELECT 'acked' FROM outbox.ack('w-new', '$token') a}), 'acked',
	'... and acked with the token claim gave');
my ($pending, $token2) = split /\|/, sql('old', q{SELECT command_id || ' v' || version, token
	FROM outbox.claim('w9', 10, kinds => '{k-pending,k-paused}')});
is($pending, 'd-pending v2', 'a pending command of 0.1.0 is claimed (paused kinds stay paused)');
is( sql('old', qq{SELECT string_agg(command_id || ':' || acked || ':' || coalesce(reason, ''), ',' ORDER BY command_id)
		FROM outbox.ack_many('w9', ARRAY['$token2', repeat('0', 32) || ':' || current_user::regrole::oid || ':2:5:run-b:d-sending'])}),
	'd-pending:true:,d-sending:false:lease_not_owned',
	"the batch ack takes its token and refuses one made up for 0.1.0's live lease");
is( sql('old', q{
SELECT outbox.complete('run-b', 'd-pub');
SELECT outbox.complete('run-a', 'd-purged');
SELECT outbox.inbox_accept('consumer-1', 'run-b', 'd-pub-r');
SELECT outbox.commit_decision('run-d', 1, 'decided', 'd-new', 'k-pending', '{"n": 12}');
SELECT outbox.commit_decision('run-d', 1, 'decided', 'd-new', 'k-pending', '{"n": 12}');
SELECT string_agg(command_id || ':' || status, ',' ORDER BY command_id) FROM outbox.commands
 WHERE command_id IN ('d-expiring', 'd-pending', 'd-paused', 'd-new', 'd-sending');}),
	"t\nf\nf\nt\nf\nd-expiring:published,d-new:pending,d-paused:pending,d-pending:published,d-sending:sending",
	'the API goes on after the update (receipts, the tombstone and the inbox answer; a new decision and its retry)');
is( sql('old', q{SELECT count(*) FROM outbox.commands WHERE decided_by IS NOT NULL AND command_id LIKE 'd-%' AND command_id <> 'd-new'}),
	'0', 'the decisions of 0.1.0 have no deciding role');
($rc, $out, $err) = $node->psql('old', q{\set VERBOSITY verbose
SELECT outbox.commit_decision('run-a', 2, 'decided', 'd-pending', 'k-pending', '{"n": 2}')});
like($err, qr/ERROR:  23505: .*\n(?:DETAIL|HINT|CONTEXT|LOCATION|SCHEMA NAME|TABLE NAME|CONSTRAINT NAME)[^\n]*(?:\n.*)*CONSTRAINT NAME:  commands_pkey/,
	'so repeating one is a conflict (23505 commands_pkey), not an idempotent retry');
is( sql('old', q{SELECT count(*) FROM outbox.policies
		WHERE deciders IS NOT NULL OR claimers IS NOT NULL OR completers IS NOT NULL}),
	'0', "0.1.0's policies restrict nobody");

# The roles: the WARNING's GRANT gives a member of 0.1.0's publisher role
# the rights back; a consumer of the database's role uses a name of the
# inbox; an unregistered name is refused (OB003).
($rc, $out, $err) = $node->psql('old', q{SELECT count(*) FROM outbox.claim('relay-a', 10, kinds => '{k-retry}')},
	extra_params => [ '-U', 'relay_a' ]);
like($err, qr/ERROR:  permission denied for schema outbox/,
	"a member of 0.1.0's publisher role has no rights in the updated database");
sql('old', 'GRANT old_outbox_publisher TO relay_a; CREATE ROLE mailer LOGIN IN ROLE old_outbox_consumer');
is( $node->safe_psql('old', q{SELECT count(*) FROM outbox.claim('relay-a', 10, kinds => '{k-retry}')},
		extra_params => [ '-U', 'relay_a' ]),
	'0', "after the WARNING's GRANT, 0.1.0's publisher may claim again");
is( $node->safe_psql('old', q{SELECT outbox.inbox_accept('consumer-2', 'run-b', 'd-pub')},
		extra_params => [ '-U', 'mailer' ]),
	't', "a consumer of the database's role uses a consumer name of 0.1.0's inbox");
($rc, $out, $err) = $node->psql('old', q{\set VERBOSITY verbose
SELECT outbox.inbox_accept('consumer-3', 'run-b', 'd-pub')}, extra_params => [ '-U', 'mailer' ]);
like($err, qr/ERROR:  OB003/, '... and a name 0.1.0 never used needs register_consumer (OB003)');

is( sql('old', q{SELECT coalesce(string_agg(check_name, ','), 'clean') FROM outbox.conservation WHERE violations > 0}),
	'clean', 'the checks are still clean');

# A dump of the updated database restores with the DBA's grant on a table
# (kept out of the initial privileges, which pg_dump leaves out) and every
# row.
my $dumpfile = $node->basedir . '/old.dump';
$node->command_ok([ 'pg_dump', '-Fc', '-f', $dumpfile, '-d', $node->connstr('old') ], 'pg_dump of the updated database');
sql('postgres', 'CREATE DATABASE old_restored');
$node->command_ok([ 'pg_restore', '--exit-on-error', '-d', $node->connstr('old_restored'), $dumpfile ],
	'... restores into a fresh database');
is( sql('old_restored', q{SELECT has_table_privilege('auditor', 'outbox.receipts', 'SELECT')
		AND has_schema_privilege('auditor', 'outbox', 'USAGE')}), 't',
	"... with the DBA's grants on the schema and a table");
foreach my $t (sort keys %keys)
{
	is(sql('old_restored', $rows_query{$t}), sql('old', $rows_query{$t}), "... and every row of outbox.$t");
}

# Every other version the server offers, updated the same way: installed
# by its own release's binaries, updated by this build's.
foreach my $v (grep { $_ ne '0.1.0' && $_ ne $newest } @versions)
{
	fail("no release install of $v to update from (add it to OutboxTest's \%RELEASES)");
}

# A second database of the same cluster gets group roles of its own.
my $roles = sql('postgres', q{SELECT string_agg(rolname || '=' || oid, ',' ORDER BY rolname)
	FROM pg_roles WHERE rolname LIKE 'fresh\_outbox\_%'});
sql('postgres', 'CREATE DATABASE second');
sql('second', 'CREATE EXTENSION outbox');
is(sql('postgres', q{SELECT string_agg(rolname, ',' ORDER BY rolname)
	FROM pg_roles WHERE rolname LIKE 'second\_outbox\_%'}),
	'second_outbox_admin,second_outbox_consumer,second_outbox_producer,second_outbox_publisher',
	'a second install creates the group roles of its database');
is(difference($reference, describe('second')), '', 'the second database gets the same schema');

# Dropping the extension in one database leaves the roles and the other.
sql('fresh', 'DROP EXTENSION outbox');
is(sql('postgres', q{SELECT string_agg(rolname || '=' || oid, ',' ORDER BY rolname)
	FROM pg_roles WHERE rolname LIKE 'fresh\_outbox\_%'}),
	$roles, 'DROP EXTENSION leaves the group roles');
sql('postgres', 'CREATE ROLE app LOGIN IN ROLE second_outbox_producer, second_outbox_publisher');
is($node->safe_psql('second', q{
SELECT 'decided' FROM outbox.commit_decision('run', 1, 'decided', 'c-1', 'k', '{}') d;
SELECT string_agg(command_id, ',') FROM outbox.claim('w', 10);},
		extra_params => [ '-U', 'app' ]),
	"decided\nc-1", 'the other database still works for a member of the group roles');
sql('fresh', 'CREATE EXTENSION outbox');
is(difference($reference, describe('fresh')), '', 'installing again gives the same schema');
is(sql('postgres', q{SELECT string_agg(rolname || '=' || oid, ',' ORDER BY rolname)
	FROM pg_roles WHERE rolname LIKE 'fresh\_outbox\_%'}),
	$roles, 'installing again reuses the group roles of its database');

# Default privileges of the installing role would add grants to the new
# objects: those to other roles are taken back, those to a role of the
# matrix make the installation fail.
sql('postgres', 'CREATE ROLE reader; CREATE DATABASE defaults');
# (default privileges belong to a database)
sql('defaults', q{
ALTER DEFAULT PRIVILEGES GRANT ALL ON TABLES TO reader;
ALTER DEFAULT PRIVILEGES GRANT ALL ON SEQUENCES TO reader;
ALTER DEFAULT PRIVILEGES GRANT EXECUTE ON FUNCTIONS TO reader;
ALTER DEFAULT PRIVILEGES GRANT USAGE ON TYPES TO reader;
ALTER DEFAULT PRIVILEGES GRANT ALL ON SCHEMAS TO reader;
ALTER DEFAULT PRIVILEGES REVOKE EXECUTE ON FUNCTIONS FROM PUBLIC;});
($rc, $out, $err) = $node->psql('defaults', 'CREATE EXTENSION outbox');
is($rc, 0, 'CREATE EXTENSION works under default privileges for another role');
like($err, qr/WARNING:  revoked what the default privileges of role "\w+" granted role "reader"/,
	'... saying that it took them back');
is(difference($reference, describe('defaults')), '', '... and the privileges are exactly the usual ones');
is(sql('defaults', q{SELECT has_table_privilege('reader', 'outbox.commands', 'SELECT')
	OR has_function_privilege('reader', 'outbox._require_id(text, text)', 'EXECUTE')}), 'f',
	'... reader can neither read a table nor call a helper');

sql('defaults', 'DROP EXTENSION outbox; ALTER DEFAULT PRIVILEGES GRANT SELECT ON TABLES TO pg_monitor');
($rc, $out, $err) = $node->psql('defaults', 'CREATE EXTENSION outbox');
isnt($rc, 0, 'CREATE EXTENSION fails when default privileges grant to a role of the matrix');
like($err, qr/the default privileges of role "\w+" grant privileges to role "pg_monitor"/, '... naming it');
sql('defaults', 'ALTER DEFAULT PRIVILEGES REVOKE SELECT ON TABLES FROM pg_monitor');
sql('defaults', 'CREATE EXTENSION outbox');
is(difference($reference, describe('defaults')), '',
	"without that it installs as usual, reader's grants taken back again");

$node->stop;
done_testing();
