/*-------------------------------------------------------------------------
 *
 * snapshot_view.c
 *	  Registering a snapshot: checking its name, ttl and query, and
 *	  creating the view that backs it.
 *
 * A snapshot's query is checked as its creator would run it (one
 * read-only SELECT the creator may run now), and bound into a view,
 * projcache.snapshot_<id>, owned by the snapshot's owner: the names it
 * uses are fixed when it is created, the objects it reads cannot be
 * dropped under it, and pg_dump and REASSIGN OWNED carry it.  The query is
 * parsed and analyzed as its owner only; the superuser stores the analyzed
 * tree (see pc_snap_create_view and user_switch.c).  The registration row
 * itself is written by snapshot_registry.c.
 *
 * Copyright (c) 2026, projcache developers
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/xact.h"
#include "catalog/dependency.h"
#include "catalog/namespace.h"
#include "catalog/pg_class.h"
#include "catalog/pg_extension.h"
#include "catalog/pg_type.h"
#include "commands/comment.h"
#include "commands/extension.h"
#include "commands/tablecmds.h"
#include "commands/view.h"
#include "common/int.h"
#include "executor/executor.h"
#include "executor/spi.h"
#include "miscadmin.h"
#include "nodes/makefuncs.h"
#include "nodes/nodeFuncs.h"
#include "nodes/parsenodes.h"
#include "parser/analyze.h"
#include "parser/parse_relation.h"
#include "parser/parser.h"
#include "utils/acl.h"
#include "utils/builtins.h"
#include "utils/lsyscache.h"
#include "utils/plancache.h"

#include "snapshot.h"

/* ----------------------------------------------------------------
 * Argument checks
 * ----------------------------------------------------------------
 */

char *
pc_snap_check_name(text *arg)
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

int64
pc_snap_check_ttl(Interval *ttl)
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
 * The query's checks
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
 * The creator owns the snapshot and its loads run as it: refuse a query it
 * may not run now (permission denied for a table it cannot read), as the
 * executor would check it, on the planned range table.
 */
static void
check_query_rights(SPIPlanPtr plan)
{
	CachedPlan *cplan = SPI_plan_get_cached_plan(plan);
	ListCell   *lc;

	foreach(lc, cplan->stmt_list)
	{
		PlannedStmt *stmt = lfirst_node(PlannedStmt, lc);

		if (stmt->commandType != CMD_UTILITY)
			(void) pc_exec_check_permissions(stmt, true);
	}
	/* The plan is not saved: its cached plan has no resource owner. */
	ReleaseCachedPlan(cplan, NULL);
}

/*
 * Check a snapshot query as the caller would run it: one read-only SELECT,
 * parsed and analyzed now with the given search path, so a typo fails at
 * registration.  Returns its result columns.
 */
TupleDesc
pc_snap_check_query(const char *query, const char *search_path)
{
	MemoryContext callercxt = CurrentMemoryContext;
	PcUserSwitch rs;
	SPIPlanPtr	plan;
	List	   *sources;
	CachedPlanSource *ps;
	ListCell   *lc;
	TupleDesc	result;
	int			i;

	pc_become(&rs, PC_AS_SNAPSHOT_OWNER, GetUserId(), search_path);
	if (SPI_connect() != SPI_OK_CONNECT)
		elog(ERROR, "SPI_connect failed");
	plan = SPI_prepare(query, 0, NULL);
	if (plan == NULL)
		elog(ERROR, "SPI_prepare failed: %s",
			 SPI_result_code_string(SPI_result));
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
	check_query_rights(plan);
	for (i = 0; i < ps->resultDesc->natts; i++)
	{
		Form_pg_attribute att = TupleDescAttr(ps->resultDesc, i);

		if (get_typtype(att->atttypid) == TYPTYPE_PSEUDO)
			ereport(ERROR,
					(errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
					 errmsg("snapshot column \"%s\" has pseudo-type %s",
							NameStr(att->attname),
							format_type_be(att->atttypid))));
	}
	MemoryContextSwitchTo(callercxt);
	result = CreateTupleDescCopy(ps->resultDesc);
	SPI_finish();
	pc_unbecome(&rs);
	return result;
}

/*
 * The caller's effective search path, spelled out: "$user" is expanded for
 * the caller (the view is created as another role) and temporary schemas
 * are left out.
 */
