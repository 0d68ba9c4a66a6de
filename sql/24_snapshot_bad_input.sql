--
-- Snapshot cache, bad input: NULLs, unknown names, invalid names, TTLs and
-- queries.  Each error has its own SQLSTATE (never XX000), and nothing bad
-- gets registered.
--
CREATE SCHEMA snap_input;
CREATE TABLE snap_input.t (id int, v text);
INSERT INTO snap_input.t VALUES (1, 'a');

-- NULLs: no snapshot, no rows; the STRICT functions return NULL; a NULL
-- given to create_snapshot is an error.
SELECT * FROM projcache.snapshot(NULL) AS t(id int);
SELECT * FROM projcache.snapshot(NULL, NULL::snap_input.t);
SELECT projcache.refresh_snapshot(NULL);
SELECT projcache.drop_snapshot(NULL);
SELECT projcache.grant_snapshot(NULL, current_user::regrole);
SELECT projcache.revoke_snapshot('x', NULL);
SELECT sqlstate_of($$SELECT projcache.create_snapshot(NULL, 'SELECT 1')$$);
SELECT sqlstate_of($$SELECT projcache.create_snapshot('n', NULL)$$);
SELECT sqlstate_of($$SELECT projcache.create_snapshot('n', 'SELECT 1', NULL)$$);

-- Unknown snapshots.
SELECT sqlstate_of($$SELECT * FROM projcache.snapshot('nope') AS t(id int)$$);
SELECT sqlstate_of($$SELECT * FROM projcache.snapshot('nope', NULL::snap_input.t)$$);
SELECT sqlstate_of($$SELECT projcache.refresh_snapshot('nope')$$);
SELECT sqlstate_of($$SELECT projcache.drop_snapshot('nope')$$);
SELECT sqlstate_of($$SELECT projcache.grant_snapshot('nope', current_user::regrole)$$);
SELECT sqlstate_of($$SELECT projcache.revoke_snapshot('nope', current_user::regrole)$$);
-- An unknown role, caught by the regrole input.
SELECT sqlstate_of($$SELECT projcache.grant_snapshot('nope', 'regress_no_such_role')$$);

-- Names: 1 to 63 characters among letters, digits, "_", "-" and ".".
SELECT sqlstate_of($$SELECT projcache.create_snapshot('', 'SELECT 1')$$);
SELECT sqlstate_of($$SELECT projcache.create_snapshot(repeat('x', 64), 'SELECT 1')$$);
SELECT sqlstate_of($$SELECT projcache.create_snapshot('with space', 'SELECT 1')$$);
SELECT sqlstate_of($$SELECT projcache.create_snapshot('semi;colon', 'SELECT 1')$$);
SELECT sqlstate_of($$SELECT projcache.create_snapshot('quo"te', 'SELECT 1')$$);
SELECT sqlstate_of($$SELECT projcache.create_snapshot('dollar$', 'SELECT 1')$$);
SELECT sqlstate_of($$SELECT projcache.create_snapshot('slash/', 'SELECT 1')$$);
SELECT projcache.create_snapshot(repeat('x', 63), 'SELECT 1 AS one');
SELECT projcache.create_snapshot('Az09_-.', 'SELECT 1 AS one');
SELECT * FROM projcache.snapshot('Az09_-.') AS t(one int);
-- Names are case-sensitive.
SELECT sqlstate_of($$SELECT * FROM projcache.snapshot('az09_-.') AS t(one int)$$);

-- A duplicate name.
SELECT projcache.create_snapshot('dup', 'SELECT 1 AS one');
SELECT sqlstate_of($$SELECT projcache.create_snapshot('dup', 'SELECT 2 AS two')$$);
SELECT * FROM projcache.snapshot('dup') AS t(one int);

-- TTLs: positive, at least a millisecond, and not in months.
SELECT sqlstate_of($$SELECT projcache.create_snapshot('ttl', 'SELECT 1', '0')$$);
SELECT sqlstate_of($$SELECT projcache.create_snapshot('ttl', 'SELECT 1', '-1s')$$);
SELECT sqlstate_of($$SELECT projcache.create_snapshot('ttl', 'SELECT 1', '0.5ms')$$);
SELECT sqlstate_of($$SELECT projcache.create_snapshot('ttl', 'SELECT 1', '1 mon')$$);
SELECT sqlstate_of($$SELECT projcache.create_snapshot('ttl', 'SELECT 1', '1 year')$$);
SELECT sqlstate_of($$SELECT projcache.create_snapshot('ttl', 'SELECT 1', '1 day -86400s')$$);
SELECT projcache.create_snapshot('ttl_ms', 'SELECT 1 AS one', '1ms');
SELECT projcache.create_snapshot('ttl_day', 'SELECT 1 AS one', '2 days');
SELECT projcache.create_snapshot('ttl_default', 'SELECT 1 AS one');
SELECT name, ttl FROM projcache.snapshots
 WHERE name IN ('ttl_ms', 'ttl_day', 'ttl_default') ORDER BY name;

