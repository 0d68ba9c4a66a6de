/*-------------------------------------------------------------------------
 *
 * snapshot_fdw.c
 *	  Snapshots as foreign tables: the projcache foreign-data wrapper.
 *
 *	  CREATE FOREIGN TABLE app.grants (user_id int, audience text)
 *		  SERVER projcache OPTIONS (snapshot 'grants');
 *	  IMPORT FOREIGN SCHEMA projcache FROM SERVER projcache INTO app;
 *
 * A scan serves what projcache.snapshot() would: it decides what rows to
 * serve by the same rules (pc_snap_current_rows: fast path, refresh with
 * last-good fallback, single flight, cold-start throttle, PC001), checks
 * the same grant, and the same column types (42804).  Unlike the
 * set-returning function, it fills no tuplestore: rows go to the executor
 * one by one, straight from the backend's copy of the snapshot, which the
 * scan pins so that no other read in the backend replaces it meanwhile.
 * The copy is taken whole when the scan starts, under the slot's lock, so
 * a refresh that publishes new rows during the scan is not seen by it: a
 * scan reads one snapshot, as a statement reads one table snapshot.
 *
 * The reader whose grant is checked is the one a table's privileges are
 * checked for: the current user, or the owner of a view that reads the
 * foreign table.  Foreign tables are read-only: no write callbacks.
 *
 * Copyright (c) 2026, projcache developers
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/htup_details.h"
#include "access/reloptions.h"
#include "access/sysattr.h"
#include "catalog/pg_authid.h"
#include "catalog/pg_foreign_table.h"
#include "commands/defrem.h"
#include "commands/explain.h"
#include "executor/executor.h"
#include "executor/spi.h"
#include "foreign/fdwapi.h"
#include "foreign/foreign.h"
#include "miscadmin.h"
#include "nodes/makefuncs.h"
#include "optimizer/optimizer.h"
#include "optimizer/pathnode.h"
#include "optimizer/planmain.h"
#include "optimizer/restrictinfo.h"
#include "utils/acl.h"
#include "utils/array.h"
#include "utils/builtins.h"
#include "utils/lsyscache.h"
#include "utils/rel.h"

#include "snapshot.h"

PG_FUNCTION_INFO_V1(projcache_fdw_handler);
PG_FUNCTION_INFO_V1(projcache_fdw_validator);

/* Rows assumed for a snapshot that is not loaded (or not registered). */
#define PC_FDW_UNKNOWN_ROWS 1000

/* What a scan needs at execution time. */
typedef struct SnapScanState
{
	char	   *name;			/* the snapshot */
	SnapReg    *reg;			/* NULL under EXPLAIN without ANALYZE */
	char	   *blob;			/* its rows: MAXALIGNed MinimalTuples */
	Size		size;
	int64		nrows;
	Size		offset;			/* of the next row in blob */
	int64		next_row;
	HeapTupleData tuple;		/* points into blob: the row being returned */
	/* when the foreign table has dropped columns: rows are placed */
	TupleTableSlot *stored_slot;
} SnapScanState;

/* The snapshot option of a foreign table. */
static char *
snapshot_option(Oid relid)
{
	ForeignTable *table = GetForeignTable(relid);
	ListCell   *lc;

	foreach(lc, table->options)
	{
		DefElem    *def = (DefElem *) lfirst(lc);

		if (strcmp(def->defname, "snapshot") == 0)
			return defGetString(def);
	}
	ereport(ERROR,
			(errcode(ERRCODE_FDW_OPTION_NAME_NOT_FOUND),
			 errmsg("foreign table \"%s\" has no \"snapshot\" option",
					get_rel_name(relid))));
	return NULL;				/* keep the compiler quiet */
}

/* ----------------------------------------------------------------
 * Planning
 * ----------------------------------------------------------------
 */

/*
 * The row estimate is the snapshot's row count, if it is loaded.  Rows
 * carry no system columns but tableoid: a query asking for one is refused
 * here, before it could read a value that is not there.
 */
