/*-------------------------------------------------------------------------
 *
 * stream_worker.c
 *	  The change streams' workers (1.4): one background worker per
 *	  stream ("projcache stream NAME"), its slot in shared memory
 *	  ("projcache streams"), and the scheduler's check that starts and
 *	  stops them.
 *
 * A stream's worker connects to projcache.database only to read its
 * registry row (as the bootstrap superuser, stream_registry.c), then to
 * the source with libpq, replication=database, in a way a signal
 * interrupts (libpq-be-fe-helpers.h).  For an owner who is not a
 * superuser it adds sslcertmode=disable where libpq knows it, and after
 * connecting it requires that the connection used the password (as
 * postgres_fdw does): else the stream is stopped, with last_error, until
 * its row changes (alter_stream).  It asks IDENTIFY_SYSTEM, creates a
 * temporary logical slot (pgoutput), starts replication from the
 * publication, and receives: it counts the transactions and changes it is
 * sent and answers the source's keepalives; a source that sends nothing
 * for wal_receiver_timeout is taken as gone.  Applying the changes
 * (invalidating keys) is not done yet.  The source down or an error: it
 * connects again after a backoff that doubles up to
 * projcache.max_retry_backoff.  SIGTERM ends it (its slot on the source
 * is temporary and goes with the connection).
 *
 * The workers are started by the scheduler (keycache_worker.c), which is
 * connected to projcache.database and calls pc_streams_tick() in its
 * loop: every PC_STREAMS_POLL_MS, or at once after a commit that created,
 * changed or dropped a stream (pc_streams_changed()).  It gives each
 * registered stream a slot, of which there are projcache.max_streams,
 * and starts a worker for a slot that has none; it ends the worker of a
 * stream that is dropped or whose row changed.  So there are never more
 * workers than max_streams, and none on a standby (the view shows
 * "standby").
 *
 * Locks: the slots are protected by one LWLock (tranche
 * "projcache_streams", taken alone): the worker writes its slot's state
 * and counters under it, the scheduler claims and frees slots under it,
 * the view copies a slot under it in shared mode.  Nothing but copies of
 * plain values is done under it.
 *
 * Copyright (c) 2026, projcache developers
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include <signal.h>
#include <unistd.h>

#include "access/xact.h"
#include "access/xlog.h"
#include "libpq-fe.h"
#include "mb/pg_wchar.h"
#include "miscadmin.h"
#include "pgstat.h"
#include "port/pg_bswap.h"
#include "postmaster/bgworker.h"
#include "postmaster/interrupt.h"
#include "replication/walreceiver.h"
#include "storage/fd.h"
#include "storage/ipc.h"
#include "storage/latch.h"
#include "storage/shmem.h"
#include "tcop/tcopprot.h"
#include "utils/builtins.h"
#include "utils/guc.h"
#include "utils/memutils.h"
#include "utils/snapmgr.h"
#include "utils/timestamp.h"

#include "compat.h"
#include "keycache.h"
#include "locks.h"
#include "projcache.h"
#include "stream_worker.h"
#include "user_switch.h"

#ifdef PC_HAVE_LIBPQSRV
#include "libpq/libpq-be-fe-helpers.h"
#endif

PGDLLEXPORT void pc_stream_worker_main(Datum main_arg);

#define PC_STREAMS_TRANCHE		"projcache_streams"

/* How often the scheduler checks the registry against the workers. */
#define PC_STREAMS_POLL_MS		1000

/* ... and while no stream is registered. */
#define PC_STREAMS_IDLE_POLL_MS	10000

/* The first wait before connecting again; it doubles. */
#define PC_STREAM_FIRST_BACKOFF_MS	100

/* A status update to the source at least this often. */
#define PC_STREAM_FEEDBACK_MS	10000

/* A worker registered and not started after this is taken as lost. */
#define PC_STREAM_LAUNCH_LOST_MS	30000

/* One stream's slot. */
typedef struct PcStreamSlot
{
	int64		id;				/* the stream's, 0: free */
	pid_t		pid;			/* its worker's, 0: none */
	bool		launched;		/* a worker registered and not yet exited */
	TimestampTz launched_at;
	TransactionId xmin;			/* the row's version the worker was given */
	bool		held;			/* stopped until the row changes */
	PcStreamRuntime rt;
} PcStreamSlot;

typedef struct PcStreamsShared
{
	LWLock	   *lock;			/* the slots */
	pg_atomic_uint32 changed;	/* a stream's row changed: check now */
	int			nslots;
	PcStreamSlot slots[FLEXIBLE_ARRAY_MEMBER];
} PcStreamsShared;

static PcStreamsShared *streams_shared = NULL;

/* ----------------------------------------------------------------
 * Shared memory
 * ----------------------------------------------------------------
 */

static Size
streams_shmem_size(void)
{
	return add_size(offsetof(PcStreamsShared, slots),
					mul_size(Max(pc_max_streams, 1), sizeof(PcStreamSlot)));
}

void
pc_streams_shmem_request(void)
{
	RequestAddinShmemSpace(MAXALIGN(streams_shmem_size()));
	pc_locks_request(PC_STREAMS_TRANCHE, 1);
}

