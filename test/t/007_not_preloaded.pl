# Copyright (c) 2026, projcache developers
#
# projcache keeps its caches in shared memory reserved at server start, so
# it only works through shared_preload_libraries.  Without it:
#
# - CREATE EXTENSION projcache fails with SQLSTATE 55000, "projcache must be
#   loaded via shared_preload_libraries" and a hint naming the setting, and
#   leaves nothing behind (no schema, no function, no extension row);
#   loading the library into the session first (LOAD) does not help;
# - an extension created while it was preloaded, whose preload was then
#   taken away, fails the same clean way on every call;
# - adding it and restarting makes CREATE EXTENSION work and the
#   "projcache scheduler" worker appear.
#
# Also: projcache.debug_advance_clock() with projcache.debug_clock off (the
# default) fails with 55000, even for a superuser.

use strict;
use warnings;

use FindBin;
use lib $FindBin::RealBin;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use ProjcacheTest;
use Test::More;

# The SQLSTATE, message and hint of the error $sql raises, caught in
# PL/pgSQL, as "sqlstate|message|hint" (or "no error").
sub caught_error
{
	my ($node, $sql) = @_;
	return $node->safe_psql(
		'postgres', qq{
DO \$do\$
DECLARE st text; msg text; hint text;
BEGIN
	BEGIN
		$sql;
		RAISE NOTICE 'no error';
		RETURN;
	EXCEPTION WHEN others THEN
		GET STACKED DIAGNOSTICS st = RETURNED_SQLSTATE, msg = MESSAGE_TEXT,
			hint = PG_EXCEPTION_HINT;
	END;
	CREATE TEMP TABLE caught AS SELECT st, msg, hint;
END
\$do\$;
SELECT st || '|' || msg || '|' || hint FROM caught;
});
}

# Nothing of the extension exists in the database.
sub leftovers
{
	my ($node) = @_;
	return $node->safe_psql(
		'postgres', q{
SELECT (SELECT count(*) FROM pg_extension WHERE extname = 'projcache')
    || '|' || (SELECT count(*) FROM pg_namespace WHERE nspname = 'projcache')
    || '|' || (SELECT count(*) FROM pg_proc WHERE probin LIKE '%projcache%')
});
}

my $missing = qr/projcache must be loaded via shared_preload_libraries/;

# ---------------------------------------------------------------------------
# A node that does not preload projcache.
# ---------------------------------------------------------------------------
my $node = PostgreSQL::Test::Cluster->new('plain');
$node->init;
$node->start;

my ($rc, $out, $err) = psql_verbose($node, 'CREATE EXTENSION projcache');
isnt($rc, 0, 'CREATE EXTENSION projcache fails without shared_preload_libraries');
like(
	$err,
	qr/ERROR:  55000: projcache must be loaded via shared_preload_libraries\n/,
	'with SQLSTATE 55000 and the documented message');
like($err, qr/\nHINT:  [^\n]*shared_preload_libraries/,
	'and a HINT that names shared_preload_libraries');
unlike($err, qr/XX000|PANIC|server closed the connection/,
	'no internal error, no crash');

is( caught_error($node, 'CREATE EXTENSION projcache'),
	"55000|projcache must be loaded via shared_preload_libraries|"
	  . "Add 'projcache' to shared_preload_libraries in postgresql.conf and restart the server.",
	'caught in PL/pgSQL: SQLSTATE 55000, the message and the hint');

is(leftovers($node), '0|0|0',
	'the failed CREATE EXTENSION leaves no extension, schema or function behind');

# Loading the library into the session later does not make it preloaded.
($rc, $out, $err) =
  psql_verbose($node, "LOAD 'projcache';\nCREATE EXTENSION projcache;");
like($err, qr/ERROR:  55000: $missing/,
	'LOAD then CREATE EXTENSION fails the same way');
is(leftovers($node), '0|0|0', 'and leaves nothing behind either');

# The same in a transaction that goes on: the failure is a plain ERROR.
is( $node->safe_psql(
		'postgres', q{
BEGIN;
SAVEPOINT s;
DO $$ BEGIN CREATE EXTENSION projcache; EXCEPTION WHEN object_not_in_prerequisite_state THEN NULL; END $$;
ROLLBACK TO s;
SELECT 'still usable';
COMMIT;
}),
	'still usable',
	'the error is catchable as object_not_in_prerequisite_state');

