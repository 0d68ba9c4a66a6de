# Copyright (c) 2026, projcache developers
#
# A cache's fetch runs exactly the function it is bound to, called by its
# OID, never by its name looked up again (issue 40, item 1).  ops's cache
# "o" is bound to public.ops_fetch(text[], text[]), which reads ops's
# private table; mallory may create functions in public.  Table-driven over
# what mallory puts beside it:
# - an overload with a defaulted third argument, in the same schema (the
#   call by name "public.ops_fetch($1, $2)" is ambiguous, and 1.3 fails
#   every fetch of the cache);
# - an overload with a VARIADIC third argument that has a default (the
#   same);
# - a function of that name and signature in a schema before public in
#   ops's search path;
# - a function of that name in the worker's pg_temp, made by mallory's own
#   cache's fetch;
# - the same overload beside the default cache's projcache.fetch_function.
# In each, ops reads a new key and gets its own value, and none of
# mallory's functions ran (they would leave a row in public.loot).

use strict;
use warnings;

use FindBin;
use lib $FindBin::RealBin;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use ProjcacheTest;
use Test::More;

my $node = projcache_node('overload');

$node->safe_psql(
	'postgres', q{
CREATE ROLE ops LOGIN;
CREATE ROLE mallory LOGIN;
CREATE SCHEMA ops AUTHORIZATION ops;
CREATE SCHEMA mal AUTHORIZATION mallory;
GRANT USAGE ON SCHEMA mal TO ops;
GRANT CREATE, USAGE ON SCHEMA public TO ops, mallory;
CREATE TABLE ops.secret (k text PRIMARY KEY, v text);
ALTER TABLE ops.secret OWNER TO ops;
INSERT INTO ops.secret SELECT 'k' || i, 'secret-' || i FROM generate_series(1, 50) i;
CREATE TABLE public.loot (v text);
GRANT INSERT, SELECT ON public.loot TO PUBLIC;
GRANT USAGE ON SCHEMA projcache TO ops, mallory;
GRANT EXECUTE ON FUNCTION
	projcache.create_cache(text, regprocedure, interval, interval, interval,
		interval, integer, interval, bigint, regrole)
	TO ops, mallory;
GRANT EXECUTE ON FUNCTION projcache.get(text), projcache.get(text, interval)
	TO ops, mallory;
SET ROLE ops;
CREATE FUNCTION public.ops_fetch(keys text[], revisions text[])
RETURNS TABLE(key text, state text, revision text, config jsonb)
LANGUAGE sql AS $$
	SELECT s.k, 'enabled', 'r1', jsonb_build_object('v', s.v)
	  FROM ops.secret s WHERE s.k = ANY (keys)
$$;
CREATE FUNCTION public.dflt_fetch(keys text[], revisions text[])
RETURNS TABLE(key text, state text, revision text, config jsonb)
LANGUAGE plpgsql AS $$
BEGIN
	RETURN QUERY SELECT s.k, 'enabled'::text, 'r1'::text,
		jsonb_build_object('v', s.v) FROM ops.secret s WHERE s.k = ANY (keys);
END $$;
SELECT projcache.create_cache('o', 'public.ops_fetch(text[],text[])',
	expiry => '1h', max_memory => 1048576);
SET ROLE mallory;
-- mallory's own cache: its fetch leaves a function in the worker's pg_temp
CREATE FUNCTION mal.m_fetch(keys text[], revisions text[])
RETURNS TABLE(key text, state text, revision text, config jsonb)
LANGUAGE plpgsql AS $$
BEGIN
	IF keys[1] = 'temp' THEN
		EXECUTE $f$CREATE FUNCTION pg_temp.ops_fetch(keys text[], revisions text[])
			RETURNS TABLE(key text, state text, revision text, config jsonb)
			LANGUAGE plpgsql AS $b$ BEGIN
				INSERT INTO public.loot VALUES ('pg_temp ran as ' || current_user);
				RETURN QUERY SELECT k, 'enabled'::text, 'r1'::text, '"mallory"'::jsonb
					FROM unnest(keys) k;
			END $b$ $f$;
	END IF;
	RETURN QUERY SELECT k, 'enabled'::text, 'r1'::text, '"m"'::jsonb FROM unnest(keys) k;
END $$;
SELECT projcache.create_cache('m', 'mal.m_fetch(text[],text[])',
	expiry => '1h', max_memory => 65536);
});
set_fetch_function($node, 'public.dflt_fetch');
ok( $node->poll_query_until(
		'postgres',
		"SELECT count(*) = 2 FROM projcache.caches WHERE state = 'open'"),
	'both caches are open');

