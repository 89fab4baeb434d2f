#!/usr/bin/env bash
# Benchmark of the database metrics (not a timed test): what one scrape of
# monitoring/queries.yaml costs on a large outbox.commands.
#
#   bash bench/monitoring.sh            # 1,000,000 commands
#   bash bench/monitoring.sh 100000     # another size
#   REPEATS=9 bash bench/monitoring.sh
#
# Starts a private cluster, loads N commands in two shapes and for each:
#   steady     bench/monitoring-load.sql: 98.5% published with receipts, the
#              backlog (1% pending, 0.2% sending, 0.3% dead and uncertain)
#              the newest rows, as in an outbox that keeps up;
#   scattered  bench/checks-load.sql: 10% pending, 5% sending, 5% dead and
#              uncertain, spread evenly over the table (a large backlog in
#              the worst order for the heap).
# Prints the plan of outbox.metrics_backlog()'s query (EXPLAIN ANALYZE of
# its body), names the queries of queries.yaml and queries-checks.yaml that
# read outbox.commands with a sequential scan (only outbox_conservation,
# of queries-checks.yaml, should), the median time of each query over
# REPEATS runs as a role that is only a member of pg_monitor, the total of
# queries.yaml (the 15-second scrape), and the median time of a whole scrape
# of queries.yaml through prometheus-postgres-exporter (curl of /metrics).
# Run as root on a fresh machine or as postgres.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
. "$ROOT/test/lib.sh"

N=${1:-1000000}
REPEATS=${REPEATS:-7}

outbox_bench_start bench-monitoring "outbox.naptime = 3600000" || { echo "cluster failed to start" >&2; exit 1; }
EXPORTER_PID=
cleanup() {
	if [ -n "$EXPORTER_PID" ]; then kill "$EXPORTER_PID" 2>/dev/null || true; wait "$EXPORTER_PID" 2>/dev/null || true; fi
	outbox_cleanup_work "$WORK"
}
trap cleanup EXIT
cp "$ROOT/bench/monitoring-load.sql" "$ROOT/bench/checks-load.sql" "$ROOT/monitoring/queries.yaml" \
	"$ROOT/monitoring/queries-checks.yaml" "$WORK/"
outbox_give_to_pg_user "$WORK"
PSQL="'$PGBIN/psql' -X -q -h '$DATA' -p $PORT -d postgres -v ON_ERROR_STOP=1"
as_pg "$PSQL -c 'CREATE EXTENSION outbox' -c 'CREATE ROLE bench_scraper LOGIN IN ROLE pg_monitor'"

# The queries of queries.yaml and queries-checks.yaml, one file each:
# $WORK/q/<name>.sql
mkdir -p "$WORK/q"
EXTRACT='
	my ($file, $dir) = @ARGV;
	open(my $fh, "<", $file) or die;
	my ($name, $q, $in);
	while (<$fh>) {
		if (/^([a-z_]+):\s*$/) { $name = $1; next; }
		if (/^  query: \|/) { $in = 1; $q = ""; next; }
		if ($in && /^    (.*)$/) { $q .= "$1\n"; next; }
		if ($in) { $in = 0; open(my $o, ">", "$dir/$name.sql") or die; print $o $q; close $o; }
	}'
perl -e "$EXTRACT" "$WORK/queries.yaml" "$WORK/q"
perl -e "$EXTRACT" "$WORK/queries-checks.yaml" "$WORK/q"
outbox_give_to_pg_user "$WORK"
QUERIES=$(cd "$WORK/q" && ls *.sql | sed 's/\.sql$//' | sort)

# Median of a column of numbers.
median() {
	sort -n | awk '{ v[NR] = $1 } END { if (NR % 2) printf "%.2f", v[(NR + 1) / 2];
		else printf "%.2f", (v[NR / 2] + v[NR / 2 + 1]) / 2 }'
}

# Median time in ms of REPEATS runs of query file $1 as the scraper (the
# first run warms up and is dropped).
time_query() {
	local f=$1 script="\\timing on" i
	for i in $(seq 0 "$REPEATS"); do
		script="$script
\\i $f"
	done
	as_pg "$PSQL -U bench_scraper -o /dev/null" <<<"$script" |
		sed -n 's/^Time: \([0-9.]*\) ms.*/\1/p' | tail -n +2 | median
}

