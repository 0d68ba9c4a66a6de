# Copyright (c) 2026, projcache developers
#
# The named caches' registry (1.3) outside one session: every database's
# readers see it through shared memory, and it survives what the server
# and its data go through.
#
# a. A cache registered in projcache.database shows in projcache.caches of
#    another database, to a role granted it and not to another; a change
#    and a drop show there too (each within the worker's poll of a second:
#    the time measured is printed).
# b. A restart and a crash: the worker publishes the registry again, with
#    its settings and readers, before anything else needs it.
# c. A hot standby: its own worker publishes the replicated registry, and
#    a cache registered on the primary shows there once replayed.
# d. pg_dump: the dump carries the registry's rows, and a server whose
#    projcache.database is the restored database publishes them.
# e. (run before d) A lock queued on the registry does not stop the
#    worker; and on 16 and later, a grant without SET does not make a
#    fetch role.
# f. A relation of the registry's name that projcache did not make is
#    never read.

use strict;
use warnings;

use FindBin;
use lib $FindBin::RealBin;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use ProjcacheTest;
use Test::More;
use Time::HiRes qw(time);

my $node = projcache_node('primary', init => { allows_streaming => 1 });
my ($rc, $out, $err);

$node->safe_psql(
	'postgres', q{
ALTER EXTENSION projcache UPDATE;
CREATE FUNCTION public.flags_fetch(keys text[], revisions text[])
RETURNS TABLE(key text, state text, revision text, config jsonb)
LANGUAGE sql STABLE AS $$
	SELECT k, 'enabled', 'r1', jsonb_build_object('k', k) FROM unnest(keys) k
$$;
CREATE ROLE app_flags LOGIN;
CREATE ROLE app_other LOGIN;
CREATE DATABASE other_db;
});
$node->safe_psql(
	'other_db', q{
CREATE EXTENSION projcache;
GRANT USAGE ON SCHEMA projcache TO app_flags, app_other;
GRANT EXECUTE ON FUNCTION projcache.caches_1_3(), projcache.caches_1_3_1() TO app_flags, app_other;
GRANT SELECT ON projcache.caches TO app_flags, app_other;
});

my $caches_sql = q{SELECT coalesce(string_agg(name || ' ' || coalesce(expiry::text, '-')
	|| ' ' || coalesce(max_memory::text, '-'), ',' ORDER BY name), '') FROM projcache.caches
	WHERE state IN ('open', 'put_aside')};

# What a role sees in projcache.caches of a database, once it equals want
# (30 s at most); the seconds it took.
sub caches_become
{
	my ($n, $db, $role, $want) = @_;
	my $start = time;
	my $got;

	for (1 .. 600)
	{
		$got = $n->safe_psql($db, "SET ROLE $role; $caches_sql");
		last if $got eq $want;
		select(undef, undef, undef, 0.05);
	}
	return ($got, time - $start);
}

# ---------------------------------------------------------------------------
# a. Another database's readers.
# ---------------------------------------------------------------------------
$node->safe_psql(
	'postgres', q{
SELECT projcache.create_cache('flags', 'public.flags_fetch(text[],text[])',
	expiry => '30s', max_memory => 1048576);
SELECT projcache.grant_cache('flags', 'app_flags');
});
my ($got, $took) = caches_become($node, 'other_db', 'app_flags',
	'flags 00:00:30 1048576');
is($got, 'flags 00:00:30 1048576',
	'other_db: the granted role sees the cache registered in projcache.database');
diag(sprintf('registered to seen in another database: %.2f s', $took));
is($node->safe_psql('other_db', "SET ROLE app_other; $caches_sql"),
	'', 'other_db: a role not granted sees no cache');

$node->safe_psql('postgres',
	"SELECT projcache.alter_cache('flags', expiry => '45s')");
($got, $took) = caches_become($node, 'other_db', 'app_flags',
	'flags 00:00:45 1048576');
is($got, 'flags 00:00:45 1048576', 'other_db: a change shows there');
diag(sprintf('changed to seen: %.2f s', $took));

$node->safe_psql(
	'postgres', q{
SELECT projcache.create_cache('gone', 'public.flags_fetch(text[],text[])');
SELECT projcache.grant_cache('gone', 'app_flags');
});
($got) = caches_become($node, 'other_db', 'app_flags',
	'flags 00:00:45 1048576,gone - -');
is($got, 'flags 00:00:45 1048576,gone - -', 'other_db: a second cache shows');
$node->safe_psql('postgres', "SELECT projcache.drop_cache('gone')");
($got, $took) = caches_become($node, 'other_db', 'app_flags',
	'flags 00:00:45 1048576');
is($got, 'flags 00:00:45 1048576', 'other_db: a dropped cache goes');
diag(sprintf('dropped to gone: %.2f s', $took));

# A transaction that rolls back changes nothing.
$node->safe_psql(
	'postgres', q{
BEGIN;
SELECT projcache.create_cache('rolled_back', 'public.flags_fetch(text[],text[])');
SELECT projcache.grant_cache('rolled_back', 'app_flags');
ROLLBACK;
});
$node->safe_psql('postgres',
	"SELECT projcache.alter_cache('flags', max_memory => 2097152)");
