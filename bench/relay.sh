#!/usr/bin/env bash
# End-to-end throughput and latency of outbox-relay, side by side with a
# plain-SQL loop doing the same claim/ack work, in the same run, on a
# throwaway cluster.  Not a test: it prints numbers.
#
#   bash bench/relay.sh             # full run (a few minutes on 2 cores)
#   QUICK=1 bash bench/relay.sh     # one repeat, smaller sizes
#
# Throughput: N committed commands (outbox.commit_decisions) are drained by
# 1, 2 and 4 concurrent publishers, batch B; commands per second from the
# start of the publishers to the last ack (max(published_at)), median of
# REPEATS runs:
#   relay/stdout   outbox-relay --sink stdout (to /dev/null)
#   relay/http     outbox-relay --sink http://... to outbox-receiver, which
#                  answers 200 at once (no database work of its own), one
#                  request at a time
#   relay/http-cC  the same with --concurrency C (HTTP_CONCURRENCY, 8)
#   sql-loop       pgbench clients looping "claim B; ack the batch" in SQL:
#                  the database work alone, without any delivery
# Remote endpoint: one relay, REMOTE_N commands to a receiver that takes
# REMOTE_MS per request, at --concurrency 1, 8 and 32.
# Latency: one relay LISTENing (stdout sink); producers commit one decision
# per transaction at LAT_RATE per second for LAT_SECS seconds; commit-to-ack
# latency (published_at - created_at) p50 and p99.
#
# Settings: N, B, REPEATS, PUBLISHERS ("1 2 4"), SYSTEMS (the throughput
# rows, default all four), ONLY=throughput (skip the remote endpoint and the
# latency), HTTP_CONCURRENCY, REMOTE_N, REMOTE_MS, LAT_RATE, LAT_SECS, and
# EXTRA_CONF (lines appended to postgresql.conf).
set -u
set -o pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
. "$ROOT/test/lib.sh"
. "$ROOT/bench/lib.sh"

N=${N:-20000}
B=${B:-100}
REPEATS=${REPEATS:-3}
PUBLISHERS=${PUBLISHERS:-"1 2 4"}
LAT_RATE=${LAT_RATE:-200}
LAT_SECS=${LAT_SECS:-10}
HTTP_CONCURRENCY=${HTTP_CONCURRENCY:-8}
REMOTE_N=${REMOTE_N:-1000}
REMOTE_MS=${REMOTE_MS:-20}
EXTRA_CONF=${EXTRA_CONF:-}
if [ -n "${QUICK:-}" ]; then
	N=5000
	REMOTE_N=300
	REPEATS=1
	LAT_SECS=5
fi

outbox_bench_start bench-relay "$EXTRA_CONF" || exit 1
RELAY=$OUTBOX_RELAY_BINDIR/outbox-relay
[ -x "$RELAY" ] || RELAY=$ROOT/src/outbox-relay
RECEIVER=$ROOT/src/outbox-receiver
for f in "$RELAY" "$RECEIVER"; do
	[ -x "$f" ] || { echo "missing $f: run make" >&2; exit 1; }
done

# Background processes run as the postgres user; their pids are kept in
# files so that they can be signalled directly.
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
psql_q "CREATE EXTENSION outbox; CREATE SEQUENCE lat_seq;" || exit 1

# The plain-SQL loop: claim a batch, then ack it (two transactions, as the
# relay does), one pgbench "transaction" per batch.
cat >"$WORK/loop.sql" <<'EOF'
SELECT coalesce(array_agg(token), '{}') AS toks FROM outbox.claim('sql-:client_id', :batch) \gset
SELECT count(*) FILTER (WHERE acked) AS acked FROM outbox.ack_many('sql-:client_id', ':toks') \gset
EOF
cat >"$WORK/produce.sql" <<'EOF'
SELECT outbox.commit_decision('lat', s, 'decided', 'lat-' || s, 'k', '{"to": "someone@example.org"}') FROM nextval('lat_seq') s;
EOF
outbox_give_to_pg_user "$WORK"

# The HTTP endpoint: answers 200 to every POST.
HPORT=$(outbox_free_port)
as_pg "'$RECEIVER' --port $HPORT </dev/null >/dev/null 2>'$WORK/receiver.log' & echo \$! >'$WORK/receiver.pid'"
outbox_wait_port "$HPORT"
URL="http://127.0.0.1:$HPORT/hook"
# A slower one, standing for a remote endpoint.
SPORT=$(outbox_free_port)
as_pg "'$RECEIVER' --port $SPORT --delay-ms $REMOTE_MS </dev/null >/dev/null 2>'$WORK/receiver-slow.log' & echo \$! >'$WORK/receiver-slow.pid'"
outbox_wait_port "$SPORT"
SLOW_URL="http://127.0.0.1:$SPORT/hook"

# Commit N decisions (set-based, 5,000 per call), then tidy the table.
load() {
	psql_q "TRUNCATE outbox.commands, outbox.events, outbox.receipts;" &&
		bench_commit_commands "$N" &&
		psql_q "VACUUM ANALYZE outbox.commands;" >/dev/null
}

