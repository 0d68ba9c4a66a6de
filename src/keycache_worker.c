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
#include "pgstat.h"
#include "postmaster/bgworker.h"
#include "postmaster/interrupt.h"
#include "storage/ipc.h"
#include "storage/proc.h"
#include "tcop/tcopprot.h"
#include "utils/memutils.h"

#include "keycache_caches.h"
#include "keycache_worker.h"
#include "snapshot.h"
#include "stream_worker.h"
#include "wal.h"

/* Longest sleep, in case a wakeup is ever missed. */
#define PC_MAX_SLEEP_MS		10000


StaticAssertDecl(PC_PERIOD_DEFAULT == POLICY_PERIOD_DEFAULT,
				 "the shared map and the policy encode periods alike");

Policy	   *pc_policy = NULL;
static MemoryContext policy_cxt = NULL; /* the key policy's private state */
MemoryContext pc_batch_cxt = NULL;	/* reset after each batch */
static PcKeyDump *key_dump = NULL;	/* a dump being written, slice by slice */
static int64 next_dump_ms = 0;	/* on pc_real_now_ms() */
static int64 dump_resume_ms = 0;	/* the dump's next slice, not before */
static char *ring_buf = NULL;
static Size ring_len = 0;		/* drained into ring_buf, not yet acted on */
static PolicyScanPace scan_pace;	/* of the scans for request bits, on
									 * pc_real_now_ms() */
static bool scan_wanted = false;	/* the ring overflowed since the last */


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

/* The header fields pc_mirror_entry() writes (a PcEntryApplyFn). */
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
void
pc_mirror_entry(PolicyEntry *e)
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
void
pc_tombstone_unless_disabled(const char *key, uint32 len)
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
		pc_mirror_entry(e);
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
		pc_mirror_entry(e);
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
		PcRingRecord rec;

		off = pc_ring_record(ring_buf, off, &rec);
		handle_request(rec.key, rec.len, rec.role, now);
	}
	ring_len = n;

	if (pc_ring_take_overflow())
		scan_wanted = true;
	if (scan_wanted)
		scan_requests(now);
}

/*
 * Create the keys that readers found no room for (refused records), once
 * eviction has made room, and begin their fetches, as the readers' own
 * requests would have: a service warming its cache reads every key once,
 * then waits for each, and a key it could not create would otherwise be
 * fetched alone when its wait comes.  Room that runs out meanwhile is made
 * again; a key still without room, or asked for while admission is closed
 * ("Admission"), or whose cache closed since, is left to its next read.
 * In a transaction: counting a key for its role reads the catalog.
 */
static void
create_refused_keys(int64 now)
{
	MemoryContext cxt = CurrentMemoryContext;
	bool		in_xact = false;
	Size		off = 0;

	while (off < ring_len)
	{
		PcRingRecord rec;
		const char *key;
		uint32		len;
		Oid			role;

		off = pc_ring_record(ring_buf, off, &rec);
		key = rec.key;
		len = rec.len;
		role = rec.role;

		/*
		 * While admission is closed, they are left to their next reads; so is
		 * a key of a cache that closed since its reader asked.
		 */
		if (rec.refused &&
			pg_atomic_read_u32(&worker_shared->admission_closed) == 0 &&
			pc_cache_of(rec.cache, NULL) != PC_CACHE_UNAVAILABLE)
		{
			PcEntry    *entry;
			bool		created;

			if (!in_xact)
			{
				StartTransactionCommand();
				MemoryContextSwitchTo(cxt);
				in_xact = true;
			}
			entry = pc_keymap_find_or_create_for(key, len, role, rec.cache,
												 &created);
			if (entry == NULL)
			{
				/* room runs out again: make more, as a reader would ask */
				pc_evict_for_memory();
				pc_evict_for_roles();
				entry = pc_keymap_find_or_create_for(key, len, role,
													 rec.cache, &created);
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
			pc_mirror_entry(e);
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
		pc_mirror_entry(e);
	}
}

void
pc_count_delay(PolicyEntry *e)
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
	pc_mirror_entry(e);
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
	pc_mirror_entry(e);
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
	pc_batch_cxt = AllocSetContextCreate(TopMemoryContext, "projcache batch",
										 ALLOCSET_DEFAULT_SIZES);
	ring_buf = MemoryContextAlloc(TopMemoryContext, pc_ring_size());
	load_settings();
	policy_scan_pace_init(&scan_pace);

	MemoryContextSwitchTo(pc_batch_cxt);
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
	MemoryContextReset(pc_batch_cxt);
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
		long		streams_poll;
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

		MemoryContextSwitchTo(pc_batch_cxt);
		caches_poll = PC_MAX_SLEEP_MS;
		if (pc_caches_reload_due(pc_real_now_ms(), &caches_poll))
		{
			pc_caches_reload(pc_real_now_ms(), pc_evict_cache_keys);
			pc_apply_cache_settings();
			caches_poll = PC_MAX_SLEEP_MS;
			(void) pc_caches_reload_due(pc_real_now_ms(), &caches_poll);
		}
		replay_poll = pc_replay_poll(refetch_replayed);
		/* the streams' workers started and stopped (stream_worker.c) */
		streams_poll = pc_streams_tick();
		if (streams_poll >= 0)
			caches_poll = Min(caches_poll, streams_poll);
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
			pc_run_batches(batch, n);
			continue;
		}
		MemoryContextReset(pc_batch_cxt);
		sleep_until_due(now, Min(replay_poll < 0 ? caches_poll : replay_poll,
								 caches_poll), dumping);
	}
}
