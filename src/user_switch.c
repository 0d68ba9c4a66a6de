/*-------------------------------------------------------------------------
 *
 * user_switch.c
 *	  The one way projcache changes who it runs as.
 *
 * Every change of the current user id, and every connection of a
 * projcache background worker, goes through this file, so that who runs
 * what can be read in one place.  The rule it keeps: no SQL text that came
 * from a caller (a snapshot query, the fetch function, an object in a
 * schema a caller controls) is parsed, analyzed, planned or run while the
 * current user is a superuser, unless that caller is a superuser itself.
 *
 * The switches, with what runs under each:
 *
 *	 PC_AS_EXTENSION: the bootstrap superuser, with search_path
 *	 "pg_catalog, pg_temp".  Only projcache's own fixed SQL, every operator
 *	 and function qualified, on its own tables (the snapshot registry and
 *	 its sequence, whose SQL is all in snapshot_registry.c, the named
 *	 caches' registry, whose SQL is in keycache_registry.c and
 *	 keycache_caches.c, and the change streams' registry, whose SQL is in
 *	 stream_registry.c; PUBLIC may read none of them) and on the catalogs; and the storing of a
 *	 snapshot's backing view, from a query tree the owner's analysis made
 *	 (snapshot_view.c, pc_snap_create_view): no caller's text is parsed
 *	 then, and nothing of the caller's runs.
 *
 *	 PC_AS_SNAPSHOT_OWNER: a snapshot's owner, under
 *	 SECURITY_RESTRICTED_OPERATION (no temporary objects, no SET ROLE), as
 *	 maintenance commands run user code.  The query's check and analysis
 *	 at create_snapshot() and at the 1.0.1 update's binding (with the
 *	 creator's search path, or pg_catalog), its load in a load worker, and
 *	 the check of the owner's rights after a failed load (snapshot_load.c).
 *
 *	 PC_AS_FETCH_ROLE: projcache.fetch_role, or the fetch function's owner,
 *	 with SECURITY_LOCAL_USERID_CHANGE (no SET ROLE), in the worker: the
 *	 fetch function's call (keycache_fetch.c).  It stays current until the
 *	 call's transaction has committed, so that nothing queued for commit
 *	 runs as the worker's superuser.
 *
 *	 PC_AS_READER: the role a foreign table on a snapshot is read for (the
 *	 owner of a view that reads it), under SECURITY_RESTRICTED_OPERATION:
 *	 the registry read and the check that this role may read the snapshot,
 *	 at planning, at EXPLAIN and when a scan begins (snapshot_fdw.c).  A
 *	 load it triggers runs in a load worker, as the snapshot's owner.
 *
 *	 pc_worker_connect(): the launcher (no database), each load worker
 *	 (the reader's database) and each stream's worker (projcache.database,
 *	 to read its stream's row, as PC_AS_EXTENSION) connect as the
 *	 bootstrap superuser, so that no role needs LOGIN; they run no user
 *	 code until they switch with pc_become().  A load worker keeps its
 *	 database's settings, as every session of that database does.  A
 *	 stream's worker runs no SQL of a caller's: what it sends its source
 *	 is its own replication commands.
 *
 *	 pc_keycache_worker_connect(): the worker connects to projcache.database
 *	 the same way, and then puts back the server's value of every setting
 *	 that database or its role had set (pg_db_role_setting: ALTER DATABASE
 *	 ... SET, ALTER ROLE ... [IN DATABASE] SET).  The fetch function feeds
 *	 the cache every database reads, so it runs with the settings of
 *	 postgresql.conf, ALTER SYSTEM, the command line and ALTER ROLE ALL SET,
 *	 all a superuser's, and with none that the owner of projcache.database
 *	 chose: no search_path of theirs resolves its names and operators, no
 *	 DateStyle or TimeZone of theirs shapes its text.
 *
 * Copyright (c) 2026, projcache developers
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/htup_details.h"
#include "access/xact.h"
#include "catalog/dependency.h"
#include "catalog/namespace.h"
#include "catalog/pg_authid.h"
#include "catalog/pg_class.h"
#include "commands/extension.h"
#include "lib/stringinfo.h"
#include "miscadmin.h"
#include "postmaster/bgworker.h"
#include "utils/guc.h"
#include "utils/guc_tables.h"
#include "utils/lsyscache.h"
#include "utils/memutils.h"
#include "utils/syscache.h"

#include "compat.h"
#include "user_switch.h"

/*
 * Make role current, for what "as" says.  With a search_path, it is set
 * for as long as the switch lasts; without one, the session's stays.
 * Settings changed meanwhile are undone by pc_unbecome() (or by the abort
 * of the (sub)transaction the switch was made in).
 */
