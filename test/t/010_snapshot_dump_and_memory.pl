# Copyright (c) 2026, projcache developers
#
# Snapshot registrations through pg_dump, snapshots larger than
# projcache.max_memory, and snapshot slots of a dropped database.
#
# a. pg_dump keeps the registry (an extension configuration table, with its
#    id sequence): restored into another database, the snapshot is listed
#    with its TTL, cold, loads the restored table's rows, keeps its readers
#    (and the reader's grants on the extension's objects), and new
#    snapshots can be created there without an id clash.
# b. With projcache.max_memory = 1MB: the cold load of a ~3 MB snapshot
#    fails with PC001 and a detail naming projcache.max_memory, and the
#    snapshot shows as failing; a snapshot that fits loads, and when its
#    source outgrows the limit, a refresh after the TTL warns and keeps
#    serving the last good rows.  memory_used stays within memory_limit,
#    and nothing crashes.
# c. With projcache.max_snapshots = 2: the slots of a dropped database are
#    taken back when another database needs them; once they are all in use
#    again, one more snapshot fails with 53400.

use strict;
use warnings;

use FindBin;
use lib $FindBin::RealBin;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use ProjcacheTest;
use Test::More;

# psql with \set VERBOSITY verbose, so stderr carries the SQLSTATE.
sub psql_verbose_in
{
	my ($node, $db, $sql) = @_;
	my ($stdout, $stderr);
	my $rc = $node->psql(
		$db, "\\set VERBOSITY verbose\n$sql",
		stdout => \$stdout,
		stderr => \$stderr);
	return ($rc, $stdout, $stderr);
}

my $crash = qr/PANIC|TRAP:|terminated by signal|segmentation fault|(?:server process|client backend) .* exited with exit code/i;

# ---------------------------------------------------------------------------
# a. pg_dump and restore of a snapshot registration.
# ---------------------------------------------------------------------------
my $node = projcache_node('dump');

$node->safe_psql('postgres', 'CREATE DATABASE src_db');
$node->safe_psql('postgres', 'CREATE ROLE reader LOGIN');
$node->safe_psql(
	'src_db', q{
CREATE EXTENSION projcache;
CREATE TABLE public.grants (user_id int, audience text);
INSERT INTO public.grants VALUES (1, 'billing'), (2, 'support'), (3, 'admin');
GRANT USAGE ON SCHEMA projcache TO reader;
GRANT EXECUTE ON FUNCTION projcache.snapshot(text) TO reader;
SELECT projcache.create_snapshot('grants',
	'SELECT user_id, audience FROM public.grants', '30s');
SELECT projcache.grant_snapshot('grants', 'reader');
});

my $grants_sql =
  q{SELECT user_id, audience FROM projcache.snapshot('grants') AS g(user_id int, audience text) ORDER BY user_id};
is($node->safe_psql('src_db', $grants_sql),
	"1|billing\n2|support\n3|admin", 'src_db: the snapshot loads its rows');
is( $node->safe_psql(
		'src_db', "SELECT rows, status FROM projcache.snapshots WHERE name = 'grants'"),
	'3|fresh',
	'src_db: the snapshot is fresh with 3 rows');

my $dump = $node->basedir . '/src_db.sql';
$node->command_ok(
	[ 'pg_dump', '-d', $node->connstr('src_db'), '-f', $dump ],
	'pg_dump of src_db');
like(slurp_file($dump), qr/COPY projcache\.snapshot_registry\b/,
	'the dump carries the data of projcache.snapshot_registry');

$node->safe_psql('postgres', 'CREATE DATABASE dst_db');
$node->command_ok(
	[
		'psql', '-X', '-v', 'ON_ERROR_STOP=1', '-d', $node->connstr('dst_db'),
		'-f', $dump
	],
	'the dump restores into dst_db');

# Only in dst_db: a read must show this row, not src_db's cached rows.
$node->safe_psql('dst_db',
	"INSERT INTO public.grants VALUES (4, 'restored-only')");

