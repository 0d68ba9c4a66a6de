# Copyright (c) 2026, projcache developers
#
# A cache's memory holds against its neighbours (issue 40, items 2 and 12).
#
# a. A cache with a budget pays for its own writes only.  projcache.max_memory
#    = 16MB (about 12 MB for keys); the default cache is filled with 1 kB
#    values until it evicts (about 10,000 keys, near its share); then a role's
#    cache h (max_memory => 1 MB) reads 300 of its keys, each a 200 kB value.
#    Meanwhile a session reads the default cache's keys over and over.  None
#    of the default cache's keys is evicted and none of those reads is NULL
#    (1.3: each write of h past the target evicted the default cache's keys
#    first, which the reader then read as NULL and asked for again); h stays
#    within its budget and evicts its own.
# b. A value larger than its cache's whole budget (200 kB in a cache o of
#    64 kB): read 20 times, it is fetched once and becomes disabled, with a
#    last_error saying why, counted in fetch_errors (1.3 stored it, evicted
#    it for the budget, and fetched it again at the next read: 20 calls or
#    more).  It is asked for again once stale, after o's expiry (on the
#    debug clock).
# c. The per-role bound counts bytes: a role that is not a superuser reads
#    50,000 new keys of about 150-byte values (more than half of the keys'
#    memory, fewer keys than max_keys_per_role's default of half of the keys
#    that fit at 136 bytes each).  What its keys take stays within half of
#    the keys' memory (1.3: about 70 %, bounded only by the count).

use strict;
use warnings;

use FindBin;
use lib $FindBin::RealBin;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use ProjcacheTest;
use Test::More;

my $node = projcache_node('pools',
	conf => "projcache.max_memory = '16MB'\n"
	  . "projcache.batch_size = 200\n"
	  . "projcache.expiry = '10min'\n");

# The keys' part of max_memory, as 033_role_fairness.pl computes it: less a
# quarter for snapshots and the message reserve.
my $memory_bytes = stat_value($node, 'memory_limit');
my $reserve = $memory_bytes / 16 < 65536 ? $memory_bytes / 16 : 65536;
my $keys_part = $memory_bytes - int($memory_bytes / 4) - $reserve;

$node->safe_psql(
	'postgres', q{
ALTER EXTENSION projcache UPDATE;
-- 'big...' keys: 200 kB values (md5 text does not compress); 's...' keys:
-- about 150 bytes; others about 1 kB.
CREATE FUNCTION public.src(keys text[], revisions text[])
RETURNS TABLE(key text, state text, revision text, config jsonb)
LANGUAGE sql AS $$
	SELECT k, 'enabled', 'r1',
		jsonb_build_object('pad', repeat(md5(k),
			CASE WHEN k LIKE 'big%' THEN 6250
			     WHEN k LIKE 's%' THEN 4 ELSE 31 END))
	FROM unnest(keys) k
$$;
CREATE TABLE public.h_done (x int);
CREATE ROLE hr LOGIN;
CREATE ROLE reader LOGIN;
GRANT USAGE ON SCHEMA projcache TO hr, reader;
GRANT EXECUTE ON FUNCTION projcache.get(text), projcache.get(text, interval)
	TO hr, reader;
GRANT EXECUTE ON FUNCTION
	projcache.create_cache(text, regprocedure, interval, interval, interval,
		interval, integer, interval, bigint, regrole)
	TO hr;
});
set_fetch_function($node, 'public.src');
$node->safe_psql(
	'postgres', q{
SET ROLE hr;
SELECT projcache.create_cache('h', 'public.src(text[],text[])',
		max_memory => 1048576),
	projcache.create_cache('o', 'public.src(text[],text[])',
		expiry => '10min', max_memory => 65536);
});
ok( $node->poll_query_until(
		'postgres', 'SELECT count(*) = 2 FROM projcache.caches'),
	'the caches are published');

# Until no key of the prefix waits for its fetch.
sub settled
{
	my ($like) = @_;
	return $node->poll_query_until('postgres',
		"SELECT count(*) = 0 FROM projcache.entries WHERE key LIKE '$like' AND state = 'pending'"
	);
}

