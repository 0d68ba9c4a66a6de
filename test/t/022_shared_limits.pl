# Copyright (c) 2026, projcache developers
#
# Shared limits have a share per role: what one role takes of
# projcache.max_memory or projcache.max_snapshots cannot fail another role's
# or another database's reads.  Every role below is an ordinary one.
#
# a. Snapshots against keys (projcache.max_memory = 8MB, so
#    snapshot_memory = 2MB and snapshot_memory_per_owner = 1MB): an owner
#    reading 13 snapshots of about 760 kB gets one loaded; the others fail,
#    naming projcache.snapshot_memory_per_owner.  A second owner gets its
#    own share; a third finds projcache.snapshot_memory full, and is told
#    so.  Meanwhile an application's 20 keys stay cached, and 100 new keys
#    are created, fetched and kept: the worker evicts nothing.
# b. Snapshot slots (projcache.max_snapshots = 8, so 2 per owner and 4 per
#    database): an owner's third snapshot fails with 53400 naming
#    projcache.max_snapshots_per_owner, which is not counted as a failure
#    of its source, and loads at once when one of the owner's slots is
#    freed.  Two more owners of the same database reach the database's
#    share (53400 naming projcache.max_snapshots_per_database).  Another
#    database's snapshots load all along, and a superuser's too.
# c. Cold keys against snapshots: while a role that may only call get()
#    reads cold keys as fast as it can, and the keys' part of max_memory is
#    full (the worker is held in a fetch, so it cannot evict), every refresh of an ordinary owner's 16 kB snapshot and of a
#    superuser's 400 kB one succeeds and follows its source: the keys'
#    churn neither takes the snapshots' budget nor leaves the area too
#    fragmented for 400 kB of rows.

use strict;
use warnings;

use FindBin;
use lib $FindBin::RealBin;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use ProjcacheTest;
use Test::More;

my $crash = qr/PANIC|TRAP:|terminated by signal|(?:server process|client backend) .* exited with exit code/i;

# psql with \set VERBOSITY verbose in database db; (exit code, out, err).
sub psql_in
{
	my ($node, $db, $sql) = @_;
	my ($stdout, $stderr);
	my $rc = $node->psql(
		$db, "\\set VERBOSITY verbose\n$sql",
		stdout => \$stdout,
		stderr => \$stderr);
	return ($rc, $stdout, $stderr);
}

# What a snapshot owner needs, as the README's ops role has it.
sub owner_grants
{
	my ($roles) = @_;
	return qq{
GRANT USAGE ON SCHEMA projcache TO $roles;
GRANT EXECUTE ON FUNCTION projcache.create_snapshot(text, text, interval, text),
	projcache.snapshot(text), projcache.refresh_snapshot(text),
	projcache.drop_snapshot(text) TO $roles;
GRANT SELECT ON projcache.snapshots TO $roles;
};
}

# As role, read the snapshots named prefix1 .. prefixN (one int column
# and one text column); returns "loaded|failed|the first failure's message".
sub read_all
{
	my ($node, $db, $role, $prefix, $n) = @_;
	return $node->safe_psql(
		$db, qq{
SET ROLE $role;
CREATE TEMP TABLE read_result (loaded int, failed int, first_error text);
DO \$\$
DECLARE
	loaded int := 0;
	failed int := 0;
	first_error text;
BEGIN
	FOR i IN 1..$n LOOP
		BEGIN
			PERFORM count(*) FROM projcache.snapshot('$prefix' || i) AS t(id int, pad text);
			loaded := loaded + 1;
		EXCEPTION WHEN others THEN
			failed := failed + 1;
			IF first_error IS NULL THEN
				first_error := SQLSTATE || ': ' || SQLERRM;
			END IF;
		END;
	END LOOP;
	INSERT INTO read_result VALUES (loaded, failed, first_error);
END \$\$;
SELECT loaded || '|' || failed || '|' || coalesce(first_error, '') FROM read_result;
});
}

# ---------------------------------------------------------------------------
# a. Snapshots against keys.
# ---------------------------------------------------------------------------
# In c, one role fills the keys' part alone: no bound on its keys
# (033_role_fairness.pl tests that bound).
my $node = projcache_node('memory',
	conf => "projcache.max_memory = '8MB'\n"
	  . "projcache.max_keys_per_role = 0\n");