static void
snap_get_rel_size(PlannerInfo *root, RelOptInfo *baserel, Oid foreigntableid)
{
	char	   *name = snapshot_option(foreigntableid);
	SnapReg    *reg;
	PcSnapInfo	info;
	AttrNumber	attno;

	pc_require_loaded();
	for (attno = baserel->min_attr; attno < 0; attno++)
	{
		if (attno == TableOidAttributeNumber ||
			bms_is_empty(baserel->attr_needed[attno - baserel->min_attr]))
			continue;
		ereport(ERROR,
				(errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
				 errmsg("system column \"%s\" is not available on projcache foreign table \"%s\"",
						get_attname(foreigntableid, attno, false),
						get_rel_name(foreigntableid)),
				 errdetail("Snapshot rows have no system columns but tableoid.")));
	}

	baserel->rows = PC_FDW_UNKNOWN_ROWS;
	reg = pc_registry_lookup(name, true);
	if (reg != NULL &&
		pc_snap_describe(MyDatabaseId, reg->name, reg->id, reg->stamp, &info) &&
		info.loaded)
		baserel->rows = Max(info.rows, 1);
	baserel->tuples = baserel->rows;
}

static void
snap_get_paths(PlannerInfo *root, RelOptInfo *baserel, Oid foreigntableid)
{
	/* Rows are copied out once, then each costs less than a heap tuple. */
	Cost		startup = 1;
	Cost		run = baserel->rows * cpu_tuple_cost * 0.5;

	add_path(baserel, (Path *)
			 create_foreignscan_path(root, baserel, NULL, baserel->rows,
									 startup, startup + run,
									 NIL, NULL, NULL, NIL));
}

static ForeignScan *
snap_get_plan(PlannerInfo *root, RelOptInfo *baserel, Oid foreigntableid,
			  ForeignPath *best_path, List *tlist, List *scan_clauses,
			  Plan *outer_plan)
{
	/* Every qual is checked by the executor. */
	scan_clauses = extract_actual_clauses(scan_clauses, false);
	return make_foreignscan(tlist, scan_clauses, baserel->relid, NIL,
							list_make1(makeString(snapshot_option(foreigntableid))),
							NIL, NIL, outer_plan);
}

/* ----------------------------------------------------------------
 * Execution
 * ----------------------------------------------------------------
 */

/*
 * Check the reader's grant, as the user the table's privileges are checked
 * for (a view's owner, when a view reads the foreign table).
 */
static void
check_reader_as(SnapReg *reg, Oid userid)
{
	RoleSwitch	rs;

	if (!OidIsValid(userid) || userid == GetUserId())
	{
		pc_snap_check_reader(reg);
		return;
	}
	pc_role_switch(&rs, userid);
	pc_snap_check_reader(reg);
	pc_role_restore(&rs);
}

static void
snap_begin_scan(ForeignScanState *node, int eflags)
{
	ForeignScan *plan = (ForeignScan *) node->ss.ps.plan;
	EState	   *estate = node->ss.ps.state;
	TupleDesc	desc = RelationGetDescr(node->ss.ss_currentRelation);
	RangeTblEntry *rte = exec_rt_fetch(plan->scan.scanrelid, estate);
	SnapScanState *st = palloc0(sizeof(SnapScanState));
	int			i;

	node->fdw_state = st;
	st->name = strVal(linitial(plan->fdw_private));
	if (eflags & EXEC_FLAG_EXPLAIN_ONLY)
		return;

	pc_require_loaded();
	st->reg = pc_registry_lookup(st->name, false);
	check_reader_as(st->reg, rte->checkAsUser);
	if (!pc_snap_desc_matches(st->reg, desc))
		ereport(ERROR,
				(errcode(ERRCODE_DATATYPE_MISMATCH),
				 errmsg("columns of foreign table \"%s\" do not match snapshot \"%s\"",
						RelationGetRelationName(node->ss.ss_currentRelation),
						st->name),
				 errdetail("Snapshot \"%s\" returns %s.", st->name,
						   pc_snap_describe_columns(st->reg))));
	for (i = 0; i < desc->natts; i++)
		if (TupleDescAttr(desc, i)->attisdropped)
		{
			st->stored_slot = MakeSingleTupleTableSlot(pc_snap_registered_desc(st->reg),
													   &TTSOpsMinimalTuple);
			break;
		}

	pc_snap_current_rows(st->reg, &st->blob, &st->size, &st->nrows);
	pc_snap_pin_copy(st->blob);
}

/*
 * The next row.  A stored row is a MinimalTuple, which is a heap tuple
 * without its first MINIMAL_TUPLE_OFFSET bytes: the scan slot is given it
 * as a heap tuple pointing that much before, as a minimal-tuple slot does
 * itself, so nothing is copied or deformed until a column is read.  The
 * header bytes before are never read: system columns are refused at
 * planning (see snap_get_rel_size).
 */
