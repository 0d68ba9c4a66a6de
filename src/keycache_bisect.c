/*-------------------------------------------------------------------------
 *
 * keycache_bisect.c
 *	  Splitting a failed batch until its bad keys fail alone, and reading a
 *	  result that broke the contract (see keycache_bisect.h).
 *
 * A plan keeps the batch's key indices in one array, "order": the clean
 * keys first, then the suspects.  Every call is a range of it.  Splitting a
 * call moves its unresolved keys to the front of its range and queues that
 * front (or its two halves) as new ranges, so ranges never overlap and the
 * queue never holds more than n of them: a ring of n + 1 will do.  Each
 * queued range is smaller than the call it came from, so a plan ends
 * after at most 3n calls (2n - 1 for halving alone, and a range can shrink
 * without halving only when its call answered a key).
 *
 * The matcher sorts the keys asked for twice, by bytes and by bytes
 * folded to ASCII lower case (both with the length first), and finds each
 * row's key by binary search: O((n + rows) log n).
 *
 * This file must compile without PostgreSQL headers: it is unit-tested on
 * its own (test/unit/test_bisect.c).
 *
 * Copyright (c) 2026, projcache developers
 *
 *-------------------------------------------------------------------------
 */
#include "keycache_bisect.h"

#include <assert.h>
#include <stdlib.h>
#include <string.h>

#if defined(USE_ASSERT_CHECKING) || defined(POLICY_UNIT_TEST)
#define BISECT_ASSERT(cond) assert(cond)
#else
#define BISECT_ASSERT(cond) ((void) 0)
#endif

typedef struct BisectRange
{
	int			start;			/* in order[] */
	int			len;
} BisectRange;

struct BisectPlan
{
	PolicyAllocFn alloc_fn;
	PolicyFreeFn free_fn;
	BisectSettings settings;

	int			n;
	int		   *order;			/* key indices: clean keys, then suspects */
	int		   *scratch;		/* for reordering a range */
	BisectFate *fate;
	bool	   *alone;			/* its last call was of it alone */
	int			nclean;

	/* clean ranges waiting for a call: a FIFO ring of n + 1 */
	BisectRange *queue;
	int			queue_head;
	int			queue_count;

	int			next_suspect;	/* in order[], from nclean */
	bool		probe_done;		/* the suspects were asked together */
	bool		slice_begun;
	PolicyTime	slice_start;
	PolicyTime	suspect_resume;

	bool		any_clean_call; /* the first clean call was made */
	PolicyTime	first_call;
	int			calls;

	bool		in_call;
	bool		call_is_suspect;
	bool		call_is_probe;
	BisectRange call;
};

static void *
alloc0(PolicyAllocFn alloc_fn, size_t size)
{
	void	   *p = alloc_fn(size == 0 ? 1 : size);

	memset(p, 0, size == 0 ? 1 : size);
	return p;
}

static void
queue_push(BisectPlan *plan, int start, int len)
{
	int			cap = plan->n + 1;

	BISECT_ASSERT(len > 0 && plan->queue_count < cap);
	plan->queue[(plan->queue_head + plan->queue_count) % cap].start = start;
	plan->queue[(plan->queue_head + plan->queue_count) % cap].len = len;
	plan->queue_count++;
}

static BisectRange
queue_pop(BisectPlan *plan)
{
	BisectRange r = plan->queue[plan->queue_head];

	plan->queue_head = (plan->queue_head + 1) % (plan->n + 1);
	plan->queue_count--;
	return r;
}

BisectPlan *
bisect_begin(int n, const bool *suspect, PolicyTime suspect_resume_at,
			 const BisectSettings *settings, PolicyAllocFn alloc_fn,
			 PolicyFreeFn free_fn)
{
	BisectPlan *plan = alloc0(alloc_fn, sizeof(BisectPlan));
	int			i;
	int			j = 0;

	BISECT_ASSERT(n >= 0);
	plan->alloc_fn = alloc_fn;
	plan->free_fn = free_fn;
	plan->settings = *settings;
	plan->n = n;
	plan->order = alloc0(alloc_fn, n * sizeof(int));
	plan->scratch = alloc0(alloc_fn, n * sizeof(int));
	plan->fate = alloc0(alloc_fn, n * sizeof(BisectFate));
	plan->alone = alloc0(alloc_fn, n * sizeof(bool));
	plan->queue = alloc0(alloc_fn, (n + 1) * sizeof(BisectRange));
	for (i = 0; i < n; i++)
		if (!suspect[i])
			plan->order[j++] = i;
	plan->nclean = j;
	for (i = 0; i < n; i++)
		if (suspect[i])
			plan->order[j++] = i;
	for (i = 0; i < n; i++)
		plan->fate[i] = BISECT_WAITING;
	if (plan->nclean > 0)
		queue_push(plan, 0, plan->nclean);
	plan->next_suspect = plan->nclean;
	plan->suspect_resume = suspect_resume_at;
	return plan;
}

