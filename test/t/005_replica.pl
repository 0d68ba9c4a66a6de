# Copyright (c) 2026, projcache developers
#
# A primary with projcache and a streaming hot standby, both preloading it.
# The upstream table and the (read-only) fetch function replicate to the
# standby, whose own scheduler worker starts at consistent state and serves
# its own cache there.  A change made on the primary, once replayed, is seen
# on the standby after invalidate().  A fetch function that writes fails on
# the standby (read-only transaction) without harming the worker.

use strict;
use warnings;

use FindBin;
use lib $FindBin::RealBin;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use ProjcacheTest;
use Test::More;

my $primary = projcache_node(
	'primary',
	init => { allows_streaming => 1 },
	conf => "projcache.expiry = '60s'\nprojcache.max_retry_backoff = '1s'\n");

# The read-only fetch function works on a hot standby too.
create_readonly_upstream($primary);
$primary->safe_psql(
	'postgres', q{
INSERT INTO public.upstream (key, revision, config) VALUES
	('a', 'a1', '{"a": 1}'),
	('b', 'b1', '{"b": 1}'),
	('c', 'c1', '{"c": 1}');

-- Writes a log of its calls: fine on a primary, not on a standby.
CREATE TABLE public.calls (keys text[]);
CREATE FUNCTION public.fetch_logged(p_keys text[], p_revisions text[])
RETURNS TABLE(key text, state text, revision text, config jsonb)
LANGUAGE plpgsql AS $$
BEGIN
	INSERT INTO public.calls VALUES (p_keys);
	RETURN QUERY SELECT * FROM public.fetch(p_keys, p_revisions);
END
$$;
});
set_fetch_function($primary, 'public.fetch');

is($primary->safe_psql('postgres', "SELECT projcache.get('a', '5s')"),
	'{"a": 1}', 'primary: key a is fetched');
is($primary->safe_psql('postgres', "SELECT projcache.get('b', '5s')"),
	'{"b": 1}', 'primary: key b is fetched');

# The base backup carries postgresql.conf and postgresql.auto.conf: the
# standby preloads projcache with the same fetch function.
$primary->backup('backup');
my $standby = PostgreSQL::Test::Cluster->new('standby');
$standby->init_from_backup($primary, 'backup', has_streaming => 1);
$standby->start;
$primary->wait_for_catchup($standby, 'replay');

is($standby->safe_psql('postgres', 'SELECT pg_is_in_recovery()'),
	't', 'standby: in recovery');
is($standby->safe_psql('postgres', 'SHOW projcache.fetch_function'),
	'public.fetch', 'standby: same fetch function setting');
my $standby_worker = wait_for_worker($standby);
like($standby_worker, qr/^\d+$/,
	'standby: the scheduler worker started at consistent state');

# The standby's cache is its own: nothing the primary cached is there.
is($standby->safe_psql('postgres', 'SELECT count(*) FROM projcache.entries'),
	'0', 'standby: its cache starts empty');

is($standby->safe_psql('postgres', "SELECT projcache.get('a', '5s')"),
	'{"a": 1}', 'standby: a cold key is fetched on the standby');
is( $standby->safe_psql(
		'postgres',
		"SELECT state, freshness, revision, last_error IS NULL FROM projcache.entries WHERE key = 'a'"
	),
	'enabled|fresh|a1|t',
	'standby: the entry is enabled and fresh, no error');
is( $standby->safe_psql(
		'postgres', "SELECT state FROM projcache.lookup('zzz', '5s')"),
	'disabled',
	'standby: an unknown key is disabled');
is( $standby->safe_psql(
		'postgres', 'SELECT fetch_errors, fetch_calls > 0 FROM projcache.stats'),
	'0|t',
	'standby: its worker called the fetch function without errors');
is($standby->safe_psql('postgres', "SELECT projcache.evict('b')"),
	'f', 'standby: key b, cached only on the primary, is not in its cache');

# ---------------------------------------------------------------------------
# A change on the primary reaches the standby's cache after invalidate().
# ---------------------------------------------------------------------------
$primary->safe_psql('postgres',
	q{UPDATE public.upstream SET revision = 'a2', config = '{"a": 2}' WHERE key = 'a'}
);
$primary->wait_for_catchup($standby, 'replay');
is($standby->safe_psql('postgres', "SELECT projcache.get('a')"),
	'{"a": 1}', 'standby: the fresh cached value holds after the change replays');
is($standby->safe_psql('postgres', "SELECT projcache.invalidate('a')"),
	't', 'standby: invalidate(a)');
ok( $standby->poll_query_until(
		'postgres', q{SELECT projcache.get('a')::text = '{"a": 2}'}),
	'standby: the replicated change is served after invalidate');
is( $standby->safe_psql(
		'postgres', "SELECT revision FROM projcache.entries WHERE key = 'a'"),
	'a2',
	'standby: the entry has the new revision');

# The primary's cache is independent: still the old value until invalidated.
is($primary->safe_psql('postgres', "SELECT projcache.get('a')"),
	'{"a": 1}', 'primary: its own cache still holds the old value');
$primary->safe_psql('postgres', "SELECT projcache.invalidate('a')");
ok( $primary->poll_query_until(
		'postgres', q{SELECT projcache.get('a')::text = '{"a": 2}'}),
	'primary: the new value after invalidate');

# ---------------------------------------------------------------------------
# A fetch function that writes cannot run on the standby.
# ---------------------------------------------------------------------------
$standby->safe_psql('postgres',
	"ALTER SYSTEM SET projcache.fetch_function = 'public.fetch_logged'");