void
pc_streams_shmem_startup(void)
{
	bool		found;
	LWLockPadded *lock;

	streams_shared = ShmemInitStruct("projcache streams", streams_shmem_size(),
									 &found);
	lock = pc_locks_get(PC_STREAMS_TRANCHE, 1, PC_LOCK_ALONE);
	if (found)
		return;
	memset(streams_shared, 0, streams_shmem_size());
	streams_shared->lock = &lock->lock;
	pg_atomic_init_u32(&streams_shared->changed, 0);
	streams_shared->nslots = pc_max_streams;
}

const char *
pc_stream_state_name(PcStreamState state)
{
	switch (state)
	{
		case PC_STREAM_STARTING:
			return "starting";
		case PC_STREAM_STREAMING:
			return "streaming";
		case PC_STREAM_RECONNECTING:
			return "reconnecting";
		case PC_STREAM_STOPPED:
			return "stopped";
		case PC_STREAM_STANDBY:
			return "standby";
	}
	return "stopped";
}

/*
 * The run-time state of stream id, copied out of its slot; false if it
 * has none (no worker was started for it yet).
 */
bool
pc_stream_runtime(int64 id, PcStreamRuntime *rt)
{
	bool		found = false;

	if (streams_shared == NULL)
		return false;
	pc_lock_alone(streams_shared->lock, LW_SHARED);
	for (int i = 0; i < streams_shared->nslots; i++)
	{
		PcStreamSlot *slot = &streams_shared->slots[i];

		if (slot->id == id)
		{
			memcpy(rt, &slot->rt, sizeof(PcStreamRuntime));
			found = true;
			break;
		}
	}
	LWLockRelease(streams_shared->lock);
	return found;
}

/* ----------------------------------------------------------------
 * The commit-time signal
 * ----------------------------------------------------------------
 */

static bool streams_changed_in_xact = false;
static bool streams_callback_registered = false;

static void
streams_xact_callback(XactEvent event, void *arg)
{
	switch (event)
	{
		case XACT_EVENT_COMMIT:
		case XACT_EVENT_PARALLEL_COMMIT:
			if (streams_changed_in_xact && streams_shared != NULL)
			{
				pg_atomic_write_u32(&streams_shared->changed, 1);
				pc_wake_worker();
			}
			streams_changed_in_xact = false;
			break;
		case XACT_EVENT_ABORT:
		case XACT_EVENT_PARALLEL_ABORT:
			streams_changed_in_xact = false;
			break;
		default:
			break;
	}
}

/*
 * This transaction created, changed or dropped a stream: at its commit,
 * the scheduler checks the workers at once.
 */
void
pc_streams_changed(void)
{
	if (!streams_callback_registered)
	{
		RegisterXactCallback(streams_xact_callback, NULL);
		streams_callback_registered = true;
	}
	streams_changed_in_xact = true;
}

/* ----------------------------------------------------------------
 * The scheduler's check: start and stop the workers
 * ----------------------------------------------------------------
 */

static int64 next_check_ms = 0;
static BackgroundWorkerHandle **handles = NULL;

/* Read the registry; -1 if it could not be read (said in the log). */
static int
list_streams(PcStreamListed *listed, int max)
{
	MemoryContext cxt = CurrentMemoryContext;
	int			n = -1;

	PG_TRY();
	{
		SetCurrentStatementStartTimestamp();
		StartTransactionCommand();
		PushActiveSnapshot(GetTransactionSnapshot());
		n = pc_stream_list(listed, max);
		PopActiveSnapshot();
		CommitTransactionCommand();
	}
	PG_CATCH();
	{
		ErrorData  *edata;

		MemoryContextSwitchTo(cxt);
		edata = CopyErrorData();
		FlushErrorState();
		AbortCurrentTransaction();
		ereport(LOG,
				(errmsg("projcache could not read the streams' registry: %s",
						edata->message)));
		FreeErrorData(edata);
		n = -1;
	}
	PG_END_TRY();
	MemoryContextSwitchTo(cxt);
	return n;
}

/* Register the worker of slot i; false if no background worker slot is free. */
static bool
launch_worker(int i, int64 id, const char *name)
{
	BackgroundWorker worker;
	MemoryContext old;
	bool		ok;

	memset(&worker, 0, sizeof(worker));
	worker.bgw_flags = BGWORKER_SHMEM_ACCESS |
		BGWORKER_BACKEND_DATABASE_CONNECTION;
	worker.bgw_start_time = BgWorkerStart_ConsistentState;
	worker.bgw_restart_time = BGW_NEVER_RESTART;	/* the scheduler does it */
	snprintf(worker.bgw_library_name, BGW_MAXLEN, "projcache");
	snprintf(worker.bgw_function_name, BGW_MAXLEN, "pc_stream_worker_main");
	snprintf(worker.bgw_name, BGW_MAXLEN, "projcache stream %s", name);
	snprintf(worker.bgw_type, BGW_MAXLEN, "projcache stream");
	worker.bgw_main_arg = Int32GetDatum(i);
	memcpy(worker.bgw_extra, &id, sizeof(id));
	worker.bgw_notify_pid = MyProcPid;
	if (handles[i] != NULL)
		pfree(handles[i]);
	handles[i] = NULL;
	/* the handle outlives the scheduler's memory of one pass */
	old = MemoryContextSwitchTo(TopMemoryContext);
	ok = RegisterDynamicBackgroundWorker(&worker, &handles[i]);
	MemoryContextSwitchTo(old);
	return ok;
}