# A body that says it ran, and as whom, and answers "mallory".
my $body = q{
RETURNS TABLE(key text, state text, revision text, config jsonb)
LANGUAGE plpgsql AS $$
BEGIN
	INSERT INTO public.loot VALUES (current_user);
	RETURN QUERY SELECT k, 'enabled'::text, 'r1'::text, '"mallory"'::jsonb
		FROM unnest(keys) k;
END $$};

my @cases = (
	{
		name => 'an overload with a defaulted argument, same schema',
		setup => "SET ROLE mallory; CREATE FUNCTION public.ops_fetch(keys text[], revisions text[], x int DEFAULT 0) $body;"
		  . " GRANT EXECUTE ON FUNCTION public.ops_fetch(text[], text[], int) TO PUBLIC;",
		cleanup => 'DROP FUNCTION public.ops_fetch(text[], text[], int)',
		key => 'o:k2',
		want => 'secret-2',
	},
	{
		name => 'an overload with a VARIADIC argument that has a default',
		setup => "SET ROLE mallory; CREATE FUNCTION public.ops_fetch(keys text[], revisions text[], VARIADIC more text[] DEFAULT '{}') $body;",
		cleanup => 'DROP FUNCTION public.ops_fetch(text[], text[], text[])',
		key => 'o:k3',
		want => 'secret-3',
	},
	{
		name => "a function of that name in a schema earlier in ops's search_path",
		setup => "SET ROLE mallory; CREATE FUNCTION mal.ops_fetch(keys text[], revisions text[]) $body;"
		  . ' GRANT EXECUTE ON FUNCTION mal.ops_fetch(text[], text[]) TO PUBLIC;'
		  . ' RESET ROLE; ALTER ROLE ops SET search_path = mal, public;',
		cleanup => 'DROP FUNCTION mal.ops_fetch(text[], text[]); ALTER ROLE ops RESET search_path',
		key => 'o:k4',
		want => 'secret-4',
	},
	{
		name => "a function of that name in the worker's pg_temp",
		setup => q{SET ROLE mallory; SELECT projcache.get('m:temp', '10s')},
		setup_gives => '"m"',
		cleanup => '',
		key => 'o:k5',
		want => 'secret-5',
	},
	{
		name => "an overload with a defaulted argument beside the default cache's function",
		setup => "SET ROLE mallory; CREATE FUNCTION public.dflt_fetch(keys text[], revisions text[], x int DEFAULT 0) $body;",
		cleanup => 'DROP FUNCTION public.dflt_fetch(text[], text[], int)',
		key => 'k6',
		want => 'secret-6',
	});

for my $case (@cases)
{
	my $name = $case->{name};

	my $gave = $node->safe_psql('postgres', $case->{setup});
	is($gave, $case->{setup_gives}, "$name: mallory's fetch ran")
	  if defined $case->{setup_gives};
	my ($rc, $out, $err) = $node->psql('postgres',
		"SET ROLE ops; SELECT projcache.get('$case->{key}', '10s') ->> 'v'");
	my $why = $node->safe_psql('postgres',
		"SELECT coalesce(last_error, '') FROM projcache.entries WHERE key = '$case->{key}'"
	);
	is($out, $case->{want}, "$name: ops reads its own value")
	  or diag("rc=$rc err=$err last_error=$why");
	is($node->safe_psql('postgres', 'SELECT count(*) FROM public.loot'),
		'0', "$name: none of mallory's functions ran");
	$node->safe_psql('postgres', $case->{cleanup}) if $case->{cleanup} ne '';
}

# The cache still runs its function once mallory's are gone.
is( $node->safe_psql(
		'postgres', "SET ROLE ops; SELECT projcache.get('o:k7', '10s') ->> 'v'"),
	'secret-7',
	'ops reads a new key afterwards');

done_testing();
