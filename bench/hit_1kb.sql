-- bench/hit_1kb.sql - 100,000 keys of 1 kB for bench/hit_path.sh's second
-- part, run after bench/setup.sql (bench/configs_1kb.sql: public.configs
-- and public.fetch_configs).  Read at random they are 120 MB of shared
-- memory, far more than a CPU's caches hold, where the constant query
-- beside them reads the same 1 kB from its plan every time.

\set nkeys 100000
\ir configs_1kb.sql
