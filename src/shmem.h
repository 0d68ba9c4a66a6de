/*-------------------------------------------------------------------------
 *
 * shmem.h
 *	  Shared memory: the control struct, its lock table, counters and memory.
 *
 * Copyright (c) 2026, projcache developers
 *
 *-------------------------------------------------------------------------
 */
#ifndef PROJCACHE_SHMEM_H
#define PROJCACHE_SHMEM_H

#include "projcache.h"
#include "keycache_caches.h"

/* ----------------------------------------------------------------
 * Counters: cumulative since start or projcache.reset_stats()
 * ----------------------------------------------------------------
 */
typedef enum PcCounter
{
	PC_CTR_HITS,				/* reads served a value */
	PC_CTR_MISSES,				/* reads of unknown keys */
	PC_CTR_PENDING_READS,		/* reads of keys still pending */
	PC_CTR_FETCH_REQUESTS,		/* requests sent to the worker */
	PC_CTR_FETCH_CALLS,			/* calls of the fetch function */
	PC_CTR_FETCHED_KEYS,		/* keys asked for in those calls */
	PC_CTR_NOT_MODIFIED,		/* not_modified answers */
	PC_CTR_PENDING_RESULTS,		/* pending answers */
	PC_CTR_FETCH_ERRORS,		/* failed calls and contract breaches */
	PC_CTR_EVICTIONS,
	PC_CTR_REFRESHES,
	PC_CTR_REQUEST_OVERFLOWS,	/* request ring full: fell back to a scan */
	/* completed fetches by time since the previous success */
	PC_CTR_DELAY_LTE15S,
	PC_CTR_DELAY_LTE30S,
	PC_CTR_DELAY_LTE60S,
	PC_CTR_DELAY_LTE120S,
	PC_CTR_DELAY_LTE300S,
	PC_CTR_DELAY_LTE600S,
	PC_CTR_DELAY_LTE1800S,
	PC_CTR_DELAY_LTE3600S,
	PC_CTR_DELAY_GT3600S,
	PC_CTR_MEMORY_EVICTIONS,	/* keys the worker evicted to make room */
	PC_CTR_EXPIRY_EVICTIONS,	/* keys evicted at expiry + grace period */
	PC_CTR_REQUESTED_EVICTIONS, /* keys evicted by projcache.evict() */
	PC_CTR_REFUSED_READS,		/* reads of new keys that found no room */
	PC_CTR_DROPPED_FETCHES,		/* keys read once, dropped unfetched */
	PC_NUM_COUNTERS
} PcCounter;

/* ----------------------------------------------------------------
 * Shared memory (shmem.c)
 *
 * Which lock protects what:
 * - mutex (spinlock): worker_latch, worker_pid.
 * - ring_lock (LWLock): the request rings (keycache_ring.c).
 * - snap_map_lock (LWLock): which snapshot each slot holds (dbid, name,
 *	 registry id, generation); snap_slot_locks[i]: the rest of slot i, and
 *	 the DSA chunks it points to (snapshot_store.c).
 * - the key map's own partition LWLocks (keycache_map.c): each
 *	 partition's bucket array and chains, and every field of its entries
 *	 but 'marks', which is atomic (readers set bits in it under the shared
 *	 lock); an entry's chunks and the message it points to are read only
 *	 under its lock, and replaced or freed only by the worker, after it has
 *	 unlinked them under the exclusive lock.
 * - wal_lock (LWLock): the list of keys replayed on a standby and waiting
 *	 for their transaction's commit (wal.h).
 * - snap_tomb_lock (LWLock): the snapshot tombstone file on disk
 *	 (snapshot_dump.c): held exclusively while a backend appends to it and
 *	 while the worker rewrites it, so that no tombstone appended
 *	 meanwhile is lost.  Held across that file's I/O (both are rare);
 *	 taken alone, never with another lock of ours.
 * - role_lock (LWLock): which role each of role_slots counts keys for
 *	 (PcRoleSlot.role).  Shared to find a role's slot and add a key to its
 *	 count, exclusive to give a slot whose count is zero to another role;
 *	 taken alone, never with another lock of ours.  The counts themselves
 *	 (PcRoleSlot.keys and .bytes) are atomics: a key is added under
 *	 role_lock before its entry is created, and taken off, without it, by
 *	 whoever unlinks the entry (pc_keymap_delete, the worker) or gives up
 *	 creating it; the worker changes .bytes, under the entry's lock, when
 *	 it replaces the entry's chunk.  So a slot's count is the number of
 *	 entries whose owner it is, plus the creations under way, and a slot
 *	 counted for a role is never given to another while an entry names it.
 * - caches.lock (LWLock): the named caches' slots (keycache_caches.h):
 *	 which are in use, and each one's registration.  Exclusive for the
 *	 worker's publication, shared for readers' copies and the DROP ROLE
 *	 guard; taken alone, never with another lock of ours, and nothing that
 *	 can raise an ERROR runs under it.  Each slot's counters, and
 *	 caches.changed and caches.generation, are atomics.
 * - the DSA's own lock: its allocator.
 * - counters, memory_used and snap_memory_used (DSA bytes taken, as
 *	 pc_dsa_footprint counts them, by keys and messages and by snapshot
 *	 rows), clock_offset_ms, ring_overflow, admission_closed,
 *	 role_room_wanted and each
 *	 slot's room_wanted, config_generation, registry_generation,
 *	 keys_restoring, restore_wait_until: atomics.
 *
 * Lock order.  Only two of these locks nest, and always the same way:
 * snap_map_lock, then one of snap_slot_locks (a reader pins the slot it
 * found; redo of a snapshot's refresh marks its slot stale).  Never a
 * slot lock, then the map lock; never two slot locks.  Every other lock of
 * ours (a key map partition, ring_lock, role_lock, wal_lock,
 * snap_tomb_lock, caches.lock) and snap_map_lock itself are taken with no lock of ours
 * held, and none of ours is taken under them.  Below all of them come the
 * DSA area's own lock (an allocation under a partition or slot lock) and,
 * last, the spinlock mutex, under which nothing is taken.  pc_lock_alone()
 * and pc_lock_slot() take a lock of each kind and assert the order
 * (assert-enabled builds); key map partitions assert it in
 * keycache_map.c's entry functions.
 * ----------------------------------------------------------------
 */
