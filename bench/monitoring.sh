#!/usr/bin/env bash
# Benchmark of the database metrics (not a timed test): what one scrape of
# monitoring/queries.yaml costs on a large outbox.commands.
#
#   bash bench/monitoring.sh            # 1,000,000 commands
#   bash bench/monitoring.sh 100000     # another size
#   REPEATS=9 bash bench/monitoring.sh
#   SHAPES=scattered WRITE_COST=0 bash bench/monitoring.sh    # one shape only
#   SHAPES= WREPEATS=5 bash bench/monitoring.sh               # the write cost only
#
# Starts a private cluster, loads N commands in two shapes and for each:
#   steady     bench/monitoring-load.sql: 98.5% published with receipts, the
#              backlog (1% pending, 0.2% sending, 0.3% dead and uncertain)
#              the newest rows, as in an outbox that keeps up;
#   scattered  bench/checks-load.sql: 10% pending, 5% sending, 5% dead and
#              uncertain, spread evenly over the table (a large backlog in
#              the worst order for the heap).
# Prints the plans of the queries of outbox.metrics_backlog() and
# outbox.metrics_checks() (EXPLAIN ANALYZE of their bodies), names the
# queries of queries.yaml that read outbox.commands with a sequential scan
# (none should), the median time of each query over REPEATS runs as a role
# that is only a member of pg_monitor, the total of queries.yaml (the
# 15-second scrape), and the median time of a whole scrape of queries.yaml
# through prometheus-postgres-exporter (curl of /metrics).  It also times
# one count of each conservation check as the background worker makes it
# (outbox._check_run, every outbox.check_interval).  The scattered shape is
# measured twice: as loaded (VACUUM has set the visibility map, so the
# index-only scan reads no heap page), and "churned", after an update of a
# fifth of the published rows has cleared the visibility map of almost
# every page (the heap is then read for every unfinished command, until
# autovacuum comes).
#
# Then the write cost of what the metrics add to the indexes (kind
# INCLUDEd in commands_claim_idx and commands_lease_idx, and
# commands_held_idx): in one run, the two systems taking turns within each
# of WREPEATS repeats, pgbench (CLIENTS clients, WDURATION seconds) decides commands
# one per transaction with outbox.commit_decision, then claims and acks
# them in batches of 10 (outbox.claim, outbox.ack_many), with those and
# without them; the median of the repeats' ratios with / without, and
# the WAL written per command.  WSYNC=off runs the cells with
# synchronous_commit off (CPU rather than fsync bound: a steadier ratio on
# a busy machine).
# WRITE_COST=0 skips it.
# Run as root on a fresh machine or as postgres.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
. "$ROOT/test/lib.sh"

N=${1:-1000000}
REPEATS=${REPEATS:-7}
SHAPES=${SHAPES-steady scattered}
WRITE_COST=${WRITE_COST:-1}
WREPEATS=${WREPEATS:-5}
WDURATION=${WDURATION:-6}
CLIENTS=${CLIENTS:-4}
WSYNC=${WSYNC:-on}

outbox_bench_start bench-monitoring "outbox.naptime = 3600000
outbox.check_interval = 3600000" || { echo "cluster failed to start" >&2; exit 1; }
EXPORTER_PID=
cleanup() {
	if [ -n "$EXPORTER_PID" ]; then kill "$EXPORTER_PID" 2>/dev/null || true; wait "$EXPORTER_PID" 2>/dev/null || true; fi
	outbox_cleanup_work "$WORK"
}
trap cleanup EXIT
cp "$ROOT/bench/monitoring-load.sql" "$ROOT/bench/checks-load.sql" "$ROOT/monitoring/queries.yaml" "$WORK/"
outbox_give_to_pg_user "$WORK"
PSQL="'$PGBIN/psql' -X -q -h '$DATA' -p $PORT -d postgres -v ON_ERROR_STOP=1"
as_pg "$PSQL -c 'CREATE EXTENSION outbox' -c 'CREATE ROLE bench_scraper LOGIN IN ROLE pg_monitor'"

# The queries of queries.yaml, one file each:
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
outbox_give_to_pg_user "$WORK"
QUERIES=$(cd "$WORK/q" && ls *.sql | sed 's/\.sql$//' | sort)

# One count of each check, as the worker makes it, with the times.
cat > "$WORK/checks-once.sql" <<'EOF'
\o /dev/null
SELECT outbox._check_run(i) FROM generate_series(1, 5) i;
\o
SELECT '  ' || rpad(check_name, 27) || to_char(duration_seconds * 1000, '99990.0')
  FROM outbox.check_results ORDER BY check_name;
SELECT '  ' || rpad('all five', 27) || to_char(sum(duration_seconds) * 1000, '99990.0')
  FROM outbox.check_results;
