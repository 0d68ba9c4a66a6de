# Copyright (c) 2026, projcache developers
#
# Snapshot load workers: where a load may start, when it ends, and how
# many may run.  Every snapshot here is created and read by non-superuser
# roles.
#
# a. Nested loads (node "nested", max_connections = 8).  A snapshot whose
#    query refreshes another snapshot fails as a source failure, with the
#    inner load refused; the reader's backend is left sound:
#    pg_blocking_pids() on it, from another role, returns at once (1.1:
#    it looped forever holding every lock-manager partition lock), and
#    more sessions than max_connections doing the same one after another
#    leak no PGPROC (1.1: logins failed after 7).  Variants: the inner load
#    through projcache.snapshot() of a cold snapshot (the inner snapshot is
#    not throttled by the refusal), and through a PL/pgSQL function that
#    catches the error and shows its SQLSTATE 0A000.  A PARALLEL SAFE
#    wrapper around snapshot() under force_parallel_mode fails with 25000,
#    not XX000.
# b. The load ends with its reader (node "load"): a reader ended by
#    pg_terminate_backend, and a reader whose client disconnects, each
#    take their load worker with them.
# c. statement_timeout ends a load: one set on the database (which the
#    reader's SET statement_timeout = 0 does not lift), one set by the
#    session, and one set by a function's SET clause (which arms no timer
#    in the reader).  None of them counts as a refresh error or throttles
#    the cold start.
# d. Bounds: one role cannot take every load slot
#    (projcache.max_load_workers_per_role): others still load.  No free
#    slot, from max_worker_processes or from projcache.max_load_workers, is
#    53400 and does not throttle: the next read after a slot frees up loads
#    at once.

use strict;
use warnings;

use FindBin;
use lib $FindBin::RealBin;

use IPC::Run;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use ProjcacheTest;
use Test::More;

my $load_type = q{backend_type = 'projcache snapshot load'};

# psql as a role, with VERBOSITY verbose: (exit code, stdout, stderr).
sub psql_as
{
	my ($node, $role, $sql, %opts) = @_;
	my ($stdout, $stderr, $timed_out);
	my $rc = $node->psql(
		$opts{db} // 'postgres',
		"\\set VERBOSITY verbose\n$sql",
		stdout => \$stdout,
		stderr => \$stderr,
		timeout => $opts{timeout} // 90,
		timed_out => \$timed_out,
		extra_params => [ '-U', $role ]);
	return (-1, '', 'timed out') if $timed_out;
	return ($rc, $stdout, $stderr);
}

