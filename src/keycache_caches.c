/*-------------------------------------------------------------------------
 *
 * keycache_caches.c
 *	  The named caches as every backend sees them: the copy of the
 *	  registry in shared memory, and how the key cache's worker keeps it.
 *	  Which cache a key is of and who may read it are in
 *	  keycache_cache_access.c, the roles DROP ROLE must leave alone in
 *	  keycache_role_guard.c, the projcache.caches view in
 *	  keycache_caches_view.c.
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
 * A cache is bound to its fetch function's identity, not to its name: the
 * worker binds each row to the function it was registered with
 * (bind_function()), and a cache whose function cannot be bound is put
 * aside, its keys' fetches failing with the reason, until its owner
 * alters it.
 *
 * Rights are narrowed at the commit that narrows them: a backend whose
 * revoke_cache or drop_cache commits edits the slots itself
 * (pc_caches_narrow_at_commit()), without waiting for the worker; a
 * reload that read the registry before that commit is not published.
 *
 * Lock: PcCaches.lock protects the slots' registrations (the worker
 * writes them exclusively, and so does a committing narrowing; readers
 * copy them shared, and take nothing else while they hold it).  The
 * counters are atomics.  The overrun entries are the worker's alone, but
 * for the atomic count a signal handler adds to.
 *
 * Copyright (c) 2026, projcache developers
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "catalog/dependency.h"
#include "catalog/namespace.h"
#include "catalog/pg_proc.h"
#include "common/int.h"
#include "commands/extension.h"
#include "executor/spi.h"
#include "funcapi.h"
#include "miscadmin.h"
#include "utils/array.h"
#include "utils/builtins.h"
#include "utils/lsyscache.h"
#include "utils/regproc.h"
#include "utils/snapmgr.h"
#include "utils/syscache.h"

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

/* The worker's next reload and its last, on pc_real_now_ms(). */
static int64 next_reload_ms = 0;
static int64 last_reload_ms = 0;

/* The named caches' part of shared memory ("projcache caches"). */
PcCaches   *pc_caches_shared = NULL;

#define PC_CACHES_TRANCHE	"projcache_caches"

void
pc_caches_shmem_request(void)
{
	RequestAddinShmemSpace(MAXALIGN(sizeof(PcCaches)));
	pc_locks_request(PC_CACHES_TRANCHE, 1);
}

void
pc_caches_shmem_startup(void)
{
	bool		found;
	LWLockPadded *lock;
	PcCaches   *caches;

	caches = ShmemInitStruct("projcache caches", sizeof(PcCaches), &found);
	lock = pc_locks_get(PC_CACHES_TRANCHE, 1, PC_LOCK_ALONE);
	pc_caches_shared = caches;
	if (found)
		return;
	memset(caches, 0, sizeof(PcCaches));
	caches->lock = &lock->lock;
	pg_atomic_init_u32(&caches->changed, 0);
	pg_atomic_init_u64(&caches->generation, 0);
	pg_atomic_init_u64(&caches->narrowings, 0);
	pg_atomic_init_u64(&caches->reloads_started, 0);
	pg_atomic_init_u64(&caches->published_reload, 0);
	for (int i = 0; i < PC_MAX_CACHES; i++)
		for (int c = 0; c < PC_CACHE_NUM_COUNTERS; c++)
			pg_atomic_init_u64(&caches->slots[i].counters[c], 0);
	for (int i = 0; i < PC_MAX_CACHE_OVERRUNS; i++)
		pg_atomic_init_u32(&caches->overruns[i].overruns, 0);
}

/* Cache slot s, for the worker's eviction by cache. */
PcCacheSlot *
pc_cache_slot(int s)
{
	Assert(s >= 0 && s < PC_MAX_CACHES);
	return &pc_caches_shared->slots[s];
}

