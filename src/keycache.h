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

#include "shmem.h"

/* ----------------------------------------------------------------
 * The key map (keycache_map.c)
 * ----------------------------------------------------------------
 */

/*
 * A key as the dshash sees it: 16 bytes.  A stored key of up to
 * PC_KEY_INLINE_BYTES bytes is held in the entry itself (PC_KEY_INLINE); a
 * longer one in a DSA chunk of its own (PC_KEY_DSA).  A search key points
 * at the caller's bytes (PC_KEY_SEARCH), so no key is copied to look it up
 * and no entry pays for the longest key.  The pointer of the last two forms
 * is kept in bytes[PC_KEY_PTR_AT..], aligned, and read with memcpy
 * (keycache_map.c); use pc_key_bytes() for the bytes of any form.
 */
#define PC_KEY_INLINE_BYTES	13
#define PC_KEY_PTR_AT		5	/* offset in bytes[] of a pointer */

typedef enum PcKeyForm
{
	PC_KEY_SEARCH = 0,
	PC_KEY_INLINE,
	PC_KEY_DSA
} PcKeyForm;

typedef struct PcKey
{
	uint16		len;
	uint8		form;			/* PcKeyForm */
	char		bytes[PC_KEY_INLINE_BYTES];
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
 * the scheduler's SCHED_PERIOD_DEFAULT.
 */
#define PC_PERIOD_DEFAULT	(-1)
#define PC_MAX_PERIOD_MS	(INT_MAX / 4)

/*
 * One key's shared state.  Laid out so that dshash's item (its 16-byte
 * header and this) fills the allocator's 112-byte size class: the flags
 * are bits so that the key's periods fit where padding was; check
 * PC_ENTRY_DSA_BYTES (and the assertion in keycache_map.c) before adding
 * a field.
 */
typedef struct PcEntry
{
	PcKey		key;			/* hash key; must be first */
	uint64		serial;			/* tells this entry from a later one of the
								 * same key */
	pg_atomic_uint32 requests;	/* PC_REQ_* not yet taken by the worker */
	pg_atomic_uint32 visited;	/* read since the key entered its eviction
								 * FIFO or the worker last looked at it
								 * (S3-FIFO); set by readers, only when clear,
								 * and cleared by the worker */
	int32		attempts;		/* failed or pending attempts in a row */
	uint8		state;			/* PcKeyState */
	uint8		fetch_state;	/* PcFetchState */
	/* flags, written only under the entry's exclusive lock */
	bool		invalidated:1;	/* stale until the next successful fetch */
	bool		awaiting_commit:1;	/* on a standby: invalidated by a
									 * transaction whose commit is not
									 * replayed yet; reads ask for no fetch
									 * (keycache_replay.c) */
	bool		has_refresh:1;	/* refresh_at is set */
	bool		error_unstored:1;	/* last fetch failed; no room for its
									 * message */
	uint8		owner;			/* the slot of pc_shared->role_slots that
								 * counts this key, or PC_ROLE_NONE; set at
								 * creation, never changed */
	int32		max_age_ms;		/* the key's own periods from its last
								 * successful fetch, or PC_PERIOD_DEFAULT */
	int32		stale_for_ms;
	int64		fetched_at;		/* pc clock of the last success, if any */
	int64		expires_at;		/* eviction due, if fetched */
	int64		refresh_at;		/* refresh due, if has_refresh */
	int64		retry_at;		/* for display: the next attempt of a key
								 * waiting out its retry backoff, or 0 */
	dsa_pointer value;			/* PcValue, or InvalidDsaPointer */
	dsa_pointer last_error;		/* NUL-terminated message, or invalid */
} PcEntry;

/*
 * A cached value: revision and config, in one DSA chunk or, when that
 * saves room, two.  The allocator rounds a chunk up to its size class
 * (1,044 bytes take 1,280, 4,116 take 5,456), so a value that would waste
 * much of its class is cut where a class ends: the head chunk, full, holds
 * this header, the tail's dsa_pointer and the first head_len bytes; the
 * tail chunk, small, the rest.  Read it with pc_value_read() and friends.
 */
typedef struct PcValue
{
	int32		revision_len;	/* -1: no revision */
	uint32		config_len;		/* 0: no config (disabled) */
	uint32		head_len;		/* bytes held in this chunk; if fewer than the
								 * value's, data starts with the tail's
								 * dsa_pointer (unaligned) */
	/* revision bytes, then the config's jsonb varlena, unaligned */
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

/* The most of the keys' memory kept free for readers' new entries. */
#define PC_HEADROOM_MAX_PERCENT	2

extern dshash_table *pc_keymap_create(dsa_area *area, int tranche_id);
extern dshash_table *pc_keymap_attach(dsa_area *area, int tranche_id,
									  dshash_table_handle handle);
extern PcKey pc_search_key(const char *key, uint32 len);
extern const char *pc_key_bytes(dsa_area *area, const PcKey *key);
extern uint32 pc_key_hash(const char *key, uint32 len);
extern ConditionVariable *pc_key_cv(const char *key, uint32 len);
#ifdef USE_ASSERT_CHECKING
extern int	pc_entry_locks_held;
#define PC_ASSERT_ENTRY_LOCKED()	Assert(pc_entry_locks_held > 0)
#else
#define PC_ASSERT_ENTRY_LOCKED()	((void) 0)
#endif
extern PcEntry *pc_entry_find(const PcKey *search, bool exclusive);
extern void pc_entry_release(PcEntry *entry);
extern void pc_entry_scan_begin(dshash_seq_status *status, bool exclusive);
extern void pc_entry_scan_end(dshash_seq_status *status);
extern PcEntry *pc_keymap_find_or_create(const char *key, uint32 len,
										 bool *created);
extern PcEntry *pc_keymap_find_or_create_for(const char *key, uint32 len,
											 Oid role, bool *created);
extern uint32 pc_keys_per_role_bound(void);
extern Size pc_key_memory_target(void);
extern Oid	pc_role_of_slot(int slot);
extern void pc_keymap_delete(PcEntry *entry);

/*
 * Keys copied out of the map (or the worker's private state), each
 * NUL-terminated, with a record of payload_size bytes beside each for the
 * caller (zeroed; 0 for none).  Made under partition locks, so nothing
 * here raises an ERROR: a failed allocation sets oom, which the caller
 * reports once the locks are released (pc_report_oom).
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

extern void pc_keylist_init(PcKeyList *list, Size payload_size);
extern bool pc_keylist_add(PcKeyList *list, const char *key, uint32 len);
extern void pc_keylist_from_map(PcKeyList *list,
								bool (*want) (PcEntry *entry),
								bool (*fill) (PcEntry *entry, void *payload));

/* The payload of key i. */
#define pc_keylist_payload(list, i) \
	((void *) ((list)->payloads + (Size) (i) * (list)->payload_size))
extern dsa_pointer pc_value_make(const char *revision,
								 const struct varlena *config);
extern void pc_value_free(dsa_pointer dp);
extern Size pc_entry_footprint(const PcEntry *entry);
extern void pc_value_read(const PcValue *value, Size offset, Size len,
						  char *dst);
extern char *pc_value_revision(const PcValue *value, bool *oom);
extern struct varlena *pc_value_config(const PcValue *value, bool *oom);
extern bool pc_request_mark(PcEntry *entry, uint32 bits);
extern void pc_request_send(const char *key, uint32 len);
extern void pc_request_send_refused(const char *key, uint32 len);
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

/* A key loaded from the dump, for the scheduler's state. */
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
extern void pc_keys_restore_begin(void);
extern void pc_keys_restore_end(void);
extern int64 pc_keys_restore_wait_left(void);

/* Is the key dump still to be loaded?  (Readers wait for it.) */
static inline bool
pc_keys_restoring(void)
{
	return pg_atomic_read_u32(&pc_shared->keys_restoring) != 0;
}

/* ----------------------------------------------------------------
 * The request ring (keycache_ring.c)
 * ----------------------------------------------------------------
 */
extern Size pc_ring_size(void);
extern void pc_ring_init(PcRequestRing *ring);
extern bool pc_ring_push(const char *key, uint32 len, Oid role,
						 bool refused);
extern Size pc_ring_drain(char *buf, Size bufsize);

/*
 * In a drained record's length word: the reader found no room to create
 * the key (pc_request_send_refused), so the worker creates it.
 */
#define PC_RING_REFUSED		0x80000000U


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

extern PcFetchOutcome pc_fetch_batch(PcFetchItem *items, int nitems,
									 bool quiet);

#endif							/* PROJCACHE_KEYCACHE_H */
