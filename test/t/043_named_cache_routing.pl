# Copyright (c) 2026, projcache developers
#
# Named caches' keys across databases, standbys, restarts and crashes
# (issue 32).
#
# a. Another database: a role granted a cache reads its keys there (its
#    function runs in projcache.database, as the cache's owner); a role
#    not granted gets 42501 there too; the default cache is unchanged; a
#    revoke, then a grant again, reach its sessions.
#
# c. A hot standby: the same reads, revoke and grant, replayed; and an
#    invalidate() of a named cache's key on the primary (a WAL record)
#    makes the standby fetch it again, with the cache's function.
#
# b. Warm restart: the key dump brings a named cache's keys back only into
#    that very cache.  Table-driven: each round caches one key per case,
#    restarts cleanly (the dump at shutdown holds them all), acts on each
#    case, takes every source down, crashes (pg_ctl -m immediate) and
#    starts again.  Then, before the sources are back:
#    - kept: a cache left alone: its key comes back from the dump, stale,
#      with its value (the dump was loaded at all), for the granted role
#      only;
#    - dropped: drop_cache(): its key is the default cache's now, and
#      must not read the dropped cache's value: NULL;
#    - remade: dropped and made again under its name with another
#      function: the old function's value is not served: NULL;
#    - taken: a default cache's key, whose prefix a cache made since has
#      taken: the default function's value is not served: NULL;
#    - lapsed: its key left the map for expiry (which writes no tombstone,
#      unlike evict() and clearing a cache's prefix) before the cache was
#      dropped: the dump still holds it, and must not bring it back as
#      the default cache's: NULL.
#    Once the sources are back, each reads what its cache's function says.
#    Rounds: projcache.dump_interval = 0 (a dump at shutdown only), 1h (a
#    periodic dump due far away), and 1s with the crash after a dump
#    written since the cases acted (the worker cleared their prefixes
#    before: the dump holds none of them).

use strict;
use warnings;

use FindBin;
use lib $FindBin::RealBin;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use ProjcacheTest;
use Test::More;

my $node = projcache_node(
	'routing',
	init => { allows_streaming => 1 },
	conf => "projcache.wal_invalidations = on\n");

# Each function says which it is; all fail while public.sources_up is
# false.
$node->safe_psql(
	'postgres', q{
ALTER EXTENSION projcache UPDATE;
CREATE TABLE public.sources_up (up boolean NOT NULL);
INSERT INTO public.sources_up VALUES (true);
CREATE TABLE public.version (v int NOT NULL);
INSERT INTO public.version VALUES (1);
CREATE FUNCTION public.source(fn text, keys text[])
RETURNS TABLE(key text, state text, revision text, config jsonb)
LANGUAGE plpgsql AS $$
BEGIN
	IF NOT (SELECT up FROM public.sources_up) THEN
		RAISE EXCEPTION 'source % is down', fn;
	END IF;
	RETURN QUERY SELECT k, 'enabled'::text, 'r' || v.v,
		jsonb_build_object('from', fn, 'k', k, 'v', v.v)
		FROM unnest(keys) k, public.version v;
END $$;
CREATE FUNCTION public.default_fetch(keys text[], revisions text[])
RETURNS TABLE(key text, state text, revision text, config jsonb)
LANGUAGE sql AS $$ SELECT * FROM public.source('default', keys) $$;
CREATE FUNCTION public.fa(keys text[], revisions text[])
RETURNS TABLE(key text, state text, revision text, config jsonb)
LANGUAGE sql AS $$ SELECT * FROM public.source('fa', keys) $$;
CREATE FUNCTION public.fb(keys text[], revisions text[])
RETURNS TABLE(key text, state text, revision text, config jsonb)
LANGUAGE sql AS $$ SELECT * FROM public.source('fb', keys) $$;
CREATE ROLE app LOGIN;
CREATE ROLE outsider LOGIN;
GRANT USAGE ON SCHEMA projcache TO app, outsider;
GRANT EXECUTE ON FUNCTION projcache.get(text), projcache.get(text, interval)
	TO app, outsider;
GRANT EXECUTE ON FUNCTION projcache.caches_1_3(), projcache.caches_1_3_1() TO app;
GRANT SELECT ON projcache.caches TO app;
CREATE DATABASE other_db;
});
set_fetch_function($node, 'public.default_fetch');
$node->safe_psql(
	'other_db', q{
CREATE EXTENSION projcache;
GRANT USAGE ON SCHEMA projcache TO app, outsider;
GRANT EXECUTE ON FUNCTION projcache.get(text), projcache.get(text, interval)
	TO app, outsider;
});

