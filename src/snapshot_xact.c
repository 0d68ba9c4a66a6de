/*-------------------------------------------------------------------------
 *
 * snapshot_xact.c
 *	  What the current transaction did to the snapshot registry: the
 *	  snapshots it registered and dropped, whether it changed the registry
 *	  at all, and what is done about each when it commits or aborts.
 *
 * A snapshot's slot is freed only once the transaction that dropped it has
 * committed; a registration made by a transaction gets no slot before it
 * commits.  A transaction that changed the registry bypasses the readers'
 * cache (snapshot_regcache.c) and, once committed, makes every backend drop
 * its own.  A registration also goes with its backing view: whatever drops
 * the view drops the registration at commit.  The registry's rows are
 * written by snapshot_registry.c only; this file keeps the transaction's
 * state and the callbacks.
 *
 * Copyright (c) 2026, projcache developers
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/xact.h"
#include "catalog/objectaccess.h"
#include "catalog/pg_class.h"
#include "miscadmin.h"
#include "port/atomics.h"
#include "utils/inval.h"
#include "utils/lsyscache.h"
#include "utils/memutils.h"

#include "snapshot.h"
#include "snapshot_registry.h"

/* ----------------------------------------------------------------
 * The transaction's state
 * ----------------------------------------------------------------
 */

/* Registrations made by the current transaction (TopTransactionContext). */
static List *created_snapshots = NIL;

/*
 * Snapshots dropped by the current transaction (SnapRegId, in
 * TopTransactionContext): their slots are freed once it commits.  Freed
 * earlier, a reader that still sees the registration would load it into a
 * new slot that nobody frees.
 */
static List *dropped_snapshots = NIL;

/* Did the current transaction change the registry?  See the readers' cache. */
static bool registry_changed = false;

/* Did it drop a view that may back a snapshot?  See below. */
static bool backing_view_dropped = false;

static bool xact_callback_registered = false;

static void register_xact_callback(void);

/*
 * Note that the current transaction is about to change the registry: it
 * bypasses the readers' cache from now on, drops it now and when it ends,
 * and moves the shared generation once it has committed.
 */
void
pc_registry_changed(void)
{
	register_xact_callback();
	registry_changed = true;
	pc_regcache_reset_soon();
}

/* Has the current transaction changed the registry? */
bool
pc_registry_changed_here(void)
{
	return registry_changed;
}

/* Note a registration made by this transaction: it gets no slot yet. */
void
pc_snap_remember_created(int64 id)
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

/* Was registration id made by the current transaction? */
bool
pc_snap_created_here(int64 id)
{
	ListCell   *lc;

	foreach(lc, created_snapshots)
	{
		if (*(int64 *) lfirst(lc) == id)
			return true;
	}
	return false;
}

static void
forget_at_commit(const char *name, int64 id, int64 stamp)
{
	MemoryContext oldcxt;
	SnapRegId  *d;

	register_xact_callback();
	oldcxt = MemoryContextSwitchTo(TopTransactionContext);
	d = palloc(sizeof(SnapRegId));
	d->name = pstrdup(name);
	d->id = id;
	d->stamp = stamp;
	dropped_snapshots = lappend(dropped_snapshots, d);
	MemoryContextSwitchTo(oldcxt);
}

/* Free the slot of a dropped registration once this transaction commits. */
void
pc_snap_forget_at_commit(SnapReg *reg)
{
	forget_at_commit(reg->name, reg->id, reg->stamp);
}

/* ----------------------------------------------------------------
 * Registrations whose view was dropped
 *
 * A registration goes with its backing view.  Whatever drops the view (DROP
 * TYPE ... CASCADE of a column's type, DROP OWNED BY its owner, DROP VIEW)
 * drops the registration when the transaction commits, so that no reader
 * meets a registration whose types, view or owner are gone, and its name
 * is free again.  The object access hook only notes that a view was
 * dropped; at commit, every registration whose view no longer exists is
 * deleted (a drop rolled back to a savepoint leaves its view, and so its
 * registration), and its slot freed as drop_snapshot() frees it.
 *
 * Any view: its schema and name do not tell a backing view, since its
 * owner may move it out of schema projcache (ALTER VIEW ... SET SCHEMA
 * needs CREATE only on the schema it goes to) and rename it there.  A
 * transaction that dropped other views deletes nothing, and changes
 * nothing in the registry.  Temporary views are left out: no view moves
 * into or out of a temporary schema, so none backs a snapshot.
 * ----------------------------------------------------------------
 */
