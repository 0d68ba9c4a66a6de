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
 * An entry is one chunk (PcEntry): a fixed header, then its body: the
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
#include "utils/freepage.h"
#include "utils/memutils.h"

#include "keycache.h"

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

typedef struct PcMapPartition
{
	LWLock		lock;			/* the entries of this partition, and: */
	dsa_pointer buckets;		/* PcRef[nbuckets] */
	uint32		nbuckets;		/* a power of two */
	uint32		count;			/* entries */
} PcMapPartition;

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

/*
 * References.  The DSA area is created in place over its whole reservation
 * and never grows past it (shmem.c), so it has one segment, and every
 * dsa_pointer of it is that segment's number, 0, and an offset into it;
 * chunks are MAXALIGNed.  An offset over 8 fits in 32 bits while the area
 * is at most 32 GB, which pc_check_memory_settings() makes sure of.  No
 * chunk is at offset 0 (the area's control is), so 0 is no reference.
 */
StaticAssertDecl(MAXIMUM_ALIGNOF == 8, "chunks must be 8-byte aligned");

static inline PcRef
ref_of(dsa_pointer dp)
{
	Assert(dp % MAXIMUM_ALIGNOF == 0);
	Assert(dp / MAXIMUM_ALIGNOF <= PG_UINT32_MAX);
	return (PcRef) (dp / MAXIMUM_ALIGNOF);
}

static inline dsa_pointer
ref_dsa(PcRef ref)
{
	return (dsa_pointer) ref * MAXIMUM_ALIGNOF;
}

/* This backend's mapping of the table (pc_keymap_attach). */
static PcMapControl *map_control = NULL;

/*
 * Where the area's one segment starts in this process.  A pointer into
 * segment 0 is the offset in it, so a chunk's address is this plus its
 * pointer: the lookup dsa_get_address() makes for any segment, done
 * inline on the read path.
 */
static char *map_segment = NULL;

static inline void *
map_address(dsa_pointer dp)
{
	Assert(DsaPointerIsValid(dp));
	Assert(map_segment + dp == dsa_get_address(pc_area(), dp));
	return map_segment + dp;
}

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
	map_segment = segment;
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
	map_segment = NULL;
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

static PcMapPartition *
partition_of(uint32 hash)
{
	(void) pc_area();			/* maps the table */
	return &map_control->partitions[hash >> (32 - PC_MAP_PARTITIONS_LOG2)].p;
}

/*
 * The entry of a key in a locked partition, or NULL; *link (if given) is
 * where its dsa_pointer is held: its bucket or the entry before it.
 */
