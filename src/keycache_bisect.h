/*-------------------------------------------------------------------------
 *
 * keycache_bisect.h
 *	  A bad key fails alone: how the worker splits a batch whose call of the
 *	  fetch function failed, and how it reads a result that broke the
 *	  contract, as plain C.
 *
 * One call of the fetch function serves a batch of keys, so one key that
 * makes it fail (a function that casts keys to integer, given "abc") would
 * fail every key of the batch.  The worker therefore runs a batch as a
 * plan of calls (BisectPlan):
 *
 * - the batch's clean keys go first, in one call;
 * - a call that failed with an error the keys may have caused is split in
 *	 two halves, each called in turn (breadth first), until the keys that
 *	 fail are alone in their call: only they fail ("fail alone"), every
 *	 other key gets its answer;
 * - a call whose result broke the contract in a way that leaves some keys'
 *	 answers unknown (BisectMatch below) keeps the answers it gave, and calls
 *	 again, the same way, only for the keys left unresolved;
 * - a failure no key can have caused (a timeout, a cancel, a source that
 *	 is down: the caller says which, see BISECT_CALL_FAILED_ALL) is not
 *	 split: it would multiply slow calls to a source that is failing
 *	 anyway.  Its keys fail together, as one call;
 * - splitting stops once split_budget_ms has passed since the first call
 *	 (the caller passes projcache.fetch_timeout, the longest one call may
 *	 take): the keys not isolated by then fail together;
 * - a key that failed alone is a suspect until it is answered (the caller
 *	 keeps the mark, PolicyEntry.suspect).  A suspect is never in a call
 *	 with keys that are not suspects.  After the clean keys, the batch's
 *	 suspects are asked in one call of their own (a source that failed for
 *	 every key with an error a key could cause, then came back, answers
 *	 them all at once instead of one key per call); those it did not
 *	 answer then get a call each.  All of it within a slice of
 *	 suspect_slice_ms per batch, after which suspects rest as long as the
 *	 slice took (so they get at most about half of the worker's time).  A
 *	 suspect without room is postponed: no call, no attempt counted.
 *
 * So a key that fails costs its batch about 2 log2(batch) calls once, and
 * about one call of its own per retry after that; the keys that share its
 * batch wait for those calls only, and never share a call with it again
 * while it keeps failing.
 *
 * Like keycache_policy.c, this file must compile without PostgreSQL
 * headers: it is unit-tested on its own (test/unit/test_bisect.c).  Times are
 * milliseconds on the caller's clock; nothing here reads one.
 *
 * Copyright (c) 2026, projcache developers
 *
 *-------------------------------------------------------------------------
 */
#ifndef PROJCACHE_KEYCACHE_BISECT_H
#define PROJCACHE_KEYCACHE_BISECT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "keycache_policy.h"

/* What one call of the fetch function came to, as bisect_done() needs it. */
typedef enum BisectCall
{
	BISECT_CALL_ANSWERED,		/* every key has its answer, maybe an error of
								 * its own */
	BISECT_CALL_UNRESOLVED,		/* some keys' answers are unknown (the
								 * unresolved flags say which); the others
								 * have theirs */
	BISECT_CALL_FAILED,			/* an error one of the keys may have caused */
	BISECT_CALL_FAILED_ALL		/* a failure none of them caused */
} BisectCall;

/* What becomes of one key of the batch. */
typedef enum BisectFate
{
	BISECT_WAITING,				/* not decided yet */
	BISECT_ANSWERED,			/* the answer of its last call stands */
	BISECT_FAILED_ALONE,		/* its call, of it alone, failed: a suspect */
	BISECT_FAILED_TOGETHER,		/* failed with others, not isolated */
	BISECT_POSTPONED			/* a suspect not called this time */
} BisectFate;

typedef struct BisectSettings
{
	int64_t		split_budget_ms;	/* <= 0: split until isolated */
	int64_t		suspect_slice_ms;	/* suspects' time per batch; at least one
									 * call is made */
} BisectSettings;

typedef struct BisectPlan BisectPlan;

/*
 * A plan for a batch of n keys; suspect[i] says whether key i is a
 * suspect.  Suspects are called only from suspect_resume_at on (see
 * bisect_suspect_resume()).  alloc_fn must not return NULL.
 */
extern BisectPlan *bisect_begin(int n, const bool *suspect,
								PolicyTime suspect_resume_at,
								const BisectSettings *settings,
								PolicyAllocFn alloc_fn, PolicyFreeFn free_fn);