($got) = caches_become($node, 'other_db', 'app_flags', 'flags 00:00:45 2097152');
is($got, 'flags 00:00:45 2097152',
	'a rolled back creation is not published, a later change is');
$node->safe_psql('postgres',
	"SELECT projcache.alter_cache('flags', max_memory => 1048576)");
($got) = caches_become($node, 'other_db', 'app_flags', 'flags 00:00:45 1048576');

# ---------------------------------------------------------------------------
# b. Restart and crash.
# ---------------------------------------------------------------------------
for my $how ('fast', 'immediate')
{
	$node->stop($how);
	$node->start;
	($got) = caches_become($node, 'other_db', 'app_flags',
		'flags 00:00:45 1048576');
	is($got, 'flags 00:00:45 1048576',
		"after a $how stop: the registry is published again, with its readers");
}

# ---------------------------------------------------------------------------
# c. A hot standby.
# ---------------------------------------------------------------------------
$node->backup('backup');
my $standby = PostgreSQL::Test::Cluster->new('standby');
$standby->init_from_backup($node, 'backup', has_streaming => 1);
$standby->start;
$node->wait_for_catchup($standby, 'replay');
($got) = caches_become($standby, 'other_db', 'app_flags',
	'flags 00:00:45 1048576');
is($got, 'flags 00:00:45 1048576',
	'standby: its worker publishes the replicated registry');

$node->safe_psql(
	'postgres', q{
SELECT projcache.create_cache('projects', 'public.flags_fetch(text[],text[])',
	expiry => '1min');
SELECT projcache.grant_cache('projects', 'app_flags');
});
$node->wait_for_catchup($standby, 'replay');
($got) = caches_become($standby, 'other_db', 'app_flags',
	'flags 00:00:45 1048576,projects 00:01:00 -');
is($got, 'flags 00:00:45 1048576,projects 00:01:00 -',
	'standby: a cache registered on the primary shows once replayed');
($rc, $out, $err) = $standby->psql('postgres',
	"SELECT projcache.create_cache('on_standby', 'public.flags_fetch(text[],text[])')");
like($err, qr/named caches are changed on the primary/,
	'standby: create_cache is refused there');
$standby->stop;

# ---------------------------------------------------------------------------
# e. A lock queued on the registry does not stop the worker: a transaction
#    holds the registry's lock, a VACUUM FULL queues behind it, and the
#    worker's reload gives up after its lock_timeout instead of waiting, so
#    that the default cache keeps fetching.
# ---------------------------------------------------------------------------
create_local_upstream($node);
$node->safe_psql('postgres',
	q{INSERT INTO public.upstream (key, revision, config) VALUES ('lk', 'r1', '{"lk": 1}')});
set_fetch_function($node, 'public.fetch');
my $holder = start_session($node, 'holder',
	"BEGIN; SELECT projcache.alter_cache('flags', expiry => '50s'); SELECT pg_sleep(20); ROLLBACK;");
ok( $node->poll_query_until(
		'postgres', q{SELECT count(*) > 0 FROM pg_locks
 WHERE relation = 'projcache.cache_registry'::regclass AND mode = 'RowExclusiveLock' AND granted}),
	'a transaction holds the registry\'s lock');
my $log_at = log_offset($node);
my $vacuum = start_session($node, 'vacuum', 'VACUUM FULL projcache.cache_registry');
ok( $node->poll_query_until(
		'postgres', q{SELECT count(*) > 0 FROM pg_locks
 WHERE relation = 'projcache.cache_registry'::regclass AND mode = 'AccessExclusiveLock' AND NOT granted}),
	'a VACUUM FULL waits behind it');
my $gave_up = 0;
for (1 .. 600)
{
	$gave_up = log_since($node, $log_at) =~
	  /could not read the named caches' registry: canceling statement due to lock timeout/;
	last if $gave_up;
	select(undef, undef, undef, 0.05);
}
ok($gave_up, 'the worker\'s reload gives up on the lock');
is($node->safe_psql('postgres', "SELECT projcache.get('lk', '5s')"),
	'{"lk": 1}', 'meanwhile, the default cache fetches a new key');
is( $node->safe_psql(
		'postgres', q{SELECT count(*) FROM pg_locks
 WHERE relation = 'projcache.cache_registry'::regclass AND mode = 'AccessExclusiveLock' AND NOT granted}),
	'1', 'and the VACUUM FULL was still waiting then');
$node->safe_psql('postgres',
	"SELECT pg_cancel_backend(pid) FROM pg_stat_activity WHERE application_name = 'holder'");
wait_session($holder);
wait_session($vacuum);

