# Copyright (c) 2026, projcache developers

=pod

=head1 NAME

ProjcacheTest - shared helpers for projcache's TAP tests

=head1 SYNOPSIS

  use FindBin;
  use lib $FindBin::RealBin;
  use ProjcacheTest;

  my $node = projcache_node('main', conf => "projcache.expiry = '10s'\n");
  create_local_upstream($node);
  set_fetch_function($node, 'public.fetch');

=head1 DESCRIPTION

The test files find this module through C<use lib $FindBin::RealBin>, so no
PERL5LIB or Makefile change is needed.  It is not itself a test: prove only
runs F<test/t/*.pl>.

Every node made here preloads projcache with the test clock on
(C<projcache.debug_clock>) and a short batch interval, and has the extension
created in the C<postgres> database (the default C<projcache.database>).

=cut

package ProjcacheTest;

use strict;
use warnings;

use Exporter 'import';
use IPC::Run;
use Time::HiRes qw(time);
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

our @EXPORT = qw(
  psql_verbose
  projcache_base_conf
  projcache_node
  create_local_upstream
  create_readonly_upstream
  set_fetch_function
  reload_and_wait
  worker_pid
  wait_for_worker
  wait_for_worker_exit
  stat_value
  calls_count
  advance_clock
  log_offset
  log_since
  start_session
  wait_session
  log_shows_no_crash
  wait_event_of
  key_map_check
);

# A failed poll should fail the test in seconds, not minutes: the whole TAP
# suite has a time budget.  An explicit PG_TEST_TIMEOUT_DEFAULT still wins.
$PostgreSQL::Test::Utils::timeout_default = 30
  unless defined $ENV{PG_TEST_TIMEOUT_DEFAULT}
  && $ENV{PG_TEST_TIMEOUT_DEFAULT} ne '';

=pod

=head1 FUNCTIONS

=over

=item projcache_base_conf()

The postgresql.conf lines every projcache node gets.

=cut

sub projcache_base_conf
{
	return "shared_preload_libraries = 'projcache'\n"
	  . "projcache.debug_clock = on\n"
	  . "projcache.batch_interval = '10ms'\n";
}

=pod

=item projcache_node(name, conf => 'extra lines', init => { ... }, start => 1)

A new node preloading projcache, started, with C<CREATE EXTENSION projcache>
done (unless C<start> is 0, in which case nothing is started or created).

=cut

sub projcache_node
{
	my ($name, %opts) = @_;
	my $node = PostgreSQL::Test::Cluster->new($name);

	$node->init(%{ $opts{init} // {} });
	$node->append_conf('postgresql.conf',
		projcache_base_conf() . ($opts{conf} // ''));
	return $node if defined $opts{start} && !$opts{start};

	$node->start;
	$node->safe_psql('postgres', 'CREATE EXTENSION projcache');
	return $node;
}

=pod

=item create_local_upstream(node)

Creates, in the C<postgres> database:

=over

=item * C<public.upstream(key, state, revision, config)>: the source of truth;

=item * C<public.calls(id, keys, called_at)>: one row per call of the fetch
function, with the keys it was asked for;

=item * C<public.gate>: every fetch reads it, so a session holding
C<LOCK public.gate IN ACCESS EXCLUSIVE MODE> blocks the worker inside the
fetch function until it lets go;

=item * C<public.fetch(text[], text[])>: the fetch function over those.

=back

=cut

# The source of truth both upstreams below create.
my $upstream_table = q{
CREATE TABLE public.upstream (
	key text PRIMARY KEY,
	state text NOT NULL DEFAULT 'enabled',
	revision text,
	config jsonb
);
};

sub create_local_upstream
{
	my ($node) = @_;

	$node->safe_psql(
		'postgres', $upstream_table . q{
CREATE TABLE public.calls (
	id bigserial PRIMARY KEY,
	keys text[] NOT NULL,
	called_at timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE TABLE public.gate (open boolean);
CREATE FUNCTION public.fetch(p_keys text[], p_revisions text[])
RETURNS TABLE(key text, state text, revision text, config jsonb)
LANGUAGE plpgsql AS $$
BEGIN
	PERFORM 1 FROM public.gate;
	INSERT INTO public.calls(keys) VALUES (p_keys);
	RETURN QUERY
		SELECT u.key, u.state, u.revision, u.config
		FROM public.upstream AS u
		WHERE u.key = ANY (p_keys);
END
$$;
});
	return;
}

=pod

=item create_readonly_upstream(node)

Creates, in the C<postgres> database, C<public.upstream> as above and a
fetch function C<public.fetch(text[], text[])> that only reads it, so that a
hot standby made from this node can run it too.

=cut

sub create_readonly_upstream
{
	my ($node) = @_;

	$node->safe_psql(
		'postgres', $upstream_table . q{
CREATE FUNCTION public.fetch(p_keys text[], p_revisions text[])
RETURNS TABLE(key text, state text, revision text, config jsonb)
LANGUAGE sql STABLE AS $$
	SELECT u.key, u.state, u.revision, u.config
	FROM public.upstream AS u
	WHERE u.key = ANY (p_keys)
$$;
});
	return;
}

=pod

=item reload_and_wait(node)

C<pg_reload_conf()>, then wait until the scheduler worker has read its
settings again (C<projcache.stats.config_generation> moved).  Anything the
worker logs while loading them is in the log file when this returns.

=cut

sub reload_and_wait
{
	my ($node) = @_;

	wait_for_worker($node);
	my $gen = stat_value($node, 'config_generation');
	$node->safe_psql('postgres', 'SELECT pg_reload_conf()');
	ok( $node->poll_query_until(
			'postgres',
			"SELECT config_generation > $gen FROM projcache.stats"),
		$node->name . ': the scheduler worker reloaded its settings');
	return;
}

=pod

=item set_fetch_function(node, name)

C<ALTER SYSTEM SET projcache.fetch_function>, reload, and wait for the worker
to take it.

=cut

sub set_fetch_function
{
	my ($node, $fn) = @_;

	$node->safe_psql('postgres',
		"ALTER SYSTEM SET projcache.fetch_function = '$fn'");
	reload_and_wait($node);
	return;
}

=pod

=item worker_pid(node)

The pid of the "projcache scheduler" background worker, from
pg_stat_activity, or '' when none runs.

=cut

sub worker_pid
{
	my ($node) = @_;

	return $node->safe_psql('postgres',
		"SELECT pid FROM pg_stat_activity WHERE backend_type = 'projcache scheduler'"
	);
}

=pod

=item wait_for_worker(node, not_pid)

Wait until a scheduler worker runs (one whose pid is not C<not_pid>, if
given) and return its pid; '' after a timeout.

=cut

sub wait_for_worker
{
	my ($node, $not_pid) = @_;
	my $cond = "backend_type = 'projcache scheduler'";

	$cond .= " AND pid <> $not_pid" if defined $not_pid && $not_pid ne '';
	return ''
	  unless $node->poll_query_until('postgres',
		"SELECT count(*) = 1 FROM pg_stat_activity WHERE $cond");
	return worker_pid($node);
}

=pod

=item wait_for_worker_exit(node, pid)

Wait until no scheduler worker runs and projcache has forgotten its pid.

=cut

sub wait_for_worker_exit
{
	my ($node) = @_;

	return $node->poll_query_until(
		'postgres', q{
SELECT NOT EXISTS (SELECT FROM pg_stat_activity
                   WHERE backend_type = 'projcache scheduler')
   AND (SELECT worker_pid IS NULL FROM projcache.stats)});
}

=pod

=item stat_value(node, column)

One column of C<projcache.stats>.

=cut

sub stat_value
{
	my ($node, $col) = @_;

	return $node->safe_psql('postgres', "SELECT $col FROM projcache.stats");
}

=pod

=item calls_count(node)

How many times the fetch function made by create_local_upstream() ran.

=cut

sub calls_count
{
	my ($node) = @_;

	return $node->safe_psql('postgres', 'SELECT count(*) FROM public.calls');
}

=pod

=item wait_event_of(node, name)

What C<pg_stat_activity.wait_event> shows while projcache waits for C<name>
("projcache key", ...): that name on 17 and later, which let an extension
name its wait events, "Extension" before.  C<wait_event_type> is
"Extension" on all.

=cut

sub wait_event_of
{
	my ($node, $name) = @_;

	return $node->pg_version >= 17 ? $name : 'Extension';
}

=pod

=item advance_clock(node, interval)

C<projcache.debug_advance_clock(interval)>.

=cut

sub advance_clock
{
	my ($node, $interval) = @_;

	$node->safe_psql('postgres',
		"SELECT projcache.debug_advance_clock('$interval')");
	return;
}

=pod

=item log_offset(node)

The current size of the node's log, to look for messages written after now.

=item log_since(node, offset)

The log written since C<offset>.

=cut

sub log_offset
{
	my ($node) = @_;

	return -s $node->logfile;
}

sub log_since
{
	my ($node, $offset) = @_;

	return slurp_file($node->logfile, $offset);
}

=pod

=item start_session(node, application_name, sql, timeout => seconds, user => role, dbname => database)

Runs C<sql> through C<psql -c> in the background, connected with the given
application_name (so that pg_stat_activity can find it), as C<user> (the
test's OS user by default) to C<dbname> (postgres by default), and returns
a handle for wait_session().  Meant for sessions that a crash or a signal
ends: nothing is ever written to this psql's stdin.  The session is killed
after C<timeout> seconds (the test timeout by default).

=item wait_session(handle)

Waits for the session's psql to exit (bounded by the test timeout) and
returns (exit code, stdout, stderr, seconds waited).

=cut

sub start_session
{
	my ($node, $appname, $sql, %opts) = @_;
	my %session = (stdout => '', stderr => '');

	$session{harness} = IPC::Run::start(
		[
			$node->installed_command('psql'), '-XAtq',
			'-v', 'ON_ERROR_STOP=1',
			'-d',
			$node->connstr($opts{dbname} // 'postgres')
			  . " application_name=$appname"
			  . (defined $opts{user} ? " user=$opts{user}" : ''),
			'-c', $sql
		],
		'<', \undef,
		'>', \$session{stdout},
		'2>', \$session{stderr},
		IPC::Run::timeout(
			$opts{timeout} // $PostgreSQL::Test::Utils::timeout_default));
	return \%session;
}

sub wait_session
{
	my ($session) = @_;
	my $t0 = time;
	my $rc;

	eval { $session->{harness}->finish; };
	if ($@)
	{
		$session->{harness}->kill_kill;
		diag("session did not end: $@");
		$rc = -1;
	}
	else
	{
		$rc = $session->{harness}->result(0);
	}
	return ($rc, $session->{stdout}, $session->{stderr}, time - $t0);
}

=pod

=item log_shows_no_crash(node)

A test that the node's log has no PANIC, failed assertion or backend
that died.

=cut

sub log_shows_no_crash
{
	my ($node) = @_;

	unlike(
		slurp_file($node->logfile),
		qr/PANIC|TRAP:|terminated by signal|(?:server process|client backend) .* exited with exit code/i,
		'the log shows no crash');
	return;
}

=pod

=item key_map_check(node)

Checks the key map with C<projcache.debug_check_map()>, which raises
C<data_corrupted> (and so fails the test) at the first invariant it finds
broken, and returns the entries it walked and the rows of
C<projcache.entries> (read as the bootstrap superuser, who sees every key).
The rows are counted before and after the check, again until the two
counts agree (the worker may still be fetching or evicting), so the two
numbers are equal when the map checks out.

=cut

sub key_map_check
{
	my ($node) = @_;
	my $count = 'SELECT count(*) FROM projcache.entries';
	my ($before, $checked, $after);

	for my $try (1 .. 50)
	{
		$before = $node->safe_psql('postgres', $count);
		$checked = $node->safe_psql('postgres',
			'SELECT entries FROM projcache.debug_check_map()');
		$after = $node->safe_psql('postgres', $count);
		last if $before eq $after;
		sleep(1);
	}
	return ($checked, $after);
}

=pod

=item psql_verbose(node, sql)

Runs sql in the C<postgres> database with C<\set VERBOSITY verbose>, so
stderr carries the SQLSTATE; returns (exit code, stdout, stderr).

=cut

sub psql_verbose
{
	my ($node, $sql) = @_;
	my ($stdout, $stderr);
	my $rc = $node->psql(
		'postgres', "\\set VERBOSITY verbose\n$sql",
		stdout => \$stdout,
		stderr => \$stderr);
	return ($rc, $stdout, $stderr);
}

=pod

=back

=cut

1;
