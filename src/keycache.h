/*-------------------------------------------------------------------------
 *
 * keycache.h
 *	  The key cache: the shared key map, the request ring, the worker and its
 *	  fetch call.
 *
 * Copyright (c) 2026, projcache developers
 *
 *-------------------------------------------------------------------------
 */
#ifndef PROJCACHE_KEYCACHE_H
#define PROJCACHE_KEYCACHE_H

#include "counters.h"
#include "keycache_caches.h"
#include "shmem.h"

/*
 * Keys per role (keycache_map.c): each key of the map counts for the role
 * that created it, in one of a fixed number of slots; PcEntry.owner is
 * the slot's index.  Keys created by superusers or by the worker (a warm
 * restart's load) count for none (PC_ROLE_NONE).  A role gets a slot the
 * first time it creates a key and keeps it while it has keys; once every
 * slot counts for a role with keys, the roles that come next share the
 * last one (PC_ROLE_OVERFLOW), and its bound.
 *
 * The slots are a part of shared memory of their own ("projcache roles").
 * Its lock (tranche "projcache_roles", taken alone) says which role each
 * slot counts keys for (PcRoleSlot.role): shared to find a role's slot and
 * add a key to its count, exclusive to give a slot whose count is zero to
 * another role.  The counts themselves (PcRoleSlot.keys and .bytes) are
 * atomics: a key is added under the lock before its entry is created, and
 * taken off, without it, by whoever unlinks the entry (pc_keymap_delete,
 * the worker) or gives up creating it; the worker changes .bytes, under
 * the entry's lock, when it replaces the entry's chunk.  So a slot's count
 * is the number of entries whose owner it is, plus the creations under
 * way, and a slot counted for a role is never given to another while an
 * entry names it.
 */
#define PC_ROLE_SLOTS		256
#define PC_ROLE_NONE		0
#define PC_ROLE_OVERFLOW	(PC_ROLE_SLOTS - 1)

typedef struct PcRoleSlot
{
	Oid			role;			/* InvalidOid: never used (the part's lock) */
	pg_atomic_uint32 keys;		/* entries it owns, and creations under way */
	pg_atomic_uint64 bytes;		/* what their chunks take (pc_dsa_footprint) */
	pg_atomic_uint32 room_wanted;	/* a read found the role at its bound */
} PcRoleSlot;

extern void pc_roles_shmem_request(void);
extern void pc_roles_shmem_startup(void);
extern PcRoleSlot *pc_role_slot(int n);
extern bool pc_roles_take_room_wanted(void);

/* ----------------------------------------------------------------
 * The key map (keycache_map.c)
 * ----------------------------------------------------------------
 */

/*
 * A key to look up: the caller's bytes and their hash, computed once
 * (pc_search_key), which chooses the key's partition and bucket.
 */
