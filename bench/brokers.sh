#!/usr/bin/env bash
# outbox-relay's broker sinks (Kafka, Redis Streams, RabbitMQ, NATS
# JetStream, MQTT) against a baseline publishing the same messages with the
# same client library and confirmation mode but without any database, in
# the same run, on a throwaway cluster and brokers of its own (127.0.0.1,
# ports and directories of their own, stopped by pid at the end, also on
# failure).  Not a test: it prints numbers.
#
#   bash bench/brokers.sh            # N = 100,000 commands a cell
#   QUICK=1 bash bench/brokers.sh    # N = 10,000, one short latency run
#
# Throughput: a preloaded backlog of N commands (outbox.commit_decisions,
# runs of 100) drained by 1 and 4 relays (--drain, --batch B) into the
# broker: commands per second from the relays' start to the last ack
# (max(published_at)).  The baseline (bench/broker_baseline.c) publishes
# the very messages the relay sends (its stdout sink's output: same bodies,
# same headers) and counts the broker's confirmations: librdkafka acks=all
# + idempotence, hiredis XADD pipelined per 100, librabbitmq publisher
# confirms with a window, cnats JetStream async publish with a window,
# libmosquitto QoS 1 with the same window (WINDOW, the sinks' default 256).
# The three cells take turns within each of REPEATS rounds; each broker is
# emptied before each cell; medians and the min–max spread are printed.
#
# Latency: one relay LISTENing, producers committing one decision per
# transaction at LAT_RATE per second for LAT_SECS seconds; commit time is
# the command's created_at (the producer's transaction), arrival is read
# from the broker's side: Redis the stream entry ID (the broker's clock,
# ms), NATS the stored message's timestamp, Kafka/RabbitMQ/MQTT the time a
# consumer on the broker (kcat, a librabbitmq consumer, mosquitto_sub)
# received it.  p50 and p99 of arrival - created_at.
#
# Each relay cell runs once per source: rows (the row leases of
# outbox.commands, --batch B) and stream (a fresh stream of PARTS
# partitions with batches of about B per partition, outbox-relay --stream
# --subscription: the write-once path of docs/streams.md; its cells end
# at the last batch's ack, max(acked_at) of the subscription's progress,
# and their messages carry the stream's ids, a few bytes longer than the
# baseline's; each leaves its stream behind).  The BEFORE cells and the
# latency run use row leases.
#
# The stdout row (the relay to /dev/null, no broker, no baseline) is the
# database's share: claim, ack and the relay's loop.
#
# Settings: N, B, REPEATS, RELAYS ("1 4"), BROKERS ("stdout kafka redis
# rabbitmq nats mosquitto"), SOURCES ("rows stream"), PARTS (8), WINDOW,
# LAT_RATE, LAT_SECS, ONLY=throughput|latency,
# KAFKA_RTT=MS (the Kafka mock answers every request MS late, as a broker
# across a network would; the baseline too), BROKER_RTT=MS (the other
# brokers are reached, by relays and baseline alike, through
# bench/delay_proxy.pl, which delays each direction by MS/2),
# BEFORE=PATH: another outbox-relay binary (e.g. an earlier build) whose
# cells take turns with this build's in each round, printed as "before"
# columns (and its latency run precedes this build's): a before/after
# comparison from the same run.
# Needs the broker packages of test/lib.sh's lists (it installs nothing:
# it names what is missing).
set -u
set -o pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
. "$ROOT/test/lib.sh"
. "$ROOT/bench/lib.sh"

N=${N:-100000}
B=${B:-100}
REPEATS=${REPEATS:-3}
RELAYS=${RELAYS:-"1 4"}
BROKERS=${BROKERS:-"stdout kafka redis rabbitmq nats mosquitto"}
SOURCES=${SOURCES:-"rows stream"}
for src in $SOURCES; do
	case $src in rows | stream) ;; *) echo "SOURCES: unknown source \"$src\" (rows, stream)" >&2; exit 2 ;; esac
done
WINDOW=${WINDOW:-256}
LAT_RATE=${LAT_RATE:-500}
LAT_SECS=${LAT_SECS:-10}
if [ -n "${QUICK:-}" ]; then
	N=${QUICK_N:-10000}
	LAT_SECS=5
fi

