/*-------------------------------------------------------------------------
 *
 * snapshot_registry.c
 *	  The snapshot registry, projcache.snapshot_registry: the only code
 *	  that runs SQL on it.  Reading a registration, listing them, and
 *	  inserting, deleting and changing them, each by a function of its own;
 *	  and what a registration allows (its owner, its readers, its columns).
 *
 * Registrations live in projcache.snapshot_registry, one table per
 * database, not readable by PUBLIC: every statement here runs as the
 * bootstrap superuser (pc_become_extension), on SQL text written here
 * only, with the caller's values as parameters; callers check the
 * caller's own rights against what it returns.  The library also serves
 * databases whose extension is still at 1.0 (no backing views) or 1.0.1
 * (no key column): which layout the table has is found out in one place,
 * registry_layout(), and each statement is chosen by it.
 *
 * Every function that changes the registry marks its transaction
 * (pc_registry_changed, snapshot_xact.c), so that the readers' cache
 * (snapshot_regcache.c) holds.
 *
 * Copyright (c) 2026, projcache developers
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/xact.h"
#include "catalog/namespace.h"
#include "catalog/pg_type.h"
#include "executor/spi.h"
#include "miscadmin.h"
#include "utils/acl.h"
#include "utils/array.h"
#include "utils/builtins.h"
#include "utils/datum.h"
#include "utils/inval.h"
#include "utils/lsyscache.h"
#include "utils/memutils.h"
#include "utils/snapmgr.h"

#include "snapshot.h"
#include "snapshot_registry.h"

/* ----------------------------------------------------------------
 * The registry's layout
 * ----------------------------------------------------------------
 */

/* The columns the registry has, by the extension's SQL that made it. */
typedef enum RegistryLayout
{
	REGISTRY_1_0,				/* no backing views (or no registry) */
	REGISTRY_1_0_1,				/* view and bind_error */
	REGISTRY_1_1				/* key_column too */
} RegistryLayout;

/* registry_layout()'s answer, until an invalidation (see below) */
static bool layout_known = false;
static RegistryLayout layout;
static Oid	registry_relid = InvalidOid;	/* what it was computed for */
static uint64 layout_invals = 0;
static bool layout_callback_set = false;

/*
 * A relcache invalidation of the registry (ALTER EXTENSION UPDATE alters
 * it), of every relation, or of anything while the registry is not known:
 * the layout is found out again.
 */
static void
layout_relcache_cb(Datum arg, Oid relid)
{
	layout_invals++;
	if (!OidIsValid(relid) || relid == registry_relid ||
		!OidIsValid(registry_relid))
		layout_known = false;
}

/* The registry table of this database, or InvalidOid if there is none. */
Oid
pc_registry_relid(void)
{
	Oid			nsp = get_namespace_oid("projcache", true);

	return OidIsValid(nsp) ?
		get_relname_relid("snapshot_registry", nsp) : InvalidOid;
}

/*
 * The registry table the layout was last found out for, without a catalog
 * read: for invalidation callbacks (snapshot_regcache.c).
 */
Oid
pc_registry_known_relid(void)
{
	return registry_relid;
}

/*
 * Which columns does this database's registry have?  The answer is kept
 * until a relcache invalidation of the registry, as the readers' cache
 * keeps its entries.
 */
static RegistryLayout
registry_layout(void)
{
	uint64		invals;
	RegistryLayout answer;

	if (!layout_callback_set)
	{
		CacheRegisterRelcacheCallback(layout_relcache_cb, (Datum) 0);
		layout_callback_set = true;
	}
	if (layout_known)
		return layout;
	invals = layout_invals;
	registry_relid = pc_registry_relid();
	if (!OidIsValid(registry_relid) ||
		get_attnum(registry_relid, "view") == InvalidAttrNumber)
		answer = REGISTRY_1_0;
	else if (get_attnum(registry_relid, "key_column") == InvalidAttrNumber)
		answer = REGISTRY_1_0_1;
	else
		answer = REGISTRY_1_1;
	/* An invalidation taken in meanwhile may have made it stale. */
	if (layout_invals == invals)
	{
		layout = answer;
		layout_known = true;
	}
	return answer;
}

/*
 * Does this database's registry have the columns of the 1.0.1 SQL: is each
 * registration backed by a view?
 */
