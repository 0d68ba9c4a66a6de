/*-------------------------------------------------------------------------
 *
 * keycache_keylist.c
 *	  Key arguments checked, and lists of keys copied out of the key map a
 *	  partition at a time (see PcKeyList in keycache.h).
 *
 * Copyright (c) 2026, projcache developers
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "utils/memutils.h"

#include "keycache.h"

/* ----------------------------------------------------------------
 * Checking a key argument
 * ----------------------------------------------------------------
 */

/* Validate a key argument. */
void
pc_check_key(text *key, const char **bytes, uint32 *len)
{
	Size		n = VARSIZE_ANY_EXHDR(key);

	if (n == 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("key must not be empty")));
	if (n > PC_MAX_KEY_BYTES)
		ereport(ERROR,
				(errcode(ERRCODE_PROGRAM_LIMIT_EXCEEDED),
				 errmsg("key is too long"),
				 errdetail("The key is %zu bytes; the limit is %d bytes.",
						   n, PC_MAX_KEY_BYTES)));
	*bytes = VARDATA_ANY(key);
	*len = (uint32) n;
}

/* ----------------------------------------------------------------
 * Key lists (see PcKeyList in keycache.h)
 * ----------------------------------------------------------------
 */
/*
 * The flags of every allocation of a list's arrays.  A list grows past the
 * 1 GB of an ordinary allocation (MaxAllocSize) at about 17 million keys
 * (the worker's list at a restart), 8 million (entries()) or 67 million
 * (the dump's list), so it is a huge allocation.  No ERROR: the lists are
 * made under partition locks.
 */
#define PC_LIST_ALLOC_FLAGS (MCXT_ALLOC_HUGE | MCXT_ALLOC_NO_OOM)

/*
 * The allocator's limit on an allocation not flagged huge: MaxAllocSize,
 * or projcache.debug_list_limit if a test lowered it (with
 * projcache.debug_clock on), so that a list of a few thousand keys passes
 * it as one of 17 million keys passes 1 GB.
 */
static Size
ordinary_alloc_limit(void)
{
	if (pc_debug_clock && pc_debug_list_limit > 0)
		return (Size) pc_debug_list_limit;
	return MaxAllocSize;
}

/*
 * Resize an array of a list to count items of size bytes each (a new one
 * if old is NULL), or return NULL if that cannot be had: the bytes
 * overflow, pass the allocator's limit, or are not there.  Never an
 * ERROR, so that the lists made under partition locks may use it; the
 * caller reports a NULL (pc_report_oom) once it holds no lock.
 */
void *
pc_array_resize_no_oom(void *old, Size count, Size size)
{
	Size		bytes;

	if (size != 0 && count > MaxAllocHugeSize / size)
		return NULL;
	bytes = Max(count * size, 1);
	if ((PC_LIST_ALLOC_FLAGS & MCXT_ALLOC_HUGE) == 0 &&
		bytes > ordinary_alloc_limit())
		return NULL;
	if (old == NULL)
		return palloc_extended(bytes, PC_LIST_ALLOC_FLAGS);
	return repalloc_extended(old, bytes, PC_LIST_ALLOC_FLAGS);
}

void
pc_keylist_init(PcKeyList *list, Size payload_size)
{
	list->capacity = 256;
	list->count = 0;
	list->oom = false;
	list->payload_size = payload_size;
	list->keys = palloc(list->capacity * sizeof(char *));
	list->lens = palloc(list->capacity * sizeof(uint32));
	list->payloads = palloc0(Max(list->capacity * payload_size, 1));
}

/* Double the list's room; false (oom set) if it cannot. */
static bool
keylist_grow(PcKeyList *list)
{
	int			newcap;
	char	  **keys;
	uint32	   *lens;
	char	   *payloads;

	if (list->capacity > INT_MAX / 2)
	{
		list->oom = true;
		return false;
	}
	newcap = list->capacity * 2;
	keys = pc_array_resize_no_oom(list->keys, newcap, sizeof(char *));
	if (keys != NULL)
		list->keys = keys;
	lens = keys ? pc_array_resize_no_oom(list->lens, newcap,
										 sizeof(uint32)) : NULL;
	if (lens != NULL)
		list->lens = lens;
	payloads = lens ? pc_array_resize_no_oom(list->payloads, newcap,
											 list->payload_size) : NULL;
	if (payloads == NULL)
	{
		list->oom = true;
		return false;
	}
	list->payloads = payloads;
	list->capacity = newcap;
	return true;
}

/* Add a copy of a key; false (oom set) if out of memory. */
bool
pc_keylist_add(PcKeyList *list, const char *key, uint32 len)
{
	char	   *copy;

	if (list->oom)
		return false;
	if (list->count == list->capacity && !keylist_grow(list))
		return false;
	copy = pc_copy_no_oom(key, len, true, &list->oom);
	if (copy == NULL)
		return false;
	list->keys[list->count] = copy;
	list->lens[list->count] = len;
	memset(pc_keylist_payload(list, list->count), 0, list->payload_size);
	list->count++;
	return true;
}

/*
 * Add every key of the map that want() accepts (NULL: every one) to an
 * initialized list, under a scan of the map, and have fill() (NULL: none)
 * write each one's payload.  Both run under the entry's partition lock:
 * they may not raise an ERROR; fill() returns false to stop the scan (it
 * set list->oom).
 */
void
pc_keylist_from_map(PcKeyList *list, bool (*want) (PcEntry *entry),
					bool (*fill) (PcEntry *entry, void *payload))
{
	PcEntryScan scan;
	PcEntry    *entry;

	pc_entry_scan_begin(&scan, false);
	while ((entry = pc_entry_scan_next(&scan)) != NULL)
	{
		if (want != NULL && !want(entry))
			continue;
		if (!pc_keylist_add(list, pc_entry_key(entry), entry->keylen))
			break;
		if (fill != NULL &&
			!fill(entry, pc_keylist_payload(list, list->count - 1)))
			break;
	}
	pc_entry_scan_end(&scan);
}
