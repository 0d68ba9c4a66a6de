/*-------------------------------------------------------------------------
 *
 * keycache_registry.c
 *	  The named caches' registry, projcache.cache_registry: the SQL
 *	  functions that change it (create_cache, alter_cache, drop_cache,
 *	  grant_cache, revoke_cache) and the checks each makes first.
 *
 * The registry is the table of the database projcache.database: these
 * functions refuse to run in another.  Its rows are written as the
 * bootstrap superuser (pc_become_extension), by SQL text written here
 * only, with the caller's values as parameters, once the caller's rights
 * are checked:
 *
 *	 - create_cache: EXECUTE on it (not granted to PUBLIC); the caller, who
 *	   becomes the owner, needs EXECUTE on the fetch function and the right
 *	   to SET ROLE to the fetch role it names (a superuser fetch role needs
 *	   a superuser owner);
 *	 - alter_cache, drop_cache, grant_cache, revoke_cache: the privileges of
 *	   the cache's owner (or superuser); a new fetch function or fetch role
 *	   is checked for the owner as at creation.
 *
 * A change of a cache locks that cache's row, once the caller is known
 * to own it: changes of one cache wait for one another, and for nothing
 * else, so that no role's open transaction holds back another owner's
 * revoke_cache or drop_cache.  create_cache, and alter_cache of a
 * max_memory, also lock the registry's totals (lock_registry_totals()), so
 * that two of them cannot both take the last of the memory, nor the last
 * of the PC_MAX_CACHES names.  An owner who is not a superuser may have at
 * most half of those names and of that memory.
 * Commits tell the key cache's worker, which publishes the registry to
 * every database (keycache_caches.c).
 *
 * Copyright (c) 2026, projcache developers
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/htup_details.h"
#include "access/xact.h"
#include "access/xlog.h"
#include "catalog/namespace.h"
#include "catalog/pg_authid.h"
#include "catalog/pg_class.h"
#include "catalog/pg_proc.h"
#include "catalog/pg_type.h"
#include "commands/dbcommands.h"
#include "executor/spi.h"
#include "fmgr.h"
#include "funcapi.h"
#include "miscadmin.h"
#include "storage/lmgr.h"
#include "utils/acl.h"
#include "utils/array.h"
#include "utils/builtins.h"
#include "utils/lsyscache.h"
#include "utils/regproc.h"
#include "utils/syscache.h"
#include "utils/timestamp.h"

#include "compat.h"
#include "keycache.h"
#include "keycache_caches.h"
#include "user_switch.h"

PG_FUNCTION_INFO_V1(projcache_create_cache);
PG_FUNCTION_INFO_V1(projcache_alter_cache);
PG_FUNCTION_INFO_V1(projcache_drop_cache);
PG_FUNCTION_INFO_V1(projcache_grant_cache);
PG_FUNCTION_INFO_V1(projcache_revoke_cache);

/* The arguments create_cache and alter_cache share, by position. */
enum
{
	ARG_NAME,
	ARG_FETCH_FUNCTION,
	ARG_EXPIRY,
	ARG_GRACE_PERIOD,
	ARG_REFRESH_INTERVAL,
	ARG_MAX_RETRY_BACKOFF,
	ARG_BATCH_SIZE,
	ARG_FETCH_TIMEOUT,
	ARG_MAX_MEMORY,
	ARG_FETCH_ROLE,
	NUM_CACHE_ARGS
};

/* The bounds of the interval settings, in ms, as their server settings. */
typedef struct PeriodBounds
{
	int			arg;
	const char *name;
	int64		min_ms;
	int64		max_ms;
} PeriodBounds;

static const PeriodBounds period_bounds[] = {
	{ARG_EXPIRY, "expiry", 1, INT_MAX / 4},
	{ARG_GRACE_PERIOD, "grace_period", 0, INT_MAX / 4},
	{ARG_REFRESH_INTERVAL, "refresh_interval", 0, INT_MAX / 4},
	{ARG_MAX_RETRY_BACKOFF, "max_retry_backoff", 100, INT_MAX / 4},
	{ARG_FETCH_TIMEOUT, "fetch_timeout", 0, INT_MAX},
};

#define MAX_BATCH_SIZE	100000	/* projcache.batch_size's bound */

/* Did this transaction change the registry?  Told at commit. */
static bool registry_changed = false;
static bool xact_callback_registered = false;

/*
 * The rights this transaction narrowed (revoke_cache, drop_cache), obeyed
 * at its commit by this backend (pc_caches_narrow_at_commit()).  A
 * transaction may narrow that many different ones: every reader of every
 * cache, and each cache's drop.
 */
#define PC_MAX_NARROWINGS	(PC_MAX_CACHES * (PC_MAX_CACHE_READERS + 1))

typedef struct Narrowing
{
	char		name[NAMEDATALEN];
	bool		drop;
	Oid			reader;
} Narrowing;

static Narrowing narrowings[PC_MAX_NARROWINGS];
static int	nnarrowings = 0;

/*
 * The roles this transaction's changes name (lock_named_role()): at its
 * commit they are entered in shared memory, for a DROP ROLE in another
 * database until the worker has published the change (see
 * PcNamedRole).  named_entries: the entries reserved at PRE_COMMIT.
 */
static Oid	named_roles[PC_NAMED_ROLES_PER_ROLE];
static int	nnamed_roles = 0;
static int	named_entries[PC_NAMED_ROLES_PER_ROLE];
static int	nnamed_entries = 0;

