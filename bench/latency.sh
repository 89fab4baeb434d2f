#!/usr/bin/env bash
# Commit-to-arrival latency through outbox-relay into outbox-receiver (the
# local HTTP endpoint, which logs when each request arrives), with where the
# time goes, for several relay and worker configurations taking turns in the
# same run.  Not a test: it prints numbers.
#
#   bash bench/latency.sh            # 200 and 2,000 commands/s, 3 repeats
#   QUICK=1 bash bench/latency.sh    # one repeat, 5 s per cell
#
# Producers (bench/latency_producer.c): business transactions "BEGIN;
# SELECT outbox.commit_decision(...); COMMIT" started at RATE per second on
# average (exponential gaps, as pgbench -R) on 4 connections.  One relay
# LISTENs (--sink http://... to the receiver, -vv: its trace gives each
# batch's wake-up, claim, delivery and report times).  Per command: from
# the moment its COMMIT was sent (and from the moment its answer came) to
# its request arriving at the receiver, and the steps:
#   commit       COMMIT sent -> answered (the producer's own commit)
#   wait         COMMIT answered -> the relay sends the claim that takes it
#                (the worker's wake-up, or the batch the relay was busy with)
#   notify       COMMIT answered -> the notification woke the relay (the
#                commands whose claim followed a wait)
#   claim        the claim's round trip, its commit included
#   http         claim returned -> the request arrived
#   ack          the sink returned -> the outcome was reported
# p50 and p99 of each cell, then the median over the repeats; "conns" is
# the number of the relay's connections to the receiver at the end of the
# cell (HTTP keep-alive: one, reused).
#
# Configurations (CONFIGS, one per line: name | server settings, as
# NAME=VALUE separated by spaces, set with ALTER SYSTEM for the cell | relay
# options [| SQL run before the cell]); the defaults add the levers one at a
# time:
#   before       the claim waits for its WAL flush; the worker holds every
#                wake-up for outbox.notify_interval (10 ms)
#   claim-async  + the claim commits without waiting for its flush
#   idle-notify  + outbox.notify_idle_interval = 1ms: a wake-up is held no
#                longer than that while the relay waits (the defaults)
#   ack-async    + --ack-commit=async
# Settings: RATES ("200 2000"), SECS (10), REPEATS (3), CONNS (4), CONFIGS,
# EXTRA_CONF (lines for postgresql.conf), KEEP_TRACES=DIR (copy the raw
# files there), SETUP_SQL (run once after CREATE EXTENSION), PENDING_SQL
# (counts the commands not delivered yet; default: outbox.commands not
# published).  bench/stream.sh runs it so for streams.
set -u
set -o pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
. "$ROOT/test/lib.sh"
. "$ROOT/bench/lib.sh"

RATES=${RATES:-"200 2000"}
SECS=${SECS:-10}
REPEATS=${REPEATS:-3}
CONNS=${CONNS:-4}
EXTRA_CONF=${EXTRA_CONF:-}
if [ -n "${QUICK:-}" ]; then
	SECS=5
	REPEATS=1
fi
DEFAULT_CONFIGS="before | outbox.notify_idle_interval=10ms | --claim-commit=sync
claim-async | outbox.notify_idle_interval=10ms |
idle-notify | |
ack-async | | --ack-commit=async"
CONFIGS=${CONFIGS:-$DEFAULT_CONFIGS}

outbox_bench_start bench-latency "$EXTRA_CONF" || exit 1
RELAY=$OUTBOX_RELAY_BINDIR/outbox-relay
[ -x "$RELAY" ] || RELAY=$ROOT/src/outbox-relay
RECEIVER=$ROOT/src/outbox-receiver
for f in "$RELAY" "$RECEIVER"; do
	[ -x "$f" ] || { echo "missing $f: run make" >&2; exit 1; }
done
gcc -O2 -Wall -o "$WORK/latency_producer" "$ROOT/bench/latency_producer.c" \
	-I"$("$PG_CONFIG" --includedir)" -L"$("$PG_CONFIG" --libdir)" -lpq -lm || exit 1

