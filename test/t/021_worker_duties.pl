# The background worker's duties: one notification per committed decision
# and none for a rolled-back one, few for a burst, a wake-up not held back
# from a waiting publisher (a claim found nothing), and one when a delayed
# command, a retry backoff or a lease becomes due; dead-lettering exactly at
# the delivery limit; uncertain for a manual kind; a purge that removes only
# what guarantee 6 allows; and counters in outbox.stats that match all of
# it, including the notifications a listener received.  Also one at once
# for a requeue, one for a lease renewed in a transaction that outlived it,
# and for the release of an ordering key's next command one by the due
# check only, and none when the releasing transaction claimed it itself.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use FindBin;
use lib "$FindBin::RealBin/../perl";
use OutboxTest;
use Time::HiRes qw(time);

my $node = outbox_node('worker_duties', qq{
outbox.naptime = '200ms'
});
$node->safe_psql('postgres', 'CREATE EXTENSION outbox');

my %exp = map { $_ => 0 } qw(enqueued claimed taken_over acked stale_refused
  failed dead_lettered purged);

sub sql { return $node->safe_psql('postgres', $_[0]); }

sub rounds { return sql('SELECT rounds FROM outbox.workers'); }

# Wait until the worker has finished $n more rounds.
sub wait_rounds
{
	my ($n) = @_;
	my $r = rounds();
	$node->poll_query_until('postgres', "SELECT rounds >= $r + $n FROM outbox.workers")
	  or die 'the worker stopped running rounds';
}

sub set_naptime
{
	my ($nap) = @_;
	sql(qq{ALTER SYSTEM SET outbox.naptime = '$nap'; SELECT pg_reload_conf()});
	$node->poll_query_until('postgres', "SELECT naptime = '$nap' FROM outbox.workers")
	  or die "naptime $nap never applied";
}

$node->poll_query_until('postgres', q{SELECT rounds > 0 FROM outbox.workers})
  or die 'no worker';
my $worker = sql('SELECT pid FROM outbox.workers');

# The listening publisher.  psql prints the notifications that arrived
# after each query it runs.
my $listener = $node->background_psql('postgres');
$listener->query_safe('LISTEN outbox');
my $heard = 0;			# notifications received since the stats reset
my @pids;				# the senders of those

# Run a query in the listener; count the notifications psql printed after
# it.  Returns how many.
sub listen_query
{
	my ($query) = @_;
	my $out = $listener->query_safe($query);
	my @got = ($out =~ /Asynchronous notification "outbox" received from server process with PID (\d+)/g);
	push @pids, @got;
	$heard += @got;
	return scalar @got;
}

# Collect what has arrived; returns how many.
sub drain { return listen_query('SELECT 1'); }

# Wait for at least one notification (at most $limit seconds); returns
# how many arrived.
sub wait_notification
{
	my ($limit) = @_;
	my $deadline = time + $limit;
	my $n = 0;
	while (($n = listen_query('SELECT pg_sleep(0.02)')) == 0 && time < $deadline)
	{
	}
	return $n;
}

# Quiet start: the worker's start-up notification is past.
wait_rounds(2);
drain();
sql('SELECT outbox.stats_reset()');
$heard = 0;
@pids = ();

# --- a committed decision is announced ------------------------------------------
sql(q{SELECT outbox.commit_decision('run-1', 1, 'e', 'one', 'k', '{}')});
$exp{enqueued}++;
ok(wait_notification(30) >= 1, 'a committed decision produces a notification');
is(scalar(grep { $_ != $worker } @pids), 0, 'sent by the worker, not by the producer');

# --- a rolled-back one is not ------------------------------------------------------
sql(q{BEGIN; SELECT outbox.commit_decision('run-1', 2, 'e', 'two', 'k', '{}'); ROLLBACK});
wait_rounds(3);
is(drain(), 0, 'a rolled-back decision produces no notification');

