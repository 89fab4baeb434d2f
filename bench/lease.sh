#!/usr/bin/env bash
# Relay throughput, backlog growth and table health of the lease protocol,
# side by side with hand-written SQL baselines on the same table shape, in
# the same run, on a throwaway cluster.  Not a test: it prints numbers.
#
#   bash bench/lease.sh            # full run (about 10 minutes on 2 cores)
#   QUICK=1 bash bench/lease.sh    # one repeat, smaller sizes
#
# Throughput: commands per second through "claim a batch of B, then ack the
# batch" (two statements, two transactions), at B = 1, 10, 100 and 1, 2, 4
# concurrent publishers, median of 3 repeats, from a preloaded backlog of
# 200,000 pending commands (at B = 1 and 10 each run drains part of it).
#   outbox        outbox.claim + outbox.ack_many(worker, tokens[])
#   mark          UPDATE ... WHERE id = ANY(ARRAY(SELECT ... FOR UPDATE SKIP LOCKED))
#                 then UPDATE ... SET status = 'published' WHERE id = ANY(ids)
#   delete        the same claim, then DELETE ... WHERE id = ANY(ids)
#   mark-in       the textbook WHERE id IN (SELECT ...) claim (a warning)
#   mark-c        mark on a table whose key has the "C" collation, as
#                 outbox.commands has (B = 100 only)
# The mark, delete and mark-in baselines keep the textbook key: text in the
# database's default collation.
set -u
set -o pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
. "$ROOT/test/lib.sh"
. "$ROOT/bench/lib.sh"

REPEATS=${REPEATS:-3}
# ONLY=throughput|latency|health|plans runs one part; BATCHES, CLIENTS and
# SYSTEMS (for example "outbox delete") narrow the throughput part,
# KEY_SHAPES ("ordered", "scattered" or both) and SIZES the latency part.
ONLY=${ONLY:-}
BACKLOG=${BACKLOG:-200000}
SIZES=${SIZES:-"10000 100000 1000000"}
if [ -n "${QUICK:-}" ]; then
	REPEATS=1
	BACKLOG=50000
	SIZES="10000 100000"
fi

outbox_bench_start bench || exit 1
# The benchmark measures the SQL API alone: keep the background worker's
# sweep and purge out of the numbers (it naps for an hour).
as_pg "'$PGBIN/psql' -X -q -h '$DATA' -p $PORT -d postgres -c \"ALTER SYSTEM SET outbox.naptime = '1h'\" -c 'SELECT pg_reload_conf()'" >/dev/null

as_pg "'$PGBIN/createdb' -h '$DATA' -p $PORT bench"
# The baseline (bench/lib.sh): the same columns, a plain text key, the
# classic partial index on pending rows.
psql_q "CREATE EXTENSION outbox;" && bench_baseline_table || exit 1
psql_q "-- The same baseline with the key in the \"C\" collation, as outbox.commands
-- has it: shows how much of the difference is the key's collation.
CREATE TABLE bqc (LIKE bq INCLUDING DEFAULTS) WITH (fillfactor = 80);
ALTER TABLE bqc ALTER command_id TYPE text COLLATE \"C\";
ALTER TABLE bqc ADD PRIMARY KEY (command_id);
CREATE INDEX bqc_pending ON bqc (priority DESC, available_at, created_at) WHERE status = 'pending';"

# The table a system works on.
table_of() {
	case $1 in
	outbox) echo outbox.commands ;;
	mark-c) echo bqc ;;
	*) echo bq ;;
	esac
}

# The command ids a load gives: "scattered" ('cmd-1', 'cmd-2', ...: text
# order puts commands created one after another far apart in the primary
# key) or "ordered" ('cmd-00000001', ...: creation order, as time-ordered
# ids such as UUIDv7 or a zero-padded sequence have).
KEYS=scattered
key_expr() {
	case $KEYS in
	ordered) echo "'cmd-' || lpad(g::text, 8, '0')" ;;
	*) echo "'cmd-' || g" ;;
	esac
}

# Load N pending commands into the system's table, vacuum it, and take a
# checkpoint, so that no run starts with (or is interrupted by) the
# checkpoint the previous loads' WAL would bring.
load() {
	local system=$1 n=$2 t
	t=$(table_of "$system")
	if [ "$system" = outbox ]; then
		psql_q "TRUNCATE outbox.commands;
INSERT INTO outbox.commands (command_id, run_id, seq, kind, payload, available_at, due_at, created_at)
SELECT $(key_expr), 'run-' || (g / 10), g, 'k', jsonb_build_object('n', g, 'to', 'someone@example.org'),
       now() - interval '1 minute', now() - interval '1 minute', now() - interval '1 minute' + g * interval '1 microsecond'
  FROM generate_series(1, $n) g;
VACUUM ANALYZE outbox.commands;
CHECKPOINT;"
	else
		psql_q "TRUNCATE $t;
INSERT INTO $t (command_id, run_id, seq, kind, payload, available_at, created_at)
SELECT $(key_expr), 'run-' || (g / 10), g, 'k', jsonb_build_object('n', g, 'to', 'someone@example.org'),
       now() - interval '1 minute', now() - interval '1 minute' + g * interval '1 microsecond'
  FROM generate_series(1, $n) g;
VACUUM ANALYZE $t;
CHECKPOINT;"
	fi
}

