/*-------------------------------------------------------------------------
 *
 * projcache.h
 *	  What every part of projcache shares: limits, settings and the clock.
 *
 * The parts have headers of their own: shmem.h (shared memory, its lock
 * table, counters and memory accounting), keycache.h (the key map, the
 * request ring, the worker and its fetch call), snapshot.h (snapshot slots,
 * loads and the registry).
 *
 * Copyright (c) 2026, projcache developers
 *
 *-------------------------------------------------------------------------
 */
#ifndef PROJCACHE_H
#define PROJCACHE_H

#include "access/tupdesc.h"
#include "nodes/pg_list.h"
#include "port/atomics.h"
#include "storage/condition_variable.h"
#include "storage/latch.h"
#include "storage/lwlock.h"
#include "storage/spin.h"
#include "utils/dsa.h"
#include "utils/timestamp.h"

#include "compat.h"

/* Longest error message kept for a key or a snapshot, in bytes. */
#define PC_MAX_MESSAGE_BYTES	1024

/* Shown as last_error when even the message could not be stored. */
#define PC_UNSTORED_ERROR \
	"the error could not be recorded: projcache.max_memory is used up"


/* Longest key accepted, in bytes. */
#define PC_MAX_KEY_BYTES		1024

/* Condition variables readers wait on, chosen by key hash. */
#define PC_NUM_KEY_CVS			64

/* ----------------------------------------------------------------
 * Settings (projcache.c)
 * ----------------------------------------------------------------
 */
extern char *pc_database;
extern char *pc_fetch_function;
extern char *pc_fetch_role;
extern char *pc_notify_channel;
extern int	pc_expiry_ms;
extern int	pc_grace_period_ms;
extern int	pc_refresh_interval_ms;
extern int	pc_max_retry_backoff_ms;
extern int	pc_batch_size;
extern int	pc_batch_interval_ms;
extern int	pc_fetch_timeout_ms;
extern int	pc_max_memory_kb;
extern int	pc_max_snapshots;
extern int	pc_max_streams;
extern int	pc_snap_memory_kb;
extern int	pc_snap_memory_per_owner_kb;
extern int	pc_max_snapshots_per_owner;
extern int	pc_max_snapshots_per_database;
extern bool pc_debug_clock;
extern int	pc_debug_list_limit;
extern int	pc_dump_interval_s;
extern int	pc_restore_wait_ms;
extern int	pc_max_keys_per_role;
extern int	pc_admission_window_ms;

/* ----------------------------------------------------------------
 * Clock (clock.c)
 * ----------------------------------------------------------------
 */
extern void pc_require_debug(const char *action);
extern void pc_clock_shmem_request(void);
extern void pc_clock_shmem_startup(void);
extern int64 pc_now_ms(void);
extern int64 pc_real_now_ms(void);
extern TimestampTz pc_mono_to_timestamp(int64 mono_ms);
extern Datum pc_interval_from_ms(int64 ms);

/* ----------------------------------------------------------------
 * User code in a subtransaction (subxact.c)
 * ----------------------------------------------------------------
 */
extern ErrorData *pc_run_in_subxact(void (*body) (void *arg), void *arg);

#endif							/* PROJCACHE_H */
