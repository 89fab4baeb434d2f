# Helpers shared by the benchmarks (sourced after test/lib.sh and
# outbox_bench_start, which set PGBIN, DATA and PORT): the psql call, the
# median, loading committed commands (into outbox.commands or a stream),
# the hand-written claim + DELETE baseline of bench/lease.sh, the
# producer's scripts of bench/produce.sh, and a server's CPU time.

# Run SQL from the argument on database BENCH_DB (default bench), quietly.
psql_q() {
	as_pg "'$PGBIN/psql' -X -qAt -h '$DATA' -p $PORT -d ${BENCH_DB:-bench} -v ON_ERROR_STOP=1" <<<"$1"
}

# The median of the numbers on stdin, one a line.
median() {
	sort -g | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }'
}

# Commit $1 decisions of kind ${2:-k} through outbox.commit_decisions (set-based,
# 5,000 per call), command ids PREFIX-g (${3:-cmd}), runs of 100.
bench_commit_commands() {
	local n=$1 kind=${2:-k} prefix=${3:-cmd}
	psql_q "SELECT count(*)
  FROM (SELECT g / 5000 AS chunk,
               jsonb_agg(jsonb_build_object('run_id', '$prefix-run-' || (g / 100), 'seq', g, 'event_kind', 'decided',
                                            'command_id', '$prefix-' || g, 'command_kind', '$kind',
                                            'payload', jsonb_build_object('n', g, 'to', 'someone@example.org'))) AS d
          FROM generate_series(1, $n) g GROUP BY 1) b,
       LATERAL outbox.commit_decisions(b.d);" >/dev/null
}

# The same in transactions of $4 decisions, each followed by the SQL $5 in a
# transaction of its own (a stream's tick: outbox.tick_streams()), from one
# psql script in $WORK.
bench_commit_chunks() {
	local n=$1 kind=$2 prefix=$3 chunk=$4 after=$5 i
	for ((i = 0; i < n; i += chunk)); do
		echo "SELECT count(*) FROM (SELECT jsonb_agg(jsonb_build_object('run_id', '$prefix-run-' || (g / 100), 'seq', g, 'event_kind', 'decided',
       'command_id', '$prefix-' || g, 'command_kind', '$kind',
       'payload', jsonb_build_object('n', g, 'to', 'someone@example.org'))) AS d
  FROM generate_series($i + 1, least($i + $chunk, $n)) g) b, LATERAL outbox.commit_decisions(b.d);"
		echo "$after"
	done >"$WORK/chunks.sql"
	outbox_give_to_pg_user "$WORK"
	as_pg "'$PGBIN/psql' -X -qAt -h '$DATA' -p $PORT -d ${BENCH_DB:-bench} -v ON_ERROR_STOP=1 -f '$WORK/chunks.sql'" >/dev/null
}

# A fresh stream of ${PARTS:-8} partitions (each cell of a benchmark has its
# own, so that no cell reads another's log): bench_stream_new NAME BATCH;
# kind NAME-k is written once into it, read by subscription NAME.
bench_stream_new() {
	psql_q "SELECT outbox.create_stream('$1', ${PARTS:-8}, $2);
SELECT outbox.create_subscription('$1', '$1');
SELECT outbox.set_policy('$1-k', stream => '$1');" >/dev/null
}

# Commit $2 commands of stream $1's kind in transactions of $3, a tick of
# the streams cut after each (as the worker does when commits wake it), so
# that the batches have about the stream's batch_size per partition.
bench_load_stream() {
	local _
	bench_commit_chunks "$2" "$1-k" "$1" "$3" "SELECT outbox.tick_streams();" || return 1
	# A tick skips a stream the worker is ticking, and the worker's tick is
	# seen when its transaction ends: wait until a committed tick covers
	# the whole load (--drain stops at the first claim that finds nothing).
	for _ in $(seq 100); do
		[ "$(psql_q "SELECT outbox.tick_streams() * 0 + count(*) FROM outbox.streams t
 WHERE t.stream = '$1' AND (SELECT max(k.last_id) FROM outbox.stream_ticks k WHERE k.stream_id = t.stream_id)
   >= (SELECT max(l.id) FROM outbox._stream_log l WHERE l.stream_id = t.stream_id)")" = 1 ] && return 0
		sleep 0.1
	done
	echo "stream $1 not covered by a tick after 10 s" >&2
	return 1
}

