/*-------------------------------------------------------------------------
 *
 * keycache_launcher.c
 *	  The key cache's "projcache launcher" background worker: starts the
 *	  key cache's worker (keycache_worker.c) once projcache.database
 *	  exists, and again whenever it exits.
 *
 * A background worker connects to one database, once, and ends with FATAL
 * if it does not exist.  Registered directly with a restart time, the
 * worker would then fail every few seconds, flooding the log, until
 * somebody created the database.  So the launcher, connected to no
 * database (it can read the shared catalog pg_database, as the logical
 * replication launcher reads pg_subscription), waits for the database,
 * logging once that it is missing, and only then starts the worker as a
 * dynamic worker.  When the worker exits (an ERROR, a signal, the
 * database dropped), the launcher waits PC_WORKER_RESTART_MS and starts
 * it again; a crash of any process makes the postmaster restart all of
 * them, the launcher included.  If the launcher itself is terminated, the
 * postmaster starts it again; while the old worker lives on, the new
 * launcher starts none beside it.
 *
 * Copyright (c) 2026, projcache developers
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/heapam.h"
#include "access/htup_details.h"
#include "access/tableam.h"
#include "access/xact.h"
#include "catalog/pg_database.h"
#include "miscadmin.h"
#include "pgstat.h"
#include "postmaster/bgworker.h"
#include "postmaster/interrupt.h"
#include "storage/latch.h"
#include "tcop/tcopprot.h"
#include "utils/guc.h"
#include "utils/snapmgr.h"
#include "utils/timestamp.h"

#include "keycache.h"
#include "user_switch.h"

/* How long after the worker exited it is started again. */
#define PC_WORKER_RESTART_MS		2000

/* How often a missing database is looked for. */
#define PC_DATABASE_POLL_MS			1000

void
pc_register_launcher(void)
{
	BackgroundWorker worker;

	memset(&worker, 0, sizeof(worker));
	worker.bgw_flags = BGWORKER_SHMEM_ACCESS |
		BGWORKER_BACKEND_DATABASE_CONNECTION;
	/* Consistent state: a hot standby serves its cache too. */
	worker.bgw_start_time = BgWorkerStart_ConsistentState;
	worker.bgw_restart_time = PC_WORKER_RESTART_MS / 1000;
	snprintf(worker.bgw_library_name, BGW_MAXLEN, "projcache");
	snprintf(worker.bgw_function_name, BGW_MAXLEN, "pc_launcher_main");
	snprintf(worker.bgw_name, BGW_MAXLEN, "projcache launcher");
	snprintf(worker.bgw_type, BGW_MAXLEN, "projcache launcher");
	RegisterBackgroundWorker(&worker);
}

/*
 * Sleep for ms, whatever sets the latch meanwhile (the worker's exit
 * does); handles reloads and SIGTERM.
 */
static void
launcher_sleep(long ms)
{
	TimestampTz end = TimestampTzPlusMilliseconds(GetCurrentTimestamp(), ms);

	for (;;)
	{
		long		left =
			TimestampDifferenceMilliseconds(GetCurrentTimestamp(), end);

		if (left <= 0)
			break;
		(void) WaitLatch(MyLatch,
						 WL_LATCH_SET | WL_TIMEOUT | WL_EXIT_ON_PM_DEATH,
						 left, pc_wait_event(PC_WAIT_LAUNCHER));
		ResetLatch(MyLatch);
		CHECK_FOR_INTERRUPTS();
		if (ConfigReloadPending)
		{
			ConfigReloadPending = false;
			ProcessConfigFile(PGC_SIGHUP);
		}
	}
}

/*
 * Is projcache.database in pg_database?  A heap scan, as the autovacuum
 * launcher does: with no database selected, only the shared catalogs the
 * relation cache has built in are readable, not their indexes.
 */
