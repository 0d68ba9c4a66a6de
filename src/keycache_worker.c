/*-------------------------------------------------------------------------
 *
 * keycache_worker.c
 *	  The "projcache scheduler" background worker, started by the launcher
 *	  (keycache_launcher.c) once projcache.database exists.
 *
 * The worker owns the key cache's private state (keycache_policy.c): per-key
 * fetch state, backoff, eviction and refresh times.  Its loop:
 *
 *	 1. take readers' requests (request ring, or a scan of request bits when
 *		the ring overflowed, at most at the pace policy_scan_due() allows)
 *		and begin fetches, invalidations, evictions;
 *	 2. run due evictions, then due refreshes;
 *	 3. when a batch of due fetches is ready, call the fetch function once
 *		for it (keycache_fetch.c), or more often if a call fails, until the
 *		keys that fail are alone in their calls (keycache_bisect.h), and
 *		publish the answers to the shared key map, waking readers through
 *		the keys' condition variables;
 *	 4. sleep on its latch until the next due time.
 *
 * It is the only process that deletes from the key map.  Private state is
 * not kept anywhere else, so after any restart the worker rebuilds it from
 * the shared map (rebuild_private_state): nothing cached is lost and
 * nothing is left unscheduled.  The times it needs for that (fetched_at,
 * expires_at, refresh_at) are mirrored into each PcEntry as they change.
 *
 * Copyright (c) 2026, projcache developers
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/xact.h"
#include "access/xlog.h"
#include "commands/async.h"
#include "miscadmin.h"
#include "pgstat.h"
#include "postmaster/bgworker.h"
#include "postmaster/interrupt.h"
#include "storage/ipc.h"
#include "storage/latch.h"
#include "storage/proc.h"
#include "storage/shmem.h"
#include "storage/spin.h"
#include "tcop/tcopprot.h"
#include "utils/guc.h"
#include "utils/memutils.h"

#include "keycache.h"
#include "keycache_bisect.h"
#include "keycache_caches.h"
#include "keycache_policy.h"
#include "keycache_worker.h"
#include "snapshot.h"
#include "user_switch.h"
#include "wal.h"

/* Longest sleep, in case a wakeup is ever missed. */
#define PC_MAX_SLEEP_MS		10000

/*
 * The largest value stored, as a share of the same: a larger one would evict
 * a good part of the cache for itself, so it is refused (and retried with
 * the usual backoff: the upstream's value may shrink).  A value within it
 * fits once the worker has evicted for it, unless the keys that would make
 * room are all being fetched.
 */
#define PC_MAX_VALUE_DIVISOR	8

StaticAssertDecl(PC_PERIOD_DEFAULT == POLICY_PERIOD_DEFAULT,
				 "the shared map and the policy encode periods alike");

Policy	   *pc_policy = NULL;
static MemoryContext policy_cxt = NULL; /* the key policy's private state */
static MemoryContext batch_cxt = NULL;	/* reset after each batch */
static PcKeyDump *key_dump = NULL;	/* a dump being written, slice by slice */
static int64 next_dump_ms = 0;	/* on pc_real_now_ms() */
static int64 dump_resume_ms = 0;	/* the dump's next slice, not before */
static char *ring_buf = NULL;
static Size ring_len = 0;		/* drained into ring_buf, not yet acted on */
static PolicyScanPace scan_pace;	/* of the scans for request bits, on
									 * pc_real_now_ms() */
static bool scan_wanted = false;	/* the ring overflowed since the last */
static int64 suspect_resume_ms = 0; /* when suspects may be fetched again, on
									 * pc_real_now_ms() (keycache_bisect.h) */


/* ----------------------------------------------------------------
 * The worker's shared state
 *
 * A part of shared memory of its own ("projcache worker"): how readers
 * wake the worker and tell it what they lack.  mutex (a spinlock) protects
 * latch and pid; the rest are atomics.
 * ----------------------------------------------------------------
 */
typedef struct PcWorkerShared
{
	slock_t		mutex;
	Latch	   *latch;			/* NULL while no worker runs */
	int			pid;
	pg_atomic_uint64 config_generation; /* bumped when the worker (re)loads
										 * its settings */
	pg_atomic_uint32 room_wanted;	/* a reader found no room for a new key */
	pg_atomic_uint32 admission_closed;	/* every value that could make room
										 * for a new key was read within
										 * projcache.admission_window: readers
										 * create no key */
} PcWorkerShared;

static PcWorkerShared *worker_shared = NULL;

void
pc_worker_shmem_request(void)
{
	RequestAddinShmemSpace(MAXALIGN(sizeof(PcWorkerShared)));
}

void
pc_worker_shmem_startup(void)
{
	bool		found;

	worker_shared = ShmemInitStruct("projcache worker",
									sizeof(PcWorkerShared), &found);
	if (found)
		return;
	SpinLockInit(&worker_shared->mutex);
	worker_shared->latch = NULL;
	worker_shared->pid = 0;
	pg_atomic_init_u64(&worker_shared->config_generation, 0);
	pg_atomic_init_u32(&worker_shared->room_wanted, 0);
	pg_atomic_init_u32(&worker_shared->admission_closed, 0);
}

/* Set the worker's latch, if a worker is running. */
void
pc_wake_worker(void)
{
	Latch	   *latch;

	SpinLockAcquire(&worker_shared->mutex);
	latch = worker_shared->latch;
	SpinLockRelease(&worker_shared->mutex);
	if (latch != NULL)
		SetLatch(latch);
}

/* The running worker's PID, or 0. */
int
pc_worker_pid(void)
{
	int			pid;

	SpinLockAcquire(&worker_shared->mutex);
	pid = worker_shared->pid;
	SpinLockRelease(&worker_shared->mutex);
	return pid;
}

uint64
pc_worker_config_generation(void)
{
	return pg_atomic_read_u64(&worker_shared->config_generation);
}

/* A reader found no room for a new key: the worker evicts for it. */
void
pc_worker_want_room(void)
{
	pg_atomic_write_u32(&worker_shared->room_wanted, 1);
}

/* Whether a reader found no room since the worker last asked. */
bool
pc_worker_take_room_wanted(void)
{
	return pg_atomic_exchange_u32(&worker_shared->room_wanted, 0) != 0;
}

/* Close admission (keycache_evict.c, "Admission"); false if it was closed. */
bool
pc_worker_close_admission(void)
{
	return pg_atomic_exchange_u32(&worker_shared->admission_closed, 1) == 0;
}

void
pc_worker_open_admission(void)
{
	pg_atomic_write_u32(&worker_shared->admission_closed, 0);
}

/* Whether readers may create no key now (keycache_evict.c, "Admission"). */
bool
pc_worker_admission_closed(void)
{
	return pg_atomic_read_u32(&worker_shared->admission_closed) != 0;
}

/* ----------------------------------------------------------------
 * Settings and the shared map
 * ----------------------------------------------------------------
 */

static void *
policy_cxt_alloc(size_t size)
{
	return MemoryContextAllocHuge(policy_cxt, size);
}

static void
policy_cxt_free(void *ptr)
{
	pfree(ptr);
}

/* Read the settings into the worker; warn about an unusable refresh. */
static void
load_settings(void)
{
	PolicyConfig config;

	config.expiry_ms = pc_expiry_ms;
	config.grace_period_ms = pc_grace_period_ms;
	config.refresh_interval_ms = pc_refresh_interval_ms;
	config.max_retry_backoff_ms = pc_max_retry_backoff_ms;

	/*
	 * The interval is checked against each key's own periods when the key is
	 * fetched (keycache_policy.c); the settings' are what keys without
	 * periods of their own follow, so an interval they exclude is worth a
	 * WARNING.
	 */
	if (config.refresh_interval_ms > 0 &&
		!policy_refresh_interval_valid(config.expiry_ms, config.grace_period_ms,
									   config.refresh_interval_ms))
		ereport(WARNING,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("projcache.refresh_interval = %d ms is ignored",
						pc_refresh_interval_ms),
				 errdetail("It must be strictly between projcache.expiry (%d ms) and projcache.expiry + projcache.grace_period (%d ms).",
						   pc_expiry_ms, pc_expiry_ms + pc_grace_period_ms),
				 errhint("Keys whose fetch function gives them their own max_age and stale_for are refreshed if it lies strictly between those.")));

	if (pc_policy == NULL)
	{
		pc_policy = policy_create(&config, policy_cxt_alloc, policy_cxt_free);
		policy_set_pool_fn(pc_policy, pc_key_pool, NULL);
	}
	else if (policy_set_config(pc_policy, &config) > 0)
	{
		PcEntryScan scan;
		PcEntry    *entry;

		/* Evictions moved with a new expiry or grace period: show it. */
		pc_entry_scan_begin(&scan, true);
		while ((entry = pc_entry_scan_next(&scan)) != NULL)
		{
			PolicyEntry *e;

			if (pc_entry_expires_at(entry) == 0)
				continue;
			e = policy_lookup(pc_policy, pc_entry_key(entry), entry->keylen);
			if (e != NULL && e->has_expiry)
				pc_entry_set_expires_at(entry, e->expiry);
		}
		pc_entry_scan_end(&scan);
	}
	pg_atomic_fetch_add_u64(&worker_shared->config_generation, 1);
}

