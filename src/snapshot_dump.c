/*-------------------------------------------------------------------------
 *
 * snapshot_dump.c
 *	  The snapshots' last good rows, kept across a restart, and the
 *	  tombstones of rows dropped for lost rights.
 *
 * Whenever the worker dumps the key map (keycache_dump.c), it writes
 * every loaded snapshot's rows, key index included, with the registration
 * they belong to (database, name, registry id and creation stamp) and
 * their age, to PC_SNAP_DUMP_FILE.
 *
 * Nothing is loaded at start: the first read (or refresh_snapshot()) of a
 * snapshot whose slot has no rows looks for rows of that very
 * registration, once per slot, in PC_SNAP_RESTORE_FILE, the dump
 * found when the server started (pc_snap_adopt_dump, run as shared
 * memory is set up, before any reader can look: a read that came before
 * the worker had adopted it would have found the file of an earlier
 * start, or none, and started cold).  So
 * rows are found only for registrations that still exist with the same
 * identity, by a reader that passed the checks of any read, in its own
 * database.  They come back stale, with the time they were loaded then.
 *
 * Restored rows are not served before a load as the owner was tried
 * (snapshot_store.c keeps them apart; snapshot_sql.c loads at once, and
 * the other readers wait for that load, up to projcache.restore_wait).  The
 * owner may have lost the rights to read them while the server was down,
 * or after the dump was written, and only a load answers that question
 * for everything a load needs: tables, columns, the functions the query
 * calls and those they call in turn, schemas, policies, another snapshot's
 * grant.  A check of the owner's rights made on a read instead would have
 * to repeat all of that, and anything it missed would serve the rows to
 * readers; the load is the check, so nothing can be missed.  If the load
 * succeeds its rows replace the restored ones; if the source fails (and
 * the owner's rights are intact) the restored rows are the last good ones;
 * if the owner lost its rights they are dropped.
 *
 * Rows not read yet must outlive the next dumps, or a dump written before
 * the first read would lose them: each dump carries over the records of
 * the restore file whose registration has no rows loaded, for at most
 * PC_SNAP_CARRIES restarts (a registration dropped while the server
 * was down is never read again), with their age grown by the time between
 * the two files.
 *
 * Rows dropped because the owner lost its rights must not come back by any
 * of these ways, after a clean restart or a crash.  The slot is buried
 * (snapshot_store.c): no dump holds or carries its registration's rows,
 * and the restore file is not looked at for them again.  And the reader
 * that dropped them appends a tombstone to PC_SNAP_TOMBSTONE_FILE at
 * once, fsynced, before its error is raised: rows of that registration in
 * a dump or restore file written before the tombstone are neither restored
 * nor carried, so the periodic dump that a crash leaves behind does not
 * bring them back either.  A tombstone is needed until a dump written after
 * it is on disk: the worker prunes the file after each dump, and at
 * start keeps only what is newer than the restore file.  A slot writes a
 * tombstone only if its rows may be on disk since its last one (dumped
 * since, or from an earlier server lifetime), so a role that loses and
 * regains its rights in a loop cannot grow the file.  Appends and the
 * pruning take the tombstone lock, so that none is lost to a rewrite.  (Should
 * writing a tombstone fail, at LOG, the restored rows are still not served
 * before a load, which drops them again.)
 *
 * The slots' side of it (who checks the dump for a slot's rows, and each
 * slot's rows handed to a dump) is at the end of this file.
 *
 * The dump's part of shared memory ("projcache snapshot dump"): the
 * tombstone lock (tranche "projcache_snapshot_tombstones"), held
 * exclusively while a backend appends to the tombstone file and while the
 * worker rewrites it, across that file's I/O (both are rare), and taken
 * alone; and the count of snapshots the dump gave their rows, under a
 * spinlock.
 *
 * Copyright (c) 2026, projcache developers
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include "miscadmin.h"
#include "nodes/pg_list.h"
#include "port/pg_crc32c.h"
#include "storage/fd.h"
#include "storage/shmem.h"
#include "storage/spin.h"
#include "utils/timestamp.h"

#include "dump_file.h"
#include "projcache.h"
#include "shmem.h"
#include "snapshot.h"
#include "snapshot_slot.h"

typedef struct PcSnapDumpShared
{
	LWLock	   *tomb_lock;		/* the tombstone file */
	slock_t		mutex;			/* protects loaded */
	uint64		loaded;			/* snapshots given their dumped rows */
} PcSnapDumpShared;