/*
 * At PRE_COMMIT, reserve the entries for the roles named (which may fail
 * the transaction); at commit, fill them, narrow the published caches,
 * then tell the worker.  Nothing at commit may fail: the commit is
 * recorded already.  At abort, free the entries.
 *
 * A change is never prepared: COMMIT PREPARED runs no callback of ours, in
 * this backend or any, so a narrowing prepared would wait for the worker
 * (and its narrowing at PREPARE be undone by the worker's next reload),
 * and the roles a change names would not be entered, leaving them to a
 * DROP ROLE elsewhere until the worker publishes.
 */
static void
tell_worker_at_commit(XactEvent event, void *arg)
{
	bool		ends = event == XACT_EVENT_COMMIT ||
		event == XACT_EVENT_ABORT || event == XACT_EVENT_PARALLEL_COMMIT ||
		event == XACT_EVENT_PARALLEL_ABORT || event == XACT_EVENT_PREPARE;

	if (!registry_changed)
		return;

	if (event == XACT_EVENT_PRE_PREPARE)
		ereport(ERROR,
				(errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
				 errmsg("cannot PREPARE a transaction that changed named caches"),
				 errdetail("A change to the named caches is obeyed at its commit by the committing backend, which COMMIT PREPARED cannot do.")));
	if (event == XACT_EVENT_PRE_COMMIT && pc_loaded() &&
		nnamed_roles > 0)
	{
		pc_caches_reserve_named(named_roles, nnamed_roles, named_entries);
		nnamed_entries = nnamed_roles;
	}
	if (event == XACT_EVENT_COMMIT && pc_loaded())
	{
		pc_caches_commit_named(named_entries, nnamed_entries);
		for (int i = 0; i < nnarrowings; i++)
			pc_caches_narrow_at_commit(narrowings[i].name, narrowings[i].drop,
									   narrowings[i].reader);
		pc_caches_changed();
	}
	if (event == XACT_EVENT_ABORT && pc_loaded())
		pc_caches_release_named(named_entries, nnamed_entries);
	if (ends)
	{
		registry_changed = false;
		nnarrowings = 0;
		nnamed_roles = 0;
		nnamed_entries = 0;
	}
}

/* This transaction changes the registry: tell the worker at commit. */
static void
note_registry_change(void)
{
	if (!xact_callback_registered)
	{
		RegisterXactCallback(tell_worker_at_commit, NULL);
		xact_callback_registered = true;
	}
	registry_changed = true;
}

/* Obey this narrowing at commit, without waiting for the worker. */
static void
narrow_at_commit(const char *name, bool drop, Oid reader)
{
	for (int i = 0; i < nnarrowings; i++)
		if (narrowings[i].drop == drop && narrowings[i].reader == reader &&
			strcmp(narrowings[i].name, name) == 0)
			return;
	if (nnarrowings >= PC_MAX_NARROWINGS)
		ereport(ERROR,
				(errcode(ERRCODE_PROGRAM_LIMIT_EXCEEDED),
				 errmsg("a transaction may revoke or drop named caches at most %d times",
						PC_MAX_NARROWINGS),
				 errhint("Commit, then go on in another transaction.")));
	strlcpy(narrowings[nnarrowings].name, name, NAMEDATALEN);
	narrowings[nnarrowings].drop = drop;
	narrowings[nnarrowings].reader = reader;
	nnarrowings++;
}

/*
 * The registry is projcache.database's table: refuse to run elsewhere,
 * where a table of that name is not what the worker reads.
 */
static void
check_registry_database(void)
{
	pc_require_loaded();
	if (RecoveryInProgress())
		ereport(ERROR,
				(errcode(ERRCODE_READ_ONLY_SQL_TRANSACTION),
				 errmsg("named caches are changed on the primary"),
				 errdetail("A standby reads the registry its primary wrote.")));

	/*
	 * The totals that bound the registry are read after its lock is taken:
	 * under a transaction snapshot taken before, they would miss what other
	 * transactions committed meanwhile.
	 */
	if (IsolationUsesXactSnapshot())
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_TRANSACTION_STATE),
				 errmsg("named caches are changed in READ COMMITTED transactions only"),
				 errdetail("The bounds on caches and their memory are checked against what is committed when the registry is locked.")));
	if (pc_database == NULL ||
		strcmp(get_database_name(MyDatabaseId), pc_database) != 0)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("named caches are registered in database \"%s\"",
						pc_database ? pc_database : ""),
				 errdetail("The key cache's worker reads the registry of the database projcache.database names only."),
				 errhint("Connect to database \"%s\" to register, change or drop a named cache.",
						 pc_database ? pc_database : "")));
}

/*
 * Statements on the registry run between registry_begin() and
 * registry_end(): as the bootstrap superuser, connected to SPI.  A change
 * marks the transaction, to tell the worker at commit.
 */
static void
registry_begin(PcUserSwitch *rs, bool change)
{
	if (change)
		note_registry_change();
	pc_become_extension(rs);
	if (SPI_connect() != SPI_OK_CONNECT)
		elog(ERROR, "SPI_connect failed");
}

static void
registry_end(PcUserSwitch *rs)
{
	SPI_finish();
	pc_unbecome(rs);
}

/* Run one statement; an ERROR unless SPI answers 'expect'. */
static void
registry_exec(const char *sql, int nargs, Oid *argtypes, Datum *args,
			  const char *nulls, int expect)
{
	int			ret = SPI_execute_with_args(sql, nargs, argtypes, args, nulls,
											false, 0);

	if (ret != expect)
		elog(ERROR, "could not run a statement on projcache.cache_registry: %s",
			 SPI_result_code_string(ret));
}

/*
 * Has the registry the columns that bind a cache to its function's
 * identity (1.3.1)?  A database still at 1.3 has not.
 */