char *
pc_snap_creator_search_path(void)
{
	StringInfoData buf;
	ListCell   *lc;

	initStringInfo(&buf);
	foreach(lc, fetch_search_path(false))
	{
		Oid			nsp = lfirst_oid(lc);
		char	   *nspname;

		if (isAnyTempNamespace(nsp) ||
			(nspname = get_namespace_name(nsp)) == NULL)
			continue;
		appendStringInfo(&buf, "%s%s", buf.len > 0 ? ", " : "",
						 quote_identifier(nspname));
	}
	if (buf.len == 0)
		appendStringInfoString(&buf, "pg_catalog");
	return buf.data;
}

/* ----------------------------------------------------------------
 * The backing view
 * ----------------------------------------------------------------
 */

/*
 * The objects view $1's rule and columns depend on that are temporary, or
 * in this session's temporary schema.
 */
static const char *const view_temp_dependencies_sql =
"SELECT pg_catalog.count(*)"
" FROM pg_catalog.pg_depend d"
" WHERE ((d.classid OPERATOR(pg_catalog.=)"
"         'pg_catalog.pg_rewrite'::pg_catalog.regclass"
"   AND d.objid IN (SELECT oid FROM pg_catalog.pg_rewrite"
"     WHERE ev_class OPERATOR(pg_catalog.=) $1))"
"  OR (d.classid OPERATOR(pg_catalog.=)"
"      'pg_catalog.pg_class'::pg_catalog.regclass"
"   AND d.objid OPERATOR(pg_catalog.=) $1))"
" AND (d.refobjid IN (SELECT oid FROM pg_catalog.pg_class"
"   WHERE relpersistence OPERATOR(pg_catalog.=) 't')"
" OR d.refobjid IN (SELECT oid FROM pg_catalog.pg_type"
"   WHERE typnamespace OPERATOR(pg_catalog.=)"
"         pg_catalog.pg_my_temp_schema())"
" OR d.refobjid IN (SELECT oid FROM pg_catalog.pg_proc"
"   WHERE pronamespace OPERATOR(pg_catalog.=)"
"         pg_catalog.pg_my_temp_schema())"
" OR d.refobjid IN (SELECT oid FROM pg_catalog.pg_operator"
"   WHERE oprnamespace OPERATOR(pg_catalog.=)"
"         pg_catalog.pg_my_temp_schema()))";

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
	ret = SPI_execute_with_args(view_temp_dependencies_sql, 1, argtypes, args,
								NULL, false, 1);
	if (ret != SPI_OK_SELECT || SPI_processed != 1)
		elog(ERROR, "could not read the dependencies of view %u", view);
	return DatumGetInt64(SPI_getbinval(SPI_tuptable->vals[0],
									   SPI_tuptable->tupdesc, 1, &isnull)) > 0;
}

/*
 * Analyze a snapshot's query as its owner, with search_path, for the view
 * that backs it: the tree pc_snap_create_view() stores.  Analysis runs the
 * caller's code (a literal's input function, a domain's CHECK), so it runs
 * as the owner, never as the superuser that stores the view.  Checks what
 * CREATE VIEW would.
 */
static Query *
analyze_view_query(const char *query, const char *search_path, Oid owner)
{
	PcUserSwitch rs;
	List	   *raw;
	RawStmt    *rawstmt;
	Query	   *tree;
	ListCell   *lc;

	pc_become(&rs, PC_AS_SNAPSHOT_OWNER, owner, search_path);
	raw = raw_parser(query, RAW_PARSE_DEFAULT);
	/* Exactly one SELECT: the query cannot smuggle more. */
	if (list_length(raw) != 1 ||
		!IsA(linitial_node(RawStmt, raw)->stmt, SelectStmt) ||
		((SelectStmt *) linitial_node(RawStmt, raw)->stmt)->intoClause != NULL)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("snapshot query must be a single SELECT")));
	rawstmt = linitial_node(RawStmt, raw);
	tree = parse_analyze_fixedparams(rawstmt, query, NULL, 0, NULL);
	if (tree->commandType != CMD_SELECT || tree->utilityStmt != NULL)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("snapshot query must be a single SELECT")));
	if (tree->hasModifyingCTE)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("snapshot query must be read-only")));
	if (isQueryUsingTempRelation(tree))
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("snapshot query must not use temporary objects"),
				 errdetail("Every reader is served its rows: it cannot depend on one session.")));
	/* The owner may use each column's type, as CREATE VIEW checks. */
	foreach(lc, tree->targetList)
	{
		TargetEntry *tle = lfirst_node(TargetEntry, lc);
		Oid			type = exprType((Node *) tle->expr);
		AclResult	aclresult;

		if (tle->resjunk)
			continue;
		aclresult = pc_type_aclcheck(type, owner, ACL_USAGE);
		if (aclresult != ACLCHECK_OK)
			aclcheck_error_type(aclresult, type);
	}
	pc_unbecome(&rs);
	return tree;
}

