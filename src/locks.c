/*-------------------------------------------------------------------------
 *
 * locks.c
 *	  The table of projcache's locks, for the lock order checks (locks.h).
 *
 * The table is this process's: each part fills it from its shared memory
 * startup function, which runs in the postmaster (whose children inherit
 * the table) and again in each child where shared memory is attached
 * anew (EXEC_BACKEND).  After a crash restart the startup functions run
 * again, so the table is emptied first (pc_locks_forget()).
 *
 * Copyright (c) 2026, projcache developers
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "locks.h"

/* More than every part registers today; a new part may need more. */
#define PC_MAX_LOCK_GROUPS	16

typedef struct LockGroup
{
	LWLockPadded *locks;		/* n locks, or NULL for a count */
	int			n;
	const int  *held;			/* how many of a part's locks it holds */
	PcLockKind	kind;
} LockGroup;

static LockGroup groups[PC_MAX_LOCK_GROUPS];
static int	ngroups = 0;

void
pc_locks_forget(void)
{
	ngroups = 0;
}

static void
add_group(LWLockPadded *locks, int n, const int *held, PcLockKind kind)
{
	if (ngroups >= PC_MAX_LOCK_GROUPS)
		elog(FATAL, "projcache registers more than %d groups of locks",
			 PC_MAX_LOCK_GROUPS);
	groups[ngroups].locks = locks;
	groups[ngroups].n = n;
	groups[ngroups].held = held;
	groups[ngroups].kind = kind;
	ngroups++;
}

/* Register n locks of one kind, one after another from locks. */
void
pc_locks_register(LWLockPadded *locks, int n, PcLockKind kind)
{
	add_group(locks, n, NULL, kind);
}

/*
 * Register locks that their part counts as this backend takes and
 * releases them (*held is how many it holds now).
 */
void
pc_locks_register_count(const int *held, PcLockKind kind)
{
	add_group(NULL, 0, held, kind);
}

void
pc_locks_request(const char *tranche, int n)
{
	RequestNamedLWLockTranche(tranche, n);
}

LWLockPadded *
pc_locks_get(const char *tranche, int n, PcLockKind kind)
{
	LWLockPadded *locks = GetNamedLWLockTranche(tranche);

	pc_locks_register(locks, n, kind);
	return locks;
}

/* How many locks of this kind this backend holds now. */
static int
held_of_kind(PcLockKind kind)
{
	int			count = 0;
	int			g;

	for (g = 0; g < ngroups; g++)
	{
		int			i;

		if (groups[g].kind != kind)
			continue;
		if (groups[g].held != NULL)
		{
			count += *groups[g].held;
			continue;
		}
		for (i = 0; i < groups[g].n; i++)
			if (LWLockHeldByMe(&groups[g].locks[i].lock))
				count++;
	}
	return count;
}

/*
 * Whether this backend may take a lock of the given kind now: it holds no
 * lock of ours, or, for an inner lock, none but outer ones.
 */
bool
pc_lock_order_ok(PcLockKind kind)
{
	if (held_of_kind(PC_LOCK_ALONE) > 0 || held_of_kind(PC_LOCK_INNER) > 0)
		return false;
	return kind == PC_LOCK_INNER || held_of_kind(PC_LOCK_OUTER) == 0;
}
