#!/usr/bin/env bash
# outbox-relay throughput of this build against the 0.1.0 release, in the
# same run: two throwaway clusters up at once, one with 0.1.0's extension
# and relay, one with this build's.  Not a test: it prints numbers.
#
#   OLD_PG_CONFIG=/path/to/0.1.0/pg_config bash bench/versus.sh
#   QUICK=1 OLD_PG_CONFIG=... bash bench/versus.sh   # one repeat, smaller N
#
# 0.1.0 is commit 38cd9ad; build and install it into a PostgreSQL of its
# own (a second relocated copy of Debian's, say), for example:
#   git worktree add /tmp/outbox-010 38cd9ad
#   make -C /tmp/outbox-010 PG_CONFIG=$OLD_PG_CONFIG RELAY_PREFIX=DIR install
# and point OLD_RELAY at DIR/bin/outbox-relay when it is not under the old
# copy's usr/local/bin.
#
# For each batch size B (BATCHES, "1 10 100") and each number of publishers
# (PUBLISHERS, "1 4"), N_B committed commands (N_1, N_10, N_100: 2,000,
# 8,000, 20,000; the same run ids, seqs, kinds and payloads in both, loaded
# set-based through each version's own commit_decisions) are drained by
# that many `outbox-relay --sink stdout --drain --batch B` (to /dev/null)
# of the version; commands per second from the start of the relays to the
# exit of the last one.  Within each of REPEATS repeats (default 3) the two
# versions take turns, 0.1.0 first in odd repeats and this build first in
# even ones; the medians and their ratio (this build / 0.1.0) are printed.
#
# The producer (ONLY=producer, or both parts when ONLY is unset): pgbench
# -M prepared, synchronous commit on, the workers running, PRODUCE_CLIENTS
# ("1 4") clients for PRODUCE_SECS seconds (8; 4 with QUICK) of bench/
# produce.sh's single decision,
#   BEGIN; INSERT INTO biz ... RETURNING id;
#   SELECT outbox.commit_decision('run-' || :id, 1, 'trip_requested',
#          'cmd-' || :id, 'lock_budget', '{"amount": 900, "to": "budget"}');
#   COMMIT;
# (the same call in both versions: their first six parameters agree) against
# each version's cluster, the tables emptied and a checkpoint taken before
# each run, the versions taking turns within each repeat as above; the
# medians, their ratio, and the median and range of the ratios of the two
# runs of one repeat ("paired") are printed; then the WAL bytes per
# transaction (pg_current_wal_insert_lsn() around each run) and the
# server's CPU time per transaction (user and system time of the
# postmaster and all its processes, those that ended included, from /proc;
# pgbench's own is not counted), with their ratio likewise.  The
# machine's load moves the rates more than a version does;
# bench/produce-instructions.sh with OLD_PG_CONFIG counts instructions per
# transaction, which repeat.
#
# Settings: OLD_PG_CONFIG (required), OLD_RELAY (default the old copy's
# usr/local/bin/outbox-relay), PG_CONFIG and NEW_RELAY (this build; default
# where make install puts it), ONLY (relay or producer), BATCHES,
# PUBLISHERS, REPEATS, N_1, N_10, N_100 (N_B for any other B, default
# 20,000), PRODUCE_CLIENTS, PRODUCE_SECS, EXTRA_CONF (lines appended to
# both postgresql.conf), OUTBOX_SKIP_BUILD (do not build and install this
# build first).
set -u
set -o pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
. "$ROOT/test/lib.sh"
. "$ROOT/bench/lib.sh"

BATCHES=${BATCHES:-"1 10 100"}
PUBLISHERS=${PUBLISHERS:-"1 4"}
REPEATS=${REPEATS:-3}
N_1=${N_1:-2000}
N_10=${N_10:-8000}
N_100=${N_100:-20000}
EXTRA_CONF=${EXTRA_CONF:-}
ONLY=${ONLY:-}
PRODUCE_CLIENTS=${PRODUCE_CLIENTS:-"1 4"}
PRODUCE_SECS=${PRODUCE_SECS:-8}
if [ -n "${QUICK:-}" ]; then
	N_1=1000
	N_10=4000
	N_100=10000
	REPEATS=1
	PRODUCE_SECS=4
