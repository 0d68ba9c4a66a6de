/*-------------------------------------------------------------------------
 *
 * snapshot_registry.c
 *	  The snapshot registry: reading and changing registrations, each
 *	  backend's cache of them for readers, checking their arguments,
 *	  creating the view behind each snapshot, and what a transaction
 *	  registered or dropped.
 *
 * Registrations live in projcache.snapshot_registry, one table per
 * database, not readable by PUBLIC: it is read and written here as the
 * bootstrap superuser, and callers check the caller's own rights against
 * what it returns.  Each registration is backed by a view,
 * projcache.snapshot_<id>, owned by the snapshot's owner (see
 * pc_snap_create_view).  Reads go through a per-backend cache of
 * registrations and of who may read them, kept right by a shared
 * generation and catalog invalidations (see "The readers' cache").
 *
 * Copyright (c) 2026, projcache developers
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/detoast.h"
#include "access/htup_details.h"
#include "access/xact.h"
#include "catalog/dependency.h"
#include "catalog/namespace.h"
#include "catalog/objectaccess.h"
#include "catalog/pg_authid.h"
#include "catalog/pg_class.h"
#include "catalog/pg_extension.h"
#include "commands/comment.h"
#include "commands/extension.h"
#include "commands/tablecmds.h"
#include "commands/view.h"
#include "nodes/makefuncs.h"
#include "parser/analyze.h"
#include "parser/parse_relation.h"
#include "parser/parser.h"
#include "catalog/pg_type.h"
#include "common/int.h"
#include "executor/executor.h"
#include "executor/spi.h"
#include "funcapi.h"
#include "lib/stringinfo.h"
#include "miscadmin.h"
#include "nodes/nodeFuncs.h"
#include "nodes/parsenodes.h"
#include "port/atomics.h"
#include "storage/ipc.h"
#include "utils/acl.h"
#include "utils/array.h"
#include "utils/builtins.h"
#include "utils/datum.h"
#include "utils/guc.h"
#include "utils/hsearch.h"
#include "utils/inval.h"
#include "utils/lsyscache.h"
#include "utils/memutils.h"
#include "utils/plancache.h"
#include "utils/resowner.h"
#include "utils/snapmgr.h"
#include "utils/syscache.h"
#include "utils/timestamp.h"

#include "snapshot.h"

/* ----------------------------------------------------------------
 * Argument checks
 * ----------------------------------------------------------------
 */

char *
pc_snap_check_name(text *arg)
{
	char	   *name = text_to_cstring(arg);
	const char *p;

	if (name[0] == '\0' || strlen(name) >= NAMEDATALEN)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("invalid snapshot name \"%s\"", name),
				 errdetail("A snapshot name has 1 to %d characters.",
						   NAMEDATALEN - 1)));
	for (p = name; *p; p++)
	{
		if (!((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') ||
			  (*p >= '0' && *p <= '9') || *p == '_' || *p == '-' || *p == '.'))
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("invalid snapshot name \"%s\"", name),
					 errdetail("A snapshot name may contain only ASCII letters, digits, \"_\", \"-\" and \".\".")));
	}
	return name;
}

int64
pc_snap_check_ttl(Interval *ttl)
{
	int64		usecs;

	if (ttl->month != 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("snapshot ttl must not be given in months"),
				 errdetail("Months have no fixed length.")));
	if (pg_mul_s64_overflow((int64) ttl->day, USECS_PER_DAY, &usecs) ||
		pg_add_s64_overflow(usecs, ttl->time, &usecs))
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("snapshot ttl is out of range")));
	if (usecs < 1000)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("snapshot ttl must be at least 1 millisecond")));
	return usecs / 1000;
}

/* ----------------------------------------------------------------
 * The registry
 * ----------------------------------------------------------------
 */

static Oid *
oid_array(Datum d, int *n)
{
	ArrayType  *arr = DatumGetArrayTypeP(d);
	Datum	   *elems;
	bool	   *nulls;
	Oid		   *oids;
	int			i;

	deconstruct_array(arr, OIDOID, sizeof(Oid), true, TYPALIGN_INT,
					  &elems, &nulls, n);
	oids = palloc(Max(*n, 1) * sizeof(Oid));
	for (i = 0; i < *n; i++)
		oids[i] = DatumGetObjectId(elems[i]);
	return oids;
}

