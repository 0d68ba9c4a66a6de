# Copyright (c) 2026, projcache developers
#
# The scheduler worker and signals, and a full projcache.max_memory.
#
# a. A query cancel (pg_cancel_backend) sent to the idle worker does not
#    end it: same pid, nothing in the log about it exiting, keys still get
#    fetched.  Neither does a burst of cancels while it fetches.
# b. A cancel while the fetch function runs ends that fetch only: the key's
#    last_error is the cancel (not a fetch_timeout message), the old value
#    keeps serving, the worker lives on and retries.  A real timeout is
#    reported as "ran longer than projcache.fetch_timeout".
# c. With projcache.max_memory at its minimum (1MB), a full cache evicts and
#    never fails: 100 values of 20 kB (twice the memory) are all fetched
#    and served while five hot keys, read in between, stay cached (S3-FIFO);
#    a flood of 100,000 new keys gets no ERROR; memory_used never exceeds
#    memory_limit (sampled); a value that can never fit is refused with a
#    last_error naming projcache.max_memory, the key stays pending, and the
#    rest keeps serving.

use strict;
use warnings;

use FindBin;
use lib $FindBin::RealBin;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use ProjcacheTest;
use Test::More;
use Time::HiRes qw(usleep time);

# Check every 100 ms for about $seconds (in one query, server side) that
# the worker keeps the pid $pid: projcache.stats.worker_pid is read from
# shared memory and goes NULL when the worker exits.  Then check
# pg_stat_activity too.
sub worker_stays
{
	my ($node, $pid, $seconds) = @_;
	my $n = int($seconds * 10);
	my $ok = $node->safe_psql(
		'postgres', qq{
CREATE TEMP TABLE stays (ok boolean);
DO \$\$
DECLARE
	same boolean := true;
BEGIN
	FOR i IN 1..$n LOOP
		PERFORM pg_sleep(0.1);
		same := same AND coalesce((SELECT worker_pid FROM projcache.stats) = $pid, false);
	END LOOP;
	INSERT INTO stays VALUES (same);
END
\$\$;
SELECT ok FROM stays;
});
	return $ok eq 't' && worker_pid($node) eq $pid;
}

# Run $sql until it returns 't', for at most $seconds.
sub poll_briefly
{
	my ($node, $sql, $seconds) = @_;
	my $deadline = time + $seconds;
	while (time < $deadline)
	{
		return 1 if $node->safe_psql('postgres', $sql) eq 't';
		usleep(100_000);
	}
	return 0;
}

my $crash = qr/PANIC|TRAP:|terminated by signal|segmentation fault|exited with exit code/i;

my $node = projcache_node('signals',
	conf => "projcache.max_retry_backoff = '1s'\n");
create_local_upstream($node);
set_fetch_function($node, 'public.fetch');
$node->safe_psql(
	'postgres', q{
INSERT INTO public.upstream (key, revision, config)
SELECT 'cold-' || i, 'r1', jsonb_build_object('i', i) FROM generate_series(1, 3) AS i;
INSERT INTO public.upstream (key, revision, config)
SELECT 'burst-' || i, 'r1', jsonb_build_object('i', i) FROM generate_series(1, 150) AS i;
INSERT INTO public.upstream (key, revision, config) VALUES ('kc', 'r1', '{"v": 1}');
});

# ---------------------------------------------------------------------------
# a. Cancel the idle worker.
# ---------------------------------------------------------------------------
my $pid = wait_for_worker($node);
like($pid, qr/^\d+$/, 'the worker runs');
is($node->safe_psql('postgres', "SELECT projcache.get('cold-1', '5s')"),
	'{"i": 1}', 'a first key is fetched');
ok( $node->poll_query_until(
		'postgres',
		"SELECT state = 'idle' OR wait_event = '"
		  . wait_event_of($node, 'projcache worker')
		  . "' FROM pg_stat_activity WHERE pid = $pid"),
	'the worker is idle');

my $offset = log_offset($node);
is($node->safe_psql('postgres', "SELECT pg_cancel_backend($pid)"),
	't', 'pg_cancel_backend() of the idle worker');
ok(worker_stays($node, $pid, 1), 'the worker keeps its pid for 1 s after the cancel');
unlike(log_since($node, $offset), qr/exited with exit code|terminated by signal/,
	'the log says nothing of the worker exiting');
is($node->safe_psql('postgres', "SELECT projcache.get('cold-2', '5s')"),
	'{"i": 2}', 'a cold key still gets fetched after the cancel');
