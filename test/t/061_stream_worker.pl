# Copyright (c) 2026, projcache developers
#
# The change streams' workers (1.4), against a second cluster as the
# source (wal_level = logical, a publication, nothing of projcache):
#
# a. Each stream gets a worker of its own, "projcache stream NAME" in
#    pg_stat_activity; table-driven over the streams: a superuser's over
#    trust, a non-superuser's whose role gives its password
#    (scram-sha-256) streams with the source's system id; a
#    non-superuser's whose role the source trusts is stopped, "password
#    is required" (the postgres_fdw rule), and not retried.
# b. The worker answers the source's keepalives (wal_sender_timeout 2s on
#    the source): replies come, and it is never timed out; the source's
#    transactions and changes are counted.
# c. The source stopped: reconnecting, reconnects grows, last_error set;
#    started again: streaming again.  Its walsender stalled: connected
#    again after wal_receiver_timeout.
# d. pg_terminate_backend of a worker: another one takes its place.
# e. Another role sees no run-time state of streams it does not own: a
#    role that is not a member sees no row, a member of the owner the
#    rows without their connection strings and run-time state.
# f. No more workers than projcache.max_streams; drop_stream ends the
#    stream's worker; alter_stream starts a stopped one again.
# g. A standby of the cache runs no worker: every stream is "standby".

use strict;
use warnings;

use FindBin;
use lib $FindBin::RealBin;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use ProjcacheTest;
use Test::More;

# ---------------------------------------------------------------------------
# The source: logical WAL, a publication, two replication roles.
# ---------------------------------------------------------------------------
my $source = PostgreSQL::Test::Cluster->new('source');
$source->init(allows_streaming => 'logical');
$source->append_conf('postgresql.conf', "wal_sender_timeout = '2s'\n");
$source->start;
$source->safe_psql(
	'postgres', q{
CREATE TABLE public.orders (id int PRIMARY KEY, note text);
CREATE PUBLICATION "Orders Pub" FOR TABLE public.orders;
CREATE ROLE repl_pw LOGIN REPLICATION PASSWORD 'pw secret';
CREATE ROLE repl_trusted LOGIN REPLICATION PASSWORD 'unused';
GRANT SELECT ON public.orders TO repl_pw, repl_trusted;
});
my $hba = $source->data_dir . '/pg_hba.conf';
my $hba_rest = slurp_file($hba);
open my $fh, '>', $hba or die "could not write $hba: $!";
print $fh "local all repl_pw scram-sha-256\n$hba_rest";
close $fh;
$source->reload;
my $sysid = $source->safe_psql('postgres',
	'SELECT system_identifier FROM pg_control_system()');

# ---------------------------------------------------------------------------
# The cache: projcache, two roles that may register streams.
# ---------------------------------------------------------------------------
my $cache = projcache_node(
	'cache',
	init => { allows_streaming => 1 },
	conf => "projcache.max_streams = 4\nprojcache.max_retry_backoff = '500ms'\n"
	  . "wal_receiver_timeout = '3s'\n");
$cache->safe_psql(
	'postgres', q{
CREATE ROLE owner_a LOGIN;
CREATE ROLE owner_b LOGIN;
GRANT USAGE ON SCHEMA projcache TO owner_a, owner_b;
GRANT EXECUTE ON FUNCTION projcache.create_stream(text, text, text, text),
	projcache.alter_stream(text, text, text), projcache.drop_stream(text),
	projcache.streams_1_4() TO owner_a, owner_b;
GRANT SELECT ON projcache.streams TO owner_a, owner_b;
});

my $src = 'host=' . $source->host . ' port=' . $source->port . ' dbname=postgres';

# Run SQL on the cache as a role.
sub as_role
{
	my ($role, $sql) = @_;
	return $cache->safe_psql('postgres', "SET ROLE $role; $sql");
}

# a. name, owner, conninfo, the state it reaches, its last_error.
my @streams = (
	[ 'su_trust', 'postgres', "$src user=repl_trusted", 'streaming', undef ],
	[ 'a_pw', 'owner_a', "$src user=repl_pw password='pw secret'",
		'streaming', undef ],
	[ 'a_trusted', 'owner_a', "$src user=repl_trusted password=unused",
		'stopped', qr/password is required/ ],);

