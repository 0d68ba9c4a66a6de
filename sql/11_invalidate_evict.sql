--
-- invalidate(): stale at once, refetched with a normal fetch, the old value
-- served meanwhile.  evict(): the worker removes the key.
--
INSERT INTO upstream VALUES ('inv-1', 'enabled', 'r1', '{"i": 1}');
SELECT projcache.get('inv-1', '10s');
SELECT projcache.invalidate('never-cached') AS unknown_key;

-- With the upstream failing, the invalidated key stays stale and served.
UPDATE behaviour SET mode = 'error';
SELECT projcache.invalidate('inv-1');
SELECT wait_for($$(SELECT last_error IS NOT NULL FROM projcache.entries WHERE key = 'inv-1')$$);
SELECT freshness, config FROM projcache.lookup('inv-1');

-- Once it answers, the new value comes in.  (A retry of the failed fetch
-- may bring it before the worker has taken the invalidation: the key then
-- stays stale until the refetch that invalidation asked for.)
UPDATE behaviour SET mode = 'normal';
UPDATE upstream SET revision = 'r2', config = '{"i": 2}' WHERE key = 'inv-1';
SELECT projcache.invalidate('inv-1');
SELECT wait_for($$(SELECT revision = 'r2' AND fetch_state = 'complete'
						  AND freshness = 'fresh'
					FROM projcache.entries WHERE key = 'inv-1')$$);
SELECT freshness, config, last_error FROM projcache.lookup('inv-1');
-- Refetches passed the revision held.
SELECT bool_or(revisions = ARRAY['r1']) AS passed_old_revision
  FROM calls WHERE keys = ARRAY['inv-1'];

-- evict
SELECT projcache.evict('inv-1');
-- evict() returns once the worker has removed it.
SELECT count(*) AS left_after_evict FROM projcache.entries WHERE key = 'inv-1';
SELECT projcache.evict('inv-1') AS evict_again;
-- A read after eviction starts over.
SELECT projcache.get('inv-1', '10s');

-- invalidate() in a transaction: the key is stale at once, but its refetch
-- is requested only at COMMIT, once the new row is visible; a fetch before
-- it would cache the old row as fresh.
INSERT INTO upstream VALUES ('inv-2', 'enabled', 'r1', '{"i": 1}');
SELECT projcache.get('inv-2', '10s');
SELECT count(*) AS calls_before FROM calls WHERE keys = ARRAY['inv-2'] \gset
BEGIN;
UPDATE upstream SET revision = 'r2', config = '{"i": 2}' WHERE key = 'inv-2';
SELECT projcache.invalidate('inv-2');
SELECT pg_sleep(0.3);
SELECT freshness, revision FROM projcache.entries WHERE key = 'inv-2';
SELECT count(*) - :calls_before AS calls_before_commit
  FROM calls WHERE keys = ARRAY['inv-2'];
COMMIT;
SELECT wait_for($$(SELECT revision = 'r2' FROM projcache.entries WHERE key = 'inv-2')$$);
SELECT freshness, config FROM projcache.lookup('inv-2');

-- A rolled-back invalidate() requests nothing; the key stays stale.
SELECT count(*) AS calls_before FROM calls WHERE keys = ARRAY['inv-2'] \gset
BEGIN;
SELECT projcache.invalidate('inv-2');
ROLLBACK;
SELECT pg_sleep(0.3);
SELECT freshness FROM projcache.entries WHERE key = 'inv-2';
SELECT count(*) - :calls_before AS calls_after_rollback
  FROM calls WHERE keys = ARRAY['inv-2'];

-- The refetch waits for the commit, so a prepared transaction (committed
-- later, maybe elsewhere) cannot carry one; nor can a parallel worker.
BEGIN;
SELECT projcache.invalidate('inv-2');
PREPARE TRANSACTION 'pc_inv';
SELECT proparallel FROM pg_proc WHERE oid = 'projcache.invalidate(text)'::regprocedure;
