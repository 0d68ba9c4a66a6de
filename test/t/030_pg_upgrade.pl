# Copyright (c) 2026, projcache developers
#
# pg_upgrade from an older major (15) to this one (18), projcache installed
# in both (scripts/test.sh installs the same tree on each, and gives the
# older one's binaries in PROJCACHE_UPGRADE_FROM; without it, or when it is
# not older, the test is skipped).
#
# On the old server a DBA set up what a user would have: projcache.*
# settings (postgresql.conf and ALTER SYSTEM), a key cache with keys read,
# snapshot registrations (each bound to its view), grants on the
# extension's functions and views, snapshot grants, a foreign table on
# SERVER projcache and a view over it.  Then:
#
# - pg_upgrade --check passes, and the upgrade itself;
# - the configuration files copied over as pg_upgrade's documentation says,
#   the new server reads every projcache.* setting with the same value;
# - the extension is the same version, with the same members, ACLs and
#   initial privileges; the registry keeps its rows and its views; the
#   grants made by the DBA are there;
# - a reader granted a snapshot reads it (snapshot() and the foreign table,
#   also through the view), one not granted is refused with 42501;
# - the key cache starts empty (it is shared memory) and refills: a get()
#   fetches again, then hits;
# - no projcache worker ran while pg_upgrade ran the servers (they run in
#   binary-upgrade mode, where the launcher stays out);
# - a named cache (1.3) made on the old server keeps its registry row, is
#   published, and reads for the role granted it (42501 for another); a
#   database still at 1.2 updates to 1.4, the default version, after the
#   upgrade and reads it.

use strict;
use warnings;

use File::Basename qw(dirname);
use File::Copy qw(copy);
use FindBin;
use lib $FindBin::RealBin;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use ProjcacheTest;
use Test::More;

my $old_bindir = $ENV{PROJCACHE_UPGRADE_FROM};
plan skip_all => 'PROJCACHE_UPGRADE_FROM (an older major\'s bin directory) is not set'
  unless defined $old_bindir && $old_bindir ne '';

my $old = PostgreSQL::Test::Cluster->new('old',
	install_path => dirname($old_bindir));
my $new = PostgreSQL::Test::Cluster->new('new');
plan skip_all => 'PROJCACHE_UPGRADE_FROM is not an older major than this one'
  unless $old->pg_version->major < $new->pg_version->major;
note 'from ' . $old->pg_version . ' to ' . $new->pg_version;

# Both with data checksums: 18's initdb makes them by default, 15's not,
# and pg_upgrade needs the two to agree.
$old->init(extra => ['--data-checksums']);
my $settings = projcache_base_conf() . q{
projcache.database = 'postgres'
projcache.fetch_function = 'public.fetch'
projcache.max_memory = '48MB'
projcache.expiry = '7min'
projcache.max_snapshots = 40
};
$old->append_conf('postgresql.conf', $settings);
$old->start;
$old->safe_psql(
	'postgres', q{
ALTER SYSTEM SET projcache.grace_period = '90s';
ALTER SYSTEM SET projcache.batch_size = 17;
SELECT pg_reload_conf();
CREATE EXTENSION projcache;
});
create_local_upstream($old);
$old->safe_psql(
	'postgres', q{
INSERT INTO public.upstream (key, revision, config)
SELECT 'up-' || i, 'r' || i, jsonb_build_object('id', i)
FROM generate_series(1, 3) AS i;
});
$old->poll_query_until('postgres',
	"SELECT setting = '17' FROM pg_settings WHERE name = 'projcache.batch_size'")
  or die 'the old server did not read ALTER SYSTEM';

