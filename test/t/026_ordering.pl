# Ordered delivery per key (commit_decision's ordering_key).
#
#  1. 4 producers and 4 publishers at once on 200 keys x 50 commands
#     (150 keys of one run each, 50 keys spread over 5 runs each that
#     different producers append to) and 1,000 unordered commands.  The
#     publishers fail some deliveries (retryable), take some claims with
#     short leases and abandon them or ack them too late (so that other
#     publishers take them over), and log every delivery: claim time,
#     lease end, the time of its ack or fail.  At the end, for every key:
#     the first deliveries and the acks came in the decision order, no two
#     leases of the key overlapped in time; every command is published once,
#     none is dead, conservation is clean.  Two of the publishers ack with
#     outbox.ack_handover, which leases them the acked keys' next commands
#     (they log those deliveries too: handed over), the other two with
#     ack_many.
#  2. A dead head blocks only its key: the other keys drain, blocked_keys
#     shows the key with its head and how many wait, skip_head releases the
#     next; a head in retry backoff shows in blocked_keys and skip_head
#     refuses it; requeue of a dead head and resolve of an uncertain head as
#     published release the next command.
#  3. set_policy(..., ordered_by_run => true): a kind's commands decided
#     without a key are ordered by run_id; an explicit key stays.
#
# The decision order of a key is known to the test: each producer
# transaction takes a lock of the test's own on the key and numbers its
# decisions in a table (key_next) before deciding, so the numbering is the
# order in which the decisions of one key were recorded.
#
# OUTBOX_TEST_UNKEYED=1 decides the commands of part 1 without their keys
# (parts 2 and 3 are skipped): the order and overlap checks must then fail,
# which shows that they can.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use FindBin;
use lib "$FindBin::RealBin/../perl";
use OutboxTest;
use OutboxBroker;

my $keyed = !$ENV{OUTBOX_TEST_UNKEYED};
my $producers = 4;
my $publishers = 4;

my $node = outbox_node('ordering', qq{
max_connections = 40
outbox.backoff_base = 50
outbox.backoff_max = 200
});
sub sq { return $node->safe_psql('postgres', $_[0]); }

# The plan: which producer decides which command, in which transaction.
#   k001..k150: one run each (r-k001), 50 commands, kinds oa and ob
#   k151..k200: 5 runs each (r-k151-1..5), 10 commands each, the runs of a
#               key spread over the producers
#   u01..u20:   unordered runs of 50 commands, kind un
# chunk: the decisions of one transaction; a producer goes through its
# chunks in (chunk, run) order, so that its runs grow side by side.
sq(q{
	CREATE EXTENSION outbox;
	SELECT outbox.set_policy(k, max_deliveries => 1000) FROM unnest(ARRAY['oa', 'ob', 'un']) k;
	CREATE TABLE plan (p int, chunk int, run_id text, seq int, okey text, kind text, command_id text PRIMARY KEY);
	INSERT INTO plan
	SELECT i % 4 + 1, (s - 1) / (1 + i % 4), 'r-' || k, s, k,
		   CASE WHEN i % 2 = 0 THEN 'oa' ELSE 'ob' END, 'r-' || k || '-' || s
	  FROM generate_series(1, 150) i, LATERAL (SELECT 'k' || lpad(i::text, 3, '0') k) kk,
		   generate_series(1, 50) s;
	INSERT INTO plan
	SELECT (i + j) % 4 + 1, (s - 1) / 2, 'r-' || k || '-' || j, s, k, 'oa', 'r-' || k || '-' || j || '-' || s
	  FROM generate_series(151, 200) i, LATERAL (SELECT 'k' || lpad(i::text, 3, '0') k) kk,
		   generate_series(1, 5) j, generate_series(1, 10) s;
	INSERT INTO plan
	SELECT r % 4 + 1, (s - 1) / 5, 'u' || lpad(r::text, 2, '0'), s, NULL, 'un', 'u' || lpad(r::text, 2, '0') || '-' || s
	  FROM generate_series(1, 20) r, generate_series(1, 50) s;
	CREATE TABLE key_next (okey text PRIMARY KEY, n int NOT NULL DEFAULT 0);
	INSERT INTO key_next SELECT DISTINCT okey FROM plan WHERE okey IS NOT NULL;
	-- the decision order of each key (kseq 1..50)
	CREATE TABLE decided (command_id text PRIMARY KEY, okey text NOT NULL, kseq int NOT NULL);
	CREATE TABLE producers_done (p int);
	-- one row per delivery (claim): done is acked, ack_refused, failed,
	-- fail_refused or abandoned
	CREATE TABLE deliveries (id bigserial, command_id text, lease_key text, worker text, version bigint, token text,
							 claimed_at timestamptz, lease_until timestamptz, done text, done_at timestamptz,
							 handed bool NOT NULL DEFAULT false);
});
is(sq('SELECT count(*) FROM plan'), '11000', 'the plan has 10,000 ordered and 1,000 unordered commands');

