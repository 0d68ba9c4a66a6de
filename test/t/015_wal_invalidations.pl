# Copyright (c) 2026, projcache developers
#
# Invalidations and snapshot refreshes through WAL
# (projcache.wal_invalidations): a primary, a streaming standby and a
# cascading standby fed by that standby, all preloading projcache, each
# with a cache of its own.
#
# - invalidate() committed on the primary reaches both standbys, also for
#   a key the primary itself has not cached;
# - pg_walinspect shows one record per transaction, keys deduplicated,
#   before the commit record; none for a rolled back transaction, none
#   with the setting off;
# - with recovery_min_apply_delay, the cascading standby serves the old
#   value as stale, requesting no fetch, until the commit is replayed, and
#   never as fresh;
# - a list of waiting keys too small for a record (overflow) makes every
#   cached key wait, then stale once the transaction ended;
# - a standby restarted with records in flight still refetches after the
#   commit;
# - refresh_snapshot() on the primary marks the snapshot stale on standbys;
# - a promoted standby keeps its cache;
# - a standby without the library stops replay with a FATAL naming the
#   resource manager's id.

use strict;
use warnings;

use FindBin;
use lib $FindBin::RealBin;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use ProjcacheTest;
use Test::More;
use Time::HiRes qw(usleep);

my $primary = projcache_node(
	'primary',
	init => { allows_streaming => 1 },
	conf => "projcache.wal_invalidations = on\n"
	  . "projcache.expiry = '1h'\n"
	  . "projcache.max_retry_backoff = '1s'\n");

create_readonly_upstream($primary);
$primary->safe_psql(
	'postgres', q{
CREATE EXTENSION pg_walinspect;
INSERT INTO public.upstream (key, revision, config)
SELECT k, k || '1', jsonb_build_object('v', 1)
FROM unnest(ARRAY['a', 'b', 'c', 'd']) AS k;

CREATE TABLE public.grants (user_id int, audience text);
INSERT INTO public.grants VALUES (1, 'one');
SELECT projcache.create_snapshot('grants',
	'SELECT user_id, audience FROM public.grants', '1h');
});
set_fetch_function($primary, 'public.fetch');
is($primary->safe_psql('postgres', "SELECT projcache.get('a', '5s')"),
	'{"v": 1}', 'primary: key a is cached');

# The standby keeps the settings of the base backup; the cascading one
# keeps few waiting keys, to show the overflow.
$primary->backup('backup');
my $standby = PostgreSQL::Test::Cluster->new('standby');
$standby->init_from_backup($primary, 'backup', has_streaming => 1);
$standby->start;
$standby->backup('backup2');
my $cascade = PostgreSQL::Test::Cluster->new('cascade');
$cascade->init_from_backup($standby, 'backup2', has_streaming => 1);
$cascade->append_conf('postgresql.conf',
	"projcache.wal_pending_memory = '8kB'\n");
$cascade->start;
$primary->wait_for_catchup($standby, 'replay');
$standby->wait_for_catchup($cascade, 'replay', $primary->lsn('insert'));

for my $node ($standby, $cascade)
{
	my $name = $node->name;
	like(wait_for_worker($node), qr/^\d+$/, "$name: worker runs");
	for my $key (qw(a b c d))
	{
		is($node->safe_psql('postgres', "SELECT projcache.get('$key', '5s')"),
			'{"v": 1}', "$name: key $key is cached");
	}
}

# Values as (config, freshness) of a key, from lookup().
sub look
{
	my ($node, $key) = @_;
	return $node->safe_psql('postgres',
		"SELECT config::text || '|' || freshness FROM projcache.lookup('$key')"
	);
}

# The projcache records between two LSNs on the primary.
sub records
{
	my ($from, $to) = @_;
	return $primary->safe_psql(
		'postgres', qq{
SELECT record_type || ' ' || description
FROM pg_get_wal_records_info('$from', '$to')
WHERE resource_manager = 'projcache'
ORDER BY start_lsn});
}

sub flush_lsn
{
	return $primary->safe_psql('postgres',
		'SELECT pg_current_wal_flush_lsn()');
}

