# Copyright (c) 2026, projcache developers
#
# A schema projcache made before the extension, by a role with CREATE on
# the database (mallory), cannot make mallory a superuser when a superuser
# installs or updates projcache.
#
# mallory's objects, in the schema the extension scripts run in (their
# search_path is projcache, pg_temp), each call pwn(): it counts its call
# in a sequence (which a rollback does not undo), and, run by a superuser,
# makes mallory one.  The shapes, each of which captured a name the 1.1
# scripts use:
#   - operator = (oid, regprocedure): "oid = '...'::regprocedure";
#   - operator = (regclass, regclass): "CASE r.classid WHEN ..." and
#     "r.classid = '...'::regclass";
#   - operator >= (oid, integer): "m.role >= 16384";
#   - a table projcache_saved_acls, with a trigger: the 1.1 script's
#     unqualified temporary table, found in projcache before pg_temp;
#   - function nextval(text), which the 1.0 script's registry default
#     nextval('...') binds to;
#   - operators = (text, text) and = (name, name), a type named like the
#     registry's row type, and a default privilege of mallory's.
#
# - (a) CREATE EXTENSION projcache in mallory's schema is refused, 42501
#   with a hint, before anything runs; nothing of mallory's ran.
# - (b) Installed at 1.0, 1.0.1 or 1.1 in mallory's schema (those scripts
#   have no guard), then mallory plants the objects: ALTER EXTENSION
#   projcache UPDATE (to 1.1.1, straight from 1.0 and 1.0.1: no released
#   1.0.1--1.1 script is replayed) is refused, the version stays.
# - (b') The schema is a superuser's but mallory may CREATE in it (a DBA's
#   grant): the update from 1.0, and a fresh install, complete, and none of
#   mallory's objects ran; the registry's id default that the 1.0 script
#   bound to mallory's nextval(text) is pg_catalog.nextval again.  The
#   updates from 1.2, 1.1.1 (the direct projcache--1.1.1--1.3.1.sql) and
#   1.3, each on to 1.4, run none of mallory's objects either, also those named like the
#   functions they add (entries_1_2_1(), entries_1_3_1(), caches_1_3_1(),
#   with a default or variadic argument): the update fails on such a call
#   as ambiguous, or completes.
# - (c) A plain CREATE EXTENSION, one in a schema a superuser made first
#   (as a restored dump does), and an update from 1.0 still work.

use strict;
use warnings;

use FindBin;
use lib $FindBin::RealBin;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use ProjcacheTest;
use Test::More;

my $node = projcache_node('hostile');
$node->safe_psql('postgres', 'CREATE ROLE mallory LOGIN');

is( $node->safe_psql(
		'postgres', q{
SELECT source || ' -> ' || path FROM pg_extension_update_paths('projcache')
 WHERE target = '1.1.1' AND path IS NOT NULL ORDER BY source}),
	"1.0 -> 1.0--1.1.1\n1.0.1 -> 1.0.1--1.1.1\n1.1 -> 1.1--1.1.1",
	'updates to 1.1.1 go straight there: none replays 1.0.1--1.1');
is( $node->safe_psql(
		'postgres', q{
SELECT source || ' -> ' || path FROM pg_extension_update_paths('projcache')
 WHERE target = '1.2' AND path IS NOT NULL ORDER BY source}),
	"1.0 -> 1.0--1.1.1--1.2\n1.0.1 -> 1.0.1--1.1.1--1.2\n1.1 -> 1.1--1.1.1--1.2\n1.1.1 -> 1.1.1--1.2",
	'updates to 1.2 go through 1.1.1 the same way');
is( $node->safe_psql(
		'postgres', q{
SELECT source || ' -> ' || path FROM pg_extension_update_paths('projcache')
 WHERE target = '1.2.1' AND path IS NOT NULL ORDER BY source}),
	"1.0 -> 1.0--1.1.1--1.2--1.2.1\n1.0.1 -> 1.0.1--1.1.1--1.2--1.2.1\n1.1 -> 1.1--1.1.1--1.2--1.2.1\n1.1.1 -> 1.1.1--1.2--1.2.1\n1.2 -> 1.2--1.2.1",
	'updates to 1.2.1 go through 1.2');
