/*-------------------------------------------------------------------------
 *
 * keycache_evict.c
 *	  The worker's eviction: for memory, for the caches' budgets, for the
 *	  roles' bounds, and the admission of new keys.
 *
 * Eviction under memory pressure.  Keys may fill their part of
 * projcache.max_memory (pc_key_memory_bound) but for a headroom.  The
 * worker stores every fetched value itself, and first evicts S3-FIFO's
 * victims (see keycache_policy.h) until the value fits below the bound
 * less the headroom (keycache_worker.c's make_value), so values need no room kept for them.
 * Readers create new keys' entries, while the worker may be waiting on a
 * fetch: the headroom is room for one batch of them, and after each batch,
 * or when a reader found no room, the worker evicts until use is back
 * below the bound less the headroom (pc_evict_for_memory), a few keys at a
 * time.  A reader that finds no room leaves its key on the request ring and
 * the worker creates it once it has made room (create_refused_keys): a new
 * key's first read misses either way.  The headroom is at most a small
 * share of the bound (pc_key_memory_target), so that a full cache holds the
 * rest.  Only what keys take is measured against the bound: snapshot rows
 * have a budget of their own, so however much of it they hold, the worker
 * neither evicts keys for them nor finds itself unable to make room.
 *
 * Admission.  Keys nobody has a value for must not crowd out values being
 * read.  A value read within projcache.admission_window (its read stamp,
 * PC_MARK_STAMP_MASK, says when) is "in use": it is never evicted to make
 * room for a key that has no value yet, neither for the entries readers
 * create (pc_evict_for_memory) nor for a key's first value (prepare_answer),
 * unless a reader waits for that key (PC_MARK_WAITED: one key at a time
 * per waiting reader, at the pace of the fetches, may thus take room from
 * values in use, those not in use first).
 * Such room comes from keys without a value and from values not read
 * within the window, in S3-FIFO's order; when none is left, admission
 * closes (pc_worker_close_admission()): readers create no key, their reads
 * of new keys answer pending and only ask (pc_request_send_refused), the
 * refused keys are not created, and a first value that finds no room is
 * stored as an error, so that the key is asked for again after its
 * backoff.  At each PC_STAMP_MS tick the worker opens admission again, and
 * the next key without room closes it: so a reader of new keys, at any
 * rate, takes only the memory that nobody has read for a window, and a
 * key whose readers stop is replaced a window later.  Room for values
 * that are already held (a refresh), and the budgets' and roles' bounds,
 * may still evict values in use, those not in use first: the cache's
 * memory bounds always hold.
 *
 * Copyright (c) 2026, projcache developers
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"


#include "keycache_caches.h"
#include "keycache_worker.h"

/*
 * What pc_evict_one_for_memory() keeps: with protect, values in use (see
 * "Admission" above), read within 'window' stamp units of 'stamp_now'.
 */
typedef struct VictimLook
{
	bool		protect;
	uint32		stamp_now;
	uint32		window;
} VictimLook;

/*
 * For S3-FIFO: was the key read since it entered its FIFO, or since the
 * eviction last looked at it?  Clears the mark.  A value in use, when the
 * look protects them, counts as read: S3-FIFO keeps it.
 */
static bool
take_visited(PolicyEntry *e, void *arg)
{
	const VictimLook *look = arg;
	PcKey		search = pc_search_key(e->key, e->keylen);
	PcEntry    *entry;
	bool		visited = false;

	entry = pc_entry_find(&search, false);
	if (entry != NULL)
	{
		uint32		marks;

		marks = pg_atomic_fetch_and_u32(&entry->marks, ~PC_MARK_VISITED);
		visited = (marks & PC_MARK_VISITED) != 0;
		if (look != NULL && look->protect &&
			policy_value_in_use(entry->state != PC_STATE_PENDING,
								pc_marks_stamp(marks), look->stamp_now,
								look->window))
			visited = true;
		pc_entry_release(entry);
	}
	return visited;
}

/* ----------------------------------------------------------------
 * Eviction under memory pressure
 * ----------------------------------------------------------------
 */

