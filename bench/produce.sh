#!/usr/bin/env bash
# The producer's cost: a business transaction that decides a command through
# outbox.commit_decision, against the same business row plus an event row and
# a command row written by hand, in the same run, on a throwaway cluster.
# Not a test: it prints numbers.
#
#   bash bench/produce.sh             # full run (about 8 minutes on 2 cores)
#   QUICK=1 bash bench/produce.sh     # one repeat, 4-second cells
#
# Single decisions: pgbench -M prepared, synchronous commit on, one
# transaction each:
#   outbox   BEGIN; INSERT INTO biz ... RETURNING id;
#            SELECT outbox.commit_decision(...); COMMIT
#   hand     BEGIN; INSERT INTO biz ... RETURNING id;
#            WITH e AS (INSERT INTO hand_events ... RETURNING 1)
#            INSERT INTO hand_commands ... SELECT ... FROM e; COMMIT
# hand_events and hand_commands have the extension's shape exactly (LIKE
# ... INCLUDING ALL: the same columns and domains, "C" keys, primary keys,
# unique and partial indexes, and the same fillfactor).
# Batches: outbox.commit_decisions of 100 decisions per call against one
# multi-row INSERT of 100 events and 100 commands by hand.
# BATCH_ARG says how the 100 decisions reach commit_decisions: "text"
# (JSON text of 100 objects put together by format(), the default), "rows"
# (the same with each decision an array of its values) or "agg" (built by
# jsonb_agg in SQL).
# Each cell runs CLIENTS_LIST = "1 4 8" clients, DURATION seconds per
# system, the systems taking turns within each of REPEATS repeats; the
# medians are reported with their ratio outbox / hand, and the median of the
# REPEATS ratios of the two runs of one repeat ("paired"), which the drift
# of a shared machine's load between repeats disturbs less.  It runs twice: with the
# library preloaded and the background worker serving the database (as in
# production), and without the library preloaded.
set -u
set -o pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
. "$ROOT/test/lib.sh"
. "$ROOT/bench/lib.sh"

REPEATS=${REPEATS:-3}
DURATION=${DURATION:-10}
CLIENTS_LIST=${CLIENTS_LIST:-"1 4 8"}
MODES=${MODES:-"preloaded plain"}
BATCH_ARG=${BATCH_ARG:-text}
if [ -n "${QUICK:-}" ]; then
	REPEATS=1
	DURATION=4
fi

outbox_bench_start produce "outbox.databases = 'bench'
synchronous_commit = on" || exit 1

as_pg "'$PGBIN/createdb' -h '$DATA' -p $PORT bench"
psql_q "CREATE EXTENSION outbox;
CREATE TABLE biz (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, customer text NOT NULL, amount int NOT NULL);
CREATE TABLE hand_biz (LIKE biz INCLUDING ALL);
CREATE TABLE hand_events (LIKE outbox.events INCLUDING ALL);
CREATE TABLE hand_commands (LIKE outbox.commands INCLUDING ALL) WITH (fillfactor = 80);"

# pgbench scripts.  The business row's id names the decision in both.
bench_decision_script "$WORK/outbox.sql"
cat >"$WORK/hand.sql" <<'EOF'
BEGIN;
INSERT INTO hand_biz (customer, amount) VALUES ('c' || :client_id, 900) RETURNING id \gset
WITH e AS (INSERT INTO hand_events (run_id, seq, kind, payload, command_id) VALUES ('run-' || :id, 1, 'trip_requested', NULL, 'cmd-' || :id) RETURNING 1) INSERT INTO hand_commands (command_id, run_id, seq, kind, payload, priority, available_at, due_at) SELECT 'cmd-' || :id, 'run-' || :id, 1, 'lock_budget', '{"amount": 900, "to": "budget"}', 0, now(), now() FROM e;
COMMIT;
EOF
if [ "$BATCH_ARG" = agg ]; then
	cat >"$WORK/outbox-batch.sql" <<'EOF'
BEGIN;
INSERT INTO biz (customer, amount) VALUES ('c' || :client_id, 900) RETURNING id \gset
SELECT count(*) FROM outbox.commit_decisions((SELECT jsonb_agg(jsonb_build_object('run_id', 'run-' || :id, 'seq', g, 'event_kind', 'trip_requested', 'command_id', 'cmd-' || :id || '-' || g, 'command_kind', 'lock_budget', 'payload', '{"amount": 900, "to": "budget"}'::jsonb)) FROM generate_series(1, 100) g));
COMMIT;
EOF
elif [ "$BATCH_ARG" = rows ]; then
	# the same JSON text with each decision an array of its values
	# (commit_decision's order) instead of an object
	{
		echo 'BEGIN;'
		echo "INSERT INTO biz (customer, amount) VALUES ('c' || :client_id, 900) RETURNING id \\gset"
		echo "SELECT count(*) FROM outbox.commit_decisions(pg_catalog.format('$(bench_batch_json rows)', :id::text)::jsonb);"
		echo 'COMMIT;'
	} >"$WORK/outbox-batch.sql"
