# Objects planted in public and pg_temp never run in place of ours.
#
# 1. The install and upgrade scripts qualify every object and operator
#    (a lexical check of every outbox--*.sql installed): no unqualified
#    operator or function call, no construct that compares with an operator
#    found by search_path (simple CASE, IN, BETWEEN, LIKE, NULLIF, IS
#    DISTINCT FROM), no CREATE OR REPLACE, no IF NOT EXISTS.
# 2. An unprivileged role that owns the database (so it owns the schema
#    public and may set the database's search_path) plants functions,
#    aggregates, operators and function-style casts named like what the
#    extension uses in public, temp views named like its tables in pg_temp,
#    and makes public, pg_catalog the database's search_path.  Each trap
#    records its execution in public.hijack_log.  A control run shows that
#    every trap fires for a careless query; then CREATE EXTENSION, every API
#    function (called by that role, a member of the four group roles, and by
#    a superuser), every view, the background worker's sweep and purge,
#    ALTER EXTENSION UPDATE from every older version (installed by that
#    release's own binaries, OutboxTest's outbox_release_install), and
#    DROP + CREATE EXTENSION run under those settings, and the log stays
#    empty.
# 3. CREATE EXTENSION refuses a schema named outbox that an untrusted role
#    owns or may create objects in, or that holds objects of its own.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use FindBin;
use lib "$FindBin::RealBin/../perl";
use OutboxTest;

my $node = outbox_node('hijack', qq{
outbox.naptime = '200ms'
});

# ---------------------------------------------------------------------------
# 1. The scripts, read as installed.

# Keywords and syntax that may precede "(" without being a function call.
my %paren_ok = map { $_ => 1 } qw(
  COALESCE GREATEST LEAST EXISTS ARRAY ANY ALL SOME VALUES ROW CAST FILTER
  OVER KEY CHECK UNIQUE AS AND OR NOT WHERE SELECT THEN ELSE WHEN ON USING
  FROM JOIN LATERAL BY LIMIT RETURNING INTO WITH TABLE IF RECURSIVE
  MATERIALIZED IS CASE OFFSET EXCEPT UNION INTERSECT SET IN INCLUDE);
# Options of RAISE ... USING, written "name = value".
my %raise_opt = map { $_ => 1 } qw(ERRCODE DETAIL HINT MESSAGE COLUMN CONSTRAINT
  DATATYPE TABLE SCHEMA);
# Keywords that end the assignment list of an UPDATE ... SET.
my %set_end = map { $_ => 1 } qw(WHERE FROM RETURNING LANGUAGE AS ON);

