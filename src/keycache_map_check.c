/*-------------------------------------------------------------------------
 *
 * keycache_map_check.c
 *	  projcache.debug_check_map(): the key map's self-check, for tests.  It
 *	  raises ERRCODE_DATA_CORRUPTED at the first invariant it finds broken.
 *
 * Each partition is checked under its lock in shared mode, one partition
 * at a time and with no other lock of ours held, as the map's lock rules
 * ask (keycache_map.c).  Under it:
 * - the bucket array and every chunk are inside the area, checked before
 *	 they are read (pc_area_bytes_from()), so that a wild reference is
 *	 reported instead of crashing the backend;
 * - every entry is in the partition its key's hash picks (its high bits,
 *	 pc_map_partition_index()) and in the bucket it picks (its low bits);
 * - no key has two entries;
 * - the chains hold as many entries as the partition's count.
 * A violation is noted, the lock released, and only then reported.
 *
 * Then the totals, which no one lock covers:
 * - the partitions' counts add up to the map's count of entries
 *	 (pc_keymap_count());
 * - the keys' memory_used (pc_key_memory_used()) is the sum of what is
 *	 charged to it, as shmem.c charges it: each entry's chunks (its head
 *	 and tail, pc_entry_chunks()) and its message, each partition's bucket
 *	 array (the first ones by pc_area_charge(), the grown ones by
 *	 pc_alloc()), and the snapshots' last error messages, which
 *	 pc_store_message() charges there too (pc_snap_messages_footprint()).
 *
 * The totals hold only when no process is between two steps of a change:
 * a chunk allocated and not linked yet (a reader's new entry, the worker's
 * new body, a message, a grown bucket array) is in memory_used and in no
 * chain; an entry unlinked is in the map's count until its unlinker takes
 * it off, and in memory_used until it is freed.  Those steps follow one
 * another with nothing between them that sleeps, waits for I/O or holds a
 * lock for long.  So the totals are compared only after a walk during
 * which nothing changed: the same pc_area_changes() (bumped at every
 * allocation and free), memory_used and count of entries before and after
 * it.  If they do not add up then, the map is walked again until nothing
 * has changed for PC_CHECK_QUIET_MS, and only then is it reported: a
 * change half made would have been finished by then.  A map that never
 * keeps still that long within PC_CHECK_TIMEOUT_MS is an error of its own
 * (ERRCODE_OBJECT_IN_USE), not a corruption: the caller checks again once
 * the worker is idle.
 *
 * The function is for tests: it needs projcache.debug_clock = on and a
 * superuser (pc_require_debug()).
 *
 * Copyright (c) 2026, projcache developers
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/htup_details.h"
#include "funcapi.h"
#include "miscadmin.h"
#include "storage/latch.h"

#include "compat.h"
#include "keycache_map.h"
#include "snapshot.h"

PG_FUNCTION_INFO_V1(projcache_debug_check_map);

/* How long the area must keep still before totals that differ are reported. */
#define PC_CHECK_QUIET_MS		1000
/* How long to wait for a walk during which nothing changed. */
#define PC_CHECK_TIMEOUT_MS		30000
/* The pause between walks while the map changes, and while it keeps still. */
#define PC_CHECK_RETRY_MS		10
#define PC_CHECK_CONFIRM_MS		100

/* The bytes of a key shown in a report (its printable ASCII, '?' for others). */
#define PC_CHECK_KEY_SHOWN		64

/* The invariants, as the report tells them. */
typedef enum MapViolationKind
{
	MAP_OK,
	MAP_BUCKETS_OUTSIDE,		/* a partition's bucket array */
	MAP_BUCKETS_NOT_POWER,		/* its number of buckets */
	MAP_ENTRY_OUTSIDE,			/* an entry's header or key */
	MAP_KEY_TOO_LONG,
	MAP_WRONG_PARTITION,
	MAP_WRONG_BUCKET,
	MAP_DUPLICATE_KEY,
	MAP_TAIL_OUTSIDE,
	MAP_HEAD_OUTSIDE,			/* a head shorter than its body says */
	MAP_MESSAGE_OUTSIDE,
	MAP_MESSAGE_TOO_LONG,
	MAP_CHAINS_PAST_COUNT,
	MAP_CHAINS_SHORT_OF_COUNT
} MapViolationKind;

/* The first violation found, copied under the lock for its report. */
typedef struct MapViolation
{
	MapViolationKind kind;
	int			partition;
	uint32		bucket;
	uint32		nbuckets;
	uint32		count;			/* the partition's count */
	uint32		seen;			/* entries its chains held */
	uint32		hash;
	int			want_partition;
	uint32		want_bucket;
	uint32		keylen;
	unsigned long long at;		/* the chunk's dsa_pointer */
	unsigned long long other;	/* a second chunk's */
	char		key[PC_CHECK_KEY_SHOWN + 1];
} MapViolation;

