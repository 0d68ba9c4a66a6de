/*-------------------------------------------------------------------------
 *
 * snapshot_store.c
 *	  Shared slots that hold loaded snapshots.
 *
 * Each slot caches one registered snapshot of one database: its rows as a
 * single DSA chunk (a run of MAXALIGNed MinimalTuples), when it was loaded,
 * and the bookkeeping of its serving rules: the time of the last
 * attempt after the first success (fetched_at, which gates refreshes of a
 * failing source to one per TTL), and, before any success, the time of the
 * last cold-start attempt (a compare-and-swap target, so at most one load is
 * tried per TTL window).
 *
 * What one role or database can take from the others is bounded here: a
 * new slot is refused when its database holds max_snapshots_per_database
 * slots or its owner max_snapshots_per_owner (over all databases), and rows
 * are refused when they do not fit in projcache.snapshot_memory, or, for
 * their owner, in snapshot_memory_per_owner.  Snapshots owned by a
 * superuser are bound by the first and the third only, as a superuser's
 * connections are by max_connections only.  The owner's memory is counted
 * per slot (charged): the footprint of the slot's rows, plus that of rows
 * being published into it, which until the swap exist beside the old ones.
 *
 * Locking:
 * - snap_map_lock: in_use, dbid, name, reg_id, reg_stamp, owner, charged
 *	 and generation of every slot.
 *	 A slot is assigned under it in exclusive mode; readers find their slot
 *	 under it in shared mode, then keep only (index, generation).
 * - the slot's own LWLock: data, sizes, times, counters and last_error.
 *	 Readers copy the rows out under it in shared mode and release it before
 *	 returning anything, so no lock is held while the executor consumes
 *	 rows; a load runs its query holding no lock at all and takes the lock
 *	 exclusively only to swap in the new chunk.  A reader thus sees the old
 *	 rows or the new ones, never a mix, and never waits for a query.
 * - last_attempt_ms, lease_until_ms and lease_pid: atomics, changed under
 *	 the slot's lock in shared mode (so that a reassignment, which holds it
 *	 exclusively, cannot interleave).
 *
 * Every operation checks the generation it was given: if the slot was
 * reassigned meanwhile (the snapshot was dropped), it does nothing.
 *
 * Copyright (c) 2026, projcache developers
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/htup_details.h"
#include "access/xact.h"
#include "commands/dbcommands.h"
#include "miscadmin.h"
#include "storage/condition_variable.h"
#include "storage/procarray.h"
#include "utils/memutils.h"
#include "utils/syscache.h"

#include "snapshot.h"


/* ----------------------------------------------------------------
 * The slots in shared memory
 * ----------------------------------------------------------------
 */

typedef struct PcSnapSlot
{
	/* under snap_map_lock */
	bool		in_use;
	Oid			dbid;
	char		name[NAMEDATALEN];
	int64		reg_id;			/* the registry row this slot caches: its id */
	int64		reg_stamp;		/* and its creation time, since ids restart
								 * when the extension is created again */
	uint64		generation;		/* bumped whenever the slot is reassigned */
	Oid			owner;			/* the registration's owner, whose shares the
								 * slot counts against (also under the slot's
								 * lock, for recent_ref) */
	Size		charged;		/* snapshot_memory bytes counted against the
								 * owner at this generation: the rows, and
								 * rows being published */

	/* atomics */
	pg_atomic_uint64 last_attempt_ms;	/* int64; PC_NEVER if none */
	pg_atomic_uint64 lease_until_ms;	/* int64; a refresh is running until */
	pg_atomic_uint32 lease_pid; /* the backend holding the lease, or 0 */

	/* under the slot's lock */
	dsa_pointer data;			/* the rows, or InvalidDsaPointer (cold) */
	Size		data_bytes;
	int64		rows;
	uint64		version;		/* bumped at each publish */
	int64		loaded_at_ms;	/* last successful load */
	int64		fetched_at_ms;	/* last attempt since the first success */
	bool		last_failed;	/* the last attempt failed */
	int64		refresh_errors;
	dsa_pointer last_error;		/* NUL-terminated, or InvalidDsaPointer */
	Size		last_error_bytes;
	bool		error_unstored; /* last attempt failed; no room for its text */
	bool		marked_stale;	/* refreshed on the primary (WAL redo): stale
								 * until the next load */
	uint64		stale_marks;	/* times it was so marked, ever */
	bool		dump_checked;	/* the dump was looked at for its rows
								 * (snapshot_dump.c) */
	bool		restored;		/* the rows came from the dump and no load as
								 * the owner was tried since: not served */
	bool		buried;			/* rows dropped for lost rights: the dump
								 * keeps none of this registration's, and
								 * restores none (until rows are loaded) */
	bool		tombstone_due;	/* a file may hold its rows, written after its
								 * last tombstone (or in an earlier server
								 * lifetime): burying it writes one */
	int			dump_check_pid; /* the reader looking at the dump for its
								 * rows, or 0 */
	int64		restore_wait_until; /* on pc_real_now_ms(): readers wait for
									 * the first load of restored rows until
									 * then, not later */

	/*
	 * Readers waiting for restored rows' first load as the owner, or for the
	 * dump's check, sleep on it; broadcast when rows are published, a load
	 * fails, the lease is dropped, the check ends or the slot is reset.
	 */
	ConditionVariable cv;
} PcSnapSlot;

static PcSnapSlot *
slots(void)
{
	return (PcSnapSlot *) ((char *) pc_shared + pc_shared->snap_offset);
}

static LWLock *
slot_lock(int index)
{
	return &pc_shared->snap_slot_locks[index].lock;
}

Size
pc_snap_shmem_size(int max_snapshots)
{
	return mul_size(sizeof(PcSnapSlot), max_snapshots);
}

void
pc_snap_shmem_init(void *place, int max_snapshots)
{
	PcSnapSlot *s = (PcSnapSlot *) place;
	int			i;

	for (i = 0; i < max_snapshots; i++)
	{
		memset(&s[i], 0, sizeof(PcSnapSlot));
		s[i].data = InvalidDsaPointer;
		s[i].last_error = InvalidDsaPointer;
		pg_atomic_init_u64(&s[i].last_attempt_ms, (uint64) PC_NEVER);
		pg_atomic_init_u64(&s[i].lease_until_ms, 0);
		pg_atomic_init_u32(&s[i].lease_pid, 0);
		ConditionVariableInit(&s[i].cv);
	}
}

/* ----------------------------------------------------------------
 * Emptying, finding and freeing slots
 * ----------------------------------------------------------------
 */

/* Chunks a reset slot let go of, to free once the locks are released. */
typedef struct SlotLeftovers
{
	dsa_pointer data;
	Size		data_bytes;
	dsa_pointer error;
	Size		error_bytes;
} SlotLeftovers;

/*
 * Free rows and give their footprint back to projcache.snapshot_memory.
 * What they counted against their slot's owner is given back apart
 * (uncharge), or went with the slot's reset.
 */
static void
free_rows(dsa_pointer dp, Size bytes)
{
	if (!DsaPointerIsValid(dp))
		return;
	dsa_free(pc_area(), dp);
	pc_snap_memory_release(pc_dsa_footprint(bytes));
}

static void
free_leftovers(SlotLeftovers *left)
{
	free_rows(left->data, left->data_bytes);
	pc_free(left->error, left->error_bytes);
}

/*
 * Stop counting footprint bytes against the owner of slot ref, unless the
 * slot was reset since they were counted (a reset forgets them all).
 */