static bool
registry_binds(void)
{
	Oid			nsp = get_namespace_oid("projcache", false);
	Oid			relid = get_relname_relid("cache_registry", nsp);

	return OidIsValid(relid) &&
		get_attnum(relid, "fetch_function_oid") != InvalidAttrNumber &&
		get_attnum(relid, "fetch_function_owner") != InvalidAttrNumber;
}

/*
 * create_cache and alter_cache bind a cache to its function, which only a
 * registry of 1.3.1 can hold.
 */
static void
check_registry_binds(void)
{
	if (!registry_binds())
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("extension projcache must be updated to register or change named caches"),
				 errdetail("Since 1.3.1 a named cache is bound to its fetch function's identity, which the registry of 1.3 cannot hold."),
				 errhint("Run ALTER EXTENSION projcache UPDATE in database \"%s\".",
						 pc_database ? pc_database : "")));
}

/*
 * The registry's totals (its caches' count and memory) are locked against
 * other changes of them until the end of the transaction: create_cache,
 * and alter_cache of a max_memory.  Not the table: a lock on it would make
 * every change wait for any open transaction that changed any cache, so
 * that a role could hold back another owner's revoke_cache.  The lock is
 * an object lock on the registry's OID that nothing else takes.
 */
static void
lock_registry_totals(void)
{
	Oid			nsp = get_namespace_oid("projcache", false);
	Oid			relid = get_relname_relid("cache_registry", nsp);

	if (!OidIsValid(relid))
		elog(ERROR, "projcache.cache_registry does not exist");
	LockDatabaseObject(RelationRelationId, relid, 0, ExclusiveLock);
}

/* What a change needs of a registered cache. */
typedef struct CacheRow
{
	Oid			owner;
	Oid			fetch_function;
	Oid			fetch_role;		/* InvalidOid: the owner */
	int64		max_memory;		/* -1: none of its own */
	int			nreaders;
	Oid			readers[PC_MAX_CACHE_READERS];
} CacheRow;

/*
 * The row of a cache; an ERROR (42704) if there is none.  With lock, the
 * row is locked (FOR UPDATE) until the end of the transaction, and read as
 * its latest version: changes of one cache wait only for one another.
 */
static void
read_cache_row(const char *name, CacheRow *row, bool lock)
{
	Oid			argtypes[1] = {TEXTOID};
	Datum		args[1] = {CStringGetTextDatum(name)};
	bool		isnull;
	Datum		d;
	ArrayType  *readers;
	Datum	   *elems;
	bool	   *elem_nulls;
	int			n;
	PcUserSwitch rs;
	bool		bound = registry_binds();
	char	   *signature;
	char	   *function_owner;

	registry_begin(&rs, false);
	registry_exec(psprintf("%s%s", bound ?
						   "SELECT owner::pg_catalog.oid, max_memory,"
						   " readers::pg_catalog.oid[], fetch_function_oid,"
						   " fetch_role::pg_catalog.oid, fetch_function,"
						   " fetch_function_owner"
						   " FROM projcache.cache_registry"
						   " WHERE name OPERATOR(pg_catalog.=) $1" :
						   "SELECT owner::pg_catalog.oid, max_memory,"
						   " readers::pg_catalog.oid[], NULL::pg_catalog.oid,"
						   " fetch_role::pg_catalog.oid, fetch_function,"
						   " NULL::pg_catalog.name"
						   " FROM projcache.cache_registry"
						   " WHERE name OPERATOR(pg_catalog.=) $1",
						   lock ? " FOR UPDATE" : ""),
				  1, argtypes, args, NULL, SPI_OK_SELECT);
	if (SPI_processed == 0)
	{
		registry_end(&rs);
		ereport(ERROR,
				(errcode(ERRCODE_UNDEFINED_OBJECT),
				 errmsg("cache \"%s\" does not exist", name)));
	}
	row->owner = DatumGetObjectId(SPI_getbinval(SPI_tuptable->vals[0],
												SPI_tuptable->tupdesc, 1,
												&isnull));
	d = SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 2,
					  &isnull);
	row->max_memory = isnull ? -1 : DatumGetInt64(d);
	d = SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 4,
					  &isnull);
	row->fetch_function = isnull ? InvalidOid : DatumGetObjectId(d);
	signature = SPI_getvalue(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 6);
	function_owner = SPI_getvalue(SPI_tuptable->vals[0],
								  SPI_tuptable->tupdesc, 7);
	d = SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 5,
					  &isnull);
	row->fetch_role = isnull ? InvalidOid : DatumGetObjectId(d);
	d = SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 3,
					  &isnull);
	row->nreaders = 0;
	if (!isnull)
	{
		readers = DatumGetArrayTypeP(d);
		deconstruct_array(readers, OIDOID, sizeof(Oid), true, TYPALIGN_INT,
						  &elems, &elem_nulls, &n);
		for (int i = 0; i < n && row->nreaders < PC_MAX_CACHE_READERS; i++)
			if (!elem_nulls[i])
				row->readers[row->nreaders++] = DatumGetObjectId(elems[i]);
	}

	/*
	 * The function the worker binds the cache to (none: InvalidOid), read
	 * before SPI_finish() frees the row's strings.
	 */
	row->fetch_function = signature == NULL ? InvalidOid :
		pc_cache_bound_function(signature, row->fetch_function,
								function_owner, row->owner);
	registry_end(&rs);
}

/* What the caches other than 'except' take, all and an owner's. */
typedef struct RegistryTotals
{
	int			count;
	int64		reserved;		/* bytes of max_memory */
	int			owner_count;
	int64		owner_reserved;
	int64		unprivileged_reserved;	/* by owners who are not superusers */
	int			unprivileged_count;
} RegistryTotals;

