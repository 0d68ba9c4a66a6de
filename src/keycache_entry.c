/*-------------------------------------------------------------------------
 *
 * keycache_entry.c
 *	  An entry of the key map: its body (the key's bytes and only the parts
 *	  the key has), read under its partition's lock, and the worker writing
 *	  a new body in place of the old one.
 *
 * Copyright (c) 2026, projcache developers
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "utils/freepage.h"

#include "keycache_map.h"

/* ----------------------------------------------------------------
 * Entries' bodies
 * ----------------------------------------------------------------
 */

/* A split body is kept whole unless cutting it saves at least this. */
#define PC_SPLIT_MIN	16

StaticAssertDecl(ENTRY_HEADER == 44,
				 "an entry's header must stay 44 bytes: check its fields");

static dsa_pointer
entry_tail(const PcEntry *entry)
{
	PcRef		ref;

	memcpy(&ref, entry->body, sizeof(ref));
	return pc_ref_dsa(ref);
}

/* Body bytes held in the head chunk. */
static uint32
entry_cut(const PcEntry *entry)
{
	uint32		cut;

	memcpy(&cut, entry->body + sizeof(PcRef), sizeof(cut));
	return cut;
}

/* Copy body bytes [offset, offset + len), from the head and the tail. */
static void
body_read(const PcEntry *entry, Size offset, Size len, void *dst)
{
	const char *head = pc_entry_key(entry);
	Size		n = len;

	if (entry->parts & PC_PART_SPLIT)
	{
		Size		cut = entry_cut(entry);

		n = offset < cut ? Min(len, cut - offset) : 0;
		if (n < len)
		{
			const char *tail = pc_map_address(entry_tail(entry));

			memcpy((char *) dst + n, tail + (offset + n - cut), len - n);
		}
	}
	if (n > 0)
		memcpy(dst, head + offset, n);
}

static void
body_write(PcEntry *entry, Size offset, Size len, const void *src)
{
	char	   *head = (char *) pc_entry_key(entry);
	Size		n = len;

	if (entry->parts & PC_PART_SPLIT)
	{
		Size		cut = entry_cut(entry);

		n = offset < cut ? Min(len, cut - offset) : 0;
		if (n < len)
		{
			char	   *tail = pc_map_address(entry_tail(entry));

			memcpy(tail + (offset + n - cut), (const char *) src + n, len - n);
		}
	}
	if (n > 0)
		memcpy(head + offset, src, n);
}

void
pc_body_layout(const PcEntry *entry, BodyLayout *l)
{
	Size		offset = entry->keylen;

	l->retry = offset;
	if (entry->parts & PC_PART_RETRY)
		offset += sizeof(int64);
	l->periods = offset;
	if (entry->parts & PC_PART_PERIODS)
		offset += 2 * sizeof(int32);
	l->revision_len = 0;
	if (entry->parts & PC_PART_REVISION)
	{
		if (entry->revision_len == PC_REVISION_LONG)
		{
			uint32		len;

			body_read(entry, offset, sizeof(len), &len);
			offset += sizeof(len);
			l->revision_len = len;
		}
		else
			l->revision_len = entry->revision_len;
	}
	l->revision = offset;
	offset += l->revision_len;
	l->config = offset;
	l->config_len = 0;
	if (entry->parts & PC_PART_CONFIG)
	{
		union
		{
			uint64		words;	/* as long as any varlena header */
			char		bytes[sizeof(uint64)];
		}			header;

		body_read(entry, offset, VARHDRSZ, header.bytes);
		l->config_len = VARSIZE(header.bytes);
	}
	l->len = offset + l->config_len;
}

/*
 * How many of a body's len bytes go in its head chunk: all of them, or,
 * if cutting saves PC_SPLIT_MIN bytes, the cheapest cut that fills a chunk
 * of some size class or page count.  The key stays whole in the head
 * (readers compare it there).
 */
