/*-------------------------------------------------------------------------
 *
 * subxact.c
 *	  Running user code in an internal subtransaction, with its ERROR
 *	  returned as data.
 *
 * User code (the fetch function, a snapshot query bound at an update) must
 * never abort the caller's transaction nor end a worker: it runs in a
 * subtransaction, and an ERROR rolls that back and comes back to the
 * caller as an ErrorData, as PL/pgSQL's exception blocks and PL/Python's
 * SPI layer do.  The rollback also restores the user id, the security
 * context and the settings the body changed.
 *
 * Copyright (c) 2026, projcache developers
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/xact.h"
#include "utils/memutils.h"
#include "utils/resowner.h"

#include "projcache.h"

/*
 * Run body(arg) in an internal subtransaction.  Returns NULL if it
 * finished, and the subtransaction was committed; else its ERROR, copied
 * into the caller's memory context, with the subtransaction rolled back.
 */
ErrorData *
pc_run_in_subxact(void (*body) (void *arg), void *arg)
{
	MemoryContext callercxt = CurrentMemoryContext;
	ResourceOwner callerowner = CurrentResourceOwner;
	ErrorData  *volatile edata = NULL;

	BeginInternalSubTransaction(NULL);
	MemoryContextSwitchTo(callercxt);
	PG_TRY();
	{
		body(arg);
		ReleaseCurrentSubTransaction();
	}
	PG_CATCH();
	{
		MemoryContextSwitchTo(callercxt);
		edata = CopyErrorData();
		FlushErrorState();
		RollbackAndReleaseCurrentSubTransaction();
	}
	PG_END_TRY();
	MemoryContextSwitchTo(callercxt);
	CurrentResourceOwner = callerowner;
	return edata;
}
