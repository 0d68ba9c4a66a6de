# Copyright (c) 2026, projcache developers
#
# A scan beside steady readers under several settings (issue 29): hot keys
# read by a few clients at a steady pace, one get() per statement, and one
# more client reading many more other keys once each, 500 a statement,
# than the cache holds.  The source answers not_modified for an unchanged
# revision.  Each setting runs on a node of its own, with a small
# projcache.max_memory so that the scan fills it several times over:
#
# - short expiry with long grace (the issue's 5 s and 1 h): the hot keys
#   are fetched again every few seconds while the scan's keys queue for
#   the same fetch function;
# - long expiry: the hot keys are not fetched again at all;
# - the scan's values near 4 kB, the hot keys' about 300 bytes: the scan
#   holds most of the memory with few keys.
#
# For each: at most 0.1 % of the hot-key reads made while the scan runs
# return NULL, and none made from 10 s after it ended; the scan did fill
# the memory (keys were evicted for it).
#
# Then a source slower than the hot keys' refetches: hot keys that leave
# the cache come back while the refetches still queue.

use strict;
use warnings;

use FindBin;
use lib $FindBin::RealBin;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use ProjcacheTest;
use Test::More;

my $readers = 4;

# hot: hot keys; pad / cold_pad: md5s per value (8: about 300 bytes);
# cold: the scan's keys; pause: seconds after each of its statements.
my @settings = (
	{
		name => 'short expiry, long grace',
		expiry => '5s',
		grace => '1h',
		hot => 2000,
		pad => 8,
		cold => 40000,
		cold_pad => 8,
		pause => 0.1,
	},
	{
		name => 'long expiry',
		expiry => '1h',
		grace => '1h',
		hot => 2000,
		pad => 8,
		cold => 40000,
		cold_pad => 8,
		pause => 0.1,
	},
	{
		name => 'scan values near 4 kB',
		expiry => '5s',
		grace => '1h',
		hot => 3000,
		pad => 8,
		cold => 24000,
		cold_pad => 120,
		pause => 0.3,
	},);

# A hot reader: the next $chunk hot keys every 0.1 s, one get() per
# statement, from a random start, so that the readers together read each
# key about once a second and each reads every key within a few seconds;
# it counts reads and NULLs while the scan runs and from 10 s after it
# ended, and stops 20 s after it ended.
sub reader_sql
{
	my ($hot) = @_;
	my $chunk = int($hot / $readers / 10 * 1.5);

	return qq{
DO \$\$
DECLARE
	first int := floor(random() * $hot)::int;
	pos int;
	started timestamptz;
	ended timestamptz;
	dr int := 0; dn int := 0; ar int := 0; an int := 0;
	nulls int;
	v jsonb;
	t timestamptz;
BEGIN
	FOR n IN 0..1000000 LOOP
		SELECT at INTO started FROM public.phase WHERE name = 'scan_started';
		SELECT at INTO ended FROM public.phase WHERE name = 'scan_ended';
		t := clock_timestamp();
		EXIT WHEN ended IS NOT NULL AND t > ended + interval '20s';
		nulls := 0;
		FOR j IN 0..$chunk - 1 LOOP
			pos := 1 + (first + n * $chunk + j) % $hot;
			v := projcache.get('hot' || pos);
			IF v IS NULL THEN
				nulls := nulls + 1;
			END IF;
		END LOOP;
		IF started IS NOT NULL AND ended IS NULL THEN
			dr := dr + $chunk;
			dn := dn + nulls;
		ELSIF ended IS NOT NULL AND t > ended + interval '10s' THEN
			ar := ar + $chunk;
			an := an + nulls;
		END IF;
		PERFORM pg_sleep(0.1);
	END LOOP;
	RAISE NOTICE 'result %|%|%|%', dr, dn, ar, an;
END \$\$;
};
}

