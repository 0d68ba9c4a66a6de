/*-------------------------------------------------------------------------
 *
 * wal_records.c
 *	  projcache's WAL resource manager: invalidations and snapshot refreshes
 *	  made on a primary reach the caches of its standbys.
 *
 * Two records, written only with projcache.wal_invalidations on:
 * - INVALIDATE: the keys a transaction passed to invalidate(), each once,
 *	 written just before its commit record (XACT_EVENT_PRE_COMMIT), with
 *	 the transaction's id in the record header.  A standby cannot refetch a
 *	 key when it replays this record, since the new rows are not visible
 *	 until the commit is replayed, which PostgreSQL 15 offers no hook for.
 *	 So redo only appends the keys to a shared, bounded list, and the
 *	 standby's worker marks them stale, polls the transaction's fate, and
 *	 refetches once it committed (keycache_replay.c).
 * - REFRESH_SNAPSHOT: refresh_snapshot() ran on the primary.  It runs only
 *	 in a transaction that has written nothing, so the changes it is meant
 *	 to publish were committed before this record was written, and replayed
 *	 before it: redo marks the snapshot stale at once, and the standby's
 *	 next read loads it again.
 *
 * Redo must never fail: an ERROR in the startup process stops recovery.  It
 * allocates nothing, runs no SPI and waits for no backend: it takes the
 * list's LWLock, or the snapshot map's and then one slot's (the lock order
 * of shmem.h), copies bytes into memory reserved at server start, and sets
 * the worker's latch.  A record that does not fit is dropped and noted (see
 * wal.h).  A record it cannot read (malformed, or of a type this version
 * does not know) is logged as a WARNING and noted the same way: every cached key is then stale
 * until its transaction has ended, since its keys are unknown.
 *
 * projcache_debug_wal_record() writes records of any type and contents, so
 * that tests can feed redo records it cannot read; it works only with
 * projcache.debug_clock on, and no extension script declares it.
 *
 * The resource manager is registered by _PG_init() when the library is
 * preloaded, whatever projcache.wal_invalidations says: a server that
 * replays WAL written with it on (a standby, or this server after a crash)
 * needs it.
 *
 * Copyright (c) 2026, projcache developers
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/xact.h"
#include "access/xlog.h"
#include "access/xlog_internal.h"
#include "access/xloginsert.h"
#include "access/xlogreader.h"
#include "fmgr.h"
#include "lib/stringinfo.h"
#include "miscadmin.h"
#include "storage/lwlock.h"
#include "storage/shmem.h"
#include "utils/builtins.h"
#include "utils/pg_lsn.h"

#include "keycache.h"
#include "snapshot.h"
#include "wal.h"

/* Record types, in the high bits of xl_info. */
#define XLOG_PROJCACHE_INVALIDATE		0x00
#define XLOG_PROJCACHE_REFRESH_SNAPSHOT	0x10

/*
 * INVALIDATE's data: nkeys, then each key as a uint16 length and its bytes,
 * unaligned.  A transaction's keys are split into records of at most
 * PC_WAL_RECORD_BYTES, so that none needs a large allocation.  On the
 * standby the keys of one record take up to about 2.5 times its size in
 * the list (each item adds an xid and alignment); a record that does not
 * fit there overflows (keycache_replay.c).
 */
#define PC_WAL_RECORD_BYTES		(64 * 1024)

/* REFRESH_SNAPSHOT's data. */
typedef struct PcWalRefresh
{
	Oid			dbid;
	char		name[NAMEDATALEN];
} PcWalRefresh;

static bool rmgr_registered = false;

static void projcache_redo(XLogReaderState *record);
static void projcache_desc(StringInfo buf, XLogReaderState *record);
static const char *projcache_identify(uint8 info);

static RmgrData projcache_rmgr = {
	.rm_name = "projcache",
	.rm_redo = projcache_redo,
	.rm_desc = projcache_desc,
	.rm_identify = projcache_identify,
};

/*
 * Register the resource manager under projcache.wal_rmgr_id.  Called from
 * _PG_init() while shared_preload_libraries is processed; PostgreSQL
 * PANICs if another library took the id.
 */
void
pc_wal_register_rmgr(void)
{
	RegisterCustomRmgr((RmgrId) pc_wal_rmgr_id, &projcache_rmgr);
	rmgr_registered = true;
}

/* Does this transaction write projcache's records? */
bool
pc_wal_logging(void)
{
	return pc_wal_invalidations && rmgr_registered && !RecoveryInProgress();
}

/* ----------------------------------------------------------------
 * Writing (on the primary)
 * ----------------------------------------------------------------
 */

