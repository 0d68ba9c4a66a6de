/*-------------------------------------------------------------------------
 *
 * test_bisect.c
 *	  cmocka unit tests of "a bad key fails alone" (src/keycache_bisect.c),
 *	  and of the policy's part in it (policy_defer_fetch, the suspect
 *	  mark).
 *
 * A plan is driven here as the worker drives it, against a fake fetch
 * function: an oracle that says which keys make a call fail, on a fake
 * clock where each call takes a set time.  The rules checked:
 *
 *	- every key ends with a fate; a bad key fails alone, and no other key
 *	  fails;
 *	- a call of more than one key never holds a suspect, and suspects come
 *	  after every clean call;
 *	- splitting is breadth first, in halves, and costs at most 2n - 1 calls
 *	  (about 2 log2 n for one bad key);
 *	- a failure no key caused is not split; a split past its budget stops;
 *	- suspects get a slice per batch, then rest as long; the rest wait;
 *	- a result that broke the contract: which rows are pinned on which
 *	  key, and which keys are left unresolved.
 *
 * Copyright (c) 2026, projcache developers
 *
 *-------------------------------------------------------------------------
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "keycache_bisect.h"
#include "keycache_policy.h"

#define MAX_KEYS 600

static void *
unit_alloc(size_t size)
{
	void	   *p = malloc(size);

	assert_non_null(p);
	return p;
}

static void
unit_free(void *ptr)
{
	free(ptr);
}

/* A small generator of its own: the same numbers everywhere. */
static unsigned int
next_random(unsigned int *seed)
{
	*seed = *seed * 1103515245u + 12345u;
	return (*seed >> 16) & 0x7fff;
}

/* ----------------------------------------------------------------
 * A fake fetch function, and the worker's loop over a plan
 * ----------------------------------------------------------------
 */

typedef struct FakeSource
{
	int			n;
	bool		bad[MAX_KEYS];	/* makes any call with it fail */
	bool		fails_all;		/* every call fails, and no key caused it */
	bool		breaks[MAX_KEYS];	/* its row is unowned: a call with it
									 * leaves the keys without rows unresolved
									 * (here: itself) */
	int64_t		call_ms;		/* how long each call takes */
} FakeSource;

typedef struct PlanRun
{
	int			calls;
	int			call_sizes[3 * MAX_KEYS];
	int			call_first[3 * MAX_KEYS];
	bool		mixed_suspect;	/* a suspect shared a call with a clean key */
	bool		suspect_before_clean;	/* a clean call after a suspect's */
	PolicyTime	now;
} PlanRun;

/* Run a whole plan; returns it, settled, for its fates. */
static BisectPlan *
run_plan(const FakeSource *o, const bool *suspect, PolicyTime start,
		 PolicyTime resume, const BisectSettings *settings, PlanRun *run)
{
	BisectPlan *plan = bisect_begin(o->n, suspect, resume, settings,
									unit_alloc, unit_free);
	const int  *keys;
	int			k;
	bool		seen_suspect = false;

	memset(run, 0, sizeof(PlanRun));
	run->now = start;
	while (bisect_next(plan, run->now, &keys, &k))
	{
		bool		unresolved[MAX_KEYS];
		bool		failed = false;
		bool		any_unresolved = false;
		bool		has_suspect = false;
		bool		has_clean = false;
		BisectCall	result;
		int			j;

		assert_true(k >= 1);
		assert_true(run->calls < 3 * MAX_KEYS);
		run->call_sizes[run->calls] = k;
		run->call_first[run->calls] = keys[0];
		run->calls++;
		for (j = 0; j < k; j++)
		{
			failed |= o->bad[keys[j]];
			unresolved[j] = o->breaks[keys[j]];
			any_unresolved |= unresolved[j];
			has_suspect |= suspect[keys[j]];
			has_clean |= !suspect[keys[j]];
		}
		if (has_suspect && has_clean)
			run->mixed_suspect = true;
		if (has_suspect)
			seen_suspect = true;
		else if (seen_suspect)
			run->suspect_before_clean = true;

		run->now += o->call_ms;
		if (o->fails_all)
			result = BISECT_CALL_FAILED_ALL;
		else if (failed)
			result = BISECT_CALL_FAILED;
		else if (any_unresolved)
			result = BISECT_CALL_UNRESOLVED;
		else
			result = BISECT_CALL_ANSWERED;
		bisect_done(plan, run->now, result, unresolved);
	}
	assert_int_equal(bisect_calls(plan), run->calls);
	return plan;
}

