/*-------------------------------------------------------------------------
 *
 * keycache_replay.c
 *	  On a standby, the worker's side of invalidations replayed from WAL:
 *	  mark the keys stale, wait for the commit, refetch.
 *
 * Redo appends each invalidated key, with its transaction's id, to the
 * shared list (wal.h, wal_records.c).  On each pass of its loop the worker:
 *
 * 1. takes the new items: marks each key it has cached stale and
 *	  awaiting_commit (readers then serve the old value as stale and ask for
 *	  no fetch), and counts the key in a private table of waiting keys;
 * 2. asks what became of the transactions of the items it marked:
 *	  TransactionIdIsInProgress() is false once the commit or abort record
 *	  has been replayed (a standby tracks the transactions it saw in WAL),
 *	  and then TransactionIdDidCommit() says which.  Ended items leave the
 *	  list; a key none of whose items is left stops waiting, and if one of
 *	  them committed it is refetched now, with a snapshot that sees the
 *	  commit.  A key whose transaction aborted stays stale and is refetched
 *	  on its next read, as on the primary.
 *
 * PostgreSQL 15 has no hook on commit redo, so this is polled: every 5 ms
 * while items wait, backing off to once a second while nothing ends.
 *
 * A fetch answered while its key waits (a refresh, or a first read of a key
 * not cached when its record was replayed) is stored stale and waiting: it
 * may have read the rows from before the commit.
 *
 * When the list is full, redo drops the record and notes its transaction
 * (as it does for a record it cannot read).  Then every cached key counts
 * as waiting until each transaction whose record was dropped has ended;
 * after that, the keys stay stale and each is refetched on its next read.
 * Only those transactions are waited for: another one left open on the
 * primary, however old, holds nothing back.  (If more were dropped than
 * the shared list of them holds, the rest are waited for as a horizon:
 * until every transaction up to the newest of them has ended.)
 *
 * Copyright (c) 2026, projcache developers
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/transam.h"
#include "access/xact.h"
#include "storage/lwlock.h"
#include "storage/procarray.h"
#include "common/hashfn.h"
#include "utils/hsearch.h"
#include "utils/memutils.h"
#include "utils/snapmgr.h"

#include "keycache.h"
#include "wal.h"

#define PC_REPLAY_POLL_MIN_MS	5
#define PC_REPLAY_POLL_MAX_MS	1000

/*
 * A key with items in the list, and whether one of them committed.  The
 * hash key is a pointer to a NUL-terminated copy (keys are text), so that
 * an entry costs what its key does.
 */
typedef struct WaitingKey
{
	char	   *key;
	int			items;
	bool		committed;
} WaitingKey;

static HTAB *waiting = NULL;
static bool overflow_active = false;	/* every cached key waits */
static int	idle_polls = 0;

typedef enum XidFate
{
	XID_RUNNING,
	XID_COMMITTED,
	XID_ABORTED
} XidFate;

typedef struct XidFateEntry
{
	TransactionId xid;
	XidFate		fate;
} XidFateEntry;

static void set_awaiting_all(bool awaiting);

static uint32
waiting_key_hash(const void *key, Size keysize)
{
	const char *s = *(char *const *) key;

	return hash_bytes((const unsigned char *) s, strlen(s));
}

static int
waiting_key_match(const void *key1, const void *key2, Size keysize)
{
	return strcmp(*(char *const *) key1, *(char *const *) key2);
}

/*
 * Start over: the items a previous worker marked are marked again (marking
 * is idempotent), so that this worker's table of waiting keys is complete.
 */
void
pc_replay_init(void)
{
	HASHCTL		ctl;
	PcWalPending *pending = pc_wal_pending();

	ctl.keysize = sizeof(char *);
	ctl.entrysize = sizeof(WaitingKey);
	ctl.hash = waiting_key_hash;
	ctl.match = waiting_key_match;
	ctl.hcxt = TopMemoryContext;
	waiting = hash_create("projcache keys waiting for a commit", 256, &ctl,
						  HASH_ELEM | HASH_FUNCTION | HASH_COMPARE |
						  HASH_CONTEXT);

	/*
	 * A previous worker may have died between dropping items and clearing
	 * their keys' flags: clear every flag, then mark again from the list.
	 */
	set_awaiting_all(false);
	pc_lock_alone(pc_wal_pending_lock(), LW_EXCLUSIVE);
	pending->marked = 0;
	pending->overflow_marked = false;
	LWLockRelease(pc_wal_pending_lock());
}