# pgbench scripts: claim a batch (one transaction), ack it (another).
cat >"$WORK/outbox.sql" <<'EOF'
SELECT array_agg(token) AS toks FROM outbox.claim('w' || :client_id, :batch, interval '10 minutes') \gset
SELECT count(*) FROM outbox.ack_many('w' || :client_id, ':toks') WHERE acked;
EOF
BASE_CLAIM=$BENCH_BASE_CLAIM
BASE_CLAIM_IN="WITH c AS (UPDATE bq SET status = 'sending', owner = 'w' || :client_id, lease_until = now() + interval '10 minutes', version = version + 1, deliveries = deliveries + 1 WHERE command_id IN (SELECT command_id FROM bq WHERE status = 'pending' AND available_at <= now() ORDER BY priority DESC, available_at, created_at LIMIT :batch FOR UPDATE SKIP LOCKED) RETURNING command_id, run_id, kind, payload, version, deliveries, lease_until) SELECT array_agg(command_id) AS ids FROM c \\gset"
printf '%s\n%s\n' "$BASE_CLAIM" "UPDATE bq SET status = 'published', published_at = now(), lease_until = NULL, version = version + 1 WHERE command_id = ANY (:ids::text[]);" >"$WORK/mark.sql"
bench_delete_script "$WORK/delete.sql"
printf '%s\n%s\n' "${BASE_CLAIM//bq/bqc}" "UPDATE bqc SET status = 'published', published_at = now(), lease_until = NULL, version = version + 1 WHERE command_id = ANY (:ids::text[]);" >"$WORK/mark-c.sql"
printf '%s\n%s\n' "$BASE_CLAIM_IN" "UPDATE bq SET status = 'published', published_at = now(), lease_until = NULL, version = version + 1 WHERE command_id = ANY (:ids::text[]);" >"$WORK/mark-in.sql"
outbox_give_to_pg_user "$WORK"

# One run: prints commands per second.
run_once() {
	local system=$1 batch=$2 clients=$3 drain tx tps
	drain=$BACKLOG
	[ "$batch" -eq 10 ] && drain=$((BACKLOG / 4))
	[ "$batch" -eq 1 ] && drain=$((BACKLOG / 20))
	tx=$((drain / batch / clients))
	load "$system" "$BACKLOG"
	tps=$(as_pg "cd '$WORK' && '$PGBIN/pgbench' -n -M prepared -h '$DATA' -p $PORT -c $clients -j $clients \
		-t $tx -D batch=$batch -f '$WORK/$system.sql' bench" 2>&1 |
		awk '/^tps = / {print $3; exit}')
	awk -v t="${tps:-0}" -v b="$batch" 'BEGIN {printf "%.0f\n", t * b}'
}

if [ -z "$ONLY" ] || [ "$ONLY" = throughput ]; then
echo "== relay throughput, commands/s (median of $REPEATS; backlog $BACKLOG)"
printf '%-4s %-3s %10s %10s %10s %10s %10s %9s %11s %11s\n' B P outbox mark delete mark-in mark-c "vs mark" "vs delete" "vs mark-c"
for batch in ${BATCHES:-1 10 100}; do
	for clients in ${CLIENTS:-1 2 4}; do
		# The systems take turns within each repeat, so that a drift of the
		# machine's speed during the run weighs on all of them alike.
		declare -A res=() runs=()
		for r in $(seq "$REPEATS"); do
			for system in ${SYSTEMS:-outbox mark delete mark-in mark-c}; do
				if [ "${system#mark-}" != "$system" ] && [ "$batch" -ne 100 ]; then
					continue
				fi
				runs[$system]+="$(run_once "$system" "$batch" "$clients") "
			done
		done
		for system in outbox mark delete mark-in mark-c; do
			if [ -n "${runs[$system]:-}" ]; then
				res[$system]=$(printf '%s\n' ${runs[$system]} | median)
			else
				res[$system]=-
			fi
		done
		printf '%-4s %-3s %10s %10s %10s %10s %10s %9.2f %11.2f %11s\n' "$batch" "$clients" \
			"${res[outbox]}" "${res[mark]}" "${res[delete]}" "${res[mark-in]}" "${res[mark-c]}" \
			"$(awk -v a="${res[outbox]}" -v b="${res[mark]}" 'BEGIN {print (b > 0 ? a / b : 0)}')" \
			"$(awk -v a="${res[outbox]}" -v b="${res[delete]}" 'BEGIN {print (b > 0 ? a / b : 0)}')" \
			"$(awk -v a="${res[outbox]}" -v b="${res[mark-c]}" 'BEGIN {print (b > 0 ? sprintf("%.2f", a / b) : "-")}')"
	done
