# Copyright (c) 2026, projcache developers
#
# A bad key fails alone (issue 28, "one role's keys stop the key cache for
# everyone").
#
# 1. The fetch function is an ordinary one that joins on key::int.  A role
#    with only EXECUTE on get(text) reads 5 new non-numeric keys every
#    100 ms, each of which makes any call it is in fail.  Another role's new
#    keys, and invalidated keys, are served during the attack within twice
#    their time without it (medians over several keys), and so are new keys
#    right after it: the first of them within one backoff.  The times are
#    printed.
# 2. A case-insensitive fetch function that answers "tenant5" when asked
#    for "TENANT5" breaks the contract for that key only: the other keys of
#    the same call are served by it, and "TENANT5" fails alone; two keys
#    the answer may belong to ("Tenant6", "TENANT6") fail alone too, after
#    being asked for apart.
#
# Each phase measures its keys inside one session (a procedure that reads a
# key, or invalidates it and reads until the new value shows, and writes
# down how long that took); the test itself waits only for stated
# conditions.  The production batch interval (100 ms) is used, so that the
# times compare what a user would see.

use strict;
use warnings;

use FindBin;
use lib $FindBin::RealBin;

use IPC::Run;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use ProjcacheTest;
use Test::More;

my $node = projcache_node(
	'bad_keys',
	conf => "projcache.batch_interval = '100ms'\n"
	  . "projcache.max_retry_backoff = '5s'\n"
	  . "projcache.expiry = '1h'\n"
	  . "log_min_messages = warning\n");

$node->safe_psql(
	'postgres', q{
CREATE TABLE public.tenants (id int PRIMARY KEY, config jsonb NOT NULL);
INSERT INTO public.tenants
	SELECT i, jsonb_build_object('id', i) FROM generate_series(1, 5000) AS i;

-- An ordinary fetch function: keys are tenant ids.
CREATE FUNCTION public.fetch_int(p_keys text[], p_revisions text[])
RETURNS TABLE(key text, state text, revision text, config jsonb)
LANGUAGE sql STABLE AS $$
	SELECT k.key, 'enabled', NULL, t.config
	  FROM unnest(p_keys) AS k(key)
	  JOIN public.tenants AS t ON t.id = k.key::int
$$;

CREATE ROLE pc_attacker LOGIN;
GRANT USAGE ON SCHEMA projcache TO pc_attacker;
GRANT EXECUTE ON FUNCTION projcache.get(text) TO pc_attacker;

CREATE ROLE pc_app LOGIN;
GRANT USAGE ON SCHEMA projcache TO pc_app;
GRANT EXECUTE ON FUNCTION projcache.get(text, interval) TO pc_app;
GRANT EXECUTE ON FUNCTION projcache.get(text) TO pc_app;

-- How long each of the keys first .. first + n - 1 took, per phase.
CREATE TABLE public.timings (
	phase text, what text, key text, ms float8, served boolean);
GRANT INSERT ON public.timings TO pc_app;

-- A new key each: read and wait for it.
CREATE PROCEDURE public.time_new_keys(p_phase text, p_first int, p_n int)
LANGUAGE plpgsql AS $$
DECLARE
	t0 timestamptz;
	v jsonb;
BEGIN
	FOR i IN p_first .. p_first + p_n - 1 LOOP
		t0 := clock_timestamp();
		v := projcache.get(i::text, '5s');
		INSERT INTO public.timings VALUES (p_phase, 'new', i::text,
			extract(epoch FROM clock_timestamp() - t0) * 1000, v IS NOT NULL);
		COMMIT;
	END LOOP;
END $$;
GRANT EXECUTE ON PROCEDURE public.time_new_keys TO pc_app;

-- A cached key each: change its source, invalidate it, read until the new
-- value shows (up to 5 s).
CREATE PROCEDURE public.time_invalidations(p_phase text, p_first int,
										   p_n int)
LANGUAGE plpgsql AS $$
DECLARE
	t0 timestamptz;
	v jsonb;
BEGIN
	FOR i IN p_first .. p_first + p_n - 1 LOOP
		UPDATE public.tenants
		   SET config = jsonb_build_object('id', i, 'phase', p_phase)
		 WHERE id = i;
		PERFORM projcache.invalidate(i::text);
		COMMIT;
		t0 := clock_timestamp();
		LOOP
			v := projcache.get(i::text);
			EXIT WHEN v->>'phase' = p_phase
				   OR clock_timestamp() - t0 > interval '5s';
			PERFORM pg_sleep(0.002);
		END LOOP;
		INSERT INTO public.timings VALUES (p_phase, 'invalidated', i::text,
			extract(epoch FROM clock_timestamp() - t0) * 1000,
			coalesce(v->>'phase' = p_phase, false));
		COMMIT;
	END LOOP;
END $$;
});
set_fetch_function($node, 'public.fetch_int');

my $nkeys = 11;

sub median
{
	my @v = sort { $a <=> $b } @_;
	return $v[ int(@v / 2) ];
}

