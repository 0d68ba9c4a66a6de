--
-- Nothing is usable by PUBLIC; GRANTs open what is needed.
--
INSERT INTO upstream VALUES ('priv-1', 'enabled', 'r1', '{"p": 1}');
SELECT projcache.get('priv-1', '10s');
CREATE ROLE pc_app LOGIN;
CREATE ROLE pc_operator LOGIN;

SET ROLE pc_app;
SELECT sqlstate_of($$SELECT projcache.get('priv-1')$$);
SELECT sqlstate_of($$SELECT * FROM projcache.entries$$);
RESET ROLE;

-- An application reads; an operator manages.
GRANT USAGE ON SCHEMA projcache TO pc_app, pc_operator;
GRANT EXECUTE ON FUNCTION projcache.get(text), projcache.get(text, interval),
	projcache.lookup(text, interval) TO pc_app;
GRANT EXECUTE ON FUNCTION projcache.fetch(text), projcache.invalidate(text),
	projcache.evict(text), projcache.reset_stats(),
	projcache.entries(), projcache.stats(),
	projcache.entries_1_2_1(), projcache.entries_1_3_1(), projcache.stats_1_2_1() TO pc_operator;
GRANT SELECT ON projcache.entries, projcache.stats TO pc_operator;

SET ROLE pc_app;
SELECT projcache.get('priv-1');
SELECT state FROM projcache.lookup('priv-1');
SELECT sqlstate_of($$SELECT projcache.invalidate('priv-1')$$);
SELECT sqlstate_of($$SELECT * FROM projcache.stats$$);
RESET ROLE;

SET ROLE pc_operator;
SELECT projcache.invalidate('priv-1');
SELECT count(*) > 0 AS sees_entries FROM projcache.entries;
-- The test clock stays superuser-only, even when granted.
RESET ROLE;
GRANT EXECUTE ON FUNCTION projcache.debug_advance_clock(interval) TO pc_operator;
SET ROLE pc_operator;
SELECT sqlstate_of($$SELECT projcache.debug_advance_clock('1s')$$);
RESET ROLE;

REVOKE ALL ON SCHEMA projcache FROM pc_app, pc_operator;
DROP OWNED BY pc_app, pc_operator;
DROP ROLE pc_app, pc_operator;
