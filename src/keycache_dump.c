/*-------------------------------------------------------------------------
 *
 * keycache_dump.c
 *	  The key map's dump, so that the key cache comes back warm.
 *
 * The worker writes every key that holds a value (its state,
 * revision, config and age) to PC_KEYS_DUMP_FILE under the data directory,
 * every projcache.dump_interval and when it exits, and reads it back when
 * it starts for the first time after the server did (after a crash too:
 * the last periodic dump).  Keys come back stale, never fresh: a read
 * serves the old value and asks the source, which may answer not_modified
 * to the kept revision, with the periods its source gave it.  A key whose
 * age is past the end of its periods (its own max_age and stale_for, else
 * expiry and grace_period) is left out.
 *
 * A dump is written a slice at a time (pc_keys_dump_step), each slice
 * bounded in time, so that the worker's batches go on between slices.  The
 * keys are listed first (each partition's lock held only while its keys
 * are copied); then each key's value is copied under its partition's lock
 * and written after the lock is released: no lock is held across I/O.
 *
 * Readers of the restarted server are not served less than the dump
 * holds.  Connections are accepted before the worker has loaded it, so
 * from the server's start (keys_restore_begin, in the postmaster) until
 * the load has ended (pc_keys_restore_end), a read of a key that is not
 * in the map with a value waits for it, on the key's condition variable,
 * which the load broadcasts as it stores each key and, for all, at its
 * end.  projcache.restore_wait bounds that wait for every read together:
 * it counts from the first read that found the load not ended, so that a
 * worker that never comes (its database missing, say) costs readers
 * that much once, not on every read of a key the dump does not hold.
 *
 * Named caches.  A named cache's key is dumped with its cache's creation
 * time after its value (a record without one is the default cache's, as
 * every record of 1.2 is, which also reads such a record as not readable),
 * and is loaded only into that very cache: not once it was dropped, not
 * into one made again under its name, and no default cache's key of a
 * prefix that a cache took since (pc_key_restorable).  So a crash between
 * a drop_cache() and the next dump cannot bring a cache's values back as
 * the default cache's, where its readers' grants no longer hold.
 *
 * Tombstones.  A key that evict() removed or that turned disabled must not
 * come back from a dump written before (after a crash, the last periodic
 * dump is loaded).  Before the worker removes such a key from the map, or
 * stores its disabled state, it appends the key to PC_KEYS_TOMB_FILE
 * (pc_keys_tombstone), and a load leaves out the keys tombstoned since the
 * dump began.  Which dump a tombstone amends is told by generations: each
 * dump's header carries one, one more than the last; a tombstone carries
 * the generation current when it was written, so it amends the dump of that
 * generation and every older one.  A dump complete, the log is written
 * anew with only the tombstones of its own generation (those written while
 * it was being written).  Only keys that may be in a dump on disk, or in
 * the one being written, get a tombstone: the worker keeps a Bloom filter
 * of their keys.  The log never outgrows PC_TOMB_MAX_BYTES: past that, the
 * dumps are given up (deleted) instead, and a crash before the next dump
 * starts cold.  Evictions for memory or expiry get no tombstone: a key
 * that the cache forgot may come back after a crash, stale.
 *
 * Durability: a record is one write() before the map changes, so a crash
 * of the server's processes (which leaves the kernel's page cache) always
 * finds it.  An eviction by evict() is also fsynced before the key goes;
 * disabled keys are fsynced once per pass of the worker's loop
 * (pc_keys_tombstones_sync), so an operating-system crash may bring back
 * the disabled keys of the last batch, stale.
 *
 * Copyright (c) 2026, projcache developers
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include <unistd.h>

#include "lib/bloomfilter.h"
#include "lib/stringinfo.h"
#include "miscadmin.h"
#include "storage/condition_variable.h"
#include "storage/fd.h"
#include "storage/ipc.h"
#include "storage/lwlock.h"
#include "storage/shmem.h"
#include "storage/spin.h"
#include "utils/memutils.h"
#include "utils/timestamp.h"

#include "dump_file.h"
#include "keycache.h"
#include "keycache_caches.h"
#include "keycache_policy.h"
#include "projcache.h"
#include "shmem.h"

/*
 * One key, as written: this header, the key, then the value's bytes, and
 * for a named cache's key its cache's created_at (a TimestampTz).
 */
typedef struct KeyRecord
{
	int64		age_ms;			/* since its last successful fetch */
	uint32		keylen;
	int32		revision_len;	/* -1: no revision */
	uint32		config_len;		/* 0: no config (disabled) */
	uint8		state;			/* PC_STATE_ENABLED or PC_STATE_DISABLED */
	uint8		fifo;			/* PcDumpFifo: 0 in dumps of 1.2 */
	uint8		visited;		/* read since eviction last looked at it */
	uint8		reserved;
	int32		max_age_ms;		/* its own periods, or PC_PERIOD_DEFAULT */
	int32		stale_for_ms;
} KeyRecord;

#define PC_KEYS_TOMB_FILE	"projcache_keys.tomb"

/* Past this size, the log gives the dumps up rather than grow. */
#define PC_TOMB_MAX_BYTES	((uint64) 16 * 1024 * 1024)

/* A tombstone, as written: this header, then the key. */
typedef struct TombRecord
{
	uint32		generation;		/* current when it was written */
} TombRecord;

/* Tombstones read back, for a load or to write the log anew. */
typedef struct TombKey
{
	uint32		generation;
	uint32		len;
	char	   *key;
} TombKey;