create_local_upstream($node);
set_fetch_function($node, 'public.fetch');
my $pid = wait_for_worker($node);
my $limit = stat_value($node, 'memory_limit');

$node->safe_psql(
	'postgres', q{
INSERT INTO public.upstream (key, revision, config)
SELECT 'app-' || i, 'r1', jsonb_build_object('app', i) FROM generate_series(1, 20) AS i;
INSERT INTO public.upstream (key, revision, config)
SELECT 'new-' || i, 'r1', jsonb_build_object('new', i) FROM generate_series(1, 100) AS i;
CREATE TABLE public.fat (id int, pad text);
INSERT INTO public.fat SELECT i, repeat('x', 600) FROM generate_series(1, 1200) AS i;
CREATE ROLE app LOGIN;
CREATE ROLE hog LOGIN;
CREATE ROLE hog2 LOGIN;
CREATE ROLE hog3 LOGIN;
GRANT USAGE ON SCHEMA projcache TO app;
GRANT EXECUTE ON FUNCTION projcache.get(text), projcache.get(text, interval) TO app;
GRANT SELECT ON public.fat TO hog, hog2, hog3;
} . owner_grants('hog, hog2, hog3'));

ok( $node->poll_query_until(
		'postgres', q{
SELECT count(*) = 20 FROM generate_series(1, 20) AS i
 WHERE projcache.get('app-' || i, '10s') IS NOT NULL}),
	'the application has its 20 keys cached');
my $evicted0 = stat_value($node, 'evictions_memory');

$node->safe_psql('postgres', qq{
SET ROLE hog;
SELECT projcache.create_snapshot('fat' || i, 'SELECT id, pad FROM public.fat', '1h')
  FROM generate_series(1, 13) AS i;
});
my ($loaded, $failed, $first) =
  split /\|/, read_all($node, 'postgres', 'hog', 'fat', 13), 3;
