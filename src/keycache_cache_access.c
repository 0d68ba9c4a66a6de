/*-------------------------------------------------------------------------
 *
 * keycache_cache_access.c
 *	  Which cache a key is of, and who may read a cache: each backend's copy
 *	  of the published caches (see keycache_caches.c), the key's prefix
 *	  looked up in it, and the rights checked on it.
 *
 * Copyright (c) 2026, projcache developers
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "catalog/pg_proc.h"
#include "catalog/pg_authid.h"
#include "funcapi.h"
#include "miscadmin.h"
#include "utils/acl.h"
#include "utils/syscache.h"

#include "keycache.h"
#include "keycache_caches.h"

/*
 * May the current user read the cache: a superuser, its owner's
 * privileges, or a reader's.  A grant to pg_database_owner counts for
 * nobody: who is a member of it depends on the database, and a cache is
 * the whole server's (grant_cache refuses it since 1.3.1; a 1.3 registry
 * may still hold one).
 */
bool
pc_cache_may_read(const PcCacheReg *reg)
{
	Oid			me = GetUserId();

	if (has_privs_of_role(me, reg->owner))
		return true;
	for (int i = 0; i < reg->nreaders; i++)
		if (reg->readers[i] != ROLE_PG_DATABASE_OWNER &&
			has_privs_of_role(me, reg->readers[i]))
			return true;
	return false;
}

/* ----------------------------------------------------------------
 * Which cache a key is of
 *
 * A key "name:rest" is the cache name's if name is registered and
 * published; every other key is the default cache's.  The prefix is looked
 * up once, where the key comes in (pc_key_cache_for_read() for a reader's
 * call, pc_key_restorable() for the dump's record), and the key's entry
 * keeps the answer, a PcCacheId; the worker and the views ask
 * pc_cache_of() about that.  Each backend keeps a copy of the published
 * slots, taken again when the generation moves, so that a read takes
 * caches.lock only after a change.
 * ----------------------------------------------------------------
 */
typedef struct LocalCache
{
	int			slot;
	bool		open;
	uint32		gen;
	uint32		namelen;
	PcCacheReg	reg;
} LocalCache;

static LocalCache *local_caches = NULL; /* PC_MAX_CACHES, in TopMemoryContext */
static int	local_count = 0;
static bool local_loaded = false;
static uint64 local_generation = PG_UINT64_MAX;

static void
refresh_local_caches(void)
{
	PcCaches   *caches = pc_caches_shared;

	if (pg_atomic_read_u64(&caches->generation) == local_generation)
		return;
	if (local_caches == NULL)
		local_caches = MemoryContextAlloc(TopMemoryContext,
										  sizeof(LocalCache) * PC_MAX_CACHES);
	pc_lock_alone(caches->lock, LW_SHARED);
	local_generation = pg_atomic_read_u64(&caches->generation);
	local_loaded = caches->loaded;
	local_count = 0;
	for (int s = 0; s < PC_MAX_CACHES; s++)
	{
		const PcCacheSlot *slot = &caches->slots[s];
		LocalCache *lc;

		if (!slot->in_use)
			continue;
		lc = &local_caches[local_count++];
		lc->slot = s;
		lc->open = slot->open;
		lc->gen = slot->gen;
		lc->reg = slot->reg;
		lc->namelen = (uint32) strlen(slot->reg.name);
	}
	LWLockRelease(caches->lock);
}

/* Could this be a cache's name: [a-z][a-z0-9_]*, shorter than NAMEDATALEN? */
static bool
could_be_cache_name(const char *name, uint32 len)
{
	if (len == 0 || len >= NAMEDATALEN || name[0] < 'a' || name[0] > 'z')
		return false;
	for (uint32 i = 1; i < len; i++)
		if (!((name[i] >= 'a' && name[i] <= 'z') ||
			  (name[i] >= '0' && name[i] <= '9') || name[i] == '_'))
			return false;
	return true;
}

/*
 * The cache a key is of, by its prefix: its slot (with a copy of its
 * registration in *reg, and its id in *id), PC_CACHE_DEFAULT (*id
 * PC_CACHE_ID_DEFAULT), or PC_CACHE_UNAVAILABLE for a key of a cache that
 * is opening or closing, or whose prefix could be a cache's while the
 * registry is not published yet (after a start): such a key reads as
 * pending and is not created.  No rights are checked here.
 */
static int
key_cache(const char *key, uint32 len, PcCacheReg *reg, PcCacheId *id)
{
	const char *colon = memchr(key, ':', Min(len, NAMEDATALEN));
	uint32		namelen;

	*id = PC_CACHE_ID_DEFAULT;
	if (colon == NULL)
		return PC_CACHE_DEFAULT;
	namelen = (uint32) (colon - key);
	if (!could_be_cache_name(key, namelen))
		return PC_CACHE_DEFAULT;
	refresh_local_caches();
	if (!local_loaded)
		return PC_CACHE_UNAVAILABLE;
	for (int i = 0; i < local_count; i++)
	{
		const LocalCache *lc = &local_caches[i];

		if (lc->namelen != namelen || memcmp(lc->reg.name, key, namelen) != 0)
			continue;
		if (!lc->open)
			return PC_CACHE_UNAVAILABLE;
		*reg = lc->reg;
		*id = PC_CACHE_ID(lc->slot, lc->gen);
		return lc->slot;
	}
	return PC_CACHE_DEFAULT;
}

