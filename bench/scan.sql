-- bench/scan.sql - the scan scenario of bench/scan.sh (issue 19, the one TAP
-- test 027 runs), loaded into a throwaway cluster with
--     psql -v hot_keys=N -v cold_keys=N -v delay=SECONDS -f bench/scan.sql
--
-- The source, public.upstream, holds hot1 .. hotN and cold1 .. coldN with
-- configs of about 300 bytes; public.slow_fetch() sleeps `delay` seconds a
-- call, as a slow source would.  A small snapshot, "settings", is there to
-- be refreshed while the scan runs.  Then the sessions of the scenario, each
-- a procedure the script CALLs from its own connection:
--   public.hot_reader()   a hot client: reads random hot keys every so often
--                         and, when it stops, writes each batch's time and
--                         NULLs to public.hot_reads
--   public.scan()         the scanner: after a while, reads every cold key
--                         once, a chunk at a time, its progress committed to
--                         public.progress after each chunk
--   public.sampler()      projcache.stats and the scan's progress, once a
--                         second, into public.samples
--   public.refresher()    a while into the scan, changes the snapshot's
--                         source and asks for refresh_snapshot(), timed
-- public.phase says when the scan started and ended; the others stop on it.

CREATE EXTENSION projcache;

CREATE TABLE public.upstream (
    key      text PRIMARY KEY,
    state    text NOT NULL DEFAULT 'enabled',
    revision text,
    config   jsonb
);
INSERT INTO public.upstream (key, revision, config)
SELECT k, 'r1', jsonb_build_object('pad', repeat(md5(k), 9))
  FROM (SELECT 'hot' || i AS k FROM generate_series(1, :hot_keys) AS i
        UNION ALL
        SELECT 'cold' || i FROM generate_series(1, :cold_keys) AS i) AS keys;
VACUUM ANALYZE public.upstream;

CREATE TABLE public.scan_conf (delay float8 NOT NULL);
INSERT INTO public.scan_conf VALUES (:delay);

CREATE FUNCTION public.slow_fetch(p_keys text[], p_revisions text[])
RETURNS TABLE(key text, state text, revision text, config jsonb)
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_sleep((SELECT c.delay FROM public.scan_conf AS c));
    RETURN QUERY
        SELECT u.key, u.state, u.revision, u.config
          FROM public.upstream AS u
         WHERE u.key = ANY (p_keys);
END
$$;

CREATE TABLE public.settings (id int PRIMARY KEY, val text);
INSERT INTO public.settings SELECT i, 'v' || i FROM generate_series(1, 100) AS i;
SELECT projcache.create_snapshot('settings', 'SELECT id, val FROM public.settings', '1h') \gset

CREATE TABLE public.phase (name text PRIMARY KEY, at timestamptz NOT NULL);
CREATE TABLE public.progress (scanned int NOT NULL, nonnull int NOT NULL);
INSERT INTO public.progress VALUES (0, 0);
CREATE TABLE public.hot_reads (at timestamptz NOT NULL, reads int NOT NULL, nulls int NOT NULL);
CREATE TABLE public.samples AS
SELECT clock_timestamp() AS at, p.scanned, s.entries, s.memory_used, s.memory_limit,
       s.evictions_memory, s.evictions, s.evictions_expired, s.refused_reads,
       s.fetch_calls, s.fetched_keys
  FROM projcache.stats AS s, public.progress AS p
  WITH NO DATA;
CREATE TABLE public.refresh (
    asked_at  timestamptz NOT NULL,
    done_at   timestamptz,
    result    boolean,
    new_value boolean,
    scanning  boolean
);

-- public.ended(): when the scan ended, or NULL while it has not.
CREATE FUNCTION public.ended() RETURNS timestamptz
LANGUAGE sql STABLE AS $$
    SELECT at FROM public.phase WHERE name = 'scan_ended'
$$;

-- A hot client: `batch` random keys of hot1 .. hot<hot_keys> every `pause`
-- seconds, until `after` seconds after the scan ended (or `max_seconds`).
CREATE PROCEDURE public.hot_reader(hot_keys int, batch int, pause float8,
                                   after float8, max_seconds float8)
LANGUAGE plpgsql AS $$
DECLARE
    t0     timestamptz := clock_timestamp();
    t      timestamptz;
    ended  timestamptz;
    nulls  int;
    ats    timestamptz[] := '{}';
    counts int[] := '{}';
BEGIN
    LOOP
        t := clock_timestamp();
        ended := public.ended();
        EXIT WHEN ended IS NOT NULL AND t > ended + make_interval(secs => after);
        EXIT WHEN t > t0 + make_interval(secs => max_seconds);
        SELECT count(*) FILTER (WHERE projcache.get('hot' || i) IS NULL)
          INTO nulls
          FROM (SELECT 1 + floor(random() * hot_keys)::int AS i
                  FROM generate_series(1, batch)) AS r;
        ats := ats || t;
        counts := counts || nulls;
        PERFORM pg_sleep(pause);
    END LOOP;
    INSERT INTO public.hot_reads SELECT a, batch, c FROM unnest(ats, counts) AS u(a, c);
