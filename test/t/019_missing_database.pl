# Copyright (c) 2026, projcache developers
#
# projcache.database names a database that does not exist yet.  The
# launcher, connected to no database, logs that once and waits; the
# scheduler starts when the database is created, and logs that it is
# ready.  No FATAL floods the log meanwhile.  When the database is dropped
# under the running scheduler, the same happens again.

use strict;
use warnings;

use FindBin;
use lib $FindBin::RealBin;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use ProjcacheTest;
use Test::More;
use Time::HiRes qw(usleep);

my $node = projcache_node(
	'late',
	start => 0,
	conf => "projcache.database = 'appdb'\n");
$node->start;

my $missing =
  qr/projcache: database "appdb" does not exist\n.*DETAIL:  The scheduler starts when it is created/;
ok($node->wait_for_log($missing, 0), 'the launcher says the database is missing');
is( $node->safe_psql(
		'postgres',
		"SELECT string_agg(backend_type || ':' || coalesce(datname, '-'), ',' ORDER BY backend_type)
		   FROM pg_stat_activity WHERE backend_type LIKE 'projcache%'"),
	'projcache launcher:-',
	'only the launcher runs, connected to no database');

# The old behaviour was a FATAL at once and every 2 s.  Watch for 5 s,
# polling: neither a scheduler nor a FATAL may appear.
my $appeared = 0;
for (1 .. 50)
{
	$appeared++
	  if $node->safe_psql('postgres',
		"SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'projcache scheduler'"
	  ) ne '0';
	usleep(100_000);
}
is($appeared, 0, 'no scheduler started while the database is missing');
my $log = slurp_file($node->logfile);
unlike($log, qr/FATAL:  database "appdb" does not exist/,
	'no FATAL about the missing database');
is(scalar(() = $log =~ /$missing/g), 1, 'the missing database is logged once');

my $offset = -s $node->logfile;
$node->safe_psql('postgres', 'CREATE DATABASE appdb');
ok( $node->wait_for_log(
		qr/projcache scheduler ready in database "appdb"/, $offset),
	'the scheduler starts once the database exists, and says it is ready');
my $pid = wait_for_worker($node);
is( $node->safe_psql(
		'postgres', "SELECT datname FROM pg_stat_activity WHERE pid = $pid"),
	'appdb', 'the scheduler is connected to appdb');

# Dropped under the running scheduler: it is terminated, and the launcher
# waits again, saying so once.
$offset = -s $node->logfile;
$node->safe_psql('postgres', 'DROP DATABASE appdb WITH (FORCE)');
ok($node->wait_for_log($missing, $offset),
	'after DROP DATABASE, the launcher waits again');
$node->safe_psql('postgres', 'CREATE DATABASE appdb');
ok( $node->wait_for_log(
		qr/projcache scheduler ready in database "appdb"/, $offset),
	'and starts the scheduler when it is created again');
$log = slurp_file($node->logfile, $offset);
is(scalar(() = $log =~ /$missing/g), 1, 'logged once for that wait too');
unlike($log, qr/FATAL:  database "appdb" does not exist/,
	'still no FATAL about the missing database');

# The launcher terminated: the postmaster starts it again, and the new one
# starts no second scheduler beside the one that lives on.
my $launcher = $node->safe_psql('postgres',
	"SELECT pid FROM pg_stat_activity WHERE backend_type = 'projcache launcher'");
$pid = wait_for_worker($node);
$node->safe_psql('postgres', "SELECT pg_terminate_backend($launcher)");
ok( $node->poll_query_until(
		'postgres', qq{
SELECT count(*) = 1 FROM pg_stat_activity
 WHERE backend_type = 'projcache launcher' AND pid <> $launcher
   AND wait_event = '@{[ wait_event_of($node, 'projcache launcher') ]}'}),
	'a new launcher runs, and sleeps after looking at the scheduler');
is( $node->safe_psql(
		'postgres',
		"SELECT string_agg(pid::text, ',') FROM pg_stat_activity WHERE backend_type = 'projcache scheduler'"
	),
	$pid,
	'the scheduler is the one that was running, and it is the only one');

done_testing();
