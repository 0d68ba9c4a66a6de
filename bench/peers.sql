-- bench/peers.sql - the source and the read function of bench/peers.sh.
--
-- public.upstream holds what every cache of the run serves, read-through:
-- 200,000 keys k1 .. k200000 with configs of about 1 kB (as
-- bench/working_set.sql makes them: random text, so not compressible), and
-- 5,000 keys each of b100-N, b1024-N and b4096-N whose configs print as
-- exactly 100, 1,024 and 4,096 bytes of text, for the bytes per key; and
-- keys f<size>-N made by the fetch function itself, for the keys held.
-- bench/peers.py makes the same text for Redis and memcached, and checks
-- that it does.  The column is stored uncompressed, so that the 4 kB values
-- reach projcache as they reach the other caches.
--
-- public.peers_burst() is one burst of reads: get() of each key in order,
-- counting the non-NULL answers among the keys marked counted (the scan's
-- own reads are not), and the reads that failed.

CREATE EXTENSION projcache;

CREATE TABLE public.upstream (key text PRIMARY KEY, state text NOT NULL DEFAULT 'enabled',
                              revision text, config jsonb);
ALTER TABLE public.upstream ALTER COLUMN config SET STORAGE EXTERNAL;

INSERT INTO public.upstream (key, revision, config)
SELECT 'k' || i, 'r1',
       jsonb_build_object('i', i, 'pad',
           (SELECT string_agg(md5(i::text || '-' || j::text), '' ORDER BY j)
              FROM generate_series(1, 30) AS j))
  FROM generate_series(1, 200000) AS i;

INSERT INTO public.upstream (key, revision, config)
SELECT 'b' || s || '-' || i, 'r1',
       jsonb_build_object('i', i, 'pad',
           left((SELECT string_agg(md5(i::text || '-' || j::text), '' ORDER BY j)
                   FROM generate_series(1, 130) AS j),
                s - length(format('{"i": %s, "pad": ""}', i))))
  FROM unnest(ARRAY[100, 1024, 4096]) AS s, generate_series(1, 5000) AS i;

VACUUM ANALYZE public.upstream;

-- Keys f<size>-<i>, for the keys held in a full cache, are made on the fly
-- (up to 840,000 of them are read): configs that print as exactly <size>
-- bytes of text, their pad the key's md5 repeated (not compressible by
-- any of the caches, which compress nothing).
CREATE FUNCTION public.fill_config(k text) RETURNS jsonb
LANGUAGE sql IMMUTABLE AS $$
    SELECT jsonb_build_object('i', i, 'pad',
               left(repeat(md5(k), 130),
                    split_part(substr(k, 2), '-', 1)::int
                    - length(format('{"i": %s, "pad": ""}', i))))
      FROM (SELECT split_part(k, '-', 2)::int AS i) AS s
$$;

CREATE FUNCTION public.fetch(p_keys text[], p_revisions text[])
RETURNS TABLE(key text, state text, revision text, config jsonb)
LANGUAGE sql STABLE AS $$
    SELECT u.key, u.state, u.revision, u.config FROM public.upstream u WHERE u.key = ANY (p_keys)
    UNION ALL
    SELECT k, 'enabled', 'r1', public.fill_config(k)
      FROM unnest(p_keys) AS k WHERE k LIKE 'f%'
$$;

CREATE FUNCTION public.peers_burst(keys text[], counted bool[],
    OUT hits int, OUT reads int, OUT failed int)
LANGUAGE plpgsql AS $$
DECLARE
    v jsonb;
BEGIN
    hits := 0;
    reads := 0;
    failed := 0;
    FOR n IN 1..cardinality(keys) LOOP
        IF counted[n] THEN
            reads := reads + 1;
        END IF;
        BEGIN
            v := projcache.get(keys[n]);
        EXCEPTION WHEN others THEN
            failed := failed + 1;
            CONTINUE;
        END;
        IF counted[n] AND v IS NOT NULL THEN
            hits := hits + 1;
        END IF;
    END LOOP;
END
$$;