static void
uncharge(PcSnapRef ref, Size footprint)
{
	PcSnapSlot *s = &slots()[ref.index];

	pc_lock_alone(pc_shared->snap_map_lock, LW_EXCLUSIVE);
	if (s->generation == ref.generation)
	{
		Assert(s->charged >= footprint);
		s->charged -= footprint;
	}
	LWLockRelease(pc_shared->snap_map_lock);
}

/*
 * Empty a slot for a new owner.  Caller holds snap_map_lock exclusively;
 * the slot's lock is taken here.  What the slot held goes to *left.
 */
static void
reset_slot(int index, Oid dbid, const char *name, int64 reg_id,
		   int64 reg_stamp, Oid owner, bool in_use, SlotLeftovers *left)
{
	PcSnapSlot *s = &slots()[index];

	Assert(LWLockHeldByMeInMode(pc_shared->snap_map_lock, LW_EXCLUSIVE));
	pc_lock_slot(slot_lock(index), LW_EXCLUSIVE);
	left->data = s->data;
	left->data_bytes = s->data_bytes;
	left->error = s->last_error;
	left->error_bytes = s->last_error_bytes;
	s->in_use = in_use;
	s->dbid = dbid;
	strlcpy(s->name, name, NAMEDATALEN);
	s->reg_id = reg_id;
	s->reg_stamp = reg_stamp;
	s->owner = owner;
	/* the rows go to *left; publishes in flight see the new generation */
	s->charged = 0;
	s->generation++;
	s->data = InvalidDsaPointer;
	s->data_bytes = 0;
	s->rows = 0;
	s->loaded_at_ms = 0;
	s->fetched_at_ms = 0;
	s->last_failed = false;
	s->refresh_errors = 0;
	s->last_error = InvalidDsaPointer;
	s->last_error_bytes = 0;
	s->error_unstored = false;
	s->marked_stale = false;
	s->stale_marks = 0;
	s->dump_checked = false;
	s->dump_check_pid = 0;
	s->restored = false;
	s->buried = false;
	s->tombstone_due = true;
	pg_atomic_write_u64(&s->last_attempt_ms, (uint64) PC_NEVER);
	pg_atomic_write_u64(&s->lease_until_ms, 0);
	pg_atomic_write_u32(&s->lease_pid, 0);
	LWLockRelease(slot_lock(index));
	/* Readers waiting on the old snapshot look again (and find it gone). */
	ConditionVariableBroadcast(&s->cv);
}

/*
 * The slot caching snapshot (dbid, name), or -1.  Caller holds
 * snap_map_lock.
 */
static int
find_slot(Oid dbid, const char *name)
{
	int			i;

	Assert(LWLockHeldByMe(pc_shared->snap_map_lock));
	for (i = 0; i < pc_shared->max_snapshots; i++)
	{
		PcSnapSlot *s = &slots()[i];

		if (s->in_use && s->dbid == dbid && strcmp(s->name, name) == 0)
			return i;
	}
	return -1;
}

/* Does the slot cache this registration?  Caller holds snap_map_lock. */
static bool
slot_is(PcSnapSlot *s, int64 reg_id, int64 reg_stamp)
{
	Assert(LWLockHeldByMe(pc_shared->snap_map_lock));
	return s->reg_id == reg_id && s->reg_stamp == reg_stamp;
}

/*
 * A free slot, or -1.  Slots of databases that no longer exist are freed
 * on the way (their database cannot be checked under the LWLock, so the
 * candidates are checked in between).  Caller holds snap_map_lock
 * exclusively; it is released and retaken here.
 */
static int
free_slot(void)
{
	Oid		   *dbids;
	uint64	   *generations;
	int			n = pc_shared->max_snapshots;
	int			i;

	Assert(LWLockHeldByMeInMode(pc_shared->snap_map_lock, LW_EXCLUSIVE));
	for (i = 0; i < n; i++)
		if (!slots()[i].in_use)
			return i;

	dbids = palloc_extended(n * sizeof(Oid), MCXT_ALLOC_NO_OOM);
	generations = palloc_extended(n * sizeof(uint64), MCXT_ALLOC_NO_OOM);
	if (dbids == NULL || generations == NULL)
		return -1;
	for (i = 0; i < n; i++)
	{
		dbids[i] = slots()[i].dbid;
		generations[i] = slots()[i].generation;
	}
	LWLockRelease(pc_shared->snap_map_lock);
	for (i = 0; i < n; i++)
		if (SearchSysCacheExists1(DATABASEOID, ObjectIdGetDatum(dbids[i])))
			dbids[i] = InvalidOid;
	pc_lock_alone(pc_shared->snap_map_lock, LW_EXCLUSIVE);

	for (i = 0; i < n; i++)
	{
		if (!slots()[i].in_use)
			return i;
		if (OidIsValid(dbids[i]) && slots()[i].generation == generations[i])
			return i;			/* its database is gone */
	}
	return -1;
}

/* ----------------------------------------------------------------
 * This backend's recently read slots
 * ----------------------------------------------------------------
 */

/*
 * The slots this backend read lately.  A slot's identity (in_use, dbid,
 * registration, generation) changes only under its own lock as well as
 * snap_map_lock, so a recent slot is checked under its lock alone: a read
 * of the same snapshot does not take snap_map_lock nor scan the slots.
 */
#define PC_RECENT_REFS 8

typedef struct RecentRef
{
	Oid			dbid;
	int64		reg_id;
	int64		reg_stamp;
	PcSnapRef	ref;
} RecentRef;

static RecentRef recent_refs[PC_RECENT_REFS];	/* dbid 0: unused */
static int	recent_next = 0;

static bool
recent_ref(Oid dbid, const char *name, int64 reg_id, int64 reg_stamp,
		   Oid owner, PcSnapRef *ref)
{
	int			i;

	for (i = 0; i < PC_RECENT_REFS; i++)
	{
		RecentRef  *r = &recent_refs[i];
		PcSnapSlot *s;
		bool		same;

		if (!OidIsValid(r->dbid) || r->dbid != dbid || r->reg_id != reg_id ||
			r->reg_stamp != reg_stamp)
			continue;
		s = &slots()[r->ref.index];
		pc_lock_slot(slot_lock(r->ref.index), LW_SHARED);
		same = s->in_use && s->generation == r->ref.generation &&
			s->dbid == dbid && s->reg_id == reg_id &&
			s->reg_stamp == reg_stamp && s->owner == owner &&
			strcmp(s->name, name) == 0;
		LWLockRelease(slot_lock(r->ref.index));
		if (same)
		{
			*ref = r->ref;
			return true;
		}
		r->dbid = InvalidOid;
	}
	return false;
}

static void
remember_ref(Oid dbid, int64 reg_id, int64 reg_stamp, PcSnapRef ref)
{
	RecentRef  *r = &recent_refs[recent_next];

	if (ref.index < 0)
		return;
	recent_next = (recent_next + 1) % PC_RECENT_REFS;
	r->dbid = dbid;
	r->reg_id = reg_id;
	r->reg_stamp = reg_stamp;
	r->ref = ref;
}

/* ----------------------------------------------------------------
 * Taking a slot: the shares per database and per owner
 * ----------------------------------------------------------------
 */

/* projcache.max_snapshots_per_database, as slots. */
static int
slots_per_database(void)
{
	if (pc_max_snapshots_per_database < 0)
		return Max(pc_shared->max_snapshots / 2, 1);
	return Min(pc_max_snapshots_per_database, pc_shared->max_snapshots);
}

/* projcache.max_snapshots_per_owner, as slots. */
static int
slots_per_owner(void)
{
	if (pc_max_snapshots_per_owner < 0)
		return Max(pc_shared->max_snapshots / 4, 1);
	return Min(pc_max_snapshots_per_owner, pc_shared->max_snapshots);
}