sub default_keys
{
	return $node->safe_psql('postgres',
		"SELECT count(*) FROM projcache.entries WHERE key LIKE 'd%' AND state = 'enabled'"
	);
}

# ---------------------------------------------------------------------------
# a. The default cache near its share, then h's big values.
my $filled = 0;
for my $pass (1 .. 5)
{
	$node->safe_psql('postgres',
		'SELECT count(projcache.get(\'d\' || i)) FROM generate_series(1, 12000) i'
	);
	ok(settled('d%'), "a: the default cache's keys are fetched (pass $pass)");
	if (stat_value($node, 'evictions_memory') > 0)
	{
		$filled = 1;
		last;
	}
}
ok($filled, 'a: the default cache evicted for memory: it is near its share');
my $before = default_keys();
diag(   "a: the default cache holds $before keys, memory_used "
	  . stat_value($node, 'memory_used')
	  . " of the keys' $keys_part");
cmp_ok($before, '>', 8000, 'a: the default cache holds many keys');

# The default cache's keys are read the whole time, as a service would:
# each key a pass found evicted is created again, so that the default cache
# stays at its share.
my $evictions_sql = q{
SELECT s.evictions_memory - (SELECT sum(evictions) FROM projcache.caches)
  FROM projcache.stats s};
$node->safe_psql('postgres',
	"CREATE TABLE public.dkeys AS SELECT key FROM projcache.entries WHERE key LIKE 'd%' AND state = 'enabled'"
);
my $default_evictions0 = $node->safe_psql('postgres', $evictions_sql);
my $reader = start_session(
	$node, 'default_reader', q{
DO $$
DECLARE
	reads bigint := 0;
	nulls bigint := 0;
	k text;
BEGIN
	LOOP
		FOR k IN SELECT key FROM public.dkeys LOOP
			reads := reads + 1;
			IF projcache.get(k) IS NULL THEN
				nulls := nulls + 1;
			END IF;
		END LOOP;
		EXIT WHEN EXISTS (SELECT FROM public.h_done);
	END LOOP;
	RAISE NOTICE 'reads=% nulls=%', reads, nulls;
END $$;});
my $got = $node->safe_psql(
	'postgres', q{
SET ROLE hr;
SELECT count(*) FILTER (WHERE projcache.get('h:big' || i, '5s') IS NOT NULL)
FROM generate_series(1, 300) i});
$node->safe_psql('postgres', 'INSERT INTO public.h_done VALUES (1)');
my ($rc, $out, $err) = wait_session($reader);
is($rc, 0, 'a: the default cache\'s reader ran throughout') or diag($err);
my ($reads, $read_nulls) = $err =~ /reads=(\d+) nulls=(\d+)/;
my $default_evictions =
  $node->safe_psql('postgres', $evictions_sql) - $default_evictions0;
my $after = default_keys();
my $h = $node->safe_psql('postgres',
	"SELECT entries || ' ' || memory_used || ' ' || evictions FROM projcache.caches WHERE name = 'h'"
);
my ($h_entries, $h_memory, $h_evictions) = split / /, $h;
diag(   "a: h read $got of 300 big values; meanwhile the default cache's "
	  . "reader read its keys $reads times, $read_nulls NULL, and "
	  . "$default_evictions of its keys were evicted; it holds $after keys "
	  . "(before: $before); h: $h_entries entries, $h_memory bytes, "
	  . "$h_evictions evictions");
cmp_ok($got, '>=', 290, 'a: h read its big values');
is($default_evictions, 0,
	"a: no key of the default cache was evicted for h's values");
is($read_nulls, 0, "a: no read of the default cache's keys was NULL");
cmp_ok($after, '>=', $before - int($before / 100),
	"a: the default cache kept its keys ($after of $before)");
ok( $node->poll_query_until(
		'postgres',
		"SELECT memory_used <= 1048576 AND evictions > 0 FROM projcache.caches WHERE name = 'h'"
	),
	'a: h stays within its budget, evicting its own keys');

