--
-- debug_check_map(): the key map's invariants checked, for tests (it needs
-- projcache.debug_clock = on, as test/regress.conf sets it, and a
-- superuser).  It raises data_corrupted at the first one broken and
-- returns what the map holds: its partitions, entries, buckets and the
-- keys' memory_used, which its charges add up to.
--

-- An empty map: the tests before this one leave keys; evict them.
SELECT count(projcache.evict(key)) >= 0 AS evicted FROM projcache.entries;
SELECT wait_for('(SELECT count(*) = 0 FROM projcache.entries)', 30);
SELECT partitions, entries, buckets >= partitions * 16 AS buckets,
	   memory_used >= buckets * 4 AS memory_used_covers_buckets
  FROM projcache.debug_check_map();

-- Keys: small values, values large enough to be split in two chunks, a
-- key whose fetch failed (its message), and enough keys to make some
-- partitions double their buckets.
INSERT INTO upstream
	SELECT 'map-' || i, 'enabled', 'r' || i,
		   CASE WHEN i % 10 = 0
				THEN jsonb_build_object('blob', repeat('x', 3000 + i))
				ELSE jsonb_build_object('i', i) END
	  FROM generate_series(1, 5000) i;
SELECT count(projcache.get('map-' || i)) AS cached_at_once
  FROM generate_series(1, 5000) i;
SELECT wait_for($$(SELECT count(*) = 5000 FROM projcache.entries
				   WHERE key LIKE 'map-%' AND fetch_state = 'complete')$$, 60);
UPDATE behaviour SET mode = 'error';
SELECT projcache.get('map-failed');
SELECT wait_for($$(SELECT last_error IS NOT NULL FROM projcache.entries
				   WHERE key = 'map-failed')$$);
UPDATE behaviour SET mode = 'normal';
SELECT m.partitions, m.entries, m.entries = e.n AS entries_match,
	   m.buckets > m.partitions * 16 AS some_buckets_doubled
  FROM projcache.debug_check_map() m,
	   (SELECT count(*) AS n FROM projcache.entries) e;

-- Invalidated keys are refetched (their chunks replaced), evicted ones
-- deleted.
UPDATE upstream SET revision = revision || 'b' WHERE key LIKE 'map-1%';
SELECT count(projcache.invalidate('map-' || i)) AS invalidated
  FROM generate_series(1, 1999) i WHERE i::text LIKE '1%';
SELECT wait_for($$(SELECT bool_and(revision LIKE '%b') FROM projcache.entries
				   WHERE key LIKE 'map-1%')$$, 60);
SELECT count(projcache.evict('map-' || i)) AS evicted
  FROM generate_series(2001, 5000) i;
SELECT m.entries, m.entries = e.n AS entries_match
  FROM projcache.debug_check_map() m,
	   (SELECT count(*) AS n FROM projcache.entries) e;

-- Superusers only, whatever is granted.
CREATE ROLE map_checker;
GRANT USAGE ON SCHEMA projcache TO map_checker;
GRANT EXECUTE ON FUNCTION projcache.debug_check_map() TO map_checker;
SET ROLE map_checker;
SELECT sqlstate_of('SELECT projcache.debug_check_map()');
RESET ROLE;
REVOKE ALL ON FUNCTION projcache.debug_check_map() FROM map_checker;
REVOKE USAGE ON SCHEMA projcache FROM map_checker;
DROP ROLE map_checker;

SELECT count(projcache.evict(key)) AS evicted FROM projcache.entries
 WHERE key LIKE 'map-%';
DELETE FROM upstream WHERE key LIKE 'map-%';
