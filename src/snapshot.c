/*-------------------------------------------------------------------------
 *
 * snapshot.c
 *	  The snapshot cache: registration, loading, and reading snapshots.
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

#include "access/detoast.h"
#include "access/htup_details.h"
#include "access/xact.h"
#include "catalog/dependency.h"
#include "catalog/namespace.h"
#include "catalog/pg_authid.h"
#include "catalog/pg_class.h"
#include "catalog/pg_extension.h"
#include "commands/extension.h"
#include "parser/parser.h"
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
PG_FUNCTION_INFO_V1(projcache_bind_registrations);

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
	Oid			view;			/* backing view; InvalidOid under 1.0 SQL */
	char	   *bind_error;		/* why 1.0.1 could not bind it, or NULL */
	bool		created_here;	/* registered by the current transaction */
} SnapReg;

/* Saved identity while running as another role with a safe search_path. */
typedef struct RoleSwitch
{
	Oid			save_userid;
	int			save_sec_context;
	int			save_nestlevel;
} RoleSwitch;

static void
switch_role_path(RoleSwitch *rs, Oid role, const char *search_path)
{
	GetUserIdAndSecContext(&rs->save_userid, &rs->save_sec_context);
	SetUserIdAndSecContext(role, rs->save_sec_context |
						   SECURITY_LOCAL_USERID_CHANGE |
						   SECURITY_RESTRICTED_OPERATION);
	rs->save_nestlevel = NewGUCNestLevel();
	(void) set_config_option("search_path", search_path,
							 PGC_USERSET, PGC_S_SESSION,
							 GUC_ACTION_SAVE, true, 0, false);
}

static void
switch_role(RoleSwitch *rs, Oid role)
{
	switch_role_path(rs, role, SAFE_SEARCH_PATH);
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

/*
 * Does this database's registry have the columns of the 1.0.1 SQL?  The
 * library also serves a database whose extension is still at 1.0.
 */
static bool
registry_has_views(void)
{
	Oid			nsp = get_namespace_oid("projcache", true);
	Oid			rel;

	if (!OidIsValid(nsp))
		return false;
	rel = get_relname_relid("snapshot_registry", nsp);
	return OidIsValid(rel) && get_attnum(rel, "view") != InvalidAttrNumber;
}

/* Planned once per backend, per registry shape: every snapshot() runs it. */
static SPIPlanPtr registry_lookup_plans[2];

/* Registrations made by the current transaction (TopTransactionContext). */
static List *created_snapshots = NIL;

/*
 * Read a registration.  The registry is not readable by PUBLIC, so this
 * runs as the bootstrap superuser; the caller's own rights are checked
 * against what it returns.  The owner is the backing view's owner.
 */
static SnapReg *
registry_lookup(const char *name, bool missing_ok)
{
	MemoryContext callercxt = CurrentMemoryContext;
	RoleSwitch	rs;
	Oid			argtypes[1] = {TEXTOID};
	Datum		args[1];
	SnapReg    *reg = NULL;
	bool		with_views = registry_has_views();
	int			ret;

	args[0] = CStringGetTextDatum(name);
	switch_role(&rs, BOOTSTRAP_SUPERUSERID);
	if (SPI_connect() != SPI_OK_CONNECT)
		elog(ERROR, "SPI_connect failed");
	if (registry_lookup_plans[with_views] == NULL)
	{
		SPIPlanPtr	plan;

		plan = SPI_prepare(with_views ?
						   "SELECT r.id, r.query,"
						   " (extract(epoch FROM r.ttl) * 1000)::int8,"
						   " COALESCE(c.relowner, r.owner::oid), r.column_names,"
						   " r.column_types::oid[], r.readers::oid[],"
						   " (extract(epoch FROM r.created_at) * 1000000)::int8,"
						   " r.view::oid, r.bind_error"
						   " FROM projcache.snapshot_registry r"
						   " LEFT JOIN pg_catalog.pg_class c"
						   " ON c.oid OPERATOR(pg_catalog.=) r.view::oid"
						   " WHERE r.name OPERATOR(pg_catalog.=) $1" :
						   "SELECT id, query,"
						   " (extract(epoch FROM ttl) * 1000)::int8,"
						   " owner::oid, column_names,"
						   " column_types::oid[], readers::oid[],"
						   " (extract(epoch FROM created_at) * 1000000)::int8,"
						   " NULL::oid, NULL::text"
						   " FROM projcache.snapshot_registry"
						   " WHERE name OPERATOR(pg_catalog.=) $1",
						   1, argtypes);
		if (plan == NULL)
			elog(ERROR, "could not plan the registry lookup: %s",
				 SPI_result_code_string(SPI_result));
		if (SPI_keepplan(plan) != 0)
			elog(ERROR, "SPI_keepplan failed");
		registry_lookup_plans[with_views] = plan;
	}
	/* What is registered now, as for a catalog: not the caller's snapshot. */
	PushActiveSnapshot(GetLatestSnapshot());
	ret = SPI_execute_plan(registry_lookup_plans[with_views], args, NULL,
						   true, 1);
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
		Datum		d;
		int			n;
		int			i;
		ListCell   *lc;

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
		d = SPI_getbinval(tup, desc, 9, &isnull);
		reg->view = isnull ? InvalidOid : DatumGetObjectId(d);
		d = SPI_getbinval(tup, desc, 10, &isnull);
		reg->bind_error = isnull ? NULL : TextDatumGetCString(d);
		foreach(lc, created_snapshots)
			if (*(int64 *) lfirst(lc) == reg->id)
				reg->created_here = true;
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
	return pc_snap_types_match(reg->natts, reg->coltypes, desc);
}

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
						reg->natts, reg->coltypes, ref, error, sqlerrcode);
}

