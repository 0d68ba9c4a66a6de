-- bench/dump.sql - the source of bench/dump.sh (issue 22: the key map's
-- dump and load), loaded into a throwaway cluster with
--     psql -f bench/dump.sql
--
-- public.dump_fetch() makes each key's config on the fly, with no table
-- behind it, so that a million keys are cached as fast as the worker can
-- store them: key-N gets {"key": "key-N", "pad": <30 md5s of the key>},
-- a jsonb of about 1 kB, revision r1.  public.fill() asks for keys
-- key-FROM .. key-TO with projcache.fetch(), in one statement.

CREATE EXTENSION projcache;

CREATE FUNCTION public.dump_fetch(p_keys text[], p_revisions text[])
RETURNS TABLE(key text, state text, revision text, config jsonb)
LANGUAGE sql STABLE AS $$
    SELECT k, 'enabled', 'r1',
           pg_catalog.jsonb_build_object('key', k, 'pad', pg_catalog.repeat(pg_catalog.md5(k), 30))
      FROM pg_catalog.unnest(p_keys) AS k
$$;

CREATE FUNCTION public.fill(p_from int, p_to int) RETURNS bigint
LANGUAGE sql AS $$
    SELECT pg_catalog.count(projcache.fetch('key-' || g))
      FROM pg_catalog.generate_series(p_from, p_to) AS g
$$;
