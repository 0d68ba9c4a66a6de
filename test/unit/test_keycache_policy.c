/*-------------------------------------------------------------------------
 *
 * test_keycache_policy.c
 *	  cmocka unit tests of the key cache's policy (src/keycache_policy.c).
 *
 * The policy is plain C and reads no clock, so it is tested here without
 * a server, on a fake clock: every test keeps a PolicyTime "now" and moves it
 * forward by hand.
 *
 * The test_store_* tests and test_ready_state check the key cache's rules
 * scenario by scenario: fetch, eviction, refresh and their interplay, each
 * on its own configuration and time steps.  The key cache keeps the shared
 * map (what readers see) apart from the private fetch state; the policy
 * is only the private half, so a "Store" below pairs it with a tiny fake of
 * the shared map and applies the worker's protocol to both:
 *
 *	- a completion that brings a value publishes it to the shared map; a
 *	  pending result leaves the old state in place;
 *	- an eviction removes the key from the policy and the shared map;
 *	- a fetch must be dispatched (taken into a batch by policy_ready_batch)
 *	  before it can be completed, as the worker does.
 *
 * The remaining tests cover the pure helpers (refresh interval validation,
 * retry backoff, freshness) and what the policy adds to those rules:
 * batching, invalidation, requested evictions, restoring after a worker
 * restart, and the timer heaps under load.
 *
 * Copyright (c) 2026, projcache developers
 *
 *-------------------------------------------------------------------------
 */
#include <ctype.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "keycache_policy.h"

#define KEY1 "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"
#define KEY2 "bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb"
#define KEY3 "cccccccccccccccccccccccccccccccc"

#define KEY_MAX 64
#define FAKE_MAX_PROJECTS 4096

/* Batch size used when a test just wants "whatever is due now". */
#define DISPATCH_BATCH_SIZE 500

/* Defaults of projcache's GUCs. */
#define DEFAULT_EXPIRY_MS 300000
#define DEFAULT_GRACE_MS 120000
#define DEFAULT_MAX_BACKOFF_MS 60000

/* ----------------------------------------------------------------
 * A fake of the shared key map
 * ----------------------------------------------------------------
 */

typedef enum FakeState
{
	FAKE_PENDING,
	FAKE_DISABLED,
	FAKE_ENABLED
} FakeState;

/*
 * One key of the shared map.  Readers get a copy (a snapshot of the entry);
 * "generation" is bumped at every published state, which is what wakes
 * waiting readers in the server.
 */
typedef struct FakeProject
{
	char		key[KEY_MAX];
	FakeState	state;
	const char *revision;		/* no revisions in these tests: always NULL */
	uint64_t	generation;
} FakeProject;

typedef struct FakeShared
{
	FakeProject projects[FAKE_MAX_PROJECTS];
	int			nprojects;
} FakeShared;

static FakeProject *
fake_find(FakeShared *shared, const char *key)
{
	int			i;

	for (i = 0; i < shared->nprojects; i++)
	{
		if (strcmp(shared->projects[i].key, key) == 0)
			return &shared->projects[i];
	}
	return NULL;
}

static FakeProject *
fake_get_or_create_ref(FakeShared *shared, const char *key)
{
	FakeProject *p = fake_find(shared, key);

	if (p == NULL)
	{
		assert_true(shared->nprojects < FAKE_MAX_PROJECTS);
		assert_true(strlen(key) < KEY_MAX);
		p = &shared->projects[shared->nprojects++];
		memset(p, 0, sizeof(FakeProject));
		strcpy(p->key, key);
		p->state = FAKE_PENDING;
		p->revision = NULL;
	}
	return p;
}

/* What a reader sees: absent keys are created pending. */
static FakeProject
fake_get_or_create(FakeShared *shared, const char *key)
{
	return *fake_get_or_create_ref(shared, key);
}

static void
fake_set_state(FakeShared *shared, const char *key, FakeState state)
{
	FakeProject *p = fake_get_or_create_ref(shared, key);

	p->state = state;
	p->generation++;
}

static bool
fake_remove(FakeShared *shared, const char *key)
{
	FakeProject *p = fake_find(shared, key);

	if (p == NULL)
		return false;
	*p = shared->projects[--shared->nprojects];
	return true;
}

/* ----------------------------------------------------------------
 * The store: policy plus shared map, driven as the worker drives them
 * ----------------------------------------------------------------
 */

typedef struct Store
{
	Policy	   *policy;
	FakeShared *shared;
} Store;

/* What a fetch brought back, as the fetch function reports it. */
typedef enum Answer
{
	ANSWER_PENDING,
	ANSWER_DISABLED,
	ANSWER_ENABLED,
	ANSWER_NOT_MODIFIED
} Answer;

/*
 * Configure a store as the worker reads its settings: a refresh interval
 * that is not strictly between expiry and expiry + grace is ignored.
 */
static void
store_init_full(Store *st, int64_t expiry_ms, int64_t grace_ms,
				int64_t refresh_ms, int64_t max_backoff_ms)
{
	PolicyConfig config;

	config.expiry_ms = expiry_ms;
	config.grace_period_ms = grace_ms;
	config.refresh_interval_ms =
		policy_refresh_interval_valid(expiry_ms, grace_ms, refresh_ms) ?
		refresh_ms : 0;
	config.max_retry_backoff_ms = max_backoff_ms;

	st->policy = policy_create(&config, malloc, free);
	assert_non_null(st->policy);
	st->shared = calloc(1, sizeof(FakeShared));
	assert_non_null(st->shared);
}

static void
store_init(Store *st, int64_t expiry_ms, int64_t grace_ms, int64_t refresh_ms)
{
	store_init_full(st, expiry_ms, grace_ms, refresh_ms,
					DEFAULT_MAX_BACKOFF_MS);
}

static void
store_free(Store *st)
{
	policy_destroy(st->policy);
	free(st->shared);
}

static bool
entry_is_key(const PolicyEntry *e, const char *key)
{
	return e->keylen == strlen(key) && memcmp(e->key, key, e->keylen) == 0;
}

static void
copy_key(char *dst, const PolicyEntry *e)
{
	assert_true(e->keylen < KEY_MAX);
	memcpy(dst, e->key, e->keylen);
	dst[e->keylen] = '\0';
}

static PolicyEntry *
lookup(Store *st, const char *key)
{
	return policy_lookup(st->policy, key, strlen(key));
}

/* Check what a reader of the shared map sees. */
#define assert_state(st, key, expected) \
	assert_int_equal(fake_get_or_create((st)->shared, (key)).state, (expected))

/*
 * store.try_begin_fetch(key): a reader's request creates the key in the
 * shared map (pending) and asks the policy for a fetch.
 */
static PolicyEntry *
begin_fetch(Store *st, const char *key, PolicyTime now)
{
	(void) fake_get_or_create_ref(st->shared, key);
	return policy_try_begin_fetch(st->policy, key, strlen(key), false, now);
}

/* store.refresh(refresh): never re-creates an evicted key. */
static PolicyEntry *
refresh_key(Store *st, const char *key, PolicyTime now)
{
	return policy_try_begin_fetch(st->policy, key, strlen(key), true, now);
}

/*
 * The returned Fetch of a completion that must be retried: the same entry,
 * in progress again.
 */
static PolicyEntry *
in_progress(Store *st, const char *key)
{
	PolicyEntry *e = lookup(st, key);

	assert_non_null(e);
	assert_int_equal(e->state, POLICY_IN_PROGRESS);
	return e;
}

/*
 * Take the key's fetch into a batch, as the worker does before calling the
 * fetch function.  The key must be due at 'now' and alone in the batch.
 */
static PolicyEntry *
dispatch(Store *st, const char *key, PolicyTime now)
{
	PolicyEntry **batch = NULL;
	int			n;

	n = policy_ready_batch(st->policy, now, DISPATCH_BATCH_SIZE, 0, &batch);
	assert_int_equal(n, 1);
	assert_true(entry_is_key(batch[0], key));
	assert_int_equal(batch[0]->state, POLICY_IN_PROGRESS);
	assert_true(batch[0]->dispatched);
	return batch[0];
}

/*
 * fetch.complete(answer) + store.complete_fetch(): record the result and
 * apply it to the shared map as the worker does.
 */
static PolicyCompletion
complete_periods(Store *st, PolicyEntry *e, Answer answer,
				 const PolicyPeriods *periods, PolicyTime now)
{
	char		key[KEY_MAX];
	PolicyResult result;
	PolicyCompletion completion;

	copy_key(key, e);
	switch (answer)
	{
		case ANSWER_PENDING:
			result = POLICY_RESULT_PENDING;
			break;
		case ANSWER_NOT_MODIFIED:
			result = POLICY_RESULT_NOT_MODIFIED;
			break;
		default:
			result = POLICY_RESULT_VALUE;
			break;
	}

	completion = policy_complete_fetch(st->policy, e, result, periods, now);
	if (completion == POLICY_EVICTED)
	{
		/* e is gone */
		assert_null(lookup(st, key));
		fake_remove(st->shared, key);
	}
	else if (answer == ANSWER_DISABLED)
		fake_set_state(st->shared, key, FAKE_DISABLED);
	else if (answer == ANSWER_ENABLED)
		fake_set_state(st->shared, key, FAKE_ENABLED);
	return completion;
}

/* The same, with the periods the configuration sets. */
static PolicyCompletion
complete(Store *st, PolicyEntry *e, Answer answer, PolicyTime now)
{
	return complete_periods(st, e, answer, NULL, now);
}

static PolicyCompletion
dispatch_and_complete(Store *st, const char *key, Answer answer, PolicyTime now)
{
	return complete(st, dispatch(st, key, now), answer, now);
}

/* store.evict(eviction): forget the key in both halves. */
static void
store_evict(Store *st, const char *key)
{
	PolicyEntry *e = lookup(st, key);

	assert_non_null(e);
	assert_int_equal(e->state, POLICY_COMPLETE);
	policy_evict(st->policy, e);
	assert_null(lookup(st, key));
	assert_true(fake_remove(st->shared, key));
}

/* Evict everything whose eviction is due at 'now'; returns how many. */
static int
collect_evicted(Store *st, PolicyTime now, char evicted[][KEY_MAX], int max)
{
	PolicyEntry *e;
	int			n = 0;

	while ((e = policy_pop_eviction(st->policy, now)) != NULL)
	{
		char		key[KEY_MAX];

		copy_key(key, e);
		store_evict(st, key);
		if (n < max)
			strcpy(evicted[n], key);
		n++;
	}
	return n;
}

typedef enum ActionKind
{
	ACTION_NONE,
	ACTION_EVICTION,
	ACTION_REFRESH
} ActionKind;

typedef struct Action
{
	ActionKind	kind;
	char		key[KEY_MAX];
} Action;

/*
 * store.poll() on a paused clock: jump to the next eviction or refresh and
 * pop it.  Anything already due is taken at once, and an eviction wins over
 * a refresh due at the same time (evictions are checked first).  With
 * timeout_ms >= 0, nothing due within now + timeout_ms is a timeout: the
 * clock moves by timeout_ms and ACTION_NONE is returned.
 */
static Action
store_poll(Store *st, PolicyTime *now, int64_t timeout_ms)
{
	Action		action;
	PolicyTime	evict_at = 0;
	PolicyTime	refresh_at = 0;
	bool		has_evict = policy_peek(st->policy, POLICY_QUEUE_EVICT, &evict_at);
	bool		has_refresh = policy_peek(st->policy, POLICY_QUEUE_REFRESH,
										  &refresh_at);
	PolicyTime	when;
	PolicyEntry *e;

	memset(&action, 0, sizeof(Action));
	action.kind = ACTION_NONE;

	if (evict_at < *now)
		evict_at = *now;
	if (refresh_at < *now)
		refresh_at = *now;

	if (has_evict && (!has_refresh || evict_at <= refresh_at))
	{
		action.kind = ACTION_EVICTION;
		when = evict_at;
	}
	else if (has_refresh)
	{
		action.kind = ACTION_REFRESH;
		when = refresh_at;
	}
	else
	{
		if (timeout_ms >= 0)
			*now += timeout_ms;
		return action;
	}

	if (timeout_ms >= 0 && when > *now + timeout_ms)
	{
		*now += timeout_ms;
		action.kind = ACTION_NONE;
		return action;
	}

	*now = when;
	if (action.kind == ACTION_EVICTION)
		e = policy_pop_eviction(st->policy, *now);
	else
		e = policy_pop_refresh(st->policy, *now);
	assert_non_null(e);
	copy_key(action.key, e);
	return action;
}

/* ----------------------------------------------------------------
 * The key cache's rules, one scenario each
 * ----------------------------------------------------------------
 */

static void
test_store_fetch(void **state)
{
	Store		st;
	PolicyTime	now = 0;
	PolicyEntry *fetch;
	PolicyEntry **batch;

	(void) state;
	store_init(&st, DEFAULT_EXPIRY_MS, DEFAULT_GRACE_MS, 0);

	fetch = begin_fetch(&st, KEY1, now);
	assert_non_null(fetch);
	assert_true(entry_is_key(fetch, KEY1));
	assert_false(fetch->has_fetch_when);
	assert_null(fake_get_or_create(st.shared, KEY1).revision);
	assert_state(&st, KEY1, FAKE_PENDING);

	/* A fetch is already in progress: nothing to do. */
	assert_null(begin_fetch(&st, KEY1, now));

	/* A pending result begins the next fetch at once. */
	assert_int_equal(dispatch_and_complete(&st, KEY1, ANSWER_PENDING, now),
					 POLICY_RESCHEDULED);
	fetch = in_progress(&st, KEY1);
	assert_true(entry_is_key(fetch, KEY1));
	/* The first retry is still immediate. */
	assert_false(fetch->has_fetch_when);
	assert_null(fake_get_or_create(st.shared, KEY1).revision);
	assert_state(&st, KEY1, FAKE_PENDING);

	/* Pending again. */
	assert_int_equal(dispatch_and_complete(&st, KEY1, ANSWER_PENDING, now),
					 POLICY_RESCHEDULED);
	fetch = in_progress(&st, KEY1);
	assert_true(entry_is_key(fetch, KEY1));
	/* This time it is in the future (backoff). */
	assert_true(fetch->has_fetch_when && fetch->fetch_when > now);
	assert_null(fake_get_or_create(st.shared, KEY1).revision);
	assert_state(&st, KEY1, FAKE_PENDING);

	/* It is not dispatched before its time; then complete with disabled. */
	assert_int_equal(policy_ready_batch(st.policy, now, DISPATCH_BATCH_SIZE, 0,
										&batch), 0);
	now = fetch->fetch_when;
	assert_int_equal(dispatch_and_complete(&st, KEY1, ANSWER_DISABLED, now),
					 POLICY_DONE);
	assert_state(&st, KEY1, FAKE_DISABLED);

	/* A new fetch is not yet necessary. */
	assert_null(begin_fetch(&st, KEY1, now));

	store_free(&st);
}

static void
test_store_fetch_pending_does_not_replace_state(void **state)
{
	Store		st;
	PolicyTime	now = 0;

	(void) state;
	store_init(&st, 5000, 5000, 0);

	assert_non_null(begin_fetch(&st, KEY1, now));
	assert_int_equal(dispatch_and_complete(&st, KEY1, ANSWER_DISABLED, now),
					 POLICY_DONE);
	assert_state(&st, KEY1, FAKE_DISABLED);

	now += 6000;

	assert_non_null(begin_fetch(&st, KEY1, now));
	/* The fetch completes pending: another fetch is begun. */
	assert_int_equal(dispatch_and_complete(&st, KEY1, ANSWER_PENDING, now),
					 POLICY_RESCHEDULED);
	(void) in_progress(&st, KEY1);
	/* The old state is still there, not replaced. */
	assert_state(&st, KEY1, FAKE_DISABLED);

	assert_int_equal(dispatch_and_complete(&st, KEY1, ANSWER_ENABLED, now),
					 POLICY_DONE);
	assert_state(&st, KEY1, FAKE_ENABLED);

	store_free(&st);
}

static void
test_store_evict_projects(void **state)
{
	Store		st;
	PolicyTime	now = 0;
	char		evicted[4][KEY_MAX];

	(void) state;
	store_init(&st, 5000, 0, 0);

	assert_non_null(begin_fetch(&st, KEY1, now));
	assert_int_equal(dispatch_and_complete(&st, KEY1, ANSWER_DISABLED, now),
					 POLICY_DONE);

	assert_int_equal(collect_evicted(&st, now, evicted, 4), 0);
	assert_state(&st, KEY1, FAKE_DISABLED);

	/* 3 seconds are not enough to expire anything. */
	now += 3000;

	assert_int_equal(collect_evicted(&st, now, evicted, 4), 0);
	assert_state(&st, KEY1, FAKE_DISABLED);

	assert_non_null(begin_fetch(&st, KEY2, now));
	assert_int_equal(dispatch_and_complete(&st, KEY2, ANSWER_DISABLED, now),
					 POLICY_DONE);

	/* 6 seconds in all expire the first key. */
	now += 3000;

	assert_int_equal(collect_evicted(&st, now, evicted, 4), 1);
	assert_string_equal(evicted[0], KEY1);
	assert_state(&st, KEY1, FAKE_PENDING);
	assert_state(&st, KEY2, FAKE_DISABLED);

	store_free(&st);
}

static void
test_store_evict_projects_pending_not_expired(void **state)
{
	Store		st;
	PolicyTime	now = 0;
	PolicyEntry *fetch;
	char		evicted[4][KEY_MAX];

	(void) state;
	store_init(&st, 5000, 0, 0);

	assert_non_null(begin_fetch(&st, KEY1, now));
	fetch = dispatch(&st, KEY1, now);

	/*
	 * A key created pending in the shared map but never fetched: never
	 * expires.
	 */
	(void) fake_get_or_create(st.shared, KEY2);

	now += 6000;

	/* No evictions, the key is pending. */
	assert_int_equal(collect_evicted(&st, now, evicted, 4), 0);

	/* Complete the fetch. */
	assert_int_equal(complete(&st, fetch, ANSWER_DISABLED, now), POLICY_DONE);

	/* Not evicted either: the 5 seconds run from the completion. */
	assert_int_equal(collect_evicted(&st, now, evicted, 4), 0);
	now += 4000;
	assert_int_equal(collect_evicted(&st, now, evicted, 4), 0);
	assert_state(&st, KEY1, FAKE_DISABLED);

	/* Just enough to expire it. */
	now += 1001;
	assert_int_equal(collect_evicted(&st, now, evicted, 4), 1);
	assert_string_equal(evicted[0], KEY1);
	assert_state(&st, KEY1, FAKE_PENDING);
	assert_state(&st, KEY2, FAKE_PENDING);
	/* The never-fetched key has no private state at all. */
	assert_null(lookup(&st, KEY2));

	store_free(&st);
}

