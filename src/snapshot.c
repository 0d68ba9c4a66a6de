/*-------------------------------------------------------------------------
 *
 * snapshot.c
 *	  The snapshot cache: registration, loading, and reading snapshots.
 *
 * A snapshot is a whole small table, loaded by one query and served as one
 * unit with a TTL.  Registrations live in projcache.snapshot_registry (one
 * per database, dumped by pg_dump); loaded rows live in shared slots
 * (snapshot_store.c).  Reading follows SnapshotSource::current() of the
 * reference design:
 *
 *	 - fast path: loaded and fetched within the TTL: copy it out, no query;
 *	 - after a first success: refresh when older than the TTL; on failure
 *	   WARN with the snapshot's age, count it, and serve the last good rows
 *	   for as long as the outage lasts, querying the source at most once per
 *	   TTL.  Unlike the seed, one backend refreshes while the others serve
 *	   the last good rows at once (a lease, stale-while-revalidate);
 *	 - cold start: at most one load per TTL window, claimed by a
 *	   compare-and-swap; a loser re-checks for rows the winner may have
 *	   published, else gets the "unavailable" error (SQLSTATE PC001) saying
 *	   when a retry is possible.  A failing cold load raises the same
 *	   SQLSTATE with the source's error as detail.
 *
 * The load runs the registered query as the snapshot's owner, with
 * search_path = pg_catalog, pg_temp, read-only, inside a subtransaction, so
 * its ERROR never aborts the caller's transaction.
 *
 * Copyright (c) 2026, projcache developers
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/detoast.h"
#include "access/htup_details.h"
#include "access/xact.h"
#include "catalog/pg_authid.h"
#include "catalog/pg_type.h"
#include "common/int.h"
#include "executor/executor.h"
#include "executor/spi.h"
#include "funcapi.h"
#include "lib/stringinfo.h"
#include "miscadmin.h"
#include "nodes/nodeFuncs.h"
#include "nodes/parsenodes.h"
#include "storage/ipc.h"
#include "utils/acl.h"
#include "utils/array.h"
#include "utils/builtins.h"
#include "utils/datum.h"
#include "utils/guc.h"
#include "utils/lsyscache.h"
#include "utils/memutils.h"
#include "utils/plancache.h"
#include "utils/resowner.h"
#include "utils/snapmgr.h"
#include "utils/syscache.h"
#include "utils/timestamp.h"

#include "projcache.h"

/* "snapshot unavailable": clients retry on this one code. */
#define ERRCODE_PROJCACHE_SNAPSHOT_UNAVAILABLE	MAKE_SQLSTATE('P','C','0','0','1')

#define SAFE_SEARCH_PATH "pg_catalog, pg_temp"

PG_FUNCTION_INFO_V1(projcache_create_snapshot);
PG_FUNCTION_INFO_V1(projcache_drop_snapshot);
PG_FUNCTION_INFO_V1(projcache_grant_snapshot);
PG_FUNCTION_INFO_V1(projcache_revoke_snapshot);
PG_FUNCTION_INFO_V1(projcache_snapshot);
PG_FUNCTION_INFO_V1(projcache_snapshot_typed);
PG_FUNCTION_INFO_V1(projcache_refresh_snapshot);
PG_FUNCTION_INFO_V1(projcache_snapshots);

/* One row of projcache.snapshot_registry. */
typedef struct SnapReg
{
	int64		id;
	int64		stamp;			/* created_at, in microseconds */
	char	   *name;
	char	   *query;
	int64		ttl_ms;
	Oid			owner;
	int			natts;
	char	  **colnames;
	Oid		   *coltypes;
	int			nreaders;
	Oid		   *readers;
} SnapReg;

/* Saved identity while running as another role with a safe search_path. */
typedef struct RoleSwitch
{
	Oid			save_userid;
	int			save_sec_context;
	int			save_nestlevel;
} RoleSwitch;

static void
switch_role(RoleSwitch *rs, Oid role)
{
	GetUserIdAndSecContext(&rs->save_userid, &rs->save_sec_context);
	SetUserIdAndSecContext(role, rs->save_sec_context |
						   SECURITY_LOCAL_USERID_CHANGE |
						   SECURITY_RESTRICTED_OPERATION);
	rs->save_nestlevel = NewGUCNestLevel();
	(void) set_config_option("search_path", SAFE_SEARCH_PATH,
							 PGC_USERSET, PGC_S_SESSION,
							 GUC_ACTION_SAVE, true, 0, false);
}

static void
restore_role(RoleSwitch *rs)
{
	AtEOXact_GUC(false, rs->save_nestlevel);
	SetUserIdAndSecContext(rs->save_userid, rs->save_sec_context);
}

/* ----------------------------------------------------------------
 * Argument checks
 * ----------------------------------------------------------------
 */

