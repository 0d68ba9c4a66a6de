--
-- Snapshot cache, a failing source: last-good serving after a first success
-- (one query per TTL while it fails), cold-start failures and their
-- throttling (SQLSTATE PC001), refresh_snapshot() failures, and a failing
-- query never aborting the caller's transaction.
--
CREATE SCHEMA snap_fail;
SET search_path = snap_fail, public;

CREATE TABLE src (id int PRIMARY KEY, label text NOT NULL);
INSERT INTO src VALUES (1, 'one'), (2, 'two');
-- Whether the source is down.
CREATE TABLE ctl (fail boolean NOT NULL);
INSERT INTO ctl VALUES (false);
CREATE SEQUENCE calls_seq;

-- Counts every call, failed ones too (nextval is not rolled back).
CREATE FUNCTION source() RETURNS SETOF src LANGUAGE plpgsql AS $$
BEGIN
	PERFORM pg_catalog.nextval('snap_fail.calls_seq');
	IF (SELECT c.fail FROM snap_fail.ctl c) THEN
		RAISE EXCEPTION 'source is down';
	END IF;
	RETURN QUERY SELECT s.id, s.label FROM snap_fail.src s ORDER BY s.id;
END $$;

CREATE FUNCTION calls() RETURNS bigint LANGUAGE sql AS $$
	SELECT CASE WHEN is_called THEN last_value ELSE 0 END
	  FROM snap_fail.calls_seq $$;

--
-- A source that fails after a first success.
--
SELECT projcache.create_snapshot('after', 'SELECT * FROM snap_fail.source()', '60s');
SELECT * FROM projcache.snapshot('after') AS t(id int, label text) ORDER BY id;
SELECT calls();

UPDATE ctl SET fail = true;
INSERT INTO src VALUES (3, 'three');
SELECT projcache.debug_advance_clock('61s');

-- One attempt: a WARNING naming the snapshot and its age, the last good rows.
SELECT * FROM projcache.snapshot('after') AS t(id int, label text) ORDER BY id;
SELECT calls();
SELECT rows, loaded_at IS NOT NULL AS has_loaded_at, age >= '61s' AS aged,
	   refresh_errors, last_error, status
  FROM projcache.snapshots WHERE name = 'after';

-- Within the TTL after that attempt: no query, no WARNING, the same rows.
SELECT * FROM projcache.snapshot('after') AS t(id int, label text) ORDER BY id;
SELECT projcache.debug_advance_clock('59s');
SELECT * FROM projcache.snapshot('after') AS t(id int, label text) ORDER BY id;
SELECT calls();
SELECT refresh_errors, status FROM projcache.snapshots WHERE name = 'after';

-- A TTL after the failed attempt: one more attempt, failing again; the age
-- keeps growing from the last success.
SELECT projcache.debug_advance_clock('2s');
SELECT * FROM projcache.snapshot('after') AS t(id int, label text) ORDER BY id;
SELECT * FROM projcache.snapshot('after') AS t(id int, label text) ORDER BY id;
SELECT calls();
SELECT rows, age >= '122s' AS aged, refresh_errors, last_error, status
  FROM projcache.snapshots WHERE name = 'after';

-- The source comes back: picked up by the next attempt, a TTL after the
-- last failed one (not before: no query until then).
UPDATE ctl SET fail = false;
SELECT * FROM projcache.snapshot('after') AS t(id int, label text) ORDER BY id;
SELECT calls();
SELECT projcache.debug_advance_clock('61s');
SELECT * FROM projcache.snapshot('after') AS t(id int, label text) ORDER BY id;
SELECT calls();
-- refresh_errors counts since the snapshot was created; last_error clears.
SELECT rows, age < '1s' AS young, refresh_errors, last_error, status
  FROM projcache.snapshots WHERE name = 'after';

--
-- A cold start against a failing source: SQLSTATE PC001, with the source's
-- error as the detail.
--
UPDATE ctl SET fail = true;
SELECT projcache.create_snapshot('cold', 'SELECT * FROM snap_fail.source()', '60s');
SELECT * FROM projcache.snapshot('cold') AS t(id int, label text);
\echo SQLSTATE :LAST_ERROR_SQLSTATE
SELECT calls();
SELECT rows, loaded_at IS NULL AS no_loaded_at, age IS NULL AS no_age,
	   last_attempt_at IS NOT NULL AS attempted, refresh_errors, last_error, status
  FROM projcache.snapshots WHERE name = 'cold';

-- A second call inside the window does not query: the same SQLSTATE, and
-- when a retry is possible.
SELECT * FROM projcache.snapshot('cold') AS t(id int, label text);
\echo SQLSTATE :LAST_ERROR_SQLSTATE
SELECT calls();

