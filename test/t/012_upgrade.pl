# Copyright (c) 2026, projcache developers
#
# Upgrading from 1.0: CREATE EXTENSION projcache VERSION '1.0', then
# ALTER EXTENSION projcache UPDATE TO '1.2.1' (1.0 -> 1.1.1 -> 1.2 -> 1.2.1,
# through the direct update to 1.1.1, which does what 1.0 -> 1.0.1 -> 1.1
# -> 1.1.1 does), compared with a fresh 1.2.1; then every way on to 1.3,
# compared with a fresh 1.3, and to 1.4, the default version, compared
# with a fresh 1.4 (at the end; there is no projcache--1.4.sql: a fresh
# 1.4 is projcache--1.3.1.sql, then projcache--1.3.1--1.4.sql).
#
# - The newest library serves a database whose SQL is still 1.0: a snapshot
#   registered and read there loads.
# - The update binds each 1.0 registration to a view (search_path =
#   pg_catalog), owned by its owner; one that cannot be bound (its table
#   was dropped, which 1.0 allowed) keeps why, and its reads fail with that.
# - Afterwards the extension's objects, their ACLs and the registry's
#   columns equal a fresh install's, a registration equals one made on a
#   fresh install, and the grants a DBA made on the 1.0 objects survive,
#   also on stats() and entries(), which 1.1 drops and creates again with
#   new columns.
# - The update keeps what the server has cached: keys read (get(key, wait))
#   while the SQL was 1.0 are still in projcache.entries with the same
#   revision, and reading them afterwards is a hit that calls no fetch
#   function; the 1.0 registrations keep their rows (id, query, owner,
#   created_at...).
# - The check against a fresh install covers each member's description and
#   ACL (proacl, relacl, fdwacl, srvacl...) and initial privileges
#   (pg_init_privs), the schema's ACL, and psql's \dx and \dx+ projcache,
#   version line included; also each member's definition (functions,
#   views, the registry's columns, defaults, constraints and indexes) and
#   description, and the configuration tables pg_dump dumps.
# - The other ways to 1.2.1 give the same: through the direct update from
#   1.0.1, from 1.1, from 1.1.1, from 1.2, and the single steps 1.0 ->
#   1.0.1 -> 1.1 -> 1.1.1 -> 1.2 -> 1.2.1.
# - From 1.2.1 on the views read functions of versioned names
#   (entries_1_2_1(), ...), and the update keeps the unversioned ones: views
#   that a non-owner role made in 1.2 on projcache.entries() and on the
#   entries view (and on stats(), snapshots(), lookup()) do not block the
#   update to 1.2.1 and work after it, as the role's reads of the
#   extension's views do (the grants on a function behind a view are
#   copied to its new name).  A fresh install has the unversioned
#   functions too; the DBA grants on the new names what the update copies.
# - From 1.1.1 (and from 1.0, 1.0.1 and 1.1, through it) the update to
#   1.3.1 is the direct projcache--1.1.1--1.3.1.sql, which drops nothing:
#   such views made on 1.1.1 (which stopped its update to 1.2, dropping
#   entries() and stats()) do not block it and work after it, and the
#   entries view shows the cache column.  Each of those ways equals a
#   fresh install of the default version, 1.4 (through 1.3.1).

use strict;
use warnings;

use FindBin;
use lib $FindBin::RealBin;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use ProjcacheTest;
use Test::More;

my $node = projcache_node('upgrade');

# The key cache is the server's, whatever the database: the worker runs the
# fetch function in "postgres" (projcache.database), a get() in old_db
# reads and fills the same cache.
create_local_upstream($node);
$node->safe_psql(
	'postgres', q{
INSERT INTO public.upstream (key, revision, config)
SELECT 'upg-' || i, 'r' || i, jsonb_build_object('id', i)
FROM generate_series(1, 3) AS i;
});
set_fetch_function($node, 'public.fetch');
my @keys = map { "upg-$_" } 1 .. 3;
my $keylist = join(', ', map { "'$_'" } @keys);

$node->safe_psql('postgres',
	'CREATE ROLE app; CREATE ROLE snap_owner; CREATE ROLE ops; CREATE ROLE monitor');
for my $db ('old_db', 'fresh_db')
{
	$node->safe_psql('postgres', "CREATE DATABASE $db");
}

