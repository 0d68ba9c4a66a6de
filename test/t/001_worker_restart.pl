# Copyright (c) 2026, projcache developers
#
# Acceptance criterion: killing the scheduler worker with SIGTERM while keys
# are cached leaves every cached value readable; the restarted worker
# rebuilds its private state from the shared map and evicts and refreshes
# the keys on schedule.

use strict;
use warnings;

use FindBin;
use lib $FindBin::RealBin;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use ProjcacheTest;
use Test::More;

my $node = projcache_node(
	'restart',
	conf => "projcache.expiry = '10s'\n"
	  . "projcache.grace_period = '10s'\n"
	  . "projcache.refresh_interval = '15s'\n");
create_local_upstream($node);
set_fetch_function($node, 'public.fetch');

my @keys = map { "proj-$_" } 1 .. 5;
my $keylist = join(', ', map { "'$_'" } @keys);
my $proj_keys = "key IN ($keylist)";

$node->safe_psql(
	'postgres', q{
INSERT INTO public.upstream (key, revision, config)
SELECT 'proj-' || i, 'r1', jsonb_build_object('id', i, 'v', 1)
FROM generate_series(1, 5) AS i;
INSERT INTO public.upstream (key, revision, config)
VALUES ('late-1', 'r1', '{"late": true}');
});

# What every key should read, as one line per key.
sub read_all
{
	my ($wait) = @_;
	my $w = defined $wait ? ", '$wait'" : '';
	return $node->safe_psql('postgres',
		"SELECT string_agg(k || '=' || coalesce(projcache.get(k$w)::text, 'NULL'), E'\\n' ORDER BY k)"
		  . " FROM unnest(ARRAY[$keylist]) AS k");
}

my $expected_v1 = join("\n",
	map { "proj-$_=" . qq({"v": 1, "id": $_}) } 1 .. 5);

# ---------------------------------------------------------------------------
# Cache the keys.
# ---------------------------------------------------------------------------
is(read_all('5s'), $expected_v1, 'cold keys are fetched and read');
is( $node->safe_psql(
		'postgres',
		"SELECT count(*) FROM projcache.entries WHERE $proj_keys"
		  . " AND state = 'enabled' AND fetch_state = 'complete' AND revision = 'r1'"
	),
	'5',
	'all five keys are cached, enabled and complete');

# The schedule, exactly: age + expires_in and age + refresh_in are computed
# on one clock reading, so they are the configured intervals.
my $schedule_query =
  "SELECT count(*) FILTER (WHERE age + expires_in = interval '20s'), "
  . "count(*) FILTER (WHERE age + refresh_in = interval '15s') "
  . "FROM projcache.entries WHERE $proj_keys";
is($node->safe_psql('postgres', $schedule_query),
	'5|5', 'eviction is due at expiry + grace, refresh at refresh_interval');

my $fetched_at_before = $node->safe_psql('postgres',
	"SELECT string_agg(format('(%L, %L)', key, fetched_at), ', ') FROM projcache.entries WHERE $proj_keys"
);
my $calls_before_kill = calls_count($node);

# ---------------------------------------------------------------------------
# SIGTERM the worker.
# ---------------------------------------------------------------------------
my $old_pid = worker_pid($node);
like($old_pid, qr/^\d+$/, 'the scheduler worker runs');
is(stat_value($node, 'worker_pid'),
	$old_pid, 'projcache.stats knows the worker pid');

my $log_offset = log_offset($node);
ok(kill('TERM', $old_pid), 'sent SIGTERM to the scheduler worker');
ok(wait_for_worker_exit($node), 'the scheduler worker exited');

# The worker is restarted after bgw_restart_time (2 s): read everything now,
# and check in the same statement that no worker ran meanwhile.
my $while_down = $node->safe_psql(
	'postgres', qq{
SELECT (SELECT worker_pid IS NULL FROM projcache.stats)
	   AND NOT EXISTS (SELECT FROM pg_stat_activity
	                   WHERE backend_type = 'projcache scheduler'),
	   string_agg(k || '=' || coalesce(projcache.get(k)::text, 'NULL'), ',' ORDER BY k)
FROM unnest(ARRAY[$keylist]) AS k});
my ($down, $values_down) = split /\|/, $while_down, 2;
is($down, 't', 'the values below were read while no worker ran');
is($values_down, join(',', split /\n/, $expected_v1),
	'every cached value is readable while the worker is down');

