# Streams and the background worker (docs/streams.md): with a one-minute
# nap, only a commit's wake-up can make the worker cut a tick; a producer's
# commit of a stream command makes it cut one and notify a LISTENing
# publisher, whose claim_batch then gets the command (nobody calls
# tick_streams here).  A long transaction that decided before a later one
# and commits after it is delivered in a later batch, none twice.  A
# commit whose tick the worker skipped (another transaction was ticking
# the stream) is ticked once the stream is free.  The
# worker's rotation truncates a log table whose commands are done and past
# retention, keeps a straggler of a subscription that is behind in
# stream_kept, and the checks stay clean throughout.  A partition that got
# nothing is moved on to the last tick by the worker, not by a claim.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use FindBin;
use lib "$FindBin::RealBin/../perl";
use OutboxTest qw(:DEFAULT notifications_after wait_notification);
use Time::HiRes qw(time);

my $node = outbox_node('streams_worker', qq{
outbox.naptime = '1min'
});
$node->safe_psql('postgres', 'CREATE EXTENSION outbox');
sub sql { return $node->safe_psql('postgres', $_[0]); }

$node->poll_query_until('postgres', q{SELECT rounds > 0 FROM outbox.workers})
  or die 'no worker';
sql(q{
SELECT outbox.create_stream('s', 2, 100);
SELECT outbox.set_policy('k', stream => 's');
SELECT outbox.create_subscription('s', 'fast');
SELECT outbox.create_subscription('s', 'slow');
});

my $listener = $node->background_psql('postgres');
$listener->query_safe('LISTEN outbox');

# The start-up notification is past (the worker notifies once it runs).
wait_notification($listener, 10);
notifications_after($listener, 'SELECT pg_sleep(0.3)');

# The delivered commands of subscription fast, by claim_batch and ack_batch.
my %delivered;
sub deliver
{
	my $out = sql(q{
CREATE TEMP TABLE b AS SELECT * FROM outbox.claim_batch('s', 'fast', 'relay');
SELECT coalesce(string_agg(command_id, ',' ORDER BY batch_id, command_id), '') FROM b;
SELECT outbox.ack_batch('relay', token) FROM (SELECT min(token) AS token FROM b) t WHERE token IS NOT NULL;});
	my ($ids) = split /\n/, $out;
	$ids //= '';
	$delivered{$_}++ foreach grep { $_ ne '' } split /,/, $ids;
	return $ids;
}

# --- a commit wakes the worker, which cuts a tick and notifies ------------------------
is(sql(q{SELECT count(*) FROM outbox.stream_ticks}), '1', 'only the stream\'s first tick so far');
sql(q{SELECT outbox.commit_decision('r1', 1, 'e', 'c1', 'k', '{}')});
ok(wait_notification($listener, 10) >= 1, 'the commit of a stream command wakes the worker, which notifies');
is(sql(q{SELECT count(*) > 1 FROM outbox.stream_ticks}), 't', '... after cutting a tick');
my $got = '';
$got .= deliver() . ' ' for 1 .. 2;    # one partition per batch
like($got, qr/\bc1\b/, 'the listener\'s claim gets the command');

# --- a long transaction that commits after a later one -----------------------------
my $long = $node->background_psql('postgres');
$long->query_safe(q{BEGIN});
$long->query_safe(q{SELECT outbox.commit_decision('r-long', 1, 'e', 'c-long', 'k', '{}')});
sql(q{SELECT outbox.commit_decision('r-short', 1, 'e', 'c-short', 'k', '{}')});
ok(wait_notification($listener, 10) >= 1, 'the later transaction\'s commit is notified');
$got = '';
$got .= deliver() . ' ' for 1 .. 2;
like($got, qr/\bc-short\b/, 'the later command is delivered');
unlike($got, qr/c-long/, '... the long transaction\'s, not committed, is not');
$long->query_safe(q{COMMIT});
$long->quit;
ok(wait_notification($listener, 10) >= 1, 'the long transaction\'s commit is notified');
$got = '';
$got .= deliver() . ' ' for 1 .. 2;
like($got, qr/\bc-long\b/, 'the long transaction\'s command comes in a later batch');
is(join(',', grep { $delivered{$_} != 1 } sort keys %delivered), '', 'no command was delivered twice');
is(join(',', sort keys %delivered), 'c-long,c-short,c1', 'every command was delivered to fast');

# --- a tick that skipped the stream is cut again ----------------------------------
# While another transaction ticks the stream (here tick_streams() in an
# open transaction, as a claim_batch that cuts a tick does), the
# worker's tick skips it; the commit that woke the worker is then ticked
# once the stream is free, by the worker trying again (with a one-minute
# nap and no other commit, nothing else would tick it in time).
my $holder = $node->background_psql('postgres');
$holder->query_safe(q{BEGIN});
$holder->query_safe(q{SELECT outbox.tick_streams()});
sql(q{SELECT outbox.commit_decision('r-skip', 1, 'e', 'c-skip', 'k', '{}')});
$holder->query_safe(q{SELECT pg_sleep(0.3)});    # (the stream held a while)
$holder->query_safe(q{COMMIT});
$holder->quit;
$got = '';
my $until = time() + 10;
while (time() < $until && $got !~ /\bc-skip\b/)
{
	$got .= deliver() . ' ';
	select(undef, undef, undef, 0.05) if $got !~ /\bc-skip\b/;
}
like($got, qr/\bc-skip\b/, 'a commit whose tick the worker skipped is ticked once the stream is free');

