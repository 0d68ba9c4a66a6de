/*-------------------------------------------------------------------------
 *
 * projcache.h
 *	  Declarations shared by projcache's source files.
 *
 * Copyright (c) 2026, projcache developers
 *
 *-------------------------------------------------------------------------
 */
#ifndef PROJCACHE_H
#define PROJCACHE_H

#include "access/tupdesc.h"
#include "lib/dshash.h"
#include "nodes/pg_list.h"
#include "port/atomics.h"
#include "storage/condition_variable.h"
#include "storage/latch.h"
#include "storage/lwlock.h"
#include "storage/spin.h"
#include "utils/dsa.h"
#include "utils/timestamp.h"

/* Longest error message kept for a key or a snapshot, in bytes. */
#define PC_MAX_MESSAGE_BYTES	1024

/* Shown as last_error when even the message could not be stored. */
#define PC_UNSTORED_ERROR \
	"the error could not be recorded: projcache.max_memory is used up"


/* Longest key accepted, in bytes. */
#define PC_MAX_KEY_BYTES		1024

/* Condition variables readers wait on, chosen by key hash. */
#define PC_NUM_KEY_CVS			64

/* ----------------------------------------------------------------
 * Settings (projcache.c)
 * ----------------------------------------------------------------
 */
extern char *pc_database;
extern char *pc_fetch_function;
extern char *pc_fetch_role;
extern int	pc_expiry_ms;
extern int	pc_grace_period_ms;
extern int	pc_refresh_interval_ms;
extern int	pc_max_retry_backoff_ms;
extern int	pc_batch_size;
extern int	pc_batch_interval_ms;
extern int	pc_fetch_timeout_ms;
extern int	pc_max_memory_kb;
extern int	pc_max_snapshots;
extern bool pc_debug_clock;

/* ----------------------------------------------------------------
 * Clock (clock.c)
 * ----------------------------------------------------------------
 */
extern int64 pc_now_ms(void);
extern int64 pc_real_now_ms(void);
extern TimestampTz pc_mono_to_timestamp(int64 mono_ms);
extern Datum pc_interval_from_ms(int64 ms);

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
	PC_NUM_COUNTERS
} PcCounter;

/* ----------------------------------------------------------------
 * Shared memory (shmem.c)
 *
 * Which lock protects what:
 * - mutex (spinlock): worker_latch, worker_pid.
 * - ring_lock (LWLock): the request ring (request_ring.c).
 * - snap_map_lock (LWLock): which snapshot each slot holds (dbid, name,
 *	 registry id, generation); snap_slot_locks[i]: the rest of slot i, and
 *	 the DSA chunks it points to (snapshot_store.c).
 * - the key map's own partition LWLocks: every field of a PcEntry except
 *	 'requests', which is atomic; the DSA chunks an entry points to are
 *	 read only under that entry's lock and freed only by the worker, after
 *	 it has unlinked them under the lock.
 * - the DSA's own lock: its allocator.
 * - counters, memory_used (DSA bytes taken, as pc_dsa_footprint counts
 *	 them), clock_offset_ms, ring_overflow,
 *	 config_generation: atomics.
 * ----------------------------------------------------------------
 */
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

	pg_atomic_uint64 clock_offset_ms;	/* projcache.debug_clock */
	pg_atomic_uint64 config_generation; /* bumped when the worker (re)loads
										 * its settings */
	/* written often: keep off the line of the fields above */
	char		pad[PG_CACHE_LINE_SIZE];
	pg_atomic_uint64 counters[PC_NUM_COUNTERS];
	pg_atomic_uint64 memory_used;	/* DSA bytes taken (pc_dsa_footprint) */
	pg_atomic_uint64 nentries;	/* entries in the key map */
	pg_atomic_uint64 entry_serial;	/* last PcEntry.serial handed out */
	TimestampTz stats_reset;	/* under mutex */

	int			dsa_tranche;
	int			keymap_tranche;
	dshash_table_handle keymap_handle;

	ConditionVariable key_cv[PC_NUM_KEY_CVS];

	Size		dsa_offset;		/* from the start of this struct */
	Size		ring_offset;
	Size		snap_offset;	/* PcSnapSlot[max_snapshots] */
	int			max_snapshots;
	LWLock	   *snap_map_lock;	/* which slot caches which snapshot */
	LWLockPadded *snap_slot_locks;	/* one per slot; see snapshot_store.c */
} PcShared;

extern PcShared *pc_shared;

extern void pc_shmem_request(void);
extern void pc_shmem_startup(void);
extern void pc_attach(void);
extern dsa_area *pc_area(void);
extern dshash_table *pc_keymap(void);
extern PcRequestRing *pc_ring(void);
extern void pc_wake_worker(void);
extern void pc_count(PcCounter counter, uint64 n);
extern Size pc_memory_used(void);
extern dsa_pointer pc_alloc(Size size);
extern dsa_pointer pc_store_message(const char *message, Size *size);
extern void pc_free(dsa_pointer dp, Size size);
extern Size pc_dsa_footprint(Size size);
extern Size pc_memory_limit(void);
extern Size pc_memory_bound(void);
extern void pc_require_loaded(void);