static const BisectSettings no_limits = {0, 1000000};

static void
oracle_init(FakeSource *o, int n)
{
	memset(o, 0, sizeof(FakeSource));
	o->n = n;
	o->call_ms = 1;
}

/* ----------------------------------------------------------------
 * Splitting
 * ----------------------------------------------------------------
 */

static void
test_all_good_one_call(void **state)
{
	FakeSource	o;
	PlanRun		run;
	bool		suspect[MAX_KEYS] = {false};
	BisectPlan *plan;
	int			i;

	(void) state;
	oracle_init(&o, 500);
	plan = run_plan(&o, suspect, 0, 0, &no_limits, &run);
	assert_int_equal(run.calls, 1);
	assert_int_equal(run.call_sizes[0], 500);
	for (i = 0; i < 500; i++)
		assert_int_equal(bisect_fate(plan, i), BISECT_ANSWERED);
	bisect_end(plan);
}

static void
test_one_bad_key_fails_alone(void **state)
{
	FakeSource	o;
	PlanRun		run;
	bool		suspect[MAX_KEYS] = {false};
	BisectPlan *plan;
	int			i;

	(void) state;
	oracle_init(&o, 16);
	o.bad[5] = true;
	plan = run_plan(&o, suspect, 0, 0, &no_limits, &run);
	for (i = 0; i < 16; i++)
		assert_int_equal(bisect_fate(plan, i),
						 i == 5 ? BISECT_FAILED_ALONE : BISECT_ANSWERED);
	/* 16, then 8 + 8, 4 + 4, 2 + 2, 1 + 1: 9 calls, breadth first */
	assert_int_equal(run.calls, 9);
	assert_int_equal(run.call_sizes[0], 16);
	assert_int_equal(run.call_sizes[1], 8);
	assert_int_equal(run.call_sizes[2], 8);
	assert_int_equal(run.call_first[1], 0);
	assert_int_equal(run.call_first[2], 8);
	assert_int_equal(run.call_sizes[3], 4);
	assert_int_equal(run.call_sizes[8], 1);
	bisect_end(plan);

	/* a batch of 500: about 2 log2(500) calls */
	oracle_init(&o, 500);
	o.bad[321] = true;
	plan = run_plan(&o, suspect, 0, 0, &no_limits, &run);
	assert_true(run.calls <= 2 * 9 + 1);
	assert_int_equal(bisect_fate(plan, 321), BISECT_FAILED_ALONE);
	for (i = 0; i < 500; i++)
		if (i != 321)
			assert_int_equal(bisect_fate(plan, i), BISECT_ANSWERED);
	bisect_end(plan);
}

