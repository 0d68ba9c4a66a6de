/*-------------------------------------------------------------------------
 *
 * keycache_policy.c
 *	  The key cache's policy: when each key is fetched, refreshed and
 *	  evicted, as plain C.
 *
 * See keycache_policy.h for the state machine.  The data structures:
 *
 * - a chained hash table of PolicyEntry, keyed by the key's bytes;
 * - five binary min-heaps of entry pointers (evictions, refreshes, and the
 *	 three queues of fetches waiting for their due time, see "Fair
 *	 fetching" in keycache_policy.h).  Every entry records its index in
 *	 each heap, so scheduling, rescheduling and cancelling cost O(log n)
 *	 and nothing ever scans all keys;
 * - the roles whose new keys are due ("flows"): two such heaps each, in a
 *	 hash table by id, and linked in a ring whose next member's turn it is;
 * - the keys of each owner, a FIFO linked through the entries, in a hash
 *	 table by id;
 * - the open batch: fetches that are due and are being gathered before one
 *	 call of the fetch function;
 * - S3-FIFO's two FIFOs of keys (doubly linked through the entries) and
 *	 its ghost FIFO of hashes (see policy_memory_victim).
 *
 * This file must compile without PostgreSQL headers: it is unit-tested on
 * its own (test/unit/test_keycache_policy.c).
 *
 * Copyright (c) 2026, projcache developers
 *
 *-------------------------------------------------------------------------
 */
#include "keycache_policy.h"

#include <assert.h>
#include <stdlib.h>
#include <string.h>

/*
 * What the code assumes, checked where assertions are on: the unit tests,
 * and server builds with USE_ASSERT_CHECKING (PROJCACHE_ASSERTS=1).  The
 * server's Assert() needs its headers, which this file does without.
 */
#if defined(USE_ASSERT_CHECKING) || defined(POLICY_UNIT_TEST)
#define POLICY_ASSERT(cond) assert(cond)
#else
#define POLICY_ASSERT(cond) ((void) 0)
#endif

typedef struct PolicyHeap
{
	PolicyEntry **items;
	int			count;
	int			capacity;
} PolicyHeap;

/*
 * A role's fetches of new keys that are due and wait for its turn (see
 * "Fair fetching" in keycache_policy.h): demanded ones, then ones read
 * once, each in due-time order.  It exists while it has any, and is then
 * in the ring of turns.
 */
typedef struct PolicyFlow
{
	uint32_t	id;
	struct PolicyFlow *hash_next;
	struct PolicyFlow *turn_prev;
	struct PolicyFlow *turn_next;
	PolicyHeap	heaps[2];		/* POLICY_QUEUE_TURN_NEW, _ONCE */
} PolicyFlow;

/* An owner's keys, the order they were given to it: oldest first out. */
typedef struct PolicyOwner
{
	uint32_t	id;
	struct PolicyOwner *hash_next;
	PolicyEntry *newest;
	PolicyEntry *oldest;
	size_t		count;
} PolicyOwner;

/* Buckets of the tables of flows and of owners: few roles ask for keys. */
#define POLICY_ROLE_BUCKETS 256

/* One pool's FIFOs: [0] small, [1] main (see policy_memory_victim) */
typedef struct PolicyPool
{
	PolicyEntry *fifo_head[2];	/* newest */
	PolicyEntry *fifo_tail[2];	/* oldest */
	size_t		fifo_count[2];
	size_t		fifo_bytes[2];	/* what their keys weigh (PolicyEntry.bytes) */
	uint32_t	small_share;	/* the small FIFO's share of those, in parts
								 * of POLICY_SHARE_ONE (see adapt_small_share) */
	/* its own settings (policy_set_pool_config), or -1: the config's */
	int64_t		max_retry_backoff_ms;
	int64_t		refresh_interval_ms;
} PolicyPool;

struct Policy
{
	PolicyConfig config;
	PolicyAllocFn alloc_fn;
	PolicyFreeFn free_fn;

	PolicyEntry **buckets;
	size_t		nbuckets;		/* power of two */
	size_t		nentries;

	PolicyHeap	heaps[POLICY_NUM_QUEUES];
	uint64_t	heap_seq;		/* schedulings so far, for ties */

	/* the open batch */
	PolicyEntry **batch;
	int			batch_count;
	int			batch_capacity;
	PolicyTime	batch_opened;
	/* the batch handed out by the last policy_ready_batch() call */
	PolicyEntry **dispatched;
	int			dispatched_capacity;

	/* S3-FIFO's FIFOs of each pool (see policy_memory_victim) */
	PolicyPool	pools[POLICY_MAX_POOLS];
	PolicyPoolFn pool_of;		/* a new key's pool; NULL: all in pool 0 */
	void	   *pool_arg;

	/*
	 * The ghost FIFO: hashes of keys evicted from either FIFO lately. Slot
	 * hash & (nghosts - 1) holds the hash with its low bit set (0 if empty),
	 * the FIFO that evicted it and the number of evictions from that FIFO
	 * before it; a hash is still remembered while it is among the last keys
	 * of its pool's main FIFO evicted from there.  (One ghost FIFO for every
	 * pool: a key's pool is known again when it comes back.)  A newer hash
	 * may overwrite an older one: the ghost forgets.
	 */
	struct PolicyGhost
	{
		uint32_t	hash;
		uint8_t		fifo;		/* 0 small, 1 main */
		uint64_t	seq;
	}		   *ghosts;
	size_t		nghosts;		/* power of two, or 0 before the first */
	uint64_t	ghost_seq[2];	/* evictions from each FIFO so far */

	/* Fair fetching: the flows by id, and whose turn is next (or NULL) */
	PolicyFlow *flows[POLICY_ROLE_BUCKETS];
	size_t		nflows;
	PolicyFlow *turn;
	size_t		turn_count[2];	/* fetches waiting for a turn, by heap */
	int			cached_run;		/* cached keys batched in a row while new keys
								 * waited (POLICY_CACHED_RUN) */

	/* Keys per owner */
	PolicyOwner *owners[POLICY_ROLE_BUCKETS];
};

#define POLICY_MIN_GHOST_SLOTS 1024

#define POLICY_INITIAL_BUCKETS 1024

/* ----------------------------------------------------------------
 * Pure helpers
 * ----------------------------------------------------------------
 */

/*
 * A refresh interval makes sense only strictly between expiry (refreshing a
 * fresh value is pointless) and expiry + grace (the key would be evicted
 * first).
 */
bool
policy_refresh_interval_valid(int64_t expiry_ms, int64_t grace_ms,
							  int64_t refresh_ms)
{
	return refresh_ms > expiry_ms && refresh_ms < expiry_ms + grace_ms;
}

/*
 * Delay before retry number 'attempt' (1-based): the first retry is
 * immediate, then 1 s, growing by a factor of 1.5, capped at max_backoff_ms.
 */
int64_t
policy_backoff_delay(int attempt, int64_t max_backoff_ms)
{
	double		delay = 1000.0;
	int			i;

	if (attempt <= 1)
		return 0;
	for (i = 2; i < attempt; i++)
	{
		delay *= 1.5;
		if (delay >= (double) max_backoff_ms)
			break;
	}
	if (delay >= (double) max_backoff_ms)
		return max_backoff_ms < 0 ? 0 : max_backoff_ms;
	return (int64_t) delay;
}

/* A key's own period, or the configuration's when it has none. */
int64_t
policy_period(int64_t own_ms, int64_t config_ms)
{
	POLICY_ASSERT(own_ms >= 0 || own_ms == POLICY_PERIOD_DEFAULT);
	return own_ms >= 0 ? own_ms : config_ms;
}

int64_t
policy_max_age(const Policy *s, const PolicyEntry *e)
{
	return policy_period(e->max_age_ms, s->config.expiry_ms);
}

int64_t
policy_stale_for(const Policy *s, const PolicyEntry *e)
{
	return policy_period(e->stale_for_ms, s->config.grace_period_ms);
}

/* Fresh, stale and expired periods of a key together: its lifetime. */
static int64_t
entry_lifetime(const Policy *s, const PolicyEntry *e)
{
	return policy_max_age(s, e) + policy_stale_for(s, e);
}

PolicyFreshness
policy_freshness(PolicyTime last_fetch, PolicyTime now,
				 int64_t expiry_ms, int64_t grace_ms)
{
	int64_t		elapsed = now > last_fetch ? now - last_fetch : 0;

	if (elapsed >= expiry_ms + grace_ms)
		return POLICY_EXPIRED;
	if (elapsed >= expiry_ms)
		return POLICY_STALE;
	return POLICY_FRESH;
}