# --- a burst of 1,000 commits ------------------------------------------------------
sql(q{DO $$
BEGIN
	FOR i IN 1..1000 LOOP
		PERFORM outbox.commit_decision('burst', i, 'e', 'b-' || i, 'burst', '{}');
		COMMIT;
	END LOOP;
END $$});
$exp{enqueued} += 1000;
wait_rounds(3);
my $burst = drain();
ok($burst >= 1, 'a burst of 1,000 commits is announced');
cmp_ok($burst, '<=', 250, 'with far fewer notifications than commits');
note "burst of 1000 commits: $burst notifications";

# Publish the burst (one claim, one batch ack) and try one stale ack.
is(sql(q{CREATE TABLE burst AS SELECT * FROM outbox.claim('p', 1000, NULL, ARRAY['burst']);
	SELECT count(*) FILTER (WHERE acked) FROM outbox.ack_many('p', ARRAY(SELECT token FROM burst))}),
	'1000', 'the burst is claimed and acked');
$exp{claimed} += 1000;
$exp{acked} += 1000;
my ($rc, $out, $err) = $node->psql('postgres', q{SELECT outbox.ack('p', token) FROM burst WHERE command_id = 'b-1'});
like($err, qr/lease_not_owned/, 'a repeated ack is refused');
$exp{stale_refused}++;

# --- a waiting publisher is woken at once ------------------------------------------
# With a one-minute outbox.notify_interval, a commit soon after a
# notification is held back, unless a claim has found nothing since: then a
# publisher waits, and the wake-up goes out after notify_idle_interval.
sql(q{ALTER SYSTEM SET outbox.notify_interval = '1min'; SELECT pg_reload_conf()});
wait_rounds(2);
sub claim_ack
{
	return sql(q{SELECT count(*) FILTER (WHERE acked) FROM outbox.ack_many('p',
		ARRAY(SELECT token FROM outbox.claim('p', 10)))});
}
is(claim_ack(), '1', 'the command left pending ("one"), claimed and acked');
drain();
is(sql(q{SELECT count(*) FROM outbox.claim('p', 10)}), '0',
	'a claim of every kind that finds nothing: the publisher waits');
sql(q{SELECT outbox.commit_decision('idle', 1, 'e', 'idle-1', 'idle', '{}')});
ok(wait_notification(30) >= 1, 'a commit is announced at once to a waiting publisher');
is(claim_ack(), '1', 'a claim that finds the command (the publisher is busy), acked');
sql(q{SELECT outbox.commit_decision('idle', 2, 'e', 'idle-2', 'idle', '{}')});
wait_rounds(3);
is(drain(), 0, 'the next commit soon after the notification is held back');
is(sql(q{SELECT count(*) FROM outbox.claim('p', 10, NULL, ARRAY['nothing-here'])}), '0',
	'a claim of one kind that finds nothing');
wait_rounds(3);
is(drain(), 0, 'does not end the hold');
is(claim_ack(), '1', 'the held command claimed and acked');
is(sql(q{SELECT count(*) FROM outbox.claim('p', 10)}), '0',
	'a claim of every kind that finds nothing while a wake-up is held back');
ok(wait_notification(30) >= 1, 'wakes the worker, which sends it');
$exp{enqueued} += 2;
$exp{claimed} += 3;
$exp{acked} += 3;
sql(q{ALTER SYSTEM RESET outbox.notify_interval; SELECT pg_reload_conf()});
wait_rounds(2);
drain();

# --- what becomes claimable with no commit to announce it -------------------------
# With a one-minute nap only the worker's look at what is due can announce
# these within the limits below.
set_naptime('1min');
drain();

sql(q{SELECT outbox.commit_decision('run-2', 1, 'e', 'later', 'later', '{}',
		not_before => clock_timestamp() + interval '1.5 s')});
$exp{enqueued}++;
wait_notification(30);		# the commit's own
is(sql(q{SELECT count(*) FROM outbox.claim('p', 10, NULL, ARRAY['later'])}), '0',
	'a delayed command cannot be claimed yet');
ok(wait_notification(20) >= 1, 'a notification comes when the delayed command is due');
is(sql(q{CREATE TABLE held AS SELECT * FROM outbox.claim('p', 10, NULL, ARRAY['later']);
	SELECT count(*) FROM held}), '1',
	'and the delayed command can then be claimed');
$exp{claimed}++;

