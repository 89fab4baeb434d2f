#!/usr/bin/env bash
# Benchmark of the background worker's wake-ups (not a test; run by hand).
#
#   bash bench/wakeup.sh [--commits N] [--seconds S] [--clients C] [--repeats R]
#
# On a private cluster (initdb in a temporary directory, outbox preloaded,
# shared_buffers 256MB) it measures:
#   1. wake-up latency: from a producer's COMMIT to a LISTENing publisher
#      receiving the notification (and having claimed the command), p50 /
#      p90 / p99 over N commits (default 1000), against a publisher that
#      polls every 100 ms;
#   2. producer throughput (pgbench, C clients, S seconds, -M prepared, one
#      commit_decision per transaction) with the worker running and with it
#      stopped (outbox.databases naming another database), alternated R
#      times (defaults 8, 10, 5); the median of each, their ratio, and the
#      median of the R ratios of adjacent runs (less sensitive to drift on
#      a shared machine).  Measured with the default outbox.notify_interval
#      and with 0 (a notification per wake-up).  Also the CPU time of the
#      worker as a share of the CPU time of the producers' backends, which
#      a shared machine disturbs far less than throughput.
# WAKEUP_CONF adds lines to postgresql.conf (e.g. "outbox.index_bloat = 0").
# Run as root it re-runs itself as the postgres OS user.  Needs pg_config,
# gcc and the libpq headers, and outbox installed (make install).
set -euo pipefail

COMMITS=1000
SECONDS_PER_RUN=10
CLIENTS=8
REPEATS=5
while [ $# -gt 0 ]; do
	case "$1" in
		--commits) COMMITS=$2; shift 2 ;;
		--seconds) SECONDS_PER_RUN=$2; shift 2 ;;
		--clients) CLIENTS=$2; shift 2 ;;
		--repeats) REPEATS=$2; shift 2 ;;
		*) echo "unknown option $1" >&2; exit 2 ;;
	esac
done

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
PG_CONFIG=${PG_CONFIG:-pg_config}
BIN=$("$PG_CONFIG" --bindir)

if [ "$(id -u)" = 0 ]; then
	exec su postgres -s /bin/bash -c "WAKEUP_CONF='${WAKEUP_CONF:-}' bash '$HERE/wakeup.sh' --commits $COMMITS --seconds $SECONDS_PER_RUN --clients $CLIENTS --repeats $REPEATS"
fi

WORK=$(mktemp -d /tmp/outbox-wakeup.XXXXXX)
PORT=${PORT:-55499}
DATA=$WORK/data
cleanup() {
	"$BIN/pg_ctl" -D "$DATA" -m immediate stop >/dev/null 2>&1 || true
	rm -rf "$WORK"
}
trap cleanup EXIT

gcc -O2 -Wall -o "$WORK/wakeup_latency" "$HERE/wakeup_latency.c" \
	-I"$("$PG_CONFIG" --includedir)" -L"$("$PG_CONFIG" --libdir)" -lpq

"$BIN/initdb" -D "$DATA" -A trust >/dev/null
cat >>"$DATA/postgresql.conf" <<EOF
port = $PORT
listen_addresses = ''
unix_socket_directories = '$WORK'
shared_preload_libraries = 'outbox'
shared_buffers = 256MB
max_connections = 50
${WAKEUP_CONF:-}
EOF
"$BIN/pg_ctl" -D "$DATA" -l "$WORK/log" -w start >/dev/null
PSQL=("$BIN/psql" -X -q -At -h "$WORK" -p "$PORT" -v ON_ERROR_STOP=1)
"${PSQL[@]}" -d postgres -c 'CREATE DATABASE bench'
"${PSQL[@]}" -d bench -c 'CREATE EXTENSION outbox'

psql_bench() { "${PSQL[@]}" -d bench -c "$@"; }

# Wait (up to a minute) until the number of workers serving bench is $1.
wait_workers() {
	local i
	for i in $(seq 1 600); do
		[ "$(psql_bench "SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'outbox worker' AND datname = 'bench'")" = "$1" ] && return 0
		sleep 0.1
	done
	echo "worker count never reached $1" >&2
	exit 1
}
worker_on() {
	psql_bench "ALTER SYSTEM RESET outbox.databases" -c "SELECT pg_reload_conf()" >/dev/null
	wait_workers 1
}
worker_off() {
	psql_bench "ALTER SYSTEM SET outbox.databases = 'postgres'" -c "SELECT pg_reload_conf()" >/dev/null
	wait_workers 0
}
notify_interval() {
	psql_bench "ALTER SYSTEM SET outbox.notify_interval = '$1'" -c "SELECT pg_reload_conf()" >/dev/null
}