static bool
database_exists(void)
{
	Relation	rel;
	TableScanDesc scan;
	HeapTuple	tuple;
	bool		exists = false;

	StartTransactionCommand();
	(void) GetTransactionSnapshot();
	rel = table_open(DatabaseRelationId, AccessShareLock);
	scan = table_beginscan_catalog(rel, 0, NULL);
	while (!exists &&
		   (tuple = heap_getnext(scan, ForwardScanDirection)) != NULL)
	{
		Form_pg_database db = (Form_pg_database) GETSTRUCT(tuple);

		exists = strcmp(NameStr(db->datname), pc_database) == 0;
	}
	table_endscan(scan);
	table_close(rel, AccessShareLock);
	CommitTransactionCommand();
	return exists;
}

/* Wait until projcache.database exists, saying so once if it does not. */
static void
wait_for_database(void)
{
	bool		reported = false;

	while (!database_exists())
	{
		if (!reported)
			ereport(LOG,
					(errmsg("projcache: database \"%s\" does not exist",
							pc_database),
					 errdetail("The scheduler starts when it is created."),
					 errhint("Create the database, or set projcache.database to an existing one and restart the server.")));
		reported = true;
		launcher_sleep(PC_DATABASE_POLL_MS);
	}
	if (reported)
		ereport(LOG,
				(errmsg("projcache: starting the scheduler in database \"%s\"",
						pc_database),
				 errdetail("The database exists now.")));
}

/* Is a worker running (one a previous launcher started, say)? */
static bool
worker_running(void)
{
	return pc_worker_pid() != 0;
}

/* Start the worker and wait until it exits. */
static void
run_worker(void)
{
	static bool no_slot_reported = false;
	BackgroundWorker worker;
	BackgroundWorkerHandle *handle;
	pid_t		pid;

	/*
	 * This launcher may have been started again while the worker of the
	 * previous one lives on: never start a second one beside it.
	 */
	if (worker_running())
		return;

	memset(&worker, 0, sizeof(worker));
	worker.bgw_flags = BGWORKER_SHMEM_ACCESS |
		BGWORKER_BACKEND_DATABASE_CONNECTION;
	worker.bgw_start_time = BgWorkerStart_ConsistentState;
	worker.bgw_restart_time = BGW_NEVER_RESTART;	/* the launcher does it */
	snprintf(worker.bgw_library_name, BGW_MAXLEN, "projcache");
	snprintf(worker.bgw_function_name, BGW_MAXLEN, "pc_worker_main");
	snprintf(worker.bgw_name, BGW_MAXLEN, "projcache scheduler");
	snprintf(worker.bgw_type, BGW_MAXLEN, "projcache scheduler");
	worker.bgw_notify_pid = MyProcPid;

	if (!RegisterDynamicBackgroundWorker(&worker, &handle))
	{
		/* Said once, not at every retry. */
		if (!no_slot_reported)
			ereport(WARNING,
					(errcode(ERRCODE_CONFIGURATION_LIMIT_EXCEEDED),
					 errmsg("projcache: could not start the scheduler: no background worker slot is free"),
					 errhint("Raise max_worker_processes.  The launcher keeps trying.")));
		no_slot_reported = true;
		return;
	}
	no_slot_reported = false;
	if (WaitForBackgroundWorkerStartup(handle, &pid) == BGWH_STARTED)
		(void) WaitForBackgroundWorkerShutdown(handle);
	pfree(handle);
}

void
pc_launcher_main(Datum main_arg)
{
	pqsignal(SIGHUP, SignalHandlerForConfigReload);
	pqsignal(SIGTERM, die);
	/* It runs no query: a cancel would only end it, as FATAL. */
	pqsignal(SIGINT, SIG_IGN);
	BackgroundWorkerUnblockSignals();

	/* No database: only the shared catalogs are readable. */
	pc_worker_connect(NULL, InvalidOid);
	pgstat_report_appname("projcache launcher");

	for (;;)
	{
		wait_for_database();
		run_worker();
		launcher_sleep(PC_WORKER_RESTART_MS);
	}
}
