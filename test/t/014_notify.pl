# Copyright (c) 2026, projcache developers
#
# projcache.notify_channel: the worker notifies, with the key as payload,
# each key whose stored value changed (a new revision replacing a value, or
# a key turning disabled), after the value is stored: a listener that reads
# the key on hearing the notice gets the new value.  No notice for a first
# value, a not_modified answer, or a fetch that failed; none for a named
# cache's key (1.3).

use strict;
use warnings;

use FindBin;
use lib $FindBin::RealBin;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use ProjcacheTest;
use Test::More;
use Time::HiRes qw(usleep);

my $node = projcache_node('notify',
	conf => "projcache.notify_channel = 'projcache_changes'\n");
create_local_upstream($node);
set_fetch_function($node, 'public.fetch');
wait_for_worker($node);

# A fetch function answering not_modified when the revision is the same,
# and failing for a key named 'broken' while public.broken says so.
$node->safe_psql(
	'postgres', q{
CREATE TABLE public.broken (on_ boolean NOT NULL);
INSERT INTO public.broken VALUES (false);
CREATE FUNCTION public.fetch_nm(p_keys text[], p_revisions text[])
RETURNS TABLE(key text, state text, revision text, config jsonb)
LANGUAGE plpgsql AS $$
BEGIN
	IF 'broken' = ANY (p_keys) AND (SELECT b.on_ FROM public.broken b) THEN
		RAISE EXCEPTION 'upstream is down';
	END IF;
	RETURN QUERY
		SELECT u.key,
			   CASE WHEN u.revision IS NOT DISTINCT FROM r.rev THEN 'not_modified' ELSE u.state END,
			   u.revision, u.config
		  FROM unnest(p_keys, p_revisions) AS r(key, rev)
		  JOIN public.upstream AS u ON u.key = r.key;
END $$;
INSERT INTO public.upstream (key, revision, config) VALUES
	('a', 'r1', '{"v": 1}'), ('b', 'r1', '{"v": 1}'), ('c', 'r1', '{"v": 1}'),
	('broken', 'r1', '{"v": 1}');
});
set_fetch_function($node, 'public.fetch_nm');

my $listener = $node->background_psql('postgres');
$listener->query_safe('LISTEN projcache_changes');

# The notices this listener received since it last looked, as "key" strings.
sub heard
{
	my $out = $listener->query_safe('SELECT 1');
	my @keys = $out =~ /Asynchronous notification "projcache_changes" with payload "([^"]*)" received/g;
	return @keys;
}

# Wait until the listener has heard the expected keys (in any order);
# returns what it heard in all.
sub hear_until
{
	my (@want) = @_;
	my @got;
	foreach my $try (1 .. 300)
	{
		push @got, heard();
		last if join(',', sort @got) eq join(',', sort @want);
		last if @got > @want;
		usleep(100_000);
	}
	return sort @got;
}

# First values: cached, but nothing replaced, so no notice.
is( $node->safe_psql(
		'postgres',
		"SELECT count(projcache.get(k, '10s')) FROM unnest(ARRAY['a', 'b', 'c', 'broken']) AS k"),
	'4', 'four keys cached');

# a gets a new revision, b turns disabled, c is answered not_modified.
$node->safe_psql(
	'postgres', q{
UPDATE public.upstream SET revision = 'r2', config = '{"v": 2}' WHERE key = 'a';
UPDATE public.upstream SET state = 'disabled', revision = 'r2' WHERE key = 'b';
SELECT projcache.invalidate(k) FROM unnest(ARRAY['a', 'b', 'c']) AS k;
});
ok( $node->poll_query_until(
		'postgres', q{
SELECT count(*) = 3 FROM projcache.entries
 WHERE key IN ('a', 'b', 'c') AND freshness = 'fresh' AND fetch_state = 'complete'}),
	'a, b and c were fetched again');
is_deeply([ hear_until('a', 'b') ], [ 'a', 'b' ],
	'one notice for the new revision (a) and one for the key turned disabled (b); none for not_modified (c)');

# A listener that reads the key on hearing the notice gets the new value:
# the notice is sent after the value is stored.
$node->safe_psql('postgres',
	q{UPDATE public.upstream SET revision = 'r3', config = '{"v": 3}' WHERE key = 'a';
	  SELECT projcache.invalidate('a')});