typedef struct TombList
{
	TombKey    *items;
	int			count;
	int			capacity;
	uint32		max_generation;
	bool		bad;			/* a record of another layout */
} TombList;

struct PcKeyDump
{
	MemoryContext cxt;
	PcDumpWriter *writer;
	uint32		generation;
	bloom_filter *listed;		/* the keys listed for it */
	bool		spoiled;		/* its tombstones were given up */
	PcKeyList	list;			/* the keys, each with its PcDumpFifo (uint8) */
	int			next;
	bool		second_pass;	/* writing the keys not read since listed */
	int64		started_ms;
	StringInfoData record;
	bool		oom;
};

/*
 * The worker's tombstone state.  tomb_log is open while a dump on disk, or
 * the one being written, may need amending; dumped_keys holds the keys of
 * the dump on disk (NULL while dump_on_disk: not known, any key may be).
 */
static PcDumpLog *tomb_log = NULL;
static uint32 tomb_generation = 0;
static bool tomb_unsynced = false;
static bool dump_on_disk = false;
static bloom_filter *dumped_keys = NULL;
static PcKeyDump *dump_running = NULL;

/* ----------------------------------------------------------------
 * The dump's shared state
 *
 * A part of shared memory of its own ("projcache key dump"): whether
 * readers wait for the load (atomics), and what the last dump and load did
 * (under mutex, a spinlock).
 * ----------------------------------------------------------------
 */
typedef struct PcKeysDumpShared
{
	pg_atomic_uint32 restoring; /* the key dump is to be loaded, and its load
								 * has not ended yet */
	pg_atomic_uint64 restore_wait_until;	/* on pc_real_now_ms(): no read
											 * waits for the load past it; 0
											 * until a read first asks */
	slock_t		mutex;			/* protects the rest */
	PcKeyDumpStats stats;
} PcKeysDumpShared;

static PcKeysDumpShared *dump_shared = NULL;

static void keys_restore_begin(void);

void
pc_keys_dump_shmem_request(void)
{
	RequestAddinShmemSpace(MAXALIGN(sizeof(PcKeysDumpShared)));
}

/*
 * At a start (after a crash too), before any process can read: say whether
 * the worker has a key dump to load, so that reads wait for it.
 */
void
pc_keys_dump_shmem_startup(void)
{
	bool		found;

	dump_shared = ShmemInitStruct("projcache key dump",
								  sizeof(PcKeysDumpShared), &found);
	if (found)
		return;
	memset(dump_shared, 0, sizeof(PcKeysDumpShared));
	pg_atomic_init_u32(&dump_shared->restoring, 0);
	pg_atomic_init_u64(&dump_shared->restore_wait_until, 0);
	SpinLockInit(&dump_shared->mutex);
	keys_restore_begin();
}

/* What projcache.stats shows of the dumps. */
void
pc_keys_dump_stats(PcKeyDumpStats *stats)
{
	SpinLockAcquire(&dump_shared->mutex);
	*stats = dump_shared->stats;
	SpinLockRelease(&dump_shared->mutex);
}

/*
 * A worker starts: whether it is the first since the server started, which
 * alone reads the dump (the next ones find its keys in the map).
 */
bool
pc_keys_dump_claim_read(void)
{
	bool		first;

	SpinLockAcquire(&dump_shared->mutex);
	first = !dump_shared->stats.dump_read;
	dump_shared->stats.dump_read = true;
	SpinLockRelease(&dump_shared->mutex);
	return first;
}

/* Say what the last dump did (projcache.stats). */
static void
note_dump(uint64 keys)
{
	SpinLockAcquire(&dump_shared->mutex);
	dump_shared->stats.written_at = GetCurrentTimestamp();
	dump_shared->stats.dump_keys = keys;
	SpinLockRelease(&dump_shared->mutex);
}

/* ----------------------------------------------------------------
 * Readers waiting for the load
 * ----------------------------------------------------------------
 */

/*
 * At the server's start, in the postmaster, before any reader: is there a
 * key dump for the worker to load?
 */
static void
keys_restore_begin(void)
{
	bool		expected = pc_dump_interval_s >= 0 && !IsBinaryUpgrade &&
		access(PC_KEYS_DUMP_FILE, F_OK) == 0;

	pg_atomic_write_u32(&dump_shared->restoring, expected ? 1 : 0);
	pg_atomic_write_u64(&dump_shared->restore_wait_until, 0);
}

/* Is the key dump still to be loaded?  (Readers wait for it.) */
bool
pc_keys_restoring(void)
{
	return pg_atomic_read_u32(&dump_shared->restoring) != 0;
}

/* The load has ended, or will not happen: waiting readers read on. */
void
pc_keys_restore_end(void)
{
	if (pg_atomic_exchange_u32(&dump_shared->restoring, 0) == 0)
		return;
	pc_key_cvs_broadcast();
}

static void
restore_end_callback(int code, Datum arg)
{
	pc_keys_restore_end();
}

/*
 * How many ms a read may still wait for the load: projcache.restore_wait
 * from the first read that asked (0: no more).
 */
int64
pc_keys_restore_wait_left(void)
{
	uint64		until = pg_atomic_read_u64(&dump_shared->restore_wait_until);
	int64		now = pc_real_now_ms();

	if (until == 0)
	{
		uint64		mine = (uint64) (now + Max(pc_restore_wait_ms, 0));

		/* The first asks for everyone; a loser takes the winner's. */
		if (pg_atomic_compare_exchange_u64(&dump_shared->restore_wait_until,
										   &until, mine))
			until = mine;
	}
	return Max((int64) until - now, 0);
}

