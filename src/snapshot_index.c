/*-------------------------------------------------------------------------
 *
 * snapshot_index.c
 *	  The key index of a snapshot: built by each load, probed by scans.
 *
 * A snapshot registered with a key column (create_snapshot(..., key =>
 * 'col')) is loaded with a hash index after its rows, in the same chunk:
 * it is published, copied and replaced with them, so a scan always probes
 * the index of the rows it reads, and the index counts in the snapshot's
 * bytes and in memory_used.  The layout is described in snapshot.h.
 *
 * Keys hash with their type's default hash opclass, under the type's
 * collation.  A probe returns the rows whose key has the same hash: the
 * executor rechecks the qual (the scan keeps it), so equality is always
 * the operator's own, and a hash collision costs one comparison.
 *
 * Copyright (c) 2026, projcache developers
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "utils/typcache.h"

#include "snapshot.h"

#define PC_SNAP_INDEX_MAGIC		0x504b4958	/* "PKIX" */

/* At the very end of an indexed chunk: where the index starts. */
typedef struct PcSnapIndexTrailer
{
	uint64		index_offset;
	uint32		magic;
	uint32		unused;
} PcSnapIndexTrailer;

#define INDEX_BUCKETS(ix) \
	((const uint32 *) ((const char *) (ix) + MAXALIGN(sizeof(PcSnapIndex))))
#define INDEX_NEXT(ix)		(INDEX_BUCKETS(ix) + (ix)->nbuckets)
#define INDEX_HASHES(ix)	(INDEX_NEXT(ix) + (ix)->nrows)
#define INDEX_OFFSETS(ix) \
	((const uint64 *) ((const char *) (INDEX_HASHES(ix) + (ix)->nrows) + \
					   (((ix)->nbuckets + 2 * (ix)->nrows) % 2) * \
					   sizeof(uint32)))

/* Can a column of this type be a snapshot's key (a default hash opclass)? */
bool
pc_snap_key_hashable(Oid type)
{
	TypeCacheEntry *tc = lookup_type_cache(type, TYPECACHE_HASH_PROC |
										   TYPECACHE_EQ_OPR);

	return OidIsValid(tc->hash_proc) && OidIsValid(tc->eq_opr);
}

/* The hash of a key, as the index was built with it. */
uint32
pc_snap_key_hash(Oid type, Datum value)
{
	TypeCacheEntry *tc = lookup_type_cache(type, TYPECACHE_HASH_PROC_FINFO);

	if (!OidIsValid(tc->hash_proc))
		elog(ERROR, "type %u has no default hash function", type);
	return DatumGetUInt32(FunctionCall1Coll(&tc->hash_proc_finfo,
											tc->typcollation, value));
}

/*
 * Append the index of the chunk's nrows rows (at offsets, with hashes;
 * null_keys rows are left out), then the trailer.
 */