/*
 * End the worker of that pid: through its handle if this scheduler started
 * it, else (a scheduler before this one did) by its pid.
 */
static void
terminate_worker(pid_t pid)
{
	for (int i = 0; i < streams_shared->nslots; i++)
	{
		pid_t		hpid;

		if (handles[i] != NULL &&
			GetBackgroundWorkerPid(handles[i], &hpid) == BGWH_STARTED &&
			hpid == pid)
		{
			TerminateBackgroundWorker(handles[i]);
			return;
		}
	}
	(void) kill(pid, SIGTERM);
}

/*
 * Start a worker for each registered stream that has none, and end those
 * of streams dropped or changed.  Called by the scheduler in its loop;
 * returns how long it may sleep before the next call.  On a standby it
 * starts none.
 */
long
pc_streams_tick(void)
{
	int64		now = pc_real_now_ms();
	PcStreamListed *listed;
	int			n;
	int			nslots;
	int		   *start;
	pid_t	   *stop;
	int			nstart = 0;
	int			nstop = 0;
	static bool no_slot_reported = false;

	if (streams_shared == NULL || streams_shared->nslots == 0)
		return -1;
	if (pg_atomic_read_u32(&streams_shared->changed) == 0 &&
		now < next_check_ms)
		return (long) (next_check_ms - now);
	pg_atomic_write_u32(&streams_shared->changed, 0);
	next_check_ms = now + PC_STREAMS_POLL_MS;
	if (RecoveryInProgress())
		return PC_STREAMS_POLL_MS;

	nslots = streams_shared->nslots;
	if (handles == NULL)
		handles = MemoryContextAllocZero(TopMemoryContext,
										 nslots * sizeof(BackgroundWorkerHandle *));
	listed = palloc0(sizeof(PcStreamListed) * nslots);
	start = palloc(sizeof(int) * nslots);
	stop = palloc(sizeof(pid_t) * nslots);
	n = list_streams(listed, nslots);
	if (n < 0)
		return PC_STREAMS_POLL_MS;

	/* Workers that ended, or never started. */
	for (int i = 0; i < nslots; i++)
	{
		pid_t		pid;
		bool		gone = false;

		if (handles[i] != NULL &&
			GetBackgroundWorkerPid(handles[i], &pid) == BGWH_STOPPED)
		{
			gone = true;
			pfree(handles[i]);
			handles[i] = NULL;
		}
		pc_lock_alone(streams_shared->lock, LW_EXCLUSIVE);
		if (streams_shared->slots[i].launched &&
			streams_shared->slots[i].pid == 0 &&
			(gone ||
			 (handles[i] == NULL &&
			  TimestampDifferenceExceeds(streams_shared->slots[i].launched_at,
										 GetCurrentTimestamp(),
										 PC_STREAM_LAUNCH_LOST_MS))))
			streams_shared->slots[i].launched = false;
		LWLockRelease(streams_shared->lock);
	}

	pc_lock_alone(streams_shared->lock, LW_EXCLUSIVE);
	/* Slots of dropped streams: end their workers, then free them. */
	for (int i = 0; i < nslots; i++)
	{
		PcStreamSlot *slot = &streams_shared->slots[i];
		bool		registered = false;

		if (slot->id == 0)
			continue;
		for (int j = 0; j < n && !registered; j++)
			registered = listed[j].id == slot->id;
		if (registered)
			continue;
		if (slot->pid != 0)
			stop[nstop++] = slot->pid;
		else if (!slot->launched)
			memset(slot, 0, sizeof(PcStreamSlot));
	}
	/* Each registered stream: its slot, and a worker in it. */
	for (int j = 0; j < n; j++)
	{
		PcStreamSlot *slot = NULL;
		PcStreamSlot *free_slot = NULL;

		for (int i = 0; i < nslots; i++)
		{
			if (streams_shared->slots[i].id == listed[j].id)
				slot = &streams_shared->slots[i];
			else if (streams_shared->slots[i].id == 0 && free_slot == NULL)
				free_slot = &streams_shared->slots[i];
		}
		if (slot == NULL)
		{
			if (free_slot == NULL)
				continue;		/* more streams than slots: it waits */
			slot = free_slot;
			memset(slot, 0, sizeof(PcStreamSlot));
			slot->id = listed[j].id;
			slot->rt.state = PC_STREAM_STARTING;
		}
		if (slot->pid != 0 || slot->launched)
		{
			/* Changed since its worker read it: end it, to start again. */
			if (slot->pid != 0 && slot->xmin != listed[j].xmin)
				stop[nstop++] = slot->pid;
			continue;
		}
		if (slot->held && slot->xmin == listed[j].xmin)
			continue;			/* stopped until altered */
		slot->held = false;
		slot->xmin = listed[j].xmin;
		slot->launched = true;
		slot->launched_at = GetCurrentTimestamp();
		slot->rt.state = PC_STREAM_STARTING;
		start[nstart++] = j;
	}
	LWLockRelease(streams_shared->lock);

	for (int k = 0; k < nstop; k++)
		terminate_worker(stop[k]);
	for (int k = 0; k < nstart; k++)
	{
		PcStreamListed *l = &listed[start[k]];
		int			i;

		pc_lock_alone(streams_shared->lock, LW_SHARED);
		for (i = 0; i < nslots; i++)
			if (streams_shared->slots[i].id == l->id)
				break;
		LWLockRelease(streams_shared->lock);
		if (i == nslots)
			continue;
		if (launch_worker(i, l->id, l->name))
		{
			no_slot_reported = false;
			continue;
		}
		pc_lock_alone(streams_shared->lock, LW_EXCLUSIVE);
		streams_shared->slots[i].launched = false;
		LWLockRelease(streams_shared->lock);
		if (!no_slot_reported)
			ereport(WARNING,
					(errcode(ERRCODE_CONFIGURATION_LIMIT_EXCEEDED),
					 errmsg("projcache: could not start the worker of stream \"%s\": no background worker slot is free",
							l->name),
					 errhint("Raise max_worker_processes.  The scheduler keeps trying.")));
		no_slot_reported = true;
	}
	pfree(listed);
	pfree(start);
	pfree(stop);

	/*
	 * No stream: nothing to start again.  A commit that creates one sets the
	 * flag; a registry restored without create_stream is seen within
	 * PC_STREAMS_IDLE_POLL_MS.
	 */
	if (n == 0 && nstop == 0)
	{
		next_check_ms = now + PC_STREAMS_IDLE_POLL_MS;
		return PC_STREAMS_IDLE_POLL_MS;
	}
	return PC_STREAMS_POLL_MS;
}

