# Copyright (c) 2026, projcache developers
#
# A standby's recovery from an overflow of projcache.wal_pending_memory
# waits only for the transactions whose invalidations it dropped.
#
# 1. A transaction left open on the primary, older than the one whose
#    invalidations overflowed (BEGIN; SELECT txid_current(); then idle),
#    does not keep the standby's keys stale: once the overflowing
#    transaction's commit is replayed, the keys are refetched on their next
#    read.  Until then (its commit held back by recovery_min_apply_delay)
#    they stay stale and waiting.
# 2. The same with a prepared transaction left open, which no session holds.
# 3. A record redo cannot read (a malformed INVALIDATE, a record of an
#    unknown type, written through a test-only function that works only
#    with projcache.debug_clock on) is not skipped silently: the standby
#    logs a WARNING and treats every cached key as invalidated by the
#    record's transaction, refetching after its commit.

use strict;
use warnings;

use FindBin;
use lib $FindBin::RealBin;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use ProjcacheTest;
use Test::More;

my $primary = projcache_node(
	'primary',
	init => { allows_streaming => 1 },
	conf => "projcache.wal_invalidations = on\n"
	  . "projcache.expiry = '1h'\n"
	  . "projcache.max_retry_backoff = '1s'\n"
	  . "max_prepared_transactions = 5\n");

create_readonly_upstream($primary);
$primary->safe_psql(
	'postgres', q{
INSERT INTO public.upstream (key, revision, config)
	VALUES ('a', 'a1', '{"v": 1}');
CREATE FUNCTION public.pc_debug_wal_record(int, bytea) RETURNS pg_lsn
	AS 'projcache', 'projcache_debug_wal_record' LANGUAGE C STRICT;
});
set_fetch_function($primary, 'public.fetch');

$primary->backup('backup');
my $standby = PostgreSQL::Test::Cluster->new('standby');
$standby->init_from_backup($primary, 'backup', has_streaming => 1);
$standby->append_conf('postgresql.conf',
	"projcache.wal_pending_memory = '8kB'\n");
$standby->start;
$primary->wait_for_catchup($standby, 'replay');
like(wait_for_worker($standby), qr/^\d+$/, 'standby: worker runs');
is($standby->safe_psql('postgres', "SELECT projcache.get('a', '5s')"),
	'{"v": 1}', 'standby: key a is cached');

# The (config, freshness) of a key on the standby.
sub look
{
	my ($key) = @_;
	return $standby->safe_psql('postgres',
		"SELECT config::text || '|' || freshness FROM projcache.lookup('$key')"
	);
}

# On the primary, in one transaction: key a gets {"v": n}, and
# invalidate() of a and of 200 keys of 100 bytes, more than the standby's
# 8 kB list holds.
sub change_a_overflowing
{
	my ($n) = @_;
	$primary->safe_psql(
		'postgres', qq{
BEGIN;
UPDATE public.upstream SET revision = 'a$n', config = '{"v": $n}' WHERE key = 'a';
SELECT projcache.invalidate('a');
SELECT count(projcache.invalidate(repeat('x', 100) || i)) FROM generate_series(1, 200) AS i;
COMMIT;
});
	return;
}

# Wait until get('a') on the standby is {"v": n} and fresh.
sub standby_gets
{
	my ($n) = @_;
	return $standby->poll_query_until('postgres',
		"SELECT projcache.get('a')::text || '|' || freshness = '{\"v\": $n}|fresh' FROM projcache.lookup('a')"
	);
}

my $overflowed =
  qr/invalidations replayed from WAL did not fit in projcache.wal_pending_memory/;
my $over =
  qr/the transactions whose invalidations were dropped have ended\n.*DETAIL:  Cached keys are refetched on their next read/;

# ---------------------------------------------------------------------------
# 1. An older transaction left open on the primary.
# ---------------------------------------------------------------------------
my $blocker = $primary->background_psql('postgres');
$blocker->query_safe('BEGIN; SELECT txid_current();');

