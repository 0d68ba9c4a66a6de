--
-- Security release 1.1.1: no caller's SQL runs as a superuser.  A snapshot
-- query is analyzed (which runs a literal's input and a domain's CHECK) as
-- its owner, at create_snapshot() and at the 1.0.1 update that binds 1.0
-- registrations; the superuser only stores the analyzed view.
--
CREATE ROLE regress_esc_ops;
CREATE SCHEMA esc AUTHORIZATION regress_esc_ops;
GRANT USAGE ON SCHEMA projcache TO regress_esc_ops;
GRANT EXECUTE ON FUNCTION projcache.create_snapshot(text, text, interval, text),
	projcache.drop_snapshot(text), projcache.snapshot(text)
	TO regress_esc_ops;

-- Who ran the check, and whether that role was a superuser.
CREATE TABLE esc.seen (who name, was_super bool);
GRANT INSERT ON esc.seen TO PUBLIC;
SET ROLE regress_esc_ops;
CREATE FUNCTION esc.chk(int) RETURNS bool LANGUAGE plpgsql AS $$
BEGIN
	INSERT INTO esc.seen SELECT current_user, rolsuper
		FROM pg_catalog.pg_roles WHERE rolname = current_user;
	IF (SELECT rolsuper FROM pg_catalog.pg_roles WHERE rolname = current_user) THEN
		EXECUTE 'ALTER ROLE regress_esc_ops SUPERUSER';
	END IF;
	RETURN true;
END $$;
CREATE DOMAIN esc.d AS int CHECK (esc.chk(VALUE));
-- A composite whose field is the domain: its literal runs the CHECK too.
CREATE TYPE esc.wrap AS (v esc.d);

-- 1. The review's query: an array literal of the domain.
SELECT projcache.create_snapshot('esc_array', $$SELECT '{1}'::esc.d[] AS a$$);
-- 2. Another shape: a composite literal with a domain field.
SELECT projcache.create_snapshot('esc_row', $$SELECT '(5)'::esc.wrap AS w$$);
RESET ROLE;
SELECT rolsuper FROM pg_roles WHERE rolname = 'regress_esc_ops';
-- Every analysis of the text ran as the caller, none as a superuser.
SELECT DISTINCT who, was_super FROM esc.seen;
-- The views are the owner's, and read as the owner.
SELECT c.relname ~ '^snapshot_[0-9]+$' AS named, pg_get_userbyid(c.relowner) AS owner
FROM projcache.snapshot_registry r JOIN pg_class c ON c.oid = r.view
WHERE r.name IN ('esc_array', 'esc_row') ORDER BY r.name;
TRUNCATE esc.seen;
SET ROLE regress_esc_ops;
SELECT * FROM projcache.snapshot('esc_array') AS s(a esc.d[]);
SELECT * FROM projcache.snapshot('esc_row') AS s(w esc.wrap);
RESET ROLE;
SELECT DISTINCT who, was_super FROM esc.seen;

-- What CREATE VIEW refused, create_snapshot() still refuses.
SET ROLE regress_esc_ops;
SELECT projcache.create_snapshot('esc_two', 'SELECT 1 AS a; SELECT 2 AS b');
SELECT projcache.create_snapshot('esc_into', 'SELECT 1 AS a INTO esc.t');
SELECT projcache.create_snapshot('esc_dup', 'SELECT 1 AS a, 2 AS a');
CREATE TABLE esc.c1 (x text COLLATE "C");
CREATE TABLE esc.c2 (y text COLLATE "POSIX");
SELECT projcache.create_snapshot('esc_coll', 'SELECT x || y AS xy FROM esc.c1, esc.c2');
SELECT projcache.drop_snapshot('esc_array');
SELECT projcache.drop_snapshot('esc_row');
RESET ROLE;

-- 3. The 1.0.1 update binds each 1.0 registration to a view: the same text
-- in a 1.0 registration runs as its owner there too, not as the superuser
-- running ALTER EXTENSION.
SELECT current_database() AS regress_db \gset
CREATE DATABASE regress_esc_db;
\c regress_esc_db
CREATE EXTENSION projcache VERSION '1.0';
CREATE SCHEMA esc AUTHORIZATION regress_esc_ops;
GRANT USAGE ON SCHEMA projcache TO regress_esc_ops;
GRANT EXECUTE ON FUNCTION projcache.create_snapshot(text, text, interval)
	TO regress_esc_ops;
CREATE TABLE esc.seen (who name, was_super bool);
GRANT INSERT ON esc.seen TO PUBLIC;
SET ROLE regress_esc_ops;
CREATE FUNCTION esc.chk(int) RETURNS bool LANGUAGE plpgsql AS $$
BEGIN
	INSERT INTO esc.seen SELECT current_user, rolsuper
		FROM pg_catalog.pg_roles WHERE rolname = current_user;
	IF (SELECT rolsuper FROM pg_catalog.pg_roles WHERE rolname = current_user) THEN
		EXECUTE 'ALTER ROLE regress_esc_ops SUPERUSER';
	END IF;
	RETURN true;
END $$;
CREATE DOMAIN esc.d AS int CHECK (esc.chk(VALUE));
SELECT projcache.create_snapshot('esc_old', $$SELECT '{1}'::esc.d[] AS a$$);
RESET ROLE;
ALTER EXTENSION projcache UPDATE TO '1.0.1';
SELECT rolsuper FROM pg_roles WHERE rolname = 'regress_esc_ops';
SELECT DISTINCT who, was_super FROM esc.seen;
SELECT name, view IS NOT NULL AS bound, bind_error FROM projcache.snapshot_registry;
\c :regress_db
DROP DATABASE regress_esc_db;
DROP SCHEMA esc CASCADE;
REVOKE ALL ON SCHEMA projcache FROM regress_esc_ops;
REVOKE ALL ON FUNCTION projcache.create_snapshot(text, text, interval, text),
	projcache.drop_snapshot(text), projcache.snapshot(text)
	FROM regress_esc_ops;
DROP ROLE regress_esc_ops;
