-- Named caches, 1.3.1: the names non-superusers may take together, no
-- role may be pg_database_owner, projcache.caches lists the registry as
-- the caller's snapshot sees it (state, last_error), and projcache.entries
-- says each key's cache.
SET client_min_messages = warning;
CREATE EXTENSION IF NOT EXISTS projcache;
ALTER EXTENSION projcache UPDATE;
CREATE SCHEMA ncb;
GRANT USAGE ON SCHEMA ncb TO PUBLIC;

CREATE FUNCTION ncb.try(sql text) RETURNS text LANGUAGE plpgsql AS $$
BEGIN
    EXECUTE sql;
    RETURN 'ok';
EXCEPTION WHEN OTHERS THEN
    RETURN SQLSTATE || ': ' || SQLERRM;
END $$;

-- Wait (30 s at most) until every listed cache is open.
CREATE FUNCTION ncb.all_open() RETURNS boolean
LANGUAGE plpgsql AS $$
BEGIN
    FOR i IN 1..600 LOOP
        IF NOT EXISTS (SELECT FROM projcache.caches WHERE state <> 'open') THEN
            RETURN true;
        END IF;
        PERFORM pg_sleep(0.05);
    END LOOP;
    RETURN false;
END $$;

CREATE FUNCTION ncb.fetch(keys text[], revisions text[])
RETURNS TABLE(key text, state text, revision text, config jsonb)
LANGUAGE sql STABLE AS $$
    SELECT k, 'enabled', 'r1', jsonb_build_object('k', k) FROM unnest(keys) k
$$;

CREATE ROLE ncb_a;
CREATE ROLE ncb_b;
CREATE ROLE ncb_c;
GRANT USAGE ON SCHEMA projcache TO ncb_a, ncb_b, ncb_c;
GRANT EXECUTE ON FUNCTION
    projcache.create_cache(text, regprocedure, interval, interval, interval, interval, integer, interval, bigint, regrole),
    projcache.alter_cache(text, regprocedure, interval, interval, interval, interval, integer, interval, bigint, regrole),
    projcache.drop_cache(text),
    projcache.grant_cache(text, regrole),
    projcache.revoke_cache(text, regrole),
    projcache.caches_1_3_1(), projcache.entries_1_3_1(), projcache.get(text, interval)
    TO ncb_a, ncb_b, ncb_c;
GRANT SELECT ON projcache.caches, projcache.entries TO ncb_a, ncb_b, ncb_c;

-- projcache.caches lists a cache in the statement after its create_cache,
-- as the registry has it, before the worker has opened it.
SET ROLE ncb_a;
SELECT projcache.create_cache('seen', 'ncb.fetch(text[],text[])', max_memory => 65536);
SELECT name, owner, state IN ('opening', 'open') AS opening_or_open, last_error
  FROM projcache.caches;
-- and in the same transaction as its create_cache, too
BEGIN;
SELECT projcache.create_cache('seen2', 'ncb.fetch(text[],text[])', max_memory => 65536);
SELECT array_agg(name ORDER BY name) FROM projcache.caches;
ROLLBACK;
SELECT array_agg(name ORDER BY name) FROM projcache.caches;
SELECT ncb.all_open();
SELECT name, state, last_error FROM projcache.caches;
-- entries says each key's cache
SELECT projcache.get('seen:x', '10s') ->> 'k' AS got;
RESET ROLE;
SELECT projcache.get('plainkey', '10s') IS NULL AS default_key_has_no_function;
SELECT key, cache FROM projcache.entries WHERE key IN ('seen:x', 'plainkey') ORDER BY key;
SET ROLE ncb_a;
SELECT projcache.drop_cache('seen');
-- gone at once, but for a row "closing" while the worker clears its keys
SELECT count(*) AS still_listed FROM projcache.caches WHERE state <> 'closing';
RESET ROLE;

