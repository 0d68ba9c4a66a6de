--
-- Snapshot cache privileges: reading needs the owner's grant (on top of
-- EXECUTE on the functions); only the owner (or a superuser) drops, grants
-- and revokes; the query runs as the owner, with the owner's privileges.
--
CREATE SCHEMA snap_priv;
CREATE TABLE snap_priv.secret (id int, payload text);
INSERT INTO snap_priv.secret VALUES (1, 'classified');
CREATE TABLE snap_priv.other_secret (id int);
INSERT INTO snap_priv.other_secret VALUES (7);

CREATE ROLE regress_snap_owner;
CREATE ROLE regress_snap_reader;
CREATE ROLE regress_snap_member IN ROLE regress_snap_reader;
CREATE ROLE regress_snap_other;
CREATE ROLE regress_snap_noexec;

-- Every role but regress_snap_noexec may call all the functions: what is
-- tested below is the snapshots' own access control.
GRANT USAGE ON SCHEMA projcache, snap_priv TO regress_snap_owner,
	regress_snap_reader, regress_snap_other, regress_snap_noexec;
GRANT EXECUTE ON FUNCTION projcache.create_snapshot(text, text, interval, text),
	projcache.drop_snapshot(text),
	projcache.grant_snapshot(text, regrole),
	projcache.revoke_snapshot(text, regrole),
	projcache.snapshot(text), projcache.snapshot(text, anyelement),
	projcache.refresh_snapshot(text), projcache.snapshots(), projcache.snapshots_1_2_1()
	TO regress_snap_owner, regress_snap_reader, regress_snap_other;
GRANT SELECT ON projcache.snapshots
	TO regress_snap_owner, regress_snap_reader, regress_snap_other;
GRANT SELECT ON snap_priv.secret TO regress_snap_owner;

-- The owner registers and reads its snapshot.
SET ROLE regress_snap_owner;
SELECT projcache.create_snapshot('secret', 'SELECT id, payload FROM snap_priv.secret');
SELECT * FROM projcache.snapshot('secret') AS t(id int, payload text);
SELECT name, owner, status FROM projcache.snapshots WHERE name = 'secret';
RESET ROLE;

-- Another role cannot read it, nor refresh it, nor manage it.
SET ROLE regress_snap_reader;
SELECT * FROM projcache.snapshot('secret') AS t(id int, payload text);
\echo SQLSTATE :LAST_ERROR_SQLSTATE
SELECT sqlstate_of($$SELECT * FROM projcache.snapshot('secret', NULL::snap_priv.secret)$$);
SELECT sqlstate_of($$SELECT projcache.refresh_snapshot('secret')$$);
SELECT sqlstate_of($$SELECT projcache.grant_snapshot('secret', 'regress_snap_reader')$$);
SELECT sqlstate_of($$SELECT projcache.revoke_snapshot('secret', 'regress_snap_owner')$$);
SELECT sqlstate_of($$SELECT projcache.drop_snapshot('secret')$$);
-- (nor the table itself)
SELECT sqlstate_of($$SELECT * FROM snap_priv.secret$$);
RESET ROLE;

-- The owner grants it (twice: no harm).
SET ROLE regress_snap_owner;
SELECT projcache.grant_snapshot('secret', 'regress_snap_reader');
SELECT projcache.grant_snapshot('secret', 'regress_snap_reader');
-- (the registry itself is not readable by the owner: only the functions)
SELECT sqlstate_of($$SELECT * FROM projcache.snapshot_registry$$);
RESET ROLE;
SELECT readers FROM projcache.snapshot_registry WHERE name = 'secret';

-- Now the reader reads, with the owner's privileges: rows of a table it
-- cannot SELECT itself.  That is by design.
SET ROLE regress_snap_reader;
SELECT * FROM projcache.snapshot('secret') AS t(id int, payload text);
SELECT * FROM projcache.snapshot('secret', NULL::snap_priv.secret);
SELECT sqlstate_of($$SELECT * FROM snap_priv.secret$$);
-- A reader may refresh; that does not make it an owner.
SELECT projcache.refresh_snapshot('secret');
SELECT sqlstate_of($$SELECT projcache.grant_snapshot('secret', 'regress_snap_other')$$);
SELECT sqlstate_of($$SELECT projcache.revoke_snapshot('secret', 'regress_snap_reader')$$);
SELECT sqlstate_of($$SELECT projcache.drop_snapshot('secret')$$);
RESET ROLE;

-- A member of a granted role reads too; an unrelated role still cannot.
SET ROLE regress_snap_member;
SELECT * FROM projcache.snapshot('secret') AS t(id int, payload text);
RESET ROLE;
SET ROLE regress_snap_other;
SELECT sqlstate_of($$SELECT * FROM projcache.snapshot('secret') AS t(id int, payload text)$$);
RESET ROLE;

