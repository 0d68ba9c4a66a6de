/*-------------------------------------------------------------------------
 *
 * keycache_worker.h
 *	  What the worker's own files tell one another: keycache_worker.c (the
 *	  loop, requests, timers, restarts, the dump's driving),
 *	  keycache_batch.c (batches and their answers) and keycache_evict.c
 *	  (eviction and admission).  No other file includes it.
 *
 * Copyright (c) 2026, projcache developers
 *
 *-------------------------------------------------------------------------
 */
#ifndef PROJCACHE_KEYCACHE_WORKER_H
#define PROJCACHE_KEYCACHE_WORKER_H

#include "keycache.h"
#include "keycache_policy.h"

/* The worker's private state of every key (keycache_policy.h). */
extern Policy *pc_policy;

/* Memory of one batch's call and answers, reset after each. */
extern MemoryContext pc_batch_cxt;

/* keycache_worker.c */
extern void pc_delete_shared(const char *key, uint32 len, PcCounter cause);
extern uint32 pc_admission_window_units(void);
extern void pc_mirror_entry(PolicyEntry *e);
extern void pc_tombstone_unless_disabled(const char *key, uint32 len);
extern void pc_count_delay(PolicyEntry *e);
extern bool pc_worker_take_room_wanted(void);
extern bool pc_worker_close_admission(void);
extern void pc_worker_open_admission(void);

/* keycache_batch.c */
extern void pc_run_batches(PolicyEntry **batch, int n);

/* keycache_evict.c */
extern int	pc_key_pool(const char *key, size_t keylen, void *arg);
extern Size pc_pool_budget(int pool);
extern void pc_weigh_new_key(PolicyEntry *e);
extern void pc_apply_cache_settings(void);
extern bool pc_evict_one_for_memory(int pool, bool protect);
extern int	pc_make_room(int writer, Size need, Size freed, bool full, bool admit);
extern void pc_close_admission(void);
extern void pc_admission_tick(int64 now);
extern void pc_evict_for_memory(void);
extern void pc_evict_for_roles(void);
extern void pc_evict_cache_keys(const char *prefix, uint32 len);

#endif							/* PROJCACHE_KEYCACHE_WORKER_H */