# A key first asked for while no worker runs: its request must survive.
is($node->safe_psql('postgres', "SELECT projcache.get('late-1') IS NULL"),
	't', 'a cold key read while the worker is down is pending');
is( $node->safe_psql(
		'postgres', "SELECT state FROM projcache.entries WHERE key = 'late-1'"),
	'pending',
	'the cold key is in the map, pending');

my $new_pid = wait_for_worker($node, $old_pid);
like($new_pid, qr/^\d+$/, 'the scheduler worker was restarted');
isnt($new_pid, $old_pid, 'the restarted worker is a new process');

ok( $node->poll_query_until(
		'postgres', "SELECT worker_pid = $new_pid FROM projcache.stats"),
	'projcache.stats shows the new worker pid');

my $log = log_since($node, $log_offset);
like(
	$log,
	qr/terminating background worker "projcache scheduler" due to administrator command/,
	'the log shows the worker was terminated');
$node->wait_for_log(qr/scheduler rebuilt the state of 6 cached keys/,
	$log_offset);
pass('the log says the restarted worker rebuilt the state of 6 cached keys');

is(read_all(), $expected_v1, 'every value reads the same after the restart');
is($node->safe_psql('postgres', "SELECT projcache.get('late-1', '5s')"),
	'{"late": true}', 'the request left while the worker was down is served');
is($node->safe_psql('postgres', $schedule_query),
	'5|5', 'the rebuilt schedule is the one before the restart');
# fetched_at is shown in wall-clock time, derived from the monotonic clock at
# display time: allow for the microseconds between the two clock readings.
is( $node->safe_psql(
		'postgres', qq{
SELECT count(*) FROM projcache.entries AS e
JOIN (VALUES $fetched_at_before) AS b(key, fetched_at) USING (key)
WHERE abs(extract(epoch FROM e.fetched_at - b.fetched_at::timestamptz)) < 0.05}),
	'5',
	'fetched_at of every key survived the restart');
is( $node->safe_psql(
		'postgres',
		"SELECT count(*) FROM projcache.entries WHERE $proj_keys AND fetch_state = 'complete' AND freshness = 'fresh'"
	),
	'5',
	'the keys are complete and fresh after the restart');
is(calls_count($node), $calls_before_kill + 1,
	'no fresh key was fetched again by the restart (only the cold one)');

# ---------------------------------------------------------------------------
# The restarted worker refreshes on schedule.
# ---------------------------------------------------------------------------
$node->safe_psql('postgres',
	"UPDATE public.upstream SET revision = 'r2', config = config || '{\"v\": 2}' WHERE key LIKE 'proj-%'"
);
my $refreshes_before = stat_value($node, 'refreshes');
my $calls_before = calls_count($node);
my $max_call_id =
  $node->safe_psql('postgres', 'SELECT coalesce(max(id), 0) FROM public.calls');

# Step just past the latest refresh time, well before the earliest eviction.
my ($to_refresh, $gap) = split /\|/, $node->safe_psql(
	'postgres', qq{
SELECT max(refresh_in) + interval '500ms', min(expires_in) - max(refresh_in)
FROM projcache.entries WHERE $proj_keys});
cmp_ok(
	$node->safe_psql('postgres', "SELECT interval '$gap' > interval '2s'"),
	'eq', 't', "refresh is due well before eviction (gap $gap)");
advance_clock($node, $to_refresh);

# Poll the entries view only: a get() of a stale key would ask for a fetch
# of its own and hide whether the refresh timer fired.
ok( $node->poll_query_until(
		'postgres',
		"SELECT count(*) = 5 FROM projcache.entries WHERE $proj_keys AND revision = 'r2'"
	),
	'the restarted worker refreshed every key with the upstream change');
cmp_ok(stat_value($node, 'refreshes'),
	'>=', $refreshes_before + 5, 'stats.refreshes counts the five refreshes');
cmp_ok(calls_count($node), '>', $calls_before,
	'the fetch function was called for the refresh');
is( $node->safe_psql(
		'postgres',
		"SELECT bool_and(keys && ARRAY[$keylist]) FROM public.calls WHERE id > $max_call_id"
	),
	't',
	'the new calls of the fetch function asked for the cached keys');

my $expected_v2 = join("\n",
	map { "proj-$_=" . qq({"v": 2, "id": $_}) } 1 .. 5);
is(read_all(), $expected_v2, 'get() returns the refreshed values');