static void
worker_detach_latch(int code, Datum arg)
{
	SpinLockAcquire(&worker_shared->mutex);
	if (worker_shared->latch == MyLatch)
	{
		worker_shared->latch = NULL;
		worker_shared->pid = 0;
	}
	SpinLockRelease(&worker_shared->mutex);
}

/* The header fields mirror_entry() writes (a PcEntryApplyFn). */
static bool
mirror_header(PcEntry *entry, void *arg)
{
	PolicyEntry *e = arg;

	switch (e->state)
	{
		case POLICY_PENDING:
			entry->fetch_state = PC_FETCH_PENDING;
			break;
		case POLICY_IN_PROGRESS:
			entry->fetch_state = PC_FETCH_IN_PROGRESS;
			break;
		case POLICY_COMPLETE:
			entry->fetch_state = PC_FETCH_COMPLETE;
			break;
	}
	entry->attempts = (uint16) Min(e->attempts, PG_UINT16_MAX);
	if (e->has_expiry)
		pc_entry_set_expires_at(entry, e->expiry);
	entry->has_refresh = false;
	if (e->heap_pos[POLICY_QUEUE_REFRESH] >= 0)
		pc_entry_set_refresh_at(entry, e->heap_time[POLICY_QUEUE_REFRESH]);
	return true;
}

/*
 * Mirror the private times of one key into its shared entry, and tell the
 * worker the memory the key takes now.  (Its periods are written with
 * its value, by store_answer().)
 */
static void
mirror_entry(PolicyEntry *e)
{
	PcKey		search = pc_search_key(e->key, e->keylen);
	PcEntryWrite w = {0};
	PcEntry    *entry;
	bool		applied;

	/* Waiting out a backoff is shown as such (entries.fetch_state). */
	w.set_retry = true;
	w.retry_at = 0;
	if (e->state == POLICY_IN_PROGRESS && e->has_fetch_when && !e->dispatched)
		w.retry_at = e->fetch_when;
	else if (e->state == POLICY_PENDING && e->has_next_attempt)
		w.retry_at = e->next_attempt;
	if (!pc_entry_write(e->key, e->keylen, &w, mirror_header, e, &applied))
	{
		/* No room to show when it retries: the rest, without that. */
		w.set_retry = false;
		(void) pc_entry_write(e->key, e->keylen, &w, mirror_header, e,
							  &applied);
	}
	if (!applied)
		return;

	/* What it weighs in the eviction's FIFOs: the memory it takes. */
	entry = pc_entry_find(&search, false);
	if (entry != NULL)
	{
		policy_set_bytes(pc_policy, e, pc_entry_footprint(entry));
		pc_entry_release(entry);
	}
}

/*
 * Delete a locked entry (releasing it), count the eviction and its cause,
 * and wake the key's readers.
 */
static void
delete_locked(PcEntry *entry, const char *key, uint32 len, PcCounter cause)
{
	pc_keymap_delete(entry);
	pc_count(PC_CTR_EVICTIONS, 1);
	pc_count(cause, 1);
	ConditionVariableBroadcast(pc_key_cv(key, len));
}

/* Remove a key from the shared map, if it is there, counting why. */
void
pc_delete_shared(const char *key, uint32 len, PcCounter cause)
{
	PcKey		search = pc_search_key(key, len);
	PcEntry    *entry;

	/* What evict() removed stays removed after a crash. */
	if (cause == PC_CTR_REQUESTED_EVICTIONS)
		pc_keys_tombstone(key, len, true, true);
	entry = pc_entry_find(&search, true);
	if (entry != NULL)
		delete_locked(entry, key, len, cause);
}

/*
 * A key about to be stored disabled must not come back from a dump with
 * the value it had: a tombstone first, unless it was disabled already.
 */
static void
tombstone_unless_disabled(const char *key, uint32 len)
{
	PcKey		search = pc_search_key(key, len);
	PcEntry    *entry;
	bool		disabled = false;
	bool		had_value = false;

	entry = pc_entry_find(&search, false);
	if (entry != NULL)
	{
		disabled = entry->state == PC_STATE_DISABLED;
		had_value = entry->state != PC_STATE_PENDING;
		pc_entry_release(entry);
	}
	if (!disabled)
		pc_keys_tombstone(key, len, false, had_value);
}


/* The admission window in stamp units; 0: no protection. */
uint32
pc_admission_window_units(void)
{
	if (pc_admission_window_ms <= 0)
		return 0;
	StaticAssertStmt(PC_STAMP_MODULUS == POLICY_STAMP_MODULUS,
					 "read stamps wrap where the policy expects");
	return (uint32) Min((pc_admission_window_ms + PC_STAMP_MS - 1) /
						PC_STAMP_MS, PC_STAMP_MODULUS / 2);
}


/* ----------------------------------------------------------------
 * Readers' requests, and fair fetching
 * ----------------------------------------------------------------
 */

/*
 * Act on the request bits a reader left on one key.  'role' made the
 * request (InvalidOid when it came from a scan of the map, which cannot
 * say: then the key's creator); the key's fetch, if it is new, waits for
 * that role's turn (keycache_policy.h, "Fair fetching").
 */
static void
handle_request(const char *key, uint32 len, Oid role, int64 now)
{
	PcKey		search = pc_search_key(key, len);
	PcEntry    *entry;
	uint32		marks;
	uint32		bits;
	bool		invalidated;
	bool		visited;
	int			owner;
	PolicyEntry *e = NULL;

	entry = pc_entry_find(&search, false);
	if (entry == NULL)
		return;
	marks = pg_atomic_fetch_and_u32(&entry->marks, ~PC_MARK_REQUESTS);
	bits = marks & PC_MARK_REQUESTS;
	invalidated = entry->invalidated;
	/* Read again before we got here: that is demand too. */
	visited = (marks & PC_MARK_VISITED) != 0;
	owner = entry->owner;
	pc_entry_release(entry);
	if (!OidIsValid(role))
		role = pc_role_of_slot(owner);

	/*
	 * A reader asking for a key that invalidate() marked stale (and whose
	 * transaction did not tell us, having rolled back or not committed yet)
	 * gets a real refetch: our private state may still call it fresh.  Not
	 * while a fetch is under way: that would skip its backoff.
	 */
	if ((bits & PC_REQ_FETCH) && invalidated &&
		(e = policy_lookup(pc_policy, key, len)) != NULL &&
		e->state == POLICY_COMPLETE)
		bits |= PC_REQ_INVALIDATE;

	if (bits & PC_REQ_EVICT)
	{
		/*
		 * Requests are taken only between batches, so no fetch of the key is
		 * running now: the eviction is never deferred here.
		 */
		if (policy_request_evict(pc_policy, key, len) == POLICY_EVICT_NOW)
			pc_delete_shared(key, len, PC_CTR_REQUESTED_EVICTIONS);
		return;
	}
	if (bits & PC_REQ_INVALIDATE)
		policy_invalidate(pc_policy, key, len, now);
	else if (bits & (PC_REQ_FETCH | PC_REQ_DEMAND))
		policy_try_begin_fetch(pc_policy, key, len, false, now);

	/*
	 * With no bits left (another request of the key took them), the record
	 * still says that this role asked for it, and waits: its turn may come
	 * first.
	 */
	e = policy_lookup(pc_policy, key, len);
	if (e == NULL)
		return;
	pc_weigh_new_key(e);
	policy_set_owner(pc_policy, e, (uint32) owner);
	policy_set_flow(pc_policy, e, role);
	if (e->state == POLICY_IN_PROGRESS &&
		((bits & PC_REQ_DEMAND) || visited))
		policy_note_demand(pc_policy, e);
	if (bits != 0)
		mirror_entry(e);
}

/*
 * Fair fetching: while the keys' memory is short (within a headroom of the
 * level eviction keeps it at, or a reader found no room), past POLICY_ONCE_BATCHES
 * batches of keys read only once waiting for a fetch, drop the oldest (a
 * scan's, most likely), unless a reader read it again meanwhile.  Its
 * entry goes from the map, so its next read asks again, as a key of its
 * own FIFO's ghost: with demand.  With room, nothing is dropped: a reader
 * may wait for any of them next (a service warming its cache).
 */
static void
drop_fetches_for_nobody(void)
{
	size_t		limit = (size_t) POLICY_ONCE_BATCHES * pc_batch_size;
	Size		target = pc_key_memory_target();
	Size		headroom = pc_key_memory_bound() - target;
	bool		memory_short;
	PolicyEntry *e;

	memory_short = pg_atomic_read_u32(&worker_shared->room_wanted) != 0 ||
		pc_key_memory_used() + headroom > target;
	while ((e = policy_once_excess(pc_policy, limit, memory_short)) != NULL)
	{
		PcKey		search = pc_search_key(e->key, e->keylen);
		PcEntry    *entry;
		bool		dropped = false;

		entry = pc_entry_find(&search, true);
		if (entry != NULL && pg_atomic_read_u32(&entry->marks) == 0)
		{
			delete_locked(entry, e->key, e->keylen, PC_CTR_DROPPED_FETCHES);
			dropped = true;
		}
		else if (entry != NULL)
			pc_entry_release(entry);
		if (entry == NULL || dropped)
			policy_evict_victim(pc_policy, e);
		else
			policy_note_demand(pc_policy, e);	/* read again meanwhile */
	}
}

