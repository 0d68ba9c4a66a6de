\set k random(1, :keys)
SELECT projcache.get('key-' || :k);
