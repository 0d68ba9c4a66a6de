--
-- Batching: 2,000 cold keys are fetched in ceil(2000 / batch_size) calls.
--
-- Gather long enough that only a full batch goes out early.
ALTER SYSTEM SET projcache.batch_interval = '5s';
SELECT reload_and_wait();

INSERT INTO upstream
	SELECT 'batch-' || i, 'enabled', 'r1', jsonb_build_object('i', i)
	  FROM generate_series(1, 2000) AS i;
SELECT count(projcache.fetch('batch-' || i)) FROM generate_series(1, 2000) AS i;
SELECT wait_for($$(SELECT count(*) = 2000 FROM projcache.entries
					WHERE key LIKE 'batch-%' AND state = 'enabled')$$, 30);
SELECT count(*) AS calls, sum(cardinality(keys)) AS keys,
	   max(cardinality(keys)) AS largest
  FROM calls WHERE keys[1] LIKE 'batch-%';

-- With batch_size = 300: ceil(2000 / 300) = 7 calls, the last one of 200
-- keys after batch_interval.
ALTER SYSTEM SET projcache.batch_size = 300;
ALTER SYSTEM SET projcache.batch_interval = '500ms';
SELECT reload_and_wait();
INSERT INTO upstream
	SELECT 'batch2-' || i, 'enabled', 'r1', jsonb_build_object('i', i)
	  FROM generate_series(1, 2000) AS i;
SELECT count(projcache.fetch('batch2-' || i)) FROM generate_series(1, 2000) AS i;
SELECT wait_for($$(SELECT count(*) = 2000 FROM projcache.entries
					WHERE key LIKE 'batch2-%' AND state = 'enabled')$$, 30);
SELECT count(*) AS calls, sum(cardinality(keys)) AS keys,
	   max(cardinality(keys)) AS largest
  FROM calls WHERE keys[1] LIKE 'batch2-%';

SELECT projcache.get('batch-1234'), projcache.get('batch2-42');

ALTER SYSTEM RESET projcache.batch_size;
ALTER SYSTEM RESET projcache.batch_interval;
SELECT reload_and_wait();
