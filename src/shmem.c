/*-------------------------------------------------------------------------
 *
 * shmem.c
 *	  The DSA area: keys, values, messages and snapshot rows, and its budgets.
 *
 * The area lives in main shared memory, reserved at postmaster start in its
 * part's own struct ("projcache area"):
 *
 *	 PcAreaShared | DSA area
 *
 * The DSA area is created in place over its whole reservation and limited
 * to it, so it never needs DSM segments.  projcache counts what its chunks
 * take (pc_dsa_footprint) and refuses allocations past projcache.max_memory,
 * so running out is an allocation that returns InvalidDsaPointer, never an
 * ERROR from deep inside a reader; the area is larger than max_memory by
 * the allocator's slack (pc_dsa_bytes).  The key map is a hash table on
 * that area (keycache_map.c), created in it while the postmaster sets up
 * shared memory (pc_area_being_created()).
 *
 * max_memory is split in two budgets, counted apart: snapshot rows take
 * projcache.snapshot_memory (pc_memory_snapshot_share(), counted by the
 * snapshot slots), everything else (keys, values, error messages) the rest
 * (memory_used).  Neither can take the other's room, so keys filling theirs
 * never make a snapshot refresh fail, and snapshots filling theirs never
 * make the worker evict keys.
 *
 * Each process attaches to the area once, on first use, and then calls
 * what the parts living in it registered (pc_area_on_attach()).
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

#include "shmem.h"

typedef struct PcAreaShared
{
	int			dsa_tranche;
	pg_atomic_uint64 memory_used;	/* DSA bytes taken by keys, values and
									 * messages (pc_dsa_footprint) */
	pg_atomic_uint64 changes;	/* bumped after each change of memory_used
								 * (pc_area_changes) */
	/* the DSA area follows, at area_offset() */
} PcAreaShared;

static PcAreaShared *area_shared = NULL;

/* This process's mapping, set up by pc_attach(). */
static dsa_area *pc_dsa = NULL;
static bool area_attached = false;
static bool detach_registered = false;

/* The postmaster's mapping while it sets up a new area, else NULL. */
static dsa_area *area_creating = NULL;

/* What the parts in the area do when a process attaches (this process's). */
#define PC_MAX_ATTACH_FNS	4
static PcAreaAttachFn attach_fns[PC_MAX_ATTACH_FNS];
static int	nattach_fns = 0;

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

static Size
area_offset(void)
{
	return MAXALIGN(sizeof(PcAreaShared));
}

static char *
area_base(void)
{
	return (char *) area_shared + area_offset();
}

/*
 * Ask the kernel to back the DSA area with transparent huge pages where it
 * allows them for shared memory (/sys/kernel/mm/transparent_hugepage/
 * shmem_enabled set to "advise"): a hit reads the map and a value at random
 * over the whole area, and with 4 kB pages each such read misses the TLB
 * and, in a backend new to that page, takes a page fault.  huge_pages = on
 * covers the area without this (it is main shared memory), and the advice
 * is then refused or moot.  Only the 2 MB pages wholly inside the area are
 * advised; a failure changes nothing but speed, so it is not an error.
 * Called before the area is first written, in the postmaster, whose
 * mapping every child inherits.
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

void
pc_area_shmem_request(void)
{
	RequestAddinShmemSpace(add_size(area_offset(), pc_dsa_bytes()));
}

/*
 * Set up the area (once, in the postmaster, or again after a crash has
 * reinitialized shared memory).  A new area stays mapped in the postmaster
 * until pc_area_shmem_startup_done(), so that the parts that live in it can
 * create their state there (pc_area_being_created()).
 */
void
pc_area_shmem_startup(void)
{
	bool		found;

	/* After a crash restart, drop the previous mappings. */
	area_shared = NULL;
	pc_dsa = NULL;
	area_attached = false;
	area_creating = NULL;
	nattach_fns = 0;

	area_shared = ShmemInitStruct("projcache area",
								  add_size(area_offset(), pc_dsa_bytes()),
								  &found);
	if (!found)
	{
		area_shared->dsa_tranche = LWLockNewTrancheId();
		pg_atomic_init_u64(&area_shared->memory_used, 0);
		pg_atomic_init_u64(&area_shared->changes, 0);
		advise_huge_pages(area_base(), pc_dsa_bytes());
		area_creating = dsa_create_in_place(area_base(), pc_dsa_bytes(),
											area_shared->dsa_tranche, NULL);
		dsa_pin(area_creating);
		/* The whole reservation is the in-place segment: never grow past it. */
		dsa_set_size_limit(area_creating, pc_dsa_bytes());
	}
}

/*
 * The area while the postmaster creates it, and where its one segment
 * starts (*segment); NULL when the area already existed.
 */
dsa_area *
pc_area_being_created(char **segment)
{
	*segment = area_base();
	return area_creating;
}

/* The postmaster never touches the area again. */
void
pc_area_shmem_startup_done(void)
{
	if (area_creating != NULL)
		dsa_detach(area_creating);
	area_creating = NULL;
}

/*
 * Have fn called in each process that attaches to the area, right after it
 * has.  Called from a part's shared memory startup, so every process that
 * attaches knows it.
 */
void
pc_area_on_attach(PcAreaAttachFn fn)
{
	if (nattach_fns >= PC_MAX_ATTACH_FNS)
		elog(FATAL, "projcache: too many parts in the DSA area");
	attach_fns[nattach_fns++] = fn;
}