static PcSnapDumpShared *dump_shared = NULL;

#define PC_SNAP_TOMB_TRANCHE	"projcache_snapshot_tombstones"

void
pc_snap_dump_shmem_request(void)
{
	RequestAddinShmemSpace(MAXALIGN(sizeof(PcSnapDumpShared)));
	pc_locks_request(PC_SNAP_TOMB_TRANCHE, 1);
}

/*
 * At a start (after a crash too), before any process can read: make the
 * last dump the file reads restore from, so that no read finds the file of
 * an earlier start instead.
 */
void
pc_snap_dump_shmem_startup(void)
{
	bool		found;
	LWLockPadded *lock;

	dump_shared = ShmemInitStruct("projcache snapshot dump",
								  sizeof(PcSnapDumpShared), &found);
	lock = pc_locks_get(PC_SNAP_TOMB_TRANCHE, 1, PC_LOCK_ALONE);
	if (found)
		return;
	dump_shared->tomb_lock = &lock->lock;
	SpinLockInit(&dump_shared->mutex);
	dump_shared->loaded = 0;
	pc_snap_adopt_dump();
}

/* How many snapshots the dump gave their rows (projcache.stats). */
uint64
pc_snap_dump_loaded(void)
{
	uint64		loaded;

	SpinLockAcquire(&dump_shared->mutex);
	loaded = dump_shared->loaded;
	SpinLockRelease(&dump_shared->mutex);
	return loaded;
}

/* One snapshot, as written: this header, then its rows. */
#define PC_SNAP_CARRIES 3

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
	TimestampTz written_at;		/* (about) the new file's write time */
	StringInfoData buf;
	List	   *written;		/* SnapRecord * of the live and the buried
								 * snapshots: none of theirs is carried */
} DumpCtx;

/*
 * A tombstone, as appended to PC_SNAP_TOMBSTONE_FILE: rows of this
 * registration in a file written before buried_at are not restored nor
 * carried.
 */
typedef struct SnapTombstone
{
	uint32		magic;
	pg_crc32c	crc;			/* of the rest */
	Oid			dbid;
	uint32		pad;
	int64		reg_id;
	int64		reg_stamp;
	TimestampTz buried_at;
	char		name[NAMEDATALEN];
} SnapTombstone;

#define PC_TOMBSTONE_MAGIC		0x50435442	/* "PCTB" */

/* More than this is not read (the worker prunes the file at start). */
#define PC_TOMBSTONES_MAX_BYTES	((Size) 16 * 1024 * 1024)

/* Does the record name the same registration? */
static bool
same_registration(const SnapRecord *a, const SnapRecord *b)
{
	return a->dbid == b->dbid && a->reg_id == b->reg_id &&
		a->reg_stamp == b->reg_stamp && strcmp(a->name, b->name) == 0;
}

/* ----------------------------------------------------------------
 * Tombstones
 * ----------------------------------------------------------------
 */

static pg_crc32c
tombstone_crc(const SnapTombstone *t)
{
	pg_crc32c	crc;
	Size		skip = offsetof(SnapTombstone, dbid);

	INIT_CRC32C(crc);
	COMP_CRC32C(crc, (const char *) t + skip, sizeof(SnapTombstone) - skip);
	FIN_CRC32C(crc);
	return crc;
}

/*
 * The rows of reg are dropped for lost rights: append its tombstone, and
 * fsync it, so that no file written before now gives them back, even after
 * a crash.  Failures are said at LOG: the rows are still not served before
 * a load (see the top of this file).
 */