/* Random batches and bad keys: every rule, on each. */
static void
test_random_batches(void **state)
{
	unsigned int seed = 12345;
	int			round;

	(void) state;
	for (round = 0; round < 400; round++)
	{
		FakeSource	o;
		PlanRun		run;
		bool		suspect[MAX_KEYS] = {false};
		BisectPlan *plan;
		int			n;
		int			density;
		int			nsuspects = 0;
		int			i;

		n = 1 + (int) (next_random(&seed) % (round < 380 ? 64 : 500));
		density = (int) (next_random(&seed) % 101);
		oracle_init(&o, n);
		for (i = 0; i < n; i++)
		{
			o.bad[i] = (int) (next_random(&seed) % 100) < density;
			o.breaks[i] = !o.bad[i] && next_random(&seed) % 10 == 0;
			suspect[i] = next_random(&seed) % 5 == 0;
			nsuspects += suspect[i];
		}
		plan = run_plan(&o, suspect, 0, 0, &no_limits, &run);
		assert_false(run.mixed_suspect);
		assert_false(run.suspect_before_clean);

		/*
		 * a binary tree of n - nsuspects leaves, one shrink per answer; the
		 * suspects' call together, then one each
		 */
		assert_true(run.calls <= 3 * (n - nsuspects) + 1 + nsuspects);
		for (i = 0; i < n; i++)
		{
			BisectFate	fate = bisect_fate(plan, i);

			if (o.bad[i] || o.breaks[i])
				assert_int_equal(fate, BISECT_FAILED_ALONE);
			else
				assert_int_equal(fate, BISECT_ANSWERED);
		}
		bisect_end(plan);
	}
}

/*
 * Who is a suspect afterwards: a key whose error came from a call of its
 * own, not one whose error came from a call shared with others.
 */
static void
test_who_is_suspect(void **state)
{
	FakeSource	o;
	PlanRun		run;
	bool		suspect[MAX_KEYS] = {false};
	BisectPlan *plan;
	int			i;

	(void) state;
	oracle_init(&o, 8);
	o.bad[3] = true;
	plan = run_plan(&o, suspect, 0, 0, &no_limits, &run);
	assert_true(bisect_suspect(plan, 3, true));
	for (i = 0; i < 8; i++)
		if (i != 3)
		{
			/* an answer, or an error of its own in a shared call */
			assert_false(bisect_suspect(plan, i, false));
			if (i != 2)
				assert_false(bisect_suspect(plan, i, true));
		}
	/* 2 was answered in a call of its own (3's sibling): an error there */
	assert_true(bisect_suspect(plan, 2, true));
	bisect_end(plan);

	/* failed together: not a suspect */
	oracle_init(&o, 4);
	o.fails_all = true;
	plan = run_plan(&o, suspect, 0, 0, &no_limits, &run);
	for (i = 0; i < 4; i++)
		assert_false(bisect_suspect(plan, i, true));
	bisect_end(plan);

	/* a suspect answered: no longer one; failing again: still one */
	oracle_init(&o, 2);
	suspect[0] = suspect[1] = true;
	o.bad[1] = true;
	plan = run_plan(&o, suspect, 0, 0, &no_limits, &run);
	assert_false(bisect_suspect(plan, 0, false));
	assert_true(bisect_suspect(plan, 1, true));
	bisect_end(plan);
}

/* Every key bad: solo calls cost n, halving costs at most 2n - 1. */
static void
test_all_bad(void **state)
{
	FakeSource	o;
	PlanRun		run;
	bool		suspect[MAX_KEYS] = {false};
	BisectPlan *plan;
	int			i;

	(void) state;
	oracle_init(&o, 37);
	for (i = 0; i < 37; i++)
		o.bad[i] = true;
	plan = run_plan(&o, suspect, 0, 0, &no_limits, &run);
	assert_int_equal(run.calls, 2 * 37 - 1);
	for (i = 0; i < 37; i++)
		assert_int_equal(bisect_fate(plan, i), BISECT_FAILED_ALONE);
	bisect_end(plan);
}

/* A failure no key caused (a timeout, a source down) is not split. */
static void
test_failed_all_not_split(void **state)
{
	FakeSource	o;
	PlanRun		run;
	bool		suspect[MAX_KEYS] = {false};
	BisectPlan *plan;
	int			i;

	(void) state;
	oracle_init(&o, 20);
	o.fails_all = true;
	plan = run_plan(&o, suspect, 0, 0, &no_limits, &run);
	assert_int_equal(run.calls, 1);
	for (i = 0; i < 20; i++)
		assert_int_equal(bisect_fate(plan, i), BISECT_FAILED_TOGETHER);
	bisect_end(plan);

	/* alone in its call, it failed alone */
	oracle_init(&o, 1);
	o.fails_all = true;
	plan = run_plan(&o, suspect, 0, 0, &no_limits, &run);
	assert_int_equal(bisect_fate(plan, 0), BISECT_FAILED_ALONE);
	bisect_end(plan);
}

