--
-- Revisions: the fetch function gets the cached revision and may answer
-- not_modified, which keeps the value and makes it fresh again.
--
INSERT INTO upstream VALUES ('nm-1', 'enabled', 'r7', '{"n": 1}');
SELECT projcache.get('nm-1', '10s');
SELECT not_modified AS not_modified_before FROM projcache.stats \gset

SELECT projcache.debug_advance_clock('301s');
SELECT freshness, config FROM projcache.lookup('nm-1');	-- stale, refetch asked
SELECT wait_for($$(SELECT freshness = 'fresh' FROM projcache.lookup('nm-1'))$$);
SELECT state, freshness, revision, config, age < '1s' AS age_refreshed
  FROM projcache.lookup('nm-1');

-- The second call passed revision r7 along, and was answered not_modified.
SELECT keys, revisions FROM calls WHERE keys = ARRAY['nm-1'] ORDER BY id;
SELECT not_modified > :not_modified_before AS counted FROM projcache.stats;
