/*-------------------------------------------------------------------------
 *
 * counters.h
 *	  The key cache's counters, cumulative since start or reset_stats().
 *
 * A part of shared memory of its own ("projcache counters"): the counters
 * are atomics, and the time of the last reset is under the part's
 * spinlock.
 *
 * Copyright (c) 2026, projcache developers
 *
 *-------------------------------------------------------------------------
 */
#ifndef PROJCACHE_COUNTERS_H
#define PROJCACHE_COUNTERS_H

#include "datatype/timestamp.h"

typedef enum PcCounter
{
	PC_CTR_HITS,				/* reads served a value */
	PC_CTR_MISSES,				/* reads of unknown keys */
	PC_CTR_PENDING_READS,		/* reads of keys still pending */
	PC_CTR_FETCH_REQUESTS,		/* requests sent to the worker */
	PC_CTR_FETCH_CALLS,			/* calls of the fetch function */
	PC_CTR_FETCHED_KEYS,		/* keys asked for in those calls */
	PC_CTR_NOT_MODIFIED,		/* not_modified answers */
	PC_CTR_PENDING_RESULTS,		/* pending answers */
	PC_CTR_FETCH_ERRORS,		/* failed calls and contract breaches */
	PC_CTR_EVICTIONS,
	PC_CTR_REFRESHES,
	PC_CTR_REQUEST_OVERFLOWS,	/* request ring full: fell back to a scan */
	/* completed fetches by time since the previous success */
	PC_CTR_DELAY_LTE15S,
	PC_CTR_DELAY_LTE30S,
	PC_CTR_DELAY_LTE60S,
	PC_CTR_DELAY_LTE120S,
	PC_CTR_DELAY_LTE300S,
	PC_CTR_DELAY_LTE600S,
	PC_CTR_DELAY_LTE1800S,
	PC_CTR_DELAY_LTE3600S,
	PC_CTR_DELAY_GT3600S,
	PC_CTR_MEMORY_EVICTIONS,	/* keys the worker evicted to make room */
	PC_CTR_EXPIRY_EVICTIONS,	/* keys evicted at expiry + grace period */
	PC_CTR_REQUESTED_EVICTIONS, /* keys evicted by projcache.evict() */
	PC_CTR_REFUSED_READS,		/* reads of new keys that found no room */
	PC_CTR_DROPPED_FETCHES,		/* keys read once, dropped unfetched */
	PC_NUM_COUNTERS
} PcCounter;

extern void pc_counters_shmem_request(void);
extern void pc_counters_shmem_startup(void);
extern void pc_count(PcCounter counter, uint64 n);
extern uint64 pc_counter(PcCounter counter);
extern void pc_counters_reset(void);
extern TimestampTz pc_counters_reset_at(void);

#endif							/* PROJCACHE_COUNTERS_H */