static PcEntry *
chain_find(PcMapPartition *part, const PcKey *search,
		   PcRef **link)
{
	PcRef	   *buckets = map_address(part->buckets);
	PcRef	   *at = &buckets[search->hash & (part->nbuckets - 1)];

	while (*at != InvalidPcRef)
	{
		PcEntry    *entry = map_address(ref_dsa(*at));

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
static PcRef *
chain_link(const PcEntry *entry, PcMapPartition **part)
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
	new_buckets = map_address(new_dp);
	memset(new_buckets, 0, new_size);

	pc_lock_alone(&part->lock, LW_EXCLUSIVE);
	if (part->nbuckets != nbuckets)
	{
		LWLockRelease(&part->lock);
		pc_free(new_dp, new_size);	/* grown meanwhile */
		return;
	}
	old_dp = part->buckets;
	old_buckets = map_address(old_dp);
	for (i = 0; i < nbuckets; i++)
	{
		PcRef		ref = old_buckets[i];

		while (ref != InvalidPcRef)
		{
			PcEntry    *entry = map_address(ref_dsa(ref));
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
 * Entries' bodies
 * ----------------------------------------------------------------
 */

#define ENTRY_HEADER	offsetof(PcEntry, body)
#define SPLIT_INFO		(sizeof(PcRef) + sizeof(uint32))

/* A split body is kept whole unless cutting it saves at least this. */
#define PC_SPLIT_MIN	16

StaticAssertDecl(ENTRY_HEADER == 40,
				 "an entry's header must stay 40 bytes: check its fields");

/* Where each part of a body starts, and its length. */
typedef struct BodyLayout
{
	Size		retry;
	Size		periods;
	Size		revision;
	Size		revision_len;
	Size		config;
	Size		config_len;
	Size		len;			/* the whole body */
} BodyLayout;

static dsa_pointer
entry_tail(const PcEntry *entry)
{
	PcRef		ref;

	memcpy(&ref, entry->body, sizeof(ref));
	return ref_dsa(ref);
}

/* Body bytes held in the head chunk. */
static uint32
entry_cut(const PcEntry *entry)
{
	uint32		cut;

	memcpy(&cut, entry->body + sizeof(PcRef), sizeof(cut));
	return cut;
}

/* Copy body bytes [offset, offset + len), from the head and the tail. */
static void
body_read(const PcEntry *entry, Size offset, Size len, void *dst)
{
	const char *head = pc_entry_key(entry);
	Size		n = len;

	if (entry->parts & PC_PART_SPLIT)
	{
		Size		cut = entry_cut(entry);

		n = offset < cut ? Min(len, cut - offset) : 0;
		if (n < len)
		{
			const char *tail = map_address(entry_tail(entry));

			memcpy((char *) dst + n, tail + (offset + n - cut), len - n);
		}
	}
	if (n > 0)
		memcpy(dst, head + offset, n);
}

static void
body_write(PcEntry *entry, Size offset, Size len, const void *src)
{
	char	   *head = (char *) pc_entry_key(entry);
	Size		n = len;

	if (entry->parts & PC_PART_SPLIT)
	{
		Size		cut = entry_cut(entry);

		n = offset < cut ? Min(len, cut - offset) : 0;
		if (n < len)
		{
			char	   *tail = map_address(entry_tail(entry));

			memcpy(tail + (offset + n - cut), (const char *) src + n, len - n);
		}
	}
	if (n > 0)
		memcpy(head + offset, src, n);
}

static void
body_layout(const PcEntry *entry, BodyLayout *l)
{
	Size		offset = entry->keylen;

	l->retry = offset;
	if (entry->parts & PC_PART_RETRY)
		offset += sizeof(int64);
	l->periods = offset;
	if (entry->parts & PC_PART_PERIODS)
		offset += 2 * sizeof(int32);
	l->revision_len = 0;
	if (entry->parts & PC_PART_REVISION)
	{
		if (entry->revision_len == PC_REVISION_LONG)
		{
			uint32		len;

			body_read(entry, offset, sizeof(len), &len);
			offset += sizeof(len);
			l->revision_len = len;
		}
		else
			l->revision_len = entry->revision_len;
	}
	l->revision = offset;
	offset += l->revision_len;
	l->config = offset;
	l->config_len = 0;
	if (entry->parts & PC_PART_CONFIG)
	{
		union
		{
			uint64		words;	/* as long as any varlena header */
			char		bytes[sizeof(uint64)];
		}			header;

		body_read(entry, offset, VARHDRSZ, header.bytes);
		l->config_len = VARSIZE(header.bytes);
	}
	l->len = offset + l->config_len;
}

/*
 * How many of a body's len bytes go in its head chunk: all of them, or,
 * if cutting saves PC_SPLIT_MIN bytes, the cheapest cut that fills a chunk
 * of some size class or page count.  The key stays whole in the head
 * (readers compare it there).
 */
static Size
body_cut(Size keylen, Size len)
{
	Size		best = pc_dsa_footprint(ENTRY_HEADER + len);
	Size		best_cut = len;
	Size		want = ENTRY_HEADER + SPLIT_INFO + keylen + 1;

	while (want < ENTRY_HEADER + SPLIT_INFO + len)
	{
		Size		capacity = pc_dsa_capacity(want);
		Size		cut = capacity - ENTRY_HEADER - SPLIT_INFO;
		Size		cost;

		if (cut >= len)
			break;
		cost = pc_dsa_footprint(capacity) + pc_dsa_footprint(len - cut);
		if (cost + PC_SPLIT_MIN <= best)
		{
			best = cost;
			best_cut = cut;
		}
		want = capacity + 1;
		/* Past the size classes, heads are whole pages: try the last two. */
		if (capacity >= 2 * FPM_PAGE_SIZE &&
			want + 2 * FPM_PAGE_SIZE < ENTRY_HEADER + SPLIT_INFO + len)
			want = TYPEALIGN_DOWN(FPM_PAGE_SIZE,
								  ENTRY_HEADER + SPLIT_INFO + len) -
				FPM_PAGE_SIZE + 1;
	}
	return best_cut;
}

/* The sizes of the head and tail chunks of a body of len bytes (tail 0: none). */
static void
chunk_sizes(Size keylen, Size len, Size *head, Size *tail)
{
	Size		cut = body_cut(keylen, len);

	if (cut < len)
	{
		*head = ENTRY_HEADER + SPLIT_INFO + cut;
		*tail = len - cut;
	}
	else
	{
		*head = ENTRY_HEADER + len;
		*tail = 0;
	}
}

/* What a locked entry takes from the keys' memory (its message aside). */
Size
pc_entry_footprint(const PcEntry *entry)
{
	BodyLayout	l;
	Size		bytes;

	PC_ASSERT_ENTRY_LOCKED();
	body_layout(entry, &l);
	if (entry->parts & PC_PART_SPLIT)
		bytes = pc_dsa_footprint(ENTRY_HEADER + SPLIT_INFO + entry_cut(entry)) +
			pc_dsa_footprint(l.len - entry_cut(entry));
	else
		bytes = pc_dsa_footprint(ENTRY_HEADER + l.len);
	return bytes;
}

/*
 * The times of an entry.  Its expiry and refresh are held as offsets from
 * its fetch time, which they are never further from than a key's longest
 * lifetime (PC_MAX_PERIOD_MS twice); the clamp only guards the encoding.
 */
static int32
time_offset(int64 t, int64 from)
{
	int64		d = t - from;

	return (int32) Max(Min(d, (int64) PG_INT32_MAX), (int64) PG_INT32_MIN);
}

int64
pc_entry_expires_at(const PcEntry *entry)
{
	if (!(entry->parts & PC_PART_EXPIRY))
		return 0;
	return entry->fetched_at + entry->expires_in;
}

int64
pc_entry_refresh_at(const PcEntry *entry)
{
	if (!entry->has_refresh)
		return 0;
	return entry->fetched_at + entry->refresh_in;
}

void
pc_entry_set_expires_at(PcEntry *entry, int64 expires_at)
{
	entry->expires_in = time_offset(expires_at, entry->fetched_at);
	entry->parts |= PC_PART_EXPIRY;
}

void
pc_entry_set_refresh_at(PcEntry *entry, int64 refresh_at)
{
	entry->refresh_in = time_offset(refresh_at, entry->fetched_at);
	entry->has_refresh = true;
}

/* Set the fetch time, keeping the expiry and refresh where they were. */
void
pc_entry_set_fetched_at(PcEntry *entry, int64 fetched_at)
{
	int64		expires_at = pc_entry_expires_at(entry);
	int64		refresh_at = pc_entry_refresh_at(entry);

	entry->fetched_at = fetched_at;
	if (entry->parts & PC_PART_EXPIRY)
		pc_entry_set_expires_at(entry, expires_at);
	if (entry->has_refresh)
		pc_entry_set_refresh_at(entry, refresh_at);
}

int64
pc_entry_retry_at(const PcEntry *entry)
{
	BodyLayout	l;
	int64		retry_at;

	if (!(entry->parts & PC_PART_RETRY))
		return 0;
	body_layout(entry, &l);
	body_read(entry, l.retry, sizeof(retry_at), &retry_at);
	return retry_at;
}

static dsa_pointer
entry_error(const PcEntry *entry)
{
	return ref_dsa(entry->error);
}

void
pc_entry_periods(const PcEntry *entry, int32 *max_age_ms,
				 int32 *stale_for_ms)
{
	BodyLayout	l;
	int32		periods[2];

	*max_age_ms = *stale_for_ms = PC_PERIOD_DEFAULT;
	if (!(entry->parts & PC_PART_PERIODS))
		return;
	body_layout(entry, &l);
	body_read(entry, l.periods, sizeof(periods), periods);
	*max_age_ms = periods[0];
	*stale_for_ms = periods[1];
}

/*
 * What a read needs of a locked entry's body, in one walk of it: its
 * periods, its config's length and, if want_config, a copy of the config
 * (NULL if it has none, or if the copy failed: *oom set).
 */
void
pc_entry_read_value(const PcEntry *entry, bool want_config,
					PcEntryValue *v, bool *oom)
{
	BodyLayout	l;

	PC_ASSERT_ENTRY_LOCKED();
	body_layout(entry, &l);
	v->max_age_ms = v->stale_for_ms = PC_PERIOD_DEFAULT;
	if (entry->parts & PC_PART_PERIODS)
	{
		int32		periods[2];

		body_read(entry, l.periods, sizeof(periods), periods);
		v->max_age_ms = periods[0];
		v->stale_for_ms = periods[1];
	}
	v->config_len = (uint32) l.config_len;
	v->config = NULL;
	if (want_config && l.config_len > 0)
	{
		v->config = palloc_extended(l.config_len, MCXT_ALLOC_NO_OOM);
		if (v->config == NULL)
			*oom = true;
		else
			body_read(entry, l.config, l.config_len, v->config);
	}
}

/*
 * Copies of the revision (NUL-terminated), the config and the last
 * message, in the current memory context; NULL if there is none.  Under
 * the entry's lock: no ERROR, a failed copy returns NULL and sets *oom.
 */
char *
pc_entry_revision(const PcEntry *entry, bool *oom)
{
	BodyLayout	l;
	char	   *dst;

	PC_ASSERT_ENTRY_LOCKED();
	if (!(entry->parts & PC_PART_REVISION))
		return NULL;
	body_layout(entry, &l);
	dst = palloc_extended(l.revision_len + 1, MCXT_ALLOC_NO_OOM);
	if (dst == NULL)
	{
		*oom = true;
		return NULL;
	}
	body_read(entry, l.revision, l.revision_len, dst);
	dst[l.revision_len] = '\0';
	return dst;
}

struct varlena *
pc_entry_config(const PcEntry *entry, bool *oom)
{
	BodyLayout	l;
	char	   *dst;

	PC_ASSERT_ENTRY_LOCKED();
	if (!(entry->parts & PC_PART_CONFIG))
		return NULL;
	body_layout(entry, &l);
	dst = palloc_extended(l.config_len, MCXT_ALLOC_NO_OOM);
	if (dst == NULL)
	{
		*oom = true;
		return NULL;
	}
	body_read(entry, l.config, l.config_len, dst);
	return (struct varlena *) dst;
}

char *
pc_entry_error(const PcEntry *entry, bool *oom)
{
	dsa_pointer dp = entry_error(entry);
	const char *msg;

	PC_ASSERT_ENTRY_LOCKED();
	if (!DsaPointerIsValid(dp))
		return NULL;
	msg = map_address(dp);
	return pc_copy_no_oom(msg, strlen(msg), true, oom);
}

/* Free a message chunk (pc_store_message) no entry points to any more. */
void
pc_free_message(dsa_pointer dp)
{
	if (DsaPointerIsValid(dp))
		pc_free(dp, strlen(map_address(dp)) + 1);
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

/* Release an entry found or created locked. */
void
pc_entry_release(PcEntry *entry)
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
			PcEntry    *entry = map_address(ref_dsa(scan->next));

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
				buckets = map_address(part->buckets);
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
		buckets = map_address(part->buckets);
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
pc_keymap_find_or_create(const char *key, uint32 len, bool *created)
{
	return pc_keymap_find_or_create_for(key, len, InvalidOid, created);
}

/* Fill in a new pending entry, not linked yet, counted for slot owner. */
static void
init_entry(PcEntry *entry, const char *key, uint32 len, int owner)
{
	memset(entry, 0, ENTRY_HEADER);
	entry->next = InvalidDsaPointer;
	pg_atomic_init_u32(&entry->marks, 0);
	entry->serial = (uint32)
		pg_atomic_add_fetch_u64(&keymap_shared->entry_serial, 1);
	entry->keylen = (uint16) len;
	entry->owner = (uint8) owner;
	entry->state = PC_STATE_PENDING;
	entry->fetch_state = PC_FETCH_PENDING;
	memcpy(entry->body, key, len);
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
	init_entry(map_address(dp), key, len, owner);

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
	entry = map_address(dp);
	buckets = map_address(part->buckets);
	entry->next = buckets[search.hash & (part->nbuckets - 1)];
	buckets[search.hash & (part->nbuckets - 1)] = ref_of(dp);
	part->count++;
	entry_locked(part);
	pg_atomic_fetch_add_u64(&keymap_shared->nentries, 1);
	*created = true;
	return entry;
}

/* What chunks of these sizes take (a tail of 0 bytes is none). */
static Size
chunks_footprint(Size head_size, Size tail_size)
{
	return pc_dsa_footprint(head_size) +
		(tail_size > 0 ? pc_dsa_footprint(tail_size) : 0);
}

/* The chunks of a locked entry, with the sizes they were allocated at. */
static void
entry_chunks(const PcEntry *entry, Size *head_size, dsa_pointer *tail,
			 Size *tail_size)
{
	BodyLayout	l;

	body_layout(entry, &l);
	if (entry->parts & PC_PART_SPLIT)
	{
		*head_size = ENTRY_HEADER + SPLIT_INFO + entry_cut(entry);
		*tail = entry_tail(entry);
		*tail_size = l.len - entry_cut(entry);
	}
	else
	{
		*head_size = ENTRY_HEADER + l.len;
		*tail = InvalidDsaPointer;
		*tail_size = 0;
	}
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
	dsa_pointer error = entry_error(entry);
	Size		head_size;
	Size		tail_size;
	int			owner = entry->owner;

	PC_ASSERT_ENTRY_LOCKED();
	link = chain_link(entry, &part);
	Assert(part == held_partition);
	entry_chunks(entry, &head_size, &tail, &tail_size);
	dp = ref_dsa(*link);
	*link = entry->next;
	part->count--;
	pc_entry_release(entry);

	pg_atomic_fetch_sub_u64(&keymap_shared->nentries, 1);
	pc_role_unreserve(owner, chunks_footprint(head_size, tail_size));
	pc_free(dp, head_size);
	pc_free(tail, tail_size);
	pc_free_message(error);
}

/* ----------------------------------------------------------------
 * Writing an entry's body (the worker)
 * ----------------------------------------------------------------
 */

/*
 * Plan a write.  A new value, or a part the entry lacks, needs a new
 * chunk; a part it has is written in place, and a part set to nothing is
 * left in place, zeroed, unless the chunk is built anew anyway (then a
 * retry time of zero goes too).  The message is in the header: never a
 * new chunk.
 */
static void
plan_body(const PcEntry *entry, const PcEntryWrite *w, PcEntryPlan *plan)
{
	BodyLayout	l;
	uint8		parts = entry->parts & ~(PC_PART_SPLIT | PC_PART_EXPIRY);
	bool		periods = w->max_age_ms != PC_PERIOD_DEFAULT ||
		w->stale_for_ms != PC_PERIOD_DEFAULT;
	bool		rebuild = false;

	body_layout(entry, &l);
	plan->revlen = l.revision_len;
	plan->config_len = l.config_len;
	plan->revision_len = entry->revision_len;
	if (w->set_retry && w->retry_at != 0 && !(parts & PC_PART_RETRY))
		rebuild = true;
	if (w->set_periods && periods && !(parts & PC_PART_PERIODS))
		rebuild = true;
	if (w->set_value)
	{
		rebuild = true;
		parts &= ~(PC_PART_REVISION | PC_PART_CONFIG);
		plan->revlen = 0;
		plan->config_len = 0;
		plan->revision_len = 0;
		if (w->revision != NULL)
		{
			parts |= PC_PART_REVISION;
			plan->revlen = strlen(w->revision);
			plan->revision_len = plan->revlen < PC_REVISION_LONG ?
				(uint8) plan->revlen : PC_REVISION_LONG;
		}
		if (w->config != NULL)
		{
			parts |= PC_PART_CONFIG;
			plan->config_len = VARSIZE(w->config);
		}
	}
	if (rebuild)
	{
		int64		retry_at = w->set_retry ? w->retry_at :
			pc_entry_retry_at(entry);

		parts = retry_at != 0 ? parts | PC_PART_RETRY : parts & ~PC_PART_RETRY;
		if (w->set_periods)
			parts = periods ? parts | PC_PART_PERIODS :
				parts & ~PC_PART_PERIODS;
	}
	plan->parts = parts;
	plan->rebuild = rebuild;
	plan->len = entry->keylen +
		((parts & PC_PART_RETRY) ? sizeof(int64) : 0) +
		((parts & PC_PART_PERIODS) ? 2 * sizeof(int32) : 0) +
		((parts & PC_PART_REVISION) ?
		 plan->revlen + (plan->revision_len == PC_REVISION_LONG ?
						 sizeof(uint32) : 0) : 0) +
		plan->config_len;
}

/* Copy len body bytes of one entry into another's. */
static void
body_copy(PcEntry *dst, Size dst_offset, const PcEntry *src,
		  Size src_offset, Size len)
{
	char		buf[512];

	while (len > 0)
	{
		Size		n = Min(len, sizeof(buf));

		body_read(src, src_offset, n, buf);
		body_write(dst, dst_offset, n, buf);
		src_offset += n;
		dst_offset += n;
		len -= n;
	}
}

/*
 * Fill a new chunk's body (not linked yet) from the entry it replaces,
 * locked, and the write: the key, then each part, new or kept.  Its
 * header is the entry's, copied at commit; the fields that say how the
 * body is laid out are set here, and again after that copy.
 */
static void
build_body(PcEntry *chunk, dsa_pointer tail, Size cut, const PcEntry *old,
		   const PcEntryPlan *plan, const PcEntryWrite *w)
{
	BodyLayout	l;
	Size		offset = old->keylen;

	body_layout(old, &l);
	chunk->keylen = old->keylen;
	chunk->parts = plan->parts;
	chunk->revision_len = plan->revision_len;
	if (DsaPointerIsValid(tail))
	{
		PcRef		tail_ref = ref_of(tail);
		uint32		cut32 = (uint32) cut;

		chunk->parts |= PC_PART_SPLIT;
		memcpy(chunk->body, &tail_ref, sizeof(tail_ref));
		memcpy(chunk->body + sizeof(tail_ref), &cut32, sizeof(cut32));
	}
	body_write(chunk, 0, old->keylen, pc_entry_key(old));
	if (plan->parts & PC_PART_RETRY)
	{
		int64		retry_at = w->set_retry ? w->retry_at :
			pc_entry_retry_at(old);

		body_write(chunk, offset, sizeof(retry_at), &retry_at);
		offset += sizeof(retry_at);
	}
	if (plan->parts & PC_PART_PERIODS)
	{
		int32		periods[2];

		if (w->set_periods)
		{
			periods[0] = w->max_age_ms;
			periods[1] = w->stale_for_ms;
		}
		else
			pc_entry_periods(old, &periods[0], &periods[1]);
		body_write(chunk, offset, sizeof(periods), periods);
		offset += sizeof(periods);
	}
	if (plan->parts & PC_PART_REVISION)
	{
		if (plan->revision_len == PC_REVISION_LONG)
		{
			uint32		len = (uint32) plan->revlen;

			body_write(chunk, offset, sizeof(len), &len);
			offset += sizeof(len);
		}
		if (w->set_value)
			body_write(chunk, offset, plan->revlen, w->revision);
		else
			body_copy(chunk, offset, old, l.revision, plan->revlen);
		offset += plan->revlen;
	}
	if (plan->parts & PC_PART_CONFIG)
	{
		if (w->set_value)
			body_write(chunk, offset, plan->config_len, w->config);
		else
			body_copy(chunk, offset, old, l.config, plan->config_len);
		offset += plan->config_len;
	}
	Assert(offset == plan->len);
}

/* Write the parts the entry has in place (no new chunk needed). */
static void
write_in_place(PcEntry *entry, const PcEntryWrite *w)
{
	BodyLayout	l;

	body_layout(entry, &l);
	if (w->set_retry && (entry->parts & PC_PART_RETRY))
		body_write(entry, l.retry, sizeof(int64), &w->retry_at);
	if (w->set_periods && (entry->parts & PC_PART_PERIODS))
	{
		int32		periods[2] = {w->max_age_ms, w->stale_for_ms};

		body_write(entry, l.periods, sizeof(periods), periods);
	}
}

/*
 * What a write would allocate (0: nothing, or the key is gone), so that
 * the worker can make room for it first.
 */
Size
pc_entry_write_size(const char *key, uint32 len, const PcEntryWrite *w)
{
	PcKey		search = pc_search_key(key, len);
	PcEntry    *entry;
	PcEntryPlan plan;
	Size		head;
	Size		tail;

	entry = pc_entry_find(&search, false);
	if (entry == NULL)
		return 0;
	plan_body(entry, w, &plan);
	pc_entry_release(entry);
	if (!plan.rebuild)
		return 0;
	chunk_sizes(len, plan.len, &head, &tail);
	return pc_dsa_footprint(head) + (tail > 0 ? pc_dsa_footprint(tail) : 0);
}

/*
 * A write in two steps: pc_entry_prepare() plans it and, if it needs a new
 * chunk, allocates it under no lock and fills its body under the shared
 * lock; false if there is no room (the caller may make room and try
 * again).  pc_entry_commit() then writes the same w (its message may have
 * been set meanwhile: it goes in the header) and, through apply (NULL:
 * nothing), the header, and links the new chunk in the old one's place,
 * all under one exclusive lock; *applied says whether the entry took it
 * (not if the key is gone or apply said no).  Until it has, the caller
 * still owns w->error; once it has, the entry does, and the message it
 * replaced is freed.  pc_entry_abandon() gives up a prepared write.
 * Worker only: nothing else changes an entry's body between the two steps.
 */
bool
pc_entry_prepare(const char *key, uint32 len, const PcEntryWrite *w,
				 PcEntryPrepared *prep)
{
	PcKey		search = pc_search_key(key, len);
	PcEntry    *entry;

	memset(prep, 0, sizeof(*prep));
	prep->head = InvalidDsaPointer;
	prep->tail = InvalidDsaPointer;
	entry = pc_entry_find(&search, false);
	if (entry == NULL)
	{
		prep->gone = true;
		return true;
	}
	plan_body(entry, w, &prep->plan);
	pc_entry_release(entry);
	if (!prep->plan.rebuild)
		return true;

	chunk_sizes(len, prep->plan.len, &prep->head_size, &prep->tail_size);
	prep->head = pc_alloc(prep->head_size);
	if (!DsaPointerIsValid(prep->head))
		return false;
	if (prep->tail_size > 0)
	{
		prep->tail = pc_alloc(prep->tail_size);
		if (!DsaPointerIsValid(prep->tail))
		{
			pc_free(prep->head, prep->head_size);
			prep->head = InvalidDsaPointer;
			return false;
		}
	}

	/*
	 * Fill the new chunk now, so that the exclusive lock is held only to copy
	 * the header and relink: under the shared lock, which keeps the entry in
	 * its place; its body is this process's alone to change.
	 */
	entry = pc_entry_find(&search, false);
	if (entry == NULL)
	{
		pc_entry_abandon(prep);
		prep->gone = true;
		return true;
	}
	build_body(map_address(prep->head), prep->tail,
			   prep->tail_size > 0 ?
			   prep->head_size - ENTRY_HEADER - SPLIT_INFO : prep->plan.len,
			   entry, &prep->plan, w);
	pc_entry_release(entry);
	return true;
}

void
pc_entry_abandon(PcEntryPrepared *prep)
{
	pc_free(prep->head, prep->head_size);
	pc_free(prep->tail, prep->tail_size);
	prep->head = prep->tail = InvalidDsaPointer;
}

void
pc_entry_commit(const char *key, uint32 len, const PcEntryWrite *w,
				PcEntryPrepared *prep, PcEntryApplyFn apply, void *arg,
				bool *applied)
{
	PcKey		search = pc_search_key(key, len);
	PcEntry    *entry;
	dsa_pointer old_head = InvalidDsaPointer;
	dsa_pointer old_tail = InvalidDsaPointer;
	Size		old_head_size = 0;
	Size		old_tail_size = 0;
	dsa_pointer old_error = InvalidDsaPointer;

	*applied = false;
	entry = prep->gone ? NULL : pc_entry_find(&search, true);
	if (entry == NULL || (apply != NULL && !apply(entry, arg)))
	{
		if (entry != NULL)
			pc_entry_release(entry);
		pc_entry_abandon(prep);
		return;
	}
	if (w->set_error)
	{
		old_error = entry_error(entry);
		entry->error = ref_of(w->error);
	}
	if (prep->plan.rebuild)
	{
		PcEntry    *chunk = map_address(prep->head);
		uint8		parts = chunk->parts;
		PcMapPartition *part;
		PcRef	   *link;

		/* The header as it is now, but for the new body's layout. */
		memcpy(chunk, entry, offsetof(PcEntry, parts));
		pg_atomic_init_u32(&chunk->marks, pg_atomic_read_u32(&entry->marks));
		chunk->parts = parts | (entry->parts & PC_PART_EXPIRY);
		Assert(chunk->revision_len == prep->plan.revision_len);
		link = chain_link(entry, &part);
		entry_chunks(entry, &old_head_size, &old_tail, &old_tail_size);
		old_head = ref_dsa(*link);
		*link = ref_of(prep->head);
		/* The owner's bytes follow (keys per role). */
		pg_atomic_fetch_add_u64(&pc_role_slot(entry->owner)->bytes,
								(int64) chunks_footprint(prep->head_size,
														 prep->tail_size));
		pg_atomic_fetch_sub_u64(&pc_role_slot(entry->owner)->bytes,
								(int64) chunks_footprint(old_head_size,
														 old_tail_size));
	}
	else
		write_in_place(entry, w);
	pc_entry_release(entry);
	prep->head = prep->tail = InvalidDsaPointer;

	pc_free(old_head, old_head_size);
	pc_free(old_tail, old_tail_size);
	if (old_error != w->error)
		pc_free_message(old_error);
	*applied = true;
}

/* Both steps at once; false if there was no room. */
bool
pc_entry_write(const char *key, uint32 len, const PcEntryWrite *w,
			   PcEntryApplyFn apply, void *arg, bool *applied)
{
	PcEntryPrepared prep;

	*applied = false;
	if (!pc_entry_prepare(key, len, w, &prep))
		return false;
	pc_entry_commit(key, len, w, &prep, apply, arg, applied);
	return true;
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
