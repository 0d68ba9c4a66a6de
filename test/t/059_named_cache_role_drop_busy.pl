# Copyright (c) 2026, projcache developers
#
# DROP ROLE in another database than projcache.database, where the
# registry cannot be read, while the worker cannot publish: it is busy in
# a fetch that waits on a lock, or it was just terminated.  1.3.1's first
# guard waited up to 5 s for the worker's publication, for each role
# dropped, and then looked at what was published: a role granted a moment
# before could be dropped, and the registry kept its number.  Now the
# committing backend enters the roles its change names in shared memory,
# and the guard never waits.  Table-driven over
# - what names role x: a grant (reader), a create_cache (owner), a
#   create_cache with a fetch_role;
# - when: committed just before the DROP ROLE, or committing while the
#   DROP ROLE waits for it;
# - the worker: busy, or terminated.
# Then, with the worker busy:
# - DROP ROLE of twenty roles no cache names runs without waiting for the
#   worker;
# - the entries are bounded per role: a non-superuser's changes waiting
#   for publication may name 34 roles, the 35th commit fails (53400)
#   while another role's changes still commit, and one transaction may
#   name at most 34 (54000);
# - a transaction that changes named caches cannot be prepared (0A000),
#   whatever the change (COMMIT PREPARED would enter no roles).
# Last, the worker publishes, and the bound is free again.

use strict;
use warnings;

use FindBin;
use lib $FindBin::RealBin;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use ProjcacheTest;
use Test::More;

my $node = projcache_node('roledropbusy',
	conf => "max_prepared_transactions = 4\n");

$node->safe_psql('postgres', 'CREATE DATABASE other');
$node->safe_psql(
	'postgres', q{
CREATE ROLE ops LOGIN;
CREATE ROLE ops2 LOGIN;
GRANT USAGE ON SCHEMA projcache TO ops, ops2;
GRANT EXECUTE ON FUNCTION
	projcache.create_cache(text, regprocedure, interval, interval, interval,
		interval, integer, interval, bigint, regrole),
	projcache.drop_cache(text), projcache.grant_cache(text, regrole),
	projcache.revoke_cache(text, regrole) TO PUBLIC;
CREATE FUNCTION public.src(keys text[], revisions text[])
RETURNS TABLE(key text, state text, revision text, config jsonb)
LANGUAGE sql AS $$
	SELECT k, 'enabled', 'r1', jsonb_build_object('k', k) FROM unnest(keys) k
$$;
-- The slow cache's function waits for public.gate, which a session holds.
CREATE TABLE public.gate (x int);
CREATE FUNCTION public.slow(keys text[], revisions text[])
RETURNS TABLE(key text, state text, revision text, config jsonb)
LANGUAGE sql AS $$
	SELECT k, 'enabled', 'r1', jsonb_build_object('k', k)
	  FROM unnest(keys) k, (SELECT count(*) FROM public.gate) g
$$;
SELECT projcache.create_cache('slow', 'public.slow(text[],text[])',
	fetch_timeout => '5min');
SET ROLE ops;
SELECT projcache.create_cache('c', 'public.src(text[],text[])',
	expiry => '1h', max_memory => 65536);
SELECT projcache.create_cache('c2', 'public.src(text[],text[])',
	expiry => '1h', max_memory => 65536);
RESET ROLE;
SET ROLE ops2;
SELECT projcache.create_cache('d', 'public.src(text[],text[])',
	expiry => '1h', max_memory => 65536);
});
ok( $node->poll_query_until('postgres',
		"SELECT count(*) = 4 FROM projcache.caches WHERE state = 'open'"),
	'the caches open');

# What names role x (as 057), and what undoes it.
my %names = (
	reader => q{SET LOCAL ROLE ops; SELECT projcache.grant_cache('c', 'x')},
	owner => q{GRANT USAGE ON SCHEMA projcache TO x; SET LOCAL ROLE x;
SELECT projcache.create_cache('cx', 'public.src(text[],text[])', max_memory => 65536)},
	'fetch role' => q{GRANT x TO ops; SET LOCAL ROLE ops;
SELECT projcache.create_cache('cx', 'public.src(text[],text[])', max_memory => 65536, fetch_role => 'x')},
);
my %undo = (
	reader => q{SET ROLE ops; SELECT projcache.revoke_cache('c', 'x')},
	owner => q{SELECT projcache.drop_cache(name) FROM projcache.cache_registry WHERE name = 'cx'},
	'fetch role' => q{SELECT projcache.drop_cache(name) FROM projcache.cache_registry WHERE name = 'cx'},
);