static void
test_store_evict_projects_stale(void **state)
{
	Store		st;
	PolicyTime	now = 0;
	char		evicted[4][KEY_MAX];

	(void) state;
	store_init(&st, 5000, 5000, 0);

	assert_non_null(begin_fetch(&st, KEY1, now));
	assert_int_equal(dispatch_and_complete(&st, KEY1, ANSWER_DISABLED, now),
					 POLICY_DONE);

	/* In the grace period, not yet expired. */
	now += 9500;

	assert_int_equal(collect_evicted(&st, now, evicted, 4), 0);
	assert_state(&st, KEY1, FAKE_DISABLED);

	/* Now it is expired. */
	now += 1000;

	assert_int_equal(collect_evicted(&st, now, evicted, 4), 1);
	assert_string_equal(evicted[0], KEY1);
	assert_state(&st, KEY1, FAKE_PENDING);

	store_free(&st);
}

static void
test_store_no_eviction_during_fetch(void **state)
{
	Store		st;
	PolicyTime	now = 0;
	PolicyEntry *fetch;
	char		evicted[4][KEY_MAX];

	(void) state;
	store_init(&st, 5000, 5000, 0);

	assert_non_null(begin_fetch(&st, KEY1, now));
	fetch = dispatch(&st, KEY1, now);

	/* Past expiry, but a fetch is running. */
	now += 10500;
	/* No evictions while a fetch is running. */
	assert_int_equal(collect_evicted(&st, now, evicted, 4), 0);

	assert_int_equal(complete(&st, fetch, ANSWER_DISABLED, now), POLICY_DONE);
	/* Begin a new fetch as soon as possible (after the grace period). */
	now += 5001;
	assert_non_null(begin_fetch(&st, KEY1, now));
	fetch = dispatch(&st, KEY1, now);

	/* Past expiry again. */
	now += 10500;
	/* No evictions while a fetch is running. */
	assert_int_equal(collect_evicted(&st, now, evicted, 4), 0);

	assert_int_equal(complete(&st, fetch, ANSWER_DISABLED, now), POLICY_DONE);

	/* Not quite expired yet. */
	now += 9500;
	assert_int_equal(collect_evicted(&st, now, evicted, 4), 0);
	/* Now it is. */
	now += 501;
	assert_int_equal(collect_evicted(&st, now, evicted, 4), 1);
	assert_string_equal(evicted[0], KEY1);
	assert_state(&st, KEY1, FAKE_PENDING);

	store_free(&st);
}

static void
test_store_refresh(void **state)
{
	Store		st;
	PolicyTime	now = 0;
	PolicyEntry *fetch;
	Action		action;

	(void) state;
	store_init(&st, 5000, 5000, 7000);

	assert_non_null(begin_fetch(&st, KEY1, now));
	assert_int_equal(dispatch_and_complete(&st, KEY1, ANSWER_DISABLED, now),
					 POLICY_DONE);
	assert_state(&st, KEY1, FAKE_DISABLED);

	/* Wait for a refresh. */
	action = store_poll(&st, &now, -1);
	assert_int_equal(action.kind, ACTION_REFRESH);
	assert_string_equal(action.key, KEY1);
	assert_int_equal(now, 7000);

	fetch = refresh_key(&st, KEY1, now);
	assert_non_null(fetch);
	assert_true(fetch->is_refresh);
	/* A normal request upgrades the running refresh to a normal fetch. */
	assert_null(begin_fetch(&st, KEY1, now));
	assert_false(fetch->is_refresh);
	assert_int_equal(dispatch_and_complete(&st, KEY1, ANSWER_DISABLED, now),
					 POLICY_DONE);

	/*
	 * The refresh was upgraded to a normal fetch: the eviction moved, and the
	 * next refresh is 7 seconds from now.
	 */
	action = store_poll(&st, &now, -1);
	assert_int_equal(action.kind, ACTION_REFRESH);
	assert_int_equal(now, 14000);
	fetch = refresh_key(&st, KEY1, now);
	assert_non_null(fetch);
	assert_int_equal(dispatch_and_complete(&st, KEY1, ANSWER_DISABLED, now),
					 POLICY_DONE);

	/* This refresh did not push the eviction, which comes next. */
	action = store_poll(&st, &now, -1);
	assert_int_equal(action.kind, ACTION_EVICTION);
	assert_string_equal(action.key, KEY1);
	assert_int_equal(now, 17000);

	store_free(&st);
}

static void
test_store_refresh_overtaken_by_eviction(void **state)
{
	Store		st;
	PolicyTime	now = 0;
	Action		action;

	(void) state;
	store_init(&st, 5000, 5000, 7000);

	assert_non_null(begin_fetch(&st, KEY1, now));
	assert_int_equal(dispatch_and_complete(&st, KEY1, ANSWER_DISABLED, now),
					 POLICY_DONE);
	assert_state(&st, KEY1, FAKE_DISABLED);

	/* Way past the expiry. */
	now += 20000;

	/* The eviction goes first: no point refreshing an evicted key. */
	action = store_poll(&st, &now, -1);
	assert_int_equal(action.kind, ACTION_EVICTION);
	assert_string_equal(action.key, KEY1);
	store_evict(&st, action.key);

	/* And the eviction took the queued refresh with it. */
	action = store_poll(&st, &now, 60000);
	assert_int_equal(action.kind, ACTION_NONE);

	store_free(&st);
}

static void
test_store_refresh_during_eviction(void **state)
{
	Store		st;
	PolicyTime	now = 0;
	Action		eviction;
	Action		refresh;

	(void) state;
	store_init(&st, 5000, 5000, 7000);

	assert_non_null(begin_fetch(&st, KEY1, now));
	assert_int_equal(dispatch_and_complete(&st, KEY1, ANSWER_DISABLED, now),
					 POLICY_DONE);
	assert_state(&st, KEY1, FAKE_DISABLED);

	/* Way past the expiry. */
	now += 20000;

	/*
	 * Take both the eviction and the refresh before acting on either: a
	 * refresh of an evicted key must not fetch it.
	 */
	eviction = store_poll(&st, &now, -1);
	assert_int_equal(eviction.kind, ACTION_EVICTION);
	refresh = store_poll(&st, &now, -1);
	assert_int_equal(refresh.kind, ACTION_REFRESH);
	assert_string_equal(eviction.key, KEY1);
	assert_string_equal(refresh.key, KEY1);
	store_evict(&st, eviction.key);

	assert_null(refresh_key(&st, refresh.key, now));

	store_free(&st);
}

/*
 * A reader waiting on a key must be notified when its
 * state changes.  In projcache that wake-up is the server's (a condition
 * variable broadcast by the worker after publishing) and is covered by the
 * server-side tests (get(..., wait => ...) in pg_regress / isolation / TAP).
 * What the policy guarantees is when a state is published: not while a
 * fetch is running, and once it completes with a value.  A reader's earlier
 * copy keeps what it saw; "generation" stands in for the notification.
 */
static void
test_ready_state(void **state)
{
	Store		st;
	PolicyTime	now = 0;
	PolicyEntry *fetch;
	FakeProject snapshot;
	FakeProject current;

	(void) state;
	store_init(&st, DEFAULT_EXPIRY_MS, DEFAULT_GRACE_MS, 0);

	snapshot = fake_get_or_create(st.shared, KEY1);
	assert_int_equal(snapshot.state, FAKE_PENDING);
	/* The reader's request begins a fetch. */
	assert_non_null(begin_fetch(&st, KEY1, now));
	fetch = dispatch(&st, KEY1, now);

	/* After five seconds without a completion the key is still pending. */
	now += 5000;
	current = fake_get_or_create(st.shared, KEY1);
	assert_int_equal(current.generation, snapshot.generation);	/* no wake-up */
	assert_int_equal(current.state, FAKE_PENDING);

	/* The fetch completes: the state changes. */
	assert_int_equal(complete(&st, fetch, ANSWER_DISABLED, now), POLICY_DONE);

	/* A waiting reader would be woken now. */
	current = fake_get_or_create(st.shared, KEY1);
	assert_int_not_equal(current.generation, snapshot.generation);

	/* The old copy is still pending. */
	assert_int_equal(snapshot.state, FAKE_PENDING);

	/* The up-to-date read is disabled. */
	assert_int_equal(current.state, FAKE_DISABLED);

	store_free(&st);
}

/* ----------------------------------------------------------------
 * Pure helpers
 * ----------------------------------------------------------------
 */

static void
test_refresh_interval_validation(void **state)
{
	Store		st;
	PolicyTime	when;

	(void) state;

	/* Equal to the expiry: refreshing a fresh value is pointless. */
	assert_false(policy_refresh_interval_valid(5000, 5000, 5000));
	/* Equal to expiry + grace: the key would be evicted first. */
	assert_false(policy_refresh_interval_valid(5000, 5000, 10000));
	/* Strictly in between. */
	assert_true(policy_refresh_interval_valid(5000, 5000, 5001));
	assert_true(policy_refresh_interval_valid(5000, 5000, 7000));
	assert_true(policy_refresh_interval_valid(5000, 5000, 9999));
	/* Outside. */
	assert_false(policy_refresh_interval_valid(5000, 5000, 4000));
	assert_false(policy_refresh_interval_valid(5000, 5000, 12000));
	/* None. */
	assert_false(policy_refresh_interval_valid(5000, 5000, 0));
	assert_false(policy_refresh_interval_valid(5000, 5000, -1));
	/* Without a grace period no interval fits. */
	assert_false(policy_refresh_interval_valid(5000, 0, 5000));

	/* An ignored interval schedules no refresh; a valid one does. */
	store_init(&st, 5000, 5000, 10000);
	assert_int_equal(policy_config(st.policy)->refresh_interval_ms, 0);
	assert_non_null(begin_fetch(&st, KEY1, 0));
	assert_int_equal(dispatch_and_complete(&st, KEY1, ANSWER_DISABLED, 0),
					 POLICY_DONE);
	assert_false(policy_peek(st.policy, POLICY_QUEUE_REFRESH, &when));
	assert_true(policy_peek(st.policy, POLICY_QUEUE_EVICT, &when));
	assert_int_equal(when, 10000);
	store_free(&st);

	store_init(&st, 5000, 5000, 7000);
	assert_non_null(begin_fetch(&st, KEY1, 0));
	assert_int_equal(dispatch_and_complete(&st, KEY1, ANSWER_DISABLED, 0),
					 POLICY_DONE);
	assert_true(policy_peek(st.policy, POLICY_QUEUE_REFRESH, &when));
	assert_int_equal(when, 7000);
	store_free(&st);
}

static void
test_backoff_sequence(void **state)
{
	static const int64_t expected_60s[] = {
		0, 1000, 1500, 2250, 3375, 5062, 7593, 11390, 17085, 25628, 38443,
		57665, 60000, 60000
	};
	static const int64_t expected_5s[] = {
		0, 1000, 1500, 2250, 3375, 5000, 5000, 5000
	};
	Store		st;
	PolicyTime	now = 0;
	PolicyEntry *fetch;
	size_t		i;

	(void) state;

	for (i = 0; i < sizeof(expected_60s) / sizeof(expected_60s[0]); i++)
		assert_int_equal(policy_backoff_delay((int) i + 1, 60000),
						 expected_60s[i]);
	assert_int_equal(policy_backoff_delay(1000, 60000), 60000);

	for (i = 0; i < sizeof(expected_5s) / sizeof(expected_5s[0]); i++)
		assert_int_equal(policy_backoff_delay((int) i + 1, 5000),
						 expected_5s[i]);

	/* A cap below one second caps the very first delay. */
	assert_int_equal(policy_backoff_delay(1, 500), 0);
	assert_int_equal(policy_backoff_delay(2, 500), 500);
	assert_int_equal(policy_backoff_delay(3, 500), 500);
	assert_int_equal(policy_backoff_delay(10, 500), 500);
	assert_int_equal(policy_backoff_delay(2, 0), 0);
	assert_int_equal(policy_backoff_delay(0, 5000), 0);

	/*
	 * The policy applies it: consecutive pending results wait 0, 1000, 1500,
	 * ... ms; a success resets it.
	 */
	store_init_full(&st, 5000, 5000, 0, 5000);
	assert_non_null(begin_fetch(&st, KEY1, now));
	for (i = 0; i < sizeof(expected_5s) / sizeof(expected_5s[0]); i++)
	{
		assert_int_equal(dispatch_and_complete(&st, KEY1, ANSWER_PENDING, now),
						 POLICY_RESCHEDULED);
		fetch = in_progress(&st, KEY1);
		if (expected_5s[i] == 0)
			assert_false(fetch->has_fetch_when);
		else
		{
			assert_true(fetch->has_fetch_when);
			assert_int_equal(fetch->fetch_when - now, expected_5s[i]);
			now = fetch->fetch_when;
		}
	}
	assert_int_equal(dispatch_and_complete(&st, KEY1, ANSWER_NOT_MODIFIED, now),
					 POLICY_DONE);
	assert_int_equal(lookup(&st, KEY1)->attempts, 0);

	now += 6000;
	assert_non_null(begin_fetch(&st, KEY1, now));
	assert_int_equal(dispatch_and_complete(&st, KEY1, ANSWER_PENDING, now),
					 POLICY_RESCHEDULED);
	assert_false(in_progress(&st, KEY1)->has_fetch_when);
	assert_int_equal(dispatch_and_complete(&st, KEY1, ANSWER_PENDING, now),
					 POLICY_RESCHEDULED);
	assert_int_equal(in_progress(&st, KEY1)->fetch_when - now, 1000);
	store_free(&st);
}

static void
test_freshness(void **state)
{
	(void) state;

	/* expiry 5 s, grace 5 s, last fetch at t = 1000 */
	assert_int_equal(policy_freshness(1000, 1000, 5000, 5000), POLICY_FRESH);
	assert_int_equal(policy_freshness(1000, 5999, 5000, 5000), POLICY_FRESH);
	assert_int_equal(policy_freshness(1000, 6000, 5000, 5000), POLICY_STALE);
	assert_int_equal(policy_freshness(1000, 10999, 5000, 5000), POLICY_STALE);
	assert_int_equal(policy_freshness(1000, 11000, 5000, 5000), POLICY_EXPIRED);
	assert_int_equal(policy_freshness(1000, 1000000, 5000, 5000), POLICY_EXPIRED);
	/* A clock reading before the last fetch counts as no time elapsed. */
	assert_int_equal(policy_freshness(1000, 0, 5000, 5000), POLICY_FRESH);
	/* Without a grace period a value goes from fresh to expired. */
	assert_int_equal(policy_freshness(0, 4999, 5000, 0), POLICY_FRESH);
	assert_int_equal(policy_freshness(0, 5000, 5000, 0), POLICY_EXPIRED);
}

/* ----------------------------------------------------------------
 * What the C policy adds
 * ----------------------------------------------------------------
 */

static void
test_batching(void **state)
{
	static const char *const later[] = {"c", "d", "e", "f"};
	Store		st;
	PolicyEntry **batch = NULL;
	PolicyTime	when;
	const char *leftover = NULL;
	int			n;
	int			i;

	(void) state;
	store_init(&st, DEFAULT_EXPIRY_MS, DEFAULT_GRACE_MS, 0);

	/* Idle: nothing to wake up for. */
	assert_false(policy_next_wakeup(st.policy, 100, &when));

	/* A lone key is gathered for the batch interval... */
	assert_non_null(begin_fetch(&st, "a", 0));
	assert_true(policy_next_wakeup(st.policy, 100, &when));
	assert_int_equal(when, 0);
	assert_int_equal(policy_ready_batch(st.policy, 0, 3, 100, &batch), 0);
	assert_true(policy_next_wakeup(st.policy, 100, &when));
	assert_int_equal(when, 100);

	/* ...joined by the keys that come meanwhile... */
	assert_non_null(begin_fetch(&st, "b", 50));
	assert_int_equal(policy_ready_batch(st.policy, 50, 3, 100, &batch), 0);
	assert_true(policy_next_wakeup(st.policy, 100, &when));
	assert_int_equal(when, 100);
	assert_int_equal(policy_ready_batch(st.policy, 99, 3, 100, &batch), 0);

	/* ...and goes out when the interval is over. */
	n = policy_ready_batch(st.policy, 100, 3, 100, &batch);
	assert_int_equal(n, 2);
	assert_true(entry_is_key(batch[0], "a") || entry_is_key(batch[1], "a"));
	assert_true(entry_is_key(batch[0], "b") || entry_is_key(batch[1], "b"));
	assert_true(batch[0]->dispatched && batch[1]->dispatched);
	assert_false(policy_next_wakeup(st.policy, 100, &when));
	assert_int_equal(complete(&st, batch[0], ANSWER_ENABLED, 100), POLICY_DONE);
	assert_int_equal(complete(&st, batch[1], ANSWER_ENABLED, 100), POLICY_DONE);

	/*
	 * A full batch goes out at once; the rest waits for the next one.  (Which
	 * of the keys due at the same time is left over is not specified.)
	 */
	assert_non_null(begin_fetch(&st, "c", 200));
	assert_non_null(begin_fetch(&st, "d", 200));
	assert_non_null(begin_fetch(&st, "e", 200));
	assert_non_null(begin_fetch(&st, "f", 200));
	n = policy_ready_batch(st.policy, 200, 3, 100, &batch);
	assert_int_equal(n, 3);
	for (i = 0; i < 4; i++)
	{
		PolicyEntry *e = lookup(&st, later[i]);

		assert_int_equal(e->state, POLICY_IN_PROGRESS);
		if (!e->dispatched)
		{
			assert_null(leftover);
			leftover = later[i];
		}
	}
	assert_non_null(leftover);
	assert_true(policy_next_wakeup(st.policy, 100, &when));
	assert_int_equal(when, 200);	/* the leftover key is due */
	assert_int_equal(policy_ready_batch(st.policy, 200, 3, 100, &batch), 0);
	assert_true(policy_next_wakeup(st.policy, 100, &when));
	assert_int_equal(when, 300);	/* the batch holding it */
	n = policy_ready_batch(st.policy, 300, 3, 100, &batch);
	assert_int_equal(n, 1);
	assert_true(entry_is_key(batch[0], leftover));

	/* A fetch backing off wakes the worker at its due time. */
	assert_int_equal(complete(&st, batch[0], ANSWER_PENDING, 300),
					 POLICY_RESCHEDULED);
	assert_int_equal(dispatch_and_complete(&st, leftover, ANSWER_PENDING, 300),
					 POLICY_RESCHEDULED);
	/* (c, d and e are still running; a and b are evicted much later) */
	assert_true(policy_next_wakeup(st.policy, 100, &when));
	assert_int_equal(when, 1300);

	store_free(&st);
}

