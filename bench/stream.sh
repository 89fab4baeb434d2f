#!/usr/bin/env bash
# Streams (the write-once path) against the row-lease path, the
# hand-written claim + DELETE baseline and PgQ 3.5 (Debian's
# postgresql-15-pgq3), in the same run, on a throwaway cluster.  Not a
# test: it prints numbers; read the ratios.
#
#   bash bench/stream.sh            # full run
#   QUICK=1 bash bench/stream.sh    # one repeat, small sizes (a few minutes)
#
# Parts (ONLY=wal|throughput|produce|claim|latency runs one):
#   throughput  N committed commands drained at 1 and 4 publishers with
#               batches of 100 and 1,000, commands per second from the
#               start of the publishers to the end of the drain (wall
#               clock), median of REPEATS:
#                 delete        pgbench clients looping the hand-written
#                               claim + DELETE (bench/lib.sh, as bench/lease.sh)
#                 relay-rows    outbox-relay --sink stdout, row leases
#                 relay-stream  outbox-relay --stream --subscription, stdout
#                 pgq           one PgQ consumer in SQL (next_batch,
#                               get_batch_events, finish_batch; PgQ shares a
#                               queue between consumers only with pgq_coop,
#                               which Debian does not ship: 1 publisher only)
#   wal         WAL bytes per command (pg_current_wal_lsn() differences):
#               the producer alone, then producer + publisher + purge (row
#               leases: the commands completed, then outbox.purge) or
#               rotation (streams: outbox.rotate_streams; PgQ: its table
#               rotation)
#   produce     commit_decision per transaction into a stream kind against
#               a row-lease kind (and pgq.insert_event), pgbench CLIENTS
#               clients for PRODUCE_SECS, taking turns, median of REPEATS
#   claim       claim_batch + ack_batch latency (pgbench, 1 client, 20
#               batches of 100) with SIZES commands in the stream's log:
#               every size's stream loaded first, then the sizes measured
#               in turn, CLAIM_ROUNDS (3) rounds, in the same state of the
#               cluster (the load's own after-effects, checkpoints and
#               autovacuum, then weigh on every size alike)
#   latency     commit -> delivered p50/p99 at 200 and 2,000 commands/s,
#               row leases against a stream, through bench/latency.sh's
#               harness (producer, receiver, the relay's -vv trace)
#               and before it, on this script's cluster, PgQ's commit ->
#               consumed at the same rates with a tick every PGQ_TICKS ms
#               (ONLY=pgq-latency runs that alone)
# Settings: N (300,000; a stream drains 50,000 in under half a second, so
# that a smaller N measures the relays' start-up), BATCHES ("100 1000"), PUBLISHERS ("1 4"), REPEATS (3),
# PARTS (stream partitions, 8), CLIENTS (4), PRODUCE_SECS (8), SIZES
# ("10000 1000000"), CLAIM_ROUNDS (3), RATES ("200 2000"), PGQ_TICKS
# ("1 10 100"), LAT_SECS (10), SYSTEMS (the throughput rows), ONLY.
set -u
set -o pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
. "$ROOT/test/lib.sh"
# PgQ 3.5, the write-once reference, from the Debian archive.
OUTBOX_PACKAGES+=(postgresql-15-pgq3)

N=${N:-300000}
BATCHES=${BATCHES:-"100 1000"}
PUBLISHERS=${PUBLISHERS:-"1 4"}
REPEATS=${REPEATS:-3}
PARTS=${PARTS:-8}
CLIENTS=${CLIENTS:-4}
PRODUCE_SECS=${PRODUCE_SECS:-8}
SIZES=${SIZES:-"10000 1000000"}
RATES=${RATES:-"200 2000"}
PGQ_TICKS=${PGQ_TICKS:-"1 10 100"}
LAT_SECS=${LAT_SECS:-10}
ONLY=${ONLY:-}
SYSTEMS=${SYSTEMS:-"delete relay-rows relay-stream pgq"}
if [ -n "${QUICK:-}" ]; then
	N=10000
	REPEATS=1
	PRODUCE_SECS=3
	SIZES="10000 100000"
	LAT_SECS=4
fi