/* Registrations made by the current transaction (TopTransactionContext). */
static List *created_snapshots = NIL;

/* Did the current transaction change the registry?  See the readers' cache. */
static bool registry_changed = false;

static void register_xact_callback(void);
static void regcache_set_callbacks(void);

/* pc_registry_has_views()'s answer, until an invalidation (see below) */
static bool has_views_known = false;
static bool has_views;
static Oid	registry_relid = InvalidOid;	/* what it was computed for */

/* Bumped by every invalidation callback of the readers' cache (below). */
static uint64 regcache_invals = 0;

/*
 * Does this database's registry have the columns of the 1.0.1 SQL?  The
 * library also serves a database whose extension is still at 1.0.  The
 * answer is kept until a relcache invalidation of the registry (ALTER
 * EXTENSION UPDATE alters it), as the readers' cache below is.
 */
bool
pc_registry_has_views(void)
{
	uint64		invals;
	Oid			nsp;
	bool		answer;

	regcache_set_callbacks();
	if (has_views_known)
		return has_views;
	invals = regcache_invals;
	nsp = get_namespace_oid("projcache", true);
	registry_relid = OidIsValid(nsp) ?
		get_relname_relid("snapshot_registry", nsp) : InvalidOid;
	answer = OidIsValid(registry_relid) &&
		get_attnum(registry_relid, "view") != InvalidAttrNumber;
	/* An invalidation taken in meanwhile may have made it stale. */
	if (regcache_invals == invals)
	{
		has_views = answer;
		has_views_known = true;
	}
	return answer;
}

/* Planned once per backend, per registry shape: every snapshot() runs it. */
static SPIPlanPtr registry_lookup_plans[2];

static bool
created_by_this_xact(int64 id)
{
	ListCell   *lc;

	foreach(lc, created_snapshots)
		if (*(int64 *) lfirst(lc) == id)
			return true;
	return false;
}

/*
 * Read a registration.  The registry is not readable by PUBLIC, so this
 * runs as the bootstrap superuser; the caller's own rights are checked
 * against what it returns.  The owner is the backing view's owner.
 */