sql(q{SELECT outbox.commit_decision('run-2', 2, 'e', 'retry', 'retry', '{}')});
$exp{enqueued}++;
wait_notification(30);
is(sql(q{SELECT outbox.fail('p', token, 'broker down')
	FROM outbox.claim('p', 10, NULL, ARRAY['retry'])}), 'pending', 'a failed delivery backs off');
$exp{claimed}++;
$exp{failed}++;
drain();
ok(wait_notification(20) >= 1, 'a notification comes when the backoff ends');
is(sql(q{WITH c AS (INSERT INTO held SELECT * FROM outbox.claim('p', 10, NULL, ARRAY['retry']) RETURNING 1)
	SELECT count(*) FROM c}), '1',
	'and the command can be claimed again');
$exp{claimed}++;

sql(q{SELECT outbox.commit_decision('run-2', 3, 'e', 'lapse', 'lapse', '{}')});
$exp{enqueued}++;
wait_notification(30);
sql(q{SELECT count(*) FROM outbox.claim('gone', 10, interval '1.5 s', ARRAY['lapse'])});
$exp{claimed}++;
drain();
ok(wait_notification(20) >= 1, 'a notification comes when a lease expires');
is(sql(q{WITH c AS (INSERT INTO held SELECT * FROM outbox.claim('p', 10, NULL, ARRAY['lapse']) RETURNING deliveries)
	SELECT deliveries FROM c}),
	'2', 'and another publisher takes the command over');
$exp{claimed}++;
$exp{taken_over}++;

# Settle the leases of this part, so that none expires later on.
sql(q{SELECT outbox.ack('p', token) FROM held WHERE command_id IN ('later', 'retry', 'lapse')});
$exp{acked} += 3;

# --- what a renew, the release of an ordering key's next command and a
# --- requeue make due -----------------------------------------------------------
# A renew moves the lease's end, which the due check looks for.  Renewed
# in a transaction that outlives both the new lease and a look of the due
# check, the lease is announced all the same once the transaction commits
# (the next look goes back to the transaction's start).
sql(q{CREATE TABLE woken AS SELECT * FROM outbox.claim('p', 10, NULL, ARRAY['none']);
	SELECT outbox.commit_decision('run-4', 1, 'e', 'rn', 'renewed', '{}')});
$exp{enqueued}++;
wait_notification(30);
is(sql(q{WITH c AS (INSERT INTO woken SELECT * FROM outbox.claim('p', 10, interval '1 hour', ARRAY['renewed']) RETURNING 1)
	SELECT count(*) FROM c}), '1', 'a command is leased for an hour');
$exp{claimed}++;
drain();
sql(q{BEGIN;
	SELECT outbox.renew('p', token, interval '1 s') FROM woken WHERE command_id = 'rn';
	SELECT pg_sleep(2.5);
	COMMIT});
ok(wait_notification(10) >= 1,
	'a lease renewed in a transaction that outlived it is announced when the transaction commits');
is(sql(q{WITH c AS (INSERT INTO woken SELECT * FROM outbox.claim('p2', 10, NULL, ARRAY['renewed']) RETURNING deliveries)
	SELECT deliveries FROM c}), '2', 'and the command is taken over');
$exp{claimed}++;
$exp{taken_over}++;

