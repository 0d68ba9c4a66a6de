/* projcache--1.0.sql */

-- complain if script is sourced in psql, rather than via CREATE EXTENSION
\echo Use "CREATE EXTENSION projcache" to load this file. \quit

-- The caches live in shared memory reserved at server start.
CREATE FUNCTION projcache._check_preloaded() RETURNS void
AS 'MODULE_PATHNAME', 'projcache_check_preloaded' LANGUAGE C;
SELECT projcache._check_preloaded();
DROP FUNCTION projcache._check_preloaded();

------------------------------------------------------------------------
-- Key cache
------------------------------------------------------------------------

CREATE FUNCTION projcache.get(key text)
RETURNS jsonb
AS 'MODULE_PATHNAME', 'projcache_get'
LANGUAGE C STRICT VOLATILE PARALLEL SAFE;

COMMENT ON FUNCTION projcache.get(text) IS
'Cached config of an enabled key, else NULL; never blocks; requests a fetch when the key is unknown, stale or expired';

CREATE FUNCTION projcache.get(key text, wait interval)
RETURNS jsonb
AS 'MODULE_PATHNAME', 'projcache_get_wait'
LANGUAGE C STRICT VOLATILE PARALLEL SAFE;

COMMENT ON FUNCTION projcache.get(text, interval) IS
'Like get(key), but waits up to "wait" while the key is pending';

CREATE FUNCTION projcache.lookup(key text, wait interval DEFAULT '0',
	OUT state text, OUT freshness text, OUT revision text, OUT config jsonb,
	OUT fetched_at timestamptz, OUT age interval, OUT last_error text)
RETURNS SETOF record
AS 'MODULE_PATHNAME', 'projcache_lookup'
LANGUAGE C STRICT VOLATILE PARALLEL SAFE ROWS 1;

COMMENT ON FUNCTION projcache.lookup(text, interval) IS
'The whole picture of one key; same side effects as get()';

CREATE FUNCTION projcache.fetch(key text)
RETURNS void
AS 'MODULE_PATHNAME', 'projcache_fetch'
LANGUAGE C STRICT VOLATILE PARALLEL SAFE;

COMMENT ON FUNCTION projcache.fetch(text) IS
'Ask for a fetch of the key now, unless one is under way or its value is fresh';

-- Restricted to the leader: its refetch is requested when the
-- transaction commits, which a parallel worker cannot see.
CREATE FUNCTION projcache.invalidate(key text)
RETURNS boolean
AS 'MODULE_PATHNAME', 'projcache_invalidate'
LANGUAGE C STRICT VOLATILE PARALLEL RESTRICTED;

COMMENT ON FUNCTION projcache.invalidate(text) IS
'Make the key stale now and refetch it at once, serving the old value meanwhile; false if not cached';

CREATE FUNCTION projcache.evict(key text)
RETURNS boolean
AS 'MODULE_PATHNAME', 'projcache_evict'
LANGUAGE C STRICT VOLATILE PARALLEL SAFE;

COMMENT ON FUNCTION projcache.evict(text) IS
'Have the scheduler remove the key (after its running fetch, if any); false if not cached';

CREATE FUNCTION projcache.entries(
	OUT key text, OUT state text, OUT freshness text, OUT fetch_state text,
	OUT revision text, OUT value_bytes bigint, OUT fetched_at timestamptz,
	OUT age interval, OUT expires_in interval, OUT refresh_in interval,
	OUT attempts integer, OUT last_error text)
RETURNS SETOF record
AS 'MODULE_PATHNAME', 'projcache_entries'
LANGUAGE C STRICT VOLATILE PARALLEL SAFE;

CREATE VIEW projcache.entries AS
	SELECT * FROM projcache.entries();

COMMENT ON VIEW projcache.entries IS 'One row per cached key';