static void
registry_totals(const char *except, Oid owner, RegistryTotals *t)
{
	Oid			argtypes[2] = {TEXTOID, OIDOID};
	Datum		args[2] = {CStringGetTextDatum(except), ObjectIdGetDatum(owner)};
	HeapTuple	tup;
	TupleDesc	desc;
	bool		isnull;
	PcUserSwitch rs;

	registry_begin(&rs, false);
	registry_exec("SELECT pg_catalog.count(*),"
				  " COALESCE(pg_catalog.sum(max_memory), 0)::pg_catalog.int8,"
				  " pg_catalog.count(*) FILTER (WHERE owner::pg_catalog.oid"
				  " OPERATOR(pg_catalog.=) $2),"
				  " COALESCE(pg_catalog.sum(max_memory) FILTER"
				  " (WHERE owner::pg_catalog.oid OPERATOR(pg_catalog.=) $2),"
				  " 0)::pg_catalog.int8,"
				  " COALESCE(pg_catalog.sum(max_memory) FILTER"
				  " (WHERE NOT EXISTS (SELECT FROM pg_catalog.pg_authid a"
				  " WHERE a.oid OPERATOR(pg_catalog.=) owner::pg_catalog.oid"
				  " AND a.rolsuper)), 0)::pg_catalog.int8,"
				  " pg_catalog.count(*) FILTER"
				  " (WHERE NOT EXISTS (SELECT FROM pg_catalog.pg_authid a"
				  " WHERE a.oid OPERATOR(pg_catalog.=) owner::pg_catalog.oid"
				  " AND a.rolsuper))"
				  " FROM projcache.cache_registry"
				  " WHERE name OPERATOR(pg_catalog.<>) $1",
				  2, argtypes, args, NULL, SPI_OK_SELECT);
	tup = SPI_tuptable->vals[0];
	desc = SPI_tuptable->tupdesc;
	t->count = (int) DatumGetInt64(SPI_getbinval(tup, desc, 1, &isnull));
	t->reserved = DatumGetInt64(SPI_getbinval(tup, desc, 2, &isnull));
	t->owner_count = (int) DatumGetInt64(SPI_getbinval(tup, desc, 3, &isnull));
	t->owner_reserved = DatumGetInt64(SPI_getbinval(tup, desc, 4, &isnull));
	t->unprivileged_reserved = DatumGetInt64(SPI_getbinval(tup, desc, 5,
														   &isnull));
	t->unprivileged_count = (int) DatumGetInt64(SPI_getbinval(tup, desc, 6,
															  &isnull));
	registry_end(&rs);
}

/* ----------------------------------------------------------------
 * Checks of the arguments
 * ----------------------------------------------------------------
 */

/*
 * The characters of a registered name (a cache's, a stream's):
 * [a-z][a-z0-9_]*.  Its length is checked apart, with its own message.
 */
bool
pc_registry_name_ok(const char *name)
{
	size_t		len = strlen(name);
	bool		ok = len > 0 && name[0] >= 'a' && name[0] <= 'z';

	for (size_t i = 1; ok && i < len; i++)
		ok = (name[i] >= 'a' && name[i] <= 'z') ||
			(name[i] >= '0' && name[i] <= '9') || name[i] == '_';
	return ok;
}

/* A cache's name: [a-z][a-z0-9_]*, at most NAMEDATALEN - 1 bytes, not "default". */
static void
check_cache_name(const char *name)
{
	size_t		len = strlen(name);

	if (len >= NAMEDATALEN)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("cache name is %zu bytes long, longer than %d", len,
						NAMEDATALEN - 1)));

	if (!pc_registry_name_ok(name))
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("invalid cache name \"%s\"", name),
				 errdetail("A cache's name is a lower-case letter, then lower-case letters, digits and underscores, at most %d bytes.",
						   NAMEDATALEN - 1)));
	if (strcmp(name, PC_DEFAULT_CACHE_NAME) == 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("cache name \"%s\" is reserved", name),
				 errdetail("Keys that belong to no named cache are the default cache's.")));
}

/*
 * The fetch function: the owner may execute it, and it takes the fetch
 * function's arguments (text[], text[]) and returns a set of rows.  Its
 * columns are checked at each call, as the server setting's are.
 */
static void
check_fetch_function(Oid fn, Oid owner)
{
	HeapTuple	tup;
	Form_pg_proc proc;
	bool		ok;
	bool		in_temp_schema;

	tup = SearchSysCache1(PROCOID, ObjectIdGetDatum(fn));
	if (!HeapTupleIsValid(tup))
		ereport(ERROR,
				(errcode(ERRCODE_UNDEFINED_FUNCTION),
				 errmsg("function with OID %u does not exist", fn)));
	proc = (Form_pg_proc) GETSTRUCT(tup);
	in_temp_schema = isAnyTempNamespace(proc->pronamespace);
	ReleaseSysCache(tup);
	ok = pc_fetch_function_shape_ok(fn);
	if (pc_proc_aclcheck(fn, owner, ACL_EXECUTE) != ACLCHECK_OK)
		ereport(ERROR,
				(errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
				 errmsg("permission denied for function %s",
						format_procedure(fn)),
				 errdetail("A cache's owner needs EXECUTE on its fetch function.")));
	/* A later session may own that schema, and put its code there. */
	if (in_temp_schema)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("fetch function %s is in a temporary schema",
						format_procedure(fn)),
				 errdetail("A temporary schema goes with its session, and another session may define a function of that name there.")));
	if (strlen(format_procedure_qualified(fn)) >= PC_CACHE_FUNCTION_LEN)
		ereport(ERROR,
				(errcode(ERRCODE_NAME_TOO_LONG),
				 errmsg("the signature of function %s is longer than %d bytes",
						format_procedure(fn), PC_CACHE_FUNCTION_LEN - 1)));
	if (!ok)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("function %s is not a fetch function",
						format_procedure(fn)),
				 errdetail("A fetch function takes (keys text[], revisions text[]) and returns TABLE(key text, state text, revision text, config jsonb [, max_age interval] [, stale_for interval])."),
				 errhint("See projcache.fetch_function in doc/settings.md.")));
}

