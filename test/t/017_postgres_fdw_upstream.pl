# Copyright (c) 2026, projcache developers
#
# The postgres_fdw upstream recipe: examples/fetch_postgres_fdw.sql, loaded
# as a DBA would, with a plain projcache.fetch_role and a remote role that
# must give its password (scram-sha-256), as postgres_fdw requires of
# non-superusers.  Node "upstream" is a plain PostgreSQL holding the
# configs; node "cache" runs projcache.  Keys are cached from the upstream,
# held revisions come back not_modified, and a change there reaches the
# cache through invalidate().  With the upstream stopped, fetches fail
# (counted, recorded as last_error), the old value serves, and the same
# worker lives on; once the upstream is started again, the cache recovers.

use strict;
use warnings;

use FindBin;
use lib $FindBin::RealBin;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use ProjcacheTest;
use Test::More;

my $example = "$FindBin::RealBin/../../examples/fetch_postgres_fdw.sql";

# ---------------------------------------------------------------------------
# The upstream: no projcache, a table and a role that reads it.
# ---------------------------------------------------------------------------
my $upstream = PostgreSQL::Test::Cluster->new('upstream');
$upstream->init;
$upstream->start;
$upstream->safe_psql(
	'postgres', q{
CREATE TABLE public.project_configs (
	key text PRIMARY KEY,
	revision text,
	config jsonb
);
INSERT INTO public.project_configs VALUES
	('a', 'a1', '{"a": 1}'),
	('b', 'b1', '{"b": 1}');
CREATE ROLE config_reader LOGIN PASSWORD 'reader secret';
GRANT SELECT ON public.project_configs TO config_reader;
});

# config_reader must give its password: the test clusters trust everyone
# else on the local socket.
my $hba = $upstream->data_dir . '/pg_hba.conf';
my $hba_rest = slurp_file($hba);
open my $fh, '>', $hba or die "could not write $hba: $!";
print $fh "local all config_reader scram-sha-256\n$hba_rest";
close $fh;
$upstream->reload;

# ---------------------------------------------------------------------------
# The cache: projcache and the recipe.
# ---------------------------------------------------------------------------
my $cache = projcache_node('cache',
	conf => "projcache.max_retry_backoff = '1s'\n");

plan skip_all => 'postgres_fdw is not installed'
  unless $cache->safe_psql('postgres',
	"SELECT count(*) FROM pg_available_extensions WHERE name = 'postgres_fdw'"
  );

$cache->safe_psql(
	'postgres', q{
CREATE ROLE projcache_fetch NOLOGIN;
ALTER SYSTEM SET projcache.fetch_role = 'projcache_fetch';
});
$cache->command_ok(
	[
		'psql', '-X', '-v', 'ON_ERROR_STOP=1',
		'-v', 'upstream_host=' . $upstream->host,
		'-v', 'upstream_port=' . $upstream->port,
		'-v', 'upstream_dbname=postgres',
		'-v', 'upstream_user=config_reader',
		'-v', 'upstream_password=reader secret',
		'-v', 'fetch_role=projcache_fetch',
		'-d', 'postgres', '-f', $example
	],
	'examples/fetch_postgres_fdw.sql loads');
set_fetch_function($cache, 'public.projcache_fetch_fdw');
my $worker = wait_for_worker($cache);
like($worker, qr/^\d+$/, 'the worker runs');

# ---------------------------------------------------------------------------
# Keys are cached from the upstream.
# ---------------------------------------------------------------------------
is($cache->safe_psql('postgres', "SELECT projcache.get('a', '10s')"),
	'{"a": 1}', 'a cold key is fetched through postgres_fdw');
is( $cache->safe_psql(
		'postgres',
		"SELECT state, revision, last_error IS NULL FROM projcache.entries WHERE key = 'a'"
	),
	'enabled|a1|t',
	'the entry has the upstream\'s revision and no error');
