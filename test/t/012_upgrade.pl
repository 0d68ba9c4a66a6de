# Copyright (c) 2026, projcache developers
#
# Upgrading from 1.0: CREATE EXTENSION projcache VERSION '1.0', then
# ALTER EXTENSION projcache UPDATE (1.0 -> 1.0.1 -> 1.1).
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

use strict;
use warnings;

use FindBin;
use lib $FindBin::RealBin;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use ProjcacheTest;
use Test::More;

my $node = projcache_node('upgrade');

$node->safe_psql('postgres', 'CREATE ROLE app; CREATE ROLE snap_owner');
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

# ---------------------------------------------------------------------------
# The update.
# ---------------------------------------------------------------------------
my ($rc, $out, $err) =
  $node->psql('old_db', 'ALTER EXTENSION projcache UPDATE');
is($rc, 0, 'ALTER EXTENSION projcache UPDATE succeeds');
like($err, qr/snapshot "gone" could not be bound to a view/,
	'the registration that cannot be bound is reported');
is($node->safe_psql('old_db',
		"SELECT extversion FROM pg_extension WHERE extname = 'projcache'"),
	'1.1', 'old_db is at 1.1');

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
like($dump, qr/GRANT ALL ON FUNCTION projcache\.stats\(OUT entries bigint.*hit_ratio double precision\) TO app;/,
	'pg_dump keeps the grant on stats() made before the update');
like($dump, qr/GRANT SELECT ON TABLE projcache\.entries TO app;/,
	'and the one on the entries view');

# ---------------------------------------------------------------------------
# Equal to a fresh install.
# ---------------------------------------------------------------------------
$node->safe_psql('fresh_db', 'CREATE EXTENSION projcache');
$node->safe_psql('fresh_db', $common);
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

for my $what (sort keys %compare)
{
	is($node->safe_psql('old_db', $compare{$what}),
		$node->safe_psql('fresh_db', $compare{$what}),
		"$what equal a fresh install's");
}

$node->stop;
done_testing();