is( $node->safe_psql(
		'postgres', q{
SELECT source || ' -> ' || path FROM pg_extension_update_paths('projcache')
 WHERE target = '1.3' AND path IS NOT NULL ORDER BY source}),
	"1.0 -> 1.0--1.1.1--1.2--1.2.1--1.3\n1.0.1 -> 1.0.1--1.1.1--1.2--1.2.1--1.3\n1.1 -> 1.1--1.1.1--1.2--1.2.1--1.3\n1.1.1 -> 1.1.1--1.2--1.2.1--1.3\n1.2 -> 1.2--1.2.1--1.3\n1.2.1 -> 1.2.1--1.3",
	'updates to 1.3 go through 1.2.1');
is( $node->safe_psql(
		'postgres', q{
SELECT source || ' -> ' || path FROM pg_extension_update_paths('projcache')
 WHERE target = '1.3.1' AND path IS NOT NULL ORDER BY source}),
	"1.0 -> 1.0--1.1.1--1.3.1\n1.0.1 -> 1.0.1--1.1.1--1.3.1\n1.1 -> 1.1--1.1.1--1.3.1\n1.1.1 -> 1.1.1--1.3.1\n1.2 -> 1.2--1.2.1--1.3--1.3.1\n1.2.1 -> 1.2.1--1.3--1.3.1\n1.3 -> 1.3--1.3.1",
	'updates to 1.3.1 from 1.1.1 and before take the direct 1.1.1--1.3.1, which drops nothing; from 1.2 on, through 1.3');
is( $node->safe_psql(
		'postgres', q{
SELECT source || ' -> ' || path FROM pg_extension_update_paths('projcache')
 WHERE target = '1.4' AND path IS NOT NULL ORDER BY source}),
	"1.0 -> 1.0--1.1.1--1.3.1--1.4\n1.0.1 -> 1.0.1--1.1.1--1.3.1--1.4\n1.1 -> 1.1--1.1.1--1.3.1--1.4\n1.1.1 -> 1.1.1--1.3.1--1.4\n1.2 -> 1.2--1.2.1--1.3--1.3.1--1.4\n1.2.1 -> 1.2.1--1.3--1.3.1--1.4\n1.3 -> 1.3--1.3.1--1.4\n1.3.1 -> 1.3.1--1.4",
	'updates to 1.4 go through 1.3.1');

# A database where mallory may create schemas, and the sequence pwn()
# counts its calls in.
sub new_db
{
	my ($db) = @_;
	$node->safe_psql('postgres', "CREATE DATABASE $db");
	$node->safe_psql('postgres', "GRANT CREATE ON DATABASE $db TO mallory");
	$node->safe_psql($db, 'GRANT CREATE ON SCHEMA public TO mallory');
	$node->safe_psql($db,
		'SET ROLE mallory; CREATE SEQUENCE public.hostile_calls');
	return;
}

sub as_mallory
{
	my ($db, $sql) = @_;
	$node->safe_psql($db, "SET ROLE mallory;\n$sql");
	return;
}

