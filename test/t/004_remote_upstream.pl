# Copyright (c) 2026, projcache developers
#
# A second cluster as the source of truth.  Node "upstream" is a plain
# PostgreSQL server holding the configs; node "cache" runs projcache with a
# fetch function that reads the upstream through dblink.  Cold keys come
# from the remote; while the upstream is down fetches fail (counted,
# recorded as last_error) and the cache keeps serving what it has, even
# past expiry; once the upstream is back the cache recovers.

use strict;
use warnings;

use FindBin;
use lib $FindBin::RealBin;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use ProjcacheTest;
use Test::More;

# ---------------------------------------------------------------------------
# The upstream: no projcache at all.
# ---------------------------------------------------------------------------
my $upstream = PostgreSQL::Test::Cluster->new('upstream');
$upstream->init;
$upstream->start;
$upstream->safe_psql(
	'postgres', q{
CREATE TABLE configs (
	key text PRIMARY KEY,
	state text NOT NULL DEFAULT 'enabled',
	revision text,
	config jsonb
);
INSERT INTO configs (key, revision, config) VALUES
	('a', 'a1', '{"a": 1}'),
	('b', 'b1', '{"b": 1}'),
	('c', 'c1', '{"c": 1}'),
	('off', 'o1', NULL);
UPDATE configs SET state = 'disabled' WHERE key = 'off';
});

# ---------------------------------------------------------------------------
# The cache: projcache, dblink, and a fetch function over the remote.
# ---------------------------------------------------------------------------
my $cache = projcache_node(
	'cache',
	conf => "projcache.expiry = '10s'\n"
	  . "projcache.grace_period = '10s'\n"
	  . "projcache.max_retry_backoff = '1s'\n");

my $have_dblink = $cache->safe_psql('postgres',
	"SELECT count(*) FROM pg_available_extensions WHERE name = 'dblink'");
plan skip_all => 'dblink is not installed' unless $have_dblink;

my $connstr = $upstream->connstr('postgres');
$cache->safe_psql(
	'postgres', qq{
CREATE EXTENSION dblink;
CREATE TABLE public.upstream_server (connstr text NOT NULL);
INSERT INTO public.upstream_server VALUES (\$conn\$$connstr\$conn\$);
CREATE FUNCTION public.fetch_remote(p_keys text[], p_revisions text[])
RETURNS TABLE(key text, state text, revision text, config jsonb)
LANGUAGE sql STABLE AS \$\$
	SELECT r.key, r.state, r.revision, r.config
	FROM dblink(
		(SELECT connstr FROM public.upstream_server),
		format('SELECT key, state, revision, config FROM configs WHERE key = ANY (%L::text[])',
			   p_keys))
		AS r(key text, state text, revision text, config jsonb)
\$\$;
});
set_fetch_function($cache, 'public.fetch_remote');

# ---------------------------------------------------------------------------
# Cold keys come from the remote.
# ---------------------------------------------------------------------------
is($cache->safe_psql('postgres', "SELECT projcache.get('a', '5s')"),
	'{"a": 1}', 'a cold key is fetched from the remote upstream');
is($cache->safe_psql('postgres', "SELECT projcache.get('b', '5s')"),
	'{"b": 1}', 'a second cold key is fetched from the remote upstream');
is( $cache->safe_psql(
		'postgres',
		"SELECT state, revision, last_error IS NULL FROM projcache.entries WHERE key = 'a'"
	),
	'enabled|a1|t',
	'the entry has the remote revision and no error');
is( $cache->safe_psql(
		'postgres',
		"SELECT state, config IS NULL FROM projcache.lookup('off', '5s')"),
	'disabled|t',
	'a remote disabled key is disabled');
is( $cache->safe_psql(
		'postgres', "SELECT state FROM projcache.lookup('nowhere', '5s')"),
	'disabled',
	'a key the remote does not know is disabled');
is($cache->safe_psql('postgres', "SELECT projcache.get('c', '5s')"),
	'{"c": 1}', 'key c is cached');
is(stat_value($cache, 'fetch_errors'), '0', 'no fetch error so far');

# Change the remote while the cache holds fresh values: nothing refetches.
$upstream->safe_psql(
	'postgres', q{
UPDATE configs SET revision = 'a2', config = '{"a": 2}' WHERE key = 'a';
DELETE FROM configs WHERE key = 'c';
});
is($cache->safe_psql('postgres', "SELECT projcache.get('a')"),
	'{"a": 1}', 'a fresh key keeps its cached value after a remote change');

# ---------------------------------------------------------------------------
# The upstream goes down.
# ---------------------------------------------------------------------------
$upstream->stop;

my $errors_before = stat_value($cache, 'fetch_errors');
my $log_offset = log_offset($cache);

# Stale: the read serves the old value and asks for a fetch, which fails.
advance_clock($cache, '12s');
is( $cache->safe_psql(
		'postgres', "SELECT freshness, config FROM projcache.lookup('a')"),
	'stale|{"a": 1}',
	'upstream down, stale key: the old value is served');
is( $cache->safe_psql(
		'postgres',
		"SELECT string_agg(coalesce(projcache.get(k)::text, 'NULL'), ' ' ORDER BY k) FROM unnest(ARRAY['b', 'c']) AS k"
	),
	'{"b": 1} {"c": 1}',
	'the other stale keys are served too');
