-- Named caches (1.3), the registry: create_cache, alter_cache, drop_cache,
-- grant_cache and revoke_cache, what each checks and who may call it, and
-- projcache.caches as each role sees it once the worker published it.
SET client_min_messages = warning;
CREATE EXTENSION IF NOT EXISTS projcache VERSION '1.2.1';
ALTER EXTENSION projcache UPDATE;
SELECT memory_limit FROM projcache.stats \gset
CREATE SCHEMA nc;
GRANT USAGE ON SCHEMA nc TO PUBLIC;

-- The SQLSTATE and message of a statement, or 'ok'.
CREATE FUNCTION nc.try(sql text) RETURNS text LANGUAGE plpgsql AS $$
BEGIN
    EXECUTE sql;
    RETURN 'ok';
EXCEPTION WHEN OTHERS THEN
    RETURN SQLSTATE || ': ' || SQLERRM;
END $$;

-- Wait (30 s at most) until projcache.caches lists exactly these names as
-- open, as the current role sees it, and no cache opening or closing: the
-- worker publishes a commit within a second.
CREATE FUNCTION nc.caches_become(want text[]) RETURNS text[]
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

CREATE FUNCTION nc.fetch(keys text[], revisions text[])
RETURNS TABLE(key text, state text, revision text, config jsonb)
LANGUAGE sql STABLE AS $$
    SELECT k, 'enabled', 'r1', jsonb_build_object('k', k) FROM unnest(keys) k
$$;
CREATE FUNCTION nc.not_a_fetch(keys text[]) RETURNS SETOF text
LANGUAGE sql AS $$ SELECT unnest(keys) $$;
CREATE FUNCTION nc.scalar(keys text[], revisions text[]) RETURNS text
LANGUAGE sql AS $$ SELECT 'x' $$;
REVOKE EXECUTE ON FUNCTION nc.fetch(text[], text[]) FROM PUBLIC;

CREATE ROLE nc_owner;
CREATE ROLE nc_reader;
CREATE ROLE nc_other;
CREATE ROLE nc_fetcher;
CREATE ROLE nc_readers_group;
GRANT nc_readers_group TO nc_reader;
GRANT USAGE ON SCHEMA projcache TO nc_owner, nc_other, nc_reader;
GRANT EXECUTE ON FUNCTION
    projcache.create_cache(text, regprocedure, interval, interval, interval, interval, integer, interval, bigint, regrole),
    projcache.alter_cache(text, regprocedure, interval, interval, interval, interval, integer, interval, bigint, regrole),
    projcache.drop_cache(text),
    projcache.grant_cache(text, regrole),
    projcache.revoke_cache(text, regrole),
    projcache.caches_1_3(), projcache.caches_1_3_1()
    TO nc_owner, nc_other;
GRANT EXECUTE ON FUNCTION projcache.caches_1_3(), projcache.caches_1_3_1() TO nc_reader;
GRANT SELECT ON projcache.caches TO nc_owner, nc_other, nc_reader;

-- Names: [a-z][a-z0-9_]*, at most 63 bytes, not "default" (22023).
SELECT n, nc.try(format('SELECT projcache.create_cache(%L, %L)', n, 'nc.fetch(text[],text[])'))
  FROM unnest(ARRAY['Bad', '1abc', 'a-b', 'a:b', '', ' a', 'default', 'x' || repeat('y', 63),
                    'a''; DROP TABLE projcache.cache_registry; --']) n;
-- A NULL name or function (22004); what is not a fetch function (22023).
SELECT nc.try('SELECT projcache.create_cache(NULL, ''nc.fetch(text[],text[])'')');
SELECT nc.try('SELECT projcache.create_cache(''a'', NULL)');
SELECT nc.try('SELECT projcache.create_cache(''a'', ''nc.not_a_fetch(text[])'')');
SELECT nc.try('SELECT projcache.create_cache(''a'', ''nc.scalar(text[],text[])'')');
-- Settings out of their server settings' bounds, and memory that does not
-- fit in the keys' part of projcache.max_memory (22023).
SELECT nc.try('SELECT projcache.create_cache(''a'', ''nc.fetch(text[],text[])'', expiry => ''0'')');
SELECT nc.try('SELECT projcache.create_cache(''a'', ''nc.fetch(text[],text[])'', grace_period => ''-1s'')');
SELECT nc.try('SELECT projcache.create_cache(''a'', ''nc.fetch(text[],text[])'', grace_period => ''-0.5ms'')');
SELECT nc.try('SELECT projcache.create_cache(''a'', ''nc.fetch(text[],text[])'', max_retry_backoff => ''10ms'')');
SELECT nc.try('SELECT projcache.create_cache(''a'', ''nc.fetch(text[],text[])'', expiry => ''100000 years'')');
SELECT nc.try('SELECT projcache.create_cache(''a'', ''nc.fetch(text[],text[])'', batch_size => 0)');
SELECT nc.try('SELECT projcache.create_cache(''a'', ''nc.fetch(text[],text[])'', batch_size => 100001)');
SELECT nc.try('SELECT projcache.create_cache(''a'', ''nc.fetch(text[],text[])'', max_memory => 1000)');
SELECT nc.try('SELECT projcache.create_cache(''a'', ''nc.fetch(text[],text[])'', max_memory => 1000000000000)') ~ '^22023: max_memory of cache "a" does not fit' AS too_big_refused;
SELECT count(*) AS nothing_registered FROM projcache.cache_registry;