bool
pc_registry_has_views(void)
{
	return registry_layout() != REGISTRY_1_0;
}

/* ----------------------------------------------------------------
 * Reading registrations
 * ----------------------------------------------------------------
 */

/* The elements of an oid[] datum, palloc'd; *n says how many. */
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
 * Reading one registration, per layout: the owner is the backing view's
 * (REASSIGN OWNED moves it), the key column its position among the
 * columns.
 */
#define LOOKUP_1_0_1_COLUMNS \
	"SELECT r.id, r.query," \
	" (extract(epoch FROM r.ttl) * 1000)::int8," \
	" COALESCE(c.relowner, r.owner::oid), r.column_names," \
	" r.column_types::oid[], r.readers::oid[]," \
	" (extract(epoch FROM r.created_at) * 1000000)::int8," \
	" r.view::oid, r.bind_error,"
#define LOOKUP_1_0_1_FROM \
	" FROM projcache.snapshot_registry r" \
	" LEFT JOIN pg_catalog.pg_class c" \
	" ON c.oid OPERATOR(pg_catalog.=) r.view::oid" \
	" WHERE r.name OPERATOR(pg_catalog.=) $1"

static const char *const registry_lookup_sql[] = {
	[REGISTRY_1_0] =
	"SELECT id, query,"
	" (extract(epoch FROM ttl) * 1000)::int8,"
	" owner::oid, column_names,"
	" column_types::oid[], readers::oid[],"
	" (extract(epoch FROM created_at) * 1000000)::int8,"
	" NULL::oid, NULL::text, NULL::int4"
	" FROM projcache.snapshot_registry"
	" WHERE name OPERATOR(pg_catalog.=) $1",
	[REGISTRY_1_0_1] =
	LOOKUP_1_0_1_COLUMNS
	" NULL::int4"
	LOOKUP_1_0_1_FROM,
	[REGISTRY_1_1] =
	LOOKUP_1_0_1_COLUMNS
	" pg_catalog.array_position(r.column_names, r.key_column)"
	LOOKUP_1_0_1_FROM,
};

/* Planned once per backend, per layout: every snapshot() runs it. */
static SPIPlanPtr registry_lookup_plans[lengthof(registry_lookup_sql)];

/*
 * Read a registration.  The registry is not readable by PUBLIC, so this
 * runs as the bootstrap superuser; the caller's own rights are checked
 * against what it returns.  The owner is the backing view's owner.
 */
SnapReg *
pc_registry_lookup(const char *name, bool missing_ok)
{
	MemoryContext callercxt = CurrentMemoryContext;
	PcUserSwitch rs;
	Oid			argtypes[1] = {TEXTOID};
	Datum		args[1];
	SnapReg    *reg = NULL;
	RegistryLayout shape = registry_layout();
	int			ret;

	/* GetLatestSnapshot() below cannot be taken in parallel mode. */
	if (IsInParallelMode())
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_TRANSACTION_STATE),
				 errmsg("cannot read snapshot \"%s\" during a parallel operation",
						name),
				 errhint("A function that reads a snapshot must be marked PARALLEL UNSAFE.")));
	args[0] = CStringGetTextDatum(name);
	pc_become_extension(&rs);
	if (SPI_connect() != SPI_OK_CONNECT)
		elog(ERROR, "SPI_connect failed");
	if (registry_lookup_plans[shape] == NULL)
	{
		SPIPlanPtr	plan;

		plan = SPI_prepare(registry_lookup_sql[shape], 1, argtypes);
		if (plan == NULL)
			elog(ERROR, "could not plan the registry lookup: %s",
				 SPI_result_code_string(SPI_result));
		if (SPI_keepplan(plan) != 0)
			elog(ERROR, "SPI_keepplan failed");
		registry_lookup_plans[shape] = plan;
	}
	/* What is registered now, as for a catalog: not the caller's snapshot. */
	PushActiveSnapshot(GetLatestSnapshot());
	ret = SPI_execute_plan(registry_lookup_plans[shape], args, NULL, true, 1);
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
		d = SPI_getbinval(tup, desc, 11, &isnull);
		reg->key_attno = isnull ? 0 : DatumGetInt32(d);
		reg->created_here = pc_snap_created_here(reg->id);
		MemoryContextSwitchTo(oldcxt);
	}
	PopActiveSnapshot();
	SPI_finish();
	pc_unbecome(&rs);

	if (reg == NULL && !missing_ok)
		ereport(ERROR,
				(errcode(ERRCODE_UNDEFINED_OBJECT),
				 errmsg("snapshot \"%s\" does not exist", name)));
	return reg;
}