sub dangling
{
	return $node->safe_psql(
		'postgres', q{
SELECT count(*) FROM projcache.cache_registry r
 WHERE NOT EXISTS (SELECT FROM pg_roles WHERE oid = r.owner::oid)
    OR (r.fetch_role IS NOT NULL AND NOT EXISTS (SELECT FROM pg_roles WHERE oid = r.fetch_role::oid))
    OR EXISTS (SELECT FROM unnest(r.readers::oid[]) o WHERE NOT EXISTS (SELECT FROM pg_roles WHERE oid = o))});
}

# Make the worker busy: it runs the slow cache's fetch, which waits for
# the gate a session holds.  Returns that session; quit it to open the
# gate.
my $slow_keys = 0;

sub worker_busy
{
	my ($what) = @_;
	my $holder = $node->background_psql('postgres');

	$holder->query_safe('BEGIN; LOCK public.gate IN ACCESS EXCLUSIVE MODE;');
	$slow_keys++;
	$node->safe_psql('postgres', "SELECT projcache.get('slow:s$slow_keys')");
	ok( $node->poll_query_until(
			'postgres',
			"SELECT count(*) = 1 FROM pg_locks l JOIN pg_stat_activity a USING (pid)"
			  . " WHERE a.backend_type = 'projcache scheduler'"
			  . " AND l.relation = 'public.gate'::regclass AND NOT l.granted"),
		"$what: the worker waits in the slow cache's fetch");
	return $holder;
}

sub worker_terminated
{
	my $pid = wait_for_worker($node);

	$node->safe_psql('postgres', "SELECT pg_terminate_backend($pid)");
	$node->poll_query_until('postgres',
		"SELECT count(*) = 0 FROM pg_stat_activity WHERE pid = $pid");
	return undef;
}

