# The upgrade path, and installing into more than one database.
#
# For every version of outbox the server offers (pg_available_extension_
# versions), a database installs that version, gets some data, and runs
# ALTER EXTENSION outbox UPDATE, which must reach the default version
# through the update scripts.  Its schema must then equal a fresh
# install's: the catalog description below covers the extension's members,
# every relation of the schema with its columns, defaults, constraints,
# indexes, triggers and policies, views, functions (definition, SECURITY
# DEFINER, settings, owner), types, comments, privileges and initial
# privileges, the schema itself and the tables registered for pg_dump.
# The comparison is checked to notice a changed grant, setting, default,
# index or comment.  With a single version the update is a no-op, and the
# test keeps working unchanged when update scripts are added.
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

my $node = outbox_node('upgrade', qq{
outbox.naptime = '200ms'
});

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
	SELECT 'schema owner=' || n.nspowner::regrole || ' acl=' || coalesce(n.nspacl::text, '')
		   || ' comment=' || coalesce(obj_description(n.oid, 'pg_namespace'), '')
	  FROM pg_namespace n WHERE n.nspname = 'outbox'
	UNION ALL
	SELECT 'relation ' || c.oid::regclass || ' kind=' || c.relkind::text || ' persistence=' || c.relpersistence::text
		   || ' owner=' || c.relowner::regrole || ' options=' || coalesce(c.reloptions::text, '')
		   || ' acl=' || coalesce(c.relacl::text, '') || ' rls=' || c.relrowsecurity || c.relforcerowsecurity
		   || ' replident=' || c.relreplident::text
		   || ' comment=' || coalesce(obj_description(c.oid, 'pg_class'), '')
	  FROM rels c
	UNION ALL
	SELECT 'column ' || c.oid::regclass || ' ' || a.attnum || ' ' || a.attname || ' '
		   || format_type(a.atttypid, a.atttypmod) || ' notnull=' || a.attnotnull
		   || ' default=' || coalesce(pg_get_expr(ad.adbin, ad.adrelid), '')
		   || ' identity=' || a.attidentity::text || ' generated=' || a.attgenerated::text
		   || ' collation=' || coalesce(a.attcollation::regcollation::text, '')
		   || ' storage=' || a.attstorage::text || ' acl=' || coalesce(a.attacl::text, '')
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
		   || ' acl=' || coalesce(p.proacl::text, '')
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
		   || ' acl=' || coalesce(t.typacl::text, '')
		   || ' comment=' || coalesce(obj_description(t.oid, 'pg_type'), '')
	  FROM pg_type t WHERE t.typnamespace = 'outbox'::regnamespace
	UNION ALL
	SELECT 'operator ' || o.oid::regoperator || ' ' || o.oprcode::regprocedure
	  FROM pg_operator o WHERE o.oprnamespace = 'outbox'::regnamespace
	UNION ALL
	SELECT 'initprivs ' || o.type || ' ' || o.identity || ' ' || i.privtype::text || ' ' || i.initprivs::text
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

my @versions = split /\n/, sql('postgres', q{
SELECT version FROM pg_available_extension_versions WHERE name = 'outbox'
 ORDER BY string_to_array(version, '.')::int[]});
my $newest = sql('postgres', q{SELECT default_version FROM pg_available_extensions WHERE name = 'outbox'});
ok(scalar(@versions) >= 1, 'versions offered: ' . join(', ', @versions) . "; default $newest");

