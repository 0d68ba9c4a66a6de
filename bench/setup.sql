-- bench/setup.sql - schema and helpers for bench/run.sh (throwaway cluster).
--
-- The upstream table and fetch function follow the README's example; the
-- helpers in schema "bench" time things inside one backend, with
-- clock_timestamp(), so no client round trip is included.

CREATE EXTENSION projcache;

-- ------------------------------------------------------------ key cache
-- 1,000 hot keys (key-1 .. key-1000) and 10,000 cold ones (cold-1 ..
-- cold-10000), each with a small config of about 100 bytes.
CREATE TABLE public.project_configs (
    key      text PRIMARY KEY,
    config   jsonb NOT NULL,
    revision text NOT NULL
);
INSERT INTO public.project_configs (key, config, revision)
SELECT k, jsonb_build_object('plan', 'pro', 'rate_limit', g,
                             'region', 'eu-west-1', 'features',
                             jsonb_build_array('sso', 'audit', 'api')),
       'r1'
  FROM (SELECT 'key-' || g AS k, g FROM generate_series(1, 1000) g
        UNION ALL
        SELECT 'cold-' || g, g FROM generate_series(1, 10000) g) s;
VACUUM ANALYZE public.project_configs;

CREATE FUNCTION public.fetch_project_configs(keys text[], revisions text[])
RETURNS TABLE(key text, state text, revision text, config jsonb)
LANGUAGE sql STABLE AS $$
    SELECT c.key,
           CASE WHEN c.revision = r.rev THEN 'not_modified' ELSE 'enabled' END,
           c.revision,
           c.config
      FROM unnest(keys, revisions) AS r(key, rev)
      JOIN public.project_configs c USING (key)
$$;

CREATE SCHEMA bench;

-- The loop alone: array subscript, an assignment and a NULL test per
-- iteration, the same work the two loops below do around their call.
CREATE FUNCTION bench.loop_baseline(n int, OUT us_per_call float8, OUT nonnull int)
LANGUAGE plpgsql AS $$
DECLARE
    keys text[] := ARRAY(SELECT 'key-' || g FROM generate_series(1, 1000) g);
    v    text;
    t0   timestamptz;
BEGIN
    nonnull := 0;
    t0 := clock_timestamp();
    FOR i IN 1..n LOOP
        v := keys[1 + i % 1000];
        IF v IS NOT NULL THEN nonnull := nonnull + 1; END IF;
    END LOOP;
    us_per_call := extract(epoch FROM clock_timestamp() - t0) * 1e6 / n;
END $$;

CREATE FUNCTION bench.loop_get(n int, OUT us_per_call float8, OUT nonnull int)
LANGUAGE plpgsql AS $$
DECLARE
    keys text[] := ARRAY(SELECT 'key-' || g FROM generate_series(1, 1000) g);
    v    jsonb;
    t0   timestamptz;
BEGIN
    nonnull := 0;
    t0 := clock_timestamp();
    FOR i IN 1..n LOOP
        v := projcache.get(keys[1 + i % 1000]);
        IF v IS NOT NULL THEN nonnull := nonnull + 1; END IF;
    END LOOP;
    us_per_call := extract(epoch FROM clock_timestamp() - t0) * 1e6 / n;
END $$;

-- The same two loops with the key built as 'key-' || n on each call (no
-- array): what one get() hit costs in the backend, by difference.
CREATE FUNCTION bench.loop_built_key(n int, OUT us_per_call float8, OUT nonnull int)
LANGUAGE plpgsql AS $$
DECLARE
    v    text;
    t0   timestamptz;
BEGIN
    nonnull := 0;
    t0 := clock_timestamp();
    FOR i IN 1..n LOOP
        v := 'key-' || (1 + i % 1000);
        IF v IS NOT NULL THEN nonnull := nonnull + 1; END IF;
    END LOOP;
    us_per_call := extract(epoch FROM clock_timestamp() - t0) * 1e6 / n;
END $$;

CREATE FUNCTION bench.loop_get_built_key(n int, OUT us_per_call float8, OUT nonnull int)
LANGUAGE plpgsql AS $$
DECLARE
    v    jsonb;
    t0   timestamptz;
