# Two batches at the broker at once, and a chaos cut, for the broker sinks
# that deliver now and confirm later (sink.h: submit and settle): Redis
# Streams, RabbitMQ (AMQP with publisher confirms), NATS JetStream and
# Mosquitto (MQTT 5, QoS 1).  Each broker is the test's own process on
# 127.0.0.1 (ports and data directories of its own, stopped at the end,
# also when the test dies); the relay reaches it through test/hold_proxy.pl,
# which can HOLD the broker->relay direction (what the broker sends is
# kept, in order, not dropped), release it, and cut every connection.
# Counts at the broker are read from the broker itself (XRANGE, the
# queue's length, the stream's state, a subscriber of its own), never from
# the relay's log.  For each broker, with --batch B (5):
#
#  1. A fresh relay, its connection made and idle; HOLD; 3*B commands
#     decided at once (each its own run, so no ordering key holds a batch
#     back).  Exactly 2*B messages reach the broker and no more (a bounded
#     wait for 2*B, then the count stays 2*B for a while), nothing is
#     published in the database and exactly the 2*B at the broker are
#     `sending`: the batch claimed ahead was submitted while the first one
#     awaited its confirmations, and a third was not (a relay with one
#     batch at the broker at a time stops at B; with three, 3*B).
#  2. Release: all 3*B published, each once at the broker (3*B distinct,
#     3*B in all: nothing went twice).
#  3. Chaos: a fresh relay again, HOLD, 3*B more decided, 2*B at the
#     broker, then the proxy cuts every connection (the broker has the
#     messages, the relay never saw their confirmations).  Nothing of the
#     held batches is acked or dead-lettered, the 2*B stay `sending` (held,
#     leases renewed) on their first delivery; then the proxy forwards
#     again, the relay reconnects by itself, and at the end every command
#     is published, none lost (distinct ids at the broker = decided), the
#     duplicates detectable (total at the broker >= distinct, each
#     duplicate under its command's own id), the 2*B that were unconfirmed
#     at the cut published again (total >= 3*B + 2*B; JetStream drops the
#     second copies by Nats-Msg-Id, so there total = distinct),
#     conservation clean.
#  4. NATS and MQTT: the broker refuses the relay with two batches at it
#     (the stream removed: no responders; the ACL denies the topic:
#     PUBACK "not authorized", after which Mosquitto disconnects the
#     client), the answers held until both batches are submitted: an
#     outage, nothing acked or dead-lettered; once the broker takes them
#     again (the stream created again, the ACL reloaded) the relay retries
#     the current batch, then the one submitted ahead, and publishes all
#     3*B on their first delivery.  (Not here for RabbitMQ and Redis:
#     055 and 053 test their refusals, a deleted exchange and WRONGTYPE,
#     with one batch at the broker.)
#
# Why a fresh relay whose connection was made by two single-command
# batches: a claim ahead that finds nothing makes the relay skip the next
# claim ahead (main.c, "claim ahead less often while it finds nothing"), and
# the last claim ahead before a relay goes idle always finds nothing.  The
# first single command's claim ahead finds nothing (the next batch is not
# claimed ahead), the second one's batch uses that skip up, so the burst's
# first batch has its claim ahead again.  The warm-up also opens the
# sink's connection to the broker through the proxy before the HOLD (AMQP's
# login, NATS's INFO and stream check and MQTT's CONNACK need the broker's
# answers); --probe-interval 0 keeps the idle probe off the held
# connection, and --timeout 120 keeps the sinks' own no-confirmation
# timeout out of the held phase (it would count as an outage, and the
# messages would be published again).
#
# Adaptations: MQTT has no count of a topic's messages at the broker, so a
# QoS 1 subscriber of the test's own (mosquitto_sub, straight to the
# broker, not through the proxy) counts what the broker took: Mosquitto
# passes a QoS 1 PUBLISH on to its subscribers when it takes it, before the
# PUBACK it sends back (which the proxy holds).  B = 5 keeps the 2*B
# unacknowledged PUBLISHes within Mosquitto's Receive Maximum (its
# max_inflight_messages, 20 by default).  AMQP: a published message is in
# the queue (rabbitmqctl list_queues counts it) before its publisher
# confirm, which the proxy holds.