# What a DBA does on either version: a table, the owner's rights, the
# application's grants.
my $common = q{
CREATE TABLE public.grants (user_id int, audience text);
INSERT INTO public.grants VALUES (1, 'billing'), (2, 'support');
CREATE TABLE public.gone (x int);
GRANT SELECT ON public.grants, public.gone TO snap_owner;
GRANT USAGE ON SCHEMA projcache TO app, snap_owner;
GRANT EXECUTE ON FUNCTION projcache.get(text), projcache.snapshot(text)
	TO app;
-- (create_snapshot has one more argument in 1.1: named without its arguments)
GRANT EXECUTE ON FUNCTION projcache.create_snapshot, projcache.snapshot(text)
	TO snap_owner;
GRANT EXECUTE ON FUNCTION projcache.stats(), projcache.entries() TO app;
GRANT SELECT ON projcache.stats, projcache.entries TO app;
-- A grant by a role holding the grant option, and one to a built-in role.
GRANT USAGE ON SCHEMA projcache TO ops, monitor;
GRANT EXECUTE ON FUNCTION projcache.stats() TO ops WITH GRANT OPTION;
SET ROLE ops;
GRANT EXECUTE ON FUNCTION projcache.stats() TO monitor;
RESET ROLE;
GRANT SELECT ON projcache.stats TO pg_monitor;
};

# On a fresh 1.2.1, the same grants on the functions the views read: what
# the update copies there from the unversioned functions.
my $common_versioned = q{
GRANT EXECUTE ON FUNCTION projcache.stats_1_2_1(), projcache.entries_1_2_1() TO app;
GRANT EXECUTE ON FUNCTION projcache.stats_1_2_1() TO ops WITH GRANT OPTION;
SET ROLE ops;
GRANT EXECUTE ON FUNCTION projcache.stats_1_2_1() TO monitor;
RESET ROLE;
};

# ---------------------------------------------------------------------------
# 1.0 SQL, served by the new library.
# ---------------------------------------------------------------------------
$node->safe_psql('old_db', "CREATE EXTENSION projcache VERSION '1.0'");
is($node->safe_psql('old_db',
		"SELECT extversion FROM pg_extension WHERE extname = 'projcache'"),
	'1.0', 'old_db is at 1.0');
$node->safe_psql('old_db', $common);
$node->safe_psql(
	'old_db', q{
SET ROLE snap_owner;
SELECT projcache.create_snapshot('grants',
	'SELECT user_id, audience FROM public.grants', '1h');
SELECT projcache.create_snapshot('gone', 'SELECT x FROM public.gone', '1h');
});
is( $node->safe_psql(
		'old_db', q{
SET ROLE snap_owner;
SELECT string_agg(user_id || ':' || audience, ',' ORDER BY user_id)
  FROM projcache.snapshot('grants') AS g(user_id int, audience text)}),
	'1:billing,2:support',
	'the new library serves a snapshot of the 1.0 SQL');

# 1.0 kept no dependency: the table of "gone" can be dropped under it.
$node->safe_psql('old_db', 'DROP TABLE public.gone');

# Keys cached through the 1.0 SQL.  get(key, '5s') asks for them; whether
# they arrived within those 5 s on a busy machine, the entries tell.
$node->safe_psql('old_db',
	"SELECT projcache.get(k, '5s') FROM unnest(ARRAY[$keylist]) AS k");
ok( $node->poll_query_until(
		'old_db', qq{
SELECT count(*) = 3 FROM projcache.entries
 WHERE key IN ($keylist) AND state = 'enabled' AND fetch_state = 'complete'
   AND revision = 'r' || substr(key, 5)}),
	'keys read through the 1.0 SQL are cached');
is( $node->safe_psql(
		'old_db',
		"SELECT string_agg(k || '=' || projcache.get(k)::text, ',' ORDER BY k)"
		  . " FROM unnest(ARRAY[$keylist]) AS k"),
	'upg-1={"id": 1},upg-2={"id": 2},upg-3={"id": 3}',
	'get() of the 1.0 SQL reads them');

# What the update must not change.  (fetched_at is derived from the
# monotonic clock at display time and may move by a millisecond.)
my $entries_query = qq{
SELECT key, state, freshness, fetch_state, revision, value_bytes, attempts
  FROM projcache.entries WHERE key IN ($keylist) ORDER BY key};
my $counters_query = q{
SELECT fetch_calls, fetch_requests, fetched_keys, hits, misses, pending_reads
  FROM projcache.stats};
my $registry_query = q{
SELECT name, id, query, ttl, owner, column_names, column_types, readers,
       created_at
  FROM projcache.snapshot_registry ORDER BY name};
my $entries_before = $node->safe_psql('old_db', $entries_query);
my $registry_before = $node->safe_psql('old_db', $registry_query);
my $snapshots_before = $node->safe_psql('old_db',
	'SELECT name, owner, ttl FROM projcache.snapshots ORDER BY name');
my $calls_before = calls_count($node);
my ($fetch_calls_before, $fetch_requests_before, $fetched_keys_before,
	$hits_before, $misses_before, $pending_before)
  = split /\|/, $node->safe_psql('old_db', $counters_query);

# ---------------------------------------------------------------------------
# The update.
# ---------------------------------------------------------------------------
my ($rc, $out, $err) =
  $node->psql('old_db', "ALTER EXTENSION projcache UPDATE TO '1.2.1'");
is($rc, 0, "ALTER EXTENSION projcache UPDATE TO '1.2.1' succeeds");
like($err, qr/snapshot "gone" could not be bound to a view/,
	'the registration that cannot be bound is reported');
