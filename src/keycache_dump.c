/*-------------------------------------------------------------------------
 *
 * keycache_dump.c
 *	  The key map's dump, so that the key cache comes back warm.
 *
 * The scheduler worker writes every key that holds a value (its state,
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
 * Copyright (c) 2026, projcache developers
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "lib/stringinfo.h"
#include "miscadmin.h"
#include "storage/lwlock.h"
#include "utils/memutils.h"
#include "utils/timestamp.h"

#include "dump_file.h"
#include "keycache.h"
#include "projcache.h"
#include "scheduler.h"
#include "shmem.h"

/* One key, as written: this header, the key, then the value's bytes. */
typedef struct KeyRecord
{
	int64		age_ms;			/* since its last successful fetch */
	uint32		keylen;
	int32		revision_len;	/* -1: no revision */
	uint32		config_len;		/* 0: no config (disabled) */
	uint8		state;			/* PC_STATE_ENABLED or PC_STATE_DISABLED */
	uint8		reserved[3];
	int32		max_age_ms;		/* its own periods, or PC_PERIOD_DEFAULT */
	int32		stale_for_ms;
} KeyRecord;

struct PcKeyDump
{
	MemoryContext cxt;
	PcDumpWriter *writer;
	char	  **keys;
	uint32	   *lens;
	int			count;
	int			next;
	int64		started_ms;
	StringInfoData record;
	bool		oom;
};

/* Say what the last dump or load did (projcache.stats). */
static void
note_dump(uint64 keys)
{
	SpinLockAcquire(&pc_shared->mutex);
	pc_shared->dump_written_at = GetCurrentTimestamp();
	pc_shared->dump_keys = keys;
	SpinLockRelease(&pc_shared->mutex);
}

/*
 * List every key of the map.  Only copies are made under the partition
 * locks, with allocations that fail quietly (an ERROR must not leave a
 * lock held): a failure sets d->oom.
 */
static void
list_keys(PcKeyDump *d)
{
	dshash_seq_status status;
	PcEntry    *entry;
	int			capacity = 1024;

	d->keys = palloc(capacity * sizeof(char *));
	d->lens = palloc(capacity * sizeof(uint32));
	pc_entry_scan_begin(&status, false);
	while ((entry = dshash_seq_next(&status)) != NULL)
	{
		char	   *copy;

		if (entry->state == PC_STATE_PENDING)
			continue;
		if (d->count == capacity)
		{
			char	  **keys = repalloc_extended(d->keys,
												 2 * capacity * sizeof(char *),
												 MCXT_ALLOC_NO_OOM);
			uint32	   *lens;

			if (keys == NULL)
			{
				d->oom = true;
				break;
			}
			d->keys = keys;
			lens = repalloc_extended(d->lens, 2 * capacity * sizeof(uint32),
									 MCXT_ALLOC_NO_OOM);
			if (lens == NULL)
			{
				d->oom = true;
				break;
			}
			d->lens = lens;
			capacity *= 2;
		}
		copy = pc_copy_no_oom(pc_key_bytes(pc_area(), &entry->key),
							  entry->key.len, false, NULL);
		if (copy == NULL)
		{
			d->oom = true;
			break;
		}
		d->keys[d->count] = copy;
		d->lens[d->count] = entry->key.len;
		d->count++;
	}
	pc_entry_scan_end(&status);
}

/*
 * Start a dump: list the keys and open the file.  NULL if the file cannot
 * be written (said at LOG).
 */
PcKeyDump *
pc_keys_dump_begin(void)
{
	MemoryContext cxt = AllocSetContextCreate(TopMemoryContext,
											  "projcache key dump",
											  ALLOCSET_DEFAULT_SIZES);
	MemoryContext old = MemoryContextSwitchTo(cxt);
	PcKeyDump  *d = palloc0(sizeof(PcKeyDump));

	d->cxt = cxt;
	d->started_ms = pc_real_now_ms();
	initStringInfo(&d->record);
	list_keys(d);
	if (!d->oom)
		d->writer = pc_dump_begin(PC_KEYS_DUMP_FILE, PC_DUMP_KEYS);
	MemoryContextSwitchTo(old);
	if (d->oom)
		ereport(LOG,
				(errcode(ERRCODE_OUT_OF_MEMORY),
				 errmsg("projcache key dump skipped: out of memory listing the keys")));
	if (d->writer == NULL)
	{
		MemoryContextDelete(cxt);
		return NULL;
	}
	return d;
}

