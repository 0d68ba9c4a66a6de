# Copyright (c) 2026, projcache developers
#
# Rows dropped for lost rights stay gone after a crash (issue 40 item 9),
# with the settings of the report: projcache.dump_interval = 1h, set to 1s
# for one periodic dump that holds the rows, then back to 1h, so that the
# dump on disk when the rights go is the one written before.
#
# Table-driven over how the server comes back (an immediate stop; a clean
# restart; the scheduler terminated, so that its dump at exit is the one
# on disk, then an immediate stop; the scheduler killed with SIGKILL, so
# that the postmaster reinitialises shared memory itself), over whether
# anyone noticed the loss before the restart ("refreshed": the owner's
# refresh_snapshot() got its error and the rows were dropped; "unnoticed":
# nobody read the snapshot between the loss and the restart), and over
# how the rights go:
#
# - revoke: REVOKE SELECT on the table from the owner;
# - group: the owner leaves the group that holds SELECT on the table;
# - drop: DROP TABLE ... CASCADE (the snapshot goes with its view), and a
#   snapshot of the same name made again over other rows;
# - unshare: the owner's revoke_snapshot() from the reader (the owner
#   keeps its rights; only the reader lost its).
#
# After each restart neither the reader nor the owner (unless it kept its
# rights) gets the old rows, although, after a crash, the file the server
# restores from holds them.  Two defences see to it, and the test tells
# them apart: rows dropped for lost rights have a tombstone, so they are
# not even restored; rows whose owner lost its rights unnoticed are
# restored, and the load as the owner that comes before any restored row
# is served drops them.  Then a standby made from a base backup that holds
# the primary's dump: once it has replayed the owner's loss, it serves
# none of the dumped rows either.

use strict;
use warnings;

use FindBin;
use lib $FindBin::RealBin;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use ProjcacheTest;
use Test::More;

my $node = projcache_node(
	'crashlost',
	init => { allows_streaming => 1 },
	conf => "projcache.dump_interval = '1h'\nrestart_after_crash = on\n");
my $datadir = $node->data_dir;
my $dump = "$datadir/projcache_snapshots.dump";

$node->safe_psql(
	'postgres', q{
CREATE ROLE own;
CREATE ROLE rdr;
CREATE ROLE grp;
GRANT grp TO own;
GRANT USAGE ON SCHEMA projcache TO own, rdr;
GRANT EXECUTE ON FUNCTION
	projcache.create_snapshot(text, text, interval, text),
	projcache.snapshot(text), projcache.refresh_snapshot(text),
	projcache.grant_snapshot(text, regrole),
	projcache.revoke_snapshot(text, regrole) TO own;
GRANT EXECUTE ON FUNCTION projcache.snapshot(text),
	projcache.refresh_snapshot(text) TO rdr;
});

# -- Helpers ---------------------------------------------------------------

# $sql run as $role on $on: its output, or "SQLSTATE: message" of the
# error.
sub as_role
{
	my ($on, $role, $sql) = @_;
	my ($rc, $out, $err) =
	  $on->psql('postgres', "\\set VERBOSITY verbose\nSET ROLE $role;\n$sql");

	return $out if $rc == 0;
	return $err =~ /ERROR:  (\w{5}): ([^\n]*)/ ? "$1: $2" : "error: $err";
}

# What $role reads of snapshot $name on $on: its v values, or the error.
sub read_snapshot
{
	my ($on, $role, $name) = @_;
	return as_role($on, $role,
		"SELECT string_agg(v, ',' ORDER BY id) FROM projcache.snapshot('$name') AS t(id int, v text)"
	);
}

# own's refresh_snapshot($name): "t", "f" or the error.
sub refresh_as_owner
{
	my ($name) = @_;
	return as_role($node, 'own', "SELECT projcache.refresh_snapshot('$name')");
}

# The snapshot files of $dir that hold $marker.
sub files_holding
{
	my ($dir, $marker) = @_;
	return join(' ',
		map { s{.*/}{}r }
		grep { index(slurp_file($_), $marker) >= 0 }
		glob("$dir/projcache_snapshots.*"));
}

sub set_dump_interval
{
	my ($value) = @_;
	$node->safe_psql('postgres',
		"ALTER SYSTEM SET projcache.dump_interval = '$value'");
	reload_and_wait($node);
	return;
}

# The report's steps: one periodic dump at 1s, then 1h again, and no dump
# due any more: once the scheduler has taken 1h, the one dump the 1s
# schedule still had due (1 s after the last) comes, and then none; the
# report waited 2.5 s for it.
sub one_periodic_dump
{
	my ($what) = @_;
	my $now = $node->safe_psql('postgres', 'SELECT now()');

	set_dump_interval('1s');
	ok( $node->poll_query_until(
			'postgres', "SELECT last_dump_at > '$now' FROM projcache.stats"),
		"$what: a periodic dump is written");
	set_dump_interval('1h');
	ok( $node->poll_query_until(
			'postgres',
			"SELECT now() - last_dump_at > interval '2.5s' FROM projcache.stats"
		),
		"$what: no periodic dump is due any more");
	return;
}