/* ----------------------------------------------------------------
 * Memory and the hash table
 * ----------------------------------------------------------------
 */

static void *
policy_alloc0(Policy *s, size_t size)
{
	void	   *p = s->alloc_fn(size);

	memset(p, 0, size);
	return p;
}

static uint32_t
policy_hash(const char *key, size_t keylen)
{
	/* FNV-1a: keys are short and the table is private, this is plenty. */
	uint32_t	h = 2166136261u;
	size_t		i;

	for (i = 0; i < keylen; i++)
	{
		h ^= (unsigned char) key[i];
		h *= 16777619u;
	}
	return h;
}

static void
policy_grow_buckets(Policy *s)
{
	size_t		newn = s->nbuckets * 2;
	PolicyEntry **newb = policy_alloc0(s, newn * sizeof(PolicyEntry *));
	size_t		i;

	for (i = 0; i < s->nbuckets; i++)
	{
		PolicyEntry *e = s->buckets[i];

		while (e)
		{
			PolicyEntry *next = e->next;
			size_t		b = e->hash & (newn - 1);

			e->next = newb[b];
			newb[b] = e;
			e = next;
		}
	}
	s->free_fn(s->buckets);
	s->buckets = newb;
	s->nbuckets = newn;
}

PolicyEntry *
policy_lookup(Policy *s, const char *key, size_t keylen)
{
	uint32_t	h = policy_hash(key, keylen);
	PolicyEntry *e;

	for (e = s->buckets[h & (s->nbuckets - 1)]; e; e = e->next)
	{
		if (e->hash == h && e->keylen == keylen &&
			memcmp(e->key, key, keylen) == 0)
			return e;
	}
	return NULL;
}

size_t
policy_count(const Policy *s)
{
	return s->nentries;
}

/*
 * Put e into the main FIFO or the small one: at its head (newest end), or
 * at its tail (oldest end) for a key restored from the dump in its order.
 */
static void
fifo_push(Policy *s, PolicyEntry *e, bool main, bool at_head)
{
	PolicyPool *p = &s->pools[e->pool];
	int			f = main ? 1 : 0;
	PolicyEntry **end = at_head ? &p->fifo_head[f] : &p->fifo_tail[f];
	PolicyEntry **other = at_head ? &p->fifo_tail[f] : &p->fifo_head[f];

	e->in_main = main;
	e->fifo_older = at_head ? *end : NULL;
	e->fifo_newer = at_head ? NULL : *end;
	if (*end != NULL)
	{
		if (at_head)
			(*end)->fifo_newer = e;
		else
			(*end)->fifo_older = e;
	}
	*end = e;
	if (*other == NULL)
		*other = e;
	p->fifo_count[f]++;
	p->fifo_bytes[f] += e->bytes;
}

/* Take e out of its FIFO. */
static void
fifo_remove(Policy *s, PolicyEntry *e)
{
	PolicyPool *p = &s->pools[e->pool];
	int			f = e->in_main ? 1 : 0;

	POLICY_ASSERT(p->fifo_count[f] > 0);
	if (e->fifo_newer != NULL)
		e->fifo_newer->fifo_older = e->fifo_older;
	else
		p->fifo_head[f] = e->fifo_older;
	if (e->fifo_older != NULL)
		e->fifo_older->fifo_newer = e->fifo_newer;
	else
		p->fifo_tail[f] = e->fifo_newer;
	e->fifo_newer = e->fifo_older = NULL;
	p->fifo_count[f]--;
	POLICY_ASSERT(p->fifo_bytes[f] >= e->bytes);
	p->fifo_bytes[f] -= e->bytes;
}

/*
 * Which FIFO evicted this hash lately, as far as the ghost FIFO remembers:
 * 0 the small one, 1 the main one; -1 if it does not remember it.
 */
static int
ghost_origin(const Policy *s, uint32_t hash, int pool)
{
	const struct PolicyGhost *g;
	size_t		main_count = s->pools[pool].fifo_count[1];
	size_t		span = main_count > 0 ? main_count : 1;

	if (s->nghosts == 0)
		return -1;
	g = &s->ghosts[hash & (s->nghosts - 1)];
	if (g->hash != (hash | 1) || s->ghost_seq[g->fifo] - g->seq > span)
		return -1;
	return g->fifo;
}

/*
 * The small FIFO's share follows which FIFO lets go of keys that are read
 * again (keycache_policy.h): a key back from the small FIFO's ghost grows
 * it by POLICY_SMALL_GROW_KEYS keys' worth of the keys held, one back from
 * the main FIFO's shrinks it by POLICY_SMALL_SHRINK_KEYS keys' worth, within
 * POLICY_SMALL_MIN_PERCENT and POLICY_SMALL_MAX_PERCENT.
 */
static void
adapt_small_share(PolicyPool *p, size_t nkeys, bool grow)
{
	const uint64_t min = (uint64_t) POLICY_SHARE_ONE * POLICY_SMALL_MIN_PERCENT / 100;
	const uint64_t max = (uint64_t) POLICY_SHARE_ONE * POLICY_SMALL_MAX_PERCENT / 100;
	uint64_t	keys = nkeys > 0 ? nkeys : 1;
	uint64_t	share = p->small_share;
	uint64_t	step;

	step = (uint64_t) POLICY_SHARE_ONE *
		(grow ? POLICY_SMALL_GROW_KEYS : POLICY_SMALL_SHRINK_KEYS) / keys;
	if (step == 0)
		step = 1;
	if (grow)
		share = share + step > max ? max : share + step;
	else
		share = share < min + step ? min : share - step;
	p->small_share = (uint32_t) share;
}

/*
 * Add a new, pending entry for key: into the hash table (grown as needed)
 * and at the head of the small FIFO, or of the main FIFO if either FIFO
 * let it go lately (the ghost FIFO still remembers it), which adapts the
 * small FIFO's share.  The caller has checked that the key is absent.
 */
static PolicyEntry *
policy_insert_new(Policy *s, const char *key, size_t keylen)
{
	PolicyEntry *e = policy_alloc0(s, sizeof(PolicyEntry));
	size_t		b;
	int			q;
	int			origin;

	e->key = s->alloc_fn(keylen > 0 ? keylen : 1);
	memcpy(e->key, key, keylen);
	e->keylen = keylen;
	e->hash = policy_hash(key, keylen);
	e->state = POLICY_PENDING;
	e->bytes = 1;
	e->max_age_ms = POLICY_PERIOD_DEFAULT;
	e->stale_for_ms = POLICY_PERIOD_DEFAULT;
	for (q = 0; q < POLICY_NUM_QUEUES; q++)
		e->heap_pos[q] = -1;

	if (s->nentries >= s->nbuckets)
		policy_grow_buckets(s);
	b = e->hash & (s->nbuckets - 1);
	e->next = s->buckets[b];
	s->buckets[b] = e;
	s->nentries++;

	/* Its pool, for good: the caller says. */
	if (s->pool_of != NULL)
	{
		int			pool = s->pool_of(key, keylen, s->pool_arg);

		e->pool = (uint8_t) (pool > 0 && pool < POLICY_MAX_POOLS ? pool : 0);
	}

	/* Back soon after a FIFO let it go?  Then it goes to main. */
	origin = ghost_origin(s, e->hash, e->pool);
	if (origin >= 0)
	{
		PolicyPool *p = &s->pools[e->pool];

		s->ghosts[e->hash & (s->nghosts - 1)].hash = 0;
		adapt_small_share(p, p->fifo_count[0] + p->fifo_count[1] + 1,
						  origin == 0);
	}
	fifo_push(s, e, origin >= 0, true);
	return e;
}

static void owner_remove(Policy *s, PolicyEntry *e);

static void
policy_unlink(Policy *s, PolicyEntry *entry)
{
	PolicyEntry **link = &s->buckets[entry->hash & (s->nbuckets - 1)];

	while (*link != entry)
		link = &(*link)->next;
	*link = entry->next;
	s->nentries--;

	fifo_remove(s, entry);
	owner_remove(s, entry);
}

/* ----------------------------------------------------------------
 * Timer queues: binary min-heaps with back-pointers
 * ----------------------------------------------------------------
 */

static void
heap_set(PolicyHeap *h, PolicyQueue q, int i, PolicyEntry *e)
{
	POLICY_ASSERT(i >= 0 && i < h->capacity);
	h->items[i] = e;
	e->heap_pos[q] = i;
}

/*
 * Does a go before b in queue q?  Earlier time first; at the same time, FIFO.
 */
