/*-------------------------------------------------------------------------
 *
 * projcache.c
 *	  Module entry point: settings, shared memory hooks, worker registration.
 *
 * projcache must be loaded through shared_preload_libraries: its caches live
 * in shared memory reserved at postmaster start, and its worker is a
 * background worker registered here.
 *
 * Copyright (c) 2026, projcache developers
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/rmgr.h"
#include "fmgr.h"
#include "miscadmin.h"
#include "postmaster/postmaster.h"
#include "storage/ipc.h"
#include "utils/guc.h"
#include "utils/memutils.h"

#include "keycache.h"
#include "keycache_caches.h"
#include "snapshot.h"
#include "stream_worker.h"
#include "wal.h"

/*
 * The parts of shared memory.  Each owns its struct (its own
 * ShmemInitStruct("projcache <part>")), its named locks and their place in
 * the lock order (locks.h); this list is all that knows them all.  The
 * area comes first: the key map is created in it.
 */
typedef struct PcShmemPart
{
	void		(*request) (void);	/* from shmem_request_hook */
	void		(*startup) (void);	/* from shmem_startup_hook */
}			PcShmemPart;

static const PcShmemPart parts[] = {
	{pc_area_shmem_request, pc_area_shmem_startup}, /* shmem.c */
	{pc_keymap_shmem_request, pc_keymap_shmem_startup}, /* keycache_map.c */
	{pc_roles_shmem_request, pc_roles_shmem_startup},	/* keycache_roles.c */
	{pc_clock_shmem_request, pc_clock_shmem_startup},	/* clock.c */
	{pc_counters_shmem_request, pc_counters_shmem_startup}, /* counters.c */
	{pc_worker_shmem_request, pc_worker_shmem_startup}, /* keycache_worker.c */
	{pc_ring_shmem_request, pc_ring_shmem_startup}, /* keycache_ring.c */
	{pc_caches_shmem_request, pc_caches_shmem_startup}, /* keycache_caches.c */
	{pc_keys_dump_shmem_request, pc_keys_dump_shmem_startup},	/* keycache_dump.c */
	{pc_wal_shmem_request, pc_wal_shmem_startup},	/* wal_records.c */
	{pc_snap_shmem_request, pc_snap_shmem_startup}, /* snapshot_store.c */
	{pc_snap_dump_shmem_request, pc_snap_dump_shmem_startup},	/* snapshot_dump.c */
	{pc_load_shmem_request, pc_load_shmem_startup}, /* snapshot_load.c */
	{pc_streams_shmem_request, pc_streams_shmem_startup},	/* stream_worker.c */
};

PG_MODULE_MAGIC;

void		_PG_init(void);

/* Settings; doc/settings.md says what each one does. */
char	   *pc_database = NULL;
char	   *pc_fetch_function = NULL;
char	   *pc_fetch_role = NULL;
char	   *pc_notify_channel = NULL;
int			pc_expiry_ms = 300 * 1000;
int			pc_grace_period_ms = 120 * 1000;
int			pc_refresh_interval_ms = 0;
int			pc_max_retry_backoff_ms = 60 * 1000;
int			pc_batch_size = 500;
int			pc_batch_interval_ms = 100;
int			pc_fetch_timeout_ms = 30 * 1000;
int			pc_max_memory_kb = 64 * 1024;
int			pc_max_snapshots = 64;
int			pc_max_streams = 4;
int			pc_snap_memory_kb = -1;
int			pc_snap_memory_per_owner_kb = -1;
int			pc_max_snapshots_per_owner = -1;
int			pc_max_snapshots_per_database = -1;
bool		pc_debug_clock = false;
int			pc_debug_list_limit = 0;
int			pc_dump_interval_s = 300;
int			pc_restore_wait_ms = 5000;
bool		pc_wal_invalidations = false;
int			pc_wal_rmgr_id = RM_EXPERIMENTAL_ID;
int			pc_wal_pending_kb = 1024;
int			pc_max_load_workers = 4;
int			pc_max_load_workers_per_role = 2;
int			pc_max_keys_per_role = -1;
int			pc_admission_window_ms = 10 * 1000;

/* A channel name is an identifier: shorter than NAMEDATALEN. */
static bool
check_notify_channel(char **newval, void **extra, GucSource source)
{
	if (strlen(*newval) >= NAMEDATALEN)
	{
		GUC_check_errdetail("A channel name is at most %d bytes long.",
							NAMEDATALEN - 1);
		return false;
	}
	return true;
}

