/*-------------------------------------------------------------------------
 *
 * snapshot_load.c
 *	  Loading a snapshot in a background worker of its own.
 *
 * A snapshot's rows are served to every reader, so what they are must not
 * depend on the reader whose read happened to trigger the load.  A load
 * run in the reader's backend would see that reader's session: its
 * temporary objects (found first by unqualified names, even inside the
 * owner's functions), its settings (row_security, custom placeholders read
 * by row-level security policies, DateStyle, timeouts ...), and so on.  So
 * each load runs in a short-lived background worker with a clean session:
 *
 *	 - connected to the reader's database with no login role (the bootstrap
 *	   superuser, so that owners need no LOGIN), then switched to the
 *	   snapshot's owner under SECURITY_RESTRICTED_OPERATION, as maintenance
 *	   commands run user code: no temporary objects, no SET ROLE;
 *	 - with the server's and the database's settings, never a reader's;
 *	 - reading the view that backs the snapshot (the names in its query were
 *	   bound when it was created), or, for a registration made by the 1.0
 *	   SQL that has no view, its query with search_path = pg_catalog;
 *	 - in a transaction that is rolled back: a load leaves nothing behind.
 *
 * The worker publishes the rows into the snapshot's slot itself and reports
 * how it went through a small DSM segment.  The reader waits for it to
 * exit.  A load is the reader's and ends with it:
 *
 *	 - however the reader ends (an ERROR, a cancel, its statement_timeout,
 *	   pg_terminate_backend, a lost client), the worker is terminated:
 *	   PG_ENSURE_ERROR_CLEANUP also runs at proc_exit, which PG_CATCH
 *	   does not.  A client that goes away is noticed while waiting;
 *	 - the worker arms the reader's statement_timeout, or the one of its
 *	   own session (the server's, the database's) if that is lower, so a
 *	   reader cannot lift the database's; either is the reader's timeout,
 *	   not a failing source;
 *	 - at most projcache.max_load_workers load workers run at once, and at
 *	   most projcache.max_load_workers_per_role of them for one role,
 *	   counted both as the reader's and as the snapshot owner's.  Finding
 *	   none free is not a source failure: the caller serves the last good
 *	   rows or fails with 53400, and nothing is throttled or recorded.
 *
 * A load never starts from a load worker (a snapshot's query that loads
 * another snapshot) or a parallel worker: either is a member of another
 * backend's lock group, and a second group would corrupt the lock
 * manager's group lists.  The outer load then fails as its source does:
 * its query cannot succeed.
 *
 * When a load fails, the worker tells a failing source apart from lost
 * rights, since last-good applies to the first only.  Lost rights are a
 * privilege error (42501) raised here, by this server, whatever raised it:
 * a table's, a column's, a schema's, a function's the query calls directly
 * or through other functions, another snapshot's grant.  A remote
 * server's 42501, passed on by dblink or postgres_fdw, is the source's
 * (dblink_res_error and pgfdw_report_error raise it).  And since a load
 * may fail for another reason before it reaches what the owner lost, the
 * worker then also checks the owner's rights on the whole statement as
 * the owner: parsed, planned, range-table permissions checked and the
 * executor started (which checks EXECUTE on every function in the plan),
 * as EXPLAIN would, without running it.
 *
 * Copyright (c) 2026, projcache developers
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/detoast.h"
#include "access/htup_details.h"
#include "access/parallel.h"
#include "access/xact.h"
#include "catalog/pg_authid.h"
#include "catalog/pg_class.h"
#include "catalog/pg_proc.h"
#include "executor/executor.h"
#include "executor/spi.h"
#include "lib/stringinfo.h"
#include "miscadmin.h"
#include "nodes/nodeFuncs.h"
#include "pgstat.h"
#include "postmaster/bgworker.h"
#include "storage/dsm.h"
#include "storage/ipc.h"
#include "storage/proc.h"
#include "storage/shmem.h"
#include "storage/spin.h"
#include "tcop/dest.h"
#include "tcop/tcopprot.h"
#include "utils/acl.h"
#include "utils/builtins.h"
#include "utils/guc.h"
#include "utils/lsyscache.h"
#include "utils/memutils.h"
#include "utils/snapmgr.h"
#include "utils/syscache.h"
#include "utils/timeout.h"

#include "snapshot.h"

/* Longest error text carried back to the reader. */
#define LOAD_ERROR_BYTES	1024

/* How often a waiting reader checks that its client is still there. */
#define CLIENT_CHECK_MS		1000

/*
 * From libpq/libpq.h, which cannot be included where the server's GSSAPI
 * headers are not installed.
 */
