-- bench/configs_1kb.sql - public.configs, keys key-1 .. key-:nkeys whose
-- configs print as exactly 1,024 bytes of text (random hex, as
-- bench/peers.sql makes them), and public.fetch_configs serving them.
-- Included (\ir) with psql's variable nkeys set, by bench/compare/setup.sql
-- (1,000 keys) and bench/hit_1kb.sql (100,000).

CREATE TABLE public.configs (key text PRIMARY KEY, revision text NOT NULL,
                             config jsonb NOT NULL);
INSERT INTO public.configs (key, revision, config)
SELECT 'key-' || i, 'r1',
       jsonb_build_object('i', i, 'pad',
           left((SELECT string_agg(md5(i::text || '-' || j::text), '' ORDER BY j)
                   FROM generate_series(1, 40) AS j),
                1024 - length(format('{"i": %s, "pad": ""}', i))))
  FROM generate_series(1, :nkeys) AS i;
VACUUM ANALYZE public.configs;

SELECT count(*) = :nkeys AS all_1kb
  FROM public.configs WHERE pg_catalog.octet_length(config::text) = 1024 \gset
\if :all_1kb
\else
\warn 'bench/configs_1kb.sql: the configs are not all 1,024 bytes'
SELECT 1/0;
\endif

CREATE FUNCTION public.fetch_configs(p_keys text[], p_revisions text[])
RETURNS TABLE(key text, state text, revision text, config jsonb)
LANGUAGE sql STABLE AS $$
    SELECT c.key, 'enabled', c.revision, c.config
      FROM public.configs c WHERE c.key = ANY (p_keys)
$$;
