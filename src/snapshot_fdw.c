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
#include "access/stratnum.h"
#include "access/table.h"
#include "catalog/heap.h"
#include "catalog/pg_authid.h"
#include "catalog/pg_foreign_table.h"
#include "commands/defrem.h"
#include "executor/executor.h"
#include "executor/spi.h"
#include "foreign/fdwapi.h"
#include "foreign/foreign.h"
#include "miscadmin.h"
#include "nodes/makefuncs.h"
#include "optimizer/cost.h"
#include "optimizer/optimizer.h"
#include "optimizer/pathnode.h"
#include "optimizer/planmain.h"
#include "optimizer/paths.h"
#include "optimizer/restrictinfo.h"
#include "parser/parsetree.h"
#include "utils/typcache.h"
#include "utils/acl.h"
#include "utils/array.h"
#include "utils/pg_locale.h"
#include "utils/builtins.h"
#include "utils/lsyscache.h"
#include "utils/rel.h"

#include "compat_explain.h"
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
	/* under EXPLAIN without ANALYZE: the registration, and the verdict */
	SnapReg    *explain_reg;
	bool		explain_readable;
	char	   *blob;			/* its rows: MAXALIGNed MinimalTuples */
	Size		size;
	int64		nrows;
	const char *next;			/* the next row to return, in blob */
	int64		rows_left;		/* rows from next to the end */
	HeapTupleData tuple;		/* points into blob: the row being returned */
	/* when the foreign table has dropped columns: rows are placed */
	TupleTableSlot *stored_slot;

	/* a probe of the key index, when the plan uses it */
	ExprState  *key_expr;		/* the value the key must equal */
	Oid			key_type;
	const PcSnapIndex *index;	/* NULL: scan every row (the qual filters) */
	bool		probing;		/* the probe below is set up for this scan */
	PcSnapIndexProbe probe;

	/* unpins blob when the query's memory goes, if the scan did not end */
	MemoryContextCallback unpin_callback;
} SnapScanState;

/* What planning found out about a foreign table (baserel->fdw_private). */
typedef struct SnapPlanInfo
{
	char	   *name;
	AttrNumber	key_attnum;		/* the key column in the foreign table, or 0 */
	int			key_position;	/* and among the snapshot's columns (1-based) */
	char	   *key_column;
	Oid			key_eq_opr;		/* its type's default equality operator */
	bool		readable;		/* the reader may read it: all above is set */
} SnapPlanInfo;

/*
 * fdw_private of a ForeignScan: the snapshot's name; its key column or "";
 * the key's position among its columns if the plan probes the index, else
 * 0; 1 if the plan was made from what the snapshot holds (its row count,
 * its key), which only a role that may read it may see, else 0.  (Plans
 * are not invalidated when a snapshot is registered again: a scan probes
 * only if the key is still at that position.)
 */
#define FDW_PRIVATE_NAME		0
#define FDW_PRIVATE_KEY			1
#define FDW_PRIVATE_PROBE		2
#define FDW_PRIVATE_READABLE	3

static Oid	hash_equality(Oid type);

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

/*
 * The registration of a snapshot, or NULL if there is none, with whether
 * the reader may read it (the user the table's privileges are checked
 * for: a view's owner, when a view reads the foreign table; the current
 * user when userid is not valid).  Unlike lookup_for_reader, no error if
 * it may not: planning and EXPLAIN then show nothing of the snapshot.
 * From the backend's cache while nothing changed.
 */
static SnapReg *
lookup_with_verdict(const char *name, Oid userid, bool *readable)
{
	SnapReg    *reg = pc_registry_lookup_cached(name, true);
	PcUserSwitch rs;

	*readable = false;
	if (reg == NULL)
		return NULL;
	if (!OidIsValid(userid) || userid == GetUserId())
		*readable = pc_snap_may_read(reg);
	else
	{
		pc_become(&rs, PC_AS_READER, userid, SAFE_SEARCH_PATH);
		*readable = pc_snap_may_read(reg);
		pc_unbecome(&rs);
	}
	return reg;
}

/* ----------------------------------------------------------------
 * Planning
 * ----------------------------------------------------------------
 */

