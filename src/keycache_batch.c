/*-------------------------------------------------------------------------
 *
 * keycache_batch.c
 *	  The worker's batches: the keys due are asked of the fetch function in
 *	  batches, by cache and by the roles' turns, and each answer is made
 *	  into what the key map holds and the policy knows.
 *
 * Copyright (c) 2026, projcache developers
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/xact.h"
#include "access/xlog.h"
#include "commands/async.h"
#include "utils/memutils.h"

#include "keycache_bisect.h"
#include "keycache_caches.h"
#include "keycache_worker.h"
#include "wal.h"

/*
 * The largest value stored, as a share of the same: a larger one would evict
 * a good part of the cache for itself, so it is refused (and retried with
 * the usual backoff: the upstream's value may shrink).  A value within it
 * fits once the worker has evicted for it, unless the keys that would make
 * room are all being fetched.
 */
#define PC_MAX_VALUE_DIVISOR	8

static int64 suspect_resume_ms = 0; /* when suspects may be fetched again, on
									 * pc_real_now_ms() (keycache_bisect.h) */

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
		pc_count_delay(e);
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
		pc_tombstone_unless_disabled(key, len);
	store_answer(key, len, e, item, result, &w, &prep, waiting, now);

	if (completion == POLICY_DONE || completion == POLICY_RESCHEDULED)
		pc_mirror_entry(e);
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
	return MemoryContextAllocHuge(pc_batch_cxt, size);
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

/* A batch as run_batch() runs it, in pc_batch_cxt. */
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
			pc_mirror_entry(e);
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

	MemoryContextReset(pc_batch_cxt);
	oldcxt = MemoryContextSwitchTo(pc_batch_cxt);
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

/*
 * The cache a key of a batch is of, as pc_cache_of() says (with its
 * registration in *reg): its entry's; for a key whose entry is gone (its
 * answer is stored nowhere), its pool's cache now.
 */
static int
batch_key_cache(const PolicyEntry *e, PcCacheReg *reg)
{
	PcKey		search = pc_search_key(e->key, (uint32) e->keylen);
	PcEntry    *entry = pc_entry_find(&search, false);
	PcCacheId	id;

	if (entry != NULL)
	{
		id = entry->cache;
		pc_entry_release(entry);
	}
	else if (e->pool == 0)
		id = PC_CACHE_ID_DEFAULT;
	else
		id = PC_CACHE_ID(e->pool - 1, pc_cache_slot(e->pool - 1)->gen);
	return pc_cache_of(id, reg);
}

/* How to ask for a named cache's keys (slot from batch_key_cache()). */
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
void
pc_run_batches(PolicyEntry **batch, int n)
{
	/* Not in pc_batch_cxt: each run_batch() resets it. */
	MemoryContext oldcxt = MemoryContextSwitchTo(TopMemoryContext);
	int		   *cache = palloc(n * sizeof(int));
	PcCacheReg *regs = palloc(n * sizeof(PcCacheReg));
	PolicyEntry **group = palloc(n * sizeof(PolicyEntry *));
	bool	   *done = palloc0(n * sizeof(bool));

	MemoryContextSwitchTo(oldcxt);

	for (int i = 0; i < n; i++)
		cache[i] = batch_key_cache(batch[i], &regs[i]);
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
				pc_mirror_entry(group[j]);
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
				pc_mirror_entry(group[j]);
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
					pc_mirror_entry(group[j]);
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
