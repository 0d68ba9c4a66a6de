--
-- Snapshot cache: cold load, the fast path within the TTL, the refresh after
-- it, refresh_snapshot(), the projcache.snapshots view, drop and re-create.
--
-- The source is a table behind a function that counts its calls in a
-- sequence: nextval() works in the snapshot's read-only query and is not
-- undone when a load's subtransaction rolls back.  Snapshot queries run with
-- search_path = pg_catalog, pg_temp, so the function qualifies every name.
--
CREATE SCHEMA snap_basic;
SET search_path = snap_basic, public;

CREATE TABLE src (id int PRIMARY KEY, label text NOT NULL);
INSERT INTO src VALUES (1, 'one'), (2, 'two');
CREATE SEQUENCE calls_seq;

CREATE FUNCTION source() RETURNS SETOF src LANGUAGE plpgsql AS $$
BEGIN
	PERFORM pg_catalog.nextval('snap_basic.calls_seq');
	RETURN QUERY SELECT s.id, s.label FROM snap_basic.src s ORDER BY s.id;
END $$;

-- How many times the source was queried.
CREATE FUNCTION calls() RETURNS bigint LANGUAGE sql AS $$
	SELECT CASE WHEN is_called THEN last_value ELSE 0 END
	  FROM snap_basic.calls_seq $$;

SELECT projcache.create_snapshot('basic', 'SELECT * FROM snap_basic.source()', '60s');

-- Registered but cold: creating it did not run the query.
SELECT calls();
SELECT name, owner = current_user::regrole AS owned_by_me, ttl, rows, bytes,
	   loaded_at IS NULL AS no_loaded_at, age IS NULL AS no_age,
	   last_attempt_at IS NULL AS no_attempt, refresh_errors, last_error, status
  FROM projcache.snapshots WHERE name = 'basic';

-- Cold load: one query.
SELECT * FROM projcache.snapshot('basic') AS t(id int, label text) ORDER BY id;
SELECT calls();
SELECT rows, bytes > 0 AS has_bytes, loaded_at IS NOT NULL AS has_loaded_at,
	   age < '1s' AS young, last_attempt_at >= loaded_at AS attempt_not_before_load,
	   refresh_errors, last_error, status
  FROM projcache.snapshots WHERE name = 'basic';

-- Fast path: the source changes, but within the TTL the cached rows are
-- served and no query runs.
INSERT INTO src VALUES (3, 'three');
UPDATE src SET label = 'uno' WHERE id = 1;
SELECT * FROM projcache.snapshot('basic') AS t(id int, label text) ORDER BY id;
SELECT projcache.debug_advance_clock('59s');
SELECT * FROM projcache.snapshot('basic') AS t(id int, label text) ORDER BY id;
SELECT calls();
SELECT status, age >= '59s' AS aged FROM projcache.snapshots WHERE name = 'basic';

-- Past the TTL it is stale until read; the next read queries once and
-- serves the new rows.
SELECT projcache.debug_advance_clock('2s');
SELECT rows, status, age >= '61s' AS aged FROM projcache.snapshots WHERE name = 'basic';
SELECT * FROM projcache.snapshot('basic') AS t(id int, label text) ORDER BY id;
SELECT calls();
SELECT * FROM projcache.snapshot('basic') AS t(id int, label text) ORDER BY id;
SELECT calls();
SELECT rows, age < '1s' AS young, refresh_errors, last_error, status
  FROM projcache.snapshots WHERE name = 'basic';

-- refresh_snapshot() loads now, whatever the TTL, and returns true.
DELETE FROM src WHERE id = 3;
SELECT projcache.refresh_snapshot('basic');
SELECT calls();
SELECT * FROM projcache.snapshot('basic') AS t(id int, label text) ORDER BY id;
SELECT calls();
SELECT rows, status FROM projcache.snapshots WHERE name = 'basic';

