/*-------------------------------------------------------------------------
 *
 * keycache_sql.c
 *	  SQL functions of the key cache: get, lookup, fetch, invalidate, evict,
 *	  and the entries and stats views.
 *
 * A read takes the key's map partition lock in shared mode, copies what
 * it needs, and releases it.  A fresh hit does nothing else: no request,
 * no latch.  Unknown, stale and expired keys leave a request bit on the
 * entry and tell the worker (keycache_map.c, keycache_ring.c); the reader
 * never waits for a fetch unless asked to, and then on the key's condition
 * variable; the one exception is a read right after a start, which waits
 * (at most projcache.restore_wait) for the key dump to be loaded
 * (keycache_dump.c).  Nothing of ours that can ERROR runs under a
 * partition lock: copies use MCXT_ALLOC_NO_OOM and failures are reported
 * after the release.
 *
 * A new key counts for the role that created it, and a fetch asked for
 * waits for the asking role's turn: both are the current role outside
 * SECURITY DEFINER functions (GetOuterUserId), so that a function reading
 * keys for its callers spends their share, not its owner's.
 *
 * Copyright (c) 2026, projcache developers
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/xact.h"
#include "common/int.h"
#include "funcapi.h"
#include "miscadmin.h"
#include "utils/builtins.h"
#include "utils/jsonb.h"

#include "keycache.h"
#include "keycache_caches.h"
#include "keycache_policy.h"
#include "snapshot.h"

/* How often a read that waits looks whether a cache opened or closed. */
#define PC_CACHES_POLL_WAIT_MS	50

PG_FUNCTION_INFO_V1(projcache_check_preloaded);
PG_FUNCTION_INFO_V1(projcache_get);
PG_FUNCTION_INFO_V1(projcache_get_wait);
PG_FUNCTION_INFO_V1(projcache_lookup);
PG_FUNCTION_INFO_V1(projcache_fetch);
PG_FUNCTION_INFO_V1(projcache_entries);
PG_FUNCTION_INFO_V1(projcache_stats);
PG_FUNCTION_INFO_V1(projcache_reset_stats);

/* What a reader copied out of one entry. */
typedef struct PcRead
{
	bool		found;			/* false: the key was just created */
	uint8		state;			/* PcKeyState */
	uint8		fetch_state;	/* PcFetchState */
	bool		invalidated;
	bool		awaiting_commit;
	bool		has_refresh;
	int32		attempts;
	int32		max_age_ms;		/* or PC_PERIOD_DEFAULT */
	int32		stale_for_ms;
	int64		fetched_at;
	int64		expires_at;
	int64		refresh_at;
	int64		retry_at;
	uint32		value_bytes;
	Jsonb	   *config;			/* NULL unless enabled */
	char	   *revision;		/* details only */
	char	   *last_error;		/* details only */
	bool		visited;		/* read since the eviction last looked */
	PcCacheId	cache;			/* the cache it is of */
	bool		oom;			/* a copy failed under the lock */
} PcRead;

/* ----------------------------------------------------------------
 * Reading a key: get() and lookup()
 * ----------------------------------------------------------------
 */

/*
 * Copy what a reader needs from an entry.  Caller holds the entry's lock;
 * nothing here may raise an ERROR (failed copies set r->oom).
 */
static void
copy_entry(PcEntry *entry, bool details, bool want_config, PcRead *r)
{
	PcEntryValue v;

	PC_ASSERT_ENTRY_LOCKED();
	r->visited = pc_entry_visited(entry);
	r->cache = entry->cache;
	r->state = entry->state;
	r->fetch_state = entry->fetch_state;
	r->invalidated = entry->invalidated;
	r->awaiting_commit = entry->awaiting_commit;
	r->has_refresh = entry->has_refresh;
	r->attempts = entry->attempts;
	r->fetched_at = entry->fetched_at;
	r->expires_at = pc_entry_expires_at(entry);
	r->refresh_at = pc_entry_refresh_at(entry);
	r->retry_at = details ? pc_entry_retry_at(entry) : 0;
	r->revision = NULL;
	r->last_error = NULL;
	r->oom = false;
	pc_entry_read_value(entry, want_config && entry->state == PC_STATE_ENABLED,
						&v, &r->oom);
	r->max_age_ms = v.max_age_ms;
	r->stale_for_ms = v.stale_for_ms;
	r->value_bytes = v.config_len;
	r->config = (Jsonb *) v.config;
	if (details)
	{
		r->revision = pc_entry_revision(entry, &r->oom);
		r->last_error = pc_entry_error(entry, &r->oom);
		if (r->last_error == NULL && entry->error_unstored)
			r->last_error = PC_UNSTORED_ERROR;
	}
}