static TupleTableSlot *
snap_iterate(ForeignScanState *node)
{
	SnapScanState *st = (SnapScanState *) node->fdw_state;
	TupleTableSlot *slot = node->ss.ss_ScanTupleSlot;
	MinimalTuple mt;

	ExecClearTuple(slot);
	if (st->next_row >= st->nrows || st->offset >= st->size)
		return slot;
	mt = (MinimalTuple) (st->blob + st->offset);
	st->offset += MAXALIGN(mt->t_len);
	st->next_row++;

	if (st->stored_slot == NULL)
	{
		st->tuple.t_len = mt->t_len + MINIMAL_TUPLE_OFFSET;
		st->tuple.t_data = (HeapTupleHeader) ((char *) mt - MINIMAL_TUPLE_OFFSET);
		ItemPointerSetInvalid(&st->tuple.t_self);
		st->tuple.t_tableOid = RelationGetRelid(node->ss.ss_currentRelation);
		ExecStoreHeapTuple(&st->tuple, slot, false);
	}
	else
	{
		/* The foreign table has dropped columns: place the values. */
		TupleDesc	out = slot->tts_tupleDescriptor;
		int			src = 0;
		int			a;

		ExecStoreMinimalTuple(mt, st->stored_slot, false);
		slot_getallattrs(st->stored_slot);
		for (a = 0; a < out->natts; a++)
		{
			if (TupleDescAttr(out, a)->attisdropped)
			{
				slot->tts_values[a] = (Datum) 0;
				slot->tts_isnull[a] = true;
				continue;
			}
			slot->tts_values[a] = st->stored_slot->tts_values[src];
			slot->tts_isnull[a] = st->stored_slot->tts_isnull[src];
			src++;
		}
		ExecStoreVirtualTuple(slot);
		slot->tts_tableOid = RelationGetRelid(node->ss.ss_currentRelation);
	}
	return slot;
}

static void
snap_rescan(ForeignScanState *node)
{
	SnapScanState *st = (SnapScanState *) node->fdw_state;

	st->offset = 0;
	st->next_row = 0;
}

static void
snap_end_scan(ForeignScanState *node)
{
	SnapScanState *st = (SnapScanState *) node->fdw_state;

	if (st == NULL)
		return;
	if (st->stored_slot != NULL)
		ExecDropSingleTupleTableSlot(st->stored_slot);
	if (st->blob != NULL)
		pc_snap_unpin_copy(st->blob);
	st->blob = NULL;
	pc_snap_trim_local_copy();
}

/* EXPLAIN: the snapshot's name and what its slot holds now. */
static void
snap_explain(ForeignScanState *node, ExplainState *es)
{
	SnapScanState *st = (SnapScanState *) node->fdw_state;
	SnapReg    *reg = st->reg ? st->reg : pc_registry_lookup(st->name, true);
	PcSnapInfo	info;
	char	   *status;

	ExplainPropertyText("Snapshot", st->name, es);
	if (reg == NULL)
		status = "not registered";
	else if (!pc_snap_describe(MyDatabaseId, reg->name, reg->id, reg->stamp,
							   &info) || !info.loaded)
		status = "not loaded";
	else
		status = psprintf("loaded, %lld rows", (long long) info.rows);
	ExplainPropertyText("Snapshot Status", status, es);
}

/*
 * Read-only: no write callbacks (a write fails with "cannot insert into
 * foreign table"), and the catalogs say it is not updatable.
 */
static int
snap_updatable(Relation rel)
{
	return 0;
}

/* ----------------------------------------------------------------
 * IMPORT FOREIGN SCHEMA projcache FROM SERVER projcache INTO ...
 * ----------------------------------------------------------------
 */

/* May the current user read the snapshot (pc_snap_check_reader's rule)? */
static bool
may_read(SnapReg *reg)
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

/*
 * One foreign table per snapshot of this database that the caller may
 * read, with its recorded columns.  LIMIT TO and EXCEPT name snapshots.
 */
