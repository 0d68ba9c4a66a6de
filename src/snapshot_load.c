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
 * exit; a cancel or timeout of the reader terminates it.
 *
 * When a load fails, the worker tells a failing source apart from lost
 * rights by checking the owner's privileges on what the query reads
 * (planned as the owner, range-table permissions checked as the executor
 * would), not by the SQLSTATE: a remote server's 42501 passed on by dblink
 * is a source failure and last-good applies to it, while a local REVOKE
 * from the owner ends the serving of the cached rows.
 *
 * Copyright (c) 2026, projcache developers
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/detoast.h"
#include "access/htup_details.h"
#include "access/xact.h"
#include "catalog/pg_authid.h"
#include "catalog/pg_class.h"
#include "executor/executor.h"
#include "executor/spi.h"
#include "lib/stringinfo.h"
#include "miscadmin.h"
#include "pgstat.h"
#include "postmaster/bgworker.h"
#include "storage/dsm.h"
#include "storage/ipc.h"
#include "storage/proc.h"
#include "tcop/tcopprot.h"
#include "utils/builtins.h"
#include "utils/guc.h"
#include "utils/lsyscache.h"
#include "utils/memutils.h"
#include "utils/snapmgr.h"
#include "utils/syscache.h"

#include "snapshot.h"

/* Longest error text carried back to the reader. */
#define LOAD_ERROR_BYTES	1024

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

	/* set by the worker */
	PcLoadStatus status;
	int			sqlerrcode;
	char		error[LOAD_ERROR_BYTES];
} LoadTask;

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
				values[i] = PointerGetDatum(detoast_external_attr((struct varlena *)
																  DatumGetPointer(values[i])));
		}
		if (key_attno > 0)
		{
			offsets[row] = out->len;
			null_keys[row] = nulls[key_attno - 1];
			hashes[row] = null_keys[row] ? 0 :
				pc_snap_key_hash(key_type, values[key_attno - 1]);
		}
		mt = heap_form_minimal_tuple(desc, values, nulls);
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

	if (!pc_snap_publish(task->ref, rows.data, rows.len, nrows, pc_now_ms(),
						 task->stale_marks, &refusal))
		task_report(task, PC_LOAD_FAILED, ERRCODE_OUT_OF_MEMORY, refusal);
	else
		task_report(task, PC_LOAD_OK, 0, NULL);
}

/*
 * After a failed load: does the owner still hold the privileges the query
 * needs?  The statement is planned as the owner and its range table checked
 * as the executor would.  A local privilege error while doing so also says
 * no.  Any other error (an object that cannot be found) says nothing about
 * rights: the source is failing.
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
		foreach(lc, pg_parse_query(sql))
		{
			List	   *queries;
			ListCell   *lp;

			queries = pg_analyze_and_rewrite_fixedparams(lfirst_node(RawStmt, lc),
														 sql, NULL, 0, NULL);
			foreach(lp, pg_plan_queries(queries, sql, 0, NULL))
			{
				PlannedStmt *stmt = lfirst_node(PlannedStmt, lp);

				if (stmt->commandType != CMD_UTILITY &&
					!ExecCheckRTPerms(stmt->rtable, false))
					lost = true;
			}
		}
	}
	PG_CATCH();
	{
		ErrorData  *edata;

		MemoryContextSwitchTo(cxt);
		edata = CopyErrorData();
		FlushErrorState();
		if (edata->sqlerrcode == ERRCODE_INSUFFICIENT_PRIVILEGE)
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
 * Entry point of a load worker: bgw_main_arg is the task's DSM handle.
 */