is($node->safe_psql('old_db',
		"SELECT extversion FROM pg_extension WHERE extname = 'projcache'"),
	'1.2.1', 'old_db is at 1.2.1');

# ---------------------------------------------------------------------------
# What the server had cached, and the registrations, survive the update.
# ---------------------------------------------------------------------------
is($node->safe_psql('old_db', $entries_query),
	$entries_before,
	'the keys cached before the update are still cached, same revisions');
is( $node->safe_psql(
		'old_db',
		"SELECT count(*) FROM projcache.entries WHERE key IN ($keylist) AND visited"),
	'3',
	'and the 1.1 entries view shows them as read');
is( $node->safe_psql(
		'old_db',
		"SELECT string_agg(k || '=' || projcache.get(k)::text, ',' ORDER BY k)"
		  . " FROM unnest(ARRAY[$keylist]) AS k"),
	'upg-1={"id": 1},upg-2={"id": 2},upg-3={"id": 3}',
	'get() of the 1.2.1 SQL reads them');
is( $node->safe_psql('old_db', $counters_query),
	join('|',
		$fetch_calls_before, $fetch_requests_before, $fetched_keys_before,
		$hits_before + 3, $misses_before, $pending_before),
	'those reads are 3 hits: no miss, no fetch request, no fetch call');
is(calls_count($node), $calls_before,
	'the fetch function was not called because of the update');
is($node->safe_psql('old_db', $entries_query),
	$entries_before, 'and the entries are as they were');

is($node->safe_psql('old_db', $registry_query),
	$registry_before,
	'the 1.0 registrations keep their rows (id, query, owner, created_at...)');
is( $node->safe_psql(
		'old_db', 'SELECT name, owner, ttl FROM projcache.snapshots ORDER BY name'),
	$snapshots_before,
	'projcache.snapshots lists the same snapshots');

is( $node->safe_psql(
		'old_db', q{
SELECT r.view IS NOT NULL, r.bind_error IS NULL, c.relowner::regrole
  FROM projcache.snapshot_registry r
  JOIN pg_class c ON c.oid = r.view
 WHERE r.name = 'grants'}),
	't|t|snap_owner',
	'"grants" is bound to a view owned by its owner');
is( $node->safe_psql(
		'old_db', q{
SELECT view IS NULL, bind_error FROM projcache.snapshot_registry
 WHERE name = 'gone'}),
	't|relation "public.gone" does not exist',
	'"gone" keeps why it could not be bound');

is( $node->safe_psql(
		'old_db', q{
SET ROLE app;
SELECT projcache.get('nothing') IS NULL}),
	't',
	'the DBA grant on get() survives the update');
is( $node->safe_psql(
		'old_db', q{
SET ROLE app;
SELECT refused_reads >= 0 AND evictions_memory >= 0 FROM projcache.stats;
SELECT count(*) >= 0 FROM projcache.entries WHERE visited OR NOT visited}),
	"t\nt",
	'the DBA grants on stats and entries survive their new columns');

is( $node->safe_psql(
		'old_db', q{
SET ROLE snap_owner;
SELECT projcache.create_snapshot('by_user', 'SELECT user_id, audience FROM public.grants',
	'1h', key => 'user_id');
RESET ROLE;
SELECT key_column FROM projcache.snapshot_registry WHERE name = 'by_user';
SELECT projcache.drop_snapshot('by_user')}),
	"\nuser_id\n",
	'the DBA grant on create_snapshot() survives its new key argument');

# Grants made again record their roles: a role holding one cannot be dropped.
($rc, $out, $err) = $node->psql('old_db', 'DROP ROLE app');
like($err, qr/privileges for function projcache\.stats\(\)/,
	'app, granted stats() before the update, cannot be dropped: it holds stats()');
like($err, qr/privileges for view projcache\.entries/,
	'nor the entries view');
($rc, $out, $err) = $node->psql('old_db', 'DROP ROLE snap_owner');
like($err, qr/privileges for function projcache\.create_snapshot\(text,text,interval,text\)/,
	'nor snap_owner, granted create_snapshot() before the update');

# The bound snapshot still serves; its table is now protected.
is( $node->safe_psql(
		'old_db', q{
SET ROLE snap_owner;
SELECT count(*) FROM projcache.snapshot('grants') AS g(user_id int, audience text)}),
	'2',
	'"grants" serves after the update');
($rc, $out, $err) = $node->psql('old_db', 'DROP TABLE public.grants');
like($err, qr/cannot drop table grants because other objects depend on it\n.*DETAIL:  view projcache.snapshot_\d+ depends on table grants/,
	'the table of a bound snapshot can no longer be dropped under it');