/*
 * On a standby, the commit of a replayed invalidation was replayed too:
 * refetch the key now, as the primary did at commit.
 */
static void
refetch_replayed(const char *key, uint32 len)
{
	PolicyEntry *e;

	if (policy_lookup(pc_policy, key, len) == NULL)
		return;					/* not cached here */
	policy_invalidate(pc_policy, key, len, pc_now_ms());
	e = policy_lookup(pc_policy, key, len);
	if (e != NULL)
		mirror_entry(e);
}

/* Has a reader left requests on the entry? */
static bool
has_requests(PcEntry *entry)
{
	return (pg_atomic_read_u32(&entry->marks) & PC_MARK_REQUESTS) != 0;
}

/*
 * The ring overflowed: find every entry with request bits.  A scan reads
 * the whole map, so it is paced (keycache_policy.h, "The pace of the
 * scans"): a reader that keeps the ring full costs the worker a tenth of
 * its time at most, not every pass of its loop.
 */
static void
scan_requests(int64 now)
{
	PcKeyList	list;
	int			i;
	int64		start = pc_real_now_ms();

	if (!policy_scan_due(&scan_pace, start))
		return;
	scan_wanted = false;

	pc_keylist_init(&list, 0);
	pc_keylist_from_map(&list, has_requests, NULL);
	if (list.oom)
		pc_report_oom("the keys the scheduler needs");

	for (i = 0; i < list.count; i++)
		handle_request(list.keys[i], list.lens[i], InvalidOid, now);
	policy_scan_done(&scan_pace, start, pc_real_now_ms());
}

/*
 * Act on the keys readers asked about: those in the ring, then a scan if it
 * overflowed.
 */
static void
process_requests(int64 now)
{
	Size		n = pc_ring_drain(ring_buf, pc_ring_size());
	Size		off = 0;

	while (off < n)
	{
		uint32		len;
		Oid			role;

		memcpy(&len, ring_buf + off, sizeof(uint32));
		len &= ~PC_RING_REFUSED;
		memcpy(&role, ring_buf + off + sizeof(uint32), sizeof(Oid));
		handle_request(ring_buf + off + sizeof(uint32) + sizeof(Oid), len,
					   role, now);
		off += sizeof(uint32) + sizeof(Oid) + TYPEALIGN(4, len);
	}
	ring_len = n;

	if (pc_ring_take_overflow())
		scan_wanted = true;
	if (scan_wanted)
		scan_requests(now);
}

/*
 * Create the keys that readers found no room for (PC_RING_REFUSED), once
 * eviction has made room, and begin their fetches, as the readers' own
 * requests would have: a service warming its cache reads every key once,
 * then waits for each, and a key it could not create would otherwise be
 * fetched alone when its wait comes.  Room that runs out meanwhile is made
 * again; a key still without room, or asked for while admission is closed
 * ("Admission"), is left to its next read.  In a transaction: counting a
 * key for its role reads the catalog.
 */
static void
create_refused_keys(int64 now)
{
	MemoryContext cxt = CurrentMemoryContext;
	bool		in_xact = false;
	Size		off = 0;

	while (off < ring_len)
	{
		uint32		word;
		uint32		len;
		Oid			role;
		const char *key;

		memcpy(&word, ring_buf + off, sizeof(uint32));
		len = word & ~PC_RING_REFUSED;
		memcpy(&role, ring_buf + off + sizeof(uint32), sizeof(Oid));
		key = ring_buf + off + sizeof(uint32) + sizeof(Oid);
		off += sizeof(uint32) + sizeof(Oid) + TYPEALIGN(4, len);
		/* While admission is closed, they are left to their next reads. */
		if ((word & PC_RING_REFUSED) != 0 &&
			pg_atomic_read_u32(&worker_shared->admission_closed) == 0)
		{
			PcEntry    *entry;
			bool		created;

			if (!in_xact)
			{
				StartTransactionCommand();
				MemoryContextSwitchTo(cxt);
				in_xact = true;
			}
			entry = pc_keymap_find_or_create_for(key, len, role, &created);
			if (entry == NULL)
			{
				/* room runs out again: make more, as a reader would ask */
				pc_evict_for_memory();
				pc_evict_for_roles();
				entry = pc_keymap_find_or_create_for(key, len, role,
													 &created);
			}
			if (entry == NULL)
				continue;
			if (created)
				(void) pc_request_mark(entry, PC_REQ_FETCH);
			pc_entry_release(entry);
			if (created)
				handle_request(key, len, role, now);
		}
	}
	ring_len = 0;
	if (in_xact)
	{
		CommitTransactionCommand();
		MemoryContextSwitchTo(cxt);
	}
}

/* An eviction is due. */
static void
evict_due(PolicyEntry *e, int64 now)
{
	PcKey		search = pc_search_key(e->key, e->keylen);
	PcEntry    *entry;

	entry = pc_entry_find(&search, true);
	if (entry != NULL &&
		(pg_atomic_read_u32(&entry->marks) & PC_REQ_FETCH) != 0)
	{
		/* Read (and asked for) since it expired: fetch it instead. */
		pc_entry_release(entry);
		if (policy_try_begin_fetch(pc_policy, e->key, e->keylen, false, now))
		{
			mirror_entry(e);
			return;
		}
		/* Fresh again under new settings: it still goes, on its schedule. */
		entry = pc_entry_find(&search, true);
	}
	if (entry != NULL)
		delete_locked(entry, e->key, e->keylen, PC_CTR_EXPIRY_EVICTIONS);
	policy_evict(pc_policy, e);
}

/* ----------------------------------------------------------------
 * Timers
 * ----------------------------------------------------------------
 */

/* Act on every timer that is due: evictions, then refreshes. */
static void
process_timers(int64 now)
{
	PolicyEntry *e;

	/* Evictions first: refreshing what is about to go is wasted work. */
	while ((e = policy_pop_eviction(pc_policy, now)) != NULL)
		evict_due(e, now);
	while ((e = policy_pop_refresh(pc_policy, now)) != NULL)
	{
		if (policy_try_begin_fetch(pc_policy, e->key, e->keylen, true, now) != NULL)
			pc_count(PC_CTR_REFRESHES, 1);
		mirror_entry(e);
	}
}

static void
count_delay(PolicyEntry *e)
{
	static const int bounds_s[] = {15, 30, 60, 120, 300, 600, 1800, 3600};
	int64		delay_s;
	int			i;

	if (!e->has_previous_fetch)
		return;
	delay_s = (e->fetch_initiated - e->previous_fetch) / 1000;
	for (i = 0; i < lengthof(bounds_s); i++)
	{
		if (delay_s <= bounds_s[i])
		{
			pc_count(PC_CTR_DELAY_LTE15S + i, 1);
			return;
		}
	}
	pc_count(PC_CTR_DELAY_GT3600S, 1);
}

/* ----------------------------------------------------------------
 * Answers of the fetch function
 * ----------------------------------------------------------------
 */

/*
 * Make room for a write of the key of pool 'pool' (whose entry weighs
 * 'freed' now) and prepare it: evict S3-FIFO's victims of the pools that
 * pay (pc_make_room) until its new chunk fits.  POLICY_ROOM_FITS once
 * prepared; else why not (a key in its fetch, as the one written is, is
 * never a victim).
 */
static int
prepare_with_room(const char *key, uint32 len, int pool, Size freed,
				  bool admit, const PcEntryWrite *w, PcEntryPrepared *prep)
{
	Size		need = pc_entry_write_size(key, len, w);
	int			room;

	/* A write in place needs no room (and no victim). */
	if (need > 0 && (room = pc_make_room(pool, need, freed, false, admit)) !=
		POLICY_ROOM_FITS)
		return room;
	/* Readers may have taken the room meanwhile: one more key at a time. */
	while (!pc_entry_prepare(key, len, w, prep))
	{
		room = pc_make_room(pool, need, freed, true, admit);
		if (room != POLICY_ROOM_FITS)
			return room;
	}
	return POLICY_ROOM_FITS;
}

/*
 * Does the key hold a value now (for not_modified)?  *waited: did a reader
 * wait for it (PC_MARK_WAITED)?
 */
static bool
shared_has_value(const char *key, uint32 len, bool *waited)
{
	PcKey		search = pc_search_key(key, len);
	PcEntry    *entry;
	bool		result = false;

	*waited = false;
	entry = pc_entry_find(&search, false);
	if (entry != NULL)
	{
		result = entry->state != PC_STATE_PENDING;
		*waited = (pg_atomic_read_u32(&entry->marks) & PC_MARK_WAITED) != 0;
		pc_entry_release(entry);
	}
	return result;
}

