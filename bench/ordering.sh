#!/usr/bin/env bash
# The cost of ordered delivery per key (commit_decision's ordering_key),
# each figure against a same-run baseline without it, on a throwaway
# cluster.  Not a test: it prints numbers and asserts nothing.
#
#   bash bench/ordering.sh            # full run
#   QUICK=1 bash bench/ordering.sh    # one repeat, smaller sizes
#
# 1. Throughput: KEYS keys x PER_KEY commands (one run per key), drained by
#    PUBLISHERS outbox-relay processes (stdout sink to /dev/null, batch B,
#    --drain), against the same backlog decided without keys; commands per
#    second from the start of the relays to the last ack, median of
#    REPEATS, and the ratio ordered / unordered.
# The backlogs are decided in LAYOUT (see load below), the claim latency's
# in each of LAT_LAYOUTS.
# 2. Claim latency: HEADS keys with WAITING commands behind each head,
#    against the HEADS heads alone (HEADS commands in total); PUBLISHERS
#    pgbench clients run "BEGIN; claim B; ROLLBACK" for LAT_SECS seconds
#    (the rollback keeps the backlog as it is); p50 and p99 of the claim
#    transaction, and the ratio of the p50s.  Then a control without keys:
#    HEADS pending commands spread over the same table as the key-major
#    heads, the other rows published.
# 3. A hot key: HOT commands all on one key, PUBLISHERS pgbench clients
#    looping "claim B; ack the batch" (at most one command is claimable at
#    a time), and then one such client, against ONE client looping "claim
#    1; ack 1" on unordered commands; commands per second over HOT_SECS
#    seconds, the ratios.
# 3b. The same hot key with PUBLISHERS real relays (ONLY=hot-relays; see
#    hot_relays below).
# 4. Where the time goes: the backlog of 1 decided with and without keys,
#    PUBLISHERS pgbench clients looping "claim B; ack the batch" over 80%
#    of it (pgbench -r): the average time of the claim and of the ack
#    statement, ordered against unordered.
#
# Settings: KEYS, PER_KEY, B, PUBLISHERS, REPEATS, HEADS, WAITING,
# LAT_SECS, HOT, HOT_SECS, HOT_RELAY, LAYOUT (interleaved|key-major), LAT_LAYOUTS,
# ONLY (throughput|latency|hot|hot-relays|statements), EXTRA_CONF (lines appended to
# postgresql.conf), RELAY_OPTS (more options of the throughput's relays, such
# as --handover off).
set -u
set -o pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
. "$ROOT/test/lib.sh"
. "$ROOT/bench/lib.sh"

KEYS=${KEYS:-10000}
PER_KEY=${PER_KEY:-20}
B=${B:-100}
PUBLISHERS=${PUBLISHERS:-4}
REPEATS=${REPEATS:-3}
HEADS=${HEADS:-10000}
WAITING=${WAITING:-100}
LAT_SECS=${LAT_SECS:-10}
HOT=${HOT:-60000}
HOT_SECS=${HOT_SECS:-10}
HOT_RELAY=${HOT_RELAY:-10000}
EXTRA_CONF=${EXTRA_CONF:-}
RELAY_OPTS=${RELAY_OPTS:-}
ONLY=${ONLY:-}
LAYOUT=${LAYOUT:-interleaved}
LAT_LAYOUTS=${LAT_LAYOUTS:-"interleaved key-major"}
if [ -n "${QUICK:-}" ]; then
	KEYS=2000
	REPEATS=1
	WAITING=20
	LAT_SECS=5
	HOT=20000
	HOT_SECS=5
	HOT_RELAY=3000
fi

outbox_bench_start bench-ordering "$EXTRA_CONF" || exit 1
RELAY=$OUTBOX_RELAY_BINDIR/outbox-relay
[ -x "$RELAY" ] || RELAY=$ROOT/src/outbox-relay
[ -x "$RELAY" ] || { echo "missing $RELAY: run make" >&2; exit 1; }
DSN="host=$DATA port=$PORT dbname=bench"

as_pg "'$PGBIN/createdb' -h '$DATA' -p $PORT bench"
psql_q "CREATE EXTENSION outbox;" || exit 1