static inline bool
heap_before(const PolicyEntry *a, const PolicyEntry *b, PolicyQueue q)
{
	if (a->heap_time[q] != b->heap_time[q])
		return a->heap_time[q] < b->heap_time[q];
	return a->heap_seq[q] < b->heap_seq[q];
}

static void
heap_sift_up(PolicyHeap *h, PolicyQueue q, int i)
{
	PolicyEntry *e = h->items[i];

	while (i > 0)
	{
		int			parent = (i - 1) / 2;

		if (!heap_before(e, h->items[parent], q))
			break;
		heap_set(h, q, i, h->items[parent]);
		i = parent;
	}
	heap_set(h, q, i, e);
}

static void
heap_sift_down(PolicyHeap *h, PolicyQueue q, int i)
{
	PolicyEntry *e = h->items[i];

	for (;;)
	{
		int			child = 2 * i + 1;

		if (child >= h->count)
			break;
		if (child + 1 < h->count &&
			heap_before(h->items[child + 1], h->items[child], q))
			child++;
		if (!heap_before(h->items[child], e, q))
			break;
		heap_set(h, q, i, h->items[child]);
		i = child;
	}
	heap_set(h, q, i, e);
}

/* Take e, which is in it, out of heap h (of queue q). */
static void
heap_delete(PolicyHeap *h, PolicyQueue q, PolicyEntry *e)
{
	int			i = e->heap_pos[q];
	PolicyEntry *last;

	POLICY_ASSERT(i >= 0 && i < h->count && h->items[i] == e);
	e->heap_pos[q] = -1;
	last = h->items[--h->count];
	if (i == h->count)
		return;
	heap_set(h, q, i, last);
	heap_sift_up(h, q, i);
	heap_sift_down(h, q, last->heap_pos[q]);
}

/* Put e, which is in no heap of queue q, in heap h at 'when'. */
static void
heap_insert(Policy *s, PolicyHeap *h, PolicyQueue q, PolicyEntry *e,
			PolicyTime when)
{
	if (h->count == h->capacity)
	{
		int			newcap = h->capacity ? h->capacity * 2 : 16;
		PolicyEntry **items = s->alloc_fn(newcap * sizeof(PolicyEntry *));

		if (h->count > 0)
			memcpy(items, h->items, h->count * sizeof(PolicyEntry *));
		if (h->items)
			s->free_fn(h->items);
		h->items = items;
		h->capacity = newcap;
	}
	POLICY_ASSERT(e->heap_pos[q] == -1 && h->count < h->capacity);
	e->heap_time[q] = when;
	e->heap_seq[q] = s->heap_seq++;
	heap_set(h, q, h->count, e);
	h->count++;
	heap_sift_up(h, q, h->count - 1);
}

static bool
is_turn_queue(PolicyQueue q)
{
	return q == POLICY_QUEUE_TURN_NEW || q == POLICY_QUEUE_TURN_ONCE;
}

/* The heap of queue q that e is in, or would be in. */
static PolicyHeap *
heap_of(Policy *s, PolicyQueue q, const PolicyEntry *e)
{
	if (is_turn_queue(q))
	{
		POLICY_ASSERT(e->turn_flow != NULL);
		return &e->turn_flow->heaps[q - POLICY_QUEUE_TURN_NEW];
	}
	return &s->heaps[q];
}

static void turn_remove(Policy *s, PolicyQueue q, PolicyEntry *e);

/* Take e out of queue q, if it is there. */
static void
queue_remove(Policy *s, PolicyQueue q, PolicyEntry *e)
{
	if (e->heap_pos[q] < 0)
		return;
	if (is_turn_queue(q))
		turn_remove(s, q, e);
	else
		heap_delete(&s->heaps[q], q, e);
}

/*
 * Schedule e at 'when' in queue q, one of the timer queues (not a role's
 * turn), replacing any earlier schedule.
 */
static void
queue_schedule(Policy *s, PolicyQueue q, PolicyEntry *e, PolicyTime when)
{
	POLICY_ASSERT(!is_turn_queue(q));
	queue_remove(s, q, e);
	heap_insert(s, &s->heaps[q], q, e, when);
}

bool
policy_peek(const Policy *s, PolicyQueue queue, PolicyTime *when)
{
	const PolicyHeap *h = &s->heaps[queue];

	if (h->count == 0)
		return false;
	*when = h->items[0]->heap_time[queue];
	return true;
}

static PolicyEntry *
queue_pop_due(Policy *s, PolicyQueue q, PolicyTime now)
{
	PolicyHeap *h = &s->heaps[q];
	PolicyEntry *e;

	POLICY_ASSERT(!is_turn_queue(q));
	if (h->count == 0 || h->items[0]->heap_time[q] > now)
		return NULL;
	e = h->items[0];
	POLICY_ASSERT(e->heap_pos[q] == 0);
	queue_remove(s, q, e);
	return e;
}

/* ----------------------------------------------------------------
 * Roles: their turns (fair fetching) and their keys (owners)
 * ----------------------------------------------------------------
 */

static size_t
role_bucket(uint32_t id)
{
	return (size_t) ((id * UINT32_C(2654435761)) >> 24) %
		POLICY_ROLE_BUCKETS;
}

/* The flow of that id; created (out of the ring) if asked to. */
static PolicyFlow *
flow_get(Policy *s, uint32_t id, bool create)
{
	PolicyFlow **bucket = &s->flows[role_bucket(id)];
	PolicyFlow *f;

	for (f = *bucket; f != NULL; f = f->hash_next)
		if (f->id == id)
			return f;
	if (!create)
		return NULL;
	f = policy_alloc0(s, sizeof(PolicyFlow));
	f->id = id;
	f->hash_next = *bucket;
	*bucket = f;
	s->nflows++;
	return f;
}

static size_t
flow_waiting(const PolicyFlow *f)
{
	return (size_t) (f->heaps[0].count + f->heaps[1].count);
}

/* Forget an empty flow: out of the ring and the table. */
static void
flow_free(Policy *s, PolicyFlow *f)
{
	PolicyFlow **link = &s->flows[role_bucket(f->id)];
	int			i;

	POLICY_ASSERT(flow_waiting(f) == 0);
	if (f->turn_next == f)
		s->turn = NULL;
	else
	{
		f->turn_prev->turn_next = f->turn_next;
		f->turn_next->turn_prev = f->turn_prev;
		if (s->turn == f)
			s->turn = f->turn_next;
	}
	while (*link != f)
		link = &(*link)->hash_next;
	*link = f->hash_next;
	s->nflows--;
	for (i = 0; i < 2; i++)
		if (f->heaps[i].items != NULL)
			s->free_fn(f->heaps[i].items);
	s->free_fn(f);
}

/*
 * e is due: it waits in turn queue q of its flow, at its due time.  A flow
 * that had nothing waiting joins the ring last: its turn comes at the end
 * of the round under way.
 */
static void
turn_insert(Policy *s, PolicyQueue q, PolicyEntry *e, PolicyTime when)
{
	PolicyFlow *f = flow_get(s, e->flow, true);

	POLICY_ASSERT(is_turn_queue(q) && e->turn_flow == NULL);
	if (flow_waiting(f) == 0)
	{
		if (s->turn == NULL)
		{
			f->turn_prev = f->turn_next = f;
			s->turn = f;
		}
		else
		{
			f->turn_next = s->turn;
			f->turn_prev = s->turn->turn_prev;
			f->turn_prev->turn_next = f;
			s->turn->turn_prev = f;
		}
	}
	e->turn_flow = f;
	heap_insert(s, &f->heaps[q - POLICY_QUEUE_TURN_NEW], q, e, when);
	s->turn_count[q - POLICY_QUEUE_TURN_NEW]++;
}

/* Take e out of turn queue q of its flow; a flow left empty goes. */
static void
turn_remove(Policy *s, PolicyQueue q, PolicyEntry *e)
{
	PolicyFlow *f = e->turn_flow;

	POLICY_ASSERT(f != NULL && f->id == e->flow);
	heap_delete(&f->heaps[q - POLICY_QUEUE_TURN_NEW], q, e);
	POLICY_ASSERT(s->turn_count[q - POLICY_QUEUE_TURN_NEW] > 0);
	s->turn_count[q - POLICY_QUEUE_TURN_NEW]--;
	e->turn_flow = NULL;
	if (flow_waiting(f) == 0)
		flow_free(s, f);
}

/*
 * The next fetch by turns: the first demanded key of the role whose turn
 * it is, else its first key read once; the next role's turn follows.
 */
