/*-------------------------------------------------------------------------
 *
 * snapshot_dump.c
 *	  The snapshots' last good rows, kept across a restart.
 *
 * Whenever the scheduler dumps the key map (keycache_dump.c), it writes
 * every loaded snapshot's rows, key index included, with the registration
 * they belong to (database, name, registry id and creation stamp) and
 * their age, to PC_SNAPSHOTS_DUMP_FILE.
 *
 * Nothing is loaded at start: the first read of a snapshot whose slot has
 * no rows looks for rows of that very registration, once per slot, in
 * PC_SNAPSHOTS_RESTORE_FILE, the dump the scheduler found when it first
 * started (pc_snapshots_adopt_dump).  So rows are found only for
 * registrations that still exist with the same identity, by a reader that
 * passed the checks of any read, in its own database.  They are published
 * as they were loaded then (their age kept, so stale), and the usual rules
 * follow: a refresh is tried, and if the source fails, they are the last
 * good rows.
 *
 * Rows not read yet must outlive the next dumps, or a dump written before
 * the first read would lose them: each dump carries over the records of
 * the restore file whose registration has no rows loaded, for at most
 * PC_SNAPSHOT_CARRIES restarts (a registration dropped while the server
 * was down is never read again).
 *
 * Copyright (c) 2026, projcache developers
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include <sys/stat.h>

#include "miscadmin.h"
#include "nodes/pg_list.h"
#include "storage/fd.h"
#include "storage/spin.h"
#include "utils/timestamp.h"

#include "dump_file.h"
#include "projcache.h"
#include "shmem.h"
#include "snapshot.h"

/* One snapshot, as written: this header, then its rows. */
#define PC_SNAPSHOT_CARRIES 3

typedef struct SnapRecord
{
	Oid			dbid;
	uint32		carried;		/* restarts it was carried over unread */
	int64		reg_id;
	int64		reg_stamp;
	int64		rows;
	int64		age_ms;
	uint64		size;
	char		name[NAMEDATALEN];
} SnapRecord;

typedef struct DumpCtx
{
	PcDumpWriter *writer;
	StringInfoData buf;
	List	   *written;		/* SnapRecord * of the live snapshots */
} DumpCtx;

/* Does the record name the same registration? */
static bool
same_registration(const SnapRecord *a, const SnapRecord *b)
{
	return a->dbid == b->dbid && a->reg_id == b->reg_id &&
		a->reg_stamp == b->reg_stamp && strcmp(a->name, b->name) == 0;
}

static void
write_snapshot(const PcSnapDumped *snap, const char *blob, void *arg)
{
	DumpCtx    *ctx = (DumpCtx *) arg;
	SnapRecord	rec;
	SnapRecord *copy;
	Size		len = sizeof(SnapRecord) + snap->size;

	if (len > PC_DUMP_MAX_RECORD)
		return;					/* larger than a reader accepts */
	memset(&rec, 0, sizeof(rec));
	rec.dbid = snap->dbid;
	rec.reg_id = snap->reg_id;
	rec.reg_stamp = snap->reg_stamp;
	rec.rows = snap->rows;
	rec.age_ms = snap->age_ms;
	rec.size = snap->size;
	strlcpy(rec.name, snap->name, NAMEDATALEN);
	resetStringInfo(&ctx->buf);
	appendBinaryStringInfo(&ctx->buf, (const char *) &rec, sizeof(rec));
	appendBinaryStringInfo(&ctx->buf, blob, snap->size);
	pc_dump_write(ctx->writer, ctx->buf.data, ctx->buf.len);
	copy = palloc(sizeof(SnapRecord));
	memcpy(copy, &rec, sizeof(rec));
	ctx->written = lappend(ctx->written, copy);
}

/* Carry over the restore file's records of snapshots not read since. */
static void
carry_unread(DumpCtx *ctx)
{
	PcDumpReader *r = pc_dump_open(PC_SNAPSHOTS_RESTORE_FILE,
								   PC_DUMP_SNAPSHOTS);
	char	   *payload;
	uint32		len;

	if (r == NULL)
		return;
	while (pc_dump_next(r, &payload, &len))
	{
		SnapRecord	rec;
		bool		live = false;
		ListCell   *lc;

		if (len < sizeof(SnapRecord))
		{
			pfree(payload);
			continue;
		}
		memcpy(&rec, payload, sizeof(rec));
		rec.name[NAMEDATALEN - 1] = '\0';
		foreach(lc, ctx->written)
			live |= same_registration(&rec, lfirst(lc));
		if (!live && rec.carried < PC_SNAPSHOT_CARRIES)
		{
			/* The restore file was adopted at start: one restart more. */
			rec.carried++;
			memcpy(payload, &rec, sizeof(rec));
			pc_dump_write(ctx->writer, payload, len);
		}
		pfree(payload);
	}
	pc_dump_close(r);
}

