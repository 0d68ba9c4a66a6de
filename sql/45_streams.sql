-- Change streams (1.4), the registry: create_stream, alter_stream,
-- stream_table, stream_snapshot, unstream_table, drop_stream, what each
-- checks and who may call it, projcache.streams and
-- projcache.stream_mappings as each role sees them, and what a hostile
-- role that is not a superuser tries.  No stream runs yet.
SET client_min_messages = warning;
CREATE EXTENSION IF NOT EXISTS projcache;
ALTER EXTENSION projcache UPDATE;
CREATE SCHEMA st;
GRANT USAGE ON SCHEMA st TO PUBLIC;

-- The SQLSTATE, message and detail of a statement's error, or 'ok'.
CREATE FUNCTION st.try(sql text) RETURNS text LANGUAGE plpgsql AS $$
DECLARE
    detail text;
BEGIN
    EXECUTE sql;
    RETURN 'ok';
EXCEPTION WHEN OTHERS THEN
    GET STACKED DIAGNOSTICS detail = PG_EXCEPTION_DETAIL;
    RETURN SQLSTATE || ': ' || SQLERRM || coalesce(nullif(' (' || detail || ')', ' ()'), '');
END $$;

CREATE FUNCTION st.fetch(keys text[], revisions text[])
RETURNS TABLE(key text, state text, revision text, config jsonb)
LANGUAGE sql STABLE AS $$
    SELECT k, 'enabled', 'r1', jsonb_build_object('k', k) FROM unnest(keys) k
$$;

CREATE ROLE st_owner;
CREATE ROLE st_other;
CREATE ROLE st_member;
GRANT st_owner TO st_member;
GRANT USAGE ON SCHEMA projcache TO st_owner, st_other, st_member;
GRANT EXECUTE ON FUNCTION
    projcache.create_stream(text, text, text, text),
    projcache.alter_stream(text, text, text),
    projcache.stream_table(text, text, text, text, text),
    projcache.stream_snapshot(text, text, text),
    projcache.unstream_table(text, text, text, text),
    projcache.drop_stream(text),
    projcache.streams_1_4(), projcache.stream_mappings_1_4(),
    projcache.create_cache(text, regprocedure, interval, interval, interval, interval, integer, interval, bigint, regrole),
    projcache.drop_cache(text),
    projcache.create_snapshot(text, text, interval, text),
    projcache.drop_snapshot(text)
    TO st_owner, st_other, st_member;
GRANT SELECT ON projcache.streams, projcache.stream_mappings
    TO st_owner, st_other, st_member;

-- create_stream is not PUBLIC's, nor any other stream function or view.
SELECT p.proname, has_function_privilege('public', p.oid, 'EXECUTE') AS public_may
  FROM pg_proc p
 WHERE p.pronamespace = 'projcache'::regnamespace
   AND p.proname IN ('create_stream', 'alter_stream', 'stream_table',
                     'stream_snapshot', 'unstream_table', 'drop_stream',
                     'streams_1_4', 'stream_mappings_1_4')
 ORDER BY 1;
SELECT c.relname, has_table_privilege('public', c.oid, 'SELECT') AS public_may
  FROM pg_class c
 WHERE c.relnamespace = 'projcache'::regnamespace
   AND c.relname IN ('streams', 'stream_mappings', 'stream_registry',
                     'stream_mapping_registry')
 ORDER BY 1;
-- The views' columns, in order.
SELECT attname FROM pg_attribute
 WHERE attrelid = 'projcache.streams'::regclass AND attnum > 0 ORDER BY attnum;
SELECT attname FROM pg_attribute
 WHERE attrelid = 'projcache.stream_mappings'::regclass AND attnum > 0 ORDER BY attnum;

------------------------------------------------------------------------
-- create_stream's checks (as a superuser)
------------------------------------------------------------------------
-- Names as for caches: [a-z][a-z0-9_]*, at most 63 bytes (22023).
SELECT n, st.try(format('SELECT projcache.create_stream(%L, %L, %L)', n, 'host=src', 'pub'))
  FROM unnest(ARRAY['Bad', '1abc', 'a-b', 'a:b', '', ' a', 'x' || repeat('y', 63),
                    'a''; DROP TABLE projcache.stream_registry; --']) n;