static char *
check_name(text *arg)
{
	char	   *name = text_to_cstring(arg);
	const char *p;

	if (name[0] == '\0' || strlen(name) >= NAMEDATALEN)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("invalid snapshot name \"%s\"", name),
				 errdetail("A snapshot name has 1 to %d characters.",
						   NAMEDATALEN - 1)));
	for (p = name; *p; p++)
	{
		if (!((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') ||
			  (*p >= '0' && *p <= '9') || *p == '_' || *p == '-' || *p == '.'))
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("invalid snapshot name \"%s\"", name),
					 errdetail("A snapshot name may contain only ASCII letters, digits, \"_\", \"-\" and \".\".")));
	}
	return name;
}

static int64
check_ttl(Interval *ttl)
{
	int64		usecs;

	if (ttl->month != 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("snapshot ttl must not be given in months"),
				 errdetail("Months have no fixed length.")));
	if (pg_mul_s64_overflow((int64) ttl->day, USECS_PER_DAY, &usecs) ||
		pg_add_s64_overflow(usecs, ttl->time, &usecs))
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("snapshot ttl is out of range")));
	if (usecs < 1000)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("snapshot ttl must be at least 1 millisecond")));
	return usecs / 1000;
}

/* ----------------------------------------------------------------
 * The registry
 * ----------------------------------------------------------------
 */

static Oid *
oid_array(Datum d, int *n)
{
	ArrayType  *arr = DatumGetArrayTypeP(d);
	Datum	   *elems;
	bool	   *nulls;
	Oid		   *oids;
	int			i;

	deconstruct_array(arr, OIDOID, sizeof(Oid), true, TYPALIGN_INT,
					  &elems, &nulls, n);
	oids = palloc(Max(*n, 1) * sizeof(Oid));
	for (i = 0; i < *n; i++)
		oids[i] = DatumGetObjectId(elems[i]);
	return oids;
}

static SPIPlanPtr registry_lookup_plan = NULL;

/*
 * Read a registration.  The registry is not readable by PUBLIC, so this
 * runs as the bootstrap superuser; the caller's own rights are checked
 * against what it returns.
 */
static SnapReg *
registry_lookup(const char *name, bool missing_ok)
{
	MemoryContext callercxt = CurrentMemoryContext;
	RoleSwitch	rs;
	Oid			argtypes[1] = {TEXTOID};
	Datum		args[1];
	SnapReg    *reg = NULL;
	int			ret;

	args[0] = CStringGetTextDatum(name);
	switch_role(&rs, BOOTSTRAP_SUPERUSERID);
	if (SPI_connect() != SPI_OK_CONNECT)
		elog(ERROR, "SPI_connect failed");
	/* Planned once per backend: every snapshot() call runs it. */
	if (registry_lookup_plan == NULL)
	{
		SPIPlanPtr	plan;

		plan = SPI_prepare("SELECT id, query,"
						   " (extract(epoch FROM ttl) * 1000)::int8,"
						   " owner::oid, column_names,"
						   " column_types::oid[], readers::oid[],"
						   " (extract(epoch FROM created_at) * 1000000)::int8"
						   " FROM projcache.snapshot_registry"
						   " WHERE name OPERATOR(pg_catalog.=) $1",
						   1, argtypes);
		if (plan == NULL)
			elog(ERROR, "could not plan the registry lookup: %s",
				 SPI_result_code_string(SPI_result));
		if (SPI_keepplan(plan) != 0)
			elog(ERROR, "SPI_keepplan failed");
		registry_lookup_plan = plan;
	}
	/* What is registered now, as for a catalog: not the caller's snapshot. */
	PushActiveSnapshot(GetLatestSnapshot());
	ret = SPI_execute_plan(registry_lookup_plan, args, NULL, true, 1);
	if (ret != SPI_OK_SELECT)
		elog(ERROR, "could not read projcache.snapshot_registry: %s",
			 SPI_result_code_string(ret));
	if (SPI_processed == 1)
	{
		HeapTuple	tup = SPI_tuptable->vals[0];
		TupleDesc	desc = SPI_tuptable->tupdesc;
		bool		isnull;
		MemoryContext oldcxt = MemoryContextSwitchTo(callercxt);
		ArrayType  *names;
		Datum	   *elems;
		int			n;
		int			i;

		reg = palloc0(sizeof(SnapReg));
		reg->id = DatumGetInt64(SPI_getbinval(tup, desc, 1, &isnull));
		reg->name = pstrdup(name);
		reg->query = TextDatumGetCString(SPI_getbinval(tup, desc, 2, &isnull));
		reg->ttl_ms = DatumGetInt64(SPI_getbinval(tup, desc, 3, &isnull));
		reg->owner = DatumGetObjectId(SPI_getbinval(tup, desc, 4, &isnull));
		names = DatumGetArrayTypeP(SPI_getbinval(tup, desc, 5, &isnull));
		deconstruct_array(names, TEXTOID, -1, false, TYPALIGN_INT,
						  &elems, NULL, &n);
		reg->natts = n;
		reg->colnames = palloc(Max(n, 1) * sizeof(char *));
		for (i = 0; i < n; i++)
			reg->colnames[i] = TextDatumGetCString(elems[i]);
		reg->coltypes = oid_array(SPI_getbinval(tup, desc, 6, &isnull), &n);
		reg->readers = oid_array(SPI_getbinval(tup, desc, 7, &isnull),
								 &reg->nreaders);
		reg->stamp = DatumGetInt64(SPI_getbinval(tup, desc, 8, &isnull));
		MemoryContextSwitchTo(oldcxt);
	}
	PopActiveSnapshot();
	SPI_finish();
	restore_role(&rs);

	if (reg == NULL && !missing_ok)
		ereport(ERROR,
				(errcode(ERRCODE_UNDEFINED_OBJECT),
				 errmsg("snapshot \"%s\" does not exist", name)));
	return reg;
}