SnapReg *
pc_registry_lookup(const char *name, bool missing_ok)
{
	MemoryContext callercxt = CurrentMemoryContext;
	PcUserSwitch	rs;
	Oid			argtypes[1] = {TEXTOID};
	Datum		args[1];
	SnapReg    *reg = NULL;
	bool		with_views = pc_registry_has_views();
	int			ret;

	/* GetLatestSnapshot() below cannot be taken in parallel mode. */
	if (IsInParallelMode())
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_TRANSACTION_STATE),
				 errmsg("cannot read snapshot \"%s\" during a parallel operation",
						name),
				 errhint("A function that reads a snapshot must be marked PARALLEL UNSAFE.")));
	args[0] = CStringGetTextDatum(name);
	pc_become_extension(&rs);
	if (SPI_connect() != SPI_OK_CONNECT)
		elog(ERROR, "SPI_connect failed");
	if (registry_lookup_plans[with_views] == NULL)
	{
		SPIPlanPtr	plan;

		plan = SPI_prepare(with_views ?
						   "SELECT r.id, r.query,"
						   " (extract(epoch FROM r.ttl) * 1000)::int8,"
						   " COALESCE(c.relowner, r.owner::oid), r.column_names,"
						   " r.column_types::oid[], r.readers::oid[],"
						   " (extract(epoch FROM r.created_at) * 1000000)::int8,"
						   " r.view::oid, r.bind_error,"
		/* key_column is 1.1's: read it whether the column exists or not */
						   " pg_catalog.array_position(r.column_names,"
						   " pg_catalog.to_jsonb(r) OPERATOR(pg_catalog.->>)"
						   " 'key_column')"
						   " FROM projcache.snapshot_registry r"
						   " LEFT JOIN pg_catalog.pg_class c"
						   " ON c.oid OPERATOR(pg_catalog.=) r.view::oid"
						   " WHERE r.name OPERATOR(pg_catalog.=) $1" :
						   "SELECT id, query,"
						   " (extract(epoch FROM ttl) * 1000)::int8,"
						   " owner::oid, column_names,"
						   " column_types::oid[], readers::oid[],"
						   " (extract(epoch FROM created_at) * 1000000)::int8,"
						   " NULL::oid, NULL::text, NULL::int4"
						   " FROM projcache.snapshot_registry"
						   " WHERE name OPERATOR(pg_catalog.=) $1",
						   1, argtypes);
		if (plan == NULL)
			elog(ERROR, "could not plan the registry lookup: %s",
				 SPI_result_code_string(SPI_result));
		if (SPI_keepplan(plan) != 0)
			elog(ERROR, "SPI_keepplan failed");
		registry_lookup_plans[with_views] = plan;
	}
	/* What is registered now, as for a catalog: not the caller's snapshot. */
	PushActiveSnapshot(GetLatestSnapshot());
	ret = SPI_execute_plan(registry_lookup_plans[with_views], args, NULL,
						   true, 1);
	if (ret != SPI_OK_SELECT)
		elog(ERROR, "could not read projcache.snapshot_registry: %s",
			 SPI_result_code_string(ret));
	if (SPI_processed == 1)
	{
		HeapTuple	tup = SPI_tuptable->vals[0];
		TupleDesc	desc = SPI_tuptable->tupdesc;
		bool		isnull;
		MemoryContext oldcxt = MemoryContextSwitchTo(callercxt);
		ArrayType  *names;
		Datum	   *elems;
		Datum		d;
		int			n;
		int			i;

		reg = palloc0(sizeof(SnapReg));
		reg->id = DatumGetInt64(SPI_getbinval(tup, desc, 1, &isnull));
		reg->name = pstrdup(name);
		reg->query = TextDatumGetCString(SPI_getbinval(tup, desc, 2, &isnull));
		reg->ttl_ms = DatumGetInt64(SPI_getbinval(tup, desc, 3, &isnull));
		reg->owner = DatumGetObjectId(SPI_getbinval(tup, desc, 4, &isnull));
		names = DatumGetArrayTypeP(SPI_getbinval(tup, desc, 5, &isnull));
		deconstruct_array(names, TEXTOID, -1, false, TYPALIGN_INT,
						  &elems, NULL, &n);
		reg->natts = n;
		reg->colnames = palloc(Max(n, 1) * sizeof(char *));
		for (i = 0; i < n; i++)
			reg->colnames[i] = TextDatumGetCString(elems[i]);
		reg->coltypes = oid_array(SPI_getbinval(tup, desc, 6, &isnull), &n);
		reg->readers = oid_array(SPI_getbinval(tup, desc, 7, &isnull),
								 &reg->nreaders);
		reg->stamp = DatumGetInt64(SPI_getbinval(tup, desc, 8, &isnull));
		d = SPI_getbinval(tup, desc, 9, &isnull);
		reg->view = isnull ? InvalidOid : DatumGetObjectId(d);
		d = SPI_getbinval(tup, desc, 10, &isnull);
		reg->bind_error = isnull ? NULL : TextDatumGetCString(d);
		d = SPI_getbinval(tup, desc, 11, &isnull);
		reg->key_attno = isnull ? 0 : DatumGetInt32(d);
		reg->created_here = created_by_this_xact(reg->id);
		MemoryContextSwitchTo(oldcxt);
	}
	PopActiveSnapshot();
	SPI_finish();
	pc_unbecome(&rs);

	if (reg == NULL && !missing_ok)
		ereport(ERROR,
				(errcode(ERRCODE_UNDEFINED_OBJECT),
				 errmsg("snapshot \"%s\" does not exist", name)));
	return reg;
}

/*
 * Run a statement on the registry as the bootstrap superuser.  Returns the
 * number of rows it affected.  The transaction counts as having changed
 * the registry (pc_registry_changed), even if the statement fails.
 */
uint64
pc_registry_modify(const char *sql, int nargs, Oid *argtypes, Datum *args)
{
	PcUserSwitch	rs;
	int			ret;
	uint64		nrows;

	pc_registry_changed();
	pc_become_extension(&rs);
	if (SPI_connect() != SPI_OK_CONNECT)
		elog(ERROR, "SPI_connect failed");
	ret = SPI_execute_with_args(sql, nargs, argtypes, args, NULL, false, 0);
	if (ret < 0)
		elog(ERROR, "could not update projcache.snapshot_registry: %s",
			 SPI_result_code_string(ret));
	nrows = SPI_processed;
	SPI_finish();
	pc_unbecome(&rs);
	return nrows;
}

