# Copyright (c) 2026, projcache developers
#
# A crash (SIGKILL of a regular backend, then of the scheduler worker in the
# middle of a fetch) makes the postmaster reinitialize shared memory.  After
# recovery the server is up, the worker is back, the extension and its
# settings are intact, and the cache is empty but works: cold keys are
# fetched again.  No session and no step hangs.

use strict;
use warnings;

use FindBin;
use lib $FindBin::RealBin;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use ProjcacheTest;
use Test::More;

my $node = projcache_node('crash',
	conf => "restart_after_crash = on\nprojcache.expiry = '60s'\n");
create_local_upstream($node);
set_fetch_function($node, 'public.fetch');

$node->safe_psql(
	'postgres', q{
INSERT INTO public.upstream (key, revision, config) VALUES
	('a', 'r1', '{"a": 1}'),
	('b', 'r1', '{"b": 1}'),
	('slow', 'r1', '{"slow": 1}');
});

is($node->safe_psql('postgres', "SELECT projcache.get('a', '5s')"),
	'{"a": 1}', 'key a is cached before the crash');
is($node->safe_psql('postgres', "SELECT projcache.get('b', '5s')"),
	'{"b": 1}', 'key b is cached before the crash');
is($node->safe_psql('postgres', 'SELECT entries FROM projcache.stats'),
	'2', 'two entries before the crash');
# Wait for the crash restart to finish, then check everything.  Returns the
# new worker pid.
sub check_after_crash
{
	my ($what, $log_offset, $old_worker) = @_;

	$node->wait_for_log(qr/all server processes terminated; reinitializing/,
		$log_offset);
	pass("$what: the postmaster reinitialized shared memory");
	ok($node->poll_query_until('postgres', 'SELECT 1', '1'),
		"$what: the server accepts connections again");
	is($node->safe_psql('postgres', 'SELECT pg_is_in_recovery()'),
		'f', "$what: crash recovery is over");

	my $pid = wait_for_worker($node, $old_worker);
	like($pid, qr/^\d+$/, "$what: the scheduler worker is back");
	isnt($pid, $old_worker, "$what: it is a new worker process");

	is( $node->safe_psql(
			'postgres',
			"SELECT extversion = default_version FROM pg_extension, pg_available_extensions WHERE extname = 'projcache' AND name = extname"),
		't',
		"$what: the extension is still installed");
	is($node->safe_psql('postgres', 'SHOW projcache.fetch_function'),
		'public.fetch', "$what: the fetch function setting survived");

	# Fresh shared memory: an empty map, zeroed counters.
	is( $node->safe_psql(
			'postgres',
			'SELECT entries, fetch_calls, hits, misses FROM projcache.stats'),
		'0|0|0|0',
		"$what: the cache is empty and its counters start from zero");
	is($node->safe_psql('postgres', 'SELECT count(*) FROM projcache.entries'),
		'0', "$what: projcache.entries is empty");
	is($node->safe_psql('postgres', "SELECT projcache.invalidate('a')"),
		'f', "$what: key a is no longer cached");

	# The cache works: a cold read fetches again.
	my $calls = calls_count($node);
	is($node->safe_psql('postgres', "SELECT projcache.get('a', '5s')"),
		'{"a": 1}', "$what: a cold read of key a fetches it again");
	is(calls_count($node), $calls + 1,
		"$what: the fetch function was called for it");
	is( $node->safe_psql(
			'postgres',
			"SELECT state, freshness, fetch_state FROM projcache.entries WHERE key = 'a'"
		),
		'enabled|fresh|complete',
		"$what: key a is cached again");
	is( $node->safe_psql(
			'postgres', 'SELECT misses, fetch_calls FROM projcache.stats'),
		'1|1',
		"$what: stats count the one miss and the one call");
	return $pid;
}

# ---------------------------------------------------------------------------
# 1. SIGKILL of a regular backend.
# ---------------------------------------------------------------------------
my $worker1 = worker_pid($node);
like($worker1, qr/^\d+$/, 'the scheduler worker runs');

# The victim reads the cache (so it is attached to the shared map), then
# sleeps.  Reads are added to the shared counters every 256 reads (or at
# the end of the transaction, which never comes): read 256 times.
my $hits = stat_value($node, 'hits');
my $victim = start_session($node, 'victim',
	"SELECT (SELECT count(projcache.get('a')) FROM generate_series(1, 256)), pg_sleep(60)");