is_deeply([ hear_until('a') ], ['a'], 'a notice for a');
is($listener->query_safe(q{SELECT projcache.get('a') ->> 'v'}),
	'3', 'the listener reads the new value on hearing it');

# A fetch that failed stores nothing and notifies nothing.
$node->safe_psql(
	'postgres', q{
UPDATE public.broken SET on_ = true;
UPDATE public.upstream SET revision = 'r2', config = '{"v": 2}' WHERE key = 'broken';
SELECT projcache.invalidate('broken');
});
ok( $node->poll_query_until(
		'postgres',
		"SELECT last_error LIKE '%upstream is down%' FROM projcache.entries WHERE key = 'broken'"),
	'the fetch of broken failed');
# Its retries fail too; evict it, so that no retry shares a batch with c.
$node->safe_psql('postgres', "SELECT projcache.evict('broken')");
ok( $node->poll_query_until(
		'postgres',
		"SELECT count(*) = 0 FROM projcache.entries WHERE key = 'broken'"),
	'broken is evicted');
# A later change of c is a marker: its notice comes after any for broken.
$node->safe_psql('postgres',
	q{UPDATE public.upstream SET revision = 'r9' WHERE key = 'c';
	  SELECT projcache.invalidate('c')});
is_deeply([ hear_until('c') ], ['c'],
	'no notice for the failed fetch (only the later change of c)');

# Off: an empty channel sends nothing.
$node->safe_psql('postgres', "ALTER SYSTEM SET projcache.notify_channel = ''");
reload_and_wait($node);
$node->safe_psql('postgres',
	q{UPDATE public.upstream SET revision = 'r10' WHERE key = 'c';
	  SELECT projcache.invalidate('c')});
ok( $node->poll_query_until(
		'postgres',
		"SELECT revision = 'r10' FROM projcache.entries WHERE key = 'c'"),
	'c was fetched again with the channel off');
# Then on again: the next change is heard, and only it.
$node->safe_psql('postgres',
	"ALTER SYSTEM SET projcache.notify_channel = 'projcache_changes'");
reload_and_wait($node);
$node->safe_psql('postgres',
	q{UPDATE public.upstream SET revision = 'r11' WHERE key = 'a';
	  SELECT projcache.invalidate('a')});
is_deeply([ hear_until('a') ], ['a'],
	'with the channel off nothing was sent; on again, the next change is heard');

# A named cache's keys (1.3) are not notified: any role that can connect
# may LISTEN, and their names are for the roles the cache is granted to.
$node->safe_psql(
	'postgres', q{
ALTER EXTENSION projcache UPDATE;
SELECT projcache.create_cache('nc', 'public.fetch_nm(text[],text[])');
});
ok( $node->poll_query_until(
		'postgres', "SELECT count(*) = 1 FROM projcache.caches WHERE name = 'nc' AND state = 'open'"),
	'the named cache is published');
is( $node->safe_psql(
		'postgres', q{SELECT projcache.get('nc:a', '10s') IS NOT NULL}),
	't', 'its key is cached from its function');
$node->safe_psql(
	'postgres',
	q{UPDATE public.upstream SET revision = 'r12', config = '{"v": 12}' WHERE key = 'a';
	  SELECT projcache.invalidate('nc:a');});
ok( $node->poll_query_until(
		'postgres',
		"SELECT revision = 'r12' FROM projcache.entries WHERE key = 'nc:a'"),
	'the named cache\'s key was fetched again with a new value');
$node->safe_psql('postgres', q{SELECT projcache.invalidate('a')});
is_deeply([ hear_until('a') ], ['a'],
	'the default cache\'s key is notified, the named cache\'s is not');

# A channel name longer than an identifier is refused.
my ($rc, $out, $err) = $node->psql('postgres',
	"ALTER SYSTEM SET projcache.notify_channel = '" . ('x' x 64) . "'");
like($err, qr/invalid value for parameter "projcache.notify_channel"/,
	'a channel name of 64 bytes is refused');

$listener->quit;
$node->stop;
done_testing();
