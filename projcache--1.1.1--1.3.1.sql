/* projcache--1.1.1--1.3.1.sql */

-- complain if script is sourced in psql, rather than via ALTER EXTENSION
\echo Use "ALTER EXTENSION projcache UPDATE TO '1.3.1'" to load this file. \quit

-- Written as the 1.1.1 to 1.3.1 scripts are (see projcache--1.1--1.1.1.sql):
-- every operator, function, type and cast qualified, temporary tables
-- named pg_temp.x.  Its end state is projcache--1.3.1.sql
-- (test/t/012_upgrade.pl compares the two).
--
-- It does in one step what 1.1.1 -> 1.2 -> 1.2.1 -> 1.3 -> 1.3.1 does, but
-- drops nothing.  projcache--1.1.1--1.2.sql drops entries() and stats() and
-- their views to give them new columns, so a view or a function a user
-- made on one of them stops that update.  PostgreSQL takes the shortest
-- way, so a database at 1.1.1 (or at 1.0, 1.0.1 or 1.1, which go through
-- 1.1.1) takes this one to 1.3.1.
--
-- entries() and stats() end as a fresh 1.3.1 has them, with the columns
-- 1.2 added at their end.  No DDL changes the OUT parameters of a
-- function, so this writes them into pg_proc, copied from entries_1_2_1()
-- and stats_1_2_1(), which this script creates with 1.2's columns.  The
-- objects made on them stay valid: a query keeps the columns it was made
-- with and ignores those added after them, as it does for a composite
-- type that gains an attribute.

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
-- The functions behind the views, under names of the release that made
-- them (1.2.1 and 1.3.1; see projcache--1.2--1.2.1.sql).
------------------------------------------------------------------------
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

REVOKE ALL ON FUNCTION projcache.entries_1_2_1() FROM PUBLIC;
REVOKE ALL ON FUNCTION projcache.entries_1_3_1() FROM PUBLIC;
REVOKE ALL ON FUNCTION projcache.stats_1_2_1() FROM PUBLIC;
REVOKE ALL ON FUNCTION projcache.snapshots_1_2_1() FROM PUBLIC;

------------------------------------------------------------------------
-- entries() and stats() gain the columns 1.2 added (max_age and
-- stale_for; dropped_fetches to last_dump_keys), as a fresh 1.3.1 has
-- them.  They keep their OID, their ACL and the objects made on them.
------------------------------------------------------------------------
UPDATE pg_catalog.pg_proc p
   SET proallargtypes = n.proallargtypes,
	   proargmodes = n.proargmodes,
	   proargnames = n.proargnames
  FROM (VALUES ('projcache.entries()'::pg_catalog.regprocedure,
				'projcache.entries_1_2_1()'::pg_catalog.regprocedure),
			   ('projcache.stats()'::pg_catalog.regprocedure,
				'projcache.stats_1_2_1()'::pg_catalog.regprocedure))
	   AS f(old, new)
  JOIN pg_catalog.pg_proc n
	ON n.oid OPERATOR(pg_catalog.=) f.new::pg_catalog.oid
 WHERE p.oid OPERATOR(pg_catalog.=) f.old::pg_catalog.oid;

COMMENT ON FUNCTION projcache.entries() IS
'Kept for objects made before 1.2.1; projcache.entries reads entries_1_2_1()';
COMMENT ON FUNCTION projcache.stats() IS
'Kept for objects made before 1.2.1; projcache.stats reads stats_1_2_1()';
COMMENT ON FUNCTION projcache.snapshots() IS
'Kept for objects made before 1.2.1; projcache.snapshots reads snapshots_1_2_1()';
COMMENT ON FUNCTION projcache.entries_1_2_1() IS
'Kept for objects made before 1.3.1; projcache.entries reads entries_1_3_1()';

