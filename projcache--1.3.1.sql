/* projcache--1.3.1.sql */

-- complain if script is sourced in psql, rather than via CREATE EXTENSION
\echo Use "CREATE EXTENSION projcache" to load this file. \quit

-- The whole of 1.3.1, so that a new install replays none of the older
-- scripts.  It makes what projcache--1.0.sql and the updates to 1.3.1
-- make: the same objects, privileges and comments (test/t/012_upgrade.pl
-- compares the two).  Written as PostgreSQL's "Security Considerations
-- for Extension Scripts" ask: every operator and function is qualified
-- (OPERATOR(pg_catalog.=), pg_catalog.fn()), and so is every type and
-- cast; nothing relies on search_path, which holds the extension's schema
-- while this runs.  What each section of projcache--1.1--1.1.1.sql does
-- after its schema check, projcache--1.1.1--1.2.sql and
-- projcache--1.2--1.2.1.sql, projcache--1.2.1--1.3.sql and
-- projcache--1.3--1.3.1.sql, is made here
-- in its end state: a change there goes here too.
--
-- From 1.2.1 on, the set-returning functions behind the views have names
-- of the release that made them (entries_1_2_1(), ...; see
-- projcache--1.2--1.2.1.sql).  The unversioned ones of 1.2 are here too,
-- as an update keeps them: an install and an update end alike.

------------------------------------------------------------------------
-- The schema must be a superuser's.  The control file names it (schema =
-- projcache): CREATE EXTENSION creates it, as the superuser running it,
-- unless it exists already, and then takes it as it is.  Its owner may
-- have planted objects in it (operators, functions, types, tables named
-- like the ones a script uses) and may drop and replace objects in it
-- later, all to be run by the superuser running this script.  This runs
-- before anything else and names nothing outside pg_catalog, so what the
-- schema holds cannot capture it.
------------------------------------------------------------------------
DO $guard$
DECLARE
	nsp_owner	pg_catalog.name;
	owner_super pg_catalog.bool;
BEGIN
	SELECT a.rolname, a.rolsuper INTO nsp_owner, owner_super
	  FROM pg_catalog.pg_namespace n
	  JOIN pg_catalog.pg_authid a ON a.oid OPERATOR(pg_catalog.=) n.nspowner
	 WHERE n.nspname OPERATOR(pg_catalog.=) 'projcache'::pg_catalog.name;
	IF NOT FOUND THEN
		RAISE EXCEPTION 'schema "projcache" does not exist'
			USING ERRCODE = 'invalid_schema_name';
	END IF;
	IF NOT owner_super THEN
		RAISE EXCEPTION 'schema "projcache" is not owned by a superuser'
			USING ERRCODE = 'insufficient_privilege',
				  DETAIL = pg_catalog.format('Its owner, role "%s", could have planted objects in it that capture the names this script uses, or replace the extension''s objects, to run as the superuser running it.', nsp_owner),
				  HINT = 'Find out what the schema holds and why that role made it.  Before CREATE EXTENSION, drop it: CREATE EXTENSION creates schema projcache itself.  Otherwise, once it is known to be safe, make a superuser its owner (ALTER SCHEMA projcache OWNER TO ...).';
	END IF;
END
$guard$;

-- The caches live in shared memory reserved at server start.
CREATE FUNCTION projcache._check_preloaded() RETURNS pg_catalog.void
AS 'MODULE_PATHNAME', 'projcache_check_preloaded' LANGUAGE C;
SELECT projcache._check_preloaded();
DROP FUNCTION projcache._check_preloaded();

------------------------------------------------------------------------
-- Key cache
------------------------------------------------------------------------

CREATE FUNCTION projcache.get(key pg_catalog.text)
RETURNS pg_catalog.jsonb
AS 'MODULE_PATHNAME', 'projcache_get'
LANGUAGE C STRICT VOLATILE PARALLEL SAFE;

COMMENT ON FUNCTION projcache.get(pg_catalog.text) IS
'Cached config of an enabled key, else NULL; never blocks; requests a fetch when the key is unknown, stale or expired';

CREATE FUNCTION projcache.get(key pg_catalog.text, wait pg_catalog.interval)
RETURNS pg_catalog.jsonb
AS 'MODULE_PATHNAME', 'projcache_get_wait'
LANGUAGE C STRICT VOLATILE PARALLEL SAFE;

COMMENT ON FUNCTION projcache.get(pg_catalog.text, pg_catalog.interval) IS
'Like get(key), but waits up to "wait" while the key is pending';