/*
 * Run a statement on the registry as the bootstrap superuser.  Returns the
 * number of rows it affected.
 */
static uint64
registry_modify(const char *sql, int nargs, Oid *argtypes, Datum *args)
{
	RoleSwitch	rs;
	int			ret;
	uint64		nrows;

	switch_role(&rs, BOOTSTRAP_SUPERUSERID);
	if (SPI_connect() != SPI_OK_CONNECT)
		elog(ERROR, "SPI_connect failed");
	ret = SPI_execute_with_args(sql, nargs, argtypes, args, NULL, false, 0);
	if (ret < 0)
		elog(ERROR, "could not update projcache.snapshot_registry: %s",
			 SPI_result_code_string(ret));
	nrows = SPI_processed;
	SPI_finish();
	restore_role(&rs);
	return nrows;
}

static void
check_owner(SnapReg *reg)
{
	if (!has_privs_of_role(GetUserId(), reg->owner))
		ereport(ERROR,
				(errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
				 errmsg("must be owner of snapshot \"%s\"", reg->name)));
}

static void
check_reader(SnapReg *reg)
{
	Oid			me = GetUserId();
	int			i;

	if (has_privs_of_role(me, reg->owner))
		return;
	for (i = 0; i < reg->nreaders; i++)
		if (has_privs_of_role(me, reg->readers[i]))
			return;
	ereport(ERROR,
			(errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
			 errmsg("permission denied for snapshot \"%s\"", reg->name),
			 errhint("The snapshot's owner can allow it with projcache.grant_snapshot().")));
}

static TupleDesc
registered_desc(SnapReg *reg)
{
	TupleDesc	desc = CreateTemplateTupleDesc(reg->natts);
	int			i;

	for (i = 0; i < reg->natts; i++)
		TupleDescInitEntry(desc, (AttrNumber) (i + 1), reg->colnames[i],
						   reg->coltypes[i], -1, 0);
	return desc;
}

static char *
describe_columns(SnapReg *reg)
{
	StringInfoData buf;
	int			i;

	initStringInfo(&buf);
	appendStringInfoChar(&buf, '(');
	for (i = 0; i < reg->natts; i++)
		appendStringInfo(&buf, "%s%s %s", i > 0 ? ", " : "",
						 quote_identifier(reg->colnames[i]),
						 format_type_be(reg->coltypes[i]));
	appendStringInfoChar(&buf, ')');
	return buf.data;
}

/* Do the (non-dropped) columns of desc have the registered types? */
static bool
desc_matches(SnapReg *reg, TupleDesc desc)
{
	int			i;
	int			n = 0;

	for (i = 0; i < desc->natts; i++)
	{
		Form_pg_attribute att = TupleDescAttr(desc, i);

		if (att->attisdropped)
			continue;
		if (n >= reg->natts || att->atttypid != reg->coltypes[n])
			return false;
		n++;
	}
	return n == reg->natts;
}

/* ----------------------------------------------------------------
 * Loading
 * ----------------------------------------------------------------
 */

/*
 * Serialize the query's rows as MAXALIGNed MinimalTuples, with every value
 * detoasted so the rows stand on their own in shared memory.
 */
static void
serialize_rows(SPITupleTable *tuptable, uint64 nrows, StringInfo out)
{
	TupleDesc	desc = tuptable->tupdesc;
	Datum	   *values = palloc(desc->natts * sizeof(Datum));
	bool	   *nulls = palloc(desc->natts * sizeof(bool));
	bool	   *detoasted = palloc(desc->natts * sizeof(bool));
	uint64		row;
	int			i;

	for (row = 0; row < nrows; row++)
	{
		MinimalTuple mt;
		Size		pad;

		heap_deform_tuple(tuptable->vals[row], desc, values, nulls);
		for (i = 0; i < desc->natts; i++)
		{
			detoasted[i] = !nulls[i] && TupleDescAttr(desc, i)->attlen == -1 &&
				VARATT_IS_EXTERNAL(DatumGetPointer(values[i]));
			if (detoasted[i])
				values[i] = PointerGetDatum(detoast_external_attr((struct varlena *)
																  DatumGetPointer(values[i])));
		}
		mt = heap_form_minimal_tuple(desc, values, nulls);
		for (i = 0; i < desc->natts; i++)
			if (detoasted[i])
				pfree(DatumGetPointer(values[i]));
		appendBinaryStringInfo(out, (char *) mt, mt->t_len);
		pad = MAXALIGN(out->len) - out->len;
		while (pad-- > 0)
			appendStringInfoChar(out, '\0');
		pfree(mt);
	}
}

