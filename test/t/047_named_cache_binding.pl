# Copyright (c) 2026, projcache developers
#
# A named cache is bound to its fetch function's identity, not its name
# (issue 40, item 1).  ops's cache runs public.ops_fetch, which reads
# ops.secret.  Table-driven over the ways that function can stop being
# the one registered, after which mallory (who may create functions in
# public) puts her own public.ops_fetch(text[], text[]) there, one that
# copies ops.secret into her table when it runs as ops:
#
# - renamed, moved to another schema, dropped: her function must never run
#   for the cache; the cache is put aside (state 'put_aside', last_error,
#   one WARNING) until ops alters it; across a worker restart and a crash
#   it stays so;
# - given away to mallory (ALTER FUNCTION ... OWNER TO), who then replaces
#   its body: the same;
# - dropped and made again by ops itself: ops's own code, bound again;
#   made again returning one row, not a set: put aside, and no server
#   restart (the call the worker plans is a set-returning one).
#
# Then ops binds the cache again with alter_cache() and it serves ops's
# values.  Last, a dump restored into another cluster (new OIDs) binds the
# cache by signature and owner name, and refuses a function whose owner
# has another name.

use strict;
use warnings;

use FindBin;
use lib $FindBin::RealBin;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use ProjcacheTest;
use Test::More;

my $node = projcache_node('binding');

$node->safe_psql(
	'postgres', q{
CREATE ROLE ops LOGIN;
CREATE ROLE rdr LOGIN;
CREATE ROLE mallory LOGIN;
CREATE SCHEMA ops AUTHORIZATION ops;
CREATE SCHEMA mallory AUTHORIZATION mallory;
GRANT USAGE ON SCHEMA mallory TO PUBLIC;
GRANT CREATE, USAGE ON SCHEMA public TO ops, mallory;
CREATE TABLE ops.secret (k text PRIMARY KEY, v text);
ALTER TABLE ops.secret OWNER TO ops;
INSERT INTO ops.secret SELECT 'k' || i, 'secret-' || i FROM generate_series(1, 50) i;
CREATE TABLE mallory.loot (v text);
ALTER TABLE mallory.loot OWNER TO mallory;
GRANT INSERT ON mallory.loot TO PUBLIC;
CREATE TABLE public.mallory_ran (at timestamptz DEFAULT now(), who text);
GRANT INSERT ON public.mallory_ran TO PUBLIC;
GRANT USAGE ON SCHEMA projcache TO ops, rdr, mallory;
GRANT EXECUTE ON FUNCTION
	projcache.create_cache(text, regprocedure, interval, interval, interval,
		interval, integer, interval, bigint, regrole),
	projcache.alter_cache(text, regprocedure, interval, interval, interval,
		interval, integer, interval, bigint, regrole),
	projcache.drop_cache(text), projcache.grant_cache(text, regrole),
	projcache.invalidate(text)
	TO ops;
GRANT EXECUTE ON FUNCTION projcache.get(text), projcache.get(text, interval),
	projcache.caches_1_3_1()
	TO ops, rdr, mallory;
GRANT SELECT ON projcache.caches TO ops, rdr, mallory;
});

# ops's fetch function, in schema $schema under name $name.
sub ops_function
{
	my ($schema, $name) = @_;
	return qq{
SET ROLE ops;
CREATE FUNCTION $schema.$name(keys text[], revisions text[])
RETURNS TABLE(key text, state text, revision text, config jsonb)
LANGUAGE sql AS \$\$
	SELECT s.k, 'enabled', 'r1', jsonb_build_object('v', s.v)
	  FROM ops.secret s WHERE s.k = ANY (keys)
\$\$;
RESET ROLE;
};
}

