# Copyright (c) 2026, projcache developers
#
# What evict() removed, and keys that turned disabled, stay gone after a
# crash (issue 28 item 4): the key dump that a crash restart loads is
# amended by the tombstones written since it began
# (projcache_keys.tomb).
#
# Table-driven: each round caches one key per case, restarts cleanly (the
# dump at shutdown holds them all), acts on each case, makes the source
# fail, crashes (pg_ctl -m immediate) and starts again.  Then, before the
# source is back:
#
# - keep: untouched; comes back from the dump, stale, with its value (the
#   dump was loaded at all);
# - evicted: evict()ed; not in the map, get() is NULL;
# - disabled: its source row deleted, invalidate()d and refetched to
#   disabled; get() is NULL, never the old value;
# - back: evict()ed, then changed at the source and read again (v2); never
#   the old value: where a dump was written after the read, that dump's v2
#   is served; and once the source is back, v2.
#
# Rounds: projcache.dump_interval = 0 (a dump only at shutdown), 1h (one
# periodic dump is due, far away), 1s with the crash at once (periodic
# dumps run while the cases act, and may be under way at the crash), and
# 1s with the crash after two more dumps (only the tombstones written
# since the newest dump began may apply to it: "back" comes from it).
#
# Then:
# - a role with only get() reading keys the source does not know (they
#   turn disabled) writes no tombstone: they are in no dump;
# - a scheduler started again while the server runs (its predecessor wrote
#   the dump at its exit) goes on writing tombstones;
# - a tombstone file damaged in its middle makes the start cold rather
#   than bring keys back; one cut off at its end (a crash while appending)
#   is read up to there.

use strict;
use warnings;

use FindBin;
use lib $FindBin::RealBin;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use ProjcacheTest;
use Test::More;

my $node = projcache_node(
	'tombstones',
	conf => "projcache.expiry = '1h'\n"
	  . "projcache.max_retry_backoff = '1s'\n"
	  . "restart_after_crash = on\n");
my $data = $node->data_dir;
my $tomb = "$data/projcache_keys.tomb";

# The source: a table, and a switch that makes every fetch fail.
$node->safe_psql(
	'postgres', q{
CREATE TABLE public.upstream (key text PRIMARY KEY, state text NOT NULL DEFAULT 'enabled',
                              revision text, config jsonb);
CREATE TABLE public.source (down boolean NOT NULL);
INSERT INTO public.source VALUES (false);
CREATE FUNCTION public.fetch(p_keys text[], p_revisions text[])
RETURNS TABLE(key text, state text, revision text, config jsonb)
LANGUAGE plpgsql AS $$
BEGIN
	IF (SELECT down FROM public.source) THEN
		RAISE EXCEPTION 'the source is down';
	END IF;
	RETURN QUERY
		SELECT u.key, u.state, u.revision, u.config
		FROM public.upstream AS u WHERE u.key = ANY (p_keys);
END
$$;
CREATE ROLE reader LOGIN;
GRANT USAGE ON SCHEMA projcache TO reader;
GRANT EXECUTE ON FUNCTION projcache.get(text), projcache.get(text, interval) TO reader;
});
set_fetch_function($node, 'public.fetch');

sub source_down
{
	my ($down) = @_;
	$node->safe_psql('postgres',
		"UPDATE public.source SET down = " . ($down ? 'true' : 'false'));
	return;
}

sub q_get
{
	my ($key, $wait) = @_;
	my $w = defined $wait ? ", '$wait'" : '';
	return $node->safe_psql('postgres',
		"SELECT coalesce(projcache.get('$key'$w)->>'v', 'NULL')");
}

sub cached
{
	my ($key) = @_;
	return $node->safe_psql('postgres',
		"SELECT count(*) FROM projcache.entries WHERE key = '$key'");
}

# Cache keys, each with value v1, and wait until they are enabled.
sub cache_keys
{
	my (@keys) = @_;
	my $list = join(', ', map { "'$_'" } @keys);
	$node->safe_psql(
		'postgres', qq{
INSERT INTO public.upstream (key, revision, config)
SELECT k, 'r1', '{"v": "v1"}' FROM unnest(ARRAY[$list]) AS k
ON CONFLICT (key) DO UPDATE SET state = 'enabled', revision = 'r1', config = '{"v": "v1"}';
SELECT projcache.get(k, '5s') FROM unnest(ARRAY[$list]) AS k;
});
	ok( $node->poll_query_until(
			'postgres', qq{
SELECT count(projcache.get(k)) = ${\ scalar @keys}
       AND (SELECT count(*) = ${\ scalar @keys} FROM projcache.entries
             WHERE key IN ($list) AND state = 'enabled' AND fetch_state = 'complete')
  FROM unnest(ARRAY[$list]) AS k}),
		"cached: @keys");
	return;
}

