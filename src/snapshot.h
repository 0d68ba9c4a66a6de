/*-------------------------------------------------------------------------
 *
 * snapshot.h
 *	  The snapshot cache: shared slots, loads in a worker, and the registry.
 *
 * Copyright (c) 2026, projcache developers
 *
 *-------------------------------------------------------------------------
 */
#ifndef PROJCACHE_SNAPSHOT_H
#define PROJCACHE_SNAPSHOT_H

#include "executor/tuptable.h"
#include "lib/stringinfo.h"
#include "shmem.h"
#include "user_switch.h"
#include "utils/timestamp.h"

/* ----------------------------------------------------------------
 * Snapshot slots (snapshot_store.c)
 * ----------------------------------------------------------------
 */

/* What one slot says about its snapshot, for the snapshots view. */
typedef struct PcSnapInfo
{
	bool		loaded;
	int64		rows;
	int64		bytes;
	int64		loaded_at_ms;
	bool		marked_stale;	/* by WAL redo, until the next load */
	bool		restored;		/* from the dump; no load tried since */
	bool		attempted;
	int64		last_attempt_ms;
	int64		refresh_errors;
	bool		last_failed;
	char	   *last_error;		/* palloc'd, or NULL */
} PcSnapInfo;

/* A reader's handle on a slot: index plus the generation it was taken at. */
typedef struct PcSnapRef
{
	int			index;
	uint64		generation;
} PcSnapRef;

extern void pc_snap_shmem_request(void);
extern void pc_snap_shmem_startup(void);
extern bool pc_snap_memory_reserve(Size footprint);
extern void pc_snap_memory_release(Size footprint);
extern Size pc_snap_memory_used(void);
extern Size pc_snap_messages_footprint(void);
extern void pc_snap_registry_changed(void);
extern uint64 pc_snap_registry_generation(void);
extern PcSnapRef pc_snap_acquire(Oid dbid, const char *name, int64 reg_id,
								 int64 reg_stamp, Oid owner, bool none_ok);

/* Which registration a slot caches. */
typedef struct PcSnapKey
{
	char		name[NAMEDATALEN];
	int64		reg_id;
	int64		reg_stamp;
} PcSnapKey;

extern List *pc_snap_slots_of(Oid dbid);
extern void pc_snap_forget(Oid dbid, const char *name, int64 reg_id,
						   int64 reg_stamp);

/* A snapshot's last attempt time when no attempt was made yet. */
#define PC_NEVER	PG_INT64_MIN

extern bool pc_snap_publish(PcSnapRef ref, const char *blob, Size size,
							int64 rows, int64 now, uint64 stale_marks,
							char **refusal);
extern bool pc_snap_publish_restored(PcSnapRef ref, const char *blob,
									 Size size, int64 rows, int64 loaded_at,
									 char **refusal);
extern int64 pc_snap_record_failure(PcSnapRef ref, const char *message,
									int64 now, bool rights_checked);
extern bool pc_snap_record_lost_rights(PcSnapRef ref, const char *message,
									   int64 now);
extern bool pc_snap_describe(Oid dbid, const char *name, int64 reg_id,
							 int64 reg_stamp, PcSnapInfo *info);

/* ----------------------------------------------------------------
 * Freshness, the cold-start claim and the refresh lease
 * (snapshot_claim.c)
 * ----------------------------------------------------------------
 */
extern bool pc_snap_is_fresh(PcSnapRef ref, int64 now, int64 ttl_ms,
							 bool *loaded);
extern bool pc_snap_awaits_load(PcSnapRef ref);

/* What pc_snap_wait_restore() says. */
typedef enum PcSnapWait
{
	PC_SNAP_WAIT_NONE,			/* nothing to wait for */
	PC_SNAP_WAIT_WOKEN,			/* what it waited for ended: look again */
	PC_SNAP_WAIT_LEASE_FREE,	/* restored rows await a load nobody holds the
								 * lease for: try it */
	PC_SNAP_WAIT_TIMEOUT		/* the deadline passed */
} PcSnapWait;

extern PcSnapWait pc_snap_wait_restore(PcSnapRef ref, int64 deadline);

typedef enum PcClaim
{
	PC_CLAIM_WON,
	PC_CLAIM_THROTTLED,
	PC_CLAIM_GONE
} PcClaim;

extern PcClaim pc_snap_cold_claim(PcSnapRef ref, int64 now, int64 ttl_ms,
								  int64 *throttled_since, int64 *prev_attempt);
extern void pc_snap_cold_unclaim(PcSnapRef ref, int64 claimed_at,
								 int64 prev_attempt);
