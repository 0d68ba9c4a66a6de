# Copyright (c) 2026, projcache developers
#
# The key cache comes back warm after a restart (issue 22): the scheduler
# dumps the key map at shutdown and every projcache.dump_interval, and
# loads the dump when it first starts.
#
# - a clean restart while the source is down: every key cached before it
#   is served (stale) after it, none NULL; once the source is back the
#   first read asks it, and not_modified keeps the revision;
# - a key past expiry + grace_period at load is left out; a key with
#   periods of its own (max_age, stale_for) keeps them in the dump, and the
#   load leaves it out past their end, not the settings';
# - a crash (immediate stop) loads the last periodic dump;
# - a dump that is corrupted at random offsets, truncated, empty, from
#   another cluster or of an unknown format version is ignored whole, with
#   a LOG line saying why, and the cache starts cold;
# - dump_interval = -1 neither dumps nor loads;
# - the file is mode 0600.

use strict;
use warnings;

use FindBin;
use lib $FindBin::RealBin;

use Fcntl qw(:mode);
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use ProjcacheTest;
use Test::More;

my $node = projcache_node('warm',
	conf => "projcache.expiry = '1h'\nprojcache.dump_interval = '1s'\n");
create_local_upstream($node);
my $dump = $node->data_dir . '/projcache_keys.dump';

# A source that can be switched off: it fails while public.down has a row.
$node->safe_psql(
	'postgres', q{
CREATE TABLE public.down (since timestamptz);
CREATE FUNCTION public.switched_fetch(p_keys text[], p_revisions text[])
RETURNS TABLE(key text, state text, revision text, config jsonb)
LANGUAGE plpgsql AS $$
BEGIN
	IF EXISTS (SELECT FROM public.down) THEN
		RAISE EXCEPTION 'the source is down';
	END IF;
	RETURN QUERY SELECT * FROM public.fetch(p_keys, p_revisions);
END
$$;
INSERT INTO public.upstream (key, state, revision, config)
SELECT 'k' || i, CASE WHEN i % 10 = 0 THEN 'disabled' ELSE 'enabled' END,
       'r' || i, CASE WHEN i % 10 = 0 THEN NULL
                 ELSE jsonb_build_object('i', i, 'pad', repeat('x', i)) END
  FROM generate_series(1, 500) AS i;
});
set_fetch_function($node, 'public.switched_fetch');
wait_for_worker($node);

$node->safe_psql('postgres',
	"SELECT count(projcache.get('k' || i)) FROM generate_series(1, 500) AS i");
ok( $node->poll_query_until(
		'postgres',
		"SELECT count(*) = 500 FROM projcache.entries WHERE state <> 'pending'"),
	'500 keys are cached');
# What the cache holds, key by key (get() of a disabled key is NULL).
my $contents_sql = q{
SELECT string_agg(key || '=' || state || ':' || coalesce(revision, '-') || ':'
                  || coalesce(projcache.get(key)::text, '-'), ',' ORDER BY key)
  FROM projcache.entries};
my $before = $node->safe_psql('postgres', $contents_sql);

# -- A clean restart while the source is down --------------------------
$node->safe_psql('postgres', 'INSERT INTO public.down VALUES (now())');
$node->restart;
ok(-f $dump, 'the dump file exists after a clean shutdown');
is(S_IMODE((stat $dump)[2]), 0600, 'the dump file is mode 0600');
wait_for_worker($node);
like(slurp_file($node->logfile), qr/projcache loaded 500 keys from "projcache_keys.dump"/,
	'the scheduler logged what it loaded');
is( $node->safe_psql(
		'postgres',
		q{SELECT count(*) FROM generate_series(1, 500) AS i
		   WHERE projcache.get('k' || i) IS NULL AND i % 10 <> 0}),
	'0', 'no cached key reads NULL after the restart, with the source down');
is( $node->safe_psql(
		'postgres',
		$contents_sql),
	$before, 'every key came back with its state, revision and config');
is( $node->safe_psql(
		'postgres', "SELECT count(*) FROM projcache.entries WHERE freshness = 'stale'"),
	'500', 'all loaded keys are stale');
