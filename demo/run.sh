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
sql "CREATE EXTENSION outbox;"

echo
echo "== 1. A service decides: trip_requested for run-1 decides lock_budget cmd-1, in one transaction"
sql "BEGIN;
SELECT outbox.commit_decision('run-1', 1, 'trip_requested', 'cmd-1', 'lock_budget', '{\"amount\": 900}');
COMMIT;
SELECT run_id, seq, kind, command_id FROM outbox.events;
SELECT command_id, kind, payload, status, version, deliveries FROM outbox.commands;"

echo
echo "== 2. A second decision reusing cmd-1 is refused (23505) and leaves nothing behind"
sql "\\set VERBOSITY verbose
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
sql "SELECT command_id, kind, payload, version, deliveries FROM outbox.claim('publisher-A', 10, interval '1 second');"
echo "   publisher B finds nothing while A's lease is live:"
sql "SELECT count(*) AS claimed FROM outbox.claim('publisher-B', 10, interval '30 seconds');"
as_pg "'$PGBIN/psql' -X -q -h '$DATA' -p $PORT -d demo -c \"SELECT pg_sleep(1.2)\"" >/dev/null
echo "   ... A's lease expires; B takes cmd-1 over with a new token:"
sql "SELECT command_id, version, deliveries FROM outbox.claim('publisher-B', 10, interval '30 seconds');"

echo
echo "== 5. The consumer receives cmd-1 twice (A's late send and B's); the inbox makes it one effect"
sql "CREATE TABLE budget_locks (command_id text PRIMARY KEY, amount int);
BEGIN;
SELECT outbox.inbox_accept('budget-service', 'cmd-1') AS first_delivery;
INSERT INTO budget_locks SELECT 'cmd-1', 900 WHERE true;
COMMIT;
SELECT outbox.inbox_accept('budget-service', 'cmd-1') AS redelivery;
SELECT count(*) AS budget_locks FROM budget_locks;"

echo
echo "== 6. A's late ack is refused (lease_not_owned); B's ack publishes cmd-1"
sql "SELECT outbox.ack('cmd-1', 'publisher-A', 2);
SELECT outbox.ack('cmd-1', 'publisher-B', 3);
SELECT command_id, status, owner, version, deliveries FROM outbox.commands;"

echo
echo "== 7. Published is not processed: the consumer records its completion receipt"
sql "SELECT outbox.complete('cmd-1', 'done', '{\"lock\": \"L-77\"}') AS first, outbox.complete('cmd-1') AS repeat;
SELECT command_id, outcome, detail FROM outbox.receipts;"

if as_pg "'$PGBIN/psql' -X -qAt -h '$DATA' -p $PORT -d demo -c \"SELECT to_regclass('outbox.conservation') IS NOT NULL\"" | grep -q t; then
	echo
	echo "== 8. The DBA checks conservation: every row at zero"
	sql "SELECT * FROM outbox.conservation;"
fi

echo
echo "== done; the cluster is removed"