($rc, $out, $err) = $node->psql(
	'old_db', q{
\set VERBOSITY verbose
SET ROLE snap_owner;
SELECT * FROM projcache.snapshot('gone') AS g(x int)});
like($err, qr/PC001.*\n.*could not be bound to a view when projcache was updated to 1\.0\.1/,
	'reading the unbound snapshot fails with PC001 and says why');

# pg_dump still tells the DBA's grants from the extension's own.
my ($dump, $dump_err) = run_command(
	[ 'pg_dump', '--schema-only', '-d', $node->connstr('old_db') ]);
like($dump, qr/GRANT ALL ON FUNCTION projcache\.stats\(OUT entries bigint.*fetch_delay_buckets jsonb, OUT dropped_fetches bigint.*last_dump_keys bigint\) TO app;/,
	'pg_dump keeps the grant on stats() made before the update');
like($dump, qr/GRANT SELECT ON TABLE projcache\.entries TO app;/,
	'and the one on the entries view');

# ---------------------------------------------------------------------------
# Equal to a fresh install.
# ---------------------------------------------------------------------------
$node->safe_psql('fresh_db', "CREATE EXTENSION projcache VERSION '1.2.1'");
$node->safe_psql('fresh_db', $common);
$node->safe_psql('fresh_db', $common_versioned);
$node->safe_psql(
	'fresh_db', q{
SET ROLE snap_owner;
SELECT projcache.create_snapshot('grants',
	'SELECT user_id, audience FROM public.grants', '1h');
});

my %compare = (
	'extension members' => q{
SELECT pg_describe_object(classid, objid, objsubid)
  FROM pg_depend
 WHERE refclassid = 'pg_extension'::regclass AND deptype = 'e'
   AND refobjid = (SELECT oid FROM pg_extension WHERE extname = 'projcache')
 ORDER BY 1},
	'function ACLs' => q{
SELECT p.oid::regprocedure, p.proacl FROM pg_proc p
 WHERE p.pronamespace = 'projcache'::regnamespace ORDER BY p.oid::regprocedure::text},
	'relation ACLs' => q{
SELECT c.relname, c.relkind, c.relacl FROM pg_class c
 WHERE c.relnamespace = 'projcache'::regnamespace
   AND c.relname NOT LIKE 'snapshot\_%'
 ORDER BY 1},
	'registry columns' => q{
SELECT attname, atttypid::regtype, attnotnull FROM pg_attribute
 WHERE attrelid = 'projcache.snapshot_registry'::regclass
   AND attnum > 0 AND NOT attisdropped ORDER BY attnum},
	'registration of "grants"' => q{
SELECT r.name, r.ttl, r.owner, r.column_names, r.column_types, r.readers,
       c.relowner::regrole, r.bind_error
  FROM projcache.snapshot_registry r JOIN pg_class c ON c.oid = r.view
 WHERE r.name = 'grants'});

# Every member with its ACL, from the catalog its class names.  A class
# without an ACL column says so, so that a new kind of member shows up.
$compare{'extension members with their ACLs'} = q{
SELECT pg_describe_object(d.classid, d.objid, d.objsubid),
       CASE d.classid
         WHEN 'pg_proc'::regclass THEN
           (SELECT coalesce(proacl::text, 'default') FROM pg_proc WHERE oid = d.objid)
         WHEN 'pg_class'::regclass THEN
           (SELECT coalesce(relacl::text, 'default') FROM pg_class WHERE oid = d.objid)
           || coalesce((SELECT ' columns ' || string_agg(attname || '=' || attacl::text, ' ' ORDER BY attnum)
                          FROM pg_attribute WHERE attrelid = d.objid AND attacl IS NOT NULL), '')
         WHEN 'pg_namespace'::regclass THEN
           (SELECT coalesce(nspacl::text, 'default') FROM pg_namespace WHERE oid = d.objid)
         WHEN 'pg_foreign_data_wrapper'::regclass THEN
           (SELECT coalesce(fdwacl::text, 'default') FROM pg_foreign_data_wrapper WHERE oid = d.objid)
         WHEN 'pg_foreign_server'::regclass THEN
           (SELECT coalesce(srvacl::text, 'default') FROM pg_foreign_server WHERE oid = d.objid)
         WHEN 'pg_type'::regclass THEN
           (SELECT coalesce(typacl::text, 'default') FROM pg_type WHERE oid = d.objid)
         ELSE 'no ACL column in ' || d.classid::regclass::text
       END
  FROM pg_depend d
 WHERE d.refclassid = 'pg_extension'::regclass AND d.deptype = 'e'
   AND d.refobjid = (SELECT oid FROM pg_extension WHERE extname = 'projcache')
 ORDER BY 1};
# What pg_dump takes for the extension's own privileges, to tell the DBA's
# grants from them: the update puts the ACLs of the objects it replaces
# back by hand.
$compare{'initial privileges of the members'} = q{
SELECT pg_describe_object(i.classoid, i.objoid, i.objsubid), i.privtype,
       i.initprivs::text
  FROM pg_init_privs i
 WHERE (i.classoid, i.objoid) IN
       (SELECT classid, objid FROM pg_depend
         WHERE refclassid = 'pg_extension'::regclass AND deptype = 'e'
           AND refobjid = (SELECT oid FROM pg_extension WHERE extname = 'projcache'))
 ORDER BY 1, 2, 3};
