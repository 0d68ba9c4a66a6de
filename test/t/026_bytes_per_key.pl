# Copyright (c) 2026, projcache developers
#
# What a cached key costs, and that values and keys laid out to cost less
# read back whole.
#
# a. memory_used divided by the keys held, for values (configs) of 100 B,
#    1,000 B, 1,024 B, 4,000 B and 4,096 B, with keys of 6 to 11 bytes and a
#    2-byte revision.  Each size is measured on its own: N keys are read and
#    fetched, and the growth of memory_used is divided by N.  The numbers are
#    reported; what a key costs beyond its value's own bytes is at most 120
#    bytes at every size: one chunk's 40-byte header, its key, the
#    allocator's rounding, and the bucket arrays' growth, which falls on
#    some sizes' keys (measured 60 to 102).  1.2 took up to 170: a 112-byte
#    map entry and a second chunk for the value; 1.1.1 took 192 to 1,527.
# b. Every one of those values reads back as the fetch function returned
#    it, through get() and projcache.entries (config and revision).
# c. Keys longer than an entry holds (14 to 40 bytes), and revisions of up
#    to 6,000 bytes and configs of up to 20,000, which may fall across the
#    cut of a value in two, read
#    back whole: key, revision and config; and the revision the worker
#    hands the fetch function on a refetch is the one it returned.

use strict;
use warnings;

use FindBin;
use lib $FindBin::RealBin;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use ProjcacheTest;
use Test::More;

my $n = 2000;
my $node = projcache_node('bytes', conf => "projcache.max_memory = '64MB'\n");

# Key 'b<size>:<i>' gets a config of exactly <size> bytes (a jsonb string:
# 12 bytes of headers, then md5 text, which does not compress) and the
# revision 'r1'; key 'r<revlen>:<size>:<i>' a revision of <revlen> bytes.
# The revisions each call was handed are kept in public.seen.
$node->safe_psql(
	'postgres', q{
CREATE TABLE public.seen (key text, revision text);
CREATE FUNCTION public.expected_config(k text) RETURNS jsonb
LANGUAGE sql IMMUTABLE AS $$
	SELECT to_jsonb(left(repeat(md5(k), 1000),
	                     CASE WHEN k LIKE 'r%' THEN split_part(k, ':', 2)
	                          ELSE split_part(substr(k, 2), ':', 1) END::int - 12))
$$;
CREATE FUNCTION public.expected_revision(k text) RETURNS text
LANGUAGE sql IMMUTABLE AS $$
	SELECT CASE WHEN k LIKE 'r%'
	            THEN left(repeat(md5('rev' || k), 200),
	                      split_part(substr(k, 2), ':', 1)::int)
	            ELSE 'r1' END
$$;
CREATE FUNCTION public.fetch(p_keys text[], p_revisions text[])
RETURNS TABLE(key text, state text, revision text, config jsonb)
LANGUAGE plpgsql AS $$
BEGIN
	INSERT INTO public.seen
		SELECT k, r FROM unnest(p_keys, p_revisions) AS u(k, r)
		 WHERE r IS NOT NULL;
	RETURN QUERY
		SELECT k, 'enabled'::text, public.expected_revision(k),
		       public.expected_config(k)
		  FROM unnest(p_keys) AS k;
END
$$;
});
set_fetch_function($node, 'public.fetch');

my %bytes;
foreach my $size (100, 1000, 1024, 4000, 4096)
{
	my ($used0, $n0) = split /\|/,
	  $node->safe_psql('postgres',
		'SELECT memory_used, entries FROM projcache.stats');
	$node->safe_psql('postgres',
		"SELECT count(projcache.get('b$size:' || i)) FROM generate_series(1, $n) i"
	);
	ok( $node->poll_query_until(
			'postgres', qq{
SELECT count(*) = $n AND bool_and(value_bytes = $size)
  FROM projcache.entries
 WHERE key LIKE 'b$size:%' AND state = 'enabled'}),
		"$n keys with values of $size bytes are fetched");
	my ($used1, $n1) = split /\|/,
	  $node->safe_psql('postgres',
		'SELECT memory_used, entries FROM projcache.stats');
	is($n1 - $n0, $n, "$n entries more");
	$bytes{$size} = ($used1 - $used0) / $n;
}
diag('bytes per key (memory_used / keys): '
	  . join(', ', map { "$_ B values: $bytes{$_}" } sort { $a <=> $b } keys %bytes));
foreach my $size (sort { $a <=> $b } keys %bytes)
{
	cmp_ok($bytes{$size} - $size, '<=', 120,
		"a key with a value of $size bytes costs at most 120 bytes more");
}

# ---------------------------------------------------------------------------
# b. They read back whole.
# ---------------------------------------------------------------------------
is( $node->safe_psql(
		'postgres', q{
SELECT count(*) FILTER (WHERE projcache.get(e.key) IS DISTINCT FROM
                              public.expected_config(e.key)
                           OR e.revision IS DISTINCT FROM 'r1'
                           OR e.value_bytes <> pg_column_size(projcache.get(e.key)))
  FROM projcache.entries e WHERE e.key LIKE 'b%'}),
	'0',
	'every value reads back as fetched: config and revision');

# ---------------------------------------------------------------------------
# c. Long keys and long revisions, across the cut.
# ---------------------------------------------------------------------------
my @keys;
foreach my $revlen (0, 1, 13, 1003, 1004, 4070, 4077, 6000)
{
	foreach my $size (100, 1024, 4096, 20000)
	{
		push @keys, "r$revlen:$size:1";
		push @keys, "r$revlen:$size:" . ('x' x 30);
	}
}
push @keys, 'b1024:' . ('y' x 7), 'b1024:' . ('y' x 8), 'b1024:' . ('z' x 34);
my $list = join(',', map { "'$_'" } @keys);
my $nkeys = scalar @keys;
$node->safe_psql('postgres',
	"SELECT count(projcache.get(k)) FROM unnest(ARRAY[$list]) AS k");
ok( $node->poll_query_until(
		'postgres', qq{
SELECT count(*) = $nkeys FROM projcache.entries
 WHERE key = ANY (ARRAY[$list]) AND state = 'enabled'}),
	'keys with long revisions and long keys are fetched');
my $check = qq{
SELECT count(*) FILTER (WHERE projcache.get(k) IS DISTINCT FROM
                              public.expected_config(k)
                           OR e.revision IS DISTINCT FROM public.expected_revision(k)),
       count(e.key)
  FROM unnest(ARRAY[$list]) AS k LEFT JOIN projcache.entries e ON e.key = k};
is($node->safe_psql('postgres', $check),
	"0|$nkeys", 'their keys, revisions and configs read back whole');

# A refetch hands the fetch function the revision it returned.
$node->safe_psql('postgres', 'TRUNCATE public.seen');
$node->safe_psql('postgres',
	"SELECT count(projcache.invalidate(k)) FROM unnest(ARRAY[$list]) AS k");
ok( $node->poll_query_until(
		'postgres', qq{
SELECT count(DISTINCT key) = $nkeys FROM public.seen}),
	'the invalidated keys are fetched again');
is( $node->safe_psql(
		'postgres', q{
SELECT count(*) FROM public.seen
 WHERE revision IS DISTINCT FROM public.expected_revision(key)}),
	'0',
	'each refetch was handed the revision of the value it had');
is($node->safe_psql('postgres', $check),
	"0|$nkeys", 'and the values still read back whole');

done_testing();