void
pc_snap_check_owner(SnapReg *reg)
{
	if (!has_privs_of_role(GetUserId(), reg->owner))
		ereport(ERROR,
				(errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
				 errmsg("must be owner of snapshot \"%s\"", reg->name)));
}

/* May the current user read the snapshot: its owner's privileges, or a grant? */
bool
pc_snap_may_read(SnapReg *reg)
{
	Oid			me = GetUserId();
	int			i;

	if (has_privs_of_role(me, reg->owner))
		return true;
	for (i = 0; i < reg->nreaders; i++)
		if (has_privs_of_role(me, reg->readers[i]))
			return true;
	return false;
}

void
pc_snap_check_reader(SnapReg *reg)
{
	if (pc_snap_may_read(reg))
		return;
	ereport(ERROR,
			(errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
			 errmsg("permission denied for snapshot \"%s\"", reg->name),
			 errhint("The snapshot's owner can allow it with projcache.grant_snapshot().")));
}

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
 *	   PcShared.registry_generation once it has committed.  A read that
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
 *	   everything, pc_registry_has_views() included.
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

/*
 * A relcache invalidation: of the registry, or of all relations, drops
 * everything; of a backing view, that snapshot's entry.
 */
static void
regcache_relcache_cb(Datum arg, Oid relid)
{
	regcache_invals++;
	if (!OidIsValid(relid) || relid == registry_relid ||
		!OidIsValid(registry_relid))
		has_views_known = false;
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
	reg->created_here = created_by_this_xact(reg->id);
	return reg;
}

/* Cache a registration; nothing is left behind if this fails. */
static RegCacheEntry *
regcache_store(const SnapReg *reg)
{
	Size		size;
	SnapReg    *flat = snapreg_flatten(regcache_cxt, reg, &size);
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
	e->reg_size = size;
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
	 * A transaction that changed the registry reads it (and its own
	 * changes) every time.  A name too long for the cache's key is no
	 * snapshot's.
	 */
	if (registry_changed || pc_shared == NULL || strlen(name) >= NAMEDATALEN)
		return pc_registry_lookup(name, missing_ok);

	regcache_set_callbacks();
	AcceptInvalidationMessages();
	generation = pg_atomic_read_u64(&pc_shared->registry_generation);
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
	 * (see "A registration goes with its backing view").  The cache drops
	 * an entry when its view goes, so only this path can meet one.
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
	regcache_reset_pending = true;
}

TupleDesc
pc_snap_registered_desc(SnapReg *reg)
{
	TupleDesc	desc = CreateTemplateTupleDesc(reg->natts);
	int			i;

	for (i = 0; i < reg->natts; i++)
		TupleDescInitEntry(desc, (AttrNumber) (i + 1), reg->colnames[i],
						   reg->coltypes[i], -1, 0);
	return desc;
}

char *
pc_snap_describe_columns(SnapReg *reg)
{
	StringInfoData buf;
	int			i;

	initStringInfo(&buf);
	appendStringInfoChar(&buf, '(');
	for (i = 0; i < reg->natts; i++)
		appendStringInfo(&buf, "%s%s %s", i > 0 ? ", " : "",
						 quote_identifier(reg->colnames[i]),
						 format_type_be(reg->coltypes[i]));
	appendStringInfoChar(&buf, ')');
	return buf.data;
}

/* Do the (non-dropped) columns of desc have the registered types? */
bool
pc_snap_desc_matches(SnapReg *reg, TupleDesc desc)
{
	return pc_snap_types_match(reg->natts, reg->coltypes, desc);
}

/* ----------------------------------------------------------------
 * Registration
 * ----------------------------------------------------------------
 */

/* Does a query, or any query inside it, write or lock rows? */
static bool
writes_or_locks(Node *node, void *context)
{
	if (node == NULL)
		return false;
	if (IsA(node, Query))
	{
		Query	   *q = (Query *) node;

		if (q->commandType != CMD_SELECT || q->hasModifyingCTE ||
			q->rowMarks != NIL)
			return true;
		return query_tree_walker(q, writes_or_locks, context, 0);
	}
	return expression_tree_walker(node, writes_or_locks, context);
}

