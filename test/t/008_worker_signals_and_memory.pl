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
# c. With projcache.max_memory at its minimum (1MB): values that do not fit
#    are refused (last_error names projcache.max_memory, the key stays
#    pending) while the cached ones keep serving; new keys are created
#    until the key map is full, then projcache.get() of a new key fails
#    cleanly with SQLSTATE 53200; evicting keys gives the memory back.

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
		"SELECT state = 'idle' OR wait_event = 'Extension' FROM pg_stat_activity WHERE pid = $pid"
	),
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

# Fetch the big keys one at a time until one is refused.
my ($fitted, $refused) = split /\|/, $mem->safe_psql(
	'postgres', q{
CREATE TEMP TABLE fit_result (fitted int, refused text);
DO $$
DECLARE
	n int := 0;
	st text;
BEGIN
	FOR i IN 1..100 LOOP
		SELECT l.state INTO st FROM projcache.lookup('big-' || i, '500ms') AS l;
		IF st <> 'enabled' THEN
			INSERT INTO fit_result VALUES (n, 'big-' || i);
			RETURN;
		END IF;
		n := n + 1;
	END LOOP;
	INSERT INTO fit_result VALUES (n, NULL);
END
$$;
SELECT fitted || '|' || coalesce(refused, '') FROM fit_result;
}), 2;
ok($refused, "values are refused once memory is used up ($fitted fitted)");
$refused ||= 'big-100';
my $used_values = stat_value($mem, 'memory_used');
ok( poll_briefly(
		$mem,
		"SELECT last_error IS NOT NULL FROM projcache.entries WHERE key = '$refused'",
		3),
	'the refused key records an error');
like(
	$mem->safe_psql(
		'postgres', "SELECT last_error FROM projcache.entries WHERE key = '$refused'"),
	qr/^projcache\.max_memory is used up: could not store a value of \d+ bytes$/,
	'its last_error says projcache.max_memory is used up');
is( $mem->safe_psql(
		'postgres', "SELECT state, config IS NULL FROM projcache.lookup('$refused')"),
	'pending|t',
	'it stays pending, with no value');
is( $mem->safe_psql(
		'postgres',
		"SELECT count(*) FROM generate_series(1, $fitted) AS i JOIN public.upstream AS u "
		  . "ON u.key = 'big-' || i WHERE projcache.get('big-' || i) = u.config"),
	$fitted,
	'every earlier key still serves its value');

# New keys (unknown upstream: cached as disabled) until the map is full.
my $fill = $mem->safe_psql(
	'postgres', q{
CREATE TEMP TABLE fill_result (n int, sqlstate text, message text);
DO $$
DECLARE
	n int := 0;
	st text;
	msg text;
BEGIN
	LOOP
		BEGIN
			PERFORM projcache.get('fill-' || n);
		EXCEPTION WHEN others THEN
			GET STACKED DIAGNOSTICS st = RETURNED_SQLSTATE, msg = MESSAGE_TEXT;
			EXIT;
		END;
		n := n + 1;
		EXIT WHEN n >= 100000;
	END LOOP;
	INSERT INTO fill_result VALUES (n, st, msg);
END
$$;
SELECT n || '|' || coalesce(sqlstate, '') || '|' || coalesce(message, '') FROM fill_result;
});
my ($nfill, $fill_state, $fill_msg) = split /\|/, $fill, 3;
cmp_ok($nfill, '>', 0, "new keys were created while memory lasted ($nfill)");
is($fill_state, '53200', 'then creating a key fails with SQLSTATE 53200');
is($fill_msg, 'projcache shared memory is full',
	'"projcache shared memory is full"');

# The key that failed, again and again: a clean refusal, nothing leaks.
my $used_before = stat_value($mem, 'memory_used');
my $clean = 0;
foreach (1 .. 5)
{
	($rc, $out, $err) = psql_verbose($mem, "SELECT projcache.get('fill-$nfill')");
	$clean++ if $err =~ /ERROR:  53200: projcache shared memory is full\n/;
}
is($clean, 5, "the key that did not fit (fill-$nfill), read 5 more times: the same clean ERROR")
  or diag($err);