# A background psql, as a role, with an application_name to find it by;
# sql is one statement or a list of them, each sent by itself (-c each).
sub start_as
{
	my ($node, $role, $appname, $sql, %opts) = @_;
	my %session = (stdout => '', stderr => '');
	my @commands = map { ('-c', $_) } (ref $sql ? @$sql : ($sql));

	$session{harness} = IPC::Run::start(
		[
			$node->installed_command('psql'), '-XAtq',
			'-v', 'ON_ERROR_STOP=1', '-v', 'VERBOSITY=verbose',
			'-d',
			$node->connstr($opts{db} // 'postgres')
			  . " user=$role application_name=$appname",
			@commands
		],
		'<', \undef,
		'>', \$session{stdout},
		'2>', \$session{stderr},
		IPC::Run::timeout(400));
	return \%session;
}

sub load_workers
{
	my ($node) = @_;
	return $node->safe_psql('postgres',
		"SELECT count(*) FROM pg_stat_activity WHERE $load_type");
}

sub wait_load_workers
{
	my ($node, $n, $what) = @_;
	ok( $node->poll_query_until(
			'postgres',
			"SELECT count(*) = $n FROM pg_stat_activity WHERE $load_type"),
		$what);
	return;
}

# End every load worker left over, so that the next step starts clean.
sub end_all_loads
{
	my ($node) = @_;
	$node->safe_psql('postgres',
		"SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE $load_type OR application_name LIKE 'load_%'"
	);
	$node->poll_query_until('postgres',
		"SELECT NOT EXISTS (SELECT FROM pg_stat_activity WHERE $load_type OR application_name LIKE 'load_%')"
	);
	return;
}

sub grant_snapshot_use
{
	my ($node, $db, @roles) = @_;
	for my $r (@roles)
	{
		$node->safe_psql(
			$db, qq{
GRANT USAGE ON SCHEMA projcache TO $r;
GRANT EXECUTE ON FUNCTION projcache.create_snapshot(text, text, interval, text),
	projcache.snapshot(text), projcache.refresh_snapshot(text) TO $r;
GRANT SELECT ON projcache.snapshots TO $r;
});
	}
	return;
}

# ---------------------------------------------------------------------------
# a. Nested loads.
# ---------------------------------------------------------------------------
my $nested = projcache_node(
	'nested',
	conf => "max_connections = 8\nsuperuser_reserved_connections = 1\n");
$nested->safe_psql('postgres',
	'CREATE ROLE ops LOGIN; CREATE ROLE watcher LOGIN; CREATE SCHEMA s AUTHORIZATION ops'
);
grant_snapshot_use($nested, 'postgres', 'ops');
$nested->safe_psql(
	'postgres', q{
SET ROLE ops;
SELECT projcache.create_snapshot('in', 'SELECT 1 AS x');
SELECT projcache.create_snapshot('out', $$SELECT projcache.refresh_snapshot('in') AS r$$);
SELECT projcache.create_snapshot('in2', 'SELECT 2 AS x');
SELECT projcache.create_snapshot('out2', $$SELECT x FROM projcache.snapshot('in2') AS t(x int)$$);
CREATE FUNCTION s.probe() RETURNS text LANGUAGE plpgsql AS $$
BEGIN
	PERFORM projcache.refresh_snapshot('in');
	RETURN 'loaded';
EXCEPTION WHEN OTHERS THEN
	RETURN SQLSTATE || ' ' || SQLERRM;
END
$$;
SELECT projcache.create_snapshot('probe', 'SELECT s.probe() AS outcome');
});

# The reproduction, from a session that stays connected afterwards.
my $reader = start_as($nested, 'ops', 'nested_reader',
	[ "SELECT projcache.refresh_snapshot('out')", 'SELECT pg_sleep(300)' ]);
ok( $nested->poll_query_until(
		'postgres', q{
SELECT wait_event = 'PgSleep' FROM pg_stat_activity
 WHERE application_name = 'nested_reader'}),
	'a: the reader of the nested snapshot went on to its next statement');
my ($rc, $out, $err) = psql_as(
	$nested, 'watcher', q{
SET statement_timeout = '20s';
SELECT pg_blocking_pids(pid) FROM pg_stat_activity
 WHERE application_name = 'nested_reader'},
	timeout => 60);
is($rc, 0, 'a: pg_blocking_pids() on that backend, from another role, returns');
# Otherwise it loops holding every lock-manager partition lock: nothing
# else here could connect.
die 'pg_blocking_pids() did not return: the lock manager is wedged'
  if $rc == -1;
is($out, '{}', 'a: and says it is blocked by nobody');
$nested->safe_psql('postgres',
	"SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = 'nested_reader'"
);
wait_session($reader);
ok( $nested->poll_query_until(
		'postgres',
		"SELECT NOT EXISTS (SELECT FROM pg_stat_activity WHERE application_name = 'nested_reader')"
	),
	'a: the reader ended');
like($reader->{stderr},
	qr/refresh of snapshot "out" failed.*\n.*DETAIL:  snapshot "in" cannot be loaded by the load of another snapshot/,
	'a: the outer load fails as its source does, naming the refused inner load');
is( $nested->safe_psql(
		'postgres',
		"SELECT status, refresh_errors, last_error FROM projcache.snapshots WHERE name = 'out'"
	),
	'failing|1|snapshot "in" cannot be loaded by the load of another snapshot',
	'a: the outer snapshot is failing with that error');

# More sessions than max_connections, one after another: no PGPROC leaks.
my $logins = 0;
for my $i (1 .. 12)
{
	my ($src, $sout, $serr) = psql_as($nested, 'ops',
		"SELECT projcache.refresh_snapshot('out')", timeout => 60);
	last unless $src == 0;
	$logins++;
}
is($logins, 12,
	'a: 12 sessions refreshing the nested snapshot, with max_connections = 8, each logged in and ran'
);
($rc, $out, $err) = psql_as($nested, 'watcher', 'SELECT 1');
is($out, '1', 'a: and a new login of a non-superuser still succeeds');

# The inner load through snapshot() of a cold snapshot.
($rc, $out, $err) = psql_as($nested, 'ops',
	'SELECT * FROM projcache.snapshot(\'out2\') AS t(x int)');
like($err,
	qr/ERROR:  PC001: first load of snapshot "out2" failed\nDETAIL:  snapshot "in2" cannot be loaded by the load of another snapshot/,
	'a: snapshot() of a cold snapshot inside a load is refused; the outer cold load fails with PC001'
);
is( $nested->safe_psql(
		'postgres',
		"SELECT status, refresh_errors, last_attempt_at IS NULL FROM projcache.snapshots WHERE name = 'in2'"
	),
	'cold|0|t',
	'a: the refused inner load neither counts against the inner snapshot nor uses its cold-start window'
);
is( $nested->safe_psql(
		'postgres', q{SET ROLE ops; SELECT x FROM projcache.snapshot('in2') AS t(x int)}),
	'2',
	'a: the inner snapshot loads at once when read directly');

# Through a function that catches the refusal: its SQLSTATE is 0A000.
is( $nested->safe_psql(
		'postgres',
		q{SET ROLE ops; SELECT outcome FROM projcache.snapshot('probe') AS t(outcome text)}),
	'0A000 snapshot "in" cannot be loaded by the load of another snapshot',
	'a: a function in a snapshot query sees the refusal as SQLSTATE 0A000');

# A mislabelled PARALLEL SAFE wrapper: a clear error, not XX000.
$nested->safe_psql(
	'postgres', q{
CREATE FUNCTION s.wrapped(text) RETURNS int LANGUAGE sql PARALLEL SAFE
	AS $$SELECT x FROM projcache.snapshot($1) AS t(x int)$$;
ALTER FUNCTION s.wrapped(text) OWNER TO ops;
});
# (16 renamed force_parallel_mode debug_parallel_query)
my $parallel_guc =
  $nested->pg_version >= 16 ? 'debug_parallel_query' : 'force_parallel_mode';
($rc, $out, $err) = psql_as(
	$nested, 'ops', qq{
SET $parallel_guc = on;
SELECT s.wrapped('in')});
like($err,
	qr/ERROR:  25000: cannot read snapshot "in" during a parallel operation\nHINT:  A function that reads a snapshot must be marked PARALLEL UNSAFE\./,
	'a: a PARALLEL SAFE wrapper around snapshot() under force_parallel_mode fails with 25000'
);
unlike($err, qr/XX000/, 'a: not with XX000');

unlike(slurp_file($nested->logfile),
	qr/PANIC|TRAP:|terminated by signal|(?:server process|client backend) .* exited with exit code/,
	'a: no crash');
$nested->stop('immediate');

# ---------------------------------------------------------------------------
# b. A load ends with its reader.  The launcher, the scheduler and the
#    logical replication launcher take three of max_worker_processes: four
#    are left for loads.
# ---------------------------------------------------------------------------
my $node = projcache_node(
	'load', conf => q{
max_worker_processes = 7
max_parallel_workers = 0
projcache.max_load_workers = 10
projcache.max_load_workers_per_role = 10
});
$node->safe_psql('postgres',
	'CREATE ROLE ops LOGIN; CREATE ROLE hog LOGIN; CREATE ROLE hog2 LOGIN; CREATE ROLE other LOGIN'
);
grant_snapshot_use($node, 'postgres', qw(ops hog hog2 other));
$node->safe_psql('postgres', "SET ROLE ops; SELECT projcache.create_snapshot('slow', 'SELECT 1 AS x FROM pg_sleep(300)', '1h')");
for my $i (1 .. 4)
{
	$node->safe_psql('postgres',
		"SET ROLE hog; SELECT projcache.create_snapshot('hog$i', 'SELECT 1 AS x FROM pg_sleep(300)', '1h')"
	);
}
$node->safe_psql('postgres',
	"SET ROLE hog2; SELECT projcache.create_snapshot('slow_h2', 'SELECT 1 AS x FROM pg_sleep(300)', '1h')"
);
for my $name (qw(quick cold1 cold2))
{
	$node->safe_psql('postgres',
		"SET ROLE other; SELECT projcache.create_snapshot('$name', 'SELECT 7 AS x', '1h')"
	);
}

# b1. pg_terminate_backend of the reader.
my $s = start_as($node, 'ops', 'load_term',
	"SELECT projcache.refresh_snapshot('slow')");
wait_load_workers($node, 1, 'b: a reader\'s load worker runs');
$node->safe_psql('postgres',
	"SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = 'load_term'"
);
wait_load_workers($node, 0,
	'b: the load worker ends when its reader is terminated');
$s->{harness}->kill_kill;
end_all_loads($node);

# b2. The reader's client goes away.
$s = start_as($node, 'ops', 'load_gone',
	"SELECT projcache.refresh_snapshot('slow')");
wait_load_workers($node, 1, 'b: a reader\'s load worker runs again');
$s->{harness}->kill_kill;
ok( $node->poll_query_until(
		'postgres',
		"SELECT NOT EXISTS (SELECT FROM pg_stat_activity WHERE application_name = 'load_gone' OR $load_type)"
	),
	'b: the reader and its load worker end when the client disconnects');
end_all_loads($node);

# ---------------------------------------------------------------------------
# c. statement_timeout.
# ---------------------------------------------------------------------------
$node->safe_psql('postgres', 'CREATE DATABASE tdb');
$node->safe_psql('tdb', 'CREATE EXTENSION projcache');
grant_snapshot_use($node, 'tdb', 'ops');
$node->safe_psql('tdb',
	"SET ROLE ops; SELECT projcache.create_snapshot('slow', 'SELECT 1 AS x FROM pg_sleep(300)', '1h')"
);
$node->safe_psql('tdb', "ALTER DATABASE tdb SET statement_timeout = '2s'");

($rc, $out, $err) = psql_as(
	$node, 'ops', q{
SET statement_timeout = 0;
SELECT * FROM projcache.snapshot('slow') AS t(x int)},
	db => 'tdb');
like($err,
	qr/ERROR:  57014: canceling statement due to statement timeout\nDETAIL:  The load of snapshot "slow" ran for longer than statement_timeout \(2000 ms\)/,
	'c: the database\'s statement_timeout ends a load, though the reader set none');
($rc, $out, $err) = psql_as(
	$node, 'ops', q{
SET statement_timeout = 0;
SELECT * FROM projcache.snapshot('slow') AS t(x int)},
	db => 'tdb');
like($err, qr/ERROR:  57014: canceling statement due to statement timeout/,
	'c: the next cold read loads again: the timeout did not use up its window'
);
is( $node->safe_psql(
		'tdb',
		"SELECT status, refresh_errors, last_error IS NULL FROM projcache.snapshots WHERE name = 'slow'"
	),
	'cold|0|t',
	'c: a timed-out load is not counted as a refresh error');
$node->safe_psql('tdb', 'ALTER DATABASE tdb RESET statement_timeout');
end_all_loads($node);

($rc, $out, $err) = psql_as(
	$node, 'ops', q{
SET statement_timeout = '2s';
SELECT projcache.refresh_snapshot('slow')});
like($err, qr/ERROR:  57014: canceling statement due to statement timeout/,
	'c: the session\'s statement_timeout ends a refresh');
wait_load_workers($node, 0, 'c: and its load worker');

$node->safe_psql(
	'postgres', q{
CREATE FUNCTION public.refresh_within(text) RETURNS boolean LANGUAGE sql
	SET statement_timeout = '2s'
	AS $$SELECT projcache.refresh_snapshot($1)$$;
});
($rc, $out, $err) = psql_as($node, 'ops',
	"SELECT public.refresh_within('slow')");
like($err,
	qr/ERROR:  57014: canceling statement due to statement timeout\nDETAIL:  The load of snapshot "slow" ran for longer than statement_timeout \(2000 ms\)/,
	'c: a statement_timeout set by a function\'s SET clause ends the load');
wait_load_workers($node, 0, 'c: and its load worker');
is( $node->safe_psql(
		'postgres',
		"SELECT refresh_errors FROM projcache.snapshots WHERE name = 'slow'"),
	'0',
	'c: neither timeout counts as a refresh error');
end_all_loads($node);

# ---------------------------------------------------------------------------
# d. Bounds.  Four load slots are left by max_worker_processes; with at
#    most two per role, a role refreshing four snapshots at once gets two.
# ---------------------------------------------------------------------------
$node->safe_psql('postgres',
	"ALTER SYSTEM SET projcache.max_load_workers_per_role = 2; SELECT pg_reload_conf()"
);
ok( $node->poll_query_until(
		'postgres', "SELECT current_setting('projcache.max_load_workers_per_role') = '2'"),
	'd: the per-role bound is 2');
my @hogs;
for my $i (1 .. 4)
{
	push @hogs,
	  start_as($node, 'hog', "load_hog$i",
		"SELECT projcache.refresh_snapshot('hog$i')");
}
wait_load_workers($node, 2, 'd: a role refreshing four snapshots at once gets two loads');
ok( $node->poll_query_until(
		'postgres',
		"SELECT count(*) = 2 FROM pg_stat_activity WHERE application_name LIKE 'load_hog%'"
	),
	'd: and the other two of its refreshes fail at once');
my %running = map { $_ => 1 } split /\n/,
  $node->safe_psql('postgres',
	"SELECT application_name FROM pg_stat_activity WHERE application_name LIKE 'load_hog%'"
  );
my $refused = '';
for my $i (1 .. 4)
{
	next if $running{"load_hog$i"};
	my @result = wait_session($hogs[ $i - 1 ]);
	$refused .= $result[2];
}
like($refused,
	qr/ERROR:  53400: no load worker is free for snapshot "hog\d"\nDETAIL:  role "hog" has 2 snapshot loads running, and projcache.max_load_workers_per_role is 2/,
	'd: with 53400, naming the role\'s bound');
is( $node->safe_psql(
		'postgres',
		"SELECT sum(refresh_errors) FROM projcache.snapshots WHERE name LIKE 'hog_'"),
	'0',
	'd: the refused refreshes are not counted as refresh errors');
is( $node->safe_psql(
		'postgres', "SET ROLE other; SELECT projcache.refresh_snapshot('quick')"),
	't',
	'd: another role still loads');

# No free max_worker_processes slot: hog2 takes the last two.
$node->safe_psql('postgres',
	"ALTER SYSTEM SET projcache.max_load_workers_per_role = 10; SELECT pg_reload_conf()"
);
ok( $node->poll_query_until(
		'postgres', "SELECT current_setting('projcache.max_load_workers_per_role') = '10'"),
	'd: no per-role bound now');
my $h2a = start_as($node, 'hog2', 'load_h2a', "SELECT projcache.refresh_snapshot('slow_h2')");
my $h2b = start_as($node, 'hog2', 'load_h2b', "SELECT projcache.refresh_snapshot('slow_h2')");
wait_load_workers($node, 4,
	'd: every load slot of max_worker_processes is taken');
($rc, $out, $err) = psql_as($node, 'other',
	"SELECT x FROM projcache.snapshot('cold1') AS t(x int)");
like($err,
	qr/ERROR:  53400: no load worker is free for snapshot "cold1"\nDETAIL:  no background worker slot is free for the snapshot load; raise max_worker_processes/,
	'd: a cold read that finds no worker slot fails with 53400');
is( $node->safe_psql(
		'postgres',
		"SELECT status, refresh_errors, last_attempt_at IS NULL FROM projcache.snapshots WHERE name = 'cold1'"
	),
	'cold|0|t',
	'd: it is not counted, and it does not use the cold-start window');
$node->safe_psql('postgres',
	"SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = 'load_h2a'"
);
wait_load_workers($node, 3, 'd: a slot frees up');
is( $node->safe_psql(
		'postgres', "SET ROLE other; SELECT x FROM projcache.snapshot('cold1') AS t(x int)"),
	'7',
	'd: the next read loads at once');

# projcache.max_load_workers reached: the same.
$node->safe_psql('postgres',
	"ALTER SYSTEM SET projcache.max_load_workers = 3; SELECT pg_reload_conf()");
ok( $node->poll_query_until(
		'postgres', "SELECT current_setting('projcache.max_load_workers') = '3'"),
	'd: projcache.max_load_workers is 3');
($rc, $out, $err) = psql_as($node, 'other',
	"SELECT x FROM projcache.snapshot('cold2') AS t(x int)");
like($err,
	qr/ERROR:  53400: no load worker is free for snapshot "cold2"\nDETAIL:  3 snapshot loads are running, and projcache.max_load_workers is 3/,
	'd: a cold read past projcache.max_load_workers fails with 53400');
$node->safe_psql('postgres',
	"SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = 'load_h2b'"
);
wait_load_workers($node, 2, 'd: a load slot frees up');
is( $node->safe_psql(
		'postgres', "SET ROLE other; SELECT x FROM projcache.snapshot('cold2') AS t(x int)"),
	'7',
	'd: the next read loads at once');

eval { $_->{harness}->kill_kill } for (@hogs, $h2a, $h2b);
end_all_loads($node);
unlike(slurp_file($node->logfile),
	qr/PANIC|TRAP:|terminated by signal|(?:server process|client backend) .* exited with exit code/,
	'no crash');

done_testing();