/*
 * The owner lost what the query needs (or the snapshot lost its view): the
 * cached rows are dropped and readers get this error.
 */
static void
report_revoked(SnapReg *reg, PcSnapRef ref, const char *error, int sqlerrcode)
{
	(void) pc_snap_record_failure(ref, error, pc_now_ms(), true);
	ereport(ERROR,
			(errcode(sqlerrcode == ERRCODE_INSUFFICIENT_PRIVILEGE ||
					 sqlerrcode == ERRCODE_UNDEFINED_OBJECT ||
					 sqlerrcode == ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE ?
					 sqlerrcode : ERRCODE_INSUFFICIENT_PRIVILEGE),
			 errmsg("snapshot \"%s\" is no longer served", reg->name),
			 errdetail("%s", error),
			 errhint("The snapshot's owner must be able to run its query; otherwise drop the snapshot.")));
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
		SnapReg    *reg = registry_lookup(key->name, true);

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
				 errmsg("snapshot \"%s\" unavailable; it is not loaded yet",
						reg->name),
				 errdetail("It was created by this transaction; it is loaded after that commits.")));
	ref = pc_snap_acquire(MyDatabaseId, reg->name, reg->id, reg->stamp, true);
	if (ref.index >= 0)
		return ref;
	reclaim_slots();
	return pc_snap_acquire(MyDatabaseId, reg->name, reg->id, reg->stamp, false);
}

