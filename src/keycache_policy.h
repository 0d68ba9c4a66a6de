/*-------------------------------------------------------------------------
 *
 * keycache_policy.h
 *	  The key cache's policy: when each key is fetched, refreshed and
 *	  evicted, as plain C.
 *
 * This is the private half of the key cache: per-key fetch state machine,
 * retry backoff, expiry and refresh times, and the timer queues that drive
 * them.  It knows nothing about PostgreSQL, shared memory or SQL: the
 * worker (keycache_worker.c) feeds it requests and fetch results and
 * applies the decisions it returns to the shared key map, and the unit
 * tests (test/unit) drive it on a fake clock.
 *
 * Per-key fetch states:
 *
 *	 ────► PENDING ◄──────┐
 *			  │			  │ result still pending: backoff
 *			  ▼			  │
 *	 ┌──► IN_PROGRESS ────┘
 *	 │		  │
 *	 │		  ▼
 *	 └──── COMPLETE
 *
 * IN_PROGRESS covers the whole life of one fetch: waiting for its due time
 * (backoff), gathered into the open batch, and handed out to run in the
 * fetch function ("dispatched").  While a key is IN_PROGRESS it is never
 * evicted on a timer; an explicit eviction drops a fetch that has not been
 * handed out yet, and waits for one that has.
 *
 * All times are milliseconds on one monotonic clock chosen by the caller.
 * Nothing in here reads a clock.
 *
 * Copyright (c) 2026, projcache developers
 *
 *-------------------------------------------------------------------------
 */
#ifndef PROJCACHE_KEYCACHE_POLICY_H
#define PROJCACHE_KEYCACHE_POLICY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef int64_t PolicyTime;		/* milliseconds on the caller's clock */

typedef struct PolicyConfig
{
	int64_t		expiry_ms;		/* fresh below this age */
	int64_t		grace_period_ms;	/* stale until expiry + grace, then
									 * expired */
	int64_t		refresh_interval_ms;	/* <= 0: no refresh; else a key is
										 * refreshed only if it passes
										 * policy_refresh_interval_valid() for
										 * the key's own periods */
	int64_t		max_retry_backoff_ms;	/* cap of the retry backoff */
} PolicyConfig;

/*
 * A key's own fresh and stale periods, as its source gave them with a value
 * (the fetch function's max_age and stale_for), in ms; POLICY_PERIOD_DEFAULT
 * for either means the configuration's (expiry, grace_period), and follows
 * it when the configuration changes.
 */
#define POLICY_PERIOD_DEFAULT (-1)

typedef struct PolicyPeriods
{
	int64_t		max_age_ms;		/* fresh below this age */
	int64_t		stale_for_ms;	/* then stale for this long, then expired */
} PolicyPeriods;

typedef enum PolicyFetchState
{
	POLICY_PENDING,
	POLICY_IN_PROGRESS,
	POLICY_COMPLETE
} PolicyFetchState;

typedef enum PolicyFreshness
{
	POLICY_FRESH,
	POLICY_STALE,
	POLICY_EXPIRED
} PolicyFreshness;

/* What a finished fetch brought back for one key. */
typedef enum PolicyResult
{
	POLICY_RESULT_PENDING,		/* upstream not ready, or the fetch failed */
	POLICY_RESULT_VALUE,		/* a new value (enabled or disabled) */
	POLICY_RESULT_NOT_MODIFIED	/* the current value is still right */
} PolicyResult;

/* What the caller must do after policy_complete_fetch(). */
typedef enum PolicyCompletion
{
	POLICY_DONE,				/* publish the value (unless pending);
								 * eviction and refresh are scheduled */
	POLICY_RESCHEDULED,			/* another fetch of the key is under way;
								 * publish the value unless pending */
	POLICY_EVICTED				/* an eviction was requested during the fetch:
								 * the entry is gone, remove the key */
} PolicyCompletion;

/* Answer of policy_request_evict(). */
typedef enum PolicyEvictReply
{
	POLICY_EVICT_NOW,			/* no fetch is running: remove the key now */
	POLICY_EVICT_DEFERRED		/* removed when the running fetch completes */
} PolicyEvictReply;