/*
 * Copy one key's record into d->record under its partition's lock; false
 * if the key has no value any more (or the copy failed, which sets oom).
 */
static bool
copy_record(PcKeyDump *d, const char *key, uint32 len, int64 now)
{
	PcKey		search = pc_search_key(key, len);
	PcEntry    *entry;
	KeyRecord	rec;
	bool		found = false;

	entry = pc_entry_find(&search, false);
	if (entry == NULL)
		return false;
	if (entry->state != PC_STATE_PENDING && DsaPointerIsValid(entry->value))
	{
		const PcValue *value = dsa_get_address(pc_area(), entry->value);
		Size		value_len = Max(value->revision_len, 0) + value->config_len;
		Size		need = sizeof(KeyRecord) + len + value_len;

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
			rec.keylen = len;
			rec.revision_len = value->revision_len;
			rec.config_len = value->config_len;
			rec.state = entry->state;
			rec.max_age_ms = entry->max_age_ms;
			rec.stale_for_ms = entry->stale_for_ms;
			memcpy(d->record.data, &rec, sizeof(rec));
			memcpy(d->record.data + sizeof(rec), key, len);
			pc_value_read(value, 0, value_len,
						  d->record.data + sizeof(rec) + len);
			d->record.len = need;
			found = true;
		}
	}
	pc_entry_release(entry);
	return found;
}

/*
 * Write keys until deadline_ms (on pc_real_now_ms()) or the last; true
 * when the dump is complete (or failed: pc_keys_dump_end says which).
 */
bool
pc_keys_dump_step(PcKeyDump *d, int64 deadline_ms)
{
	MemoryContext old = MemoryContextSwitchTo(d->cxt);
	int64		now = pc_now_ms();

	while (d->next < d->count && !d->oom)
	{
		int			i = d->next++;

		if (copy_record(d, d->keys[i], d->lens[i], now))
			pc_dump_write(d->writer, d->record.data, d->record.len);
		pfree(d->keys[i]);
		d->keys[i] = NULL;
		if ((d->next & 255) == 0 && pc_real_now_ms() >= deadline_ms)
			break;
	}
	MemoryContextSwitchTo(old);
	return d->next >= d->count || d->oom;
}

/* Finish (or, with discard, give up) a dump; frees it. */
void
pc_keys_dump_end(PcKeyDump *d, bool discard)
{
	uint64		written;

	if (d->oom)
		ereport(LOG,
				(errcode(ERRCODE_OUT_OF_MEMORY),
				 errmsg("projcache key dump given up: out of memory copying a value")));
	if (discard || d->oom || d->next < d->count)
		pc_dump_discard(d->writer);
	else if (pc_dump_finish(d->writer, &written))
	{
		note_dump(written);
		ereport(DEBUG1,
				(errmsg_internal("projcache dumped " UINT64_FORMAT " keys in " INT64_FORMAT " ms",
								 written, pc_real_now_ms() - d->started_ms)));
	}
	MemoryContextDelete(d->cxt);
}

/*
 * Check one record's layout; the checksum said it is what was written, so
 * a mismatch means another projcache wrote it.
 */
