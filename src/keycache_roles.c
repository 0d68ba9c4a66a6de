/*-------------------------------------------------------------------------
 *
 * keycache_roles.c
 *	  Keys per role: each key of the map counts for the role that created it.
 *
 * A reader that creates a key counts it, and the bytes its chunk takes, for
 * its role (the current role outside SECURITY DEFINER functions) in one of
 * the role slots (keycache.h), under their lock and before the entry
 * exists (pc_role_reserve(), called by keycache_map.c); the worker counts
 * what the entry's new chunk takes more or less when it writes a value,
 * and takes the key and its bytes off when it deletes the entry.  A role
 * at projcache.max_keys_per_role, or whose keys take half of the keys'
 * memory, creates no key, and the worker is asked to evict its oldest.
 *
 * The slots are a part of shared memory of their own ("projcache roles");
 * keycache.h says which lock protects what.
 *
 * Copyright (c) 2026, projcache developers
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "common/hashfn.h"
#include "miscadmin.h"
#include "storage/shmem.h"

#include "keycache.h"
#include "keycache_policy.h"

typedef struct PcRolesShared
{
	LWLock	   *lock;			/* which role each slot counts for */
	pg_atomic_uint32 room_wanted;	/* some slot's room_wanted is set */
	PcRoleSlot	slots[PC_ROLE_SLOTS];
} PcRolesShared;

static PcRolesShared *roles_shared = NULL;

#define PC_ROLES_TRANCHE	"projcache_roles"

/* projcache.max_keys_per_role in force; 0 for no bound. */
uint32
pc_keys_per_role_bound(void)
{
	if (pc_max_keys_per_role < 0)
		return (uint32) Max(1, pc_key_memory_bound() / PC_KEY_COUNT_UNIT / 2);
	return (uint32) pc_max_keys_per_role;
}

/*
 * The bytes one role's keys may take: half of the keys' part of
 * projcache.max_memory, unless projcache.max_keys_per_role is 0 (no bound
 * at all).  Bytes as memory_used counts them: each key's chunks.
 */
uint64
pc_bytes_per_role_bound(void)
{
	if (pc_max_keys_per_role == 0)
		return 0;
	return (uint64) Max(1, pc_key_memory_bound() / 2);
}

void
pc_roles_shmem_request(void)
{
	RequestAddinShmemSpace(MAXALIGN(sizeof(PcRolesShared)));
	pc_locks_request(PC_ROLES_TRANCHE, 1);
}

void
pc_roles_shmem_startup(void)
{
	bool		found;
	LWLockPadded *lock;
	int			i;

	roles_shared = ShmemInitStruct("projcache roles", sizeof(PcRolesShared),
								   &found);
	lock = pc_locks_get(PC_ROLES_TRANCHE, 1, PC_LOCK_ALONE);
	if (found)
		return;
	roles_shared->lock = &lock->lock;
	pg_atomic_init_u32(&roles_shared->room_wanted, 0);
	for (i = 0; i < PC_ROLE_SLOTS; i++)
	{
		roles_shared->slots[i].role = InvalidOid;
		pg_atomic_init_u32(&roles_shared->slots[i].keys, 0);
		pg_atomic_init_u64(&roles_shared->slots[i].bytes, 0);
		pg_atomic_init_u32(&roles_shared->slots[i].room_wanted, 0);
	}
}

/* Role slot n, for the worker's eviction by role. */
PcRoleSlot *
pc_role_slot(int n)
{
	Assert(n >= 0 && n < PC_ROLE_SLOTS);
	return &roles_shared->slots[n];
}

/* Whether a slot's room_wanted was set since the worker last asked. */
bool
pc_roles_take_room_wanted(void)
{
	return pg_atomic_exchange_u32(&roles_shared->room_wanted, 0) != 0;
}

/* The role a slot counts keys for; InvalidOid for none or for many. */
Oid
pc_role_of_slot(int slot)
{
	Assert(slot >= 0 && slot < PC_ROLE_SLOTS);
	if (slot == PC_ROLE_NONE || slot == PC_ROLE_OVERFLOW)
		return InvalidOid;
	return roles_shared->slots[slot].role;
}

