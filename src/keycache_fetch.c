/*-------------------------------------------------------------------------
 *
 * keycache_fetch.c
 *	  One call of the user's fetch function, for a batch of keys.
 *
 * The fetch function (projcache.fetch_function) is the key cache's upstream:
 *
 *	 fn(keys text[], revisions text[])
 *	   RETURNS TABLE(key text, state text, revision text, config jsonb
 *					 [, max_age interval] [, stale_for interval])
 *
 * The first four columns are taken by position.  After them, columns
 * named max_age and stale_for, if the function has them, give each key its
 * own fresh and stale periods in place of projcache.expiry and
 * grace_period (see read_period()); functions without them work as before.
 *
 * It runs through SPI inside an internal subtransaction, under a statement
 * timeout of projcache.fetch_timeout, so that whatever it does wrong (an
 * ERROR, a timeout, a result that breaks the contract) becomes an answer of
 * PC_ANSWER_ERROR for the keys concerned, and the worker lives on.  The
 * caller also learns whether the keys may have caused a failure, and which
 * keys a broken result left without an answer (rows are matched to keys by
 * keycache_bisect.c), so that it can ask again for fewer at a time until a
 * bad key fails alone.
 *
 * It is user code in a long-lived superuser session, so it gets exactly
 * the rights of its role (projcache.fetch_role, else the function's owner)
 * for everything it sets in motion, commit included, and what it leaves in
 * the session is undone after each batch: see pc_fetch_batch().  Its
 * settings are the server's, not those the owner of projcache.database
 * set on it (pc_keycache_worker_connect()).
 *
 * Copyright (c) 2026, projcache developers
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/detoast.h"
#include "catalog/namespace.h"
#include "commands/prepare.h"
#include "commands/sequence.h"
#include "executor/spi.h"
#include "pgstat.h"
#include "tcop/pquery.h"
#include "tcop/tcopprot.h"
#include "common/int.h"
#include "funcapi.h"
#include "utils/builtins.h"
#include "utils/snapmgr.h"
#include "utils/timeout.h"

#include "compat.h"
#include "keycache_bisect.h"
#include "keycache_caches.h"
#include "keycache_fetch.h"
#include "user_switch.h"

/* Every item unanswered, before a call. */
static void
clear_answers(PcFetchItem *items, int nitems)
{
	int			i;

	for (i = 0; i < nitems; i++)
	{
		items[i].answer = PC_ANSWER_DISABLED;
		items[i].new_revision = NULL;
		items[i].config = NULL;
		items[i].error = NULL;
		items[i].max_age_ms = PC_PERIOD_DEFAULT;
		items[i].stale_for_ms = PC_PERIOD_DEFAULT;
		items[i].period_error = NULL;
		items[i].unresolved = false;
	}
}

/* Batch-wide failure: every key of the batch gets the error. */
static void
fail_batch(PcFetchItem *items, int nitems, const char *message)
{
	int			i;

	clear_answers(items, nitems);
	for (i = 0; i < nitems; i++)
	{
		items[i].answer = PC_ANSWER_ERROR;
		items[i].error = pstrdup(message);
	}
}


/*
 * Plan the call (pc_fetch_query()) with its arguments and open it as a cursor (a portal
 * that SPI_cursor_fetch() reads), as the current user: planning may run
 * the user's code (a SQL function's body is planned in its call's place).
 * The caller is connected to SPI.
 */
static Portal
open_fetch_cursor(Query *query, Datum *args)
{
	ParamListInfo params = makeParamList(2);
	PlannedStmt *plan;
	Portal		portal;
	MemoryContext oldcxt;
	List	   *stmts;

	params->numParams = 2;
	for (int i = 0; i < 2; i++)
	{
		params->params[i].value = args[i];
		params->params[i].isnull = false;
		params->params[i].pflags = PARAM_FLAG_CONST;
		params->params[i].ptype = TEXTARRAYOID;
	}
	plan = pg_plan_query(query, PC_FETCH_QUERY_TEXT, CURSOR_OPT_NO_SCROLL,
						 params);

	portal = CreateNewPortal();
	/* Not the function's: pg_cursors does not show it to the function. */
	portal->visible = false;
	oldcxt = MemoryContextSwitchTo(portal->portalContext);
	stmts = list_make1(copyObject(plan));
	params = copyParamList(params);
	MemoryContextSwitchTo(oldcxt);
	PortalDefineQuery(portal, NULL, PC_FETCH_QUERY_TEXT, CMDTAG_SELECT, stmts,
					  NULL);
	portal->cursorOptions = CURSOR_OPT_NO_SCROLL;
	PortalStart(portal, params, 0, InvalidSnapshot);
	return portal;
}

/*
 * The values the worker stores must really be the built-in types, whatever
 * the casts above resolved to: readers take the bytes for text and jsonb.
 */