/* ----------------------------------------------------------------
 * The key map (keymap.c)
 * ----------------------------------------------------------------
 */

/*
 * A key as the dshash sees it.  Stored entries hold the bytes in DSA
 * ('data'); a search key points at the caller's bytes ('local'), so no key
 * is copied to look it up and no entry pays for the longest key.
 */
typedef struct PcKey
{
	uint32		len;
	dsa_pointer data;			/* stored entries: the key's bytes */
	const char *local;			/* search keys only; NULL when stored */
} PcKey;

/* What readers see of a key: pending, enabled or disabled. */
typedef enum PcKeyState
{
	PC_STATE_PENDING = 0,		/* never fetched successfully */
	PC_STATE_ENABLED,
	PC_STATE_DISABLED
} PcKeyState;

/* Mirror of the worker's private fetch state, for the entries view. */
typedef enum PcFetchState
{
	PC_FETCH_PENDING = 0,
	PC_FETCH_IN_PROGRESS,
	PC_FETCH_COMPLETE
} PcFetchState;

/* Bits of PcEntry.requests: what readers asked the worker to do. */
#define PC_REQ_FETCH		0x01
#define PC_REQ_INVALIDATE	0x02
#define PC_REQ_EVICT		0x04

typedef struct PcEntry
{
	PcKey		key;			/* hash key; must be first */
	uint64		serial;			/* tells this entry from a later one of the
								 * same key */
	pg_atomic_uint32 requests;	/* PC_REQ_* not yet taken by the worker */
	uint8		state;			/* PcKeyState */
	uint8		fetch_state;	/* PcFetchState */
	bool		invalidated;	/* stale until the next successful fetch */
	bool		has_refresh;	/* refresh_at is set */
	bool		error_unstored; /* last fetch failed; no room for its message */
	int32		attempts;		/* failed or pending attempts in a row */
	int64		fetched_at;		/* pc clock of the last success, if any */
	int64		expires_at;		/* eviction due, if fetched */
	int64		refresh_at;		/* refresh due, if has_refresh */
	dsa_pointer value;			/* PcValue, or InvalidDsaPointer */
	dsa_pointer last_error;		/* NUL-terminated message, or invalid */
} PcEntry;

/* A cached value: revision and config, in one DSA chunk. */
typedef struct PcValue
{
	int32		revision_len;	/* -1: no revision */
	uint32		config_len;		/* 0: no config (disabled) */
	/* revision bytes, then the config's jsonb varlena at config_offset */
	uint32		config_offset;
	char		data[FLEXIBLE_ARRAY_MEMBER];
} PcValue;

/*
 * DSA bytes one entry costs the key map beyond its key and value chunks:
 * dshash's item (a 16-byte header and our entry, in its size class), plus
 * its share of the bucket arrays, which briefly exist twice while the
 * table grows.  Counted in memory_used.
 */
#define PC_ENTRY_DSA_BYTES \
	(pc_dsa_footprint(MAXALIGN(sizeof(dsa_pointer) + sizeof(uint32)) + \
					  MAXALIGN(sizeof(PcEntry))) + 3 * sizeof(dsa_pointer))

extern dshash_table *pc_keymap_create(dsa_area *area, int tranche_id);
extern dshash_table *pc_keymap_attach(dsa_area *area, int tranche_id,
									  dshash_table_handle handle);
extern PcKey pc_search_key(const char *key, uint32 len);
extern const char *pc_key_bytes(dsa_area *area, const PcKey *key);
extern uint32 pc_key_hash(const char *key, uint32 len);
extern ConditionVariable *pc_key_cv(const char *key, uint32 len);
extern PcEntry *pc_keymap_find_or_create(const char *key, uint32 len,
										 bool *created);
extern void pc_keymap_delete(PcEntry *entry);
extern Size pc_value_size(const PcValue *value);
extern bool pc_request_mark(PcEntry *entry, uint32 bits);
extern void pc_request_send(const char *key, uint32 len);
extern void pc_check_key(text *key, const char **bytes, uint32 *len);

/* ----------------------------------------------------------------
 * The request ring (request_ring.c)
 * ----------------------------------------------------------------
 */
extern Size pc_ring_size(void);
extern void pc_ring_init(PcRequestRing *ring);
extern bool pc_ring_push(const char *key, uint32 len);
extern Size pc_ring_drain(char *buf, Size bufsize);

/* ----------------------------------------------------------------
 * Snapshot slots (snapshot_store.c)
 * ----------------------------------------------------------------
 */