/* Which bound refused a slot. */
typedef enum SlotRefusal
{
	SLOT_GRANTED,
	SLOT_NONE_FREE,				/* projcache.max_snapshots */
	SLOT_DATABASE_FULL,			/* projcache.max_snapshots_per_database */
	SLOT_OWNER_FULL				/* projcache.max_snapshots_per_owner */
} SlotRefusal;

/*
 * May database dbid and role owner take one more slot, slot 'except'
 * (the one they would take) aside?  Caller holds snap_map_lock.
 */
static SlotRefusal
check_slot_shares(Oid dbid, Oid owner, int except)
{
	int			in_db = 0;
	int			of_owner = 0;
	int			i;

	Assert(LWLockHeldByMe(pc_shared->snap_map_lock));
	for (i = 0; i < pc_shared->max_snapshots; i++)
	{
		PcSnapSlot *s = &slots()[i];

		if (!s->in_use || i == except)
			continue;
		if (s->dbid == dbid)
			in_db++;
		if (s->owner == owner)
			of_owner++;
	}
	if (in_db >= slots_per_database())
		return SLOT_DATABASE_FULL;
	if (of_owner >= slots_per_owner())
		return SLOT_OWNER_FULL;
	return SLOT_GRANTED;
}

/*
 * Raise the error for a slot that could not be had: none free, or the
 * database's or the owner's share taken.  SLOT_GRANTED returns.
 */
static void
report_slot_refusal(SlotRefusal refusal, Oid dbid, Oid owner)
{
	char	   *dbname;
	char	   *rolname;

	switch (refusal)
	{
		case SLOT_GRANTED:
			break;
		case SLOT_NONE_FREE:
			ereport(ERROR,
					(errcode(ERRCODE_CONFIGURATION_LIMIT_EXCEEDED),
					 errmsg("too many projcache snapshots in use"),
					 errdetail("All %d snapshot slots are taken.",
							   pc_shared->max_snapshots),
					 errhint("Raise projcache.max_snapshots, or drop unused snapshots.")));
			break;
		case SLOT_DATABASE_FULL:
			dbname = get_database_name(dbid);
			ereport(ERROR,
					(errcode(ERRCODE_CONFIGURATION_LIMIT_EXCEEDED),
					 errmsg("too many projcache snapshots of database \"%s\" in use",
							dbname ? dbname : "?"),
					 errdetail("Its snapshots take %d snapshot slots, the most one database may take (projcache.max_snapshots_per_database).",
							   slots_per_database()),
					 errhint("Drop unused snapshots of this database, or raise projcache.max_snapshots_per_database.")));
			break;
		case SLOT_OWNER_FULL:
			rolname = GetUserNameFromId(owner, true);
			ereport(ERROR,
					(errcode(ERRCODE_CONFIGURATION_LIMIT_EXCEEDED),
					 errmsg("too many projcache snapshots of role \"%s\" in use",
							rolname ? rolname : "?"),
					 errdetail("Its snapshots take %d snapshot slots, the most one role may take over all databases (projcache.max_snapshots_per_owner).",
							   slots_per_owner()),
					 errhint("Drop unused snapshots of that role, or raise projcache.max_snapshots_per_owner.")));
			break;
	}
	Assert(refusal == SLOT_GRANTED);
}

/*
 * The slot of snapshot (dbid, name) as registered under (reg_id,
 * reg_stamp) and owned by owner, assigning one if needed.  A slot left by
 * an earlier registration of the same name is emptied first.  When no slot
 * may be taken (all are, or the database's or the owner's share is):
 * ERROR, or with none_ok a ref whose index is -1.
 */
PcSnapRef
pc_snap_acquire(Oid dbid, const char *name, int64 reg_id, int64 reg_stamp,
				Oid owner, bool none_ok)
{
	PcSnapRef	ref;
	int			index;
	SlotRefusal refusal = SLOT_GRANTED;
	bool		exempt;
	SlotLeftovers left = {InvalidDsaPointer, 0, InvalidDsaPointer, 0};

	if (recent_ref(dbid, name, reg_id, reg_stamp, owner, &ref))
		return ref;

	pc_lock_alone(pc_shared->snap_map_lock, LW_SHARED);
	index = find_slot(dbid, name);
	if (index >= 0 && slot_is(&slots()[index], reg_id, reg_stamp) &&
		slots()[index].owner == owner)
	{
		ref.index = index;
		ref.generation = slots()[index].generation;
		LWLockRelease(pc_shared->snap_map_lock);
		remember_ref(dbid, reg_id, reg_stamp, ref);
		return ref;
	}
	LWLockRelease(pc_shared->snap_map_lock);

	/* A catalog lookup: not under the LWLock. */
	exempt = superuser_arg(owner);

	pc_lock_alone(pc_shared->snap_map_lock, LW_EXCLUSIVE);
	index = find_slot(dbid, name);
	if (index < 0)
	{
		index = free_slot();
		/* free_slot() may release the lock: look again. */
		if (find_slot(dbid, name) >= 0)
			index = find_slot(dbid, name);
	}
	if (index < 0)
		refusal = SLOT_NONE_FREE;
	else if (slots()[index].in_use && slots()[index].dbid == dbid &&
			 strcmp(slots()[index].name, name) == 0 &&
			 slot_is(&slots()[index], reg_id, reg_stamp))
	{
		/* Its owner changed (REASSIGN OWNED): the slot is counted anew. */
		if (slots()[index].owner != owner)
		{
			pc_lock_slot(slot_lock(index), LW_EXCLUSIVE);
			slots()[index].owner = owner;
			LWLockRelease(slot_lock(index));
		}
	}
	else
	{
		if (!exempt)
			refusal = check_slot_shares(dbid, owner, index);
		if (refusal == SLOT_GRANTED)
			reset_slot(index, dbid, name, reg_id, reg_stamp, owner, true,
					   &left);
	}
	if (refusal != SLOT_GRANTED)
	{
		LWLockRelease(pc_shared->snap_map_lock);
		if (none_ok)
		{
			ref.index = -1;
			ref.generation = 0;
			return ref;
		}
		report_slot_refusal(refusal, dbid, owner);
	}
	ref.index = index;
	ref.generation = slots()[index].generation;
	LWLockRelease(pc_shared->snap_map_lock);

	free_leftovers(&left);
	remember_ref(dbid, reg_id, reg_stamp, ref);
	return ref;
}

/* Free the slot of a dropped registration, if it has one. */
void
pc_snap_forget(Oid dbid, const char *name, int64 reg_id, int64 reg_stamp)
{
	int			index;
	SlotLeftovers left = {InvalidDsaPointer, 0, InvalidDsaPointer, 0};

	pc_lock_alone(pc_shared->snap_map_lock, LW_EXCLUSIVE);
	index = find_slot(dbid, name);
	if (index >= 0 && slot_is(&slots()[index], reg_id, reg_stamp))
		reset_slot(index, InvalidOid, "", 0, 0, InvalidOid, false, &left);
	LWLockRelease(pc_shared->snap_map_lock);

	free_leftovers(&left);
}

/*
 * The registrations that slots of database dbid cache, for a caller that
 * checks which of them still exist.  The list is allocated before the lock
 * is taken, so nothing under it can raise an ERROR.
 */
