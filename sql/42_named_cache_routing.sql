-- Named caches (1.3), routing: a key name:rest is the cache name's, its
-- function is asked for rest, as the cache's owner; reading it needs the
-- cache's grant; other keys stay the default cache's.
SET client_min_messages = warning;
CREATE EXTENSION IF NOT EXISTS projcache VERSION '1.2.1';
ALTER EXTENSION projcache UPDATE;
CREATE SCHEMA ncr;
GRANT USAGE ON SCHEMA ncr TO PUBLIC;

CREATE FUNCTION ncr.try(sql text) RETURNS text LANGUAGE plpgsql AS $$
BEGIN
    EXECUTE sql;
    RETURN 'ok';
EXCEPTION WHEN OTHERS THEN
    RETURN SQLSTATE || ': ' || SQLERRM;
END $$;

-- Wait (30 s at most) until projcache.caches lists exactly these names as
-- open, and no cache opening or closing.
CREATE FUNCTION ncr.caches_become(want text[]) RETURNS text[]
LANGUAGE plpgsql AS $$
DECLARE
    got text[];
BEGIN
    FOR i IN 1..600 LOOP
        SELECT coalesce(array_agg(name ORDER BY name), '{}') INTO got
          FROM projcache.caches WHERE state IN ('open', 'put_aside');
        IF got = want AND NOT EXISTS (SELECT FROM projcache.caches
                                       WHERE state IN ('opening', 'closing')) THEN
            RETURN got;
        END IF;
        PERFORM pg_sleep(0.05);
    END LOOP;
    RETURN got;
END $$;

-- Each function says who it ran as and which key it was asked for.
CREATE TABLE ncr.calls (fn text, who text, keys text[]);
GRANT INSERT ON ncr.calls TO PUBLIC;
CREATE FUNCTION ncr.flags(keys text[], revisions text[])
RETURNS TABLE(key text, state text, revision text, config jsonb)
LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO ncr.calls VALUES ('flags', current_user, keys);
    RETURN QUERY SELECT k, 'enabled'::text, 'r1'::text,
                        jsonb_build_object('flag', k, 'from', 'flags') FROM unnest(keys) k;
END $$;
CREATE FUNCTION ncr.apikeys(keys text[], revisions text[])
RETURNS TABLE(key text, state text, revision text, config jsonb)
LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO ncr.calls VALUES ('apikeys', current_user, keys);
    RETURN QUERY SELECT k, 'enabled'::text, 'r1'::text,
                        jsonb_build_object('apikey', k) FROM unnest(keys) k;
END $$;

CREATE ROLE ncr_flags_owner;
CREATE ROLE ncr_app;
CREATE ROLE ncr_other;
GRANT USAGE ON SCHEMA projcache TO ncr_flags_owner, ncr_app, ncr_other;
GRANT EXECUTE ON FUNCTION
    projcache.create_cache(text, regprocedure, interval, interval, interval, interval, integer, interval, bigint, regrole),
    projcache.grant_cache(text, regrole),
    projcache.get(text), projcache.get(text, interval),
    projcache.lookup(text, interval), projcache.fetch(text),
    projcache.invalidate(text), projcache.evict(text),
    projcache.entries_1_2_1(), projcache.entries_1_3_1(), projcache.caches_1_3(), projcache.caches_1_3_1()
    TO ncr_flags_owner, ncr_app, ncr_other;
GRANT SELECT ON projcache.entries, projcache.caches TO ncr_flags_owner, ncr_app, ncr_other;

SET ROLE ncr_flags_owner;
SELECT projcache.create_cache('flags', 'ncr.flags(text[],text[])', expiry => '2min',
                              max_memory => 1048576);
SELECT projcache.grant_cache('flags', 'ncr_app');
SELECT ncr.caches_become('{flags}');
RESET ROLE;
SELECT projcache.create_cache('apikeys', 'ncr.apikeys(text[],text[])');
SELECT ncr.caches_become('{apikeys,flags}');

-- The flags cache's function is asked for "dark_mode", as its owner.
SET ROLE ncr_app;
SELECT projcache.get('flags:dark_mode', '10s');
RESET ROLE;
SELECT fn, who, keys FROM ncr.calls;