-- The source is back, but the window is not over: still no query.
UPDATE ctl SET fail = false;
SELECT projcache.debug_advance_clock('30s');
SELECT * FROM projcache.snapshot('cold') AS t(id int, label text);
\echo SQLSTATE :LAST_ERROR_SQLSTATE
SELECT calls();
SELECT refresh_errors, status FROM projcache.snapshots WHERE name = 'cold';

-- After the window, the retry loads it.
SELECT projcache.debug_advance_clock('31s');
SELECT * FROM projcache.snapshot('cold') AS t(id int, label text) ORDER BY id;
SELECT calls();
SELECT * FROM projcache.snapshot('cold') AS t(id int, label text) ORDER BY id;
SELECT calls();
SELECT rows, loaded_at IS NOT NULL AS has_loaded_at, refresh_errors, last_error, status
  FROM projcache.snapshots WHERE name = 'cold';

-- A cold start that fails in a transaction raises PC001 like any ERROR; a
-- client retries on it (here, from a savepoint).
UPDATE ctl SET fail = true;
SELECT projcache.create_snapshot('cold2', 'SELECT * FROM snap_fail.source()', '1h');
BEGIN;
SAVEPOINT s;
SELECT * FROM projcache.snapshot('cold2') AS t(id int, label text);
ROLLBACK TO SAVEPOINT s;
SELECT * FROM projcache.snapshot('cold2') AS t(id int, label text);
ROLLBACK TO SAVEPOINT s;
SELECT count(*) FROM src;
COMMIT;
SELECT calls();

--
-- refresh_snapshot() against a failing source: false, and the last good
-- snapshot stays.
--
UPDATE ctl SET fail = false;
SELECT projcache.create_snapshot('manual', 'SELECT * FROM snap_fail.source()', '1h');
SELECT projcache.refresh_snapshot('manual');
UPDATE src SET label = 'deux' WHERE id = 2;
SELECT projcache.refresh_snapshot('manual');
SELECT * FROM projcache.snapshot('manual') AS t(id int, label text) ORDER BY id;
SELECT calls();

UPDATE ctl SET fail = true;
SELECT projcache.refresh_snapshot('manual');
SELECT calls();
SELECT * FROM projcache.snapshot('manual') AS t(id int, label text) ORDER BY id;
SELECT calls();
SELECT rows, refresh_errors, last_error, status
  FROM projcache.snapshots WHERE name = 'manual';

-- The query's ERROR never aborts the caller's transaction: neither in
-- refresh_snapshot() nor in a refresh done by snapshot().
BEGIN;
SELECT count(*) FROM src;
SELECT projcache.refresh_snapshot('manual');
SELECT projcache.debug_advance_clock('1h');
SELECT * FROM projcache.snapshot('manual') AS t(id int, label text) ORDER BY id;
INSERT INTO src VALUES (4, 'four');
SELECT count(*) FROM src;
COMMIT;
SELECT id, label FROM src WHERE id = 4;
SELECT calls();
SELECT refresh_errors, status FROM projcache.snapshots WHERE name = 'manual';

-- A transaction that has written never loads: its uncommitted rows must not
-- reach other sessions.  It gets the last good rows, without a refresh.
BEGIN;
UPDATE src SET label = 'UNCOMMITTED';
SELECT sqlstate_of($$SELECT projcache.refresh_snapshot('manual')$$);
SELECT projcache.debug_advance_clock('1h');
SELECT * FROM projcache.snapshot('manual') AS t(id int, label text) ORDER BY id;
ROLLBACK;
SELECT calls();

-- The same for an ERROR raised mid-scan, after some rows were produced.
SELECT projcache.create_snapshot('divzero',
	'SELECT 1 / (i - 3) AS x FROM pg_catalog.generate_series(1, 5) i', '60s');
BEGIN;
SELECT projcache.refresh_snapshot('divzero');
SELECT 'transaction still usable' AS ok;
COMMIT;
-- That failed attempt opened the cold-start window: no new attempt in it.
SELECT * FROM projcache.snapshot('divzero') AS t(x int);
\echo SQLSTATE :LAST_ERROR_SQLSTATE
SELECT projcache.debug_advance_clock('61s');
SELECT * FROM projcache.snapshot('divzero') AS t(x int);
\echo SQLSTATE :LAST_ERROR_SQLSTATE
SELECT rows, refresh_errors, last_error, status
  FROM projcache.snapshots WHERE name = 'divzero';

SELECT projcache.drop_snapshot(name) FROM projcache.snapshots
 WHERE name IN ('after', 'cold', 'cold2', 'manual', 'divzero');
RESET search_path;
DROP SCHEMA snap_fail CASCADE;
