/*-------------------------------------------------------------------------
 *
 * snapshot_sql.c
 *	  The snapshot cache's SQL functions: registering, reading, refreshing
 *	  and listing snapshots.
 *
 * A snapshot is a whole small table, loaded by one query and served as one
 * unit with a TTL.  Registrations live in projcache.snapshot_registry (one
 * per database, dumped by pg_dump); loaded rows live in shared slots
 * (snapshot_store.c).  Reading decides what to serve by these rules:
 *
 *	 - fast path: loaded and fetched within the TTL: copy it out, no query;
 *	 - after a first success: refresh when older than the TTL; on failure
 *	   WARN with the snapshot's age, count it, and serve the last good rows
 *	   for as long as the outage lasts, querying the source at most once per
 *	   TTL.  One backend refreshes while the others serve the last good
 *	   rows at once (a lease, stale-while-revalidate);
 *	 - cold start: at most one load per TTL window, claimed by a
 *	   compare-and-swap; a loser re-checks for rows the winner may have
 *	   published, else gets the "unavailable" error (SQLSTATE PC001) saying
 *	   when a retry is possible.  A failing cold load raises the same
 *	   SQLSTATE with the source's error as detail.
 *
 * Each snapshot is backed by a view, projcache.snapshot_<id>, owned by the
 * snapshot's owner: its query's names are bound when it is created (with
 * the creator's search path then), the objects it reads cannot be dropped
 * under it, dropping its owner is refused, and pg_dump and REASSIGN OWNED
 * carry it.  The owner of a snapshot is the owner of its view.  Loads run
 * in a background worker of their own (snapshot_load.c), so that no
 * reader's session shapes what every reader is served.
 *
 * Copyright (c) 2026, projcache developers
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/xact.h"
#include "catalog/dependency.h"
#include "catalog/pg_class.h"
#include "executor/executor.h"
#include "funcapi.h"
#include "miscadmin.h"
#include "utils/builtins.h"
#include "utils/lsyscache.h"
#include "utils/syscache.h"
#include "utils/timestamp.h"

#include "snapshot.h"
#include "wal.h"


PG_FUNCTION_INFO_V1(projcache_create_snapshot);
PG_FUNCTION_INFO_V1(projcache_drop_snapshot);
PG_FUNCTION_INFO_V1(projcache_grant_snapshot);
PG_FUNCTION_INFO_V1(projcache_revoke_snapshot);
PG_FUNCTION_INFO_V1(projcache_snapshot);
PG_FUNCTION_INFO_V1(projcache_snapshot_typed);
PG_FUNCTION_INFO_V1(projcache_refresh_snapshot);
PG_FUNCTION_INFO_V1(projcache_snapshots);
PG_FUNCTION_INFO_V1(projcache_bind_registrations);

/* ----------------------------------------------------------------
 * Loading
 * ----------------------------------------------------------------
 */

/*
 * A transaction that has written could publish its own uncommitted rows
 * to every backend: it must not load.
 */
static bool
may_load(void)
{
	return !TransactionIdIsValid(GetTopTransactionIdIfAny());
}

/*
 * Load and publish, in a load worker (snapshot_load.c).  Unless it
 * succeeded, *error and *sqlerrcode say why.
 */
static PcLoadStatus
load_and_publish(SnapReg *reg, PcSnapRef ref, char **error, int *sqlerrcode)
{
	if (reg->bind_error != NULL)
	{
		*sqlerrcode = ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE;
		*error = psprintf("its query could not be bound to a view when projcache was updated to 1.0.1: %s",
						  reg->bind_error);
		return PC_LOAD_REVOKED;
	}
	return pc_snap_load(reg->owner, reg->view, reg->query, reg->name,
						reg->natts, reg->coltypes, reg->key_attno, ref, error,
						sqlerrcode);
}

/*
 * The owner lost what the query needs (or the snapshot lost its view): the
 * cached rows are dropped at once, and neither the next dump nor the files
 * written before may give them back (a tombstone, snapshot_dump.c).
 */
static void
drop_for_lost_rights(SnapReg *reg, PcSnapRef ref, const char *error)
{
	if (pc_snap_record_lost_rights(ref, error, pc_now_ms()))
		pc_snap_bury(reg);
}