/*
 * The row estimate is the snapshot's row count, if it is loaded and the
 * reader may read it (the registration comes from the backend's cache, so
 * that a query planned each time does no catalog work for it while nothing
 * changed).  For a reader that may not, the plan is made as for a snapshot
 * that is not there: a default estimate and no key index, so that neither
 * EXPLAIN nor the estimates of the nodes above tell it anything.
 *
 * The plan then depends on who plans it.  When the reader is the current
 * user, a cached plan is made again for another user (dependsOnRole); a
 * plan read through a view is the view owner's, made again if the owner
 * changes.  A grant revoked after planning invalidates nothing, so the
 * scan checks again when it begins, under EXPLAIN too (snap_begin_scan).
 */
static void
snap_get_rel_size(PlannerInfo *root, RelOptInfo *baserel, Oid foreigntableid)
{
	char	   *name = snapshot_option(foreigntableid);
	SnapPlanInfo *plan_info;
	SnapReg    *reg;
	PcSnapInfo	info;

	pc_require_loaded();
	plan_info = palloc0(sizeof(SnapPlanInfo));
	plan_info->name = name;
	baserel->fdw_private = plan_info;
	baserel->rows = PC_FDW_UNKNOWN_ROWS;
	if (!OidIsValid(baserel->userid))
		root->glob->dependsOnRole = true;
	reg = lookup_with_verdict(name, baserel->userid, &plan_info->readable);
	if (!plan_info->readable)
		reg = NULL;
	if (reg != NULL &&
		pc_snap_describe(MyDatabaseId, reg->name, reg->id, reg->stamp, &info) &&
		info.loaded)
		baserel->rows = Max(info.rows, 1);
	baserel->tuples = baserel->rows;
	/* What the quals leave of them, for the joins above. */
	baserel->rows =
		clamp_row_est(baserel->tuples *
					  clauselist_selectivity(root,
											 baserel->baserestrictinfo,
											 0, JOIN_INNER, NULL));

	/*
	 * The key column, matched by position among the table's columns (the scan
	 * checks that the types are the snapshot's).
	 */
	if (reg != NULL && reg->key_attno > 0)
	{
		Relation	rel = table_open(foreigntableid, NoLock);
		TupleDesc	desc = RelationGetDescr(rel);
		int			n = 0;
		int			i;

		for (i = 0; i < desc->natts; i++)
		{
			Form_pg_attribute att = TupleDescAttr(desc, i);

			if (att->attisdropped)
				continue;
			if (++n == reg->key_attno &&
				att->atttypid == reg->coltypes[reg->key_attno - 1])
			{
				plan_info->key_attnum = att->attnum;
				plan_info->key_position = reg->key_attno;
				plan_info->key_column = pstrdup(NameStr(att->attname));
				plan_info->key_eq_opr = hash_equality(att->atttypid);
			}
		}
		table_close(rel, NoLock);
	}
}

/*
 * The equality operator of the type's default hash opclass: the one whose
 * matches the index's hashes find (InvalidOid if none).
 */
static Oid
hash_equality(Oid type)
{
	TypeCacheEntry *tc = lookup_type_cache(type, TYPECACHE_HASH_OPFAMILY);

	if (!OidIsValid(tc->hash_opf))
		return InvalidOid;
	/* The opclass's input type: text for varchar, the base of a domain. */
	return get_opfamily_member(tc->hash_opf, tc->hash_opintype,
							   tc->hash_opintype, HTEqualStrategyNumber);
}

/*
 * Is node the key column of rel?  Under a binary-compatible relabeling, as
 * when a varchar or a domain is compared with its opclass's type.
 */
static bool
is_key_column(Node *node, RelOptInfo *rel, SnapPlanInfo *plan_info)
{
	while (node != NULL && IsA(node, RelabelType))
		node = (Node *) ((RelabelType *) node)->arg;
	return node != NULL && IsA(node, Var) &&
		((Var *) node)->varno == rel->relid &&
		((Var *) node)->varattno == plan_info->key_attnum &&
		((Var *) node)->varlevelsup == 0;
}

/*
 * Is the clause "key = value", with the key type's own equality operator,
 * under a deterministic collation, and value not depending on this
 * relation nor volatile?  Then returns value.
 */
