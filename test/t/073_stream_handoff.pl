# Streams: who cuts the tick a commit raises while publishers wait
# (docs/streams.md, "Wake-ups"; docs/design-decisions.md, "A waiting
# publisher's tick is cut by its own claim").  With one publisher waiting
# (the claims that found nothing since the last notification came from one
# process), the worker notifies first and leaves the tick to the claim it
# wakes; here no claim comes, so the worker cuts the tick after its 2 ms
# and announces it again: two notifications.  With two publishers waiting
# (claims from two processes) the worker cuts the tick first and
# notifies once, from the tick's transaction, so that both find it.  A
# claim after either gets the command.  A claim that cuts the tick while
# the one waiting was told sends no second notification.  A resolve of a
# dead stream command wakes the publishers (claims skip the rows it held).  outbox.stats.wakeups counts the
# notifications; the nap is a minute, so nothing else sends one.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use FindBin;
use lib "$FindBin::RealBin/../perl";
use OutboxTest;

my $node = outbox_node('stream_handoff', qq{
outbox.naptime = '1min'
});
$node->safe_psql('postgres', 'CREATE EXTENSION outbox');
sub sql { return $node->safe_psql('postgres', $_[0]); }

$node->poll_query_until('postgres', q{SELECT rounds > 0 FROM outbox.workers})
  or die 'no worker';
sql(q{
SELECT outbox.create_stream('s', 2, 100);
SELECT outbox.set_policy('k', stream => 's');
SELECT outbox.create_subscription('s', 'sub');
});

# Wait until a tick sees every command of the log, then a little longer
# (the worker's 2 ms, and outbox.notify_interval for a held wake-up).
sub wait_ticked
{
	$node->poll_query_until('postgres', q{
SELECT (SELECT max(k.last_id) FROM outbox.stream_ticks k)
       >= (SELECT max(l.id) FROM outbox._stream_log l)})
	  or die 'no tick';
	select(undef, undef, undef, 0.3);
}

sub wakeups { return sql(q{SELECT COALESCE(wakeups, 0) FROM outbox.stats}); }

# A claim that finds nothing, from a process of its own (each safe_psql
# is one): its publisher now waits.
sub idle_claim
{
	is(sql(q{SELECT count(*) FROM outbox.claim_batch('s', 'sub', 'w')}), '0',
		"a claim that finds nothing ($_[0])");
}

# Claim a batch and ack it, in one statement: the number published.
sub claim_ack
{
	return sql(qq{
SELECT COALESCE((SELECT outbox.ack_batch('$_[0]', x.t)
                   FROM (SELECT max(c.token) AS t FROM outbox.claim_batch('s', 'sub', '$_[0]') c) x
                  WHERE x.t IS NOT NULL), 0)});
}

my $seq = 0;
sub decide
{
	$seq++;
	sql(qq{SELECT outbox.commit_decision('r', $seq, 'e', 'c$seq', 'k', '{}')});
}

# Settle whatever the setup announced.
decide();
wait_ticked();
is(claim_ack('w0'), '1', 'the first command published');

# One publisher waiting.
idle_claim('one publisher');
my $w0 = wakeups();
decide();
wait_ticked();
is(wakeups() - $w0, 2,
	'one publisher waiting: the notification first, then the tick the worker cut when no claim took it');
is(claim_ack('w1'), '1', 'the command is published');

# Two publishers waiting.
idle_claim('publisher a');
idle_claim('publisher b');
$w0 = wakeups();
decide();
wait_ticked();
is(wakeups() - $w0, 1,
	'two publishers waiting: the worker cut the tick first and notified once');
is(claim_ack('w2'), '1', 'the command is published');

# One publisher waiting, and another process commits and claims at once:
# the worker notifies the waiting one first, the other's claim cuts the
# tick and takes the command, and its commit sends no second notification
# (the one waiting was told; the claimer is claiming).
my $waiting = $node->background_psql('postgres');
$waiting->query_safe(q{SELECT count(*) FROM outbox.claim_batch('s', 'sub', 'w3')});
my $busy = $node->background_psql('postgres');
$w0 = wakeups();
$seq++;
my $got = $busy->query_safe(qq{
BEGIN; SELECT outbox.commit_decision('r', $seq, 'e', 'c$seq', 'k', '{}'); COMMIT;
SELECT count(*) AS claimed FROM outbox.claim_batch('s', 'sub', 'w4');});
like($got, qr/(^|\n)1$/, 'the claim right after the commit takes the command');
wait_ticked();
is(wakeups() - $w0, 1,
	'one publisher waiting, another claims at once: one notification, none for the claim\'s tick');
$waiting->quit;
$busy->quit;

# A resolve of a dead stream command (kept dead) held its partition's
# progress rows, which a claim skips: its commit wakes the worker, which
# notifies, even though nothing became claimable.
# (a stream of its own: w4's batch of s is still held)
sql(q{
SELECT outbox.create_stream('s2', 1, 100);
SELECT outbox.set_policy('k2', stream => 's2');
SELECT outbox.create_subscription('s2', 'sub2');
SELECT outbox.commit_decision('rd', 1, 'e', 'c-dead', 'k2', '{}');
});
wait_ticked();
is(sql(q{
SELECT outbox.ack_batch('w5', x.t, ARRAY['c-dead'], ARRAY['refused'], ARRAY[true])
  FROM (SELECT max(c.token) AS t FROM outbox.claim_batch('s2', 'sub2', 'w5') c) x}), '0',
	'a command fails fatally: dead in its subscription');
idle_claim('before the resolve');
$w0 = wakeups();
sql(q{SELECT outbox.resolve('rd', 'c-dead', 'dead')});
wait_ticked();
is(wakeups() - $w0, 1, 'resolving a dead stream command as dead wakes the publishers once');
is(sql(q{SELECT outbox.verify()}), '', 'verify() passes');

done_testing();
