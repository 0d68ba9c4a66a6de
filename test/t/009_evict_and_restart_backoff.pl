# Copyright (c) 2026, projcache developers
#
# evict(), invalidate() and a worker restart, against the races and
# schedules they must get right:
#
# 1. evict() of a HOT key returns at once: it waits for its own entry to be
#    removed, not for the key to stay absent while a reader re-creates it.
# 2. evict() of a key whose fetch is gathered into a batch but not yet sent
#    drops that fetch: it returns without waiting for the batch, the key is
#    gone, and the fetch function is never asked for it.
# 3. invalidate() marks the key stale at once but requests its refetch only
#    at COMMIT (a fetch before it would cache the old rows as fresh); a
#    rolled-back invalidate() requests nothing and leaves the key stale.
# 4. A worker restart resumes a failing key's retry backoff: the attempts
#    count survives, and the first attempt of the new worker waits for the
#    backoff instead of running at once.

use strict;
use warnings;

use FindBin;
use lib $FindBin::RealBin;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use ProjcacheTest;
use Test::More;
use Time::HiRes qw(usleep time);

my $node = projcache_node('evict_backoff',
	conf => "projcache.max_retry_backoff = '1min'\n");
create_local_upstream($node);
set_fetch_function($node, 'public.fetch');
$node->safe_psql(
	'postgres', q{
INSERT INTO public.upstream (key, revision, config) VALUES
	('hot', 'r1', '{"hot": 1}'),
	('gathered', 'r1', '{"gathered": 1}'),
	('witness', 'r1', '{"witness": 1}'),
	('k', 'r1', '{"k": 1}');
INSERT INTO public.upstream (key, state) VALUES ('failing', 'pending');
});

# How many calls of the fetch function asked for $key.
sub key_calls
{
	my ($key) = @_;
	return $node->safe_psql('postgres',
		"SELECT count(*) FROM public.calls WHERE '$key' = ANY (keys)");
}

# Run $expr (one SQL expression) and return (its value, seconds it took),
# both measured on the server with clock_timestamp().
sub timed
{
	my ($expr) = @_;
	my $out = $node->safe_psql(
		'postgres', qq{
CREATE TEMP TABLE timed (value text, secs float8);
DO \$\$
DECLARE
	t0 timestamptz := clock_timestamp();
	v text;
BEGIN
	v := ($expr)::text;
	INSERT INTO timed VALUES (v, extract(epoch FROM clock_timestamp() - t0));
END
\$\$;
SELECT value, secs FROM timed;
});
	return split /\|/, $out, 2;
}

# Run $sql until it returns 't', for at most $seconds of real time.
sub poll_briefly
{
	my ($sql, $seconds) = @_;
	my $deadline = time + $seconds;
	while (time < $deadline)
	{
		return 1 if $node->safe_psql('postgres', $sql) eq 't';
		usleep(50_000);
	}
	return 0;
}

# ---------------------------------------------------------------------------
# 1. evict() of a hot key.
# ---------------------------------------------------------------------------
is($node->safe_psql('postgres', "SELECT projcache.get('hot', '5s')"),
	'{"hot": 1}', 'hot: cached');
my $hot_calls = key_calls('hot');

# A reader calls get('hot') every millisecond for 3 s, and counts its reads
# and how many of them found the key re-created but not yet fetched.
my $reader = start_session(
	$node, 'hot_reader', q{
DO $$
DECLARE
	t_end timestamptz := clock_timestamp() + interval '3s';
	n int := 0;
	misses int := 0;
BEGIN
	WHILE clock_timestamp() < t_end LOOP
		IF projcache.get('hot') IS NULL THEN
			misses := misses + 1;
		END IF;
		n := n + 1;
		PERFORM pg_sleep(0.001);
	END LOOP;
	RAISE NOTICE 'reads=% misses=%', n, misses;
END
$$;});
ok( poll_briefly(
		q{SELECT count(*) = 1 FROM pg_stat_activity
		  WHERE application_name = 'hot_reader' AND state = 'active'}, 5),
	'hot: the reader loop runs');
# Let it read for a while first, so evict() lands in the middle of the loop.
usleep(300_000);

my $evictions_before = stat_value($node, 'evictions');
my ($evicted, $evict_secs) = timed(q{projcache.evict('hot')});
is($evicted, 'true', 'hot: evict() returns true');
cmp_ok($evict_secs, '<', 2,
	'hot: evict() returns well before its 5 s bound while a reader re-creates the key'
);
cmp_ok(stat_value($node, 'evictions'),
	'>', $evictions_before, 'hot: stats.evictions counts the eviction');