CREATE FUNCTION projcache.stats(
	OUT entries bigint, OUT memory_used bigint, OUT memory_limit bigint,
	OUT hits bigint, OUT misses bigint, OUT pending_reads bigint,
	OUT fetch_requests bigint, OUT fetch_calls bigint, OUT fetched_keys bigint,
	OUT not_modified bigint, OUT pending_results bigint,
	OUT fetch_errors bigint, OUT evictions bigint, OUT refreshes bigint,
	OUT request_overflows bigint, OUT fetch_delay_histogram jsonb,
	OUT worker_pid integer, OUT config_generation bigint,
	OUT stats_reset timestamptz)
RETURNS record
AS 'MODULE_PATHNAME', 'projcache_stats'
LANGUAGE C STRICT VOLATILE PARALLEL SAFE;

CREATE VIEW projcache.stats AS
	SELECT * FROM projcache.stats();

COMMENT ON VIEW projcache.stats IS 'Counters of the key cache since start or reset_stats()';

CREATE FUNCTION projcache.reset_stats()
RETURNS void
AS 'MODULE_PATHNAME', 'projcache_reset_stats'
LANGUAGE C STRICT VOLATILE PARALLEL SAFE;

------------------------------------------------------------------------
-- Tests only: needs projcache.debug_clock = on, and a superuser
------------------------------------------------------------------------

CREATE FUNCTION projcache.debug_advance_clock(step interval)
RETURNS void
AS 'MODULE_PATHNAME', 'projcache_debug_advance_clock'
LANGUAGE C STRICT VOLATILE PARALLEL UNSAFE;

------------------------------------------------------------------------
-- Secure by default: nothing is usable by PUBLIC.  See the README for
-- the GRANTs that give applications and operators access.
------------------------------------------------------------------------

REVOKE ALL ON FUNCTION projcache.get(text) FROM PUBLIC;
REVOKE ALL ON FUNCTION projcache.get(text, interval) FROM PUBLIC;
REVOKE ALL ON FUNCTION projcache.lookup(text, interval) FROM PUBLIC;
REVOKE ALL ON FUNCTION projcache.fetch(text) FROM PUBLIC;
REVOKE ALL ON FUNCTION projcache.invalidate(text) FROM PUBLIC;
REVOKE ALL ON FUNCTION projcache.evict(text) FROM PUBLIC;
REVOKE ALL ON FUNCTION projcache.entries() FROM PUBLIC;
REVOKE ALL ON FUNCTION projcache.stats() FROM PUBLIC;
REVOKE ALL ON FUNCTION projcache.reset_stats() FROM PUBLIC;
REVOKE ALL ON FUNCTION projcache.debug_advance_clock(interval) FROM PUBLIC;
REVOKE ALL ON projcache.entries FROM PUBLIC;
REVOKE ALL ON projcache.stats FROM PUBLIC;

------------------------------------------------------------------------
-- Snapshot cache
------------------------------------------------------------------------

-- Registered snapshots of this database.  Kept by pg_dump; read and
-- written only through the functions below.
CREATE SEQUENCE projcache.snapshot_registry_id_seq;

CREATE TABLE projcache.snapshot_registry (
	name text PRIMARY KEY,
	id bigint NOT NULL UNIQUE
		DEFAULT nextval('projcache.snapshot_registry_id_seq'),
	query text NOT NULL,
	ttl interval NOT NULL CHECK (ttl > '0'),
	owner regrole NOT NULL,
	column_names text[] NOT NULL,
	column_types regtype[] NOT NULL,
	readers regrole[] NOT NULL DEFAULT '{}',
	created_at timestamptz NOT NULL DEFAULT now()
);

SELECT pg_catalog.pg_extension_config_dump('projcache.snapshot_registry', '');
SELECT pg_catalog.pg_extension_config_dump('projcache.snapshot_registry_id_seq', '');

CREATE FUNCTION projcache.create_snapshot(name text, query text,
	ttl interval DEFAULT '60s')