# The roles each member depends on: its owner, and those its ACL names.
# DROP ROLE and DROP OWNED go by these.
$compare{'shared dependencies of the members'} = q{
SELECT pg_describe_object(s.classid, s.objid, s.objsubid),
       s.refobjid::regrole, s.deptype
  FROM pg_shdepend s
 WHERE s.dbid = (SELECT oid FROM pg_database WHERE datname = current_database())
   AND (s.classid, s.objid) IN
       (SELECT classid, objid FROM pg_depend
         WHERE refclassid = 'pg_extension'::regclass AND deptype = 'e'
           AND refobjid = (SELECT oid FROM pg_extension WHERE extname = 'projcache'))
 ORDER BY 1, 2, 3};
# The schema is the extension's (relocatable = false), not a member.
$compare{'the schema and its ACL'} = q{
SELECT n.nspname, n.nspowner::regrole, n.nspacl
  FROM pg_extension e JOIN pg_namespace n ON n.oid = e.extnamespace
 WHERE e.extname = 'projcache'};

# What each member is, as the server would write it again: the functions
# (arguments, defaults, result, volatility, parallel safety, strictness,
# rows), the views' queries, the registry's columns with their defaults
# and its constraints and indexes; the descriptions of the members; which
# of them pg_dump dumps the rows of.
$compare{'definitions of the members'} = q{
SELECT pg_describe_object(d.classid, d.objid, d.objsubid),
       CASE d.classid
         WHEN 'pg_proc'::regclass THEN pg_get_functiondef(d.objid)
         WHEN 'pg_class'::regclass THEN
           coalesce(pg_get_viewdef(d.objid), '')
           || coalesce((SELECT string_agg(a.attname || ' ' || format_type(a.atttypid, a.atttypmod)
                                 || CASE WHEN a.attnotnull THEN ' NOT NULL' ELSE '' END
                                 || coalesce(' DEFAULT ' || pg_get_expr(ad.adbin, ad.adrelid), ''),
                                 ', ' ORDER BY a.attnum)
                          FROM pg_attribute a
                          LEFT JOIN pg_attrdef ad ON ad.adrelid = a.attrelid AND ad.adnum = a.attnum
                         WHERE a.attrelid = d.objid AND a.attnum > 0 AND NOT a.attisdropped
                           AND (SELECT relkind FROM pg_class WHERE oid = d.objid) = 'r'), '')
           || coalesce((SELECT ' ' || string_agg(conname || ' ' || pg_get_constraintdef(oid), ' ' ORDER BY conname)
                          FROM pg_constraint WHERE conrelid = d.objid), '')
           || coalesce((SELECT ' ' || string_agg(pg_get_indexdef(indexrelid), ' ' ORDER BY pg_get_indexdef(indexrelid))
                          FROM pg_index WHERE indrelid = d.objid), '')
         WHEN 'pg_foreign_data_wrapper'::regclass THEN
           (SELECT fdwhandler::regproc || ' ' || fdwvalidator::regproc || ' '
                   || coalesce(fdwoptions::text, '') FROM pg_foreign_data_wrapper WHERE oid = d.objid)
         WHEN 'pg_foreign_server'::regclass THEN
           (SELECT coalesce(srvtype, '') || coalesce(srvversion, '') || coalesce(srvoptions::text, '')
              FROM pg_foreign_server WHERE oid = d.objid)
         ELSE ''
       END
  FROM pg_depend d
 WHERE d.refclassid = 'pg_extension'::regclass AND d.deptype = 'e'
   AND d.refobjid = (SELECT oid FROM pg_extension WHERE extname = 'projcache')
 ORDER BY 1};
$compare{'descriptions of the members'} = q{
SELECT pg_describe_object(d.classid, d.objid, d.objsubid), s.description
  FROM pg_depend d
  JOIN pg_description s ON s.classoid = d.classid AND s.objoid = d.objid
 WHERE d.refclassid = 'pg_extension'::regclass AND d.deptype = 'e'
   AND d.refobjid = (SELECT oid FROM pg_extension WHERE extname = 'projcache')
 ORDER BY 1, 2};
$compare{'configuration tables'} = q{
SELECT extconfig::regclass[], extcondition, extrelocatable, extowner::regrole
  FROM pg_extension WHERE extname = 'projcache'};

# Each of what %compare names (or those given) in db, against fresh.
sub equals_fresh
{
	my ($db, $fresh, $label, @what) = @_;
	@what = sort keys %compare unless @what;
	for my $what (@what)
	{
		is($node->safe_psql($db, $compare{$what}),
			$node->safe_psql($fresh, $compare{$what}),
			"$label: $what equal ${fresh}'s");
	}
	return;
}