void
pc_snap_bury(SnapReg *reg)
{
	SnapTombstone t;
	struct stat st;
	bool		existed;
	int			fd;

	if (pc_dump_interval_s < 0)
		return;
	memset(&t, 0, sizeof(t));
	t.magic = PC_TOMBSTONE_MAGIC;
	t.dbid = MyDatabaseId;
	t.reg_id = reg->id;
	t.reg_stamp = reg->stamp;
	t.buried_at = GetCurrentTimestamp();
	strlcpy(t.name, reg->name, NAMEDATALEN);
	t.crc = tombstone_crc(&t);

	/* Not while the worker rewrites the file: it would lose this one. */
	pc_lock_alone(dump_shared->tomb_lock, LW_EXCLUSIVE);
	existed = stat(PC_SNAP_TOMBSTONE_FILE, &st) == 0;
	fd = OpenTransientFilePerm(PC_SNAP_TOMBSTONE_FILE,
							   O_WRONLY | O_CREAT | O_APPEND | PG_BINARY,
							   S_IRUSR | S_IWUSR);
	if (fd < 0)
	{
		LWLockRelease(dump_shared->tomb_lock);
		ereport(LOG,
				(errcode_for_file_access(),
				 errmsg("could not open file \"%s\": %m",
						PC_SNAP_TOMBSTONE_FILE)));
		return;
	}
	errno = 0;
	if (write(fd, &t, sizeof(t)) != sizeof(t))
	{
		if (errno == 0)
			errno = ENOSPC;
		ereport(LOG,
				(errcode_for_file_access(),
				 errmsg("could not write file \"%s\": %m",
						PC_SNAP_TOMBSTONE_FILE)));
	}
	else if (pg_fsync(fd) != 0)
		ereport(LOG,
				(errcode_for_file_access(),
				 errmsg("could not fsync file \"%s\": %m",
						PC_SNAP_TOMBSTONE_FILE)));
	CloseTransientFile(fd);
	if (!existed)
		(void) fsync_fname_ext(".", true, false, LOG);
	LWLockRelease(dump_shared->tomb_lock);
}

/*
 * The tombstones on file (palloc'd SnapTombstone *).  Records are found by
 * their magic and checksum, so a record torn by a crash is skipped and the
 * ones after it are still found.
 */
static List *
read_tombstones(void)
{
	List	   *result = NIL;
	struct stat st;
	char	   *buf;
	Size		size;
	Size		off = 0;
	int			fd;
	ssize_t		got;

	if (stat(PC_SNAP_TOMBSTONE_FILE, &st) != 0 || st.st_size <= 0)
		return NIL;
	size = Min((Size) st.st_size, PC_TOMBSTONES_MAX_BYTES);
	fd = OpenTransientFile(PC_SNAP_TOMBSTONE_FILE, O_RDONLY | PG_BINARY);
	if (fd < 0)
	{
		ereport(LOG,
				(errcode_for_file_access(),
				 errmsg("could not open file \"%s\": %m",
						PC_SNAP_TOMBSTONE_FILE)));
		return NIL;
	}
	buf = palloc(size);
	got = read(fd, buf, size);
	CloseTransientFile(fd);
	if (got < 0)
	{
		ereport(LOG,
				(errcode_for_file_access(),
				 errmsg("could not read file \"%s\": %m",
						PC_SNAP_TOMBSTONE_FILE)));
		got = 0;
	}
	while (off + sizeof(SnapTombstone) <= (Size) got)
	{
		SnapTombstone t;

		memcpy(&t, buf + off, sizeof(t));
		if (t.magic == PC_TOMBSTONE_MAGIC && t.crc == tombstone_crc(&t))
		{
			SnapTombstone *copy = palloc(sizeof(SnapTombstone));

			t.name[NAMEDATALEN - 1] = '\0';
			memcpy(copy, &t, sizeof(t));
			result = lappend(result, copy);
			off += sizeof(t);
		}
		else
			off++;
	}
	pfree(buf);
	return result;
}

/*
 * Is rec, from a file written at written_at, of a registration buried
 * since?
 */
static bool
buried_since(List *tombstones, const SnapRecord *rec, TimestampTz written_at)
{
	ListCell   *lc;

	foreach(lc, tombstones)
	{
		SnapTombstone *t = (SnapTombstone *) lfirst(lc);

		if (t->dbid == rec->dbid && t->reg_id == rec->reg_id &&
			t->reg_stamp == rec->reg_stamp &&
			strcmp(t->name, rec->name) == 0 && t->buried_at >= written_at)
			return true;
	}
	return false;
}

/*
 * Keep only the tombstones buried at or after needed_since: the older ones
 * are known to every file that can still be restored from (see the
 * callers).  The file is rewritten under a temporary name and renamed,
 * under the tombstone lock, so that no tombstone is appended meanwhile.
 */
static void prune_tombstones_locked(TimestampTz needed_since);

static void
prune_tombstones(TimestampTz needed_since)
{
	pc_lock_alone(dump_shared->tomb_lock, LW_EXCLUSIVE);
	prune_tombstones_locked(needed_since);
	LWLockRelease(dump_shared->tomb_lock);
}

