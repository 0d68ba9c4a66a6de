--
-- Snapshot cache: the typed form snapshot(name, NULL::rowtype), row types
-- with dropped columns, column lists that do not match the registered
-- columns, and values that stand on their own (detoasted) in the cache.
--
CREATE SCHEMA snap_typed;
SET search_path = snap_typed, public;

-- A table whose row type has a dropped column in the middle.
CREATE TABLE item (id int, junk text, label text, price numeric);
ALTER TABLE item DROP COLUMN junk;
INSERT INTO item VALUES (1, 'one', 1.5), (2, 'two', NULL), (3, NULL, 7);

SELECT projcache.create_snapshot('items', 'SELECT * FROM snap_typed.item ORDER BY id');
SELECT projcache.create_snapshot('items_ex', 'SELECT * FROM snap_typed.item ORDER BY id');

-- Typed form with the table's own row type (dropped column skipped).
SELECT * FROM projcache.snapshot('items', NULL::item);
SELECT s.label FROM projcache.snapshot('items', NULL::item) s WHERE s.price IS NULL;
SELECT count(*) FROM projcache.snapshot('items', NULL::item) s WHERE s.label IS NULL;
-- Also as a whole-row value, and in the select list.
SELECT s FROM projcache.snapshot('items', NULL::item) s ORDER BY s.id;
SELECT (projcache.snapshot('items', NULL::item)).label;

-- Other row types with the same column types: the names are the caller's.
-- A dropped column first, or last, lands in the right place too.
CREATE TYPE item_t AS (item_id int, name text, cost numeric);
SELECT * FROM projcache.snapshot('items', NULL::item_t);
CREATE TABLE item_first (gone int, id int, label text, price numeric);
ALTER TABLE item_first DROP COLUMN gone;
SELECT * FROM projcache.snapshot('items', NULL::item_first);
CREATE TABLE item_last (id int, label text, price numeric, gone text);
ALTER TABLE item_last DROP COLUMN gone;
SELECT * FROM projcache.snapshot('items', NULL::item_last);
-- The untyped form, first read of another snapshot of the same query.
SELECT * FROM projcache.snapshot('items_ex') AS t(a int, b text, c numeric);

-- A row type or column list that does not match: 42804, and the detail
-- says what the snapshot returns.
CREATE TYPE pair AS (a int, b int);
SELECT * FROM projcache.snapshot('items', NULL::pair);
\echo SQLSTATE :LAST_ERROR_SQLSTATE
SELECT * FROM projcache.snapshot('items') AS t(id int, label text);
\echo SQLSTATE :LAST_ERROR_SQLSTATE
SELECT * FROM projcache.snapshot('items') AS t(id int, label text, price numeric, extra int);
\echo SQLSTATE :LAST_ERROR_SQLSTATE
SELECT * FROM projcache.snapshot('items') AS t(id int8, label text, price numeric);
\echo SQLSTATE :LAST_ERROR_SQLSTATE
SELECT * FROM projcache.snapshot('items') AS t(label text, id int, price numeric);
\echo SQLSTATE :LAST_ERROR_SQLSTATE
SELECT * FROM projcache.snapshot('items') AS t(id int, label varchar, price numeric);
\echo SQLSTATE :LAST_ERROR_SQLSTATE
-- Quoted column names are shown quoted.
SELECT projcache.create_snapshot('quoted', $$SELECT 1 AS "Mixed Case", 'x'::text AS plain$$);
SELECT * FROM projcache.snapshot('quoted') AS t(a int);
\echo SQLSTATE :LAST_ERROR_SQLSTATE

-- The table changes shape under a registered "SELECT *": the cached rows
-- keep serving within the TTL; the refresh fails (it no longer returns the
-- registered columns) and the last good rows stay.  The table's new row
-- type no longer matches the snapshot.
ALTER TABLE item ADD COLUMN extra int;
SELECT * FROM projcache.snapshot('items') AS t(id int, label text, price numeric);
SELECT projcache.refresh_snapshot('items');
SELECT * FROM projcache.snapshot('items') AS t(id int, label text, price numeric);
SELECT last_error, status FROM projcache.snapshots WHERE name = 'items';
SELECT * FROM projcache.snapshot('items', NULL::item);
\echo SQLSTATE :LAST_ERROR_SQLSTATE
-- A cold snapshot of that query cannot load at all.
SELECT projcache.create_snapshot('items_cold', 'SELECT id, label FROM snap_typed.item');
ALTER TABLE item ALTER COLUMN label TYPE varchar;
SELECT * FROM projcache.snapshot('items_cold') AS t(id int, label text);
\echo SQLSTATE :LAST_ERROR_SQLSTATE

-- Values live in the cache, not in the table: a large value stored out of
-- line (TOAST) reads back whole after its row is deleted and vacuumed away.
CREATE TABLE big (id int, payload text);
ALTER TABLE big ALTER COLUMN payload SET STORAGE EXTERNAL;
INSERT INTO big SELECT 1, string_agg(md5(i::text), '') FROM generate_series(1, 1000) i;
SELECT pg_column_size(payload) > 30000 AS out_of_line_size FROM big;
SELECT projcache.create_snapshot('big', 'SELECT id, payload FROM snap_typed.big');
SELECT id, length(payload), md5(payload) = (SELECT md5(payload) FROM big) AS same
  FROM projcache.snapshot('big', NULL::big);
DELETE FROM big;
VACUUM big;
SELECT id, length(payload),
	   md5(payload) = (SELECT md5(string_agg(md5(i::text), '')) FROM generate_series(1, 1000) i) AS same
  FROM projcache.snapshot('big', NULL::big);

-- NULLs and several types round-trip.
SELECT projcache.create_snapshot('types', $$
	SELECT 1::int2 AS i2, NULL::int4 AS n, 3::int8 AS i8, 't'::bool AS b,
		   '2024-01-02 03:04:05+00'::timestamptz AS ts, '{"a": [1, 2]}'::jsonb AS j,
		   ARRAY['x', NULL, 'z']::text[] AS arr, 'a b'::tsvector AS tsv,
		   '\x00ff'::bytea AS by, 2.5::float8 AS f, 'NaN'::numeric AS nan,
		   '(1,2)'::point AS pt$$);
SET TimeZone = 'UTC';
SELECT * FROM projcache.snapshot('types') AS t(i2 int2, n int4, i8 int8, b bool,
	ts timestamptz, j jsonb, arr text[], tsv tsvector, by bytea, f float8, nan numeric, pt point);
RESET TimeZone;

SELECT projcache.drop_snapshot(name) FROM projcache.snapshots
 WHERE name IN ('items', 'items_ex', 'items_cold', 'quoted', 'big', 'types');
RESET search_path;
DROP SCHEMA snap_typed CASCADE;