/* The same, and readers get this error. */
static void
report_revoked(SnapReg *reg, PcSnapRef ref, const char *error, int sqlerrcode)
{
	drop_for_lost_rights(reg, ref, error);
	ereport(ERROR,
			(errcode(sqlerrcode == ERRCODE_INSUFFICIENT_PRIVILEGE ||
					 sqlerrcode == ERRCODE_UNDEFINED_OBJECT ||
					 sqlerrcode == ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE ?
					 sqlerrcode : ERRCODE_INSUFFICIENT_PRIVILEGE),
			 errmsg("snapshot \"%s\" is no longer served", reg->name),
			 errdetail("%s", error),
			 errhint("The snapshot's owner must be able to run its query; otherwise drop the snapshot.")));
}

/*
 * A refresh failed and the last good rows keep serving: the one WARNING
 * for it, from a read's refresh and from refresh_snapshot() alike.  age_ms
 * is the age of those rows, or -1 if there are none.
 */
static void
warn_refresh_failed(SnapReg *reg, const char *error, int64 age_ms)
{
	if (age_ms >= 0)
		ereport(WARNING,
				(errcode(ERRCODE_PROJCACHE_SNAPSHOT_UNAVAILABLE),
				 errmsg("refresh of snapshot \"%s\" failed, serving the last good snapshot (age %lld s)",
						reg->name, (long long) (age_ms / 1000)),
				 errdetail("%s", error)));
	else
		ereport(WARNING,
				(errcode(ERRCODE_PROJCACHE_SNAPSHOT_UNAVAILABLE),
				 errmsg("refresh of snapshot \"%s\" failed, and it has no last good snapshot",
						reg->name),
				 errdetail("%s", error)));
}

/*
 * No load worker could be had (projcache.max_load_workers, its share per
 * role, or max_worker_processes).  That says nothing about the source:
 * nothing is recorded, and a cold start's window is given back.
 */
static void
report_no_load_worker(SnapReg *reg, const char *error)
{
	ereport(ERROR,
			(errcode(ERRCODE_CONFIGURATION_LIMIT_EXCEEDED),
			 errmsg("no load worker is free for snapshot \"%s\"",
					reg->name),
			 errdetail("%s", error),
			 errhint("Retry once a load has finished.")));
}

/* The same, when the last good rows serve instead. */
static void
warn_no_load_worker(SnapReg *reg, const char *error)
{
	ereport(WARNING,
			(errcode(ERRCODE_CONFIGURATION_LIMIT_EXCEEDED),
			 errmsg("no load worker is free to refresh snapshot \"%s\"",
					reg->name),
			 errdetail("%s; the last good snapshot is served meanwhile.",
					   error)));
}

/* ----------------------------------------------------------------
 * current(): the rows to serve, per the rules at the top of this file
 * ----------------------------------------------------------------
 */

static void
report_dropped(SnapReg *reg)
{
	ereport(ERROR,
			(errcode(ERRCODE_PROJCACHE_SNAPSHOT_UNAVAILABLE),
			 errmsg("snapshot \"%s\" was dropped while being read",
					reg->name)));
}

/*
 * The slot holds rows restored from the dump, and this read did not try
 * the load that must come before they are served: status says why (NONE:
 * no load was tried here, or its worker did not report).
 */
static void
report_awaiting_load(SnapReg *reg, PcLoadStatus status, const char *error)
{
	if (status == PC_LOAD_BUSY)
		report_no_load_worker(reg, error);
	if (error != NULL)
		ereport(ERROR,
				(errcode(ERRCODE_PROJCACHE_SNAPSHOT_UNAVAILABLE),
				 errmsg("load of snapshot \"%s\" failed", reg->name),
				 errdetail("%s", error),
				 errhint("Its rows from before the restart are served once a load as its owner has been tried.")));
	if (!may_load())
		ereport(ERROR,
				(errcode(ERRCODE_PROJCACHE_SNAPSHOT_UNAVAILABLE),
				 errmsg("snapshot \"%s\" is not loaded yet",
						reg->name),
				 errdetail("Its rows from before the restart are served once a load as its owner has been tried, and a transaction that has written data does not load snapshots."),
				 errhint("Read the snapshot before writing, or outside this transaction.")));
	ereport(ERROR,
			(errcode(ERRCODE_PROJCACHE_SNAPSHOT_UNAVAILABLE),
			 errmsg("snapshot \"%s\" is being loaded",
					reg->name),
			 errdetail("Its rows from before the restart are served once a load as its owner has been tried, and another session is trying it."),
			 errhint("Retry once that load has finished.")));
}

/*
 * Free the slots of this database whose registration is gone (dropped by
 * hand, or lost with a restored registry), so that running short of slots
 * is never permanent.  Slots of registrations never committed cannot
 * exist: a registration gets a slot only once it is committed (see
 * acquire_slot()).
 */