for my $s (@streams)
{
	my ($name, $owner, $conninfo) = @$s;
	as_role($owner,
		"SELECT projcache.create_stream('$name', \$\$$conninfo\$\$, '\"Orders Pub\"')"
	);
}
for my $s (@streams)
{
	my ($name, $owner, $conninfo, $state, $error) = @$s;
	ok( $cache->poll_query_until(
			'postgres',
			"SELECT state FROM projcache.streams WHERE name = '$name'", $state),
		"a: $name is $state");
	if ($state eq 'streaming')
	{
		ok( $cache->poll_query_until(
				'postgres',
				"SELECT count(*) = 1 FROM pg_stat_activity WHERE backend_type = 'projcache stream' AND application_name = 'projcache stream $name'"
			),
			"a: $name has its worker, named after it");
		is( $cache->safe_psql(
				'postgres',
				"SELECT source_system_id, source_timeline, received_lsn IS NOT NULL, last_error FROM projcache.streams WHERE name = '$name'"
			),
			"$sysid|1|t|",
			"a: $name knows the source's system id and timeline");
	}
	else
	{
		like(
			$cache->safe_psql(
				'postgres',
				"SELECT last_error FROM projcache.streams WHERE name = '$name'"),
			$error,
			"a: $name says why");
		unlike(
			$cache->safe_psql(
				'postgres',
				"SELECT last_error FROM projcache.streams WHERE name = '$name'"),
			qr/unused|pw secret/,
			"a: $name's last_error has no password");
	}
}
# Held: not retried, no worker for it.
my $reconnects_held = $cache->safe_psql('postgres',
	"SELECT reconnects FROM projcache.streams WHERE name = 'a_trusted'");
is($reconnects_held, '0', 'a: a stream stopped for its password is not retried');
ok( $cache->poll_query_until(
		'postgres',
		"SELECT count(*) = 0 FROM pg_stat_activity WHERE application_name = 'projcache stream a_trusted'"
	),
	'a: and has no worker');

# ---------------------------------------------------------------------------
# b. Keepalives answered, changes counted.
# ---------------------------------------------------------------------------
my $t0 = $source->safe_psql('postgres', 'SELECT now()');
ok( $source->poll_query_until(
		'postgres',
		"SELECT count(*) = 2 FROM pg_stat_replication WHERE reply_time > '$t0'::timestamptz + interval '5 s'"
	),
	'b: both workers answer the source for 5 s');
is( $cache->safe_psql(
		'postgres',
		"SELECT string_agg(name || ':' || reconnects, ',' ORDER BY name) FROM projcache.streams WHERE state = 'streaming'"
	),
	'a_pw:0,su_trust:0',
	'b: within wal_sender_timeout: the source never ended them');
$source->safe_psql('postgres',
	"INSERT INTO public.orders VALUES (1, 'x'), (2, 'y'); UPDATE public.orders SET note = 'z' WHERE id = 1"
);
ok( $cache->poll_query_until(
		'postgres',
		"SELECT bool_and(transactions >= 2 AND changes >= 3 AND confirmed_lsn IS NOT NULL) FROM projcache.streams WHERE state = 'streaming'"
	),
	'b: the source\'s transactions and changes are counted');

# ---------------------------------------------------------------------------
# c. The source down, and back.
# ---------------------------------------------------------------------------
$source->stop('fast');
ok( $cache->poll_query_until(
		'postgres',
		"SELECT bool_and(state = 'reconnecting' AND reconnects >= 2 AND last_error IS NOT NULL AND last_error_at IS NOT NULL) FROM projcache.streams WHERE name IN ('su_trust', 'a_pw')"
	),
	'c: the source stopped: reconnecting, reconnects grows, last_error set');
unlike(
	$cache->safe_psql(
		'postgres', "SELECT string_agg(last_error, ' ') FROM projcache.streams"),
	qr/pw secret/,
	'c: no password in last_error');
$source->start;
ok( $cache->poll_query_until(
		'postgres',
		"SELECT bool_and(state = 'streaming') FROM projcache.streams WHERE name IN ('su_trust', 'a_pw')"
	),
	'c: the source started again: streaming again');

# The source's side stalls (its walsender stopped): after
# wal_receiver_timeout without a message, the worker connects again.
my $walsender = $source->safe_psql('postgres',
	"SELECT pid FROM pg_stat_replication WHERE application_name = 'projcache stream a_pw'"
);
kill 'STOP', $walsender;
ok( $cache->poll_query_until(
		'postgres',
		"SELECT state = 'streaming' AND last_error LIKE 'the source sent nothing for wal_receiver_timeout%' FROM projcache.streams WHERE name = 'a_pw'"
	),
	'c: a source that sends nothing is left after wal_receiver_timeout, and connected again'
);
kill 'CONT', $walsender;