for my $what (sort keys %compare)
{
	is($node->safe_psql('old_db', $compare{$what}),
		$node->safe_psql('fresh_db', $compare{$what}),
		"$what equal a fresh install's");
}

# psql's own view of both, as text: \dx has the version line, \dx+ the
# members.
my %dx;
for my $db ('old_db', 'fresh_db')
{
	my ($stdout, $stderr) = run_command(
		[
			$node->installed_command('psql'), '-X',
			'-d', $node->connstr($db),
			'-c', '\dx projcache',
			'-c', '\dx+ projcache'
		]);
	is($stderr, '', "psql \\dx+ projcache runs in $db");
	$dx{$db} = $stdout;
}
# (18's \dx has a "Default version" column too)
like($dx{old_db}, qr/^ projcache \| 1\.2\.1 +\|(?: 1\.4 +\|)? projcache \|/m,
	'\dx shows old_db at 1.2.1');
like($dx{old_db}, qr/Objects in extension "projcache"/,
	'\dx+ lists the members');
is($dx{old_db}, $dx{fresh_db}, '\dx and \dx+ projcache equal a fresh install\'s');

# Grantors survive the update too: the grant that ops made, holding the
# grant option, goes when that option is revoked with CASCADE.
is($node->safe_psql('old_db', 'SET ROLE monitor; SELECT count(*) FROM projcache.stats()'),
	'1', 'monitor, granted stats() by ops before the update, calls it');
($rc, $out, $err) = $node->psql('old_db',
	'REVOKE GRANT OPTION FOR EXECUTE ON FUNCTION projcache.stats() FROM ops CASCADE; '
	  . 'SET ROLE monitor; SELECT count(*) FROM projcache.stats()');
like($err, qr/permission denied for function stats/,
	'the grant ops made keeps ops as its grantor: revoking its option cascades to it');

# ---------------------------------------------------------------------------
# The other ways to 1.2.1 end in the same place: the direct updates from
# 1.0.1 and from 1.1 to 1.1.1, then 1.2 and 1.2.1, the updates from 1.1.1
# and from 1.2, and the whole chain of single steps from 1.0.
# Each is compared with the fresh install on what the DBA's grants and a
# registration leave.
# ---------------------------------------------------------------------------
my %paths = (
	'from_101' => [ '1.0.1', [ '1.1.1', '1.2', '1.2.1' ] ],
	'from_11' => [ '1.1', [ '1.1.1', '1.2', '1.2.1' ] ],
	'from_111' => [ '1.1.1', [ '1.2', '1.2.1' ] ],
	'from_12' => [ '1.2', [ '1.2.1' ] ],
	'chain' => [ '1.0', [ '1.0.1', '1.1', '1.1.1', '1.2', '1.2.1' ] ]);
for my $db (sort keys %paths)
{
	my ($from, $steps) = @{ $paths{$db} };
	$node->safe_psql('postgres', "CREATE DATABASE $db");
	$node->safe_psql($db, "CREATE EXTENSION projcache VERSION '$from'");
	$node->safe_psql($db, $common);
	$node->safe_psql($db, "ALTER EXTENSION projcache UPDATE TO '$_'")
	  for @$steps;
	$node->safe_psql(
		$db, q{
SET ROLE snap_owner;
SELECT projcache.create_snapshot('grants',
	'SELECT user_id, audience FROM public.grants', '1h');
});
	my $way = "$from -> " . join(' -> ', @$steps);
	for my $what (sort keys %compare)
	{
		is($node->safe_psql($db, $compare{$what}),
			$node->safe_psql('fresh_db', $compare{$what}),
			"$way: $what equal a fresh install's");
	}
}

# ---------------------------------------------------------------------------
# 1.3 (named caches): each way to 1.2.1 above, updated on to 1.3, equals a
# fresh 1.3 install.
# ---------------------------------------------------------------------------
$node->safe_psql('postgres', 'CREATE DATABASE fresh_13');
$node->safe_psql('fresh_13', "CREATE EXTENSION projcache VERSION '1.3'");
$node->safe_psql('fresh_13', $common);
$node->safe_psql('fresh_13', $common_versioned);
$node->safe_psql(
	'fresh_13', q{
SET ROLE snap_owner;
SELECT projcache.create_snapshot('grants',
	'SELECT user_id, audience FROM public.grants', '1h');
});
for my $db (sort keys %paths)
{
	$node->safe_psql($db, "ALTER EXTENSION projcache UPDATE TO '1.3'");
	equals_fresh($db, 'fresh_13', "$db, then 1.2.1 -> 1.3");
}

