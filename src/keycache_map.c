/*-------------------------------------------------------------------------
 *
 * keycache_map.c
 *	  The key cache's shared map: a partitioned hash table on the DSA area
 *	  whose entries are each one chunk holding a key's state, key and value.
 *
 * The table is PC_MAP_PARTITIONS partitions, each with its own LWLock,
 * count and array of buckets; a bucket holds a reference to its first
 * entry, and the entries of a bucket are chained through PcEntry.next.
 * References (PcRef) are 32 bits: a chunk's dsa_pointer over 8.  A
 * key's hash picks its partition (high bits) and bucket (low bits).  A
 * partition's bucket array doubles once it holds more than
 * PC_MAP_MAX_LOAD entries a bucket, so buckets cost a key 2 to 4 bytes:
 * the table is sized for memory rather than for the shortest chain, since
 * an entry's header and key share a cache line and passing one costs a
 * line read.
 *
 * An entry is one chunk (PcEntry): a fixed header, then its body (its
 * layout, reading it and writing it are in keycache_entry.c): the
 * key's bytes and only the parts the key has.  The worker stores a value
 * by building the entry's chunk anew and putting it in its chain in place
 * of the old one (pc_entry_write); a chunk whose allocator size class
 * would waste much is cut in two, a head that fills its class and a tail.
 * A key costs its chunk and its share of a bucket array, counted exactly
 * in memory_used (pc_alloc), not an estimate.
 *
 * Locking: each entry is protected by its partition's lock.  Readers copy
 * out under the shared lock; creating an entry, writing its flags, and
 * replacing or unlinking its chunk take it exclusively.  Nothing that can
 * ERROR, sleep or do I/O runs while one is held: chunks are allocated
 * before the lock is taken (DSA_ALLOC_NO_OOM), and those unlinked are
 * freed after it is released.  A backend holds at most one partition lock
 * at a time, and no other lock of ours with it.  Only the worker replaces
 * or deletes entries, so the layout it reads under the shared lock is
 * still the entry's when it comes back with the exclusive one.
 *
 * Keys per role: a reader that creates a key counts it for its role before
 * the entry exists, and the entry's chunks' bytes follow it
 * (keycache_roles.c).
 *
 * The map's own part of shared memory ("projcache key map") holds where
 * the table is in the DSA area, the count of entries, the serial numbers
 * handed out and the keys' condition variables (all atomics, or set once
 * at creation).
 *
 * Copyright (c) 2026, projcache developers
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "common/hashfn.h"
#include "storage/shmem.h"
#include "utils/memutils.h"

#include "keycache_map.h"

typedef struct PcKeymapShared
{
	int			tranche;		/* of the partition locks */
	dsa_pointer handle;			/* the table's PcMapControl */
	pg_atomic_uint64 nentries;	/* entries in the key map */
	pg_atomic_uint64 entry_serial;	/* last PcEntry.serial handed out */
	ConditionVariable key_cv[PC_NUM_KEY_CVS];
} PcKeymapShared;

static PcKeymapShared *keymap_shared = NULL;

/* ----------------------------------------------------------------
 * The table
 * ----------------------------------------------------------------
 */

#define PC_MAP_PARTITIONS_LOG2	7
#define PC_MAP_PARTITIONS		(1 << PC_MAP_PARTITIONS_LOG2)
#define PC_MAP_INITIAL_BUCKETS	16	/* per partition */
#define PC_MAP_MAX_LOAD			2	/* entries a bucket before it doubles */

/* Each partition on a cache line of its own: readers write its lock. */
typedef union PcMapPartitionLine
{
	PcMapPartition p;
	char		pad[PG_CACHE_LINE_SIZE];
} PcMapPartitionLine;

typedef struct PcMapControl
{
	PcMapPartitionLine partitions[PC_MAP_PARTITIONS];
} PcMapControl;

StaticAssertDecl(sizeof(PcMapPartition) <= PG_CACHE_LINE_SIZE,
				 "a partition must fit its cache line");
StaticAssertDecl(InvalidDsaPointer == 0 && InvalidPcRef == 0,
				 "zeroed bucket arrays must read as empty");
StaticAssertDecl(PC_MAX_KEY_BYTES <= PG_UINT16_MAX,
				 "PcEntry.keylen must hold the longest key");
StaticAssertDecl(PC_MAX_PERIOD_MS <= PG_INT32_MAX / 2,
				 "an entry's times must fit their offsets");

/* This backend's mapping of the table (pc_keymap_attach). */
static PcMapControl *map_control = NULL;