/* ----------------------------------------------------------------
 * The worker: its slot
 * ----------------------------------------------------------------
 */

static PcStreamSlot *my_slot = NULL;

/*
 * An error as last_error keeps it: its first line (a server's message
 * without its DETAIL, where a row's values would be), clipped to
 * PC_STREAM_ERROR_LEN on a character boundary.  libpq's messages never
 * carry the password.
 */
static void
clip_error(char *dst, const char *msg)
{
	size_t		len = strcspn(msg, "\n");
	int			clipped;

	if (len >= PC_STREAM_ERROR_LEN)
		len = PC_STREAM_ERROR_LEN - 1;
	clipped = pg_mbcliplen(msg, (int) len, (int) len);
	memcpy(dst, msg, clipped);
	dst[clipped] = '\0';
}

/* Set the slot's state, and last_error if msg is not NULL. */
static void
set_state(PcStreamState state, const char *msg)
{
	char		err[PC_STREAM_ERROR_LEN];
	TimestampTz now = GetCurrentTimestamp();

	if (msg != NULL)
		clip_error(err, msg);
	pc_lock_alone(streams_shared->lock, LW_EXCLUSIVE);
	my_slot->rt.state = state;
	if (msg != NULL)
	{
		strlcpy(my_slot->rt.last_error, err, PC_STREAM_ERROR_LEN);
		my_slot->rt.last_error_at = now;
	}
	if (state == PC_STREAM_RECONNECTING)
		my_slot->rt.reconnects++;
	LWLockRelease(streams_shared->lock);
}

/* The worker's exit: its slot has no worker any more. */
static void
stream_worker_exit(int code, Datum arg)
{
	LWLockReleaseAll();
	pc_lock_alone(streams_shared->lock, LW_EXCLUSIVE);
	if (my_slot->pid == MyProcPid)
	{
		my_slot->pid = 0;
		my_slot->launched = false;
		my_slot->rt.state = PC_STREAM_STOPPED;
	}
	LWLockRelease(streams_shared->lock);
}

/* Take slot i for stream id; false if it is not ours (dropped, taken). */
static bool
claim_slot(int i, int64 id)
{
	bool		ok;

	if (i < 0 || i >= streams_shared->nslots)
		return false;
	pc_lock_alone(streams_shared->lock, LW_EXCLUSIVE);
	my_slot = &streams_shared->slots[i];
	ok = my_slot->id == id && my_slot->pid == 0;
	if (ok)
	{
		my_slot->pid = MyProcPid;
		my_slot->rt.state = PC_STREAM_STARTING;
	}
	LWLockRelease(streams_shared->lock);
	return ok;
}

/* ----------------------------------------------------------------
 * The worker: the connection to the source
 * ----------------------------------------------------------------
 */

/* Does the libpq this server runs with know the option? */
static bool
libpq_knows(const char *keyword)
{
	PQconninfoOption *defs = PQconndefaults();
	bool		known = false;

	if (defs == NULL)
		return false;
	for (PQconninfoOption *o = defs; o->keyword != NULL; o++)
		if (strcmp(o->keyword, keyword) == 0)
			known = true;
	PQconninfoFree(defs);
	return known;
}

#ifndef PC_HAVE_LIBPQSRV

