# Copyright (c) 2026, projcache developers
#
# Restarts with the source down cost readers nothing (issue 29): hot keys
# and a 500-row snapshot are cached, the source goes down (the fetch
# function and the snapshot's query fail: a switch in a local table, or
# the second server they read over dblink stopped), and the server is
# restarted with pg_ctl restart -m fast, three times.  Readers start before each
# start, connecting in a retry loop, so that they read in the very first
# moments the server accepts connections, while the scheduler may not have
# loaded the key dump yet and the snapshot's restored rows wait for their
# first load as the owner.
#
# Under each setting of the table below, over the three restarts:
# - 0 NULL reads of keys read before the restart;
# - 0 errors (nor short reads) from the snapshot, as a foreign table and
#   as projcache.snapshot();
# - a role the snapshot was not granted to reads nothing of it in that
#   window either: the wait for the load happens after the read's checks;
# - a hostile role (not a superuser) that reads the keys and the snapshot
#   with a 1 ms statement_timeout, so that its reads and the loads it
#   starts are cancelled in the middle, costs the other readers nothing,
#   and cannot lengthen the wait (projcache.restore_wait is not its to
#   set).

use strict;
use warnings;

use FindBin;
use lib $FindBin::RealBin;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use ProjcacheTest;
use Test::More;

my @settings = (
	{
		name => 'dump at shutdown only, 3000 keys',
		conf => "projcache.dump_interval = 0\n",
		keys => 3000,
	},
	{
		name => 'dump every second, 1500 keys, restore_wait 10s',
		conf => "projcache.dump_interval = '1s'\n"
		  . "projcache.restore_wait = '10s'\n",
		keys => 1500,
	},
	{
		name => 'the source a second server over dblink, 5000 keys',
		conf => '',
		keys => 5000,
		dblink => 1,
	},);

my $readers = 4;
my $rounds = 3;

# One reader: connect as soon as the server lets it (a refused or
# "starting up" connection is tried again), then read every key (unless it
# is the outsider) and the snapshot, $rounds times, one statement each.
sub start_reader
{
	my ($node, $keys, $user, $out) = @_;
	my $sql = '';

	$sql .= "SET statement_timeout = 1;\n" if $user eq 'hostile';
	for my $r (1 .. $rounds)
	{
		$sql .=
		  "SELECT 'nulls=' || count(*) FROM generate_series(1, $keys) AS i WHERE projcache.get('k' || i) IS NULL;\n"
		  if $user ne 'outsider';
		$sql .= "SELECT 'rows=' || count(*) FROM public.grants;\n";
		$sql .=
		  "SELECT 'rows=' || count(*) FROM projcache.snapshot('grants') AS g(user_id int, audience text);\n";
	}
	my $file = PostgreSQL::Test::Utils::tempdir() . '/reader.sql';
	open(my $fh, '>', $file) or die "could not write $file: $!";
	print $fh $sql;
	close $fh;

	my $connstr = $node->connstr('postgres');
	$connstr .= " user=$user" if $user ne '';
	my $psql = $node->installed_command('psql');
	# psql exits 2 when it cannot connect (or the server refuses yet);
	# any other exit status means the script ran.
	my $loop = q{
for try in $(seq 1 100000); do
	"$0" -XAtq -v ON_ERROR_STOP=0 -d "$1" -f "$2"
	rc=$?
	[ $rc -ne 2 ] && exit $rc
done
exit 2
};
	return IPC::Run::start(
		[ 'bash', '-c', $loop, $psql, $connstr, $file ],
		'<', \undef,
		'>', \$out->{stdout},
		'2>', \$out->{stderr},
		IPC::Run::timeout(3 * $PostgreSQL::Test::Utils::timeout_default));
}

