--
-- Snapshots as foreign tables: the projcache foreign-data wrapper reads a
-- snapshot by the rules of snapshot() (fast path, last-good after a failing
-- refresh, cold-start throttle with PC001, the reader's grant), checks the
-- foreign table's columns against the recorded ones, refuses writes and
-- the system columns rows do not have, and imports one table per snapshot
-- the caller may read.
--
CREATE SCHEMA snap_fdw;
SET search_path = snap_fdw, public;

CREATE TABLE src (id int PRIMARY KEY, label text NOT NULL);
INSERT INTO src SELECT g, 'label-' || g FROM generate_series(1, 50) g;
CREATE TABLE ctl (fail boolean NOT NULL);
INSERT INTO ctl VALUES (false);
CREATE SEQUENCE calls_seq;
CREATE FUNCTION source() RETURNS SETOF src LANGUAGE plpgsql AS $$
BEGIN
	PERFORM pg_catalog.nextval('snap_fdw.calls_seq');
	IF (SELECT c.fail FROM snap_fdw.ctl c) THEN
		RAISE EXCEPTION 'source is down';
	END IF;
	RETURN QUERY SELECT s.id, s.label FROM snap_fdw.src s ORDER BY s.id;
END $$;
CREATE FUNCTION calls() RETURNS bigint LANGUAGE sql AS $$
	SELECT CASE WHEN is_called THEN last_value ELSE 0 END
	  FROM snap_fdw.calls_seq $$;
-- The planner's row estimate of a query.
CREATE FUNCTION estimated_rows(query text) RETURNS bigint LANGUAGE plpgsql AS $$
DECLARE
	plan json;
BEGIN
	EXECUTE 'EXPLAIN (FORMAT JSON) ' || query INTO plan;
	RETURN (plan -> 0 -> 'Plan' ->> 'Plan Rows')::bigint;
END $$;

SELECT projcache.create_snapshot('labels', 'SELECT * FROM snap_fdw.source()', '60s');
CREATE FOREIGN TABLE labels_ft (id int, label text)
	SERVER projcache OPTIONS (snapshot 'labels');

-- A cold read loads it (one query); then reads are served from memory.
SELECT count(*), min(id), max(id) FROM labels_ft;
SELECT * FROM labels_ft WHERE id = 7;
SELECT label FROM labels_ft ORDER BY id LIMIT 3;
SELECT calls();
-- The same rows as snapshot(), the same query count.
SELECT count(*) AS differing FROM (
	(SELECT * FROM labels_ft
	 EXCEPT ALL SELECT * FROM projcache.snapshot('labels') AS t(id int, label text))
	UNION ALL
	(SELECT * FROM projcache.snapshot('labels') AS t(id int, label text)
	 EXCEPT ALL SELECT * FROM labels_ft)) d;
SELECT calls();
-- Planned at each query, a read asks the registry nothing once this
-- backend has the snapshot's registration cached; nor does EXPLAIN.
BEGIN;
SELECT count(*) FROM labels_ft;
SELECT coalesce((SELECT seq_scan + coalesce(idx_scan, 0) FROM pg_stat_xact_user_tables
				  WHERE relid = 'projcache.snapshot_registry'::regclass), 0) AS registry_scans \gset
SELECT count(*) FROM labels_ft WHERE id > 10;
EXPLAIN (COSTS OFF) SELECT * FROM labels_ft;
SELECT coalesce((SELECT seq_scan + coalesce(idx_scan, 0) FROM pg_stat_xact_user_tables
				  WHERE relid = 'projcache.snapshot_registry'::regclass), 0)
	   - :registry_scans AS more_registry_scans;
COMMIT;
-- A reader that keeps each row (a table's insert copies it out of the
-- scan's slot) gets every row, not the first one again.
CREATE TEMP TABLE labels_kept AS SELECT * FROM labels_ft;
SELECT count(*), count(DISTINCT id), count(DISTINCT label), sum(id) FROM labels_kept;

-- The planner's estimate is the snapshot's row count; EXPLAIN names it.
SELECT estimated_rows('SELECT * FROM snap_fdw.labels_ft');
-- Quals scale it down, as for a table.
SELECT estimated_rows('SELECT * FROM snap_fdw.labels_ft WHERE id = 7') < 50 AS fewer;
EXPLAIN (COSTS OFF) SELECT * FROM labels_ft WHERE id = 7;

-- Joins, and a self-join (two scans of one copy).
SELECT a.id, b.label FROM labels_ft a JOIN labels_ft b ON b.id = a.id + 1
 WHERE a.id < 3 ORDER BY a.id;
SELECT s.id, f.label FROM src s JOIN labels_ft f USING (id) WHERE s.id IN (4, 5) ORDER BY 1;
-- A scan of another snapshot in the same query.
SELECT projcache.create_snapshot('ones', 'SELECT 1 AS one UNION ALL SELECT 1', '60s');
CREATE FOREIGN TABLE ones_ft (one int) SERVER projcache OPTIONS (snapshot 'ones');
SELECT count(*) FROM labels_ft, ones_ft;

--
-- Last-good through the foreign table: a failing refresh WARNs and serves
-- the old rows; a TTL after that failure, one more attempt.
--
UPDATE ctl SET fail = true;
UPDATE src SET label = 'new' WHERE id = 1;
SELECT projcache.debug_advance_clock('61s');
SELECT label FROM labels_ft WHERE id = 1;
SELECT label FROM labels_ft WHERE id = 1;
SELECT calls();
SELECT refresh_errors, status FROM projcache.snapshots WHERE name = 'labels';
UPDATE ctl SET fail = false;
SELECT projcache.debug_advance_clock('61s');
SELECT label FROM labels_ft WHERE id = 1;
SELECT calls();

--
-- Cold start against a failing source: PC001, then throttled for a TTL.
--
UPDATE ctl SET fail = true;
SELECT projcache.create_snapshot('cold', 'SELECT * FROM snap_fdw.source()', '60s');
CREATE FOREIGN TABLE cold_ft (id int, label text) SERVER projcache OPTIONS (snapshot 'cold');
\set VERBOSITY sqlstate
SELECT count(*) FROM cold_ft;
SELECT count(*) FROM cold_ft;
\set VERBOSITY default
SELECT count(*) FROM cold_ft;
SELECT calls();
UPDATE ctl SET fail = false;
SELECT projcache.debug_advance_clock('61s');
SELECT count(*) FROM cold_ft;

--
-- Columns: checked against the recorded types when the scan starts.
--
CREATE FOREIGN TABLE wrong_ft (id text, label text) SERVER projcache OPTIONS (snapshot 'labels');
SELECT * FROM wrong_ft;
CREATE FOREIGN TABLE short_ft (id int) SERVER projcache OPTIONS (snapshot 'labels');
SELECT * FROM short_ft;
-- A dropped column is skipped, a later one takes its place.
CREATE FOREIGN TABLE moved_ft (id int, old text, label text) SERVER projcache OPTIONS (snapshot 'labels');
ALTER FOREIGN TABLE moved_ft DROP COLUMN old;
SELECT * FROM moved_ft ORDER BY id LIMIT 2;
-- Of the system columns, tableoid, and ctid, always invalid; the others
-- are refused (31_snapshot_fdw_leaks reads them through parents).
SELECT tableoid::regclass, id FROM labels_ft ORDER BY id LIMIT 1;
SELECT ctid, count(*) FROM labels_ft GROUP BY ctid;
SELECT ctid, count(*) FROM moved_ft GROUP BY ctid;
SELECT xmin FROM labels_ft;
SELECT id FROM labels_ft WHERE xmin = '5';
SELECT id FROM labels_ft WHERE cmin = '0';

--
-- Writes are refused.
--
INSERT INTO labels_ft VALUES (100, 'x');
UPDATE labels_ft SET label = 'x';
DELETE FROM labels_ft;
TRUNCATE labels_ft;
SELECT is_insertable_into FROM information_schema.tables
 WHERE table_schema = 'snap_fdw' AND table_name = 'labels_ft';

--
-- Options: a foreign table needs the snapshot option, and takes no other;
-- the server and wrapper take none.
--
CREATE FOREIGN TABLE noopt_ft (id int) SERVER projcache;
CREATE FOREIGN TABLE badopt_ft (id int) SERVER projcache OPTIONS (snapshot 'labels', mode 'x');
CREATE FOREIGN TABLE empty_ft (id int) SERVER projcache OPTIONS (snapshot '');
ALTER SERVER projcache OPTIONS (host 'x');
ALTER FOREIGN TABLE labels_ft OPTIONS (DROP snapshot);

--
-- A snapshot that does not exist (never, or dropped under the table).
--
CREATE FOREIGN TABLE nothing_ft (id int) SERVER projcache OPTIONS (snapshot 'nothing');
SELECT * FROM nothing_ft;
EXPLAIN (COSTS OFF) SELECT * FROM nothing_ft;
SELECT projcache.drop_snapshot('ones');
SELECT * FROM ones_ft;
-- Registered again, with other columns: the table is checked against them.
SELECT projcache.create_snapshot('ones', $$SELECT 'x'::text AS one$$, '60s');
SELECT * FROM ones_ft;

--
-- IMPORT FOREIGN SCHEMA: one table per snapshot, with its columns.
--
CREATE SCHEMA snap_fdw_imp;
IMPORT FOREIGN SCHEMA projcache LIMIT TO (labels, nothing) FROM SERVER projcache INTO snap_fdw_imp;
SELECT foreign_table_name FROM information_schema.foreign_tables
 WHERE foreign_table_schema = 'snap_fdw_imp' ORDER BY 1;
\d snap_fdw_imp.labels
SELECT count(*) FROM snap_fdw_imp.labels;
IMPORT FOREIGN SCHEMA projcache EXCEPT (labels) FROM SERVER projcache INTO snap_fdw_imp;
SELECT foreign_table_name FROM information_schema.foreign_tables
 WHERE foreign_table_schema = 'snap_fdw_imp' ORDER BY 1;
IMPORT FOREIGN SCHEMA public FROM SERVER projcache INTO snap_fdw_imp;

--
-- The key index: "key = value" probes it (a constant, a parameter, the
-- inner side of a nested loop); other conditions are filtered.  A refresh
-- that changed, added and removed rows swaps the index with them.
--
CREATE TABLE people (user_id int, name text, team text);
INSERT INTO people SELECT g, 'user-' || g, 'team-' || (g % 10) FROM generate_series(1, 1000) g;
INSERT INTO people VALUES (7, 'second seven', 'team-x'), (NULL, 'nobody', 'team-x');
CREATE TABLE projects (key text PRIMARY KEY, owner_id int);
INSERT INTO projects VALUES ('alpha', 7), ('beta', 8), ('gamma', 5000), ('delta', NULL);
SELECT projcache.create_snapshot('people', 'SELECT user_id, name, team FROM snap_fdw.people',
	'60s', key => 'user_id');
SELECT key_column FROM projcache.snapshot_registry WHERE name = 'people';
CREATE FOREIGN TABLE people_ft (user_id int, name text, team text)
	SERVER projcache OPTIONS (snapshot 'people');
SELECT count(*) FROM people_ft;
-- One key, two rows; no row; NULL matches nothing.
SELECT * FROM people_ft WHERE user_id = 7 ORDER BY name;
SELECT * FROM people_ft WHERE user_id = 5000;
SELECT * FROM people_ft WHERE user_id = NULL;
SELECT count(*) FROM people_ft WHERE user_id IS NULL;
EXPLAIN (COSTS OFF) SELECT * FROM people_ft WHERE user_id = 7;
-- At run time the probe returns only the key's rows: the filter, which
-- stays as a recheck, removes none (a full scan removes 1000).
EXPLAIN (ANALYZE, COSTS OFF, TIMING OFF, SUMMARY OFF, BUFFERS OFF) SELECT * FROM people_ft WHERE user_id = 7;
-- Other conditions are filtered, with or without a probe.
SELECT name FROM people_ft WHERE user_id = 7 AND team = 'team-x';
EXPLAIN (ANALYZE, COSTS OFF, TIMING OFF, SUMMARY OFF, BUFFERS OFF) SELECT * FROM people_ft WHERE user_id > 995;
SELECT user_id FROM people_ft WHERE user_id > 995 ORDER BY 1;
EXPLAIN (COSTS OFF) SELECT * FROM people_ft WHERE user_id::text = '7';
-- A parameter, as a prepared statement sends it.
PREPARE by_user(int) AS SELECT name FROM people_ft WHERE user_id = $1 ORDER BY name;
EXECUTE by_user(42);
EXECUTE by_user(7);
SET plan_cache_mode = force_generic_plan;
EXPLAIN (COSTS OFF) EXECUTE by_user(42);
EXECUTE by_user(43);
RESET plan_cache_mode;
-- The inner side of a nested loop probes once per outer row.
SET enable_hashjoin = off;
SET enable_mergejoin = off;
EXPLAIN (COSTS OFF)
SELECT p.key, g.name FROM projects p JOIN people_ft g ON g.user_id = p.owner_id;
SELECT p.key, g.name FROM projects p JOIN people_ft g ON g.user_id = p.owner_id ORDER BY 1, 2;
SELECT p.key, g.name FROM projects p LEFT JOIN people_ft g ON g.user_id = p.owner_id ORDER BY 1, 2;
-- The value may be a placeholder (a constant of a subquery on the
-- nullable side of an outer join).
SELECT p.key, g.name
  FROM projects p LEFT JOIN (SELECT 7 AS c) ss ON p.key = 'alpha'
  LEFT JOIN people_ft g ON g.user_id = ss.c
 ORDER BY 1, 2;
RESET enable_hashjoin;
RESET enable_mergejoin;
-- A project's owner rows, as an application asks for them: planned as it
-- comes (custom and generic plans), the inner side of the join probes the
-- key index once for the one project.
PREPARE owner_rows(text) AS
SELECT string_agg(g.name, ', ' ORDER BY g.name)
  FROM projects p JOIN people_ft g ON g.user_id = p.owner_id
 WHERE p.key = $1;
EXPLAIN (ANALYZE, COSTS OFF, TIMING OFF, SUMMARY OFF, BUFFERS OFF) EXECUTE owner_rows('alpha');
EXECUTE owner_rows('alpha');
SET plan_cache_mode = force_generic_plan;
EXPLAIN (ANALYZE, COSTS OFF, TIMING OFF, SUMMARY OFF, BUFFERS OFF) EXECUTE owner_rows('beta');
EXECUTE owner_rows('beta');
RESET plan_cache_mode;
DEALLOCATE owner_rows;
-- A refresh that changed, added and removed rows: the index follows.
UPDATE people SET name = 'renamed' WHERE user_id = 42;
DELETE FROM people WHERE user_id IN (7, 8);
INSERT INTO people VALUES (5000, 'newcomer', 'team-new');
SELECT projcache.refresh_snapshot('people');
SELECT * FROM people_ft WHERE user_id = 42;
SELECT * FROM people_ft WHERE user_id = 7;
SELECT * FROM people_ft WHERE user_id = 5000;
SELECT p.key, g.name FROM projects p JOIN people_ft g ON g.user_id = p.owner_id ORDER BY 1;
-- The index counts in the snapshot's bytes: larger than without it.
SELECT projcache.create_snapshot('people_plain', 'SELECT user_id, name, team FROM snap_fdw.people', '60s');
SELECT count(*) FROM projcache.snapshot('people_plain') AS t(user_id int, name text, team text);
SELECT i.bytes > p.bytes AS index_counted
  FROM projcache.snapshots i, projcache.snapshots p
 WHERE i.name = 'people' AND p.name = 'people_plain';
-- A text key, and keys that cannot be.
SELECT projcache.create_snapshot('by_name', 'SELECT name, user_id FROM snap_fdw.people', '60s', key => 'name');
CREATE FOREIGN TABLE by_name_ft (name text, user_id int) SERVER projcache OPTIONS (snapshot 'by_name');
SELECT user_id FROM by_name_ft WHERE name = 'user-9';
SELECT user_id FROM by_name_ft WHERE name = 'user-9' COLLATE "C";
-- Under a nondeterministic collation "=" is not the equality the index
-- hashes for: not probed, filtered (a probe would find no row here).
CREATE COLLATION snap_fdw_ci (provider = icu, locale = 'und-u-ks-level2', deterministic = false);
EXPLAIN (COSTS OFF) SELECT user_id FROM by_name_ft WHERE name = 'USER-9' COLLATE snap_fdw_ci;
SELECT user_id FROM by_name_ft WHERE name = 'USER-9' COLLATE snap_fdw_ci;
DROP COLLATION snap_fdw_ci;
-- A varchar key, a domain key and an array key are compared as their
-- opclass's type (text, the domain's base, anyarray): probed all the same.
CREATE DOMAIN snap_fdw.positive AS int CHECK (VALUE > 0);
SELECT projcache.create_snapshot('by_code',
	'SELECT name::varchar(20) AS code, user_id FROM snap_fdw.people', '60s', key => 'code');
CREATE FOREIGN TABLE by_code_ft (code varchar(20), user_id int)
	SERVER projcache OPTIONS (snapshot 'by_code');
EXPLAIN (ANALYZE, COSTS OFF, TIMING OFF, SUMMARY OFF, BUFFERS OFF) SELECT * FROM by_code_ft WHERE code = 'user-9';
SELECT projcache.create_snapshot('by_positive',
	'SELECT user_id::snap_fdw.positive AS id, name FROM snap_fdw.people WHERE user_id > 0',
	'60s', key => 'id');
CREATE FOREIGN TABLE by_positive_ft (id snap_fdw.positive, name text)
	SERVER projcache OPTIONS (snapshot 'by_positive');
EXPLAIN (ANALYZE, COSTS OFF, TIMING OFF, SUMMARY OFF, BUFFERS OFF) SELECT * FROM by_positive_ft WHERE id = 9;
SELECT projcache.create_snapshot('by_pair',
	'SELECT ARRAY[user_id, 0] AS pair, name FROM snap_fdw.people', '60s', key => 'pair');
CREATE FOREIGN TABLE by_pair_ft (pair int[], name text)
	SERVER projcache OPTIONS (snapshot 'by_pair');
EXPLAIN (ANALYZE, COSTS OFF, TIMING OFF, SUMMARY OFF, BUFFERS OFF) SELECT * FROM by_pair_ft WHERE pair = '{9,0}';
SELECT c.code, p.name, a.name
  FROM by_code_ft c, by_positive_ft p, by_pair_ft a
 WHERE c.code = 'user-9' AND p.id = 9 AND a.pair = '{9,0}';
DROP FOREIGN TABLE by_code_ft, by_positive_ft, by_pair_ft;
SELECT projcache.drop_snapshot(n) FROM unnest(ARRAY['by_code', 'by_positive', 'by_pair']) n;
DROP DOMAIN snap_fdw.positive;
SELECT projcache.create_snapshot('bad_key', 'SELECT user_id FROM snap_fdw.people', '60s', key => 'nope');
SELECT projcache.create_snapshot('bad_type', $$SELECT '(1,2)'::point AS p$$, '60s', key => 'p');
-- A plan made for one key index is not fooled when the snapshot is
-- registered again with its key on another column (plans are not
-- invalidated by registrations).
SELECT projcache.create_snapshot('pairs', 'SELECT * FROM (VALUES (1, 100), (2, 1)) AS v(a, b)',
	'60s', key => 'a');
CREATE FOREIGN TABLE pairs_ft (a int, b int) SERVER projcache OPTIONS (snapshot 'pairs');
SET plan_cache_mode = force_generic_plan;
PREPARE pair_by_a(int) AS SELECT a, b FROM pairs_ft WHERE a = $1;
EXECUTE pair_by_a(1);
SELECT projcache.drop_snapshot('pairs');
SELECT projcache.create_snapshot('pairs', 'SELECT * FROM (VALUES (1, 100), (2, 1)) AS v(a, b)',
	'60s', key => 'b');
EXECUTE pair_by_a(1);
EXECUTE pair_by_a(2);
RESET plan_cache_mode;
SELECT projcache.drop_snapshot(name) FROM projcache.snapshot_registry
 WHERE name IN ('people', 'people_plain', 'by_name', 'pairs') ORDER BY name;

--
-- A scan reads one load from start to end: an open cursor keeps its rows
-- while this session refreshes the snapshot and reads other snapshots.
--
UPDATE src SET label = 'changed' WHERE id IN (3, 4);
BEGIN;
DECLARE c NO SCROLL CURSOR FOR SELECT id, label FROM labels_ft;
FETCH 2 FROM c;
SELECT count(*) FROM projcache.snapshot('ones') AS t(one text);
SELECT projcache.debug_advance_clock('61s');
SELECT label FROM projcache.snapshot('labels') AS t(id int, label text) WHERE id = 3;
FETCH 3 FROM c;
SELECT label FROM labels_ft WHERE id = 3;
CLOSE c;
COMMIT;

-- A backend keeps a copy of each of the last few snapshots it read (four):
-- five read in turn, or together in one query (every copy pinned, the
-- fifth read gets one of its own), each give their own rows, before and
-- after two of them are refreshed, and an open cursor keeps its load.
CREATE TABLE turns (n int);
INSERT INTO turns SELECT generate_series(1, 10);
SELECT projcache.create_snapshot('turn' || i, format('SELECT n * %s AS v FROM snap_fdw.turns', i), '60s')
  FROM generate_series(1, 5) i;
CREATE FOREIGN TABLE turn1_ft (v int) SERVER projcache OPTIONS (snapshot 'turn1');
CREATE FOREIGN TABLE turn2_ft (v int) SERVER projcache OPTIONS (snapshot 'turn2');
CREATE FOREIGN TABLE turn3_ft (v int) SERVER projcache OPTIONS (snapshot 'turn3');
CREATE FOREIGN TABLE turn4_ft (v int) SERVER projcache OPTIONS (snapshot 'turn4');
CREATE FOREIGN TABLE turn5_ft (v int) SERVER projcache OPTIONS (snapshot 'turn5');
CREATE VIEW turn_sums AS
SELECT (SELECT sum(v) FROM turn1_ft) AS t1, (SELECT sum(v) FROM turn2_ft) AS t2,
	   (SELECT sum(v) FROM turn3_ft) AS t3, (SELECT sum(v) FROM turn4_ft) AS t4,
	   (SELECT sum(v) FROM turn5_ft) AS t5;
SELECT * FROM turn_sums;
SELECT * FROM turn_sums;
SELECT sum(v) FROM turn1_ft;
SELECT sum(v) FROM turn2_ft;
SELECT sum(v) FROM turn3_ft;
SELECT sum(v) FROM turn4_ft;
SELECT sum(v) FROM turn5_ft;
SELECT sum(v) FROM turn1_ft;
UPDATE turns SET n = n + 1;
BEGIN;
DECLARE c NO SCROLL CURSOR FOR SELECT v FROM turn1_ft;
FETCH 2 FROM c;
SELECT projcache.refresh_snapshot('turn1');
SELECT projcache.refresh_snapshot('turn3');
SELECT * FROM turn_sums;
FETCH ALL FROM c;
CLOSE c;
COMMIT;
SELECT * FROM turn_sums;
DROP VIEW turn_sums;
DROP FOREIGN TABLE turn1_ft, turn2_ft, turn3_ft, turn4_ft, turn5_ft;
SELECT projcache.drop_snapshot('turn' || i) FROM generate_series(1, 5) i;
DROP TABLE turns;

--
-- A foreign table in a database where its snapshot is not registered.
--
SELECT current_database() AS regress_db \gset
CREATE DATABASE regress_fdw_db;
\c regress_fdw_db
CREATE EXTENSION projcache;
CREATE FOREIGN TABLE labels_ft (id int, label text) SERVER projcache OPTIONS (snapshot 'labels');
SELECT * FROM labels_ft;
EXPLAIN (COSTS OFF) SELECT * FROM labels_ft;
\c :regress_db
DROP DATABASE regress_fdw_db;
SET search_path = snap_fdw, public;

--
-- Privileges: the reader's grant, checked at every scan; a view reads as
-- its owner.
--
CREATE ROLE regress_fdw_reader;
CREATE ROLE regress_fdw_other;
CREATE ROLE regress_fdw_viewer;
GRANT USAGE ON SCHEMA snap_fdw, snap_fdw_imp TO regress_fdw_reader, regress_fdw_other, regress_fdw_viewer;
GRANT SELECT ON labels_ft TO regress_fdw_reader, regress_fdw_other;
CREATE VIEW labels_v AS SELECT id, label FROM labels_ft;
GRANT SELECT ON labels_v TO regress_fdw_viewer;

SET ROLE regress_fdw_reader;
SELECT count(*) FROM labels_ft;
RESET ROLE;
SELECT projcache.grant_snapshot('labels', 'regress_fdw_reader');
SET ROLE regress_fdw_reader;
SELECT count(*) FROM labels_ft;
-- SET ROLE to a role without the grant, in the same session.
SET ROLE regress_fdw_other;
SELECT count(*) FROM labels_ft;
SET ROLE regress_fdw_reader;
SELECT count(*) FROM labels_ft;
RESET ROLE;
-- A revoke takes effect at once.
SELECT projcache.revoke_snapshot('labels', 'regress_fdw_reader');
SET ROLE regress_fdw_reader;
SELECT count(*) FROM labels_ft;
RESET ROLE;
-- Through a view, the view's owner (a superuser here) reads it.
SET ROLE regress_fdw_viewer;
SELECT count(*) FROM labels_v;
RESET ROLE;
ALTER VIEW labels_v OWNER TO regress_fdw_other;
GRANT SELECT ON labels_ft TO regress_fdw_other;
SET ROLE regress_fdw_viewer;
SELECT count(*) FROM labels_v;
RESET ROLE;
-- IMPORT brings only the snapshots the caller may read.
GRANT USAGE ON FOREIGN SERVER projcache TO regress_fdw_reader;
SELECT projcache.grant_snapshot('cold', 'regress_fdw_reader');
CREATE SCHEMA snap_fdw_mine AUTHORIZATION regress_fdw_reader;
SET ROLE regress_fdw_reader;
IMPORT FOREIGN SCHEMA projcache FROM SERVER projcache INTO snap_fdw_mine;
SELECT foreign_table_name FROM information_schema.foreign_tables
 WHERE foreign_table_schema = 'snap_fdw_mine' ORDER BY 1;
RESET ROLE;

SELECT projcache.drop_snapshot(name) FROM projcache.snapshot_registry
 WHERE name IN ('labels', 'ones', 'cold') ORDER BY name;
DROP SCHEMA snap_fdw_mine CASCADE;
DROP SCHEMA snap_fdw_imp CASCADE;
DROP SCHEMA snap_fdw CASCADE;
REVOKE ALL ON FOREIGN SERVER projcache FROM regress_fdw_reader;
DROP ROLE regress_fdw_reader, regress_fdw_other, regress_fdw_viewer;
