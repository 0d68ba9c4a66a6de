/*-------------------------------------------------------------------------
 *
 * keycache_role_guard.c
 *	  DROP ROLE of a role a registered named cache names is refused: the
 *	  object access hook that guards them.
 *
 * Copyright (c) 2026, projcache developers
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "catalog/objectaccess.h"
#include "catalog/pg_authid.h"
#include "commands/dbcommands.h"
#include "executor/spi.h"
#include "miscadmin.h"
#include "storage/lmgr.h"
#include "utils/snapmgr.h"

#include "keycache.h"
#include "keycache_caches.h"
#include "stream_registry.h"
#include "user_switch.h"

/* ----------------------------------------------------------------
 * Roles the registry names
 *
 * A cache names its owner, its fetch role and its readers by OID.  A role
 * dropped under it would leave a number that a dump carries to another
 * cluster, where it may be some other role.  So DROP ROLE of a role a
 * registered cache names fails, as for a role that owns objects: the
 * object access hook sees each role DROP ROLE is about to remove.  It is a
 * guard, not a dependency (the registry is one database's table, and
 * DROP ROLE runs in any):
 *
 * - It first takes the lock on the role that DROP ROLE takes right after
 *	 it.  A change that names a role holds a lock on it until it commits
 *	 (keycache_registry.c), so a DROP ROLE waits for it, and no change
 *	 naming the role is in progress once the guard has the lock.
 * - In projcache.database it reads the registry as the latest snapshot
 *	 has it, this transaction's changes included: a grant committed a
 *	 moment ago, or made earlier in the same transaction, is seen.
 * - Elsewhere it reads the published slots, and the roles that changes
 *	 committed and not yet published name (PcNamedRole, filled by each
 *	 committing backend before it releases its lock on the role): between
 *	 them, every role the committed registry names.  It never waits for
 *	 the worker.
 *
 * DROP OWNED does not revoke caches: revoke_cache and drop_cache do.
 *
 * A change stream (1.4) names its owner the same way: in
 * projcache.database, DROP ROLE of it is refused too (the registry read by
 * stream_registry.c).  Streams have no published copy yet, so a DROP ROLE
 * in another database does not see them.
 * ----------------------------------------------------------------
 */
static object_access_hook_type prev_object_access_hook = NULL;

/* Is named-role entry e free: unused, or every change it holds published? */
static bool
named_entry_free(const PcNamedRole *e, uint64 published)
{
	return !OidIsValid(e->role) ||
		(e->uncommitted == 0 && e->published_by != 0 &&
		 published >= e->published_by);
}

/*
 * At PRE_COMMIT of a transaction that named roles: an entry for each (the
 * user's own for that role if it has one), their indexes in entries[].
 * Fails the transaction (53400) when the table has not that many free, or
 * when the user's would be more than PC_NAMED_ROLES_PER_ROLE (a superuser
 * is bound by the table alone).  The worker's publications free them.
 */
void
pc_caches_reserve_named(const Oid *roles, int n, int *entries)
{
	PcCaches   *caches = pc_caches_shared;
	Oid			by = GetUserId();
	bool		bounded = !superuser_arg(by);
	uint64		published;
	int			mine = 0;
	int			fresh = 0;
	int			nfree = 0;
	bool		ok;

	Assert(n <= PC_NAMED_ROLES_PER_ROLE);
	pc_lock_alone(caches->lock, LW_EXCLUSIVE);
	published = pg_atomic_read_u64(&caches->published_reload);
	for (int k = 0; k < n; k++)
		entries[k] = -1;
	for (int i = 0; i < PC_MAX_NAMED_ROLES; i++)
	{
		PcNamedRole *e = &caches->named[i];

		if (named_entry_free(e, published))
		{
			nfree++;
			continue;
		}
		if (e->by != by)
			continue;
		mine++;
		for (int k = 0; k < n; k++)
			if (e->role == roles[k])
				entries[k] = i;
	}
	for (int k = 0; k < n; k++)
		fresh += entries[k] < 0;
	ok = fresh <= nfree &&
		(!bounded || mine + fresh <= PC_NAMED_ROLES_PER_ROLE);
	for (int k = 0, i = 0; ok && k < n; k++)
	{
		if (entries[k] < 0)
		{
			while (!named_entry_free(&caches->named[i], published))
				i++;
			entries[k] = i;
			caches->named[i].role = roles[k];
			caches->named[i].by = by;
			caches->named[i].uncommitted = 0;
			caches->named[i].published_by = 0;
		}
		caches->named[entries[k]].uncommitted++;
	}
	LWLockRelease(caches->lock);
	if (ok)
		return;
	if (fresh > nfree)
		ereport(ERROR,
				(errcode(ERRCODE_CONFIGURATION_LIMIT_EXCEEDED),
				 errmsg("too many changes to named caches are waiting for the projcache worker"),
				 errdetail("Changes committed and not yet published name %d roles, of at most %d.",
						   PC_MAX_NAMED_ROLES - nfree, PC_MAX_NAMED_ROLES),
				 errhint("Retry once the worker has reloaded the registry (about a second).")));
	ereport(ERROR,
			(errcode(ERRCODE_CONFIGURATION_LIMIT_EXCEEDED),
			 errmsg("too many changes to named caches by role \"%s\" are waiting for the projcache worker",
					GetUserNameFromId(by, false)),
			 errdetail("Its changes committed and not yet published name %d roles; this one would add %d, of at most %d.",
					   mine, fresh, PC_NAMED_ROLES_PER_ROLE),
			 errhint("Retry once the worker has reloaded the registry (about a second).")));
}