# pwn() and the operator that captured the 1.1 script's first
# "oid = '...'::regprocedure".
my $pwn = q{
CREATE FUNCTION projcache.pwn() RETURNS bool LANGUAGE plpgsql AS $$
BEGIN
	PERFORM pg_catalog.nextval('public.hostile_calls'::pg_catalog.regclass);
	RAISE WARNING 'hostile code ran as %', current_user;
	IF (SELECT rolsuper FROM pg_catalog.pg_roles
		 WHERE rolname OPERATOR(pg_catalog.=) current_user) THEN
		EXECUTE 'ALTER ROLE mallory SUPERUSER';
	END IF;
	RETURN true;
END
$$;
GRANT USAGE ON SEQUENCE public.hostile_calls TO PUBLIC;
};
my $oid_regprocedure = q{
CREATE FUNCTION projcache.eq(oid, regprocedure) RETURNS bool
	LANGUAGE sql AS 'SELECT projcache.pwn() AND $1 OPERATOR(pg_catalog.=) $2::pg_catalog.oid';
CREATE OPERATOR projcache.= (LEFTARG = oid, RIGHTARG = regprocedure,
	FUNCTION = projcache.eq);
};
# The other shapes.
my $others = q{
CREATE FUNCTION projcache.eq(regclass, regclass) RETURNS bool
	LANGUAGE sql AS 'SELECT projcache.pwn() AND $1::pg_catalog.oid OPERATOR(pg_catalog.=) $2::pg_catalog.oid';
CREATE OPERATOR projcache.= (LEFTARG = regclass, RIGHTARG = regclass,
	FUNCTION = projcache.eq);
CREATE FUNCTION projcache.ge(oid, integer) RETURNS bool
	LANGUAGE sql AS 'SELECT projcache.pwn() AND $1 OPERATOR(pg_catalog.>=) $2::pg_catalog.oid';
CREATE OPERATOR projcache.>= (LEFTARG = oid, RIGHTARG = integer,
	FUNCTION = projcache.ge);
CREATE FUNCTION projcache.eq(text, text) RETURNS bool
	LANGUAGE sql AS 'SELECT projcache.pwn() AND $1 OPERATOR(pg_catalog.=) $2';
CREATE OPERATOR projcache.= (LEFTARG = text, RIGHTARG = text,
	FUNCTION = projcache.eq);
CREATE FUNCTION projcache.eq(name, name) RETURNS bool
	LANGUAGE sql AS 'SELECT projcache.pwn() AND $1 OPERATOR(pg_catalog.=) $2';
CREATE OPERATOR projcache.= (LEFTARG = name, RIGHTARG = name,
	FUNCTION = projcache.eq);
CREATE TABLE projcache.projcache_saved_acls (kind text, target text, acl aclitem[]);
GRANT ALL ON projcache.projcache_saved_acls TO PUBLIC;
CREATE FUNCTION projcache.saved() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
	PERFORM projcache.pwn();
	RETURN NEW;
END
$$;
CREATE TRIGGER saved BEFORE INSERT ON projcache.projcache_saved_acls
	FOR EACH ROW EXECUTE FUNCTION projcache.saved();
ALTER DEFAULT PRIVILEGES IN SCHEMA projcache GRANT ALL ON FUNCTIONS TO PUBLIC;
};
my $nextval = q{
CREATE FUNCTION projcache.nextval(text) RETURNS bigint
	LANGUAGE sql AS 'SELECT pg_catalog.nextval($1::pg_catalog.regclass) WHERE projcache.pwn()';
};
# Named like the registry's row type: only where no registry exists yet.
my $registry_type = q{
CREATE TYPE projcache.snapshot_registry AS (name text);
};

# Did mallory become a superuser, or did any of its code run at all?
sub assert_nothing_ran
{
	my ($db, $what) = @_;
	is($node->safe_psql('postgres',
			"SELECT rolsuper FROM pg_roles WHERE rolname = 'mallory'"),
		'f', "$what: mallory is not a superuser");
	is($node->safe_psql($db, 'SELECT is_called FROM public.hostile_calls'),
		'f', "$what: none of mallory's code ran");
	# The next case starts from a non-superuser again.
	$node->safe_psql('postgres', 'ALTER ROLE mallory NOSUPERUSER');
	return;
}

sub extversion
{
	my ($db) = @_;
	return $node->safe_psql($db,
		"SELECT extversion FROM pg_extension WHERE extname = 'projcache'");
}

# A refusal by the schema guard: SQLSTATE, message, who owns it, the hint.
sub like_refusal
{
	my ($err, $what) = @_;
	like($err,
		qr/ERROR:  42501: schema "projcache" is not owned by a superuser\nDETAIL:  Its owner, role "mallory", could have planted objects in it.*\nHINT:  Find out what the schema holds/,
		"$what: refused (42501), naming the schema's owner, with a hint");
	unlike($err, qr/hostile code ran/, "$what: before any of mallory's code");
	return;
}

# ---------------------------------------------------------------------------
# (a) CREATE EXTENSION in mallory's schema.
# ---------------------------------------------------------------------------
my %shapes = (
	'operator =(oid, regprocedure)' => $oid_regprocedure,
	'other operators, nextval(text), a table named like ours' =>
	  $others . $nextval,
	'a type named like the registry' => $registry_type);
