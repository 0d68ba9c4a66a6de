# Copyright (c) 2026, projcache developers
#
# A worker restart recovers with key lists past the allocator's 1 GB
# (issue 40, item 11).  Above about 16.8 million keys a restarted worker
# could not list the keys of the shared map to rebuild its state: each new
# worker exited about 4.8 s after it started, forever, and no key was
# fetched again.  entries() met the same at 8.4 million keys, and the
# dump's list at 67 million.  The lists are now huge allocations.
#
# projcache.debug_list_limit lowers the 1 GB to 16 kB, so that 4,000 keys
# take every list past it: the worker's list at a restart (4,096 keys of
# 8-byte pointers alone), entries()'s and the dump's.  For each way the
# worker ends in the table below:
# - a new worker comes up, says it is ready, and fetches a new key (the
#   fetch counters advance);
# - entries() returns every key;
# - a dump is written (at a clean stop) and the next start loads every key.

use strict;
use warnings;

use FindBin;
use lib $FindBin::RealBin;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use ProjcacheTest;
use Test::More;
use Time::HiRes qw(time usleep);

my $nkeys = 4000;

my @paths = (
	{
		name => 'worker terminated',
		conf => "projcache.dump_interval = 0\n",
		end => sub {
			my ($node) = @_;
			my $pid = worker_pid($node);
			$node->safe_psql('postgres',
				"SELECT pg_terminate_backend($pid)");
			return $pid;
		},
		# The new worker rebuilds its state from the shared map.
		after => qr/scheduler rebuilt the state of $nkeys cached keys/,
	},
	{
		name => 'immediate stop',
		conf => "projcache.dump_interval = '1s'\n",
		end => sub {
			my ($node, $loaded_at) = @_;
			# The last periodic dump must hold every key.
			ok( $node->poll_query_until(
					'postgres',
					"SELECT (pg_stat_file('projcache_keys.dump')).modification"
					  . " > '$loaded_at'::timestamptz + interval '1s'"),
				'immediate stop: a periodic dump was written after the load'
			);
			$node->stop('immediate');
			$node->start;
			return undef;
		},
		after => qr/projcache loaded $nkeys keys from "projcache_keys.dump"/,
	},
	{
		name => 'clean stop',
		conf => "projcache.dump_interval = 0\n",
		end => sub {
			my ($node) = @_;
			$node->stop('fast');
			$node->start;
			return undef;
		},
		after => qr/projcache loaded $nkeys keys from "projcache_keys.dump"/,
	},);

# Keys with a one-byte config, as in the issue.
sub load_keys
{
	my ($node) = @_;

	$node->safe_psql('postgres',
		"SELECT count(projcache.get('k' || i)) FROM generate_series(1, $nkeys) AS i"
	);
	is( $node->safe_psql(
			'postgres',
			"SELECT count(projcache.get('k' || i, '30s')) FROM generate_series(1, $nkeys) AS i",
			timeout => 300),
		$nkeys,
		"all $nkeys keys are fetched");
	return;
}

my $ready = qr/projcache scheduler ready in database "postgres"/;

# Whether the log shows a line matching re after offset, within the test
# timeout.
sub log_shows
{
	my ($node, $re, $from) = @_;
	my $deadline = time + $PostgreSQL::Test::Utils::timeout_default;

	while (time < $deadline)
	{
		return 1 if log_since($node, $from) =~ $re;
		usleep(100_000);
	}
	return 0;
}

# How many rows of entries() pass the filter, or the error entries() raised.
sub entries_count
{
	my ($node, $where) = @_;
	my ($rc, $out, $err) = psql_verbose($node,
		'SELECT count(*) FROM projcache.entries' . ($where // ''));
	return $rc == 0 ? $out : $err;
}

my $case = 0;
for my $path (@paths)
{
	$case++;
	my $name = $path->{name};
	my $node = projcache_node(
		"lists$case",
		conf => "projcache.debug_list_limit = '16kB'\n"
		  . "projcache.max_memory = '64MB'\n"
		  . "projcache.expiry = '1h'\n"
		  . "projcache.grace_period = '1h'\n"
		  . "projcache.restore_wait = '30s'\n"
		  . $path->{conf});
	$node->safe_psql(
		'postgres', q{
CREATE FUNCTION public.fetch_one_byte(p_keys text[], p_revisions text[])
RETURNS TABLE(key text, state text, revision text, config jsonb)
LANGUAGE sql AS $$
	SELECT k, 'enabled', 'r1', '1'::jsonb FROM unnest(p_keys) AS k
$$;
});
	set_fetch_function($node, 'public.fetch_one_byte');
	is( $node->safe_psql(
			'postgres',
			"SELECT current_setting('projcache.debug_list_limit', true)"),
		'16kB',
		"$name: the lists' limit is lowered");

	load_keys($node);
	my $loaded_at = $node->safe_psql('postgres', 'SELECT clock_timestamp()');
	is(entries_count($node), $nkeys,
		"$name: entries() returns every key before the restart");

	my $from = log_offset($node);
	my $old_pid = $path->{end}->($node, $loaded_at);
	my $pid = wait_for_worker($node, $old_pid);
	like($pid, qr/^\d+$/, "$name: a new worker runs");
	unless (ok(log_shows($node, $ready, $from), "$name: the new worker is ready"))
	{
		$node->stop('immediate');
		next;
	}
	$pid = worker_pid($node);
	like(log_since($node, $from), $path->{after},
		"$name: the new worker has every key");

	my ($calls, $fetched) = split /\|/,
	  $node->safe_psql('postgres',
		'SELECT fetch_calls, fetched_keys FROM projcache.stats');
	is( $node->safe_psql(
			'postgres', "SELECT projcache.get('new-$case', '30s')"),
		'1',
		"$name: the new worker fetches a new key");
	my ($calls_after, $fetched_after) = split /\|/,
	  $node->safe_psql('postgres',
		'SELECT fetch_calls, fetched_keys FROM projcache.stats');
	cmp_ok($calls_after, '>', $calls, "$name: fetch_calls advanced");
	cmp_ok($fetched_after, '>', $fetched, "$name: fetched_keys advanced");
	is(entries_count($node, " WHERE state = 'enabled'"),
		$nkeys + 1,
		"$name: entries() returns every key and the new one");
	is($node->safe_psql('postgres', 'SELECT worker_pid FROM projcache.stats'),
		$pid, "$name: the same new worker did all of this");

	# A dump of every key is written, and the next start loads it.
	$from = log_offset($node);
	$node->restart;
	ok(log_shows($node, $ready, $from), "$name: the worker is ready after a restart");
	my $n = $nkeys + 1;
	like(
		log_since($node, $from),
		qr/projcache loaded $n keys from "projcache_keys.dump"/,
		"$name: the dump held every key, and they were loaded");
	is(entries_count($node, " WHERE state = 'enabled'"),
		$n,
		"$name: entries() returns every loaded key");

	unlike(
		slurp_file($node->logfile),
		qr/out of memory|invalid memory alloc/,
		"$name: no allocation failed");
	log_shows_no_crash($node);
	$node->stop;
}

done_testing();
