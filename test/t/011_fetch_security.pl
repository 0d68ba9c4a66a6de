# Copyright (c) 2026, projcache developers
#
# The fetch function as a hostile non-superuser would write it.
#
# 1. It runs with exactly the fetch role's rights, through commit: deferred
#    constraint triggers (on INSERT and on UPDATE) and a WITH HOLD cursor it
#    left behind never run as the bootstrap superuser, whether the role is
#    projcache.fetch_role, the owner of a SECURITY DEFINER function, or, by
#    default, the owner of a plain one.  A deferred trigger's ERROR is a
#    failed fetch, not a dead worker.
# 2. evict() of a key whose fetch is stuck (fetch_timeout = 0) fails with
#    55006 instead of reporting an eviction that did not happen.
# 3. A result with the same key 101 times is one fetch error, not 101 (the
#    most rows a call for one key may answer is 102: TAP 051).
# 4. It cannot poison the worker's session: after a batch that created temp
#    objects (a type named jsonb, a type named text, a table, a function, an
#    operator), changed settings with plain SET, prepared a statement, took
#    an advisory lock and kept a cursor open, readers still get correct
#    jsonb, and the next batch finds none of it; after a failed batch too.
#    (Run last: on a broken build it spoils the session for what follows.)
#
# The fetch roles and readers are non-superusers; only the administrator's
# steps (roles, settings, watching) run as the bootstrap superuser.

use strict;
use warnings;

use FindBin;
use lib $FindBin::RealBin;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use ProjcacheTest;
use Test::More;

my $node = projcache_node('fetch_security');

# Readers and an operator, and what the attacks write down: who ran each
# piece of their code, and what each batch found left in the session.
$node->safe_psql(
	'postgres', q{
CREATE ROLE pc_app LOGIN;
CREATE ROLE pc_operator LOGIN;
GRANT USAGE ON SCHEMA projcache TO pc_app, pc_operator;
GRANT EXECUTE ON FUNCTION projcache.get(text), projcache.get(text, interval)
	TO pc_app;
GRANT EXECUTE ON FUNCTION projcache.evict(text) TO pc_operator;

CREATE TABLE public.observed (
	id bigserial PRIMARY KEY,
	what text NOT NULL,
	who text NOT NULL,
	super boolean NOT NULL
);
CREATE TABLE public.session_state (
	id bigserial PRIMARY KEY,
	key text NOT NULL,
	temp_objects bigint,
	search_path text,
	tenant text,
	datestyle text,
	prepared bigint,
	advisory bigint,
	listening bigint,
	cursors bigint
);
GRANT INSERT ON public.observed, public.session_state TO PUBLIC;
GRANT USAGE ON SEQUENCE public.observed_id_seq, public.session_state_id_seq
	TO PUBLIC;

-- What user code left in the calling session.  Every name is qualified, so
-- that the temp types and search_path it inspects cannot change it.
CREATE FUNCTION public.record_session_state(k pg_catalog.text) RETURNS void
LANGUAGE sql AS $$
	INSERT INTO public.session_state (key, temp_objects, search_path, tenant,
		datestyle, prepared, advisory, listening, cursors)
	SELECT k,
		(SELECT pg_catalog.count(*) FROM pg_catalog.pg_class
		  WHERE relnamespace = pg_catalog.pg_my_temp_schema())
		+ (SELECT pg_catalog.count(*) FROM pg_catalog.pg_type
		    WHERE typnamespace = pg_catalog.pg_my_temp_schema())
		+ (SELECT pg_catalog.count(*) FROM pg_catalog.pg_proc
		    WHERE pronamespace = pg_catalog.pg_my_temp_schema())
		+ (SELECT pg_catalog.count(*) FROM pg_catalog.pg_operator
		    WHERE oprnamespace = pg_catalog.pg_my_temp_schema()),
		pg_catalog.current_setting('search_path'),
		coalesce(pg_catalog.current_setting('app.tenant', true), ''),
		pg_catalog.current_setting('DateStyle'),
		(SELECT pg_catalog.count(*) FROM pg_catalog.pg_prepared_statements),
		(SELECT pg_catalog.count(*) FROM pg_catalog.pg_locks
		  WHERE locktype = 'advisory' AND pid = pg_catalog.pg_backend_pid()),
		(SELECT pg_catalog.count(*) FROM pg_catalog.pg_listening_channels()),
		(SELECT pg_catalog.count(*) FROM pg_catalog.pg_cursors)
$$;
});