static void
reclaim_slots(void)
{
	ListCell   *lc;

	foreach(lc, pc_snap_slots_of(MyDatabaseId))
	{
		PcSnapKey  *key = (PcSnapKey *) lfirst(lc);
		SnapReg    *reg = pc_registry_lookup(key->name, true);

		if (reg == NULL || reg->id != key->reg_id ||
			reg->stamp != key->reg_stamp)
			pc_snap_forget(MyDatabaseId, key->name, key->reg_id,
						   key->reg_stamp);
	}
}

/*
 * The slot of a registration.  One registered by this very transaction
 * gets none: the transaction may still abort, and its slot would then be
 * held by nobody.  (It could not be loaded anyway: the transaction has
 * written.)
 */
static PcSnapRef
acquire_slot(SnapReg *reg)
{
	PcSnapRef	ref;

	if (reg->created_here)
		ereport(ERROR,
				(errcode(ERRCODE_PROJCACHE_SNAPSHOT_UNAVAILABLE),
				 errmsg("snapshot \"%s\" is not loaded yet",
						reg->name),
				 errdetail("It was created by this transaction; it is loaded after that commits.")));
	ref = pc_snap_acquire(MyDatabaseId, reg->name, reg->id, reg->stamp,
						  reg->owner, true);
	if (ref.index >= 0)
		return ref;
	reclaim_slots();
	return pc_snap_acquire(MyDatabaseId, reg->name, reg->id, reg->stamp,
						   reg->owner, false);
}

/*
 * Refresh the snapshot as the holder of its lease (unless it was refreshed
 * before the lease was taken), drop the lease, and say what failed.
 * Returns the load's status (PC_LOAD_NONE if none ran, or if the worker
 * did not report, which sets *error).
 */
static PcLoadStatus
refresh_as_lease_holder(SnapReg *reg, PcSnapRef ref, int64 now, char **blob,
						Size *size, int64 *nrows, char **error,
						int *sqlerrcode)
{
	volatile PcLoadStatus status = PC_LOAD_NONE;

	/*
	 * On FATAL the lease dies with this backend (see lease_take).  PG_CATCH
	 * and a rethrow, not PG_FINALLY, whose flag GCC takes for one a longjmp
	 * may clobber (-Wclobbered).
	 */
	PG_TRY();
	{
		/* It may have been refreshed before we took the lease. */
		if (!pc_snap_copy(ref, now, reg->ttl_ms, true, blob, size, nrows))
			status = load_and_publish(reg, ref, error, sqlerrcode);
	}
	PG_CATCH();
	{
		pc_snap_lease_drop(ref);
		PG_RE_THROW();
	}
	PG_END_TRY();
	pc_snap_lease_drop(ref);
	if (status == PC_LOAD_REVOKED)
		report_revoked(reg, ref, *error, *sqlerrcode);
	/* (NONE with an error: the worker did not report) */
	if (status == PC_LOAD_FAILED ||
		(status == PC_LOAD_NONE && *error != NULL))
	{
		bool		checked = status == PC_LOAD_FAILED;
		int64		age = pc_snap_record_failure(ref, *error, pc_now_ms(),
												 checked);

		/* (none served: restored rows whose load did not report) */
		if (age >= 0)
			warn_refresh_failed(reg, *error, age);
	}
	if (status == PC_LOAD_BUSY && !pc_snap_awaits_load(ref))
		warn_no_load_worker(reg, *error);
	return status;
}

/* A cold start lost the claim: PC001, with when to retry. */
static void
report_throttled(SnapReg *reg, int64 now, int64 since)
{
	int64		wait_ms = reg->ttl_ms;

	if (since != PC_NEVER)
		wait_ms = Max(reg->ttl_ms - (now - since), 0);
	ereport(ERROR,
			(errcode(ERRCODE_PROJCACHE_SNAPSHOT_UNAVAILABLE),
			 errmsg("snapshot \"%s\" unavailable, retry available in %lld seconds",
					reg->name, (long long) ((wait_ms + 999) / 1000)),
			 errdetail("Its cold-start loads are throttled: it has not been loaded yet, and its last load attempt was less than its TTL ago.")));
}

/*
 * A cold start that won the claim (made at now; the attempt before it was
 * at prev_attempt): load the snapshot and return its rows, or raise PC001.
 * A cancelled load, or one no load worker could run, gives the window
 * back.
 */
