/*-------------------------------------------------------------------------
 *
 * keycache_fetch_query.c
 *	  Which function a fetch calls, as which role, and the query that calls
 *	  it: the default cache's projcache.fetch_function resolved now, a named
 *	  cache's bound function checked again, and the call planned as a
 *	  set-returning function in FROM with the columns a fetch reads.
 *
 * Copyright (c) 2026, projcache developers
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "catalog/pg_proc.h"
#include "miscadmin.h"
#include "nodes/makefuncs.h"
#include "parser/parse_coerce.h"
#include "parser/parse_collate.h"
#include "parser/parse_func.h"
#include "parser/parse_relation.h"
#include "utils/acl.h"
#include "funcapi.h"
#include "utils/builtins.h"
#include "utils/lsyscache.h"
#include "utils/regproc.h"
#include "utils/syscache.h"

#include "compat.h"
#include "keycache_caches.h"
#include "keycache_fetch.h"

void
pc_fetch_period_columns_init(PeriodColumn *cols)
{
	cols[0].name = "max_age";
	cols[0].setting = "projcache.expiry";
	cols[1].name = "stale_for";
	cols[1].setting = "projcache.grace_period";
	for (int i = 0; i < NUM_PERIOD_COLUMNS; i++)
	{
		cols[i].attnum = 0;
		cols[i].problem = NULL;
	}
}

/*
 * A named cache's function and role (keycache_caches.c): the function it
 * is bound to, which must still exist with the owner it was bound with
 * (else another function now has its OID, or its owner gave it away), and
 * never a function that only has its name; its owner, or its fetch role if
 * the owner may still SET ROLE to it (a superuser fetch role only for a
 * superuser owner).  The owner must still have EXECUTE on the function.
 * Checked at each call: rights granted at create_cache() may have been
 * revoked since.
 */
static Oid
named_cache_function(const PcFetchTarget *t, Oid *roleid)
{
	Oid			fn = t->function_oid;
	HeapTuple	tup;
	Oid			fn_owner = InvalidOid;

	if (!OidIsValid(fn))
		ereport(ERROR,
				(errcode(ERRCODE_UNDEFINED_FUNCTION),
				 errmsg("%s", t->bind_error),
				 errhint("The cache's owner can bind it to a function with projcache.alter_cache(name, fetch_function => ...).")));
	tup = SearchSysCache1(PROCOID, ObjectIdGetDatum(fn));
	if (HeapTupleIsValid(tup))
	{
		fn_owner = ((Form_pg_proc) GETSTRUCT(tup))->proowner;
		ReleaseSysCache(tup);
	}
	if (fn_owner != t->function_owner || !OidIsValid(fn_owner))
		ereport(ERROR,
				(errcode(ERRCODE_UNDEFINED_FUNCTION),
				 errmsg("the function this named cache was registered with, %s, was dropped or has another owner",
						t->function),
				 errhint("The cache's owner can bind it to a function with projcache.alter_cache(name, fetch_function => ...).")));
	if (!SearchSysCacheExists1(AUTHOID, ObjectIdGetDatum(t->owner)))
		ereport(ERROR,
				(errcode(ERRCODE_UNDEFINED_OBJECT),
				 errmsg("the owner of this named cache no longer exists")));
	if (pc_proc_aclcheck(fn, t->owner, ACL_EXECUTE) != ACLCHECK_OK)
		ereport(ERROR,
				(errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
				 errmsg("the owner of this named cache may no longer execute %s",
						t->function)));
	*roleid = t->owner;
	if (OidIsValid(t->fetch_role))
	{
		if (!pc_member_can_set_role(t->owner, t->fetch_role) ||
			(superuser_arg(t->fetch_role) && !superuser_arg(t->owner)))
			ereport(ERROR,
					(errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
					 errmsg("the owner of this named cache may no longer fetch as role %u",
							t->fetch_role)));
		*roleid = t->fetch_role;
	}
	if (pc_fetch_escalates(fn, *roleid))
		ereport(ERROR,
				(errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
				 errmsg("this named cache fetches as a superuser, and the owner of %s is not one",
						t->function)));
	return fn;
}

/*
 * The function to call, and the role it runs as: a named cache's bound
 * function and role (named_cache_function()); for the default cache, the
 * function projcache.fetch_function names, run as projcache.fetch_role when
 * set, else as the function's owner, as if it were SECURITY DEFINER.  Both
 * are resolved now: the settings, the function and its owner may change.
 */
