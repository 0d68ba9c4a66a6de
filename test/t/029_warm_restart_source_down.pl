# Copyright (c) 2026, projcache developers
#
# Last-good survives a restart (issue 22), with the source on a second
# server: eight clients' worth of keys and a snapshot (read as a function
# and as a foreign table) are cached; the source server is stopped, the
# cache server restarted (pg_ctl restart -m fast), and the source started
# again only after the cache was read.
#
# - 0 NULL reads of keys cached before the restart, 0 snapshot errors, in
#   the window while the source is down;
# - once the source is back, the keys and the snapshot are fresh again;
# - a registration dropped after a dump and created again under the same
#   name is not given the dropped one's rows (a crash, so that the dump
#   still holds them);
# - a standby dumps and reloads its own caches.

use strict;
use warnings;

use FindBin;
use lib $FindBin::RealBin;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use ProjcacheTest;
use Test::More;

my $source = PostgreSQL::Test::Cluster->new('source');
$source->init;
$source->start;
$source->safe_psql(
	'postgres', q{
CREATE TABLE configs (key text PRIMARY KEY, state text NOT NULL DEFAULT 'enabled',
                      revision text, config jsonb);
INSERT INTO configs (key, revision, config)
SELECT 'k' || i, 'r1', jsonb_build_object('i', i) FROM generate_series(1, 2000) AS i;
CREATE TABLE grants (user_id int PRIMARY KEY, audience text);
INSERT INTO grants SELECT i, 'aud' || (i % 7) FROM generate_series(1, 500) AS i;
});

my $cache = projcache_node(
	'cache',
	conf => "projcache.expiry = '1h'\n"
	  . "projcache.dump_interval = '1s'\n"
	  . "projcache.max_retry_backoff = '1s'\n"
	  . "projcache.wal_invalidations = on\n"
	  . "restart_after_crash = on\n",
	init => { allows_streaming => 1 });
my $have_dblink = $cache->safe_psql('postgres',
	"SELECT count(*) FROM pg_available_extensions WHERE name = 'dblink'");
plan skip_all => 'dblink is not installed' unless $have_dblink;

my $connstr = $source->connstr('postgres') . ' connect_timeout=2';
$cache->safe_psql(
	'postgres', qq{
CREATE EXTENSION dblink;
CREATE TABLE public.source_server (connstr text NOT NULL);
INSERT INTO public.source_server VALUES (\$conn\$$connstr\$conn\$);
CREATE FUNCTION public.fetch_remote(p_keys text[], p_revisions text[])
RETURNS TABLE(key text, state text, revision text, config jsonb)
LANGUAGE sql STABLE AS \$\$
	SELECT r.key, r.state, r.revision, r.config
	FROM dblink((SELECT connstr FROM public.source_server),
		format('SELECT key, state, revision, config FROM configs WHERE key = ANY (%L::text[])',
			   p_keys))
		AS r(key text, state text, revision text, config jsonb)
\$\$;
SELECT projcache.create_snapshot('grants',
	\$q\$SELECT * FROM dblink((SELECT connstr FROM public.source_server),
		'SELECT user_id, audience FROM grants') AS g(user_id int, audience text)\$q\$,
	'2s', 'user_id');
CREATE FOREIGN TABLE public.grants (user_id int, audience text)
	SERVER projcache OPTIONS (snapshot 'grants');
});
set_fetch_function($cache, 'public.fetch_remote');
wait_for_worker($cache);

$cache->safe_psql('postgres',
	"SELECT count(projcache.get('k' || i)) FROM generate_series(1, 2000) AS i");
ok( $cache->poll_query_until(
		'postgres',
		"SELECT count(*) = 2000 FROM projcache.entries WHERE state = 'enabled'"),
	'2,000 keys are cached');
is($cache->safe_psql('postgres', 'SELECT count(*) FROM public.grants'),
	'500', 'the snapshot is loaded');
ok( $cache->poll_query_until(
		'postgres', 'SELECT last_dump_keys = 2000 FROM projcache.stats'),
	'a periodic dump holds them');

# -- The source goes down, the cache server restarts ---------------------
$source->stop;
$cache->restart;
wait_for_worker($cache);
# A dump written before the first read must carry the unread rows over.
ok( $cache->poll_query_until(
		'postgres', 'SELECT last_dump_at IS NOT NULL FROM projcache.stats'),
	'a dump is written after the restart, before any snapshot read');

# Eight rounds of every key and the snapshot both ways, as eight clients
# would read them, while the source is down.
my ($null_reads, $snap_errors, $snap_reads) = (0, 0, 0);
for my $round (1 .. 8)
{
	$null_reads += $cache->safe_psql('postgres',
		"SELECT count(*) FROM generate_series(1, 2000) AS i WHERE projcache.get('k' || i) IS NULL");
	for my $sql (
		'SELECT count(*) FROM public.grants',
		q{SELECT count(*) FROM projcache.snapshot('grants') AS g(user_id int, audience text)},
		'SELECT audience FROM public.grants WHERE user_id = 42')
	{
		my ($rc, $out, $err) = $cache->psql('postgres', $sql);
		$snap_reads++;
		if ($rc != 0 || $out eq '' || $out eq '0')
		{
			$snap_errors++;
			diag("snapshot read failed: $sql: $err");
		}
	}
}
is($null_reads, 0, 'no key cached before the restart reads NULL while the source is down');
is($snap_errors, 0, "no snapshot read of $snap_reads fails while the source is down");
is( $cache->safe_psql(
		'postgres', 'SELECT loaded_keys, loaded_snapshots FROM projcache.stats'),
	'2000|1', 'stats: what was loaded at start');