static void
load_cold(SnapReg *reg, PcSnapRef ref, int64 now, int64 prev_attempt,
		  char **blob, Size *size, int64 *nrows)
{
	volatile PcLoadStatus status = PC_LOAD_NONE;
	char	   *error = NULL;
	int			sqlerrcode = 0;

	PG_TRY();
	{
		status = load_and_publish(reg, ref, &error, &sqlerrcode);
	}
	PG_CATCH();
	{
		pc_snap_cold_unclaim(ref, now, prev_attempt);
		PG_RE_THROW();
	}
	PG_END_TRY();
	if (status == PC_LOAD_BUSY)
	{
		pc_snap_cold_unclaim(ref, now, prev_attempt);
		report_no_load_worker(reg, error);
	}

	/*
	 * No rows to drop yet: lost rights fail like the source, with PC001, and
	 * bury the registration's dumped rows.
	 */
	if (status == PC_LOAD_REVOKED)
		drop_for_lost_rights(reg, ref, error);
	else if (status != PC_LOAD_OK)
	{
		/*
		 * Rows restored by another reader meanwhile are the last good ones
		 * now, if this was a load as the owner that found its rights intact.
		 */
		int64		age = pc_snap_record_failure(ref, error, pc_now_ms(),
												 status == PC_LOAD_FAILED);

		if (age >= 0 &&
			pc_snap_copy(ref, now, reg->ttl_ms, false, blob, size, nrows))
		{
			warn_refresh_failed(reg, error, age);
			return;
		}
	}
	if (status != PC_LOAD_OK)
	{
		ereport(ERROR,
				(errcode(ERRCODE_PROJCACHE_SNAPSHOT_UNAVAILABLE),
				 errmsg("first load of snapshot \"%s\" failed",
						reg->name),
				 errdetail("%s", error),
				 errhint("Retry in %lld seconds.",
						 (long long) ((reg->ttl_ms + 999) / 1000))));
	}
	if (!pc_snap_copy(ref, now, reg->ttl_ms, false, blob, size, nrows))
		report_dropped(reg);
}

/*
 * The rows a read serves, per the rules at the top of this file: the fast
 * path within the TTL; after a first success, one refresher (the lease
 * holder) while everyone else is served the last good rows, which stay
 * after a failing refresh but not after lost rights; before any success,
 * one cold load per TTL window, and PC001 for the others.  Rows restored
 * from the dump are stale and are served only once a load as the owner
 * was tried (snapshot_dump.c says why): the read that restores them, or
 * the next one to get the lease, loads at once.  The others wait for that
 * load, up to projcache.restore_wait, and are then served by its outcome
 * (the rows, unless the owner lost its rights); so do readers that come
 * while another one is reading the dump for the rows.  Only past that
 * wait do they get PC001.
 */
void
pc_snap_current_rows(SnapReg *reg, char **blob, Size *size, int64 *nrows)
{
	PcSnapRef	ref = acquire_slot(reg);
	int64		deadline = pc_real_now_ms() + Max(pc_restore_wait_ms, 0);
	int64		now;
	bool		loaded;
	char	   *error = NULL;
	int			sqlerrcode = 0;
	int64		since = PC_NEVER;
	int64		prev_attempt = PC_NEVER;
	PcLoadStatus status = PC_LOAD_NONE;

retry:
	for (;;)
	{
		/* A read that tried a load itself waits for nobody. */
		bool		may_wait = status == PC_LOAD_NONE && error == NULL;

		now = pc_now_ms();
		/* Fast path: fetched within the TTL, no query. */
		if (pc_snap_copy(ref, now, reg->ttl_ms, true, blob, size, nrows))
			return;

		(void) pc_snap_is_fresh(ref, now, reg->ttl_ms, &loaded);
		/* No rows yet: the last good ones from before a restart, if dumped. */
		if (!loaded && !pc_snap_restore(reg, ref) && may_wait &&
			pc_snap_wait_restore(ref, deadline) == PC_SNAP_WAIT_WOKEN)
			continue;			/* another reader looked at the dump */
		if (!loaded)
			(void) pc_snap_is_fresh(ref, now, reg->ttl_ms, &loaded);
		if (!loaded)
			break;

		/*
		 * Someone else is refreshing, or this transaction may not load: serve
		 * the last good rows now.  (The lease lasts one TTL at most: at most
		 * one refresh per TTL runs even if its holder hangs.)
		 */
		if (may_wait && may_load() && pc_snap_lease_take(ref, now, reg->ttl_ms))
			status = refresh_as_lease_holder(reg, ref, now, blob, size, nrows,
											 &error, &sqlerrcode);
		if (pc_snap_copy(ref, now, reg->ttl_ms, false, blob, size, nrows))
			return;
		if (pc_snap_awaits_load(ref))
		{
			/*
			 * Another session tries their first load: wait for it.  If it
			 * dropped the lease since this read failed to take it (it was
			 * cancelled, say), nobody tries it: try it here.
			 */
			if (status == PC_LOAD_NONE && error == NULL)
			{
				PcSnapWait	waited = pc_snap_wait_restore(ref, deadline);

				if (waited == PC_SNAP_WAIT_WOKEN ||
					(waited == PC_SNAP_WAIT_LEASE_FREE && may_load()))
					continue;
			}
			report_awaiting_load(reg, status, error);
		}
		report_dropped(reg);
	}

	/* Cold start: one load per TTL window. */
	if (!may_load())
		ereport(ERROR,
				(errcode(ERRCODE_PROJCACHE_SNAPSHOT_UNAVAILABLE),
				 errmsg("snapshot \"%s\" is not loaded yet",
						reg->name),
				 errdetail("A transaction that has written data does not load snapshots."),
				 errhint("Read the snapshot before writing, or outside this transaction.")));

	switch (pc_snap_cold_claim(ref, now, reg->ttl_ms, &since, &prev_attempt))
	{
		case PC_CLAIM_GONE:
			report_dropped(reg);
			break;
		case PC_CLAIM_THROTTLED:
			{
				/*
				 * The winner may have published by now; or rows restored
				 * meanwhile await their first load: read them as a read that
				 * found them would.
				 */
				if (pc_snap_copy(ref, now, reg->ttl_ms, false,
								 blob, size, nrows))
					return;
				if (pc_snap_awaits_load(ref))
					goto retry;
				report_throttled(reg, now, since);
			}
			break;
		case PC_CLAIM_WON:
			break;
	}

	/* Won: load it. */
	load_cold(reg, ref, now, prev_attempt, blob, size, nrows);
}