static void
test_batching_2000_keys(void **state)
{
	Store		st;
	PolicyEntry **batch = NULL;
	PolicyTime	now = 1000;
	PolicyTime	when;
	char		key[KEY_MAX];
	int			nbatches = 0;
	int			total = 0;
	int			n;
	int			i;

	(void) state;
	store_init(&st, DEFAULT_EXPIRY_MS, DEFAULT_GRACE_MS, 0);

	for (i = 0; i < 2000; i++)
	{
		snprintf(key, sizeof(key), "key-%04d", i);
		assert_non_null(begin_fetch(&st, key, now));
	}

	/* Full batches need no waiting. */
	while ((n = policy_ready_batch(st.policy, now, 500, 100, &batch)) > 0)
	{
		assert_int_equal(n, 500);
		nbatches++;
		total += n;
		for (i = 0; i < n; i++)
		{
			assert_true(batch[i]->dispatched);
			assert_int_equal(complete(&st, batch[i], ANSWER_DISABLED, now),
							 POLICY_DONE);
		}
	}
	assert_int_equal(nbatches, 4);
	assert_int_equal(total, 2000);
	assert_int_equal(policy_count(st.policy), 2000);

	/* Every key is now complete, evicted together at expiry + grace. */
	assert_true(policy_next_wakeup(st.policy, 100, &when));
	assert_int_equal(when, now + DEFAULT_EXPIRY_MS + DEFAULT_GRACE_MS);
	for (i = 0; i < 2000; i++)
	{
		snprintf(key, sizeof(key), "key-%04d", i);
		assert_int_equal(lookup(&st, key)->state, POLICY_COMPLETE);
		assert_state(&st, key, FAKE_DISABLED);
	}

	store_free(&st);
}

static void
test_invalidate(void **state)
{
	Store		st;
	PolicyTime	now = 0;
	PolicyTime	when;
	PolicyEntry *fetch;
	PolicyEntry **batch;

	(void) state;
	store_init(&st, 5000, 5000, 0);

	/* A complete, fresh key: a fetch is begun at once. */
	assert_non_null(begin_fetch(&st, KEY1, now));
	assert_int_equal(dispatch_and_complete(&st, KEY1, ANSWER_DISABLED, now),
					 POLICY_DONE);
	now += 1000;
	assert_null(begin_fetch(&st, KEY1, now));	/* fresh */
	fetch = policy_invalidate(st.policy, KEY1, strlen(KEY1), now);
	assert_non_null(fetch);
	assert_int_equal(fetch->state, POLICY_IN_PROGRESS);
	assert_false(fetch->is_refresh);
	assert_false(fetch->has_fetch_when);
	assert_true(fetch->invalidated);
	assert_true(policy_peek(st.policy, POLICY_QUEUE_DUE, &when));
	assert_int_equal(when, now);
	/* No eviction while it runs. */
	assert_false(policy_peek(st.policy, POLICY_QUEUE_EVICT, &when));
	/* The old value keeps serving. */
	assert_state(&st, KEY1, FAKE_DISABLED);

	/* A pending answer: the key stays stale, the retry follows. */
	assert_int_equal(dispatch_and_complete(&st, KEY1, ANSWER_PENDING, now),
					 POLICY_RESCHEDULED);
	fetch = in_progress(&st, KEY1);
	assert_true(fetch->invalidated);
	assert_state(&st, KEY1, FAKE_DISABLED);

	/* A value: fresh again, no new fetch needed. */
	assert_int_equal(dispatch_and_complete(&st, KEY1, ANSWER_ENABLED, now),
					 POLICY_DONE);
	assert_false(lookup(&st, KEY1)->invalidated);
	assert_state(&st, KEY1, FAKE_ENABLED);
	assert_null(begin_fetch(&st, KEY1, now));

	/*
	 * Invalidated while its fetch runs: that fetch may carry data older than
	 * the invalidation, so another fetch follows its completion.
	 */
	now += 1000;
	fetch = policy_invalidate(st.policy, KEY1, strlen(KEY1), now);
	assert_non_null(fetch);
	(void) dispatch(&st, KEY1, now);
	assert_null(policy_invalidate(st.policy, KEY1, strlen(KEY1), now));
	assert_true(fetch->refetch_after);
	assert_int_equal(complete(&st, fetch, ANSWER_DISABLED, now),
					 POLICY_RESCHEDULED);
	/* The completed fetch's value is published all the same. */
	assert_state(&st, KEY1, FAKE_DISABLED);
	fetch = in_progress(&st, KEY1);
	assert_false(fetch->is_refresh);
	assert_false(fetch->has_fetch_when);
	assert_true(fetch->invalidated);
	assert_false(policy_peek(st.policy, POLICY_QUEUE_EVICT, &when));
	assert_int_equal(dispatch_and_complete(&st, KEY1, ANSWER_ENABLED, now),
					 POLICY_DONE);
	assert_state(&st, KEY1, FAKE_ENABLED);

	/* Invalidated while backing off: made due now. */
	assert_non_null(begin_fetch(&st, KEY2, now));
	assert_int_equal(dispatch_and_complete(&st, KEY2, ANSWER_PENDING, now),
					 POLICY_RESCHEDULED);
	assert_int_equal(dispatch_and_complete(&st, KEY2, ANSWER_PENDING, now),
					 POLICY_RESCHEDULED);
	fetch = in_progress(&st, KEY2);
	assert_true(fetch->has_fetch_when);
	assert_int_equal(fetch->fetch_when, now + 1000);
	assert_int_equal(policy_ready_batch(st.policy, now, DISPATCH_BATCH_SIZE, 0,
										&batch), 0);
	assert_null(policy_invalidate(st.policy, KEY2, strlen(KEY2), now));
	assert_false(fetch->has_fetch_when);
	assert_true(policy_peek(st.policy, POLICY_QUEUE_DUE, &when));
	assert_int_equal(when, now);
	assert_int_equal(dispatch_and_complete(&st, KEY2, ANSWER_ENABLED, now),
					 POLICY_DONE);
	assert_state(&st, KEY2, FAKE_ENABLED);

	/* An unknown key: a normal fetch is begun. */
	fetch = policy_invalidate(st.policy, KEY3, strlen(KEY3), now);
	assert_non_null(fetch);
	assert_true(entry_is_key(fetch, KEY3));
	assert_int_equal(fetch->state, POLICY_IN_PROGRESS);

	/*
	 * Gathered but not handed out yet: the fetch has not started, so it will
	 * see the change; no second fetch, and it stays in the batch.
	 */
	assert_int_equal(policy_ready_batch(st.policy, now, DISPATCH_BATCH_SIZE, 1000,
										&batch), 0);
	assert_null(policy_invalidate(st.policy, KEY3, strlen(KEY3), now));
	assert_false(fetch->refetch_after);
	assert_int_equal(fetch->heap_pos[POLICY_QUEUE_DUE], -1);
	assert_int_equal(policy_ready_batch(st.policy, now + 1000,
										DISPATCH_BATCH_SIZE, 1000, &batch),
					 1);
	assert_ptr_equal(batch[0], fetch);

	store_free(&st);
}

static void
test_request_evict(void **state)
{
	Store		st;
	PolicyTime	now = 0;
	PolicyTime	when;
	PolicyEntry *fetch;
	PolicyEntry **batch;

	(void) state;
	store_init(&st, 5000, 5000, 7000);

	/* A complete key goes now, with its eviction and refresh timers. */
	assert_non_null(begin_fetch(&st, KEY1, now));
	assert_int_equal(dispatch_and_complete(&st, KEY1, ANSWER_DISABLED, now),
					 POLICY_DONE);
	assert_int_equal(policy_request_evict(st.policy, KEY1, strlen(KEY1)),
					 POLICY_EVICT_NOW);
	assert_true(fake_remove(st.shared, KEY1));
	assert_null(lookup(&st, KEY1));
	assert_false(policy_peek(st.policy, POLICY_QUEUE_EVICT, &when));
	assert_false(policy_peek(st.policy, POLICY_QUEUE_REFRESH, &when));

	/* A fetch not yet dispatched is dropped. */
	assert_non_null(begin_fetch(&st, KEY1, now));
	assert_int_equal(policy_request_evict(st.policy, KEY1, strlen(KEY1)),
					 POLICY_EVICT_NOW);
	assert_true(fake_remove(st.shared, KEY1));
	assert_null(lookup(&st, KEY1));
	assert_int_equal(policy_ready_batch(st.policy, now, DISPATCH_BATCH_SIZE, 0,
										&batch), 0);

	/* So is one backing off. */
	assert_non_null(begin_fetch(&st, KEY1, now));
	assert_int_equal(dispatch_and_complete(&st, KEY1, ANSWER_PENDING, now),
					 POLICY_RESCHEDULED);
	assert_int_equal(dispatch_and_complete(&st, KEY1, ANSWER_PENDING, now),
					 POLICY_RESCHEDULED);
	assert_true(in_progress(&st, KEY1)->has_fetch_when);
	assert_int_equal(policy_request_evict(st.policy, KEY1, strlen(KEY1)),
					 POLICY_EVICT_NOW);
	assert_true(fake_remove(st.shared, KEY1));
	assert_false(policy_next_wakeup(st.policy, 0, &when));

	/* A running fetch: deferred until it completes. */
	assert_non_null(begin_fetch(&st, KEY1, now));
	fetch = dispatch(&st, KEY1, now);
	assert_int_equal(policy_request_evict(st.policy, KEY1, strlen(KEY1)),
					 POLICY_EVICT_DEFERRED);
	assert_ptr_equal(lookup(&st, KEY1), fetch);
	assert_true(fetch->evict_after);
	now += 500;
	assert_int_equal(complete(&st, fetch, ANSWER_ENABLED, now), POLICY_EVICTED);
	assert_null(lookup(&st, KEY1));
	assert_null(fake_find(st.shared, KEY1));
	assert_int_equal(policy_count(st.policy), 0);
	assert_false(policy_next_wakeup(st.policy, 0, &when));

	/* An unknown key: nothing to wait for. */
	assert_int_equal(policy_request_evict(st.policy, KEY2, strlen(KEY2)),
					 POLICY_EVICT_NOW);

	/*
	 * Gathered into the open batch but not handed out: its fetch has not
	 * started, so it is dropped now, and the batch goes out without it.
	 */
	assert_non_null(begin_fetch(&st, KEY1, now));
	assert_non_null(begin_fetch(&st, KEY2, now));
	assert_int_equal(policy_ready_batch(st.policy, now, DISPATCH_BATCH_SIZE, 1000,
										&batch), 0);
	assert_false(lookup(&st, KEY1)->dispatched);
	assert_int_equal(policy_request_evict(st.policy, KEY1, strlen(KEY1)),
					 POLICY_EVICT_NOW);
	assert_true(fake_remove(st.shared, KEY1));
	assert_null(lookup(&st, KEY1));
	now += 1000;
	assert_int_equal(policy_ready_batch(st.policy, now, DISPATCH_BATCH_SIZE, 1000,
										&batch), 1);
	assert_ptr_equal(batch[0], lookup(&st, KEY2));
	assert_true(batch[0]->dispatched);

	store_free(&st);
}

/*
 * A key asked for after a restart, before the dump's load gave it its value
 * (a reader that waited past projcache.restore_wait): the restored value
 * stands, and the fetch asked for leaves the due queues, so no batch takes
 * a key that is no longer being fetched.
 */
static void
test_restore_complete_over_requested(void **state)
{
	Store		st;
	PolicyTime	base = 100000;
	PolicyEntry *e;
	PolicyEntry **batch = NULL;

	(void) state;
	store_init(&st, 5000, 5000, 7000);
	e = begin_fetch(&st, KEY1, base);
	assert_non_null(e);
	assert_int_equal(e->state, POLICY_IN_PROGRESS);

	e = policy_restore_complete(st.policy, KEY1, strlen(KEY1), base - 1000,
								base + 9000, NULL, false, 0);
	assert_int_equal(e->state, POLICY_COMPLETE);
	assert_int_equal(policy_count(st.policy), 1);
	assert_int_equal(policy_ready_batch(st.policy, base + 1000,
										DISPATCH_BATCH_SIZE, 0, &batch), 0);

	/* It is stale later, and then fetched as any other key. */
	e = begin_fetch(&st, KEY1, base + 6000);
	assert_non_null(e);
	dispatch(&st, KEY1, base + 6000);

	store_free(&st);
}

static void
test_restore_complete(void **state)
{
	Store		st;
	PolicyTime	base = 100000;
	PolicyTime	now = base;
	PolicyEntry *e;
	Action		action;

	(void) state;
	store_init(&st, 5000, 5000, 7000);

	/*
	 * After a worker restart: KEY1 was fetched 3 s ago (evicted at +7 s,
	 * refreshed at +4 s), KEY2 6 s ago without a refresh (evicted at +4 s),
	 * KEY3 6 s ago (evicted at +4 s).
	 */
	fake_set_state(st.shared, KEY1, FAKE_DISABLED);
	fake_set_state(st.shared, KEY2, FAKE_ENABLED);
	fake_set_state(st.shared, KEY3, FAKE_ENABLED);
	e = policy_restore_complete(st.policy, KEY1, strlen(KEY1), base - 3000,
								base + 7000, NULL, true, base + 4000);
	assert_non_null(e);
	assert_int_equal(e->state, POLICY_COMPLETE);
	assert_true(e->has_last_fetch);
	assert_int_equal(e->last_fetch, base - 3000);
	assert_non_null(policy_restore_complete(st.policy, KEY2, strlen(KEY2),
											base - 6000, base + 4000, NULL,
											false, 0));
	assert_non_null(policy_restore_complete(st.policy, KEY3, strlen(KEY3),
											base - 6000, base + 4000, NULL,
											false, 0));
	assert_int_equal(policy_count(st.policy), 3);

	/* Freshness follows the restored last fetch. */
	assert_null(begin_fetch(&st, KEY1, now));
	e = begin_fetch(&st, KEY3, now);
	assert_non_null(e);
	assert_int_equal(dispatch_and_complete(&st, KEY3, ANSWER_NOT_MODIFIED, now),
					 POLICY_DONE);
	/* A normal fetch moved KEY3's eviction. */
	assert_int_equal(lookup(&st, KEY3)->expiry, base + 10000);

	/* KEY2 is evicted on its restored schedule. */
	action = store_poll(&st, &now, -1);
	assert_int_equal(action.kind, ACTION_EVICTION);
	assert_string_equal(action.key, KEY2);
	assert_int_equal(now, base + 4000);
	store_evict(&st, action.key);

	/* KEY1's restored refresh fires at the same time. */
	action = store_poll(&st, &now, -1);
	assert_int_equal(action.kind, ACTION_REFRESH);
	assert_string_equal(action.key, KEY1);
	assert_int_equal(now, base + 4000);
	assert_non_null(refresh_key(&st, KEY1, now));
	assert_int_equal(dispatch_and_complete(&st, KEY1, ANSWER_ENABLED, now),
					 POLICY_DONE);
	assert_state(&st, KEY1, FAKE_ENABLED);

	/* The refresh kept the restored eviction time. */
	action = store_poll(&st, &now, -1);
	assert_int_equal(action.kind, ACTION_EVICTION);
	assert_string_equal(action.key, KEY1);
	assert_int_equal(now, base + 7000);
	store_evict(&st, action.key);

	/* KEY3's refresh, scheduled by its fetch at base, is due then too. */
	action = store_poll(&st, &now, -1);
	assert_int_equal(action.kind, ACTION_REFRESH);
	assert_string_equal(action.key, KEY3);
	assert_int_equal(now, base + 7000);
	assert_non_null(refresh_key(&st, KEY3, now));
	assert_int_equal(dispatch_and_complete(&st, KEY3, ANSWER_NOT_MODIFIED, now),
					 POLICY_DONE);

	action = store_poll(&st, &now, -1);
	assert_int_equal(action.kind, ACTION_EVICTION);
	assert_string_equal(action.key, KEY3);
	assert_int_equal(now, base + 10000);
	store_evict(&st, action.key);

	action = store_poll(&st, &now, 60000);
	assert_int_equal(action.kind, ACTION_NONE);
	assert_int_equal(policy_count(st.policy), 0);

	store_free(&st);
}

static void
test_pending_never_evicted(void **state)
{
	Store		st;
	PolicyTime	now = 0;
	PolicyTime	when;
	PolicyEntry *fetch;
	char		evicted[4][KEY_MAX];
	int			i;

	(void) state;

	/* Never fetched successfully: pending for ten times the expiry. */
	store_init_full(&st, 5000, 0, 0, 5000);
	assert_non_null(begin_fetch(&st, KEY1, now));
	while (now < 50000)
	{
		fetch = in_progress(&st, KEY1);
		if (fetch->has_fetch_when && fetch->fetch_when > now)
			now = fetch->fetch_when;
		fetch = dispatch(&st, KEY1, now);
		now += 100;				/* the fetch takes a while */
		assert_int_equal(complete(&st, fetch, ANSWER_PENDING, now),
						 POLICY_RESCHEDULED);
		assert_int_equal(collect_evicted(&st, now, evicted, 4), 0);
		assert_false(policy_peek(st.policy, POLICY_QUEUE_EVICT, &when));
	}
	assert_int_equal(in_progress(&st, KEY1)->state, POLICY_IN_PROGRESS);
	assert_state(&st, KEY1, FAKE_PENDING);
	store_free(&st);

	/* Had a value, then stays pending past its expiry: kept, value kept. */
	now = 0;
	store_init_full(&st, 5000, 0, 0, 5000);
	assert_non_null(begin_fetch(&st, KEY1, now));
	assert_int_equal(dispatch_and_complete(&st, KEY1, ANSWER_DISABLED, now),
					 POLICY_DONE);
	now += 5000;
	assert_non_null(begin_fetch(&st, KEY1, now));	/* expired, not yet
													 * evicted */
	for (i = 0; i < 20; i++)
	{
		fetch = in_progress(&st, KEY1);
		if (fetch->has_fetch_when && fetch->fetch_when > now)
			now = fetch->fetch_when;
		assert_int_equal(dispatch_and_complete(&st, KEY1, ANSWER_PENDING, now),
						 POLICY_RESCHEDULED);
		assert_int_equal(collect_evicted(&st, now, evicted, 4), 0);
	}
	assert_true(now > 50000);
	assert_state(&st, KEY1, FAKE_DISABLED);
	store_free(&st);
}

