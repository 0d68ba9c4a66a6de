--
-- Snapshot cache security (1.0.1): a snapshot's rows never depend on the
-- session that happens to load them; last-good is for a failing source, not
-- for lost rights; no role can take every snapshot slot.
--
CREATE SCHEMA snap_sec;
CREATE ROLE regress_sec_owner;
CREATE ROLE regress_sec_reader;
CREATE ROLE regress_sec_hog;
GRANT USAGE ON SCHEMA projcache, snap_sec TO regress_sec_owner,
	regress_sec_reader, regress_sec_hog;
GRANT CREATE ON SCHEMA snap_sec TO regress_sec_owner;
GRANT EXECUTE ON FUNCTION projcache.create_snapshot(text, text, interval, text),
	projcache.drop_snapshot(text),
	projcache.grant_snapshot(text, regrole),
	projcache.revoke_snapshot(text, regrole),
	projcache.snapshot(text), projcache.snapshot(text, anyelement),
	projcache.refresh_snapshot(text), projcache.snapshots(), projcache.snapshots_1_2_1()
	TO regress_sec_owner, regress_sec_reader, regress_sec_hog;
GRANT SELECT ON projcache.snapshots
	TO regress_sec_owner, regress_sec_reader, regress_sec_hog;

-- The owner's table, with a row-level security policy that reads a custom
-- setting, forced on the owner too.
SET ROLE regress_sec_owner;
CREATE TABLE snap_sec.tenant_rows (tenant text, v int);
INSERT INTO snap_sec.tenant_rows VALUES ('public', 1), ('acme', 2), ('globex', 3);
ALTER TABLE snap_sec.tenant_rows ENABLE ROW LEVEL SECURITY;
ALTER TABLE snap_sec.tenant_rows FORCE ROW LEVEL SECURITY;
CREATE POLICY by_tenant ON snap_sec.tenant_rows
	USING (tenant = coalesce(nullif(current_setting('app.tenant', true), ''), 'public'));
SELECT projcache.create_snapshot('tenants', 'SELECT tenant, v FROM snap_sec.tenant_rows', '1h');
SELECT projcache.grant_snapshot('tenants', 'regress_sec_reader');
RESET ROLE;

-- 1. A reader's custom setting, read by the policy, does not choose the
-- rows: the first (cold) load is made by a reader asking for "acme".
SET ROLE regress_sec_reader;
SET app.tenant = 'acme';
SELECT * FROM projcache.snapshot('tenants') AS t(tenant text, v int) ORDER BY v;
RESET app.tenant;
RESET ROLE;
-- ... and the owner is served the same rows.
SET ROLE regress_sec_owner;
SELECT * FROM projcache.snapshot('tenants') AS t(tenant text, v int) ORDER BY v;
RESET ROLE;