void
pc_snap_append_index(StringInfo chunk, uint64 nrows, const uint64 *offsets,
					 const uint32 *hashes, const bool *null_keys)
{
	PcSnapIndex header;
	PcSnapIndexTrailer trailer;
	uint32	   *buckets;
	uint32	   *next;
	uint64		nbuckets = 16;
	uint64		row;
	Size		index_offset;

	while (nbuckets < nrows && nbuckets < (UINT64CONST(1) << 31))
		nbuckets *= 2;
	if (nrows >= PG_UINT32_MAX)
		elog(ERROR, "a snapshot with a key index holds fewer than 2^32 rows");

	buckets = palloc0(nbuckets * sizeof(uint32));
	next = palloc0(Max(nrows, 1) * sizeof(uint32));
	/* Chains in row order: insert from the last row. */
	for (row = nrows; row-- > 0;)
	{
		uint32		b;

		if (null_keys[row])
			continue;
		b = hashes[row] & (nbuckets - 1);
		next[row] = buckets[b];
		buckets[b] = (uint32) row + 1;
	}

	while (chunk->len % MAXIMUM_ALIGNOF != 0)
		appendStringInfoChar(chunk, '\0');
	index_offset = chunk->len;
	memset(&header, 0, sizeof(header));
	header.magic = PC_SNAP_INDEX_MAGIC;
	header.nbuckets = (uint32) nbuckets;
	header.nrows = nrows;
	appendBinaryStringInfo(chunk, (char *) &header, sizeof(header));
	while (chunk->len % MAXIMUM_ALIGNOF != 0)
		appendStringInfoChar(chunk, '\0');
	appendBinaryStringInfo(chunk, (char *) buckets, nbuckets * sizeof(uint32));
	appendBinaryStringInfo(chunk, (char *) next, nrows * sizeof(uint32));
	appendBinaryStringInfo(chunk, (char *) hashes, nrows * sizeof(uint32));
	if ((nbuckets + 2 * nrows) % 2 != 0)
		appendBinaryStringInfo(chunk, "\0\0\0\0", sizeof(uint32));
	appendBinaryStringInfo(chunk, (char *) offsets, nrows * sizeof(uint64));
	while (chunk->len % MAXIMUM_ALIGNOF != 0)
		appendStringInfoChar(chunk, '\0');

	memset(&trailer, 0, sizeof(trailer));
	trailer.index_offset = index_offset;
	trailer.magic = PC_SNAP_INDEX_MAGIC;
	appendBinaryStringInfo(chunk, (char *) &trailer, sizeof(trailer));
	pfree(buckets);
	pfree(next);
}

/*
 * The chunk's index, if it has one for its nrows rows.  Every part of the
 * layout is checked against the chunk's size, so a probe cannot read past
 * it, whatever the chunk holds.
 */
const PcSnapIndex *
pc_snap_find_index(const char *chunk, Size size, uint64 nrows)
{
	PcSnapIndexTrailer trailer;
	const PcSnapIndex *index;
	Size		end;

	if (chunk == NULL || size < sizeof(trailer) + sizeof(PcSnapIndex))
		return NULL;
	memcpy(&trailer, chunk + size - sizeof(trailer), sizeof(trailer));
	if (trailer.magic != PC_SNAP_INDEX_MAGIC ||
		trailer.index_offset % MAXIMUM_ALIGNOF != 0 ||
		trailer.index_offset > size - sizeof(trailer) - sizeof(PcSnapIndex))
		return NULL;
	index = (const PcSnapIndex *) (chunk + trailer.index_offset);
	if (index->magic != PC_SNAP_INDEX_MAGIC || index->nrows != nrows ||
		index->nbuckets == 0 ||
		(index->nbuckets & (index->nbuckets - 1)) != 0)
		return NULL;
	end = trailer.index_offset + MAXALIGN(sizeof(PcSnapIndex)) +
		(index->nbuckets + 2 * nrows) * sizeof(uint32) +
		((index->nbuckets + 2 * nrows) % 2) * sizeof(uint32) +
		nrows * sizeof(uint64);
	if (MAXALIGN(end) != size - sizeof(trailer))
		return NULL;
	return index;
}

void
pc_snap_probe_begin(PcSnapIndexProbe *probe, const PcSnapIndex *index,
					uint32 hash)
{
	probe->index = index;
	probe->hash = hash;
	probe->next = INDEX_BUCKETS(index)[hash & (index->nbuckets - 1)];
}

/* The next row whose key has the probe's hash: its offset in the chunk. */
bool
pc_snap_probe_next(PcSnapIndexProbe *probe, uint64 *offset)
{
	const PcSnapIndex *index = probe->index;

	while (probe->next != 0)
	{
		uint32		row = probe->next - 1;

		probe->next = INDEX_NEXT(index)[row];
		if (INDEX_HASHES(index)[row] == probe->hash)
		{
			*offset = INDEX_OFFSETS(index)[row];
			return true;
		}
	}
	return false;
}
