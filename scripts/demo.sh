#!/usr/bin/env bash
# demo.sh - a short, printed tour of projcache's key and snapshot caches.
#
#     sudo bash scripts/demo.sh
#
# Installs the dependencies, builds and installs the extension from a copy of
# this tree, starts a throwaway cluster (port 54329, socket and data in a temp
# dir, run by the unprivileged "postgres" OS user) with projcache preloaded
# and its debug clock on, then walks through: cold miss, wait for a fetch,
# hit, an unknown key (negative caching), an upstream failure while the old
# value keeps serving, recovery, a snapshot that outlives an outage, a named
# cache (1.3) owned by a role without superuser rights, read by the role it
# is granted to and refused to another (SQLSTATE 42501), a clean restart
# (pg_ctl restart) after which the keys come back from the dump before any
# fetch, and the counters.  The server is always stopped and the temp dir
# removed on exit, error or Ctrl-C.
set -euo pipefail

# shellcheck source=SCRIPTDIR/lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
NAME=demo
PORT=54329
WORK=
DATA=
SOCK=
cleanup_on_exit

caption() { printf '\n=== %s\n' "$*"; }

# psql against the demo server, stopping at the first error.  Input lines
# are echoed, so the reader sees each statement above its result.
pgsql() { pgrun -a -P null='(null)' "$@"; }

# wait_for WANT SQL SECONDS: run SQL (one value) every 0.1 s until it
# returns WANT, for SECONDS at most.  Prints what it returned last; fails
# if that is not WANT.
wait_for() {
	local want=$1 sql=$2 got='' i
	for ((i = 0; i < $3 * 10; i++)); do
		got=$(pgvalue "$sql")
		[ "$got" = "$want" ] && break
		sleep 0.1
	done
	printf '%s' "$got"
	[ "$got" = "$want" ]
}

# ------------------------------------------------------------ setup
caption "setup: dependencies, build, install, throwaway cluster on port $PORT"
bash "$REPO/scripts/install-deps.sh"
use_major

setup_work projcache-demo
DATA=$WORK/data

start_cluster <<EOF
# projcache demo
listen_addresses = ''
shared_preload_libraries = 'projcache'
projcache.debug_clock = on
projcache.database = 'postgres'
projcache.expiry = '30s'
projcache.grace_period = '60s'
EOF

# ------------------------------------------------------------ 1
caption "1. create the extension, an upstream table and the fetch function it calls"
pgsql <<'SQL'
CREATE EXTENSION projcache;

-- The source of truth: one config per project key.  A row that is not
-- available (or no row at all) is a key the upstream does not know.
CREATE TABLE public.project_configs (
    key       text PRIMARY KEY,
    config    jsonb NOT NULL,
    revision  text NOT NULL,
    available boolean NOT NULL DEFAULT true
);
INSERT INTO public.project_configs (key, config, revision) VALUES
    ('acme',   '{"plan": "pro",  "rate_limit": 100}', 'r1'),
    ('globex', '{"plan": "free", "rate_limit": 10}',  'r1');

-- A switch to simulate an outage: one row = the upstream is down.
CREATE TABLE public.upstream_down (
    down boolean PRIMARY KEY DEFAULT true CHECK (down)
);

-- The fetch function the worker calls with a batch of keys and the
-- revisions it already holds (NULL when it has none).  Keys absent from the
-- result are disabled; an unchanged revision is answered 'not_modified'.
CREATE FUNCTION public.fetch_configs(keys text[], revisions text[])
  RETURNS TABLE(key text, state text, revision text, config jsonb)
  LANGUAGE plpgsql STABLE AS $$
BEGIN
  IF EXISTS (SELECT 1 FROM public.upstream_down) THEN
    RAISE EXCEPTION 'upstream is down';
  END IF;
  RETURN QUERY
    SELECT k.key,
           CASE WHEN k.rev IS NOT NULL AND k.rev = c.revision
                THEN 'not_modified' ELSE 'enabled' END,
           c.revision,
           CASE WHEN k.rev IS NOT NULL AND k.rev = c.revision
                THEN NULL ELSE c.config END
      FROM unnest(keys, revisions) AS k(key, rev)
      JOIN public.project_configs AS c ON c.key = k.key AND c.available;
END
$$;

ALTER SYSTEM SET projcache.fetch_function = 'public.fetch_configs';
SELECT pg_reload_conf();
SQL

# ------------------------------------------------------------ 2
caption "2. cold miss: get() never blocks; it returns NULL and asks the worker for a fetch"
pgsql <<'SQL'
SELECT projcache.get('acme');
SELECT state, freshness FROM projcache.lookup('acme');
SQL

# ------------------------------------------------------------ 3
caption "3. wait up to 5 s for the fetch, then a plain get() is a hit from shared memory"
pgsql <<'SQL'
SELECT projcache.get('acme', '5s');
SELECT projcache.get('acme');
SELECT state, freshness, revision FROM projcache.lookup('acme');
SQL

