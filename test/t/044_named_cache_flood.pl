# Copyright (c) 2026, projcache developers
#
# A cache never evicts another cache's keys (issue 32): a role that owns a
# named cache floods it with far more keys than memory holds, while a
# reader reads the hot keys of another named cache (and of the default
# cache) the whole time.  Each named cache's keys are a pool of their own:
# a cache with max_memory is kept within it, evicting its own keys; under
# the memory's target the largest pool without a budget pays.
#
# Table-driven, under projcache.max_memory = 16MB (about 12 MB for keys),
# 20,000 keys of 1 kB flooded:
# - the flood's cache has a 1 MB budget, the hot cache none;
# - both have budgets;
# - the flood's cache has none (a superuser's, granted to the flooder: it
#   is the largest pool without a budget, and pays), the hot cache has one;
# - the flood is in the default cache, the hot cache has none.
# Each: 0 NULL reads of the hot keys during the flood (counted), no
# eviction counted for the hot cache, the flood's cache over its budget
# never for long (memory_used back within it once the flood ends), and
# evictions counted for it.

use strict;
use warnings;

use FindBin;
use lib $FindBin::RealBin;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use ProjcacheTest;
use Test::More;

my $node = projcache_node('flood',
	conf => "projcache.max_memory = '16MB'\nprojcache.batch_size = 200\n");
my $flood_keys = 20000;
my $hot_keys = 100;

$node->safe_psql(
	'postgres', q{
ALTER EXTENSION projcache UPDATE;
CREATE FUNCTION public.src(keys text[], revisions text[])
RETURNS TABLE(key text, state text, revision text, config jsonb)
LANGUAGE sql AS $$
	SELECT k, 'enabled', 'r1', jsonb_build_object('k', k, 'pad', repeat('x', 1000))
	FROM unnest(keys) k
$$;
CREATE TABLE public.flood_done (at timestamptz);
GRANT SELECT ON public.flood_done TO PUBLIC;
CREATE ROLE app LOGIN;
CREATE ROLE flooder LOGIN;
GRANT USAGE ON SCHEMA projcache TO app, flooder;
GRANT EXECUTE ON FUNCTION projcache.get(text), projcache.get(text, interval)
	TO app, flooder;
GRANT EXECUTE ON FUNCTION
	projcache.create_cache(text, regprocedure, interval, interval, interval,
		interval, integer, interval, bigint, regrole),
	projcache.drop_cache(text)
	TO flooder;

-- Read the hot keys until the flood is done: how many reads, how many NULL.
CREATE FUNCTION public.read_hot(prefixes text[], n int) RETURNS text
LANGUAGE plpgsql AS $$
DECLARE
	reads bigint := 0;
	nulls bigint := 0;
BEGIN
	LOOP
		FOR i IN 1..n LOOP
			FOR p IN 1..array_length(prefixes, 1) LOOP
				reads := reads + 1;
				IF projcache.get(prefixes[p] || i) IS NULL THEN
					nulls := nulls + 1;
				END IF;
			END LOOP;
		END LOOP;
		EXIT WHEN EXISTS (SELECT FROM public.flood_done);
	END LOOP;
	RETURN 'reads=' || reads || ' nulls=' || nulls;
END $$;
});
set_fetch_function($node, 'public.src');

my @rows = (
	{
		name => 'flood cache 1MB, hot cache no budget',
		flood => 'flood',
		flood_budget => 1048576,
		hot_budget => undef
	},
	{
		name => 'flood cache 1MB, hot cache 512kB',
		flood => 'flood',
		flood_budget => 1048576,
		hot_budget => 524288
	},
	{
		# (an owner who is not a superuser must give a budget: this cache
		# is a superuser's, granted to the flooder)
		name => 'flood cache no budget, hot cache 512kB',
		flood => 'flood',
		flood_budget => undef,
		hot_budget => 524288
	},
	{
		name => 'flood in the default cache, hot cache no budget',
		flood => undef,
		hot_budget => undef
	});

