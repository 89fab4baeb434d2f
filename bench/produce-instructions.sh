#!/usr/bin/env bash
# The producer's cost in user-space instructions per transaction, which
# repeat from run to run where the wall time of a shared machine does not:
# valgrind's cachegrind around a single-user backend (postgres --single,
# the library preloaded, no worker) running bench/produce.sh's four scripts
# as PREPAREd statements, N2 transactions minus N1 (the backend's start-up
# and the first calls' plan and cache loads cancel out), on a throwaway
# data directory.  Measures the installed build; to compare two builds,
# install one, run, install the other, run.  Not a test: it prints numbers.
#
#   bash bench/produce-instructions.sh
#   SCRIPTS="outbox hand" N1=5 N2=105 bash bench/produce-instructions.sh
#   OLD_PG_CONFIG=/path/to/0.1.0/pg_config bash bench/produce-instructions.sh
#
# With OLD_PG_CONFIG (the pg_config of a PostgreSQL the 0.1.0 release,
# 38cd9ad, is installed for; see bench/versus.sh), the same scripts run on
# a data directory of that PostgreSQL too, each version with its own call
# and the same values (0.1.0's commit_decisions takes parallel arrays, sent
# as array literals; rows-batch has no 0.1.0 form and is set against
# 0.1.0's batch), and a column compares them (this build / 0.1.0: below 1
# is fewer instructions).
#
# Settings: SCRIPTS ("outbox hand outbox-batch hand-batch rows-batch";
# rows-batch is outbox-batch with each decision a JSON array of its values
# instead of an object; also "stream" and "stream-batch": outbox and
# outbox-batch with a kind written once into a stream of 8 partitions,
# this build only), N1 and N2
# (5 and 105 for the single decisions; a fifth of them for the batches of
# 100), OLD_PG_CONFIG, OLD_BATCH (params: 0.1.0's six arrays all parsed
# at every call, as a driver's parameters are, the default; constants: the
# four that do not hold the business row's id parsed once, at PREPARE),
# CACHEGRIND_DIR (keep each run's cachegrind output
# there as VERSION-SCRIPT-N.out, VERSION old or new, for cg_diff and
# cg_annotate), OUTBOX_SKIP_BUILD (measure what is installed without
# building).
set -u
set -o pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
. "$ROOT/test/lib.sh"
. "$ROOT/bench/lib.sh"
OUTBOX_PACKAGES+=(valgrind)

SCRIPTS=${SCRIPTS:-"outbox hand outbox-batch hand-batch rows-batch"}
# (not for make: PGXS installs the files named in SCRIPTS)
export -n SCRIPTS
N1=${N1:-5}
N2=${N2:-105}

if [ -z "${OUTBOX_SKIP_BUILD:-}" ]; then
	outbox_setup || exit 1
fi
command -v valgrind >/dev/null || { echo "valgrind is not installed" >&2; exit 1; }
VERSIONS=new
declare -A BIN=([new]=$PGBIN)
if [ -n "${OLD_PG_CONFIG:-}" ]; then
	[ -x "$OLD_PG_CONFIG" ] ||
		{ echo "OLD_PG_CONFIG must name the pg_config 0.1.0 is installed for" >&2; exit 1; }
	BIN[old]=$("$OLD_PG_CONFIG" --bindir)
	VERSIONS="old new"
fi
WORK=$(mktemp -d /tmp/outbox-instructions.XXXXXX)
outbox_give_to_pg_user "$WORK"
[ -n "${CACHEGRIND_DIR:-}" ] && { mkdir -p "$CACHEGRIND_DIR" && outbox_give_to_pg_user "$CACHEGRIND_DIR" || exit 1; }
trap 'outbox_cleanup_work "$WORK"' EXIT

# A single-user backend of version $V on its data directory, database $1.
single() {
	as_pg "'${BIN[$V]}/postgres' --single -j -D '$WORK/data-$V' -c shared_preload_libraries=outbox $1"
}
for V in $VERSIONS; do
	as_pg "'${BIN[$V]}/initdb' -D '$WORK/data-$V' -A trust -U postgres" >/dev/null || exit 1
	echo "CREATE DATABASE bench;" | single postgres >/dev/null 2>&1
	single bench >"$WORK/setup-$V.log" 2>&1 <<'EOF'
CREATE EXTENSION outbox;
CREATE TABLE biz (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, customer text NOT NULL, amount int NOT NULL);
CREATE TABLE hand_biz (LIKE biz INCLUDING ALL);
CREATE TABLE hand_events (LIKE outbox.events INCLUDING ALL);
CREATE TABLE hand_commands (LIKE outbox.commands INCLUDING ALL) WITH (fillfactor = 80);
SELECT extversion FROM pg_extension WHERE extname = 'outbox';
EOF
	if [ "$V" = new ]; then
		# the stream scripts' kind, written once into a stream's log
		single bench >>"$WORK/setup-$V.log" 2>&1 <<'EOF'