static void
insert_invalidate(StringInfo data, uint32 nkeys)
{
	memcpy(data->data, &nkeys, sizeof(uint32));
	XLogBeginInsert();
	XLogRegisterData(data->data, data->len);
	(void) XLogInsert((RmgrId) pc_wal_rmgr_id, XLOG_PROJCACHE_INVALIDATE);
}

/*
 * Write the keys a committing transaction invalidated (each once), before
 * its commit record.  The transaction gets an id if it has none, so that
 * it writes a commit record the standbys can wait for.
 */
void
pc_wal_log_invalidations(text **keys, int nkeys)
{
	StringInfoData data;
	uint32		in_record = 0;
	uint32		zero = 0;
	int			i;

	if (nkeys == 0 || !pc_wal_logging())
		return;
	(void) GetTopTransactionId();

	initStringInfo(&data);
	appendBinaryStringInfo(&data, (char *) &zero, sizeof(uint32));
	for (i = 0; i < nkeys; i++)
	{
		uint16		len = (uint16) VARSIZE_ANY_EXHDR(keys[i]);

		if (in_record > 0 &&
			data.len + sizeof(uint16) + len > PC_WAL_RECORD_BYTES)
		{
			insert_invalidate(&data, in_record);
			data.len = sizeof(uint32);
			in_record = 0;
		}
		appendBinaryStringInfo(&data, (char *) &len, sizeof(uint16));
		appendBinaryStringInfo(&data, VARDATA_ANY(keys[i]), len);
		in_record++;
	}
	insert_invalidate(&data, in_record);
	pfree(data.data);
}

/*
 * refresh_snapshot() ran: mark the snapshot stale on the standbys.  The
 * record is flushed at once, since a transaction that wrote nothing else
 * does not flush WAL at commit.
 */
void
pc_wal_log_refresh(Oid dbid, const char *name)
{
	PcWalRefresh rec;
	XLogRecPtr	lsn;

	if (!pc_wal_logging())
		return;
	memset(&rec, 0, sizeof(rec));
	rec.dbid = dbid;
	strlcpy(rec.name, name, NAMEDATALEN);
	XLogBeginInsert();
	XLogRegisterData((char *) &rec, sizeof(rec));
	lsn = XLogInsert((RmgrId) pc_wal_rmgr_id, XLOG_PROJCACHE_REFRESH_SNAPSHOT);
	XLogFlush(lsn);
}

/* ----------------------------------------------------------------
 * The list of replayed keys (see wal.h)
 * ----------------------------------------------------------------
 */

/*
 * The list is a part of shared memory of its own ("projcache replayed
 * keys"): the list, and the lock (tranche "projcache_wal", taken alone)
 * that protects it.
 */
typedef struct PcWalShared
{
	LWLock	   *lock;
	PcWalPending pending;		/* variable size: keep last */
} PcWalShared;

static PcWalShared *wal_shared = NULL;

#define PC_WAL_TRANCHE	"projcache_wal"

static Size
wal_shmem_size(void)
{
	return add_size(offsetof(PcWalShared, pending.data),
					(Size) pc_wal_pending_kb * 1024);
}

void
pc_wal_shmem_request(void)
{
	RequestAddinShmemSpace(wal_shmem_size());
	pc_locks_request(PC_WAL_TRANCHE, 1);
}

void
pc_wal_shmem_startup(void)
{
	bool		found;
	LWLockPadded *lock;

	wal_shared = ShmemInitStruct("projcache replayed keys", wal_shmem_size(),
								 &found);
	lock = pc_locks_get(PC_WAL_TRANCHE, 1, PC_LOCK_ALONE);
	if (found)
		return;
	wal_shared->lock = &lock->lock;
	memset(&wal_shared->pending, 0, offsetof(PcWalPending, data));
	wal_shared->pending.capacity = (Size) pc_wal_pending_kb * 1024;
	wal_shared->pending.lost_xid = InvalidTransactionId;
}

PcWalPending *
pc_wal_pending(void)
{
	return &wal_shared->pending;
}

/* The lock of pc_wal_pending()'s list. */
LWLock *
pc_wal_pending_lock(void)
{
	return wal_shared->lock;
}

/*
 * Walk an INVALIDATE record's keys: calls fn for each, and returns false
 * if the record is malformed (then nothing past the flaw is visited).
 */
static bool
walk_keys(const char *data, Size size,
		  void (*fn) (const char *key, uint16 len, void *arg), void *arg)
{
	uint32		nkeys;
	Size		pos = sizeof(uint32);
	uint32		i;

	if (size < sizeof(uint32))
		return false;
	memcpy(&nkeys, data, sizeof(uint32));
	for (i = 0; i < nkeys; i++)
	{
		uint16		len;

		if (size - pos < sizeof(uint16))
			return false;
		memcpy(&len, data + pos, sizeof(uint16));
		pos += sizeof(uint16);
		if (len == 0 || len > PC_MAX_KEY_BYTES || size - pos < len)
			return false;
		if (fn != NULL)
			fn(data + pos, len, arg);
		pos += len;
	}
	return pos == size;
}