/* The timer queues, for policy_peek(). */
typedef enum PolicyQueue
{
	POLICY_QUEUE_EVICT,
	POLICY_QUEUE_REFRESH,
	POLICY_QUEUE_DUE,			/* fetches of keys with a value (see below) */
	POLICY_QUEUE_DUE_NEW,		/* of new keys readers ask for again */
	POLICY_QUEUE_DUE_ONCE,		/* of keys read only once so far */
	/* due, waiting for their role's turn (see "Fair fetching") */
	POLICY_QUEUE_TURN_NEW,
	POLICY_QUEUE_TURN_ONCE,
	POLICY_NUM_QUEUES
} PolicyQueue;

/*
 * The private state of one key.  Callers may read every field; they change
 * it only through the functions below.
 */
typedef struct PolicyEntry
{
	char	   *key;			/* not NUL-terminated; keylen bytes */
	size_t		keylen;
	uint32_t	hash;
	struct PolicyEntry *next;	/* hash chain */

	PolicyFetchState state;

	/* IN_PROGRESS only */
	bool		is_refresh;		/* this fetch is only a refresh */
	bool		dispatched;		/* handed out in a batch: the fetch runs */
	bool		has_fetch_when; /* false: due as soon as possible */
	PolicyTime	fetch_when;		/* due time while backing off */
	PolicyTime	fetch_initiated;	/* first start of this (re)try series */
	bool		has_previous_fetch; /* last success when this fetch began */
	PolicyTime	previous_fetch;

	/* PENDING only: carried from one attempt to the next */
	bool		has_initiated;
	PolicyTime	initiated;
	bool		has_next_attempt;
	PolicyTime	next_attempt;

	int			attempts;		/* retry backoff: attempts since last success */

	bool		has_last_fetch; /* last successful (non-pending) fetch */
	PolicyTime	last_fetch;
	bool		has_expiry;		/* eviction time; a refresh never moves it */
	PolicyTime	expiry;

	/*
	 * The key's own periods from its last successful fetch, or
	 * POLICY_PERIOD_DEFAULT; read them with policy_max_age() and
	 * policy_stale_for().
	 */
	int64_t		max_age_ms;
	int64_t		stale_for_ms;

	bool		invalidated;	/* treat as stale until the next success */
	bool		refetch_after;	/* invalidated while its fetch ran: fetch
								 * again */
	bool		evict_after;	/* evict when the running fetch completes */

	/* IN_PROGRESS only: gathered into the open batch, not handed out yet */
	bool		gathered;

	/*
	 * Read again, or waited for, since it was created: its fetches wait with
	 * those of cached keys, not behind keys read once.
	 */
	bool		demanded;

	/*
	 * Its last fetch failed in a call of its own, and it has not been
	 * answered since: it is fetched alone (keycache_bisect.h).
	 */
	bool		suspect;

	/*
	 * Fair fetching: the role whose turn the fetch of a new key waits for
	 * (policy_set_flow; 0 until one is given), and while it waits for it,
	 * that role's queues.
	 */
	bool		has_flow;
	uint32_t	flow;
	struct PolicyFlow *turn_flow;

	/*
	 * Keys per owner (policy_set_owner): the owner, 0 for none, and the key's
	 * place in the owner's FIFO.
	 */
	uint32_t	owner;
	struct PolicyEntry *owner_newer;
	struct PolicyEntry *owner_older;

	/*
	 * Eviction under memory pressure (S3-FIFO, see policy_memory_victim): the
	 * FIFO the key is in, small or main, and its place there; the newest key
	 * of each is its head, the oldest its tail.
	 */
	bool		in_main;
	uint8_t		pool;			/* whose FIFOs: see "Pools" below */
	struct PolicyEntry *fifo_newer;
	struct PolicyEntry *fifo_older;

	/*
	 * What the key weighs in the FIFOs' shares: the bytes it takes
	 * (policy_set_bytes), 1 until the caller says.
	 */
	size_t		bytes;

	/*
	 * timer queue bookkeeping: index in each heap, or -1; the time, and the
	 * order of scheduling, which breaks ties (first scheduled, first out)
	 */
	int			heap_pos[POLICY_NUM_QUEUES];
	PolicyTime	heap_time[POLICY_NUM_QUEUES];
	uint64_t	heap_seq[POLICY_NUM_QUEUES];
} PolicyEntry;