else
	# the array as a client sends it: JSON text, the business row's id
	# put into it by format() ($1 is that id, %1$s its every use)
	{
		echo 'BEGIN;'
		echo "INSERT INTO biz (customer, amount) VALUES ('c' || :client_id, 900) RETURNING id \\gset"
		echo "SELECT count(*) FROM outbox.commit_decisions(pg_catalog.format('$(bench_batch_json objects)', :id::text)::jsonb);"
		echo 'COMMIT;'
	} >"$WORK/outbox-batch.sql"
fi
cat >"$WORK/hand-batch.sql" <<'EOF'
BEGIN;
INSERT INTO hand_biz (customer, amount) VALUES ('c' || :client_id, 900) RETURNING id \gset
WITH e AS (INSERT INTO hand_events (run_id, seq, kind, payload, command_id) SELECT 'run-' || :id, g, 'trip_requested', NULL, 'cmd-' || :id || '-' || g FROM generate_series(1, 100) g RETURNING run_id, seq, command_id) INSERT INTO hand_commands (command_id, run_id, seq, kind, payload, priority, available_at, due_at) SELECT command_id, run_id, seq, 'lock_budget', '{"amount": 900, "to": "budget"}', 0, now(), now() FROM e;
COMMIT;
EOF
outbox_give_to_pg_user "$WORK"

# Empty every table and take a checkpoint, so that cells start alike.
reset_tables() {
	psql_q "TRUNCATE biz, hand_biz, hand_events, hand_commands, outbox.events, outbox.commands;
VACUUM ANALYZE biz, hand_biz, hand_events, hand_commands, outbox.events, outbox.commands;
CHECKPOINT;" >/dev/null
}

# One pgbench run of a script: prints transactions per second.
run_once() {
	local script=$1 clients=$2
	as_pg "cd '$WORK' && '$PGBIN/pgbench' -n -M prepared -h '$DATA' -p $PORT -c $clients -j $clients \
		-T $DURATION -f '$WORK/$script.sql' bench" 2>&1 | awk '/^tps = / {print $3; exit}'
}

# Restart the cluster with or without the library preloaded.
set_mode() {
	local conf="$DATA/postgresql.conf"
	if [ "$1" = preloaded ]; then
		sed -i "s/^shared_preload_libraries = .*/shared_preload_libraries = 'outbox'/" "$conf"
	else
		sed -i "s/^shared_preload_libraries = .*/shared_preload_libraries = ''/" "$conf"
	fi
	as_pg "'$PGBIN/pg_ctl' -D '$DATA' -m fast -w restart -l '$DATA/server.log'" >/dev/null
}

# cell MODE KIND CLIENTS: KIND is "" (single decisions) or "-batch".
cell() {
	local mode=$1 kind=$2 clients=$3 r o h os=() hs=() om hm pm unit=tx/s
	for r in $(seq "$REPEATS"); do
		reset_tables
		o=$(run_once "outbox$kind" "$clients")
		reset_tables
		h=$(run_once "hand$kind" "$clients")
		os+=("${o:-0}")
		hs+=("${h:-0}")
	done
	om=$(printf '%s\n' "${os[@]}" | median)
	hm=$(printf '%s\n' "${hs[@]}" | median)
	[ -n "$kind" ] && unit="tx/s of 100"
	pm=$(for r in $(seq 0 $((REPEATS - 1))); do
		awk -v o="${os[$r]}" -v h="${hs[$r]}" 'BEGIN {print (h > 0 ? o / h : 0)}'
	done | median)
	awk -v m="$mode" -v k="${kind:-single}" -v c="$clients" -v o="$om" -v h="$hm" -v u="$unit" -v p="$pm" \
		-v all="$(printf '%s/' "${os[@]}")|$(printf '%s/' "${hs[@]}")" \
		'BEGIN {printf "| %-9s | %-6s | %2d | %9.0f | %9.0f | %5.2f | %5.2f | %s %s\n", m, k, c, h, o, (h > 0 ? o / h : 0), p, u, all}'
}

echo "# bench/produce.sh: DURATION=${DURATION}s REPEATS=$REPEATS, median; ratio = outbox / hand"
echo "| mode      | calls  | clients | hand | outbox | ratio | paired | unit, runs (outbox|hand)"
for mode in $MODES; do
	set_mode "$mode"
	for c in $CLIENTS_LIST; do
		cell "$mode" "" "$c"
	done
	cell "$mode" "-batch" 1
	cell "$mode" "-batch" 4
done