# The overflowing transaction's commit is held back on the standby.
$standby->safe_psql('postgres',
	"ALTER SYSTEM SET recovery_min_apply_delay = '1h'");
$standby->reload;
$standby->poll_query_until('postgres',
	"SELECT current_setting('recovery_min_apply_delay') = '1h'");

my $offset = log_offset($standby);
change_a_overflowing(2);
ok($standby->wait_for_log($overflowed, $offset),
	'open transaction: the standby overflowed');
is(look('a'), '{"v": 1}|stale',
	'open transaction: a is stale while the commit is not replayed');
is($standby->safe_psql('postgres', "SELECT projcache.get('a')"),
	'{"v": 1}', 'open transaction: a still serves the old value');
unlike(log_since($standby, $offset), $over,
	'open transaction: the overflow is not over before the commit');

$standby->safe_psql('postgres', 'ALTER SYSTEM RESET recovery_min_apply_delay');
$standby->reload;
ok($standby->wait_for_log($over, $offset),
	'open transaction: over once the overflowing transaction has ended');
ok(standby_gets(2),
	'open transaction: a is refetched on its next read and serves v2');
is( $primary->safe_psql(
		'postgres', q{SELECT count(*) FROM pg_stat_activity
			WHERE backend_xid IS NOT NULL AND state = 'idle in transaction'}),
	'1',
	'open transaction: the older transaction is still open');
$blocker->query_safe('COMMIT');
$blocker->quit;

# ---------------------------------------------------------------------------
# 2. An older prepared transaction left open.
# ---------------------------------------------------------------------------
$primary->safe_psql('postgres',
	"BEGIN; SELECT txid_current(); PREPARE TRANSACTION 'blocker';");
$offset = log_offset($standby);
change_a_overflowing(3);
ok($standby->wait_for_log($overflowed, $offset),
	'prepared transaction: the standby overflowed');
ok($standby->wait_for_log($over, $offset),
	'prepared transaction: over once the overflowing transaction has ended');
ok(standby_gets(3),
	'prepared transaction: a is refetched on its next read and serves v3');
is($primary->safe_psql('postgres', 'SELECT count(*) FROM pg_prepared_xacts'),
	'1', 'prepared transaction: still prepared on the primary');
$primary->safe_psql('postgres', "ROLLBACK PREPARED 'blocker'");

# ---------------------------------------------------------------------------
# 3. Records redo cannot read: counted in the log, and the keys are treated
#    as invalidated by the record's transaction.  The source changes in the
#    same transaction, and nothing else invalidates a.
# ---------------------------------------------------------------------------
# The test-only writer works with projcache.debug_clock on (every test node
# has it) and only for superusers.
$primary->safe_psql('postgres',
	'CREATE ROLE pc_nobody; GRANT EXECUTE ON FUNCTION public.pc_debug_wal_record(int, bytea) TO pc_nobody');
my ($rc, $out, $err) = psql_verbose($primary,
	"SET ROLE pc_nobody; SELECT public.pc_debug_wal_record(0, '\\x00')");
like($err, qr/ERROR:  42501: only superusers may write projcache WAL records/,
	'the test-only record writer is refused to a non-superuser');

my @unreadable = (
	[ 'malformed INVALIDATE', 0,    '\x05000000ffff' ],
	[ 'unknown record type',  0x70, '\x0102' ]);
my $n = 4;
for my $case (@unreadable)
{
	my ($what, $info, $data) = @$case;

	$offset = log_offset($standby);
	$primary->safe_psql(
		'postgres', qq{
BEGIN;
UPDATE public.upstream SET revision = 'a$n', config = '{"v": $n}' WHERE key = 'a';
SELECT public.pc_debug_wal_record($info, '$data');
COMMIT;
});
	ok( $standby->wait_for_log(
			qr/WARNING:  projcache skipped a WAL record it cannot read: $what/,
			$offset),
		"$what: the standby logs a WARNING");
	ok($standby->wait_for_log($over, $offset),
		"$what: the keys waited for the record's transaction");
	ok(standby_gets($n), "$what: a is refetched and serves v$n");
	$n++;
}

done_testing();