typedef struct Policy Policy;

/*
 * Memory for the policy: malloc/free in tests, a memory context in the
 * worker.
 */
typedef void *(*PolicyAllocFn) (size_t size);
typedef void (*PolicyFreeFn) (void *ptr);

extern Policy *policy_create(const PolicyConfig *config,
							 PolicyAllocFn alloc_fn, PolicyFreeFn free_fn);
extern void policy_destroy(Policy *s);
extern size_t policy_set_config(Policy *s, const PolicyConfig *config);
extern const PolicyConfig *policy_config(const Policy *s);

/* Pure helpers, also used by readers outside the worker. */
extern bool policy_refresh_interval_valid(int64_t expiry_ms, int64_t grace_ms,
										  int64_t refresh_ms);
extern int64_t policy_backoff_delay(int attempt, int64_t max_backoff_ms);
extern PolicyFreshness policy_freshness(PolicyTime last_fetch, PolicyTime now,
										int64_t expiry_ms, int64_t grace_ms);
extern int64_t policy_period(int64_t own_ms, int64_t config_ms);

/* The periods in force for a key: its own, else the configuration's. */
extern int64_t policy_max_age(const Policy *s, const PolicyEntry *entry);
extern int64_t policy_stale_for(const Policy *s, const PolicyEntry *entry);

extern PolicyEntry *policy_lookup(Policy *s, const char *key, size_t keylen);
extern size_t policy_count(const Policy *s);

/*
 * Begin a normal fetch (creating the key's private state if needed), or a
 * refresh (which does nothing for an unknown key).  Returns the entry if a
 * fetch was begun, NULL if none was needed or one is already running (a
 * normal request upgrades a running refresh).  A begun fetch is queued until
 * its due time: now, or later while backing off.
 */
extern PolicyEntry *policy_try_begin_fetch(Policy *s, const char *key,
										   size_t keylen,
										   bool is_refresh, PolicyTime now);

/* Treat the key as stale from now on and fetch it at once (see .c). */
extern PolicyEntry *policy_invalidate(Policy *s, const char *key, size_t keylen,
									  PolicyTime now);

/*
 * Record a fetch result for an IN_PROGRESS entry.  Pending results keep the
 * old value and begin the next attempt after the backoff.  A value or
 * not_modified sets the key's own periods (NULL: both the configuration's),
 * which its freshness, eviction and refresh follow from then on.
 */
extern PolicyCompletion policy_complete_fetch(Policy *s, PolicyEntry *entry,
											  PolicyResult result,
											  const PolicyPeriods *periods,
											  PolicyTime now);

/* Timer queues. */
extern bool policy_peek(const Policy *s, PolicyQueue queue, PolicyTime *when);
extern PolicyEntry *policy_pop_eviction(Policy *s, PolicyTime now);
extern PolicyEntry *policy_pop_refresh(Policy *s, PolicyTime now);
extern void policy_evict(Policy *s, PolicyEntry *entry);
extern PolicyEvictReply policy_request_evict(Policy *s, const char *key,
											 size_t keylen);