is( $node->safe_psql(
		'dst_db',
		"SELECT name, ttl, status, rows IS NULL OR rows = 0 FROM projcache.snapshots"),
	'grants|00:00:30|cold|t',
	'dst_db: projcache.snapshots lists grants, ttl 30 s, cold');
is( $node->safe_psql(
		'dst_db',
		"SELECT query, column_names, column_types, owner FROM projcache.snapshot_registry WHERE name = 'grants'"
	),
	'SELECT user_id, audience FROM public.grants|{user_id,audience}|{integer,text}|'
	  . $node->safe_psql('postgres', 'SELECT current_user'),
	'dst_db: the registration keeps its query, columns and owner');
is( $node->safe_psql(
		'dst_db', "SELECT readers FROM projcache.snapshot_registry WHERE name = 'grants'"),
	'{reader}',
	'dst_db: the readers of grants still include reader');

is( $node->safe_psql('dst_db', $grants_sql),
	"1|billing\n2|support\n3|admin\n4|restored-only",
	'dst_db: the snapshot loads the restored table of dst_db');
is( $node->safe_psql('dst_db', $grants_sql),
	$node->safe_psql('dst_db',
		'SELECT user_id, audience FROM public.grants ORDER BY user_id'),
	'dst_db: the snapshot equals the restored table');
is( $node->safe_psql(
		'dst_db', "SELECT rows, status FROM projcache.snapshots WHERE name = 'grants'"),
	'4|fresh',
	'dst_db: now fresh with 4 rows');
is($node->safe_psql('src_db', $grants_sql),
	"1|billing\n2|support\n3|admin",
	'src_db still serves its own rows');

# The grant survived too: reader reads the snapshot in dst_db.
my ($rc, $out, $err) = psql_verbose_in($node, 'dst_db',
	"SET ROLE reader;\nSELECT count(*) FROM projcache.snapshot('grants') AS g(user_id int, audience text);"
);
is($rc, 0, 'dst_db: reader may read grants') or diag($err);
is($out, '4', 'dst_db: reader sees its 4 rows');

# New snapshots in dst_db: the id sequence was restored with the registry.
($rc, $out, $err) = psql_verbose_in(
	$node, 'dst_db', q{
SELECT projcache.create_snapshot('audiences',
	'SELECT DISTINCT audience FROM public.grants', '30s');
SELECT projcache.create_snapshot('users',
	'SELECT user_id FROM public.grants', '30s');
});
is($rc, 0, 'dst_db: two more snapshots are created') or diag($err);
is( $node->safe_psql(
		'dst_db',
		'SELECT count(*), count(DISTINCT id) FROM projcache.snapshot_registry'),
	'3|3',
	'dst_db: three registrations with distinct ids');
is( $node->safe_psql(
		'dst_db',
		"SELECT (SELECT count(*) FROM projcache.snapshot('audiences') AS a(audience text))"
		  . " || '|' || (SELECT count(*) FROM projcache.snapshot('users') AS u(user_id int))"
	),
	'4|4',
	'dst_db: the new snapshots load');
is( $node->safe_psql(
		'dst_db',
		"SELECT string_agg(name || ':' || status, ',' ORDER BY name) FROM projcache.snapshots"),
	'audiences:fresh,grants:fresh,users:fresh',
	'dst_db: all three are fresh');

unlike(slurp_file($node->logfile), $crash, 'dump node: no crash in the log');
$node->stop;

# ---------------------------------------------------------------------------
# b. Snapshots and projcache.max_memory = 1MB.
# ---------------------------------------------------------------------------
$node = projcache_node('memory', conf => "projcache.max_memory = '1MB'\n");

sub memory_ok
{
	my ($node, $when) = @_;
	my ($used, $limit) = split /\|/,
	  $node->safe_psql('postgres',
		'SELECT memory_used, memory_limit FROM projcache.stats');
	ok($used <= $limit, "memory_used ($used) <= memory_limit ($limit) $when");
	return $used;
}

