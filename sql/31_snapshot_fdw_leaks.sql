--
-- Security release 1.1.1: what a foreign table on a snapshot shows.
--
-- 1. A role that may not read a snapshot learns nothing of it through a
--    foreign table: not its key column, its status or its row count, in
--    EXPLAIN (plain, VERBOSE, JSON; ANALYZE fails as the scan does) nor in
--    the planner's estimates.  The reader checked is the one the table is
--    read as (a view's owner), and a plan made for a reader that may read
--    it is not shown to one that may not (another role, or after a
--    revoke).
-- 2. Snapshot rows have no transaction header: xmin, xmax, cmin and cmax
--    are refused wherever they are asked for (the table, an inheritance
--    parent, a partitioned table, a UNION ALL), never read from the bytes
--    of another row; tableoid and ctid (always invalid) are defined.
--
CREATE SCHEMA snap_leak;
SET search_path = snap_leak, public;

CREATE ROLE regress_leak_owner;
CREATE ROLE regress_leak_reader;
CREATE ROLE regress_leak_other;
GRANT USAGE ON SCHEMA projcache, snap_leak
	TO regress_leak_owner, regress_leak_reader, regress_leak_other;
GRANT EXECUTE ON FUNCTION projcache.create_snapshot(text, text, interval, text),
	projcache.grant_snapshot(text, regrole),
	projcache.revoke_snapshot(text, regrole),
	projcache.drop_snapshot(text)
	TO regress_leak_owner;
GRANT USAGE ON FOREIGN SERVER projcache TO regress_leak_reader, regress_leak_other;

-- The owner's source: 40 rows of tokens only its readers may see.
CREATE TABLE secret (id int, token text);
INSERT INTO secret SELECT g, 'SECRET-TOKEN-' || repeat('x', g % 9) FROM generate_series(1, 40) g;
GRANT SELECT ON secret TO regress_leak_owner;
SET ROLE regress_leak_owner;
SELECT projcache.create_snapshot('tokens', 'SELECT id, token FROM snap_leak.secret',
	'1h', key => 'id');
SELECT projcache.grant_snapshot('tokens', 'regress_leak_reader');
RESET ROLE;
CREATE FOREIGN TABLE tokens_ft (id int, token text)
	SERVER projcache OPTIONS (snapshot 'tokens');
GRANT SELECT ON tokens_ft TO regress_leak_reader, regress_leak_other;

-- The planner's row estimate, and the names EXPLAIN gives the scan.
CREATE FUNCTION estimated_rows(query text) RETURNS bigint LANGUAGE plpgsql AS $$
DECLARE
	plan json;
BEGIN
	EXECUTE 'EXPLAIN (FORMAT JSON) ' || query INTO plan;
	RETURN (plan -> 0 -> 'Plan' ->> 'Plan Rows')::bigint;
END $$;
CREATE FUNCTION explain_keys(query text) RETURNS SETOF text LANGUAGE plpgsql AS $$
DECLARE
	plan json;
BEGIN
	EXECUTE 'EXPLAIN (FORMAT JSON, VERBOSE) ' || query INTO plan;
	RETURN QUERY SELECT k FROM json_object_keys(plan -> 0 -> 'Plan') k
		WHERE k LIKE 'Snapshot%' OR k LIKE 'Key%' ORDER BY k;
END $$;

-- The reader loads it and sees all of it.
SET ROLE regress_leak_reader;
SELECT count(*) FROM tokens_ft;
EXPLAIN (COSTS OFF) SELECT * FROM tokens_ft WHERE id = 7;
SELECT estimated_rows('SELECT * FROM snap_leak.tokens_ft');
SELECT explain_keys('SELECT * FROM snap_leak.tokens_ft WHERE id = 7');
RESET ROLE;

--
-- 1. A role without the grant: EXPLAIN names the snapshot (as the table's
-- options do) and nothing else; the estimate is the default one, above
-- the scan too; EXPLAIN ANALYZE fails as the scan does.
--
SET ROLE regress_leak_other;
EXPLAIN (COSTS OFF) SELECT * FROM tokens_ft WHERE id = 7;
EXPLAIN (COSTS OFF, VERBOSE) SELECT * FROM tokens_ft WHERE id = 7;
EXPLAIN (COSTS OFF) SELECT * FROM tokens_ft;
SELECT explain_keys('SELECT * FROM snap_leak.tokens_ft WHERE id = 7');
SELECT estimated_rows('SELECT * FROM snap_leak.tokens_ft');
SELECT estimated_rows('SELECT count(*) FROM snap_leak.tokens_ft a JOIN snap_leak.tokens_ft b USING (id) GROUP BY a.token');
EXPLAIN (ANALYZE, COSTS OFF, TIMING OFF, SUMMARY OFF, BUFFERS OFF) SELECT * FROM tokens_ft;
EXPLAIN (ANALYZE, VERBOSE, COSTS OFF, TIMING OFF, SUMMARY OFF) SELECT * FROM tokens_ft WHERE id = 7;
SELECT * FROM tokens_ft;
RESET ROLE;

-- Through a view, the view's owner is the reader: a view of a role that
-- may not read it shows nothing even to one that may ...
CREATE VIEW other_v AS SELECT id, token FROM tokens_ft;
ALTER VIEW other_v OWNER TO regress_leak_other;
GRANT SELECT ON other_v TO regress_leak_reader;
SET ROLE regress_leak_reader;
EXPLAIN (COSTS OFF) SELECT * FROM other_v WHERE id = 7;
SELECT estimated_rows('SELECT * FROM snap_leak.other_v');
RESET ROLE;
-- ... and a view of a reader that may shows it to whom it grants the view.
CREATE VIEW reader_v AS SELECT id, token FROM tokens_ft;
ALTER VIEW reader_v OWNER TO regress_leak_reader;
GRANT SELECT ON reader_v TO regress_leak_other;
SET ROLE regress_leak_other;
EXPLAIN (COSTS OFF) SELECT * FROM reader_v WHERE id = 7;
SELECT estimated_rows('SELECT * FROM snap_leak.reader_v');
-- Planned through that view, kept, then shown after the view's owner
-- lost the grant: refused as the scan is, before any of the plan shows.
PREPARE through_view(int) AS SELECT * FROM reader_v WHERE id = $1;
SET plan_cache_mode = force_generic_plan;
EXPLAIN (COSTS OFF) EXECUTE through_view(7);
RESET ROLE;
SET ROLE regress_leak_owner;
SELECT projcache.revoke_snapshot('tokens', 'regress_leak_reader');
RESET ROLE;
SET ROLE regress_leak_other;
EXPLAIN EXECUTE through_view(7);
EXECUTE through_view(7);
DEALLOCATE through_view;
RESET plan_cache_mode;
RESET ROLE;
SET ROLE regress_leak_owner;
SELECT projcache.grant_snapshot('tokens', 'regress_leak_reader');
RESET ROLE;

-- A prepared statement planned by the reader, explained by another role:
-- planned again for that role, it shows nothing.
SET ROLE regress_leak_reader;
SET plan_cache_mode = force_generic_plan;
PREPARE by_id(int) AS SELECT token FROM tokens_ft WHERE id = $1;
EXPLAIN (COSTS OFF) EXECUTE by_id(7);
SELECT estimated_rows('SELECT * FROM snap_leak.tokens_ft');
SET ROLE regress_leak_other;
EXPLAIN (COSTS OFF) EXECUTE by_id(7);
EXPLAIN (COSTS OFF, VERBOSE) EXECUTE by_id(7);
EXECUTE by_id(7);
-- The same plan kept by the reader after a revoke: refused, not shown.
SET ROLE regress_leak_reader;
EXPLAIN (COSTS OFF) EXECUTE by_id(7);
RESET ROLE;
SET ROLE regress_leak_owner;
SELECT projcache.revoke_snapshot('tokens', 'regress_leak_reader');
RESET ROLE;
SET ROLE regress_leak_reader;
EXPLAIN EXECUTE by_id(7);
EXPLAIN (ANALYZE) EXECUTE by_id(7);
DEALLOCATE by_id;
RESET plan_cache_mode;
-- Planned again now: nothing of it.
EXPLAIN (COSTS OFF) SELECT * FROM tokens_ft WHERE id = 7;
SELECT estimated_rows('SELECT * FROM snap_leak.tokens_ft');
RESET ROLE;
SET ROLE regress_leak_owner;
SELECT projcache.grant_snapshot('tokens', 'regress_leak_reader');
RESET ROLE;

--
-- 2. System columns.  Through an inheritance parent, the rows of its
-- foreign child have the parent's system columns asked of them: refused,
-- as they are on the table itself, never another row's bytes.
--
CREATE SCHEMA snap_leak_mine AUTHORIZATION regress_leak_reader;
SET search_path = snap_leak_mine, snap_leak, public;
SET ROLE regress_leak_reader;
CREATE TABLE parent (id int, token text);
INSERT INTO parent VALUES (0, 'heap row');
CREATE FOREIGN TABLE child () INHERITS (parent)
	SERVER projcache OPTIONS (snapshot 'tokens');
SELECT count(*) FROM parent;
SELECT xmin FROM parent WHERE id > 0;
SELECT xmax FROM parent WHERE id > 0;
SELECT cmin FROM parent WHERE id > 0;
SELECT cmax FROM parent WHERE id > 0;
SELECT id FROM parent WHERE xmax::text <> '0';
SELECT id FROM parent ORDER BY cmin::text LIMIT 1;
SELECT xmin, xmax, cmin, cmax FROM child;
-- tableoid and ctid are defined: the child, and the invalid TID.
SELECT tableoid::regclass, ctid, count(*) FROM parent GROUP BY 1, 2 ORDER BY 1;
-- What the planner asks of each member of the tree (ctid, the whole row,
-- tableoid), for a row lock or the join of an UPDATE, works.
SELECT count(*) FROM (SELECT * FROM parent FOR UPDATE) l;
CREATE TABLE target (id int, token text);
INSERT INTO target VALUES (3, 'old');
UPDATE target t SET token = p.token FROM parent p WHERE p.id = t.id;
SELECT * FROM target;
SELECT count(*) FROM (SELECT p FROM parent p) w;

-- Another shape: a partition of a partitioned table.
CREATE TABLE parted (id int, token text) PARTITION BY RANGE (id);
CREATE TABLE parted_low PARTITION OF parted FOR VALUES FROM (MINVALUE) TO (1);
INSERT INTO parted VALUES (0, 'heap row');
CREATE FOREIGN TABLE parted_snap PARTITION OF parted FOR VALUES FROM (1) TO (MAXVALUE)
	SERVER projcache OPTIONS (snapshot 'tokens');
SELECT count(*) FROM parted;
SELECT xmin FROM parted;
SELECT xmax FROM parted WHERE id > 20;
SELECT cmin, cmax FROM parted;
SELECT id FROM parted WHERE xmin::text = '0';
SELECT tableoid::regclass, ctid, count(*) FROM parted GROUP BY 1, 2 ORDER BY 1;
-- And a UNION ALL of the foreign table itself.
SELECT xmin FROM (SELECT xmin, id FROM tokens_ft UNION ALL SELECT xmin, id FROM tokens_ft) u;
SELECT xmax FROM (SELECT xmax FROM tokens_ft UNION ALL SELECT '1'::xid) u;
RESET ROLE;

SET ROLE regress_leak_owner;
SELECT projcache.drop_snapshot('tokens');
RESET ROLE;
DROP SCHEMA snap_leak_mine CASCADE;
DROP SCHEMA snap_leak CASCADE;
REVOKE ALL ON SCHEMA projcache FROM regress_leak_owner, regress_leak_reader, regress_leak_other;
REVOKE ALL ON FOREIGN SERVER projcache FROM regress_leak_reader, regress_leak_other;
DROP OWNED BY regress_leak_owner, regress_leak_reader, regress_leak_other;
DROP ROLE regress_leak_owner, regress_leak_reader, regress_leak_other;