# The attack kit of one role, in a schema of its own, created by the role
# itself.  What the fetch function does depends on each key's prefix.
my $kit = q{
CREATE ROLE @R@;
CREATE SCHEMA @R@ AUTHORIZATION @R@;
SET ROLE @R@;
CREATE TABLE @R@.trap (k text);
CREATE TABLE @R@.counter (k text);
INSERT INTO @R@.counter VALUES ('');
CREATE TABLE @R@.gate ();
CREATE TABLE @R@.served (k text PRIMARY KEY);
CREATE SEQUENCE @R@.fail_once;

-- Write down who runs this, then try to become superuser.
CREATE FUNCTION @R@.note(what text) RETURNS boolean
LANGUAGE plpgsql AS $$
BEGIN
	INSERT INTO public.observed (what, who, super)
		SELECT what, r.rolname, r.rolsuper
		  FROM pg_catalog.pg_roles AS r WHERE r.rolname = current_user;
	BEGIN
		ALTER ROLE @R@ SUPERUSER;
	EXCEPTION WHEN insufficient_privilege THEN
		NULL;
	END;
	RETURN true;
END $$;

CREATE FUNCTION @R@.on_change() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
	IF NEW.k LIKE 'raise%' THEN
		RAISE EXCEPTION 'deferred trigger refuses %', NEW.k;
	END IF;
	PERFORM @R@.note(TG_ARGV[0] || ' ' || NEW.k);
	RETURN NULL;
END $$;
CREATE CONSTRAINT TRIGGER on_insert AFTER INSERT ON @R@.trap
	DEFERRABLE INITIALLY DEFERRED FOR EACH ROW
	EXECUTE FUNCTION @R@.on_change('deferred insert trigger');
CREATE CONSTRAINT TRIGGER on_update AFTER UPDATE ON @R@.counter
	DEFERRABLE INITIALLY DEFERRED FOR EACH ROW
	EXECUTE FUNCTION @R@.on_change('deferred update trigger');

CREATE FUNCTION @R@.fetch(keys text[], revisions text[])
RETURNS TABLE(key text, state text, revision text, config jsonb)
LANGUAGE plpgsql @SECURITY@ AS $$
DECLARE
	v_key text;
BEGIN
	FOREACH v_key IN ARRAY keys LOOP
		IF v_key LIKE 'dt-insert%' OR v_key LIKE 'raise%' THEN
			INSERT INTO @R@.trap VALUES (v_key);
		ELSIF v_key LIKE 'dt-update%' THEN
			UPDATE @R@.counter SET k = v_key;
		ELSIF v_key LIKE 'hold%' THEN
			EXECUTE format('DECLARE %I CURSOR WITH HOLD FOR SELECT @R@.note(%L)',
						   v_key, 'cursor ' || v_key);
			PERFORM public.record_session_state(v_key);
		ELSIF v_key LIKE 'poison-jsonb%' THEN
			CREATE DOMAIN pg_temp.jsonb AS pg_catalog.text;
			CREATE TEMP TABLE leftover (x int);
			CREATE FUNCTION pg_temp.leftover_fn() RETURNS int
				LANGUAGE sql AS 'SELECT 1';
			CREATE OPERATOR pg_temp.=== (LEFTARG = int, RIGHTARG = int,
										FUNCTION = int4eq);
			SET app.tenant = 'evil';
			SET DateStyle = 'SQL, DMY';
			PREPARE leftover_stmt AS SELECT 1;
			PERFORM pg_advisory_lock(4242);
			EXECUTE 'DECLARE leftover_cursor CURSOR WITH HOLD FOR SELECT 1';
			PERFORM public.record_session_state(v_key);
		ELSIF v_key LIKE 'poison-fail%' THEN
			-- Once (a sequence is not rolled back): leave what outlives a
			-- rollback, then fail.
			IF nextval('@R@.fail_once') = 1 THEN
				PREPARE failed_stmt AS SELECT 1;
				PERFORM pg_advisory_lock(4343);
				RAISE EXCEPTION 'poisoned, then failed';
			END IF;
		ELSIF v_key LIKE 'listen%' THEN
			LISTEN leftover_channel;
		ELSIF v_key LIKE 'poison-text%' THEN
			CREATE DOMAIN pg_temp.text AS pg_catalog.varchar(3);
			SET search_path = pg_temp, public, pg_catalog;
			PERFORM public.record_session_state(v_key);
		ELSIF v_key LIKE 'inspect%' THEN
			PERFORM public.record_session_state(v_key);
		ELSIF v_key LIKE 'stuck%' THEN
			PERFORM 1 FROM @R@.gate;
		ELSIF v_key LIKE 'dup%' THEN
			-- The first call answers the key 101 times; its retry, once.
			IF NOT EXISTS (SELECT FROM @R@.served AS s WHERE s.k = v_key) THEN
				INSERT INTO @R@.served VALUES (v_key);
				RETURN QUERY
					SELECT v_key, 'enabled'::pg_catalog.text,
						   'r1'::pg_catalog.text, '{}'::pg_catalog.jsonb
					  FROM generate_series(1, 100);
			END IF;
		END IF;
	END LOOP;
	RETURN QUERY
		SELECT u.k, 'enabled'::pg_catalog.text, 'r1'::pg_catalog.text,
			   pg_catalog.jsonb_build_object('key', u.k,
											 'who', current_user::pg_catalog.text)
		  FROM unnest(keys) AS u(k);
END $$;
RESET ROLE;
};