-- Only READ COMMITTED transactions change the registry (25000): the bounds
-- are checked against what is committed once the registry is locked.
BEGIN ISOLATION LEVEL REPEATABLE READ;
SELECT nc.try('SELECT projcache.create_cache(''a'', ''nc.fetch(text[],text[])'')');
COMMIT;
-- No fetch function in a temporary schema (22023): another session may
-- own that schema later, and put its own function of that name there.
CREATE FUNCTION pg_temp.tf(keys text[], revisions text[])
RETURNS TABLE(key text, state text, revision text, config jsonb)
LANGUAGE sql AS $$ SELECT NULL::text, NULL::text, NULL::text, NULL::jsonb $$;
SELECT nc.try('SELECT projcache.create_cache(''a'', ''pg_temp.tf(text[],text[])'')') ~ '^22023: fetch function .* is in a temporary schema' AS temp_refused;

-- A superuser registers one; the name is then taken (42710).
SELECT projcache.create_cache('flags', 'nc.fetch(text[],text[])', expiry => '10s',
                              batch_size => 50, max_memory => 1048576);
SELECT nc.try('SELECT projcache.create_cache(''flags'', ''nc.fetch(text[],text[])'')');
SELECT name, owner, fetch_function, fetch_role, expiry, grace_period, batch_size, max_memory, readers
  FROM projcache.cache_registry;
-- The worker publishes it to every backend, with counters.
SELECT nc.caches_become('{flags}');
SELECT name, owner, fetch_function, expiry, grace_period, batch_size, max_memory, entries, hits
  FROM projcache.caches;

-- Memory is carved from one budget: a second cache may take only what is left.
SELECT nc.try(format('SELECT projcache.create_cache(''big'', ''nc.fetch(text[],text[])'', max_memory => %s)',
                          s.memory_limit)) ~ '^22023: max_memory of cache "big" does not fit' AS over_budget_refused
  FROM projcache.stats s;

-- Non-superusers: EXECUTE on create_cache and on the fetch function, and
-- membership in the fetch role named (42501 each).
SET ROLE nc_reader;
SELECT nc.try('SELECT projcache.create_cache(''mine'', ''nc.fetch(text[],text[])'')');
SELECT nc.try('SELECT * FROM projcache.cache_registry');
RESET ROLE;
SET ROLE nc_owner;
SELECT nc.try('SELECT projcache.create_cache(''projects'', ''nc.fetch(text[],text[])'')');
RESET ROLE;
GRANT EXECUTE ON FUNCTION nc.fetch(text[], text[]) TO nc_owner;
SET ROLE nc_owner;
SELECT nc.try('SELECT projcache.create_cache(''projects'', ''nc.fetch(text[],text[])'', fetch_role => ''nc_fetcher'')');
RESET ROLE;
GRANT nc_fetcher TO nc_owner;
-- A superuser fetch role needs a superuser owner (42501).
CREATE ROLE nc_super SUPERUSER NOLOGIN;
GRANT nc_super TO nc_owner;
SET ROLE nc_owner;
SELECT nc.try('SELECT projcache.create_cache(''projects'', ''nc.fetch(text[],text[])'', fetch_role => ''nc_super'')');
RESET ROLE;
DROP ROLE nc_super;
SET ROLE nc_owner;
-- A cache of an owner who is not a superuser needs a budget (22023).
SELECT nc.try('SELECT projcache.create_cache(''projects'', ''nc.fetch(text[],text[])'', fetch_role => ''nc_fetcher'')');
SELECT projcache.create_cache('projects', 'nc.fetch(text[],text[])', fetch_role => 'nc_fetcher',
                              max_memory => 65536);
SELECT nc.try('SELECT * FROM projcache.cache_registry');
-- The owner sees its own cache only.
SELECT nc.caches_become('{projects}');
-- A role that is not a superuser may reserve at most half of the keys'
-- part of projcache.max_memory for its caches together, and own at most
-- 32 caches (22023, 54000).
SELECT nc.try(format('SELECT projcache.alter_cache(''projects'', max_memory => %s)',
                     :memory_limit / 2)) AS half_or_more;
SELECT nc.try(format('SELECT projcache.alter_cache(''projects'', max_memory => %s)',
                     :memory_limit / 8)) AS an_eighth;
SELECT count(projcache.create_cache('mine_' || g, 'nc.fetch(text[],text[])', max_memory => 65536))
  FROM generate_series(1, 31) g;
SELECT nc.try('SELECT projcache.create_cache(''mine_32'', ''nc.fetch(text[],text[])'', max_memory => 65536)');
SELECT count(projcache.drop_cache('mine_' || g)) FROM generate_series(1, 31) g;
-- Nor may such owners together (22023): two roles cannot take the default
-- cache's half between them.
SELECT nc.try(format('SELECT projcache.alter_cache(''projects'', max_memory => %s)',
                     :memory_limit / 4)) AS a_quarter;