# A fresh install of the default version is the reference.
sql('postgres', 'CREATE DATABASE fresh');
sql('fresh', 'CREATE EXTENSION outbox');
my $reference = sql('fresh', $describe);
like($reference, qr/^function-flags outbox\.claim\(.*secdef=false config=\{"search_path=pg_catalog, pg_temp"\}/m,
	'the description covers function settings');
like($reference, qr/^initprivs function outbox\.claim\(.*<db>_outbox_publisher=X/m,
	'the description covers initial privileges');

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

# Every version, updated to the default one.
foreach my $v (@versions)
{
	my $db = "from_" . ($v =~ s/\W/_/gr);
	sql('postgres', "CREATE DATABASE $db");
	sql($db, "CREATE EXTENSION outbox VERSION '$v'");
	sql($db, q{
SELECT outbox.commit_decision('run', 1, 'decided', 'c-1', 'k', '{"n": 1}');
SELECT outbox.commit_decision('run', 2, 'decided', 'c-2', 'k', '{"n": 2}');
SELECT count(*) FROM outbox.claim('w', 1);
SELECT outbox.set_policy('k', max_deliveries => 3);});
	my $data = sql($db, q{
SELECT (SELECT string_agg(c::text, E'\n' ORDER BY command_id) FROM outbox.commands c)
	|| E'\n' || (SELECT string_agg(e::text, E'\n' ORDER BY seq) FROM outbox.events e)
	|| E'\n' || (SELECT string_agg(p::text, E'\n' ORDER BY kind) FROM outbox.policies p)});

	sql($db, 'ALTER EXTENSION outbox UPDATE');
	is(sql($db, q{SELECT extversion FROM pg_extension WHERE extname = 'outbox'}), $newest,
		"from $v: ALTER EXTENSION UPDATE reaches $newest");
	is(difference($reference, sql($db, $describe)), '',
		"from $v: the updated schema equals a fresh install's");
	is(sql($db, q{
SELECT (SELECT string_agg(c::text, E'\n' ORDER BY command_id) FROM outbox.commands c)
	|| E'\n' || (SELECT string_agg(e::text, E'\n' ORDER BY seq) FROM outbox.events e)
	|| E'\n' || (SELECT string_agg(p::text, E'\n' ORDER BY kind) FROM outbox.policies p)}),
		$data, "from $v: the data is untouched");
	is(sql($db, q{
CREATE TEMP TABLE l AS SELECT * FROM outbox.claim('w2', 10);
SELECT string_agg(command_id || ' v' || version, ',') FROM l;
SELECT 'acked' FROM outbox.ack('w2', (SELECT token FROM l WHERE command_id = 'c-2')) a;
SELECT coalesce(string_agg(check_name, ','), 'clean') FROM outbox.conservation WHERE violations > 0;}),
		"c-2 v2\nacked\nclean", "from $v: the API works after the update");
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
is(difference($reference, sql('second', $describe)), '', 'the second database gets the same schema');

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
is(difference($reference, sql('fresh', $describe)), '', 'installing again gives the same schema');
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
my ($rc, $out, $err) = $node->psql('defaults', 'CREATE EXTENSION outbox');
is($rc, 0, 'CREATE EXTENSION works under default privileges for another role');
like($err, qr/WARNING:  revoked what the default privileges of role "\w+" granted role "reader"/,
	'... saying that it took them back');
is(difference($reference, sql('defaults', $describe)), '', '... and the privileges are exactly the usual ones');
is(sql('defaults', q{SELECT has_table_privilege('reader', 'outbox.commands', 'SELECT')
	OR has_function_privilege('reader', 'outbox._require_id(text, text)', 'EXECUTE')}), 'f',
	'... reader can neither read a table nor call a helper');

sql('defaults', 'DROP EXTENSION outbox; ALTER DEFAULT PRIVILEGES GRANT SELECT ON TABLES TO pg_monitor');
($rc, $out, $err) = $node->psql('defaults', 'CREATE EXTENSION outbox');
isnt($rc, 0, 'CREATE EXTENSION fails when default privileges grant to a role of the matrix');
like($err, qr/the default privileges of role "\w+" grant privileges to role "pg_monitor"/, '... naming it');
sql('defaults', 'ALTER DEFAULT PRIVILEGES REVOKE SELECT ON TABLES FROM pg_monitor');
sql('defaults', 'CREATE EXTENSION outbox');
is(difference($reference, sql('defaults', $describe)), '',
	"without that it installs as usual, reader's grants taken back again");

$node->stop;
done_testing();