static Expr *
key_clause_value(PlannerInfo *root, RelOptInfo *baserel,
				 SnapPlanInfo *plan_info, RestrictInfo *rinfo)
{
	OpExpr	   *op = (OpExpr *) rinfo->clause;
	Node	   *left;
	Node	   *right;
	Node	   *value;

	if (!IsA(op, OpExpr) || list_length(op->args) != 2 ||
		op->opno != plan_info->key_eq_opr)
		return NULL;
	if (OidIsValid(op->inputcollid) &&
		!get_collation_isdeterministic(op->inputcollid))
		return NULL;
	left = linitial(op->args);
	right = lsecond(op->args);
	if (is_key_column(left, baserel, plan_info))
		value = right;
	else if (is_key_column(right, baserel, plan_info))
		value = left;
	else
		return NULL;
	if (bms_is_member(baserel->relid, pull_varnos(root, value)) ||
		contain_volatile_functions(value))
		return NULL;
	return (Expr *) value;
}

/* For generate_implied_equalities_for_column: is em the key column? */
static bool
key_member(PlannerInfo *root, RelOptInfo *rel, EquivalenceClass *ec,
		   EquivalenceMember *em, void *arg)
{
	return is_key_column((Node *) em->em_expr, rel, (SnapPlanInfo *) arg);
}

/*
 * A full scan; with a key index, a probe for each "key = value" qual, and
 * a parameterized probe for each join clause on the key (the inner side of
 * a nested loop).  A path's fdw_private holds the value it probes for.
 */
static void
snap_get_paths(PlannerInfo *root, RelOptInfo *baserel, Oid foreigntableid)
{
	SnapPlanInfo *plan_info = (SnapPlanInfo *) baserel->fdw_private;

	/* Rows are copied out once, then each costs less than a heap tuple. */
	Cost		startup = 1;
	Cost		run = baserel->tuples * cpu_tuple_cost * 0.5;
	Cost		probe = cpu_operator_cost * 4;
	List	   *join_clauses;
	List	   *implied;
	Relids		lateral;
	ListCell   *lc;

	add_path(baserel, (Path *)
			 pc_create_foreignscan_path(root, baserel, NULL, baserel->rows,
										startup, startup + run,
										NIL, NULL, NULL, NIL));
	if (plan_info->key_attnum == 0)
		return;

	foreach(lc, baserel->baserestrictinfo)
	{
		Expr	   *value = key_clause_value(root, baserel, plan_info,
											 lfirst(lc));

		if (value == NULL || !bms_is_empty(pull_varnos(root, (Node *) value)))
			continue;
		add_path(baserel, (Path *)
				 pc_create_foreignscan_path(root, baserel, NULL, 1,
											startup, startup + probe,
											NIL, NULL, NULL,
											list_make1(value)));
	}

	join_clauses = list_copy(baserel->joininfo);
	lateral = baserel->lateral_referencers;
	implied = generate_implied_equalities_for_column(root, baserel,
													 key_member, plan_info,
													 lateral);
	join_clauses = list_concat(join_clauses, implied);
	foreach(lc, join_clauses)
	{
		RestrictInfo *rinfo = lfirst(lc);
		Expr	   *value = key_clause_value(root, baserel, plan_info, rinfo);
		Relids		required_outer;
		ParamPathInfo *param_info;

		if (value == NULL ||
			!join_clause_is_movable_to(rinfo, baserel))
			continue;
		required_outer = bms_union(rinfo->clause_relids,
								   baserel->lateral_relids);
		required_outer = bms_del_member(required_outer, baserel->relid);
		if (bms_is_empty(required_outer))
			continue;
		param_info = get_baserel_parampathinfo(root, baserel, required_outer);
		add_path(baserel, (Path *)
				 pc_create_foreignscan_path(root, baserel, NULL,
											clamp_row_est(param_info->ppi_rows),
											startup, startup + probe,
											NIL, required_outer, NULL,
											list_make1(value)));
	}
}

static ForeignScan *
snap_get_plan(PlannerInfo *root, RelOptInfo *baserel, Oid foreigntableid,
			  ForeignPath *best_path, List *tlist, List *scan_clauses,
			  Plan *outer_plan)
{
	SnapPlanInfo *plan_info = (SnapPlanInfo *) baserel->fdw_private;
	List	   *probe_value = best_path->fdw_private;

	/* Every qual is checked by the executor, the probed one too. */
	scan_clauses = extract_actual_clauses(scan_clauses, false);
	return make_foreignscan(tlist, scan_clauses, baserel->relid,
							probe_value,
							list_make4(makeString(plan_info->name),
									   makeString(plan_info->key_column ?
												  plan_info->key_column : ""),
									   makeInteger(probe_value != NIL ?
												   plan_info->key_position : 0),
									   makeInteger(plan_info->readable ?
												   1 : 0)),
							NIL, NIL, outer_plan);
}