extern bool pc_snap_lease_take(PcSnapRef ref, int64 now, int64 lease_ms);
extern void pc_snap_lease_drop(PcSnapRef ref);
extern uint64 pc_snap_stale_marks(PcSnapRef ref);
extern void pc_snap_mark_stale(Oid dbid, const char *name);

/* ----------------------------------------------------------------
 * This backend's copies of the rows (snapshot_copy.c)
 * ----------------------------------------------------------------
 */
extern bool pc_snap_copy(PcSnapRef ref, int64 now, int64 ttl_ms,
						 bool only_fresh, char **blob, Size *size,
						 int64 *rows);
extern void pc_snap_trim_local_copy(void);
extern void pc_snap_pin_copy(const char *blob);
extern void pc_snap_unpin_copy(const char *blob);

/* ----------------------------------------------------------------
 * Snapshot loads in a background worker (snapshot_load.c)
 * ----------------------------------------------------------------
 */
typedef enum PcLoadStatus
{
	PC_LOAD_NONE,				/* the worker did not report: failed, and the
								 * owner's rights were not checked */
	PC_LOAD_OK,					/* rows published */
	PC_LOAD_FAILED,				/* the source failed: last-good applies */
	PC_LOAD_REVOKED,			/* the owner lost its rights, or is gone */
	PC_LOAD_BUSY				/* no load worker to be had: not the source */
} PcLoadStatus;

/* projcache.max_load_workers and max_load_workers_per_role (projcache.c) */
extern int	pc_max_load_workers;
extern int	pc_max_load_workers_per_role;

extern void pc_load_shmem_request(void);
extern void pc_load_shmem_startup(void);

extern bool pc_snap_types_match(int natts, const Oid *coltypes,
								TupleDesc desc);
extern PcLoadStatus pc_snap_load(Oid owner, Oid view, const char *query,
								 const char *name, int natts,
								 const Oid *coltypes, int key_attno,
								 PcSnapRef ref, char **error,
								 int *sqlerrcode);

/* ----------------------------------------------------------------
 * The key index of a snapshot (snapshot_index.c)
 * ----------------------------------------------------------------
 */

/*
 * A snapshot registered with a key column carries, after its rows and in
 * the same chunk, a hash index from the key's hash to its rows: a header,
 * then uint32 buckets[nbuckets] (first row + 1 of each chain, 0 if none),
 * uint32 next[nrows] (next row + 1 in the chain), uint32 hashes[nrows] and
 * uint64 offsets[nrows] (each row's place in the chunk).  A trailer at the
 * very end of the chunk says where the header is.  Rows whose key is NULL
 * are in no chain.
 */
typedef struct PcSnapIndex
{
	uint32		magic;
	uint32		nbuckets;		/* a power of two */
	uint64		nrows;
} PcSnapIndex;

typedef struct PcSnapIndexProbe
{
	const PcSnapIndex *index;
	uint32		hash;
	uint32		next;			/* next row + 1 to look at, 0: done */
} PcSnapIndexProbe;

extern bool pc_snap_key_hashable(Oid type);
extern uint32 pc_snap_key_hash(Oid type, Datum value);
extern void pc_snap_append_index(StringInfo chunk, uint64 nrows,
								 const uint64 *offsets, const uint32 *hashes,
								 const bool *null_keys);
extern const PcSnapIndex *pc_snap_find_index(const char *chunk, Size size,
											 uint64 nrows);
extern void pc_snap_probe_begin(PcSnapIndexProbe *probe,
								const PcSnapIndex *index, uint32 hash);
extern bool pc_snap_probe_next(PcSnapIndexProbe *probe, uint64 *offset);
extern PGDLLEXPORT void pc_snap_load_main(Datum main_arg);


/* ----------------------------------------------------------------
 * The snapshots' dump (snapshot_dump.c)
 * ----------------------------------------------------------------
 */
#define PC_SNAP_DUMP_FILE	"projcache_snapshots.dump"
#define PC_SNAP_RESTORE_FILE	"projcache_snapshots.restore"
#define PC_SNAP_TOMBSTONE_FILE	"projcache_snapshots.tombstones"

extern void pc_snap_dump_all(void);
extern void pc_snap_adopt_dump(void);
extern void pc_snap_dump_shmem_request(void);
extern void pc_snap_dump_shmem_startup(void);
extern uint64 pc_snap_dump_loaded(void);

/* A loaded snapshot as the dump sees it (pc_snap_dump_slots). */
typedef struct PcSnapDumped
{
	Oid			dbid;
	char		name[NAMEDATALEN];
	int64		reg_id;
	int64		reg_stamp;
	int64		rows;
	int64		age_ms;			/* since its rows were loaded */
	uint64		size;			/* bytes of rows (and key index) */
	bool		buried;			/* no rows: dropped for lost rights */
} PcSnapDumped;