/*
 * Run the snapshot's query as its owner and serialize the rows into the
 * caller's memory context.  Returns false with *error set if anything went
 * wrong; never raises the query's ERROR.
 */
static bool
load_rows(SnapReg *reg, StringInfo out, int64 *nrows, char **error)
{
	MemoryContext callercxt = CurrentMemoryContext;
	ResourceOwner oldowner = CurrentResourceOwner;
	volatile bool ok = false;

	initStringInfo(out);
	BeginInternalSubTransaction(NULL);
	MemoryContextSwitchTo(callercxt);

	PG_TRY();
	{
		RoleSwitch	rs;
		int			ret;

		if (!SearchSysCacheExists1(AUTHOID, ObjectIdGetDatum(reg->owner)))
			ereport(ERROR,
					(errcode(ERRCODE_UNDEFINED_OBJECT),
					 errmsg("the owner of snapshot \"%s\" (role %u) no longer exists",
							reg->name, reg->owner),
					 errhint("Drop the snapshot and create it again.")));
		switch_role(&rs, reg->owner);
		if (SPI_connect() != SPI_OK_CONNECT)
			elog(ERROR, "SPI_connect failed");
		/* Load what is committed now, not what the caller's snapshot saw. */
		PushActiveSnapshot(GetLatestSnapshot());
		ret = SPI_execute(reg->query, true, 0);
		if (ret != SPI_OK_SELECT)
			ereport(ERROR,
					(errcode(ERRCODE_WRONG_OBJECT_TYPE),
					 errmsg("snapshot query did not return rows")));
		if (!desc_matches(reg, SPI_tuptable->tupdesc))
			ereport(ERROR,
					(errcode(ERRCODE_DATATYPE_MISMATCH),
					 errmsg("snapshot query no longer returns the registered columns %s",
							describe_columns(reg)),
					 errhint("Drop and create the snapshot again.")));
		{
			MemoryContext spicxt = MemoryContextSwitchTo(callercxt);

			*nrows = (int64) SPI_processed;
			serialize_rows(SPI_tuptable, SPI_processed, out);
			MemoryContextSwitchTo(spicxt);
		}
		PopActiveSnapshot();
		SPI_finish();
		restore_role(&rs);

		/*
		 * The rows are copied out: roll the subtransaction back, so that
		 * nothing the query did (a volatile function that writes) stays in
		 * the caller's transaction.
		 */
		RollbackAndReleaseCurrentSubTransaction();
		MemoryContextSwitchTo(callercxt);
		CurrentResourceOwner = oldowner;
		ok = true;
	}
	PG_CATCH();
	{
		ErrorData  *edata;

		MemoryContextSwitchTo(callercxt);
		edata = CopyErrorData();
		FlushErrorState();
		/* Also restores the user id, security context and GUCs. */
		RollbackAndReleaseCurrentSubTransaction();
		MemoryContextSwitchTo(callercxt);
		CurrentResourceOwner = oldowner;

		/*
		 * A cancel or statement timeout of this backend is the caller's, not
		 * the source's failure: it ends the caller's statement, as anywhere
		 * else.  (A remote server's timeout, passed on by dblink or
		 * postgres_fdw with the same SQLSTATE, is a source failure.)
		 */
		if (edata->sqlerrcode == ERRCODE_QUERY_CANCELED &&
			edata->funcname != NULL &&
			strcmp(edata->funcname, "ProcessInterrupts") == 0)
			ReThrowError(edata);
		*error = pstrdup(edata->message);
		FreeErrorData(edata);
	}
	PG_END_TRY();

	return ok;
}

/*
 * A transaction that has written could publish its own uncommitted rows
 * to every backend: it must not load.
 */
static bool
may_load(void)
{
	return !TransactionIdIsValid(GetTopTransactionIdIfAny());
}

/* Load and publish; false with *error set on failure of either. */
static bool
load_and_publish(SnapReg *reg, PcSnapRef ref, char **error)
{
	StringInfoData rows;
	int64		nrows = 0;

	if (!load_rows(reg, &rows, &nrows, error))
		return false;
	if (!pc_snap_publish(ref, rows.data, rows.len, nrows, pc_now_ms()))
	{
		*error = psprintf("snapshot of %d bytes does not fit in projcache.max_memory (%d kB; %zu bytes in use)",
						  rows.len, pc_max_memory_kb, pc_memory_used());
		pfree(rows.data);
		return false;
	}
	pfree(rows.data);
	return true;
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
			 errmsg("snapshot \"%s\" unavailable; it was dropped while being read",
					reg->name)));
}

