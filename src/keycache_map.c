/*-------------------------------------------------------------------------
 *
 * keycache_map.c
 *	  The key cache's shared map: a dshash table of PcEntry on the DSA area.
 *
 * Keys have variable length (up to PC_MAX_KEY_BYTES) but dshash wants a
 * fixed-size key, so the hashed key is a small PcKey that points at the
 * bytes: in DSA for stored entries, in the caller's memory for lookups.
 * Our own hash and compare functions follow either pointer.  An entry thus
 * costs its fixed part plus its key's bytes, not the longest key.
 *
 * Locking: each entry is protected by its dshash partition lock.  Nothing
 * of ours that can ERROR, sleep or do I/O runs while one is held: chunks
 * are allocated before the lock is taken (DSA_ALLOC_NO_OOM), and unlinked
 * chunks are freed after it is released (freeing takes only the DSA's own
 * lock).  dshash itself may raise out-of-memory while inserting; the
 * accounting in pc_alloc() keeps the area from getting that full.  Only the scheduler worker
 * deletes entries; readers create pending ones.
 *
 * Copyright (c) 2026, projcache developers
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "common/hashfn.h"
#include "utils/builtins.h"

#include "keycache.h"

static int	pc_key_compare(const void *a, const void *b, size_t size, void *arg);
static dshash_hash pc_key_dshash(const void *key, size_t size, void *arg);

static dshash_parameters
pc_keymap_params(int tranche_id)
{
	dshash_parameters params = {
		.key_size = sizeof(PcKey),
		.entry_size = sizeof(PcEntry),
		.compare_function = pc_key_compare,
		.hash_function = pc_key_dshash,
		.tranche_id = tranche_id,
	};

	return params;
}

dshash_table *
pc_keymap_create(dsa_area *area, int tranche_id)
{
	dshash_parameters params = pc_keymap_params(tranche_id);

	return dshash_create(area, &params, area);
}

dshash_table *
pc_keymap_attach(dsa_area *area, int tranche_id, dshash_table_handle handle)
{
	dshash_parameters params = pc_keymap_params(tranche_id);

	return dshash_attach(area, &params, handle, area);
}

PcKey
pc_search_key(const char *key, uint32 len)
{
	PcKey		k;

	k.len = len;
	k.data = InvalidDsaPointer;
	k.local = key;
	return k;
}

const char *
pc_key_bytes(dsa_area *area, const PcKey *key)
{
	if (key->local != NULL)
		return key->local;
	return (const char *) dsa_get_address(area, key->data);
}

uint32
pc_key_hash(const char *key, uint32 len)
{
	return hash_bytes((const unsigned char *) key, (int) len);
}

static dshash_hash
pc_key_dshash(const void *key, size_t size, void *arg)
{
	const PcKey *k = (const PcKey *) key;

	return pc_key_hash(pc_key_bytes((dsa_area *) arg, k), k->len);
}

static int
pc_key_compare(const void *a, const void *b, size_t size, void *arg)
{
	const PcKey *ka = (const PcKey *) a;
	const PcKey *kb = (const PcKey *) b;

	if (ka->len != kb->len)
		return ka->len < kb->len ? -1 : 1;
	return memcmp(pc_key_bytes((dsa_area *) arg, ka),
				  pc_key_bytes((dsa_area *) arg, kb), ka->len);
}

/* The condition variable that announces changes of this key. */
ConditionVariable *
pc_key_cv(const char *key, uint32 len)
{
	return &pc_shared->key_cv[pc_key_hash(key, len) % PC_NUM_KEY_CVS];
}

Size
pc_value_size(const PcValue *value)
{
	return offsetof(PcValue, data) + value->config_offset + value->config_len;
}

/*
 * Look the key up, creating a pending entry if it is unknown.  Returns the
 * entry locked exclusively; *created says whether it is new.  The key's
 * bytes are copied to DSA before the lock is taken.  With no room for a
 * new key in the keys' part of projcache.max_memory, returns NULL: nothing is created, and
 * the worker is woken to make room (reads never fail for lack of it).
 */