sub run_setting
{
	my ($i, $set) = @_;
	my $name = $set->{name};
	my $node = projcache_node(
		"scan$i",
		conf => "projcache.max_memory = '8MB'\n"
		  . "projcache.expiry = '$set->{expiry}'\n"
		  . "projcache.grace_period = '$set->{grace}'\n"
		  . "projcache.max_retry_backoff = '2s'\n"
		  . "projcache.fetch_timeout = '3s'\n"
		  . "projcache.batch_interval = '100ms'\n"
		  . "max_connections = 20\n");
	my $statements = $set->{cold} / 500;

	# The source, answering not_modified for an unchanged revision; a role
	# of the service's, that reads and scans.
	$node->safe_psql(
		'postgres', qq{
CREATE TABLE public.upstream (key text PRIMARY KEY, revision text, config jsonb);
INSERT INTO public.upstream
SELECT 'hot' || i, 'r1',
       jsonb_build_object('id', i, 'version', 1, 'blob', repeat(md5(i::text), $set->{pad}))
  FROM generate_series(1, $set->{hot}) AS i
UNION ALL
SELECT 'cold' || i, 'r1',
       jsonb_build_object('id', i, 'version', 1, 'blob', repeat(md5(i::text), $set->{cold_pad}))
  FROM generate_series(1, $set->{cold}) AS i;
ANALYZE public.upstream;
CREATE FUNCTION public.fetch_nm(p_keys text[], p_revisions text[])
RETURNS TABLE(key text, state text, revision text, config jsonb)
LANGUAGE sql STABLE AS \$\$
	SELECT u.key,
	       CASE WHEN u.revision = r.rev THEN 'not_modified' ELSE 'enabled' END,
	       u.revision,
	       CASE WHEN u.revision = r.rev THEN NULL ELSE u.config END
	  FROM unnest(p_keys, p_revisions) AS r(k, rev)
	  JOIN public.upstream AS u ON u.key = r.k
\$\$;
CREATE TABLE public.phase (name text PRIMARY KEY, at timestamptz NOT NULL);
CREATE ROLE app LOGIN;
GRANT USAGE ON SCHEMA projcache TO app;
GRANT EXECUTE ON FUNCTION projcache.get(text) TO app;
GRANT SELECT, INSERT ON public.phase TO app;
CREATE PROCEDURE public.scan()
LANGUAGE plpgsql AS \$\$
BEGIN
	INSERT INTO public.phase VALUES ('scan_started', clock_timestamp());
	COMMIT;
	FOR n IN 0..$statements - 1 LOOP
		PERFORM count(projcache.get('cold' || i))
		   FROM generate_series(1 + n * 500, 500 + n * 500) AS i;
		PERFORM pg_sleep($set->{pause});
	END LOOP;
	INSERT INTO public.phase VALUES ('scan_ended', clock_timestamp());
	COMMIT;
END \$\$;
GRANT EXECUTE ON PROCEDURE public.scan() TO app;
});
	set_fetch_function($node, 'public.fetch_nm');
	wait_for_worker($node);

	# The hot set is cached before the scan starts.
	ok( $node->poll_query_until(
			'postgres', qq{
SELECT count(*) = $set->{hot} FROM generate_series(1, $set->{hot}) AS i
 WHERE projcache.get('hot' || i) IS NOT NULL}),
		"$name: the hot keys are cached");

	# Readers and scanner connect as the service's role.
	my $sql = reader_sql($set->{hot});
	my @sessions =
	  map { start_session($node, "hotreader$_ user=app", $sql, timeout => 600) }
	  1 .. $readers;
	ok( $node->poll_query_until(
			'postgres', qq{
SELECT count(*) = $readers FROM pg_stat_activity
 WHERE application_name LIKE 'hotreader%' AND state = 'active'}),
		"$name: the hot readers read");
	my $scanner = start_session($node, 'scanner user=app', 'CALL public.scan()',
		timeout => 600);

	my ($scan_rc, $scan_out, $scan_err) = wait_session($scanner);
	is($scan_rc, 0, "$name: the scan read its keys without an ERROR")
	  or diag($scan_err);

	my ($dr, $dn, $ar, $an) = (0, 0, 0, 0);
	foreach my $r (@sessions)
	{
		my ($rc, $out, $err) = wait_session($r);
		is($rc, 0, "$name: a hot reader ran") or diag($err);
		if ($err =~ /result (\d+)\|(\d+)\|(\d+)\|(\d+)/)
		{
			$dr += $1;
			$dn += $2;
			$ar += $3;
			$an += $4;
		}
	}
	my $scan_s = $node->safe_psql(
		'postgres', q{
SELECT round(extract(epoch FROM max(at) - min(at))::numeric, 1)
  FROM public.phase});
	my $report =
	    "$name: scan of $set->{cold} keys in $scan_s s; hot-key reads during "
	  . "it: $dr, NULL: $dn; from 10 s after it: $ar, NULL: $an";
	note($report);
	diag($report);
	diag(
		"$name: "
		  . $node->safe_psql(
			'postgres',
			'SELECT format($$entries %s, memory %s of %s, evictions_memory %s, '
			  . 'expiry evictions %s, dropped %s, refused_reads %s, '
			  . 'fetch calls %s, fetch errors %s$$, entries, memory_used, '
			  . 'memory_limit, evictions_memory, evictions_expired, '
			  . 'dropped_fetches, refused_reads, fetch_calls, fetch_errors) '
			  . 'FROM projcache.stats'));

	cmp_ok(stat_value($node, 'evictions_memory'),
		'>', 0, "$name: the scan filled the memory");
	cmp_ok($dr, '>', 5000, "$name: the hot keys were read while the scan ran");
	cmp_ok($dn, '<=', 0.001 * $dr,
		"$name: at most 0.1 % of the hot-key reads during the scan returned NULL"
	);
	cmp_ok($ar, '>', 5000,
		"$name: the hot keys were read from 10 s after the scan");
	is($an, 0, "$name: none of those returned NULL");
	log_shows_no_crash($node);
	$node->stop;
	return;
}