is( $node->safe_psql(
		'postgres',
		"SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'projcache scheduler'"
	),
	'0',
	'no projcache worker runs');

# ---------------------------------------------------------------------------
# Preload it (without the test clock) and restart: CREATE EXTENSION works
# and the worker appears.
# ---------------------------------------------------------------------------
$node->append_conf('postgresql.conf',
	"shared_preload_libraries = 'projcache'\n");
$node->restart;

($rc, $out, $err) = psql_verbose($node, 'CREATE EXTENSION projcache');
is($rc, 0, 'with shared_preload_libraries, CREATE EXTENSION projcache works')
  or diag($err);
is( $node->safe_psql(
		'postgres',
		"SELECT extversion = default_version FROM pg_extension, pg_available_extensions WHERE extname = 'projcache' AND name = extname"),
	't',
	'the extension is installed');

my $pid = wait_for_worker($node);
like($pid, qr/^\d+$/, 'the projcache scheduler worker runs');
is( $node->safe_psql(
		'postgres',
		"SELECT backend_type, datname FROM pg_stat_activity WHERE pid = $pid"),
	'projcache scheduler|postgres',
	'it shows in pg_stat_activity as "projcache scheduler", in projcache.database');
is(stat_value($node, 'worker_pid'), $pid,
	'projcache.stats.worker_pid is that worker');

# A key can be read (there is no fetch function: it stays pending).
is($node->safe_psql('postgres', "SELECT projcache.get('k') IS NULL"),
	't', 'projcache.get() works');
ok( $node->poll_query_until(
		'postgres',
		"SELECT last_error = 'projcache.fetch_function is not set' FROM projcache.entries WHERE key = 'k'"
	),
	'the worker handles the key (and says the fetch function is not set)');

# ---------------------------------------------------------------------------
# projcache.debug_clock is off by default: the test clock refuses to move.
# ---------------------------------------------------------------------------
is($node->safe_psql('postgres', 'SHOW projcache.debug_clock'),
	'off', 'projcache.debug_clock is off by default');
($rc, $out, $err) = psql_verbose($node,
	"SELECT projcache.debug_advance_clock('1s')");
isnt($rc, 0, 'debug_advance_clock fails with debug_clock off');
like(
	$err,
	qr/ERROR:  55000: projcache\.debug_clock is off\n/,
	'with SQLSTATE 55000 and "projcache.debug_clock is off"');
like($err, qr/\nHINT:  [^\n]*projcache\.debug_clock = on/,
	'and a HINT saying how to turn it on');
is( caught_error($node, "PERFORM projcache.debug_advance_clock('1s')"),
	"55000|projcache.debug_clock is off|"
	  . "Set projcache.debug_clock = on in postgresql.conf and restart; it is meant for tests only.",
	'caught in PL/pgSQL: SQLSTATE 55000');

# ---------------------------------------------------------------------------
# Preload taken away after CREATE EXTENSION: every call is the same clean
# 55000, and the server keeps running.
# ---------------------------------------------------------------------------
$node->adjust_conf('postgresql.conf', 'shared_preload_libraries', "''");
$node->restart;

foreach my $sql ("SELECT projcache.get('k')",
	"SELECT * FROM projcache.lookup('k')",
	'SELECT * FROM projcache.stats',
	'SELECT * FROM projcache.entries',
	"SELECT projcache.evict('k')")
{
	($rc, $out, $err) = psql_verbose($node, $sql);
	like($err, qr/ERROR:  55000: $missing/,
		"without the preload, \"$sql\" fails with 55000");
}
is( $node->safe_psql(
		'postgres',
		"SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'projcache scheduler'"
	),
	'0',
	'no worker runs without the preload');

$node->adjust_conf('postgresql.conf', 'shared_preload_libraries',
	"'projcache'");
$node->restart;
isnt(wait_for_worker($node), '', 'preloaded again: the worker is back');
is($node->safe_psql('postgres', "SELECT entries FROM projcache.stats"),
	'0', 'and projcache works again (an empty cache after the restart)');

my $log = slurp_file($node->logfile);
unlike($log, qr/PANIC|TRAP:|terminated by signal|segmentation fault/i,
	'the server log shows no crash');

$node->stop;
done_testing();
