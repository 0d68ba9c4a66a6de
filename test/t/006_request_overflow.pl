# Copyright (c) 2026, projcache developers
#
# The request ring (256 kB) is only a fast path: when it is full, readers
# set an overflow flag and the worker scans the key map for request bits,
# so no request is ever lost.  Here the worker is held inside the fetch
# function (blocked on a lock) while one statement requests 600 keys of
# 1000 bytes (about 600 kB of requests), so the ring must overflow; once
# the worker is let go, every key is fetched, each exactly once.
#
# Also: keys are limited to 1024 bytes (bytes, not characters).

use strict;
use warnings;

use FindBin;
use lib $FindBin::RealBin;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use ProjcacheTest;
use Test::More;

my $nkeys = 600;

my $node = projcache_node('overflow', conf => "projcache.expiry = '1h'\n");
create_local_upstream($node);
set_fetch_function($node, 'public.fetch');

# 600 upstream keys of exactly 1000 bytes: 'k' padding, then the number.
my $key_expr = "lpad(i::text, 1000, 'k')";
$node->safe_psql(
	'postgres', qq{
INSERT INTO public.upstream (key, revision, config)
SELECT $key_expr, 'r1', jsonb_build_object('i', i)
FROM generate_series(1, $nkeys) AS i;
INSERT INTO public.upstream (key, revision, config)
VALUES ('blocker', 'r1', '{"blocker": true}');
});
is( $node->safe_psql(
		'postgres',
		"SELECT min(octet_length(key)), max(octet_length(key)) FROM public.upstream WHERE key <> 'blocker'"
	),
	'1000|1000',
	'upstream keys are 1000 bytes long');

# ---------------------------------------------------------------------------
# Hold the worker inside the fetch function.
# ---------------------------------------------------------------------------
my $gate = $node->background_psql('postgres');
$gate->query_safe('BEGIN');
$gate->query_safe('LOCK TABLE public.gate IN ACCESS EXCLUSIVE MODE');

$node->safe_psql('postgres', "SELECT projcache.fetch('blocker')");
ok( $node->poll_query_until(
		'postgres', q{
SELECT wait_event_type = 'Lock'
FROM pg_stat_activity WHERE backend_type = 'projcache scheduler'}),
	'the worker is blocked inside the fetch function');

$node->safe_psql('postgres', 'SELECT projcache.reset_stats()');
my $max_call_id =
  $node->safe_psql('postgres', 'SELECT coalesce(max(id), 0) FROM public.calls');

# ---------------------------------------------------------------------------
# One statement asks for all the keys while the worker cannot drain.
# ---------------------------------------------------------------------------
is( $node->safe_psql(
		'postgres', qq{
SELECT count(*) FROM (
	SELECT projcache.fetch($key_expr) FROM generate_series(1, $nkeys) AS i
) AS s}),
	$nkeys,
	"$nkeys fetch requests sent in one statement");

my ($requests, $overflows) = split /\|/,
  stat_value($node, 'fetch_requests, request_overflows');
is($requests, $nkeys, 'stats.fetch_requests counts every request');
cmp_ok($overflows, '>', 0,
	'the ring overflowed (stats.request_overflows > 0)');
cmp_ok($overflows, '<', $nkeys, 'the ring took some requests before that');
diag("request_overflows = $overflows of $nkeys requests");
is( $node->safe_psql(
		'postgres',
		"SELECT count(*) FROM projcache.entries WHERE octet_length(key) = 1000 AND state = 'pending'"
	),
	$nkeys,
	'every requested key is in the map, pending');

# ---------------------------------------------------------------------------
# Let the worker go: nothing may be lost.
# ---------------------------------------------------------------------------
$gate->query_safe('COMMIT');
$gate->quit;

ok( $node->poll_query_until(
		'postgres',
		"SELECT count(*) = $nkeys FROM projcache.entries WHERE octet_length(key) = 1000 AND state <> 'pending'"
	),
	"all $nkeys keys were fetched: no request was lost");