/*
 * The relation of the view: one column per result column of the query,
 * owned by owner, in schema projcache.
 */
static Oid
define_view_relation(const char *relname, Query *tree, Oid owner)
{
	CreateStmt *create = makeNode(CreateStmt);
	ListCell   *lc;

	foreach(lc, tree->targetList)
	{
		TargetEntry *tle = lfirst_node(TargetEntry, lc);
		Node	   *expr = (Node *) tle->expr;
		ColumnDef  *def;

		if (tle->resjunk)
			continue;
		def = makeColumnDef(tle->resname, exprType(expr), exprTypmod(expr),
							exprCollation(expr));
		if (type_is_collatable(exprType(expr)) && !OidIsValid(def->collOid))
			ereport(ERROR,
					(errcode(ERRCODE_INDETERMINATE_COLLATION),
					 errmsg("could not determine which collation to use for snapshot column \"%s\"",
							def->colname),
					 errhint("Use the COLLATE clause to set the collation explicitly.")));
		create->tableElts = lappend(create->tableElts, def);
	}
	create->relation = makeRangeVar("projcache", pstrdup(relname), -1);
	create->oncommit = ONCOMMIT_NOOP;
	return DefineRelation(create, RELKIND_VIEW, owner, NULL, NULL).objectId;
}

/*
 * Create projcache.snapshot_<id>, the view that backs a snapshot, owned by
 * owner.  Its query's names are bound now, with search_path, by the
 * owner's analysis; nothing may be found in a temporary schema.  Owners
 * have no CREATE on schema projcache, so the relation and its rule are
 * stored by the bootstrap superuser, from the analyzed tree: no text of
 * the caller's is parsed as superuser, and nothing of the caller's runs
 * while the view is stored.  The view depends on the extension as an
 * ordinary object, also when made by an update script (which would make
 * it a member, and pg_dump leaves members out): DROP EXTENSION then needs
 * CASCADE while snapshots exist.
 */
Oid
pc_snap_create_view(int64 id, const char *name, const char *query,
					const char *search_path, Oid owner)
{
	PcUserSwitch rs;
	char		relname[NAMEDATALEN];
	Query	   *tree;
	Oid			view;
	Oid			rowtype;
	ObjectAddress view_addr;
	ObjectAddress ext_addr;

	snprintf(relname, NAMEDATALEN, "snapshot_" INT64_FORMAT, id);
	tree = analyze_view_query(query, search_path, owner);

	pc_become_extension(&rs);
	view = define_view_relation(relname, tree, owner);
	CommandCounterIncrement();
	StoreViewQuery(view, tree, false);
	CommandCounterIncrement();
	CreateComments(view, RelationRelationId, 0,
				   psprintf("backs projcache snapshot \"%s\"", name));
	if (SPI_connect() != SPI_OK_CONNECT)
		elog(ERROR, "SPI_connect failed");
	if (view_uses_temp_objects(view))
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("snapshot query must not use temporary objects"),
				 errdetail("Every reader is served its rows: it cannot depend on one session.")));
	SPI_finish();
	pc_unbecome(&rs);

	ObjectAddressSet(view_addr, RelationRelationId, view);
	ObjectAddressSet(ext_addr, ExtensionRelationId,
					 get_extension_oid("projcache", false));
	deleteDependencyRecordsForClass(RelationRelationId, view,
									ExtensionRelationId, DEPENDENCY_EXTENSION);
	/* 17 and later record the row type and its array as members too. */
	rowtype = get_rel_type_id(view);
	deleteDependencyRecordsForClass(TypeRelationId, rowtype,
									ExtensionRelationId, DEPENDENCY_EXTENSION);
	if (OidIsValid(get_array_type(rowtype)))
		deleteDependencyRecordsForClass(TypeRelationId, get_array_type(rowtype),
										ExtensionRelationId,
										DEPENDENCY_EXTENSION);
	recordDependencyOn(&view_addr, &ext_addr, DEPENDENCY_NORMAL);
	CommandCounterIncrement();
	return view;
}