static void
check_result_types(TupleDesc desc, int natts)
{
	static const Oid expected[4 + NUM_PERIOD_COLUMNS] = {
		TEXTOID, TEXTOID, TEXTOID, JSONBOID, INTERVALOID, INTERVALOID
	};
	int			i;

	Assert(natts >= 4 && natts <= lengthof(expected));
	if (desc->natts != natts)
		ereport(ERROR,
				(errcode(ERRCODE_DATATYPE_MISMATCH),
				 errmsg("fetch function result has %d columns, not %d",
						desc->natts, natts)));
	for (i = 0; i < desc->natts; i++)
	{
		Oid			type = TupleDescAttr(desc, i)->atttypid;

		if (type != expected[i])
			ereport(ERROR,
					(errcode(ERRCODE_DATATYPE_MISMATCH),
					 errmsg("fetch function result column %d has type %s, not %s",
							i + 1, format_type_be_qualified(type),
							format_type_be(expected[i]))));
	}
}

/*
 * One key's period from its row, in ms: PC_PERIOD_DEFAULT when the
 * function has no such column or gives NULL (the setting applies, as for a
 * four-column function); also when the value is negative or longer than
 * PC_MAX_PERIOD_MS (about 6.2 days, the bound of projcache.expiry and
 * grace_period), and then *why says so.  A month counts 30 days and a day
 * 24 hours, as extract(epoch) has it.
 */
static int32
read_period(HeapTuple tuple, TupleDesc desc, const PeriodColumn *col,
			char **why)
{
	Datum		d;
	bool		isnull;
	Interval   *iv;
	int64		usecs;
	bool		overflow;

	if (col->problem != NULL)
	{
		*why = pstrdup(col->problem);
		return PC_PERIOD_DEFAULT;
	}
	if (col->attnum == 0)
		return PC_PERIOD_DEFAULT;
	d = SPI_getbinval(tuple, desc, col->attnum, &isnull);
	if (isnull)
		return PC_PERIOD_DEFAULT;
	iv = DatumGetIntervalP(d);
	overflow = pg_mul_s64_overflow((int64) iv->month * DAYS_PER_MONTH + iv->day,
								   USECS_PER_DAY, &usecs) ||
		pg_add_s64_overflow(usecs, iv->time, &usecs);
	if (overflow)
		usecs = ((int64) iv->month * DAYS_PER_MONTH + iv->day) < 0 ?
			PG_INT64_MIN : PG_INT64_MAX;
	if (usecs >= 0 && usecs / 1000 <= PC_MAX_PERIOD_MS)
		return (int32) (usecs / 1000);
	if (usecs < 0)
		*why = psprintf("fetch function returned %s \"%s\", which is negative: %s applies",
						col->name,
						DatumGetCString(DirectFunctionCall1(interval_out, d)),
						col->setting);
	else
		*why = psprintf("fetch function returned %s \"%s\", longer than %d ms: %s applies",
						col->name,
						DatumGetCString(DirectFunctionCall1(interval_out, d)),
						(int) PC_MAX_PERIOD_MS, col->setting);
	return PC_PERIOD_DEFAULT;
}

/* Both periods of a row; the reasons for any refused, joined. */
static void
read_periods(HeapTuple tuple, TupleDesc desc, const PeriodColumn *cols,
			 PcFetchItem *it)
{
	char	   *why[NUM_PERIOD_COLUMNS] = {NULL, NULL};

	it->max_age_ms = read_period(tuple, desc, &cols[0], &why[0]);
	it->stale_for_ms = read_period(tuple, desc, &cols[1], &why[1]);
	if (why[0] != NULL && why[1] != NULL)
		it->period_error = psprintf("%s; %s", why[0], why[1]);
	else
		it->period_error = why[0] != NULL ? why[0] : why[1];
}

/* Memory for the row matcher: the SPI call's context. */
static void *
match_alloc(size_t size)
{
	return palloc(size);
}

static void
match_free(void *ptr)
{
	pfree(ptr);
}

/* Make the key's answer an error, whatever it was. */
static void
set_error(PcFetchItem *it, MemoryContext resultcxt, const char *message)
{
	it->answer = PC_ANSWER_ERROR;
	it->error = MemoryContextStrdup(resultcxt, message);
	it->config = NULL;
	it->new_revision = NULL;
	it->max_age_ms = PC_PERIOD_DEFAULT;
	it->stale_for_ms = PC_PERIOD_DEFAULT;
	it->period_error = NULL;
}

/*
 * A breach pinned on one key (keycache_bisect.h): the key gets the error,
 * and keeps the first one it got.  Returns 1 if it is the key's first.
 */
static int
key_breach(PcFetchItem *it, MemoryContext resultcxt, const char *message)
{
	if (it->answer == PC_ANSWER_ERROR)
		return 0;
	set_error(it, resultcxt, message);
	return 1;
}

/*
 * A key's answer from its row.  Returns 1 if the row broke the contract
 * (the key then has an error of its own).
 */