extern bool pq_check_connection(void);

/*
 * The load workers running or about to, in shared memory: one entry per
 * possible background worker.  An entry is reserved by the reader before
 * it registers the worker and taken over by the worker once it runs; it
 * is freed by the worker's exit, or by the reader if no worker took it
 * over (never started, or exited before).  The per-role counts need a scan
 * of the entries, so a spinlock rather than atomics guards them; the scan
 * is of max_worker_processes entries, once per load.
 */
typedef struct LoadWorkerEntry
{
	uint64		serial;			/* 0: free */
	int			worker_pid;		/* 0 until the worker has taken it over */
	Oid			reader;			/* the reader's role, charged */
	Oid			owner;			/* the snapshot's owner, charged too */
} LoadWorkerEntry;

typedef struct LoadWorkers
{
	slock_t		mutex;
	uint64		last_serial;
	int			nentries;
	LoadWorkerEntry entries[FLEXIBLE_ARRAY_MEMBER];
} LoadWorkers;

static LoadWorkers *load_workers = NULL;

/* Set in a load worker: a load never starts from one. */
static bool am_load_worker = false;

/* The entry this load worker took over, freed at its exit. */
static int	my_entry = -1;
static uint64 my_serial = 0;

/*
 * The task, in a DSM segment the reader creates.  Laid out as this header,
 * then natts column type OIDs, then the query text (NUL-terminated).
 */
typedef struct LoadTask
{
	/* set by the reader */
	Oid			dbid;
	Oid			owner;
	Oid			view;			/* InvalidOid: run query_offset's text */
	PcSnapRef	ref;
	uint64		stale_marks;	/* the slot's, before the query runs */
	char		name[NAMEDATALEN];
	int			natts;
	int			key_attno;		/* key column to index (1-based), or 0 */
	Size		query_offset;
	int			leader_pgprocno;	/* the waiting reader, as lock group */
	int			leader_pid;
	int			entry;			/* in load_workers, and its serial */
	uint64		serial;
	int			statement_timeout_ms;	/* the reader's; 0: none */

	/* set by the worker */
	PcLoadStatus status;
	int			sqlerrcode;
	bool		local_privilege;	/* failed with a 42501 of this server */
	bool		rights_checked; /* the query ran as the owner to its end, or
								 * the owner's rights were checked after it
								 * failed: a failure is the source's */
	bool		timed_out;		/* ended by the timeout it armed */
	int			timeout_ms;		/* that timeout */
	char		error[LOAD_ERROR_BYTES];
} LoadTask;

/* ----------------------------------------------------------------
 * Counting load workers (projcache.max_load_workers)
 * ----------------------------------------------------------------
 */

static Size
load_shmem_size(void)
{
	return add_size(offsetof(LoadWorkers, entries),
					mul_size(max_worker_processes, sizeof(LoadWorkerEntry)));
}

void
pc_load_shmem_request(void)
{
	RequestAddinShmemSpace(load_shmem_size());
}

void
pc_load_shmem_startup(void)
{
	bool		found;

	load_workers = ShmemInitStruct("projcache load workers",
								   load_shmem_size(), &found);
	if (!found)
	{
		memset(load_workers, 0, load_shmem_size());
		SpinLockInit(&load_workers->mutex);
		load_workers->nentries = max_worker_processes;
	}
}

/*
 * Reserve an entry for a load by the current reader of owner's snapshot.
 * Returns its index (and *serial), or -1 with *error saying which bound
 * is reached.
 */
static int
reserve_load_worker(Oid reader, Oid owner, uint64 *serial, char **error)
{
	LoadWorkers *lw = load_workers;
	int			cap = Min(pc_max_load_workers, lw->nentries);
	int			running = 0;
	int			of_reader = 0;
	int			of_owner = 0;
	int			free_entry = -1;
	int			i;

	SpinLockAcquire(&lw->mutex);
	for (i = 0; i < lw->nentries; i++)
	{
		LoadWorkerEntry *e = &lw->entries[i];

		if (e->serial == 0)
		{
			if (free_entry < 0)
				free_entry = i;
			continue;
		}
		running++;
		if (e->reader == reader || e->owner == reader)
			of_reader++;
		if (e->reader == owner || e->owner == owner)
			of_owner++;
	}
	if (running < cap && of_reader < pc_max_load_workers_per_role &&
		of_owner < pc_max_load_workers_per_role)
	{
		LoadWorkerEntry *e = &lw->entries[free_entry];

		Assert(free_entry >= 0);
		e->serial = *serial = ++lw->last_serial;
		e->worker_pid = 0;
		e->reader = reader;
		e->owner = owner;
	}
	else
		free_entry = -1;
	SpinLockRelease(&lw->mutex);

	if (free_entry >= 0)
		return free_entry;
	if (running >= cap)
		*error = psprintf("%d snapshot loads are running, and projcache.max_load_workers is %d",
						  running, cap);
	else
	{
		bool		by_reader = of_reader >= pc_max_load_workers_per_role;

		*error = psprintf("role \"%s\" has %d snapshot loads running, and projcache.max_load_workers_per_role is %d",
						  GetUserNameFromId(by_reader ? reader : owner, true),
						  by_reader ? of_reader : of_owner,
						  pc_max_load_workers_per_role);
	}
	return -1;
}