/*
 * Eviction under memory pressure, by S3-FIFO (Yang et al., SOSP 2023),
 * chosen by measurement (bench/working_set_sim.py), with a small FIFO
 * whose share adapts (bench/peers_sim.py).  Keys sit in two FIFOs: a new
 * key enters the small one, which keys read only once leave first, and
 * keys read again move on to the main one, which keeps them by
 * reinsertion:
 *
 * - while the small FIFO holds at least its share of what the keys weigh
 *	 (or the main one is empty), its oldest key is looked at: one read since
 *	 it came in ("visited", which the caller keeps, since readers set it)
 *	 moves to the head of the main FIFO, its mark cleared; one not read is
 *	 the victim;
 * - else the main FIFO's oldest key is looked at: visited, it goes back to
 *	 the head, its mark cleared; not, it is the victim;
 * - the ghost FIFO remembers the hashes of both FIFOs' victims; a key
 *	 created while it remembers it (it left within the last as many
 *	 evictions from its FIFO as the main FIFO holds keys) goes straight into
 *	 the main FIFO.
 *
 * - when visited(entry, arg) keeps every key of the main FIFO (each was
 *	 looked at twice in this call), the small FIFO is looked at whatever its
 *	 share: with plain visited marks that never happens, since a mark is
 *	 cleared at the first look; a caller that keeps keys for other reasons
 *	 (values in use) still gets a victim from the small FIFO.
 *
 * So keys read only once (a scan) cycle through the small FIFO and never
 * displace the main one's.  A key whose fetch is dispatched or gathered
 * into the open batch is never a victim: it goes back to the head of its
 * FIFO, untouched.
 *
 * The small FIFO's share adapts, within POLICY_SMALL_MIN_PERCENT and
 * POLICY_SMALL_MAX_PERCENT, starting at the least: a key back from the
 * small FIFO's victims says that it let a key go before its second read,
 * as when the hot set moves to keys new to the cache, and grows the share
 * by POLICY_SMALL_GROW_KEYS keys' worth of the keys held; one back from the
 * main FIFO's victims says that the main FIFO was too small for the keys
 * read again, and shrinks it by POLICY_SMALL_SHRINK_KEYS keys' worth.  A
 * scan's keys never come back, so a scan leaves the share alone.  (A fixed
 * share of 30 % took a moved hot set up about 0.1 of hit ratio slower than
 * LRU in the rounds after the move; a fixed 10 %, slower still.)
 *
 * visited(entry, arg) says whether the key was visited and clears the mark.
 * Returns the victim, which the caller removes (from the shared map, then
 * with policy_evict_victim()), or NULL if no key can be evicted.
 *
 * The FIFOs' shares are counted in what their keys weigh: the bytes each
 * takes, as the caller gives them (policy_set_bytes; 1 each until then,
 * which counts keys).  Counted in keys, a scan of values larger than the
 * hot keys' would hold most of the memory in a small FIFO of few keys,
 * below its share, and send the main FIFO's hand round the hot keys again
 * and again, evicting them.
 */
#define POLICY_SHARE_ONE			1000000
#define POLICY_SMALL_MIN_PERCENT	10
#define POLICY_SMALL_MAX_PERCENT	90
#define POLICY_SMALL_GROW_KEYS	16
#define POLICY_SMALL_SHRINK_KEYS	24

typedef bool (*PolicyVisitedFn) (PolicyEntry *entry, void *arg);

/*
 * Pools: keys are evicted for memory within their pool only.  Each pool has
 * its own FIFOs (and small FIFO's share), and policy_memory_victim() takes
 * its victim from the pool it is given, so that a pool filling up never
 * evicts another pool's keys.  Pool 0 is the default.  A key's pool is
 * said, once, when the key is first known, by the function given to
 * policy_set_pool_fn() (none: every key in pool 0); the caller keeps it
 * true by removing a key before its pool changes.  policy_small_share(),
 * policy_small_count() and policy_fifo_bytes() are pool 0's.
 */
#define POLICY_MAX_POOLS			65

typedef int (*PolicyPoolFn) (const char *key, size_t keylen, void *arg);

extern void policy_set_pool_fn(Policy *s, PolicyPoolFn pool_of, void *arg);

/*
 * A pool's own max_retry_backoff_ms and refresh_interval_ms (-1: the
 * config's), for its keys' next backoff and next refresh.
 */
extern void policy_set_pool_config(Policy *s, int pool,
								   int64_t max_retry_backoff_ms,
								   int64_t refresh_interval_ms);
extern size_t policy_pool_bytes(const Policy *s, int pool);
extern size_t policy_pool_count(const Policy *s, int pool);

extern PolicyEntry *policy_memory_victim(Policy *s, int pool,
										 PolicyVisitedFn visited, void *arg);

