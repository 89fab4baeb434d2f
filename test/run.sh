#!/usr/bin/env bash
# Run every test of outbox against a real PostgreSQL 15 server.
#
#   bash test/run.sh                  # all layers
#   bash test/run.sh regress tap      # only some layers (deps, regress,
#                                     # isolation, pgtap, tap, citus, package)
#   TAP_FILES="020 050" bash test/run.sh tap   # only TAP files whose names contain these
#   CITUS_FILES="110" bash test/run.sh citus   # only test/citus files whose names contain these
#   CITUS_VERBOSE=1 ...                       # also print the output of the files that pass
#
# On a fresh Debian 12 machine, run as root: it installs what is missing from
# Debian's archive (test/lib.sh: OUTBOX_PACKAGES, OUTBOX_TEST_PACKAGES),
# builds with warnings as errors, installs the extension and outbox-relay,
# and runs the layers as the unprivileged `postgres` OS user through the
# Makefile's targets:
#   deps       every program, header and Perl module the tests use comes from
#              a package the lists install (not from a recommendation)
#   regress    make installcheck (pg_regress: sql/, expected/)
#   isolation  make installcheck (isolation: test/isolation/specs/)
#   pgtap      make installcheck-pgtap (test/pgtap/*.sql through pg_prove)
#   tap        make prove_installcheck (test/t/*.pl, PostgreSQL::Test::Cluster)
#   citus      test/citus/*.pl on a Citus cluster: Citus built from its
#              source tarball (CITUS_TARBALL, or citus-$CITUS_VERSION.tar.gz
#              in ../shared beside the repository) into PG_CONFIG's server,
#              a coordinator and two workers on 127.0.0.1 (citus and outbox
#              preloaded); "skipped: no Citus" when there is no tarball and
#              no Citus installed
#   package    META.json against the PGXN spec, make install DESTDIR=,
#              man outbox-relay, the Debian packages (dpkg-buildpackage,
#              dpkg-deb -c, lintian)
# regress, isolation and pgtap run on one private cluster started for them
# (outbox preloaded); the TAP tests start their own.  Last, the run checks
# that it left no server running and that every Debian cluster online
# before it is still online.  It ends with one line "N passed, N failed"
# and exits non-zero on any failure.
set -u
set -o pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
. "$ROOT/test/lib.sh"

