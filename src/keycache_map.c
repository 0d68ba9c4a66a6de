/*-------------------------------------------------------------------------
 *
 * keycache_map.c
 *	  The key cache's shared map: a dshash table of PcEntry on the DSA area.
 *
 * Keys have variable length (up to PC_MAX_KEY_BYTES) but dshash wants a
 * fixed-size key, so the hashed key is a small PcKey: a short key's bytes
 * themselves, or a pointer to them, in DSA for stored entries, in the
 * caller's memory for lookups.  Our own hash and compare functions read
 * either form.  An entry thus costs its fixed part, plus its key's bytes
 * only when they do not fit in it, not the longest key.
 *
 * Values are laid out here too (PcValue): in one chunk, or two when the
 * allocator's size classes would otherwise waste much of one.
 *
 * Locking: each entry is protected by its dshash partition lock.  Nothing
 * of ours that can ERROR, sleep or do I/O runs while one is held: chunks
 * are allocated before the lock is taken (DSA_ALLOC_NO_OOM), and unlinked
 * chunks are freed after it is released (freeing takes only the DSA's own
 * lock).  dshash itself may raise out-of-memory while inserting; the
 * accounting in pc_alloc() keeps the area from getting that full.  Only
 * the scheduler worker deletes entries; readers create pending ones.
 *
 * Keys per role: a reader that creates a key counts it for its role (the
 * current role outside SECURITY DEFINER functions) in a slot of
 * pc_shared->role_slots, under role_lock and before the entry exists, and
 * the worker takes it off when it deletes the entry; a role at
 * projcache.max_keys_per_role creates no key (see shmem.h for the slots
 * and their lock).
 *
 * Copyright (c) 2026, projcache developers
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "common/hashfn.h"
#include "miscadmin.h"
#include "utils/builtins.h"
#include "utils/freepage.h"

#include "keycache.h"

/* ----------------------------------------------------------------
 * The map and its keys
 * ----------------------------------------------------------------
 */

static int	pc_key_compare(const void *a, const void *b, size_t size,
						   void *arg);
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

	pc_dshash_copy_keys_with_memcpy(&params);
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

StaticAssertDecl(offsetof(PcKey, bytes) + PC_KEY_PTR_AT == 8 &&
				 sizeof(dsa_pointer) <= 8 && sizeof(char *) <= 8 &&
				 sizeof(PcKey) == 16,
				 "a PcKey's pointer must be aligned and fit in its 16 bytes");
StaticAssertDecl(PC_MAX_KEY_BYTES <= PG_UINT16_MAX,
				 "PcKey.len must hold the longest key");
/* dshash's 16-byte item header and an entry fill the 112-byte size class */
StaticAssertDecl(SIZEOF_DSA_POINTER != 8 || sizeof(PcEntry) <= 96,
				 "a PcEntry must fit the 112-byte size class with dshash's header");
StaticAssertDecl(PC_MAX_PERIOD_MS <= PG_INT32_MAX,
				 "PcEntry's periods must hold the longest");

static void
key_set_ptr(PcKey *k, const void *ptr, size_t size)
{
	memcpy(k->bytes + PC_KEY_PTR_AT, ptr, size);
}

static dsa_pointer
key_dsa(const PcKey *k)
{
	dsa_pointer dp;

	Assert(k->form == PC_KEY_DSA);
	memcpy(&dp, k->bytes + PC_KEY_PTR_AT, sizeof(dp));
	return dp;
}

PcKey
pc_search_key(const char *key, uint32 len)
{
	PcKey		k;

	Assert(len <= PC_MAX_KEY_BYTES);
	k.len = (uint16) len;
	k.form = PC_KEY_SEARCH;
	key_set_ptr(&k, &key, sizeof(key));
	return k;
}

