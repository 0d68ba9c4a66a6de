/*-------------------------------------------------------------------------
 *
 * keycache_caches.c
 *	  The named caches as every backend sees them: the copy of the
 *	  registry in shared memory, how the key cache's worker keeps it, who
 *	  may read a cache, the roles DROP ROLE must leave alone, and the
 *	  projcache.caches view.
 *
 * The registry is a table of one database, projcache.database
 * (keycache_registry.c); readers of every database need it.  So the worker,
 * connected there, reads it and publishes each row in a slot of PcCaches:
 * soon after a change commits (pc_caches_changed(), from the committing
 * backend), though not more often than every PC_CACHES_MIN_GAP_MS, and
 * at least every PC_CACHES_POLL_MS, which also covers what sends no word:
 * rows a dump restores, a standby's replay, a transaction prepared then
 * committed.  A cache keeps its slot, and so its
 * counters, while it stays registered.
 *
 * Lock: PcCaches.lock protects the slots' registrations (the worker
 * writes them exclusively; readers copy them shared, and take nothing else
 * while they hold it).  The counters are atomics.
 *
 * Copyright (c) 2026, projcache developers
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/xact.h"
#include "catalog/dependency.h"
#include "catalog/namespace.h"
#include "catalog/objectaccess.h"
#include "catalog/pg_class.h"
#include "catalog/pg_extension.h"
#include "catalog/pg_proc.h"
#include "catalog/pg_authid.h"
#include "catalog/pg_type.h"
#include "common/int.h"
#include "commands/extension.h"
#include "executor/spi.h"
#include "fmgr.h"
#include "funcapi.h"
#include "miscadmin.h"
#include "utils/acl.h"
#include "utils/array.h"
#include "utils/builtins.h"
#include "utils/lsyscache.h"
#include "utils/memutils.h"
#include "utils/snapmgr.h"
#include "utils/syscache.h"
#include "utils/timestamp.h"

#include "keycache.h"
#include "keycache_caches.h"
#include "user_switch.h"

/* Longest a committed change, or a row no commit told of, waits. */
#define PC_CACHES_POLL_MS	1000

/*
 * Shortest time between two reloads: a role that commits changes in a
 * loop makes the worker reload at most this often, not for each one.
 */
#define PC_CACHES_MIN_GAP_MS	100

PG_FUNCTION_INFO_V1(projcache_caches);

/* The worker's next reload and its last, on pc_real_now_ms(). */
static int64 next_reload_ms = 0;
static int64 last_reload_ms = 0;

void
pc_caches_init(PcCaches *caches, LWLock *lock)
{
	memset(caches, 0, sizeof(PcCaches));
	caches->lock = lock;
	pg_atomic_init_u32(&caches->changed, 0);
	pg_atomic_init_u64(&caches->generation, 0);
	for (int i = 0; i < PC_MAX_CACHES; i++)
	{
		for (int c = 0; c < PC_CACHE_NUM_COUNTERS; c++)
			pg_atomic_init_u64(&caches->slots[i].counters[c], 0);
		pg_atomic_init_u32(&caches->slots[i].overruns, 0);
	}
}

/* A change to the registry committed: the worker reloads it now. */
void
pc_caches_changed(void)
{
	pg_atomic_write_u32(&pc_shared->caches.changed, 1);
	pc_wake_worker();
}

/*
 * An interval in whole ms, rounded down (so that any negative interval is
 * negative), a month counting 30 days and a day 24 hours; false if that
 * does not fit in 64 bits.
 */
bool
pc_interval_ms(const Interval *iv, int64 *ms)
{
	int64		usecs;

	if (pg_mul_s64_overflow((int64) iv->month * DAYS_PER_MONTH + iv->day,
							USECS_PER_DAY, &usecs) ||
		pg_add_s64_overflow(usecs, iv->time, &usecs))
		return false;
	*ms = usecs / 1000 - (usecs % 1000 < 0 ? 1 : 0);
	return true;
}

/*
 * May the current user read the cache: a superuser, its owner's
 * privileges, or a reader's.
 */
bool
pc_cache_may_read(const PcCacheReg *reg)
{
	Oid			me = GetUserId();

	if (has_privs_of_role(me, reg->owner))
		return true;
	for (int i = 0; i < reg->nreaders; i++)
		if (has_privs_of_role(me, reg->readers[i]))
			return true;
	return false;
}