/* What one slot says about its snapshot, for the snapshots view. */
typedef struct PcSnapInfo
{
	bool		loaded;
	int64		rows;
	int64		bytes;
	int64		loaded_at_ms;
	bool		attempted;
	int64		last_attempt_ms;
	int64		refresh_errors;
	bool		last_failed;
	char	   *last_error;		/* palloc'd, or NULL */
} PcSnapInfo;

/* A reader's handle on a slot: index plus the generation it was taken at. */
typedef struct PcSnapRef
{
	int			index;
	uint64		generation;
} PcSnapRef;

extern Size pc_snap_shmem_size(int max_snapshots);
extern void pc_snap_shmem_init(void *place, int max_snapshots);
extern PcSnapRef pc_snap_acquire(Oid dbid, const char *name, int64 reg_id,
								 int64 reg_stamp, bool none_ok);

/* Which registration a slot caches. */
typedef struct PcSnapKey
{
	char		name[NAMEDATALEN];
	int64		reg_id;
	int64		reg_stamp;
} PcSnapKey;

extern List *pc_snap_slots_of(Oid dbid);
extern void pc_snap_forget(Oid dbid, const char *name, int64 reg_id,
						   int64 reg_stamp);
extern bool pc_snap_copy(PcSnapRef ref, int64 now, int64 ttl_ms, bool only_fresh,
						 char **blob, Size *size, int64 *rows);
extern bool pc_snap_is_fresh(PcSnapRef ref, int64 now, int64 ttl_ms,
							 bool *loaded);
/* A snapshot's last attempt time when no attempt was made yet. */
#define PC_NEVER	PG_INT64_MIN

typedef enum PcClaim
{
	PC_CLAIM_WON,
	PC_CLAIM_THROTTLED,
	PC_CLAIM_GONE
} PcClaim;

extern PcClaim pc_snap_cold_claim(PcSnapRef ref, int64 now, int64 ttl_ms,
								  int64 *throttled_since, int64 *prev_attempt);
extern void pc_snap_cold_unclaim(PcSnapRef ref, int64 claimed_at,
								 int64 prev_attempt);
extern void pc_snap_trim_local_copy(void);
extern bool pc_snap_lease_take(PcSnapRef ref, int64 now, int64 lease_ms);
extern void pc_snap_lease_drop(PcSnapRef ref);
extern bool pc_snap_publish(PcSnapRef ref, const char *blob, Size size,
							int64 rows, int64 now);
extern int64 pc_snap_record_failure(PcSnapRef ref, const char *message,
									int64 now, bool drop_rows);
extern bool pc_snap_describe(Oid dbid, const char *name, int64 reg_id,
							 int64 reg_stamp, PcSnapInfo *info);

/* ----------------------------------------------------------------
 * Snapshot loads in a background worker (snapshot_load.c)
 * ----------------------------------------------------------------
 */
typedef enum PcLoadStatus
{
	PC_LOAD_NONE,				/* the worker did not report */
	PC_LOAD_OK,					/* rows published */
	PC_LOAD_FAILED,				/* the source failed: last-good applies */
	PC_LOAD_REVOKED				/* the owner lost its rights, or is gone */
} PcLoadStatus;

extern bool pc_snap_types_match(int natts, const Oid *coltypes,
								TupleDesc desc);
extern PcLoadStatus pc_snap_load(Oid owner, Oid view, const char *query,
								 const char *name, int natts,
								 const Oid *coltypes, PcSnapRef ref,
								 char **error, int *sqlerrcode);
extern PGDLLEXPORT void pc_snapshot_load_main(Datum main_arg);

/* ----------------------------------------------------------------
 * The worker (worker.c) and its upstream call (fetch.c)
 * ----------------------------------------------------------------
 */
extern void pc_register_worker(void);
extern PGDLLEXPORT void pc_worker_main(Datum main_arg);

/* One key's answer from the fetch function. */
typedef enum PcAnswer
{
	PC_ANSWER_ENABLED,
	PC_ANSWER_DISABLED,
	PC_ANSWER_PENDING,
	PC_ANSWER_NOT_MODIFIED,
	PC_ANSWER_ERROR				/* the call failed or broke the contract */
} PcAnswer;

typedef struct PcFetchItem
{
	/* in */
	const char *key;
	uint32		keylen;
	char	   *revision;		/* current revision, or NULL */
	/* out */
	PcAnswer	answer;
	char	   *new_revision;	/* palloc'd, or NULL */
	struct varlena *config;		/* palloc'd jsonb, or NULL */
	char	   *error;			/* palloc'd message for PC_ANSWER_ERROR */
	bool		seen;			/* a row for this key was returned */
} PcFetchItem;

extern void pc_fetch_batch(PcFetchItem *items, int nitems);

#endif							/* PROJCACHE_H */
