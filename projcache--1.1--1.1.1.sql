/* projcache--1.1--1.1.1.sql: the security release */

-- complain if script is sourced in psql, rather than via ALTER EXTENSION
\echo Use "ALTER EXTENSION projcache UPDATE TO '1.1.1'" to load this file. \quit

-- Written as PostgreSQL's "Security Considerations for Extension Scripts"
-- ask: every operator and function is qualified (OPERATOR(pg_catalog.=),
-- pg_catalog.fn()), and so is every type and cast; temporary tables are
-- named pg_temp.x; nothing relies on search_path, which holds the
-- extension's schema while this runs.
--
-- The same sections, in this order, are in projcache--1.0--1.1.1.sql and
-- projcache--1.0.1--1.1.1.sql (the direct updates, so that no update
-- replays projcache--1.0.1--1.1.sql), and their end state is in
-- projcache--1.1.1.sql: a change here goes into all four
-- (test/t/012_upgrade.pl compares each update with a fresh install).

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
-- The registry's id default, bound to pg_catalog.nextval(regclass).  The
-- 1.0 script wrote nextval() unqualified, and a schema that held a
-- better-matching nextval(text) when it ran bound the default to that
-- one.  Setting it again changes nothing when it was bound right.
------------------------------------------------------------------------
ALTER TABLE projcache.snapshot_registry
	ALTER COLUMN id SET DEFAULT
		pg_catalog.nextval('projcache.snapshot_registry_id_seq'::pg_catalog.regclass);

------------------------------------------------------------------------
-- Registrations whose backing view is gone.  Under 1.0.1 and 1.1, what
-- dropped a view (DROP TYPE ... CASCADE of a column's type, DROP OWNED BY
-- its owner) left its registration: no one could read it, nor create its
-- name again, and only a superuser could drop it.  From 1.1.1 a
-- registration goes with its view; those left go now.
------------------------------------------------------------------------
DELETE FROM projcache.snapshot_registry r
 WHERE r.view IS NOT NULL
   AND NOT EXISTS (SELECT FROM pg_catalog.pg_class c
                    WHERE c.oid OPERATOR(pg_catalog.=) r.view::pg_catalog.oid);