-- A role without the grant: 42501 on every key-level call.
SET ROLE ncr_other;
SELECT ncr.try($$SELECT projcache.get('flags:dark_mode')$$);
SELECT ncr.try($$SELECT projcache.get('flags:dark_mode', '1s')$$);
SELECT ncr.try($$SELECT * FROM projcache.lookup('flags:dark_mode')$$);
SELECT ncr.try($$SELECT projcache.fetch('flags:x')$$);
SELECT ncr.try($$SELECT projcache.invalidate('flags:dark_mode')$$);
SELECT ncr.try($$SELECT projcache.evict('flags:dark_mode')$$);
SELECT ncr.try($$SELECT projcache.get('apikeys:k1')$$);
-- ... and entries shows it none of the cache's keys.
SELECT count(*) AS flags_keys_seen FROM projcache.entries WHERE key LIKE 'flags:%';
RESET ROLE;
SET ROLE ncr_app;
SELECT projcache.get('flags:dark_mode') AS read_again;
SELECT key, max_age FROM projcache.entries WHERE key LIKE 'flags:%';
SELECT ncr.try($$SELECT projcache.get('apikeys:k1')$$);
RESET ROLE;
-- The cache's expiry (2 min), on the debug clock: past it, the key is no
-- longer fresh.
SELECT freshness FROM projcache.lookup('flags:dark_mode');
SELECT projcache.debug_advance_clock('3 min');
SELECT freshness <> 'fresh' AS past_cache_expiry FROM projcache.lookup('flags:dark_mode');

-- A superuser reads every cache; the apikeys function is asked as its owner.
SELECT projcache.get('apikeys:k1', '10s');
SELECT fn, who, keys FROM ncr.calls WHERE fn = 'apikeys';
-- Keys with no registered prefix are the default cache's, as in 1.2.
SELECT projcache.get('nosuchcache:x') IS NULL AS default_cache_key;
SELECT key FROM projcache.entries WHERE key = 'nosuchcache:x';
SELECT hits >= 1 AS counted_hits, misses >= 1 AS counted_misses, fetch_calls >= 1 AS counted_calls
  FROM projcache.caches WHERE name = 'flags';

-- Dropping a cache evicts its keys before its prefix is the default's.
SELECT projcache.drop_cache('apikeys');
SELECT ncr.caches_become('{flags}');
SELECT count(*) AS apikeys_keys_left FROM projcache.entries WHERE key LIKE 'apikeys:%';

SELECT projcache.drop_cache('flags');
SELECT ncr.caches_become('{}');
SELECT count(*) AS flags_keys_left FROM projcache.entries WHERE key LIKE 'flags:%';
SELECT projcache.evict('nosuchcache:x');

-- A cache that fetches as a superuser runs only a function a superuser
-- owns: another owner could change what it runs as a superuser.
ALTER FUNCTION ncr.apikeys(text[], text[]) OWNER TO ncr_flags_owner;
SELECT left(ncr.try($$SELECT projcache.create_cache('su_cache', 'ncr.apikeys(text[],text[])')$$), 5)
    AS create_as_superuser;
SELECT projcache.create_cache('su_cache', 'ncr.flags(text[],text[])');
SELECT left(ncr.try($$SELECT projcache.alter_cache('su_cache', fetch_function => 'ncr.apikeys(text[],text[])')$$), 5)
    AS alter_as_superuser;
ALTER FUNCTION ncr.apikeys(text[], text[]) OWNER TO CURRENT_USER;
SELECT projcache.drop_cache('su_cache');
SELECT ncr.caches_become('{}');

-- A cache dropped and made again in one transaction is another cache: the
-- old function's value is not served as the new one's.
CREATE FUNCTION ncr.value_becomes(k text, field text) RETURNS boolean
LANGUAGE plpgsql AS $$
BEGIN
    FOR i IN 1..300 LOOP
        IF projcache.get(k, '100ms') ? field THEN
            RETURN true;
        END IF;
        PERFORM pg_sleep(0.05);
    END LOOP;
    RETURN false;
END $$;
SELECT projcache.create_cache('again', 'ncr.flags(text[],text[])');
SELECT ncr.caches_become('{again}');
SELECT ncr.value_becomes('again:k', 'flag') AS old_function_value;
BEGIN;
SELECT projcache.drop_cache('again');
SELECT projcache.create_cache('again', 'ncr.apikeys(text[],text[])');
COMMIT;
SELECT ncr.value_becomes('again:k', 'apikey') AS new_function_value;
SELECT projcache.drop_cache('again');
SELECT ncr.caches_become('{}');

-- A fetch role: the cache's function runs as it.
CREATE ROLE ncr_fetcher;
GRANT ncr_fetcher TO ncr_flags_owner;
GRANT INSERT ON ncr.calls TO ncr_fetcher;
SET ROLE ncr_flags_owner;
SELECT projcache.create_cache('roled', 'ncr.flags(text[],text[])', fetch_role => 'ncr_fetcher',
                              max_memory => 1048576),
       projcache.grant_cache('roled', 'ncr_app');