static void
current_rows(SnapReg *reg, char **blob, Size *size, int64 *nrows)
{
	PcSnapRef	ref = pc_snap_acquire(MyDatabaseId, reg->name, reg->id, reg->stamp);
	int64		now = pc_now_ms();
	bool		loaded;
	char	   *error = NULL;
	int64		since = PC_NEVER;
	int64		prev_attempt = PC_NEVER;
	bool		ok = false;

	/* Fast path: fetched within the TTL, no query. */
	if (pc_snap_copy(ref, now, reg->ttl_ms, true, blob, size, nrows))
		return;

	(void) pc_snap_is_fresh(ref, now, reg->ttl_ms, &loaded);
	if (loaded)
	{
		/*
		 * Someone else is refreshing, or this transaction may not load:
		 * serve the last good rows now.  (The lease lasts one TTL at most:
		 * at most one refresh per TTL runs even if its holder hangs.)
		 */
		if (may_load() && pc_snap_lease_take(ref, now, reg->ttl_ms))
		{
			/* On FATAL the lease dies with this backend (see lease_take). */
			PG_TRY();
			{
				/* It may have been refreshed before we took the lease. */
				if (!pc_snap_copy(ref, now, reg->ttl_ms, true, blob, size, nrows) &&
					!load_and_publish(reg, ref, &error))
				{
					int64		age = pc_snap_record_failure(ref, error,
															 pc_now_ms());

					ereport(WARNING,
							(errcode(ERRCODE_PROJCACHE_SNAPSHOT_UNAVAILABLE),
							 errmsg("projcache snapshot \"%s\" refresh failed, serving the last good snapshot (age %lld s)",
									reg->name, (long long) (age / 1000)),
							 errdetail("%s", error)));
				}
			}
			PG_FINALLY();
			{
				pc_snap_lease_drop(ref);
			}
			PG_END_TRY();
		}
		if (pc_snap_copy(ref, now, reg->ttl_ms, false, blob, size, nrows))
			return;
		report_dropped(reg);
	}

	/* Cold start: one load per TTL window. */
	if (!may_load())
		ereport(ERROR,
				(errcode(ERRCODE_PROJCACHE_SNAPSHOT_UNAVAILABLE),
				 errmsg("snapshot \"%s\" unavailable; it is not loaded yet",
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
				int64		wait_ms = reg->ttl_ms;

				/* The winner may have published by now. */
				if (pc_snap_copy(ref, now, reg->ttl_ms, false, blob, size, nrows))
					return;
				if (since != PC_NEVER)
					wait_ms = Max(reg->ttl_ms - (now - since), 0);
				ereport(ERROR,
						(errcode(ERRCODE_PROJCACHE_SNAPSHOT_UNAVAILABLE),
						 errmsg("snapshot \"%s\" unavailable; cold-start retry throttled, retry available in %lld seconds",
								reg->name, (long long) ((wait_ms + 999) / 1000)),
						 errdetail("It has not been loaded yet, and its last load attempt was less than its TTL ago.")));
			}
			break;
		case PC_CLAIM_WON:
			break;
	}

	/* Won: load it.  A cancelled load gives the window back. */
	PG_TRY();
	{
		ok = load_and_publish(reg, ref, &error);
	}
	PG_CATCH();
	{
		pc_snap_cold_unclaim(ref, now, prev_attempt);
		PG_RE_THROW();
	}
	PG_END_TRY();
	if (!ok)
	{
		(void) pc_snap_record_failure(ref, error, pc_now_ms());
		ereport(ERROR,
				(errcode(ERRCODE_PROJCACHE_SNAPSHOT_UNAVAILABLE),
				 errmsg("snapshot \"%s\" unavailable; its first load failed",
						reg->name),
				 errdetail("%s", error),
				 errhint("Retry in %lld seconds.",
						 (long long) ((reg->ttl_ms + 999) / 1000))));
	}
	if (!pc_snap_copy(ref, now, reg->ttl_ms, false, blob, size, nrows))
		report_dropped(reg);
}

/* Put the copied rows into the SRF's tuplestore, shaped as desc. */
static void
emit_rows(ReturnSetInfo *rsinfo, SnapReg *reg, const char *blob, Size size,
		  int64 nrows)
{
	TupleDesc	stored = registered_desc(reg);
	TupleDesc	out = rsinfo->setDesc;
	bool		same_shape = out->natts == stored->natts;
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
		slot = MakeSingleTupleTableSlot(stored, &TTSOpsMinimalTuple);
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
			int			src = 0;
			int			a;

			slot_getallattrs(slot);
			for (a = 0; a < out->natts; a++)
			{
				if (TupleDescAttr(out, a)->attisdropped)
				{
					nulls[a] = true;
					continue;
				}
				values[a] = slot->tts_values[src];
				nulls[a] = slot->tts_isnull[src];
				src++;
			}
			tuplestore_putvalues(rsinfo->setResult, out, values, nulls);
		}
		ExecClearTuple(slot);
	}
	ExecDropSingleTupleTableSlot(slot);
}

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
	reg = registry_lookup(name, false);
	check_reader(reg);
	if (!desc_matches(reg, rsinfo->setDesc))
		ereport(ERROR,
				(errcode(ERRCODE_DATATYPE_MISMATCH),
				 errmsg("column list does not match snapshot \"%s\"", name),
				 errdetail("Snapshot \"%s\" returns %s.", name,
						   describe_columns(reg))));

	current_rows(reg, &blob, &size, &nrows);
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