use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(usleep);
use IPC::Open2;
use JSON::PP;
use FindBin;
use lib "$FindBin::RealBin/../perl";
use OutboxTest;
use OutboxBrokerServer;
use OutboxBroker qw(relay_has_sink conservation_clean wait_match wait_until track_pid untrack_pid);

my $B = 5;
my @kinds = grep { relay_has_sink($_) } qw(redis amqp nats mqtt);
plan skip_all => 'outbox-relay was built without any of the redis, amqp, nats and mqtt sinks'
  unless @kinds;
note('sinks: ' . join(' ', @kinds));

my $tmp = PostgreSQL::Test::Utils::tempdir;
my $node = OutboxBrokerServer::sink_test_node('inflight');
my $dsn = $node->connstr('postgres');
my $proxy_script = "$FindBin::RealBin/../hold_proxy.pl";
sub sq { return $node->safe_psql('postgres', $_[0]); }

# ---------------------------------------------------------------------------
# The proxy
# ---------------------------------------------------------------------------

# Start test/hold_proxy.pl in front of 127.0.0.1:$port: { pid, in, out, port }.
sub proxy_start
{
	my ($port) = @_;
	my $p = {};
	$p->{pid} = open2($p->{out}, $p->{in}, $^X, $proxy_script, '127.0.0.1', $port);
	track_pid($p->{pid});
	$p->{in}->autoflush(1);
	my $ready = readline($p->{out}) // '';
	($p->{port}) = $ready =~ /^ready (\d+)$/ or die "hold_proxy.pl did not start: $ready";
	return $p;
}

# Send a command to the proxy; its answer.
sub proxy_cmd
{
	my ($p, $cmd) = @_;
	print { $p->{in} } "$cmd\n";
	my $ans = readline($p->{out}) // '';
	chomp $ans;
	return $ans;
}

# Stop the proxy (the end of its input ends it).
sub proxy_stop
{
	my ($p) = @_;
	close($p->{in});
	waitpid($p->{pid}, 0);
	untrack_pid($p->{pid});
	return $? >> 8;
}

# ---------------------------------------------------------------------------
# Commands and relays
# ---------------------------------------------------------------------------

# Decide $n commands at once (one statement, one transaction), each its
# own run "$prefix-NNN" with seq 1; command ids are the run ids.
sub decide
{
	my ($prefix, $n, $kind) = @_;
	sq(qq{SELECT count(outbox.commit_decision(format('%s-%s', '$prefix', lpad(s::text, 3, '0')), 1, 'decided',
		format('%s-%s', '$prefix', lpad(s::text, 3, '0')), '$kind', jsonb_build_object('n', s)))
		FROM generate_series(1, $n) s});
}

# "published sending pending dead" of the commands whose id starts with $prefix-.
sub states
{
	my ($prefix) = @_;
	return sq(qq{SELECT count(*) FILTER (WHERE status = 'published') || ' ' ||
		count(*) FILTER (WHERE status = 'sending') || ' ' ||
		count(*) FILTER (WHERE status = 'pending') || ' ' ||
		count(*) FILTER (WHERE status = 'dead')
		FROM outbox.commands WHERE command_id LIKE '$prefix-%'});
}

# Wait until every command of $prefix is published.
sub wait_published
{
	my ($prefix, $n) = @_;
	return OutboxBrokerServer::wait_sql($node,
		"SELECT count(*) = $n FROM outbox.commands WHERE command_id LIKE '$prefix-%' AND status = 'published'");
}

# Start a fresh relay for $kind through the proxy; its connection to the
# broker is made by two single-command batches (see the header).
# Returns (pid, stderr file).
sub relay_fresh
{
	my ($name, $kind, $sink, $warm) = @_;
	my ($pid, $err) = OutboxBrokerServer::relay_start($tmp, $name, '--dsn', $dsn, '--sink', $sink,
		'--kinds', $kind, '--batch', $B, '--poll', '0.2', '--timeout', '120',
		'--probe-interval', '0', '-v');
	track_pid($pid);
	for my $w (1, 2)
	{
		decide("$warm-$w", 1, $kind);
		ok(wait_published("$warm-$w", 1), "$name: warm-up command $w published");
	}
	return ($pid, $err);
}

# Stop a relay with SIGTERM: its exit code.
sub relay_stop
{
	my ($pid) = @_;
	kill 'TERM', $pid;
	my $rc = OutboxBrokerServer::wait_exit($pid);
	untrack_pid($pid);
	return $rc;
}