/*
 * A role the registry is about to name (a cache's owner, fetch role or
 * reader) must exist, and is locked until the end of the transaction, as
 * PostgreSQL locks a role an object comes to depend on: a DROP ROLE of it
 * waits for this transaction, and then sees what it committed (the guard
 * in keycache_caches.c, refuse_named_role_drop(), which outside
 * projcache.database reads the roles entered at commit); one that came
 * first has dropped it, and this transaction is refused.
 */
static void
lock_named_role(Oid role)
{
	int			i;

	LockSharedObject(AuthIdRelationId, role, 0, AccessShareLock);
	if (!SearchSysCacheExists1(AUTHOID, ObjectIdGetDatum(role)))
		ereport(ERROR,
				(errcode(ERRCODE_UNDEFINED_OBJECT),
				 errmsg("role with OID %u does not exist", role)));
	note_registry_change();
	for (i = 0; i < nnamed_roles && named_roles[i] != role; i++)
		;
	if (i < nnamed_roles)
		return;
	if (nnamed_roles >= PC_NAMED_ROLES_PER_ROLE)
		ereport(ERROR,
				(errcode(ERRCODE_PROGRAM_LIMIT_EXCEEDED),
				 errmsg("a transaction may name at most %d roles in named caches",
						PC_NAMED_ROLES_PER_ROLE),
				 errdetail("Each cache's owner, fetch role and readers count, once each."),
				 errhint("Commit, then go on in another transaction.")));
	named_roles[nnamed_roles++] = role;
}

/*
 * The fetch role: the cache's owner must be able to SET ROLE to it (a
 * member whose grant allows SET), and a superuser fetch role needs a
 * superuser owner, so that a cache never fetches with more rights than its
 * owner could take.
 */
static void
check_fetch_role(Oid role, Oid owner)
{
	lock_named_role(role);
	if (!pc_member_can_set_role(owner, role) ||
		(superuser_arg(role) && !superuser_arg(owner)))
		ereport(ERROR,
				(errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
				 errmsg("role \"%s\" cannot fetch as role \"%s\"",
						GetUserNameFromId(owner, false),
						GetUserNameFromId(role, false)),
				 errdetail("A cache's fetch runs as its owner, or as a fetch role its owner may SET ROLE to; a superuser fetch role needs a superuser owner.")));
}

/*
 * A cache that fetches as a superuser (its owner, or its fetch role) runs
 * only a function a superuser owns: another owner could replace its body
 * at any time, and have it run with a superuser's rights.
 */
static void
check_fetch_escalation(Oid fn, Oid runas)
{
	if (pc_fetch_escalates(fn, runas))
		ereport(ERROR,
				(errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
				 errmsg("a cache that fetches as superuser \"%s\" cannot run function %s",
						GetUserNameFromId(runas, false), format_procedure(fn)),
				 errdetail("The function's owner is not a superuser, and could change what it runs."),
				 errhint("Fetch as a role that is not a superuser (fetch_role), or have a superuser own the function.")));
}

/* An interval setting within its bounds (pc_interval_ms()). */
static void
check_period(const PeriodBounds *b, Interval *iv)
{
	int64		ms;

	if (!pc_interval_ms(iv, &ms) || ms < b->min_ms || ms > b->max_ms)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("%s must be between %lld ms and %lld ms",
						b->name, (long long) b->min_ms, (long long) b->max_ms)));
}

/*
 * The settings given among the arguments, each within the bounds of its
 * server setting, and max_memory within what the keys' part of
 * projcache.max_memory leaves the other caches' reservations.  The caches
 * of an owner who is not a superuser may reserve at most half of that part
 * together, so that no role alone can take it all from the default cache
 * and from other owners.  totals: what registry_totals() gave for name and
 * owner under the registry's lock, or NULL to read it here.
 */
