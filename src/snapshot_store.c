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
 * Locking: see snapshot_slot.h.  Freshness, the cold-start claim and the
 * refresh lease are in snapshot_claim.c, this backend's copies of the rows
 * in snapshot_copy.c, the slots' side of the dump in snapshot_dump.c.
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
#include "snapshot_slot.h"

/* ----------------------------------------------------------------
 * The slots in shared memory
 * ----------------------------------------------------------------
 */

PcSnapShared *pc_snap_shared = NULL;

#define PC_SNAP_MAP_TRANCHE		"projcache_snapshot_map"
#define PC_SNAP_SLOTS_TRANCHE	"projcache_snapshot_slots"

static Size
snap_shmem_size(void)
{
	return add_size(MAXALIGN(sizeof(PcSnapShared)),
					mul_size(sizeof(PcSnapSlot), pc_max_snapshots));
}

void
pc_snap_shmem_request(void)
{
	RequestAddinShmemSpace(snap_shmem_size());
	pc_locks_request(PC_SNAP_MAP_TRANCHE, 1);
	pc_locks_request(PC_SNAP_SLOTS_TRANCHE, pc_max_snapshots);
}

void
pc_snap_shmem_startup(void)
{
	bool		found;
	LWLockPadded *map_lock;
	LWLockPadded *slot_locks;
	PcSnapSlot *s;
	int			i;

	pc_snap_shared = ShmemInitStruct("projcache snapshots", snap_shmem_size(),
									 &found);
	map_lock = pc_locks_get(PC_SNAP_MAP_TRANCHE, 1, PC_LOCK_OUTER);
	slot_locks = pc_locks_get(PC_SNAP_SLOTS_TRANCHE, pc_max_snapshots,
							  PC_LOCK_INNER);
	if (found)
		return;
	pc_snap_shared->max_snapshots = pc_max_snapshots;
	pc_snap_shared->map_lock = &map_lock->lock;
	pc_snap_shared->slot_locks = slot_locks;
	pg_atomic_init_u64(&pc_snap_shared->memory_used, 0);
	pg_atomic_init_u64(&pc_snap_shared->registry_generation, 0);
	s = pc_snap_slots();
	for (i = 0; i < pc_max_snapshots; i++)
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

/*
 * Take footprint bytes of projcache.snapshot_memory for rows about to be
 * allocated; false, with nothing taken, if they do not fit.  The slots
 * decide whose rows they are (pc_snap_charge_owner and the like).
 */
bool
pc_snap_memory_reserve(Size footprint)
{
	if (pg_atomic_add_fetch_u64(&pc_snap_shared->memory_used, footprint) >
		pc_memory_snapshot_share())
	{
		pg_atomic_fetch_sub_u64(&pc_snap_shared->memory_used, footprint);
		return false;
	}
	return true;
}

void
pc_snap_memory_release(Size footprint)
{
	Assert(pg_atomic_read_u64(&pc_snap_shared->memory_used) >= footprint);
	pg_atomic_fetch_sub_u64(&pc_snap_shared->memory_used, footprint);
}

/* The part of projcache.max_memory snapshot rows take now. */
Size
pc_snap_memory_used(void)
{
	return (Size) pg_atomic_read_u64(&pc_snap_shared->memory_used);
}

/*
 * What the slots' last error messages take from the keys' memory
 * (pc_store_message() charges them there, not to snapshot_memory), for the
 * key map's self-check: each slot's lock in shared mode, one at a time.
 */
Size
pc_snap_messages_footprint(void)
{
	PcSnapSlot *slots = pc_snap_slots();
	Size		total = 0;
	int			i;

	for (i = 0; i < pc_snap_shared->max_snapshots; i++)
	{
		pc_lock_inner(pc_snap_slot_lock(i), LW_SHARED);
		if (DsaPointerIsValid(slots[i].last_error))
			total += pc_dsa_footprint(slots[i].last_error_bytes);
		LWLockRelease(pc_snap_slot_lock(i));
	}
	return total;
}

/*
 * A transaction that changed a snapshot registry committed: each backend's
 * copy of the registry is read again (snapshot_regcache.c).
 */
void
pc_snap_registry_changed(void)
{
	if (pc_snap_shared != NULL)
		pg_atomic_fetch_add_u64(&pc_snap_shared->registry_generation, 1);
}

uint64
pc_snap_registry_generation(void)
{
	return pg_atomic_read_u64(&pc_snap_shared->registry_generation);
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
	PcSnapSlot *s = &pc_snap_slots()[ref.index];

	pc_lock_outer(pc_snap_shared->map_lock, LW_EXCLUSIVE);
	if (s->generation == ref.generation)
	{
		Assert(s->charged >= footprint);
		s->charged -= footprint;
	}
	LWLockRelease(pc_snap_shared->map_lock);
}

/*
 * Empty a slot for a new owner.  Caller holds the snapshot map lock exclusively;
 * the slot's lock is taken here.  What the slot held goes to *left.
 */
static void
reset_slot(int index, Oid dbid, const char *name, int64 reg_id,
		   int64 reg_stamp, Oid owner, bool in_use, SlotLeftovers *left)
{
	PcSnapSlot *s = &pc_snap_slots()[index];

	Assert(LWLockHeldByMeInMode(pc_snap_shared->map_lock, LW_EXCLUSIVE));
	pc_lock_inner(pc_snap_slot_lock(index), LW_EXCLUSIVE);
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
	LWLockRelease(pc_snap_slot_lock(index));
	/* Readers waiting on the old snapshot look again (and find it gone). */
	ConditionVariableBroadcast(&s->cv);
}

/*
 * The slot caching snapshot (dbid, name), or -1.  Caller holds
 * the snapshot map lock.
 */
int
pc_snap_find_slot(Oid dbid, const char *name)
{
	int			i;

	Assert(LWLockHeldByMe(pc_snap_shared->map_lock));
	for (i = 0; i < pc_snap_shared->max_snapshots; i++)
	{
		PcSnapSlot *s = &pc_snap_slots()[i];

		if (s->in_use && s->dbid == dbid && strcmp(s->name, name) == 0)
			return i;
	}
	return -1;
}

/* Does the slot cache this registration?  Caller holds the snapshot map lock. */
static bool
slot_is(PcSnapSlot *s, int64 reg_id, int64 reg_stamp)
{
	Assert(LWLockHeldByMe(pc_snap_shared->map_lock));
	return s->reg_id == reg_id && s->reg_stamp == reg_stamp;
}

/*
 * A free slot, or -1.  Slots of databases that no longer exist are freed
 * on the way (their database cannot be checked under the LWLock, so the
 * candidates are checked in between).  Caller holds the snapshot map lock
 * exclusively; it is released and retaken here.
 */
static int
free_slot(void)
{
	Oid		   *dbids;
	uint64	   *generations;
	int			n = pc_snap_shared->max_snapshots;
	int			i;

	Assert(LWLockHeldByMeInMode(pc_snap_shared->map_lock, LW_EXCLUSIVE));
	for (i = 0; i < n; i++)
		if (!pc_snap_slots()[i].in_use)
			return i;

	dbids = palloc_extended(n * sizeof(Oid), MCXT_ALLOC_NO_OOM);
	generations = palloc_extended(n * sizeof(uint64), MCXT_ALLOC_NO_OOM);
	if (dbids == NULL || generations == NULL)
		return -1;
	for (i = 0; i < n; i++)
	{
		dbids[i] = pc_snap_slots()[i].dbid;
		generations[i] = pc_snap_slots()[i].generation;
	}
	LWLockRelease(pc_snap_shared->map_lock);
	for (i = 0; i < n; i++)
		if (SearchSysCacheExists1(DATABASEOID, ObjectIdGetDatum(dbids[i])))
			dbids[i] = InvalidOid;
	pc_lock_outer(pc_snap_shared->map_lock, LW_EXCLUSIVE);

	for (i = 0; i < n; i++)
	{
		if (!pc_snap_slots()[i].in_use)
			return i;
		if (OidIsValid(dbids[i]) && pc_snap_slots()[i].generation == generations[i])
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
 * the snapshot map lock, so a recent slot is checked under its lock alone: a read
 * of the same snapshot does not take the snapshot map lock nor scan the slots.
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
		s = &pc_snap_slots()[r->ref.index];
		pc_lock_inner(pc_snap_slot_lock(r->ref.index), LW_SHARED);
		same = s->in_use && s->generation == r->ref.generation &&
			s->dbid == dbid && s->reg_id == reg_id &&
			s->reg_stamp == reg_stamp && s->owner == owner &&
			strcmp(s->name, name) == 0;
		LWLockRelease(pc_snap_slot_lock(r->ref.index));
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
		return Max(pc_snap_shared->max_snapshots / 2, 1);
	return Min(pc_max_snapshots_per_database, pc_snap_shared->max_snapshots);
}

/* projcache.max_snapshots_per_owner, as slots. */
static int
slots_per_owner(void)
{
	if (pc_max_snapshots_per_owner < 0)
		return Max(pc_snap_shared->max_snapshots / 4, 1);
	return Min(pc_max_snapshots_per_owner, pc_snap_shared->max_snapshots);
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
 * (the one they would take) aside?  Caller holds the snapshot map lock.
 */
static SlotRefusal
check_slot_shares(Oid dbid, Oid owner, int except)
{
	int			in_db = 0;
	int			of_owner = 0;
	int			i;

	Assert(LWLockHeldByMe(pc_snap_shared->map_lock));
	for (i = 0; i < pc_snap_shared->max_snapshots; i++)
	{
		PcSnapSlot *s = &pc_snap_slots()[i];

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
							   pc_snap_shared->max_snapshots),
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

	pc_lock_outer(pc_snap_shared->map_lock, LW_SHARED);
	index = pc_snap_find_slot(dbid, name);
	if (index >= 0 && slot_is(&pc_snap_slots()[index], reg_id, reg_stamp) &&
		pc_snap_slots()[index].owner == owner)
	{
		ref.index = index;
		ref.generation = pc_snap_slots()[index].generation;
		LWLockRelease(pc_snap_shared->map_lock);
		remember_ref(dbid, reg_id, reg_stamp, ref);
		return ref;
	}
	LWLockRelease(pc_snap_shared->map_lock);

	/* A catalog lookup: not under the LWLock. */
	exempt = superuser_arg(owner);

	pc_lock_outer(pc_snap_shared->map_lock, LW_EXCLUSIVE);
	index = pc_snap_find_slot(dbid, name);
	if (index < 0)
	{
		int			found;

		index = free_slot();
		/* free_slot() may release the lock: look again. */
		found = pc_snap_find_slot(dbid, name);
		if (found >= 0)
			index = found;
	}
	if (index < 0)
		refusal = SLOT_NONE_FREE;
	else if (pc_snap_slots()[index].in_use && pc_snap_slots()[index].dbid == dbid &&
			 strcmp(pc_snap_slots()[index].name, name) == 0 &&
			 slot_is(&pc_snap_slots()[index], reg_id, reg_stamp))
	{
		/* Its owner changed (REASSIGN OWNED): the slot is counted anew. */
		if (pc_snap_slots()[index].owner != owner)
		{
			pc_lock_inner(pc_snap_slot_lock(index), LW_EXCLUSIVE);
			pc_snap_slots()[index].owner = owner;
			LWLockRelease(pc_snap_slot_lock(index));
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
		LWLockRelease(pc_snap_shared->map_lock);
		if (none_ok)
		{
			ref.index = -1;
			ref.generation = 0;
			return ref;
		}
		report_slot_refusal(refusal, dbid, owner);
	}
	ref.index = index;
	ref.generation = pc_snap_slots()[index].generation;
	LWLockRelease(pc_snap_shared->map_lock);

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

	pc_lock_outer(pc_snap_shared->map_lock, LW_EXCLUSIVE);
	index = pc_snap_find_slot(dbid, name);
	if (index >= 0 && slot_is(&pc_snap_slots()[index], reg_id, reg_stamp))
		reset_slot(index, InvalidOid, "", 0, 0, InvalidOid, false, &left);
	LWLockRelease(pc_snap_shared->map_lock);

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
	int			n = pc_snap_shared->max_snapshots;
	PcSnapKey  *keys = palloc(n * sizeof(PcSnapKey));
	List	   *result = NIL;
	int			nkeys = 0;
	int			i;

	pc_lock_outer(pc_snap_shared->map_lock, LW_SHARED);
	for (i = 0; i < n; i++)
	{
		PcSnapSlot *s = &pc_snap_slots()[i];

		if (!s->in_use || s->dbid != dbid)
			continue;
		strlcpy(keys[nkeys].name, s->name, NAMEDATALEN);
		keys[nkeys].reg_id = s->reg_id;
		keys[nkeys].reg_stamp = s->reg_stamp;
		nkeys++;
	}
	LWLockRelease(pc_snap_shared->map_lock);

	for (i = 0; i < nkeys; i++)
		result = lappend(result, &keys[i]);
	return result;
}

/* ----------------------------------------------------------------
 * Publishing rows: projcache.snapshot_memory and its share per owner
 * ----------------------------------------------------------------
 */

/* projcache.snapshot_memory_per_owner, in bytes. */
static Size
snap_memory_per_owner(void)
{
	if (pc_snap_memory_per_owner_kb < 0)
		return pc_memory_snapshot_share() / 2;
	return Min((Size) pc_snap_memory_per_owner_kb * 1024,
			   pc_memory_snapshot_share());
}

/* The owner of slot ref, or InvalidOid if the slot was reassigned. */
static Oid
slot_owner(PcSnapRef ref)
{
	PcSnapSlot *s = &pc_snap_slots()[ref.index];
	Oid			owner = InvalidOid;

	pc_lock_outer(pc_snap_shared->map_lock, LW_SHARED);
	if (s->generation == ref.generation)
		owner = s->owner;
	LWLockRelease(pc_snap_shared->map_lock);
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
	PcSnapSlot *s = &pc_snap_slots()[ref.index];
	SnapRoom	room;
	Size		held = 0;
	int			i;

	pc_lock_outer(pc_snap_shared->map_lock, LW_EXCLUSIVE);
	for (i = 0; i < pc_snap_shared->max_snapshots; i++)
		if (pc_snap_slots()[i].in_use && pc_snap_slots()[i].owner == owner)
			held += pc_snap_slots()[i].charged;
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
	LWLockRelease(pc_snap_shared->map_lock);
	return room;
}

/*
 * Charge footprint bytes for rows of size bytes to the slot's owner (in
 * projcache.snapshot_memory and in the owner's share).  False if they were
 * not: *refusal says why, or is NULL if the slot was dropped meanwhile.
 * Runs in a transaction (it looks the owner up).
 */
static bool
charge_for_rows(PcSnapRef ref, Size size, Size footprint, char **refusal)
{
	Oid			owner;
	Size		owner_bytes;
	SnapRoom	room;

	*refusal = NULL;
	do
	{
		owner = slot_owner(ref);
		if (!OidIsValid(owner))
			return false;		/* dropped meanwhile */
		room = charge(ref, owner, superuser_arg(owner), footprint,
					  &owner_bytes);
	} while (room == ROOM_OWNER_CHANGED);
	switch (room)
	{
		case ROOM_TAKEN:
			return true;
		case ROOM_GONE:
		case ROOM_OWNER_CHANGED:
			return false;
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
								size, pc_memory_snapshot_share() / 1024,
								pc_snap_memory_used());
			return false;
	}
	return false;
}

/*
 * Swap the chunk dp (bytes, rows) into the slot, under its lock, unless it
 * was reassigned meanwhile or, for restored rows, filled or buried; the
 * chunks it held go to *left, to free once the lock is released.  Returns
 * whether it was swapped in.
 */
static bool
swap_in_rows(PcSnapRef ref, dsa_pointer dp, Size bytes, int64 rows,
			 int64 now, uint64 stale_marks, bool restored,
			 SlotLeftovers *left)
{
	PcSnapSlot *s = &pc_snap_slots()[ref.index];
	bool		swapped = false;

	pc_lock_inner(pc_snap_slot_lock(ref.index), LW_EXCLUSIVE);
	if (s->generation == ref.generation &&
		(!restored || (!s->buried && !DsaPointerIsValid(s->data))))
	{
		left->data = s->data;
		left->data_bytes = s->data_bytes;
		left->error = s->last_error;
		left->error_bytes = s->last_error_bytes;
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
		swapped = true;
	}
	LWLockRelease(pc_snap_slot_lock(ref.index));
	if (swapped)
		ConditionVariableBroadcast(&s->cv);
	return swapped;
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
	Size		bytes = Max(size, 1);
	Size		footprint = pc_dsa_footprint(bytes);
	SlotLeftovers left = {InvalidDsaPointer, 0, InvalidDsaPointer, 0};
	dsa_pointer dp;

	Assert(IsTransactionState());
	*published = false;
	if (!charge_for_rows(ref, size, footprint, refusal))
		return *refusal == NULL;

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

	*published = swap_in_rows(ref, dp, bytes, rows, now, stale_marks,
							  restored, &left);
	if (!*published)
	{
		/* dropped, filled or buried meanwhile: discard ours */
		free_rows(dp, bytes);
		uncharge(ref, footprint);
	}
	else if (DsaPointerIsValid(left.data))
	{
		free_rows(left.data, left.data_bytes);
		uncharge(ref, pc_dsa_footprint(left.data_bytes));
	}
	pc_free(left.error, left.error_bytes);
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
	PcSnapSlot *s = &pc_snap_slots()[ref.index];
	Size		bytes;
	dsa_pointer dp = pc_store_message(message, &bytes);
	dsa_pointer old_error = InvalidDsaPointer;
	Size		old_error_bytes = 0;
	dsa_pointer old_data = InvalidDsaPointer;
	Size		old_data_bytes = 0;
	int64		age = -1;

	*tombstone = false;
	pc_lock_inner(pc_snap_slot_lock(ref.index), LW_EXCLUSIVE);
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
	LWLockRelease(pc_snap_slot_lock(ref.index));
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
 * tombstone that outlives a crash (pc_snap_bury).  So a role that
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
	pc_lock_outer(pc_snap_shared->map_lock, LW_SHARED);
	index = pc_snap_find_slot(dbid, name);
	if (index < 0 || !slot_is(&pc_snap_slots()[index], reg_id, reg_stamp))
	{
		LWLockRelease(pc_snap_shared->map_lock);
		return false;
	}
	s = &pc_snap_slots()[index];
	pc_lock_inner(pc_snap_slot_lock(index), LW_SHARED);
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
	LWLockRelease(pc_snap_slot_lock(index));
	LWLockRelease(pc_snap_shared->map_lock);

	if (oom)
		pc_report_oom("a snapshot's last error");
	if (info->last_error == NULL && unstored)
		info->last_error = pstrdup(PC_UNSTORED_ERROR);
	return true;
}
