--
-- "pending" answers: the old value stays, retries back off (0, 1 s, 1.5 s...).
--
INSERT INTO upstream VALUES ('pend-1', 'pending', NULL, NULL);

-- A key the upstream reports pending stays pending.  The first retry is
-- immediate, the second waits 1 s on projcache's clock.
SELECT projcache.fetch('pend-1');
SELECT wait_for($$(SELECT attempts >= 2 FROM projcache.entries WHERE key = 'pend-1')$$);
SELECT pg_sleep(0.3);
-- While it waits out its backoff it shows as such, with the time of the
-- next attempt and why it is pending.
SELECT state, fetch_state, attempts, next_attempt_at > now() AS next_attempt_later,
       last_error
  FROM projcache.entries WHERE key = 'pend-1';
SELECT pending_reads AS pending_reads_before FROM projcache.stats \gset
SELECT projcache.get('pend-1') IS NULL AS still_null;
SELECT projcache.get('pend-1', '10ms') IS NULL AS still_null_after_waiting;
SELECT pending_reads - :pending_reads_before AS pending_reads_counted FROM projcache.stats;

-- 1 s later the third attempt runs, then the backoff grows to 1.5 s.
SELECT projcache.debug_advance_clock('1s');
SELECT wait_for($$(SELECT attempts >= 3 FROM projcache.entries WHERE key = 'pend-1')$$);
SELECT projcache.debug_advance_clock('1s');
SELECT pg_sleep(0.3);
SELECT attempts FROM projcache.entries WHERE key = 'pend-1';
SELECT projcache.debug_advance_clock('600ms');
SELECT wait_for($$(SELECT attempts >= 4 FROM projcache.entries WHERE key = 'pend-1')$$);

-- Once the upstream has it, the next retry completes the key.
UPDATE upstream SET state = 'enabled', revision = 'r1', config = '{"v": 1}'
 WHERE key = 'pend-1';
SELECT projcache.debug_advance_clock('3s');
SELECT projcache.get('pend-1', '10s');
SELECT state, fetch_state, attempts, next_attempt_at, last_error
  FROM projcache.entries WHERE key = 'pend-1';

-- A pending answer for a cached key keeps the old value.
INSERT INTO upstream VALUES ('pend-2', 'enabled', 'r1', '{"v": "old"}');
SELECT projcache.get('pend-2', '10s');
UPDATE upstream SET state = 'pending' WHERE key = 'pend-2';
SELECT projcache.debug_advance_clock('301s');	-- stale: the next read refetches
SELECT projcache.get('pend-2');
SELECT wait_for($$(SELECT attempts >= 2 FROM projcache.entries WHERE key = 'pend-2')$$);
SELECT projcache.get('pend-2');
SELECT state, freshness, revision FROM projcache.lookup('pend-2');

-- Recovery: the retry after the backoff brings the new value.
UPDATE upstream SET state = 'enabled', revision = 'r2', config = '{"v": "new"}'
 WHERE key = 'pend-2';
SELECT projcache.debug_advance_clock('2s');
SELECT wait_for($$(SELECT revision = 'r2' FROM projcache.entries WHERE key = 'pend-2')$$);
SELECT projcache.get('pend-2');
SELECT state, freshness, attempts FROM projcache.entries WHERE key = 'pend-2';