static void
check_settings(FunctionCallInfo fcinfo, const char *name, Oid owner,
			   const RegistryTotals *totals)
{
	for (int i = 0; i < lengthof(period_bounds); i++)
		if (!PG_ARGISNULL(period_bounds[i].arg))
			check_period(&period_bounds[i],
						 PG_GETARG_INTERVAL_P(period_bounds[i].arg));
	if (!PG_ARGISNULL(ARG_BATCH_SIZE) &&
		(PG_GETARG_INT32(ARG_BATCH_SIZE) < 1 ||
		 PG_GETARG_INT32(ARG_BATCH_SIZE) > MAX_BATCH_SIZE))
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("batch_size must be between 1 and %d", MAX_BATCH_SIZE)));
	if (!PG_ARGISNULL(ARG_MAX_MEMORY))
	{
		int64		want = PG_GETARG_INT64(ARG_MAX_MEMORY);
		int64		keys_part = (int64) pc_key_memory_bound();
		RegistryTotals t;

		/* What the caller read under the lock already, or now. */
		if (totals != NULL)
			t = *totals;
		else
			registry_totals(name, owner, &t);
		if (want < PC_MIN_CACHE_MEMORY || want > keys_part - t.reserved)
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("max_memory of cache \"%s\" does not fit", name),
					 errdetail("It must be at least %d bytes; of the keys' %lld bytes of projcache.max_memory, other caches reserve %lld, leaving %lld.",
							   PC_MIN_CACHE_MEMORY, (long long) keys_part,
							   (long long) t.reserved,
							   (long long) Max(keys_part - t.reserved, 0))));
		if (!superuser_arg(owner) && t.owner_reserved + want > keys_part / 2)
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("max_memory of cache \"%s\" does not fit in its owner's half", name),
					 errdetail("The caches of role \"%s\" may reserve at most half of the keys' %lld bytes of projcache.max_memory; its other caches reserve %lld.",
							   GetUserNameFromId(owner, false),
							   (long long) keys_part,
							   (long long) t.owner_reserved)));

		/*
		 * Two roles (or more) must not take it all either: the owners who are
		 * not superusers reserve at most half together, and the default cache
		 * keeps the rest.
		 */
		if (!superuser_arg(owner) &&
			t.unprivileged_reserved + want > keys_part / 2)
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("max_memory of cache \"%s\" does not fit in the half left to owners who are not superusers", name),
					 errdetail("The caches of roles that are not superusers may reserve at most half of the keys' %lld bytes of projcache.max_memory together, so that the default cache keeps the rest.",
							   (long long) keys_part)));
	}
}

/*
 * A role that a cache names (its owner, fetch role or a reader) may not be
 * pg_database_owner: its members depend on the database the role is
 * judged in, and the registry is the whole server's, so its grant would
 * reach the owner of every database.
 */
static void
check_not_database_owner(Oid role, const char *as)
{
	if (role == ROLE_PG_DATABASE_OWNER)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("role \"pg_database_owner\" cannot be a named cache's %s", as),
				 errdetail("Its members are the owner of the current database, and a named cache is read in every database."),
				 errhint("Name the role that owns the database instead.")));
}

/* The caller must have the privileges of the cache's owner. */
static void
check_cache_owner(const char *name, const CacheRow *row)
{
	if (!has_privs_of_role(GetUserId(), row->owner))
		ereport(ERROR,
				(errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
				 errmsg("must be owner of cache \"%s\"", name)));
}

/*
 * The row of a cache the caller must own (the privileges of its owner),
 * locked for the change.  The owner is checked before the row is locked,
 * so that a role that does not own the cache never holds its lock (and
 * never makes its owner's changes wait), and again on the locked row, its
 * latest version.
 */
static void
lock_owned_cache_row(const char *name, CacheRow *row)
{
	read_cache_row(name, row, false);
	check_cache_owner(name, row);
	read_cache_row(name, row, true);
	check_cache_owner(name, row);
}

/* ----------------------------------------------------------------
 * The SQL functions
 * ----------------------------------------------------------------
 */

/* The arguments as the registry's statements take them: $1 .. $13. */
static void
setting_args(FunctionCallInfo fcinfo, Oid *argtypes, Datum *args,
			 char *nulls)
{
	static const Oid types[NUM_CACHE_ARGS] = {
		TEXTOID, TEXTOID, INTERVALOID, INTERVALOID, INTERVALOID, INTERVALOID,
		INT4OID, INTERVALOID, INT8OID, OIDOID
	};

	for (int i = 0; i < NUM_CACHE_ARGS; i++)
	{
		argtypes[i] = types[i];
		nulls[i] = PG_ARGISNULL(i) ? 'n' : ' ';
		args[i] = PG_ARGISNULL(i) ? (Datum) 0 : PG_GETARG_DATUM(i);
	}

	/*
	 * The function by its qualified signature, its OID and its owner's name
	 * ($12 and $13): the OID is its identity in this cluster, and the
	 * signature and owner tell it in another (a dump, pg_upgrade).
	 */
	argtypes[NUM_CACHE_ARGS] = OIDOID;
	argtypes[NUM_CACHE_ARGS + 1] = NAMEOID;
	nulls[NUM_CACHE_ARGS] = nulls[NUM_CACHE_ARGS + 1] = 'n';
	args[NUM_CACHE_ARGS] = args[NUM_CACHE_ARGS + 1] = (Datum) 0;
	if (!PG_ARGISNULL(ARG_FETCH_FUNCTION))
	{
		Oid			fn = PG_GETARG_OID(ARG_FETCH_FUNCTION);
		HeapTuple	tup = SearchSysCache1(PROCOID, ObjectIdGetDatum(fn));
		Oid			owner;

		if (!HeapTupleIsValid(tup))
			elog(ERROR, "cache lookup failed for function %u", fn);
		owner = ((Form_pg_proc) GETSTRUCT(tup))->proowner;
		ReleaseSysCache(tup);
		args[ARG_FETCH_FUNCTION] =
			CStringGetTextDatum(format_procedure_qualified(fn));
		args[NUM_CACHE_ARGS] = ObjectIdGetDatum(fn);
		args[NUM_CACHE_ARGS + 1] =
			DirectFunctionCall1(namein,
								CStringGetDatum(GetUserNameFromId(owner, false)));
		nulls[NUM_CACHE_ARGS] = nulls[NUM_CACHE_ARGS + 1] = ' ';
	}
}

/* The arguments setting_args() fills: the settings, then $12 and $13. */
#define NUM_SETTING_ARGS	(NUM_CACHE_ARGS + 2)

/*
 * projcache.create_cache(name, fetch_function, expiry, grace_period,
 *	 refresh_interval, max_retry_backoff, batch_size, fetch_timeout,
 *	 max_memory, fetch_role)
 */
