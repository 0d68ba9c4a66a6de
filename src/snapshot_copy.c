/*-------------------------------------------------------------------------
 *
 * snapshot_copy.c
 *	  This backend's copies of the snapshots' rows.
 *
 * A reader copies a snapshot's rows out of its shared slot under the
 * slot's lock and serves them from the copy holding no lock.  The copies
 * are kept between reads, so that reading an unchanged snapshot again
 * copies nothing, and a scan pins the copy it reads so that nothing
 * refills or frees it under the scan.
 *
 * Copyright (c) 2026, projcache developers
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/htup_details.h"
#include "access/xact.h"
#include "utils/memutils.h"

#include "snapshot.h"
#include "snapshot_slot.h"

/*
 * This backend's copies of the snapshots it read last, one per snapshot,
 * PC_LOCAL_COPIES at most.  They are kept between reads: reading an
 * unchanged snapshot again copies nothing, whether the backend reads
 * several in turn or together (a join of two), and a changed one is
 * copied into the buffer it had.  They cost the backend up to
 * PC_LOCAL_COPY_KEEP_BYTES in all: after a read, the least recently used
 * ones go back until the rest fit (a copy that alone exceeds it goes).
 */
typedef struct LocalCopy
{
	int			index;			/* slot, or -1 */
	uint64		generation;
	uint64		version;
	char	   *buf;			/* in TopMemoryContext, PC_COPY_LEAD bytes in */
	Size		capacity;
	Size		size;
	int64		rows;
	int			pins;			/* scans reading buf (pc_snap_pin_copy) */
	uint64		last_used;		/* of local_copy_clock */
} LocalCopy;

#define PC_LOCAL_COPIES		4

static LocalCopy local_copies[PC_LOCAL_COPIES] = {
	{.index = -1}, {.index = -1}, {.index = -1}, {.index = -1}
};
static uint64 local_copy_clock = 0;

/*
 * Zeroed bytes before every copy of the rows: a scan gives each row to the
 * executor as a heap tuple whose header starts MINIMAL_TUPLE_OFFSET bytes
 * before the stored MinimalTuple (snapshot_fdw.c), and copying such a tuple
 * reads those bytes.  For the first row they are these, inside the copy.
 */
#define PC_COPY_LEAD	MAXALIGN(MINIMAL_TUPLE_OFFSET)
static bool pin_callback_registered = false;

/* What this backend's copies may keep between reads, in all. */
#define PC_LOCAL_COPY_KEEP_BYTES	((Size) 8 * 1024 * 1024)

/* A buffer for size bytes of rows, after the lead; NULL if out of memory. */
static char *
alloc_copy(MemoryContext cxt, Size size)
{
	char	   *buf = MemoryContextAllocExtended(cxt, PC_COPY_LEAD + size,
												 MCXT_ALLOC_HUGE |
												 MCXT_ALLOC_NO_OOM);

	if (buf == NULL)
		return NULL;
	memset(buf, 0, PC_COPY_LEAD);
	return buf + PC_COPY_LEAD;
}

static void
free_copy(LocalCopy *lc)
{
	if (lc->buf != NULL)
		pfree(lc->buf - PC_COPY_LEAD);
	lc->buf = NULL;
	lc->capacity = 0;
	lc->index = -1;
}

/*
 * The copy to hold the snapshot in slot (index, generation): the one that
 * holds it already, else an empty one, else the least recently used one
 * that no scan pins.  NULL if every candidate is pinned.
 */
static LocalCopy *
choose_copy(int index, uint64 generation)
{
	LocalCopy  *victim = NULL;
	int			i;

	for (i = 0; i < PC_LOCAL_COPIES; i++)
	{
		LocalCopy  *lc = &local_copies[i];

		if (lc->index == index && lc->generation == generation)
			return lc;
	}
	for (i = 0; i < PC_LOCAL_COPIES; i++)
	{
		LocalCopy  *lc = &local_copies[i];

		if (lc->pins > 0)
			continue;
		if (lc->index == -1)
			return lc;
		if (victim == NULL || lc->last_used < victim->last_used)
			victim = lc;
	}
	return victim;
}

/*
 * Copy the rows out, if the slot holds a snapshot (and, with only_fresh,
 * one fetched within ttl_ms) that may be served: rows restored from the
 * dump are not, until a load as the owner was tried (pc_snap_awaits_load).
 * The copy is made under the slot's shared
 * lock with an allocation that cannot raise an ERROR; the caller returns
 * rows from it holding no lock.  *blob stays valid until the next call,
 * or, if the caller pins it (pc_snap_pin_copy), until it is unpinned: a
 * pinned copy is never refilled nor freed, and a read that would need it
 * refilled (the snapshot changed, or every copy is pinned) gets a copy of
 * its own in CurrentMemoryContext.
 */