-- NULLs (22004).
SELECT st.try('SELECT projcache.create_stream(NULL, ''host=src'', ''pub'')');
SELECT st.try('SELECT projcache.create_stream(''a'', NULL, ''pub'')');
SELECT st.try('SELECT projcache.create_stream(''a'', ''host=src'', NULL)');
-- Connection strings libpq cannot parse (42601, libpq's message as the
-- detail), and what would break the worker's replication=database
-- connection (22023).
SELECT c, st.try(format('SELECT projcache.create_stream(%L, %L, %L)', 'a', c, 'pub'))
  FROM unnest(ARRAY['nonsense', 'host=src nosuchoption=1', 'host=''src',
                    'postgresql://src/db?nosuch=1', 'replication=database host=src',
                    'host=src replication=true', 'dbname=''host=elsewhere passfile=/x''',
                    'dbname=postgresql://elsewhere/db', 'dbname=postgres://elsewhere/db']) c;
-- At most 1,023 bytes, as walreceiver's MAXCONNINFO (54000), at create
-- and at alter.
SELECT n, st.try(format('SELECT projcache.create_stream(%L, %L, %L)', 'len_' || n,
                        'host=src application_name=' || repeat('x', n - 26), 'pub'))
  FROM unnest(ARRAY[1023, 1024, 1048576]) n;
SELECT st.try(format('SELECT projcache.alter_stream(%L, %L)', 'len_1023',
                     'host=src application_name=' || repeat('x', 1024 - 26)));
SELECT length(conninfo) FROM projcache.stream_registry WHERE name = 'len_1023';
SELECT projcache.drop_stream('len_1023');
-- libpq's debug options ('D') and OAuth options (oauth_*) are refused
-- to every role, a superuser too (2F003), as postgres_fdw refuses them;
-- the libpq of a server before 18 knows none of them but replication, and
-- refuses them as it parses (42601).
SELECT o, r ~ format('^2F003: connection option "%s" is not allowed in a stream', o)
          OR r LIKE format('42601: %%invalid connection option "%s"%%', o) AS refused
  FROM unnest(ARRAY['scram_client_key', 'scram_server_key', 'sslkeylogfile',
                    'oauth_issuer', 'oauth_client_id', 'oauth_client_secret',
                    'oauth_scope']) o,
       LATERAL st.try(format('SELECT projcache.create_stream(%L, %L, %L)', 'a',
                             format('host=src password=pw %s=x', o), 'pub')) r;
SELECT count(*) AS registered FROM projcache.stream_registry;
-- Publications: one identifier (42602); slot names as the source takes
-- them (42602, 42622).
SELECT p, st.try(format('SELECT projcache.create_stream(%L, %L, %L)', 'a', 'host=src', p))
  FROM unnest(ARRAY['', 'a.b', '"', '"a"b', 'pub; DROP TABLE x']) p;
SELECT s, st.try(format('SELECT projcache.create_stream(%L, %L, %L, %L)', 'a', 'host=src', 'pub', s))
  FROM unnest(ARRAY['', 'Bad', 'a-b', 'a b', repeat('s', 64), 'a''; --']) s;
-- Not in a REPEATABLE READ transaction (25000).
BEGIN ISOLATION LEVEL REPEATABLE READ;
SELECT st.try('SELECT projcache.create_stream(''a'', ''host=src'', ''pub'')');
ROLLBACK;
-- Each stream has a worker: the source "src" does not resolve, so it is
-- starting or reconnecting.
-- A superuser's stream needs no password.
SELECT projcache.create_stream('su_stream', 'host=src dbname=app user=repl', 'pub');
SELECT st.try('SELECT projcache.create_stream(''su_stream'', ''host=src'', ''pub'')');
SELECT name, owner, conninfo, publication, slot_name,
       state IN ('starting', 'reconnecting') AS connecting FROM projcache.streams;