static void
test_refresh_unknown_key(void **state)
{
	Store		st;
	PolicyTime	now = 0;

	(void) state;
	store_init(&st, 5000, 5000, 7000);

	/* Never seen. */
	assert_null(refresh_key(&st, KEY1, now));
	assert_null(lookup(&st, KEY1));
	assert_int_equal(policy_count(st.policy), 0);

	/* Seen, then evicted: the refresh must not bring it back. */
	assert_non_null(begin_fetch(&st, KEY1, now));
	assert_int_equal(dispatch_and_complete(&st, KEY1, ANSWER_DISABLED, now),
					 POLICY_DONE);
	now += 10000;
	assert_int_equal(policy_request_evict(st.policy, KEY1, strlen(KEY1)),
					 POLICY_EVICT_NOW);
	assert_true(fake_remove(st.shared, KEY1));
	assert_null(refresh_key(&st, KEY1, now));
	assert_null(lookup(&st, KEY1));
	assert_int_equal(policy_count(st.policy), 0);

	store_free(&st);
}

/* xorshift64*: a fixed seed keeps the stress test reproducible. */
static uint64_t
next_random(uint64_t *seed)
{
	uint64_t	x = *seed;

	x ^= x >> 12;
	x ^= x << 25;
	x ^= x >> 27;
	*seed = x;
	return x * UINT64_C(2685821657736338717);
}

#define STRESS_KEYS 10000
#define STRESS_SPAN 1000000

/*
 * Drain one queue in steps of the clock: what comes out is due, in
 * non-decreasing time order, and nothing due is left behind.  With
 * remove_every > 0, every so many pops another live key is evicted out of
 * the middle of the heap.
 */
static int
drain_queue(Store *st, PolicyQueue queue, bool *alive, int remove_every,
			uint64_t *seed, int *removed)
{
	PolicyTime	now;
	PolicyTime	last = INT64_MIN;
	PolicyTime	when;
	int			popped = 0;

	for (now = 0; now <= STRESS_SPAN; now += STRESS_SPAN / 64)
	{
		PolicyEntry *e;

		for (;;)
		{
			char		key[KEY_MAX];
			int			idx;

			e = queue == POLICY_QUEUE_EVICT ?
				policy_pop_eviction(st->policy, now) :
				policy_pop_refresh(st->policy, now);
			if (e == NULL)
				break;
			assert_int_equal(e->heap_pos[queue], -1);
			assert_true(e->heap_time[queue] <= now);
			assert_true(e->heap_time[queue] >= last);
			last = e->heap_time[queue];
			popped++;

			if (queue != POLICY_QUEUE_EVICT)
				continue;

			copy_key(key, e);
			idx = atoi(key + 4);
			policy_evict(st->policy, e);
			alive[idx] = false;

			if (remove_every > 0 && popped % remove_every == 0)
			{
				int			victim = (int) (next_random(seed) % STRESS_KEYS);

				if (alive[victim])
				{
					snprintf(key, sizeof(key), "key-%05d", victim);
					assert_int_equal(policy_request_evict(st->policy, key,
														  strlen(key)),
									 POLICY_EVICT_NOW);
					alive[victim] = false;
					(*removed)++;
				}
			}
		}
		if (policy_peek(st->policy, queue, &when))
			assert_true(when > now);
	}
	assert_false(policy_peek(st->policy, queue, &when));
	return popped;
}

static void
test_heap_stress(void **state)
{
	Store		st;
	uint64_t	seed = UINT64_C(0x9E3779B97F4A7C15);
	bool	   *alive;
	bool	   *has_refresh;
	PolicyTime *evict_at;
	PolicyTime *refresh_at;
	char		key[KEY_MAX];
	int			nalive = 0;
	int			nrefresh = 0;
	int			removed = 0;
	int			i;

	(void) state;
	store_init(&st, 5000, 5000, 7000);
	alive = calloc(STRESS_KEYS, sizeof(bool));
	has_refresh = calloc(STRESS_KEYS, sizeof(bool));
	evict_at = calloc(STRESS_KEYS, sizeof(PolicyTime));
	refresh_at = calloc(STRESS_KEYS, sizeof(PolicyTime));
	assert_non_null(alive);
	assert_non_null(has_refresh);
	assert_non_null(evict_at);
	assert_non_null(refresh_at);

	/* Many keys at random times, many sharing a time. */
	for (i = 0; i < STRESS_KEYS; i++)
	{
		snprintf(key, sizeof(key), "key-%05d", i);
		evict_at[i] = (PolicyTime) (next_random(&seed) % STRESS_SPAN);
		if (i % 7 == 0)
			evict_at[i] = evict_at[i] / 1000 * 1000;
		has_refresh[i] = next_random(&seed) % 2 == 0;
		refresh_at[i] = (PolicyTime) (next_random(&seed) % STRESS_SPAN);
		assert_non_null(policy_restore_complete(st.policy, key, strlen(key), 0,
												evict_at[i], NULL,
												has_refresh[i], refresh_at[i]));
		alive[i] = true;
	}

	/* Reschedule some (removal from the middle, then insertion)... */
	for (i = 0; i < STRESS_KEYS; i += 3)
	{
		snprintf(key, sizeof(key), "key-%05d", i);
		evict_at[i] = (PolicyTime) (next_random(&seed) % STRESS_SPAN);
		refresh_at[i] = (PolicyTime) (next_random(&seed) % STRESS_SPAN);
		has_refresh[i] = true;
		assert_non_null(policy_restore_complete(st.policy, key, strlen(key), 0,
												evict_at[i], NULL, true,
												refresh_at[i]));
	}
	/* ...and remove others. */
	for (i = 0; i < STRESS_KEYS; i++)
	{
		if (next_random(&seed) % 5 != 0)
			continue;
		snprintf(key, sizeof(key), "key-%05d", i);
		assert_int_equal(policy_request_evict(st.policy, key, strlen(key)),
						 POLICY_EVICT_NOW);
		alive[i] = false;
	}

	/* Every live key is queued at its own time, and only those. */
	for (i = 0; i < STRESS_KEYS; i++)
	{
		PolicyEntry *e;

		snprintf(key, sizeof(key), "key-%05d", i);
		e = lookup(&st, key);
		if (!alive[i])
		{
			assert_null(e);
			continue;
		}
		assert_non_null(e);
		nalive++;
		assert_true(e->heap_pos[POLICY_QUEUE_EVICT] >= 0);
		assert_int_equal(e->heap_time[POLICY_QUEUE_EVICT], evict_at[i]);
		if (has_refresh[i])
		{
			nrefresh++;
			assert_true(e->heap_pos[POLICY_QUEUE_REFRESH] >= 0);
			assert_int_equal(e->heap_time[POLICY_QUEUE_REFRESH], refresh_at[i]);
		}
		else
			assert_int_equal(e->heap_pos[POLICY_QUEUE_REFRESH], -1);
	}
	assert_int_equal(policy_count(st.policy), nalive);

	/* Refreshes come out in order; then evictions, with removals between. */
	assert_int_equal(drain_queue(&st, POLICY_QUEUE_REFRESH, alive, 0, &seed,
								 &removed), nrefresh);
	assert_int_equal(drain_queue(&st, POLICY_QUEUE_EVICT, alive, 3, &seed,
								 &removed) + removed, nalive);
	assert_true(removed > 0);
	assert_int_equal(policy_count(st.policy), 0);

	free(alive);
	free(has_refresh);
	free(evict_at);
	free(refresh_at);
	store_free(&st);
}

/* ----------------------------------------------------------------
 * Eviction under memory pressure: S3-FIFO
 * ----------------------------------------------------------------
 */

/* The visited marks, kept by the caller as readers would set them. */
typedef struct VisitedSet
{
	char		keys[16][8];
	bool		marked[16];
	int			n;
	int			looks;			/* how many times the hand asked */
} VisitedSet;

static void
visit_set(VisitedSet *v, const char *key)
{
	int			i;

	for (i = 0; i < v->n; i++)
		if (strcmp(v->keys[i], key) == 0)
		{
			v->marked[i] = true;
			return;
		}
	strcpy(v->keys[v->n], key);
	v->marked[v->n++] = true;
}

static bool
test_and_clear(PolicyEntry *e, void *arg)
{
	VisitedSet *v = (VisitedSet *) arg;
	int			i;

	v->looks++;
	for (i = 0; i < v->n; i++)
		if (strlen(v->keys[i]) == e->keylen &&
			memcmp(v->keys[i], e->key, e->keylen) == 0)
		{
			bool		was = v->marked[i];

			v->marked[i] = false;
			return was;
		}
	return false;
}


/* Each SIEVE test gets a policy of default settings and empty marks. */
typedef struct SieveFixture
{
	Policy	   *s;
	VisitedSet	v;
	char		buf[8];
} SieveFixture;

static int
sieve_setup(void **state)
{
	PolicyConfig config = {DEFAULT_EXPIRY_MS, DEFAULT_GRACE_MS, 0, 60000};
	SieveFixture *f = calloc(1, sizeof(SieveFixture));

	f->s = policy_create(&config, malloc, free);
	*state = f;
	return 0;
}

static int
sieve_teardown(void **state)
{
	SieveFixture *f = *state;

	policy_destroy(f->s);
	free(f);
	return 0;
}


/* Cache one complete key per letter of keys, oldest first. */
static void
cached(SieveFixture *f, const char *keys)
{
	for (; *keys; keys++)
		assert_non_null(policy_restore_complete(f->s, keys, 1, 0, 1000000,
												NULL, false, 0));
}

/* A reader reads the key: it is marked visited. */
static void
visit(SieveFixture *f, const char *key)
{
	visit_set(&f->v, key);
}

/* Evict S3-FIFO's next victim as the worker does; its key, or NULL. */
static const char *
sieve_evict(SieveFixture *f)
{
	PolicyEntry *e = policy_memory_victim(f->s, 0, test_and_clear, &f->v);

	if (e == NULL)
		return NULL;
	memcpy(f->buf, e->key, e->keylen);
	f->buf[e->keylen] = '\0';
	policy_evict_victim(f->s, e);
	return f->buf;
}

/* Is the (one-letter) key in the main FIFO? */
static bool
in_main(SieveFixture *f, const char *key)
{
	PolicyEntry *e = policy_lookup(f->s, key, strlen(key));

	assert_non_null(e);
	return e->in_main;
}

/*
 * A reader asks for a key the cache does not hold: the worker creates it.
 * Says whether it went straight into the main FIFO (a ghost hit).
 */
static bool
asked_for(SieveFixture *f, const char *key)
{
	PolicyEntry *e = policy_try_begin_fetch(f->s, key, strlen(key), false, 0);

	assert_non_null(e);
	return e->in_main;
}

/* For test_s3fifo_main_kept: keys 'a' to 'k' are always kept (in use). */
static bool
kept_a_to_k(PolicyEntry *e, void *arg)
{
	(void) arg;
	return e->keylen == 1 && e->key[0] >= 'a' && e->key[0] <= 'k';
}

/*
 * A caller that keeps every key of the main FIFO (values in use) still gets
 * the small FIFO's unvisited key, although the small FIFO is below its
 * share; and none once the small FIFO has none left either.
 */
static void
test_s3fifo_main_kept(void **state)
{
	SieveFixture *f = *state;
	PolicyEntry *e;

	cached(f, "abcdefghijk");
	for (const char *k = "abcdefghijk"; *k; k++)
	{
		char		key[2] = {*k, '\0'};

		visit(f, key);
	}
	/* read again: promoted until the small FIFO is below its share */
	assert_string_equal(sieve_evict(f), "a");
	assert_int_equal(policy_small_count(f->s), 1);
	cached(f, "m");
	/* k (read) moves on, then m alone: 1 key of 11, below its share */
	e = policy_memory_victim(f->s, 0, kept_a_to_k, NULL);
	assert_non_null(e);
	assert_int_equal(e->key[0], 'm');
	policy_evict_victim(f->s, e);
	assert_null(policy_memory_victim(f->s, 0, kept_a_to_k, NULL));
	assert_int_equal(policy_count(f->s), 10);
}

/* With nothing visited, keys go oldest first, as in a FIFO. */
static void
test_s3fifo_unvisited_fifo(void **state)
{
	SieveFixture *f = *state;

	cached(f, "abc");
	assert_false(in_main(f, "a"));
	assert_int_equal(policy_small_count(f->s), 3);
	assert_string_equal(sieve_evict(f), "a");
	assert_string_equal(sieve_evict(f), "b");
	assert_string_equal(sieve_evict(f), "c");
	assert_null(sieve_evict(f));
	assert_int_equal(policy_count(f->s), 0);
}

/*
 * A key read again while in the small FIFO moves to the main one when the
 * small FIFO's eviction reaches it, its mark cleared; a key read once is
 * the victim.
 */
static void
test_s3fifo_read_again_moves_to_main(void **state)
{
	SieveFixture *f = *state;

	cached(f, "abc");
	visit(f, "b");
	assert_string_equal(sieve_evict(f), "a");
	assert_false(in_main(f, "b"));	/* promoted only when looked at */
	/* b read again: to main, mark cleared; c read once: the victim */
	assert_string_equal(sieve_evict(f), "c");
	assert_true(in_main(f, "b"));
	assert_int_equal(policy_small_count(f->s), 0);
	/* b was not read again in main: taken now */
	assert_string_equal(sieve_evict(f), "b");
}

/*
 * While the small FIFO holds its share of the keys (at first
 * POLICY_SMALL_MIN_PERCENT), keys read once leave from it, oldest first,
 * before any key of the main FIFO, however old: a scan never reaches the
 * main FIFO, and, its keys never coming back, leaves the share alone.
 * Below its share, the main FIFO evicts.
 */
static void
test_s3fifo_scan_leaves_main_alone(void **state)
{
	SieveFixture *f = *state;
	const uint32_t min_share =
		(uint64_t) POLICY_SHARE_ONE * POLICY_SMALL_MIN_PERCENT / 100;

	assert_int_equal(POLICY_SMALL_MIN_PERCENT, 10);
	assert_int_equal(policy_small_share(f->s), min_share);
	cached(f, "abcdefghij");
	visit(f, "a");
	visit(f, "b");
	visit(f, "c");
	visit(f, "d");
	visit(f, "e");
	visit(f, "f");
	visit(f, "g");
	/* a .. g promoted, h read once: the victim */
	assert_string_equal(sieve_evict(f), "h");
	assert_true(in_main(f, "a") && in_main(f, "g"));
	assert_int_equal(policy_small_count(f->s), 2);
	/* a scan of keys read once: i j k l m n o p q in small, 9 of 16 */
	cached(f, "klmnopq");
	assert_string_equal(sieve_evict(f), "i");	/* 8 of 15 left */
	assert_string_equal(sieve_evict(f), "j");
	assert_string_equal(sieve_evict(f), "k");
	assert_string_equal(sieve_evict(f), "l");
	assert_string_equal(sieve_evict(f), "m");
	assert_string_equal(sieve_evict(f), "n");
	assert_string_equal(sieve_evict(f), "o");
	assert_string_equal(sieve_evict(f), "p");	/* 1 of 8 left: 12.5 % */
	assert_string_equal(sieve_evict(f), "q");
	assert_int_equal(policy_small_count(f->s), 0);
	/* below its share: the main FIFO's oldest (its mark cleared) goes */
	assert_string_equal(sieve_evict(f), "a");
	assert_true(in_main(f, "b"));
	assert_int_equal(policy_small_share(f->s), min_share);
}

/*
 * The main FIFO reinserts a key read since the eviction last looked at it,
 * clearing its mark, and evicts one that was not: each pass clears the
 * marks it passes.
 */
static void
test_s3fifo_main_reinsertion_clears_marks(void **state)
{
	SieveFixture *f = *state;

	cached(f, "abc");
	visit(f, "a");
	visit(f, "b");
	visit(f, "c");
	assert_string_equal(sieve_evict(f), "a");	/* all to main, then a */
	assert_int_equal(policy_small_count(f->s), 0);
	visit(f, "b");
	f->v.looks = 0;
	/* b reinserted, mark cleared; c not read: the victim */
	assert_string_equal(sieve_evict(f), "c");
	assert_int_equal(f->v.looks, 2);
	/* b not read since: taken */
	assert_string_equal(sieve_evict(f), "b");
	assert_null(sieve_evict(f));
}

/* The keys in the order the dump writes them, one letter each. */
static void
keep_order(Policy *s, char *out)
{
	PolicyEntry *e = NULL;

	while ((e = policy_keep_order_next(s, e)) != NULL)
	{
		assert_int_equal(e->keylen, 1);
		*out++ = e->in_main ? (char) toupper((unsigned char) e->key[0]) :
			e->key[0];
	}
	*out = '\0';
}

/*
 * The dump walks the keys in the order eviction keeps them, main FIFO
 * first (newest to oldest), then the small one; restored in that order,
 * each at the oldest end of its FIFO, the FIFOs are as they were: the same
 * walk, the same victims.  Without policy_restore_fifo() every restored key
 * would land in the small FIFO, newest first, and a restart after a scan
 * would keep the scan's keys before the hot ones.
 */
static void
test_s3fifo_dump_order_round_trip(void **state)
{
	SieveFixture *f = *state;
	PolicyConfig config = {DEFAULT_EXPIRY_MS, DEFAULT_GRACE_MS, 0, 60000};
	Policy	   *restored = policy_create(&config, malloc, free);
	char		order[32];
	char		again[32];
	int			i;

	cached(f, "abcdefghij");
	for (i = 0; i < 7; i++)
	{
		char		key[2] = {(char) ('a' + i), '\0'};

		visit(f, key);
	}
	assert_string_equal(sieve_evict(f), "h");
	keep_order(f->s, order);
	assert_string_equal(order, "GFEDCBAji");

	for (i = 0; order[i] != '\0'; i++)
	{
		char		key = (char) tolower((unsigned char) order[i]);
		PolicyEntry *e = policy_restore_complete(restored, &key, 1, 0, 1000000,
												 NULL, false, 0);

		policy_restore_fifo(restored, e, order[i] != key);
	}
	keep_order(restored, again);
	assert_string_equal(again, order);
	assert_int_equal(policy_small_count(restored), policy_small_count(f->s));
	assert_int_equal(policy_fifo_bytes(restored, true),
					 policy_fifo_bytes(f->s, true));

	/* Nothing read since: both evict the same keys in the same order. */
	for (;;)
	{
		PolicyEntry *a = policy_memory_victim(f->s, 0, test_and_clear, &f->v);
		PolicyEntry *b = policy_memory_victim(restored, 0, test_and_clear, &f->v);

		if (a == NULL || b == NULL)
		{
			assert_true(a == NULL && b == NULL);
			break;
		}
		assert_memory_equal(a->key, b->key, 1);
		policy_evict_victim(f->s, a);
		policy_evict_victim(restored, b);
	}
	policy_destroy(restored);
}