Datum
projcache_create_cache(PG_FUNCTION_ARGS)
{
	char	   *name;
	Oid			argtypes[NUM_SETTING_ARGS + 1];
	Datum		args[NUM_SETTING_ARGS + 1];
	char		nulls[NUM_SETTING_ARGS + 1];
	RegistryTotals t;
	bool		inserted;
	PcUserSwitch rs;

	check_registry_database();
	if (PG_ARGISNULL(ARG_NAME) || PG_ARGISNULL(ARG_FETCH_FUNCTION))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("a cache needs a name and a fetch function")));
	name = text_to_cstring(PG_GETARG_TEXT_PP(ARG_NAME));
	check_cache_name(name);
	check_registry_binds();
	check_not_database_owner(GetUserId(), "owner");
	lock_named_role(GetUserId());
	check_fetch_function(PG_GETARG_OID(ARG_FETCH_FUNCTION), GetUserId());
	if (!PG_ARGISNULL(ARG_FETCH_ROLE))
	{
		check_not_database_owner(PG_GETARG_OID(ARG_FETCH_ROLE), "fetch role");
		check_fetch_role(PG_GETARG_OID(ARG_FETCH_ROLE), GetUserId());
	}
	check_fetch_escalation(PG_GETARG_OID(ARG_FETCH_FUNCTION),
						   PG_ARGISNULL(ARG_FETCH_ROLE) ? GetUserId() :
						   PG_GETARG_OID(ARG_FETCH_ROLE));

	lock_registry_totals();
	registry_totals(name, GetUserId(), &t);
	if (t.count >= PC_MAX_CACHES)
		ereport(ERROR,
				(errcode(ERRCODE_PROGRAM_LIMIT_EXCEEDED),
				 errmsg("cannot register more than %d named caches",
						PC_MAX_CACHES)));
	if (!superuser() && t.owner_count >= PC_MAX_CACHES / 2)
		ereport(ERROR,
				(errcode(ERRCODE_PROGRAM_LIMIT_EXCEEDED),
				 errmsg("role \"%s\" owns %d named caches, the most one role may",
						GetUserNameFromId(GetUserId(), false),
						PC_MAX_CACHES / 2)));

	/*
	 * Two roles (or more) must not take every name either: the owners who are
	 * not superusers own at most half of them together.
	 */
	if (!superuser() && t.unprivileged_count >= PC_MAX_CACHES / 2)
		ereport(ERROR,
				(errcode(ERRCODE_PROGRAM_LIMIT_EXCEEDED),
				 errmsg("roles that are not superusers own %d named caches, the most they may together",
						PC_MAX_CACHES / 2),
				 errdetail("Of the %d named caches, half are kept for caches of superusers.",
						   PC_MAX_CACHES)));
	check_settings(fcinfo, name, GetUserId(), &t);

	/*
	 * A cache without a budget shares the default cache's memory, where the
	 * largest pool pays when it is short: a role that is not a superuser
	 * could push the default cache's keys out with it.
	 */
	if (!superuser() && PG_ARGISNULL(ARG_MAX_MEMORY))
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("cache \"%s\" needs a max_memory of its own", name),
				 errdetail("A cache of an owner who is not a superuser has its own memory budget, so that it never evicts another cache's keys.")));

	setting_args(fcinfo, argtypes, args, nulls);
	argtypes[NUM_SETTING_ARGS] = OIDOID;
	args[NUM_SETTING_ARGS] = ObjectIdGetDatum(GetUserId());
	nulls[NUM_SETTING_ARGS] = ' ';
	registry_begin(&rs, true);

	/*
	 * clock_timestamp(), not now(): a cache dropped and made again in one
	 * transaction is another cache, whose keys must not be the old one's.
	 */
	registry_exec("INSERT INTO projcache.cache_registry"
				  " (name, fetch_function, expiry, grace_period,"
				  " refresh_interval, max_retry_backoff, batch_size,"
				  " fetch_timeout, max_memory, fetch_role,"
				  " fetch_function_oid, fetch_function_owner, owner,"
				  " created_at)"
				  " VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9,"
				  " $10::pg_catalog.regrole, $11, $12,"
				  " $13::pg_catalog.regrole, pg_catalog.clock_timestamp())"
				  " ON CONFLICT (name) DO NOTHING",
				  NUM_SETTING_ARGS + 1, argtypes, args, nulls, SPI_OK_INSERT);
	inserted = SPI_processed > 0;
	registry_end(&rs);
	if (!inserted)
		ereport(ERROR,
				(errcode(ERRCODE_DUPLICATE_OBJECT),
				 errmsg("cache \"%s\" already exists", name)));
	PG_RETURN_VOID();
}