/*
 * What an answer writes into the key's body: a value, with its periods
 * and the message saying why a period was refused; for not_modified, the
 * periods and that message; for an error, its message; for pending, a
 * message written once the worker has counted the attempt.
 */
static void
answer_write(const PcFetchItem *item, PcEntryWrite *w)
{
	Size		size;

	memset(w, 0, sizeof(*w));
	w->error = InvalidDsaPointer;
	w->set_error = true;
	w->max_age_ms = PC_PERIOD_DEFAULT;
	w->stale_for_ms = PC_PERIOD_DEFAULT;
	switch (item->answer)
	{
		case PC_ANSWER_ENABLED:
		case PC_ANSWER_DISABLED:
			w->set_value = true;
			w->revision = item->new_revision;
			w->config = item->answer == PC_ANSWER_ENABLED ? item->config : NULL;
			/* FALLTHROUGH */
		case PC_ANSWER_NOT_MODIFIED:
			w->set_periods = true;
			w->max_age_ms = item->max_age_ms;
			w->stale_for_ms = item->stale_for_ms;
			if (item->period_error != NULL)
				w->error = pc_store_message(item->period_error, &size);
			break;
		case PC_ANSWER_PENDING:
			break;				/* its message is made after the worker
								 * counted the attempt (apply_answer) */
		case PC_ANSWER_ERROR:
			w->error = item->error == NULL ? InvalidDsaPointer :
				pc_store_message(item->error, &size);
			break;
	}
}

/* A value that could not be stored: counted as a fetch error. */
static void
count_unstored(int pool)
{
	pc_count(PC_CTR_FETCH_ERRORS, 1);
	if (pool > 0)
		pc_cache_count(pool - 1, PC_CACHE_FETCH_ERRORS, 1);
}

/*
 * Check an answer against what only the worker can see (not_modified for a
 * key with no value), and prepare what it writes (w, prep), with room for
 * it in the key's own pool (e's): a value too large or that does not fit
 * becomes an error answer; one larger than its cache's whole max_memory, a
 * disabled key with a message saying so, so that it is asked for again
 * only once stale, not at every read.  True if the answer broke the
 * contract.
 */
static bool
prepare_answer(const PolicyEntry *e, const char *key, uint32 len,
			   PcFetchItem *item, PcEntryWrite *w, PcEntryPrepared *prep)
{
	Size		bound = pc_key_memory_bound() / PC_MAX_VALUE_DIVISOR;
	Size		value_size = 0;
	bool		breach = false;
	bool		waited;
	bool		has_value = shared_has_value(key, len, &waited);
	bool		admit = !has_value && !waited;
	int			room;

	if (item->answer == PC_ANSWER_NOT_MODIFIED && !has_value)
	{
		item->answer = PC_ANSWER_ERROR;
		item->error = pstrdup("fetch function answered \"not_modified\" for a key with no cached value");
		breach = true;
	}
	if (item->answer == PC_ANSWER_DISABLED)
		item->config = NULL;
	if (item->answer == PC_ANSWER_ENABLED ||
		item->answer == PC_ANSWER_DISABLED)
	{
		value_size = (item->new_revision ? strlen(item->new_revision) : 0) +
			(item->config ? VARSIZE(item->config) : 0);
		if (value_size > bound)
		{
			item->answer = PC_ANSWER_ERROR;
			item->error = psprintf("value of %zu bytes is larger than an eighth of projcache.max_memory (%zu bytes)",
								   value_size, bound);
			/* a value that could not be stored: counted here (run_batch) */
			count_unstored(e->pool);
		}
	}

	answer_write(item, w);
	room = prepare_with_room(key, len, e->pool, e->bytes, admit, w, prep);
	if (room == POLICY_ROOM_TOO_LARGE)
	{
		/*
		 * Larger than its cache's whole budget: it would never stay.  Stored
		 * as disabled, without its revision (so that the next fetch asks for
		 * the value anew), with why.
		 */
		pc_free_message(w->error);
		item->period_error = psprintf("value of %zu bytes is larger than the max_memory of its cache (%zu bytes)",
									  value_size, pc_pool_budget(e->pool));
		item->answer = PC_ANSWER_DISABLED;
		item->config = NULL;
		item->new_revision = NULL;
		count_unstored(e->pool);
		answer_write(item, w);
		room = prepare_with_room(key, len, e->pool, e->bytes, admit, w, prep);
	}
	if (room == POLICY_ROOM_FITS)
		return breach;

	/*
	 * No room: every key that could make room for it is being fetched, or,
	 * for a key without a value, is a value in use.  (An error or pending
	 * answer writes in place and always has room.)
	 */
	Assert(item->answer != PC_ANSWER_ERROR &&
		   item->answer != PC_ANSWER_PENDING);
	pc_free_message(w->error);
	if (admit && pc_admission_window_units() > 0)
	{
		/*
		 * Its message is not stored: a reader of new keys would otherwise
		 * fill the message reserve, and values in use would pay for it.
		 */
		item->error = NULL;
		item->answer = PC_ANSWER_ERROR;
		count_unstored(e->pool);
		pc_close_admission();
		answer_write(item, w);
		if (!pc_entry_prepare(key, len, w, prep))
			elog(ERROR, "projcache: an error answer found no room to be written in place");
		return breach;
	}
	if (item->answer == PC_ANSWER_NOT_MODIFIED)
		item->error = pstrdup("projcache.max_memory is used up: could not store the key's own max_age and stale_for");
	else if (pc_pool_budget(e->pool) > 0)
		item->error = psprintf("the max_memory of the key's cache is used up: could not store a value of %zu bytes",
							   value_size);
	else
		item->error = psprintf("projcache.max_memory is used up: could not store a value of %zu bytes",
							   value_size);
	item->answer = PC_ANSWER_ERROR;
	count_unstored(e->pool);
	answer_write(item, w);
	if (!pc_entry_prepare(key, len, w, prep))
		elog(ERROR, "projcache: an error answer found no room to be written in place");
	return breach;
}

/* What the worker makes of an answer; counts not_modified and pending. */
static PolicyResult
policy_result_of(const PcFetchItem *item)
{
	switch (item->answer)
	{
		case PC_ANSWER_ENABLED:
		case PC_ANSWER_DISABLED:
			return POLICY_RESULT_VALUE;
		case PC_ANSWER_NOT_MODIFIED:
			pc_count(PC_CTR_NOT_MODIFIED, 1);
			return POLICY_RESULT_NOT_MODIFIED;
		case PC_ANSWER_PENDING:
			pc_count(PC_CTR_PENDING_RESULTS, 1);
			return POLICY_RESULT_PENDING;
		case PC_ANSWER_ERROR:
		default:
			return POLICY_RESULT_PENDING;
	}
}

/* Why a key stays pending, and when it is asked for again. */
static char *
pending_message(const PolicyEntry *e, int64 now)
{
	int64		next = 0;

	if (e->state == POLICY_IN_PROGRESS && e->has_fetch_when)
		next = e->fetch_when;
	else if (e->state == POLICY_PENDING && e->has_next_attempt)
		next = e->next_attempt;
	if (next > now)
		return psprintf("upstream answered \"pending\" (attempt %d); next attempt in %.1f s",
						e->attempts, (double) (next - now) / 1000.0);
	return psprintf("upstream answered \"pending\" (attempt %d)",
					e->attempts);
}

/* What an answer writes into the entry's header (a PcEntryApplyFn). */
typedef struct AnswerHeader
{
	const PolicyEntry *e;
	const PcFetchItem *item;
	PolicyResult result;
	bool		waiting;		/* an invalidation replayed from WAL waits */
	bool		error_unstored;
	int64		now;
} AnswerHeader;

static bool
answer_header(PcEntry *entry, void *arg)
{
	AnswerHeader *h = arg;

	if (h->result != POLICY_RESULT_PENDING)
	{
		if (h->result == POLICY_RESULT_VALUE)
			entry->state = h->item->answer == PC_ANSWER_ENABLED ?
				PC_STATE_ENABLED : PC_STATE_DISABLED;
		pc_entry_set_fetched_at(entry, h->now);

		/*
		 * An invalidation committed while the fetch ran has left its request
		 * bit, which the worker takes only after the batch: the answer was
		 * read before it, so the key stays stale until that refetch.
		 */
		entry->invalidated = h->e->invalidated || h->waiting ||
			(pg_atomic_read_u32(&entry->marks) & PC_REQ_INVALIDATE) != 0;
	}
	if (h->waiting)
		entry->awaiting_commit = true;
	entry->error_unstored = h->error_unstored;
	return true;
}

/*
 * Write an answer into the key's shared entry, under its lock: what w
 * holds (the new value for POLICY_RESULT_VALUE, the periods for any result
 * but pending, the message or none), the fetch time, and, if an
 * invalidation replayed from WAL waits (waiting), the mark that keeps it
 * stale.
 */
