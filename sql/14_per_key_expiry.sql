--
-- Expiry per key: a fetch function may return max_age and stale_for
-- (interval, found by name after the four columns): that key is fresh for
-- max_age and stale for stale_for after it, instead of projcache.expiry
-- (300 s here) and grace_period (120 s); it is evicted at their end, and
-- refresh_interval is honoured when strictly between them.  NULL, or no
-- such column, means the setting; a negative value, one longer than
-- 536870911 ms (the settings' bound) or a column of another type gets the
-- setting too, and last_error says why.
--
CREATE TABLE periods (
	key text PRIMARY KEY,
	max_age interval,
	stale_for interval
);

CREATE FUNCTION test_fetch_periods(keys text[], revisions text[])
RETURNS TABLE(key text, state text, revision text, config jsonb,
			  max_age interval, stale_for interval)
LANGUAGE plpgsql AS $$
BEGIN
	INSERT INTO calls(keys, revisions) VALUES (keys, revisions);
	IF (SELECT b.mode FROM behaviour b) = 'error' THEN
		RAISE EXCEPTION 'upstream exploded';
	END IF;
	RETURN QUERY
		SELECT t.key, t.state, t.revision, t.config, p.max_age, p.stale_for
		  FROM test_fetch(keys, revisions) AS t
		  LEFT JOIN periods p ON p.key = t.key;
END $$;

ALTER SYSTEM SET projcache.fetch_function = 'public.test_fetch_periods';
SELECT reload_and_wait();

-- What entries shows of a key; whether its eviction is due at the end of
-- its periods after a fetch just now (within 5 s: the machine may be busy).
CREATE FUNCTION periods_of(k text)
RETURNS TABLE(state text, freshness text, max_age interval,
			  stale_for interval, evicted_at_end boolean, last_error text)
LANGUAGE sql AS $$
	SELECT e.state, e.freshness, e.max_age, e.stale_for,
		   e.expires_in <= e.max_age + e.stale_for AND
		   e.expires_in > e.max_age + e.stale_for - interval '5s',
		   e.last_error
	  FROM projcache.entries e WHERE e.key = k
$$;

-- Fresh for its max_age, then stale, then refetched on a read.
INSERT INTO upstream VALUES ('pk-1', 'enabled', 'r1', '{"p": 1}');
INSERT INTO periods VALUES ('pk-1', '30s', '20s');
SELECT projcache.get('pk-1', '10s');
SELECT * FROM periods_of('pk-1');
SELECT count(*) AS calls_before FROM calls WHERE keys = ARRAY['pk-1'] \gset
SELECT projcache.debug_advance_clock('28s');
SELECT freshness, config FROM projcache.lookup('pk-1');
SELECT pg_sleep(0.2);
SELECT count(*) - :calls_before AS new_calls FROM calls WHERE keys = ARRAY['pk-1'];
UPDATE upstream SET revision = 'r2', config = '{"p": 2}' WHERE key = 'pk-1';
SELECT projcache.debug_advance_clock('3s');
SELECT freshness, config FROM projcache.lookup('pk-1');
SELECT wait_for($$(SELECT revision = 'r2' FROM projcache.entries WHERE key = 'pk-1')$$);
SELECT freshness, config FROM projcache.lookup('pk-1');

-- not_modified takes the periods given with it.
SELECT not_modified AS not_modified_before FROM projcache.stats \gset
UPDATE periods SET max_age = '40s', stale_for = '60s' WHERE key = 'pk-1';
SELECT projcache.invalidate('pk-1');
SELECT wait_for($$(SELECT max_age = '40s' FROM projcache.entries WHERE key = 'pk-1')$$);
SELECT not_modified > :not_modified_before AS answered_not_modified
  FROM projcache.stats;
SELECT * FROM periods_of('pk-1');

-- Expired after max_age + stale_for (not 420 s): while its source fails,
-- the old value is still served.
INSERT INTO upstream VALUES ('pk-exp', 'enabled', 'r1', '{"p": "exp"}');
INSERT INTO periods VALUES ('pk-exp', '20s', '30s');
SELECT projcache.get('pk-exp', '10s');
UPDATE behaviour SET mode = 'error';
SELECT projcache.invalidate('pk-exp');
SELECT wait_for($$(SELECT last_error LIKE '%exploded%' FROM projcache.entries WHERE key = 'pk-exp')$$);
SELECT projcache.debug_advance_clock('51s');
SELECT state, freshness, config FROM projcache.lookup('pk-exp');
UPDATE behaviour SET mode = 'normal';

-- A key nobody reads is evicted at the end of its own periods.
INSERT INTO upstream VALUES ('pk-ev', 'enabled', 'r1', '{"p": "ev"}');
INSERT INTO periods VALUES ('pk-ev', '20s', '30s');
SELECT projcache.get('pk-ev', '10s');
SELECT * FROM periods_of('pk-ev');
SELECT projcache.debug_advance_clock('45s');
SELECT pg_sleep(0.2);
SELECT count(*) AS pk_ev_still_there FROM projcache.entries WHERE key = 'pk-ev';
SELECT projcache.debug_advance_clock('6s');
SELECT wait_for($$NOT EXISTS (SELECT FROM projcache.entries WHERE key = 'pk-ev')$$);

-- Disabled keys too (negative caching for as long as the source says).
INSERT INTO upstream VALUES ('pk-dis', 'disabled', NULL, NULL);
INSERT INTO periods VALUES ('pk-dis', '1h', '0');
SELECT projcache.get('pk-dis', '10s');
SELECT * FROM periods_of('pk-dis');

-- refresh_interval is honoured against each key's own periods: 15 s lies
-- outside (300 s, 420 s), so keys on the settings get none (the worker
-- warns), but inside (10 s, 30 s).
INSERT INTO upstream VALUES ('pk-ref', 'enabled', 'r1', '{"p": "ref"}'),
	('pk-noref', 'enabled', 'r1', '{"p": "noref"}');
INSERT INTO periods VALUES ('pk-ref', '10s', '20s');
ALTER SYSTEM SET projcache.refresh_interval = '15s';
SELECT reload_and_wait();
SELECT projcache.get('pk-ref', '10s'), projcache.get('pk-noref', '10s');
SELECT key, refresh_in BETWEEN '14s' AND '15s' AS refresh_scheduled
  FROM projcache.entries WHERE key IN ('pk-ref', 'pk-noref') ORDER BY key;
UPDATE upstream SET revision = 'r2', config = '{"p": "ref2"}' WHERE key = 'pk-ref';
SELECT projcache.debug_advance_clock('15s');
SELECT wait_for($$(SELECT revision = 'r2' FROM projcache.entries WHERE key = 'pk-ref')$$);
ALTER SYSTEM RESET projcache.refresh_interval;
SELECT reload_and_wait();

-- Bad values: the setting applies, and last_error says why; the value is
-- stored and served all the same.
INSERT INTO upstream VALUES ('pk-neg', 'enabled', 'r1', '{"p": "neg"}'),
	('pk-null', 'enabled', 'r1', '{"p": "null"}'),
	('pk-big', 'enabled', 'r1', '{"p": "big"}'),
	('pk-huge', 'enabled', 'r1', '{"p": "huge"}'),
	('pk-zero', 'enabled', 'r1', '{"p": "zero"}');
INSERT INTO periods VALUES ('pk-neg', '-5s', '10s'),
	('pk-null', NULL, '7s'),
	('pk-big', '7 days', '1 day'),
	('pk-huge', '1 second', '-178000000 years'),
	('pk-zero', '0', '6 days');
SELECT count(projcache.get(k, '10s'))
  FROM unnest(ARRAY['pk-neg', 'pk-null', 'pk-big', 'pk-huge', 'pk-zero']) AS k;
SELECT key, state, max_age, stale_for, last_error
  FROM projcache.entries
 WHERE key IN ('pk-neg', 'pk-null', 'pk-big', 'pk-huge', 'pk-zero')
 ORDER BY key;
-- max_age 0: stale at once
SELECT freshness, config FROM projcache.lookup('pk-zero');
-- A good answer later clears the message.
UPDATE periods SET max_age = '30s' WHERE key = 'pk-neg';
SELECT projcache.invalidate('pk-neg');
SELECT wait_for($$(SELECT last_error IS NULL FROM projcache.entries WHERE key = 'pk-neg')$$);
SELECT * FROM periods_of('pk-neg');

-- A column of the wrong type is not used, for every key.
CREATE FUNCTION test_fetch_bad_types(keys text[], revisions text[])
RETURNS TABLE(key text, state text, revision text, config jsonb,
			  max_age int, stale_for text)
LANGUAGE sql AS $$
	SELECT t.key, t.state, t.revision, t.config, 10, '10s'
	  FROM test_fetch(keys, revisions) AS t
$$;
ALTER SYSTEM SET projcache.fetch_function = 'public.test_fetch_bad_types';
SELECT reload_and_wait();
INSERT INTO upstream VALUES ('pk-type', 'enabled', 'r1', '{"p": "type"}');
SELECT projcache.get('pk-type', '10s');
SELECT * FROM periods_of('pk-type');

-- Names count, not places: another column before them, max_age alone.
CREATE FUNCTION test_fetch_max_age_only(keys text[], revisions text[])
RETURNS TABLE(key text, state text, revision text, config jsonb,
			  note text, max_age interval)
LANGUAGE sql AS $$
	SELECT t.key, t.state, t.revision, t.config, 'hello', '45s'::interval
	  FROM test_fetch(keys, revisions) AS t
$$;
ALTER SYSTEM SET projcache.fetch_function = 'public.test_fetch_max_age_only';
SELECT reload_and_wait();
INSERT INTO upstream VALUES ('pk-only', 'enabled', 'r1', '{"p": "only"}');
SELECT projcache.get('pk-only', '10s');
SELECT * FROM periods_of('pk-only');

-- A four-column function works as before: the settings' periods.
ALTER SYSTEM SET projcache.fetch_function = 'public.test_fetch';
SELECT reload_and_wait();
INSERT INTO upstream VALUES ('pk-four', 'enabled', 'r1', '{"p": "four"}');
SELECT projcache.get('pk-four', '10s');
SELECT * FROM periods_of('pk-four');
-- and a key fetched with periods keeps them until it is fetched again
SELECT * FROM periods_of('pk-only');
SELECT projcache.invalidate('pk-only');
SELECT wait_for($$(SELECT max_age = '300s' FROM projcache.entries WHERE key = 'pk-only')$$);
SELECT * FROM periods_of('pk-only');

-- A restarted worker keeps each key's periods: pk-rs (60 s fresh) is
-- refetched on a read once they are over, not after 300 s.
ALTER SYSTEM SET projcache.fetch_function = 'public.test_fetch_periods';
SELECT reload_and_wait();
INSERT INTO upstream VALUES ('pk-rs', 'enabled', 'r1', '{"p": "rs"}');
INSERT INTO periods VALUES ('pk-rs', '60s', '600s');
SELECT projcache.get('pk-rs', '10s');
SELECT worker_pid AS old_pid FROM projcache.stats \gset
SELECT pg_terminate_backend(:old_pid);
SELECT wait_for($$(SELECT worker_pid IS NOT NULL AND worker_pid <> $$ || :old_pid || $$ FROM projcache.stats)$$, 30);
SELECT * FROM periods_of('pk-rs');
UPDATE upstream SET revision = 'r2', config = '{"p": "rs2"}' WHERE key = 'pk-rs';
SELECT projcache.debug_advance_clock('61s');
SELECT freshness, config FROM projcache.lookup('pk-rs');
SELECT wait_for($$(SELECT revision = 'r2' FROM projcache.entries WHERE key = 'pk-rs')$$);

ALTER SYSTEM SET projcache.fetch_function = 'public.test_fetch';
SELECT reload_and_wait();