/*
 * The creator owns the snapshot and its loads run as it: refuse a query it
 * may not run now (permission denied for a table it cannot read), as the
 * executor would check it, on the planned range table.
 */
static void
check_query_rights(SPIPlanPtr plan)
{
	CachedPlan *cplan = SPI_plan_get_cached_plan(plan);
	ListCell   *lc;

	foreach(lc, cplan->stmt_list)
	{
		PlannedStmt *stmt = lfirst_node(PlannedStmt, lc);

		if (stmt->commandType != CMD_UTILITY)
			(void) ExecCheckRTPerms(stmt->rtable, true);
	}
	/* The plan is not saved: its cached plan has no resource owner. */
	ReleaseCachedPlan(cplan, NULL);
}

/*
 * Check a snapshot query as the caller would run it: one read-only SELECT,
 * parsed and analyzed now with the given search path, so a typo fails at
 * registration.  Returns its result columns.
 */
TupleDesc
pc_snap_check_query(const char *query, const char *search_path)
{
	MemoryContext callercxt = CurrentMemoryContext;
	PcUserSwitch	rs;
	SPIPlanPtr	plan;
	List	   *sources;
	CachedPlanSource *ps;
	ListCell   *lc;
	TupleDesc	result;
	int			i;

	pc_become(&rs, PC_AS_SNAPSHOT_OWNER, GetUserId(), search_path);
	if (SPI_connect() != SPI_OK_CONNECT)
		elog(ERROR, "SPI_connect failed");
	plan = SPI_prepare(query, 0, NULL);
	if (plan == NULL)
		elog(ERROR, "SPI_prepare failed: %s", SPI_result_code_string(SPI_result));
	sources = SPI_plan_get_plan_sources(plan);
	if (list_length(sources) != 1)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("snapshot query must be a single SELECT")));
	ps = linitial(sources);
	if (ps->resultDesc == NULL || ps->commandTag != CMDTAG_SELECT)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("snapshot query must be a SELECT that returns rows")));
	foreach(lc, ps->query_list)
	{
		if (writes_or_locks((Node *) lfirst_node(Query, lc), NULL))
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("snapshot query must be read-only"),
					 errdetail("It must not write, nor lock rows with FOR UPDATE or FOR SHARE, at any level.")));
	}
	check_query_rights(plan);
	for (i = 0; i < ps->resultDesc->natts; i++)
	{
		Form_pg_attribute att = TupleDescAttr(ps->resultDesc, i);

		if (get_typtype(att->atttypid) == TYPTYPE_PSEUDO)
			ereport(ERROR,
					(errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
					 errmsg("snapshot column \"%s\" has pseudo-type %s",
							NameStr(att->attname), format_type_be(att->atttypid))));
	}
	MemoryContextSwitchTo(callercxt);
	result = CreateTupleDescCopy(ps->resultDesc);
	SPI_finish();
	pc_unbecome(&rs);
	return result;
}

/*
 * The caller's effective search path, spelled out: "$user" is expanded for
 * the caller (the view is created as another role) and temporary schemas
 * are left out.
 */
char *
pc_snap_creator_search_path(void)
{
	StringInfoData buf;
	ListCell   *lc;

	initStringInfo(&buf);
	foreach(lc, fetch_search_path(false))
	{
		Oid			nsp = lfirst_oid(lc);
		char	   *nspname;

		if (isAnyTempNamespace(nsp) || (nspname = get_namespace_name(nsp)) == NULL)
			continue;
		appendStringInfo(&buf, "%s%s", buf.len > 0 ? ", " : "",
						 quote_identifier(nspname));
	}
	if (buf.len == 0)
		appendStringInfoString(&buf, "pg_catalog");
	return buf.data;
}

