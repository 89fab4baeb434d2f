#!/usr/bin/env bash
# The outbox distributed on Citus against one machine, in the same run, on
# throwaway servers (docs/citus.md).  Not a test: it prints numbers.
#
#   bash bench/citus.sh            # DURATION=20 s of producing, REPEATS=3
#   QUICK=1 bash bench/citus.sh    # 8 s, one repeat
#
# Needs Citus installed in PG_CONFIG's server (bash test/run.sh citus builds
# it there from ../shared/citus-13.0.5.tar.gz).
#
# single   one server with the outbox (preloaded, as in production)
# cluster  a coordinator and two workers on the same machine, the outbox
#          distributed (outbox.distribute(), citus.shard_count = 8), the
#          business table in its co-location group
# produce  pgbench, CLIENTS (8) clients for DURATION seconds, each
#          transaction one call of a function that inserts the business
#          row and calls outbox.commit_decision: on the cluster a function
#          distributed by the run (create_distributed_function), sent by
#          the coordinator to the run's node; transactions per second
# relay    the produced commands drained by outbox-relays (--drain,
#          B = 100, stdout sink to /dev/null); commands per second from
#          their start to the last exit:
#            2 publishers: two relays on the single server; on the cluster
#              one relay on each worker, and two `outbox-relay --citus`
#              pointed at the coordinator (each runs a relay per worker,
#              so four processes claim)
#            4 publishers: four relays on the single server; four
#              `--citus` relays on the cluster (eight processes)
#          before each drain the backlog is produced again as above
# The machine's cores are shared by all four servers and the clients, so
# the cluster does not get more hardware than the single server: the ratio
# is the cost of the distribution (coordinator hops, per-shard claims), not
# a scale-out figure.
set -u
set -o pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
. "$ROOT/test/lib.sh"
. "$ROOT/bench/lib.sh"

REPEATS=${REPEATS:-3}
DURATION=${DURATION:-20}
CLIENTS=${CLIENTS:-8}
if [ -n "${QUICK:-}" ]; then
	REPEATS=1
	DURATION=8
fi

if [ -z "${OUTBOX_SKIP_BUILD:-}" ]; then
	outbox_setup || exit 1
fi
if ! [ -f "$("$PG_CONFIG" --pkglibdir)/citus.so" ]; then
	echo "bench/citus.sh: no Citus in $PG_CONFIG's server (bash test/run.sh citus builds it)" >&2
	exit 1
fi
RELAY=$OUTBOX_RELAY_BINDIR/outbox-relay
[ -x "$RELAY" ] || RELAY=$ROOT/src/outbox-relay
[ -x "$RELAY" ] || { echo "missing outbox-relay: run make" >&2; exit 1; }

WORK=$(mktemp -d /tmp/outbox-bench-citus.XXXXXX)
outbox_give_to_pg_user "$WORK"
trap 'outbox_cleanup_work "$WORK"' EXIT
CONF="listen_addresses = '127.0.0.1'
shared_buffers = 128MB
max_connections = 60
checkpoint_timeout = 30min
max_wal_size = 4GB
max_prepared_transactions = 20
max_worker_processes = 32
citus.node_conninfo = 'sslmode=disable'
outbox.databases = 'bench'"
declare -A PORTS
for name in single coordinator worker1 worker2; do
	PORTS[$name]=$(outbox_free_port)
	preload=citus,outbox
	[ "$name" = single ] && preload=outbox
	outbox_start_cluster "$WORK/$name" "${PORTS[$name]}" "$CONF
shared_preload_libraries = '$preload'" || { tail -20 "$WORK/$name/server.log"; exit 1; }
done

psql_on() {
	as_pg "'$PGBIN/psql' -X -qAt -h 127.0.0.1 -p ${PORTS[$1]} -d ${2:-bench} -v ON_ERROR_STOP=1" <<<"$3"
}

FUNC="CREATE FUNCTION public.place_order(run text, total int) RETURNS boolean LANGUAGE plpgsql AS \$f\$
BEGIN
	INSERT INTO public.orders VALUES (run, total);
	RETURN outbox.commit_decision(run, 1, 'placed', 'ship-' || run, 'ship',
								  jsonb_build_object('total', total));