# ---------------------------------------------------------------------------
# The brokers: each starts itself and counts, at the broker, the messages
# whose command_id starts with a prefix: (total, { id => count }).
# ---------------------------------------------------------------------------

my %broker;

# Redis: a redis-server of the test's own.
$broker{redis} = sub {
	my $port = PostgreSQL::Test::Cluster::get_free_port();
	my $dir = "$tmp/redis";
	mkdir $dir or die "mkdir $dir: $!";
	my $pid = track_pid(spawn("$tmp/redis.out", "$tmp/redis.err", 'redis-server',
		'--port', $port, '--bind', '127.0.0.1', '--protected-mode', 'yes',
		'--dir', $dir, '--appendonly', 'no', '--save', '', '--logfile', "$dir/redis.log"));
	my $cli = sub {
		my $out = '';
		IPC::Run::run([ 'redis-cli', '-h', '127.0.0.1', '-p', $port, '--raw', @_ ],
			'<', \undef, '>', \$out, '2>', "$tmp/redis-cli.err",
			IPC::Run::timeout($PostgreSQL::Test::Utils::timeout_default));
		chomp $out;
		return $out;
	};
	ok(wait_until(sub { $cli->('PING') eq 'PONG' }), 'redis: redis-server started');
	return {
		port => $port,
		sink => sub { "redis://127.0.0.1:$_[0]?stream=inflight" },
		count => sub {
			my ($prefix) = @_;
			my %ids;
			my $total = 0;
			# --raw: the entry id, then its fields and values one a line
			my @lines = split /\n/, $cli->('XRANGE', 'inflight', '-', '+');
			while (@lines)
			{
				shift @lines;
				my %e;
				while (@lines && $lines[0] !~ /^\d+-\d+$/)
				{
					my $f = shift @lines;
					$e{$f} = shift @lines;
				}
				next unless ($e{command_id} // '') =~ /^\Q$prefix\E-/;
				$total++;
				$ids{ $e{command_id} }++;
			}
			return ($total, \%ids);
		},
		stop => sub {
			kill 'TERM', $pid;
			my $rc = OutboxBroker::wait_exit($pid);
			is($rc, 0, 'redis: redis-server stopped');
		},
	};
};

# RabbitMQ: a direct exchange bound to one durable queue; the queue's
# length counts, amqp-consume reads the ids (and empties the queue).
$broker{amqp} = sub {
	my $mq = OutboxBrokerServer->new('rabbitmq', "$tmp/rabbitmq");
	$mq->start;
	$mq->rabbit_declare([ [ 'inflight', 'direct' ] ], [ ['inflight'] ],
		[ [ 'inflight', 'inflight', 'cmd' ] ]);
	$ENV{OUTBOX_RELAY_AMQP_PASSWORD} = 'guest';
	my %consumed;    # prefix => [total, ids] read from the queue before
	return {
		port => $mq->port,
		sink => sub { "amqp://guest\@127.0.0.1:$_[0]?exchange=inflight&routing_key=cmd" },
		# the queue's length: every message of it is of the current step
		count => sub {
			my ($prefix) = @_;
			return ($mq->rabbit_queue_length('inflight') // 0, undef);
		},
		# the ids of what the queue holds (consumed)
		drain => sub {
			my ($prefix) = @_;
			my $n = $mq->rabbit_queue_length('inflight');
			my %ids;
			my $total = 0;
			for my $body ($mq->rabbit_consume('inflight', $n))
			{
				next unless $body =~ /"command_id":\s*"(\Q$prefix\E-[^"]+)"/;
				$ids{$1}++;
				$total++;
			}
			return ($total, \%ids);
		},
		stop => sub { $mq->stop; ok(!$mq->running, 'amqp: rabbitmq stopped'); },
	};
};

# NATS: a JetStream file stream over inflight.>, duplicate window 10 min.
$broker{nats} = sub {
	my $ns = OutboxBrokerServer->new('nats', "$tmp/nats");
	$ns->start;
	$ns->js_stream_create('INFLIGHT', ['inflight.>'], 600);
	return {
		port => $ns->port,
		sink => sub { "nats://127.0.0.1:$_[0]/inflight.commands" },
		count => sub {
			my ($prefix) = @_;
			my %ids;
			my $total = 0;
			for my $m ($ns->js_stream_messages('INFLIGHT'))
			{
				my $id = $m->{headers}{'Outbox-Command-Id'} // '';
				next unless $id =~ /^\Q$prefix\E-/;
				$total++;
				$ids{$id}++;
			}
			return ($total, \%ids);
		},
		# the stream removed: a publish has no responders; then back
		refuse => sub { $ns->js_stream_delete('INFLIGHT'); },
		allow => sub { $ns->js_stream_create('INFLIGHT', ['inflight.>'], 600); },
		stop => sub { $ns->stop; ok(!$ns->running, 'nats: nats-server stopped'); },
	};
};