# With OUTBOX_SKIP_BUILD the package is not installed by outbox_setup.
if [ -n "${OUTBOX_SKIP_BUILD:-}" ] && ! dpkg-query -W -f='${Status}' postgresql-15-pgq3 2>/dev/null | grep -q "install ok installed"; then
	outbox_setup || exit 1
fi
outbox_bench_start bench-stream || exit 1
. "$ROOT/bench/lib.sh"

# A relocated private PostgreSQL (test/lib.sh's OUTBOX_PG_ROOT) does not see
# the package's files: copy them in.
if [ -n "$OUTBOX_PG_ROOT" ]; then
	for f in $(dpkg -L postgresql-15-pgq3 | grep -E '^/usr/(share|lib)/postgresql/15/(extension|lib)/[^/]+$'); do
		[ -e "$OUTBOX_PG_ROOT$f" ] || cp "$f" "$OUTBOX_PG_ROOT$f"
	done
fi

RELAY=$OUTBOX_RELAY_BINDIR/outbox-relay
[ -x "$RELAY" ] || RELAY=$ROOT/src/outbox-relay
[ -x "$RELAY" ] || { echo "missing $RELAY: run make" >&2; exit 1; }

cleanup() {
	local f
	for f in "$WORK"/*.pid; do
		[ -f "$f" ] && kill -TERM "$(cat "$f")" 2>/dev/null
	done
	outbox_cleanup_work "$WORK"
}
trap cleanup EXIT
DSN="host=$DATA port=$PORT dbname=bench"

as_pg "'$PGBIN/createdb' -h '$DATA' -p $PORT bench"
psql_q "CREATE EXTENSION outbox; CREATE EXTENSION pgq; CREATE SEQUENCE ids;" >/dev/null || exit 1
bench_baseline_table || exit 1

now() { date +%s.%N; }
rate() { awk -v n="$1" -v s="$2" -v e="$3" 'BEGIN { printf "%.0f\n", n / (e - s) }'; }
ratio() { awk -v a="${1:-0}" -v b="${2:-0}" 'BEGIN { if (a > 0 && b > 0) printf "%.2f", a / b; else printf "-" }'; }

# The row-lease backlog: N pending commands in outbox.commands.
load_rows() {
	psql_q "TRUNCATE outbox.commands, outbox.events, outbox.receipts;" >/dev/null &&
		bench_commit_commands "$1" k "rows-$2" &&
		psql_q "VACUUM ANALYZE outbox.commands; CHECKPOINT;" >/dev/null
}

# The baseline's backlog: N pending rows in bq.
load_bq() {
	psql_q "TRUNCATE bq;
INSERT INTO bq (command_id, run_id, seq, kind, payload, available_at, created_at)
SELECT 'cmd-' || g, 'run-' || (g / 100), g, 'k', jsonb_build_object('n', g, 'to', 'someone@example.org'),
       now() - interval '1 minute', now() - interval '1 minute' + g * interval '1 microsecond'
  FROM generate_series(1, $1) g;
VACUUM ANALYZE bq;
CHECKPOINT;" >/dev/null
}

# PgQ: queue $1 with N events ticked every B events (one batch each).
load_pgq() {
	local q=$1 n=$2 b=$3 i
	psql_q "SELECT pgq.create_queue('$q'); SELECT pgq.register_consumer('$q', 'c');
SELECT pgq.set_queue_config('$q', 'ticker_max_count', '$b');" >/dev/null
	for ((i = 0; i < n; i += b)); do
		echo "SELECT count(pgq.insert_event('$q', 'k', json_build_object('n', g, 'to', 'someone@example.org')::text)) FROM generate_series($i + 1, $i + $b) g;"
		echo "SELECT pgq.ticker('$q');"
	done >"$WORK/pgq-load.sql"
	outbox_give_to_pg_user "$WORK"
	as_pg "'$PGBIN/psql' -X -qAt -h '$DATA' -p $PORT -d bench -v ON_ERROR_STOP=1 -f '$WORK/pgq-load.sql'" >/dev/null &&
		psql_q "CHECKPOINT;" >/dev/null
}

cat >"$WORK/pgq-consume.sql" <<'EOF'
SELECT pgq.next_batch(:queue, 'c') AS bid \gset
SELECT count(*) FROM pgq.get_batch_events(:bid);
SELECT pgq.finish_batch(:bid);
EOF
bench_delete_script "$WORK/delete.sql"
outbox_give_to_pg_user "$WORK"

# K relays draining to stdout (into files, counted afterwards): relays K
# [options]; prints nothing, leaves the number of lines written in
# $WORK/delivered.
relays() {
	local k=$1 i
	shift
	rm -f "$WORK"/relay-out-*
	for i in $(seq "$k"); do
		as_pg "'$RELAY' --dsn '$DSN' --sink stdout --drain --worker bench-$i $* >'$WORK/relay-out-$i' 2>>'$WORK/relay.log'" &
	done
	wait
	cat "$WORK"/relay-out-* | wc -l >"$WORK/delivered"
}

# One throughput cell: prints commands per second.
cell() {
	local system=$1 b=$2 k=$3 s e left t name
	name=s$(psql_q "SELECT nextval('ids')")	# (cells run in subshells)
	case $system in
		delete)
			load_bq "$N" || exit 1
			t=$(((N + b * k - 1) / (b * k)))	# the last claims may find nothing
			s=$(now)
			as_pg "'$PGBIN/pgbench' -n -M prepared -h '$DATA' -p $PORT -c $k -j $k -t $t -D batch=$b -f '$WORK/delete.sql' bench" >"$WORK/pgbench.log" 2>&1
			e=$(now)
			left=$(psql_q "SELECT count(*) FROM bq")
			;;
		relay-rows)
			load_rows "$N" "$name" || exit 1
			s=$(now)
			relays "$k" --batch "$b"
			e=$(now)
			left=$((N - $(cat "$WORK/delivered")))
			;;
		relay-stream)
			bench_stream_new "$name" "$b" && bench_load_stream "$name" "$N" "$b" || exit 1
			psql_q "CHECKPOINT;" >/dev/null
			s=$(now)
			relays "$k" --stream "$name" --subscription "$name"
			e=$(now)
			left=$((N - $(cat "$WORK/delivered")))
			;;
		pgq)
			load_pgq "q$name" "$N" "$b" || exit 1
			s=$(now)
			as_pg "'$PGBIN/pgbench' -n -M prepared -h '$DATA' -p $PORT -c 1 -j 1 -t $((N / b)) -D queue=q$name -f '$WORK/pgq-consume.sql' bench" >"$WORK/pgbench.log" 2>&1
			e=$(now)
			left=$(psql_q "SELECT pending_events FROM pgq.get_consumer_info('q$name', 'c')")
			;;
	esac
	[ "${left:-0}" = 0 ] || echo "warning: $system B=$b x$k left $left commands" >&2
	rate "$N" "$s" "$e"
}

lsn() { psql_q "SELECT pg_current_wal_lsn()"; }
bytes() { psql_q "SELECT round(pg_wal_lsn_diff('$2', '$1') / $3::numeric)"; }

# The streams' rotation (retention 0, a table switched every second; the
# worker runs its steps every naptime, and so does outbox.rotate_streams()
# here) until stream $1's commands have left the log tables, 20 s at most;
# prints how many of its commands are still there.  A table is switched
# only once it has taken appends: one decision a second goes to stream
# walpad meanwhile, as producers would write.
rotate() {
	local left i
	psql_q "ALTER SYSTEM SET outbox.retention = 0; ALTER SYSTEM SET outbox.stream_rotation = 1; SELECT pg_reload_conf();" >/dev/null
	for i in $(seq 20); do
		sleep 1
		bench_commit_commands 1 walpad-k "walpad-$i"
		psql_q "SELECT outbox.rotate_streams()" >/dev/null
		left=$(psql_q "SELECT count(*) FROM outbox._stream_log l JOIN outbox.streams t ON t.stream_id = l.stream_id WHERE t.stream = '$1'")
		[ "$left" = 0 ] && break
	done
	psql_q "ALTER SYSTEM RESET outbox.retention; ALTER SYSTEM RESET outbox.stream_rotation; SELECT pg_reload_conf();" >/dev/null
	echo "$left"
}

# With WALDUMP=1, the WAL between two LSNs grouped by resource manager,
# record type and relation (pg_waldump; an FPW is counted in the record that
# carries it, flagged "+fpw"): waldump FROM TO N (bytes per command, the
# groups of 1 byte or more).
waldump() {
	[ -n "${WALDUMP:-}" ] || return 0
	as_pg "'$PGBIN/pg_waldump' -p '$DATA/pg_wal' -s '$1' -e '$2' 2>/dev/null" | awk -v n="$3" '
		{
			rm = $2; t = $0; sub(/.*rec\/tot\): *[0-9]+\/ */, "", t); tot = t + 0
			d = $0; sub(/.*desc: /, "", d); split(d, w, " "); ty = w[1]
			rel = "-"; if (match($0, /rel [0-9]+\/[0-9]+\/[0-9]+/)) { rel = substr($0, RSTART + 4, RLENGTH - 4); sub(/.*\//, "", rel) }
			if ($0 ~ /FPW/) ty = ty "+fpw"
			k = rm " " ty " " rel; b[k] += tot; c[k]++; all += tot
		}
		END {
			for (k in b) if (b[k] / n >= 1) printf "     %7.1f  %6d  %s\n", b[k] / n, c[k], k
			printf "     %7.1f  total\n", all / n
		}' | sort -rn | while read -r per cnt rest; do
		rel=${rest##* }
		case $rel in
			''|-|total) name=$rel ;;
			*) name=$(psql_q "SELECT coalesce((SELECT c.oid::regclass::text FROM pg_class c WHERE pg_relation_filenode(c.oid) = $rel), '$rel')") ;;
		esac
		printf '     %7s B/cmd %6s recs  %s %s\n' "$per" "$cnt" "${rest% *}" "$name"
	done
}