/*
 * The next call to make, at time now: *keys points at its *nkeys key
 * indices.  False when the plan is done: every key then has a fate other
 * than BISECT_WAITING.
 */
extern bool bisect_next(BisectPlan *plan, PolicyTime now, const int **keys,
						int *nkeys);

/*
 * The call bisect_next() gave ended at now with result; for
 * BISECT_CALL_UNRESOLVED, unresolved[j] says whether its j-th key (in the
 * order bisect_next() gave) has no answer.  Afterwards, *keys of that call
 * holds the same keys, maybe in another order.
 */
extern void bisect_done(BisectPlan *plan, PolicyTime now, BisectCall result,
						const bool *unresolved);

extern BisectFate bisect_fate(const BisectPlan *plan, int key);

/*
 * Is a key whose fate is sealed a suspect from now on?  Yes if its answer
 * is an error (error_answer) from a call of its own: it failed alone, or
 * its answer broke the contract in a way it took a call of its own to
 * tell.  An error from a call shared with others, or no error, clears the
 * mark.  (A postponed suspect keeps its mark: ask only about sealed fates.)
 */
extern bool bisect_suspect(const BisectPlan *plan, int key,
						   bool error_answer);

/* Calls made so far. */
extern int	bisect_calls(const BisectPlan *plan);

/*
 * When suspects may be called again: the resume time given to
 * bisect_begin(), or, after this batch's suspects were called, as long
 * after their slice as the slice took.
 */
extern PolicyTime bisect_suspect_resume(const BisectPlan *plan);

extern void bisect_end(BisectPlan *plan);

/*
 * Reading one call's rows: which key each row answers.  The contract says
 * that each row carries a key asked for, once.  A row that breaks it is
 * pinned on one key when only one can own it, and that key alone fails;
 * when several can, or none, the keys it may belong to are "unresolved"
 * and asked again (BISECT_CALL_UNRESOLVED):
 *
 * - the first row of a key asked for is its answer (BISECT_ROW_ANSWER);
 * - another row of it is a breach of that key (BISECT_ROW_DUPLICATE),
 *	 unless another key asked for is the same up to ASCII case, which may
 *	 have been answered under this spelling (BISECT_ROW_AMBIGUOUS: both
 *	 are unresolved);
 * - a key not asked for that is the same up to ASCII case as exactly one
 *	 key asked for (a case-insensitive source answering "tenant5" for
 *	 "TENANT5") is a breach of that key (BISECT_ROW_SPELLING).  Its answer
 *	 is not taken under the spelling asked for: the source broke the
 *	 contract for it, and the cache cannot know that both spellings mean
 *	 the same to its readers;
 * - same up to case as several keys asked for: BISECT_ROW_AMBIGUOUS;
 * - a NULL key, or one no key asked for matches even up to case
 *	 (BISECT_ROW_UNOWNED), may be the answer of any key that has no row:
 *	 those keys are unresolved, instead of disabled.  Keys with a row of
 *	 their own keep it: an answer under a key's exact spelling is that
 *	 key's, whatever else came back.
 *
 * ASCII case only: it is what any collation folds alike, and a key same up
 * to another folding is still isolated by splitting, only at the cost of
 * more calls.
 */
typedef enum BisectRow
{
	BISECT_ROW_ANSWER,
	BISECT_ROW_DUPLICATE,
	BISECT_ROW_SPELLING,
	BISECT_ROW_AMBIGUOUS,
	BISECT_ROW_UNOWNED
} BisectRow;

typedef struct BisectMatch BisectMatch;

/* The n keys asked for (distinct), keys[i] of lens[i] bytes. */
extern BisectMatch *bisect_match_begin(int n, const char *const *keys,
									   const size_t *lens,
									   PolicyAllocFn alloc_fn,
									   PolicyFreeFn free_fn);

/*
 * One row, with its key (NULL for a NULL key).  Sets *index to the key
 * the row is pinned on for ANSWER, DUPLICATE and SPELLING; for AMBIGUOUS,
 * to the key asked for under this very spelling, if any; else to -1.
 */
extern BisectRow bisect_match_row(BisectMatch *match, const char *key,
								  size_t len, int *index);

/* After every row: is key i's answer unknown? */
extern bool bisect_match_unresolved(const BisectMatch *match, int i);

extern void bisect_match_end(BisectMatch *match);

#endif							/* PROJCACHE_KEYCACHE_BISECT_H */
