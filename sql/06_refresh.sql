--
-- Refresh interval: honoured only strictly between expiry and
-- expiry + grace; a refresh does not push the eviction time.
--
ALTER SYSTEM SET projcache.expiry = '10s';
ALTER SYSTEM SET projcache.grace_period = '10s';
ALTER SYSTEM SET projcache.refresh_interval = '15s';
SELECT reload_and_wait();

INSERT INTO upstream VALUES ('ref-1', 'enabled', 'r1', '{"r": 1}');
SELECT projcache.get('ref-1', '10s');
SELECT refresh_in BETWEEN '14s' AND '15s' AS refresh_scheduled,
	   expires_in BETWEEN '19s' AND '20s' AS eviction_scheduled
  FROM projcache.entries WHERE key = 'ref-1';
SELECT refreshes AS refreshes_before FROM projcache.stats \gset

-- After 15 s the worker refreshes the key by itself, without a read.
UPDATE upstream SET revision = 'r2', config = '{"r": 2}' WHERE key = 'ref-1';
SELECT projcache.debug_advance_clock('15s');
SELECT wait_for($$(SELECT revision = 'r2' FROM projcache.entries WHERE key = 'ref-1')$$);
SELECT refreshes > :refreshes_before AS refresh_counted FROM projcache.stats;
-- The refresh did not move the eviction: it is still 20 s after the fetch.
SELECT expires_in <= '5s' AS eviction_not_pushed,
	   refresh_in BETWEEN '14s' AND '15s' AS next_refresh
  FROM projcache.entries WHERE key = 'ref-1';
SELECT projcache.debug_advance_clock('6s');
SELECT wait_for($$NOT EXISTS (SELECT FROM projcache.entries WHERE key = 'ref-1')$$);

-- An interval outside (expiry, expiry + grace) is ignored (the worker logs
-- a WARNING): no refresh is scheduled.
ALTER SYSTEM SET projcache.refresh_interval = '5s';
SELECT reload_and_wait();
INSERT INTO upstream VALUES ('ref-2', 'enabled', 'r1', '{"r": 1}');
SELECT projcache.get('ref-2', '10s');
SELECT refresh_in IS NULL AS no_refresh FROM projcache.entries WHERE key = 'ref-2';
ALTER SYSTEM SET projcache.refresh_interval = '20s';	-- equal to expiry + grace
SELECT reload_and_wait();
SELECT projcache.invalidate('ref-2');
SELECT wait_for($$(SELECT age < '1s' AND freshness = 'fresh' FROM projcache.lookup('ref-2'))$$);
SELECT refresh_in IS NULL AS no_refresh FROM projcache.entries WHERE key = 'ref-2';

ALTER SYSTEM RESET projcache.expiry;
ALTER SYSTEM RESET projcache.grace_period;
ALTER SYSTEM RESET projcache.refresh_interval;
SELECT reload_and_wait();
