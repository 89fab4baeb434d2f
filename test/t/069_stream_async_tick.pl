# Streams: the worker's ticks commit without waiting for their WAL flush
# (synchronous_commit = off in the worker), and so do the relay's claims
# by default; an immediate stop of the server right after a tick and a
# claim that read it, with nothing flushed since (wal_writer_delay of 10 s),
# loses what the crash loses: the tick, the claim, or both, never one
# without what it read.  After the restart the claim's old token is
# refused unless the claim survived, the worker cuts the ticks again, and
# every command is delivered (lost 0, unexpected 0, duplicates at most the
# one batch), with the stream's progress and the conservation checks
# clean (docs/design-decisions.md, "Ticks commit without waiting for the
# WAL flush").
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use FindBin;
use lib "$FindBin::RealBin/../perl";
use OutboxTest;
use Time::HiRes qw(time);

my $node = outbox_node('stream_async_tick', qq{
outbox.naptime = '1min'
wal_writer_delay = '10s'
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

my $n = 20;
my @ids = map { "c$_" } 1 .. $n;

# Each decision commits on its own, synchronously (durable): the worker,
# woken by the commits, cuts the ticks.
sql(qq{SELECT outbox.commit_decision('r$_', 1, 'e', 'c$_', 'k', '{}')}) for 1 .. $n;
my $ticked = 0;
my $until = time() + 10;
while (time() < $until)
{
	$ticked = sql(q{
SELECT (SELECT max(k.last_id) FROM outbox.stream_ticks k)
	   >= (SELECT max(l.id) FROM outbox._stream_log l)});
	last if $ticked eq 't';
	select(undef, undef, undef, 0.02);
}
is($ticked, 't', 'the worker cut a tick that sees every command');
my $tick_before = sql(q{SELECT tick || ' ' || snap FROM outbox.stream_ticks ORDER BY tick DESC LIMIT 1});
note('WAL flushed up to the insert position after the tick: '
	  . sql(q{SELECT pg_current_wal_flush_lsn() >= pg_current_wal_insert_lsn()}));

# A claim that reads the tick, committed asynchronously (as the relay's
# claims are by default), then the crash with nothing flushed since.
my $out = sql(q{
SET synchronous_commit = off;
CREATE TEMP TABLE b AS SELECT * FROM outbox.claim_batch('s', 'sub', 'relay');
SELECT coalesce(min(token), '') FROM b;
SELECT coalesce(string_agg(command_id, ',' ORDER BY command_id), '') FROM b;});
my ($token, $first) = split /\n/, $out, 2;
$first //= '';
my @first = grep { $_ ne '' } split /,/, $first;
ok(@first > 0, 'the claim before the crash got a batch (' . scalar(@first) . ' commands)');
$node->stop('immediate');
$node->start;
$node->poll_query_until('postgres', q{SELECT rounds > 0 FROM outbox.workers})
  or die 'no worker after the restart';

my $held = sql(q{SELECT count(*) FROM outbox.stream_progress WHERE batch_to IS NOT NULL});
my ($num, $snap) = split / /, $tick_before;
note("the last tick before the crash ($tick_before) "
	  . (sql(qq{SELECT count(*) FROM outbox.stream_ticks WHERE tick = $num AND snap::text = '$snap'}) eq '1'
		? 'survived' : 'was lost')
	  . "; batches held after the restart: $held");
cmp_ok($held, '<=', 1, 'at most the one claimed batch is held after the restart');

# The old token: accepted only if its claim survived the crash.
my %delivered;
my ($rc, $ack_out, $ack_err) = $node->psql('postgres',
	qq{SELECT outbox.ack_batch('relay', '$token')});
if ($held eq '1')
{
	is($rc, 0, 'the claim survived: its ack is accepted') or diag($ack_err);
}
else
{
	like($ack_err, qr/lease_not_owned/, 'the claim was lost: its old token is refused (OB001)');
}
if ($rc == 0)
{
	$delivered{$_}++ foreach @first;
}
my $dups = $rc == 0 ? 0 : scalar(@first);

# Deliver the rest as a relay would, the same worker name again.
$until = time() + 20;
while (time() < $until)
{
	my $got = sql(q{
CREATE TEMP TABLE b AS SELECT * FROM outbox.claim_batch('s', 'sub', 'relay');
SELECT coalesce(string_agg(command_id, ',' ORDER BY command_id), '') FROM b;
SELECT outbox.ack_batch('relay', token) FROM (SELECT min(token) AS token FROM b) t WHERE token IS NOT NULL;});
	my ($ids) = split /\n/, $got;
	$delivered{$_}++ foreach grep { defined $_ && $_ ne '' } split /,/, ($ids // '');
	last if scalar(keys %delivered) == $n
	  && sql(q{SELECT count(*) FROM outbox.stream_lag WHERE ticks_behind > 0 OR batch_open}) eq '0';
	select(undef, undef, undef, 0.05) if ($ids // '') eq '';
}
my %want = map { $_ => 1 } @ids;
is(join(',', grep { !$delivered{$_} } @ids), '', 'lost 0: every command is delivered');
is(join(',', grep { !$want{$_} } sort keys %delivered), '', 'unexpected 0');
my $twice = grep { $delivered{$_} > 1 } keys %delivered;
cmp_ok($twice + $dups, '<=', scalar(@first), 'duplicates at most the one batch claimed before the crash');
is(sql(q{SELECT count(*) FROM outbox.stream_lag WHERE ticks_behind > 0 OR batch_open}), '0',
	'the subscription has nothing left behind');
is(sql(q{SELECT count(*) FROM outbox.conservation WHERE violations > 0 AND severity = 'error'}), '0',
	'the conservation checks are clean');
is(sql(q{SELECT outbox.verify()}), '', 'verify() passes');

$node->stop;
done_testing();