List *
pc_snap_slots_of(Oid dbid)
{
	int			n = pc_shared->max_snapshots;
	PcSnapKey  *keys = palloc(n * sizeof(PcSnapKey));
	List	   *result = NIL;
	int			nkeys = 0;
	int			i;

	pc_lock_alone(pc_shared->snap_map_lock, LW_SHARED);
	for (i = 0; i < n; i++)
	{
		PcSnapSlot *s = &slots()[i];

		if (!s->in_use || s->dbid != dbid)
			continue;
		strlcpy(keys[nkeys].name, s->name, NAMEDATALEN);
		keys[nkeys].reg_id = s->reg_id;
		keys[nkeys].reg_stamp = s->reg_stamp;
		nkeys++;
	}
	LWLockRelease(pc_shared->snap_map_lock);

	for (i = 0; i < nkeys; i++)
		result = lappend(result, &keys[i]);
	return result;
}

/* ----------------------------------------------------------------
 * This backend's copies of the rows
 * ----------------------------------------------------------------
 */

/*
 * This backend's copies of the snapshots it read last, one per snapshot,
 * PC_LOCAL_COPIES at most.  They are kept between reads: reading an
 * unchanged snapshot again copies nothing, whether the backend reads
 * several in turn or together (a join of two), and a changed one is
 * copied into the buffer it had.  They cost the backend up to
 * PC_LOCAL_COPY_KEEP_BYTES in all: after a read, the least recently used
 * ones go back until the rest fit (a copy that alone exceeds it goes).
 */
typedef struct LocalCopy
{
	int			index;			/* slot, or -1 */
	uint64		generation;
	uint64		version;
	char	   *buf;			/* in TopMemoryContext, PC_COPY_LEAD bytes in */
	Size		capacity;
	Size		size;
	int64		rows;
	int			pins;			/* scans reading buf (pc_snap_pin_copy) */
	uint64		last_used;		/* of local_copy_clock */
} LocalCopy;

#define PC_LOCAL_COPIES		4

static LocalCopy local_copies[PC_LOCAL_COPIES] = {
	{.index = -1}, {.index = -1}, {.index = -1}, {.index = -1}
};
static uint64 local_copy_clock = 0;

/*
 * Zeroed bytes before every copy of the rows: a scan gives each row to the
 * executor as a heap tuple whose header starts MINIMAL_TUPLE_OFFSET bytes
 * before the stored MinimalTuple (snapshot_fdw.c), and copying such a tuple
 * reads those bytes.  For the first row they are these, inside the copy.
 */
#define PC_COPY_LEAD	MAXALIGN(MINIMAL_TUPLE_OFFSET)
static bool pin_callback_registered = false;

/* What this backend's copies may keep between reads, in all. */
#define PC_LOCAL_COPY_KEEP_BYTES	((Size) 8 * 1024 * 1024)

/* A buffer for size bytes of rows, after the lead; NULL if out of memory. */
static char *
alloc_copy(MemoryContext cxt, Size size)
{
	char	   *buf = MemoryContextAllocExtended(cxt, PC_COPY_LEAD + size,
												 MCXT_ALLOC_HUGE |
												 MCXT_ALLOC_NO_OOM);

	if (buf == NULL)
		return NULL;
	memset(buf, 0, PC_COPY_LEAD);
	return buf + PC_COPY_LEAD;
}

static void
free_copy(LocalCopy *lc)
{
	if (lc->buf != NULL)
		pfree(lc->buf - PC_COPY_LEAD);
	lc->buf = NULL;
	lc->capacity = 0;
	lc->index = -1;
}

/*
 * The copy to hold the snapshot in slot (index, generation): the one that
 * holds it already, else an empty one, else the least recently used one
 * that no scan pins.  NULL if every candidate is pinned.
 */
static LocalCopy *
choose_copy(int index, uint64 generation)
{
	LocalCopy  *victim = NULL;
	int			i;

	for (i = 0; i < PC_LOCAL_COPIES; i++)
	{
		LocalCopy  *lc = &local_copies[i];

		if (lc->index == index && lc->generation == generation)
			return lc;
	}
	for (i = 0; i < PC_LOCAL_COPIES; i++)
	{
		LocalCopy  *lc = &local_copies[i];

		if (lc->pins > 0)
			continue;
		if (lc->index == -1)
			return lc;
		if (victim == NULL || lc->last_used < victim->last_used)
			victim = lc;
	}
	return victim;
}

/*
 * Copy the rows out, if the slot holds a snapshot (and, with only_fresh,
 * one fetched within ttl_ms) that may be served: rows restored from the
 * dump are not, until a load as the owner was tried (pc_snap_awaits_load).
 * The copy is made under the slot's shared
 * lock with an allocation that cannot raise an ERROR; the caller returns
 * rows from it holding no lock.  *blob stays valid until the next call,
 * or, if the caller pins it (pc_snap_pin_copy), until it is unpinned: a
 * pinned copy is never refilled nor freed, and a read that would need it
 * refilled (the snapshot changed, or every copy is pinned) gets a copy of
 * its own in CurrentMemoryContext.
 */
bool
pc_snap_copy(PcSnapRef ref, int64 now, int64 ttl_ms, bool only_fresh,
			 char **blob, Size *size, int64 *rows)
{
	PcSnapSlot *s = &slots()[ref.index];
	bool		found = false;
	bool		oom = false;

	pc_lock_slot(slot_lock(ref.index), LW_SHARED);
	if (s->generation == ref.generation && DsaPointerIsValid(s->data) &&
		!s->restored &&
		(!only_fresh || (!s->marked_stale && now - s->fetched_at_ms < ttl_ms)))
	{
		LocalCopy  *lc = choose_copy(ref.index, ref.generation);
		bool		current = lc != NULL && lc->index == ref.index &&
			lc->generation == ref.generation && lc->version == s->version;

		if (!current && (lc == NULL || lc->pins > 0))
		{
			/* A scan still reads that copy: this one is separate. */
			char	   *own = alloc_copy(CurrentMemoryContext, s->data_bytes);

			if (own == NULL)
				oom = true;
			else
			{
				memcpy(own, dsa_get_address(pc_area(), s->data), s->data_bytes);
				*blob = own;
				*size = s->data_bytes;
				*rows = s->rows;
				found = true;
			}
		}
		else if (!current)
		{
			if (lc->capacity < s->data_bytes)
			{
				char	   *grown = alloc_copy(TopMemoryContext, s->data_bytes);

				if (grown == NULL)
					oom = true;
				else
				{
					free_copy(lc);
					lc->buf = grown;
					lc->capacity = s->data_bytes;
				}
			}
			if (!oom)
			{
				memcpy(lc->buf, dsa_get_address(pc_area(), s->data),
					   s->data_bytes);
				lc->index = ref.index;
				lc->generation = ref.generation;
				lc->version = s->version;
				lc->size = s->data_bytes;
				lc->rows = s->rows;
			}
			else
				lc->index = -1; /* it may hold part of a copy */
		}
		if (!oom && !found)
		{
			lc->last_used = ++local_copy_clock;
			*blob = lc->buf;
			*size = lc->size;
			*rows = lc->rows;
			found = true;
		}
	}
	LWLockRelease(slot_lock(ref.index));

	if (oom)
		pc_report_oom("a snapshot");
	return found;
}

/* Pins end with the transaction: a scan that failed never unpinned. */
static void
unpin_at_xact_end(XactEvent event, void *arg)
{
	int			i;

	if (event == XACT_EVENT_ABORT || event == XACT_EVENT_PARALLEL_ABORT ||
		event == XACT_EVENT_COMMIT || event == XACT_EVENT_PARALLEL_COMMIT ||
		event == XACT_EVENT_PREPARE)
		for (i = 0; i < PC_LOCAL_COPIES; i++)
			local_copies[i].pins = 0;
}