-- The snapshot grant does not replace EXECUTE on the function.
SET ROLE regress_snap_owner;
SELECT projcache.grant_snapshot('secret', 'regress_snap_noexec');
RESET ROLE;
SET ROLE regress_snap_noexec;
SELECT sqlstate_of($$SELECT * FROM projcache.snapshot('secret') AS t(id int, payload text)$$);
RESET ROLE;

-- Revoked: the reader, and its member, are out again.
SET ROLE regress_snap_owner;
SELECT projcache.revoke_snapshot('secret', 'regress_snap_reader');
SELECT projcache.revoke_snapshot('secret', 'regress_snap_noexec');
RESET ROLE;
SELECT readers FROM projcache.snapshot_registry WHERE name = 'secret';
SET ROLE regress_snap_reader;
SELECT sqlstate_of($$SELECT * FROM projcache.snapshot('secret') AS t(id int, payload text)$$);
RESET ROLE;
SET ROLE regress_snap_member;
SELECT sqlstate_of($$SELECT * FROM projcache.snapshot('secret') AS t(id int, payload text)$$);
RESET ROLE;

-- A superuser may manage anyone's snapshot.
SELECT projcache.grant_snapshot('secret', 'regress_snap_other');
SET ROLE regress_snap_other;
SELECT * FROM projcache.snapshot('secret') AS t(id int, payload text);
RESET ROLE;
SELECT projcache.revoke_snapshot('secret', 'regress_snap_other');
SET ROLE regress_snap_other;
SELECT sqlstate_of($$SELECT * FROM projcache.snapshot('secret') AS t(id int, payload text)$$);
RESET ROLE;

-- The query runs as the owner.  Registering checks that the owner may run
-- it: a query on a table the owner may not read is refused.
SET ROLE regress_snap_owner;
SELECT sqlstate_of($$SELECT projcache.create_snapshot('not_mine', 'SELECT id FROM snap_priv.other_secret')$$);
RESET ROLE;
SELECT count(*) AS not_registered FROM projcache.snapshots WHERE name = 'not_mine';
-- Once the owner may read the table, it registers and loads.
GRANT SELECT ON snap_priv.other_secret TO regress_snap_owner;
SET ROLE regress_snap_owner;
SELECT projcache.create_snapshot('not_mine', 'SELECT id FROM snap_priv.other_secret');
RESET ROLE;
SELECT projcache.refresh_snapshot('not_mine');
SELECT * FROM projcache.snapshot('not_mine') AS t(id int);
-- Losing that privilege makes the next refresh fail and drops the cached
-- rows: last-good is for a failing source, not for lost rights.  Reads
-- fail with PC001, the permission error as the detail, even a superuser's.
REVOKE SELECT ON snap_priv.other_secret FROM regress_snap_owner;
SELECT projcache.refresh_snapshot('not_mine');
SELECT * FROM projcache.snapshot('not_mine') AS t(id int);
\echo SQLSTATE :LAST_ERROR_SQLSTATE
SELECT last_error, status FROM projcache.snapshots WHERE name = 'not_mine';

-- current_user inside the query is the owner, whoever reads or refreshes.
SET ROLE regress_snap_owner;
SELECT projcache.create_snapshot('whoami', 'SELECT current_user::text AS who');
SELECT projcache.grant_snapshot('whoami', 'regress_snap_reader');
RESET ROLE;
SET ROLE regress_snap_reader;
SELECT who FROM projcache.snapshot('whoami') AS t(who text);
RESET ROLE;
SELECT projcache.refresh_snapshot('whoami');
SELECT who FROM projcache.snapshot('whoami') AS t(who text);

-- The owner drops its snapshots.
SET ROLE regress_snap_owner;
SELECT projcache.drop_snapshot('secret');
SELECT projcache.drop_snapshot('whoami');
RESET ROLE;
-- And a superuser drops anyone's.
SELECT projcache.drop_snapshot('not_mine');
SELECT count(*) FROM projcache.snapshots
 WHERE name IN ('secret', 'not_mine', 'whoami');

DROP SCHEMA snap_priv CASCADE;
REVOKE ALL ON SCHEMA projcache FROM regress_snap_owner, regress_snap_reader,
	regress_snap_other, regress_snap_noexec;
DROP OWNED BY regress_snap_owner, regress_snap_reader, regress_snap_member,
	regress_snap_other, regress_snap_noexec;
DROP ROLE regress_snap_owner, regress_snap_reader, regress_snap_member,
	regress_snap_other, regress_snap_noexec;
