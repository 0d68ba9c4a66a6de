# Copyright (c) 2026, projcache developers
#
# A cold start (issue 29, "Cold start"): a service warming its cache after
# a deploy reads N new keys once each, in one statement, then waits for
# each with get(key, '30s').  The keys fit in memory with room to spare,
# so nothing read once may be dropped: for each N and batch size below,
#
# - every wait returns the key's value;
# - stats.dropped_fetches stays 0;
# - the fetch function is called at most 2 × N / batch_size + 10 times
#   (full batches, not the few keys a call of waits for dropped keys);
#
# and the times of the cases are printed.  On 1.2 the keys past the
# read-once bound (16 batches) were dropped, and each wait fetched its
# key in a call of its own: minutes for 20,000 keys.

use strict;
use warnings;

use FindBin;
use lib $FindBin::RealBin;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use ProjcacheTest;
use Test::More;
use Time::HiRes qw(time);

my @cases = (
	{ n => 2000, batch_size => 500 },
	{ n => 20000, batch_size => 500 },
	{ n => 2000, batch_size => 100 },
	{ n => 20000, batch_size => 100 },
);

# The issue's settings: 64 MB and the default batch interval.
my $node = projcache_node(
	'cold',
	conf => "projcache.max_memory = '64MB'\n"
	  . "projcache.batch_interval = '100ms'\n");
create_local_upstream($node);
$node->safe_psql(
	'postgres', q{
INSERT INTO public.upstream (key, revision, config)
SELECT 'c' || s || '_' || i, 'r1', jsonb_build_object('n', i)
  FROM generate_series(1, 20000) AS i, generate_series(1, 4) AS s;
ANALYZE public.upstream;
});
set_fetch_function($node, 'public.fetch');
wait_for_worker($node);

my $set = 0;
my %took;
foreach my $c (@cases)
{
	my ($n, $bs) = ($c->{n}, $c->{batch_size});
	my $name = "N=$n, batch_size=$bs";

	$set++;
	$node->append_conf('postgresql.conf', "projcache.batch_size = $bs\n");
	reload_and_wait($node);
	is($node->safe_psql('postgres', 'SHOW projcache.batch_size'),
		$bs, "$name: batch_size in force");

	my $calls0 = calls_count($node);
	my $dropped0 = stat_value($node, 'dropped_fetches');
	my $prefix = "c${set}_";
	my $t0 = time;
	$node->safe_psql('postgres',
		"SELECT count(projcache.get('$prefix' || i)) FROM generate_series(1, $n) AS i"
	);
	# Each wait in its own statement, as a service does; a statement
	# timeout so that the case ends even where the waits crawl.
	my ($rc, $out, $err) = $node->psql(
		'postgres', qq{
SET statement_timeout = '120s';
DO \$\$
DECLARE
	answered int := 0;
BEGIN
	FOR i IN 1..$n LOOP
		IF projcache.get('$prefix' || i, '30s') IS NOT NULL THEN
			answered := answered + 1;
		END IF;
	END LOOP;
	RAISE NOTICE 'answered %', answered;
END \$\$;
});
	my $took = time - $t0;
	$took{$name} = $took;
	is($rc, 0, "$name: the waits ran") or diag($err);
	my ($answered) = $err =~ /answered (\d+)/;
	is($answered // -1, $n, "$name: every wait returned the key's value");
	is(stat_value($node, 'dropped_fetches') - $dropped0,
		0, "$name: no fetch was dropped while memory had room");
	my $calls = calls_count($node) - $calls0;
	cmp_ok($calls, '<=', 2 * $n / $bs + 10,
		"$name: $calls calls of the fetch function (full batches)");
	note(sprintf('%s: %.2f s, %d calls', $name, $took, $calls));
	diag(sprintf('%s: %.2f s, %d calls', $name, $took, $calls));
}
cmp_ok(
	stat_value($node, 'memory_used'), '<=',
	stat_value($node, 'memory_limit'),
	'memory_used is within memory_limit');
log_shows_no_crash($node);
$node->stop;
done_testing();