END
$$;

-- The scanner: waits `before` seconds, then reads cold1 .. cold<cold_keys>
-- once each, `chunk` at a time, sleeping `pause` seconds after each chunk
-- (as TAP test 027 does) or, when `seconds` > 0, the chunks spread evenly
-- over that many seconds (back to back if the reads fall behind).
CREATE PROCEDURE public.scan(before float8, cold_keys int, chunk int, pause float8,
                             seconds float8)
LANGUAGE plpgsql AS $$
DECLARE
    started timestamptz;
    step    float8 := seconds / ceil(cold_keys::float8 / chunk);
    n       int := 0;
    k       int := 0;
    got     int;
    ahead   float8;
BEGIN
    PERFORM pg_sleep(before);
    started := clock_timestamp();
    INSERT INTO public.phase VALUES ('scan_started', started);
    COMMIT;
    WHILE n < cold_keys LOOP
        SELECT count(projcache.get('cold' || i)) INTO got
          FROM generate_series(n + 1, least(n + chunk, cold_keys)) AS i;
        n := least(n + chunk, cold_keys);
        k := k + 1;
        UPDATE public.progress SET scanned = n, nonnull = nonnull + got;
        COMMIT;
        IF seconds > 0 THEN
            ahead := extract(epoch FROM started + make_interval(secs => k * step) - clock_timestamp());
        ELSE
            ahead := pause;
        END IF;
        IF ahead > 0 THEN
            PERFORM pg_sleep(ahead);
        END IF;
    END LOOP;
    INSERT INTO public.phase VALUES ('scan_ended', clock_timestamp());
    COMMIT;
END
$$;

-- The sampler: projcache.stats and the scan's progress on every whole
-- second, until `after` seconds after the scan ended (or `max_seconds`).
CREATE PROCEDURE public.sampler(after float8, max_seconds float8)
LANGUAGE plpgsql AS $$
DECLARE
    t0    timestamptz := clock_timestamp();
    ended timestamptz;
BEGIN
    LOOP
        INSERT INTO public.samples
        SELECT clock_timestamp(), p.scanned, s.entries, s.memory_used, s.memory_limit,
               s.evictions_memory, s.evictions, s.evictions_expired, s.refused_reads,
               s.fetch_calls, s.fetched_keys
          FROM projcache.stats AS s, public.progress AS p;
        COMMIT;
        ended := public.ended();
        EXIT WHEN ended IS NOT NULL
              AND clock_timestamp() > ended + make_interval(secs => after + 1);
        EXIT WHEN clock_timestamp() > t0 + make_interval(secs => max_seconds);
        PERFORM pg_sleep(1.0 - extract(epoch FROM clock_timestamp())::numeric % 1);
    END LOOP;
END
$$;

-- The refresher: `into_scan` seconds into the scan, a new value in the snapshot's
-- source, then refresh_snapshot(), timed, and the value read back.
CREATE PROCEDURE public.refresher(into_scan float8)
LANGUAGE plpgsql AS $$
DECLARE
    ok boolean;
    v  text;
BEGIN
    WHILE NOT EXISTS (SELECT 1 FROM public.phase
                       WHERE name = 'scan_started'
                         AND at + make_interval(secs => into_scan) <= clock_timestamp()) LOOP
        PERFORM pg_sleep(0.05);
    END LOOP;
    UPDATE public.settings SET val = 'refreshed' WHERE id = 1;
    INSERT INTO public.refresh (asked_at) VALUES (clock_timestamp());
    COMMIT;
    ok := projcache.refresh_snapshot('settings');
    UPDATE public.refresh SET done_at = clock_timestamp(), result = ok,
                              scanning = public.ended() IS NULL;
    COMMIT;
    SELECT s.val INTO v FROM projcache.snapshot('settings') AS s(id int, val text) WHERE s.id = 1;
    UPDATE public.refresh SET new_value = (v IS NOT DISTINCT FROM 'refreshed');
    COMMIT;
END
$$;

-- What the report prints, from the tables above once the sessions ended.
-- public.phase_of(t, settle): 1 before the scan, 2 while it ran, 3 in the
-- `settle` seconds after it ended, 4 after that.
CREATE FUNCTION public.phase_of(t timestamptz, settle float8) RETURNS int
LANGUAGE sql STABLE AS $$
    SELECT CASE WHEN t < s.at THEN 1
                WHEN e.at IS NULL OR t < e.at THEN 2
                WHEN t < e.at + make_interval(secs => settle) THEN 3
                ELSE 4 END
      FROM public.phase AS s LEFT JOIN public.phase AS e ON e.name = 'scan_ended'
     WHERE s.name = 'scan_started'
$$;

-- One row a second (sec 0 is the second the scan started in): the hot
-- reads made in it and their NULLs, and the last sample taken in it, with
-- its counters less the previous sample's.
CREATE FUNCTION public.per_second(settle float8)
RETURNS TABLE (sec int, phase int, reads bigint, nulls bigint, scanned int,
               entries bigint, memory_used bigint, evictions_memory bigint,
               evictions bigint, refused_reads bigint, fetch_calls bigint)
