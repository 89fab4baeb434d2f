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
#
# Settings: SCRIPTS ("outbox hand outbox-batch hand-batch rows-batch";
# rows-batch is outbox-batch with each decision a JSON array of its values
# instead of an object), N1 and N2
# (5 and 105 for the single decisions; a fifth of them for the batches of
# 100), OUTBOX_SKIP_BUILD (measure what is installed without building).
set -u
set -o pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
. "$ROOT/test/lib.sh"
OUTBOX_PACKAGES+=(valgrind)

SCRIPTS=${SCRIPTS:-"outbox hand outbox-batch hand-batch rows-batch"}
N1=${N1:-5}
N2=${N2:-105}

if [ -z "${OUTBOX_SKIP_BUILD:-}" ]; then
	outbox_setup || exit 1
fi
command -v valgrind >/dev/null || { echo "valgrind is not installed" >&2; exit 1; }
WORK=$(mktemp -d /tmp/outbox-instructions.XXXXXX)
outbox_give_to_pg_user "$WORK"
trap 'outbox_cleanup_work "$WORK"' EXIT
DATA=$WORK/data
as_pg "'$PGBIN/initdb' -D '$DATA' -A trust -U postgres" >/dev/null || exit 1

single() {
	as_pg "'$PGBIN/postgres' --single -j -D '$DATA' -c shared_preload_libraries=outbox $1"
}
echo "CREATE DATABASE bench;" | single postgres >/dev/null 2>&1
single bench >"$WORK/setup.log" 2>&1 <<'EOF'
CREATE EXTENSION outbox;
CREATE TABLE biz (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, customer text NOT NULL, amount int NOT NULL);
CREATE TABLE hand_biz (LIKE biz INCLUDING ALL);
CREATE TABLE hand_events (LIKE outbox.events INCLUDING ALL);
CREATE TABLE hand_commands (LIKE outbox.commands INCLUDING ALL) WITH (fillfactor = 80);
EOF
if grep -q ERROR "$WORK/setup.log"; then
	cat "$WORK/setup.log"
	exit 1
fi

# The input of one run: the statements of bench/produce.sh's scripts
# (one transaction a line), n transactions of script.
input() {
	local script=$1 n=$2 g i
	cat <<'EOF'
TRUNCATE biz, hand_biz, hand_events, hand_commands, outbox.events, outbox.commands;
PREPARE ib(text) AS INSERT INTO biz (customer, amount) VALUES ($1, 900) RETURNING id;
PREPARE hb(text) AS INSERT INTO hand_biz (customer, amount) VALUES ($1, 900) RETURNING id;
PREPARE od(bigint) AS SELECT outbox.commit_decision('run-' || $1, 1, 'trip_requested', 'cmd-' || $1, 'lock_budget', '{"amount": 900, "to": "budget"}');
PREPARE hd(bigint) AS WITH e AS (INSERT INTO hand_events (run_id, seq, kind, payload, command_id) VALUES ('run-' || $1, 1, 'trip_requested', NULL, 'cmd-' || $1) RETURNING 1) INSERT INTO hand_commands (command_id, run_id, seq, kind, payload, priority, available_at, due_at) SELECT 'cmd-' || $1, 'run-' || $1, 1, 'lock_budget', '{"amount": 900, "to": "budget"}', 0, now(), now() FROM e;
PREPARE hbt(bigint) AS WITH e AS (INSERT INTO hand_events (run_id, seq, kind, payload, command_id) SELECT 'run-' || $1, g, 'trip_requested', NULL, 'cmd-' || $1 || '-' || g FROM generate_series(1, 100) g RETURNING run_id, seq, command_id) INSERT INTO hand_commands (command_id, run_id, seq, kind, payload, priority, available_at, due_at) SELECT command_id, run_id, seq, 'lock_budget', '{"amount": 900, "to": "budget"}', 0, now(), now() FROM e;
EOF
	printf "PREPARE obt(bigint) AS SELECT count(*) FROM outbox.commit_decisions(pg_catalog.format('["
	for g in $(seq 100); do
		[ "$g" -gt 1 ] && printf ', '
		printf '{"run_id": "run-%%1$s", "seq": %d, "event_kind": "trip_requested", "command_id": "cmd-%%1$s-%d", "command_kind": "lock_budget", "payload": {"amount": 900, "to": "budget"}}' "$g" "$g"
	done
	echo "]', \$1::text)::jsonb);"
	# the same decisions as arrays of their values (commit_decision's order)
	printf "PREPARE obr(bigint) AS SELECT count(*) FROM outbox.commit_decisions(pg_catalog.format('["
	for g in $(seq 100); do
		[ "$g" -gt 1 ] && printf ', '
		printf '["run-%%1$s", %d, "trip_requested", "cmd-%%1$s-%d", "lock_budget", {"amount": 900, "to": "budget"}]' "$g" "$g"
	done
	echo "]', \$1::text)::jsonb);"
	for i in $(seq "$n"); do
		case $script in
			outbox) echo "BEGIN; EXECUTE ib('c1'); EXECUTE od($i); COMMIT;" ;;
			hand) echo "BEGIN; EXECUTE hb('c1'); EXECUTE hd($i); COMMIT;" ;;
			outbox-batch) echo "BEGIN; EXECUTE ib('c1'); EXECUTE obt($i); COMMIT;" ;;
			rows-batch) echo "BEGIN; EXECUTE ib('c1'); EXECUTE obr($i); COMMIT;" ;;
			hand-batch) echo "BEGIN; EXECUTE hb('c1'); EXECUTE hbt($i); COMMIT;" ;;
		esac
	done
}

# Instructions of one single-user backend running n transactions of script.
instructions() {
	local script=$1 n=$2 f="$WORK/in-$1-$2.sql"
	input "$script" "$n" >"$f"
	chmod 644 "$f"
	as_pg "valgrind --tool=cachegrind --cache-sim=no --cachegrind-out-file=/dev/null \
		'$PGBIN/postgres' --single -j -D '$DATA' -c shared_preload_libraries=outbox bench \
		<'$f' >'$WORK/out-$script-$n.txt'" 2>&1 | awk '/I *refs:/ {gsub(",", "", $NF); print $NF}'
	if grep -q ERROR "$WORK/out-$script-$n.txt"; then
		grep -m 3 ERROR "$WORK/out-$script-$n.txt" >&2
	fi
}

declare -A per
printf '| script | instructions per transaction |\n|---|---|\n'
for s in $SCRIPTS; do
	a=$N1
	b=$N2
	case $s in *-batch) a=$(((N1 + 4) / 5)); b=$(((N2 + 4) / 5)) ;; esac
	i1=$(instructions "$s" "$a")
	i2=$(instructions "$s" "$b")
	per[$s]=$(((i2 - i1) / (b - a)))
	printf '| %s | %s |\n' "$s" "${per[$s]}"
done
for k in "" -batch; do
	if [ -n "${per[outbox$k]:-}" ] && [ -n "${per[hand$k]:-}" ]; then
		awk -v h="${per[hand$k]}" -v o="${per[outbox$k]}" -v k="${k:-single}" \
			'BEGIN {printf "ratio hand / outbox (%s): %.2f\n", k, h / o}'
	fi
done
if [ -n "${per[rows-batch]:-}" ] && [ -n "${per[hand-batch]:-}" ]; then
	awk -v h="${per[hand-batch]}" -v o="${per[rows-batch]}" \
		'BEGIN {printf "ratio hand / outbox (-batch, decisions as arrays): %.2f\n", h / o}'
fi