/* Every key visited: one pass promotes them all, then the oldest goes. */
static void
test_s3fifo_all_visited(void **state)
{
	SieveFixture *f = *state;

	cached(f, "abc");
	visit(f, "a");
	visit(f, "b");
	visit(f, "c");
	assert_string_equal(sieve_evict(f), "a");
	assert_int_equal(f->v.looks, 4);	/* a, b, c promoted; a again */
	assert_string_equal(sieve_evict(f), "b");
}

/* Cache one complete key per letter of keys, each taking 'bytes'. */
static void
cached_bytes(SieveFixture *f, const char *keys, size_t bytes)
{
	for (; *keys; keys++)
	{
		PolicyEntry *e = policy_restore_complete(f->s, keys, 1, 0, 1000000,
												 NULL, false, 0);

		assert_non_null(e);
		policy_set_bytes(f->s, e, bytes);
	}
}

/*
 * The FIFOs' shares are counted in bytes: a scan of values larger than the
 * hot keys' holds its share of the memory with few keys, and its keys
 * leave, never the hot ones.  Counted in keys, two scan keys beside seven
 * hot ones were below the small FIFO's share, and the main FIFO's hand
 * went round the hot keys, clearing their marks, and evicted them.
 */
static void
test_s3fifo_share_in_bytes(void **state)
{
	SieveFixture *f = *state;
	const char *hot = "abcdefg";
	char		scan[2] = "A";
	int			i;

	cached_bytes(f, hot, 300);
	for (i = 0; hot[i]; i++)
	{
		char		key[2] = {hot[i], '\0'};

		visit(f, key);
	}
	/* the scan's first key, 4 kB: a .. g read again, promoted; it stays */
	cached_bytes(f, "A", 4000);
	cached_bytes(f, "B", 4000);
	assert_string_equal(sieve_evict(f), "A");
	assert_int_equal(policy_small_count(f->s), 1);
	assert_true(in_main(f, "a") && in_main(f, "g"));
	assert_int_equal(policy_fifo_bytes(f->s, true), 7 * 300);
	assert_int_equal(policy_fifo_bytes(f->s, false), 4000);

	/*
	 * The scan goes on, two of its keys in the small FIFO at a time (2 of 9
	 * keys, but 8,000 of 10,100 bytes), and the hot keys are not read
	 * meanwhile: each victim is the scan's oldest.
	 */
	for (i = 0; i < 20; i++)
	{
		char		victim[2] = {(char) ('B' + i), '\0'};

		scan[0] = (char) ('C' + i);
		cached_bytes(f, scan, 4000);
		f->v.looks = 0;
		assert_string_equal(sieve_evict(f), victim);
		assert_int_equal(f->v.looks, 1);	/* the main FIFO untouched */
	}
	assert_int_equal(policy_count(f->s), 8);
	assert_int_equal(policy_fifo_bytes(f->s, true), 7 * 300);
}

/*
 * A key's weight follows what it takes (a new value of another size), in
 * whichever FIFO it is, and leaves with it; 0 counts as 1.
 */
static void
test_s3fifo_bytes_follow_the_key(void **state)
{
	SieveFixture *f = *state;
	PolicyEntry *e;

	cached_bytes(f, "ab", 500);
	assert_int_equal(policy_fifo_bytes(f->s, false), 1000);
	visit(f, "a");
	assert_string_equal(sieve_evict(f), "b");	/* a promoted */
	assert_int_equal(policy_fifo_bytes(f->s, false), 0);
	assert_int_equal(policy_fifo_bytes(f->s, true), 500);
	e = policy_lookup(f->s, "a", 1);
	policy_set_bytes(f->s, e, 4500);
	assert_int_equal(policy_fifo_bytes(f->s, true), 4500);
	policy_set_bytes(f->s, e, 0);
	assert_int_equal(policy_fifo_bytes(f->s, true), 1);
	/* a new key weighs 1 until told */
	assert_non_null(policy_try_begin_fetch(f->s, "c", 1, false, 0));
	assert_int_equal(policy_fifo_bytes(f->s, false), 1);
	assert_string_equal(sieve_evict(f), "c");
	assert_string_equal(sieve_evict(f), "a");
	assert_int_equal(policy_fifo_bytes(f->s, true), 0);
	assert_int_equal(policy_fifo_bytes(f->s, false), 0);
}

/*
 * A key whose fetch is out (dispatched, or gathered into the open batch)
 * is never a victim, visited or not, in either FIFO; a pending key waiting
 * out its backoff is.  With nothing evictable, there is no victim.
 */
static void
test_s3fifo_spares_fetches(void **state)
{
	SieveFixture *f = *state;
	Policy	   *s = f->s;
	PolicyEntry **batch;
	PolicyEntry *p;

	assert_non_null(policy_try_begin_fetch(s, "out", 3, false, 0));
	assert_int_equal(policy_ready_batch(s, 0, 1, 0, &batch), 1);	/* dispatched */
	assert_non_null(policy_try_begin_fetch(s, "gathered", 8, false, 0));
	assert_int_equal(policy_ready_batch(s, 0, 10, 100, &batch),
					 0);		/* gathered */
	assert_null(sieve_evict(f));
	assert_int_equal(policy_count(f->s), 2);

	/* A key answered pending, now backing off, is evictable. */
	p = policy_try_begin_fetch(s, "later", 5, false, 0);
	assert_non_null(p);
	assert_int_equal(policy_ready_batch(s, 200, 10, 100, &batch), 2);
	(void) policy_complete_fetch(s, p, POLICY_RESULT_PENDING, NULL, 300);
	/* its retry is due, but not gathered yet: evictable */
	assert_true(policy_evictable(p));
	assert_string_equal(sieve_evict(f), "later");
	assert_null(sieve_evict(f));

	/*
	 * Fetches under way stay in the small FIFO, passed over; the keys read
	 * again go to main, and with only fetches left in the small FIFO, the
	 * main FIFO evicts.
	 */
	cached(f, "ab");
	visit(f, "a");
	visit(f, "b");
	assert_string_equal(sieve_evict(f), "a");
	assert_true(in_main(f, "b"));
	assert_string_equal(sieve_evict(f), "b");
	assert_null(sieve_evict(f));
	assert_int_equal(policy_count(f->s), 2);
}

/*
 * A key either FIFO evicted, asked for again while the ghost FIFO
 * remembers it, goes straight into the main FIFO; keys evicted otherwise
 * (a timer, evict()) come back as new keys, to the small FIFO.  A ghost
 * hit is used up.
 */
static void
test_s3fifo_ghost_admits_to_main(void **state)
{
	SieveFixture *f = *state;

	cached(f, "abcd");
	visit(f, "d");
	assert_string_equal(sieve_evict(f), "a");
	assert_true(policy_in_ghost(f->s, "a", 1));
	assert_int_equal(policy_request_evict(f->s, "b", 1), POLICY_EVICT_NOW);
	assert_false(policy_in_ghost(f->s, "b", 1));
	assert_true(asked_for(f, "a"));
	assert_false(policy_in_ghost(f->s, "a", 1));
	assert_false(asked_for(f, "b"));

	/*
	 * small: c d b; main: a.  One key back in four is more than 16 keys'
	 * worth: the small FIFO's share is at its most, 90 %, and 3 of 4 keys are
	 * below it, so main's oldest goes, remembered too.
	 */
	assert_string_equal(sieve_evict(f), "a");
	assert_true(policy_in_ghost(f->s, "a", 1));
	/* back from main: to main again, the share at its least */
	assert_true(asked_for(f, "a"));
	assert_string_equal(sieve_evict(f), "c");
	/* d read again: promoted; b the victim */
	assert_string_equal(sieve_evict(f), "b");
	assert_true(in_main(f, "d"));
}

/*
 * The ghost FIFO holds as many keys as the main FIFO: a key is remembered
 * while it is among the last that many the small FIFO evicted.
 */
static void
test_s3fifo_ghost_forgets(void **state)
{
	SieveFixture *f = *state;

	cached(f, "abcd");
	visit(f, "a");
	assert_string_equal(sieve_evict(f), "b");	/* a to main: 1 key */
	assert_true(policy_in_ghost(f->s, "b", 1));
	assert_string_equal(sieve_evict(f), "c");
	assert_true(policy_in_ghost(f->s, "c", 1));
	assert_false(policy_in_ghost(f->s, "b", 1));
	/* main grows to 2: the ghost FIFO remembers two again */
	visit(f, "d");
	cached(f, "e");
	assert_string_equal(sieve_evict(f), "e");	/* d promoted */
	assert_true(policy_in_ghost(f->s, "e", 1));
	assert_true(policy_in_ghost(f->s, "c", 1));
}

/* The small FIFO's share, in percent of the keys' weight. */
static double
share_percent(SieveFixture *f)
{
	return 100.0 * policy_small_share(f->s) / POLICY_SHARE_ONE;
}

/*
 * Cache n keys named <prefix><i>: in the small FIFO, oldest first; in the
 * main one as a dump's load restores them, each at the oldest end.
 */
static void
cached_many(SieveFixture *f, const char *prefix, int n, bool main)
{
	char		key[16];
	int			i;

	for (i = 0; i < n; i++)
	{
		PolicyEntry *e;

		snprintf(key, sizeof(key), "%s%d", prefix, i);
		e = policy_restore_complete(f->s, key, strlen(key), 0, 1000000, NULL,
									false, 0);
		assert_non_null(e);
		if (main)
			policy_restore_fifo(f->s, e, true);
	}
}

/*
 * A key back from the small FIFO's victims grows the small FIFO's share
 * by POLICY_SMALL_GROW_KEYS keys' worth of the keys held, each time, up to
 * POLICY_SMALL_MAX_PERCENT; and goes to the main FIFO.
 */
static void
test_s3fifo_share_grows_on_small_ghost(void **state)
{
	SieveFixture *f = *state;
	char		key[16];
	int			i;

	/* 100 keys in main, 100 in small; the small FIFO's oldest 20 go */
	cached_many(f, "m", 100, true);
	cached_many(f, "k", 100, false);
	for (i = 0; i < 20; i++)
	{
		snprintf(key, sizeof(key), "k%d", i);
		assert_string_equal(sieve_evict(f), key);
	}
	assert_true(fabs(share_percent(f) - POLICY_SMALL_MIN_PERCENT) < 0.001);
	assert_true(asked_for(f, "k0"));
	/* 181 keys held: 16 of them is 8.84 % more */
	assert_true(fabs(share_percent(f) - (10.0 + 100.0 * 16 / 181)) < 0.001);
	/* more of them back: the share grows, but no further than 90 % */
	for (i = 1; i < 20; i++)
	{
		snprintf(key, sizeof(key), "k%d", i);
		assert_true(asked_for(f, key));
	}
	assert_int_equal(policy_small_share(f->s),
					 (uint64_t) POLICY_SHARE_ONE * POLICY_SMALL_MAX_PERCENT / 100);
}

/* Evict unread keys until one of the main FIFO's (named m<i>) goes. */
static const char *
evict_until_main(SieveFixture *f)
{
	const char *victim;

	do
	{
		victim = sieve_evict(f);
		assert_non_null(victim);
	} while (victim[0] != 'm');
	return victim;
}

/*
 * A key back from the main FIFO's victims shrinks the share by
 * POLICY_SMALL_SHRINK_KEYS keys' worth of the keys held, down to
 * POLICY_SMALL_MIN_PERCENT, and goes to the main FIFO.
 */
static void
test_s3fifo_share_shrinks_on_main_ghost(void **state)
{
	SieveFixture *f = *state;
	char		key[16];
	int			i;
	double		grown;

	/* five keys back from the small FIFO's victims grow the share */
	cached_many(f, "m", 100, true);
	cached_many(f, "k", 100, false);
	for (i = 0; i < 5; i++)
		(void) sieve_evict(f);
	for (i = 0; i < 5; i++)
	{
		snprintf(key, sizeof(key), "k%d", i);
		assert_true(asked_for(f, key));
	}
	grown = share_percent(f);
	assert_true(grown > 10.0 + 5 * 100.0 * 16 / 200);

	/*
	 * The small FIFO evicts down to its share, then main's oldest goes: m99,
	 * restored as a dump's keys are, each at the oldest end.
	 */
	assert_string_equal(evict_until_main(f), "m99");
	assert_true(asked_for(f, "m99"));
	assert_true(fabs(share_percent(f) -
					 (grown - 100.0 * POLICY_SMALL_SHRINK_KEYS /
					  policy_count(f->s))) < 0.001);

	/* more back from main: the share falls to its least, no further */
	for (i = 0; i < 5; i++)
	{
		snprintf(key, sizeof(key), "%s", evict_until_main(f));
		assert_true(asked_for(f, key));
	}
	assert_int_equal(policy_small_share(f->s),
					 (uint64_t) POLICY_SHARE_ONE * POLICY_SMALL_MIN_PERCENT / 100);
}

/*
 * Other evictions (a key's timer, evict()) take keys out of their FIFO
 * wherever they are.
 */
static void
test_s3fifo_other_evictions(void **state)
{
	SieveFixture *f = *state;

	cached(f, "abcd");
	visit(f, "a");
	visit(f, "b");
	assert_string_equal(sieve_evict(f), "c");	/* a b to main */
	assert_int_equal(policy_request_evict(f->s, "a", 1), POLICY_EVICT_NOW);
	assert_int_equal(policy_request_evict(f->s, "d", 1), POLICY_EVICT_NOW);
	assert_int_equal(policy_small_count(f->s), 0);
	assert_string_equal(sieve_evict(f), "b");
	assert_null(sieve_evict(f));
	assert_int_equal(policy_count(f->s), 0);
}

/* ----------------------------------------------------------------
 * Fair fetching: keys read once wait behind the rest, and not without end
 * ----------------------------------------------------------------
 */

/* The keys of the next batch (up to n), in order, as one string of letters. */
static const char *
next_batch(SieveFixture *f, int n, PolicyTime now)
{
	PolicyEntry **batch;
	int			count = policy_ready_batch(f->s, now, n, 0, &batch);
	int			i;

	for (i = 0; i < count; i++)
	{
		assert_int_equal(batch[i]->keylen, 1);
		f->buf[i] = batch[i]->key[0];
	}
	f->buf[count] = '\0';
	return f->buf;
}

/* Begin a fetch of each one-letter key, in order. */
static void
asked_for_all(SieveFixture *f, const char *keys, PolicyTime now)
{
	for (; *keys; keys++)
		assert_non_null(policy_try_begin_fetch(f->s, keys, 1, false, now));
}

/*
 * A stale key's fetch goes before that of a new key read again while it
 * waited, which goes before those of keys read once, whatever came first;
 * each queue keeps its order.
 */
static void
test_fair_fetch_order(void **state)
{
	SieveFixture *f = *state;
	PolicyTime	now = 0;

	/* "s" and "t" have values that go stale at DEFAULT_EXPIRY_MS. */
	(void) policy_restore_complete(f->s, "s", 1, 0, 1000000, NULL, false, 0);
	(void) policy_restore_complete(f->s, "t", 1, 0, 1000000, NULL, false, 0);
	now = DEFAULT_EXPIRY_MS + 1;
	asked_for_all(f, "abcd", now);
	assert_int_equal(policy_once_count(f->s), 4);
	asked_for_all(f, "ts", now + 1);
	assert_int_equal(policy_once_count(f->s), 4);
	/* "c" is read again while it waits. */
	policy_note_demand(f->s, policy_lookup(f->s, "c", 1));
	assert_int_equal(policy_once_count(f->s), 3);

	/* Cached keys first, then the demanded new one, then the rest. */
	assert_string_equal(next_batch(f, 1, now + 1), "t");
	assert_string_equal(next_batch(f, 2, now + 1), "sc");
	assert_string_equal(next_batch(f, 8, now + 1), "abd");

	/* Among new keys, the demanded ones go in the order they came due. */
	asked_for_all(f, "efg", now + 2);
	policy_note_demand(f->s, policy_lookup(f->s, "g", 1));
	policy_note_demand(f->s, policy_lookup(f->s, "e", 1));
	assert_string_equal(next_batch(f, 8, now + 2), "egf");
	assert_int_equal(policy_once_count(f->s), 0);
}

/* Cache each one-letter key at 0, and ask for it once it is stale. */
static void
stale_and_asked(SieveFixture *f, const char *keys, PolicyTime now)
{
	const char *k;

	for (k = keys; *k; k++)
		(void) policy_restore_complete(f->s, k, 1, 0, 10 * DEFAULT_EXPIRY_MS,
									   NULL, false, 0);
	asked_for_all(f, keys, now);
}

/*
 * Refetches of cached keys go first, but while new keys wait for their
 * turn, every POLICY_CACHED_RUN of them in a row are followed by one new
 * key's fetch, in batches of any size: refetches due faster than the
 * source answers (a short expiry) never leave a new key, or one evicted
 * and read again, unfetched; and new keys take at most a quarter of the
 * fetches from the cached ones.  With no new key waiting, cached keys
 * fill the batches.
 */
static void
test_fair_cached_leave_room(void **state)
{
	SieveFixture *f = *state;
	PolicyTime	now = DEFAULT_EXPIRY_MS + 1;

	assert_int_equal(POLICY_CACHED_RUN, 3);
	stale_and_asked(f, "stuvwxyz", now);
	asked_for_all(f, "abc", now);
	policy_note_demand(f->s, policy_lookup(f->s, "c", 1));
	assert_string_equal(next_batch(f, 4, now), "stuc");
	assert_string_equal(next_batch(f, 4, now), "vwxa");
	/* cached keys run out: the new ones go on */
	assert_string_equal(next_batch(f, 4, now), "yzb");
	assert_string_equal(next_batch(f, 4, now), "");

	/* Nothing new waits: the cached keys take every place. */
	stale_and_asked(f, "mnop", now);
	assert_string_equal(next_batch(f, 4, now), "mnop");

	/* One key a batch: three cached, one new, and so on. */
	stale_and_asked(f, "ijkl", now);
	asked_for_all(f, "d", now);
	assert_string_equal(next_batch(f, 1, now), "i");
	assert_string_equal(next_batch(f, 1, now), "j");
	assert_string_equal(next_batch(f, 1, now), "k");
	assert_string_equal(next_batch(f, 1, now), "d");
	assert_string_equal(next_batch(f, 1, now), "l");
	assert_string_equal(next_batch(f, 1, now), "");
}

/*
 * A key read once keeps that status through pending answers (its retries
 * still wait behind), and loses it when read again; a key back from the
 * ghost FIFO, or invalidated, never has it.
 */
