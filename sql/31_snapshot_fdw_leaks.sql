--
-- Security release 1.1.1: what a foreign table on a snapshot shows.
--
-- Snapshot rows have no transaction header: xmin, xmax, cmin and cmax are
-- refused wherever they are asked for (the table, an inheritance parent, a
-- partitioned table, a UNION ALL), never read from the bytes of another
-- row; tableoid and ctid (always invalid) are defined.
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

--
-- System columns.  Through an inheritance parent, the rows of its
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
