/*-------------------------------------------------------------------------
 *
 * snapshot_regcache.c
 *	  Each backend's cache of registrations and of who may read them, for
 *	  the readers of snapshots (projcache.snapshot() and the foreign
 *	  tables).
 *
 * What is cached is what pc_registry_lookup() (snapshot_registry.c) and
 * pc_snap_check_reader() give; what keeps it right is described under "The
 * readers' cache of registrations" below.  Nothing here runs SQL: a miss
 * asks the registry.
 *
 * Copyright (c) 2026, projcache developers
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "catalog/pg_authid.h"
#include "miscadmin.h"
#include "port/atomics.h"
#include "utils/hsearch.h"
#include "utils/inval.h"
#include "utils/memutils.h"
#include "utils/syscache.h"

#include "snapshot.h"
#include "snapshot_registry.h"

/* ----------------------------------------------------------------
 * The readers' cache of registrations
 *
 * Each projcache.snapshot() call needs its registration and the verdict
 * "may the current user read it".  Asking the registry (an SPI query as
 * the bootstrap superuser) and has_privs_of_role() for each reader every
 * time costs more than serving a small snapshot, so each backend keeps
 * both: the registration by name, and the users it found allowed to read
 * it.  What an entry depends on, and what drops it:
 *
 *	 - The registry row.  Rows change by DML, which sends no invalidation,
 *	   so every function that changes the registry marks its transaction
 *	   (pc_registry_changed), and such a transaction bumps
 *	   the snapshot slots' registry_generation once it has committed.  A read that
 *	   finds the generation moved drops the whole cache.  The generation is
 *	   read before the registry is, so an entry read from a state older
 *	   than a commit carries the generation before that commit's bump, and
 *	   goes at the next read.  A transaction that changed the registry
 *	   neither uses nor fills the cache: what it sees is not committed, and
 *	   may be rolled back, also to a savepoint.  It drops the cache when it
 *	   changes the registry and when it ends.  If it wrote, it also sends
 *	   a relcache invalidation of the registry, which reaches the backends
 *	   the generation cannot: those of standbys, which replay it with the
 *	   commit, and, for a prepared transaction, COMMIT PREPARED delivers it.
 *	 - The owner, the owner of the backing view: a relcache invalidation of
 *	   the view (ALTER VIEW OWNER, REASSIGN OWNED, DROP ... CASCADE) drops
 *	   the entry.
 *	 - The verdicts: role memberships and role attributes (superuser,
 *	   inherit).  Any pg_auth_members or pg_authid invalidation forgets all
 *	   verdicts.  They are kept per user id (GetUserId()), so SET ROLE and
 *	   SECURITY DEFINER functions are checked for their own user.
 *	 - The registry's shape: a relcache invalidation of the registry table
 *	   (ALTER EXTENSION UPDATE's ALTER TABLE, DROP EXTENSION) or of every
 *	   relation (InvalidOid, after an invalidation queue overflow) drops
 *	   everything.  The registry's layout (pc_registry_has_views) goes on
 *	   the same invalidations, in snapshot_registry.c.
 *
 * Each read takes in pending invalidations first (AcceptInvalidationMessages),
 * so what another backend committed is seen by the next read, as when each
 * read asked the registry.  "Not found" is never cached: a registration
 * that pg_restore inserts directly is found at once.  An UPDATE or DELETE
 * of projcache.snapshot_registry by hand is not seen by the caches of other
 * backends until their next invalidation.
 *
 * Callbacks only set flags: entries are freed at the start of a read, never
 * under a caller.  An entry or verdict is stored only if no invalidation
 * came in while it was worked out (catalog reads take invalidations in);
 * otherwise the next read works it out again.  Callers get a copy in their
 * own memory context, which outlives any later drop of the entry.
 * ----------------------------------------------------------------
 */

/* Users found allowed to read one registration, at most this many. */
#define REGCACHE_VERDICTS	8