CREATE FUNCTION projcache.lookup(key pg_catalog.text,
	wait pg_catalog.interval DEFAULT '0'::pg_catalog.interval,
	OUT state pg_catalog.text, OUT freshness pg_catalog.text,
	OUT revision pg_catalog.text, OUT config pg_catalog.jsonb,
	OUT fetched_at pg_catalog.timestamptz, OUT age pg_catalog.interval,
	OUT last_error pg_catalog.text)
RETURNS SETOF pg_catalog.record
AS 'MODULE_PATHNAME', 'projcache_lookup'
LANGUAGE C STRICT VOLATILE PARALLEL SAFE ROWS 1;

COMMENT ON FUNCTION projcache.lookup(pg_catalog.text, pg_catalog.interval) IS
'The whole picture of one key; same side effects as get()';

CREATE FUNCTION projcache.fetch(key pg_catalog.text)
RETURNS pg_catalog.void
AS 'MODULE_PATHNAME', 'projcache_fetch'
LANGUAGE C STRICT VOLATILE PARALLEL SAFE;

COMMENT ON FUNCTION projcache.fetch(pg_catalog.text) IS
'Ask for a fetch of the key now, unless one is under way or its value is fresh';

-- Restricted to the leader: its refetch is requested when the
-- transaction commits, which a parallel worker cannot see.
CREATE FUNCTION projcache.invalidate(key pg_catalog.text)
RETURNS pg_catalog.bool
AS 'MODULE_PATHNAME', 'projcache_invalidate'
LANGUAGE C STRICT VOLATILE PARALLEL RESTRICTED;

COMMENT ON FUNCTION projcache.invalidate(pg_catalog.text) IS
'Make the key stale now and refetch it at once, serving the old value meanwhile; false if not cached';

CREATE FUNCTION projcache.evict(key pg_catalog.text)
RETURNS pg_catalog.bool
AS 'MODULE_PATHNAME', 'projcache_evict'
LANGUAGE C STRICT VOLATILE PARALLEL SAFE;

COMMENT ON FUNCTION projcache.evict(pg_catalog.text) IS
'Have the scheduler remove the key (after its running fetch, if any); false if not cached';

CREATE FUNCTION projcache.entries(
	OUT key pg_catalog.text, OUT state pg_catalog.text,
	OUT freshness pg_catalog.text, OUT fetch_state pg_catalog.text,
	OUT revision pg_catalog.text, OUT value_bytes pg_catalog.int8,
	OUT fetched_at pg_catalog.timestamptz, OUT age pg_catalog.interval,
	OUT expires_in pg_catalog.interval, OUT refresh_in pg_catalog.interval,
	OUT attempts pg_catalog.int4, OUT last_error pg_catalog.text,
	OUT visited pg_catalog.bool, OUT next_attempt_at pg_catalog.timestamptz,
	OUT max_age pg_catalog.interval, OUT stale_for pg_catalog.interval)
RETURNS SETOF pg_catalog.record
AS 'MODULE_PATHNAME', 'projcache_entries'
LANGUAGE C STRICT VOLATILE PARALLEL SAFE;

CREATE FUNCTION projcache.entries_1_2_1(
	OUT key pg_catalog.text, OUT state pg_catalog.text,
	OUT freshness pg_catalog.text, OUT fetch_state pg_catalog.text,
	OUT revision pg_catalog.text, OUT value_bytes pg_catalog.int8,
	OUT fetched_at pg_catalog.timestamptz, OUT age pg_catalog.interval,
	OUT expires_in pg_catalog.interval, OUT refresh_in pg_catalog.interval,
	OUT attempts pg_catalog.int4, OUT last_error pg_catalog.text,
	OUT visited pg_catalog.bool, OUT next_attempt_at pg_catalog.timestamptz,
	OUT max_age pg_catalog.interval, OUT stale_for pg_catalog.interval)
RETURNS SETOF pg_catalog.record
AS 'MODULE_PATHNAME', 'projcache_entries'
LANGUAGE C STRICT VOLATILE PARALLEL SAFE;

CREATE FUNCTION projcache.entries_1_3_1(
	OUT key pg_catalog.text, OUT state pg_catalog.text,
	OUT freshness pg_catalog.text, OUT fetch_state pg_catalog.text,
	OUT revision pg_catalog.text, OUT value_bytes pg_catalog.int8,
	OUT fetched_at pg_catalog.timestamptz, OUT age pg_catalog.interval,
	OUT expires_in pg_catalog.interval, OUT refresh_in pg_catalog.interval,
	OUT attempts pg_catalog.int4, OUT last_error pg_catalog.text,
	OUT visited pg_catalog.bool, OUT next_attempt_at pg_catalog.timestamptz,
	OUT max_age pg_catalog.interval, OUT stale_for pg_catalog.interval,
	OUT cache pg_catalog.text)
