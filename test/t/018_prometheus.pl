# Copyright (c) 2026, projcache developers
#
# monitoring/prometheus-queries.yaml, scraped by prometheus-postgres-exporter
# running as a monitoring role that has only the GRANTs README.md
# ("Monitoring") lists, with --auto-discover-databases over two databases
# that have the extension:
#
# a. The file loads, every scrape succeeds, and the metrics are exactly
#    those documented, with their types (counter or gauge).  The key
#    cache's metrics appear once although two databases are scraped, and
#    each database's snapshots appear labelled with it.
# b. The key cache's counters move: hits after get() calls, entries and
#    memory; a key refetched 400 s (test clock) after its previous fetch
#    is counted in the cumulative fetch delay counters from
#    le_seconds="600" up; a fetch function that fails moves
#    fetch_errors_total.
# c. A snapshot goes cold -> fresh (rows, bytes, age) when read, then
#    failing when its source fails, keeping its rows and counting the error.
#
# The exporter is stopped at the end, and by the END block if the test dies.

use strict;
use warnings;

use FindBin;
use lib $FindBin::RealBin;

use IPC::Run;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use ProjcacheTest;
use Test::More;
use Time::HiRes qw(time usleep);

my $queries = "$FindBin::RealBin/../../monitoring/prometheus-queries.yaml";
my $exporter_bin = '/usr/bin/prometheus-postgres-exporter';
plan skip_all => "$exporter_bin is not installed" unless -x $exporter_bin;
plan skip_all => 'curl is not installed'
  unless system('curl --version >/dev/null 2>&1') == 0;
ok(-f $queries, 'the queries file is in the source tree');

# Scrapes poll for a change; on a busy machine a change can take a while.
my $deadline_secs = $PostgreSQL::Test::Utils::timeout_default * 2;

# The metrics the file defines, and their types (README.md lists them).
my %expected_types = (
	(
		map { ("projcache_$_" => 'counter') }
		  qw(hits_total misses_total pending_reads_total refused_reads_total
		  fetch_requests_total fetch_calls_total fetched_keys_total
		  not_modified_total pending_results_total fetch_errors_total
		  refreshes_total request_overflows_total config_loads_total
		  evictions_total fetch_delay_total
		  snapshot_refresh_errors_total)
	),
	(
		map { ("projcache_$_" => 'gauge') }
		  qw(entries memory_used_bytes memory_limit_bytes hit_ratio worker_up
		  stats_reset_timestamp_seconds snapshot_rows snapshot_bytes
		  snapshot_age_seconds snapshot_ttl_seconds snapshot_status_cold
		  snapshot_status_fresh snapshot_status_stale snapshot_status_failing)
	));

my $node = projcache_node('prom');
create_local_upstream($node);
set_fetch_function($node, 'public.fetch');
wait_for_worker($node);

# Keys, a snapshot whose source can be made to fail, and a second database
# with the extension and a snapshot of its own.
$node->safe_psql(
	'postgres', q{
INSERT INTO public.upstream (key, revision, config) VALUES
	('k1', 'r1', '{"v": 1}'), ('boom', 'r1', '{"v": 1}');
CREATE TABLE public.prom_grants (user_id int, audience text);
INSERT INTO public.prom_grants SELECT i, 'aud' || i FROM generate_series(1, 25) AS i;
CREATE TABLE public.prom_switch (broken boolean NOT NULL);
INSERT INTO public.prom_switch VALUES (false);
CREATE FUNCTION public.prom_source_up() RETURNS boolean
LANGUAGE plpgsql STABLE AS $$
BEGIN
	IF (SELECT s.broken FROM public.prom_switch AS s) THEN
		RAISE EXCEPTION 'grants source is down';
	END IF;
	RETURN true;
END $$;
SELECT projcache.create_snapshot('prom.grants',
	'SELECT user_id, audience FROM public.prom_grants WHERE public.prom_source_up()',
	ttl => '1h');
CREATE DATABASE prom_app;
});
$node->safe_psql(
	'prom_app', q{
CREATE EXTENSION projcache;
CREATE TABLE public.t (a int);
SELECT projcache.create_snapshot('app.rows', 'SELECT a FROM public.t');
});