is( $cache->safe_psql(
		'postgres',
		"SELECT status, rows, age > interval '2s' FROM projcache.snapshots WHERE name = 'grants'"),
	'failing|500|t',
	'the snapshot serves its last good rows, older than its TTL, while refreshes fail');

# -- The source comes back: everything is fresh again --------------------
$source->start;
# (Each poll reads first, then looks: reads are what ask for a refresh.)
ok( $cache->poll_query_until(
		'postgres', q{
SELECT count(projcache.get('k' || i)) = 2000
       AND (SELECT count(*) = 2000 FROM projcache.entries WHERE freshness = 'fresh')
  FROM generate_series(1, 2000) AS i}),
	'the keys are fresh again once the source is back');
ok( $cache->poll_query_until(
		'postgres', q{
SELECT (SELECT count(*) FROM public.grants) = 500
       AND (SELECT status = 'fresh' FROM projcache.snapshots WHERE name = 'grants')}),
	'and so is the snapshot');

# -- A dropped registration's rows are not loaded ------------------------
$cache->safe_psql('postgres',
	q{SELECT projcache.create_snapshot('gone', 'SELECT 1 AS old_row', '1h')});
is($cache->safe_psql('postgres',
		q{SELECT old_row FROM projcache.snapshot('gone') AS g(old_row int)}),
	'1', 'the snapshot to drop is loaded');
my $written = $cache->safe_psql('postgres', 'SELECT last_dump_at FROM projcache.stats');
ok( $cache->poll_query_until(
		'postgres', "SELECT last_dump_at > '$written' FROM projcache.stats"),
	'and dumped');
$cache->safe_psql('postgres', q{
SELECT projcache.drop_snapshot('gone');
SELECT projcache.create_snapshot('gone', 'SELECT 2 AS new_row', '1h');
});
# A crash: no dump at exit, the last periodic one still holds "gone".
$cache->stop('immediate');
$cache->start;
wait_for_worker($cache);
is($cache->safe_psql('postgres',
		q{SELECT new_row FROM projcache.snapshot('gone') AS g(new_row int)}),
	'2', 'the snapshot created again under the name gets its own rows, not the dropped one\'s');

# -- A standby dumps and reloads its own caches --------------------------
$cache->backup('bk');
my $standby = PostgreSQL::Test::Cluster->new('standby');
$standby->init_from_backup($cache, 'bk', has_streaming => 1);
$standby->start;
$cache->wait_for_catchup($standby);
$standby->safe_psql('postgres',
	"SELECT count(projcache.get('k' || i)) FROM generate_series(1, 100) AS i");
ok( $standby->poll_query_until(
		'postgres',
		"SELECT count(*) >= 100 FROM projcache.entries WHERE state = 'enabled'"),
	'the standby caches keys');
$standby->restart;
ok( $standby->poll_query_until(
		'postgres', 'SELECT loaded_keys >= 100 FROM projcache.stats'),
	'after its restart, the standby loaded its own dump');

# A loaded key invalidated on the primary follows the standby's rules: once
# the commit is replayed the worker refetches it, unread; a loaded key not
# invalidated stays as loaded until it is read.
my $loaded_at = "SELECT fetched_at FROM projcache.entries WHERE key = '%s'";
my $k5_loaded = $standby->safe_psql('postgres', sprintf($loaded_at, 'k5'));
my $k6_loaded = $standby->safe_psql('postgres', sprintf($loaded_at, 'k6'));
isnt($k5_loaded, '', 'the standby loaded k5 from its dump');
$cache->safe_psql('postgres', "SELECT projcache.invalidate('k5')");
$cache->wait_for_catchup($standby);
ok( $standby->poll_query_until(
		'postgres',
		"SELECT fetched_at > '$k5_loaded' AND freshness = 'fresh'
		   FROM projcache.entries WHERE key = 'k5'"),
	'a loaded key invalidated through WAL is refetched once its commit is replayed');
is($standby->safe_psql('postgres', sprintf($loaded_at, 'k6')),
	$k6_loaded, 'a loaded key not invalidated is not refetched unread');
is( $standby->safe_psql(
		'postgres',
		"SELECT count(*) FROM generate_series(1, 100) AS i WHERE projcache.get('k' || i) IS NULL"),
	'0', 'and serves those keys');

log_shows_no_crash($cache);
log_shows_no_crash($standby);
$standby->stop;
$cache->stop;
$source->stop;
done_testing();