-- Elsewhere than projcache.database (55000).
CREATE DATABASE st_elsewhere;
\c st_elsewhere
SET client_min_messages = warning;
CREATE EXTENSION projcache;
SELECT projcache.create_stream('elsewhere', 'host=src', 'pub');
SELECT count(*) FROM projcache.streams;
\c contrib_regression
SET client_min_messages = warning;
DROP DATABASE st_elsewhere;

------------------------------------------------------------------------
-- A role that is not a superuser: a password, no file or service (2F003)
------------------------------------------------------------------------
SET ROLE st_owner;
SELECT c, st.try(format('SELECT projcache.create_stream(%L, %L, %L)', 'mine', c, 'pub'))
  FROM unnest(ARRAY['host=src', 'host=src password=', 'host=src password=''''',
                    'postgresql://repl@src/app',
                    'host=src password=pw passfile=/var/lib/postgresql/.pgpass',
                    'host=src password=pw service=corp',
                    'host=src password=pw sslcert=/etc/ssl/c.crt',
                    'host=src password=pw sslkey=/etc/ssl/private/k.key',
                    'host=src password=pw sslrootcert=/etc/passwd',
                    'host=src password=pw sslcrl=/x', 'host=src password=pw sslcrldir=/x']) c;
-- sslcertmode, which libpq before 16 does not know (42601), but disable
-- (2F003): it would present this server's default client certificate.
SELECT m, r LIKE '2F003: connection option "sslcertmode" is not allowed in the stream of a role that is not a superuser%'
          OR r LIKE '42601: %invalid connection option "sslcertmode"%' AS refused
  FROM unnest(ARRAY['allow', 'require', 'Disable']) m,
       LATERAL st.try(format('SELECT projcache.create_stream(%L, %L, %L)', 'mine',
                             'host=src password=pw sslcertmode=' || m, 'pub')) r;
SELECT r = 'ok' OR r LIKE '42601: %invalid connection option "sslcertmode"%' AS disable_taken
  FROM st.try('SELECT projcache.create_stream(''certless'', ''host=src password=pw sslcertmode=disable'', ''pub'')') r;
RESET ROLE;
DELETE FROM projcache.stream_registry WHERE name = 'certless';
SET ROLE st_owner;
SELECT projcache.create_stream('mine', 'host=src dbname=app user=repl password=owner_secret sslmode=require', 'pub');
SELECT projcache.create_stream('mine_uri', 'postgresql://repl:uri_secret@src:5433/app?sslrootcert=system', 'pub', 'mine_slot');
SELECT name, owner, conninfo, publication, slot_name,
       state IN ('starting', 'reconnecting') AS connecting, transactions, lag
  FROM projcache.streams;
-- A third is past the half of projcache.max_streams (4) one role may own.
SELECT st.try('SELECT projcache.create_stream(''mine_3'', ''host=src password=x'', ''pub'')');
RESET ROLE;
-- The bound is each role's: another role owns its half too.
SET ROLE st_other;
SELECT st.try('SELECT projcache.create_stream(''other_1'', ''host=src password=x'', ''pub'')');
RESET ROLE;
-- Then none is left, for a superuser neither (54000).
SELECT st.try('SELECT projcache.create_stream(''su_1'', ''host=src'', ''pub'')');
SELECT count(*) AS registered FROM projcache.streams;
-- A superuser is bound by projcache.max_streams only.
SELECT projcache.drop_stream('other_1');
SELECT projcache.create_stream('su_slot', 'host=src password=su_secret', '"Mixed Pub"', 'su_slot_1');
SET ROLE st_other;
SELECT st.try('SELECT projcache.create_stream(''other_1'', ''host=src password=x'', ''pub'')');
RESET ROLE;
SELECT projcache.drop_stream('su_slot');
SET ROLE st_other;
SELECT st.try('SELECT projcache.create_stream(''other_1'', ''host=src password=x'', ''pub'')');
RESET ROLE;
SELECT projcache.drop_stream('other_1');

------------------------------------------------------------------------
-- alter_stream
------------------------------------------------------------------------
SET ROLE st_other;
SELECT st.try('SELECT projcache.alter_stream(''mine'', ''host=evil password=x'')');
SELECT st.try('SELECT projcache.alter_stream(''nosuch'', ''host=evil password=x'')');
SELECT st.try('SELECT projcache.drop_stream(''mine'')');
RESET ROLE;
SET ROLE st_owner;
SELECT st.try('SELECT projcache.alter_stream(''mine'', ''host=src2'')');
SELECT st.try('SELECT projcache.alter_stream(''mine'', ''host=src2 password=pw passfile=/x'')');
SELECT st.try('SELECT projcache.alter_stream(''mine'', ''host=src2 password=pw replication=database'')');
SELECT st.try('SELECT projcache.alter_stream(''mine'', publication => ''a.b'')');
SELECT st.try('SELECT projcache.alter_stream(NULL)');
SELECT projcache.alter_stream('mine', 'host=src2 dbname=app password=rotated_secret');
SELECT projcache.alter_stream('mine', publication => 'pub2');
SELECT projcache.alter_stream('mine');
-- alter_stream and drop_stream run in any isolation level.
BEGIN ISOLATION LEVEL REPEATABLE READ;
SELECT projcache.alter_stream('mine', publication => 'pub_rr');
SELECT projcache.drop_stream('mine');
ROLLBACK;
SELECT name, conninfo, publication, slot_name FROM projcache.streams WHERE name = 'mine';
RESET ROLE;
-- A superuser changing the stream of a role that is not one keeps a
-- password in it (2F003); its own stream needs none.
SELECT st.try('SELECT projcache.alter_stream(''mine'', ''host=src3'')');
SELECT projcache.alter_stream('mine', 'host=src3 password=super_set_secret');
SELECT projcache.alter_stream('su_stream', 'host=src4');
-- An owner who is no longer a superuser gives a password before any change.
CREATE ROLE st_was_super SUPERUSER;
GRANT USAGE ON SCHEMA projcache TO st_was_super;
GRANT EXECUTE ON FUNCTION projcache.alter_stream(text, text, text) TO st_was_super;
SET ROLE st_was_super;
SELECT projcache.create_stream('was_super', 'host=src', 'pub');
RESET ROLE;
ALTER ROLE st_was_super NOSUPERUSER;
SET ROLE st_was_super;
SELECT st.try('SELECT projcache.alter_stream(''was_super'', publication => ''pub2'')');
SELECT projcache.alter_stream('was_super', 'host=src password=now_secret', 'pub2');
RESET ROLE;
SELECT projcache.drop_stream('was_super');

------------------------------------------------------------------------
-- The views: each role its own streams, superusers all; the connection
-- string to its owner and superusers only, never its password
------------------------------------------------------------------------
SELECT name, owner, conninfo FROM projcache.streams ORDER BY name;
SET ROLE st_other;
SELECT name, owner, conninfo FROM projcache.streams ORDER BY name;
RESET ROLE;
SET ROLE st_member;
SELECT name, owner, conninfo FROM projcache.streams ORDER BY name;
RESET ROLE;
SELECT count(*) AS passwords_shown FROM projcache.streams
 WHERE conninfo ~ '(secret|password)';
SET ROLE st_owner;
SELECT count(*) AS passwords_shown FROM projcache.streams
 WHERE conninfo ~ '(secret|password)';
RESET ROLE;
-- Nor an option libpq marks secret ('*') or debug ('D'), were one
-- stored (NULL where libpq cannot parse it).
INSERT INTO projcache.stream_registry (name, owner, conninfo, publication)
VALUES ('planted', current_user::regrole,
        'host=src sslpassword=ssl_secret', 'pub'),
       ('planted_18', current_user::regrole,
        'host=src sslpassword=ssl_secret scram_client_key=key_secret scram_server_key=key_secret sslkeylogfile=/tmp/keylog oauth_client_secret=oauth_secret',
        'pub');
SELECT name, conninfo FROM projcache.streams WHERE name = 'planted';
SELECT name, conninfo IS NULL OR conninfo = 'host=''src''' AS hidden
  FROM projcache.streams WHERE name = 'planted_18';
DELETE FROM projcache.stream_registry WHERE name IN ('planted', 'planted_18');

------------------------------------------------------------------------
-- Mappings
------------------------------------------------------------------------
SET ROLE st_owner;
SELECT projcache.create_cache('st_mine', 'st.fetch(text[],text[])', max_memory => 65536);
SELECT projcache.create_snapshot('st_snap_mine', 'SELECT 1 AS id');
RESET ROLE;
SET ROLE st_other;
SELECT projcache.create_cache('st_theirs', 'st.fetch(text[],text[])', max_memory => 65536);
SELECT projcache.create_snapshot('st_snap_theirs', 'SELECT 1 AS id');
RESET ROLE;
SET ROLE st_owner;
-- Tables are schema.table (22023), names as SQL writes them (42602).
SELECT t, st.try(format('SELECT projcache.stream_table(%L, %L, %L, %L)', 'mine', t, 'id', 'st_mine'))
  FROM unnest(ARRAY['accounts', 'db.public.accounts', '', '"', 'public.', '.accounts',
                    'public.accounts; DROP TABLE projcache.stream_registry',
                    'public.accounts'' OR ''1''=''1']) t;
SELECT k, st.try(format('SELECT projcache.stream_table(%L, %L, %L, %L)', 'mine', 'public.accounts', k, 'st_mine'))
  FROM unnest(ARRAY['', 'a.b', '"', 'id; --']) k;
SELECT st.try('SELECT projcache.stream_table(''mine'', NULL, ''id'', ''st_mine'')');
SELECT st.try('SELECT projcache.stream_snapshot(NULL, ''public.accounts'', ''st_snap_mine'')');
SELECT st.try('SELECT projcache.stream_snapshot(''mine'', NULL, ''st_snap_mine'')');
SELECT st.try('SELECT projcache.stream_snapshot(''mine'', ''public.accounts'', NULL)');
SELECT st.try('SELECT projcache.drop_stream(NULL)');
SELECT st.try('SELECT projcache.stream_table(''mine'', ''public.accounts'', ''id'', ''st_mine'', NULL)');
SELECT st.try(format('SELECT projcache.stream_table(%L, %L, %L, %L, %L)', 'mine', 'public.accounts', 'id', 'st_mine', repeat('p', 1017)));
-- Only a superuser maps to the default cache; only the owner of the
-- cache, the snapshot and the stream maps (42501); 42704 for what is not.
SELECT st.try('SELECT projcache.stream_table(''mine'', ''public.accounts'', ''id'')');
SELECT st.try('SELECT projcache.stream_table(''mine'', ''public.accounts'', ''id'', ''st_theirs'')');
SELECT st.try('SELECT projcache.stream_table(''mine'', ''public.accounts'', ''id'', ''nosuch'')');
SELECT st.try('SELECT projcache.stream_table(''su_stream'', ''public.accounts'', ''id'', ''st_mine'')');
SELECT st.try('SELECT projcache.stream_table(''nosuch'', ''public.accounts'', ''id'', ''st_mine'')');
SELECT st.try('SELECT projcache.stream_snapshot(''mine'', ''public.accounts'', ''st_snap_theirs'')');
SELECT st.try('SELECT projcache.stream_snapshot(''mine'', ''public.accounts'', ''nosuch'')');
SELECT st.try('SELECT projcache.stream_snapshot(''su_stream'', ''public.accounts'', ''st_snap_mine'')');
SELECT projcache.stream_table('mine', 'public.accounts', 'id', 'st_mine', 'acct:');
SELECT projcache.stream_table('mine', '"Sales"."Orders 2026"', '"OrderId"', 'st_mine');
SELECT projcache.stream_table('mine', 'Public.Projects', 'ID', 'st_mine', 'p:');
SELECT projcache.stream_snapshot('mine', 'public.accounts', 'st_snap_mine');
-- stream_table and stream_snapshot count a stream's mappings: READ
-- COMMITTED only (25000); unstream_table runs in any isolation level.
BEGIN ISOLATION LEVEL SERIALIZABLE;
SELECT st.try('SELECT projcache.stream_table(''mine'', ''public.rr'', ''id'', ''st_mine'')');
SELECT st.try('SELECT projcache.stream_snapshot(''mine'', ''public.rr'', ''st_snap_mine'')');
SELECT projcache.unstream_table('mine', 'public.accounts', 'st_mine');
ROLLBACK;
-- Once per (stream, table, target) (42710).
SELECT st.try('SELECT projcache.stream_table(''mine'', ''public.accounts'', ''other_id'', ''st_mine'')');
SELECT st.try('SELECT projcache.stream_snapshot(''mine'', ''public.accounts'', ''st_snap_mine'')');
-- One table is one table, whatever quote_all_identifiers says; the views
-- show it quoted only as need be, whatever it says too.
SET quote_all_identifiers = on;
SELECT st.try('SELECT projcache.stream_table(''mine'', ''public.accounts'', ''other_id'', ''st_mine'')');
SELECT st.try('SELECT projcache.stream_table(''mine'', ''"public"."accounts"'', ''other_id'', ''st_mine'')');
SELECT st.try('SELECT projcache.stream_snapshot(''mine'', ''public.accounts'', ''st_snap_mine'')');
SELECT * FROM projcache.stream_mappings;
RESET quote_all_identifiers;
RESET ROLE;
SELECT source_schema, source_table_name, pg_typeof(source_schema), pg_typeof(source_table_name)
  FROM projcache.stream_mapping_registry ORDER BY 1, 2, key_prefix;
SELECT projcache.stream_table('mine', 'public.accounts', 'id');
SELECT st.try('SELECT projcache.stream_table(''mine'', ''public.accounts'', ''id'')');
-- 'default', as the view shows it, is the default cache (no named cache
-- may have the name).
SELECT st.try('SELECT projcache.stream_table(''mine'', ''public.accounts'', ''id'', ''default'')');
SELECT st.try('SELECT projcache.create_cache(''default'', ''st.fetch(text[],text[])'')');
SET ROLE st_owner;
SELECT st.try('SELECT projcache.stream_table(''mine'', ''public.x'', ''id'', ''default'')');
RESET ROLE;
SET ROLE st_other;
SELECT st.try('SELECT projcache.stream_table(''mine'', ''public.x'', ''id'', ''st_theirs'')');
SELECT st.try('SELECT projcache.unstream_table(''mine'', ''public.accounts'', ''st_mine'')');
SELECT count(*) AS others_seen FROM projcache.stream_mappings;
RESET ROLE;
SET ROLE st_member;
SELECT stream, source_table, cache, snapshot FROM projcache.stream_mappings;
RESET ROLE;

-- unstream_table
SET ROLE st_owner;
SELECT st.try('SELECT projcache.unstream_table(''mine'', ''public.accounts'', ''st_mine'', ''st_snap_mine'')');
SELECT st.try('SELECT projcache.unstream_table(''mine'', ''public.nosuch'', ''st_mine'')');
SELECT st.try('SELECT projcache.unstream_table(''mine'', ''public.nosuch'')');
SELECT st.try('SELECT projcache.unstream_table(''mine'', ''public.nosuch'', snapshot => ''st_snap_mine'')');
SELECT st.try('SELECT projcache.unstream_table(''mine'', ''accounts'', ''st_mine'')');
SET quote_all_identifiers = on;
SELECT projcache.unstream_table('mine', 'PUBLIC.PROJECTS', 'st_mine');
RESET quote_all_identifiers;
-- The stream's owner removes the default cache's mapping too, named as
-- the view names it or NULL.
BEGIN;
SELECT projcache.unstream_table('mine', 'public.accounts', 'default');
SELECT count(*) AS default_mapped FROM projcache.stream_mappings WHERE cache = 'default';
ROLLBACK;
SELECT projcache.unstream_table('mine', 'public.accounts');
SELECT stream, source_table, key_column, cache, snapshot FROM projcache.stream_mappings;
SELECT projcache.stream_table('mine', 'public.projects', 'id', 'st_mine', 'p:');

-- A mapping goes with its cache and its snapshot.
SELECT projcache.drop_cache('st_mine');
SELECT stream, source_table, cache, snapshot FROM projcache.stream_mappings;
SELECT projcache.drop_snapshot('st_snap_mine');
SELECT count(*) AS left_mapped FROM projcache.stream_mappings;
-- A cache made again under the name is another cache.
SELECT projcache.create_cache('st_mine', 'st.fetch(text[],text[])', max_memory => 65536);
SELECT projcache.stream_table('mine', 'public.accounts', 'id', 'st_mine');
BEGIN;
SELECT projcache.drop_cache('st_mine');
SELECT projcache.create_cache('st_mine', 'st.fetch(text[],text[])', max_memory => 65536);
COMMIT;
SELECT count(*) AS left_mapped FROM projcache.stream_mappings;
SELECT projcache.stream_table('mine', 'public.accounts', 'id', 'st_mine');
SELECT projcache.drop_stream('mine_uri');
RESET ROLE;
-- ... and with its stream.
SELECT projcache.stream_table('mine', 'public.accounts', 'id');
SELECT count(*) AS mapped FROM projcache.stream_mapping_registry;
SET ROLE st_owner;
SELECT projcache.drop_stream('mine');
RESET ROLE;
SELECT count(*) AS mapped FROM projcache.stream_mapping_registry;

-- Every table of the extension has a primary key, so a FOR ALL TABLES
-- publication in projcache.database takes the registry's changes.
SELECT c.relname, EXISTS (SELECT FROM pg_constraint k
                           WHERE k.conrelid = c.oid AND k.contype = 'p') AS has_primary_key
  FROM pg_class c
  JOIN pg_depend d ON d.classid = 'pg_class'::regclass AND d.objid = c.oid
   AND d.refclassid = 'pg_extension'::regclass AND d.deptype = 'e'
 WHERE c.relkind = 'r'
   AND d.refobjid = (SELECT oid FROM pg_extension WHERE extname = 'projcache')
 ORDER BY 1;
SET client_min_messages = error;
CREATE PUBLICATION st_all FOR ALL TABLES;
SET client_min_messages = warning;
SELECT projcache.create_stream('published', 'host=src', 'pub');
SELECT projcache.stream_table('published', 'public.a', 'id');
SELECT projcache.stream_table('published', 'public.b', 'id');
SELECT projcache.unstream_table('published', 'public.a');
SELECT projcache.alter_stream('published', 'host=src2');
SELECT projcache.drop_stream('published');
DROP PUBLICATION st_all;

------------------------------------------------------------------------
-- A hostile role that is not a superuser
------------------------------------------------------------------------
SET ROLE st_other;
-- The registry is not its to read or write, nor the schema to add to.
SELECT st.try('SELECT * FROM projcache.stream_registry');
SELECT st.try('SELECT * FROM projcache.stream_mapping_registry');
SELECT st.try('INSERT INTO projcache.stream_registry (name, owner, conninfo, publication) VALUES (''x'', ''st_other'', ''host=x'', ''p'')');
SELECT st.try('CREATE TABLE projcache.stream_registry_x (a int)');
SELECT st.try('CREATE FUNCTION projcache.count(anyelement) RETURNS int8 LANGUAGE sql AS ''SELECT 0::int8''');
SELECT st.try('SELECT nextval(''projcache.stream_registry_id_seq'')');
-- Names and values that would be SQL if pasted into it are data.
SELECT st.try($$SELECT projcache.create_stream('x', 'host=src password=''x\''); DROP TABLE projcache.stream_registry; --''', 'pub')$$);
SELECT st.try($$SELECT projcache.create_stream('x2', 'host=src password=x', '"pub""; DROP TABLE projcache.stream_registry; --"')$$);
SELECT st.try($$SELECT projcache.create_stream('x3'' || (SELECT 1) || ''', 'host=src password=x', 'pub')$$);
SELECT name, conninfo, publication FROM projcache.streams;
SELECT projcache.drop_stream('x');
SELECT projcache.drop_stream('x2');
RESET ROLE;
-- Its own search_path, operators and functions are never looked up.
CREATE SCHEMA st_evil AUTHORIZATION st_other;
SET ROLE st_other;
CREATE FUNCTION st_evil.texteq_evil(text, text) RETURNS boolean LANGUAGE plpgsql AS $$
BEGIN
    RAISE NOTICE 'evil operator ran as %', current_user;
    RETURN true;
END $$;
CREATE OPERATOR st_evil.= (LEFTARG = text, RIGHTARG = text, FUNCTION = st_evil.texteq_evil);
CREATE FUNCTION st_evil.count(anyelement) RETURNS bigint LANGUAGE plpgsql AS $$
BEGIN
    RAISE NOTICE 'evil count ran as %', current_user;
    RETURN 0;
END $$;
CREATE TEMP TABLE stream_registry (name text, owner oid);
SET search_path = st_evil, pg_temp, pg_catalog, public;
SET client_min_messages = notice;
SELECT projcache.create_stream('evil', 'host=src password=x', 'pub');
SELECT projcache.drop_stream('su_stream');
SELECT projcache.alter_stream('su_stream', 'host=evil');
SELECT projcache.stream_table('evil', 'public.t', 'id', 'st_theirs');
SELECT name, conninfo FROM projcache.streams;
SELECT stream, source_table, cache FROM projcache.stream_mappings;
SELECT projcache.drop_stream('evil');
RESET search_path;
SET client_min_messages = warning;
DROP TABLE pg_temp.stream_registry;
RESET ROLE;

------------------------------------------------------------------------
-- DROP ROLE of a stream's owner is refused (2BP01), until the stream goes
------------------------------------------------------------------------
CREATE ROLE st_dropme IN ROLE st_owner;
SET ROLE st_dropme;
SELECT projcache.create_stream('dropme', 'host=src password=x', 'pub');
RESET ROLE;
SELECT st.try('DROP ROLE st_dropme');
BEGIN;
SELECT projcache.drop_stream('dropme');
SELECT st.try('DROP ROLE st_dropme');
ROLLBACK;
SELECT name, owner FROM projcache.streams WHERE name = 'dropme';
SELECT projcache.drop_stream('dropme');
DROP ROLE st_dropme;

-- Clean up.
SELECT count(projcache.drop_stream(name)) FROM projcache.streams;
SELECT projcache.drop_cache('st_mine');
SELECT projcache.drop_cache('st_theirs');
SELECT projcache.drop_snapshot('st_snap_theirs');
SELECT count(*) AS left_registered FROM projcache.stream_registry;
DROP SCHEMA st CASCADE;
DROP SCHEMA st_evil CASCADE;
REVOKE ALL ON projcache.streams, projcache.stream_mappings FROM st_owner, st_other, st_member;
REVOKE ALL ON FUNCTION
    projcache.create_stream(text, text, text, text),
    projcache.alter_stream(text, text, text),
    projcache.stream_table(text, text, text, text, text),
    projcache.stream_snapshot(text, text, text),
    projcache.unstream_table(text, text, text, text),
    projcache.drop_stream(text),
    projcache.streams_1_4(), projcache.stream_mappings_1_4(),
    projcache.create_cache(text, regprocedure, interval, interval, interval, interval, integer, interval, bigint, regrole),
    projcache.drop_cache(text),
    projcache.create_snapshot(text, text, interval, text),
    projcache.drop_snapshot(text)
    FROM st_owner, st_other, st_member;
REVOKE ALL ON FUNCTION projcache.alter_stream(text, text, text) FROM st_was_super;
REVOKE USAGE ON SCHEMA projcache FROM st_was_super;
REVOKE USAGE ON SCHEMA projcache FROM st_owner, st_other, st_member;
DROP ROLE st_owner, st_other, st_member, st_was_super;