/* ----------------------------------------------------------------
 * Reading: projcache.snapshot() and refresh_snapshot()
 * ----------------------------------------------------------------
 */

/*
 * A stored row (in stored, a slot of the registered row type) in the
 * layout of out, a row type with dropped columns: each value at its
 * column's place, NULL at the dropped ones.
 */
void
pc_snap_place_values(TupleDesc out, TupleTableSlot *stored, Datum *values,
					 bool *nulls)
{
	int			src = 0;
	int			a;

	slot_getallattrs(stored);
	for (a = 0; a < out->natts; a++)
	{
		if (TupleDescAttr(out, a)->attisdropped)
		{
			values[a] = (Datum) 0;
			nulls[a] = true;
			continue;
		}
		values[a] = stored->tts_values[src];
		nulls[a] = stored->tts_isnull[src];
		src++;
	}
}

/* Put the copied rows into the SRF's tuplestore, shaped as desc. */
static void
emit_rows(ReturnSetInfo *rsinfo, SnapReg *reg, const char *blob, Size size,
		  int64 nrows)
{
	TupleDesc	out = rsinfo->setDesc;
	bool		same_shape = out->natts == reg->natts;
	TupleTableSlot *slot;
	Datum	   *values = NULL;
	bool	   *nulls = NULL;
	Size		off = 0;
	int64		i;

	/* A row type with dropped columns needs its values placed. */
	if (same_shape)
		slot = MakeSingleTupleTableSlot(out, &TTSOpsMinimalTuple);
	else
	{
		/* (a descriptor built from the catalogs: only when needed) */
		slot = MakeSingleTupleTableSlot(pc_snap_registered_desc(reg),
										&TTSOpsMinimalTuple);
		values = palloc0(out->natts * sizeof(Datum));
		nulls = palloc(out->natts * sizeof(bool));
	}

	for (i = 0; i < nrows && off < size; i++)
	{
		MinimalTuple mt = (MinimalTuple) (blob + off);

		off += MAXALIGN(mt->t_len);
		ExecStoreMinimalTuple(mt, slot, false);
		if (same_shape)
			tuplestore_puttupleslot(rsinfo->setResult, slot);
		else
		{
			pc_snap_place_values(out, slot, values, nulls);
			tuplestore_putvalues(rsinfo->setResult, out, values, nulls);
		}
		ExecClearTuple(slot);
	}
	ExecDropSingleTupleTableSlot(slot);
}

/*
 * Both forms of projcache.snapshot(): check the caller's grant and column
 * list, get the rows to serve, and emit them.
 */