if [ -z "$ONLY" ] || [ "$ONLY" = wal ]; then
	echo "== WAL bytes per command, $N commands: the producer alone | producer + publisher (1 relay, batches of 100) + purge or rotation; ratio"
	echo "   (rows: the purge needs receipts, so outbox.complete of each is in; the stream's kind needs none)"
	# row leases: produce (alone), then produce, drain, complete, purge
	psql_q "TRUNCATE outbox.commands, outbox.events, outbox.receipts; CHECKPOINT;" >/dev/null
	a=$(lsn)
	bench_commit_chunks "$N" k walrows-a 100 ""
	p=$(bytes "$a" "$(lsn)" "$N")
	psql_q "TRUNCATE outbox.commands, outbox.events, outbox.receipts; CHECKPOINT;" >/dev/null
	a=$(lsn)
	bench_commit_chunks "$N" k walrows 100 ""
	relays 1 --batch 100
	psql_q "SELECT count(outbox.complete(run_id, command_id)) FROM outbox.commands;" >/dev/null
	psql_q "SELECT outbox.purge($N, interval '0');" >/dev/null
	t=$(bytes "$a" "$(lsn)" "$N")
	printf '  %-8s %8s | %8s  %s  (%s delivered; %s rows left)\n' rows "$p" "$t" "$(ratio "$t" "$p")" \
		"$(cat "$WORK/delivered")" "$(psql_q "SELECT count(*) FROM outbox.commands")"
	# a stream: produce (alone), then produce with ticks, drain, rotate
	# (first, while the log holds nothing else for the rotation to move)
	bench_stream_new walstream 100
	bench_stream_new walpad 100
	psql_q "CHECKPOINT;" >/dev/null
	a=$(lsn)
	bench_load_stream walstream "$N" 100 || exit 1
	a1=$(lsn)
	relays 1 --stream walstream --subscription walstream
	d=$(cat "$WORK/delivered")
	a2=$(lsn)
	rot="rotated: $(rotate walstream) of its commands left in the log"
	a3=$(lsn)
	t=$(bytes "$a" "$a3" "$N")
	[ -n "${WALDUMP:-}" ] && echo "   stream: producer + ticks" && waldump "$a" "$a1" "$N" &&
		echo "   stream: relay" && waldump "$a1" "$a2" "$N" &&
		echo "   stream: rotation" && waldump "$a2" "$a3" "$N"
	bench_stream_new walalone 100
	psql_q "CHECKPOINT;" >/dev/null
	a=$(lsn)
	bench_commit_chunks "$N" walalone-k walalone 100 ""
	a1=$(lsn)
	p=$(bytes "$a" "$a1" "$N")
	[ -n "${WALDUMP:-}" ] && echo "   stream: producer alone" && waldump "$a" "$a1" "$N"
	printf '  %-8s %8s | %8s  %s  (%s delivered; %s)\n' stream "$p" "$t" "$(ratio "$t" "$p")" "$d" "$rot"
	# PgQ: insert (alone), then insert, tick, consume, rotate
	psql_q "SELECT pgq.create_queue('walq'); SELECT pgq.register_consumer('walq', 'c');