-- refresh_snapshot() of a cold snapshot loads it; the next read needs no query.
SELECT projcache.create_snapshot('manual', 'SELECT * FROM snap_basic.source()', '1h');
SELECT status FROM projcache.snapshots WHERE name = 'manual';
SELECT projcache.refresh_snapshot('manual');
SELECT calls();
SELECT status, rows FROM projcache.snapshots WHERE name = 'manual';
SELECT * FROM projcache.snapshot('manual') AS t(id int, label text) ORDER BY id;
SELECT calls();

-- An empty result is a loaded snapshot, not a cold one: no query on the
-- next read.
SELECT projcache.create_snapshot('empty',
	'SELECT * FROM snap_basic.source() s WHERE s.id < 0', '60s');
SELECT calls();
SELECT * FROM projcache.snapshot('empty') AS t(id int, label text);
SELECT calls();
SELECT * FROM projcache.snapshot('empty') AS t(id int, label text);
SELECT calls();
SELECT rows, loaded_at IS NOT NULL AS has_loaded_at, status
  FROM projcache.snapshots WHERE name = 'empty';

-- The view lists this database's snapshots, by name.
SELECT name, ttl, status FROM projcache.snapshots
 WHERE name IN ('basic', 'manual', 'empty') ORDER BY name;

-- drop_snapshot() removes it from the view and from use.
SELECT projcache.drop_snapshot('basic');
SELECT count(*) FROM projcache.snapshots WHERE name = 'basic';
SELECT sqlstate_of($$SELECT * FROM projcache.snapshot('basic') AS t(id int, label text)$$);
SELECT sqlstate_of($$SELECT projcache.refresh_snapshot('basic')$$);
SELECT sqlstate_of($$SELECT projcache.drop_snapshot('basic')$$);

-- Re-created with the same name and another query (and within the TTL of
-- the rows the old one had loaded): cold, then the NEW query's rows.
SELECT * FROM projcache.snapshot('manual') AS t(id int, label text) ORDER BY id;
SELECT projcache.drop_snapshot('manual');
SELECT projcache.create_snapshot('manual',
	$$SELECT s.id, s.label || '!' AS label FROM snap_basic.src s$$, '1h');
SELECT rows, loaded_at IS NULL AS no_loaded_at, status
  FROM projcache.snapshots WHERE name = 'manual';
SELECT * FROM projcache.snapshot('manual') AS t(id int, label text) ORDER BY id;

-- Re-created with another row type: no confusion with the old rows either.
SELECT projcache.drop_snapshot('manual');
SELECT projcache.create_snapshot('manual', $$SELECT 'x'::text AS a, 42::int8 AS b$$);
SELECT * FROM projcache.snapshot('manual') AS t(a text, b int8);

-- A registration rolled back with its transaction is gone, even though it
-- was loaded meanwhile; a new one with that name serves its own rows.
BEGIN;
SELECT projcache.create_snapshot('txn', $$SELECT 'rolled back'::text AS v$$);
SELECT * FROM projcache.snapshot('txn') AS t(v text);
ROLLBACK;
SELECT sqlstate_of($$SELECT * FROM projcache.snapshot('txn') AS t(v text)$$);
SELECT projcache.create_snapshot('txn', $$SELECT 'committed'::text AS v$$);
SELECT * FROM projcache.snapshot('txn') AS t(v text);

-- A drop is rolled back with its transaction (the cached rows are not: the
-- snapshot is simply loaded again).
BEGIN;
SELECT projcache.drop_snapshot('empty');
ROLLBACK;
SELECT name, status FROM projcache.snapshots WHERE name = 'empty';
SELECT * FROM projcache.snapshot('empty') AS t(id int, label text);
SELECT calls();

SELECT projcache.drop_snapshot('manual');
SELECT projcache.drop_snapshot('empty');
SELECT projcache.drop_snapshot('txn');
SELECT count(*) FROM projcache.snapshots
 WHERE name IN ('basic', 'manual', 'empty', 'txn');
RESET search_path;
DROP SCHEMA snap_basic CASCADE;