/*
 * The names of this database's registrations, in the caller's memory
 * context: all, in name order, or (unbound_only) those made under the 1.0
 * SQL that have no backing view yet.
 */
List *
pc_registry_names(bool unbound_only)
{
	MemoryContext callercxt = CurrentMemoryContext;
	PcUserSwitch rs;
	List	   *names = NIL;
	uint64		row;

	pc_become_extension(&rs);
	if (SPI_connect() != SPI_OK_CONNECT)
		elog(ERROR, "SPI_connect failed");
	if (SPI_execute(unbound_only ?
					"SELECT name FROM projcache.snapshot_registry"
					" WHERE view IS NULL" :
					"SELECT name FROM projcache.snapshot_registry"
					" ORDER BY name",
					true, 0) != SPI_OK_SELECT)
		elog(ERROR, "could not read projcache.snapshot_registry");
	for (row = 0; row < SPI_processed; row++)
	{
		bool		isnull;
		Datum		d = SPI_getbinval(SPI_tuptable->vals[row],
									  SPI_tuptable->tupdesc, 1, &isnull);
		MemoryContext oldcxt = MemoryContextSwitchTo(callercxt);

		names = lappend(names, TextDatumGetCString(d));
		MemoryContextSwitchTo(oldcxt);
	}
	SPI_finish();
	pc_unbecome(&rs);
	return names;
}

/*
 * Every registration of this database, in name order, as the snapshots
 * view shows it, in the caller's memory context; *nregs says how many.
 * The owner is the backing view's (REASSIGN OWNED moves it).
 */
SnapRegSummary *
pc_registry_list(int *nregs)
{
	MemoryContext callercxt = CurrentMemoryContext;
	PcUserSwitch rs;
	SnapRegSummary *regs;
	uint64		row;
	int			ret;

	pc_become_extension(&rs);
	if (SPI_connect() != SPI_OK_CONNECT)
		elog(ERROR, "SPI_connect failed");
	ret = SPI_execute(pc_registry_has_views() ?
					  "SELECT r.name, r.id, COALESCE(c.relowner, r.owner::oid),"
					  " r.ttl, (extract(epoch FROM r.ttl) * 1000)::int8,"
					  " (extract(epoch FROM r.created_at) * 1000000)::int8,"
					  " r.readers::oid[]"
					  " FROM projcache.snapshot_registry r"
					  " LEFT JOIN pg_catalog.pg_class c"
					  " ON c.oid OPERATOR(pg_catalog.=) r.view::oid"
					  " ORDER BY r.name" :
					  "SELECT name, id, owner::oid, ttl,"
					  " (extract(epoch FROM ttl) * 1000)::int8,"
					  " (extract(epoch FROM created_at) * 1000000)::int8,"
					  " readers::oid[]"
					  " FROM projcache.snapshot_registry ORDER BY name",
					  true, 0);
	if (ret != SPI_OK_SELECT)
		elog(ERROR, "could not read projcache.snapshot_registry");
	*nregs = (int) SPI_processed;
	regs = MemoryContextAllocZero(callercxt,
								  Max(*nregs, 1) * sizeof(SnapRegSummary));
	for (row = 0; row < SPI_processed; row++)
	{
		HeapTuple	tup = SPI_tuptable->vals[row];
		TupleDesc	desc = SPI_tuptable->tupdesc;
		SnapRegSummary *r = &regs[row];
		bool		isnull;
		MemoryContext oldcxt = MemoryContextSwitchTo(callercxt);

		r->name = TextDatumGetCString(SPI_getbinval(tup, desc, 1, &isnull));
		r->id = DatumGetInt64(SPI_getbinval(tup, desc, 2, &isnull));
		r->owner = DatumGetObjectId(SPI_getbinval(tup, desc, 3, &isnull));
		r->ttl = DatumGetIntervalP(datumCopy(SPI_getbinval(tup, desc, 4,
														   &isnull),
											 false, sizeof(Interval)));
		r->ttl_ms = DatumGetInt64(SPI_getbinval(tup, desc, 5, &isnull));
		r->stamp = DatumGetInt64(SPI_getbinval(tup, desc, 6, &isnull));
		r->readers = oid_array(SPI_getbinval(tup, desc, 7, &isnull),
							   &r->nreaders);
		MemoryContextSwitchTo(oldcxt);
	}
	SPI_finish();
	pc_unbecome(&rs);
	return regs;
}