my $case = 0;
for my $s (@settings)
{
	$case++;
	my $n = $s->{keys};
	my $node = projcache_node(
		"cache$case",
		conf => "projcache.expiry = '1h'\n"
		  . "projcache.grace_period = '1h'\n"
		  . "projcache.max_retry_backoff = '1s'\n"
		  . "log_statement = 'all'\n"
		  . $s->{conf});

	# The source: local tables behind a switch that makes every fetch and
	# every load fail, or a second server that is stopped.
	my $source;
	my $fetch_from = 'public.configs c WHERE public.source_check() AND';
	my $snapshot_query =
	  'SELECT user_id, audience FROM public.grants_src WHERE public.source_check()';
	if ($s->{dblink})
	{
		if (!$node->safe_psql('postgres',
				"SELECT count(*) FROM pg_available_extensions WHERE name = 'dblink'"))
		{
			diag("$s->{name}: skipped, dblink is not installed");
			$node->stop;
			next;
		}
		$source = PostgreSQL::Test::Cluster->new("source$case");
		$source->init;
		$source->start;
		$source->safe_psql(
			'postgres', qq{
CREATE TABLE configs (key text PRIMARY KEY, revision text, config jsonb);
INSERT INTO configs
SELECT 'k' || i, 'r1', jsonb_build_object('i', i) FROM generate_series(1, $n) AS i;
CREATE TABLE grants_src (user_id int PRIMARY KEY, audience text);
INSERT INTO grants_src SELECT i, 'aud' || (i % 7) FROM generate_series(1, 500) AS i;
});
		my $connstr = $source->connstr('postgres') . ' connect_timeout=2';
		$node->safe_psql(
			'postgres', qq{
CREATE EXTENSION dblink;
CREATE TABLE public.source_server (connstr text NOT NULL);
INSERT INTO public.source_server VALUES (\$conn\$$connstr\$conn\$);
});
		$fetch_from = q{dblink((SELECT connstr FROM public.source_server),
			format('SELECT key, revision, config FROM configs WHERE key = ANY (%L::text[])',
				   p_keys))
			AS c(key text, revision text, config jsonb) WHERE};
		$snapshot_query = q{SELECT * FROM dblink((SELECT connstr FROM public.source_server),
			'SELECT user_id, audience FROM grants_src')
			AS g(user_id int, audience text)};
	}

	$node->safe_psql(
		'postgres', qq{
CREATE TABLE public.source_up (up bool NOT NULL);
INSERT INTO public.source_up VALUES (true);
-- The source: a switch that makes every fetch and every load fail.
CREATE FUNCTION public.source_check() RETURNS bool
LANGUAGE plpgsql STABLE AS \$\$
BEGIN
	IF NOT (SELECT up FROM public.source_up) THEN
		RAISE EXCEPTION 'the source is down';
	END IF;
	RETURN true;
END \$\$;
CREATE TABLE public.configs (key text PRIMARY KEY, revision text, config jsonb);
INSERT INTO public.configs
SELECT 'k' || i, 'r1', jsonb_build_object('i', i) FROM generate_series(1, $n) AS i;
CREATE FUNCTION public.fetch_src(p_keys text[], p_revisions text[])
RETURNS TABLE(key text, state text, revision text, config jsonb)
LANGUAGE sql STABLE AS \$\$
	SELECT c.key, 'enabled', c.revision, c.config
	FROM $fetch_from c.key = ANY (p_keys)
\$\$;
CREATE TABLE public.grants_src (user_id int PRIMARY KEY, audience text);
INSERT INTO public.grants_src SELECT i, 'aud' || (i % 7) FROM generate_series(1, 500) AS i;
SELECT projcache.create_snapshot('grants',
	\$q\$$snapshot_query\$q\$, '2s', 'user_id');
CREATE FOREIGN TABLE public.grants (user_id int, audience text)
	SERVER projcache OPTIONS (snapshot 'grants');
-- A role the snapshot is not granted to, with what a reader needs else.
CREATE ROLE outsider LOGIN;
GRANT USAGE ON SCHEMA projcache TO outsider;
GRANT EXECUTE ON FUNCTION projcache.snapshot(text) TO outsider;
GRANT SELECT ON public.grants TO outsider;
-- A hostile reader, granted what an application role gets.
CREATE ROLE hostile LOGIN;
GRANT USAGE ON SCHEMA projcache TO hostile;
GRANT EXECUTE ON FUNCTION projcache.get(text), projcache.snapshot(text)
	TO hostile;
GRANT SELECT ON public.grants TO hostile;
SELECT projcache.grant_snapshot('grants', 'hostile');
});
	set_fetch_function($node, 'public.fetch_src');

	$node->safe_psql('postgres',
		"SELECT count(projcache.get('k' || i)) FROM generate_series(1, $n) AS i");
	ok( $node->poll_query_until(
			'postgres',
			"SELECT count(*) = $n FROM projcache.entries WHERE state = 'enabled'"
		),
		"$s->{name}: the keys are cached");
	is($node->safe_psql('postgres', 'SELECT count(*) FROM public.grants'),
		'500', "$s->{name}: the snapshot is loaded");

	# The source goes down.
	$node->safe_psql('postgres', 'UPDATE public.source_up SET up = false');
	$source->stop if defined $source;

	my ($nulls, $errors, $short, $reads, $outsider_rows) = (0, 0, 0, 0, 0);
	my $caught = 0;
	for my $restart (1 .. 3)
	{
		$node->stop('fast');
		my $log_from = -s $node->logfile;
		my (@out, @h);
		# the readers, then the outsider, then the hostile role
		my @users = (('') x $readers, 'outsider', 'hostile');
		for my $i (0 .. $#users)
		{
			$out[$i] = { stdout => '', stderr => '' };
			$h[$i] = start_reader($node, $n, $users[$i], $out[$i]);
		}
		$node->start;
		for my $i (0 .. $#users)
		{
			eval { $h[$i]->finish; };
			if ($@)
			{
				$h[$i]->kill_kill;
				diag("reader $i did not end: $@");
				$errors++;
			}
		}
		for my $i (0 .. $readers - 1)
		{
			for my $line (split /\n/, $out[$i]->{stdout})
			{
				if ($line =~ /^nulls=(\d+)$/)
				{
					$nulls += $1;
					$reads += $n;
				}
				elsif ($line =~ /^rows=(\d+)$/)
				{
					$reads++;
					$short++ if $1 != 500;
				}
			}
			my @err = ($out[$i]->{stderr} =~ /^.*ERROR:.*$/mg);
			$errors += @err;
			diag("restart $restart, reader $i: $_") for @err[ 0 .. ($#err < 2 ? $#err : 2) ];
		}
		# Did a reader read before the key dump was loaded?  (Said, not
		# tested: how wide that window is depends on the machine.)
		my $log = substr(slurp_file($node->logfile), $log_from);
		my $first_read = index($log, "statement: SELECT 'nulls=");
		my $loaded = index($log, 'projcache loaded ');
		$caught++ if $first_read >= 0 && $loaded >= 0 && $first_read < $loaded;
		# The outsider is refused every read, and gets no row.
		my $o = $out[$readers];
		$outsider_rows += () = $o->{stdout} =~ /^rows=/mg;
		my $refused = () = $o->{stderr} =~ /ERROR:\s+permission denied/mg;
		is($refused, 2 * $rounds,
			"$s->{name}, restart $restart: the role without the grant is refused every read"
		);
	}
	# The hostile role cannot lengthen the wait.
	my ($rc, $o, $e) = $node->psql('postgres',
		"SET projcache.restore_wait = '1h'",
		extra_params => [ '-U', 'hostile' ]);
	like($e, qr/cannot be changed now/,
		"$s->{name}: projcache.restore_wait is not a user's to set");

	diag("$s->{name}: readers came before the key dump was loaded in $caught of 3 restarts");
	is($nulls, 0,
		"$s->{name}: no read of a key cached before reads NULL right after three restarts with the source down ($reads reads)"
	);
	is($errors, 0,
		"$s->{name}: no snapshot read fails right after the restarts");
	is($short, 0, "$s->{name}: every snapshot read has the 500 rows");
	is($outsider_rows, 0,
		"$s->{name}: the role without the grant read no row of the snapshot");
	is( $node->safe_psql(
			'postgres',
			"SELECT count(*) FROM generate_series(1, $n) AS i WHERE projcache.get('k' || i) IS NULL"
		),
		'0',
		"$s->{name}: the keys still serve after the restarts");

	log_shows_no_crash($node);
	$node->stop;
}

done_testing();
