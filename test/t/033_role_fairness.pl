# Copyright (c) 2026, projcache developers
#
# One role's new keys take neither the fetch order nor the key memory from
# the others (issue 28, "One role takes the fetch order and the key memory
# from the others").
#
# A role that may only call get() reads new keys twice each, 1,000 at a
# time, as the issue did (SELECT projcache.get(k), projcache.get(k) FROM
# (SELECT 'atk' || g AS k FROM generate_series(...) AS g) AS s): the first
# 10,000, then on with new ones.  The source takes 0.2 s a call, so the
# attacker's keys pile up waiting for their fetch.  Meanwhile another role
# reads new keys of its own with get(key, '20s'), one at a time.  For each
# setting below:
#
# - each of the other role's reads returns its value (never NULL); its key
#   is fetched in one of the first three calls of the fetch function after
#   the read began (the one under way, the next, and one more for a call
#   that began as the read did), and its time is within twice its time
#   without the flood plus two calls: both times are printed;
# - the attacker's entries never exceed projcache.max_keys_per_role (the
#   setting, or its default: half of the keys that fit in the keys' part of
#   projcache.max_memory at about 136 bytes each), sampled throughout;
#   where the setting is low enough to be reached, it is reached (a read
#   refused), and the other role's keys are still created and fetched.
#
# Then, where the bound is set: the count has not drifted through the
# flood, its evictions and a worker restart.  Once every key of the
# attacker is evicted, it creates exactly as many new keys as the bound,
# and the next one is refused, also when read through a superuser's
# SECURITY DEFINER function (keys count for the caller), while another
# role creates keys; the worker then evicts the attacker's oldest keys, and
# its next new key is created.
#
# On 1.2 (no turns, no bound) the other role's keys wait behind the
# attacker's whole backlog, tens of calls, and the attacker's entries pass
# any bound.

use strict;
use warnings;

use FindBin;
use lib $FindBin::RealBin;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use ProjcacheTest;
use Test::More;

# bound: projcache.max_keys_per_role, or undef for the default.
# reached: whether the attacker reaches it within the test.
my @settings = (
	{
		name => 'small_bound',
		memory => '6MB',
		batch_size => 100,
		bound => 2000,
		reached => 1
	},
	{
		name => 'small_default',
		memory => '6MB',
		batch_size => 100,
		bound => undef,
		reached => 1
	},
	{
		name => 'large_default',
		memory => '64MB',
		batch_size => 500,
		bound => undef,
		reached => 0
	},);

# The default bound: half of the keys that fit in what max_memory leaves
# for keys (less a quarter for snapshots and the message reserve), at the
# 136 bytes an entry takes.
sub default_bound
{
	my ($memory_bytes) = @_;
	my $reserve = $memory_bytes / 16 < 65536 ? $memory_bytes / 16 : 65536;
	my $keys_part = $memory_bytes - int($memory_bytes / 4) - $reserve;
	my $fit = int($keys_part / 136);
	return int($fit / 2);
}