# The commit that requeues a command wakes the worker at once, as an
# enqueue does.  The due check would announce the command too, and it runs
# at least every 500 ms whatever the nap; so here it is kept from running:
# another session queues for (and then holds) ACCESS EXCLUSIVE on
# outbox.commands, and the due check, which takes its lock without
# waiting, skips its turns.  Only the commit's own wake-up can announce the
# command then.  Returns the notifications heard within $limit (default
# 10) seconds of the commit of $do.
sub heard_while_due_check_held
{
	my ($do, $limit) = @_;
	my $actor = $node->background_psql('postgres');
	my $blocker = $node->background_psql('postgres');
	$actor->query_safe("BEGIN; $do");
	$blocker->query_safe('BEGIN');
	$blocker->query_until(qr/queued/,
		"\\echo queued\nLOCK TABLE outbox.commands IN ACCESS EXCLUSIVE MODE;\n");
	$node->poll_query_until('postgres', q{SELECT count(*) = 1 FROM pg_locks
		WHERE relation = 'outbox.commands'::regclass AND mode = 'AccessExclusiveLock' AND NOT granted})
	  or die 'the lock was never asked for';
	listen_query('SELECT pg_sleep(1)');	# a look already under way has ended
	drain();
	$actor->query_safe('COMMIT');
	my $n = wait_notification($limit // 10);
	is(sql(q{SELECT count(*) FROM pg_locks
		WHERE relation = 'outbox.commands'::regclass AND mode = 'AccessExclusiveLock' AND granted}),
		'1', 'the due check was held off all along');
	$blocker->query_safe('ROLLBACK');
	$actor->quit;
	$blocker->quit;
	return $n;
}

# The commit that releases the next command of an ordering key does not
# wake anyone itself: the publisher that acked the head usually claims the
# next one at once, and a notification would send every idle publisher to
# an empty claim.  The due check looks for it outbox.notify_interval later
# and announces it if it is still claimable.
sql(q{SELECT outbox.commit_decision('run-4', 2, 'e', 'o-1', 'ordered', '{}', ordering_key => 'K4');
	SELECT outbox.commit_decision('run-4', 3, 'e', 'o-2', 'ordered', '{}', ordering_key => 'K4');
	SELECT outbox.commit_decision('run-4', 5, 'e', 'o-3', 'ordered', '{}', ordering_key => 'K4')});
$exp{enqueued} += 3;
wait_notification(30);
is(sql(q{WITH c AS (INSERT INTO woken SELECT * FROM outbox.claim('p', 10, NULL, ARRAY['ordered']) RETURNING command_id)
	SELECT string_agg(command_id, ' ') FROM c}), 'o-1', 'only the head of the key is claimed');
$exp{claimed}++;
is(heard_while_due_check_held(q{SELECT outbox.ack('p', token) FROM woken WHERE command_id = 'o-1'}, 2), 0,
	'the ack that releases the next command of its key wakes nobody by its commit');
$exp{acked}++;
ok(wait_notification(10) >= 1, 'the due check announces the released command, left unclaimed');
is(sql(q{WITH c AS (INSERT INTO woken SELECT * FROM outbox.claim('p', 10, NULL, ARRAY['ordered']) RETURNING command_id)
	SELECT string_agg(command_id, ' ') FROM c}), 'o-2', 'which the publishers then claim');
$exp{claimed}++;
is(sql(q{BEGIN;
	SELECT count(*) FROM outbox.ack('p', (SELECT token FROM woken WHERE command_id = 'o-2'));
	WITH c AS (INSERT INTO woken SELECT * FROM outbox.claim('p', 10, NULL, ARRAY['ordered']) RETURNING command_id)
	SELECT string_agg(command_id, ' ') FROM c;
	COMMIT}), "1\no-3", 'an ack and a claim of the released command in one transaction');
$exp{acked}++;
$exp{claimed}++;
# (a second is long past the due check's look after the release)
is(listen_query('SELECT pg_sleep(1)') + drain(), 0,
	'wake nobody: the due check finds nothing left to announce');
sql(q{SELECT outbox.ack('p', token) FROM woken WHERE command_id = 'o-3'});
$exp{acked}++;

sql(q{SELECT outbox.commit_decision('run-4', 4, 'e', 'rq', 'requeued', '{}')});
$exp{enqueued}++;
wait_notification(30);
is(sql(q{SELECT outbox.fail('p', token, 'rejected', fatal => true)
	FROM outbox.claim('p', 10, NULL, ARRAY['requeued'])}), 'dead', 'a command goes to dead');
$exp{claimed}++;
$exp{failed}++;
$exp{dead_lettered}++;
ok(heard_while_due_check_held(q{SELECT outbox.requeue('run-4', 'rq')}) >= 1,
	'its requeue wakes the listening publishers');
is(sql(q{WITH c AS (INSERT INTO woken SELECT * FROM outbox.claim('p', 10, NULL, ARRAY['requeued']) RETURNING command_id)
	SELECT string_agg(command_id, ' ') FROM c}), 'rq', 'which then claim it');
$exp{claimed}++;
sql(q{SELECT outbox.ack('p2', token) FROM woken WHERE command_id = 'rn' AND deliveries = 2;
	SELECT outbox.ack('p', token) FROM woken WHERE command_id = 'rq'});
$exp{acked} += 2;
set_naptime('200ms');

# --- dead-lettering exactly at the delivery limit ------------------------------------
sql(q{SELECT outbox.set_policy('limited', max_deliveries => 2);
	  SELECT outbox.commit_decision('run-3', 1, 'e', 'lim', 'limited', '{}');
	  SELECT count(*) FROM outbox.claim('w1', 10, interval '300 ms', ARRAY['limited'])});
$exp{enqueued}++;
$exp{claimed}++;
$node->poll_query_until('postgres', q{SELECT lease_until < clock_timestamp() FROM outbox.commands WHERE command_id = 'lim'})
  or die 'lease never expired';
wait_rounds(3);
is(sql(q{SELECT status || ' ' || deliveries FROM outbox.commands WHERE command_id = 'lim'}),
	'sending 1', 'an expired lease with a delivery left is not dead-lettered');
is(sql(q{SELECT deliveries FROM outbox.claim('w2', 10, interval '300 ms', ARRAY['limited'])}),
	'2', 'it is taken over for its last delivery');
$exp{claimed}++;
$exp{taken_over}++;
ok($node->poll_query_until('postgres', q{SELECT status = 'dead' FROM outbox.commands WHERE command_id = 'lim'}),
	'when the last lease expires the worker dead-letters the command');
$exp{dead_lettered}++;
is(sql(q{SELECT deliveries || ' | ' || last_error FROM outbox.commands WHERE command_id = 'lim'}),
	'2 | lease of worker w2 expired after 2 deliveries', 'after exactly 2 deliveries, saying why');

# --- a manual kind goes to uncertain ---------------------------------------------------
sql(q{SELECT outbox.set_policy('payment', takeover => 'manual');
	  SELECT outbox.commit_decision('run-3', 2, 'e', 'pay', 'payment', '{}');
	  SELECT count(*) FROM outbox.claim('w1', 10, interval '300 ms', ARRAY['payment'])});
$exp{enqueued}++;
$exp{claimed}++;
ok($node->poll_query_until('postgres', q{SELECT status = 'uncertain' FROM outbox.commands WHERE command_id = 'pay'}),
	'an expired lease of a manual kind goes to uncertain');
is(sql(q{SELECT deliveries || ' | ' || last_error FROM outbox.commands WHERE command_id = 'pay'}),
	'1 | lease of worker w1 expired; kind payment needs a manual takeover',
	'after one delivery, saying why');
is(sql(q{SELECT count(*) FROM outbox.claim('w2', 10, NULL, ARRAY['payment'])}), '0',
	'and no publisher takes it over');

# --- the purge removes only what guarantee 6 allows ---------------------------------------
# Every status x receipt (none, old, recent) x age of the command (old,
# recent), with the default retention of 1 day; plus, for a kind whose
# policy keeps commands 1 hour, and for the default kind, a published
# command with a receipt, both 2 hours old.
sql(q{SELECT outbox.set_policy('short', retention => interval '1 hour')});
my @expected_gone;
my @seeded;
for my $status (qw(pending sending published dead uncertain))
{
	for my $receipt (qw(none old recent))
	{
		for my $age (qw(old recent))
		{
			my $id = "$status-$receipt-$age";
			my $ts = $age eq 'old' ? "now() - interval '10 days'" : "now() - interval '10 minutes'";
			my $rts = $receipt eq 'old' ? "now() - interval '10 days'" : "now() - interval '10 minutes'";
			sql(qq{
				INSERT INTO outbox.commands (command_id, run_id, seq, kind, status, version, deliveries,
					available_at, due_at, lease_until, owner, created_at, published_at, payload)
				VALUES ('$id', 'seed', 1, 'k', '$status', 2, 1, $ts,
					CASE WHEN '$status' = 'pending' THEN $ts END,
					CASE WHEN '$status' = 'sending' THEN now() + interval '1 hour' END,
					CASE WHEN '$status' <> 'pending' THEN 'w' END,
					$ts, CASE WHEN '$status' = 'published' THEN $ts END, '{}')});
			sql(qq{INSERT INTO outbox.receipts (command_id, outcome, completed_at, run_id) VALUES ('$id', 'done', $rts, 'seed')})
			  if $receipt ne 'none';
			push @seeded, $id;
			push @expected_gone, $id if $status eq 'published' && $receipt eq 'old' && $age eq 'old';
		}
	}
}
for my $kind (qw(short k))
{
	my $id = "policy-$kind";
	sql(qq{
		INSERT INTO outbox.commands (command_id, run_id, seq, kind, status, version, deliveries,
			available_at, owner, created_at, published_at, payload)
		VALUES ('$id', 'seed', 2, '$kind', 'published', 2, 1, now() - interval '2 hours', 'w',
			now() - interval '2 hours', now() - interval '2 hours', '{}');
		INSERT INTO outbox.receipts (command_id, outcome, completed_at, run_id)
		VALUES ('$id', 'done', now() - interval '2 hours', 'seed')});
	push @seeded, $id;
	push @expected_gone, $id if $kind eq 'short';
}
sql(q{ALTER SYSTEM SET outbox.retention = '1d'; SELECT pg_reload_conf()});
ok($node->poll_query_until('postgres', q{SELECT count(*) = 2 FROM outbox.purged}),
	'the worker purges');
$exp{purged} += 2;
wait_rounds(3);
is(sql(q{SELECT string_agg(command_id, ' ' ORDER BY command_id) FROM outbox.purged}),
	join(' ', sort @expected_gone),
	'only published commands with a receipt, both older than the retention (the kind\'s when it has one)');
my $list = join(', ', map { "'$_'" } @seeded);
is(sql(qq{SELECT count(*) FROM outbox.commands WHERE command_id IN ($list)}),
	scalar(@seeded) - scalar(@expected_gone), 'every other seeded command is still there');
is(sql(q{SELECT count(*) FROM outbox.receipts r
	WHERE NOT EXISTS (SELECT 1 FROM outbox.commands c WHERE c.command_id = r.command_id)}),
	'0', 'the receipts of purged commands went with them');

# Purges by hand count too, unless rolled back.
sql(q{BEGIN; SELECT outbox.purge(100, interval '1 minute'); ROLLBACK});
my $manual = sql(q{SELECT outbox.purge(100, interval '1 minute')});
cmp_ok($manual, '>', 0, 'a purge by hand with a shorter retention removes more');
$exp{purged} += $manual;

# --- the counters --------------------------------------------------------------------------
wait_rounds(3);
drain();
my $stats = sql(q{SELECT enqueued, claimed, taken_over, acked, stale_refused, failed,
	dead_lettered, purged, wakeups FROM outbox.stats});
my @got = split /\|/, $stats;
my @names = qw(enqueued claimed taken_over acked stale_refused failed dead_lettered purged);
for my $i (0 .. $#names)
{
	is($got[$i], $exp{ $names[$i] }, "outbox.stats.$names[$i] matches what the test did");
}
is($got[8], $heard, 'outbox.stats.wakeups equals the notifications the listener received');
is(scalar(grep { $_ != $worker } @pids), 0, 'all of them sent by the worker');

# --- who may read the statistics ------------------------------------------------------------
sql(q{CREATE ROLE mon LOGIN IN ROLE pg_monitor; CREATE ROLE nobody LOGIN});
is($node->safe_psql('postgres', 'SELECT count(*) FROM outbox.stats, outbox.workers', extra_params => ['-U', 'mon']),
	'1', 'pg_monitor reads outbox.stats and outbox.workers');
($rc, $out, $err) = $node->psql('postgres', 'SELECT count(*) FROM outbox.stats', extra_params => ['-U', 'nobody']);
like($err, qr/permission denied/, 'PUBLIC does not');
($rc, $out, $err) = $node->psql('postgres', 'SELECT outbox.stats_reset()', extra_params => ['-U', 'mon']);
like($err, qr/permission denied/, 'pg_monitor may not reset the counters');

$listener->quit;
$node->stop;
done_testing();
