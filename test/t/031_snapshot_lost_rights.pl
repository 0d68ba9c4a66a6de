# Copyright (c) 2026, projcache developers
#
# Rows never outlive the rights of the owner who loaded them (issue 28).
# Owner "own" has snapshots of tables only it may read (TTL 1 h), granted
# to reader "rdr", loaded and dumped.  Each reproduction of the issue:
#
# 1. same server lifetime: after a clean restart, REVOKE, own's
#    refresh_snapshot() gets 42501, and then neither rdr nor own gets the
#    rows back (they were restored from the dump by the next read);
# 2. across a clean restart: rows dropped for lost rights are not carried
#    into the next dump, nor restored after it;
# 3. across a crash (immediate stop), with a periodic dump written before
#    the REVOKE: the rows do not come back, whichever dump the crash left
#    (also with that very dump put back in place);
# 4. age: a record carried through restarts keeps the time it was loaded;
#    restored rows are stale, and are not served before a load was tried
#    (inside their TTL too);
# 5. lost rights other than a table's SELECT: EXECUTE on a function the
#    query calls, or that one calls, SELECT on a table a function reads,
#    USAGE on the schema of that table, a column's SELECT.  Each drops the
#    rows at the next refresh, with 42501, instead of serving them as last
#    good forever.
#
# And as hostile roles would try it, around restored rows: a read in a
# transaction that has written (which does not load), with no load worker
# free, and while another session's load is in flight get no restored
# rows; an owner losing and
# regaining its rights in a loop does not grow the tombstone file.  A
# remote server's 42501 passed on by dblink stays a source failure.

use strict;
use warnings;

use FindBin;
use lib $FindBin::RealBin;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use ProjcacheTest;
use Test::More;

my $node = projcache_node('lost',
	conf => "projcache.dump_interval = '1s'\nrestart_after_crash = on\n");
my $datadir = $node->data_dir;
my $dump = "$datadir/projcache_snapshots.dump";
my $tombstones = "$datadir/projcache_snapshots.tombstones";

$node->safe_psql(
	'postgres', q{
CREATE ROLE own;
CREATE ROLE rdr;
GRANT USAGE ON SCHEMA projcache TO own, rdr;
GRANT EXECUTE ON FUNCTION
	projcache.create_snapshot(text, text, interval, text),
	projcache.snapshot(text), projcache.refresh_snapshot(text),
	projcache.grant_snapshot(text, regrole) TO own;
GRANT EXECUTE ON FUNCTION projcache.snapshot(text),
	projcache.refresh_snapshot(text) TO rdr;
-- A source that can be switched off, not about rights: it fails while
-- public.down has a row.
CREATE TABLE public.down (since timestamptz);
GRANT SELECT ON public.down TO own;
CREATE FUNCTION public.source_up() RETURNS boolean LANGUAGE plpgsql AS $$
BEGIN
	IF EXISTS (SELECT FROM public.down) THEN
		RAISE EXCEPTION 'the source is down';
	END IF;
	RETURN true;
END
$$;
});

# -- Helpers ---------------------------------------------------------------