/* projcache.refresh_snapshot(name text) → boolean: load now, whatever the TTL. */
Datum
projcache_refresh_snapshot(PG_FUNCTION_ARGS)
{
	char	   *name;
	SnapReg    *reg;
	PcSnapRef	ref;
	char	   *error = NULL;

	pc_require_loaded();
	name = text_to_cstring(PG_GETARG_TEXT_PP(0));
	reg = registry_lookup(name, false);
	check_reader(reg);
	if (!may_load())
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_TRANSACTION_STATE),
				 errmsg("cannot refresh snapshot \"%s\" in a transaction that has written data",
						reg->name),
				 errdetail("The load would publish the transaction's uncommitted changes.")));
	ref = pc_snap_acquire(MyDatabaseId, reg->name, reg->id, reg->stamp);
	if (load_and_publish(reg, ref, &error))
		PG_RETURN_BOOL(true);
	(void) pc_snap_record_failure(ref, error, pc_now_ms());
	ereport(WARNING,
			(errmsg("projcache snapshot \"%s\" refresh failed; the last good snapshot stays",
					reg->name),
			 errdetail("%s", error)));
	PG_RETURN_BOOL(false);
}

/* ----------------------------------------------------------------
 * Registration
 * ----------------------------------------------------------------
 */

/* Does a query, or any query inside it, write or lock rows? */
static bool
writes_or_locks(Node *node, void *context)
{
	if (node == NULL)
		return false;
	if (IsA(node, Query))
	{
		Query	   *q = (Query *) node;

		if (q->commandType != CMD_SELECT || q->hasModifyingCTE ||
			q->rowMarks != NIL)
			return true;
		return query_tree_walker(q, writes_or_locks, context, 0);
	}
	return expression_tree_walker(node, writes_or_locks, context);
}

/*
 * Check a snapshot query as the caller would run it: one read-only SELECT,
 * parsed and analyzed now, so a typo fails at registration.  Returns its
 * result columns.
 */
static TupleDesc
check_query(const char *query)
{
	MemoryContext callercxt = CurrentMemoryContext;
	RoleSwitch	rs;
	SPIPlanPtr	plan;
	List	   *sources;
	CachedPlanSource *ps;
	ListCell   *lc;
	TupleDesc	result;
	int			i;

	switch_role(&rs, GetUserId());
	if (SPI_connect() != SPI_OK_CONNECT)
		elog(ERROR, "SPI_connect failed");
	plan = SPI_prepare(query, 0, NULL);
	if (plan == NULL)
		elog(ERROR, "SPI_prepare failed: %s", SPI_result_code_string(SPI_result));
	sources = SPI_plan_get_plan_sources(plan);
	if (list_length(sources) != 1)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("snapshot query must be a single SELECT")));
	ps = linitial(sources);
	if (ps->resultDesc == NULL || ps->commandTag != CMDTAG_SELECT)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("snapshot query must be a SELECT that returns rows")));
	foreach(lc, ps->query_list)
	{
		if (writes_or_locks((Node *) lfirst_node(Query, lc), NULL))
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("snapshot query must be read-only"),
					 errdetail("It must not write, nor lock rows with FOR UPDATE or FOR SHARE, at any level.")));
	}
	for (i = 0; i < ps->resultDesc->natts; i++)
	{
		Form_pg_attribute att = TupleDescAttr(ps->resultDesc, i);

		if (get_typtype(att->atttypid) == TYPTYPE_PSEUDO)
			ereport(ERROR,
					(errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
					 errmsg("snapshot column \"%s\" has pseudo-type %s",
							NameStr(att->attname), format_type_be(att->atttypid))));
	}
	MemoryContextSwitchTo(callercxt);
	result = CreateTupleDescCopy(ps->resultDesc);
	SPI_finish();
	restore_role(&rs);
	return result;
}