typedef struct RegCacheEntry
{
	char		name[NAMEDATALEN];	/* hash key */
	bool		valid;			/* false once an invalidation hit it */
	SnapReg    *reg;			/* one chunk in regcache_cxt */
	Size		reg_size;
	uint64		verdict_epoch;	/* allowed[] holds while this is current */
	int			nallowed;
	int			next_allowed;	/* the slot to reuse once all are taken */
	Oid			allowed[REGCACHE_VERDICTS];
} RegCacheEntry;

static MemoryContext regcache_cxt = NULL;	/* under CacheMemoryContext */
static HTAB *regcache = NULL;	/* in regcache_cxt */
static bool regcache_callbacks_set = false;
static bool regcache_reset_pending = false;
static uint64 regcache_generation = 0;	/* the registry_generation read */
static uint64 regcache_verdict_epoch = 0;

/* Bumped by every invalidation callback of the readers' cache. */
static uint64 regcache_invals = 0;

/*
 * A relcache invalidation: of the registry, or of all relations, drops
 * everything; of a backing view, that snapshot's entry.
 */
static void
regcache_relcache_cb(Datum arg, Oid relid)
{
	Oid			registry_relid = pc_registry_known_relid();

	regcache_invals++;
	if (!OidIsValid(relid) || relid == registry_relid)
		regcache_reset_pending = true;
	else if (regcache != NULL)
	{
		HASH_SEQ_STATUS seq;
		RegCacheEntry *e;

		hash_seq_init(&seq, regcache);
		while ((e = (RegCacheEntry *) hash_seq_search(&seq)) != NULL)
			if (e->reg->view == relid)
				e->valid = false;
	}
}

/* A role or a role membership changed: forget every verdict. */
static void
regcache_role_cb(Datum arg, int cacheid, uint32 hashvalue)
{
	regcache_invals++;
	regcache_verdict_epoch++;
}

static void
regcache_set_callbacks(void)
{
	if (regcache_callbacks_set)
		return;
	CacheRegisterRelcacheCallback(regcache_relcache_cb, (Datum) 0);
	CacheRegisterSyscacheCallback(AUTHMEMROLEMEM, regcache_role_cb, (Datum) 0);
	CacheRegisterSyscacheCallback(AUTHOID, regcache_role_cb, (Datum) 0);
	regcache_callbacks_set = true;
}

/*
 * Drop the whole cache at the next read: the current transaction changes
 * the registry, or ended after it did (snapshot_xact.c).
 */
void
pc_regcache_reset_soon(void)
{
	regcache_reset_pending = true;
}

static void
regcache_reset(void)
{
	if (regcache_cxt != NULL)
		MemoryContextReset(regcache_cxt);
	regcache = NULL;
	regcache_reset_pending = false;
}

static HTAB *
regcache_table(void)
{
	if (regcache_cxt == NULL)
		regcache_cxt = AllocSetContextCreate(CacheMemoryContext,
											 "projcache registry cache",
											 ALLOCSET_SMALL_SIZES);
	if (regcache == NULL)
	{
		HASHCTL		ctl;

		ctl.keysize = NAMEDATALEN;
		ctl.entrysize = sizeof(RegCacheEntry);
		ctl.hcxt = regcache_cxt;
		regcache = hash_create("projcache registry cache", 16, &ctl,
							   HASH_ELEM | HASH_STRINGS | HASH_CONTEXT);
	}
	return regcache;
}

/*
 * A SnapReg and all it points to, copied into one chunk of cxt: one pfree
 * frees it, one memcpy copies it (snapreg_copy).
 */