echo "== machine: $(nproc) CPUs, PostgreSQL $("$PG_CONFIG" --version | awk '{print $2}')"
wait_workers 1

echo "== wake-up latency over $COMMITS commits (producer COMMIT -> publisher)"
"$WORK/wakeup_latency" "host=$WORK port=$PORT dbname=bench" listen "$COMMITS"
"$WORK/wakeup_latency" "host=$WORK port=$PORT dbname=bench" poll "$COMMITS" 100
psql_bench "SELECT 'worker notifications sent: ' || wakeups FROM outbox.stats"

cat >"$WORK/produce.sql" <<'EOF'
\set n :n + 1
SELECT outbox.commit_decision(format('p%s-%s', :run::bigint, :client_id::int), :n::bigint, 'e', format('p%s-%s-%s', :run::bigint, :client_id::int, :n::bigint), 'bench_produce', '{}');
EOF

# One pgbench run; prints its tps.  The tables are emptied first so every
# run starts alike.
produce() {
	psql_bench "TRUNCATE outbox.events, outbox.commands" >/dev/null
	psql_bench "CHECKPOINT" >/dev/null
	"$BIN/pgbench" -h "$WORK" -p "$PORT" -n -M prepared -c "$CLIENTS" -j 2 \
		-T "$SECONDS_PER_RUN" -D n=0 -D run=$RANDOM -f "$WORK/produce.sql" bench 2>/dev/null |
		awk '/^tps/ {printf "%.0f\n", $3; exit}'
}
# CPU time (clock ticks) of a process, and of the children the postmaster
# has reaped (the pgbench backends, once they have exited).
ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
child_ticks() { awk '{print $16 + $17}' "/proc/$1/stat"; }
PM_PID=$(head -1 "$DATA/postmaster.pid")

# A run with the worker on; also adds up the worker's CPU time and that of
# the producers' backends.
measure_on() {
	local w w0 w1 b0 b1 tps
	w=$(psql_bench "SELECT pid FROM outbox.workers WHERE database = 'bench'")
	w0=$(ticks "$w")
	b0=$(child_ticks "$PM_PID")
	tps=$(produce)
	w1=$(ticks "$w")
	b1=$(child_ticks "$PM_PID")
	ON+=("$tps")
	WCPU=$((WCPU + w1 - w0))
	BCPU=$((BCPU + b1 - b0))
}

median() { printf '%s\n' "$@" | sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }

for interval in default 0; do
	if [ "$interval" = default ]; then
		psql_bench "ALTER SYSTEM RESET outbox.notify_interval" -c "SELECT pg_reload_conf()" >/dev/null
	else
		notify_interval "$interval"
	fi
	ON=()
	OFF=()
	psql_bench "SELECT outbox.stats_reset()" >/dev/null
	WCPU=0
	BCPU=0
	for r in $(seq 1 "$REPEATS"); do
		# Alternate the order, so that neither setting always runs first.
		if [ $((r % 2)) = 1 ]; then
			worker_on
			measure_on
			worker_off
			OFF+=("$(produce)")
		else
			worker_off
			OFF+=("$(produce)")
			worker_on
			measure_on
		fi
	done
	worker_on
	mon=$(median "${ON[@]}")
	moff=$(median "${OFF[@]}")
	PAIRS=()
	for i in "${!ON[@]}"; do
		PAIRS+=("$(awk -v a="${ON[$i]}" -v b="${OFF[$i]}" 'BEGIN {printf "%.3f", a / b}')")
	done
	echo "== producer throughput, notify_interval=$interval, $CLIENTS clients x ${SECONDS_PER_RUN}s, $REPEATS runs each"
	echo "   worker running: ${ON[*]} tps (median $mon)"
	echo "   worker stopped: ${OFF[*]} tps (median $moff)"
	echo "   ratio of the medians running/stopped: $(awk -v a="$mon" -v b="$moff" 'BEGIN {printf "%.3f", a / b}')"
	echo "   ratios of adjacent runs: ${PAIRS[*]} (median $(median "${PAIRS[@]}"))"
	echo "   worker CPU while running: $WCPU ticks, $(awk -v w="$WCPU" -v b="$BCPU" 'BEGIN {printf "%.2f", 100 * w / b}')% of the producers' backend CPU ($BCPU ticks)"
	psql_bench "SELECT '   commands enqueued: ' || enqueued || ', notifications sent: ' || wakeups FROM outbox.stats"
done