char	   *pc_map_segment = NULL;

/* The partition whose lock this backend holds for an entry, if any. */
static PcMapPartition *held_partition = NULL;

/*
 * Create the table in the area the postmaster is creating; returns its
 * handle, and counts the bytes its bucket arrays take as used.  The
 * references above rest on the area being one segment whose pointers are
 * offsets from its start: checked here, once, with an error.
 */
static dsa_pointer
keymap_create(dsa_area *area, char *segment, int tranche_id)
{
	dsa_pointer dp = dsa_allocate0(area, sizeof(PcMapControl));
	PcMapControl *control = dsa_get_address(area, dp);
	Size		array_size = PC_MAP_INITIAL_BUCKETS * sizeof(PcRef);
	int			i;

	if ((char *) control != segment + dp)
		ereport(ERROR,
				(errcode(ERRCODE_INTERNAL_ERROR),
				 errmsg("projcache: the DSA area's chunks are not where the key map expects them"),
				 errdetail("A chunk at dsa_pointer %llu is at offset %lld from the area's start.",
						   (unsigned long long) dp,
						   (long long) ((char *) control - segment))));
	for (i = 0; i < PC_MAP_PARTITIONS; i++)
	{
		PcMapPartition *part = &control->partitions[i].p;

		LWLockInitialize(&part->lock, tranche_id);
		part->buckets = dsa_allocate0(area, array_size);
		part->nbuckets = PC_MAP_INITIAL_BUCKETS;
		part->count = 0;
		pc_area_charge(pc_dsa_footprint(array_size));
	}
	return dp;
}

/* A process attaching to the area maps the table (a PcAreaAttachFn). */
static void
keymap_attach(dsa_area *area, char *segment)
{
	LWLockRegisterTranche(keymap_shared->tranche, "projcache_keymap");
	pc_map_segment = segment;
	map_control = (PcMapControl *) (segment + keymap_shared->handle);
	Assert((void *) map_control == dsa_get_address(area, keymap_shared->handle));
}

void
pc_keymap_shmem_request(void)
{
	RequestAddinShmemSpace(MAXALIGN(sizeof(PcKeymapShared)));
}

/* After the area's startup: it creates the table in a new area. */
void
pc_keymap_shmem_startup(void)
{
	bool		found;
	dsa_area   *area;
	char	   *segment;
	int			i;

	map_control = NULL;
	pc_map_segment = NULL;
	keymap_shared = ShmemInitStruct("projcache key map",
									sizeof(PcKeymapShared), &found);
#ifdef USE_ASSERT_CHECKING
	pc_locks_register_count(&pc_entry_locks_held, PC_LOCK_ALONE);
#endif
	pc_area_on_attach(keymap_attach);
	if (found)
		return;
	area = pc_area_being_created(&segment);
	Assert(area != NULL);
	keymap_shared->tranche = LWLockNewTrancheId();
	pg_atomic_init_u64(&keymap_shared->nentries, 0);
	pg_atomic_init_u64(&keymap_shared->entry_serial, 0);
	for (i = 0; i < PC_NUM_KEY_CVS; i++)
		ConditionVariableInit(&keymap_shared->key_cv[i]);
	keymap_shared->handle = keymap_create(area, segment,
										  keymap_shared->tranche);
}

/* Entries in the map now. */
uint64
pc_keymap_count(void)
{
	return pg_atomic_read_u64(&keymap_shared->nentries);
}

/* Wake every reader waiting on any key. */
void
pc_key_cvs_broadcast(void)
{
	int			i;

	for (i = 0; i < PC_NUM_KEY_CVS; i++)
		ConditionVariableBroadcast(&keymap_shared->key_cv[i]);
}

PcKey
pc_search_key(const char *key, uint32 len)
{
	PcKey		k;

	Assert(len <= PC_MAX_KEY_BYTES);
	k.bytes = key;
	k.len = len;
	k.hash = pc_key_hash(key, len);
	return k;
}

uint32
pc_key_hash(const char *key, uint32 len)
{
	return hash_bytes((const unsigned char *) key, (int) len);
}

/* The condition variable that announces changes of this key. */
ConditionVariable *
pc_key_cv(const char *key, uint32 len)
{
	return &keymap_shared->key_cv[pc_key_hash(key, len) % PC_NUM_KEY_CVS];
}

/* The partition a key's hash picks: its high bits. */
int
pc_map_partition_index(uint32 hash)
{
	return (int) (hash >> (32 - PC_MAP_PARTITIONS_LOG2));
}

