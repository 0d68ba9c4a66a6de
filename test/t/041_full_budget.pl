# Copyright (c) 2026, projcache developers
#
# A full key cache uses its whole budget, and makes room a few keys at a
# time.  Under several settings (value sizes of 100 B, 1 kB and 4 kB, short
# and long keys, batch sizes, with and without a snapshot budget):
#
# a. Distinct keys are read until they would take three times what
#    projcache.max_memory leaves for keys.  Once no key waits for a fetch,
#    memory_used is at least 97 % of that part and never past it, and no
#    fetch failed for want of room.
# b. 200 more new keys, read once the cache is full, evict about as many
#    keys as they take room for (not a tenth of the cache at once), and the
#    use stays at 97 % or more.
# c. Refetching those 200 keys (invalidate(); values of the same size)
#    evicts at most a key or two: each old value's room is freed once its
#    new one is stored, so the room the first refetch made serves the rest
#    (a refetch that evicted a key each time would fail this).

use strict;
use warnings;

use FindBin;
use lib $FindBin::RealBin;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use ProjcacheTest;
use Test::More;

# value bytes, key prefix, max_memory, snapshot_memory, batch_size
my @settings = (
	[ 100, 'a', '4MB', '0', 500 ],
	[ 1024, 'b', '8MB', '0', 100 ],
	[ 4096, 'c' x 20, '8MB', '0', 500 ],
	[ 1024, 'd' x 16, '16MB', '4MB', 50 ],
);

my $node = projcache_node('budget');

# Key '<prefix>:<size>:<i>' gets a config of exactly <size> bytes: a jsonb
# string of md5 text, which does not compress.
$node->safe_psql(
	'postgres', q{
CREATE FUNCTION public.fetch(p_keys text[], p_revisions text[])
RETURNS TABLE(key text, state text, revision text, config jsonb)
LANGUAGE sql AS $$
	SELECT k, 'enabled', 'r1',
	       to_jsonb(left(repeat(md5(k), 200), split_part(k, ':', 2)::int - 12))
	  FROM unnest(p_keys) AS k
$$;
});
set_fetch_function($node, 'public.fetch');

# The worker is idle: no key waits for a fetch, and the last one settled.
sub wait_idle
{
	my ($what) = @_;
	ok( $node->poll_query_until(
			'postgres', q{
SELECT count(*) = 0 FROM projcache.entries WHERE state = 'pending'}),
		"$what: no key waits for a fetch");
}

sub stats
{
	my %s;
	@s{qw(used limit evicted errors entries)} = split /\|/,
	  $node->safe_psql(
		'postgres', q{
SELECT memory_used, memory_limit, evictions_memory, fetch_errors, entries
  FROM projcache.stats});
	return \%s;
}

foreach my $s (@settings)
{
	my ($size, $prefix, $max_memory, $snap_memory, $batch) = @$s;
	my $name = "$size B values, $max_memory, batch $batch"
	  . ($snap_memory eq '0' ? '' : ", snapshot_memory $snap_memory")
	  . (length($prefix) > 13 ? ', long keys' : '');

	$node->append_conf(
		'postgresql.conf', qq{
projcache.max_memory = '$max_memory'
projcache.snapshot_memory = '$snap_memory'
projcache.batch_size = $batch
projcache.dump_interval = -1
});
	$node->restart;
	wait_for_worker($node);

	my $limit = stats()->{limit};
	my $snap = $node->safe_psql('postgres',
		"SELECT pg_size_bytes(current_setting('projcache.snapshot_memory'))");
	my $reserve = $limit / 16 < 65536 ? int($limit / 16) : 65536;
	my $bound = $limit - $snap - $reserve;

	# a. Three times what fits, read in slices, each slice waited for.
	my $n = int(3 * $bound / ($size + 150));
	my $slice = 2000;
	for (my $from = 1; $from <= $n; $from += $slice)
	{
		my $to = $from + $slice - 1;
		$to = $n if $to > $n;
		$node->safe_psql('postgres',
			"SELECT count(projcache.get('$prefix:$size:' || i)) FROM generate_series($from, $to) i"
		);
		$node->poll_query_until(
			'postgres', q{
SELECT count(*) = 0 FROM projcache.entries WHERE state = 'pending'});
	}
	wait_idle("$name: $n keys read");
	my $a = stats();
	diag(sprintf('%s: %d keys held, memory_used %d of %d (%.2f %%)',
			$name, $a->{entries}, $a->{used}, $bound,
			100 * $a->{used} / $bound));
	cmp_ok($a->{used}, '>=', 0.97 * $bound,
		"$name: memory_used is at least 97 % of the keys' part");
	cmp_ok($a->{used}, '<=', $bound, "$name: and never past it");
	cmp_ok($a->{evicted}, '>', 0, "$name: keys were evicted for memory");
	is($a->{errors}, 0, "$name: no fetch failed for want of room");

	# b. 200 more: about as many evictions.
	my $more = 200;
	$node->safe_psql('postgres',
		"SELECT count(projcache.get('$prefix:$size:more' || i)) FROM generate_series(1, $more) i"
	);
	wait_idle("$name: $more more keys read");
	ok( $node->poll_query_until(
			'postgres',
			"SELECT count(*) = $more FROM projcache.entries WHERE key LIKE '$prefix:$size:more%' AND state = 'enabled'"
		),
		"$name: the $more new keys are cached");
	my $b = stats();
	my $evicted = $b->{evicted} - $a->{evicted};
	diag("$name: $more new keys evicted $evicted");
	cmp_ok($evicted, '>=', 0.75 * $more,
		"$name: the new keys evicted about as many");
	cmp_ok($evicted, '<=', 1.25 * $more + 10,
		"$name: and not a share of the cache at once");
	cmp_ok($b->{used}, '>=', 0.97 * $bound,
		"$name: memory_used is still at least 97 % of the keys' part");
	is($b->{errors}, 0, "$name: still no fetch failed");

	# c. Refetching the 200 keys (values of the same size) evicts next to nothing.
	my $fetched = stat_value($node, 'fetched_keys');
	$node->safe_psql('postgres',
		"SELECT count(projcache.invalidate('$prefix:$size:more' || i)) FROM generate_series(1, $more) i"
	);
	ok( $node->poll_query_until(
			'postgres',
			"SELECT fetched_keys >= $fetched + $more FROM projcache.stats"),
		"$name: the $more keys are fetched again");
	wait_idle("$name: refetched");
	my $c = stats();
	cmp_ok($c->{evicted} - $b->{evicted}, '<=', 2,
		"$name: refetching values of the same size evicts (almost) nothing");
	is($c->{errors}, 0, "$name: no refetch failed");
}

done_testing();