static PolicyEntry *
turn_pop(Policy *s)
{
	PolicyFlow *f = s->turn;
	PolicyQueue q;
	PolicyEntry *e;

	if (f == NULL)
		return NULL;
	q = f->heaps[0].count > 0 ? POLICY_QUEUE_TURN_NEW : POLICY_QUEUE_TURN_ONCE;
	e = f->heaps[q - POLICY_QUEUE_TURN_NEW].items[0];
	s->turn = f->turn_next;
	turn_remove(s, q, e);
	return e;
}

/* The owner of that id; created if asked to. */
static PolicyOwner *
owner_get(Policy *s, uint32_t id, bool create)
{
	PolicyOwner **bucket = &s->owners[role_bucket(id)];
	PolicyOwner *o;

	for (o = *bucket; o != NULL; o = o->hash_next)
		if (o->id == id)
			return o;
	if (!create)
		return NULL;
	o = policy_alloc0(s, sizeof(PolicyOwner));
	o->id = id;
	o->hash_next = *bucket;
	*bucket = o;
	return o;
}

/* Put e, of owner o, at the newest end of o's FIFO. */
static void
owner_push_newest(PolicyOwner *o, PolicyEntry *e)
{
	e->owner_older = o->newest;
	e->owner_newer = NULL;
	if (o->newest != NULL)
		o->newest->owner_newer = e;
	o->newest = e;
	if (o->oldest == NULL)
		o->oldest = e;
	o->count++;
}

static void
owner_unlink(PolicyOwner *o, PolicyEntry *e)
{
	POLICY_ASSERT(o->count > 0);
	if (e->owner_newer != NULL)
		e->owner_newer->owner_older = e->owner_older;
	else
		o->newest = e->owner_older;
	if (e->owner_older != NULL)
		e->owner_older->owner_newer = e->owner_newer;
	else
		o->oldest = e->owner_newer;
	e->owner_newer = e->owner_older = NULL;
	o->count--;
}

/* Take e out of its owner's FIFO; an owner left with no key goes. */
static void
owner_remove(Policy *s, PolicyEntry *e)
{
	PolicyOwner **link;
	PolicyOwner *o;

	if (e->owner == 0)
		return;
	o = owner_get(s, e->owner, false);
	POLICY_ASSERT(o != NULL);
	owner_unlink(o, e);
	e->owner = 0;
	if (o->count > 0)
		return;
	link = &s->owners[role_bucket(o->id)];
	while (*link != o)
		link = &(*link)->hash_next;
	*link = o->hash_next;
	s->free_fn(o);
}

/* ----------------------------------------------------------------
 * Life cycle
 * ----------------------------------------------------------------
 */

Policy *
policy_create(const PolicyConfig *config, PolicyAllocFn alloc_fn,
			  PolicyFreeFn free_fn)
{
	Policy	   *s = alloc_fn(sizeof(Policy));

	memset(s, 0, sizeof(Policy));
	s->alloc_fn = alloc_fn;
	s->free_fn = free_fn;
	s->config = *config;
	s->nbuckets = POLICY_INITIAL_BUCKETS;
	s->buckets = policy_alloc0(s, s->nbuckets * sizeof(PolicyEntry *));
	for (int p = 0; p < POLICY_MAX_POOLS; p++)
	{
		s->pools[p].small_share = (uint32_t) ((uint64_t) POLICY_SHARE_ONE *
											  POLICY_SMALL_MIN_PERCENT / 100);
		s->pools[p].max_retry_backoff_ms = -1;
		s->pools[p].refresh_interval_ms = -1;
	}
	return s;
}

static void
policy_free_entry(Policy *s, PolicyEntry *e)
{
	s->free_fn(e->key);
	s->free_fn(e);
}

void
policy_destroy(Policy *s)
{
	size_t		i;
	int			q;

	for (i = 0; i < s->nbuckets; i++)
	{
		PolicyEntry *e = s->buckets[i];

		while (e)
		{
			PolicyEntry *next = e->next;

			policy_free_entry(s, e);
			e = next;
		}
	}
	s->free_fn(s->buckets);
	if (s->ghosts != NULL)
		s->free_fn(s->ghosts);
	for (q = 0; q < POLICY_NUM_QUEUES; q++)
		if (s->heaps[q].items)
			s->free_fn(s->heaps[q].items);
	for (i = 0; i < POLICY_ROLE_BUCKETS; i++)
	{
		while (s->flows[i] != NULL)
		{
			PolicyFlow *f = s->flows[i];

			s->flows[i] = f->hash_next;
			for (q = 0; q < 2; q++)
				if (f->heaps[q].items)
					s->free_fn(f->heaps[q].items);
			s->free_fn(f);
		}
		while (s->owners[i] != NULL)
		{
			PolicyOwner *o = s->owners[i];

			s->owners[i] = o->hash_next;
			s->free_fn(o);
		}
	}
	if (s->batch)
		s->free_fn(s->batch);
	if (s->dispatched)
		s->free_fn(s->dispatched);
	s->free_fn(s);
}

/*
 * New settings apply to what is scheduled from now on; times already in
 * the queues stay as they were, except evictions: a changed expiry or
 * grace period moves the eviction of every cached key that follows it (has
 * no period of its own in its place) by the difference, so that a key is
 * evicted at the end of its periods after the fetch that scheduled it,
 * under the settings now in force.  Returns the number of keys whose
 * eviction moved.
 */
size_t
policy_set_config(Policy *s, const PolicyConfig *config)
{
	PolicyConfig old = s->config;
	size_t		moved = 0;
	PolicyEntry *e;
	int			f;

	s->config = *config;
	if (old.expiry_ms == config->expiry_ms &&
		old.grace_period_ms == config->grace_period_ms)
		return 0;
	for (int p = 0; p < POLICY_MAX_POOLS; p++)
		for (f = 0; f < 2; f++)
			for (e = s->pools[p].fifo_head[f]; e != NULL; e = e->fifo_older)
			{
				int64_t		shift;

				if (!e->has_expiry)
					continue;
				shift = (policy_period(e->max_age_ms, config->expiry_ms) -
						 policy_period(e->max_age_ms, old.expiry_ms)) +
					(policy_period(e->stale_for_ms, config->grace_period_ms) -
					 policy_period(e->stale_for_ms, old.grace_period_ms));
				if (shift == 0)
					continue;
				e->expiry += shift;
				moved++;
				if (e->heap_pos[POLICY_QUEUE_EVICT] >= 0)
					queue_schedule(s, POLICY_QUEUE_EVICT, e, e->expiry);
			}
	return moved;
}

const PolicyConfig *
policy_config(const Policy *s)
{
	return &s->config;
}

/* ----------------------------------------------------------------
 * The state machine
 * ----------------------------------------------------------------
 */

static bool
entry_is_fresh(const Policy *s, const PolicyEntry *e, PolicyTime now)
{
	if (e->invalidated)
		return false;
	return policy_freshness(e->last_fetch, now, policy_max_age(s, e),
							policy_stale_for(s, e)) == POLICY_FRESH;
}

/* The queues a fetch waits in, for its due time or its turn. */
static const PolicyQueue due_queues[] = {
	POLICY_QUEUE_DUE, POLICY_QUEUE_DUE_NEW, POLICY_QUEUE_DUE_ONCE,
	POLICY_QUEUE_TURN_NEW, POLICY_QUEUE_TURN_ONCE
};

/* The queue a fetch of e waits in. */
static PolicyQueue
due_queue_for(const PolicyEntry *e)
{
	if (e->has_last_fetch || e->invalidated)
		return POLICY_QUEUE_DUE;
	if (e->in_main || e->demanded)
		return POLICY_QUEUE_DUE_NEW;
	return POLICY_QUEUE_DUE_ONCE;
}

/* The queue e waits in, or -1 if its fetch is not waiting in one. */
static int
waiting_queue(const PolicyEntry *e)
{
	int			i;

	for (i = 0; i < (int) (sizeof(due_queues) / sizeof(due_queues[0])); i++)
		if (e->heap_pos[due_queues[i]] >= 0)
			return due_queues[i];
	return -1;
}

/*
 * Queue e's fetch, due at 'when': a cached key's in POLICY_QUEUE_DUE; a new
 * key's for its due time, or if that has come, for its role's turn.
 */
static void
schedule_fetch(Policy *s, PolicyEntry *e, PolicyTime when, PolicyTime now)
{
	PolicyQueue q = due_queue_for(e);

	if (q == POLICY_QUEUE_DUE || when > now)
		queue_schedule(s, q, e, when);
	else
		turn_insert(s, q == POLICY_QUEUE_DUE_NEW ? POLICY_QUEUE_TURN_NEW :
					POLICY_QUEUE_TURN_ONCE, e, when);
}