my $n = 0;
for my $shape (sort keys %shapes)
{
	my $db = 'install_' . ++$n;
	new_db($db);
	as_mallory($db, "CREATE SCHEMA projcache;\n$pwn$shapes{$shape}");
	my ($rc, $out, $err) = $node->psql($db,
		"\\set VERBOSITY verbose\nCREATE EXTENSION projcache");
	isnt($rc, 0, "(a) $shape: CREATE EXTENSION fails");
	like_refusal($err, "(a) $shape");
	is(extversion($db), '', "(a) $shape: projcache is not installed");
	assert_nothing_ran($db, "(a) $shape");
}

# ---------------------------------------------------------------------------
# (b) Installed by an older version into mallory's schema, then updated.
# ---------------------------------------------------------------------------
for my $from ('1.0', '1.0.1', '1.1')
{
	(my $db = "update_from_$from") =~ s/\./_/g;
	new_db($db);
	as_mallory($db, 'CREATE SCHEMA projcache');
	$node->safe_psql($db, "CREATE EXTENSION projcache VERSION '$from'");
	as_mallory($db, $pwn . $oid_regprocedure . $others . $nextval);
	my ($rc, $out, $err) = $node->psql($db,
		"\\set VERBOSITY verbose\nALTER EXTENSION projcache UPDATE");
	isnt($rc, 0, "(b) from $from: ALTER EXTENSION projcache UPDATE fails");
	like_refusal($err, "(b) from $from");
	is(extversion($db), $from, "(b) from $from: projcache stays at $from");
	assert_nothing_ran($db, "(b) from $from");
}

# 1.1.1 refuses such a schema itself; one given to mallory after it was
# installed is refused by the update to 1.3.1 (projcache--1.1.1--1.3.1.sql).
new_db('update_from_1_1_1');
$node->safe_psql('update_from_1_1_1',
	"CREATE EXTENSION projcache VERSION '1.1.1'; ALTER SCHEMA projcache OWNER TO mallory");
as_mallory('update_from_1_1_1', $pwn . $oid_regprocedure . $others . $nextval);
{
	my ($rc, $out, $err) = $node->psql('update_from_1_1_1',
		"\\set VERBOSITY verbose\nALTER EXTENSION projcache UPDATE");
	isnt($rc, 0, "(b) from 1.1.1: ALTER EXTENSION projcache UPDATE fails");
	like_refusal($err, "(b) from 1.1.1");
	is(extversion('update_from_1_1_1'), '1.1.1',
		"(b) from 1.1.1: projcache stays at 1.1.1");
	assert_nothing_ran('update_from_1_1_1', "(b) from 1.1.1");
}

# ---------------------------------------------------------------------------
# (b') A superuser's schema in which mallory may create objects.
# ---------------------------------------------------------------------------
# The registry's id default, and how many functions of its it depends on
# (none for pg_catalog's, which are pinned).
my $registry_default = q{
SELECT pg_get_expr(d.adbin, d.adrelid),
       (SELECT count(*) FROM pg_depend dep
         WHERE dep.classid = 'pg_attrdef'::regclass AND dep.objid = d.oid
           AND dep.refclassid = 'pg_proc'::regclass)
  FROM pg_attrdef d
  JOIN pg_attribute a ON a.attrelid = d.adrelid AND a.attnum = d.adnum
 WHERE d.adrelid = 'projcache.snapshot_registry'::regclass AND a.attname = 'id'};

new_db('shared_update');
$node->safe_psql('shared_update',
	'CREATE SCHEMA projcache; GRANT USAGE, CREATE ON SCHEMA projcache TO mallory');
as_mallory('shared_update', $pwn . $nextval);
$node->safe_psql('shared_update', "CREATE EXTENSION projcache VERSION '1.0'");
is($node->safe_psql('shared_update', $registry_default),
	"projcache.nextval('projcache.snapshot_registry_id_seq'::text)|1",
	"(b') the 1.0 script bound the registry's id default to mallory's nextval(text)");
as_mallory('shared_update', $oid_regprocedure . $others);
my ($rc, $out, $err) =
  $node->psql('shared_update', 'ALTER EXTENSION projcache UPDATE');
