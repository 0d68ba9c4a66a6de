/*-------------------------------------------------------------------------
 *
 * dump_file.h
 *	  The file format in which the caches survive a restart.
 *
 * A dump is a header, records and a trailer:
 *
 *	 header   magic, format version, kind (keys or snapshots), the
 *			  cluster's system identifier, when it was written (wall clock),
 *			  and a CRC-32C of those
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
	PC_DUMP_SNAPSHOTS = 2
} PcDumpKind;

/* Largest payload a reader accepts: a larger length is corruption. */
#define PC_DUMP_MAX_RECORD	((uint32) (1024 * 1024 * 1024))

typedef struct PcDumpWriter PcDumpWriter;
typedef struct PcDumpReader PcDumpReader;

/*
 * Writing.  pc_dump_begin() opens path.tmp; pc_dump_finish() writes the
 * trailer, fsyncs and renames it to path.  Failures are reported at
 * LOG and leave the previous dump in place: begin returns NULL, finish
 * false; after a failed write the writer only discards.
 */
extern PcDumpWriter *pc_dump_begin(const char *path, PcDumpKind kind);
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
extern uint64 pc_dump_count(const PcDumpReader *r);
extern bool pc_dump_next(PcDumpReader *r, char **payload, uint32 *len);
extern void pc_dump_close(PcDumpReader *r);

#endif							/* PROJCACHE_DUMP_FILE_H */