# A producer: one transaction per chunk.  The test's lock on the key
# (advisory, class 26) is taken before the numbering and the decision, so
# that the numbering is the order of the decisions of the key.
my $key_arg = $keyed ? ', ordering_key => c.okey' : '';
my $key_json = $keyed ? q{, 'ordering_key', c.okey} : '';
my $producer = qq{
DO \$\$
DECLARE
	c record;
	last int;
	i int;
BEGIN
	FOR c IN SELECT run_id, chunk, okey, kind, array_agg(seq ORDER BY seq) seqs
			   FROM plan WHERE p = __P__ GROUP BY run_id, chunk, okey, kind ORDER BY chunk, run_id
	LOOP
		IF c.okey IS NOT NULL THEN
			PERFORM pg_advisory_xact_lock(26, hashtext(c.okey));
			UPDATE key_next SET n = n + cardinality(c.seqs) WHERE okey = c.okey RETURNING n INTO last;
			INSERT INTO decided
			SELECT c.run_id || '-' || s, c.okey, last - cardinality(c.seqs) + o::int
			  FROM unnest(c.seqs) WITH ORDINALITY u(s, o);
		END IF;
		IF c.okey IS NOT NULL AND random() < 0.3 THEN
			PERFORM outbox.commit_decisions((SELECT jsonb_agg(jsonb_build_object(
					'run_id', c.run_id, 'seq', s, 'event_kind', 'decided',
					'command_id', c.run_id || '-' || s, 'command_kind', c.kind,
					'payload', jsonb_build_object('s', s) $key_json) ORDER BY s)
				FROM unnest(c.seqs) s));
		ELSE
			FOREACH i IN ARRAY c.seqs LOOP
				PERFORM outbox.commit_decision(c.run_id, i, 'decided', c.run_id || '-' || i, c.kind,
					jsonb_build_object('s', i) $key_arg);
			END LOOP;
		END IF;
		COMMIT;
	END LOOP;
	INSERT INTO producers_done VALUES (__P__);
END
\$\$;
};