# Times of one phase's keys: (median ms, all served, list of ms).
sub phase_times
{
	my ($phase, $what) = @_;
	my $out = $node->safe_psql('postgres',
		"SELECT ms, served FROM public.timings "
		  . "WHERE phase = '$phase' AND what = '$what' ORDER BY key::int");
	my @ms;
	my $served = 1;
	foreach my $line (split /\n/, $out)
	{
		my ($ms, $ok) = split /\|/, $line;
		push @ms, $ms;
		$served = 0 unless $ok eq 't';
	}
	return (median(@ms), $served, @ms);
}

sub measure
{
	my ($phase, $first) = @_;
	$node->safe_psql('postgres',
		"SET ROLE pc_app; CALL public.time_new_keys('$phase', $first, $nkeys)"
	);
	$node->safe_psql('postgres',
		"CALL public.time_invalidations('$phase', $first + 100, $nkeys)");
	return;
}

# Keys to invalidate later are cached first, in every phase's range.
$node->safe_psql('postgres',
	"SELECT count(projcache.get(i::text, '5s')) FROM "
	  . "(SELECT generate_series(b + 100, b + 100 + $nkeys - 1) AS i "
	  . "FROM unnest(ARRAY[1000, 2000, 3000]) AS b) AS s");
is( $node->safe_psql(
		'postgres', q{SELECT count(*) FROM projcache.entries
		 WHERE state = 'enabled'}),
	3 * $nkeys,
	'the keys to invalidate are cached');

# ---------------------------------------------------------------------------
# 1. Without the attack, during it, and after it.
# ---------------------------------------------------------------------------
measure('before', 1000);

my ($stdout, $stderr) = ('', '');
my $attack = IPC::Run::start(
	[
		$node->installed_command('psql'), '-XAtq',
		'-d', $node->connstr('postgres')
		  . " user=pc_attacker application_name=attacker",
		'-c', q{
DO $$
BEGIN
	-- 5 new keys every 100 ms, for a minute at most (the test ends it)
	FOR i IN 1 .. 600 LOOP
		PERFORM projcache.get('atk' || i || '-' || j)
		   FROM generate_series(1, 5) AS j;
		PERFORM pg_sleep(0.1);
	END LOOP;
END $$}
	],
	'<', \undef,
	'>', \$stdout,
	'2>', \$stderr);

# The attack is on once its keys fail.
ok( $node->poll_query_until(
		'postgres', q{
SELECT count(*) >= 20 FROM projcache.entries
 WHERE key LIKE 'atk%' AND last_error LIKE '%invalid input syntax%'}),
	'the attacker\'s keys make the fetch function fail');

measure('during', 2000);

is( $node->safe_psql(
		'postgres',
		"SELECT count(*) FROM pg_stat_activity WHERE application_name = 'attacker' AND state = 'active'"
	),
	'1',
	'the attack went on while the other keys were read');
# End it.
$node->safe_psql('postgres',
	"SELECT pg_cancel_backend(pid) FROM pg_stat_activity WHERE application_name = 'attacker'"
);
$attack->finish;
like($stderr, qr/canceling statement/, 'the attack was cancelled');
my ($attacker_keys, $attacker_failed) = split /\|/,
  $node->safe_psql('postgres',
	"SELECT count(*), count(last_error) FROM projcache.entries WHERE key LIKE 'atk%'"
  );

measure('after', 3000);

my ($base, $base_ok, @base) = phase_times('before', 'new');
my ($during, $during_ok, @during) = phase_times('during', 'new');
my ($after, $after_ok, @after) = phase_times('after', 'new');
my ($ibase, $ibase_ok, @ibase) = phase_times('before', 'invalidated');
my ($iduring, $iduring_ok, @iduring) = phase_times('during', 'invalidated');
my ($iafter, $iafter_ok, @iafter) = phase_times('after', 'invalidated');

diag(
	sprintf(
		"new keys of another role, median ms: %.0f without the attack, %.0f during it, %.0f after it",
		$base, $during, $after));
diag(
	sprintf(
		"invalidated keys, median ms: %.0f without the attack, %.0f during it, %.0f after it",
		$ibase, $iduring, $iafter));
note('new keys, each ms: before ' . join(' ', map { int } @base));
note('new keys, each ms: during ' . join(' ', map { int } @during));
note('new keys, each ms: after ' . join(' ', map { int } @after));
note('invalidated, each ms: before ' . join(' ', map { int } @ibase));
note('invalidated, each ms: during ' . join(' ', map { int } @iduring));
note('invalidated, each ms: after ' . join(' ', map { int } @iafter));
diag(
	"the attacker read $attacker_keys new keys, $attacker_failed of which were fetched and failed"
);

ok($base_ok && $ibase_ok, 'without the attack, every key was served');
ok($during_ok, 'during the attack, every new key of another role was served');
ok($during <= 2 * $base,
	'during the attack, new keys are served within twice their time without it'
);
ok($iduring_ok, 'during the attack, every invalidated key was refreshed');
ok($iduring <= 2 * $ibase,
	'during the attack, invalidated keys are refreshed within twice their time without it'
);
ok($after_ok, 'after the attack, every new key was served');
cmp_ok($after[0], '<=', 5000,
	'after the attack, the first new key is served within one backoff (projcache.max_retry_backoff)'
);
ok($after <= 2 * $base,
	'after the attack, new keys are served within twice their time without it');