SELECT pgq.set_queue_config('walq', 'rotation_period', '1 second'); CHECKPOINT;" >/dev/null
	a=$(lsn)
	psql_q "SELECT count(pgq.insert_event('walq', 'k', json_build_object('n', g, 'to', 'someone@example.org')::text)) FROM generate_series(1, $N) g;" >/dev/null
	b1=$(lsn)
	p=$(bytes "$a" "$b1" "$N")
	psql_q "SELECT pgq.force_tick('walq');" >/dev/null
	psql_q "SELECT pgq.ticker('walq');" >/dev/null
	as_pg "'$PGBIN/pgbench' -n -M prepared -h '$DATA' -p $PORT -c 1 -t 1 -D queue=walq -f '$WORK/pgq-consume.sql' bench" >/dev/null 2>&1
	sleep 1.1
	psql_q "SELECT pgq.maint_rotate_tables_step1('walq');" >/dev/null
	psql_q "SELECT pgq.maint_rotate_tables_step2();" >/dev/null
	t=$(bytes "$a" "$(lsn)" "$N")
	printf '  %-8s %8s | %8s  %s  (one batch; one rotation; no receipts)\n' pgq "$p" "$t" "$(ratio "$t" "$p")"
	echo
fi

if [ -z "$ONLY" ] || [ "$ONLY" = throughput ]; then
	declare -A R
	for b in $BATCHES; do
		echo "== throughput: $N commands, batch $b, median of $REPEATS (commands/s; ratios against delete)"
		printf '%-14s' "publishers"
		for k in $PUBLISHERS; do printf '%10s' "$k"; done
		echo
		for system in $SYSTEMS; do
			printf '%-14s' "$system"
			for k in $PUBLISHERS; do
				if [ "$system" = pgq ] && [ "$k" != 1 ]; then
					printf '%10s' "-"
					continue
				fi
				R[$system,$b,$k]=$(for _ in $(seq "$REPEATS"); do cell "$system" "$b" "$k"; done | median)
				printf '%10s' "${R[$system,$b,$k]}"
			done
			echo
		done
		for system in $SYSTEMS; do
			[ "$system" = delete ] && continue
			printf '%-14s' "$system/delete"
			for k in $PUBLISHERS; do
				printf '%10s' "$(ratio "${R[$system,$b,$k]:-}" "${R[delete,$b,$k]:-}")"
			done
			echo
		done
		printf '%-14s' "stream/rows"
		for k in $PUBLISHERS; do
			printf '%10s' "$(ratio "${R[relay-stream,$b,$k]:-}" "${R[relay-rows,$b,$k]:-}")"
		done
		echo
	done
	echo