is( $node->safe_psql(
		'postgres',
		"SELECT count(*) FROM pg_stat_activity WHERE application_name = 'hot_reader' AND state = 'active'"
	),
	'1',
	'hot: the reader was still reading when evict() returned');

my ($rc, $out, $err) = wait_session($reader);
is($rc, 0, 'hot: the reader loop ended cleanly') or diag($err);
my ($reads, $misses) = $err =~ /reads=(\d+) misses=(\d+)/;
cmp_ok($reads // 0, '>', 500, "hot: the reader read the key many times ($reads)");
# The reader re-created the key after the eviction, and it was fetched again.
ok( $node->poll_query_until(
		'postgres',
		"SELECT state = 'enabled' FROM projcache.entries WHERE key = 'hot'"),
	'hot: the reader re-created the key, and it was fetched again');
cmp_ok(key_calls('hot'), '>', $hot_calls,
	'hot: the re-created key was fetched again');

# ---------------------------------------------------------------------------
# 2. evict() of a key whose fetch is gathered but not sent.
# ---------------------------------------------------------------------------
$node->safe_psql('postgres',
	"ALTER SYSTEM SET projcache.batch_interval = '3s'");
reload_and_wait($node);

my $max_call_id =
  $node->safe_psql('postgres', 'SELECT coalesce(max(id), 0) FROM public.calls');
# witness first: the batch that gathers it would carry 'gathered' too.
$node->safe_psql('postgres', "SELECT projcache.fetch('witness')");
$node->safe_psql('postgres', "SELECT projcache.fetch('gathered')");
($evicted, $evict_secs) = timed(q{projcache.evict('gathered')});
is($evicted, 'true', 'gathered: evict() returns true');
cmp_ok($evict_secs, '<', 1,
	'gathered: evict() does not wait for the 3 s batch interval');
is( $node->safe_psql(
		'postgres', "SELECT count(*) FROM projcache.entries WHERE key = 'gathered'"),
	'0',
	'gathered: the key is gone from projcache.entries');

# The batch still goes out (with witness), without the evicted key.
is($node->safe_psql('postgres', "SELECT projcache.get('witness', '6s')"),
	'{"witness": 1}', 'gathered: the batch was sent, with the witness key');
is( $node->safe_psql(
		'postgres',
		"SELECT count(*) FILTER (WHERE 'witness' = ANY (keys)) > 0, "
		  . "count(*) FILTER (WHERE 'gathered' = ANY (keys)) "
		  . "FROM public.calls WHERE id > $max_call_id"),
	't|0',
	'gathered: the fetch function was never called for the evicted key');
is(key_calls('gathered'), '0', 'gathered: no call ever asked for it');
is( $node->safe_psql(
		'postgres', "SELECT count(*) FROM projcache.entries WHERE key = 'gathered'"),
	'0',
	'gathered: the key did not come back');

$node->safe_psql('postgres', 'ALTER SYSTEM RESET projcache.batch_interval');
reload_and_wait($node);

# ---------------------------------------------------------------------------
# 3. invalidate() takes effect at COMMIT.
# ---------------------------------------------------------------------------
is($node->safe_psql('postgres', "SELECT projcache.get('k', '5s')"),
	'{"k": 1}', 'k: cached');
is( $node->safe_psql(
		'postgres',
		"SELECT freshness, fetch_state, revision FROM projcache.entries WHERE key = 'k'"
	),
	'fresh|complete|r1',
	'k: fresh, revision r1');
my $k_calls = key_calls('k');

my $tx = $node->background_psql('postgres');
$tx->query_safe('BEGIN');
$tx->query_safe(
	q{UPDATE public.upstream SET revision = 'r2', config = '{"k": 2}' WHERE key = 'k'});
is($tx->query_safe("SELECT projcache.invalidate('k')"),
	't', 'k: invalidate() in an open transaction returns true');
$tx->query_safe('SELECT pg_sleep(1)');

# Looked at from another session, through the view only (a get() of a stale
# key would ask for a fetch of its own).
is( $node->safe_psql(
		'postgres',
		"SELECT freshness, fetch_state, revision FROM projcache.entries WHERE key = 'k'"
	),
	'stale|complete|r1',
	'k: before COMMIT the key is stale, not being fetched, still r1');
is(key_calls('k'), $k_calls, 'k: before COMMIT the key was not refetched (1 s later)');

$tx->query_safe('COMMIT');
ok( poll_briefly(
		"SELECT revision = 'r2' AND freshness = 'fresh' FROM projcache.entries WHERE key = 'k'",
		5),
	'k: after COMMIT the new revision arrives');
cmp_ok(key_calls('k'), '>', $k_calls, 'k: the COMMIT called the fetch function');
is($node->safe_psql('postgres', "SELECT projcache.get('k')"),
	'{"k": 2}', 'k: get() serves the new value');

# A rolled-back invalidate().
$k_calls = key_calls('k');
$tx->query_safe('BEGIN');
$tx->query_safe(
	q{UPDATE public.upstream SET revision = 'r3', config = '{"k": 3}' WHERE key = 'k'});
is($tx->query_safe("SELECT projcache.invalidate('k')"),
	't', 'k: invalidate() in a transaction to be rolled back');
$tx->query_safe('ROLLBACK');
$tx->quit;
usleep(500_000);
is(key_calls('k'), $k_calls, 'k: a rolled-back invalidate() requested no fetch');
is( $node->safe_psql(
		'postgres',
		"SELECT freshness, fetch_state, revision FROM projcache.entries WHERE key = 'k'"
	),
	'stale|complete|r2',
	'k: after ROLLBACK the key is stale, still r2');
is($node->safe_psql('postgres', "SELECT projcache.get('k')"),
	'{"k": 2}', 'k: the stale value keeps serving');
ok( poll_briefly(
		"SELECT freshness = 'fresh' FROM projcache.entries WHERE key = 'k'", 5),
	'k: the read of the stale key refetched it');
cmp_ok(key_calls('k'), '>', $k_calls, 'k: that read called the fetch function');

# ---------------------------------------------------------------------------
# 4. A restart resumes the backoff of a failing key.
# ---------------------------------------------------------------------------
is($node->safe_psql('postgres', "SELECT projcache.get('failing') IS NULL"),
	't', 'failing: pending on first read');
# Backoffs: 0 after the 1st failure, 1 s after the 2nd, 1.5 s after the 3rd.
# Step the clock through them until 4 attempts have failed.
my $reached = 0;
for my $i (1 .. 40)
{
	my $attempts = $node->safe_psql('postgres',
		"SELECT attempts FROM projcache.entries WHERE key = 'failing'");
	if ($attempts ne '' && $attempts >= 4)
	{
		$reached = 1;
		last;
	}
	advance_clock($node, '500ms');
	usleep(50_000);
}
ok($reached, 'failing: reached 4 failed attempts by moving the clock');

my ($attempts_before, $fetch_state) = split /\|/, $node->safe_psql('postgres',
	"SELECT attempts, fetch_state FROM projcache.entries WHERE key = 'failing'");
cmp_ok($attempts_before, '>=', 4, "failing: attempts = $attempts_before");
is($node->safe_psql('postgres',
		"SELECT state FROM projcache.entries WHERE key = 'failing'"),
	'pending', 'failing: the key is still pending');

my $old_pid = worker_pid($node);
ok(kill('TERM', $old_pid), 'failing: sent SIGTERM to the worker');
ok(wait_for_worker_exit($node), 'failing: the worker exited');
my $calls_before = key_calls('failing');
my $new_pid = wait_for_worker($node, $old_pid);
my $t_restart = time;
like($new_pid, qr/^\d+$/, 'failing: the worker was restarted');
isnt($new_pid, $old_pid, 'failing: it is a new process');

my $attempts_after = $node->safe_psql('postgres',
	"SELECT attempts FROM projcache.entries WHERE key = 'failing'");
cmp_ok($attempts_after, '>=', $attempts_before,
	"failing: attempts survive the restart ($attempts_after)");

# Half a second of real time after the restart, with no clock step: the
# resumed backoff (2.25 s or more) is not over, so no attempt ran.
my $wait = 0.5 - (time - $t_restart);
usleep(int($wait * 1_000_000)) if $wait > 0;
is(key_calls('failing'), $calls_before,
	'failing: the restarted worker did not retry at once');
is( $node->safe_psql('postgres',
		"SELECT attempts FROM projcache.entries WHERE key = 'failing'"),
	$attempts_after,
	'failing: and the attempts count did not move');

# Move the clock by the backoff: now the retry runs, within well under the
# backoff in real time.
my $backoff = 1.0 * 1.5**($attempts_after - 2);
$backoff = 60 if $backoff > 60;
my $t_step = time;
advance_clock($node, sprintf('%dms', int($backoff * 1000) + 200));
ok(poll_briefly("SELECT count(*) > $calls_before FROM public.calls WHERE 'failing' = ANY (keys)", 1.5),
	sprintf('failing: moving the clock by the backoff (%.2f s) retries it', $backoff));
cmp_ok(time - $t_restart, '<', $backoff,
	'failing: the retry came before the backoff ran out in real time');
cmp_ok($node->safe_psql('postgres',
		"SELECT attempts FROM projcache.entries WHERE key = 'failing'"),
	'>', $attempts_after, 'failing: the retry counted as another attempt');

$node->stop;
done_testing();
