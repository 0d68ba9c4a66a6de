# Copyright (c) 2026, projcache developers
#
# Hostile review of 1.2.1 (issue 28): an owner that lost its rights must
# not get its snapshot's rows served again by making the load fail for
# another reason.  The owner owns the view behind its snapshot, and
# CREATE OR REPLACE RULE "_RETURN" needs only that ownership (not CREATE
# on schema projcache): it can swap the view's query for one that fails
# with no privilege error (division by zero).  The check after a failed
# load then looks at the swapped query, finds the owner's rights intact,
# and counts the failure as the source's, so that the rows loaded before
# the REVOKE are served as last good:
#
# 1. same server lifetime: loaded, REVOKE, the rule swapped, a read;
# 2. restored rows: loaded, dumped, a clean restart, REVOKE, the rule
#    swapped, a read (the restored rows must not be served before a load
#    vouched for the owner's rights over the registered query);
# 3. no rule needed: a query calling an IMMUTABLE function of the owner's
#    that it makes fail is folded while planning, before the executor
#    checks the table's SELECT, and the check after the failure plans it
#    again and fails alike, with no privilege error: restored rows are
#    served as last good.

use strict;
use warnings;

use FindBin;
use lib $FindBin::RealBin;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use ProjcacheTest;
use Test::More;

my $node = projcache_node('hostile121',
	conf => "projcache.dump_interval = '1s'\n");

$node->safe_psql(
	'postgres', q{
CREATE ROLE own;
CREATE ROLE rdr;
GRANT USAGE ON SCHEMA projcache TO own, rdr;
GRANT EXECUTE ON FUNCTION
	projcache.create_snapshot(text, text, interval, text),
	projcache.snapshot(text), projcache.refresh_snapshot(text),
	projcache.grant_snapshot(text, regrole) TO own;
GRANT EXECUTE ON FUNCTION projcache.snapshot(text),
	projcache.refresh_snapshot(text) TO rdr;
});

# A table of two rows only own may read, and snapshot $name over it,
# granted to rdr and loaded.
sub make_snapshot
{
	my ($name) = @_;

	$node->safe_psql(
		'postgres', qq{
CREATE TABLE public.$name (id int, v text);
INSERT INTO public.$name VALUES (1, 'SECRET-$name-1'), (2, 'SECRET-$name-2');
GRANT SELECT ON public.$name TO own;
SET ROLE own;
SELECT projcache.create_snapshot('$name', 'SELECT id, v FROM public.$name', '1h');
SELECT projcache.grant_snapshot('$name', 'rdr');
});
	is(read_snapshot('rdr', $name), "SECRET-$name-1,SECRET-$name-2",
		"$name: loaded");
	return;
}

# What $role reads of snapshot $name: its v values, or "SQLSTATE: message".
sub read_snapshot
{
	my ($role, $name) = @_;
	my ($rc, $out, $err) = $node->psql('postgres',
		"\\set VERBOSITY verbose\nSET ROLE $role;\n"
		  . "SELECT string_agg(v, ',' ORDER BY id) FROM projcache.snapshot('$name') AS t(id int, v text);"
	);
	return $out if $rc == 0;
	return $err =~ /ERROR:  (\w{5}): ([^\n]*)/ ? "$1: $2" : "error: $err";
}

# own, who lost SELECT on the table, swaps its snapshot view's query for
# one that fails without a privilege error.
sub swap_view_query
{
	my ($name) = @_;
	my $view = $node->safe_psql('postgres',
		"SELECT view FROM projcache.snapshot_registry WHERE name = '$name'");

	$node->safe_psql(
		'postgres', qq{
SET ROLE own;
CREATE OR REPLACE RULE "_RETURN" AS ON SELECT TO $view
	DO INSTEAD SELECT (1 / 0)::int AS id, 'x'::text AS v;
});
	return;
}

sub no_rows_for
{
	my ($role, $name, $what) = @_;
	my $got = read_snapshot($role, $name);

	unlike($got, qr/SECRET-/, "$what: $role gets no rows")
	  or diag("got: $got");
	return;
}

# -- 1. Same server lifetime -----------------------------------------------
make_snapshot('hx1');
$node->safe_psql('postgres', 'REVOKE SELECT ON public.hx1 FROM own');
swap_view_query('hx1');
my ($rc, $out, $err) = $node->psql('postgres',
	q{SET ROLE own; SELECT projcache.refresh_snapshot('hx1')});
like($err, qr/snapshot "hx1" is no longer served/,
	'1: the refresh after the REVOKE finds the rights lost');
no_rows_for('rdr', 'hx1', '1: view query swapped after the REVOKE');
no_rows_for('own', 'hx1', '1: view query swapped after the REVOKE');

# -- 2. Restored rows ------------------------------------------------------
make_snapshot('hx2');
my $now = $node->safe_psql('postgres', 'SELECT now()');
ok( $node->poll_query_until(
		'postgres', "SELECT last_dump_at > '$now' FROM projcache.stats"),
	'2: a periodic dump is written');
my $offset = -s $node->logfile;
$node->restart;
$node->wait_for_log(qr/projcache scheduler ready/, $offset);
$node->safe_psql('postgres', 'REVOKE SELECT ON public.hx2 FROM own');
swap_view_query('hx2');
no_rows_for('rdr', 'hx2', '2: restored, view query swapped after the REVOKE');
no_rows_for('rdr', 'hx2', '2: and the next read');
no_rows_for('own', 'hx2', '2: restored, view query swapped after the REVOKE');

# -- 3. A failure while planning ------------------------------------------
$node->safe_psql(
	'postgres', q{
CREATE TABLE public.hx3 (id int, v text);
INSERT INTO public.hx3 VALUES (1, 'SECRET-hx3-1'), (2, 'SECRET-hx3-2');
GRANT SELECT ON public.hx3 TO own;
CREATE SCHEMA o AUTHORIZATION own;
SET ROLE own;
CREATE TABLE o.down (since timestamptz);
CREATE FUNCTION o.up() RETURNS boolean IMMUTABLE LANGUAGE plpgsql AS $$
BEGIN
	IF EXISTS (SELECT FROM o.down) THEN
		RAISE EXCEPTION 'the source is down';
	END IF;
	RETURN true;
END
$$;
SELECT projcache.create_snapshot('hx3',
	'SELECT id, v FROM public.hx3 WHERE o.up()', '1h');
SELECT projcache.grant_snapshot('hx3', 'rdr');
});
is(read_snapshot('rdr', 'hx3'), 'SECRET-hx3-1,SECRET-hx3-2', 'hx3: loaded');
$now = $node->safe_psql('postgres', 'SELECT now()');
ok( $node->poll_query_until(
		'postgres', "SELECT last_dump_at > '$now' FROM projcache.stats"),
	'3: a periodic dump is written');
$offset = -s $node->logfile;
$node->restart;
$node->wait_for_log(qr/projcache scheduler ready/, $offset);
$node->safe_psql('postgres', 'REVOKE SELECT ON public.hx3 FROM own');
$node->safe_psql('postgres',
	'SET ROLE own; INSERT INTO o.down VALUES (now())');
no_rows_for('rdr', 'hx3', '3: restored, planning fails after the REVOKE');
no_rows_for('own', 'hx3', '3: restored, planning fails after the REVOKE');

$node->stop;
done_testing();