/*
 * The reader, once its worker has stopped or will never run: free the
 * entry unless the worker took it over (it frees it when it exits).
 */
static void
release_unadopted(int entry, uint64 serial)
{
	LoadWorkerEntry *e = &load_workers->entries[entry];

	SpinLockAcquire(&load_workers->mutex);
	if (e->serial == serial && e->worker_pid == 0)
		e->serial = 0;
	SpinLockRelease(&load_workers->mutex);
}

/*
 * The worker, at start: take the reader's entry over.  False if the
 * reader gave it up already (it has stopped waiting).
 */
static bool
adopt_entry(int entry, uint64 serial)
{
	LoadWorkerEntry *e = &load_workers->entries[entry];
	bool		adopted = false;

	Assert(entry >= 0 && entry < load_workers->nentries);
	SpinLockAcquire(&load_workers->mutex);
	if (e->serial == serial && e->worker_pid == 0)
	{
		e->worker_pid = MyProcPid;
		adopted = true;
	}
	SpinLockRelease(&load_workers->mutex);
	if (adopted)
	{
		my_entry = entry;
		my_serial = serial;
	}
	return adopted;
}

/* before_shmem_exit of a load worker: every exit frees its entry. */
static void
free_my_entry(int code, Datum arg)
{
	LoadWorkerEntry *e;

	if (my_entry < 0)
		return;
	e = &load_workers->entries[my_entry];
	SpinLockAcquire(&load_workers->mutex);
	if (e->serial == my_serial && e->worker_pid == MyProcPid)
		e->serial = 0;
	SpinLockRelease(&load_workers->mutex);
	my_entry = -1;
}

/* ----------------------------------------------------------------
 * In the load worker: running the query as its owner and publishing its rows
 * ----------------------------------------------------------------
 */

static Oid *
task_coltypes(LoadTask *task)
{
	return (Oid *) ((char *) task + MAXALIGN(sizeof(LoadTask)));
}

static char *
task_query(LoadTask *task)
{
	return (char *) task + task->query_offset;
}

/*
 * Do the (non-dropped) columns of desc have these types, in this order?
 */
bool
pc_snap_types_match(int natts, const Oid *coltypes, TupleDesc desc)
{
	int			i;
	int			n = 0;

	for (i = 0; i < desc->natts; i++)
	{
		Form_pg_attribute att = TupleDescAttr(desc, i);

		if (att->attisdropped)
			continue;
		if (n >= natts || att->atttypid != coltypes[n])
			return false;
		n++;
	}
	return n == natts;
}

/*
 * Serialize the query's rows as MAXALIGNed MinimalTuples, with every value
 * detoasted so the rows stand on their own in shared memory; with a key
 * column, followed by the key index (snapshot_index.c).
 */
static void
serialize_rows(SPITupleTable *tuptable, uint64 nrows, int key_attno,
			   StringInfo out)
{
	TupleDesc	desc = tuptable->tupdesc;
	Datum	   *values = palloc(desc->natts * sizeof(Datum));
	bool	   *nulls = palloc(desc->natts * sizeof(bool));
	bool	   *detoasted = palloc(desc->natts * sizeof(bool));
	uint64	   *offsets = NULL;
	uint32	   *hashes = NULL;
	bool	   *null_keys = NULL;
	Oid			key_type = InvalidOid;
	uint64		row;
	int			i;

	if (key_attno > 0)
	{
		key_type = TupleDescAttr(desc, key_attno - 1)->atttypid;
		offsets = palloc(Max(nrows, 1) * sizeof(uint64));
		hashes = palloc(Max(nrows, 1) * sizeof(uint32));
		null_keys = palloc(Max(nrows, 1) * sizeof(bool));
	}
	for (row = 0; row < nrows; row++)
	{
		MinimalTuple mt;
		Size		pad;

		heap_deform_tuple(tuptable->vals[row], desc, values, nulls);
		for (i = 0; i < desc->natts; i++)
		{
			detoasted[i] = !nulls[i] && TupleDescAttr(desc, i)->attlen == -1 &&
				VARATT_IS_EXTERNAL(DatumGetPointer(values[i]));
			if (detoasted[i])
			{
				struct varlena *stored = (struct varlena *)
					DatumGetPointer(values[i]);

				values[i] = PointerGetDatum(detoast_external_attr(stored));
			}
		}
		if (key_attno > 0)
		{
			offsets[row] = out->len;
			null_keys[row] = nulls[key_attno - 1];
			hashes[row] = null_keys[row] ? 0 :
				pc_snap_key_hash(key_type, values[key_attno - 1]);
		}
		mt = pc_heap_form_minimal_tuple(desc, values, nulls);
		for (i = 0; i < desc->natts; i++)
			if (detoasted[i])
				pfree(DatumGetPointer(values[i]));
		appendBinaryStringInfo(out, (char *) mt, mt->t_len);
		pad = MAXALIGN(out->len) - out->len;
		while (pad-- > 0)
			appendStringInfoChar(out, '\0');
		pfree(mt);
	}
	if (key_attno > 0)
		pc_snap_append_index(out, nrows, offsets, hashes, null_keys);
}