/*
 * Begin a fetch of e unless one is in progress or its value is fresh: a
 * second request while in progress does nothing, but a normal request
 * upgrades an in-progress refresh.  Returns e if the caller must put it in
 * a batch, else NULL.
 */
static PolicyEntry *
entry_try_begin_fetch(Policy *s, PolicyEntry *e, bool is_refresh, PolicyTime now)
{
	PolicyTime	initiated;
	bool		has_when = false;
	PolicyTime	when = 0;

	switch (e->state)
	{
		case POLICY_IN_PROGRESS:
			/* Nothing to do but upgrade a refresh to a normal fetch. */
			e->is_refresh = e->is_refresh && is_refresh;
			return NULL;
		case POLICY_PENDING:
			/* Even while backing off: the fetch just waits for its time. */
			initiated = e->has_initiated ? e->initiated : now;
			has_when = e->has_next_attempt;
			when = e->next_attempt;
			break;
		case POLICY_COMPLETE:
		default:
			if (entry_is_fresh(s, e, now))
				return NULL;
			initiated = now;
			break;
	}

	e->state = POLICY_IN_PROGRESS;
	e->is_refresh = is_refresh;
	e->dispatched = false;
	e->gathered = false;
	e->has_fetch_when = has_when;
	e->fetch_when = when;
	e->fetch_initiated = initiated;
	e->has_previous_fetch = e->has_last_fetch;
	e->previous_fetch = e->last_fetch;
	e->refetch_after = false;

	/* No eviction while a fetch is running; completion reschedules it. */
	queue_remove(s, POLICY_QUEUE_EVICT, e);
	/* A refresh firing meanwhile finds the fetch running and does nothing. */
	schedule_fetch(s, e, has_when && when > now ? when : now, now);
	return e;
}

PolicyEntry *
policy_try_begin_fetch(Policy *s, const char *key, size_t keylen,
					   bool is_refresh, PolicyTime now)
{
	PolicyEntry *e = policy_lookup(s, key, keylen);

	if (e == NULL)
	{
		/* A rogue refresh (the key was evicted) must not re-create it. */
		if (is_refresh)
			return NULL;
		e = policy_insert_new(s, key, keylen);
	}
	return entry_try_begin_fetch(s, e, is_refresh, now);
}

/*
 * Make the key stale now: the value keeps serving, and a normal fetch is
 * begun at once.  If a fetch is already waiting for its backoff, it is made
 * due now; if one is already running, it may carry data older than the
 * invalidation, so another fetch follows it.
 */
PolicyEntry *
policy_invalidate(Policy *s, const char *key, size_t keylen, PolicyTime now)
{
	PolicyEntry *e = policy_lookup(s, key, keylen);

	if (e == NULL)
		return policy_try_begin_fetch(s, key, keylen, false, now);

	e->invalidated = true;
	if (e->state == POLICY_IN_PROGRESS)
	{
		e->is_refresh = false;
		if (e->dispatched)
			e->refetch_after = true;
		else if (waiting_queue(e) >= 0)
		{
			/* Waiting for its turn or its backoff: due now, with priority. */
			queue_remove(s, waiting_queue(e), e);
			e->has_fetch_when = false;
			queue_schedule(s, POLICY_QUEUE_DUE, e, now);
		}
		/* else: gathered in the open batch, not sent yet: nothing to do */
		return NULL;
	}
	if (e->state == POLICY_PENDING)
		e->has_next_attempt = false;
	return entry_try_begin_fetch(s, e, false, now);
}

/*
 * Schedule the next refresh of a COMPLETE key, if the configured interval
 * lies strictly between the key's own fresh and stale periods (which may
 * differ from the configuration's): else none, and any scheduled goes.
 */
/* The bound of e's backoff: its pool's own, else the config's. */
static int64_t
max_retry_backoff(const Policy *s, const PolicyEntry *e)
{
	int64_t		own = s->pools[e->pool].max_retry_backoff_ms;

	return own >= 0 ? own : s->config.max_retry_backoff_ms;
}

static void
schedule_refresh(Policy *s, PolicyEntry *e, PolicyTime now)
{
	int64_t		own = s->pools[e->pool].refresh_interval_ms;
	int64_t		refresh = own >= 0 ? own : s->config.refresh_interval_ms;

	if (refresh > 0 &&
		policy_refresh_interval_valid(policy_max_age(s, e),
									  policy_stale_for(s, e), refresh))
		queue_schedule(s, POLICY_QUEUE_REFRESH, e, now + refresh);
	else
		queue_remove(s, POLICY_QUEUE_REFRESH, e);
}

/*
 * A fetch of e ended with result.  A value (enabled or disabled) or
 * not_modified takes the key's own periods, resets the backoff, schedules
 * the eviction at the end of those periods (unless it was a refresh, which
 * does not push it) and the refresh; pending or an error keeps the value
 * and its periods and retries after the backoff.  Says what the worker
 * must publish.
 */
PolicyCompletion
policy_complete_fetch(Policy *s, PolicyEntry *e, PolicyResult result,
					  const PolicyPeriods *periods, PolicyTime now)
{
	bool		is_refresh = e->is_refresh;

	/* Only a fetch that was begun completes; release builds retry. */
	POLICY_ASSERT(e->state == POLICY_IN_PROGRESS);
	if (e->state != POLICY_IN_PROGRESS)
	{
		e->state = POLICY_PENDING;
		entry_try_begin_fetch(s, e, false, now);
		return POLICY_RESCHEDULED;
	}
	e->dispatched = false;

	if (e->evict_after)
	{
		policy_evict(s, e);
		return POLICY_EVICTED;
	}

	if (result == POLICY_RESULT_PENDING)
	{
		int64_t		delay;

		e->attempts++;
		delay = policy_backoff_delay(e->attempts, max_retry_backoff(s, e));
		e->state = POLICY_PENDING;
		e->has_initiated = true;
		e->initiated = e->fetch_initiated;
		e->has_next_attempt = delay > 0;
		e->next_attempt = now + delay;
		entry_try_begin_fetch(s, e, is_refresh, now);
		return POLICY_RESCHEDULED;
	}

	/* A value, or confirmation that the current one is still right. */
	e->attempts = 0;
	e->has_initiated = false;
	e->has_next_attempt = false;
	e->has_last_fetch = true;
	e->last_fetch = now;
	e->invalidated = false;
	e->max_age_ms = periods ? periods->max_age_ms : POLICY_PERIOD_DEFAULT;
	e->stale_for_ms = periods ? periods->stale_for_ms : POLICY_PERIOD_DEFAULT;
	POLICY_ASSERT(e->max_age_ms >= 0 || e->max_age_ms == POLICY_PERIOD_DEFAULT);
	POLICY_ASSERT(e->stale_for_ms >= 0 ||
				  e->stale_for_ms == POLICY_PERIOD_DEFAULT);
	/* A refresh does not push the eviction: refreshed keys still age out. */
	if (!(is_refresh && e->has_expiry))
	{
		e->has_expiry = true;
		e->expiry = now + entry_lifetime(s, e);
	}
	e->state = POLICY_COMPLETE;
	queue_schedule(s, POLICY_QUEUE_EVICT, e, e->expiry);
	schedule_refresh(s, e, now);

	if (e->refetch_after)
	{
		e->refetch_after = false;
		e->invalidated = true;
		entry_try_begin_fetch(s, e, false, now);
		return POLICY_RESCHEDULED;
	}
	return POLICY_DONE;
}

PolicyEntry *
policy_pop_eviction(Policy *s, PolicyTime now)
{
	return queue_pop_due(s, POLICY_QUEUE_EVICT, now);
}

PolicyEntry *
policy_pop_refresh(Policy *s, PolicyTime now)
{
	return queue_pop_due(s, POLICY_QUEUE_REFRESH, now);
}

/* Forget the key: its queued timers go with it. */
void
policy_evict(Policy *s, PolicyEntry *e)
{
	int			q;
	int			i;

	for (q = 0; q < POLICY_NUM_QUEUES; q++)
		queue_remove(s, q, e);
	for (i = 0; e->gathered && i < s->batch_count; i++)
	{
		if (s->batch[i] == e)
		{
			s->batch[i] = s->batch[--s->batch_count];
			break;
		}
	}
	policy_unlink(s, e);
	policy_free_entry(s, e);
}

/* May the key be evicted under memory pressure?  Not while its fetch is out. */
bool
policy_evictable(const PolicyEntry *e)
{
	return !(e->state == POLICY_IN_PROGRESS && (e->dispatched || e->gathered));
}

