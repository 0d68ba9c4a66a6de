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
 *	 its sequence, which PUBLIC may not read) and on the catalogs; and the
 *	 storing of a snapshot's backing view, from a query tree the owner's
 *	 analysis made (snapshot_registry.c, pc_snap_create_view): no caller's
 *	 text is parsed then, and nothing of the caller's runs.
 *
 *	 PC_AS_SNAPSHOT_OWNER: a snapshot's owner, under
 *	 SECURITY_RESTRICTED_OPERATION (no temporary objects, no SET ROLE), as
 *	 maintenance commands run user code.  The query's check and analysis
 *	 at create_snapshot() and at the 1.0.1 update's binding (with the
 *	 creator's search path, or pg_catalog), its load in a load worker, and
 *	 the check of the owner's rights after a failed load (snapshot_load.c).
 *
 *	 PC_AS_FETCH_ROLE: projcache.fetch_role, or the fetch function's owner,
 *	 with SECURITY_LOCAL_USERID_CHANGE (no SET ROLE), in the scheduler: the
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
 *	 pc_worker_connect(): the scheduler (projcache.database), the launcher
 *	 (no database) and each load worker (the reader's database) connect as
 *	 the bootstrap superuser, so that no role needs LOGIN; they run no user
 *	 code until they switch with pc_become().
 *
 * Copyright (c) 2026, projcache developers
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "catalog/pg_authid.h"
#include "miscadmin.h"
#include "postmaster/bgworker.h"
#include "utils/guc.h"

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
