# Copyright (c) 2026, projcache developers
#
# The pause after a fetch function overran its timeout belongs to the
# cache's owner, not to the cache or the function (issue 40, item 4).
# A role's function catches the statement timeout's cancel
# (fetch_timeout => 200ms): the worker ends itself 1 s past it, and the
# next one puts her keys aside for 30 s.  Table-driven over how she tries
# to start the count over once the worker has ended: drop the cache and
# make it again under its name, or under another name, with the same
# function; or drop the function and make it again (a new OID).  Each row
# is another role's.  In the 20 s after the first overrun, the worker must not end
# again (1.3 kept the pause in the cache's slot: each new cache ended the
# worker again about every 4 s).  Meanwhile another owner's cache is
# fetched as usual.

use strict;
use warnings;

use FindBin;
use lib $FindBin::RealBin;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use ProjcacheTest;
use Test::More;
use Time::HiRes qw(time);

my $node = projcache_node('overrun', conf => "projcache.fetch_timeout = '2s'\n");

$node->safe_psql(
	'postgres', q{
CREATE FUNCTION public.src(keys text[], revisions text[])
RETURNS TABLE(key text, state text, revision text, config jsonb)
LANGUAGE sql AS $$
	SELECT k, 'enabled', 'r1', jsonb_build_object('k', k) FROM unnest(keys) k
$$;
SELECT projcache.create_cache('other', 'public.src(text[],text[])');
});

# Role $role's function that will not stop.
sub stubborn_sql
{
	my ($role) = @_;
	return qq{
SET ROLE $role;
CREATE FUNCTION $role.stubborn(keys text[], revisions text[])
RETURNS TABLE(key text, state text, revision text, config jsonb)
LANGUAGE plpgsql AS \$\$
BEGIN
	FOR i IN 1..300 LOOP
		BEGIN
			PERFORM pg_sleep(0.1);
		EXCEPTION WHEN query_canceled THEN
			NULL;
		END;
	END LOOP;
	RETURN QUERY SELECT k, 'enabled'::text, 'r1'::text, '{}'::jsonb FROM unnest(keys) k;
END \$\$;
RESET ROLE;
};
}

for my $role ('m1', 'm2', 'm3')
{
	$node->safe_psql(
		'postgres', qq{
CREATE ROLE $role LOGIN;
CREATE SCHEMA $role AUTHORIZATION $role;
GRANT USAGE ON SCHEMA projcache TO $role;
GRANT EXECUTE ON FUNCTION
	projcache.create_cache(text, regprocedure, interval, interval, interval,
		interval, integer, interval, bigint, regrole),
	projcache.drop_cache(text), projcache.get(text), projcache.caches_1_3_1()
	TO $role;
GRANT SELECT ON projcache.caches TO $role;
} . stubborn_sql($role));
}

my $mallory;

sub make_cache
{
	my ($name) = @_;
	$node->safe_psql('postgres',
		"SET ROLE $mallory; SELECT projcache.create_cache('$name', '$mallory.stubborn(text[],text[])',"
		  . " fetch_timeout => '200ms', max_memory => 1048576)");
	return $node->poll_query_until('postgres',
		"SELECT count(*) = 1 FROM projcache.caches WHERE name = '$name' AND state = 'open'");
}

my @rows = (
	{ name => 'made again under its name', role => 'm1', rename => 0 },
	{ name => 'made again under another name', role => 'm2', rename => 1 },
	{ name => 'its function made again', role => 'm3', rename => 0, refunction => 1 });

my $k = 0;
for my $row (@rows)
{
	my $r = $row->{name};
	my $cache = "c_$row->{role}";
	my $worker = wait_for_worker($node);

	$mallory = $row->{role};
	ok(make_cache($cache), "$r: the role's cache opens");
	$node->safe_psql('postgres',
		"SET ROLE $mallory; SELECT projcache.get('$cache:k" . ++$k . "')");
	my $next = wait_for_worker($node, $worker);
	isnt($next, '', "$r: her function's overrun ended the worker");

	# Her moves: a new cache with the same function, and her keys asked
	# for, over and over, for 20 s.
	my $restarts = 0;
	my $generation = 0;
	my $start = time;
	while (time - $start < 20)
	{
		my $pid = worker_pid($node);
		if ($pid ne '' && $pid ne $next)
		{
			$restarts++;
			$next = $pid;
		}
		$node->safe_psql('postgres', "SET ROLE $mallory; SELECT projcache.drop_cache('$cache')");
		$cache = "c_$row->{role}_" . ++$generation if $row->{rename};
		$node->safe_psql('postgres',
			"SET ROLE $mallory; DROP FUNCTION $mallory.stubborn(text[], text[]); "
			  . stubborn_sql($mallory))
		  if $row->{refunction};
		make_cache($cache);
		$node->safe_psql('postgres',
			"SET ROLE $mallory; SELECT projcache.get('$cache:k" . ++$k . "')");
		select(undef, undef, undef, 0.5);
	}
	is($restarts, 0, "$r: the worker did not end again within the pause");
	is( $node->safe_psql('postgres',
			"SELECT projcache.get('other:new$k', '10s') ->> 'k'"),
		"new$k",
		"$r: another owner's cache is fetched meanwhile");
	$node->safe_psql('postgres', "SET ROLE $mallory; SELECT projcache.drop_cache('$cache')");
}

done_testing();
