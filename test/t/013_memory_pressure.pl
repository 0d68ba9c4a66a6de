# Copyright (c) 2026, projcache developers
#
# A full cache evicts, never fails (S3-FIFO under projcache.max_memory).
#
# a. The working-set scenario: projcache.max_memory = 8MB, an upstream of
#    50,000 keys with configs of about 1 kB, rounds of 5,000 get() calls of
#    which 80 % go to 5,000 hot keys, then the hot set moves to 5,000 other
#    keys.  In every round no read fails, and memory_used never exceeds
#    memory_limit (sampled every 500 reads); the hit ratio climbs once the
#    cache is warm, and again after the shift.  The hit ratio of each round
#    (projcache.stats, reset per round) is reported, not asserted: ratios
#    belong to bench/hit_path.sh, which runs the same scenario.
# b. A flood: a role that may only call get() reads 100,000 distinct keys,
#    which the upstream answers "pending".  No read gets an ERROR; another
#    role's new key is created and fetched meanwhile, and its keys are
#    served afterwards.
# c. Room does not wait for the worker to be between fetches: while the
#    fetch function sleeps, new keys read as pending (no ERROR); once it
#    returns, they are created and fetched.

use strict;
use warnings;

use FindBin;
use lib $FindBin::RealBin;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use ProjcacheTest;
use Test::More;

my $node = projcache_node(
	'pressure',
	conf => "projcache.max_memory = '8MB'\n"
	  . "projcache.batch_interval = '10ms'\n");
create_local_upstream($node);
set_fetch_function($node, 'public.fetch');
my $pid = wait_for_worker($node);
my $limit = stat_value($node, 'memory_limit');

# The upstream's 50,000 keys and public.round(), shared with bench/.
$node->safe_psql('postgres',
	slurp_file("$FindBin::RealBin/../../bench/working_set.sql"));

# Runs one round in its own session, then lets the worker catch up for a
# second (the rounds of the scenario are a second apart).
sub run_round
{
	my ($hot_from, $seed) = @_;
	my ($failed, $ratio, $used) = split /\|/, $node->safe_psql('postgres',
		"SELECT failed, hit_ratio, max_used FROM public.round($hot_from, $seed)");
	$node->safe_psql('postgres', 'SELECT pg_sleep(1)');
	return ($failed, $ratio, $used);
}

# ---------------------------------------------------------------------------
# a. The working set, then a shift of the hot set.
# ---------------------------------------------------------------------------
my @ratios;
my $max_used = 0;
my $failed = 0;
foreach my $round (1 .. 8)
{
	my ($f, $r, $u) = run_round(1, $round / 100);
	push @ratios, $r;
	$failed += $f;
	$max_used = $u if $u > $max_used;
}
my @shifted;
foreach my $round (1 .. 5)
{
	my ($f, $r, $u) = run_round(25001, 0.5 + $round / 100);
	push @shifted, $r;
	$failed += $f;
	$max_used = $u if $u > $max_used;
}
my $report = sprintf(
	"hit ratio per round: %s; after the shift: %s; most memory_used %d of %d",
	join(' ', map { sprintf('%.3f', $_) } @ratios),
	join(' ', map { sprintf('%.3f', $_) } @shifted),
	$max_used, $limit);
note($report);
diag($report);

is($failed, 0, 'no read failed in any round');
cmp_ok($ratios[-1], '>', $ratios[1],
	'the hit ratio climbs as the cache warms up');
cmp_ok($shifted[-1], '>', $shifted[0],
	'and again after the hot set moved');
cmp_ok($max_used, '<=', $limit, 'memory_used never exceeded memory_limit');
cmp_ok(stat_value($node, 'evictions_memory'), '>', 0,
	'the worker evicted keys to make room');

# ---------------------------------------------------------------------------
# b. A get()-only role floods the cache with keys the upstream answers
#    "pending"; another role's hot and new keys keep working.
# ---------------------------------------------------------------------------
$node->safe_psql(
	'postgres', q{
INSERT INTO public.upstream (key, state) SELECT 'flood-' || i, 'pending' FROM generate_series(1, 100000) AS i;
CREATE ROLE flooder LOGIN;
CREATE ROLE app LOGIN;
GRANT USAGE ON SCHEMA projcache TO flooder, app;
-- so that the app's hot key reader sees whether the flood is running
GRANT pg_read_all_stats TO app;
GRANT EXECUTE ON FUNCTION projcache.get(text) TO flooder;
GRANT EXECUTE ON FUNCTION projcache.get(text), projcache.get(text, interval),
	projcache.lookup(text, interval) TO app;
});
# The app's 20 hot keys are cached before the flood starts.
ok( $node->poll_query_until(
		'postgres', q{
SELECT count(*) = 20 FROM generate_series(25001, 25020) AS i
 WHERE projcache.get('k' || i) IS NOT NULL}),
	'before the flood, 20 hot keys of the app are cached');