/* Does the view's query use anything of this session's temporary schema? */
static bool
view_uses_temp_objects(Oid view)
{
	Oid			argtypes[1] = {OIDOID};
	Datum		args[1];
	bool		isnull;
	int			ret;

	args[0] = ObjectIdGetDatum(view);
	/*
	 * What its rule uses, and its columns' types.  Not read-only: the view
	 * was made by a later command than the caller's snapshot can see.
	 */
	ret = SPI_execute_with_args("SELECT pg_catalog.count(*)"
								" FROM pg_catalog.pg_depend d"
								" WHERE ((d.classid OPERATOR(pg_catalog.=) 'pg_catalog.pg_rewrite'::pg_catalog.regclass"
								"   AND d.objid IN (SELECT oid FROM pg_catalog.pg_rewrite"
								"     WHERE ev_class OPERATOR(pg_catalog.=) $1))"
								"  OR (d.classid OPERATOR(pg_catalog.=) 'pg_catalog.pg_class'::pg_catalog.regclass"
								"   AND d.objid OPERATOR(pg_catalog.=) $1))"
								" AND (d.refobjid IN (SELECT oid FROM pg_catalog.pg_class"
								"   WHERE relpersistence OPERATOR(pg_catalog.=) 't')"
								" OR d.refobjid IN (SELECT oid FROM pg_catalog.pg_type"
								"   WHERE typnamespace OPERATOR(pg_catalog.=) pg_catalog.pg_my_temp_schema())"
								" OR d.refobjid IN (SELECT oid FROM pg_catalog.pg_proc"
								"   WHERE pronamespace OPERATOR(pg_catalog.=) pg_catalog.pg_my_temp_schema())"
								" OR d.refobjid IN (SELECT oid FROM pg_catalog.pg_operator"
								"   WHERE oprnamespace OPERATOR(pg_catalog.=) pg_catalog.pg_my_temp_schema()))",
								1, argtypes, args, NULL, false, 1);
	if (ret != SPI_OK_SELECT || SPI_processed != 1)
		elog(ERROR, "could not read the dependencies of view %u", view);
	return DatumGetInt64(SPI_getbinval(SPI_tuptable->vals[0],
									   SPI_tuptable->tupdesc, 1, &isnull)) > 0;
}

/*
 * Analyze a snapshot's query as its owner, with search_path, for the view
 * that backs it: the tree pc_snap_create_view() stores.  Analysis runs the
 * caller's code (a literal's input function, a domain's CHECK), so it runs
 * as the owner, never as the superuser that stores the view.  Checks what
 * CREATE VIEW would.
 */
static Query *
analyze_view_query(const char *query, const char *search_path, Oid owner)
{
	PcUserSwitch rs;
	List	   *raw;
	RawStmt    *rawstmt;
	Query	   *tree;
	ListCell   *lc;

	pc_become(&rs, PC_AS_SNAPSHOT_OWNER, owner, search_path);
	raw = raw_parser(query, RAW_PARSE_DEFAULT);
	/* Exactly one SELECT: the query cannot smuggle more. */
	if (list_length(raw) != 1 ||
		!IsA(linitial_node(RawStmt, raw)->stmt, SelectStmt) ||
		((SelectStmt *) linitial_node(RawStmt, raw)->stmt)->intoClause != NULL)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("snapshot query must be a single SELECT")));
	rawstmt = linitial_node(RawStmt, raw);
	tree = parse_analyze_fixedparams(rawstmt, query, NULL, 0, NULL);
	if (tree->commandType != CMD_SELECT || tree->utilityStmt != NULL)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("snapshot query must be a single SELECT")));
	if (tree->hasModifyingCTE)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("snapshot query must be read-only")));
	if (isQueryUsingTempRelation(tree))
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("snapshot query must not use temporary objects"),
				 errdetail("Every reader is served its rows: it cannot depend on one session.")));
	/* The owner may use each column's type, as CREATE VIEW checks. */
	foreach(lc, tree->targetList)
	{
		TargetEntry *tle = lfirst_node(TargetEntry, lc);
		Oid			type = exprType((Node *) tle->expr);
		AclResult	aclresult;

		if (tle->resjunk)
			continue;
		aclresult = pg_type_aclcheck(type, owner, ACL_USAGE);
		if (aclresult != ACLCHECK_OK)
			aclcheck_error_type(aclresult, type);
	}
	pc_unbecome(&rs);
	return tree;
}

/*
 * The relation of the view: one column per result column of the query,
 * owned by owner, in schema projcache.
 */