static void
set_fate(BisectPlan *plan, BisectRange r, BisectFate fate)
{
	int			i;

	for (i = r.start; i < r.start + r.len; i++)
		plan->fate[plan->order[i]] = fate;
}

bool
bisect_next(BisectPlan *plan, PolicyTime now, const int **keys, int *nkeys)
{
	BISECT_ASSERT(!plan->in_call);

	/*
	 * Clean ranges first: their keys have waited for the split.  Past the
	 * budget, the keys not isolated yet fail together.
	 */
	while (plan->queue_count > 0)
	{
		BisectRange r = queue_pop(plan);

		if (plan->any_clean_call && plan->settings.split_budget_ms > 0 &&
			now - plan->first_call >= plan->settings.split_budget_ms)
		{
			set_fate(plan, r, BISECT_FAILED_TOGETHER);
			continue;
		}
		if (!plan->any_clean_call)
		{
			plan->any_clean_call = true;
			plan->first_call = now;
		}
		plan->in_call = true;
		plan->call_is_suspect = false;
		plan->call = r;
		plan->calls++;
		*keys = &plan->order[r.start];
		*nkeys = r.len;
		return true;
	}

	/*
	 * Then the suspects, within their slice: first all of them in one call (a
	 * source that failed for every key, then came back, answers them at
	 * once), then those it did not answer one per call.
	 */
	while (plan->next_suspect < plan->n &&
		   plan->fate[plan->order[plan->next_suspect]] != BISECT_WAITING)
		plan->next_suspect++;
	if (plan->next_suspect < plan->n)
	{
		bool		room;

		if (!plan->slice_begun)
			room = now >= plan->suspect_resume;
		else
			room = now - plan->slice_start < plan->settings.suspect_slice_ms;
		if (room)
		{
			if (!plan->slice_begun)
			{
				plan->slice_begun = true;
				plan->slice_start = now;
			}
			plan->in_call = true;
			plan->call_is_suspect = true;
			plan->call_is_probe = !plan->probe_done &&
				plan->n - plan->next_suspect >= 2;
			plan->call.start = plan->next_suspect;
			if (plan->call_is_probe)
			{
				plan->probe_done = true;
				plan->call.len = plan->n - plan->next_suspect;
			}
			else
			{
				plan->next_suspect++;
				plan->call.len = 1;
			}
			plan->calls++;
			*keys = &plan->order[plan->call.start];
			*nkeys = plan->call.len;
			return true;
		}
		for (; plan->next_suspect < plan->n; plan->next_suspect++)
		{
			int			k = plan->order[plan->next_suspect];

			if (plan->fate[k] == BISECT_WAITING)
				plan->fate[k] = BISECT_POSTPONED;
		}
	}
	return false;
}

/*
 * Queue the keys of the call that are still waiting, moved to the front of
 * its range (in their order): whole when fewer than the call had, else in
 * two halves.
 */
static void
split(BisectPlan *plan, BisectRange r)
{
	int			m = 0;
	int			rest = 0;
	int			i;

	for (i = r.start; i < r.start + r.len; i++)
	{
		int			k = plan->order[i];

		if (plan->fate[k] == BISECT_WAITING)
			plan->order[r.start + m++] = k;
		else
			plan->scratch[rest++] = k;
	}
	memcpy(&plan->order[r.start + m], plan->scratch, rest * sizeof(int));
	if (m == 0)
		return;
	if (m < r.len)
		queue_push(plan, r.start, m);
	else
	{
		int			half = (m + 1) / 2;

		BISECT_ASSERT(m >= 2);
		queue_push(plan, r.start, half);
		queue_push(plan, r.start + half, m - half);
	}
}