static int
read_answer(HeapTuple tuple, TupleDesc desc, const PeriodColumn *cols,
			PcFetchItem *it, MemoryContext resultcxt)
{
	MemoryContext oldcxt = MemoryContextSwitchTo(resultcxt);
	bool		isnull;
	Datum		d;
	char	   *state;
	int			breach = 0;

	d = SPI_getbinval(tuple, desc, 2, &isnull);
	state = isnull ? NULL : TextDatumGetCString(d);
	d = SPI_getbinval(tuple, desc, 3, &isnull);
	it->new_revision = isnull ? NULL : TextDatumGetCString(d);
	d = SPI_getbinval(tuple, desc, 4, &isnull);
	it->config = isnull ? NULL :
		pg_detoast_datum_copy((struct varlena *) DatumGetPointer(d));
	read_periods(tuple, desc, cols, it);

	if (state == NULL)
		it->error = pstrdup("fetch function returned a NULL state");
	else if (strcmp(state, "enabled") == 0)
	{
		it->answer = PC_ANSWER_ENABLED;
		if (it->config == NULL)
			it->error = pstrdup("fetch function returned state \"enabled\" with a NULL config");
	}
	else if (strcmp(state, "disabled") == 0)
		it->answer = PC_ANSWER_DISABLED;
	else if (strcmp(state, "pending") == 0)
		it->answer = PC_ANSWER_PENDING;
	else if (strcmp(state, "not_modified") == 0)
		it->answer = PC_ANSWER_NOT_MODIFIED;
	else
		it->error = psprintf("fetch function returned unknown state \"%s\"",
							 state);

	if (it->error != NULL)
	{
		it->answer = PC_ANSWER_ERROR;
		it->config = NULL;
		it->new_revision = NULL;
		breach = 1;
	}
	/* Periods go with a value (or not_modified) only. */
	if (it->answer == PC_ANSWER_ERROR || it->answer == PC_ANSWER_PENDING)
	{
		it->max_age_ms = PC_PERIOD_DEFAULT;
		it->stale_for_ms = PC_PERIOD_DEFAULT;
		it->period_error = NULL;
	}
	MemoryContextSwitchTo(oldcxt);
	return breach;
}

/* The fetch function's arguments: the keys, and their revisions. */
static void
fetch_arguments(const PcFetchItem *items, int nitems, Datum *args)
{
	Datum	   *keys = palloc(nitems * sizeof(Datum));
	Datum	   *revs = palloc(nitems * sizeof(Datum));
	bool	   *revnulls = palloc(nitems * sizeof(bool));
	int			dims[1] = {nitems};
	int			lbs[1] = {1};
	int			i;

	for (i = 0; i < nitems; i++)
	{
		keys[i] = PointerGetDatum(cstring_to_text_with_len(items[i].key,
														   items[i].keylen));
		revnulls[i] = items[i].revision == NULL;
		revs[i] = revnulls[i] ? (Datum) 0 :
			CStringGetTextDatum(items[i].revision);
	}
	args[0] = PointerGetDatum(construct_array(keys, nitems, TEXTOID, -1, false,
											  TYPALIGN_INT));
	args[1] = PointerGetDatum(construct_md_array(revs, revnulls, 1, dims, lbs,
												 TEXTOID, -1, false,
												 TYPALIGN_INT));
}

/* A matcher of the result's rows to the keys asked for. */
static BisectMatch *
begin_matching(const PcFetchItem *items, int nitems)
{
	const char **keyptrs = palloc(nitems * sizeof(char *));
	size_t	   *keylens = palloc(nitems * sizeof(size_t));
	int			i;

	for (i = 0; i < nitems; i++)
	{
		keyptrs[i] = items[i].key;
		keylens[i] = items[i].keylen;
	}
	return bisect_match_begin(nitems, keyptrs, keylens, match_alloc,
							  match_free);
}

/*
 * Match one row of the result to the key it answers and read its answer,
 * or note the breach: one a key owns goes to that key (returns 1 if it is
 * the key's first), one no single key owns sets *why (the first only).
 */
static int
match_row(BisectMatch *match, HeapTuple tuple, TupleDesc desc,
		  const PeriodColumn *cols, PcFetchItem *items,
		  MemoryContext resultcxt, char **why)
{
	bool		isnull;
	Datum		d;
	text	   *keytext = NULL;
	char	   *message = NULL;
	int			breaches = 0;
	int			idx;

	d = SPI_getbinval(tuple, desc, 1, &isnull);
	if (!isnull)
		keytext = DatumGetTextPP(d);
	switch (bisect_match_row(match,
							 keytext ? VARDATA_ANY(keytext) : NULL,
							 keytext ? VARSIZE_ANY_EXHDR(keytext) : 0,
							 &idx))
	{
		case BISECT_ROW_ANSWER:
			breaches = read_answer(tuple, desc, cols, &items[idx], resultcxt);
			break;
		case BISECT_ROW_DUPLICATE:
			message = psprintf("fetch function returned key \"%s\" more than once",
							   text_to_cstring(keytext));
			breaches = key_breach(&items[idx], resultcxt, message);
			break;
		case BISECT_ROW_SPELLING:
			message = psprintf("fetch function returned key \"%s\", which was not asked for (\"%s\" was, which differs only in case)",
							   text_to_cstring(keytext),
							   pnstrdup(items[idx].key, items[idx].keylen));
			breaches = key_breach(&items[idx], resultcxt, message);
			break;
		case BISECT_ROW_AMBIGUOUS:
		case BISECT_ROW_UNOWNED:
			if (*why != NULL)
				break;
			if (keytext == NULL)
				*why = "fetch function returned a row with a NULL key";
			else if (idx >= 0)
				*why = psprintf("fetch function returned key \"%s\" more than once",
								text_to_cstring(keytext));
			else
				*why = psprintf("fetch function returned key \"%s\", which was not asked for",
								text_to_cstring(keytext));
			break;
	}
	if (message != NULL)
		pfree(message);
	return breaches;
}