# ------------------------------------------------------------ 4
caption "4. a key the upstream does not know is cached as disabled (negative caching)"
pgsql <<'SQL'
SELECT state, freshness, config FROM projcache.lookup('nobody', '5s');
SQL

# ------------------------------------------------------------ 5
caption "5. the upstream goes down and 40 s pass: the stale value keeps serving, the error is recorded"
pgsql <<'SQL'
INSERT INTO public.upstream_down DEFAULT VALUES;
SELECT projcache.debug_advance_clock('40s');
SELECT projcache.get('acme');
SELECT pg_sleep(1);
SELECT key, state, freshness, last_error FROM projcache.entries ORDER BY key;
SQL

# ------------------------------------------------------------ 6
caption "6. the upstream recovers with a new revision: the retry picks it up"
pgsql <<'SQL'
DELETE FROM public.upstream_down;
UPDATE public.project_configs
   SET config = '{"plan": "enterprise", "rate_limit": 1000}', revision = 'r2'
 WHERE key = 'acme';
SELECT projcache.debug_advance_clock('2s');
SQL
echo "(waiting up to 10 s for revision r2)"
rev=$(wait_for r2 "SELECT revision FROM projcache.lookup('acme')" 10) || true
pgsql <<'SQL'
SELECT projcache.get('acme');
SELECT state, freshness, revision, last_error FROM projcache.lookup('acme');
SQL
if [ "$rev" != r2 ]; then
	echo "demo: acme still has revision '$rev' after 10 s, expected r2" >&2
	exit 1
fi

# ------------------------------------------------------------ 7
caption "7. the snapshot cache: a whole grants table as one snapshot that outlives an outage"
pgsql <<'SQL'
CREATE TABLE public.grants (user_id int, audience text);
INSERT INTO public.grants VALUES (1, 'billing'), (1, 'admin'), (2, 'billing');

-- Its source query; it fails while the upstream is down.
CREATE FUNCTION public.grants_source()
  RETURNS TABLE(user_id int, audience text) LANGUAGE plpgsql STABLE AS $$
BEGIN
  IF EXISTS (SELECT 1 FROM public.upstream_down) THEN
    RAISE EXCEPTION 'grants database is down';
  END IF;
  RETURN QUERY SELECT g.user_id, g.audience FROM public.grants g;
END
$$;

SELECT projcache.create_snapshot('grants',
    'SELECT user_id, audience FROM public.grants_source()', '30s');

-- First read loads it; within the TTL no query runs.
SELECT * FROM projcache.snapshot('grants') AS g(user_id int, audience text)
 ORDER BY user_id, audience;

-- A lookup joined against it.
SELECT g.audience, projcache.get('acme') ->> 'plan' AS plan
  FROM projcache.snapshot('grants') AS g(user_id int, audience text)
 WHERE g.user_id = 1 ORDER BY 1;

-- The source goes down and the TTL passes: the refresh fails with a
-- WARNING, and the last good snapshot keeps serving.
INSERT INTO public.upstream_down DEFAULT VALUES;
SELECT projcache.debug_advance_clock('31s');
SELECT count(*) AS grants_served
  FROM projcache.snapshot('grants') AS g(user_id int, audience text);
SELECT name, rows, status, refresh_errors, last_error FROM projcache.snapshots;

-- Back up: the next refresh (one TTL later) loads the new rows.
DELETE FROM public.upstream_down;
INSERT INTO public.grants VALUES (3, 'support');
SELECT projcache.debug_advance_clock('31s');
SELECT count(*) AS grants_served
  FROM projcache.snapshot('grants') AS g(user_id int, audience text);
SELECT name, rows, status, refresh_errors FROM projcache.snapshots;
SQL

# ------------------------------------------------------------ 8
caption "8. a named cache (1.3): a team's own source, cache and readers; anyone else gets 42501"
pgsql <<'SQL'
-- The flags team owns its source and its cache, with no superuser rights.
-- The web application may read the flags; billing may not.
CREATE ROLE flags_team;
CREATE ROLE web;
CREATE ROLE billing;
GRANT USAGE ON SCHEMA projcache TO flags_team, web, billing;
GRANT EXECUTE ON FUNCTION
    projcache.create_cache(text, regprocedure, interval, interval, interval,
                           interval, integer, interval, bigint, regrole),
    projcache.grant_cache(text, regrole)
    TO flags_team;
GRANT EXECUTE ON FUNCTION projcache.get(text), projcache.get(text, interval)
    TO web, billing;
CREATE SCHEMA flags AUTHORIZATION flags_team;