RETURNS void
AS 'MODULE_PATHNAME', 'projcache_create_snapshot'
LANGUAGE C VOLATILE PARALLEL UNSAFE;

COMMENT ON FUNCTION projcache.create_snapshot(text, text, interval) IS
'Register a snapshot: a read-only query whose rows are cached for ttl; the caller owns it';

CREATE FUNCTION projcache.drop_snapshot(name text)
RETURNS void
AS 'MODULE_PATHNAME', 'projcache_drop_snapshot'
LANGUAGE C STRICT VOLATILE PARALLEL UNSAFE;

CREATE FUNCTION projcache.grant_snapshot(name text, reader regrole)
RETURNS void
AS 'MODULE_PATHNAME', 'projcache_grant_snapshot'
LANGUAGE C STRICT VOLATILE PARALLEL UNSAFE;

CREATE FUNCTION projcache.revoke_snapshot(name text, reader regrole)
RETURNS void
AS 'MODULE_PATHNAME', 'projcache_revoke_snapshot'
LANGUAGE C STRICT VOLATILE PARALLEL UNSAFE;

CREATE FUNCTION projcache.snapshot(name text)
RETURNS SETOF record
AS 'MODULE_PATHNAME', 'projcache_snapshot'
LANGUAGE C VOLATILE PARALLEL UNSAFE;

COMMENT ON FUNCTION projcache.snapshot(text) IS
'The rows of a snapshot, loaded or refreshed per its TTL; needs a column definition list';

CREATE FUNCTION projcache.snapshot(name text, rowtype anyelement)
RETURNS SETOF anyelement
AS 'MODULE_PATHNAME', 'projcache_snapshot_typed'
LANGUAGE C VOLATILE PARALLEL UNSAFE;

COMMENT ON FUNCTION projcache.snapshot(text, anyelement) IS
'The rows of a snapshot as the given row type, e.g. snapshot(''grants'', NULL::grants)';

CREATE FUNCTION projcache.refresh_snapshot(name text)
RETURNS boolean
AS 'MODULE_PATHNAME', 'projcache_refresh_snapshot'
LANGUAGE C STRICT VOLATILE PARALLEL UNSAFE;

CREATE FUNCTION projcache.snapshots(
	OUT name text, OUT owner regrole, OUT ttl interval, OUT rows bigint,
	OUT bytes bigint, OUT loaded_at timestamptz, OUT age interval,
	OUT last_attempt_at timestamptz, OUT refresh_errors bigint,
	OUT last_error text, OUT status text)
RETURNS SETOF record
AS 'MODULE_PATHNAME', 'projcache_snapshots'
LANGUAGE C STRICT VOLATILE PARALLEL UNSAFE;

CREATE VIEW projcache.snapshots AS
	SELECT * FROM projcache.snapshots();

COMMENT ON VIEW projcache.snapshots IS 'Registered snapshots of this database and their state';

REVOKE ALL ON projcache.snapshot_registry FROM PUBLIC;
REVOKE ALL ON SEQUENCE projcache.snapshot_registry_id_seq FROM PUBLIC;
REVOKE ALL ON FUNCTION projcache.create_snapshot(text, text, interval) FROM PUBLIC;
REVOKE ALL ON FUNCTION projcache.drop_snapshot(text) FROM PUBLIC;
REVOKE ALL ON FUNCTION projcache.grant_snapshot(text, regrole) FROM PUBLIC;
REVOKE ALL ON FUNCTION projcache.revoke_snapshot(text, regrole) FROM PUBLIC;
REVOKE ALL ON FUNCTION projcache.snapshot(text) FROM PUBLIC;
REVOKE ALL ON FUNCTION projcache.snapshot(text, anyelement) FROM PUBLIC;
REVOKE ALL ON FUNCTION projcache.refresh_snapshot(text) FROM PUBLIC;
REVOKE ALL ON FUNCTION projcache.snapshots() FROM PUBLIC;
REVOKE ALL ON projcache.snapshots FROM PUBLIC;
