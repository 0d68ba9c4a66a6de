/* projcache--1.3.1--1.4.sql */

-- complain if script is sourced in psql, rather than via ALTER EXTENSION
\echo Use "ALTER EXTENSION projcache UPDATE TO '1.4'" to load this file. \quit

-- Written as the 1.1.1 to 1.3.1 scripts are (see projcache--1.1--1.1.1.sql):
-- every operator, function, type and cast qualified.  There is no
-- projcache--1.4.sql: a new install of 1.4 runs projcache--1.3.1.sql, then
-- this.  It adds the test-only debug_check_map(); it changes and drops
-- nothing.

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
-- Tests only: needs projcache.debug_clock = on, and a superuser
------------------------------------------------------------------------

-- Checks the key map's invariants and raises data_corrupted at the first
-- one broken; returns what the map holds once they all hold.
CREATE FUNCTION projcache.debug_check_map(OUT partitions pg_catalog.int4,
	OUT entries pg_catalog.int8, OUT buckets pg_catalog.int8,
	OUT memory_used pg_catalog.int8)
RETURNS pg_catalog.record
AS 'MODULE_PATHNAME', 'projcache_debug_check_map'
LANGUAGE C STRICT VOLATILE PARALLEL UNSAFE;

REVOKE ALL ON FUNCTION projcache.debug_check_map() FROM PUBLIC;