/* ----------------------------------------------------------------
 * Tombstones
 * ----------------------------------------------------------------
 */

/* A Bloom filter for n keys, in the worker's lifetime memory. */
static bloom_filter *
keys_filter(int64 n)
{
	MemoryContext old = MemoryContextSwitchTo(TopMemoryContext);
	bloom_filter *filter;

	/* 16 bits a key (at most 256 MB): few false positives */
	filter = bloom_create(Max(n, 1),
						  (int) Min(Max(n, 1) * 2 / 1024 + 1, 256 * 1024),
						  0);
	MemoryContextSwitchTo(old);
	return filter;
}

static bool
filter_has(bloom_filter *filter, const char *key, uint32 len)
{
	return !bloom_lacks_element(filter, (unsigned char *) key, len);
}

/* May the key be in the dump on disk, or in the one being written? */
static bool
maybe_dumped(const char *key, uint32 len)
{
	if (dump_running != NULL && dump_running->listed != NULL &&
		filter_has(dump_running->listed, key, len))
		return true;
	if (!dump_on_disk)
		return false;
	return dumped_keys == NULL || filter_has(dumped_keys, key, len);
}

static void
remove_file(const char *path)
{
	if (unlink(path) != 0 && errno != ENOENT)
		ereport(LOG,
				(errcode_for_file_access(),
				 errmsg("could not remove file \"%s\": %m", path)));
}

/*
 * Remove the key dump on disk, durably: a crash then starts cold rather
 * than bring back what was tombstoned.
 */
static void
remove_dump(void)
{
	if (access(PC_KEYS_DUMP_FILE, F_OK) == 0)
		(void) durable_unlink(PC_KEYS_DUMP_FILE, LOG);
	dump_on_disk = false;
	if (dumped_keys != NULL)
		bloom_free(dumped_keys);
	dumped_keys = NULL;
}

/*
 * The tombstones cannot be kept (the log is full or cannot be written):
 * give up the dumps they amend, the one on disk and the one being written.
 */
static void
tomb_give_up(const char *why)
{
	ereport(LOG,
			(errmsg("projcache removed its key dump: %s", why),
			 errdetail("A crash before the next dump starts the key cache cold; a dump at shutdown is written as usual.")));
	remove_dump();
	if (dump_running != NULL)
		dump_running->spoiled = true;
	if (tomb_log != NULL)
		pc_dump_log_close(tomb_log);
	tomb_log = NULL;
	tomb_unsynced = false;
	remove_file(PC_KEYS_TOMB_FILE);
}

static void
collect_tombstone(const char *payload, uint32 len, void *arg)
{
	TombList   *list = arg;
	TombRecord	rec;
	TombKey    *item;

	if (len <= sizeof(TombRecord) ||
		len - sizeof(TombRecord) > PC_MAX_KEY_BYTES)
	{
		list->bad = true;
		return;
	}
	memcpy(&rec, payload, sizeof(rec));
	if (list->count == list->capacity)
	{
		TombKey    *items = NULL;

		if (list->capacity <= INT_MAX / 2)
			items = pc_array_resize_no_oom(list->items,
										   Max(list->capacity * 2, 256),
										   sizeof(TombKey));
		if (items == NULL)
			pc_report_oom("the tombstones of the key dump");
		list->items = items;
		list->capacity = Max(list->capacity * 2, 256);
	}
	item = &list->items[list->count++];
	item->generation = rec.generation;
	item->len = len - sizeof(TombRecord);
	item->key = pnstrdup(payload + sizeof(TombRecord), item->len);
	list->max_generation = Max(list->max_generation, rec.generation);
}

/* Read the log: its status, and its header's generation in *base. */
static PcDumpLogStatus
read_tombstones(TombList *list, uint32 *base)
{
	PcDumpLogStatus status;

	memset(list, 0, sizeof(*list));
	*base = 0;
	status = pc_dump_log_read(PC_KEYS_TOMB_FILE, PC_DUMP_TOMBSTONES, base,
							  collect_tombstone, list);
	if (status == PC_DUMP_LOG_OK && list->bad)
	{
		ereport(LOG,
				(errmsg("projcache dump file \"%s\" ignored: a record of it is not a key",
						PC_KEYS_TOMB_FILE)));
		status = PC_DUMP_LOG_DAMAGED;
	}
	return status;
}

static bool
append_tombstone(PcDumpLog *log, uint32 generation, const char *key,
				 uint32 len, StringInfo buf)
{
	TombRecord	rec = {generation};

	resetStringInfo(buf);
	appendBinaryStringInfo(buf, (const char *) &rec, sizeof(rec));
	appendBinaryStringInfo(buf, key, len);
	return pc_dump_log_append(log, buf->data, buf->len);
}

/*
 * Write the log anew: header generation base, and the tombstones of list
 * from generation from on; it replaces the log open so far.  False (said
 * at LOG) if it could not be written.
 */