static void
test_fair_fetch_classes(void **state)
{
	SieveFixture *f = *state;
	PolicyEntry *e;

	PolicyTime	when;
	int			i;

	asked_for_all(f, "a", 0);
	e = policy_lookup(f->s, "a", 1);
	for (i = 0; i < 2; i++)
	{
		assert_string_equal(next_batch(f, 1, 0), "a");
		assert_int_equal(policy_complete_fetch(f->s, e, POLICY_RESULT_PENDING,
											   NULL, 0),
						 POLICY_RESCHEDULED);
		assert_int_equal(policy_once_count(f->s), 1);
	}
	assert_true(e->has_fetch_when && e->fetch_when > 0);
	policy_note_demand(f->s, e);
	assert_int_equal(policy_once_count(f->s), 0);
	assert_true(e->demanded);
	/* The retry keeps its backoff: not due before its time. */
	assert_true(policy_peek(f->s, POLICY_QUEUE_DUE_NEW, &when));
	assert_int_equal(when, e->fetch_when);
	assert_string_equal(next_batch(f, 1, 0), "");
	assert_string_equal(next_batch(f, 1, e->fetch_when), "a");
	assert_int_equal(policy_complete_fetch(f->s, e, POLICY_RESULT_PENDING,
										   NULL, e->fetch_when),
					 POLICY_RESCHEDULED);
	assert_int_equal(policy_once_count(f->s), 0);	/* still demanded */

	/* Invalidated while it waits: due now, with priority. */
	asked_for_all(f, "b", 0);
	assert_int_equal(policy_once_count(f->s), 1);
	assert_null(policy_invalidate(f->s, "b", 1, 5));
	assert_int_equal(policy_once_count(f->s), 0);

	/* Dropped, then asked for again: remembered, so demanded at once. */
	asked_for_all(f, "c", 0);
	e = policy_once_excess(f->s, 0, true);
	assert_non_null(e);
	assert_true(entry_is_key(e, "c"));
	policy_evict_victim(f->s, e);
	assert_null(policy_once_excess(f->s, 0, true));
	assert_true(asked_for(f, "c"));
	assert_int_equal(policy_once_count(f->s), 0);
}

/*
 * Past the bound the oldest waiting keys read once go, oldest first; a key
 * promoted to the main FIFO by the eviction (read again) is demanded.
 */
static void
test_fair_fetch_bound(void **state)
{
	SieveFixture *f = *state;
	PolicyEntry *e;
	int			dropped = 0;

	asked_for_all(f, "abcdef", 0);
	asked_for_all(f, "g", 1);
	while ((e = policy_once_excess(f->s, 3, true)) != NULL)
	{
		f->buf[dropped++] = e->key[0];
		policy_evict_victim(f->s, e);
	}
	f->buf[dropped] = '\0';
	assert_string_equal(f->buf, "abcd");
	assert_int_equal(policy_once_count(f->s), 3);
	assert_int_equal(policy_count(f->s), 3);

	/* "e" read again: the eviction promotes it and so demands it. */
	visit(f, "e");
	assert_string_equal(sieve_evict(f), "f");
	assert_true(in_main(f, "e"));
	assert_true(policy_lookup(f->s, "e", 1)->demanded);
	assert_int_equal(policy_once_count(f->s), 1);
	assert_string_equal(next_batch(f, 8, 1), "eg");
}

/*
 * While memory is short, the bound drops no fetch as long as the small
 * FIFO's oldest key holds a value and is not being fetched: eviction takes
 * that one first, and a fetch asked for later may be waited for next (a
 * cold start on a cache holding keys nobody read again).  Once eviction
 * took the keys with values, the oldest waiting fetches go.  A key with a
 * value whose refresh is out counts for nothing: eviction passes it over.
 */
static void
test_fair_fetch_bound_behind_values(void **state)
{
	SieveFixture *f = *state;
	PolicyConfig config = {DEFAULT_EXPIRY_MS, DEFAULT_GRACE_MS, 0, 60000};
	PolicyEntry *e;

	cached(f, "xy");
	asked_for_all(f, "abcdef", 0);
	assert_int_equal(policy_once_count(f->s), 6);
	assert_null(policy_once_excess(f->s, 3, true));
	assert_string_equal(sieve_evict(f), "x");
	assert_null(policy_once_excess(f->s, 3, true));
	assert_string_equal(sieve_evict(f), "y");
	e = policy_once_excess(f->s, 3, true);
	assert_non_null(e);
	assert_true(entry_is_key(e, "a"));
	policy_evict_victim(f->s, e);
	assert_int_equal(policy_once_count(f->s), 5);

	/* The oldest key's refresh is out: not eviction's to take. */
	policy_destroy(f->s);
	f->s = policy_create(&config, malloc, free);
	cached(f, "z");
	asked_for_all(f, "ab", 0);
	assert_null(policy_once_excess(f->s, 0, true));
	assert_non_null(policy_try_begin_fetch(f->s, "z", 1, true,
										   DEFAULT_EXPIRY_MS + 1));
	assert_string_equal(next_batch(f, 1, DEFAULT_EXPIRY_MS + 1), "z");
	e = policy_once_excess(f->s, 0, true);
	assert_non_null(e);
	assert_true(entry_is_key(e, "a"));
	assert_null(policy_once_excess(f->s, 0, false));
}

/* ----------------------------------------------------------------
 * Fair fetching across roles: turns, takeover, backoff, the bound
 * ----------------------------------------------------------------
 */

/* A role that asks for one key while others flood. */
#define LEGIT_ROLE 1000

/* Ask for key as role, read once or demanded; the key's entry. */
static PolicyEntry *
role_asks(Policy *s, uint32_t role, const char *key, bool demanded,
		  PolicyTime now)
{
	PolicyEntry *e;

	(void) policy_try_begin_fetch(s, key, strlen(key), false, now);
	e = policy_lookup(s, key, strlen(key));
	assert_non_null(e);
	policy_set_flow(s, e, role);
	if (demanded)
		policy_note_demand(s, e);
	return e;
}

/* Complete a dispatched fetch with a value. */
static void
fetched(Policy *s, PolicyEntry *e, PolicyTime now)
{
	assert_true(e->dispatched);
	assert_int_equal(policy_complete_fetch(s, e, POLICY_RESULT_VALUE, NULL,
										   now),
					 POLICY_DONE);
}

typedef struct TurnCase
{
	int			roles;			/* flooding roles */
	int			flood;			/* new keys each asks for */
	int			batch_size;
	bool		demanded;		/* their keys read twice, or once */
	bool		legit_demanded; /* the other role's key, waited for */
} TurnCase;

/*
 * Several roles each ask for many new keys, then another role for one.
 * Every batch takes the flooding roles' keys in turns (no role has more
 * than one key more than another in any batch while both have keys
 * left), each role's in the order it asked, and the other role's key in
 * the first round after it asked: among the first roles + 1 fetches,
 * whether the floods' keys are demanded or read once, and its own.
 */
static void
test_fair_turns_table(void **state)
{
	static const TurnCase cases[] = {
		{1, 1, 1, true, true},
		{1, 100, 1, true, false},
		{1, 10000, 500, true, true},
		{1, 10000, 500, true, false},
		{3, 100, 7, false, false},
		{3, 100, 7, true, false},
		{3, 10000, 500, true, true},
		{3, 10000, 1, false, true},
		{7, 1000, 7, true, false},
		{7, 1000, 500, false, false},
		{7, 10000, 500, true, true},
		{2, 5, 500, true, false},
	};
	PolicyConfig config = {DEFAULT_EXPIRY_MS, DEFAULT_GRACE_MS, 0, 60000};
	size_t		c;

	(void) state;
	for (c = 0; c < sizeof(cases) / sizeof(cases[0]); c++)
	{
		const TurnCase *tc = &cases[c];
		Policy	   *s = policy_create(&config, malloc, free);
		int		   *next = calloc(tc->roles, sizeof(int));
		int			total = tc->roles * tc->flood + 1;
		int			done = 0;
		int			legit_at = -1;
		char		key[KEY_MAX];
		PolicyEntry **batch;
		int			n;
		int			r;
		int			i;

		for (i = 0; i < tc->flood; i++)
			for (r = 0; r < tc->roles; r++)
			{
				snprintf(key, sizeof(key), "r%d-%d", r, i);
				(void) role_asks(s, (uint32_t) r + 1, key, tc->demanded, 0);
			}
		(void) role_asks(s, LEGIT_ROLE, "legit", tc->legit_demanded, 0);
		assert_int_equal(policy_flow_count(s), tc->roles + 1);
		assert_int_equal(policy_flow_waiting(s, LEGIT_ROLE), 1);

		while ((n = policy_ready_batch(s, 0, tc->batch_size, 0, &batch)) > 0)
		{
			int		   *in_batch = calloc(tc->roles, sizeof(int));
			int			most = 0;
			int			least = tc->batch_size;

			for (i = 0; i < n; i++)
			{
				PolicyEntry *e = batch[i];
				int			k;

				assert_true(e->keylen < sizeof(key));
				memcpy(key, e->key, e->keylen);
				key[e->keylen] = '\0';
				if (e->flow == LEGIT_ROLE)
				{
					assert_true(entry_is_key(e, "legit"));
					legit_at = done + i;
				}
				else
				{
					/* each role's keys in the order it asked */
					r = (int) e->flow - 1;
					assert_int_equal(sscanf(key, "r%*d-%d", &k), 1);
					assert_int_equal(k, next[r]);
					next[r]++;
					in_batch[r]++;
				}
			}
			/* turns: roles with keys left got shares one apart at most */
			for (r = 0; r < tc->roles; r++)
				if (next[r] < tc->flood)
				{
					most = in_batch[r] > most ? in_batch[r] : most;
					least = in_batch[r] < least ? in_batch[r] : least;
				}
			if (most > 0)
				assert_true(most - least <= 1);
			for (i = 0; i < n; i++)
				fetched(s, batch[i], 0);
			done += n;
			free(in_batch);
		}
		assert_int_equal(done, total);
		assert_in_range(legit_at, 0, tc->roles);
		assert_int_equal(policy_flow_count(s), 0);
		assert_int_equal(policy_once_count(s), 0);
		free(next);
		policy_destroy(s);
	}
}

/*
 * A key one role asked for among many, asked for by another role with few
 * waiting, waits for the second role's turn; asked for again by the first
 * (which has more waiting), it stays.  A key not waiting keeps its role.
 */
static void
test_fair_takeover(void **state)
{
	SieveFixture *f = *state;
	char		key[KEY_MAX];
	PolicyEntry **batch;
	PolicyEntry *e;
	int			i;

	for (i = 0; i < 100; i++)
	{
		snprintf(key, sizeof(key), "atk%d", i);
		(void) role_asks(f->s, 1, key, true, 0);
	}
	/* the flood also asked first for the other role's key */
	e = role_asks(f->s, 1, "legit7", false, 0);
	assert_int_equal(e->flow, 1);
	assert_int_equal(policy_flow_waiting(f->s, 1), 101);
	policy_set_flow(f->s, e, LEGIT_ROLE);
	assert_int_equal(e->flow, LEGIT_ROLE);
	assert_int_equal(policy_flow_waiting(f->s, 1), 100);
	policy_set_flow(f->s, e, 1);
	assert_int_equal(e->flow, LEGIT_ROLE);

	/* one key each way: nothing to gain, nothing moves */
	e = role_asks(f->s, 2, "solo", false, 0);
	policy_set_flow(f->s, e, 3);
	assert_int_equal(e->flow, 2);

	/* legit7 goes in the first round, "solo" in the same */
	assert_int_equal(policy_ready_batch(f->s, 0, 3, 0, &batch), 3);
	assert_true(entry_is_key(batch[0], "atk0"));
	assert_true(entry_is_key(batch[1], "legit7"));
	assert_true(entry_is_key(batch[2], "solo"));
	assert_int_equal(policy_flow_waiting(f->s, LEGIT_ROLE), 0);
	assert_int_equal(policy_flow_waiting(f->s, 2), 0);
	assert_int_equal(policy_flow_waiting(f->s, 1), 99);
}

/*
 * A key waiting out its backoff takes no turn: its role's turns go to its
 * other keys, and when it is due it waits for its role's turn again, at
 * the end of the round under way, its class kept.
 */
static void
test_fair_backoff(void **state)
{
	SieveFixture *f = *state;
	PolicyEntry *b;
	PolicyTime	due;

	b = role_asks(f->s, 2, "b", true, 0);
	(void) role_asks(f->s, 1, "a", true, 0);
	assert_string_equal(next_batch(f, 1, 0), "b");
	/* b pending: its first retry is due at once, after a's turn */
	assert_int_equal(policy_complete_fetch(f->s, b, POLICY_RESULT_PENDING,
										   NULL, 0), POLICY_RESCHEDULED);
	assert_string_equal(next_batch(f, 1, 0), "a");
	fetched(f->s, policy_lookup(f->s, "a", 1), 0);
	assert_string_equal(next_batch(f, 1, 0), "b");
	/* pending again: the second retry waits 1 s, in no turn */
	assert_int_equal(policy_complete_fetch(f->s, b, POLICY_RESULT_PENDING,
										   NULL, 0), POLICY_RESCHEDULED);
	due = b->fetch_when;
	assert_true(due > 0);
	assert_int_equal(policy_flow_waiting(f->s, 2), 0);
	assert_int_equal(policy_flow_count(f->s), 0);

	/* role 1 asks for more; until b is due, role 1 has every turn */
	(void) role_asks(f->s, 1, "c", true, 1);
	(void) role_asks(f->s, 1, "d", true, 1);
	assert_string_equal(next_batch(f, 1, due - 1), "c");
	/* at its due time b waits for role 2's turn, demanded still */
	(void) role_asks(f->s, 1, "e", true, due);
	assert_string_equal(next_batch(f, 3, due), "dbe");
	assert_true(b->demanded);
	assert_int_equal(policy_flow_count(f->s), 0);
}

/*
 * Other ways out of a turn: an invalidation makes the fetch due with
 * priority (the key had a value), an eviction drops it, and a restart's
 * resumed backoff sends it back to wait for its due time.
 */
static void
test_fair_leave_turn(void **state)
{
	SieveFixture *f = *state;
	PolicyEntry *e;
	PolicyTime	when;

	(void) role_asks(f->s, 1, "a", false, 0);
	(void) role_asks(f->s, 2, "b", false, 0);
	e = role_asks(f->s, 3, "c", true, 0);
	assert_int_equal(policy_flow_count(f->s), 3);
	assert_null(policy_invalidate(f->s, "a", 1, 0));
	assert_int_equal(policy_flow_count(f->s), 2);
	assert_true(policy_peek(f->s, POLICY_QUEUE_DUE, &when));
	assert_int_equal(policy_request_evict(f->s, "b", 1), POLICY_EVICT_NOW);
	assert_int_equal(policy_flow_count(f->s), 1);
	policy_resume_backoff(f->s, e, 3, 10);
	assert_int_equal(policy_flow_count(f->s), 0);
	assert_true(policy_peek(f->s, POLICY_QUEUE_DUE_NEW, &when));
	assert_int_equal(when, e->fetch_when);
	assert_string_equal(next_batch(f, 3, 10), "a");
	assert_string_equal(next_batch(f, 3, e->fetch_when), "c");
}

typedef struct OnceBoundCase
{
	int			flood;			/* keys read once, of the flooding role */
	int			legit;			/* of another role, asked for first */
	size_t		limit;
	bool		memory_short;	/* else memory has room: nothing goes */
} OnceBoundCase;

/*
 * While memory is short, past the bound of due keys read once, the role
 * with the most waiting loses its first ones: another role's keys go only
 * once the flooding role has no more than it, and then turn by turn.
 * While memory has room, none goes, however many wait (a cold start).
 */
static void
test_fair_once_bound_table(void **state)
{
	static const OnceBoundCase cases[] = {
		{10, 2, 5, true},
		{1000, 3, 16, true},
		{5, 2, 0, true},
		{20000, 1, 8000, true},
		{3, 3, 4, true},
		{10, 2, 5, false},
		{20000, 1, 8000, false},
		{5, 2, 0, false},
	};
	PolicyConfig config = {DEFAULT_EXPIRY_MS, DEFAULT_GRACE_MS, 0, 60000};
	size_t		c;

	(void) state;
	for (c = 0; c < sizeof(cases) / sizeof(cases[0]); c++)
	{
		const OnceBoundCase *oc = &cases[c];
		Policy	   *s = policy_create(&config, malloc, free);
		char		key[KEY_MAX];
		int			flood_left = oc->flood;
		int			legit_left = oc->legit;
		int			next_flood = 0;
		PolicyEntry *e;
		int			i;
		size_t		kept;

		for (i = 0; i < oc->legit; i++)
		{
			snprintf(key, sizeof(key), "legit%d", i);
			(void) role_asks(s, LEGIT_ROLE, key, false, 0);
		}
		for (i = 0; i < oc->flood; i++)
		{
			snprintf(key, sizeof(key), "atk%d", i);
			(void) role_asks(s, 1, key, false, 0);
		}
		while ((e = policy_once_excess(s, oc->limit,
									   oc->memory_short)) != NULL)
		{
			if (e->flow == 1)
			{
				/* the flood's first keys first */
				snprintf(key, sizeof(key), "atk%d", next_flood++);
				assert_true(entry_is_key(e, key));
				assert_true(flood_left >= legit_left);
				flood_left--;
			}
			else
			{
				assert_int_equal(e->flow, LEGIT_ROLE);
				assert_true(legit_left >= flood_left);
				legit_left--;
			}
			policy_evict_victim(s, e);
		}
		kept = (size_t) (oc->flood + oc->legit);
		if (oc->memory_short && oc->limit < kept)
			kept = oc->limit;
		assert_int_equal(flood_left + legit_left, (int) kept);
		if ((size_t) oc->legit * 2 <= oc->limit || !oc->memory_short)
			assert_int_equal(legit_left, oc->legit);
		assert_int_equal(policy_once_count(s), flood_left + legit_left);
		policy_destroy(s);
	}
}

/*
 * Keys per owner: victims are the owner's oldest keys; one read since
 * looked at, or being fetched, gets a second chance; other owners' keys,
 * and keys of no owner, are never its victims.  An evicted key leaves
 * its owner's count.
 */
