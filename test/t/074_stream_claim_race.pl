# Streams: two publishers claiming one partition as fast as they can, each
# committing a decision, claiming and acking in turn (pgbench, two
# clients).  A claim looks at the progress rows in a snapshot and then
# locks the one it picks; when the other publisher's lease commits in
# between, the lock finds a newer version of the row, and the claim must
# look again rather than lease the batch over the other's open lease
# (src/stream_claim.c, sc_pick_look).  Had it leased it, the other's ack
# would be refused (OB001, which ends its pgbench client) and the same
# commands would be handed out twice.  At the end every command was
# handed out exactly once and conservation is clean.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use FindBin;
use lib "$FindBin::RealBin/../perl";
use OutboxTest;
use OutboxBroker;

my $node = outbox_node('stream_claim_race');
$node->safe_psql('postgres', 'CREATE EXTENSION outbox');
$node->safe_psql('postgres', q{
CREATE SEQUENCE q;
CREATE TABLE got (command_id text, worker text);
SELECT outbox.create_stream('s', 1, 100);
SELECT outbox.set_policy('k', stream => 's');
SELECT outbox.create_subscription('s', 'sub');
});

my $script = "${PostgreSQL::Test::Utils::tmp_check}/claim_race.sql";
PostgreSQL::Test::Utils::append_to_file($script, <<'EOF');
SELECT outbox.commit_decision('r' || :client_id || '-' || nextval('q'), 1, 'e', 'c' || currval('q'), 'k', '{}');
WITH c AS (SELECT * FROM outbox.claim_batch('s', 'sub', 'w' || :client_id)), i AS (INSERT INTO got SELECT command_id, 'w' || :client_id FROM c) SELECT coalesce(min(token), '') AS token FROM c \gset
SELECT CASE WHEN :token <> '' THEN outbox.ack_batch('w' || :client_id, :token) END;
EOF
my ($out, $err) = ('', '');
# (-M prepared: the token goes to the ack as a parameter)
my $ok = IPC::Run::run(
	[ 'pgbench', '-n', '-M', 'prepared', '-c', '2', '-j', '2', '-t', '2000', '-f', $script,
		'-d', $node->connstr('postgres') ],
	'>', \$out, '2>', \$err);
ok($ok, 'both publishers ran to the end (no ack refused)') or diag($err);
unlike($err, qr/aborted|lease_not_owned|OB001/, 'no client was aborted') or diag($err);
my ($cycles) = $out =~ /number of transactions actually processed: (\d+)/;
is($cycles // 0, 4000, 'the publishers went round 2,000 times each');
cmp_ok($node->safe_psql('postgres', q{SELECT count(DISTINCT worker) FROM got}), '==', 2,
	'both publishers got batches');

# What the last rounds left, claimed and acked here until every command
# of the log is in got (a tick_streams() may skip the stream while the
# worker ticks it).
for my $try (1 .. 100)
{
	$node->safe_psql('postgres', q{SELECT outbox.tick_streams()});
	$node->safe_psql('postgres', q{
WITH c AS (SELECT * FROM outbox.claim_batch('s', 'sub', 'last')),
     i AS (INSERT INTO got SELECT command_id, 'last' FROM c)
SELECT outbox.ack_batch('last', min(token)) FROM c HAVING count(*) > 0});
	last if $node->safe_psql('postgres', q{
SELECT count(*) FROM outbox._stream_log l
 WHERE NOT EXISTS (SELECT 1 FROM got g WHERE g.command_id = l.command_id)}) eq '0';
	select(undef, undef, undef, 0.1);
}

is($node->safe_psql('postgres', q{
SELECT count(*) FILTER (WHERE n <> 1) FROM (
  SELECT l.command_id, count(g.command_id) AS n
    FROM outbox._stream_log l LEFT JOIN got g USING (command_id)
   GROUP BY l.command_id) x}), '0', 'every command was handed out exactly once');
is($node->safe_psql('postgres', q{
SELECT (SELECT sum(published) FROM outbox.stream_progress WHERE subscription = 'sub')
     = (SELECT count(*) FROM outbox._stream_log)}), 't', 'every command is published');
conservation_clean($node, 'the end');
$node->stop;
done_testing();