/* The key's own periods, or the settings' when it has none. */
static int64
read_max_age(const PcRead *r)
{
	return policy_period(r->max_age_ms, pc_expiry_ms);
}

static int64
read_stale_for(const PcRead *r)
{
	return policy_period(r->stale_for_ms, pc_grace_period_ms);
}

static PolicyFreshness
read_freshness(const PcRead *r, int64 now)
{
	PolicyFreshness f = policy_freshness(r->fetched_at, now, read_max_age(r),
										 read_stale_for(r));

	if (r->invalidated && f == POLICY_FRESH)
		f = POLICY_STALE;
	return f;
}

/*
 * Reads are counted in this backend and added to the shared counters in
 * batches: at the end of each transaction, every READ_FLUSH_EVERY reads,
 * and before the counters are shown.  A hot loop of get() calls then does
 * not write a cache line that every core shares on each call.
 */
#define READ_FLUSH_EVERY	256

static uint64 local_reads[3];	/* hits, misses, pending reads */
static int	local_read_count = 0;
static bool read_callback_registered = false;

static void
flush_read_counts(void)
{
	if (local_reads[0] > 0)
		pc_count(PC_CTR_HITS, local_reads[0]);
	if (local_reads[1] > 0)
		pc_count(PC_CTR_MISSES, local_reads[1]);
	if (local_reads[2] > 0)
		pc_count(PC_CTR_PENDING_READS, local_reads[2]);
	memset(local_reads, 0, sizeof(local_reads));
	local_read_count = 0;
}

static void
flush_read_counts_at_xact_end(XactEvent event, void *arg)
{
	if (local_read_count > 0 && pc_loaded())
		flush_read_counts();
}

static void
count_read(PcCounter counter)
{
	if (!read_callback_registered)
	{
		RegisterXactCallback(flush_read_counts_at_xact_end, NULL);
		read_callback_registered = true;
	}
	local_reads[counter == PC_CTR_HITS ? 0 :
				counter == PC_CTR_MISSES ? 1 : 2]++;
	if (++local_read_count >= READ_FLUSH_EVERY)
		flush_read_counts();
}

/* A key read as pending, unknown: its cache opens or closes. */
static void
read_pending(PcRead *r)
{
	memset(r, 0, sizeof(PcRead));
	r->state = PC_STATE_PENDING;
	r->fetch_state = PC_FETCH_PENDING;
}

/*
 * Read a key of cache (as pc_key_cache_for_read() resolved it): the get()
 * and lookup() path.  Unknown keys are created pending, for that cache;
 * unknown, pending, stale and expired keys get a fetch requested unless
 * one is under way.  Counts the read.  A reader that will wait for the key
 * (waiting) creates it even while admission is closed: it waits for one
 * key at a time, so it cannot outrun the fetches.  An entry of another
 * cache reads as pending, and is left alone: the caches changed since the
 * key was resolved, which the caller sees by their generation and reads
 * again, and the worker evicts it before the cache it is of opens again.
 */
static void
read_key(const char *key, uint32 len, PcCacheId cache, bool details,
		 bool waiting, PcRead *r)
{
	PcKey		search = pc_search_key(key, len);
	PcEntry    *entry;
	bool		send = false;
	bool		first_visit = false;
	int64		now = pc_now_ms();

	entry = pc_entry_find(&search, false);
	if (entry == NULL)
	{
		bool		created = false;

		/*
		 * While admission is closed (keycache_worker.c, "Admission"), every
		 * value that could make room for a new key is being read: ask for the
		 * key without creating it, unless the reader waits for it.
		 */
		if (waiting || !pc_worker_admission_closed())
			entry = pc_keymap_find_or_create_for(key, len, GetOuterUserId(),
												 cache, &created);
		if (entry == NULL)
		{
			/*
			 * No room, in memory or in the role's
			 * projcache.max_keys_per_role, or admission closed: read as a
			 * pending key; the worker makes room, or creates it once it may.
			 */
			read_pending(r);
			pc_count(PC_CTR_REFUSED_READS, 1);
			pc_request_send_refused(key, len, cache);
			return;
		}
		r->found = !created;
	}
	else
		r->found = true;
	if (entry->cache != cache)
	{
		pc_entry_release(entry);
		read_pending(r);
		return;
	}
	if (r->found)
	{
		/*
		 * S3-FIFO: mark it read, writing only when it is not marked yet: a
		 * hit writes at most this one shared cache line.
		 */
		first_visit = pc_entry_visit(entry, now);
	}

	copy_entry(entry, details, true, r);
	/* A standby waiting for an invalidation's commit refetches it then. */
	if (r->fetch_state != PC_FETCH_IN_PROGRESS && !r->awaiting_commit &&
		(r->state == PC_STATE_PENDING ||
		 read_freshness(r, now) != POLICY_FRESH))
		send = pc_request_mark(entry, PC_REQ_FETCH);
	else if (first_visit && r->state == PC_STATE_PENDING)
	{
		/* Read again while its fetch waits: tell the worker, once. */
		send = pc_request_mark(entry, PC_REQ_DEMAND);
	}
	pc_entry_release(entry);

	/* A request bit set must reach the worker, whatever happens next. */
	if (send)
		pc_request_send(key, len);
	if (r->oom)
		pc_report_oom("a cached value");

	if (!r->found)
		count_read(PC_CTR_MISSES);
	else if (r->state == PC_STATE_PENDING)
		count_read(PC_CTR_PENDING_READS);
	else
		count_read(PC_CTR_HITS);
}