/* ----------------------------------------------------------------
 * Execution
 * ----------------------------------------------------------------
 */

/*
 * The registration, if the reader may read it: the reader is the user the
 * table's privileges are checked for (a view's owner, when a view reads
 * the foreign table).  From the backend's cache while nothing changed.
 */
static SnapReg *
lookup_for_reader(const char *name, Oid userid)
{
	PcUserSwitch rs;
	SnapReg    *reg;

	if (!OidIsValid(userid) || userid == GetUserId())
		return pc_registry_lookup_for_read(name, false);
	pc_become(&rs, PC_AS_READER, userid, SAFE_SEARCH_PATH);
	reg = pc_registry_lookup_for_read(name, false);
	pc_unbecome(&rs);
	return reg;
}

static void
unpin_at_query_end(void *arg)
{
	SnapScanState *st = (SnapScanState *) arg;

	if (st->blob != NULL)
		pc_snap_unpin_copy(st->blob);
	st->blob = NULL;
}

/*
 * Refuse a plan that reads xmin, xmax, cmin or cmax of the scan's rows.
 * The scan hands the executor each row as a heap tuple whose header is
 * the bytes before its MinimalTuple in the snapshot (see snap_iterate):
 * those are the end of the previous row, not a header.  tableoid and ctid
 * (t_self, always the invalid TID) are set for every row.
 *
 * The check is on the expressions the executor evaluates on the scan's
 * rows, its target list and its quals, so it holds whatever asked for the
 * column: the query, an inheritance parent or a partitioned table (whose
 * children have no attr_needed at planning), a UNION ALL.  ctid is allowed
 * because the planner itself asks every member of an inheritance tree for
 * it (FOR UPDATE, UPDATE ... FROM), where an invalid TID is what a row
 * that has none should give.
 */
static void
refuse_header_columns(ForeignScan *plan, Relation rel)
{
	Bitmapset  *attrs = NULL;
	int			x = -1;

	pull_varattnos((Node *) plan->scan.plan.targetlist, plan->scan.scanrelid,
				   &attrs);
	pull_varattnos((Node *) plan->scan.plan.qual, plan->scan.scanrelid,
				   &attrs);
	while ((x = bms_next_member(attrs, x)) >= 0)
	{
		AttrNumber	attno = x + FirstLowInvalidHeapAttributeNumber;

		if (attno >= 0 || attno == TableOidAttributeNumber ||
			attno == SelfItemPointerAttributeNumber)
			continue;
		ereport(ERROR,
				(errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
				 errmsg("system column \"%s\" is not available on projcache foreign table \"%s\"",
						NameStr(SystemAttributeDefinition(attno)->attname),
						RelationGetRelationName(rel)),
				 errdetail("Snapshot rows carry no transaction information: of the system columns they have only tableoid, and ctid, which is always invalid.")));
	}
}

/*
 * BeginForeignScan: read the registration for the role the table is read
 * for, refusing one that may not read it, check the table's columns
 * against it, and copy out the rows to serve, pinned until the query ends.
 * With the plan's key, the scan probes the key index.  EXPLAIN alone loads
 * nothing: it keeps the registration and the verdict for snap_explain.
 */