/* The backend's copy whose rows blob is, or NULL. */
static LocalCopy *
copy_of(const char *blob)
{
	int			i;

	if (blob == NULL)
		return NULL;
	for (i = 0; i < PC_LOCAL_COPIES; i++)
		if (local_copies[i].buf == blob)
			return &local_copies[i];
	return NULL;
}

/*
 * A scan that returns rows straight from the blob pc_snap_copy() gave it
 * pins it for as long as it reads; blobs other than the backend's copies
 * (see pc_snap_copy) need no pin, and pinning them does nothing.
 */
void
pc_snap_pin_copy(const char *blob)
{
	LocalCopy  *lc = copy_of(blob);

	if (lc == NULL)
		return;
	if (!pin_callback_registered)
	{
		RegisterXactCallback(unpin_at_xact_end, NULL);
		pin_callback_registered = true;
	}
	lc->pins++;
}

void
pc_snap_unpin_copy(const char *blob)
{
	LocalCopy  *lc = copy_of(blob);

	if (lc != NULL && lc->pins > 0)
		lc->pins--;
}

/*
 * Give back the copies beyond what the backend keeps: least recently used
 * first, pinned ones never.
 */
void
pc_snap_trim_local_copy(void)
{
	Size		kept = 0;
	int			i;

	for (i = 0; i < PC_LOCAL_COPIES; i++)
		kept += local_copies[i].capacity;
	while (kept > PC_LOCAL_COPY_KEEP_BYTES)
	{
		LocalCopy  *oldest = NULL;

		for (i = 0; i < PC_LOCAL_COPIES; i++)
		{
			LocalCopy  *lc = &local_copies[i];

			if (lc->buf != NULL && lc->pins == 0 &&
				(oldest == NULL || lc->last_used < oldest->last_used))
				oldest = lc;
		}
		if (oldest == NULL)
			break;
		kept -= oldest->capacity;
		free_copy(oldest);
	}
}

/* ----------------------------------------------------------------
 * Freshness, the cold-start claim and the refresh lease
 * ----------------------------------------------------------------
 */

/*
 * Is the snapshot loaded (restored rows count), and fetched within ttl_ms
 * (restored rows never are)?
 */
bool
pc_snap_is_fresh(PcSnapRef ref, int64 now, int64 ttl_ms, bool *loaded)
{
	PcSnapSlot *s = &slots()[ref.index];
	bool		fresh;

	pc_lock_slot(slot_lock(ref.index), LW_SHARED);
	*loaded = s->generation == ref.generation && DsaPointerIsValid(s->data);
	fresh = *loaded && !s->restored && !s->marked_stale &&
		now - s->fetched_at_ms < ttl_ms;
	LWLockRelease(slot_lock(ref.index));
	return fresh;
}

/*
 * Does the slot hold rows restored from the dump that no load as the owner
 * has vouched for yet?  They are not served until one was tried: only a
 * load knows whether the owner may still read them.
 */
bool
pc_snap_awaits_load(PcSnapRef ref)
{
	PcSnapSlot *s = &slots()[ref.index];
	bool		awaits;

	pc_lock_slot(slot_lock(ref.index), LW_SHARED);
	awaits = s->generation == ref.generation && DsaPointerIsValid(s->data) &&
		s->restored;
	LWLockRelease(slot_lock(ref.index));
	return awaits;
}

/*
 * What a reader may wait for in the slot, under its lock: another backend
 * reading the dump for its rows, or, before s->restore_wait_until, the
 * first load as the owner of restored rows that another backend is trying
 * (it holds the lease).  With the lease free there is nothing to wait for:
 * the reader tries the load itself, or, if it may not, fails as before.
 * *lease_left: how long the lease lasts if nobody drops it (its end wakes
 * nobody).
 */
static bool
worth_waiting(PcSnapSlot *s, PcSnapRef ref, int64 real_now,
			  int64 *lease_left)
{
	int			checker = s->dump_check_pid;
	int			holder;
	int64		until;

	*lease_left = PG_INT64_MAX;
	if (s->generation != ref.generation)
		return false;
	if (checker != 0 && checker != MyProcPid &&
		BackendPidGetProc(checker) != NULL)
		return true;
	if (!DsaPointerIsValid(s->data) || !s->restored ||
		real_now >= s->restore_wait_until)
		return false;
	holder = (int) pg_atomic_read_u32(&s->lease_pid);
	until = (int64) pg_atomic_read_u64(&s->lease_until_ms);
	*lease_left = until - pc_now_ms();
	return holder != 0 && holder != MyProcPid && *lease_left > 0 &&
		BackendPidGetProc(holder) != NULL;
}

/*
 * Right after a restart: wait, until deadline (on pc_real_now_ms()), for
 * what another backend does that this read needs, rather than fail
 * (projcache.restore_wait): its reading the dump for the slot's rows, or
 * its load as the owner of rows restored from it.  PC_SNAP_WAIT_NONE:
 * there was nothing to wait for; PC_SNAP_WAIT_WOKEN: it ended: look again;
 * PC_SNAP_WAIT_TIMEOUT: the deadline passed.  Interruptible; no lock is
 * held while sleeping.
 */
PcSnapWait
pc_snap_wait_restore(PcSnapRef ref, int64 deadline)
{
	PcSnapSlot *s = &slots()[ref.index];
	PcSnapWait	result = PC_SNAP_WAIT_NONE;

	ConditionVariablePrepareToSleep(&s->cv);
	for (;;)
	{
		int64		real_now = pc_real_now_ms();
		int64		lease_left;
		bool		wait;

		pc_lock_slot(slot_lock(ref.index), LW_SHARED);
		wait = worth_waiting(s, ref, real_now, &lease_left);
		LWLockRelease(slot_lock(ref.index));
		if (!wait)
			break;
		if (real_now >= deadline)
		{
			result = PC_SNAP_WAIT_TIMEOUT;
			break;
		}
		result = PC_SNAP_WAIT_WOKEN;
		(void) ConditionVariableTimedSleep(&s->cv,
										   (long) Min(deadline - real_now,
													  lease_left),
										   pc_wait_event(PC_WAIT_SNAPSHOT_LOAD));
	}
	ConditionVariableCancelSleep();
	return result;
}

/*
 * Cold start: claim the one load attempt of this TTL window.  Returns
 * PC_CLAIM_WON if the caller must load (*prev is what it replaced, for
 * pc_snap_cold_unclaim), PC_CLAIM_THROTTLED if the window is taken, with
 * *throttled_since set to the attempt that explains the wait: the one seen
 * before trying, or, when the compare-and-swap is lost, the one the winner
 * just stored (PC_NEVER if none).  PC_CLAIM_GONE: the slot was reassigned.
 */
PcClaim
pc_snap_cold_claim(PcSnapRef ref, int64 now, int64 ttl_ms,
				   int64 *throttled_since, int64 *prev_attempt)
{
	PcSnapSlot *s = &slots()[ref.index];
	PcClaim		result;
	uint64		prev;
	int64		prev_ms;

	if (ttl_ms < 1)
		ttl_ms = 1;
	/* reset_slot() changes the generation under the exclusive lock. */
	pc_lock_slot(slot_lock(ref.index), LW_SHARED);
	prev = pg_atomic_read_u64(&s->last_attempt_ms);
	prev_ms = (int64) prev;
	if (s->generation != ref.generation)
		result = PC_CLAIM_GONE;
	else if (prev_ms != PC_NEVER && now - prev_ms < ttl_ms)
	{
		*throttled_since = prev_ms;
		result = PC_CLAIM_THROTTLED;
	}
	else if (!pg_atomic_compare_exchange_u64(&s->last_attempt_ms, &prev,
											 (uint64) now))
	{
		*throttled_since = (int64) prev;
		result = PC_CLAIM_THROTTLED;
	}
	else
	{
		*prev_attempt = prev_ms;
		result = PC_CLAIM_WON;
	}
	LWLockRelease(slot_lock(ref.index));
	return result;
}