/*
 * Sleep on a key's condition variable until done(key, len, arg) says so or
 * wait_ms have passed; returns whether it did.  The worker broadcasts on it
 * whenever it changes the key.  The timeout is per sleep, and other keys
 * share the variable, so the deadline is checked on every wake-up.
 */
bool
pc_wait_on_key(const char *key, uint32 len, int64 wait_ms,
			   bool (*done) (const char *key, uint32 len, void *arg), void *arg)
{
	ConditionVariable *cv = pc_key_cv(key, len);
	int64		deadline = pc_real_now_ms() + wait_ms;
	bool		result;

	ConditionVariablePrepareToSleep(cv);
	for (;;)
	{
		int64		remaining;

		result = done(key, len, arg);
		remaining = deadline - pc_real_now_ms();
		if (result || remaining <= 0)
			break;

		/*
		 * (at most PC_CACHES_POLL_WAIT_MS: a key whose cache opens or closes
		 * meanwhile is not broadcast)
		 */
		(void) ConditionVariableTimedSleep(cv,
										   (long) Min(remaining,
													  PC_CACHES_POLL_WAIT_MS),
										   pc_wait_event(PC_WAIT_KEY));
	}
	ConditionVariableCancelSleep();
	return result;
}

/*
 * A reader is about to wait for a pending key: its fetch must not wait behind
 * keys read once (keycache_policy.h, "Fair fetching").  Marks the key read
 * again, as a second reader would, and waited for (PC_MARK_WAITED).  The worker is told when the demand is new,
 * and once more when the first reader that is not the key's creator waits for
 * it (PC_REQ_DEMAND_OTHER): its role may be the one whose turn comes first.
 * Not on every wait, so that one role looping on a pending key cannot fill the
 * request ring (which would send the worker scanning the whole map).
 */
static void
demand_key(const char *key, uint32 len)
{
	PcKey		search = pc_search_key(key, len);
	PcEntry    *entry;
	bool		send;
	int			creator;

	entry = pc_entry_find(&search, false);
	if (entry == NULL)
		return;
	(void) pc_entry_visit(entry, pc_now_ms());
	if (entry->state == PC_STATE_PENDING &&
		(pg_atomic_read_u32(&entry->marks) & PC_MARK_WAITED) == 0)
		pg_atomic_fetch_or_u32(&entry->marks, PC_MARK_WAITED);
	creator = entry->owner;
	send = pc_request_mark(entry, PC_REQ_DEMAND |
						   (pc_role_of_slot(creator) == GetOuterUserId() ?
							0 : PC_REQ_DEMAND_OTHER));
	pc_entry_release(entry);
	if (send)
		pc_request_send(key, len);
}

/* What wait_for_key() reads into. */
typedef struct KeyWait
{
	bool		details;
	PcRead	   *r;
} KeyWait;


/*
 * For pc_wait_on_key(): read the key; done once it is no longer pending.  A
 * cache may have been made or dropped over the key's prefix while the
 * reader slept, and its value fetched by that cache's function: the rights
 * are checked again at each look, and the look is taken again if the
 * caches changed during it.
 */