# Mosquitto: a QoS 1 subscriber of the test's own (a persistent session,
# subscribed before anything is published) writes what the broker passes
# on, one payload a line.
$broker{mqtt} = sub {
	my $dir = "$tmp/mosquitto";
	my $mq = OutboxBrokerServer->new('mosquitto', $dir, acl => "topic readwrite inflight/commands\n");
	# "Reloading config." is logged at the information level
	open(my $conf, '>>', "$dir/mosquitto.conf") or die "open $dir/mosquitto.conf: $!";
	print $conf "log_type information\n";
	close($conf);
	$mq->start;
	# a new ACL file, and SIGHUP: Mosquitto reloads it (and says so in its log)
	my $acl = sub {
		my ($topic) = @_;
		my $reloads = () = OutboxBrokerServer::slurp("$dir/mosquitto.log") =~ /Reloading config/g;
		open(my $fh, '>', "$dir/acl") or die "open $dir/acl: $!";
		print $fh "topic readwrite $topic\n";
		close($fh);
		kill 'HUP', $mq->{pids}[-1];
		ok(wait_until(sub {
			my $n = () = OutboxBrokerServer::slurp("$dir/mosquitto.log") =~ /Reloading config/g;
			return $n > $reloads; }), "mqtt: the ACL now lets anonymous clients use $topic");
	};
	my @session = ('-c', '-i', 'inflight-reader', '-q', '1', '-t', 'inflight/commands');
	my ($rc) = $mq->mqtt_sub(@session, '-E');
	is($rc, 0, 'mqtt: the subscriber session is subscribed');
	my $file = "$tmp/mqtt-sub.out";
	my $sub = track_pid(spawn($file, "$tmp/mqtt-sub.err", 'mosquitto_sub', '-h', '127.0.0.1',
		'-p', $mq->port, '-V', '5', @session, '-F', '%p'));
	return {
		port => $mq->port,
		sink => sub { "mqtt://127.0.0.1:$_[0]/inflight/commands?qos=1" },
		count => sub {
			my ($prefix) = @_;
			my %ids;
			my $total = 0;
			for my $line (split /\n/, OutboxBrokerServer::slurp($file))
			{
				my $body = eval { decode_json($line) } // {};
				my $id = $body->{command_id} // '';
				next unless $id =~ /^\Q$prefix\E-/;
				$total++;
				$ids{$id}++;
			}
			return ($total, \%ids);
		},
		# the ACL denies the topic: PUBACK "not authorized"; then allows it
		refuse => sub { $acl->('inflight/other'); },
		allow => sub { $acl->('inflight/commands'); },
		stop => sub {
			kill 'TERM', $sub;
			waitpid($sub, 0);
			untrack_pid($sub);
			$mq->stop;
			ok(!$mq->running, 'mqtt: mosquitto stopped');
		},
	};
};

# The total at the broker of $prefix's messages.
sub total_at
{
	my ($b, $prefix) = @_;
	my ($total) = $b->{count}->($prefix);
	return $total;
}

# The (total, ids) at the broker of $prefix's messages, read at the end of
# a step (RabbitMQ: consumed from the queue).
sub read_back
{
	my ($b, $prefix) = @_;
	return $b->{drain} ? $b->{drain}->($prefix) : $b->{count}->($prefix);
}

# Wait until the broker holds $n distinct commands of $prefix (or, where
# the count has no ids, $n messages).
sub wait_at
{
	my ($b, $prefix, $n) = @_;
	return wait_until(sub {
		my ($total, $ids) = $b->{count}->($prefix);
		return ($ids ? scalar(keys %$ids) : $total) >= $n;
	});
}

