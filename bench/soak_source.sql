-- bench/soak_source.sql - the source server of bench/soak.sh, loaded with
--     psql -v hot_keys=N -v cold_keys=N -v grant_rows=N -f bench/soak_source.sql
--
-- public.configs holds hot1 .. hotN and cold1 .. coldN, each at revision r1
-- with a config of about 300 bytes ({"id", "version", "blob": 8 md5s}).
-- public.fetch() is what the cache's fetch function calls through dblink:
-- `not_modified` (and no config) for a key whose revision the cache holds,
-- else the row.  public.grants is the snapshot's table, read through
-- public.grants_rows().  Both sleep public.fault.slow_seconds first: the
-- bench sets it above projcache.fetch_timeout for the "source slow" fault.

CREATE TABLE public.configs (
    key      text PRIMARY KEY,
    revision text NOT NULL,
    config   jsonb NOT NULL
);
INSERT INTO public.configs
SELECT k, 'r1',
       jsonb_build_object('id', k, 'version', 1,
                          'blob', (SELECT string_agg(md5(k || '-' || j), '')
                                     FROM generate_series(1, 8) AS j))
  FROM (SELECT 'hot' || i AS k FROM generate_series(1, :hot_keys) AS i
        UNION ALL
        SELECT 'cold' || i FROM generate_series(1, :cold_keys) AS i) AS keys;

CREATE TABLE public.grants (
    user_id  int PRIMARY KEY,
    project  text NOT NULL,
    audience text NOT NULL
);
INSERT INTO public.grants
SELECT i, 'hot' || (1 + i % :hot_keys), (ARRAY['admin', 'editor', 'viewer'])[1 + i % 3]
  FROM generate_series(1, :grant_rows) AS i;
VACUUM ANALYZE public.configs, public.grants;

CREATE TABLE public.fault (slow_seconds float8 NOT NULL);
INSERT INTO public.fault VALUES (0);

CREATE FUNCTION public.slow_down() RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    s float8 := (SELECT f.slow_seconds FROM public.fault AS f);
BEGIN
    IF s > 0 THEN
        PERFORM pg_sleep(s);
    END IF;
END
$$;

CREATE FUNCTION public.fetch(p_keys text[], p_revisions text[])
RETURNS TABLE(key text, state text, revision text, config jsonb)
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM public.slow_down();
    RETURN QUERY
        SELECT c.key,
               CASE WHEN c.revision = r.rev THEN 'not_modified' ELSE 'enabled' END,
               c.revision,
               CASE WHEN c.revision = r.rev THEN NULL ELSE c.config END
          FROM unnest(p_keys, p_revisions) AS r(k, rev)
          JOIN public.configs AS c ON c.key = r.k;
END
$$;

CREATE FUNCTION public.grants_rows() RETURNS SETOF public.grants
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM public.slow_down();
    RETURN QUERY SELECT g.* FROM public.grants AS g;
END
$$;