sub create_kit
{
	my ($role, $security) = @_;
	my $sql = $kit;
	$sql =~ s/\@R\@/$role/g;
	$sql =~ s/\@SECURITY\@/$security/g;
	$node->safe_psql('postgres', $sql);
	return;
}

# Set the fetch function and role as the administrator does, and wait for
# the worker to take them.
sub use_fetch
{
	my ($fn, $role) = @_;
	$node->safe_psql('postgres',
		"ALTER SYSTEM SET projcache.fetch_function = '$fn'");
	$node->safe_psql('postgres',
		"ALTER SYSTEM SET projcache.fetch_role = '$role'");
	reload_and_wait($node);
	return;
}

# get(key) as the reader, waiting for the worker: (exit code, value, stderr).
sub read_as_app
{
	my ($key) = @_;
	my ($rc, $out, $err) = psql_verbose($node,
		"SET ROLE pc_app;\nSELECT projcache.get('$key', '10s');");
	return ($rc, $out, $err);
}

sub observed
{
	my ($what) = @_;
	return $node->safe_psql('postgres',
		"SELECT who, super FROM public.observed WHERE what = '$what' ORDER BY id"
	);
}

sub is_superuser
{
	my ($role) = @_;
	return $node->safe_psql('postgres',
		"SELECT rolsuper FROM pg_roles WHERE rolname = '$role'");
}

# End the worker's session: the scheduler restarts with a new one.  Each
# poisoning below starts from a clean session, so that it shows on its own.
sub new_worker_session
{
	my $pid = worker_pid($node);
	kill 'TERM', $pid;
	ok(wait_for_worker_exit($node), 'the worker exited');
	return wait_for_worker($node, $pid);
}

sub session_state
{
	my ($key) = @_;
	return $node->safe_psql(
		'postgres', qq{
SELECT temp_objects, search_path, tenant, datestyle, prepared, advisory,
	   listening, cursors
  FROM public.session_state WHERE key = '$key' ORDER BY id LIMIT 1});
}

create_kit('pc_evil', '');
create_kit('pc_definer', 'SECURITY DEFINER');
create_kit('pc_owner', '');

my $worker = wait_for_worker($node);
like($worker, qr/^\d+$/, 'the scheduler worker runs');

# ---------------------------------------------------------------------------
# 1. Nothing the fetch function sets in motion runs as superuser.
# ---------------------------------------------------------------------------

# a. projcache.fetch_role set, a plain fetch function it owns.
use_fetch('pc_evil.fetch', 'pc_evil');
my ($rc, $out, $err) = read_as_app('dt-insert-a');
is($out, '{"key": "dt-insert-a", "who": "pc_evil"}',
	'fetch_role: the fetch function ran as pc_evil');
is(observed('deferred insert trigger dt-insert-a'),
	'pc_evil|f', 'fetch_role: its deferred INSERT trigger ran as pc_evil');
($rc, $out, $err) = read_as_app('dt-update-a');
is(observed('deferred update trigger dt-update-a'),
	'pc_evil|f', 'fetch_role: its deferred UPDATE trigger ran as pc_evil');
($rc, $out, $err) = read_as_app('hold-a');
is($out, '{"key": "hold-a", "who": "pc_evil"}',
	'fetch_role: a batch that leaves a WITH HOLD cursor is answered');
like(session_state('hold-a'), qr/\|1$/,
	'fetch_role: the cursor was open when the function returned');
is($node->safe_psql('postgres',
		"SELECT count(*) FROM public.observed WHERE what = 'cursor hold-a' AND (super OR who <> 'pc_evil')"),
	'0', 'fetch_role: the cursor query never ran with more rights than pc_evil');
