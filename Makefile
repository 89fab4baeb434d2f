# outbox: PGXS build of the extension and of the outbox-relay program.
#
#   make && make install            # PG_CONFIG=/path/to/pg_config if needed
#   make installcheck               # pg_regress + isolation, on a running server
#   make prove_installcheck         # Perl TAP tests (they start their own servers)
#   make installcheck-pgtap         # pgTAP tests with pg_prove, on a running server
#
# installcheck and installcheck-pgtap use the server that PGHOST/PGPORT/PGUSER
# point at, as a superuser.  The extension need not be preloaded; if it is,
# outbox.databases must not name the test databases (test/installcheck-server.sql).

EXTENSION = outbox
# The version is written once, as default_version in outbox.control.
EXTVERSION := $(shell sed -n "s/^default_version[[:space:]]*=[[:space:]]*'\([^']*\)'.*/\1/p" outbox.control)
ifeq ($(EXTVERSION),)
$(error no default_version in outbox.control)
endif

MODULE_big = outbox
OBJS = src/outbox.o src/args.o src/authz.o src/plans.o src/producer.o src/lease.o src/siphash.o src/leasekey.o src/keys.o src/consumer.o src/shared.o src/bgw.o src/launcher.o src/worker.o src/duties.o src/upkeep.o src/citus.o src/stream.o src/stream_log.o src/stream_claim.o
# Every object includes src/outbox.h: a change there rebuilds them all.
# (That rule comes before PGXS's: plain make still builds everything.)
.DEFAULT_GOAL := all
$(OBJS): src/outbox.h