# ---------------------------------------------------------------------------
# 1.4, the default version: CREATE EXTENSION without a version installs
# it.  Each way above, updated on from 1.3, equals that fresh install; so
# does the update of each version before 1.2 straight to the default,
# which takes projcache--1.1.1--1.3.1.sql, then projcache--1.3.1--1.4.sql.
# ---------------------------------------------------------------------------
$node->safe_psql('postgres', 'CREATE DATABASE fresh_14');
$node->safe_psql('fresh_14', 'CREATE EXTENSION projcache');
is($node->safe_psql('fresh_14',
		"SELECT extversion FROM pg_extension WHERE extname = 'projcache'"),
	'1.4', 'CREATE EXTENSION projcache installs 1.4');
$node->safe_psql('fresh_14', $common);
$node->safe_psql('fresh_14', $common_versioned);
# What the update copies from entries_1_2_1() to entries_1_3_1().
$node->safe_psql('fresh_14',
	'GRANT EXECUTE ON FUNCTION projcache.entries_1_3_1() TO app');
$node->safe_psql(
	'fresh_14', q{
SET ROLE snap_owner;
SELECT projcache.create_snapshot('grants',
	'SELECT user_id, audience FROM public.grants', '1h');
});
for my $db (sort keys %paths)
{
	$node->safe_psql($db, 'ALTER EXTENSION projcache UPDATE');
	is( $node->safe_psql(
			$db, "SELECT extversion FROM pg_extension WHERE extname = 'projcache'"),
		'1.4', "$db, then 1.3 -> 1.3.1 -> 1.4: at the default version");
	equals_fresh($db, 'fresh_14', "$db, then 1.3 -> 1.3.1 -> 1.4");
}
for my $from ('1.0', '1.0.1', '1.1', '1.1.1')
{
	my $db = 'direct_' . ($from =~ s/\./_/gr);
	$node->safe_psql('postgres', "CREATE DATABASE $db");
	$node->safe_psql($db, "CREATE EXTENSION projcache VERSION '$from'");
	$node->safe_psql($db, $common);
	$node->safe_psql($db, 'ALTER EXTENSION projcache UPDATE');
	is( $node->safe_psql(
			$db, "SELECT extversion FROM pg_extension WHERE extname = 'projcache'"),
		'1.4', "$from -> 1.3.1 -> 1.4: at the default version");
	$node->safe_psql(
		$db, q{
SET ROLE snap_owner;
SELECT projcache.create_snapshot('grants',
	'SELECT user_id, audience FROM public.grants', '1h');
});
	equals_fresh($db, 'fresh_14', "$from -> 1.3.1 -> 1.4");
}

# ---------------------------------------------------------------------------
# Objects of a non-owner role on the extension's functions and views do not
# block the update to 1.4, and work after it: from 1.2 (through 1.2.1
# and 1.3), and from 1.1 and 1.1.1 (through projcache--1.1.1--1.3.1.sql:
# 1.1.1 -> 1.2 dropped entries() and stats(), and such a view made it
# fail).  The role's views keep the columns they were made with, also those
# of all the columns of entries() and stats(), which gain columns.
# ---------------------------------------------------------------------------
my $user_views = q{
SET ROLE viewer;
CREATE VIEW public.my_entries AS SELECT key FROM projcache.entries();
CREATE VIEW public.my_entries_view AS SELECT key, state FROM projcache.entries;
CREATE VIEW public.my_stats AS SELECT hits FROM projcache.stats();
CREATE VIEW public.my_snapshots AS SELECT name, status FROM projcache.snapshots();
CREATE VIEW public.my_snapshots_view AS SELECT name FROM projcache.snapshots;
CREATE VIEW public.my_lookup AS SELECT state FROM projcache.lookup('upg-1');
CREATE VIEW public.my_all_entries AS SELECT * FROM projcache.entries();
CREATE VIEW public.my_all_entries_view AS SELECT * FROM projcache.entries;
CREATE VIEW public.my_all_stats AS SELECT * FROM projcache.stats();
CREATE VIEW public.my_all_stats_view AS SELECT * FROM projcache.stats;
CREATE FUNCTION public.my_count() RETURNS bigint LANGUAGE sql
	BEGIN ATOMIC SELECT count(*) FROM projcache.entries(); END;
RESET ROLE;
};
my $user_reads = q{
SET ROLE viewer;
SELECT count(*) > 0 FROM public.my_entries WHERE key LIKE 'upg-%';
SELECT count(*) > 0 FROM public.my_entries_view WHERE key LIKE 'upg-%';
SELECT count(*) FROM public.my_stats;
SELECT count(*) FROM public.my_snapshots_view WHERE name = 'grants';
SELECT count(*) FROM public.my_snapshots WHERE name = 'grants';
SELECT state FROM public.my_lookup;
SELECT count(*) > 0 FROM public.my_all_entries WHERE key LIKE 'upg-%' AND state IS NOT NULL;
SELECT count(*) > 0 FROM public.my_all_entries_view WHERE key LIKE 'upg-%' AND state IS NOT NULL;
SELECT count(*) FROM public.my_all_stats WHERE hits >= 0;
SELECT count(*) FROM public.my_all_stats_view WHERE hits >= 0;
SELECT public.my_count() > 0;
SELECT count(*) > 0 FROM projcache.entries WHERE key LIKE 'upg-%';
SELECT count(*) FROM projcache.stats;
SELECT count(*) FROM projcache.snapshots WHERE name = 'grants';
};
my $user_reads_out = "t\nt\n1\n1\n1\nenabled\nt\nt\n1\n1\nt\nt\n1\n1";
my $user_columns = q{
SELECT c.relname || ': ' || string_agg(a.attname, ',' ORDER BY a.attnum)
  FROM pg_class c JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum > 0
 WHERE c.relnamespace = 'public'::regnamespace AND c.relkind = 'v'
 GROUP BY c.relname ORDER BY c.relname};