static void
current_rows(SnapReg *reg, char **blob, Size *size, int64 *nrows)
{
	PcSnapRef	ref = acquire_slot(reg);
	int64		now = pc_now_ms();
	bool		loaded;
	char	   *error = NULL;
	int			sqlerrcode = 0;
	int64		since = PC_NEVER;
	int64		prev_attempt = PC_NEVER;
	volatile PcLoadStatus status = PC_LOAD_NONE;

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
				if (!pc_snap_copy(ref, now, reg->ttl_ms, true, blob, size, nrows))
					status = load_and_publish(reg, ref, &error, &sqlerrcode);
			}
			PG_FINALLY();
			{
				pc_snap_lease_drop(ref);
			}
			PG_END_TRY();
			if (status == PC_LOAD_REVOKED)
				report_revoked(reg, ref, error, sqlerrcode);
			if (status == PC_LOAD_FAILED)
			{
				int64		age = pc_snap_record_failure(ref, error,
														 pc_now_ms(), false);

				ereport(WARNING,
						(errcode(ERRCODE_PROJCACHE_SNAPSHOT_UNAVAILABLE),
						 errmsg("projcache snapshot \"%s\" refresh failed, serving the last good snapshot (age %lld s)",
								reg->name, (long long) (age / 1000)),
						 errdetail("%s", error)));
			}
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
		status = load_and_publish(reg, ref, &error, &sqlerrcode);
	}
	PG_CATCH();
	{
		pc_snap_cold_unclaim(ref, now, prev_attempt);
		PG_RE_THROW();
	}
	PG_END_TRY();
	/* No rows to drop yet: lost rights fail like the source, with PC001. */
	if (status != PC_LOAD_OK)
	{
		(void) pc_snap_record_failure(ref, error, pc_now_ms(), false);
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
	int			sqlerrcode = 0;

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
	ref = acquire_slot(reg);
	switch (load_and_publish(reg, ref, &error, &sqlerrcode))
	{
		case PC_LOAD_OK:
			PG_RETURN_BOOL(true);
		case PC_LOAD_REVOKED:
			report_revoked(reg, ref, error, sqlerrcode);
			break;
		default:
			break;
	}
	(void) pc_snap_record_failure(ref, error, pc_now_ms(), false);
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
 * parsed and analyzed now with the given search path, so a typo fails at
 * registration.  Returns its result columns.
 */
static TupleDesc
check_query(const char *query, const char *search_path)
{
	MemoryContext callercxt = CurrentMemoryContext;
	RoleSwitch	rs;
	SPIPlanPtr	plan;
	List	   *sources;
	CachedPlanSource *ps;
	ListCell   *lc;
	TupleDesc	result;
	int			i;

	switch_role_path(&rs, GetUserId(), search_path);
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

/*
 * The caller's effective search path, spelled out: "$user" is expanded for
 * the caller (the view is created as another role) and temporary schemas
 * are left out.
 */
static char *
creator_search_path(void)
{
	StringInfoData buf;
	ListCell   *lc;

	initStringInfo(&buf);
	foreach(lc, fetch_search_path(false))
	{
		Oid			nsp = lfirst_oid(lc);
		char	   *nspname;

		if (isAnyTempNamespace(nsp) || (nspname = get_namespace_name(nsp)) == NULL)
			continue;
		appendStringInfo(&buf, "%s%s", buf.len > 0 ? ", " : "",
						 quote_identifier(nspname));
	}
	if (buf.len == 0)
		appendStringInfoString(&buf, "pg_catalog");
	return buf.data;
}

/* Does the view's query use anything of this session's temporary schema? */
static bool
view_uses_temp_objects(Oid view)
{
	Oid			argtypes[1] = {OIDOID};
	Datum		args[1];
	bool		isnull;
	int			ret;

	args[0] = ObjectIdGetDatum(view);
	/*
	 * What its rule uses, and its columns' types.  Not read-only: the view
	 * was made by a later command than the caller's snapshot can see.
	 */
	ret = SPI_execute_with_args("SELECT pg_catalog.count(*)"
								" FROM pg_catalog.pg_depend d"
								" WHERE ((d.classid OPERATOR(pg_catalog.=) 'pg_catalog.pg_rewrite'::pg_catalog.regclass"
								"   AND d.objid IN (SELECT oid FROM pg_catalog.pg_rewrite"
								"     WHERE ev_class OPERATOR(pg_catalog.=) $1))"
								"  OR (d.classid OPERATOR(pg_catalog.=) 'pg_catalog.pg_class'::pg_catalog.regclass"
								"   AND d.objid OPERATOR(pg_catalog.=) $1))"
								" AND (d.refobjid IN (SELECT oid FROM pg_catalog.pg_class"
								"   WHERE relpersistence OPERATOR(pg_catalog.=) 't')"
								" OR d.refobjid IN (SELECT oid FROM pg_catalog.pg_type"
								"   WHERE typnamespace OPERATOR(pg_catalog.=) pg_catalog.pg_my_temp_schema())"
								" OR d.refobjid IN (SELECT oid FROM pg_catalog.pg_proc"
								"   WHERE pronamespace OPERATOR(pg_catalog.=) pg_catalog.pg_my_temp_schema())"
								" OR d.refobjid IN (SELECT oid FROM pg_catalog.pg_operator"
								"   WHERE oprnamespace OPERATOR(pg_catalog.=) pg_catalog.pg_my_temp_schema()))",
								1, argtypes, args, NULL, false, 1);
	if (ret != SPI_OK_SELECT || SPI_processed != 1)
		elog(ERROR, "could not read the dependencies of view %u", view);
	return DatumGetInt64(SPI_getbinval(SPI_tuptable->vals[0],
									   SPI_tuptable->tupdesc, 1, &isnull)) > 0;
}

/*
 * Create projcache.snapshot_<id>, the view that backs a snapshot, owned by
 * owner.  Its query's names are bound now, with search_path; nothing may be
 * found in a temporary schema.  The view depends on the extension as an
 * ordinary object, also when made by an update script (which would make it
 * a member, and pg_dump leaves members out): DROP EXTENSION then needs
 * CASCADE while snapshots exist.
 */
static Oid
create_backing_view(int64 id, const char *name, const char *query,
					const char *search_path, Oid owner)
{
	RoleSwitch	rs;
	char		relname[NAMEDATALEN];
	StringInfoData sql;
	List	   *raw;
	Oid			view;
	ObjectAddress view_addr;
	ObjectAddress ext_addr;
	int			ret;

	snprintf(relname, NAMEDATALEN, "snapshot_" INT64_FORMAT, id);
	initStringInfo(&sql);
	appendStringInfo(&sql, "CREATE VIEW projcache.%s AS %s", relname, query);

	/* Exactly one statement, a CREATE VIEW: the query cannot smuggle more. */
	raw = raw_parser(sql.data, RAW_PARSE_DEFAULT);
	if (list_length(raw) != 1 ||
		!IsA(linitial_node(RawStmt, raw)->stmt, ViewStmt))
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("snapshot query must be a single SELECT")));

	/* The caller has no CREATE on schema projcache: create, then give. */
	switch_role_path(&rs, BOOTSTRAP_SUPERUSERID, search_path);
	if (SPI_connect() != SPI_OK_CONNECT)
		elog(ERROR, "SPI_connect failed");
	ret = SPI_execute(sql.data, false, 0);
	if (ret != SPI_OK_UTILITY)
		elog(ERROR, "could not create the view of snapshot \"%s\": %s",
			 name, SPI_result_code_string(ret));
	view = get_relname_relid(relname, get_namespace_oid("projcache", false));
	if (!OidIsValid(view))
		elog(ERROR, "view projcache.%s was not created", relname);
	SPI_finish();
	restore_role(&rs);

	switch_role(&rs, BOOTSTRAP_SUPERUSERID);
	if (SPI_connect() != SPI_OK_CONNECT)
		elog(ERROR, "SPI_connect failed");
	if (view_uses_temp_objects(view))
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("snapshot query must not use temporary objects"),
				 errdetail("Every reader is served its rows: it cannot depend on one session.")));
	resetStringInfo(&sql);
	appendStringInfo(&sql, "ALTER VIEW projcache.%s OWNER TO %s", relname,
					 quote_identifier(GetUserNameFromId(owner, false)));
	if (SPI_execute(sql.data, false, 0) != SPI_OK_UTILITY)
		elog(ERROR, "could not give view projcache.%s to its owner", relname);
	resetStringInfo(&sql);
	appendStringInfo(&sql, "COMMENT ON VIEW projcache.%s IS %s", relname,
					 quote_literal_cstr(psprintf("backs projcache snapshot \"%s\"", name)));
	if (SPI_execute(sql.data, false, 0) != SPI_OK_UTILITY)
		elog(ERROR, "could not comment on view projcache.%s", relname);
	SPI_finish();
	restore_role(&rs);

	ObjectAddressSet(view_addr, RelationRelationId, view);
	ObjectAddressSet(ext_addr, ExtensionRelationId,
					 get_extension_oid("projcache", false));
	deleteDependencyRecordsForClass(RelationRelationId, view,
									ExtensionRelationId, DEPENDENCY_EXTENSION);
	recordDependencyOn(&view_addr, &ext_addr, DEPENDENCY_NORMAL);
	CommandCounterIncrement();
	return view;
}