ok( $cache->poll_query_until(
		'postgres',
		"SELECT last_error IS NOT NULL FROM projcache.entries WHERE key = 'a'"),
	'the failed fetch is recorded in the entry');
like(
	$cache->safe_psql(
		'postgres', "SELECT last_error FROM projcache.entries WHERE key = 'a'"),
	qr/could not establish connection/,
	'last_error says the upstream could not be reached');
like(
	$cache->safe_psql(
		'postgres', "SELECT last_error FROM projcache.lookup('a')"),
	qr/could not establish connection/,
	'lookup() shows the error too');
cmp_ok(stat_value($cache, 'fetch_errors'),
	'>', $errors_before, 'stats.fetch_errors counts the failures');
ok( $cache->poll_query_until(
		'postgres',
		"SELECT attempts >= 2 FROM projcache.entries WHERE key = 'a'"),
	'the worker retries the failing fetch (attempts grow)');
$cache->wait_for_log(
	qr/WARNING:  fetch function failed for \d+ keys?\n.*DETAIL:  could not establish connection/,
	$log_offset);
pass('the worker logs the failed fetch as a WARNING');
like(
	worker_pid($cache), qr/^\d+$/,
	'the worker lives on through failing fetches');

# A cold key while the upstream is down stays pending, with the error.
is( $cache->safe_psql(
		'postgres', "SELECT state, config FROM projcache.lookup('b2', '1s')"),
	'pending|',
	'a cold key stays pending while the upstream is down');
ok( $cache->poll_query_until(
		'postgres',
		"SELECT last_error LIKE '%could not establish connection%' FROM projcache.entries WHERE key = 'b2'"
	),
	'the cold key records the error too');

# Expired: past expiry + grace the value is still held, because a fetch is
# in progress (failing and retrying): no eviction while a fetch runs.
advance_clock($cache, '10s');
is( $cache->safe_psql(
		'postgres', "SELECT freshness, config FROM projcache.lookup('a')"),
	'expired|{"a": 1}',
	'upstream down, past expiry + grace: the old value is still served');
is($cache->safe_psql('postgres', "SELECT projcache.get('a')"),
	'{"a": 1}', 'get() serves the expired value');
is( $cache->safe_psql(
		'postgres',
		"SELECT state, freshness, fetch_state <> 'complete' FROM projcache.entries WHERE key = 'a'"
	),
	'enabled|expired|t',
	'the expired entry is held, its fetch retrying');
is( $cache->safe_psql(
		'postgres',
		"SELECT count(*) FROM projcache.entries WHERE key IN ('a', 'b', 'c') AND freshness = 'expired' AND last_error IS NOT NULL"
	),
	'3',
	'all three keys read while the upstream was down are held, expired, with their error'
);
is($cache->safe_psql('postgres', "SELECT projcache.get('c')"),
	'{"c": 1}', 'get() serves the expired value of c');

# ---------------------------------------------------------------------------
# The upstream comes back: the cache recovers.
# ---------------------------------------------------------------------------
$upstream->start;
my $fetched_before = stat_value($cache, 'fetched_keys');

is($cache->safe_psql('postgres', "SELECT projcache.invalidate('a')"),
	't', 'invalidate(a) asks for a fetch at once');
ok( $cache->poll_query_until(
		'postgres', "SELECT projcache.get('a')::text = '{\"a\": 2}'"),
	'after the upstream is back, the new remote value is served');
is( $cache->safe_psql(
		'postgres',
		"SELECT state, freshness, revision, last_error IS NULL, attempts FROM projcache.entries WHERE key = 'a'"
	),
	'enabled|fresh|a2|t|0',
	'the entry is fresh again, error cleared, attempts reset');

# The pending cold key is fetched by its retry (backoff at most 1 s), or on
# the clock; step the clock to make the retry due at once.
advance_clock($cache, '2s');
is($cache->safe_psql('postgres', "SELECT projcache.get('b2', '5s') IS NULL"),
	't', 'the cold key b2 completes (the remote does not know it)');
is( $cache->safe_psql(
		'postgres',
		"SELECT state, last_error IS NULL FROM projcache.entries WHERE key = 'b2'"),
	'disabled|t',
	'b2 is disabled now, no error');

# Key c was deleted upstream while cached: negative caching after refetch.
is($cache->safe_psql('postgres', "SELECT projcache.invalidate('c')"),
	't', 'invalidate(c)');
ok( $cache->poll_query_until(
		'postgres',
		"SELECT state = 'disabled' FROM projcache.entries WHERE key = 'c'"),
	'a key deleted upstream becomes disabled');
is($cache->safe_psql('postgres', "SELECT projcache.get('c')"),
	'', 'get() of the disabled key is NULL');
ok( $cache->poll_query_until(
		'postgres',
		"SELECT projcache.get('b')::text = '{\"b\": 1}' AND (SELECT last_error IS NULL FROM projcache.entries WHERE key = 'b')"
	),
	'key b recovers on its own retry');
cmp_ok(stat_value($cache, 'fetched_keys'),
	'>', $fetched_before, 'keys were fetched from the remote again');

$cache->stop;
$upstream->stop;
done_testing();