static bool
key_settled(const char *key, uint32 len, void *arg)
{
	KeyWait    *w = (KeyWait *) arg;
	PcKey		search = pc_search_key(key, len);
	PcEntry    *entry;
	uint64		generation;
	PcCacheId	cache;

	do
	{
		generation = pc_caches_generation();
		if (pc_key_cache_for_read(key, len, &cache) == PC_CACHE_UNAVAILABLE)
		{
			read_pending(w->r);
			return false;
		}
		entry = pc_entry_find(&search, false);
		if (entry == NULL)
		{
			/* Evicted meanwhile: read (and re-create) it as a reader would. */
			read_key(key, len, cache, w->details, true, w->r);
		}
		else if (entry->cache != cache)
		{
			/* Another cache's, until the worker evicts it: pending. */
			pc_entry_release(entry);
			read_pending(w->r);
		}
		else
		{
			copy_entry(entry, w->details, true, w->r);
			pc_entry_release(entry);
		}
	} while (pc_caches_generation() != generation);
	/* A failed copy is reported once the sleep is over. */
	return w->r->oom || w->r->state != PC_STATE_PENDING;
}

/* Wait, up to wait_ms, until a pending key is no longer pending. */
static void
wait_for_key(const char *key, uint32 len, int64 wait_ms, bool details,
			 PcRead *r)
{
	KeyWait		w = {details, r};

	(void) pc_wait_on_key(key, len, wait_ms, key_settled, &w);
	if (r->oom)
		pc_report_oom("a cached value");
}

static int64
wait_arg_ms(Interval *wait)
{
	int64		usecs;

	int64		days = (int64) wait->month * DAYS_PER_MONTH + wait->day;

	/* Long waits are capped (at INT_MAX ms), so clamp before multiplying. */
	if (days > 30 * 365)
		days = 30 * 365;
	else if (days < -30 * 365)
		days = -30 * 365;
	if (pg_add_s64_overflow(wait->time, days * USECS_PER_DAY, &usecs))
		usecs = wait->time > 0 ? PG_INT64_MAX : -1;
	if (usecs < 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("wait must not be negative")));
	return Min(usecs / 1000, (int64) INT_MAX);
}

/*
 * For pc_wait_on_key(): is the key in the map with a value, or has the key
 * dump's load ended?
 */
static bool
key_restored(const char *key, uint32 len, void *arg)
{
	PcKey		search;
	PcEntry    *entry;
	bool		valued;

	if (!pc_keys_restoring())
		return true;
	search = pc_search_key(key, len);
	entry = pc_entry_find(&search, false);
	if (entry == NULL)
		return false;
	valued = entry->state != PC_STATE_PENDING;
	pc_entry_release(entry);
	return valued;
}

/*
 * Right after a start, until the worker has loaded the key dump, a key
 * the dump holds may not be in the map yet: wait for it (at most
 * projcache.restore_wait, counted for all reads from the first), rather
 * than read it as unknown.  The key is neither created nor asked for
 * meanwhile: if the dump holds it, it comes with its value.
 */
static void
wait_for_dump(const char *key, uint32 len)
{
	int64		left;

	if (!pc_keys_restoring() || pc_restore_wait_ms <= 0)
		return;
	left = pc_keys_restore_wait_left();
	if (left > 0)
		(void) pc_wait_on_key(key, len, left, key_restored, NULL);
}

/*
 * Wait, until deadline (on pc_real_now_ms()), for the published caches to
 * change from generation: a cache that opens or closes does between two
 * of the worker's batches.  Nothing broadcasts it, so this polls every
 * PC_CACHES_POLL_WAIT_MS.  True if they changed.
 */
static bool
wait_for_caches_change(uint64 generation, int64 deadline)
{
	for (;;)
	{
		int64		left = deadline - pc_real_now_ms();

		if (pc_caches_generation() != generation)
			return true;
		if (left <= 0)
			return false;
		(void) WaitLatch(MyLatch, WL_LATCH_SET | WL_TIMEOUT | WL_EXIT_ON_PM_DEATH,
						 (long) Min(left, PC_CACHES_POLL_WAIT_MS),
						 pc_wait_event(PC_WAIT_KEY));
		ResetLatch(MyLatch);
		CHECK_FOR_INTERRUPTS();
	}
}