/*
 * Who pays for room (keycache_worker.c, "Eviction under memory pressure").
 * A pool with a budget (a named cache's max_memory) has that much reserved
 * for its keys; the pools without one share what the budgets leave of the
 * target, less what the map's own structures take (the "overhead": what
 * is used beyond what the pools' keys weigh).  A write of need bytes into
 * pool writer, whose key weighs freed now (the old chunk, freed once the
 * new one is linked), is paid for:
 *
 * - by a writer with a budget, from its own pool only: a write larger than
 *	 the whole budget never fits (POLICY_ROOM_TOO_LARGE); one that would take
 *	 the pool past its budget evicts the pool's own keys, and is refused
 *	 (POLICY_ROOM_REFUSED) if none can go.  Past the target, the pools that
 *	 hold more than their share (those without a budget past what the
 *	 budgets leave them, or one past its budget) give back their excess
 *	 first; then the writer pays, or is refused;
 * - by a writer without a budget, from the largest pool without one (they
 *	 share one part of the memory), never from a pool with a budget within
 *	 it: past their share, refused once none of them can give a key.  Past
 *	 the target only, a pool over its budget gives back its excess first;
 * - with no writer (POLICY_ROOM_NO_WRITER: keys readers created), as past
 *	 the target with a writer without a budget.
 *
 * pools[] has npools entries: what each pool's keys weigh, its budget (0:
 * none), and whether it can give a key now (it has keys, and not all of
 * them are being fetched).  Returns the pool to evict one key of, then ask
 * again, or POLICY_ROOM_FITS when nothing more need go.
 */
typedef struct PolicyPoolUse
{
	size_t		bytes;			/* what its keys weigh (policy_pool_bytes) */
	size_t		budget;			/* its reserved bytes; 0: none */
	bool		can_give;		/* it has a key that can be evicted now */
} PolicyPoolUse;

#define POLICY_ROOM_NO_WRITER	(-1)
#define POLICY_ROOM_FITS			(-1)
#define POLICY_ROOM_REFUSED		(-2)
#define POLICY_ROOM_TOO_LARGE	(-3)

extern int	policy_room_payer(const PolicyPoolUse *pools, int npools, int writer,
							  size_t need, size_t freed, size_t used,
							  size_t target);

/*
 * Evict a victim of policy_memory_victim(), remembered in the ghost FIFO
 * with the FIFO it left.  Keys evicted by expiry or by request are not
 * remembered.
 */
extern void policy_evict_victim(Policy *s, PolicyEntry *victim);

/* The small FIFO's share now, in parts of POLICY_SHARE_ONE. */
extern uint32_t policy_small_share(const Policy *s);
extern bool policy_in_ghost(const Policy *s, const char *key, size_t keylen);
extern size_t policy_small_count(const Policy *s);

/* The bytes the key takes, for the FIFOs' shares (see above). */
extern void policy_set_bytes(Policy *s, PolicyEntry *entry, size_t bytes);
extern size_t policy_fifo_bytes(const Policy *s, bool main);
extern bool policy_evictable(const PolicyEntry *entry);

/*
 * The dump keeps the FIFOs' order.  policy_keep_order_next() walks the keys
 * in the order eviction would keep them: the main FIFO's from newest to
 * oldest, then the small FIFO's (NULL begins, NULL ends; nothing may change
 * the FIFOs meanwhile), so that a restart able to load only part of a dump
 * leaves out what eviction would have taken first.  policy_restore_fifo()
 * puts a key restored in that order at the oldest end of the FIFO it was
 * in, which rebuilds both FIFOs as they were.
 */
extern PolicyEntry *policy_keep_order_next(const Policy *s,
										   const PolicyEntry *prev);
extern void policy_restore_fifo(Policy *s, PolicyEntry *e, bool main);