/* ----------------------------------------------------------------
 * Changing registrations
 * ----------------------------------------------------------------
 */

/*
 * Run one of this file's statements that change the registry, as the
 * bootstrap superuser.  Returns the number of rows it affected.  The
 * transaction counts as having changed the registry (pc_registry_changed),
 * even if the statement fails.
 */
static uint64
registry_modify(const char *sql, int nargs, Oid *argtypes, Datum *args,
				const char *nulls)
{
	PcUserSwitch rs;
	int			ret;
	uint64		nrows;

	pc_registry_changed();
	pc_become_extension(&rs);
	if (SPI_connect() != SPI_OK_CONNECT)
		elog(ERROR, "SPI_connect failed");
	ret = SPI_execute_with_args(sql, nargs, argtypes, args, nulls, false, 0);
	if (ret < 0)
		elog(ERROR, "could not update projcache.snapshot_registry: %s",
			 SPI_result_code_string(ret));
	nrows = SPI_processed;
	SPI_finish();
	pc_unbecome(&rs);
	return nrows;
}

/* The next registration id, from the registry's sequence. */
int64
pc_registry_next_id(void)
{
	PcUserSwitch rs;
	bool		isnull;
	int64		id;

	pc_become_extension(&rs);
	if (SPI_connect() != SPI_OK_CONNECT)
		elog(ERROR, "SPI_connect failed");
	if (SPI_execute("SELECT pg_catalog.nextval("
					"'projcache.snapshot_registry_id_seq'"
					"::pg_catalog.regclass)",
					false, 1) != SPI_OK_SELECT || SPI_processed != 1)
		elog(ERROR, "could not draw a snapshot id");
	id = DatumGetInt64(SPI_getbinval(SPI_tuptable->vals[0],
									 SPI_tuptable->tupdesc, 1, &isnull));
	SPI_finish();
	pc_unbecome(&rs);
	return id;
}

/*
 * Register a snapshot: id (from pc_registry_next_id), its name, query and
 * ttl, its owner, its result columns, its backing view (InvalidOid under
 * the 1.0 SQL) and its key column (or NULL).  Returns false, inserting
 * nothing, if the name is taken.
 */