# The install script is assembled from the parts in src/sql/, in name order.
# The update script from each released version FROM is assembled from the
# hand-written src/update/FROM--$(EXTVERSION).sql (tables, dropped objects)
# followed by the parts of src/sql/ after 00 (functions, types, views,
# grants) and src/update/FROM--$(EXTVERSION).after.sql, see docs/internals.md.  The released versions' install scripts
# (outbox--0.1.0.sql) and frozen update scripts are committed as shipped.
UPDATE_PARTS = $(filter-out src/sql/00_%,$(sort $(wildcard src/sql/*.sql)))
DATA_built = outbox--$(EXTVERSION).sql \
	$(patsubst src/update/%.sql,outbox--%.sql,$(wildcard src/update/*--$(EXTVERSION).sql))
DATA = $(filter-out $(DATA_built),$(wildcard outbox--*.sql))

PG_CONFIG ?= pg_config
PG_CPPFLAGS = -Wall -Wextra -Wno-unused-parameter -Wno-missing-field-initializers
# Warnings are errors in the test build (test/run.sh sets WERROR=1), not in
# a user's build with another compiler.
ifeq ($(WERROR),1)
PG_CPPFLAGS += -Werror
RELAY_WFLAGS = -Werror
endif

# pg_regress suite (sql/ and expected/) and isolation specs
# (test/isolation/specs/ and test/isolation/expected/).
REGRESS = $(patsubst sql/%.sql,%,$(sort $(wildcard sql/*.sql)))
REGRESS_OPTS = --inputdir=. --load-extension=outbox
ISOLATION = $(patsubst test/isolation/specs/%.spec,%,$(sort $(wildcard test/isolation/specs/*.spec)))
ISOLATION_OPTS = --inputdir=test/isolation --outputdir=test/isolation/output_iso --load-extension=outbox
REGRESS_PREP = installcheck-server

# Perl TAP tests (test/t/*.pl, helpers in test/perl/): make prove_installcheck.
# Each test starts its own servers from PG_CONFIG's bindir; outbox-relay is
# found on PATH, outbox-receiver in src/.
PROVE_TESTS ?= $(sort $(wildcard test/t/*.pl))
PROVE_FLAGS += -I test/perl
EXTRA_CLEAN = tmp_check/ test/isolation/output_iso/

# No LLVM bitcode: it needs clang, which a plain server-dev install lacks.
override with_llvm = no

PGXS := $(shell $(PG_CONFIG) --pgxs)
include $(PGXS)

# The rules defined once in src/outbox.h (see there) are copied into it.
OUTBOX_RULE = $(shell sed -n 's/^\#define $(1)[[:space:]][[:space:]]*//p' src/outbox.h)
OUTBOX_STEERING = $(shell sed -n '/^\#define OUTBOX_PLANNER_STEERING/{s/[^"]*\("[a-z_]*"\)[^"]*/\1, /g;s/, $$//;p;}' src/outbox.h)
OUTBOX_FILL = sed \
		-e "s/@OUTBOX_MAX_ID_LEN@/$(call OUTBOX_RULE,OUTBOX_MAX_ID_LEN)/g" \
		-e "s/@OUTBOX_STATUSES@/$(subst ",',$(call OUTBOX_RULE,OUTBOX_STATUSES))/g" \
		-e "s/@OUTBOX_PLANNER_STEERING@/$(subst ",',$(OUTBOX_STEERING))/g"
outbox--$(EXTVERSION).sql: $(sort $(wildcard src/sql/*.sql)) src/outbox.h
	cat $(filter %.sql,$^) | $(OUTBOX_FILL) > $@
	! grep -n '@OUTBOX_[A-Z_]*@' $@
outbox--%--$(EXTVERSION).sql: src/update/%--$(EXTVERSION).sql $(UPDATE_PARTS) $(wildcard src/update/*.after.sql) src/outbox.h
	cat $< $(UPDATE_PARTS) $(wildcard src/update/$*--$(EXTVERSION).after.sql) | $(OUTBOX_FILL) > $@
	! grep -n '@OUTBOX_[A-Z_]*@' $@

.PHONY: prove_installcheck installcheck-pgtap installcheck-server
# Refuse a server whose background worker would serve the test databases.
installcheck-server:
	'$(bindir)/psql' -X -q -d postgres -v dbs='$(CONTRIB_TESTDB) $(ISOLATION_TESTDB) $(PGTAP_DB)' \
		-f test/installcheck-server.sql

prove_installcheck:
	$(prove_installcheck)

# pgTAP: a fresh database with pgtap and outbox, then pg_prove over test/pgtap.
PGTAP_DB ?= outbox_pgtap
PG_PROVE ?= pg_prove
installcheck-pgtap: installcheck-server
	@command -v $(PG_PROVE) >/dev/null || { echo "$(PG_PROVE) not found (Debian: apt-get install libtap-parser-sourcehandler-pgtap-perl)" >&2; exit 1; }
	'$(bindir)/dropdb' --if-exists '$(PGTAP_DB)'
	'$(bindir)/createdb' '$(PGTAP_DB)'
	'$(bindir)/psql' -X -q -v ON_ERROR_STOP=1 -d '$(PGTAP_DB)' \
		-c 'CREATE EXTENSION pgtap' -c 'CREATE EXTENSION outbox'
	$(PG_PROVE) $(PG_PROVE_OPTS) -d '$(PGTAP_DB)' $(sort $(wildcard test/pgtap/*.sql))

# The reference publisher, installed where users run it by name:
# RELAY_BINDIR (default /usr/local/bin) and its man page under RELAY_MANDIR.
RELAY_PREFIX ?= /usr/local
RELAY_BINDIR ?= $(RELAY_PREFIX)/bin
RELAY_MANDIR ?= $(RELAY_PREFIX)/share/man
# Sinks (src/relay/sink.h): stdout, file and http are always built; a
# broker's sink src/relay/sink_NAME.c is built when pkg-config finds its
# client library, named by one line RELAY_PKG_NAME = MODULE.
RELAY_PKG_amqp = librabbitmq
RELAY_PKG_mqtt = libmosquitto
RELAY_PKG_nats = libnats
RELAY_PKG_kafka = rdkafka
RELAY_PKG_redis = hiredis
PKG_CONFIG ?= pkg-config
RELAY_BUILTIN_SINKS = stdout file http
RELAY_BROKER_SINKS = $(foreach s,$(sort $(patsubst RELAY_PKG_%,%,$(filter RELAY_PKG_%,$(.VARIABLES)))),$(if $(wildcard src/relay/sink_$(s).c),$(s)))
RELAY_FOUND_SINKS := $(foreach s,$(RELAY_BROKER_SINKS),$(if $(shell $(PKG_CONFIG) --exists $(RELAY_PKG_$(s)) && echo yes),$(s)))
RELAY_MISSING_SINKS = $(filter-out $(RELAY_FOUND_SINKS),$(RELAY_BROKER_SINKS))
RELAY_SINKS = $(RELAY_BUILTIN_SINKS) $(RELAY_FOUND_SINKS)
RELAY_PKGS = $(foreach s,$(RELAY_FOUND_SINKS),$(RELAY_PKG_$(s)))
RELAY_SRCS = $(filter-out src/relay/sink_%.c,$(wildcard src/relay/*.c)) $(patsubst %,src/relay/sink_%.c,$(RELAY_SINKS))
RELAY_CFLAGS = $(filter -D_FORTIFY_SOURCE%,$(CPPFLAGS)) $(CFLAGS) -Wall -Wextra $(RELAY_WFLAGS) -I$(shell $(PG_CONFIG) --includedir) \
	-I$(shell $(PG_CONFIG) --includedir)/internal \
	$(if $(RELAY_PKGS),$(shell $(PKG_CONFIG) --cflags $(RELAY_PKGS)))
RELAY_LIBS = -L$(shell $(PG_CONFIG) --libdir) -lpq
all: src/outbox-relay
FORCE:
src/relay/sinks.stamp: FORCE
	@echo '$(RELAY_SINKS)' | cmp -s - $@ || echo '$(RELAY_SINKS)' > $@
src/outbox-relay: $(RELAY_SRCS) $(wildcard src/relay/*.h) outbox.control src/relay/sinks.stamp
	$(CC) $(RELAY_CFLAGS) -DRELAY_VERSION='"$(EXTVERSION)"' \
		-DRELAY_SINKS='$(foreach s,$(RELAY_SINKS),X($(s)))' -o $@ $(RELAY_SRCS) \
		$(LDFLAGS) -pthread $(RELAY_LIBS) -lcurl $(if $(RELAY_PKGS),$(shell $(PKG_CONFIG) --libs $(RELAY_PKGS)))
	@echo 'outbox-relay: built with sinks: $(strip $(RELAY_SINKS))$(if $(RELAY_MISSING_SINKS),; not built (no client library found by $(PKG_CONFIG)): $(foreach s,$(RELAY_MISSING_SINKS),$(s) ($(RELAY_PKG_$(s)))))'
# The Kafka mock cluster of the relay's Kafka test (built, not installed).
ifneq ($(filter kafka,$(RELAY_FOUND_SINKS)),)
all: test/kafka-mock
endif
test/kafka-mock: test/kafka_mock.c
	$(CC) $(RELAY_CFLAGS) -o $@ $< $(LDFLAGS) $(shell $(PKG_CONFIG) --libs rdkafka)
# The AMQP reader of the relay's AMQP test (prints the headers table).
ifneq ($(filter amqp,$(RELAY_FOUND_SINKS)),)
all: test/amqp-peek
endif
test/amqp-peek: test/amqp_peek.c
	$(CC) $(RELAY_CFLAGS) -o $@ $< $(LDFLAGS) $(shell $(PKG_CONFIG) --libs librabbitmq)
# make install RELAY_INSTALL=no installs the extension only (the Debian
# packaging puts the relay in a package of its own).
ifneq ($(RELAY_INSTALL),no)
install: install-relay
uninstall: uninstall-relay
endif
# 0.1.0 installed the relay into the server's bindir, where it would shadow
# this one for anything that puts that directory first on PATH: remove it.
install-relay: src/outbox-relay
	$(if $(filter-out $(abspath $(bindir)),$(abspath $(RELAY_BINDIR))),rm -f '$(DESTDIR)$(bindir)/outbox-relay')
	$(MKDIR_P) '$(DESTDIR)$(RELAY_BINDIR)' '$(DESTDIR)$(RELAY_MANDIR)/man1'
	$(INSTALL_PROGRAM) src/outbox-relay '$(DESTDIR)$(RELAY_BINDIR)/outbox-relay'
	$(INSTALL_DATA) src/relay/outbox-relay.1 '$(DESTDIR)$(RELAY_MANDIR)/man1/outbox-relay.1'
uninstall-relay:
	rm -f '$(DESTDIR)$(RELAY_BINDIR)/outbox-relay' '$(DESTDIR)$(RELAY_MANDIR)/man1/outbox-relay.1'

# The local webhook receiver used by the relay's tests, benchmark and demo
# (built, not installed).
RECEIVER_SRCS = $(wildcard src/relay/receiver/*.c)
all: src/outbox-receiver
src/outbox-receiver: $(RECEIVER_SRCS)
	$(CC) $(RELAY_CFLAGS) -pthread -o $@ $(RECEIVER_SRCS) $(LDFLAGS) $(RELAY_LIBS)
clean: clean-relay
clean-relay:
	rm -f src/outbox-relay src/outbox-receiver src/relay/sinks.stamp test/kafka-mock test/amqp-peek

# The monitoring files (docs/monitoring.md): queries of
# prometheus-postgres-exporter, Prometheus configuration, alert rules and
# their tests, a Grafana dashboard.
MONITORING_FILES = $(wildcard monitoring/*.yaml monitoring/*.yml monitoring/*.json)
install: install-monitoring
install-monitoring:
	$(MKDIR_P) '$(DESTDIR)$(datadir)/extension/outbox/monitoring'
	$(if $(MONITORING_FILES),$(INSTALL_DATA) $(MONITORING_FILES) '$(DESTDIR)$(datadir)/extension/outbox/monitoring/')

.PHONY: install-relay uninstall-relay clean-relay install-monitoring FORCE