/*
 * Without libpq-be-fe-helpers.h (PostgreSQL 15 before its backport):
 * PQconnectStartParams and PQconnectPoll on the latch and the socket, as
 * libpqsrv_connect_params() does.
 */
static PGconn *
libpqsrv_connect_params(const char *const *keywords,
						const char *const *values,
						int expand_dbname, uint32 wait_event_info)
{
	PGconn	   *conn;

	if (!AcquireExternalFD())
		ereport(ERROR,
				(errcode(ERRCODE_SQLCLIENT_UNABLE_TO_ESTABLISH_SQLCONNECTION),
				 errmsg("could not establish connection"),
				 errdetail("There are too many open files on the local server."),
				 errhint("Raise the server's \"max_files_per_process\" and/or \"ulimit -n\" limits.")));
	conn = PQconnectStartParams(keywords, values, expand_dbname);
	if (conn == NULL)
	{
		ReleaseExternalFD();
		return NULL;
	}
	if (PQstatus(conn) == CONNECTION_BAD)
		return conn;
	PG_TRY();
	{
		PostgresPollingStatusType status = PGRES_POLLING_WRITING;

		while (status != PGRES_POLLING_OK && status != PGRES_POLLING_FAILED)
		{
			int			io = status == PGRES_POLLING_READING ?
				WL_SOCKET_READABLE : WL_SOCKET_WRITEABLE;
			int			rc = WaitLatchOrSocket(MyLatch,
											   WL_EXIT_ON_PM_DEATH | WL_LATCH_SET | io,
											   PQsocket(conn), 0,
											   wait_event_info);

			if (rc & WL_LATCH_SET)
			{
				ResetLatch(MyLatch);
				CHECK_FOR_INTERRUPTS();
			}
			if (rc & io)
				status = PQconnectPoll(conn);
		}
	}
	PG_CATCH();
	{
		ReleaseExternalFD();
		PQfinish(conn);
		PG_RE_THROW();
	}
	PG_END_TRY();
	return conn;
}

static void
libpqsrv_disconnect(PGconn *conn)
{
	if (conn == NULL)
		return;
	ReleaseExternalFD();
	PQfinish(conn);
}
#endif							/* !PC_HAVE_LIBPQSRV */

static PGconn *source_conn = NULL;

static void
disconnect_source(void)
{
	if (source_conn != NULL)
		libpqsrv_disconnect(source_conn);
	source_conn = NULL;
}

static void
disconnect_at_exit(int code, Datum arg)
{
	/* PQfinish only: fd.c's accounting ends with the process */
	if (source_conn != NULL)
		PQfinish(source_conn);
	source_conn = NULL;
}

/*
 * Connect to the stream's source.  NULL with *err set if it failed; a
 * connection of an owner who is not a superuser that did not use its
 * password is refused here, *held set.
 */
static PGconn *
connect_source(const PcStreamDef *def, bool super, char **err, bool *held)
{
	PQconninfoOption *opts;
	char	   *perr = NULL;
	const char **keys;
	const char **vals;
	int			n = 0;
	int			nopts = 0;
	PGconn	   *conn;
	char	   *appname = psprintf("projcache stream %s", def->name);

	*held = false;
	opts = PQconninfoParse(def->conninfo, &perr);
	if (opts == NULL)
	{
		*err = pstrdup("the stream's connection string could not be parsed");
		if (perr)
			PQfreemem(perr);
		return NULL;
	}
	for (PQconninfoOption *o = opts; o->keyword != NULL; o++)
		nopts++;
	keys = palloc0(sizeof(char *) * (nopts + 5));
	vals = palloc0(sizeof(char *) * (nopts + 5));
	for (PQconninfoOption *o = opts; o->keyword != NULL; o++)
	{
		if (o->val == NULL || o->val[0] == '\0' ||
			strcmp(o->keyword, "replication") == 0 ||
			strcmp(o->keyword, "keepalives") == 0)
			continue;
		keys[n] = o->keyword;
		vals[n++] = o->val;
	}
	keys[n] = "replication";
	vals[n++] = "database";
	keys[n] = "keepalives";
	vals[n++] = "1";
	keys[n] = "fallback_application_name";
	vals[n++] = appname;
	if (!super && libpq_knows("sslcertmode"))
	{
		keys[n] = "sslcertmode";
		vals[n++] = "disable";
	}
	keys[n] = NULL;
	vals[n] = NULL;

	conn = libpqsrv_connect_params(keys, vals, false,
								   pc_wait_event(PC_WAIT_STREAM));
	PQconninfoFree(opts);
	if (conn == NULL)
	{
		*err = pstrdup("out of memory");
		return NULL;
	}
	if (PQstatus(conn) != CONNECTION_OK)
	{
		*err = pstrdup(PQerrorMessage(conn));
		libpqsrv_disconnect(conn);
		return NULL;
	}
	if (!super && !PQconnectionUsedPassword(conn))
	{
		libpqsrv_disconnect(conn);
		*err = pstrdup("password is required: the source did not ask for the password of the connection string, and the stream's owner is not a superuser");
		*held = true;
		return NULL;
	}
	return conn;
}