EOF
# A busy table between two autovacuums: a fifth of the published rows get
# a new version (the same values), which clears the visibility map of
# almost every page (the plans' "Heap Fetches" show it).
cat > "$WORK/churn.sql" <<'EOF'
UPDATE outbox.commands SET payload = payload
 WHERE status = 'published' AND hashtext(command_id) % 5 = 0;
EOF
# The indexes the metrics read, as 00_schema.sql makes them (kind INCLUDEd
# in both claim indexes, and commands_held_idx), and without them (the claim
# indexes without kind, no commands_held_idx): the write cost drops and
# makes them again.
cat > "$WORK/index-create.sql" <<'EOF'
DROP INDEX outbox.commands_claim_idx, outbox.commands_lease_idx;
CREATE INDEX commands_claim_idx ON outbox.commands
	(priority DESC, due_at, created_at) INCLUDE (kind) WHERE due_at IS NOT NULL;
CREATE INDEX commands_lease_idx ON outbox.commands (lease_until) INCLUDE (kind)
	WHERE status OPERATOR(pg_catalog.=) 'sending';
CREATE INDEX IF NOT EXISTS commands_held_idx ON outbox.commands (kind, status COLLATE pg_catalog."C")
	WHERE status OPERATOR(pg_catalog.=) ANY (ARRAY['dead', 'uncertain']::pg_catalog.text[])
	   OR (status OPERATOR(pg_catalog.=) 'pending' AND due_at IS NULL);
EOF
cat > "$WORK/index-drop.sql" <<'EOF'
DROP INDEX outbox.commands_claim_idx, outbox.commands_lease_idx;
DROP INDEX IF EXISTS outbox.commands_held_idx;
CREATE INDEX commands_claim_idx ON outbox.commands
	(priority DESC, due_at, created_at) WHERE due_at IS NOT NULL;
CREATE INDEX commands_lease_idx ON outbox.commands (lease_until)
	WHERE status OPERATOR(pg_catalog.=) 'sending';
EOF
cat > "$WORK/produce.sql" <<'EOF'
SELECT outbox.commit_decision('bench-' || (s / 100), s, 'decided', 'b-' || s, 'kind-' || (s % 7), '{"to": "someone@example.org"}') FROM nextval('bench_seq') s;
EOF
cat > "$WORK/claimack.sql" <<'EOF'
SELECT array_agg(token) AS toks FROM outbox.claim('w' || :client_id, 10, interval '10 minutes') \gset
SELECT count(*) FROM outbox.ack_many('w' || :client_id, ':toks') WHERE acked;
EOF
outbox_give_to_pg_user "$WORK"

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
	local shape=$1 load=$2
	echo
	echo "######## $shape: $N commands ($load)"
	as_pg "$PSQL -c 'TRUNCATE outbox.events, outbox.commands, outbox.receipts, outbox.purged'"
	start=$(date +%s)
	as_pg "$PSQL -v n=$N -f '$WORK/$load'" >/dev/null
	echo "loaded in $(( $(date +%s) - start )) s"
	as_pg "$PSQL -At -F ' ' -c \"SELECT status, count(*) FROM outbox.commands GROUP BY 1 ORDER BY 1\"" | tr '\n' ';'
	echo

	measure "$shape"

	echo "== one count of each conservation check by the worker's function (outbox._check_run), ms"
	as_pg "$PSQL -At -f '$WORK/checks-once.sql'"

	if [ "$shape" = scattered ]; then
		as_pg "$PSQL -At -f '$WORK/churn.sql'"
		measure "$shape-churned"
		echo "== the VACUUM that sets the visibility map again (what autovacuum does)"
		as_pg "$PSQL -c '\\timing on' -c 'VACUUM outbox.commands'" | sed -n 's/^Time: /  VACUUM outbox.commands: /p'
	fi
}