END \$f\$;"
setup() {
	local n
	for n in single coordinator worker1 worker2; do
		psql_on "$n" postgres "SET client_min_messages = warning; DROP DATABASE IF EXISTS bench WITH (FORCE); CREATE DATABASE bench;" || return 1
	done
	psql_on single bench "CREATE EXTENSION outbox;
		CREATE TABLE public.orders (run_id text COLLATE \"C\" PRIMARY KEY, total int NOT NULL);
		$FUNC" || return 1
	for n in coordinator worker1 worker2; do
		psql_on "$n" bench "CREATE EXTENSION citus;" || return 1
	done
	psql_on coordinator bench "SELECT citus_set_coordinator_host('127.0.0.1', ${PORTS[coordinator]});
		SELECT citus_add_node('127.0.0.1', ${PORTS[worker1]});
		SELECT citus_add_node('127.0.0.1', ${PORTS[worker2]});
		SET client_min_messages = warning;
		CREATE EXTENSION outbox;
		SET citus.shard_count = 8;
		SELECT outbox.distribute();
		CREATE TABLE public.orders (run_id text COLLATE \"C\" PRIMARY KEY, total int NOT NULL);
		SELECT create_distributed_table('public.orders', 'run_id', colocate_with => 'outbox.events');
		$FUNC
		SELECT create_distributed_function('public.place_order(text, int)', 'run',
										   colocate_with => 'outbox.events');" >/dev/null
}

# pgbench substitutes :id inside the literal, so the run is a constant
# Citus can route the call by.
cat >"$WORK/produce.sql" <<'EOF'
\set id random(1, 9000000000000000000)
SELECT public.place_order('r:client_id-:id', 1);
EOF
outbox_give_to_pg_user "$WORK"

# CPU time (clock ticks) server $1 has used so far (bench/lib.sh).
node_ticks() {
	bench_server_ticks "$WORK/$1"
}
TICK_MS=$(awk -v t="$(getconf CLK_TCK)" 'BEGIN { print 1000 / t }')
# Every server's ticks, in the order single coordinator worker1 worker2.
all_ticks() { echo "$(node_ticks single) $(node_ticks coordinator) $(node_ticks worker1) $(node_ticks worker2)"; }
# CPU ms per 1,000 commands between two all_ticks for COUNT commands: the
# single server's when $1 is single, else the coordinator's and the two
# workers' together ("coordinator workers").
cpu_per_k() {
	awk -v a="$1" -v b="$2" -v n="$3" -v w="$4" -v ms="$TICK_MS" 'BEGIN {
		split(a, x, " "); split(b, y, " ");
		if (n <= 0) { print "0 0"; exit }
		if (w == "single") printf "%.1f\n", (y[1] - x[1]) * ms * 1000 / n;
		else printf "%.1f %.1f\n", (y[2] - x[2]) * ms * 1000 / n, (y[3] - x[3] + y[4] - x[4]) * ms * 1000 / n }'
}

# pgbench on server $1; prints transactions per second and leaves the
# number of transactions in $WORK/produced.
produce() {
	as_pg "'$PGBIN/pgbench' -n -h 127.0.0.1 -p ${PORTS[$1]} -c $CLIENTS -j $CLIENTS -T $DURATION -f '$WORK/produce.sql' bench" >"$WORK/pgbench.out" 2>&1
	sed -n 's/^number of transactions actually processed: \([0-9]*\).*/\1/p' "$WORK/pgbench.out" | head -1 >"$WORK/produced"
	sed -n 's/^tps = \([0-9.]*\).*/\1/p' "$WORK/pgbench.out" | head -1
}
# produce on $1, and its CPU per 1,000 decisions appended to the file $2
produce_cpu() {
	local t0 t1 tps
	t0=$(all_ticks)
	tps=$(produce "$1")
	t1=$(all_ticks)
	cpu_per_k "$t0" "$t1" "$(cat "$WORK/produced")" "$1" >>"$WORK/$2"
	echo "$tps"
}

# Relays with --drain on the outbox of server $1, one per argument after
# the second (its options after --dsn); commands per second; the servers'
# CPU per 1,000 commands drained is appended to the file $2.
drain() {
	local start end n args pids=()
	local node=$1
	local cpu=$2 t0 t1
	n=$(psql_on "$node" bench "SELECT count(*) FROM outbox.commands WHERE status = 'pending'")
	shift 2
	t0=$(all_ticks)
	start=$(date +%s.%N)
	for args in "$@"; do
		as_pg "'$RELAY' --dsn $args --sink stdout --batch 100 --drain >/dev/null 2>>'$WORK/relay.log'" &
		pids+=($!)
	done
	wait "${pids[@]}"
	end=$(date +%s.%N)
	t1=$(all_ticks)
	cpu_per_k "$t0" "$t1" "$n" "$node" >>"$WORK/$cpu"
	left=$(psql_on "$node" bench "SELECT count(*) FROM outbox.commands WHERE status <> 'published'")
	[ "$left" = 0 ] || echo "bench/citus.sh: $left commands left unpublished on $node" >&2
	echo "$n $start $end" | awk '{ printf "%.0f", $1 / ($3 - $2) }'
}

median() { tr ' ' '\n' | grep -v '^$' | sort -g | awk '{ a[NR] = $1 } END { if (NR % 2) print a[(NR + 1) / 2]; else printf "%.1f\n", (a[NR / 2] + a[NR / 2 + 1]) / 2 }'; }

dsn() { echo "'host=127.0.0.1 port=${PORTS[$1]} dbname=bench user=postgres'"; }
P_S="" P_C="" R_S2="" R_W="" R_S4="" R_C2="" R_C4=""
for r in $(seq "$REPEATS"); do
	setup || { echo "setup failed" >&2; exit 1; }
	P_S="$P_S $(produce_cpu single cpu.p_s)"
	P_C="$P_C $(produce_cpu coordinator cpu.p_c)"
	R_S2="$R_S2 $(drain single cpu.r_s2 "$(dsn single)" "$(dsn single)")"
	R_W="$R_W $(drain coordinator cpu.r_w "$(dsn worker1)" "$(dsn worker2)")"
	produce single >/dev/null
	produce coordinator >/dev/null
	R_S4="$R_S4 $(drain single cpu.r_s4 "$(dsn single)" "$(dsn single)" "$(dsn single)" "$(dsn single)")"
	R_C2="$R_C2 $(drain coordinator cpu.r_c2 "$(dsn coordinator) --citus" "$(dsn coordinator) --citus")"
	produce coordinator >/dev/null
	R_C4="$R_C4 $(drain coordinator cpu.r_c4 "$(dsn coordinator) --citus" "$(dsn coordinator) --citus" \
		"$(dsn coordinator) --citus" "$(dsn coordinator) --citus")"
done

row() {
	local s c
	s=$(median <<<"$2") c=$(median <<<"$3")
	printf '| %-46s | %6.0f | %7.0f | %5.2f | %s |%s\n' "$1" "$s" "$c" \
		"$(awk -v a="$c" -v b="$s" 'BEGIN { print (b > 0 ? a / b : 0) }')" "$2" "$3"
}
echo "# bench/citus.sh: DURATION=${DURATION}s CLIENTS=$CLIENTS REPEATS=$REPEATS, median; ratio = cluster / single"
echo "| work                                           | single | cluster | ratio | runs (single|cluster)"
row "produce, tx/s (function, $CLIENTS clients)" "$P_S" "$P_C"
row "relay, commands/s, 2 relays: one per worker" "$R_S2" "$R_W"
row "relay, commands/s, 2 relays: --citus" "$R_S2" "$R_C2"
row "relay, commands/s, 4 relays: --citus" "$R_S4" "$R_C4"

# Per node: the servers' CPU per 1,000 commands (every process of each
# server, whatever the machine's load), the single server against the
# coordinator and against the two workers together.  A worker stores and
# drains the runs of its shards, so with a machine of its own a worker
# keeps pace with one server when the workers' CPU per command is no more
# than the single server's (ratio single / workers >= 1); the coordinator's
# CPU is the hop's cost, on its own machine.
cpu_row() {
	local s c w
	s=$(median <"$WORK/$2")
	c=$(awk '{ print $1 }' "$WORK/$3" | median)
	w=$(awk '{ print $2 }' "$WORK/$3" | median)
	printf '| %-46s | %7.1f | %11.1f | %7.1f | %5.2f |\n' "$1" "$s" "$c" "$w" \
		"$(awk -v a="$s" -v b="$w" 'BEGIN { print (b > 0 ? a / b : 0) }')"
}
echo
echo "# CPU ms per 1,000 commands, every process of each server, median"
echo "| work                                           |  single | coordinator | workers | single / workers |"
cpu_row "produce (function, $CLIENTS clients)" cpu.p_s cpu.p_c
cpu_row "relay, 2 relays: one per worker" cpu.r_s2 cpu.r_w
cpu_row "relay, 2 relays: --citus" cpu.r_s2 cpu.r_c2
cpu_row "relay, 4 relays: --citus" cpu.r_s4 cpu.r_c4