/*
 * The cache a key's entry says it is of: its slot (a copy of its
 * registration in *reg, if reg is not NULL) while that very cache holds
 * the slot and is open, PC_CACHE_DEFAULT for the default cache's, and
 * PC_CACHE_UNAVAILABLE for a key of a cache that is closing, or is gone:
 * such a key is not read, fetched or shown as any cache's until the
 * worker has evicted it.
 */
int
pc_cache_of(PcCacheId id, PcCacheReg *reg)
{
	int			slot = pc_cache_id_slot(id);

	if (id == PC_CACHE_ID_DEFAULT)
		return PC_CACHE_DEFAULT;
	refresh_local_caches();
	for (int i = 0; i < local_count; i++)
	{
		const LocalCache *lc = &local_caches[i];

		if (lc->slot != slot)
			continue;
		if (!lc->open || PC_CACHE_ID(lc->slot, lc->gen) != id)
			break;
		if (reg != NULL)
			*reg = lc->reg;
		return slot;
	}
	return PC_CACHE_UNAVAILABLE;
}

/*
 * The cache a key is of, for a call on it by the current user (get,
 * lookup, fetch, invalidate, evict): as key_cache() says, with its id in
 * *id, and an ERROR (42501) unless the user may read that cache.
 */
int
pc_key_cache_for_read(const char *key, uint32 len, PcCacheId *id)
{
	PcCacheReg	reg;
	int			slot = key_cache(key, len, &reg, id);

	if (slot >= 0 && !pc_cache_may_read(&reg))
		ereport(ERROR,
				(errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
				 errmsg("permission denied for cache \"%s\"", reg.name),
				 errhint("The cache's owner can allow it with projcache.grant_cache().")));
	return slot;
}

/*
 * What the key dump writes of a key's cache (keycache_dump.c), from the id
 * its entry keeps: for a named cache's key, *tagged and the cache's
 * creation time in *tag; for the default cache's, neither.  False: leave
 * the key out (its cache is closing or gone, so its value is no cache's
 * now).
 */
bool
pc_cache_dump_tag(PcCacheId id, bool *tagged, TimestampTz *tag)
{
	PcCacheReg	reg;
	int			slot = pc_cache_of(id, &reg);

	*tagged = slot >= 0;
	*tag = slot >= 0 ? reg.created_at : 0;
	return slot != PC_CACHE_UNAVAILABLE;
}

/*
 * May a key of the dump be loaded: it was dumped for the cache it is of
 * now, the very one (a tagged key, tagged with its cache's creation time),
 * or the default cache (untagged).  Not a dropped cache's key, nor one of
 * a cache made again under the name, nor a default key of a prefix that a
 * cache has taken since: each would be served under grants its value was
 * not fetched for.  Before the registry is published, no key of a prefix
 * that could be a cache's is.  *id: the cache its entry is made for.
 */
bool
pc_key_restorable(const char *key, uint32 len, bool tagged, TimestampTz tag,
				  PcCacheId *id)
{
	PcCacheReg	reg;
	int			slot = key_cache(key, len, &reg, id);

	if (slot == PC_CACHE_DEFAULT)
		return !tagged;
	return slot >= 0 && tagged && reg.created_at == tag;
}

/*
 * The published caches' generation: a read that checked a key's cache,
 * then read the key, reads again if it moved in between.
 */
uint64
pc_caches_generation(void)
{
	return pg_atomic_read_u64(&pc_caches_shared->generation);
}

/*
 * Would a named cache's fetch as runas run, with a superuser's rights,
 * code that a role who is not a superuser controls (the function's owner,
 * who may replace its body at any time)?  Checked at create_cache(),
 * alter_cache() and each fetch.
 */
bool
pc_fetch_escalates(Oid fn, Oid runas)
{
	HeapTuple	tup;
	Oid			owner;

	if (!superuser_arg(runas))
		return false;
	tup = SearchSysCache1(PROCOID, ObjectIdGetDatum(fn));
	if (!HeapTupleIsValid(tup))
		return true;
	owner = ((Form_pg_proc) GETSTRUCT(tup))->proowner;
	ReleaseSysCache(tup);
	return !superuser_arg(owner);
}

/* Is any named cache registered (published)? */
bool
pc_caches_in_use(void)
{
	for (int s = 0; s < PC_MAX_CACHES; s++)
		if (pc_caches_shared->slots[s].in_use)
			return true;
	return false;
}

/* Has the worker published the registry since the server started? */
bool
pc_caches_published(void)
{
	bool		loaded;

	pc_lock_alone(pc_caches_shared->lock, LW_SHARED);
	loaded = pc_caches_shared->loaded;
	LWLockRelease(pc_caches_shared->lock);
	return loaded;
}