/* Does the small FIFO hold its share of what the keys weigh? */
static bool
small_holds_share(const PolicyPool *p)
{
	uint64_t	small = p->fifo_bytes[0];
	uint64_t	total = small + p->fifo_bytes[1];

	/* keys weigh at most the memory they take: no product overflows */
	return small * POLICY_SHARE_ONE >= total * p->small_share;
}

/*
 * The next victim of S3-FIFO (see keycache_policy.h).  Each key is looked at
 * most twice per call (a key of the small FIFO may move to main, and be
 * looked at there once more), so a call ends even when every key was
 * visited or none can be evicted.
 */
PolicyEntry *
policy_memory_victim(Policy *s, int pool, PolicyVisitedFn visited, void *arg)
{
	PolicyPool *p = &s->pools[pool];
	size_t		looks = 2 * (p->fifo_count[0] + p->fifo_count[1]) + 1;
	size_t		small_looks = 0;
	size_t		main_looks = 0;

	while (looks-- > 0 && p->fifo_count[0] + p->fifo_count[1] > 0)
	{
		PolicyEntry *e;

		/*
		 * The small FIFO while it holds its share of the bytes, unless each
		 * of its keys was passed over in this call for being fetched; and
		 * once each key of the main FIFO was looked at twice in this call
		 * without a victim (the caller keeps every one of them: values in
		 * use, keycache_worker.c's "Admission").
		 */
		if (p->fifo_count[0] > 0 && small_looks < p->fifo_count[0] &&
			(small_holds_share(p) || p->fifo_count[1] == 0 ||
			 main_looks >= 2 * p->fifo_count[1]))
		{
			e = p->fifo_tail[0];
			if (!policy_evictable(e))
			{
				/* being fetched: stays in the small FIFO, untouched */
				small_looks++;
				fifo_remove(s, e);
				fifo_push(s, e, false, true);
			}
			else if (visited(e, arg))
			{
				/* read again: promoted, mark cleared, its fetch demanded */
				fifo_remove(s, e);
				fifo_push(s, e, true, true);
				if (e->state == POLICY_IN_PROGRESS)
					policy_note_demand(s, e);
			}
			else
				return e;
			continue;
		}
		if (p->fifo_count[1] == 0)
			break;
		e = p->fifo_tail[1];
		main_looks++;
		if (policy_evictable(e) && !visited(e, arg))
			return e;
		/* read again since last looked at, or being fetched: reinserted */
		fifo_remove(s, e);
		fifo_push(s, e, true, true);
	}
	return NULL;
}

void
policy_evict_victim(Policy *s, PolicyEntry *victim)
{
	struct PolicyGhost *g;
	int			f = victim->in_main ? 1 : 0;

	/* Room for about twice as many hashes as keys; growing forgets them. */
	if (s->nghosts < 2 * s->nentries || s->nghosts == 0)
	{
		size_t		n = POLICY_MIN_GHOST_SLOTS;

		while (n < 2 * s->nentries)
			n *= 2;
		if (s->ghosts != NULL)
			s->free_fn(s->ghosts);
		s->ghosts = policy_alloc0(s, n * sizeof(struct PolicyGhost));
		s->nghosts = n;
	}
	g = &s->ghosts[victim->hash & (s->nghosts - 1)];
	g->hash = victim->hash | 1;
	g->fifo = (uint8_t) f;
	g->seq = s->ghost_seq[f]++;
	policy_evict(s, victim);
}

bool
policy_in_ghost(const Policy *s, const char *key, size_t keylen)
{
	return ghost_origin(s, policy_hash(key, keylen), 0) >= 0;
}

uint32_t
policy_small_share(const Policy *s)
{
	return s->pools[0].small_share;
}

size_t
policy_small_count(const Policy *s)
{
	return s->pools[0].fifo_count[0];
}

void
policy_set_bytes(Policy *s, PolicyEntry *e, size_t bytes)
{
	PolicyPool *p = &s->pools[e->pool];
	int			f = e->in_main ? 1 : 0;

	if (bytes == 0)
		bytes = 1;
	POLICY_ASSERT(p->fifo_bytes[f] >= e->bytes);
	p->fifo_bytes[f] -= e->bytes;
	p->fifo_bytes[f] += bytes;
	e->bytes = bytes;
}

size_t
policy_fifo_bytes(const Policy *s, bool main)
{
	return s->pools[0].fifo_bytes[main ? 1 : 0];
}

void
policy_set_pool_fn(Policy *s, PolicyPoolFn pool_of, void *arg)
{
	s->pool_of = pool_of;
	s->pool_arg = arg;
}

void
policy_set_pool_config(Policy *s, int pool, int64_t max_retry_backoff_ms,
					   int64_t refresh_interval_ms)
{
	s->pools[pool].max_retry_backoff_ms = max_retry_backoff_ms;
	s->pools[pool].refresh_interval_ms = refresh_interval_ms;
}

size_t
policy_pool_bytes(const Policy *s, int pool)
{
	return s->pools[pool].fifo_bytes[0] + s->pools[pool].fifo_bytes[1];
}

size_t
policy_pool_count(const Policy *s, int pool)
{
	return s->pools[pool].fifo_count[0] + s->pools[pool].fifo_count[1];
}

/*
 * Who pays for room (see keycache_policy.h).  The largest pool without a
 * budget that can give a key, or -1.
 */
static int
largest_unbudgeted(const PolicyPoolUse *pools, int npools)
{
	int			best = -1;

	for (int p = 0; p < npools; p++)
		if (pools[p].budget == 0 && pools[p].can_give &&
			(best < 0 || pools[p].bytes > pools[best].bytes))
			best = p;
	return best;
}

/* The pool most over its budget that can give a key, or -1. */
static int
most_over_budget(const PolicyPoolUse *pools, int npools)
{
	int			best = -1;
	size_t		most = 0;

	for (int p = 0; p < npools; p++)
	{
		if (pools[p].budget == 0 || pools[p].bytes <= pools[p].budget ||
			!pools[p].can_give)
			continue;
		if (best < 0 || pools[p].bytes - pools[p].budget > most)
		{
			best = p;
			most = pools[p].bytes - pools[p].budget;
		}
	}
	return best;
}

int
policy_room_payer(const PolicyPoolUse *pools, int npools, int writer,
				  size_t need, size_t freed, size_t used, size_t target)
{
	size_t		growth = need > freed ? need - freed : 0;
	size_t		reserved = 0;
	size_t		pooled = 0;
	size_t		unbudgeted = 0;
	size_t		overhead;
	size_t		share;
	bool		past_target = used + need > target;
	bool		past_share;
	int			payer;

	POLICY_ASSERT(writer >= POLICY_ROOM_NO_WRITER && writer < npools);
	for (int p = 0; p < npools; p++)
	{
		reserved += pools[p].budget;
		pooled += pools[p].bytes;
		if (pools[p].budget == 0)
			unbudgeted += pools[p].bytes;
	}
	overhead = used > pooled ? used - pooled : 0;
	share = target > overhead + reserved ? target - overhead - reserved : 0;
	past_share = unbudgeted > share;

	if (writer >= 0 && pools[writer].budget > 0)
	{
		const PolicyPoolUse *w = &pools[writer];

		if (need > w->budget)
			return POLICY_ROOM_TOO_LARGE;
		if (w->bytes + growth > w->budget)
			return w->can_give ? writer : POLICY_ROOM_REFUSED;
		if (!past_target)
			return POLICY_ROOM_FITS;
		/* Those holding more than their share give it back first. */
		payer = past_share ? largest_unbudgeted(pools, npools) : -1;
		if (payer < 0)
			payer = most_over_budget(pools, npools);
		if (payer < 0 && w->can_give)
			payer = writer;
		return payer >= 0 ? payer : POLICY_ROOM_REFUSED;
	}

	/* A writer without a budget, or none: the shared part pays. */
	if (writer >= 0 && unbudgeted + growth > share)
	{
		payer = largest_unbudgeted(pools, npools);
		return payer >= 0 ? payer : POLICY_ROOM_REFUSED;
	}
	if (!past_target)
		return POLICY_ROOM_FITS;
	payer = past_share ? -1 : most_over_budget(pools, npools);
	if (payer < 0)
		payer = largest_unbudgeted(pools, npools);
	if (payer < 0)
		payer = most_over_budget(pools, npools);
	return payer >= 0 ? payer : POLICY_ROOM_REFUSED;
}