bool
pc_snap_copy(PcSnapRef ref, int64 now, int64 ttl_ms, bool only_fresh,
			 char **blob, Size *size, int64 *rows)
{
	PcSnapSlot *s = &pc_snap_slots()[ref.index];
	bool		found = false;
	bool		oom = false;

	pc_lock_inner(pc_snap_slot_lock(ref.index), LW_SHARED);
	if (s->generation == ref.generation && DsaPointerIsValid(s->data) &&
		!s->restored &&
		(!only_fresh || (!s->marked_stale && now - s->fetched_at_ms < ttl_ms)))
	{
		LocalCopy  *lc = choose_copy(ref.index, ref.generation);
		bool		current = lc != NULL && lc->index == ref.index &&
			lc->generation == ref.generation && lc->version == s->version;

		if (!current && (lc == NULL || lc->pins > 0))
		{
			/* A scan still reads that copy: this one is separate. */
			char	   *own = alloc_copy(CurrentMemoryContext, s->data_bytes);

			if (own == NULL)
				oom = true;
			else
			{
				memcpy(own, dsa_get_address(pc_area(), s->data), s->data_bytes);
				*blob = own;
				*size = s->data_bytes;
				*rows = s->rows;
				found = true;
			}
		}
		else if (!current)
		{
			if (lc->capacity < s->data_bytes)
			{
				char	   *grown = alloc_copy(TopMemoryContext, s->data_bytes);

				if (grown == NULL)
					oom = true;
				else
				{
					free_copy(lc);
					lc->buf = grown;
					lc->capacity = s->data_bytes;
				}
			}
			if (!oom)
			{
				memcpy(lc->buf, dsa_get_address(pc_area(), s->data),
					   s->data_bytes);
				lc->index = ref.index;
				lc->generation = ref.generation;
				lc->version = s->version;
				lc->size = s->data_bytes;
				lc->rows = s->rows;
			}
			else
				lc->index = -1; /* it may hold part of a copy */
		}
		if (!oom && !found)
		{
			lc->last_used = ++local_copy_clock;
			*blob = lc->buf;
			*size = lc->size;
			*rows = lc->rows;
			found = true;
		}
	}
	LWLockRelease(pc_snap_slot_lock(ref.index));

	if (oom)
		pc_report_oom("a snapshot");
	return found;
}

/* Pins end with the transaction: a scan that failed never unpinned. */
static void
unpin_at_xact_end(XactEvent event, void *arg)
{
	int			i;

	if (event == XACT_EVENT_ABORT || event == XACT_EVENT_PARALLEL_ABORT ||
		event == XACT_EVENT_COMMIT || event == XACT_EVENT_PARALLEL_COMMIT ||
		event == XACT_EVENT_PREPARE)
		for (i = 0; i < PC_LOCAL_COPIES; i++)
			local_copies[i].pins = 0;
}

/* The backend's copy whose rows blob is, or NULL. */
static LocalCopy *
copy_of(const char *blob)
{
	int			i;

	if (blob == NULL)
		return NULL;
	for (i = 0; i < PC_LOCAL_COPIES; i++)
		if (local_copies[i].buf == blob)
			return &local_copies[i];
	return NULL;
}

/*
 * A scan that returns rows straight from the blob pc_snap_copy() gave it
 * pins it for as long as it reads; blobs other than the backend's copies
 * (see pc_snap_copy) need no pin, and pinning them does nothing.
 */
void
pc_snap_pin_copy(const char *blob)
{
	LocalCopy  *lc = copy_of(blob);

	if (lc == NULL)
		return;
	if (!pin_callback_registered)
	{
		RegisterXactCallback(unpin_at_xact_end, NULL);
		pin_callback_registered = true;
	}
	lc->pins++;
}

void
pc_snap_unpin_copy(const char *blob)
{
	LocalCopy  *lc = copy_of(blob);

	if (lc != NULL && lc->pins > 0)
		lc->pins--;
}

/*
 * Give back the copies beyond what the backend keeps: least recently used
 * first, pinned ones never.
 */
void
pc_snap_trim_local_copy(void)
{
	Size		kept = 0;
	int			i;

	for (i = 0; i < PC_LOCAL_COPIES; i++)
		kept += local_copies[i].capacity;
	while (kept > PC_LOCAL_COPY_KEEP_BYTES)
	{
		LocalCopy  *oldest = NULL;

		for (i = 0; i < PC_LOCAL_COPIES; i++)
		{
			LocalCopy  *lc = &local_copies[i];

			if (lc->buf != NULL && lc->pins == 0 &&
				(oldest == NULL || lc->last_used < oldest->last_used))
				oldest = lc;
		}
		if (oldest == NULL)
			break;
		kept -= oldest->capacity;
		free_copy(oldest);
	}
}