/*
 * Wait for the result of the query sent, interruptibly; the last result
 * (the caller PQclear()s it), or NULL with *err set.  ok: the status a
 * success has.
 */
static PGresult *
wait_result(PGconn *conn, ExecStatusType ok, char **err)
{
	PGresult   *last = NULL;
	TimestampTz deadline = TimestampTzPlusMilliseconds(GetCurrentTimestamp(),
													   wal_receiver_timeout);

	for (;;)
	{
		PGresult   *res;

		while (PQisBusy(conn))
		{
			long		left = wal_receiver_timeout <= 0 ? 1000 :
				TimestampDifferenceMilliseconds(GetCurrentTimestamp(),
												deadline);
			int			rc;

			if (left <= 0)
			{
				if (last)
					PQclear(last);
				*err = psprintf("the source did not answer within wal_receiver_timeout (%d ms)",
								wal_receiver_timeout);
				return NULL;
			}
			rc = WaitLatchOrSocket(MyLatch,
								   WL_EXIT_ON_PM_DEATH | WL_LATCH_SET |
								   WL_SOCKET_READABLE | WL_TIMEOUT,
								   PQsocket(conn), Min(left, 1000),
								   pc_wait_event(PC_WAIT_STREAM));
			if (rc & WL_LATCH_SET)
			{
				ResetLatch(MyLatch);
				CHECK_FOR_INTERRUPTS();
			}
			if ((rc & WL_SOCKET_READABLE) && !PQconsumeInput(conn))
			{
				if (last)
					PQclear(last);
				*err = pstrdup(PQerrorMessage(conn));
				return NULL;
			}
		}
		res = PQgetResult(conn);
		if (res == NULL)
			break;
		if (last)
			PQclear(last);
		last = res;
		/* COPY BOTH begins: no more results until it ends */
		if (PQresultStatus(res) == PGRES_COPY_BOTH)
			break;
	}
	if (last == NULL || PQresultStatus(last) != ok)
	{
		const char *msg = last ?
			PQresultErrorField(last, PG_DIAG_MESSAGE_PRIMARY) : NULL;

		*err = pstrdup(msg ? msg : PQerrorMessage(conn));
		if (last)
			PQclear(last);
		return NULL;
	}
	return last;
}

static PGresult *
run_query(PGconn *conn, const char *sql, ExecStatusType ok, char **err)
{
	if (!PQsendQuery(conn, sql))
	{
		*err = pstrdup(PQerrorMessage(conn));
		return NULL;
	}
	return wait_result(conn, ok, err);
}

/* IDENTIFY_SYSTEM: the source's system id and timeline into the slot. */
static bool
identify_system(PGconn *conn, char **err)
{
	PGresult   *res = run_query(conn, "IDENTIFY_SYSTEM", PGRES_TUPLES_OK, err);
	uint64		sysid;
	TimeLineID	tli;

	if (res == NULL)
		return false;
	if (PQnfields(res) < 2 || PQntuples(res) != 1)
	{
		PQclear(res);
		*err = pstrdup("the source answered IDENTIFY_SYSTEM with an unexpected result");
		return false;
	}
	sysid = strtou64(PQgetvalue(res, 0, 0), NULL, 10);
	tli = (TimeLineID) strtoul(PQgetvalue(res, 0, 1), NULL, 10);
	PQclear(res);
	pc_lock_alone(streams_shared->lock, LW_EXCLUSIVE);
	my_slot->rt.system_id = sysid;
	my_slot->rt.timeline = tli;
	LWLockRelease(streams_shared->lock);
	return true;
}

/* A quoted string literal of the replication protocol: '' doubled. */
static char *
protocol_literal(const char *s)
{
	StringInfoData buf;

	initStringInfo(&buf);
	appendStringInfoChar(&buf, '\'');
	for (; *s; s++)
	{
		if (*s == '\'')
			appendStringInfoChar(&buf, '\'');
		appendStringInfoChar(&buf, *s);
	}
	appendStringInfoChar(&buf, '\'');
	return buf.data;
}

/*
 * A temporary logical slot (it goes with the connection), and replication
 * from it of the stream's publication.
 */
static bool
start_replication(PGconn *conn, const PcStreamDef *def, char **err)
{
	static uint32 connections = 0;

	/*
	 * A name of this connection's own: the slot of one before it may live on
	 * at the source until its walsender sees that it is gone.
	 */
	char	   *slot = psprintf("pc_stream_%lld_%d_%u", (long long) def->id,
								(int) MyProcPid, ++connections);
	PGresult   *res;

	res = run_query(conn,
					psprintf("CREATE_REPLICATION_SLOT %s TEMPORARY LOGICAL pgoutput (SNAPSHOT 'nothing')",
							 slot),
					PGRES_TUPLES_OK, err);
	if (res == NULL)
		return false;
	PQclear(res);
	res = run_query(conn,
					psprintf("START_REPLICATION SLOT %s LOGICAL 0/0 (proto_version '1', publication_names %s)",
							 slot,
							 protocol_literal(quote_identifier(def->publication))),
					PGRES_COPY_BOTH, err);
	if (res == NULL)
		return false;
	PQclear(res);
	return true;
}