static void
read_with_wait(text *keyarg, int64 wait_ms, bool details, PcRead *r,
			   const char **key, uint32 *len)
{
	int			cache;
	PcCacheId	cache_id;
	uint64		generation;
	int64		deadline;

	pc_require_loaded();
	pc_check_key(keyarg, key, len);
	wait_for_dump(*key, *len);
	deadline = pc_real_now_ms() + wait_ms;

	/*
	 * The rights checked, then the key read; again if the caches changed in
	 * between (a cache made over its prefix, whose function's value the read
	 * would otherwise serve without the cache's grant).
	 */
	do
	{
		generation = pc_caches_generation();
		cache = pc_key_cache_for_read(*key, *len, &cache_id);
		if (cache == PC_CACHE_UNAVAILABLE)
		{
			/*
			 * Its cache opens or closes: pending, and not created; a read
			 * that may wait waits for that to end.
			 */
			if (wait_for_caches_change(generation, deadline))
				continue;
			read_pending(r);
			return;
		}
		read_key(*key, *len, cache_id, details, wait_ms > 0, r);
	} while (pc_caches_generation() != generation);
	pc_cache_count(cache, r->found && r->state != PC_STATE_PENDING ?
				   PC_CACHE_HITS : PC_CACHE_MISSES, 1);
	if (r->state == PC_STATE_PENDING && wait_ms > 0)
	{
		int64		left = deadline - pc_real_now_ms();

		demand_key(*key, *len);
		if (left > 0)
			wait_for_key(*key, *len, left, details, r);
	}
}

Datum
projcache_check_preloaded(PG_FUNCTION_ARGS)
{
	pc_require_loaded();
	PG_RETURN_VOID();
}

/* projcache.get(key text) → jsonb */
Datum
projcache_get(PG_FUNCTION_ARGS)
{
	PcRead		r;
	const char *key;
	uint32		len;

	read_with_wait(PG_GETARG_TEXT_PP(0), 0, false, &r, &key, &len);
	if (r.config == NULL)
		PG_RETURN_NULL();
	PG_RETURN_POINTER(r.config);
}

/* projcache.get(key text, wait interval) → jsonb */
Datum
projcache_get_wait(PG_FUNCTION_ARGS)
{
	PcRead		r;
	const char *key;
	uint32		len;
	int64		wait_ms = wait_arg_ms(PG_GETARG_INTERVAL_P(1));

	read_with_wait(PG_GETARG_TEXT_PP(0), wait_ms, false, &r, &key, &len);
	if (r.config == NULL)
		PG_RETURN_NULL();
	PG_RETURN_POINTER(r.config);
}

/* ----------------------------------------------------------------
 * lookup(): names of states
 * ----------------------------------------------------------------
 */

static const char *
state_name(uint8 state)
{
	switch (state)
	{
		case PC_STATE_ENABLED:
			return "enabled";
		case PC_STATE_DISABLED:
			return "disabled";
		default:
			return "pending";
	}
}

static const char *
fetch_state_name(uint8 fetch_state)
{
	switch (fetch_state)
	{
		case PC_FETCH_IN_PROGRESS:
			return "in_progress";
		case PC_FETCH_COMPLETE:
			return "complete";
		default:
			return "pending";
	}
}

static const char *
freshness_name(PolicyFreshness f)
{
	switch (f)
	{
		case POLICY_FRESH:
			return "fresh";
		case POLICY_STALE:
			return "stale";
		default:
			return "expired";
	}
}

/*
 * projcache.lookup(key text, wait interval DEFAULT '0')
 *	 → TABLE(state, freshness, revision, config, fetched_at, age, last_error)
 */
Datum
projcache_lookup(PG_FUNCTION_ARGS)
{
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	PcRead		r;
	const char *key;
	uint32		len;
	int64		wait_ms = wait_arg_ms(PG_GETARG_INTERVAL_P(1));
	Datum		values[7];
	bool		nulls[7];
	int64		now;

	InitMaterializedSRF(fcinfo, 0);
	read_with_wait(PG_GETARG_TEXT_PP(0), wait_ms, true, &r, &key, &len);
	now = pc_now_ms();

	memset(nulls, true, sizeof(nulls));
	values[0] = CStringGetTextDatum(state_name(r.state));
	nulls[0] = false;
	if (r.state != PC_STATE_PENDING)
	{
		values[1] =
			CStringGetTextDatum(freshness_name(read_freshness(&r, now)));
		nulls[1] = false;
		values[4] = TimestampTzGetDatum(pc_mono_to_timestamp(r.fetched_at));
		nulls[4] = false;
		values[5] = pc_interval_from_ms(Max(now - r.fetched_at, 0));
		nulls[5] = false;
	}
	if (r.revision != NULL)
	{
		values[2] = CStringGetTextDatum(r.revision);
		nulls[2] = false;
	}
	if (r.config != NULL)
	{
		values[3] = PointerGetDatum(r.config);
		nulls[3] = false;
	}
	if (r.last_error != NULL)
	{
		values[6] = CStringGetTextDatum(r.last_error);
		nulls[6] = false;
	}
	tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, values, nulls);
	return (Datum) 0;
}

