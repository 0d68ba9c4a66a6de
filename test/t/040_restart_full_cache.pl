# Copyright (c) 2026, projcache developers
#
# A restart that cannot load the whole key dump leaves out what eviction
# would have taken first, never the hot keys (issue 29).  Hot keys are read
# again and again while a scan of cold keys fills projcache.max_memory
# several times over, so that eviction keeps the hot ones in its main FIFO
# and the scan's in the small one; then the source goes down and the server
# is restarted twice.  The dump's load stops when memory nears its bound:
# with the keys in the map's (hash) order it left hot keys out, and they
# read NULL until the source came back (the fault soak's restarts: 515 hot
# keys).  Now the dump lists the keys in the order eviction keeps them and
# the load restores that order, so the keys left out are the scan's.
#
# Under each setting of the table below:
# - where the restart lowers max_memory, the load did stop at the memory
#   bound (else the case tests nothing);
# - after each restart, 0 of the hot keys read NULL, with the source down;
# - the keys loaded after the second restart are as many as after the
#   first (the FIFOs came back as they were, so the second dump keeps the
#   same keys).

use strict;
use warnings;

use FindBin;
use lib $FindBin::RealBin;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use ProjcacheTest;
use Test::More;

my @settings = (
	{
		name => '8 MB, then 6 MB; 300-byte values; dump at shutdown',
		memory => '8MB',
		restart_memory => '6MB',
		pad => 8,
		hot => 2000,
		cold => 40000,
		conf => "projcache.dump_interval = 0\n",
	},
	{
		name => '16 MB, then 8 MB; 1 kB values; a dump every second',
		memory => '16MB',
		restart_memory => '8MB',
		pad => 30,
		hot => 1500,
		cold => 30000,
		conf => "projcache.dump_interval = '1s'\n",
	},
	{
		name => '8 MB throughout; 300-byte values; scan until the load cannot hold the dump',
		memory => '8MB',
		restart_memory => '8MB',
		pad => 8,
		hot => 3000,
		cold => 40000,
		conf => "projcache.dump_interval = 0\n",
	},);

# Read every hot key (marking it read for eviction), then the next slice of
# cold keys: once to ask for them all, then waiting for each.
sub scan_sql
{
	my ($set, $from, $to) = @_;

	return qq{
DO \$\$
BEGIN
	FOR n IN $from..$to LOOP
		PERFORM count(projcache.get('hot' || i))
		   FROM generate_series(1, $set->{hot}) AS i;
		PERFORM count(projcache.get('cold' || i))
		   FROM generate_series(1 + n * 500, 500 + n * 500) AS i;
		PERFORM count(projcache.get('cold' || i, '30s'))
		   FROM generate_series(1 + n * 500, 500 + n * 500) AS i;
	END LOOP;
END \$\$;};
}

my $case = 0;
for my $set (@settings)
{
	$case++;
	my $name = $set->{name};
	my $node = projcache_node(
		"full$case",
		conf => "projcache.max_memory = '$set->{memory}'\n"
		  . "projcache.expiry = '1h'\n"
		  . "projcache.grace_period = '1h'\n"
		  . "projcache.max_retry_backoff = '1s'\n"
		  . "projcache.restore_wait = '30s'\n"
		  . $set->{conf});

	$node->safe_psql(
		'postgres', qq{
CREATE TABLE public.source_up (up bool NOT NULL);
INSERT INTO public.source_up VALUES (true);
CREATE FUNCTION public.source_check() RETURNS bool
LANGUAGE plpgsql STABLE AS \$\$
BEGIN
	IF NOT (SELECT up FROM public.source_up) THEN
		RAISE EXCEPTION 'the source is down';
	END IF;
	RETURN true;
END \$\$;
CREATE TABLE public.configs (key text PRIMARY KEY, revision text, config jsonb);
INSERT INTO public.configs
SELECT 'hot' || i, 'r1',
       jsonb_build_object('id', i, 'blob', repeat(md5(i::text), $set->{pad}))
  FROM generate_series(1, $set->{hot}) AS i
UNION ALL
SELECT 'cold' || i, 'r1',
       jsonb_build_object('id', i, 'blob', repeat(md5(i::text), $set->{pad}))
  FROM generate_series(1, $set->{cold}) AS i;
ANALYZE public.configs;
CREATE FUNCTION public.fetch_src(p_keys text[], p_revisions text[])
RETURNS TABLE(key text, state text, revision text, config jsonb)
LANGUAGE sql STABLE AS \$\$
	SELECT c.key, 'enabled', c.revision, c.config
	  FROM public.configs AS c
	 WHERE public.source_check() AND c.key = ANY (p_keys)
\$\$;
});
	set_fetch_function($node, 'public.fetch_src');
	wait_for_worker($node);

	$node->safe_psql('postgres',
		"SELECT count(projcache.get('hot' || i)) FROM generate_series(1, $set->{hot}) AS i;"
		  . "SELECT count(projcache.get('hot' || i, '30s')) FROM generate_series(1, $set->{hot}) AS i"
	);
	my $slices = $set->{cold} / 500;
	$node->safe_psql('postgres', scan_sql($set, 0, $slices - 1),
		timeout => 600);
	cmp_ok(stat_value($node, 'evictions_memory'),
		'>', 0, "$name: the scan filled the memory");
	is( $node->safe_psql(
			'postgres',
			"SELECT count(*) FROM generate_series(1, $set->{hot}) AS i WHERE projcache.get('hot' || i) IS NULL"
		),
		'0',
		"$name: every hot key is cached after the scan");

	$node->safe_psql('postgres', 'UPDATE public.source_up SET up = false');
	my @loaded;
	for my $restart (1 .. 2)
	{
		my $from = log_offset($node);
		$node->stop('fast');
		$node->append_conf('postgresql.conf',
			"projcache.max_memory = '$set->{restart_memory}'\n");
		$node->start;
		# get() waits for the load (restore_wait), then reads the cache.
		my $nulls = $node->safe_psql('postgres',
			"SELECT count(*) FROM generate_series(1, $set->{hot}) AS i WHERE projcache.get('hot' || i) IS NULL"
		);
		ok( $node->poll_query_until(
				'postgres',
				"SELECT loaded_keys > 0 FROM projcache.stats"),
			"$name, restart $restart: the dump was loaded");
		my $log = log_since($node, $from);
		my $stopped = $log =~ /loading stopped with memory nearly full/;
		push @loaded, stat_value($node, 'loaded_keys');
		diag("$name, restart $restart: loaded $loaded[-1] keys"
			  . ($stopped ? ', stopped at the memory bound' : ''));
		# With the memory unchanged, whether the load stops at the bound
		# depends on where eviction left the memory at the dump: said, not
		# tested.
		ok($stopped,
			"$name, restart $restart: the load stopped at the memory bound")
		  if $restart == 1 && $set->{restart_memory} ne $set->{memory};
		is($nulls, '0',
			"$name, restart $restart: no hot key reads NULL with the source down"
		);
	}
	cmp_ok(abs($loaded[1] - $loaded[0]),
		'<=', 0.02 * $loaded[0],
		"$name: the second restart loads as many keys as the first");
	log_shows_no_crash($node);
	$node->stop;
}

done_testing();