# The hand-written baseline: a table with the columns of outbox.commands, a
# plain text key and the classic partial index on pending rows.
bench_baseline_table() {
	psql_q "CREATE TABLE bq (LIKE outbox.commands INCLUDING DEFAULTS) WITH (fillfactor = 80);
ALTER TABLE bq ALTER command_id TYPE text COLLATE \"default\";
-- (outbox.commands keeps its value rules in domains; the baselines have
-- plain columns and no checks, as a hand-written table would)
ALTER TABLE bq ALTER status TYPE text, ALTER version TYPE bigint, ALTER deliveries TYPE integer;
ALTER TABLE bq ADD PRIMARY KEY (command_id);
CREATE INDEX bq_pending ON bq (priority DESC, available_at, created_at) WHERE status = 'pending';"
}

# Its claim of :batch commands for worker 'w' || :client_id (pgbench syntax,
# the ids into :ids).
BENCH_BASE_CLAIM="WITH c AS (UPDATE bq SET status = 'sending', owner = 'w' || :client_id, lease_until = now() + interval '10 minutes', version = version + 1, deliveries = deliveries + 1 WHERE command_id = ANY (ARRAY(SELECT command_id FROM bq WHERE status = 'pending' AND available_at <= now() ORDER BY priority DESC, available_at, created_at LIMIT :batch FOR UPDATE SKIP LOCKED)) RETURNING command_id, run_id, kind, payload, version, deliveries, lease_until) SELECT array_agg(command_id) AS ids FROM c \\gset"

# The claim + DELETE loop into file $1.
bench_delete_script() {
	printf '%s\n%s\n' "$BENCH_BASE_CLAIM" "DELETE FROM bq WHERE command_id = ANY (:ids::text[]);" >"$1"
}

# bench/produce.sh's single decision as a pgbench script, into file $1: the
# business row's id names the decision.
bench_decision_script() {
	cat >"$1" <<'SQL'
BEGIN;
INSERT INTO biz (customer, amount) VALUES ('c' || :client_id, 900) RETURNING id \gset
SELECT outbox.commit_decision('run-' || :id, 1, 'trip_requested', 'cmd-' || :id, 'lock_budget', '{"amount": 900, "to": "budget"}');
COMMIT;
SQL
}

# The text of bench/produce.sh's batch: 100 decisions of run run-ID as
# JSON, for format() (%1$s is the id): objects when $1 is "objects", else
# each decision an array of its values (commit_decision's order).
bench_batch_json() {
	local g
	printf '['
	for g in $(seq 100); do
		[ "$g" -gt 1 ] && printf ', '
		if [ "$1" = objects ]; then
			printf '{"run_id": "run-%%1$s", "seq": %d, "event_kind": "trip_requested", "command_id": "cmd-%%1$s-%d", "command_kind": "lock_budget", "payload": {"amount": 900, "to": "budget"}}' "$g" "$g"
		else
			printf '["run-%%1$s", %d, "trip_requested", "cmd-%%1$s-%d", "lock_budget", {"amount": 900, "to": "budget"}]' "$g" "$g"
		fi
	done
	printf ']'
}

# CPU time (clock ticks) the cluster of data directory $1 has used so far:
# its postmaster's own and that of its children that ended (cutime,
# cstime: every backend that exited), plus that of the children still
# running.
bench_server_ticks() {
	local pm c
	pm=$(head -1 "$1/postmaster.pid")
	{
		awk '{ print $14 + $15 + $16 + $17 }' "/proc/$pm/stat"
		for c in $(ps -o pid= --ppid "$pm"); do
			awk '{ print $14 + $15 }' "/proc/$c/stat" 2>/dev/null
		done
	} | awk '{ s += $1 } END { print s + 0 }'
}