# ---------------------------------------------------------------------------
# b. A value larger than o's whole budget.
my $calls0 = $node->safe_psql('postgres',
	"SELECT fetch_calls FROM projcache.caches WHERE name = 'o'");
my $nulls = $node->safe_psql(
	'postgres', q{
SET ROLE hr;
SELECT count(*) FILTER (WHERE projcache.get('o:big1', '1s') IS NULL)
FROM generate_series(1, 20)});
my $o = $node->safe_psql('postgres',
	"SELECT fetch_calls - $calls0 || '|' || fetch_errors FROM projcache.caches WHERE name = 'o'"
);
my ($o_calls, $o_errors) = split /\|/, $o;
my $entry = $node->safe_psql('postgres',
	"SELECT state || '|' || coalesce(last_error, '') FROM projcache.entries WHERE key = 'o:big1'"
);
diag("b: 20 reads of a 200 kB value in a 64 kB cache: $o_calls fetch calls, "
	  . "$o_errors fetch errors; the key: $entry");
is($nulls, 20, 'b: the oversize value is never served');
cmp_ok($o_calls, '<=', 2, 'b: it costs at most two fetch calls');
cmp_ok($o_errors, '>=', 1, 'b: it is counted in fetch_errors');
like(
	$entry,
	qr/^disabled\|value of \d+ bytes is larger than the max_memory of its cache \(65536 bytes\)/,
	'b: the key is disabled, with last_error saying why');

# ---------------------------------------------------------------------------
# c. One role's keys take at most half of the keys' memory.
$node->safe_psql('postgres',
	"SELECT count(projcache.evict(key)) FROM projcache.entries WHERE key <> 'o:big1'"
);
ok( $node->poll_query_until(
		'postgres', 'SELECT count(*) = 1 FROM projcache.entries'),
	'c: the map holds only o:big1');
for my $from (0, 10000, 20000, 30000, 40000)
{
	$node->safe_psql(
		'postgres', qq{
SET ROLE reader;
SELECT count(projcache.get('s' || i))
FROM generate_series($from + 1, $from + 10000) i});
}
ok(settled('s%'), "c: the role's keys are fetched");
my ($keys, $estimate, $used) = split /\|/,
  $node->safe_psql(
	'postgres', q{
SELECT count(*) || '|' || coalesce(sum(value_bytes + length(key) + 40), 0)
	|| '|' || (SELECT memory_used FROM projcache.stats)
FROM projcache.entries WHERE key LIKE 's%'});
my $share = sprintf('%.1f', 100 * $estimate / $keys_part);
diag(   "c: the role holds $keys keys, at least $estimate bytes ($share % of the "
	  . "keys' $keys_part); memory_used $used");
cmp_ok($estimate, '<=', $keys_part / 2,
	"c: the role's keys take at most half of the keys' memory ($share %)");
cmp_ok($estimate, '>=', $keys_part / 4,
	'c: and they may take a good part of it');
cmp_ok(stat_value($node, 'refused_reads'), '>', 0,
	"c: the role's new keys past its bound were refused");

# ---------------------------------------------------------------------------
# b, again: the disabled key is asked for again once stale, after expiry.
$node->safe_psql('postgres',
	"SET ROLE hr; SELECT projcache.get('o:big1', '1s')");
is( $node->safe_psql(
		'postgres',
		"SELECT fetch_calls - $calls0 FROM projcache.caches WHERE name = 'o'"),
	$o_calls, 'b: within its expiry, a read asks for it no more');
advance_clock($node, '11min');
$node->safe_psql('postgres',
	"SET ROLE hr; SELECT projcache.get('o:big1', '1s')");
ok( $node->poll_query_until(
		'postgres',
		"SELECT fetch_calls - $calls0 > $o_calls FROM projcache.caches WHERE name = 'o'"
	),
	'b: once stale, it is asked for again');

log_shows_no_crash($node);

done_testing();