static void
add_item_size(const char *key, uint16 len, void *arg)
{
	*(Size *) arg += PC_WAL_ITEM_SIZE(len);
}

typedef struct AppendState
{
	PcWalPending *pending;
	TransactionId xid;
} AppendState;

static void
append_item(const char *key, uint16 len, void *arg)
{
	AppendState *st = (AppendState *) arg;
	PcWalItem  *item = (PcWalItem *) (st->pending->data + st->pending->used);

	item->xid = st->xid;
	item->keylen = len;
	memcpy(item->key, key, len);
	st->pending->used += PC_WAL_ITEM_SIZE(len);
}

/*
 * A record of transaction xid was dropped: every cached key waits until
 * that transaction has ended (keycache_replay.c).  Without a transaction
 * there is nothing to wait for: the keys are only made stale.  Caller
 * holds the list's lock exclusively.
 */
static void
note_dropped(PcWalPending *pending, TransactionId xid)
{
	int			i;

	Assert(LWLockHeldByMeInMode(wal_shared->lock, LW_EXCLUSIVE));
	pending->overflowed = true;
	if (!TransactionIdIsNormal(xid))
		return;
	for (i = 0; i < pending->ndropped; i++)
	{
		if (TransactionIdEquals(pending->dropped_xids[i], xid))
			return;
	}
	if (pending->ndropped < PC_WAL_MAX_DROPPED_XIDS)
		pending->dropped_xids[pending->ndropped++] = xid;
	else if (!TransactionIdIsValid(pending->lost_xid) ||
			 TransactionIdFollows(xid, pending->lost_xid))
		pending->lost_xid = xid;
}

/*
 * A record redo cannot read: count it, say so, and treat it as dropped,
 * so that no key it may have invalidated serves as fresh.
 */
static void
redo_unreadable(XLogReaderState *record, const char *what)
{
	TransactionId xid = XLogRecGetXid(record);
	PcWalPending *pending = pc_wal_pending();

	pc_lock_alone(wal_shared->lock, LW_EXCLUSIVE);
	note_dropped(pending, xid);
	LWLockRelease(wal_shared->lock);
	pc_wake_worker();
	ereport(WARNING,
			(errcode(ERRCODE_DATA_CORRUPTED),
			 errmsg("projcache skipped a WAL record it cannot read: %s", what),
			 errdetail("Every cached key is stale until transaction %u has ended.",
					   xid)));
}

/*
 * Redo of INVALIDATE: append the record's keys, under its transaction's
 * id, to the shared list the standby's worker replays (keycache_replay.c),
 * all of them or, if they do not fit, none, noting the transaction as
 * dropped.  A record without a transaction or with malformed keys is
 * unreadable (redo_unreadable).
 */
static void
redo_invalidate(XLogReaderState *record)
{
	const char *data = XLogRecGetData(record);
	Size		size = XLogRecGetDataLen(record);
	TransactionId xid = XLogRecGetXid(record);
	PcWalPending *pending;
	Size		need = 0;

	/* Written just before a commit record, by a transaction with an id. */
	if (!TransactionIdIsNormal(xid))
	{
		redo_unreadable(record, "INVALIDATE without a transaction");
		return;
	}
	if (!walk_keys(data, size, add_item_size, &need))
	{
		redo_unreadable(record, "malformed INVALIDATE");
		return;
	}

	pending = pc_wal_pending();
	pc_lock_alone(wal_shared->lock, LW_EXCLUSIVE);
	if (pending->capacity - pending->used >= need)
	{
		AppendState st = {pending, xid};
		bool		walked PG_USED_FOR_ASSERTS_ONLY;

		walked = walk_keys(data, size, append_item, &st);
		Assert(walked);
	}
	else
		note_dropped(pending, xid);
	LWLockRelease(wal_shared->lock);
	pc_wake_worker();
}

static void
redo_refresh(XLogReaderState *record)
{
	PcWalRefresh rec;

	if (XLogRecGetDataLen(record) != sizeof(rec))
	{
		redo_unreadable(record, "malformed REFRESH_SNAPSHOT");
		return;
	}
	memcpy(&rec, XLogRecGetData(record), sizeof(rec));
	rec.name[NAMEDATALEN - 1] = '\0';
	pc_snap_mark_stale(rec.dbid, rec.name);
}