extern bool pc_snap_take_dump_check(PcSnapRef ref);
extern void pc_snap_dump_check_done(PcSnapRef ref);
extern void pc_snap_dump_slots(void (*emit) (const PcSnapDumped *snap,
											 const char *blob, void *arg),
							   void *arg, int64 now);


/* ----------------------------------------------------------------
 * The registry and registrations: the table (snapshot_registry.c), the
 * readers' cache (snapshot_regcache.c), the checks and the backing view
 * (snapshot_view.c), and the transaction's part (snapshot_xact.c)
 * ----------------------------------------------------------------
 */
/* One row of projcache.snapshot_registry. */
typedef struct SnapReg
{
	int64		id;
	int64		stamp;			/* created_at, in microseconds */
	char	   *name;
	char	   *query;
	int64		ttl_ms;
	Oid			owner;
	int			natts;
	char	  **colnames;
	Oid		   *coltypes;
	int			nreaders;
	Oid		   *readers;
	Oid			view;			/* backing view; InvalidOid under 1.0 SQL */
	char	   *bind_error;		/* why 1.0.1 could not bind it, or NULL */
	int			key_attno;		/* key column (1-based), or 0: no key index */
	bool		created_here;	/* registered by the current transaction */
} SnapReg;

/* A registration as the snapshots view lists it (pc_registry_list). */
typedef struct SnapRegSummary
{
	char	   *name;
	int64		id;
	int64		stamp;			/* created_at, in microseconds */
	Oid			owner;
	Interval   *ttl;
	int64		ttl_ms;
	int			nreaders;
	Oid		   *readers;
} SnapRegSummary;

/* snapshot_registry.c: the only code that runs SQL on the registry */
extern bool pc_registry_has_views(void);
extern SnapReg *pc_registry_lookup(const char *name, bool missing_ok);
extern List *pc_registry_names(bool unbound_only);
extern SnapRegSummary *pc_registry_list(int *nregs);
extern int64 pc_registry_next_id(void);
extern bool pc_registry_insert(int64 id, const char *name, const char *query,
							   Interval *ttl, Oid owner, TupleDesc columns,
							   Oid view, const char *key);
extern bool pc_registry_delete(const char *name);
extern void pc_registry_set_reader(const char *name, Oid reader,
								   bool allowed);
extern void pc_registry_set_view(int64 id, Oid view, const char *bind_error);
extern void pc_snap_check_owner(SnapReg *reg);
extern bool pc_snap_may_read(SnapReg *reg);
extern void pc_snap_check_reader(SnapReg *reg);
extern TupleDesc pc_snap_registered_desc(SnapReg *reg);
extern char *pc_snap_describe_columns(SnapReg *reg);
extern bool pc_snap_desc_matches(SnapReg *reg, TupleDesc desc);

/* snapshot_regcache.c */
extern SnapReg *pc_registry_lookup_cached(const char *name, bool missing_ok);
extern SnapReg *pc_registry_lookup_for_read(const char *name, bool missing_ok);

/* snapshot_view.c */
extern char *pc_snap_check_name(text *arg);
extern int64 pc_snap_check_ttl(Interval *ttl);
extern TupleDesc pc_snap_check_query(const char *query,
									 const char *search_path);
extern char *pc_snap_creator_search_path(void);
extern Oid	pc_snap_create_view(int64 id, const char *name, const char *query,
								const char *search_path, Oid owner);

/* snapshot_xact.c */
extern void pc_registry_changed(void);
extern void pc_snap_remember_created(int64 id);
extern void pc_snap_forget_at_commit(SnapReg *reg);
extern void pc_snap_install_hooks(void);

/* ----------------------------------------------------------------
 * Reading (snapshot_sql.c), shared with the foreign tables (snapshot_fdw.c)
 * ----------------------------------------------------------------
 */

/* "snapshot unavailable": clients retry on this one code. */
#define ERRCODE_PROJCACHE_SNAPSHOT_UNAVAILABLE \
	MAKE_SQLSTATE('P','C','0','0','1')

extern void pc_snap_current_rows(SnapReg *reg, char **blob, Size *size,
								 int64 *nrows);
extern void pc_snap_place_values(TupleDesc out, TupleTableSlot *stored,
								 Datum *values, bool *nulls);

/* Rows from the dump for a slot that has none (snapshot_dump.c). */
extern bool pc_snap_restore(SnapReg *reg, PcSnapRef ref);
extern void pc_snap_bury(SnapReg *reg);

#endif							/* PROJCACHE_SNAPSHOT_H */