static object_access_hook_type prev_object_access_hook = NULL;

static void
note_backing_view_drop(ObjectAccessType access, Oid classId, Oid objectId,
					   int subId, void *arg)
{
	if (prev_object_access_hook)
		prev_object_access_hook(access, classId, objectId, subId, arg);
	if (access == OAT_DROP && classId == RelationRelationId && subId == 0 &&
		!backing_view_dropped && get_rel_relkind(objectId) == RELKIND_VIEW &&
		get_rel_persistence(objectId) != RELPERSISTENCE_TEMP)
	{
		register_xact_callback();
		backing_view_dropped = true;
	}
}

void
pc_snap_install_hooks(void)
{
	prev_object_access_hook = object_access_hook;
	object_access_hook = note_backing_view_drop;
}

/* Before commit: delete the registrations whose view is gone. */
static void
drop_orphaned_registrations(void)
{
	ListCell   *lc;

	foreach(lc, pc_registry_delete_orphans())
	{
		SnapRegId  *r = (SnapRegId *) lfirst(lc);

		forget_at_commit(r->name, r->id, r->stamp);
	}
}

/* ----------------------------------------------------------------
 * The end of the transaction
 * ----------------------------------------------------------------
 */

/*
 * At the end of a transaction: free the slots of the snapshots it dropped,
 * if it committed, and forget what it registered and dropped.  A prepared
 * transaction would commit later, in another session, where nobody would
 * free those slots: PREPARE is refused.
 *
 * If it changed the registry, drop this backend's readers' cache, and
 * once it has committed (its rows are visible by now) move the shared
 * generation, so that every backend drops its own.  It also sends a
 * relcache invalidation of the registry: the commit record carries it to
 * standbys, whose backends see no generation of the primary's, and COMMIT
 * PREPARED, which runs no callback of ours, delivers it too.
 */
static void
snapshot_xact_callback(XactEvent event, void *arg)
{
	ListCell   *lc;

	if ((event == XACT_EVENT_PRE_COMMIT || event == XACT_EVENT_PRE_PREPARE) &&
		backing_view_dropped)
	{
		backing_view_dropped = false;
		drop_orphaned_registrations();
	}
	if (event == XACT_EVENT_PRE_PREPARE && dropped_snapshots != NIL)
		ereport(ERROR,
				(errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
				 errmsg("cannot PREPARE a transaction that has dropped a projcache snapshot")));

	/*
	 * Only a transaction that wrote has a commit record to carry it: one
	 * whose change failed (on a standby, say) and was caught must still be
	 * able to commit, and a standby cannot log the invalidation alone.
	 */
	if ((event == XACT_EVENT_PRE_COMMIT || event == XACT_EVENT_PRE_PREPARE) &&
		registry_changed && TransactionIdIsValid(GetTopTransactionIdIfAny()))
	{
		Oid			rel = pc_registry_relid();

		if (OidIsValid(rel))
			CacheInvalidateRelcacheByRelid(rel);
	}
	if (event == XACT_EVENT_COMMIT)
	{
		foreach(lc, dropped_snapshots)
		{
			SnapRegId  *d = (SnapRegId *) lfirst(lc);

			pc_snap_forget(MyDatabaseId, d->name, d->id, d->stamp);
		}
		if (registry_changed)
			pc_snap_registry_changed();
	}
	if (event == XACT_EVENT_COMMIT || event == XACT_EVENT_ABORT ||
		event == XACT_EVENT_PREPARE)
	{
		/* Both lists lived in TopTransactionContext, gone now. */
		created_snapshots = NIL;
		dropped_snapshots = NIL;
		backing_view_dropped = false;
		if (registry_changed)
		{
			registry_changed = false;
			pc_regcache_reset_soon();
		}
	}
}

static void
register_xact_callback(void)
{
	if (!xact_callback_registered)
	{
		RegisterXactCallback(snapshot_xact_callback, NULL);
		xact_callback_registered = true;
	}
}