RETURNS SETOF pg_catalog.record
AS 'MODULE_PATHNAME', 'projcache_entries'
LANGUAGE C STRICT VOLATILE PARALLEL SAFE;

CREATE VIEW projcache.entries AS
	SELECT * FROM projcache.entries_1_3_1();

COMMENT ON VIEW projcache.entries IS 'One row per cached key';

COMMENT ON FUNCTION projcache.entries_1_2_1() IS
'Kept for objects made before 1.3.1; projcache.entries reads entries_1_3_1()';

COMMENT ON FUNCTION projcache.entries() IS
'Kept for objects made before 1.2.1; projcache.entries reads entries_1_2_1()';

CREATE FUNCTION projcache.stats(
	OUT entries pg_catalog.int8, OUT memory_used pg_catalog.int8,
	OUT memory_limit pg_catalog.int8, OUT hits pg_catalog.int8,
	OUT misses pg_catalog.int8, OUT pending_reads pg_catalog.int8,
	OUT fetch_requests pg_catalog.int8, OUT fetch_calls pg_catalog.int8,
	OUT fetched_keys pg_catalog.int8, OUT not_modified pg_catalog.int8,
	OUT pending_results pg_catalog.int8, OUT fetch_errors pg_catalog.int8,
	OUT evictions pg_catalog.int8, OUT refreshes pg_catalog.int8,
	OUT request_overflows pg_catalog.int8,
	OUT fetch_delay_histogram pg_catalog.jsonb,
	OUT worker_pid pg_catalog.int4, OUT config_generation pg_catalog.int8,
	OUT stats_reset pg_catalog.timestamptz,
	OUT evictions_expired pg_catalog.int8, OUT evictions_memory pg_catalog.int8,
	OUT evictions_requested pg_catalog.int8, OUT refused_reads pg_catalog.int8,
	OUT hit_ratio pg_catalog.float8, OUT fetch_delay_buckets pg_catalog.jsonb,
	OUT dropped_fetches pg_catalog.int8, OUT loaded_keys pg_catalog.int8,
	OUT loaded_snapshots pg_catalog.int8,
	OUT loaded_dump_age pg_catalog.interval,
	OUT last_dump_at pg_catalog.timestamptz, OUT last_dump_keys pg_catalog.int8)
RETURNS pg_catalog.record
AS 'MODULE_PATHNAME', 'projcache_stats'
LANGUAGE C STRICT VOLATILE PARALLEL SAFE;

CREATE FUNCTION projcache.stats_1_2_1(
	OUT entries pg_catalog.int8, OUT memory_used pg_catalog.int8,
	OUT memory_limit pg_catalog.int8, OUT hits pg_catalog.int8,
	OUT misses pg_catalog.int8, OUT pending_reads pg_catalog.int8,
	OUT fetch_requests pg_catalog.int8, OUT fetch_calls pg_catalog.int8,
	OUT fetched_keys pg_catalog.int8, OUT not_modified pg_catalog.int8,
	OUT pending_results pg_catalog.int8, OUT fetch_errors pg_catalog.int8,
	OUT evictions pg_catalog.int8, OUT refreshes pg_catalog.int8,
	OUT request_overflows pg_catalog.int8,
	OUT fetch_delay_histogram pg_catalog.jsonb,
	OUT worker_pid pg_catalog.int4, OUT config_generation pg_catalog.int8,
	OUT stats_reset pg_catalog.timestamptz,
	OUT evictions_expired pg_catalog.int8, OUT evictions_memory pg_catalog.int8,
	OUT evictions_requested pg_catalog.int8, OUT refused_reads pg_catalog.int8,
	OUT hit_ratio pg_catalog.float8, OUT fetch_delay_buckets pg_catalog.jsonb,
	OUT dropped_fetches pg_catalog.int8, OUT loaded_keys pg_catalog.int8,
	OUT loaded_snapshots pg_catalog.int8,
	OUT loaded_dump_age pg_catalog.interval,
	OUT last_dump_at pg_catalog.timestamptz, OUT last_dump_keys pg_catalog.int8)
