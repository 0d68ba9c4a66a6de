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
# value keeps serving, recovery, a snapshot that outlives an outage, and the
# counters.  The server is always
# stopped and the temp dir removed on exit, error or Ctrl-C.
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
rev=
for _ in $(seq 1 20); do
	rev=$(pgvalue "SELECT revision FROM projcache.lookup('acme')")
	[ "$rev" = r2 ] && break
	sleep 0.5
done
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
caption "8. the counters"
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