static void
store_answer(const char *key, uint32 len, const PolicyEntry *e,
			 const PcFetchItem *item, PolicyResult result, PcEntryWrite *w,
			 PcEntryPrepared *prep, bool waiting, int64 now)
{
	AnswerHeader h;
	bool		applied;

	h.e = e;
	h.item = item;
	h.result = result;
	h.waiting = waiting;
	h.error_unstored = item->answer == PC_ANSWER_ERROR &&
		!DsaPointerIsValid(w->error);
	h.now = now;
	pc_entry_commit(key, len, w, prep, answer_header, &h, &applied);
	if (!applied)
	{
		pc_free_message(w->error);
		/* Only this process deletes entries, and not while their fetch runs. */
		elog(ERROR, "projcache: the entry of a key in a fetch is gone");
	}
}

/*
 * Record one key's answer: private state first, then the shared entry,
 * then wake its readers.  True if the answer broke the contract in a way
 * only this can see.
 */
static bool
apply_answer(PolicyEntry *e, PcFetchItem *item, int64 now)
{
	char	   *key = pnstrdup(e->key, e->keylen);
	uint32		len = e->keylen;
	PolicyResult result;
	PolicyCompletion completion;
	PcEntryWrite w;
	PcEntryPrepared prep;
	bool		breach;
	bool		waiting;
	PolicyPeriods periods = {POLICY_PERIOD_DEFAULT, POLICY_PERIOD_DEFAULT};

	breach = prepare_answer(e, key, len, item, &w, &prep);
	result = policy_result_of(item);
	if (result != POLICY_RESULT_PENDING)
	{
		count_delay(e);
		periods.max_age_ms = item->max_age_ms;
		periods.stale_for_ms = item->stale_for_ms;
	}

	completion = policy_complete_fetch(pc_policy, e, result, &periods, now);
	if (completion == POLICY_EVICTED)
	{
		pc_entry_abandon(&prep);
		pc_free_message(w.error);
		pc_delete_shared(key, len, PC_CTR_REQUESTED_EVICTIONS);
		return breach;
	}

	/* An invalidation replayed from WAL may be newer than this answer. */
	waiting = pc_replay_key_waiting(key, len);
	if (item->answer == PC_ANSWER_PENDING)
	{
		Size		size;

		w.error = pc_store_message(pending_message(e, now), &size);
	}
	if (item->answer == PC_ANSWER_DISABLED)
		tombstone_unless_disabled(key, len);
	store_answer(key, len, e, item, result, &w, &prep, waiting, now);

	if (completion == POLICY_DONE || completion == POLICY_RESCHEDULED)
		mirror_entry(e);
	ConditionVariableBroadcast(pc_key_cv(key, len));
	return breach;
}

/*
 * Did the answer stored for a key change what it had: a new revision
 * replacing a value, or a key turning disabled?  (A first value replaces
 * nothing; an error or pending answer stores nothing.)
 */
static bool
value_changed(PcFetchItem *item, uint8 old_state)
{
	if (old_state == PC_STATE_PENDING)
		return false;
	if (item->answer == PC_ANSWER_DISABLED)
		return old_state == PC_STATE_ENABLED;
	if (item->answer != PC_ANSWER_ENABLED)
		return false;
	if (old_state == PC_STATE_DISABLED)
		return true;
	if (item->revision == NULL || item->new_revision == NULL)
		return item->revision != item->new_revision;
	return strcmp(item->revision, item->new_revision) != 0;
}

/*
 * NOTIFY projcache.notify_channel with each changed key, in a transaction
 * of its own that commits after the values are stored: a listener that
 * reads the key on hearing the notice gets the new value.  A failure to
 * notify (the queue is full) is logged, never the worker's end.  Only the
 * default cache's keys: anyone who can connect may LISTEN, and a named
 * cache's key names are for the roles it is granted to.
 */
static void
notify_changes(PolicyEntry **batch, PcFetchItem *items, uint8 *old_states,
			   const bool *applied, int n)
{
	MemoryContext cxt = CurrentMemoryContext;
	volatile int changed = 0;	/* read in PG_CATCH */
	int			i;

	if (pc_notify_channel == NULL || pc_notify_channel[0] == '\0' ||
		RecoveryInProgress())
		return;
	for (i = 0; i < n; i++)
		if (applied[i] && value_changed(&items[i], old_states[i]) &&
			batch[i]->pool == 0)
			changed++;
	if (changed == 0)
		return;

	PG_TRY();
	{
		StartTransactionCommand();
		for (i = 0; i < n; i++)
			if (applied[i] && value_changed(&items[i], old_states[i]) &&
				batch[i]->pool == 0)
				Async_Notify(pc_notify_channel,
							 pnstrdup(batch[i]->key, batch[i]->keylen));
		CommitTransactionCommand();
	}
	PG_CATCH();
	{
		ErrorData  *edata;

		MemoryContextSwitchTo(cxt);
		edata = CopyErrorData();
		FlushErrorState();
		AbortCurrentTransaction();
		ereport(WARNING,
				(errmsg("projcache could not notify %d changed keys on channel \"%s\": %s",
						changed, pc_notify_channel, edata->message)));
		FreeErrorData(edata);
	}
	PG_END_TRY();
	MemoryContextSwitchTo(cxt);
}

static void *
batch_cxt_alloc(size_t size)
{
	return MemoryContextAllocHuge(batch_cxt, size);
}

static void
batch_cxt_free(void *ptr)
{
	pfree(ptr);
}

static BisectCall
bisect_call_of(PcFetchOutcome outcome)
{
	switch (outcome)
	{
		case PC_FETCH_ANSWERED:
			return BISECT_CALL_ANSWERED;
		case PC_FETCH_UNRESOLVED:
			return BISECT_CALL_UNRESOLVED;
		case PC_FETCH_FAILED:
			return BISECT_CALL_FAILED;
		case PC_FETCH_FAILED_ALL:
			break;
	}
	return BISECT_CALL_FAILED_ALL;
}

/*
 * Key i's fate is sealed: mark it a suspect or not (bisect_suspect()), and
 * record its answer, or the error of its last call.  True if the answer
 * broke the contract in a way only apply_answer() can see.
 */
static bool
finish_key(BisectPlan *plan, int i, PolicyEntry *e, PcFetchItem *item,
		   int64 now)
{
	Assert(bisect_fate(plan, i) == BISECT_ANSWERED ||
		   item->answer == PC_ANSWER_ERROR);
	policy_set_suspect(e, bisect_suspect(plan, i,
										 item->answer == PC_ANSWER_ERROR));
	return apply_answer(e, item, now);
}

/* A batch as run_batch() runs it, in batch_cxt. */
typedef struct BatchRun
{
	const PcFetchTarget *target;	/* the keys' cache, and how to ask it */
	PolicyEntry **batch;
	int			n;
	PcFetchItem *items;			/* each key's question, then its answer */
	PcFetchItem *call_items;	/* one call's keys */
	uint8	   *old_states;		/* for change notices */
	bool	   *suspect;
	bool	   *applied;		/* its answer is applied */
	bool	   *unresolved;		/* one call's keys no breach settled */
} BatchRun;

/* The batch's questions: each key with its current revision. */
static void
prepare_batch(BatchRun *run, PolicyEntry **batch, int n,
			  const PcFetchTarget *target)
{
	int			i;

	run->target = target;
	run->batch = batch;
	run->n = n;
	run->items = palloc0(n * sizeof(PcFetchItem));
	run->call_items = palloc0(n * sizeof(PcFetchItem));
	run->old_states = palloc(n * sizeof(uint8));
	run->suspect = palloc(n * sizeof(bool));
	run->applied = palloc0(n * sizeof(bool));
	run->unresolved = palloc0(n * sizeof(bool));
	for (i = 0; i < n; i++)
	{
		PcKey		search = pc_search_key(batch[i]->key, batch[i]->keylen);
		PcEntry    *entry;
		bool		oom = false;

		/* A named cache's function sees its keys without "name:". */
		run->items[i].key = batch[i]->key + target->key_offset;
		run->items[i].keylen = batch[i]->keylen - target->key_offset;
		run->items[i].revision = NULL;
		run->suspect[i] = batch[i]->suspect;

		/* Pass the current revision, so the upstream can say not_modified. */
		run->old_states[i] = PC_STATE_PENDING;
		entry = pc_entry_find(&search, false);
		if (entry != NULL)
		{
			run->old_states[i] = entry->state;
			if (entry->state != PC_STATE_PENDING)
				run->items[i].revision = pc_entry_revision(entry, &oom);
			pc_entry_release(entry);
		}
		if (oom)
			pc_report_oom("the keys the scheduler needs");
	}
}

/*
 * One call of the plan, for its k keys; then the answers of the keys it
 * settled are applied.  A breach found as they are applied counts one
 * fetch error, unless the call counted one already.
 */