-- pg_database_owner cannot be a reader, an owner or a fetch role (22023):
-- its members depend on the database, and a cache is read in every one.
SET ROLE ncb_a;
SELECT projcache.create_cache('dbo', 'ncb.fetch(text[],text[])', max_memory => 65536);
SELECT ncb.try($$SELECT projcache.grant_cache('dbo', 'pg_database_owner')$$);
SELECT ncb.try($$SELECT projcache.alter_cache('dbo', fetch_role => 'pg_database_owner')$$);
RESET ROLE;
GRANT USAGE ON SCHEMA projcache TO pg_database_owner;
GRANT EXECUTE ON FUNCTION
    projcache.create_cache(text, regprocedure, interval, interval, interval, interval, integer, interval, bigint, regrole)
    TO pg_database_owner;
ALTER DATABASE contrib_regression OWNER TO ncb_b;
SET ROLE ncb_b;
SET ROLE pg_database_owner;
SELECT ncb.try($$SELECT projcache.create_cache('dbo2', 'ncb.fetch(text[],text[])', max_memory => 65536)$$);
RESET ROLE;
ALTER DATABASE contrib_regression OWNER TO CURRENT_USER;
REVOKE ALL ON FUNCTION
    projcache.create_cache(text, regprocedure, interval, interval, interval, interval, integer, interval, bigint, regrole)
    FROM pg_database_owner;
REVOKE USAGE ON SCHEMA projcache FROM pg_database_owner;
SET ROLE ncb_a;
SELECT projcache.drop_cache('dbo');
RESET ROLE;

-- Owners who are not superusers own at most 32 of the 64 names together
-- (54000); a superuser's cache still finds a name.
SET ROLE ncb_a;
SELECT count(projcache.create_cache('a' || i, 'ncb.fetch(text[],text[])', max_memory => 65536))
  FROM generate_series(1, 20) i;
RESET ROLE;
SET ROLE ncb_b;
SELECT count(projcache.create_cache('b' || i, 'ncb.fetch(text[],text[])', max_memory => 65536))
  FROM generate_series(1, 12) i;
SELECT ncb.try($$SELECT projcache.create_cache('b13', 'ncb.fetch(text[],text[])', max_memory => 65536)$$);
RESET ROLE;
SET ROLE ncb_c;
SELECT ncb.try($$SELECT projcache.create_cache('c1', 'ncb.fetch(text[],text[])', max_memory => 65536)$$);
RESET ROLE;
SELECT projcache.create_cache('su1', 'ncb.fetch(text[],text[])');
SELECT count(*) AS caches FROM projcache.caches WHERE state <> 'closing';
-- a name freed by one of them is free for another
SET ROLE ncb_b;
SELECT projcache.drop_cache('b12');
RESET ROLE;
SET ROLE ncb_c;
SELECT ncb.try($$SELECT projcache.create_cache('c1', 'ncb.fetch(text[],text[])', max_memory => 65536)$$);
RESET ROLE;

SELECT count(projcache.drop_cache(name)) FROM projcache.caches WHERE state <> 'closing';
SELECT ncb.all_open();
DROP SCHEMA ncb CASCADE;
REVOKE ALL ON FUNCTION
    projcache.create_cache(text, regprocedure, interval, interval, interval, interval, integer, interval, bigint, regrole),
    projcache.alter_cache(text, regprocedure, interval, interval, interval, interval, integer, interval, bigint, regrole),
    projcache.drop_cache(text),
    projcache.grant_cache(text, regrole),
    projcache.revoke_cache(text, regrole),
    projcache.caches_1_3_1(), projcache.entries_1_3_1(), projcache.get(text, interval)
    FROM ncb_a, ncb_b, ncb_c;
REVOKE ALL ON projcache.caches, projcache.entries FROM ncb_a, ncb_b, ncb_c;
REVOKE USAGE ON SCHEMA projcache FROM ncb_a, ncb_b, ncb_c;
DROP ROLE ncb_a, ncb_b, ncb_c;