static void
task_report(LoadTask *task, PcLoadStatus status, int sqlerrcode,
			const char *message)
{
	task->sqlerrcode = sqlerrcode;
	strlcpy(task->error, message ? message : "", LOAD_ERROR_BYTES);
	task->status = status;
}

/*
 * What the worker runs: "SELECT * FROM" the backing view, or the 1.0
 * registration's query.  NULL, with the task reported, if the view or the
 * owner is gone: the cached rows must not outlive them.
 */
static char *
task_statement(LoadTask *task)
{
	char	   *nspname;
	char	   *relname;

	if (!SearchSysCacheExists1(AUTHOID, ObjectIdGetDatum(task->owner)))
	{
		task_report(task, PC_LOAD_REVOKED, ERRCODE_UNDEFINED_OBJECT,
					psprintf("the owner of snapshot \"%s\" (role %u) no longer exists",
							 task->name, task->owner));
		return NULL;
	}
	if (!OidIsValid(task->view))
		return task_query(task);
	if (get_rel_relkind(task->view) != RELKIND_VIEW ||
		(nspname = get_namespace_name(get_rel_namespace(task->view))) == NULL ||
		(relname = get_rel_name(task->view)) == NULL)
	{
		task_report(task, PC_LOAD_REVOKED, ERRCODE_UNDEFINED_OBJECT,
					psprintf("the view behind snapshot \"%s\" was dropped",
							 task->name));
		return NULL;
	}
	return psprintf("SELECT * FROM %s",
					quote_qualified_identifier(nspname, relname));
}

/* Run user code as the owner, in a session state no reader chose. */
static void
become_owner(LoadTask *task, PcUserSwitch *sw)
{
	pc_become(sw, PC_AS_SNAPSHOT_OWNER, task->owner,
			  OidIsValid(task->view) ? NULL : "pg_catalog");
}

/*
 * Run the load: query as the owner, check the columns, publish.  Raises the
 * query's ERROR; the caller catches it.
 */
static void
run_load(LoadTask *task, const char *sql)
{
	MemoryContext cxt = CurrentMemoryContext;
	StringInfoData rows;
	PcUserSwitch sw;
	char	   *refusal;
	int64		nrows;
	int			ret;

	initStringInfo(&rows);
	become_owner(task, &sw);
	if (SPI_connect() != SPI_OK_CONNECT)
		elog(ERROR, "SPI_connect failed");
	ret = SPI_execute(sql, true, 0);
	if (ret != SPI_OK_SELECT)
		ereport(ERROR,
				(errcode(ERRCODE_WRONG_OBJECT_TYPE),
				 errmsg("snapshot query did not return rows")));
	if (!pc_snap_types_match(task->natts, task_coltypes(task),
							 SPI_tuptable->tupdesc))
		ereport(ERROR,
				(errcode(ERRCODE_DATATYPE_MISMATCH),
				 errmsg("snapshot query no longer returns the registered columns"),
				 errhint("Drop and create the snapshot again.")));
	{
		MemoryContext spicxt = MemoryContextSwitchTo(cxt);

		nrows = (int64) SPI_processed;
		serialize_rows(SPI_tuptable, SPI_processed, task->key_attno, &rows);
		MemoryContextSwitchTo(spicxt);
	}
	SPI_finish();
	pc_unbecome(&sw);
	/* The owner's rights are intact: a refusal below is about memory. */
	task->rights_checked = true;

	if (!pc_snap_publish(task->ref, rows.data, rows.len, nrows, pc_now_ms(),
						 task->stale_marks, &refusal))
		task_report(task, PC_LOAD_FAILED, ERRCODE_OUT_OF_MEMORY, refusal);
	else
		task_report(task, PC_LOAD_OK, 0, NULL);
}