/* projcache.create_snapshot(name text, query text, ttl interval DEFAULT '60s') */
Datum
projcache_create_snapshot(PG_FUNCTION_ARGS)
{
	char	   *name;
	char	   *query;
	Interval   *ttl;
	TupleDesc	desc;
	Datum	   *names;
	Datum	   *types;
	Oid			argtypes[6] = {TEXTOID, TEXTOID, INTERVALOID, OIDOID,
	TEXTARRAYOID, OIDARRAYOID};
	Datum		args[6];
	int			i;

	pc_require_loaded();
	if (PG_ARGISNULL(0) || PG_ARGISNULL(1) || PG_ARGISNULL(2))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("snapshot name, query and ttl must not be NULL")));
	name = check_name(PG_GETARG_TEXT_PP(0));
	query = text_to_cstring(PG_GETARG_TEXT_PP(1));
	ttl = PG_GETARG_INTERVAL_P(2);
	(void) check_ttl(ttl);

	if (registry_lookup(name, true) != NULL)
		ereport(ERROR,
				(errcode(ERRCODE_DUPLICATE_OBJECT),
				 errmsg("snapshot \"%s\" already exists", name)));

	desc = check_query(query);
	names = palloc(Max(desc->natts, 1) * sizeof(Datum));
	types = palloc(Max(desc->natts, 1) * sizeof(Datum));
	for (i = 0; i < desc->natts; i++)
	{
		names[i] = CStringGetTextDatum(NameStr(TupleDescAttr(desc, i)->attname));
		types[i] = ObjectIdGetDatum(TupleDescAttr(desc, i)->atttypid);
	}

	args[0] = CStringGetTextDatum(name);
	args[1] = CStringGetTextDatum(query);
	args[2] = IntervalPGetDatum(ttl);
	args[3] = ObjectIdGetDatum(GetUserId());
	args[4] = PointerGetDatum(construct_array(names, desc->natts, TEXTOID, -1,
											  false, TYPALIGN_INT));
	args[5] = PointerGetDatum(construct_array(types, desc->natts, OIDOID,
											  sizeof(Oid), true, TYPALIGN_INT));
	if (registry_modify("INSERT INTO projcache.snapshot_registry"
						" (name, query, ttl, owner, column_names, column_types)"
						" VALUES ($1, $2, $3, $4::pg_catalog.regrole, $5,"
						" $6::pg_catalog.regtype[])"
						" ON CONFLICT (name) DO NOTHING",
						6, argtypes, args) == 0)
		ereport(ERROR,
				(errcode(ERRCODE_DUPLICATE_OBJECT),
				 errmsg("snapshot \"%s\" already exists", name)));
	PG_RETURN_VOID();
}

/*
 * Snapshots dropped by the current transaction (in TopTransactionContext):
 * their slots are freed once it commits.  Freed
 * earlier, a reader that still sees the registration would load it into a
 * new slot that nobody frees.
 */
typedef struct DroppedSnapshot
{
	char	   *name;
	int64		id;
	int64		stamp;
} DroppedSnapshot;

static List *dropped_snapshots = NIL;
static bool drop_callback_registered = false;

static void
forget_dropped_at_commit(XactEvent event, void *arg)
{
	ListCell   *lc;

	switch (event)
	{
		case XACT_EVENT_PRE_PREPARE:
			if (dropped_snapshots != NIL)
				ereport(ERROR,
						(errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
						 errmsg("cannot PREPARE a transaction that has dropped a projcache snapshot")));
			break;
		case XACT_EVENT_COMMIT:
			foreach(lc, dropped_snapshots)
			{
				DroppedSnapshot *d = (DroppedSnapshot *) lfirst(lc);

				pc_snap_forget(MyDatabaseId, d->name, d->id, d->stamp);
			}
			dropped_snapshots = NIL;
			break;
		case XACT_EVENT_ABORT:
			dropped_snapshots = NIL;
			break;
		default:
			break;
	}
}

static void
forget_at_commit(SnapReg *reg)
{
	MemoryContext oldcxt;
	DroppedSnapshot *d;

	if (!drop_callback_registered)
	{
		RegisterXactCallback(forget_dropped_at_commit, NULL);
		drop_callback_registered = true;
	}
	oldcxt = MemoryContextSwitchTo(TopTransactionContext);
	d = palloc(sizeof(DroppedSnapshot));
	d->name = pstrdup(reg->name);
	d->id = reg->id;
	d->stamp = reg->stamp;
	dropped_snapshots = lappend(dropped_snapshots, d);
	MemoryContextSwitchTo(oldcxt);
}

/* projcache.drop_snapshot(name text): owner or superuser. */
Datum
projcache_drop_snapshot(PG_FUNCTION_ARGS)
{
	char	   *name;
	SnapReg    *reg;
	Oid			argtypes[1] = {TEXTOID};
	Datum		args[1];

	pc_require_loaded();
	name = text_to_cstring(PG_GETARG_TEXT_PP(0));
	reg = registry_lookup(name, false);
	check_owner(reg);
	args[0] = CStringGetTextDatum(name);
	registry_modify("DELETE FROM projcache.snapshot_registry"
					" WHERE name OPERATOR(pg_catalog.=) $1",
					1, argtypes, args);
	forget_at_commit(reg);
	PG_RETURN_VOID();
}