static Datum
snapshot_srf(FunctionCallInfo fcinfo, bool typed)
{
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	char	   *name;
	SnapReg    *reg;
	char	   *blob;
	Size		size;
	int64		nrows;

	pc_require_loaded();
	if (typed && get_call_result_type(fcinfo, NULL, NULL) != TYPEFUNC_COMPOSITE)
		ereport(ERROR,
				(errcode(ERRCODE_DATATYPE_MISMATCH),
				 errmsg("rowtype must be a row type"),
				 errhint("Pass a NULL of the snapshot's row type, e.g. NULL::my_table.")));
	InitMaterializedSRF(fcinfo, typed ? 0 : MAT_SRF_USE_EXPECTED_DESC);
	if (PG_ARGISNULL(0))
		return (Datum) 0;		/* no snapshot, no rows */
	name = text_to_cstring(PG_GETARG_TEXT_PP(0));
	/* Cached: no catalog work per read while nothing changed. */
	reg = pc_registry_lookup_for_read(name, false);
	if (!pc_snap_desc_matches(reg, rsinfo->setDesc))
		ereport(ERROR,
				(errcode(ERRCODE_DATATYPE_MISMATCH),
				 errmsg("column list does not match snapshot \"%s\"", name),
				 errdetail("Snapshot \"%s\" returns %s.", name,
						   pc_snap_describe_columns(reg))));

	pc_snap_current_rows(reg, &blob, &size, &nrows);
	emit_rows(rsinfo, reg, blob, size, nrows);
	pc_snap_trim_local_copy();
	return (Datum) 0;
}

/* projcache.snapshot(name text) → SETOF record */
Datum
projcache_snapshot(PG_FUNCTION_ARGS)
{
	return snapshot_srf(fcinfo, false);
}

/* projcache.snapshot(name text, rowtype anyelement) → SETOF anyelement */
Datum
projcache_snapshot_typed(PG_FUNCTION_ARGS)
{
	return snapshot_srf(fcinfo, true);
}

/*
 * projcache.refresh_snapshot(name text) → boolean: load now, whatever the
 * TTL.
 */
Datum
projcache_refresh_snapshot(PG_FUNCTION_ARGS)
{
	char	   *name;
	SnapReg    *reg;
	PcSnapRef	ref;
	char	   *error = NULL;
	int			sqlerrcode = 0;
	PcLoadStatus status;

	pc_require_loaded();
	name = text_to_cstring(PG_GETARG_TEXT_PP(0));
	reg = pc_registry_lookup(name, false);
	pc_snap_check_reader(reg);
	if (!may_load())
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_TRANSACTION_STATE),
				 errmsg("cannot refresh snapshot \"%s\" in a transaction that has written data",
						reg->name),
				 errdetail("The load would publish the transaction's uncommitted changes.")));
	/* The standbys load it again on their next read, whatever happens here. */
	pc_wal_log_refresh(MyDatabaseId, reg->name);
	ref = acquire_slot(reg);

	/*
	 * Rows from before a restart, as a read would find them: the last good
	 * ones should the source fail, and buried with the others if the owner
	 * lost its rights.
	 */
	(void) pc_snap_restore(reg, ref);
	status = load_and_publish(reg, ref, &error, &sqlerrcode);
	switch (status)
	{
		case PC_LOAD_OK:
			PG_RETURN_BOOL(true);
		case PC_LOAD_REVOKED:
			report_revoked(reg, ref, error, sqlerrcode);
			break;
		case PC_LOAD_BUSY:
			report_no_load_worker(reg, error);
			break;
		default:
			break;
	}
	warn_refresh_failed(reg, error,
						pc_snap_record_failure(ref, error, pc_now_ms(),
											   status == PC_LOAD_FAILED));
	PG_RETURN_BOOL(false);
}

/* ----------------------------------------------------------------
 * Registering, dropping and granting, through the registry's own
 * functions (snapshot_registry.c)
 * ----------------------------------------------------------------
 */

/*
 * The key column named by create_snapshot(): a result column whose type has
 * a default hash opclass (the index hashes with it, and equality pushed
 * down to it is that type's own).
 */
static void
check_key_column(const char *key, TupleDesc desc)
{
	int			i;

	for (i = 0; i < desc->natts; i++)
	{
		Form_pg_attribute att = TupleDescAttr(desc, i);

		if (strcmp(NameStr(att->attname), key) != 0)
			continue;
		if (!pc_snap_key_hashable(att->atttypid))
			ereport(ERROR,
					(errcode(ERRCODE_UNDEFINED_FUNCTION),
					 errmsg("column \"%s\" of type %s cannot be a snapshot's key",
							key, format_type_be(att->atttypid)),
					 errdetail("The key index needs a default hash operator class for the type.")));
		return;
	}
	ereport(ERROR,
			(errcode(ERRCODE_UNDEFINED_COLUMN),
			 errmsg("key \"%s\" is not a column of the snapshot query", key)));
}