/* What one walk of the whole map added up. */
typedef struct MapTotals
{
	uint64		entries;		/* in the chains */
	uint64		counted;		/* the partitions' counts */
	uint64		buckets;
	Size		entry_bytes;	/* entries' heads and tails */
	Size		message_bytes;	/* entries' messages */
	Size		bucket_bytes;	/* bucket arrays */
	Size		snapshot_message_bytes;
} MapTotals;

/* What the area and the map said before or after a walk. */
typedef struct MapStamp
{
	uint64		changes;
	Size		memory_used;
	uint64		nentries;
} MapStamp;

static void
take_stamp(MapStamp *stamp)
{
	stamp->changes = pc_area_changes();
	stamp->memory_used = pc_key_memory_used();
	stamp->nentries = pc_keymap_count();
}

static bool
stamps_equal(const MapStamp *a, const MapStamp *b)
{
	return a->changes == b->changes && a->memory_used == b->memory_used &&
		a->nentries == b->nentries;
}

static Size
charged_bytes(const MapTotals *t)
{
	return t->entry_bytes + t->message_bytes + t->bucket_bytes +
		t->snapshot_message_bytes;
}

/* Copy what a report shows of a key (no allocation: under the lock). */
static void
show_key(MapViolation *v, const PcEntry *entry)
{
	const char *key = pc_entry_key(entry);
	uint32		n = Min((uint32) entry->keylen, PC_CHECK_KEY_SHOWN);
	uint32		i;

	for (i = 0; i < n; i++)
		v->key[i] = (key[i] >= 0x20 && key[i] < 0x7F) ? key[i] : '?';
	v->key[n] = '\0';
}

/*
 * Check one entry of a locked partition, at dp in bucket b; first is the
 * bucket's first entry, for the check that the key has no other.  Adds
 * what it is charged to *t.  False, with *v filled, at a violation.
 */
static bool
check_entry(PcMapPartition *part, int index, uint32 b, dsa_pointer dp,
			PcRef first, MapTotals *t, MapViolation *v)
{
	PcEntry    *entry;
	PcKey		search;
	dsa_pointer tail;
	dsa_pointer error;
	Size		head_size;
	Size		tail_size;
	PcRef		ref;

	v->partition = index;
	v->bucket = b;
	v->nbuckets = part->nbuckets;
	v->at = (unsigned long long) dp;
	if (pc_area_bytes_from(dp) < ENTRY_HEADER + SPLIT_INFO)
	{
		v->kind = MAP_ENTRY_OUTSIDE;
		return false;
	}
	entry = pc_map_address(dp);
	v->keylen = entry->keylen;
	if (entry->keylen > PC_MAX_KEY_BYTES)
	{
		v->kind = MAP_KEY_TOO_LONG;
		return false;
	}
	if (pc_area_bytes_from(dp) < ENTRY_HEADER + SPLIT_INFO + entry->keylen)
	{
		v->kind = MAP_ENTRY_OUTSIDE;
		return false;
	}
	show_key(v, entry);

	/* Where its hash says it is. */
	search = pc_search_key(pc_entry_key(entry), entry->keylen);
	v->hash = search.hash;
	v->want_partition = pc_map_partition_index(search.hash);
	v->want_bucket = search.hash & (part->nbuckets - 1);
	if (v->want_partition != index)
	{
		v->kind = MAP_WRONG_PARTITION;
		return false;
	}
	if (v->want_bucket != b)
	{
		v->kind = MAP_WRONG_BUCKET;
		return false;
	}

	/* The key's only entry: none before it in its bucket has its key. */
	for (ref = first; pc_ref_dsa(ref) != dp;)
	{
		PcEntry    *other = pc_map_address(pc_ref_dsa(ref));

		if (other->keylen == entry->keylen &&
			memcmp(pc_entry_key(other), pc_entry_key(entry),
				   entry->keylen) == 0)
		{
			v->kind = MAP_DUPLICATE_KEY;
			v->other = (unsigned long long) pc_ref_dsa(ref);
			return false;
		}
		ref = other->next;
	}

	/* Its chunks and its message, as they were charged. */
	tail = pc_entry_tail_ref(entry);
	if (DsaPointerIsValid(tail) && pc_area_bytes_from(tail) == 0)
	{
		v->kind = MAP_TAIL_OUTSIDE;
		v->other = (unsigned long long) tail;
		return false;
	}
	pc_entry_chunks(entry, &head_size, &tail, &tail_size);
	if (pc_area_bytes_from(dp) < head_size)
	{
		v->kind = MAP_HEAD_OUTSIDE;
		v->other = (unsigned long long) head_size;
		return false;
	}
	if (tail_size > 0 && pc_area_bytes_from(tail) < tail_size)
	{
		v->kind = MAP_TAIL_OUTSIDE;
		v->other = (unsigned long long) tail;
		return false;
	}
	t->entry_bytes += pc_chunks_footprint(head_size, tail_size);

	error = pc_entry_error_ref(entry);
	if (DsaPointerIsValid(error))
	{
		Size		room = pc_area_bytes_from(error);
		Size		len;

		v->other = (unsigned long long) error;
		if (room == 0)
		{
			v->kind = MAP_MESSAGE_OUTSIDE;
			return false;
		}
		len = strnlen(pc_map_address(error),
					  Min(room, (Size) PC_MAX_MESSAGE_BYTES + 1));
		if (len > PC_MAX_MESSAGE_BYTES || len == room)
		{
			v->kind = MAP_MESSAGE_TOO_LONG;
			return false;
		}
		t->message_bytes += pc_dsa_footprint(len + 1);
	}
	return true;
}

