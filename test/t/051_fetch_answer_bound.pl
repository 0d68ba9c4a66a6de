# Copyright (c) 2026, projcache developers
#
# One call's answer does not grow the shared worker without bound (issue 40,
# item 5).  Asked for one key, a fetch function answers that key's row and
# then rows of keys nobody asked for.  On 1.3 the worker read the whole
# answer into memory at once: 300,000 rows of 1 kB took its peak RSS up by
# hundreds of MB.  Now it reads the answer a chunk at a time and fails the
# call past a bound: more than 2 rows a key asked for and 100 more (102 rows
# for one key), or more bytes than projcache.max_memory (at least 64 MB).
#
# Table-driven over the answer's rows (just under each bound, just over it,
# and far over it) and their size (10 bytes, 1 kB, 2 MB).  For each case:
# the key is answered (under a bound) or gets a last_error saying the answer
# is too large, with fetch_errors counted (over it); the worker's peak RSS
# (VmHWM) stays within 100 MB of what it was before the first case; and a
# normal key of the same function, and one of a named cache, are fetched
# afterwards.  Then such a key read with nine others: it fails alone, the
# others are answered.  The worker is the same process throughout (a new
# one would hide a peak).

use strict;
use warnings;

use FindBin;
use lib $FindBin::RealBin;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use ProjcacheTest;
use Test::More;

my $node = projcache_node(
	'answer_bound',
	conf => "projcache.max_memory = '64MB'\n"
	  . "projcache.expiry = '1h'\n"
	  . "projcache.max_retry_backoff = '1min'\n");

# "big:<extra>:<size>:<case>" answers its own row, then <extra> rows of
# keys not asked for, each with a config of <size> bytes; any other key
# answers a small config naming it.
$node->safe_psql(
	'postgres', q{
CREATE FUNCTION public.fetch_big(p_keys text[], p_revisions text[])
RETURNS TABLE(key text, state text, revision text, config jsonb)
LANGUAGE plpgsql AS $$
DECLARE
	k text;
	extra int;
	size int;
BEGIN
	FOREACH k IN ARRAY p_keys LOOP
		key := k;
		state := 'enabled';
		revision := '1';
		IF k LIKE 'big:%' THEN
			extra := split_part(k, ':', 2)::int;
			size := split_part(k, ':', 3)::int;
			config := jsonb_build_object('extra', extra);
			RETURN NEXT;
			RETURN QUERY
				SELECT 'unasked' || i, 'enabled', '1',
					   to_jsonb(repeat('x', size))
				  FROM generate_series(1, extra) AS i;
		ELSE
			config := jsonb_build_object('ok', k);
			RETURN NEXT;
		END IF;
	END LOOP;
END
$$;
SELECT projcache.create_cache('nc', 'public.fetch_big(text[],text[])',
	expiry => '1h');
});
set_fetch_function($node, 'public.fetch_big');
ok( $node->poll_query_until(
		'postgres', "SELECT EXISTS (SELECT FROM projcache.caches WHERE name = 'nc')"),
	'the named cache is published');

# The worker's peak resident set, in kB.
sub peak_rss_kb
{
	my ($pid) = @_;
	my $status = slurp_file("/proc/$pid/status");

	return $status =~ /^VmHWM:\s+(\d+) kB/m ? $1 : die "no VmHWM for $pid";
}

# A normal key of the default cache and one of the named cache.
sub normal_keys_served
{
	my ($tag) = @_;

	is( $node->safe_psql('postgres',
			"SELECT projcache.get('ok$tag', '20s')->>'ok'"),
		"ok$tag", "$tag: a normal key of the same function is fetched");
	is( $node->safe_psql('postgres',
			"SELECT projcache.get('nc:ok$tag', '20s')->>'ok'"),
		"ok$tag", "$tag: a key of the named cache is fetched");
	return;
}

my $pid = wait_for_worker($node);
normal_keys_served('warm');
my $base_kb = peak_rss_kb($pid);
note "the worker's peak RSS before the cases: $base_kb kB";