# A publisher.  10% of its claims take a lease of 0.4 s: of those, 40% are
# abandoned (never acked: the worker carries on under a new name) and 30%
# are acked after 0.6 s (refused if taken over meanwhile).  Otherwise 5% of
# the deliveries fail (retryable) and the rest are acked in one call.  The
# claim time is read after the claim returned, the ack and fail times
# before their commit, so that each lease a publisher held lies within
# [claimed_at, the time of its ack or fail], or [claimed_at, lease_until]
# when it was not acked or failed in time.  A publisher with handover
# acks by ack_handover and logs each lease handed over as a delivery,
# claimed at the time it read it (after the ack of the command before it);
# it acks them with its next batch (an abandon abandons them too: their
# lease of 5 s runs out and they are taken over).
my $publisher = q{
DO $$
DECLARE
	gen int := 0;
	w text := 'p' || pg_backend_pid() || '-0';
	r record;
	short bool;
	fate text;
	toks text[];
	ids bigint[];
	n int;
	handover bool := __H__;
	deadline timestamptz := clock_timestamp() + interval '150 seconds';
BEGIN
	LOOP
		short := random() < 0.1;
		fate := CASE WHEN NOT short THEN 'normal' WHEN random() < 0.4 THEN 'abandon'
					 WHEN random() < 0.5 THEN 'late' ELSE 'normal' END;
		n := 0;
		FOR r IN SELECT * FROM outbox.claim(w, 20, CASE WHEN short THEN interval '0.4 s' ELSE interval '30 s' END,
											ARRAY['oa', 'ob', 'un'])
		LOOP
			n := n + 1;
			INSERT INTO deliveries (command_id, lease_key, worker, version, token, claimed_at, lease_until, done)
			VALUES (r.command_id, to_jsonb(r) ->> 'ordering_key', w, r.version, r.token, clock_timestamp(),
					r.lease_until, CASE WHEN fate = 'abandon' THEN 'abandoned' END);
		END LOOP;
		COMMIT;
		IF n = 0 AND NOT EXISTS (SELECT 1 FROM deliveries d WHERE d.worker = w AND d.done IS NULL) THEN
			EXIT WHEN (SELECT count(*) FROM producers_done) = 4
				  AND NOT EXISTS (SELECT 1 FROM outbox.commands
								   WHERE kind IN ('oa', 'ob', 'un') AND status IN ('pending', 'sending'));
			EXIT WHEN clock_timestamp() > deadline;
			PERFORM pg_sleep(0.02);
			CONTINUE;
		END IF;
		IF fate = 'abandon' THEN
			UPDATE deliveries SET done = 'abandoned' WHERE worker = w AND done IS NULL;
			gen := gen + 1;
			w := 'p' || pg_backend_pid() || '-' || gen;
			CONTINUE;
		END IF;
		IF fate = 'late' THEN
			PERFORM pg_sleep(0.6);
		END IF;
		toks := '{}';
		ids := '{}';
		FOR r IN SELECT d.id, d.token FROM deliveries d WHERE d.worker = w AND d.done IS NULL ORDER BY d.id
		LOOP
			IF fate = 'normal' AND random() < 0.05 THEN
				BEGIN
					PERFORM outbox.fail(w, r.token, 'random failure', false);
					UPDATE deliveries SET done = 'failed', done_at = clock_timestamp() WHERE id = r.id;
				EXCEPTION WHEN SQLSTATE 'OB001' THEN
					UPDATE deliveries SET done = 'fail_refused', done_at = clock_timestamp() WHERE id = r.id;
				END;
			ELSE
				ids := ids || r.id;
				toks := toks || r.token;
			END IF;
		END LOOP;
		IF handover THEN
			-- a row per token, then a row per lease handed over
			FOR r IN SELECT * FROM outbox.ack_handover(w, toks, 20, interval '5 s', ARRAY['oa', 'ob', 'un'])
					 WITH ORDINALITY a
			LOOP
				IF r.ordinality <= cardinality(toks) THEN
					UPDATE deliveries SET done = CASE WHEN r.acked THEN 'acked' ELSE 'ack_refused' END,
						   done_at = clock_timestamp()
					 WHERE id = ids[r.ordinality];
				ELSE
					INSERT INTO deliveries (command_id, lease_key, worker, version, token, claimed_at, lease_until, handed)
					VALUES (r.command_id, r.ordering_key, w, r.version, r.token, clock_timestamp(), r.lease_until, true);
				END IF;
			END LOOP;
		ELSE
			UPDATE deliveries d SET done = CASE WHEN a.acked THEN 'acked' ELSE 'ack_refused' END,
				   done_at = clock_timestamp()
			  FROM outbox.ack_many(w, toks) WITH ORDINALITY a
			  JOIN unnest(ids) WITH ORDINALITY i(id, ord) ON i.ord = a.ordinality
			 WHERE d.id = i.id;
		END IF;
		COMMIT;
	END LOOP;
END
$$;
};