/* The next registration id, from the registry's sequence. */
static int64
registry_next_id(void)
{
	RoleSwitch	rs;
	bool		isnull;
	int64		id;

	switch_role(&rs, BOOTSTRAP_SUPERUSERID);
	if (SPI_connect() != SPI_OK_CONNECT)
		elog(ERROR, "SPI_connect failed");
	if (SPI_execute("SELECT pg_catalog.nextval('projcache.snapshot_registry_id_seq'::pg_catalog.regclass)",
					false, 1) != SPI_OK_SELECT || SPI_processed != 1)
		elog(ERROR, "could not draw a snapshot id");
	id = DatumGetInt64(SPI_getbinval(SPI_tuptable->vals[0],
									 SPI_tuptable->tupdesc, 1, &isnull));
	SPI_finish();
	restore_role(&rs);
	return id;
}

static void remember_created(int64 id);

/* projcache.create_snapshot(name text, query text, ttl interval DEFAULT '60s') */
Datum
projcache_create_snapshot(PG_FUNCTION_ARGS)
{
	char	   *name;
	char	   *query;
	char	   *search_path;
	Interval   *ttl;
	TupleDesc	desc;
	Datum	   *names;
	Datum	   *types;
	Oid			argtypes[8] = {TEXTOID, TEXTOID, INTERVALOID, OIDOID,
	TEXTARRAYOID, OIDARRAYOID, INT8OID, OIDOID};
	Datum		args[8];
	bool		with_views;
	int64		id;
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

	/* Under the 1.0 SQL, queries are analyzed as 1.0 did; no view. */
	with_views = registry_has_views();
	search_path = with_views ? creator_search_path() : pstrdup(SAFE_SEARCH_PATH);
	desc = check_query(query, search_path);
	names = palloc(Max(desc->natts, 1) * sizeof(Datum));
	types = palloc(Max(desc->natts, 1) * sizeof(Datum));
	for (i = 0; i < desc->natts; i++)
	{
		names[i] = CStringGetTextDatum(NameStr(TupleDescAttr(desc, i)->attname));
		types[i] = ObjectIdGetDatum(TupleDescAttr(desc, i)->atttypid);
	}

	id = registry_next_id();
	args[0] = CStringGetTextDatum(name);
	args[1] = CStringGetTextDatum(query);
	args[2] = IntervalPGetDatum(ttl);
	args[3] = ObjectIdGetDatum(GetUserId());
	args[4] = PointerGetDatum(construct_array(names, desc->natts, TEXTOID, -1,
											  false, TYPALIGN_INT));
	args[5] = PointerGetDatum(construct_array(types, desc->natts, OIDOID,
											  sizeof(Oid), true, TYPALIGN_INT));
	args[6] = Int64GetDatum(id);
	args[7] = ObjectIdGetDatum(with_views ?
							   create_backing_view(id, name, query, search_path,
												   GetUserId()) :
							   InvalidOid);
	if (registry_modify(with_views ?
						"INSERT INTO projcache.snapshot_registry"
						" (name, query, ttl, owner, column_names, column_types,"
						" id, view)"
						" VALUES ($1, $2, $3, $4::pg_catalog.regrole, $5,"
						" $6::pg_catalog.regtype[], $7, $8::pg_catalog.regclass)"
						" ON CONFLICT (name) DO NOTHING" :
						"INSERT INTO projcache.snapshot_registry"
						" (name, query, ttl, owner, column_names, column_types,"
						" id)"
						" VALUES ($1, $2, $3, $4::pg_catalog.regrole, $5,"
						" $6::pg_catalog.regtype[], $7)"
						" ON CONFLICT (name) DO NOTHING",
						with_views ? 8 : 7, argtypes, args) == 0)
		ereport(ERROR,
				(errcode(ERRCODE_DUPLICATE_OBJECT),
				 errmsg("snapshot \"%s\" already exists", name)));
	remember_created(id);
	PG_RETURN_VOID();
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
	MemoryContext cxt = CurrentMemoryContext;
	ResourceOwner owner = CurrentResourceOwner;
	RoleSwitch	rs;
	int64	   *ids;
	char	  **names;
	char	  **queries;
	Oid		   *owners;
	uint64		n;
	uint64		i;

	switch_role(&rs, BOOTSTRAP_SUPERUSERID);
	if (SPI_connect() != SPI_OK_CONNECT)
		elog(ERROR, "SPI_connect failed");
	if (SPI_execute("SELECT id, name, query, owner::oid"
					" FROM projcache.snapshot_registry WHERE view IS NULL",
					true, 0) != SPI_OK_SELECT)
		elog(ERROR, "could not read projcache.snapshot_registry");
	n = SPI_processed;
	MemoryContextSwitchTo(cxt);
	ids = palloc(Max(n, 1) * sizeof(int64));
	names = palloc(Max(n, 1) * sizeof(char *));
	queries = palloc(Max(n, 1) * sizeof(char *));
	owners = palloc(Max(n, 1) * sizeof(Oid));
	for (i = 0; i < n; i++)
	{
		HeapTuple	tup = SPI_tuptable->vals[i];
		TupleDesc	desc = SPI_tuptable->tupdesc;
		bool		isnull;

		ids[i] = DatumGetInt64(SPI_getbinval(tup, desc, 1, &isnull));
		names[i] = TextDatumGetCString(SPI_getbinval(tup, desc, 2, &isnull));
		queries[i] = TextDatumGetCString(SPI_getbinval(tup, desc, 3, &isnull));
		owners[i] = DatumGetObjectId(SPI_getbinval(tup, desc, 4, &isnull));
	}
	SPI_finish();
	restore_role(&rs);

	for (i = 0; i < n; i++)
	{
		Oid			argtypes[3] = {INT8OID, OIDOID, TEXTOID};
		Datum		args[3];
		char		nulls[3] = {' ', ' ', 'n'};

		args[0] = Int64GetDatum(ids[i]);
		args[1] = ObjectIdGetDatum(InvalidOid);
		args[2] = (Datum) 0;
		BeginInternalSubTransaction(NULL);
		MemoryContextSwitchTo(cxt);
		PG_TRY();
		{
			args[1] = ObjectIdGetDatum(create_backing_view(ids[i], names[i],
														   queries[i],
														   "pg_catalog",
														   owners[i]));
			nulls[1] = ' ';
			ReleaseCurrentSubTransaction();
		}
		PG_CATCH();
		{
			ErrorData  *edata;

			MemoryContextSwitchTo(cxt);
			edata = CopyErrorData();
			FlushErrorState();
			RollbackAndReleaseCurrentSubTransaction();
			args[2] = CStringGetTextDatum(edata->message);
			nulls[1] = 'n';
			nulls[2] = ' ';
			ereport(WARNING,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("projcache snapshot \"%s\" could not be bound to a view", names[i]),
					 errdetail("%s", edata->message),
					 errhint("Its reads fail until it is dropped and created again.")));
		}
		PG_END_TRY();
		MemoryContextSwitchTo(cxt);
		CurrentResourceOwner = owner;

		switch_role(&rs, BOOTSTRAP_SUPERUSERID);
		if (SPI_connect() != SPI_OK_CONNECT)
			elog(ERROR, "SPI_connect failed");
		if (SPI_execute_with_args("UPDATE projcache.snapshot_registry"
								  " SET view = $2::pg_catalog.regclass, bind_error = $3"
								  " WHERE id OPERATOR(pg_catalog.=) $1",
								  3, argtypes, args, nulls, false, 0) != SPI_OK_UPDATE)
			elog(ERROR, "could not update projcache.snapshot_registry");
		SPI_finish();
		restore_role(&rs);
	}
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
			created_snapshots = NIL;
			foreach(lc, dropped_snapshots)
			{
				DroppedSnapshot *d = (DroppedSnapshot *) lfirst(lc);

				pc_snap_forget(MyDatabaseId, d->name, d->id, d->stamp);
			}
			dropped_snapshots = NIL;
			break;
		case XACT_EVENT_ABORT:
			created_snapshots = NIL;
			dropped_snapshots = NIL;
			break;
		default:
			break;
	}
}

