#!/usr/bin/env bash
# The cost of ordered delivery per key in user-space instructions per
# command, which repeat from run to run where the wall time of a shared
# machine does not: valgrind's cachegrind around a single-user backend
# (postgres --single, the library preloaded, no worker) that drains
# KEYS x PER_KEY committed commands by "claim B; ack_many of the batch",
# once decided without an ordering key and once with one key per run (the
# keys taking turns, as in bench/ordering.sh's interleaved layout), and
# once more ordered but drained by ack_handover, which leases each key's
# next command to the acking publisher (claim only when it holds none).  The
# drain's instructions are its run's minus those of a run that loads the
# same commands and drains none (start-up, the load and its checkpoint
# cancel out).  Measures the installed build.  Not a test: it prints
# numbers.
#
#   bash bench/ordering-instructions.sh
#   KEYS=1000 PER_KEY=20 bash bench/ordering-instructions.sh
#
# Settings: KEYS (500), PER_KEY (10), B (100), OUTBOX_SKIP_BUILD (measure
# what is installed without building).
set -u
set -o pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
. "$ROOT/test/lib.sh"
OUTBOX_PACKAGES+=(valgrind)

KEYS=${KEYS:-500}
PER_KEY=${PER_KEY:-10}
B=${B:-100}

if [ -z "${OUTBOX_SKIP_BUILD:-}" ]; then
	outbox_setup || exit 1
fi
command -v valgrind >/dev/null || { echo "valgrind is not installed" >&2; exit 1; }
WORK=$(mktemp -d /tmp/outbox-ordering-instructions.XXXXXX)
outbox_give_to_pg_user "$WORK"
trap 'outbox_cleanup_work "$WORK"' EXIT
DATA=$WORK/data
as_pg "'$PGBIN/initdb' -D '$DATA' -A trust -U postgres" >/dev/null || exit 1

# A single-user backend; statements end with a semicolon and a blank line.
single() {
	as_pg "'$PGBIN/postgres' --single -j -D '$DATA' -c shared_preload_libraries=outbox $1"
}
echo "CREATE DATABASE bench;" | single postgres >/dev/null 2>&1
printf 'CREATE EXTENSION outbox;\n\nCREATE TABLE toks (t text);\n' | single bench >"$WORK/setup.log" 2>&1
if grep -q ERROR "$WORK/setup.log"; then
	cat "$WORK/setup.log"
	exit 1
fi

# The input of one run: load the commands (ordered: 1 or 2, or 0), then
# drain rounds of claim B / ack_many (the tokens pass through the table
# toks); with 2, rounds of ack_handover B of the tokens in hand, which
# come back with the leases handed over, and a claim B only when none are
# in hand.
input() {
	local ordered=$1 rounds=$2 okey="" i
	[ "$ordered" != 0 ] && okey=", 'ordering_key', 'key-' || ((g - 1) % $KEYS)"
	printf 'TRUNCATE outbox.commands, outbox.events, outbox.receipts, toks;\n\n'
	# 5,000 decisions per call (outbox.max_batch is 10,000 by default)
	for i in $(seq 0 5000 $((KEYS * PER_KEY - 1))); do
		printf "SELECT count(*) FROM outbox.commit_decisions((SELECT jsonb_agg(jsonb_build_object('run_id', 'run-' || ((g - 1) %% %d), 'seq', (g - 1) / %d + 1, 'event_kind', 'decided', 'command_id', 'cmd-' || g, 'command_kind', 'k'%s, 'payload', jsonb_build_object('n', g, 'to', 'someone@example.org')) ORDER BY g) FROM generate_series(%d, %d) g));\n\n" \
			"$KEYS" "$KEYS" "$okey" "$((i + 1))" "$((i + 5000 < KEYS * PER_KEY ? i + 5000 : KEYS * PER_KEY))"
	done
	printf 'VACUUM ANALYZE outbox.commands;\n\nCHECKPOINT;\n\n'
	for i in $(seq "$rounds"); do
		if [ "$ordered" = 2 ]; then
			printf "INSERT INTO toks SELECT token FROM outbox.claim('w', %d) WHERE NOT EXISTS (SELECT 1 FROM toks);\n\n" "$B"
			printf "WITH a AS (SELECT * FROM outbox.ack_handover('w', ARRAY(SELECT t FROM toks), %d)), d AS (DELETE FROM toks) INSERT INTO toks SELECT token FROM a WHERE token IS NOT NULL;\n\n" "$B"
		else
			printf "INSERT INTO toks SELECT token FROM outbox.claim('w', %d);\n\n" "$B"
			printf "SELECT count(*) FROM outbox.ack_many('w', ARRAY(SELECT t FROM toks));\n\n"
			printf 'DELETE FROM toks;\n\n'
		fi
	done
	printf "SELECT count(*) FILTER (WHERE status = 'published') AS published, count(*) AS commands FROM outbox.commands;\n\n"
}

# Instructions of one single-user backend; the published count goes to
# $WORK/published.
instructions() {
	local ordered=$1 rounds=$2 f="$WORK/in-$1-$2.sql" out="$WORK/out-$1-$2.txt"
	input "$ordered" "$rounds" >"$f"
	chmod 644 "$f"
	as_pg "valgrind --tool=cachegrind --cache-sim=no --cachegrind-out-file=/dev/null \
		'$PGBIN/postgres' --single -j -D '$DATA' -c shared_preload_libraries=outbox bench \
		<'$f' >'$out'" 2>&1 | awk '/I *refs:/ {gsub(",", "", $NF); print $NF}'
	if grep -q ERROR "$out"; then
		grep -m 3 ERROR "$out" >&2
		return 1
	fi
	sed -n 's/.*published = "\([0-9]*\)".*/\1/p' "$out" | tail -1 >"$WORK/published"
}

n=$((KEYS * PER_KEY))
rounds=$(((n + B - 1) / B))
echo "drain of $KEYS keys x $PER_KEY commands by claim $B / ack_many ($rounds rounds): instructions per command"
declare -A per
for ordered in 0 1 2; do
	i0=$(instructions "$ordered" 0) || exit 1
	i1=$(instructions "$ordered" "$rounds") || exit 1
	got=$(cat "$WORK/published")
	[ "$got" = "$n" ] || { echo "the drain published $got of $n commands (ordered=$ordered)" >&2; exit 1; }
	per[$ordered]=$(((i1 - i0) / n))
done
printf '| drain | instructions per command |\n|---|---|\n'
printf '| unordered | %s |\n| ordered | %s |\n| ordered, ack_handover | %s |\n' "${per[0]}" "${per[1]}" "${per[2]}"
awk -v a="${per[1]}" -v b="${per[0]}" 'BEGIN { printf "ordered / unordered: %.2f\n", a / b }'
awk -v a="${per[2]}" -v b="${per[0]}" 'BEGIN { printf "ordered with ack_handover / unordered: %.2f\n", a / b }'