RESET ROLE;
GRANT EXECUTE ON FUNCTION nc.fetch(text[], text[]) TO nc_other;
SET ROLE nc_other;
SELECT nc.try(format('SELECT projcache.create_cache(''others'', ''nc.fetch(text[],text[])'', max_memory => %s)',
                     :memory_limit / 4)) AS two_owners_over_half;
RESET ROLE;
REVOKE EXECUTE ON FUNCTION nc.fetch(text[], text[]) FROM nc_other;
SET ROLE nc_owner;
SELECT nc.try(format('SELECT projcache.alter_cache(''projects'', max_memory => %s)',
                     :memory_limit / 8)) AS an_eighth_again;
RESET ROLE;

-- Changing, granting and dropping take the owner's privileges (42501).
SET ROLE nc_other;
SELECT nc.try('SELECT projcache.alter_cache(''projects'', expiry => ''1s'')');
SELECT nc.try('SELECT projcache.grant_cache(''projects'', ''nc_other'')');
SELECT nc.try('SELECT projcache.revoke_cache(''projects'', ''nc_owner'')');
SELECT nc.try('SELECT projcache.drop_cache(''projects'')');
SELECT nc.try('SELECT projcache.drop_cache(''nonesuch'')');
SELECT nc.caches_become('{}');
RESET ROLE;

SET ROLE nc_owner;
SELECT projcache.alter_cache('projects', expiry => '2min', grace_period => '30s');
SELECT nc.try('SELECT projcache.alter_cache(''projects'', batch_size => -1)');
SELECT nc.try('SELECT projcache.alter_cache(''nonesuch'', expiry => ''1s'')');
-- A reader sees the cache once granted, through a role it belongs to too.
SELECT projcache.grant_cache('projects', 'nc_readers_group');
SELECT projcache.grant_cache('projects', 'nc_readers_group');
SELECT nc.try('SELECT projcache.grant_cache(''projects'', 0::oid::regrole)');
RESET ROLE;
SELECT name, owner, fetch_role, expiry, grace_period, readers FROM projcache.cache_registry
 WHERE name = 'projects';
SET ROLE nc_reader;
SELECT nc.caches_become('{projects}');
RESET ROLE;
-- The roles a cache names cannot be dropped (2BP01).
SELECT nc.try('DROP ROLE nc_readers_group');
SELECT nc.try('DROP ROLE nc_fetcher');
SELECT nc.try('DROP ROLE nc_owner');
SET ROLE nc_owner;
SELECT projcache.revoke_cache('projects', 'nc_readers_group');
SELECT projcache.revoke_cache('projects', 'nc_readers_group');
RESET ROLE;
SET ROLE nc_reader;
SELECT nc.caches_become('{}');
RESET ROLE;

-- Another database's table is not the registry (55000).
CREATE DATABASE nc_elsewhere;
\c nc_elsewhere
SET client_min_messages = warning;
CREATE EXTENSION projcache VERSION '1.3';
SELECT projcache.create_cache('elsewhere', 'pg_catalog.now()');
\c contrib_regression
SET client_min_messages = warning;
DROP DATABASE nc_elsewhere;

-- At most 64 caches (54000).
SELECT count(projcache.create_cache('many_' || g, 'nc.fetch(text[],text[])'))
  FROM generate_series(1, 61) g;
SELECT projcache.create_cache('x' || repeat('y', 62), 'nc.fetch(text[],text[])');
SELECT nc.try('SELECT projcache.create_cache(''one_too_many'', ''nc.fetch(text[],text[])'')');
SELECT count(projcache.drop_cache('many_' || g)) FROM generate_series(1, 61) g;
SELECT projcache.drop_cache('x' || repeat('y', 62));

-- Dropping: the owner, then a superuser; both leave the view.
SET ROLE nc_owner;
SELECT projcache.drop_cache('projects');
RESET ROLE;
SELECT projcache.drop_cache('flags');
SELECT nc.caches_become('{}');
SELECT count(*) AS left_registered FROM projcache.cache_registry;

DROP SCHEMA nc CASCADE;
REVOKE USAGE ON SCHEMA projcache FROM nc_owner, nc_other, nc_reader;
REVOKE ALL ON projcache.caches FROM nc_owner, nc_other, nc_reader;
REVOKE ALL ON FUNCTION
    projcache.create_cache(text, regprocedure, interval, interval, interval, interval, integer, interval, bigint, regrole),
    projcache.alter_cache(text, regprocedure, interval, interval, interval, interval, integer, interval, bigint, regrole),
    projcache.drop_cache(text),
    projcache.grant_cache(text, regrole),
    projcache.revoke_cache(text, regrole),
    projcache.caches_1_3(), projcache.caches_1_3_1()
    FROM nc_owner, nc_other, nc_reader;
DROP ROLE nc_owner, nc_reader, nc_other, nc_fetcher, nc_readers_group;
