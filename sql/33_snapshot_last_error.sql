--
-- Security release 1.1.1: projcache.snapshots shows a snapshot's last_error
-- (which may quote the source's rows) only to roles that may read it.
--
CREATE ROLE regress_le_owner;
CREATE ROLE regress_le_reader;
CREATE ROLE regress_le_other;
CREATE ROLE regress_le_monitor IN ROLE pg_monitor;
CREATE SCHEMA le AUTHORIZATION regress_le_owner;
GRANT USAGE ON SCHEMA projcache TO regress_le_owner, regress_le_reader,
	regress_le_other, regress_le_monitor;
GRANT EXECUTE ON FUNCTION projcache.create_snapshot(text, text, interval, text),
	projcache.drop_snapshot(text), projcache.grant_snapshot(text, regrole),
	projcache.refresh_snapshot(text), projcache.snapshots(), projcache.snapshots_1_2_1()
	TO regress_le_owner, regress_le_reader, regress_le_other, regress_le_monitor;
GRANT SELECT ON projcache.snapshots
	TO regress_le_owner, regress_le_reader, regress_le_other, regress_le_monitor;

SET ROLE regress_le_owner;
CREATE TABLE le.secrets (v text);
INSERT INTO le.secrets VALUES ('1');
SELECT projcache.create_snapshot('le_secret', 'SELECT v::int AS n FROM le.secrets', '1h');
SELECT projcache.grant_snapshot('le_secret', 'regress_le_reader');
SELECT projcache.refresh_snapshot('le_secret');
-- The source now holds a value whose cast error quotes it.
INSERT INTO le.secrets VALUES ('SECRET-TOKEN');
SELECT projcache.refresh_snapshot('le_secret');
SELECT name, rows, refresh_errors, last_error, status FROM projcache.snapshots ORDER BY name;
-- Another shape: a snapshot that never loaded (its cold start failed).
CREATE TABLE le.cold_secrets (v text);
INSERT INTO le.cold_secrets VALUES ('COLD-SECRET');
SELECT projcache.create_snapshot('le_cold', 'SELECT v::int AS n FROM le.cold_secrets', '1h');
SELECT projcache.grant_snapshot('le_cold', 'regress_le_reader');
SELECT projcache.refresh_snapshot('le_cold');
RESET ROLE;

-- A reader it was granted to sees the error, as the owner does ...
SET ROLE regress_le_reader;
SELECT name, rows, refresh_errors, last_error, status FROM projcache.snapshots ORDER BY name;
RESET ROLE;
-- ... a role that may not read it sees that it fails, not why ...
SET ROLE regress_le_other;
SELECT name, rows, refresh_errors, last_error, status FROM projcache.snapshots ORDER BY name;
RESET ROLE;
-- ... and neither does a monitoring role.
SET ROLE regress_le_monitor;
SELECT name, rows, refresh_errors, last_error, status FROM projcache.snapshots ORDER BY name;
RESET ROLE;
SELECT name, last_error FROM projcache.snapshots ORDER BY name;

SET ROLE regress_le_owner;
SELECT projcache.drop_snapshot('le_secret');
SELECT projcache.drop_snapshot('le_cold');
RESET ROLE;
DROP SCHEMA le CASCADE;
REVOKE ALL ON SCHEMA projcache FROM regress_le_owner, regress_le_reader,
	regress_le_other, regress_le_monitor;
REVOKE ALL ON FUNCTION projcache.create_snapshot(text, text, interval, text),
	projcache.drop_snapshot(text), projcache.grant_snapshot(text, regrole),
	projcache.refresh_snapshot(text), projcache.snapshots(), projcache.snapshots_1_2_1()
	FROM regress_le_owner, regress_le_reader, regress_le_other, regress_le_monitor;
REVOKE ALL ON projcache.snapshots
	FROM regress_le_owner, regress_le_reader, regress_le_other, regress_le_monitor;
DROP ROLE regress_le_owner, regress_le_reader, regress_le_other, regress_le_monitor;
