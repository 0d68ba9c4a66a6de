--
-- Snapshot loads and the caller's statement: a cancel or statement timeout
-- during a load ends the statement (it is not a source failure, and does
-- not close the cold-start window), and a load leaves nothing behind in
-- the caller's transaction.
--
CREATE SCHEMA snapcancel;
SET search_path = snapcancel, public;

CREATE TABLE snapcancel.slow_flag (slow boolean NOT NULL);
INSERT INTO snapcancel.slow_flag VALUES (true);
CREATE FUNCTION snapcancel.rows() RETURNS SETOF int LANGUAGE plpgsql AS $$
BEGIN
	IF (SELECT f.slow FROM snapcancel.slow_flag f) THEN
		PERFORM pg_catalog.pg_sleep(5);
	END IF;
	RETURN QUERY SELECT pg_catalog.generate_series(1, 3);
END $$;
SELECT projcache.create_snapshot('slowload', 'SELECT snapcancel.rows() AS x', '1h');

-- The caller's statement_timeout ends the statement like any other.
SET statement_timeout = '200ms';
SELECT * FROM projcache.snapshot('slowload') AS t(x int);
RESET statement_timeout;
SELECT status, refresh_errors, last_error FROM projcache.snapshots
 WHERE name = 'slowload';

-- That was no source failure: the next read loads at once, not throttled
-- for the hour of its TTL.
UPDATE snapcancel.slow_flag SET slow = false;
SELECT * FROM projcache.snapshot('slowload') AS t(x int);
SELECT status, refresh_errors FROM projcache.snapshots WHERE name = 'slowload';

-- A query with side effects: its writes are rolled back after the load.
CREATE TABLE snapcancel.side_effects (n int);
CREATE FUNCTION snapcancel.writes() RETURNS int LANGUAGE plpgsql AS $$
BEGIN
	INSERT INTO snapcancel.side_effects VALUES (1);
	RETURN 42;
END $$;
SELECT projcache.create_snapshot('sidefx', 'SELECT snapcancel.writes() AS x');
SELECT * FROM projcache.snapshot('sidefx') AS t(x int);
SELECT count(*) AS rows_left_behind FROM snapcancel.side_effects;

SELECT projcache.drop_snapshot('slowload');
SELECT projcache.drop_snapshot('sidefx');
RESET search_path;
DROP SCHEMA snapcancel CASCADE;
