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
	kind text,					-- as GRANT names it: FUNCTION or TABLE
	target text,				-- the object that replaces it
	owner oid,
	acl aclitem[]
);
INSERT INTO projcache_saved_acls
	SELECT 'FUNCTION', 'projcache.stats()', proowner, proacl FROM pg_catalog.pg_proc
	 WHERE oid = 'projcache.stats()'::pg_catalog.regprocedure
	UNION ALL
	SELECT 'FUNCTION', 'projcache.entries()', proowner, proacl FROM pg_catalog.pg_proc
	 WHERE oid = 'projcache.entries()'::pg_catalog.regprocedure
	UNION ALL
	SELECT 'TABLE', 'projcache.stats', relowner, relacl FROM pg_catalog.pg_class
	 WHERE oid = 'projcache.stats'::pg_catalog.regclass
	UNION ALL
	SELECT 'TABLE', 'projcache.entries', relowner, relacl FROM pg_catalog.pg_class
	 WHERE oid = 'projcache.entries'::pg_catalog.regclass
	UNION ALL
	SELECT 'FUNCTION', 'projcache.create_snapshot(text, text, interval, text)', proowner, proacl
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
-- as it was: granted again, by their owner, so that the grantees'
-- dependencies are recorded (DROP ROLE refuses a role that still holds
-- one, DROP OWNED revokes it).  Grants run by an extension script count
-- as the extension's own (pg_init_privs): those of the new objects are set
-- back to what this script granted, so that pg_dump still tells the DBA's
-- grants from the extension's.
------------------------------------------------------------------------
CREATE TEMPORARY TABLE projcache_saved_init_privs AS
	SELECT i.* FROM pg_catalog.pg_init_privs i
	  JOIN projcache_saved_acls s
	    ON (s.kind = 'FUNCTION' AND i.classoid = 'pg_catalog.pg_proc'::pg_catalog.regclass
	        AND i.objoid = s.target::pg_catalog.regprocedure)
	    OR (s.kind = 'TABLE' AND i.classoid = 'pg_catalog.pg_class'::pg_catalog.regclass
	        AND i.objoid = s.target::pg_catalog.regclass);

DO $$
DECLARE
	g record;
BEGIN
	FOR g IN
		SELECT s.kind, s.target, a.privilege_type, a.is_grantable,
			   CASE WHEN a.grantee = 0 THEN 'PUBLIC'
					ELSE pg_catalog.quote_ident(pg_catalog.pg_get_userbyid(a.grantee)) END AS grantee
		  FROM projcache_saved_acls s, pg_catalog.aclexplode(s.acl) a
		 WHERE a.grantee <> s.owner
	LOOP
		EXECUTE pg_catalog.format('GRANT %s ON %s %s TO %s%s', g.privilege_type,
								  g.kind, g.target, g.grantee,
								  CASE WHEN g.is_grantable THEN ' WITH GRANT OPTION' END);
	END LOOP;
END
$$;

DELETE FROM pg_catalog.pg_init_privs i
 USING projcache_saved_acls s
 WHERE (s.kind = 'FUNCTION' AND i.classoid = 'pg_catalog.pg_proc'::pg_catalog.regclass
        AND i.objoid = s.target::pg_catalog.regprocedure)
    OR (s.kind = 'TABLE' AND i.classoid = 'pg_catalog.pg_class'::pg_catalog.regclass
        AND i.objoid = s.target::pg_catalog.regclass);
INSERT INTO pg_catalog.pg_init_privs SELECT * FROM projcache_saved_init_privs;

DROP TABLE projcache_saved_init_privs;
DROP TABLE projcache_saved_acls;