/* ----------------------------------------------------------------
 * Which cache a key is of
 *
 * A key "name:rest" is the cache name's if name is registered and
 * published; every other key is the default cache's.  Each backend keeps a
 * copy of the published slots, taken again when the generation moves, so
 * that a read takes caches.lock only after a change.
 * ----------------------------------------------------------------
 */
typedef struct LocalCache
{
	int			slot;
	bool		open;
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
	PcCaches   *caches = &pc_shared->caches;

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

/* Is the key of the shape of a named cache's, "name:rest"? */
bool
pc_key_may_be_named(const char *key, uint32 len)
{
	const char *colon = memchr(key, ':', Min(len, NAMEDATALEN));

	return colon != NULL && could_be_cache_name(key, (uint32) (colon - key));
}

/*
 * The cache a key is of: its slot (and a copy of its registration in
 * *reg), PC_CACHE_DEFAULT, or PC_CACHE_UNAVAILABLE for a key of a cache
 * that is opening or closing, or whose prefix could be a cache's while the
 * registry is not published yet (after a start): such a key reads as
 * pending and is not created.  No rights are checked here.
 */
int
pc_key_cache(const char *key, uint32 len, PcCacheReg *reg)
{
	const char *colon = memchr(key, ':', Min(len, NAMEDATALEN));
	uint32		namelen;

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
		if (reg != NULL)
			*reg = lc->reg;
		return lc->open ? lc->slot : PC_CACHE_UNAVAILABLE;
	}
	return PC_CACHE_DEFAULT;
}

/*
 * The cache a key is of, for a call on it by the current user (get,
 * lookup, fetch, invalidate, evict): an ERROR (42501) unless the user may
 * read that cache.
 */
int
pc_key_cache_for_read(const char *key, uint32 len)
{
	PcCacheReg	reg;
	int			slot = pc_key_cache(key, len, &reg);

	if (slot >= 0 && !pc_cache_may_read(&reg))
		ereport(ERROR,
				(errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
				 errmsg("permission denied for cache \"%s\"", reg.name),
				 errhint("The cache's owner can allow it with projcache.grant_cache().")));
	return slot;
}

/*
 * What the key dump writes of a key's cache (keycache_dump.c): for a named
 * cache's key, *tagged and its creation time in *tag; for the default
 * cache's, neither.  False: leave the key out (its cache is opening or
 * closing, so its value is not that cache's).
 */