LANGUAGE sql STABLE AS $$
    WITH b AS (SELECT at AS s FROM public.phase WHERE name = 'scan_started'),
    h AS (SELECT floor(extract(epoch FROM r.at - b.s))::int AS x,
                 sum(r.reads) AS reads, sum(r.nulls) AS nulls
            FROM public.hot_reads AS r, b GROUP BY 1),
    m AS (SELECT DISTINCT ON (1) floor(extract(epoch FROM m.at - b.s))::int AS x, m.*
            FROM public.samples AS m, b ORDER BY 1, m.at DESC),
    d AS (SELECT x, scanned, entries, memory_used,
                 evictions_memory - lag(evictions_memory) OVER w AS evictions_memory,
                 evictions - lag(evictions) OVER w AS evictions,
                 refused_reads - lag(refused_reads) OVER w AS refused_reads,
                 fetch_calls - lag(fetch_calls) OVER w AS fetch_calls
            FROM m WINDOW w AS (ORDER BY x))
    SELECT x, public.phase_of(b.s + make_interval(secs => x), settle),
           h.reads, h.nulls, d.scanned, d.entries, d.memory_used,
           d.evictions_memory, d.evictions, d.refused_reads, d.fetch_calls
      FROM h FULL JOIN d USING (x), b
     ORDER BY x
$$;

-- One row a phase: its length, the hot reads made in it and their NULLs,
-- the scan's keys read in it, entries at its end and the most memory_used
-- sampled in it, and the counters' growth over it (from the last sample
-- before it, or the first sample, to its last sample).
CREATE FUNCTION public.per_phase(settle float8)
RETURNS TABLE (phase int, seconds numeric, reads bigint, nulls bigint,
               scanned bigint, entries bigint, max_memory bigint,
               evictions_memory bigint, evictions bigint, evictions_expired bigint,
               refused_reads bigint, fetch_calls bigint)
LANGUAGE sql STABLE AS $$
    WITH b AS (SELECT s.at AS s, e.at AS e, e.at + make_interval(secs => settle) AS e2,
                      (SELECT min(at) FROM public.samples) AS first,
                      greatest((SELECT max(at) FROM public.samples),
                               (SELECT max(at) FROM public.hot_reads)) AS last
                 FROM public.phase AS s LEFT JOIN public.phase AS e ON e.name = 'scan_ended'
                WHERE s.name = 'scan_started'),
    m AS (SELECT public.phase_of(at, settle) AS p, * FROM public.samples),
    h AS (SELECT public.phase_of(at, settle) AS p, sum(reads) AS reads, sum(nulls) AS nulls
            FROM public.hot_reads GROUP BY 1)
    SELECT p.p,
           round(extract(epoch FROM CASE p.p WHEN 1 THEN b.s - b.first
                                             WHEN 2 THEN coalesce(b.e, b.last) - b.s
                                             WHEN 3 THEN least(b.e2, b.last) - b.e
                                             ELSE b.last - b.e2 END), 1),
           coalesce(h.reads, 0), coalesce(h.nulls, 0),
           c.scanned, l.entries, c.max_memory, c.evictions_memory, c.evictions,
           c.evictions_expired, c.refused_reads, c.fetch_calls
      FROM generate_series(1, 4) AS p(p) CROSS JOIN b
      LEFT JOIN h ON h.p = p.p
      LEFT JOIN LATERAL (SELECT entries FROM m WHERE m.p = p.p ORDER BY at DESC LIMIT 1) AS l ON true
      LEFT JOIN LATERAL (
          SELECT max(m.scanned) FILTER (WHERE m.p <= p.p) - coalesce(max(m.scanned) FILTER (WHERE m.p < p.p), min(m.scanned)) AS scanned,
                 max(m.memory_used) FILTER (WHERE m.p = p.p) AS max_memory,
                 max(m.evictions_memory) FILTER (WHERE m.p <= p.p) - coalesce(max(m.evictions_memory) FILTER (WHERE m.p < p.p), min(m.evictions_memory)) AS evictions_memory,
                 max(m.evictions) FILTER (WHERE m.p <= p.p) - coalesce(max(m.evictions) FILTER (WHERE m.p < p.p), min(m.evictions)) AS evictions,
                 max(m.evictions_expired) FILTER (WHERE m.p <= p.p) - coalesce(max(m.evictions_expired) FILTER (WHERE m.p < p.p), min(m.evictions_expired)) AS evictions_expired,
                 max(m.refused_reads) FILTER (WHERE m.p <= p.p) - coalesce(max(m.refused_reads) FILTER (WHERE m.p < p.p), min(m.refused_reads)) AS refused_reads,
                 max(m.fetch_calls) FILTER (WHERE m.p <= p.p) - coalesce(max(m.fetch_calls) FILTER (WHERE m.p < p.p), min(m.fetch_calls)) AS fetch_calls
            FROM m) AS c ON true
     ORDER BY p.p
$$;