/*
 * Each named cache's keys are a pool of their own (keycache_policy.h,
 * "Pools"): pool slot + 1; the default cache's, pool 0.  Eviction takes a
 * victim from one pool only, and which pool pays is the policy's
 * (keycache_policy.h, "Who pays for room"): a cache with a budget
 * (max_memory) pays for its own writes, within it; the pools without a
 * budget (the default cache's and those of caches without one) share what
 * the budgets leave, and the largest of them pays.  A cache that floods
 * itself thus evicts its own keys, never another cache's.  A key's pool is
 * the slot its entry says it is of, when the worker learns of it.
 */
int
pc_key_pool(const char *key, size_t keylen, void *arg)
{
	PcKey		search = pc_search_key(key, (uint32) keylen);
	PcEntry    *entry;
	int			slot = PC_CACHE_DEFAULT;

	entry = pc_entry_find(&search, false);
	if (entry != NULL)
	{
		slot = pc_cache_id_slot(entry->cache);
		pc_entry_release(entry);
	}
	return slot + 1;
}

/* A named cache's own budget in bytes (its pool's), or 0 for none. */
Size
pc_pool_budget(int pool)
{
	const PcCacheSlot *slot;

	if (pool == 0)
		return 0;
	/* Only this worker writes the slots: no lock to read them. */
	slot = pc_cache_slot(pool - 1);
	if (!slot->in_use || slot->reg.max_memory == PC_CACHE_SETTING_UNSET)
		return 0;
	return (Size) slot->reg.max_memory;
}

/*
 * A named cache's key that the worker has just learnt of (a reader made
 * it, or the dump brought it back) weighs what its entry takes, until its
 * next write says again: pending keys count in their cache's budget too.
 * (The default cache's weigh 1 until then, as before named caches: its
 * pool is bounded by the memory's target, which counts them.)
 */
void
pc_weigh_new_key(PolicyEntry *e)
{
	PcKey		search;
	PcEntry    *entry;

	if (e->bytes > 1 || e->pool == 0)
		return;
	search = pc_search_key(e->key, (uint32) e->keylen);
	entry = pc_entry_find(&search, false);
	if (entry != NULL)
	{
		policy_set_bytes(pc_policy, e, pc_entry_footprint(entry));
		pc_entry_release(entry);
	}
}

/*
 * Each named cache's own max_retry_backoff and refresh_interval, for its
 * pool's keys (PC_CACHE_SETTING_UNSET is the worker's "the server's").
 * After each reload of the registry.
 */
void
pc_apply_cache_settings(void)
{
	for (int p = 1; p < POLICY_MAX_POOLS; p++)
	{
		const PcCacheSlot *slot = pc_cache_slot(p - 1);

		if (slot->in_use)
			policy_set_pool_config(pc_policy, p, slot->reg.max_retry_backoff_ms,
								   slot->reg.refresh_interval_ms);
		else
			policy_set_pool_config(pc_policy, p, -1, -1);
	}
}

/*
 * Evict S3-FIFO's next victim of a pool; false if no key of it can be
 * evicted (the rest are being fetched, or, with protect, values in use).
 */
bool
pc_evict_one_for_memory(int pool, bool protect)
{
	VictimLook	look;
	PolicyEntry *victim;

	look.window = pc_admission_window_units();
	look.protect = protect && look.window > 0;
	look.stamp_now = pc_read_stamp(pc_now_ms());
	victim = policy_memory_victim(pc_policy, pool, take_visited, &look);

	if (victim == NULL)
		return false;
	if (pool > 0)
		pc_cache_count(pool - 1, PC_CACHE_EVICTIONS, 1);
	pc_delete_shared(victim->key, victim->keylen, PC_CTR_MEMORY_EVICTIONS);
	policy_evict_victim(pc_policy, victim);
	return true;
}

/*
 * Which pool pays for room (keycache_policy.h, "Who pays for room"), as
 * each pool stands now; tried[p] marks a pool found to have no key that
 * can go (all being fetched).
 */
static int
room_payer(int writer, Size need, Size freed, Size used, const bool *tried)
{
	PolicyPoolUse pools[POLICY_MAX_POOLS];

	for (int p = 0; p < POLICY_MAX_POOLS; p++)
	{
		pools[p].bytes = policy_pool_bytes(pc_policy, p);
		pools[p].budget = pc_pool_budget(p);
		pools[p].can_give = !tried[p] && policy_pool_count(pc_policy, p) > 0;
	}
	return policy_room_payer(pools, POLICY_MAX_POOLS, writer, need, freed,
							 used, pc_key_memory_target());
}

/* The prefix pc_evict_cache_keys() looks for, while it scans the map. */
static const char *scan_prefix;
static uint32 scan_prefix_len;