/* A change to the registry committed: the worker reloads it now. */
void
pc_caches_changed(void)
{
	pg_atomic_write_u32(&pc_caches_shared->changed, 1);
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


/* ----------------------------------------------------------------
 * Narrowing at commit
 *
 * A revoke_cache or drop_cache is obeyed from its commit on, in every
 * database, whether a worker runs or not: the committing backend narrows
 * the published slot itself (keycache_registry.c calls this from its
 * commit callback).  A drop closes the slot, so that its keys read as
 * pending and are not created; a revoke takes the reader off the slot's
 * list.  The worker's next reload (which the same commit asks for) then
 * publishes what the registry says, and a reload that read the registry
 * before this commit publishes nothing (publish()).
 *
 * It runs after the commit is recorded, where an ERROR would be a PANIC:
 * it only takes the lock and edits the slot.
 * ----------------------------------------------------------------
 */
void
pc_caches_narrow_at_commit(const char *name, bool drop, Oid reader)
{
	PcCaches   *caches = pc_caches_shared;

	pc_lock_alone(caches->lock, LW_EXCLUSIVE);
	for (int s = 0; s < PC_MAX_CACHES; s++)
	{
		PcCacheSlot *slot = &caches->slots[s];
		PcCacheReg *reg = &slot->reg;

		if (!slot->in_use || strcmp(reg->name, name) != 0)
			continue;
		if (drop)
			slot->open = false;
		else
		{
			int			kept = 0;

			for (int i = 0; i < reg->nreaders; i++)
				if (reg->readers[i] != reader)
					reg->readers[kept++] = reg->readers[i];
			reg->nreaders = kept;
		}
	}
	pg_atomic_fetch_add_u64(&caches->narrowings, 1);
	pg_atomic_fetch_add_u64(&caches->generation, 1);
	LWLockRelease(caches->lock);
}

/* ----------------------------------------------------------------
 * Overruns: calls that outlived their timeout, by owner and function
 * ----------------------------------------------------------------
 */

/*
 * A call of the cache's function outlived its timeout, and the worker ends
 * (keycache_fetch.c): called in a signal handler, so only an atomic.
 * entry: from pc_cache_overrun_entry(), before the call.
 */
void
pc_cache_note_overrun(int entry)
{
	pg_atomic_fetch_add_u32(&pc_caches_shared->overruns[entry].overruns, 1);
}

/*
 * The entry of an owner, or -1.  Kept by owner alone, not by function:
 * an owner who drops the function and makes it again (a new OID), or
 * makes another, must not start the count over.
 */
static int
find_overrun_entry(Oid owner)
{
	PcCacheOverrun *o = pc_caches_shared->overruns;

	for (int i = 0; i < PC_MAX_CACHE_OVERRUNS; i++)
		if (o[i].owner == owner && OidIsValid(owner))
			return i;
	return -1;
}

/* Does an owner own a published cache? */
static bool
overrun_entry_in_use(const PcCacheOverrun *o)
{
	const PcCacheSlot *slots = pc_caches_shared->slots;

	for (int s = 0; s < PC_MAX_CACHES; s++)
		if (slots[s].in_use && slots[s].reg.owner == o->owner)
			return true;
	return false;
}

/*
 * The entry that counts the overruns of the cache owner's functions, made
 * if there is none (the worker, before each call that can overrun).  There
 * is always one to take: a free entry, else the one whose pause ended
 * first among those of owners of no published cache (at most
 * PC_MAX_CACHES entries are in use, of twice as many).  A pause still
 * running is forgotten only when every other entry is in use or paused
 * longer.
 */
int
pc_cache_overrun_entry(const PcCacheReg *reg)
{
	PcCacheOverrun *o = pc_caches_shared->overruns;
	int			i = find_overrun_entry(reg->owner);
	int			victim = -1;

	if (i >= 0)
		return i;
	for (i = 0; i < PC_MAX_CACHE_OVERRUNS; i++)
	{
		if (!OidIsValid(o[i].owner))
		{
			victim = i;
			break;
		}
		if (overrun_entry_in_use(&o[i]))
			continue;
		if (victim < 0 || o[i].paused_until_ms < o[victim].paused_until_ms)
			victim = i;
	}
	Assert(victim >= 0);
	o[victim].owner = reg->owner;
	o[victim].function = reg->function;
	pg_atomic_write_u32(&o[victim].overruns, 0);
	o[victim].overruns_seen = 0;
	o[victim].paused_until_ms = 0;
	return victim;
}

/*
 * How many ms a cache's keys stay put aside, because a function of its
 * owner's outlived its timeout and ended the worker before this one: PC_OVERRUN_PAUSE_MS
 * for the first overrun, twice as long for each next one, at most
 * PC_OVERRUN_PAUSE_MAX_MS, so that a function that will not stop costs
 * every other cache a restart of the worker that often at most.  0: none.
 * The worker's; a new overrun is told in a WARNING once.
 */
#define PC_OVERRUN_PAUSE_MS		(30 * 1000)
#define PC_OVERRUN_PAUSE_MAX_MS	(30 * 60 * 1000)

int64
pc_cache_paused_ms(const PcCacheReg *reg, int64 now_ms)
{
	int			i = find_overrun_entry(reg->owner);
	PcCacheOverrun *o;
	uint32		overruns;

	if (i < 0)
		return 0;
	o = &pc_caches_shared->overruns[i];
	overruns = pg_atomic_read_u32(&o->overruns);
	if (overruns != o->overruns_seen)
	{
		int64		pause = PC_OVERRUN_PAUSE_MS;

		for (uint32 n = 1; n < overruns && pause < PC_OVERRUN_PAUSE_MAX_MS; n++)
			pause *= 2;
		pause = Min(pause, PC_OVERRUN_PAUSE_MAX_MS);
		o->overruns_seen = overruns;
		o->paused_until_ms = now_ms + pause;
		ereport(WARNING,
				(errmsg("named cache \"%s\": its fetch function ran past its fetch_timeout and did not stop when cancelled",
						reg->name),
				 errdetail("The scheduler ended itself to stop it (%u times so far); the keys of every cache of this owner are not fetched for %lld s.",
						   overruns, (long long) (pause / 1000)),
				 errhint("A fetch function must not catch query_canceled.")));
	}
	return o->paused_until_ms > now_ms ? o->paused_until_ms - now_ms : 0;
}

/* Count n for a named cache's counter (a slot, or PC_CACHE_DEFAULT: none). */
void
pc_cache_count(int slot, PcCacheCounter counter, uint64 n)
{
	if (slot >= 0)
		pg_atomic_fetch_add_u64(&pc_caches_shared->slots[slot].counters[counter], n);
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

	if (pg_atomic_read_u32(&pc_caches_shared->changed) != 0)
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

/* The registry's table in this database, if it is projcache's own. */
Oid
pc_caches_registry_relid(void)
{
	return pc_extension_table("cache_registry");
}

/*
 * Is the function 'fn' the one a cache was registered with: it has that
 * qualified signature, and its owner has that name?  Sets *owner.  With
 * no owner name (a registry still at 1.3 names none), its owner must be
 * the cache's owner, cache_owner, or a superuser: no other role's function
 * is taken for it.
 */
static bool
function_is(Oid fn, const char *signature, const char *owner_name,
			Oid cache_owner, Oid *owner)
{
	HeapTuple	tup;
	char	   *name;

	if (!OidIsValid(fn))
		return false;
	tup = SearchSysCache1(PROCOID, ObjectIdGetDatum(fn));
	if (!HeapTupleIsValid(tup))
		return false;
	*owner = ((Form_pg_proc) GETSTRUCT(tup))->proowner;
	ReleaseSysCache(tup);
	if (strcmp(format_procedure_qualified(fn), signature) != 0)
		return false;
	if (owner_name == NULL)
		return *owner == cache_owner || superuser_arg(*owner);
	name = GetUserNameFromId(*owner, true);
	return name != NULL && strcmp(name, owner_name) == 0;
}

/* The function a qualified signature names, or InvalidOid. */
static Oid
signature_function(const char *signature)
{
	LOCAL_FCINFO(fcinfo, 1);
	Datum		d;

	InitFunctionCallInfoData(*fcinfo, NULL, 1, InvalidOid, NULL, NULL);
	fcinfo->args[0].value = CStringGetTextDatum(signature);
	fcinfo->args[0].isnull = false;
	d = to_regprocedure(fcinfo);
	return fcinfo->isnull ? InvalidOid : DatumGetObjectId(d);
}

/*
 * Bind a cache to the function it was registered with: the function of
 * its stored OID, if that one still has its signature and its owner's
 * name; else (after a dump or pg_upgrade, where OIDs change) the function
 * its signature names, if its owner has that name.  A function another
 * role put under that name is not the one, nor is the registered function
 * renamed, moved or given away: the cache is then bound to none, and
 * reg->bind_error says why.  owner_name NULL: a registry still at 1.3,
 * which names no function owner (function_is()).  Reads the catalogs
 * only; no user code runs.
 */
static void
bind_function(PcCacheReg *reg, Oid stored_oid, const char *owner_name)
{
	Oid			fn;
	Oid			owner = InvalidOid;
	bool		found;
	char	   *other;

	reg->function = InvalidOid;
	reg->function_owner = InvalidOid;
	reg->bind_error[0] = '\0';
	fn = stored_oid;
	found = function_is(fn, reg->fetch_function, owner_name, reg->owner,
						&owner);
	if (!found)
	{
		fn = signature_function(reg->fetch_function);
		found = function_is(fn, reg->fetch_function, owner_name, reg->owner,
							&owner);
	}
	if (found)
	{
		/* Its owner may have made it anew, returning one row. */
		if (!pc_fetch_function_shape_ok(fn))
		{
			snprintf(reg->bind_error, PC_CACHE_ERROR_LEN,
					 "named cache \"%s\" is put aside: function %s is not a fetch function (it must return a set of rows)",
					 reg->name, reg->fetch_function);
			return;
		}
		reg->function = fn;
		reg->function_owner = owner;
		return;
	}
	if (owner_name == NULL)
		owner_name = GetUserNameFromId(reg->owner, true);
	if (owner_name == NULL)
		owner_name = "?";
	other = OidIsValid(fn) ? GetUserNameFromId(owner, true) : NULL;
	if (OidIsValid(fn) &&
		strcmp(format_procedure_qualified(fn), reg->fetch_function) == 0)
		snprintf(reg->bind_error, PC_CACHE_ERROR_LEN,
				 "named cache \"%s\" is put aside: function %s is owned by role \"%s\", not by role \"%s\" as the function the cache was registered with",
				 reg->name, reg->fetch_function, other ? other : "?",
				 owner_name);
	else
		snprintf(reg->bind_error, PC_CACHE_ERROR_LEN,
				 "named cache \"%s\" is put aside: the function it was registered with, %s of role \"%s\", was dropped, renamed or moved",
				 reg->name, reg->fetch_function, owner_name);
}

/*
 * The function a registry row binds its cache to (as bind_function()), or
 * InvalidOid: for alter_cache's checks (keycache_registry.c).
 */
Oid
pc_cache_bound_function(const char *signature, Oid stored_oid,
						const char *owner_name, Oid cache_owner)
{
	PcCacheReg *reg = palloc0(sizeof(PcCacheReg));
	Oid			fn;

	strlcpy(reg->fetch_function, signature, PC_CACHE_FUNCTION_LEN);
	reg->owner = cache_owner;
	bind_function(reg, stored_oid, owner_name);
	fn = reg->function;
	pfree(reg);
	return fn;
}

/* The registry's columns, as pc_caches_read_registry() selects them. */
enum
{
	REG_NAME = 1,
	REG_OWNER,
	REG_FETCH_FUNCTION,
	REG_FETCH_ROLE,
	REG_EXPIRY,
	REG_GRACE_PERIOD,
	REG_REFRESH_INTERVAL,
	REG_MAX_RETRY_BACKOFF,
	REG_BATCH_SIZE,
	REG_FETCH_TIMEOUT,
	REG_MAX_MEMORY,
	REG_READERS,
	REG_CREATED_AT,
	REG_FUNCTION_OID,
	REG_FUNCTION_OWNER
};

/* One row's registration; false (and a reason) if it cannot be one. */
static bool
read_row(HeapTuple tup, TupleDesc desc, PcCacheReg *reg, const char **why)
{
	char	   *name = SPI_getvalue(tup, desc, REG_NAME);
	char	   *function = SPI_getvalue(tup, desc, REG_FETCH_FUNCTION);
	char	   *function_owner;
	bool		isnull;
	Datum		d;
	Datum	   *readers;
	bool	   *nulls;
	int			nreaders;
	Oid			stored_oid;

	if (name == NULL || function == NULL || strlen(name) >= NAMEDATALEN ||
		strlen(function) >= PC_CACHE_FUNCTION_LEN)
	{
		*why = "a NULL or overlong name or fetch function";
		return false;
	}
	strlcpy(reg->name, name, NAMEDATALEN);
	strlcpy(reg->fetch_function, function, PC_CACHE_FUNCTION_LEN);
	d = SPI_getbinval(tup, desc, REG_OWNER, &isnull);
	if (isnull)
	{
		*why = "a NULL owner";
		return false;
	}
	reg->owner = DatumGetObjectId(d);
	reg->owner_is_superuser = superuser_arg(reg->owner);
	d = SPI_getbinval(tup, desc, REG_FETCH_ROLE, &isnull);
	reg->fetch_role = isnull ? InvalidOid : DatumGetObjectId(d);
	reg->expiry_ms = column_ms(tup, desc, REG_EXPIRY);
	reg->grace_period_ms = column_ms(tup, desc, REG_GRACE_PERIOD);
	reg->refresh_interval_ms = column_ms(tup, desc, REG_REFRESH_INTERVAL);
	reg->max_retry_backoff_ms = column_ms(tup, desc, REG_MAX_RETRY_BACKOFF);
	reg->batch_size = column_int(tup, desc, REG_BATCH_SIZE, false);
	reg->fetch_timeout_ms = column_ms(tup, desc, REG_FETCH_TIMEOUT);
	reg->max_memory = column_int(tup, desc, REG_MAX_MEMORY, true);
	d = SPI_getbinval(tup, desc, REG_READERS, &isnull);
	if (!isnull)
	{
		deconstruct_array(DatumGetArrayTypeP(d), OIDOID, sizeof(Oid), true,
						  TYPALIGN_INT, &readers, &nulls, &nreaders);
		for (int i = 0; i < nreaders && reg->nreaders < PC_MAX_CACHE_READERS; i++)
			if (!nulls[i])
				reg->readers[reg->nreaders++] = DatumGetObjectId(readers[i]);
	}
	d = SPI_getbinval(tup, desc, REG_CREATED_AT, &isnull);
	reg->created_at = isnull ? 0 : DatumGetTimestampTz(d);

	/*
	 * A registry still at 1.3 names the function by its signature only: bind
	 * it to the function of that signature its cache's owner or a superuser
	 * owns (bind_function() with no owner name).
	 */
	d = SPI_getbinval(tup, desc, REG_FUNCTION_OID, &isnull);
	stored_oid = isnull ? InvalidOid : DatumGetObjectId(d);
	function_owner = SPI_getvalue(tup, desc, REG_FUNCTION_OWNER);
	bind_function(reg, stored_oid, function_owner);
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
 * Read the registry's rows into regs (zeroed, PC_MAX_CACHES of them), in
 * the caller's transaction and snapshot; returns how many.  No table of
 * ours (projcache not yet updated to 1.3 in this database, or not there):
 * -1.  The worker (for_worker) gives up on a lock it would wait for, and
 * hears of rows it cannot publish; the projcache.caches view does neither.
 */
int
pc_caches_read_registry(PcCacheReg *regs, bool for_worker)
{
	Oid			relid = pc_caches_registry_relid();
	PcUserSwitch rs;
	int			n = 0;
	char	   *problem = NULL;
	bool		bound;

	if (!OidIsValid(relid))
		return -1;
	/* A registry at 1.3 has no binding columns (projcache--1.3--1.3.1.sql). */
	bound = get_attnum(relid, "fetch_function_oid") != InvalidAttrNumber &&
		get_attnum(relid, "fetch_function_owner") != InvalidAttrNumber;
	pc_become_extension(&rs);
	if (SPI_connect() != SPI_OK_CONNECT)
		elog(ERROR, "SPI_connect failed");

	/*
	 * A lock queued on the table (a VACUUM FULL behind a transaction that
	 * changed it) must not stop the worker: this reload gives up, and the
	 * next poll tries again.
	 */
	if (for_worker &&
		SPI_execute("SET LOCAL lock_timeout = 200", false, 0) != SPI_OK_UTILITY)
		elog(ERROR, "could not set lock_timeout");
	if (SPI_execute(bound ?
					"SELECT name, owner::pg_catalog.oid, fetch_function,"
					" fetch_role::pg_catalog.oid, expiry, grace_period,"
					" refresh_interval, max_retry_backoff, batch_size,"
					" fetch_timeout, max_memory,"
					" readers::pg_catalog.oid[], created_at,"
					" fetch_function_oid, fetch_function_owner"
					" FROM projcache.cache_registry ORDER BY name" :
					"SELECT name, owner::pg_catalog.oid, fetch_function,"
					" fetch_role::pg_catalog.oid, expiry, grace_period,"
					" refresh_interval, max_retry_backoff, batch_size,"
					" fetch_timeout, max_memory,"
					" readers::pg_catalog.oid[], created_at,"
					" NULL::pg_catalog.oid AS fetch_function_oid,"
					" NULL::pg_catalog.name AS fetch_function_owner"
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
	if (problem != NULL && for_worker)
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
	bool		published;		/* not given up for a narrowing */
} PcCacheChanges;

/*
 * Make the slots say what regs (n of them) say: a cache still registered
 * keeps its slot and counters; one gone is closed, and a new one takes a
 * free slot closed, with counters at zero.  A closed cache's keys read as
 * pending and are not created (pc_cache_of()).  The caller then clears
 * the map of their prefixes and calls finish_publish().  At the first
 * publication since the server started, new caches open at once: until
 * then no key of a prefix that could be a cache's was created, and the
 * dump brings back only the keys dumped for the very cache they are of
 * (pc_key_restorable()).  Returns whether anything changed.  Nothing is
 * published if a narrowing committed after 'narrowings' was read, before
 * the registry was (ch->published says so).
 */
static bool
publish(const PcCacheReg *regs, int n, uint64 narrowings,
		PcCacheChanges *ch)
{
	PcCaches   *caches = pc_caches_shared;
	bool		changed = false;
	bool		kept[PC_MAX_CACHES] = {false};
	bool		first;

	ch->nopening = ch->nclosing = 0;
	ch->published = false;
	pc_lock_alone(caches->lock, LW_EXCLUSIVE);

	/*
	 * A revoke or drop committed since the registry was read, and narrowed
	 * the slots already: what was read would widen them again.  Read again
	 * instead, at once.
	 */
	if (pg_atomic_read_u64(&caches->narrowings) != narrowings)
	{
		LWLockRelease(caches->lock);
		pg_atomic_write_u32(&caches->changed, 1);
		return false;
	}
	first = !caches->loaded;
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
		slot->reg = regs[r];
		slot->in_use = true;
		slot->gen = (slot->gen + 1) & PC_CACHE_ID_GEN_MASK;
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
	ch->published = true;
	LWLockRelease(caches->lock);
	return changed;
}

/* Once their prefixes are cleared: open the new slots, free the old. */
static void
finish_publish(const PcCacheChanges *ch)
{
	PcCaches   *caches = pc_caches_shared;

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

	len = (uint32) strlcpy(prefix, pc_caches_shared->slots[s].reg.name,
						   NAMEDATALEN);
	prefix[len++] = ':';
	evict_prefix(prefix, len);
}

/*
 * A WARNING for each cache the worker could not bind to its function,
 * when it was not put aside for that reason already: told once, while it
 * lasts.  Before publish(), which the slots' old state is compared with.
 */
static void
warn_put_aside(const PcCacheReg *regs, int n)
{
	PcCaches   *caches = pc_caches_shared;
	bool		told[PC_MAX_CACHES];

	pc_lock_alone(caches->lock, LW_SHARED);
	for (int r = 0; r < n; r++)
	{
		told[r] = false;
		for (int s = 0; s < PC_MAX_CACHES; s++)
			if (caches->slots[s].in_use &&
				strcmp(caches->slots[s].reg.name, regs[r].name) == 0 &&
				strcmp(caches->slots[s].reg.bind_error, regs[r].bind_error) == 0)
				told[r] = true;
	}
	LWLockRelease(caches->lock);
	for (int r = 0; r < n; r++)
		if (!told[r] && regs[r].bind_error[0] != '\0')
			ereport(WARNING,
					(errmsg("%s", regs[r].bind_error),
					 errdetail("A named cache runs only the function it was registered with; its keys are not fetched meanwhile."),
					 errhint("The cache's owner can bind it to a function with projcache.alter_cache(name, fetch_function => ...).")));
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
	uint64		narrowings;
	uint64		reload;

	/*
	 * Counted, then cleared; cleared first of all else, so that a change
	 * committed during the read is read again.  A change committed before the
	 * count is read by this reload (pc_caches_commit_named()).
	 */
	reload = pg_atomic_add_fetch_u64(&pc_caches_shared->reloads_started, 1);
	pg_atomic_write_u32(&pc_caches_shared->changed, 0);
	/* Read before the registry's snapshot is taken (see publish()). */
	narrowings = pg_atomic_read_u64(&pc_caches_shared->narrowings);
	last_reload_ms = now_ms;
	next_reload_ms = now_ms + PC_CACHES_POLL_MS;
	PG_TRY();
	{
		SetCurrentStatementStartTimestamp();
		StartTransactionCommand();
		PushActiveSnapshot(GetTransactionSnapshot());
		n = Max(pc_caches_read_registry(regs, true), 0);
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
	warn_put_aside(regs, n);
	if (publish(regs, n, narrowings, &ch))
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
	/* Frees the named-role entries of changes this reload read. */
	if (ch.published)
		pg_atomic_write_u64(&pc_caches_shared->published_reload, reload);
	pfree(regs);
}