static PcMapPartition *
partition_of(uint32 hash)
{
	(void) pc_area();			/* maps the table */
	return &map_control->partitions[pc_map_partition_index(hash)].p;
}

/*
 * The entry of a key in a locked partition, or NULL; *link (if given) is
 * where its dsa_pointer is held: its bucket or the entry before it.
 */
static PcEntry *
chain_find(PcMapPartition *part, const PcKey *search,
		   PcRef **link)
{
	PcRef	   *buckets = pc_map_address(part->buckets);
	PcRef	   *at = &buckets[search->hash & (part->nbuckets - 1)];

	while (*at != InvalidPcRef)
	{
		PcEntry    *entry = pc_map_address(pc_ref_dsa(*at));

		if (entry->keylen == search->len &&
			memcmp(pc_entry_key(entry), search->bytes, search->len) == 0)
		{
			if (link != NULL)
				*link = at;
			return entry;
		}
		at = &entry->next;
	}
	return NULL;
}

/* Where a locked entry's reference is held in its chain. */
PcRef *
pc_map_chain_link(const PcEntry *entry, PcMapPartition **part)
{
	PcKey		search = pc_search_key(pc_entry_key(entry), entry->keylen);
	PcRef	   *link = NULL;

	*part = partition_of(search.hash);
	if (chain_find(*part, &search, &link) != entry)
		elog(PANIC, "projcache: a locked entry is not in its chain");
	return link;
}

/*
 * Double a partition's buckets if it still has nbuckets: the new array is
 * allocated before the lock is taken, the old one freed after.  Without
 * room in the keys' budget, it stays as it is (chains grow longer) and a
 * later creation tries again.
 */
static void
partition_grow(PcMapPartition *part, uint32 nbuckets)
{
	Size		old_size = (Size) nbuckets * sizeof(PcRef);
	Size		new_size = 2 * old_size;
	uint32		mask = 2 * nbuckets - 1;
	dsa_pointer new_dp;
	dsa_pointer old_dp;
	PcRef	   *new_buckets;
	PcRef	   *old_buckets;
	uint32		i;

	if ((Size) nbuckets * 2 > MaxAllocHugeSize / sizeof(PcRef))
		return;
	new_dp = pc_alloc(new_size);
	if (!DsaPointerIsValid(new_dp))
		return;
	new_buckets = pc_map_address(new_dp);
	memset(new_buckets, 0, new_size);

	pc_lock_alone(&part->lock, LW_EXCLUSIVE);
	if (part->nbuckets != nbuckets)
	{
		LWLockRelease(&part->lock);
		pc_free(new_dp, new_size);	/* grown meanwhile */
		return;
	}
	old_dp = part->buckets;
	old_buckets = pc_map_address(old_dp);
	for (i = 0; i < nbuckets; i++)
	{
		PcRef		ref = old_buckets[i];

		while (ref != InvalidPcRef)
		{
			PcEntry    *entry = pc_map_address(pc_ref_dsa(ref));
			PcRef		next = entry->next;
			uint32		b = pc_key_hash(pc_entry_key(entry),
										entry->keylen) & mask;

			entry->next = new_buckets[b];
			new_buckets[b] = ref;
			ref = next;
		}
	}
	part->buckets = new_dp;
	part->nbuckets = 2 * nbuckets;
	LWLockRelease(&part->lock);
	pc_free(old_dp, old_size);
}

/* ----------------------------------------------------------------
 * The keys' memory target
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

/* ----------------------------------------------------------------
 * Entries: finding, creating, scanning and deleting them
 * ----------------------------------------------------------------
 */

/*
 * Entry locks.  An entry is found or created with its partition's lock
 * held (held_partition), and released with pc_entry_release().  Every
 * find, release and scan goes through these, which count, in
 * assert-enabled builds, how many this backend holds: helpers that need a
 * locked entry assert it with PC_ASSERT_ENTRY_LOCKED().  A scan counts as
 * one lock from its start to its end.
 */
#ifdef USE_ASSERT_CHECKING
int			pc_entry_locks_held = 0;
#endif

static void
entry_locked(PcMapPartition *part)
{
	held_partition = part;
#ifdef USE_ASSERT_CHECKING
	pc_entry_locks_held++;
#endif
}