# The plans, the sequential scans and the times of the queries of
# queries.yaml, and scrapes through the exporter, for the table as it is.
measure() {
	local shape=$1 total=0 q t f
	echo
	echo "#### $shape"
	: > "$WORK/plan-$shape.txt"
	for f in metrics_backlog metrics_checks; do
		echo "== EXPLAIN (ANALYZE, BUFFERS, COSTS OFF) of the query of outbox.$f()"
		as_pg "$PSQL -At -c \"SELECT 'SET search_path = pg_catalog, pg_temp; EXPLAIN (ANALYZE, BUFFERS, COSTS OFF) ' || prosrc FROM pg_proc
			WHERE oid = 'outbox.$f()'::regprocedure\"" > "$WORK/explain.sql"
		outbox_give_to_pg_user "$WORK"
		as_pg "$PSQL -f '$WORK/explain.sql'" | tee -a "$WORK/plan-$shape.txt"
	done

	# Which queries read outbox.commands with a sequential scan?  (The
	# functions' bodies above, and each query of queries.yaml as it is.)
	local seqs=""
	grep -q 'Seq Scan on commands' "$WORK/plan-$shape.txt" && seqs="metrics_backlog/metrics_checks "
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
		total=$(awk -v a="$total" -v b="$t" 'BEGIN { print a + b }')
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

# The write cost of the metrics' indexes: the producer's and the
# relay's path, with and without them, in the same run.  Each repeat
# runs both (in alternating order); the ratio of a repeat compares two
# neighbouring cells, and the median of those ratios is reported with the
# WAL written per command (which does not depend on the machine's load).
write_cost() {
	local wpsql="'$PGBIN/psql' -X -q -h '$DATA' -p $PORT -d wcost -v ON_ERROR_STOP=1"
	local pgb="PGOPTIONS='-c synchronous_commit=$WSYNC' '$PGBIN/pgbench' -n -M prepared -h '$DATA' -p $PORT -c $CLIENTS -j $CLIENTS"
	local r v p c n tx l0 l1 l2 order
	echo
	echo "######## write cost of the metrics' indexes (kind in the claim indexes, commands_held_idx): $CLIENTS clients, $WDURATION s cells, $WREPEATS repeats, synchronous_commit $WSYNC"
	as_pg "$PSQL -c 'CREATE DATABASE wcost'"
	as_pg "$wpsql -c 'CREATE EXTENSION outbox' -c 'CREATE SEQUENCE bench_seq'"
	: > "$WORK/wcost.txt"
	outbox_give_to_pg_user "$WORK"
	for r in $(seq "$WREPEATS"); do
		order="with without"
		[ $((r % 2)) -eq 0 ] && order="without with"
		for v in $order; do
			as_pg "$wpsql -c 'TRUNCATE outbox.events, outbox.commands, outbox.receipts, outbox.purged'"
			if [ "$v" = with ]; then
				as_pg "$wpsql -f '$WORK/index-create.sql'"
			else
				as_pg "$wpsql -f '$WORK/index-drop.sql'"
			fi
			as_pg "$wpsql -c 'VACUUM ANALYZE outbox.commands' -c CHECKPOINT"
			l0=$(as_pg "$wpsql -At -c 'SELECT pg_current_wal_insert_lsn()'")
			p=$(as_pg "cd '$WORK' && $pgb -T $WDURATION -f '$WORK/produce.sql' wcost" 2>&1 |
				awk '/^tps = / { print $3; exit }')
			n=$(as_pg "$wpsql -At -c 'SELECT count(*) FROM outbox.commands'")
			l1=$(as_pg "$wpsql -At -c 'SELECT pg_current_wal_insert_lsn()'")
			tx=$(( n * 9 / 10 / 10 / CLIENTS ))
			c=$(as_pg "cd '$WORK' && $pgb -t $tx -f '$WORK/claimack.sql' wcost" 2>&1 |
				awk '/^tps = / { print $3 * 10; exit }')
			l2=$(as_pg "$wpsql -At -c \"SELECT round(pg_wal_lsn_diff('$l1', '$l0') / $n) || ' ' ||
				round(pg_wal_lsn_diff(pg_current_wal_insert_lsn(), '$l1') / ($tx * $CLIENTS * 10))\"")
			echo "$r $v ${p:-0} ${c:-0} $l2" >> "$WORK/wcost.txt"
			printf '  repeat %d  %-8s decided/s %7.0f (WAL %5s B each)   claimed and acked/s %7.0f (WAL %5s B each)\n' \
				"$r" "$v" "${p:-0}" "${l2% *}" "${c:-0}" "${l2#* }"
		done
	done
	as_pg "$wpsql -f '$WORK/index-create.sql'"
	# per repeat: with / without
	awk '{ k = $1; if ($2 == "with") { pw[k] = $3; cw[k] = $4 } else { po[k] = $3; co[k] = $4 } }
		END { for (k in pw) print pw[k] / po[k] }' "$WORK/wcost.txt" | median |
		xargs printf '  decided per second, with / without the index: median of the repeats'"'"' ratios %s\n'
	awk '{ k = $1; if ($2 == "with") { pw[k] = $3; cw[k] = $4 } else { po[k] = $3; co[k] = $4 } }
		END { for (k in cw) print cw[k] / co[k] }' "$WORK/wcost.txt" | median |
		xargs printf '  claimed and acked per second, with / without: median of the ratios %s\n'
	for v in with without; do
		printf '  WAL per command, %-7s decided %s B, claimed and acked %s B (medians)\n' "$v" \
			"$(awk -v v=$v '$2 == v { print $5 }' "$WORK/wcost.txt" | median)" \
			"$(awk -v v=$v '$2 == v { print $6 }' "$WORK/wcost.txt" | median)"
	done
}

for shape in $SHAPES; do
	case $shape in
		steady) run_shape steady monitoring-load.sql ;;
		scattered) run_shape scattered checks-load.sql ;;
		*) echo "unknown shape $shape" >&2; exit 2 ;;
	esac
done
[ "$WRITE_COST" = 0 ] || write_cost
outbox_stop_cluster "$DATA"