/*
 * Keys per role (keycache_map.c): each key of the map counts for the role
 * that created it, in one of a fixed number of slots; PcEntry.owner is
 * the slot's index.  Keys created by superusers or by the worker (a warm
 * restart's load) count for none (PC_ROLE_NONE).  A role gets a slot the
 * first time it creates a key and keeps it while it has keys; once every
 * slot counts for a role with keys, the roles that come next share the
 * last one (PC_ROLE_OVERFLOW), and its bound.
 */
#define PC_ROLE_SLOTS		256
#define PC_ROLE_NONE		0
#define PC_ROLE_OVERFLOW	(PC_ROLE_SLOTS - 1)

typedef struct PcRoleSlot
{
	Oid			role;			/* InvalidOid: never used (role_lock) */
	pg_atomic_uint32 keys;		/* entries it owns, and creations under way */
	pg_atomic_uint64 bytes;		/* what their chunks take (pc_dsa_footprint) */
	pg_atomic_uint32 room_wanted;	/* a read found the role at its bound */
} PcRoleSlot;

typedef struct PcRequestRing
{
	uint64		write_pos;		/* bytes ever written */
	uint64		read_pos;		/* bytes ever consumed */
	uint32		capacity;
	char		data[FLEXIBLE_ARRAY_MEMBER];
} PcRequestRing;