is(is_superuser('pc_evil'), 'f', 'fetch_role: pc_evil did not become superuser');

# A deferred trigger that raises an error: the call failed, the worker lives.
$node->safe_psql('postgres', "SELECT projcache.get('raise-a')");
ok( $node->poll_query_until(
		'postgres',
		"SELECT last_error LIKE '%deferred trigger refuses raise-a%' FROM projcache.entries WHERE key = 'raise-a'"
	),
	'fetch_role: a deferred trigger\'s error is the key\'s last_error');
is($node->safe_psql('postgres',
		"SELECT state FROM projcache.entries WHERE key = 'raise-a'"),
	'pending', 'fetch_role: the key stays pending');
is(worker_pid($node), $worker, 'fetch_role: the worker did not die of it');
$node->safe_psql('postgres', "SELECT projcache.evict('raise-a')");

# b. No fetch_role, a SECURITY DEFINER fetch function owned by pc_definer.
use_fetch('pc_definer.fetch', '');
($rc, $out, $err) = read_as_app('dt-insert-b');
is($out, '{"key": "dt-insert-b", "who": "pc_definer"}',
	'security definer: the function body ran as its owner');
is(observed('deferred insert trigger dt-insert-b'),
	'pc_definer|f', 'security definer: its deferred trigger ran as its owner');
($rc, $out, $err) = read_as_app('hold-b');
is($node->safe_psql('postgres',
		"SELECT count(*) FROM public.observed WHERE what = 'cursor hold-b' AND (super OR who <> 'pc_definer')"),
	'0', 'security definer: its cursor query never ran as anyone else');
is(is_superuser('pc_definer'), 'f',
	'security definer: pc_definer did not become superuser');

# c. No fetch_role, a plain fetch function: it runs as its owner.
use_fetch('pc_owner.fetch', '');
($rc, $out, $err) = read_as_app('dt-update-c');
is($out, '{"key": "dt-update-c", "who": "pc_owner"}',
	'default: a plain fetch function runs as its owner');
is(observed('deferred update trigger dt-update-c'),
	'pc_owner|f', 'default: its deferred trigger ran as its owner');
is(is_superuser('pc_owner'), 'f', 'default: pc_owner did not become superuser');

# ---------------------------------------------------------------------------
# 2. evict() of a key whose fetch is stuck does not report an eviction.
# ---------------------------------------------------------------------------
use_fetch('pc_evil.fetch', 'pc_evil');
$node->safe_psql('postgres', "ALTER SYSTEM SET projcache.fetch_timeout = 0");
reload_and_wait($node);

my $gate = $node->background_psql('postgres');
$gate->query_safe('BEGIN');
$gate->query_safe('LOCK pc_evil.gate IN ACCESS EXCLUSIVE MODE');
$node->safe_psql('postgres', "SELECT projcache.get('stuck-1')");
ok( $node->poll_query_until(
		'postgres', q{
SELECT count(*) = 1
  FROM pg_locks AS l JOIN pg_stat_activity AS a USING (pid)
 WHERE a.backend_type = 'projcache scheduler' AND NOT l.granted
   AND l.relation = 'pc_evil.gate'::regclass}),
	'evict: the fetch of stuck-1 waits on the gate');

($rc, $out, $err) = psql_verbose($node,
	"SET ROLE pc_operator;\nSELECT projcache.evict('stuck-1');");
isnt($rc, 0, 'evict: evict() of the stuck key fails');
like($err, qr/ERROR:  55006: /, 'evict: with SQLSTATE 55006');
unlike($out, qr/^t$/m, 'evict: it did not return true');
is($node->safe_psql('postgres',
		"SELECT count(*) FROM projcache.entries WHERE key = 'stuck-1'"),
	'1', 'evict: the key is still cached');

$gate->query_safe('COMMIT');
$gate->quit;
ok( $node->poll_query_until(
		'postgres',
		"SELECT count(*) = 0 FROM projcache.entries WHERE key = 'stuck-1'"),
	'evict: once the fetch ends, the requested eviction happens');
$node->safe_psql('postgres', 'ALTER SYSTEM RESET projcache.fetch_timeout');
reload_and_wait($node);

# ---------------------------------------------------------------------------
# 3. 101 rows of one key count as one fetch error.
# ---------------------------------------------------------------------------
my ($errors_before, $calls_before) = split /\|/,
  $node->safe_psql('postgres',
	'SELECT fetch_errors, fetch_calls FROM projcache.stats');
