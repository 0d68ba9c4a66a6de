-- bench/snapshots/setup.sql - tables, snapshots and foreign tables for
-- bench/snapshots.sh.  Each table is cached twice: read through snapshot()
-- and through a foreign table.
CREATE EXTENSION projcache;

-- 10,000 rows of (text, text), the key a primary key.
CREATE TABLE public.big (k text PRIMARY KEY, v text NOT NULL);
INSERT INTO public.big SELECT 'k' || g, md5(g::text) FROM generate_series(1, 10000) g;
-- 100 rows of (text, jsonb of about 1 kB, text).
CREATE TABLE public.small (k text PRIMARY KEY, config jsonb NOT NULL, tag text NOT NULL);
INSERT INTO public.small
SELECT 'p' || g,
       jsonb_build_object('plan', 'pro', 'pad',
           (SELECT string_agg(md5(g::text || '-' || j::text), '') FROM generate_series(1, 30) j)),
       'tag-' || g
  FROM generate_series(1, 100) g;
-- For the join: projects and their owners.
CREATE TABLE public.projects (key text PRIMARY KEY, owner_id text NOT NULL);
INSERT INTO public.projects SELECT 'p' || g, 'k' || g FROM generate_series(1, 10000) g;
VACUUM ANALYZE public.big, public.small, public.projects;

SELECT projcache.create_snapshot('big', 'SELECT k, v FROM public.big', '1h', key => 'k');
SELECT projcache.create_snapshot('small', 'SELECT k, config, tag FROM public.small', '1h');
CREATE SCHEMA snapbench;
IMPORT FOREIGN SCHEMA projcache FROM SERVER projcache INTO snapbench;
SELECT count(*) FROM snapbench.big;
SELECT count(*) FROM snapbench.small;