static void
register_xact_callback(void)
{
	if (!drop_callback_registered)
	{
		RegisterXactCallback(forget_dropped_at_commit, NULL);
		drop_callback_registered = true;
	}
}

/* Note a registration made by this transaction: it gets no slot yet. */
static void
remember_created(int64 id)
{
	MemoryContext oldcxt;
	int64	   *p;

	register_xact_callback();
	oldcxt = MemoryContextSwitchTo(TopTransactionContext);
	p = palloc(sizeof(int64));
	*p = id;
	created_snapshots = lappend(created_snapshots, p);
	MemoryContextSwitchTo(oldcxt);
}

static void
forget_at_commit(SnapReg *reg)
{
	MemoryContext oldcxt;
	DroppedSnapshot *d;

	register_xact_callback();
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
	if (OidIsValid(reg->view) && get_rel_relkind(reg->view) == RELKIND_VIEW)
	{
		ObjectAddress view_addr;

		/* RESTRICT: a view of the owner's built on it says so. */
		ObjectAddressSet(view_addr, RelationRelationId, reg->view);
		performDeletion(&view_addr, DROP_RESTRICT, 0);
	}
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
	if (grant && !SearchSysCacheExists1(AUTHOID, ObjectIdGetDatum(reader)))
		ereport(ERROR,
				(errcode(ERRCODE_UNDEFINED_OBJECT),
				 errmsg("role with OID %u does not exist", reader)));
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
	/* The owner is the backing view's (REASSIGN OWNED moves it). */
	ret = SPI_execute(registry_has_views() ?
					  "SELECT r.name, r.id, COALESCE(c.relowner, r.owner::oid), r.ttl,"
					  " (extract(epoch FROM r.ttl) * 1000)::int8,"
					  " (extract(epoch FROM r.created_at) * 1000000)::int8"
					  " FROM projcache.snapshot_registry r"
					  " LEFT JOIN pg_catalog.pg_class c"
					  " ON c.oid OPERATOR(pg_catalog.=) r.view::oid"
					  " ORDER BY r.name" :
					  "SELECT name, id, owner::oid, ttl,"
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