static void
change_readers(FunctionCallInfo fcinfo, bool grant)
{
	char	   *name;
	SnapReg    *reg;
	Oid			reader;
	Oid			argtypes[2] = {TEXTOID, OIDOID};
	Datum		args[2];

	pc_require_loaded();
	name = text_to_cstring(PG_GETARG_TEXT_PP(0));
	reader = PG_GETARG_OID(1);
	reg = registry_lookup(name, false);
	check_owner(reg);
	args[0] = CStringGetTextDatum(name);
	args[1] = ObjectIdGetDatum(reader);
	if (grant)
		registry_modify("UPDATE projcache.snapshot_registry"
						" SET readers = readers OPERATOR(pg_catalog.||) $2::pg_catalog.regrole"
						" WHERE name OPERATOR(pg_catalog.=) $1"
						" AND NOT $2::pg_catalog.regrole OPERATOR(pg_catalog.=) ANY (readers)",
						2, argtypes, args);
	else
		registry_modify("UPDATE projcache.snapshot_registry"
						" SET readers = pg_catalog.array_remove(readers, $2::pg_catalog.regrole)"
						" WHERE name OPERATOR(pg_catalog.=) $1",
						2, argtypes, args);
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

/*
 * projcache.snapshots(): name, owner, ttl, rows, bytes, loaded_at, age,
 * last_attempt_at, refresh_errors, last_error, status
 */
Datum
projcache_snapshots(PG_FUNCTION_ARGS)
{
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	MemoryContext callercxt = CurrentMemoryContext;
	RoleSwitch	rs;
	int64		now;
	uint64		row;
	int			ret;
	int			nregs = 0;
	char	  **names = NULL;
	int64	   *ids = NULL;
	Oid		   *owners = NULL;
	Interval  **ttls = NULL;
	int64	   *ttl_ms = NULL;
	int64	   *stamps = NULL;
	int			i;

	pc_require_loaded();
	InitMaterializedSRF(fcinfo, 0);

	switch_role(&rs, BOOTSTRAP_SUPERUSERID);
	if (SPI_connect() != SPI_OK_CONNECT)
		elog(ERROR, "SPI_connect failed");
	ret = SPI_execute("SELECT name, id, owner::oid, ttl,"
					  " (extract(epoch FROM ttl) * 1000)::int8,"
					  " (extract(epoch FROM created_at) * 1000000)::int8"
					  " FROM projcache.snapshot_registry ORDER BY name",
					  true, 0);
	if (ret != SPI_OK_SELECT)
		elog(ERROR, "could not read projcache.snapshot_registry");
	{
		MemoryContext oldcxt = MemoryContextSwitchTo(callercxt);

		nregs = (int) SPI_processed;
		names = palloc(Max(nregs, 1) * sizeof(char *));
		ids = palloc(Max(nregs, 1) * sizeof(int64));
		owners = palloc(Max(nregs, 1) * sizeof(Oid));
		ttls = palloc(Max(nregs, 1) * sizeof(Interval *));
		ttl_ms = palloc(Max(nregs, 1) * sizeof(int64));
		stamps = palloc(Max(nregs, 1) * sizeof(int64));
		for (row = 0; row < SPI_processed; row++)
		{
			HeapTuple	tup = SPI_tuptable->vals[row];
			TupleDesc	desc = SPI_tuptable->tupdesc;
			bool		isnull;

			names[row] = TextDatumGetCString(SPI_getbinval(tup, desc, 1, &isnull));
			ids[row] = DatumGetInt64(SPI_getbinval(tup, desc, 2, &isnull));
			owners[row] = DatumGetObjectId(SPI_getbinval(tup, desc, 3, &isnull));
			ttls[row] = DatumGetIntervalP(datumCopy(SPI_getbinval(tup, desc, 4, &isnull),
													false, sizeof(Interval)));
			ttl_ms[row] = DatumGetInt64(SPI_getbinval(tup, desc, 5, &isnull));
			stamps[row] = DatumGetInt64(SPI_getbinval(tup, desc, 6, &isnull));
		}
		MemoryContextSwitchTo(oldcxt);
	}
	SPI_finish();
	restore_role(&rs);

	now = pc_now_ms();
	for (i = 0; i < nregs; i++)
	{
		PcSnapInfo	info;
		Datum		values[11];
		bool		nulls[11];
		const char *status;
		bool		has_slot = pc_snap_describe(MyDatabaseId, names[i], ids[i],
												stamps[i], &info);

		memset(nulls, true, sizeof(nulls));
		values[0] = CStringGetTextDatum(names[i]);
		nulls[0] = false;
		values[1] = ObjectIdGetDatum(owners[i]);
		nulls[1] = false;
		values[2] = IntervalPGetDatum(ttls[i]);
		nulls[2] = false;
		values[3] = Int64GetDatum(has_slot && info.loaded ? info.rows : 0);
		nulls[3] = false;
		values[4] = Int64GetDatum(has_slot && info.loaded ? info.bytes : 0);
		nulls[4] = false;
		if (has_slot && info.loaded)
		{
			values[5] = TimestampTzGetDatum(pc_mono_to_timestamp(info.loaded_at_ms));
			nulls[5] = false;
			values[6] = pc_interval_from_ms(Max(now - info.loaded_at_ms, 0));
			nulls[6] = false;
		}
		if (has_slot && info.attempted)
		{
			values[7] = TimestampTzGetDatum(pc_mono_to_timestamp(info.last_attempt_ms));
			nulls[7] = false;
		}
		values[8] = Int64GetDatum(has_slot ? info.refresh_errors : 0);
		nulls[8] = false;
		if (has_slot && info.last_error != NULL)
		{
			values[9] = CStringGetTextDatum(info.last_error);
			nulls[9] = false;
		}
		if (has_slot && info.last_failed)
			status = "failing";
		else if (!has_slot || !info.loaded)
			status = "cold";
		else if (now - info.loaded_at_ms < ttl_ms[i])
			status = "fresh";
		else
			status = "stale";
		values[10] = CStringGetTextDatum(status);
		nulls[10] = false;
		tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, values, nulls);
	}
	return (Datum) 0;
}