RETURNS pg_catalog.record
AS 'MODULE_PATHNAME', 'projcache_stats'
LANGUAGE C STRICT VOLATILE PARALLEL SAFE;

CREATE VIEW projcache.stats AS
	SELECT * FROM projcache.stats_1_2_1();

COMMENT ON VIEW projcache.stats IS 'Counters of the key cache since start or reset_stats()';

COMMENT ON FUNCTION projcache.stats() IS
'Kept for objects made before 1.2.1; projcache.stats reads stats_1_2_1()';

CREATE FUNCTION projcache.reset_stats()
RETURNS pg_catalog.void
AS 'MODULE_PATHNAME', 'projcache_reset_stats'
LANGUAGE C STRICT VOLATILE PARALLEL SAFE;

------------------------------------------------------------------------
-- Tests only: needs projcache.debug_clock = on, and a superuser
------------------------------------------------------------------------

CREATE FUNCTION projcache.debug_advance_clock(step pg_catalog.interval)
RETURNS pg_catalog.void
AS 'MODULE_PATHNAME', 'projcache_debug_advance_clock'
LANGUAGE C STRICT VOLATILE PARALLEL UNSAFE;

------------------------------------------------------------------------
-- Secure by default: nothing is usable by PUBLIC.  See the README for
-- the GRANTs that give applications and operators access.
------------------------------------------------------------------------

REVOKE ALL ON FUNCTION projcache.get(pg_catalog.text) FROM PUBLIC;
REVOKE ALL ON FUNCTION projcache.get(pg_catalog.text, pg_catalog.interval) FROM PUBLIC;
REVOKE ALL ON FUNCTION projcache.lookup(pg_catalog.text, pg_catalog.interval) FROM PUBLIC;
REVOKE ALL ON FUNCTION projcache.fetch(pg_catalog.text) FROM PUBLIC;
REVOKE ALL ON FUNCTION projcache.invalidate(pg_catalog.text) FROM PUBLIC;
REVOKE ALL ON FUNCTION projcache.evict(pg_catalog.text) FROM PUBLIC;
REVOKE ALL ON FUNCTION projcache.entries() FROM PUBLIC;
REVOKE ALL ON FUNCTION projcache.stats() FROM PUBLIC;
REVOKE ALL ON FUNCTION projcache.entries_1_2_1() FROM PUBLIC;
REVOKE ALL ON FUNCTION projcache.entries_1_3_1() FROM PUBLIC;
REVOKE ALL ON FUNCTION projcache.stats_1_2_1() FROM PUBLIC;
REVOKE ALL ON FUNCTION projcache.reset_stats() FROM PUBLIC;
REVOKE ALL ON FUNCTION projcache.debug_advance_clock(pg_catalog.interval) FROM PUBLIC;
REVOKE ALL ON projcache.entries FROM PUBLIC;
REVOKE ALL ON projcache.stats FROM PUBLIC;

------------------------------------------------------------------------
-- Snapshot cache
------------------------------------------------------------------------