# On the primary, in one transaction: key b gets revision b<n> and config
# {"v": n}, and invalidate('b').
sub change_b
{
	my ($n) = @_;
	$primary->safe_psql(
		'postgres', qq{
BEGIN;
UPDATE public.upstream SET revision = 'b$n', config = '{"v": $n}' WHERE key = 'b';
SELECT projcache.invalidate('b');
COMMIT;
});
	return;
}

# Run $sql on $node every 50 ms until it returns $new (or the test timeout
# passes); returns whether it did, and how many answers matched
# $old_fresh, an old value served as fresh, meanwhile.
sub watch_key
{
	my ($node, $sql, $old_fresh, $new) = @_;
	my ($seen_new, $seen_old_fresh) = (0, 0);
	my $deadline = time + $PostgreSQL::Test::Utils::timeout_default;

	while (time < $deadline)
	{
		my $v = $node->safe_psql('postgres', $sql);

		$seen_old_fresh++ if $v =~ $old_fresh;
		if ($v eq $new)
		{
			$seen_new = 1;
			last;
		}
		usleep(50_000);
	}
	return ($seen_new, $seen_old_fresh);
}

# ---------------------------------------------------------------------------
# An invalidation reaches both standbys; c is not cached on the primary.
# ---------------------------------------------------------------------------
my $lsn0 = flush_lsn();
is( $primary->safe_psql(
		'postgres', q{
BEGIN;
UPDATE public.upstream SET revision = 'a2', config = '{"v": 2}' WHERE key IN ('a', 'c');
SELECT projcache.invalidate('a'), projcache.invalidate('a'), projcache.invalidate('c');
COMMIT;
}),
	't|t|f',
	'primary: invalidate(a) twice and invalidate(c), which it has not cached');
my $lsn1 = flush_lsn();

is(records($lsn0, $lsn1), q{INVALIDATE nkeys 2; keys: 'a', 'c'},
	'pg_walinspect: one INVALIDATE record with both keys, each once');
is( $primary->safe_psql(
		'postgres', qq{
SELECT string_agg(resource_manager || '/' || record_type, ' ' ORDER BY start_lsn)
FROM pg_get_wal_records_info('$lsn0', '$lsn1')
WHERE xid = (SELECT xid FROM pg_get_wal_records_info('$lsn0', '$lsn1')
			 WHERE resource_manager = 'projcache')
  AND resource_manager IN ('projcache', 'Transaction')}),
	'projcache/INVALIDATE Transaction/COMMIT',
	'pg_walinspect: the record precedes its transaction\'s commit record');

# pg_waldump loads no extension code: it names the resource manager by id.
my ($waldump) = run_command(
	[
		'pg_waldump', '-p', $primary->data_dir . '/pg_wal',
		'-s', $lsn0, '-e', $lsn1, '-r', 'custom128'
	]);
like($waldump, qr/^rmgr: custom128 /m,
	'pg_waldump: the record shows as custom128');

for my $node ($standby, $cascade)
{
	my $name = $node->name;
	for my $key (qw(a c))
	{
		ok( $node->poll_query_until(
				'postgres',
				"SELECT config::text || '|' || freshness = '{\"v\": 2}|fresh' FROM projcache.lookup('$key')"
			),
			"$name: key $key serves the new value, fresh");
	}
	is(look($node, 'b'), '{"v": 1}|fresh', "$name: key b is untouched");
}

# ---------------------------------------------------------------------------
# A rolled back invalidation writes nothing; the setting off writes nothing.
# ---------------------------------------------------------------------------
$lsn0 = flush_lsn();
$primary->safe_psql(
	'postgres', q{
BEGIN;
UPDATE public.upstream SET revision = 'b2', config = '{"v": 2}' WHERE key = 'b';
SELECT projcache.invalidate('b');
ROLLBACK;
});
$primary->safe_psql('postgres', 'CHECKPOINT');	# moves the flush LSN on
$lsn1 = flush_lsn();
is(records($lsn0, $lsn1), '', 'rolled back: no projcache record');
$primary->wait_for_catchup($standby, 'replay');
is(look($standby, 'b'), '{"v": 1}|fresh',
	'rolled back: standby still serves b as fresh');

$primary->safe_psql('postgres',
	'ALTER SYSTEM SET projcache.wal_invalidations = off');
