/* projcache--1.3.1--1.4.sql */

-- complain if script is sourced in psql, rather than via ALTER EXTENSION
\echo Use "ALTER EXTENSION projcache UPDATE TO '1.4'" to load this file. \quit

-- Written as the 1.1.1 to 1.3.1 scripts are (see projcache--1.1--1.1.1.sql):
-- every operator, function, type and cast qualified.  There is no
-- projcache--1.4.sql: a new install of 1.4 runs projcache--1.3.1.sql, then
-- this.  It adds the test-only debug_check_map() and the change streams'
-- registry, its functions and views; of what exists, it only adds a
-- unique constraint on cache_registry (name, created_at), the identity a
-- stream's mapping refers to a named cache by.  It drops nothing.

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

------------------------------------------------------------------------
-- Change streams (1.4): the registry (src/stream_registry.c)
------------------------------------------------------------------------

-- The registered streams.  As for the named caches, only the tables of
-- the database projcache.database are the registry.  Kept by pg_dump;
-- read and written only through the functions below.  owner is the
-- role's OID (a regrole: pg_dump writes its name and a restore binds the
-- name again; pg_upgrade keeps role OIDs), as cache_registry's is.
-- conninfo is the connection string as given, password included: PUBLIC
-- may not read this table, and projcache.streams shows it without its
-- password.  publication is the publication's name on the source, as its
-- catalog has it; slot_name NULL: a temporary slot per connection.
CREATE SEQUENCE projcache.stream_registry_id_seq;

CREATE TABLE projcache.stream_registry (
	id pg_catalog.int8 PRIMARY KEY
		DEFAULT pg_catalog.nextval('projcache.stream_registry_id_seq'::pg_catalog.regclass),
	name pg_catalog.text NOT NULL UNIQUE,
	owner pg_catalog.regrole NOT NULL,
	conninfo pg_catalog.text NOT NULL,
	publication pg_catalog.text NOT NULL,
	slot_name pg_catalog.text,
	created_at pg_catalog.timestamptz NOT NULL DEFAULT pg_catalog.clock_timestamp()
);

-- A stream's mapping refers to a named cache by its name and created_at:
-- a cache dropped and made again under its name is another cache.
ALTER TABLE projcache.cache_registry
	ADD CONSTRAINT cache_registry_name_created_at_key UNIQUE (name, created_at);

