/*-------------------------------------------------------------------------
 *
 * clock.c
 *	  projcache's clock: monotonic milliseconds plus a test offset.
 *
 * Every expiry, grace period, refresh, backoff and snapshot TTL is measured
 * on CLOCK_MONOTONIC, which is the same in every process of the machine and
 * never steps with the wall clock, so a clock correction can neither shorten
 * nor widen a TTL.  Wall-clock times shown to users (fetched_at, loaded_at)
 * are derived from it through one pair of readings taken at server start,
 * so a stored instant reads the same every time (to the millisecond).  A
 * step of the wall clock after the start is not followed.
 *
 * With projcache.debug_clock = on, projcache.debug_advance_clock() adds to a
 * shared offset, so tests can cross a TTL in milliseconds.
 *
 * The offset and the start's pair of readings are the clock's own part of
 * shared memory ("projcache clock"); the readings are written once, before
 * any other process starts, and the offset is an atomic.
 *
 * Copyright (c) 2026, projcache developers
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include <time.h>

#include "fmgr.h"
#include "miscadmin.h"
#include "storage/shmem.h"
#include "utils/builtins.h"
#include "utils/timestamp.h"

#include "keycache.h"

typedef struct PcClockShared
{
	pg_atomic_uint64 offset_ms; /* projcache.debug_clock's steps */
	TimestampTz wall_anchor;	/* the wall clock when projcache's clock read
								 * mono_anchor_ms (set once, at start) */
	int64		mono_anchor_ms;
} PcClockShared;

static PcClockShared *clock_shared = NULL;

void
pc_clock_shmem_request(void)
{
	RequestAddinShmemSpace(MAXALIGN(sizeof(PcClockShared)));
}

void
pc_clock_shmem_startup(void)
{
	bool		found;

	clock_shared = ShmemInitStruct("projcache clock", sizeof(PcClockShared),
								   &found);
	if (found)
		return;
	pg_atomic_init_u64(&clock_shared->offset_ms, 0);
	clock_shared->mono_anchor_ms = pc_real_now_ms();
	clock_shared->wall_anchor = GetCurrentTimestamp();
}

/* Monotonic milliseconds, without the test offset: for real waits. */
int64
pc_real_now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64) ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* projcache's clock: what every schedule is measured on. */
int64
pc_now_ms(void)
{
	int64		offset = 0;

	/* Without the test clock there is no offset to read (a shared line). */
	if (pc_debug_clock && clock_shared != NULL)
		offset = (int64) pg_atomic_read_u64(&clock_shared->offset_ms);
	return pc_real_now_ms() + offset;
}

/*
 * The wall-clock time at which projcache's clock read mono_ms.  The test
 * offset is taken out, so that moving the clock ages what is cached
 * instead of moving it into the future.
 */
TimestampTz
pc_mono_to_timestamp(int64 mono_ms)
{
	int64		offset = 0;

	if (pc_debug_clock)
		offset = (int64) pg_atomic_read_u64(&clock_shared->offset_ms);
	return clock_shared->wall_anchor +
		(mono_ms - offset - clock_shared->mono_anchor_ms) * INT64CONST(1000);
}

/* An interval datum of ms milliseconds, for the views. */
Datum
pc_interval_from_ms(int64 ms)
{
	Interval   *iv = palloc0(sizeof(Interval));

	iv->time = ms * 1000;
	return IntervalPGetDatum(iv);
}

PG_FUNCTION_INFO_V1(projcache_debug_advance_clock);

/*
 * Test-only functions work only with projcache.debug_clock = on, and for
 * superusers; "action" completes "only superusers may ...".
 */
void
pc_require_debug(const char *action)
{
	if (!pc_debug_clock)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("projcache.debug_clock is off"),
				 errhint("Set projcache.debug_clock = on in postgresql.conf and restart; it is meant for tests only.")));
	if (!superuser())
		ereport(ERROR,
				(errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
				 errmsg("only superusers may %s", action)));
}

/*
 * projcache.debug_advance_clock(interval): move the clock forward, then
 * wake the worker so that whatever just became due runs now.
 */
Datum
projcache_debug_advance_clock(PG_FUNCTION_ARGS)
{
	Interval   *step = PG_GETARG_INTERVAL_P(0);
	int64		step_ms;

	pc_require_loaded();
	pc_require_debug("move the projcache clock");
	if (step->month != 0 || step->day != 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("clock step must be given in hours, minutes or seconds"),
				 errdetail("Months and days have no fixed length.")));
	if (step->time < 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("the projcache clock only moves forward")));

	step_ms = step->time / 1000;
	pg_atomic_fetch_add_u64(&clock_shared->offset_ms, (uint64) step_ms);
	pc_wake_worker();
	PG_RETURN_VOID();
}