run_shape() {
	local shape=$1 load=$2 total=0 q t
	echo
	echo "######## $shape: $N commands ($load)"
	as_pg "$PSQL -c 'TRUNCATE outbox.events, outbox.commands, outbox.receipts, outbox.purged'"
	start=$(date +%s)
	as_pg "$PSQL -v n=$N -f '$WORK/$load'" >/dev/null
	echo "loaded in $(( $(date +%s) - start )) s"
	as_pg "$PSQL -At -F ' ' -c \"SELECT status, count(*) FROM outbox.commands GROUP BY 1 ORDER BY 1\"" | tr '\n' ';'
	echo

	echo "== EXPLAIN (ANALYZE, BUFFERS) of the query of outbox.metrics_backlog()"
	as_pg "$PSQL -At -c \"SELECT 'EXPLAIN (ANALYZE, BUFFERS, COSTS OFF) ' || prosrc FROM pg_proc
		WHERE oid = 'outbox.metrics_backlog()'::regprocedure\"" > "$WORK/explain.sql"
	outbox_give_to_pg_user "$WORK"
	as_pg "$PSQL -f '$WORK/explain.sql'" | tee "$WORK/plan-$shape.txt"

	# Which queries read outbox.commands with a sequential scan?  (The
	# function's body above, and each query of queries.yaml as it is.)
	local seqs=""
	grep -q 'Seq Scan on commands' "$WORK/plan-$shape.txt" && seqs="metrics_backlog "
	for q in $QUERIES; do
		{ echo "EXPLAIN (COSTS OFF)"; cat "$WORK/q/$q.sql"; } > "$WORK/explain-$q.sql"
		outbox_give_to_pg_user "$WORK"
		as_pg "$PSQL -f '$WORK/explain-$q.sql'" > "$WORK/plan-$shape-$q.txt"
		grep -q 'Seq Scan on commands' "$WORK/plan-$shape-$q.txt" && seqs="$seqs$q "
	done
	echo "queries reading outbox.commands with a sequential scan: ${seqs:-none}"

	echo "== median of $REPEATS runs as a pg_monitor member, ms"
	for q in $QUERIES; do
		t=$(time_query "$WORK/q/$q.sql")
		printf '  %-22s %8s\n' "$q" "$t"
		[ "$q" = outbox_conservation ] || total=$(awk -v a="$total" -v b="$t" 'BEGIN { print a + b }')
	done
	printf '  %-22s %8s\n' "queries.yaml, total" "$total"

	# A real scrape through the exporter.
	local eport
	eport=$(outbox_free_port)
	DATA_SOURCE_NAME="host=$DATA port=$PORT user=bench_scraper dbname=postgres sslmode=disable" \
		prometheus-postgres-exporter --extend.query-path="$WORK/queries.yaml" \
		--web.listen-address=127.0.0.1:"$eport" --disable-default-metrics --disable-settings-metrics \
		>"$WORK/exporter.log" 2>&1 &
	EXPORTER_PID=$!
	outbox_wait_port "$eport" || { echo "exporter did not start"; cat "$WORK/exporter.log"; return 1; }
	curl -s -o /dev/null "http://127.0.0.1:$eport/metrics"	# connects
	for _ in $(seq "$REPEATS"); do
		curl -s -o /dev/null -w '%{time_total}\n' "http://127.0.0.1:$eport/metrics"
	done | awk '{ print $1 * 1000 }' | median | xargs printf '  %-22s %8s\n' "exporter scrape"
	echo
	curl -s "http://127.0.0.1:$eport/metrics" | grep -c '^outbox_' | xargs echo "  outbox series exported:"
	kill "$EXPORTER_PID"; wait "$EXPORTER_PID" 2>/dev/null || true; EXPORTER_PID=
}

run_shape steady monitoring-load.sql
run_shape scattered checks-load.sql
outbox_stop_cluster "$DATA"