bool
pc_registry_insert(int64 id, const char *name, const char *query,
				   Interval *ttl, Oid owner, TupleDesc columns, Oid view,
				   const char *key)
{
	Oid			argtypes[9] = {TEXTOID, TEXTOID, INTERVALOID, OIDOID,
	TEXTARRAYOID, OIDARRAYOID, INT8OID, OIDOID, TEXTOID};
	Datum		args[9];
	Datum	   *names;
	Datum	   *types;
	RegistryLayout shape = registry_layout();
	const char *sql;
	int			nargs;
	int			i;

	names = palloc(Max(columns->natts, 1) * sizeof(Datum));
	types = palloc(Max(columns->natts, 1) * sizeof(Datum));
	for (i = 0; i < columns->natts; i++)
	{
		Form_pg_attribute att = TupleDescAttr(columns, i);

		names[i] = CStringGetTextDatum(NameStr(att->attname));
		types[i] = ObjectIdGetDatum(att->atttypid);
	}
	args[0] = CStringGetTextDatum(name);
	args[1] = CStringGetTextDatum(query);
	args[2] = IntervalPGetDatum(ttl);
	args[3] = ObjectIdGetDatum(owner);
	args[4] = PointerGetDatum(construct_array(names, columns->natts, TEXTOID,
											  -1, false, TYPALIGN_INT));
	args[5] = PointerGetDatum(construct_array(types, columns->natts, OIDOID,
											  sizeof(Oid), true, TYPALIGN_INT));
	args[6] = Int64GetDatum(id);
	args[7] = ObjectIdGetDatum(view);
	/* '' for no key: no NULLs are passed */
	args[8] = CStringGetTextDatum(key ? key : "");

	/* Only the 1.1 SQL takes a key: a key under older SQL fails here. */
	if (shape == REGISTRY_1_1 || key != NULL)
	{
		sql = "INSERT INTO projcache.snapshot_registry"
			" (name, query, ttl, owner, column_names,"
			" column_types, id, view, key_column)"
			" VALUES ($1, $2, $3, $4::pg_catalog.regrole,"
			" $5, $6::pg_catalog.regtype[], $7,"
			" $8::pg_catalog.regclass,"
			" NULLIF($9, ''))"
			" ON CONFLICT (name) DO NOTHING";
		nargs = 9;
	}
	else if (shape == REGISTRY_1_0_1)
	{
		sql = "INSERT INTO projcache.snapshot_registry"
			" (name, query, ttl, owner, column_names, column_types,"
			" id, view)"
			" VALUES ($1, $2, $3, $4::pg_catalog.regrole, $5,"
			" $6::pg_catalog.regtype[], $7, $8::pg_catalog.regclass)"
			" ON CONFLICT (name) DO NOTHING";
		nargs = 8;
	}
	else
	{
		Assert(!OidIsValid(view));
		sql = "INSERT INTO projcache.snapshot_registry"
			" (name, query, ttl, owner, column_names, column_types,"
			" id)"
			" VALUES ($1, $2, $3, $4::pg_catalog.regrole, $5,"
			" $6::pg_catalog.regtype[], $7)"
			" ON CONFLICT (name) DO NOTHING";
		nargs = 7;
	}
	return registry_modify(sql, nargs, argtypes, args, NULL) > 0;
}

/* Delete a registration.  Returns false if there was none of that name. */
bool
pc_registry_delete(const char *name)
{
	Oid			argtypes[1] = {TEXTOID};
	Datum		args[1];

	args[0] = CStringGetTextDatum(name);
	return registry_modify("DELETE FROM projcache.snapshot_registry"
						   " WHERE name OPERATOR(pg_catalog.=) $1",
						   1, argtypes, args, NULL) > 0;
}

/*
 * Allow reader to read a snapshot (allowed), or no longer.  Granting twice
 * lists the reader once.
 */
void
pc_registry_set_reader(const char *name, Oid reader, bool allowed)
{
	Oid			argtypes[2] = {TEXTOID, OIDOID};
	Datum		args[2];

	args[0] = CStringGetTextDatum(name);
	args[1] = ObjectIdGetDatum(reader);
	if (allowed)
		(void) registry_modify("UPDATE projcache.snapshot_registry"
							   " SET readers = readers OPERATOR(pg_catalog.||)"
							   " $2::pg_catalog.regrole"
							   " WHERE name OPERATOR(pg_catalog.=) $1"
							   " AND NOT $2::pg_catalog.regrole"
							   " OPERATOR(pg_catalog.=) ANY (readers)",
							   2, argtypes, args, NULL);
	else
		(void) registry_modify("UPDATE projcache.snapshot_registry"
							   " SET readers = pg_catalog.array_remove(readers,"
							   " $2::pg_catalog.regrole)"
							   " WHERE name OPERATOR(pg_catalog.=) $1",
							   2, argtypes, args, NULL);
}

/*
 * Record the backing view bound to a registration made under the 1.0 SQL,
 * or (view InvalidOid) why none could be bound.
 */
void
pc_registry_set_view(int64 id, Oid view, const char *bind_error)
{
	Oid			argtypes[3] = {INT8OID, OIDOID, TEXTOID};
	Datum		args[3];
	char		nulls[3] = {' ', ' ', ' '};

	Assert(OidIsValid(view) != (bind_error != NULL));
	args[0] = Int64GetDatum(id);
	args[1] = ObjectIdGetDatum(view);
	args[2] = bind_error ? CStringGetTextDatum(bind_error) : (Datum) 0;
	if (!OidIsValid(view))
		nulls[1] = 'n';
	if (bind_error == NULL)
		nulls[2] = 'n';
	(void) registry_modify("UPDATE projcache.snapshot_registry"
						   " SET view = $2::pg_catalog.regclass,"
						   " bind_error = $3"
						   " WHERE id OPERATOR(pg_catalog.=) $1",
						   3, argtypes, args, nulls);
}

