/* projcache--1.0--1.0.1.sql: the security release */

-- complain if script is sourced in psql, rather than via ALTER EXTENSION
\echo Use "ALTER EXTENSION projcache UPDATE TO '1.0.1'" to load this file. \quit

-- Each snapshot is backed by a view owned by its owner, so that the names
-- in its query stay bound as they were at creation, the objects it reads
-- cannot be dropped under it, and its owner cannot be dropped without
-- dealing with it.  bind_error says why a registration made under 1.0
-- could not be bound (its reads fail with that until it is made again).
ALTER TABLE projcache.snapshot_registry
	ADD COLUMN view regclass UNIQUE,
	ADD COLUMN bind_error text;

-- Bind every registration made under 1.0, with search_path = pg_catalog
-- (1.0 analyzed queries with pg_catalog, pg_temp).
CREATE FUNCTION projcache._bind_registrations() RETURNS void
AS 'MODULE_PATHNAME', 'projcache_bind_registrations' LANGUAGE C;
SELECT projcache._bind_registrations();
DROP FUNCTION projcache._bind_registrations();