/* ----------------------------------------------------------------
 * fetch()
 * ----------------------------------------------------------------
 */

/* projcache.fetch(key text): ask for a fetch unless fresh or under way. */
Datum
projcache_fetch(PG_FUNCTION_ARGS)
{
	const char *key;
	uint32		len;
	PcKey		search;
	PcEntry    *entry;
	PcCacheId	cache;
	bool		created;
	bool		send;

	pc_require_loaded();
	pc_check_key(PG_GETARG_TEXT_PP(0), &key, &len);
	if (pc_key_cache_for_read(key, len, &cache) == PC_CACHE_UNAVAILABLE)
		PG_RETURN_VOID();		/* its cache opens or closes */
	search = pc_search_key(key, len);
	entry = pc_entry_find(&search, false);
	if (entry == NULL)
		entry = pc_keymap_find_or_create_for(key, len, GetOuterUserId(),
											 cache, &created);
	if (entry == NULL)
		PG_RETURN_VOID();		/* no room: the worker is making some */
	if (entry->cache != cache)
	{
		/* another cache's, until the worker evicts it */
		pc_entry_release(entry);
		PG_RETURN_VOID();
	}
	/* Asked for by name: not a key read once in passing. */
	send = pc_request_mark(entry, PC_REQ_FETCH | PC_REQ_DEMAND);
	pc_entry_release(entry);
	if (send)
		pc_request_send(key, len);
	PG_RETURN_VOID();
}

/* ----------------------------------------------------------------
 * The views: entries and stats
 * ----------------------------------------------------------------
 */

/* Copy an entry out for the entries view (a key list's payload). */
static bool
copy_for_view(PcEntry *entry, void *payload)
{
	PcRead	   *r = payload;

	copy_entry(entry, true, false, r);
	return !r->oom;
}

#define ENTRIES_COLUMNS 17		/* 1.3.1: cache */

/* One row of the entries view, from one entry's copy. */
static void
entry_row(const char *key, const char *cache, PcRead *r, int64 now,
		  Datum *values, bool *nulls)
{
	bool		backoff = r->retry_at > now;

	memset(nulls, true, ENTRIES_COLUMNS * sizeof(bool));
	values[0] = CStringGetTextDatum(key);
	nulls[0] = false;
	values[1] = CStringGetTextDatum(state_name(r->state));
	nulls[1] = false;
	/* Readers still see in_progress: they must not ask meanwhile. */
	values[3] = CStringGetTextDatum(backoff ? "backoff" :
									fetch_state_name(r->fetch_state));
	nulls[3] = false;
	if (r->revision != NULL)
	{
		values[4] = CStringGetTextDatum(r->revision);
		nulls[4] = false;
	}
	values[5] = Int64GetDatum(r->value_bytes);
	nulls[5] = false;
	if (r->state != PC_STATE_PENDING)
	{
		values[2] =
			CStringGetTextDatum(freshness_name(read_freshness(r, now)));
		nulls[2] = false;
		values[6] = TimestampTzGetDatum(pc_mono_to_timestamp(r->fetched_at));
		nulls[6] = false;
		values[7] = pc_interval_from_ms(Max(now - r->fetched_at, 0));
		nulls[7] = false;
		if (r->expires_at != 0)
		{
			values[8] = pc_interval_from_ms(r->expires_at - now);
			nulls[8] = false;
		}
	}
	if (r->has_refresh)
	{
		values[9] = pc_interval_from_ms(r->refresh_at - now);
		nulls[9] = false;
	}
	values[10] = Int32GetDatum(r->attempts);
	nulls[10] = false;
	if (r->last_error != NULL)
	{
		values[11] = CStringGetTextDatum(r->last_error);
		nulls[11] = false;
	}
	/* Since 1.1 (the 1.0 SQL declares the columns above only). */
	values[12] = BoolGetDatum(r->visited);
	nulls[12] = false;
	if (backoff)
	{
		values[13] = TimestampTzGetDatum(pc_mono_to_timestamp(r->retry_at));
		nulls[13] = false;
	}
	/* Since 1.2: the key's own fresh and stale periods, else the GUCs'. */
	values[14] = pc_interval_from_ms(read_max_age(r));
	nulls[14] = false;
	values[15] = pc_interval_from_ms(read_stale_for(r));
	nulls[15] = false;
	/* Since 1.3.1: the key's cache (NULL: one opening or closing). */
	if (cache != NULL)
	{
		values[16] = CStringGetTextDatum(cache);
		nulls[16] = false;
	}
}

