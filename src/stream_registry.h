/*-------------------------------------------------------------------------
 *
 * stream_registry.h
 *	  The change streams' registry (stream_registry.c), as other parts
 *	  ask it.
 *
 * Copyright (c) 2026, projcache developers
 *
 *-------------------------------------------------------------------------
 */
#ifndef PROJCACHE_STREAM_REGISTRY_H
#define PROJCACHE_STREAM_REGISTRY_H

extern char *pc_stream_of_owner(Oid role);

#endif							/* PROJCACHE_STREAM_REGISTRY_H */