# (rows beside the key's own, size of each row's config, answered?)
my @cases = (
	[ 50, 10, 1 ],
	[ 101, 10, 1 ],          # 102 rows for 1 key: the bound, answered
	[ 101, 1000, 1 ],
	[ 102, 10, 0 ],          # 103 rows: one too many
	[ 102, 1000, 0 ],
	[ 299_999, 10, 0 ],
	[ 299_999, 1000, 0 ],
	[ 30, 2_000_000, 1 ],    # about 60 MB, under 64 MB
	[ 34, 2_000_000, 0 ],    # about 68 MB
);

my $n = 0;
foreach my $case (@cases)
{
	my ($extra, $size, $answered) = @$case;
	my $key = "big:$extra:$size:" . ++$n;
	my $name = "$extra rows of $size bytes beside the key's own";
	my $errors0 = stat_value($node, 'fetch_errors');

	$node->safe_psql('postgres', "SELECT projcache.get('$key')");
	ok( $node->poll_query_until(
			'postgres', qq{
SELECT fetch_state IN ('complete', 'backoff')
  FROM projcache.entries WHERE key = '$key'}, 't'),
		"$name: the fetch ended");
	my $row = $node->safe_psql('postgres',
		"SELECT state, coalesce(last_error, '') FROM projcache.entries "
		  . "WHERE key = '$key'");
	my $errors = stat_value($node, 'fetch_errors') - $errors0;
	if ($answered)
	{
		is($row, 'enabled|', "$name: the key is answered");
		is( $node->safe_psql('postgres',
				"SELECT projcache.get('$key')->>'extra'"),
			$extra, "$name: with its own value");
		is($errors, 0, "$name: no fetch error counted");
	}
	else
	{
		like(
			$row,
			qr/^\w+\|fetch function's answer is too large: more than \d+ (rows|bytes) for 1 key$/,
			"$name: the key fails, its last_error says the answer is too large"
		);
		cmp_ok($errors, '>=', 1, "$name: the failed call is a fetch error");
	}
	my $peak_kb = peak_rss_kb($pid);
	note "$name: the worker's peak RSS is $peak_kb kB";
	cmp_ok($peak_kb - $base_kb, '<', 100 * 1024,
		"$name: the worker's peak RSS grew by less than 100 MB");
	normal_keys_served($n);
	# No retries of a failed key in the cases after it.  evict() fails if
	# a retry runs longer than 5 s, but the eviction stays requested.
	$node->psql('postgres', "SELECT projcache.evict('$key')");
	ok( $node->poll_query_until(
			'postgres',
			"SELECT NOT EXISTS (SELECT FROM projcache.entries WHERE key = '$key')"
		),
		"$name: the key is evicted");
}

# A key read with others, likely in one batch: it fails alone (the batch
# is split as for any failure its keys may have caused), the others are
# answered.
my $bad = 'big:299999:1000:batch';
$node->safe_psql('postgres',
	"SELECT projcache.get(k) FROM unnest(ARRAY['$bad', "
	  . join(', ', map { "'okb$_'" } 1 .. 9)
	  . "]) AS k");
is( $node->safe_psql(
		'postgres',
		"SELECT count(projcache.get('okb' || i, '20s')->>'ok') FROM generate_series(1, 9) AS i"
	),
	9,
	'batch: the keys read with the one whose answer is too large are answered');
ok( $node->poll_query_until(
		'postgres', qq{
SELECT last_error LIKE 'fetch function''s answer is too large: more than 102 rows for 1 key'
  FROM projcache.entries WHERE key = '$bad'}),
	'batch: the key whose answer is too large fails alone');
cmp_ok(peak_rss_kb($pid) - $base_kb,
	'<', 100 * 1024, 'batch: the worker\'s peak RSS grew by less than 100 MB');

is(worker_pid($node), $pid, 'the worker is the same process throughout');
log_shows_no_crash($node);

done_testing();
