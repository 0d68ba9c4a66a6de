-- examples/fetch_http.sql - a projcache fetch function that asks an HTTP
-- config service: one POST per batch of keys, in PL/Python (plpython3u).
--
-- Copyright (c) 2026, projcache developers
--
-- Run it as a superuser, in projcache.database, naming the role the fetch
-- will run as (create it first: CREATE ROLE projcache_fetch NOLOGIN):
--
--     psql -d appdb -v ON_ERROR_STOP=1 -v fetch_role=projcache_fetch \
--          -f examples/fetch_http.sql
--
-- then set, in postgresql.conf, and SELECT pg_reload_conf():
--
--     projcache_http.url = 'http://config.internal:8080/v1/configs'
--     projcache.fetch_role = 'projcache_fetch'
--     projcache.fetch_function = 'public.projcache_fetch_http'
--
-- Why a superuser: plpython3u is an untrusted language.  Only a superuser
-- can create it and create or replace functions in it, and its Python code
-- can do whatever the server's OS user can (files, sockets), whichever role
-- calls it.  The function is owned by that superuser, and projcache runs
-- the fetch as its owner unless projcache.fetch_role is set: set it, so
-- that the SQL the function runs (reading two settings) runs as a plain
-- role.  That role needs only EXECUTE, granted below; PUBLIC gets none.
--
-- The service's protocol (test/fixtures/config_service.py speaks it):
--
--     POST <projcache_http.url>
--     {"keys": ["acme", "beta"], "revisions": ["r1", null]}
--
--     200 {"configs": [{"key": "acme", "state": "not_modified", "revision": "r1", "config": null},
--                      {"key": "beta", "state": "enabled", "revision": "r4", "config": {...}}]}
--
-- A revision is sent for each key projcache holds (null if none), so the
-- service can answer "not_modified".  A key left out of the answer becomes
-- disabled.
--
-- Freshness is the service's to say, as an HTTP cache has it (RFC 9111,
-- RFC 5861), in the answer's Cache-Control header for every key of the
-- batch, or in an entry's "cache_control" (the same syntax) for that key
-- alone, which replaces the header's:
--
--     s-maxage=N, else max-age=N       -> max_age   (fresh for N seconds)
--     stale-while-revalidate=N,        -> stale_for (then served stale for
--     stale-if-error=M                    the larger of N and M seconds)
--
-- projcache's stale period does both jobs: a read within it serves the old
-- value and refetches (stale-while-revalidate), and a refetch that fails
-- keeps the old value serving (stale-if-error; projcache goes on serving it
-- past the period too while the source keeps failing).  Other directives
-- are not looked at; a directive whose value is not a number of seconds is
-- ignored; without one, projcache.expiry or grace_period applies.  Periods
-- longer than projcache takes (536870911 ms, about 6.2 days; it would fall
-- back to its settings) are cut to that.
--
-- Every failure is an ERROR, which projcache counts (stats.fetch_errors)
-- and records as last_error of each key of the batch, while the old values
-- keep serving.  last_error then reads, for example:
--
--     plpy.Error: config service at http://... could not be reached: Connection refused
--     plpy.Error: config service at http://... did not answer within 24000 ms
--     plpy.Error: config service at http://... answered HTTP 500 Internal Server Error: ...
--     plpy.Error: config service at http://... answered malformed JSON: ...
--     plpy.Error: config service at http://... answered unknown state "archived" for key "acme"
--
-- The request gives up at 80 % of projcache.fetch_timeout (30 s when that
-- is 0): projcache's timeout is a statement timeout, which a socket read in
-- Python does not notice until it returns.  Proxy settings in the server's
-- environment (http_proxy, ...) are ignored.

\if :{?fetch_role}
\else
DO $$ BEGIN RAISE EXCEPTION 'fetch_role is not set: psql -v fetch_role=ROLE -f examples/fetch_http.sql'; END $$;
\quit
\endif

BEGIN;

CREATE EXTENSION IF NOT EXISTS plpython3u;

-- Its result gained max_age and stale_for: a function made by an older
-- version of this file is replaced, in the same transaction.
DROP FUNCTION IF EXISTS public.projcache_fetch_http(text[], text[]);

CREATE FUNCTION public.projcache_fetch_http(keys text[], revisions text[])
RETURNS TABLE(key text, state text, revision text, config jsonb,
              max_age interval, stale_for interval)
LANGUAGE plpython3u VOLATILE AS $$
import http.client
import json
import socket
import time
import urllib.parse

STATES = ('enabled', 'disabled', 'pending', 'not_modified')
# The longest period projcache takes, in whole seconds.
MAX_PERIOD_S = 536870