static void
prune_tombstones_locked(TimestampTz needed_since)
{
	const char *tmp = PC_SNAP_TOMBSTONE_FILE ".tmp";
	struct stat st;
	List	   *tombstones;
	List	   *kept = NIL;
	ListCell   *lc;
	int			fd;
	bool		ok = true;

	if (stat(PC_SNAP_TOMBSTONE_FILE, &st) != 0)
		return;
	tombstones = read_tombstones();
	foreach(lc, tombstones)
	{
		if (((SnapTombstone *) lfirst(lc))->buried_at >= needed_since)
			kept = lappend(kept, lfirst(lc));
	}
	if (kept == NIL)
		(void) durable_unlink(PC_SNAP_TOMBSTONE_FILE, LOG);
	else if (list_length(kept) < list_length(tombstones) ||
			 (Size) st.st_size != list_length(kept) * sizeof(SnapTombstone))
	{
		fd = OpenTransientFilePerm(tmp,
								   O_WRONLY | O_CREAT | O_TRUNC | PG_BINARY,
								   S_IRUSR | S_IWUSR);
		if (fd < 0)
			ok = false;
		foreach(lc, kept)
		{
			errno = 0;
			if (ok && write(fd, lfirst(lc), sizeof(SnapTombstone)) !=
				sizeof(SnapTombstone))
			{
				if (errno == 0)
					errno = ENOSPC;
				ok = false;
			}
		}
		if (ok && pg_fsync(fd) != 0)
			ok = false;
		if (fd >= 0)
			CloseTransientFile(fd);
		if (!ok)
		{
			ereport(LOG,
					(errcode_for_file_access(),
					 errmsg("could not write file \"%s\": %m", tmp)));
			(void) unlink(tmp);
		}
		else
			(void) durable_rename(tmp, PC_SNAP_TOMBSTONE_FILE, LOG);
	}
	list_free(kept);
	list_free_deep(tombstones);
}

/* ----------------------------------------------------------------
 * The dump and the restore file
 * ----------------------------------------------------------------
 */

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
	/* A buried snapshot: nothing written, and nothing of it carried. */
	if (!snap->buried)
	{
		resetStringInfo(&ctx->buf);
		appendBinaryStringInfo(&ctx->buf, (const char *) &rec, sizeof(rec));
		appendBinaryStringInfo(&ctx->buf, blob, snap->size);
		pc_dump_write(ctx->writer, ctx->buf.data, ctx->buf.len);
	}
	copy = palloc(sizeof(SnapRecord));
	memcpy(copy, &rec, sizeof(rec));
	ctx->written = lappend(ctx->written, copy);
}

/* Milliseconds from a to b (0 if b is not later). */
static int64
ms_between(TimestampTz a, TimestampTz b)
{
	long		secs;
	int			usecs;

	TimestampDifference(a, b, &secs, &usecs);
	return (int64) secs * 1000 + usecs / 1000;
}

/*
 * Carry over the restore file's records of snapshots not read since,
 * unless buried.  A record's age is counted up to its file's write time:
 * carried into a newer file, it grows by the time between the two, so
 * that the rows keep the time they were loaded.
 */
static void
carry_unread(DumpCtx *ctx)
{
	PcDumpReader *r = pc_dump_open(PC_SNAP_RESTORE_FILE,
								   PC_DUMP_SNAPSHOTS);
	List	   *tombstones;
	TimestampTz restore_written_at;
	int64		older_by_ms;
	char	   *payload;
	uint32		len;

	if (r == NULL)
		return;
	tombstones = read_tombstones();
	restore_written_at = pc_dump_written_at(r);
	older_by_ms = ms_between(restore_written_at, ctx->written_at);
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
		if (!live && rec.carried < PC_SNAP_CARRIES &&
			!buried_since(tombstones, &rec, restore_written_at))
		{
			/* The restore file was adopted at start: one restart more. */
			rec.carried++;
			rec.age_ms = Max(rec.age_ms, 0) + older_by_ms;
			memcpy(payload, &rec, sizeof(rec));
			pc_dump_write(ctx->writer, payload, len);
		}
		pfree(payload);
	}
	pc_dump_close(r);
	list_free_deep(tombstones);
}

/*
 * At the server's start (after a crash too), in the postmaster setting up
 * shared memory, before any other process runs: the last dump
 * becomes the file reads restore from (a damaged one is removed, said at
 * LOG once).  Without a new dump, the restore file of the last start
 * stays, so a crash before any dump loses nothing.  Tombstones that file
 * no longer needs are removed.
 */
