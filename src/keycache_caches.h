/*-------------------------------------------------------------------------
 *
 * keycache_caches.h
 *	  The named caches as every backend sees them: the registry's copy in
 *	  shared memory (keycache_caches.c), which the key cache's worker
 *	  writes from projcache.cache_registry (keycache_registry.c).
 *
 * Copyright (c) 2026, projcache developers
 *
 *-------------------------------------------------------------------------
 */
#ifndef PROJCACHE_KEYCACHE_CACHES_H
#define PROJCACHE_KEYCACHE_CACHES_H

#include "datatype/timestamp.h"
#include "port/atomics.h"
#include "storage/lwlock.h"

#define PC_MAX_CACHES			64	/* named caches registered at once */
#define PC_MAX_CACHE_READERS	32	/* roles granted one cache */
#define PC_DEFAULT_CACHE_NAME	"default"
#define PC_MIN_CACHE_MEMORY		(64 * 1024) /* a cache's own budget, at least */
/* A fetch function's qualified signature, every name quoted at worst */
#define PC_CACHE_FUNCTION_LEN	(4 * NAMEDATALEN + 64)
#define PC_CACHE_SETTING_UNSET	(-1)	/* the server's setting applies */
/* A fetch of a cache of an owner who is not a superuser, at most, when
 * projcache.fetch_timeout is 0 (none) */
#define PC_CACHE_MAX_FETCH_MS	(60 * 1000)

/*
 * The cache a key is of, resolved once from its prefix where the key comes
 * in (a reader's call, the dump's record) and kept in its entry: the slot
 * of its named cache and that slot's generation, which tells the cache that
 * holds the slot from any that held it before (keycache_caches.c), or
 * PC_CACHE_ID_DEFAULT for the default cache.  Never written to disk: the
 * dump tags a key with its cache's creation time instead.
 */
typedef uint32 PcCacheId;

#define PC_CACHE_ID_DEFAULT		((PcCacheId) 0)
#define PC_CACHE_ID_GEN_MASK	0xFFFFFFU
#define PC_CACHE_ID(slot, gen) \
	((PcCacheId) ((((uint32) (gen) & PC_CACHE_ID_GEN_MASK) << 8) | \
				  (uint32) ((slot) + 1)))
/* Its slot, or -1 (PC_CACHE_DEFAULT) for the default cache. */
#define pc_cache_id_slot(id)	((int) ((id) & 0xFF) - 1)

/* What pc_cache_of() and pc_key_cache_for_read() say besides a slot. */
#define PC_CACHE_DEFAULT		(-1)	/* the default cache's */
#define PC_CACHE_UNAVAILABLE	(-2)	/* a cache's that is opening or
										 * closing, or maybe one's: the
										 * registry is not published yet */

/* Counters of one cache, shown in projcache.caches. */
typedef enum PcCacheCounter
{
	PC_CACHE_HITS,
	PC_CACHE_MISSES,
	PC_CACHE_FETCH_CALLS,
	PC_CACHE_FETCH_ERRORS,
	PC_CACHE_EVICTIONS,
	PC_CACHE_ENTRIES,
	PC_CACHE_MEMORY_USED,
	PC_CACHE_NUM_COUNTERS
} PcCacheCounter;

/* Why a cache is put aside, as projcache.caches' last_error shows it. */
#define PC_CACHE_ERROR_LEN		256

/*
 * A cache's registration: its row of projcache.cache_registry, and the
 * function the worker bound it to (keycache_caches.c, bind_function()).
 */
typedef struct PcCacheReg
{
	char		name[NAMEDATALEN];
	Oid			owner;
	bool		owner_is_superuser; /* when the registry was read */
	Oid			fetch_role;		/* InvalidOid: the owner */
	char		fetch_function[PC_CACHE_FUNCTION_LEN];	/* qualified signature */
	Oid			function;		/* the function registered; InvalidOid: none
								 * could be bound, and the cache is put aside
								 * (bind_error says why) */
	Oid			function_owner; /* its owner when it was bound */
	char		bind_error[PC_CACHE_ERROR_LEN];
	int64		expiry_ms;		/* each PC_CACHE_SETTING_UNSET or ms */
	int64		grace_period_ms;
	int64		refresh_interval_ms;
	int64		max_retry_backoff_ms;
	int64		fetch_timeout_ms;
	int64		batch_size;		/* PC_CACHE_SETTING_UNSET or keys */
	int64		max_memory;		/* PC_CACHE_SETTING_UNSET or bytes */
	int			nreaders;
	Oid			readers[PC_MAX_CACHE_READERS];
	TimestampTz created_at;		/* tells a cache made again from the last */
} PcCacheReg;

/*
 * One registered cache.  Its registration is written by the worker, and
 * narrowed by a backend whose revoke_cache or drop_cache commits
 * (pc_caches_narrow_at_commit()), under PcCaches.lock held exclusively,
 * and copied by readers under it held shared.  The counters are atomics; they last
 * while the cache stays registered (the worker matches a reloaded
 * registry's rows by name and creation time).
 */
typedef struct PcCacheSlot
{
	bool		in_use;
	bool		open;			/* its keys are routed to it; false while the
								 * worker clears its prefix (opening or
								 * closing) */
	uint32		gen;			/* bumped each time a cache takes the slot:
								 * the PcCacheId of its keys says it */
	PcCacheReg	reg;
	pg_atomic_uint64 counters[PC_CACHE_NUM_COUNTERS];
} PcCacheSlot;

