#!/usr/bin/env bash
# Soak: a steady produce + claim + ack + complete load with a short retention,
# so the worker purges continuously; every minute it reports table and index
# sizes, dead tuples and the p50/p99 of one claim of 100.  In the middle one
# transaction is held open for HOLD_SECONDS: outbox.horizon shows it while it
# lasts, and the table shows how claim latency recovers after it closes.
# Run by hand (not part of the tests):
#
#   bash bench/soak.sh                       # 30 minutes at 2,000 commands/s
#   SOAK_MINUTES=10 RATE=1000 bash bench/soak.sh
set -u
set -o pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
. "$ROOT/test/lib.sh"

MINUTES=${SOAK_MINUTES:-30}
RATE=${RATE:-2000}
HOLD_SECONDS=${HOLD_SECONDS:-120}
HOLD_AT=$((MINUTES * 60 / 2))

outbox_bench_start soak "outbox.naptime = 1000
outbox.retention = 30
outbox.purge_batch = 2000
synchronous_commit = off" || exit 1
trap 'kill $(jobs -p) 2>/dev/null; outbox_cleanup_work "$WORK"' EXIT

q() { as_pg "'$PGBIN/psql' -X -qAt -h '$DATA' -p $PORT -d soak -v ON_ERROR_STOP=1" <<<"$1"; }
as_pg "'$PGBIN/createdb' -h '$DATA' -p $PORT soak"
q "CREATE EXTENSION outbox; CREATE SEQUENCE soak_ids;" >/dev/null

cat >"$WORK/produce.sql" <<'EOF'
SELECT outbox.commit_decision('soak', n, 'e', 's-' || n, 'k', '{"to": "someone@example.org"}')
  FROM (SELECT pg_catalog.nextval('soak_ids') AS n) x;
EOF
# A publisher that is also the consumer: claim, ack, complete.
cat >"$WORK/relay.sql" <<'EOF'
SELECT COALESCE(array_agg(command_id), '{}') AS ids, COALESCE(array_agg(token), '{}') AS toks, count(*) AS n FROM outbox.claim('relay-' || :client_id, 100, interval '30 seconds') \gset
SELECT count(*) FROM outbox.ack_many('relay-' || :client_id, ':toks') WHERE acked;
SELECT count(outbox.complete('soak', c)) FROM pg_catalog.unnest(:ids::text[]) c;
\if :n = 0
\sleep 20 ms
\endif
EOF
: >"$WORK/probe.sql"
for _ in $(seq 100); do
	printf '%s\n' "BEGIN;" "SELECT count(*) FROM outbox.claim('probe', 100, interval '1 minute');" "ROLLBACK;" >>"$WORK/probe.sql"
done
outbox_give_to_pg_user "$WORK"

DURATION=$((MINUTES * 60))
as_pg "'$PGBIN/pgbench' -n -M prepared -h '$DATA' -p $PORT -c 2 -j 1 -R $RATE -T $DURATION -f '$WORK/produce.sql' soak" \
	>"$WORK/produce.log" 2>&1 &
as_pg "'$PGBIN/pgbench' -n -M prepared -h '$DATA' -p $PORT -c 2 -j 1 -T $DURATION -f '$WORK/relay.sql' soak" \
	>"$WORK/relay.log" 2>&1 &

# One claim of 100 in a rolled-back transaction, 100 times: p50 and p99 ms.
probe() {
	as_pg "'$PGBIN/psql' -X -q -h '$DATA' -p $PORT -d soak -c '\\timing on' -f '$WORK/probe.sql'" |
		awk '/^Time: / {n++; if (n % 3 == 2) print $2}' | sort -n |
		awk '{a[NR] = $1} END {printf "%7.2f %7.2f", a[int(NR * 0.5)], a[int(NR * 0.99)]}'
}

echo "== soak: $MINUTES min, producers at $RATE commands/s, retention 30 s; a transaction held ${HOLD_SECONDS}s from minute $((HOLD_AT / 60))"
printf '%4s %8s %9s %8s %9s %9s %9s %8s %9s %7s %7s  %s\n' \
	min pending published receipts table_kB index_kB rcpt_kB dead purged p50_ms p99_ms horizon
start=$(date +%s)
held=0
for m in $(seq 1 "$MINUTES"); do
	while [ $(($(date +%s) - start)) -lt $((m * 60)) ]; do
		if [ $held -eq 0 ] && [ $(($(date +%s) - start)) -ge $HOLD_AT ]; then
			as_pg "'$PGBIN/psql' -X -q -h '$DATA' -p $PORT -d soak -c 'BEGIN ISOLATION LEVEL REPEATABLE READ' \
				-c 'SELECT count(*) FROM outbox.commands' -c 'SELECT pg_sleep($HOLD_SECONDS)' -c 'COMMIT'" >/dev/null 2>&1 &
			held=1
		fi
		sleep 1
	done
	q "SELECT pg_stat_force_next_flush();" >/dev/null
	stats=$(q "SELECT (SELECT count(*) FROM outbox.commands WHERE status = 'pending'),
		(SELECT count(*) FROM outbox.commands WHERE status = 'published'),
		(SELECT count(*) FROM outbox.receipts),
		pg_relation_size('outbox.commands') / 1024,
		pg_indexes_size('outbox.commands') / 1024,
		pg_total_relation_size('outbox.receipts') / 1024,
		(SELECT n_dead_tup FROM pg_stat_user_tables WHERE relid = 'outbox.commands'::regclass),
		(SELECT purged FROM outbox.stats),
		COALESCE((SELECT holder || ' open ' || date_trunc('second', open_for)
		            FROM outbox.horizon WHERE source = 'transaction' AND open_for > interval '10 seconds'
		           ORDER BY open_for DESC LIMIT 1), '-')" | tr '|' ' ')
	lat=$(probe)
	read -r pend pub rec tkb ikb rkb dead purged hz <<<"$stats"
	printf '%4s %8s %9s %8s %9s %9s %9s %8s %9s %s  %s\n' "$m" "$pend" "$pub" "$rec" "$tkb" "$ikb" "$rkb" "$dead" "$purged" "$lat" "$hz"
done
wait
echo "== sizes at the end (kB)"
q "SELECT c.relname, pg_relation_size(c.oid) / 1024 FROM pg_class c
     WHERE c.relnamespace = 'outbox'::regnamespace AND c.relkind IN ('r', 'i')
       AND c.relname ~ '^(commands|receipts)' ORDER BY 1" | tr '|' ' '
echo "== index upkeep"
grep -E 'outbox upkeep|index upkeep' "$DATA/server.log" | sed -E 's/^.*(LOG|WARNING|ERROR|FATAL): +//' || echo "(none)"
echo "== producers: $(grep -E '^tps' "$WORK/produce.log" | head -1)"
echo "== relays:    $(grep -E '^tps' "$WORK/relay.log" | head -1)"