/* projcache.entries(): one row per cached key. */
Datum
projcache_entries(PG_FUNCTION_ARGS)
{
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	PcKeyList	copies;
	int64		now;
	int			i;
	bool	   *shown;
	char	  **cache_names;
	char	   *slot_names[PC_MAX_CACHES] = {NULL};

	pc_require_loaded();
	InitMaterializedSRF(fcinfo, 0);

	pc_keylist_init(&copies, sizeof(PcRead));
	pc_keylist_from_map(&copies, NULL, copy_for_view);
	if (copies.oom)
		pc_report_oom("a cached value");
	shown = pc_array_resize_no_oom(NULL, copies.count, sizeof(bool));
	cache_names = pc_array_resize_no_oom(NULL, copies.count, sizeof(char *));
	if (shown == NULL || cache_names == NULL)
		pc_report_oom("the list of keys shown");

	/*
	 * Only the keys of the caches the user may read, by the cache each entry
	 * says it is of: a key of a cache that is closing or gone is shown to
	 * superusers only, as no cache's.
	 */
	for (i = 0; i < copies.count; i++)
	{
		const PcRead *r = pc_keylist_payload(&copies, i);
		PcCacheReg	reg;
		int			cache = pc_cache_of(r->cache, &reg);

		shown[i] = !((cache >= 0 && !pc_cache_may_read(&reg)) ||
					 (cache == PC_CACHE_UNAVAILABLE && !superuser()));
		if (cache >= 0 && slot_names[cache] == NULL)
			slot_names[cache] = pstrdup(reg.name);
		cache_names[i] = cache >= 0 ? slot_names[cache] :
			cache == PC_CACHE_DEFAULT ? PC_DEFAULT_CACHE_NAME : NULL;
	}

	now = pc_now_ms();
	for (i = 0; i < copies.count; i++)
	{
		Datum		values[ENTRIES_COLUMNS];
		bool		nulls[ENTRIES_COLUMNS];

		if (!shown[i])
			continue;
		entry_row(copies.keys[i], cache_names[i],
				  pc_keylist_payload(&copies, i), now, values, nulls);
		tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, values, nulls);
	}
	return (Datum) 0;
}

/* A shared counter's value, and as a bigint column. */
static uint64
counter(PcCounter which)
{
	return pc_counter(which);
}

static Datum
counter_datum(PcCounter which)
{
	return Int64GetDatum((int64) counter(which));
}

/* The buckets of the fetch-delay histogram, in their order. */
static const char *const delay_names[] = {
	"lte15s", "lte30s", "lte60s", "lte120s", "lte300s",
	"lte600s", "lte1800s", "lte3600s", "gt3600s"
};

/* The counters of the stats view's 1.0 columns, in their order. */
static const PcCounter stats_counters[] = {
	PC_CTR_HITS, PC_CTR_MISSES, PC_CTR_PENDING_READS,
	PC_CTR_FETCH_REQUESTS, PC_CTR_FETCH_CALLS, PC_CTR_FETCHED_KEYS,
	PC_CTR_NOT_MODIFIED, PC_CTR_PENDING_RESULTS, PC_CTR_FETCH_ERRORS,
	PC_CTR_EVICTIONS, PC_CTR_REFRESHES, PC_CTR_REQUEST_OVERFLOWS
};

/* The stats view's columns: 1.0's, then 1.1's six, then 1.2's six. */
#define STATS_COLUMNS_1_0	(3 + lengthof(stats_counters) + 4)
#define STATS_COLUMNS	(STATS_COLUMNS_1_0 + 6 + 6)

/*
 * The fetch-delay histogram as jsonb: an object of counts by bucket (whose
 * keys jsonb sorts), or, as_list, a list of {bucket, count} in the
 * buckets' order.
 */
static Datum
delay_histogram(bool as_list)
{
	StringInfoData buf;
	int			i;

	initStringInfo(&buf);
	appendStringInfoChar(&buf, as_list ? '[' : '{');
	for (i = 0; i < lengthof(delay_names); i++)
		appendStringInfo(&buf,
						 as_list ?
						 "%s{\"bucket\": \"%s\", \"count\": " UINT64_FORMAT "}" :
						 "%s\"%s\": " UINT64_FORMAT,
						 i > 0 ? ", " : "", delay_names[i],
						 counter(PC_CTR_DELAY_LTE15S + i));
	appendStringInfoChar(&buf, as_list ? ']' : '}');
	return DirectFunctionCall1(jsonb_in, CStringGetDatum(buf.data));
}

