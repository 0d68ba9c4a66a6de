# Copyright (c) 2026, projcache developers
#
# Narrowing rights takes effect at the commit that narrows them (issue 40,
# item 3): revoke_cache() and drop_cache() are obeyed by the committing
# backend, not when the one worker gets to them.  Table-driven over
# - the narrowing: a revoke (the revoked role's reads fail 42501), a drop
#   (nobody reads the dropped cache's value);
# - the worker: busy with another cache's fetch that a held lock keeps
#   running, or just terminated (a new one starts seconds later);
# - where the read runs: projcache.database, or another database.
# Every read from the commit on is checked, 20 of them over a second, and
# again once the worker is free and has reloaded the registry.

use strict;
use warnings;

use FindBin;
use lib $FindBin::RealBin;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use ProjcacheTest;
use Test::More;

my $node = projcache_node('narrowing');

$node->safe_psql('postgres', 'CREATE DATABASE other');
$node->safe_psql('other', 'CREATE EXTENSION projcache');
for my $db ('postgres', 'other')
{
	$node->safe_psql(
		$db, q{
DO $$ BEGIN
	IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'ops') THEN
		CREATE ROLE ops LOGIN;
		CREATE ROLE rdr LOGIN;
	END IF;
END $$;
GRANT USAGE ON SCHEMA projcache TO ops, rdr;
GRANT EXECUTE ON FUNCTION projcache.get(text), projcache.get(text, interval)
	TO ops, rdr;
-- How many of n reads of key, 50 ms apart, returned a value; a refused
-- read (42501) counts as none.
CREATE FUNCTION public.reads_served(k text, n int) RETURNS int
LANGUAGE plpgsql AS $$
DECLARE
	served int := 0;
BEGIN
	FOR i IN 1..n LOOP
		BEGIN
			IF projcache.get(k) IS NOT NULL THEN
				served := served + 1;
			END IF;
		EXCEPTION WHEN insufficient_privilege THEN
			NULL;
		END;
		PERFORM pg_sleep(0.05);
	END LOOP;
	RETURN served;
END $$;
});
}
$node->safe_psql(
	'postgres', q{
GRANT EXECUTE ON FUNCTION
	projcache.create_cache(text, regprocedure, interval, interval, interval,
		interval, integer, interval, bigint, regrole),
	projcache.drop_cache(text), projcache.grant_cache(text, regrole),
	projcache.revoke_cache(text, regrole)
	TO ops;
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
});

sub caches_open
{
	my ($want) = @_;
	return $node->poll_query_until('postgres',
		"SELECT count(*) = $want FROM projcache.caches WHERE state = 'open'"
		  . " AND name <> 'slow'");
}

my @rows;
for my $narrow ('revoke', 'drop')
{
	for my $worker ('busy', 'terminated')
	{
		for my $db ('postgres', 'other')
		{
			push @rows, { narrow => $narrow, worker => $worker, db => $db };
		}
	}
}

my $n = 0;
for my $row (@rows)
{
	my $r = "$row->{narrow}, worker $row->{worker}, read in $row->{db}";
	my $cache = 'c' . ++$n;
	my $reader = $row->{narrow} eq 'revoke' ? 'rdr' : 'ops';

	$node->safe_psql(
		'postgres', qq{
SET ROLE ops;
SELECT projcache.create_cache('$cache', 'public.src(text[],text[])',
	expiry => '1h', max_memory => 1048576),
	projcache.grant_cache('$cache', 'rdr');
});
	ok(caches_open(1), "$r: the cache opens");
	is( $node->safe_psql($row->{db},
			"SET ROLE $reader; SELECT projcache.get('$cache:k1', '10s') ->> 'k'"),
		'k1',
		"$r: $reader reads the key");

	is( $node->safe_psql($row->{db},
			"SET ROLE $reader; SELECT public.reads_served('$cache:k1', 5)"),
		'5',
		"$r: before the narrowing, every read is served");

	my $holder;
	if ($row->{worker} eq 'busy')
	{
		# The worker runs the slow cache's fetch until the gate opens.
		$holder = $node->background_psql('postgres');
		$holder->query_safe('BEGIN; LOCK public.gate IN ACCESS EXCLUSIVE MODE;');
		$node->safe_psql('postgres', "SELECT projcache.get('slow:s$n')");
		ok( $node->poll_query_until(
				'postgres',
				"SELECT count(*) = 1 FROM pg_locks l JOIN pg_stat_activity a USING (pid)"
				  . " WHERE a.backend_type = 'projcache scheduler'"
				  . " AND l.relation = 'public.gate'::regclass AND NOT l.granted"),
			"$r: the worker waits in the slow cache's fetch");
	}
	else
	{
		my $pid = worker_pid($node);
		$node->safe_psql('postgres', "SELECT pg_terminate_backend($pid)");
		$node->poll_query_until('postgres',
			"SELECT count(*) = 0 FROM pg_stat_activity WHERE pid = $pid");
	}

	$node->safe_psql('postgres',
		$row->{narrow} eq 'revoke'
		? "SET ROLE ops; SELECT projcache.revoke_cache('$cache', 'rdr')"
		: "SET ROLE ops; SELECT projcache.drop_cache('$cache')");
	is( $node->safe_psql($row->{db},
			"SET ROLE $reader; SELECT public.reads_served('$cache:k1', 20)"),
		'0',
		"$r: no read from the commit on is served");

	if ($holder)
	{
		$holder->query_safe('COMMIT');
		$holder->quit;
	}
	isnt(wait_for_worker($node), '', "$r: a worker runs");
	# Once the worker has published the registry again: still none.
	ok(caches_open($row->{narrow} eq 'revoke' ? 1 : 0),
		"$r: the worker has published the change");
	is( $node->safe_psql($row->{db},
			"SET ROLE $reader; SELECT public.reads_served('$cache:k1', 5)"),
		'0',
		"$r: nor once the worker has published it");
	$node->safe_psql('postgres',
		"SELECT projcache.drop_cache('$cache')") if $row->{narrow} eq 'revoke';
	ok(caches_open(0), "$r: clean for the next row");
}

# A transaction that revoked or dropped is not prepared (0A000): COMMIT
# PREPARED could not narrow at its commit.
$node->append_conf('postgresql.conf', "max_prepared_transactions = 2\n");
$node->restart;
$node->safe_psql(
	'postgres', q{
SET ROLE ops;
SELECT projcache.create_cache('p', 'public.src(text[],text[])',
	expiry => '1h', max_memory => 1048576),
	projcache.grant_cache('p', 'rdr');
});
for my $narrow ("revoke_cache('p', 'rdr')", "drop_cache('p')")
{
	my ($rc, $out, $err) = $node->psql('postgres',
		"BEGIN; SET LOCAL ROLE ops; SELECT projcache.$narrow; PREPARE TRANSACTION 'x';",
		extra_params => [ '-v', 'VERBOSITY=verbose' ]);
	like($err, qr/0A000: cannot PREPARE a transaction that changed named caches/,
		"$narrow: PREPARE TRANSACTION is refused");
	is($node->safe_psql('postgres', 'SELECT count(*) FROM pg_prepared_xacts'),
		'0', "$narrow: nothing is prepared");
}

done_testing();