# Wait for the scheduler to be ready after a start, from log offset $offset.
sub wait_ready
{
	my ($offset) = @_;
	$node->wait_for_log(qr/projcache scheduler ready/, $offset);
	return;
}

# How the server comes back: each leaves the snapshot file a start adopts
# as it would be in the field.
my %restarts = (
	immediate => sub {
		$node->stop('immediate');
		my $offset = -s $node->logfile;
		$node->start;
		wait_ready($offset);
	},
	clean => sub {
		my $offset = -s $node->logfile;
		$node->restart;
		wait_ready($offset);
	},
	'worker kill' => sub {
		my $pid = worker_pid($node);
		my $offset = -s $node->logfile;
		$node->safe_psql('postgres', "SELECT pg_terminate_backend($pid)");
		ok(wait_for_worker($node, $pid) ne '',
			'worker kill: a new scheduler runs');
		wait_ready($offset);
		$node->stop('immediate');
		$offset = -s $node->logfile;
		$node->start;
		wait_ready($offset);
	},
	'scheduler SIGKILL' => sub {
		my $offset = -s $node->logfile;
		kill 'KILL', worker_pid($node);
		$node->wait_for_log(qr/all server processes terminated; reinitializing/,
			$offset);
		wait_ready($offset);
	},);

# The ways rights go.  Each: what to set up for table $t (as a superuser,
# before own makes the snapshot), how the rights are lost, whether own
# keeps its own rights, and what own's refresh gets after the loss.
my @ways = (
	{
		way => 'revoke',
		setup => 'GRANT SELECT ON public.%t TO own',
		lose => 'REVOKE SELECT ON public.%t FROM own',
		refresh => qr/^42501: /,
	},
	{
		way => 'group',
		setup => 'GRANT SELECT ON public.%t TO grp',
		lose => 'REVOKE grp FROM own',
		refresh => qr/^42501: /,
	},
	{
		way => 'drop',
		setup => 'GRANT SELECT ON public.%t TO own',
		lose => 'DROP TABLE public.%t CASCADE',
		refresh => qr/^42704: /,
		again => 1,
	},
	{
		way => 'unshare',
		setup => 'GRANT SELECT ON public.%t TO own',
		lose => "SET ROLE own; SELECT projcache.revoke_snapshot('%s', 'rdr')",
		owner_keeps => 1,
	},);

# A table $t of one row only own (or its group) may read, with value $v,
# and own's snapshot $s of it (TTL 1 h), granted to rdr.
sub make_snapshot
{
	my ($w, $t, $s, $v) = @_;
	my $setup = $w->{setup} =~ s/%t/$t/gr;

	$node->safe_psql(
		'postgres', qq{
CREATE TABLE public.$t (id int, v text);
INSERT INTO public.$t VALUES (1, '$v');
$setup;
SET ROLE own;
SELECT projcache.create_snapshot('$s', 'SELECT id, v FROM public.$t', '1h');
SELECT projcache.grant_snapshot('$s', 'rdr');
});
	return;
}

# $role's read of $name on $on gets an error, and not the rows ($marker).
sub no_rows
{
	my ($on, $role, $name, $marker, $what) = @_;
	my $got = read_snapshot($on, $role, $name);

	unlike($got, qr/\Q$marker\E/, "$what: $role does not get the rows")
	  or diag("got: $got");
	like($got, qr/^(42501|42704|PC001): /, "$what: $role gets an error")
	  or diag("got: $got");
	return;
}