# Wait for the worker and for the dump's load after a (re)start.
sub started
{
	my ($what) = @_;
	wait_for_worker($node);
	ok($node->poll_query_until('postgres', 'SELECT loaded_keys > 0 FROM projcache.stats'),
		"$what: the dump is loaded");
	return;
}

sub crash_and_start
{
	$node->stop('immediate');
	$node->start;
	return;
}

# What each case does before the crash.
my %act = (
	keep => sub { },
	evicted => sub {
		my ($k) = @_;
		is($node->safe_psql('postgres', "SELECT projcache.evict('$k')"),
			't', "$k: evict() removes it");
	},
	disabled => sub {
		my ($k) = @_;
		$node->safe_psql('postgres',
			"DELETE FROM public.upstream WHERE key = '$k'; SELECT projcache.invalidate('$k')");
		ok( $node->poll_query_until(
				'postgres', qq{
SELECT projcache.get('$k') IS NULL
       AND (SELECT state = 'disabled' AND fetch_state = 'complete'
              FROM projcache.entries WHERE key = '$k')}),
			"$k: refetched to disabled");
	},
	back => sub {
		my ($k) = @_;
		is($node->safe_psql('postgres', "SELECT projcache.evict('$k')"),
			't', "$k: evict() removes it");
		$node->safe_psql('postgres',
			"UPDATE public.upstream SET revision = 'r2', config = '{\"v\": \"v2\"}' WHERE key = '$k'");
		ok($node->poll_query_until('postgres',
				"SELECT projcache.get('$k', '1s')->>'v' = 'v2'"),
			"$k: read again, it is cached with v2");
	});

# After the crash, the source down: what each case reads.  $dumped: a dump
# was written after the cases acted.
my %expect = (
	keep => sub {
		my ($k, $dumped, $round) = @_;
		is(q_get($k), 'v1', "$round: $k comes back from the dump, stale");
	},
	evicted => sub {
		my ($k, $dumped, $round) = @_;
		is(cached($k), '0', "$round: $k, evicted, is not loaded");
		is(q_get($k), 'NULL', "$round: $k reads NULL");
	},
	disabled => sub {
		my ($k, $dumped, $round) = @_;
		is(q_get($k), 'NULL', "$round: $k, disabled, does not read its old value");
	},
	back => sub {
		my ($k, $dumped, $round) = @_;
		my $got = q_get($k);
		if ($dumped)
		{
			is($got, 'v2', "$round: $k, read again before the dump, comes back with v2");
		}
		else
		{
			isnt($got, 'v1', "$round: $k does not come back with the value evict() removed");
		}
	});

my @rounds = (
	{ name => 'dump_interval 0', interval => '0', dumps_after => 0 },
	{ name => 'dump_interval 1h', interval => '1h', dumps_after => 0 },
	{ name => 'dump_interval 1s, crash at once', interval => '1s', dumps_after => 0 },
	{ name => 'dump_interval 1s, crash after two dumps', interval => '1s', dumps_after => 2 });
my @cases = qw(keep evicted disabled back);

my $n = 0;
for my $round (@rounds)
{
	$n++;
	my %key = map { $_ => "${_}_$n" } @cases;
	my $name = $round->{name};

	source_down(0);
	$node->safe_psql('postgres',
		"ALTER SYSTEM SET projcache.dump_interval = '$round->{interval}'");
	cache_keys(values %key);
	$node->restart;
	started("$name, clean restart");

	$act{$_}->($key{$_}) for @cases;
	for (1 .. $round->{dumps_after})
	{
		my $t = $node->safe_psql('postgres', 'SELECT clock_timestamp()');
		ok( $node->poll_query_until(
				'postgres', "SELECT last_dump_at > '$t' FROM projcache.stats"),
			"$name: a dump is written after the cases acted");
	}
	source_down(1);
	crash_and_start();
	started("$name, after the crash");
	$expect{$_}->($key{$_}, $round->{dumps_after} > 0, $name) for @cases;

	source_down(0);
	ok($node->poll_query_until('postgres', "SELECT projcache.get('$key{back}', '1s')->>'v' = 'v2'"),
		"$name: $key{back} reads v2 once the source is back");
	ok($node->poll_query_until('postgres', "SELECT projcache.get('$key{evicted}', '1s')->>'v' = 'v1'"),
		"$name: $key{evicted} is fetched again when read");
}

