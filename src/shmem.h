/*-------------------------------------------------------------------------
 *
 * shmem.h
 *	  The DSA area that holds keys, values and snapshot rows, and its budgets.
 *
 * This is one part of projcache's shared memory.  Every part (the clock,
 * the counters, the worker's signals, the request ring, the key map, the
 * keys per role, the named caches, the key dump, the snapshot slots, the
 * snapshot dump, the replayed keys) owns its shared state: it sizes it,
 * requests it and its named locks, and sets it up in its own
 * ShmemInitStruct("projcache <part>"), from the functions projcache.c lists
 * in its shared memory hooks.  No part reaches into another's struct; this
 * file knows none of them.
 *
 * The area's own state:
 * - memory_used (atomic): DSA bytes taken, as pc_dsa_footprint() counts
 *	 them, by keys, values and messages; snapshot rows are counted apart,
 *	 by the snapshot slots (snapshot_store.c).  What charges it: pc_alloc()
 *	 (entries' chunks and the key map's grown bucket arrays),
 *	 pc_store_message() (the keys' and the snapshots' messages) and
 *	 pc_area_charge() (the key map's first bucket arrays).
 * - changes (atomic): bumped after each change of memory_used, so that a
 *	 reader can tell that nothing was allocated or freed while it looked.
 * - the DSA's own lock: its allocator.  It comes below every lock of ours
 *	 (an allocation under a partition or slot lock; see locks.h).
 *
 * Copyright (c) 2026, projcache developers
 *
 *-------------------------------------------------------------------------
 */
#ifndef PROJCACHE_SHMEM_H
#define PROJCACHE_SHMEM_H

#include "projcache.h"
#include "locks.h"

/* Called in each process that attaches to the area, once, right after. */
typedef void (*PcAreaAttachFn) (dsa_area *area, char *segment);

extern void pc_area_shmem_request(void);
extern void pc_area_shmem_startup(void);
extern dsa_area *pc_area_being_created(char **segment);
extern void pc_area_shmem_startup_done(void);
extern void pc_area_on_attach(PcAreaAttachFn fn);
extern void pc_area_charge(Size footprint);
extern uint64 pc_area_changes(void);
extern Size pc_area_bytes_from(dsa_pointer dp);

extern bool pc_loaded(void);
extern void pc_require_loaded(void);
extern void pc_attach(void);
extern dsa_area *pc_area(void);
extern Size pc_key_memory_used(void);
extern dsa_pointer pc_alloc(Size size);
extern dsa_pointer pc_store_message(const char *message, Size *size);
extern void pc_free(dsa_pointer dp, Size size);
extern Size pc_dsa_footprint(Size size);
extern Size pc_dsa_capacity(Size size);
extern Size pc_memory_limit(void);
extern Size pc_memory_snapshot_share(void);
extern Size pc_key_memory_bound(void);
extern void pc_check_memory_settings(void);
extern char *pc_copy_no_oom(const void *src, Size len, bool nul_terminate,
							bool *oom);
pg_noreturn extern void pc_report_oom(const char *what);

#endif							/* PROJCACHE_SHMEM_H */