static void
projcache_redo(XLogReaderState *record)
{
	/* Shared memory is set up before recovery starts (projcache.c). */
	Assert(wal_shared != NULL);

	switch (XLogRecGetInfo(record) & ~XLR_INFO_MASK)
	{
		case XLOG_PROJCACHE_INVALIDATE:
			redo_invalidate(record);
			break;
		case XLOG_PROJCACHE_REFRESH_SNAPSHOT:
			redo_refresh(record);
			break;
		default:
			/* Written by a newer projcache, or not by projcache at all. */
			redo_unreadable(record, "unknown record type");
			break;
	}
}

/*
 * projcache_debug_wal_record(info int, data bytea) → pg_lsn: write a
 * projcache record with these xl_info bits and this data, in the calling
 * transaction, which is given an id; returns its LSN.  For tests of redo
 * only: refused unless projcache.debug_clock is on, and to non-superusers.
 * A test declares it with CREATE FUNCTION ... LANGUAGE C.
 */
PG_FUNCTION_INFO_V1(projcache_debug_wal_record);

Datum
projcache_debug_wal_record(PG_FUNCTION_ARGS)
{
	int32		info = PG_GETARG_INT32(0);
	bytea	   *data = PG_GETARG_BYTEA_PP(1);

	pc_require_debug("write projcache WAL records");
	if (info < 0 || info > 0xFF || (info & XLR_INFO_MASK) != 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("record type must be one of 0x00, 0x10, ..., 0xF0")));
	if (!rmgr_registered || RecoveryInProgress())
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("projcache WAL records can be written only on a primary that preloads projcache")));

	(void) GetTopTransactionId();
	XLogBeginInsert();
	XLogRegisterData(VARDATA_ANY(data), VARSIZE_ANY_EXHDR(data));
	PG_RETURN_LSN(XLogInsert((RmgrId) pc_wal_rmgr_id, (uint8) info));
}

/* ----------------------------------------------------------------
 * Description (pg_walinspect; pg_waldump loads no extension code)
 * ----------------------------------------------------------------
 */

#define PC_DESC_MAX_KEYS	20

typedef struct DescState
{
	StringInfo	buf;
	int			shown;
} DescState;

static void
desc_key(const char *key, uint16 len, void *arg)
{
	DescState  *st = (DescState *) arg;

	if (st->shown < PC_DESC_MAX_KEYS)
	{
		char	   *copy = pnstrdup(key, len);

		appendStringInfoString(st->buf, st->shown == 0 ? " " : ", ");
		appendStringInfoString(st->buf, quote_literal_cstr(copy));
		pfree(copy);
	}
	st->shown++;
}

/*
 * rm_desc, for pg_waldump and pg_walinspect: INVALIDATE's key count and
 * its first PC_DESC_MAX_KEYS keys, REFRESH_SNAPSHOT's database and
 * snapshot.  A malformed record is said to be one, never read past its
 * end.
 */
static void
projcache_desc(StringInfo buf, XLogReaderState *record)
{
	const char *data = XLogRecGetData(record);
	Size		size = XLogRecGetDataLen(record);

	switch (XLogRecGetInfo(record) & ~XLR_INFO_MASK)
	{
		case XLOG_PROJCACHE_INVALIDATE:
			{
				uint32		nkeys = 0;
				DescState	st = {buf, 0};

				if (size >= sizeof(uint32))
					memcpy(&nkeys, data, sizeof(uint32));
				appendStringInfo(buf, "nkeys %u; keys:", nkeys);
				if (!walk_keys(data, size, desc_key, &st))
					appendStringInfoString(buf, " (malformed)");
				else if (st.shown > PC_DESC_MAX_KEYS)
					appendStringInfo(buf, " and %d more",
									 st.shown - PC_DESC_MAX_KEYS);
				break;
			}
		case XLOG_PROJCACHE_REFRESH_SNAPSHOT:
			{
				PcWalRefresh rec;

				if (size != sizeof(rec))
				{
					appendStringInfoString(buf, "(malformed)");
					break;
				}
				memcpy(&rec, data, sizeof(rec));
				rec.name[NAMEDATALEN - 1] = '\0';
				appendStringInfo(buf, "database %u; snapshot %s",
								 rec.dbid, quote_literal_cstr(rec.name));
				break;
			}
		default:
			break;
	}
}

static const char *
projcache_identify(uint8 info)
{
	switch (info & ~XLR_INFO_MASK)
	{
		case XLOG_PROJCACHE_INVALIDATE:
			return "INVALIDATE";
		case XLOG_PROJCACHE_REFRESH_SNAPSHOT:
			return "REFRESH_SNAPSHOT";
		default:
			return NULL;
	}
}