static bool
has_scan_prefix(PcEntry *entry)
{
	return entry->keylen >= scan_prefix_len &&
		memcmp(pc_entry_key(entry), scan_prefix, scan_prefix_len) == 0;
}

/*
 * Evict every key that starts with prefix ("name:"), for a named cache
 * that opens or closes (keycache_caches.c).  Between batches no fetch
 * runs, so each goes at once.
 */
void
pc_evict_cache_keys(const char *prefix, uint32 len)
{
	PcKeyList	list;

	pc_keylist_init(&list, 0);
	scan_prefix = prefix;
	scan_prefix_len = len;
	pc_keylist_from_map(&list, has_scan_prefix, NULL);
	if (list.oom)
		pc_report_oom("the keys of a named cache");
	for (int i = 0; i < list.count; i++)
	{
		if (policy_request_evict(pc_policy, list.keys[i], list.lens[i]) ==
			POLICY_EVICT_NOW)
			pc_delete_shared(list.keys[i], list.lens[i],
							 PC_CTR_REQUESTED_EVICTIONS);
	}
}

/*
 * Evict until a write of 'need' bytes into pool writer, whose key weighs
 * 'freed' now, fits (POLICY_ROOM_FITS), or say why it cannot:
 * POLICY_ROOM_REFUSED (no key that could pay is left) or
 * POLICY_ROOM_TOO_LARGE (larger than the writer's whole budget).  With
 * POLICY_ROOM_NO_WRITER, until the keys are back below the target.  Only
 * the pools the policy names pay: a cache with a budget pays for its own
 * writes.  With full, the memory is short whatever the counts say (an
 * allocation failed).  With admit, the room is for a key without a value:
 * values in use never pay (see "Admission"); else they pay last.
 */
int
pc_make_room(int writer, Size need, Size freed, bool full, bool admit)
{
	bool		tried[POLICY_MAX_POOLS] = {false};
	bool		in_use_left[POLICY_MAX_POOLS] = {false};

	for (;;)
	{
		Size		used = pc_key_memory_used();
		int			pool;

		if (full)
			used = Max(used, pc_key_memory_target() + 1);
		pool = room_payer(writer, need, freed, used, tried);
		if (pool < 0)
			return pool;
		if (pc_evict_one_for_memory(pool, !in_use_left[pool]))
			full = false;
		else if (!admit && !in_use_left[pool])
			in_use_left[pool] = true;	/* then values in use may go */
		else
			tried[pool] = true; /* its keys are all being fetched */
	}
}

/* What the pools without a budget hold together; *largest: the largest. */
static Size
unbudgeted_bytes(int *largest)
{
	Size		total = 0;
	Size		most = 0;

	*largest = -1;
	for (int p = 0; p < POLICY_MAX_POOLS; p++)
	{
		Size		bytes = policy_pool_bytes(pc_policy, p);

		if (pc_pool_budget(p) > 0 || policy_pool_count(pc_policy, p) == 0)
			continue;
		total += bytes;
		if (*largest < 0 || bytes > most)
		{
			*largest = p;
			most = bytes;
		}
	}
	return total;
}

/*
 * Evict one key of a pool for a bound that must hold: values not in use
 * first, then, once *in_use_only says that none of those is left, and only
 * while the pool's excess is more than the headroom readers may fill with
 * new keys (excess_hard), values in use.  False if no key of the pool can
 * go now.
 */
static bool
evict_one_for_bound(int pool, bool *in_use_only, bool excess_hard)
{
	if (!*in_use_only && pc_evict_one_for_memory(pool, true))
		return true;
	*in_use_only = true;
	return excess_hard && pc_evict_one_for_memory(pool, false);
}

/*
 * Keep each named cache with a budget within it, evicting its own keys
 * only, and the pools without one within what the budgets leave of the
 * target: a budget is reserved, so that a cache growing into it never
 * evicts another cache's keys.  Then show each cache's keys and what they
 * take in projcache.caches.
 */