typedef struct PcShared
{
	slock_t		mutex;
	Latch	   *worker_latch;	/* NULL while no worker runs */
	int			worker_pid;

	LWLock	   *ring_lock;
	pg_atomic_uint32 ring_overflow; /* a request did not fit in the ring */
	pg_atomic_uint32 room_wanted;	/* a reader found no room for a new key */
	pg_atomic_uint32 admission_closed;	/* every value that could make room
										 * for a new key was read within
										 * projcache.admission_window: readers
										 * create no key (keycache_worker.c) */

	pg_atomic_uint64 clock_offset_ms;	/* projcache.debug_clock */
	TimestampTz wall_anchor;	/* the wall clock when projcache's clock read
								 * mono_anchor_ms (set once, at start) */
	int64		mono_anchor_ms;
	pg_atomic_uint64 config_generation; /* bumped when the worker (re)loads
										 * its settings */
	pg_atomic_uint64 registry_generation;	/* bumped after a transaction that
											 * changed a snapshot registry
											 * commits */
	pg_atomic_uint32 keys_restoring;	/* the key dump is to be loaded, and
										 * its load has not ended yet
										 * (keycache_dump.c) */
	pg_atomic_uint64 restore_wait_until;	/* on pc_real_now_ms(): no read
											 * waits for the key dump past it;
											 * 0 until a read first asks */
	/* written often: keep off the line of the fields above */
	char		pad[PG_CACHE_LINE_SIZE];
	pg_atomic_uint64 counters[PC_NUM_COUNTERS];
	pg_atomic_uint64 memory_used;	/* DSA bytes taken by keys, values and
									 * messages (pc_dsa_footprint) */
	pg_atomic_uint64 snap_memory_used;	/* by snapshot rows, in flight or
										 * published */
	pg_atomic_uint64 nentries;	/* entries in the key map */
	pg_atomic_uint64 entry_serial;	/* last PcEntry.serial handed out */
	TimestampTz stats_reset;	/* under mutex */

	int			dsa_tranche;
	int			keymap_tranche;
	dsa_pointer keymap_handle;	/* the key map (keycache_map.c) */

	ConditionVariable key_cv[PC_NUM_KEY_CVS];

	Size		dsa_offset;		/* from the start of this struct */
	Size		ring_offset;
	Size		snap_offset;	/* PcSnapSlot[max_snapshots] */
	int			max_snapshots;
	LWLock	   *snap_map_lock;	/* which slot caches which snapshot */
	LWLockPadded *snap_slot_locks;	/* one per slot; see snapshot_store.c */
	Size		wal_offset;		/* PcWalPending */
	LWLock	   *wal_lock;		/* the replayed keys list (wal.h) */
	LWLock	   *snap_tomb_lock; /* the snapshot tombstone file */

	/* Keys per role (keycache_map.c) */
	LWLock	   *role_lock;		/* which role each slot counts for */
	pg_atomic_uint32 role_room_wanted;	/* some slot's room_wanted is set */
	PcRoleSlot	role_slots[PC_ROLE_SLOTS];

	/* The named caches (keycache_caches.c) */
	PcCaches	caches;

	/* The dumps (keycache_dump.c, snapshot_dump.c); under mutex */
	bool		keys_dump_read; /* a worker read the key dump (or tried) */
	uint64		loaded_keys;	/* keys it loaded */
	uint64		loaded_snapshots;	/* snapshots given their dumped rows */
	int64		loaded_dump_age_ms; /* how old the dump was then */
	TimestampTz dump_written_at;	/* the last key dump written, or 0 */
	uint64		dump_keys;		/* keys in it */
} PcShared;

extern PcShared *pc_shared;

extern void pc_shmem_request(void);
extern void pc_shmem_startup(void);
extern void pc_attach(void);
extern dsa_area *pc_area(void);
extern PcRequestRing *pc_ring(void);
extern void pc_wake_worker(void);
extern void pc_count(PcCounter counter, uint64 n);
extern Size pc_memory_used(void);
extern Size pc_key_memory_used(void);
extern Size pc_snap_memory_used(void);
extern dsa_pointer pc_alloc(Size size);
extern dsa_pointer pc_store_message(const char *message, Size *size);
extern void pc_free(dsa_pointer dp, Size size);
extern Size pc_dsa_footprint(Size size);
extern Size pc_dsa_capacity(Size size);
extern Size pc_memory_limit(void);
extern Size pc_key_memory_bound(void);
extern Size pc_snap_memory_limit(void);
extern bool pc_snap_memory_reserve(Size footprint);
extern void pc_snap_memory_release(Size footprint);
extern void pc_check_memory_settings(void);
extern void pc_require_loaded(void);
extern char *pc_copy_no_oom(const void *src, Size len, bool nul_terminate,
							bool *oom);
pg_noreturn extern void pc_report_oom(const char *what);

/* Lock order (see "Lock order" above). */
typedef enum PcLockKind
{
	PC_LOCK_ALONE,				/* with no lock of ours held */
	PC_LOCK_SNAP_SLOT			/* with none held but snap_map_lock */
} PcLockKind;

extern bool pc_lock_order_ok(PcLockKind kind);

/* Take a lock that nests in no other of ours. */
static inline void
pc_lock_alone(LWLock *lock, LWLockMode mode)
{
	Assert(pc_lock_order_ok(PC_LOCK_ALONE));
	LWLockAcquire(lock, mode);
}

/* Take a snapshot slot's lock, alone or under snap_map_lock. */
static inline void
pc_lock_slot(LWLock *lock, LWLockMode mode)
{
	Assert(pc_lock_order_ok(PC_LOCK_SNAP_SLOT));
	LWLockAcquire(lock, mode);
}

#endif							/* PROJCACHE_SHMEM_H */