is(stat_value($node, 'worker_pid'), $pid, 'stats.worker_pid is unchanged');

# Many cancels in a row, some landing while the worker fetches: a cancel
# that cuts a fetch short only makes it retry; none ends the worker.
$offset = log_offset($node);
my $reader = start_session($node, 'burst_reader',
	q{SELECT count(projcache.get('burst-' || i, '5s')) FROM generate_series(1, 150) AS i});
$node->safe_psql('postgres',
	"SELECT pg_cancel_backend($pid), pg_sleep(0.003) FROM generate_series(1, 150)");
my ($rc, $out, $err) = wait_session($reader);
is($rc, 0, 'the reader of 150 keys ran while the worker got 150 cancels')
  or diag($err);
is($out, "150\n", 'it read all 150 keys');
ok(worker_stays($node, $pid, 0.5), 'the worker survived the burst of cancels');
unlike(log_since($node, $offset), $crash, 'and the log shows no exit or crash');

# ---------------------------------------------------------------------------
# b. Cancel during a fetch, with a long fetch_timeout.
# ---------------------------------------------------------------------------
$node->safe_psql('postgres', "ALTER SYSTEM SET projcache.fetch_timeout = '60s'");
reload_and_wait($node);

is($node->safe_psql('postgres', "SELECT projcache.get('kc', '5s')"),
	'{"v": 1}', 'kc is cached with its first value');
$node->safe_psql('postgres',
	"UPDATE public.upstream SET revision = 'r2', config = '{\"v\": 2}' WHERE key = 'kc'");

my $gate = $node->background_psql('postgres');
$gate->query_safe('BEGIN');
$gate->query_safe('LOCK TABLE public.gate IN ACCESS EXCLUSIVE MODE');

my $errors_before = stat_value($node, 'fetch_errors');
$offset = log_offset($node);
is($node->safe_psql('postgres', "SELECT projcache.invalidate('kc')"),
	't', 'kc invalidated while the gate is held');
ok( $node->poll_query_until(
		'postgres',
		"SELECT wait_event_type = 'Lock' FROM pg_stat_activity WHERE pid = $pid"),
	'the worker waits in the fetch function, on the gate');
is( $node->safe_psql(
		'postgres', "SELECT fetch_state FROM projcache.entries WHERE key = 'kc'"),
	'in_progress',
	'kc\'s fetch is in progress');

is($node->safe_psql('postgres', "SELECT pg_cancel_backend($pid)"),
	't', 'pg_cancel_backend() of the worker inside the fetch');
ok( $node->poll_query_until(
		'postgres',
		"SELECT last_error IS NOT NULL FROM projcache.entries WHERE key = 'kc'"),
	'kc records an error');
my $last_error = $node->safe_psql('postgres',
	"SELECT last_error FROM projcache.entries WHERE key = 'kc'");
is($last_error, 'canceling statement due to user request',
	'last_error is the cancel');
unlike($last_error, qr/fetch_timeout/, 'not a fetch_timeout message');
is( $node->safe_psql(
		'postgres', "SELECT projcache.get('kc'), state FROM projcache.lookup('kc')"),
	'{"v": 1}|enabled',
	'the old value still serves');
cmp_ok(stat_value($node, 'fetch_errors'), '>', $errors_before,
	'stats.fetch_errors counts the cancelled fetch');
like(
	log_since($node, $offset),
	qr/WARNING:  fetch function failed for 1 key\n.*DETAIL:  canceling statement due to user request/,
	'the worker logs the cancelled fetch as a WARNING');
ok( $node->poll_query_until(
		'postgres',
		"SELECT wait_event_type = 'Lock' FROM pg_stat_activity WHERE pid = $pid"),
	'the same worker retries and waits on the gate again');
is(worker_pid($node), $pid, 'the worker kept its pid');

$gate->query_safe('COMMIT');
ok( $node->poll_query_until(
		'postgres',
		"SELECT revision = 'r2' AND last_error IS NULL FROM projcache.entries WHERE key = 'kc'"
	),
	'once the gate opens, the retry fetches the new value and clears last_error');
is($node->safe_psql('postgres', "SELECT projcache.get('kc')"),
	'{"v": 2}', 'the new value serves');

# ---------------------------------------------------------------------------
# b. A real timeout.
# ---------------------------------------------------------------------------
$node->safe_psql('postgres', "ALTER SYSTEM SET projcache.fetch_timeout = '300ms'");
reload_and_wait($node);
$node->safe_psql('postgres',
	"UPDATE public.upstream SET revision = 'r3', config = '{\"v\": 3}' WHERE key = 'kc'");
