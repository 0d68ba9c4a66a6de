/*-------------------------------------------------------------------------
 *
 * shmem.c
 *	  projcache's shared memory: control struct, DSA area, key map, ring.
 *
 * Everything lives in main shared memory, reserved at postmaster start:
 *
 *	 PcShared | request rings | snapshot slots | replayed keys | DSA area
 *
 * (the replayed keys: the list a standby's redo appends to, wal.h).
 *
 * The DSA area is created in place over its whole reservation and limited
 * to it, so it never needs DSM segments.  projcache counts what its chunks
 * take (pc_dsa_footprint) and refuses allocations past projcache.max_memory,
 * so running out is an allocation that returns InvalidDsaPointer, never an
 * ERROR from deep inside a reader; the area is larger than max_memory by
 * the allocator's slack (pc_dsa_bytes).  The key map is a hash table on
 * that area (keycache_map.c).
 *
 * max_memory is split in two budgets, counted apart: snapshot rows take
 * projcache.snapshot_memory (snap_memory_used), everything else (keys,
 * values, error messages) the rest (memory_used).  Neither can take the
 * other's room, so keys filling theirs never make a snapshot refresh fail,
 * and snapshots filling theirs never make the worker evict keys.
 *
 * Each process attaches to the area and the key map once, on first use.
 * See shmem.h for which lock protects what.
 *
 * Copyright (c) 2026, projcache developers
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include <sys/mman.h>

#include "mb/pg_wchar.h"
#include "miscadmin.h"
#include "storage/ipc.h"
#include "storage/shmem.h"
#include "utils/memutils.h"
#include "utils/timestamp.h"

#include "keycache.h"
#include "snapshot.h"
#include "wal.h"

PcShared   *pc_shared = NULL;

/* This process's mappings, set up by pc_attach(). */
static dsa_area *pc_dsa = NULL;
static bool pc_map_attached = false;
static bool detach_registered = false;

/*
 * Bytes of the DSA area.  projcache's own accounting stops allocations at
 * projcache.max_memory; the area is larger by the allocator's slack: a
 * partly used 64 kB superblock per size class, page rounding, and the key
 * map's bucket arrays while they grow.  So the area itself never runs out
 * before the accounting does, and a full cache is a clean error.
 */
#define PC_DSA_SLACK_FIXED	((Size) 4 * 1024 * 1024)

static Size
pc_dsa_bytes(void)
{
	Size		limit = (Size) pc_max_memory_kb * 1024;

	return limit + limit / 16 + PC_DSA_SLACK_FIXED;
}

/*
 * Ask the kernel to back the DSA area with transparent huge pages where it
 * allows them for shared memory (/sys/kernel/mm/transparent_hugepage/
 * shmem_enabled set to "advise"): a hit reads the map and a value at random
 * over the whole area, and with 4 kB pages each such read misses the TLB
 * and, in a backend new to that page, takes a page fault.  huge_pages = on
 * covers the area without this (it is main shared memory), and the advice
 * is then refused or moot.  Only the 2 MB pages wholly inside the area are
 * advised; a failure changes nothing but speed, so it is not an error.  Called before the area is
 * first written, in the postmaster, whose mapping every child inherits.
 */
static void
advise_huge_pages(char *start, Size size)
{
#ifdef MADV_HUGEPAGE
	const uintptr_t huge = 2 * 1024 * 1024;
	uintptr_t	from = TYPEALIGN(huge, (uintptr_t) start);
	uintptr_t	to = TYPEALIGN_DOWN(huge, (uintptr_t) start + size);

	if (to > from)
		(void) madvise((void *) from, to - from, MADV_HUGEPAGE);
#endif
}

static Size
pc_shmem_size(void)
{
	Size		size = MAXALIGN(sizeof(PcShared));

	size = add_size(size, MAXALIGN(pc_ring_size()));
	size = add_size(size, MAXALIGN(pc_snap_shmem_size(pc_max_snapshots)));
	size = add_size(size, MAXALIGN(pc_wal_pending_size()));
	size = add_size(size, pc_dsa_bytes());
	return size;
}

void
pc_shmem_request(void)
{
	RequestAddinShmemSpace(pc_shmem_size());
	RequestAddinShmemSpace(pc_load_shmem_size());

	/*
	 * ring lock, snapshot map lock, one lock per snapshot slot, WAL list,
	 * role slots, snapshot tombstone file, named caches
	 */
	RequestNamedLWLockTranche("projcache", 6 + pc_max_snapshots);
}