static bool
rewrite_tombstones(uint32 base, const TombList *list, uint32 from)
{
	PcDumpLog  *log = pc_dump_log_begin(PC_KEYS_TOMB_FILE,
										PC_DUMP_TOMBSTONES, base);
	StringInfoData buf;
	bool		ok = log != NULL;
	int			i;

	initStringInfo(&buf);
	for (i = 0; ok && list != NULL && i < list->count; i++)
		if (list->items[i].generation >= from)
			ok = append_tombstone(log, list->items[i].generation,
								  list->items[i].key, list->items[i].len,
								  &buf);
	pfree(buf.data);
	if (ok)
		ok = pc_dump_log_commit(log);
	if (!ok)
	{
		if (log != NULL)
			pc_dump_log_close(log);
		return false;
	}
	if (tomb_log != NULL)
		pc_dump_log_close(tomb_log);
	tomb_log = log;
	tomb_unsynced = false;
	return true;
}

static void
free_tombstones(TombList *list)
{
	int			i;

	for (i = 0; i < list->count; i++)
		pfree(list->items[i].key);
	if (list->items != NULL)
		pfree(list->items);
	memset(list, 0, sizeof(*list));
}

/*
 * Before the worker removes a key for evict() (sync: fsynced at once) or
 * stores it disabled (fsynced by pc_keys_tombstones_sync): record it, if a
 * dump may hold it, so that no load brings it back.  had_value: the key
 * holds a value in the map.  One that never had one since it was created
 * gets no tombstone while which keys the dump holds is unknown (after a
 * worker restart): else a role reading keys the source does not know would
 * fill the tombstone file, and the dump would be removed.  Such a key can
 * be in a dump only if it was evicted for memory since, and those may come
 * back anyway.
 */
void
pc_keys_tombstone(const char *key, uint32 len, bool sync, bool had_value)
{
	StringInfoData buf;
	bool		ok;

	if (tomb_log == NULL || !maybe_dumped(key, len))
		return;
	if (!had_value && dumped_keys == NULL && dump_on_disk)
		return;
	if (pc_dump_log_size(tomb_log) + sizeof(TombRecord) + len + 16 >
		PC_TOMB_MAX_BYTES)
	{
		tomb_give_up(psprintf("its tombstone file \"%s\" reached %d MB",
							  PC_KEYS_TOMB_FILE,
							  (int) (PC_TOMB_MAX_BYTES / (1024 * 1024))));
		return;
	}
	initStringInfo(&buf);
	ok = append_tombstone(tomb_log, tomb_generation, key, len, &buf);
	pfree(buf.data);
	if (ok && sync)
		ok = pc_dump_log_sync(tomb_log);
	else if (ok)
		tomb_unsynced = true;
	if (!ok)
		tomb_give_up(psprintf("its tombstone file \"%s\" could not be written",
							  PC_KEYS_TOMB_FILE));
}

/* fsync the tombstones written since the last call, if any. */
void
pc_keys_tombstones_sync(void)
{
	if (!tomb_unsynced || tomb_log == NULL)
		return;
	tomb_unsynced = false;
	if (!pc_dump_log_sync(tomb_log))
		tomb_give_up(psprintf("its tombstone file \"%s\" could not be written",
							  PC_KEYS_TOMB_FILE));
}

/*
 * A worker started again while the server ran (the map is warm, no dump
 * is loaded): go on with the tombstones its predecessor kept.  Which keys
 * the dump on disk holds is not known here, so any key may be.
 */
void
pc_keys_tombstones_resume(void)
{
	TombList	list;
	uint32		base;

	switch (read_tombstones(&list, &base))
	{
		case PC_DUMP_LOG_MISSING:
			break;
		case PC_DUMP_LOG_DAMAGED:
			tomb_give_up(psprintf("its tombstone file \"%s\" is damaged",
								  PC_KEYS_TOMB_FILE));
			break;
		case PC_DUMP_LOG_OK:
			tomb_generation = Max(base, list.max_generation);
			dump_on_disk = access(PC_KEYS_DUMP_FILE, F_OK) == 0;
			if (!rewrite_tombstones(base, &list, 0))
				tomb_give_up(psprintf("its tombstone file \"%s\" could not be written",
									  PC_KEYS_TOMB_FILE));
			break;
	}
	free_tombstones(&list);
}

static int
tomb_key_cmp(const void *a, const void *b)
{
	const TombKey *x = a;
	const TombKey *y = b;

	if (x->len != y->len)
		return x->len < y->len ? -1 : 1;
	return memcmp(x->key, y->key, x->len);
}

static bool
tombstoned(const TombList *list, const char *key, uint32 len)
{
	TombKey		search;

	if (list->count == 0)
		return false;
	search.len = len;
	search.key = unconstify(char *, key);
	return bsearch(&search, list->items, list->count, sizeof(TombKey),
				   tomb_key_cmp) != NULL;
}

/* Add a copy of one key to d's list; false (d->oom set) if out of memory. */
static bool
list_add(PcKeyDump *d, const char *key, uint32 len, PcDumpFifo fifo)
{
	if (!pc_keylist_add(&d->list, key, len))
	{
		d->oom = true;
		return false;
	}
	*(uint8 *) pc_keylist_payload(&d->list, d->list.count - 1) = (uint8) fifo;
	return true;
}

/* Key i's FIFO, as listed. */
static PcDumpFifo
listed_fifo(PcKeyDump *d, int i)
{
	return (PcDumpFifo) *(uint8 *) pc_keylist_payload(&d->list, i);
}

/* Is the entry more than pending (a key of the dump)? */
static bool
has_value_state(PcEntry *entry)
{
	return entry->state != PC_STATE_PENDING;
}

/*
 * List the keys to dump: those next_key() gives, in its order, or without
 * it every key of the map, in the map's order.  Copies are made under the
 * partition locks with allocations that fail quietly (an ERROR must not
 * leave a lock held): a failure sets d->oom.
 */