static List *
snap_import_schema(ImportForeignSchemaStmt *stmt, Oid serverOid)
{
	ForeignServer *server = GetForeignServer(serverOid);
	List	   *commands = NIL;
	List	   *names = NIL;
	RoleSwitch	rs;
	ListCell   *lc;
	uint64		row;
	MemoryContext callercxt = CurrentMemoryContext;

	pc_require_loaded();
	if (strcmp(stmt->remote_schema, "projcache") != 0)
		ereport(ERROR,
				(errcode(ERRCODE_FDW_SCHEMA_NOT_FOUND),
				 errmsg("schema \"%s\" is not available on server \"%s\"",
						stmt->remote_schema, server->servername),
				 errhint("Snapshots are imported with IMPORT FOREIGN SCHEMA projcache.")));

	/* The registry is not readable by PUBLIC: list its names as superuser. */
	pc_role_switch(&rs, BOOTSTRAP_SUPERUSERID);
	if (SPI_connect() != SPI_OK_CONNECT)
		elog(ERROR, "SPI_connect failed");
	if (SPI_execute("SELECT name FROM projcache.snapshot_registry ORDER BY name",
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
	pc_role_restore(&rs);

	foreach(lc, names)
	{
		char	   *name = lfirst(lc);
		SnapReg    *reg;
		StringInfoData cmd;
		bool		listed = false;
		ListCell   *tl;
		int			i;

		foreach(tl, stmt->table_list)
			if (strcmp(((RangeVar *) lfirst(tl))->relname, name) == 0)
				listed = true;
		if ((stmt->list_type == FDW_IMPORT_SCHEMA_LIMIT_TO && !listed) ||
			(stmt->list_type == FDW_IMPORT_SCHEMA_EXCEPT && listed))
			continue;

		reg = pc_registry_lookup(name, true);
		if (reg == NULL || !may_read(reg))
			continue;

		initStringInfo(&cmd);
		appendStringInfo(&cmd, "CREATE FOREIGN TABLE %s (",
						 quote_identifier(name));
		for (i = 0; i < reg->natts; i++)
			appendStringInfo(&cmd, "%s%s %s", i > 0 ? ", " : "",
							 quote_identifier(reg->colnames[i]),
							 format_type_extended(reg->coltypes[i], -1,
												  FORMAT_TYPE_FORCE_QUALIFY));
		appendStringInfo(&cmd, ") SERVER %s OPTIONS (snapshot %s)",
						 quote_identifier(server->servername),
						 quote_literal_cstr(name));
		commands = lappend(commands, cmd.data);
	}
	return commands;
}

/* ----------------------------------------------------------------
 * The handler and the validator
 * ----------------------------------------------------------------
 */

Datum
projcache_fdw_handler(PG_FUNCTION_ARGS)
{
	FdwRoutine *routine = makeNode(FdwRoutine);

	routine->GetForeignRelSize = snap_get_rel_size;
	routine->GetForeignPaths = snap_get_paths;
	routine->GetForeignPlan = snap_get_plan;
	routine->BeginForeignScan = snap_begin_scan;
	routine->IterateForeignScan = snap_iterate;
	routine->ReScanForeignScan = snap_rescan;
	routine->EndForeignScan = snap_end_scan;
	routine->ExplainForeignScan = snap_explain;
	routine->IsForeignRelUpdatable = snap_updatable;
	routine->ImportForeignSchema = snap_import_schema;
	PG_RETURN_POINTER(routine);
}

/*
 * Foreign tables take one option, snapshot (required); the wrapper, its
 * servers and user mappings take none.
 */
Datum
projcache_fdw_validator(PG_FUNCTION_ARGS)
{
	List	   *options = untransformRelOptions(PG_GETARG_DATUM(0));
	Oid			catalog = PG_GETARG_OID(1);
	bool		has_snapshot = false;
	ListCell   *lc;

	foreach(lc, options)
	{
		DefElem    *def = (DefElem *) lfirst(lc);

		if (catalog == ForeignTableRelationId &&
			strcmp(def->defname, "snapshot") == 0)
		{
			if (defGetString(def)[0] == '\0')
				ereport(ERROR,
						(errcode(ERRCODE_FDW_INVALID_OPTION_NAME),
						 errmsg("option \"snapshot\" must name a snapshot")));
			has_snapshot = true;
			continue;
		}
		ereport(ERROR,
				(errcode(ERRCODE_FDW_INVALID_OPTION_NAME),
				 errmsg("invalid option \"%s\"", def->defname),
				 catalog == ForeignTableRelationId ?
				 errhint("The only option of a projcache foreign table is \"snapshot\".") :
				 errhint("projcache takes options only on foreign tables.")));
	}
	if (catalog == ForeignTableRelationId && !has_snapshot)
		ereport(ERROR,
				(errcode(ERRCODE_FDW_OPTION_NAME_NOT_FOUND),
				 errmsg("option \"snapshot\" is required"),
				 errhint("Name the snapshot: OPTIONS (snapshot 'name').")));
	PG_RETURN_VOID();
}
