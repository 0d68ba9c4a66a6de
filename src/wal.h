/*-------------------------------------------------------------------------
 *
 * wal.h
 *	  Changes through WAL: projcache's resource manager (wal_records.c) and
 *	  a standby worker's wait for the commits behind them (keycache_replay.c).
 *
 * Copyright (c) 2026, projcache developers
 *
 *-------------------------------------------------------------------------
 */
#ifndef PROJCACHE_WAL_H
#define PROJCACHE_WAL_H

#include "projcache.h"

/*
 * Keys replayed on a standby, waiting until the commit of the transaction
 * that invalidated them is replayed too.  One shared, bounded list in the
 * main shared memory segment, under pc_wal_pending_lock():
 * - the startup process appends items (redo) and never waits for anything
 *	 but that lock;
 * - the worker marks the keys of new items stale (those before 'marked'
 *	 are done), then removes the items whose transaction has ended.
 * A record that does not fit is dropped whole, and so is one that cannot
 * be read (malformed, or of a type this version does not know): then
 * 'overflowed' makes the worker treat every cached key as waiting, until
 * each transaction whose record was dropped has ended (keycache_replay.c).
 * Those transactions are listed in dropped_xids; one that finds the list
 * full is folded into lost_xid, and then the wait lasts until every
 * transaction up to lost_xid has ended.
 */
typedef struct PcWalItem
{
	TransactionId xid;
	uint16		keylen;
	char		key[FLEXIBLE_ARRAY_MEMBER];
} PcWalItem;

/*
 * Transactions whose records were dropped and that the worker has not yet
 * seen end.  They are running transactions of the primary, so they are
 * usually few; the worker removes each as it ends.
 */
#define PC_WAL_MAX_DROPPED_XIDS	256

#define PC_WAL_ITEM_SIZE(keylen) \
	INTALIGN(offsetof(PcWalItem, key) + (keylen))

typedef struct PcWalPending
{
	Size		capacity;		/* bytes of data[] */
	Size		used;			/* bytes of items in data[] */
	Size		marked;			/* items before this offset were marked */
	bool		overflowed;		/* a record was dropped; set until each of its
								 * transactions ended */
	bool		overflow_marked;	/* the worker marked every cached key */
	int			ndropped;		/* entries of dropped_xids in use */
	TransactionId dropped_xids[PC_WAL_MAX_DROPPED_XIDS];
	TransactionId lost_xid;		/* newest dropped transaction that did not fit
								 * in dropped_xids, or invalid */
	char		data[FLEXIBLE_ARRAY_MEMBER];
} PcWalPending;

/* Settings (projcache.c) */
extern bool pc_wal_invalidations;
extern int	pc_wal_rmgr_id;
extern int	pc_wal_pending_kb;

/* wal_records.c */
extern void pc_wal_register_rmgr(void);
extern bool pc_wal_logging(void);
extern void pc_wal_log_invalidations(text **keys, int nkeys);
extern void pc_wal_log_refresh(Oid dbid, const char *name);
extern void pc_wal_shmem_request(void);
extern void pc_wal_shmem_startup(void);
extern PcWalPending *pc_wal_pending(void);
extern LWLock *pc_wal_pending_lock(void);

/* keycache_replay.c: the worker's side */
typedef void (*PcRefetchFn) (const char *key, uint32 len);
extern void pc_replay_init(void);
extern long pc_replay_poll(PcRefetchFn refetch);
extern bool pc_replay_key_waiting(const char *key, uint32 len);

#endif							/* PROJCACHE_WAL_H */