/* Find a key's entry, locked; NULL if it is not in the map. */
PcEntry *
pc_entry_find(const PcKey *search, bool exclusive)
{
	PcMapPartition *part = partition_of(search->hash);
	PcEntry    *entry;

	pc_lock_alone(&part->lock, exclusive ? LW_EXCLUSIVE : LW_SHARED);
	entry = chain_find(part, search, NULL);
	if (entry == NULL)
		LWLockRelease(&part->lock);
	else
		entry_locked(part);
	return entry;
}

/* Release the partition lock entry_locked() noted. */
static void
partition_release(void)
{
	PcMapPartition *part = held_partition;

	PC_ASSERT_ENTRY_LOCKED();
	Assert(part != NULL);
#ifdef USE_ASSERT_CHECKING
	pc_entry_locks_held--;
#endif
	held_partition = NULL;
	LWLockRelease(&part->lock);
}

/* Release an entry found or created locked. */
void
pc_entry_release(PcEntry *entry)
{
	partition_release();
}

/*
 * The map's self-check (keycache_map_check.c) walks the partitions one at
 * a time: pc_map_partition_lock() takes partition 'index' in shared mode,
 * with no other lock of ours held, and counts it as an entry's lock until
 * pc_map_partition_unlock().  While it is held, the partition's buckets and
 * chains stay as they are.
 */
int
pc_map_npartitions(void)
{
	return PC_MAP_PARTITIONS;
}

PcMapPartition *
pc_map_partition_lock(int index)
{
	PcMapPartition *part;

	Assert(index >= 0 && index < PC_MAP_PARTITIONS);
	(void) pc_area();			/* maps the table */
	part = &map_control->partitions[index].p;
	pc_lock_alone(&part->lock, LW_SHARED);
	entry_locked(part);
	return part;
}

void
pc_map_partition_unlock(PcMapPartition *part)
{
	Assert(part == held_partition);
	partition_release();
}

/*
 * Scan the whole map, one partition locked at a time; each entry returned
 * is locked until the next call.  Only flags may be written meanwhile.
 */
void
pc_entry_scan_begin(PcEntryScan *scan, bool exclusive)
{
	Assert(pc_lock_order_ok(PC_LOCK_ALONE));
	scan->partition = -1;
	scan->bucket = 0;
	scan->next = InvalidPcRef;
	scan->exclusive = exclusive;
#ifdef USE_ASSERT_CHECKING
	pc_entry_locks_held++;
#endif
}

PcEntry *
pc_entry_scan_next(PcEntryScan *scan)
{
	for (;;)
	{
		PcMapPartition *part;
		PcRef	   *buckets;

		if (scan->next != InvalidPcRef)
		{
			PcEntry    *entry = pc_map_address(pc_ref_dsa(scan->next));

			scan->next = entry->next;
			return entry;
		}
		if (scan->partition >= PC_MAP_PARTITIONS)
			return NULL;
		if (scan->partition >= 0)
		{
			part = &map_control->partitions[scan->partition].p;
			if (++scan->bucket < part->nbuckets)
			{
				buckets = pc_map_address(part->buckets);
				scan->next = buckets[scan->bucket];
				continue;
			}
			LWLockRelease(&part->lock);
		}
		if (++scan->partition >= PC_MAP_PARTITIONS)
			return NULL;
		part = &map_control->partitions[scan->partition].p;
		LWLockAcquire(&part->lock, scan->exclusive ? LW_EXCLUSIVE : LW_SHARED);
		scan->bucket = 0;
		buckets = pc_map_address(part->buckets);
		scan->next = buckets[0];
	}
}

void
pc_entry_scan_end(PcEntryScan *scan)
{
	PC_ASSERT_ENTRY_LOCKED();
#ifdef USE_ASSERT_CHECKING
	pc_entry_locks_held--;
#endif
	if (scan->partition >= 0 && scan->partition < PC_MAP_PARTITIONS)
		LWLockRelease(&map_control->partitions[scan->partition].p.lock);
	scan->partition = PC_MAP_PARTITIONS;
}

/*
 * Look the key up, creating a pending entry if it is unknown.  Returns the
 * entry locked exclusively; *created says whether it is new.  With no room
 * for a new key in the keys' part of projcache.max_memory, returns NULL:
 * nothing is created, and the worker is woken to make room (reads never
 * fail for lack of it).  The key counts for no role: the worker's own
 * entries.
 */
PcEntry *
pc_keymap_find_or_create(const char *key, uint32 len, PcCacheId cache,
						 bool *created)
{
	return pc_keymap_find_or_create_for(key, len, InvalidOid, cache, created);
}

/*
 * Fill in a new pending entry of cache, not linked yet, counted for slot
 * owner.
 */
