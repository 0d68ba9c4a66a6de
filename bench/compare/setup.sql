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

\set nkeys 1000
\ir ../configs_1kb.sql