# Wait until the broker holds $n of $prefix's messages, then check that
# it stays there for a while (3 reads and about 2 s: a check of a count,
# not of a time): true when it reached $n and never passed it.  Returns the last
# count too.
sub stays_at
{
	my ($b, $prefix, $n) = @_;
	my $got = 0;
	wait_until(sub { ($got = total_at($b, $prefix)) >= $n });
	return (0, $got) if $got != $n;
	my $since = time();
	for (my $reads = 0; $reads < 3 || time() - $since < 2; $reads++)
	{
		usleep(200_000);
		$got = total_at($b, $prefix);
		return (0, $got) if $got != $n;
	}
	return (1, $got);
}

# ---------------------------------------------------------------------------
# Each broker
# ---------------------------------------------------------------------------

for my $kind (@kinds)
{
	my $b = $broker{$kind}->();
	my $proxy = proxy_start($b->{port});
	my $sink = $b->{sink}->($proxy->{port});
	my $k = "inf_$kind";

	# -----------------------------------------------------------------------
	# 1. Two batches at the broker at once, never three
	# -----------------------------------------------------------------------
	my ($pid, $err) = relay_fresh("$kind-a", $k, $sink, "$kind-w");
	ok(wait_at($b, "$kind-w", 2), "$kind: the warm-up commands are at the broker");
	read_back($b, "$kind-w");
	is(proxy_cmd($proxy, 'hold'), 'ok hold', "$kind: the proxy holds the broker's answers");
	decide("$kind-a", 3 * $B, $k);
	my ($ok, $got) = stays_at($b, "$kind-a", 2 * $B);
	ok($ok, "$kind: exactly 2*B = " . (2 * $B) . " messages at the broker, and no more, while the answers are held")
	  or diag("$got at the broker");
	is(states("$kind-a"), '0 ' . (2 * $B) . " $B 0",
		"$kind: none published, the 2*B at the broker are sending, the third batch is not claimed");
	like(proxy_cmd($proxy, 'stats'), qr/ held=[1-9]\d* /, "$kind: the broker answered, and its answers are held");

	# -----------------------------------------------------------------------
	# 2. Release: every command published, each once at the broker
	# -----------------------------------------------------------------------
	is(proxy_cmd($proxy, 'release'), 'ok release', "$kind: the proxy forwards again");
	ok(wait_published("$kind-a", 3 * $B), "$kind: all 3*B published after the release");
	ok(wait_at($b, "$kind-a", 3 * $B), "$kind: the broker has them");
	my ($total, $ids) = read_back($b, "$kind-a");
	is(scalar(keys %$ids), 3 * $B, "$kind: 3*B distinct commands at the broker");
	is($total, 3 * $B, "$kind: each once (no cut, nothing went twice)");
	is(sq("SELECT max(deliveries) FROM outbox.commands WHERE command_id LIKE '$kind-a-%'"), '1',
		"$kind: each on its first delivery");
	is(relay_stop($pid), 0, "$kind: the first relay exits 0 on SIGTERM");

	# -----------------------------------------------------------------------
	# 3. Chaos: two batches at the broker, their confirmations lost in a cut
	# -----------------------------------------------------------------------
	($pid, $err) = relay_fresh("$kind-c", $k, $sink, "$kind-x");
	ok(wait_at($b, "$kind-x", 2), "$kind chaos: the warm-up commands are at the broker");
	read_back($b, "$kind-x");
	is(proxy_cmd($proxy, 'hold'), 'ok hold', "$kind chaos: the proxy holds the broker's answers");
	decide("$kind-c", 3 * $B, $k);
	($ok, $got) = stays_at($b, "$kind-c", 2 * $B);
	ok($ok, "$kind chaos: 2*B messages at the broker, unconfirmed") or diag("$got at the broker");
	is(states("$kind-c"), '0 ' . (2 * $B) . " $B 0", "$kind chaos: the 2*B are sending, none published");
	unlike(OutboxBrokerServer::slurp($err), qr/sink unavailable/, "$kind chaos: no outage before the cut");
	like(proxy_cmd($proxy, 'cut'), qr/^ok cut [1-9]/, "$kind chaos: the proxy cut the relay's connections");
	ok(wait_match($err, qr/sink unavailable: /), "$kind chaos: the relay saw the cut as an outage")
	  or diag(OutboxBrokerServer::slurp($err));
	is(states("$kind-c"), '0 ' . (2 * $B) . " $B 0",
		"$kind chaos: nothing of the held batches acked or dead-lettered; held, still sending");
	is(sq("SELECT max(deliveries) FROM outbox.commands WHERE command_id LIKE '$kind-c-%' AND status = 'sending'"),
		'1', "$kind chaos: the outage spent no delivery");
	is(proxy_cmd($proxy, 'release'), 'ok release', "$kind chaos: the proxy forwards again");
	ok(wait_published("$kind-c", 3 * $B), "$kind chaos: the relay reconnected, all 3*B published");
	is(states("$kind-c"), (3 * $B) . ' 0 0 0', "$kind chaos: none dead, none left");
	is(relay_stop($pid), 0, "$kind chaos: the relay exits 0 on SIGTERM");
	ok(wait_at($b, "$kind-c", 3 * $B), "$kind chaos: the broker has them");
	($total, $ids) = read_back($b, "$kind-c");
	is(scalar(keys %$ids), 3 * $B, "$kind chaos: none lost: 3*B distinct commands at the broker");
	if ($kind eq 'nats')
	{
		is($total, 3 * $B, "$kind chaos: JetStream dropped the republished ones by Nats-Msg-Id");
	}
	else
	{
		cmp_ok($total, '>=', scalar(keys %$ids),
			"$kind chaos: duplicates detectable (total at the broker >= distinct ids)");
		# the relay cannot know that the broker has the 2*B: it published them again
		cmp_ok($total, '>=', 3 * $B + 2 * $B,
			"$kind chaos: the 2*B unconfirmed at the cut were published again (at least once)");
	}
	note("$kind chaos: $total messages at the broker for " . scalar(keys %$ids) . ' commands');
	is(sq("SELECT count(*) FROM outbox.commands WHERE kind = '$k' AND status <> 'published'"), '0',
		"$kind: every command of the kind published");

	# -----------------------------------------------------------------------
	# 4. The broker refuses the relay with two batches at it (NATS: the
	#    stream removed, no responders; MQTT: the ACL denies the topic,
	#    PUBACK "not authorized"): an outage; the current batch is retried
	#    first, the one submitted ahead after it, all published once the
	#    broker takes them again
	# -----------------------------------------------------------------------
	if ($b->{refuse})
	{
		($pid, $err) = relay_fresh("$kind-r", $k, $sink, "$kind-y");
		ok(wait_at($b, "$kind-y", 2), "$kind refused: the warm-up commands are at the broker");
		is(proxy_cmd($proxy, 'hold'), 'ok hold', "$kind refused: the proxy holds the broker's answers");
		$b->{refuse}->();
		decide("$kind-r", 3 * $B, $k);
		# the relay logs the claim ahead just before it submits that batch
		ok(wait_match($err, qr/claimed $B ahead/), "$kind refused: the batch claimed ahead is submitted");
		ok(OutboxBrokerServer::wait_sql($node,
			"SELECT count(*) = " . (2 * $B) . " FROM outbox.commands WHERE command_id LIKE '$kind-r-%' AND status = 'sending'"),
			"$kind refused: two batches claimed");
		is(proxy_cmd($proxy, 'release'), 'ok release', "$kind refused: the refusals reach the relay");
		ok(wait_match($err, qr/sink unavailable: /), "$kind refused: the refusal is an outage")
		  or diag(OutboxBrokerServer::slurp($err));
		is(sq("SELECT count(*) FROM outbox.commands WHERE command_id LIKE '$kind-r-%' AND status IN ('published', 'dead')"),
			'0', "$kind refused: nothing acked or dead-lettered");
		$b->{allow}->();
		ok(wait_published("$kind-r", 3 * $B), "$kind refused: all 3*B published once the broker takes them");
		is(relay_stop($pid), 0, "$kind refused: the relay exits 0 on SIGTERM");
		ok(wait_at($b, "$kind-r", 3 * $B), "$kind refused: the broker has them");
		($total, $ids) = read_back($b, "$kind-r");
		is(scalar(keys %$ids), 3 * $B, "$kind refused: 3*B distinct commands at the broker");
		is(sq("SELECT max(deliveries) FROM outbox.commands WHERE command_id LIKE '$kind-r-%'"), '1',
			"$kind refused: the outage spent no delivery");
	}

	is(proxy_stop($proxy), 0, "$kind: the proxy stopped");
	$b->{stop}->();
}

conservation_clean($node, 'after the broker runs');
$node->stop;
done_testing();