for my $row (@rows)
{
	my $r = $row->{name};
	my $hot_memory =
	  defined $row->{hot_budget} ? ", max_memory => $row->{hot_budget}" : '';
	my $flood_memory =
	  defined $row->{flood_budget}
	  ? ", max_memory => $row->{flood_budget}"
	  : '';
	my $flood_prefix = defined $row->{flood} ? 'flood:' : 'f:';
	# The default cache's hot keys share a pool with a flood of the default
	# cache: checked only when the flood is a named cache's.
	my @hot = ('hot:h');
	push @hot, 'd' if defined $row->{flood};

	# A clean start for each row: every key evicted.
	$node->safe_psql(
		'postgres', qq{
TRUNCATE public.flood_done;
SELECT projcache.drop_cache(name) FROM projcache.caches;
});
	$node->poll_query_until('postgres',
		'SELECT count(*) = 0 FROM projcache.caches');
	$node->safe_psql('postgres',
		'SELECT projcache.evict(key) FROM projcache.entries');
	$node->safe_psql(
		'postgres', qq{
SELECT projcache.create_cache('hot', 'public.src(text[],text[])'$hot_memory),
	projcache.grant_cache('hot', 'app');
});
	if (defined $row->{flood} && defined $row->{flood_budget})
	{
		$node->safe_psql('postgres',
			"SET ROLE flooder; SELECT projcache.create_cache('flood', 'public.src(text[],text[])'$flood_memory)"
		);
	}
	elsif (defined $row->{flood})
	{
		$node->safe_psql('postgres',
			"SELECT projcache.create_cache('flood', 'public.src(text[],text[])'), projcache.grant_cache('flood', 'flooder')"
		);
	}
	ok( $node->poll_query_until(
			'postgres',
			"SELECT count(*) = " . (defined $row->{flood} ? 2 : 1)
			  . " FROM projcache.caches WHERE state = 'open'"),
		"$r: the caches are published");

	# The hot keys, cached.
	my $array = 'ARRAY[' . join(',', map { "'$_'" } @hot) . ']';
	is( $node->safe_psql(
			'postgres', qq{
SET ROLE app;
SELECT count(*) FROM generate_series(1, $hot_keys) i, unnest($array) p
WHERE projcache.get(p || i, '20s') IS NOT NULL}),
		$hot_keys * @hot,
		"$r: the hot keys are cached");

	my $reader = start_session($node, 'hot_reader',
		"SET ROLE app; SELECT public.read_hot($array, $hot_keys)");

	# The flood: every key asked for, then again until the cache has
	# evicted for it.
	my $evictions_sql =
	  defined $row->{flood}
	  ? "SELECT evictions > 0 FROM projcache.caches WHERE name = 'flood'"
	  : 'SELECT evictions_memory > 0 FROM projcache.stats';
	my $flooded = 0;
	for my $pass (1 .. 20)
	{
		$node->safe_psql(
			'postgres', qq{
SET ROLE flooder;
SELECT count(projcache.get('$flood_prefix' || i))
FROM generate_series(1, $flood_keys) i});
		if ($node->safe_psql('postgres', $evictions_sql) eq 't'
			&& $pass >= 2)
		{
			$flooded = 1;
			last;
		}
		sleep 1;
	}
	ok($flooded, "$r: the flood made its cache evict");
	$node->safe_psql('postgres',
		'INSERT INTO public.flood_done VALUES (now())');
	my ($rc, $out, $err) = wait_session($reader);
	is($rc, 0, "$r: the reader ran the whole flood") or diag($err);
	my ($reads, $nulls) = $out =~ /reads=(\d+) nulls=(\d+)/;
	diag("$r: $out");
	ok(defined $reads && $reads >= $hot_keys * @hot,
		"$r: the reader read the hot keys at least once");
	is($nulls, 0, "$r: no read of a hot key was NULL during the flood");
	is( $node->safe_psql(
			'postgres',
			"SELECT evictions FROM projcache.caches WHERE name = 'hot'"),
		0,
		"$r: no key of the hot cache was evicted");
	if (defined $row->{flood_budget})
	{
		ok( $node->poll_query_until(
				'postgres',
				"SELECT memory_used <= $row->{flood_budget} FROM projcache.caches WHERE name = 'flood'"
			),
			"$r: the flood's cache is within its budget");
	}
	diag(
		"$r: "
		  . $node->safe_psql(
			'postgres',
			q{SELECT string_agg(name || ' entries=' || entries || ' memory=' || memory_used
			|| ' evictions=' || evictions, '; ' ORDER BY name) FROM projcache.caches}
		  )
		  . '; in the map: '
		  . $node->safe_psql(
			'postgres',
			q{SELECT string_agg(c || ': ' || n || ' keys, ' || v || ' with a value, ' || b || ' value bytes', '; ')
			FROM (SELECT CASE WHEN key LIKE '%:%' THEN split_part(key, ':', 1)
			ELSE 'default' END c, count(*) n,
			count(*) FILTER (WHERE state <> 'pending') v, sum(value_bytes) b
			FROM projcache.entries GROUP BY 1 ORDER BY 1) s}));
}

# The key map checks out: its invariants hold (debug_check_map() raises
# data_corrupted at the first one broken), and it holds the keys
# projcache.entries lists.
my ($checked, $listed) = key_map_check($node);
is($checked, $listed, 'the key map checks out');

log_shows_no_crash($node);

done_testing();