static Size
body_cut(Size keylen, Size len)
{
	Size		best = pc_dsa_footprint(ENTRY_HEADER + len);
	Size		best_cut = len;
	Size		want = ENTRY_HEADER + SPLIT_INFO + keylen + 1;

	while (want < ENTRY_HEADER + SPLIT_INFO + len)
	{
		Size		capacity = pc_dsa_capacity(want);
		Size		cut = capacity - ENTRY_HEADER - SPLIT_INFO;
		Size		cost;

		if (cut >= len)
			break;
		cost = pc_dsa_footprint(capacity) + pc_dsa_footprint(len - cut);
		if (cost + PC_SPLIT_MIN <= best)
		{
			best = cost;
			best_cut = cut;
		}
		want = capacity + 1;
		/* Past the size classes, heads are whole pages: try the last two. */
		if (capacity >= 2 * FPM_PAGE_SIZE &&
			want + 2 * FPM_PAGE_SIZE < ENTRY_HEADER + SPLIT_INFO + len)
			want = TYPEALIGN_DOWN(FPM_PAGE_SIZE,
								  ENTRY_HEADER + SPLIT_INFO + len) -
				FPM_PAGE_SIZE + 1;
	}
	return best_cut;
}

/* The sizes of the head and tail chunks of a body of len bytes (tail 0: none). */
static void
chunk_sizes(Size keylen, Size len, Size *head, Size *tail)
{
	Size		cut = body_cut(keylen, len);

	if (cut < len)
	{
		*head = ENTRY_HEADER + SPLIT_INFO + cut;
		*tail = len - cut;
	}
	else
	{
		*head = ENTRY_HEADER + len;
		*tail = 0;
	}
}

/* What a locked entry takes from the keys' memory (its message aside). */
Size
pc_entry_footprint(const PcEntry *entry)
{
	BodyLayout	l;
	Size		bytes;

	PC_ASSERT_ENTRY_LOCKED();
	pc_body_layout(entry, &l);
	if (entry->parts & PC_PART_SPLIT)
		bytes = pc_dsa_footprint(ENTRY_HEADER + SPLIT_INFO + entry_cut(entry)) +
			pc_dsa_footprint(l.len - entry_cut(entry));
	else
		bytes = pc_dsa_footprint(ENTRY_HEADER + l.len);
	return bytes;
}

/*
 * The times of an entry.  Its expiry and refresh are held as offsets from
 * its fetch time, which they are never further from than a key's longest
 * lifetime (PC_MAX_PERIOD_MS twice); the clamp only guards the encoding.
 */
static int32
time_offset(int64 t, int64 from)
{
	int64		d = t - from;

	return (int32) Max(Min(d, (int64) PG_INT32_MAX), (int64) PG_INT32_MIN);
}

int64
pc_entry_expires_at(const PcEntry *entry)
{
	if (!(entry->parts & PC_PART_EXPIRY))
		return 0;
	return entry->fetched_at + entry->expires_in;
}

int64
pc_entry_refresh_at(const PcEntry *entry)
{
	if (!entry->has_refresh)
		return 0;
	return entry->fetched_at + entry->refresh_in;
}

void
pc_entry_set_expires_at(PcEntry *entry, int64 expires_at)
{
	entry->expires_in = time_offset(expires_at, entry->fetched_at);
	entry->parts |= PC_PART_EXPIRY;
}

void
pc_entry_set_refresh_at(PcEntry *entry, int64 refresh_at)
{
	entry->refresh_in = time_offset(refresh_at, entry->fetched_at);
	entry->has_refresh = true;
}

/* Set the fetch time, keeping the expiry and refresh where they were. */
void
pc_entry_set_fetched_at(PcEntry *entry, int64 fetched_at)
{
	int64		expires_at = pc_entry_expires_at(entry);
	int64		refresh_at = pc_entry_refresh_at(entry);

	entry->fetched_at = fetched_at;
	if (entry->parts & PC_PART_EXPIRY)
		pc_entry_set_expires_at(entry, expires_at);
	if (entry->has_refresh)
		pc_entry_set_refresh_at(entry, refresh_at);
}

int64
pc_entry_retry_at(const PcEntry *entry)
{
	BodyLayout	l;
	int64		retry_at;

	if (!(entry->parts & PC_PART_RETRY))
		return 0;
	pc_body_layout(entry, &l);
	body_read(entry, l.retry, sizeof(retry_at), &retry_at);
	return retry_at;
}

dsa_pointer
pc_entry_error_ref(const PcEntry *entry)
{
	return pc_ref_dsa(entry->error);
}

/* A split entry's tail chunk; InvalidDsaPointer if it has none. */
dsa_pointer
pc_entry_tail_ref(const PcEntry *entry)
{
	if (!(entry->parts & PC_PART_SPLIT))
		return InvalidDsaPointer;
	return entry_tail(entry);
}