reload_and_wait($standby);
is($standby->safe_psql('postgres', "SELECT projcache.get('c', '1s')"),
	'', 'standby: with a writing fetch function, a cold key stays pending');
ok( $standby->poll_query_until(
		'postgres',
		"SELECT last_error LIKE '%read-only transaction%' FROM projcache.entries WHERE key = 'c'"
	),
	'standby: the write is refused, recorded as the key\'s last_error');
is(worker_pid($standby), $standby_worker,
	'standby: the worker survives the failing fetch function');
is($standby->safe_psql('postgres', "SELECT projcache.get('a')"),
	'{"a": 2}', 'standby: cached values keep serving');

$standby->safe_psql('postgres',
	"ALTER SYSTEM SET projcache.fetch_function = 'public.fetch'");
reload_and_wait($standby);
is($standby->safe_psql('postgres', "SELECT projcache.get('c', '5s')"),
	'{"c": 1}', 'standby: back to the read-only function, the key is fetched');
is( $standby->safe_psql(
		'postgres',
		"SELECT state, last_error IS NULL FROM projcache.entries WHERE key = 'c'"),
	'enabled|t',
	'standby: the error is cleared');

# The writing function is fine on the primary.
$primary->safe_psql('postgres',
	"ALTER SYSTEM SET projcache.fetch_function = 'public.fetch_logged'");
reload_and_wait($primary);
is($primary->safe_psql('postgres', "SELECT projcache.get('c', '5s')"),
	'{"c": 1}', 'primary: the writing fetch function works there');
is( $primary->safe_psql(
		'postgres', "SELECT count(*) FROM public.calls WHERE 'c' = ANY (keys)"),
	'1',
	'primary: its call was logged');

# ---------------------------------------------------------------------------
# A snapshot grant changed on the primary reaches a standby session that has
# already read the snapshot: its readers' cache drops what it knew when the
# commit replays, as on the primary.
# ---------------------------------------------------------------------------
$primary->safe_psql(
	'postgres', q{
CREATE ROLE reader;
GRANT USAGE ON SCHEMA projcache TO reader;
GRANT EXECUTE ON FUNCTION projcache.snapshot(text) TO reader;
SELECT projcache.create_snapshot('keys', 'SELECT key FROM public.upstream', '60s');
SELECT projcache.grant_snapshot('keys', 'reader');
});
$primary->wait_for_catchup($standby, 'replay');
my $reader = $standby->background_psql('postgres', on_error_stop => 0);
my $read_keys = q{SELECT count(*) FROM projcache.snapshot('keys') AS t(key text)};
$reader->query_safe('SET ROLE reader');
is($reader->query_safe($read_keys), '3', 'standby: the granted role reads the snapshot');
is($reader->query_safe($read_keys), '3', 'standby: and again, from its cache');

$primary->safe_psql('postgres', q{SELECT projcache.revoke_snapshot('keys', 'reader')});
$primary->wait_for_catchup($standby, 'replay');
my ($out, $failed) = $reader->query($read_keys);
ok($failed && $reader->{stderr} =~ /permission denied for snapshot "keys"/,
	'standby: the revoke takes effect at once in that session')
  or diag("stdout: $out; stderr: $reader->{stderr}");
$reader->{stderr} = '';

$primary->safe_psql('postgres', q{SELECT projcache.grant_snapshot('keys', 'reader')});
$primary->wait_for_catchup($standby, 'replay');
is($reader->query_safe($read_keys), '3', 'standby: granted again, it reads again');
$reader->quit;

# A change tried on the standby fails (read-only); caught, the transaction
# that tried still commits.
my ($rc, $stdout, $stderr) = $standby->psql(
	'postgres', q{
DO $$
BEGIN
	PERFORM projcache.revoke_snapshot('keys', 'reader');
EXCEPTION WHEN read_only_sql_transaction THEN
	RAISE NOTICE 'refused: %', SQLERRM;
END $$;
SELECT 'committed';
});
is($stdout, 'committed',
	'standby: a caught, failed registry change leaves a transaction that commits')
  or diag("stderr: $stderr");
like($stderr, qr/refused: cannot execute UPDATE in a read-only transaction/,
	'standby: the change was refused as read-only');

$primary->safe_psql('postgres', q{SELECT projcache.drop_snapshot('keys'); DROP OWNED BY reader; DROP ROLE reader;});

# ---------------------------------------------------------------------------
# Promotion: the standby's worker and cache carry on, and it may now write.
# ---------------------------------------------------------------------------
$primary->stop;
$standby->promote;
ok($standby->poll_query_until('postgres', 'SELECT NOT pg_is_in_recovery()'),
	'standby promoted');
is(worker_pid($standby), $standby_worker,
	'promoted: the same scheduler worker runs');
is($standby->safe_psql('postgres', "SELECT projcache.get('a')"),
	'{"a": 2}', 'promoted: the cache survived the promotion');
$standby->safe_psql('postgres',
	q{INSERT INTO public.upstream (key, revision, config) VALUES ('d', 'd1', '{"d": 1}')}
);
$standby->safe_psql('postgres',
	"ALTER SYSTEM SET projcache.fetch_function = 'public.fetch_logged'");
reload_and_wait($standby);
is($standby->safe_psql('postgres', "SELECT projcache.get('d', '5s')"),
	'{"d": 1}', 'promoted: the writing fetch function works now');
is( $standby->safe_psql(
		'postgres', "SELECT count(*) FROM public.calls WHERE 'd' = ANY (keys)"),
	'1',
	'promoted: its call was logged');

$standby->stop;
done_testing();