Oid
pc_fetch_target_function(const PcFetchTarget *target, Oid *roleid)
{
	Oid			argtypes[2] = {TEXTARRAYOID, TEXTARRAYOID};
	Oid			fn;
	HeapTuple	proctup;
	List	   *names;

	if (target->function != NULL)
		return named_cache_function(target, roleid);

	names = pc_string_to_qualified_name_list(pc_fetch_function);
	fn = LookupFuncName(names, 2, argtypes, true);
	if (!OidIsValid(fn))
		ereport(ERROR,
				(errcode(ERRCODE_UNDEFINED_FUNCTION),
				 errmsg("fetch function %s(text[], text[]) does not exist",
						NameListToString(names)),
				 errhint("Set projcache.fetch_function to a function of database \"%s\".",
						 pc_database)));

	if (pc_fetch_role != NULL && pc_fetch_role[0] != '\0')
		*roleid = get_role_oid(pc_fetch_role, false);
	else
	{
		proctup = SearchSysCache1(PROCOID, ObjectIdGetDatum(fn));
		if (!HeapTupleIsValid(proctup))
			elog(ERROR, "cache lookup failed for function %u", fn);
		*roleid = ((Form_pg_proc) GETSTRUCT(proctup))->proowner;
		ReleaseSysCache(proctup);
	}
	return fn;
}

/* One column of the call's query: the function's column fn_col, cast. */
static TargetEntry *
fetch_query_column(ParseState *pstate, int rtindex, TupleDesc desc,
				   int fn_col, Oid target_type, const char *name, int resno)
{
	Form_pg_attribute att = TupleDescAttr(desc, fn_col);
	Node	   *var = (Node *) makeVar(rtindex, att->attnum, att->atttypid,
									   att->atttypmod, att->attcollation, 0);
	Node	   *expr;

	/* As "::" resolves it. */
	expr = coerce_to_target_type(pstate, var, att->atttypid, target_type, -1,
								 COERCION_EXPLICIT, COERCE_EXPLICIT_CAST, -1);
	if (expr == NULL)
		ereport(ERROR,
				(errcode(ERRCODE_CANNOT_COERCE),
				 errmsg("fetch function result column %s has type %s, which cannot be cast to %s",
						name, format_type_be(att->atttypid),
						format_type_be(target_type))));
	return makeTargetEntry((Expr *) expr, (AttrNumber) resno, pstrdup(name),
						   false);
}

/*
 * Has fn the shape of a fetch function: a plain function (not a procedure
 * or an aggregate) of (text[], text[]) that returns a set?  The call built
 * by pc_fetch_query() is a set-returning one, and the planner expects the
 * function it names to be one: the function a cache is bound to is
 * checked again here, since its owner may have dropped it and created
 * another of that signature that returns one row (keycache_caches.c
 * binds a cache to a function of this shape only, and this is the last
 * word).  Reads the catalogs only.
 */
bool
pc_fetch_function_shape_ok(Oid fn)
{
	HeapTuple	tup;
	Form_pg_proc proc;
	bool		ok;

	tup = SearchSysCache1(PROCOID, ObjectIdGetDatum(fn));
	if (!HeapTupleIsValid(tup))
		return false;
	proc = (Form_pg_proc) GETSTRUCT(tup);
	ok = proc->prokind == PROKIND_FUNCTION && proc->proretset &&
		proc->pronargs == 2 &&
		proc->proargtypes.values[0] == TEXTARRAYOID &&
		proc->proargtypes.values[1] == TEXTARRAYOID;
	ReleaseSysCache(tup);
	return ok;
}

/*
 * The call of the fetch function fn, as a query tree:
 *
 *	 SELECT f.key::text, f.state::text, f.revision::text, f.config::jsonb
 *			[, f.max_age::interval] [, f.stale_for::interval]
 *	   FROM fn($1, $2) AS f(key, state, revision, config)
 *
 * The tree names fn by its OID.  It is never written as text and parsed
 * again: that would look fn's name up again, and a role that may create
 * functions in fn's schema could add one of that name (with a defaulted
 * third argument, the call is ambiguous and fails; with arguments that
 * match better, the call runs that function, as the fetch role).  The
 * casts are those "::" would choose, and the result is checked when the
 * call runs (check_result_types()).
 *
 * Its optional period columns are looked for by name after the first four
 * (filling in cols): one of type interval (or a domain over it) is
 * selected; one of another type is not, and cols says why.
 */