bool
pc_key_dump_tag(const char *key, uint32 len, bool *tagged, TimestampTz *tag)
{
	PcCacheReg	reg;
	int			slot = pc_key_cache(key, len, &reg);

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
 * that could be a cache's is.
 */
bool
pc_key_restorable(const char *key, uint32 len, bool tagged, TimestampTz tag)
{
	PcCacheReg	reg;
	int			slot = pc_key_cache(key, len, &reg);

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
	return pg_atomic_read_u64(&pc_shared->caches.generation);
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
		if (pc_shared->caches.slots[s].in_use)
			return true;
	return false;
}

/* Has the worker published the registry since the server started? */
bool
pc_caches_published(void)
{
	bool		loaded;

	pc_lock_alone(pc_shared->caches.lock, LW_SHARED);
	loaded = pc_shared->caches.loaded;
	LWLockRelease(pc_shared->caches.lock);
	return loaded;
}

/*
 * A call of the cache's function outlived its timeout, and the worker ends
 * (keycache_fetch.c): called in a signal handler, so only an atomic.
 */
void
pc_cache_note_overrun(int slot)
{
	pg_atomic_fetch_add_u32(&pc_shared->caches.slots[slot].overruns, 1);
}

/* Count n for a named cache's counter (slot from pc_key_cache()). */
void
pc_cache_count(int slot, PcCacheCounter counter, uint64 n)
{
	if (slot >= 0)
		pg_atomic_fetch_add_u64(&pc_shared->caches.slots[slot].counters[counter], n);
}

/* ----------------------------------------------------------------
 * Roles the registry names
 *
 * A cache names its owner, its fetch role and its readers by OID.  A role
 * dropped under it would leave a number that a dump carries to another
 * cluster, where it may be some other role.  So DROP ROLE of a role a
 * registered cache names fails, as for a role that owns objects: the
 * object access hook sees each role DROP ROLE is about to remove, and the
 * published registry says which ones caches name.  It is a guard, not a
 * dependency: the registry is another database's table, so the hook sees
 * it as last published, and misses what is not published yet (a change
 * committed a moment ago, or any while no worker runs or its reloads
 * fail).  DROP OWNED does not revoke caches: revoke_cache and drop_cache do.
 * ----------------------------------------------------------------
 */
static object_access_hook_type prev_object_access_hook = NULL;

static void
refuse_named_role_drop(ObjectAccessType access, Oid classId, Oid objectId,
					   int subId, void *arg)
{
	char		cache[NAMEDATALEN] = "";
	const char *as = NULL;

	if (prev_object_access_hook)
		prev_object_access_hook(access, classId, objectId, subId, arg);
	if (access != OAT_DROP || classId != AuthIdRelationId || pc_shared == NULL)
		return;

	pc_lock_alone(pc_shared->caches.lock, LW_SHARED);
	for (int s = 0; s < PC_MAX_CACHES && as == NULL; s++)
	{
		const PcCacheSlot *slot = &pc_shared->caches.slots[s];

		if (!slot->in_use)
			continue;
		if (slot->reg.owner == objectId)
			as = "owner";
		else if (slot->reg.fetch_role == objectId)
			as = "fetch role";
		for (int i = 0; as == NULL && i < slot->reg.nreaders; i++)
			if (slot->reg.readers[i] == objectId)
				as = "reader";
		if (as != NULL)
			strlcpy(cache, slot->reg.name, NAMEDATALEN);
	}
	LWLockRelease(pc_shared->caches.lock);
	if (as != NULL)
		ereport(ERROR,
				(errcode(ERRCODE_DEPENDENT_OBJECTS_STILL_EXIST),
				 errmsg("role \"%s\" cannot be dropped because named cache \"%s\" depends on it",
						GetUserNameFromId(objectId, false), cache),
				 errdetail("It is the cache's %s.", as),
				 errhint("Drop the cache, revoke it from the role, or change its fetch role, in database \"%s\".",
						 pc_database ? pc_database : "")));
}

void
pc_caches_install_hooks(void)
{
	prev_object_access_hook = object_access_hook;
	object_access_hook = refuse_named_role_drop;
}

/* ----------------------------------------------------------------
 * The worker's copy of the registry
 * ----------------------------------------------------------------
 */

/* Is a reload due, and if not, how long may the worker sleep for it? */
bool
pc_caches_reload_due(int64 now_ms, long *sleep_ms)
{
	int64		due = next_reload_ms;

	if (pg_atomic_read_u32(&pc_shared->caches.changed) != 0)
		due = Min(due, last_reload_ms + PC_CACHES_MIN_GAP_MS);
	if (now_ms >= due)
		return true;
	*sleep_ms = Min(*sleep_ms, (long) (due - now_ms));
	return false;
}

/* An interval column in ms, or PC_CACHE_SETTING_UNSET for NULL. */
static int64
column_ms(HeapTuple tup, TupleDesc desc, int attno)
{
	bool		isnull;
	Datum		d = SPI_getbinval(tup, desc, attno, &isnull);
	int64		ms;

	if (isnull)
		return PC_CACHE_SETTING_UNSET;
	if (!pc_interval_ms(DatumGetIntervalP(d), &ms) || ms < 0)
		return PC_CACHE_SETTING_UNSET;	/* create_cache() refuses these */
	return ms;
}

static int64
column_int(HeapTuple tup, TupleDesc desc, int attno, bool is_int8)
{
	bool		isnull;
	Datum		d = SPI_getbinval(tup, desc, attno, &isnull);

	if (isnull)
		return PC_CACHE_SETTING_UNSET;
	return is_int8 ? DatumGetInt64(d) : DatumGetInt32(d);
}

/*
 * The registry's table in this database, if it is projcache's own: a plain
 * table that is a member of the extension and owned by a superuser.  A
 * relation of that name made otherwise (projcache.database may exist
 * without the extension, and its owner create a schema "projcache" there)
 * is not read: reading it as the bootstrap superuser would run its
 * owner's code (a view's functions, a column type's casts).
 */
static bool
registry_is_ours(void)
{
	Oid			nsp = get_namespace_oid("projcache", true);
	Oid			ext = get_extension_oid("projcache", true);
	Oid			relid;
	HeapTuple	tup;
	bool		ours;

	if (!OidIsValid(nsp) || !OidIsValid(ext))
		return false;
	relid = get_relname_relid("cache_registry", nsp);
	if (!OidIsValid(relid) ||
		getExtensionOfObject(RelationRelationId, relid) != ext)
		return false;
	tup = SearchSysCache1(RELOID, ObjectIdGetDatum(relid));
	if (!HeapTupleIsValid(tup))
		return false;
	ours = ((Form_pg_class) GETSTRUCT(tup))->relkind == RELKIND_RELATION &&
		superuser_arg(((Form_pg_class) GETSTRUCT(tup))->relowner);
	ReleaseSysCache(tup);
	return ours;
}

/* One row's registration; false (and a reason) if it cannot be one. */
static bool
read_row(HeapTuple tup, TupleDesc desc, PcCacheReg *reg, const char **why)
{
	char	   *name = SPI_getvalue(tup, desc, 1);
	char	   *function = SPI_getvalue(tup, desc, 3);
	bool		isnull;
	Datum		d;
	Datum	   *readers;
	bool	   *nulls;
	int			nreaders;

	if (name == NULL || function == NULL || strlen(name) >= NAMEDATALEN ||
		strlen(function) >= PC_CACHE_FUNCTION_LEN)
	{
		*why = "a NULL or overlong name or fetch function";
		return false;
	}
	strlcpy(reg->name, name, NAMEDATALEN);
	strlcpy(reg->fetch_function, function, PC_CACHE_FUNCTION_LEN);
	d = SPI_getbinval(tup, desc, 2, &isnull);
	if (isnull)
	{
		*why = "a NULL owner";
		return false;
	}
	reg->owner = DatumGetObjectId(d);
	reg->owner_is_superuser = superuser_arg(reg->owner);
	d = SPI_getbinval(tup, desc, 4, &isnull);
	reg->fetch_role = isnull ? InvalidOid : DatumGetObjectId(d);
	reg->expiry_ms = column_ms(tup, desc, 5);
	reg->grace_period_ms = column_ms(tup, desc, 6);
	reg->refresh_interval_ms = column_ms(tup, desc, 7);
	reg->max_retry_backoff_ms = column_ms(tup, desc, 8);
	reg->batch_size = column_int(tup, desc, 9, false);
	reg->fetch_timeout_ms = column_ms(tup, desc, 10);
	reg->max_memory = column_int(tup, desc, 11, true);
	d = SPI_getbinval(tup, desc, 12, &isnull);
	if (!isnull)
	{
		deconstruct_array(DatumGetArrayTypeP(d), OIDOID, sizeof(Oid), true,
						  TYPALIGN_INT, &readers, &nulls, &nreaders);
		for (int i = 0; i < nreaders && reg->nreaders < PC_MAX_CACHE_READERS; i++)
			if (!nulls[i])
				reg->readers[reg->nreaders++] = DatumGetObjectId(readers[i]);
	}
	d = SPI_getbinval(tup, desc, 13, &isnull);
	reg->created_at = isnull ? 0 : DatumGetTimestampTz(d);
	return true;
}

/*
 * A WARNING, unless it says what the last one said: the worker reloads
 * every second, and a condition that lasts is told once.
 */
static void
warn_once(const char *message)
{
	static char *last = NULL;

	if (last != NULL && strcmp(last, message) == 0)
		return;
	if (last != NULL)
		pfree(last);
	last = MemoryContextStrdup(TopMemoryContext, message);
	ereport(WARNING, (errmsg("%s", message)));
}

/*
 * Read the registry's rows into regs (zeroed, PC_MAX_CACHES of them), in a
 * transaction of the caller's; returns how many.  No table of ours
 * (projcache not yet updated to 1.3 in projcache.database, or not there):
 * none.
 */
static int
read_registry(PcCacheReg *regs)
{
	PcUserSwitch rs;
	int			n = 0;
	char	   *problem = NULL;

	if (!registry_is_ours())
		return 0;
	pc_become_extension(&rs);
	if (SPI_connect() != SPI_OK_CONNECT)
		elog(ERROR, "SPI_connect failed");

	/*
	 * A lock queued on the table (a VACUUM FULL behind a transaction that
	 * changed it) must not stop the worker: this reload gives up, and the
	 * next poll tries again.
	 */
	if (SPI_execute("SET LOCAL lock_timeout = 200", false, 0) != SPI_OK_UTILITY)
		elog(ERROR, "could not set lock_timeout");
	if (SPI_execute("SELECT name, owner::pg_catalog.oid, fetch_function,"
					" fetch_role::pg_catalog.oid, expiry, grace_period,"
					" refresh_interval, max_retry_backoff, batch_size,"
					" fetch_timeout, max_memory,"
					" readers::pg_catalog.oid[], created_at"
					" FROM projcache.cache_registry ORDER BY name",
					true, PC_MAX_CACHES + 1) != SPI_OK_SELECT)
		elog(ERROR, "could not read projcache.cache_registry");
	if (SPI_processed > PC_MAX_CACHES)
		problem = psprintf("projcache.cache_registry has more than %d rows: only the first %d by name are published",
						   PC_MAX_CACHES, PC_MAX_CACHES);
	for (uint64 row = 0; row < Min(SPI_processed, PC_MAX_CACHES); row++)
	{
		const char *why = NULL;

		if (read_row(SPI_tuptable->vals[row], SPI_tuptable->tupdesc,
					 &regs[n], &why))
			n++;
		else
		{
			memset(&regs[n], 0, sizeof(PcCacheReg));
			if (problem == NULL)
				problem = psprintf("projcache.cache_registry has a row with %s: it is not published",
								   why);
		}
	}
	SPI_finish();
	pc_unbecome(&rs);
	if (problem != NULL)
		warn_once(problem);
	return n;
}

/* The slots a publication closed, to open or to free once cleared. */
typedef struct PcCacheChanges
{
	int			opening[PC_MAX_CACHES];
	int			nopening;
	int			closing[PC_MAX_CACHES];
	int			nclosing;
} PcCacheChanges;

/*
 * Make the slots say what regs (n of them) say: a cache still registered
 * keeps its slot and counters; one gone is closed, and a new one takes a
 * free slot closed, with counters at zero.  A closed cache's keys read as
 * pending and are not created (pc_key_cache()).  The caller then clears
 * the map of their prefixes and calls finish_publish().  At the first
 * publication since the server started, new caches open at once: until
 * then no key of a prefix that could be a cache's was created, and the
 * dump brings back only the keys dumped for the very cache they are of
 * (pc_key_restorable()).  Returns whether anything changed.
 */
static bool
publish(const PcCacheReg *regs, int n, PcCacheChanges *ch)
{
	PcCaches   *caches = &pc_shared->caches;
	bool		changed = false;
	bool		kept[PC_MAX_CACHES] = {false};
	bool		first = !caches->loaded;

	ch->nopening = ch->nclosing = 0;
	pc_lock_alone(caches->lock, LW_EXCLUSIVE);
	for (int s = 0; s < PC_MAX_CACHES; s++)
	{
		PcCacheSlot *slot = &caches->slots[s];
		int			r;

		if (!slot->in_use)
			continue;
		/* The same cache: its name, and when it was made. */
		for (r = 0; r < n; r++)
			if (strcmp(slot->reg.name, regs[r].name) == 0 &&
				slot->reg.created_at == regs[r].created_at)
				break;
		if (r == n)
		{
			slot->open = false;
			ch->closing[ch->nclosing++] = s;
			changed = true;
			continue;
		}
		kept[r] = true;
		/* Left closed by a worker that ended before finish_publish(). */
		if (!slot->open)
			ch->opening[ch->nopening++] = s;
		if (memcmp(&slot->reg, &regs[r], sizeof(PcCacheReg)) != 0)
		{
			slot->reg = regs[r];
			changed = true;
		}
	}
	for (int r = 0; r < n; r++)
	{
		PcCacheSlot *slot;
		int			s;

		if (kept[r])
			continue;
		for (s = 0; s < PC_MAX_CACHES && caches->slots[s].in_use; s++)
			;
		if (s == PC_MAX_CACHES)
			break;				/* create_cache() keeps to PC_MAX_CACHES */
		slot = &caches->slots[s];
		for (int c = 0; c < PC_CACHE_NUM_COUNTERS; c++)
			pg_atomic_write_u64(&slot->counters[c], 0);
		pg_atomic_write_u32(&slot->overruns, 0);
		slot->overruns_seen = 0;
		slot->paused_until_ms = 0;
		slot->reg = regs[r];
		slot->in_use = true;
		slot->open = first;
		if (!first)
			ch->opening[ch->nopening++] = s;
		changed = true;
	}
	if (first)
	{
		caches->loaded = true;
		changed = true;
	}
	if (changed)
		pg_atomic_fetch_add_u64(&caches->generation, 1);
	LWLockRelease(caches->lock);
	return changed;
}

/* Once their prefixes are cleared: open the new slots, free the old. */
static void
finish_publish(const PcCacheChanges *ch)
{
	PcCaches   *caches = &pc_shared->caches;

	if (ch->nopening == 0 && ch->nclosing == 0)
		return;
	pc_lock_alone(caches->lock, LW_EXCLUSIVE);
	for (int i = 0; i < ch->nopening; i++)
		caches->slots[ch->opening[i]].open = true;
	for (int i = 0; i < ch->nclosing; i++)
	{
		PcCacheSlot *slot = &caches->slots[ch->closing[i]];

		slot->in_use = false;
		memset(&slot->reg, 0, sizeof(PcCacheReg));
	}
	pg_atomic_fetch_add_u64(&caches->generation, 1);
	LWLockRelease(caches->lock);
}

/* The prefix "name:" of a slot's keys, for the caller's eviction. */
static void
clear_prefix(int s, PcCacheEvictFn evict_prefix)
{
	char		prefix[NAMEDATALEN + 1];
	uint32		len;

	len = (uint32) strlcpy(prefix, pc_shared->caches.slots[s].reg.name,
						   NAMEDATALEN);
	prefix[len++] = ':';
	evict_prefix(prefix, len);
}

/*
 * Reload the registry into the slots (the worker).  A failure to read it
 * leaves the slots as they are, with a WARNING, and is retried at the next
 * poll.
 */
void
pc_caches_reload(int64 now_ms, PcCacheEvictFn evict_prefix)
{
	MemoryContext cxt = CurrentMemoryContext;
	PcCacheReg *regs = palloc0(sizeof(PcCacheReg) * PC_MAX_CACHES);
	PcCacheChanges ch;
	int			n = 0;

	/* Cleared first: a change committed during the read is read again. */
	pg_atomic_write_u32(&pc_shared->caches.changed, 0);
	last_reload_ms = now_ms;
	next_reload_ms = now_ms + PC_CACHES_POLL_MS;
	PG_TRY();
	{
		SetCurrentStatementStartTimestamp();
		StartTransactionCommand();
		PushActiveSnapshot(GetTransactionSnapshot());
		n = read_registry(regs);
		PopActiveSnapshot();
		CommitTransactionCommand();
	}
	PG_CATCH();
	{
		ErrorData  *edata;

		MemoryContextSwitchTo(cxt);
		edata = CopyErrorData();
		FlushErrorState();
		AbortCurrentTransaction();
		warn_once(psprintf("projcache could not read the named caches' registry: %s",
						   edata->message));
		FreeErrorData(edata);
		MemoryContextSwitchTo(cxt);
		pfree(regs);
		return;
	}
	PG_END_TRY();
	MemoryContextSwitchTo(cxt);
	if (publish(regs, n, &ch))
		elog(DEBUG1, "projcache: %d named caches registered", n);

	/*
	 * Only the worker writes the slots, so those closed above stay as they
	 * are while it clears their prefixes: a new cache of the values the
	 * default cache fetched, a dropped one of the values its own function
	 * fetched, which must not be read as the default cache's.
	 */
	for (int i = 0; i < ch.nopening; i++)
		clear_prefix(ch.opening[i], evict_prefix);
	for (int i = 0; i < ch.nclosing; i++)
		clear_prefix(ch.closing[i], evict_prefix);
	finish_publish(&ch);
	pfree(regs);
}

/* ----------------------------------------------------------------
 * The projcache.caches view
 * ----------------------------------------------------------------
 */

/* An interval Datum of ms, or NULL for a setting not set. */
static Datum
ms_interval(int64 ms, bool *isnull)
{
	Interval   *iv;

	*isnull = ms == PC_CACHE_SETTING_UNSET;
	if (*isnull)
		return (Datum) 0;
	iv = palloc0(sizeof(Interval));
	iv->time = ms * 1000;
	return IntervalPGetDatum(iv);
}

#define CACHES_COLS 18

/*
 * projcache.caches: one row for each named cache the current user may
 * read (pc_cache_may_read()); a NULL setting follows the server's.
 */
Datum
projcache_caches(PG_FUNCTION_ARGS)
{
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	PcCacheSlot *copy;
	int			n = 0;

	pc_require_loaded();
	InitMaterializedSRF(fcinfo, 0);

	copy = palloc(sizeof(PcCacheSlot) * PC_MAX_CACHES);
	pc_lock_alone(pc_shared->caches.lock, LW_SHARED);
	for (int s = 0; s < PC_MAX_CACHES; s++)
	{
		PcCacheSlot *slot = &pc_shared->caches.slots[s];

		if (!slot->in_use)
			continue;
		copy[n].reg = slot->reg;
		for (int c = 0; c < PC_CACHE_NUM_COUNTERS; c++)
			pg_atomic_init_u64(&copy[n].counters[c],
							   pg_atomic_read_u64(&slot->counters[c]));
		n++;
	}
	LWLockRelease(pc_shared->caches.lock);

	for (int i = 0; i < n; i++)
	{
		const PcCacheReg *reg = &copy[i].reg;
		Datum		values[CACHES_COLS];
		bool		nulls[CACHES_COLS] = {false};
		int			col = 0;

		if (!pc_cache_may_read(reg))
			continue;
		values[col++] = CStringGetTextDatum(reg->name);
		values[col++] = ObjectIdGetDatum(reg->owner);
		values[col++] = CStringGetTextDatum(reg->fetch_function);
		nulls[col] = !OidIsValid(reg->fetch_role);
		values[col++] = ObjectIdGetDatum(reg->fetch_role);
		values[col] = ms_interval(reg->expiry_ms, &nulls[col]);
		col++;
		values[col] = ms_interval(reg->grace_period_ms, &nulls[col]);
		col++;
		values[col] = ms_interval(reg->refresh_interval_ms, &nulls[col]);
		col++;
		values[col] = ms_interval(reg->max_retry_backoff_ms, &nulls[col]);
		col++;
		nulls[col] = reg->batch_size == PC_CACHE_SETTING_UNSET;
		values[col++] = Int32GetDatum((int32) reg->batch_size);
		values[col] = ms_interval(reg->fetch_timeout_ms, &nulls[col]);
		col++;
		nulls[col] = reg->max_memory == PC_CACHE_SETTING_UNSET;
		values[col++] = Int64GetDatum(reg->max_memory);
		values[col++] = Int64GetDatum((int64) pg_atomic_read_u64(&copy[i].counters[PC_CACHE_MEMORY_USED]));
		values[col++] = Int64GetDatum((int64) pg_atomic_read_u64(&copy[i].counters[PC_CACHE_ENTRIES]));
		values[col++] = Int64GetDatum((int64) pg_atomic_read_u64(&copy[i].counters[PC_CACHE_HITS]));
		values[col++] = Int64GetDatum((int64) pg_atomic_read_u64(&copy[i].counters[PC_CACHE_MISSES]));
		values[col++] = Int64GetDatum((int64) pg_atomic_read_u64(&copy[i].counters[PC_CACHE_FETCH_CALLS]));
		values[col++] = Int64GetDatum((int64) pg_atomic_read_u64(&copy[i].counters[PC_CACHE_FETCH_ERRORS]));
		values[col++] = Int64GetDatum((int64) pg_atomic_read_u64(&copy[i].counters[PC_CACHE_EVICTIONS]));
		Assert(col == CACHES_COLS);
		tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, values,
							 nulls);
	}
	return (Datum) 0;
}