static void
list_keys(PcKeyDump *d, PcDumpNextKey next_key, void *arg)
{
	pc_keylist_init(&d->list, sizeof(uint8));
	if (next_key != NULL)
	{
		const char *key;
		uint32		len;
		PcDumpFifo	fifo;

		while ((key = next_key(arg, &len, &fifo)) != NULL)
			if (!list_add(d, key, len, fifo))
				break;
		return;
	}
	/* Each with PC_DUMP_FIFO_UNKNOWN, the zeroed payload. */
	pc_keylist_from_map(&d->list, has_value_state, NULL);
	d->oom = d->list.oom;
}

/*
 * Start a dump: list the keys and open the file.  NULL if the file cannot
 * be written (said at LOG).
 */
PcKeyDump *
pc_keys_dump_begin(PcDumpNextKey next_key, void *arg)
{
	MemoryContext cxt = AllocSetContextCreate(TopMemoryContext,
											  "projcache key dump",
											  ALLOCSET_DEFAULT_SIZES);
	MemoryContext old = MemoryContextSwitchTo(cxt);
	PcKeyDump  *d = palloc0(sizeof(PcKeyDump));

	d->cxt = cxt;
	d->started_ms = pc_real_now_ms();
	initStringInfo(&d->record);

	/*
	 * A dump on disk that no tombstone log amends (a server run with dumps
	 * off left it, or its tombstones were given up) goes first: a crash while
	 * this one is written must not load it.
	 */
	if (tomb_log == NULL)
	{
		remove_dump();
		if (!rewrite_tombstones(tomb_generation, NULL, 0))
		{
			MemoryContextSwitchTo(old);
			MemoryContextDelete(cxt);
			return NULL;
		}
	}
	/* Tombstones from now on amend this dump too. */
	d->generation = ++tomb_generation;

	list_keys(d, next_key, arg);
	if (!d->oom)
	{
		int			i;

		d->listed = keys_filter(d->list.count);
		for (i = 0; i < d->list.count; i++)
			bloom_add_element(d->listed, (unsigned char *) d->list.keys[i],
							  d->list.lens[i]);
		d->writer = pc_dump_begin_generation(PC_KEYS_DUMP_FILE, PC_DUMP_KEYS,
											 d->generation);
	}
	MemoryContextSwitchTo(old);
	if (d->oom)
		ereport(LOG,
				(errcode(ERRCODE_OUT_OF_MEMORY),
				 errmsg("projcache key dump skipped: out of memory listing the keys")));
	if (d->writer == NULL)
	{
		if (d->listed != NULL)
			bloom_free(d->listed);
		MemoryContextDelete(cxt);
		return NULL;
	}
	dump_running = d;
	return d;
}

/* What copy_record() did with a key. */
typedef enum RecordCopy
{
	RECORD_COPIED,				/* in d->record */
	RECORD_GONE,				/* no value any more, or out of memory */
	RECORD_LATER				/* not read since eviction looked: pass two */
} RecordCopy;

/*
 * Copy key i's record into d->record under its partition's lock.  The
 * first pass takes only the keys read since eviction last looked at them,
 * which it would keep: they go first, so that a load that stops at the
 * memory bound leaves out those eviction would take first.
 */
static RecordCopy
copy_record(PcKeyDump *d, int i, int64 now)
{
	PcKey		search = pc_search_key(d->list.keys[i], d->list.lens[i]);
	PcEntry    *entry;
	KeyRecord	rec;
	RecordCopy	result = RECORD_GONE;
	bool		visited;
	bool		tagged;
	TimestampTz tag;
	PcCacheId	cache = PC_CACHE_ID_DEFAULT;
	Size		tag_at = 0;

	entry = pc_entry_find(&search, false);
	if (entry == NULL)
		return RECORD_GONE;
	visited = pc_entry_visited(entry);
	if (!d->second_pass && !visited)
		result = RECORD_LATER;
	else if (entry->state != PC_STATE_PENDING)
	{
		char	   *revision = pc_entry_revision(entry, &d->oom);
		struct varlena *config = pc_entry_config(entry, &d->oom);
		int32		revision_len = revision ? (int32) strlen(revision) : -1;
		uint32		config_len = config ? VARSIZE(config) : 0;
		Size		need;

		/* Room for its cache's tag, which is known once the lock is gone. */
		tag_at = sizeof(KeyRecord) + d->list.lens[i] + Max(revision_len, 0) +
			config_len;
		need = tag_at + sizeof(TimestampTz);
		cache = entry->cache;

		/* Grow the buffer without an ERROR while the lock is held. */
		if (need >= (Size) d->record.maxlen)
		{
			char	   *bigger = repalloc_extended(d->record.data, need + 1,
												   MCXT_ALLOC_NO_OOM);

			if (bigger == NULL)
				d->oom = true;
			else
			{
				d->record.data = bigger;
				d->record.maxlen = need + 1;
			}
		}
		if (!d->oom)
		{
			memset(&rec, 0, sizeof(rec));
			rec.age_ms = Max(now - entry->fetched_at, 0);
			rec.keylen = d->list.lens[i];
			rec.revision_len = revision_len;
			rec.config_len = config_len;
			rec.state = entry->state;
			rec.fifo = (uint8) listed_fifo(d, i);
			rec.visited = visited ? 1 : 0;
			pc_entry_periods(entry, &rec.max_age_ms, &rec.stale_for_ms);
			memcpy(d->record.data, &rec, sizeof(rec));
			memcpy(d->record.data + sizeof(rec), d->list.keys[i], d->list.lens[i]);
			if (revision != NULL)
				memcpy(d->record.data + sizeof(rec) + d->list.lens[i],
					   revision, revision_len);
			if (config != NULL)
				memcpy(d->record.data + sizeof(rec) + d->list.lens[i] +
					   Max(revision_len, 0), config, config_len);
			d->record.len = tag_at;
			result = RECORD_COPIED;
		}
		if (revision != NULL)
			pfree(revision);
		if (config != NULL)
			pfree(config);
	}
	pc_entry_release(entry);

	/*
	 * A named cache's key is tagged with its cache's creation time; a key of
	 * a cache that is closing or gone is left out.  (The caches' lock is
	 * taken alone: not under the entry's.)
	 */
	if (result == RECORD_COPIED)
	{
		if (!pc_cache_dump_tag(cache, &tagged, &tag))
			result = RECORD_GONE;
		else if (tagged)
		{
			memcpy(d->record.data + tag_at, &tag, sizeof(tag));
			d->record.len = tag_at + sizeof(tag);
		}
	}
	return result;
}