/* The control struct's first state: its locks, slots, atomics and CVs. */
static void
init_shared(PcShared *shared)
{
	int			i;

	memset(shared, 0, sizeof(PcShared));
	SpinLockInit(&shared->mutex);
	shared->worker_latch = NULL;
	shared->worker_pid = 0;
	shared->ring_lock = &(GetNamedLWLockTranche("projcache"))[0].lock;
	shared->snap_map_lock = &(GetNamedLWLockTranche("projcache"))[1].lock;
	shared->snap_slot_locks = &(GetNamedLWLockTranche("projcache"))[2];
	shared->wal_lock =
		&(GetNamedLWLockTranche("projcache"))[2 + pc_max_snapshots].lock;
	shared->role_lock =
		&(GetNamedLWLockTranche("projcache"))[3 + pc_max_snapshots].lock;
	shared->snap_tomb_lock =
		&(GetNamedLWLockTranche("projcache"))[4 + pc_max_snapshots].lock;
	pc_caches_init(&shared->caches,
				   &(GetNamedLWLockTranche("projcache"))[5 + pc_max_snapshots].lock);
	pg_atomic_init_u32(&shared->role_room_wanted, 0);
	for (i = 0; i < PC_ROLE_SLOTS; i++)
	{
		shared->role_slots[i].role = InvalidOid;
		pg_atomic_init_u32(&shared->role_slots[i].keys, 0);
		pg_atomic_init_u64(&shared->role_slots[i].bytes, 0);
		pg_atomic_init_u32(&shared->role_slots[i].room_wanted, 0);
	}
	shared->max_snapshots = pc_max_snapshots;
	pg_atomic_init_u32(&shared->ring_overflow, 0);
	pg_atomic_init_u32(&shared->room_wanted, 0);
	pg_atomic_init_u32(&shared->admission_closed, 0);
	pg_atomic_init_u64(&shared->clock_offset_ms, 0);
	shared->mono_anchor_ms = pc_real_now_ms();
	shared->wall_anchor = GetCurrentTimestamp();
	pg_atomic_init_u64(&shared->config_generation, 0);
	pg_atomic_init_u64(&shared->registry_generation, 0);
	pg_atomic_init_u32(&shared->keys_restoring, 0);
	pg_atomic_init_u64(&shared->restore_wait_until, 0);
	pg_atomic_init_u64(&shared->memory_used, 0);
	pg_atomic_init_u64(&shared->snap_memory_used, 0);
	pg_atomic_init_u64(&shared->nentries, 0);
	pg_atomic_init_u64(&shared->entry_serial, 0);
	for (i = 0; i < PC_NUM_COUNTERS; i++)
		pg_atomic_init_u64(&shared->counters[i], 0);
	shared->stats_reset = GetCurrentTimestamp();
	for (i = 0; i < PC_NUM_KEY_CVS; i++)
		ConditionVariableInit(&shared->key_cv[i]);
}

/*
 * Set up the control struct (once, in the postmaster, or again after a
 * crash has reinitialized shared memory).
 */
