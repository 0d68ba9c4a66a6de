/*-------------------------------------------------------------------------
 *
 * compat_explain.h
 *		EXPLAIN's headers, as they are split up on each major (see compat.h).
 *
 * 18 moved ExplainState to commands/explain_state.h and the property
 * output functions (ExplainPropertyText, ...) to commands/explain_format.h;
 * before it both were in commands/explain.h.
 *
 *-------------------------------------------------------------------------
 */
#ifndef PROJCACHE_COMPAT_EXPLAIN_H
#define PROJCACHE_COMPAT_EXPLAIN_H

#include "commands/explain.h"
#if PG_VERSION_NUM >= 180000
#include "commands/explain_format.h"
#include "commands/explain_state.h"
#endif

#endif							/* PROJCACHE_COMPAT_EXPLAIN_H */
