# Copyright (c) 2026, projcache developers
#
# A scan beside steady readers (issue 19): projcache.max_memory = 32MB,
# 10,000 hot keys with configs of about 300 bytes read by 8 clients (each
# key about once a second), and one more client reading 200,000 other keys
# once each, 500 at a time, as a report or a batch job would.  The source is
# slow (a quarter of a second a call), and keys go stale after 15 s and
# expire 20 s later, so the hot keys must be fetched again while the scan's
# keys queue for the same fetch function.
#
# - at most 0.1 % of the hot-key reads made while the scan runs return
#   NULL, and none made from 10 s after it ended;
# - a snapshot refresh, asked for while the scan runs, completes;
# - the scan's keys left (evicted, or dropped unfetched): the cache stayed
#   within its bound.
#
# The trees before fair fetching (S3-FIFO, and 1.1's SIEVE) passed this in
# most runs here too: eviction of the scan's pending keys keeps their
# backlog short.  What fair fetching changes in this scenario, the scan's
# footprint, bench/scan.sh measures beside a baseline.

use strict;
use warnings;

use FindBin;
use lib $FindBin::RealBin;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use ProjcacheTest;
use Test::More;

my $node = projcache_node(
	'scan',
	conf => "projcache.max_memory = '32MB'\n"
	  . "projcache.expiry = '15s'\n"
	  . "projcache.grace_period = '20s'\n"
	  . "max_connections = 30\n");
create_local_upstream($node);

# 10,000 hot keys and 200,000 cold ones, configs of about 300 bytes; a slow
# source; a snapshot of a small table; where the scanner says what it does.
$node->safe_psql(
	'postgres', q{
INSERT INTO public.upstream (key, revision, config)
SELECT k, 'r1', jsonb_build_object('pad', repeat(md5(k), 9))
  FROM (SELECT 'hot' || i AS k FROM generate_series(1, 10000) AS i
        UNION ALL
        SELECT 'cold' || i FROM generate_series(1, 200000) AS i) AS keys;
ANALYZE public.upstream;
CREATE FUNCTION public.slow_fetch(p_keys text[], p_revisions text[])
RETURNS TABLE(key text, state text, revision text, config jsonb)
LANGUAGE plpgsql AS $$
BEGIN
	PERFORM pg_sleep(0.25);
	RETURN QUERY SELECT * FROM public.fetch(p_keys, p_revisions);
END
$$;
CREATE TABLE public.settings (id int PRIMARY KEY, val text);
INSERT INTO public.settings SELECT i, 'v' || i FROM generate_series(1, 100) AS i;
SELECT projcache.create_snapshot('settings', 'SELECT id, val FROM public.settings', '1h');
CREATE TABLE public.phase (name text PRIMARY KEY, at timestamptz NOT NULL);
CREATE PROCEDURE public.scan()
LANGUAGE plpgsql AS $$
BEGIN
	INSERT INTO public.phase VALUES ('scan_started', clock_timestamp());
	COMMIT;
	FOR n IN 0..399 LOOP
		PERFORM count(projcache.get('cold' || i))
		   FROM generate_series(1 + n * 500, 500 + n * 500) AS i;
		PERFORM pg_sleep(0.1);
	END LOOP;
	INSERT INTO public.phase VALUES ('scan_ended', clock_timestamp());
	COMMIT;
END $$;
});
set_fetch_function($node, 'public.slow_fetch');
wait_for_worker($node);
my $limit = stat_value($node, 'memory_limit');

# The hot set is cached before the scan starts.
ok( $node->poll_query_until(
		'postgres', q{
SELECT count(*) = 10000 FROM generate_series(1, 10000) AS i
 WHERE projcache.get('hot' || i) IS NOT NULL}),
	'the 10,000 hot keys are cached');