-- The mappings of the streams' tables: to keys of a named cache
-- (cache_name, cache_created_at), of the default cache (both NULL,
-- snapshot_id NULL) or to a snapshot of this database (snapshot_id, the
-- snapshot_registry's id).  source_schema and source_table_name are the
-- source table's schema and name, and key_column the column's name, as
-- the source's catalog has them: two names, not a text quoted by a rule
-- a session's settings change (quote_all_identifiers).  Each mapping goes with its stream, its
-- cache or its snapshot (ON DELETE CASCADE).  id is its primary key, so
-- that the table has a replica identity: a FOR ALL TABLES publication of
-- projcache.database would refuse its deletes without one.
CREATE SEQUENCE projcache.stream_mapping_registry_id_seq;

CREATE TABLE projcache.stream_mapping_registry (
	id pg_catalog.int8 PRIMARY KEY
		DEFAULT pg_catalog.nextval('projcache.stream_mapping_registry_id_seq'::pg_catalog.regclass),
	stream_id pg_catalog.int8 NOT NULL
		REFERENCES projcache.stream_registry (id) ON DELETE CASCADE,
	source_schema pg_catalog.name NOT NULL,
	source_table_name pg_catalog.name NOT NULL,
	key_column pg_catalog.text,
	cache_name pg_catalog.text,
	cache_created_at pg_catalog.timestamptz,
	key_prefix pg_catalog.text,
	snapshot_id pg_catalog.int8
		REFERENCES projcache.snapshot_registry (id) ON DELETE CASCADE,
	created_at pg_catalog.timestamptz NOT NULL DEFAULT pg_catalog.clock_timestamp(),
	FOREIGN KEY (cache_name, cache_created_at)
		REFERENCES projcache.cache_registry (name, created_at) ON DELETE CASCADE,
	CHECK ((snapshot_id IS NULL AND key_column IS NOT NULL
			AND key_prefix IS NOT NULL
			AND (cache_name IS NULL) OPERATOR(pg_catalog.=) (cache_created_at IS NULL))
		OR (snapshot_id IS NOT NULL AND key_column IS NULL
			AND key_prefix IS NULL AND cache_name IS NULL
			AND cache_created_at IS NULL)),
	UNIQUE NULLS NOT DISTINCT (stream_id, source_schema, source_table_name,
		cache_name, snapshot_id)
);

SELECT pg_catalog.pg_extension_config_dump('projcache.stream_registry'::pg_catalog.regclass, ''::pg_catalog.text);
SELECT pg_catalog.pg_extension_config_dump('projcache.stream_registry_id_seq'::pg_catalog.regclass, ''::pg_catalog.text);
SELECT pg_catalog.pg_extension_config_dump('projcache.stream_mapping_registry'::pg_catalog.regclass, ''::pg_catalog.text);
SELECT pg_catalog.pg_extension_config_dump('projcache.stream_mapping_registry_id_seq'::pg_catalog.regclass, ''::pg_catalog.text);

CREATE FUNCTION projcache.create_stream(name pg_catalog.text,
	conninfo pg_catalog.text,
	publication pg_catalog.text,
	slot_name pg_catalog.text DEFAULT NULL::pg_catalog.text)
RETURNS pg_catalog.void
AS 'MODULE_PATHNAME', 'projcache_create_stream'
LANGUAGE C VOLATILE PARALLEL UNSAFE;

COMMENT ON FUNCTION projcache.create_stream(pg_catalog.text, pg_catalog.text, pg_catalog.text, pg_catalog.text) IS
'Register a change stream from a PostgreSQL source''s publication (slot_name NULL: a temporary slot); the caller owns it';

CREATE FUNCTION projcache.alter_stream(name pg_catalog.text,
	conninfo pg_catalog.text DEFAULT NULL::pg_catalog.text,
	publication pg_catalog.text DEFAULT NULL::pg_catalog.text)
RETURNS pg_catalog.void
AS 'MODULE_PATHNAME', 'projcache_alter_stream'
LANGUAGE C VOLATILE PARALLEL UNSAFE;

COMMENT ON FUNCTION projcache.alter_stream(pg_catalog.text, pg_catalog.text, pg_catalog.text) IS
'Change the connection string or the publication of a stream; a NULL one stays, and so does the slot';

CREATE FUNCTION projcache.stream_table(stream pg_catalog.text,
	source_table pg_catalog.text,
	key_column pg_catalog.text,
	cache pg_catalog.text DEFAULT NULL::pg_catalog.text,
	key_prefix pg_catalog.text DEFAULT ''::pg_catalog.text)
RETURNS pg_catalog.void
AS 'MODULE_PATHNAME', 'projcache_stream_table'
LANGUAGE C VOLATILE PARALLEL UNSAFE;

COMMENT ON FUNCTION projcache.stream_table(pg_catalog.text, pg_catalog.text, pg_catalog.text, pg_catalog.text, pg_catalog.text) IS
'Map a source table of a stream to keys key_prefix || key_column of a cache (NULL: the default cache)';

CREATE FUNCTION projcache.stream_snapshot(stream pg_catalog.text,
	source_table pg_catalog.text,
	snapshot pg_catalog.text)
RETURNS pg_catalog.void
AS 'MODULE_PATHNAME', 'projcache_stream_snapshot'
LANGUAGE C VOLATILE PARALLEL UNSAFE;

COMMENT ON FUNCTION projcache.stream_snapshot(pg_catalog.text, pg_catalog.text, pg_catalog.text) IS
'Map a source table of a stream to a snapshot, refreshed when the table changes';

CREATE FUNCTION projcache.unstream_table(stream pg_catalog.text,
	source_table pg_catalog.text,
	cache pg_catalog.text DEFAULT NULL::pg_catalog.text,
	snapshot pg_catalog.text DEFAULT NULL::pg_catalog.text)
RETURNS pg_catalog.void
AS 'MODULE_PATHNAME', 'projcache_unstream_table'
LANGUAGE C VOLATILE PARALLEL UNSAFE;

COMMENT ON FUNCTION projcache.unstream_table(pg_catalog.text, pg_catalog.text, pg_catalog.text, pg_catalog.text) IS
'Remove a mapping of a stream''s table: to the cache (NULL: the default cache) or to the snapshot';

CREATE FUNCTION projcache.drop_stream(name pg_catalog.text)
RETURNS pg_catalog.void
AS 'MODULE_PATHNAME', 'projcache_drop_stream'
LANGUAGE C VOLATILE PARALLEL UNSAFE;

COMMENT ON FUNCTION projcache.drop_stream(pg_catalog.text) IS
'Drop a stream and its mappings';

CREATE FUNCTION projcache.streams_1_4(
	OUT name pg_catalog.text, OUT owner pg_catalog.regrole,
	OUT conninfo pg_catalog.text, OUT publication pg_catalog.text,
	OUT slot_name pg_catalog.text, OUT state pg_catalog.text,
	OUT source_system_id pg_catalog.int8, OUT source_timeline pg_catalog.int4,
	OUT received_lsn pg_catalog.pg_lsn, OUT confirmed_lsn pg_catalog.pg_lsn,
	OUT lag pg_catalog.interval, OUT last_commit_at pg_catalog.timestamptz,
	OUT transactions pg_catalog.int8, OUT changes pg_catalog.int8,
	OUT keys_invalidated pg_catalog.int8,
	OUT snapshots_refreshed pg_catalog.int8,
	OUT full_refetches pg_catalog.int8, OUT reconnects pg_catalog.int8,
	OUT last_error pg_catalog.text, OUT last_error_at pg_catalog.timestamptz)
RETURNS SETOF pg_catalog.record
AS 'MODULE_PATHNAME', 'projcache_streams'
LANGUAGE C STRICT VOLATILE PARALLEL UNSAFE;

CREATE VIEW projcache.streams AS
	SELECT * FROM projcache.streams_1_4();

COMMENT ON VIEW projcache.streams IS
'One row per change stream whose owner''s privileges the current role has (a superuser: all), the connection string without its password';

CREATE FUNCTION projcache.stream_mappings_1_4(
	OUT stream pg_catalog.text, OUT source_table pg_catalog.text,
	OUT key_column pg_catalog.text, OUT cache pg_catalog.text,
	OUT key_prefix pg_catalog.text, OUT snapshot pg_catalog.text,
	OUT status pg_catalog.text, OUT last_error pg_catalog.text)
RETURNS SETOF pg_catalog.record
AS 'MODULE_PATHNAME', 'projcache_stream_mappings'
LANGUAGE C STRICT VOLATILE PARALLEL UNSAFE;

CREATE VIEW projcache.stream_mappings AS
	SELECT * FROM projcache.stream_mappings_1_4();

COMMENT ON VIEW projcache.stream_mappings IS
'One row per mapping of a stream the current role sees in projcache.streams';

-- As every function of projcache: granted by the DBA, not to PUBLIC.
REVOKE ALL ON projcache.stream_registry FROM PUBLIC;
REVOKE ALL ON SEQUENCE projcache.stream_registry_id_seq FROM PUBLIC;
REVOKE ALL ON projcache.stream_mapping_registry FROM PUBLIC;
REVOKE ALL ON SEQUENCE projcache.stream_mapping_registry_id_seq FROM PUBLIC;
REVOKE ALL ON FUNCTION projcache.create_stream(pg_catalog.text, pg_catalog.text, pg_catalog.text, pg_catalog.text) FROM PUBLIC;
REVOKE ALL ON FUNCTION projcache.alter_stream(pg_catalog.text, pg_catalog.text, pg_catalog.text) FROM PUBLIC;
REVOKE ALL ON FUNCTION projcache.stream_table(pg_catalog.text, pg_catalog.text, pg_catalog.text, pg_catalog.text, pg_catalog.text) FROM PUBLIC;
REVOKE ALL ON FUNCTION projcache.stream_snapshot(pg_catalog.text, pg_catalog.text, pg_catalog.text) FROM PUBLIC;
REVOKE ALL ON FUNCTION projcache.unstream_table(pg_catalog.text, pg_catalog.text, pg_catalog.text, pg_catalog.text) FROM PUBLIC;
REVOKE ALL ON FUNCTION projcache.drop_stream(pg_catalog.text) FROM PUBLIC;
REVOKE ALL ON FUNCTION projcache.streams_1_4() FROM PUBLIC;
REVOKE ALL ON FUNCTION projcache.stream_mappings_1_4() FROM PUBLIC;
REVOKE ALL ON projcache.streams FROM PUBLIC;
REVOKE ALL ON projcache.stream_mappings FROM PUBLIC;