# While the flood runs, the app reads its 20 hot keys every 20 ms: this
# session counts the reads it made while the flooding session was active,
# and the hits among them; it ends once the flood has ended.
my $hot = start_session(
	$node, 'hotreader', q{
SET ROLE app;
CREATE TEMP TABLE hot_result (hits int, reads int);
DO $$
DECLARE
	hits int := 0;
	reads int := 0;
	seen boolean := false;
BEGIN
	FOR n IN 1..1000 LOOP
		PERFORM pg_stat_clear_snapshot();
		IF EXISTS (SELECT FROM pg_stat_activity
					WHERE application_name = 'flooder' AND state = 'active') THEN
			seen := true;
			reads := reads + 20;
			hits := hits + (SELECT count(*) FROM generate_series(25001, 25020) AS i
							 WHERE projcache.get('k' || i) IS NOT NULL);
		ELSIF seen THEN
			EXIT;
		END IF;
		PERFORM pg_sleep(0.02);
	END LOOP;
	INSERT INTO hot_result VALUES (hits, reads);
END $$;
SELECT hits || '|' || reads FROM hot_result;
});
my $flood = start_session(
	$node, 'flooder', q{
SET ROLE flooder;
DO $$
BEGIN
	FOR i IN 1..100000 LOOP
		PERFORM projcache.get('flood-' || i);
	END LOOP;
END $$;
});
ok( $node->poll_query_until(
		'postgres',
		"SELECT count(*) > 1000 FROM projcache.entries WHERE key LIKE 'flood-%'"),
	'the flood is under way');

# While it runs: a key new to the cache is created and fetched for the app.
is( $node->safe_psql(
		'postgres', q{
SET ROLE app;
SELECT state FROM projcache.lookup('k49999', '60s')}),
	'enabled',
	'during the flood, a key new to the cache is created and fetched for another role');
my ($flood_rc, $flood_out, $flood_err) = wait_session($flood);
my ($hot_rc, $hot_out, $hot_err) = wait_session($hot);
is($hot_rc, 0, 'the hot key reader ran') or diag($hot_err);
my ($hot_hits, $hot_reads) = split /\|/, $hot_out;
cmp_ok($hot_reads, '>', 0, 'it read the hot keys while the flood ran');
cmp_ok($hot_hits, '>=', 0.95 * $hot_reads,
	"during the flood, the app's hot keys were served ($hot_hits of $hot_reads reads)");
is($flood_rc, 0, 'the flooding role got no ERROR in 100,000 reads')
  or diag($flood_err);
cmp_ok($node->safe_psql('postgres', "SELECT count(*) FROM projcache.entries WHERE key LIKE 'flood-%'"),
	'<', 100000, 'the flood did not keep all its 100,000 pending keys');

# Afterwards, the app's keys (the current hot set) are served again: asked
# for once, then waited for.
$node->safe_psql('postgres',
	"SET ROLE app; SELECT count(projcache.get('k' || i)) FROM generate_series(25001, 25020) AS i");
ok( $node->poll_query_until(
		'postgres', q{
SELECT count(*) = 20 FROM generate_series(25001, 25020) AS i
 WHERE projcache.get('k' || i) IS NOT NULL}),
	'after the flood, 20 keys of the app are served');
cmp_ok(stat_value($node, 'memory_used'), '<=', $limit,
	'memory_used is within memory_limit');

# ---------------------------------------------------------------------------
# c. A fetch that sleeps: new keys read as pending meanwhile, never as an
#    ERROR, and are fetched once it returns.
# ---------------------------------------------------------------------------
$node->safe_psql(
	'postgres', q{
CREATE FUNCTION public.slow_fetch(p_keys text[], p_revisions text[])
RETURNS TABLE(key text, state text, revision text, config jsonb)
LANGUAGE plpgsql AS $$
BEGIN
	IF 'sleepy' = ANY (p_keys) THEN
		PERFORM pg_sleep(3);
	END IF;
	RETURN QUERY SELECT * FROM public.fetch(p_keys, p_revisions);
END $$;
INSERT INTO public.upstream (key, revision, config) VALUES ('sleepy', 'r1', '{"s": 1}');
});
set_fetch_function($node, 'public.slow_fetch');
# Asked for until its fetch is under way (a read that finds no room for
# the key creates nothing: it is asked for again).
ok( $node->poll_query_until(
		'postgres', q{
SELECT count(projcache.get('sleepy')) >= 0
   AND EXISTS (SELECT 1 FROM projcache.entries
                WHERE key = 'sleepy' AND fetch_state = 'in_progress')}),
	'the sleepy fetch is under way');
my ($rc, $out, $err) = psql_verbose(
	$node, q{
SELECT count(projcache.get('k' || i)) FROM generate_series(30001, 36000) AS i;
SELECT fetch_state FROM projcache.entries WHERE key = 'sleepy';
});
is($rc, 0, '6,000 new keys read during the long fetch, without an ERROR')
  or diag($err);
like($out, qr/in_progress$/, 'all while the sleepy fetch was still under way');
is( $node->safe_psql(
		'postgres',
		"SELECT count(*) FILTER (WHERE projcache.get('k' || i, '20s') IS NOT NULL) FROM generate_series(35991, 36000) AS i"
	),
	'10',
	'once the fetch returned, new keys are created and fetched');
cmp_ok(stat_value($node, 'memory_used'), '<=', $limit,
	'memory_used is within memory_limit');

# The key map checks out: its invariants hold (debug_check_map() raises
# data_corrupted at the first one broken), and it holds the keys
# projcache.entries lists.
my ($checked, $listed) = key_map_check($node);
is($checked, $listed, 'the key map checks out');

is(worker_pid($node), $pid, 'the worker kept its pid');
log_shows_no_crash($node);
$node->stop;
done_testing();
