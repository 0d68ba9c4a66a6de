/*-------------------------------------------------------------------------
 *
 * keycache_invalidate.c
 *	  invalidate() and evict(): a key made stale at the commit of the
 *	  transaction that asks (and so its refetch), or taken out of the cache.
 *
 * Copyright (c) 2026, projcache developers
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/xact.h"
#include "funcapi.h"

#include "keycache.h"
#include "keycache_caches.h"
#include "wal.h"

/* Longest evict() waits for the worker to act. */
#define PC_EVICT_WAIT_MS	5000

PG_FUNCTION_INFO_V1(projcache_invalidate);
PG_FUNCTION_INFO_V1(projcache_evict);

/* ----------------------------------------------------------------
 * invalidate(), at commit
 * ----------------------------------------------------------------
 */

/*
 * Leave a request on a cached key and tell the worker.  Returns false if
 * the key is not cached.  An invalidation also marks the value stale at
 * once, so readers see it before the worker acts.
 */
static bool
request_cached_key(const char *key, uint32 len, uint32 bits, uint64 *serial)
{
	PcKey		search = pc_search_key(key, len);
	bool		invalidate = (bits & PC_REQ_INVALIDATE) != 0;
	PcEntry    *entry;
	bool		send;

	entry = pc_entry_find(&search, invalidate);
	if (entry == NULL)
		return false;
	if (invalidate && entry->state != PC_STATE_PENDING)
		entry->invalidated = true;
	if (serial != NULL)
		*serial = entry->serial;
	send = pc_request_mark(entry, bits);
	pc_entry_release(entry);
	if (send)
		pc_request_send(key, len);
	return true;
}

/*
 * Keys invalidated by the current transaction, each once (a hash table of
 * text copies, in TopTransactionContext).  Their refetch is requested only
 * once the transaction has committed: invalidate() is meant for triggers on
 * the source table, and a fetch before the commit would see the old rows
 * and cache them as fresh again.
 */
static HTAB *invalidated_keys = NULL;
static bool xact_callback_registered = false;

/* The table's key is a text pointer; hash and compare what it points to. */
static uint32
invalidated_key_hash(const void *key, Size keysize)
{
	const text *t = *(text *const *) key;

	return pc_key_hash(VARDATA_ANY(t), VARSIZE_ANY_EXHDR(t));
}

static int
invalidated_key_match(const void *key1, const void *key2, Size keysize)
{
	const text *a = *(text *const *) key1;
	const text *b = *(text *const *) key2;
	Size		len = VARSIZE_ANY_EXHDR(a);

	if (len != VARSIZE_ANY_EXHDR(b))
		return 1;
	return memcmp(VARDATA_ANY(a), VARDATA_ANY(b), len);
}

/* Write the transaction's keys to WAL, for the standbys (wal_records.c). */
static void
log_invalidated_keys(void)
{
	HASH_SEQ_STATUS status;
	text	  **entry;
	text	  **keys;
	int			n = 0;

	keys = palloc(hash_get_num_entries(invalidated_keys) * sizeof(text *));
	hash_seq_init(&status, invalidated_keys);
	while ((entry = hash_seq_search(&status)) != NULL)
		keys[n++] = *entry;
	pc_wal_log_invalidations(keys, n);
	pfree(keys);
}

/*
 * Just before the commit record, write the invalidated keys to WAL (if
 * projcache.wal_invalidations is on).  At commit, request a refetch of
 * every key this transaction invalidated: only then can the fetch function
 * see the transaction's changes.  At abort, forget them (the keys stay
 * marked stale; their next read asks).  PREPARE is refused: the commit
 * would come later, in another session.
 */
static void
invalidate_at_commit(XactEvent event, void *arg)
{
	HASH_SEQ_STATUS status;
	text	  **entry;

	switch (event)
	{
		case XACT_EVENT_PRE_COMMIT:
			if (invalidated_keys != NULL && pc_wal_logging())
				log_invalidated_keys();
			break;
		case XACT_EVENT_PRE_PREPARE:
			/* The commit would come later, in another session. */
			if (invalidated_keys != NULL)
				ereport(ERROR,
						(errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
						 errmsg("cannot PREPARE a transaction that has invalidated projcache keys")));
			break;
		case XACT_EVENT_COMMIT:
			/* Committed and visible to new snapshots: fetch now. */
			if (invalidated_keys == NULL)
				break;
			hash_seq_init(&status, invalidated_keys);
			while ((entry = hash_seq_search(&status)) != NULL)
				(void) request_cached_key(VARDATA_ANY(*entry),
										  VARSIZE_ANY_EXHDR(*entry),
										  PC_REQ_INVALIDATE, NULL);
			invalidated_keys = NULL;	/* freed with TopTransactionContext */
			break;
		case XACT_EVENT_ABORT:
			/* The keys stay stale: the next read refetches them. */
			invalidated_keys = NULL;
			break;
		default:
			break;
	}
}

