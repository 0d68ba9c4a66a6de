/*-------------------------------------------------------------------------
 *
 * snapshot_claim.c
 *	  A snapshot slot's freshness, its cold-start claim and its refresh
 *	  lease.
 *
 * Which reader loads a snapshot: at most one cold-start load per TTL
 * window (a compare-and-swap on the time of the last attempt), at most one
 * refresh at a time (a lease with its holder's pid), and readers of rows
 * restored from the dump waiting, bounded, for the first load as the
 * owner.  A WAL redo of the primary's refresh marks a slot stale here.
 *
 * Copyright (c) 2026, projcache developers
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "miscadmin.h"
#include "storage/condition_variable.h"
#include "storage/procarray.h"

#include "snapshot.h"
#include "snapshot_slot.h"

/*
 * Is the snapshot loaded (restored rows count), and fetched within ttl_ms
 * (restored rows never are)?
 */
bool
pc_snap_is_fresh(PcSnapRef ref, int64 now, int64 ttl_ms, bool *loaded)
{
	PcSnapSlot *s = &pc_snap_slots()[ref.index];
	bool		fresh;

	pc_lock_inner(pc_snap_slot_lock(ref.index), LW_SHARED);
	*loaded = s->generation == ref.generation && DsaPointerIsValid(s->data);
	fresh = *loaded && !s->restored && !s->marked_stale &&
		now - s->fetched_at_ms < ttl_ms;
	LWLockRelease(pc_snap_slot_lock(ref.index));
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
	PcSnapSlot *s = &pc_snap_slots()[ref.index];
	bool		awaits;

	pc_lock_inner(pc_snap_slot_lock(ref.index), LW_SHARED);
	awaits = s->generation == ref.generation && DsaPointerIsValid(s->data) &&
		s->restored;
	LWLockRelease(pc_snap_slot_lock(ref.index));
	return awaits;
}

/*
 * What a reader may wait for in the slot, under its lock: another backend
 * reading the dump for its rows, or, before s->restore_wait_until, the
 * first load as the owner of restored rows that another backend is trying
 * (it holds the lease).  PC_SNAP_WAIT_LEASE_FREE: restored rows await that
 * load and nobody holds the lease (its holder dropped it, was cancelled, or
 * is gone since the reader failed to take it): the reader should try the
 * load itself.  *lease_left: how long the lease lasts if nobody drops it
 * (its end wakes nobody).
 */
static PcSnapWait
worth_waiting(PcSnapSlot *s, PcSnapRef ref, int64 real_now,
			  int64 *lease_left)
{
	int			checker = s->dump_check_pid;
	int			holder;
	int64		until;

	*lease_left = PG_INT64_MAX;
	if (s->generation != ref.generation)
		return PC_SNAP_WAIT_NONE;
	if (checker != 0 && checker != MyProcPid &&
		BackendPidGetProc(checker) != NULL)
		return PC_SNAP_WAIT_WOKEN;
	if (!DsaPointerIsValid(s->data) || !s->restored ||
		real_now >= s->restore_wait_until)
		return PC_SNAP_WAIT_NONE;
	holder = (int) pg_atomic_read_u32(&s->lease_pid);
	until = (int64) pg_atomic_read_u64(&s->lease_until_ms);
	*lease_left = until - pc_now_ms();
	if (holder == MyProcPid)
		return PC_SNAP_WAIT_NONE;
	if (holder != 0 && *lease_left > 0 && BackendPidGetProc(holder) != NULL)
		return PC_SNAP_WAIT_WOKEN;
	return PC_SNAP_WAIT_LEASE_FREE;
}

/*
 * Right after a restart: wait, until deadline (on pc_real_now_ms()), for
 * what another backend does that this read needs, rather than fail
 * (projcache.restore_wait): its reading the dump for the slot's rows, or
 * its load as the owner of rows restored from it.  PC_SNAP_WAIT_NONE:
 * there was nothing to wait for; PC_SNAP_WAIT_LEASE_FREE: restored rows
 * await a load that nobody is trying (the holder that made the caller's
 * lease_take fail has dropped it since): try it; PC_SNAP_WAIT_WOKEN: what
 * it waited for ended: look again; PC_SNAP_WAIT_TIMEOUT: the deadline
 * passed.  Interruptible; no lock is held while sleeping.
 */