is($cache->safe_psql('postgres', "SELECT projcache.get('b', '10s')"),
	'{"b": 1}', 'key b is cached');
is( $cache->safe_psql(
		'postgres', "SELECT state FROM projcache.lookup('nowhere', '10s')"),
	'disabled', 'a key the upstream does not have is disabled');
is(stat_value($cache, 'fetch_errors'), '0', 'no fetch error so far');

my $not_modified = stat_value($cache, 'not_modified');
$cache->safe_psql('postgres', "SELECT projcache.invalidate('b')");
ok( $cache->poll_query_until(
		'postgres', "SELECT not_modified > $not_modified FROM projcache.stats"),
	'an unchanged key comes back not_modified');

# ---------------------------------------------------------------------------
# A change upstream reaches the cache through invalidate().
# ---------------------------------------------------------------------------
$upstream->safe_psql('postgres',
	q{UPDATE public.project_configs SET revision = 'a2', config = '{"a": 2}' WHERE key = 'a'}
);
is($cache->safe_psql('postgres', "SELECT projcache.get('a')"),
	'{"a": 1}', 'a fresh key keeps its value after an upstream change');
$cache->safe_psql('postgres', "SELECT projcache.invalidate('a')");
ok( $cache->poll_query_until(
		'postgres',
		"SELECT config::text = '{\"a\": 2}' AND revision = 'a2' FROM projcache.lookup('a')"
	),
	'after invalidate() the new value and revision are cached');

# ---------------------------------------------------------------------------
# The upstream stops: counted errors, the old value serves, the worker
# lives on.
# ---------------------------------------------------------------------------
$upstream->stop;
my $errors = stat_value($cache, 'fetch_errors');
$cache->safe_psql('postgres', "SELECT projcache.invalidate('a')");
ok( $cache->poll_query_until(
		'postgres',
		"SELECT last_error IS NOT NULL FROM projcache.entries WHERE key = 'a'"),
	'upstream stopped: the failed fetch is recorded');
cmp_ok(stat_value($cache, 'fetch_errors'),
	'>', $errors, 'upstream stopped: stats.fetch_errors counts it');
is( $cache->safe_psql(
		'postgres', "SELECT freshness, config FROM projcache.lookup('a')"),
	'stale|{"a": 2}',
	'upstream stopped: the old value keeps serving');
# The first failure may still be the dropped connection's; from the
# second attempt on, postgres_fdw tries to connect anew.
ok( $cache->poll_query_until(
		'postgres',
		"SELECT attempts >= 2 FROM projcache.entries WHERE key = 'a'"),
	'upstream stopped: the worker keeps retrying');
like(
	$cache->safe_psql(
		'postgres', "SELECT last_error FROM projcache.lookup('a')"),
	qr/^could not connect to server "projcache_upstream"$/,
	'upstream stopped: lookup() shows postgres_fdw\'s error');
is(worker_pid($cache), $worker, 'upstream stopped: the same worker lives on');

# ---------------------------------------------------------------------------
# The upstream is back: postgres_fdw reconnects, the cache recovers.
# ---------------------------------------------------------------------------
$upstream->start;
ok( $cache->poll_query_until(
		'postgres',
		"SELECT last_error IS NULL AND freshness = 'fresh' FROM projcache.entries WHERE key = 'a'"
	),
	'upstream back: the retry succeeds and clears the error');
$upstream->safe_psql('postgres',
	q{UPDATE public.project_configs SET revision = 'a3', config = '{"a": 3}' WHERE key = 'a'}
);
$cache->safe_psql('postgres', "SELECT projcache.invalidate('a')");
ok( $cache->poll_query_until(
		'postgres', "SELECT projcache.get('a')::text = '{\"a\": 3}'"),
	'upstream back: a new change reaches the cache');
is(wait_for_worker($cache), $worker,
	'the same worker ran the whole test');

$cache->stop;
$upstream->stop;
done_testing();
