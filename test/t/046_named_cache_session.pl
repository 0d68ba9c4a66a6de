# Copyright (c) 2026, projcache developers
#
# Every cache's function runs in the worker's one session (issue 32): what
# a session keeps across transactions must not carry one cache's rights to
# another's function.  dblink keeps its connections so: the keys team's
# function (run as a superuser, which may connect without a password)
# opens a named connection to the database of its secrets and, as dblink
# users often do, leaves it open; mallory's function (not a superuser)
# then tries to read the secrets through it, by its name, and through the
# unnamed connection.  Once named caches exist, each call closes the
# connections it left, so mallory's reads fail and her keys get no secret.

use strict;
use warnings;

use FindBin;
use lib $FindBin::RealBin;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use ProjcacheTest;
use Test::More;

my $node = projcache_node('session');

$node->safe_psql(
	'postgres', q{
CREATE DATABASE keysrc;
CREATE EXTENSION dblink;
CREATE ROLE mallory LOGIN;
CREATE SCHEMA mallory AUTHORIZATION mallory;
GRANT USAGE ON SCHEMA projcache TO mallory;
GRANT EXECUTE ON FUNCTION
	projcache.create_cache(text, regprocedure, interval, interval, interval,
		interval, integer, interval, bigint, regrole),
	projcache.get(text), projcache.get(text, interval), projcache.lookup(text, interval)
	TO mallory;
});
$node->safe_psql('keysrc',
	q{CREATE TABLE secrets (k text, secret text); INSERT INTO secrets VALUES ('a', 'top-secret')});
my $connstr = $node->connstr('keysrc') =~ s/'/''/gr;
$node->safe_psql(
	'postgres', qq{
CREATE FUNCTION public.keys_fetch(keys text[], revisions text[])
RETURNS TABLE(key text, state text, revision text, config jsonb)
LANGUAGE plpgsql AS \$\$
BEGIN
	IF NOT ('src' = ANY (coalesce(dblink_get_connections(), '{}'))) THEN
		PERFORM dblink_connect('src', '$connstr');
	END IF;
	PERFORM dblink_connect('$connstr');
	IF 'boom' = ANY (keys) THEN
		RAISE EXCEPTION 'the source failed after connecting';
	END IF;
	RETURN QUERY SELECT k, 'enabled'::text, 'r1'::text,
		jsonb_build_object('secret', s.secret)
	FROM unnest(keys) k
	LEFT JOIN dblink('src', 'SELECT k, secret FROM secrets') AS s(sk text, secret text)
	  ON s.sk = k;
END \$\$;
SELECT projcache.create_cache('keys', 'public.keys_fetch(text[],text[])');
});
$node->safe_psql(
	'postgres', q{
SET ROLE mallory;
CREATE FUNCTION mallory.steal(keys text[], revisions text[])
RETURNS TABLE(key text, state text, revision text, config jsonb)
LANGUAGE plpgsql AS $$
DECLARE
	by_name text;
	unnamed text;
BEGIN
	BEGIN
		SELECT s INTO by_name FROM dblink('src', 'SELECT secret FROM secrets') AS t(s text);
	EXCEPTION WHEN OTHERS THEN
		by_name := 'refused';
	END;
	BEGIN
		SELECT s INTO unnamed FROM dblink('SELECT secret FROM secrets') AS t(s text);
	EXCEPTION WHEN OTHERS THEN
		unnamed := 'refused';
	END;
	RETURN QUERY SELECT k, 'enabled'::text, 'r1'::text,
		jsonb_build_object('by_name', by_name, 'unnamed', unnamed) FROM unnest(keys) k;
END $$;
SELECT projcache.create_cache('loot', 'mallory.steal(text[],text[])',
	max_memory => 1048576);
});
ok( $node->poll_query_until(
		'postgres', "SELECT count(*) = 2 FROM projcache.caches WHERE state = 'open'"),
	'both caches are published');

is($node->safe_psql('postgres', q{SELECT projcache.get('keys:a', '10s') ->> 'secret'}),
	'top-secret', 'the keys team\'s function reads its secret over dblink');
my $loot = $node->safe_psql('postgres',
	q{SET ROLE mallory; SELECT projcache.get('loot:x', '10s')::text});
diag("mallory's function read: $loot");
is($loot, '{"by_name": "refused", "unnamed": "refused"}',
	'mallory\'s function finds neither connection the other function opened');

# And the other way round: mallory's next call comes right after the keys
# team's, in the same batch.
$node->safe_psql('postgres',
	q{SELECT projcache.invalidate('keys:a'), projcache.invalidate('loot:x')});
ok( $node->poll_query_until(
		'postgres',
		q{SELECT count(*) = 2 FROM projcache.entries
		  WHERE key IN ('keys:a', 'loot:x') AND freshness = 'fresh' AND fetch_state = 'complete'}),
	'both keys are fetched again');
is( $node->safe_psql(
		'postgres', q{SET ROLE mallory; SELECT projcache.get('loot:x')::text}),
	'{"by_name": "refused", "unnamed": "refused"}',
	'fetched again together, mallory\'s function still finds none');

# A call that fails after its function connected closes them too.
$node->safe_psql('postgres', q{SELECT projcache.get('keys:boom')});
ok( $node->poll_query_until(
		'postgres',
		q{SELECT last_error IS NOT NULL FROM projcache.lookup('keys:boom')}),
	'the keys team\'s call for keys:boom failed after connecting');
$node->safe_psql('postgres', q{SELECT projcache.invalidate('loot:x')});
ok( $node->poll_query_until(
		'postgres',
		q{SELECT count(*) = 1 FROM projcache.entries
		  WHERE key = 'loot:x' AND freshness = 'fresh' AND fetch_state = 'complete'}),
	'mallory\'s key is fetched again after the failed call');
is( $node->safe_psql(
		'postgres', q{SET ROLE mallory; SELECT projcache.get('loot:x')::text}),
	'{"by_name": "refused", "unnamed": "refused"}',
	'after a failed call, mallory\'s function still finds none');

done_testing();