cat >"$WORK/loop.sql" <<'EOF'
SELECT coalesce(array_agg(token), '{}') AS toks FROM outbox.claim('sql-:client_id', :batch) \gset
SELECT count(*) FILTER (WHERE acked) AS acked FROM outbox.ack_many('sql-:client_id', ':toks') \gset
EOF
cat >"$WORK/claim.sql" <<'EOF'
BEGIN;
SELECT count(*) FROM outbox.claim('lat-:client_id', :batch);
ROLLBACK;
EOF
outbox_give_to_pg_user "$WORK"

# Decide keys x per commands (one run per key), with ordering_key (ordered
# = 1) or without, in one of two layouts: interleaved (command g belongs
# to key (g - 1) % keys: the keys take turns, as keys that receive their
# commands over time do, and the heads are the oldest rows) or key-major
# (command g belongs to key (g - 1) / per: each key's commands are
# decided together, so the heads are spread over the whole table).  5,000
# decisions per call, one transaction each (a transaction holds the lock
# of every key it appends to until it ends); then tidy the table.
load() {
	local keys=$1 per=$2 ordered=$3 layout=${4:-$LAYOUT}
	local k="((g - 1) % $keys)" s="((g - 1) / $keys + 1)" okey=""
	[ "$layout" = key-major ] && k="((g - 1) / $per)" s="((g - 1) % $per + 1)"
	[ "$ordered" = 1 ] && okey=", 'ordering_key', 'key-' || $k"
	psql_q "TRUNCATE outbox.commands, outbox.events, outbox.receipts;
DO \$\$
BEGIN
	FOR b IN 0 .. ($keys * $per - 1) / 5000 LOOP
		PERFORM count(*)
		  FROM outbox.commit_decisions((
			SELECT jsonb_agg(jsonb_build_object('run_id', 'run-' || $k, 'seq', $s,
												'event_kind', 'decided', 'command_id', 'cmd-' || g,
												'command_kind', 'k'$okey,
												'payload', jsonb_build_object('n', g, 'to', 'someone@example.org'))
							 ORDER BY g)
			  FROM generate_series(b * 5000 + 1, least((b + 1) * 5000, $keys * $per)) g));
		COMMIT;
	END LOOP;
END
\$\$;
VACUUM ANALYZE outbox.commands;
CHECKPOINT;" >/dev/null
}

now() { psql_q "SELECT extract(epoch FROM clock_timestamp())"; }

ratio() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f", a / b }'; }

# 1. One throughput run of the relays: prints commands per second.
relay_run() {
	local ordered=$1 n=$((KEYS * PER_KEY)) start end left i
	load "$KEYS" "$PER_KEY" "$ordered" || { echo "loading the commands failed" >&2; exit 1; }
	start=$(now)
	for i in $(seq "$PUBLISHERS"); do
		as_pg "'$RELAY' --dsn '$DSN' --sink stdout --batch $B --drain --worker bench-$i $RELAY_OPTS >/dev/null 2>>'$WORK/relay.log'" &
	done
	wait
	end=$(psql_q "SELECT extract(epoch FROM max(published_at)) FROM outbox.commands")
	left=$(psql_q "SELECT count(*) FROM outbox.commands WHERE status <> 'published'")
	[ "$left" != 0 ] && echo "warning: $left commands left unpublished (ordered=$ordered)" >&2
	awk -v n="$n" -v s="$start" -v e="$end" 'BEGIN { printf "%.0f\n", n / (e - s) }'
}

if [ -z "$ONLY" ] || [ "$ONLY" = throughput ]; then
	echo "throughput: $KEYS keys x $PER_KEY commands, $PUBLISHERS relays (stdout), batch $B, median of $REPEATS (commands/s)"
	declare -a UN OR
	for _ in $(seq "$REPEATS"); do
		r=$(relay_run 0) || exit 1
		UN+=("$r")
		r=$(relay_run 1) || exit 1
		OR+=("$r")
	done
	un=$(printf '%s\n' "${UN[@]}" | median)
	or=$(printf '%s\n' "${OR[@]}" | median)
	printf '  unordered %8s   (runs: %s)\n' "$un" "${UN[*]}"
	printf '  ordered   %8s   (runs: %s)\n' "$or" "${OR[*]}"
	echo "  ordered / unordered: $(ratio "$or" "$un")"
