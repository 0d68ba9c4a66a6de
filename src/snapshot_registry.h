/*-------------------------------------------------------------------------
 *
 * snapshot_registry.h
 *	  What the registry's own files (snapshot_registry.c, the table;
 *	  snapshot_regcache.c, the readers' cache; snapshot_xact.c, the
 *	  transaction's state) tell one another.  The rest of projcache uses
 *	  snapshot.h.
 *
 * Copyright (c) 2026, projcache developers
 *
 *-------------------------------------------------------------------------
 */
#ifndef PROJCACHE_SNAPSHOT_REGISTRY_H
#define PROJCACHE_SNAPSHOT_REGISTRY_H

#include "nodes/pg_list.h"

/* Which registration a row was: what freeing its slot needs. */
typedef struct SnapRegId
{
	char	   *name;
	int64		id;
	int64		stamp;			/* created_at, in microseconds */
} SnapRegId;

/* snapshot_registry.c */
extern Oid	pc_registry_relid(void);
extern Oid	pc_registry_known_relid(void);
extern List *pc_registry_delete_orphans(void);

/* snapshot_regcache.c */
extern void pc_regcache_reset_soon(void);

/* snapshot_xact.c */
extern bool pc_registry_changed_here(void);
extern bool pc_snap_created_here(int64 id);

#endif							/* PROJCACHE_SNAPSHOT_REGISTRY_H */