static void
init_entry(PcEntry *entry, const char *key, uint32 len, int owner,
		   PcCacheId cache)
{
	memset(entry, 0, ENTRY_HEADER);
	entry->next = InvalidDsaPointer;
	pg_atomic_init_u32(&entry->marks, 0);
	entry->serial = (uint32)
		pg_atomic_add_fetch_u64(&keymap_shared->entry_serial, 1);
	entry->keylen = (uint16) len;
	entry->owner = (uint8) owner;
	entry->cache = cache;
	entry->state = PC_STATE_PENDING;
	entry->fetch_state = PC_FETCH_PENDING;
	memcpy(entry->body, key, len);
}

/*
 * The same, for a reader of role 'role': a key it creates counts for it,
 * and a role that has reached projcache.max_keys_per_role creates none
 * (NULL, as with no room; the worker is woken to evict its oldest keys).
 * The entry found may be of another cache than 'cache' (the one the caller
 * resolved the key to) if the caches changed meanwhile: the caller checks.
 */
PcEntry *
pc_keymap_find_or_create_for(const char *key, uint32 len, Oid role,
							 PcCacheId cache, bool *created)
{
	PcKey		search = pc_search_key(key, len);
	Size		size = ENTRY_HEADER + len;
	PcMapPartition *part;
	PcEntry    *entry;
	dsa_pointer dp;
	PcRef	   *buckets;
	uint32		nbuckets;
	int			owner;

	*created = false;
	/* The role's count first: it may read the catalog, under no lock. */
	owner = pc_role_reserve(role, pc_dsa_footprint(size));
	if (owner < 0)
	{
		/* Someone may have created it meanwhile: then it is no new key. */
		return pc_entry_find(&search, true);
	}
	dp = pc_alloc(size);
	if (!DsaPointerIsValid(dp))
	{
		/* Someone may have created it meanwhile: no need for room then. */
		pc_role_unreserve(owner, pc_dsa_footprint(size));
		entry = pc_entry_find(&search, true);
		if (entry == NULL)
		{
			pc_worker_want_room();
			pc_wake_worker();
		}
		return entry;
	}
	init_entry(pc_map_address(dp), key, len, owner, cache);

	/*
	 * Keep chains short first.  The count and size read without the lock are
	 * a hint: partition_grow() checks under it.
	 */
	part = partition_of(search.hash);
	nbuckets = part->nbuckets;
	if (part->count >= nbuckets * PC_MAP_MAX_LOAD)
		partition_grow(part, nbuckets);

	pc_lock_alone(&part->lock, LW_EXCLUSIVE);
	entry = chain_find(part, &search, NULL);
	if (entry != NULL)
	{
		/* Somebody else created it meanwhile. */
		entry_locked(part);
		pc_free(dp, size);
		pc_role_unreserve(owner, pc_dsa_footprint(size));
		return entry;
	}
	entry = pc_map_address(dp);
	buckets = pc_map_address(part->buckets);
	entry->next = buckets[search.hash & (part->nbuckets - 1)];
	buckets[search.hash & (part->nbuckets - 1)] = pc_ref_of(dp);
	part->count++;
	entry_locked(part);
	pg_atomic_fetch_add_u64(&keymap_shared->nentries, 1);
	*created = true;
	return entry;
}

/*
 * Unlink a locked entry (worker only; caller holds its lock exclusively)
 * and release it; then free its chunks, which no reader can reach any
 * more, and take the key off its role's count.
 */
void
pc_keymap_delete(PcEntry *entry)
{
	PcMapPartition *part;
	PcRef	   *link;
	dsa_pointer dp;
	dsa_pointer tail;
	dsa_pointer error = pc_entry_error_ref(entry);
	Size		head_size;
	Size		tail_size;
	int			owner = entry->owner;

	PC_ASSERT_ENTRY_LOCKED();
	link = pc_map_chain_link(entry, &part);
	Assert(part == held_partition);
	pc_entry_chunks(entry, &head_size, &tail, &tail_size);
	dp = pc_ref_dsa(*link);
	*link = entry->next;
	part->count--;
	pc_entry_release(entry);

	pg_atomic_fetch_sub_u64(&keymap_shared->nentries, 1);
	pc_role_unreserve(owner, pc_chunks_footprint(head_size, tail_size));
	pc_free(dp, head_size);
	pc_free(tail, tail_size);
	pc_free_message(error);
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
	old = pg_atomic_fetch_or_u32(&entry->marks, bits);
	return (old & bits) != bits;
}
