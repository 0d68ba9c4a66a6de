/*-------------------------------------------------------------------------
 *
 * snapshot_slot.h
 *	  The shared slots that hold loaded snapshots, as the files that keep
 *	  them see them: snapshot_store.c (taking, filling and freeing slots),
 *	  snapshot_claim.c (freshness, the cold-start claim and the refresh
 *	  lease) and snapshot_copy.c (this backend's copies of the rows).
 *	  Every other file goes through snapshot.h.
 *
 * Locking:
 * - the snapshot map lock: in_use, dbid, name, reg_id, reg_stamp, owner, charged
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
#ifndef PROJCACHE_SNAPSHOT_SLOT_H
#define PROJCACHE_SNAPSHOT_SLOT_H

#include "storage/condition_variable.h"

#include "snapshot.h"

typedef struct PcSnapSlot
{
	/* under the map lock */
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

/*
 * The slots' part of shared memory ("projcache snapshots"): this struct,
 * then the slots.  map_lock (tranche "projcache_snapshot_map", an outer
 * lock: see locks.h) says which snapshot each slot holds (dbid, name,
 * registry id, generation); slot_locks[i] (tranche
 * "projcache_snapshot_slots", inner locks) protect the rest of slot i, and
 * the DSA chunks it points to.  memory_used and registry_generation are
 * atomics.
 */
typedef struct PcSnapShared
{
	int			max_snapshots;
	LWLock	   *map_lock;		/* which slot caches which snapshot */
	LWLockPadded *slot_locks;	/* one per slot */
	pg_atomic_uint64 memory_used;	/* projcache.snapshot_memory taken by
									 * rows, in flight or published */
	pg_atomic_uint64 registry_generation;	/* bumped after a transaction that
											 * changed a snapshot registry
											 * commits */
	/* PcSnapSlot[max_snapshots] follows, at a MAXALIGNed offset */
} PcSnapShared;

extern PcSnapShared *pc_snap_shared;

static inline PcSnapSlot *
pc_snap_slots(void)
{
	return (PcSnapSlot *) ((char *) pc_snap_shared +
						   MAXALIGN(sizeof(PcSnapShared)));
}

static inline LWLock *
pc_snap_slot_lock(int index)
{
	return &pc_snap_shared->slot_locks[index].lock;
}


/* The slot caching snapshot (dbid, name), or -1; caller holds the snapshot map lock. */
extern int	pc_snap_find_slot(Oid dbid, const char *name);

#endif							/* PROJCACHE_SNAPSHOT_SLOT_H */