/*
 * A result that left keys unresolved: the others keep their answers, and
 * only the unresolved are asked again, together while fewer than the call
 * had.
 */
static void
test_unresolved_asked_again(void **state)
{
	BisectPlan *plan;
	bool		suspect[8] = {false};
	bool		unresolved[8] = {false};
	const int  *keys;
	int			k;
	int			i;

	(void) state;
	plan = bisect_begin(8, suspect, 0, &no_limits, unit_alloc, unit_free);
	assert_true(bisect_next(plan, 0, &keys, &k));
	assert_int_equal(k, 8);
	unresolved[2] = unresolved[6] = true;
	bisect_done(plan, 1, BISECT_CALL_UNRESOLVED, unresolved);
	for (i = 0; i < 8; i++)
		assert_int_equal(bisect_fate(plan, i),
						 i == 2 || i == 6 ? BISECT_WAITING : BISECT_ANSWERED);
	assert_true(bisect_next(plan, 1, &keys, &k));
	assert_int_equal(k, 2);
	assert_int_equal(keys[0], 2);
	assert_int_equal(keys[1], 6);
	/* both unresolved again: now halves */
	memset(unresolved, 1, sizeof(unresolved));
	bisect_done(plan, 2, BISECT_CALL_UNRESOLVED, unresolved);
	assert_true(bisect_next(plan, 2, &keys, &k));
	assert_int_equal(k, 1);
	assert_int_equal(keys[0], 2);
	bisect_done(plan, 3, BISECT_CALL_ANSWERED, NULL);
	assert_true(bisect_next(plan, 3, &keys, &k));
	assert_int_equal(k, 1);
	assert_int_equal(keys[0], 6);
	bisect_done(plan, 4, BISECT_CALL_UNRESOLVED, unresolved);
	assert_false(bisect_next(plan, 4, &keys, &k));
	assert_int_equal(bisect_fate(plan, 2), BISECT_ANSWERED);
	assert_int_equal(bisect_fate(plan, 6), BISECT_FAILED_ALONE);
	bisect_end(plan);
}

/* Past its budget, a split stops: the keys not isolated fail together. */
static void
test_split_budget(void **state)
{
	FakeSource	o;
	PlanRun		run;
	bool		suspect[MAX_KEYS] = {false};
	BisectSettings settings = {100, 1000};
	BisectPlan *plan;
	int			i;

	(void) state;
	oracle_init(&o, 8);
	o.bad[0] = true;
	o.call_ms = 60;
	plan = run_plan(&o, suspect, 1000, 0, &settings, &run);
	/* 8 fails at 1060; [0..4) starts at 1060 and fails at 1120; no more */
	assert_int_equal(run.calls, 2);
	for (i = 0; i < 4; i++)
		assert_int_equal(bisect_fate(plan, i), BISECT_FAILED_TOGETHER);
	/* the other half was never asked: it fails with the batch's error */
	for (i = 4; i < 8; i++)
		assert_int_equal(bisect_fate(plan, i), BISECT_FAILED_TOGETHER);
	bisect_end(plan);

	/* a first call longer than the budget is still made, and not split */
	oracle_init(&o, 8);
	o.bad[0] = true;
	o.call_ms = 500;
	plan = run_plan(&o, suspect, 0, 0, &settings, &run);
	assert_int_equal(run.calls, 1);
	bisect_end(plan);
}

/* ----------------------------------------------------------------
 * Suspects
 * ----------------------------------------------------------------
 */

