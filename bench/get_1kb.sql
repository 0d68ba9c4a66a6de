\set k random(1, 100000)
SELECT projcache.get('key-' || :k);
