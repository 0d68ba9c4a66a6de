# Copyright (c) 2026, projcache developers
#
# The fetch function runs with the server's settings, never with those the
# owner of projcache.database (a non-superuser) or a role chose there.
#
# The server sets search_path = 'app, public' and DateStyle = 'ISO, MDY' in
# postgresql.conf; the fetch function, owned by the non-superuser
# pc_fetcher, relies on that search_path (unqualified table, unqualified
# "=") and renders a date as text.  Then the database's owner, pc_dbowner,
# runs ALTER DATABASE ... SET:
#
# 1. search_path = evil, pg_catalog, app, public, with an operator
#    evil.=(text, text) that writes down who ran it and matches nothing:
#    after the next scheduler start the fetch must not run it, and must
#    still find its table through the server's search_path;
# 2. DateStyle = 'SQL, DMY': the fetched config keeps the server's
#    rendering of the date;
# 3. default_transaction_read_only = on: a fetch function that writes keeps
#    working.
#
# Each step replaces the last one's setting, so that each shows on its own.
# The scheduler logs which settings it put back to the server's values.

use strict;
use warnings;

use FindBin;
use lib $FindBin::RealBin;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use ProjcacheTest;
use Test::More;

my $node = projcache_node(
	'fetch_settings',
	conf => "search_path = 'app, public'\n"
	  . "DateStyle = 'ISO, MDY'\n"
	  . "projcache.database = 'keys'\n"
	  . "projcache.expiry = '1h'\n"
	  . "projcache.max_retry_backoff = '1s'\n");

$node->safe_psql(
	'postgres', q{
CREATE ROLE pc_fetcher;
CREATE ROLE pc_dbowner LOGIN;
CREATE ROLE pc_app;
GRANT USAGE ON SCHEMA projcache TO pc_app;
GRANT EXECUTE ON FUNCTION projcache.get(text, interval) TO pc_app;
CREATE DATABASE keys;
});
$node->safe_psql(
	'keys', q{
CREATE SCHEMA app AUTHORIZATION pc_fetcher;
SET ROLE pc_fetcher;
CREATE TABLE app.upstream (key text PRIMARY KEY, day date NOT NULL);
INSERT INTO app.upstream
	SELECT 'k' || i, date '2026-03-04' FROM generate_series(1, 9) AS i;
CREATE TABLE app.calls (keys text[]);
-- Unqualified names, resolved with the session's search_path.
CREATE FUNCTION app.fetch(p_keys text[], p_revisions text[])
RETURNS TABLE(key text, state text, revision text, config jsonb)
LANGUAGE plpgsql AS $$
BEGIN
	INSERT INTO calls VALUES (p_keys);
	RETURN QUERY
		SELECT u.key, 'enabled'::text, 'r1'::text,
			   jsonb_build_object('day', u.day::text)
		FROM upstream AS u
		WHERE u.key = ANY (p_keys);
END
$$;
RESET ROLE;
ALTER DATABASE keys OWNER TO pc_dbowner;
});
set_fetch_function($node, 'app.fetch');

# get() as the application role.
sub get_key
{
	my ($key) = @_;
	return $node->safe_psql('postgres',
		"SET ROLE pc_app; SELECT projcache.get('$key', '10s')");
}

is(get_key('k1'), '{"day": "2026-03-04"}',
	'before: the fetch function works with the server\'s settings');

# End the scheduler; the settings of pg_db_role_setting take effect at its
# next start.  Returns the log offset from before.
sub restart_scheduler
{
	my $offset = log_offset($node);
	my $pid = worker_pid($node);
	kill 'TERM', $pid;
	ok(wait_for_worker_exit($node), 'the scheduler exited');
	like(wait_for_worker($node, $pid), qr/^\d+$/, 'a new scheduler runs');
	return $offset;
}

# ---------------------------------------------------------------------------
# 1. The database's owner, as itself, plants a search_path and an operator.
# ---------------------------------------------------------------------------
$node->safe_psql(
	'keys', q{
SET SESSION AUTHORIZATION pc_dbowner;
CREATE SCHEMA evil;
CREATE TABLE evil.ran (who text, super boolean);
GRANT INSERT ON evil.ran TO PUBLIC;
GRANT USAGE ON SCHEMA evil TO PUBLIC;
CREATE FUNCTION evil.texteq(a text, b text) RETURNS boolean
LANGUAGE plpgsql AS $$
BEGIN
	INSERT INTO evil.ran
		SELECT current_user, rolsuper FROM pg_catalog.pg_roles
		WHERE rolname = current_user;
	RETURN false;
END
$$;
CREATE OPERATOR evil.= (LEFTARG = text, RIGHTARG = text,
						FUNCTION = evil.texteq);
ALTER DATABASE keys SET search_path = evil, pg_catalog, app, public;
});
my $offset = restart_scheduler();

# A new key, so that the new scheduler fetches it.
is(get_key('k2'), '{"day": "2026-03-04"}',
	'search_path: the key is fetched through the server\'s search_path');
is($node->safe_psql('keys', 'SELECT count(*) FROM evil.ran'),
	'0', 'search_path: the database owner\'s operator never ran');
like(
	log_since($node, $offset),
	qr/projcache scheduler uses the server's value of 1 setting that database "keys" or its role set\n.*DETAIL:  Settings: search_path\./,
	'search_path: the scheduler logs the setting it put back');

# An ordinary session of the database keeps the database's settings: only
# the scheduler is fenced.
is($node->safe_psql('keys', q{SELECT current_setting('search_path')}),
	'evil, pg_catalog, app, public',
	'an ordinary session of the database keeps its search_path');

# ---------------------------------------------------------------------------
# 2. Another setting, which shapes the text the function returns.
# ---------------------------------------------------------------------------
$node->safe_psql(
	'keys', q{
SET SESSION AUTHORIZATION pc_dbowner;
ALTER DATABASE keys RESET search_path;
ALTER DATABASE keys SET DateStyle = 'SQL, DMY';
});
$offset = restart_scheduler();

is(get_key('k3'), '{"day": "2026-03-04"}',
	'DateStyle: the date is rendered with the server\'s DateStyle');
like(
	log_since($node, $offset),
	qr/projcache scheduler uses the server's value of 1 setting that database "keys" or its role set\n.*DETAIL:  Settings: DateStyle\./,
	'DateStyle: the scheduler logs the setting it put back');
is( $node->safe_psql(
		'keys', q{SELECT current_setting('DateStyle')}),
	'SQL, DMY',
	'an ordinary session of the database keeps its DateStyle');

# ---------------------------------------------------------------------------
# 3. A default that would break a fetch function that writes.
# ---------------------------------------------------------------------------
$node->safe_psql(
	'keys', q{
SET SESSION AUTHORIZATION pc_dbowner;
ALTER DATABASE keys RESET DateStyle;
ALTER DATABASE keys SET default_transaction_read_only = on;
});
restart_scheduler();

is(get_key('k4'), '{"day": "2026-03-04"}',
	'default_transaction_read_only: the fetch function can still write');
is( $node->safe_psql(
		'postgres',
		q{SELECT count(*) FROM projcache.entries WHERE last_error IS NOT NULL}),
	'0',
	'default_transaction_read_only: no fetch failed');

done_testing();