/* A share of the snapshot slots: -1 (derived) or at least one slot. */
static bool
check_snapshot_share(int *newval, void **extra, GucSource source)
{
	if (*newval == 0)
	{
		GUC_check_errdetail("Use -1 for the default share, or at least 1.");
		return false;
	}
	return true;
}

static shmem_request_hook_type prev_shmem_request_hook = NULL;
static shmem_startup_hook_type prev_shmem_startup_hook = NULL;

static void
projcache_shmem_request(void)
{
	int			i;

	if (prev_shmem_request_hook)
		prev_shmem_request_hook();
	for (i = 0; i < lengthof(parts); i++)
		parts[i].request();
}

/*
 * Set up each part (once, in the postmaster, or again after a crash has
 * reinitialized shared memory; in each child too where children attach
 * anew).  A part that finds its struct new also does what must happen at a
 * start before any process can read: the dumps say whether reads wait for
 * them.
 */
static void
projcache_shmem_startup(void)
{
	int			i;

	if (prev_shmem_startup_hook)
		prev_shmem_startup_hook();
	LWLockAcquire(AddinShmemInitLock, LW_EXCLUSIVE);
	pc_locks_forget();
	for (i = 0; i < lengthof(parts); i++)
		parts[i].startup();
	pc_area_shmem_startup_done();
	LWLockRelease(AddinShmemInitLock);
}