static SnapReg *
snapreg_flatten(MemoryContext cxt, const SnapReg *src, Size *size)
{
	Size		len;
	SnapReg    *dst;
	char	   *p;
	int			i;

	len = MAXALIGN(sizeof(SnapReg)) +
		MAXALIGN(Max(src->natts, 1) * sizeof(char *)) +
		MAXALIGN(Max(src->natts, 1) * sizeof(Oid)) +
		MAXALIGN(Max(src->nreaders, 1) * sizeof(Oid)) +
		strlen(src->name) + 1 + strlen(src->query) + 1;
	for (i = 0; i < src->natts; i++)
		len += strlen(src->colnames[i]) + 1;
	if (src->bind_error != NULL)
		len += strlen(src->bind_error) + 1;

	dst = (SnapReg *) MemoryContextAlloc(cxt, len);
	memcpy(dst, src, sizeof(SnapReg));
	p = (char *) dst + MAXALIGN(sizeof(SnapReg));
	dst->colnames = (char **) p;
	p += MAXALIGN(Max(src->natts, 1) * sizeof(char *));
	dst->coltypes = (Oid *) p;
	memcpy(dst->coltypes, src->coltypes, src->natts * sizeof(Oid));
	p += MAXALIGN(Max(src->natts, 1) * sizeof(Oid));
	dst->readers = (Oid *) p;
	memcpy(dst->readers, src->readers, src->nreaders * sizeof(Oid));
	p += MAXALIGN(Max(src->nreaders, 1) * sizeof(Oid));
	dst->name = strcpy(p, src->name);
	p += strlen(p) + 1;
	dst->query = strcpy(p, src->query);
	p += strlen(p) + 1;
	for (i = 0; i < src->natts; i++)
	{
		dst->colnames[i] = strcpy(p, src->colnames[i]);
		p += strlen(p) + 1;
	}
	if (src->bind_error != NULL)
		dst->bind_error = strcpy(p, src->bind_error);
	*size = len;
	return dst;
}

/* The caller's own copy of a flattened SnapReg. */
static SnapReg *
snapreg_copy(const SnapReg *flat, Size size)
{
	char	   *copy = palloc(size);
	SnapReg    *reg = (SnapReg *) copy;
	int			i;

#define REBASE(ptr) (copy + ((const char *) (ptr) - (const char *) flat))
	memcpy(copy, flat, size);
	reg->colnames = (char **) REBASE(flat->colnames);
	for (i = 0; i < flat->natts; i++)
		reg->colnames[i] = REBASE(flat->colnames[i]);
	reg->coltypes = (Oid *) REBASE(flat->coltypes);
	reg->readers = (Oid *) REBASE(flat->readers);
	reg->name = REBASE(flat->name);
	reg->query = REBASE(flat->query);
	if (flat->bind_error != NULL)
		reg->bind_error = REBASE(flat->bind_error);
#undef REBASE
	reg->created_here = pc_snap_created_here(reg->id);
	return reg;
}

/* Cache a registration; nothing is left behind if this fails. */
static RegCacheEntry *
regcache_store(const SnapReg *reg)
{
	Size		size;
	SnapReg    *flat = snapreg_flatten(regcache_cxt, reg, &size);
	volatile Size flat_size = size; /* read after the PG_TRY */
	RegCacheEntry *e;
	bool		found;

	PG_TRY();
	{
		e = (RegCacheEntry *) hash_search(regcache, reg->name, HASH_ENTER,
										  &found);
	}
	PG_CATCH();
	{
		pfree(flat);
		PG_RE_THROW();
	}
	PG_END_TRY();
	if (found)
		pfree(e->reg);
	e->valid = true;
	e->reg = flat;
	e->reg_size = flat_size;
	e->verdict_epoch = regcache_verdict_epoch;
	e->nallowed = 0;
	e->next_allowed = 0;
	return e;
}

/*
 * The registration of a snapshot, as pc_registry_lookup() gives it, from
 * this backend's cache when it can (see above); *entry is its cache entry,
 * or NULL if it is not cached.  The result is the caller's, in its memory
 * context.
 */