void
bisect_done(BisectPlan *plan, PolicyTime now, BisectCall result,
			const bool *unresolved)
{
	BisectRange r = plan->call;
	int			i;

	BISECT_ASSERT(plan->in_call);
	plan->in_call = false;
	for (i = r.start; i < r.start + r.len; i++)
		plan->alone[plan->order[i]] = r.len == 1;

	if (plan->call_is_suspect)
	{
		/* as long a rest as the slice took so far */
		plan->suspect_resume = now + (now - plan->slice_start);
		if (plan->call_is_probe)
		{
			/* the keys it answered are done; the others go alone */
			if (result == BISECT_CALL_ANSWERED)
				set_fate(plan, r, BISECT_ANSWERED);
			else if (result == BISECT_CALL_UNRESOLVED)
				for (i = 0; i < r.len; i++)
					if (!unresolved[i])
						plan->fate[plan->order[r.start + i]] = BISECT_ANSWERED;
			return;
		}
		set_fate(plan, r, result == BISECT_CALL_ANSWERED ?
				 BISECT_ANSWERED : BISECT_FAILED_ALONE);
		return;
	}

	switch (result)
	{
		case BISECT_CALL_ANSWERED:
			set_fate(plan, r, BISECT_ANSWERED);
			break;
		case BISECT_CALL_FAILED_ALL:
			set_fate(plan, r, r.len == 1 ?
					 BISECT_FAILED_ALONE : BISECT_FAILED_TOGETHER);
			break;
		case BISECT_CALL_FAILED:
			if (r.len == 1)
				set_fate(plan, r, BISECT_FAILED_ALONE);
			else
				split(plan, r);
			break;
		case BISECT_CALL_UNRESOLVED:
			for (i = 0; i < r.len; i++)
			{
				int			k = plan->order[r.start + i];

				if (!unresolved[i])
					plan->fate[k] = BISECT_ANSWERED;
				else if (r.len == 1)
					plan->fate[k] = BISECT_FAILED_ALONE;
			}
			split(plan, r);
			break;
	}
}

BisectFate
bisect_fate(const BisectPlan *plan, int key)
{
	BISECT_ASSERT(key >= 0 && key < plan->n);
	return plan->fate[key];
}

bool
bisect_suspect(const BisectPlan *plan, int key, bool error_answer)
{
	BISECT_ASSERT(key >= 0 && key < plan->n);
	BISECT_ASSERT(plan->fate[key] != BISECT_WAITING &&
				  plan->fate[key] != BISECT_POSTPONED);
	BISECT_ASSERT(plan->fate[key] != BISECT_FAILED_ALONE ||
				  (plan->alone[key] && error_answer));
	return plan->alone[key] && error_answer;
}

int
bisect_calls(const BisectPlan *plan)
{
	return plan->calls;
}

PolicyTime
bisect_suspect_resume(const BisectPlan *plan)
{
	return plan->suspect_resume;
}

void
bisect_end(BisectPlan *plan)
{
	plan->free_fn(plan->order);
	plan->free_fn(plan->scratch);
	plan->free_fn(plan->fate);
	plan->free_fn(plan->alone);
	plan->free_fn(plan->queue);
	plan->free_fn(plan);
}

/* ----------------------------------------------------------------
 * Reading a call's rows
 * ----------------------------------------------------------------
 */

typedef struct MatchKey
{
	const char *key;
	size_t		len;
	int			index;
} MatchKey;

struct BisectMatch
{
	PolicyFreeFn free_fn;
	int			n;
	MatchKey   *exact;			/* by length, then bytes */
	MatchKey   *folded;			/* by length, then bytes in lower case */
	bool	   *has_row;
	bool	   *ambiguous;
	bool		unowned;		/* a row no key could be pinned on */
};

static inline unsigned char
fold(unsigned char c)
{
	return (c >= 'A' && c <= 'Z') ? (unsigned char) (c + ('a' - 'A')) : c;
}

static int
cmp_exact(const char *a, size_t alen, const char *b, size_t blen)
{
	if (alen != blen)
		return alen < blen ? -1 : 1;
	return memcmp(a, b, alen);
}

static int
cmp_folded(const char *a, size_t alen, const char *b, size_t blen)
{
	size_t		i;

	if (alen != blen)
		return alen < blen ? -1 : 1;
	for (i = 0; i < alen; i++)
	{
		unsigned char ca = fold((unsigned char) a[i]);
		unsigned char cb = fold((unsigned char) b[i]);

		if (ca != cb)
			return ca < cb ? -1 : 1;
	}
	return 0;
}

static int
qsort_exact(const void *a, const void *b)
{
	const MatchKey *ka = a;
	const MatchKey *kb = b;

	return cmp_exact(ka->key, ka->len, kb->key, kb->len);
}