/* The first key of pool's FIFOs in keep order at or after pool: main, small. */
static PolicyEntry *
keep_order_from(const Policy *s, int pool, bool main)
{
	for (; pool < POLICY_MAX_POOLS; pool++, main = true)
	{
		if (main && s->pools[pool].fifo_head[1] != NULL)
			return s->pools[pool].fifo_head[1];
		if (s->pools[pool].fifo_head[0] != NULL)
			return s->pools[pool].fifo_head[0];
	}
	return NULL;
}

PolicyEntry *
policy_keep_order_next(const Policy *s, const PolicyEntry *prev)
{
	if (prev == NULL)
		return keep_order_from(s, 0, true);
	if (prev->fifo_older != NULL)
		return prev->fifo_older;
	if (prev->in_main)
		return keep_order_from(s, prev->pool, false);
	return keep_order_from(s, prev->pool + 1, true);
}

void
policy_restore_fifo(Policy *s, PolicyEntry *e, bool main)
{
	fifo_remove(s, e);
	fifo_push(s, e, main, false);
}

PolicyEvictReply
policy_request_evict(Policy *s, const char *key, size_t keylen)
{
	PolicyEntry *e = policy_lookup(s, key, keylen);

	if (e == NULL)
		return POLICY_EVICT_NOW;
	if (e->state == POLICY_IN_PROGRESS && e->dispatched)
	{
		e->evict_after = true;
		return POLICY_EVICT_DEFERRED;
	}
	policy_evict(s, e);
	return POLICY_EVICT_NOW;
}

/* ----------------------------------------------------------------
 * Batching
 * ----------------------------------------------------------------
 */

static void
ensure_capacity(Policy *s, PolicyEntry ***array, int *capacity, int needed)
{
	PolicyEntry **grown;

	if (*capacity >= needed)
		return;
	grown = s->alloc_fn(needed * sizeof(PolicyEntry *));
	if (*array)
	{
		memcpy(grown, *array, *capacity * sizeof(PolicyEntry *));
		s->free_fn(*array);
	}
	*array = grown;
	*capacity = needed;
}

/* ----------------------------------------------------------------
 * Fair fetching (see keycache_policy.h)
 * ----------------------------------------------------------------
 */

/*
 * Move e from queue 'from' to queue 'to' (both timer queues, or both turn
 * queues of its flow), where it takes the place it would have had, had it
 * been there from the start.
 */
static void
requeue_in_place(Policy *s, PolicyEntry *e, PolicyQueue from, PolicyQueue to)
{
	PolicyTime	when = e->heap_time[from];
	uint64_t	seq = e->heap_seq[from];
	PolicyHeap *h;

	POLICY_ASSERT(is_turn_queue(from) == is_turn_queue(to));
	h = heap_of(s, to, e);
	heap_delete(heap_of(s, from, e), from, e);
	heap_insert(s, h, to, e, when);
	if (is_turn_queue(from))
	{
		/* same flow: it stays in the ring where it is */
		s->turn_count[from - POLICY_QUEUE_TURN_NEW]--;
		s->turn_count[to - POLICY_QUEUE_TURN_NEW]++;
	}
	e->heap_seq[to] = seq;
	heap_sift_up(h, to, e->heap_pos[to]);
}

void
policy_note_demand(Policy *s, PolicyEntry *e)
{
	e->demanded = true;
	if (e->heap_pos[POLICY_QUEUE_DUE_ONCE] >= 0)
		requeue_in_place(s, e, POLICY_QUEUE_DUE_ONCE, POLICY_QUEUE_DUE_NEW);
	else if (e->heap_pos[POLICY_QUEUE_TURN_ONCE] >= 0)
		requeue_in_place(s, e, POLICY_QUEUE_TURN_ONCE, POLICY_QUEUE_TURN_NEW);
}

size_t
policy_flow_waiting(const Policy *s, uint32_t flow)
{
	PolicyFlow *f = flow_get((Policy *) s, flow, false);

	return f != NULL ? flow_waiting(f) : 0;
}

size_t
policy_flow_count(const Policy *s)
{
	return s->nflows;
}

void
policy_set_flow(Policy *s, PolicyEntry *e, uint32_t flow)
{
	int			q;
	PolicyTime	when;

	if (e->has_flow &&
		(e->flow == flow ||
		 policy_flow_waiting(s, flow) + 2 > policy_flow_waiting(s, e->flow)))
		return;
	e->has_flow = true;
	q = waiting_queue(e);
	if (q < 0 || !is_turn_queue(q))
	{
		e->flow = flow;
		return;
	}
	/* Waiting for its turn: it waits for the new role's, from its due time. */
	when = e->heap_time[q];
	turn_remove(s, q, e);
	e->flow = flow;
	turn_insert(s, q, e, when);
}

void
policy_set_owner(Policy *s, PolicyEntry *e, uint32_t owner)
{
	if (e->owner == owner)
		return;
	owner_remove(s, e);
	e->owner = owner;
	if (owner != 0)
		owner_push_newest(owner_get(s, owner, true), e);
}

size_t
policy_owner_count(const Policy *s, uint32_t owner)
{
	PolicyOwner *o = owner_get((Policy *) s, owner, false);

	return o != NULL ? o->count : 0;
}

PolicyEntry *
policy_owner_victim(Policy *s, uint32_t owner, PolicyVisitedFn visited,
					void *arg)
{
	PolicyOwner *o = owner_get(s, owner, false);
	size_t		looks;

	if (o == NULL || owner == 0)
		return NULL;
	for (looks = 2 * o->count; looks > 0; looks--)
	{
		PolicyEntry *e = o->oldest;

		if (policy_evictable(e) && !visited(e, arg))
			return e;
		/* being fetched, or read since last looked at: a second chance */
		owner_unlink(o, e);
		owner_push_newest(o, e);
	}
	return NULL;
}

/*
 * A role's bounds (see keycache_policy.h).  Each is checked on its own; a
 * bound of 0 is none.
 */
bool
policy_role_fits(uint64_t keys, uint64_t bytes, uint64_t add_bytes,
				 uint64_t key_bound, uint64_t byte_bound)
{
	if (key_bound > 0 && keys + 1 > key_bound)
		return false;
	if (byte_bound > 0 && bytes + add_bytes > byte_bound)
		return false;
	return true;
}

bool
policy_role_over_low(uint64_t keys, uint64_t bytes, uint64_t key_bound,
					 uint64_t byte_bound)
{
	if (key_bound > 0 && keys > key_bound - (key_bound / 20 > 0 ? key_bound / 20 : 1))
		return true;
	if (byte_bound > 0 && bytes > byte_bound - byte_bound / 20)
		return true;
	return false;
}

/*
 * Is the small FIFO's oldest key one that holds a value and is not being
 * fetched?  Then memory that is short is eviction's to make: its next victim
 * is that key, read once before any fetch now waiting was asked for
 * (unless read since, when it moves on and the next oldest is looked at),
 * and nobody read it again.  A fetch waiting for its turn was asked for
 * later, by a reader that may wait for it next (a cold start reads every
 * key once, then waits for each): dropping it would cost that reader a
 * fetch of its own, while the older key costs nobody anything.
 */
static bool
once_behind_value(const Policy *s)
{
	const PolicyEntry *oldest = s->pools[0].fifo_tail[0];

	return oldest != NULL && oldest->has_last_fetch &&
		policy_evictable(oldest);
}

PolicyEntry *
policy_once_excess(Policy *s, size_t limit, bool memory_short)
{
	PolicyFlow *f = s->turn;
	PolicyFlow *most = NULL;
	PolicyEntry *e;

	/*
	 * A dropped fetch saves only memory: with room, every key read once is
	 * fetched, in full batches, for a reader may wait for it next.  Nor while
	 * eviction has an older key read once to take (once_behind_value) and the
	 * memory it frees.
	 */
	if (!memory_short || s->turn_count[1] <= limit ||
		once_behind_value(s))
		return NULL;
	/* The role with the most; of equals, the one whose turn comes first. */
	do
	{
		if (most == NULL || f->heaps[1].count > most->heaps[1].count)
			most = f;
		f = f->turn_next;
	} while (f != s->turn);
	POLICY_ASSERT(most != NULL && most->heaps[1].count > 0);
	e = most->heaps[1].items[0];
	/* Waiting, so neither gathered nor dispatched: it may go. */
	POLICY_ASSERT(policy_evictable(e));
	return e;
}

size_t
policy_once_count(const Policy *s)
{
	return (size_t) s->heaps[POLICY_QUEUE_DUE_ONCE].count + s->turn_count[1];
}

