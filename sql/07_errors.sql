--
-- A fetch function that fails or breaks its contract: the error is caught
-- in the worker, recorded as last_error, the old value keeps serving, and
-- the worker lives on.
--
INSERT INTO upstream VALUES ('err-1', 'enabled', 'r1', '{"e": 1}');
SELECT projcache.get('err-1', '10s');
SELECT worker_pid AS pid_before, fetch_errors AS errors_before FROM projcache.stats \gset

-- Each failure mode in turn: invalidate err-1 (an immediate refetch) and
-- show what the cache holds afterwards.
CREATE VIEW cache_view AS
	SELECT b.mode, e.last_error, projcache.get('err-1') AS config, e.freshness,
		   (SELECT s.worker_pid IS NOT NULL FROM projcache.stats s) AS worker_alive
	  FROM projcache.entries e, behaviour b WHERE e.key = 'err-1';

UPDATE behaviour SET mode = 'error';
SELECT projcache.invalidate('err-1');
SELECT wait_for($$(SELECT last_error LIKE '%exploded%' FROM projcache.entries WHERE key = 'err-1')$$);
SELECT * FROM cache_view;

UPDATE behaviour SET mode = 'unknown_state';
SELECT projcache.invalidate('err-1');
SELECT wait_for($$(SELECT last_error LIKE '%unknown state%' FROM projcache.entries WHERE key = 'err-1')$$);
SELECT * FROM cache_view;

UPDATE behaviour SET mode = 'null_key';
SELECT projcache.invalidate('err-1');
SELECT wait_for($$(SELECT last_error LIKE '%NULL key%' FROM projcache.entries WHERE key = 'err-1')$$);
SELECT * FROM cache_view;

UPDATE behaviour SET mode = 'extra_key';
SELECT projcache.invalidate('err-1');
SELECT wait_for($$(SELECT last_error LIKE '%not asked for%' FROM projcache.entries WHERE key = 'err-1')$$);
SELECT * FROM cache_view;

UPDATE behaviour SET mode = 'duplicate';
SELECT projcache.invalidate('err-1');
SELECT wait_for($$(SELECT last_error LIKE '%more than once%' FROM projcache.entries WHERE key = 'err-1')$$);
SELECT * FROM cache_view;

-- Past fetch_timeout the call is cancelled.
ALTER SYSTEM SET projcache.fetch_timeout = '200ms';
SELECT reload_and_wait();
UPDATE behaviour SET mode = 'sleep';
SELECT projcache.invalidate('err-1');
SELECT wait_for($$(SELECT last_error LIKE '%fetch_timeout%' FROM projcache.entries WHERE key = 'err-1')$$);
SELECT * FROM cache_view;
ALTER SYSTEM RESET projcache.fetch_timeout;
SELECT reload_and_wait();

-- The same worker handled all of it, and each failure was counted.
SELECT worker_pid = :pid_before AS same_worker,
	   fetch_errors - :errors_before >= 6 AS errors_counted
  FROM projcache.stats;

-- While the upstream fails, an expired key is still served, not evicted.
UPDATE behaviour SET mode = 'error';
SELECT projcache.debug_advance_clock('421s');
SELECT pg_sleep(0.2);
SELECT state, freshness, config FROM projcache.lookup('err-1');

-- Recovery.
UPDATE behaviour SET mode = 'normal';
UPDATE upstream SET revision = 'r2', config = '{"e": 2}' WHERE key = 'err-1';
SELECT projcache.invalidate('err-1');
SELECT wait_for($$(SELECT revision = 'r2' FROM projcache.entries WHERE key = 'err-1')$$);
SELECT state, freshness, config, last_error FROM projcache.lookup('err-1');