/* ----------------------------------------------------------------
 * The worker: the receive loop
 * ----------------------------------------------------------------
 */

static bool in_transaction = false;

/* The current time as the replication protocol sends it. */
static int64
protocol_now(void)
{
	return (int64) GetCurrentTimestamp();
}

static uint64
read64(const char *p)
{
	uint64		v;

	memcpy(&v, p, sizeof(v));
	return pg_ntoh64(v);
}

static void
write64(char *p, uint64 v)
{
	v = pg_hton64(v);
	memcpy(p, &v, sizeof(v));
}

/*
 * A standby status update: received is written, confirmed is flushed and
 * applied (nothing is applied yet but what a transaction's end needs).
 */
static bool
send_feedback(PGconn *conn, char **err)
{
	char		msg[1 + 8 * 4 + 1];
	XLogRecPtr	received;
	XLogRecPtr	confirmed;

	pc_lock_alone(streams_shared->lock, LW_SHARED);
	received = my_slot->rt.received_lsn;
	confirmed = my_slot->rt.confirmed_lsn;
	LWLockRelease(streams_shared->lock);
	msg[0] = 'r';
	write64(msg + 1, received);
	write64(msg + 9, confirmed);
	write64(msg + 17, confirmed);
	write64(msg + 25, (uint64) protocol_now());
	msg[33] = 0;
	if (PQputCopyData(conn, msg, sizeof(msg)) <= 0 || PQflush(conn) != 0)
	{
		*err = pstrdup(PQerrorMessage(conn));
		return false;
	}
	return true;
}

/*
 * One message of the copy stream.  XLogData: a pgoutput message, counted
 * (a Commit ends a transaction, which is then confirmed); a keepalive:
 * its position confirmed outside a transaction, and answered if asked.
 * Returns whether an answer is due now.
 */
static bool
handle_message(const char *buf, int len)
{
	bool		reply = false;
	XLogRecPtr	received = InvalidXLogRecPtr;
	XLogRecPtr	confirmed = InvalidXLogRecPtr;
	int64		transactions = 0;
	int64		changes = 0;

	if (buf[0] == 'w' && len >= 25)
	{
		XLogRecPtr	start = read64(buf + 1);
		XLogRecPtr	end = read64(buf + 9);
		char		kind = len > 25 ? buf[25] : 0;

		received = Max(start, end);
		switch (kind)
		{
			case 'B':
				in_transaction = true;
				break;
			case 'C':
				/* flags (1), commit LSN (8), end LSN (8), time (8) */
				if (len >= 25 + 1 + 1 + 8 + 8)
					confirmed = read64(buf + 25 + 2 + 8);
				in_transaction = false;
				transactions = 1;
				break;
			case 'I':
			case 'U':
			case 'D':
			case 'T':
				changes = 1;
				break;
			default:
				break;
		}
	}
	else if (buf[0] == 'k' && len >= 18)
	{
		received = read64(buf + 1);
		if (!in_transaction)
			confirmed = received;
		reply = buf[17] != 0;
	}
	else
		return false;

	pc_lock_alone(streams_shared->lock, LW_EXCLUSIVE);
	my_slot->rt.received_lsn = Max(my_slot->rt.received_lsn, received);
	my_slot->rt.confirmed_lsn = Max(my_slot->rt.confirmed_lsn, confirmed);
	my_slot->rt.transactions += transactions;
	my_slot->rt.changes += changes;
	LWLockRelease(streams_shared->lock);
	return reply;
}

/* Receive until the connection fails or ends; *err says why. */
static void
receive_loop(PGconn *conn, MemoryContext msg_cxt, char **err)
{
	TimestampTz last_feedback = GetCurrentTimestamp();
	TimestampTz last_received = last_feedback;

	in_transaction = false;
	for (;;)
	{
		char	   *buf = NULL;
		int			len;
		bool		reply = false;

		CHECK_FOR_INTERRUPTS();
		if (ConfigReloadPending)
		{
			ConfigReloadPending = false;
			ProcessConfigFile(PGC_SIGHUP);
		}
		MemoryContextReset(msg_cxt);
		len = PQgetCopyData(conn, &buf, 1);
		if (len > 0)
		{
			MemoryContext old = MemoryContextSwitchTo(msg_cxt);

			reply = handle_message(buf, len);
			MemoryContextSwitchTo(old);
			PQfreemem(buf);
			last_received = GetCurrentTimestamp();
		}
		else if (len == -1)
		{
			*err = pstrdup("the source ended the replication");
			return;
		}
		else if (len < -1)
		{
			*err = pstrdup(PQerrorMessage(conn));
			return;
		}
		if (reply ||
			TimestampDifferenceExceeds(last_feedback, GetCurrentTimestamp(),
									   PC_STREAM_FEEDBACK_MS))
		{
			if (!send_feedback(conn, err))
				return;
			last_feedback = GetCurrentTimestamp();
		}
		/* the source sends a keepalive every wal_sender_timeout / 2 */
		if (len == 0 && wal_receiver_timeout > 0 &&
			TimestampDifferenceExceeds(last_received, GetCurrentTimestamp(),
									   wal_receiver_timeout))
		{
			*err = psprintf("the source sent nothing for wal_receiver_timeout (%d ms)",
							wal_receiver_timeout);
			return;
		}
		if (len == 0)
		{
			int			rc = WaitLatchOrSocket(MyLatch,
											   WL_EXIT_ON_PM_DEATH | WL_LATCH_SET |
											   WL_SOCKET_READABLE | WL_TIMEOUT,
											   PQsocket(conn), 1000,
											   pc_wait_event(PC_WAIT_STREAM));

			if (rc & WL_LATCH_SET)
				ResetLatch(MyLatch);
			if ((rc & WL_SOCKET_READABLE) && !PQconsumeInput(conn))
			{
				*err = pstrdup(PQerrorMessage(conn));
				return;
			}
		}
	}
}