static void
snap_begin_scan(ForeignScanState *node, int eflags)
{
	ForeignScan *plan = (ForeignScan *) node->ss.ps.plan;
	EState	   *estate = node->ss.ps.state;
	TupleDesc	desc = RelationGetDescr(node->ss.ss_currentRelation);
	Oid			userid = pc_foreign_scan_user(plan, estate);
	SnapScanState *st = palloc0(sizeof(SnapScanState));
	int			i;

	node->fdw_state = st;
	st->name = strVal(list_nth(plan->fdw_private, FDW_PRIVATE_NAME));
	ItemPointerSetInvalid(&st->tuple.t_self);
	st->tuple.t_tableOid = RelationGetRelid(node->ss.ss_currentRelation);
	refuse_header_columns(plan, node->ss.ss_currentRelation);
	pc_require_loaded();
	if (eflags & EXEC_FLAG_EXPLAIN_ONLY)
	{
		bool		readable;
		SnapReg    *reg = lookup_with_verdict(st->name, userid,
											  &readable);

		/*
		 * A plan made for a reader that may read the snapshot carries its row
		 * count and key.  For one that may not now (a plan cached before a
		 * revoke, or planned as another role), EXPLAIN fails as the scan
		 * would, before anything of the plan is shown.
		 */
		if (reg != NULL && !readable &&
			intVal(list_nth(plan->fdw_private, FDW_PRIVATE_READABLE)) != 0)
			(void) lookup_for_reader(st->name, userid);
		st->explain_reg = reg;
		st->explain_readable = readable;
		return;
	}

	st->reg = lookup_for_reader(st->name, userid);
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
			st->stored_slot =
				MakeSingleTupleTableSlot(pc_snap_registered_desc(st->reg),
										 &TTSOpsMinimalTuple);
			break;
		}

	pc_snap_current_rows(st->reg, &st->blob, &st->size, &st->nrows);
	pc_snap_pin_copy(st->blob);
	st->next = st->blob;
	st->rows_left = st->nrows;
	/* An ERROR (in a subtransaction, too) skips the end of the scan. */
	st->unpin_callback.func = unpin_at_query_end;
	st->unpin_callback.arg = st;
	MemoryContextRegisterResetCallback(estate->es_query_cxt,
									   &st->unpin_callback);

	/*
	 * Probe only the index the plan was made for.  Without it (registered
	 * again since, without a key or with another), every row is read and the
	 * qual filters them.
	 */
	if (plan->fdw_exprs != NIL && st->reg->key_attno > 0 &&
		st->reg->key_attno == intVal(list_nth(plan->fdw_private,
											  FDW_PRIVATE_PROBE)))
	{
		st->index = pc_snap_find_index(st->blob, st->size, st->nrows);
		st->key_type = st->reg->coltypes[st->reg->key_attno - 1];
		st->key_expr = ExecInitExpr(linitial(plan->fdw_exprs),
									(PlanState *) node);
	}
}

/* The next row the key index gives, or NULL at the end. */
static MinimalTuple
next_probed_row(ForeignScanState *node, SnapScanState *st)
{
	uint64		found;

	if (!st->probing)
	{
		ExprContext *econtext = node->ss.ps.ps_ExprContext;
		bool		isnull;
		Datum		value;

		value = ExecEvalExprSwitchContext(st->key_expr, econtext, &isnull);
		st->probing = true;
		if (isnull)
		{
			st->probe.next = 0; /* NULL equals nothing */
			return NULL;
		}
		pc_snap_probe_begin(&st->probe, st->index,
							pc_snap_key_hash(st->key_type, value));
	}
	if (!pc_snap_probe_next(&st->probe, &found))
		return NULL;
	return (MinimalTuple) (st->blob + found);
}

/*
 * The next row.  A stored row is a MinimalTuple, which is a heap tuple
 * without its first MINIMAL_TUPLE_OFFSET bytes: the scan slot is given it
 * as a heap tuple pointing that much before, as a minimal-tuple slot does
 * itself, so nothing is copied or deformed until a column is read.  The
 * header bytes before are never read: the scan refused, when it began, a
 * plan that reads them (see refuse_header_columns).
 */
static TupleTableSlot *
snap_iterate(ForeignScanState *node)
{
	SnapScanState *st = (SnapScanState *) node->fdw_state;
	TupleTableSlot *slot = node->ss.ss_ScanTupleSlot;
	MinimalTuple mt;

	if (likely(st->index == NULL))
	{
		if (st->rows_left <= 0)
			return ExecClearTuple(slot);
		mt = (MinimalTuple) st->next;
		st->next += MAXALIGN(mt->t_len);
		st->rows_left--;
	}
	else if ((mt = next_probed_row(node, st)) == NULL)
		return ExecClearTuple(slot);

	if (likely(st->stored_slot == NULL))
	{
		HeapTupleTableSlot *hslot = (HeapTupleTableSlot *) slot;

		/* t_self and t_tableOid were set when the scan began */
		st->tuple.t_len = mt->t_len + MINIMAL_TUPLE_OFFSET;
		st->tuple.t_data =
			(HeapTupleHeader) ((char *) mt - MINIMAL_TUPLE_OFFSET);

		/*
		 * A store per row is about a tenth of a count(*)'s time.  While the
		 * slot still holds this scan's tuple header, not materialized (a
		 * reader that keeps rows materializes them into copies), that header
		 * now points at the next row, and all a store would do besides is to
		 * forget the columns deformed from the last one.
		 */
		if (TTS_IS_HEAPTUPLE(slot) && !TTS_EMPTY(slot) &&
			!TTS_SHOULDFREE(slot) && hslot->tuple == &st->tuple)
		{
			slot->tts_nvalid = 0;
			hslot->off = 0;
		}
		else
			ExecStoreHeapTuple(&st->tuple, slot, false);
	}
	else
	{
		/* The foreign table has dropped columns: place the values. */
		ExecClearTuple(slot);
		ExecStoreMinimalTuple(mt, st->stored_slot, false);
		pc_snap_place_values(slot->tts_tupleDescriptor, st->stored_slot,
							 slot->tts_values, slot->tts_isnull);
		ExecStoreVirtualTuple(slot);
		slot->tts_tableOid = RelationGetRelid(node->ss.ss_currentRelation);
	}
	return slot;
}