$gate->query_safe('BEGIN');
$gate->query_safe('LOCK TABLE public.gate IN ACCESS EXCLUSIVE MODE');
$offset = log_offset($node);
is($node->safe_psql('postgres', "SELECT projcache.invalidate('kc')"),
	't', 'kc invalidated again, gate held');
ok( $node->poll_query_until(
		'postgres',
		"SELECT last_error IS NOT NULL FROM projcache.entries WHERE key = 'kc'"),
	'kc records an error');
is( $node->safe_psql(
		'postgres', "SELECT last_error FROM projcache.entries WHERE key = 'kc'"),
	'fetch function ran longer than projcache.fetch_timeout (300 ms)',
	'a real timeout is reported as one');
is($node->safe_psql('postgres', "SELECT projcache.get('kc')"),
	'{"v": 2}', 'the old value still serves');
is(worker_pid($node), $pid, 'the worker kept its pid');
$gate->query_safe('COMMIT');
$gate->quit;
ok( $node->poll_query_until(
		'postgres',
		"SELECT revision = 'r3' AND last_error IS NULL FROM projcache.entries WHERE key = 'kc'"
	),
	'once the gate opens, a retry fetches the new value');
unlike(slurp_file($node->logfile), $crash, 'the log shows no exit or crash');
$node->stop;

# ---------------------------------------------------------------------------
# c. projcache.max_memory = 1MB.
# ---------------------------------------------------------------------------
my $mem = projcache_node(
	'memory',
	conf => "projcache.max_memory = '1MB'\n"
	  . "projcache.max_retry_backoff = '1s'\n");
create_local_upstream($mem);
set_fetch_function($mem, 'public.fetch');
my $mpid = wait_for_worker($mem);

# Configs of about 20 kB each (random text, so not compressible).
$mem->safe_psql(
	'postgres', q{
INSERT INTO public.upstream (key, revision, config)
SELECT 'big-' || i, 'r1',
       jsonb_build_object('i', i, 'pad',
           (SELECT string_agg(md5(random()::text), '') FROM generate_series(1, 610)))
FROM generate_series(1, 100) AS i;
});
my $big_bytes = $mem->safe_psql('postgres',
	"SELECT pg_column_size(config::text::jsonb) FROM public.upstream WHERE key = 'big-1'");
my $limit = stat_value($mem, 'memory_limit');
is($limit, 1024 * 1024, 'stats.memory_limit is projcache.max_memory (1MB)');

# Five small hot keys, read between every step below: the eviction keeps them.
$mem->safe_psql(
	'postgres', q{
INSERT INTO public.upstream (key, revision, config)
SELECT 'hot-' || i, 'r1', jsonb_build_object('hot', i) FROM generate_series(1, 5) AS i;
CREATE FUNCTION public.read_hot() RETURNS int LANGUAGE sql AS $$
	SELECT count(*)::int FROM generate_series(1, 5) AS i
	 WHERE projcache.get('hot-' || i, '10s') IS NOT NULL $$;
});
is($mem->safe_psql('postgres', 'SELECT public.read_hot()'), '5',
	'the five hot keys are cached');

# Fetch the 100 big keys (about twice projcache.max_memory) one at a time,
# reading the hot keys in between: every one is fetched and served, since
# the worker evicts the least useful keys to make room; memory_used never
# exceeds memory_limit (sampled after every key).
my ($served, $max_used, $hot_misses) = split /\|/, $mem->safe_psql(
	'postgres', q{
CREATE TEMP TABLE fit_result (served int, max_used bigint, hot_misses int);
DO $$
DECLARE
	served int := 0;
	max_used bigint := 0;
	hot_misses int := 0;
	st text;
BEGIN
	FOR i IN 1..100 LOOP
		SELECT l.state INTO st FROM projcache.lookup('big-' || i, '10s') AS l;
		IF st = 'enabled' THEN
			served := served + 1;
		END IF;
		hot_misses := hot_misses + 5 - public.read_hot();
		max_used := greatest(max_used, (SELECT memory_used FROM projcache.stats));
	END LOOP;
	INSERT INTO fit_result VALUES (served, max_used, hot_misses);
END
$$;
SELECT served || '|' || max_used || '|' || hot_misses FROM fit_result;
});
is($served, 100, 'all 100 big keys were fetched and served, twice max_memory in all');
cmp_ok($max_used, '<=', $limit,
	"memory_used stayed within memory_limit (at most $max_used of $limit)");