/*
 * Find, add or remove a key of the table.  An added entry gets a copy of
 * the key of its own; a removed one gives it back.
 */
static WaitingKey *
waiting_lookup(const char *key, uint32 len, HASHACTION action)
{
	char		buf[PC_MAX_KEY_BYTES + 1];
	char	   *search = buf;
	WaitingKey *w;
	bool		found;

	Assert(len <= PC_MAX_KEY_BYTES);
	memcpy(buf, key, len);
	buf[len] = '\0';
	if (action == HASH_REMOVE)
	{
		w = (WaitingKey *) hash_search(waiting, &search, HASH_FIND, NULL);
		if (w != NULL)
		{
			char	   *copy = w->key;

			(void) hash_search(waiting, &search, HASH_REMOVE, NULL);
			pfree(copy);
		}
		return NULL;
	}
	w = (WaitingKey *) hash_search(waiting, &search, action, &found);
	if (action == HASH_ENTER && !found)
	{
		w->key = MemoryContextStrdup(TopMemoryContext, buf);
		w->items = 0;
		w->committed = false;
	}
	return w;
}

/* Is a fetch answered now possibly older than a replayed invalidation? */
bool
pc_replay_key_waiting(const char *key, uint32 len)
{
	return overflow_active ||
		(hash_get_num_entries(waiting) > 0 &&
		 waiting_lookup(key, len, HASH_FIND) != NULL);
}

/* Mark or unmark one cached key as waiting for a commit. */
static void
set_awaiting(const char *key, uint32 len, bool awaiting)
{
	PcKey		search = pc_search_key(key, len);
	PcEntry    *entry;

	entry = pc_entry_find(&search, true);
	if (entry == NULL)
		return;					/* not cached here: skipped */
	entry->awaiting_commit = awaiting;
	if (awaiting && entry->state != PC_STATE_PENDING)
		entry->invalidated = true;
	pc_entry_release(entry);
}

/*
 * Set (after an overflow) or clear (once it is over) awaiting_commit on
 * every cached key; when clearing, keys that still have items keep it.
 */
static void
set_awaiting_all(bool awaiting)
{
	PcEntryScan scan;
	PcEntry    *entry;

	pc_entry_scan_begin(&scan, true);
	while ((entry = pc_entry_scan_next(&scan)) != NULL)
	{
		if (!awaiting && hash_get_num_entries(waiting) > 0)
		{
			char		buf[PC_MAX_KEY_BYTES + 1];
			char	   *search = buf;

			memcpy(buf, pc_entry_key(entry), entry->keylen);
			buf[entry->keylen] = '\0';
			if (hash_search(waiting, &search, HASH_FIND, NULL) != NULL)
				continue;
		}
		entry->awaiting_commit = awaiting;
		if (awaiting && entry->state != PC_STATE_PENDING)
			entry->invalidated = true;
	}
	pc_entry_scan_end(&scan);
}