fi

if [ -z "$ONLY" ] || [ "$ONLY" = produce ]; then
	echo "== produce: one commit_decision per transaction, $CLIENTS clients, ${PRODUCE_SECS}s, median of $REPEATS (transactions/s)"
	bench_stream_new prodstream 1000
	cat >"$WORK/produce-rows.sql" <<'EOF'
SELECT outbox.commit_decision('p' || :client_id, s, 'decided', 'p-' || s, 'rows-p', '{"to": "someone@example.org"}') FROM nextval('ids') s;
EOF
	sed 's/rows-p/prodstream-k/' "$WORK/produce-rows.sql" >"$WORK/produce-stream.sql"
	echo "SELECT pgq.insert_event('prodq', 'k', '{\"to\": \"someone@example.org\"}');" >"$WORK/produce-pgq.sql"
	psql_q "SELECT pgq.create_queue('prodq'); SELECT pgq.register_consumer('prodq', 'c');" >/dev/null
	outbox_give_to_pg_user "$WORK"
	declare -A P
	for rep in $(seq "$REPEATS"); do
		for system in rows stream pgq; do
			psql_q "CHECKPOINT;" >/dev/null
			P[$system,$rep]=$(as_pg "'$PGBIN/pgbench' -n -M prepared -h '$DATA' -p $PORT -c $CLIENTS -j 2 -T $PRODUCE_SECS -f '$WORK/produce-$system.sql' bench" 2>&1 |
				awk '/^tps = / { printf "%.0f\n", $3; exit }')
		done
	done
	for system in rows stream pgq; do
		P[$system]=$(for rep in $(seq "$REPEATS"); do echo "${P[$system,$rep]}"; done | median)
		printf '  %-8s %8s  %s\n' "$system" "${P[$system]}" "$(ratio "${P[$system]}" "${P[rows]}")"
	done
	echo