is($hot_misses, 0, 'the hot keys, read after every big key, were never missing');
my $big_cached = $mem->safe_psql('postgres',
	"SELECT count(*) FROM projcache.entries WHERE key LIKE 'big-%'");
cmp_ok($big_cached, '<', 100, "older big keys were evicted ($big_cached still cached)");
is($mem->safe_psql('postgres', "SELECT count(*) FROM projcache.entries WHERE key LIKE 'hot-%'"),
	'5', 'the hot keys are still cached');

# A flood of 100,000 new keys (unknown upstream: cached as disabled),
# hot keys read every 1,000: no read fails, memory_used stays within the
# limit, the hot keys keep being served.
my $flood = $mem->safe_psql(
	'postgres', q{
CREATE TEMP TABLE flood_result (errors int, max_used bigint, hot_misses int);
DO $$
DECLARE
	errors int := 0;
	max_used bigint := 0;
	hot_misses int := 0;
BEGIN
	FOR n IN 1..100000 LOOP
		BEGIN
			PERFORM projcache.get('fill-' || n);
		EXCEPTION WHEN others THEN
			errors := errors + 1;
		END;
		IF n % 1000 = 0 THEN
			hot_misses := hot_misses + 5 - public.read_hot();
			max_used := greatest(max_used, (SELECT memory_used FROM projcache.stats));
		END IF;
	END LOOP;
	INSERT INTO flood_result VALUES (errors, max_used, hot_misses);
END
$$;
SELECT errors || '|' || max_used || '|' || hot_misses FROM flood_result;
});
my ($flood_errors, $flood_used, $flood_hot) = split /\|/, $flood;
is($flood_errors, 0, 'none of 100,000 reads of new keys failed');
cmp_ok($flood_used, '<=', $limit,
	"memory_used stayed within memory_limit during the flood (at most $flood_used)");
is($flood_hot, 0, 'the hot keys kept being served during the flood');

# A new key read while memory is short reads as pending, never as an ERROR;
# with a wait, it is fetched once the worker has made room.
($rc, $out, $err) = psql_verbose($mem,
	"SELECT state FROM projcache.lookup('after-flood', '10s')");
is($out, 'disabled', 'a new key after the flood is created and fetched');
unlike($err, qr/ERROR/, 'without an ERROR');

# A value larger than an eighth of max_memory is refused and recorded; it
# does not evict the cache for itself, the key's old value keeps serving,
# and the other keys keep serving.
$mem->safe_psql(
	'postgres', q{
INSERT INTO public.upstream (key, revision, config)
VALUES ('huge', 'r1', '{"small": true}');
});
is($mem->safe_psql('postgres', "SELECT state FROM projcache.lookup('huge', '10s')"),
	'enabled', 'the key that will grow is cached while small');
$mem->safe_psql(
	'postgres', q{
UPDATE public.upstream SET revision = 'r2', config = jsonb_build_object('pad',
	(SELECT string_agg(md5(random()::text), '') FROM generate_series(1, 5000)))
 WHERE key = 'huge';
SELECT projcache.invalidate('huge');
});
ok( $mem->poll_query_until(
		'postgres',
		"SELECT last_error LIKE 'value of % bytes is larger than an eighth of projcache.max_memory (% bytes)' FROM projcache.entries WHERE key = 'huge'"),
	'a value larger than an eighth of projcache.max_memory is refused, and says why');
is( $mem->safe_psql('postgres', "SELECT revision, config->>'small' FROM projcache.lookup('huge')"),
	'r1|true', 'the old value keeps serving');
cmp_ok(stat_value($mem, 'memory_used'), '<=', $limit, 'memory_used is within memory_limit');
is($mem->safe_psql('postgres', 'SELECT public.read_hot()'), '5',
	'the hot keys still serve');

# evict() still removes what it is asked to.
is( $mem->safe_psql(
		'postgres',
		"SELECT bool_and(projcache.evict('hot-' || i)) FROM generate_series(1, 5) AS i"),
	't',
	'the hot keys can be evicted by hand');
is($mem->safe_psql('postgres', "SELECT count(*) FROM projcache.entries WHERE key LIKE 'hot-%'"),
	'0', 'and are gone');

is(worker_pid($mem), $mpid, 'the worker kept its pid');
unlike(slurp_file($mem->logfile), $crash,
	'the server log shows no PANIC, TRAP, crash or worker exit');

$mem->stop;
done_testing();