static void
evict_for_budgets(void)
{
	Size		reserved = 0;
	Size		pooled = 0;
	Size		used;
	Size		overhead;
	Size		target = pc_key_memory_target();
	Size		limit;
	Size		headroom = pc_key_memory_bound() - target;
	Size		excess;
	int			largest;
	bool		in_use_only[POLICY_MAX_POOLS] = {false};

	for (int p = 0; p < POLICY_MAX_POOLS; p++)
	{
		Size		budget = pc_pool_budget(p);

		while (budget > 0 && policy_pool_bytes(pc_policy, p) > budget &&
			   evict_one_for_bound(p, &in_use_only[p],
								   policy_pool_bytes(pc_policy, p) - budget >
								   headroom))
			;
		reserved += budget;
		pooled += policy_pool_bytes(pc_policy, p);
	}

	/* The map's own structures count against the target too. */
	used = pc_key_memory_used();
	overhead = used > pooled ? used - pooled : 0;
	limit = target > overhead + reserved ? target - overhead - reserved : 0;
	while ((excess = unbudgeted_bytes(&largest)) > limit && largest >= 0 &&
		   evict_one_for_bound(largest, &in_use_only[largest],
							   excess - limit > headroom))
		;

	for (int p = 1; p < POLICY_MAX_POOLS; p++)
	{
		PcCacheSlot *slot = pc_cache_slot(p - 1);

		if (!slot->in_use)
			continue;
		pg_atomic_write_u64(&slot->counters[PC_CACHE_MEMORY_USED],
							(uint64) policy_pool_bytes(pc_policy, p));
		pg_atomic_write_u64(&slot->counters[PC_CACHE_ENTRIES],
							(uint64) policy_pool_count(pc_policy, p));
	}
}

/* The stamp unit in which admission last closed. */
static uint32 admission_closed_stamp;

/* No room for a key without a value: close admission until the next tick. */
void
pc_close_admission(void)
{
	admission_closed_stamp = pc_read_stamp(pc_now_ms());
	if (pc_worker_close_admission())
		elog(DEBUG1, "projcache: admission closed: every value that could make room was read within projcache.admission_window");
}

/*
 * Open admission again at the stamp unit after the one it closed in (or at
 * once, without an admission window): the next key that finds no room
 * closes it again.
 */
void
pc_admission_tick(int64 now)
{
	if (pc_worker_admission_closed() &&
		(pc_admission_window_units() == 0 ||
		 pc_read_stamp(now) != admission_closed_stamp))
		pc_worker_open_admission();
}

/*
 * Keep the key map within its target: the entries readers created since
 * the last pass, or a reader that found no room, cost as many evictions,
 * of keys without a value or values not in use only (see "Admission").
 */
void
pc_evict_for_memory(void)
{
	(void) pc_worker_take_room_wanted();
	if (pc_make_room(POLICY_ROOM_NO_WRITER, 0, 0, false, true) != POLICY_ROOM_FITS)
		pc_close_admission();
	evict_for_budgets();
}

/*
 * Keys per role: a role that found its projcache.max_keys_per_role reached,
 * or whose keys take more than their bytes' bound (values the worker
 * wrote took them past it), loses its oldest keys, down to 95 % of each
 * bound, so that its next keys find room at once and not one at a time;
 * the keys it reads again are passed over once (policy_owner_victim).
 * Counted as evictions for memory, and a named cache's as its cache's:
 * they make room, in the role's share.
 */
void
pc_evict_for_roles(void)
{
	uint32		bound = pc_keys_per_role_bound();
	uint64		byte_bound = pc_bytes_per_role_bound();
	int			n;

	(void) pc_roles_take_room_wanted();
	for (n = PC_ROLE_NONE + 1; n < PC_ROLE_SLOTS; n++)
	{
		PcRoleSlot *slot = pc_role_slot(n);
		bool		wanted = pg_atomic_exchange_u32(&slot->room_wanted, 0) != 0;

		if (!wanted && (byte_bound == 0 ||
						pg_atomic_read_u64(&slot->bytes) <= byte_bound))
			continue;
		while (policy_role_over_low(pg_atomic_read_u32(&slot->keys),
									pg_atomic_read_u64(&slot->bytes),
									bound, byte_bound))
		{
			PolicyEntry *victim = policy_owner_victim(pc_policy, (uint32) n,
													  take_visited, NULL);

			if (victim == NULL)
				break;
			if (victim->pool > 0)
				pc_cache_count(victim->pool - 1, PC_CACHE_EVICTIONS, 1);
			pc_delete_shared(victim->key, victim->keylen,
							 PC_CTR_MEMORY_EVICTIONS);
			policy_evict_victim(pc_policy, victim);
		}
	}
}
