/*-------------------------------------------------------------------------
 *
 * user_switch.h
 *	  The one way projcache changes who it runs as (user_switch.c).
 *
 * Copyright (c) 2026, projcache developers
 *
 *-------------------------------------------------------------------------
 */
#ifndef PROJCACHE_USER_SWITCH_H
#define PROJCACHE_USER_SWITCH_H

/* The search path for SQL that must find only the built-in objects. */
#define SAFE_SEARCH_PATH "pg_catalog, pg_temp"

/*
 * Whom a switch makes current, and so what may run under it.  The list of
 * every switch, with what runs under each, is at the top of user_switch.c.
 */
typedef enum PcIdentity
{
	/*
	 * The bootstrap superuser, for projcache's own SQL on its own tables and
	 * on the catalogs.  Never any text or object that came from a caller.
	 */
	PC_AS_EXTENSION,

	/* A snapshot's owner: analyzing, checking and loading its query. */
	PC_AS_SNAPSHOT_OWNER,

	/*
	 * The fetch role: calling the fetch function in the worker (for a named
	 * cache's keys, its fetch role or owner, see keycache_fetch.c).
	 */
	PC_AS_FETCH_ROLE,

	/* The role a foreign table is read for: checking its rights to read. */
	PC_AS_READER,
} PcIdentity;

/* A switch in force: who was current before it, to go back to. */
typedef struct PcUserSwitch
{
	PcIdentity	as;
	Oid			role;
	Oid			save_userid;
	int			save_sec_context;
	int			save_nestlevel;
} PcUserSwitch;

extern void pc_become(PcUserSwitch *sw, PcIdentity as, Oid role,
					  const char *search_path);
extern void pc_become_extension(PcUserSwitch *sw);
extern void pc_unbecome(PcUserSwitch *sw);
extern void pc_unbecome_user(PcUserSwitch *sw);

/* projcache's own table of that name, or InvalidOid (never another's). */
extern Oid	pc_extension_table(const char *relname);

/* How a projcache background worker connects (no login role is needed). */
extern void pc_worker_connect(const char *dbname, Oid dboid);
extern void pc_keycache_worker_connect(const char *dbname);

#endif							/* PROJCACHE_USER_SWITCH_H */