$node->safe_psql(
	'postgres', q{
CREATE TABLE public.big (id int, pad text);
INSERT INTO public.big SELECT i, repeat('x', 100) FROM generate_series(1, 30000) AS i;
CREATE TABLE public.small (id int, pad text);
INSERT INTO public.small SELECT i, repeat('y', 100) FROM generate_series(1, 10) AS i;
SELECT projcache.create_snapshot('big', 'SELECT id, pad FROM public.big', '10s');
SELECT projcache.create_snapshot('small', 'SELECT id, pad FROM public.small', '10s');
});
is( $node->safe_psql('postgres',
		"SELECT pg_total_relation_size('public.big') > 3000000"),
	't', 'the source of "big" takes more than 3 MB');

my $used0 = memory_ok($node, 'at start');
my $offset = log_offset($node);

($rc, $out, $err) = psql_verbose_in($node, 'postgres',
	"SELECT count(*) FROM projcache.snapshot('big') AS b(id int, pad text);");
isnt($rc, 0, 'the cold read of a snapshot larger than max_memory fails');
like($err, qr/ERROR:  PC001: first load of snapshot "big" failed/,
	'with SQLSTATE PC001');
like($err, qr/\nDETAIL:  [^\n]*projcache\.max_memory/,
	'and a DETAIL naming projcache.max_memory');
is( $node->safe_psql(
		'postgres',
		"SELECT status, last_error ~ 'projcache\\.max_memory', refresh_errors FROM projcache.snapshots WHERE name = 'big'"
	),
	'failing|t|1',
	'projcache.snapshots: big is failing, last_error names max_memory');
my $used1 = memory_ok($node, 'after the failed load');
cmp_ok($used1 - $used0, '<', 16384,
	'the failed load left at most its error message in shared memory');

# Still throttled within its TTL: no second load of 3 MB.
($rc, $out, $err) = psql_verbose_in($node, 'postgres',
	"SELECT count(*) FROM projcache.snapshot('big') AS b(id int, pad text);");
like($err, qr/ERROR:  PC001: snapshot "big" unavailable, retry available in/,
	'a second cold read within the TTL is throttled (PC001)');

# A snapshot that fits.
is( $node->safe_psql('postgres',
		"SELECT count(*), sum(id) FROM projcache.snapshot('small') AS s(id int, pad text)"),
	'10|55', 'a small snapshot loads');
is( $node->safe_psql(
		'postgres',
		"SELECT status, rows, refresh_errors FROM projcache.snapshots WHERE name = 'small'"),
	'fresh|10|0', 'and is fresh with 10 rows');
memory_ok($node, 'with the small snapshot loaded');

# Its source outgrows max_memory; after the TTL the refresh fails.
$node->safe_psql('postgres',
	"INSERT INTO public.small SELECT i, repeat('z', 100) FROM generate_series(11, 30000) AS i"
);
advance_clock($node, '11s');
($rc, $out, $err) = psql_verbose_in($node, 'postgres',
	"SELECT count(*), sum(id) FROM projcache.snapshot('small') AS s(id int, pad text);");
is($rc, 0, 'the read after the TTL succeeds') or diag($err);
is($out, '10|55', 'it returns the last good rows (10 rows)');
like($err,
	qr/WARNING:  PC001: refresh of snapshot "small" failed, serving the last good snapshot/,
	'with a WARNING that the refresh failed');
like($err, qr/\nDETAIL:  [^\n]*projcache\.max_memory/,
	'whose DETAIL names projcache.max_memory');
unlike($err, qr/ERROR/, 'and no ERROR');
is( $node->safe_psql(
		'postgres',
		"SELECT rows, refresh_errors, last_error ~ 'projcache\\.max_memory' FROM projcache.snapshots WHERE name = 'small'"
	),
	'10|1|t',
	'projcache.snapshots: small keeps 10 rows, refresh_errors = 1, last_error names max_memory');
memory_ok($node, 'after the failed refresh');

# Within the next TTL the failing source is not queried again.
($rc, $out, $err) = psql_verbose_in($node, 'postgres',
	"SELECT count(*) FROM projcache.snapshot('small') AS s(id int, pad text);");
