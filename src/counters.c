/*-------------------------------------------------------------------------
 *
 * counters.c
 *	  The key cache's counters, in shared memory of their own.
 *
 * Copyright (c) 2026, projcache developers
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "port/atomics.h"
#include "storage/shmem.h"
#include "storage/spin.h"
#include "utils/timestamp.h"

#include "counters.h"

typedef struct PcCountersShared
{
	slock_t		mutex;			/* protects reset_at */
	TimestampTz reset_at;		/* start, or the last reset_stats() */
	pg_atomic_uint64 counters[PC_NUM_COUNTERS];
} PcCountersShared;

static PcCountersShared *counters_shared = NULL;

void
pc_counters_shmem_request(void)
{
	RequestAddinShmemSpace(MAXALIGN(sizeof(PcCountersShared)));
}

void
pc_counters_shmem_startup(void)
{
	bool		found;
	int			i;

	counters_shared = ShmemInitStruct("projcache counters",
									  sizeof(PcCountersShared), &found);
	if (found)
		return;
	SpinLockInit(&counters_shared->mutex);
	counters_shared->reset_at = GetCurrentTimestamp();
	for (i = 0; i < PC_NUM_COUNTERS; i++)
		pg_atomic_init_u64(&counters_shared->counters[i], 0);
}

void
pc_count(PcCounter counter, uint64 n)
{
	pg_atomic_fetch_add_u64(&counters_shared->counters[counter], n);
}

uint64
pc_counter(PcCounter counter)
{
	return pg_atomic_read_u64(&counters_shared->counters[counter]);
}

/* Zero every counter, and note when. */
void
pc_counters_reset(void)
{
	int			i;

	for (i = 0; i < PC_NUM_COUNTERS; i++)
		pg_atomic_write_u64(&counters_shared->counters[i], 0);
	SpinLockAcquire(&counters_shared->mutex);
	counters_shared->reset_at = GetCurrentTimestamp();
	SpinLockRelease(&counters_shared->mutex);
}

TimestampTz
pc_counters_reset_at(void)
{
	TimestampTz at;

	SpinLockAcquire(&counters_shared->mutex);
	at = counters_shared->reset_at;
	SpinLockRelease(&counters_shared->mutex);
	return at;
}
