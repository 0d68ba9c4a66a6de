# Copyright (c) 2026, projcache developers
#
# The change streams' registry (1.4) outside one session:
#
# a. Two create_stream racing for the last of projcache.max_streams: the
#    second waits for the first to end, then counts its stream (54000).
# c. create_stream by a role that a DROP ROLE, not yet committed, is
#    dropping: it waits for the DROP ROLE, then finds the role gone and
#    fails; no stream is left with an owner that does not exist.
# b. pg_dump: the dump carries the streams and their mappings (a named
#    cache's, the default cache's, a snapshot's), and restores into an
#    empty database without an error, in an order the foreign keys take:
#    each mapping keeps its stream, its cache's identity (name and
#    created_at) and its snapshot.
# d. The bound on a role's streams, over values of projcache.max_streams
#    (a restart each): each role that is not a superuser owns at most
#    max_streams / 2 (rounded down), two of them as many each, and a
#    superuser takes the rest, up to max_streams.

use strict;
use warnings;

use FindBin;
use lib $FindBin::RealBin;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use ProjcacheTest;
use Test::More;

my $node = projcache_node('primary', conf => "projcache.max_streams = 2\n");
my ($rc, $out, $err);

# ---------------------------------------------------------------------------
# a. The last slot, taken once.
# ---------------------------------------------------------------------------
$node->safe_psql('postgres',
	"SELECT projcache.create_stream('first', 'host=src', 'pub')");
my $a = start_session($node, 'stream_a',
	"BEGIN; SELECT projcache.create_stream('second', 'host=src', 'pub'); SELECT pg_sleep(2); COMMIT;"
);
ok( $node->poll_query_until(
		'postgres',
		"SELECT EXISTS (SELECT FROM pg_stat_activity WHERE application_name = 'stream_a' AND wait_event = 'PgSleep')"
	),
	'a: the first session holds the last slot, uncommitted');
my $b = start_session($node, 'stream_b',
	"SELECT projcache.create_stream('third', 'host=src', 'pub')");
ok( $node->poll_query_until(
		'postgres',
		"SELECT EXISTS (SELECT FROM pg_stat_activity WHERE application_name = 'stream_b' AND wait_event_type = 'Lock')"
	),
	'a: the second waits for the registry\'s totals');
my ($rc_a, $out_a, $err_a) = wait_session($a);
my ($rc_b, $out_b, $err_b) = wait_session($b);
is($rc_a, 0, 'a: the first commits its stream') or diag($err_a);
like($err_b, qr/cannot register more than 2 streams/,
	'a: the second counts it, and is refused');
is($node->safe_psql('postgres', 'SELECT string_agg(name, \',\' ORDER BY name) FROM projcache.streams'),
	'first,second', 'a: two streams, as projcache.max_streams says');
$node->safe_psql('postgres', "SELECT projcache.drop_stream('second')");

# ---------------------------------------------------------------------------
# c. create_stream behind a DROP ROLE of its caller.
# ---------------------------------------------------------------------------
$node->safe_psql(
	'postgres', q{
CREATE ROLE carol LOGIN;
GRANT USAGE ON SCHEMA projcache TO carol;
GRANT EXECUTE ON FUNCTION projcache.create_stream(text, text, text, text) TO carol;
});
my $dropper = $node->background_psql('postgres');
$dropper->query_safe('BEGIN; DROP OWNED BY carol; DROP ROLE carol;');
my $carol = start_session($node, 'stream_carol',
	"SELECT projcache.create_stream('carols', 'host=src password=pw', 'pub')",
	user => 'carol');
ok( $node->poll_query_until(
		'postgres',
		"SELECT EXISTS (SELECT FROM pg_stat_activity a JOIN pg_locks l ON l.pid = a.pid
		   WHERE a.application_name = 'stream_carol' AND a.wait_event_type = 'Lock'
		     AND NOT l.granted AND l.classid = 'pg_authid'::regclass)"
	),
	'c: create_stream waits for the DROP ROLE of its caller');
$dropper->query_safe('COMMIT');
$dropper->quit;
my ($rc_c, $out_c, $err_c) = wait_session($carol);
isnt($rc_c, 0, 'c: create_stream fails once the DROP ROLE commits');
like($err_c, qr/role \d+ was concurrently dropped/,
	'c: ... because its role is gone');