-- Registered snapshots of this database.  Kept by pg_dump; read and
-- written only through the functions below.  Each snapshot is backed by
-- a view owned by its owner (view), so that the names in its query stay
-- bound as they were at creation, the objects it reads cannot be dropped
-- under it, and its owner cannot be dropped without dealing with it.
-- bind_error says why a registration made under 1.0 could not be bound
-- when projcache was updated to 1.0.1 (its reads fail with that until it
-- is made again).  key_column names the result column a load indexes the
-- rows by (create_snapshot()'s key).
CREATE SEQUENCE projcache.snapshot_registry_id_seq;

CREATE TABLE projcache.snapshot_registry (
	name pg_catalog.text PRIMARY KEY,
	id pg_catalog.int8 NOT NULL UNIQUE
		DEFAULT pg_catalog.nextval('projcache.snapshot_registry_id_seq'::pg_catalog.regclass),
	query pg_catalog.text NOT NULL,
	ttl pg_catalog.interval NOT NULL
		CHECK (ttl OPERATOR(pg_catalog.>) '0'::pg_catalog.interval),
	owner pg_catalog.regrole NOT NULL,
	column_names pg_catalog.text[] NOT NULL,
	column_types pg_catalog.regtype[] NOT NULL,
	readers pg_catalog.regrole[] NOT NULL DEFAULT '{}'::pg_catalog.regrole[],
	created_at pg_catalog.timestamptz NOT NULL DEFAULT pg_catalog.now(),
	view pg_catalog.regclass UNIQUE,
	bind_error pg_catalog.text,
	key_column pg_catalog.text
);

SELECT pg_catalog.pg_extension_config_dump('projcache.snapshot_registry'::pg_catalog.regclass, ''::pg_catalog.text);
SELECT pg_catalog.pg_extension_config_dump('projcache.snapshot_registry_id_seq'::pg_catalog.regclass, ''::pg_catalog.text);

CREATE FUNCTION projcache.create_snapshot(name pg_catalog.text,
	query pg_catalog.text,
	ttl pg_catalog.interval DEFAULT '60s'::pg_catalog.interval,
	key pg_catalog.text DEFAULT NULL::pg_catalog.text)
RETURNS pg_catalog.void
AS 'MODULE_PATHNAME', 'projcache_create_snapshot'
LANGUAGE C VOLATILE PARALLEL UNSAFE;

COMMENT ON FUNCTION projcache.create_snapshot(pg_catalog.text, pg_catalog.text, pg_catalog.interval, pg_catalog.text) IS
'Register a snapshot: a read-only query whose rows are cached for ttl, optionally indexed by the result column key; the caller owns it';

CREATE FUNCTION projcache.drop_snapshot(name pg_catalog.text)
RETURNS pg_catalog.void
AS 'MODULE_PATHNAME', 'projcache_drop_snapshot'
LANGUAGE C STRICT VOLATILE PARALLEL UNSAFE;

CREATE FUNCTION projcache.grant_snapshot(name pg_catalog.text,
	reader pg_catalog.regrole)
RETURNS pg_catalog.void
AS 'MODULE_PATHNAME', 'projcache_grant_snapshot'
LANGUAGE C STRICT VOLATILE PARALLEL UNSAFE;

CREATE FUNCTION projcache.revoke_snapshot(name pg_catalog.text,
	reader pg_catalog.regrole)
RETURNS pg_catalog.void
AS 'MODULE_PATHNAME', 'projcache_revoke_snapshot'
LANGUAGE C STRICT VOLATILE PARALLEL UNSAFE;

CREATE FUNCTION projcache.snapshot(name pg_catalog.text)
RETURNS SETOF pg_catalog.record
AS 'MODULE_PATHNAME', 'projcache_snapshot'
LANGUAGE C VOLATILE PARALLEL UNSAFE;

COMMENT ON FUNCTION projcache.snapshot(pg_catalog.text) IS
'The rows of a snapshot, loaded or refreshed per its TTL; needs a column definition list';

CREATE FUNCTION projcache.snapshot(name pg_catalog.text,
	rowtype pg_catalog.anyelement)
RETURNS SETOF pg_catalog.anyelement
AS 'MODULE_PATHNAME', 'projcache_snapshot_typed'
LANGUAGE C VOLATILE PARALLEL UNSAFE;

COMMENT ON FUNCTION projcache.snapshot(pg_catalog.text, pg_catalog.anyelement) IS
'The rows of a snapshot as the given row type, e.g. snapshot(''grants'', NULL::grants)';

CREATE FUNCTION projcache.refresh_snapshot(name pg_catalog.text)
RETURNS pg_catalog.bool
AS 'MODULE_PATHNAME', 'projcache_refresh_snapshot'
LANGUAGE C STRICT VOLATILE PARALLEL UNSAFE;

CREATE FUNCTION projcache.snapshots(
	OUT name pg_catalog.text, OUT owner pg_catalog.regrole,
	OUT ttl pg_catalog.interval, OUT rows pg_catalog.int8,
	OUT bytes pg_catalog.int8, OUT loaded_at pg_catalog.timestamptz,
	OUT age pg_catalog.interval, OUT last_attempt_at pg_catalog.timestamptz,
	OUT refresh_errors pg_catalog.int8, OUT last_error pg_catalog.text,
	OUT status pg_catalog.text)
RETURNS SETOF pg_catalog.record
AS 'MODULE_PATHNAME', 'projcache_snapshots'
LANGUAGE C STRICT VOLATILE PARALLEL UNSAFE;

CREATE FUNCTION projcache.snapshots_1_2_1(
	OUT name pg_catalog.text, OUT owner pg_catalog.regrole,
	OUT ttl pg_catalog.interval, OUT rows pg_catalog.int8,
	OUT bytes pg_catalog.int8, OUT loaded_at pg_catalog.timestamptz,
	OUT age pg_catalog.interval, OUT last_attempt_at pg_catalog.timestamptz,
	OUT refresh_errors pg_catalog.int8, OUT last_error pg_catalog.text,
	OUT status pg_catalog.text)
RETURNS SETOF pg_catalog.record
AS 'MODULE_PATHNAME', 'projcache_snapshots'
LANGUAGE C STRICT VOLATILE PARALLEL UNSAFE;

CREATE VIEW projcache.snapshots AS
	SELECT * FROM projcache.snapshots_1_2_1();

COMMENT ON VIEW projcache.snapshots IS 'Registered snapshots of this database and their state';

COMMENT ON FUNCTION projcache.snapshots() IS
'Kept for objects made before 1.2.1; projcache.snapshots reads snapshots_1_2_1()';

REVOKE ALL ON projcache.snapshot_registry FROM PUBLIC;
REVOKE ALL ON SEQUENCE projcache.snapshot_registry_id_seq FROM PUBLIC;
REVOKE ALL ON FUNCTION projcache.create_snapshot(pg_catalog.text, pg_catalog.text, pg_catalog.interval, pg_catalog.text) FROM PUBLIC;
REVOKE ALL ON FUNCTION projcache.drop_snapshot(pg_catalog.text) FROM PUBLIC;
REVOKE ALL ON FUNCTION projcache.grant_snapshot(pg_catalog.text, pg_catalog.regrole) FROM PUBLIC;
REVOKE ALL ON FUNCTION projcache.revoke_snapshot(pg_catalog.text, pg_catalog.regrole) FROM PUBLIC;
REVOKE ALL ON FUNCTION projcache.snapshot(pg_catalog.text) FROM PUBLIC;
REVOKE ALL ON FUNCTION projcache.snapshot(pg_catalog.text, pg_catalog.anyelement) FROM PUBLIC;
REVOKE ALL ON FUNCTION projcache.refresh_snapshot(pg_catalog.text) FROM PUBLIC;
REVOKE ALL ON FUNCTION projcache.snapshots() FROM PUBLIC;
REVOKE ALL ON FUNCTION projcache.snapshots_1_2_1() FROM PUBLIC;
REVOKE ALL ON projcache.snapshots FROM PUBLIC;

------------------------------------------------------------------------
-- Snapshots as foreign tables (src/snapshot_fdw.c):
--   CREATE FOREIGN TABLE t (...) SERVER projcache OPTIONS (snapshot 'name');
--   IMPORT FOREIGN SCHEMA projcache FROM SERVER projcache INTO s;
-- Creating a foreign table takes USAGE on the server, which the DBA
-- grants; reading one takes the snapshot's grant, as snapshot() does.
------------------------------------------------------------------------
CREATE FUNCTION projcache.fdw_handler()
RETURNS pg_catalog.fdw_handler
AS 'MODULE_PATHNAME', 'projcache_fdw_handler'
LANGUAGE C STRICT;

CREATE FUNCTION projcache.fdw_validator(options pg_catalog.text[],
	catalog pg_catalog.oid)
RETURNS pg_catalog.void
AS 'MODULE_PATHNAME', 'projcache_fdw_validator'
LANGUAGE C STRICT;

CREATE FOREIGN DATA WRAPPER projcache
	HANDLER projcache.fdw_handler
	VALIDATOR projcache.fdw_validator;

COMMENT ON FOREIGN DATA WRAPPER projcache IS
'Snapshots read as foreign tables (OPTIONS (snapshot ''name''))';

CREATE SERVER projcache FOREIGN DATA WRAPPER projcache;

COMMENT ON SERVER projcache IS
'The snapshots of this database; IMPORT FOREIGN SCHEMA projcache imports them';

REVOKE ALL ON FUNCTION projcache.fdw_handler() FROM PUBLIC;
REVOKE ALL ON FUNCTION projcache.fdw_validator(pg_catalog.text[], pg_catalog.oid) FROM PUBLIC;


------------------------------------------------------------------------
-- Named caches (1.3)
------------------------------------------------------------------------

-- The registered named caches.  Only the table of the database
-- projcache.database names is the registry: the key cache's worker reads
-- it there and gives every database's readers its copy in shared memory.
-- Kept by pg_dump; read and written only through the functions below.
-- fetch_function is the function's signature, schema-qualified, as text;
-- fetch_function_oid is the very function registered, and
-- fetch_function_owner its owner's name (1.3.1).  A cache runs that
-- function only: OIDs change across pg_upgrade and a dump, and there the
-- worker binds the cache again to the function of that signature only if
-- its owner has that name (a regprocedure column would stop pg_upgrade).
-- A NULL setting follows the server's (projcache.expiry, ...);
-- max_memory is in bytes.
CREATE TABLE projcache.cache_registry (
	name pg_catalog.text PRIMARY KEY,
	owner pg_catalog.regrole NOT NULL,
	fetch_function pg_catalog.text NOT NULL,
	fetch_role pg_catalog.regrole,
	expiry pg_catalog.interval,
	grace_period pg_catalog.interval,
	refresh_interval pg_catalog.interval,
	max_retry_backoff pg_catalog.interval,
	batch_size pg_catalog.int4,
	fetch_timeout pg_catalog.interval,
	max_memory pg_catalog.int8,
	readers pg_catalog.regrole[] NOT NULL DEFAULT '{}'::pg_catalog.regrole[],
	created_at pg_catalog.timestamptz NOT NULL DEFAULT pg_catalog.now(),
	fetch_function_oid pg_catalog.oid,
	fetch_function_owner pg_catalog.name
);

SELECT pg_catalog.pg_extension_config_dump('projcache.cache_registry'::pg_catalog.regclass, ''::pg_catalog.text);

CREATE FUNCTION projcache.create_cache(name pg_catalog.text,
	fetch_function pg_catalog.regprocedure,
	expiry pg_catalog.interval DEFAULT NULL::pg_catalog.interval,
	grace_period pg_catalog.interval DEFAULT NULL::pg_catalog.interval,
	refresh_interval pg_catalog.interval DEFAULT NULL::pg_catalog.interval,
	max_retry_backoff pg_catalog.interval DEFAULT NULL::pg_catalog.interval,
	batch_size pg_catalog.int4 DEFAULT NULL::pg_catalog.int4,
	fetch_timeout pg_catalog.interval DEFAULT NULL::pg_catalog.interval,
	max_memory pg_catalog.int8 DEFAULT NULL::pg_catalog.int8,
	fetch_role pg_catalog.regrole DEFAULT NULL::pg_catalog.regrole)
RETURNS pg_catalog.void
AS 'MODULE_PATHNAME', 'projcache_create_cache'
LANGUAGE C VOLATILE PARALLEL UNSAFE;

COMMENT ON FUNCTION projcache.create_cache(pg_catalog.text, pg_catalog.regprocedure, pg_catalog.interval, pg_catalog.interval, pg_catalog.interval, pg_catalog.interval, pg_catalog.int4, pg_catalog.interval, pg_catalog.int8, pg_catalog.regrole) IS
'Register a named cache: keys name:rest are fetched by fetch_function, with these settings (NULL: the server''s); the caller owns it';

CREATE FUNCTION projcache.alter_cache(name pg_catalog.text,
	fetch_function pg_catalog.regprocedure DEFAULT NULL::pg_catalog.regprocedure,
	expiry pg_catalog.interval DEFAULT NULL::pg_catalog.interval,
	grace_period pg_catalog.interval DEFAULT NULL::pg_catalog.interval,
	refresh_interval pg_catalog.interval DEFAULT NULL::pg_catalog.interval,
	max_retry_backoff pg_catalog.interval DEFAULT NULL::pg_catalog.interval,
	batch_size pg_catalog.int4 DEFAULT NULL::pg_catalog.int4,
	fetch_timeout pg_catalog.interval DEFAULT NULL::pg_catalog.interval,
	max_memory pg_catalog.int8 DEFAULT NULL::pg_catalog.int8,
	fetch_role pg_catalog.regrole DEFAULT NULL::pg_catalog.regrole)
RETURNS pg_catalog.void
AS 'MODULE_PATHNAME', 'projcache_alter_cache'
LANGUAGE C VOLATILE PARALLEL UNSAFE;

COMMENT ON FUNCTION projcache.alter_cache(pg_catalog.text, pg_catalog.regprocedure, pg_catalog.interval, pg_catalog.interval, pg_catalog.interval, pg_catalog.interval, pg_catalog.int4, pg_catalog.interval, pg_catalog.int8, pg_catalog.regrole) IS
'Change the settings given of a named cache; the others stay';

CREATE FUNCTION projcache.drop_cache(name pg_catalog.text)
RETURNS pg_catalog.void
AS 'MODULE_PATHNAME', 'projcache_drop_cache'
LANGUAGE C STRICT VOLATILE PARALLEL UNSAFE;

CREATE FUNCTION projcache.grant_cache(name pg_catalog.text,
	reader pg_catalog.regrole)
RETURNS pg_catalog.void
AS 'MODULE_PATHNAME', 'projcache_grant_cache'
LANGUAGE C STRICT VOLATILE PARALLEL UNSAFE;

CREATE FUNCTION projcache.revoke_cache(name pg_catalog.text,
	reader pg_catalog.regrole)
RETURNS pg_catalog.void
AS 'MODULE_PATHNAME', 'projcache_revoke_cache'
LANGUAGE C STRICT VOLATILE PARALLEL UNSAFE;

REVOKE ALL ON projcache.cache_registry FROM PUBLIC;
REVOKE ALL ON FUNCTION projcache.create_cache(pg_catalog.text, pg_catalog.regprocedure, pg_catalog.interval, pg_catalog.interval, pg_catalog.interval, pg_catalog.interval, pg_catalog.int4, pg_catalog.interval, pg_catalog.int8, pg_catalog.regrole) FROM PUBLIC;
REVOKE ALL ON FUNCTION projcache.alter_cache(pg_catalog.text, pg_catalog.regprocedure, pg_catalog.interval, pg_catalog.interval, pg_catalog.interval, pg_catalog.interval, pg_catalog.int4, pg_catalog.interval, pg_catalog.int8, pg_catalog.regrole) FROM PUBLIC;
REVOKE ALL ON FUNCTION projcache.drop_cache(pg_catalog.text) FROM PUBLIC;
REVOKE ALL ON FUNCTION projcache.grant_cache(pg_catalog.text, pg_catalog.regrole) FROM PUBLIC;
REVOKE ALL ON FUNCTION projcache.revoke_cache(pg_catalog.text, pg_catalog.regrole) FROM PUBLIC;

CREATE FUNCTION projcache.caches_1_3(
	OUT name pg_catalog.text, OUT owner pg_catalog.regrole,
	OUT fetch_function pg_catalog.text, OUT fetch_role pg_catalog.regrole,
	OUT expiry pg_catalog.interval, OUT grace_period pg_catalog.interval,
	OUT refresh_interval pg_catalog.interval,
	OUT max_retry_backoff pg_catalog.interval,
	OUT batch_size pg_catalog.int4, OUT fetch_timeout pg_catalog.interval,
	OUT max_memory pg_catalog.int8, OUT memory_used pg_catalog.int8,
	OUT entries pg_catalog.int8, OUT hits pg_catalog.int8,
	OUT misses pg_catalog.int8, OUT fetch_calls pg_catalog.int8,
	OUT fetch_errors pg_catalog.int8, OUT evictions pg_catalog.int8)
RETURNS SETOF pg_catalog.record
AS 'MODULE_PATHNAME', 'projcache_caches'
LANGUAGE C STRICT VOLATILE PARALLEL SAFE;

CREATE FUNCTION projcache.caches_1_3_1(
	OUT name pg_catalog.text, OUT owner pg_catalog.regrole,
	OUT fetch_function pg_catalog.text, OUT fetch_role pg_catalog.regrole,
	OUT expiry pg_catalog.interval, OUT grace_period pg_catalog.interval,
	OUT refresh_interval pg_catalog.interval,
	OUT max_retry_backoff pg_catalog.interval,
	OUT batch_size pg_catalog.int4, OUT fetch_timeout pg_catalog.interval,
	OUT max_memory pg_catalog.int8, OUT memory_used pg_catalog.int8,
	OUT entries pg_catalog.int8, OUT hits pg_catalog.int8,
	OUT misses pg_catalog.int8, OUT fetch_calls pg_catalog.int8,
	OUT fetch_errors pg_catalog.int8, OUT evictions pg_catalog.int8,
	OUT state pg_catalog.text, OUT last_error pg_catalog.text)
RETURNS SETOF pg_catalog.record
AS 'MODULE_PATHNAME', 'projcache_caches'
LANGUAGE C STRICT VOLATILE PARALLEL RESTRICTED;

CREATE VIEW projcache.caches AS
	SELECT * FROM projcache.caches_1_3_1();

COMMENT ON FUNCTION projcache.caches_1_3() IS
'Kept for objects made before 1.3.1; projcache.caches reads caches_1_3_1()';

COMMENT ON VIEW projcache.caches IS
'One row per named cache the current role may read: its registration (NULL settings follow the server''s) and counters';

REVOKE ALL ON FUNCTION projcache.caches_1_3() FROM PUBLIC;
REVOKE ALL ON FUNCTION projcache.caches_1_3_1() FROM PUBLIC;
REVOKE ALL ON projcache.caches FROM PUBLIC;