/*
 * Check partition 'index' under its shared lock, adding to *t; false, with
 * *v filled, at the first violation.  Nothing here raises an ERROR.
 */
static bool
check_partition(PcMapPartition *part, int index, MapTotals *t,
				MapViolation *v)
{
	Size		array_size = (Size) part->nbuckets * sizeof(PcRef);
	PcRef	   *buckets;
	uint32		seen = 0;
	uint32		b;

	v->partition = index;
	v->nbuckets = part->nbuckets;
	v->count = part->count;
	v->at = (unsigned long long) part->buckets;
	if (part->nbuckets == 0 || (part->nbuckets & (part->nbuckets - 1)) != 0)
	{
		v->kind = MAP_BUCKETS_NOT_POWER;
		return false;
	}
	if (pc_area_bytes_from(part->buckets) < array_size)
	{
		v->kind = MAP_BUCKETS_OUTSIDE;
		return false;
	}
	buckets = pc_map_address(part->buckets);
	for (b = 0; b < part->nbuckets; b++)
	{
		PcRef		ref = buckets[b];

		while (ref != InvalidPcRef)
		{
			dsa_pointer dp = pc_ref_dsa(ref);

			/* More than it counts: a chain may loop, so stop here. */
			if (++seen > part->count)
			{
				v->kind = MAP_CHAINS_PAST_COUNT;
				v->bucket = b;
				v->at = (unsigned long long) dp;
				return false;
			}
			if (!check_entry(part, index, b, dp, buckets[b], t, v))
				return false;
			ref = ((PcEntry *) pc_map_address(dp))->next;
		}
	}
	if (seen != part->count)
	{
		v->kind = MAP_CHAINS_SHORT_OF_COUNT;
		v->seen = seen;
		return false;
	}
	t->entries += seen;
	t->counted += part->count;
	t->buckets += part->nbuckets;
	t->bucket_bytes += pc_dsa_footprint(array_size);
	return true;
}