void
pc_snap_adopt_dump(void)
{
	PcDumpReader *r;
	struct stat st;
	TimestampTz written_at = 0;

	if (pc_dump_interval_s < 0)
		return;
	if (stat(PC_SNAP_DUMP_FILE, &st) == 0)
		(void) durable_rename(PC_SNAP_DUMP_FILE, PC_SNAP_RESTORE_FILE,
							  LOG);
	r = pc_dump_open(PC_SNAP_RESTORE_FILE, PC_DUMP_SNAPSHOTS);
	if (r != NULL)
	{
		written_at = pc_dump_written_at(r);
		pc_dump_close(r);
	}
	else if (stat(PC_SNAP_RESTORE_FILE, &st) == 0)
		(void) durable_unlink(PC_SNAP_RESTORE_FILE, LOG);

	/*
	 * Tombstones older than the restore file were known to the worker that
	 * wrote it; with no restore file, none is needed.
	 */
	prune_tombstones(r != NULL ? written_at : DT_NOEND);
}

/* Write the dump of every loaded snapshot (at LOG if it fails). */
void
pc_snap_dump_all(void)
{
	DumpCtx		ctx;

	if (pc_dump_interval_s < 0)
		return;
	ctx.writer = pc_dump_begin(PC_SNAP_DUMP_FILE, PC_DUMP_SNAPSHOTS);
	if (ctx.writer == NULL)
		return;
	ctx.written_at = GetCurrentTimestamp();
	initStringInfo(&ctx.buf);
	ctx.written = NIL;
	pc_snap_dump_slots(write_snapshot, &ctx, pc_now_ms());
	carry_unread(&ctx);

	/*
	 * Written, the dump is what a crash restores from: tombstones older than
	 * it were known when it was (a slot is buried before its tombstone is
	 * written, and the tombstones were read after written_at).  The restore
	 * file, older, is kept from this server's slots by their burial.
	 */
	if (pc_dump_finish(ctx.writer, NULL))
		prune_tombstones(ctx.written_at);
	list_free_deep(ctx.written);
	pfree(ctx.buf.data);
}

static bool restore_from_file(SnapReg *reg, PcSnapRef ref);

/*
 * The first read of a slot with no rows: publish the dumped rows of this
 * registration, if the dump has them and no tombstone buried them since,
 * as restored rows (not served before a load was tried).  True if it did.
 * Other readers of the slot meanwhile wait for it (pc_snap_wait_restore)
 * rather than find no rows and start cold.
 */
bool
pc_snap_restore(SnapReg *reg, PcSnapRef ref)
{
	volatile bool restored = false;

	if (pc_dump_interval_s < 0 || !pc_snap_take_dump_check(ref))
		return false;
	PG_TRY();
	{
		restored = restore_from_file(reg, ref);
	}
	PG_CATCH();
	{
		pc_snap_dump_check_done(ref);
		PG_RE_THROW();
	}
	PG_END_TRY();
	pc_snap_dump_check_done(ref);
	return restored;
}

static bool
restore_from_file(SnapReg *reg, PcSnapRef ref)
{
	PcDumpReader *r;
	char	   *payload;
	uint32		len;
	bool		restored = false;
	bool		found = false;
	TimestampTz written_at;
	int64		since_dump_ms;

	r = pc_dump_open(PC_SNAP_RESTORE_FILE, PC_DUMP_SNAPSHOTS);
	if (r == NULL)
		return false;
	written_at = pc_dump_written_at(r);
	since_dump_ms = pc_dump_age_ms(r);

	while (!found && pc_dump_next(r, &payload, &len))
	{
		SnapRecord	rec;

		if (len >= sizeof(SnapRecord))
		{
			memcpy(&rec, payload, sizeof(rec));
			rec.name[NAMEDATALEN - 1] = '\0';
			found = rec.dbid == MyDatabaseId && rec.reg_id == reg->id &&
				rec.reg_stamp == reg->stamp &&
				strcmp(rec.name, reg->name) == 0 &&
				rec.size == len - sizeof(SnapRecord) && rec.rows >= 0;
		}
		if (found)
		{
			List	   *tombstones = read_tombstones();
			char	   *refusal = NULL;
			int64		loaded_at =
				pc_now_ms() - Max(rec.age_ms, 0) - since_dump_ms;

			if (buried_since(tombstones, &rec, written_at))
				restored = false;
			else if (pc_snap_publish_restored(ref, payload + sizeof(SnapRecord),
											  rec.size, rec.rows, loaded_at,
											  &refusal))
			{
				restored = true;
				SpinLockAcquire(&dump_shared->mutex);
				dump_shared->loaded++;
				SpinLockRelease(&dump_shared->mutex);
			}
			else if (refusal != NULL)
				ereport(LOG,
						(errmsg("projcache left the dumped rows of snapshot \"%s\" out",
								reg->name),
						 errdetail("%s", refusal)));
			list_free_deep(tombstones);
		}
		pfree(payload);
	}
	pc_dump_close(r);
	return restored;
}

