/* projcache--1.0.1--1.1.1.sql: the security release, straight from 1.0.1 */

-- complain if script is sourced in psql, rather than via ALTER EXTENSION
\echo Use "ALTER EXTENSION projcache UPDATE TO '1.1.1'" to load this file. \quit

-- ALTER EXTENSION UPDATE takes the shortest path, this one, so that no
-- update to 1.1.1 replays projcache--1.0.1--1.1.sql, whose unqualified
-- operators and temporary tables a hostile schema can capture.  This does
-- what projcache--1.0.1--1.1.sql
-- then projcache--1.1--1.1.1.sql do, written as PostgreSQL's "Security
-- Considerations for Extension Scripts" ask: every operator and function
-- is qualified (OPERATOR(pg_catalog.=), pg_catalog.fn()), and so is every
-- type and cast; temporary tables are named pg_temp.x; nothing relies on
-- search_path, which holds the extension's schema while this runs.
--
-- The sections under "1.1.1" are those of projcache--1.1--1.1.1.sql, in
-- its order: a change there goes here too (test/t/012_upgrade.pl compares
-- each update with a fresh install).

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
-- 1.1: eviction under memory pressure: stats() gains evictions by cause,
-- refused reads and the hit ratio; entries() gains visited.  Also,
-- entries() gains next_attempt_at (a key waiting out its retry backoff
-- shows fetch_state 'backoff'), and stats() fetch_delay_buckets, the delay
-- histogram as an array in bucket order.  New output columns mean
-- dropping and creating the functions (and their views).  The privileges
-- granted on them since they were created are carried over: saved here,
-- and put back at the end of this section.
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
		   'projcache.entries'::pg_catalog.regclass::pg_catalog.oid
	UNION ALL
	SELECT 'function'::pg_catalog.text,
		   'projcache.create_snapshot(pg_catalog.text, pg_catalog.text, pg_catalog.interval, pg_catalog.text)'::pg_catalog.text,
		   p.proacl
	  FROM pg_catalog.pg_proc p
	 WHERE p.oid OPERATOR(pg_catalog.=)
		   'projcache.create_snapshot(pg_catalog.text, pg_catalog.text, pg_catalog.interval)'::pg_catalog.regprocedure::pg_catalog.oid;

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
	OUT visited pg_catalog.bool, OUT next_attempt_at pg_catalog.timestamptz)
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
	OUT hit_ratio pg_catalog.float8, OUT fetch_delay_buckets pg_catalog.jsonb)
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
-- 1.1: snapshots as foreign tables (src/snapshot_fdw.c):
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
-- 1.1: an optional key index: create_snapshot(name, query, ttl, key)
-- names a result column; each load indexes the rows by it, and
-- foreign-table scans probe the index for "key = value".  The function is
-- replaced, not overloaded, so that create_snapshot(name, query) stays
-- unambiguous; the privileges granted on it since it was created are
-- carried over.
------------------------------------------------------------------------
ALTER TABLE projcache.snapshot_registry ADD COLUMN key_column pg_catalog.text;

DROP FUNCTION projcache.create_snapshot(pg_catalog.text, pg_catalog.text, pg_catalog.interval);

CREATE FUNCTION projcache.create_snapshot(name pg_catalog.text,
	query pg_catalog.text,
	ttl pg_catalog.interval DEFAULT '60s'::pg_catalog.interval,
	key pg_catalog.text DEFAULT NULL::pg_catalog.text)
RETURNS pg_catalog.void
AS 'MODULE_PATHNAME', 'projcache_create_snapshot'
LANGUAGE C VOLATILE PARALLEL UNSAFE;

COMMENT ON FUNCTION projcache.create_snapshot(pg_catalog.text, pg_catalog.text, pg_catalog.interval, pg_catalog.text) IS
'Register a snapshot: a read-only query whose rows are cached for ttl, optionally indexed by the result column key; the caller owns it';

REVOKE ALL ON FUNCTION projcache.create_snapshot(pg_catalog.text, pg_catalog.text, pg_catalog.interval, pg_catalog.text) FROM PUBLIC;

------------------------------------------------------------------------
-- 1.1: what was granted on the replaced objects since they were created,
-- back as it was: their ACLs, grantors included, and the dependencies on
-- the roles those name that GRANT would have recorded (DROP ROLE refuses
-- a role that still holds one, DROP OWNED revokes it): one on each
-- grantee and grantor but the owner, PUBLIC and the roles initdb made
-- (which are pinned: their OIDs are below FirstNormalObjectId, 16384).
-- Not granted again, because grants run by an extension script would
-- count as the extension's own (pg_init_privs), and pg_dump could no
-- longer tell the DBA's from them.
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
