/*-------------------------------------------------------------------------
 *
 * locks.h
 *	  The order projcache's locks are taken in, checked in assert builds.
 *
 * Each part registers the LWLocks it owns, once, when it sets up its shared
 * memory, saying how they may nest:
 *
 * - PC_LOCK_ALONE: taken with no lock of ours held, and no lock of ours is
 *	 taken under it (every lock of ours but the two below);
 * - PC_LOCK_OUTER: taken with no lock of ours held; only PC_LOCK_INNER
 *	 locks are taken under it (the snapshot map lock);
 * - PC_LOCK_INNER: taken with no lock of ours held but PC_LOCK_OUTER ones,
 *	 and never two at once (the snapshot slots' locks).
 *
 * Below all of them come the DSA area's own lock (an allocation under a
 * partition or slot lock) and, last, the parts' spinlocks, under which
 * nothing is taken.  pc_lock_alone(), pc_lock_outer() and pc_lock_inner()
 * take a lock of each kind and assert that the backend may take it now;
 * pc_lock_order_ok() knows the registered locks only by kind, never by
 * name, so a new part adds its locks without changing this file.  The key
 * map's partition locks live in the DSA area and are many, so the map
 * counts those it holds and registers the count instead.
 *
 * Copyright (c) 2026, projcache developers
 *
 *-------------------------------------------------------------------------
 */
#ifndef PROJCACHE_LOCKS_H
#define PROJCACHE_LOCKS_H

#include "storage/lwlock.h"

typedef enum PcLockKind
{
	PC_LOCK_ALONE,				/* with no lock of ours held */
	PC_LOCK_OUTER,				/* alone; inner locks nest under it */
	PC_LOCK_INNER				/* with none held but outer ones */
} PcLockKind;

extern void pc_locks_forget(void);
extern void pc_locks_register(LWLockPadded *locks, int n, PcLockKind kind);
extern void pc_locks_register_count(const int *held, PcLockKind kind);
extern bool pc_lock_order_ok(PcLockKind kind);

/*
 * Request and look up a part's named tranche of n locks (the name is what
 * pg_stat_activity.wait_event shows while a backend waits on one), and
 * register them for the order checks.
 */
extern void pc_locks_request(const char *tranche, int n);
extern LWLockPadded *pc_locks_get(const char *tranche, int n, PcLockKind kind);

/* Take a lock that nests in no other of ours. */
static inline void
pc_lock_alone(LWLock *lock, LWLockMode mode)
{
	Assert(pc_lock_order_ok(PC_LOCK_ALONE));
	LWLockAcquire(lock, mode);
}

/* Take a lock under which inner locks may be taken. */
static inline void
pc_lock_outer(LWLock *lock, LWLockMode mode)
{
	Assert(pc_lock_order_ok(PC_LOCK_OUTER));
	LWLockAcquire(lock, mode);
}

/* Take an inner lock, alone or under one outer lock. */
static inline void
pc_lock_inner(LWLock *lock, LWLockMode mode)
{
	Assert(pc_lock_order_ok(PC_LOCK_INNER));
	LWLockAcquire(lock, mode);
}

#endif							/* PROJCACHE_LOCKS_H */