/*
 * How much of an answer is read.  A call's rows are read through a cursor,
 * a chunk at a time, and each chunk is released before the next, so the
 * worker holds one chunk and the answers it keeps (at most one row a key
 * asked for).  Unasked and duplicate rows are matched and dropped.  Past
 * either bound below, the call fails: its answer is not read further, and
 * its keys get the error, as for any other failure of the function.
 *
 * - Rows: a correct answer has one row a key asked for.  More than two a
 *	 key and PC_ANSWER_EXTRA_ROWS more is no answer to the keys asked.
 * - Bytes: the key, state, revision and config of every row read, at their
 *	 full (detoasted) size.  A batch cannot bring more than
 *	 projcache.max_memory into the cache, whatever its number of keys, so
 *	 that is the bound, but never less than PC_ANSWER_MIN_BYTES (a small
 *	 cache still reads any value it could hold, and a value too large for
 *	 it is refused as usual, not failed here) and never more than
 *	 MaxAllocSize (1 GB, PostgreSQL's largest value): the worker's private
 *	 memory grows by no more than that during a call.
 *
 * A chunk holds about PC_ANSWER_CHUNK_BYTES of rows as large as the
 * largest read so far, and at most PC_ANSWER_CHUNK_ROWS rows.  The first is
 * one row, and each has at most twice the rows of the one before: rows much
 * larger than those before them cost one chunk of a few of them, not of
 * PC_ANSWER_CHUNK_ROWS.
 */
#define PC_ANSWER_EXTRA_ROWS	100
#define PC_ANSWER_MIN_BYTES		((Size) 64 * 1024 * 1024)
#define PC_ANSWER_CHUNK_ROWS	128
#define PC_ANSWER_CHUNK_BYTES	((Size) 1024 * 1024)

static uint64
answer_row_bound(int nitems)
{
	return (uint64) nitems * 2 + PC_ANSWER_EXTRA_ROWS;
}

static Size
answer_byte_bound(void)
{
	return Min(Max(pc_memory_limit(), PC_ANSWER_MIN_BYTES),
			   (Size) MaxAllocSize);
}

/* A row's key, state, revision and config, as the answer's bytes count them. */
static Size
row_bytes(HeapTuple tuple, TupleDesc desc)
{
	Size		bytes = 0;

	for (int i = 1; i <= 4; i++)
	{
		bool		isnull;
		Datum		d = SPI_getbinval(tuple, desc, i, &isnull);

		if (!isnull)
			bytes += toast_raw_datum_size(d);
	}
	return bytes;
}

/*
 * The next chunk's rows, after one of last rows (0: none yet), and one row
 * past the row bound at most, to see it crossed.
 */
static long
chunk_rows(uint32 largest, long last, uint64 rows, uint64 maxrows)
{
	uint64		n = last == 0 ? 1 : (uint64) last * 2;

	n = Min(n, PC_ANSWER_CHUNK_ROWS);
	if (largest > 0)
		n = Min(n, Max(PC_ANSWER_CHUNK_BYTES / largest, 1));
	n = Min(n, maxrows + 1 - rows);
	return (long) n;
}

/*
 * The call failed past a bound: in the function's run, as the keys may
 * have caused it (one key that makes the function answer a whole table),
 * so a batch is split to find it (keycache_bisect.h).
 */
static void
answer_too_large(int nitems, uint64 rows, Size bytes, bool *in_function)
{
	*in_function = true;
	if (rows > answer_row_bound(nitems))
		ereport(ERROR,
				(errcode(ERRCODE_PROGRAM_LIMIT_EXCEEDED),
				 errmsg_plural("fetch function's answer is too large: more than %llu rows for %d key",
							   "fetch function's answer is too large: more than %llu rows for %d keys",
							   nitems,
							   (unsigned long long) answer_row_bound(nitems),
							   nitems),
				 errdetail("A call may answer at most two rows a key asked for, and %d more.",
						   PC_ANSWER_EXTRA_ROWS)));
	ereport(ERROR,
			(errcode(ERRCODE_PROGRAM_LIMIT_EXCEEDED),
			 errmsg_plural("fetch function's answer is too large: more than %zu bytes for %d key",
						   "fetch function's answer is too large: more than %zu bytes for %d keys",
						   nitems, answer_byte_bound(), nitems),
			 errdetail("A call's answer may take at most projcache.max_memory, but at least 64 MB and at most 1 GB.  This one answered %zu bytes in its first %llu rows.",
					   bytes, (unsigned long long) rows)));
}