# One throughput run: prints commands per second.
run() {
	local system=$1 k=$2 start end left i t
	load || { echo "loading the commands failed" >&2; exit 1; }
	start=$(psql_q "SELECT extract(epoch FROM clock_timestamp())")
	case $system in
		relay/*)
			local sink=stdout c=1
			case $system in
				relay/http) sink=$URL ;;
				relay/http-c*) sink=$URL c=${system#relay/http-c} ;;
				relay/remote-c*) sink=$SLOW_URL c=${system#relay/remote-c} ;;
			esac
			for i in $(seq "$k"); do
				as_pg "'$RELAY' --dsn '$DSN' --sink '$sink' --batch $B --concurrency $c --drain --worker bench-$i >/dev/null 2>>'$WORK/relay.log'" &
			done
			wait	# run() is called in a subshell: only its own relays
			;;
		sql-loop)
			t=$(((N + B * k - 1) / (B * k) * 2 + 2))
			as_pg "'$PGBIN/pgbench' -n -h '$DATA' -p $PORT -c $k -j $k -t $t -D batch=$B -f '$WORK/loop.sql' bench" >"$WORK/pgbench.log" 2>&1
			;;
	esac
	end=$(psql_q "SELECT extract(epoch FROM max(published_at)) FROM outbox.commands")
	left=$(psql_q "SELECT count(*) FROM outbox.commands WHERE status <> 'published'")
	if [ "$left" != 0 ]; then
		echo "warning: $system x$k left $left commands unpublished" >&2
	fi
	awk -v n="$N" -v s="$start" -v e="$end" 'BEGIN { printf "%.0f\n", n / (e - s) }'
}

echo "outbox-relay throughput: $N commands, batch $B, median of $REPEATS (commands/s, commit to ack)"
printf '%-14s' "publishers"
for k in $PUBLISHERS; do printf '%10s' "$k"; done
echo
declare -A RESULT
SYSTEMS=${SYSTEMS:-"sql-loop relay/stdout relay/http relay/http-c$HTTP_CONCURRENCY"}
for system in $SYSTEMS; do
	printf '%-14s' "$system"
	for k in $PUBLISHERS; do
		r=$(for _ in $(seq "$REPEATS"); do run "$system" "$k"; done | median)
		RESULT[$system,$k]=$r
		printf '%10s' "$r"
	done
	echo
done
for system in $SYSTEMS; do
	[ "$system" = sql-loop ] && continue
	[ -n "${RESULT[sql-loop,${PUBLISHERS%% *}]:-}" ] || continue
	printf '%-14s' "${system#relay/} / sql"
	for k in $PUBLISHERS; do
		awk -v a="${RESULT[$system,$k]}" -v b="${RESULT[sql-loop,$k]}" 'BEGIN { printf "%10.2f", a / b }'
	done
	echo
done

[ "${ONLY:-}" = throughput ] && exit 0

echo
echo "remote endpoint ($REMOTE_MS ms per request), 1 relay, $REMOTE_N commands (commands/s):"
SAVED_N=$N
N=$REMOTE_N
for c in 1 8 32; do
	printf '  --concurrency %-4s %8s\n' "$c" "$(run relay/remote-c$c 1)"
done
N=$SAVED_N

# Latency, with the relay LISTENing for the background worker's wake-ups.
psql_q "TRUNCATE outbox.commands, outbox.events, outbox.receipts;" >/dev/null
as_pg "'$RELAY' --dsn '$DSN' --sink stdout --batch $B --worker bench-lat </dev/null >/dev/null 2>'$WORK/relay-lat.log' & echo \$! >'$WORK/relay-lat.pid'"
for _ in $(seq 100); do
	[ "$(psql_q "SELECT count(*) FROM pg_stat_activity WHERE state = 'idle' AND query LIKE '%outbox.claim(%'")" = 1 ] && break
	sleep 0.1
done
as_pg "'$PGBIN/pgbench' -n -h '$DATA' -p $PORT -c 2 -j 2 -R $LAT_RATE -T $LAT_SECS -f '$WORK/produce.sql' bench" >"$WORK/pgbench-lat.log" 2>&1
for _ in $(seq 100); do
	[ "$(psql_q "SELECT count(*) FROM outbox.commands WHERE status <> 'published'")" = 0 ] && break
	sleep 0.1
done
LAT_PID=$(cat "$WORK/relay-lat.pid")
kill -TERM "$LAT_PID"
while kill -0 "$LAT_PID" 2>/dev/null; do sleep 0.1; done
rm -f "$WORK/relay-lat.pid"
echo
echo "commit-to-ack latency, 1 relay LISTENing, $LAT_RATE commits/s for ${LAT_SECS}s:"
psql_q "SELECT format('  %s commands: p50 %s ms, p99 %s ms, max %s ms', count(*),
       round((percentile_cont(0.5) WITHIN GROUP (ORDER BY ms))::numeric, 1),
       round((percentile_cont(0.99) WITHIN GROUP (ORDER BY ms))::numeric, 1),
       round(max(ms)::numeric, 1))
  FROM (SELECT extract(epoch FROM published_at - created_at) * 1000 AS ms
          FROM outbox.commands WHERE status = 'published') s"
echo "  relay: $(grep -o 'summary: .*' "$WORK/relay-lat.log" | sed -e 's/worker=[^ ]* //')"
