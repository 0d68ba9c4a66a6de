--
-- Snapshot cache, per database: two databases may each register a snapshot
-- of the same name (here even with the same registry id, and different row
-- types), and each gets its own rows.  Dropping one leaves the other alone.
--
SELECT current_database() AS regress_db \gset
CREATE DATABASE regress_snap_db1;
CREATE DATABASE regress_snap_db2;

\c regress_snap_db1
CREATE EXTENSION projcache;
CREATE SEQUENCE calls_seq;
CREATE FUNCTION rows_of_db1() RETURNS TABLE (db text, n int) LANGUAGE plpgsql AS $$
BEGIN
	PERFORM pg_catalog.nextval('public.calls_seq');
	RETURN QUERY SELECT pg_catalog.current_database()::text, 1;
END $$;
SELECT projcache.create_snapshot('shared', 'SELECT * FROM public.rows_of_db1()', '1h');
SELECT id FROM projcache.snapshot_registry WHERE name = 'shared';
SELECT * FROM projcache.snapshot('shared') AS t(db text, n int);
SELECT last_value AS calls FROM calls_seq;

\c regress_snap_db2
CREATE EXTENSION projcache;
SELECT projcache.create_snapshot('shared',
	$$SELECT 2::int8 AS big, pg_catalog.current_database()::text AS db, 'second'::text AS tag$$, '1h');
SELECT id FROM projcache.snapshot_registry WHERE name = 'shared';
-- Cold here, though db1's "shared" is loaded.
SELECT name, rows, status FROM projcache.snapshots;
SELECT * FROM projcache.snapshot('shared') AS t(big int8, db text, tag text);
SELECT name, rows, status FROM projcache.snapshots;

\c regress_snap_db1
-- db1 still has its own rows, from its cache (no new query).
SELECT * FROM projcache.snapshot('shared') AS t(db text, n int);
SELECT last_value AS calls FROM calls_seq;
SELECT name, rows, status FROM projcache.snapshots;
SELECT projcache.drop_snapshot('shared');

\c regress_snap_db2
-- db1's drop did not touch db2's snapshot.
SELECT name, rows, status FROM projcache.snapshots;
SELECT * FROM projcache.snapshot('shared') AS t(big int8, db text, tag text);
SELECT projcache.drop_snapshot('shared');

\c :regress_db
DROP DATABASE regress_snap_db1 WITH (FORCE);
DROP DATABASE regress_snap_db2 WITH (FORCE);