my $i = 0;
run_setting($i++, $_) foreach @settings;

# Refetches due faster than the source answers: 1,000 hot keys stale after
# 1 s, read all the time, and a source that answers 50 keys a call, a
# fifth of a second each (about 250 keys a second).  Hot keys that leave
# the cache meanwhile (here by evict(); a scan or a restart may do it too)
# must come back while the refetches still queue, not once they stop.
{
	my $node = projcache_node(
		'slow',
		conf => "projcache.max_memory = '8MB'\n"
		  . "projcache.expiry = '1s'\n"
		  . "projcache.grace_period = '1h'\n"
		  . "projcache.batch_size = 50\n"
		  . "projcache.batch_interval = '100ms'\n");
	$node->safe_psql(
		'postgres', q{
CREATE TABLE public.upstream (key text PRIMARY KEY, revision text, config jsonb);
INSERT INTO public.upstream
SELECT 'hot' || i, 'r1', jsonb_build_object('id', i, 'blob', repeat(md5(i::text), 8))
  FROM generate_series(1, 1000) AS i;
CREATE FUNCTION public.fetch_slow(p_keys text[], p_revisions text[])
RETURNS TABLE(key text, state text, revision text, config jsonb)
LANGUAGE plpgsql AS $$
BEGIN
	PERFORM pg_sleep(0.2);
	RETURN QUERY
	SELECT u.key,
	       CASE WHEN u.revision = r.rev THEN 'not_modified' ELSE 'enabled' END,
	       u.revision,
	       CASE WHEN u.revision = r.rev THEN NULL ELSE u.config END
	  FROM unnest(p_keys, p_revisions) AS r(k, rev)
	  JOIN public.upstream AS u ON u.key = r.k;
END $$;
CREATE TABLE public.stop (at timestamptz);
});
	set_fetch_function($node, 'public.fetch_slow');
	wait_for_worker($node);
	$node->safe_psql('postgres',
		"SELECT count(projcache.get('hot' || i)) FROM generate_series(1, 1000) AS i"
	);
	# (polled in entries, which asks for no fetch: a read of them all every
	# few tenths of a second would make refetches due faster than the
	# source answers already)
	ok( $node->poll_query_until(
			'postgres', q{
SELECT count(*) = 1000 FROM projcache.entries
 WHERE key LIKE 'hot%' AND state = 'enabled'}),
		'slow source: the hot keys are cached');

	my $reader = q{
DO $$
BEGIN
	WHILE NOT EXISTS (SELECT FROM public.stop) LOOP
		PERFORM projcache.get('hot' || i) FROM generate_series(1, 1000) AS i;
		PERFORM pg_sleep(0.2);
	END LOOP;
END $$;
};
	my @sessions =
	  map { start_session($node, "slowreader$_", $reader, timeout => 300) }
	  1 .. 2;

	# The refetches queue: most hot keys wait for theirs.
	my $queued = q{
SELECT count(*) > 300 FROM projcache.entries
 WHERE key LIKE 'hot%' AND fetch_state = 'in_progress'};
	ok($node->poll_query_until('postgres', $queued),
		'slow source: refetches of the hot keys queue');
	is( $node->safe_psql(
			'postgres',
			"SELECT count(*) FILTER (WHERE projcache.evict('hot' || i))
			   FROM generate_series(1, 20) AS i"),
		'20',
		'slow source: 20 hot keys evicted');
	ok( $node->poll_query_until(
			'postgres', q{
SELECT count(*) = 20 FROM generate_series(1, 20) AS i
 WHERE projcache.get('hot' || i) IS NOT NULL}),
		'slow source: the evicted hot keys, read again, are fetched');
	is($node->safe_psql('postgres', $queued),
		't', 'slow source: while the refetches still queue');
	diag(
		'slow source: '
		  . $node->safe_psql(
			'postgres',
			'SELECT format($$fetch calls %s, fetched keys %s, not_modified %s$$, '
			  . 'fetch_calls, fetched_keys, not_modified) FROM projcache.stats'
		  ));

	$node->safe_psql('postgres', 'INSERT INTO public.stop VALUES (now())');
	foreach my $r (@sessions)
	{
		my ($rc, $out, $err) = wait_session($r);
		is($rc, 0, 'slow source: a hot reader ran') or diag($err);
	}
	log_shows_no_crash($node);
	$node->stop;
}

done_testing();