/* Suspects go alone, after the clean keys, in the batch's order. */
static void
test_suspects_alone_after_clean(void **state)
{
	FakeSource	o;
	PlanRun		run;
	bool		suspect[MAX_KEYS] = {false};
	BisectPlan *plan;

	(void) state;
	oracle_init(&o, 6);
	suspect[1] = suspect[4] = true;
	o.bad[4] = true;
	plan = run_plan(&o, suspect, 0, 0, &no_limits, &run);
	/* the clean keys; the suspects together, failing; then one each */
	assert_int_equal(run.calls, 4);
	assert_int_equal(run.call_sizes[0], 4);
	assert_int_equal(run.call_sizes[1], 2);
	assert_int_equal(run.call_first[2], 1);
	assert_int_equal(run.call_sizes[2], 1);
	assert_int_equal(run.call_first[3], 4);
	assert_int_equal(bisect_fate(plan, 1), BISECT_ANSWERED);
	assert_int_equal(bisect_fate(plan, 4), BISECT_FAILED_ALONE);
	assert_int_equal(bisect_fate(plan, 0), BISECT_ANSWERED);
	bisect_end(plan);

	/*
	 * only suspects, none failing now (the source is back): no clean call,
	 * one call answers them all
	 */
	oracle_init(&o, 3);
	suspect[0] = suspect[1] = suspect[2] = true;
	plan = run_plan(&o, suspect, 0, 0, &no_limits, &run);
	assert_int_equal(run.calls, 1);
	assert_int_equal(run.call_sizes[0], 3);
	assert_int_equal(bisect_fate(plan, 0), BISECT_ANSWERED);
	assert_int_equal(bisect_fate(plan, 2), BISECT_ANSWERED);
	bisect_end(plan);

	/* only suspects, one still failing: together, then one each */
	o.bad[1] = true;
	plan = run_plan(&o, suspect, 0, 0, &no_limits, &run);
	assert_int_equal(run.calls, 4);
	assert_int_equal(run.call_sizes[0], 3);
	assert_int_equal(run.call_sizes[1], 1);
	assert_int_equal(bisect_fate(plan, 0), BISECT_ANSWERED);
	assert_int_equal(bisect_fate(plan, 1), BISECT_FAILED_ALONE);
	assert_int_equal(bisect_fate(plan, 2), BISECT_ANSWERED);
	bisect_end(plan);
}

/*
 * Suspects get a slice of time per batch (at least one call), then rest as
 * long as the slice took; those without room are postponed.
 */
static void
test_suspect_slice(void **state)
{
	FakeSource	o;
	PlanRun		run;
	bool		suspect[MAX_KEYS] = {false};
	BisectSettings settings = {0, 10};
	BisectPlan *plan;
	PolicyTime	resume;
	int			i;

	(void) state;
	oracle_init(&o, 6);
	for (i = 1; i < 6; i++)
		suspect[i] = true;
	o.call_ms = 4;
	o.bad[5] = true;

	/*
	 * the clean call 0..4; the suspects together at 4, failing for key 5;
	 * then alone at 8 and 12 (12 - 4 < 10); then none
	 */
	plan = run_plan(&o, suspect, 0, 0, &settings, &run);
	assert_int_equal(run.calls, 4);
	assert_int_equal(bisect_fate(plan, 0), BISECT_ANSWERED);
	for (i = 1; i < 3; i++)
		assert_int_equal(bisect_fate(plan, i), BISECT_ANSWERED);
	for (i = 3; i < 6; i++)
		assert_int_equal(bisect_fate(plan, i), BISECT_POSTPONED);
	resume = bisect_suspect_resume(plan);
	assert_int_equal(resume, 16 + 12);
	bisect_end(plan);

	/* before the rest is over: every suspect is postponed */
	plan = run_plan(&o, suspect, 20, resume, &settings, &run);
	assert_int_equal(run.calls, 1);
	for (i = 1; i < 6; i++)
		assert_int_equal(bisect_fate(plan, i), BISECT_POSTPONED);
	assert_int_equal(bisect_suspect_resume(plan), resume);
	bisect_end(plan);

	/*
	 * at the end of the rest, and a slow call: the suspects' call together
	 * (failing), then rest
	 */
	o.call_ms = 50;
	plan = run_plan(&o, suspect, resume - 50, resume, &settings, &run);
	assert_int_equal(run.calls, 2);
	assert_int_equal(run.call_sizes[1], 5);
	assert_int_equal(bisect_fate(plan, 1), BISECT_POSTPONED);
	assert_int_equal(bisect_fate(plan, 2), BISECT_POSTPONED);
	assert_int_equal(bisect_suspect_resume(plan), resume + 100);
	bisect_end(plan);
}