/*
 * Give back a won claim whose load was cancelled: a cancel says nothing
 * about the source, so it must not close the window for everyone.
 */
void
pc_snap_cold_unclaim(PcSnapRef ref, int64 claimed_at, int64 prev_attempt)
{
	PcSnapSlot *s = &slots()[ref.index];
	uint64		expected = (uint64) claimed_at;

	pc_lock_slot(slot_lock(ref.index), LW_SHARED);
	if (s->generation == ref.generation)
		(void) pg_atomic_compare_exchange_u64(&s->last_attempt_ms, &expected,
											  (uint64) prev_attempt);
	LWLockRelease(slot_lock(ref.index));
}

/*
 * After the first success: only one backend refreshes at a time; the
 * others serve the last good snapshot.  The lease ends when its holder
 * drops it, when lease_ms have passed, or when its holder is gone (a
 * backend terminated in the middle of a load cannot drop it).
 */
bool
pc_snap_lease_take(PcSnapRef ref, int64 now, int64 lease_ms)
{
	PcSnapSlot *s = &slots()[ref.index];
	bool		taken = false;

	pc_lock_slot(slot_lock(ref.index), LW_SHARED);
	if (s->generation == ref.generation)
	{
		uint64		until = pg_atomic_read_u64(&s->lease_until_ms);
		int			holder = (int) pg_atomic_read_u32(&s->lease_pid);

		if ((int64) until <= now || holder == 0 ||
			BackendPidGetProc(holder) == NULL)
			taken = pg_atomic_compare_exchange_u64(&s->lease_until_ms, &until,
												   (uint64) (now +
															 Max(lease_ms, 1)));
		if (taken)
			pg_atomic_write_u32(&s->lease_pid, (uint32) MyProcPid);
	}
	LWLockRelease(slot_lock(ref.index));
	return taken;
}

void
pc_snap_lease_drop(PcSnapRef ref)
{
	PcSnapSlot *s = &slots()[ref.index];

	pc_lock_slot(slot_lock(ref.index), LW_SHARED);
	if (s->generation == ref.generation &&
		pg_atomic_read_u32(&s->lease_pid) == (uint32) MyProcPid)
	{
		pg_atomic_write_u32(&s->lease_pid, 0);
		pg_atomic_write_u64(&s->lease_until_ms, 0);
	}
	LWLockRelease(slot_lock(ref.index));
	/* A reader waiting for restored rows' load may try it now. */
	ConditionVariableBroadcast(&s->cv);
}

/*
 * How often the slot was marked stale by WAL redo; a load reads it before
 * its query starts and passes it to pc_snap_publish().
 */
uint64
pc_snap_stale_marks(PcSnapRef ref)
{
	PcSnapSlot *s = &slots()[ref.index];
	uint64		marks;

	pc_lock_slot(slot_lock(ref.index), LW_SHARED);
	marks = s->stale_marks;
	LWLockRelease(slot_lock(ref.index));
	return marks;
}

/*
 * On a standby, replaying refresh_snapshot() of the primary: the snapshot
 * is stale until its next load.  Called by redo, so it allocates nothing
 * and raises nothing; a snapshot not cached here is skipped.
 */
void
pc_snap_mark_stale(Oid dbid, const char *name)
{
	int			index;

	pc_lock_alone(pc_shared->snap_map_lock, LW_SHARED);
	index = find_slot(dbid, name);
	if (index >= 0)
	{
		PcSnapSlot *s = &slots()[index];

		pc_lock_slot(slot_lock(index), LW_EXCLUSIVE);
		s->marked_stale = true;
		s->stale_marks++;
		LWLockRelease(slot_lock(index));
	}
	LWLockRelease(pc_shared->snap_map_lock);
}

/* ----------------------------------------------------------------
 * Publishing rows: projcache.snapshot_memory and its share per owner
 * ----------------------------------------------------------------
 */

/* projcache.snapshot_memory_per_owner, in bytes. */
static Size
snap_memory_per_owner(void)
{
	if (pc_snapshot_memory_per_owner_kb < 0)
		return pc_snap_memory_limit() / 2;
	return Min((Size) pc_snapshot_memory_per_owner_kb * 1024,
			   pc_snap_memory_limit());
}

/* The owner of slot ref, or InvalidOid if the slot was reassigned. */
static Oid
slot_owner(PcSnapRef ref)
{
	PcSnapSlot *s = &slots()[ref.index];
	Oid			owner = InvalidOid;

	pc_lock_alone(pc_shared->snap_map_lock, LW_SHARED);
	if (s->generation == ref.generation)
		owner = s->owner;
	LWLockRelease(pc_shared->snap_map_lock);
	return owner;
}

/* What charge() says. */
typedef enum SnapRoom
{
	ROOM_TAKEN,
	ROOM_GONE,					/* the slot was reassigned */
	ROOM_OWNER_CHANGED,			/* look the owner up again */
	ROOM_OWNER_FULL,			/* projcache.snapshot_memory_per_owner */
	ROOM_BUDGET_FULL			/* projcache.snapshot_memory */
} SnapRoom;

/*
 * Take footprint bytes of projcache.snapshot_memory for rows to publish in
 * slot ref, counting them against its owner (unless exempt, a superuser).
 * *owner_bytes is what the owner's slots hold besides.  Under the
 * exclusive lock, so that two publishes of one owner cannot both pass.
 */
static SnapRoom
charge(PcSnapRef ref, Oid owner, bool exempt, Size footprint,
	   Size *owner_bytes)
{
	PcSnapSlot *s = &slots()[ref.index];
	SnapRoom	room;
	Size		held = 0;
	int			i;

	pc_lock_alone(pc_shared->snap_map_lock, LW_EXCLUSIVE);
	for (i = 0; i < pc_shared->max_snapshots; i++)
		if (slots()[i].in_use && slots()[i].owner == owner)
			held += slots()[i].charged;
	*owner_bytes = held;
	if (s->generation != ref.generation)
		room = ROOM_GONE;
	else if (s->owner != owner)
		room = ROOM_OWNER_CHANGED;
	else if (!exempt && held + footprint > snap_memory_per_owner())
		room = ROOM_OWNER_FULL;
	else if (!pc_snap_memory_reserve(footprint))
		room = ROOM_BUDGET_FULL;
	else
	{
		s->charged += footprint;
		room = ROOM_TAKEN;
	}
	LWLockRelease(pc_shared->snap_map_lock);
	return room;
}

/*
 * Swap rows into slot ref: freshly loaded ones, or (restored) ones from the
 * dump, which fill only a slot that has none and is not buried, and which
 * are not served until a load as the owner was tried.  The chunk is
 * allocated and filled before the lock is taken; the swap itself is a few
 * stores.  Returns false, with nothing changed and *refusal saying why, if
 * the rows do not fit: in projcache.snapshot_memory, in their owner's
 * share of it, or in the area's free pages.  Until the swap the new rows
 * exist beside the old ones, so a refresh needs room for both.
 * *published says whether they were swapped in (not if the slot was
 * reassigned meanwhile, or, for restored rows, filled or buried).  Runs in
 * a transaction (it looks the owner up).
 */