$node->safe_psql('postgres', 'CREATE ROLE viewer');
for my $from ('1.1', '1.1.1', '1.2')
{
	my $db = 'views_' . ($from =~ s/\./_/gr);
	$node->safe_psql('postgres', "CREATE DATABASE $db");
	$node->safe_psql($db, "CREATE EXTENSION projcache VERSION '$from'");
	$node->safe_psql(
		$db, q{
CREATE TABLE public.grants (user_id int, audience text);
GRANT SELECT ON public.grants TO viewer;
GRANT USAGE ON SCHEMA projcache TO viewer;
GRANT CREATE ON SCHEMA public TO viewer;
GRANT EXECUTE ON FUNCTION projcache.entries(), projcache.stats(),
	projcache.snapshots(), projcache.lookup(text, interval),
	projcache.create_snapshot, projcache.snapshot(text) TO viewer;
GRANT SELECT ON projcache.entries, projcache.stats, projcache.snapshots TO viewer;
SET ROLE viewer;
SELECT projcache.create_snapshot('grants', 'SELECT user_id, audience FROM public.grants', '1h');
});
	$node->safe_psql($db, $user_views);
	is($node->safe_psql($db, $user_reads), $user_reads_out,
		"$from: a non-owner role's views on the functions and views read");
	my $columns_before = $node->safe_psql($db, $user_columns);

	my ($rc, $out, $err) =
	  $node->psql($db, 'ALTER EXTENSION projcache UPDATE');
	is($rc, 0, "$from: ALTER EXTENSION projcache UPDATE succeeds with them")
	  or diag($err);
	is( $node->safe_psql(
			$db, "SELECT extversion FROM pg_extension WHERE extname = 'projcache'"),
		'1.4', "$from: updated to 1.4, the default version");
	is($node->safe_psql($db, $user_reads), $user_reads_out,
		"$from: after the update, the role's views and its reads of the extension's views work");
	is($node->safe_psql($db, $user_columns), $columns_before,
		"$from: the role's views keep their columns");
	# (psql, not safe_psql: without the column, the next cases still run)
	($rc, $out, $err) = $node->psql(
		$db, q{
SET ROLE viewer;
SELECT string_agg(DISTINCT cache, ',') FROM projcache.entries WHERE key LIKE 'upg-%'});
	is($out, 'default',
		"$from: the role reads the entries view's cache column (1.3.1)")
	  or diag($err);
	is( $node->safe_psql(
			$db, q{
SELECT string_agg(c.relname || ':' || p.proname, ',' ORDER BY c.relname)
  FROM pg_rewrite r
  JOIN pg_class c ON c.oid = r.ev_class
  JOIN pg_depend d ON d.classid = 'pg_rewrite'::regclass AND d.objid = r.oid
  JOIN pg_proc p ON d.refclassid = 'pg_proc'::regclass AND p.oid = d.refobjid
 WHERE c.relnamespace = 'projcache'::regnamespace}),
		'caches:caches_1_3_1,entries:entries_1_3_1,snapshots:snapshots_1_2_1,stats:stats_1_2_1,'
		  . 'stream_mappings:stream_mappings_1_4,streams:streams_1_4',
		"$from: the extension's views read the versioned functions");
	is( $node->safe_psql(
			$db, q{
SELECT count(*) FROM pg_proc
 WHERE pronamespace = 'projcache'::regnamespace
   AND proname IN ('entries', 'stats', 'snapshots', 'entries_1_2_1', 'stats_1_2_1',
                   'snapshots_1_2_1', 'entries_1_3_1', 'caches_1_3', 'caches_1_3_1',
                   'streams_1_4', 'stream_mappings_1_4', 'create_stream')
   AND aclcontains(proacl, makeaclitem(0, proowner, 'EXECUTE', false))}),
		'0', "$from: none of those functions is PUBLIC's");
	# What the role's objects do not touch: the members, their definitions
	# and descriptions.
	equals_fresh($db, 'fresh_14', "$from, with the role's views",
		'extension members', 'definitions of the members',
		'descriptions of the members', 'configuration tables');
}

$node->stop;
done_testing();