/* Define every projcache.* setting (doc/settings.md describes them). */
static void
define_settings(void)
{
	DefineCustomStringVariable("projcache.database",
							   "Sets the database the scheduler worker connects to, where the fetch function lives.",
							   NULL,
							   &pc_database,
							   "postgres",
							   PGC_POSTMASTER,
							   0,
							   NULL, NULL, NULL);

	DefineCustomStringVariable("projcache.fetch_function",
							   "Sets the function the key cache calls to fetch keys: fn(keys text[], revisions text[]).",
							   "Empty: the key cache fetches nothing.",
							   &pc_fetch_function,
							   "",
							   PGC_SIGHUP,
							   0,
							   NULL, NULL, NULL);

	DefineCustomStringVariable("projcache.fetch_role",
							   "Sets the role the fetch function runs as, through commit.",
							   "Empty: the function's owner, as if it were SECURITY DEFINER.",
							   &pc_fetch_role,
							   "",
							   PGC_SIGHUP,
							   0,
							   NULL, NULL, NULL);

	DefineCustomStringVariable("projcache.notify_channel",
							   "Sets the channel on which the scheduler worker notifies keys whose value changed.",
							   "Empty: no notices.  The payload is the key; listeners must be in projcache.database.",
							   &pc_notify_channel,
							   "",
							   PGC_SIGHUP,
							   0,
							   check_notify_channel, NULL, NULL);

	DefineCustomIntVariable("projcache.expiry",
							"Sets the age below which a cached key is fresh.",
							NULL,
							&pc_expiry_ms,
							300 * 1000, 1, INT_MAX / 4,
							PGC_SIGHUP,
							GUC_UNIT_MS,
							NULL, NULL, NULL);

	DefineCustomIntVariable("projcache.grace_period",
							"Sets how long after expiry a stale key is still served before it expires.",
							NULL,
							&pc_grace_period_ms,
							120 * 1000, 0, INT_MAX / 4,
							PGC_SIGHUP,
							GUC_UNIT_MS,
							NULL, NULL, NULL);

	DefineCustomIntVariable("projcache.refresh_interval",
							"Sets the interval at which cached keys are refreshed in the background.",
							"0 turns it off.  Honoured only when strictly between expiry and expiry + grace_period.",
							&pc_refresh_interval_ms,
							0, 0, INT_MAX / 4,
							PGC_SIGHUP,
							GUC_UNIT_MS,
							NULL, NULL, NULL);

	DefineCustomIntVariable("projcache.max_retry_backoff",
							"Sets the longest wait between retries of a key whose fetch stays pending or fails.",
							NULL,
							&pc_max_retry_backoff_ms,
							60 * 1000, 100, INT_MAX / 4,
							PGC_SIGHUP,
							GUC_UNIT_MS,
							NULL, NULL, NULL);

	DefineCustomIntVariable("projcache.batch_size",
							"Sets the most keys passed to one call of the fetch function.",
							NULL,
							&pc_batch_size,
							500, 1, 100000,
							PGC_SIGHUP,
							0,
							NULL, NULL, NULL);

	DefineCustomIntVariable("projcache.batch_interval",
							"Sets the longest time due keys are gathered before a call of the fetch function.",
							NULL,
							&pc_batch_interval_ms,
							100, 0, 60 * 1000,
							PGC_SIGHUP,
							GUC_UNIT_MS,
							NULL, NULL, NULL);

	DefineCustomIntVariable("projcache.fetch_timeout",
							"Sets the longest a call of the fetch function may run.",
							"0 means no limit.",
							&pc_fetch_timeout_ms,
							30 * 1000, 0, INT_MAX,
							PGC_SIGHUP,
							GUC_UNIT_MS,
							NULL, NULL, NULL);

	DefineCustomIntVariable("projcache.max_memory",
							"Sets the shared memory for cached keys and snapshots, reserved at server start.",
							NULL,
							&pc_max_memory_kb,
							64 * 1024, 1024, INT_MAX / 2,
							PGC_POSTMASTER,
							GUC_UNIT_KB,
							NULL, NULL, NULL);

	DefineCustomIntVariable("projcache.max_keys_per_role",
							"Sets the most keys of the key cache one role may have created.",
							"Past it, the role's new keys read as pending, and the worker evicts its oldest.  Keys created by superusers are not bound by it.  0 means no bound; -1 means half of the keys that fit in what projcache.max_memory leaves for keys.",
							&pc_max_keys_per_role,
							-1, -1, INT_MAX,
							PGC_SIGHUP,
							0,
							NULL, NULL, NULL);

	DefineCustomIntVariable("projcache.admission_window",
							"Sets how long a value read stays safe from eviction to make room for a key without one.",
							"While every value that could go was read within it, a read of a new key is answered pending and creates no entry.  0 means no such protection.",
							&pc_admission_window_ms,
							10 * 1000, 0, 3600 * 1000,
							PGC_SIGHUP,
							GUC_UNIT_MS,
							NULL, NULL, NULL);

	DefineCustomIntVariable("projcache.max_snapshots",
							"Sets the most snapshots cached at once, over all databases.",
							NULL,
							&pc_max_snapshots,
							64, 1, 10000,
							PGC_POSTMASTER,
							0,
							NULL, NULL, NULL);

	DefineCustomIntVariable("projcache.max_streams",
							"Sets the most change streams that may be registered.",
							"A role that is not a superuser may own at most half of them.",
							&pc_max_streams,
							4, 0, 64,
							PGC_POSTMASTER,
							0,
							NULL, NULL, NULL);

	DefineCustomIntVariable("projcache.snapshot_memory",
							"Sets the part of projcache.max_memory that holds snapshot rows.",
							"Keys cannot use it, and snapshots cannot use the rest. -1 means a quarter of projcache.max_memory.",
							&pc_snap_memory_kb,
							-1, -1, INT_MAX / 2,
							PGC_POSTMASTER,
							GUC_UNIT_KB,
							NULL, NULL, NULL);

	DefineCustomIntVariable("projcache.snapshot_memory_per_owner",
							"Sets the most of projcache.snapshot_memory the snapshots of one role may hold.",
							"Snapshots owned by superusers are not bound by it. -1 means half of projcache.snapshot_memory.",
							&pc_snap_memory_per_owner_kb,
							-1, -1, INT_MAX / 2,
							PGC_SIGHUP,
							GUC_UNIT_KB,
							NULL, NULL, NULL);

	DefineCustomIntVariable("projcache.max_snapshots_per_owner",
							"Sets the most snapshot slots the snapshots of one role may take, over all databases.",
							"Snapshots owned by superusers are not bound by it. -1 means a quarter of projcache.max_snapshots.",
							&pc_max_snapshots_per_owner,
							-1, -1, 10000,
							PGC_SIGHUP,
							0,
							check_snapshot_share, NULL, NULL);

	DefineCustomIntVariable("projcache.max_snapshots_per_database",
							"Sets the most snapshot slots the snapshots of one database may take.",
							"Snapshots owned by superusers are not bound by it. -1 means half of projcache.max_snapshots.",
							&pc_max_snapshots_per_database,
							-1, -1, 10000,
							PGC_SIGHUP,
							0,
							check_snapshot_share, NULL, NULL);

	DefineCustomBoolVariable("projcache.wal_invalidations",
							 "Writes invalidations and snapshot refreshes to WAL, for the caches of standbys.",
							 "Every standby must then preload projcache.",
							 &pc_wal_invalidations,
							 false,
							 PGC_SIGHUP,
							 0,
							 NULL, NULL, NULL);

	DefineCustomIntVariable("projcache.wal_rmgr_id",
							"Sets the id of projcache's WAL resource manager.",
							"The same on a primary and all its standbys; no other library may use it.",
							&pc_wal_rmgr_id,
							RM_EXPERIMENTAL_ID,
							RM_MIN_CUSTOM_ID,
							RM_MAX_CUSTOM_ID,
							PGC_POSTMASTER,
							0,
							NULL, NULL, NULL);

	DefineCustomIntVariable("projcache.wal_pending_memory",
							"Sets the shared memory for keys a standby replayed and that wait for their transaction's commit.",
							NULL,
							&pc_wal_pending_kb,
							1024, 8, (int) (MaxAllocSize / 1024),
							PGC_POSTMASTER,
							GUC_UNIT_KB,
							NULL, NULL, NULL);

	/* Snapshot load workers (snapshot_load.c) */
	DefineCustomIntVariable("projcache.max_load_workers",
							"Sets the most snapshot load workers running at once, over all databases.",
							"Each takes a max_worker_processes slot while it runs.",
							&pc_max_load_workers,
							4, 0, MAX_BACKENDS,
							PGC_SIGHUP,
							0,
							NULL, NULL, NULL);

	DefineCustomIntVariable("projcache.max_load_workers_per_role",
							"Sets the most snapshot load workers running at once for one role, as reader or as owner.",
							NULL,
							&pc_max_load_workers_per_role,
							2, 0, MAX_BACKENDS,
							PGC_SIGHUP,
							0,
							NULL, NULL, NULL);

	DefineCustomIntVariable("projcache.dump_interval",
							"Sets how often the key cache is dumped to disk, to come back warm after a restart.",
							"0 dumps at shutdown only; -1 never dumps nor loads.",
							&pc_dump_interval_s,
							300, -1, INT_MAX / 1000,
							PGC_SIGHUP,
							GUC_UNIT_S,
							NULL, NULL, NULL);

	DefineCustomIntVariable("projcache.restore_wait",
							"Sets how long a read waits, right after a start, for the dumped key or snapshot rows it reads to be loaded.",
							"A read of a key waits while the scheduler loads the key dump; a read of a snapshot whose rows came from the dump waits for their first load as the owner.  0 means reads never wait.",
							&pc_restore_wait_ms,
							5000, 0, 3600 * 1000,
							PGC_SIGHUP,
							GUC_UNIT_MS,
							NULL, NULL, NULL);

	DefineCustomBoolVariable("projcache.debug_clock",
							 "Allows superusers to move projcache's clock forward (for tests).",
							 NULL,
							 &pc_debug_clock,
							 false,
							 PGC_POSTMASTER,
							 0,
							 NULL, NULL, NULL);

	DefineCustomIntVariable("projcache.debug_list_limit",
							"Lowers, for tests, the size past which a key list's arrays must be huge allocations.",
							"Only with projcache.debug_clock on; 0 keeps the allocator's 1 GB.",
							&pc_debug_list_limit,
							0, 0, INT_MAX,
							PGC_POSTMASTER,
							GUC_UNIT_BYTE,
							NULL, NULL, NULL);

	MarkGUCPrefixReserved("projcache");
}

void
_PG_init(void)
{
	/*
	 * Loaded other than at startup (LOAD, or a function call without
	 * preloading): define nothing.  The SQL functions report the missing
	 * preload themselves, with a hint.
	 */
	if (!process_shared_preload_libraries_in_progress)
		return;

	define_settings();
	pc_check_memory_settings();

	prev_shmem_request_hook = shmem_request_hook;
	shmem_request_hook = projcache_shmem_request;
	prev_shmem_startup_hook = shmem_startup_hook;
	shmem_startup_hook = projcache_shmem_startup;

	/*
	 * pg_upgrade runs its servers in binary-upgrade mode: no worker then. It
	 * drops and creates databases in the new cluster, which a connected
	 * worker makes fail, and no fetch function should run during an upgrade;
	 * the key cache starts empty after one anyway.
	 */
	if (!IsBinaryUpgrade)
		pc_register_launcher();
	pc_wal_register_rmgr();
	pc_snap_install_hooks();
	pc_caches_install_hooks();
}
