/*-------------------------------------------------------------------------
 *
 * keycache_caches_view.c
 *	  The projcache.caches view: every registered cache, its settings as
 *	  the registry has them, and its slot's state and counters.
 *
 * Copyright (c) 2026, projcache developers
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/xact.h"
#include "commands/dbcommands.h"
#include "funcapi.h"
#include "miscadmin.h"
#include "utils/builtins.h"

#include "keycache.h"
#include "keycache_caches.h"

PG_FUNCTION_INFO_V1(projcache_caches);

/* ----------------------------------------------------------------
 * The projcache.caches view
 * ----------------------------------------------------------------
 */

/* An interval Datum of ms, or NULL for a setting not set. */
static Datum
ms_interval(int64 ms, bool *isnull)
{
	Interval   *iv;

	*isnull = ms == PC_CACHE_SETTING_UNSET;
	if (*isnull)
		return (Datum) 0;
	iv = palloc0(sizeof(Interval));
	iv->time = ms * 1000;
	return IntervalPGetDatum(iv);
}

#define CACHES_COLS_1_3	18
#define CACHES_COLS		20		/* 1.3.1: state, last_error */

/* A cache as the view shows it: its registration and its counters. */
typedef struct CacheRowCopy
{
	PcCacheReg	reg;
	bool		published;		/* a slot holds it */
	bool		open;			/* and its keys are routed to it */
	bool		closing;		/* a slot of a cache the registry has not */
	bool		published_may_read; /* the current user may read that slot */
	uint64		counters[PC_CACHE_NUM_COUNTERS];
} CacheRowCopy;

/*
 * The published slot of the cache reg (the same name and creation time):
 * its counters, and whether the current user may read it as published.
 */
static void
join_slot(CacheRowCopy *row)
{
	PcCacheReg	published;

	row->published = false;
	memset(row->counters, 0, sizeof(row->counters));
	pc_lock_alone(pc_caches_shared->lock, LW_SHARED);
	for (int s = 0; s < PC_MAX_CACHES; s++)
	{
		PcCacheSlot *slot = &pc_caches_shared->slots[s];

		if (!slot->in_use || slot->reg.created_at != row->reg.created_at ||
			strcmp(slot->reg.name, row->reg.name) != 0)
			continue;
		row->published = true;
		row->open = slot->open;
		published = slot->reg;
		for (int c = 0; c < PC_CACHE_NUM_COUNTERS; c++)
			row->counters[c] = pg_atomic_read_u64(&slot->counters[c]);
		break;
	}
	LWLockRelease(pc_caches_shared->lock);
	row->published_may_read = !row->published || pc_cache_may_read(&published);
}

/*
 * The caches the view shows: in projcache.database, the registry's rows as
 * the caller's snapshot sees them (a cache shows in the statement after
 * its create_cache), each joined to its published slot's counters; in
 * another database, the published slots.  Returns how many.
 */
static int
caches_for_view(CacheRowCopy *rows)
{
	PcCacheReg *regs = palloc0(sizeof(PcCacheReg) * PC_MAX_CACHES);
	int			n = -1;

	/* (a parallel worker cannot switch users: it reads what is published) */
	if (pc_database != NULL && !IsInParallelMode() &&
		strcmp(get_database_name(MyDatabaseId), pc_database) == 0)
		n = pc_caches_read_registry(regs, false);
	if (n >= 0)
	{
		int			nrows = n;

		for (int i = 0; i < n; i++)
		{
			rows[i].reg = regs[i];
			rows[i].closing = false;
			join_slot(&rows[i]);
		}

		/*
		 * And the slots of caches dropped, whose keys the worker has not
		 * cleared yet.
		 */
		pc_lock_alone(pc_caches_shared->lock, LW_SHARED);
		for (int s = 0; s < PC_MAX_CACHES; s++)
		{
			PcCacheSlot *slot = &pc_caches_shared->slots[s];
			bool		registered = false;

			if (!slot->in_use)
				continue;
			for (int i = 0; i < n && !registered; i++)
				registered = regs[i].created_at == slot->reg.created_at &&
					strcmp(regs[i].name, slot->reg.name) == 0;
			if (registered)
				continue;
			rows[nrows].reg = slot->reg;
			rows[nrows].published = rows[nrows].closing = true;
			rows[nrows].open = slot->open;
			for (int c = 0; c < PC_CACHE_NUM_COUNTERS; c++)
				rows[nrows].counters[c] = pg_atomic_read_u64(&slot->counters[c]);
			nrows++;
		}
		LWLockRelease(pc_caches_shared->lock);
		for (int i = n; i < nrows; i++)
			rows[i].published_may_read = true;
		pfree(regs);
		return nrows;
	}
	pfree(regs);

	n = 0;
	pc_lock_alone(pc_caches_shared->lock, LW_SHARED);
	for (int s = 0; s < PC_MAX_CACHES; s++)
	{
		PcCacheSlot *slot = &pc_caches_shared->slots[s];

		if (!slot->in_use)
			continue;
		rows[n].reg = slot->reg;
		rows[n].published = true;
		rows[n].open = slot->open;
		rows[n].closing = false;
		for (int c = 0; c < PC_CACHE_NUM_COUNTERS; c++)
			rows[n].counters[c] = pg_atomic_read_u64(&slot->counters[c]);
		n++;
	}
	LWLockRelease(pc_caches_shared->lock);
	for (int i = 0; i < n; i++)
		rows[i].published_may_read = true;
	return n;
}