static void
run_call(BatchRun *run, BisectPlan *plan, const int *keys, int k)
{
	PcFetchOutcome outcome;
	bool		counted = false;
	bool		breach = false;
	int64		now;
	int			j;

	for (j = 0; j < k; j++)
		run->call_items[j] = run->items[keys[j]];
	outcome = pc_fetch_batch(run->call_items, k,
							 k == 1 && run->suspect[keys[0]], run->target);
	for (j = 0; j < k; j++)
	{
		run->items[keys[j]] = run->call_items[j];
		run->unresolved[j] = run->call_items[j].unresolved;
		/* pc_fetch_batch() counted the call if it gave any key an error */
		counted |= run->call_items[j].answer == PC_ANSWER_ERROR;
	}
	bisect_done(plan, pc_real_now_ms(), bisect_call_of(outcome),
				run->unresolved);

	/* The same keys, maybe reordered: apply those now settled. */
	now = pc_now_ms();
	for (j = 0; j < k; j++)
	{
		int			key = keys[j];

		if (bisect_fate(plan, key) == BISECT_WAITING)
			continue;
		breach |= finish_key(plan, key, run->batch[key], &run->items[key],
							 now);
		run->applied[key] = true;
	}
	if (breach && !counted)
		pc_count(PC_CTR_FETCH_ERRORS, 1);
}

/*
 * The keys the plan settled without a call: those left unsplit when the
 * budget ran out (failed together, said in one WARNING), and suspects put
 * back.
 */
static void
settle_unasked(BatchRun *run, BisectPlan *plan)
{
	int64		now = pc_now_ms();
	int64		rest;
	int			together = 0;
	const char *together_error = NULL;
	int			i;

	suspect_resume_ms = bisect_suspect_resume(plan);
	rest = Max(suspect_resume_ms - pc_real_now_ms(), 0);
	for (i = 0; i < run->n; i++)
	{
		PolicyEntry *e = run->batch[i];
		BisectFate	fate = bisect_fate(plan, i);

		if (run->applied[i])
			continue;
		if (fate == BISECT_POSTPONED)
		{
			/* by one more step of its backoff, and until suspects may go */
			int64		step = policy_backoff_delay(e->attempts + 1,
													pc_max_retry_backoff_ms);

			policy_defer_fetch(pc_policy, e, now + Max(rest, step));
			mirror_entry(e);
			continue;
		}
		Assert(fate == BISECT_FAILED_TOGETHER);
		together++;
		together_error = run->items[i].error;
		(void) finish_key(plan, i, e, &run->items[i], now);
		run->applied[i] = true;
	}
	if (together > 0)
		ereport(WARNING,
				(errmsg_plural("fetch function failed for %d key",
							   "fetch function failed for %d keys",
							   together, together),
				 errdetail("%s", together_error),
				 errhint("The keys that fail were not found within projcache.fetch_timeout (%d ms); these are retried together.",
						 pc_fetch_timeout_ms)));
}

/*
 * Fetch one batch: hand the fetch function each key with the revision the
 * map holds (so it may answer not_modified), then apply every answer to
 * the worker and the shared map.
 *
 * A bad key fails alone (keycache_bisect.h): the batch is a plan of calls.
 * Its clean keys go in one call, split in halves as long as a call fails
 * in a way a key may have caused; each key's answer is applied as soon as
 * its call settles it, so that its readers wake.  Suspects (keys that
 * failed alone before) then get a call each, while their slice lasts; the
 * rest are put back, unasked, until suspects may have the worker again.
 *
 * Each call counts as one fetch error at most, whether it failed or some
 * rows broke the contract (keycache_fetch.c, and here for breaches found
 * as answers are applied); a value that could not be stored counts once
 * more, in apply_answer().
 */
static void
run_batch(PolicyEntry **batch, int n, const PcFetchTarget *target)
{
	BatchRun	run;
	BisectSettings settings;
	BisectPlan *plan;
	const int  *keys;
	int			k;
	MemoryContext oldcxt;

	MemoryContextReset(batch_cxt);
	oldcxt = MemoryContextSwitchTo(batch_cxt);
	prepare_batch(&run, batch, n, target);

	/*
	 * Splitting stops after as long as one call may take; suspects get a
	 * quarter of a batch interval per batch, so that the next batch of clean
	 * keys hardly waits for them.  The plan runs on the real clock: these are
	 * times the worker spends, which debug_advance_clock() does not change.
	 */
	settings.split_budget_ms = pc_fetch_timeout_ms;
	settings.suspect_slice_ms = Max(pc_batch_interval_ms / 4, 1);
	plan = bisect_begin(n, run.suspect, suspect_resume_ms, &settings,
						batch_cxt_alloc, batch_cxt_free);
	while (bisect_next(plan, pc_real_now_ms(), &keys, &k))
		run_call(&run, plan, keys, k);
	settle_unasked(&run, plan);
	bisect_end(plan);
	notify_changes(batch, run.items, run.old_states, run.applied, n);

	MemoryContextSwitchTo(oldcxt);
}

/* How long a key of a cache that opens or closes waits to be asked for. */
#define PC_CACHES_RETRY_MS	100

/* How to ask for a named cache's keys (slot from pc_key_cache()). */
static void
cache_target(const PcCacheReg *reg, int slot, PcFetchTarget *t)
{
	memset(t, 0, sizeof(*t));
	t->cache = slot;
	t->function = reg->fetch_function;
	t->function_oid = reg->function;
	t->function_owner = reg->function_owner;
	t->bind_error = reg->bind_error;
	t->owner = reg->owner;
	t->fetch_role = reg->fetch_role;
	t->key_offset = (uint32) strlen(reg->name) + 1;
	t->timeout_ms = reg->fetch_timeout_ms == PC_CACHE_SETTING_UNSET ?
		pc_fetch_timeout_ms : (int) reg->fetch_timeout_ms;

	/*
	 * One worker fetches for every cache: the cache of an owner who is not a
	 * superuser holds it no longer than the server's fetch_timeout allows,
	 * and never without a bound.
	 */
	if (!reg->owner_is_superuser)
	{
		int			bound = pc_fetch_timeout_ms > 0 ?
			pc_fetch_timeout_ms : PC_CACHE_MAX_FETCH_MS;

		if (t->timeout_ms <= 0 || t->timeout_ms > bound)
			t->timeout_ms = bound;
		t->hard_deadline = true;
		/* (a cache bound to no function calls none) */
		t->overrun_entry = OidIsValid(reg->function) ?
			pc_cache_overrun_entry(reg) : -1;
	}
	t->max_age_ms = reg->expiry_ms == PC_CACHE_SETTING_UNSET ?
		PC_PERIOD_DEFAULT : (int32) reg->expiry_ms;
	t->stale_for_ms = reg->grace_period_ms == PC_CACHE_SETTING_UNSET ?
		PC_PERIOD_DEFAULT : (int32) reg->grace_period_ms;
}

/*
 * Fetch a ready batch, one cache at a time: each named cache's keys with
 * its function, role, timeout and periods, the rest with the server's
 * settings.  A key of a cache that is opening or closing is not asked
 * for: its cache's change evicts it.
 */
static void
run_batches(PolicyEntry **batch, int n)
{
	/* Not in batch_cxt: each run_batch() resets it. */
	MemoryContext oldcxt = MemoryContextSwitchTo(TopMemoryContext);
	int		   *cache = palloc(n * sizeof(int));
	PcCacheReg *regs = palloc(n * sizeof(PcCacheReg));
	PolicyEntry **group = palloc(n * sizeof(PolicyEntry *));
	bool	   *done = palloc0(n * sizeof(bool));

	MemoryContextSwitchTo(oldcxt);

	for (int i = 0; i < n; i++)
		cache[i] = pc_key_cache(batch[i]->key, batch[i]->keylen, &regs[i]);
	for (int i = 0; i < n; i++)
	{
		PcFetchTarget target;
		int			k = 0;
		int			chunk;
		int64		started;
		int64		paused_ms;

		if (done[i])
			continue;
		for (int j = i; j < n; j++)
			if (!done[j] && cache[j] == cache[i])
			{
				group[k++] = batch[j];
				done[j] = true;
			}
		if (cache[i] == PC_CACHE_UNAVAILABLE)
		{
			/* Put back unasked: the cache's change evicts them meanwhile. */
			for (int j = 0; j < k; j++)
			{
				policy_defer_fetch(pc_policy, group[j],
								   pc_now_ms() + PC_CACHES_RETRY_MS);
				mirror_entry(group[j]);
			}
			continue;
		}
		if (cache[i] >= 0 &&
			(paused_ms = pc_cache_paused_ms(&regs[i], pc_real_now_ms())) > 0)
		{
			/* Its function overran its timeout lately: later. */
			for (int j = 0; j < k; j++)
			{
				policy_defer_fetch(pc_policy, group[j], pc_now_ms() + paused_ms);
				mirror_entry(group[j]);
			}
			continue;
		}
		if (cache[i] == PC_CACHE_DEFAULT)
		{
			memset(&target, 0, sizeof(target));
			target.cache = PC_CACHE_DEFAULT;
			target.timeout_ms = pc_fetch_timeout_ms;
			target.max_age_ms = target.stale_for_ms = PC_PERIOD_DEFAULT;
		}
		else
			cache_target(&regs[i], cache[i], &target);

		/*
		 * A cache's own batch_size splits its keys' calls; it cannot make
		 * them larger than projcache.batch_size, which gathers the batch.
		 */
		chunk = k;
		if (cache[i] >= 0 && regs[i].batch_size != PC_CACHE_SETTING_UNSET &&
			regs[i].batch_size < k)
			chunk = (int) Max(regs[i].batch_size, 1);
		started = pc_real_now_ms();
		for (int from = 0; from < k; from += chunk)
		{
			/*
			 * A cache of an owner who is not a superuser gets, per batch, as
			 * much of the worker's time as one call may take: small batches
			 * of slow calls cannot multiply it.  The rest wait for a later
			 * batch.
			 */
			if (from > 0 && target.hard_deadline &&
				pc_real_now_ms() - started >= target.timeout_ms)
			{
				for (int j = from; j < k; j++)
				{
					policy_defer_fetch(pc_policy, group[j],
									   pc_now_ms() + PC_CACHES_RETRY_MS);
					mirror_entry(group[j]);
				}
				break;
			}
			run_batch(group + from, Min(chunk, k - from), &target);
		}
	}
	pfree(cache);
	pfree(regs);
	pfree(group);
	pfree(done);
}

