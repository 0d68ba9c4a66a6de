--
-- Security release 1.1.1, found by a red-team pass: a snapshot's owner
-- owns its backing view, and may move it out of schema projcache with
-- ALTER VIEW ... SET SCHEMA (that needs CREATE only on the schema it goes
-- to).  What drops the moved view must still drop the registration: else
-- a column's type can go too, and IMPORT FOREIGN SCHEMA of every role the
-- owner granted the snapshot fails with XX000 "cache lookup failed for
-- type"; and DROP OWNED BY, DROP ROLE leave a registration with a dangling
-- owner whose name no one can create again.
--
-- The views' names hold ids that depend on the tests before: no notices.
SET client_min_messages = warning;
CREATE ROLE regress_red_owner;
CREATE ROLE regress_red_other;
CREATE SCHEMA red AUTHORIZATION regress_red_owner;
CREATE SCHEMA red_other AUTHORIZATION regress_red_other;
GRANT USAGE ON SCHEMA projcache TO regress_red_owner, regress_red_other;
GRANT EXECUTE ON FUNCTION projcache.create_snapshot(text, text, interval, text),
	projcache.drop_snapshot(text), projcache.snapshot(text),
	projcache.grant_snapshot(text, regrole), projcache.snapshots(), projcache.snapshots_1_2_1()
	TO regress_red_owner, regress_red_other;
GRANT SELECT ON projcache.snapshots TO regress_red_owner, regress_red_other;
GRANT USAGE ON FOREIGN SERVER projcache TO regress_red_owner, regress_red_other;

-- The backing view of a snapshot of regress_red_owner's, as a name.
CREATE FUNCTION red_view_of(snapshot text) RETURNS text
LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog AS
$$SELECT c.relname::text FROM projcache.snapshot_registry r
  JOIN pg_class c ON c.oid = r.view::oid WHERE r.name = snapshot$$;
GRANT EXECUTE ON FUNCTION red_view_of(text) TO regress_red_owner;

-- 1. The view moved out, then dropped with a column's type: the
-- registration goes too, and the other role's IMPORT works.
SET ROLE regress_red_owner;
CREATE TYPE red.gone AS (a int);
SELECT projcache.create_snapshot('red_moved', $$SELECT ROW(1)::red.gone AS g$$, '1h');
SELECT projcache.grant_snapshot('red_moved', 'regress_red_other');
SELECT format('ALTER VIEW projcache.%I SET SCHEMA red', red_view_of('red_moved'))
	AS move_view \gset
:move_view;
DROP TYPE red.gone CASCADE;
SELECT name FROM projcache.snapshots WHERE name = 'red_moved';
RESET ROLE;
SET ROLE regress_red_other;
IMPORT FOREIGN SCHEMA projcache LIMIT TO (red_moved) FROM SERVER projcache INTO red_other;
SELECT count(*) FROM pg_class WHERE relnamespace = 'red_other'::regnamespace;
RESET ROLE;

-- 2. Another shape: the view moved out, then DROP OWNED BY its owner and
-- DROP ROLE.  No registration is left with a dangling owner, and another
-- role may take the name.
SET ROLE regress_red_owner;
SELECT projcache.create_snapshot('red_owned', 'SELECT 1 AS x', '1h');
SELECT format('ALTER VIEW projcache.%I SET SCHEMA red', red_view_of('red_owned'))
	AS move_view \gset
:move_view;
RESET ROLE;
DROP OWNED BY regress_red_owner CASCADE;
DROP FUNCTION red_view_of(text);
REVOKE ALL ON SCHEMA projcache FROM regress_red_owner;
REVOKE ALL ON FUNCTION projcache.create_snapshot(text, text, interval, text),
	projcache.drop_snapshot(text), projcache.snapshot(text),
	projcache.grant_snapshot(text, regrole), projcache.snapshots(), projcache.snapshots_1_2_1()
	FROM regress_red_owner;
REVOKE ALL ON projcache.snapshots FROM regress_red_owner;
REVOKE ALL ON FOREIGN SERVER projcache FROM regress_red_owner;
DROP ROLE regress_red_owner;
SELECT count(*) FROM projcache.snapshot_registry r
WHERE NOT EXISTS (SELECT FROM pg_roles WHERE oid = r.owner::oid)
   OR NOT EXISTS (SELECT FROM pg_class WHERE oid = r.view::oid);
SET ROLE regress_red_other;
SELECT projcache.create_snapshot('red_owned', 'SELECT 2 AS x', '1h');
SELECT * FROM projcache.snapshot('red_owned') AS s(x int);
SELECT projcache.drop_snapshot('red_owned');
RESET ROLE;

-- 3. A transaction that drops a view that backs no snapshot deletes
-- nothing, and commits as before.
CREATE VIEW red_plain AS SELECT 1 AS x;
SELECT projcache.create_snapshot('red_kept', 'SELECT 1 AS x', '1h');
DROP VIEW red_plain;
SELECT name FROM projcache.snapshots WHERE name = 'red_kept';
SELECT projcache.drop_snapshot('red_kept');

DROP SCHEMA red_other CASCADE;
REVOKE ALL ON SCHEMA projcache FROM regress_red_other;
REVOKE ALL ON FUNCTION projcache.create_snapshot(text, text, interval, text),
	projcache.drop_snapshot(text), projcache.snapshot(text),
	projcache.grant_snapshot(text, regrole), projcache.snapshots(), projcache.snapshots_1_2_1()
	FROM regress_red_other;
REVOKE ALL ON projcache.snapshots FROM regress_red_other;
REVOKE ALL ON FOREIGN SERVER projcache FROM regress_red_other;
DROP ROLE regress_red_other;