static void
test_owner_victims(void **state)
{
	SieveFixture *f = *state;
	PolicyEntry **batch;
	char		key[KEY_MAX];
	int			i;

	cached(f, "abcdefgh");
	for (i = 0; i < 8; i++)
	{
		key[0] = (char) ('a' + i);
		policy_set_owner(f->s, policy_lookup(f->s, key, 1),
						 i < 5 ? 7 : (i < 7 ? 9 : 0));
	}
	assert_int_equal(policy_owner_count(f->s, 7), 5);
	assert_int_equal(policy_owner_count(f->s, 9), 2);
	assert_int_equal(policy_owner_count(f->s, 0), 0);

	visit(f, "a");
	/* b being fetched */
	(void) policy_invalidate(f->s, "b", 1, 0);
	assert_int_equal(policy_ready_batch(f->s, 0, 1, 0, &batch), 1);
	assert_true(entry_is_key(batch[0], "b"));

	strcpy(f->buf, "");
	{
		PolicyEntry *e = policy_owner_victim(f->s, 7, test_and_clear, &f->v);

		assert_true(entry_is_key(e, "c"));
		policy_evict_victim(f->s, e);
	}
	assert_int_equal(policy_owner_count(f->s, 7), 4);
	assert_true(entry_is_key(policy_owner_victim(f->s, 7, test_and_clear,
												 &f->v), "d"));
	assert_true(entry_is_key(policy_owner_victim(f->s, 9, test_and_clear,
												 &f->v), "f"));
	assert_null(policy_owner_victim(f->s, 0, test_and_clear, &f->v));
	assert_null(policy_owner_victim(f->s, 5, test_and_clear, &f->v));

	/* one owner's keys, all being fetched or spared: no victim */
	assert_int_equal(policy_request_evict(f->s, "d", 1), POLICY_EVICT_NOW);
	assert_int_equal(policy_request_evict(f->s, "e", 1), POLICY_EVICT_NOW);
	/* a's mark was taken at the first look: a goes now */
	assert_true(entry_is_key(policy_owner_victim(f->s, 7, test_and_clear,
												 &f->v), "a"));
	assert_int_equal(policy_request_evict(f->s, "a", 1), POLICY_EVICT_NOW);
	assert_int_equal(policy_owner_count(f->s, 7), 1);
	assert_null(policy_owner_victim(f->s, 7, test_and_clear, &f->v));

	/* a new owner takes the key over */
	policy_set_owner(f->s, policy_lookup(f->s, "g", 1), 7);
	assert_int_equal(policy_owner_count(f->s, 9), 1);
	assert_int_equal(policy_owner_count(f->s, 7), 2);
	assert_true(entry_is_key(policy_owner_victim(f->s, 7, test_and_clear,
												 &f->v), "g"));
}

/*
 * Pools (policy_set_pool_fn): keys 'a'..'m' are pool 0's, 'n'..'z' pool
 * 1's, digits pool 2's.
 */
static int
letter_pool(const char *key, size_t keylen, void *arg)
{
	(void) keylen;
	(void) arg;
	if (key[0] >= 'n' && key[0] <= 'z')
		return 1;
	if (key[0] >= '0' && key[0] <= '9')
		return 2;
	return 0;
}

/*
 * Eviction for memory takes its victims from the pool it is given only,
 * whatever was read: a pool that fills up never evicts another's keys.
 * Each row caches keys (oldest first), marks some read, and evicts from
 * one pool until nothing is left there.
 */
static void
test_pools_table(void **state)
{
	static const struct
	{
		const char *keys;
		const char *visited;
		int			pool;
		size_t		victims;
	}			rows[] = {
		{"abcxyz12", "", 0, 3},
		{"abcxyz12", "ax1", 0, 3},
		{"abcxyz12", "abc", 1, 3},
		{"axbycz", "xyz", 1, 3},
		{"1a2b3x", "123", 2, 3},
		{"abcdef", "", 1, 0},
		{"nopq", "np", 0, 0},
	};

	(void) state;
	for (size_t r = 0; r < sizeof(rows) / sizeof(rows[0]); r++)
	{
		PolicyConfig config = {DEFAULT_EXPIRY_MS, DEFAULT_GRACE_MS, 0, 60000};
		SieveFixture f = {0};
		size_t		before[3];
		size_t		evicted = 0;
		char		order[32];

		f.s = policy_create(&config, malloc, free);
		policy_set_pool_fn(f.s, letter_pool, NULL);
		cached(&f, rows[r].keys);
		for (const char *k = rows[r].visited; *k; k++)
		{
			char		key[2] = {*k, '\0'};

			visit(&f, key);
		}
		for (int p = 0; p < 3; p++)
			before[p] = policy_pool_count(f.s, p);
		assert_int_equal(before[0] + before[1] + before[2],
						 strlen(rows[r].keys));
		/* the dump's walk still sees every key of every pool */
		keep_order(f.s, order);
		assert_int_equal(strlen(order), strlen(rows[r].keys));

		for (;;)
		{
			PolicyEntry *e = policy_memory_victim(f.s, rows[r].pool,
												  test_and_clear, &f.v);

			if (e == NULL)
				break;
			assert_int_equal(letter_pool(e->key, e->keylen, NULL),
							 rows[r].pool);
			policy_evict_victim(f.s, e);
			evicted++;
		}
		assert_int_equal(evicted, rows[r].victims);
		for (int p = 0; p < 3; p++)
			assert_int_equal(policy_pool_count(f.s, p),
							 p == rows[r].pool ? 0 : before[p]);
		policy_destroy(f.s);
	}
}

/*
 * What a pool's keys weigh is the pool's alone, and a key evicted and
 * known again (back from the ghost FIFO) is in its pool again.
 */
static void
test_pools_bytes(void **state)
{
	SieveFixture *f = *state;
	PolicyEntry *e;

	policy_set_pool_fn(f->s, letter_pool, NULL);
	cached(f, "ax1");
	policy_set_bytes(f->s, policy_lookup(f->s, "x", 1), 4000);
	policy_set_bytes(f->s, policy_lookup(f->s, "a", 1), 100);
	assert_int_equal(policy_pool_bytes(f->s, 0), 100);
	assert_int_equal(policy_pool_bytes(f->s, 1), 4000);
	assert_int_equal(policy_pool_bytes(f->s, 2), 1);

	e = policy_memory_victim(f->s, 1, test_and_clear, &f->v);
	assert_non_null(e);
	assert_memory_equal(e->key, "x", 1);
	policy_evict_victim(f->s, e);
	assert_int_equal(policy_pool_bytes(f->s, 1), 0);
	assert_int_equal(policy_pool_bytes(f->s, 0), 100);

	cached(f, "x");
	e = policy_lookup(f->s, "x", 1);
	assert_int_equal(e->pool, 1);
	assert_true(e->in_main);	/* back from the ghost FIFO */
	assert_int_equal(policy_pool_count(f->s, 1), 1);
	assert_int_equal(policy_pool_count(f->s, 0), 1);
}

/*
 * Dispatch the n keys due at now, in one batch, and complete each with
 * answer; what the last completion said.
 */
static PolicyCompletion
complete_all(Store *st, int n, Answer answer, PolicyTime now)
{
	PolicyEntry **batch = NULL;
	PolicyEntry *taken[8];
	PolicyCompletion last = POLICY_DONE;

	assert_int_equal(policy_ready_batch(st->policy, now, DISPATCH_BATCH_SIZE, 0,
										&batch), n);
	memcpy(taken, batch, n * sizeof(PolicyEntry *));
	for (int i = 0; i < n; i++)
		last = complete(st, taken[i], answer, now);
	return last;
}

/*
 * A pool's own max_retry_backoff and refresh_interval
 * (policy_set_pool_config) apply to its keys only.  Each row: the pool's
 * own settings (-1: the config's, 60 s backoff and no refresh) and the
 * delays its key waits after consecutive failures, beside a pool 0 key
 * that keeps the config's.
 */
static void
test_pool_config_table(void **state)
{
	static const struct
	{
		int64_t		backoff;
		int64_t		refresh;
		int64_t		delays[4];
	}			rows[] = {
		{-1, -1, {0, 1000, 1500, 2250}},
		{1500, -1, {0, 1000, 1500, 1500}},
		{500, 7000, {0, 500, 500, 500}},
		{-1, 7000, {0, 1000, 1500, 2250}},
	};

	(void) state;
	for (size_t r = 0; r < sizeof(rows) / sizeof(rows[0]); r++)
	{
		Store		st;
		PolicyTime	now = 0;
		PolicyEntry *e;

		store_init_full(&st, 5000, 5000, 0, 60000);
		policy_set_pool_fn(st.policy, letter_pool, NULL);
		policy_set_pool_config(st.policy, 1, rows[r].backoff, rows[r].refresh);
		assert_non_null(begin_fetch(&st, "x", now));
		assert_non_null(begin_fetch(&st, "a", now));
		assert_int_equal(lookup(&st, "x")->pool, 1);
		for (int i = 0; i < 4; i++)
		{
			static const int64_t config_delays[] = {0, 1000, 1500, 2250};
			PolicyEntry *x;
			PolicyEntry *a;

			assert_int_equal(complete_all(&st, 2, ANSWER_PENDING, now),
							 POLICY_RESCHEDULED);
			x = in_progress(&st, "x");
			a = in_progress(&st, "a");
			assert_int_equal(x->has_fetch_when ? x->fetch_when - now : 0,
							 rows[r].delays[i]);
			assert_int_equal(a->has_fetch_when ? a->fetch_when - now : 0,
							 config_delays[i]);
			now += 3000;
		}
		/* A value: the pool's refresh is scheduled, the config's is none. */
		assert_int_equal(complete_all(&st, 2, ANSWER_ENABLED, now),
						 POLICY_DONE);
		e = lookup(&st, "x");
		if (rows[r].refresh > 0)
			assert_true(e->heap_pos[POLICY_QUEUE_REFRESH] >= 0);
		else
			assert_true(e->heap_pos[POLICY_QUEUE_REFRESH] < 0);
		assert_true(lookup(&st, "a")->heap_pos[POLICY_QUEUE_REFRESH] < 0);
		store_free(&st);
	}
}

/*
 * A changed expiry or grace period applies to keys already cached: each
 * eviction moves by the difference (raising expiry must not leave keys
 * evicted on the old schedule while they read as fresh).
 */
static void
test_expiry_change_moves_evictions(void **state)
{
	Store		st;
	PolicyConfig config;
	PolicyTime	when;

	(void) state;
	store_init(&st, 1000, 500, 0);
	(void) policy_restore_complete(st.policy, "a", 1, 0, 1500, NULL, false, 0);
	(void) policy_restore_complete(st.policy, "b", 1, 100, 1600, NULL, false, 0);

	config = *policy_config(st.policy);
	config.expiry_ms = 5000;
	assert_int_equal(policy_set_config(st.policy, &config), 2);
	assert_true(policy_peek(st.policy, POLICY_QUEUE_EVICT, &when));
	assert_int_equal(when, 5500);
	assert_int_equal(lookup(&st, "b")->expiry, 5600);
	assert_null(policy_pop_eviction(st.policy, 1600));
	assert_true(entry_is_key(policy_pop_eviction(st.policy, 5500), "a"));

	/* lowered: due at once */
	config.expiry_ms = 100;
	config.grace_period_ms = 0;
	assert_int_equal(policy_set_config(st.policy, &config), 2);
	assert_true(entry_is_key(policy_pop_eviction(st.policy, 300), "b"));

	/* unchanged: nothing moves */
	assert_int_equal(policy_set_config(st.policy, &config), 0);
	store_free(&st);
}

/* ----------------------------------------------------------------
 * Periods per key: max_age and stale_for from the source
 * ----------------------------------------------------------------
 */

/* Fetch key and complete it with a value and these periods (-1: default). */
static PolicyEntry *
fetch_with_periods(Store *st, const char *key, int64_t max_age_ms,
				   int64_t stale_for_ms, PolicyTime now)
{
	PolicyPeriods periods = {max_age_ms, stale_for_ms};
	PolicyEntry *e;

	(void) begin_fetch(st, key, now);
	e = dispatch(st, key, now);
	assert_int_equal(complete_periods(st, e, ANSWER_ENABLED, &periods, now),
					 POLICY_DONE);
	return lookup(st, key);
}

static void
test_period_helpers(void **state)
{
	(void) state;
	assert_int_equal(policy_period(POLICY_PERIOD_DEFAULT, 300000), 300000);
	assert_int_equal(policy_period(0, 300000), 0);
	assert_int_equal(policy_period(1500, 300000), 1500);
}

/*
 * Fresh below the key's own max_age, stale for its own stale_for, then
 * expired; evicted at the end of both; the configuration's are not used.
 */
static void
test_periods_freshness_and_eviction(void **state)
{
	Store		st;
	PolicyEntry *e;
	PolicyTime	when;

	(void) state;
	store_init(&st, 5000, 5000, 0);

	e = fetch_with_periods(&st, KEY1, 1000, 2000, 0);
	assert_int_equal(e->max_age_ms, 1000);
	assert_int_equal(e->stale_for_ms, 2000);
	assert_int_equal(policy_max_age(st.policy, e), 1000);
	assert_int_equal(policy_stale_for(st.policy, e), 2000);
	assert_true(e->has_expiry);
	assert_int_equal(e->expiry, 3000);
	assert_true(policy_peek(st.policy, POLICY_QUEUE_EVICT, &when));
	assert_int_equal(when, 3000);

	/* fresh at 999 ms: no fetch; stale at 1,000 ms (not 5,000): fetched */
	assert_null(begin_fetch(&st, KEY1, 999));
	assert_non_null(begin_fetch(&st, KEY1, 1000));
	/* this time the source gives none: the configuration's apply again */
	assert_int_equal(dispatch_and_complete(&st, KEY1, ANSWER_ENABLED, 1000),
					 POLICY_DONE);
	e = lookup(&st, KEY1);
	assert_int_equal(e->max_age_ms, POLICY_PERIOD_DEFAULT);
	assert_int_equal(e->stale_for_ms, POLICY_PERIOD_DEFAULT);
	assert_int_equal(e->expiry, 11000);
	assert_null(begin_fetch(&st, KEY1, 5999));

	/* expired at the end of its periods, and evicted then */
	e = fetch_with_periods(&st, KEY2, 100, 200, 0);
	assert_int_equal(policy_freshness(e->last_fetch, 299,
									  policy_max_age(st.policy, e),
									  policy_stale_for(st.policy, e)),
					 POLICY_STALE);
	assert_int_equal(policy_freshness(e->last_fetch, 300,
									  policy_max_age(st.policy, e),
									  policy_stale_for(st.policy, e)),
					 POLICY_EXPIRED);
	assert_null(policy_pop_eviction(st.policy, 299));
	e = policy_pop_eviction(st.policy, 300);
	assert_non_null(e);
	assert_true(entry_is_key(e, KEY2));
	store_free(&st);
}

/* One period of its own: the other is the configuration's. */
static void
test_periods_one_own(void **state)
{
	Store		st;
	PolicyEntry *e;

	(void) state;
	store_init(&st, 5000, 5000, 0);
	e = fetch_with_periods(&st, KEY1, 1000, POLICY_PERIOD_DEFAULT, 0);
	assert_int_equal(policy_stale_for(st.policy, e), 5000);
	assert_int_equal(e->expiry, 6000);
	e = fetch_with_periods(&st, KEY2, POLICY_PERIOD_DEFAULT, 0, 0);
	assert_int_equal(policy_max_age(st.policy, e), 5000);
	assert_int_equal(e->expiry, 5000);
	/* max_age 0: stale at once, so every request fetches it */
	e = fetch_with_periods(&st, KEY3, 0, 1000, 0);
	assert_non_null(begin_fetch(&st, KEY3, 0));
	store_free(&st);
}

/*
 * A pending or failed attempt keeps the key's periods; not_modified takes
 * the new ones; a refresh takes them too but does not move the eviction.
 */
static void
test_periods_pending_not_modified_refresh(void **state)
{
	Store		st;
	PolicyEntry *e;
	PolicyPeriods shorter = {500, 500};
	PolicyPeriods longer = {8000, 1000};
	PolicyConfig config;

	(void) state;
	store_init(&st, 5000, 5000, 0);
	e = fetch_with_periods(&st, KEY1, 1000, 2000, 0);

	assert_non_null(begin_fetch(&st, KEY1, 1500));
	e = dispatch(&st, KEY1, 1500);
	assert_int_equal(complete_periods(&st, e, ANSWER_PENDING, &shorter, 1500),
					 POLICY_RESCHEDULED);
	assert_int_equal(e->max_age_ms, 1000);
	assert_int_equal(e->stale_for_ms, 2000);

	e = dispatch(&st, KEY1, 1500);	/* the first retry is immediate */
	assert_int_equal(complete_periods(&st, e, ANSWER_NOT_MODIFIED, &shorter,
									  1500), POLICY_DONE);
	assert_int_equal(e->max_age_ms, 500);
	assert_int_equal(e->expiry, 2500);

	/* a refresh (valid for 500 / 500: 700 ms) takes new periods only */
	config = *policy_config(st.policy);
	config.refresh_interval_ms = 700;
	(void) policy_set_config(st.policy, &config);
	assert_non_null(refresh_key(&st, KEY1, 2200));
	e = dispatch(&st, KEY1, 2200);
	assert_int_equal(complete_periods(&st, e, ANSWER_ENABLED, &longer, 2200),
					 POLICY_DONE);
	assert_int_equal(e->max_age_ms, 8000);
	assert_int_equal(e->expiry, 2500);	/* not pushed */
	store_free(&st);
}

/*
 * refresh_interval keeps its rule, against each key's own periods: it is
 * honoured for a key whose periods it lies strictly between, whatever the
 * configuration's, and a key whose new periods exclude it loses its
 * scheduled refresh.
 */
static void
test_periods_refresh_rule(void **state)
{
	PolicyConfig config = {5000, 5000, 2500, DEFAULT_MAX_BACKOFF_MS};
	Store		st;
	PolicyEntry *e;
	PolicyTime	when;

	(void) state;

	/*
	 * 2,500 ms is outside (5 s, 10 s): no key following the settings
	 * refreshes
	 */
	st.policy = policy_create(&config, malloc, free);
	st.shared = calloc(1, sizeof(FakeShared));
	assert_non_null(st.shared);

	e = fetch_with_periods(&st, KEY1, POLICY_PERIOD_DEFAULT,
						   POLICY_PERIOD_DEFAULT, 0);
	assert_int_equal(e->heap_pos[POLICY_QUEUE_REFRESH], -1);

	/* (1 s, 3 s) holds it */
	e = fetch_with_periods(&st, KEY2, 1000, 2000, 0);
	assert_true(policy_peek(st.policy, POLICY_QUEUE_REFRESH, &when));
	assert_int_equal(when, 2500);
	/* bounds are strict, as for the settings */
	e = fetch_with_periods(&st, KEY3, 2500, 1000, 0);
	assert_int_equal(e->heap_pos[POLICY_QUEUE_REFRESH], -1);
	e = fetch_with_periods(&st, "k4", 1000, 1500, 0);
	assert_int_equal(e->heap_pos[POLICY_QUEUE_REFRESH], -1);

	/* KEY2 refreshes at 2.5 s, by itself */
	e = policy_pop_refresh(st.policy, 2500);
	assert_non_null(e);
	assert_true(entry_is_key(e, KEY2));
	assert_non_null(refresh_key(&st, KEY2, 2500));
	e = dispatch(&st, KEY2, 2500);

	/*
	 * its source now says 10 s fresh: 2.5 s no longer fits, none is scheduled
	 */
	{
		PolicyPeriods p = {10000, 1000};

		assert_int_equal(complete_periods(&st, e, ANSWER_ENABLED, &p, 2500),
						 POLICY_DONE);
	}
	assert_int_equal(e->heap_pos[POLICY_QUEUE_REFRESH], -1);
	assert_false(policy_peek(st.policy, POLICY_QUEUE_REFRESH, &when));
	store_free(&st);
}