ok( $node->poll_query_until(
		'postgres',
		"SELECT wait_event = 'PgSleep' FROM pg_stat_activity WHERE application_name = 'victim'"
	),
	'the victim backend sleeps');
cmp_ok(stat_value($node, 'hits'), '>', $hits,
	'the victim backend has read the cache first');
my $victim_pid = $node->safe_psql('postgres',
	"SELECT pid FROM pg_stat_activity WHERE application_name = 'victim'");

my $log_offset = log_offset($node);
ok(kill('KILL', $victim_pid), 'sent SIGKILL to a regular backend');
my ($rc, $out, $err, $waited) = wait_session($victim);
isnt($rc, 0, 'the victim session ended with an error');

my $worker2 = check_after_crash('backend SIGKILL', $log_offset, $worker1);
like(
	log_since($node, $log_offset),
	# (15 calls it a server process, 18 a client backend)
	qr/(?:server process|client backend) \(PID $victim_pid\) was terminated by signal 9/,
	'the log shows the backend crash');

# ---------------------------------------------------------------------------
# 2. SIGKILL of the worker while it is inside the fetch function, with a
#    reader waiting for that fetch.
# ---------------------------------------------------------------------------
# The lock holder keeps public.gate locked, so the worker's next fetch
# blocks inside the fetch function.
my $gate = start_session($node, 'gate',
	'BEGIN; LOCK TABLE public.gate IN ACCESS EXCLUSIVE MODE; SELECT pg_sleep(60); COMMIT;'
);
ok( $node->poll_query_until(
		'postgres',
		"SELECT wait_event = 'PgSleep' FROM pg_stat_activity WHERE application_name = 'gate'"
	),
	'a session holds the lock the fetch function needs');

# Wait up to 60 s: the crash, not the timeout, must end this read.
my $waiter = start_session($node, 'waiter',
	"SELECT projcache.get('slow', '60s')");

ok( $node->poll_query_until(
		'postgres', qq{
SELECT wait_event_type = 'Lock'
FROM pg_stat_activity WHERE backend_type = 'projcache scheduler'}),
	'the worker is blocked inside the fetch function');
ok( $node->poll_query_until(
		'postgres', qq{
SELECT wait_event = '@{[ wait_event_of($node, 'projcache key') ]}'
FROM pg_stat_activity WHERE application_name = 'waiter'}),
	'a reader waits for the pending key');
is( $node->safe_psql(
		'postgres', "SELECT fetch_state FROM projcache.entries WHERE key = 'slow'"
	),
	'in_progress',
	'the key being fetched is in progress');

$log_offset = log_offset($node);
ok(kill('KILL', $worker2), 'sent SIGKILL to the scheduler worker mid-fetch');

($rc, $out, $err, $waited) = wait_session($waiter);
isnt($rc, 0, 'the waiting reader was ended by the crash');
cmp_ok($waited, '<', 20, "... promptly (${waited}s), not by its 60 s wait");
like($err, qr/server closed the connection|terminating connection/,
	'... with a lost connection');
($rc, $out, $err, $waited) = wait_session($gate);
isnt($rc, 0, 'the lock holder was ended by the crash');

check_after_crash('worker SIGKILL', $log_offset, $worker2);
like(
	log_since($node, $log_offset),
	qr/background worker "projcache scheduler" \(PID $worker2\) was terminated by signal 9/,
	'the log shows the worker crash');

# The key whose fetch was cut short by the crash is fetched anew.
is($node->safe_psql('postgres', "SELECT projcache.get('slow', '5s')"),
	'{"slow": 1}', 'the key whose fetch was interrupted is fetched after the crash');
is($node->safe_psql('postgres', "SELECT projcache.get('b', '5s')"),
	'{"b": 1}', 'key b is fetched again after the crash');

# TTLs keep working on the clock of the new shared memory.
advance_clock($node, '61s');
is( $node->safe_psql(
		'postgres', "SELECT freshness FROM projcache.lookup('a')"),
	'stale',
	'key a turns stale on the test clock after the crash');
is($node->safe_psql('postgres', "SELECT projcache.get('a')"),
	'{"a": 1}', 'the stale value keeps serving');

$node->stop;
done_testing();
