/* projcache--1.1.1--1.2.sql */

-- complain if script is sourced in psql, rather than via ALTER EXTENSION
\echo Use "ALTER EXTENSION projcache UPDATE TO '1.2'" to load this file. \quit

-- Written as the 1.1.1 scripts are (see projcache--1.1--1.1.1.sql): every
-- operator, function, type and cast qualified, temporary tables named
-- pg_temp.x.  Its end state is projcache--1.2.sql (test/t/012_upgrade.pl
-- compares the two).

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
-- stats() gains fair fetching's dropped fetches and what the dumps did
-- (loaded_keys, loaded_snapshots, loaded_dump_age, last_dump_at,
-- last_dump_keys); entries() gains each key's own fresh and stale
-- periods (max_age, stale_for).  New output columns mean dropping and
-- creating the functions and their views; what was granted on them since
-- they were created is carried over, as 1.1 did.
------------------------------------------------------------------------
CREATE TEMPORARY TABLE pg_temp.projcache_saved_acls (
	kind pg_catalog.text,		-- function or view
	target pg_catalog.text,		-- the object that replaces it
	acl pg_catalog.aclitem[]
);
INSERT INTO pg_temp.projcache_saved_acls (kind, target, acl)
	SELECT 'function'::pg_catalog.text, 'projcache.stats()'::pg_catalog.text,
		   p.proacl
	  FROM pg_catalog.pg_proc p
	 WHERE p.oid OPERATOR(pg_catalog.=)
		   'projcache.stats()'::pg_catalog.regprocedure::pg_catalog.oid
	UNION ALL
	SELECT 'function'::pg_catalog.text, 'projcache.entries()'::pg_catalog.text,
		   p.proacl
	  FROM pg_catalog.pg_proc p
	 WHERE p.oid OPERATOR(pg_catalog.=)
		   'projcache.entries()'::pg_catalog.regprocedure::pg_catalog.oid
	UNION ALL
	SELECT 'view'::pg_catalog.text, 'projcache.stats'::pg_catalog.text,
		   c.relacl
	  FROM pg_catalog.pg_class c
	 WHERE c.oid OPERATOR(pg_catalog.=)
		   'projcache.stats'::pg_catalog.regclass::pg_catalog.oid
	UNION ALL
	SELECT 'view'::pg_catalog.text, 'projcache.entries'::pg_catalog.text,
		   c.relacl
	  FROM pg_catalog.pg_class c
	 WHERE c.oid OPERATOR(pg_catalog.=)
		   'projcache.entries'::pg_catalog.regclass::pg_catalog.oid;

DROP VIEW projcache.entries;
DROP FUNCTION projcache.entries();
DROP VIEW projcache.stats;
DROP FUNCTION projcache.stats();

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

CREATE VIEW projcache.entries AS
	SELECT * FROM projcache.entries();

COMMENT ON VIEW projcache.entries IS 'One row per cached key';

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

CREATE VIEW projcache.stats AS
	SELECT * FROM projcache.stats();

COMMENT ON VIEW projcache.stats IS 'Counters of the key cache since start or reset_stats()';

-- The extension's own privileges: nothing for PUBLIC.
REVOKE ALL ON FUNCTION projcache.entries() FROM PUBLIC;
REVOKE ALL ON FUNCTION projcache.stats() FROM PUBLIC;
REVOKE ALL ON projcache.entries FROM PUBLIC;
REVOKE ALL ON projcache.stats FROM PUBLIC;

------------------------------------------------------------------------
-- What was granted on the replaced objects since they were created, back
-- as it was (see projcache--1.0--1.1.1.sql for why it is not granted
-- again).
------------------------------------------------------------------------
CREATE TEMPORARY TABLE pg_temp.projcache_restored AS
	SELECT CASE WHEN s.kind OPERATOR(pg_catalog.=) 'function'::pg_catalog.text
				THEN 'pg_catalog.pg_proc'::pg_catalog.regclass
				ELSE 'pg_catalog.pg_class'::pg_catalog.regclass END AS classid,
		   CASE WHEN s.kind OPERATOR(pg_catalog.=) 'function'::pg_catalog.text
				THEN s.target::pg_catalog.regprocedure::pg_catalog.oid
				ELSE s.target::pg_catalog.regclass::pg_catalog.oid END AS objid,
		   s.acl
	  FROM pg_temp.projcache_saved_acls s
	 WHERE s.acl IS NOT NULL;

UPDATE pg_catalog.pg_proc p SET proacl = r.acl
  FROM pg_temp.projcache_restored r
 WHERE r.classid OPERATOR(pg_catalog.=) 'pg_catalog.pg_proc'::pg_catalog.regclass
   AND p.oid OPERATOR(pg_catalog.=) r.objid;
UPDATE pg_catalog.pg_class c SET relacl = r.acl
  FROM pg_temp.projcache_restored r
 WHERE r.classid OPERATOR(pg_catalog.=) 'pg_catalog.pg_class'::pg_catalog.regclass
   AND c.oid OPERATOR(pg_catalog.=) r.objid;

INSERT INTO pg_catalog.pg_shdepend
	(dbid, classid, objid, objsubid, refclassid, refobjid, deptype)
SELECT DISTINCT d.oid, r.classid, r.objid, 0::pg_catalog.int4,
	   'pg_catalog.pg_authid'::pg_catalog.regclass, m.role,
	   'a'::pg_catalog."char"
  FROM pg_temp.projcache_restored r
 CROSS JOIN LATERAL (SELECT a.grantee FROM pg_catalog.aclexplode(r.acl) a
					 UNION
					 SELECT a.grantor FROM pg_catalog.aclexplode(r.acl) a) AS m(role)
  JOIN pg_catalog.pg_database d
	ON d.datname OPERATOR(pg_catalog.=) pg_catalog.current_database()
 WHERE m.role OPERATOR(pg_catalog.>=) '16384'::pg_catalog.oid
   AND m.role OPERATOR(pg_catalog.<>)
	   CASE WHEN r.classid OPERATOR(pg_catalog.=) 'pg_catalog.pg_proc'::pg_catalog.regclass
			THEN (SELECT p.proowner FROM pg_catalog.pg_proc p
				   WHERE p.oid OPERATOR(pg_catalog.=) r.objid)
			ELSE (SELECT c.relowner FROM pg_catalog.pg_class c
				   WHERE c.oid OPERATOR(pg_catalog.=) r.objid)
	   END;

DROP TABLE pg_temp.projcache_restored;
DROP TABLE pg_temp.projcache_saved_acls;

------------------------------------------------------------------------
-- 1.1.1
------------------------------------------------------------------------

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