# Wait until the caches published are exactly these, each granted to app
# (projcache.caches shows a role the caches it may read), 30 s at most.
# From 1.3.1 the view lists a cache from its commit on, and its state is
# "open" once the worker routes its keys to it; a dropped cache is listed,
# "closing", until the worker has cleared its keys.
sub caches_become
{
	my ($want) = @_;

	for (1 .. 600)
	{
		return 1
		  if $node->safe_psql(
			'postgres', q{SET ROLE app;
SELECT coalesce(string_agg(name || CASE state WHEN 'open' THEN '' ELSE ' (' || state || ')' END,
	',' ORDER BY name), '') FROM projcache.caches})
		  eq $want;
		select(undef, undef, undef, 0.05);
	}
	return 0;
}

# One read as a role: the source the value came from, '' for NULL, or the
# SQLSTATE of its error.
sub read_as
{
	my ($role, $key, %opts) = @_;
	my $db = $opts{db} // 'postgres';
	my $on = $opts{node} // $node;
	my $wait = defined $opts{wait} ? ", '$opts{wait}'" : '';
	my ($rc, $out, $err) = $on->psql(
		$db, qq{
\\set VERBOSITY sqlstate
SET ROLE $role;
SELECT projcache.get('$key'$wait)->>'from'});

	return $rc == 0 ? $out : ($err =~ /ERROR:\s+(\S+)/ ? $1 : $err);
}

# ---------------------------------------------------------------------------
# a. Another database.
# ---------------------------------------------------------------------------
$node->safe_psql(
	'postgres', q{
SELECT projcache.create_cache('kept', 'public.fa(text[],text[])',
	expiry => '1h', grace_period => '1h'),
	projcache.grant_cache('kept', 'app');
});
ok(caches_become('kept'), 'the cache is published');
is(read_as('app', 'kept:x', db => 'other_db', wait => '10s'),
	'fa', 'other_db: the granted role reads the cache\'s key');
is(read_as('outsider', 'kept:x', db => 'other_db'),
	'42501', 'other_db: a role not granted the cache gets 42501');
is(read_as('outsider', 'plain:x', db => 'other_db', wait => '10s'),
	'default', 'other_db: a key of no cache is the default cache\'s');
is(read_as('outsider', 'Kept:x', db => 'other_db', wait => '10s'),
	'default', 'other_db: another spelling of the name is no cache\'s');

# Read as role until the read says want (30 s at most); what it last said.
sub read_becomes
{
	my ($role, $key, $want, %opts) = @_;
	my $got;

	for (1 .. 600)
	{
		$got = read_as($role, $key, %opts);
		last if $got eq $want;
		select(undef, undef, undef, 0.05);
	}
	return $got;
}

# A revoke reaches the other database's sessions within a second or so;
# a grant again, the same.
$node->safe_psql('postgres', "SELECT projcache.revoke_cache('kept', 'app')");
is(read_becomes('app', 'kept:x', '42501', db => 'other_db'),
	'42501', 'other_db: after a revoke, the role is refused');
$node->safe_psql('postgres', "SELECT projcache.grant_cache('kept', 'app')");
is(read_becomes('app', 'kept:x', 'fa', db => 'other_db'),
	'fa', 'other_db: granted again, it reads');