static SnapReg *
regcache_lookup(const char *name, bool missing_ok, RegCacheEntry **entry)
{
	RegCacheEntry *e;
	SnapReg    *reg;
	uint64		generation;
	uint64		invals;

	*entry = NULL;

	/*
	 * A transaction that changed the registry reads it (and its own changes)
	 * every time.  A name too long for the cache's key is no snapshot's.
	 */
	if (pc_registry_changed_here() || !pc_loaded() ||
		strlen(name) >= NAMEDATALEN)
		return pc_registry_lookup(name, missing_ok);

	regcache_set_callbacks();
	AcceptInvalidationMessages();
	generation = pc_snap_registry_generation();
	if (regcache_reset_pending || generation != regcache_generation)
	{
		regcache_reset();
		regcache_generation = generation;
	}
	/* The generation is read before the registry: see above. */
	pg_read_barrier();
	invals = regcache_invals;

	e = (RegCacheEntry *) hash_search(regcache_table(), name, HASH_FIND, NULL);
	if (e != NULL && !e->valid)
	{
		pfree(e->reg);
		(void) hash_search(regcache, name, HASH_REMOVE, NULL);
		e = NULL;
	}
	if (e != NULL)
		reg = snapreg_copy(e->reg, e->reg_size);
	else
	{
		reg = pc_registry_lookup(name, missing_ok);
		if (reg == NULL)
			return NULL;
		if (regcache_invals == invals)
			e = regcache_store(reg);
	}
	*entry = e;
	return reg;
}

/*
 * The registration of a snapshot, whoever may read it: for the planner,
 * which estimates a scan before the reader is checked.  With missing_ok,
 * NULL if there is no such snapshot.
 */
SnapReg *
pc_registry_lookup_cached(const char *name, bool missing_ok)
{
	RegCacheEntry *e;

	return regcache_lookup(name, missing_ok, &e);
}

/*
 * The registration of a snapshot that the current user may read: what
 * pc_registry_lookup() and pc_snap_check_reader() give, with the same
 * errors, from this backend's cache when it can (see above).  With
 * missing_ok, NULL if there is no such snapshot.  The result is the
 * caller's, in its memory context.
 */
SnapReg *
pc_registry_lookup_for_read(const char *name, bool missing_ok)
{
	Oid			me = GetUserId();
	RegCacheEntry *e;
	SnapReg    *reg;
	uint64		invals;
	int			i;

	reg = regcache_lookup(name, missing_ok, &e);
	if (reg == NULL)
		return NULL;
	if (e != NULL && e->verdict_epoch == regcache_verdict_epoch)
	{
		for (i = 0; i < e->nallowed; i++)
			if (e->allowed[i] == me)
				return reg;
	}
	invals = regcache_invals;
	pc_snap_check_reader(reg);

	/*
	 * A view dropped while projcache was not loaded left its registration
	 * (see "Registrations whose view was dropped", snapshot_xact.c).  The
	 * cache drops an entry when its view goes, so only this path can meet
	 * one.
	 */
	if (OidIsValid(reg->view) &&
		!SearchSysCacheExists1(RELOID, ObjectIdGetDatum(reg->view)))
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("snapshot \"%s\" has lost its view", reg->name),
				 errdetail("An object its query depended on was dropped."),
				 errhint("Drop it with projcache.drop_snapshot() and create it again.")));
	/* Allowed; remember it unless an invalidation came in meanwhile. */
	if (e != NULL && regcache_invals == invals)
	{
		if (e->verdict_epoch != regcache_verdict_epoch)
		{
			e->verdict_epoch = regcache_verdict_epoch;
			e->nallowed = 0;
			e->next_allowed = 0;
		}
		if (e->nallowed < REGCACHE_VERDICTS)
			e->allowed[e->nallowed++] = me;
		else
		{
			e->allowed[e->next_allowed] = me;
			e->next_allowed = (e->next_allowed + 1) % REGCACHE_VERDICTS;
		}
	}
	return reg;
}
