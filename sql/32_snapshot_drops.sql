--
-- Security release 1.1.1: a registration goes with its backing view.  What
-- drops the view (DROP TYPE ... CASCADE of a column's type, DROP OWNED BY
-- its owner, DROP VIEW ... CASCADE) drops the registration at commit, so no
-- read meets a dangling type or owner (XX000), and the name is free again.
--
-- The views' names hold ids that depend on the tests before: no notices.
SET client_min_messages = warning;
CREATE ROLE regress_drop_owner;
CREATE ROLE regress_drop_other;
CREATE SCHEMA drops AUTHORIZATION regress_drop_owner;
GRANT USAGE ON SCHEMA projcache TO regress_drop_owner, regress_drop_other;
GRANT EXECUTE ON FUNCTION projcache.create_snapshot(text, text, interval, text),
	projcache.drop_snapshot(text), projcache.snapshot(text),
	projcache.snapshots(), projcache.snapshots_1_2_1() TO regress_drop_owner, regress_drop_other;
GRANT SELECT ON projcache.snapshots TO regress_drop_owner, regress_drop_other;
GRANT USAGE ON FOREIGN SERVER projcache TO regress_drop_owner;

SET ROLE regress_drop_owner;
CREATE TYPE drops.mood AS ENUM ('ok', 'sad');
CREATE DOMAIN drops.pos AS int CHECK (VALUE > 0);
SELECT projcache.create_snapshot('by_type', $$SELECT 'ok'::drops.mood AS m$$, '1h');
SELECT projcache.create_snapshot('by_domain', 'SELECT 1::drops.pos AS p', '1h');
SELECT * FROM projcache.snapshot('by_type') AS s(m drops.mood);
CREATE FOREIGN TABLE drops.ft (m drops.mood) SERVER projcache OPTIONS (snapshot 'by_type');

-- 1. DROP TYPE ... CASCADE drops the view, the foreign table and, at
-- commit, the registration.
DROP TYPE drops.mood CASCADE;
SELECT name FROM projcache.snapshots ORDER BY name;
SELECT * FROM projcache.snapshot('by_type') AS s(m text);
-- The name is free for its owner to create again.
SELECT projcache.create_snapshot('by_type', $$SELECT 'ok'::text AS m$$, '1h');
SELECT * FROM projcache.snapshot('by_type') AS s(m text);

-- 2. Another shape: DROP DOMAIN ... CASCADE, rolled back to a savepoint
-- first (the registration stays), then committed (it goes).
BEGIN;
SAVEPOINT s;
DROP DOMAIN drops.pos CASCADE;
ROLLBACK TO SAVEPOINT s;
COMMIT;
SELECT * FROM projcache.snapshot('by_domain') AS s(p drops.pos);
DROP DOMAIN drops.pos CASCADE;
SELECT name FROM projcache.snapshots ORDER BY name;
RESET ROLE;

-- 3. DROP OWNED BY the owner, then DROP ROLE: no registration is left
-- with a dangling owner, and another role may take the name.
SET ROLE regress_drop_owner;
SELECT projcache.create_snapshot('owned', 'SELECT 1 AS x', '1h');
SELECT * FROM projcache.snapshot('owned') AS s(x int);
RESET ROLE;
DROP OWNED BY regress_drop_owner CASCADE;
REVOKE ALL ON SCHEMA projcache FROM regress_drop_owner;
REVOKE ALL ON FUNCTION projcache.create_snapshot(text, text, interval, text),
	projcache.drop_snapshot(text), projcache.snapshot(text),
	projcache.snapshots(), projcache.snapshots_1_2_1() FROM regress_drop_owner;
REVOKE ALL ON projcache.snapshots FROM regress_drop_owner;
REVOKE ALL ON FOREIGN SERVER projcache FROM regress_drop_owner;
DROP ROLE regress_drop_owner;
SELECT count(*) FROM projcache.snapshot_registry r
WHERE NOT EXISTS (SELECT FROM pg_roles WHERE oid = r.owner::oid)
   OR NOT EXISTS (SELECT FROM pg_class WHERE oid = r.view::oid);
SET ROLE regress_drop_other;
SELECT projcache.create_snapshot('owned', 'SELECT 2 AS x', '1h');
SELECT * FROM projcache.snapshot('owned') AS s(x int);
SELECT projcache.drop_snapshot('owned');
RESET ROLE;

-- 4. DROP VIEW of the backing view itself (by a superuser) takes the
-- registration too.
SELECT projcache.create_snapshot('by_view', 'SELECT 1 AS x', '1h');
SELECT format('DROP VIEW %s', view) AS drop_view
FROM projcache.snapshot_registry WHERE name = 'by_view' \gset
:drop_view;
SELECT count(*) FROM projcache.snapshot_registry WHERE name = 'by_view';

REVOKE ALL ON SCHEMA projcache FROM regress_drop_other;
REVOKE ALL ON FUNCTION projcache.create_snapshot(text, text, interval, text),
	projcache.drop_snapshot(text), projcache.snapshot(text),
	projcache.snapshots(), projcache.snapshots_1_2_1() FROM regress_drop_other;
REVOKE ALL ON projcache.snapshots FROM regress_drop_other;
DROP ROLE regress_drop_other;

-- 5. A registration left without its view by 1.0.1 or 1.1 (here, one whose
-- view is made to point nowhere) reads as a clear error, and the update
-- to 1.1.1 drops it.
SELECT current_database() AS regress_db \gset
CREATE DATABASE regress_drops_db;
\c regress_drops_db
CREATE EXTENSION projcache VERSION '1.1';
SELECT projcache.create_snapshot('left', 'SELECT 1 AS x', '1h');
SELECT projcache.create_snapshot('kept', 'SELECT 2 AS x', '1h');
UPDATE projcache.snapshot_registry SET view = 4000000000::oid::regclass
WHERE name = 'left';
SELECT * FROM projcache.snapshot('left') AS s(x int);
ALTER EXTENSION projcache UPDATE TO '1.1.1';
SELECT extversion FROM pg_extension WHERE extname = 'projcache';
SELECT name FROM projcache.snapshot_registry ORDER BY name;
SELECT * FROM projcache.snapshot('kept') AS s(x int);
\c :regress_db
DROP DATABASE regress_drops_db;

-- 6. A 1.0 registration has no view to keep its types: one whose type was
-- dropped before the update could not be bound, and IMPORT FOREIGN SCHEMA
-- leaves it out with a WARNING instead of failing with XX000.
CREATE DATABASE regress_drops_db;
\c regress_drops_db
CREATE EXTENSION projcache VERSION '1.0';
CREATE TYPE public.gone AS ENUM ('x');
SELECT projcache.create_snapshot('typed', $$SELECT 'x'::public.gone AS g$$, '1h');
SELECT projcache.create_snapshot('plain', 'SELECT 1 AS n', '1h');
DROP TYPE public.gone;
SET client_min_messages = error;
ALTER EXTENSION projcache UPDATE;
RESET client_min_messages;
SELECT name, bind_error IS NOT NULL AS unbound FROM projcache.snapshot_registry ORDER BY name;
CREATE SCHEMA imported;
IMPORT FOREIGN SCHEMA projcache FROM SERVER projcache INTO imported;
SELECT relname FROM pg_class WHERE relnamespace = 'imported'::regnamespace ORDER BY relname;
\c :regress_db
DROP DATABASE regress_drops_db;
