--
-- invalidate() committed while a fetch of the key runs.  The answer that
-- fetch brings was read before the change: storing it must leave the key
-- stale until the refetch the commit asked for, never fresh with the old
-- value.  The fetch function reads, then waits on an advisory lock that
-- this session holds, so each step happens in a known order.
--
SELECT current_setting('projcache.fetch_function') AS saved_fetch_function \gset

CREATE TABLE race_src (key text PRIMARY KEY, gen int NOT NULL);
INSERT INTO race_src VALUES ('race-1', 1);

-- After reading generation g, wait for advisory lock 1000 + g (shared).
CREATE FUNCTION race_fetch(keys text[], revisions text[])
RETURNS TABLE(key text, state text, revision text, config jsonb)
LANGUAGE plpgsql AS $$
DECLARE
	g int;
BEGIN
	SELECT s.gen INTO g FROM race_src s WHERE s.key = 'race-1';
	RETURN QUERY SELECT k, 'enabled'::text, g::text, jsonb_build_object('gen', g)
		FROM unnest(keys) AS k WHERE k = 'race-1';
	IF g >= 2 THEN
		PERFORM pg_advisory_xact_lock_shared(1000 + g);
	END IF;
END $$;

-- Is a fetch waiting for lock 1000 + g?
CREATE FUNCTION race_waiting(g int) RETURNS boolean LANGUAGE sql AS $$
	SELECT EXISTS (SELECT FROM pg_locks
				    WHERE locktype = 'advisory' AND objid = 1000 + g
					  AND NOT granted)
$$;

ALTER SYSTEM SET projcache.fetch_function = 'public.race_fetch';
SELECT reload_and_wait();
SELECT projcache.get('race-1', '10s');

SELECT pg_advisory_lock(1002), pg_advisory_lock(1003);
-- Generation 2 committed: its fetch reads it, then waits.
UPDATE race_src SET gen = 2;
SELECT projcache.invalidate('race-1');
SELECT wait_for('race_waiting(2)');
-- Generation 3 committed while that fetch runs.
UPDATE race_src SET gen = 3;
SELECT projcache.invalidate('race-1');
-- The fetch stores generation 2; the refetch reads 3, then waits.
SELECT pg_advisory_unlock(1002);
SELECT wait_for($$race_waiting(3) AND
	(SELECT revision = '2' FROM projcache.entries WHERE key = 'race-1')$$);
-- Generation 2 is not the source's any more: stale, not fresh.
SELECT freshness, config FROM projcache.lookup('race-1');
SELECT pg_advisory_unlock(1003);
SELECT wait_for($$(SELECT revision = '3' AND fetch_state = 'complete'
					FROM projcache.entries WHERE key = 'race-1')$$);
SELECT freshness, config FROM projcache.lookup('race-1');

SELECT projcache.evict('race-1');
ALTER SYSTEM SET projcache.fetch_function = :'saved_fetch_function';
SELECT reload_and_wait();
DROP FUNCTION race_waiting(int);
DROP FUNCTION race_fetch(text[], text[]);
DROP TABLE race_src;