static bool
publish_rows(PcSnapRef ref, const char *blob, Size size, int64 rows,
			 int64 now, uint64 stale_marks, bool restored, char **refusal,
			 bool *published)
{
	PcSnapSlot *s = &slots()[ref.index];
	Size		bytes = Max(size, 1);
	Size		footprint = pc_dsa_footprint(bytes);
	Oid			owner;
	bool		exempt;
	Size		owner_bytes;
	SnapRoom	room;
	dsa_pointer dp;
	dsa_pointer old_data = InvalidDsaPointer;
	Size		old_bytes = 0;
	dsa_pointer old_error = InvalidDsaPointer;
	Size		old_error_bytes = 0;

	Assert(IsTransactionState());
	*refusal = NULL;
	*published = false;
	do
	{
		owner = slot_owner(ref);
		if (!OidIsValid(owner))
			return true;		/* dropped meanwhile: nothing to publish */
		exempt = superuser_arg(owner);
		room = charge(ref, owner, exempt, footprint, &owner_bytes);
	} while (room == ROOM_OWNER_CHANGED);
	switch (room)
	{
		case ROOM_TAKEN:
			break;
		case ROOM_GONE:
		case ROOM_OWNER_CHANGED:
			return true;
		case ROOM_OWNER_FULL:
			{
				char	   *rolname = GetUserNameFromId(owner, true);

				*refusal = psprintf("snapshot of %zu bytes does not fit in the share of projcache.snapshot_memory of role \"%s\" (projcache.snapshot_memory_per_owner = %zu kB; its snapshots hold %zu bytes)",
									size, rolname ? rolname : "?",
									snap_memory_per_owner() / 1024,
									owner_bytes);
				return false;
			}
		case ROOM_BUDGET_FULL:
			*refusal = psprintf("snapshot of %zu bytes does not fit in projcache.snapshot_memory (%zu kB of projcache.max_memory; %zu bytes in use by snapshots)",
								size, pc_snap_memory_limit() / 1024,
								pc_snap_memory_used());
			return false;
	}

	dp = dsa_allocate_extended(pc_area(), bytes,
							   DSA_ALLOC_NO_OOM | DSA_ALLOC_HUGE);
	if (!DsaPointerIsValid(dp))
	{
		pc_snap_memory_release(footprint);
		uncharge(ref, footprint);
		*refusal = psprintf("snapshot of %zu bytes found no free run of pages that large in projcache's shared memory (projcache.max_memory)",
							size);
		return false;
	}
	memcpy(dsa_get_address(pc_area(), dp), blob, size);

	pc_lock_slot(slot_lock(ref.index), LW_EXCLUSIVE);
	if (s->generation == ref.generation &&
		(!restored || (!s->buried && !DsaPointerIsValid(s->data))))
	{
		old_data = s->data;
		old_bytes = s->data_bytes;
		old_error = s->last_error;
		old_error_bytes = s->last_error_bytes;
		s->data = dp;
		s->data_bytes = bytes;
		s->rows = rows;
		s->version++;
		s->loaded_at_ms = now;
		s->fetched_at_ms = now;
		s->marked_stale = s->stale_marks != stale_marks;
		s->last_failed = false;
		s->last_error = InvalidDsaPointer;
		s->last_error_bytes = 0;
		s->error_unstored = false;
		s->restored = restored;
		if (restored)
			s->restore_wait_until = pc_real_now_ms() +
				Max(pc_restore_wait_ms, 0);
		/* Rows the owner could load: its rights are back. */
		if (!restored)
			s->buried = false;
		pg_atomic_write_u64(&s->last_attempt_ms, (uint64) now);
		*published = true;
	}
	LWLockRelease(slot_lock(ref.index));

	if (*published)
		ConditionVariableBroadcast(&s->cv);
	if (!*published)
	{
		/* dropped, filled or buried meanwhile: discard ours */
		free_rows(dp, bytes);
		uncharge(ref, footprint);
	}
	else if (DsaPointerIsValid(old_data))
	{
		free_rows(old_data, old_bytes);
		uncharge(ref, pc_dsa_footprint(old_bytes));
	}
	pc_free(old_error, old_error_bytes);
	return true;
}

/*
 * Publish freshly loaded rows (see publish_rows).  stale_marks is
 * pc_snap_stale_marks() from before the load's query: if redo marked the
 * slot since, the query may have missed what the mark stands for, so the
 * new rows stay stale.
 */
bool
pc_snap_publish(PcSnapRef ref, const char *blob, Size size, int64 rows,
				int64 now, uint64 stale_marks, char **refusal)
{
	bool		published;

	return publish_rows(ref, blob, size, rows, now, stale_marks, false,
						refusal, &published);
}

/*
 * Publish rows restored from the dump, loaded at loaded_at (their true
 * age), into a slot that has none: true if they were.  They are stale and
 * are not served until a load as the owner was tried.  False with
 * *refusal set if they do not fit; false with *refusal NULL if the slot
 * got rows meanwhile, or was buried.
 */
bool
pc_snap_publish_restored(PcSnapRef ref, const char *blob, Size size,
						 int64 rows, int64 loaded_at, char **refusal)
{
	bool		published;

	(void) publish_rows(ref, blob, size, rows, loaded_at,
						pc_snap_stale_marks(ref), true, refusal, &published);
	return published;
}

/*
 * Note a failed attempt in the slot, under its exclusive lock: count it,
 * keep its message, and note the attempt so a failing source is queried at
 * most once per TTL.  With lost_rights the rows are dropped and the slot
 * buried; *tombstone says whether a tombstone is due.  Otherwise, rows
 * restored from the dump become the last good ones if the load was one as
 * the owner that found its rights intact (rights_checked).  Returns the age
 * in ms of the rows still served (-1 if none).
 */
static int64
note_failure(PcSnapRef ref, const char *message, int64 now,
			 bool lost_rights, bool rights_checked, bool *tombstone)
{
	PcSnapSlot *s = &slots()[ref.index];
	Size		bytes;
	dsa_pointer dp = pc_store_message(message, &bytes);
	dsa_pointer old_error = InvalidDsaPointer;
	Size		old_error_bytes = 0;
	dsa_pointer old_data = InvalidDsaPointer;
	Size		old_data_bytes = 0;
	int64		age = -1;

	*tombstone = false;
	pc_lock_slot(slot_lock(ref.index), LW_EXCLUSIVE);
	if (s->generation == ref.generation)
	{
		s->refresh_errors++;
		s->last_failed = true;
		if (lost_rights)
		{
			old_data = s->data;
			old_data_bytes = s->data_bytes;
			s->data = InvalidDsaPointer;
			s->data_bytes = 0;
			s->rows = 0;
			s->version++;
			s->loaded_at_ms = 0;
			s->fetched_at_ms = 0;
			s->restored = false;
			/* nor may the dump give them back */
			s->dump_checked = true;
			s->buried = true;
			*tombstone = s->tombstone_due;
			s->tombstone_due = false;
		}
		else if (rights_checked)
			s->restored = false;
		if (DsaPointerIsValid(s->data) && !s->restored)
		{
			/* last good rows serve for a TTL before the next attempt */
			s->fetched_at_ms = now;
			s->marked_stale = false;
			age = now - s->loaded_at_ms;
		}
		pg_atomic_write_u64(&s->last_attempt_ms, (uint64) now);
		old_error = s->last_error;
		old_error_bytes = s->last_error_bytes;
		s->last_error = dp;
		s->last_error_bytes = DsaPointerIsValid(dp) ? bytes : 0;
		s->error_unstored = !DsaPointerIsValid(dp);
		dp = InvalidDsaPointer;
	}
	LWLockRelease(slot_lock(ref.index));
	/* Readers waiting for this attempt are served by its outcome. */
	ConditionVariableBroadcast(&s->cv);

	pc_free(dp, bytes);
	pc_free(old_error, old_error_bytes);
	if (DsaPointerIsValid(old_data))
	{
		free_rows(old_data, old_data_bytes);
		uncharge(ref, pc_dsa_footprint(old_data_bytes));
	}
	return age;
}