is($node->safe_psql('postgres', 'SELECT loaded_keys FROM projcache.stats'),
	'500', 'stats: loaded_keys');

# The source comes back: a read asks it, with the kept revision.  (The
# calls made while it was down failed, and left no row.)
$node->safe_psql('postgres', 'TRUNCATE public.calls');
$node->safe_psql('postgres', 'DELETE FROM public.down');
$node->safe_psql('postgres', "SELECT projcache.get('k7')");
ok( $node->poll_query_until(
		'postgres', "SELECT freshness = 'fresh' FROM projcache.entries WHERE key = 'k7'"),
	'a read after the restart refreshes the key');
cmp_ok(
	$node->safe_psql(
		'postgres', "SELECT count(*) FROM public.calls WHERE 'k7' = ANY (keys)"),
	'>=', 1, 'the source was asked for it');
is($node->safe_psql('postgres', "SELECT projcache.get('k7')"),
	'{"i": 7, "pad": "xxxxxxx"}', 'with its value');

# -- Age: a key past expiry + grace_period at load is left out ----------
$node->append_conf('postgresql.conf', "projcache.expiry = '10s'\nprojcache.grace_period = '5s'\n");
$node->reload;
$node->stop;
# Make every key look 20 s older by moving the dump's write time back.
age_dump($dump, 20);
$node->start;
wait_for_worker($node);
like(slurp_file($node->logfile), qr/projcache loaded 0 keys.*\n.*DETAIL:  Left out: 500 past expiry \+ grace_period/,
	'keys past expiry + grace_period are left out');
is($node->safe_psql('postgres', 'SELECT entries FROM projcache.stats'),
	'0', 'the cache starts cold');
$node->append_conf('postgresql.conf', "projcache.expiry = '1h'\nprojcache.grace_period = '2min'\n");
$node->reload;

# -- A crash loads the last periodic dump --------------------------------
$node->safe_psql('postgres',
	"SELECT count(projcache.get('k' || i, '5s')) FROM generate_series(1, 50) AS i");
my $mtime = (stat $dump)[9] // 0;
ok( poll_until(sub { defined((stat $dump)[9]) && (stat $dump)[9] > $mtime }),
	'a periodic dump is written');
ok( $node->poll_query_until(
		'postgres', 'SELECT last_dump_keys = 50 FROM projcache.stats'),
	'the periodic dump holds the 50 keys');
$node->stop('immediate');
$node->start;
wait_for_worker($node);
is($node->safe_psql('postgres', 'SELECT loaded_keys FROM projcache.stats'),
	'50', 'after a crash, the last periodic dump is loaded');

# -- Each key's own periods are dumped, and the load follows them -------
# Fetched with max_age / stale_for of their own: long1 2 h + 1 h, short1
# 1 s + 1 s; k1 has the settings' (1 h + 2 min).  Thirty minutes later
# short1 is past its periods and left out; long1 comes back with its own,
# evicted at their end, not at the settings'.
$node->safe_psql(
	'postgres', q{
CREATE FUNCTION public.periods_fetch(p_keys text[], p_revisions text[])
RETURNS TABLE(key text, state text, revision text, config jsonb,
              max_age interval, stale_for interval)
LANGUAGE sql AS $$
	SELECT f.key, f.state, f.revision, f.config,
	       CASE WHEN f.key = 'long1' THEN interval '2h'
	            WHEN f.key = 'short1' THEN interval '1s' END,
	       CASE WHEN f.key = 'long1' THEN interval '1h'
	            WHEN f.key = 'short1' THEN interval '1s' END
	  FROM public.fetch(p_keys, p_revisions) AS f
$$;
INSERT INTO public.upstream (key, revision, config)
VALUES ('long1', 'r1', '{"l": 1}'), ('short1', 'r1', '{"s": 1}');
});
set_fetch_function($node, 'public.periods_fetch');
$node->safe_psql('postgres',
	"SELECT projcache.invalidate('k1'), projcache.get('long1', '5s'), projcache.get('short1', '5s')");
ok( $node->poll_query_until(
		'postgres',
		"SELECT count(*) = 3 FROM projcache.entries WHERE key IN ('k1', 'long1', 'short1') AND freshness = 'fresh'"),
	'keys with and without periods of their own are cached');