# The key cache, filled on the old server.
is( $old->safe_psql(
		'postgres',
		"SELECT string_agg(projcache.get('up-' || i, '10s')::text, ' ' ORDER BY i)
		 FROM generate_series(1, 3) AS i"),
	'{"id": 1} {"id": 2} {"id": 3}',
	'the old server fetched and cached three keys');

# Roles, grants, snapshots, a foreign table and a view, as a DBA makes them.
$old->safe_psql(
	'postgres', q{
CREATE ROLE app LOGIN;
CREATE ROLE snap_owner;
CREATE ROLE ops;
CREATE ROLE outsider LOGIN;
CREATE TABLE public.grants (user_id int, audience text);
INSERT INTO public.grants VALUES (1, 'billing'), (2, 'support'), (3, 'ops');
GRANT SELECT ON public.grants TO snap_owner;
GRANT USAGE ON SCHEMA projcache TO app, snap_owner, ops, outsider;
GRANT EXECUTE ON FUNCTION projcache.get(text), projcache.snapshot(text),
	projcache.stats(), projcache.entries(),
	projcache.stats_1_2_1(), projcache.entries_1_2_1(),
	projcache.entries_1_3_1() TO app;
GRANT SELECT ON projcache.stats, projcache.entries TO app;
GRANT EXECUTE ON FUNCTION projcache.create_snapshot, projcache.grant_snapshot
	TO snap_owner;
GRANT EXECUTE ON FUNCTION projcache.stats() TO ops WITH GRANT OPTION;
GRANT SELECT ON projcache.stats TO pg_monitor;
GRANT EXECUTE ON FUNCTION projcache.snapshot(text) TO outsider;
GRANT USAGE ON FOREIGN SERVER projcache TO ops;
CREATE SCHEMA cached AUTHORIZATION ops;
SET ROLE snap_owner;
SELECT projcache.create_snapshot('grants',
	'SELECT user_id, audience FROM public.grants', '1h', 'user_id');
SELECT projcache.create_snapshot('audiences',
	'SELECT DISTINCT audience FROM public.grants', '1h');
SELECT projcache.grant_snapshot('grants', 'app');
SELECT projcache.grant_snapshot('grants', 'ops');
SELECT projcache.grant_snapshot('audiences', 'app');
RESET ROLE;
SET ROLE ops;
CREATE FOREIGN TABLE cached.grants (user_id int, audience text)
	SERVER projcache OPTIONS (snapshot 'grants');
CREATE VIEW cached.billing AS
	SELECT user_id FROM cached.grants WHERE audience = 'billing';
GRANT USAGE ON SCHEMA cached TO app, outsider;
GRANT SELECT ON cached.grants, cached.billing TO app;
GRANT SELECT ON cached.billing TO outsider;
RESET ROLE;
});
is($old->safe_psql('postgres', 'SET ROLE app; SELECT user_id FROM cached.billing'),
	'1', 'the old server reads the snapshot through the foreign table and its view');

# A named cache (1.3; the old server installed 1.4, the default version)
# granted to app, and a database whose extension is still at 1.2.
$old->safe_psql(
	'postgres', q{
CREATE FUNCTION public.flags_src(keys text[], revisions text[])
RETURNS TABLE(key text, state text, revision text, config jsonb)
LANGUAGE sql STABLE AS $$
	SELECT k, 'enabled', 'r1', jsonb_build_object('flag', k) FROM unnest(keys) k
$$;
SELECT projcache.create_cache('flags', 'public.flags_src(text[],text[])',
	expiry => '10 min'),
	projcache.grant_cache('flags', 'app');
GRANT EXECUTE ON FUNCTION projcache.get(text, interval),
	projcache.caches_1_3(), projcache.caches_1_3_1() TO app;
GRANT EXECUTE ON FUNCTION projcache.get(text) TO outsider;
GRANT SELECT ON projcache.caches TO app;
CREATE DATABASE db12;
});

# A change stream (1.4) of app's, mapped to the named cache, the default
# cache and a snapshot: its owner and its mappings' identities are kept.
my $stream_rows = q{
SELECT s.name || ' ' || s.owner || ' ' || s.publication || ' '
       || m.source_schema || '.' || m.source_table_name || ' '
       || coalesce(m.cache_name, '-') || ' '
       || coalesce((m.cache_created_at = c.created_at)::text, '-') || ' '
       || coalesce(n.name, '-')
  FROM projcache.stream_mapping_registry m
  JOIN projcache.stream_registry s ON s.id = m.stream_id
  LEFT JOIN projcache.cache_registry c ON c.name = m.cache_name
  LEFT JOIN projcache.snapshot_registry n ON n.id = m.snapshot_id
 ORDER BY 1};
$old->safe_psql(
	'postgres', q{
GRANT EXECUTE ON FUNCTION projcache.create_stream(text, text, text, text),
	projcache.stream_table(text, text, text, text, text)
	TO app;
SET ROLE app;
SELECT projcache.create_stream('orders', 'host=src password=pw', 'pub');
RESET ROLE;
SELECT projcache.stream_table('orders', 'public.orders', 'id', 'flags');
SELECT projcache.stream_table('orders', 'public.orders', 'id');
SELECT projcache.stream_snapshot('orders', 'public.grants', 'grants');
});
my $streams_before = $old->safe_psql('postgres', $stream_rows);
is( $streams_before,
	"orders app pub public.grants - - grants\n"
	  . "orders app pub public.orders - - -\n"
	  . "orders app pub public.orders flags true -",
	'the old server has the stream and its three mappings');
$old->safe_psql('db12', "CREATE EXTENSION projcache VERSION '1.2'");

# What the new server must show the same: the settings, the extension's
# members with their ACLs and initial privileges, the registry, the grants.
# Where the majors show the same thing differently, it is compared as
# what it means: an ACL as the privileges it grants, NULL as the default,
# without MAINTAIN (17 gave table owners that new privilege); initial
# privileges only where they differ from the default (the dump of an
# upgrade leaves out an initial ACL that is the default); view definitions
# without the column qualifiers 16 stopped printing; and an extension's
# members without the row types of its relations (17 records those as
# members of their own).
my $helpers = q{
CREATE FUNCTION pg_temp.privs(acl aclitem[]) RETURNS text LANGUAGE sql AS $f$
SELECT coalesce(string_agg(item, ',' ORDER BY item), '-') FROM (
	SELECT CASE a.grantee WHEN 0 THEN 'PUBLIC' ELSE a.grantee::regrole::text END
		|| '=' || a.privilege_type || CASE WHEN a.is_grantable THEN '*' ELSE '' END
		|| '/' || a.grantor::regrole::text AS item
	FROM pg_catalog.aclexplode(acl) AS a
	WHERE a.privilege_type <> 'MAINTAIN') AS i
$f$;
CREATE FUNCTION pg_temp.default_acl(classid oid, objid oid) RETURNS aclitem[]
LANGUAGE sql AS $f$
SELECT CASE classid
	WHEN 'pg_proc'::regclass THEN
		(SELECT acldefault('f', proowner) FROM pg_proc WHERE oid = objid)
	WHEN 'pg_class'::regclass THEN
		(SELECT acldefault((CASE relkind WHEN 'S' THEN 's' ELSE 'r' END)::"char", relowner)
		 FROM pg_class WHERE oid = objid)
	WHEN 'pg_namespace'::regclass THEN
		(SELECT acldefault('n', nspowner) FROM pg_namespace WHERE oid = objid)
	WHEN 'pg_foreign_server'::regclass THEN
		(SELECT acldefault('S', srvowner) FROM pg_foreign_server WHERE oid = objid)
	WHEN 'pg_foreign_data_wrapper'::regclass THEN
		(SELECT acldefault('F', fdwowner) FROM pg_foreign_data_wrapper WHERE oid = objid)
	END
$f$;
};
my %state_sql = (
	settings => q{
SELECT string_agg(name || '=' || setting, ' ' ORDER BY name)
FROM pg_settings WHERE name LIKE 'projcache.%'},
	extension => q{
SELECT extversion || ' ' || extnamespace::regnamespace FROM pg_extension
WHERE extname = 'projcache'},
	members => q{
SELECT string_agg(pg_describe_object(classid, objid, objsubid), E'\n'
	ORDER BY pg_describe_object(classid, objid, objsubid))
FROM pg_depend AS d
WHERE refclassid = 'pg_extension'::regclass AND deptype = 'e'
  AND refobjid = (SELECT oid FROM pg_extension WHERE extname = 'projcache')
  AND NOT (classid = 'pg_type'::regclass AND EXISTS (
	SELECT FROM pg_type AS t LEFT JOIN pg_type AS e ON e.oid = t.typelem
	WHERE t.oid = d.objid AND (t.typrelid <> 0 OR e.typrelid <> 0)))},
	acls => $helpers . q{
SELECT string_agg(what, E'\n' ORDER BY what) FROM (
	SELECT p.oid::regprocedure::text || ' '
		|| pg_temp.privs(coalesce(p.proacl, acldefault('f', p.proowner))) AS what
	FROM pg_proc p WHERE p.pronamespace = 'projcache'::regnamespace
	UNION ALL
	SELECT c.oid::regclass::text || ' ' || pg_temp.privs(coalesce(c.relacl,
		acldefault((CASE c.relkind WHEN 'S' THEN 's' ELSE 'r' END)::"char", c.relowner)))
	FROM pg_class c
	WHERE c.relnamespace IN ('projcache'::regnamespace, 'cached'::regnamespace)
	  AND c.relkind IN ('r', 'v', 'S', 'f', 'm', 'p')
	UNION ALL
	SELECT 'schema projcache ' || pg_temp.privs(coalesce(nspacl, acldefault('n', nspowner)))
	FROM pg_namespace WHERE nspname = 'projcache'
	UNION ALL
	SELECT 'server ' || srvname || ' '
		|| pg_temp.privs(coalesce(srvacl, acldefault('S', srvowner)))
	FROM pg_foreign_server
	UNION ALL
	SELECT 'fdw ' || fdwname || ' '
		|| pg_temp.privs(coalesce(fdwacl, acldefault('F', fdwowner)))
	FROM pg_foreign_data_wrapper) AS a},
	init_privs => $helpers . q{
SELECT string_agg(what, E'\n' ORDER BY what) FROM (
	SELECT pg_describe_object(classoid, objoid, objsubid) || ' '
		|| privtype::text || ' ' || pg_temp.privs(initprivs) AS what
	FROM pg_init_privs
	WHERE pg_describe_object(classoid, objoid, objsubid) ~ 'projcache'
	  AND pg_temp.privs(initprivs)
		<> pg_temp.privs(pg_temp.default_acl(classoid, objoid))) AS i},
	registry => q{
SELECT string_agg(concat_ws(' ', name, id, owner, readers, view,
	coalesce(key_column, '-'), column_names, column_types, ttl,
	coalesce(bind_error, '-'), created_at, query), E'\n' ORDER BY name)
FROM projcache.snapshot_registry},
	snapshots => q{
SELECT string_agg(name || ' ' || owner || ' ' || ttl, E'\n' ORDER BY name)
FROM projcache.snapshots},
	views => q{
SELECT string_agg(view::text || ' ' || pg_get_userbyid(c.relowner) || ' '
	|| regexp_replace(pg_get_viewdef(view), '\m[a-z_][a-z0-9_]*\.', '', 'g'),
	E'\n' ORDER BY name)
FROM projcache.snapshot_registry r JOIN pg_class c ON c.oid = r.view},
	foreign_table => q{
SELECT ftrelid::regclass || ' ' || array_to_string(ftoptions, ',')
FROM pg_foreign_table},
	view => q{
SELECT regexp_replace(pg_get_viewdef('cached.billing'::regclass),
	'\m[a-z_][a-z0-9_]*\.', '', 'g')},
);
my %before;
for my $what (sort keys %state_sql)
{
	$before{$what} = $old->safe_psql('postgres', $state_sql{$what});
	isnt($before{$what}, '', "the old server has $what");
}
like($before{registry}, qr/^audiences \d+ snap_owner \{app\} .*\ngrants \d+ snap_owner \{app,ops\} /,
	'both registrations are in the registry, with their readers');

# What this machine's old major needs before any pg_upgrade to 18, with or
# without projcache: Debian's 15.20 stamps every column it creates with an
# attribute option, pg_attver, that no 18 knows (18.6 rejects it, so the
# restore of a dump with any table fails), and that RESET does not remove.
# The stamps of the user's columns are taken out of the catalog first,
# where there are any.
my $stamped = $old->safe_psql('postgres', q{
SELECT count(*) FROM pg_catalog.pg_attribute
WHERE attrelid >= 16384 AND attoptions IS NOT NULL
  AND pg_catalog.array_to_string(attoptions, ',') ~ '^pg_attver=[0-9]+$'});
if ($stamped > 0)
{
	note "removing the pg_attver stamps of $stamped columns";
	for my $db (split /\n/,
		$old->safe_psql('postgres',
			'SELECT datname FROM pg_database WHERE datallowconn'))
	{
		$old->safe_psql($db, q{
UPDATE pg_catalog.pg_attribute SET attoptions = NULL
WHERE attrelid >= 16384 AND attoptions IS NOT NULL
  AND pg_catalog.array_to_string(attoptions, ',') ~ '^pg_attver=[0-9]+$'});
	}
}

$old->stop;

# ---------------------------------------------------------------------------
# The new server: the same settings (pg_upgrade does not copy configuration
# files: the DBA does, as its documentation says), projcache installed.
# ---------------------------------------------------------------------------
$new->init(extra => ['--data-checksums']);
$new->append_conf('postgresql.conf', $settings);
copy($old->data_dir . '/postgresql.auto.conf',
	$new->data_dir . '/postgresql.auto.conf')
  or die "copying postgresql.auto.conf: $!";

my $new_bindir = $new->config_data('--bindir');
my @upgrade = (
	'pg_upgrade', '--no-sync',
	'-d', $old->data_dir, '-D', $new->data_dir,
	'-b', $old_bindir, '-B', $new_bindir,
	'-s', $new->host, '-p', $old->port, '-P', $new->port);

# pg_upgrade writes its logs in the new data directory, its scripts in the
# current one: a directory of the test's own.
my $workdir = PostgreSQL::Test::Utils::tempdir;
chdir $workdir or die "chdir $workdir: $!";
command_ok([ @upgrade, '--check' ], 'pg_upgrade --check passes');
# --retain keeps pg_upgrade's logs, among them its servers'.
command_ok([ @upgrade, '--retain' ],
	'pg_upgrade from the old major to the new one');
my $server_logs = join '',
  map { slurp_file($_) }
  glob($new->data_dir . '/pg_upgrade_output.d/*/log/pg_upgrade_server.log');
like($server_logs, qr/database system is ready/,
	'pg_upgrade kept the log of the servers it ran');
unlike($server_logs, qr/projcache scheduler|projcache: database/,
	'no projcache worker ran while pg_upgrade ran the servers');

$new->start;

for my $what (sort keys %state_sql)
{
	is($new->safe_psql('postgres', $state_sql{$what}),
		$before{$what}, "the new server has the same $what");
}

# The key cache is shared memory: empty after the upgrade, and it refills.
is($new->safe_psql('postgres', 'SELECT count(*) FROM projcache.entries'),
	'0', 'the key cache starts empty');
my $calls_before = calls_count($new);
is($new->safe_psql('postgres', "SELECT projcache.get('up-2', '10s')"),
	'{"id": 2}', 'a key read after the upgrade is fetched again');
cmp_ok(calls_count($new), '>', $calls_before,
	'the new server ran the fetch function for it');
my $calls_after = calls_count($new);
is($new->safe_psql('postgres', "SELECT projcache.get('up-2')"),
	'{"id": 2}', 'and then it is a hit');
is(calls_count($new), $calls_after, 'the hit ran no fetch function');
is( $new->safe_psql(
		'postgres',
		"SELECT freshness || ' ' || revision FROM projcache.entries WHERE key = 'up-2'"),
	'fresh r2',
	'projcache.entries shows the refilled key');

# Snapshots: loaded on first read, for those granted, through each path.
is( $new->safe_psql(
		'postgres',
		"SET ROLE app; SELECT string_agg(user_id || ':' || audience, ' ' ORDER BY user_id)
		 FROM projcache.snapshot('grants') AS s(user_id int, audience text)"),
	'1:billing 2:support 3:ops',
	'a granted reader reads the snapshot with snapshot()');
is( $new->safe_psql(
		'postgres',
		"SET ROLE app; SELECT audience FROM cached.grants WHERE user_id = 2"),
	'support', 'and through the foreign table, with its key');
is($new->safe_psql('postgres', 'SET ROLE app; SELECT user_id FROM cached.billing'),
	'1', 'and through the view over it');
like(
	$new->safe_psql(
		'postgres',
		"SET ROLE app; EXPLAIN (COSTS OFF) SELECT audience FROM cached.grants WHERE user_id = 2"),
	qr/Snapshot: grants/,
	'EXPLAIN shows the snapshot scan');
is($new->safe_psql('postgres', 'SET ROLE outsider; SELECT user_id FROM cached.billing'),
	'1', 'a view reads the snapshot as its owner (ops, granted)');
my ($rc, $out, $err) = $new->psql('postgres',
	"SET ROLE outsider; SELECT * FROM projcache.snapshot('grants') AS s(user_id int, audience text)",
	extra_params => [ '-v', 'VERBOSITY=verbose' ]);
like($err, qr/42501/, 'a reader not granted the snapshot is refused with 42501');
is( $new->safe_psql(
		'postgres',
		"SELECT status || ' ' || rows FROM projcache.snapshots WHERE name = 'grants'"),
	'fresh 3', 'projcache.snapshots shows the snapshot loaded');

# A new registration on the upgraded server, as before.
$new->safe_psql(
	'postgres', q{
SET ROLE snap_owner;
SELECT projcache.create_snapshot('after', 'SELECT count(*)::int AS n FROM public.grants', '1h');
SELECT projcache.grant_snapshot('after', 'app');
});
is( $new->safe_psql(
		'postgres',
		"SET ROLE app; SELECT n FROM projcache.snapshot('after') AS s(n int)"),
	'3', 'a snapshot registered after the upgrade reads');

# Named caches: the registry came through pg_upgrade, and the worker
# publishes it.  (projcache.caches shows app the cache once it is.)
is( $new->safe_psql(
		'postgres',
		q{SELECT name || ' ' || expiry || ' ' || readers::text FROM projcache.cache_registry}),
	'flags 00:10:00 {app}',
	'the named caches\' registry kept its row');
is($new->safe_psql('postgres', $stream_rows),
	$streams_before,
	'the streams\' registry kept its stream, its owner and its mappings');
my $published = 0;
for (1 .. 600)
{
	$published = $new->safe_psql('postgres',
		"SET ROLE app; SELECT count(*) FROM projcache.caches WHERE name = 'flags' AND state = 'open'"
	);
	last if $published eq '1';
	select(undef, undef, undef, 0.05);
}
is($published, '1', 'the cache is published on the new server');
is( $new->safe_psql(
		'postgres', "SET ROLE app; SELECT projcache.get('flags:dark', '10s')"),
	'{"flag": "dark"}',
	'a role granted the cache reads its key, from its function');
($rc, $out, $err) = $new->psql('postgres',
	"SET ROLE outsider; SELECT projcache.get('flags:dark')",
	extra_params => [ '-v', 'VERBOSITY=verbose' ]);
like($err, qr/42501.*permission denied for cache "flags"/s,
	'a role not granted the cache is refused with 42501');

# The database still at 1.2 after pg_upgrade updates to 1.4, and reads
# the named cache there.
$new->safe_psql('db12', 'ALTER EXTENSION projcache UPDATE');
is( $new->safe_psql(
		'db12', "SELECT extversion FROM pg_extension WHERE extname = 'projcache'"),
	'1.4', 'a database at 1.2 before pg_upgrade updates to 1.4 after it');
$new->safe_psql('db12',
	'GRANT USAGE ON SCHEMA projcache TO app; GRANT EXECUTE ON FUNCTION projcache.get(text, interval) TO app'
);
is( $new->safe_psql(
		'db12', "SET ROLE app; SELECT projcache.get('flags:light', '10s')"),
	'{"flag": "light"}',
	'and the granted role reads the named cache from there');

$new->stop;
done_testing();