/*
 * Call the fetch function fn (by its OID: pc_fetch_query()) and turn its rows
 * into answers, reading them a chunk at a time through a cursor (see
 * PC_ANSWER_EXTRA_ROWS).  Runs inside the subtransaction; any
 * ERROR propagates to pc_fetch_batch().  Returns the number of keys whose
 * rows broke the contract; *unresolved is set to the number of keys left
 * without an answer (see BisectMatch in keycache_bisect.h), which are
 * marked so.  *in_function says whether the function is running, for an
 * ERROR.
 */
static int
run_fetch(Oid fn, PcFetchItem *items, int nitems, MemoryContext resultcxt,
		  int *unresolved, bool *in_function)
{
	PeriodColumn cols[NUM_PERIOD_COLUMNS];
	Query	   *query;
	Datum		args[2];
	BisectMatch *match;
	Portal		portal;
	MemoryContext callcxt = CurrentMemoryContext;
	MemoryContext chunkcxt;
	char	   *why = NULL;		/* the first breach no single key owns */
	bool		why_kept = false;	/* copied out of chunkcxt */
	uint64		maxrows = answer_row_bound(nitems);
	Size		maxbytes = answer_byte_bound();
	uint64		rows = 0;
	Size		bytes = 0;
	uint32		largest = 0;
	long		want = 0;
	int			breaches = 0;
	int			natts = 4;
	int			i;

	pc_fetch_period_columns_init(cols);
	query = pc_fetch_query(fn, cols);
	fetch_arguments(items, nitems, args);
	match = begin_matching(items, nitems);

	*in_function = true;
	portal = open_fetch_cursor(query, args);
	*in_function = false;
	for (i = 0; i < NUM_PERIOD_COLUMNS; i++)
		natts = Max(natts, cols[i].attnum);
	check_result_types(portal->tupDesc, natts);

	/* What reading a chunk's rows allocates goes with the chunk. */
	chunkcxt = AllocSetContextCreate(callcxt, "projcache fetch answer chunk",
									 ALLOCSET_DEFAULT_SIZES);
	for (;;)
	{
		uint64		got;

		want = chunk_rows(largest, want, rows, maxrows);
		*in_function = true;
		SPI_cursor_fetch(portal, true, want);
		*in_function = false;
		got = SPI_processed;

		MemoryContextSwitchTo(chunkcxt);
		for (uint64 row = 0; row < got; row++)
		{
			HeapTuple	tuple = SPI_tuptable->vals[row];

			rows++;
			bytes += row_bytes(tuple, SPI_tuptable->tupdesc);
			if (rows > maxrows || bytes > maxbytes)
				answer_too_large(nitems, rows, bytes, in_function);
			largest = Max(largest, tuple->t_len);
			breaches += match_row(match, tuple, SPI_tuptable->tupdesc, cols,
								  items, resultcxt, &why);
		}
		MemoryContextSwitchTo(callcxt);
		if (why != NULL && !why_kept)
		{
			why = pstrdup(why);
			why_kept = true;
		}
		MemoryContextReset(chunkcxt);
		SPI_freetuptable(SPI_tuptable);
		if (got < (uint64) want)
			break;
		CHECK_FOR_INTERRUPTS();
	}
	SPI_cursor_close(portal);
	MemoryContextDelete(chunkcxt);

	*unresolved = 0;
	for (i = 0; i < nitems; i++)
	{
		if (!bisect_match_unresolved(match, i))
			continue;
		Assert(why != NULL);
		set_error(&items[i], resultcxt, why);
		items[i].unresolved = true;
		(*unresolved)++;
	}
	bisect_match_end(match);
	return breaches;
}

/*
 * Undo what user code may have left in the worker's session, so that the
 * next batch, and the worker's own SQL, start from a clean one: cursors
 * (a WITH HOLD one would run its query at commit), prepared statements,
 * advisory locks, cached sequence values (currval, lastval) and the
 * temporary schema's contents.  Settings changed with SET are undone by the
 * call's GUC nest level.  LISTEN needs nothing: PostgreSQL refuses it in a
 * background process.  Language-level state (PL/Python's GD) and the
 * connections dblink or postgres_fdw keep stay, by design.
 *
 * Runs in the batch's transaction, also after a failed call: prepared
 * statements and session advisory locks outlive a rollback.
 */
static void
reset_session_state(void)
{
	PortalHashTableDeleteAll();
	DropAllPreparedStatements();
	LockReleaseAll(USER_LOCKMETHOD, true);
	ResetSequenceCaches();
	ResetTempTableNamespace();
}

