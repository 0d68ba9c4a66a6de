# Copyright (c) 2026, projcache developers
#
# One worker fetches for every cache: a cache owner who is not a superuser
# must not hold it (issue 32, "cannot slow another").  projcache.fetch_timeout
# is 2 s here.  Table-driven, mallory (not a superuser) owns a cache whose
# function:
# - catches the statement timeout's cancel and sleeps on, for 60 s: the
#   worker ends itself 1 s past the timeout (a FATAL no function catches),
#   a new one starts, says why, and puts mallory's cache aside;
# - takes 1.5 s per call, within the timeout, with batch_size 1 and 20 keys:
#   per batch, her cache gets one call's time, not twenty.
# Each: while mallory's keys are asked for, a new key of another cache is
# fetched within 20 s (the first case alone would hold the worker 60 s, the
# second 30 s), and the victim's hot keys never read NULL.

use strict;
use warnings;

use FindBin;
use lib $FindBin::RealBin;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use ProjcacheTest;
use Test::More;
use Time::HiRes qw(time);

my $node = projcache_node('stall', conf => "projcache.fetch_timeout = '2s'\n");

$node->safe_psql(
	'postgres', q{
CREATE FUNCTION public.src(keys text[], revisions text[])
RETURNS TABLE(key text, state text, revision text, config jsonb)
LANGUAGE sql AS $$
	SELECT k, 'enabled', 'r1', jsonb_build_object('k', k) FROM unnest(keys) k
$$;
SELECT projcache.create_cache('hot', 'public.src(text[],text[])');
CREATE ROLE mallory LOGIN;
CREATE SCHEMA mallory AUTHORIZATION mallory;
GRANT USAGE ON SCHEMA projcache TO mallory;
GRANT EXECUTE ON FUNCTION
	projcache.create_cache(text, regprocedure, interval, interval, interval,
		interval, integer, interval, bigint, regrole),
	projcache.drop_cache(text), projcache.get(text)
	TO mallory;
});
$node->safe_psql(
	'postgres', q{
SET ROLE mallory;
CREATE FUNCTION mallory.stubborn(keys text[], revisions text[])
RETURNS TABLE(key text, state text, revision text, config jsonb)
LANGUAGE plpgsql AS $$
BEGIN
	FOR i IN 1..600 LOOP
		BEGIN
			PERFORM pg_sleep(0.1);
		EXCEPTION WHEN query_canceled THEN
			NULL;
		END;
	END LOOP;
	RETURN QUERY SELECT k, 'enabled'::text, 'r1'::text, '{}'::jsonb FROM unnest(keys) k;
END $$;
CREATE FUNCTION mallory.slow(keys text[], revisions text[])
RETURNS TABLE(key text, state text, revision text, config jsonb)
LANGUAGE plpgsql AS $$
BEGIN
	PERFORM pg_sleep(1.5);
	RETURN QUERY SELECT k, 'enabled'::text, 'r1'::text, '{}'::jsonb FROM unnest(keys) k;
END $$;
});

is( $node->safe_psql(
		'postgres',
		q{SELECT count(*) FROM generate_series(1, 20) i
		  WHERE projcache.get('hot:h' || i, '20s') IS NOT NULL}),
	'20',
	'the victim cache\'s hot keys are cached');

my @rows = (
	{
		name => 'a function that catches the cancel',
		function => 'mallory.stubborn(text[],text[])',
		settings => ', max_memory => 1048576',
		restarts => 1
	},
	{
		name => 'slow calls, batch_size 1',
		function => 'mallory.slow(text[],text[])',
		settings => ', batch_size => 1, max_memory => 1048576',
		restarts => 0
	});

my $n = 0;
for my $row (@rows)
{
	my $r = $row->{name};
	my $worker = wait_for_worker($node);
	my $log = log_offset($node);

	$n++;
	$node->safe_psql('postgres',
		"SET ROLE mallory; SELECT projcache.create_cache('m$n', '$row->{function}'$row->{settings})"
	);
	ok( $node->poll_query_until(
			'postgres',
			"SELECT count(*) = 1 FROM projcache.caches WHERE name = 'm$n' AND state = 'open'"),
		"$r: mallory's cache is published");

	# The hot keys, read all along.
	my $reader = start_session($node, 'hot_reader', q{
SELECT 'nulls=' || count(*) FILTER (WHERE projcache.get('hot:h' || (i % 20 + 1)) IS NULL)
  FROM generate_series(1, 400000) i});

	# Mallory asks for her keys; then a new key of the victim's cache.
	$node->safe_psql('postgres',
		"SET ROLE mallory; SELECT count(projcache.get('m$n:k' || i)) FROM generate_series(1, 20) i"
	);
	sleep 1;
	my $t0 = time;
	is( $node->safe_psql(
			'postgres', "SELECT projcache.get('hot:new$n', '20s') IS NOT NULL"),
		't',
		"$r: a new key of another cache is fetched meanwhile");
	diag(sprintf("%s: the new key took %.1f s", $r, time - $t0));

	my ($rc, $out, $err) = wait_session($reader);
	chomp $out;
	is($out, 'nulls=0', "$r: the victim's hot keys never read NULL");

	if ($row->{restarts})
	{
		isnt(wait_for_worker($node, $worker), '',
			"$r: the worker ended itself and a new one runs");
		my $said = 0;
		for (1 .. 300)
		{
			$said = log_since($node, $log) =~
			  /named cache "m$n": its fetch function ran past its fetch_timeout/;
			last if $said;
			select(undef, undef, undef, 0.1);
		}
		ok($said, "$r: the new worker says why");
	}
	else
	{
		is(worker_pid($node), $worker, "$r: the worker kept running");
	}
	$node->safe_psql('postgres', "SELECT projcache.drop_cache('m$n')");
}

done_testing();
