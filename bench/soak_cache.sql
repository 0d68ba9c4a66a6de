-- bench/soak_cache.sql - the cache server of bench/soak.sh, loaded with
--     psql -v connstr='host=... port=...' -v ttl=5s -f bench/soak_cache.sql
--
-- Both the key cache and the snapshot read the source server (see
-- bench/soak_source.sql) through dblink, one connection a call: the fetch
-- function passes the revisions it holds, so that an unchanged key comes
-- back `not_modified`; the snapshot "grants" is its 500-row table, indexed
-- by user_id, with a TTL of projcache.expiry, read through the foreign
-- table public.grants.

CREATE EXTENSION projcache;
CREATE EXTENSION dblink;

CREATE TABLE public.source_server (connstr text NOT NULL);
INSERT INTO public.source_server VALUES (:'connstr');

CREATE FUNCTION public.fetch_remote(p_keys text[], p_revisions text[])
RETURNS TABLE(key text, state text, revision text, config jsonb)
LANGUAGE sql STABLE AS $$
    SELECT r.key, r.state, r.revision, r.config
      FROM dblink((SELECT s.connstr FROM public.source_server AS s),
                  format('SELECT * FROM public.fetch(%L::text[], %L::text[])',
                         p_keys, p_revisions))
        AS r(key text, state text, revision text, config jsonb)
$$;

SELECT projcache.create_snapshot('grants',
    $q$SELECT g.user_id, g.project, g.audience
         FROM dblink((SELECT s.connstr FROM public.source_server AS s),
                     'SELECT user_id, project, audience FROM public.grants_rows()')
           AS g(user_id int, project text, audience text)$q$,
    ttl => :'ttl'::interval, key => 'user_id');

CREATE FOREIGN TABLE public.grants (user_id int, project text, audience text)
    SERVER projcache OPTIONS (snapshot 'grants');