void
pc_shmem_startup(void)
{
	bool		found;
	PcShared   *shared;
	dsa_area   *area;
	Size		map_bytes;

	/* After a crash restart, drop the previous mappings. */
	pc_shared = NULL;
	pc_dsa = NULL;
	pc_map_attached = false;

	LWLockAcquire(AddinShmemInitLock, LW_EXCLUSIVE);
	shared = ShmemInitStruct("projcache", pc_shmem_size(), &found);
	if (!found)
	{
		char	   *base = (char *) shared;

		init_shared(shared);

		shared->ring_offset = MAXALIGN(sizeof(PcShared));
		shared->snap_offset = shared->ring_offset + MAXALIGN(pc_ring_size());
		shared->wal_offset = shared->snap_offset +
			MAXALIGN(pc_snap_shmem_size(pc_max_snapshots));
		shared->dsa_offset = shared->wal_offset +
			MAXALIGN(pc_wal_pending_size());
		pc_ring_init((PcRequestRing *) (base + shared->ring_offset));
		pc_snap_shmem_init(base + shared->snap_offset, pc_max_snapshots);
		pc_wal_pending_init((PcWalPending *) (base + shared->wal_offset));

		shared->dsa_tranche = LWLockNewTrancheId();
		shared->keymap_tranche = LWLockNewTrancheId();
		advise_huge_pages(base + shared->dsa_offset, pc_dsa_bytes());
		area = dsa_create_in_place(base + shared->dsa_offset, pc_dsa_bytes(),
								   shared->dsa_tranche, NULL);
		dsa_pin(area);
		/* The whole reservation is the in-place segment: never grow past it. */
		dsa_set_size_limit(area, pc_dsa_bytes());
		shared->keymap_handle = pc_keymap_create(area, shared->keymap_tranche,
												 &map_bytes);
		pg_atomic_write_u64(&shared->memory_used, map_bytes);
		/* The postmaster never touches it again. */
		dsa_detach(area);
	}
	pc_load_shmem_init();
	LWLockRelease(AddinShmemInitLock);

	pc_shared = shared;

	/*
	 * At a start (after a crash too), before any process can read: say
	 * whether the worker has a key dump to load, so that reads wait for it,
	 * and make the snapshots' last dump the file their reads restore from, so
	 * that no read finds the file of an earlier start instead.
	 */
	if (!found)
	{
		pc_keys_restore_begin();
		pc_snap_adopt_dump();
	}
}

static void
pc_detach(int code, Datum arg)
{
	if (pc_dsa != NULL)
	{
		dsa_release_in_place((char *) pc_shared + pc_shared->dsa_offset);
		dsa_detach(pc_dsa);
	}
	pc_map_attached = false;
	pc_dsa = NULL;
}

/*
 * Error out unless the library was preloaded and shared memory is there;
 * then make sure this process is attached.  Every SQL entry point calls
 * this first, before taking any lock, so attaching never happens under one.
 */
void
pc_require_loaded(void)
{
	if (pc_shared == NULL)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("projcache must be loaded via shared_preload_libraries"),
				 errhint("Add 'projcache' to shared_preload_libraries in postgresql.conf and restart the server.")));
	pc_attach();
}

/* Map the DSA area and the key map into this process, once. */
void
pc_attach(void)
{
	MemoryContext oldcxt;
	dsa_area   *area;

	if (pc_map_attached)
		return;
	if (pc_shared == NULL)
		pc_require_loaded();	/* reports the missing preload */

	LWLockRegisterTranche(pc_shared->dsa_tranche, "projcache_dsa");
	LWLockRegisterTranche(pc_shared->keymap_tranche, "projcache_keymap");

	/* Set up so that a failure halfway leaks nothing and can be retried. */
	if (!detach_registered)
	{
		before_shmem_exit(pc_detach, (Datum) 0);
		detach_registered = true;
	}
	oldcxt = MemoryContextSwitchTo(TopMemoryContext);
	if (pc_dsa == NULL)
	{
		area = dsa_attach_in_place((char *) pc_shared + pc_shared->dsa_offset,
								   NULL);
		dsa_pin_mapping(area);
		pc_dsa = area;
	}
	pc_keymap_attach(pc_dsa, pc_shared->keymap_handle,
					 (char *) pc_shared + pc_shared->dsa_offset);
	MemoryContextSwitchTo(oldcxt);
	pc_map_attached = true;
}

dsa_area *
pc_area(void)
{
	pc_attach();
	return pc_dsa;
}

PcRequestRing *
pc_ring(void)
{
	return (PcRequestRing *) ((char *) pc_shared + pc_shared->ring_offset);
}

/* Set the worker's latch, if a worker is running. */
void
pc_wake_worker(void)
{
	Latch	   *latch;

	SpinLockAcquire(&pc_shared->mutex);
	latch = pc_shared->worker_latch;
	SpinLockRelease(&pc_shared->mutex);
	if (latch != NULL)
		SetLatch(latch);
}

void
pc_count(PcCounter counter, uint64 n)
{
	pg_atomic_fetch_add_u64(&pc_shared->counters[counter], n);
}

Size
pc_memory_limit(void)
{
	return (Size) pc_max_memory_kb * 1024;
}

/*
 * What an allocation of 'size' bytes really takes from the DSA area: the
 * allocator's size class for small requests, whole 4 kB pages plus a span
 * descriptor for large ones.  The classes are those of PostgreSQL 15's
 * dsa.c; an approximation elsewhere errs only in how much slack is used.
 */