# The brokers, their tools and client libraries: test/lib.sh's lists.
need=()
for p in "${OUTBOX_TEST_PACKAGES[@]}" "${OUTBOX_PACKAGES[@]}"; do
	case $p in
		librdkafka-dev | libhiredis-dev | librabbitmq-dev | libnats-dev | libmosquitto-dev | \
			rabbitmq-server | nats-server | mosquitto | mosquitto-clients | kcat | \
			redis-server | redis-tools | libipc-run-perl) need+=("$p") ;;
	esac
done
missing=()
for p in "${need[@]}"; do
	dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
	echo "missing packages: ${missing[*]} (bash test/run.sh deps installs test/lib.sh's lists)" >&2
	exit 1
fi

outbox_bench_start bench-brokers || exit 1
RELAY=$OUTBOX_RELAY_BINDIR/outbox-relay
[ -x "$RELAY" ] || RELAY=$ROOT/src/outbox-relay
[ -x "$ROOT/test/kafka-mock" ] || { echo "missing test/kafka-mock: run make" >&2; exit 1; }
BASELINE=$WORK/broker-baseline
# shellcheck disable=SC2046
gcc -O2 -Wall -o "$BASELINE" "$ROOT/bench/broker_baseline.c" \
	$(pkg-config --cflags --libs rdkafka hiredis librabbitmq libnats libmosquitto) || exit 1
PERL_TEST=$("$PG_CONFIG" --pgxs | sed 's|/src/makefiles/pgxs.mk$||')/src/test/perl

