/* projcache--1.2.1--1.3.sql */

-- complain if script is sourced in psql, rather than via ALTER EXTENSION
\echo Use "ALTER EXTENSION projcache UPDATE TO '1.3'" to load this file. \quit

-- Written as the 1.1.1 to 1.2.1 scripts are (see projcache--1.1--1.1.1.sql):
-- every operator, function, type and cast qualified, temporary tables
-- named pg_temp.x.  Its end state is projcache--1.3.sql.  It adds the named
-- caches' registry, its functions and the projcache.caches view; it
-- changes and drops nothing.

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

------------------------------------------------------------------------
-- Named caches (1.3)
------------------------------------------------------------------------

-- The registered named caches.  Only the table of the database
-- projcache.database names is the registry: the key cache's worker reads
-- it there and gives every database's readers its copy in shared memory.
-- Kept by pg_dump; read and written only through the functions below.
-- fetch_function is the function's signature, schema-qualified, as text:
-- function OIDs change across pg_upgrade and a dump, names do not (a
-- regprocedure column would also stop pg_upgrade).  A NULL setting
-- follows the server's (projcache.expiry, ...); max_memory is in bytes.
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
	created_at pg_catalog.timestamptz NOT NULL DEFAULT pg_catalog.now()
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

CREATE VIEW projcache.caches AS
	SELECT * FROM projcache.caches_1_3();

COMMENT ON VIEW projcache.caches IS
'One row per named cache the current role may read: its registration (NULL settings follow the server''s) and counters';

REVOKE ALL ON FUNCTION projcache.caches_1_3() FROM PUBLIC;
REVOKE ALL ON projcache.caches FROM PUBLIC;