($rc, $out, $err) = read_as_app('dup-1');
is($out, '{"key": "dup-1", "who": "pc_evil"}',
	'duplicates: the retry after the broken answer is served');
my ($errors_after, $calls_after) = split /\|/,
  $node->safe_psql('postgres',
	'SELECT fetch_errors, fetch_calls FROM projcache.stats');
is($calls_after - $calls_before, 2,
	'duplicates: two calls (the broken answer, then its retry)');
is($errors_after - $errors_before, 1,
	'duplicates: the call that answered the key 101 times is one fetch error');

# Nothing above made the worker restart.
is(worker_pid($node), $worker, 'the same worker ran every batch so far');

# ---------------------------------------------------------------------------
# 4. The worker's session cannot be poisoned.
# ---------------------------------------------------------------------------
new_worker_session();
($rc, $out, $err) = read_as_app('inspect-0');
is($out, '{"key": "inspect-0", "who": "pc_evil"}',
	'poison: a batch before the poisoning');
my $baseline = session_state('inspect-0');
like($baseline, qr/^0\|"\$user", public\|\|ISO, MDY\|0\|0\|0\|0$/,
	"poison: the session as the worker left it ($baseline)");

($rc, $out, $err) = read_as_app('poison-jsonb');
is($out, '{"key": "poison-jsonb", "who": "pc_evil"}',
	'poison: the poisoning batch is answered');
like(
	session_state('poison-jsonb'),
	qr/^[1-9]\d*\|[^|]*\|evil\|SQL, DMY\|1\|1\|0\|1$/,
	'poison: that batch made temp objects, SET settings, prepared, locked and kept a cursor'
);

($rc, $out, $err) = read_as_app('inspect-1');
is($rc, 0, 'poison: the next key reads without an error') or diag($err);
unlike($err, qr/XX000/, 'poison: no XX000 for readers');
is($out, '{"key": "inspect-1", "who": "pc_evil"}',
	'poison: the next key is the right jsonb value, not a text stored as jsonb');
($rc, $out, $err) = psql_verbose($node,
	"SELECT jsonb_typeof(projcache.get('inspect-1')), projcache.get('inspect-1') ->> 'who'"
);
is($out, 'object|pc_evil', 'poison: the cached value works as jsonb');
is(session_state('inspect-1'), $baseline,
	'poison: the next batch found no temp object, setting, prepared statement, advisory lock or cursor left'
);

new_worker_session();

# A variant: a temp type named text, reached through a search_path that puts
# pg_temp first, set with plain SET.
($rc, $out, $err) = read_as_app('poison-text');
is($out, '{"key": "poison-text", "who": "pc_evil"}',
	'poison: the second poisoning batch is answered');
like(
	session_state('poison-text'),
	qr/^[1-9]\d*\|pg_temp, public, pg_catalog\|/,
	'poison: that batch made a temp type text and put pg_temp first');
($rc, $out, $err) = read_as_app('inspect-2');
is($rc, 0, 'poison: the next key reads without an error') or diag($err);
is($out, '{"key": "inspect-2", "who": "pc_evil"}',
	'poison: the next key is served whole (not cut to varchar(3))');
is( $node->safe_psql(
		'postgres',
		"SELECT state, last_error IS NULL FROM projcache.entries WHERE key = 'inspect-2'"
	),
	'enabled|t',
	'poison: and it was fetched without an error');
is(session_state('inspect-2'), $baseline,
	'poison: the next batch found the temp type gone and search_path back');

new_worker_session();

# A failed batch: what a rollback does not undo (a prepared statement, a
# session advisory lock) is gone too.
($rc, $out, $err) = read_as_app('poison-fail');
is($out, '{"key": "poison-fail", "who": "pc_evil"}',
	'poison: the retry of the failed poisoning batch is answered');
($rc, $out, $err) = read_as_app('inspect-3');
is(session_state('inspect-3'), $baseline,
	'poison: after a failed batch, no prepared statement or advisory lock is left'
);

# LISTEN is refused in a background process: nothing to undo there.
$node->safe_psql('postgres', "SELECT projcache.get('listen-1')");
ok( $node->poll_query_until(
		'postgres',
		"SELECT last_error LIKE '%LISTEN%background process%' FROM projcache.entries WHERE key = 'listen-1'"
	),
	'poison: LISTEN fails in the worker');
$node->safe_psql('postgres', "SELECT projcache.evict('listen-1')");


$node->stop;
done_testing();