/*
 * Write keys until deadline_ms (on pc_real_now_ms()) or the last; true
 * when the dump is complete (or failed: pc_keys_dump_end says which).  Two
 * passes over the list, in its order: the keys read since eviction last
 * looked at them, then the others.
 */
bool
pc_keys_dump_step(PcKeyDump *d, int64 deadline_ms)
{
	MemoryContext old = MemoryContextSwitchTo(d->cxt);
	int64		now = pc_now_ms();

	while (!d->oom && !d->spoiled)
	{
		int			i;
		RecordCopy	copied;

		if (d->next >= d->list.count)
		{
			if (d->second_pass)
				break;
			d->second_pass = true;
			d->next = 0;
			continue;			/* the list may be empty */
		}
		i = d->next++;
		if (d->list.keys[i] == NULL)
			continue;
		copied = copy_record(d, i, now);
		if (copied != RECORD_LATER)
		{
			if (copied == RECORD_COPIED)
				pc_dump_write(d->writer, d->record.data, d->record.len);
			pfree(d->list.keys[i]);
			d->list.keys[i] = NULL;
		}
		if ((d->next & 255) == 0 && pc_real_now_ms() >= deadline_ms)
			break;
	}
	MemoryContextSwitchTo(old);
	return (d->second_pass && d->next >= d->list.count) || d->oom || d->spoiled;
}

/* Finish (or, with discard, give up) a dump; frees it. */
void
pc_keys_dump_end(PcKeyDump *d, bool discard)
{
	uint64		written;

	Assert(dump_running == d);
	dump_running = NULL;
	if (d->oom)
		ereport(LOG,
				(errcode(ERRCODE_OUT_OF_MEMORY),
				 errmsg("projcache key dump given up: out of memory copying a value")));
	if (discard || d->oom || d->spoiled || !d->second_pass ||
		d->next < d->list.count)
		pc_dump_discard(d->writer);
	else if (pc_dump_finish(d->writer, &written))
	{
		TombList	list;
		uint32		base;

		note_dump(written);
		ereport(DEBUG1,
				(errmsg_internal("projcache dumped " UINT64_FORMAT " keys in " INT64_FORMAT " ms",
								 written, pc_real_now_ms() - d->started_ms)));
		/* Its keys are the ones on disk now. */
		if (dumped_keys != NULL)
			bloom_free(dumped_keys);
		dumped_keys = d->listed;
		d->listed = NULL;
		dump_on_disk = true;

		/*
		 * Only the tombstones written while it was written amend it.  Until
		 * the log is written anew, the old one (with them) still does.
		 */
		if (read_tombstones(&list, &base) != PC_DUMP_LOG_OK ||
			!rewrite_tombstones(d->generation, &list, d->generation))
			tomb_give_up(psprintf("its tombstone file \"%s\" could not be written anew",
								  PC_KEYS_TOMB_FILE));
		free_tombstones(&list);
	}
	if (d->listed != NULL)
		bloom_free(d->listed);
	MemoryContextDelete(d->cxt);
}

/*
 * Check one record's layout; the checksum said it is what was written, so
 * a mismatch means another projcache wrote it.
 */
static bool
record_valid(const char *payload, uint32 len, KeyRecord *rec, bool *tagged,
			 TimestampTz *tag)
{
	Size		value_len;
	Size		untagged_len;

	if (len < sizeof(KeyRecord))
		return false;
	memcpy(rec, payload, sizeof(KeyRecord));
	if (rec->keylen == 0 || rec->keylen > PC_MAX_KEY_BYTES ||
		rec->revision_len < -1 ||
		rec->max_age_ms < PC_PERIOD_DEFAULT ||
		rec->max_age_ms > PC_MAX_PERIOD_MS ||
		rec->stale_for_ms < PC_PERIOD_DEFAULT ||
		rec->stale_for_ms > PC_MAX_PERIOD_MS ||
		(rec->state != PC_STATE_ENABLED && rec->state != PC_STATE_DISABLED) ||
		rec->fifo > PC_DUMP_FIFO_MAIN || rec->visited > 1)
		return false;
	value_len = (Size) Max(rec->revision_len, 0) + rec->config_len;
	untagged_len = sizeof(KeyRecord) + rec->keylen + value_len;
	*tagged = (Size) len == untagged_len + sizeof(TimestampTz);
	if ((Size) len != untagged_len && !*tagged)
		return false;
	if (*tagged)
		memcpy(tag, payload + untagged_len, sizeof(TimestampTz));
	if (rec->config_len > 0)
	{
		struct varlena *config =
			(struct varlena *) (payload + sizeof(KeyRecord) +
								rec->keylen +
								Max(rec->revision_len, 0));
		uint32		header;

		if (rec->config_len < VARHDRSZ)
			return false;
		memcpy(&header, config, sizeof(header));
		if (VARSIZE(&header) != rec->config_len)
			return false;
	}
	return true;
}