# On PostgreSQL 16 and later a grant may refuse SET ROLE: such a member may
# not fetch as that role.
if ($node->safe_psql('postgres', 'SHOW server_version_num') >= 160000)
{
	$node->safe_psql(
		'postgres', q{
CREATE ROLE no_set;
GRANT no_set TO app_flags WITH SET FALSE;
GRANT USAGE ON SCHEMA projcache TO app_flags;
GRANT EXECUTE ON FUNCTION projcache.create_cache TO app_flags;
});
	($rc, $out, $err) = $node->psql('postgres',
		"SET ROLE app_flags; SELECT projcache.create_cache('no_set', 'public.flags_fetch(text[],text[])', fetch_role => 'no_set')");
	like($err, qr/role "app_flags" cannot fetch as role "no_set"/,
		'a member without SET on the role cannot name it fetch_role');
}

# ---------------------------------------------------------------------------
# d. pg_dump and a server reading the restored registry.
# ---------------------------------------------------------------------------
my $dump = $node->basedir . '/postgres.sql';
$node->command_ok([ 'pg_dump', '-d', $node->connstr('postgres'), '-f', $dump ],
	'pg_dump of projcache.database');
like(slurp_file($dump), qr/COPY projcache\.cache_registry\b/,
	'the dump carries the data of projcache.cache_registry');
$node->safe_psql('postgres', 'CREATE DATABASE restored');
# The dump says CREATE EXTENSION IF NOT EXISTS without a version: 1.4, the
# default, into an empty database.
($rc, $out, $err) =
  $node->psql('restored', slurp_file($dump), on_error_stop => 0);
is(join("\n", $err =~ /(ERROR:.*)/g),
	'', 'the dump restores into an empty database without an error');
is( $node->safe_psql(
		'restored',
		"SELECT extversion FROM pg_extension WHERE extname = 'projcache'"),
	'1.4', 'the restored extension is at 1.4, the default version');
is( $node->safe_psql(
		'restored',
		q{SELECT name, owner, fetch_function, expiry, readers FROM projcache.cache_registry ORDER BY name}
	),
	"flags|"
	  . $node->safe_psql('postgres', 'SELECT current_user')
	  . "|public.flags_fetch(pg_catalog.text[],pg_catalog.text[])|00:00:45|{app_flags}\n"
	  . "projects|"
	  . $node->safe_psql('postgres', 'SELECT current_user')
	  . "|public.flags_fetch(pg_catalog.text[],pg_catalog.text[])|00:01:00|{app_flags}",
	'restored: the rows keep their owner, function, settings and readers');

# Only the restored database's registry counts once it is projcache.database.
$node->safe_psql('postgres', "SELECT projcache.drop_cache('flags')");
$node->append_conf('postgresql.conf', "projcache.database = 'restored'\n");
$node->restart;
($got) = caches_become($node, 'other_db', 'app_flags',
	'flags 00:00:45 1048576,projects 00:01:00 -');
is($got, 'flags 00:00:45 1048576,projects 00:01:00 -',
	'projcache.database = restored: its rows are the registry (flags, dropped in postgres, is back)');
($rc, $out, $err) = $node->psql('postgres',
	"SELECT projcache.create_cache('x', 'public.flags_fetch(text[],text[])')");
like($err, qr/named caches are registered in database "restored"/,
	'create_cache in postgres, no longer projcache.database, is refused');

# ---------------------------------------------------------------------------
# f. A relation named projcache.cache_registry that is not projcache's own
#    (projcache.database may exist without the extension; its owner can
#    make a schema "projcache" there) is never read by the worker, which
#    would run its owner's code as superuser.
# ---------------------------------------------------------------------------
$node->safe_psql('postgres',
	'CREATE ROLE db_owner LOGIN; CREATE DATABASE fake_db OWNER db_owner');
$node->safe_psql(
	'fake_db', q{
SET ROLE db_owner;
CREATE SCHEMA projcache;
CREATE TABLE projcache.ran (who text);
CREATE FUNCTION projcache.spy() RETURNS text LANGUAGE sql
	AS $$ INSERT INTO projcache.ran VALUES (current_user) RETURNING who $$;
CREATE VIEW projcache.cache_registry AS
SELECT projcache.spy() AS name,
	(SELECT oid FROM pg_catalog.pg_roles WHERE rolname = 'db_owner')::regrole AS owner,
	'x' AS fetch_function, NULL::regrole AS fetch_role,
	NULL::interval AS expiry, NULL::interval AS grace_period,
	NULL::interval AS refresh_interval, NULL::interval AS max_retry_backoff,
	NULL::int4 AS batch_size, NULL::interval AS fetch_timeout,
	NULL::int8 AS max_memory, (SELECT '{}'::oid[])::regrole[] AS readers,
	now() AS created_at;
});
$node->append_conf('postgresql.conf', "projcache.database = 'fake_db'\n");
$node->restart;
my $pid = wait_for_worker($node);
ok( $node->poll_query_until(
		'postgres',
		"SELECT datname = 'fake_db' AND (state = 'idle' OR wait_event = '"
		  . wait_event_of($node, 'projcache worker')
		  . "') FROM pg_stat_activity WHERE pid = $pid"),
	'the worker runs in fake_db and went round its loop (its first reload included)');
is($node->safe_psql('fake_db', 'SELECT count(*) FROM projcache.ran'),
	'0', 'it did not read the relation db_owner made: nothing of db_owner\'s ran');

log_shows_no_crash($node);
$node->stop;
done_testing();