my $loaded_before = $node->safe_psql('postgres', 'SELECT entries FROM projcache.stats');
$node->stop;
age_dump($dump, 1800);
my $log_offset = -s $node->logfile;
$node->start;
wait_for_worker($node);
like(
	substr(slurp_file($node->logfile), $log_offset),
	qr/projcache loaded ${\($loaded_before - 1)} keys.*\n.*DETAIL:  Left out: 1 past expiry \+ grace_period or their own periods/,
	'a key past its own periods is left out, one within them is not');
is( $node->safe_psql(
		'postgres', q{
SELECT string_agg(key || ' ' || max_age || ' ' || stale_for || ' ' || freshness || ' '
                  || (expires_in BETWEEN interval '2h 29min' AND interval '2h 30min')::text, ', ' ORDER BY key)
  FROM projcache.entries WHERE key IN ('long1', 'short1')}),
	'long1 02:00:00 01:00:00 stale true',
	'long1 came back stale, with its own periods, evicted at their end');
is( $node->safe_psql(
		'postgres', q{
SELECT max_age || ' ' || stale_for || ' '
       || (expires_in BETWEEN interval '31min' AND interval '32min')::text
  FROM projcache.entries WHERE key = 'k1'}),
	'01:00:00 00:02:00 true',
	'k1 came back with the settings\' periods');
set_fetch_function($node, 'public.switched_fetch');

# -- Damaged or foreign files are ignored whole --------------------------
$node->stop;
my $good = slurp_file($dump);
cmp_ok(length($good), '>', 1000, 'a dump to damage');

my %cases = (
	'empty' => [ '', qr/it is empty/ ],
	'truncated' =>
	  [ substr($good, 0, int(length($good) * 2 / 3)), qr/breaks off|longer than the rest/ ],
	'not a dump' => [ "hello\n" x 20, qr/not a projcache dump file/ ],
	'unknown version' => [ with_version($good, 99), qr/format version is 99/ ],
	'another cluster' => [ with_sysid($good), qr/written by another cluster/ ],
	'trailing bytes' => [ $good . 'x', qr/goes on after its trailer/ ],);
# Eight distinct offsets, so that the test's count does not vary.
my %offsets;
$offsets{ 40 + int(rand(length($good) - 40)) } = 1 while keys %offsets < 8;
for my $off (keys %offsets)
{
	my $bad = $good;
	substr($bad, $off, 1) = chr((ord(substr($bad, $off, 1)) + 1 + int(rand(255))) % 256);
	$cases{"byte $off changed"} = [ $bad, qr/checksum|breaks off|longer than the rest|damaged|counts/ ];
}
my $hdr = $good;
substr($hdr, 12, 1) = chr((ord(substr($hdr, 12, 1)) + 1) % 256);
$cases{'header byte changed'} = [ $hdr, qr/checksum of its header/ ];

for my $case (sort keys %cases)
{
	my ($bytes, $why) = @{ $cases{$case} };
	write_file($dump, $bytes);
	my $offset = -s $node->logfile;
	$node->start;
	wait_for_worker($node);
	like(
		substr(slurp_file($node->logfile), $offset),
		qr/projcache dump file "projcache_keys\.dump" ignored: .*$why/,
		"$case: ignored, with the reason in the log");
	is($node->safe_psql('postgres', 'SELECT entries FROM projcache.stats'),
		'0', "$case: the cache starts cold");
	is($node->safe_psql('postgres', "SELECT projcache.get('k3', '5s')"),
		'{"i": 3, "pad": "xxx"}', "$case: and works");
	$node->stop;
}

# -- A shorter dump_interval takes effect at the reload ------------------
# With dump_interval = 1h the next periodic dump is an hour away; set to
# 1s and reloaded, a dump follows within seconds, not after that hour.
$node->append_conf('postgresql.conf', "projcache.dump_interval = '1h'\n");
$node->start;
wait_for_worker($node);
$node->safe_psql('postgres', "SELECT projcache.get('k3', '5s')");
my $dumped_at = $node->safe_psql('postgres',
	'SELECT coalesce(last_dump_at, now()) FROM projcache.stats');