/*
 * Fair fetching.  A fetch is of one of three classes:
 *
 * - cached: keys that have a value (stale, invalidated, refreshed), which
 *	 readers are being served and will lose at expiry;
 * - new, demanded: keys without one that came back from the ghost FIFO,
 *	 or were read again while they waited, or waited for
 *	 (policy_note_demand);
 * - new, read once so far.
 *
 * Fetches of cached keys wait in POLICY_QUEUE_DUE, in due-time order (first
 * scheduled first at the same time), and batches take them before any
 * other, but for one place in every POLICY_CACHED_RUN + 1 while new keys
 * wait for their turn: new keys, however many a role asks for, delay the
 * refresh of the keys already cached by a quarter at most, and refetches
 * of keys that serve meanwhile (stale within their grace period) never
 * hold back the new keys readers read as NULL until fetched.  Without that
 * place, refetches due faster than the fetch function answers (a short
 * expiry) left every key evicted or new unfetched for as long as they came.
 *
 * A fetch of a new key waits for its due time (its retry backoff) in
 * POLICY_QUEUE_DUE_NEW or POLICY_QUEUE_DUE_ONCE, and from then on for its
 * turn, in the queues of the role it is fetched for (its "flow", see
 * policy_set_flow): each role has two, demanded keys and keys read once,
 * each in due-time order.  The roles with keys due take turns (round
 * robin): each turn fetches one key of that role, its first demanded one,
 * else its first read once.  So a role that asks for many new keys gets
 * one fetch in every round, as does a role that asks for one; within a
 * role, a backlog of keys nobody reads again (a scan) never delays the
 * keys readers keep asking for.  A role that asks for keys while others
 * wait takes its turn at the end of the round under way.  Picking a key
 * costs O(log n); picking the role, O(1).
 *
 * While the keys' memory is short, keys read once that are due are
 * bounded: past POLICY_ONCE_BATCHES batches of them, keys are dropped
 * (policy_once_excess), as a cache that is full drops what it fetched for
 * nobody: the first of the role that has the most waiting, so that one
 * role's flood drops only its own keys as long as another role has fewer
 * waiting.  While memory has room nothing is dropped: a drop saves only
 * memory, and a service warming its cache reads every key once before it
 * waits for each, so a dropped key would be fetched again alone.  Nor
 * while the small FIFO's oldest key holds a value and is not being
 * fetched: eviction takes that key, read once before any waiting fetch
 * was asked for and not read again, and the memory it frees.
 */
#define POLICY_ONCE_BATCHES 16

/* Fetches of cached keys taken in a row while new keys wait: then one new. */
#define POLICY_CACHED_RUN 3

/* The key was read again, or a reader waits for it: mark it demanded. */
extern void policy_note_demand(Policy *s, PolicyEntry *entry);

/*
 * A role (an id of the caller's; 0 is a role too, for keys it cannot name
 * one for) asked for the key's fetch.  The first role given is the key's;
 * a later one takes it over only when its own keys waiting for their turn
 * are fewer by at least two: a key asked for by several roles is fetched in
 * the turn that comes first, never later because another role asked for it
 * too.  A key waiting for its turn moves to the new role's queues, keeping
 * its due time.
 */
extern void policy_set_flow(Policy *s, PolicyEntry *entry, uint32_t flow);

/* Fetches waiting for the role's turn (due), and roles with any. */
extern size_t policy_flow_waiting(const Policy *s, uint32_t flow);
extern size_t policy_flow_count(const Policy *s);

/*
 * The fetch of a key read only once to drop, if memory_short (the caller's
 * judgement of the keys' memory) and more than limit such keys are due and
 * wait for their turn: the first of the role with the most of them
 * (O(roles waiting)); NULL while memory has room, or while the small
 * FIFO's oldest key holds a value and is not being fetched (eviction's to
 * take first).  The caller drops the key (from the shared map,
 * then with policy_evict_victim(), which remembers it in the ghost FIFO so
 * that a second read is demand) or, if it was read meanwhile, marks it
 * demanded.
 */
extern PolicyEntry *policy_once_excess(Policy *s, size_t limit,
									   bool memory_short);

/* Fetches of keys read only once waiting, for their due time or turn. */
extern size_t policy_once_count(const Policy *s);

/*
 * Keys per owner.  The caller may give each key an owner (an id of its
 * own, not 0, such as the role that created the key's shared entry; 0: no
 * owner), and when an owner holds more keys than it may, ask for its
 * victims: policy_owner_victim() looks at the owner's keys in the order
 * they were given to it, as the main FIFO of S3-FIFO does: one being
 * fetched (dispatched or gathered) or visited since looked at goes back to
 * the newest end, its mark cleared; else it is the victim, which the
 * caller removes (from the shared map, then with policy_evict_victim()).
 * Each key is looked at most twice per call; NULL if none can go.
 */
/*
 * A role's bounds (keycache_map.c, "Keys per role"): at most key_bound keys
 * and byte_bound bytes (0: no such bound).  policy_role_fits() says whether
 * a role holding keys and bytes may take one more key of add_bytes;
 * policy_role_over_low() whether it holds more than its low marks, 95 % of
 * each bound, down to which the worker evicts a role that reached one.
 */
extern bool policy_role_fits(uint64_t keys, uint64_t bytes, uint64_t add_bytes,
							 uint64_t key_bound, uint64_t byte_bound);