/* Count bytes a part allocated at the area's creation as used. */
void
pc_area_charge(Size footprint)
{
	pg_atomic_fetch_add_u64(&area_shared->memory_used, footprint);
	pg_atomic_fetch_add_u64(&area_shared->changes, 1);
}

/*
 * How many times memory_used has changed since the area was created.  A
 * reader that finds the same count before and after reading several
 * things knows that no chunk was allocated or freed meanwhile (the key
 * map's self-check, keycache_map_check.c).
 */
uint64
pc_area_changes(void)
{
	return pg_atomic_read_u64(&area_shared->changes);
}

/*
 * How many bytes of the area's one segment there are from dp on (0 if dp
 * is not in it): the key map's self-check tests a reference with it before
 * it reads what the reference points to.
 */
Size
pc_area_bytes_from(dsa_pointer dp)
{
	if (dp == 0 || dp >= pc_dsa_bytes())
		return 0;
	return pc_dsa_bytes() - dp;
}

static void
pc_detach(int code, Datum arg)
{
	if (pc_dsa != NULL)
	{
		dsa_release_in_place(area_base());
		dsa_detach(pc_dsa);
	}
	area_attached = false;
	pc_dsa = NULL;
}

/* Whether the library was preloaded and shared memory is there. */
bool
pc_loaded(void)
{
	return area_shared != NULL;
}

/*
 * Error out unless the library was preloaded and shared memory is there;
 * then make sure this process is attached.  Every SQL entry point calls
 * this first, before taking any lock, so attaching never happens under one.
 */
void
pc_require_loaded(void)
{
	if (area_shared == NULL)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("projcache must be loaded via shared_preload_libraries"),
				 errhint("Add 'projcache' to shared_preload_libraries in postgresql.conf and restart the server.")));
	pc_attach();
}

/* Map the DSA area into this process, and the parts that live in it, once. */
void
pc_attach(void)
{
	MemoryContext oldcxt;
	dsa_area   *area;
	int			i;

	if (area_attached)
		return;
	if (area_shared == NULL)
		pc_require_loaded();	/* reports the missing preload */

	LWLockRegisterTranche(area_shared->dsa_tranche, "projcache_dsa");

	/* Set up so that a failure halfway leaks nothing and can be retried. */
	if (!detach_registered)
	{
		before_shmem_exit(pc_detach, (Datum) 0);
		detach_registered = true;
	}
	oldcxt = MemoryContextSwitchTo(TopMemoryContext);
	if (pc_dsa == NULL)
	{
		area = dsa_attach_in_place(area_base(), NULL);
		dsa_pin_mapping(area);
		pc_dsa = area;
	}
	for (i = 0; i < nattach_fns; i++)
		attach_fns[i] (pc_dsa, area_base());
	MemoryContextSwitchTo(oldcxt);
	area_attached = true;
}

dsa_area *
pc_area(void)
{
	pc_attach();
	return pc_dsa;
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

/*
 * The part of projcache.max_memory set aside for snapshot rows
 * (projcache.snapshot_memory), in bytes; the snapshot slots count it.
 */
Size
pc_memory_snapshot_share(void)
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

	if (pc_memory_snapshot_share() + pc_message_reserve() >= pc_memory_limit())
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("projcache.snapshot_memory must be less than projcache.max_memory"),
				 errdetail("projcache.snapshot_memory is %zu kB; projcache.max_memory is %d kB, of which %zu kB are kept for error messages.",
						   pc_memory_snapshot_share() / 1024, pc_max_memory_kb,
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
	Assert(pc_memory_limit() > pc_memory_snapshot_share() + pc_message_reserve());
	return pc_memory_limit() - pc_memory_snapshot_share() - pc_message_reserve();
}

static dsa_pointer
pc_alloc_internal(Size size, Size bound)
{
	Size		footprint = pc_dsa_footprint(size);
	dsa_pointer dp;

	/* Reserve first, so that concurrent allocations cannot all pass. */
	if (pg_atomic_add_fetch_u64(&area_shared->memory_used, footprint) > bound)
	{
		pg_atomic_fetch_sub_u64(&area_shared->memory_used, footprint);
		pg_atomic_fetch_add_u64(&area_shared->changes, 1);
		return InvalidDsaPointer;
	}
	dp = dsa_allocate_extended(pc_area(), size,
							   DSA_ALLOC_NO_OOM | DSA_ALLOC_HUGE);
	if (!DsaPointerIsValid(dp))
		pg_atomic_fetch_sub_u64(&area_shared->memory_used, footprint);
	pg_atomic_fetch_add_u64(&area_shared->changes, 1);
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
						   pc_memory_limit() - pc_memory_snapshot_share());
	if (DsaPointerIsValid(dp))
	{
		char	   *dst = dsa_get_address(pc_area(), dp);

		memcpy(dst, message, len);
		dst[len] = '\0';
	}
	return dp;
}

/* Free a chunk from pc_alloc(); size must be the size it was allocated with. */
void
pc_free(dsa_pointer dp, Size size)
{
	if (!DsaPointerIsValid(dp))
		return;
	dsa_free(pc_area(), dp);
	pg_atomic_fetch_sub_u64(&area_shared->memory_used, pc_dsa_footprint(size));
	pg_atomic_fetch_add_u64(&area_shared->changes, 1);
}

/* The part of projcache.max_memory counted against pc_key_memory_bound(). */
Size
pc_key_memory_used(void)
{
	return (Size) pg_atomic_read_u64(&area_shared->memory_used);
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