reload_and_wait($primary);
$lsn0 = flush_lsn();
is($primary->safe_psql('postgres', "SELECT projcache.invalidate('a')"),
	't', 'setting off: invalidate(a) on the primary');
$primary->safe_psql('postgres', 'CHECKPOINT');
$lsn1 = flush_lsn();
is(records($lsn0, $lsn1), '', 'setting off: no projcache record');
$primary->safe_psql('postgres',
	'ALTER SYSTEM SET projcache.wal_invalidations = on');
reload_and_wait($primary);

# ---------------------------------------------------------------------------
# recovery_min_apply_delay on the cascading standby: its commit records are
# held back; the old value serves as stale, asking for no fetch, and never
# as fresh, until the commit is replayed.
# ---------------------------------------------------------------------------
$cascade->append_conf('postgresql.conf', "recovery_min_apply_delay = '4s'\n");
$cascade->reload;
$cascade->poll_query_until('postgres',
	"SELECT current_setting('recovery_min_apply_delay') = '4s'");
change_b(3);
ok( $cascade->poll_query_until(
		'postgres', "SELECT freshness = 'stale' FROM projcache.lookup('b')"),
	'delayed: the record is replayed and b is stale');
my $requests =
  $cascade->safe_psql('postgres', 'SELECT fetch_requests FROM projcache.stats');
is( $cascade->safe_psql(
		'postgres',
		q{SELECT projcache.get('b')::text, projcache.get('b')::text,
				 (SELECT freshness FROM projcache.lookup('b'))}),
	'{"v": 1}|{"v": 1}|stale',
	'delayed: reads serve the old value, stale');
is($cascade->safe_psql('postgres', 'SELECT fetch_requests FROM projcache.stats'),
	$requests, 'delayed: those reads requested no fetch');

my ($seen_new, $seen_old_fresh) = watch_key($cascade,
	"SELECT config::text || '|' || freshness FROM projcache.lookup('b')",
	qr/^\{"v": 1\}\|fresh$/, '{"v": 3}|fresh');
ok($seen_new, 'delayed: the new value arrives after the commit is replayed');
is($seen_old_fresh, 0, 'delayed: the old value was never served as fresh');

# ---------------------------------------------------------------------------
# Restart of the delayed standby while a record is in flight.
# ---------------------------------------------------------------------------
change_b(4);
ok( $cascade->poll_query_until(
		'postgres', "SELECT freshness = 'stale' FROM projcache.lookup('b')"),
	'restart: the record is replayed, b is stale');
$cascade->restart;
wait_for_worker($cascade);
($seen_new, $seen_old_fresh) = watch_key($cascade,
	"SELECT projcache.get('b', '1s')::text || '|' || freshness FROM projcache.lookup('b')",
	qr/^\{"v": [13]\}\|fresh$/, '{"v": 4}|fresh');
ok($seen_new, 'restart: the new value arrives after the commit is replayed');
is($seen_old_fresh, 0, 'restart: an old value was never served as fresh');

# ---------------------------------------------------------------------------
# Overflow: a record larger than the cascading standby's list (8 kB).
# ---------------------------------------------------------------------------
my $offset = -s $cascade->logfile;
is($cascade->safe_psql('postgres', "SELECT projcache.get('d', '5s')"),
	'{"v": 1}', 'overflow: d is cached again after the restart');
# Restored from the dump, d came back stale: that read asked for it, and
# it is fresh once the fetch has run (a moment, on a busy machine longer).
ok( $cascade->poll_query_until(
		'postgres',
		"SELECT config::text || '|' || freshness = '{\"v\": 1}|fresh' FROM projcache.lookup('d')"
	),
	'overflow: d is fresh before');
$primary->safe_psql(
	'postgres', q{
BEGIN;
SELECT count(projcache.invalidate(repeat('x', 100) || i)) FROM generate_series(1, 200) AS i;
COMMIT;
});
ok( $cascade->wait_for_log(
		qr/invalidations replayed from WAL did not fit in projcache.wal_pending_memory/,
		$offset),
	'overflow: the cascading standby logs it');