$node->safe_psql('postgres',
	"ALTER SYSTEM SET projcache.dump_interval = '1s'; SELECT pg_reload_conf()");
ok( $node->poll_query_until(
		'postgres',
		"SELECT last_dump_at > '$dumped_at' FROM projcache.stats"),
	'a shorter dump_interval counts from the reload');
$node->safe_psql('postgres',
	'ALTER SYSTEM RESET projcache.dump_interval; SELECT pg_reload_conf()');

# -- A value longer than the reader's 64 kB buffer loads whole ----------
$node->safe_psql(
	'postgres', q{
DELETE FROM public.down;
INSERT INTO public.upstream (key, state, revision, config)
VALUES ('big', 'enabled', 'r1', jsonb_build_object('pad', repeat('y', 200000)));
});
my $big_md5 = "SELECT md5(config::text) FROM public.upstream WHERE key = 'big'";
is( $node->safe_psql('postgres',
		"SELECT md5(projcache.get('big', '5s')::text) = ($big_md5)"),
	't', 'a 200 kB value is cached');
$node->restart;
ok( $node->poll_query_until(
		'postgres', 'SELECT loaded_keys > 0 FROM projcache.stats'),
	'the keys are loaded after the restart');
is( $node->safe_psql('postgres',
		"SELECT md5(projcache.get('big')::text) = ($big_md5)"),
	't', 'the 200 kB value comes back whole');
$node->stop;

# -- dump_interval = -1: neither dumps nor loads -------------------------
write_file($dump, $good);
$node->append_conf('postgresql.conf', "projcache.dump_interval = -1\n");
$node->start;
wait_for_worker($node);
is($node->safe_psql('postgres', 'SELECT entries FROM projcache.stats'),
	'0', 'dump_interval = -1: nothing is loaded');
$node->safe_psql('postgres', "SELECT projcache.get('k3', '5s')");
unlink $dump;
$node->stop;
ok(!-e $dump, 'dump_interval = -1: nothing is dumped at shutdown');

$node->start;
log_shows_no_crash($node);
$node->stop;
done_testing();

# The dump's header: magic, version, kind, reserved (4 bytes each), the
# system identifier (8), written_at (8, microseconds since 2000), crc (4).
sub header_crc_fix
{
	my ($bytes) = @_;
	my $crc = crc32c(substr($bytes, 0, 32));
	substr($bytes, 32, 4) = pack('V', $crc);
	return $bytes;
}

sub age_dump
{
	my ($path, $seconds) = @_;
	my $bytes = slurp_file($path);
	my ($lo, $hi) = unpack('VV', substr($bytes, 24, 8));
	my $t = $hi * 4294967296 + $lo - $seconds * 1_000_000;
	substr($bytes, 24, 8) = pack('VV', $t % 4294967296, int($t / 4294967296));
	write_file($path, header_crc_fix($bytes));
	return;
}

sub with_version
{
	my ($bytes, $v) = @_;
	substr($bytes, 4, 4) = pack('V', $v);
	return header_crc_fix($bytes);
}

sub with_sysid
{
	my ($bytes) = @_;
	substr($bytes, 16, 8) = pack('VV', 12345, 678);
	return header_crc_fix($bytes);
}

sub write_file
{
	my ($path, $bytes) = @_;
	open(my $fh, '>:raw', $path) or die "open $path: $!";
	print $fh $bytes;
	close($fh);
	chmod(0600, $path);
	return;
}

sub poll_until
{
	my ($cond) = @_;
	for (1 .. 10 * $PostgreSQL::Test::Utils::timeout_default)
	{
		return 1 if $cond->();
		select(undef, undef, undef, 0.1);
	}
	return 0;
}

# CRC-32C (Castagnoli), reflected, as PostgreSQL's pg_crc32c computes it.
sub crc32c
{
	my ($data) = @_;
	my $crc = 0xFFFFFFFF;
	for my $byte (unpack('C*', $data))
	{
		$crc ^= $byte;
		for (1 .. 8)
		{
			$crc = ($crc & 1) ? (($crc >> 1) ^ 0x82F63B78) : ($crc >> 1);
		}
	}
	return $crc ^ 0xFFFFFFFF;
}