# mallory's: what she would have run as ops.  CREATE OR REPLACE, so that
# it also replaces a function she was given.
my $mallory_body = q{
RETURNS TABLE(key text, state text, revision text, config jsonb)
LANGUAGE plpgsql AS $$
BEGIN
	INSERT INTO public.mallory_ran (who) VALUES (current_user);
	INSERT INTO mallory.loot SELECT v FROM ops.secret;
	RETURN QUERY SELECT k, 'enabled'::text, 'r9'::text,
		jsonb_build_object('v', 'mallory') FROM unnest(keys) k;
END $$;
};
my $mallory_function = qq{
SET ROLE mallory;
CREATE OR REPLACE FUNCTION public.ops_fetch(keys text[], revisions text[])
$mallory_body
RESET ROLE;
};

sub mallory_ran
{
	return $node->safe_psql('postgres',
		'SELECT (SELECT count(*) FROM public.mallory_ran) + (SELECT count(*) FROM mallory.loot)'
	);
}

sub cache_state
{
	my ($cache) = @_;
	return $node->safe_psql('postgres',
		"SELECT state FROM projcache.caches WHERE name = '$cache'");
}

# Wait (30 s at most) for the cache's state; returns the last one seen.
sub state_becomes
{
	my ($cache, $want) = @_;
	my $got = '';

	for (1 .. 600)
	{
		$got = cache_state($cache);
		last if $got eq $want;
		select(undef, undef, undef, 0.05);
	}
	return $got;
}

# rdr's read of a key of the cache, waiting up to $wait.
sub read_key
{
	my ($cache, $key, $wait) = @_;
	return $node->safe_psql('postgres',
		"SET ROLE rdr; SELECT coalesce(projcache.get('$cache:$key', '$wait') ->> 'v', 'NULL')"
	);
}

my @moves = (
	{
		name => 'renamed',
		move => 'ALTER FUNCTION public.ops_fetch(text[], text[]) RENAME TO ops_fetch_old',
		by => 'ops',
		mallory => 1,
		rebind => 'public.ops_fetch_old(text[],text[])',
		restarts => 1
	},
	{
		name => 'moved to another schema',
		move => 'ALTER FUNCTION public.ops_fetch(text[], text[]) SET SCHEMA ops',
		by => 'ops',
		mallory => 1,
		rebind => 'ops.ops_fetch(text[],text[])'
	},
	{
		name => 'dropped',
		move => 'DROP FUNCTION public.ops_fetch(text[], text[])',
		by => 'ops',
		mallory => 1,
		rebind => 'ops.again(text[],text[])',
		make => ops_function('ops', 'again')
	},
	{
		name => 'given away',
		move => 'ALTER FUNCTION public.ops_fetch(text[], text[]) OWNER TO mallory',
		by => 'superuser',
		mallory => 1,
		rebind => 'ops.again2(text[],text[])',
		make => ops_function('ops', 'again2')
	},
	{
		name => 'dropped and made again by its owner',
		move => 'DROP FUNCTION public.ops_fetch(text[], text[])',
		by => 'ops',
		mallory => 0,
		make => ops_function('public', 'ops_fetch')
	},
	{
		# Not a set-returning function: the call the worker builds is one,
		# and the planner of an assert build stops the server when the
		# function it names is not (its Assert, not an ERROR).
		name => 'made again by its owner returning one row',
		move => 'DROP FUNCTION public.ops_fetch(text[], text[])',
		by => 'ops',
		mallory => 0,
		put_aside => 1,
		make => q{
SET ROLE ops;
CREATE TYPE ops.one_row AS (key text, state text, revision text, config jsonb);
CREATE FUNCTION public.ops_fetch(keys text[], revisions text[])
RETURNS ops.one_row LANGUAGE sql AS $$
	SELECT s.k, 'enabled', 'r1', jsonb_build_object('v', s.v)
	  FROM ops.secret s WHERE s.k = ANY (keys) LIMIT 1
$$;
RESET ROLE;
},
		rebind => 'ops.again3(text[],text[])',
		remake => ops_function('ops', 'again3')
	});

