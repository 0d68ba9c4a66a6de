/* projcache--1.0.1--1.1.sql */

-- complain if script is sourced in psql, rather than via ALTER EXTENSION
\echo Use "ALTER EXTENSION projcache UPDATE TO '1.1'" to load this file. \quit

------------------------------------------------------------------------
-- Eviction under memory pressure: stats() gains evictions by cause,
-- refused reads and the hit ratio; entries() gains visited.  Also,
-- entries() gains next_attempt_at (a key waiting out its retry backoff
-- shows fetch_state 'backoff'), and stats() fetch_delay_buckets, the delay
-- histogram as an array in bucket order.  New output
-- columns mean dropping and creating the functions (and their views).
-- The privileges granted on them since they were created are carried
-- over: saved here, and put back at the end of this script.
------------------------------------------------------------------------
CREATE TEMPORARY TABLE projcache_saved_acls (
	kind text,					-- function or view
	target text,				-- the object that replaces it
	acl aclitem[]
);
INSERT INTO projcache_saved_acls
	SELECT 'function', 'projcache.stats()', proacl FROM pg_catalog.pg_proc
	 WHERE oid = 'projcache.stats()'::pg_catalog.regprocedure
	UNION ALL
	SELECT 'function', 'projcache.entries()', proacl FROM pg_catalog.pg_proc
	 WHERE oid = 'projcache.entries()'::pg_catalog.regprocedure
	UNION ALL
	SELECT 'view', 'projcache.stats', relacl FROM pg_catalog.pg_class
	 WHERE oid = 'projcache.stats'::pg_catalog.regclass
	UNION ALL
	SELECT 'view', 'projcache.entries', relacl FROM pg_catalog.pg_class
	 WHERE oid = 'projcache.entries'::pg_catalog.regclass
	UNION ALL
	SELECT 'function', 'projcache.create_snapshot(text, text, interval, text)', proacl
	  FROM pg_catalog.pg_proc
	 WHERE oid = 'projcache.create_snapshot(text, text, interval)'::pg_catalog.regprocedure;

DROP VIEW projcache.entries;
DROP FUNCTION projcache.entries();
DROP VIEW projcache.stats;
DROP FUNCTION projcache.stats();

CREATE FUNCTION projcache.entries(
	OUT key text, OUT state text, OUT freshness text, OUT fetch_state text,
	OUT revision text, OUT value_bytes bigint, OUT fetched_at timestamptz,
	OUT age interval, OUT expires_in interval, OUT refresh_in interval,
	OUT attempts integer, OUT last_error text, OUT visited boolean,
	OUT next_attempt_at timestamptz)
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
	OUT stats_reset timestamptz,
	OUT evictions_expired bigint, OUT evictions_memory bigint,
	OUT evictions_requested bigint, OUT refused_reads bigint,
	OUT hit_ratio double precision, OUT fetch_delay_buckets jsonb)
RETURNS record
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
-- Snapshots as foreign tables (src/snapshot_fdw.c):
--   CREATE FOREIGN TABLE t (...) SERVER projcache OPTIONS (snapshot 'name');
--   IMPORT FOREIGN SCHEMA projcache FROM SERVER projcache INTO s;
-- Creating a foreign table takes USAGE on the server, which the DBA
-- grants; reading one takes the snapshot's grant, as snapshot() does.
------------------------------------------------------------------------
CREATE FUNCTION projcache.fdw_handler()
RETURNS fdw_handler
AS 'MODULE_PATHNAME', 'projcache_fdw_handler'
LANGUAGE C STRICT;

CREATE FUNCTION projcache.fdw_validator(options text[], catalog oid)
RETURNS void
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
REVOKE ALL ON FUNCTION projcache.fdw_validator(text[], oid) FROM PUBLIC;

------------------------------------------------------------------------
-- An optional key index: create_snapshot(name, query, ttl, key) names a
-- result column; each load indexes the rows by it, and foreign-table
-- scans probe the index for "key = value".  The function is replaced, not
-- overloaded, so that create_snapshot(name, query) stays unambiguous; the
-- privileges granted on it since it was created are carried over.
------------------------------------------------------------------------
ALTER TABLE projcache.snapshot_registry ADD COLUMN key_column text;

DROP FUNCTION projcache.create_snapshot(text, text, interval);

CREATE FUNCTION projcache.create_snapshot(name text, query text,
	ttl interval DEFAULT '60s', key text DEFAULT NULL)
RETURNS void
AS 'MODULE_PATHNAME', 'projcache_create_snapshot'
LANGUAGE C VOLATILE PARALLEL UNSAFE;

COMMENT ON FUNCTION projcache.create_snapshot(text, text, interval, text) IS
'Register a snapshot: a read-only query whose rows are cached for ttl, optionally indexed by the result column key; the caller owns it';

REVOKE ALL ON FUNCTION projcache.create_snapshot(text, text, interval, text) FROM PUBLIC;

------------------------------------------------------------------------
-- What was granted on the replaced objects since they were created, back
-- as it was: their ACLs, grantors included, and the dependencies on the
-- roles those name that GRANT would have recorded (DROP ROLE refuses a
-- role that still holds one, DROP OWNED revokes it): one on each grantee
-- and grantor but the owner, PUBLIC and the roles initdb made (which are
-- pinned: their OIDs are below FirstNormalObjectId, 16384).  Not granted
-- again, because grants run by an extension script would count as the
-- extension's own (pg_init_privs), and pg_dump could no longer tell the
-- DBA's from them.
------------------------------------------------------------------------
CREATE TEMPORARY TABLE projcache_restored AS
	SELECT CASE s.kind WHEN 'function' THEN 'pg_catalog.pg_proc'::pg_catalog.regclass
					   ELSE 'pg_catalog.pg_class'::pg_catalog.regclass END AS classid,
		   CASE s.kind WHEN 'function' THEN s.target::pg_catalog.regprocedure::pg_catalog.oid
					   ELSE s.target::pg_catalog.regclass::pg_catalog.oid END AS objid,
		   s.acl
	  FROM projcache_saved_acls s
	 WHERE s.acl IS NOT NULL;

UPDATE pg_catalog.pg_proc p SET proacl = r.acl
  FROM projcache_restored r
 WHERE r.classid = 'pg_catalog.pg_proc'::pg_catalog.regclass AND p.oid = r.objid;
UPDATE pg_catalog.pg_class c SET relacl = r.acl
  FROM projcache_restored r
 WHERE r.classid = 'pg_catalog.pg_class'::pg_catalog.regclass AND c.oid = r.objid;

INSERT INTO pg_catalog.pg_shdepend
	(dbid, classid, objid, objsubid, refclassid, refobjid, deptype)
SELECT DISTINCT d.oid, r.classid, r.objid, 0,
	   'pg_catalog.pg_authid'::pg_catalog.regclass, m.role, 'a'
  FROM projcache_restored r
 CROSS JOIN LATERAL (SELECT a.grantee FROM pg_catalog.aclexplode(r.acl) a
					 UNION
					 SELECT a.grantor FROM pg_catalog.aclexplode(r.acl) a) AS m(role)
  JOIN pg_catalog.pg_database d ON d.datname = pg_catalog.current_database()
 WHERE m.role >= 16384
   AND m.role <> CASE r.classid
					WHEN 'pg_catalog.pg_proc'::pg_catalog.regclass THEN
						(SELECT proowner FROM pg_catalog.pg_proc WHERE oid = r.objid)
					ELSE (SELECT relowner FROM pg_catalog.pg_class WHERE oid = r.objid)
				 END;

DROP TABLE projcache_restored;
DROP TABLE projcache_saved_acls;
