-- bench/working_set.sql - the working-set scenario of eviction under memory
-- pressure, shared by bench/hit_path.sh and TAP test 013.
--
-- Needs public.upstream(key, state, revision, config) and a fetch function
-- reading it.  Adds 50,000 keys k1 .. k50000 with configs of about 1 kB
-- (random text, so not compressible), and public.round(), one round of the
-- scenario: 5,000 get() calls, 80 % on the hot set [hot_from, hot_from +
-- 5000), 20 % spread over all 50,000 keys, paced at about 5,000 a second
-- as clients would send them.  A round returns the reads that failed, its
-- hit ratio (projcache.stats, reset when the round starts) and the most
-- memory_used seen (sampled every 500 reads).

INSERT INTO public.upstream (key, revision, config)
SELECT 'k' || i, 'r1',
       jsonb_build_object('i', i, 'pad',
           (SELECT string_agg(md5(i::text || '-' || j::text), '')
              FROM generate_series(1, 30) AS j))
  FROM generate_series(1, 50000) AS i;

CREATE FUNCTION public.round(hot_from int, seed float8,
    OUT failed int, OUT hit_ratio float8, OUT max_used bigint)
LANGUAGE plpgsql AS $$
DECLARE
    k int;
BEGIN
    failed := 0;
    max_used := 0;
    PERFORM setseed(seed);
    PERFORM projcache.reset_stats();
    FOR n IN 1..5000 LOOP
        IF random() < 0.8 THEN
            k := hot_from + floor(random() * 5000)::int;
        ELSE
            k := 1 + floor(random() * 50000)::int;
        END IF;
        BEGIN
            PERFORM projcache.get('k' || k);
        EXCEPTION WHEN others THEN
            failed := failed + 1;
        END;
        IF n % 500 = 0 THEN
            max_used := greatest(max_used, (SELECT s.memory_used FROM projcache.stats s));
        END IF;
        IF n % 50 = 0 THEN
            PERFORM pg_sleep(0.01);
        END IF;
    END LOOP;
    SELECT s.hit_ratio INTO hit_ratio FROM projcache.stats s;
END
$$;