is($rc, 0, "(b') the update from 1.0 in a superuser's schema completes");
unlike($err, qr/hostile code ran/, "(b') without running mallory's code");
is(extversion('shared_update'), '1.4',
	"(b') projcache is at 1.4, the default version");
is($node->safe_psql('shared_update', $registry_default),
	"nextval('projcache.snapshot_registry_id_seq'::regclass)|0",
	"(b') the registry's id default is pg_catalog.nextval(regclass) again");
assert_nothing_ran('shared_update', "(b') update from 1.0");

new_db('shared_install');
$node->safe_psql('shared_install',
	'CREATE SCHEMA projcache; GRANT USAGE, CREATE ON SCHEMA projcache TO mallory');
as_mallory('shared_install', $pwn . $oid_regprocedure . $others . $nextval);
($rc, $out, $err) = $node->psql('shared_install', 'CREATE EXTENSION projcache');
is($rc, 0, "(b') CREATE EXTENSION in a superuser's schema completes");
unlike($err, qr/hostile code ran/, "(b') without running mallory's code");
is($node->safe_psql('shared_install', $registry_default),
	"nextval('projcache.snapshot_registry_id_seq'::regclass)|0",
	"(b') the registry's id default is pg_catalog.nextval(regclass)");
is( $node->safe_psql(
		'shared_install', q{
SELECT count(*) FROM pg_proc
 WHERE pronamespace = 'projcache'::regnamespace AND proowner <> 'mallory'::regrole
   AND proacl IS NOT NULL AND aclcontains(proacl, makeaclitem(0, proowner, 'EXECUTE', false))}),
	'0',
	"(b') mallory's default privilege gave PUBLIC none of the extension's functions");
assert_nothing_ran('shared_install', "(b') install");

# The updates in such a schema: from 1.2 (through 1.2.1 and 1.3), from
# 1.1.1 (projcache--1.1.1--1.3.1.sql) and from 1.3.  mallory plants, besides
# the shapes above, a table named like their temporary table, a better
# aclexplode(), or functions of the new versioned names with a default or
# variadic argument (which would make the views' calls ambiguous, or
# capture them): those of 1.2.1, and those of 1.3.1 (entries_1_3_1(),
# caches_1_3_1()).
my $shapes_copied = $pwn . $oid_regprocedure . $others . $nextval . q{
CREATE TABLE projcache.projcache_copied_acls (objid oid, acl aclitem[], proowner oid);
GRANT ALL ON projcache.projcache_copied_acls TO PUBLIC;
CREATE TRIGGER copied BEFORE INSERT ON projcache.projcache_copied_acls
	FOR EACH ROW EXECUTE FUNCTION projcache.saved();
CREATE FUNCTION projcache.aclexplode(aclitem[],
	OUT grantor oid, OUT grantee oid, OUT privilege_type text, OUT is_grantable boolean)
	RETURNS SETOF record LANGUAGE sql
	AS 'SELECT 0::oid, 0::oid, ''x''::text, projcache.pwn()';
};
my $names_1_2_1 = $pwn . q{
CREATE FUNCTION projcache.entries_1_2_1(n integer DEFAULT 0) RETURNS TABLE(key text)
	LANGUAGE sql AS 'SELECT ''x''::text WHERE projcache.pwn()';
CREATE FUNCTION projcache.stats_1_2_1(VARIADIC n integer[] DEFAULT '{}') RETURNS TABLE(hits bigint)
	LANGUAGE sql AS 'SELECT 0::bigint WHERE projcache.pwn()';
};
my $entries_1_3_1 = q{
CREATE FUNCTION projcache.entries_1_3_1(n integer DEFAULT 0) RETURNS TABLE(key text)
	LANGUAGE sql AS 'SELECT ''x''::text WHERE projcache.pwn()';
};
my $caches_1_3_1 = q{
CREATE FUNCTION projcache.caches_1_3_1(VARIADIC n integer[] DEFAULT '{}') RETURNS TABLE(name text)
	LANGUAGE sql AS 'SELECT ''x''::text WHERE projcache.pwn()';
};
# Each case: the version updated from, what mallory plants, and the call
# the update fails on as ambiguous (undef: the update completes).
my @shared_updates = (
	[ 'shapes', '1.2', $shapes_copied, undef ],
	[ 'versioned names', '1.2', $names_1_2_1, 'entries_1_2_1' ],
	[ 'shapes', '1.1.1', $shapes_copied, undef ],
	[ '1.3.1 names', '1.1.1', $pwn . $entries_1_3_1 . $caches_1_3_1,
		'entries_1_3_1' ],
	[ '1.3.1 caches name', '1.1.1', $pwn . $caches_1_3_1, 'caches_1_3_1' ],
	[ 'shapes', '1.3', $shapes_copied, undef ],
	[ '1.3.1 names', '1.3', $pwn . $entries_1_3_1 . $caches_1_3_1,
		'entries_1_3_1' ],
	[ '1.3.1 caches name', '1.3', $pwn . $caches_1_3_1, 'caches_1_3_1' ]);