static uint64 load_dump(PcDumpRestoreFn restore);

/*
 * Load the dump into the key map, once per server start, before the
 * worker's first fetch.  Each key loaded is stored stale (invalidated)
 * with its age, and handed to restore() for the worker's state.
 * Returns the number of keys loaded; stops when memory nears its bound.
 * However it ends (an ERROR, or the worker's termination meanwhile),
 * readers waiting for the load read on.
 */
uint64
pc_keys_load_dump(PcDumpRestoreFn restore)
{
	volatile uint64 loaded;

	PG_ENSURE_ERROR_CLEANUP(restore_end_callback, (Datum) 0);
	{
		loaded = load_dump(restore);
	}
	PG_END_ENSURE_ERROR_CLEANUP(restore_end_callback, (Datum) 0);
	pc_keys_restore_end();
	return loaded;
}

/*
 * The tombstones that amend a dump of the given generation (of that
 * generation or later), sorted for tombstoned().  False, after giving the
 * dumps up, if its log is damaged or missing: without it, the dump could
 * bring back what was evicted (a dump of 1.2, generation 0, had none; any
 * later one has its log).
 */
static bool
tombstones_for(uint32 generation, TombList *tombs)
{
	uint32		base;
	PcDumpLogStatus status = read_tombstones(tombs, &base);
	int			i;
	int			kept = 0;

	if (status == PC_DUMP_LOG_DAMAGED ||
		(status == PC_DUMP_LOG_MISSING && generation > 0))
	{
		free_tombstones(tombs);
		tomb_give_up(psprintf(status == PC_DUMP_LOG_DAMAGED ?
							  "its tombstone file \"%s\" is damaged" :
							  "its tombstone file \"%s\" is missing",
							  PC_KEYS_TOMB_FILE));
		return false;
	}
	for (i = 0; i < tombs->count; i++)
	{
		if (tombs->items[i].generation >= generation)
			tombs->items[kept++] = tombs->items[i];
		else
			pfree(tombs->items[i].key);
	}
	tombs->count = kept;
	if (kept > 0)
		qsort(tombs->items, kept, sizeof(TombKey), tomb_key_cmp);
	return true;
}

/* What a load did with the dump's records, for its LOG line. */
typedef struct LoadCounts
{
	uint64		loaded;
	uint64		too_old;		/* past their lifetime */
	uint64		bad;			/* not readable */
	uint64		removed;		/* tombstoned */
	uint64		other_cache;	/* dumped for a cache that is gone, or a key
								 * of a cache made since */
	bool		full;			/* stopped with memory nearly full */
} LoadCounts;

/* A restored key's header (a PcEntryApplyFn). */
typedef struct RestoredHeader
{
	const KeyRecord *rec;
	int64		fetched_at;
	int64		expires_at;
	PcCacheId	cache;
} RestoredHeader;

/*
 * A reader may have had the key fetched meanwhile: then it keeps that.
 * Nor does another cache's entry of the key take the record.
 */
static bool
restore_header(PcEntry *entry, void *arg)
{
	RestoredHeader *h = arg;

	if (entry->state != PC_STATE_PENDING || entry->cache != h->cache)
		return false;
	entry->state = h->rec->state;
	entry->fetch_state = PC_FETCH_COMPLETE;
	pc_entry_set_fetched_at(entry, h->fetched_at);
	pc_entry_set_expires_at(entry, h->expires_at);
	entry->invalidated = true;
	if (h->rec->visited)
		(void) pc_entry_visit(entry, pc_now_ms());
	return true;
}

/*
 * Store one valid record's key in the map, for cache, stale, with its age,
 * unless a reader's fetch cached it meanwhile; false if there was no room
 * (which ends the load).
 */
static bool
store_record(const KeyRecord *rec, const char *key, PcCacheId cache,
			 int64 fetched_at, int64 expires_at, PcDumpRestoreFn restore,
			 LoadCounts *counts)
{
	const char *data = key + rec->keylen;
	char	   *revision = NULL;
	struct varlena *config = NULL;
	PcEntryWrite w = {0};
	PcEntryPrepared prep;
	RestoredHeader h;
	PcEntry    *entry;
	bool		created;
	bool		applied;

	if (rec->revision_len >= 0)
		revision = pnstrdup(data, rec->revision_len);
	if (rec->config_len > 0)
	{
		config = palloc(rec->config_len);
		memcpy(config, data + Max(rec->revision_len, 0), rec->config_len);
	}
	entry = pc_keymap_find_or_create(key, rec->keylen, cache, &created);
	if (entry == NULL)
		return false;
	pc_entry_release(entry);

	w.set_value = true;
	w.revision = revision;
	w.config = config;
	w.set_periods = true;
	w.max_age_ms = rec->max_age_ms;
	w.stale_for_ms = rec->stale_for_ms;
	if (!pc_entry_prepare(key, rec->keylen, &w, &prep))
	{
		/* No room: take back the entry made for it, unless read since. */
		if (created)
		{
			PcKey		search = pc_search_key(key, rec->keylen);

			entry = pc_entry_find(&search, true);
			if (entry != NULL)
			{
				if (entry->state == PC_STATE_PENDING &&
					pg_atomic_read_u32(&entry->marks) == 0)
					pc_keymap_delete(entry);
				else
					pc_entry_release(entry);
			}
		}
		return false;
	}
	h.rec = rec;
	h.fetched_at = fetched_at;
	h.expires_at = expires_at;
	h.cache = cache;
	pc_entry_commit(key, rec->keylen, &w, &prep, restore_header, &h,
					&applied);
	if (revision)
		pfree(revision);
	if (config)
		pfree(config);
	if (!applied)
		return true;			/* cached meanwhile */
	restore(key, rec->keylen, fetched_at, expires_at, rec->max_age_ms,
			rec->stale_for_ms, (PcDumpFifo) rec->fifo);
	counts->loaded++;
	/* A reader may wait for it. */
	ConditionVariableBroadcast(pc_key_cv(key, rec->keylen));
	return true;
}