fi

# 2. Claim latency (pgbench's per-transaction log, microseconds).
claim_lat() {
	local log=$WORK/lat-log
	rm -rf "$log"
	mkdir "$log"
	outbox_give_to_pg_user "$log"
	as_pg "cd '$log' && '$PGBIN/pgbench' -n -h '$DATA' -p $PORT -c $PUBLISHERS -j $PUBLISHERS -T $LAT_SECS -D batch=$B -l -f '$WORK/claim.sql' bench" >"$WORK/pgbench-lat.log" 2>&1 ||
		{ cat "$WORK/pgbench-lat.log" >&2; exit 1; }
	cat "$log"/pgbench_log.* | awk '{ print $3 }' | sort -n |
		awk '{ v[NR] = $1 } END { printf "%d %.3f %.3f\n", NR, v[int(NR * 0.5) + 1] / 1000, v[int(NR * 0.99) + 1] / 1000 }'
}

if [ -z "$ONLY" ] || [ "$ONLY" = latency ]; then
	echo
	echo "claim latency: batch $B, $PUBLISHERS clients, ${LAT_SECS}s each (ms per claim transaction)"
	load "$HEADS" 1 1 || exit 1
	r=$(claim_lat) || exit 1
	read -r n1 p50a p99a <<<"$r"
	printf '  %7d commands (%d heads, none waiting)            p50 %7s  p99 %7s  (%d claims)\n' \
		"$HEADS" "$HEADS" "$p50a" "$p99a" "$n1"
	for layout in $LAT_LAYOUTS; do
		load "$HEADS" $((WAITING + 1)) 1 "$layout" || exit 1
		r=$(claim_lat) || exit 1
		read -r n2 p50b p99b <<<"$r"
		printf '  %7d commands (%d heads, %d waiting, %-11s) p50 %7s  p99 %7s  (%d claims)\n' \
			"$((HEADS * (WAITING + 1)))" "$HEADS" "$((HEADS * WAITING))" "$layout" "$p50b" "$p99b" "$n2"
		echo "  p50 with the waiting commands ($layout) / without: $(ratio "$p50b" "$p50a")"
	done
	# The control: no key at all, the same rows in the key-major layout
	# (every (WAITING + 1)th row pending, the others published, which no
	# claim index holds either): what the spread of the claimable rows
	# over a large table costs without ordering.
	psql_q "TRUNCATE outbox.commands, outbox.events, outbox.receipts;
INSERT INTO outbox.commands (command_id, run_id, seq, kind, payload, available_at, due_at,
							 status, version, deliveries, owner, published_at)
SELECT 'cmd-' || g, 'run-' || (g - 1) / $((WAITING + 1)), (g - 1) % $((WAITING + 1)) + 1, 'k',
	   jsonb_build_object('n', g, 'to', 'someone@example.org'), now(),
	   CASE WHEN (g - 1) % $((WAITING + 1)) = 0 THEN now() END,
	   CASE WHEN (g - 1) % $((WAITING + 1)) = 0 THEN 'pending' ELSE 'published' END,
	   CASE WHEN (g - 1) % $((WAITING + 1)) = 0 THEN 1 ELSE 3 END,
	   CASE WHEN (g - 1) % $((WAITING + 1)) = 0 THEN 0 ELSE 1 END,
	   CASE WHEN (g - 1) % $((WAITING + 1)) = 0 THEN NULL ELSE 'w' END,
	   CASE WHEN (g - 1) % $((WAITING + 1)) = 0 THEN NULL ELSE now() END
  FROM generate_series(1, $((HEADS * (WAITING + 1)))) g;
VACUUM ANALYZE outbox.commands;
CHECKPOINT;" >/dev/null || exit 1
	r=$(claim_lat) || exit 1
	read -r n3 p50c p99c <<<"$r"
	printf '  %7d commands (%d pending, %d published, unordered, key-major spread) p50 %7s  p99 %7s  (%d claims)\n' \
		"$((HEADS * (WAITING + 1)))" "$HEADS" "$((HEADS * WAITING))" "$p50c" "$p99c" "$n3"
	echo "  p50 of that unordered control / the heads alone: $(ratio "$p50c" "$p50a")"