# The monitoring role: README.md's GRANTs, in each database scraped.
$node->safe_psql('postgres', 'CREATE ROLE projcache_monitor LOGIN');
foreach my $db ('postgres', 'prom_app')
{
	$node->safe_psql(
		$db, q{
GRANT USAGE ON SCHEMA projcache TO projcache_monitor;
GRANT EXECUTE ON FUNCTION projcache.stats_1_2_1(), projcache.snapshots_1_2_1() TO projcache_monitor;
GRANT SELECT ON projcache.stats, projcache.snapshots TO projcache_monitor;
});
}
# They do not let it read keys (nor anything else it was not granted).
my ($rc, $out, $err) = psql_verbose($node,
	"SET ROLE projcache_monitor; SELECT projcache.get('k1')");
like($err, qr/42501/, 'the monitoring role cannot read keys');

# ---------------------------------------------------------------------------
# The exporter, as this OS user, on a free loopback port.
# ---------------------------------------------------------------------------
my $port = PostgreSQL::Test::Cluster::get_free_port();
my $url = "http://127.0.0.1:$port/metrics";
my $exporter_log = "$PostgreSQL::Test::Utils::log_path/018_prometheus_exporter.log";
my $exporter;
{
	local $ENV{DATA_SOURCE_NAME} =
	    'host=' . $node->host
	  . ' port=' . $node->port
	  . ' user=projcache_monitor dbname=postgres sslmode=disable';
	$exporter = IPC::Run::start(
		[
			$exporter_bin,
			"--web.listen-address=127.0.0.1:$port",
			"--extend.query-path=$queries",
			'--disable-default-metrics',
			'--disable-settings-metrics',
			'--no-collector.database',
			'--no-collector.bgwriter',
			'--auto-discover-databases',
			'--include-databases=prom_app'
		],
		'<', \undef,
		'&>', $exporter_log);
}

# Stop it however the test ends (keeping the exit status prove reads).
END
{
	local $?;
	if ($exporter)
	{
		eval { $exporter->kill_kill(grace => 10); };
	}
}

# One scrape: (HTTP body or undef, curl's error).
sub scrape
{
	my ($body, $cerr) = ('', '');
	my $ok = IPC::Run::run(
		[
			'curl', '-sS', '--fail', '--noproxy', '*', '--max-time', '20',
			$url
		],
		'<', \undef,
		'>', \$body,
		'2>', \$cerr);
	return ($ok ? $body : undef, $cerr);
}

# The samples of a scrape: { name => [ [ {labels}, value ], ... ] }, and
# the types: { name => type }.
sub parse_metrics
{
	my ($body) = @_;
	my (%samples, %types);

	foreach my $line (split /\n/, $body)
	{
		if ($line =~ /^# TYPE (\S+) (\S+)$/)
		{
			$types{$1} = $2;
		}
		elsif ($line =~ /^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+)$/)
		{
			my ($name, $labels, $value) = ($1, $2 // '', $3);
			my %l = $labels =~ /(\w+)="((?:[^"\\]|\\.)*)"/g;
			push @{ $samples{$name} }, [ \%l, $value ];
		}
	}
	return (\%samples, \%types);
}

