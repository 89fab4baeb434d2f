# outbox: PGXS build of the extension and of the outbox-relay program.

EXTENSION = outbox
EXTVERSION = 0.1.0

MODULE_big = outbox
OBJS = src/outbox.o src/args.o src/plans.o src/producer.o src/lease.o src/consumer.o src/shared.o src/bgw.o src/launcher.o src/worker.o src/duties.o src/upkeep.o

# The install script is assembled from the parts in src/sql/, in name order.
DATA_built = outbox--$(EXTVERSION).sql
DATA = $(filter-out $(DATA_built),$(wildcard outbox--*--*.sql))

PG_CONFIG ?= pg_config
PG_CPPFLAGS = -Wall -Wextra -Wno-unused-parameter -Wno-missing-field-initializers -Werror

# pg_regress suite (sql/ and expected/).
REGRESS = $(patsubst sql/%.sql,%,$(sort $(wildcard sql/*.sql)))
REGRESS_OPTS = --inputdir=. --load-extension=outbox

# No LLVM bitcode: it needs clang, which a plain server-dev install lacks.
override with_llvm = no

PGXS := $(shell $(PG_CONFIG) --pgxs)
include $(PGXS)

# The rules defined once in src/outbox.h (see there) are copied into it.
OUTBOX_RULE = $(shell sed -n 's/^\#define $(1)[[:space:]][[:space:]]*//p' src/outbox.h)
OUTBOX_STEERING = $(shell sed -n '/^\#define OUTBOX_PLANNER_STEERING/{s/[^"]*\("[a-z_]*"\)[^"]*/\1, /g;s/, $$//;p;}' src/outbox.h)
outbox--$(EXTVERSION).sql: $(sort $(wildcard src/sql/*.sql)) src/outbox.h
	cat $(filter %.sql,$^) | sed \
		-e "s/@OUTBOX_MAX_ID_LEN@/$(call OUTBOX_RULE,OUTBOX_MAX_ID_LEN)/g" \
		-e "s/@OUTBOX_STATUSES@/$(subst ",',$(call OUTBOX_RULE,OUTBOX_STATUSES))/g" \
		-e "s/@OUTBOX_PLANNER_STEERING@/$(subst ",',$(OUTBOX_STEERING))/g" > $@
	! grep -n '@OUTBOX_[A-Z_]*@' $@

# The reference publisher.
RELAY_SRCS = $(wildcard src/relay/*.c)
RELAY = $(if $(RELAY_SRCS),src/outbox-relay)
all: $(RELAY)
src/outbox-relay: $(RELAY_SRCS) $(wildcard src/relay/*.h)
	$(CC) $(CFLAGS) -Wall -Wextra -Werror -O2 -I$(shell $(PG_CONFIG) --includedir) \
		-o $@ $(RELAY_SRCS) -L$(shell $(PG_CONFIG) --libdir) -lpq -lcurl
install: install-relay
install-relay: $(RELAY)
	$(if $(RELAY),$(INSTALL_PROGRAM) $(RELAY) '$(DESTDIR)$(bindir)/outbox-relay')

# The local webhook receiver used by the relay's tests, benchmark and demo
# (built, not installed).
RECEIVER_SRCS = $(wildcard src/relay/receiver/*.c)
RECEIVER = $(if $(RECEIVER_SRCS),src/outbox-receiver)
all: $(RECEIVER)
src/outbox-receiver: $(RECEIVER_SRCS)
	$(CC) $(CFLAGS) -Wall -Wextra -Werror -O2 -pthread -I$(shell $(PG_CONFIG) --includedir) \
		-o $@ $(RECEIVER_SRCS) -L$(shell $(PG_CONFIG) --libdir) -lpq
clean: clean-relay
clean-relay:
	rm -f src/outbox-relay src/outbox-receiver

.PHONY: install-relay clean-relay
