#!/usr/bin/env bash
# Soak of a stream (the write-once path), as bench/soak.sh is of the row
# leases: producers at RATE commit decisions of a kind written to a stream,
# two publishers claim_batch, ack_batch and complete every command, the
# kind requires receipts (completers), outbox.retention = 30 s and the log
# tables switch every ROTATION seconds, so the worker rotates continuously.
# In the middle one REPEATABLE READ transaction is held open for
# HOLD_SECONDS (the xmin horizon stays behind it).  Every 5 s it measures
# the sizes (tables with their indexes and TOAST, kB) of the stream's
# relations and of the row-lease tables, and every minute it prints them:
#
#   log       the three log tables (stream_log_0/1/2) with their receipts
#             (stream_receipts_0/1/2, truncated with them), at the minute
#   log_max   the same, the highest of the minute (the log grows while one
#             table takes the appends and drops when one is truncated, so
#             its size at a given second depends on where the rotation is)
#   kept      stream_kept (stragglers moved out of a table being truncated)
#   prog      stream_progress (one row per partition, HOT-updated per ack)
#   ticks     stream_ticks
#   fail      stream_failures
#   rcpt      outbox.receipts (a stream command's receipt is there only
#             while the rotation keeps the command in stream_kept)
#   rows      the row-lease tables (commands, purged), which a stream does
#             not use
#   total_max the highest total of all the above in the minute
#   tomb      stream_purged, the tombstones: they grow with every command
#             rotated, by design (as outbox.purged on the row path), and are
#             not in the total
#
# plus rotated commands, the p50/p99 of one claim_batch (rolled back, 100
# times) and what outbox.horizon shows.  At the end: each relation's size
# at minute 5 and at the end, total_max of minute 5 against the last
# minute (the target: at most 1.2x), and whether any index was rebuilt
# (the worker's index upkeep logs every rebuild; an index of the
# extension whose relfilenode changed other than by the rotation's
# TRUNCATE of a log table and its receipts counts as one too).  It never rebuilds anything
# itself.  Run by hand (not part of the tests):
#
#   bash bench/stream-soak.sh                          # 30 minutes, 2,000/s
#   SOAK_MINUTES=4 HOLD_SECONDS=30 bash bench/stream-soak.sh
# Settings: SOAK_MINUTES (30), RATE (2000), HOLD_SECONDS (120), ROTATION
# (outbox.stream_rotation, 60 s), PARTS (4), BATCH (the stream's
# batch_size, 1000).
set -u
set -o pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
. "$ROOT/test/lib.sh"

MINUTES=${SOAK_MINUTES:-30}
RATE=${RATE:-2000}
HOLD_SECONDS=${HOLD_SECONDS:-120}
ROTATION=${ROTATION:-60}
PARTS=${PARTS:-4}
BATCH=${BATCH:-1000}
HOLD_AT=$((MINUTES * 60 / 2))

outbox_bench_start stream-soak "outbox.naptime = 1000
outbox.retention = 30
outbox.purge_batch = 2000
outbox.stream_rotation = $ROTATION
synchronous_commit = off" || exit 1
trap 'kill $(jobs -p) 2>/dev/null; outbox_cleanup_work "$WORK"' EXIT

q() { as_pg "'$PGBIN/psql' -X -qAt -h '$DATA' -p $PORT -d soak -v ON_ERROR_STOP=1" <<<"$1"; }
as_pg "'$PGBIN/createdb' -h '$DATA' -p $PORT soak"
q "CREATE EXTENSION outbox; CREATE SEQUENCE soak_ids;
SELECT outbox.create_stream('soak', partitions => $PARTS, batch_size => $BATCH);
SELECT outbox.create_subscription('soak', 'sub');
SELECT outbox.set_policy('k', stream => 'soak', completers => ARRAY[current_user::regrole]);" >/dev/null || exit 1

cat >"$WORK/produce.sql" <<'EOF'
SELECT outbox.commit_decision('soak', n, 'e', 's-' || n, 'k', '{"to": "someone@example.org"}')
  FROM (SELECT pg_catalog.nextval('soak_ids') AS n) x;