/*
 * At the scheduler's first start after the server's: the last dump
 * becomes the file reads restore from (a damaged one is removed, said at
 * LOG once).  Without a new dump, the restore file of the last start
 * stays, so a crash before any dump loses nothing.
 */
void
pc_snapshots_adopt_dump(void)
{
	PcDumpReader *r;
	struct stat st;

	if (pc_dump_interval_s < 0)
		return;
	if (stat(PC_SNAPSHOTS_DUMP_FILE, &st) == 0)
		(void) durable_rename(PC_SNAPSHOTS_DUMP_FILE, PC_SNAPSHOTS_RESTORE_FILE,
							  LOG);
	r = pc_dump_open(PC_SNAPSHOTS_RESTORE_FILE, PC_DUMP_SNAPSHOTS);
	if (r != NULL)
		pc_dump_close(r);
	else if (stat(PC_SNAPSHOTS_RESTORE_FILE, &st) == 0)
		(void) durable_unlink(PC_SNAPSHOTS_RESTORE_FILE, LOG);
}

/* Write the dump of every loaded snapshot (at LOG if it fails). */
void
pc_snapshots_dump(void)
{
	DumpCtx		ctx;

	if (pc_dump_interval_s < 0)
		return;
	ctx.writer = pc_dump_begin(PC_SNAPSHOTS_DUMP_FILE, PC_DUMP_SNAPSHOTS);
	if (ctx.writer == NULL)
		return;
	initStringInfo(&ctx.buf);
	ctx.written = NIL;
	pc_snap_dump_slots(write_snapshot, &ctx, pc_now_ms());
	carry_unread(&ctx);
	(void) pc_dump_finish(ctx.writer, NULL);
	list_free_deep(ctx.written);
	pfree(ctx.buf.data);
}

/*
 * The first read of a slot with no rows: publish the dumped rows of this
 * registration, if the dump has them.  True if it did.
 */
bool
pc_snapshot_restore(SnapReg *reg, PcSnapRef ref)
{
	PcDumpReader *r;
	char	   *payload;
	uint32		len;
	bool		restored = false;
	long		secs;
	int			usecs;
	int64		since_dump_ms;

	if (pc_dump_interval_s < 0 || !pc_snap_take_dump_check(ref))
		return false;
	r = pc_dump_open(PC_SNAPSHOTS_RESTORE_FILE, PC_DUMP_SNAPSHOTS);
	if (r == NULL)
		return false;
	TimestampDifference(pc_dump_written_at(r), GetCurrentTimestamp(),
						&secs, &usecs);
	since_dump_ms = (int64) secs * 1000 + usecs / 1000;

	while (!restored && pc_dump_next(r, &payload, &len))
	{
		SnapRecord	rec;

		if (len >= sizeof(SnapRecord))
		{
			memcpy(&rec, payload, sizeof(rec));
			rec.name[NAMEDATALEN - 1] = '\0';
			if (rec.dbid == MyDatabaseId && rec.reg_id == reg->id &&
				rec.reg_stamp == reg->stamp &&
				strcmp(rec.name, reg->name) == 0 &&
				rec.size == len - sizeof(SnapRecord) && rec.rows >= 0)
			{
				char	   *refusal = NULL;
				int64		loaded_at =
					pc_now_ms() - rec.age_ms - since_dump_ms;

				if (pc_snap_publish(ref, payload + sizeof(SnapRecord), rec.size,
									rec.rows, loaded_at,
									pc_snap_stale_marks(ref), &refusal))
				{
					restored = true;
					SpinLockAcquire(&pc_shared->mutex);
					pc_shared->loaded_snapshots++;
					SpinLockRelease(&pc_shared->mutex);
				}
				else
					ereport(LOG,
							(errmsg("projcache left the dumped rows of snapshot \"%s\" out",
									reg->name),
							 errdetail("%s", refusal)));
			}
		}
		pfree(payload);
	}
	pc_dump_close(r);
	return restored;
}
