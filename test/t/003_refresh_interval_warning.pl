# Copyright (c) 2026, projcache developers
#
# projcache.refresh_interval is honoured only when strictly between
# projcache.expiry and projcache.expiry + projcache.grace_period.  Outside
# that window the worker logs a WARNING saying it is ignored, schedules no
# refresh (entries show refresh_in NULL) and refreshes nothing.  A valid
# value logs nothing and is honoured.

use strict;
use warnings;

use FindBin;
use lib $FindBin::RealBin;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use ProjcacheTest;
use Test::More;

# expiry 10 s, grace 10 s: the valid window is (10 s, 20 s).
my $node = projcache_node(
	'refresh',
	conf => "projcache.expiry = '10s'\n"
	  . "projcache.grace_period = '10s'\n"
	  . "projcache.refresh_interval = '5s'\n");
create_local_upstream($node);

my $warning = qr/WARNING:  projcache\.refresh_interval = (\d+) ms is ignored/;

# ---------------------------------------------------------------------------
# Below expiry, from postgresql.conf at start.
# ---------------------------------------------------------------------------
$node->wait_for_log(
	qr/WARNING:  projcache\.refresh_interval = 5000 ms is ignored\n.*DETAIL:  It must be strictly between projcache\.expiry \(10000 ms\) and projcache\.expiry \+ projcache\.grace_period \(20000 ms\)\./,
	0);
pass('at start, refresh_interval 5s (< expiry) is ignored with a WARNING and its reason');

set_fetch_function($node, 'public.fetch');
$node->safe_psql(
	'postgres', q{
INSERT INTO public.upstream (key, revision, config)
SELECT k, 'r1', jsonb_build_object('k', k)
FROM unnest(ARRAY['k1', 'k2', 'k3', 'barrier1', 'barrier2']) AS k;
});

is($node->safe_psql('postgres', "SELECT projcache.get('k1', '5s')"),
	'{"k": "k1"}', 'k1 is cached');
is( $node->safe_psql(
		'postgres',
		"SELECT refresh_in IS NULL, expires_in IS NOT NULL FROM projcache.entries WHERE key = 'k1'"
	),
	't|t',
	'an ignored refresh_interval schedules no refresh (refresh_in is NULL)');

# Past when a 5 s or a 15 s refresh would have fired, before eviction
# (20 s).  Then a cold key fetched through the worker is a barrier: its
# fetch comes after the worker has run the timers due at the new time.
advance_clock($node, '16s');
is($node->safe_psql('postgres', "SELECT projcache.get('barrier1', '5s')"),
	'{"k": "barrier1"}', 'barrier key fetched after the clock step');
is(stat_value($node, 'refreshes'), '0', 'no refresh happened');
is($node->safe_psql('postgres', "SELECT count(*) FROM public.calls WHERE 'k1' = ANY (keys)"),
	'1', 'k1 was fetched once only');
is( $node->safe_psql(
		'postgres',
		"SELECT freshness, fetch_state FROM projcache.entries WHERE key = 'k1'"),
	'stale|complete',
	'k1 is stale and waits for a read, not for a refresh');

# ---------------------------------------------------------------------------
# The bounds are excluded: expiry and expiry + grace are both ignored.
# ---------------------------------------------------------------------------
foreach my $case (['10s', 10000, 'equal to expiry'],
	['20s', 20000, 'equal to expiry + grace'],
	['1h', 3600000, 'above expiry + grace'])
{
	my ($value, $ms, $what) = @$case;
	my $offset = log_offset($node);

	$node->safe_psql('postgres',
		"ALTER SYSTEM SET projcache.refresh_interval = '$value'");
	reload_and_wait($node);
	my $log = log_since($node, $offset);
	like(
		$log,
		qr/WARNING:  projcache\.refresh_interval = $ms ms is ignored/,
		"refresh_interval $value ($what) is ignored with a WARNING");
}

# A fetch under an ignored setting schedules no refresh either.  (k1 was
# left 4 s before its eviction; on a busy machine the reloads above can
# take longer, so it is read back first: fetched again if it aged out.)
is($node->safe_psql('postgres', "SELECT projcache.get('k1', '10s') IS NOT NULL"),
	't', 'k1 is cached');
is($node->safe_psql('postgres', "SELECT projcache.invalidate('k1')"),
	't', 'k1 invalidated');
ok( $node->poll_query_until(
		'postgres',
		"SELECT freshness = 'fresh' FROM projcache.entries WHERE key = 'k1'"),
	'k1 was fetched again');
is( $node->safe_psql(
		'postgres',
		"SELECT refresh_in IS NULL FROM projcache.entries WHERE key = 'k1'"),
	't',
	'refresh_in stays NULL with refresh_interval 1h ignored');

# ---------------------------------------------------------------------------
# Valid values log nothing and are honoured; so does 0 (off).
# ---------------------------------------------------------------------------
my $offset = log_offset($node);
$node->safe_psql('postgres',
	"ALTER SYSTEM SET projcache.refresh_interval = 0");
reload_and_wait($node);
$node->safe_psql('postgres',
	"ALTER SYSTEM SET projcache.refresh_interval = '15s'");
reload_and_wait($node);
unlike(log_since($node, $offset),
	qr/refresh_interval.*is ignored/,
	'refresh_interval 0 (off) and 15s (valid) log no WARNING');

is($node->safe_psql('postgres', "SELECT projcache.get('k2', '5s')"),
	'{"k": "k2"}', 'k2 is cached');
is( $node->safe_psql(
		'postgres',
		"SELECT age + refresh_in = interval '15s', age + expires_in = interval '20s'"
		  . " FROM projcache.entries WHERE key = 'k2'"),
	't|t',
	'with a valid refresh_interval, refresh_in is set: 15 s after the fetch');

$node->safe_psql('postgres',
	"UPDATE public.upstream SET revision = 'r2', config = '{\"k\": \"k2 v2\"}' WHERE key = 'k2'"
);
my $refresh_in = $node->safe_psql('postgres',
	"SELECT refresh_in + interval '500ms' FROM projcache.entries WHERE key = 'k2'");
advance_clock($node, $refresh_in);
ok( $node->poll_query_until(
		'postgres',
		"SELECT revision = 'r2' FROM projcache.entries WHERE key = 'k2'"),
	'the valid refresh_interval is honoured: k2 was refreshed without a read');
cmp_ok(stat_value($node, 'refreshes'), '>=', 1, 'stats.refreshes counts it');
is($node->safe_psql('postgres', "SELECT projcache.get('k2')"),
	'{"k": "k2 v2"}', 'the refreshed value is served');

# ---------------------------------------------------------------------------
# Changing expiry or grace can push a valid refresh_interval out of its
# window: it is checked again at every reload.
# ---------------------------------------------------------------------------
$offset = log_offset($node);
$node->safe_psql('postgres',
	"ALTER SYSTEM SET projcache.grace_period = '2s'");
reload_and_wait($node);
like(
	log_since($node, $offset),
	qr/WARNING:  projcache\.refresh_interval = 15000 ms is ignored\n.*DETAIL:  .*\(10000 ms\).*\(12000 ms\)\./,
	'shrinking the grace period below refresh_interval - expiry brings the WARNING back'
);
is($node->safe_psql('postgres', "SELECT projcache.get('k3', '5s')"),
	'{"k": "k3"}', 'k3 is cached');
is( $node->safe_psql(
		'postgres',
		"SELECT refresh_in IS NULL, age + expires_in = interval '12s' FROM projcache.entries WHERE key = 'k3'"
	),
	't|t',
	'k3 gets no refresh and the new grace period');

$node->stop;
done_testing();