/*
 * A new expiry or grace period moves the eviction of keys that follow it,
 * not of those with periods of their own; a key with one own period moves
 * by the change of the other.
 */
static void
test_periods_config_change(void **state)
{
	Store		st;
	PolicyConfig config;
	PolicyPeriods both = {100, 100};
	PolicyPeriods age_only = {100, POLICY_PERIOD_DEFAULT};

	(void) state;
	store_init(&st, 1000, 500, 0);
	(void) policy_restore_complete(st.policy, "own", 3, 0, 200, &both, false, 0);
	(void) policy_restore_complete(st.policy, "age", 3, 0, 600, &age_only,
								   false, 0);
	(void) policy_restore_complete(st.policy, "cfg", 3, 0, 1500, NULL, false, 0);

	config = *policy_config(st.policy);
	config.expiry_ms = 5000;
	assert_int_equal(policy_set_config(st.policy, &config), 1);
	assert_int_equal(lookup(&st, "own")->expiry, 200);
	assert_int_equal(lookup(&st, "age")->expiry, 600);
	assert_int_equal(lookup(&st, "cfg")->expiry, 5500);

	config.grace_period_ms = 1500;
	assert_int_equal(policy_set_config(st.policy, &config), 2);
	assert_int_equal(lookup(&st, "own")->expiry, 200);
	assert_int_equal(lookup(&st, "age")->expiry, 1600);
	assert_int_equal(lookup(&st, "cfg")->expiry, 6500);

	/* freshness of a restored key follows its restored periods */
	assert_null(begin_fetch(&st, "own", 99));
	assert_non_null(begin_fetch(&st, "own", 100));
	store_free(&st);
}

#define NW POLICY_ROOM_NO_WRITER
#define FITS POLICY_ROOM_FITS
#define REFUSED POLICY_ROOM_REFUSED
#define TOO_LARGE POLICY_ROOM_TOO_LARGE

/*
 * Who pays for room (policy_room_payer), per setting: three pools, the
 * default cache's (0, no budget) and two named caches', with or without a
 * budget; target 1000 bytes.  A cache with a budget pays for its own
 * writes only, and a write larger than its budget never fits; the pools
 * without one pay from the largest of them, never from a budget within it.
 */
static void
test_room_payer_table(void **state)
{
	static const struct
	{
		const char *name;
		size_t		bytes[3];
		size_t		budget[3];
		bool		can_give[3];
		int			writer;
		size_t		need;
		size_t		freed;
		size_t		used;		/* 0: what the pools weigh (no overhead) */
		int			payer;
	}			rows[] = {
		/* the issue's: the default cache near its share, a budgeted write */
		{"budgeted write past its budget: it pays",
		{690, 290, 0}, {0, 300, 0}, {true, true, false}, 1, 200, 10, 0, 1},
		{"budgeted rewrite within budget, past the target, nobody over: it pays",
		{650, 250, 0}, {0, 300, 0}, {true, true, false}, 1, 120, 80, 0, 1},
		{"budgeted write within budget and target: fits",
		{690, 100, 0}, {0, 300, 0}, {true, true, false}, 1, 100, 0, 0, FITS},
		{"budgeted write larger than its budget: too large",
		{100, 0, 0}, {0, 300, 0}, {true, false, false}, 1, 301, 1, 0, TOO_LARGE},
		{"budgeted write exactly its budget, pool empty: fits",
		{100, 0, 0}, {0, 300, 0}, {true, false, false}, 1, 300, 0, 0, FITS},
		{"budgeted write past budget, nothing of its own to give: refused",
		{100, 290, 0}, {0, 300, 0}, {true, false, false}, 1, 100, 5, 0, REFUSED},
		{"budgeted rewrite of a key: its old chunk is freed: fits",
		{100, 290, 0}, {0, 300, 0}, {true, true, false}, 1, 200, 200, 0, FITS},
		{"budgeted write, default took reserved memory: default gives back",
		{750, 240, 0}, {0, 300, 0}, {true, true, false}, 1, 50, 0, 0, 0},
		{"budgeted write, another cache over its budget gives back first",
		{480, 200, 290}, {0, 300, 200}, {true, true, true}, 1, 60, 0, 0, 2},
		{"default write past its share: default pays",
		{700, 100, 0}, {0, 300, 0}, {true, true, false}, 0, 20, 1, 0, 0},
		{"default write past its share, only a budgeted cache could: refused",
		{700, 300, 0}, {0, 300, 0}, {false, true, false}, 0, 20, 1, 0, REFUSED},
		{"default write, two pools without a budget: the largest pays",
		{400, 500, 0}, {0, 0, 0}, {true, true, false}, 0, 200, 1, 0, 1},
		{"default write, the largest unbudgeted cannot give: the next",
		{400, 500, 0}, {0, 0, 0}, {true, false, false}, 0, 200, 1, 0, 0},
		{"default write within its share: fits",
		{600, 100, 0}, {0, 300, 0}, {true, true, false}, 0, 50, 1, 0, FITS},
		{"default write, overhead counts against its share",
		{600, 100, 0}, {0, 300, 0}, {true, true, false}, 0, 50, 1, 800, 0},
		{"default write, a cache over its budget past the target gives back",
		{600, 350, 0}, {0, 300, 0}, {true, true, false}, 0, 60, 1, 0, 1},
		{"no writer, past the target: the pool past its share pays",
		{750, 290, 0}, {0, 300, 0}, {true, true, false}, NW, 0, 0, 0, 0},
		{"no writer, past the target: the cache over its budget pays",
		{650, 360, 0}, {0, 300, 0}, {true, true, false}, NW, 0, 0, 0, 1},
		{"no writer, within the target: fits",
		{650, 300, 0}, {0, 300, 0}, {true, true, false}, NW, 0, 0, 0, FITS},
		{"no writer, past the target, nothing to give: refused",
		{0, 300, 0}, {0, 300, 0}, {false, false, false}, NW, 0, 0, 1200, REFUSED},
	};

	(void) state;
	for (size_t r = 0; r < sizeof(rows) / sizeof(rows[0]); r++)
	{
		PolicyPoolUse pools[3];
		size_t		used = rows[r].used;

		for (int p = 0; p < 3; p++)
		{
			pools[p].bytes = rows[r].bytes[p];
			pools[p].budget = rows[r].budget[p];
			pools[p].can_give = rows[r].can_give[p];
			if (rows[r].used == 0)
				used += rows[r].bytes[p];
		}
		if (policy_room_payer(pools, 3, rows[r].writer, rows[r].need,
							  rows[r].freed, used, 1000) != rows[r].payer)
			fail_msg("row %zu (%s): payer %d, expected %d", r, rows[r].name,
					 policy_room_payer(pools, 3, rows[r].writer, rows[r].need,
									   rows[r].freed, used, 1000),
					 rows[r].payer);
	}
}

/*
 * Paying until it fits: a budgeted cache writing values of 200 beside a
 * default cache near its share never takes one byte of the default's, and
 * each write evicts only as many of its own as it needs.
 */
static void
test_room_payer_loop(void **state)
{
	PolicyPoolUse pools[2] = {{680, 0, true}, {0, 300, false}};
	size_t		sizes[2][64];
	int			held[2] = {68, 0};
	size_t		overhead = 20;

	(void) state;
	for (int w = 0; w < 30; w++)
	{
		int			payer;

		while ((payer = policy_room_payer(pools, 2, 1, 200, 1,
										  overhead + pools[0].bytes +
										  pools[1].bytes, 1000)) >= 0)
		{
			assert_int_equal(payer, 1);
			/* the oldest of its own goes */
			pools[1].bytes -= sizes[1][0];
			memmove(&sizes[1][0], &sizes[1][1],
					sizeof(size_t) * (held[1] - 1));
			held[1]--;
			pools[1].can_give = held[1] > 0;
		}
		assert_int_equal(payer, POLICY_ROOM_FITS);
		sizes[1][held[1]++] = 200;
		pools[1].bytes += 200;
		pools[1].can_give = true;
		assert_true(pools[1].bytes <= 300);
	}
	assert_int_equal(pools[0].bytes, 680);
	assert_int_equal(held[1], 1);
}

/* A role's bounds in keys and in bytes, each on its own; 0 is none. */
static void
test_role_bounds_table(void **state)
{
	static const struct
	{
		uint64_t	keys;
		uint64_t	bytes;
		uint64_t	add;
		uint64_t	key_bound;
		uint64_t	byte_bound;
		bool		fits;
		bool		over_low;
	}			rows[] = {
		{0, 0, 100, 0, 0, true, false},
		{10, 1000, 100, 11, 0, true, false},
		{11, 1000, 100, 11, 0, false, true},
		{10, 900, 100, 0, 1000, true, false},
		{10, 901, 100, 0, 1000, false, false},
		{10, 951, 0, 0, 1000, true, true},
		{10, 950, 0, 0, 1000, true, false},
		/* few large keys: within the keys' bound, past the bytes' */
		{57, 5700, 100, 46000, 5000, false, true},
		/* many small keys: the keys' bound first */
		{100, 1000, 10, 100, 1000000, false, true},
		{95, 1000, 10, 100, 1000000, true, false},
		{96, 1000, 10, 100, 1000000, true, true},
		{1, 0, 0, 1, 0, false, true},
	};

	(void) state;
	for (size_t r = 0; r < sizeof(rows) / sizeof(rows[0]); r++)
	{
		if (policy_role_fits(rows[r].keys, rows[r].bytes, rows[r].add,
							 rows[r].key_bound, rows[r].byte_bound) !=
			rows[r].fits)
			fail_msg("row %zu: fits", r);
		if (policy_role_over_low(rows[r].keys, rows[r].bytes,
								 rows[r].key_bound, rows[r].byte_bound) !=
			rows[r].over_low)
			fail_msg("row %zu: over its low marks", r);
	}
}

/*
 * Admission: which keys are in use, over values and none, ages within and
 * past the window, stamps a few units ahead, and the clock's wrap.
 */
static void
test_value_in_use_table(void **state)
{
	static const struct
	{
		bool		has_value;
		uint32_t	stamp;
		uint32_t	now;
		uint32_t	window;
		bool		in_use;
	}			rows[] = {
		{true, 100, 100, 10, true},
		{true, 91, 100, 10, true},
		{true, 90, 100, 10, false},
		{true, 0, 100, 10, false},
		{false, 100, 100, 10, false},
		{true, 100, 100, 0, false},
		{true, 101, 100, 10, true},
		{true, 104, 100, 10, true},
		{true, 105, 100, 10, false},
		{true, POLICY_STAMP_MODULUS - 3, 4, 10, true},
		{true, POLICY_STAMP_MODULUS - 6, 4, 10, false},
		{true, 2, POLICY_STAMP_MODULUS - 1, 10, true},
		{true, 100, 100 + POLICY_STAMP_MODULUS / 2, POLICY_STAMP_MODULUS / 2,
		false},
	};

	(void) state;
	for (size_t r = 0; r < sizeof(rows) / sizeof(rows[0]); r++)
		assert_int_equal(policy_value_in_use(rows[r].has_value, rows[r].stamp,
											 rows[r].now, rows[r].window),
						 rows[r].in_use);
}

/*
 * The pace of overflow scans on a fake clock: the first at once; then not
 * before a second after the last ended, nor before nine times as long as
 * it took.
 */
static void
test_scan_pace_table(void **state)
{
	static const struct
	{
		int64_t		took;		/* each scan's duration, ms */
		int64_t		asked_after;	/* next asked this long after it ended */
		bool		due;
		int64_t		wait;
	}			rows[] = {
		{5, 0, false, 1000},
		{5, 999, false, 1},
		{5, 1000, true, 0},
		{200, 1000, false, 800},
		{200, 1800, true, 0},
		{0, 1000, true, 0},
		{1000, 8999, false, 1},
	};

	(void) state;
	for (size_t r = 0; r < sizeof(rows) / sizeof(rows[0]); r++)
	{
		PolicyScanPace pace;
		PolicyTime	start = 5000;
		PolicyTime	end = start + rows[r].took;
		PolicyTime	asked = end + rows[r].asked_after;

		policy_scan_pace_init(&pace);
		assert_true(policy_scan_due(&pace, start));
		assert_int_equal(policy_scan_wait(&pace, start), 0);
		policy_scan_done(&pace, start, end);
		assert_int_equal(policy_scan_due(&pace, asked), rows[r].due);
		assert_int_equal(policy_scan_wait(&pace, asked), rows[r].wait);
	}
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_store_fetch),
		cmocka_unit_test(test_store_fetch_pending_does_not_replace_state),
		cmocka_unit_test(test_store_evict_projects),
		cmocka_unit_test(test_store_evict_projects_pending_not_expired),
		cmocka_unit_test(test_store_evict_projects_stale),
		cmocka_unit_test(test_store_no_eviction_during_fetch),
		cmocka_unit_test(test_store_refresh),
		cmocka_unit_test(test_store_refresh_overtaken_by_eviction),
		cmocka_unit_test(test_store_refresh_during_eviction),
		cmocka_unit_test(test_ready_state),
		cmocka_unit_test(test_refresh_interval_validation),
		cmocka_unit_test(test_backoff_sequence),
		cmocka_unit_test(test_freshness),
		cmocka_unit_test(test_batching),
		cmocka_unit_test(test_batching_2000_keys),
		cmocka_unit_test(test_invalidate),
		cmocka_unit_test(test_request_evict),
		cmocka_unit_test(test_restore_complete),
		cmocka_unit_test(test_restore_complete_over_requested),
		cmocka_unit_test(test_expiry_change_moves_evictions),
		cmocka_unit_test(test_period_helpers),
		cmocka_unit_test(test_periods_freshness_and_eviction),
		cmocka_unit_test(test_periods_one_own),
		cmocka_unit_test(test_periods_pending_not_modified_refresh),
		cmocka_unit_test(test_periods_refresh_rule),
		cmocka_unit_test(test_periods_config_change),
		cmocka_unit_test(test_pending_never_evicted),
		cmocka_unit_test(test_refresh_unknown_key),
		cmocka_unit_test(test_heap_stress),
		cmocka_unit_test_setup_teardown(test_s3fifo_unvisited_fifo,
										sieve_setup, sieve_teardown),
		cmocka_unit_test_setup_teardown(test_s3fifo_dump_order_round_trip,
										sieve_setup, sieve_teardown),
		cmocka_unit_test_setup_teardown(test_s3fifo_read_again_moves_to_main,
										sieve_setup, sieve_teardown),
		cmocka_unit_test_setup_teardown(test_s3fifo_scan_leaves_main_alone,
										sieve_setup, sieve_teardown),
		cmocka_unit_test_setup_teardown(test_s3fifo_main_reinsertion_clears_marks,
										sieve_setup, sieve_teardown),
		cmocka_unit_test_setup_teardown(test_s3fifo_all_visited,
										sieve_setup, sieve_teardown),
		cmocka_unit_test_setup_teardown(test_s3fifo_share_in_bytes,
										sieve_setup, sieve_teardown),
		cmocka_unit_test_setup_teardown(test_s3fifo_bytes_follow_the_key,
										sieve_setup, sieve_teardown),
		cmocka_unit_test_setup_teardown(test_s3fifo_spares_fetches,
										sieve_setup, sieve_teardown),
		cmocka_unit_test_setup_teardown(test_s3fifo_ghost_admits_to_main,
										sieve_setup, sieve_teardown),
		cmocka_unit_test_setup_teardown(test_s3fifo_ghost_forgets,
										sieve_setup, sieve_teardown),
		cmocka_unit_test_setup_teardown(test_s3fifo_share_grows_on_small_ghost,
										sieve_setup, sieve_teardown),
		cmocka_unit_test_setup_teardown(test_s3fifo_share_shrinks_on_main_ghost,
										sieve_setup, sieve_teardown),
		cmocka_unit_test_setup_teardown(test_s3fifo_other_evictions,
										sieve_setup, sieve_teardown),
		cmocka_unit_test_setup_teardown(test_fair_fetch_order,
										sieve_setup, sieve_teardown),
		cmocka_unit_test_setup_teardown(test_fair_cached_leave_room,
										sieve_setup, sieve_teardown),
		cmocka_unit_test_setup_teardown(test_fair_fetch_classes,
										sieve_setup, sieve_teardown),
		cmocka_unit_test_setup_teardown(test_fair_fetch_bound_behind_values,
										sieve_setup, sieve_teardown),
		cmocka_unit_test_setup_teardown(test_fair_fetch_bound,
										sieve_setup, sieve_teardown),
		cmocka_unit_test(test_fair_turns_table),
		cmocka_unit_test_setup_teardown(test_fair_takeover,
										sieve_setup, sieve_teardown),
		cmocka_unit_test_setup_teardown(test_fair_backoff,
										sieve_setup, sieve_teardown),
		cmocka_unit_test_setup_teardown(test_fair_leave_turn,
										sieve_setup, sieve_teardown),
		cmocka_unit_test(test_fair_once_bound_table),
		cmocka_unit_test_setup_teardown(test_owner_victims,
										sieve_setup, sieve_teardown),
		cmocka_unit_test(test_pools_table),
		cmocka_unit_test_setup_teardown(test_pools_bytes,
										sieve_setup, sieve_teardown),
		cmocka_unit_test(test_pool_config_table),
		cmocka_unit_test(test_room_payer_table),
		cmocka_unit_test(test_room_payer_loop),
		cmocka_unit_test(test_role_bounds_table),
		cmocka_unit_test_setup_teardown(test_s3fifo_main_kept,
										sieve_setup, sieve_teardown),
		cmocka_unit_test(test_value_in_use_table),
		cmocka_unit_test(test_scan_pace_table),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