const char *
pc_key_bytes(dsa_area *area, const PcKey *key)
{
	const char *local;

	switch ((PcKeyForm) key->form)
	{
		case PC_KEY_INLINE:
			return key->bytes;
		case PC_KEY_DSA:
			return (const char *) dsa_get_address(area, key_dsa(key));
		case PC_KEY_SEARCH:
			break;
	}
	Assert(key->form == PC_KEY_SEARCH);
	memcpy(&local, key->bytes + PC_KEY_PTR_AT, sizeof(local));
	return local;
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

/* ----------------------------------------------------------------
 * Values
 * ----------------------------------------------------------------
 */

/* A split value is kept whole unless cutting it saves at least this. */
#define PC_VALUE_SPLIT_MIN	32

#define VALUE_HEADER		offsetof(PcValue, data)
#define VALUE_SPLIT_HEADER	(VALUE_HEADER + sizeof(dsa_pointer))

static Size
value_len(const PcValue *value)
{
	return Max(value->revision_len, 0) + (Size) value->config_len;
}

static bool
value_is_split(const PcValue *value)
{
	return value->head_len < value_len(value);
}

static const char *
value_head(const PcValue *value)
{
	return value->data + (value_is_split(value) ? sizeof(dsa_pointer) : 0);
}

static dsa_pointer
value_tail(const PcValue *value)
{
	dsa_pointer dp = InvalidDsaPointer;

	if (value_is_split(value))
		memcpy(&dp, value->data, sizeof(dp));
	return dp;
}

/*
 * How many of a value's len bytes go in its head chunk (len: whole).  Every
 * cut that fills a chunk of some size class or page count is tried; the
 * cheapest wins if it beats one chunk by PC_VALUE_SPLIT_MIN.
 */
static Size
value_head_len(Size len)
{
	Size		best = pc_dsa_footprint(VALUE_HEADER + len);
	Size		best_head = len;
	Size		want = VALUE_SPLIT_HEADER + 1;

	while (want < VALUE_SPLIT_HEADER + len)
	{
		Size		capacity = pc_dsa_capacity(want);
		Size		head = capacity - VALUE_SPLIT_HEADER;
		Size		cost;

		if (head >= len)
			break;
		cost = pc_dsa_footprint(capacity) + pc_dsa_footprint(len - head);
		if (cost + PC_VALUE_SPLIT_MIN <= best)
		{
			best = cost;
			best_head = head;
		}
		want = capacity + 1;
		/* Past the size classes, heads are whole pages: try the last two. */
		if (capacity >= 2 * FPM_PAGE_SIZE &&
			want + 2 * FPM_PAGE_SIZE < VALUE_SPLIT_HEADER + len)
			want = TYPEALIGN_DOWN(FPM_PAGE_SIZE, VALUE_SPLIT_HEADER + len) -
				FPM_PAGE_SIZE + 1;
	}
	return best_head;
}

/*
 * Store a value (revision may be NULL, config NULL for a disabled key);
 * InvalidDsaPointer if the keys' memory is used up.  Worker only; no lock
 * is held, nothing here raises an ERROR.
 */
dsa_pointer
pc_value_make(const char *revision, const struct varlena *config)
{
	int32		revlen = revision ? (int32) strlen(revision) : -1;
	uint32		config_len = config ? VARSIZE(config) : 0;
	Size		len = Max(revlen, 0) + (Size) config_len;
	Size		head_len = value_head_len(len);
	dsa_pointer dp;
	dsa_pointer tail = InvalidDsaPointer;
	PcValue    *value;
	char	   *dst;
	char	   *tail_dst = NULL;
	Size		off;

	if (head_len < len)
	{
		tail = pc_alloc(len - head_len);
		if (!DsaPointerIsValid(tail))
			return InvalidDsaPointer;
		tail_dst = dsa_get_address(pc_area(), tail);
		dp = pc_alloc(VALUE_SPLIT_HEADER + head_len);
	}
	else
		dp = pc_alloc(VALUE_HEADER + len);
	if (!DsaPointerIsValid(dp))
	{
		pc_free(tail, len - head_len);
		return InvalidDsaPointer;
	}
	value = dsa_get_address(pc_area(), dp);
	value->revision_len = revlen;
	value->config_len = config_len;
	value->head_len = (uint32) head_len;
	if (head_len < len)
		memcpy(value->data, &tail, sizeof(tail));
	dst = (char *) value_head(value);

	/* The revision's bytes, then the config's, across the cut. */
	off = 0;
	if (revlen > 0)
	{
		Size		n = Min((Size) revlen, head_len);

		memcpy(dst, revision, n);
		if (n < (Size) revlen)
			memcpy(tail_dst, revision + n, revlen - n);
		off = revlen;
	}
	if (config_len > 0)
	{
		const char *src = (const char *) config;
		Size		n = head_len > off ? Min(head_len - off, config_len) : 0;

		if (n > 0)
			memcpy(dst + off, src, n);
		if (n < config_len)
			memcpy(tail_dst + (off + n - head_len), src + n, config_len - n);
	}
	Assert(value_len(value) == len);
	return dp;
}

/*
 * The bytes of projcache.max_memory an entry takes: its item in the map,
 * its key when held apart, its value's chunks (as pc_free() counts them
 * back).  Caller holds the entry's lock.
 */
Size
pc_entry_footprint(const PcEntry *entry)
{
	Size		bytes = PC_ENTRY_DSA_BYTES;

	PC_ASSERT_ENTRY_LOCKED();
	if (entry->key.form == PC_KEY_DSA)
		bytes += pc_dsa_footprint(entry->key.len);
	if (DsaPointerIsValid(entry->value))
	{
		const PcValue *value = dsa_get_address(pc_area(), entry->value);
		Size		len = value_len(value);

		if (value_is_split(value))
			bytes += pc_dsa_footprint(len - value->head_len) +
				pc_dsa_footprint(VALUE_SPLIT_HEADER + value->head_len);
		else
			bytes += pc_dsa_footprint(VALUE_HEADER + len);
	}
	return bytes;
}

/*
 * Free a value's chunks.  The caller has unlinked it from its entry under
 * the entry's lock, so no reader can reach it, and only the worker frees
 * values: its header is still there to read.
 */
void
pc_value_free(dsa_pointer dp)
{
	PcValue    *value;
	Size		len;

	if (!DsaPointerIsValid(dp))
		return;
	value = dsa_get_address(pc_area(), dp);
	len = value_len(value);
	if (value_is_split(value))
	{
		pc_free(value_tail(value), len - value->head_len);
		pc_free(dp, VALUE_SPLIT_HEADER + value->head_len);
	}
	else
		pc_free(dp, VALUE_HEADER + len);
}

/*
 * Copy bytes [offset, offset + len) of a value's revision and config.
 * Caller holds the lock of the entry that points to it.
 */
void
pc_value_read(const PcValue *value, Size offset, Size len, char *dst)
{
	Size		n = 0;

	PC_ASSERT_ENTRY_LOCKED();
	Assert(offset + len <= value_len(value));
	if (offset < value->head_len)
	{
		n = Min(len, value->head_len - offset);
		memcpy(dst, value_head(value) + offset, n);
	}
	if (n < len)
	{
		const char *tail = dsa_get_address(pc_area(), value_tail(value));

		memcpy(dst + n, tail + (offset + n - value->head_len), len - n);
	}
}

/*
 * Copies of the revision (NUL-terminated) and of the config, in the
 * current memory context; NULL if there is none.  Under the entry's lock:
 * no ERROR, a failed copy returns NULL and sets *oom (if given).
 */
char *
pc_value_revision(const PcValue *value, bool *oom)
{
	char	   *dst;

	if (value->revision_len < 0)
		return NULL;
	dst = palloc_extended(value->revision_len + 1, MCXT_ALLOC_NO_OOM);
	if (dst == NULL)
	{
		if (oom != NULL)
			*oom = true;
		return NULL;
	}
	pc_value_read(value, 0, value->revision_len, dst);
	dst[value->revision_len] = '\0';
	return dst;
}

struct varlena *
pc_value_config(const PcValue *value, bool *oom)
{
	char	   *dst;

	if (value->config_len == 0)
		return NULL;
	dst = palloc_extended(value->config_len, MCXT_ALLOC_NO_OOM);
	if (dst == NULL)
	{
		if (oom != NULL)
			*oom = true;
		return NULL;
	}
	pc_value_read(value, Max(value->revision_len, 0), value->config_len, dst);
	return (struct varlena *) dst;
}

/* ----------------------------------------------------------------
 * Keys per role
 * ----------------------------------------------------------------
 */

/*
 * Where eviction keeps what keys take (keycache_worker.c, "Eviction under
 * memory pressure"), and where a dump's load stops: their part of
 * projcache.max_memory less a headroom, room for one batch of new keys'
 * entries, which readers create while the worker is busy, at most
 * PC_HEADROOM_MAX_PERCENT of it.
 */
Size
pc_key_memory_target(void)
{
	Size		bound = pc_key_memory_bound();
	Size		headroom = (Size) pc_batch_size * PC_ENTRY_DSA_BYTES;

	return bound - Min(headroom, bound / 100 * PC_HEADROOM_MAX_PERCENT);
}

/* projcache.max_keys_per_role in force; 0 for no bound. */
uint32
pc_keys_per_role_bound(void)
{
	if (pc_max_keys_per_role < 0)
		return (uint32) Max(1, pc_key_memory_bound() / PC_ENTRY_DSA_BYTES / 2);
	return (uint32) pc_max_keys_per_role;
}

/* The role a slot counts keys for; InvalidOid for none or for many. */
Oid
pc_role_of_slot(int slot)
{
	Assert(slot >= 0 && slot < PC_ROLE_SLOTS);
	if (slot == PC_ROLE_NONE || slot == PC_ROLE_OVERFLOW)
		return InvalidOid;
	return pc_shared->role_slots[slot].role;
}

/*
 * The slot that counts role's keys, or -1 if it has none and one could be
 * given.  With claim (and role_lock held exclusively), one is given if it
 * has none: in the order the role's hash says, the first never used or
 * whose role has no keys left.  With or without claim, the overflow slot
 * if no slot can be given.  A role's slot comes before the first
 * slot never used in that order, since slots are never given back to no
 * role: the search stops there.
 */
static int
role_slot_find(Oid role, bool claim)
{
	const int	nslots = PC_ROLE_OVERFLOW - 1;	/* slots 1 .. nslots */
	int			start = (int) (murmurhash32((uint32) role) % nslots);
	int			free_slot = -1;
	int			i;

	Assert(LWLockHeldByMe(pc_shared->role_lock));
	Assert(!claim || LWLockHeldByMeInMode(pc_shared->role_lock, LW_EXCLUSIVE));
	for (i = 0; i < nslots; i++)
	{
		int			n = 1 + (start + i) % nslots;
		PcRoleSlot *slot = &pc_shared->role_slots[n];

		if (slot->role == role)
			return n;
		if (free_slot < 0 &&
			(slot->role == InvalidOid || pg_atomic_read_u32(&slot->keys) == 0))
			free_slot = n;
		if (slot->role == InvalidOid)
			break;
	}
	if (free_slot < 0)
		return PC_ROLE_OVERFLOW;	/* without claim too: no lock to upgrade */
	if (!claim)
		return -1;
	pc_shared->role_slots[free_slot].role = role;
	return free_slot;
}

/*
 * Count one more key for role, about to be created: returns its slot, or
 * -1 if the role has reached projcache.max_keys_per_role (the worker is
 * then asked to evict its oldest keys).  Superusers' keys, and keys of no
 * role (the worker's), count for none.  The caller gives the key back with
 * role_unreserve() unless it creates the entry, which then owns it.  May
 * read the catalog: call before any lock is taken.
 */
static int
role_reserve(Oid role)
{
	uint32		bound = pc_keys_per_role_bound();
	PcRoleSlot *slot;
	int			n;

	if (!OidIsValid(role) || superuser_arg(role))
		return PC_ROLE_NONE;
	pc_lock_alone(pc_shared->role_lock, LW_SHARED);
	n = role_slot_find(role, false);
	if (n < 0)
	{
		LWLockRelease(pc_shared->role_lock);
		pc_lock_alone(pc_shared->role_lock, LW_EXCLUSIVE);
		n = role_slot_find(role, true);
	}
	slot = &pc_shared->role_slots[n];
	/* Reserve first, so that concurrent creations cannot all pass. */
	if (pg_atomic_add_fetch_u32(&slot->keys, 1) > bound && bound > 0)
	{
		pg_atomic_fetch_sub_u32(&slot->keys, 1);
		n = -1;
	}
	LWLockRelease(pc_shared->role_lock);
	if (n < 0)
	{
		pg_atomic_write_u32(&slot->room_wanted, 1);
		pg_atomic_write_u32(&pc_shared->role_room_wanted, 1);
		pc_wake_worker();
	}
	return n;
}

/* A key counted by role_reserve() was not created after all. */
static void
role_unreserve(int slot)
{
	if (slot == PC_ROLE_NONE)
		return;
	Assert(pg_atomic_read_u32(&pc_shared->role_slots[slot].keys) > 0);
	pg_atomic_fetch_sub_u32(&pc_shared->role_slots[slot].keys, 1);
}

/* ----------------------------------------------------------------
 * Entries: finding, creating, scanning and deleting them
 * ----------------------------------------------------------------
 */

/*
 * Look the key up, creating a pending entry if it is unknown.  Returns the
 * entry locked exclusively; *created says whether it is new.  A key too
 * long to be held in the entry is copied to DSA before the lock is taken;
 * a short one into the entry, under it.  With no room for a new key in
 * the keys' part of projcache.max_memory, returns NULL: nothing is
 * created, and the worker is woken to make room (reads never fail for lack
 * of it).  The key counts for no role: the worker's own entries.
 */
PcEntry *
pc_keymap_find_or_create(const char *key, uint32 len, bool *created)
{
	return pc_keymap_find_or_create_for(key, len, InvalidOid, created);
}

/*
 * Find or insert the entry of search's key, locked; NULL if dshash could
 * not allocate it, after giving back the key's chunk dp and the role's
 * reserved count.
 *
 * dshash may fail to allocate the entry (or a larger bucket array) when
 * the area's pages are fragmented, although the count of memory used said
 * there was room.  That failure is an out-of-memory ERROR raised with
 * dshash's partition locks held, and before dshash changed anything.  A
 * read must not fail for lack of room: it is caught, the locks dshash took
 * are released (this backend holds no other LWLock here: callers take
 * none before), and the key reads as one with no room.  Any other ERROR
 * goes on.
 */
static PcEntry *
insert_entry(PcKey *search, dsa_pointer dp, uint32 len, int owner,
			 bool *found)
{
	MemoryContext callercxt = CurrentMemoryContext;
	PcEntry    *volatile entry = NULL;

	Assert(pc_lock_order_ok(PC_LOCK_ALONE));
	PG_TRY();
	{
		entry = dshash_find_or_insert(pc_keymap(), search, found);
	}
	PG_CATCH();
	{
		ErrorData  *edata;

		pc_free(dp, len);
		role_unreserve(owner);
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
	return entry;
}

/*
 * Fill in an entry dshash has just inserted (locked) for a new key: its
 * key (inline, or in the chunk dp, already filled) and a pending state
 * counted for the role slot owner.
 */
static void
init_entry(PcEntry *entry, const char *key, uint32 len, dsa_pointer dp,
		   int owner)
{
	Assert(entry->key.len == len);
	if (len <= PC_KEY_INLINE_BYTES)
	{
		entry->key.form = PC_KEY_INLINE;
		memcpy(entry->key.bytes, key, len);
	}
	else
	{
		entry->key.form = PC_KEY_DSA;
		key_set_ptr(&entry->key, &dp, sizeof(dp));
	}
	entry->serial = pg_atomic_add_fetch_u64(&pc_shared->entry_serial, 1);
	pg_atomic_init_u32(&entry->requests, 0);
	pg_atomic_init_u32(&entry->visited, 0);
	entry->state = PC_STATE_PENDING;
	entry->fetch_state = PC_FETCH_PENDING;
	entry->invalidated = false;
	entry->awaiting_commit = false;
	entry->has_refresh = false;
	entry->error_unstored = false;
	entry->owner = (uint8) owner;
	entry->max_age_ms = PC_PERIOD_DEFAULT;
	entry->stale_for_ms = PC_PERIOD_DEFAULT;
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

/*
 * The same, for a reader of role 'role': a key it creates counts for it,
 * and a role that has reached projcache.max_keys_per_role creates none
 * (NULL, as with no room; the worker is woken to evict its oldest keys).
 */
PcEntry *
pc_keymap_find_or_create_for(const char *key, uint32 len, Oid role,
							 bool *created)
{
	dsa_pointer dp = InvalidDsaPointer;
	PcKey		search = pc_search_key(key, len);
	PcEntry    *entry;
	bool		in_entry = len <= PC_KEY_INLINE_BYTES;
	bool		room;
	bool		found;
	int			owner;

	/* The role's count first: it may read the catalog, under no lock. */
	owner = role_reserve(role);
	if (owner < 0)
	{
		/* Someone may have created it meanwhile: then it is no new key. */
		entry = pc_entry_find(&search, true);
		*created = false;
		return entry;
	}

	/*
	 * dshash allocates the entry itself, and raises an ERROR if that fails.
	 * Refuse new keys before that could happen: with no room, the key is not
	 * created (NULL), and the worker is asked to make room.
	 */
	room = pc_key_memory_used() + PC_ENTRY_DSA_BYTES +
		(in_entry ? 0 : pc_dsa_footprint(len)) <= pc_key_memory_bound();
	if (room && !in_entry)
	{
		dp = pc_alloc(len);
		room = DsaPointerIsValid(dp);
	}
	if (!room)
	{
		/* Someone may have created it meanwhile: no need for room then. */
		role_unreserve(owner);
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
	if (!in_entry)
		memcpy(dsa_get_address(pc_area(), dp), key, len);

	entry = insert_entry(&search, dp, len, owner, &found);
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
		role_unreserve(owner);
	}
	else
		init_entry(entry, key, len, dp, owner);
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
	PcEntry    *entry;

	Assert(pc_lock_order_ok(PC_LOCK_ALONE));
	entry = dshash_find(pc_keymap(), search, exclusive);
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
	Assert(pc_lock_order_ok(PC_LOCK_ALONE));
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
 * Unlink a locked entry (worker only; caller holds its lock) and release
 * it; then free its chunks, which no reader can reach any more, and take
 * the key off its role's count.
 */
void
pc_keymap_delete(PcEntry *entry)
{
	dsa_pointer key = InvalidDsaPointer;
	uint32		keylen = entry->key.len;
	dsa_pointer value = entry->value;
	dsa_pointer error = entry->last_error;
	Size		error_size = 0;
	int			owner = entry->owner;

	PC_ASSERT_ENTRY_LOCKED();
	Assert(entry->key.form != PC_KEY_SEARCH);
	if (entry->key.form == PC_KEY_DSA)
		key = key_dsa(&entry->key);
	if (DsaPointerIsValid(error))
		error_size = strlen(dsa_get_address(pc_area(), error)) + 1;

	dshash_delete_entry(pc_keymap(), entry);
#ifdef USE_ASSERT_CHECKING
	pc_entry_locks_held--;
#endif
	pg_atomic_fetch_sub_u64(&pc_shared->nentries, 1);
	pg_atomic_fetch_sub_u64(&pc_shared->memory_used, PC_ENTRY_DSA_BYTES);
	role_unreserve(owner);

	pc_free(key, keylen);
	pc_value_free(value);
	pc_free(error, error_size);
}

/* ----------------------------------------------------------------
 * Requests to the worker
 * ----------------------------------------------------------------
 */

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

/*
 * Tell the worker that the key has a request, and wake it.  The request
 * names the role that made it (the current role outside SECURITY DEFINER
 * functions): a new key's fetch waits for that role's turn.
 */
void
pc_request_send(const char *key, uint32 len)
{
	if (!pc_ring_push(key, len, GetOuterUserId(), false))
	{
		/* Ring full: the worker will scan the map for request bits. */
		pg_atomic_write_u32(&pc_shared->ring_overflow, 1);
		pc_count(PC_CTR_REQUEST_OVERFLOWS, 1);
	}
	pc_count(PC_CTR_FETCH_REQUESTS, 1);
	pc_wake_worker();
}

/*
 * A read found no room to create the key (memory, or the role's
 * projcache.max_keys_per_role): ask the worker to create it once it has
 * made room, and to fetch it with the other keys asked for meanwhile.
 * Without this, the request would be lost, and a reader waiting for the
 * key later would have it fetched alone.
 */
void
pc_request_send_refused(const char *key, uint32 len)
{
	/* Lost when its share of the ring is full: no scan finds it. */
	if (pc_ring_push(key, len, GetOuterUserId(), true))
	{
		pc_count(PC_CTR_FETCH_REQUESTS, 1);
		pc_wake_worker();
	}
}

/* ----------------------------------------------------------------
 * Checking a key argument
 * ----------------------------------------------------------------
 */

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

/* ----------------------------------------------------------------
 * Key lists (see PcKeyList in keycache.h)
 * ----------------------------------------------------------------
 */
void
pc_keylist_init(PcKeyList *list, Size payload_size)
{
	list->capacity = 256;
	list->count = 0;
	list->oom = false;
	list->payload_size = payload_size;
	list->keys = palloc(list->capacity * sizeof(char *));
	list->lens = palloc(list->capacity * sizeof(uint32));
	list->payloads = palloc0(Max(list->capacity * payload_size, 1));
}

/* Double the list's room; false (oom set) if it cannot. */
static bool
keylist_grow(PcKeyList *list)
{
	int			newcap = list->capacity * 2;
	char	  **keys;
	uint32	   *lens;
	char	   *payloads;

	keys = repalloc_extended(list->keys, newcap * sizeof(char *),
							 MCXT_ALLOC_NO_OOM);
	if (keys != NULL)
		list->keys = keys;
	lens = keys ? repalloc_extended(list->lens, newcap * sizeof(uint32),
									MCXT_ALLOC_NO_OOM) : NULL;
	if (lens != NULL)
		list->lens = lens;
	payloads = lens ? repalloc_extended(list->payloads,
										Max(newcap * list->payload_size, 1),
										MCXT_ALLOC_NO_OOM) : NULL;
	if (payloads == NULL)
	{
		list->oom = true;
		return false;
	}
	list->payloads = payloads;
	list->capacity = newcap;
	return true;
}

/* Add a copy of a key; false (oom set) if out of memory. */
bool
pc_keylist_add(PcKeyList *list, const char *key, uint32 len)
{
	char	   *copy;

	if (list->oom)
		return false;
	if (list->count == list->capacity && !keylist_grow(list))
		return false;
	copy = pc_copy_no_oom(key, len, true, &list->oom);
	if (copy == NULL)
		return false;
	list->keys[list->count] = copy;
	list->lens[list->count] = len;
	memset(pc_keylist_payload(list, list->count), 0, list->payload_size);
	list->count++;
	return true;
}

/*
 * Add every key of the map that want() accepts (NULL: every one) to an
 * initialized list, under a scan of the map, and have fill() (NULL: none)
 * write each one's payload.  Both run under the entry's partition lock:
 * they may not raise an ERROR; fill() returns false to stop the scan (it
 * set list->oom).
 */
void
pc_keylist_from_map(PcKeyList *list, bool (*want) (PcEntry *entry),
					bool (*fill) (PcEntry *entry, void *payload))
{
	dshash_seq_status status;
	PcEntry    *entry;

	pc_entry_scan_begin(&status, false);
	while ((entry = dshash_seq_next(&status)) != NULL)
	{
		if (want != NULL && !want(entry))
			continue;
		if (!pc_keylist_add(list, pc_key_bytes(pc_area(), &entry->key),
							entry->key.len))
			break;
		if (fill != NULL &&
			!fill(entry, pc_keylist_payload(list, list->count - 1)))
			break;
	}
	pc_entry_scan_end(&status);
}
