\set k random(1, 1000)
SELECT projcache.invalidate('key-' || :k);
