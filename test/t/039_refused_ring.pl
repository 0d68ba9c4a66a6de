# Copyright (c) 2026, projcache developers
#
# A read that finds no room for a new key sends it to the worker, which
# creates the key once it has made room (issue 29, cold start).  Such
# requests have a request ring of their own: a role reading new keys past
# its projcache.max_keys_per_role in a loop must not fill the other
# requests' ring, or every other reader's request would fall back to the
# worker's scan of the whole map (counted in stats.request_overflows).
#
# For each setting: a role at its bound reads 200,000 new keys, several
# times, in sessions of its own, while a superuser (no bound) reads new
# keys 500 a statement and then waits for them.  Checked: no request of
# the superuser overflowed the ring, each of its keys came, and the
# attacker's entries stayed within its bound.

use strict;
use warnings;

use FindBin;
use lib $FindBin::RealBin;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use ProjcacheTest;
use Test::More;

my @settings = (
	{ name => 'bound_100', bound => 100, attackers => 2 },
	{ name => 'bound_2000', bound => 2000, attackers => 1 },
	{ name => 'bound_100_slow_batches', bound => 100, attackers => 2,
		batch_interval => '200ms' },);

foreach my $s (@settings)
{
	my $name = $s->{name};
	my $conf = "projcache.max_keys_per_role = $s->{bound}\n";
	$conf .= "projcache.batch_interval = '$s->{batch_interval}'\n"
	  if $s->{batch_interval};
	my $node = projcache_node($name, conf => $conf);
	create_local_upstream($node);
	$node->safe_psql(
		'postgres', q{
CREATE ROLE attacker LOGIN;
GRANT USAGE ON SCHEMA projcache TO attacker;
GRANT EXECUTE ON FUNCTION projcache.get(text) TO attacker;
INSERT INTO public.upstream (key, revision, config)
	SELECT 'v' || g, 'r1', jsonb_build_object('n', g)
	FROM generate_series(1, 5000) AS g;
});
	set_fetch_function($node, 'public.fetch');

	# The attacker reaches its bound.
	$node->safe_psql('postgres',
		"SET ROLE attacker; SELECT count(projcache.get('fill' || g)) "
		  . "FROM generate_series(1, $s->{bound} + 10) AS g");
	my $overflows_before = stat_value($node, 'request_overflows');

	my @attacks;
	for my $a (1 .. $s->{attackers})
	{
		push @attacks,
		  start_session($node, "attack$a",
			    "SET ROLE attacker; "
			  . "SELECT count(projcache.get('atk$a-' || r || '-' || g)) "
			  . "FROM generate_series(1, 5) AS r, "
			  . "generate_series(1, 200000) AS g");
	}

	# The superuser's new keys, 500 a statement, then each waited for.
	my $missing = 0;
	for my $round (0 .. 9)
	{
		my $from = $round * 500 + 1;
		my $to = $from + 499;
		$node->safe_psql('postgres',
			"SELECT count(projcache.get('v' || g)) "
			  . "FROM generate_series($from, $to) AS g");
		$missing += $node->safe_psql('postgres',
			"SELECT count(*) FROM generate_series($from, $to) AS g "
			  . "WHERE projcache.get('v' || g, '30s') IS NULL");
	}
	foreach my $session (@attacks)
	{
		my ($rc, $out, $err) = wait_session($session);
		is($rc, 0, "$name: the attacker's reads ran") or diag($err);
	}

	is($missing, 0, "$name: each of the superuser's 5,000 keys came");
	is(stat_value($node, 'request_overflows') - $overflows_before,
		0, "$name: no request overflowed the ring during the attack");
	# The worker may still be creating the refused keys it was sent (each
	# after evicting one of the role's), and a scan of the map that runs
	# meanwhile can see a key it deleted and the one it created in its
	# place: count once it has caught up.  An excess that stays fails.
	ok( $node->poll_query_until(
			'postgres',
			"SELECT count(*) <= $s->{bound} FROM projcache.entries WHERE key !~ '^v'"
		),
		"$name: the attacker's entries stayed within its bound")
	  or diag(
		$node->safe_psql('postgres',
			"SELECT count(*) FROM projcache.entries WHERE key !~ '^v'"));
	note("$name: refused reads "
		  . stat_value($node, 'refused_reads')
		  . ", fetch calls "
		  . stat_value($node, 'fetch_calls'));
	log_shows_no_crash($node);
	$node->stop;
}

done_testing();