for my $worker ('busy', 'terminated')
{
	for my $as ('reader', 'owner', 'fetch role')
	{
		for my $when ('just committed', 'committing while DROP ROLE waits')
		{
			my $name = "$as, $when, worker $worker";
			my ($rc, $out, $err);

			$node->psql('postgres', $undo{$as});
			$node->psql('postgres', 'DROP OWNED BY x; DROP ROLE x');
			$node->safe_psql('postgres', 'CREATE ROLE x');
			my $holder =
			  $worker eq 'busy' ? worker_busy($name) : worker_terminated();

			if ($when eq 'just committed')
			{
				$node->safe_psql('postgres', "BEGIN; $names{$as}; COMMIT;");
				($rc, $out, $err) = $node->psql('other', 'DROP ROLE x');
			}
			else
			{
				my $bg = $node->background_psql('postgres');
				$bg->query_safe("BEGIN; $names{$as};");
				my $drop = start_session($node, 'dropper', 'DROP ROLE x',
					dbname => 'other');
				ok( $node->poll_query_until(
						'postgres', q{SELECT count(*) = 1 FROM pg_stat_activity
 WHERE application_name = 'dropper' AND wait_event_type = 'Lock'}),
					"$name: DROP ROLE waits for the change");
				$bg->query_safe('COMMIT');
				$bg->quit;
				($rc, $out, $err) = wait_session($drop);
			}
			isnt($rc, 0, "$name: DROP ROLE x in another database is refused");
			like(
				$err,
				qr/role "x" cannot be dropped because (a )?named cache (\"cx?\" )?depends on it/,
				"$name: it says a named cache names the role");
			is(dangling(), '0', "$name: the registry names no dropped role");

			$holder->quit if $holder;
			$node->psql('postgres', $undo{$as});
			($rc, $out, $err) =
			  $node->psql('postgres', 'DROP OWNED BY x; DROP ROLE x');
			is($rc, 0, "$name: once undone, DROP ROLE x runs") or diag($err);
		}
	}
}

# ---------------------------------------------------------------------------
# The worker busy: roles no cache names are dropped without waiting for it.
# ---------------------------------------------------------------------------
my $holder = worker_busy('unnamed roles');
$node->safe_psql('postgres',
	'SELECT format($$CREATE ROLE u%s$$, i) FROM generate_series(1, 20) i \gexec');
my $drop = start_session($node, 'dropper',
	'DROP ROLE ' . join(', ', map { "u$_" } 1 .. 20),
	dbname => 'other');
my %waited;
for (1 .. 6000)
{
	my $ev = $node->safe_psql('postgres',
		q{SELECT coalesce(wait_event_type || ':' || wait_event, 'running')
  FROM pg_stat_activity WHERE application_name = 'dropper'});
	last if $ev eq '';
	$waited{$ev} = 1 if $ev =~ /^Extension/;
	select(undef, undef, undef, 0.01);
}
my ($drc, $dout, $derr, $secs) = wait_session($drop);
is($drc, 0, 'unnamed roles: DROP ROLE of twenty runs') or diag($derr);
is(join(',', sort keys %waited), '',
	'unnamed roles: it never waits for the worker');
note("DROP ROLE of twenty roles took about $secs s");
is( $node->safe_psql('postgres',
		"SELECT count(*) FROM pg_roles WHERE rolname ~ '^u[0-9]+\$'"),
	'0', 'unnamed roles: they are gone');

# ---------------------------------------------------------------------------
# The bound: the worker still busy, ops's grants name 34 roles, each in its
# own transaction; a 35th is refused at commit, ops2's and a superuser's
# changes still commit.
# ---------------------------------------------------------------------------
$node->safe_psql('postgres',
	'SELECT format($$CREATE ROLE g%s$$, i) FROM generate_series(1, 40) i \gexec');
my ($rc, $out, $err);
my $refused = '';
for my $i (1 .. 35)
{
	my $cache = $i <= 32 ? 'c' : 'c2';
	my ($grc, $gout, $gerr) = $node->psql('postgres',
		"SET ROLE ops; SELECT projcache.grant_cache('$cache', 'g$i')",
		extra_params => [ '-v', 'VERBOSITY=verbose' ]);
	if ($grc != 0)
	{
		$refused = "$i: $gerr";
		last;
	}
}
like($refused, qr/^35: .*53400/s, 'bound: the 35th role ops names is refused (53400)');
like($refused, qr/too many changes to named caches by role "ops"/,
	'bound: it says whose changes are waiting');
is( $node->safe_psql('postgres',
		"SELECT cardinality(readers) FROM projcache.cache_registry WHERE name = 'c2'"),
	'2', 'bound: the refused grant did not commit');
($rc, $out, $err) = $node->psql('postgres',
	"SET ROLE ops2; SELECT projcache.grant_cache('d', 'g36')");
is($rc, 0, "bound: another role's change still commits") or diag($err);
($rc, $out, $err) =
  $node->psql('postgres', "SELECT projcache.grant_cache('slow', 'g37')");
is($rc, 0, "bound: a superuser's change still commits") or diag($err);
($rc, $out, $err) = $node->psql('other', 'DROP ROLE g34');
like($err, qr/role "g34" cannot be dropped/,
	'bound: a role ops named is still guarded from another database');

# One transaction naming more than 34 roles.
($rc, $out, $err) = $node->psql(
	'postgres',
	"BEGIN; SELECT projcache.grant_cache(CASE WHEN i <= 20 THEN 'slow' ELSE 'd' END, ('g' || i)::regrole) FROM generate_series(1, 35) i; COMMIT;",
	extra_params => [ '-v', 'VERBOSITY=verbose' ]);
like($err, qr/54000: a transaction may name at most 34 roles in named caches/,
	'bound: one transaction names at most 34 roles (54000)');

# ---------------------------------------------------------------------------
# PREPARE TRANSACTION of a change to named caches is refused.
# ---------------------------------------------------------------------------
my %prepared = (
	grant => q{SET LOCAL ROLE ops2; SELECT projcache.grant_cache('d', 'g38')},
	create => q{SET LOCAL ROLE ops2;
SELECT projcache.create_cache('p', 'public.src(text[],text[])', max_memory => 65536)},
	revoke => q{SET LOCAL ROLE ops2; SELECT projcache.revoke_cache('d', 'g36')},
	drop => q{SET LOCAL ROLE ops2; SELECT projcache.drop_cache('d')});
for my $what (sort keys %prepared)
{
	($rc, $out, $err) = $node->psql(
		'postgres',
		"BEGIN; $prepared{$what}; PREPARE TRANSACTION 'p_$what';",
		extra_params => [ '-v', 'VERBOSITY=verbose' ]);
	like($err, qr/0A000: cannot PREPARE a transaction that changed named caches/,
		"prepare: a transaction with a $what cannot be prepared (0A000)");
}
is($node->safe_psql('postgres', 'SELECT count(*) FROM pg_prepared_xacts'),
	'0', 'prepare: no transaction was prepared');

# ---------------------------------------------------------------------------
# The gate opens: the worker publishes, and ops may name roles again.
# ---------------------------------------------------------------------------
$holder->quit;
my $granted = 0;
for (1 .. 600)
{
	my ($grc) = $node->psql('postgres',
		"SET ROLE ops; SELECT projcache.grant_cache('c2', 'g35')");
	if ($grc == 0)
	{
		$granted = 1;
		last;
	}
	select(undef, undef, undef, 0.05);
}
ok($granted, 'after publication, ops names a 35th role');
($rc, $out, $err) = $node->psql('other', 'DROP ROLE g35');
like($err, qr/role "g35" cannot be dropped because (a )?named cache/,
	'after publication, that role is still guarded from another database');
is(dangling(), '0', 'the registry names no dropped role');
log_shows_no_crash($node);

done_testing();