static Oid
define_view_relation(const char *relname, Query *tree, Oid owner)
{
	CreateStmt *create = makeNode(CreateStmt);
	ListCell   *lc;

	foreach(lc, tree->targetList)
	{
		TargetEntry *tle = lfirst_node(TargetEntry, lc);
		Node	   *expr = (Node *) tle->expr;
		ColumnDef  *def;

		if (tle->resjunk)
			continue;
		def = makeColumnDef(tle->resname, exprType(expr), exprTypmod(expr),
							exprCollation(expr));
		if (type_is_collatable(exprType(expr)) && !OidIsValid(def->collOid))
			ereport(ERROR,
					(errcode(ERRCODE_INDETERMINATE_COLLATION),
					 errmsg("could not determine which collation to use for snapshot column \"%s\"",
							def->colname),
					 errhint("Use the COLLATE clause to set the collation explicitly.")));
		create->tableElts = lappend(create->tableElts, def);
	}
	create->relation = makeRangeVar("projcache", pstrdup(relname), -1);
	create->oncommit = ONCOMMIT_NOOP;
	return DefineRelation(create, RELKIND_VIEW, owner, NULL, NULL).objectId;
}

/*
 * Create projcache.snapshot_<id>, the view that backs a snapshot, owned by
 * owner.  Its query's names are bound now, with search_path, by the
 * owner's analysis; nothing may be found in a temporary schema.  Owners
 * have no CREATE on schema projcache, so the relation and its rule are
 * stored by the bootstrap superuser, from the analyzed tree: no text of
 * the caller's is parsed as superuser, and nothing of the caller's runs
 * while the view is stored.  The view depends on the extension as an
 * ordinary object, also when made by an update script (which would make
 * it a member, and pg_dump leaves members out): DROP EXTENSION then needs
 * CASCADE while snapshots exist.
 */
Oid
pc_snap_create_view(int64 id, const char *name, const char *query,
					const char *search_path, Oid owner)
{
	PcUserSwitch rs;
	char		relname[NAMEDATALEN];
	Query	   *tree;
	Oid			view;
	ObjectAddress view_addr;
	ObjectAddress ext_addr;

	snprintf(relname, NAMEDATALEN, "snapshot_" INT64_FORMAT, id);
	tree = analyze_view_query(query, search_path, owner);

	pc_become_extension(&rs);
	view = define_view_relation(relname, tree, owner);
	CommandCounterIncrement();
	StoreViewQuery(view, tree, false);
	CommandCounterIncrement();
	CreateComments(view, RelationRelationId, 0,
				   psprintf("backs projcache snapshot \"%s\"", name));
	if (SPI_connect() != SPI_OK_CONNECT)
		elog(ERROR, "SPI_connect failed");
	if (view_uses_temp_objects(view))
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("snapshot query must not use temporary objects"),
				 errdetail("Every reader is served its rows: it cannot depend on one session.")));
	SPI_finish();
	pc_unbecome(&rs);

	ObjectAddressSet(view_addr, RelationRelationId, view);
	ObjectAddressSet(ext_addr, ExtensionRelationId,
					 get_extension_oid("projcache", false));
	deleteDependencyRecordsForClass(RelationRelationId, view,
									ExtensionRelationId, DEPENDENCY_EXTENSION);
	recordDependencyOn(&view_addr, &ext_addr, DEPENDENCY_NORMAL);
	CommandCounterIncrement();
	return view;
}

/* The next registration id, from the registry's sequence. */
int64
pc_registry_next_id(void)
{
	PcUserSwitch	rs;
	bool		isnull;
	int64		id;

	pc_become_extension(&rs);
	if (SPI_connect() != SPI_OK_CONNECT)
		elog(ERROR, "SPI_connect failed");
	if (SPI_execute("SELECT pg_catalog.nextval('projcache.snapshot_registry_id_seq'::pg_catalog.regclass)",
					false, 1) != SPI_OK_SELECT || SPI_processed != 1)
		elog(ERROR, "could not draw a snapshot id");
	id = DatumGetInt64(SPI_getbinval(SPI_tuptable->vals[0],
									 SPI_tuptable->tupdesc, 1, &isnull));
	SPI_finish();
	pc_unbecome(&rs);
	return id;
}