/*
 * Is this error a privilege this server refused (lost rights), rather than
 * one a remote server refused and dblink or postgres_fdw passed on (a
 * failing source)?  Anything else raising 42501 here, a function of the
 * owner's included, counts as lost rights: that errs on the side of not
 * serving rows.
 */
static bool
is_local_privilege_error(const ErrorData *edata)
{
	if (edata->sqlerrcode != ERRCODE_INSUFFICIENT_PRIVILEGE)
		return false;
	if (edata->funcname != NULL &&
		(strcmp(edata->funcname, "dblink_res_error") == 0 ||
		 strcmp(edata->funcname, "pgfdw_report_error") == 0))
		return false;
	return true;
}

/*
 * Start the executor on a planned statement as EXPLAIN does, without
 * running it: this checks the range table's permissions and EXECUTE on
 * every function the plan calls, and raises their errors.
 */
static void
start_without_running(PlannedStmt *stmt, const char *sql)
{
	QueryDesc  *qd = CreateQueryDesc(stmt, sql, GetActiveSnapshot(),
									 InvalidSnapshot, None_Receiver, NULL,
									 NULL, 0);

	ExecutorStart(qd, EXEC_FLAG_EXPLAIN_ONLY);
	ExecutorEnd(qd);
	FreeQueryDesc(qd);
}

/* EXECUTE on a function an expression calls, as the current user? */
static bool
execute_denied(Oid func_id, void *context)
{
	return pc_proc_aclcheck(func_id, GetUserId(), ACL_EXECUTE) != ACLCHECK_OK;
}

/*
 * Does a rewritten query, at any depth (subqueries, CTEs, sublinks, the
 * views it reads, which the rewriter expanded with their owners'
 * rights), need a privilege the current user lacks?  This runs before
 * planning, because the planner evaluates immutable functions (the
 * owner's own among them) before the executor would check the range
 * table: a function that fails there would hide lost rights.
 */
static bool
privilege_missing_walker(Node *node, void *context)
{
	if (node == NULL)
		return false;
	if (IsA(node, Query))
	{
		Query	   *query = (Query *) node;

		if (!pc_query_check_permissions(query, false))
			return true;
		return query_tree_walker(query, privilege_missing_walker, context, 0);
	}
	if (check_functions_in_node(node, execute_denied, context))
		return true;
	return expression_tree_walker(node, privilege_missing_walker, context);
}

/*
 * Parse, analyze and rewrite sql as the current user and walk what it
 * needs (privilege_missing_walker), without planning it.
 */
static bool
statement_lacks_privileges(const char *sql)
{
	ListCell   *lc;

	foreach(lc, pg_parse_query(sql))
	{
		List	   *queries;
		ListCell   *lq;

		queries =
			pg_analyze_and_rewrite_fixedparams(lfirst_node(RawStmt, lc),
											   sql, NULL, 0, NULL);
		foreach(lq, queries)
		{
			Query	   *query = lfirst_node(Query, lq);

			if (query->commandType != CMD_UTILITY &&
				privilege_missing_walker((Node *) query, NULL))
				return true;
		}
	}
	return false;
}

/*
 * After a load that failed without a privilege error of this server: does
 * the owner still hold the privileges the snapshot needs?  As the owner,
 * the registered query and then the statement the load ran (which reads
 * the snapshot's view, whose rule its owner may have replaced) are parsed
 * and rewritten, and what they need is checked before planning
 * (statement_lacks_privileges); then the statement is planned, its range
 * table checked and the executor started (start_without_running).  A
 * local privilege error while doing so also says no.  Any other error (an
 * object that cannot be found, a remote server's refusal while planning)
 * says nothing about rights: the source is failing.
 */
