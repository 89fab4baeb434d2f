#!/usr/bin/env bash
# Benchmark of the conservation checks (not a timed test).
#
#   bash bench/checks.sh            # 1,000,000 commands
#   bash bench/checks.sh 100000     # another size
#   REPEATS=7 bash bench/checks.sh
#
# Starts a private cluster (shared_preload_libraries = 'outbox'), loads N
# commands in every state plus N/10 purged ones (bench/checks-load.sql: a
# direct INSERT as the table owner, consistent with what the API writes, so
# every check must come out empty), then prints the EXPLAIN (ANALYZE,
# BUFFERS) plan of outbox.conservation and the median time of REPEATS runs of
# the whole view and of each check view alone, with JIT on (the server
# default) and off.  Run as root on a fresh machine (it builds and installs,
# then runs the server as the postgres OS user) or as postgres.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
. "$ROOT/test/lib.sh"

N=${1:-1000000}
REPEATS=${REPEATS:-5}

# The background worker is parked (a nap of an hour; nothing wakes it, as
# the load bypasses the API): its rounds would compete with the measured
# queries for the two cores.
outbox_bench_start bench-checks "outbox.naptime = 3600000" || { echo "cluster failed to start" >&2; exit 1; }
cp "$ROOT/bench/checks-load.sql" "$WORK/"
outbox_give_to_pg_user "$WORK"
PSQL="'$PGBIN/psql' -X -q -h '$DATA' -p $PORT -d postgres -v ON_ERROR_STOP=1"

as_pg "$PSQL -c 'CREATE EXTENSION outbox'"
echo "== loading $N commands (+ $((N / 10)) purged)"
start=$(date +%s)
as_pg "$PSQL -v n=$N -f '$WORK/checks-load.sql'" >/dev/null
echo "loaded in $(( $(date +%s) - start )) s"
as_pg "$PSQL -At -c \"SELECT 'commands ' || (SELECT count(*) FROM outbox.commands)
	|| ', events ' || (SELECT count(*) FROM outbox.events)
	|| ', receipts ' || (SELECT count(*) FROM outbox.receipts)
	|| ', tombstones ' || (SELECT count(*) FROM outbox.purged)
	|| ', commands size ' || pg_size_pretty(pg_total_relation_size('outbox.commands'))\""

echo
echo "== SELECT * FROM outbox.conservation"
as_pg "$PSQL -c 'SELECT check_name, severity, violations, sample FROM outbox.conservation'"

echo "== EXPLAIN (ANALYZE, BUFFERS) SELECT * FROM outbox.conservation"
as_pg "$PSQL -c 'SELECT count(*) FROM outbox.conservation' >/dev/null"	# warm the cache
as_pg "$PSQL -c 'EXPLAIN (ANALYZE, BUFFERS) SELECT * FROM outbox.conservation'"

# Median of REPEATS runs of one query, in ms: median SETTINGS QUERY
median() {
	local settings=$1 query=$2 script i
	script="$settings
\\timing on"
	for i in $(seq 0 "$REPEATS"); do
		script="$script
SELECT count(*) FROM ($query) AS q;"
	done
	# The first run warms up and is dropped.
	as_pg "$PSQL -At" <<<"$script" | sed -n 's/^Time: \([0-9.]*\) ms.*/\1/p' | tail -n +2 |
		sort -n | awk '{ v[NR] = $1 } END { if (NR % 2) printf "%.0f", v[(NR + 1) / 2];
			else printf "%.0f", (v[NR / 2] + v[NR / 2 + 1]) / 2 }'
}

echo "== median of $REPEATS runs, ms"
printf '%-40s %10s %10s\n' query "jit on" "jit off"
for q in conservation check_decisions_without_command check_orphan_commands check_orphan_receipts \
	check_state check_receipt_overdue backlog leases dead_letters; do
	printf '%-40s %10s %10s\n' "outbox.$q" \
		"$(median 'SET jit = on;' "SELECT * FROM outbox.$q")" \
		"$(median 'SET jit = off;' "SELECT * FROM outbox.$q")"
done

outbox_stop_cluster "$DATA"