/* A suspect's call settles it either way: answered, or failed alone. */
static void
test_suspect_outcomes(void **state)
{
	static const BisectCall results[] = {
		BISECT_CALL_ANSWERED, BISECT_CALL_UNRESOLVED, BISECT_CALL_FAILED,
		BISECT_CALL_FAILED_ALL
	};
	bool		suspect[1] = {true};
	bool		unresolved[1] = {true};
	size_t		r;

	(void) state;
	for (r = 0; r < sizeof(results) / sizeof(results[0]); r++)
	{
		BisectPlan *plan = bisect_begin(1, suspect, 0, &no_limits,
										unit_alloc, unit_free);
		const int  *keys;
		int			k;

		assert_true(bisect_next(plan, 0, &keys, &k));
		bisect_done(plan, 1, results[r], unresolved);
		assert_false(bisect_next(plan, 1, &keys, &k));
		assert_int_equal(bisect_fate(plan, 0),
						 results[r] == BISECT_CALL_ANSWERED ?
						 BISECT_ANSWERED : BISECT_FAILED_ALONE);
		bisect_end(plan);
	}
}

/* ----------------------------------------------------------------
 * Reading rows
 * ----------------------------------------------------------------
 */

static BisectMatch *
match_of(const char *const *keys, int n)
{
	size_t		lens[16];
	int			i;

	for (i = 0; i < n; i++)
		lens[i] = strlen(keys[i]);
	return bisect_match_begin(n, keys, lens, unit_alloc, unit_free);
}

static BisectRow
row(BisectMatch *m, const char *key, int *index)
{
	return bisect_match_row(m, key, key ? strlen(key) : 0, index);
}

static void
test_match_answers(void **state)
{
	static const char *const keys[] = {"b", "a", "ab", "A1"};
	BisectMatch *m = match_of(keys, 4);
	int			idx;

	(void) state;
	assert_int_equal(row(m, "a", &idx), BISECT_ROW_ANSWER);
	assert_int_equal(idx, 1);
	assert_int_equal(row(m, "A1", &idx), BISECT_ROW_ANSWER);
	assert_int_equal(idx, 3);
	assert_int_equal(row(m, "ab", &idx), BISECT_ROW_ANSWER);
	assert_int_equal(idx, 2);
	/* "b" has no row: disabled, not unresolved */
	for (idx = 0; idx < 4; idx++)
		assert_false(bisect_match_unresolved(m, idx));
	/* a second row of a key no other matches: that key's breach */
	assert_int_equal(row(m, "a", &idx), BISECT_ROW_DUPLICATE);
	assert_int_equal(idx, 1);
	/* another spelling of one key: that key's breach */
	assert_int_equal(row(m, "AB", &idx), BISECT_ROW_SPELLING);
	assert_int_equal(idx, 2);
	assert_int_equal(row(m, "a1", &idx), BISECT_ROW_SPELLING);
	assert_int_equal(idx, 3);
	for (idx = 0; idx < 4; idx++)
		assert_false(bisect_match_unresolved(m, idx));
	bisect_match_end(m);
}