# ---------------------------------------------------------------------------
# c. A hot standby: its own worker publishes the replicated registry and
#    fetches the caches' keys there, with their functions; grants and
#    revokes replayed hold there too.
# ---------------------------------------------------------------------------
$node->backup('backup');
my $standby = PostgreSQL::Test::Cluster->new('standby');
$standby->init_from_backup($node, 'backup', has_streaming => 1);
$standby->start;
$node->wait_for_catchup($standby, 'replay');
is(read_becomes('app', 'kept:s', 'fa', node => $standby, wait => '10s'),
	'fa', 'standby: the granted role reads a key of the cache, from its function');
is(read_as('outsider', 'kept:s', node => $standby),
	'42501', 'standby: a role not granted is refused');
$node->safe_psql('postgres', "SELECT projcache.revoke_cache('kept', 'app')");
$node->wait_for_catchup($standby, 'replay');
is(read_becomes('app', 'kept:s', '42501', node => $standby),
	'42501', 'standby: a revoke replayed holds there');
$node->safe_psql('postgres', "SELECT projcache.grant_cache('kept', 'app')");
$node->wait_for_catchup($standby, 'replay');
is(read_becomes('app', 'kept:s', 'fa', node => $standby),
	'fa', 'standby: a grant replayed holds there');
# invalidate() of a named cache's key on the primary reaches the standby
# (a WAL record): its worker fetches the key again there, with the cache's
# function, though the key's expiry is an hour away.
$node->safe_psql('postgres',
	"UPDATE public.version SET v = 2; SELECT projcache.invalidate('kept:s')");
ok( $standby->poll_query_until(
		'postgres', q{SELECT projcache.get('kept:s') ->> 'v' = '2'}),
	'standby: an invalidation on the primary refetches the cache\'s key there');
$node->safe_psql('postgres', 'UPDATE public.version SET v = 1');
$standby->stop;

# ---------------------------------------------------------------------------
# b. Warm restart.
# ---------------------------------------------------------------------------

# Wait for the worker and for the dump's load after a (re)start.
sub started
{
	my ($what) = @_;

	wait_for_worker($node);
	ok( $node->poll_query_until(
			'postgres', 'SELECT loaded_keys > 0 FROM projcache.stats'),
		"$what: the dump is loaded");
	return;
}

sub set_sources
{
	my ($up) = @_;

	$node->safe_psql('postgres', "UPDATE public.sources_up SET up = $up");
	return;
}

my @rounds = (
	{ name => 'dump_interval 0', interval => '0', dump_after => 0 },
	{ name => 'dump_interval 1h', interval => '1h', dump_after => 0 },
	{
		name => 'dump_interval 1s, crash after a dump',
		interval => '1s',
		dump_after => 1
	});