void
pc_entry_periods(const PcEntry *entry, int32 *max_age_ms,
				 int32 *stale_for_ms)
{
	BodyLayout	l;
	int32		periods[2];

	*max_age_ms = *stale_for_ms = PC_PERIOD_DEFAULT;
	if (!(entry->parts & PC_PART_PERIODS))
		return;
	pc_body_layout(entry, &l);
	body_read(entry, l.periods, sizeof(periods), periods);
	*max_age_ms = periods[0];
	*stale_for_ms = periods[1];
}

/*
 * What a read needs of a locked entry's body, in one walk of it: its
 * periods, its config's length and, if want_config, a copy of the config
 * (NULL if it has none, or if the copy failed: *oom set).
 */
void
pc_entry_read_value(const PcEntry *entry, bool want_config,
					PcEntryValue *v, bool *oom)
{
	BodyLayout	l;

	PC_ASSERT_ENTRY_LOCKED();
	pc_body_layout(entry, &l);
	v->max_age_ms = v->stale_for_ms = PC_PERIOD_DEFAULT;
	if (entry->parts & PC_PART_PERIODS)
	{
		int32		periods[2];

		body_read(entry, l.periods, sizeof(periods), periods);
		v->max_age_ms = periods[0];
		v->stale_for_ms = periods[1];
	}
	v->config_len = (uint32) l.config_len;
	v->config = NULL;
	if (want_config && l.config_len > 0)
	{
		v->config = palloc_extended(l.config_len, MCXT_ALLOC_NO_OOM);
		if (v->config == NULL)
			*oom = true;
		else
			body_read(entry, l.config, l.config_len, v->config);
	}
}

/*
 * Copies of the revision (NUL-terminated), the config and the last
 * message, in the current memory context; NULL if there is none.  Under
 * the entry's lock: no ERROR, a failed copy returns NULL and sets *oom.
 */
char *
pc_entry_revision(const PcEntry *entry, bool *oom)
{
	BodyLayout	l;
	char	   *dst;

	PC_ASSERT_ENTRY_LOCKED();
	if (!(entry->parts & PC_PART_REVISION))
		return NULL;
	pc_body_layout(entry, &l);
	dst = palloc_extended(l.revision_len + 1, MCXT_ALLOC_NO_OOM);
	if (dst == NULL)
	{
		*oom = true;
		return NULL;
	}
	body_read(entry, l.revision, l.revision_len, dst);
	dst[l.revision_len] = '\0';
	return dst;
}

struct varlena *
pc_entry_config(const PcEntry *entry, bool *oom)
{
	BodyLayout	l;
	char	   *dst;

	PC_ASSERT_ENTRY_LOCKED();
	if (!(entry->parts & PC_PART_CONFIG))
		return NULL;
	pc_body_layout(entry, &l);
	dst = palloc_extended(l.config_len, MCXT_ALLOC_NO_OOM);
	if (dst == NULL)
	{
		*oom = true;
		return NULL;
	}
	body_read(entry, l.config, l.config_len, dst);
	return (struct varlena *) dst;
}

char *
pc_entry_error(const PcEntry *entry, bool *oom)
{
	dsa_pointer dp = pc_entry_error_ref(entry);
	const char *msg;

	PC_ASSERT_ENTRY_LOCKED();
	if (!DsaPointerIsValid(dp))
		return NULL;
	msg = pc_map_address(dp);
	return pc_copy_no_oom(msg, strlen(msg), true, oom);
}

/* Free a message chunk (pc_store_message) no entry points to any more. */
void
pc_free_message(dsa_pointer dp)
{
	if (DsaPointerIsValid(dp))
		pc_free(dp, strlen(pc_map_address(dp)) + 1);
}

/* What chunks of these sizes take (a tail of 0 bytes is none). */
Size
pc_chunks_footprint(Size head_size, Size tail_size)
{
	return pc_dsa_footprint(head_size) +
		(tail_size > 0 ? pc_dsa_footprint(tail_size) : 0);
}

/* The chunks of a locked entry, with the sizes they were allocated at. */
void
pc_entry_chunks(const PcEntry *entry, Size *head_size, dsa_pointer *tail,
				Size *tail_size)
{
	BodyLayout	l;

	pc_body_layout(entry, &l);
	if (entry->parts & PC_PART_SPLIT)
	{
		*head_size = ENTRY_HEADER + SPLIT_INFO + entry_cut(entry);
		*tail = entry_tail(entry);
		*tail_size = l.len - entry_cut(entry);
	}
	else
	{
		*head_size = ENTRY_HEADER + l.len;
		*tail = InvalidDsaPointer;
		*tail_size = 0;
	}
}