/* ----------------------------------------------------------------
 * The slots' side: checking the dump once per slot, and its rows
 * ----------------------------------------------------------------
 */

/*
 * Should the dump be looked at for this slot's rows?  Once per slot and
 * generation, and only while it has none and is not buried: true for the
 * first caller.
 */
bool
pc_snap_take_dump_check(PcSnapRef ref)
{
	PcSnapSlot *s = &pc_snap_slots()[ref.index];
	bool		take = false;

	pc_lock_inner(pc_snap_slot_lock(ref.index), LW_EXCLUSIVE);
	if (s->generation == ref.generation && !s->dump_checked)
	{
		s->dump_checked = true;
		take = !DsaPointerIsValid(s->data) && !s->buried;
		if (take)
			s->dump_check_pid = MyProcPid;
	}
	LWLockRelease(pc_snap_slot_lock(ref.index));
	return take;
}

/*
 * The check pc_snap_take_dump_check() gave this backend is over (its rows
 * published, or none found): readers waiting for it look again.
 */
void
pc_snap_dump_check_done(PcSnapRef ref)
{
	PcSnapSlot *s = &pc_snap_slots()[ref.index];

	pc_lock_inner(pc_snap_slot_lock(ref.index), LW_EXCLUSIVE);
	if (s->generation == ref.generation && s->dump_check_pid == MyProcPid)
		s->dump_check_pid = 0;
	LWLockRelease(pc_snap_slot_lock(ref.index));
	ConditionVariableBroadcast(&s->cv);
}

/*
 * Hand each loaded snapshot to emit(): which registration it caches, its
 * rows' age, and a copy of its rows (made under the slot's lock, with an
 * allocation that fails quietly: a slot that cannot be copied is left out).
 * A buried slot is handed over too, with no rows (blob NULL), so that the
 * dump carries none of its registration's.  A slot whose rows are dumped
 * is due a tombstone should it be buried later (noted before the copy, so
 * that a burial in between writes one).
 */
void
pc_snap_dump_slots(void (*emit) (const PcSnapDumped *snap, const char *blob,
								 void *arg),
				   void *arg, int64 now)
{
	int			i;

	for (i = 0; i < pc_snap_shared->max_snapshots; i++)
	{
		PcSnapSlot *s = &pc_snap_slots()[i];
		PcSnapDumped snap;
		uint64		generation;
		char	   *blob = NULL;

		memset(&snap, 0, sizeof(snap));
		pc_lock_outer(pc_snap_shared->map_lock, LW_SHARED);
		if (s->in_use)
		{
			snap.dbid = s->dbid;
			strlcpy(snap.name, s->name, NAMEDATALEN);
			snap.reg_id = s->reg_id;
			snap.reg_stamp = s->reg_stamp;
		}
		generation = s->generation;
		LWLockRelease(pc_snap_shared->map_lock);
		if (!OidIsValid(snap.dbid))
			continue;

		pc_lock_inner(pc_snap_slot_lock(i), LW_EXCLUSIVE);
		if (s->generation == generation && DsaPointerIsValid(s->data))
			s->tombstone_due = true;
		LWLockRelease(pc_snap_slot_lock(i));
		pc_lock_inner(pc_snap_slot_lock(i), LW_SHARED);
		if (s->generation == generation && DsaPointerIsValid(s->data))
		{
			blob = palloc_extended(s->data_bytes,
								   MCXT_ALLOC_HUGE | MCXT_ALLOC_NO_OOM);
			if (blob != NULL)
			{
				memcpy(blob, dsa_get_address(pc_area(), s->data),
					   s->data_bytes);
				snap.size = s->data_bytes;
				snap.rows = s->rows;
				snap.age_ms = Max(now - s->loaded_at_ms, 0);
			}
		}
		else if (s->generation == generation && s->buried)
			snap.buried = true;
		LWLockRelease(pc_snap_slot_lock(i));
		if (blob != NULL || snap.buried)
			emit(&snap, blob, arg);
		if (blob != NULL)
			pfree(blob);
	}
}