void
pc_snapshot_load_main(Datum main_arg)
{
	dsm_segment *seg;
	LoadTask   *task;
	MemoryContext cxt;
	char	   *sql;

	pqsignal(SIGTERM, die);
	BackgroundWorkerUnblockSignals();

	seg = dsm_attach(DatumGetUInt32(main_arg));
	if (seg == NULL)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("snapshot load task is gone")));
	task = (LoadTask *) dsm_segment_address(seg);

	/*
	 * Join the waiting reader's lock group, as a parallel worker does, so
	 * that a lock wait of the load is seen as the reader's (pg_locks,
	 * pg_blocking_pids, the deadlock detector).  The reader has not written
	 * (it does not load then), so sharing its locks exposes nothing.
	 */
	if (!BecomeLockGroupMember(&ProcGlobal->allProcs[task->leader_pgprocno],
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

	PG_TRY();
	{
		if (sql != NULL)
			run_load(task, sql);
	}
	PG_CATCH();
	{
		ErrorData  *edata;

		MemoryContextSwitchTo(cxt);
		edata = CopyErrorData();
		FlushErrorState();
		task_report(task, PC_LOAD_FAILED, edata->sqlerrcode, edata->message);
		FreeErrorData(edata);
	}
	PG_END_TRY();

	/* Nothing the query did stays: the rows are already published. */
	AbortCurrentTransaction();
	MemoryContextSwitchTo(cxt);

	if (task->status == PC_LOAD_FAILED && sql != NULL &&
		task->sqlerrcode != ERRCODE_OUT_OF_MEMORY &&
		owner_lost_rights(task, sql))
		task->status = PC_LOAD_REVOKED;

	pgstat_report_activity(STATE_IDLE, NULL);
	dsm_detach(seg);
	proc_exit(0);
}

/*
 * Load a snapshot in a worker and wait for it.  Returns how it went, with
 * *error (and *sqlerrcode) set unless it succeeded.  A cancel or timeout of
 * this backend terminates the worker and is raised as usual.
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
	BackgroundWorkerHandle *handle;
	BgwHandleStatus status;
	PcLoadStatus result;

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
	task->leader_pgprocno = MyProc->pgprocno;
	task->leader_pid = MyProcPid;
	task->status = PC_LOAD_NONE;

	memset(&worker, 0, sizeof(worker));
	worker.bgw_flags = BGWORKER_SHMEM_ACCESS |
		BGWORKER_BACKEND_DATABASE_CONNECTION;
	worker.bgw_start_time = BgWorkerStart_ConsistentState;
	worker.bgw_restart_time = BGW_NEVER_RESTART;
	snprintf(worker.bgw_library_name, BGW_MAXLEN, "projcache");
	snprintf(worker.bgw_function_name, BGW_MAXLEN, "pc_snapshot_load_main");
	snprintf(worker.bgw_name, BGW_MAXLEN, "projcache snapshot load");
	snprintf(worker.bgw_type, BGW_MAXLEN, "projcache snapshot load");
	worker.bgw_main_arg = UInt32GetDatum(dsm_segment_handle(seg));
	worker.bgw_notify_pid = MyProcPid;

	if (!RegisterDynamicBackgroundWorker(&worker, &handle))
	{
		dsm_detach(seg);
		*sqlerrcode = ERRCODE_CONFIGURATION_LIMIT_EXCEEDED;
		*error = pstrdup("no background worker slot is free for the snapshot load; raise max_worker_processes");
		return PC_LOAD_FAILED;
	}

	PG_TRY();
	{
		status = WaitForBackgroundWorkerShutdown(handle);
	}
	PG_CATCH();
	{
		/* Our cancel, timeout or termination: the load ends with us. */
		TerminateBackgroundWorker(handle);
		PG_RE_THROW();
	}
	PG_END_TRY();

	if (status == BGWH_POSTMASTER_DIED)
		ereport(FATAL,
				(errcode(ERRCODE_ADMIN_SHUTDOWN),
				 errmsg("postmaster exited during a projcache snapshot load")));

	result = task->status;
	*sqlerrcode = task->sqlerrcode;
	*error = NULL;
	if (result == PC_LOAD_NONE)
	{
		result = PC_LOAD_FAILED;
		*sqlerrcode = ERRCODE_INTERNAL_ERROR;
		*error = pstrdup("the snapshot load worker exited before reporting; see the server log");
	}
	else if (result != PC_LOAD_OK)
		*error = pstrdup(task->error);
	dsm_detach(seg);
	return result;
}