# A table of two rows only own may read, and snapshot $name over it (by
# default "SELECT id, v FROM public.$name"), granted to rdr and loaded.
sub make_snapshot
{
	my ($name, %opts) = @_;
	my $query = $opts{query} // "SELECT id, v FROM public.$name";
	my $ttl = $opts{ttl} // '1h';

	$node->safe_psql(
		'postgres', qq{
CREATE TABLE public.$name (id int, v text);
INSERT INTO public.$name VALUES (1, 'SECRET-$name-1'), (2, 'SECRET-$name-2');
GRANT SELECT ON public.$name TO own;
@{[ $opts{setup} // '' ]}
SET ROLE own;
SELECT projcache.create_snapshot('$name', \$q\$$query\$q\$, '$ttl');
SELECT projcache.grant_snapshot('$name', 'rdr');
});
	is(read_snapshot('rdr', $name), rows_of($name), "$name: loaded");
	return;
}

sub rows_of
{
	my ($name) = @_;
	return "SECRET-$name-1,SECRET-$name-2";
}

# What $role reads of snapshot $name: its v values, or "SQLSTATE: message"
# of the error.  $opts{before} runs first, in the same session.
sub read_snapshot
{
	my ($role, $name, %opts) = @_;
	my ($rc, $out, $err) = $node->psql(
		'postgres',
		"\\set VERBOSITY verbose\nSET ROLE $role;\n"
		  . ($opts{before} // '')
		  . "SELECT string_agg(v, ',' ORDER BY id) FROM projcache.snapshot('$name') AS t(id int, v text);"
	);
	return $out if $rc == 0;
	return $err =~ /ERROR:  (\w{5}): ([^\n]*)/ ? "$1: $2" : "error: $err";
}

# own's refresh_snapshot($name): "t", "f" or "SQLSTATE: message".
sub refresh_as_owner
{
	my ($name) = @_;
	my ($rc, $out, $err) = $node->psql('postgres',
		"\\set VERBOSITY verbose\nSET ROLE own;\nSELECT projcache.refresh_snapshot('$name');"
	);
	return $out if $rc == 0;
	return $err =~ /ERROR:  (\w{5}): ([^\n]*)/ ? "$1: $2" : "error: $err";
}

# Reads that must not return the rows of $name (the table's rows, or any
# row at all: an error).
sub no_rows_for
{
	my ($role, $name, $what) = @_;
	my $got = read_snapshot($role, $name);

	unlike($got, qr/SECRET-/, "$what: $role gets no rows")
	  or diag("got: $got");
	like($got, qr/^(42501|PC001|53400): /, "$what: $role gets an error")
	  or diag("got: $got");
	return;
}

sub snapshot_info
{
	my ($name, $cols) = @_;
	return $node->safe_psql('postgres',
		"SELECT $cols FROM projcache.snapshots WHERE name = '$name'");
}

# The snapshot files of the data directory that hold $marker.
sub files_holding
{
	my ($marker) = @_;
	return join(' ',
		map { s{.*/}{}r }
		grep { index(slurp_file($_), $marker) >= 0 }
		glob("$datadir/projcache_snapshots.*"));
}

# Wait for a periodic dump written after now.
sub wait_for_dump
{
	my ($what) = @_;
	my $now = $node->safe_psql('postgres', 'SELECT now()');
	ok( $node->poll_query_until(
			'postgres', "SELECT last_dump_at > '$now' FROM projcache.stats"),
		"$what: a periodic dump is written");
	return;
}

# Start or restart (clean, or after an immediate stop), and wait for the
# scheduler to have adopted the dump.
sub start_and_wait
{
	my ($how) = @_;
	my $offset = -s $node->logfile;

	if ($how eq 'restart')
	{
		$node->restart;
	}
	else
	{
		$node->start;
	}
	$node->wait_for_log(qr/projcache scheduler ready/, $offset);
	return;
}

sub loaded_snapshots
{
	return $node->safe_psql('postgres',
		'SELECT loaded_snapshots FROM projcache.stats');
}

# -- 1. Same server lifetime -----------------------------------------------
make_snapshot('sa1');
start_and_wait('restart');
$node->safe_psql('postgres', 'REVOKE SELECT ON public.sa1 FROM own');
like(refresh_as_owner('sa1'), qr/^42501: /,
	'1: own\'s refresh after the REVOKE gets 42501');
no_rows_for('rdr', 'sa1', '1: after the refused refresh');
no_rows_for('own', 'sa1', '1: after the refused refresh');
is(snapshot_info('sa1', 'rows, status = \'fresh\''), '0|f',
	'1: no rows cached, not fresh');

# -- 2. Across a clean restart ---------------------------------------------
make_snapshot('sa2');
start_and_wait('restart');
is(read_snapshot('own', 'sa2'), rows_of('sa2'),
	'2: after a restart, the rows are served (loaded as own)');
$node->safe_psql('postgres', 'REVOKE SELECT ON public.sa2 FROM own');
like(refresh_as_owner('sa2'), qr/^42501: /, '2: the refresh after the REVOKE gets 42501');
no_rows_for('rdr', 'sa2', '2: after the refused refresh');
start_and_wait('restart');
no_rows_for('rdr', 'sa2', '2: after another clean restart');
is(loaded_snapshots(), '0', '2: nothing was restored');
is(files_holding('SECRET-sa2'), '', '2: no dump file holds the rows');

# -- 3. Across a crash ------------------------------------------------------
# Each: loaded, a clean restart (the restore file holds the rows), read,
# a periodic dump (it holds them too), REVOKE, refused refresh, crash.
# 'as left': periodic dumps go on until the crash.  'no dump after the
# REVOKE': once the periodic dump holds the rows, no snapshot dump can be
# written (a directory takes the name of its temporary file), so the crash
# leaves that dump, as a crash before the next dump would.
my @crashes =
  ([ 'sa3a', 'as left', 0 ], [ 'sa3b', 'no dump after the REVOKE', 1 ],);
my $dump_tmp = "$dump.tmp";
for my $case (@crashes)
{
	my ($name, $what, $stop_dumps) = @$case;
	make_snapshot($name);
	start_and_wait('restart');
	is(read_snapshot('rdr', $name), rows_of($name), "3 $what: read after a restart");
	wait_for_dump("3 $what");
	if ($stop_dumps)
	{
		# (a dump writing its temporary file just now: try again)
		my $tries = 0;
		$tries++ until mkdir($dump_tmp) || $tries > 100_000;
		ok(-d $dump_tmp, "3 $what: no snapshot dump can be written");
	}
	like(slurp_file($dump), qr/SECRET-$name/, "3 $what: the dump holds the rows");
	$node->safe_psql('postgres', "REVOKE SELECT ON public.$name FROM own");
	like(refresh_as_owner($name), qr/^42501: /, "3 $what: the refresh gets 42501");
	no_rows_for('rdr', $name, "3 $what: after the refused refresh");
	$node->stop('immediate');
	rmdir($dump_tmp) if $stop_dumps;
	start_and_wait('start');
	no_rows_for('rdr', $name, "3 $what: after the crash");
	no_rows_for('own', $name, "3 $what: after the crash");
	is(loaded_snapshots(), '0', "3 $what: nothing was restored");
	like(files_holding("SECRET-$name"), qr/restore/,
		"3 $what: though the restore file holds the rows")
	  if $stop_dumps;
}

# -- 4. Age, and restored rows are not served before a load -----------------
# 4a is read from behind a failing source, so its rows are served as the
# last good ones: their age is what the test looks at.  4b's TTL is a day:
# its restored rows are inside it.
make_snapshot('sa4a',
	query => 'SELECT id, v FROM public.sa4a WHERE public.source_up()');
make_snapshot('sa4b', ttl => '1 day');
$node->stop;
# The rows look two hours older: the dump's write time moves back.
age_dump($dump, 7200);
start_and_wait('start');
start_and_wait('restart');    # carried, unread, into the next dump

$node->safe_psql('postgres', 'INSERT INTO public.down VALUES (now())');
is(read_snapshot('rdr', 'sa4a'), rows_of('sa4a'),
	'4a: with the source down, the restored rows serve as the last good ones');
is( snapshot_info(
		'sa4a',
		"status, age BETWEEN interval '2h' AND interval '2h 5min', refresh_errors"),
	'failing|t|1',
	'4a: with their true age (two hours): a load was tried and failed');
$node->safe_psql('postgres', 'DELETE FROM public.down');

$node->safe_psql('postgres', "UPDATE public.sa4b SET v = v || '-new'");
my $got = read_snapshot('rdr', 'sa4b',
	before => "BEGIN;\nCREATE TEMP TABLE wrote ();\n");
like($got, qr/^PC001: snapshot "sa4b" is not loaded yet/,
	'4b: a transaction that has written (and so does not load) gets no restored rows');
is( snapshot_info('sa4b',
		"status, age BETWEEN interval '2h' AND interval '2h 5min'"),
	'stale|t', '4b: the restored rows are stale, with their true age');
is(read_snapshot('rdr', 'sa4b'), 'SECRET-sa4b-1-new,SECRET-sa4b-2-new',
	'4b: the next read loads: restored rows inside their TTL are not served without a load');
is(snapshot_info('sa4b', "status, age < interval '1min'"), 'fresh|t',
	'4b: fresh once loaded');

# -- 5. Rights other than a table's SELECT ----------------------------------
# Each: what the query needs, set up (own may do it), and how it is lost.
my @rights = (
	{
		name => 'sa5a',
		what => 'EXECUTE on a function the query calls',
		setup => q{
CREATE FUNCTION public.fmt_sa5a(t text) RETURNS text LANGUAGE plpgsql
	AS $$ BEGIN RETURN t; END $$;
REVOKE EXECUTE ON FUNCTION public.fmt_sa5a(text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION public.fmt_sa5a(text) TO own;},
		query => 'SELECT id, public.fmt_sa5a(v) AS v FROM public.sa5a',
		revoke => 'REVOKE EXECUTE ON FUNCTION public.fmt_sa5a(text) FROM own',
	},
	{
		name => 'sa5b',
		what => 'EXECUTE on a function a function of the query calls',
		setup => q{
CREATE FUNCTION public.inner_sa5b(t text) RETURNS text LANGUAGE plpgsql
	AS $$ BEGIN RETURN t; END $$;
REVOKE EXECUTE ON FUNCTION public.inner_sa5b(text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION public.inner_sa5b(text) TO own;
CREATE FUNCTION public.outer_sa5b(t text) RETURNS text LANGUAGE plpgsql
	AS $$ BEGIN RETURN public.inner_sa5b(t); END $$;},
		query => 'SELECT id, public.outer_sa5b(v) AS v FROM public.sa5b',
		revoke => 'REVOKE EXECUTE ON FUNCTION public.inner_sa5b(text) FROM own',
	},
	{
		name => 'sa5c',
		what => 'SELECT on a table a function of the query reads',
		setup => q{
CREATE TABLE public.detail_sa5c (id int, v text);
INSERT INTO public.detail_sa5c SELECT id, v FROM public.sa5c;
GRANT SELECT ON public.detail_sa5c TO own;
CREATE FUNCTION public.lookup_sa5c(k int) RETURNS text LANGUAGE plpgsql
	AS $$ BEGIN RETURN (SELECT d.v FROM public.detail_sa5c d WHERE d.id = k); END $$;},
		query => 'SELECT id, public.lookup_sa5c(id) AS v FROM public.sa5c',
		revoke => 'REVOKE SELECT ON public.detail_sa5c FROM own',
	},
	{
		name => 'sa5d',
		what => 'USAGE on the schema of a table a function of the query reads',
		setup => q{
CREATE SCHEMA hidden_sa5d;
GRANT USAGE ON SCHEMA hidden_sa5d TO own;
CREATE TABLE hidden_sa5d.detail (id int, v text);
INSERT INTO hidden_sa5d.detail SELECT id, v FROM public.sa5d;
GRANT SELECT ON hidden_sa5d.detail TO own;
CREATE FUNCTION public.lookup_sa5d(k int) RETURNS text LANGUAGE plpgsql
	AS $$ BEGIN RETURN (SELECT d.v FROM hidden_sa5d.detail d WHERE d.id = k); END $$;},
		query => 'SELECT id, public.lookup_sa5d(id) AS v FROM public.sa5d',
		revoke => 'REVOKE USAGE ON SCHEMA hidden_sa5d FROM own',
	},
	{
		name => 'sa5e',
		what => 'SELECT on a column of the query',
		setup => q{
REVOKE SELECT ON public.sa5e FROM own;
GRANT SELECT (id, v) ON public.sa5e TO own;},
		query => 'SELECT id, v FROM public.sa5e',
		revoke => 'REVOKE SELECT (v) ON public.sa5e FROM own',
	},);
for my $r (@rights)
{
	my ($name, $what) = ($r->{name}, $r->{what});
	make_snapshot($name, setup => $r->{setup}, query => $r->{query});
	$node->safe_psql('postgres', $r->{revoke});
	like(refresh_as_owner($name), qr/^42501: /,
		"5 $what: the refresh gets 42501, not a failing source's WARNING");
	no_rows_for('rdr', $name, "5 $what");
	is(snapshot_info($name, 'rows'), '0', "5 $what: no rows cached");
}

# -- Hostile: no load worker free --------------------------------------------
make_snapshot('sa6');
start_and_wait('restart');
$node->safe_psql('postgres',
	'ALTER SYSTEM SET projcache.max_load_workers = 0; SELECT pg_reload_conf()');
ok( $node->poll_query_until(
		'postgres', "SELECT current_setting('projcache.max_load_workers') = '0'"),
	'6: no load worker may run');
like(read_snapshot('rdr', 'sa6'), qr/^53400: /,
	'6: with no load worker to be had, restored rows are not served (53400)');
$node->safe_psql('postgres',
	'ALTER SYSTEM RESET projcache.max_load_workers; SELECT pg_reload_conf()');
ok( $node->poll_query_until(
		'postgres', "SELECT current_setting('projcache.max_load_workers') <> '0'"),
	'6: load workers again');
is(read_snapshot('rdr', 'sa6'), rows_of('sa6'), '6: then a read loads');

# -- Hostile: another session's load in flight -------------------------------
make_snapshot('sa7');
start_and_wait('restart');
my $blocker = start_session($node, 'blocker_sa7',
	'BEGIN; LOCK TABLE public.sa7 IN ACCESS EXCLUSIVE MODE; SELECT pg_sleep(300)');
ok( $node->poll_query_until(
		'postgres',
		"SELECT wait_event = 'PgSleep' FROM pg_stat_activity WHERE application_name = 'blocker_sa7'"
	),
	'7: a session holds a lock the load of sa7 waits for');
my $first = start_session($node, 'first_sa7',
	"SET ROLE rdr; SELECT string_agg(v, ',' ORDER BY id) FROM projcache.snapshot('sa7') AS t(id int, v text)"
);
ok( $node->poll_query_until(
		'postgres',
		"SELECT count(*) > 0 FROM pg_stat_activity WHERE backend_type = 'projcache snapshot load' AND wait_event_type = 'Lock'"
	),
	'7: the first reader\'s load waits');
like(read_snapshot('rdr', 'sa7'),
	qr/^PC001: snapshot "sa7" is being loaded/,
	'7: a second reader meanwhile gets no restored rows');
$node->safe_psql('postgres',
	"SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = 'blocker_sa7'"
);
wait_session($blocker);
my ($rc, $out) = wait_session($first);
chomp $out;
is($out, rows_of('sa7'), '7: the first reader gets the rows its load published');

# -- Hostile: losing and regaining rights in a loop --------------------------
# With dumps an hour apart (one more may come first), ten rounds of
# GRANT, refresh, REVOKE and refused refresh.  A tombstone is due only if
# the rows were dumped since the last one.
make_snapshot('sa8');
$node->safe_psql('postgres',
	"ALTER SYSTEM SET projcache.dump_interval = '1h'; SELECT pg_reload_conf()");
my ($loads, $refusals) = (0, 0);
for my $i (1 .. 10)
{
	$node->safe_psql('postgres', 'GRANT SELECT ON public.sa8 TO own');
	$loads++ if refresh_as_owner('sa8') eq 't';
	$node->safe_psql('postgres', 'REVOKE SELECT ON public.sa8 FROM own');
	$refusals++ if refresh_as_owner('sa8') =~ /^42501: /;
}
is("$loads|$refusals", '10|10', '8: ten loads, ten refusals');
cmp_ok(-s $tombstones // 0, '<=', 3 * 104,
	'8: the tombstone file holds a few tombstones, not one per round');
no_rows_for('rdr', 'sa8', '8: after the loop');
$node->safe_psql('postgres',
	'ALTER SYSTEM RESET projcache.dump_interval; SELECT pg_reload_conf()');

# -- A remote server's 42501 is the source's ---------------------------------
SKIP:
{
	my $have_dblink = $node->safe_psql('postgres',
		"SELECT count(*) FROM pg_available_extensions WHERE name = 'dblink'");
	skip 'dblink is not installed', 3 unless $have_dblink;

	my $connstr = 'port=' . $node->port . ' host=' . $node->host
	  . ' dbname=postgres user=remote_ro';
	$node->safe_psql(
		'postgres', qq{
CREATE EXTENSION dblink;
CREATE ROLE remote_ro LOGIN;
CREATE TABLE public.remote_t (id int, v text);
INSERT INTO public.remote_t VALUES (1, 'remote');
GRANT SELECT ON public.remote_t TO remote_ro;
SELECT projcache.create_snapshot('sa9',
	\$q\$SELECT * FROM dblink('$connstr', 'SELECT id, v FROM public.remote_t')
		AS r(id int, v text)\$q\$, '1h');
});
	is(read_snapshot('NONE', 'sa9'), 'remote', '9: loaded through dblink');
	$node->safe_psql('postgres', 'REVOKE SELECT ON public.remote_t FROM remote_ro');
	my ($rc9, $out9, $err9) = $node->psql('postgres',
		"SELECT projcache.refresh_snapshot('sa9')");
	is($out9, 'f', '9: the remote server\'s 42501 is a failing source: refresh says false');
	is(read_snapshot('NONE', 'sa9'), 'remote',
		'9: and the last good rows serve');
}

log_shows_no_crash($node);
$node->stop;
done_testing();

# The dump's header: magic, version, kind, reserved (4 bytes each), the
# system identifier (8), written_at (8, microseconds since 2000), crc (4).
sub age_dump
{
	my ($path, $seconds) = @_;
	my $bytes = slurp_file($path);
	my ($lo, $hi) = unpack('VV', substr($bytes, 24, 8));
	my $t = $hi * 4294967296 + $lo - $seconds * 1_000_000;
	substr($bytes, 24, 8) = pack('VV', $t % 4294967296, int($t / 4294967296));
	substr($bytes, 32, 4) = pack('V', crc32c(substr($bytes, 0, 32)));
	open(my $fh, '>:raw', $path) or die "open $path: $!";
	print $fh $bytes;
	close($fh);
	return;
}

# CRC-32C (Castagnoli), reflected, as PostgreSQL's pg_crc32c computes it.
sub crc32c
{
	my ($data) = @_;
	my $crc = 0xFFFFFFFF;
	for my $byte (unpack('C*', $data))
	{
		$crc ^= $byte;
		for (1 .. 8)
		{
			$crc = ($crc & 1) ? (($crc >> 1) ^ 0x82F63B78) : ($crc >> 1);
		}
	}
	return $crc ^ 0xFFFFFFFF;
}
