# Copyright (c) 2026, projcache developers
#
# DROP ROLE of a role a named cache names (its owner, fetch role or a
# reader) fails (2BP01), however close to the change that named it.  1.3
# looked only at the published registry, so a role granted in the same
# transaction, or a moment before, could be dropped, and the registry kept
# its OID.  Table-driven over
# - what names the role: a grant (reader), a create_cache (owner), a
#   create_cache with a fetch_role;
# - when: in the DROP ROLE's own transaction, committed just before (in
#   projcache.database, and from another database, where the change may
#   not be published yet: see 059), or committing while the DROP ROLE
#   waits for it.
# Each time the registry still names a role that exists.  A role revoked
# (in the same transaction too) can be dropped.

use strict;
use warnings;

use FindBin;
use lib $FindBin::RealBin;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use ProjcacheTest;
use Test::More;

my $node = projcache_node('roledrop');

$node->safe_psql('postgres', 'CREATE DATABASE other');
$node->safe_psql(
	'postgres', q{
CREATE ROLE ops LOGIN;
GRANT USAGE ON SCHEMA projcache TO ops;
GRANT EXECUTE ON FUNCTION
	projcache.create_cache(text, regprocedure, interval, interval, interval,
		interval, integer, interval, bigint, regrole),
	projcache.drop_cache(text), projcache.grant_cache(text, regrole),
	projcache.revoke_cache(text, regrole) TO PUBLIC;
CREATE FUNCTION public.src(keys text[], revisions text[])
RETURNS TABLE(key text, state text, revision text, config jsonb)
LANGUAGE sql AS $$
	SELECT k, 'enabled', 'r1', jsonb_build_object('k', k) FROM unnest(keys) k
$$;
SET ROLE ops;
SELECT projcache.create_cache('c', 'public.src(text[],text[])',
	expiry => '1h', max_memory => 65536);
});

# What names role x, run as ops (or as x for the owner).
my %names = (
	reader => q{SET LOCAL ROLE ops; SELECT projcache.grant_cache('c', 'x')},
	owner => q{GRANT USAGE ON SCHEMA projcache TO x; SET LOCAL ROLE x;
SELECT projcache.create_cache('cx', 'public.src(text[],text[])', max_memory => 65536)},
	'fetch role' => q{GRANT x TO ops; SET LOCAL ROLE ops;
SELECT projcache.create_cache('cx', 'public.src(text[],text[])', max_memory => 65536, fetch_role => 'x')},
);
my %undo = (
	reader => q{SET ROLE ops; SELECT projcache.revoke_cache('c', 'x')},
	owner => q{SELECT projcache.drop_cache(name) FROM projcache.cache_registry WHERE name = 'cx'},
	'fetch role' => q{SELECT projcache.drop_cache(name) FROM projcache.cache_registry WHERE name = 'cx'},
);

# Does the registry name a role that no longer exists?
sub dangling
{
	return $node->safe_psql(
		'postgres', q{
SELECT count(*) FROM projcache.cache_registry r
 WHERE NOT EXISTS (SELECT FROM pg_roles WHERE oid = r.owner::oid)
    OR (r.fetch_role IS NOT NULL AND NOT EXISTS (SELECT FROM pg_roles WHERE oid = r.fetch_role::oid))
    OR EXISTS (SELECT FROM unnest(r.readers::oid[]) o WHERE NOT EXISTS (SELECT FROM pg_roles WHERE oid = o))});
}

for my $as ('reader', 'owner', 'fetch role')
{
	for my $when ('same transaction', 'just committed', 'just committed, dropped from another database',
		'committing while DROP ROLE waits')
	{
		my $name = "$as, $when";
		my ($rc, $out, $err);

		# (1.3 may have left x dropped and named: start afresh)
		$node->psql('postgres', $undo{$as});
		$node->psql('postgres', 'DROP OWNED BY x; DROP ROLE x');
		$node->safe_psql('postgres', 'CREATE ROLE x');
		if ($when eq 'same transaction')
		{
			($rc, $out, $err) = $node->psql('postgres',
				"BEGIN; $names{$as}; RESET ROLE; DROP ROLE x; COMMIT;");
		}
		elsif ($when =~ /^just committed/)
		{
			$node->safe_psql('postgres', "BEGIN; $names{$as}; COMMIT;");
			($rc, $out, $err) = $node->psql(
				$when =~ /another/ ? 'other' : 'postgres', 'DROP ROLE x');
		}
		else
		{
			my $bg = $node->background_psql('postgres');
			$bg->query_safe("BEGIN; $names{$as};");
			my $drop = start_session($node, 'dropper', 'DROP ROLE x');
			ok( $node->poll_query_until(
					'postgres', q{SELECT count(*) = 1 FROM pg_stat_activity
 WHERE application_name = 'dropper' AND wait_event_type = 'Lock'}),
				"$name: DROP ROLE waits for the change");
			$bg->query_safe('COMMIT');
			$bg->quit;
			($rc, $out, $err) = wait_session($drop);
		}
		isnt($rc, 0, "$name: DROP ROLE x is refused");
		like(
			$err,
			$when =~ /another/
			? qr/role "x" cannot be dropped because (a )?named cache ("cx?" )?depends on it/
			: qr/role "x" cannot be dropped because named cache "cx?" depends on it/,
			"$name: it says which cache names the role");
		is(dangling(), '0', "$name: the registry names no dropped role");

		# Undone (a failed transaction undid itself), the role can go.
		$node->psql('postgres', $undo{$as});
		($rc, $out, $err) = $node->psql('postgres', 'DROP OWNED BY x; DROP ROLE x');
		is($rc, 0, "$name: once undone, DROP ROLE x runs") or diag($err);
	}
}

# Revoked in the same transaction: the role can be dropped then.
$node->safe_psql('postgres', 'CREATE ROLE x');
$node->safe_psql('postgres', "SET ROLE ops; SELECT projcache.grant_cache('c', 'x')");
my ($rc, $out, $err) = $node->psql('postgres',
	"BEGIN; SET LOCAL ROLE ops; SELECT projcache.revoke_cache('c', 'x'); RESET ROLE; DROP ROLE x; COMMIT;"
);
is($rc, 0, 'revoked in the same transaction: DROP ROLE x runs') or diag($err);
is(dangling(), '0', 'and the registry names no dropped role');

done_testing();