# The values of a metric's series whose labels include %want.
sub values_of
{
	my ($samples, $name, %want) = @_;
	my @found;

  SERIES:
	foreach my $s (@{ $samples->{$name} // [] })
	{
		foreach my $k (keys %want)
		{
			next SERIES
			  unless defined $s->[0]{$k} && $s->[0]{$k} eq $want{$k};
		}
		push @found, $s->[1];
	}
	return @found;
}

# The value of the one series of a metric whose labels include %want, or
# undef (none, or several).
sub value_of
{
	my @v = values_of(@_);
	return @v == 1 ? $v[0] : undef;
}

# Scrape until check(samples, types) is true; returns the last samples and
# types, and whether the check held before the deadline (an exporter that
# died shows as failed scrapes; show_last_scrape() prints its log).
my ($last_body, $last_err) = ('', '');
sub scrape_until
{
	my ($check) = @_;
	my $until = time + $deadline_secs;
	my ($samples, $types) = ({}, {});

	while (1)
	{
		my ($body, $cerr) = scrape();
		$last_err = $cerr;
		if (defined $body)
		{
			$last_body = $body;
			($samples, $types) = parse_metrics($body);
			return ($samples, $types, 1) if $check->($samples, $types);
		}
		return ($samples, $types, 0) if time > $until;
		usleep(200_000);
	}
}

sub show_last_scrape
{
	my @ours = grep { /^projcache_|^pg_/ } split /\n/, $last_body;
	diag("last scrape error: $last_err") if $last_err ne '';
	diag(join("\n", @ours));
	diag('exporter log: ' . slurp_file($exporter_log));
}

# ---------------------------------------------------------------------------
# a. The file loads; the metrics and their types are the documented ones.
# ---------------------------------------------------------------------------
my ($m, $types, $ok) = scrape_until(
	sub {
		my ($s) = @_;
		return defined value_of($s, 'projcache_hits_total')
		  && defined value_of($s, 'projcache_snapshot_rows',
			datname => 'prom_app');
	});
ok($ok, 'the exporter serves projcache metrics from both databases')
  or show_last_scrape();
is(value_of($m, 'pg_up'), '1', 'the exporter connected as the monitoring role');
is(value_of($m, 'pg_exporter_user_queries_load_error'),
	'0', 'the queries file loaded');
is(value_of($m, 'pg_exporter_last_scrape_error'),
	'0', 'every query of the scrape ran')
  or show_last_scrape();
my %ours = map { $_ => $types->{$_} } grep { /^projcache_/ } keys %$types;
is_deeply(\%ours, \%expected_types,
	'the projcache metrics are the documented ones, with their types');
is(scalar(values_of($m, 'projcache_entries')),
	1, 'the key cache is exported once, though two databases are scraped');
is(value_of($m, 'projcache_worker_up'), '1', 'worker_up says the worker runs');
is_deeply(
	[ sort map { $_->[0]{cause} } @{ $m->{projcache_evictions_total} } ],
	[qw(expired memory requested)],
	'evictions are labelled by cause');
is_deeply(
	[
		sort { $a <=> $b }
		map { $_->[0]{le_seconds} eq '+Inf' ? 9**9**9 : $_->[0]{le_seconds} }
		  @{ $m->{projcache_fetch_delay_total} }
	],
	[ 15, 30, 60, 120, 300, 600, 1800, 3600, 9**9**9 ],
	'the fetch delay counters are labelled le_seconds, 15 s up to +Inf');
is(value_of($m, 'projcache_snapshot_status_cold',
		datname => 'postgres', snapshot => 'prom.grants'),
	'1', 'a snapshot never read is cold');
is(value_of($m, 'projcache_snapshot_rows',
		datname => 'postgres', snapshot => 'prom.grants'),
	'0', 'and has no rows');
is(value_of($m, 'projcache_snapshot_age_seconds',
		datname => 'postgres', snapshot => 'prom.grants'),
	'NaN', 'and no age');
is(value_of($m, 'projcache_snapshot_ttl_seconds',
		datname => 'postgres', snapshot => 'prom.grants'),
	'3600', 'its TTL is in seconds');
is(value_of($m, 'projcache_snapshot_status_cold',
		datname => 'prom_app', snapshot => 'app.rows'),
	'1', "the other database's snapshot is labelled with that database");

# ---------------------------------------------------------------------------
# b. The key cache's counters move.
# ---------------------------------------------------------------------------
my $hits0 = value_of($m, 'projcache_hits_total');
ok( $node->poll_query_until(
		'postgres', "SELECT projcache.get('k1', '5s') IS NOT NULL"),
	'k1 is fetched');
$node->safe_psql('postgres',
	"SELECT count(projcache.get('k1')) FROM generate_series(1, 50)");
($m, $types, $ok) = scrape_until(
	sub {
		my ($s) = @_;
		my $hits = value_of($s, 'projcache_hits_total');
		return defined $hits && $hits >= $hits0 + 50;
	});
ok($ok, 'hits_total grew by the 50 reads of k1') or show_last_scrape();
cmp_ok(value_of($m, 'projcache_misses_total'), '>=', 1,
	'misses_total counts the first read of k1');
cmp_ok(value_of($m, 'projcache_entries'), '>=', 1, 'entries counts k1');
cmp_ok(value_of($m, 'projcache_memory_used_bytes'),
	'>', 0, 'memory_used_bytes is above 0');
cmp_ok(value_of($m, 'projcache_fetch_calls_total'),
	'>=', 1, 'fetch_calls_total counts the fetch');
my $ratio = value_of($m, 'projcache_hit_ratio');
ok($ratio > 0 && $ratio < 1, "hit_ratio is a ratio ($ratio)");

# k1 refetched 400 s after its previous fetch: between 300 and 600 s.
advance_clock($node, '400s');
$node->safe_psql('postgres', "SELECT projcache.get('k1')");
($m, $types, $ok) = scrape_until(
	sub {
		my ($s) = @_;
		my $b = value_of($s, 'projcache_fetch_delay_total',
			le_seconds => '600');
		return defined $b && $b >= 1;
	});
ok($ok, 'a refetch after 400 s is counted from le_seconds="600" up')
  or show_last_scrape();
my %bucket = map { $_->[0]{le_seconds} => $_->[1] }
  @{ $m->{projcache_fetch_delay_total} };
is_deeply(
	[ @bucket{qw(15 30 60 120 300 600 1800 3600 +Inf)} ],
	[ 0, 0, 0, 0, 0, 1, 1, 1, 1 ],
	'and nowhere below; the counters are cumulative up to +Inf');

# A fetch function that fails for 'boom'.
my $errors0 = value_of($m, 'projcache_fetch_errors_total');
$node->safe_psql(
	'postgres', q{
CREATE FUNCTION public.fetch_or_fail(p_keys text[], p_revisions text[])
RETURNS TABLE(key text, state text, revision text, config jsonb)
LANGUAGE plpgsql AS $$
BEGIN
	IF 'boom' = ANY (p_keys) THEN
		RAISE EXCEPTION 'upstream is down';
	END IF;
	RETURN QUERY SELECT * FROM public.fetch(p_keys, p_revisions);
END $$;
});
set_fetch_function($node, 'public.fetch_or_fail');
$node->safe_psql('postgres', "SELECT projcache.get('boom')");
($m, $types, $ok) = scrape_until(
	sub {
		my ($s) = @_;
		my $e = value_of($s, 'projcache_fetch_errors_total');
		return defined $e && $e > $errors0;
	});
ok($ok, 'fetch_errors_total grows when the fetch function fails')
  or show_last_scrape();

# ---------------------------------------------------------------------------
# c. A snapshot: cold -> fresh when read, failing when its source fails.
# ---------------------------------------------------------------------------
is( $node->safe_psql(
		'postgres',
		"SELECT count(*) FROM projcache.snapshot('prom.grants') AS g(user_id int, audience text)"
	),
	'25',
	'the snapshot loads its 25 rows');
my %snap = (datname => 'postgres', snapshot => 'prom.grants');
($m, $types, $ok) = scrape_until(
	sub {
		my ($s) = @_;
		my $fresh = value_of($s, 'projcache_snapshot_status_fresh', %snap);
		return defined $fresh && $fresh == 1;
	});
ok($ok, 'the snapshot reads as fresh') or show_last_scrape();
is(value_of($m, 'projcache_snapshot_status_cold', %snap),
	'0', 'and no longer as cold');
is(value_of($m, 'projcache_snapshot_rows', %snap), '25', 'rows is 25');
cmp_ok(value_of($m, 'projcache_snapshot_bytes', %snap),
	'>', 0, 'bytes is above 0');
my $age = value_of($m, 'projcache_snapshot_age_seconds', %snap);
ok($age ne 'NaN' && $age >= 0 && $age < 3600, "age_seconds is set ($age)");

$node->safe_psql('postgres', 'UPDATE public.prom_switch SET broken = true');
is($node->safe_psql('postgres', "SELECT projcache.refresh_snapshot('prom.grants')"),
	'f', 'a refresh while the source is down fails');
($m, $types, $ok) = scrape_until(
	sub {
		my ($s) = @_;
		my $failing = value_of($s, 'projcache_snapshot_status_failing', %snap);
		return defined $failing && $failing == 1;
	});
ok($ok, 'the snapshot reads as failing') or show_last_scrape();
is(value_of($m, 'projcache_snapshot_refresh_errors_total', %snap),
	'1', 'refresh_errors_total counts the failed refresh');
is(value_of($m, 'projcache_snapshot_rows', %snap),
	'25', 'the last good rows are still counted');
is(value_of($m, 'projcache_snapshot_status_fresh', %snap),
	'0', 'and it no longer reads as fresh');
is(value_of($m, 'pg_exporter_last_scrape_error'),
	'0', 'the last scrape had no error either');

# ---------------------------------------------------------------------------
# Stop the exporter.
# ---------------------------------------------------------------------------
# kill_kill() is true when TERM was not enough and it had to KILL.
ok(!$exporter->kill_kill(grace => 10), 'the exporter stopped on SIGTERM');
undef $exporter;

$node->stop;
done_testing();