/* "tenant5" for "TENANT5": pinned on it; its own row later is one too many. */
static void
test_match_spelling(void **state)
{
	static const char *const keys[] = {"t1", "TENANT5", "t2"};
	BisectMatch *m = match_of(keys, 3);
	int			idx;

	(void) state;
	assert_int_equal(row(m, "t1", &idx), BISECT_ROW_ANSWER);
	assert_int_equal(row(m, "tenant5", &idx), BISECT_ROW_SPELLING);
	assert_int_equal(idx, 1);
	assert_int_equal(row(m, "TENANT5", &idx), BISECT_ROW_DUPLICATE);
	assert_int_equal(idx, 1);
	assert_false(bisect_match_unresolved(m, 0));
	assert_false(bisect_match_unresolved(m, 1));
	assert_false(bisect_match_unresolved(m, 2));
	bisect_match_end(m);
}

/* A row two keys may own leaves both unresolved. */
static void
test_match_ambiguous(void **state)
{
	static const char *const keys[] = {"Tenant6", "TENANT6", "x", "a", "A"};
	BisectMatch *m = match_of(keys, 5);
	int			idx;

	(void) state;
	assert_int_equal(row(m, "x", &idx), BISECT_ROW_ANSWER);
	assert_int_equal(row(m, "tenant6", &idx), BISECT_ROW_AMBIGUOUS);
	assert_int_equal(idx, -1);
	assert_int_equal(row(m, "a", &idx), BISECT_ROW_ANSWER);
	assert_int_equal(idx, 3);
	/* a second "a": it may be "A"'s answer */
	assert_int_equal(row(m, "a", &idx), BISECT_ROW_AMBIGUOUS);
	assert_int_equal(idx, 3);
	assert_true(bisect_match_unresolved(m, 0));
	assert_true(bisect_match_unresolved(m, 1));
	assert_false(bisect_match_unresolved(m, 2));
	assert_true(bisect_match_unresolved(m, 3));
	assert_true(bisect_match_unresolved(m, 4));
	bisect_match_end(m);
}

/*
 * A NULL key, or a key that matches none: the keys without a row are
 * unresolved, those with one keep it.
 */
static void
test_match_unowned(void **state)
{
	static const char *const keys[] = {"k1", "k2", "k3"};
	BisectMatch *m = match_of(keys, 3);
	int			idx;

	(void) state;
	assert_int_equal(row(m, "k2", &idx), BISECT_ROW_ANSWER);
	assert_int_equal(row(m, NULL, &idx), BISECT_ROW_UNOWNED);
	assert_int_equal(idx, -1);
	assert_true(bisect_match_unresolved(m, 0));
	assert_false(bisect_match_unresolved(m, 1));
	assert_true(bisect_match_unresolved(m, 2));
	bisect_match_end(m);

	m = match_of(keys, 3);
	assert_int_equal(row(m, "never-asked", &idx), BISECT_ROW_UNOWNED);
	/* other lengths, and case beyond ASCII, never match */
	assert_int_equal(row(m, "k1 ", &idx), BISECT_ROW_UNOWNED);
	assert_int_equal(row(m, "k", &idx), BISECT_ROW_UNOWNED);
	assert_true(bisect_match_unresolved(m, 0));
	bisect_match_end(m);

	{
		static const char *const utf8[] = {"\xc3\x89t\xc3\xa9"};	/* "Été" */

		m = match_of(utf8, 1);
		assert_int_equal(row(m, "\xc3\xa9t\xc3\xa9", &idx),
						 BISECT_ROW_UNOWNED);	/* "été" */
		assert_true(bisect_match_unresolved(m, 0));
		bisect_match_end(m);
	}
}

/* No key asked for: every row is unowned. */
static void
test_match_empty(void **state)
{
	BisectMatch *m = bisect_match_begin(0, NULL, NULL, unit_alloc,
										unit_free);
	int			idx;

	(void) state;
	assert_int_equal(row(m, "a", &idx), BISECT_ROW_UNOWNED);
	bisect_match_end(m);
}

/* ----------------------------------------------------------------
 * The policy's part
 * ----------------------------------------------------------------
 */