static const uint16 pc_dsa_classes[] = {
	8, 16, 24, 32, 40, 48, 56, 64, 80, 96, 112, 128, 160, 192, 224, 256,
	320, 384, 448, 512, 640, 768, 896, 1024, 1280, 1560, 1816, 2048,
	2616, 3120, 3640, 4096, 5456, 6552, 7280, 8192
};

Size
pc_dsa_footprint(Size size)
{
	int			i;

	for (i = 0; i < lengthof(pc_dsa_classes); i++)
		if (size <= pc_dsa_classes[i])
			return pc_dsa_classes[i];
	return TYPEALIGN(4096, size) + 64;
}

/*
 * The most bytes a chunk of the same footprint as one of 'size' bytes can
 * hold: its size class, or its whole pages.
 */
Size
pc_dsa_capacity(Size size)
{
	int			i;

	for (i = 0; i < lengthof(pc_dsa_classes); i++)
		if (size <= pc_dsa_classes[i])
			return pc_dsa_classes[i];
	return TYPEALIGN(4096, size);
}

/*
 * Part of projcache.max_memory that only error messages may use, so the
 * reason a value was refused can be recorded when everything else is full.
 */
static Size
pc_message_reserve(void)
{
	return Min(pc_memory_limit() / 16, (Size) 64 * 1024);
}

/* projcache.snapshot_memory: the budget of snapshot rows, in bytes. */
Size
pc_snap_memory_limit(void)
{
	if (pc_snap_memory_kb < 0)
		return pc_memory_limit() / 4;
	return (Size) pc_snap_memory_kb * 1024;
}

/*
 * Refuse, at server start, a snapshot budget that leaves keys nothing:
 * the key budget below would wrap around.
 */
void
pc_check_memory_settings(void)
{
	/* The key map refers to chunks in 32 bits of 8 bytes (keycache_map.c). */
	if (pc_dsa_bytes() > (Size) PG_UINT32_MAX * MAXIMUM_ALIGNOF)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("projcache.max_memory must be at most 30GB"),
				 errdetail("projcache.max_memory is %d kB.", pc_max_memory_kb)));

	if (pc_snap_memory_limit() + pc_message_reserve() >= pc_memory_limit())
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("projcache.snapshot_memory must be less than projcache.max_memory"),
				 errdetail("projcache.snapshot_memory is %zu kB; projcache.max_memory is %d kB, of which %zu kB are kept for error messages.",
						   pc_snap_memory_limit() / 1024, pc_max_memory_kb,
						   pc_message_reserve() / 1024),
				 errhint("Lower projcache.snapshot_memory, or raise projcache.max_memory.")));
}

/*
 * Where pc_alloc() stops: what projcache.max_memory leaves for keys, once
 * snapshot rows and the message reserve are set apart.
 */
Size
pc_key_memory_bound(void)
{
	Assert(pc_memory_limit() > pc_snap_memory_limit() + pc_message_reserve());
	return pc_memory_limit() - pc_snap_memory_limit() - pc_message_reserve();
}

static dsa_pointer
pc_alloc_internal(Size size, Size bound)
{
	Size		footprint = pc_dsa_footprint(size);
	dsa_pointer dp;

	/* Reserve first, so that concurrent allocations cannot all pass. */
	if (pg_atomic_add_fetch_u64(&pc_shared->memory_used, footprint) > bound)
	{
		pg_atomic_fetch_sub_u64(&pc_shared->memory_used, footprint);
		return InvalidDsaPointer;
	}
	dp = dsa_allocate_extended(pc_area(), size,
							   DSA_ALLOC_NO_OOM | DSA_ALLOC_HUGE);
	if (!DsaPointerIsValid(dp))
		pg_atomic_fetch_sub_u64(&pc_shared->memory_used, footprint);
	return dp;
}

/*
 * Allocate from the keys' budget without ever raising an out-of-memory
 * ERROR: returns InvalidDsaPointer when it is used up.
 */
dsa_pointer
pc_alloc(Size size)
{
	return pc_alloc_internal(size, pc_key_memory_bound());
}

/*
 * Store an error message to record, cut to PC_MAX_MESSAGE_BYTES.  It may
 * use the message reserve (never the snapshots' budget); InvalidDsaPointer
 * if even that is used up.  *size is what to pass to pc_free().
 */