for my $round (@rounds)
{
	my $r = $round->{name};

	$node->safe_psql(
		'postgres', qq{
ALTER SYSTEM SET projcache.dump_interval = '$round->{interval}';
SELECT projcache.drop_cache(name) FROM projcache.caches
	WHERE name IN ('dropped', 'remade', 'taken', 'lapsed');
SELECT projcache.create_cache(c, 'public.fa(text[],text[])'),
	projcache.grant_cache(c, 'app')
	FROM unnest(ARRAY['dropped', 'remade']) c;
SELECT projcache.create_cache('lapsed', 'public.fa(text[],text[])',
	expiry => '1min', grace_period => '1min'),
	projcache.grant_cache('lapsed', 'app');
});
	ok(caches_become('dropped,kept,lapsed,remade'),
		"$r: the caches are published");
	set_sources('true');

	# Cache one key per case; 'taken:a' is the default cache's yet.
	for my $key ('kept:a', 'dropped:a', 'remade:a', 'lapsed:a')
	{
		is(read_as('app', $key, wait => '10s'), 'fa', "$r: $key is cached");
	}
	is(read_as('outsider', 'taken:a', wait => '10s'),
		'default', "$r: taken:a is cached, the default cache's");

	$node->restart;
	started("$r, clean restart");
	is(read_as('app', 'kept:a'), 'fa', "$r: kept:a came back from the dump");
	is(read_as('app', 'lapsed:a'), 'fa',
		"$r: lapsed:a came back from the dump");

	# The read above refetches it (keys come back stale): that fetch must
	# be over before the clock moves, or it would be fetched anew after.
	ok( $node->poll_query_until(
			'postgres', q{
SELECT fetch_state = 'complete' AND freshness = 'fresh'
  FROM projcache.entries WHERE key = 'lapsed:a'}),
		"$r: lapsed:a was fetched again after the restart");

	# lapsed:a expires and leaves the map; kept's expiry is an hour.
	advance_clock($node, '5min');
	ok( $node->poll_query_until(
			'postgres',
			"SELECT NOT EXISTS (SELECT FROM projcache.entries WHERE key = 'lapsed:a')"
		),
		"$r: lapsed:a was evicted for expiry");

	# Act on each case.
	$node->safe_psql(
		'postgres', q{
BEGIN;
SELECT projcache.drop_cache('dropped');
SELECT projcache.drop_cache('remade');
SELECT projcache.create_cache('remade', 'public.fb(text[],text[])');
SELECT projcache.grant_cache('remade', 'app');
SELECT projcache.create_cache('taken', 'public.fa(text[],text[])');
SELECT projcache.grant_cache('taken', 'app');
SELECT projcache.drop_cache('lapsed');
COMMIT;
});
	ok(caches_become('kept,remade,taken'), "$r: the changes are published");
	if ($round->{dump_after})
	{
		my $t = $node->safe_psql('postgres', 'SELECT now()');

		ok( $node->poll_query_until(
				'postgres',
				"SELECT last_dump_at > '$t' FROM projcache.stats"),
			"$r: a dump was written after the changes");
	}
	set_sources('false');
	$node->stop('immediate');
	$node->start;
	started("$r, crash");

	is(read_as('app', 'kept:a'), 'fa',
		"$r: kept:a comes back from the dump, stale, with the source down");
	is(read_as('outsider', 'kept:a'), '42501',
		"$r: kept:a is refused to a role not granted the cache");
	is(read_as('outsider', 'dropped:a'), '',
		"$r: dropped:a does not come back as the default cache's with the dropped cache's value");
	is(read_as('app', 'remade:a'), '',
		"$r: remade:a does not come back with the value of the function of the cache dropped");
	is(read_as('app', 'taken:a'), '',
		"$r: taken:a does not come back with the default function's value");
	is(read_as('outsider', 'lapsed:a'), '',
		"$r: lapsed:a, out of the map when its cache was dropped, does not come back from the dump as the default cache's");

	set_sources('true');
	is(read_as('outsider', 'dropped:a', wait => '10s'),
		'default', "$r, sources back: dropped:a reads the default function");
	is(read_as('app', 'remade:a', wait => '10s'),
		'fb', "$r, sources back: remade:a reads the new cache's function");
	is(read_as('app', 'taken:a', wait => '10s'),
		'fa', "$r, sources back: taken:a reads its cache's function");
	is(read_as('app', 'kept:a', wait => '10s'),
		'fa', "$r, sources back: kept:a reads its cache's function");
	is(read_as('outsider', 'lapsed:a', wait => '10s'),
		'default', "$r, sources back: lapsed:a reads the default function");
}

# The key map checks out: its invariants hold (debug_check_map() raises
# data_corrupted at the first one broken), and it holds the keys
# projcache.entries lists.
my ($checked, $listed) = key_map_check($node);
is($checked, $listed, 'the key map checks out');

log_shows_no_crash($node);

done_testing();