pg_noreturn static void
report_violation(const MapViolation *v)
{
	switch (v->kind)
	{
		case MAP_BUCKETS_NOT_POWER:
			ereport(ERROR,
					(errcode(ERRCODE_DATA_CORRUPTED),
					 errmsg("projcache: key map partition %d has %u buckets, which is not a power of two",
							v->partition, v->nbuckets),
					 errdetail("A key's hash picks its bucket by its low bits, so a partition's buckets must be a power of two.")));
			break;
		case MAP_BUCKETS_OUTSIDE:
			ereport(ERROR,
					(errcode(ERRCODE_DATA_CORRUPTED),
					 errmsg("projcache: the bucket array of key map partition %d is outside the DSA area",
							v->partition),
					 errdetail("Its %u buckets are at dsa_pointer %llu.",
							   v->nbuckets, v->at)));
			break;
		case MAP_ENTRY_OUTSIDE:
			ereport(ERROR,
					(errcode(ERRCODE_DATA_CORRUPTED),
					 errmsg("projcache: an entry of key map partition %d is outside the DSA area",
							v->partition),
					 errdetail("Bucket %u of the partition refers to an entry at dsa_pointer %llu.",
							   v->bucket, v->at)));
			break;
		case MAP_KEY_TOO_LONG:
			ereport(ERROR,
					(errcode(ERRCODE_DATA_CORRUPTED),
					 errmsg("projcache: an entry of key map partition %d has a key of %u bytes",
							v->partition, v->keylen),
					 errdetail("Keys are at most %d bytes.  The entry is in bucket %u, at dsa_pointer %llu.",
							   PC_MAX_KEY_BYTES, v->bucket, v->at)));
			break;
		case MAP_WRONG_PARTITION:
			ereport(ERROR,
					(errcode(ERRCODE_DATA_CORRUPTED),
					 errmsg("projcache: key \"%s\" is in the wrong partition of the key map",
							v->key),
					 errdetail("It is in bucket %u of partition %d; its hash %08X picks partition %d.",
							   v->bucket, v->partition, v->hash,
							   v->want_partition)));
			break;
		case MAP_WRONG_BUCKET:
			ereport(ERROR,
					(errcode(ERRCODE_DATA_CORRUPTED),
					 errmsg("projcache: key \"%s\" is in the wrong bucket of the key map",
							v->key),
					 errdetail("It is in bucket %u of the %u of partition %d; its hash %08X picks bucket %u.",
							   v->bucket, v->nbuckets, v->partition, v->hash,
							   v->want_bucket)));
			break;
		case MAP_DUPLICATE_KEY:
			ereport(ERROR,
					(errcode(ERRCODE_DATA_CORRUPTED),
					 errmsg("projcache: key \"%s\" has two entries in the key map",
							v->key),
					 errdetail("Bucket %u of partition %d holds one at dsa_pointer %llu and one at %llu.",
							   v->bucket, v->partition, v->other, v->at)));
			break;
		case MAP_HEAD_OUTSIDE:
			ereport(ERROR,
					(errcode(ERRCODE_DATA_CORRUPTED),
					 errmsg("projcache: the entry of key \"%s\" runs past the end of the DSA area",
							v->key),
					 errdetail("Its head chunk at dsa_pointer %llu is %llu bytes long, by its body's layout.",
							   v->at, v->other)));
			break;
		case MAP_TAIL_OUTSIDE:
			ereport(ERROR,
					(errcode(ERRCODE_DATA_CORRUPTED),
					 errmsg("projcache: the tail chunk of key \"%s\" is outside the DSA area",
							v->key),
					 errdetail("The entry at dsa_pointer %llu refers to a tail at dsa_pointer %llu.",
							   v->at, v->other)));
			break;
		case MAP_MESSAGE_OUTSIDE:
			ereport(ERROR,
					(errcode(ERRCODE_DATA_CORRUPTED),
					 errmsg("projcache: the message of key \"%s\" is outside the DSA area",
							v->key),
					 errdetail("The entry at dsa_pointer %llu refers to a message at dsa_pointer %llu.",
							   v->at, v->other)));
			break;
		case MAP_MESSAGE_TOO_LONG:
			ereport(ERROR,
					(errcode(ERRCODE_DATA_CORRUPTED),
					 errmsg("projcache: the message of key \"%s\" is longer than %d bytes",
							v->key, PC_MAX_MESSAGE_BYTES),
					 errdetail("The entry at dsa_pointer %llu refers to a message at dsa_pointer %llu that is not terminated within that length.",
							   v->at, v->other)));
			break;
		case MAP_CHAINS_PAST_COUNT:
			ereport(ERROR,
					(errcode(ERRCODE_DATA_CORRUPTED),
					 errmsg("projcache: the chains of key map partition %d hold more entries than its count of %u",
							v->partition, v->count),
					 errdetail("The chain of bucket %u goes on to an entry at dsa_pointer %llu: an entry was not counted, or a chain loops.",
							   v->bucket, v->at)));
			break;
		case MAP_CHAINS_SHORT_OF_COUNT:
			ereport(ERROR,
					(errcode(ERRCODE_DATA_CORRUPTED),
					 errmsg("projcache: key map partition %d counts %u entries, but its chains hold %u",
							v->partition, v->count, v->seen),
					 errdetail("The partition has %u buckets.",
							   v->nbuckets)));
			break;
		case MAP_OK:
			break;
	}
	elog(ERROR, "projcache: unknown key map violation %d", (int) v->kind);
}

/*
 * Walk the whole map, a partition at a time, then the snapshots' messages;
 * reports the first violation, once no lock is held.
 */
static void
walk_map(MapTotals *t)
{
	int			n = pc_map_npartitions();
	int			i;

	memset(t, 0, sizeof(*t));
	for (i = 0; i < n; i++)
	{
		MapViolation v;
		PcMapPartition *part;
		bool		ok;

		memset(&v, 0, sizeof(v));
		part = pc_map_partition_lock(i);
		ok = check_partition(part, i, t, &v);
		pc_map_partition_unlock(part);
		if (!ok)
			report_violation(&v);
		CHECK_FOR_INTERRUPTS();
	}
	t->snapshot_message_bytes = pc_snap_messages_footprint();
}