fi

if [ -z "$ONLY" ] || [ "$ONLY" = claim ]; then
	echo "== claim_batch + ack_batch latency with the log holding SIZES commands (ms per batch of 100, 20 batches a round)"
	cat >"$WORK/claim.sql" <<'EOF'
SELECT coalesce(min(token), '') AS tok FROM outbox.claim_batch(:stream, :stream, 'w') \gset
SELECT outbox.ack_batch('w', :tok);
EOF
	outbox_give_to_pg_user "$WORK"
	for size in $SIZES; do
		bench_stream_new "claim$size" 100
		bench_load_stream "claim$size" "$size" 1000 || exit 1
	done
	psql_q "VACUUM ANALYZE; CHECKPOINT;" >/dev/null
	printf '  %9s' commands
	for ((r = 1; r <= ${CLAIM_ROUNDS:-3}; r++)); do printf '  round %d' "$r"; done
	echo
	declare -A claim_ms
	for ((r = 1; r <= ${CLAIM_ROUNDS:-3}; r++)); do
		for size in $SIZES; do
			claim_ms[$size]+=$(as_pg "'$PGBIN/pgbench' -n -h '$DATA' -p $PORT -M prepared -c 1 -t 20 -D stream=claim$size -f '$WORK/claim.sql' bench" 2>&1 |
				awk '/^latency average/ { printf "  %7s", $4; exit }')
		done
	done
	for size in $SIZES; do
		printf '  %9s%s  ms\n' "$size" "${claim_ms[$size]}"
	done
	echo
fi

