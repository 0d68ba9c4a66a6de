--
-- Freshness: fresh below expiry (300 s), stale until expiry + grace (420 s),
-- then expired; stale values are served while a refetch runs; keys nobody
-- reads are evicted at expiry + grace.
--
INSERT INTO upstream VALUES ('st-1', 'enabled', 'r1', '{"s": 1}'),
	('st-2', 'enabled', 'r1', '{"s": 2}');
SELECT projcache.get('st-1', '10s'), projcache.get('st-2', '10s');
SELECT evictions AS evictions_before FROM projcache.stats \gset
SELECT count(*) AS calls_before FROM calls WHERE keys = ARRAY['st-1'] \gset

-- Not yet stale: no refetch.
SELECT projcache.debug_advance_clock('299s');
SELECT freshness, config FROM projcache.lookup('st-1');
SELECT pg_sleep(0.2);
SELECT count(*) - :calls_before AS new_calls FROM calls WHERE keys = ARRAY['st-1'];

-- Stale: the old value is served, and reading it fetches it again.
UPDATE upstream SET revision = 'r2', config = '{"s": 10}' WHERE key = 'st-1';
SELECT projcache.debug_advance_clock('2s');
SELECT freshness, config FROM projcache.lookup('st-1');
SELECT wait_for($$(SELECT revision = 'r2' FROM projcache.entries WHERE key = 'st-1')$$);
SELECT freshness, config FROM projcache.lookup('st-1');

-- st-2 was not read: at expiry + grace it is evicted.
SELECT projcache.debug_advance_clock('118s');
SELECT pg_sleep(0.2);
SELECT count(*) AS st2_still_there FROM projcache.entries WHERE key = 'st-2';
SELECT projcache.debug_advance_clock('2s');
SELECT wait_for($$NOT EXISTS (SELECT FROM projcache.entries WHERE key = 'st-2')$$);
SELECT evictions > :evictions_before AS eviction_counted FROM projcache.stats;

-- Read again, it is a cold key.
SELECT state FROM projcache.lookup('st-2');
SELECT projcache.get('st-2', '10s');

-- A stored instant reads the same every time.
SELECT fetched_at AS st2_fetched_at FROM projcache.entries WHERE key = 'st-2' \gset
SELECT pg_sleep(0.05);
SELECT fetched_at = :'st2_fetched_at' AS fetched_at_same_in_entries
  FROM projcache.entries WHERE key = 'st-2';
SELECT fetched_at = :'st2_fetched_at' AS fetched_at_same_in_lookup
  FROM projcache.lookup('st-2');

-- A new expiry applies to cached keys: their eviction moves with it.
SELECT extract(epoch FROM expires_in) AS st2_expires_in
  FROM projcache.entries WHERE key = 'st-2' \gset
ALTER SYSTEM SET projcache.expiry = '10min';
SELECT reload_and_wait();
-- (expires_in counts down between the two reads: allow a few seconds)
SELECT abs(extract(epoch FROM expires_in) - :st2_expires_in - 300) < 5 AS eviction_moved_300s,
       freshness
  FROM projcache.entries WHERE key = 'st-2';
ALTER SYSTEM RESET projcache.expiry;
SELECT reload_and_wait();
SELECT abs(extract(epoch FROM expires_in) - :st2_expires_in) < 5 AS eviction_moved_back
  FROM projcache.entries WHERE key = 'st-2';