/*
 * May the keys of the call have caused this failure, so that asking for
 * fewer at a time may find those that fail (keycache_bisect.h)?  Not if it
 * happened outside the function's own run (finding it, checking its
 * result's columns, committing), nor for a timeout or cancel, a failed
 * connection, a lack of resources or a system error (SQLSTATE classes 57,
 * 08, 53 and 58): those come from the source or the server, not from a
 * key, and more calls would only add load to a source failing for all.
 */
static bool
keys_may_have_caused(const ErrorData *edata, bool in_function)
{
	if (!in_function)
		return false;
	switch (ERRCODE_TO_CATEGORY(edata->sqlerrcode))
	{
		case ERRCODE_CONNECTION_EXCEPTION:
		case ERRCODE_INSUFFICIENT_RESOURCES:
		case ERRCODE_OPERATOR_INTERVENTION:
		case ERRCODE_SYSTEM_ERROR:
			return false;
		default:
			return true;
	}
}

/*
 * A call that failed: log it, and make the error every key's answer.  A
 * cancel that came with the deadline is our timeout.  A failure the
 * worker will narrow down by asking again (split) is only a DEBUG1 line:
 * the keys that fail in the end get their own WARNING.
 */
static void
report_failure(PcFetchItem *items, int nitems, ErrorData *edata,
			   int64 started_ms, bool split, bool quiet,
			   const PcFetchTarget *target)
{
	if (edata->sqlerrcode == ERRCODE_QUERY_CANCELED &&
		target->timeout_ms > 0 &&
		pc_real_now_ms() - started_ms >= target->timeout_ms)
	{
		pfree(edata->message);
		edata->message = psprintf("fetch function ran longer than %s (%d ms)",
								  target->function == NULL ?
								  "projcache.fetch_timeout" :
								  "its cache's fetch_timeout",
								  target->timeout_ms);
	}
	if (split)
		ereport(DEBUG1,
				(errcode(edata->sqlerrcode),
				 errmsg("fetch function failed for %d keys, which are asked for again fewer at a time",
						nitems),
				 errdetail("%s", edata->message)));
	else
		ereport(quiet ? DEBUG1 : WARNING,
				(errcode(edata->sqlerrcode),
				 errmsg_plural("fetch function failed for %d key",
							   "fetch function failed for %d keys",
							   nitems, nitems),
				 errdetail("%s", edata->message)));
	fail_batch(items, nitems, edata->message);
}

/* One call of the fetch function, for pc_run_in_subxact(). */
typedef struct FetchCall
{
	const PcFetchTarget *target;
	PcFetchItem *items;
	int			nitems;
	MemoryContext callercxt;	/* where the answers go */
	PcUserSwitch sw;			/* out: the switch to the fetch role */
	Oid			roleid;			/* out: the role it ran as */
	int			breaches;		/* out: keys whose rows broke the contract */
	int			unresolved;		/* out: keys left without an answer */
	bool		in_function;	/* out: the function (or its deferred
								 * triggers) was running */
} FetchCall;

/*
 * The hard end of a call of a cache's function whose owner is not a
 * superuser.  The statement timeout cancels the call once, and a function
 * may catch that cancel and go on, holding the one worker that every
 * cache shares.  PC_FETCH_HARD_GRACE_MS after the timeout, the worker ends
 * itself (FATAL, which no function can catch), after counting the overrun
 * on the owner's function (pc_cache_note_overrun: an atomic, safe in a
 * signal handler); the launcher starts a new worker, which puts aside the
 * keys of every cache of that owner and function for a while
 * (pc_cache_paused_ms()).
 */
#define PC_FETCH_HARD_GRACE_MS	1000

static TimeoutId hard_timeout = MAX_TIMEOUTS;
static volatile sig_atomic_t overrun_entry = -1;

static void
fetch_overran(void)
{
	/* (the call ended just as the timer fired: nothing to stop) */
	if (overrun_entry < 0)
		return;
	pc_cache_note_overrun((int) overrun_entry);
	ProcDiePending = true;
	InterruptPending = true;
	SetLatch(MyLatch);
}

static void
arm_hard_deadline(const PcFetchTarget *target)
{
	if (!target->hard_deadline || target->timeout_ms <= 0)
		return;
	if (hard_timeout == MAX_TIMEOUTS)
		hard_timeout = RegisterTimeout(USER_TIMEOUT, fetch_overran);
	overrun_entry = target->overrun_entry;
	enable_timeout_after(hard_timeout,
						 target->timeout_ms + PC_FETCH_HARD_GRACE_MS);
}

static void
disarm_hard_deadline(void)
{
	overrun_entry = -1;
	if (hard_timeout != MAX_TIMEOUTS)
		disable_timeout(hard_timeout, false);
}

/*
 * dblink keeps its connections in the session, across transactions, and
 * every cache's function runs in the worker's one session: a connection
 * one function left open would serve the next one, another owner's, with
 * the first one's remote rights.  So once named caches exist, each call
 * closes them before it ends, as the role it ran as (the one that opened
 * them): the named ones, then the unnamed one.  Not an error if it fails
 * (dblink not installed, no connection open).
 */