/*
 * projcache.create_snapshot(name text, query text, ttl interval DEFAULT
 * '60s', key text DEFAULT NULL); under the 1.0 and 1.0.1 SQL, without key.
 */
Datum
projcache_create_snapshot(PG_FUNCTION_ARGS)
{
	char	   *name;
	char	   *query;
	char	   *search_path;
	char	   *key = NULL;
	Interval   *ttl;
	TupleDesc	desc;
	bool		with_views;
	int64		id;
	Oid			view;

	pc_require_loaded();
	if (PG_ARGISNULL(0) || PG_ARGISNULL(1) || PG_ARGISNULL(2))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("snapshot name, query and ttl must not be NULL")));
	name = pc_snap_check_name(PG_GETARG_TEXT_PP(0));
	query = text_to_cstring(PG_GETARG_TEXT_PP(1));
	ttl = PG_GETARG_INTERVAL_P(2);
	(void) pc_snap_check_ttl(ttl);

	if (pc_registry_lookup(name, true) != NULL)
		ereport(ERROR,
				(errcode(ERRCODE_DUPLICATE_OBJECT),
				 errmsg("snapshot \"%s\" already exists", name)));

	/* Under the 1.0 SQL, queries are analyzed as 1.0 did; no view. */
	with_views = pc_registry_has_views();
	search_path = with_views ? pc_snap_creator_search_path() :
		pstrdup(SAFE_SEARCH_PATH);
	desc = pc_snap_check_query(query, search_path);
	if (PG_NARGS() >= 4 && !PG_ARGISNULL(3))
	{
		key = text_to_cstring(PG_GETARG_TEXT_PP(3));
		check_key_column(key, desc);
	}

	id = pc_registry_next_id();
	view = with_views ?
		pc_snap_create_view(id, name, query, search_path, GetUserId()) :
		InvalidOid;
	if (!pc_registry_insert(id, name, query, ttl, GetUserId(), desc, view,
							key))
		ereport(ERROR,
				(errcode(ERRCODE_DUPLICATE_OBJECT),
				 errmsg("snapshot \"%s\" already exists", name)));
	pc_snap_remember_created(id);
	PG_RETURN_VOID();
}

/* Bind one registration to a view, for pc_run_in_subxact(). */
typedef struct BindArgs
{
	SnapReg    *reg;
	Oid			view;
} BindArgs;

static void
bind_registration(void *arg)
{
	BindArgs   *b = (BindArgs *) arg;

	b->view = pc_snap_create_view(b->reg->id, b->reg->name, b->reg->query,
								  "pg_catalog", b->reg->owner);
}

/*
 * projcache._bind_registrations(): used once, by the update script to
 * 1.0.1.  Each registration made under 1.0 gets its backing view, its query
 * bound with search_path = pg_catalog (1.0 analyzed it with pg_catalog,
 * pg_temp); one that cannot be bound keeps why in bind_error, and its reads
 * fail with that until it is created again.
 */
Datum
projcache_bind_registrations(PG_FUNCTION_ARGS)
{
	List	   *names = pc_registry_names(true);
	ListCell   *lc;

	pc_registry_changed();
	foreach(lc, names)
	{
		BindArgs	bind;
		ErrorData  *edata;

		bind.reg = pc_registry_lookup((char *) lfirst(lc), false);
		bind.view = InvalidOid;
		edata = pc_run_in_subxact(bind_registration, &bind);
		if (edata != NULL)
			ereport(WARNING,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("snapshot \"%s\" could not be bound to a view",
							bind.reg->name),
					 errdetail("%s", edata->message),
					 errhint("Its reads fail until it is dropped and created again.")));
		pc_registry_set_view(bind.reg->id,
							 edata != NULL ? InvalidOid : bind.view,
							 edata != NULL ? edata->message : NULL);
	}
	PG_RETURN_VOID();
}

/* projcache.drop_snapshot(name text): owner or superuser. */
Datum
projcache_drop_snapshot(PG_FUNCTION_ARGS)
{
	char	   *name;
	SnapReg    *reg;

	pc_require_loaded();
	name = text_to_cstring(PG_GETARG_TEXT_PP(0));
	reg = pc_registry_lookup(name, false);
	pc_snap_check_owner(reg);
	(void) pc_registry_delete(name);
	if (OidIsValid(reg->view) && get_rel_relkind(reg->view) == RELKIND_VIEW)
	{
		ObjectAddress view_addr;

		/* RESTRICT: a view of the owner's built on it says so. */
		ObjectAddressSet(view_addr, RelationRelationId, reg->view);
		performDeletion(&view_addr, DROP_RESTRICT, 0);
	}
	pc_snap_forget_at_commit(reg);
	PG_RETURN_VOID();
}

