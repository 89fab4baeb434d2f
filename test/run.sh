#!/usr/bin/env bash
# Run every test of outbox against a real PostgreSQL 15 server.
#
#   bash test/run.sh                  # all layers
#   bash test/run.sh regress tap      # only some layers (regress, isolation, pgtap, tap)
#   TAP_FILES="020 050" bash test/run.sh tap   # only TAP files whose names contain these
#
# On a fresh Debian 12 machine, run as root: it installs what is missing from
# Debian's archive, builds and installs the extension and outbox-relay, and
# runs the four layers as the unprivileged `postgres` OS user, each on a
# private cluster started with shared_preload_libraries = 'outbox':
#   1. pg_regress      sql/*.sql against expected/*.out
#   2. isolation       test/isolation/specs/*.spec
#   3. pgTAP           test/pgtap/*.sql through pg_prove
#   4. Perl TAP        test/t/*.pl (PostgreSQL::Test::Cluster)
# It ends with one line "N passed, N failed" and exits non-zero on any failure.
set -u
set -o pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
. "$ROOT/test/lib.sh"

LAYERS=("$@")
[ ${#LAYERS[@]} -eq 0 ] && LAYERS=(regress isolation pgtap tap)

# OUTBOX_SKIP_BUILD=1 reuses what is installed (for quick runs while developing).
if [ -z "${OUTBOX_SKIP_BUILD:-}" ]; then
	outbox_setup || { echo "setup failed"; echo "0 passed, 1 failed"; exit 1; }
fi

WORK=$(mktemp -d /tmp/outbox-test.XXXXXX)
cp -r "$ROOT/sql" "$ROOT/expected" "$ROOT/test" "$WORK/"
# pg_regress and isolation: the library is preloaded, but no worker serves
# their databases (only "postgres", which has no extension), so a worker's
# sweep or purge can never race the tests that call sweep() and purge().
# The worker has its own TAP tests.
printf "shared_preload_libraries = 'outbox'\nmax_connections = 100\noutbox.databases = 'postgres'\n" > "$WORK/extra.conf"
outbox_give_to_pg_user "$WORK"
trap 'outbox_cleanup_work "$WORK"' EXIT

PASSED=0
FAILED=0
SUMMARY=()

# Record the counts of one layer.
record() {
	local layer=$1 p=$2 f=$3
	PASSED=$((PASSED + p))
	FAILED=$((FAILED + f))
	SUMMARY+=("$(printf '%-10s %5d passed, %d failed' "$layer" "$p" "$f")")
}

# Run a pg_regress-style suite: run_suite LAYER DRIVER INPUTDIR SUFFIX TESTDIR
# runs every TESTDIR/*.SUFFIX through DRIVER (pg_regress or
# pg_isolation_regress) on a temporary preloaded instance.
run_suite() {
	local layer=$1 driver=$2 inputdir=$3 suffix=$4 testdir=$5 tests out p f
	tests=$(cd "$testdir" 2>/dev/null && ls *."$suffix" 2>/dev/null | sed "s/\.$suffix\$//" | sort | tr '\n' ' ')
	[ -n "$tests" ] || { record "$layer" 0 0; return; }
	out=$(as_pg "cd '$WORK' && '$driver' --temp-instance='$WORK/$layer-tmp' \
		--temp-config='$WORK/extra.conf' --inputdir='$inputdir' --outputdir='$WORK/$layer' \
		--bindir='$PGBIN' --load-extension=outbox --dbname=${layer}_regression $tests" 2>&1)
	echo "$out" | grep -E '\.\.\. ' || echo "$out" | tail -20
	p=$(echo "$out" | grep -cE '\.\.\. ok')
	f=$(echo "$out" | grep -cE '\.\.\. FAILED|\.\.\. failed')
	if [ "$f" -gt 0 ] && [ -f "$WORK/$layer/regression.diffs" ]; then
		head -200 "$WORK/$layer/regression.diffs"
	fi
	[ "$p" -eq 0 ] && [ "$f" -eq 0 ] && f=1
	record "$layer" "$p" "$f"
}

run_pgtap() {
	local files out p f port data
	files=$(cd "$WORK/test/pgtap" 2>/dev/null && ls *.sql 2>/dev/null | sort | sed "s|^|$WORK/test/pgtap/|" | tr '\n' ' ')
	[ -n "$files" ] || { record pgtap 0 0; return; }
	data="$WORK/pgtap-data"
	port=$(outbox_free_port)
	if ! outbox_start_cluster "$data" "$port" >"$WORK/pgtap-start.log" 2>&1; then
		cat "$WORK/pgtap-start.log"
		record pgtap 0 1
		return
	fi
	as_pg "'$PGBIN/createdb' -h '$data' -p $port outbox_tap &&
		'$PGBIN/psql' -X -q -h '$data' -p $port -d outbox_tap -v ON_ERROR_STOP=1 \
			-c 'CREATE EXTENSION pgtap' -c 'CREATE EXTENSION outbox'" >/dev/null 2>&1
	out=$(as_pg "PGHOST='$data' PGPORT=$port pg_prove -v -d outbox_tap $files" 2>&1)
	echo "$out" | grep -E '^(not ok|# |.*\.sql \.\.)' | head -100
	p=$(echo "$out" | grep -cE '^ok [0-9]+')
	f=$(echo "$out" | grep -cE '^not ok [0-9]+')
	# A file that died without reporting counts as one failure.
	if echo "$out" | grep -qE 'Dubious|Parse errors|No plan found|Bad plan'; then
		f=$((f + 1))
	fi
	outbox_stop_cluster "$data"
	[ "$p" -eq 0 ] && [ "$f" -eq 0 ] && f=1
	record pgtap "$p" "$f"
}

run_tap() {
	local file name out rc p f tp=0 tf=0
	for file in "$WORK"/test/t/*.pl; do
		[ -f "$file" ] || continue
		name=$(basename "$file")
		if [ -n "${TAP_FILES:-}" ]; then
			local want=0 pat
			for pat in $TAP_FILES; do case "$name" in *"$pat"*) want=1 ;; esac; done
			[ $want -eq 1 ] || continue
		fi
		out=$(as_pg "cd '$WORK' && mkdir -p '$WORK/tap/$name' && \
			TESTDIR='$WORK/tap/$name' OUTBOX_SRC='$ROOT' PG_REGRESS='$PG_REGRESS' \
			PATH='$PGBIN':\$PATH perl -I '$PGXS_DIR/src/test/perl' '$file'" 2>&1)
		rc=$?
		p=$(echo "$out" | grep -cE '^ *ok [0-9]+')
		f=$(echo "$out" | grep -cE '^ *not ok [0-9]+')
		if [ $rc -ne 0 ] && [ "$f" -eq 0 ]; then
			f=1
		fi
		if [ "$p" -eq 0 ] && [ "$f" -eq 0 ]; then
			f=1
		fi
		printf '%-40s %4d passed, %d failed\n' "$name" "$p" "$f"
		echo "$out" | grep -E '^# [A-Za-z].*(lost|unexpected|duplicat|count|median|took)' | head -10
		if [ "$f" -gt 0 ]; then
			echo "$out" | tail -60
			# Show the server logs of a failed file.
			find "$WORK/tap/$name" -name '*.log' -path '*log*' 2>/dev/null | head -5 | while read -r l; do
				echo "---- $l (tail)"; tail -30 "$l"
			done
		fi
		tp=$((tp + p))
		tf=$((tf + f))
	done
	[ "$tp" -eq 0 ] && [ "$tf" -eq 0 ] && tf=1
	record tap "$tp" "$tf"
}

for layer in "${LAYERS[@]}"; do
	echo "== $layer"
	case "$layer" in
		regress) run_suite regress "$PG_REGRESS" "$WORK" sql "$WORK/sql" ;;
		isolation) run_suite isolation "$PG_ISOLATION_REGRESS" "$WORK/test/isolation" spec "$WORK/test/isolation/specs" ;;
		pgtap) run_pgtap ;;
		tap) run_tap ;;
		*) echo "unknown layer $layer"; record "$layer" 0 1 ;;
	esac
done

echo "== summary"
printf '%s\n' "${SUMMARY[@]}"
echo "$PASSED passed, $FAILED failed"
[ "$FAILED" -eq 0 ] && [ "$PASSED" -gt 0 ]