/* Step 1: take the items redo appended since the last pass. */
static bool
take_new_items(void)
{
	PcWalPending *pending = pc_wal_pending();
	char	   *copy;
	Size		n;
	Size		pos;
	bool		mark_all;
	int			ndropped;

	pc_lock_alone(pc_wal_pending_lock(), LW_SHARED);
	n = pending->used - pending->marked;
	mark_all = pending->overflowed && !pending->overflow_marked;
	LWLockRelease(pc_wal_pending_lock());
	if (n == 0 && !mark_all)
		return false;

	/*
	 * Only this process moves 'marked' or removes items: n stays valid.  An
	 * overflow may have happened since the look above, so it is decided again
	 * under the exclusive lock.
	 */
	copy = palloc(Max(n, 1));
	pc_lock_alone(pc_wal_pending_lock(), LW_EXCLUSIVE);
	memcpy(copy, pending->data + pending->marked, n);
	pending->marked += n;
	mark_all = pending->overflowed && !pending->overflow_marked;
	ndropped = pending->ndropped;
	if (mark_all)
		pending->overflow_marked = true;
	LWLockRelease(pc_wal_pending_lock());

	for (pos = 0; pos < n;)
	{
		PcWalItem  *item = (PcWalItem *) (copy + pos);
		WaitingKey *w;

		Assert(TransactionIdIsNormal(item->xid) && item->keylen > 0 &&
			   pos + PC_WAL_ITEM_SIZE(item->keylen) <= n);
		w = waiting_lookup(item->key, item->keylen, HASH_ENTER);

		w->items++;
		set_awaiting(item->key, item->keylen, true);
		pos += PC_WAL_ITEM_SIZE(item->keylen);
	}
	pfree(copy);

	if (mark_all)
	{
		overflow_active = true;
		ereport(LOG,
				(errmsg("projcache: invalidations replayed from WAL did not fit in projcache.wal_pending_memory"),
				 errdetail_plural("Every cached key is stale, and waits until the %d transaction whose invalidations were dropped has ended.",
								  "Every cached key is stale, and waits until the %d transactions whose invalidations were dropped have ended.",
								  ndropped, ndropped)));
		set_awaiting_all(true);
	}
	return true;
}

static XidFate
xid_fate(TransactionId xid)
{
	if (TransactionIdIsInProgress(xid))
		return XID_RUNNING;
	if (TransactionIdDidCommit(xid))
		return XID_COMMITTED;
	return XID_ABORTED;
}

/* Step 2: drop the items whose transaction ended; act on their keys. */
static bool
resolve_items(PcRefetchFn refetch)
{
	PcWalPending *pending = pc_wal_pending();
	HASHCTL		ctl;
	HTAB	   *fates;
	Size		marked;
	Size		pos;
	Size		kept;
	char	   *ended;
	Size		ended_len = 0;
	bool		any_ended = false;

	/* Items before 'marked' change only here: read them without the lock. */
	pc_lock_alone(pc_wal_pending_lock(), LW_SHARED);
	marked = pending->marked;
	LWLockRelease(pc_wal_pending_lock());
	if (marked == 0)
		return false;

	ctl.keysize = sizeof(TransactionId);
	ctl.entrysize = sizeof(XidFateEntry);
	ctl.hcxt = CurrentMemoryContext;
	fates = hash_create("projcache transaction fates", 64, &ctl,
						HASH_ELEM | HASH_BLOBS | HASH_CONTEXT);
	for (pos = 0; pos < marked;)
	{
		PcWalItem  *item = (PcWalItem *) (pending->data + pos);
		bool		found;
		XidFateEntry *f = hash_search(fates, &item->xid, HASH_ENTER, &found);

		if (!found)
		{
			f->fate = xid_fate(item->xid);
			any_ended |= f->fate != XID_RUNNING;
		}
		pos += PC_WAL_ITEM_SIZE(item->keylen);
	}
	if (!any_ended)
		return false;

	/* Copy the ended items out, and close the gaps under the lock. */
	ended = palloc(marked);
	pc_lock_alone(pc_wal_pending_lock(), LW_EXCLUSIVE);
	for (pos = 0, kept = 0; pos < marked;)
	{
		PcWalItem  *item = (PcWalItem *) (pending->data + pos);
		Size		size = PC_WAL_ITEM_SIZE(item->keylen);
		XidFateEntry *f = hash_search(fates, &item->xid, HASH_FIND, NULL);

		Assert(f != NULL);		/* every marked item's xid was looked up */
		if (f->fate == XID_RUNNING)
		{
			if (kept != pos)
				memmove(pending->data + kept, item, size);
			kept += size;
		}
		else
		{
			memcpy(ended + ended_len, item, size);
			ended_len += size;
		}
		pos += size;
	}
	/* Then the items appended after 'marked', which nobody marked yet. */
	memmove(pending->data + kept, pending->data + marked,
			pending->used - marked);
	pending->used -= marked - kept;
	pending->marked = kept;
	LWLockRelease(pc_wal_pending_lock());

	for (pos = 0; pos < ended_len;)
	{
		PcWalItem  *item = (PcWalItem *) (ended + pos);
		XidFateEntry *f = hash_search(fates, &item->xid, HASH_FIND, NULL);
		WaitingKey *w = waiting_lookup(item->key, item->keylen, HASH_FIND);

		pos += PC_WAL_ITEM_SIZE(item->keylen);
		if (w == NULL)
			elog(ERROR, "projcache: a replayed key ended without being counted as waiting");
		w->committed |= f->fate == XID_COMMITTED;
		if (--w->items > 0)
			continue;
		if (!overflow_active)
			set_awaiting(item->key, item->keylen, false);
		if (w->committed && !overflow_active)
			refetch(item->key, item->keylen);
		(void) waiting_lookup(item->key, item->keylen, HASH_REMOVE);
	}
	pfree(ended);
	hash_destroy(fates);
	return true;
}