PcEntry *
pc_keymap_find_or_create(const char *key, uint32 len, bool *created)
{
	MemoryContext callercxt = CurrentMemoryContext;
	dsa_pointer dp = InvalidDsaPointer;
	PcKey		search = pc_search_key(key, len);
	PcEntry    *entry;
	bool		found;

	/*
	 * dshash allocates the entry itself, and raises an ERROR if that fails.
	 * Refuse new keys before that could happen: with no room, the key is not
	 * created (NULL), and the worker is asked to make room.
	 */
	if (pc_key_memory_used() + PC_ENTRY_DSA_BYTES + pc_dsa_footprint(len) <=
		pc_key_memory_bound())
		dp = pc_alloc(len);
	if (!DsaPointerIsValid(dp))
	{
		/* Someone may have created it meanwhile: no need for room then. */
		entry = pc_entry_find(&search, true);
		if (entry != NULL)
		{
			*created = false;
			return entry;
		}
		pg_atomic_write_u32(&pc_shared->room_wanted, 1);
		pc_wake_worker();
		*created = false;
		return NULL;
	}
	memcpy(dsa_get_address(pc_area(), dp), key, len);

	/*
	 * dshash may still fail to allocate the entry (or a larger bucket
	 * array) when the area's pages are fragmented, although the count above
	 * said there was room.  That failure is an out-of-memory ERROR raised
	 * with dshash's partition locks held, and before dshash changed
	 * anything.  A read must not fail for lack of room: it is caught, the
	 * locks dshash took are released (this backend holds no other LWLock
	 * here: callers take none before), and the key reads as one with no
	 * room.  Any other ERROR goes on.
	 */
	Assert(!LWLockHeldByMe(pc_shared->snap_map_lock));
	PG_TRY();
	{
		entry = dshash_find_or_insert(pc_keymap(), &search, &found);
	}
	PG_CATCH();
	{
		ErrorData  *edata;

		pc_free(dp, len);
		MemoryContextSwitchTo(callercxt);
		edata = CopyErrorData();
		if (edata->sqlerrcode != ERRCODE_OUT_OF_MEMORY)
			PG_RE_THROW();
		FlushErrorState();
		FreeErrorData(edata);
		LWLockReleaseAll();
		entry = NULL;
	}
	PG_END_TRY();
	if (entry == NULL)
	{
		pg_atomic_write_u32(&pc_shared->room_wanted, 1);
		pc_wake_worker();
		*created = false;
		return NULL;
	}
#ifdef USE_ASSERT_CHECKING
	pc_entry_locks_held++;
#endif
	if (found)
	{
		/* Somebody else created it meanwhile. */
		pc_free(dp, len);
	}
	else
	{
		entry->key.len = len;
		entry->key.data = dp;
		entry->key.local = NULL;
		entry->serial = pg_atomic_add_fetch_u64(&pc_shared->entry_serial, 1);
		pg_atomic_init_u32(&entry->requests, 0);
		pg_atomic_init_u32(&entry->visited, 0);
		entry->state = PC_STATE_PENDING;
		entry->fetch_state = PC_FETCH_PENDING;
		entry->invalidated = false;
		entry->awaiting_commit = false;
		entry->has_refresh = false;
		entry->error_unstored = false;
		entry->attempts = 0;
		entry->fetched_at = 0;
		entry->expires_at = 0;
		entry->refresh_at = 0;
		entry->retry_at = 0;
		entry->value = InvalidDsaPointer;
		entry->last_error = InvalidDsaPointer;
		pg_atomic_fetch_add_u64(&pc_shared->nentries, 1);
		pg_atomic_fetch_add_u64(&pc_shared->memory_used, PC_ENTRY_DSA_BYTES);
	}
	*created = !found;
	return entry;
}

/*
 * Entry locks.  dshash hands out entries locked (their partition's LWLock)
 * and offers no way to ask whether this backend holds one, so every find,
 * release and scan of the key map goes through these, which count, in
 * assert-enabled builds, how many this backend holds: helpers that need a
 * locked entry assert it with PC_ASSERT_ENTRY_LOCKED().  A scan counts as
 * one lock from its start to its end.
 */
