--
-- Cold keys: pending, then fetched; unknown upstream keys are disabled.
--
INSERT INTO upstream VALUES ('cold-1', 'enabled', 'r1', '{"plan": "pro"}');

-- A cold key is pending: NULL at once, never blocks.
SELECT projcache.get('cold-1') IS NULL AS pending_is_null;
SELECT state, freshness, config, fetched_at IS NULL AS never_fetched
  FROM projcache.lookup('cold-1');

-- Waiting for it returns the config once the worker has fetched it.
SELECT projcache.get('cold-1', '10s');
SELECT state, freshness, revision, config, age < '1s' AS young, last_error
  FROM projcache.lookup('cold-1');

-- A plain get is now a hit.
SELECT projcache.get('cold-1');

-- A key the upstream does not know is disabled: cached, but NULL.
SELECT state, freshness, config FROM projcache.lookup('cold-unknown', '10s');
SELECT projcache.get('cold-unknown') IS NULL AS disabled_is_null;

-- A disabled key in the upstream is disabled here too.
INSERT INTO upstream VALUES ('cold-off', 'disabled', 'r1', NULL);
SELECT state, config FROM projcache.lookup('cold-off', '10s');

-- The fetch function was asked for each key once, with no revision.
SELECT keys, revisions FROM calls
 WHERE keys && ARRAY['cold-1', 'cold-unknown', 'cold-off'] ORDER BY id;

SELECT key, state, freshness, fetch_state, revision, value_bytes > 0 AS has_bytes,
	   attempts, last_error
  FROM projcache.entries WHERE key LIKE 'cold-%' ORDER BY key;
