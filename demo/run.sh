#!/usr/bin/env bash
# Live demonstration of the whole outbox chain on a throwaway cluster.
#
#   bash demo/run.sh
#
# On a fresh Debian 12 machine, run as root: it installs what is missing,
# builds and installs the extension, starts a private PostgreSQL 15 cluster
# as the postgres OS user, walks through the chain, and removes the cluster.
set -u
set -o pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
. "$ROOT/test/lib.sh"

if [ -z "${OUTBOX_SKIP_BUILD:-}" ]; then
	echo "== setting up (packages, build, install)"
	outbox_setup || { echo "set-up failed" >&2; exit 1; }
fi

WORK=$(mktemp -d /tmp/outbox-demo.XXXXXX)
outbox_give_to_pg_user "$WORK"
trap 'outbox_cleanup_work "$WORK"' EXIT
DATA="$WORK/data"
PORT=$(outbox_free_port)
outbox_start_cluster "$DATA" "$PORT" || { cat "$DATA/server.log" 2>/dev/null; exit 1; }
echo "== a throwaway cluster is running in $DATA"

# Run SQL in the demo database, echoing each statement and its result.
sql() {
	as_pg "'$PGBIN/psql' -X -h '$DATA' -p $PORT -d demo -v ON_ERROR_STOP=0 -e" <<<"$1" 2>&1 |
		sed -e 's/^psql:<stdin>:[0-9]*: //'
}

as_pg "'$PGBIN/createdb' -h '$DATA' -p $PORT demo"
sql "CREATE EXTENSION outbox;
SELECT outbox.register_consumer('budget-service', 'postgres');
SELECT outbox.register_consumer('shipping', 'postgres');"

echo
echo "== 1. A service decides: trip_requested for run-1 decides lock_budget cmd-1, in one transaction"
sql "BEGIN;
SELECT outbox.commit_decision('run-1', 1, 'trip_requested', 'cmd-1', 'lock_budget', '{\"amount\": 900}');
COMMIT;
SELECT run_id, seq, kind, command_id FROM outbox.events;
SELECT command_id, kind, payload, status, version, deliveries FROM outbox.commands;"

echo
echo "== 2. The same decision again is a retry (false); a different one reusing cmd-1 is refused (23505) and leaves nothing behind"
sql "\\set VERBOSITY verbose
SELECT outbox.commit_decision('run-1', 1, 'trip_requested', 'cmd-1', 'lock_budget', '{\"amount\": 900}') AS recorded;
SELECT outbox.commit_decision('run-1', 2, 'trip_requested', 'cmd-1', 'lock_budget', '{\"amount\": 900}');
SELECT count(*) AS events, (SELECT count(*) FROM outbox.commands) AS commands FROM outbox.events;"

echo
echo "== 3. A rolled-back decision is never seen"
sql "BEGIN;
SELECT outbox.commit_decision('run-2', 1, 'mail_decided', 'cmd-2', 'send_mail', '{\"to\": \"ann@example.org\"}');
ROLLBACK;
SELECT count(*) AS commands_of_run_2 FROM outbox.commands WHERE run_id = 'run-2';"

echo
echo "== 4. Publisher A claims cmd-1 with a short lease, then stalls"
sql "CREATE TABLE leases_held (publisher text, command_id text, token text);
WITH c AS (SELECT * FROM outbox.claim('publisher-A', 10, interval '1 second')),
     k AS (INSERT INTO leases_held SELECT 'publisher-A', command_id, token FROM c)
SELECT command_id, kind, payload, version, deliveries FROM c;"
echo "   (each claimed command comes with a token, kept here in leases_held: ack, fail and renew need it)"
echo "   publisher B finds nothing while A's lease is live:"
sql "SELECT count(*) AS claimed FROM outbox.claim('publisher-B', 10, interval '30 seconds');"
as_pg "'$PGBIN/psql' -X -q -h '$DATA' -p $PORT -d demo -c \"SELECT pg_sleep(1.2)\"" >/dev/null
echo "   ... A's lease expires; B takes cmd-1 over with a new token:"
sql "WITH c AS (SELECT * FROM outbox.claim('publisher-B', 10, interval '30 seconds')),
     k AS (INSERT INTO leases_held SELECT 'publisher-B', command_id, token FROM c)