PcSnapWait
pc_snap_wait_restore(PcSnapRef ref, int64 deadline)
{
	PcSnapSlot *s = &pc_snap_slots()[ref.index];
	PcSnapWait	result = PC_SNAP_WAIT_NONE;

	ConditionVariablePrepareToSleep(&s->cv);
	for (;;)
	{
		int64		real_now = pc_real_now_ms();
		int64		lease_left;
		PcSnapWait	what;

		pc_lock_inner(pc_snap_slot_lock(ref.index), LW_SHARED);
		what = worth_waiting(s, ref, real_now, &lease_left);
		LWLockRelease(pc_snap_slot_lock(ref.index));
		if (what != PC_SNAP_WAIT_WOKEN)
		{
			/* (after a sleep, whatever ended is news: look again) */
			if (result == PC_SNAP_WAIT_NONE)
				result = what;
			break;
		}
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
	PcSnapSlot *s = &pc_snap_slots()[ref.index];
	PcClaim		result;
	uint64		prev;
	int64		prev_ms;

	if (ttl_ms < 1)
		ttl_ms = 1;
	/* reset_slot() changes the generation under the exclusive lock. */
	pc_lock_inner(pc_snap_slot_lock(ref.index), LW_SHARED);
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
	LWLockRelease(pc_snap_slot_lock(ref.index));
	return result;
}

/*
 * Give back a won claim whose load was cancelled: a cancel says nothing
 * about the source, so it must not close the window for everyone.
 */
void
pc_snap_cold_unclaim(PcSnapRef ref, int64 claimed_at, int64 prev_attempt)
{
	PcSnapSlot *s = &pc_snap_slots()[ref.index];
	uint64		expected = (uint64) claimed_at;

	pc_lock_inner(pc_snap_slot_lock(ref.index), LW_SHARED);
	if (s->generation == ref.generation)
		(void) pg_atomic_compare_exchange_u64(&s->last_attempt_ms, &expected,
											  (uint64) prev_attempt);
	LWLockRelease(pc_snap_slot_lock(ref.index));
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
	PcSnapSlot *s = &pc_snap_slots()[ref.index];
	bool		taken = false;

	pc_lock_inner(pc_snap_slot_lock(ref.index), LW_SHARED);
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
	LWLockRelease(pc_snap_slot_lock(ref.index));
	return taken;
}

void
pc_snap_lease_drop(PcSnapRef ref)
{
	PcSnapSlot *s = &pc_snap_slots()[ref.index];

	pc_lock_inner(pc_snap_slot_lock(ref.index), LW_SHARED);
	if (s->generation == ref.generation &&
		pg_atomic_read_u32(&s->lease_pid) == (uint32) MyProcPid)
	{
		pg_atomic_write_u32(&s->lease_pid, 0);
		pg_atomic_write_u64(&s->lease_until_ms, 0);
	}
	LWLockRelease(pc_snap_slot_lock(ref.index));
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
	PcSnapSlot *s = &pc_snap_slots()[ref.index];
	uint64		marks;

	pc_lock_inner(pc_snap_slot_lock(ref.index), LW_SHARED);
	marks = s->stale_marks;
	LWLockRelease(pc_snap_slot_lock(ref.index));
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

	pc_lock_outer(pc_snap_shared->map_lock, LW_SHARED);
	index = pc_snap_find_slot(dbid, name);
	if (index >= 0)
	{
		PcSnapSlot *s = &pc_snap_slots()[index];

		pc_lock_inner(pc_snap_slot_lock(index), LW_EXCLUSIVE);
		s->marked_stale = true;
		s->stale_marks++;
		LWLockRelease(pc_snap_slot_lock(index));
	}
	LWLockRelease(pc_snap_shared->map_lock);
}