fi

[ -n "${OLD_PG_CONFIG:-}" ] && [ -x "$OLD_PG_CONFIG" ] ||
	{ echo "OLD_PG_CONFIG must name the pg_config 0.1.0 is installed for" >&2; exit 1; }
if [ -z "${OUTBOX_SKIP_BUILD:-}" ]; then
	outbox_setup || exit 1
fi

# Each version's PostgreSQL programs and relay.
declare -A BIN RELAYS
BIN[new]=$PGBIN
RELAYS[new]=${NEW_RELAY:-$OUTBOX_RELAY_BINDIR/outbox-relay}
BIN[old]=$("$OLD_PG_CONFIG" --bindir)
old_root=
case "${BIN[old]}" in
	?*/usr/lib/postgresql/*) old_root=${BIN[old]%%/usr/lib/postgresql/*} ;;
esac
RELAYS[old]=${OLD_RELAY:-$old_root/usr/local/bin/outbox-relay}
for v in old new; do
	[ "$ONLY" = producer ] || [ -x "${RELAYS[$v]}" ] ||
		{ echo "missing outbox-relay ${RELAYS[$v]}" >&2; exit 1; }
done
declare -A NAME=([old]=0.1.0 [new]=this)

WORK=$(mktemp -d /tmp/outbox-bench-versus.XXXXXX)
outbox_give_to_pg_user "$WORK"
declare -A DATAS PORTS

# Relays, then both clusters, each stopped by its own pid (the relays write
# theirs before they exec; pg_ctl signals the postmaster of its data dir).
cleanup() {
	local f v
	for f in "$WORK"/*.pid; do
		[ -f "$f" ] && kill -TERM "$(cat "$f")" 2>/dev/null
	done
	for v in old new; do
		[ -f "${DATAS[$v]:-/nonexistent}/postmaster.pid" ] &&
			as_pg "'${BIN[$v]}/pg_ctl' -D '${DATAS[$v]}' -m fast -w stop" >/dev/null 2>&1
	done
	outbox_cleanup_work "$WORK"
}
trap cleanup EXIT
trap 'exit 1' INT TERM

# Point PGBIN, DATA and PORT (psql_q's) at version $1.
use() {
	PGBIN=${BIN[$1]}
	DATA=${DATAS[$1]}
	PORT=${PORTS[$1]}
}

for v in old new; do
	DATAS[$v]=$WORK/data-$v
	PORTS[$v]=$(outbox_free_port)
	use "$v"
	outbox_start_cluster "$DATA" "$PORT" "shared_buffers = 256MB
max_connections = 50
checkpoint_timeout = 30min
max_wal_size = 4GB
$EXTRA_CONF" || { cat "$DATA/server.log" 2>/dev/null; exit 1; }
	as_pg "'$PGBIN/createdb' -h '$DATA' -p $PORT bench" || exit 1
	psql_q "CREATE EXTENSION outbox;
CREATE TABLE biz (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, customer text NOT NULL, amount int NOT NULL);" || exit 1
done
use old
ver=$(psql_q "SELECT extversion FROM pg_extension WHERE extname = 'outbox'")
[ "$ver" = 0.1.0 ] || { echo "the old cluster's outbox is $ver, not 0.1.0" >&2; exit 1; }
use new
NAME[new]=$(psql_q "SELECT extversion FROM pg_extension WHERE extname = 'outbox'")

# Commit $2 decisions in version $1's cluster: run ids cmd-run-(g / 100),
# seqs g, kind k, payload {"n": g, "to": ...}, 5,000 per call, through
# 0.1.0's arrays or this build's JSON array; then tidy the table.
load() {
	local v=$1 n=$2
	use "$v"
	psql_q "TRUNCATE outbox.commands, outbox.events, outbox.receipts;" || return 1
	if [ "$v" = old ]; then
		psql_q "SELECT sum(outbox.commit_decisions(r, s, e, c, k, p))
  FROM (SELECT array_agg('cmd-run-' || (g / 100)) AS r, array_agg(g::bigint) AS s,
               array_agg('decided'::text) AS e, array_agg('cmd-' || g) AS c, array_agg('k'::text) AS k,
               array_agg(jsonb_build_object('n', g, 'to', 'someone@example.org')) AS p
          FROM generate_series(1, $n) g GROUP BY g / 5000) b;" >/dev/null || return 1
	else
		bench_commit_commands "$n" || return 1
	fi
	psql_q "VACUUM ANALYZE outbox.commands;" >/dev/null
}

# One run of version $1: $2 publishers at batch $3 drain $4 commands;
# prints commands per second.
run() {
	local v=$1 k=$2 b=$3 n=$4 i start end left pids=() p
	load "$v" "$n" || { echo "loading the commands failed ($v)" >&2; exit 1; }
	use "$v"
	start=$(date +%s.%N)
	for i in $(seq "$k"); do
		as_pg "echo \$\$ >'$WORK/relay-$i.pid'; exec '${RELAYS[$v]}' --dsn 'host=$DATA port=$PORT dbname=bench' --sink stdout --batch $b --drain --worker bench-$i >/dev/null 2>>'$WORK/relay-$v.log'" &
		pids+=($!)
	done
	for p in "${pids[@]}"; do
		wait "$p" || { echo "an outbox-relay of ${NAME[$v]} failed:" >&2; tail -5 "$WORK/relay-$v.log" >&2; exit 1; }
	done
	end=$(date +%s.%N)
	rm -f "$WORK"/relay-*.pid
	left=$(psql_q "SELECT count(*) FROM outbox.commands WHERE status <> 'published'")
	[ "$left" = 0 ] || echo "warning: ${NAME[$v]} x$k at B = $b left $left commands unpublished" >&2
	awk -v n="$n" -v s="$start" -v e="$end" 'BEGIN { printf "%.0f\n", n / (e - s) }'
}

# The producer's transaction (bench/produce.sh's single decision).
bench_decision_script "$WORK/produce.sql"
outbox_give_to_pg_user "$WORK"
TICK_US=$(awk -v t="$(getconf CLK_TCK)" 'BEGIN { print 1000000 / t }')

# One pgbench run of version $1 with $2 clients: prints transactions per
# second, and appends the WAL bytes and the server's CPU microseconds per
# transaction to $WORK/$1.wal and $WORK/$1.cpu.
produce() {
	local v=$1 c=$2 l t0 t1
	use "$v"
	psql_q "TRUNCATE biz, outbox.events, outbox.commands;
VACUUM ANALYZE biz, outbox.events, outbox.commands;
CHECKPOINT;" >/dev/null || return 1
	l=$(psql_q "SELECT pg_current_wal_insert_lsn()") || return 1
	# (a backend that is still exiting is in neither count: let it end)
	sleep 1
	t0=$(bench_server_ticks "$DATA")
	as_pg "cd '$WORK' && '$PGBIN/pgbench' -n -M prepared -h '$DATA' -p $PORT -c $c -j $c \
		-T $PRODUCE_SECS -f '$WORK/produce.sql' bench" 2>&1 | awk '/^tps = / {printf "%.0f\n", $3; exit}'
	sleep 1
	t1=$(bench_server_ticks "$DATA")
	psql_q "SELECT round(pg_wal_lsn_diff(pg_current_wal_insert_lsn(), '$l') / greatest(count(*), 1)),
       round(($t1 - $t0) * $TICK_US / greatest(count(*), 1), 1) FROM biz" |
		awk -F'|' -v w="$WORK/$v.wal" -v u="$WORK/$v.cpu" '{ print $1 >>w; print $2 >>u }'
}

if [ -z "$ONLY" ] || [ "$ONLY" = producer ]; then
	echo "producer: BEGIN; INSERT; SELECT outbox.commit_decision(...); COMMIT, pgbench -M prepared, ${PRODUCE_SECS}s runs, ${NAME[new]} against 0.1.0, median of $REPEATS (tx/s)"
	printf '%8s %10s %10s %7s %7s %13s\n' clients 0.1.0 "${NAME[new]}" ratio paired "paired range"
	for c in $PRODUCE_CLIENTS; do
		: >"$WORK/old.txt"
		: >"$WORK/new.txt"
		: >"$WORK/pair.txt"
		for f in old.wal new.wal old.cpu new.cpu cpair.txt; do
			: >"$WORK/$f"
		done
		for r in $(seq "$REPEATS"); do
			if ((r % 2)); then order="old new"; else order="new old"; fi
			for v in $order; do
				t=$(produce "$v" "$c")
				[ -n "$t" ] || { echo "pgbench failed against ${NAME[$v]}" >&2; exit 1; }
				echo "$t" >"$WORK/$v.last"
				echo "$t" >>"$WORK/$v.txt"
			done
			awk -v a="$(cat "$WORK/new.last")" -v c="$(cat "$WORK/old.last")" \
				'BEGIN { printf "%.3f\n", a / c }' >>"$WORK/pair.txt"
			paste "$WORK/old.cpu" "$WORK/new.cpu" | tail -1 |
				awk '{ printf "%.3f\n", $2 / $1 }' >>"$WORK/cpair.txt"
		done
		o=$(median <"$WORK/old.txt")
		w=$(median <"$WORK/new.txt")
		printf '%8s %10s %10s %7s %7s %13s   (0.1.0: %s; %s: %s)\n' "$c" "$o" "$w" \
			"$(awk -v a="$w" -v c="$o" 'BEGIN { printf "%.2f", a / c }')" \
			"$(median <"$WORK/pair.txt")" "$(sort -g "$WORK/pair.txt" | sed -n '1p;$p' | paste -sd-)" \
			"$(paste -sd' ' "$WORK/old.txt")" "${NAME[new]}" "$(paste -sd' ' "$WORK/new.txt")"
		printf '%8s %10s %10s   WAL bytes per transaction, median\n' "" "$(median <"$WORK/old.wal")" \
			"$(median <"$WORK/new.wal")"
		printf '%8s %10s %10s %7s %7s %13s   server CPU us per transaction (0.1.0: %s; %s: %s)\n' "" \
			"$(median <"$WORK/old.cpu")" "$(median <"$WORK/new.cpu")" \
			"$(awk -v a="$(median <"$WORK/new.cpu")" -v c="$(median <"$WORK/old.cpu")" 'BEGIN { printf "%.2f", a / c }')" \
			"$(median <"$WORK/cpair.txt")" "$(sort -g "$WORK/cpair.txt" | sed -n '1p;$p' | paste -sd-)" \
			"$(paste -sd' ' "$WORK/old.cpu")" "${NAME[new]}" "$(paste -sd' ' "$WORK/new.cpu")"
	done
fi

if [ -z "$ONLY" ] || [ "$ONLY" = relay ]; then
	echo "outbox-relay --sink stdout --drain, ${NAME[new]} against 0.1.0, median of $REPEATS (commands/s, relays' start to exit)"
	printf '%6s %10s %8s %10s %10s %7s\n' B publishers N 0.1.0 "${NAME[new]}" ratio
	for b in $BATCHES; do
		nv=N_$b
		n=${!nv:-20000}
		for k in $PUBLISHERS; do
			: >"$WORK/old.txt"
			: >"$WORK/new.txt"
			for r in $(seq "$REPEATS"); do
				if ((r % 2)); then order="old new"; else order="new old"; fi
				for v in $order; do
					run "$v" "$k" "$b" "$n" >>"$WORK/$v.txt" || exit 1
				done
			done
			o=$(median <"$WORK/old.txt")
			w=$(median <"$WORK/new.txt")
			printf '%6s %10s %8s %10s %10s %7s   (0.1.0: %s; %s: %s)\n' "$b" "$k" "$n" "$o" "$w" \
				"$(awk -v a="$w" -v c="$o" 'BEGIN { printf "%.2f", a / c }')" \
				"$(paste -sd' ' "$WORK/old.txt")" "${NAME[new]}" "$(paste -sd' ' "$WORK/new.txt")"
		done
	done
fi