# PgQ's commit -> consumed latency at rate $1 with a tick every $2 ms: a
# ticker loop (pgq.ticker() every $2 ms, the queue set to tick whenever it
# has events: ticker_max_lag 0), one consumer in SQL polling next_batch
# every millisecond and stamping each event with clock_timestamp() as
# get_batch_events returns it, pgbench producers (2 clients, -R $1) of one
# insert_event per transaction; latency = the stamp - ev_time (insert_event's
# now(), the producer's transaction start).  Prints "p50 p99 count of
# produced", the latencies in ms.
pgq_latency() {
	local rate=$1 tick=$2 q=lat_$1_$2 ok=true _
	psql_q "SELECT pgq.create_queue('$q'); SELECT pgq.register_consumer('$q', 'c');
SELECT pgq.set_queue_config('$q', 'ticker_max_lag', '0');
SELECT pgq.set_queue_config('$q', 'ticker_max_count', '100000000');
UPDATE pgq_ctl SET ticker_stop = false, consumer_stop = false;" >/dev/null || return 1
	echo "SELECT pgq.insert_event(:q, 'k', '{\"n\": 1, \"to\": \"someone@example.org\"}');" >"$WORK/pgq-produce.sql"
	outbox_give_to_pg_user "$WORK"
	psql_q "DO \$\$ BEGIN LOOP
	PERFORM pgq.ticker('$q'); COMMIT;
	EXIT WHEN (SELECT ticker_stop FROM pgq_ctl);
	PERFORM pg_catalog.pg_sleep($tick / 1000.0);
END LOOP; END \$\$;" &
	echo $! >"$WORK/pgq-ticker.pid"
	psql_q "DO \$\$ DECLARE b bigint; BEGIN LOOP
	b := pgq.next_batch('$q', 'c');
	IF b IS NULL THEN
		COMMIT;
		EXIT WHEN (SELECT consumer_stop FROM pgq_ctl);
		PERFORM pg_catalog.pg_sleep(0.001);
	ELSE
		INSERT INTO pgq_lat SELECT '$q', e.ev_id, e.ev_time, clock_timestamp() FROM pgq.get_batch_events(b) e;
		PERFORM pgq.finish_batch(b); COMMIT;
	END IF;
END LOOP; END \$\$;" &
	echo $! >"$WORK/pgq-consumer.pid"
	as_pg "'$PGBIN/pgbench' -n -M prepared -h '$DATA' -p $PORT -c 2 -j 2 -R $rate -T $LAT_SECS -D q=$q -f '$WORK/pgq-produce.sql' bench" >"$WORK/pgbench-pgq.log" 2>&1 ||
		{ echo "pgbench failed (PgQ producers):" >&2; tail -3 "$WORK/pgbench-pgq.log" >&2; ok=false; }
	# the ticker's last tick (it ticks once more after the flag), then the
	# consumer once every event is consumed
	psql_q "UPDATE pgq_ctl SET ticker_stop = true;" >/dev/null
	wait "$(cat "$WORK/pgq-ticker.pid")"
	for _ in $(seq 100); do
		[ "$(psql_q "SELECT pending_events FROM pgq.get_consumer_info('$q', 'c')")" = 0 ] && break
		sleep 0.1
	done
	psql_q "UPDATE pgq_ctl SET consumer_stop = true;" >/dev/null
	wait "$(cat "$WORK/pgq-consumer.pid")"
	rm -f "$WORK/pgq-ticker.pid" "$WORK/pgq-consumer.pid"
	$ok || return 1
	psql_q "SELECT format('%s %s %s of %s', round((percentile_cont(0.5) WITHIN GROUP (ORDER BY ms))::numeric, 2),
       round((percentile_cont(0.99) WITHIN GROUP (ORDER BY ms))::numeric, 2), count(*),
       $(awk '/number of transactions actually processed/ { print $NF; exit }' "$WORK/pgbench-pgq.log" | grep -E '^[0-9]+$' || echo "'?'"))
  FROM (SELECT extract(epoch FROM got - ev_time) * 1000 AS ms FROM pgq_lat WHERE q = '$q') x"
}

if [ -z "$ONLY" ] || [ "$ONLY" = latency ] || [ "$ONLY" = pgq-latency ]; then
	echo "== PgQ commit -> consumed (one SQL consumer polling every 1 ms, a tick every PGQ_TICKS ms; ms)"
	psql_q "CREATE TABLE IF NOT EXISTS pgq_lat (q text, ev_id bigint, ev_time timestamptz, got timestamptz);
DROP TABLE IF EXISTS pgq_ctl; CREATE TABLE pgq_ctl (ticker_stop boolean, consumer_stop boolean);
INSERT INTO pgq_ctl VALUES (false, false);" >/dev/null || exit 1
	for rate in $RATES; do
		for tick in $PGQ_TICKS; do
			v=$(pgq_latency "$rate" "$tick") || v="failed"
			echo "  $rate/s, tick every $tick ms: p50 p99 consumed of produced = $v"
		done
	done
fi

if [ -z "$ONLY" ] || [ "$ONLY" = latency ]; then
	outbox_stop_cluster "$DATA"	# latency.sh starts a cluster of its own
	echo "== commit -> delivered (bench/latency.sh's harness: rows against a stream)"
	OUTBOX_SKIP_BUILD=1 QUICK= REPEATS=1 SECS=$LAT_SECS RATES=$RATES \
		SETUP_SQL="SELECT outbox.create_stream('lat', $PARTS, 100); SELECT outbox.create_subscription('lat', 'lat');" \
		PENDING_SQL="SELECT (SELECT count(*) FROM outbox.commands WHERE status <> 'published') + outbox.tick_streams() * 0
  + (SELECT count(*) FROM outbox.stream_lag WHERE subscription = 'lat' AND (ticks_behind > 0 OR batch_open))
  + (SELECT count(*) FROM outbox.stream_failed WHERE subscription = 'lat' AND status <> 'dead')" \
		CONFIGS="rows | | | SELECT outbox.set_policy('lat', stream => '')
stream | | --stream lat --subscription lat | SELECT outbox.set_policy('lat', stream => 'lat')" \
		bash "$ROOT/bench/latency.sh"
fi