/*
 * At COMMIT (nothing here fails): the entries stay until a reload that
 * started after this commit, and so reads it, has published.
 */
void
pc_caches_commit_named(const int *entries, int n)
{
	PcCaches   *caches = pc_caches_shared;
	uint64		by_reload = pg_atomic_read_u64(&caches->reloads_started) + 1;

	pc_lock_alone(caches->lock, LW_EXCLUSIVE);
	for (int k = 0; k < n; k++)
	{
		PcNamedRole *e = &caches->named[entries[k]];

		Assert(e->uncommitted > 0);
		e->uncommitted--;
		e->published_by = Max(e->published_by, by_reload);
	}
	LWLockRelease(caches->lock);
}

/* At ABORT: give back what PRE_COMMIT reserved. */
void
pc_caches_release_named(const int *entries, int n)
{
	PcCaches   *caches = pc_caches_shared;

	pc_lock_alone(caches->lock, LW_EXCLUSIVE);
	for (int k = 0; k < n; k++)
	{
		PcNamedRole *e = &caches->named[entries[k]];

		Assert(e->uncommitted > 0);
		if (--e->uncommitted == 0 && e->published_by == 0)
			e->role = InvalidOid;
	}
	LWLockRelease(caches->lock);
}

/*
 * Which cache names the role, as what: from the published slots, or from
 * a change committed and not published yet (cache "" then).
 */
static const char *
published_role_use(Oid role, char *cache)
{
	PcCaches   *caches = pc_caches_shared;
	const char *as = NULL;
	uint64		published;

	pc_lock_alone(caches->lock, LW_SHARED);
	for (int s = 0; s < PC_MAX_CACHES && as == NULL; s++)
	{
		const PcCacheSlot *slot = &caches->slots[s];

		if (!slot->in_use)
			continue;
		if (slot->reg.owner == role)
			as = "owner";
		else if (slot->reg.fetch_role == role)
			as = "fetch role";
		for (int i = 0; as == NULL && i < slot->reg.nreaders; i++)
			if (slot->reg.readers[i] == role)
				as = "reader";
		if (as != NULL)
			strlcpy(cache, slot->reg.name, NAMEDATALEN);
	}
	published = pg_atomic_read_u64(&caches->published_reload);
	for (int i = 0; i < PC_MAX_NAMED_ROLES && as == NULL; i++)
		if (caches->named[i].role == role &&
			!named_entry_free(&caches->named[i], published))
			as = "a role a change just committed names";
	LWLockRelease(caches->lock);
	return as;
}


/*
 * Which cache names the role, as what: from the registry, as the latest
 * snapshot has it (this transaction's changes included).  false when the
 * registry cannot be read here: another database than projcache.database,
 * or no registry of ours.
 */