static bool
totals_add_up(const MapTotals *t, const MapStamp *stamp)
{
	return t->counted == stamp->nentries &&
		charged_bytes(t) == stamp->memory_used;
}

pg_noreturn static void
report_totals(const MapTotals *t, const MapStamp *stamp)
{
	if (t->counted != stamp->nentries)
		ereport(ERROR,
				(errcode(ERRCODE_DATA_CORRUPTED),
				 errmsg("projcache: the key map counts %llu entries, but its partitions hold %llu",
						(unsigned long long) stamp->nentries,
						(unsigned long long) t->counted),
				 errdetail("Nothing was allocated or freed in the DSA area for %d ms, and the count stayed the same.",
						   PC_CHECK_QUIET_MS)));
	ereport(ERROR,
			(errcode(ERRCODE_DATA_CORRUPTED),
			 errmsg("projcache: the keys' memory_used is %zu bytes, but what is charged to it adds up to %zu",
					stamp->memory_used, charged_bytes(t)),
			 errdetail("The %llu entries' chunks take %zu bytes, their messages %zu, the %llu buckets' arrays %zu and the snapshots' messages %zu; nothing was allocated or freed in the DSA area for %d ms.",
					   (unsigned long long) t->entries, t->entry_bytes,
					   t->message_bytes, (unsigned long long) t->buckets,
					   t->bucket_bytes, t->snapshot_message_bytes,
					   PC_CHECK_QUIET_MS)));
}

static void
pause_ms(long ms)
{
	(void) WaitLatch(MyLatch, WL_LATCH_SET | WL_TIMEOUT | WL_EXIT_ON_PM_DEATH,
					 ms, pc_wait_event(PC_WAIT_MAP_CHECK));
	ResetLatch(MyLatch);
	CHECK_FOR_INTERRUPTS();
}

/*
 * projcache.debug_check_map(): check the key map and return what it holds
 * (partitions, entries, buckets, memory_used), once the totals add up in
 * a walk during which nothing changed.
 */
Datum
projcache_debug_check_map(PG_FUNCTION_ARGS)
{
	TupleDesc	tupdesc;
	Datum		values[4];
	bool		nulls[4] = {false, false, false, false};
	MapTotals	t;
	MapStamp	before;
	MapStamp	after;
	MapStamp	quiet = {0, 0, 0};
	int64		start;
	int64		quiet_since = -1;
	int			walks = 0;

	pc_require_loaded();
	pc_require_debug("check the key map");
	if (get_call_result_type(fcinfo, NULL, &tupdesc) != TYPEFUNC_COMPOSITE)
		elog(ERROR, "return type must be a row type");

	start = pc_real_now_ms();
	for (;;)
	{
		int64		now;

		take_stamp(&before);
		walk_map(&t);
		take_stamp(&after);
		walks++;
		now = pc_real_now_ms();
		if (stamps_equal(&before, &after))
		{
			if (totals_add_up(&t, &after))
				break;
			/* They differ: report it once nothing has changed for a while. */
			if (quiet_since < 0 || !stamps_equal(&quiet, &after))
			{
				quiet = after;
				quiet_since = now;
			}
			else if (now - quiet_since >= PC_CHECK_QUIET_MS)
				report_totals(&t, &after);
		}
		else
			quiet_since = -1;
		if (now - start >= PC_CHECK_TIMEOUT_MS)
			ereport(ERROR,
					(errcode(ERRCODE_OBJECT_IN_USE),
					 errmsg("projcache: could not check the key map's totals"),
					 errdetail("The DSA area or the key map changed during each of %d walks of the map in %d ms, or did not keep still for %d ms.",
							   walks, PC_CHECK_TIMEOUT_MS, PC_CHECK_QUIET_MS),
					 errhint("Check the map again once the worker is idle.")));
		pause_ms(quiet_since >= 0 ? PC_CHECK_CONFIRM_MS : PC_CHECK_RETRY_MS);
	}

	values[0] = Int32GetDatum(pc_map_npartitions());
	values[1] = Int64GetDatum((int64) t.entries);
	values[2] = Int64GetDatum((int64) t.buckets);
	values[3] = Int64GetDatum((int64) after.memory_used);
	PG_RETURN_DATUM(HeapTupleGetDatum(heap_form_tuple(tupdesc, values, nulls)));
}