def cache_control(value):
    """max_age and stale_for (seconds, or None) from a Cache-Control value."""
    seconds = {}
    for part in (value or '').split(','):
        name, _, arg = part.strip().partition('=')
        arg = arg.strip().strip('"')
        if arg.isdigit():
            seconds.setdefault(name.strip().lower(), min(int(arg), MAX_PERIOD_S))
    max_age = seconds.get('s-maxage', seconds.get('max-age'))
    stale = [seconds[d] for d in ('stale-while-revalidate', 'stale-if-error')
             if d in seconds]
    return max_age, max(stale) if stale else None


def as_interval(s):
    return None if s is None else '%d seconds' % s

url = plpy.execute(
    "SELECT pg_catalog.current_setting('projcache_http.url', true) AS v")[0]['v']
if not url:
    plpy.error('projcache_http.url is not set',
               hint="Set it in postgresql.conf, e.g. projcache_http.url = "
                    "'http://127.0.0.1:8080/v1/configs', and reload.")
parts = urllib.parse.urlsplit(url)
if parts.scheme not in ('http', 'https') or not parts.hostname:
    plpy.error('projcache_http.url is not an http:// or https:// URL: %s' % url)

# Give up before projcache's statement timeout would, with a message of our
# own: that timeout is only seen once Python returns.
timeout_ms = plpy.execute(
    "SELECT coalesce((SELECT setting::bigint FROM pg_catalog.pg_settings"
    "                  WHERE name = 'projcache.fetch_timeout'), 0) AS v")[0]['v']
budget = timeout_ms * 0.8 / 1000.0 if timeout_ms > 0 else 30.0
deadline = time.monotonic() + budget

def left():
    """Seconds left before the deadline, for the next socket operation."""
    s = deadline - time.monotonic()
    if s <= 0:
        raise TimeoutError()
    return s

body = json.dumps({'keys': keys, 'revisions': revisions}).encode()
path = (parts.path or '/') + ('?' + parts.query if parts.query else '')
if parts.scheme == 'https':
    conn = http.client.HTTPSConnection(parts.hostname, parts.port, timeout=left())
else:
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=left())

error = None
try:
    try:
        conn.connect()
        sock = conn.sock
        conn.request('POST', path, body,
                     {'Content-Type': 'application/json',
                      'Accept': 'application/json',
                      'User-Agent': 'projcache-fetch-http'})
        sock.settimeout(left())
        resp = conn.getresponse()
        chunks = []
        while True:
            sock.settimeout(left())
            chunk = resp.read1(65536)
            if not chunk:
                break
            chunks.append(chunk)
        raw = b''.join(chunks)
    finally:
        conn.close()
except (socket.timeout, TimeoutError):
    error = 'did not answer within %d ms' % round(budget * 1000)
except OSError as e:
    error = 'could not be reached: %s' % (e.strerror or e)
except http.client.HTTPException as e:
    error = 'broke the HTTP protocol: %s' % (str(e) or type(e).__name__)

if error is None and resp.status != 200:
    error = 'answered HTTP %d %s: %s' % (
        resp.status, resp.reason, raw[:200].decode('utf-8', 'replace').strip())
if error is None:
    try:
        doc = json.loads(raw)
    except ValueError as e:
        error = 'answered malformed JSON: %s' % e
if error is None:
    answers = doc.get('configs') if isinstance(doc, dict) else None
    if not isinstance(answers, list):
        error = 'answered JSON without a "configs" array'
    batch_periods = cache_control(resp.getheader('Cache-Control'))

rows = []
for a in answers if error is None else []:
    if not isinstance(a, dict) or not isinstance(a.get('key'), str):
        error = 'answered an entry without a string "key": %s' % json.dumps(a)[:200]
        break
    if a.get('state') not in STATES:
        error = 'answered unknown state %s for key %s' % (
            json.dumps(a.get('state')), json.dumps(a['key']))
        break
    rev, config = a.get('revision'), a.get('config')
    periods = batch_periods
    if isinstance(a.get('cache_control'), str):
        periods = cache_control(a['cache_control'])
    rows.append((a['key'], a['state'],
                 None if rev is None else str(rev),
                 None if config is None else json.dumps(config),
                 as_interval(periods[0]), as_interval(periods[1])))

if error is not None:
    plpy.error('config service at %s %s' % (url, error))
return rows
$$;

COMMENT ON FUNCTION public.projcache_fetch_http(text[], text[]) IS
    'projcache fetch function: one POST per batch to projcache_http.url (examples/fetch_http.sql)';

REVOKE ALL ON FUNCTION public.projcache_fetch_http(text[], text[]) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION public.projcache_fetch_http(text[], text[]) TO :"fetch_role";

COMMIT;
