/*-------------------------------------------------------------------------
 *
 * stream_worker.h
 *	  The change streams' workers and their shared slots (stream_worker.c),
 *	  as other parts ask them.
 *
 * Copyright (c) 2026, projcache developers
 *
 *-------------------------------------------------------------------------
 */
#ifndef PROJCACHE_STREAM_WORKER_H
#define PROJCACHE_STREAM_WORKER_H

#include "access/xlogdefs.h"
#include "datatype/timestamp.h"

/* The longest last_error a slot keeps, its terminator included. */
#define PC_STREAM_ERROR_LEN		256

/* A stream's state, as projcache.streams shows it. */
typedef enum PcStreamState
{
	PC_STREAM_STARTING,			/* a worker is (being) started */
	PC_STREAM_STREAMING,		/* connected, receiving */
	PC_STREAM_RECONNECTING,		/* waiting to connect again */
	PC_STREAM_STOPPED,			/* no worker, or stopped until altered */
	PC_STREAM_STANDBY			/* on a standby: no worker */
} PcStreamState;

/* A stream's run-time state, copied out of its slot. */
typedef struct PcStreamRuntime
{
	PcStreamState state;
	uint64		system_id;		/* 0: not known yet */
	TimeLineID	timeline;
	XLogRecPtr	received_lsn;
	XLogRecPtr	confirmed_lsn;
	int64		transactions;
	int64		changes;
	int64		keys_invalidated;
	int64		snapshots_refreshed;
	int64		full_refetches;
	int64		reconnects;
	char		last_error[PC_STREAM_ERROR_LEN];	/* "": none */
	TimestampTz last_error_at;
} PcStreamRuntime;

/* A registered stream, as the scheduler lists them to start workers. */
typedef struct PcStreamListed
{
	int64		id;
	char		name[NAMEDATALEN];
	TransactionId xmin;			/* its row's version */
} PcStreamListed;

/* What a stream's worker reads of its row. */
typedef struct PcStreamDef
{
	int64		id;
	char	   *name;
	Oid			owner;
	char	   *conninfo;
	char	   *publication;
	char	   *slot_name;		/* NULL: a temporary slot */
	TransactionId xmin;
} PcStreamDef;

extern void pc_streams_shmem_request(void);
extern void pc_streams_shmem_startup(void);
extern const char *pc_stream_state_name(PcStreamState state);
extern bool pc_stream_runtime(int64 id, PcStreamRuntime *rt);
extern void pc_streams_changed(void);
extern long pc_streams_tick(void);

/* stream_registry.c, for the workers and the scheduler */
extern int	pc_stream_list(PcStreamListed *out, int max);
extern bool pc_stream_read(int64 id, PcStreamDef *def);

#endif							/* PROJCACHE_STREAM_WORKER_H */