cleanup() {
	local f
	for f in "$WORK"/*.pid; do
		[ -f "$f" ] && kill -TERM "$(cat "$f")" 2>/dev/null
	done
	outbox_cleanup_work "$WORK"
}
trap cleanup EXIT
DSN="host=$DATA port=$PORT dbname=bench"

as_pg "'$PGBIN/createdb' -h '$DATA' -p $PORT bench"
psql_q "CREATE EXTENSION outbox;" || exit 1
[ -z "${SETUP_SQL:-}" ] || psql_q "$SETUP_SQL" >/dev/null || exit 1
PENDING_SQL=${PENDING_SQL:-"SELECT count(*) FROM outbox.commands WHERE status <> 'published'"}
outbox_give_to_pg_user "$WORK"

HPORT=$(outbox_free_port)
as_pg "'$RECEIVER' --port $HPORT --log '$WORK/arrivals.log' </dev/null >/dev/null 2>'$WORK/receiver.log' & echo \$! >'$WORK/receiver.pid'"
outbox_wait_port "$HPORT" || { echo "the receiver did not start" >&2; exit 1; }
URL="http://127.0.0.1:$HPORT/hook"

# One cell: prints "p50_total p99_total p50_from_answer p99_from_answer
# then p50/p99 of each step".
cell() {
	local name=$1 settings=$2 opts=$3 rate=$4 tag=$5 cell_sql=${6:-} pidf=$WORK/relay.pid left _ s sql conns
	sql="ALTER SYSTEM RESET ALL;"
	for s in $settings; do
		sql="$sql ALTER SYSTEM SET ${s%%=*} = '${s#*=}';"
	done
	psql_q "$sql" >/dev/null || exit 1
	psql_q "SELECT pg_reload_conf(); TRUNCATE outbox.commands, outbox.events, outbox.receipts;" >/dev/null
	[ -z "$cell_sql" ] || psql_q "$cell_sql" >/dev/null || exit 1
	as_pg "'$RELAY' --dsn '$DSN' --sink '$URL' --worker lat -vv $opts </dev/null >/dev/null 2>'$WORK/trace-$tag.log' & echo \$! >'$pidf'"
	for _ in $(seq 100); do
		[ "$(psql_q "SELECT count(*) FROM pg_stat_activity WHERE state = 'idle' AND query ~ 'outbox\.claim(_batch)?\('")" = 1 ] && break
		sleep 0.1
	done
	sleep 0.5	# the reload reached the worker
	as_pg "'$WORK/latency_producer' '$DSN' $rate $SECS $CONNS '$tag' '$WORK/commits-$tag.tsv'" 2>>"$WORK/producer.log" ||
		{ echo "the producer failed" >&2; cat "$WORK/producer.log" >&2; exit 1; }
	# HTTP keep-alive: the relay's connections to the receiver (one, reused)
	conns=$(awk -v p="$(printf '%04X' "$HPORT")" '$4 == "01" && $3 ~ (":" p "$") { n++ } END { print n + 0 }' /proc/net/tcp)
	for _ in $(seq 200); do
		left=$(psql_q "$PENDING_SQL")
		[ "$left" = 0 ] && break
		sleep 0.1
	done
	[ "$left" = 0 ] || echo "warning: $tag left $left commands unpublished" >&2
	kill -TERM "$(cat "$pidf")"
	while kill -0 "$(cat "$pidf")" 2>/dev/null; do sleep 0.1; done
	rm -f "$pidf"
	if [ -n "${KEEP_TRACES:-}" ]; then
		mkdir -p "$KEEP_TRACES" && cp "$WORK/commits-$tag.tsv" "$WORK/trace-$tag.log" "$KEEP_TRACES/"
	fi
	echo "$(perl "$ROOT/bench/latency_steps.pl" "$tag" "$WORK/commits-$tag.tsv" "$WORK/arrivals.log" "$WORK/trace-$tag.log") $conns"
}

declare -A R SETTINGS OPTS CELL_SQL
declare -a v
names=()
while IFS='|' read -r name settings opts cell_sql; do
	name=$(echo "$name" | xargs)
	[ -n "$name" ] || continue
	names+=("$name")
	SETTINGS[$name]=$(echo "$settings" | xargs)
	OPTS[$name]=$(echo "$opts" | xargs)
	CELL_SQL[$name]=${cell_sql:-}
done <<<"$CONFIGS"

STEPS="total from_answer commit wait notify claim http ack"
for rate in $RATES; do
	for rep in $(seq "$REPEATS"); do
		for name in "${names[@]}"; do
			R[$rate,$name,$rep]=$(cell "$name" "${SETTINGS[$name]}" "${OPTS[$name]}" "$rate" "lat$rate-$name-$rep" "${CELL_SQL[$name]}")
		done
	done
	echo
	echo "$rate commands/s, ${SECS}s per cell, median of $REPEATS (ms, p50 / p99):"
	printf '%-13s' "config"
	for s in $STEPS; do printf '%16s' "$s"; done
	printf '%8s%7s\n' "n" "conns"
	for name in "${names[@]}"; do
		printf '%-13s' "$name"
		for col in $(seq 1 $(( $(echo $STEPS | wc -w) * 2 + 2 ))); do
			v[$col]=$(for rep in $(seq "$REPEATS"); do echo "${R[$rate,$name,$rep]}" | awk -v c="$col" '{ print $c }'; done | median)
		done
		for i in $(seq 1 $(echo $STEPS | wc -w)); do
			printf '%16s' "${v[$((2 * i - 1))]} / ${v[$((2 * i))]}"
		done
		printf '%8s%7s\n' "${v[$(( $(echo $STEPS | wc -w) * 2 + 1 ))]}" "${v[$(( $(echo $STEPS | wc -w) * 2 + 2 ))]}"
	done
done