BEGIN
    nonnull := 0;
    t0 := clock_timestamp();
    FOR i IN 1..n LOOP
        v := projcache.get('key-' || (1 + i % 1000));
        IF v IS NOT NULL THEN nonnull := nonnull + 1; END IF;
    END LOOP;
    us_per_call := extract(epoch FROM clock_timestamp() - t0) * 1e6 / n;
END $$;

-- The same two with keys spread over key-1 .. key-nkeys: each call jumps
-- 7,919 keys on (a prime, so every key is read once in nkeys calls), so
-- that with many keys a hit reads memory the last ones did not bring into
-- the CPU's caches.
CREATE FUNCTION bench.loop_get_spread_key(n int, nkeys int,
                                          OUT us_per_call float8, OUT nonnull int)
LANGUAGE plpgsql AS $$
DECLARE
    v    jsonb;
    t0   timestamptz;
BEGIN
    nonnull := 0;
    t0 := clock_timestamp();
    FOR i IN 1..n LOOP
        v := projcache.get('key-' || (1 + (i::int8 * 7919) % nkeys));
        IF v IS NOT NULL THEN nonnull := nonnull + 1; END IF;
    END LOOP;
    us_per_call := extract(epoch FROM clock_timestamp() - t0) * 1e6 / n;
END $$;

CREATE FUNCTION bench.loop_spread_key(n int, nkeys int,
                                      OUT us_per_call float8, OUT nonnull int)
LANGUAGE plpgsql AS $$
DECLARE
    v    text;
    t0   timestamptz;
BEGIN
    nonnull := 0;
    t0 := clock_timestamp();
    FOR i IN 1..n LOOP
        v := 'key-' || (1 + (i::int8 * 7919) % nkeys);
        IF v IS NOT NULL THEN nonnull := nonnull + 1; END IF;
    END LOOP;
    us_per_call := extract(epoch FROM clock_timestamp() - t0) * 1e6 / n;
END $$;

CREATE FUNCTION bench.loop_table(n int, OUT us_per_call float8, OUT nonnull int)
LANGUAGE plpgsql AS $$
DECLARE
    keys text[] := ARRAY(SELECT 'key-' || g FROM generate_series(1, 1000) g);
    v    jsonb;
    t0   timestamptz;
BEGIN
    nonnull := 0;
    t0 := clock_timestamp();
    FOR i IN 1..n LOOP
        SELECT c.config INTO v FROM public.project_configs c
         WHERE c.key = keys[1 + i % 1000];
        IF v IS NOT NULL THEN nonnull := nonnull + 1; END IF;
    END LOOP;
    us_per_call := extract(epoch FROM clock_timestamp() - t0) * 1e6 / n;
END $$;

-- Cold path: request n unknown keys at once, then wait until every one is
-- enabled.  Cheap polls of the counters first, then of the entries.
CREATE FUNCTION bench.cold_fetch(n int, timeout_s float8,
    OUT request_ms float8, OUT total_ms float8, OUT enabled bigint,
    OUT fetch_calls bigint, OUT fetched_keys bigint, OUT request_overflows bigint,
    OUT fetch_errors bigint, OUT pending_results bigint)
LANGUAGE plpgsql AS $$
DECLARE
    keys  text[] := ARRAY(SELECT 'cold-' || g FROM generate_series(1, n) g);
    t0    timestamptz;
    limit_at timestamptz;
    asked bigint;
