/*-------------------------------------------------------------------------
 *
 * compat.h
 *		What differs between the PostgreSQL majors projcache builds for
 *		(15, 16, 17 and 18), in one place.
 *
 * Every PG_VERSION_NUM test of the extension lives here (and in
 * compat_explain.h, for the one file that needs EXPLAIN's headers): the
 * files call the pc_* names below, or the newer majors' names that this
 * header supplies for the older ones, and never test the version
 * themselves.  The test
 * suite runs on 15 and 18; every file is compiled against 17's headers in
 * CI; 16 is written from its headers and release notes and is not tested.
 *
 * Included by projcache.h, so by every file of the extension except the
 * server-free worker core.
 *
 *-------------------------------------------------------------------------
 */
#ifndef PROJCACHE_COMPAT_H
#define PROJCACHE_COMPAT_H

#if PG_VERSION_NUM < 150000 || PG_VERSION_NUM >= 190000
#error "projcache supports PostgreSQL 15 to 18"
#endif

/* 16 moved the varlena macros (VARDATA_ANY, ...) out of postgres.h. */
#if PG_VERSION_NUM >= 160000
#include "varatt.h"
#endif

#include "utils/wait_event.h"

/*
 * 18 replaced the postfix pg_attribute_noreturn() with the C11-style
 * function specifier pg_noreturn, written before the declaration.  On the
 * older majors the GCC attribute is accepted in that place too.
 */
#ifndef pg_noreturn
#define pg_noreturn pg_attribute_noreturn()
#endif

/*
 * 16 made the GUC table a hash, of which get_guc_variables() returns a
 * sorted copy and its length.
 */
#if PG_VERSION_NUM >= 160000
#define pc_get_guc_variables(nvars) get_guc_variables(nvars)
#else
#define pc_get_guc_variables(nvars) \
	(*(nvars) = GetNumConfigOptions(), get_guc_variables())
#endif

/* 16 folded the per-catalog ACL checks into object_aclcheck(). */
#if PG_VERSION_NUM >= 160000
#define pc_type_aclcheck(type, role, mode) \
	object_aclcheck(TypeRelationId, (type), (role), (mode))
#define pc_proc_aclcheck(proc, role, mode) \
	object_aclcheck(ProcedureRelationId, (proc), (role), (mode))
#else
#define pc_type_aclcheck(type, role, mode) \
	pg_type_aclcheck((type), (role), (mode))
#define pc_proc_aclcheck(proc, role, mode) \
	pg_proc_aclcheck((proc), (role), (mode))
#endif

/*
 * 16 gave role grants a SET option: a member may be refused SET ROLE.  Before
 * 16 every member may SET ROLE to the roles it is a member of.
 */
#if PG_VERSION_NUM >= 160000
#define pc_member_can_set_role(member, role) member_can_set_role((member), (role))
#else
#define pc_member_can_set_role(member, role) is_member_of_role((member), (role))
#endif

/* 17 dropped PGPROC.pgprocno for an address computation. */
#if PG_VERSION_NUM < 170000
#define GetNumberFromPGProc(proc) ((proc)->pgprocno)
#endif

/* 16 added a soft-error context (NULL: errors are thrown, as before). */
#if PG_VERSION_NUM >= 160000
#define pc_string_to_qualified_name_list(s) stringToQualifiedNameList((s), NULL)
#else
#define pc_string_to_qualified_name_list(s) stringToQualifiedNameList(s)
#endif

/*
 * 16 moved the permissions a plan checks out of its range table into its
 * own list (RTEPermissionInfo), and the executor's check with them.
 */
#if PG_VERSION_NUM >= 160000
#define pc_exec_check_permissions(stmt, ereport) \
	ExecCheckPermissions((stmt)->rtable, (stmt)->permInfos, (ereport))
#define pc_query_check_permissions(query, ereport) \
	ExecCheckPermissions((query)->rtable, (query)->rteperminfos, (ereport))
#else
#define pc_exec_check_permissions(stmt, ereport) \
	ExecCheckRTPerms((stmt)->rtable, (ereport))
#define pc_query_check_permissions(query, ereport) \
	ExecCheckRTPerms((query)->rtable, (ereport))
#endif

/*
 * The role a foreign scan's permissions are checked as (InvalidOid: the
 * current user): 16 copies it into the ForeignScan node, as the range table
 * entry no longer has it.
 */