# Return the problems of one script: each operator must be written
# OPERATOR(pg_catalog.x), each function call qualified, and nothing may
# compare with an operator looked up through search_path.  Assignments
# (UPDATE ... SET a = b, SET search_path = ..., RAISE ... USING x = y,
# GET DIAGNOSTICS n = ..., WITH (fillfactor = n)), count(*), x.* and
# negative constants are not operators.  Function bodies are checked too:
# dollar quotes are read through.
sub lint_sql
{
	my ($sql) = @_;
	my @problems;
	$sql =~ s/\@extschema\@/outbox/g;
	$sql =~ s/^\\[^\n]*$//mg;    # psql meta-commands (\echo ... \quit)
	my @t;                        # [type, text, line]
	my $line = 1;
	while (
		$sql =~ /\G(?:(\s+)|(--[^\n]*)|(\/\*.*?\*\/)|(\$(?:[A-Za-z_]\w*)?\$)
				|([Ee]'(?:[^'\\]|\\.|'')*')|('(?:[^']|'')*')|("(?:[^"]|"")*")
				|([A-Za-z_][A-Za-z_0-9\$]*)|(\d+(?:\.\d+)?)|(::|:=|=>)
				|([-+*\/<>=~!\@\#%^&|`?]+)|([(),;\[\].:]))/gcsx)
	{
		my $m = $&;
		my $type =
			defined $1 || defined $2 || defined $3 || defined $4 ? undef
		  : defined $5 || defined $6 ? 'str'
		  : defined $7 ? 'qid'
		  : defined $8 ? 'id'
		  : defined $9 ? 'num'
		  : defined $10 ? 'punct'
		  : defined $11 ? 'op'
		  : 'punct';
		push @t, [ $type, $m, $line ] if defined $type;
		$line += ($m =~ tr/\n//);
	}
	push @problems, "cannot read the script after line $line"
	  if (pos($sql) // 0) < length $sql;

	my $depth = 0;
	my ($in_set, $set_depth) = (0, 0);
	for (my $i = 0; $i < @t; $i++)
	{
		my ($type, $text, $ln) = @{ $t[$i] };
		my $prev  = $i > 0 ? $t[ $i - 1 ] : [ '', '' ];
		my $prev2 = $i > 1 ? $t[ $i - 2 ] : [ '', '' ];
		my $prev3 = $i > 2 ? $t[ $i - 3 ] : [ '', '' ];
		my $next  = $i + 1 < @t ? $t[ $i + 1 ] : [ '', '' ];
		my $uc    = uc $text;

		if ($text eq '(') { $depth++; next; }
		if ($text eq ')')
		{
			$depth--;
			$in_set = 0 if $in_set && $depth < $set_depth;
			next;
		}
		if ($text eq ';') { $in_set = 0; next; }
		if ($type eq 'id')
		{
			if ($uc eq 'SET') { ($in_set, $set_depth) = (1, $depth); }
			elsif ($in_set && $depth == $set_depth && $set_end{$uc}) { $in_set = 0; }

			if (   $uc eq 'NULLIF'
				|| $uc eq 'BETWEEN'
				|| $uc eq 'LIKE'
				|| $uc eq 'ILIKE'
				|| $uc eq 'SIMILAR'
				|| ($uc eq 'IN' && $next->[1] eq '(')
				|| ($uc eq 'DISTINCT' && $prev->[1] =~ /^(?:IS|NOT)$/i)
				|| ($uc eq 'CASE' && uc($next->[1]) ne 'WHEN'))
			{
				push @problems, "line $ln: $text compares with an operator found by search_path";
				next;
			}
			if ($uc eq 'OPERATOR' && $next->[1] eq '(')
			{
				my $ok = $i + 5 < @t
				  && lc($t[ $i + 2 ][1]) eq 'pg_catalog'
				  && $t[ $i + 3 ][1] eq '.'
				  && $t[ $i + 4 ][0] eq 'op'
				  && $t[ $i + 5 ][1] eq ')';
				push @problems, "line $ln: OPERATOR() not qualified with pg_catalog" unless $ok;
				$i += 5 if $ok;
				next;
			}
			# An unqualified name followed by "(" is a call, unless it is
			# syntax or the name of a CTE or alias with a column list.
			if (   $next->[1] eq '('
				&& $prev->[1] ne '.'
				&& !$paren_ok{$uc}
				&& uc($prev->[1]) ne 'AS')
			{
				my ($d, $j) = (0, $i + 1);
				for (; $j < @t; $j++)
				{
					$d++ if $t[$j][1] eq '(';
					$d-- if $t[$j][1] eq ')';
					last if $d == 0;
				}
				next if $j + 1 < @t && uc($t[ $j + 1 ][1]) eq 'AS';
				push @problems, "line $ln: unqualified call $text(";
			}
			next;
		}
		next unless $type eq 'op';

		if ($text eq '=')
		{
			next if $prev->[0] eq 'id' && $raise_opt{ uc $prev->[1] };
			next if $prev->[0] eq 'id' && uc($prev2->[1]) eq 'DIAGNOSTICS';
			next if $prev->[0] eq 'id' && $prev2->[1] eq '(' && uc($prev3->[1]) eq 'WITH';
			next
			  if $in_set
			  && $depth == $set_depth
			  && $prev->[0] eq 'id'
			  && (uc($prev2->[1]) eq 'SET' || $prev2->[1] eq ',');
		}
		if ($text eq '*')
		{
			next if $prev->[1] eq '(' && $next->[1] eq ')';
			next if $prev->[1] eq '.';
			next
			  if (uc($prev->[1]) eq 'SELECT' || $prev->[1] eq ',')
			  && (uc($next->[1]) eq 'FROM' || $next->[1] eq ',');
		}
		next
		  if $text eq '-'
		  && $next->[0] eq 'num'
		  && ( $prev->[0] eq 'op'
			|| $prev->[1] =~ /^[(,]$/
			|| ($prev->[0] eq 'id' && $prev->[1] =~ /^(?:THEN|ELSE|SELECT|DEFAULT|WHEN|RETURN)$/i));
		push @problems, "line $ln: unqualified operator $text";
	}
	return @problems;
}

# The checker itself must catch what it is meant to catch.
my @seeded = lint_sql(q{
SELECT now(), a = b, c || d, count(*) FROM t WHERE x OPERATOR(public.=) 1;
UPDATE t SET a = 1, b = c = d WHERE e IN (1, 2) AND CASE f WHEN 1 THEN true END;
});
is(scalar(@seeded), 9, 'the script check finds seeded unqualified uses')
  or diag(join("\n", @seeded));

my $extdir = $node->config_data('--sharedir') . '/extension';
my @scripts = sort glob("$extdir/outbox--*.sql");
ok(scalar(@scripts) > 0, "install scripts found in $extdir");
foreach my $file (@scripts)
{
	my $name = $file =~ s{.*/}{}r;
	my $sql  = slurp_file($file);
	my @problems = lint_sql($sql);
	is(scalar(@problems), 0, "$name: every operator and function call is qualified")
	  or diag(join("\n", @problems));
	unlike($sql, qr/\bCREATE\s+OR\s+REPLACE\b/i, "$name: no CREATE OR REPLACE");
	# DDL's IF NOT EXISTS is followed by a name; PL/pgSQL's IF NOT EXISTS (...) is a test.
	unlike($sql, qr/\bIF\s+NOT\s+EXISTS\b(?!\s*\()/i, "$name: no IF NOT EXISTS");
}

# ---------------------------------------------------------------------------
# 2. Traps.

$node->safe_psql('postgres', q{
CREATE ROLE mallory LOGIN;
CREATE DATABASE hijack OWNER mallory;
CREATE DATABASE hijack2 OWNER mallory;
});

# Harness queries run with a clean search_path so that they cannot fire a
# trap themselves.
sub sql
{
	my ($db, $query, %opts) = @_;
	return $node->safe_psql($db, "SET search_path = pg_catalog, pg_temp;\n$query", %opts);
}

sub as_mallory
{
	my ($db, $query) = @_;
	return $node->safe_psql($db, $query, extra_params => [ '-U', 'mallory' ]);
}

# Each trap: [name, DDL run by mallory in public, a careless query that
# would run it].  The trap functions compute the right answer with
# pg_catalog's objects, so a hijacked call would go on working; only the
# log tells.
my @traps;
sub trap_fn
{
	my ($name, $args, $ret, $body, $control) = @_;
	push @traps, [
		$name,
		qq{CREATE FUNCTION public.$name($args) RETURNS $ret LANGUAGE plpgsql AS \$f\$
BEGIN
	PERFORM public.hijack_note('$name($args)');
	$body
END;
\$f\$;},
		$control ];
	return;
}
trap_fn('now', '', 'timestamptz', 'RETURN pg_catalog.now();', 'SELECT now()');
trap_fn('clock_timestamp', '', 'timestamptz', 'RETURN pg_catalog.clock_timestamp();',
	'SELECT clock_timestamp()');
trap_fn('format', 'fmt text, a text', 'text', 'RETURN pg_catalog.format(fmt, a);',
	q{SELECT format('%s', 'x')});
trap_fn('format', 'fmt text, a text, b text', 'text', 'RETURN pg_catalog.format(fmt, a, b);',
	q{SELECT format('%s %s', 'x', 'y')});
trap_fn('format', 'fmt text, a name', 'text', 'RETURN pg_catalog.format(fmt, a);',
	q{SELECT format('%I', 'x'::name)});
trap_fn('unnest', 'a text[]', 'SETOF text', 'RETURN QUERY SELECT pg_catalog.unnest(a);',
	q{SELECT unnest('{a}'::text[])});
trap_fn('unnest', 'a bigint[]', 'SETOF bigint', 'RETURN QUERY SELECT pg_catalog.unnest(a);',
	q{SELECT unnest('{1}'::bigint[])});
trap_fn('unnest', 'a jsonb[]', 'SETOF jsonb', 'RETURN QUERY SELECT pg_catalog.unnest(a);',
	q{SELECT unnest('{"{}"}'::jsonb[])});
trap_fn('unnest', 'a timestamptz[]', 'SETOF timestamptz', 'RETURN QUERY SELECT pg_catalog.unnest(a);',
	q{SELECT unnest('{2000-01-01}'::timestamptz[])});
trap_fn('unnest', 'a integer[]', 'SETOF integer', 'RETURN QUERY SELECT pg_catalog.unnest(a);',
	q{SELECT unnest('{1}'::integer[])});
trap_fn('cardinality', 'a text[]', 'integer', 'RETURN pg_catalog.cardinality(a);',
	q{SELECT cardinality('{a}'::text[])});
trap_fn('array_remove', 'a text[], e text', 'text[]', 'RETURN pg_catalog.array_remove(a, e);',
	q{SELECT array_remove('{a}'::text[], 'a'::text)});
trap_fn('array_to_string', 'a text[], d text', 'text', 'RETURN pg_catalog.array_to_string(a, d);',
	q{SELECT array_to_string('{a}'::text[], ',')});
trap_fn('concat_ws', 'd text, a text, b text', 'text', 'RETURN pg_catalog.concat_ws(d, a, b);',
	q{SELECT concat_ws(';', 'a'::text, 'b'::text)});
trap_fn('octet_length', 'a text', 'integer', 'RETURN pg_catalog.octet_length(a);',
	q{SELECT octet_length('a'::text)});
trap_fn('current_setting', 'a text', 'text', 'RETURN pg_catalog.current_setting(a);',
	q{SELECT current_setting('work_mem')});
trap_fn('current_setting', 'a text, m boolean', 'text', 'RETURN pg_catalog.current_setting(a, m);',
	q{SELECT current_setting('work_mem', true)});
trap_fn('date_part', 'f text, i interval', 'double precision', 'RETURN pg_catalog.date_part(f, i);',
	q{SELECT date_part('epoch', '1 second'::interval)});
trap_fn('jsonb_build_object', 'k text, v text', 'jsonb',
	'RETURN pg_catalog.jsonb_build_object(k, v);', q{SELECT jsonb_build_object('a', 'b')});
trap_fn('pg_extension_config_dump', 'r text, c text', 'void', 'RETURN;',
	q{SELECT pg_extension_config_dump('x', '')});
trap_fn('aclexplode', 'a aclitem[]',
	'TABLE (grantor oid, grantee oid, privilege_type text, is_grantable boolean)',
	'RETURN QUERY SELECT * FROM pg_catalog.aclexplode(a);',
	q{SELECT * FROM aclexplode(pg_catalog.acldefault('f', 10::oid))});
trap_fn('preloaded', '', 'boolean', 'RETURN true;', 'SELECT preloaded()');
# function-style casts
trap_fn('text', 'a integer', 'text', 'RETURN a::pg_catalog.text;', 'SELECT text(1)');
trap_fn('int8', 'a integer', 'bigint', 'RETURN a::pg_catalog.int8;', 'SELECT int8(1)');
trap_fn('interval', 'a text', 'interval', 'RETURN a::pg_catalog.interval;',
	q{SELECT "interval"('1 day'::text)});
trap_fn('jsonb', 'a text', 'jsonb', 'RETURN a::pg_catalog.jsonb;', q{SELECT jsonb('{}'::text)});
# the functions behind the operators, called by name
trap_fn('texteq', 'a text, b text', 'boolean', 'RETURN a OPERATOR(pg_catalog.=) b;',
	q{SELECT texteq('a', 'b')});

# Aggregates: name, signature, state type, state function arguments and
# body, initial state, control.
sub trap_agg
{
	my ($name, $sig, $stype, $sfargs, $sfbody, $init, $control) = @_;
	my $sf = "trap_${name}_sf";
	push @traps, [
		"$name($sig)",
		qq{CREATE FUNCTION public.$sf($sfargs) RETURNS $stype LANGUAGE plpgsql AS \$f\$
BEGIN
	PERFORM public.hijack_note('$name($sig)');
	$sfbody
END;
\$f\$;
CREATE AGGREGATE public.$name($sig) (SFUNC = public.$sf, STYPE = $stype}
		  . (defined $init ? ", INITCOND = '$init'" : '') . ');',
		$control ];
	return;
}
trap_agg('count', '*', 'bigint', 's bigint', 'RETURN s OPERATOR(pg_catalog.+) 1;', '0',
	'SELECT count(*) FROM (VALUES (1)) v(x)');
trap_agg('array_agg', 'text', 'text[]', 's text[], v text', 'RETURN pg_catalog.array_append(s, v);',
	undef, q{SELECT array_agg(x) FROM (VALUES ('a'::text)) v(x)});
trap_agg('min', 'timestamptz', 'timestamptz', 's timestamptz, v timestamptz',
	'RETURN LEAST(s, v);', undef,
	q{SELECT min(x) FROM (VALUES ('2000-01-01'::timestamptz)) v(x)});
trap_agg('bool_or', 'boolean', 'boolean', 's boolean, v boolean', 'RETURN s OR v;', undef,
	'SELECT bool_or(x) FROM (VALUES (true)) v(x)');
trap_agg('string_agg', 'text, text', 'text', 's text, v text, d text',
	'RETURN pg_catalog.concat_ws(d, s, v);', undef,
	q{SELECT string_agg(x, ',') FROM (VALUES ('a'::text)) v(x)});

# Operators: [operator, left type, right type, result type, control].
my $nops = 0;
sub trap_op
{
	my ($op, $l, $r, $ret, $control) = @_;
	my $fn = 'trap_op_' . ++$nops;
	push @traps, [
		"$op($l,$r)",
		qq{CREATE FUNCTION public.$fn(a $l, b $r) RETURNS $ret LANGUAGE plpgsql AS \$f\$
BEGIN
	PERFORM public.hijack_note('$op($l,$r)');
	RETURN a OPERATOR(pg_catalog.$op) b;
END;
\$f\$;
CREATE OPERATOR public.$op (LEFTARG = $l, RIGHTARG = $r, FUNCTION = public.$fn);},
		$control ];
	return;
}
trap_op('=', 'text', 'text', 'boolean', q{SELECT 'a'::text = 'b'::text});
trap_op('<>', 'text', 'text', 'boolean', q{SELECT 'a'::text <> 'b'::text});
trap_op('=', 'bigint', 'bigint', 'boolean', 'SELECT 1::bigint = 2::bigint');
trap_op('=', 'integer', 'integer', 'boolean', 'SELECT 1 = 2');
trap_op('<', 'integer', 'integer', 'boolean', 'SELECT 1 < 2');
trap_op('>=', 'integer', 'integer', 'boolean', 'SELECT 1 >= 2');
trap_op('>=', 'bigint', 'integer', 'boolean', 'SELECT 1::bigint >= 2');
trap_op('+', 'bigint', 'integer', 'bigint', 'SELECT 1::bigint + 2');
trap_op('-', 'bigint', 'integer', 'bigint', 'SELECT 1::bigint - 2');
trap_op('=', 'oid', 'oid', 'boolean', 'SELECT 1::oid = 2::oid');
trap_op('=', 'name', 'text', 'boolean', q{SELECT 'a'::name = 'b'::text});
trap_op('<=', 'timestamptz', 'timestamptz', 'boolean', 'SELECT now() <= now()');
trap_op('<', 'timestamptz', 'timestamptz', 'boolean', 'SELECT now() < now()');
trap_op('>', 'timestamptz', 'timestamptz', 'boolean', 'SELECT now() > now()');
trap_op('-', 'timestamptz', 'timestamptz', 'interval', 'SELECT now() - now()');
trap_op('-', 'timestamptz', 'interval', 'timestamptz', q{SELECT now() - '1 day'::interval});
trap_op('+', 'timestamptz', 'interval', 'timestamptz', q{SELECT now() + '1 day'::interval});
trap_op('<', 'interval', 'interval', 'boolean', q{SELECT '1 day'::interval < '2 days'::interval});
trap_op('>', 'interval', 'interval', 'boolean', q{SELECT '1 day'::interval > '2 days'::interval});
trap_op('<=', 'interval', 'interval', 'boolean', q{SELECT '1 day'::interval <= '2 days'::interval});
trap_op('||', 'text[]', 'text', 'text[]', q{SELECT '{a}'::text[] || 'b'::text});
trap_op('||', 'text', 'text', 'text', q{SELECT 'a'::text || 'b'::text});
trap_op('~~', 'text', 'text', 'boolean', q{SELECT 'a'::text LIKE 'b'::text});

# Temp views named like the extension's tables, and like catalogs; they
# live in the session that creates them, so each hostile session makes its
# own (pg_temp comes first for relations unless search_path names it).
my $temp_traps = join("\n",
	map { "CREATE TEMP VIEW $_ AS SELECT * FROM public.trap_rows('pg_temp.$_');" }
	  qw(commands events receipts inbox policies purged pg_roles pg_namespace));
push @traps, [ "pg_temp.$_", '', "SELECT * FROM $_" ] foreach qw(commands events receipts inbox policies purged pg_roles pg_namespace);

my $setup = q{
ALTER DATABASE hijack SET search_path = public, pg_catalog;
CREATE TABLE public.hijack_log (
	trap	text NOT NULL,
	by_role	text NOT NULL,
	query	text,
	at		timestamptz NOT NULL DEFAULT pg_catalog.clock_timestamp()
);
GRANT SELECT, INSERT ON public.hijack_log TO PUBLIC;
CREATE FUNCTION public.hijack_note(trap text) RETURNS void LANGUAGE plpgsql AS $f$
BEGIN
	INSERT INTO public.hijack_log (trap, by_role, query)
	VALUES (trap, CURRENT_USER, pg_catalog.current_query());
END;
$f$;
CREATE FUNCTION public.trap_rows(what text, OUT x integer) RETURNS SETOF integer LANGUAGE plpgsql AS $f$
BEGIN
	PERFORM public.hijack_note(what);
END;
$f$;
} . join("\n", map { $_->[1] } grep { $_->[1] ne '' } @traps);

as_mallory('hijack', $setup);
as_mallory('hijack2', $setup =~ s/DATABASE hijack /DATABASE hijack2 /r);

my $ntraps = scalar(@traps);
# Mallory's traps are live: a careless query runs each of them.
is( as_mallory('hijack',
		"BEGIN;\n$temp_traps\n\\o /dev/null\n"
		  . join(";\n", map { $_->[2] } @traps) . ";\n\\o\n"
		  . "SELECT pg_catalog.count(DISTINCT trap) FROM public.hijack_log;\nROLLBACK;"),
	$ntraps,
	"control: all $ntraps traps fire for unqualified queries under search_path = public, pg_catalog");

sub log_rows
{
	my ($db) = @_;
	return sql($db, q{SELECT pg_catalog.string_agg(trap || ' (by ' || by_role || ': ' || pg_catalog.left(query, 120) || ')', E'\n' ORDER BY at) FROM public.hijack_log});
}

sub log_is_empty
{
	my ($db, $what) = @_;
	my $rows = log_rows($db);
	is($rows, '', "no trap ran: $what") or diag($rows);
	return;
}

# A superuser installs the extension in mallory's database, in a session
# with the database's hostile search_path and traps of its own in pg_temp.
is(sql('hijack', 'SHOW search_path'), 'pg_catalog, pg_temp', 'harness sessions override the search_path');
is($node->safe_psql('hijack', 'SHOW search_path'), 'public, pg_catalog',
	'other sessions get the hostile search_path of the database');
$node->safe_psql('hijack', "$temp_traps\nCREATE EXTENSION outbox;");
log_is_empty('hijack', 'CREATE EXTENSION');

# Mallory joins every group role; a superuser grants it.
sql('hijack', 'GRANT hijack_outbox_producer, hijack_outbox_publisher, hijack_outbox_consumer, hijack_outbox_admin, pg_monitor TO mallory');

# Every API function and view, with fresh command ids and kinds of prefix
# $p.  The statements use literals only, so that the caller's own SQL runs
# no trap.  Leaves $p-1 and $p-2 purged, $p-3 and $p-4 pending and $p-5
# leased with a lease that has run out.
sub api_script
{
	my ($p) = @_;
	return qq{
$temp_traps
SELECT outbox.commit_decision('$p-run', 1, 'decided', '$p-1', '$p-k', '{"amount": 1}');
SELECT outbox.commit_decision('$p-run', 2, 'decided', '$p-2', '$p-k', '{}', '{"why": 2}', '2000-01-01', 5);
SELECT * FROM outbox.commit_decisions('[{"run_id": "$p-run", "seq": 3, "event_kind": "decided", "command_id": "$p-3",
	"command_kind": "$p-k", "payload": {}, "event_payload": {}, "priority": 1},
	{"run_id": "$p-run", "seq": "4", "event_kind": "decided", "command_id": "$p-4", "command_kind": "$p-k",
	"payload": {}, "not_before": "2000-01-01", "priority": 2}]');
SELECT outbox.record_event('$p-run', 5, 'note', '{"n": 5}');
SELECT outbox.set_policy('$p-manual', takeover => 'manual', lease => '1 minute', max_deliveries => 3,
	backoff_base => '1 second', backoff_max => '1 minute', retention => '1 day');
SELECT outbox.commit_decision('$p-run', 6, 'decided', '$p-5', '$p-manual', '{}');
SELECT pg_catalog.max(token) FILTER (WHERE command_id OPERATOR(pg_catalog.=) '$p-1') AS t1,
	   pg_catalog.max(token) FILTER (WHERE command_id OPERATOR(pg_catalog.=) '$p-2') AS t2,
	   pg_catalog.max(token) FILTER (WHERE command_id OPERATOR(pg_catalog.=) '$p-3') AS t3,
	   pg_catalog.max(token) FILTER (WHERE command_id OPERATOR(pg_catalog.=) '$p-4') AS t4
  FROM outbox.claim('$p-w', 4, '30 seconds', '{$p-k}') \\gset
SELECT outbox.ack('$p-w', :'t1');
SELECT * FROM outbox.ack_many('$p-w', ARRAY[:'t2', 'not a token']);
SELECT outbox.fail('$p-w', :'t3', 'timeout');
SELECT outbox.renew('$p-w', :'t4', '1 minute');
SELECT outbox.renew('$p-w', :'t4');
SELECT outbox.fail('$p-w', :'t4', 'rejected', true);
SELECT outbox.requeue('$p-run', '$p-4');
SELECT token AS t5 FROM outbox.claim('$p-w', 1, kinds => '{$p-manual}') \\gset
SELECT outbox.pause('$p-manual');
SELECT outbox.resume('$p-manual');
SELECT outbox.complete('$p-run', '$p-1');
SELECT outbox.complete('$p-run', '$p-1');
SELECT outbox.complete('$p-run', '$p-2', 'failed', '{"code": 7}');
SELECT outbox.register_consumer('$p-consumer', 'mallory');
SELECT outbox.inbox_accept('$p-consumer', '$p-run', '$p-1');
SELECT outbox.inbox_accept('$p-consumer', '$p-run', '$p-1');
SELECT outbox.unregister_consumer('$p-other');
SELECT outbox.sweep();
SELECT outbox.sweep(10);
SELECT outbox.purge();
SELECT outbox.purge(10, '0 seconds');
SELECT outbox.complete('$p-run', '$p-1');
SELECT outbox.preloaded();
SELECT * FROM outbox.stats;
SELECT * FROM outbox.workers;
SELECT * FROM outbox.conservation;
SELECT * FROM outbox.check_decisions_without_command;
SELECT * FROM outbox.check_orphan_commands;
SELECT * FROM outbox.check_orphan_receipts;
SELECT * FROM outbox.check_state;
SELECT * FROM outbox.check_receipt_overdue;
SELECT * FROM outbox.backlog;
SELECT * FROM outbox.leases;
SELECT * FROM outbox.dead_letters;
SELECT outbox.verify();
SELECT outbox.verify(true);
SELECT outbox.stats_reset();
SELECT outbox.renew('$p-w', :'t5', '1 millisecond');
};
}

# Then the sweep (ours or the worker's) moves $p-5 to uncertain, and an
# administrator resolves it.
sub resolve_script
{
	my ($p) = @_;
	return qq{
$temp_traps
SELECT outbox.resolve('$p-run', '$p-5', 'retry');
SELECT * FROM outbox.dead_letters;
};
}

sub states
{
	my ($p) = @_;
	return sql('hijack', qq{
SELECT string_agg(command_id || ':' || status, ',' ORDER BY command_id)
  FROM outbox.commands WHERE starts_with(command_id, '$p-')
UNION ALL
SELECT string_agg(command_id, ',' ORDER BY command_id)
  FROM outbox.purged WHERE starts_with(command_id, '$p-')});
}

sub wait_uncertain
{
	my ($id) = @_;
	$node->poll_query_until('hijack', qq{
SELECT outbox.sweep() OPERATOR(pg_catalog.>=) 0
   AND (SELECT c.status OPERATOR(pg_catalog.=) 'uncertain' FROM outbox.commands c
		 WHERE c.command_id OPERATOR(pg_catalog.=) '$id')})
	  or die "$id never became uncertain";
	return;
}

foreach my $caller ([ 'mallory', 'm' ], [ 'a superuser', 's' ])
{
	my ($who, $p) = @$caller;
	my $run = $who eq 'mallory' ? \&as_mallory : sub { $node->safe_psql($_[0], $_[1]) };
	$run->('hijack', api_script($p));
	# $p-5's lease of 1 ms may already have been swept to uncertain.
	like(states($p), qr/^\Q$p\E-3:pending,\Q$p\E-4:pending,\Q$p\E-5:(?:sending|uncertain)\n\Q$p\E-1,\Q$p\E-2$/,
		"the API worked for $who under the hostile settings");
	wait_uncertain("$p-5");
	$run->('hijack', resolve_script($p));
	is(sql('hijack', qq{SELECT status FROM outbox.commands WHERE command_id = '$p-5'}), 'pending',
		"$p-5 resolved by $who");
	log_is_empty('hijack', "every API function and view, called by $who");
}

# The worker, started under the database's hostile settings, sweeps an
# expired lease and purges a command past its retention.
$node->restart;
sql('hijack', q{
SELECT outbox.set_policy('w-manual', takeover => 'manual');
SELECT outbox.set_policy('w-short', retention => '0 seconds');
SELECT outbox.commit_decision('w-run', 1, 'decided', 'w-1', 'w-manual', '{}');
SELECT outbox.commit_decision('w-run', 2, 'decided', 'w-2', 'w-short', '{}');
SELECT count(*) FROM outbox.claim('w-w', 1, '1 millisecond', '{w-manual}');
SELECT outbox.ack('w-w', token) FROM outbox.claim('w-w', 1, '1 minute', '{w-short}');
SELECT outbox.complete('w-run', 'w-2');
});
$node->poll_query_until('hijack', q{
SELECT (SELECT c.status OPERATOR(pg_catalog.=) 'uncertain' FROM outbox.commands c
		 WHERE c.command_id OPERATOR(pg_catalog.=) 'w-1')
   AND EXISTS (SELECT FROM outbox.purged p WHERE p.command_id OPERATOR(pg_catalog.=) 'w-2')})
  or die 'the worker neither swept nor purged';
log_is_empty('hijack', 'the background worker swept and purged');

# ALTER EXTENSION UPDATE from every older version to the newest, then
# DROP and CREATE again; all under the hostile settings.
my @versions = split /\n/, sql('hijack', q{
SELECT version FROM pg_available_extension_versions WHERE name OPERATOR(pg_catalog.=) 'outbox'
 ORDER BY pg_catalog.string_to_array(version, '.')::pg_catalog.int4[]});
my $newest = sql('hijack', q{SELECT default_version FROM pg_available_extensions WHERE name OPERATOR(pg_catalog.=) 'outbox'});
$node->safe_psql('hijack', "$temp_traps\nALTER EXTENSION outbox UPDATE;");
foreach my $v (@versions)
{
	if ($v eq $newest)
	{
		$node->safe_psql('hijack', qq{$temp_traps
DROP EXTENSION outbox;
CREATE EXTENSION outbox VERSION '$v';
ALTER EXTENSION outbox UPDATE;});
	}
	else
	{
		# an older version is installed by its own release's binaries,
		# then updated by this build's, as a package upgrade does
		my ($release) = outbox_release_install($v);
		$node->safe_psql('hijack', "$temp_traps\nDROP EXTENSION outbox;");
		$node->stop;
		outbox_use_install($node, $release);
		$node->start;
		$node->safe_psql('hijack', "$temp_traps\nCREATE EXTENSION outbox VERSION '$v';");
		$node->stop;
		outbox_use_install($node, undef);
		$node->start;
		$node->safe_psql('hijack', "$temp_traps\nALTER EXTENSION outbox UPDATE;");
	}
	is(sql('hijack', q{SELECT extversion FROM pg_extension WHERE extname OPERATOR(pg_catalog.=) 'outbox'}),
		$newest, "from $v: updated to $newest");
}
$node->safe_psql('hijack', "$temp_traps\nDROP EXTENSION outbox;\nCREATE EXTENSION outbox;");
log_is_empty('hijack', 'ALTER EXTENSION UPDATE from every version, DROP and CREATE EXTENSION');

# And the reinstalled extension still works for mallory.
as_mallory('hijack', api_script('r'));
# As above, r-5's lease of 1 ms may already have been swept to uncertain.
like(states('r'), qr/^r-3:pending,r-4:pending,r-5:(?:sending|uncertain)\nr-1,r-2$/,
	'the API works after reinstalling');
log_is_empty('hijack', 'the API after reinstalling');

# ---------------------------------------------------------------------------
# 3. A schema named outbox that an untrusted role owns, or may create
# objects in, or that holds other objects, is refused.

as_mallory('hijack2', q{
CREATE SCHEMA outbox;
CREATE FUNCTION outbox.preloaded(VARIADIC a text[]) RETURNS boolean LANGUAGE plpgsql AS $f$
BEGIN
	PERFORM public.hijack_note('outbox.preloaded(text[])');
	RETURN true;
END;
$f$;});
my ($rc, $out, $err) = $node->psql('hijack2', 'CREATE EXTENSION outbox');
isnt($rc, 0, 'CREATE EXTENSION fails in a schema mallory owns');
like($err, qr/schema "outbox" is owned by role "mallory", which is not a superuser/,
	'... saying who owns the schema');
is(sql('hijack2', q{SELECT EXISTS (SELECT FROM pg_extension WHERE extname = 'outbox')}),
	'f', '... and nothing is installed');

sql('hijack2', 'DROP SCHEMA outbox CASCADE; CREATE SCHEMA outbox; GRANT CREATE ON SCHEMA outbox TO mallory');
($rc, $out, $err) = $node->psql('hijack2', 'CREATE EXTENSION outbox');
isnt($rc, 0, 'CREATE EXTENSION fails in a schema mallory may create objects in');
like($err, qr/roles other than superusers may create objects in schema "outbox": mallory/,
	'... naming the role');

# What mallory created there while she could stays behind.
as_mallory('hijack2', q{
CREATE FUNCTION outbox.preloaded(VARIADIC a text[]) RETURNS boolean LANGUAGE plpgsql AS $f$
BEGIN
	PERFORM public.hijack_note('outbox.preloaded(text[])');
	RETURN true;
END;
$f$;});
sql('hijack2', 'REVOKE CREATE ON SCHEMA outbox FROM mallory');
($rc, $out, $err) = $node->psql('hijack2', 'CREATE EXTENSION outbox');
isnt($rc, 0, 'CREATE EXTENSION fails in a schema that holds objects of others');
like($err, qr/schema "outbox" holds objects that are not part of the extension: function preloaded\(text\[\]\)/,
	'... naming them');

sql('hijack2', 'DROP FUNCTION outbox.preloaded(text[])');
sql('hijack2', 'CREATE EXTENSION outbox');
is(sql('hijack2', q{SELECT pg_catalog.count(*) FROM pg_extension WHERE extname OPERATOR(pg_catalog.=) 'outbox'}),
	'1', 'a schema created beforehand by a superuser is fine');
log_is_empty('hijack2', 'the refused installations');

$node->stop;
done_testing();
