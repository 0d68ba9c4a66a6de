/*-------------------------------------------------------------------------
 *
 * shmem.c
 *	  projcache's shared memory: control struct, DSA area, key map, ring.
 *
 * Everything lives in main shared memory, reserved at postmaster start:
 *
 *	 PcShared | request ring | snapshot slots | DSA area (max_memory bytes)
 *
 * The DSA area is created in place over the whole projcache.max_memory
 * reservation and limited to it, so it never needs DSM segments: the bound
 * is exact, and running out of it is an allocation that returns
 * InvalidDsaPointer (callers use DSA_ALLOC_NO_OOM), never an ERROR from
 * deep inside a reader.  The key map is a dshash table on that area.
 *
 * Each process attaches to the area and the key map once, on first use.
 * See projcache.h for which lock protects what.
 *
 * Copyright (c) 2026, projcache developers
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "miscadmin.h"
#include "storage/ipc.h"
#include "storage/shmem.h"
#include "utils/memutils.h"
#include "utils/timestamp.h"

#include "projcache.h"

PcShared   *pc_shared = NULL;

/* This process's mappings, set up by pc_attach(). */
static dsa_area *pc_dsa = NULL;
static dshash_table *pc_map = NULL;

/* DSA bytes projcache holds; see pc_memory_used(). */
static Size
pc_dsa_bytes(void)
{
	return (Size) pc_max_memory_kb * 1024;
}

static Size
pc_shmem_size(void)
{
	Size		size = MAXALIGN(sizeof(PcShared));

	size = add_size(size, MAXALIGN(pc_ring_size()));
	size = add_size(size, MAXALIGN(pc_snap_shmem_size(pc_max_snapshots)));
	size = add_size(size, pc_dsa_bytes());
	return size;
}

void
pc_shmem_request(void)
{
	RequestAddinShmemSpace(pc_shmem_size());
	/* ring lock, snapshot map lock, one lock per snapshot slot */
	RequestNamedLWLockTranche("projcache", 2 + pc_max_snapshots);
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
	dshash_table *map;
	int			i;

	/* After a crash restart, drop the previous mappings. */
	pc_shared = NULL;
	pc_dsa = NULL;
	pc_map = NULL;

	LWLockAcquire(AddinShmemInitLock, LW_EXCLUSIVE);
	shared = ShmemInitStruct("projcache", pc_shmem_size(), &found);
	if (!found)
	{
		char	   *base = (char *) shared;

		memset(shared, 0, sizeof(PcShared));
		SpinLockInit(&shared->mutex);
		shared->worker_latch = NULL;
		shared->worker_pid = 0;
		shared->ring_lock = &(GetNamedLWLockTranche("projcache"))[0].lock;
		shared->snap_map_lock = &(GetNamedLWLockTranche("projcache"))[1].lock;
		shared->snap_slot_locks = &(GetNamedLWLockTranche("projcache"))[2];
		shared->max_snapshots = pc_max_snapshots;
		pg_atomic_init_u32(&shared->ring_overflow, 0);
		pg_atomic_init_u64(&shared->clock_offset_ms, 0);
		pg_atomic_init_u64(&shared->config_generation, 0);
		pg_atomic_init_u64(&shared->memory_used, 0);
		pg_atomic_init_u64(&shared->nentries, 0);
		for (i = 0; i < PC_NUM_COUNTERS; i++)
			pg_atomic_init_u64(&shared->counters[i], 0);
		shared->stats_reset = GetCurrentTimestamp();
		for (i = 0; i < PC_NUM_KEY_CVS; i++)
			ConditionVariableInit(&shared->key_cv[i]);

		shared->ring_offset = MAXALIGN(sizeof(PcShared));
		shared->snap_offset = shared->ring_offset + MAXALIGN(pc_ring_size());
		shared->dsa_offset = shared->snap_offset +
			MAXALIGN(pc_snap_shmem_size(pc_max_snapshots));
		pc_ring_init((PcRequestRing *) (base + shared->ring_offset));
		pc_snap_shmem_init(base + shared->snap_offset, pc_max_snapshots);

		shared->dsa_tranche = LWLockNewTrancheId();
		shared->keymap_tranche = LWLockNewTrancheId();
		area = dsa_create_in_place(base + shared->dsa_offset, pc_dsa_bytes(),
								   shared->dsa_tranche, NULL);
		dsa_pin(area);
		/* The whole reservation is the in-place segment: never grow past it. */
		dsa_set_size_limit(area, pc_dsa_bytes());
		map = pc_keymap_create(area, shared->keymap_tranche);
		shared->keymap_handle = dshash_get_hash_table_handle(map);
		/* The postmaster never touches them again. */
		dshash_detach(map);
		dsa_detach(area);
	}
	LWLockRelease(AddinShmemInitLock);

	pc_shared = shared;
}

