-- examples/fetch_postgres_fdw.sql - a projcache fetch function that reads
-- the configs from another PostgreSQL server through postgres_fdw.
--
-- Copyright (c) 2026, projcache developers
--
-- The other server (the upstream) holds the source of truth, the same
-- table as in the README's local example, and a role that may read it:
--
--     CREATE TABLE public.project_configs (key text PRIMARY KEY, revision text, config jsonb);
--     CREATE ROLE config_reader LOGIN PASSWORD '...';
--     GRANT SELECT ON public.project_configs TO config_reader;
--
-- Its pg_hba.conf must ask config_reader for that password (scram-sha-256):
-- postgres_fdw lets a non-superuser connect only with a password that the
-- remote server really checked.
--
-- Run this file as a superuser, in projcache.database, naming the role the
-- fetch will run as (create it first: CREATE ROLE projcache_fetch NOLOGIN):
--
--     psql -d appdb -v ON_ERROR_STOP=1 \
--          -v upstream_host=config-db.internal -v upstream_port=5432 \
--          -v upstream_dbname=configs -v upstream_user=config_reader \
--          -v upstream_password='...' -v fetch_role=projcache_fetch \
--          -f examples/fetch_postgres_fdw.sql
--
-- (upstream_port defaults to 5432), then set, in postgresql.conf, and
-- SELECT pg_reload_conf():
--
--     projcache.fetch_role = 'projcache_fetch'
--     projcache.fetch_function = 'public.projcache_fetch_fdw'
--
-- It creates the foreign server projcache_upstream, a user mapping for the
-- fetch role (user mappings are per role: projcache looks up the one of the
-- role the fetch runs as, projcache.fetch_role or else the function's
-- owner), the foreign table public.projcache_upstream_configs, and the
-- fetch function.  The fetch role gets SELECT on the foreign table and
-- EXECUTE on the function, nothing else.  The password is stored in the
-- user mapping (pg_user_mappings shows it to superusers and to that role).
--
-- Failures: while the upstream is down, each fetch fails with postgres_fdw's
-- ERROR, for example 'could not connect to server "projcache_upstream"',
-- which projcache counts (stats.fetch_errors) and records as last_error of
-- each key of the batch; the old values keep serving.  postgres_fdw
-- reconnects by itself once the upstream is back.
--
-- Timeouts: projcache.fetch_timeout cancels a slow remote query (postgres_fdw
-- passes the cancel on), but in PostgreSQL 15 not a connection attempt in
-- progress; connect_timeout bounds that one, so keep it below
-- projcache.fetch_timeout.

\set pc_missing ''
\if :{?upstream_host} \else \set pc_missing :pc_missing ' upstream_host' \endif
\if :{?upstream_dbname} \else \set pc_missing :pc_missing ' upstream_dbname' \endif
\if :{?upstream_user} \else \set pc_missing :pc_missing ' upstream_user' \endif
\if :{?upstream_password} \else \set pc_missing :pc_missing ' upstream_password' \endif
\if :{?fetch_role} \else \set pc_missing :pc_missing ' fetch_role' \endif
\if :{?upstream_port} \else \set upstream_port 5432 \endif
SELECT :'pc_missing' <> '' AS pc_missing_any \gset
\if :pc_missing_any
\warn 'missing psql variables (set each with -v NAME=VALUE):' :pc_missing
DO $$ BEGIN RAISE EXCEPTION 'psql variables are missing (see the header of examples/fetch_postgres_fdw.sql)'; END $$;
\quit
\endif

CREATE EXTENSION IF NOT EXISTS postgres_fdw;

CREATE SERVER projcache_upstream FOREIGN DATA WRAPPER postgres_fdw
    OPTIONS (host :'upstream_host', port :'upstream_port',
             dbname :'upstream_dbname', connect_timeout '5',
             application_name 'projcache');

CREATE USER MAPPING FOR :"fetch_role" SERVER projcache_upstream
    OPTIONS (user :'upstream_user', password :'upstream_password');

CREATE FOREIGN TABLE public.projcache_upstream_configs (
    key text NOT NULL,
    revision text,
    config jsonb
) SERVER projcache_upstream
  OPTIONS (schema_name 'public', table_name 'project_configs');

-- "c.key = ANY (keys)" is what postgres_fdw sends to the upstream, so only
-- the batch's rows cross the network; the join with the held revisions is
-- done here.
CREATE FUNCTION public.projcache_fetch_fdw(keys text[], revisions text[])
RETURNS TABLE(key text, state text, revision text, config jsonb)
LANGUAGE sql STABLE AS $$
    SELECT c.key,
           CASE WHEN c.revision = r.rev THEN 'not_modified' ELSE 'enabled' END,
           c.revision,
           c.config
      FROM public.projcache_upstream_configs AS c
      JOIN unnest(keys, revisions) AS r(key, rev) ON r.key = c.key
     WHERE c.key = ANY (keys)
$$;

COMMENT ON FUNCTION public.projcache_fetch_fdw(text[], text[]) IS
    'projcache fetch function: reads public.project_configs on server projcache_upstream (examples/fetch_postgres_fdw.sql)';

REVOKE ALL ON FUNCTION public.projcache_fetch_fdw(text[], text[]) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION public.projcache_fetch_fdw(text[], text[]) TO :"fetch_role";
GRANT SELECT ON public.projcache_upstream_configs TO :"fetch_role";
