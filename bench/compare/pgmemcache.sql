\set k random(1, 1000)
SELECT memcache_get('key-' || :k);
