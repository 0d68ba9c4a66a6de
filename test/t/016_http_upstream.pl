# Copyright (c) 2026, projcache developers
#
# The HTTP upstream recipe: examples/fetch_http.sql (a plpython3u fetch
# function, run as a plain projcache.fetch_role) against the stand-in
# service test/fixtures/config_service.py.  Keys are cached from the
# service; the held revisions are sent, and a not_modified answer is
# counted.  Each way the service can fail (down, slower than
# projcache.fetch_timeout, HTTP 500, malformed JSON, an unknown state) is a
# counted fetch error with a clear last_error, while the old value keeps
# serving and the same worker lives on; the cache recovers once the service
# does.  Keys left out of an answer become disabled.  Cache-Control (the
# answer's header for the batch, or an entry's own) sets each key's
# max_age (s-maxage, else max-age) and stale_for (the larger of
# stale-while-revalidate and stale-if-error); without it the settings apply.

use strict;
use warnings;

use FindBin;
use lib $FindBin::RealBin;

use HTTP::Tiny;
use IPC::Run;
use JSON::PP;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use ProjcacheTest;
use Test::More;
use Time::HiRes qw(usleep);

my $fixture = "$FindBin::RealBin/../fixtures/config_service.py";
my $example = "$FindBin::RealBin/../../examples/fetch_http.sql";
my $port = PostgreSQL::Test::Cluster::get_free_port();
my $base = "http://127.0.0.1:$port";
my $url = "$base/v1/configs";

my $node = projcache_node(
	'http',
	conf => "projcache.max_retry_backoff = '1s'\n"
	  . "projcache_http.url = '$url'\n");

plan skip_all => 'plpython3u is not installed'
  unless $node->safe_psql('postgres',
	"SELECT count(*) FROM pg_available_extensions WHERE name = 'plpython3u'");

# ---------------------------------------------------------------------------
# The service, and how the test drives it.
# ---------------------------------------------------------------------------

# The environment's proxies are not for a service on 127.0.0.1.
my $http = HTTP::Tiny->new(
	proxy => undef,
	http_proxy => undef,
	https_proxy => undef,
	timeout => 10);

my $data_file = "$PostgreSQL::Test::Utils::tmp_check/config_service.json";
my $service_log = "$PostgreSQL::Test::Utils::log_path/config_service.log";
my $service;

append_to_file(
	$data_file, encode_json(
		{
			a => { revision => 'a1', config => { a => 1 } },
			b => { revision => 'b1', config => { b => 1 } },
			off => { state => 'disabled', revision => 'o1' },
		}));

# Start the service on $port and wait until it answers.
sub start_service
{
	$service = IPC::Run::start(
		[ 'python3', $fixture, '--port', $port, '--data', $data_file ],
		'<', \undef, '>>', $service_log, '2>&1');
	my $deadline = time + $PostgreSQL::Test::Utils::timeout_default;
	while (time < $deadline)
	{
		return 1 if $http->get("$base/health")->{success};
		usleep(100_000);
	}
	return 0;
}

# The service is down: the process is gone and nothing listens on $port.
sub stop_service
{
	$service->signal('TERM');
	$service->finish;
	undef $service;
	return;
}

END { $service->kill_kill if $service; }

sub admin
{
	my ($method, $path, $body) = @_;
	my $r = $http->request($method, "$base$path",
		defined $body
		? {
			headers => { 'Content-Type' => 'application/json' },
			content => encode_json($body)
		  }
		: {});
	die "$method $path: $r->{status} $r->{content}" unless $r->{success};
	return decode_json($r->{content});
}

sub set_mode { admin('PUT', '/admin/mode', {@_}); return; }

ok(start_service(), 'the config service answers');

# ---------------------------------------------------------------------------
# The recipe, as a DBA follows it.
# ---------------------------------------------------------------------------
$node->safe_psql(
	'postgres', q{
CREATE ROLE projcache_fetch NOLOGIN;
ALTER SYSTEM SET projcache.fetch_role = 'projcache_fetch';
});
$node->command_ok(
	[
		'psql', '-X', '-v', 'ON_ERROR_STOP=1',
		'-v', 'fetch_role=projcache_fetch',
		'-d', 'postgres', '-f', $example
	],
	'examples/fetch_http.sql loads');
set_fetch_function($node, 'public.projcache_fetch_http');
my $worker = wait_for_worker($node);
like($worker, qr/^\d+$/, 'the worker runs');

# ---------------------------------------------------------------------------
# Keys are cached from the service.
# ---------------------------------------------------------------------------
is($node->safe_psql('postgres', "SELECT projcache.get('a', '10s')"),
	'{"a": 1}', 'a cold key is fetched from the HTTP service');
is( $node->safe_psql(
		'postgres',
		"SELECT state, revision, last_error IS NULL FROM projcache.entries WHERE key = 'a'"
	),
	'enabled|a1|t',
	'the entry has the service\'s revision and no error');