/* projcache.alter_cache(name, <the settings of create_cache>) */
Datum
projcache_alter_cache(PG_FUNCTION_ARGS)
{
	char	   *name;
	CacheRow	row;
	Oid			argtypes[NUM_SETTING_ARGS];
	Datum		args[NUM_SETTING_ARGS];
	char		nulls[NUM_SETTING_ARGS];
	PcUserSwitch rs;

	check_registry_database();
	if (PG_ARGISNULL(ARG_NAME))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("the cache to change needs a name")));
	name = text_to_cstring(PG_GETARG_TEXT_PP(ARG_NAME));
	check_cache_name(name);
	check_registry_binds();
	/* (the totals' lock first, as create_cache takes it alone) */
	if (!PG_ARGISNULL(ARG_MAX_MEMORY))
	{
		read_cache_row(name, &row, false);
		check_cache_owner(name, &row);
		lock_registry_totals();
	}
	lock_owned_cache_row(name, &row);
	if (!PG_ARGISNULL(ARG_FETCH_FUNCTION))
		check_fetch_function(PG_GETARG_OID(ARG_FETCH_FUNCTION), row.owner);
	if (!PG_ARGISNULL(ARG_FETCH_ROLE))
	{
		check_not_database_owner(PG_GETARG_OID(ARG_FETCH_ROLE), "fetch role");
		check_fetch_role(PG_GETARG_OID(ARG_FETCH_ROLE), row.owner);
	}
	{
		Oid			fn = PG_ARGISNULL(ARG_FETCH_FUNCTION) ?
			row.fetch_function : PG_GETARG_OID(ARG_FETCH_FUNCTION);
		Oid			runas = !PG_ARGISNULL(ARG_FETCH_ROLE) ?
			PG_GETARG_OID(ARG_FETCH_ROLE) :
			OidIsValid(row.fetch_role) ? row.fetch_role : row.owner;

		/* (a function dropped since: each fetch refuses it anyway) */
		if (OidIsValid(fn))
			check_fetch_escalation(fn, runas);
	}
	check_settings(fcinfo, name, row.owner, NULL);

	setting_args(fcinfo, argtypes, args, nulls);
	registry_begin(&rs, true);
	registry_exec("UPDATE projcache.cache_registry SET"
				  " fetch_function = COALESCE($2, fetch_function),"
				  " expiry = COALESCE($3, expiry),"
				  " grace_period = COALESCE($4, grace_period),"
				  " refresh_interval = COALESCE($5, refresh_interval),"
				  " max_retry_backoff = COALESCE($6, max_retry_backoff),"
				  " batch_size = COALESCE($7, batch_size),"
				  " fetch_timeout = COALESCE($8, fetch_timeout),"
				  " max_memory = COALESCE($9, max_memory),"
				  " fetch_role = COALESCE($10::pg_catalog.regrole,"
				  " fetch_role),"
				  " fetch_function_oid = CASE WHEN $2 IS NULL"
				  " THEN fetch_function_oid ELSE $11 END,"
				  " fetch_function_owner = CASE WHEN $2 IS NULL"
				  " THEN fetch_function_owner ELSE $12 END"
				  " WHERE name OPERATOR(pg_catalog.=) $1",
				  NUM_SETTING_ARGS, argtypes, args, nulls, SPI_OK_UPDATE);
	registry_end(&rs);
	PG_RETURN_VOID();
}

/* projcache.drop_cache(name text) */
Datum
projcache_drop_cache(PG_FUNCTION_ARGS)
{
	char	   *name = text_to_cstring(PG_GETARG_TEXT_PP(0));
	CacheRow	row;
	Oid			argtypes[1] = {TEXTOID};
	Datum		args[1] = {PG_GETARG_DATUM(0)};
	PcUserSwitch rs;

	check_registry_database();
	check_cache_name(name);
	lock_owned_cache_row(name, &row);
	narrow_at_commit(name, true, InvalidOid);
	registry_begin(&rs, true);
	registry_exec("DELETE FROM projcache.cache_registry"
				  " WHERE name OPERATOR(pg_catalog.=) $1",
				  1, argtypes, args, NULL, SPI_OK_DELETE);
	registry_end(&rs);
	PG_RETURN_VOID();
}

/*
 * grant_cache and revoke_cache: let reader read the cache, or no longer.
 * Granting twice lists the reader once; a role that is gone can still be
 * revoked.
 */
static void
change_readers(FunctionCallInfo fcinfo, bool grant)
{
	char	   *name = text_to_cstring(PG_GETARG_TEXT_PP(0));
	Oid			reader = PG_GETARG_OID(1);
	CacheRow	row;
	Oid			argtypes[2] = {TEXTOID, OIDOID};
	Datum		args[2] = {PG_GETARG_DATUM(0), ObjectIdGetDatum(reader)};
	bool		listed = false;
	PcUserSwitch rs;

	check_registry_database();
	check_cache_name(name);
	lock_owned_cache_row(name, &row);
	for (int i = 0; i < row.nreaders; i++)
		listed |= row.readers[i] == reader;
	if (grant)
	{
		lock_named_role(reader);
		check_not_database_owner(reader, "reader");
		if (listed)
			return;
		if (row.nreaders >= PC_MAX_CACHE_READERS)
			ereport(ERROR,
					(errcode(ERRCODE_PROGRAM_LIMIT_EXCEEDED),
					 errmsg("cache \"%s\" has %d readers already, the most it may have",
							name, PC_MAX_CACHE_READERS),
					 errhint("Grant the cache to a group role, and that role to its readers.")));
	}
	else if (!listed)
		return;
	if (!grant)
		narrow_at_commit(name, false, reader);
	registry_begin(&rs, true);
	registry_exec(grant ?
				  "UPDATE projcache.cache_registry"
				  " SET readers = readers OPERATOR(pg_catalog.||)"
				  " $2::pg_catalog.regrole"
				  " WHERE name OPERATOR(pg_catalog.=) $1" :
				  "UPDATE projcache.cache_registry"
				  " SET readers = pg_catalog.array_remove(readers,"
				  " $2::pg_catalog.regrole)"
				  " WHERE name OPERATOR(pg_catalog.=) $1",
				  2, argtypes, args, NULL, SPI_OK_UPDATE);
	registry_end(&rs);
}

/* projcache.grant_cache(name text, reader regrole) */
Datum
projcache_grant_cache(PG_FUNCTION_ARGS)
{
	change_readers(fcinfo, true);
	PG_RETURN_VOID();
}

/* projcache.revoke_cache(name text, reader regrole) */
Datum
projcache_revoke_cache(PG_FUNCTION_ARGS)
{
	change_readers(fcinfo, false);
	PG_RETURN_VOID();
}