ok($iafter_ok && $iafter <= 2 * $ibase,
	'after the attack, invalidated keys are refreshed within twice their time without it'
);

# The attacker's keys failed alone, each with its own error.
is( $node->safe_psql(
		'postgres', q{
SELECT count(*) FROM projcache.entries
 WHERE key LIKE 'atk%' AND state <> 'pending'}),
	'0',
	'no attacker key got a value');
is( $node->safe_psql(
		'postgres', q{
SELECT count(*) FROM projcache.entries
 WHERE key LIKE 'atk%' AND last_error IS NOT NULL
   AND position('"' || key || '"' IN last_error) = 0}),
	'0',
	'each failed attacker key names itself in its last_error');

# ---------------------------------------------------------------------------
# 2. A case-insensitive fetch function answering in another spelling.
# ---------------------------------------------------------------------------
$node->safe_psql(
	'postgres', q{
CREATE TABLE public.tenant_names (name text PRIMARY KEY, config jsonb);
INSERT INTO public.tenant_names
	SELECT 'tenant' || i, jsonb_build_object('name', 'tenant' || i)
	  FROM generate_series(1, 9) AS i;
CREATE TABLE public.ci_calls (id serial PRIMARY KEY, keys text[]);
CREATE FUNCTION public.fetch_ci(p_keys text[], p_revisions text[])
RETURNS TABLE(key text, state text, revision text, config jsonb)
LANGUAGE plpgsql AS $$
BEGIN
	INSERT INTO public.ci_calls(keys) VALUES (p_keys);
	RETURN QUERY
		SELECT n.name, 'enabled'::text, NULL::text, n.config
		  FROM unnest(p_keys) AS k(key)
		  JOIN public.tenant_names AS n ON n.name = lower(k.key);
END $$;
ALTER SYSTEM SET projcache.batch_interval = '1s';
});
set_fetch_function($node, 'public.fetch_ci');

# One statement: every key is asked for within one batch interval.
$node->safe_psql('postgres',
	"SET ROLE pc_app; SELECT count(projcache.get(k)) FROM "
	  . "unnest(ARRAY['tenant1', 'TENANT5', 'tenant2', 'Tenant6', 'tenant3', 'TENANT6']) AS k"
);
ok( $node->poll_query_until(
		'postgres', q{
SELECT count(*) = 3 FROM projcache.entries
 WHERE key IN ('tenant1', 'tenant2', 'tenant3') AND state = 'enabled'}),
	'case-insensitive function: the keys asked for as answered are served');
is( $node->safe_psql(
		'postgres', q{
SELECT count(*) FROM public.ci_calls
 WHERE keys @> ARRAY['tenant1', 'TENANT5', 'tenant2', 'Tenant6', 'tenant3', 'TENANT6']}),
	'1',
	'case-insensitive function: all six keys were asked for in one call');
is( $node->safe_psql(
		'postgres', q{
SELECT count(*) FROM public.ci_calls WHERE 'tenant1' = ANY (keys)}),
	'1',
	'case-insensitive function: tenant1 was served by that call');
ok( $node->poll_query_until(
		'postgres', q{
SELECT count(*) = 3 FROM projcache.entries
 WHERE key IN ('TENANT5', 'Tenant6', 'TENANT6') AND last_error IS NOT NULL}),
	'case-insensitive function: the keys answered in another spelling fail');
is( $node->safe_psql(
		'postgres', q{
SELECT state, last_error FROM projcache.entries WHERE key = 'TENANT5'}),
	'pending|fetch function returned key "tenant5", which was not asked for ("TENANT5" was, which differs only in case)',
	'case-insensitive function: TENANT5 fails alone, with its own error');
is( $node->safe_psql(
		'postgres', q{
SELECT string_agg(key || ': ' || state || ': ' || last_error, E'\n' ORDER BY key)
  FROM projcache.entries WHERE key IN ('Tenant6', 'TENANT6')}),
	qq{TENANT6: pending: fetch function returned key "tenant6", which was not asked for ("TENANT6" was, which differs only in case)\n}
	  . qq{Tenant6: pending: fetch function returned key "tenant6", which was not asked for ("Tenant6" was, which differs only in case)},
	'case-insensitive function: two keys an answer may belong to fail alone'
);
is( $node->safe_psql(
		'postgres', q{
SELECT count(*) FILTER (WHERE keys @> ARRAY['Tenant6', 'TENANT6']),
	   bool_and(cardinality(keys) = 1 OR keys @> ARRAY['Tenant6', 'TENANT6']),
	   max(id) FILTER (WHERE cardinality(keys) > 1)
		 < min(id) FILTER (WHERE cardinality(keys) = 1)
  FROM public.ci_calls
 WHERE keys && ARRAY['Tenant6', 'TENANT6']}),
	'2|t|t',
	'case-insensitive function: they were asked for together twice (the batch, then the two), then apart only'
);

log_shows_no_crash($node);
$node->stop;
done_testing();
