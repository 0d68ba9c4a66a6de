/*-------------------------------------------------------------------------
 *
 * dump_file.h
 *	  The file format in which the caches survive a restart.
 *
 * A dump is a header, records and a trailer:
 *
 *	 header   magic, format version, kind (keys, snapshots or the keys'
 *			  tombstones), a generation (0 unless the writer sets one;
 *			  1.2 wrote 0 there), the cluster's system identifier, when it
 *			  was written (wall clock), and a CRC-32C of those
 *	 record   length, CRC-32C of the payload, payload (length bytes)
 *	 trailer  the length PC_DUMP_TRAILER, a CRC-32C, and the number of
 *			  records before it
 *
 * It is written to a temporary name, fsynced and renamed over the old one,
 * so a crash while writing leaves the previous dump.  A reader checks the
 * whole file (every checksum, the trailer's count, nothing after it) before
 * it hands out the first record: a torn, truncated, corrupted or foreign
 * file is refused whole, with a LOG line saying why.  Payloads are the
 * caller's business.
 *
 * A log (pc_dump_log_*) has the same header and records and no trailer: it
 * is created through a temporary name as a dump is, and then appended to,
 * one write() per record.  A reader takes every whole record; a record cut
 * off at the end (a crash while appending) is the end of the log, and any
 * other damage refuses the log whole.
 *
 * Copyright (c) 2026, projcache developers
 *
 *-------------------------------------------------------------------------
 */
#ifndef PROJCACHE_DUMP_FILE_H
#define PROJCACHE_DUMP_FILE_H

#include "datatype/timestamp.h"

/* What a dump holds; a reader refuses a file of another kind. */
typedef enum PcDumpKind
{
	PC_DUMP_KEYS = 1,
	PC_DUMP_SNAPSHOTS = 2,
	PC_DUMP_TOMBSTONES = 3		/* a log (keycache_dump.c) */
} PcDumpKind;

/* What pc_dump_log_read() found. */
typedef enum PcDumpLogStatus
{
	PC_DUMP_LOG_MISSING,		/* no file */
	PC_DUMP_LOG_OK,
	PC_DUMP_LOG_DAMAGED			/* said at LOG */
} PcDumpLogStatus;

/* Largest payload a reader accepts: a larger length is corruption. */
#define PC_DUMP_MAX_RECORD	((uint32) (1024 * 1024 * 1024))

typedef struct PcDumpWriter PcDumpWriter;
typedef struct PcDumpReader PcDumpReader;
typedef struct PcDumpLog PcDumpLog;

/*
 * Writing.  pc_dump_begin() opens path.tmp; pc_dump_finish() writes the
 * trailer, fsyncs and renames it to path.  Failures are reported at
 * LOG and leave the previous dump in place: begin returns NULL, finish
 * false; after a failed write the writer only discards.
 */
extern PcDumpWriter *pc_dump_begin(const char *path, PcDumpKind kind);
extern PcDumpWriter *pc_dump_begin_generation(const char *path,
											  PcDumpKind kind,
											  uint32 generation);
extern void pc_dump_write(PcDumpWriter *w, const void *payload, uint32 len);
extern bool pc_dump_finish(PcDumpWriter *w, uint64 *records);
extern void pc_dump_discard(PcDumpWriter *w);

/*
 * Reading.  pc_dump_open() checks the whole file and returns NULL (with a
 * LOG line saying why) unless it is sound, of this kind and this cluster;
 * a missing file is NULL without a word.  pc_dump_next() hands out each
 * payload in turn (palloc'd) and returns false after the last.
 */
extern PcDumpReader *pc_dump_open(const char *path, PcDumpKind kind);
extern TimestampTz pc_dump_written_at(const PcDumpReader *r);
extern int64 pc_dump_age_ms(const PcDumpReader *r);
extern uint32 pc_dump_generation(const PcDumpReader *r);
extern uint64 pc_dump_count(const PcDumpReader *r);
extern bool pc_dump_next(PcDumpReader *r, char **payload, uint32 *len);
extern void pc_dump_close(PcDumpReader *r);

/*
 * Logs.  pc_dump_log_begin() opens path.tmp with a header; appends go to
 * it; pc_dump_log_commit() fsyncs it and renames it to path, after which
 * appends go on to path.  Every call reports a failure at LOG and returns
 * NULL or false; after one, the log only closes.  pc_dump_log_read() hands
 * each whole record to record() and the header's generation to
 * *generation.
 */
extern PcDumpLog *pc_dump_log_begin(const char *path, PcDumpKind kind,
									uint32 generation);
extern bool pc_dump_log_append(PcDumpLog *log, const void *payload,
							   uint32 len);
extern bool pc_dump_log_commit(PcDumpLog *log);
extern bool pc_dump_log_sync(PcDumpLog *log);
extern uint64 pc_dump_log_size(const PcDumpLog *log);
extern void pc_dump_log_close(PcDumpLog *log);
extern PcDumpLogStatus pc_dump_log_read(const char *path, PcDumpKind kind,
										uint32 *generation,
										void (*record) (const char *payload,
														uint32 len,
														void *arg),
										void *arg);

#endif							/* PROJCACHE_DUMP_FILE_H */