/* The oldest transaction still running, as a new snapshot sees it. */
static TransactionId
oldest_running_xid(void)
{
	MemoryContext cxt = CurrentMemoryContext;
	TransactionId xmin;

	StartTransactionCommand();
	xmin = GetLatestSnapshot()->xmin;
	CommitTransactionCommand();
	MemoryContextSwitchTo(cxt);
	return xmin;
}

/*
 * After an overflow: forget the dropped transactions that have ended, and
 * end the overflow once none is left.  Redo only appends to dropped_xids,
 * so the first entries under the exclusive lock are those looked at.
 */
static bool
resolve_overflow(void)
{
	PcWalPending *pending = pc_wal_pending();
	TransactionId xids[PC_WAL_MAX_DROPPED_XIDS];
	bool		ended[PC_WAL_MAX_DROPPED_XIDS];
	TransactionId lost_xid;
	bool		lost_ended = false;
	bool		moved = false;
	bool		over = false;
	int			n;
	int			i;
	int			kept;

	pc_lock_alone(pc_wal_pending_lock(), LW_SHARED);
	n = pending->ndropped;
	memcpy(xids, pending->dropped_xids, n * sizeof(TransactionId));
	lost_xid = pending->lost_xid;
	LWLockRelease(pc_wal_pending_lock());

	for (i = 0; i < n; i++)
		ended[i] = xid_fate(xids[i]) != XID_RUNNING;
	if (TransactionIdIsValid(lost_xid))
		lost_ended = TransactionIdPrecedes(lost_xid, oldest_running_xid());

	pc_lock_alone(pc_wal_pending_lock(), LW_EXCLUSIVE);
	Assert(pending->overflowed && pending->ndropped >= n);
	for (i = 0, kept = 0; i < pending->ndropped; i++)
	{
		Assert(i >= n ||
			   TransactionIdEquals(pending->dropped_xids[i], xids[i]));
		if (i < n && ended[i])
			continue;
		pending->dropped_xids[kept++] = pending->dropped_xids[i];
	}
	moved = kept < pending->ndropped;
	pending->ndropped = kept;
	if (lost_ended && TransactionIdEquals(pending->lost_xid, lost_xid))
	{
		pending->lost_xid = InvalidTransactionId;
		moved = true;
	}
	if (pending->ndropped == 0 && !TransactionIdIsValid(pending->lost_xid))
	{
		pending->overflowed = false;
		pending->overflow_marked = false;
		over = true;
	}
	LWLockRelease(pc_wal_pending_lock());
	if (!over)
		return moved;

	overflow_active = false;
	set_awaiting_all(false);
	ereport(LOG,
			(errmsg("projcache: the transactions whose invalidations were dropped have ended"),
			 errdetail("Cached keys are refetched on their next read.")));
	return true;
}

/*
 * One pass: returns how long the worker may sleep before the next one, or
 * -1 if nothing waits.
 */
long
pc_replay_poll(PcRefetchFn refetch)
{
	bool		moved;

	moved = take_new_items();
	if (hash_get_num_entries(waiting) == 0 && !overflow_active)
	{
		idle_polls = 0;
		return -1;
	}
	moved |= resolve_items(refetch);
	if (overflow_active)
		moved |= resolve_overflow();
	idle_polls = moved ? 0 : Min(idle_polls + 1, 16);
	return Min((long) PC_REPLAY_POLL_MIN_MS << Min(idle_polls, 8),
			   (long) PC_REPLAY_POLL_MAX_MS);
}