/*
 * Load one record of the dump, or count why not; false once memory is
 * nearly full (past 'high'), which ends the load.
 */
static bool
load_record(const char *payload, uint32 len, const TombList *tombs,
			int64 now, int64 since_dump_ms, Size high,
			PcDumpRestoreFn restore, LoadCounts *counts)
{
	KeyRecord	rec;
	const char *key;
	int64		age;
	int64		lifetime;
	bool		tagged = false;
	TimestampTz tag = 0;
	PcCacheId	cache;

	if (!record_valid(payload, len, &rec, &tagged, &tag))
	{
		counts->bad++;
		return true;
	}
	key = payload + sizeof(KeyRecord);
	bloom_add_element(dumped_keys, (unsigned char *) key, rec.keylen);
	if (tombstoned(tombs, key, rec.keylen))
	{
		counts->removed++;
		return true;
	}
	if (!pc_key_restorable(key, rec.keylen, tagged, tag, &cache))
	{
		counts->other_cache++;
		return true;
	}
	age = rec.age_ms + since_dump_ms;
	/* past the end of its own periods, under the settings now */
	lifetime = policy_period(rec.max_age_ms, pc_expiry_ms) +
		policy_period(rec.stale_for_ms, pc_grace_period_ms);
	if (age > lifetime)
	{
		counts->too_old++;
		return true;
	}
	if (pc_key_memory_used() > high ||
		!store_record(&rec, key, cache, now - age, now - age + lifetime,
					  restore, counts))
	{
		counts->full = true;
		return false;
	}
	return true;
}

static uint64
load_dump(PcDumpRestoreFn restore)
{
	PcDumpReader *r;
	char	   *payload;
	uint32		len;
	LoadCounts	counts = {0};
	TombList	tombs;
	uint32		generation;
	int64		now = pc_now_ms();
	int64		since_dump_ms;
	Size		high = pc_key_memory_target();

	r = pc_dump_open(PC_KEYS_DUMP_FILE, PC_DUMP_KEYS);
	if (r == NULL)
	{
		/* nothing for tombstones to amend */
		remove_file(PC_KEYS_TOMB_FILE);
		return 0;
	}
	generation = pc_dump_generation(r);
	if (!tombstones_for(generation, &tombs))
	{
		pc_dump_close(r);
		return 0;
	}
	dump_on_disk = true;
	dumped_keys = keys_filter((int64) pc_dump_count(r));

	since_dump_ms = pc_dump_age_ms(r);

	while (pc_dump_next(r, &payload, &len))
	{
		bool		more;

		CHECK_FOR_INTERRUPTS();
		more = load_record(payload, len, &tombs, now, since_dump_ms, high,
						   restore, &counts);
		pfree(payload);
		if (!more)
			break;
	}

	/* Keys it holds that the filter missed: any key may be in it. */
	if (counts.full || counts.bad > 0)
	{
		bloom_free(dumped_keys);
		dumped_keys = NULL;
	}

	/* The tombstones go on amending it, in a log begun anew. */
	tomb_generation = Max(generation, tombs.max_generation);
	if (!rewrite_tombstones(generation, &tombs, generation))
		tomb_give_up(psprintf("its tombstone file \"%s\" could not be written anew",
							  PC_KEYS_TOMB_FILE));
	free_tombstones(&tombs);

	SpinLockAcquire(&dump_shared->mutex);
	dump_shared->stats.loaded_keys = counts.loaded;
	dump_shared->stats.loaded_age_ms = since_dump_ms;
	SpinLockRelease(&dump_shared->mutex);
	ereport(LOG,
			(errmsg("projcache loaded " UINT64_FORMAT " keys from \"%s\", written %.1f s ago",
					counts.loaded, PC_KEYS_DUMP_FILE,
					(double) since_dump_ms / 1000.0),
			 (counts.too_old > 0 || counts.bad > 0 || counts.removed > 0 ||
			  counts.other_cache > 0 || counts.full) ?
			 errdetail("Left out: " UINT64_FORMAT " past expiry + grace_period or their own periods, "
					   UINT64_FORMAT " not readable, " UINT64_FORMAT " evicted or disabled since the dump, "
					   UINT64_FORMAT " of a named cache dropped or made since%s.",
					   counts.too_old, counts.bad, counts.removed,
					   counts.other_cache,
					   counts.full ?
					   "; loading stopped with memory nearly full" : "") : 0));
	pc_dump_close(r);
	return counts.loaded;
}