EOF
# A publisher that is also the consumer: claim a batch, ack it, complete
# its commands.
cat >"$WORK/relay.sql" <<'EOF'
SELECT COALESCE(array_agg(command_id), '{}') AS ids, COALESCE(min(token), '') AS tok, count(*) AS n FROM outbox.claim_batch('soak', 'sub', 'relay-' || :client_id, interval '30 seconds') \gset
\if :n > 0
SELECT outbox.ack_batch('relay-' || :client_id, :tok);
SELECT count(outbox.complete('soak', c)) FROM pg_catalog.unnest(:ids::text[]) c;
\else
\sleep 20 ms
\endif
EOF
: >"$WORK/probe.sql"
for _ in $(seq 100); do
	printf '%s\n' "BEGIN;" "SELECT count(*) FROM outbox.claim_batch('soak', 'sub', 'probe', interval '1 minute');" "ROLLBACK;" >>"$WORK/probe.sql"
done
outbox_give_to_pg_user "$WORK"

# The sizes, kB: one line "log kept prog ticks fail rcpt rows tomb".
SIZES="SELECT (SELECT sum(pg_total_relation_size(c.oid)) FROM pg_class c
                WHERE c.relnamespace = 'outbox'::regnamespace AND c.relkind = 'r'
                  AND c.relname IN ('stream_log_0', 'stream_log_1', 'stream_log_2',
                                    'stream_receipts_0', 'stream_receipts_1', 'stream_receipts_2'))::bigint / 1024,
       pg_total_relation_size('outbox.stream_kept') / 1024,
       pg_total_relation_size('outbox.stream_progress') / 1024,
       pg_total_relation_size('outbox.stream_ticks') / 1024,
       pg_total_relation_size('outbox.stream_failures') / 1024,
       pg_total_relation_size('outbox.receipts') / 1024,
       (pg_total_relation_size('outbox.commands') + pg_total_relation_size('outbox.purged')) / 1024,
       pg_total_relation_size('outbox.stream_purged') / 1024"
# Every table and index of these relations with its size (kB), relfilenode
# and oid.
RELS="SELECT c.relname, pg_relation_size(c.oid) / 1024, c.relfilenode, c.oid FROM pg_class c
       WHERE c.relnamespace = 'outbox'::regnamespace AND c.relkind IN ('r', 'i')
         AND c.relname ~ '^(commands|receipts|purged|stream_(log|receipts|kept|progress|ticks|failures|purged))'
       ORDER BY 1"
q "$RELS" >"$WORK/rels.start"

DURATION=$((MINUTES * 60))
as_pg "'$PGBIN/pgbench' -n -M prepared -h '$DATA' -p $PORT -c 2 -j 1 -R $RATE -T $DURATION -f '$WORK/produce.sql' soak" \
	>"$WORK/produce.log" 2>&1 &
as_pg "'$PGBIN/pgbench' -n -M prepared -h '$DATA' -p $PORT -c 2 -j 1 -T $DURATION -f '$WORK/relay.sql' soak" \
	>"$WORK/relay.log" 2>&1 &

# One claim_batch in a rolled-back transaction, 100 times: p50 and p99 ms.
probe() {
	as_pg "'$PGBIN/psql' -X -q -h '$DATA' -p $PORT -d soak -c '\\timing on' -f '$WORK/probe.sql'" |
		awk '/^Time: / {n++; if (n % 3 == 2) print $2}' | sort -n |
		awk '{a[NR] = $1} END {printf "%7.2f %7.2f", a[int(NR * 0.5)], a[int(NR * 0.99)]}'
}

echo "== stream soak: $MINUTES min, producers at $RATE commands/s, $PARTS partitions, batch_size $BATCH, retention 30 s, stream_rotation ${ROTATION}s; a transaction held ${HOLD_SECONDS}s from minute $((HOLD_AT / 60))"
printf '%4s %9s %9s %8s %8s %7s %7s %7s %8s %7s %9s %7s %9s %7s %7s  %s\n' \
	min published log_kB log_max kept_kB prog_kB tick_kB fail_kB rcpt_kB rows_kB total_max tomb_kB rotated p50_ms p99_ms horizon