static void
close_dblink_body(void *arg)
{
	char	   *schema;

	if (SPI_connect() != SPI_OK_CONNECT)
		elog(ERROR, "SPI_connect failed");
	if (SPI_execute("SELECT n.nspname FROM pg_catalog.pg_extension e"
					" JOIN pg_catalog.pg_namespace n"
					" ON n.oid OPERATOR(pg_catalog.=) e.extnamespace"
					" WHERE e.extname OPERATOR(pg_catalog.=) 'dblink'",
					true, 1) != SPI_OK_SELECT || SPI_processed != 1)
	{
		SPI_finish();
		return;
	}
	schema = pstrdup(quote_identifier(SPI_getvalue(SPI_tuptable->vals[0],
												   SPI_tuptable->tupdesc, 1)));
	(void) SPI_execute(psprintf("SELECT %s.dblink_disconnect(c)"
								" FROM pg_catalog.unnest(%s.dblink_get_connections()) c",
								schema, schema), false, 0);
	if (arg != NULL)
		(void) SPI_execute(psprintf("SELECT %s.dblink_disconnect()", schema),
						   false, 0);
	SPI_finish();
}

static void
close_dblink_connections(void)
{
	ErrorData  *edata;

	edata = pc_run_in_subxact(close_dblink_body, NULL);
	if (edata != NULL)
		FreeErrorData(edata);
	/* the unnamed one: an ERROR if there is none */
	edata = pc_run_in_subxact(close_dblink_body, (void *) 1);
	if (edata != NULL)
		FreeErrorData(edata);
}

static void
call_fetch_function(void *arg)
{
	FetchCall  *call = (FetchCall *) arg;
	Oid			fn;

	fn = pc_fetch_target_function(call->target, &call->roleid);

	/* An ERROR restores the user with the subtransaction. */
	pc_become(&call->sw, PC_AS_FETCH_ROLE, call->roleid, NULL);
	if (call->target->timeout_ms > 0)
		enable_timeout_after(STATEMENT_TIMEOUT, call->target->timeout_ms);
	arm_hard_deadline(call->target);
	if (SPI_connect() != SPI_OK_CONNECT)
		elog(ERROR, "SPI_connect failed");
	call->breaches = run_fetch(fn, call->items, call->nitems,
							   call->callercxt, &call->unresolved,
							   &call->in_function);
	SPI_finish();
	/* Deferred triggers now, not at commit (see pc_fetch_batch). */
	call->in_function = true;
	AfterTriggerFireDeferred();
	call->in_function = false;
	if (pc_caches_in_use())
		close_dblink_connections();
	disable_timeout(STATEMENT_TIMEOUT, false);
	/* The settings go now; the user stays until the commit (see below). */
	AtEOXact_GUC(false, call->sw.save_nestlevel);
}

/*
 * Commit the call's transaction (resetting what the function left in the
 * session), or abort it if that fails; returns the call's error, else the
 * commit's, else NULL, copied into callercxt.
 */
static ErrorData *
end_call_transaction(ErrorData *edata, MemoryContext callercxt)
{
	ErrorData  *volatile result = edata;

	PG_TRY();
	{
		/* Dropping the temporary schema's contents deletes catalog rows. */
		PushActiveSnapshot(GetTransactionSnapshot());
		reset_session_state();
		PopActiveSnapshot();
		CommitTransactionCommand();
	}
	PG_CATCH();
	{
		MemoryContextSwitchTo(callercxt);
		if (result == NULL)
			result = CopyErrorData();
		FlushErrorState();
		AbortCurrentTransaction();
	}
	PG_END_TRY();
	return result;
}

/*
 * What a call came to, said in the log and counted: one fetch error for a
 * call that failed or whose rows broke the contract (see run_batch()).
 */
static PcFetchOutcome
settle_call(FetchCall *call, ErrorData *edata, int64 started_ms, bool quiet)
{
	PcFetchItem *items = call->items;
	int			nitems = call->nitems;
	PcFetchOutcome outcome;
	int			i;

	if (edata != NULL)
	{
		outcome = keys_may_have_caused(edata, call->in_function) ?
			PC_FETCH_FAILED : PC_FETCH_FAILED_ALL;
		report_failure(items, nitems, edata, started_ms,
					   outcome == PC_FETCH_FAILED && nitems > 1, quiet,
					   call->target);
		FreeErrorData(edata);
		pc_count(PC_CTR_FETCH_ERRORS, 1);
		return outcome;
	}
	if (call->unresolved > 0)
	{
		for (i = 0; i < nitems && !items[i].unresolved; i++)
			;
		Assert(i < nitems);
		ereport(nitems > 1 || quiet ? DEBUG1 : WARNING,
				(errcode(ERRCODE_DATA_EXCEPTION),
				 errmsg_plural("fetch function's result broke the contract for %d key",
							   "fetch function's result broke the contract for %d keys",
							   call->unresolved, call->unresolved),
				 errdetail("%s", items[i].error)));
		pc_count(PC_CTR_FETCH_ERRORS, 1);
		return PC_FETCH_UNRESOLVED;
	}
	if (call->breaches > 0)
		pc_count(PC_CTR_FETCH_ERRORS, 1);
	return PC_FETCH_ANSWERED;
}