/* ----------------------------------------------------------------
 * Writing an entry's body (the worker)
 * ----------------------------------------------------------------
 */

/*
 * Plan a write.  A new value, or a part the entry lacks, needs a new
 * chunk; a part it has is written in place, and a part set to nothing is
 * left in place, zeroed, unless the chunk is built anew anyway (then a
 * retry time of zero goes too).  The message is in the header: never a
 * new chunk.
 */
static void
plan_body(const PcEntry *entry, const PcEntryWrite *w, PcEntryPlan *plan)
{
	BodyLayout	l;
	uint8		parts = entry->parts & ~(PC_PART_SPLIT | PC_PART_EXPIRY);
	bool		periods = w->max_age_ms != PC_PERIOD_DEFAULT ||
		w->stale_for_ms != PC_PERIOD_DEFAULT;
	bool		rebuild = false;

	pc_body_layout(entry, &l);
	plan->revlen = l.revision_len;
	plan->config_len = l.config_len;
	plan->revision_len = entry->revision_len;
	if (w->set_retry && w->retry_at != 0 && !(parts & PC_PART_RETRY))
		rebuild = true;
	if (w->set_periods && periods && !(parts & PC_PART_PERIODS))
		rebuild = true;
	if (w->set_value)
	{
		rebuild = true;
		parts &= ~(PC_PART_REVISION | PC_PART_CONFIG);
		plan->revlen = 0;
		plan->config_len = 0;
		plan->revision_len = 0;
		if (w->revision != NULL)
		{
			parts |= PC_PART_REVISION;
			plan->revlen = strlen(w->revision);
			plan->revision_len = plan->revlen < PC_REVISION_LONG ?
				(uint8) plan->revlen : PC_REVISION_LONG;
		}
		if (w->config != NULL)
		{
			parts |= PC_PART_CONFIG;
			plan->config_len = VARSIZE(w->config);
		}
	}
	if (rebuild)
	{
		int64		retry_at = w->set_retry ? w->retry_at :
			pc_entry_retry_at(entry);

		parts = retry_at != 0 ? parts | PC_PART_RETRY : parts & ~PC_PART_RETRY;
		if (w->set_periods)
			parts = periods ? parts | PC_PART_PERIODS :
				parts & ~PC_PART_PERIODS;
	}
	plan->parts = parts;
	plan->rebuild = rebuild;
	plan->len = entry->keylen +
		((parts & PC_PART_RETRY) ? sizeof(int64) : 0) +
		((parts & PC_PART_PERIODS) ? 2 * sizeof(int32) : 0) +
		((parts & PC_PART_REVISION) ?
		 plan->revlen + (plan->revision_len == PC_REVISION_LONG ?
						 sizeof(uint32) : 0) : 0) +
		plan->config_len;
}

/* Copy len body bytes of one entry into another's. */
static void
body_copy(PcEntry *dst, Size dst_offset, const PcEntry *src,
		  Size src_offset, Size len)
{
	char		buf[512];

	while (len > 0)
	{
		Size		n = Min(len, sizeof(buf));

		body_read(src, src_offset, n, buf);
		body_write(dst, dst_offset, n, buf);
		src_offset += n;
		dst_offset += n;
		len -= n;
	}
}

/*
 * Fill a new chunk's body (not linked yet) from the entry it replaces,
 * locked, and the write: the key, then each part, new or kept.  Its
 * header is the entry's, copied at commit; the fields that say how the
 * body is laid out are set here, and again after that copy.
 */
