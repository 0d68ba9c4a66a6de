/*-------------------------------------------------------------------------
 *
 * keycache_ring.c
 *	  Bounded ring of keys that readers want the worker to look at.
 *
 * A reader that needs something from the worker (fetch, invalidate, evict)
 * first sets a request bit in the key's PcEntry, then pushes the key here
 * and sets the worker's latch.  The ring is only a fast way to find those
 * entries: when it is full the reader sets ring_overflow instead, and the
 * worker scans the key map for request bits.  So no request is lost.
 *
 * A reader that found no room to create a key has no entry to set a bit
 * in: its record says so (PC_RING_REFUSED in the length word), and the
 * worker creates the key once it has made room.  Such records go to a
 * second ring of their own, so that a role reading new keys past its
 * bound, in a loop, cannot fill the first and send every other reader's
 * request through the worker's scan of the whole map.  When the second is
 * full, such a record is lost; the key's next read asks again.
 *
 * Records are a uint32 length, the Oid of the role that made the request
 * (a new key's fetch waits for that role's turn, see keycache_policy.h),
 * the cache the reader resolved the key to (the worker creates a refused
 * key's entry for it), and the key's bytes, padded to 4 bytes, written
 * circularly; pc_ring_record() reads one back.
 *
 * The rings are a part of shared memory of their own ("projcache request
 * ring"): PcRingShared, then the two rings.  Its lock (tranche
 * "projcache_ring", taken alone) protects the positions and data of both
 * rings; overflow is an atomic.
 *
 * Copyright (c) 2026, projcache developers
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "miscadmin.h"
#include "storage/shmem.h"

#include "counters.h"
#include "keycache.h"

typedef struct PcRequestRing
{
	uint64		write_pos;		/* bytes ever written */
	uint64		read_pos;		/* bytes ever consumed */
	uint32		capacity;
	char		data[FLEXIBLE_ARRAY_MEMBER];
} PcRequestRing;

typedef struct PcRingShared
{
	LWLock	   *lock;			/* both rings' positions and data */
	pg_atomic_uint32 overflow;	/* a request did not fit in the ring */
	/* the two rings follow, at ring_base() */
} PcRingShared;

static PcRingShared *ring_shared = NULL;

#define PC_RING_BYTES		(256 * 1024)
/* length word, role, cache */
#define PC_RING_HEADER		(sizeof(uint32) + sizeof(Oid) + sizeof(PcCacheId))
/* In a record's length word: the reader found no room to create the key. */
#define PC_RING_REFUSED		0x80000000U
#define PC_RING_RECORD(len) (PC_RING_HEADER + TYPEALIGN(4, (len)))

StaticAssertDecl(sizeof(Oid) == 4 && sizeof(PcCacheId) == 4,
				 "ring records stay 4-byte aligned");

/* The two rings lie one after the other at ring_base(). */
#define PC_RING_STRIDE	MAXALIGN(offsetof(PcRequestRing, data) + PC_RING_BYTES)
#define PC_RING_TRANCHE "projcache_ring"

/* Both rings' size; a buffer this large takes all that pc_ring_drain has. */
Size
pc_ring_size(void)
{
	return 2 * PC_RING_STRIDE;
}

static char *
ring_base(void)
{
	return (char *) ring_shared + MAXALIGN(sizeof(PcRingShared));
}

/* The ring of refused reads' records, or the one of the other requests. */
static PcRequestRing *
ring_of(bool refused)
{
	return (PcRequestRing *) (ring_base() + (refused ? PC_RING_STRIDE : 0));
}

void
pc_ring_shmem_request(void)
{
	RequestAddinShmemSpace(add_size(MAXALIGN(sizeof(PcRingShared)),
									pc_ring_size()));
	pc_locks_request(PC_RING_TRANCHE, 1);
}

void
pc_ring_shmem_startup(void)
{
	bool		found;
	LWLockPadded *lock;
	int			i;

	ring_shared = ShmemInitStruct("projcache request ring",
								  add_size(MAXALIGN(sizeof(PcRingShared)),
										   pc_ring_size()),
								  &found);
	lock = pc_locks_get(PC_RING_TRANCHE, 1, PC_LOCK_ALONE);
	if (found)
		return;
	ring_shared->lock = &lock->lock;
	pg_atomic_init_u32(&ring_shared->overflow, 0);
	for (i = 0; i < 2; i++)
	{
		PcRequestRing *ring = ring_of(i == 1);

		ring->write_pos = 0;
		ring->read_pos = 0;
		ring->capacity = PC_RING_BYTES;
	}
}

/*
 * The worker scans the key map for request bits after a request did not
 * fit (pc_ring_note_overflow()); whether one did since it last asked.
 */
bool
pc_ring_take_overflow(void)
{
	return pg_atomic_exchange_u32(&ring_shared->overflow, 0) != 0;
}

void
pc_ring_note_overflow(void)
{
	pg_atomic_write_u32(&ring_shared->overflow, 1);
}

/*
 * Copy n bytes into the ring at logical position pos, wrapping around.
 * Caller holds the ring lock exclusively.
 */
static void
ring_write(PcRequestRing *ring, uint64 pos, const void *src, Size n)
{
	Size		off = pos % ring->capacity;
	Size		first = Min(n, ring->capacity - off);

	Assert(LWLockHeldByMeInMode(ring_shared->lock, LW_EXCLUSIVE));
	memcpy(ring->data + off, src, first);
	if (first < n)
		memcpy(ring->data, (const char *) src + first, n - first);
}