#if PG_VERSION_NUM >= 160000
#define pc_foreign_scan_user(plan, estate) ((plan)->checkAsUser)
#else
#define pc_foreign_scan_user(plan, estate) \
	(exec_rt_fetch((plan)->scan.scanrelid, (estate))->checkAsUser)
#endif

/*
 * A base relation's foreign scan path.  17 added the restriction clauses
 * the path enforces (none here: projcache's scans filter nothing beyond
 * what the executor rechecks), 18 the count of disabled nodes.
 */
#if PG_VERSION_NUM >= 180000
#define pc_create_foreignscan_path(root, rel, target, rows, startup, total, \
								   pathkeys, outer, outerpath, priv) \
	create_foreignscan_path((root), (rel), (target), (rows), 0, (startup), \
							(total), (pathkeys), (outer), (outerpath), NIL, \
							(priv))
#elif PG_VERSION_NUM >= 170000
#define pc_create_foreignscan_path(root, rel, target, rows, startup, total, \
								   pathkeys, outer, outerpath, priv) \
	create_foreignscan_path((root), (rel), (target), (rows), (startup), \
							(total), (pathkeys), (outer), (outerpath), NIL, \
							(priv))
#else
#define pc_create_foreignscan_path(root, rel, target, rows, startup, total, \
								   pathkeys, outer, outerpath, priv) \
	create_foreignscan_path((root), (rel), (target), (rows), (startup), \
							(total), (pathkeys), (outer), (outerpath), (priv))
#endif

/* 18 can leave room before a minimal tuple; projcache needs none. */
#if PG_VERSION_NUM >= 180000
#define pc_heap_form_minimal_tuple(desc, values, nulls) \
	heap_form_minimal_tuple((desc), (values), (nulls), 0)
#else
#define pc_heap_form_minimal_tuple(desc, values, nulls) \
	heap_form_minimal_tuple((desc), (values), (nulls))
#endif

/*
 * What a projcache process waits for, as pg_stat_activity shows it.  17
 * lets an extension name its wait events; before it, all of them show as
 * "Extension".
 */
typedef enum PcWaitEvent
{
	PC_WAIT_KEY,				/* a backend waits for a key's fetch */
	PC_WAIT_SNAPSHOT_LOAD,		/* a reader waits for a snapshot's load */
	PC_WAIT_WORKER,				/* the key cache worker between batches */
	PC_WAIT_LAUNCHER,			/* the launcher between its checks */
	PC_WAIT_MAP_CHECK,			/* the key map's self-check between walks */
	PC_WAIT_STREAM,				/* a stream's worker on its source */
	PC_WAIT_EVENTS				/* how many; not an event */
} PcWaitEvent;

/*
 * The wait event info to pass to WaitLatch() or ConditionVariableSleep().
 * On 17 and later each name is registered on first use in a process (a
 * shared hash lookup, cached here after it).
 */
static inline uint32
pc_wait_event(PcWaitEvent which)
{
#if PG_VERSION_NUM >= 170000
	static const char *const names[PC_WAIT_EVENTS] = {
		"projcache key",
		"projcache snapshot load",
		"projcache worker",
		"projcache launcher",
		"projcache map check",
		"projcache stream",
	};
	static uint32 ids[PC_WAIT_EVENTS];

	Assert(which >= 0 && which < PC_WAIT_EVENTS);
	if (ids[which] == 0)
		ids[which] = WaitEventExtensionNew(names[which]);
	return ids[which];
#else
	/* a snapshot load has always shown as its worker's shutdown wait */
	return which == PC_WAIT_SNAPSHOT_LOAD ?
		WAIT_EVENT_BGWORKER_SHUTDOWN : PG_WAIT_EXTENSION;
#endif
}

/*
 * libpq-be-fe-helpers.h (libpq in a backend, interruptible) came with 16,
 * and was backported to later minors of 15; stream_worker.c has a fallback
 * for a 15 without it.
 */
#if PG_VERSION_NUM >= 160000
#define PC_HAVE_LIBPQSRV 1
#elif defined(__has_include)
#if __has_include("libpq/libpq-be-fe-helpers.h")
#define PC_HAVE_LIBPQSRV 1
#endif
#endif

#endif							/* PROJCACHE_COMPAT_H */