/* Sleep ms on the latch, for SIGTERM and reloads. */
static void
stream_sleep(long ms)
{
	TimestampTz end = TimestampTzPlusMilliseconds(GetCurrentTimestamp(), ms);

	for (;;)
	{
		long		left = TimestampDifferenceMilliseconds(GetCurrentTimestamp(),
														   end);

		if (left <= 0)
			break;
		(void) WaitLatch(MyLatch,
						 WL_LATCH_SET | WL_TIMEOUT | WL_EXIT_ON_PM_DEATH,
						 left, pc_wait_event(PC_WAIT_STREAM));
		ResetLatch(MyLatch);
		CHECK_FOR_INTERRUPTS();
		if (ConfigReloadPending)
		{
			ConfigReloadPending = false;
			ProcessConfigFile(PGC_SIGHUP);
		}
	}
}

/* Read the stream's row in projcache.database; false if it is gone. */
static bool
read_definition(int64 id, PcStreamDef *def, bool *super)
{
	bool		found;

	SetCurrentStatementStartTimestamp();
	StartTransactionCommand();
	PushActiveSnapshot(GetTransactionSnapshot());
	found = pc_stream_read(id, def);
	*super = found && superuser_arg(def->owner);
	PopActiveSnapshot();
	CommitTransactionCommand();
	return found;
}

/*
 * Entry point of a stream's worker ("projcache stream NAME"); main_arg
 * is its slot, bgw_extra the stream's id.
 */
void
pc_stream_worker_main(Datum main_arg)
{
	int64		id;
	PcStreamDef def;
	bool		super;
	long		backoff = PC_STREAM_FIRST_BACKOFF_MS;
	MemoryContext msg_cxt;
	MemoryContext conn_cxt;

	pqsignal(SIGHUP, SignalHandlerForConfigReload);
	pqsignal(SIGTERM, die);
	BackgroundWorkerUnblockSignals();

	memcpy(&id, MyBgworkerEntry->bgw_extra, sizeof(id));
	if (!claim_slot(DatumGetInt32(main_arg), id))
		proc_exit(0);
	before_shmem_exit(stream_worker_exit, (Datum) 0);

	pc_worker_connect(pc_database, InvalidOid);
	if (!read_definition(id, &def, &super))
		proc_exit(0);
	pgstat_report_appname(psprintf("projcache stream %s", def.name));
	on_proc_exit(disconnect_at_exit, (Datum) 0);
	msg_cxt = AllocSetContextCreate(TopMemoryContext,
									"projcache stream message",
									ALLOCSET_DEFAULT_SIZES);
	conn_cxt = AllocSetContextCreate(TopMemoryContext,
									 "projcache stream connection",
									 ALLOCSET_DEFAULT_SIZES);

	for (;;)
	{
		char	   *err = NULL;
		bool		held;

		/* what one connection allocates goes with it */
		MemoryContextSwitchTo(conn_cxt);
		MemoryContextReset(conn_cxt);
		CHECK_FOR_INTERRUPTS();
		source_conn = connect_source(&def, super, &err, &held);
		if (source_conn == NULL && held)
		{
			pc_lock_alone(streams_shared->lock, LW_EXCLUSIVE);
			my_slot->held = true;
			LWLockRelease(streams_shared->lock);
			set_state(PC_STREAM_STOPPED, err);
			ereport(LOG,
					(errcode(ERRCODE_S_R_E_PROHIBITED_SQL_STATEMENT_ATTEMPTED),
					 errmsg("projcache stream \"%s\" stopped: password is required",
							def.name),
					 errdetail("The source did not ask for the password, and the stream's owner is not a superuser."),
					 errhint("Have the source ask the role for its password, then change the stream with alter_stream.")));
			proc_exit(0);
		}
		if (source_conn != NULL &&
			identify_system(source_conn, &err) &&
			start_replication(source_conn, &def, &err))
		{
			set_state(PC_STREAM_STREAMING, NULL);
			backoff = PC_STREAM_FIRST_BACKOFF_MS;
			receive_loop(source_conn, msg_cxt, &err);
		}
		disconnect_source();
		set_state(PC_STREAM_RECONNECTING, err ? err : "the connection failed");
		stream_sleep(backoff);
		backoff = Min(backoff * 2, (long) pc_max_retry_backoff_ms);
	}
}
