# 8 claimer sessions drain 20,000 commands; some abandon their batch (the
# leases are left to expire and are taken over), some are too slow and ack
# after losing the lease.  Every command ends published exactly once, no
# command is ever under two live leases, and every refused ack was stale.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use FindBin;
use lib "$FindBin::RealBin/../perl";
use OutboxTest;

my $commands = 20000;
my $claimers = 8;

my $node = outbox_node('drain', qq{
max_connections = 40
});
$node->safe_psql('postgres', qq{
	CREATE EXTENSION outbox;
	SELECT count(*) FROM generate_series(1, $commands, 5000) b,
		LATERAL outbox.commit_decisions(
			(SELECT jsonb_agg(jsonb_build_object('run_id', 'drain', 'seq', g, 'event_kind', 'e',
												 'command_id', 'cmd-' || g, 'command_kind', 'k',
												 'payload', '{}'::jsonb))
			   FROM generate_series(b, b + 4999) g));
	CREATE TABLE claims_log (command_id text, worker text, version bigint, lease_until timestamptz);
	CREATE TABLE acks_log (worker text, command_id text, version bigint, acked bool, reason text);
});

# Each claimer loops in one DO block, committing after every step.  With
# probability 3% it abandons a batch and carries on under a new name; with
# probability 3% it sleeps past its lease before acking.
my $loop = q{
DO $$
DECLARE
	gen int := 0;
	w text := 'w' || pg_backend_pid() || '-0';
	ids text[];
	vers bigint[];
	toks text[];
	r record;
BEGIN
	LOOP
		ids := '{}';
		vers := '{}';
		toks := '{}';
		FOR r IN SELECT * FROM outbox.claim(w, 50, interval '1 second') LOOP
			INSERT INTO claims_log VALUES (r.command_id, w, r.version, r.lease_until);
			ids := ids || r.command_id;
			vers := vers || r.version;
			toks := toks || r.token;
		END LOOP;
		COMMIT;
		IF cardinality(ids) = 0 THEN
			EXIT WHEN NOT EXISTS (SELECT 1 FROM outbox.commands WHERE status <> 'published');
			PERFORM pg_sleep(0.05);
			CONTINUE;
		END IF;
		IF random() < 0.03 THEN
			gen := gen + 1;
			w := 'w' || pg_backend_pid() || '-' || gen;
			CONTINUE;
		END IF;
		IF random() < 0.03 THEN
			PERFORM pg_sleep(1.2);
		END IF;
		INSERT INTO acks_log SELECT w, a.command_id, v.version, a.acked, a.reason
		  FROM outbox.ack_many(w, toks) WITH ORDINALITY a
		  JOIN unnest(vers) WITH ORDINALITY v(version, ord) ON v.ord = a.ordinality;
		COMMIT;
	END LOOP;
END;
$$;
};

my @h;
for my $i (1 .. $claimers)
{
	my ($stdout, $stderr) = ('', '');
	push @h, IPC::Run::start(
		[ 'psql', '-X', '-q', '-v', 'ON_ERROR_STOP=1', '-d', $node->connstr('postgres'), '-c', $loop ],
		'>', \$stdout, '2>', \$stderr,
		IPC::Run::timeout($PostgreSQL::Test::Utils::timeout_default));
}
my $ok = 1;
$ok &&= $_->finish for @h;
ok($ok, 'all claimers finished without error');

is($node->safe_psql('postgres', q{SELECT count(*) FROM outbox.commands WHERE status = 'published'}),
	$commands, 'every command is published');
is($node->safe_psql('postgres',
	q{SELECT count(*) FROM (SELECT command_id FROM acks_log WHERE acked GROUP BY 1 HAVING count(*) <> 1) x}),
	'0', 'no command was acked twice');
is($node->safe_psql('postgres', q{SELECT count(DISTINCT command_id) FROM acks_log WHERE acked}),
	$commands, 'every command was acked exactly once');
is($node->safe_psql('postgres', q{
	SELECT count(*) FROM outbox.commands c
	  JOIN acks_log a ON a.command_id = c.command_id AND a.acked
	 WHERE c.owner <> a.worker OR c.version <> a.version + 1}),
	'0', 'the accepted ack is the one recorded on the command');

# Two claims of one command: the later one starts (lease_until - 1 s) only
# after the earlier lease ended.
is($node->safe_psql('postgres', q{
	SELECT count(*) FROM claims_log a JOIN claims_log b
	  ON a.command_id = b.command_id AND b.version > a.version
	 WHERE b.lease_until - interval '1 second' < a.lease_until}),
	'0', 'no command was ever under two live leases');
cmp_ok($node->safe_psql('postgres', q{SELECT count(*) FROM claims_log}), '>=', $commands,
	'every claim was logged');

my $refused = $node->safe_psql('postgres', q{SELECT count(*) FROM acks_log WHERE NOT acked});
my $takeovers = $node->safe_psql('postgres', q{SELECT count(*) FROM claims_log WHERE version > 2});
note("refused acks: $refused, takeovers: $takeovers");
cmp_ok($takeovers, '>', 0, 'some abandoned or slow leases were taken over');
is($node->safe_psql('postgres', q{
	SELECT count(*) FROM acks_log a
	 WHERE NOT a.acked
	   AND (a.reason <> 'lease_not_owned'
	        OR NOT EXISTS (SELECT 1 FROM claims_log c
	                        WHERE c.command_id = a.command_id AND c.version > a.version))}),
	'0', 'every refused ack was stale: the command had been claimed again');

$node->stop;
done_testing();