typedef struct PcKey
{
	const char *bytes;
	uint32		len;
	uint32		hash;
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
#define PC_REQ_DEMAND		0x08	/* read again, or waited for, while its
									 * fetch waits: fetch it before keys read
									 * once (keycache_policy.h, "Fair
									 * fetching") */
#define PC_REQ_DEMAND_OTHER 0x10	/* with PC_REQ_DEMAND: waited for by a
									 * role other than its creator, whose turn
									 * may come first (set only so that such a
									 * role tells the worker once) */

/*
 * A key's own fresh and stale periods (max_age, stale_for: the fetch
 * function's optional result columns), in ms: PC_PERIOD_DEFAULT when the
 * key follows projcache.expiry or grace_period, else 0 to
 * PC_MAX_PERIOD_MS, the bound of those settings; the fetch function's
 * values outside it are refused (keycache_fetch.c).  The same encoding as
 * the worker's POLICY_PERIOD_DEFAULT.
 */
#define PC_PERIOD_DEFAULT	(-1)
#define PC_MAX_PERIOD_MS	(INT_MAX / 4)

/*
 * A reference to a chunk of the key map's area in 32 bits: its dsa_pointer
 * over 8 (keycache_map.c), or InvalidPcRef.
 */
typedef uint32 PcRef;

#define InvalidPcRef	0


/*
 * One key's shared state: a header, then its body, in one DSA chunk sized
 * to what it holds (keycache_map.c, "Entries").  The body is the key's
 * bytes, then only the parts the key has, each present when its bit of
 * 'parts' is set: the time of its next attempt while it backs off, its own
 * periods, its revision and its config.  A chunk whose
 * allocator size class would waste much is cut in two: its body goes on
 * in a tail chunk.  Read the body with the pc_entry_* functions below.
 *
 * Readers change only 'marks' (atomically) and, under the exclusive
 * lock, 'invalidated' and 'awaiting_commit'; the body and every other
 * field are the worker's, and only it replaces an entry's chunk.
 */
typedef struct PcEntry
{
	int64		fetched_at;		/* pc clock of the last success, if any */
	PcRef		next;			/* next entry of the same bucket */
	pg_atomic_uint32 marks;		/* PC_REQ_* not yet taken by the worker, and
								 * PC_MARK_VISITED */
	uint32		serial;			/* tells this entry from a later one of the
								 * same key */
	PcRef		error;			/* the last fetch's message (a chunk of the
								 * message reserve), or InvalidPcRef: here, so
								 * that recording one never needs room in the
								 * keys' budget */
	int32		expires_in;		/* eviction due at fetched_at + this, if
								 * PC_PART_EXPIRY */
	int32		refresh_in;		/* refresh due at fetched_at + this, if
								 * has_refresh */
	PcCacheId	cache;			/* the cache it is of; set at creation, never
								 * changed */
	uint16		keylen;
	uint16		attempts;		/* failed or pending attempts in a row, up to
								 * PG_UINT16_MAX */
	uint8		owner;			/* the pc_role_slot() that counts this key, or
								 * PC_ROLE_NONE; set at creation, never
								 * changed */
	uint8		state:2,		/* PcKeyState */
				fetch_state:2,	/* PcFetchState */
				invalidated:1,	/* stale until the next successful fetch */
				awaiting_commit:1,	/* on a standby: invalidated by a
									 * transaction whose commit is not
									 * replayed yet; reads ask for no fetch
									 * (keycache_replay.c) */
				has_refresh:1,	/* refresh_in is set */
				error_unstored:1;	/* last fetch failed; no room for its
									 * message */
	uint8		parts;			/* PC_PART_*: what the body holds */
	uint8		revision_len;	/* if PC_PART_REVISION: its length, or
								 * PC_REVISION_LONG for a uint32 length in the
								 * body */
	char		body[FLEXIBLE_ARRAY_MEMBER];
} PcEntry;

/* Bits of PcEntry.marks besides the PC_REQ_* requests. */
#define PC_MARK_VISITED		0x80000000U /* read since the key entered its
										 * eviction FIFO or the worker last
										 * looked at it (S3-FIFO): set by
										 * readers, only when clear, and
										 * cleared by the worker */
#define PC_MARK_WAITED		0x00000100U /* a reader waited for the key before
										 * it had a value: its first value is
										 * admitted whatever is in use
										 * (keycache_worker.c, "Admission");
										 * set by readers, never cleared */
#define PC_MARK_REQUESTS	0x000000FFU

/*
 * When the key was last read, in PC_STAMP_MS units of the pc clock, modulo
 * 2^15: set by readers of an existing entry, at most once per unit, and
 * never cleared.  A value read within projcache.admission_window is not
 * evicted to make room for a key that has none (keycache_worker.c,
 * "Admission"; policy_value_in_use() says which keys are).  The modulus is
 * POLICY_STAMP_MODULUS (keycache_policy.h): about 9 hours.
 */
#define PC_MARK_STAMP_SHIFT	16
#define PC_MARK_STAMP_MASK	0x7FFF0000U
#define PC_STAMP_MODULUS	0x8000U
#define PC_STAMP_MS			1000

static inline uint32
pc_read_stamp(int64 now)
{
	return (uint32) ((now / PC_STAMP_MS) % PC_STAMP_MODULUS);
}

/* The stamp 'marks' holds. */
static inline uint32
pc_marks_stamp(uint32 marks)
{
	return (marks & PC_MARK_STAMP_MASK) >> PC_MARK_STAMP_SHIFT;
}

/* Bits of PcEntry.parts. */
#define PC_PART_SPLIT		0x01	/* body goes on in a tail chunk */
#define PC_PART_EXPIRY		0x02	/* expires_in is set */
#define PC_PART_RETRY		0x04	/* int64 retry_at */
#define PC_PART_PERIODS		0x10	/* int32 max_age_ms, stale_for_ms */
#define PC_PART_REVISION	0x20	/* the revision's bytes */
#define PC_PART_CONFIG		0x40	/* the config's jsonb varlena */

#define PC_REVISION_LONG	PG_UINT8_MAX

/*
 * What a pending entry of a short key costs, counted for the room a
 * reader's new key needs and the headroom kept for them: its chunk (header
 * and up to 16 bytes of key) and its share of a bucket array.
 */
#define PC_ENTRY_DSA_BYTES \
	(pc_dsa_footprint(offsetof(PcEntry, body) + 16) + 2 * sizeof(PcRef))

/*
 * The bytes a key is counted at for projcache.max_keys_per_role's default
 * (half of the keys that fit), as documented.
 */
#define PC_KEY_COUNT_UNIT	136

/* The most of the keys' memory kept free for readers' new entries. */
#define PC_HEADROOM_MAX_PERCENT	2

/*
 * What the worker writes into an entry's body with pc_entry_write(): each
 * part whose set_ flag is on becomes the value given (a NULL pointer, or
 * retry_at 0, removes it); the others are kept.
 */
typedef struct PcEntryWrite
{
	bool		set_value;
	const char *revision;		/* NUL-terminated, or NULL */
	const struct varlena *config;	/* NULL: none */
	bool		set_periods;
	int32		max_age_ms;		/* PC_PERIOD_DEFAULT for both: no part */
	int32		stale_for_ms;
	bool		set_retry;
	int64		retry_at;
	bool		set_error;
	dsa_pointer error;			/* a message from pc_store_message() */
} PcEntryWrite;

/* The body an entry will have after a write (keycache_map.c). */
typedef struct PcEntryPlan
{
	uint8		parts;			/* PC_PART_* but SPLIT */
	uint8		revision_len;	/* PcEntry.revision_len */
	Size		revlen;
	Size		config_len;
	Size		len;
	bool		rebuild;		/* needs a new chunk */
} PcEntryPlan;

/* A write prepared: its plan and new chunk (pc_entry_prepare). */
typedef struct PcEntryPrepared
{
	PcEntryPlan plan;
	dsa_pointer head;
	dsa_pointer tail;
	Size		head_size;
	Size		tail_size;
	bool		gone;			/* the key was not in the map */
} PcEntryPrepared;

/* Under the entry's exclusive lock, with its new body: false to give up. */
typedef bool (*PcEntryApplyFn) (PcEntry *entry, void *arg);

/* An entry scan (pc_entry_scan_*): one partition locked at a time. */
typedef struct PcEntryScan
{
	int			partition;		/* locked, or -1 before the first */
	uint32		bucket;
	PcRef		next;
	bool		exclusive;
} PcEntryScan;

extern void pc_keymap_shmem_request(void);
extern void pc_keymap_shmem_startup(void);
extern uint64 pc_keymap_count(void);
extern void pc_key_cvs_broadcast(void);
extern PcKey pc_search_key(const char *key, uint32 len);
extern uint32 pc_key_hash(const char *key, uint32 len);
extern ConditionVariable *pc_key_cv(const char *key, uint32 len);
extern bool pc_wait_on_key(const char *key, uint32 len, int64 wait_ms,
						   bool (*done) (const char *key, uint32 len,
										 void *arg),
						   void *arg);
#ifdef USE_ASSERT_CHECKING
extern int	pc_entry_locks_held;
#define PC_ASSERT_ENTRY_LOCKED()	Assert(pc_entry_locks_held > 0)
#else
#define PC_ASSERT_ENTRY_LOCKED()	((void) 0)
#endif
extern PcEntry *pc_entry_find(const PcKey *search, bool exclusive);
extern void pc_entry_release(PcEntry *entry);
extern void pc_entry_scan_begin(PcEntryScan *scan, bool exclusive);
extern PcEntry *pc_entry_scan_next(PcEntryScan *scan);
extern void pc_entry_scan_end(PcEntryScan *scan);
extern PcEntry *pc_keymap_find_or_create(const char *key, uint32 len,
										 PcCacheId cache, bool *created);
extern PcEntry *pc_keymap_find_or_create_for(const char *key, uint32 len,
											 Oid role, PcCacheId cache,
											 bool *created);
extern uint32 pc_keys_per_role_bound(void);
extern uint64 pc_bytes_per_role_bound(void);
extern Size pc_key_memory_target(void);
extern Oid	pc_role_of_slot(int slot);
extern int	pc_role_reserve(Oid role, Size bytes);
extern void pc_role_unreserve(int slot, Size bytes);
extern void pc_keymap_delete(PcEntry *entry);

/* Reading an entry (under its lock; nothing here raises an ERROR). */
static inline const char *
pc_entry_key(const PcEntry *entry)
{
	const char *body = entry->body;

	if (entry->parts & PC_PART_SPLIT)
		body += sizeof(PcRef) + sizeof(uint32);
	return body;
}

static inline bool
pc_entry_visited(PcEntry *entry)
{
	return (pg_atomic_read_u32(&entry->marks) & PC_MARK_VISITED) != 0;
}

/*
 * Mark it read at 'now' (pc clock), writing the shared line only when it is
 * not marked yet or its stamp is older: a hit writes it at most once per
 * PC_STAMP_MS.  A key without a value is only marked: the stamp says when
 * a value was last read.  Returns whether the visited mark was clear.
 */
static inline bool
pc_entry_visit(PcEntry *entry, int64 now)
{
	uint32		stamp = pc_read_stamp(now) << PC_MARK_STAMP_SHIFT;
	uint32		old = pg_atomic_read_u32(&entry->marks);
	uint32		new;

	if (entry->state == PC_STATE_PENDING)
	{
		if (pc_entry_visited(entry))
			return false;
		pg_atomic_fetch_or_u32(&entry->marks, PC_MARK_VISITED);
		return true;
	}
	do
	{
		if ((old & PC_MARK_VISITED) && (old & PC_MARK_STAMP_MASK) == stamp)
			return false;
		new = (old & ~PC_MARK_STAMP_MASK) | PC_MARK_VISITED | stamp;
	} while (!pg_atomic_compare_exchange_u32(&entry->marks, &old, new));
	return (old & PC_MARK_VISITED) == 0;
}

extern int64 pc_entry_expires_at(const PcEntry *entry);
extern int64 pc_entry_refresh_at(const PcEntry *entry);
extern void pc_entry_set_expires_at(PcEntry *entry, int64 expires_at);
extern void pc_entry_set_refresh_at(PcEntry *entry, int64 refresh_at);
extern void pc_entry_set_fetched_at(PcEntry *entry, int64 fetched_at);
extern int64 pc_entry_retry_at(const PcEntry *entry);
extern void pc_entry_periods(const PcEntry *entry, int32 *max_age_ms,
							 int32 *stale_for_ms);

/* What a reader copies of a value (pc_entry_read_value). */
typedef struct PcEntryValue
{
	int32		max_age_ms;		/* or PC_PERIOD_DEFAULT */
	int32		stale_for_ms;
	uint32		config_len;		/* 0: none */
	struct varlena *config;		/* a copy, if asked for and present */
} PcEntryValue;

extern void pc_entry_read_value(const PcEntry *entry, bool want_config,
								PcEntryValue *v, bool *oom);
extern char *pc_entry_revision(const PcEntry *entry, bool *oom);
extern struct varlena *pc_entry_config(const PcEntry *entry, bool *oom);
extern char *pc_entry_error(const PcEntry *entry, bool *oom);
extern Size pc_entry_footprint(const PcEntry *entry);
extern void pc_free_message(dsa_pointer dp);

/* Writing one (the worker). */
extern Size pc_entry_write_size(const char *key, uint32 len,
								const PcEntryWrite *w);
extern bool pc_entry_prepare(const char *key, uint32 len,
							 const PcEntryWrite *w, PcEntryPrepared *prep);
extern void pc_entry_commit(const char *key, uint32 len,
							const PcEntryWrite *w, PcEntryPrepared *prep,
							PcEntryApplyFn apply, void *arg, bool *applied);
extern void pc_entry_abandon(PcEntryPrepared *prep);
extern bool pc_entry_write(const char *key, uint32 len, const PcEntryWrite *w,
						   PcEntryApplyFn apply, void *arg, bool *applied);

/*
 * Keys copied out of the map (or the worker's private state), each
 * NUL-terminated, with a record of payload_size bytes beside each for the
 * caller (zeroed; 0 for none).  Made under partition locks, so nothing
 * here raises an ERROR: a failed allocation sets oom, which the caller
 * reports once the locks are released (pc_report_oom).  The arrays are
 * huge allocations (pc_array_resize_no_oom): a list of 17 million keys
 * passes 1 GB.
 */
typedef struct PcKeyList
{
	char	  **keys;
	uint32	   *lens;
	char	   *payloads;
	Size		payload_size;
	int			count;
	int			capacity;
	bool		oom;
} PcKeyList;

extern void *pc_array_resize_no_oom(void *old, Size count, Size size);
extern void pc_keylist_init(PcKeyList *list, Size payload_size);
extern bool pc_keylist_add(PcKeyList *list, const char *key, uint32 len);
extern void pc_keylist_from_map(PcKeyList *list,
								bool (*want) (PcEntry *entry),
								bool (*fill) (PcEntry *entry, void *payload));

/* The payload of key i. */
#define pc_keylist_payload(list, i) \
	((void *) ((list)->payloads + (Size) (i) * (list)->payload_size))
extern bool pc_request_mark(PcEntry *entry, uint32 bits);
extern void pc_request_send(const char *key, uint32 len);
extern void pc_request_send_refused(const char *key, uint32 len,
									PcCacheId cache);
extern void pc_check_key(text *key, const char **bytes, uint32 *len);

/* ----------------------------------------------------------------
 * The key map's dump (keycache_dump.c)
 * ----------------------------------------------------------------
 */
#define PC_KEYS_DUMP_FILE	"projcache_keys.dump"

typedef struct PcKeyDump PcKeyDump;

/*
 * Where a dumped key was in eviction's FIFOs.  The dump writes the keys
 * in the order eviction would keep them (those read since it last looked
 * at them first, then the others, each in the order next_key gives), so
 * that a load that stops at the memory bound leaves out the ones eviction
 * would have taken first; restored in that order, each at the oldest end
 * of its FIFO and with its read mark, the FIFOs come back close to what
 * they were.  Dumps of 1.2 say PC_DUMP_FIFO_UNKNOWN.
 */
typedef enum PcDumpFifo
{
	PC_DUMP_FIFO_UNKNOWN = 0,
	PC_DUMP_FIFO_SMALL,
	PC_DUMP_FIFO_MAIN
} PcDumpFifo;

/* The next key to dump (valid until the next call), or NULL after the last. */
typedef const char *(*PcDumpNextKey) (void *arg, uint32 *len,
									  PcDumpFifo *fifo);

/* A key loaded from the dump, for the worker's state. */
typedef void (*PcDumpRestoreFn) (const char *key, uint32 len,
								 int64 fetched_at, int64 expires_at,
								 int32 max_age_ms, int32 stale_for_ms,
								 PcDumpFifo fifo);

extern PcKeyDump *pc_keys_dump_begin(PcDumpNextKey next_key, void *arg);
extern bool pc_keys_dump_step(PcKeyDump *dump, int64 deadline_ms);
extern void pc_keys_dump_end(PcKeyDump *dump, bool discard);
extern uint64 pc_keys_load_dump(PcDumpRestoreFn restore);
extern void pc_keys_tombstone(const char *key, uint32 len, bool sync,
							  bool had_value);
extern void pc_keys_tombstones_sync(void);
extern void pc_keys_tombstones_resume(void);
extern void pc_keys_restore_end(void);
extern int64 pc_keys_restore_wait_left(void);

extern bool pc_keys_restoring(void);
extern bool pc_keys_dump_claim_read(void);

/* What projcache.stats shows of the key dumps. */
typedef struct PcKeyDumpStats
{
	bool		dump_read;		/* a worker read the key dump (or tried) */
	uint64		loaded_keys;	/* keys it loaded */
	int64		loaded_age_ms;	/* how old the dump was then */
	TimestampTz written_at;		/* the last key dump written, or 0 */
	uint64		dump_keys;		/* keys in it */
} PcKeyDumpStats;

extern void pc_keys_dump_shmem_request(void);
extern void pc_keys_dump_shmem_startup(void);
extern void pc_keys_dump_stats(PcKeyDumpStats *stats);

/* ----------------------------------------------------------------
 * The request ring (keycache_ring.c)
 * ----------------------------------------------------------------
 */
extern void pc_ring_shmem_request(void);
extern void pc_ring_shmem_startup(void);
extern Size pc_ring_size(void);
extern bool pc_ring_take_overflow(void);
extern void pc_ring_note_overflow(void);
extern bool pc_ring_push(const char *key, uint32 len, Oid role,
						 PcCacheId cache, bool refused);
extern Size pc_ring_drain(char *buf, Size bufsize);

/* One record of what pc_ring_drain() copied out. */
typedef struct PcRingRecord
{
	const char *key;			/* not NUL-terminated; len bytes */
	uint32		len;
	Oid			role;			/* who asked */
	PcCacheId	cache;			/* if refused: the cache the reader resolved
								 * the key to (else its entry says) */
	bool		refused;		/* the reader found no room to create the key
								 * (pc_request_send_refused), so the worker
								 * creates it */
} PcRingRecord;

extern Size pc_ring_record(const char *buf, Size off, PcRingRecord *rec);


/* ----------------------------------------------------------------
 * The launcher (keycache_launcher.c)
 * ----------------------------------------------------------------
 */
extern void pc_register_launcher(void);
extern PGDLLEXPORT void pc_launcher_main(Datum main_arg);

/* ----------------------------------------------------------------
 * The worker (keycache_worker.c) and its upstream call (keycache_fetch.c)
 * ----------------------------------------------------------------
 */
extern PGDLLEXPORT void pc_worker_main(Datum main_arg);
extern void pc_worker_shmem_request(void);
extern void pc_worker_shmem_startup(void);
extern void pc_wake_worker(void);
extern int	pc_worker_pid(void);
extern uint64 pc_worker_config_generation(void);
extern void pc_worker_want_room(void);
extern bool pc_worker_admission_closed(void);

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
	int32		max_age_ms;		/* its own periods, or PC_PERIOD_DEFAULT */
	int32		stale_for_ms;
	char	   *period_error;	/* palloc'd: why a period given was not used,
								 * or NULL */
	bool		unresolved;		/* no answer can be told for it: the result
								 * broke the contract in a way that no single
								 * key owns (keycache_bisect.h) */
} PcFetchItem;

/* What one call of the fetch function came to. */
typedef enum PcFetchOutcome
{
	PC_FETCH_ANSWERED,			/* each key has its answer, maybe an error of
								 * its own */
	PC_FETCH_UNRESOLVED,		/* the keys marked unresolved have none */
	PC_FETCH_FAILED,			/* an ERROR of the function, which the keys
								 * may have caused */
	PC_FETCH_FAILED_ALL			/* a failure none of them caused: a timeout, a
								 * cancel, no such function, ... */
} PcFetchOutcome;

/*
 * Whom one call asks, and how: the default cache's settings, or a named
 * cache's (keycache_caches.h).
 */
typedef struct PcFetchTarget
{
	int			cache;			/* its slot, or PC_CACHE_DEFAULT */
	const char *function;		/* a named cache's qualified signature; NULL:
								 * projcache.fetch_function */
	Oid			function_oid;	/* a named cache's bound function; InvalidOid:
								 * none, and bind_error says why */
	Oid			function_owner; /* its owner when it was bound */
	const char *bind_error;
	int			overrun_entry;	/* a named cache's pc_cache_overrun_entry() */
	Oid			owner;			/* a named cache's owner */
	Oid			fetch_role;		/* InvalidOid: the owner */
	uint32		key_offset;		/* bytes of "name:" the function does not see */
	int			timeout_ms;		/* 0: none */
	bool		hard_deadline;	/* end the worker if the call outlives
								 * timeout_ms by PC_FETCH_HARD_GRACE_MS */
	int32		max_age_ms;		/* for keys the function gives none; or
								 * PC_PERIOD_DEFAULT */
	int32		stale_for_ms;
} PcFetchTarget;

extern bool pc_fetch_function_shape_ok(Oid fn);
extern PcFetchOutcome pc_fetch_batch(PcFetchItem *items, int nitems,
									 bool quiet, const PcFetchTarget *target);

#endif							/* PROJCACHE_KEYCACHE_H */
