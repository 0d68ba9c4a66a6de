/*-------------------------------------------------------------------------
 *
 * keycache_map.h
 *	  What the key map's own files tell one another: keycache_map.c (the
 *	  table and its entries), keycache_entry.c (an entry's body, and the
 *	  worker writing it) and keycache_map_check.c (the map's self-check).
 *	  No other file includes it.
 *
 * Copyright (c) 2026, projcache developers
 *
 *-------------------------------------------------------------------------
 */
#ifndef PROJCACHE_KEYCACHE_MAP_H
#define PROJCACHE_KEYCACHE_MAP_H

#include "keycache.h"

typedef struct PcMapPartition
{
	LWLock		lock;			/* the entries of this partition, and: */
	dsa_pointer buckets;		/* PcRef[nbuckets] */
	uint32		nbuckets;		/* a power of two */
	uint32		count;			/* entries */
} PcMapPartition;

/*
 * References.  The DSA area is created in place over its whole reservation
 * and never grows past it (shmem.c), so it has one segment, and every
 * dsa_pointer of it is that segment's number, 0, and an offset into it;
 * chunks are MAXALIGNed.  An offset over 8 fits in 32 bits while the area
 * is at most 32 GB, which pc_check_memory_settings() makes sure of.  No
 * chunk is at offset 0 (the area's control is), so 0 is no reference.
 */
StaticAssertDecl(MAXIMUM_ALIGNOF == 8, "chunks must be 8-byte aligned");

static inline PcRef
pc_ref_of(dsa_pointer dp)
{
	Assert(dp % MAXIMUM_ALIGNOF == 0);
	Assert(dp / MAXIMUM_ALIGNOF <= PG_UINT32_MAX);
	return (PcRef) (dp / MAXIMUM_ALIGNOF);
}

static inline dsa_pointer
pc_ref_dsa(PcRef ref)
{
	return (dsa_pointer) ref * MAXIMUM_ALIGNOF;
}

/*
 * Where the area's one segment starts in this process.  A pointer into
 * segment 0 is the offset in it, so a chunk's address is this plus its
 * pointer: the lookup dsa_get_address() makes for any segment, done
 * inline on the read path.
 */
extern char *pc_map_segment;

static inline void *
pc_map_address(dsa_pointer dp)
{
	Assert(DsaPointerIsValid(dp));
	Assert(pc_map_segment + dp == dsa_get_address(pc_area(), dp));
	return pc_map_segment + dp;
}

/* Where each part of a body starts, and its length. */
typedef struct BodyLayout
{
	Size		retry;
	Size		periods;
	Size		revision;
	Size		revision_len;
	Size		config;
	Size		config_len;
	Size		len;			/* the whole body */
} BodyLayout;

/* An entry's fixed header, and what a split body adds to it. */
#define ENTRY_HEADER	offsetof(PcEntry, body)
#define SPLIT_INFO		(sizeof(PcRef) + sizeof(uint32))

/* keycache_map.c */
extern PcRef *pc_map_chain_link(const PcEntry *entry, PcMapPartition **part);
extern int	pc_map_partition_index(uint32 hash);
extern int	pc_map_npartitions(void);
extern PcMapPartition *pc_map_partition_lock(int index);
extern void pc_map_partition_unlock(PcMapPartition *part);

/* keycache_entry.c */
extern void pc_body_layout(const PcEntry *entry, BodyLayout *l);
extern dsa_pointer pc_entry_error_ref(const PcEntry *entry);
extern dsa_pointer pc_entry_tail_ref(const PcEntry *entry);
extern Size pc_chunks_footprint(Size head_size, Size tail_size);
extern void pc_entry_chunks(const PcEntry *entry, Size *head_size, dsa_pointer *tail,
							Size *tail_size);

#endif							/* PROJCACHE_KEYCACHE_MAP_H */