Query *
pc_fetch_query(Oid fn, PeriodColumn *cols)
{
	static const Oid base_types[4] = {TEXTOID, TEXTOID, TEXTOID, JSONBOID};
	static const char *const base_names[4] = {
		"key", "state", "revision", "config"
	};
	ParseState *pstate = make_parsestate(NULL);
	RangeFunction *rangefunc = makeNode(RangeFunction);
	RangeTblRef *rtr = makeNode(RangeTblRef);
	Query	   *query = makeNode(Query);
	ParseNamespaceItem *nsitem;
	FuncExpr   *call;
	List	   *args = NIL;
	List	   *aliases = NIL;
	List	   *tlist = NIL;
	TupleDesc	resultdesc;
	int			natts = 0;

	if (!pc_fetch_function_shape_ok(fn))
		ereport(ERROR,
				(errcode(ERRCODE_WRONG_OBJECT_TYPE),
				 errmsg("function %s is not a fetch function",
						format_procedure(fn)),
				 errdetail("A fetch function takes (keys text[], revisions text[]) and returns a set of rows.")));

	for (int i = 0; i < 2; i++)
	{
		Param	   *param = makeNode(Param);

		param->paramkind = PARAM_EXTERN;
		param->paramid = i + 1;
		param->paramtype = TEXTARRAYOID;
		param->paramtypmod = -1;
		param->paramcollid = get_typcollation(TEXTARRAYOID);
		param->location = -1;
		args = lappend(args, param);
	}
	call = makeFuncExpr(fn, get_func_rettype(fn), args, InvalidOid,
						InvalidOid, COERCE_EXPLICIT_CALL);
	call->funcretset = true;
	assign_expr_collations(pstate, (Node *) call);

	for (int i = 0; i < 4; i++)
		aliases = lappend(aliases, makeString(pstrdup(base_names[i])));
	rangefunc->alias = makeAlias("f", aliases);
	/* Refuses a function of fewer than four columns, or of type record. */
	nsitem = addRangeTableEntryForFunction(pstate,
										   list_make1(get_func_name(fn)),
										   list_make1(call), list_make1(NIL),
										   rangefunc, false, true);
	rtr->rtindex = nsitem->p_rtindex;

	if (get_func_result_type(fn, NULL, &resultdesc) != TYPEFUNC_COMPOSITE)
		ereport(ERROR,
				(errcode(ERRCODE_DATATYPE_MISMATCH),
				 errmsg("fetch function %s does not return rows of columns",
						format_procedure(fn))));

	/* The first four columns by position, */
	for (int i = 0; i < resultdesc->natts && natts < 4; i++)
	{
		if (TupleDescAttr(resultdesc, i)->attisdropped)
			continue;
		tlist = lappend(tlist,
						fetch_query_column(pstate, rtr->rtindex, resultdesc,
										   i, base_types[natts],
										   base_names[natts], natts + 1));
		natts++;
	}
	Assert(natts == 4);

	/* then the period columns by name, after the first four. */
	for (int c = 0; c < NUM_PERIOD_COLUMNS; c++)
	{
		for (int i = 4; i < resultdesc->natts; i++)
		{
			Form_pg_attribute att = TupleDescAttr(resultdesc, i);

			if (att->attisdropped ||
				strcmp(NameStr(att->attname), cols[c].name) != 0)
				continue;
			if (getBaseType(att->atttypid) != INTERVALOID)
			{
				cols[c].problem =
					psprintf("fetch function result column %s has type %s, not interval: %s applies",
							 cols[c].name, format_type_be(att->atttypid),
							 cols[c].setting);
				break;
			}
			/* a domain's constraints hold already: relabel it */
			cols[c].attnum = ++natts;
			tlist = lappend(tlist,
							fetch_query_column(pstate, rtr->rtindex,
											   resultdesc, i, INTERVALOID,
											   cols[c].name, natts));
			break;
		}
	}

	query->commandType = CMD_SELECT;
	query->querySource = QSRC_ORIGINAL;
	query->canSetTag = true;
	query->rtable = pstate->p_rtable;
	query->jointree = makeFromExpr(list_make1(rtr), NULL);
	query->targetList = tlist;
	assign_query_collations(pstate, query);
	free_parsestate(pstate);
	return query;
}