sub median
{
	my @v = sort { $a <=> $b } @_;
	return $v[ int($#v / 2) ];
}

# The other role reads a new key, waiting up to 20 s; returns (got a
# value, ms taken, the last call of the fetch function committed before).
sub timed_read
{
	my ($node, $key) = @_;
	my ($got, $ms, $before) = split /\|/,
	  $node->safe_psql('postgres',
		"SET ROLE legit; SELECT public.timed_get('$key')");
	return ($got, $ms, $before);
}

# Which call fetched the key, counted from the last call committed before
# its read; -1 if the read got no value (it was not fetched meanwhile).
sub call_position
{
	my ($node, $key, $got, $before) = @_;
	return -1 unless $got;
	$node->poll_query_until('postgres',
		"SELECT EXISTS (SELECT FROM public.calls WHERE '$key' = ANY (keys))")
	  or return -1;
	return $node->safe_psql('postgres',
		"SELECT min(id) - $before FROM public.calls WHERE '$key' = ANY (keys)"
	);
}

sub attacker_entries
{
	my ($node, $prefix) = @_;
	return $node->safe_psql('postgres',
		"SELECT count(*) FROM projcache.entries WHERE key LIKE '$prefix%'");
}

foreach my $s (@settings)
{
	my $name = $s->{name};
	my $conf =
	    "projcache.max_memory = '$s->{memory}'\n"
	  . "projcache.batch_size = $s->{batch_size}\n"
	  . "projcache.expiry = '10min'\n";
	$conf .= "projcache.max_keys_per_role = $s->{bound}\n"
	  if defined $s->{bound};
	my $node = projcache_node($name, conf => $conf);
	create_local_upstream($node);
	my $memory_bytes = stat_value($node, 'memory_limit');
	my $bound = $s->{bound} // default_bound($memory_bytes);

	$node->safe_psql(
		'postgres', q{
INSERT INTO public.upstream (key, revision, config)
SELECT 'legit_' || i, 'r1', jsonb_build_object('i', i)
  FROM generate_series(1, 100) AS i;
INSERT INTO public.upstream (key, revision, config)
SELECT 'legit_base_' || i, 'r1', jsonb_build_object('i', i)
  FROM generate_series(1, 100) AS i;
CREATE FUNCTION public.slow_fetch(p_keys text[], p_revisions text[])
RETURNS TABLE(key text, state text, revision text, config jsonb)
LANGUAGE plpgsql AS $$
BEGIN
	PERFORM pg_sleep(0.2);
	RETURN QUERY SELECT * FROM public.fetch(p_keys, p_revisions);
END
$$;
CREATE TABLE public.stop_flood ();
CREATE ROLE atk LOGIN;
CREATE ROLE legit LOGIN;
GRANT USAGE ON SCHEMA projcache TO atk, legit;
GRANT EXECUTE ON FUNCTION projcache.get(text) TO atk;
GRANT EXECUTE ON FUNCTION projcache.get(text), projcache.get(text, interval)
	TO legit;
GRANT SELECT ON public.stop_flood TO atk;
GRANT SELECT ON public.calls TO legit;
-- the time of one read as the caller, and the last call committed before
CREATE FUNCTION public.timed_get(k text) RETURNS text
LANGUAGE plpgsql AS $$
DECLARE
	before bigint;
	t0 timestamptz;
	v jsonb;
BEGIN
	SELECT coalesce(max(id), 0) INTO before FROM public.calls;
	t0 := clock_timestamp();
	v := projcache.get(k, '20s');
	RETURN (v IS NOT NULL)::int || '|'
		|| round(extract(epoch FROM clock_timestamp() - t0) * 1000) || '|'
		|| before;
END
$$;
GRANT EXECUTE ON FUNCTION public.timed_get(text) TO legit;
-- a superuser's function that reads keys for its callers
CREATE FUNCTION public.definer_get(k text) RETURNS jsonb
LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog AS
$$ SELECT projcache.get(k) $$;
GRANT EXECUTE ON FUNCTION public.definer_get(text) TO atk;
});
	set_fetch_function($node, 'public.slow_fetch');

	# Without the flood.
	my @base;
	foreach my $i (1 .. 3)
	{
		my ($got, $ms) = timed_read($node, "legit_base_$i");
		is($got, 1, "$name: without the flood, the other role's key is read");
		push @base, $ms;
	}
	my $base_ms = (sort { $a <=> $b } @base)[-1];

	# The flood: 10,000 new keys, read twice each, 1,000 at a time, and on
	# with new ones until told to stop.
	my $flood = start_session(
		$node, 'atk', q{
SET ROLE atk;
DO $$
BEGIN
	FOR r IN 0..1000 LOOP
		FOR c IN 0..9 LOOP
			PERFORM projcache.get(k), projcache.get(k)
			   FROM (SELECT 'atk' || (r * 10000 + c * 1000 + g) AS k
			           FROM generate_series(1, 1000) AS g) AS s;
			IF EXISTS (SELECT FROM public.stop_flood) THEN
				RETURN;
			END IF;
			PERFORM pg_sleep(0.05);
		END LOOP;
	END LOOP;
END $$;
},
		timeout => 6 * $PostgreSQL::Test::Utils::timeout_default);
	my $flood_from_call =
	  $node->safe_psql('postgres', 'SELECT coalesce(max(id), 0) FROM public.calls');

	# A backlog: more than three calls' worth of the attacker's keys wait.
	my $backlog = 3 * $s->{batch_size};
	ok( $node->poll_query_until(
			'postgres', qq{
SELECT count(*) > $backlog FROM projcache.entries
 WHERE key LIKE 'atk%' AND state = 'pending'}),
		"$name: the attacker's keys pile up");
	if ($s->{reached})
	{
		ok( $node->poll_query_until(
				'postgres', qq{
SELECT refused_reads > 0
    OR (SELECT count(*) FROM projcache.entries WHERE key LIKE 'atk%') > $bound
  FROM projcache.stats}),
			"$name: the attacker reaches its bound of $bound keys");
	}

	my @flood_ms;
	my @positions;
	my $most = attacker_entries($node, 'atk');
	my $nulls = 0;
	foreach my $i (1 .. 5)
	{
		my ($got, $ms, $before) = timed_read($node, "legit_$i");
		$nulls++ unless $got;
		push @flood_ms, $ms;
		push @positions, call_position($node, "legit_$i", $got, $before);
		my $held = attacker_entries($node, 'atk');
		$most = $held if $held > $most;
	}
	my $pending = $node->safe_psql('postgres',
		"SELECT count(*) FROM projcache.entries WHERE key LIKE 'atk%' AND state = 'pending'"
	);
	my $call_ms = $node->safe_psql(
		'postgres', qq{
SELECT round(percentile_cont(0.5) WITHIN GROUP (ORDER BY gap))
  FROM (SELECT extract(epoch FROM called_at - lag(called_at) OVER (ORDER BY id)) * 1000 AS gap
          FROM public.calls WHERE id > $flood_from_call) AS g
 WHERE gap IS NOT NULL});
	$node->safe_psql('postgres', 'INSERT INTO public.stop_flood DEFAULT VALUES');
	my ($rc, $out, $err) = wait_session($flood);
	is($rc, 0, "$name: the attacker got no ERROR") or diag($err);

	my $report =
	    "$name: the other role's reads without the flood: "
	  . join(' ', map { "${_} ms" } @base)
	  . "; during it: "
	  . join(' ', map { "${_} ms" } @flood_ms)
	  . "; fetched in calls "
	  . join(' ', @positions)
	  . " after the read began; a call took $call_ms ms during the flood; "
	  . "attacker's entries at most $most (bound $bound), $pending pending at the end";
	note($report);
	diag($report);

	is($nulls, 0, "$name: during the flood, none of the other role's reads returned NULL");
	foreach my $i (0 .. $#positions)
	{
		cmp_ok($positions[$i], '>=', 1,
			"$name: key legit_" . ($i + 1) . " was fetched");
		cmp_ok($positions[$i], '<=', 3,
			"$name: key legit_" . ($i + 1) . " was fetched within three calls of its read");
	}
	my $allowed = 2 * $base_ms + 2 * $call_ms;
	cmp_ok(median(@flood_ms), '<=', $allowed,
		"$name: during the flood the other role's reads take at most twice their time without it, plus two calls ($allowed ms)"
	);
	cmp_ok($most, '<=', $bound,
		"$name: the attacker's entries never exceeded its bound");
	if ($s->{reached})
	{
		cmp_ok(stat_value($node, 'refused_reads'), '>', 0,
			"$name: the attacker's new keys past its bound were refused");
	}

	# The count has not drifted: with all its keys gone, through a worker
	# restart, the attacker creates exactly its bound and no more.  The
	# worker is held in a fetch meanwhile, so that it cannot make room.
	if (defined $s->{bound})
	{
		my $pid = worker_pid($node);
		$node->safe_psql('postgres', "SELECT pg_terminate_backend($pid)");
		wait_for_worker($node, $pid);
		$node->safe_psql('postgres',
			"SELECT count(projcache.evict(key)) FROM projcache.entries WHERE key LIKE 'atk%'"
		);
		is(attacker_entries($node, 'atk'), 0,
			"$name: every key of the attacker is evicted");
		my $gate = $node->background_psql('postgres');
		$gate->query_safe('BEGIN');
		$gate->query_safe('LOCK public.gate IN ACCESS EXCLUSIVE MODE');
		$node->safe_psql(
			'postgres', qq{
SET ROLE atk;
SELECT count(*) FROM (SELECT projcache.get(k), projcache.get(k)
                        FROM (SELECT 'again' || g AS k
                                FROM generate_series(1, $bound) AS g) AS s) AS r});
		ok( $node->poll_query_until(
				'postgres',
				"SELECT count(*) = 1 FROM pg_locks WHERE relation = 'public.gate'::regclass AND NOT granted"
			),
			"$name: the worker waits inside a fetch");
		is(attacker_entries($node, 'again'), $bound,
			"$name: then it creates exactly as many keys as its bound");
		my $refused = stat_value($node, 'refused_reads');
		is( $node->safe_psql(
				'postgres', q{
SET ROLE atk;
SELECT projcache.get('again_one_more') IS NULL,
       public.definer_get('again_through_definer') IS NULL}),
			't|t', "$name: its next one reads as NULL, also through a superuser's SECURITY DEFINER function");
		is( $node->safe_psql(
				'postgres',
				"SELECT count(*) FROM projcache.entries WHERE key IN ('again_one_more', 'again_through_definer')"
			),
			0, "$name: neither was created");
		cmp_ok(stat_value($node, 'refused_reads'), '>=', $refused + 2,
			"$name: both were refused reads");
		is( $node->safe_psql(
				'postgres', q{
SET ROLE legit;
SELECT count(projcache.get('legit_50'));
RESET ROLE;
SELECT count(*) FROM projcache.entries WHERE key = 'legit_50'}),
			"0
1", "$name: another role still creates keys");
		$gate->query_safe('COMMIT');
		$gate->quit;
		# The worker evicts down to 95 % of the bound, then creates the two
		# keys the reads found no room for (issue 29: a refused read asks
		# the worker to create its key once it has made room).
		my $low = $bound - int($bound / 20);
		ok( $node->poll_query_until(
				'postgres', qq{
SELECT count(*) FILTER (WHERE key LIKE 'again%') <= $low + 2
   AND count(*) FILTER (WHERE key IN ('again_one_more', 'again_through_definer')) = 2
  FROM projcache.entries}),
			"$name: the worker evicted the attacker's oldest keys, down to $low, then created the two refused ones"
		);
		$node->safe_psql('postgres',
			"SET ROLE atk; SELECT projcache.get('again_after')");
		is( $node->safe_psql(
				'postgres',
				"SELECT count(*) FROM projcache.entries WHERE key = 'again_after'"),
			1, "$name: then its new keys are created again");
		is( $node->safe_psql(
				'postgres', q{
SET ROLE legit;
SELECT projcache.get('legit_50', '20s') IS NOT NULL}),
			't', "$name: and the other role's key is fetched");
	}

	cmp_ok(stat_value($node, 'memory_used'), '<=',
		stat_value($node, 'memory_limit'),
		"$name: memory_used is within memory_limit");
	log_shows_no_crash($node);
	$node->stop;
}

done_testing();