BPID=
cleanup() {
	local f
	for f in "$WORK"/*.pid; do
		[ -f "$f" ] && kill -TERM "$(cat "$f")" 2>/dev/null
	done
	stop_broker
	outbox_cleanup_work "$WORK"
}
trap cleanup EXIT
DSN="host=$DATA port=$PORT dbname=bench"

as_pg "'$PGBIN/createdb' -h '$DATA' -p $PORT bench"
psql_q "CREATE EXTENSION outbox; CREATE SEQUENCE lat_seq;
CREATE TABLE lat_stamps (command_id text, at double precision);" || exit 1
cat >"$WORK/produce.sql" <<'EOF'
SELECT outbox.commit_decision('lat-' || (s / 100), s, 'decided', 'lat-' || s, 'k', jsonb_build_object('n', s, 'to', 'someone@example.org')) FROM nextval('lat_seq') s;
EOF
outbox_give_to_pg_user "$WORK"

# Commit N decisions in runs of 100 (set-based, 5,000 per call), then tidy.
load() {
	psql_q "TRUNCATE outbox.commands, outbox.events, outbox.receipts;
SELECT count(*)
  FROM (SELECT g / 5000 AS chunk,
               jsonb_agg(jsonb_build_object('run_id', 'run-' || (g / 100), 'seq', g, 'event_kind', 'decided',
                                            'command_id', 'cmd-' || g, 'command_kind', 'k',
                                            'payload', jsonb_build_object('n', g, 'to', 'someone@example.org'))) AS d
          FROM generate_series(1, $N) g GROUP BY 1) b,
       LATERAL outbox.commit_decisions(b.d);
VACUUM ANALYZE outbox.commands;
CHECKPOINT;" >/dev/null
}

# The messages of the baseline: what the relay's stdout sink writes for
# the same backlog (one relay, so in claim order).
load || { echo "loading the commands failed" >&2; exit 1; }
as_pg "'$RELAY' --dsn '$DSN' --sink stdout --batch $B --drain --worker gen >'$WORK/messages.jsonl' 2>>'$WORK/relay.log'" ||
	{ echo "the stdout relay failed" >&2; cat "$WORK/relay.log" >&2; exit 1; }
[ "$(wc -l <"$WORK/messages.jsonl")" -eq "$N" ] || { echo "messages.jsonl is short" >&2; exit 1; }
echo "messages: $N, $(($(wc -c <"$WORK/messages.jsonl") / N)) bytes of body on average"

# One broker at a time, run by bench/broker_ctl.pl as a coprocess.
start_broker() {
	local kind=$1
	coproc BROKER { exec perl -I "$PERL_TEST" "$ROOT/bench/broker_ctl.pl" "$kind" "$WORK/$kind" "$BASELINE" 2>>"$WORK/broker-$kind.log"; }
	BPID=$BROKER_PID
	# plain copies of the coprocess's pipes (the relay cells' subshells use them)
	exec {BIN}<&"${BROKER[0]}" {BOUT}>&"${BROKER[1]}"
	eval "exec ${BROKER[0]}<&- ${BROKER[1]}>&-"
	local ready
	read -r -t 180 -u "$BIN" ready ADDR || { echo "$kind did not start" >&2; tail "$WORK/broker-$kind.log" >&2; return 1; }
	[ "$ready" = ready ] || return 1
	BHOST=${ADDR%%:*}
	BPORT=${ADDR##*:}
	# BROKER_RTT=MS: relays and baseline reach the broker through a proxy
	# that delays each direction by MS/2 (bench/delay_proxy.pl)
	if [[ ${BROKER_RTT:-} =~ ^[1-9][0-9]*$ ]] && [ "$kind" != kafka ]; then
		local i
		: >"$WORK/proxy-$kind.out"
		perl "$ROOT/bench/delay_proxy.pl" "$BROKER_RTT" "$BHOST" "$BPORT" </dev/null \
			>"$WORK/proxy-$kind.out" 2>>"$WORK/broker-$kind.log" &
		echo $! >"$WORK/proxy.pid"
		for i in $(seq 100); do
			grep -q '^ready ' "$WORK/proxy-$kind.out" && break
			sleep 0.1
		done
		BPORT=$(awk '/^ready / { print $2 }' "$WORK/proxy-$kind.out")
		[ -n "$BPORT" ] || { echo "the delay proxy did not start" >&2; return 1; }
		ADDR=$BHOST:$BPORT
	fi
}
stop_broker() {
	[ -n "$BPID" ] || return 0
	exec {BOUT}>&- {BIN}<&-
	local i
	for i in $(seq 300); do
		kill -0 "$BPID" 2>/dev/null || break
		sleep 0.1
	done
	kill -TERM "$BPID" 2>/dev/null
	wait "$BPID" 2>/dev/null
	BPID=
	if [ -f "$WORK/proxy.pid" ]; then
		kill -TERM "$(cat "$WORK/proxy.pid")" 2>/dev/null
		rm -f "$WORK/proxy.pid"
	fi
}
ctl() {
	local reply
	[ "$KIND" = stdout ] && { echo ok; return 0; }
	echo "$*" >&"$BOUT"
	read -r -t 300 -u "$BIN" reply || { echo "broker_ctl: no answer to $*" >&2; return 1; }
	echo "$reply"
}

sink_url() {
	case $1 in
		kafka) echo "kafka://$ADDR/bench" ;;
		redis) echo "redis://$ADDR?stream=bench" ;;
		rabbitmq) echo "amqp://guest@$ADDR?exchange=bench&routing_key=cmd&window=$WINDOW" ;;
		nats) echo "nats://$ADDR/bench.cmd?window=$WINDOW" ;;
		mosquitto) echo "mqtt://$ADDR/bench?qos=1&window=$WINDOW" ;;
		stdout) echo stdout ;;
	esac
}

# One relay cell: k relays drain the backlog (source rows: row leases in
# outbox.commands; stream: a fresh stream of its own, with batches of about
# B per partition); prints commands per second.
run_relay() {
	local kind=$1 k=$2 relay=${3:-$RELAY} src=${4:-rows} start end left i url opts name
	url=$(sink_url "$kind")
	if [ "$src" = stream ]; then
		name=s$(psql_q "SELECT nextval('lat_seq')")	# (cells run in subshells)
		bench_stream_new "$name" "$B" && bench_load_stream "$name" "$N" "$B" &&
			psql_q "CHECKPOINT;" >/dev/null || { echo "loading the stream failed" >&2; return 1; }
		opts="--stream $name --subscription $name"
	else
		load || { echo "loading the commands failed" >&2; return 1; }
		opts="--batch $B"
	fi
	ctl reset >/dev/null || return 1
	start=$(psql_q "SELECT extract(epoch FROM clock_timestamp())")
	for i in $(seq "$k"); do
		as_pg "OUTBOX_RELAY_AMQP_PASSWORD=guest '$relay' --dsn '$DSN' --sink '$url' $opts --drain --worker bench-$kind-$i >/dev/null 2>>'$WORK/relay.log'" &
	done
	wait	# run_relay runs in a subshell: only its own relays
	if [ "$src" = stream ]; then
		end=$(psql_q "SELECT extract(epoch FROM max(acked_at)) FROM outbox.stream_progress WHERE subscription = '$name'")
		left=$(psql_q "SELECT $N - coalesce(sum(published), 0) FROM outbox.stream_progress WHERE subscription = '$name'")
	else
		end=$(psql_q "SELECT extract(epoch FROM max(published_at)) FROM outbox.commands")
		left=$(psql_q "SELECT count(*) FROM outbox.commands WHERE status <> 'published'")
	fi
	[ "$left" = 0 ] || echo "warning: $kind x$k ($src) left $left commands unpublished" >&2
	awk -v n="$N" -v s="$start" -v e="$end" 'BEGIN { printf "%.0f\n", n / (e - s) }'
}

# One baseline cell: prints messages per second.
run_baseline() {
	local kind=$1 out f=$WORK/messages.jsonl
	ctl reset >/dev/null || return 1
	case $kind in
		kafka) out=$("$BASELINE" kafka "$ADDR" bench "$f") ;;
		redis) out=$("$BASELINE" redis "$BHOST" "$BPORT" bench "$f") ;;
		rabbitmq) out=$("$BASELINE" amqp "$BHOST" "$BPORT" bench cmd "$f" "$WINDOW") ;;
		nats) out=$("$BASELINE" nats "nats://$ADDR" bench.cmd "$f" "$WINDOW") ;;
		mosquitto) out=$("$BASELINE" mqtt "$BHOST" "$BPORT" bench "$f" "$WINDOW") ;;
	esac || { echo "warning: the $kind baseline failed" >&2; return 1; }
	awk '{ printf "%.0f\n", $1 / $2 }' <<<"$out"
}

# "median (min–max)" of the numbers on stdin.
stats() {
	sort -n | awk '{ v[NR] = $1 } END { if (NR == 0) { print "-"; exit }
		printf "%d (%d–%d)\n", v[int((NR + 1) / 2)], v[1], v[NR] }'
}

# Latency: prints "p50 p99 count" in ms.
run_latency() {
	local kind=$1 relay=${2:-$RELAY} url pid n
	url=$(sink_url "$kind")
	psql_q "TRUNCATE outbox.commands, outbox.events, outbox.receipts, lat_stamps;" >/dev/null
	ctl reset >/dev/null || return 1
	case $kind in kafka | rabbitmq | mosquitto) ctl listen "$WORK/stamps-$kind.tsv" >/dev/null || return 1 ;; esac
	as_pg "OUTBOX_RELAY_AMQP_PASSWORD=guest '$relay' --dsn '$DSN' --sink '$url' --batch $B --worker lat-$kind </dev/null >/dev/null 2>>'$WORK/relay-lat.log' & echo \$! >'$WORK/relay-lat.pid'"
	for _ in $(seq 100); do
		[ "$(psql_q "SELECT count(*) FROM pg_stat_activity WHERE state = 'idle' AND query LIKE '%outbox.claim(%'")" -ge 1 ] && break
		sleep 0.1
	done
	as_pg "'$PGBIN/pgbench' -n -h '$DATA' -p $PORT -c 2 -j 2 -R $LAT_RATE -T $LAT_SECS -f '$WORK/produce.sql' bench" >"$WORK/pgbench-lat.log" 2>&1
	for _ in $(seq 200); do
		[ "$(psql_q "SELECT count(*) FROM outbox.commands WHERE status <> 'published'")" = 0 ] && break
		sleep 0.1
	done
	sleep 1
	pid=$(cat "$WORK/relay-lat.pid")
	kill -TERM "$pid"
	while kill -0 "$pid" 2>/dev/null; do sleep 0.1; done
	rm -f "$WORK/relay-lat.pid"
	case $kind in
		kafka | rabbitmq | mosquitto) ctl unlisten >/dev/null || return 1 ;;
		*) ctl stamps "$WORK/stamps-$kind.tsv" >/dev/null || return 1 ;;
	esac
	chmod a+r "$WORK/stamps-$kind.tsv"
	psql_q "\\copy lat_stamps FROM '$WORK/stamps-$kind.tsv'" || return 1
	# arrival, and the relay's ack (published_at) for comparison
	psql_q "SELECT format('%s %s %s %s %s', round((percentile_cont(0.5) WITHIN GROUP (ORDER BY ms))::numeric, 1),
       round((percentile_cont(0.99) WITHIN GROUP (ORDER BY ms))::numeric, 1), count(*),
       round((percentile_cont(0.5) WITHIN GROUP (ORDER BY ack))::numeric, 1),
       round((percentile_cont(0.99) WITHIN GROUP (ORDER BY ack))::numeric, 1))
  FROM (SELECT (min(s.at) - extract(epoch FROM c.created_at)) * 1000 AS ms,
               extract(epoch FROM c.published_at - c.created_at) * 1000 AS ack
          FROM outbox.commands c JOIN lat_stamps s USING (command_id)
         GROUP BY c.command_id, c.created_at, c.published_at) x"
}

declare -A RES LAT
for kind in $BROKERS; do
	KIND=$kind
	[ "$kind" = stdout ] || start_broker "$kind" || exit 1
	echo "$kind: $(sink_url "$kind")"
	if [ "${ONLY:-}" != latency ]; then
		for r in $(seq "$REPEATS"); do
			for k in $RELAYS; do
				if [ -n "${BEFORE:-}" ]; then
					v=$(run_relay "$kind" "$k" "$BEFORE") && RES[$kind,before$k]+="$v "
					echo "  round $r before x$k: $v/s"
				fi
				for src in $SOURCES; do
					v=$(run_relay "$kind" "$k" "$RELAY" "$src") && RES[$kind,$src$k]+="$v "
					echo "  round $r relay x$k ($src): $v/s"
				done
			done
			[ "$kind" = stdout ] && continue
			v=$(run_baseline "$kind") && RES[$kind,base]+="$v "
			echo "  round $r baseline: $v/s"
		done
	fi
	if [ "${ONLY:-}" != throughput ] && [ "$kind" != stdout ]; then
		if [ -n "${BEFORE:-}" ]; then
			v=$(run_latency "$kind" "$BEFORE")
			echo "  before: latency at $LAT_RATE/s: $v (arrival p50 ms, p99 ms, commands; ack p50 ms, p99 ms)"
		fi
		LAT[$kind]=$(run_latency "$kind")
		echo "  latency at $LAT_RATE/s: ${LAT[$kind]} (arrival p50 ms, p99 ms, commands; ack p50 ms, p99 ms)"
	fi
	stop_broker
done

echo
echo "commands/s, N = $N, B = $B, median (min–max) of $REPEATS; ratio = relay median / baseline median"
printf '| %-9s | %-24s |' broker baseline
if [ -n "${BEFORE:-}" ]; then
	for k in $RELAYS; do printf ' %-24s | %-5s |' "before: $k relay(s)" ratio; done
fi
for src in $SOURCES; do
	for k in $RELAYS; do printf ' %-24s | %-5s |' "$src: $k relay(s)" ratio; done
done
echo " p50 / p99 ms at $LAT_RATE/s (rows) |"
for kind in $BROKERS; do
	base=$(tr ' ' '\n' <<<"${RES[$kind,base]:-}" | grep . | stats)
	printf '| %-9s | %-24s |' "$kind" "$base"
	if [ -n "${BEFORE:-}" ]; then
		for k in $RELAYS; do
			rel=$(tr ' ' '\n' <<<"${RES[$kind,before$k]:-}" | grep . | stats)
			printf ' %-24s | %-5s |' "$rel" "$(awk -v a="${rel%% *}" -v b="${base%% *}" 'BEGIN { if (b > 0) printf "%.2f", a / b; else print "-" }')"
		done
	fi
	for src in $SOURCES; do
		for k in $RELAYS; do
			rel=$(tr ' ' '\n' <<<"${RES[$kind,$src$k]:-}" | grep . | stats)
			printf ' %-24s | %-5s |' "$rel" "$(awk -v a="${rel%% *}" -v b="${base%% *}" 'BEGIN { if (b > 0) printf "%.2f", a / b; else print "-" }')"
		done
	done
	l=${LAT[$kind]:-}
	[ -n "$l" ] && l=$(awk '{ printf "%s / %s (%s)", $1, $2, $3 }' <<<"$l")
	echo " ${l:--} |"
done