static void
snap_rescan(ForeignScanState *node)
{
	SnapScanState *st = (SnapScanState *) node->fdw_state;

	st->next = st->blob;
	st->rows_left = st->nrows;
	st->probing = false;		/* the value may have changed (a new param) */
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

/*
 * EXPLAIN: the snapshot's name, whether the key index is probed, and what
 * its slot holds now; to a reader that may not read the snapshot, only its
 * name, which the foreign table's options show anyway.
 */
static void
snap_explain(ForeignScanState *node, ExplainState *es)
{
	SnapScanState *st = (SnapScanState *) node->fdw_state;
	ForeignScan *plan = (ForeignScan *) node->ss.ps.plan;
	SnapReg    *reg = st->reg ? st->reg : st->explain_reg;
	char	   *key = strVal(list_nth(plan->fdw_private, FDW_PRIVATE_KEY));
	bool		probes =
		intVal(list_nth(plan->fdw_private, FDW_PRIVATE_PROBE)) != 0;
	PcSnapInfo	info;
	char	   *status;

	ExplainPropertyText("Snapshot", st->name, es);
	/* A scan that began has checked the reader (snap_begin_scan). */
	if (st->reg == NULL && reg != NULL && !st->explain_readable)
		return;
	if (key[0] != '\0')
		ExplainPropertyText("Key Index",
							psprintf("%s (%s)", key,
									 probes ? "probed" : "not used"),
							es);
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

/*
 * One foreign table per snapshot of this database that the caller may
 * read, with its recorded columns.  LIMIT TO and EXCEPT name snapshots.
 */
static List *
snap_import_schema(ImportForeignSchemaStmt *stmt, Oid serverOid)
{
	ForeignServer *server = GetForeignServer(serverOid);
	List	   *commands = NIL;
	List	   *names;
	ListCell   *lc;

	pc_require_loaded();
	if (strcmp(stmt->remote_schema, "projcache") != 0)
		ereport(ERROR,
				(errcode(ERRCODE_FDW_SCHEMA_NOT_FOUND),
				 errmsg("schema \"%s\" is not available on server \"%s\"",
						stmt->remote_schema, server->servername),
				 errhint("Snapshots are imported with IMPORT FOREIGN SCHEMA projcache.")));

	names = pc_registry_names(false);

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
		if (reg == NULL || !pc_snap_may_read(reg))
			continue;

		initStringInfo(&cmd);
		appendStringInfo(&cmd, "CREATE FOREIGN TABLE %s (",
						 quote_identifier(name));
		for (i = 0; i < reg->natts; i++)
		{
			char	   *type =
				format_type_extended(reg->coltypes[i], -1,
									 FORMAT_TYPE_FORCE_QUALIFY |
									 FORMAT_TYPE_INVALID_AS_NULL);

			/*
			 * A 1.0 registration that could not be bound has no view to keep
			 * it.
			 */
			if (type == NULL)
			{
				ereport(WARNING,
						(errcode(ERRCODE_UNDEFINED_OBJECT),
						 errmsg("snapshot \"%s\" is not imported: the type of its column \"%s\" no longer exists",
								name, reg->colnames[i]),
						 errhint("Drop the snapshot and create it again.")));
				break;
			}
			appendStringInfo(&cmd, "%s%s %s", i > 0 ? ", " : "",
							 quote_identifier(reg->colnames[i]), type);
		}
		if (i < reg->natts)
			continue;
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
