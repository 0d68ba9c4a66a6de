--
-- Bad input: NULL gives NULL, anything else a clear error with a proper
-- SQLSTATE, never XX000.
--
SELECT projcache.get(NULL) IS NULL AS null_key;
SELECT projcache.get(NULL, '1s') IS NULL AS null_key_wait;
SELECT projcache.get('bad-1', NULL) IS NULL AS null_wait;
SELECT count(*) AS lookup_null_rows FROM projcache.lookup(NULL);
SELECT projcache.invalidate(NULL) IS NULL AS invalidate_null,
	   projcache.evict(NULL) IS NULL AS evict_null;

SELECT sqlstate_of($$SELECT projcache.get('')$$);
SELECT sqlstate_of($$SELECT projcache.get('', '1s')$$);
SELECT sqlstate_of($$SELECT * FROM projcache.lookup('')$$);
SELECT sqlstate_of($$SELECT projcache.fetch('')$$);
SELECT sqlstate_of($$SELECT projcache.invalidate('')$$);
SELECT sqlstate_of($$SELECT projcache.evict('')$$);
SELECT sqlstate_of($$SELECT projcache.get(repeat('x', 1025))$$);
SELECT sqlstate_of($$SELECT projcache.fetch(repeat('é', 513))$$);
SELECT sqlstate_of($$SELECT projcache.get('bad-1', '-1s')$$);
SELECT sqlstate_of($$SELECT * FROM projcache.lookup('bad-1', '-1 day')$$);
SELECT sqlstate_of($$SELECT projcache.debug_advance_clock('-1s')$$);
SELECT sqlstate_of($$SELECT projcache.debug_advance_clock('1 day')$$);

-- The longest key is fine, and so is any UTF-8.
SELECT projcache.get(repeat('x', 1024)) IS NULL AS longest_key_pending;
INSERT INTO upstream VALUES ('ключ-😀', 'enabled', 'r1', '{"ok": true}');
SELECT projcache.get('ключ-😀', '10s');
SELECT length(key) FROM projcache.entries WHERE key = repeat('x', 1024);