RESET ROLE;
SELECT ncr.caches_become('{roled}');
SET ROLE ncr_app;
SELECT projcache.get('roled:r1', '10s') ->> 'from' AS read_by_grant;
RESET ROLE;
SELECT who FROM ncr.calls WHERE keys = '{r1}';

-- A revoke holds within a second, in every session.
CREATE FUNCTION ncr.refused_within(k text) RETURNS boolean
LANGUAGE plpgsql AS $$
BEGIN
    FOR i IN 1..300 LOOP
        BEGIN
            PERFORM projcache.get(k);
        EXCEPTION WHEN insufficient_privilege THEN
            RETURN true;
        END;
        PERFORM pg_sleep(0.05);
    END LOOP;
    RETURN false;
END $$;
SELECT projcache.revoke_cache('roled', 'ncr_app');
SET ROLE ncr_app;
SELECT ncr.refused_within('roled:r1') AS refused_after_revoke;
RESET ROLE;

-- The owner's right to SET ROLE to the fetch role is checked at each
-- fetch: without it, the fetch fails (and runs nothing).
CREATE FUNCTION ncr.error_of(k text) RETURNS text
LANGUAGE plpgsql AS $$
DECLARE
    e text;
BEGIN
    FOR i IN 1..300 LOOP
        SELECT last_error INTO e FROM projcache.lookup(k);
        IF e IS NOT NULL THEN
            RETURN e;
        END IF;
        PERFORM pg_sleep(0.05);
    END LOOP;
    RETURN NULL;
END $$;
REVOKE ncr_fetcher FROM ncr_flags_owner;
SELECT ncr.error_of('roled:r2') LIKE '%may no longer fetch as role%' AS fetch_role_rechecked;
SELECT count(*) AS calls_for_r2 FROM ncr.calls WHERE keys = '{r2}';
SELECT projcache.drop_cache('roled');
SELECT ncr.caches_become('{}');

-- A cache's own batch_size splits its keys' calls of its function.
SELECT projcache.create_cache('small', 'ncr.flags(text[],text[])', batch_size => 2);
SELECT ncr.caches_become('{small}');
SELECT count(projcache.get('small:b' || i)) FROM generate_series(1, 5) i;
SELECT count(*) AS cached FROM generate_series(1, 5) i
 WHERE projcache.get('small:b' || i, '10s') IS NOT NULL;
SELECT max(cardinality(keys)) <= 2 AS within_batch_size, sum(cardinality(keys)) AS keys_asked
  FROM ncr.calls WHERE keys && ARRAY['b1', 'b2', 'b3', 'b4', 'b5'];
SELECT projcache.drop_cache('small');
SELECT ncr.caches_become('{}');

-- A cache whose function was dropped can still be changed, revoked and
-- dropped.
CREATE FUNCTION ncr.gone(keys text[], revisions text[])
RETURNS TABLE(key text, state text, revision text, config jsonb)
LANGUAGE sql AS $$ SELECT k, 'enabled', 'r1', '{}'::jsonb FROM unnest(keys) k $$;
SELECT projcache.create_cache('orphan', 'ncr.gone(text[],text[])'),
       projcache.grant_cache('orphan', 'ncr_app');
DROP FUNCTION ncr.gone(text[], text[]);
SELECT projcache.alter_cache('orphan', expiry => '1 min');
SELECT projcache.revoke_cache('orphan', 'ncr_app');
SELECT projcache.drop_cache('orphan');
SELECT ncr.caches_become('{}');

DROP SCHEMA ncr CASCADE;
REVOKE USAGE ON SCHEMA projcache FROM ncr_flags_owner, ncr_app, ncr_other;
REVOKE ALL ON projcache.entries, projcache.caches FROM ncr_flags_owner, ncr_app, ncr_other;
REVOKE ALL ON FUNCTION
    projcache.create_cache(text, regprocedure, interval, interval, interval, interval, integer, interval, bigint, regrole),
    projcache.grant_cache(text, regrole),
    projcache.get(text), projcache.get(text, interval),
    projcache.lookup(text, interval), projcache.fetch(text),
    projcache.invalidate(text), projcache.evict(text),
    projcache.entries_1_2_1(), projcache.entries_1_3_1(), projcache.caches_1_3(), projcache.caches_1_3_1()
    FROM ncr_flags_owner, ncr_app, ncr_other;
DROP ROLE ncr_flags_owner, ncr_app, ncr_other, ncr_fetcher;