static bool
owner_lost_rights(LoadTask *task, const char *sql)
{
	MemoryContext cxt = CurrentMemoryContext;
	volatile bool lost = false;

	StartTransactionCommand();
	PushActiveSnapshot(GetTransactionSnapshot());
	PG_TRY();
	{
		PcUserSwitch sw;
		ListCell   *lc;

		become_owner(task, &sw);
		if (statement_lacks_privileges(task_query(task)) ||
			statement_lacks_privileges(sql))
			lost = true;
		foreach(lc, lost ? NIL : pg_parse_query(sql))
		{
			List	   *queries;
			ListCell   *lp;

			queries =
				pg_analyze_and_rewrite_fixedparams(lfirst_node(RawStmt, lc),
												   sql, NULL, 0, NULL);
			foreach(lp, pg_plan_queries(queries, sql, 0, NULL))
			{
				PlannedStmt *stmt = lfirst_node(PlannedStmt, lp);

				if (stmt->commandType == CMD_UTILITY)
					continue;
				if (!pc_exec_check_permissions(stmt, false))
					lost = true;
				else
					start_without_running(stmt, sql);
			}
		}
	}
	PG_CATCH();
	{
		ErrorData  *edata;

		MemoryContextSwitchTo(cxt);
		edata = CopyErrorData();
		FlushErrorState();
		if (is_local_privilege_error(edata))
			lost = true;
		FreeErrorData(edata);
	}
	PG_END_TRY();
	/* Also restores the user id and the settings. */
	AbortCurrentTransaction();
	MemoryContextSwitchTo(cxt);
	return lost;
}

/*
 * The statement timeout a load runs under: the reader's, or this worker's
 * own (the server's or the database's, as its session started) if that is
 * lower, so that a reader can shorten but never lift the database's.
 */
static int
load_timeout_ms(LoadTask *task)
{
	int			ms = task->statement_timeout_ms;

	if (StatementTimeout > 0 && (ms <= 0 || StatementTimeout < ms))
		ms = StatementTimeout;
	return Max(ms, 0);
}

/*
 * Entry point of a load worker: bgw_main_arg is the task's DSM handle.
 */
void
pc_snap_load_main(Datum main_arg)
{
	dsm_segment *seg;
	LoadTask   *task;
	MemoryContext cxt;
	char	   *sql;
	int			timeout_ms;

	am_load_worker = true;
	pqsignal(SIGTERM, die);
	BackgroundWorkerUnblockSignals();

	seg = dsm_attach(DatumGetUInt32(main_arg));
	if (seg == NULL)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("snapshot load task is gone")));
	task = (LoadTask *) dsm_segment_address(seg);

	/* From here on, however this process exits, its entry is freed. */
	before_shmem_exit(free_my_entry, (Datum) 0);
	if (!adopt_entry(task->entry, task->serial))
		proc_exit(0);			/* the reader stopped waiting */

	/*
	 * Join the waiting reader's lock group, as a parallel worker does, so
	 * that a lock wait of the load is seen as the reader's (pg_locks,
	 * pg_blocking_pids, the deadlock detector).  The reader has not written
	 * (it does not load then), so sharing its locks exposes nothing.
	 */
	if (!BecomeLockGroupMember(GetPGProcByNumber(task->leader_pgprocno),
							   task->leader_pid))
		proc_exit(0);			/* the reader is gone already */

	pc_worker_connect(NULL, task->dbid);
	pgstat_report_appname("projcache snapshot load");
	pc_attach();

	cxt = AllocSetContextCreate(TopMemoryContext, "projcache snapshot load",
								ALLOCSET_DEFAULT_SIZES);
	MemoryContextSwitchTo(cxt);

	SetCurrentStatementStartTimestamp();
	StartTransactionCommand();
	PushActiveSnapshot(GetTransactionSnapshot());
	pgstat_report_activity(STATE_RUNNING, "projcache: loading a snapshot");
	MemoryContextSwitchTo(cxt);
	sql = task_statement(task);
	if (sql != NULL)
		sql = pstrdup(sql);

	/* Nothing arms statement_timeout in a background worker: do it here. */
	timeout_ms = load_timeout_ms(task);
	PG_TRY();
	{
		if (timeout_ms > 0)
			enable_timeout_after(STATEMENT_TIMEOUT, timeout_ms);
		if (sql != NULL)
			run_load(task, sql);
	}
	PG_CATCH();
	{
		ErrorData  *edata;

		MemoryContextSwitchTo(cxt);
		edata = CopyErrorData();
		FlushErrorState();
		/* It fired (and so is no longer active): not a remote 57014. */
		task->timed_out = timeout_ms > 0 &&
			edata->sqlerrcode == ERRCODE_QUERY_CANCELED &&
			!get_timeout_active(STATEMENT_TIMEOUT);
		task->timeout_ms = timeout_ms;
		task->local_privilege = is_local_privilege_error(edata);
		task_report(task, PC_LOAD_FAILED, edata->sqlerrcode, edata->message);
		FreeErrorData(edata);
	}
	PG_END_TRY();
	disable_timeout(STATEMENT_TIMEOUT, false);

	/* Nothing the query did stays: the rows are already published. */
	AbortCurrentTransaction();
	MemoryContextSwitchTo(cxt);

	if (task->status == PC_LOAD_FAILED && sql != NULL && !task->timed_out &&
		!task->rights_checked)
	{
		if (task->local_privilege || owner_lost_rights(task, sql))
			task->status = PC_LOAD_REVOKED;
		task->rights_checked = true;
	}

	pgstat_report_activity(STATE_IDLE, NULL);
	dsm_detach(seg);
	proc_exit(0);
}

