#!/usr/bin/env bash
# Shared set-up for test/run.sh and demo/run.sh: install what is missing,
# build and install, and run commands as the unprivileged postgres OS user
# (PostgreSQL refuses to run as root).

# The server everything is built for and run on: PG_CONFIG names its
# pg_config (Debian's PostgreSQL 15 by default); every other path comes from it.
PG_CONFIG=${PG_CONFIG:-/usr/lib/postgresql/15/bin/pg_config}

# Clusters take their encoding and collation from the locale: the tests
# expect UTF8 under C.UTF-8 (built into Debian's libc), whatever the caller's
# locale is (a fresh machine or a container may have none, which gives
# SQL_ASCII).  PostgreSQL::Test::Utils drops LC_ALL, so LANG is set too.
export LANG=C.UTF-8 LC_ALL=C.UTF-8
unset LANGUAGE

# Set PGBIN, PGXS_DIR, PG_REGRESS and PG_ISOLATION_REGRESS from $PG_CONFIG,
# and OUTBOX_RELAY_PREFIX, where make install puts outbox-relay (bin/) and
# its man page (share/man/): /usr/local, or, for a relocated copy of
# Debian's PostgreSQL (PG_CONFIG under DIR/usr/lib/postgresql/), DIR/usr/local,
# so that a private build does not replace the machine's outbox-relay.
# OUTBOX_PG_ROOT is that DIR (empty for the system's PostgreSQL).
outbox_paths() {
	[ -x "$PG_CONFIG" ] || return 1
	PGBIN=$("$PG_CONFIG" --bindir)
	PGXS_DIR=$(dirname "$(dirname "$(dirname "$("$PG_CONFIG" --pgxs)")")")
	PG_REGRESS=$PGXS_DIR/src/test/regress/pg_regress
	PG_ISOLATION_REGRESS=$PGXS_DIR/src/test/isolation/pg_isolation_regress
	OUTBOX_PG_ROOT=
	case "$PGBIN" in
		?*/usr/lib/postgresql/*) OUTBOX_PG_ROOT=${PGBIN%%/usr/lib/postgresql/*} ;;
	esac
	OUTBOX_RELAY_PREFIX=${OUTBOX_RELAY_PREFIX:-$OUTBOX_PG_ROOT/usr/local}
	OUTBOX_RELAY_BINDIR=$OUTBOX_RELAY_PREFIX/bin
}
outbox_paths

# Debian packages the build, the tests and the demo need.
OUTBOX_PACKAGES=(
	build-essential
	postgresql-15
	postgresql-server-dev-15
	postgresql-15-pgtap
	libipc-run-perl
	cscope
	universal-ctags
	libpq-dev
	libcurl4-openssl-dev
	curl
	pkg-config
	librdkafka-dev
	libhiredis-dev
	prometheus
	prometheus-postgres-exporter
	gnuplot-nox
)

# More Debian packages the tests need (test/run.sh installs them too).
OUTBOX_TEST_PACKAGES=(
	apt
	perl
	libtap-parser-sourcehandler-pgtap-perl
	man-db
	debhelper
	dpkg-dev
	fakeroot
	lintian
	kcat
	redis-server
	redis-tools
	postgresql-server-dev-all
	postgresql-common
	git
	python3-psycopg
	nodejs
	npm
)

# Debian packages test/run.sh's citus layer builds Citus from its source
# with: the headers and libraries its ./configure and sources use (libcurl,
# lz4, zstd; GSSAPI, OpenSSL and ICU through PostgreSQL's own headers).
OUTBOX_CITUS_PACKAGES=(
	libcurl4-openssl-dev
	liblz4-dev
	libzstd-dev
	libkrb5-dev
	libssl-dev
	libicu-dev
)

# The programs the scripts, the Makefile and the tests run, and the files
# they build against; test/run.sh's deps layer finds the package of each and
# fails unless one of the lists above installs it (directly or as a
# dependency, not as a recommendation).  PostgreSQL's own programs are
# looked up in PG_CONFIG's bindir, the rest on PATH.
OUTBOX_TOOLS=(bash gcc make perl prove pg_prove runuser tar curl man
	dpkg-buildpackage dpkg-deb dh pg_buildext fakeroot lintian apt-cache
	ctags cscope promtool prometheus prometheus-postgres-exporter gnuplot git
	node npm pkg-config kcat redis-server redis-cli)
OUTBOX_PG_TOOLS=(pg_config postgres initdb pg_ctl psql createdb dropdb pgbench pg_dump pg_restore)
OUTBOX_HEADERS=(libpq-fe.h curl/curl.h postgres.h internal/pqexpbuffer.h
	librdkafka/rdkafka.h librdkafka/rdkafka_mock.h hiredis/hiredis.h)

# The AMQP, NATS JetStream and MQTT sinks (built when their library is
# present) and their TAP tests' brokers and client tools.
OUTBOX_TEST_PACKAGES+=(librabbitmq-dev libnats-dev libmosquitto-dev
	rabbitmq-server amqp-tools nats-server mosquitto mosquitto-clients)
OUTBOX_TOOLS+=(epmd rabbitmqctl amqp-consume nats-server mosquitto mosquitto_sub mosquitto_passwd)
OUTBOX_HEADERS+=(amqp.h nats/nats.h mosquitto.h)

# Install the missing packages of OUTBOX_PACKAGES and of the arguments (as
# root), then build and install (with warnings as errors when OUTBOX_WERROR
# is set; outbox-relay under OUTBOX_RELAY_PREFIX).
outbox_setup() {
	local missing=() p provided
	# A name is also met by an installed package that provides it (a
	# Node.js build that bundles npm provides npm and conflicts with it).
	provided=$(dpkg-query -W -f='${db:Status-Abbrev}${Provides}\n' 2>/dev/null | sed -n 's/^ii *//p' |
		tr ',' '\n' | sed 's/^ *//; s/ .*//')
	for p in "${OUTBOX_PACKAGES[@]}" "$@"; do
		dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" && continue
		grep -qx "$p" <<<"$provided" && continue
		missing+=("$p")
	done
	if [ ${#missing[@]} -gt 0 ]; then
		if [ "$(id -u)" -ne 0 ]; then
			echo "missing packages: ${missing[*]} (run as root to install them)" >&2
			return 1
		fi
		echo "installing: ${missing[*]}"
		export DEBIAN_FRONTEND=noninteractive
		apt-get update -qq >/dev/null || return 1
		apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null || return 1
	fi
	outbox_paths || { echo "no pg_config at $PG_CONFIG" >&2; return 1; }
	local mk=(make -s -C "$ROOT" PG_CONFIG="$PG_CONFIG" RELAY_PREFIX="$OUTBOX_RELAY_PREFIX")
	if [ -n "${OUTBOX_WERROR:-}" ]; then
		"${mk[@]}" clean >/dev/null || return 1
		mk+=(WERROR=1)
	fi
	"${mk[@]}" >/dev/null || return 1
	"${mk[@]}" install >/dev/null || return 1
	return 0
}

# Run a shell command line as the postgres OS user (or as is, when not root).
as_pg() {
	if [ "$(id -u)" -eq 0 ]; then
		runuser -u postgres -- bash -c "$1"
	else
		bash -c "$1"
	fi
}

# Let the postgres OS user own a scratch directory.
outbox_give_to_pg_user() {
	if [ "$(id -u)" -eq 0 ]; then
		chown -R postgres:postgres "$1"
	fi
}

outbox_cleanup_work() {
	local d=$1
	# Stop any cluster left running under the scratch directory.
	find "$d" -maxdepth 3 -name postmaster.pid 2>/dev/null | while read -r pidf; do
		as_pg "'$PGBIN/pg_ctl' -D '$(dirname "$pidf")' -m immediate -w stop" >/dev/null 2>&1 || true
	done
	[ -n "${OUTBOX_KEEP_WORK:-}" ] || rm -rf "$d"
}

# A TCP port nobody listens on (the clusters listen on a Unix socket in their
# data directory only, but the demo's webhook receiver needs a real port).
outbox_free_port() {
	local port
	while :; do
		# below the kernel's ephemeral range (32768-60999 on Debian), where
		# an outgoing connection could take the port before it is bound
		port=$((20000 + RANDOM % 12000))
		(echo >"/dev/tcp/127.0.0.1/$port") 2>/dev/null || { echo "$port"; return; }
	done
}

# Initialise and start a private cluster: outbox_start_cluster DATADIR PORT [extra conf lines]
outbox_start_cluster() {
	local data=$1 port=$2 extra=${3:-}
	as_pg "'$PGBIN/initdb' -D '$data' -A trust -U postgres --no-sync >/dev/null &&
		cat >> '$data/postgresql.conf' <<EOF
port = $port
listen_addresses = ''
unix_socket_directories = '$data'
shared_preload_libraries = 'outbox'
outbox.naptime = 200
$extra
EOF
		'$PGBIN/pg_ctl' -D '$data' -l '$data/server.log' -w start >/dev/null"
}

outbox_stop_cluster() {
	as_pg "'$PGBIN/pg_ctl' -D '$1' -m fast -w stop" >/dev/null 2>&1 || true
}

# For the benchmarks: build and install unless OUTBOX_SKIP_BUILD is set, make
# a scratch directory and start a throwaway cluster with the settings every
# benchmark uses plus $2.  Sets WORK, DATA and PORT, and removes it all at
# exit (a caller with its own EXIT trap calls outbox_cleanup_work itself).
outbox_bench_start() {
	local name=$1 extra=${2:-}
	if [ -z "${OUTBOX_SKIP_BUILD:-}" ]; then
		outbox_setup || return 1
	fi
	WORK=$(mktemp -d "/tmp/outbox-$name.XXXXXX")
	outbox_give_to_pg_user "$WORK"
	trap 'outbox_cleanup_work "$WORK"' EXIT
	DATA="$WORK/data"
	PORT=$(outbox_free_port)
	outbox_start_cluster "$DATA" "$PORT" "shared_buffers = 256MB
max_connections = 50
checkpoint_timeout = 30min
max_wal_size = 4GB
$extra" || { cat "$DATA/server.log" 2>/dev/null; return 1; }
}

# Wait until something listens on 127.0.0.1:$1 (10 seconds at most).
outbox_wait_port() {
	local _
	for _ in $(seq 100); do
		(echo >"/dev/tcp/127.0.0.1/$1") 2>/dev/null && return 0
		sleep 0.1
	done
	return 1
}