SELECT command_id, version, deliveries FROM c;"

echo
echo "== 5. The consumer receives cmd-1 twice (A's late send and B's); the inbox makes it one effect"
sql "CREATE TABLE budget_locks (command_id text PRIMARY KEY, amount int);
BEGIN;
SELECT outbox.inbox_accept('budget-service', 'run-1', 'cmd-1') AS first_delivery;
INSERT INTO budget_locks SELECT 'cmd-1', 900 WHERE true;
COMMIT;
SELECT outbox.inbox_accept('budget-service', 'run-1', 'cmd-1') AS redelivery;
SELECT count(*) AS budget_locks FROM budget_locks;"

echo
echo "== 6. A's late ack is refused (OB001 lease_not_owned); B's ack publishes cmd-1"
sql "SELECT outbox.ack('publisher-A', token) FROM leases_held WHERE publisher = 'publisher-A';
SELECT outbox.ack('publisher-B', token) FROM leases_held WHERE publisher = 'publisher-B';
SELECT command_id, status, owner, version, deliveries FROM outbox.commands;"

echo
echo "== 7. Published is not processed: the consumer records its completion receipt"
sql "SELECT outbox.complete('run-1', 'cmd-1', 'done', '{\"lock\": \"L-77\"}') AS first, outbox.complete('run-1', 'cmd-1') AS repeat;
SELECT command_id, outcome, detail FROM outbox.receipts;"

if as_pg "'$PGBIN/psql' -X -qAt -h '$DATA' -p $PORT -d demo -c \"SELECT to_regclass('outbox.conservation') IS NOT NULL\"" | grep -q t; then
	echo
	echo "== 8. The DBA checks conservation: every row at zero"
	sql "SELECT * FROM outbox.conservation;"
fi

echo
echo "== 9. The whole chain live: producers, two outbox-relay publishers, a webhook consumer"
RELAY="$OUTBOX_RELAY_BINDIR/outbox-relay"
RECEIVER="$ROOT/src/outbox-receiver"
DSN="host=$DATA port=$PORT dbname=demo user=postgres"
sql "CREATE TABLE shipments (command_id text PRIMARY KEY, payload jsonb, applied_at timestamptz DEFAULT clock_timestamp());
SELECT outbox.stats_reset();" >/dev/null
HTTP_PORT=$(outbox_free_port)
# The consumer: for each POST, in one transaction, inbox_accept + the
# business row + complete.  It takes 5 ms per command, like a real service.
"$RECEIVER" --port "$HTTP_PORT" --dsn "$DSN" --table shipments --consumer shipping \
	--delay-ms 5 2>"$WORK/receiver.log" &
RECEIVER_PID=$!
outbox_wait_port "$HTTP_PORT"
echo "   consumer listening on http://127.0.0.1:$HTTP_PORT/"
. "$ROOT/demo/plot.sh"	# sampled every 0.1 s for the picture of step 10
demo_sampler_start "$DSN" "$WORK/samples.dat"

# Producers: 4 sessions run 2,000 transactions deciding one command each
# while the relays run; about one in ten rolls back.
cat >"$WORK/produce.sql" <<'EOS'
\set n random(1, 1000000000)
\set r random(1, 10)
BEGIN;
SELECT outbox.commit_decision('order-' || :client_id, :n, 'order_paid',
       CASE WHEN :r = 1 THEN 'rolled-back-' ELSE 'ship-' END || :client_id || '-' || :n,
       'ship_order', jsonb_build_object('order', :n));