/*
 * The calls of one owner's fetch functions that outlived their timeout and
 * ended the worker: counted by pc_cache_note_overrun() in a signal
 * handler, read by the worker alone, which puts aside every cache of that
 * owner until paused_until_ms (on pc_real_now_ms()), longer for each new
 * one.  Kept by owner, not by cache or function, so that dropping the
 * cache or the function and making it again does not start the count
 * over.  Only the worker writes owner, function (the last that overran),
 * overruns_seen and paused_until_ms.
 */
typedef struct PcCacheOverrun
{
	Oid			owner;			/* InvalidOid: a free entry */
	Oid			function;
	pg_atomic_uint32 overruns;
	uint32		overruns_seen;
	int64		paused_until_ms;
} PcCacheOverrun;

/* Twice the caches: every cache's own, and as many kept after a drop. */
#define PC_MAX_CACHE_OVERRUNS	(2 * PC_MAX_CACHES)

/*
 * A role a committed registry change named, until the worker has
 * published that change into the slots: what a DROP ROLE in another
 * database than projcache.database is refused for meanwhile, as it cannot
 * read the registry there (refuse_named_role_drop()).  Reserved at
 * PRE_COMMIT (where a full table can still fail the transaction), one
 * entry for a role and the user naming it however many of that user's
 * transactions name it; kept until every transaction that reserved it has
 * ended and published_reload has reached published_by.  A user's
 * transactions hold at most PC_NAMED_ROLES_PER_ROLE entries, so that one
 * role cannot take them all from the others.  Under PcCaches.lock.
 */
#define PC_MAX_NAMED_ROLES		128
#define PC_NAMED_ROLES_PER_ROLE	(PC_MAX_CACHE_READERS + 2)

typedef struct PcNamedRole
{
	Oid			role;			/* InvalidOid: a free entry */
	Oid			by;				/* the user whose transactions named it */
	uint32		uncommitted;	/* those between PRE_COMMIT and their end */
	uint64		published_by;	/* 0: none committed; else the worker's reload
								 * that publishes the last */
} PcNamedRole;

/*
 * The named caches' part of shared memory ("projcache caches").  lock
 * (tranche "projcache_caches"): which slots are in use, and each one's
 * registration.  Exclusive for the worker's publication, shared for
 * readers' copies and the DROP ROLE guard; taken alone, never with another
 * lock of ours, and nothing that can raise an ERROR runs under it.  Each
 * slot's counters, and changed and generation, are atomics.
 */
typedef struct PcCaches
{
	LWLock	   *lock;			/* the slots' registrations */
	pg_atomic_uint32 changed;	/* a change committed: reload the registry */
	pg_atomic_uint64 generation;	/* bumped at each reload that changed a
									 * slot, and at each narrowing */
	pg_atomic_uint64 narrowings;	/* bumped at each narrowing at commit: a
									 * reload that read the registry before it
									 * must not publish */
	pg_atomic_uint64 reloads_started;	/* the worker's reloads so far */
	pg_atomic_uint64 published_reload;	/* the number of the last one that
										 * published what it read */
	bool		loaded;			/* the worker published the registry since the
								 * server started */
	PcCacheSlot slots[PC_MAX_CACHES];
	PcCacheOverrun overruns[PC_MAX_CACHE_OVERRUNS];
	PcNamedRole named[PC_MAX_NAMED_ROLES];
} PcCaches;

extern void pc_caches_shmem_request(void);
extern void pc_caches_shmem_startup(void);
extern PcCacheSlot *pc_cache_slot(int s);

/* The part's struct, for the named caches' own files (keycache_cache_*.c). */
extern PcCaches *pc_caches_shared;
extern Oid	pc_caches_registry_relid(void);
extern int	pc_caches_read_registry(PcCacheReg *regs, bool for_worker);
extern void pc_caches_install_hooks(void);
extern void pc_caches_changed(void);
extern void pc_caches_reserve_named(const Oid *roles, int n, int *entries);
extern void pc_caches_commit_named(const int *entries, int n);
extern void pc_caches_release_named(const int *entries, int n);
extern bool pc_caches_reload_due(int64 now_ms, long *sleep_ms);
typedef void (*PcCacheEvictFn) (const char *prefix, uint32 len);
extern void pc_caches_reload(int64 now_ms, PcCacheEvictFn evict_prefix);
extern int	pc_cache_of(PcCacheId id, PcCacheReg *reg);
extern int	pc_key_cache_for_read(const char *key, uint32 len, PcCacheId *id);
extern bool pc_cache_dump_tag(PcCacheId id, bool *tagged, TimestampTz *tag);
extern bool pc_key_restorable(const char *key, uint32 len, bool tagged,
							  TimestampTz tag, PcCacheId *id);
extern bool pc_caches_published(void);
extern bool pc_caches_in_use(void);
extern uint64 pc_caches_generation(void);
extern bool pc_fetch_escalates(Oid fn, Oid runas);
extern int	pc_cache_overrun_entry(const PcCacheReg *reg);
extern int64 pc_cache_paused_ms(const PcCacheReg *reg, int64 now_ms);
extern void pc_cache_note_overrun(int entry);
extern void pc_caches_narrow_at_commit(const char *name, bool drop,
									   Oid reader);
extern void pc_cache_count(int slot, PcCacheCounter counter, uint64 n);
extern bool pc_interval_ms(const Interval *iv, int64 *ms);
extern bool pc_cache_may_read(const PcCacheReg *reg);
extern bool pc_registry_name_ok(const char *name);
extern Oid	pc_cache_bound_function(const char *signature, Oid stored_oid,
									const char *owner_name, Oid cache_owner);

#endif							/* PROJCACHE_KEYCACHE_CACHES_H */