static bool
record_valid(const char *payload, uint32 len, KeyRecord *rec)
{
	Size		value_len;

	if (len < sizeof(KeyRecord))
		return false;
	memcpy(rec, payload, sizeof(KeyRecord));
	if (rec->keylen == 0 || rec->keylen > PC_MAX_KEY_BYTES ||
		rec->revision_len < -1 ||
		rec->max_age_ms < PC_PERIOD_DEFAULT ||
		rec->max_age_ms > PC_MAX_PERIOD_MS ||
		rec->stale_for_ms < PC_PERIOD_DEFAULT ||
		rec->stale_for_ms > PC_MAX_PERIOD_MS ||
		(rec->state != PC_STATE_ENABLED && rec->state != PC_STATE_DISABLED))
		return false;
	value_len = (Size) Max(rec->revision_len, 0) + rec->config_len;
	if ((Size) len != sizeof(KeyRecord) + rec->keylen + value_len)
		return false;
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

/*
 * Load the dump into the key map, once per server start, before the
 * worker's first fetch.  Each key loaded is stored stale (invalidated)
 * with its age, and handed to restore() for the scheduler's state.
 * Returns the number of keys loaded; stops when memory nears its bound.
 */
uint64
pc_keys_load_dump(void (*restore) (const char *key, uint32 len,
								   int64 fetched_at, int64 expires_at,
								   int32 max_age_ms, int32 stale_for_ms))
{
	PcDumpReader *r;
	char	   *payload;
	uint32		len;
	uint64		loaded = 0;
	uint64		too_old = 0;
	uint64		bad = 0;
	bool		full = false;
	int64		now = pc_now_ms();
	int64		since_dump_ms;
	long		secs;
	int			usecs;
	Size		high = pc_key_memory_bound() / 100 * 90;

	r = pc_dump_open(PC_KEYS_DUMP_FILE, PC_DUMP_KEYS);
	if (r == NULL)
		return 0;
	TimestampDifference(pc_dump_written_at(r), GetCurrentTimestamp(),
						&secs, &usecs);
	since_dump_ms = (int64) secs * 1000 + usecs / 1000;

	while (!full && pc_dump_next(r, &payload, &len))
	{
		KeyRecord	rec;
		const char *key;
		const char *data;
		char	   *revision = NULL;
		struct varlena *config = NULL;
		int64		age;
		int64		lifetime;
		int64		fetched_at;
		int64		expires_at;
		PcEntry    *entry;
		bool		created;
		dsa_pointer value;

		CHECK_FOR_INTERRUPTS();
		if (!record_valid(payload, len, &rec))
		{
			bad++;
			pfree(payload);
			continue;
		}
		age = rec.age_ms + since_dump_ms;
		/* past the end of its own periods, under the settings now */
		lifetime = sched_period(rec.max_age_ms, pc_expiry_ms) +
			sched_period(rec.stale_for_ms, pc_grace_period_ms);
		if (age > lifetime)
		{
			too_old++;
			pfree(payload);
			continue;
		}
		if (pc_key_memory_used() > high)
		{
			full = true;
			pfree(payload);
			break;
		}
		key = payload + sizeof(KeyRecord);
		data = key + rec.keylen;
		if (rec.revision_len >= 0)
			revision = pnstrdup(data, rec.revision_len);
		if (rec.config_len > 0)
		{
			config = palloc(rec.config_len);
			memcpy(config, data + Max(rec.revision_len, 0), rec.config_len);
		}
		fetched_at = now - age;
		expires_at = fetched_at + lifetime;

		value = pc_value_make(revision, config);
		if (!DsaPointerIsValid(value))
		{
			full = true;
			pfree(payload);
			break;
		}
		entry = pc_keymap_find_or_create(key, rec.keylen, &created);
		if (entry == NULL)
		{
			pc_value_free(value);
			full = true;
			pfree(payload);
			break;
		}
		/* A reader may have asked for the key already: it gets the value. */
		if (entry->state == PC_STATE_PENDING)
		{
			entry->value = value;
			entry->state = rec.state;
			entry->fetch_state = PC_FETCH_COMPLETE;
			entry->fetched_at = fetched_at;
			entry->expires_at = expires_at;
			entry->max_age_ms = rec.max_age_ms;
			entry->stale_for_ms = rec.stale_for_ms;
			entry->invalidated = true;
			value = InvalidDsaPointer;
		}
		pc_entry_release(entry);
		if (DsaPointerIsValid(value))
			pc_value_free(value);	/* cached meanwhile */
		else
		{
			restore(key, rec.keylen, fetched_at, expires_at, rec.max_age_ms,
					rec.stale_for_ms);
			loaded++;
		}
		if (revision)
			pfree(revision);
		if (config)
			pfree(config);
		pfree(payload);
	}

	SpinLockAcquire(&pc_shared->mutex);
	pc_shared->loaded_keys = loaded;
	pc_shared->loaded_dump_age_ms = since_dump_ms;
	SpinLockRelease(&pc_shared->mutex);
	ereport(LOG,
			(errmsg("projcache loaded " UINT64_FORMAT " keys from \"%s\", written %.1f s ago",
					loaded, PC_KEYS_DUMP_FILE, (double) since_dump_ms / 1000.0),
			 (too_old > 0 || bad > 0 || full) ?
			 errdetail("Left out: " UINT64_FORMAT " past expiry + grace_period or their own periods, "
					   UINT64_FORMAT " not readable%s.",
					   too_old, bad,
					   full ?
					   "; loading stopped with memory nearly full" : "") : 0));
	pc_dump_close(r);
	return loaded;
}