/* ----------------------------------------------------------------
 * After a restart
 * ----------------------------------------------------------------
 */

/* One key's shared state, as rebuild_private_state() found it. */
typedef struct SavedEntry
{
	uint8		state;
	uint8		fetch_state;
	bool		invalidated;
	bool		has_refresh;
	int32		attempts;
	PolicyPeriods periods;
	int64		fetched_at;
	int64		expires_at;
	int64		refresh_at;
	bool		visited;		/* read again: its fetch is demanded */
	int			owner;			/* its role's slot (keys per role) */
} SavedEntry;

/* An entry's state, as the map holds it (a key list's payload). */
static bool
save_entry(PcEntry *entry, void *payload)
{
	SavedEntry *s = payload;
	int32		max_age_ms;
	int32		stale_for_ms;

	s->state = entry->state;
	s->fetch_state = entry->fetch_state;
	s->invalidated = entry->invalidated;
	s->has_refresh = entry->has_refresh;
	s->attempts = entry->attempts;
	pc_entry_periods(entry, &max_age_ms, &stale_for_ms);
	s->periods.max_age_ms = max_age_ms;
	s->periods.stale_for_ms = stale_for_ms;
	s->fetched_at = entry->fetched_at;
	s->expires_at = pc_entry_expires_at(entry);
	s->refresh_at = pc_entry_refresh_at(entry);
	s->visited = pc_entry_visited(entry);
	s->owner = entry->owner;
	return true;
}

/* Give the worker one key as the shared map holds it. */
static void
restore_saved_key(const char *key, uint32 len, const SavedEntry *s,
				  int64 now)
{
	PolicyEntry *e;

	if (s->state != PC_STATE_PENDING)
	{
		int64		expires_at = s->expires_at;

		if (expires_at == 0)
			expires_at = s->fetched_at +
				policy_period(s->periods.max_age_ms, pc_expiry_ms) +
				policy_period(s->periods.stale_for_ms, pc_grace_period_ms);
		policy_restore_complete(pc_policy, key, len, s->fetched_at, expires_at,
								&s->periods, s->has_refresh, s->refresh_at);
		if (s->invalidated)
			policy_invalidate(pc_policy, key, len, now);
		else if (s->fetch_state != PC_FETCH_COMPLETE)
			policy_try_begin_fetch(pc_policy, key, len, false, now);
	}
	else
		policy_try_begin_fetch(pc_policy, key, len, false, now);
	e = policy_lookup(pc_policy, key, len);
	if (e == NULL)
		return;
	if (s->attempts > 0 && !s->invalidated)
		policy_resume_backoff(pc_policy, e, s->attempts, now);
	pc_weigh_new_key(e);
	/* Its fetch, if any, waits for its creator's turn. */
	policy_set_owner(pc_policy, e, (uint32) s->owner);
	policy_set_flow(pc_policy, e, pc_role_of_slot(s->owner));
	if (s->visited && e->state == POLICY_IN_PROGRESS)
		policy_note_demand(pc_policy, e);
	mirror_entry(e);
}

/*
 * After a restart, rebuild the private state from the shared map: keys with
 * a value resume their eviction and refresh schedule; keys without one, or
 * whose fetch was cut short, are fetched.
 */
static void
rebuild_private_state(int64 now)
{
	PcKeyList	list;
	int			i;

	pc_keylist_init(&list, sizeof(SavedEntry));
	pc_keylist_from_map(&list, NULL, save_entry);

	/*
	 * Without every key it can neither evict nor refresh them: it exits, and
	 * says why, as each next worker fails the same way until memory is found.
	 */
	if (list.oom)
		ereport(FATAL,
				(errcode(ERRCODE_OUT_OF_MEMORY),
				 errmsg("out of memory"),
				 errdetail("The projcache scheduler could list only %d of the " UINT64_FORMAT " keys of the shared map to rebuild its state, and exits.",
						   list.count,
						   pc_keymap_count()),
				 errhint("Make more memory available to the server, or lower projcache.max_memory.")));
	for (i = 0; i < list.count; i++)
		restore_saved_key(list.keys[i], list.lens[i],
						  pc_keylist_payload(&list, i), now);
	if (list.count > 0)
		ereport(LOG,
				(errmsg_plural("scheduler rebuilt the state of %d cached key",
							   "scheduler rebuilt the state of %d cached keys",
							   list.count, list.count)));
}

/* ----------------------------------------------------------------
 * The key map's dump (keycache_dump.c)
 * ----------------------------------------------------------------
 */

/*
 * A key loaded from the dump: cached, stale, evicted on its own schedule,
 * in the FIFO it was in (keys come in the order the dump walked them).
 */
static void
restore_loaded_key(const char *key, uint32 len, int64 fetched_at,
				   int64 expires_at, int32 max_age_ms, int32 stale_for_ms,
				   PcDumpFifo fifo)
{
	PolicyPeriods periods = {max_age_ms, stale_for_ms};
	PolicyEntry *e = policy_restore_complete(pc_policy, key, len, fetched_at,
											 expires_at, &periods, false, 0);

	if (fifo != PC_DUMP_FIFO_UNKNOWN)
		policy_restore_fifo(pc_policy, e, fifo == PC_DUMP_FIFO_MAIN);
	pc_weigh_new_key(e);
	mirror_entry(e);
}

/*
 * The dump's keys, in the order eviction would keep them, so that a load
 * that stops at the memory bound leaves out what eviction would have taken
 * first.  arg holds the last key given.
 */
static const char *
next_key_to_dump(void *arg, uint32 *len, PcDumpFifo *fifo)
{
	PolicyEntry **last = (PolicyEntry **) arg;

	*last = policy_keep_order_next(pc_policy, *last);
	if (*last == NULL)
		return NULL;
	*len = (uint32) (*last)->keylen;
	*fifo = (*last)->in_main ? PC_DUMP_FIFO_MAIN : PC_DUMP_FIFO_SMALL;
	return (*last)->key;
}

/* Begin a dump of the keys, in the worker's order once it has one. */
static PcKeyDump *
begin_key_dump(void)
{
	PolicyEntry *last = NULL;

	if (pc_policy == NULL)
		return pc_keys_dump_begin(NULL, NULL);
	return pc_keys_dump_begin(next_key_to_dump, &last);
}

/*
 * The named caches' registry, published before the dump is loaded: the
 * dump brings a named cache's keys back only into that very cache.  A
 * registry that cannot be read now (its table locked) is tried a few
 * times; after that the dump is loaded without it, leaving out every key
 * of a prefix that could be a cache's.
 */
static void
publish_registry_before_load(void)
{
	for (int attempt = 0; attempt < 10 && !pc_caches_published(); attempt++)
	{
		if (attempt > 0)
		{
			(void) WaitLatch(MyLatch,
							 WL_LATCH_SET | WL_TIMEOUT | WL_EXIT_ON_PM_DEATH,
							 100, pc_wait_event(PC_WAIT_WORKER));
			ResetLatch(MyLatch);
			CHECK_FOR_INTERRUPTS();
		}
		pc_caches_reload(pc_real_now_ms(), pc_evict_cache_keys);
	}
	pc_apply_cache_settings();
}

/*
 * Load the dump, once per server start: the first worker does, before
 * its first fetch; one restarted later finds the map warm already.  (The
 * snapshots' dump was adopted at the server's start, in shmem.c.)
 */
static void
load_dump_once(void)
{
	bool		first;

	first = pc_keys_dump_claim_read();
	if (first && pc_dump_interval_s >= 0)
	{
		publish_registry_before_load();
		(void) pc_keys_load_dump(restore_loaded_key);
	}
	else if (!first)
		pc_keys_tombstones_resume();
	/* Readers waiting for the dump's keys read on (keycache_dump.c). */
	pc_keys_restore_end();
}