/*
 * The slot that counts role's keys, or -1 if it has none and one could be
 * given.  With claim (and the slots' lock held exclusively), one is given if it
 * has none: in the order the role's hash says, the first never used or
 * whose role has no keys left.  With or without claim, the overflow slot
 * if no slot can be given.  A role's slot comes before the first
 * slot never used in that order, since slots are never given back to no
 * role: the search stops there.
 */
static int
role_slot_find(Oid role, bool claim)
{
	const int	nslots = PC_ROLE_OVERFLOW - 1;	/* slots 1 .. nslots */
	int			start = (int) (murmurhash32((uint32) role) % nslots);
	int			free_slot = -1;
	int			i;

	Assert(LWLockHeldByMe(roles_shared->lock));
	Assert(!claim || LWLockHeldByMeInMode(roles_shared->lock, LW_EXCLUSIVE));
	for (i = 0; i < nslots; i++)
	{
		int			n = 1 + (start + i) % nslots;
		PcRoleSlot *slot = &roles_shared->slots[n];

		if (slot->role == role)
			return n;
		if (free_slot < 0 &&
			(slot->role == InvalidOid || pg_atomic_read_u32(&slot->keys) == 0))
			free_slot = n;
		if (slot->role == InvalidOid)
			break;
	}
	if (free_slot < 0)
		return PC_ROLE_OVERFLOW;	/* without claim too: no lock to upgrade */
	if (!claim)
		return -1;
	roles_shared->slots[free_slot].role = role;
	return free_slot;
}

/*
 * Count one more key for role, about to be created, whose chunk takes
 * bytes: returns its slot, or -1 if the role has reached
 * projcache.max_keys_per_role or its bytes' bound (the worker is then asked
 * to evict its oldest keys).  Superusers' keys, and keys of no role (the
 * worker's), count for no role's bound (PC_ROLE_NONE, whose bytes are
 * counted too).  The caller gives the key back with pc_role_unreserve()
 * unless it creates the entry, which then owns it.  May read the catalog:
 * call before any lock is taken.
 */
int
pc_role_reserve(Oid role, Size bytes)
{
	uint32		bound = pc_keys_per_role_bound();
	uint64		byte_bound = pc_bytes_per_role_bound();
	PcRoleSlot *slot;
	uint32		keys;
	uint64		held;
	int			n;

	if (!OidIsValid(role) || superuser_arg(role))
	{
		pg_atomic_fetch_add_u64(&roles_shared->slots[PC_ROLE_NONE].bytes,
								(int64) bytes);
		return PC_ROLE_NONE;
	}
	pc_lock_alone(roles_shared->lock, LW_SHARED);
	n = role_slot_find(role, false);
	if (n < 0)
	{
		LWLockRelease(roles_shared->lock);
		pc_lock_alone(roles_shared->lock, LW_EXCLUSIVE);
		n = role_slot_find(role, true);
	}
	slot = &roles_shared->slots[n];
	/* Reserve first, so that concurrent creations cannot all pass. */
	keys = pg_atomic_add_fetch_u32(&slot->keys, 1);
	held = pg_atomic_add_fetch_u64(&slot->bytes, (int64) bytes);
	if (!policy_role_fits(keys - 1, held - bytes, bytes, bound, byte_bound))
	{
		pg_atomic_fetch_sub_u32(&slot->keys, 1);
		pg_atomic_fetch_sub_u64(&slot->bytes, (int64) bytes);
		n = -1;
	}
	LWLockRelease(roles_shared->lock);
	if (n < 0)
	{
		pg_atomic_write_u32(&slot->room_wanted, 1);
		pg_atomic_write_u32(&roles_shared->room_wanted, 1);
		pc_wake_worker();
	}
	return n;
}

/*
 * A key counted by pc_role_reserve() was not created after all, or is gone;
 * its chunks took bytes.
 */
void
pc_role_unreserve(int slot, Size bytes)
{
	Assert(pg_atomic_read_u64(&roles_shared->slots[slot].bytes) >= bytes);
	pg_atomic_fetch_sub_u64(&roles_shared->slots[slot].bytes, (int64) bytes);
	if (slot == PC_ROLE_NONE)
		return;
	Assert(pg_atomic_read_u32(&roles_shared->slots[slot].keys) > 0);
	pg_atomic_fetch_sub_u32(&roles_shared->slots[slot].keys, 1);
}