is(stat_value($mem, 'memory_used'), $used_before,
	'and stats.memory_used did not move (no leak from the failed attempts)');

($rc, $out, $err) = psql_verbose($mem, "SELECT projcache.get('one-more')");
like($err, qr/ERROR:  53200: projcache shared memory is full\n/,
	'a new key in a new session: the same clean ERROR');
like($err, qr/DETAIL:  projcache\.max_memory \(1024 kB\) is used up/,
	'with a DETAIL naming projcache.max_memory');
($rc, $out, $err) = psql_verbose($mem,
	"SELECT * FROM projcache.lookup('one-more-lookup')");
like($err, qr/ERROR:  53200: projcache shared memory is full\n/,
	'lookup() of a new key fails the same way');

is( $mem->safe_psql(
		'postgres',
		"SELECT projcache.get('big-1') = config FROM public.upstream WHERE key = 'big-1'"
	),
	't',
	'a cached value still serves while memory is full');
is($mem->safe_psql('postgres', "SELECT state FROM projcache.lookup('$refused')"),
	'pending', 'the refused key is still pending');
# Small keys fetched while memory lasted are disabled; any whose answer
# did not fit either is pending and says why.
is( $mem->safe_psql(
		'postgres', q{
SELECT count(*) FROM projcache.entries
WHERE key LIKE 'fill-%'
  AND NOT (state = 'disabled'
           OR (state = 'pending' AND last_error LIKE '%projcache.max_memory%'))}),
	'0',
	'every small key is disabled, or pending with a last_error naming projcache.max_memory'
);

my $entries_full = stat_value($mem, 'entries');
my $used_full = stat_value($mem, 'memory_used');
my $msg =
	"max_memory 1MB: memory_limit $limit bytes; values of $big_bytes bytes: "
  . "$fitted fitted (memory_used $used_values), then $nfill small keys; "
  . "full at $entries_full entries, memory_used $used_full";
note($msg);
diag($msg);
cmp_ok($used_full, '<=', $limit, 'memory_used stays within memory_limit');

is(worker_pid($mem), $mpid, 'the worker kept its pid');
unlike(slurp_file($mem->logfile), $crash,
	'the server log shows no PANIC, TRAP, crash or worker exit');

# Evict five big keys: the memory comes back and new keys work again.
is( $mem->safe_psql(
		'postgres',
		"SELECT bool_and(projcache.evict('big-' || i)) FROM generate_series(1, 5) AS i"),
	't',
	'five big keys evicted');
my $used_evicted = stat_value($mem, 'memory_used');
cmp_ok($used_evicted, '<', $used_full - 2 * $big_bytes,
	"stats.memory_used goes down ($used_full -> $used_evicted)");
note("after evicting 5 big keys: memory_used $used_evicted");
is($mem->safe_psql('postgres', "SELECT projcache.get('after-evict') IS NULL"),
	't', 'a new key can be created again');
is($mem->safe_psql('postgres', "SELECT state FROM projcache.lookup('after-evict', '2s')"),
	'disabled', 'and it is fetched');
ok( poll_briefly(
		$mem, "SELECT state = 'enabled' FROM projcache.lookup('$refused')", 5),
	'the refused key gets its value at a retry');
is( $mem->safe_psql(
		'postgres',
		"SELECT projcache.get('$refused') = config FROM public.upstream WHERE key = '$refused'"
	),
	't',
	'and serves it');
is( $mem->safe_psql(
		'postgres',
		"SELECT last_error IS NULL FROM projcache.entries WHERE key = '$refused'"),
	't',
	'its last_error is cleared');
is(worker_pid($mem), $mpid, 'the worker still has its pid');
unlike(slurp_file($mem->logfile), $crash, 'the log shows no crash');

$mem->stop;
done_testing();