start=$(date +%s)
held=0
for m in $(seq 1 "$MINUTES"); do
	logmax=0
	totmax=0
	while :; do
		read -r lg kp pr tk fl rc rw tb <<<"$(q "$SIZES" | tr '|' ' ')"
		tot=$((lg + kp + pr + tk + fl + rc + rw))
		[ "$lg" -gt "$logmax" ] && logmax=$lg
		[ "$tot" -gt "$totmax" ] && totmax=$tot
		[ $(($(date +%s) - start)) -ge $((m * 60)) ] && break
		if [ $held -eq 0 ] && [ $(($(date +%s) - start)) -ge $HOLD_AT ]; then
			as_pg "'$PGBIN/psql' -X -q -h '$DATA' -p $PORT -d soak -c 'BEGIN ISOLATION LEVEL REPEATABLE READ' \
				-c 'SELECT count(*) FROM outbox.commands' -c 'SELECT pg_sleep($HOLD_SECONDS)' -c 'COMMIT'" >/dev/null 2>&1 &
			held=1
		fi
		sleep 5
	done
	stats=$(q "SELECT (SELECT COALESCE(sum(published), 0) FROM outbox.stream_progress),
		(SELECT COALESCE(sum(commands), 0) FROM outbox.stream_purged),
		COALESCE((SELECT holder || ' open ' || date_trunc('second', open_for)
		            FROM outbox.horizon WHERE source = 'transaction' AND open_for > interval '10 seconds'
		           ORDER BY open_for DESC LIMIT 1), '-')" | tr '|' ' ')
	lat=$(probe)
	read -r pub rot hz <<<"$stats"
	printf '%4s %9s %9s %8s %8s %7s %7s %7s %8s %7s %9s %7s %9s %s  %s\n' \
		"$m" "$pub" "$lg" "$logmax" "$kp" "$pr" "$tk" "$fl" "$rc" "$rw" "$totmax" "$tb" "$rot" "$lat" "$hz"
	echo "$m $totmax $logmax $kp $pr $tk $fl $rc $rw $tb" >>"$WORK/minutes"
	[ "$m" -eq 5 ] && q "$RELS" >"$WORK/rels.m5"
done
wait
q "$RELS" >"$WORK/rels.end"
[ -e "$WORK/rels.m5" ] || cp "$WORK/rels.end" "$WORK/rels.m5"

echo "== sizes per relation (kB): minute 5, end, end / minute 5"
LC_ALL=C join -t '|' "$WORK/rels.m5" "$WORK/rels.end" |
	awk -F '|' '{r = $2 > 0 ? sprintf("%.2f", $5 / $2) : "-"; printf "%-32s %9s %9s %6s\n", $1, $2, $5, r}'
m5=$(awk '$1 == 5 {print $2}' "$WORK/minutes")
[ -n "$m5" ] || m5=$(head -1 "$WORK/minutes" | cut -d' ' -f2)
last=$(tail -1 "$WORK/minutes")
fin=$(cut -d' ' -f2 <<<"$last")
echo "== total_max (all but the tombstones): minute 5 $m5 kB, minute ${last%% *} $fin kB: $(awk -v a="$fin" -v b="$m5" 'BEGIN {r = a / b; printf "%.2fx (target <= 1.2x: %s)", r, r <= 1.2 ? "met" : "NOT met"}')"

echo "== index rebuilds"
echo "start: $(date -u -d "@$start" '+%H:%M:%S') UTC"
grep -E 'outbox upkeep' "$DATA/server.log" || echo "upkeep log: none"
# An index (not of a log table or its receipts, which TRUNCATE gives a
# new relfilenode)
# whose oid or relfilenode changed since the start.
changed=$(LC_ALL=C join -t '|' "$WORK/rels.start" "$WORK/rels.end" |
	awk -F '|' '$1 !~ /^stream_(log|receipts)_/ && ($3 != $6 || $4 != $7) {print $1}')
echo "relfilenode or oid changed: ${changed:-none}"
echo "== producers: $(grep -E '^tps' "$WORK/produce.log" | head -1)"
echo "== relays:    $(grep -E '^tps' "$WORK/relay.log" | head -1)"
grep -hE 'ERROR|FATAL' "$WORK/produce.log" "$WORK/relay.log" | sort | uniq -c | head -5
grep -E 'ERROR|PANIC' "$DATA/server.log" | sed -E 's/^[^]]*\] *//' | sort | uniq -c | sort -rn | head -10
exit 0