/*
 * Snapshots dropped by the current transaction (in TopTransactionContext):
 * their slots are freed once it commits.  Freed
 * earlier, a reader that still sees the registration would load it into a
 * new slot that nobody frees.
 */
typedef struct DroppedSnapshot
{
	char	   *name;
	int64		id;
	int64		stamp;
} DroppedSnapshot;

static List *dropped_snapshots = NIL;
static bool drop_callback_registered = false;

/*
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
 */
static object_access_hook_type prev_object_access_hook = NULL;
static bool backing_view_dropped = false;

static void register_xact_callback(void);

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

static void forget_at_commit(const char *name, int64 id, int64 stamp);

/* Before commit: delete the registrations whose view is gone. */
static void
drop_orphaned_registrations(void)
{
	Oid			nsp = get_namespace_oid("projcache", true);
	PcUserSwitch rs;
	uint64		row;

	/* DROP EXTENSION or DROP SCHEMA took the registry with the views. */
	if (!OidIsValid(nsp) ||
		!OidIsValid(get_relname_relid("snapshot_registry", nsp)) ||
		!pc_registry_has_views())
		return;
	CommandCounterIncrement();
	pc_become_extension(&rs);
	if (SPI_connect() != SPI_OK_CONNECT)
		elog(ERROR, "SPI_connect failed");
	PushActiveSnapshot(GetTransactionSnapshot());
	if (SPI_execute("DELETE FROM projcache.snapshot_registry r"
					" WHERE r.view IS NOT NULL AND NOT EXISTS"
					" (SELECT FROM pg_catalog.pg_class c"
					"  WHERE c.oid OPERATOR(pg_catalog.=) r.view::pg_catalog.oid)"
					" RETURNING r.name, r.id,"
					" (extract(epoch FROM r.created_at) * 1000000)::int8",
					false, 0) != SPI_OK_DELETE_RETURNING)
		elog(ERROR, "could not delete registrations whose view was dropped");
	/* A failed DELETE aborts the transaction: nothing to mark then. */
	if (SPI_processed > 0)
		pc_registry_changed();
	for (row = 0; row < SPI_processed; row++)
	{
		HeapTuple	tup = SPI_tuptable->vals[row];
		TupleDesc	desc = SPI_tuptable->tupdesc;
		bool		isnull;

		forget_at_commit(SPI_getvalue(tup, desc, 1),
						 DatumGetInt64(SPI_getbinval(tup, desc, 2, &isnull)),
						 DatumGetInt64(SPI_getbinval(tup, desc, 3, &isnull)));
	}
	PopActiveSnapshot();
	SPI_finish();
	pc_unbecome(&rs);
}

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
		Oid			nsp = get_namespace_oid("projcache", true);
		Oid			rel = OidIsValid(nsp) ?
			get_relname_relid("snapshot_registry", nsp) : InvalidOid;

		if (OidIsValid(rel))
			CacheInvalidateRelcacheByRelid(rel);
	}
	if (event == XACT_EVENT_COMMIT)
	{
		foreach(lc, dropped_snapshots)
		{
			DroppedSnapshot *d = (DroppedSnapshot *) lfirst(lc);

			pc_snap_forget(MyDatabaseId, d->name, d->id, d->stamp);
		}
		if (registry_changed && pc_shared != NULL)
			pg_atomic_fetch_add_u64(&pc_shared->registry_generation, 1);
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
			regcache_reset_pending = true;
		}
	}
}

static void
register_xact_callback(void)
{
	if (!drop_callback_registered)
	{
		RegisterXactCallback(snapshot_xact_callback, NULL);
		drop_callback_registered = true;
	}
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

static void
forget_at_commit(const char *name, int64 id, int64 stamp)
{
	MemoryContext oldcxt;
	DroppedSnapshot *d;

	register_xact_callback();
	oldcxt = MemoryContextSwitchTo(TopTransactionContext);
	d = palloc(sizeof(DroppedSnapshot));
	d->name = pstrdup(name);
	d->id = id;
	d->stamp = stamp;
	dropped_snapshots = lappend(dropped_snapshots, d);
	MemoryContextSwitchTo(oldcxt);
}

void
pc_snap_forget_at_commit(SnapReg *reg)
{
	forget_at_commit(reg->name, reg->id, reg->stamp);
}