static bool
registry_role_use(Oid role, char *cache, const char **as)
{
	Oid			argtypes[1] = {OIDOID};
	Datum		args[1] = {ObjectIdGetDatum(role)};
	PcUserSwitch rs;
	SPIPlanPtr	plan;
	bool		isnull;

	*as = NULL;
	if (pc_database == NULL || IsInParallelMode() ||
		strcmp(get_database_name(MyDatabaseId), pc_database) != 0 ||
		!OidIsValid(pc_caches_registry_relid()))
		return false;
	pc_become_extension(&rs);
	if (SPI_connect() != SPI_OK_CONNECT)
		elog(ERROR, "SPI_connect failed");
	plan = SPI_prepare("SELECT name, owner::pg_catalog.oid OPERATOR(pg_catalog.=) $1,"
					   " fetch_role::pg_catalog.oid OPERATOR(pg_catalog.=) $1"
					   " FROM projcache.cache_registry"
					   " WHERE owner::pg_catalog.oid OPERATOR(pg_catalog.=) $1"
					   " OR fetch_role::pg_catalog.oid OPERATOR(pg_catalog.=) $1"
					   " OR $1 OPERATOR(pg_catalog.=)"
					   " ANY (readers::pg_catalog.oid[])"
					   " ORDER BY name LIMIT 1",
					   1, argtypes);
	if (plan == NULL ||
		SPI_execute_snapshot(plan, args, NULL, GetLatestSnapshot(),
							 InvalidSnapshot, true, false, 1) != SPI_OK_SELECT)
		elog(ERROR, "could not read projcache.cache_registry");
	if (SPI_processed > 0)
	{
		HeapTuple	tup = SPI_tuptable->vals[0];
		TupleDesc	desc = SPI_tuptable->tupdesc;

		strlcpy(cache, SPI_getvalue(tup, desc, 1), NAMEDATALEN);
		if (DatumGetBool(SPI_getbinval(tup, desc, 2, &isnull)) && !isnull)
			*as = "owner";
		else if (DatumGetBool(SPI_getbinval(tup, desc, 3, &isnull)) && !isnull)
			*as = "fetch role";
		else
			*as = "reader";
	}
	SPI_finish();
	pc_unbecome(&rs);
	return true;
}

static void
refuse_named_role_drop(ObjectAccessType access, Oid classId, Oid objectId,
					   int subId, void *arg)
{
	char		cache[NAMEDATALEN] = "";
	const char *as = NULL;
	char	   *stream;

	if (prev_object_access_hook)
		prev_object_access_hook(access, classId, objectId, subId, arg);
	if (access != OAT_DROP || classId != AuthIdRelationId || pc_caches_shared == NULL)
		return;

	/* What DROP ROLE takes next: changes naming the role end first. */
	LockSharedObject(AuthIdRelationId, objectId, 0, AccessExclusiveLock);
	if (!registry_role_use(objectId, cache, &as))
		as = published_role_use(objectId, cache);
	if (as != NULL && cache[0] == '\0')
		ereport(ERROR,
				(errcode(ERRCODE_DEPENDENT_OBJECTS_STILL_EXIST),
				 errmsg("role \"%s\" cannot be dropped because a named cache depends on it",
						GetUserNameFromId(objectId, false)),
				 errdetail("A change to the named caches that names the role has committed, and the projcache worker has not published it yet."),
				 errhint("Drop the cache, revoke it from the role, or change its fetch role, in database \"%s\"; or retry in a second.",
						 pc_database ? pc_database : "")));
	if (as != NULL)
		ereport(ERROR,
				(errcode(ERRCODE_DEPENDENT_OBJECTS_STILL_EXIST),
				 errmsg("role \"%s\" cannot be dropped because named cache \"%s\" depends on it",
						GetUserNameFromId(objectId, false), cache),
				 errdetail("It is the cache's %s.", as),
				 errhint("Drop the cache, revoke it from the role, or change its fetch role, in database \"%s\".",
						 pc_database ? pc_database : "")));
	stream = pc_stream_of_owner(objectId);
	if (stream != NULL)
		ereport(ERROR,
				(errcode(ERRCODE_DEPENDENT_OBJECTS_STILL_EXIST),
				 errmsg("role \"%s\" cannot be dropped because stream \"%s\" depends on it",
						GetUserNameFromId(objectId, false), stream),
				 errdetail("It is the stream's owner."),
				 errhint("Drop the stream in database \"%s\".",
						 pc_database ? pc_database : "")));
}

void
pc_caches_install_hooks(void)
{
	prev_object_access_hook = object_access_hook;
	object_access_hook = refuse_named_role_drop;
}