/* Copy n bytes out of the ring; caller holds ring_lock exclusively. */
static void
ring_read(PcRequestRing *ring, uint64 pos, void *dst, Size n)
{
	Size		off = pos % ring->capacity;
	Size		first = Min(n, ring->capacity - off);

	Assert(LWLockHeldByMeInMode(ring_shared->lock, LW_EXCLUSIVE));
	memcpy(dst, ring->data + off, first);
	if (first < n)
		memcpy((char *) dst + first, ring->data, n - first);
}

/*
 * Append a key of cache asked for by role (refused: that found no room to
 * create it); false if the ring has no room for it.
 */
bool
pc_ring_push(const char *key, uint32 len, Oid role, PcCacheId cache,
			 bool refused)
{
	PcRequestRing *ring = ring_of(refused);
	Size		need = PC_RING_RECORD(len);
	uint32		word = refused ? len | PC_RING_REFUSED : len;
	bool		ok = false;

	Assert(len > 0 && len <= PC_MAX_KEY_BYTES);
	pc_lock_alone(ring_shared->lock, LW_EXCLUSIVE);
	if (ring->capacity - (ring->write_pos - ring->read_pos) >= need)
	{
		ring_write(ring, ring->write_pos, &word, sizeof(uint32));
		ring_write(ring, ring->write_pos + sizeof(uint32), &role,
				   sizeof(Oid));
		ring_write(ring, ring->write_pos + sizeof(uint32) + sizeof(Oid),
				   &cache, sizeof(PcCacheId));
		ring_write(ring, ring->write_pos + PC_RING_HEADER, key, len);
		ring->write_pos += need;
		ok = true;
	}
	LWLockRelease(ring_shared->lock);
	return ok;
}

/*
 * Move whole records of one ring, as many as fit, into buf (length word,
 * role, cache, bytes, padded as in the ring).  Returns the bytes copied.
 */
static Size
drain_ring(PcRequestRing *ring, char *buf, Size bufsize)
{
	Size		copied = 0;

	Assert(LWLockHeldByMeInMode(ring_shared->lock, LW_EXCLUSIVE));
	while (ring->read_pos < ring->write_pos)
	{
		uint32		word;
		uint32		len;
		Size		rec;

		ring_read(ring, ring->read_pos, &word, sizeof(uint32));
		len = word & ~PC_RING_REFUSED;
		Assert(len > 0 && len <= PC_MAX_KEY_BYTES);
		rec = PC_RING_RECORD(len);
		if (copied + rec > bufsize)
			break;
		memcpy(buf + copied, &word, sizeof(uint32));
		ring_read(ring, ring->read_pos + sizeof(uint32),
				  buf + copied + sizeof(uint32),
				  PC_RING_HEADER - sizeof(uint32) + len);
		copied += rec;
		ring->read_pos += rec;
	}
	return copied;
}

/*
 * Worker: move the records of both rings, as many as fit, into buf, the
 * other requests first.  Returns the number of bytes copied.  A buffer of
 * pc_ring_size() always takes everything.
 */
Size
pc_ring_drain(char *buf, Size bufsize)
{
	Size		copied;

	pc_lock_alone(ring_shared->lock, LW_EXCLUSIVE);
	copied = drain_ring(ring_of(false), buf, bufsize);
	copied += drain_ring(ring_of(true), buf + copied, bufsize - copied);
	LWLockRelease(ring_shared->lock);
	return copied;
}

/*
 * The record at offset off of what pc_ring_drain() copied into buf, in
 * *rec (its key points into buf); returns the offset of the next one.
 */
Size
pc_ring_record(const char *buf, Size off, PcRingRecord *rec)
{
	uint32		word;

	memcpy(&word, buf + off, sizeof(uint32));
	memcpy(&rec->role, buf + off + sizeof(uint32), sizeof(Oid));
	memcpy(&rec->cache, buf + off + sizeof(uint32) + sizeof(Oid),
		   sizeof(PcCacheId));
	rec->len = word & ~PC_RING_REFUSED;
	rec->refused = (word & PC_RING_REFUSED) != 0;
	rec->key = buf + off + PC_RING_HEADER;
	return off + PC_RING_RECORD(rec->len);
}

/* ----------------------------------------------------------------
 * Requests to the worker
 * ----------------------------------------------------------------
 */

/*
 * Tell the worker that the key has a request, and wake it.  The request
 * names the role that made it (the current role outside SECURITY DEFINER
 * functions): a new key's fetch waits for that role's turn.
 */
void
pc_request_send(const char *key, uint32 len)
{
	/* (its entry says which cache it is of) */
	if (!pc_ring_push(key, len, GetOuterUserId(), PC_CACHE_ID_DEFAULT, false))
	{
		/* Ring full: the worker will scan the map for request bits. */
		pc_ring_note_overflow();
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
pc_request_send_refused(const char *key, uint32 len, PcCacheId cache)
{
	/* Lost when its share of the ring is full: no scan finds it. */
	if (pc_ring_push(key, len, GetOuterUserId(), cache, true))
	{
		pc_count(PC_CTR_FETCH_REQUESTS, 1);
		pc_wake_worker();
	}
}