is($loaded, 1, "one of hog's 13 snapshots of about 760 kB loads");
is($failed, 12, 'the other 12 fail');
like($first, qr/^PC001: .*/, 'with the unavailable SQLSTATE');
like( $node->safe_psql(
		'postgres', "SELECT last_error FROM projcache.snapshots WHERE name = 'fat2'"),
	qr/does not fit in the share of projcache\.snapshot_memory of role "hog" \(projcache\.snapshot_memory_per_owner = 1024 kB/,
	"their last_error names hog's share, projcache.snapshot_memory_per_owner");

# A second owner has a share of its own; a third finds the budget full.
$node->safe_psql('postgres', q{
SET ROLE hog2;
SELECT projcache.create_snapshot('other1', 'SELECT id, pad FROM public.fat', '1h');
SET ROLE hog3;
SELECT projcache.create_snapshot('third1', 'SELECT id, pad FROM public.fat', '1h');
});
is( read_all($node, 'postgres', 'hog2', 'other', 1),
	'1|0|', "a second owner's snapshot loads, in its own share");
($loaded, $failed, $first) =
  split /\|/, read_all($node, 'postgres', 'hog3', 'third', 1), 3;
is($failed, 1, "a third owner's snapshot finds projcache.snapshot_memory full");
like( $node->safe_psql(
		'postgres', "SELECT last_error FROM projcache.snapshots WHERE name = 'third1'"),
	qr/does not fit in projcache\.snapshot_memory \(2048 kB of projcache\.max_memory/,
	'and its last_error says so');
cmp_ok( $node->safe_psql('postgres',
		'SELECT sum(bytes) FROM projcache.snapshots'),
	'<=', 2 * 1024 * 1024, 'the snapshots hold at most projcache.snapshot_memory');

# The keys: all still there, and new ones are created and kept.
# Read until cached: a new key that finds no room is created by a later read.
ok( $node->poll_query_until(
		'postgres', q{
SELECT count(projcache.get('new-' || i)) = 100 FROM generate_series(1, 100) AS i}),
	'100 new keys are created and fetched while snapshots hold their budget');
is( $node->safe_psql(
		'postgres', q{
SET ROLE app;
SELECT count(*) FROM generate_series(1, 20) AS i
 WHERE projcache.get('app-' || i) IS NOT NULL}),
	'20', "the application's 20 keys are all still cached");
is( $node->safe_psql(
		'postgres',
		"SELECT count(*) FROM projcache.entries WHERE key LIKE 'new-%' OR key LIKE 'app-%'"),
	'120', 'and so are the 100 new ones');
is(stat_value($node, 'evictions_memory'), $evicted0,
	'the worker evicted no key for lack of memory');
cmp_ok(stat_value($node, 'memory_used'), '<=', $limit,
	'memory_used is within memory_limit');

# ---------------------------------------------------------------------------
# c. Cold keys against snapshot refreshes (on the same server, once the
#    owners above dropped their snapshots).
# ---------------------------------------------------------------------------
$node->safe_psql('postgres', q{
SET ROLE hog;
SELECT projcache.drop_snapshot('fat' || i) FROM generate_series(1, 13) AS i;
SET ROLE hog2;
SELECT projcache.drop_snapshot('other1');
SET ROLE hog3;
SELECT projcache.drop_snapshot('third1');
RESET ROLE;
CREATE TABLE public.small (id int, pad text);
INSERT INTO public.small SELECT i, repeat('s', 120) FROM generate_series(1, 100) AS i;
CREATE TABLE public.wide (id int, pad text);
INSERT INTO public.wide SELECT i, repeat('w', 600) FROM generate_series(1, 640) AS i;
GRANT SELECT ON public.small TO hog;
CREATE TABLE public.stop_flood ();
CREATE ROLE flooder LOGIN;
GRANT USAGE ON SCHEMA projcache TO flooder;
GRANT EXECUTE ON FUNCTION projcache.get(text) TO flooder;
GRANT SELECT ON public.stop_flood TO flooder;
SET ROLE hog;
SELECT projcache.create_snapshot('small', 'SELECT id, pad FROM public.small', '1h');
RESET ROLE;
SELECT projcache.create_snapshot('wide', 'SELECT id, pad FROM public.wide', '1h');
});
is( $node->safe_psql('postgres', q{
SET ROLE hog;
SELECT count(*) FROM projcache.snapshot('small') AS t(id int, pad text);
RESET ROLE;
SELECT count(*) FROM projcache.snapshot('wide') AS t(id int, pad text);
}),
	"100\n640", 'an ordinary owner\'s 16 kB snapshot and a superuser\'s 400 kB one load');

my $flood = start_session(
	$node, 'flooder', q{
SET ROLE flooder;
DO $$
BEGIN
	FOR i IN 1..10000000 LOOP
		PERFORM projcache.get('cold-' || i);
		IF i % 1000 = 0 AND EXISTS (SELECT FROM public.stop_flood) THEN
			EXIT;
		END IF;
	END LOOP;
END $$;
},
	# it lasts through the steps below (on a cassert build, longer than
	# one poll's timeout)
	timeout => 6 * $PostgreSQL::Test::Utils::timeout_default);
# The keys' part has filled once the worker evicts for memory.  Whether a
# read is refused meanwhile depends on which of the flood and the worker
# is faster (a build with assertions makes the reads slower); it is
# asserted below, with the worker held so that it cannot make room.
ok( $node->poll_query_until(
		'postgres',
		"SELECT evictions_memory > $evicted0 FROM projcache.stats"),
	'the cold reads have filled the keys\' part of max_memory');

# The worker is then held inside a fetch (public.fetch reads public.gate),
# so that it cannot evict: the keys' part stays full for as long as the
# gate is shut.
my $gate = $node->background_psql('postgres');
$gate->query_safe('BEGIN');
$gate->query_safe('LOCK public.gate IN ACCESS EXCLUSIVE MODE');
ok( $node->poll_query_until(
		'postgres',
		"SELECT count(*) = 1 FROM pg_locks WHERE relation = 'public.gate'::regclass AND NOT granted"),
	'the worker waits inside a fetch');
my $refused1 = stat_value($node, 'refused_reads');
ok( $node->poll_query_until(
		'postgres', "SELECT refused_reads > $refused1 FROM projcache.stats"),
	'and cold reads still find no room');

my $refreshes = $node->safe_psql(
	'postgres', q{
CREATE TEMP TABLE refresh_result (ok int, failed int);
DO $$
DECLARE
	ok int := 0;
	failed int := 0;
BEGIN
	FOR n IN 1..10 LOOP
		UPDATE public.small SET id = id + 1000;
		UPDATE public.wide SET id = id + 1000;
		COMMIT;
		SET ROLE hog;
		IF projcache.refresh_snapshot('small') THEN ok := ok + 1; ELSE failed := failed + 1; END IF;
		RESET ROLE;
		IF projcache.refresh_snapshot('wide') THEN ok := ok + 1; ELSE failed := failed + 1; END IF;
	END LOOP;
	INSERT INTO refresh_result VALUES (ok, failed);
END $$;
SELECT ok || '|' || failed FROM refresh_result;
SELECT refused_reads > 0 FROM projcache.stats;
SELECT count(*) FROM pg_stat_activity WHERE application_name = 'flooder' AND state = 'active';
});
is($refreshes, "20|0\nt\n1",
	'while the cold reads went on, all 20 refreshes succeeded');

# What the accounting relies on: the keys' churn leaves free runs of pages
# long enough for the snapshots' budget.  With the keys' part still full,
# a superuser's 1.5 MB snapshot (most of what the budget has left) loads.
$node->safe_psql('postgres', q{
CREATE TABLE public.huge (id int, pad text);
INSERT INTO public.huge SELECT i, repeat('h', 600) FROM generate_series(1, 2400) AS i;
SELECT projcache.create_snapshot('huge', 'SELECT id, pad FROM public.huge', '1h');
});
is( $node->safe_psql('postgres',
		"SELECT count(*) FROM projcache.snapshot('huge') AS t(id int, pad text)"),
	'2400', "with the keys' part full, a 1.5 MB snapshot finds room in the area");
cmp_ok( $node->safe_psql('postgres',
		"SELECT refused_reads FROM projcache.stats"),
	'>', $refused1, 'while cold reads still found none');
$gate->query_safe('COMMIT');
$gate->quit;
is( $node->safe_psql('postgres', q{
SET ROLE hog;
SELECT min(id) FROM projcache.snapshot('small') AS t(id int, pad text);
RESET ROLE;
SELECT min(id) FROM projcache.snapshot('wide') AS t(id int, pad text);
}),
	"10001\n10001", 'and the snapshots followed their sources');
is( $node->safe_psql('postgres',
		'SELECT bool_and(last_error IS NULL) FROM projcache.snapshots'),
	't', 'no snapshot recorded an error');

$node->safe_psql('postgres', 'INSERT INTO public.stop_flood DEFAULT VALUES');
my ($flood_rc, $flood_out, $flood_err) = wait_session($flood);
is($flood_rc, 0, 'the cold reads got no ERROR') or diag($flood_err);
cmp_ok(stat_value($node, 'memory_used'), '<=', $limit,
	'memory_used is within memory_limit');
is(worker_pid($node), $pid, 'the worker kept its pid');
unlike(slurp_file($node->logfile), $crash, 'memory node: no crash in the log');
$node->stop;

# ---------------------------------------------------------------------------
# b. Snapshot slots.
# ---------------------------------------------------------------------------
$node = projcache_node('slots', conf => "projcache.max_snapshots = 8\n");
$node->safe_psql('postgres', 'CREATE DATABASE db2');
$node->safe_psql('db2', 'CREATE EXTENSION projcache');
$node->safe_psql(
	'postgres', q{
CREATE ROLE hog LOGIN;
CREATE ROLE hog2 LOGIN;
CREATE ROLE hog3 LOGIN;
CREATE ROLE other LOGIN;
} . owner_grants('hog, hog2, hog3') . q{
SET ROLE hog;
SELECT projcache.create_snapshot('s' || i, 'SELECT ' || i || ' AS id, ''x'' AS pad', '1h')
  FROM generate_series(1, 8) AS i;
SET ROLE hog2;
SELECT projcache.create_snapshot('t' || i, 'SELECT ' || i || ' AS id, ''x'' AS pad', '1h')
  FROM generate_series(1, 2) AS i;
SET ROLE hog3;
SELECT projcache.create_snapshot('u' || i, 'SELECT ' || i || ' AS id, ''x'' AS pad', '1h')
  FROM generate_series(1, 2) AS i;
});
$node->safe_psql('db2', owner_grants('other') . q{
SET ROLE other;
SELECT projcache.create_snapshot('d' || i, 'SELECT ' || i || ' AS id, ''x'' AS pad', '1h')
  FROM generate_series(1, 2) AS i;
});

($loaded, $failed, $first) =
  split /\|/, read_all($node, 'postgres', 'hog', 's', 8), 3;
is($loaded, 2, "2 of one owner's 8 snapshots load");
like($first,
	qr/^53400: too many projcache snapshots of role "hog" in use$/,
	'the others fail with 53400, naming the role');
my ($rc, $out, $err) = psql_in($node, 'postgres',
	"SET ROLE hog;\nSELECT id FROM projcache.snapshot('s3') AS t(id int, pad text);");
like($err,
	qr/DETAIL:  Its snapshots take 2 snapshot slots, the most one role may take over all databases \(projcache\.max_snapshots_per_owner\)\./,
	'whose detail names projcache.max_snapshots_per_owner');
is( $node->safe_psql('postgres',
		"SELECT status, coalesce(refresh_errors, 0), last_error IS NULL FROM projcache.snapshots WHERE name = 's3'"),
	'cold|0|t', 'the refused read is not counted as a failure of the source');

# A slot the owner frees is its again, at once: no throttling.
$node->safe_psql('postgres', "SET ROLE hog; SELECT projcache.drop_snapshot('s1')");
is( $node->safe_psql('postgres',
		"SET ROLE hog; SELECT id FROM projcache.snapshot('s3') AS t(id int, pad text)"),
	'3', "once hog dropped a loaded snapshot, its refused one loads at once");

is(read_all($node, 'db2', 'other', 'd', 2), '2|0|',
	"another database's snapshots load meanwhile");

# Two more owners of the same database reach the database's share.
is(read_all($node, 'postgres', 'hog2', 't', 2), '2|0|',
	"a second owner's 2 snapshots load");
($loaded, $failed, $first) =
  split /\|/, read_all($node, 'postgres', 'hog3', 'u', 2), 3;
is($loaded, 0, "a third owner's snapshots find the database's share taken");
like($first,
	qr/^53400: too many projcache snapshots of database "postgres" in use$/,
	'with 53400 naming the database');
($rc, $out, $err) = psql_in($node, 'postgres',
	"SET ROLE hog3;\nSELECT id FROM projcache.snapshot('u1') AS t(id int, pad text);");
like($err,
	qr/DETAIL:  Its snapshots take 4 snapshot slots, the most one database may take \(projcache\.max_snapshots_per_database\)\./,
	'whose detail names projcache.max_snapshots_per_database');
is( $node->safe_psql(
		'postgres',
		"SELECT projcache.create_snapshot('mine', 'SELECT 7 AS id, ''x'' AS pad', '1h');")
	  . $node->safe_psql('postgres',
		"SELECT id FROM projcache.snapshot('mine') AS t(id int, pad text)"),
	'7', "a superuser's snapshot is bound by max_snapshots only");

is(read_all($node, 'db2', 'other', 'd', 2), '2|0|',
	"the other database's snapshots still serve");

unlike(slurp_file($node->logfile), $crash, 'slots node: no crash in the log');
$node->stop;

# ---------------------------------------------------------------------------
# A snapshot budget that leaves the keys nothing stops the server at start.
# ---------------------------------------------------------------------------
$node = projcache_node(
	'badconf',
	conf => "projcache.max_memory = '4MB'\nprojcache.snapshot_memory = '4MB'\n",
	start => 0);
ok(!$node->start(fail_ok => 1), 'snapshot_memory = max_memory: the server does not start');
like(slurp_file($node->logfile),
	qr/projcache\.snapshot_memory must be less than projcache\.max_memory/,
	'and the log says why');

done_testing();