static void
pc_detach(int code, Datum arg)
{
	if (pc_map != NULL)
		dshash_detach(pc_map);
	if (pc_dsa != NULL)
	{
		dsa_release_in_place((char *) pc_shared + pc_shared->dsa_offset);
		dsa_detach(pc_dsa);
	}
	pc_map = NULL;
	pc_dsa = NULL;
}

/* Error out unless the library was preloaded and shared memory is there. */
void
pc_require_loaded(void)
{
	if (pc_shared == NULL)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("projcache must be loaded via shared_preload_libraries"),
				 errhint("Add 'projcache' to shared_preload_libraries in postgresql.conf and restart the server.")));
}

/* Map the DSA area and the key map into this process, once. */
void
pc_attach(void)
{
	MemoryContext oldcxt;

	pc_require_loaded();
	if (pc_map != NULL)
		return;

	LWLockRegisterTranche(pc_shared->dsa_tranche, "projcache_dsa");
	LWLockRegisterTranche(pc_shared->keymap_tranche, "projcache_keymap");

	oldcxt = MemoryContextSwitchTo(TopMemoryContext);
	pc_dsa = dsa_attach_in_place((char *) pc_shared + pc_shared->dsa_offset,
								 NULL);
	dsa_pin_mapping(pc_dsa);
	pc_map = pc_keymap_attach(pc_dsa, pc_shared->keymap_tranche,
							  pc_shared->keymap_handle);
	MemoryContextSwitchTo(oldcxt);

	before_shmem_exit(pc_detach, (Datum) 0);
}

dsa_area *
pc_area(void)
{
	pc_attach();
	return pc_dsa;
}

dshash_table *
pc_keymap(void)
{
	pc_attach();
	return pc_map;
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
	return pc_dsa_bytes();
}

/*
 * Headroom kept free of keys and snapshots: dshash's bucket arrays and the
 * allocator's own rounding and fragmentation live in it.
 */
Size
pc_memory_reserve(void)
{
	return pc_dsa_bytes() / 8;
}

/*
 * Allocate from the DSA area without ever raising an out-of-memory ERROR:
 * returns InvalidDsaPointer when projcache.max_memory, less its reserve, is
 * used up.
 */
dsa_pointer
pc_alloc(Size size)
{
	dsa_pointer dp;

	if (pc_memory_used() + size > pc_memory_limit() - pc_memory_reserve())
		return InvalidDsaPointer;
	dp = dsa_allocate_extended(pc_area(), size, DSA_ALLOC_NO_OOM);
	if (DsaPointerIsValid(dp))
		pg_atomic_fetch_add_u64(&pc_shared->memory_used, size);
	return dp;
}

/* Free a chunk from pc_alloc(); size must be the size it was allocated with. */
void
pc_free(dsa_pointer dp, Size size)
{
	if (!DsaPointerIsValid(dp))
		return;
	dsa_free(pc_area(), dp);
	pg_atomic_fetch_sub_u64(&pc_shared->memory_used, size);
}

Size
pc_memory_used(void)
{
	return (Size) pg_atomic_read_u64(&pc_shared->memory_used);
}