-- 2. A reader with row_security = off does not make the load fail (and
-- so cannot spend the owner's cold-start window).
SET ROLE regress_sec_owner;
SELECT projcache.create_snapshot('tenants_rs', 'SELECT tenant, v FROM snap_sec.tenant_rows', '1h');
SELECT projcache.grant_snapshot('tenants_rs', 'regress_sec_reader');
RESET ROLE;
SET ROLE regress_sec_reader;
SET row_security = off;
SELECT * FROM projcache.snapshot('tenants_rs') AS t(tenant text, v int) ORDER BY v;
RESET row_security;
RESET ROLE;

-- 3. Another setting: the reader's DateStyle does not shape the text of a
-- date the query formats.
SET ROLE regress_sec_owner;
SELECT projcache.create_snapshot('dates', $$SELECT '2026-01-02'::date::text AS d$$, '1h');
SELECT projcache.grant_snapshot('dates', 'regress_sec_reader');
RESET ROLE;
SET ROLE regress_sec_reader;
SET DateStyle = 'SQL, DMY';
SELECT * FROM projcache.snapshot('dates') AS t(d text);
RESET DateStyle;
RESET ROLE;

-- 4. Names are bound when the snapshot is created, with the creator's
-- search path: a reader's temporary view of the same name is not read.
SET ROLE regress_sec_owner;
CREATE TABLE snap_sec.colors (name text);
INSERT INTO snap_sec.colors VALUES ('red'), ('blue');
SET search_path = snap_sec;
SELECT projcache.create_snapshot('colors', 'SELECT name FROM colors', '1h');
RESET search_path;
SELECT projcache.grant_snapshot('colors', 'regress_sec_reader');
RESET ROLE;
GRANT TEMPORARY ON DATABASE contrib_regression TO regress_sec_reader;
SET ROLE regress_sec_reader;
CREATE TEMP VIEW colors AS SELECT 'injected'::text AS name;
SET search_path = pg_temp, snap_sec;
SELECT * FROM projcache.snapshot('colors') AS t(name text) ORDER BY name;
RESET search_path;
DROP VIEW pg_temp.colors;
RESET ROLE;

-- A variant: the owner's function reads a table by an unqualified name at
-- run time; a reader's temporary table of that name is not found by the
-- load, which runs in a session of its own.
SET ROLE regress_sec_owner;
CREATE FUNCTION snap_sec.color_names() RETURNS SETOF text LANGUAGE sql
	SET search_path = snap_sec AS 'SELECT name FROM colors';
SELECT projcache.create_snapshot('colors_fn', 'SELECT snap_sec.color_names() AS name', '1h');
SELECT projcache.grant_snapshot('colors_fn', 'regress_sec_reader');
RESET ROLE;
SET ROLE regress_sec_reader;
CREATE TEMP TABLE colors (name text);
INSERT INTO colors VALUES ('injected');
SELECT * FROM projcache.snapshot('colors_fn') AS t(name text) ORDER BY name;
DROP TABLE pg_temp.colors;
RESET ROLE;

-- A query that uses a temporary object cannot be registered.
SET ROLE regress_sec_owner;
CREATE TEMP TABLE my_temp (x int);
SELECT sqlstate_of($$SELECT projcache.create_snapshot('temp_src', 'SELECT x FROM my_temp')$$);
CREATE TYPE pg_temp.my_mood AS ENUM ('ok');
SELECT sqlstate_of($$SELECT projcache.create_snapshot('temp_type', 'SELECT NULL::pg_temp.my_mood AS m')$$);
DROP TABLE my_temp;
DROP TYPE pg_temp.my_mood;
RESET ROLE;

-- 5. What a snapshot reads cannot be dropped under it: an enum type its
-- query uses, its table.
SET ROLE regress_sec_owner;
CREATE TYPE snap_sec.mood AS ENUM ('happy', 'sad');
SELECT projcache.create_snapshot('moods', $$SELECT 'happy'::snap_sec.mood AS m$$, '1h');
SELECT * FROM projcache.snapshot('moods') AS t(m snap_sec.mood);
SELECT sqlstate_of('DROP TYPE snap_sec.mood');
SELECT projcache.drop_snapshot('moods');
CREATE TABLE snap_sec.numbers (n int);
INSERT INTO snap_sec.numbers VALUES (1);
SELECT projcache.create_snapshot('numbers', 'SELECT n FROM snap_sec.numbers', '1h');
SELECT * FROM projcache.snapshot('numbers') AS t(n int);
SELECT sqlstate_of('DROP TABLE snap_sec.numbers');
-- CASCADE drops the view behind the snapshot, and with it (1.1.1) the
-- registration: reads then fail clearly, and the name is free.
DROP TABLE snap_sec.numbers CASCADE;
RESET ROLE;
SELECT projcache.debug_advance_clock('2h');
SET ROLE regress_sec_owner;
SELECT sqlstate_of($$SELECT * FROM projcache.snapshot('numbers') AS t(n int)$$);
SELECT count(*) FROM projcache.snapshots WHERE name = 'numbers';
RESET ROLE;

-- 7. Last-good is not for lost rights: after REVOKE from the owner, the
-- next load drops the cached rows and readers get a clear error.
CREATE TABLE snap_sec.granted (id int);
INSERT INTO snap_sec.granted VALUES (42);
GRANT SELECT ON snap_sec.granted TO regress_sec_owner;
SET ROLE regress_sec_owner;
SELECT projcache.create_snapshot('granted', 'SELECT id FROM snap_sec.granted', '1h');
SELECT projcache.grant_snapshot('granted', 'regress_sec_reader');
SELECT * FROM projcache.snapshot('granted') AS t(id int);
RESET ROLE;
REVOKE SELECT ON snap_sec.granted FROM regress_sec_owner;
SELECT projcache.debug_advance_clock('2h');
SET ROLE regress_sec_reader;
SELECT sqlstate_of($$SELECT * FROM projcache.snapshot('granted') AS t(id int)$$);
-- No cached rows are left to serve.
SELECT sqlstate_of($$SELECT * FROM projcache.snapshot('granted') AS t(id int)$$);
SELECT rows, status FROM projcache.snapshots WHERE name = 'granted';
RESET ROLE;
-- A failing source that is not about rights keeps serving last-good.
GRANT SELECT ON snap_sec.granted TO regress_sec_owner;
SET ROLE regress_sec_owner;
SELECT projcache.create_snapshot('flaky', 'SELECT 42 AS id, 1 / (SELECT count(*) FROM snap_sec.granted)::int AS one', '1h');
SELECT * FROM projcache.snapshot('flaky') AS t(id int, one int);
RESET ROLE;
DELETE FROM snap_sec.granted;
SELECT projcache.debug_advance_clock('2h');
SET ROLE regress_sec_owner;
SET client_min_messages = error;
SELECT * FROM projcache.snapshot('flaky') AS t(id int, one int);
RESET client_min_messages;
SELECT rows, status FROM projcache.snapshots WHERE name = 'flaky';
RESET ROLE;

-- 8. grant_snapshot() refuses a role that does not exist.
SET ROLE regress_sec_owner;
SELECT sqlstate_of($$SELECT projcache.grant_snapshot('granted', 999999::oid::regrole)$$);
RESET ROLE;

-- 9. No role can take every slot: a snapshot created and read in a
-- transaction that rolls back holds no slot (more times than there are
-- slots), and another role can still register and read one.
SET ROLE regress_sec_hog;
DO $$
BEGIN
	FOR i IN 1..80 LOOP
		BEGIN
			PERFORM projcache.create_snapshot('hog_' || i, 'SELECT 1 AS one');
			PERFORM * FROM projcache.snapshot('hog_' || i) AS t(one int);
		EXCEPTION WHEN others THEN
			NULL;
		END;
		BEGIN
			PERFORM projcache.create_snapshot('hog_x' || i, 'SELECT 1 AS one');
			RAISE EXCEPTION 'roll back';
		EXCEPTION WHEN others THEN
			NULL;
		END;
	END LOOP;
END $$;
SELECT count(*) FROM projcache.snapshots WHERE name LIKE 'hog%';
RESET ROLE;
SET ROLE regress_sec_owner;
SELECT projcache.create_snapshot('after_hog', 'SELECT 1 AS one');
SELECT * FROM projcache.snapshot('after_hog') AS t(one int);
RESET ROLE;

-- 10. The owner is the backing view's: REASSIGN OWNED hands the snapshot
-- over, and the old owner can then be dropped.
CREATE ROLE regress_sec_leaver;
GRANT USAGE ON SCHEMA projcache TO regress_sec_leaver;
GRANT EXECUTE ON FUNCTION projcache.create_snapshot(text, text, interval, text)
	TO regress_sec_leaver;
SET ROLE regress_sec_leaver;
SELECT projcache.create_snapshot('handed', 'SELECT 7 AS seven');
RESET ROLE;
-- 6. The owner cannot be dropped while it owns snapshots.
DROP ROLE regress_sec_leaver;
REASSIGN OWNED BY regress_sec_leaver TO regress_sec_owner;
DROP OWNED BY regress_sec_leaver;
DROP ROLE regress_sec_leaver;
SELECT owner FROM projcache.snapshots WHERE name = 'handed';
SET ROLE regress_sec_owner;
SELECT * FROM projcache.snapshot('handed') AS t(seven int);
RESET ROLE;

-- Clean up.
SET ROLE regress_sec_owner;
SELECT projcache.drop_snapshot(name) FROM projcache.snapshots
 WHERE owner = 'regress_sec_owner'::regrole ORDER BY name;
RESET ROLE;
DROP SCHEMA snap_sec CASCADE;
REVOKE TEMPORARY ON DATABASE contrib_regression FROM regress_sec_reader;
REVOKE ALL ON SCHEMA projcache FROM regress_sec_owner, regress_sec_reader, regress_sec_hog;
REVOKE ALL ON ALL FUNCTIONS IN SCHEMA projcache FROM regress_sec_owner, regress_sec_reader, regress_sec_hog;
REVOKE ALL ON projcache.snapshots FROM regress_sec_owner, regress_sec_reader, regress_sec_hog;
DROP ROLE regress_sec_owner, regress_sec_reader, regress_sec_hog;
