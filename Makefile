# projcache: PGXS build, pg_regress, isolation, TAP and unit tests.
#
# "make installcheck" runs the pg_regress, isolation and TAP suites, each
# against its own throwaway instance with projcache preloaded; it uses the
# *installed* library, so run "make install" first.  "make unittest" builds
# and runs the scheduler's unit tests, which need no server.

MODULE_big = projcache
OBJS = \
	src/projcache.o \
	src/clock.o \
	src/shmem.o \
	src/locks.o \
	src/counters.o \
	src/subxact.o \
	src/user_switch.o \
	src/keycache_policy.o \
	src/keycache_map.o \
	src/keycache_entry.o \
	src/keycache_map_check.o \
	src/keycache_keylist.o \
	src/keycache_roles.o \
	src/keycache_ring.o \
	src/keycache_fetch.o \
	src/keycache_fetch_query.o \
	src/keycache_bisect.o \
	src/keycache_worker.o \
	src/keycache_batch.o \
	src/keycache_evict.o \
	src/keycache_launcher.o \
	src/keycache_sql.o \
	src/keycache_invalidate.o \
	src/keycache_registry.o \
	src/keycache_caches.o \
	src/keycache_cache_access.o \
	src/keycache_role_guard.o \
	src/keycache_caches_view.o \
	src/keycache_replay.o \
	src/keycache_dump.o \
	src/dump_file.o \
	src/snapshot_store.o \
	src/snapshot_claim.o \
	src/snapshot_copy.o \
	src/snapshot_load.o \
	src/snapshot_registry.o \
	src/snapshot_regcache.o \
	src/snapshot_view.o \
	src/snapshot_xact.o \
	src/snapshot_sql.o \
	src/snapshot_index.o \
	src/snapshot_fdw.o \
	src/snapshot_dump.o \
	src/stream_registry.o \
	src/stream_conninfo.o \
	src/stream_worker.o \
	src/wal_records.o

EXTENSION = projcache
# Every install and update script: released ones never change, new ones
# join by their names.
DATA = $(sort $(wildcard projcache--*.sql))
PGFILEDESC = "projcache - shared-memory caches for configuration"

REGRESS = $(patsubst sql/%.sql,%,$(sort $(wildcard sql/*.sql)))
REGRESS_OPTS = --temp-instance=tmp_check --temp-config=$(srcdir)/test/regress.conf
ISOLATION = $(patsubst test/isolation/specs/%.spec,%,$(sort $(wildcard test/isolation/specs/*.spec)))
ISOLATION_OPTS = --temp-instance=tmp_check_iso \
	--temp-config=$(srcdir)/test/isolation.conf \
	--inputdir=$(srcdir)/test/isolation

TAP_TESTS = 1
PROVE_TESTS = test/t/*.pl

PG_CPPFLAGS = -I$(srcdir)/src

# The streams' registry parses connection strings with libpq, as
# contrib/dblink links it.
PG_CPPFLAGS += -I$(libpq_srcdir)
SHLIB_LINK_INTERNAL += $(libpq)

# PROJCACHE_ASSERTS=1 builds projcache's own code with assertions on (the
# Assert()s of the server's headers and projcache's lock assertions), as a
# server configured with --enable-cassert would.  PGXS cannot rebuild the
# server; the extension's code is what this checks.  "make clean" first
# when switching.
ifeq ($(PROJCACHE_ASSERTS),1)
PG_CPPFLAGS += -DUSE_ASSERT_CHECKING
endif

# PROJCACHE_WERROR=1 makes every compiler warning an error, with GCC's
# -Wclobbered on too (a variable a longjmp out of PG_TRY may lose); CI
# builds this way on every major.
ifeq ($(PROJCACHE_WERROR),1)
PG_CFLAGS += -Werror -Wclobbered
endif

PG_CONFIG ?= pg_config
PGXS := $(shell $(PG_CONFIG) --pgxs)
include $(PGXS)

# PGXS tracks no header dependencies: every object depends on every header.
$(OBJS): $(wildcard src/*.h)

# The key cache's policy is plain C: it is compiled a second time, without the
# server, into a cmocka test binary.
UNIT_CFLAGS = -std=c99 -Wall -Wextra -Werror -g -O0 -DPOLICY_UNIT_TEST -I$(srcdir)/src
test/unit/test_keycache_policy: test/unit/test_keycache_policy.c src/keycache_policy.c src/keycache_policy.h
	$(CC) $(UNIT_CFLAGS) -o $@ test/unit/test_keycache_policy.c src/keycache_policy.c -lcmocka -lm
test/unit/test_bisect: test/unit/test_bisect.c src/keycache_bisect.c src/keycache_bisect.h src/keycache_policy.c src/keycache_policy.h
	$(CC) $(UNIT_CFLAGS) -o $@ test/unit/test_bisect.c src/keycache_bisect.c src/keycache_policy.c -lcmocka -lm

.PHONY: unittest
unittest: test/unit/test_keycache_policy test/unit/test_bisect
	test/unit/test_keycache_policy
	test/unit/test_bisect

clean: clean-unit
.PHONY: clean-unit
clean-unit:
	rm -f test/unit/test_keycache_policy test/unit/test_bisect
	rm -rf tmp_check_iso output_iso