# ---------------------------------------------------------------------------
# 1. 4 producers, 4 publishers, then the drain
# ---------------------------------------------------------------------------
{
	my @h;
	my @err;
	for my $i (1 .. $producers + $publishers)
	{
		my $sql = $i <= $producers ? $producer =~ s/__P__/$i/gr
		  : $publisher =~ s/__H__/$i % 2 ? 'true' : 'false'/gre;
		my ($out, $err) = ('', '');
		push @err, \$err;
		push @h, IPC::Run::start(
			[ 'psql', '-X', '-q', '-v', 'ON_ERROR_STOP=1', '-d', $node->connstr('postgres'), '-c', $sql ],
			'>', \$out, '2>', \$err,
			IPC::Run::timeout($PostgreSQL::Test::Utils::timeout_default));
	}
	my $ok = 1;
	for my $i (0 .. $#h)
	{
		my $done = eval { $h[$i]->finish };
		$ok &&= $done;
		diag("session $i: " . ($@ || ${ $err[$i] })) if !$done;
	}
	ok($ok, '4 producers and 4 publishers finished without error');
}

# When a lease ended, as far as the publisher that held it can tell: its
# accepted ack or fail, else the lease end.
sq(q{
	CREATE VIEW held AS
	SELECT d.id, d.command_id, k.okey, k.kseq, d.claimed_at, d.done,
		   CASE WHEN d.done IN ('acked', 'failed') THEN d.done_at ELSE d.lease_until END AS ended
	  FROM deliveries d LEFT JOIN decided k USING (command_id);
});

is(sq('SELECT count(*) FROM decided'), '10000', 'the producers decided 10,000 ordered commands');
is(sq(q{SELECT string_agg(status || ' ' || n, ', ') FROM
		(SELECT status, count(*) n FROM outbox.commands GROUP BY 1 ORDER BY 1) s}),
	'published 11000', 'every command is published, none dead');
is(sq(q{SELECT count(*) FROM outbox.commands c
		 WHERE (SELECT count(*) FROM deliveries d WHERE d.command_id = c.command_id AND d.done = 'acked') <> 1}),
	'0', 'every command was acked exactly once');
SKIP:
{
	skip 'commands decided without keys', 3 if !$keyed;
	is(sq(q{SELECT count(*) FROM outbox.commands c LEFT JOIN decided k USING (command_id)
			 WHERE c.ordering_key IS DISTINCT FROM k.okey}),
		'0', 'every command carries the key it was decided with (none for the unordered)');
	is(sq(q{SELECT count(*) FROM deliveries d LEFT JOIN decided k USING (command_id)
			 WHERE d.lease_key IS DISTINCT FROM k.okey}),
		'0', 'every claim returned the command\'s ordering_key');
	is(sq(q{SELECT count(*) FROM outbox.commands c JOIN decided k USING (command_id)
			 WHERE c.ordering_seq IS DISTINCT FROM k.kseq}),
		'0', 'the server\'s place of each command in its key is the decision order');
}

# The order of the first deliveries of a key, and of its acks, is the
# decision order (a tie counts as out of order).
is(sq(q{SELECT count(*) FROM
		(SELECT kseq, row_number() OVER (PARTITION BY okey ORDER BY first_at, kseq DESC) rn
		   FROM (SELECT okey, kseq, min(claimed_at) first_at FROM held WHERE okey IS NOT NULL
				  GROUP BY okey, kseq) f) x
		 WHERE rn <> kseq}),
	'0', 'per key, the first deliveries came in the decision order');
is(sq(q{SELECT count(*) FROM
		(SELECT kseq, row_number() OVER (PARTITION BY okey ORDER BY ended, kseq DESC) rn
		   FROM held WHERE okey IS NOT NULL AND done = 'acked') x
		 WHERE rn <> kseq}),
	'0', 'per key, the acks came in the decision order');
is(sq(q{SELECT count(*) FROM
		(SELECT claimed_at, max(ended) OVER (PARTITION BY okey ORDER BY claimed_at, id
											 ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) prev
		   FROM held WHERE okey IS NOT NULL) x
		 WHERE claimed_at <= prev}),
	'0', 'no two leases of one key overlapped in time');
cmp_ok(sq(q{SELECT count(*) FROM held a JOIN held b
			  ON a.okey IS NULL AND b.okey IS NULL AND a.id < b.id
			 AND split_part(a.command_id, '-', 1) = split_part(b.command_id, '-', 1)
			 AND a.command_id <> b.command_id
			 AND b.claimed_at < a.ended AND a.claimed_at < b.ended}),
	'>', 0, 'unordered commands of one run were leased side by side');

my %fates = split /[|\n]/, sq(q{SELECT done, count(*) FROM deliveries GROUP BY 1});
note(join(', ', map { "$_: $fates{$_}" } sort keys %fates));
cmp_ok($fates{failed} // 0, '>', 0, 'some deliveries failed and were retried');
cmp_ok($fates{abandoned} // 0, '>', 0, 'some leases were abandoned');
cmp_ok(sq(q{SELECT count(*) FROM deliveries a JOIN deliveries b
			  ON a.command_id = b.command_id AND a.done = 'abandoned' AND b.id > a.id}),
	'>', 0, 'abandoned leases were taken over');
cmp_ok(sq(q{SELECT count(*) FROM deliveries WHERE handed AND done = 'acked'}),
	'>', 0, 'leases handed over by ack_handover were delivered and acked');
cmp_ok(sq(q{SELECT count(*) FROM deliveries a JOIN deliveries b
			  ON a.command_id = b.command_id AND a.handed AND a.done = 'abandoned' AND b.id > a.id}),
	'>', 0, 'abandoned leases handed over were taken over when they ran out');
conservation_clean($node, 'after the drain');

if (!$keyed)
{
	$node->stop;
	done_testing();
	exit;
}

# ---------------------------------------------------------------------------
# Helpers of parts 2 and 3: one publisher "t" whose tokens are kept in toks
# ---------------------------------------------------------------------------
sq(q{CREATE TABLE toks (command_id text PRIMARY KEY, token text)});

# Claim up to 10 commands of the kinds; "command_id key" of each, sorted.
sub claim
{
	my ($kinds, $lease) = @_;
	$lease //= '1 minute';
	return sq(qq{
		WITH c AS (SELECT * FROM outbox.claim('t', 10, interval '$lease', '{$kinds}')),
			 k AS (INSERT INTO toks SELECT command_id, token FROM c)
		SELECT coalesce(string_agg(command_id || ' ' || coalesce(ordering_key, '-'), ',' ORDER BY command_id), '')
		  FROM c});
}

# Ack commands held by t; how many were acked.
sub ack
{
	my $ids = join(',', map { "'$_'" } @_);
	return sq(qq{
		WITH a AS (SELECT * FROM outbox.ack_many('t', ARRAY(SELECT token FROM toks WHERE command_id IN ($ids)))),
			 d AS (DELETE FROM toks WHERE command_id IN ($ids))
		SELECT count(*) FILTER (WHERE acked) FROM a});
}

# Fail a command held by t; its new status.
sub fail
{
	my ($id, $fatal) = @_;
	return sq(qq{SELECT outbox.fail('t', (SELECT token FROM toks WHERE command_id = '$id'), 'broken', $fatal);
				 DELETE FROM toks WHERE command_id = '$id'});
}

# Claim and ack until a claim finds nothing: the batches' command ids,
# "a,b | c".
sub drain
{
	my ($kinds) = @_;
	my @batches;
	for (1 .. 100)
	{
		my $got = claim($kinds);
		last if $got eq '';
		my @ids = map { (split / /)[0] } split /,/, $got;
		ack(@ids);
		push @batches, join(',', @ids);
	}
	return join(' | ', @batches);
}

# The rows of outbox.blocked_keys of the keys that stand still (a key
# whose head may be claimed now is listed too, with head_claimable).
sub blocked
{
	return sq(q{SELECT coalesce(string_agg(concat_ws(' ', ordering_key, head_command_id, head_run_id, head_status,
													 waiting, since IS NOT NULL), ',' ORDER BY ordering_key), '')
				  FROM outbox.blocked_keys WHERE NOT head_claimable});
}

# An error with its SQLSTATE, for a statement that must fail.
sub error_of
{
	my ($sql) = @_;
	my ($out, $err);
	my $rc = $node->psql('postgres', "\\set VERBOSITY verbose\n$sql", stdout => \$out, stderr => \$err);
	return $rc == 0 ? 'no error' : ($err =~ /ERROR:  ([0-9A-Z]{5}): (.*)/ ? "$1: $2" : $err);
}

# ---------------------------------------------------------------------------
# 2. A dead head blocks only its key; blocked_keys; skip_head; requeue and
#    resolve release the next
# ---------------------------------------------------------------------------
sq(q{
	SELECT outbox.set_policy('dk', max_deliveries => 1);
	SELECT outbox.set_policy('bk', max_deliveries => 5, backoff_base => '1 hour', backoff_max => '1 hour');
	SELECT outbox.set_policy('mk', takeover => 'manual');
	SELECT outbox.commit_decision('dr-1', s, 'decided', 'dk-' || s, 'dk', '{}', ordering_key => 'dead-key')
	  FROM generate_series(1, 4) s;
	-- live-key: two runs taking turns
	SELECT outbox.commit_decision(CASE WHEN s % 2 = 1 THEN 'lr-1' ELSE 'lr-2' END, (s + 1) / 2, 'decided',
								  'lk-' || s, 'dk', '{}', ordering_key => 'live-key')
	  FROM generate_series(1, 4) s;
});
is(claim('dk'), 'dk-1 dead-key,lk-1 live-key', 'dead head: the claim hands out the head of each key only');
is(fail('dk-1', 'true'), 'dead', 'dead head: dk-1 fails for good');
is(ack('lk-1'), '1', 'dead head: lk-1 acked');
is(drain('dk'), 'lk-2 | lk-3 | lk-4', 'dead head: the other key drains in order, one at a time');
is(sq(q{SELECT string_agg(command_id || ' ' || status || ' ' || deliveries, ',' ORDER BY command_id)
		  FROM outbox.commands WHERE command_id IN ('dk-2', 'dk-3', 'dk-4')}),
	'dk-2 pending 0,dk-3 pending 0,dk-4 pending 0', 'dead head: the rest of its key waits, never delivered');
is(blocked(), 'dead-key dk-1 dr-1 dead 3 t', 'blocked_keys: the key, its dead head, since when, 3 waiting');
like(error_of(q{SELECT outbox.skip_head('live-key')}), qr/^55000: /,
	'skip_head of a key with nothing unfinished: 55000');
like(error_of(q{SELECT outbox.skip_head('no-such-key')}), qr/^55000: /, 'skip_head of an unknown key: 55000');
like(error_of(q{SELECT outbox.skip_head(NULL)}), qr/^22004: /, 'skip_head(NULL): 22004');
is(blocked(), 'dead-key dk-1 dr-1 dead 3 t', 'the refused calls changed nothing');
is(sq(q{SELECT outbox.skip_head('dead-key')}), 'dk-1', 'skip_head returns the skipped head');
is(blocked(), '', 'the key is no longer blocked');
is(sq(q{SELECT concat_ws(' ', head_command_id, head_status, waiting) FROM outbox.blocked_keys
		 WHERE ordering_key = 'dead-key' AND head_claimable}),
	'dk-2 pending 2', 'blocked_keys still lists the key, its head claimable, 2 waiting');
is(drain('dk'), 'dk-2 | dk-3 | dk-4', 'after skip_head the key drains in order');
is(sq(q{SELECT concat_ws(' ', status, ordering_key, ordering_seq) FROM outbox.commands WHERE command_id = 'dk-1'}),
	'dead', 'the skipped head stays dead and leaves its key');
like(sq(q{SELECT last_error FROM outbox.commands WHERE command_id = 'dk-1'}), qr/skipped as the head of ordering key dead-key$/,
	'its last error says so');

# A head in retry backoff holds its key; skip_head refuses it.
sq(q{SELECT outbox.commit_decision('br', s, 'decided', 'bk-' || s, 'bk', '{}', ordering_key => 'slow-key')
	   FROM generate_series(1, 3) s});
is(claim('bk'), 'bk-1 slow-key', 'backoff: the head is claimed');
is(fail('bk-1', 'false'), 'pending', 'backoff: the head fails, to retry in an hour');
is(claim('bk'), '', 'backoff: nothing of the key is claimable meanwhile');
is(blocked(), 'slow-key bk-1 br pending 2 t', 'blocked_keys: the head in backoff, 2 waiting');
like(error_of(q{SELECT outbox.skip_head('slow-key')}), qr/^55000: /, 'skip_head refuses a head that is not dead: 55000');
is(blocked(), 'slow-key bk-1 br pending 2 t', 'skip_head changed nothing');

# requeue of a dead head: the head goes again, then the next.
sq(q{SELECT outbox.commit_decision('rqr', s, 'decided', 'rq-' || s, 'dk', '{}', ordering_key => 'rq-key')
	   FROM generate_series(1, 2) s});
is(claim('dk'), 'rq-1 rq-key', 'requeue: the head is claimed');
is(fail('rq-1', 'true'), 'dead', 'requeue: the head dies');
sq(q{SELECT outbox.requeue('rqr', 'rq-1')});
is(drain('dk'), 'rq-1 | rq-2', 'requeue: the requeued head is delivered, then the next');

# resolve of an uncertain head as published releases the next.
sq(q{SELECT outbox.commit_decision('mr', s, 'decided', 'mk-' || s, 'mk', '{}', ordering_key => 'mk-key')
	   FROM generate_series(1, 2) s});
is(claim('mk', '0.3 s'), 'mk-1 mk-key', 'resolve: the head is claimed with a short lease');
# once the lease has ended, a sweep (ours or the worker's) settles it
ok($node->poll_query_until('postgres', q{SELECT outbox.sweep() >= 0 AND status = 'uncertain'
											FROM outbox.commands WHERE command_id = 'mk-1'}),
	'resolve: once its lease ended, the head is uncertain (manual takeover)');
is(claim('mk'), '', 'resolve: nothing of the key is claimable while its head is uncertain');
is(blocked(), 'mk-key mk-1 mr uncertain 1 t,slow-key bk-1 br pending 2 t', 'blocked_keys: the uncertain head, 1 waiting');
sq(q{SELECT outbox.resolve('mr', 'mk-1', 'published')});
is(drain('mk'), 'mk-2', 'resolve as published releases the next');

# ---------------------------------------------------------------------------
# 3. ordered_by_run
# ---------------------------------------------------------------------------
sq(q{
	SELECT outbox.set_policy('rb', ordered_by_run => true);
	SELECT outbox.commit_decision(r, s, 'decided', replace(r, 'rb-', 'rb') || '-' || s, 'rb', '{}')
	  FROM unnest(ARRAY['rb-a', 'rb-b']) r, generate_series(1, 3) s;
	SELECT outbox.commit_decision('rb-a', s, 'decided', 'rca-' || s, 'rc', '{}') FROM generate_series(4, 5) s;
	SELECT outbox.commit_decision('rb-c', s, 'decided', 'rbx-' || s, 'rb', '{}', ordering_key => 'explicit')
	  FROM generate_series(1, 2) s;
});
is(sq(q{SELECT string_agg(command_id || '=' || coalesce(ordering_key, '-'), ',' ORDER BY command_id)
		  FROM outbox.commands WHERE kind IN ('rb', 'rc')}),
	'rba-1=rb-a,rba-2=rb-a,rba-3=rb-a,rbb-1=rb-b,rbb-2=rb-b,rbb-3=rb-b,rbx-1=explicit,rbx-2=explicit,rca-4=-,rca-5=-',
	'ordered_by_run: the kind\'s commands without a key are keyed by run_id; an explicit key stays; other kinds unordered');
is(claim('rb,rc'), 'rba-1 rb-a,rbb-1 rb-b,rbx-1 explicit,rca-4 -,rca-5 -',
	'ordered_by_run: one head per run, the unordered kind all at once');
ack('rba-1', 'rbb-1', 'rbx-1', 'rca-4', 'rca-5');
is(drain('rb'), 'rba-2,rbb-2,rbx-2 | rba-3,rbb-3', 'ordered_by_run: each run in seq order');

conservation_clean($node, 'at the end');

$node->stop;
done_testing();