BEGIN
    PERFORM projcache.reset_stats();
    t0 := clock_timestamp();
    limit_at := t0 + make_interval(secs => timeout_s);
    SELECT count(projcache.fetch(k)) INTO asked FROM unnest(keys) AS k;
    request_ms := extract(epoch FROM clock_timestamp() - t0) * 1e3;
    LOOP
        EXIT WHEN (SELECT s.fetched_keys FROM projcache.stats s) >= n
               OR clock_timestamp() > limit_at;
        PERFORM pg_sleep(0.005);
    END LOOP;
    LOOP
        SELECT count(*) INTO enabled FROM projcache.entries e
         WHERE e.key LIKE 'cold-%' AND e.state = 'enabled'
           AND e.fetch_state = 'complete';
        EXIT WHEN enabled >= n OR clock_timestamp() > limit_at;
        PERFORM pg_sleep(0.005);
    END LOOP;
    total_ms := extract(epoch FROM clock_timestamp() - t0) * 1e3;
    SELECT s.fetch_calls, s.fetched_keys, s.request_overflows, s.fetch_errors,
           s.pending_results
      INTO fetch_calls, fetched_keys, request_overflows, fetch_errors,
           pending_results
      FROM projcache.stats s;
END $$;

-- The upstream alone: the fetch function on all n cold keys in one call.
CREATE FUNCTION bench.time_upstream(n int, OUT ms float8, OUT rows bigint)
LANGUAGE plpgsql AS $$
DECLARE
    keys text[] := ARRAY(SELECT 'cold-' || g FROM generate_series(1, n) g);
    revs text[] := array_fill(NULL::text, ARRAY[n]);
    t0   timestamptz;
BEGIN
    t0 := clock_timestamp();
    SELECT count(*) INTO rows FROM public.fetch_project_configs(keys, revs);
    ms := extract(epoch FROM clock_timestamp() - t0) * 1e3;
END $$;

-- ------------------------------------------------------------ snapshots
CREATE TABLE public.snap_src (a int, b text, c int);
INSERT INTO public.snap_src
SELECT g, substr(md5(g::text), 1, 10), g % 97 FROM generate_series(1, 10000) g;
VACUUM ANALYZE public.snap_src;

-- One read of snapshot 's' (the first one after create_snapshot is the
-- cold load).
CREATE FUNCTION bench.time_snapshot_read(OUT ms float8, OUT rows bigint)
LANGUAGE plpgsql AS $$
DECLARE t0 timestamptz;
BEGIN
    t0 := clock_timestamp();
    SELECT count(*) INTO rows FROM projcache.snapshot('s') AS t(a int, b text, c int);
    ms := extract(epoch FROM clock_timestamp() - t0) * 1e3;
END $$;

-- Average of n forced reloads (refresh_snapshot).
CREATE FUNCTION bench.time_refresh(n int, OUT ms float8, OUT ok int)
LANGUAGE plpgsql AS $$
DECLARE t0 timestamptz;
BEGIN
    ok := 0;
    t0 := clock_timestamp();
    FOR i IN 1..n LOOP
        IF projcache.refresh_snapshot('s') THEN ok := ok + 1; END IF;
    END LOOP;
    ms := extract(epoch FROM clock_timestamp() - t0) * 1e3 / n;
END $$;

-- This backend's minor page faults so far (Linux: field 10 of
-- /proc/self/stat), or NULL where that cannot be read.
CREATE FUNCTION bench.minflt() RETURNS bigint LANGUAGE plpgsql AS $$
BEGIN
    RETURN split_part(split_part(pg_read_file('/proc/self/stat'), ') ', 2), ' ', 8)::bigint;
EXCEPTION WHEN OTHERS THEN
    RETURN NULL;
END $$;

-- Average of n in-server reads: 'snapshot' (fast path) or 'table', with
-- the minor page faults the backend took per read.
CREATE FUNCTION bench.time_reads(what text, n int,
    OUT ms float8, OUT rows bigint, OUT faults float8)
LANGUAGE plpgsql AS $$
DECLARE
    t0 timestamptz;
    f0 bigint := bench.minflt();
BEGIN
    t0 := clock_timestamp();
    FOR i IN 1..n LOOP
        IF what = 'snapshot' THEN
            SELECT count(*) INTO rows FROM projcache.snapshot('s') AS t(a int, b text, c int);
        ELSE
            SELECT count(*) INTO rows FROM public.snap_src;
        END IF;
    END LOOP;
    ms := extract(epoch FROM clock_timestamp() - t0) * 1e3 / n;
    faults := (bench.minflt() - f0)::float8 / n;
END $$;