static Policy *
new_policy(void)
{
	PolicyConfig config = {300000, 120000, 0, 60000};

	return policy_create(&config, unit_alloc, unit_free);
}

/*
 * A fetch put back unmade waits until its time, as if backing off, with
 * no attempt counted; the mark stays with the key.
 */
static void
test_defer_fetch(void **state)
{
	Policy	   *s = new_policy();
	PolicyEntry *e;
	PolicyEntry **batch;
	int			n;

	(void) state;
	e = policy_try_begin_fetch(s, "k", 1, false, 0);
	assert_non_null(e);
	assert_int_equal(policy_ready_batch(s, 0, 10, 0, &batch), 1);
	assert_ptr_equal(batch[0], e);
	/* it failed alone */
	policy_set_suspect(e, true);
	assert_int_equal(policy_complete_fetch(s, e, POLICY_RESULT_PENDING, NULL, 0),
					 POLICY_RESCHEDULED);
	assert_int_equal(e->attempts, 1);
	assert_true(e->suspect);
	/* first retry now; then put back by 1 s */
	assert_int_equal(policy_ready_batch(s, 0, 10, 0, &batch), 1);
	assert_true(e->dispatched);
	policy_invalidate(s, "k", 1, 0);	/* asks for another fetch after it */
	assert_true(e->refetch_after);
	policy_defer_fetch(s, e, 1000);
	assert_false(e->dispatched);
	assert_false(e->refetch_after);
	assert_int_equal(e->state, POLICY_IN_PROGRESS);
	assert_int_equal(e->attempts, 1);
	assert_true(e->suspect);
	assert_int_equal(policy_ready_batch(s, 999, 10, 0, &batch), 0);
	n = policy_ready_batch(s, 1000, 10, 0, &batch);
	assert_int_equal(n, 1);
	assert_ptr_equal(batch[0], e);
	/* answered at last */
	policy_set_suspect(e, false);
	assert_int_equal(policy_complete_fetch(s, e, POLICY_RESULT_VALUE, NULL, 1000),
					 POLICY_DONE);
	assert_int_equal(e->attempts, 0);
	assert_false(e->suspect);
	policy_destroy(s);
}

/* Put back, it can still be evicted, as any fetch waiting for its turn. */
static void
test_defer_then_evict(void **state)
{
	Policy	   *s = new_policy();
	PolicyEntry *e;
	PolicyEntry **batch;

	(void) state;
	e = policy_try_begin_fetch(s, "k", 1, false, 0);
	assert_int_equal(policy_ready_batch(s, 0, 10, 0, &batch), 1);
	policy_defer_fetch(s, e, 500);
	assert_true(policy_evictable(e));
	assert_int_equal(policy_request_evict(s, "k", 1), POLICY_EVICT_NOW);
	assert_null(policy_lookup(s, "k", 1));
	assert_int_equal(policy_ready_batch(s, 500, 10, 0, &batch), 0);
	policy_destroy(s);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_all_good_one_call),
		cmocka_unit_test(test_one_bad_key_fails_alone),
		cmocka_unit_test(test_random_batches),
		cmocka_unit_test(test_who_is_suspect),
		cmocka_unit_test(test_all_bad),
		cmocka_unit_test(test_failed_all_not_split),
		cmocka_unit_test(test_unresolved_asked_again),
		cmocka_unit_test(test_split_budget),
		cmocka_unit_test(test_suspects_alone_after_clean),
		cmocka_unit_test(test_suspect_slice),
		cmocka_unit_test(test_suspect_outcomes),
		cmocka_unit_test(test_match_answers),
		cmocka_unit_test(test_match_spelling),
		cmocka_unit_test(test_match_ambiguous),
		cmocka_unit_test(test_match_unowned),
		cmocka_unit_test(test_match_empty),
		cmocka_unit_test(test_defer_fetch),
		cmocka_unit_test(test_defer_then_evict),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