is($node->safe_psql('postgres', "SELECT projcache.get('b', '10s')"),
	'{"b": 1}', 'key b is cached');
is( $node->safe_psql(
		'postgres', "SELECT state FROM projcache.lookup('off', '10s')"),
	'disabled', 'a key the service says is disabled is disabled');
is( $node->safe_psql(
		'postgres', "SELECT state FROM projcache.lookup('nowhere', '10s')"),
	'disabled', 'a key the service does not know is disabled');
is(stat_value($node, 'fetch_errors'), '0', 'no fetch error so far');

# ---------------------------------------------------------------------------
# The held revision is sent, and the service answers not_modified.
# ---------------------------------------------------------------------------
my $not_modified = stat_value($node, 'not_modified');
my $nrequests = @{ admin('GET', '/admin/requests')->{requests} };
$node->safe_psql('postgres', "SELECT projcache.invalidate('a')");
ok( $node->poll_query_until(
		'postgres', "SELECT not_modified > $not_modified FROM projcache.stats"),
	'the service\'s not_modified answer is counted in stats.not_modified');
my @requests = @{ admin('GET', '/admin/requests')->{requests} };
my @sent = grep {
	my $r = $_;
	grep { $r->{keys}[$_] eq 'a' && ($r->{revisions}[$_] // '') eq 'a1' }
	  0 .. $#{ $r->{keys} }
} @requests[ $nrequests .. $#requests ];
ok(@sent >= 1, 'the refetch of a sent its held revision a1 to the service');
is( $node->safe_psql(
		'postgres',
		"SELECT state, freshness, revision, config FROM projcache.lookup('a')"),
	'enabled|fresh|a1|{"a": 1}',
	'after not_modified the value stays, fresh again');

# ---------------------------------------------------------------------------
# Failures: each is a counted error with a clear last_error, the old value
# keeps serving, and the worker lives on.  Then the cache recovers.
# ---------------------------------------------------------------------------

# Refetch key a while the service fails as $break makes it, check all of
# the above, then undo it with $repair and wait for a clean fetch.
sub failing_fetch
{
	my ($what, $break, $error_re, $repair, $value) = @_;
	my $errors = stat_value($node, 'fetch_errors');

	$break->();
	$node->safe_psql('postgres', "SELECT projcache.invalidate('a')");
	ok( $node->poll_query_until(
			'postgres',
			"SELECT last_error IS NOT NULL FROM projcache.entries WHERE key = 'a'"
		),
		"$what: the failed fetch is recorded");
	cmp_ok(stat_value($node, 'fetch_errors'),
		'>', $errors, "$what: stats.fetch_errors counts it");
	like(
		$node->safe_psql(
			'postgres', "SELECT last_error FROM projcache.lookup('a')"),
		$error_re,
		"$what: lookup() shows the error");
	is($node->safe_psql('postgres', "SELECT projcache.get('a')"),
		$value, "$what: the old value keeps serving");
	is(worker_pid($node), $worker, "$what: the same worker lives on");

	$repair->();
	ok( $node->poll_query_until(
			'postgres',
			"SELECT last_error IS NULL AND freshness = 'fresh' FROM projcache.entries WHERE key = 'a'"
		),
		"$what: once the service is back, the key is fetched again");
	return;
}

failing_fetch(
	'service down',
	\&stop_service,
	qr/^plpy\.Error: config service at \Q$url\E could not be reached: Connection refused$/,
	sub { ok(start_service(), 'service down: the service is started again') },
	'{"a": 1}');

# A change reaches the cache through invalidate() (and the revision moves).
admin('PUT', '/admin/configs/a', { revision => 'a2', config => { a => 2 } });
$node->safe_psql('postgres', "SELECT projcache.invalidate('a')");
ok( $node->poll_query_until(
		'postgres', "SELECT projcache.get('a')::text = '{\"a\": 2}'"),
	'a changed config reaches the cache after invalidate()');
is( $node->safe_psql(
		'postgres', "SELECT revision FROM projcache.entries WHERE key = 'a'"),
	'a2', 'with its new revision');

failing_fetch(
	'HTTP 500',
	sub { set_mode(mode => 'error') },
	qr/^plpy\.Error: config service at \Q$url\E answered HTTP 500 Internal Server Error: internal error/,
	sub { set_mode(mode => 'normal') },
	'{"a": 2}');

failing_fetch(
	'malformed JSON',
	sub { set_mode(mode => 'malformed') },
	qr/^plpy\.Error: config service at \Q$url\E answered malformed JSON: /,
	sub { set_mode(mode => 'normal') },
	'{"a": 2}');

failing_fetch(
	'unknown state',
	sub { set_mode(mode => 'unknown_state', state => 'archived') },
	qr/^plpy\.Error: config service at \Q$url\E answered unknown state "archived" for key "a"$/,
	sub { set_mode(mode => 'normal') },
	'{"a": 2}');

# Slower than projcache.fetch_timeout: the function gives up at 80 % of it,
# with its own message.  (On a starved machine the statement timeout may
# get there first; that is a counted error too, with projcache's message.)
$node->safe_psql('postgres',
	"ALTER SYSTEM SET projcache.fetch_timeout = '1s'");
reload_and_wait($node);
failing_fetch(
	'service slower than fetch_timeout',
	sub { set_mode(mode => 'slow', delay => 5) },
	qr/^plpy\.Error: config service at \Q$url\E did not answer within 800 ms$|^fetch function ran longer than projcache\.fetch_timeout/,
	sub { set_mode(mode => 'normal') },
	'{"a": 2}');
$node->safe_psql('postgres', 'ALTER SYSTEM RESET projcache.fetch_timeout');
reload_and_wait($node);

# ---------------------------------------------------------------------------
# An answer that leaves keys out: those keys become disabled, and that is
# no error.
# ---------------------------------------------------------------------------
my $errors = stat_value($node, 'fetch_errors');
set_mode(mode => 'partial', omit => ['b']);
$node->safe_psql(
	'postgres', q{
SELECT projcache.invalidate('a');
SELECT projcache.invalidate('b');
});
ok( $node->poll_query_until(
		'postgres',
		"SELECT state = 'disabled' FROM projcache.entries WHERE key = 'b'"),
	'partial answer: the key left out becomes disabled');
is($node->safe_psql('postgres', "SELECT projcache.get('b') IS NULL"),
	't', 'partial answer: get() of the left-out key is NULL');
ok( $node->poll_query_until(
		'postgres',
		"SELECT state = 'enabled' AND freshness = 'fresh' AND last_error IS NULL FROM projcache.entries WHERE key = 'a'"
	),
	'partial answer: the key that was answered stays enabled');
is(stat_value($node, 'fetch_errors'),
	$errors, 'partial answer: not a fetch error');
set_mode(mode => 'normal');

# ---------------------------------------------------------------------------
# Cache-Control: max-age / s-maxage give max_age; stale-while-revalidate
# and stale-if-error (RFC 5861), the larger of them, give stale_for.
# ---------------------------------------------------------------------------

# The periods of key $k after a refetch while the service answers so.
sub periods_after
{
	my ($k) = @_;
	my $calls = @{ admin('GET', '/admin/requests')->{requests} };
	$node->safe_psql('postgres', "SELECT projcache.invalidate('$k')");
	$node->poll_query_until('postgres',
		"SELECT freshness = 'fresh' FROM projcache.entries WHERE key = '$k'")
	  or die "$k was not refetched";
	die "the service was not asked"
	  unless @{ admin('GET', '/admin/requests')->{requests} } > $calls;
	return $node->safe_psql('postgres',
		"SELECT max_age || ' ' || stale_for || ' ' || coalesce(last_error, '-') FROM projcache.entries WHERE key = '$k'"
	);
}

is(periods_after('a'), '00:05:00 00:02:00 -',
	'no Cache-Control: the settings apply (expiry 5 min, grace 2 min)');
admin('PUT', '/admin/headers',
	{ 'Cache-Control' => 'public, max-age=30, stale-while-revalidate=60, stale-if-error=300' });
is(periods_after('a'), '00:00:30 00:05:00 -',
	'the answer\'s max-age is max_age, the larger of stale-while-revalidate and stale-if-error stale_for');
admin('PUT', '/admin/headers',
	{ 'Cache-Control' => 'max-age=99, s-maxage=10, stale-while-revalidate=20' });
is(periods_after('a'), '00:00:10 00:00:20 -',
	's-maxage wins over max-age (projcache is a shared cache)');
admin('PUT', '/admin/headers', { 'Cache-Control' => 'max-age=31536000' });
is(periods_after('a'), '149:07:50 00:02:00 -',
	'a max-age longer than projcache takes is cut to its bound (536870 s), not refused');
admin('PUT', '/admin/headers', { 'Cache-Control' => 'max-age=soon, no-cache' });
is(periods_after('a'), '00:05:00 00:02:00 -',
	'a directive that is not a number of seconds is ignored');
# An entry's own cache_control, for that key alone, replaces the header's;
# a not_modified answer carries it too.
admin('PUT', '/admin/headers', { 'Cache-Control' => 'max-age=30' });
admin('PUT', '/admin/configs/b',
	{ revision => 'b1', config => { b => 1 }, cache_control => 'max-age=3600, stale-if-error=86400' });
is(periods_after('b'), '01:00:00 24:00:00 -',
	'an entry\'s cache_control gives that key its own periods');
is(periods_after('a'), '00:00:30 00:02:00 -',
	'the other keys of the batch keep the header\'s');
is( $node->safe_psql(
		'postgres', "SELECT revision, config FROM projcache.lookup('b')"),
	'b1|{"b": 1}', 'the value is the service\'s');
admin('PUT', '/admin/headers', {});

is(worker_pid($node), $worker, 'the same worker ran the whole test');

stop_service();
$node->stop;
done_testing();