SELECT outbox.create_stream('s', 8, 1000);
SELECT outbox.create_subscription('s', 's');
SELECT outbox.set_policy('lock_stream', stream => 's');
EOF
	fi
	if grep -q ERROR "$WORK/setup-$V.log"; then
		cat "$WORK/setup-$V.log"
		exit 1
	fi
done
if [ -n "${BIN[old]:-}" ]; then
	ver=$(sed -n 's/.*extversion = "\([^"]*\)".*/\1/p' "$WORK/setup-old.log")
	[ "$ver" = 0.1.0 ] || { echo "the old data directory's outbox is '$ver', not 0.1.0" >&2; exit 1; }
fi

# The input of one run of version $V: the statements of bench/produce.sh's
# scripts (one transaction a line), n transactions of script.
input() {
	local script=$1 n=$2 g i
	cat <<'EOF'
TRUNCATE biz, hand_biz, hand_events, hand_commands, outbox.events, outbox.commands;
PREPARE os(bigint) AS SELECT outbox.commit_decision('run-' || $1, 1, 'trip_requested', 'scmd-' || $1, 'lock_stream', '{"amount": 900, "to": "budget"}');
PREPARE ib(text) AS INSERT INTO biz (customer, amount) VALUES ($1, 900) RETURNING id;
PREPARE hb(text) AS INSERT INTO hand_biz (customer, amount) VALUES ($1, 900) RETURNING id;
PREPARE od(bigint) AS SELECT outbox.commit_decision('run-' || $1, 1, 'trip_requested', 'cmd-' || $1, 'lock_budget', '{"amount": 900, "to": "budget"}');
PREPARE hd(bigint) AS WITH e AS (INSERT INTO hand_events (run_id, seq, kind, payload, command_id) VALUES ('run-' || $1, 1, 'trip_requested', NULL, 'cmd-' || $1) RETURNING 1) INSERT INTO hand_commands (command_id, run_id, seq, kind, payload, priority, available_at, due_at) SELECT 'cmd-' || $1, 'run-' || $1, 1, 'lock_budget', '{"amount": 900, "to": "budget"}', 0, now(), now() FROM e;
PREPARE hbt(bigint) AS WITH e AS (INSERT INTO hand_events (run_id, seq, kind, payload, command_id) SELECT 'run-' || $1, g, 'trip_requested', NULL, 'cmd-' || $1 || '-' || g FROM generate_series(1, 100) g RETURNING run_id, seq, command_id) INSERT INTO hand_commands (command_id, run_id, seq, kind, payload, priority, available_at, due_at) SELECT command_id, run_id, seq, 'lock_budget', '{"amount": 900, "to": "budget"}', 0, now(), now() FROM e;
EOF
	if [ "$V" = old ]; then
		# 0.1.0's parallel arrays, each the array literal a client sends,
		# the business row's id put into the ids by format(); the four
		# arrays without the id go through format() too (an array a
		# driver sends is parsed at every call), or with OLD_BATCH =
		# constants are constants of the statement (parsed at PREPARE)
		local f1="pg_catalog.format('" f2="', \$1::text)"
		if [ "${OLD_BATCH:-params}" = constants ]; then
			f1="'"
			f2="'"
		fi
		printf "PREPARE obt(bigint) AS SELECT outbox.commit_decisions(pg_catalog.format('{"
		for g in $(seq 100); do
			[ "$g" -gt 1 ] && printf ','
			printf 'run-%%1$s'
		done
		printf "}', \$1::text)::text[], %s{%s}%s::int8[], %s{%s}%s::text[], pg_catalog.format('{" \
			"$f1" "$(seq -s, 100)" "$f2" "$f1" "$(yes trip_requested | head -100 | paste -sd,)" "$f2"
		for g in $(seq 100); do
			[ "$g" -gt 1 ] && printf ','
			printf 'cmd-%%1$s-%d' "$g"
		done
		printf "}', \$1::text)::text[], %s{%s}%s::text[], %s{%s}%s::jsonb[]);\n" \
			"$f1" "$(yes lock_budget | head -100 | paste -sd,)" "$f2" \
			"$f1" "$(yes '"{\"amount\": 900, \"to\": \"budget\"}"' | head -100 | paste -sd,)" "$f2"
	else
		echo "PREPARE obt(bigint) AS SELECT count(*) FROM outbox.commit_decisions(pg_catalog.format('$(bench_batch_json objects)', \$1::text)::jsonb);"
		# the same decisions as arrays of their values (commit_decision's order)
		echo "PREPARE obr(bigint) AS SELECT count(*) FROM outbox.commit_decisions(pg_catalog.format('$(bench_batch_json rows)', \$1::text)::jsonb);"
		echo "PREPARE osb(bigint) AS SELECT count(*) FROM outbox.commit_decisions(pg_catalog.format('$(bench_batch_json objects | sed 's/lock_budget/lock_stream/g; s/cmd-/scmd-/g')', \$1::text)::jsonb);"
	fi
	for i in $(seq "$n"); do
		case $script in
			outbox) echo "BEGIN; EXECUTE ib('c1'); EXECUTE od($i); COMMIT;" ;;
			hand) echo "BEGIN; EXECUTE hb('c1'); EXECUTE hd($i); COMMIT;" ;;
			outbox-batch) echo "BEGIN; EXECUTE ib('c1'); EXECUTE obt($i); COMMIT;" ;;
			rows-batch) echo "BEGIN; EXECUTE ib('c1'); EXECUTE obr($i); COMMIT;" ;;
			hand-batch) echo "BEGIN; EXECUTE hb('c1'); EXECUTE hbt($i); COMMIT;" ;;
			# the stream's log is not truncated between runs: ids of
			# their own per run
			stream) echo "BEGIN; EXECUTE ib('c1'); EXECUTE os($((n * 1000000 + i))); COMMIT;" ;;
			stream-batch) echo "BEGIN; EXECUTE ib('c1'); EXECUTE osb($((n * 1000000 + i))); COMMIT;" ;;
		esac
	done
}

