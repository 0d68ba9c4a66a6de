-- bench/compare/setup.sql - the key-value side of bench/compare.sh, run
-- after bench/snapshots/setup.sql (which creates projcache, the tables its
-- snapshots cache and their foreign tables).
--
-- public.configs holds 1,000 keys key-1 .. key-1000 whose configs print as
-- exactly 1,024 bytes of text (random hex, as bench/peers.sql makes them).
-- Every key-value bar of the bench reads one of these values by a random
-- key: projcache.get() (fetched through public.fetch_configs), the table
-- by its primary key, pgmemcache's memcache_get() and Redis GET (both
-- loaded from this table by bench/compare.sh), and the 1 kB constant query
-- returns the value of key-1 as a literal.

CREATE EXTENSION pgmemcache;

CREATE TABLE public.configs (key text PRIMARY KEY, revision text NOT NULL,
                             config jsonb NOT NULL);
INSERT INTO public.configs (key, revision, config)
SELECT 'key-' || i, 'r1',
       jsonb_build_object('i', i, 'pad',
           left((SELECT string_agg(md5(i::text || '-' || j::text), '' ORDER BY j)
                   FROM generate_series(1, 40) AS j),
                1024 - length(format('{"i": %s, "pad": ""}', i))))
  FROM generate_series(1, 1000) AS i;
VACUUM ANALYZE public.configs;

DO $$
BEGIN
    IF (SELECT count(*) FROM public.configs
         WHERE pg_catalog.octet_length(config::text) = 1024) <> 1000 THEN
        RAISE EXCEPTION 'bench/compare/setup.sql: the configs are not all 1,024 bytes';
    END IF;
END $$;

CREATE FUNCTION public.fetch_configs(p_keys text[], p_revisions text[])
RETURNS TABLE(key text, state text, revision text, config jsonb)
LANGUAGE sql STABLE AS $$
    SELECT c.key, 'enabled', c.revision, c.config
      FROM public.configs c WHERE c.key = ANY (p_keys)
$$;