/* The columns 1.0 declares; returns how many. */
static int
stats_columns_1_0(Datum *values, bool *nulls)
{
	int			col = 0;
	int			i;
	int			worker_pid;
	TimestampTz reset;

	values[col++] =
		Int64GetDatum((int64) pc_keymap_count());
	values[col++] = Int64GetDatum((int64) pc_key_memory_used() + pc_snap_memory_used());
	values[col++] = Int64GetDatum((int64) pc_memory_limit());
	for (i = 0; i < lengthof(stats_counters); i++)
		values[col++] = counter_datum(stats_counters[i]);
	values[col++] = delay_histogram(false);

	worker_pid = pc_worker_pid();
	reset = pc_counters_reset_at();
	values[col] = Int32GetDatum(worker_pid);
	nulls[col++] = worker_pid == 0;
	values[col++] =
		Int64GetDatum((int64) pc_worker_config_generation());
	values[col++] = TimestampTzGetDatum(reset);
	Assert(col == STATS_COLUMNS_1_0);
	return col;
}

/* The columns 1.1 added: evictions by cause, refused reads, hit ratio. */
static int
stats_columns_1_1(Datum *values, bool *nulls)
{
	uint64		hits = counter(PC_CTR_HITS);
	uint64		reads = hits + counter(PC_CTR_MISSES) +
		counter(PC_CTR_PENDING_READS) + counter(PC_CTR_REFUSED_READS);
	int			col = 0;

	values[col++] = counter_datum(PC_CTR_EXPIRY_EVICTIONS);
	values[col++] = counter_datum(PC_CTR_MEMORY_EVICTIONS);
	values[col++] = counter_datum(PC_CTR_REQUESTED_EVICTIONS);
	values[col++] = counter_datum(PC_CTR_REFUSED_READS);
	values[col] =
		Float8GetDatum(reads > 0 ? (double) hits / (double) reads : 0.0);
	nulls[col++] = reads == 0;
	values[col++] = delay_histogram(true);
	return col;
}

/* The columns 1.2 added: fair fetching's drops, and the dumps. */
static int
stats_columns_1_2(Datum *values, bool *nulls)
{
	PcKeyDumpStats keys;
	uint64		loaded_snapshots = pc_snap_dump_loaded();
	int			col = 0;

	pc_keys_dump_stats(&keys);

	values[col++] = counter_datum(PC_CTR_DROPPED_FETCHES);
	values[col++] = Int64GetDatum((int64) keys.loaded_keys);
	values[col++] = Int64GetDatum((int64) loaded_snapshots);
	values[col] = pc_interval_from_ms(keys.loaded_age_ms);
	nulls[col++] = !keys.dump_read ||
		(keys.loaded_keys == 0 && loaded_snapshots == 0);
	values[col] = TimestampTzGetDatum(keys.written_at);
	nulls[col++] = keys.written_at == 0;
	values[col] = Int64GetDatum((int64) keys.dump_keys);
	nulls[col++] = keys.written_at == 0;
	return col;
}

/* projcache.stats(): the counters, as one row. */
Datum
projcache_stats(PG_FUNCTION_ARGS)
{
	TupleDesc	tupdesc;
	Datum		values[STATS_COLUMNS];
	bool		nulls[STATS_COLUMNS];
	int			col;

	pc_require_loaded();
	flush_read_counts();
	if (get_call_result_type(fcinfo, NULL, &tupdesc) != TYPEFUNC_COMPOSITE)
		elog(ERROR, "return type must be a row type");

	memset(nulls, false, sizeof(nulls));
	col = stats_columns_1_0(values, nulls);
	/* The 1.0 SQL declares those only; 1.1 and 1.2 added some. */
	if (tupdesc->natts > col)
		col += stats_columns_1_1(values + col, nulls + col);
	if (tupdesc->natts > col)
		col += stats_columns_1_2(values + col, nulls + col);
	Assert(col == tupdesc->natts);
	PG_RETURN_DATUM(HeapTupleGetDatum(heap_form_tuple(tupdesc, values, nulls)));
}

/* projcache.reset_stats(): zero the counters. */
Datum
projcache_reset_stats(PG_FUNCTION_ARGS)
{
	pc_require_loaded();
	memset(local_reads, 0, sizeof(local_reads));
	local_read_count = 0;
	pc_counters_reset();
	PG_RETURN_VOID();
}