static void
build_body(PcEntry *chunk, dsa_pointer tail, Size cut, const PcEntry *old,
		   const PcEntryPlan *plan, const PcEntryWrite *w)
{
	BodyLayout	l;
	Size		offset = old->keylen;

	pc_body_layout(old, &l);
	chunk->keylen = old->keylen;
	chunk->parts = plan->parts;
	chunk->revision_len = plan->revision_len;
	if (DsaPointerIsValid(tail))
	{
		PcRef		tail_ref = pc_ref_of(tail);
		uint32		cut32 = (uint32) cut;

		chunk->parts |= PC_PART_SPLIT;
		memcpy(chunk->body, &tail_ref, sizeof(tail_ref));
		memcpy(chunk->body + sizeof(tail_ref), &cut32, sizeof(cut32));
	}
	body_write(chunk, 0, old->keylen, pc_entry_key(old));
	if (plan->parts & PC_PART_RETRY)
	{
		int64		retry_at = w->set_retry ? w->retry_at :
			pc_entry_retry_at(old);

		body_write(chunk, offset, sizeof(retry_at), &retry_at);
		offset += sizeof(retry_at);
	}
	if (plan->parts & PC_PART_PERIODS)
	{
		int32		periods[2];

		if (w->set_periods)
		{
			periods[0] = w->max_age_ms;
			periods[1] = w->stale_for_ms;
		}
		else
			pc_entry_periods(old, &periods[0], &periods[1]);
		body_write(chunk, offset, sizeof(periods), periods);
		offset += sizeof(periods);
	}
	if (plan->parts & PC_PART_REVISION)
	{
		if (plan->revision_len == PC_REVISION_LONG)
		{
			uint32		len = (uint32) plan->revlen;

			body_write(chunk, offset, sizeof(len), &len);
			offset += sizeof(len);
		}
		if (w->set_value)
			body_write(chunk, offset, plan->revlen, w->revision);
		else
			body_copy(chunk, offset, old, l.revision, plan->revlen);
		offset += plan->revlen;
	}
	if (plan->parts & PC_PART_CONFIG)
	{
		if (w->set_value)
			body_write(chunk, offset, plan->config_len, w->config);
		else
			body_copy(chunk, offset, old, l.config, plan->config_len);
		offset += plan->config_len;
	}
	Assert(offset == plan->len);
}

/* Write the parts the entry has in place (no new chunk needed). */
static void
write_in_place(PcEntry *entry, const PcEntryWrite *w)
{
	BodyLayout	l;

	pc_body_layout(entry, &l);
	if (w->set_retry && (entry->parts & PC_PART_RETRY))
		body_write(entry, l.retry, sizeof(int64), &w->retry_at);
	if (w->set_periods && (entry->parts & PC_PART_PERIODS))
	{
		int32		periods[2] = {w->max_age_ms, w->stale_for_ms};

		body_write(entry, l.periods, sizeof(periods), periods);
	}
}

/*
 * What a write would allocate (0: nothing, or the key is gone), so that
 * the worker can make room for it first.
 */
Size
pc_entry_write_size(const char *key, uint32 len, const PcEntryWrite *w)
{
	PcKey		search = pc_search_key(key, len);
	PcEntry    *entry;
	PcEntryPlan plan;
	Size		head;
	Size		tail;

	entry = pc_entry_find(&search, false);
	if (entry == NULL)
		return 0;
	plan_body(entry, w, &plan);
	pc_entry_release(entry);
	if (!plan.rebuild)
		return 0;
	chunk_sizes(len, plan.len, &head, &tail);
	return pc_dsa_footprint(head) + (tail > 0 ? pc_dsa_footprint(tail) : 0);
}

/*
 * A write in two steps: pc_entry_prepare() plans it and, if it needs a new
 * chunk, allocates it under no lock and fills its body under the shared
 * lock; false if there is no room (the caller may make room and try
 * again).  pc_entry_commit() then writes the same w (its message may have
 * been set meanwhile: it goes in the header) and, through apply (NULL:
 * nothing), the header, and links the new chunk in the old one's place,
 * all under one exclusive lock; *applied says whether the entry took it
 * (not if the key is gone or apply said no).  Until it has, the caller
 * still owns w->error; once it has, the entry does, and the message it
 * replaced is freed.  pc_entry_abandon() gives up a prepared write.
 * Worker only: nothing else changes an entry's body between the two steps.
 */