/* ----------------------------------------------------------------
 * In the reader: starting a load worker and waiting for it
 * ----------------------------------------------------------------
 */

/*
 * Refuse a load where one would join a second lock group: in a load
 * worker (a snapshot's query that loads another snapshot) or a parallel
 * worker, each a member of another backend's group.
 */
static void
refuse_nested_load(const char *name)
{
	PGPROC	   *leader = MyProc->lockGroupLeader;

	if (am_load_worker)
		ereport(ERROR,
				(errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
				 errmsg("snapshot \"%s\" cannot be loaded by the load of another snapshot",
						name),
				 errdetail("A snapshot's query may read another snapshot only while that one is loaded and within its TTL."),
				 errhint("Query the other snapshot's source directly.")));
	if (IsInParallelMode() || IsParallelWorker() ||
		(leader != NULL && leader != MyProc))
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_TRANSACTION_STATE),
				 errmsg("cannot load snapshot \"%s\" during a parallel operation",
						name),
				 errhint("A function that reads a snapshot must be marked PARALLEL UNSAFE.")));
}

/* What a reader's cleanup needs: its entry, and the worker once started. */
typedef struct LoadWait
{
	int			entry;
	uint64		serial;
	BackgroundWorkerHandle *handle;
} LoadWait;

/*
 * The reader ends (an ERROR, or proc_exit however it came): the load ends
 * with it.
 */
static void
end_load(int code, Datum arg)
{
	LoadWait   *wait = (LoadWait *) DatumGetPointer(arg);

	if (wait->handle != NULL)
		TerminateBackgroundWorker(wait->handle);
	release_unadopted(wait->entry, wait->serial);
}

/*
 * Wait for the worker to stop.  A client that went away ends this backend
 * as the server does when it notices one (client_connection_check_interval),
 * so that its load does not run on for nobody.
 */
static BgwHandleStatus
wait_for_worker(BackgroundWorkerHandle *handle)
{
	for (;;)
	{
		BgwHandleStatus status;
		pid_t		pid;
		int			rc;

		CHECK_FOR_INTERRUPTS();
		status = GetBackgroundWorkerPid(handle, &pid);
		if (status == BGWH_STOPPED)
			return status;
		rc = WaitLatch(MyLatch,
					   WL_LATCH_SET | WL_TIMEOUT | WL_POSTMASTER_DEATH,
					   CLIENT_CHECK_MS, pc_wait_event(PC_WAIT_SNAPSHOT_LOAD));
		if (rc & WL_POSTMASTER_DEATH)
			return BGWH_POSTMASTER_DIED;
		ResetLatch(MyLatch);
		if (whereToSendOutput == DestRemote && MyProcPort != NULL &&
			!pq_check_connection())
		{
			ClientConnectionLost = true;
			InterruptPending = true;
		}
	}
}

/* The load worker to start for the task in seg. */
static void
describe_load_worker(BackgroundWorker *worker, dsm_segment *seg)
{
	memset(worker, 0, sizeof(*worker));
	worker->bgw_flags = BGWORKER_SHMEM_ACCESS |
		BGWORKER_BACKEND_DATABASE_CONNECTION;
	worker->bgw_start_time = BgWorkerStart_ConsistentState;
	worker->bgw_restart_time = BGW_NEVER_RESTART;
	snprintf(worker->bgw_library_name, BGW_MAXLEN, "projcache");
	snprintf(worker->bgw_function_name, BGW_MAXLEN, "pc_snap_load_main");
	snprintf(worker->bgw_name, BGW_MAXLEN, "projcache snapshot load");
	snprintf(worker->bgw_type, BGW_MAXLEN, "projcache snapshot load");
	worker->bgw_main_arg = UInt32GetDatum(dsm_segment_handle(seg));
	worker->bgw_notify_pid = MyProcPid;
}