void
pc_become(PcUserSwitch *sw, PcIdentity as, Oid role, const char *search_path)
{
	int			sec_context;

	Assert(OidIsValid(role));
	/* Only projcache's own SQL runs as a superuser it chose. */
	Assert(as != PC_AS_EXTENSION || role == BOOTSTRAP_SUPERUSERID);

	GetUserIdAndSecContext(&sw->save_userid, &sw->save_sec_context);
	sec_context = sw->save_sec_context | SECURITY_LOCAL_USERID_CHANGE;
	if (as != PC_AS_FETCH_ROLE)
		sec_context |= SECURITY_RESTRICTED_OPERATION;
	sw->as = as;
	sw->role = role;
	SetUserIdAndSecContext(role, sec_context);
	sw->save_nestlevel = NewGUCNestLevel();
	if (search_path != NULL)
		(void) set_config_option("search_path", search_path,
								 PGC_USERSET, PGC_S_SESSION,
								 GUC_ACTION_SAVE, true, 0, false);
}

/* The bootstrap superuser, for projcache's own SQL (PC_AS_EXTENSION). */
void
pc_become_extension(PcUserSwitch *sw)
{
	pc_become(sw, PC_AS_EXTENSION, BOOTSTRAP_SUPERUSERID, SAFE_SEARCH_PATH);
}

/* Undo the switch's settings and go back to the user before it. */
void
pc_unbecome(PcUserSwitch *sw)
{
	Assert(GetUserId() == sw->role);
	AtEOXact_GUC(false, sw->save_nestlevel);
	SetUserIdAndSecContext(sw->save_userid, sw->save_sec_context);
}

/*
 * Go back to the user before the switch, whose settings are gone already:
 * undone by the caller, or by the abort of the subtransaction the switch
 * was made in.  The fetch role stays current through its commit.
 */
void
pc_unbecome_user(PcUserSwitch *sw)
{
	SetUserIdAndSecContext(sw->save_userid, sw->save_sec_context);
}

/*
 * Connect a projcache background worker: to dbname, or to the database
 * dboid when dbname is NULL, or to none when both are unset.  As the
 * bootstrap superuser, with no login role: see the file header.
 */
void
pc_worker_connect(const char *dbname, Oid dboid)
{
	if (dbname == NULL && OidIsValid(dboid))
		BackgroundWorkerInitializeConnectionByOid(dboid, InvalidOid, 0);
	else
		BackgroundWorkerInitializeConnection(dbname, NULL, 0);
}

/* A setting's value as the server gave it, before the connection. */
typedef struct ServerSetting
{
	const char *name;
	char	   *value;			/* NULL: the setting had no value */
} ServerSetting;

/* The current value of a setting, as text set_config_option() takes. */
static char *
setting_value(struct config_generic *gconf)
{
	switch (gconf->vartype)
	{
		case PGC_BOOL:
			return pstrdup(*((struct config_bool *) gconf)->variable ?
						   "on" : "off");
		case PGC_INT:
			return psprintf("%d", *((struct config_int *) gconf)->variable);
		case PGC_REAL:
			return psprintf("%.17g", *((struct config_real *) gconf)->variable);
		case PGC_STRING:
			{
				char	   *v = *((struct config_string *) gconf)->variable;

				return v != NULL ? pstrdup(v) : NULL;
			}
		case PGC_ENUM:
			{
				struct config_enum *conf = (struct config_enum *) gconf;

				return pstrdup(config_enum_lookup_by_value(conf,
														   *conf->variable));
			}
	}
	Assert(false);
	return NULL;
}

/* Was this value set by pg_db_role_setting for this database or role? */
static bool
set_by_database_or_role(GucSource source)
{
	return source == PGC_S_DATABASE || source == PGC_S_USER ||
		source == PGC_S_DATABASE_USER;
}

/*
 * Put back, after the connection, the server's value of every setting that
 * the database or the role had set.  The values are forced (as the
 * connection forces session_authorization), so that RESET and the end of a
 * SET LOCAL come back to them too; a reload does not change them, so a
 * change of such a setting in postgresql.conf reaches the worker when it
 * next starts.  A custom setting that only the database or role knew has no
 * server value: it is emptied.
 */