is(look($cascade, 'd'), '{"v": 1}|stale',
	'overflow: a key not in the record is stale too');
ok( $cascade->wait_for_log(
		qr/the transactions whose invalidations were dropped have ended\n.*DETAIL:  Cached keys are refetched on their next read/,
		$offset),
	'overflow: over once the transaction has ended');
ok( $cascade->poll_query_until(
		'postgres',
		"SELECT projcache.get('d') IS NOT NULL AND freshness = 'fresh' FROM projcache.lookup('d')"
	),
	'overflow: then d is refetched on its next read');

# ---------------------------------------------------------------------------
# refresh_snapshot() on the primary marks the snapshot stale on standbys.
# ---------------------------------------------------------------------------
$primary->wait_for_catchup($standby, 'replay');
is( $standby->safe_psql(
		'postgres',
		'SELECT string_agg(audience, \',\') FROM projcache.snapshot(\'grants\') AS (user_id int, audience text)'
	),
	'one',
	'snapshot: loaded on the standby');
$primary->safe_psql('postgres', "INSERT INTO public.grants VALUES (2, 'two')");
$lsn0 = flush_lsn();
is($primary->safe_psql('postgres', "SELECT projcache.refresh_snapshot('grants')"),
	't', 'snapshot: refresh_snapshot() on the primary');
$lsn1 = flush_lsn();
like(records($lsn0, $lsn1), qr/^REFRESH_SNAPSHOT database \d+; snapshot 'grants'$/,
	'pg_walinspect: the REFRESH_SNAPSHOT record');
ok( $standby->poll_query_until(
		'postgres',
		"SELECT status = 'stale' FROM projcache.snapshots WHERE name = 'grants'"
	),
	'snapshot: stale on the standby');
is( $standby->safe_psql(
		'postgres',
		'SELECT string_agg(audience, \',\' ORDER BY user_id) FROM projcache.snapshot(\'grants\') AS (user_id int, audience text)'
	),
	'one,two',
	'snapshot: the next read on the standby loads the new rows');

# ---------------------------------------------------------------------------
# Promotion: the standby keeps its cache.
# ---------------------------------------------------------------------------
my $cached =
  "SELECT string_agg(key || ':' || revision || ':' || freshness, ',' ORDER BY key) FROM projcache.entries WHERE key IN ('a', 'b', 'c', 'd')";
my $before = $standby->safe_psql('postgres', $cached);
my $calls = $standby->safe_psql('postgres', 'SELECT fetch_calls FROM projcache.stats');
$standby->promote;
$standby->poll_query_until('postgres', 'SELECT NOT pg_is_in_recovery()');
is($before, 'a:a2:fresh,b:b4:fresh,c:a2:fresh,d:d1:fresh',
	'before promotion: the standby has the four keys, fresh');
is($standby->safe_psql('postgres', $cached),
	$before, 'promoted: the same cached keys, still fresh');
is($standby->safe_psql('postgres', "SELECT projcache.get('a')"),
	'{"v": 2}', 'promoted: serves from its cache');
is($standby->safe_psql('postgres', 'SELECT fetch_calls FROM projcache.stats'),
	$calls, 'promoted: no key had to be fetched again');

# ---------------------------------------------------------------------------
# A standby that does not preload projcache cannot replay the records.
# ---------------------------------------------------------------------------
# A standby with no source yet, so that it is up before it meets a record
# (its base backup predates them all); then it streams from the primary.
my $bare = PostgreSQL::Test::Cluster->new('bare');
$bare->init_from_backup($primary, 'backup');
$bare->set_standby_mode;
$bare->append_conf('postgresql.conf', "shared_preload_libraries = ''\n");
$bare->start;
$primary->safe_psql('postgres',
	"BEGIN; SELECT projcache.invalidate('a'); COMMIT;");
$bare->enable_streaming($primary);
$bare->reload;
ok( $bare->wait_for_log(
		qr/FATAL:  resource manager with ID 128 not registered/, 0),
	'no library: replay stops with a FATAL naming the id');
ok( $bare->wait_for_log(
		qr/startup process \(PID \d+\) exited with exit code 1/, 0),
	'no library: the startup process exited');
$bare->stop('immediate', fail_ok => 1);

done_testing();