dsa_pointer
pc_store_message(const char *message, Size *size)
{
	int			len = pg_mbcliplen(message, strlen(message),
								   PC_MAX_MESSAGE_BYTES);
	dsa_pointer dp;

	*size = len + 1;
	dp = pc_alloc_internal(*size,
						   pc_memory_limit() - pc_snap_memory_limit());
	if (DsaPointerIsValid(dp))
	{
		char	   *dst = dsa_get_address(pc_area(), dp);

		memcpy(dst, message, len);
		dst[len] = '\0';
	}
	return dp;
}

/*
 * Take footprint bytes of projcache.snapshot_memory for rows about to be
 * allocated; false, with nothing taken, if they do not fit.  The snapshot
 * slots decide whose rows they are (snapshot_store.c).
 */
bool
pc_snap_memory_reserve(Size footprint)
{
	if (pg_atomic_add_fetch_u64(&pc_shared->snap_memory_used, footprint) >
		pc_snap_memory_limit())
	{
		pg_atomic_fetch_sub_u64(&pc_shared->snap_memory_used, footprint);
		return false;
	}
	return true;
}

void
pc_snap_memory_release(Size footprint)
{
	Assert(pg_atomic_read_u64(&pc_shared->snap_memory_used) >= footprint);
	pg_atomic_fetch_sub_u64(&pc_shared->snap_memory_used, footprint);
}

/* Free a chunk from pc_alloc(); size must be the size it was allocated with. */
void
pc_free(dsa_pointer dp, Size size)
{
	if (!DsaPointerIsValid(dp))
		return;
	dsa_free(pc_area(), dp);
	pg_atomic_fetch_sub_u64(&pc_shared->memory_used, pc_dsa_footprint(size));
}

/* All of projcache.max_memory in use: keys, messages and snapshot rows. */
Size
pc_memory_used(void)
{
	return (Size) (pg_atomic_read_u64(&pc_shared->memory_used) +
				   pg_atomic_read_u64(&pc_shared->snap_memory_used));
}

/* The part of it counted against pc_key_memory_bound(). */
Size
pc_key_memory_used(void)
{
	return (Size) pg_atomic_read_u64(&pc_shared->memory_used);
}

/* The part of it counted against projcache.snapshot_memory. */
Size
pc_snap_memory_used(void)
{
	return (Size) pg_atomic_read_u64(&pc_shared->snap_memory_used);
}

/*
 * Copy bytes while a lock is held.  Nothing may raise an ERROR under a
 * lock, so an allocation failure returns NULL (and sets *oom, if given);
 * the caller reports it with pc_report_oom() once the lock is released.
 */
char *
pc_copy_no_oom(const void *src, Size len, bool nul_terminate, bool *oom)
{
	char	   *dst = palloc_extended(len + (nul_terminate ? 1 : 0),
									  MCXT_ALLOC_NO_OOM);

	if (dst == NULL)
	{
		if (oom != NULL)
			*oom = true;
		return NULL;
	}
	memcpy(dst, src, len);
	if (nul_terminate)
		dst[len] = '\0';
	return dst;
}

/* Report a copy that pc_copy_no_oom() could not make; what names it. */
void
pc_report_oom(const char *what)
{
	ereport(ERROR,
			(errcode(ERRCODE_OUT_OF_MEMORY),
			 errmsg("out of memory"),
			 errdetail("Could not copy %s.", what)));
}

#ifdef USE_ASSERT_CHECKING
/*
 * Whether this backend may take a lock of the given kind now (see "Lock
 * order" in shmem.h): it holds no lock of ours, or, for a slot lock, none
 * but snap_map_lock.
 */
bool
pc_lock_order_ok(PcLockKind kind)
{
	int			i;

	if (pc_entry_locks_held > 0 ||
		LWLockHeldByMe(pc_shared->ring_lock) ||
		LWLockHeldByMe(pc_shared->role_lock) ||
		LWLockHeldByMe(pc_shared->wal_lock) ||
		LWLockHeldByMe(pc_shared->snap_tomb_lock) ||
		LWLockHeldByMe(pc_shared->caches.lock))
		return false;
	for (i = 0; i < pc_shared->max_snapshots; i++)
		if (LWLockHeldByMe(&pc_shared->snap_slot_locks[i].lock))
			return false;
	return kind == PC_LOCK_SNAP_SLOT ||
		!LWLockHeldByMe(pc_shared->snap_map_lock);
}
#endif