------------------------------------------------------------------------
-- Whoever could call the function behind a view can call its new names,
-- as the updates through 1.2.1 and 1.3.1 give them: the ACLs are copied,
-- grantors included, with the dependencies on the roles they name that
-- GRANT would have recorded (see projcache--1.0--1.1.1.sql for why not
-- by GRANT).
------------------------------------------------------------------------
CREATE TEMPORARY TABLE pg_temp.projcache_copied_acls AS
	SELECT n.objid, p.proacl AS acl, n.proowner
	  FROM (VALUES ('projcache.entries()'::pg_catalog.regprocedure,
					'projcache.entries_1_2_1()'::pg_catalog.regprocedure),
				   ('projcache.entries()'::pg_catalog.regprocedure,
					'projcache.entries_1_3_1()'::pg_catalog.regprocedure),
				   ('projcache.stats()'::pg_catalog.regprocedure,
					'projcache.stats_1_2_1()'::pg_catalog.regprocedure),
				   ('projcache.snapshots()'::pg_catalog.regprocedure,
					'projcache.snapshots_1_2_1()'::pg_catalog.regprocedure))
		   AS f(old, new)
	  JOIN pg_catalog.pg_proc p
		ON p.oid OPERATOR(pg_catalog.=) f.old::pg_catalog.oid
	 CROSS JOIN LATERAL (SELECT q.oid AS objid, q.proowner
						   FROM pg_catalog.pg_proc q
						  WHERE q.oid OPERATOR(pg_catalog.=)
								f.new::pg_catalog.oid) AS n
	 WHERE p.proacl IS NOT NULL;

UPDATE pg_catalog.pg_proc p SET proacl = c.acl
  FROM pg_temp.projcache_copied_acls c
 WHERE p.oid OPERATOR(pg_catalog.=) c.objid;

INSERT INTO pg_catalog.pg_shdepend
	(dbid, classid, objid, objsubid, refclassid, refobjid, deptype)
SELECT DISTINCT d.oid, 'pg_catalog.pg_proc'::pg_catalog.regclass, c.objid,
	   0::pg_catalog.int4, 'pg_catalog.pg_authid'::pg_catalog.regclass,
	   m.role, 'a'::pg_catalog."char"
  FROM pg_temp.projcache_copied_acls c
 CROSS JOIN LATERAL (SELECT a.grantee FROM pg_catalog.aclexplode(c.acl) a
					 UNION
					 SELECT a.grantor FROM pg_catalog.aclexplode(c.acl) a) AS m(role)
  JOIN pg_catalog.pg_database d
	ON d.datname OPERATOR(pg_catalog.=) pg_catalog.current_database()
 WHERE m.role OPERATOR(pg_catalog.>=) '16384'::pg_catalog.oid
   AND m.role OPERATOR(pg_catalog.<>) c.proowner;

DROP TABLE pg_temp.projcache_copied_acls;

------------------------------------------------------------------------
-- The views read the new names.  Their comments and ACLs stay, and so do
-- the objects that depend on them; each gains its new columns at its end.
------------------------------------------------------------------------
CREATE OR REPLACE VIEW projcache.entries AS
	SELECT * FROM projcache.entries_1_3_1();

CREATE OR REPLACE VIEW projcache.stats AS
	SELECT * FROM projcache.stats_1_2_1();

CREATE OR REPLACE VIEW projcache.snapshots AS
	SELECT * FROM projcache.snapshots_1_2_1();

------------------------------------------------------------------------
-- The registry's id default and the registrations whose view is gone, as
-- projcache--1.1.1--1.2.sql fixes them again (see there).
------------------------------------------------------------------------
ALTER TABLE projcache.snapshot_registry
	ALTER COLUMN id SET DEFAULT
		pg_catalog.nextval('projcache.snapshot_registry_id_seq'::pg_catalog.regclass);

DELETE FROM projcache.snapshot_registry r
 WHERE r.view IS NOT NULL
   AND NOT EXISTS (SELECT FROM pg_catalog.pg_class c
                    WHERE c.oid OPERATOR(pg_catalog.=) r.view::pg_catalog.oid);

------------------------------------------------------------------------
-- Named caches (1.3), bound to their fetch function's identity (1.3.1).
-- See projcache--1.3.1.sql for the registry's columns.
------------------------------------------------------------------------
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

-- caches_1_3() is here as an update through 1.3 leaves it: no object can
-- have been made on it yet.
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