/*
 * The next fetch for the open batch: a cached key's, first due first, but
 * after POLICY_CACHED_RUN of them in a row while new keys wait, a new key's
 * by turns (see "Fair fetching" in keycache_policy.h); NULL if none is due.
 */
static PolicyEntry *
next_fetch(Policy *s, PolicyTime now)
{
	PolicyEntry *e = NULL;

	if (s->turn != NULL && s->cached_run >= POLICY_CACHED_RUN)
		e = turn_pop(s);
	else if ((e = queue_pop_due(s, POLICY_QUEUE_DUE, now)) != NULL)
	{
		if (s->turn != NULL)
			s->cached_run++;
		return e;
	}
	else
		e = turn_pop(s);
	s->cached_run = 0;
	return e;
}

/*
 * The batch to fetch now, if any: up to batch_size keys due for a fetch,
 * gathered since the first of them came due; handed out once that was
 * batch_interval_ms ago or the batch is full.  Returns the number of keys,
 * with *batch pointing at them (they count as dispatched from then on).
 */
int
policy_ready_batch(Policy *s, PolicyTime now, int batch_size,
				   int64_t batch_interval_ms, PolicyEntry ***batch)
{
	PolicyEntry *e;
	int			n;
	int			i;

	if (batch_size < 1)
		batch_size = 1;
	ensure_capacity(s, &s->batch, &s->batch_capacity, batch_size);

	/* New keys whose backoff is over wait for their role's turn. */
	while ((e = queue_pop_due(s, POLICY_QUEUE_DUE_NEW, now)) != NULL)
		turn_insert(s, POLICY_QUEUE_TURN_NEW, e,
					e->heap_time[POLICY_QUEUE_DUE_NEW]);
	while ((e = queue_pop_due(s, POLICY_QUEUE_DUE_ONCE, now)) != NULL)
		turn_insert(s, POLICY_QUEUE_TURN_ONCE, e,
					e->heap_time[POLICY_QUEUE_DUE_ONCE]);

	while (s->batch_count < batch_size && (e = next_fetch(s, now)) != NULL)
	{
		if (s->batch_count == 0)
			s->batch_opened = now;
		e->gathered = true;
		s->batch[s->batch_count++] = e;
	}

	if (s->batch_count == 0 ||
		(s->batch_count < batch_size &&
		 now < s->batch_opened + batch_interval_ms))
		return 0;

	/* Only now is the fetch under way: until then it can still be dropped. */
	n = s->batch_count;
	for (i = 0; i < n; i++)
	{
		s->batch[i]->dispatched = true;
		s->batch[i]->gathered = false;
	}
	ensure_capacity(s, &s->dispatched, &s->dispatched_capacity, n);
	memcpy(s->dispatched, s->batch, n * sizeof(PolicyEntry *));
	s->batch_count = 0;
	*batch = s->dispatched;
	return n;
}

bool
policy_next_wakeup(const Policy *s, int64_t batch_interval_ms, PolicyTime *when)
{
	bool		found = false;
	PolicyTime	best = 0;
	int			q;

	for (q = 0; q < POLICY_NUM_QUEUES; q++)
	{
		PolicyTime	t;

		if (policy_peek(s, q, &t) && (!found || t < best))
		{
			best = t;
			found = true;
		}
	}
	if (s->turn != NULL)
	{
		/* Due already: the first waiting of the role whose turn is next. */
		PolicyQueue tq = s->turn->heaps[0].count > 0 ?
			POLICY_QUEUE_TURN_NEW : POLICY_QUEUE_TURN_ONCE;
		const PolicyHeap *h = &s->turn->heaps[tq - POLICY_QUEUE_TURN_NEW];
		PolicyTime	t = h->items[0]->heap_time[tq];

		if (!found || t < best)
			best = t;
		found = true;
	}
	if (s->batch_count > 0)
	{
		PolicyTime	t = s->batch_opened + batch_interval_ms;

		if (!found || t < best)
			best = t;
		found = true;
	}
	if (found)
		*when = best;
	return found;
}

PolicyEntry *
policy_restore_complete(Policy *s, const char *key, size_t keylen,
						PolicyTime last_fetch, PolicyTime expiry,
						const PolicyPeriods *periods,
						bool has_refresh, PolicyTime refresh_at)
{
	PolicyEntry *e = policy_lookup(s, key, keylen);

	if (e == NULL)
		e = policy_insert_new(s, key, keylen);
	else if (e->state == POLICY_IN_PROGRESS)
	{
		int			q = waiting_queue(e);

		/*
		 * Asked for before its value came from the dump: that fetch is not
		 * needed now.  Values are restored before the first batch, so it was
		 * neither gathered nor sent.
		 */
		POLICY_ASSERT(!e->gathered && !e->dispatched);
		if (q >= 0)
			queue_remove(s, (PolicyQueue) q, e);
		e->has_fetch_when = false;
	}
	e->max_age_ms = periods ? periods->max_age_ms : POLICY_PERIOD_DEFAULT;
	e->stale_for_ms = periods ? periods->stale_for_ms : POLICY_PERIOD_DEFAULT;
	POLICY_ASSERT(e->max_age_ms >= 0 || e->max_age_ms == POLICY_PERIOD_DEFAULT);
	POLICY_ASSERT(e->stale_for_ms >= 0 ||
				  e->stale_for_ms == POLICY_PERIOD_DEFAULT);
	e->state = POLICY_COMPLETE;
	e->has_last_fetch = true;
	e->last_fetch = last_fetch;
	e->has_expiry = true;
	e->expiry = expiry;
	queue_schedule(s, POLICY_QUEUE_EVICT, e, expiry);
	if (has_refresh)
		queue_schedule(s, POLICY_QUEUE_REFRESH, e, refresh_at);
	return e;
}

/*
 * After a restart: a key whose fetch had failed or stayed pending
 * 'attempts' times in a row resumes its backoff instead of being retried
 * at once (a worker that keeps crashing must not hammer the upstream).
 */
void
policy_resume_backoff(Policy *s, PolicyEntry *e, int attempts, PolicyTime now)
{
	int64_t		delay;

	int			q = waiting_queue(e);

	e->attempts = attempts;
	if (e->state != POLICY_IN_PROGRESS || q < 0)
		return;
	delay = policy_backoff_delay(attempts, max_retry_backoff(s, e));
	if (delay <= 0)
		return;
	e->has_fetch_when = true;
	e->fetch_when = now + delay;
	queue_remove(s, q, e);
	schedule_fetch(s, e, now + delay, now);
}

/* ----------------------------------------------------------------
 * Keys that failed alone (keycache_bisect.h)
 * ----------------------------------------------------------------
 */

void
policy_set_suspect(PolicyEntry *e, bool suspect)
{
	e->suspect = suspect;
}

void
policy_defer_fetch(Policy *s, PolicyEntry *e, PolicyTime when)
{
	POLICY_ASSERT(e->state == POLICY_IN_PROGRESS && e->dispatched);
	e->dispatched = false;
	/* the fetch an invalidation during the dispatch asked for is this one */
	e->refetch_after = false;
	e->has_fetch_when = true;
	e->fetch_when = when;
	queue_schedule(s, due_queue_for(e), e, when);
}

/* ----------------------------------------------------------------
 * Admission and the pace of overflow scans (see keycache_policy.h)
 * ----------------------------------------------------------------
 */

bool
policy_value_in_use(bool has_value, uint32_t stamp, uint32_t stamp_now,
					uint32_t window)
{
	uint32_t	age = (stamp_now - stamp) % POLICY_STAMP_MODULUS;

	if (!has_value || window == 0)
		return false;
	if (age >= POLICY_STAMP_MODULUS - POLICY_STAMP_AHEAD_MAX)
		age = 0;				/* stamped after stamp_now was read */
	return age < window;
}

void
policy_scan_pace_init(PolicyScanPace *pace)
{
	pace->next_ok = INT64_MIN;
}

bool
policy_scan_due(const PolicyScanPace *pace, PolicyTime now)
{
	return now >= pace->next_ok;
}

/* How long until a scan is due: 0 if it is. */
int64_t
policy_scan_wait(const PolicyScanPace *pace, PolicyTime now)
{
	return policy_scan_due(pace, now) ? 0 : pace->next_ok - now;
}

void
policy_scan_done(PolicyScanPace *pace, PolicyTime start, PolicyTime end)
{
	int64_t		took = end > start ? end - start : 0;
	int64_t		gap = took * POLICY_SCAN_GAP_FACTOR;

	if (gap < POLICY_SCAN_MIN_GAP_MS)
		gap = POLICY_SCAN_MIN_GAP_MS;
	pace->next_ok = end + gap;
}