/*
 * A load failed with the source, not the owner's rights, to blame: the
 * cached rows are the last good ones.  rights_checked says the load worker
 * ran the query as the owner and checked its rights after the failure;
 * rows restored from the dump become servable only then.  Returns the age
 * in ms of the rows still served, or -1 if none are.
 */
int64
pc_snap_record_failure(PcSnapRef ref, const char *message, int64 now,
					   bool rights_checked)
{
	bool		tombstone;

	return note_failure(ref, message, now, false, rights_checked,
						&tombstone);
}

/*
 * The owner lost the rights its query needs: the cached rows are let go
 * of at once (last-good is for a failing source, not for lost rights), and
 * the slot is buried: no dump keeps or carries this registration's rows,
 * and the dump is not looked at for them again, until a load succeeds.
 * True if a file may hold its rows that was written after the slot's last
 * tombstone, or in an earlier server lifetime: the caller then writes the
 * tombstone that outlives a crash (pc_snapshot_bury).  So a role that
 * loses and regains its rights over and over writes at most one tombstone
 * per dump of its rows.
 */
bool
pc_snap_record_lost_rights(PcSnapRef ref, const char *message, int64 now)
{
	bool		tombstone;

	(void) note_failure(ref, message, now, true, true, &tombstone);
	return tombstone;
}

/* ----------------------------------------------------------------
 * The snapshots view
 * ----------------------------------------------------------------
 */

/* What the slot of a registration holds; false if it has no slot. */
bool
pc_snap_describe(Oid dbid, const char *name, int64 reg_id, int64 reg_stamp,
				 PcSnapInfo *info)
{
	int			index;
	PcSnapSlot *s;
	bool		oom = false;
	bool		unstored = false;
	int64		last_attempt;

	memset(info, 0, sizeof(PcSnapInfo));
	pc_lock_alone(pc_shared->snap_map_lock, LW_SHARED);
	index = find_slot(dbid, name);
	if (index < 0 || !slot_is(&slots()[index], reg_id, reg_stamp))
	{
		LWLockRelease(pc_shared->snap_map_lock);
		return false;
	}
	s = &slots()[index];
	pc_lock_slot(slot_lock(index), LW_SHARED);
	info->loaded = DsaPointerIsValid(s->data);
	info->rows = s->rows;
	info->bytes = info->loaded ? s->data_bytes : 0;
	info->loaded_at_ms = s->loaded_at_ms;
	info->marked_stale = s->marked_stale;
	info->restored = info->loaded && s->restored;
	last_attempt = (int64) pg_atomic_read_u64(&s->last_attempt_ms);
	info->attempted = last_attempt != PC_NEVER;
	info->last_attempt_ms = last_attempt;
	info->refresh_errors = s->refresh_errors;
	info->last_failed = s->last_failed;
	if (DsaPointerIsValid(s->last_error))
	{
		const char *msg = dsa_get_address(pc_area(), s->last_error);

		info->last_error = pc_copy_no_oom(msg, strlen(msg), true, &oom);
	}
	unstored = s->error_unstored;
	LWLockRelease(slot_lock(index));
	LWLockRelease(pc_shared->snap_map_lock);

	if (oom)
		pc_report_oom("a snapshot's last error");
	if (info->last_error == NULL && unstored)
		info->last_error = pstrdup(PC_UNSTORED_ERROR);
	return true;
}

/* ----------------------------------------------------------------
 * The dump (snapshot_dump.c)
 * ----------------------------------------------------------------
 */

/*
 * Should the dump be looked at for this slot's rows?  Once per slot and
 * generation, and only while it has none and is not buried: true for the
 * first caller.
 */
bool
pc_snap_take_dump_check(PcSnapRef ref)
{
	PcSnapSlot *s = &slots()[ref.index];
	bool		take = false;

	pc_lock_slot(slot_lock(ref.index), LW_EXCLUSIVE);
	if (s->generation == ref.generation && !s->dump_checked)
	{
		s->dump_checked = true;
		take = !DsaPointerIsValid(s->data) && !s->buried;
		if (take)
			s->dump_check_pid = MyProcPid;
	}
	LWLockRelease(slot_lock(ref.index));
	return take;
}

/*
 * The check pc_snap_take_dump_check() gave this backend is over (its rows
 * published, or none found): readers waiting for it look again.
 */
void
pc_snap_dump_check_done(PcSnapRef ref)
{
	PcSnapSlot *s = &slots()[ref.index];

	pc_lock_slot(slot_lock(ref.index), LW_EXCLUSIVE);
	if (s->generation == ref.generation && s->dump_check_pid == MyProcPid)
		s->dump_check_pid = 0;
	LWLockRelease(slot_lock(ref.index));
	ConditionVariableBroadcast(&s->cv);
}

/*
 * Hand each loaded snapshot to emit(): which registration it caches, its
 * rows' age, and a copy of its rows (made under the slot's lock, with an
 * allocation that fails quietly: a slot that cannot be copied is left out).
 * A buried slot is handed over too, with no rows (blob NULL), so that the
 * dump carries none of its registration's.  A slot whose rows are dumped
 * is due a tombstone should it be buried later (noted before the copy, so
 * that a burial in between writes one).
 */
void
pc_snap_dump_slots(void (*emit) (const PcSnapDumped *snap, const char *blob,
								 void *arg),
				   void *arg, int64 now)
{
	int			i;

	for (i = 0; i < pc_shared->max_snapshots; i++)
	{
		PcSnapSlot *s = &slots()[i];
		PcSnapDumped snap;
		uint64		generation;
		char	   *blob = NULL;

		memset(&snap, 0, sizeof(snap));
		pc_lock_alone(pc_shared->snap_map_lock, LW_SHARED);
		if (s->in_use)
		{
			snap.dbid = s->dbid;
			strlcpy(snap.name, s->name, NAMEDATALEN);
			snap.reg_id = s->reg_id;
			snap.reg_stamp = s->reg_stamp;
		}
		generation = s->generation;
		LWLockRelease(pc_shared->snap_map_lock);
		if (!OidIsValid(snap.dbid))
			continue;

		pc_lock_slot(slot_lock(i), LW_EXCLUSIVE);
		if (s->generation == generation && DsaPointerIsValid(s->data))
			s->tombstone_due = true;
		LWLockRelease(slot_lock(i));
		pc_lock_slot(slot_lock(i), LW_SHARED);
		if (s->generation == generation && DsaPointerIsValid(s->data))
		{
			blob = palloc_extended(s->data_bytes,
								   MCXT_ALLOC_HUGE | MCXT_ALLOC_NO_OOM);
			if (blob != NULL)
			{
				memcpy(blob, dsa_get_address(pc_area(), s->data),
					   s->data_bytes);
				snap.size = s->data_bytes;
				snap.rows = s->rows;
				snap.age_ms = Max(now - s->loaded_at_ms, 0);
			}
		}
		else if (s->generation == generation && s->buried)
			snap.buried = true;
		LWLockRelease(slot_lock(i));
		if (blob != NULL || snap.buried)
			emit(&snap, blob, arg);
		if (blob != NULL)
			pfree(blob);
	}
}