# -- The rounds --------------------------------------------------------------
my $round = 0;
for my $how ('immediate', 'clean', 'worker kill', 'scheduler SIGKILL')
{
	for my $when ('refreshed', 'unnoticed')
	{
		my @cases;

		$round++;
		for my $w (@ways)
		{
			my ($t, $s, $v) = (
				"secret_$round$w->{way}", "s$round$w->{way}",
				"salary-$round$w->{way}-1");

			# The report's very names for its case.
			($t, $s, $v) = ('secret_c', 'sc', 'salary-C1')
			  if $how eq 'immediate'
			  && $when eq 'refreshed'
			  && $w->{way} eq 'revoke';
			push @cases, { %$w, t => $t, s => $s, v => $v,
				what => "$how, $when, $w->{way}" };
			make_snapshot($w, $t, $s, $v);
			is(read_snapshot($node, 'rdr', $s), $v, "$how, $when, $w->{way}: rdr reads it");
		}
		one_periodic_dump("$how, $when");
		for my $c (@cases)
		{
			like(slurp_file($dump), qr/\Q$c->{v}\E/,
				"$c->{what}: the dump on disk holds the rows");
			$node->safe_psql('postgres',
				$c->{lose} =~ s/%t/$c->{t}/gr =~ s/%s/$c->{s}/gr);
		}
		if ($when eq 'refreshed')
		{
			for my $c (@cases)
			{
				next if $c->{owner_keeps};
				like(refresh_as_owner($c->{s}), $c->{refresh},
					"$c->{what}: own's refresh after the loss is refused");
				no_rows($node, 'rdr', $c->{s}, $c->{v},
					"$c->{what}: after the refused refresh");
			}
		}
		for my $c (@cases)
		{
			like(slurp_file($dump), qr/\Q$c->{v}\E/,
				"$c->{what}: no dump was written since the loss");
		}

		# A dropped snapshot's name, made again over other rows.
		for my $c (grep { $_->{again} } @cases)
		{
			make_snapshot($c, $c->{t}, $c->{s}, "new-$c->{v}");
			is(read_snapshot($node, 'rdr', $c->{s}), "new-$c->{v}",
				"$c->{what}: made again, rdr reads the new rows");
		}

		$restarts{$how}->();
		# After a crash the file a read restores from is the periodic dump
		# written before the loss (a dump at exit holds the rows only if
		# nobody noticed the loss).
		for my $c (@cases)
		{
			next if $c->{again};
			next if $how eq 'clean' || ($how eq 'worker kill' && $when eq 'refreshed');
			like(files_holding($datadir, $c->{v}), qr/restore/,
				"$c->{what}: the file restored from holds the rows");
		}

		# The owner's losses.  Once noticed, the rows are not even restored
		# (a tombstone); unnoticed, they are, and the load as the owner that
		# comes before any row is served drops them.
		for my $c (grep { $_->{way} =~ /^(revoke|group)$/ } @cases)
		{
			no_rows($node, 'rdr', $c->{s}, $c->{v},
				"$c->{what}: the first read after the restart");
		}
		is( $node->safe_psql('postgres', 'SELECT loaded_snapshots FROM projcache.stats'),
			$when eq 'refreshed' ? '0' : '2',
			"$how, $when: "
			  . ($when eq 'refreshed'
				? 'rows dropped for lost rights were not restored'
				: 'the rows were restored, and dropped by the load'));
		for my $c (@cases)
		{
			if ($c->{again})
			{
				is(read_snapshot($node, 'rdr', $c->{s}), "new-$c->{v}",
					"$c->{what}: after the restart, rdr reads the new rows only");
				next;
			}
			no_rows($node, 'rdr', $c->{s}, $c->{v},
				"$c->{what}: after the restart");
			if ($c->{owner_keeps})
			{
				is(read_snapshot($node, 'own', $c->{s}), $c->{v},
					"$c->{what}: after the restart, own still reads its rows");
			}
			else
			{
				no_rows($node, 'own', $c->{s}, $c->{v},
					"$c->{what}: after the restart");
			}
		}
		# (the next round's group case needs the membership)
		$node->safe_psql('postgres', 'GRANT grp TO own');
	}
}

# -- A standby made from a backup that holds the dump ------------------------
# The backup is taken once a periodic dump holds the rows; then the owner
# loses its rights on the primary.  The standby adopts the dump it was made
# with, and serves none of its rows once it has replayed the REVOKE.
make_snapshot($ways[0], 'secret_sby', 'ssby', 'salary-sby-1');
is(read_snapshot($node, 'rdr', 'ssby'), 'salary-sby-1', 'standby: rdr reads it on the primary');
one_periodic_dump('standby');
$node->backup('bk');
like(files_holding($node->backup_dir . '/bk', 'salary-sby-1'), qr/dump/,
	'standby: the backup holds the dump of the rows');
$node->safe_psql('postgres', 'REVOKE SELECT ON public.secret_sby FROM own');
like(refresh_as_owner('ssby'), qr/^42501: /, 'standby: own\'s refresh on the primary is refused');
my $standby = PostgreSQL::Test::Cluster->new('crashlost_standby');
$standby->init_from_backup($node, 'bk', has_streaming => 1);
$standby->start;
$node->wait_for_catchup($standby);
$standby->wait_for_log(qr/projcache scheduler ready/);
like(files_holding($standby->data_dir, 'salary-sby-1'), qr/restore/,
	'standby: the file it restores from holds the rows');
no_rows($standby, 'rdr', 'ssby', 'salary-sby-1', 'standby');
no_rows($standby, 'own', 'ssby', 'salary-sby-1', 'standby');
$standby->stop;

# The one crash this test made on purpose is the scheduler's SIGKILL.
my $log = slurp_file($node->logfile);
$log =~ s/^.*"projcache scheduler" \(PID \d+\) was terminated by signal 9.*$//mg;
unlike($log,
	qr/PANIC|TRAP:|terminated by signal|(?:server process|client backend) .* exited with exit code/i,
	'the log shows no other crash');
$node->stop;
done_testing();
