/*-------------------------------------------------------------------------
 *
 * keycache_fetch.h
 *	  What the fetch call's files tell one another: keycache_fetch.c (the
 *	  call) and keycache_fetch_query.c (which function it calls, and the
 *	  query that calls it).  No other file includes it.
 *
 * Copyright (c) 2026, projcache developers
 *
 *-------------------------------------------------------------------------
 */
#ifndef PROJCACHE_KEYCACHE_FETCH_H
#define PROJCACHE_KEYCACHE_FETCH_H

#include "nodes/parsenodes.h"

#include "keycache.h"

/*
 * An optional period column of the fetch function's result: max_age or
 * stale_for.  fetch_query() finds it by name and says where it is.
 */
typedef struct PeriodColumn
{
	const char *name;
	const char *setting;		/* what applies when it gives none */
	int			attnum;			/* in the query result; 0: not selected */
	char	   *problem;		/* why it is unusable for every key, or NULL */
} PeriodColumn;

#define NUM_PERIOD_COLUMNS	2

/* What the call's query is shown as (pg_stat_activity, error context). */
#define PC_FETCH_QUERY_TEXT \
	"SELECT f.key::text, f.state::text, f.revision::text, f.config::jsonb" \
	" FROM <fetch function>($1, $2) AS f(key, state, revision, config)"

extern void pc_fetch_period_columns_init(PeriodColumn *cols);
extern Oid	pc_fetch_target_function(const PcFetchTarget *target, Oid *roleid);
extern Query *pc_fetch_query(Oid fn, PeriodColumn *cols);

#endif							/* PROJCACHE_KEYCACHE_FETCH_H */