is($out, '10', 'a read right after serves the last good rows');
unlike($err, qr/WARNING|ERROR/, 'without another refresh attempt');
is( $node->safe_psql('postgres',
		"SELECT refresh_errors FROM projcache.snapshots WHERE name = 'small'"),
	'1', 'refresh_errors stays 1');

# A key still fits: the failures did not leak max_memory away.
is($node->safe_psql('postgres', "SELECT projcache.get('still-room') IS NULL"),
	't', 'a new key can still be created');
memory_ok($node, 'at the end');

unlike(log_since($node, $offset), $crash, 'memory node: no PANIC or TRAP in the log');
$node->stop;

# ---------------------------------------------------------------------------
# c. projcache.max_snapshots = 2 and DROP DATABASE.
# ---------------------------------------------------------------------------
$node = projcache_node('slots', conf => "projcache.max_snapshots = 2\n");
$offset = log_offset($node);

foreach my $db ('d1', 'd2')
{
	$node->safe_psql('postgres', "CREATE DATABASE $db");
	$node->safe_psql($db, 'CREATE EXTENSION projcache');
}
$node->safe_psql(
	'd1', q{
SELECT projcache.create_snapshot('s1', 'SELECT 1 AS n', '1h');
SELECT projcache.create_snapshot('s2', 'SELECT 2 AS n', '1h');
});
is( $node->safe_psql(
		'd1',
		"SELECT (SELECT n FROM projcache.snapshot('s1') AS t(n int)) || '|' || (SELECT n FROM projcache.snapshot('s2') AS t(n int))"
	),
	'1|2',
	'd1: two snapshots loaded, both slots taken');

$node->safe_psql(
	'd2', q{
SELECT projcache.create_snapshot('a', 'SELECT 10 AS n', '1h');
SELECT projcache.create_snapshot('b', 'SELECT 20 AS n', '1h');
SELECT projcache.create_snapshot('c', 'SELECT 30 AS n', '1h');
});
my $too_many =
  qr/ERROR:  53400: too many projcache snapshots in use\n/;
($rc, $out, $err) = psql_verbose_in($node, 'd2',
	"SELECT n FROM projcache.snapshot('a') AS t(n int);");
like($err, $too_many, 'd2: while d1 holds both slots, a read fails with 53400');

# A session stays connected to d1, having read its snapshots.
my $d1_session = $node->background_psql('d1');
is( $d1_session->query_safe(
		"SELECT n FROM projcache.snapshot('s1') AS t(n int)"),
	'1', 'a session in d1 reads s1');
$node->safe_psql('postgres',
	"SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = 'd1'");
ok( $node->poll_query_until(
		'postgres',
		"SELECT count(*) = 0 FROM pg_stat_activity WHERE datname = 'd1'"),
	"d1's sessions are terminated");
$d1_session->quit;
$node->safe_psql('postgres', 'DROP DATABASE d1');

($rc, $out, $err) = psql_verbose_in($node, 'd2',
	"SELECT (SELECT n FROM projcache.snapshot('a') AS t(n int)) || '|' || (SELECT n FROM projcache.snapshot('b') AS t(n int));"
);
is($rc, 0, 'd2: after DROP DATABASE d1, two snapshots load')
  or diag($err);
is($out, '10|20', 'd2: with their rows');
unlike($err, qr/53400/, 'd2: no "too many snapshots" error');
is( $node->safe_psql(
		'd2', "SELECT string_agg(name || ':' || status, ',' ORDER BY name) FROM projcache.snapshots"),
	'a:fresh,b:fresh,c:cold',
	'd2: a and b are fresh, c is cold');

($rc, $out, $err) = psql_verbose_in($node, 'd2',
	"SELECT n FROM projcache.snapshot('c') AS t(n int);");
isnt($rc, 0, 'd2: a third snapshot fails');
like($err, $too_many,
	'with SQLSTATE 53400 "too many projcache snapshots in use"');
is($node->safe_psql('d2',
		"SELECT n FROM projcache.snapshot('a') AS t(n int)"),
	'10', 'd2: the loaded ones keep serving');

unlike(log_since($node, $offset), $crash, 'slots node: no crash in the log');
$node->stop;

done_testing();