# A refresh does not push the eviction (a rule of the key cache): the keys still leave at
# their first fetch + expiry + grace, and the next refresh is scheduled.
is( $node->safe_psql(
		'postgres',
		"SELECT count(*) FROM projcache.entries WHERE $proj_keys"
		  . " AND age + expires_in < interval '10s'"
		  . " AND age + refresh_in = interval '15s'"
		  . " AND freshness = 'fresh'"),
	'5',
	'after the refresh: fresh, eviction not pushed back, next refresh scheduled'
);

# ---------------------------------------------------------------------------
# The restarted worker evicts on schedule, without any read.
# ---------------------------------------------------------------------------
my $evictions_before = stat_value($node, 'evictions');
$calls_before = calls_count($node);
$max_call_id =
  $node->safe_psql('postgres', 'SELECT coalesce(max(id), 0) FROM public.calls');
my $to_evict = $node->safe_psql('postgres',
	"SELECT max(expires_in) + interval '500ms' FROM projcache.entries WHERE $proj_keys"
);
advance_clock($node, $to_evict);

ok( $node->poll_query_until(
		'postgres',
		"SELECT count(*) = 0 FROM projcache.entries WHERE $proj_keys"),
	'the restarted worker evicted every key at its eviction time');
cmp_ok(stat_value($node, 'evictions'),
	'>=', $evictions_before + 5, 'stats.evictions counts the evictions');
# ('late-1', cached later, may have been refreshed meanwhile: not counted.)
is( $node->safe_psql(
		'postgres',
		"SELECT count(*) FROM public.calls WHERE id > $max_call_id AND keys && ARRAY[$keylist]"
	),
	'0',
	'no evicted key was fetched to evict it');

# Evicted keys are cold again: the next read fetches the current value.
is(read_all('5s'), $expected_v2, 'evicted keys are fetched again on read');
cmp_ok(calls_count($node), '>', $calls_before,
	'reading evicted keys called the fetch function');
is($node->safe_psql('postgres', 'SELECT worker_pid FROM projcache.stats'),
	$new_pid, 'the same restarted worker did all of this');

# ---------------------------------------------------------------------------
# SIGTERM in the middle of a fetch, with a reader waiting for that fetch:
# the restarted worker fetches the key again and the reader gets it.
# ---------------------------------------------------------------------------
$node->safe_psql('postgres',
	q{INSERT INTO public.upstream (key, revision, config) VALUES ('mid', 'r1', '{"mid": 1}')}
);
my $gate = $node->background_psql('postgres');
$gate->query_safe('BEGIN');
$gate->query_safe('LOCK TABLE public.gate IN ACCESS EXCLUSIVE MODE');

my $waiter = $node->background_psql('postgres');
my $waiter_pid = $waiter->query_safe('SELECT pg_backend_pid()');
$waiter->query_until(qr/waiting/,
	"\\echo waiting\nSELECT projcache.get('mid', '25s');\n\\echo done\n");
ok( $node->poll_query_until(
		'postgres', q{
SELECT wait_event_type = 'Lock'
FROM pg_stat_activity WHERE backend_type = 'projcache scheduler'}),
	'the worker is inside the fetch function for key mid');
ok( $node->poll_query_until(
		'postgres',
		"SELECT wait_event_type = 'Extension' AND wait_event = '"
		  . wait_event_of($node, 'projcache key')
		  . "' FROM pg_stat_activity WHERE pid = $waiter_pid"),
	'a reader waits for key mid');

$log_offset = log_offset($node);
ok(kill('TERM', $new_pid), 'sent SIGTERM to the worker in the middle of a fetch');
ok(wait_for_worker_exit($node), 'the worker exited from inside the fetch');
# Only now let the fetch function through: the killed worker cannot have
# completed the fetch.
$gate->query_safe('COMMIT');
$gate->quit;
is( $node->safe_psql(
		'postgres', "SELECT state, fetch_state FROM projcache.entries WHERE key = 'mid'"
	),
	'pending|in_progress',
	'key mid is left pending, its fetch cut short');

my $third_pid = wait_for_worker($node, $new_pid);
like($third_pid, qr/^\d+$/, 'the worker was restarted again');
$node->wait_for_log(qr/scheduler rebuilt the state of \d+ cached keys?/,
	$log_offset);
like($waiter->query_until(qr/done/, ''),
	qr/^\{"mid": 1\}$/m,
	'the waiting reader got the value fetched by the restarted worker');
$waiter->quit;
is( $node->safe_psql(
		'postgres', "SELECT state, fetch_state FROM projcache.entries WHERE key = 'mid'"
	),
	'enabled|complete',
	'key mid is cached');

$node->stop;
done_testing();