# A hot reader: the next 125 hot keys every 0.1 s, from a random start,
# so that 8 of them read each key about once a second and each reads every
# key within 8 s (a key nobody reads for its grace period expires, rightly:
# that is not what this measures); it counts reads and NULLs while the scan
# runs and from 10 s after it ended, and stops 20 s after it ended.
my $reader_sql = q{
DO $$
DECLARE
	first int := floor(random() * 10000)::int;
	started timestamptz;
	ended timestamptz;
	dr int := 0; dn int := 0; ar int := 0; an int := 0;
	nulls int;
	t timestamptz;
BEGIN
	FOR n IN 1..100000 LOOP
		SELECT at INTO started FROM public.phase WHERE name = 'scan_started';
		SELECT at INTO ended FROM public.phase WHERE name = 'scan_ended';
		t := clock_timestamp();
		EXIT WHEN ended IS NOT NULL AND t > ended + interval '20s';
		SELECT count(*) FILTER (WHERE projcache.get('hot' || i) IS NULL)
		  INTO nulls
		  FROM (SELECT 1 + (first + n * 125 + j) % 10000 AS i
		          FROM generate_series(0, 124) AS j) AS r;
		IF started IS NOT NULL AND ended IS NULL THEN
			dr := dr + 125;
			dn := dn + nulls;
		ELSIF ended IS NOT NULL AND t > ended + interval '10s' THEN
			ar := ar + 125;
			an := an + nulls;
		END IF;
		PERFORM pg_sleep(0.1);
	END LOOP;
	RAISE NOTICE 'result %|%|%|%', dr, dn, ar, an;
END $$;
};
# The scan takes about a minute; the readers 20 s more.
my @readers =
  map { start_session($node, "hotreader$_", $reader_sql, timeout => 600) }
  1 .. 8;
my $scanner =
  start_session($node, 'scanner', 'CALL public.scan()', timeout => 600);
ok( $node->poll_query_until(
		'postgres',
		"SELECT count(*) > 5000 FROM projcache.entries WHERE key LIKE 'cold%'"),
	'the scan is under way');

# A snapshot refresh during the scan completes.
$node->safe_psql('postgres', "UPDATE public.settings SET val = 'new' WHERE id = 1");
$node->safe_psql('postgres', "SELECT projcache.refresh_snapshot('settings')");
is( $node->safe_psql(
		'postgres',
		q{SELECT val FROM projcache.snapshot('settings') AS s(id int, val text) WHERE id = 1}),
	'new',
	'a snapshot refresh during the scan completes');
is( $node->safe_psql(
		'postgres',
		"SELECT count(*) FROM public.phase WHERE name = 'scan_ended'"),
	'0',
	'the scan was still running then');

my ($scan_rc, $scan_out, $scan_err) = wait_session($scanner);
is($scan_rc, 0, 'the scan read its 200,000 keys without an ERROR')
  or diag($scan_err);

my ($dr, $dn, $ar, $an) = (0, 0, 0, 0);
foreach my $r (@readers)
{
	my ($rc, $out, $err) = wait_session($r);
	is($rc, 0, 'a hot reader ran') or diag($err);
	if ($err =~ /result (\d+)\|(\d+)\|(\d+)\|(\d+)/)
	{
		$dr += $1;
		$dn += $2;
		$ar += $3;
		$an += $4;
	}
}
my $report = "hot-key reads during the scan: $dr, NULL: $dn; "
  . "from 10 s after it: $ar, NULL: $an";
note($report);
diag($report);
diag(
	$node->safe_psql(
		'postgres',
		'SELECT format($$entries %s, memory %s of %s, evictions_memory %s, '
		  . 'expiry evictions %s, evictions %s, refused_reads %s, fetch calls %s$$, entries, '
		  . 'memory_used, memory_limit, evictions_memory, evictions_expired, evictions, '
		  . 'refused_reads, fetch_calls) FROM projcache.stats'));
cmp_ok($dr, '>', 100000, 'the hot keys were read while the scan ran');
cmp_ok($dn, '<=', 0.001 * $dr,
	'at most 0.1 % of the hot-key reads during the scan returned NULL');
cmp_ok($ar, '>', 10000, 'the hot keys were read from 10 s after the scan');
is($an, 0, 'none of those returned NULL');

cmp_ok(
	$node->safe_psql(
		'postgres', "SELECT count(*) FROM projcache.entries WHERE key LIKE 'cold%'"),
	'<', 200000,
	'the scan\'s keys did not all stay');
cmp_ok(stat_value($node, 'memory_used'), '<=', $limit,
	'memory_used is within memory_limit');
log_shows_no_crash($node);
$node->stop;
done_testing();