LAYERS=("$@")
[ ${#LAYERS[@]} -eq 0 ] && LAYERS=(deps regress isolation pgtap tap citus package)

# The Debian clusters online now must still be online at the end.
debian_clusters_online() {
	command -v pg_lsclusters >/dev/null 2>&1 || return 0
	pg_lsclusters --no-header 2>/dev/null | awk '$4 == "online" { print $1 "/" $2 }'
}
CLUSTERS_BEFORE=$(debian_clusters_online)

# OUTBOX_SKIP_BUILD=1 reuses what is installed (for quick runs while developing).
if [ -z "${OUTBOX_SKIP_BUILD:-}" ]; then
	OUTBOX_WERROR=1 outbox_setup "${OUTBOX_TEST_PACKAGES[@]}" "${OUTBOX_CITUS_PACKAGES[@]}" ||
		{ echo "setup failed"; echo "0 passed, 1 failed"; exit 1; }
fi
outbox_paths || { echo "no pg_config at $PG_CONFIG"; echo "0 passed, 1 failed"; exit 1; }

# The tests run in a copy of the tree that the postgres OS user owns.
WORK=$(mktemp -d /tmp/outbox-test.XXXXXX)
mkdir "$WORK/src"
tar -C "$ROOT" --exclude=.git -cf - . | tar -C "$WORK/src" -xf -
outbox_give_to_pg_user "$WORK"
trap 'outbox_cleanup_work "$WORK"' EXIT

# Environment of every make call: this server, outbox-relay on PATH, the
# git repository (the upgrade tests build the released versions from it).
MAKE_ENV="PG_CONFIG='$PG_CONFIG' PATH='$OUTBOX_RELAY_BINDIR':\$PATH OUTBOX_GIT_DIR='$ROOT'"

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

# One check of a layer that counts its own: check OK|FAIL NAME [REASON].
CP=0
CF=0
check() {
	if [ "$1" = OK ]; then
		CP=$((CP + 1))
	else
		CF=$((CF + 1))
		echo "FAILED: $2${3:+: $3}"
	fi
}

# The one server of regress, isolation and pgtap, started on first use.
# No worker serves their databases (only "postgres", which has no
# extension), so a worker's sweep or purge never races the tests that call
# sweep() and purge(); the worker has its own TAP tests.
SERVER_DATA=
SERVER_PORT=
server() {
	[ -n "$SERVER_DATA" ] && return 0
	SERVER_DATA="$WORK/server"
	SERVER_PORT=$(outbox_free_port)
	if ! outbox_start_cluster "$SERVER_DATA" "$SERVER_PORT" "max_connections = 100
outbox.databases = 'postgres'" >"$WORK/server-start.log" 2>&1; then
		echo "could not start the test server:"
		cat "$WORK/server-start.log" "$SERVER_DATA/server.log" 2>/dev/null | tail -30
		return 1
	fi
}

# Run a make target in the copy against the test server; output in $OUT.
make_on_server() {
	OUT=$(as_pg "cd '$WORK/src' && $MAKE_ENV PGHOST='$SERVER_DATA' PGPORT=$SERVER_PORT make $*" 2>&1)
	MAKE_RC=$?
}

# deps: find the Debian package of each program, header and Perl module the
# tests use, and require it to be installed by the scripts' lists: on a
# machine where someone installed it by hand, a missing name still fails.
run_deps() {
	local allowed f name pkg path root=$OUTBOX_PG_ROOT
	CP=0 CF=0
	allowed=$(
		apt-cache depends --recurse --no-recommends --no-suggests --no-conflicts \
			--no-breaks --no-replaces --no-enhances \
			"${OUTBOX_PACKAGES[@]}" "${OUTBOX_TEST_PACKAGES[@]}" "${OUTBOX_CITUS_PACKAGES[@]}" \
			2>/dev/null | grep -v '^[ <]'
		dpkg-query -W -f='${Package} ${Essential}\n' | awk '$2 == "yes" { print $1 }'
	)
	# The package owning a file (a private copy of PostgreSQL maps to the
	# system's path; merged /usr is tried both ways).
	pkg_of() {
		local p=$1 c
		[ -n "$root" ] && p=${p#"$root"}
		for c in "$p" "$(readlink -f "$p")" "${p#/usr}" "/usr$p"; do
			dpkg-query -S "$c" 2>/dev/null | grep -v '^diversion' | head -1 | sed 's/[:,].*//' | grep . && return 0
		done
		return 1
	}
	need() {
		local what=$1 path=$2 pkg
		if [ -z "$path" ] || [ ! -e "$path" ]; then
			check FAIL "$what" "not found${3:+ (Debian package: $3)}"
		elif ! pkg=$(pkg_of "$path"); then
			check FAIL "$what" "$path belongs to no Debian package"
		elif ! grep -qx "$pkg" <<<"$allowed"; then
			check FAIL "$what" "$path is in package $pkg, which test/lib.sh does not install (add it to OUTBOX_PACKAGES or OUTBOX_TEST_PACKAGES)"
		else
			check OK "$what"
		fi
	}
	for name in "${OUTBOX_TOOLS[@]}"; do
		need "program $name" "$(command -v "$name")"
	done
	for name in "${OUTBOX_PG_TOOLS[@]}"; do
		need "program $name" "$PGBIN/$name"
	done
	need "program pg_regress" "$PG_REGRESS"
	need "program pg_isolation_regress" "$PG_ISOLATION_REGRESS"
	need "extension pgtap" "$("$PG_CONFIG" --sharedir)/extension/pgtap.control" postgresql-15-pgtap
	for name in "${OUTBOX_HEADERS[@]}"; do
		path=$(echo "#include <$name>" | gcc -M -x c -I"$("$PG_CONFIG" --includedir)" \
			-I"$("$PG_CONFIG" --includedir-server)" - 2>/dev/null | tr ' \\' '\n\n' | grep "/$name\$" | head -1)
		need "header $name" "$path"
	done
	# The Perl modules the TAP tests load (other than the repository's own).
	for name in $(cat "$ROOT"/test/t/*.pl "$ROOT"/test/perl/*.pm "$ROOT"/test/citus/*.p[lm] |
		sed -n 's/^use \([A-Z][A-Za-z0-9_:]*\).*/\1/p' | sort -u); do
		[ -f "$ROOT/test/perl/${name//:://}.pm" ] && continue
		[ -f "$ROOT/test/citus/${name//:://}.pm" ] && continue
		path=$(perl -I "$PGXS_DIR/src/test/perl" -e 'my $f = shift; require $f; print $INC{$f}' \
			"${name//:://}.pm" 2>/dev/null)
		need "Perl module $name" "$path"
	done
	# The Python module of the examples' test (test/t/055_examples.pl), with
	# Debian's interpreter.
	need "Python module psycopg" "$(/usr/bin/python3 -c 'import psycopg; print(psycopg.__file__)' 2>/dev/null)" python3-psycopg
	echo "$CP programs, headers and modules from listed packages"
	record deps "$CP" "$CF"
}

# regress and isolation: make installcheck with only that suite; diffs of
# failures are shown.  Every test of the suite ($4: its files) must report
# ok: one that reported nothing (a missing expected file stops the suite
# there) counts as failed, and so does a make that failed.
run_installcheck() {
	local layer=$1 vars=$2 diffs=$3 want p f
	want=$(ls $4 2>/dev/null | wc -l)
	server || { record "$layer" 0 1; return; }
	make_on_server installcheck "$vars"
	echo "$OUT" | grep -E '\.\.\. '
	p=$(echo "$OUT" | grep -cE '\.\.\. ok')
	f=$(echo "$OUT" | grep -cE '\.\.\. FAILED|\.\.\. failed')
	if [ "$f" -gt 0 ] && [ -f "$diffs" ]; then
		head -200 "$diffs"
	fi
	if [ $((p + f)) -lt "$want" ]; then
		echo "$layer: $((want - p - f)) of $want tests reported no result"
		echo "$OUT" | tail -20
		f=$((want - p))
	elif [ "$MAKE_RC" -ne 0 ] && [ "$f" -eq 0 ]; then
		echo "$layer: make installcheck failed"
		echo "$OUT" | tail -20
		f=1
	fi
	record "$layer" "$p" "$f"
}

run_pgtap() {
	local p f
	if ! command -v pg_prove >/dev/null; then
		echo "pg_prove not found: it comes from libtap-parser-sourcehandler-pgtap-perl (only recommended by postgresql-15-pgtap)"
		record pgtap 0 1
		return
	fi
	server || { record pgtap 0 1; return; }
	make_on_server installcheck-pgtap PG_PROVE_OPTS=-v
	echo "$OUT" | grep -E '^(not ok|# |.*\.sql \.\.)' | head -100
	p=$(echo "$OUT" | grep -cE '^ok [0-9]+')
	f=$(echo "$OUT" | grep -cE '^not ok [0-9]+')
	# A file that died without reporting counts as one failure.
	if echo "$OUT" | grep -qE 'Dubious|Parse errors|No plan found|Bad plan'; then
		f=$((f + 1))
	fi
	if [ "$p" -eq 0 ] && [ "$f" -eq 0 ]; then
		echo "$OUT" | tail -20
		f=1
	fi
	record pgtap "$p" "$f"
}

# tap: make prove_installcheck over test/t/*.pl (or the TAP_FILES ones),
# counted per file from prove's verbose output.
run_tap() {
	local files=() file name want pat out rc counts tp=0 tf=0 p f
	for file in "$WORK"/src/test/t/*.pl; do
		[ -f "$file" ] || continue
		name=$(basename "$file")
		if [ -n "${TAP_FILES:-}" ]; then
			want=0
			for pat in $TAP_FILES; do case "$name" in *"$pat"*) want=1 ;; esac; done
			[ $want -eq 1 ] || continue
		fi
		files+=("test/t/$name")
	done
	if [ ${#files[@]} -eq 0 ]; then
		echo "no TAP files${TAP_FILES:+ match TAP_FILES=$TAP_FILES}"
		record tap 0 1
		return
	fi
	out=$(as_pg "cd '$WORK/src' && $MAKE_ENV make prove_installcheck PROVE_FLAGS='-v --merge' PROVE_TESTS='${files[*]}'" 2>&1)
	rc=$?
	echo "$out" >"$WORK/tap.out"
	# Per file: name, ok lines, not ok lines, died (prove's verdict).
	counts=$(echo "$out" | awk '
		/^test\/t\/[^ ]*\.pl \.\./ { if (n != "") print n, p, f, d; n = $1; sub(/.*\//, "", n); p = f = d = 0; next }
		n != "" && /^ *ok [0-9]+/ { p++ }
		n != "" && /^ *not ok [0-9]+/ { f++ }
		n != "" && /^(Dubious|Failed [0-9]+\/[0-9]+ subtests|No plan found|Bad plan|Parse errors)/ { d = 1 }
		END { if (n != "") print n, p, f, d }')
	for file in "${files[@]}"; do
		name=$(basename "$file")
		read -r _ p f died <<<"$(grep "^$name " <<<"$counts")"
		p=${p:-0} f=${f:-0}
		[ "${died:-0}" = 1 ] && [ "$f" -eq 0 ] && f=1
		[ "$p" -eq 0 ] && [ "$f" -eq 0 ] && f=1
		printf '%-40s %4d passed, %d failed\n' "$name" "$p" "$f"
		if [ "$f" -gt 0 ]; then
			# The file's part of the output and its logs.
			awk -v n="$file" 'index($0, n " ..") == 1 { on = 1 } on && /^test\/t\/[^ ]*\.pl \.\./ && index($0, n " ..") != 1 { on = 0 } on' \
				"$WORK/tap.out" | tail -60
			find "$WORK/src/tmp_check/log" -name "*${name%.pl}*" 2>/dev/null | head -5 | while read -r l; do
				echo "---- $l (tail)"; tail -30 "$l"
			done
		fi
		tp=$((tp + p))
		tf=$((tf + f))
	done
	echo "$out" | grep -E '^# [A-Za-z].*(lost|unexpected|duplicat|count|median|took)' | head -10
	if [ $rc -ne 0 ] && [ "$tf" -eq 0 ]; then
		echo "$out" | tail -30
		tf=1
	fi
	record tap "$tp" "$tf"
}

# package: META.json, a staged install, the man page, the Debian packages.
run_package() {
	local version stage deb pkgdir lint out f
	CP=0 CF=0
	version=$(sed -n "s/^default_version[[:space:]]*=[[:space:]]*'\([^']*\)'.*/\1/p" "$ROOT/outbox.control")

	# META.json against the PGXN Meta Spec (one check per rule).
	out=$(cd "$ROOT" && perl test/pgxn-meta.pl META.json outbox.control 2>&1)
	CP=$((CP + $(echo "$out" | grep -c '^ok ')))
	CF=$((CF + $(echo "$out" | grep -c '^not ok ')))
	echo "$out" | grep -E '^not ok|^#' | sed 's/^/META.json: /'
	echo "$out" | grep -qE '^(not )?ok ' || check FAIL "META.json check" "$out"

	# make install DESTDIR= stages everything, creating the directories.
	stage="$WORK/stage"
	if as_pg "cd '$WORK/src' && $MAKE_ENV make -s install DESTDIR='$stage' RELAY_PREFIX='$OUTBOX_RELAY_PREFIX'" >"$WORK/stage.log" 2>&1; then
		check OK "make install DESTDIR="
	else
		check FAIL "make install DESTDIR=" "$(tail -5 "$WORK/stage.log")"
	fi
	for f in "$OUTBOX_RELAY_BINDIR/outbox-relay" "$OUTBOX_RELAY_PREFIX/share/man/man1/outbox-relay.1" \
		"$("$PG_CONFIG" --sharedir)/extension/outbox.control" \
		"$("$PG_CONFIG" --sharedir)/extension/outbox--$version.sql" \
		"$("$PG_CONFIG" --pkglibdir)/outbox.so"; do
		if [ -f "$stage$f" ]; then check OK "staged $f"; else check FAIL "staged $f" "missing"; fi
	done

	# The installed relay is found by name, with the control file's version,
	# and so is its man page.
	out=$(PATH="$OUTBOX_RELAY_BINDIR:$PATH" outbox-relay --version 2>&1)
	if [ "$out" = "outbox-relay $version" ]; then
		check OK "outbox-relay --version"
	else
		check FAIL "outbox-relay --version" "printed \"$out\", expected \"outbox-relay $version\""
	fi
	out=$(PATH="$OUTBOX_RELAY_BINDIR:$PATH" env -u MANPATH man -w outbox-relay 2>&1)
	# (Debian's /usr/local/man is a link to /usr/local/share/man.)
	if [ -n "$out" ] && [ "$(readlink -f "$out")" = "$(readlink -f "$OUTBOX_RELAY_PREFIX/share/man/man1/outbox-relay.1")" ]; then
		check OK "man -w outbox-relay"
	else
		check FAIL "man -w outbox-relay" "gave \"$out\""
	fi

	# The Debian packages, built in a scratch copy like a fresh checkout.
	if (cd "$ROOT" && pg_buildext checkcontrol) >"$WORK/checkcontrol.log" 2>&1; then
		check OK "debian/control matches debian/control.in"
	else
		check FAIL "debian/control matches debian/control.in" "$(cat "$WORK/checkcontrol.log")"
	fi
	if [ "$(cd "$ROOT" && dpkg-parsechangelog -S Version | sed 's/-[^-]*$//')" = "$version" ]; then
		check OK "debian/changelog has version $version"
	else
		check FAIL "debian/changelog has version $version" "it has $(cd "$ROOT" && dpkg-parsechangelog -S Version)"
	fi
	pkgdir="$WORK/deb/outbox-$version"
	mkdir -p "$pkgdir"
	tar -C "$ROOT" --exclude=.git -cf - . | tar -C "$pkgdir" -xf -
	outbox_give_to_pg_user "$WORK/deb"
	if as_pg "cd '$pkgdir' && dpkg-buildpackage -us -uc -b" >"$WORK/deb/build.log" 2>&1; then
		check OK "dpkg-buildpackage"
	else
		check FAIL "dpkg-buildpackage" "$(tail -30 "$WORK/deb/build.log")"
	fi
	deb_has() {
		local deb=$1 list
		shift
		list=$(dpkg-deb -c "$deb" 2>/dev/null | awk '{ print $6 }')
		for f in "$@"; do
			case "$f" in
				!*) ! grep -q "${f#!}" <<<"$list" || { echo "has ${f#!}"; return 1; } ;;
				*) grep -qx "./$f" <<<"$list" || { echo "lacks $f"; return 1; } ;;
			esac
		done
	}
	for deb in postgresql-15-outbox outbox-relay; do
		f=$(ls "$WORK/deb/${deb}_${version}-"*.deb 2>/dev/null | head -1)
		if [ -z "$f" ]; then
			check FAIL "$deb package" "not built"
			continue
		fi
		if [ "$deb" = outbox-relay ]; then
			out=$(deb_has "$f" usr/bin/outbox-relay usr/share/man/man1/outbox-relay.1.gz \
				usr/share/doc/outbox-relay/copyright '!usr/local' '!outbox.so')
		else
			out=$(deb_has "$f" usr/lib/postgresql/15/lib/outbox.so \
				usr/share/postgresql/15/extension/outbox.control \
				"usr/share/postgresql/15/extension/outbox--$version.sql" \
				usr/share/doc/postgresql-15-outbox/copyright '!usr/local' '!bin/outbox-relay')
		fi
		if [ -z "$out" ]; then check OK "$deb file list"; else check FAIL "$deb file list" "$out"; fi
		lint=$(as_pg "lintian --tag-display-limit 0 '$f'" 2>&1)
		echo "$lint" | grep -E '^[WE]: ' | sed "s/^/lintian: /"
		if echo "$lint" | grep -qE '^E: '; then
			check FAIL "lintian $deb" "errors above"
		else
			check OK "lintian $deb"
		fi
	done
	record package "$CP" "$CF"
}

# citus: test/citus/*.pl (or the CITUS_FILES ones) on a Citus cluster.
# Citus is built from its source tarball, in the run's own directory, and
# installed into PG_CONFIG's server, unless that server has this version
# of Citus already (CITUS_REBUILD=1 builds it again).  A coordinator and two
# workers then listen on 127.0.0.1 on ports of their own, with citus and
# outbox preloaded, and are stopped by their pids at the end.  Without the
# tarball and without an installed Citus the layer says "skipped: no
# Citus"; a tarball that does not build fails.
CITUS_VERSION=${CITUS_VERSION:-13.0.5}
CITUS_DIR=
CITUS_PORTS=

# The tarball: CITUS_TARBALL, or citus-$CITUS_VERSION.tar.gz in the shared/
# directory beside the repository or beside its parent directory (a
# worktree).  Prints nothing when there is none.
citus_tarball() {
	local dir
	if [ -n "${CITUS_TARBALL:-}" ]; then
		echo "$CITUS_TARBALL"
		return
	fi
	for dir in "$ROOT/../shared" "$ROOT/../../shared"; do
		if [ -f "$dir/citus-$CITUS_VERSION.tar.gz" ]; then
			readlink -f "$dir/citus-$CITUS_VERSION.tar.gz"
			return
		fi
	done
}

# Whether PG_CONFIG's server has Citus $CITUS_VERSION installed.
citus_installed() {
	local so
	so="$("$PG_CONFIG" --pkglibdir)/citus.so"
	[ -f "$so" ] && [ -f "$("$PG_CONFIG" --sharedir)/extension/citus.control" ] &&
		grep -aq "Citus $CITUS_VERSION on" "$so"
}

# Build the tarball in $WORK/citus-build and install it into PG_CONFIG's
# server; the log is $WORK/citus-build.log.
citus_build() {
	local dir="$WORK/citus-build"
	mkdir -p "$dir"
	tar -C "$dir" --strip-components=1 -xzf "$1" >"$WORK/citus-build.log" 2>&1 &&
		(cd "$dir" && ./configure PG_CONFIG="$PG_CONFIG" &&
			make -j"$(nproc)" autodepend=yes && make install) >>"$WORK/citus-build.log" 2>&1
}

# Every system header the Citus build included comes from a package that
# test/lib.sh installs (OUTBOX_PACKAGES, OUTBOX_CITUS_PACKAGES, their
# dependencies, or an essential package).
citus_check_headers() {
	local allowed header pkg bad=()
	allowed=$(
		apt-cache depends --recurse --no-recommends --no-suggests --no-conflicts \
			--no-breaks --no-replaces --no-enhances \
			"${OUTBOX_PACKAGES[@]}" "${OUTBOX_CITUS_PACKAGES[@]}" 2>/dev/null | grep -v '^[ <]'
		dpkg-query -W -f='${Package} ${Essential}\n' | awk '$2 == "yes" { print $1 }'
	)
	while read -r header; do
		[ -n "$header" ] || continue
		pkg=$(dpkg-query -S "$header" 2>/dev/null | grep -v '^diversion' | head -1 | sed 's/[:,].*//')
		[ -n "$pkg" ] || pkg=$(dpkg-query -S "$(readlink -f "$header")" 2>/dev/null | head -1 | sed 's/[:,].*//')
		grep -qx "${pkg:-none}" <<<"$allowed" || bad+=("$header (${pkg:-no package})")
	done <<<"$(find "$WORK/citus-build" -path '*/.deps/*.Po' ! -name '*.sql.Po' -exec cat {} + |
		tr ' \\' '\n\n' | sed 's/:$//' | grep '^/usr/include/' | sort -u)"
	if [ ${#bad[@]} -eq 0 ]; then
		check OK "Citus's build uses headers of listed packages only"
	else
		check FAIL "Citus's build uses headers of listed packages only" \
			"not installed by test/lib.sh: ${bad[*]}"
	fi
}

# Start the coordinator and the two workers; sets CITUS_PORTS.
citus_start() {
	local name port
	CITUS_DIR="$WORK/citus"
	mkdir -p "$CITUS_DIR"
	outbox_give_to_pg_user "$CITUS_DIR"
	for name in coordinator worker1 worker2; do
		port=$(outbox_free_port)
		if ! outbox_start_cluster "$CITUS_DIR/$name" "$port" "listen_addresses = '127.0.0.1'
shared_preload_libraries = 'citus,outbox'
max_prepared_transactions = 20
max_worker_processes = 32
wal_level = logical
citus.node_conninfo = 'sslmode=disable'" >>"$CITUS_DIR/start.log" 2>&1; then
			echo "could not start the Citus $name:"
			tail -20 "$CITUS_DIR/start.log" "$CITUS_DIR/$name/server.log" 2>/dev/null
			return 1
		fi
		CITUS_PORTS="$CITUS_PORTS${CITUS_PORTS:+ }$port"
	done
}

# Stop every node started by citus_start: SIGINT (fast shutdown) to the
# postmaster pid of its data directory, SIGQUIT if it is still there after
# 30 seconds.
citus_stop() {
	local pidf pid data i
	[ -n "$CITUS_DIR" ] || return 0
	for pidf in "$CITUS_DIR"/*/postmaster.pid; do
		[ -f "$pidf" ] || continue
		data=$(dirname "$pidf")
		pid=$(head -1 "$pidf")
		# only a postmaster of that data directory
		tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -qF -- "$data" || continue
		kill -INT "$pid" 2>/dev/null || continue
		for i in $(seq 300); do
			kill -0 "$pid" 2>/dev/null || break
			sleep 0.1
		done
		kill -QUIT "$pid" 2>/dev/null
	done
	return 0
}

run_citus() {
	local tarball file name want pat out rc p f start n
	CP=0 CF=0
	tarball=$(citus_tarball)
	if [ -z "$tarball" ] && ! citus_installed; then
		echo "skipped: no Citus (no citus-$CITUS_VERSION.tar.gz in ../shared beside the repository, no CITUS_TARBALL, and $PG_CONFIG's server has no Citus $CITUS_VERSION)"
		SUMMARY+=("$(printf '%-10s skipped: no Citus' citus)")
		return
	fi
	if [ -n "$tarball" ] && ! [ -f "$tarball" ]; then
		check FAIL "Citus tarball" "CITUS_TARBALL names $tarball, which does not exist"
		record citus "$CP" "$CF"
		return
	fi
	if [ -n "$tarball" ] && { [ -n "${CITUS_REBUILD:-}" ] || ! citus_installed; }; then
		start=$SECONDS
		if citus_build "$tarball"; then
			echo "Citus $CITUS_VERSION built from $tarball and installed in $((SECONDS - start)) s"
			check OK "Citus $CITUS_VERSION builds and installs"
			citus_check_headers
		else
			check FAIL "Citus $CITUS_VERSION builds and installs" "$(tail -30 "$WORK/citus-build.log")"
			record citus "$CP" "$CF"
			return
		fi
	else
		echo "Citus $CITUS_VERSION is installed in $PG_CONFIG's server already (CITUS_REBUILD=1 builds it again)"
	fi
	if ! citus_installed; then
		check FAIL "Citus $CITUS_VERSION installed" "$("$PG_CONFIG" --pkglibdir)/citus.so is not Citus $CITUS_VERSION"
		record citus "$CP" "$CF"
		return
	fi
	if ! citus_start; then
		citus_stop
		check FAIL "Citus cluster starts"
		record citus "$CP" "$CF"
		return
	fi
	for file in "$WORK"/src/test/citus/*.pl; do
		[ -f "$file" ] || continue
		name=$(basename "$file")
		if [ -n "${CITUS_FILES:-}" ]; then
			want=0
			for pat in $CITUS_FILES; do case "$name" in *"$pat"*) want=1 ;; esac; done
			[ $want -eq 1 ] || continue
		fi
		out=$(as_pg "cd '$WORK/src' && PATH='$OUTBOX_RELAY_BINDIR':\$PATH CITUS_PORTS='$CITUS_PORTS' CITUS_DATA='$CITUS_DIR' PGBIN='$PGBIN' prove -v --merge 'test/citus/$name'" 2>&1)
		rc=$?
		p=$(grep -cE '^ok [0-9]+' <<<"$out")
		f=$(grep -cE '^not ok [0-9]+' <<<"$out")
		[ $rc -ne 0 ] && [ "$f" -eq 0 ] && f=1
		[ "$p" -eq 0 ] && [ "$f" -eq 0 ] && f=1
		printf '%-40s %4d passed, %d failed\n' "$name" "$p" "$f"
		[ -n "${CITUS_VERBOSE:-}" ] && [ "$f" -eq 0 ] && echo "$out"
		if [ "$f" -gt 0 ]; then
			echo "$out" | tail -60
			for n in coordinator worker1 worker2; do
				echo "---- $n server.log (tail)"
				tail -15 "$CITUS_DIR/$n/server.log"
			done
		fi
		CP=$((CP + p))
		CF=$((CF + f))
	done
	citus_stop
	record citus "$CP" "$CF"
}

# Last: nothing the run started is still running, and every Debian cluster
# online before it is online after it.
run_hygiene() {
	local pidf pid c after
	CP=0 CF=0
	[ -n "$SERVER_DATA" ] && outbox_stop_cluster "$SERVER_DATA"
	while read -r pidf; do
		[ -n "$pidf" ] || continue
		pid=$(head -1 "$pidf")
		if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then
			check FAIL "no server left running" "postmaster $pid of $(dirname "$pidf")"
		fi
	done <<<"$(find "$WORK" -name postmaster.pid 2>/dev/null)"
	[ "$CF" -eq 0 ] && check OK "no server left running"
	after=$(debian_clusters_online)
	for c in $CLUSTERS_BEFORE; do
		if grep -qx "$c" <<<"$after"; then
			check OK "Debian cluster $c still online"
		else
			check FAIL "Debian cluster $c still online" "it was online before the run"
		fi
	done
	record hygiene "$CP" "$CF"
}

for layer in "${LAYERS[@]}"; do
	echo "== $layer"
	case "$layer" in
		deps) run_deps ;;
		regress) run_installcheck regress ISOLATION= "$WORK/src/regression.diffs" "$WORK/src/sql/*.sql" ;;
		isolation) run_installcheck isolation REGRESS= "$WORK/src/test/isolation/output_iso/regression.diffs" \
			"$WORK/src/test/isolation/specs/*.spec" ;;
		pgtap) run_pgtap ;;
		tap) run_tap ;;
		citus) run_citus ;;
		package) run_package ;;
		*) echo "unknown layer $layer"; record "$layer" 0 1 ;;
	esac
done
echo "== hygiene"
run_hygiene

echo "== summary"
printf '%s\n' "${SUMMARY[@]}"
echo "$PASSED passed, $FAILED failed"
[ "$FAILED" -eq 0 ] && [ "$PASSED" -gt 0 ]