bool
pc_entry_prepare(const char *key, uint32 len, const PcEntryWrite *w,
				 PcEntryPrepared *prep)
{
	PcKey		search = pc_search_key(key, len);
	PcEntry    *entry;

	memset(prep, 0, sizeof(*prep));
	prep->head = InvalidDsaPointer;
	prep->tail = InvalidDsaPointer;
	entry = pc_entry_find(&search, false);
	if (entry == NULL)
	{
		prep->gone = true;
		return true;
	}
	plan_body(entry, w, &prep->plan);
	pc_entry_release(entry);
	if (!prep->plan.rebuild)
		return true;

	chunk_sizes(len, prep->plan.len, &prep->head_size, &prep->tail_size);
	prep->head = pc_alloc(prep->head_size);
	if (!DsaPointerIsValid(prep->head))
		return false;
	if (prep->tail_size > 0)
	{
		prep->tail = pc_alloc(prep->tail_size);
		if (!DsaPointerIsValid(prep->tail))
		{
			pc_free(prep->head, prep->head_size);
			prep->head = InvalidDsaPointer;
			return false;
		}
	}

	/*
	 * Fill the new chunk now, so that the exclusive lock is held only to copy
	 * the header and relink: under the shared lock, which keeps the entry in
	 * its place; its body is this process's alone to change.
	 */
	entry = pc_entry_find(&search, false);
	if (entry == NULL)
	{
		pc_entry_abandon(prep);
		prep->gone = true;
		return true;
	}
	build_body(pc_map_address(prep->head), prep->tail,
			   prep->tail_size > 0 ?
			   prep->head_size - ENTRY_HEADER - SPLIT_INFO : prep->plan.len,
			   entry, &prep->plan, w);
	pc_entry_release(entry);
	return true;
}

void
pc_entry_abandon(PcEntryPrepared *prep)
{
	pc_free(prep->head, prep->head_size);
	pc_free(prep->tail, prep->tail_size);
	prep->head = prep->tail = InvalidDsaPointer;
}

void
pc_entry_commit(const char *key, uint32 len, const PcEntryWrite *w,
				PcEntryPrepared *prep, PcEntryApplyFn apply, void *arg,
				bool *applied)
{
	PcKey		search = pc_search_key(key, len);
	PcEntry    *entry;
	dsa_pointer old_head = InvalidDsaPointer;
	dsa_pointer old_tail = InvalidDsaPointer;
	Size		old_head_size = 0;
	Size		old_tail_size = 0;
	dsa_pointer old_error = InvalidDsaPointer;

	*applied = false;
	entry = prep->gone ? NULL : pc_entry_find(&search, true);
	if (entry == NULL || (apply != NULL && !apply(entry, arg)))
	{
		if (entry != NULL)
			pc_entry_release(entry);
		pc_entry_abandon(prep);
		return;
	}
	if (w->set_error)
	{
		old_error = pc_entry_error_ref(entry);
		entry->error = pc_ref_of(w->error);
	}
	if (prep->plan.rebuild)
	{
		PcEntry    *chunk = pc_map_address(prep->head);
		uint8		parts = chunk->parts;
		PcMapPartition *part;
		PcRef	   *link;

		/* The header as it is now, but for the new body's layout. */
		memcpy(chunk, entry, offsetof(PcEntry, parts));
		pg_atomic_init_u32(&chunk->marks, pg_atomic_read_u32(&entry->marks));
		chunk->parts = parts | (entry->parts & PC_PART_EXPIRY);
		Assert(chunk->revision_len == prep->plan.revision_len);
		link = pc_map_chain_link(entry, &part);
		pc_entry_chunks(entry, &old_head_size, &old_tail, &old_tail_size);
		old_head = pc_ref_dsa(*link);
		*link = pc_ref_of(prep->head);
		/* The owner's bytes follow (keys per role). */
		pg_atomic_fetch_add_u64(&pc_role_slot(entry->owner)->bytes,
								(int64) pc_chunks_footprint(prep->head_size,
															prep->tail_size));
		pg_atomic_fetch_sub_u64(&pc_role_slot(entry->owner)->bytes,
								(int64) pc_chunks_footprint(old_head_size,
															old_tail_size));
	}
	else
		write_in_place(entry, w);
	pc_entry_release(entry);
	prep->head = prep->tail = InvalidDsaPointer;

	pc_free(old_head, old_head_size);
	pc_free(old_tail, old_tail_size);
	if (old_error != w->error)
		pc_free_message(old_error);
	*applied = true;
}

/* Both steps at once; false if there was no room. */
bool
pc_entry_write(const char *key, uint32 len, const PcEntryWrite *w,
			   PcEntryApplyFn apply, void *arg, bool *applied)
{
	PcEntryPrepared prep;

	*applied = false;
	if (!pc_entry_prepare(key, len, w, &prep))
		return false;
	pc_entry_commit(key, len, w, &prep, apply, arg, applied);
	return true;
}