static int
qsort_folded(const void *a, const void *b)
{
	const MatchKey *ka = a;
	const MatchKey *kb = b;
	int			c = cmp_folded(ka->key, ka->len, kb->key, kb->len);

	/* ties by index, so that equal keys' order is fixed */
	if (c == 0)
		return ka->index < kb->index ? -1 : ka->index > kb->index;
	return c;
}

BisectMatch *
bisect_match_begin(int n, const char *const *keys, const size_t *lens,
				   PolicyAllocFn alloc_fn, PolicyFreeFn free_fn)
{
	BisectMatch *match = alloc0(alloc_fn, sizeof(BisectMatch));
	int			i;

	match->free_fn = free_fn;
	match->n = n;
	match->exact = alloc0(alloc_fn, n * sizeof(MatchKey));
	match->folded = alloc0(alloc_fn, n * sizeof(MatchKey));
	match->has_row = alloc0(alloc_fn, n * sizeof(bool));
	match->ambiguous = alloc0(alloc_fn, n * sizeof(bool));
	for (i = 0; i < n; i++)
	{
		match->exact[i].key = keys[i];
		match->exact[i].len = lens[i];
		match->exact[i].index = i;
	}
	memcpy(match->folded, match->exact, n * sizeof(MatchKey));
	if (n > 0)
	{
		qsort(match->exact, n, sizeof(MatchKey), qsort_exact);
		qsort(match->folded, n, sizeof(MatchKey), qsort_folded);
	}
	return match;
}

/* The key asked for under exactly this key, or -1. */
static int
find_exact(const BisectMatch *match, const char *key, size_t len)
{
	int			lo = 0,
				hi = match->n - 1;

	while (lo <= hi)
	{
		int			mid = lo + (hi - lo) / 2;
		int			c = cmp_exact(match->exact[mid].key,
								  match->exact[mid].len, key, len);

		if (c == 0)
			return match->exact[mid].index;
		if (c < 0)
			lo = mid + 1;
		else
			hi = mid - 1;
	}
	return -1;
}

/*
 * The keys asked for that are the same as key up to ASCII case: the range
 * [*first, *first + count) of match->folded.
 */
static int
find_folded(const BisectMatch *match, const char *key, size_t len,
			int *first)
{
	int			lo = 0,
				hi = match->n;
	int			end;

	/* the first element not below key */
	while (lo < hi)
	{
		int			mid = lo + (hi - lo) / 2;

		if (cmp_folded(match->folded[mid].key, match->folded[mid].len,
					   key, len) < 0)
			lo = mid + 1;
		else
			hi = mid;
	}
	*first = lo;
	for (end = lo; end < match->n &&
		 cmp_folded(match->folded[end].key, match->folded[end].len,
					key, len) == 0; end++)
		;
	return end - lo;
}

BisectRow
bisect_match_row(BisectMatch *match, const char *key, size_t len, int *index)
{
	int			exact;
	int			first;
	int			count;
	int			i;

	*index = -1;
	if (key == NULL)
	{
		match->unowned = true;
		return BISECT_ROW_UNOWNED;
	}
	exact = find_exact(match, key, len);
	if (exact >= 0 && !match->has_row[exact])
	{
		match->has_row[exact] = true;
		*index = exact;
		return BISECT_ROW_ANSWER;
	}
	count = find_folded(match, key, len, &first);
	if (count == 0)
	{
		BISECT_ASSERT(exact < 0);
		match->unowned = true;
		return BISECT_ROW_UNOWNED;
	}
	if (count == 1)
	{
		*index = match->folded[first].index;
		BISECT_ASSERT(exact < 0 || exact == *index);
		/* its next row under its own spelling is one row too many */
		match->has_row[*index] = true;
		return exact >= 0 ? BISECT_ROW_DUPLICATE : BISECT_ROW_SPELLING;
	}
	for (i = first; i < first + count; i++)
		match->ambiguous[match->folded[i].index] = true;
	*index = exact;
	return BISECT_ROW_AMBIGUOUS;
}

bool
bisect_match_unresolved(const BisectMatch *match, int i)
{
	BISECT_ASSERT(i >= 0 && i < match->n);
	return match->ambiguous[i] || (match->unowned && !match->has_row[i]);
}

void
bisect_match_end(BisectMatch *match)
{
	match->free_fn(match->exact);
	match->free_fn(match->folded);
	match->free_fn(match->has_row);
	match->free_fn(match->ambiguous);
	match->free_fn(match);
}