static void
restore_server_settings(const char *dbname, ServerSetting *saved, int nsaved)
{
	int			nvars;
	struct config_generic **vars = pc_get_guc_variables(&nvars);
	StringInfoData names;
	int			restored = 0;
	int			i;

	initStringInfo(&names);
	/* Check hooks (role, default_tablespace) look up catalogs in one. */
	StartTransactionCommand();
	for (i = 0; i < nvars; i++)
	{
		struct config_generic *gconf = vars[i];
		const char *value = "";
		int			j;

		if (!set_by_database_or_role(gconf->source))
			continue;
		for (j = 0; j < nsaved; j++)
		{
			if (strcmp(saved[j].name, gconf->name) == 0)
			{
				value = saved[j].value;
				break;
			}
		}
		if (value == NULL)
			ereport(ERROR,
					(errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
					 errmsg("setting \"%s\" of database \"%s\" or its role has no server value to put back",
							gconf->name, dbname),
					 errhint("Remove the setting with ALTER DATABASE ... RESET or ALTER ROLE ... RESET.")));
		(void) set_config_option(gconf->name, value, PGC_SU_BACKEND,
								 PGC_S_OVERRIDE, GUC_ACTION_SET, true,
								 ERROR, false);
		Assert(gconf->source == PGC_S_OVERRIDE);
		appendStringInfo(&names, "%s%s", restored > 0 ? ", " : "",
						 gconf->name);
		restored++;
	}
	CommitTransactionCommand();
	if (restored > 0)
		ereport(LOG,
				(errmsg_plural("projcache scheduler uses the server's value of %d setting that database \"%s\" or its role set",
							   "projcache scheduler uses the server's value of %d settings that database \"%s\" or its role set",
							   restored, restored, dbname),
				 errdetail("Settings: %s.", names.data)));
	pfree(names.data);
}

/*
 * Connect the worker to dbname, as pc_worker_connect() does, and then
 * run with the server's settings, not the database's or its role's: see
 * the file header.  PostgreSQL 15 has no connection flag that skips
 * pg_db_role_setting, so the values the server gave this process are
 * copied before the connection and put back after it.
 */
void
pc_keycache_worker_connect(const char *dbname)
{
	MemoryContext cxt;
	MemoryContext oldcxt;
	struct config_generic **vars;
	ServerSetting *saved;
	int			nvars;
	int			i;

	Assert(dbname != NULL);
	cxt = AllocSetContextCreate(TopMemoryContext, "projcache server settings",
								ALLOCSET_DEFAULT_SIZES);
	oldcxt = MemoryContextSwitchTo(cxt);
	vars = pc_get_guc_variables(&nvars);
	saved = palloc(nvars * sizeof(ServerSetting));
	for (i = 0; i < nvars; i++)
	{
		saved[i].name = pstrdup(vars[i]->name);
		saved[i].value = setting_value(vars[i]);
	}
	MemoryContextSwitchTo(oldcxt);

	pc_worker_connect(dbname, InvalidOid);
	restore_server_settings(dbname, saved, nvars);
	MemoryContextDelete(cxt);
}

/*
 * The table projcache.<relname> of this database, if it is projcache's own:
 * a plain table, a member of the extension, owned by a superuser.  A
 * relation of that name made otherwise (projcache.database may exist
 * without the extension, and its owner create a schema "projcache" there)
 * is never read as the bootstrap superuser: reading it so would run its
 * owner's code (a view's functions, a column type's casts).  InvalidOid if
 * there is none.
 */
Oid
pc_extension_table(const char *relname)
{
	Oid			nsp = get_namespace_oid("projcache", true);
	Oid			ext = get_extension_oid("projcache", true);
	Oid			relid;
	HeapTuple	tup;
	bool		ours;

	if (!OidIsValid(nsp) || !OidIsValid(ext))
		return InvalidOid;
	relid = get_relname_relid(relname, nsp);
	if (!OidIsValid(relid) ||
		getExtensionOfObject(RelationRelationId, relid) != ext)
		return InvalidOid;
	tup = SearchSysCache1(RELOID, ObjectIdGetDatum(relid));
	if (!HeapTupleIsValid(tup))
		return InvalidOid;
	ours = ((Form_pg_class) GETSTRUCT(tup))->relkind == RELKIND_RELATION &&
		superuser_arg(((Form_pg_class) GETSTRUCT(tup))->relowner);
	ReleaseSysCache(tup);
	return ours ? relid : InvalidOid;
}