# Instructions of one single-user backend of version $V running n
# transactions of script.
instructions() {
	local script=$1 n=$2 f="$WORK/in-$V-$1-$2.sql"
	# each statement line its own query (-j ends one at ";" and an empty
	# line): a prepared statement keeps its query's text, and EXECUTE
	# copies it, so one query of the whole input would cost every EXECUTE
	# a copy of the input
	input "$script" "$n" | sed G >"$f"
	chmod 644 "$f"
	local out=/dev/null
	[ -n "${CACHEGRIND_DIR:-}" ] && out=$CACHEGRIND_DIR/$V-$script-$n.out
	as_pg "valgrind --tool=cachegrind --cache-sim=no --cachegrind-out-file='$out' \
		'${BIN[$V]}/postgres' --single -j -D '$WORK/data-$V' -c shared_preload_libraries=outbox bench \
		<'$f' >'$WORK/out-$V-$script-$n.txt'" 2>&1 | awk '/I *refs:/ {gsub(",", "", $NF); print $NF}'
	if grep -q ERROR "$WORK/out-$V-$script-$n.txt"; then
		grep -m 3 ERROR "$WORK/out-$V-$script-$n.txt" >&2
	fi
}

# Per version and script; rows-batch has no 0.1.0 form, and is set against
# 0.1.0's outbox-batch (the same decisions in its arrays) when that ran.
declare -A per
if [ -n "${BIN[old]:-}" ]; then
	printf '| script | 0.1.0 | this build | this / 0.1.0 |\n|---|---|---|---|\n'
else
	printf '| script | instructions per transaction |\n|---|---|\n'
fi
for s in $SCRIPTS; do
	a=$N1
	b=$N2
	case $s in *-batch) a=$(((N1 + 4) / 5)); b=$(((N2 + 4) / 5)) ;; esac
	for V in $VERSIONS; do
		case $V-$s in old-stream*) continue ;; esac
		if [ "$V" = old ] && [ "$s" = rows-batch ]; then
			# 0.1.0's one batch form, against this one too
			[ -n "${per[oldoutbox-batch]:-}" ] && per[oldrows-batch]=${per[oldoutbox-batch]}
			continue
		fi
		i1=$(instructions "$s" "$a")
		i2=$(instructions "$s" "$b")
		per[$V$s]=$(((i2 - i1) / (b - a)))
	done
	if [ -n "${BIN[old]:-}" ]; then
		printf '| %s | %s | %s | %s |\n' "$s" "${per[old$s]:--}" "${per[new$s]}" \
			"$(awk -v o="${per[old$s]:-0}" -v n="${per[new$s]}" 'BEGIN {if (o > 0) printf "%.3f", n / o; else print "-"}')"
	else
		printf '| %s | %s |\n' "$s" "${per[new$s]}"
	fi
done
for V in $VERSIONS; do
	name=
	if [ -n "${BIN[old]:-}" ]; then
		name="this build, "
		[ "$V" = old ] && name="0.1.0, "
	fi
	for k in "" -batch; do
		if [ -n "${per[${V}outbox$k]:-}" ] && [ -n "${per[${V}hand$k]:-}" ]; then
			awk -v h="${per[${V}hand$k]}" -v o="${per[${V}outbox$k]}" -v k="${k:-single}" -v v="$name" \
				'BEGIN {printf "ratio hand / outbox (%s%s): %.2f\n", v, k, h / o}'
		fi
	done
	for k in "" -batch; do
		if [ "$V" = new ] && [ -n "${per[${V}outbox$k]:-}" ] && [ -n "${per[${V}stream$k]:-}" ]; then
			awk -v r="${per[${V}outbox$k]}" -v t="${per[${V}stream$k]}" -v k="${k:-single}" \
				'BEGIN {printf "ratio row leases / stream (%s): %.2f\n", k, r / t}'
		fi
	done
	if [ "$V" = new ] && [ -n "${per[${V}rows-batch]:-}" ] && [ -n "${per[${V}hand-batch]:-}" ]; then
		awk -v h="${per[${V}hand-batch]}" -v o="${per[${V}rows-batch]}" -v v="$name" \
			'BEGIN {printf "ratio hand / outbox (%s-batch, decisions as arrays): %.2f\n", v, h / o}'
	fi
done