/*
 * projcache.caches: one row for each named cache the current user may
 * read (pc_cache_may_read()), by its registration and, once published, by
 * the published copy too (a revoke narrows that at its commit, and an
 * older snapshot must not see past it); a NULL setting follows the
 * server's.  caches_1_3() has the columns up to evictions; since 1.3.1,
 * state says whether the worker has opened the cache (its keys are
 * routed to it: "open"), not yet ("opening"), or could bind it to no
 * function ("put_aside", and last_error says why), and a dropped cache is
 * listed ("closing") until the worker has cleared its keys.
 */
Datum
projcache_caches(PG_FUNCTION_ARGS)
{
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	CacheRowCopy *rows;
	int			n;
	int			ncols;

	pc_require_loaded();
	InitMaterializedSRF(fcinfo, 0);
	ncols = rsinfo->setDesc->natts;
	if (ncols != CACHES_COLS && ncols != CACHES_COLS_1_3)
		elog(ERROR, "projcache.caches has %d columns, not %d or %d", ncols,
			 CACHES_COLS_1_3, CACHES_COLS);

	/* The registry's caches, and as many slots of dropped ones */
	rows = palloc(sizeof(CacheRowCopy) * 2 * PC_MAX_CACHES);
	n = caches_for_view(rows);
	for (int i = 0; i < n; i++)
	{
		const PcCacheReg *reg = &rows[i].reg;
		const uint64 *ctr = rows[i].counters;
		Datum		values[CACHES_COLS];
		bool		nulls[CACHES_COLS] = {false};
		int			col = 0;

		if (!rows[i].published_may_read || !pc_cache_may_read(reg))
			continue;
		values[col++] = CStringGetTextDatum(reg->name);
		values[col++] = ObjectIdGetDatum(reg->owner);
		values[col++] = CStringGetTextDatum(reg->fetch_function);
		nulls[col] = !OidIsValid(reg->fetch_role);
		values[col++] = ObjectIdGetDatum(reg->fetch_role);
		values[col] = ms_interval(reg->expiry_ms, &nulls[col]);
		col++;
		values[col] = ms_interval(reg->grace_period_ms, &nulls[col]);
		col++;
		values[col] = ms_interval(reg->refresh_interval_ms, &nulls[col]);
		col++;
		values[col] = ms_interval(reg->max_retry_backoff_ms, &nulls[col]);
		col++;
		nulls[col] = reg->batch_size == PC_CACHE_SETTING_UNSET;
		values[col++] = Int32GetDatum((int32) reg->batch_size);
		values[col] = ms_interval(reg->fetch_timeout_ms, &nulls[col]);
		col++;
		nulls[col] = reg->max_memory == PC_CACHE_SETTING_UNSET;
		values[col++] = Int64GetDatum(reg->max_memory);
		values[col++] = Int64GetDatum((int64) ctr[PC_CACHE_MEMORY_USED]);
		values[col++] = Int64GetDatum((int64) ctr[PC_CACHE_ENTRIES]);
		values[col++] = Int64GetDatum((int64) ctr[PC_CACHE_HITS]);
		values[col++] = Int64GetDatum((int64) ctr[PC_CACHE_MISSES]);
		values[col++] = Int64GetDatum((int64) ctr[PC_CACHE_FETCH_CALLS]);
		values[col++] = Int64GetDatum((int64) ctr[PC_CACHE_FETCH_ERRORS]);
		values[col++] = Int64GetDatum((int64) ctr[PC_CACHE_EVICTIONS]);
		Assert(col == CACHES_COLS_1_3);
		/* Since 1.3.1 */
		values[col++] = CStringGetTextDatum(rows[i].closing ? "closing" :
											reg->bind_error[0] != '\0' ?
											"put_aside" :
											rows[i].published && rows[i].open ?
											"open" : "opening");
		nulls[col] = reg->bind_error[0] == '\0';
		if (!nulls[col])
			values[col] = CStringGetTextDatum(reg->bind_error);
		col++;
		tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, values,
							 nulls);
	}
	return (Datum) 0;
}