-- Queries: one statement, parsed at once, with the safe search_path.
SELECT sqlstate_of($$SELECT projcache.create_snapshot('q', 'SELEC 1')$$);
SELECT sqlstate_of($$SELECT projcache.create_snapshot('q', 'SELECT * FROM snap_input.missing')$$);
SELECT sqlstate_of($$SELECT projcache.create_snapshot('q', 'SELECT nope FROM snap_input.t')$$);
SELECT sqlstate_of($$SELECT projcache.create_snapshot('q', 'SELECT snap_input.no_such_function()')$$);
-- Unqualified names are bound at creation with the creator's search path.
SET search_path = snap_input, public;
SELECT sqlstate_of($$SELECT projcache.create_snapshot('q', 'SELECT * FROM t')$$);
SELECT projcache.drop_snapshot('q');
RESET search_path;
SELECT sqlstate_of($$SELECT projcache.create_snapshot('q', 'SELECT $1::int')$$);
-- Not a single SELECT returning rows.
SELECT sqlstate_of($$SELECT projcache.create_snapshot('q', '')$$);
SELECT sqlstate_of($$SELECT projcache.create_snapshot('q', '-- just a comment')$$);
SELECT sqlstate_of($$SELECT projcache.create_snapshot('q', 'SELECT 1; SELECT 2')$$);
SELECT sqlstate_of($$SELECT projcache.create_snapshot('q', 'SELECT 1 AS one; DELETE FROM snap_input.t')$$);
SELECT sqlstate_of($$SELECT projcache.create_snapshot('q', 'INSERT INTO snap_input.t VALUES (2, ''b'')')$$);
SELECT sqlstate_of($$SELECT projcache.create_snapshot('q', 'INSERT INTO snap_input.t VALUES (2, ''b'') RETURNING *')$$);
SELECT sqlstate_of($$SELECT projcache.create_snapshot('q', 'UPDATE snap_input.t SET v = v RETURNING *')$$);
SELECT sqlstate_of($$SELECT projcache.create_snapshot('q', 'DELETE FROM snap_input.t RETURNING *')$$);
SELECT sqlstate_of($$SELECT projcache.create_snapshot('q', 'SELECT 1 INTO snap_input.new_table')$$);
SELECT sqlstate_of($$SELECT projcache.create_snapshot('q', 'CREATE TABLE snap_input.new_table AS SELECT 1')$$);
SELECT sqlstate_of($$SELECT projcache.create_snapshot('q', 'EXPLAIN SELECT 1')$$);
SELECT sqlstate_of($$SELECT projcache.create_snapshot('q', 'SHOW search_path')$$);
SELECT sqlstate_of($$SELECT projcache.create_snapshot('q', 'DECLARE c CURSOR FOR SELECT 1')$$);
-- Not read-only.
SELECT sqlstate_of($$SELECT projcache.create_snapshot('q', 'WITH d AS (DELETE FROM snap_input.t RETURNING *) SELECT * FROM d')$$);
SELECT sqlstate_of($$SELECT projcache.create_snapshot('q', 'SELECT * FROM snap_input.t FOR UPDATE')$$);
SELECT sqlstate_of($$SELECT projcache.create_snapshot('q', 'SELECT * FROM snap_input.t FOR SHARE')$$);
-- A column of a pseudo-type cannot be stored.
SELECT sqlstate_of($$SELECT projcache.create_snapshot('q', 'SELECT ROW(1, 2)')$$);
-- None of that registered anything, and nothing ran: the table is intact.
SELECT count(*) FROM projcache.snapshots WHERE name IN ('q', 'ttl', 'n', '');
SELECT * FROM snap_input.t;

-- Forms of a SELECT that are fine.
SELECT projcache.create_snapshot('values', 'VALUES (1, ''x''), (2, ''y'')');
SELECT * FROM projcache.snapshot('values') AS t(a int, b text) ORDER BY a;
SELECT projcache.create_snapshot('table', 'TABLE snap_input.t');
SELECT * FROM projcache.snapshot('table', NULL::snap_input.t);
SELECT projcache.create_snapshot('union', 'SELECT 1 AS n UNION ALL SELECT 2 ORDER BY 1');
SELECT * FROM projcache.snapshot('union') AS t(n int);
SELECT projcache.create_snapshot('with', 'WITH w AS (SELECT id FROM snap_input.t) SELECT * FROM w;');
SELECT * FROM projcache.snapshot('with') AS t(id int);
-- An untyped literal becomes text.
SELECT projcache.create_snapshot('literal', 'SELECT ''lit'' AS l');
SELECT * FROM projcache.snapshot('literal') AS t(l text);

-- The untyped form needs a column definition list, in FROM.
SELECT sqlstate_of($$SELECT * FROM projcache.snapshot('values')$$);
SELECT sqlstate_of($$SELECT projcache.snapshot('values')$$);

SELECT projcache.drop_snapshot(name) FROM projcache.snapshots
 WHERE name IN (repeat('x', 63), 'Az09_-.', 'dup', 'ttl_ms', 'ttl_day', 'ttl_default',
				'values', 'table', 'union', 'with', 'literal');
DROP SCHEMA snap_input CASCADE;