/*
 * grant_snapshot() and revoke_snapshot(): the snapshot's owner allows a
 * role to read it, or no longer.  A role must exist to be granted; one
 * that is gone can still be revoked.
 */
static void
change_readers(FunctionCallInfo fcinfo, bool grant)
{
	char	   *name;
	SnapReg    *reg;
	Oid			reader;

	pc_require_loaded();
	name = text_to_cstring(PG_GETARG_TEXT_PP(0));
	reader = PG_GETARG_OID(1);
	reg = pc_registry_lookup(name, false);
	pc_snap_check_owner(reg);
	if (grant && !SearchSysCacheExists1(AUTHOID, ObjectIdGetDatum(reader)))
		ereport(ERROR,
				(errcode(ERRCODE_UNDEFINED_OBJECT),
				 errmsg("role with OID %u does not exist", reader)));
	pc_registry_set_reader(name, reader, grant);
}

/* projcache.grant_snapshot(name text, reader regrole) */
Datum
projcache_grant_snapshot(PG_FUNCTION_ARGS)
{
	change_readers(fcinfo, true);
	PG_RETURN_VOID();
}

/* projcache.revoke_snapshot(name text, reader regrole) */
Datum
projcache_revoke_snapshot(PG_FUNCTION_ARGS)
{
	change_readers(fcinfo, false);
	PG_RETURN_VOID();
}

/* ----------------------------------------------------------------
 * The snapshots view
 * ----------------------------------------------------------------
 */

/* May the current user read a listed snapshot: pc_snap_may_read() of it. */
static bool
may_read_listed(const SnapRegSummary *listed)
{
	SnapReg		reg;

	memset(&reg, 0, sizeof(reg));
	reg.name = listed->name;
	reg.owner = listed->owner;
	reg.nreaders = listed->nreaders;
	reg.readers = listed->readers;
	return pc_snap_may_read(&reg);
}

/*
 * projcache.snapshots(): name, owner, ttl, rows, bytes, loaded_at, age,
 * last_attempt_at, refresh_errors, last_error, status
 */
Datum
projcache_snapshots(PG_FUNCTION_ARGS)
{
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	SnapRegSummary *regs;
	int64		now;
	int			nregs;
	int			i;

	pc_require_loaded();
	InitMaterializedSRF(fcinfo, 0);
	regs = pc_registry_list(&nregs);

	now = pc_now_ms();
	for (i = 0; i < nregs; i++)
	{
		PcSnapInfo	info;
		Datum		values[11];
		bool		nulls[11];
		const char *status;
		SnapRegSummary *r = &regs[i];
		bool		has_slot = pc_snap_describe(MyDatabaseId, r->name, r->id,
												r->stamp, &info);

		memset(nulls, true, sizeof(nulls));
		values[0] = CStringGetTextDatum(r->name);
		nulls[0] = false;
		values[1] = ObjectIdGetDatum(r->owner);
		nulls[1] = false;
		values[2] = IntervalPGetDatum(r->ttl);
		nulls[2] = false;
		values[3] = Int64GetDatum(has_slot && info.loaded ? info.rows : 0);
		nulls[3] = false;
		values[4] = Int64GetDatum(has_slot && info.loaded ? info.bytes : 0);
		nulls[4] = false;
		if (has_slot && info.loaded)
		{
			values[5] =
				TimestampTzGetDatum(pc_mono_to_timestamp(info.loaded_at_ms));
			nulls[5] = false;
			values[6] = pc_interval_from_ms(Max(now - info.loaded_at_ms, 0));
			nulls[6] = false;
		}
		if (has_slot && info.attempted)
		{
			values[7] =
				TimestampTzGetDatum(pc_mono_to_timestamp(info.last_attempt_ms));
			nulls[7] = false;
		}
		values[8] = Int64GetDatum(has_slot ? info.refresh_errors : 0);
		nulls[8] = false;
		/* The source's error may quote its rows: for readers only. */
		if (has_slot && info.last_error != NULL &&
			may_read_listed(r))
		{
			values[9] = CStringGetTextDatum(info.last_error);
			nulls[9] = false;
		}
		if (has_slot && info.last_failed)
			status = "failing";
		else if (!has_slot || !info.loaded)
			status = "cold";
		else if (!info.marked_stale && !info.restored &&
				 now - info.loaded_at_ms < r->ttl_ms)
			status = "fresh";
		else
			status = "stale";
		values[10] = CStringGetTextDatum(status);
		nulls[10] = false;
		tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, values, nulls);
	}
	return (Datum) 0;
}