#ifdef USE_ASSERT_CHECKING
int			pc_entry_locks_held = 0;
#endif

/* Find a key's entry, locked; NULL if it is not in the map. */
PcEntry *
pc_entry_find(const PcKey *search, bool exclusive)
{
	PcEntry    *entry = dshash_find(pc_keymap(), search, exclusive);

#ifdef USE_ASSERT_CHECKING
	if (entry != NULL)
		pc_entry_locks_held++;
#endif
	return entry;
}

/* Release an entry found or created locked. */
void
pc_entry_release(PcEntry *entry)
{
	PC_ASSERT_ENTRY_LOCKED();
#ifdef USE_ASSERT_CHECKING
	pc_entry_locks_held--;
#endif
	dshash_release_lock(pc_keymap(), entry);
}

/* Start a scan of the whole map; each entry it returns is locked. */
void
pc_entry_scan_begin(dshash_seq_status *status, bool exclusive)
{
	dshash_seq_init(status, pc_keymap(), exclusive);
#ifdef USE_ASSERT_CHECKING
	pc_entry_locks_held++;
#endif
}

void
pc_entry_scan_end(dshash_seq_status *status)
{
	PC_ASSERT_ENTRY_LOCKED();
#ifdef USE_ASSERT_CHECKING
	pc_entry_locks_held--;
#endif
	dshash_seq_term(status);
}

/*
 * Unlink a locked entry (worker only; caller holds its lock) and release it; then free its
 * chunks, which no reader can reach any more.
 */
void
pc_keymap_delete(PcEntry *entry)
{
	dsa_pointer key = entry->key.data;
	uint32		keylen = entry->key.len;
	dsa_pointer value = entry->value;
	dsa_pointer error = entry->last_error;
	Size		value_size = 0;
	Size		error_size = 0;

	PC_ASSERT_ENTRY_LOCKED();
	if (DsaPointerIsValid(value))
		value_size = pc_value_size(dsa_get_address(pc_area(), value));
	if (DsaPointerIsValid(error))
		error_size = strlen(dsa_get_address(pc_area(), error)) + 1;

	dshash_delete_entry(pc_keymap(), entry);
#ifdef USE_ASSERT_CHECKING
	pc_entry_locks_held--;
#endif
	pg_atomic_fetch_sub_u64(&pc_shared->nentries, 1);
	pg_atomic_fetch_sub_u64(&pc_shared->memory_used, PC_ENTRY_DSA_BYTES);

	pc_free(key, keylen);
	pc_free(value, value_size);
	pc_free(error, error_size);
}

/*
 * Record a request on a locked entry.  Returns true if the worker has not
 * been told yet, in which case the caller must pc_request_send() once the
 * lock is released.  The bit in the entry is the request; the ring only
 * tells the worker where to look.
 */
bool
pc_request_mark(PcEntry *entry, uint32 bits)
{
	uint32		old;

	PC_ASSERT_ENTRY_LOCKED();
	old = pg_atomic_fetch_or_u32(&entry->requests, bits);
	return (old & bits) != bits;
}

/* Tell the worker that the key has a request, and wake it. */
void
pc_request_send(const char *key, uint32 len)
{
	if (!pc_ring_push(key, len))
	{
		/* Ring full: the worker will scan the map for request bits. */
		pg_atomic_write_u32(&pc_shared->ring_overflow, 1);
		pc_count(PC_CTR_REQUEST_OVERFLOWS, 1);
	}
	pc_count(PC_CTR_FETCH_REQUESTS, 1);
	pc_wake_worker();
}

/* Validate a key argument. */
void
pc_check_key(text *key, const char **bytes, uint32 *len)
{
	Size		n = VARSIZE_ANY_EXHDR(key);

	if (n == 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("key must not be empty")));
	if (n > PC_MAX_KEY_BYTES)
		ereport(ERROR,
				(errcode(ERRCODE_PROGRAM_LIMIT_EXCEEDED),
				 errmsg("key is too long"),
				 errdetail("The key is %zu bytes; the limit is %d bytes.",
						   n, PC_MAX_KEY_BYTES)));
	*bytes = VARDATA_ANY(key);
	*len = (uint32) n;
}