done

fi

# Latency of one claim of 100 at several backlog sizes: psql \timing over
# 300 claim + ack rounds, claim times only.
claim_latency() {
	local system=$1 n=$2 f i rounds=300 warm=5 loads=1 l
	f="$WORK/lat-$system.sql"
	# Never drain the backlog: every measured claim finds 100 commands, so a
	# small backlog is loaded afresh as many times as it takes to measure
	# about 300 claims (10,000 pending: 4 loads of 90 rounds).  The first
	# $warm rounds of each session (plan preparation, cold caches) are run
	# but not counted, for both systems.
	[ $((n / 100 - 10)) -lt $rounds ] && rounds=$((n / 100 - 10))
	loads=$(((300 + rounds - 1) / rounds))
	: >"$f"
	for i in $(seq $rounds); do
		if [ "$system" = outbox ]; then
			echo "SELECT array_agg(token) AS toks FROM outbox.claim('w', 100, interval '10 minutes') \\gset"
			echo "SELECT count(*) FROM outbox.ack_many('w', :'toks') WHERE acked;"
		else
			echo "${BASE_CLAIM//:client_id/1}" | sed 's/:batch/100/'
			echo "UPDATE bq SET status = 'published', published_at = now(), lease_until = NULL, version = version + 1 WHERE command_id = ANY (:'ids'::text[]);"
		fi
	done >>"$f"
	outbox_give_to_pg_user "$f"
	for l in $(seq $loads); do
		load "$system" "$n"
		as_pg "'$PGBIN/psql' -X -q -h '$DATA' -p $PORT -d bench -c '\\timing on' -f '$f'" |
			awk -v warm=$warm '/^Time: / {n++; if (n % 2 == 1 && n > 2 * warm) print $2}'
	done | sort -n |
		awk '{a[NR] = $1} END {printf "%.3f %.3f (n=%d)\n", a[int(NR * 0.5)], a[int(NR * 0.99)], NR}'
}

if [ -z "$ONLY" ] || [ "$ONLY" = latency ]; then
echo
echo "== one claim of 100: p50 / p99 in ms (about 300 claims, each followed by its ack; 5 warm-up rounds per session not counted)"
# Every claim's update adds a primary-key entry per row, on the leaf page
# of the command's id: with ordered ids a claim of 100 touches a few such
# pages, with scattered ids up to 100, which a backlog of 1,000,000 does
# not keep in 256MB of shared_buffers.  Both shapes are measured.
for KEYS in ${KEY_SHAPES:-ordered scattered}; do
	printf '%-9s %-9s %24s %24s\n' ids pending outbox mark
	for n in $SIZES; do
		o=$(claim_latency outbox "$n")
		m=$(claim_latency mark "$n")
		printf '%-9s %-9s %24s %24s\n' "$KEYS" "$n" "$o" "$m"
	done
done
KEYS=scattered

fi

if [ -z "$ONLY" ] || [ "$ONLY" = health ]; then
echo
echo "== table health after draining $BACKLOG commands (claim 100 + ack, 4 publishers)"
for system in outbox mark; do
	run_once "$system" 100 4 >/dev/null
	t=$(table_of "$system")
	psql_q "SELECT pg_stat_force_next_flush();" >/dev/null
	psql_q "SELECT '$system: table ' || pg_size_pretty(pg_relation_size('$t'))
	     || ', indexes ' || (SELECT string_agg(indexrelid::regclass::text || ' ' || pg_size_pretty(pg_relation_size(indexrelid)), ', ')
	                          FROM pg_index WHERE indrelid = '$t'::regclass)
	     || ', dead tuples ' || n_dead_tup || ', updates ' || n_tup_upd || ' (HOT ' || n_tup_hot_upd || ')'
	   FROM pg_stat_user_tables WHERE relid = '$t'::regclass;"
done

fi

if [ -z "$ONLY" ] || [ "$ONLY" = plans ]; then
echo
echo "== plans of the hot statements on a filled table"
load outbox 100000
psql_q "PREPARE c(text, int) AS SELECT * FROM outbox.claim(\$1, \$2);
LOAD 'auto_explain';
SET auto_explain.log_min_duration = 0;
SET auto_explain.log_nested_statements = on;
SET auto_explain.log_analyze = on;
SET client_min_messages = log;
SET auto_explain.log_level = notice;
SELECT count(*) FROM outbox.claim('explain', 100);" 2>&1 | grep -E 'Index|Seq Scan|Tid Scan|TID Cond|Update on|Limit|LockRows|Sort' | head -30
fi