my $n = 0;
for my $row (@moves)
{
	my $r = $row->{name};
	my $cache = 'o' . ++$n;

	$node->safe_psql('postgres', ops_function('public', 'ops_fetch'));
	$node->safe_psql(
		'postgres', qq{
SET ROLE ops;
SELECT projcache.create_cache('$cache', 'public.ops_fetch(text[],text[])',
	expiry => '1h', max_memory => 1048576),
	projcache.grant_cache('$cache', 'rdr');
});
	is(state_becomes($cache, 'open'), 'open', "$r: the cache opens");
	is(read_key($cache, 'k1', '10s'), 'secret-1', "$r: rdr reads ops's value");

	my $log = log_offset($node);
	my $started = $node->safe_psql('postgres', 'SELECT pg_postmaster_start_time()');
	$node->safe_psql('postgres',
		($row->{by} eq 'ops' ? 'SET ROLE ops; ' : '') . $row->{move});
	$node->safe_psql('postgres', $row->{make}) if $row->{make} && !$row->{mallory};
	$node->safe_psql('postgres', $mallory_function) if $row->{mallory};

	if (!$row->{mallory} && !$row->{put_aside})
	{
		# Its owner's own function of that name: bound again, and run.
		is(read_key($cache, 'k2', '10s'), 'secret-2',
			"$r: the cache runs its owner's new function");
		is(cache_state($cache), 'open', "$r: the cache stays open");
		$node->safe_psql('postgres', "SET ROLE ops; SELECT projcache.drop_cache('$cache')");
		$node->safe_psql('postgres', 'DROP FUNCTION public.ops_fetch(text[], text[])');
		next;
	}

	is(state_becomes($cache, 'put_aside'), 'put_aside',
		"$r: the cache is put aside");
	like(
		$node->safe_psql('postgres',
			"SELECT last_error FROM projcache.caches WHERE name = '$cache'"),
		qr/named cache "$cache" is put aside/,
		"$r: last_error says why");

	# The view binds as the caller's snapshot sees the catalogs; the worker
	# binds at its next reload of the registry (a second at most), and says
	# so once.
	my $said = 0;
	for (1 .. 300)
	{
		$said = log_since($node, $log) =~ /WARNING:  named cache "$cache" is put aside/;
		last if $said;
		select(undef, undef, undef, 0.1);
	}
	ok($said, "$r: a WARNING says so");

	# New keys, and a refetch of a cached one: mallory's code runs for none.
	$node->safe_psql('postgres', "SET ROLE ops; SELECT projcache.invalidate('$cache:k1')");
	is(read_key($cache, 'k2', '2s'), 'NULL', "$r: a new key is not fetched");
	isnt(read_key($cache, 'k1', '0s'), 'mallory', "$r: the cached key is not refetched by her function");
	is(mallory_ran(), '0', "$r: mallory's function never ran");
	is($node->safe_psql('postgres', 'SELECT pg_postmaster_start_time()'),
		$started, "$r: the server did not restart");

	if ($row->{restarts})
	{
		# A new worker, and a crash: the binding is computed again, the same.
		my $worker = worker_pid($node);
		$node->safe_psql('postgres', "SELECT pg_terminate_backend($worker)");
		isnt(wait_for_worker($node, $worker), '', "$r: a new worker runs");
		is(read_key($cache, 'k3', '2s'), 'NULL', "$r: after a worker restart, a new key is not fetched");
		is(cache_state($cache), 'put_aside', "$r: after a worker restart, still put aside");
		$node->stop('immediate');
		$node->start;
		is(state_becomes($cache, 'put_aside'), 'put_aside', "$r: after a crash, still put aside");
		is(read_key($cache, 'k4', '2s'), 'NULL', "$r: after a crash, a new key is not fetched");
		is(mallory_ran(), '0', "$r: mallory's function never ran across the restarts");
	}

	# ops binds it again, to its own function.
	$node->safe_psql('postgres', $row->{make}) if $row->{make} && $row->{mallory};
	$node->safe_psql('postgres', $row->{remake}) if $row->{remake};
	$node->safe_psql('postgres',
		"SET ROLE ops; SELECT projcache.alter_cache('$cache', fetch_function => '$row->{rebind}')");
	is(state_becomes($cache, 'open'), 'open', "$r: alter_cache binds it again");
	is(read_key($cache, 'k2', '10s'), 'secret-2', "$r: then its keys are fetched by ops's function");
	is(mallory_ran(), '0', "$r: and mallory's function still never ran");

	$node->safe_psql('postgres', "SET ROLE ops; SELECT projcache.drop_cache('$cache')");
	$node->safe_psql(
		'postgres', q{
DROP FUNCTION IF EXISTS public.ops_fetch(text[], text[]);
DROP FUNCTION IF EXISTS public.ops_fetch_old(text[], text[]);
DROP FUNCTION IF EXISTS ops.ops_fetch(text[], text[]);
DROP FUNCTION IF EXISTS ops.again(text[], text[]);
DROP FUNCTION IF EXISTS ops.again2(text[], text[]);
DROP FUNCTION IF EXISTS ops.again3(text[], text[]);
DROP TYPE IF EXISTS ops.one_row;
});
}

