/*-------------------------------------------------------------------------
 *
 * keycache.h
 *	  The key cache: the shared key map, the request ring, the worker and its fetch call.
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
	pg_atomic_uint32 visited;	/* read since the key entered its eviction
								 * FIFO or the worker last looked at it
								 * (S3-FIFO); set by readers, only when
								 * clear, and cleared by the worker */
	uint8		state;			/* PcKeyState */
	uint8		fetch_state;	/* PcFetchState */
	bool		invalidated;	/* stale until the next successful fetch */
	bool		awaiting_commit;	/* on a standby: invalidated by a
									 * transaction whose commit is not
									 * replayed yet; reads ask for no fetch
									 * (keycache_replay.c) */
	bool		has_refresh;	/* refresh_at is set */
	bool		error_unstored; /* last fetch failed; no room for its message */
	int32		attempts;		/* failed or pending attempts in a row */
	int64		fetched_at;		/* pc clock of the last success, if any */
	int64		expires_at;		/* eviction due, if fetched */
	int64		refresh_at;		/* refresh due, if has_refresh */
	int64		retry_at;		/* for display: the next attempt of a key
								 * waiting out its retry backoff, or 0 */
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
extern void pc_keymap_delete(PcEntry *entry);
extern Size pc_value_size(const PcValue *value);
extern bool pc_request_mark(PcEntry *entry, uint32 bits);
extern void pc_request_send(const char *key, uint32 len);
extern void pc_check_key(text *key, const char **bytes, uint32 *len);

/* ----------------------------------------------------------------
 * The request ring (keycache_ring.c)
 * ----------------------------------------------------------------
 */
extern Size pc_ring_size(void);
extern void pc_ring_init(PcRequestRing *ring);
extern bool pc_ring_push(const char *key, uint32 len);
extern Size pc_ring_drain(char *buf, Size bufsize);


/* ----------------------------------------------------------------
 * The worker (keycache_worker.c) and its upstream call (keycache_fetch.c)
 * ----------------------------------------------------------------
 */
extern void pc_register_launcher(void);
extern PGDLLEXPORT void pc_launcher_main(Datum main_arg);
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

#endif							/* PROJCACHE_KEYCACHE_H */