# -- A scheduler started again goes on writing tombstones ----------------
# (and first: a role with get() only cannot fill the tombstone file)
source_down(0);
$node->safe_psql('postgres', "ALTER SYSTEM SET projcache.dump_interval = '0'");
cache_keys('w_keep', 'w_evicted');
$node->restart;
started('worker restart, clean restart');

ok(-e $tomb, 'the tombstone file exists beside the dump');
my $size_before = -s $tomb;
$node->safe_psql('postgres', q{
SET ROLE reader;
SELECT count(projcache.get('unknown_' || i)) FROM generate_series(1, 300) AS i});
ok( $node->poll_query_until(
		'postgres',
		"SELECT count(*) = 300 FROM projcache.entries WHERE key LIKE 'unknown\\_%' AND state = 'disabled'"),
	'300 keys the source does not know are cached disabled');
is(-s $tomb, $size_before,
	'keys that were in no dump turned disabled without a tombstone');

my $pid = worker_pid($node);
$node->safe_psql('postgres', "SELECT pg_terminate_backend($pid)");
wait_for_worker($node, $pid);

# The new scheduler does not know which keys the dump holds: still, keys
# that never had a value get no tombstone, however many a role reads.
$size_before = -s $tomb;
$node->safe_psql('postgres', q{
SET ROLE reader;
SELECT count(projcache.get('unknown2_' || i)) FROM generate_series(1, 300) AS i});
ok( $node->poll_query_until(
		'postgres',
		"SELECT count(*) = 300 FROM projcache.entries WHERE key LIKE 'unknown2\\_%' AND state = 'disabled'"),
	'after a worker restart, 300 more unknown keys are cached disabled');
is(-s $tomb, $size_before,
	'after a worker restart, keys that never had a value get no tombstone');

is($node->safe_psql('postgres', "SELECT projcache.evict('w_evicted')"),
	't', 'the new scheduler evicts w_evicted');
source_down(1);
crash_and_start();
started('worker restart, after the crash');
is(q_get('w_keep'), 'v1', 'w_keep comes back from the dump its predecessor wrote');
is(cached('w_evicted'), '0', 'w_evicted, evicted by the restarted scheduler, is not loaded');

# -- A damaged tombstone file ---------------------------------------------
source_down(0);
cache_keys('t_keep', 't_a', 't_b');
$node->restart;
started('damaged file, clean restart');
$node->safe_psql('postgres', "SELECT projcache.evict('t_a'), projcache.evict('t_b')");
$node->stop('immediate');
my $bytes = slurp_file($tomb);
# header (40 bytes), then records: length (4), CRC (4), generation (4), key
my $first_end = 40 + 8 + 4 + length('t_a');
ok(length($bytes) >= $first_end + 8 + 4 + length('t_b'), 'both evictions are tombstoned');

# Cut off in the second record: what a crash while appending leaves.  The
# second key was not yet evicted when its record was cut: it comes back.
write_binary($tomb, substr($bytes, 0, length($bytes) - 2));
$node->start;
started('tombstone file cut off');
is(cached('t_a'), '0', 'cut off at its end: the whole record before is applied');
is(cached('t_b'), '1', 'and the cut record is the end of the file');
$node->safe_psql('postgres', "SELECT projcache.evict('t_b')");
$node->stop('immediate');

# A byte of the first record's key flipped: the dump is not trusted.
$bytes = slurp_file($tomb);
substr($bytes, $first_end - 1, 1) = 'X';
write_binary($tomb, $bytes);
my $offset = log_offset($node);
$node->start;
wait_for_worker($node);
like(log_since($node, $offset),
	qr/projcache removed its key dump: its tombstone file "projcache_keys.tomb" is damaged/,
	'a damaged tombstone file is said in the log');
is($node->safe_psql('postgres', 'SELECT loaded_keys, entries FROM projcache.stats'),
	'0|0', 'and the key cache starts cold');
ok(!-e "$data/projcache_keys.dump", 'the dump it amended is removed');

log_shows_no_crash($node);
$node->stop;
done_testing();

sub write_binary
{
	my ($path, $bytes) = @_;
	open(my $fh, '>:raw', $path) or die "could not write $path: $!";
	print $fh $bytes;
	close($fh);
	return;
}