fi

# 3. A hot key against one client's claim-1/ack-1 round trips.
hot_run() {
	local clients=$1 batch=$2 start end before
	before=$(psql_q "SELECT count(*) FROM outbox.commands WHERE status = 'published'")
	start=$(now)
	as_pg "'$PGBIN/pgbench' -n -h '$DATA' -p $PORT -c $clients -j $clients -T $HOT_SECS -D batch=$batch -f '$WORK/loop.sql' bench" >"$WORK/pgbench-hot.log" 2>&1 ||
		{ cat "$WORK/pgbench-hot.log" >&2; exit 1; }
	end=$(now)
	psql_q "SELECT round((count(*) - $before) / ($end - $start)) FROM outbox.commands WHERE status = 'published'"
}

if [ -z "$ONLY" ] || [ "$ONLY" = hot ]; then
	echo
	echo "one hot key: $PUBLISHERS clients claiming $B against 1 client claim-1/ack-1 unordered, ${HOT_SECS}s (commands/s)"
	declare -a BASE HOTK HOT1
	for _ in $(seq "$REPEATS"); do
		load 1 "$HOT" 0 || exit 1
		r=$(hot_run 1 1) || exit 1
		BASE+=("$r")
		load 1 "$HOT" 1 || exit 1
		r=$(hot_run "$PUBLISHERS" "$B") || exit 1
		HOTK+=("$r")
		r=$(hot_run 1 "$B") || exit 1
		HOT1+=("$r")
	done
	base=$(printf '%s\n' "${BASE[@]}" | median)
	hot=$(printf '%s\n' "${HOTK[@]}" | median)
	hot1=$(printf '%s\n' "${HOT1[@]}" | median)
	left=$(psql_q "SELECT count(*) FROM outbox.commands WHERE status = 'pending'")
	[ "$left" = 0 ] && echo "warning: the hot key drained before the end; raise HOT" >&2
	printf '  unordered, 1 client claim-1/ack-1 %8s   (runs: %s)\n' "$base" "${BASE[*]}"
	printf '  one key, %d clients claim-%d      %8s   (runs: %s)\n' "$PUBLISHERS" "$B" "$hot" "${HOTK[*]}"
	printf '  one key, 1 client claim-%d        %8s   (runs: %s)\n' "$B" "$hot1" "${HOT1[*]}"
	echo "  hot key, $PUBLISHERS clients / claim-1 round trips: $(ratio "$hot" "$base")"
	echo "  hot key, 1 client / claim-1 round trips: $(ratio "$hot1" "$base")"
fi

# 3b. The hot key with real publishers: PUBLISHERS outbox-relay processes
# (stdout sink, batch B, woken by LISTEN as in production) on HOT_RELAY
# commands of one key, against one client's claim-1/ack-1 round trips on
# unordered commands (as in 3, over HOT_SECS) and against ONE outbox-relay
# with --batch 1 on HOT_RELAY unordered commands (which claims its next
# command while the previous one's ack commits: more than round trips).  Commands per second from the start of
# the relays to the last ack; the relays are stopped (SIGTERM, by pid)
# once every command is published.
hot_relays() {
	local n=$1 relays=$2 batch=$3 start end i pids=() waited=0
	start=$(now)
	for i in $(seq "$relays"); do
		rm -f "$WORK/hot-$i.pid"
		as_pg "echo \$\$ >'$WORK/hot-$i.pid'; exec '$RELAY' --dsn '$DSN' --sink stdout --batch $batch --worker hot-$i" >/dev/null 2>>"$WORK/relay.log" &
	done
	for i in $(seq "$relays"); do
		while [ ! -s "$WORK/hot-$i.pid" ]; do sleep 0.05; done
		pids+=("$(cat "$WORK/hot-$i.pid")")
	done
	while [ "$(psql_q "SELECT count(*) FROM outbox.commands WHERE status = 'published'")" -lt "$n" ]; do
		sleep 0.2
		waited=$((waited + 1))
		if [ "$waited" -gt 3000 ]; then
			echo "the relays did not publish $n commands in 10 minutes" >&2
			kill "${pids[@]}" 2>/dev/null
			wait
			exit 1
		fi
	done
	kill -TERM "${pids[@]}" 2>/dev/null
	wait
	end=$(psql_q "SELECT extract(epoch FROM max(published_at)) FROM outbox.commands")
	# the relays' summaries: batches that found commands, and wake-ups
	grep -h 'summary: worker=hot-' "$WORK/relay.log" |
		awk '{ for (i = 1; i <= NF; i++) { split($i, kv, "="); if (kv[1] == "batches") b += kv[2]; if (kv[1] == "wakeups") w += kv[2] } }
			 END { printf "    %d relay(s): %d batches, %d wake-ups\n", '"$relays"', b, w }' >&2
	: >"$WORK/relay.log"
	awk -v n="$n" -v s="$start" -v e="$end" 'BEGIN { printf "%.0f\n", n / (e - s) }'
}