# --- rotation by the worker ---------------------------------------------------------
# Retention 0 and a one-second rotation; the slow subscription has published
# nothing.  Table 0 takes the appends until the switch; once table 1 has
# them and table 2 (empty) is next, table 0 becomes the next and is
# emptied: its commands are stragglers of slow (kept), not lost.
$node->append_conf('postgresql.conf', "outbox.stream_rotation = '1s'\n");
$node->reload;
sql(q{SELECT outbox.set_policy('k', retention => '0')});
# the worker rotates every naptime (a minute here): its step by hand
for my $step (1 .. 60)
{
	sql(qq{SELECT outbox.commit_decision('r-rot', $step, 'e', 'rot-$step', 'k', '{}')});
	sql(q{SELECT outbox.rotate_streams()});
	last if sql(q{SELECT count(*) FROM outbox.stream_kept}) > 0;
	select(undef, undef, undef, 0.3);
}
cmp_ok(sql(q{SELECT count(*) FROM outbox.stream_kept}), '>', 0,
	'a rotation truncated a log table and kept the commands slow has not published');
is(sql(q{SELECT count(*) FROM outbox.check_state}), '0', 'the state checks are clean after the rotation');
is(sql(q{SELECT outbox.verify()}), '', 'verify() passes');
# slow still gets every command, from the log and the kept rows
sql(q{SELECT outbox.tick_streams()});
my $slow = sql(q{
CREATE TEMP TABLE all_slow (command_id text);
DO $$
DECLARE t text; n int;
BEGIN
	LOOP
		WITH c AS (SELECT * FROM outbox.claim_batch('s', 'slow', 'slow-relay')),
			 i AS (INSERT INTO all_slow SELECT command_id FROM c)
		SELECT min(token), count(*) INTO t, n FROM c;
		EXIT WHEN n = 0;
		PERFORM outbox.ack_batch('slow-relay', t);
	END LOOP;
END $$;
SELECT count(*) = count(DISTINCT command_id) AS once,
	   bool_and(command_id IN ('c1', 'c-long', 'c-short', 'c-skip') OR command_id LIKE 'rot-%') AS known,
	   count(*) FILTER (WHERE command_id IN ('c1', 'c-long', 'c-short', 'c-skip')) AS early
  FROM all_slow;});
is($slow, 't|t|4', 'the slow subscription gets every command once, the kept ones too');
is(sql(q{SELECT count(*) FROM outbox.conservation WHERE violations > 0 AND severity = 'error'}), '0',
	'the conservation checks are clean at the end');

# --- the worker moves the partitions that got nothing on to the last tick ----------
# A claim that finds nothing writes nothing: after a batch of one partition,
# fast's other partition keeps its acked tick, until the worker's move on
# (before each rotation step, every naptime: 200 ms from here).
for (1 .. 20) { last if deliver() eq ''; }
sql(q{SELECT outbox.commit_decision('r-idle', 1, 'e', 'c-idle', 'k', '{}')});
sql(q{SELECT outbox.tick_streams()});
like(deliver(), qr/\bc-idle\b/, 'a command of one partition is delivered');
is(deliver(), '', '... and the next claim finds nothing');
my $behind = q{SELECT count(*) FROM outbox.stream_progress p
 WHERE p.subscription = 'fast'
   AND p.acked_tick < (SELECT max(k.tick) FROM outbox.stream_ticks k)};
is(sql($behind), '1', 'the other partition keeps its acked tick');
is(sql(q{SELECT count(*) FROM outbox.stream_lag WHERE subscription = 'fast' AND ticks_behind > 0}), '0',
	'... and the lag view counts it caught up');
# a publisher waits: what was recorded since the last notification (the
# move on, whose rows a claim skips) is announced to it within a nap (the
# worker's backstop; the move on announces itself to a claim that found
# nothing while it ran)
notifications_after($listener, 'SELECT pg_sleep(0.1)');
is($listener->query_safe(q{SELECT count(*) FROM outbox.claim_batch('s', 'fast', 'listener')}), '0',
	'the listening publisher finds nothing and waits');
$node->append_conf('postgresql.conf', "outbox.naptime = '200ms'\n");
$node->reload;
ok($node->poll_query_until('postgres', "SELECT ($behind) = 0"),
	'the worker moves it on to the last tick');
ok(wait_notification($listener, 10) >= 1, '... and the publisher that waits is notified');

$listener->quit;
$node->stop;
done_testing();