$n = 0;
for my $c (@shared_updates)
{
	my ($case, $from, $plant, $ambiguous) = @$c;
	my $db = 'shared_update_' . ++$n;
	my $what = "(b') $case, update from $from";
	new_db($db);
	$node->safe_psql($db,
		'CREATE SCHEMA projcache; GRANT USAGE, CREATE ON SCHEMA projcache TO mallory');
	$node->safe_psql($db, "CREATE EXTENSION projcache VERSION '$from'");
	as_mallory($db, $plant);
	($rc, $out, $err) = $node->psql($db, 'ALTER EXTENSION projcache UPDATE');
	unlike($err, qr/hostile code ran/, "$what: mallory's code does not run");
	if (!defined $ambiguous)
	{
		is($rc, 0, "$what: the update completes") or diag($err);
		is(extversion($db), '1.4', "$what: projcache is at 1.4");
	}
	else
	{
		# The views' calls are ambiguous: the update fails, and that is all
		# that a role with CREATE on the extension's schema gets.
		isnt($rc, 0, "$what: the update fails");
		like($err, qr/function projcache\.\Q$ambiguous\E\(\) is not unique/,
			"$what: on the ambiguous call");
		is(extversion($db), $from, "$what: projcache stays at $from");
	}
	is( $node->safe_psql(
			$db, q{
SELECT count(*) FROM pg_rewrite r
  JOIN pg_depend d ON d.classid = 'pg_rewrite'::regclass AND d.objid = r.oid
  JOIN pg_proc p ON d.refclassid = 'pg_proc'::regclass AND p.oid = d.refobjid
 WHERE r.ev_class IN (SELECT c.oid FROM pg_class c
                       WHERE c.relnamespace = 'projcache'::regnamespace
                         AND c.relname IN ('entries', 'stats', 'snapshots', 'caches'))
   AND p.proowner = 'mallory'::regrole}),
		'0', "$what: no view of the extension reads a function of mallory's");
	is($node->safe_psql($db, 'SELECT count(*) >= 0 FROM projcache.entries'),
		't', "$what: the entries view reads");
	assert_nothing_ran($db, $what);
}

# ---------------------------------------------------------------------------
# (c) The usual ways still work.
# ---------------------------------------------------------------------------
$node->safe_psql('postgres', 'CREATE DATABASE plain');
$node->safe_psql('plain', 'CREATE EXTENSION projcache');
is( $node->safe_psql(
		'plain', q{
SELECT e.extversion, n.nspowner::regrole = current_user::regrole
  FROM pg_extension e JOIN pg_namespace n ON n.oid = e.extnamespace
 WHERE e.extname = 'projcache'}),
	'1.4|t',
	'(c) CREATE EXTENSION makes schema projcache, the superuser\'s, and installs 1.4');

$node->safe_psql('postgres', 'CREATE DATABASE restored');
$node->safe_psql('restored',
	'CREATE SCHEMA projcache; CREATE EXTENSION projcache WITH SCHEMA projcache');
is(extversion('restored'), '1.4',
	'(c) a schema a superuser made first (as a restored dump does) passes the check');

$node->safe_psql('postgres', 'CREATE DATABASE old');
$node->safe_psql('old', "CREATE EXTENSION projcache VERSION '1.0'");
$node->safe_psql('old', 'ALTER EXTENSION projcache UPDATE');
is(extversion('old'), '1.4', '(c) the update from 1.0 in its own schema works');

$node->stop;
done_testing();
