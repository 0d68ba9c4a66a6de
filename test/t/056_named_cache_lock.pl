# Copyright (c) 2026, projcache developers
#
# No role's open transaction holds back another owner's revoke_cache or
# drop_cache (issue 40, item 3): 1.3 locked the whole registry (SHARE ROW
# EXCLUSIVE) at each change, before it checked that the caller owns the
# cache, and kept the lock until the caller's transaction ended.  Now a
# change locks its cache's row once the caller is known to own it, and
# create_cache (or alter_cache of a max_memory) locks the registry's
# totals, which narrowing does not need.  Table-driven over what mallory
# leaves open in her transaction: a grant of her cache to a reader it has
# already (nothing to change), a grant of ops's cache (refused, the error
# caught), a create_cache, an alter_cache, a revoke and a drop of her own.
# Meanwhile ops revokes his cache from its reader and drops another of
# his, each with a lock_timeout of 20 s, which only a wait for mallory's
# transaction would reach; then the revoked reader is refused at once.

use strict;
use warnings;

use FindBin;
use lib $FindBin::RealBin;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use ProjcacheTest;
use Test::More;

my $node = projcache_node('lock');

$node->safe_psql(
	'postgres', q{
CREATE ROLE ops LOGIN;
CREATE ROLE rdr LOGIN;
CREATE ROLE mallory LOGIN;
GRANT USAGE ON SCHEMA projcache TO ops, rdr, mallory;
GRANT EXECUTE ON FUNCTION projcache.get(text), projcache.get(text, interval)
	TO ops, rdr, mallory;
GRANT EXECUTE ON FUNCTION
	projcache.create_cache(text, regprocedure, interval, interval, interval,
		interval, integer, interval, bigint, regrole),
	projcache.alter_cache(text, regprocedure, interval, interval, interval,
		interval, integer, interval, bigint, regrole),
	projcache.drop_cache(text), projcache.grant_cache(text, regrole),
	projcache.revoke_cache(text, regrole) TO ops, mallory;
CREATE FUNCTION public.src(keys text[], revisions text[])
RETURNS TABLE(key text, state text, revision text, config jsonb)
LANGUAGE sql AS $$
	SELECT k, 'enabled', 'r1', jsonb_build_object('k', k) FROM unnest(keys) k
$$;
SET ROLE ops;
SELECT projcache.create_cache('c', 'public.src(text[],text[])',
	expiry => '1h', max_memory => 1048576),
	projcache.grant_cache('c', 'rdr');
SELECT projcache.create_cache('d', 'public.src(text[],text[])',
	expiry => '1h', max_memory => 65536);
SET ROLE mallory;
SELECT projcache.create_cache('m', 'public.src(text[],text[])',
	expiry => '1h', max_memory => 65536),
	projcache.grant_cache('m', 'rdr');
});
ok( $node->poll_query_until(
		'postgres',
		"SELECT count(*) = 3 FROM projcache.caches WHERE state = 'open'"),
	'the caches are open');

# rdr reads c's key, once the worker has fetched it.
sub rdr_reads
{
	my ($rc, $out) = $node->psql('postgres',
		"SET ROLE rdr; SELECT projcache.get('c:k1', '10s') ->> 'k'");
	return $rc == 0 && $out eq 'k1';
}
ok(rdr_reads(), 'rdr reads c');

my @cases = (
	{
		name => 'a grant of her cache to a reader it has',
		sql => q{SELECT projcache.grant_cache('m', 'rdr')},
	},
	{
		name => "a grant of ops's cache, refused and caught",
		sql => q{DO $$ BEGIN
	PERFORM projcache.grant_cache('c', 'mallory');
EXCEPTION WHEN insufficient_privilege THEN NULL;
END $$},
	},
	{
		name => 'a create_cache',
		sql => q{SELECT projcache.create_cache('m2', 'public.src(text[],text[])', max_memory => 65536)},
	},
	{
		name => 'an alter_cache of her cache',
		sql => q{SELECT projcache.alter_cache('m', expiry => '2h', max_memory => 131072)},
	},
	{
		name => 'a revoke of her cache',
		sql => q{SELECT projcache.revoke_cache('m', 'rdr')},
	},
	{
		name => 'a drop of her cache',
		sql => q{SELECT projcache.drop_cache('m')},
	});

my $m = $node->background_psql('postgres');
$m->query_safe('SET ROLE mallory');
for my $case (@cases)
{
	my $name = $case->{name};

	$m->query_safe('BEGIN');
	$m->query_safe($case->{sql});

	my ($rc, $out, $err) = $node->psql('postgres',
		"SET ROLE ops; SET lock_timeout = '20s'; SELECT projcache.revoke_cache('c', 'rdr')"
	);
	is($rc, 0, "$name, left open: ops revokes his cache") or diag($err);
	ok(!rdr_reads(), "$name, left open: the revoked reader is refused");
	($rc, $out, $err) = $node->psql('postgres',
		"SET ROLE ops; SET lock_timeout = '20s'; SELECT projcache.drop_cache('d')"
	);
	is($rc, 0, "$name, left open: ops drops his other cache") or diag($err);

	$m->query_safe('ROLLBACK');
	$node->safe_psql(
		'postgres', q{SET ROLE ops;
SELECT projcache.grant_cache('c', 'rdr');
SELECT projcache.create_cache('d', 'public.src(text[],text[])',
	expiry => '1h', max_memory => 65536)});
	ok( $node->poll_query_until(
			'postgres',
			"SELECT count(*) = 3 FROM projcache.caches WHERE state = 'open'"),
		"$name: c and d open again");
	ok(rdr_reads(), "$name: rdr reads c again");
}
$m->quit;

done_testing();