# ---------------------------------------------------------------------------
# A dump restored into another cluster: the function gets another OID
# there.  The cache is bound by its signature and its owner's name; with
# the function owned by a role of another name, it is put aside.
# ---------------------------------------------------------------------------
$node->safe_psql('postgres', ops_function('public', 'ops_fetch'));
$node->safe_psql(
	'postgres', q{
SET ROLE ops;
SELECT projcache.create_cache('dumped', 'public.ops_fetch(text[],text[])',
	expiry => '1h', max_memory => 1048576),
	projcache.grant_cache('dumped', 'rdr');
});
my $dump = $node->basedir . '/binding.dump';
$node->command_ok(
	[ 'pg_dump', '-Fc', '-f', $dump, '-d', $node->connstr('postgres') ],
	'pg_dump of the database with the registry');

for my $case ('same owner', 'another owner')
{
	my $other = PostgreSQL::Test::Cluster->new('restored_' . ($case =~ s/ /_/gr));
	$other->init;
	$other->append_conf('postgresql.conf', projcache_base_conf());
	$other->start;
	$other->safe_psql('postgres', 'CREATE ROLE ops LOGIN; CREATE ROLE rdr LOGIN; CREATE ROLE mallory LOGIN;');
	# Fill the OIDs the old cluster's function had, so that it surely differs.
	$other->safe_psql('postgres',
		q{DO $$ BEGIN FOR i IN 1..50 LOOP EXECUTE 'CREATE FUNCTION public.filler' || i || '() RETURNS int LANGUAGE sql AS ''SELECT 1'''; END LOOP; END $$});
	$other->command_ok(
		[ 'pg_restore', '-d', $other->connstr('postgres'), $dump ],
		"$case: pg_restore into another cluster");
	$other->safe_psql('postgres',
		'ALTER FUNCTION public.ops_fetch(text[], text[]) OWNER TO mallory')
	  if $case eq 'another owner';
	my $want = $case eq 'same owner' ? 'open' : 'put_aside';
	my $got = '';
	for (1 .. 600)
	{
		$got = $other->safe_psql('postgres',
			"SELECT state FROM projcache.caches WHERE name = 'dumped'");
		last if $got eq $want;
		select(undef, undef, undef, 0.05);
	}
	is($got, $want, "$case: the restored cache is $want");
	isnt(
		$other->safe_psql('postgres',
			"SELECT fetch_function_oid FROM projcache.cache_registry WHERE name = 'dumped'"),
		$other->safe_psql('postgres',
			"SELECT 'public.ops_fetch(text[],text[])'::regprocedure::oid"),
		"$case: the restored row's OID is not the function's here");
	is( $other->safe_psql('postgres',
			"SET ROLE rdr; SELECT coalesce(projcache.get('dumped:k5', '10s') ->> 'v', 'NULL')"
		),
		$case eq 'same owner' ? 'secret-5' : 'NULL',
		"$case: a key of the restored cache reads "
		  . ($case eq 'same owner' ? "ops's value" : 'nothing'));
	$other->stop;
}

done_testing();