/* The dump's next slice waits as long as the one begun at start took. */
static void
rest_after_slice(int64 start)
{
	int64		end = pc_real_now_ms();

	dump_resume_ms = end + (end - start);
}

/*
 * Every dump_interval, write a dump a slice at a time: each call writes
 * for at most a batch interval, so that fetches go on in between, and the
 * next slice waits as long as this one took.  The dump is CPU work (most
 * of it the kernel copying the file into the page cache), so this bounds
 * it to half a CPU, which readers on a busy server get back; a dump of a
 * million keys takes seconds, far below any dump_interval.  Returns
 * whether a dump is under way (the caller sleeps until dump_resume_ms at
 * most).
 */
static bool
dump_step(void)
{
	int64		real_now = pc_real_now_ms();

	if (key_dump == NULL && pc_dump_interval_s > 0 && real_now >= next_dump_ms)
	{
		next_dump_ms = real_now + (int64) pc_dump_interval_s * 1000;
		/* The snapshots are small: written at once, beside the keys. */
		pc_snap_dump_all();
		key_dump = begin_key_dump();
		/* Listing the keys was the first slice. */
		rest_after_slice(real_now);
		return key_dump != NULL;
	}
	if (key_dump == NULL)
		return false;
	if (real_now < dump_resume_ms)
		return true;
	if (pc_keys_dump_step(key_dump, real_now + Max(pc_batch_interval_ms, 10)))
	{
		pc_keys_dump_end(key_dump, false);
		key_dump = NULL;
	}
	else
		rest_after_slice(real_now);
	return key_dump != NULL;
}

/*
 * before_shmem_exit: dump the whole map as the worker ends (a shutdown, or
 * its termination), unless dumps are off.  Not after a crash, which runs
 * no exit callbacks: the last periodic dump is what a restart loads.
 */
static void
dump_at_exit(int code, Datum arg)
{
	PcKeyDump  *d;

	if (key_dump != NULL)
	{
		pc_keys_dump_end(key_dump, true);
		key_dump = NULL;
	}
	if (pc_dump_interval_s < 0)
		return;
	/* Exiting on an ERROR: no lock of ours may stay held while we read. */
	LWLockReleaseAll();
	pc_snap_dump_all();
	d = begin_key_dump();
	if (d == NULL)
		return;
	while (!pc_keys_dump_step(d, PG_INT64_MAX))
		;
	pc_keys_dump_end(d, false);
}

/* ----------------------------------------------------------------
 * The main loop
 * ----------------------------------------------------------------
 */

/*
 * One worker at a time: it alone deletes keys and frees their chunks.
 * A launcher started again while its worker lived on waits for it
 * (keycache_launcher.c); this is the last word, under the mutex.
 */
static void
take_worker_place(void)
{
	SpinLockAcquire(&worker_shared->mutex);
	if (worker_shared->pid != 0)
	{
		int			other = worker_shared->pid;

		SpinLockRelease(&worker_shared->mutex);
		ereport(LOG,
				(errmsg("projcache scheduler not started: the scheduler with PID %d is running",
						other)));
		proc_exit(0);
	}
	worker_shared->latch = MyLatch;
	worker_shared->pid = MyProcPid;
	SpinLockRelease(&worker_shared->mutex);
	on_shmem_exit(worker_detach_latch, (Datum) 0);
}

/*
 * The worker's memory and settings, its private state rebuilt from the
 * shared map, and the dump loaded once per server start.
 */
static void
worker_start(void)
{
	policy_cxt = AllocSetContextCreate(TopMemoryContext, "projcache key policy",
									   ALLOCSET_DEFAULT_SIZES);
	batch_cxt = AllocSetContextCreate(TopMemoryContext, "projcache batch",
									  ALLOCSET_DEFAULT_SIZES);
	ring_buf = MemoryContextAlloc(TopMemoryContext, pc_ring_size());
	load_settings();
	policy_scan_pace_init(&scan_pace);

	MemoryContextSwitchTo(batch_cxt);
	rebuild_private_state(pc_now_ms());
	load_dump_once();
	before_shmem_exit(dump_at_exit, (Datum) 0);
	next_dump_ms = pc_real_now_ms() + (int64) pc_dump_interval_s * 1000;
	pc_replay_init();
	ereport(LOG,
			(errmsg("projcache scheduler ready in database \"%s\"",
					pc_database)));
	/* Requests may have been left while no worker ran: look for them. */
	pc_ring_note_overflow();
	MemoryContextReset(batch_cxt);
}

/* SIGHUP: read the settings again. */
static void
reload_settings(void)
{
	ConfigReloadPending = false;
	ProcessConfigFile(PGC_SIGHUP);
	load_settings();
	/* A shorter dump_interval counts from now, not from the old one. */
	if (pc_dump_interval_s > 0)
		next_dump_ms = Min(next_dump_ms, pc_real_now_ms() +
						   (int64) pc_dump_interval_s * 1000);
}

/*
 * Sleep on the latch until the next timer, the next poll (poll_ms: the WAL
 * replay's or the named caches' registry's, whichever comes first; or -1)
 * or the dump's next slice is due, or a reader's request sets the latch.
 */
static void
sleep_until_due(int64 now, long poll_ms, bool dumping)
{
	PolicyTime	wake;
	long		timeout = PC_MAX_SLEEP_MS;

	if (policy_next_wakeup(pc_policy, pc_batch_interval_ms, &wake))
		timeout = (long) Max(0, Min(wake - now, PC_MAX_SLEEP_MS));
	if (poll_ms >= 0)
		timeout = Min(timeout, poll_ms);
	/* A scan for request bits that its pace put off. */
	if (scan_wanted)
		timeout = Min(timeout, (long) policy_scan_wait(&scan_pace,
													   pc_real_now_ms()));
	/* Admission closed opens at the next stamp unit. */
	if (pg_atomic_read_u32(&worker_shared->admission_closed) != 0)
		timeout = Min(timeout, PC_STAMP_MS - now % PC_STAMP_MS);
	if (dumping)
		timeout = Min(timeout, Max(0, dump_resume_ms - pc_real_now_ms()));
	else if (pc_dump_interval_s > 0)
		timeout = Min(timeout, Max(0, next_dump_ms - pc_real_now_ms()));
	if (timeout > 0)
	{
		(void) WaitLatch(MyLatch,
						 WL_LATCH_SET | WL_TIMEOUT | WL_EXIT_ON_PM_DEATH,
						 timeout, pc_wait_event(PC_WAIT_WORKER));
		ResetLatch(MyLatch);
	}
}

/*
 * Entry point of the "projcache scheduler" worker.  It connects to
 * projcache.database, takes the worker's place in shared memory, rebuilds
 * its private state from the shared map, and then loops: take requests,
 * fire due timers, fetch a ready batch, else sleep on its latch until the
 * next timer (or a reader's request) is due.  SIGTERM ends it through
 * die(), also in the middle of a fetch; SIGHUP reloads the settings.
 */
void
pc_worker_main(Datum main_arg)
{
	pqsignal(SIGHUP, SignalHandlerForConfigReload);
	pqsignal(SIGTERM, die);
	BackgroundWorkerUnblockSignals();

	pc_keycache_worker_connect(pc_database);
	pgstat_report_appname("projcache scheduler");

	pc_attach();
	take_worker_place();
	worker_start();

	for (;;)
	{
		int64		now;
		PolicyEntry **batch;
		int			n;
		long		replay_poll;
		long		caches_poll;
		bool		dumping;

		/*
		 * A query cancel (pg_cancel_backend, or a statement timeout that
		 * fired just as a fetch ended) only means something during a fetch,
		 * where keycache_fetch.c catches it; here it must not end the worker.
		 */
		QueryCancelPending = false;
		CHECK_FOR_INTERRUPTS();
		/* the disabled keys' tombstones of the last pass */
		pc_keys_tombstones_sync();
		if (ConfigReloadPending)
			reload_settings();

		MemoryContextSwitchTo(batch_cxt);
		caches_poll = PC_MAX_SLEEP_MS;
		if (pc_caches_reload_due(pc_real_now_ms(), &caches_poll))
		{
			pc_caches_reload(pc_real_now_ms(), pc_evict_cache_keys);
			pc_apply_cache_settings();
			caches_poll = PC_MAX_SLEEP_MS;
			(void) pc_caches_reload_due(pc_real_now_ms(), &caches_poll);
		}
		replay_poll = pc_replay_poll(refetch_replayed);
		now = pc_now_ms();
		pc_admission_tick(now);
		process_requests(now);
		drop_fetches_for_nobody();
		process_timers(now);
		pc_evict_for_memory();
		pc_evict_for_roles();
		create_refused_keys(now);
		dumping = dump_step();
		n = policy_ready_batch(pc_policy, now, pc_batch_size, pc_batch_interval_ms,
							   &batch);
		if (n > 0)
		{
			run_batches(batch, n);
			continue;
		}
		MemoryContextReset(batch_cxt);
		sleep_until_due(now, Min(replay_poll < 0 ? caches_poll : replay_poll,
								 caches_poll), dumping);
	}
}