if [ -z "$ONLY" ] || [ "$ONLY" = hot-relays ]; then
	echo
	echo "one hot key, real publishers: $PUBLISHERS relays claiming $B on $HOT_RELAY commands, against 1 client claim-1/ack-1 and 1 relay --batch 1 unordered (commands/s)"
	declare -a RBASE RHOT RTRIP
	for _ in $(seq "$REPEATS"); do
		load 1 "$HOT" 0 || exit 1
		r=$(hot_run 1 1) || exit 1
		RTRIP+=("$r")
		load 1 "$HOT_RELAY" 0 || exit 1
		r=$(hot_relays "$HOT_RELAY" 1 1) || exit 1
		RBASE+=("$r")
		load 1 "$HOT_RELAY" 1 || exit 1
		r=$(hot_relays "$HOT_RELAY" "$PUBLISHERS" "$B") || exit 1
		RHOT+=("$r")
	done
	rtrip=$(printf '%s\n' "${RTRIP[@]}" | median)
	rbase=$(printf '%s\n' "${RBASE[@]}" | median)
	rhot=$(printf '%s\n' "${RHOT[@]}" | median)
	printf '  unordered, 1 client claim-1/ack-1 round trips %8s   (runs: %s)\n' "$rtrip" "${RTRIP[*]}"
	printf '  unordered, 1 relay --batch 1 (claims ahead)   %8s   (runs: %s)\n' "$rbase" "${RBASE[*]}"
	printf '  one key, %d relays --batch %d                  %8s   (runs: %s)\n' "$PUBLISHERS" "$B" "$rhot" "${RHOT[*]}"
	echo "  hot key, $PUBLISHERS relays / claim-1/ack-1 round trips: $(ratio "$rhot" "$rtrip")"
	echo "  hot key, $PUBLISHERS relays / 1 relay --batch 1: $(ratio "$rhot" "$rbase")"
fi

# 4. The claim's and the ack's share (pgbench -r, ms per statement).
statements() {
	local t=$((KEYS * PER_KEY * 8 / 10 / B / PUBLISHERS))
	as_pg "'$PGBIN/pgbench' -n -r -h '$DATA' -p $PORT -c $PUBLISHERS -j $PUBLISHERS -t $t -D batch=$B -f '$WORK/loop.sql' bench" >"$WORK/pgbench-st.log" 2>&1 ||
		{ cat "$WORK/pgbench-st.log" >&2; exit 1; }
	awk '/outbox\.claim\(/ { c = $1 } /outbox\.ack_many\(/ { a = $1 } END { print c, a }' "$WORK/pgbench-st.log"
}

if [ -z "$ONLY" ] || [ "$ONLY" = statements ]; then
	echo
	echo "where the time goes: $KEYS keys x $PER_KEY, $PUBLISHERS clients claim $B / ack over 80% of it (ms per statement)"
	for _ in $(seq "$REPEATS"); do
		load "$KEYS" "$PER_KEY" 0 || exit 1
		r=$(statements) || exit 1
		read -r c0 a0 <<<"$r"
		load "$KEYS" "$PER_KEY" 1 || exit 1
		r=$(statements) || exit 1
		read -r c1 a1 <<<"$r"
		echo "  claim: unordered $c0, ordered $c1 ($(ratio "$c1" "$c0")x); ack: unordered $a0, ordered $a1 ($(ratio "$a1" "$a0")x)"
	done
fi