/*
 * Before commit, after a view was dropped (snapshot_xact.c): delete the
 * registrations whose backing view is gone.  Returns which were deleted
 * (SnapRegId, in the caller's memory context), so that their slots can be
 * freed at commit.
 */
List *
pc_registry_delete_orphans(void)
{
	MemoryContext callercxt = CurrentMemoryContext;
	PcUserSwitch rs;
	List	   *deleted = NIL;
	uint64		row;

	/* DROP EXTENSION or DROP SCHEMA took the registry with the views. */
	if (!OidIsValid(pc_registry_relid()) || !pc_registry_has_views())
		return NIL;
	CommandCounterIncrement();
	pc_become_extension(&rs);
	if (SPI_connect() != SPI_OK_CONNECT)
		elog(ERROR, "SPI_connect failed");
	PushActiveSnapshot(GetTransactionSnapshot());
	if (SPI_execute("DELETE FROM projcache.snapshot_registry r"
					" WHERE r.view IS NOT NULL AND NOT EXISTS"
					" (SELECT FROM pg_catalog.pg_class c"
					"  WHERE c.oid OPERATOR(pg_catalog.=)"
					"  r.view::pg_catalog.oid)"
					" RETURNING r.name, r.id,"
					" (extract(epoch FROM r.created_at) * 1000000)::int8",
					false, 0) != SPI_OK_DELETE_RETURNING)
		elog(ERROR, "could not delete registrations whose view was dropped");
	/* A failed DELETE aborts the transaction: nothing to mark then. */
	if (SPI_processed > 0)
		pc_registry_changed();
	for (row = 0; row < SPI_processed; row++)
	{
		HeapTuple	tup = SPI_tuptable->vals[row];
		TupleDesc	desc = SPI_tuptable->tupdesc;
		bool		isnull;
		MemoryContext oldcxt = MemoryContextSwitchTo(callercxt);
		SnapRegId  *r = palloc(sizeof(SnapRegId));

		r->name = SPI_getvalue(tup, desc, 1);
		r->id = DatumGetInt64(SPI_getbinval(tup, desc, 2, &isnull));
		r->stamp = DatumGetInt64(SPI_getbinval(tup, desc, 3, &isnull));
		deleted = lappend(deleted, r);
		MemoryContextSwitchTo(oldcxt);
	}
	PopActiveSnapshot();
	SPI_finish();
	pc_unbecome(&rs);
	return deleted;
}

/* ----------------------------------------------------------------
 * What a registration allows
 * ----------------------------------------------------------------
 */

void
pc_snap_check_owner(SnapReg *reg)
{
	if (!has_privs_of_role(GetUserId(), reg->owner))
		ereport(ERROR,
				(errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
				 errmsg("must be owner of snapshot \"%s\"", reg->name)));
}

/*
 * May the current user read the snapshot: its owner's privileges, or a
 * grant?
 */
bool
pc_snap_may_read(SnapReg *reg)
{
	Oid			me = GetUserId();
	int			i;

	if (has_privs_of_role(me, reg->owner))
		return true;
	for (i = 0; i < reg->nreaders; i++)
		if (has_privs_of_role(me, reg->readers[i]))
			return true;
	return false;
}

void
pc_snap_check_reader(SnapReg *reg)
{
	if (pc_snap_may_read(reg))
		return;
	ereport(ERROR,
			(errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
			 errmsg("permission denied for snapshot \"%s\"", reg->name),
			 errhint("The snapshot's owner can allow it with projcache.grant_snapshot().")));
}

TupleDesc
pc_snap_registered_desc(SnapReg *reg)
{
	TupleDesc	desc = CreateTemplateTupleDesc(reg->natts);
	int			i;

	for (i = 0; i < reg->natts; i++)
		TupleDescInitEntry(desc, (AttrNumber) (i + 1), reg->colnames[i],
						   reg->coltypes[i], -1, 0);
	return desc;
}

char *
pc_snap_describe_columns(SnapReg *reg)
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
bool
pc_snap_desc_matches(SnapReg *reg, TupleDesc desc)
{
	return pc_snap_types_match(reg->natts, reg->coltypes, desc);
}