/* What the load worker reported in its task, copied out of the segment. */
static PcLoadStatus
task_result(const LoadTask *task, char **error, int *sqlerrcode)
{
	PcLoadStatus result = task->status;

	*sqlerrcode = task->sqlerrcode;
	*error = NULL;
	if (result == PC_LOAD_NONE)
	{
		/* failed, and the owner's rights unchecked: see PcLoadStatus */
		*sqlerrcode = ERRCODE_INTERNAL_ERROR;
		*error = pstrdup("the snapshot load worker exited before reporting; see the server log");
	}
	else if (result != PC_LOAD_OK)
		*error = pstrdup(task->error);
	/* It failed and exited before checking the owner's rights. */
	if (result == PC_LOAD_FAILED && !task->rights_checked)
		result = PC_LOAD_NONE;
	return result;
}

/*
 * Load a snapshot in a worker and wait for it.  Returns how it went, with
 * *error (and *sqlerrcode) set unless it succeeded; PC_LOAD_BUSY when no
 * load worker could be had (53400), which says nothing about the source;
 * PC_LOAD_NONE when the worker exited without a report (it failed, and
 * whether the owner's rights are intact is not known).
 * A cancel or timeout of this backend, or of the load (statement_timeout),
 * terminates the worker and is raised as usual; so is a load requested
 * where it must not start (refuse_nested_load).
 */
PcLoadStatus
pc_snap_load(Oid owner, Oid view, const char *query, const char *name,
			 int natts, const Oid *coltypes, int key_attno, PcSnapRef ref,
			 char **error, int *sqlerrcode)
{
	Size		types_offset = MAXALIGN(sizeof(LoadTask));
	Size		query_offset = types_offset + natts * sizeof(Oid);
	dsm_segment *seg;
	LoadTask   *task;
	BackgroundWorker worker;
	LoadWait	wait;
	BgwHandleStatus status;
	bool		registered;
	PcLoadStatus result;

	refuse_nested_load(name);
	Assert(load_workers != NULL);

	wait.handle = NULL;
	wait.entry = reserve_load_worker(GetOuterUserId(), owner, &wait.serial,
									 error);
	if (wait.entry < 0)
	{
		*sqlerrcode = ERRCODE_CONFIGURATION_LIMIT_EXCEEDED;
		return PC_LOAD_BUSY;
	}

	/* Only a backend in no other group leads one (see refuse_nested_load). */
	Assert(MyProc->lockGroupLeader == NULL ||
		   MyProc->lockGroupLeader == MyProc);

	PG_ENSURE_ERROR_CLEANUP(end_load, PointerGetDatum(&wait));
	{
		seg = dsm_create(query_offset + strlen(query) + 1, 0);
		task = (LoadTask *) dsm_segment_address(seg);
		memset(task, 0, sizeof(LoadTask));
		task->dbid = MyDatabaseId;
		task->owner = owner;
		task->view = view;
		task->ref = ref;
		task->stale_marks = pc_snap_stale_marks(ref);
		strlcpy(task->name, name, NAMEDATALEN);
		task->natts = natts;
		task->key_attno = key_attno;
		memcpy(task_coltypes(task), coltypes, natts * sizeof(Oid));
		task->query_offset = query_offset;
		strcpy(task_query(task), query);
		BecomeLockGroupLeader();
		task->leader_pgprocno = GetNumberFromPGProc(MyProc);
		task->leader_pid = MyProcPid;
		task->entry = wait.entry;
		task->serial = wait.serial;
		task->statement_timeout_ms = StatementTimeout;
		task->status = PC_LOAD_NONE;
		describe_load_worker(&worker, seg);

		/* set inside, not before: not live across the setjmp */
		status = BGWH_STOPPED;
		registered = RegisterDynamicBackgroundWorker(&worker, &wait.handle);
		if (registered)
			status = wait_for_worker(wait.handle);
	}
	PG_END_ENSURE_ERROR_CLEANUP(end_load, PointerGetDatum(&wait));
	release_unadopted(wait.entry, wait.serial);

	if (!registered)
	{
		dsm_detach(seg);
		*sqlerrcode = ERRCODE_CONFIGURATION_LIMIT_EXCEEDED;
		*error = pstrdup("no background worker slot is free for the snapshot load; raise max_worker_processes");
		return PC_LOAD_BUSY;
	}
	if (status == BGWH_POSTMASTER_DIED)
		ereport(FATAL,
				(errcode(ERRCODE_ADMIN_SHUTDOWN),
				 errmsg("postmaster exited during a projcache snapshot load")));

	if (task->timed_out)
	{
		int			ms = task->timeout_ms;

		dsm_detach(seg);
		ereport(ERROR,
				(errcode(ERRCODE_QUERY_CANCELED),
				 errmsg("canceling statement due to statement timeout"),
				 errdetail("The load of snapshot \"%s\" ran for longer than statement_timeout (%d ms).",
						   name, ms)));
	}

	result = task_result(task, error, sqlerrcode);
	dsm_detach(seg);
	return result;
}