/* Remember a key for invalidate_at_commit(), once per transaction. */
static void
invalidate_at_commit_add(text *arg)
{
	bool		found;
	text	  **slot;

	if (!xact_callback_registered)
	{
		RegisterXactCallback(invalidate_at_commit, NULL);
		xact_callback_registered = true;
	}
	if (invalidated_keys == NULL)
	{
		HASHCTL		ctl;

		ctl.keysize = sizeof(text *);
		ctl.entrysize = sizeof(text *);
		ctl.hash = invalidated_key_hash;
		ctl.match = invalidated_key_match;
		ctl.hcxt = TopTransactionContext;
		invalidated_keys = hash_create("projcache invalidated keys", 64, &ctl,
									   HASH_ELEM | HASH_FUNCTION |
									   HASH_COMPARE | HASH_CONTEXT);
	}
	slot = hash_search(invalidated_keys, &arg, HASH_ENTER, &found);
	if (!found)
	{
		/* Keep a copy that lives as long as the transaction. */
		*slot = (text *) MemoryContextAlloc(TopTransactionContext,
											VARSIZE_ANY(arg));
		memcpy(*slot, arg, VARSIZE_ANY(arg));
	}
}

/*
 * projcache.invalidate(key text) → boolean: stale from now on (the old
 * value keeps serving), and refetched with a normal fetch as soon as the
 * calling transaction commits.  False if the key is not cached here.  With
 * projcache.wal_invalidations on, the key goes to WAL at commit either way:
 * each standby has a cache of its own.
 */
Datum
projcache_invalidate(PG_FUNCTION_ARGS)
{
	text	   *arg = PG_GETARG_TEXT_PP(0);
	const char *key;
	uint32		len;
	PcKey		search;
	PcEntry    *entry;
	PcCacheId	cache;

	pc_require_loaded();
	pc_check_key(arg, &key, &len);
	/* A key of a cache that opens or closes is being evicted anyway. */
	if (pc_key_cache_for_read(key, len, &cache) == PC_CACHE_UNAVAILABLE)
		PG_RETURN_BOOL(false);

	search = pc_search_key(key, len);
	entry = pc_entry_find(&search, true);
	if (entry != NULL && entry->cache != cache)
	{
		/* another cache's, being evicted: not this cache's key */
		pc_entry_release(entry);
		entry = NULL;
	}
	if (entry == NULL)
	{
		if (pc_wal_logging())
			invalidate_at_commit_add(arg);
		PG_RETURN_BOOL(false);
	}
	if (entry->state != PC_STATE_PENDING)
		entry->invalidated = true;
	pc_entry_release(entry);

	invalidate_at_commit_add(arg);
	PG_RETURN_BOOL(true);
}

/* ----------------------------------------------------------------
 * evict()
 * ----------------------------------------------------------------
 */

/* For pc_wait_on_key(): is the entry of that serial gone? */
static bool
entry_gone(const char *key, uint32 len, void *arg)
{
	uint64		serial = *(uint64 *) arg;
	PcKey		search = pc_search_key(key, len);
	PcEntry    *entry;
	bool		gone;

	entry = pc_entry_find(&search, false);
	gone = entry == NULL || entry->serial != serial;
	if (entry != NULL)
		pc_entry_release(entry);
	return gone;
}

/*
 * Wait until the worker has removed the entry (a reader may create the key
 * again at once: that is another entry).  Bounded, in case no worker runs
 * or a long fetch keeps it busy.  False if the entry is still there.
 */
static bool
wait_for_eviction(const char *key, uint32 len, uint64 serial)
{
	return pc_wait_on_key(key, len, PC_EVICT_WAIT_MS, entry_gone, &serial);
}

/*
 * projcache.evict(key text) → boolean: the worker removes the key (after
 * its running fetch, if any) and this returns true once it has.  False if
 * the key is not cached.  An ERROR if the key is still there after the
 * wait: false would say it was never cached, true that it is gone.
 */
Datum
projcache_evict(PG_FUNCTION_ARGS)
{
	const char *key;
	uint32		len;
	uint64		serial;
	PcCacheId	cache;

	pc_require_loaded();
	pc_check_key(PG_GETARG_TEXT_PP(0), &key, &len);
	if (pc_key_cache_for_read(key, len, &cache) == PC_CACHE_UNAVAILABLE)
		PG_RETURN_BOOL(false);	/* being evicted anyway */
	if (!request_cached_key(key, len, PC_REQ_EVICT, &serial))
		PG_RETURN_BOOL(false);
	if (!wait_for_eviction(key, len, serial))
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_IN_USE),
				 errmsg("could not evict projcache key \"%s\" within %d ms",
						pnstrdup(key, len), PC_EVICT_WAIT_MS),
				 errdetail("The worker is busy with a fetch, or no worker runs. The eviction stays requested: the worker removes the key when it next takes requests."),
				 errhint("Look at the key's fetch_state in projcache.entries. projcache.fetch_timeout bounds how long a fetch may run.")));
	PG_RETURN_BOOL(true);
}