extern bool policy_role_over_low(uint64_t keys, uint64_t bytes,
								 uint64_t key_bound, uint64_t byte_bound);

extern void policy_set_owner(Policy *s, PolicyEntry *entry, uint32_t owner);
extern size_t policy_owner_count(const Policy *s, uint32_t owner);
extern PolicyEntry *policy_owner_victim(Policy *s, uint32_t owner,
										PolicyVisitedFn visited, void *arg);

/*
 * Batching: move due fetches into the open batch (cached keys first, then
 * the roles' turns, see "Fair fetching") and say whether it should go out
 * now
 * (it is full, or has gathered for batch_interval_ms).  Returns the number
 * of entries in *batch to dispatch, 0 to keep gathering; the array stays
 * valid until the next call.
 */
extern int	policy_ready_batch(Policy *s, PolicyTime now, int batch_size,
							   int64_t batch_interval_ms, PolicyEntry ***batch);

/* Earliest time anything is due (queues and the open batch); false if idle. */
extern bool policy_next_wakeup(const Policy *s, int64_t batch_interval_ms,
							   PolicyTime *when);

/*
 * Rebuild the state of a key that has a value, after a worker restart or
 * from the dump: COMPLETE since last_fetch with its own periods (NULL: the
 * configuration's), evicted at expiry, refreshed at refresh_at when
 * has_refresh.  A fetch asked for before (not yet in a batch) is dropped.
 */
extern PolicyEntry *policy_restore_complete(Policy *s, const char *key,
											size_t keylen,
											PolicyTime last_fetch,
											PolicyTime expiry,
											const PolicyPeriods *periods,
											bool has_refresh,
											PolicyTime refresh_at);

extern void policy_resume_backoff(Policy *s, PolicyEntry *e, int attempts,
								  PolicyTime now);

/*
 * A bad key fails alone (keycache_bisect.h): the worker marks the keys that
 * failed in a call of their own, and may put a dispatched fetch back
 * unmade (a suspect without room in this batch): it waits in its queue
 * until when, as if backing off, with no attempt counted.
 */
extern void policy_set_suspect(PolicyEntry *e, bool suspect);
extern void policy_defer_fetch(Policy *s, PolicyEntry *e, PolicyTime when);

/*
 * Admission (keycache_worker.c, "Admission"): a key is in use when it holds
 * a value and was read within 'window' stamp units of stamp_now.  Read
 * stamps count units of a clock modulo POLICY_STAMP_MODULUS; a stamp up to
 * POLICY_STAMP_AHEAD_MAX units ahead of stamp_now (a reader stamped it
 * after the caller read the clock) is a read now, and one about as old as
 * the modulus looks recent again, which keeps such a key one window longer
 * at most.  window 0: no key is in use.
 */
#define POLICY_STAMP_MODULUS		0x8000U
#define POLICY_STAMP_AHEAD_MAX	4

extern bool policy_value_in_use(bool has_value, uint32_t stamp,
								uint32_t stamp_now, uint32_t window);

/*
 * The pace of the scans of the whole key map that a full request ring
 * costs (keycache_ring.c): a scan may begin once the last one ended
 * POLICY_SCAN_MIN_GAP_MS ago, and POLICY_SCAN_GAP_FACTOR times as long as it
 * took, whichever is later; so however fast readers overflow the ring,
 * scans take at most a tenth of the worker's time, and at most one a
 * second.  Requests that found the ring full wait for that scan: a key
 * with a value serves it meanwhile.  The first scan is due at once.
 */
#define POLICY_SCAN_MIN_GAP_MS	1000
#define POLICY_SCAN_GAP_FACTOR	9

typedef struct PolicyScanPace
{
	PolicyTime	next_ok;		/* no scan begins before this */
} PolicyScanPace;

extern void policy_scan_pace_init(PolicyScanPace *pace);
extern bool policy_scan_due(const PolicyScanPace *pace, PolicyTime now);
extern int64_t policy_scan_wait(const PolicyScanPace *pace, PolicyTime now);
extern void policy_scan_done(PolicyScanPace *pace, PolicyTime start,
							 PolicyTime end);

#endif							/* PROJCACHE_KEYCACHE_POLICY_H */