is( $node->safe_psql(
		'postgres',
		"SELECT count(*) FROM projcache.stream_registry WHERE name = 'carols'
		    OR NOT EXISTS (SELECT FROM pg_roles r WHERE r.oid = owner)"),
	'0',
	'c: no stream is left, nor any owner that does not exist');

# ---------------------------------------------------------------------------
# b. pg_dump and restore.
# ---------------------------------------------------------------------------
$node->safe_psql(
	'postgres', q{
CREATE ROLE stream_owner;
CREATE FUNCTION public.fetch(keys text[], revisions text[])
RETURNS TABLE(key text, state text, revision text, config jsonb)
LANGUAGE sql STABLE AS $$
    SELECT k, 'enabled', 'r1', '{}'::jsonb FROM unnest(keys) k
$$;
SELECT projcache.create_cache('orders', 'public.fetch(text[],text[])');
SELECT projcache.create_snapshot('states', 'SELECT 1 AS id');
SELECT projcache.alter_stream('first', 'host=src password=kept_secret', '"Pub One"');
SELECT projcache.stream_table('first', 'public.orders', 'id', 'orders', 'o:');
SELECT projcache.stream_table('first', 'public.orders', 'id');
SELECT projcache.stream_snapshot('first', 'public.states', 'states');
});
my $rows = q{
SELECT s.name, s.owner, s.conninfo, s.publication, m.source_schema,
       m.source_table_name,
       m.key_column, m.cache_name, m.key_prefix,
       m.cache_created_at = c.created_at AS same_cache, n.name AS snapshot
  FROM projcache.stream_mapping_registry m
  JOIN projcache.stream_registry s ON s.id = m.stream_id
  LEFT JOIN projcache.cache_registry c ON c.name = m.cache_name
  LEFT JOIN projcache.snapshot_registry n ON n.id = m.snapshot_id
 ORDER BY m.source_schema, m.source_table_name, m.cache_name NULLS FIRST,
          n.name NULLS FIRST};
my $before = $node->safe_psql('postgres', $rows);
is(scalar(() = $before =~ /\n/g) + 1, 3, 'b: three mappings before the dump');

my $dump = $node->basedir . '/postgres.sql';
$node->command_ok([ 'pg_dump', '-d', $node->connstr('postgres'), '-f', $dump ],
	'b: pg_dump of projcache.database');
like(slurp_file($dump), qr/COPY projcache\.stream_mapping_registry\b/,
	'b: the dump carries the mappings');
$node->safe_psql('postgres', 'CREATE DATABASE restored');
($rc, $out, $err) =
  $node->psql('restored', slurp_file($dump), on_error_stop => 0);
is(join("\n", $err =~ /(ERROR:.*)/g),
	'', 'b: the dump restores into an empty database without an error');
is($node->safe_psql('restored', $rows),
	$before, 'b: the restored mappings keep their stream, cache and snapshot');

# A cache dropped in the restored database takes its mapping along.
$node->safe_psql('restored',
	"DELETE FROM projcache.cache_registry WHERE name = 'orders'");
is( $node->safe_psql(
		'restored',
		'SELECT count(*) FROM projcache.stream_mapping_registry WHERE cache_name IS NOT NULL'),
	'0',
	'b: the restored foreign keys hold');

# ---------------------------------------------------------------------------
# d. The bound on each role's streams.
# ---------------------------------------------------------------------------
$node->safe_psql(
	'postgres', q{
SELECT count(projcache.drop_stream(name)) FROM projcache.streams;
CREATE ROLE dave;
CREATE ROLE erin;
GRANT USAGE ON SCHEMA projcache TO dave, erin;
GRANT EXECUTE ON FUNCTION projcache.create_stream(text, text, text, text) TO dave, erin;
});

# Streams made by the role until one is refused: how many, and the error.
sub fill
{
	my ($role, $max) = @_;
	my ($n, $err) = (0, '');

	while ($n <= $max)
	{
		my ($rc, $out);
		($rc, $out, $err) = $node->psql('postgres',
			"SET ROLE $role; SELECT projcache.create_stream('${role}_$n', 'host=src password=pw', 'pub')"
		);
		last if $rc != 0;
		$n++;
	}
	return ($n, $err);
}

foreach my $max (1, 2, 3, 5)
{
	my $half = int($max / 2);

	$node->append_conf('postgresql.conf', "projcache.max_streams = $max
");
	$node->restart;
	my $registered = 0;
	foreach my $role ('dave', 'erin')
	{
		my ($n, $err) = fill($role, $max);
		is($n, $half, "d: max_streams = $max: $role owns $half");
		$registered += $n;
		like(
			$err,
			$registered < $max
			? qr/role "$role" owns $half streams, the most one role may/
			: qr/cannot register more than $max streams/,
			"d: max_streams = $max: $role is refused the next");
	}
	my ($n, $err) = fill('postgres', $max);
	is($n, $max - 2 * $half,
		"d: max_streams = $max: a superuser takes the rest");
	like(
		$err,
		qr/cannot register more than $max streams/,
		"d: max_streams = $max: then the registry is full");
	$node->safe_psql('postgres',
		'SELECT count(projcache.drop_stream(name)) FROM projcache.streams');
}

$node->stop;
done_testing();