-- As the flags team: its table, its fetch function (the worker runs it as
-- flags_team, with that role's rights only), a cache with 1 MB of memory
-- of its own (a non-superuser's cache must have its own), and its reader,
-- in one transaction: the worker publishes the cache with its reader.
SET ROLE flags_team;
CREATE TABLE flags.feature_flags (
    name    text PRIMARY KEY,
    enabled boolean NOT NULL,
    rollout integer NOT NULL
);
INSERT INTO flags.feature_flags VALUES ('dark_mode', true, 50), ('new_checkout', false, 0);
CREATE FUNCTION flags.fetch(keys text[], revisions text[])
  RETURNS TABLE(key text, state text, revision text, config jsonb)
  LANGUAGE sql STABLE AS $$
    SELECT f.name, 'enabled', md5(f::text),
           jsonb_build_object('enabled', f.enabled, 'rollout', f.rollout)
      FROM flags.feature_flags f
     WHERE f.name = ANY (keys)
$$;
BEGIN;
SELECT projcache.create_cache('flags', 'flags.fetch(text[],text[])',
                              expiry => '1 min', max_memory => 1048576);
SELECT projcache.grant_cache('flags', 'web');
COMMIT;
RESET ROLE;
SQL
echo "(waiting up to 5 s for the worker to open the cache)"
if ! state=$(wait_for open "SELECT state FROM projcache.caches WHERE name = 'flags'" 5); then
	echo "demo: the cache flags is '$state' after 5 s, expected open" >&2
	exit 1
fi
pgsql <<'SQL'
SELECT name, owner, fetch_function, expiry, max_memory, state FROM projcache.caches;

-- A key "flags:<name>" is the cache's; its fetch function is asked for <name>.
SET ROLE web;
SELECT projcache.get('flags:dark_mode', '5s');
RESET ROLE;
SQL
# The refusal: psql goes on past the error, which it prints (its stderr
# through tee too, so in order), and shows the SQLSTATE that it kept; the
# demo checks that it is 42501.
pgsql <<'SQL' 2>&1 | tee "$WORK/refused.out"
SET ROLE billing;
\set ON_ERROR_STOP off
SELECT projcache.get('flags:dark_mode');
\echo SQLSTATE :LAST_ERROR_SQLSTATE
\set ON_ERROR_STOP on
RESET ROLE;
SQL
if ! grep -qx 'SQLSTATE 42501' "$WORK/refused.out"; then
	echo "demo: billing's read of flags:dark_mode did not fail with 42501" >&2
	exit 1
fi

# ------------------------------------------------------------ 9
caption "9. a clean restart comes back warm: the keys dumped at shutdown are served before any fetch"
pgsql <<'SQL'
SELECT cache, key, state, freshness, revision FROM projcache.entries ORDER BY key;
SELECT entries, fetch_calls FROM projcache.stats;
SQL
cached=$(pgvalue "SELECT count(*) FROM projcache.entries")
log_size=$(stat -c %s "$WORK/server.log")
echo "\$ pg_ctl restart -m fast"
restart_cluster
echo "\$ ls -l \$PGDATA/projcache_keys.dump; the server log since the restart:"
ls -l "$DATA/projcache_keys.dump"
tail -c +"$((log_size + 1))" "$WORK/server.log" | grep -A1 'projcache loaded' || true
pgsql <<'SQL'
-- The counters start again at the restart; fetch_calls = 0: nothing has
-- been fetched since.  loaded_keys and loaded_dump_age: what the dump
-- written at shutdown brought back.  last_dump_at and last_dump_keys stay
-- NULL until the next dump (projcache.dump_interval, 5 min by default).
SELECT entries, fetch_calls, loaded_keys, loaded_dump_age,
       last_dump_at, last_dump_keys
  FROM projcache.stats;

-- The values read before the restart are served at once, no NULL, no
-- wait; every loaded key is stale, and this first read asks the source.
SELECT projcache.get('acme');
SET ROLE web;
SELECT projcache.get('flags:dark_mode');
RESET ROLE;
SELECT cache, key, state, freshness, revision FROM projcache.entries ORDER BY key;
SQL
loaded=$(pgvalue "SELECT loaded_keys FROM projcache.stats")
if [ "$loaded" != "$cached" ]; then
	echo "demo: $loaded keys loaded after the restart, expected the $cached cached before it" >&2
	exit 1
fi
echo "(waiting up to 10 s for that refresh: the source answers not_modified to the kept revision)"
wait_for fresh "SELECT freshness FROM projcache.lookup('acme')" 10 >/dev/null || true
pgsql <<'SQL'
SELECT state, freshness, revision FROM projcache.lookup('acme');
SELECT fetch_calls, fetched_keys, not_modified FROM projcache.stats;
SQL

# ------------------------------------------------------------ 10
caption "10. the counters"
if ! pgsql -x <<'SQL'
SELECT * FROM projcache.stats;
SQL
then
	echo "(note: SELECT * FROM projcache.stats failed; the demo goes on)"
fi

# ------------------------------------------------------------ done
stop_cluster
echo
echo "demo finished; server stopped"
