/* projcache--1.3--1.3.1.sql */

-- complain if script is sourced in psql, rather than via ALTER EXTENSION
\echo Use "ALTER EXTENSION projcache UPDATE TO '1.3.1'" to load this file. \quit

-- Written as the 1.1.1 to 1.3 scripts are (see projcache--1.1--1.1.1.sql):
-- every operator, function, type and cast qualified, temporary tables
-- named pg_temp.x.  Its end state is projcache--1.3.1.sql.  It binds each
-- named cache to its fetch function's identity, gives projcache.entries
-- its cache column and projcache.caches its last_error column, and drops
-- the grants to pg_database_owner; it drops no object.

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
-- Named caches: bound to their fetch function's identity (1.3.1)
------------------------------------------------------------------------

-- A cache runs the function it was registered with, not whatever the
-- signature text names later: fetch_function_oid is that function, and
-- fetch_function_owner its owner's name.  OIDs change across a dump and
-- pg_upgrade; there, the worker binds the cache again to the function of
-- the same signature only if its owner has that name.  A cache whose
-- function cannot be bound so is put aside until its owner alters it.
-- Here each cache is bound to what its signature names now, if the
-- cache's owner or a superuser owns that function: a function another
-- role put under that name (after the registered one was renamed, say)
-- is not taken for it, and such a cache is put aside until its owner
-- alters it.
ALTER TABLE projcache.cache_registry
	ADD COLUMN fetch_function_oid pg_catalog.oid,
	ADD COLUMN fetch_function_owner pg_catalog.name;

UPDATE projcache.cache_registry r
   SET fetch_function_oid = p.oid,
	   fetch_function_owner = a.rolname
  FROM pg_catalog.pg_proc p
  JOIN pg_catalog.pg_authid a ON a.oid OPERATOR(pg_catalog.=) p.proowner
 WHERE p.oid OPERATOR(pg_catalog.=)
	   pg_catalog.to_regprocedure(r.fetch_function)::pg_catalog.oid
   AND (p.proowner OPERATOR(pg_catalog.=) r.owner::pg_catalog.oid
		OR a.rolsuper);

-- Membership in pg_database_owner depends on the database, and the
-- registry is the whole server's: 1.3.1 refuses such a grant.
UPDATE projcache.cache_registry
   SET readers = pg_catalog.array_remove(readers,
			'pg_database_owner'::pg_catalog.regrole)
 WHERE 'pg_database_owner'::pg_catalog.regrole OPERATOR(pg_catalog.=)
	   ANY (readers);

------------------------------------------------------------------------
-- The views: entries gains the cache column, caches its last_error and
-- the registry as the caller's snapshot sees it (1.3.1)
------------------------------------------------------------------------

-- Behind each view a function of the release that made it, as from 1.2.1
-- on; the older ones stay for objects a user made on them.
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

COMMENT ON FUNCTION projcache.entries_1_2_1() IS
'Kept for objects made before 1.3.1; projcache.entries reads entries_1_3_1()';

REVOKE ALL ON FUNCTION projcache.entries_1_3_1() FROM PUBLIC;

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

COMMENT ON FUNCTION projcache.caches_1_3() IS
'Kept for objects made before 1.3.1; projcache.caches reads caches_1_3_1()';

REVOKE ALL ON FUNCTION projcache.caches_1_3_1() FROM PUBLIC;

------------------------------------------------------------------------
-- Whoever could call the function behind a view can call its new name,
-- as in projcache--1.2--1.2.1.sql: the ACLs are copied, grantors
-- included, with the dependencies on the roles they name.
------------------------------------------------------------------------
CREATE TEMPORARY TABLE pg_temp.projcache_copied_acls AS
	SELECT n.objid, p.proacl AS acl, n.proowner
	  FROM (VALUES ('projcache.entries_1_2_1()'::pg_catalog.regprocedure,
					'projcache.entries_1_3_1()'::pg_catalog.regprocedure),
				   ('projcache.caches_1_3()'::pg_catalog.regprocedure,
					'projcache.caches_1_3_1()'::pg_catalog.regprocedure))
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
-- the objects that depend on them; each gains its new column at its end.
------------------------------------------------------------------------
CREATE OR REPLACE VIEW projcache.entries AS
	SELECT * FROM projcache.entries_1_3_1();

CREATE OR REPLACE VIEW projcache.caches AS
	SELECT * FROM projcache.caches_1_3_1();