# ---------------------------------------------------------------------------
# d. A worker terminated comes back.
# ---------------------------------------------------------------------------
my $pid = $cache->safe_psql('postgres',
	"SELECT pid FROM pg_stat_activity WHERE application_name = 'projcache stream a_pw'"
);
$cache->safe_psql('postgres', "SELECT pg_terminate_backend($pid)");
ok( $cache->poll_query_until(
		'postgres',
		"SELECT EXISTS (SELECT FROM pg_stat_activity WHERE application_name = 'projcache stream a_pw' AND pid <> $pid) AND (SELECT state = 'streaming' FROM projcache.streams WHERE name = 'a_pw')"
	),
	'd: pg_terminate_backend: another worker streams');

# ---------------------------------------------------------------------------
# e. Another role sees nothing of them.
# ---------------------------------------------------------------------------
is(as_role('owner_b', 'SELECT count(*) FROM projcache.streams'),
	'0', 'e: another role sees no stream of owner_a\'s');
is( as_role(
		'owner_a',
		"SELECT string_agg(name || ':' || state, ',' ORDER BY name) FROM projcache.streams"
	),
	'a_pw:streaming,a_trusted:stopped',
	'e: the owner sees its own, with their state');
$cache->safe_psql('postgres', 'CREATE ROLE member_a LOGIN IN ROLE owner_a');
is( as_role(
		'member_a',
		"SELECT string_agg(concat_ws(':', name, conninfo, state, source_system_id, reconnects, last_error), ',' ORDER BY name) FROM projcache.streams"
	),
	'a_pw,a_trusted',
	'e: a member of the owner sees the streams, not their connection strings nor their run-time state'
);

# ---------------------------------------------------------------------------
# f. At most max_streams workers; drop_stream ends its worker.
# ---------------------------------------------------------------------------
$cache->safe_psql('postgres',
	"SELECT projcache.create_stream('su_fourth', \$\$$src user=repl_trusted\$\$, '\"Orders Pub\"')"
);
ok( $cache->poll_query_until(
		'postgres',
		"SELECT state FROM projcache.streams WHERE name = 'su_fourth'", 'streaming'),
	'f: a fourth stream streams');
my ($rc, $out, $err) = $cache->psql('postgres',
	"SELECT projcache.create_stream('su_fifth', 'host=x', 'p')");
like($err, qr/cannot register more than 4 streams/, 'f: not a fifth');
is( $cache->safe_psql(
		'postgres',
		"SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'projcache stream'"
	),
	'3',
	'f: three workers for four streams, one stopped: never more than max_streams');
$cache->safe_psql('postgres', "SELECT projcache.drop_stream('su_fourth')");
ok( $cache->poll_query_until(
		'postgres',
		"SELECT count(*) = 0 FROM pg_stat_activity WHERE application_name = 'projcache stream su_fourth'"
	),
	'f: drop_stream ends its worker');
ok( $source->poll_query_until(
		'postgres',
		"SELECT count(*) = 2 FROM pg_replication_slots WHERE temporary"),
	'f: its temporary slot on the source goes with it');

# An alter_stream starts a stopped stream again.
as_role('owner_a',
	"SELECT projcache.alter_stream('a_trusted', \$\$$src user=repl_pw password='pw secret'\$\$)"
);
ok( $cache->poll_query_until(
		'postgres',
		"SELECT state FROM projcache.streams WHERE name = 'a_trusted'", 'streaming'),
	'alter_stream: the stopped stream, given a password the source asks for, streams');

# ---------------------------------------------------------------------------
# g. A standby of the cache: no worker, every stream "standby".
# ---------------------------------------------------------------------------
$cache->backup('cache_backup');
my $standby = PostgreSQL::Test::Cluster->new('cache_standby');
$standby->init_from_backup($cache, 'cache_backup', has_streaming => 1);
$standby->start;
$cache->wait_for_catchup($standby);
ok( $standby->poll_query_until(
		'postgres',
		"SELECT count(*) = 3 AND bool_and(state = 'standby' AND reconnects = 0 AND source_system_id IS NULL) FROM projcache.streams"
	),
	'g: on a standby, every stream is "standby"');
is( $standby->safe_psql(
		'postgres',
		"SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'projcache stream'"
	),
	'0',
	'g: and no stream has a worker there');

log_shows_no_crash($cache);
log_shows_no_crash($standby);
done_testing();
