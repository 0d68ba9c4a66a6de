/*-------------------------------------------------------------------------
 *
 * stream_conninfo.h
 *	  A change stream's connection string checked and shown
 *	  (stream_conninfo.c).
 *
 * Copyright (c) 2026, projcache developers
 *
 *-------------------------------------------------------------------------
 */
#ifndef PROJCACHE_STREAM_CONNINFO_H
#define PROJCACHE_STREAM_CONNINFO_H

extern void pc_stream_check_conninfo(const char *stream, const char *conninfo,
									 bool need_password);
extern char *pc_stream_conninfo_shown(const char *conninfo);

#endif							/* PROJCACHE_STREAM_CONNINFO_H */