is( $node->safe_psql(
		'postgres', qq{
SELECT count(*) FROM projcache.entries AS e
JOIN public.upstream AS u USING (key)
WHERE octet_length(e.key) = 1000
  AND e.state = 'enabled' AND e.fetch_state = 'complete'
  AND e.revision = u.revision}),
	$nkeys,
	'every key is enabled and complete, with the upstream revision');
is( $node->safe_psql(
		'postgres', qq{
SELECT count(*) FROM generate_series(1, $nkeys) AS i
WHERE projcache.get($key_expr) = jsonb_build_object('i', i)}),
	$nkeys,
	'get() serves the right value for every key');

# Each key was asked of the fetch function exactly once (ring and scan do
# not both fetch one key).
is( $node->safe_psql(
		'postgres', qq{
SELECT count(*), count(DISTINCT k)
FROM public.calls, unnest(keys) AS k
WHERE id > $max_call_id AND octet_length(k) = 1000}),
	"$nkeys|$nkeys",
	'each key was fetched exactly once');
is( $node->safe_psql(
		'postgres', 'SELECT fetch_errors, pending_results FROM projcache.stats'),
	'0|0',
	'no fetch error');
is($node->safe_psql('postgres', "SELECT projcache.get('blocker')"),
	'{"blocker": true}', 'the blocked fetch completed too');

# ---------------------------------------------------------------------------
# The ring works again after an overflow.
# ---------------------------------------------------------------------------
$node->safe_psql('postgres',
	q{INSERT INTO public.upstream (key, revision, config) VALUES ('after', 'r1', '{"after": 1}')}
);
my $overflows_before = stat_value($node, 'request_overflows');
is($node->safe_psql('postgres', "SELECT projcache.get('after', '5s')"),
	'{"after": 1}', 'a new key is fetched after the overflow');
is(stat_value($node, 'request_overflows'),
	$overflows_before, 'its request went through the ring');

# ---------------------------------------------------------------------------
# Key length: at most 1024 bytes.
# ---------------------------------------------------------------------------
is( $node->safe_psql(
		'postgres',
		"SELECT state FROM projcache.lookup(repeat('x', 1024), '5s')"),
	'disabled',
	'a 1024-byte key is accepted (and fetched: unknown upstream, disabled)');
is( $node->safe_psql(
		'postgres',
		"SELECT octet_length(key) FROM projcache.entries WHERE key = repeat('x', 1024)"
	),
	'1024',
	'the 1024-byte key is stored whole');

foreach my $call (
	"projcache.get(repeat('x', 1025))",
	"projcache.get(repeat('x', 1025), '1s')",
	"projcache.fetch(repeat('x', 1025))",
	"projcache.invalidate(repeat('x', 1025))",
	"projcache.evict(repeat('x', 1025))",
	"* FROM projcache.lookup(repeat('x', 1025))")
{
	my ($ret, $stdout, $stderr) = $node->psql(
		'postgres',
		"\\set VERBOSITY verbose\nSELECT $call",
		on_error_stop => 1);
	isnt($ret, 0, "a 1025-byte key is an error: $call");
	like(
		$stderr,
		qr/ERROR:  54000: key is too long/,
		"... with SQLSTATE 54000 (program_limit_exceeded)");
}
my ($ret, $stdout, $stderr) =
  $node->psql('postgres', "SELECT projcache.get(repeat('x', 1025))");
like($stderr, qr/DETAIL:  The key is 1025 bytes; the limit is 1024 bytes\./,
	'the error detail gives the length and the limit');

# Bytes, not characters: 512 two-byte characters fit, 513 do not.
is( $node->safe_psql(
		'postgres',
		"SELECT state FROM projcache.lookup(repeat('é', 512), '5s')"),
	'disabled',
	'a key of 512 two-byte characters (1024 bytes) is accepted');
($ret, $stdout, $stderr) =
  $node->psql('postgres', "SELECT projcache.get(repeat('é', 513))");
like(
	$stderr,
	qr/key is too long.*\n.*The key is 1026 bytes/,
	'a key of 513 two-byte characters (1026 bytes) is refused');
is( $node->safe_psql(
		'postgres',
		"SELECT count(*) FROM projcache.entries WHERE octet_length(key) > 1024"),
	'0',
	'no key longer than 1024 bytes got into the map');

$node->stop;
done_testing();