\if :r = 1
ROLLBACK;
\else
COMMIT;
\endif
EOS
outbox_give_to_pg_user "$WORK"
"$RELAY" --dsn "$DSN" --sink "http://127.0.0.1:$HTTP_PORT/" --worker relay-A --batch 50 --lease 3 --poll 1 2>"$WORK/relay-A.log" &
RELAY_A=$!
"$RELAY" --dsn "$DSN" --sink "http://127.0.0.1:$HTTP_PORT/" --worker relay-B --batch 50 --lease 3 --poll 1 2>"$WORK/relay-B.log" &
RELAY_B=$!
echo "   relay-A (pid $RELAY_A) and relay-B (pid $RELAY_B) are delivering"
as_pg "'$PGBIN/pgbench' -n -h '$DATA' -p $PORT -c 4 -j 2 -t 500 -f '$WORK/produce.sql' demo" >/dev/null 2>&1 &
PRODUCERS=$!

sleep 1.5
echo "   kill -9 relay-A in the middle of a batch:"
as_pg "'$PGBIN/psql' -X -qAt -h '$DATA' -p $PORT -d demo -c \"SELECT '   relay-A holds ' || count(*) || ' leases' FROM outbox.commands WHERE owner = 'relay-A' AND status = 'sending'\""
demo_event "relay-A killed"
kill -9 "$RELAY_A"
wait "$RELAY_A" 2>/dev/null
wait "$PRODUCERS"
echo "   producers done; waiting for relay-B to take over relay-A's expired leases and drain"
for _ in $(seq 120); do
	left=$(as_pg "'$PGBIN/psql' -X -qAt -h '$DATA' -p $PORT -d demo -c \"SELECT count(*) FROM outbox.commands c WHERE c.status <> 'published' OR NOT EXISTS (SELECT 1 FROM outbox.receipts r WHERE r.command_id = c.command_id)\"")
	[ "$left" = 0 ] && break
	sleep 0.5
done
sleep 0.5
demo_sampler_stop
kill -TERM "$RELAY_B"
wait "$RELAY_B" 2>/dev/null
echo "   relay-B's summary: $(grep 'summary:' "$WORK/relay-B.log" | tail -1)"
kill "$RECEIVER_PID" 2>/dev/null

sql "SELECT status, count(*) AS commands, sum(deliveries) AS deliveries, count(*) FILTER (WHERE deliveries > 1) AS redelivered
  FROM outbox.commands WHERE kind = 'ship_order' GROUP BY status;
SELECT count(*) AS commands_taken_over_from_relay_a FROM outbox.commands WHERE deliveries > 1 AND owner = 'relay-B';
SELECT (SELECT count(*) FROM outbox.commands WHERE kind = 'ship_order') AS committed_commands,
       (SELECT count(*) FROM shipments) AS shipments_applied,
       (SELECT count(*) FROM outbox.receipts r JOIN outbox.commands c USING (command_id)
         WHERE c.kind = 'ship_order') AS receipts,
       (SELECT count(*) FROM shipments WHERE command_id LIKE 'rolled-back-%') AS rolled_back_but_applied;
SELECT enqueued, claimed, taken_over, acked, stale_refused, failed, dead_lettered, wakeups FROM outbox.stats;
SELECT check_name, severity, violations FROM outbox.conservation;"

echo
echo "== 10. The picture of step 9 (outbox.stats and outbox.metrics_backlog() sampled every 0.1 s)"
OUT=${OUTBOX_DEMO_OUT:-/tmp/outbox-demo}
mkdir -p "$OUT"
cp "$WORK/samples.dat" "$OUT/samples.dat"
cp "$WORK/samples.dat.events" "$OUT/events.dat"
if demo_plot "$WORK/samples.dat" "$OUT/outbox-demo.png"; then
	echo "   drawn with gnuplot: $OUT/outbox-demo.png (samples: $OUT/samples.dat)"
else
	echo "   gnuplot could not draw the picture" >&2
fi

echo
echo "== done; the cluster is removed"