/*
 * Ask the fetch function for a batch of keys and fill in each item's
 * answer.  Keys the function does not return are disabled.  Never raises
 * an ERROR for what the function does; results are allocated in the
 * caller's memory context.  Says what the call came to: answers for every
 * key, or some left unresolved, or a failure the keys may have caused (the
 * worker then asks for fewer at a time, keycache_bisect.h), or one they
 * cannot have.  quiet logs a failure at DEBUG1 instead of WARNING (a key
 * that failed alone before, and was warned about then).
 *
 * The worker's session is a superuser's and lives on, so the call is
 * fenced in:
 *
 * - It runs as the fetch role (pc_fetch_target_function()) with
 *	 SECURITY_LOCAL_USERID_CHANGE, so SET ROLE is refused, and the role stays
 *	 current until the transaction has committed: whatever the call queued
 *	 for commit cannot run as superuser.  Deferred triggers, and what they
 *	 queue in turn, are fired inside the subtransaction, so that their
 *	 errors are the call's and they run under its timeout.
 * - Settings it changed are undone when it returns (its own GUC nest
 *	 level, as REFRESH MATERIALIZED VIEW does), and reset_session_state()
 *	 clears the rest before the commit, whether the call failed or not.
 * - A commit that fails anyway fails the batch, not the worker.
 *
 * A call counts as one fetch error, however many rows broke the contract.
 */
PcFetchOutcome
pc_fetch_batch(PcFetchItem *items, int nitems, bool quiet,
			   const PcFetchTarget *target)
{
	MemoryContext callercxt = CurrentMemoryContext;
	int64		started_ms;
	FetchCall	call;
	ErrorData  *edata;
	PcFetchOutcome outcome;

	clear_answers(items, nitems);
	pc_count(PC_CTR_FETCH_CALLS, 1);
	pc_count(PC_CTR_FETCHED_KEYS, nitems);
	pc_cache_count(target->cache, PC_CACHE_FETCH_CALLS, 1);

	if (target->function == NULL &&
		(pc_fetch_function == NULL || pc_fetch_function[0] == '\0'))
	{
		fail_batch(items, nitems, "projcache.fetch_function is not set");
		pc_count(PC_CTR_FETCH_ERRORS, 1);
		return PC_FETCH_FAILED_ALL;
	}

	/* Whom to go back to, even if the call fails before its switch. */
	GetUserIdAndSecContext(&call.sw.save_userid, &call.sw.save_sec_context);
	SetCurrentStatementStartTimestamp();
	StartTransactionCommand();
	PushActiveSnapshot(GetTransactionSnapshot());
	pgstat_report_activity(STATE_RUNNING,
						   "projcache: calling the fetch function");

	started_ms = pc_real_now_ms();
	call.target = target;
	call.items = items;
	call.nitems = nitems;
	call.callercxt = callercxt;
	call.roleid = InvalidOid;
	call.breaches = 0;
	call.unresolved = 0;
	call.in_function = false;
	/* Its error must outlive the transaction: copy it into ours. */
	MemoryContextSwitchTo(callercxt);
	edata = pc_run_in_subxact(call_fetch_function, &call);
	/* The timeout may have fired as the call ended: too late, forget it. */
	disable_timeout(STATEMENT_TIMEOUT, false);
	disarm_hard_deadline();
	QueryCancelPending = false;

	/*
	 * A call that failed (or was cancelled) after its function opened dblink
	 * connections closes them too, as the role it ran as.
	 */
	if (edata != NULL && OidIsValid(call.roleid) && pc_caches_in_use())
	{
		PcUserSwitch sw;

		pc_become(&sw, PC_AS_FETCH_ROLE, call.roleid, NULL);
		close_dblink_connections();
		pc_unbecome(&sw);
	}
	/* Only an abort restores the user: the commit is the role's too. */
	Assert(edata != NULL || GetUserId() == call.roleid);
	PopActiveSnapshot();
	/* A failure from here on is the commit's. */
	if (edata == NULL)
		call.in_function = false;
	edata = end_call_transaction(edata, callercxt);
	pc_unbecome_user(&call.sw);
	MemoryContextSwitchTo(callercxt);

	outcome = settle_call(&call, edata, started_ms, quiet);
	pgstat_report_activity(STATE_IDLE, NULL);
	if (outcome != PC_FETCH_ANSWERED)
		pc_cache_count(target->cache, PC_CACHE_FETCH_ERRORS, 1);

	/* A named cache's periods, for the keys the function gave none. */
	for (int i = 0; i < nitems; i++)
	{
		if (items[i].max_age_ms == PC_PERIOD_DEFAULT)
			items[i].max_age_ms = target->max_age_ms;
		if (items[i].stale_for_ms == PC_PERIOD_DEFAULT)
			items[i].stale_for_ms = target->stale_for_ms;
	}
	return outcome;
}
