--
-- Snapshot readers' cache: each backend keeps a snapshot's registration
-- and who may read it, so that a read does no catalog work while nothing
-- changed.  Every change still takes effect at the next read, in this one
-- session whose cache is warm: revoke, grant, SET ROLE, role membership
-- and attributes, the owner, drop and re-create, and a rolled-back change
-- leaves no trace.  (Changes made by another session: the isolation spec
-- snapshot_reader_cache.)
--
CREATE SCHEMA snap_rc;
CREATE TABLE snap_rc.src (id int, label text);
INSERT INTO snap_rc.src VALUES (1, 'one'), (2, 'two');

CREATE ROLE regress_rc_owner;
CREATE ROLE regress_rc_reader;
CREATE ROLE regress_rc_group;
CREATE ROLE regress_rc_other;
GRANT USAGE ON SCHEMA projcache, snap_rc TO regress_rc_owner,
	regress_rc_reader, regress_rc_group, regress_rc_other;
GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA projcache TO regress_rc_owner,
	regress_rc_reader, regress_rc_group, regress_rc_other;
GRANT SELECT ON snap_rc.src TO regress_rc_owner;

-- What the current user is served: the rows, or the error.
CREATE FUNCTION snap_rc.try_read() RETURNS text LANGUAGE plpgsql AS $$
BEGIN
	RETURN (SELECT string_agg(t.id || ' ' || t.label, ', ' ORDER BY t.id)
			  FROM projcache.snapshot('rc') AS t(id int, label text));
EXCEPTION WHEN OTHERS THEN
	RETURN SQLSTATE || ': ' || SQLERRM;
END $$;

SET ROLE regress_rc_owner;
SELECT projcache.create_snapshot('rc', 'SELECT id, label FROM snap_rc.src', '1h');
SELECT projcache.grant_snapshot('rc', 'regress_rc_reader');
RESET ROLE;

-- Warm the cache: the reader reads twice (the second read is served from
-- it), the other role is refused.
SET ROLE regress_rc_reader;
SELECT snap_rc.try_read();
SELECT snap_rc.try_read();
SET ROLE regress_rc_other;
SELECT snap_rc.try_read();
RESET ROLE;

-- Served from the cache, a read asks the registry nothing: in one
-- transaction, reads add no scan of it to the transaction's counts.
SET ROLE regress_rc_reader;
BEGIN;
SELECT snap_rc.try_read();
SELECT coalesce((SELECT seq_scan + coalesce(idx_scan, 0) FROM pg_stat_xact_user_tables
				  WHERE relid = 'projcache.snapshot_registry'::regclass), 0) AS registry_scans \gset
SELECT snap_rc.try_read();
SELECT snap_rc.try_read();
SELECT coalesce((SELECT seq_scan + coalesce(idx_scan, 0) FROM pg_stat_xact_user_tables
				  WHERE relid = 'projcache.snapshot_registry'::regclass), 0)
	   - :registry_scans AS more_registry_scans;
COMMIT;
RESET ROLE;

-- 1. A revoke takes effect at the reader's next read.
SET ROLE regress_rc_owner;
SELECT projcache.revoke_snapshot('rc', 'regress_rc_reader');
SET ROLE regress_rc_reader;
SELECT snap_rc.try_read();
-- 2. And a grant.
SET ROLE regress_rc_owner;
SELECT projcache.grant_snapshot('rc', 'regress_rc_reader');
SET ROLE regress_rc_reader;
SELECT snap_rc.try_read();
RESET ROLE;

-- 3. The verdict is the current user's: SET ROLE to a role without the
-- grant is refused, and back is allowed, within one transaction too.
BEGIN;
SET LOCAL ROLE regress_rc_reader;
SELECT snap_rc.try_read();
SET LOCAL ROLE regress_rc_other;
SELECT snap_rc.try_read();
SET LOCAL ROLE regress_rc_reader;
SELECT snap_rc.try_read();
COMMIT;
-- Also for the typed form, and a SECURITY DEFINER function is checked as
-- its owner.
CREATE FUNCTION snap_rc.read_as_definer() RETURNS text LANGUAGE sql
	SECURITY DEFINER AS $$ SELECT snap_rc.try_read() $$;
ALTER FUNCTION snap_rc.read_as_definer() OWNER TO regress_rc_reader;
SET ROLE regress_rc_other;
SELECT count(*) FROM projcache.snapshot('rc', NULL::snap_rc.src);
SELECT snap_rc.read_as_definer();
SET ROLE regress_rc_reader;
SELECT count(*) FROM projcache.snapshot('rc', NULL::snap_rc.src);
RESET ROLE;

-- 4. Role membership: a grant to a group is read by its members; joining
-- and leaving the group take effect at once.
SET ROLE regress_rc_owner;
SELECT projcache.grant_snapshot('rc', 'regress_rc_group');
SET ROLE regress_rc_other;
SELECT snap_rc.try_read();
RESET ROLE;
GRANT regress_rc_group TO regress_rc_other;
SET ROLE regress_rc_other;
SELECT snap_rc.try_read();
RESET ROLE;
REVOKE regress_rc_group FROM regress_rc_other;
SET ROLE regress_rc_other;
SELECT snap_rc.try_read();
RESET ROLE;
-- Role attributes: a superuser reads everything, NOINHERIT cuts the
-- group's grant.  (From 16 on, whether a member inherits is a grant's
-- option, which the role's NOINHERIT only sets for new grants: there the
-- grant itself is made WITH INHERIT FALSE.)
ALTER ROLE regress_rc_other SUPERUSER;
SET ROLE regress_rc_other;
SELECT snap_rc.try_read();
RESET ROLE;
ALTER ROLE regress_rc_other NOSUPERUSER;
SET ROLE regress_rc_other;
SELECT snap_rc.try_read();
RESET ROLE;
GRANT regress_rc_group TO regress_rc_other;
SET ROLE regress_rc_other;
SELECT snap_rc.try_read();
RESET ROLE;
ALTER ROLE regress_rc_other NOINHERIT;
DO $$
BEGIN
	IF current_setting('server_version_num')::int >= 160000 THEN
		EXECUTE 'GRANT regress_rc_group TO regress_rc_other WITH INHERIT FALSE';
	END IF;
END
$$;
SET ROLE regress_rc_other;
SELECT snap_rc.try_read();
RESET ROLE;
ALTER ROLE regress_rc_other INHERIT;
REVOKE regress_rc_group FROM regress_rc_other;

-- 5. The owner is the owner of the view behind the snapshot: REASSIGN
-- OWNED makes another role the owner, which reads without a grant, and
-- the old owner is refused (it has no grant).
SET ROLE regress_rc_owner;
SELECT snap_rc.try_read();
RESET ROLE;
REASSIGN OWNED BY regress_rc_owner TO regress_rc_other;
SELECT owner FROM projcache.snapshots WHERE name = 'rc';
SET ROLE regress_rc_other;
SELECT snap_rc.try_read();
SET ROLE regress_rc_owner;
SELECT snap_rc.try_read();
RESET ROLE;
REASSIGN OWNED BY regress_rc_other TO regress_rc_owner;
SET ROLE regress_rc_owner;
SELECT snap_rc.try_read();
SET ROLE regress_rc_other;
SELECT snap_rc.try_read();
RESET ROLE;

-- 6. A rolled-back grant (or one rolled back to a savepoint) does not take
-- effect, nor does a rolled-back revoke; inside the transaction, its own
-- change is seen.
SET ROLE regress_rc_other;
SELECT snap_rc.try_read();
RESET ROLE;
BEGIN;
SELECT projcache.grant_snapshot('rc', 'regress_rc_other');
SET LOCAL ROLE regress_rc_other;
SELECT snap_rc.try_read();
ROLLBACK;
SET ROLE regress_rc_other;
SELECT snap_rc.try_read();
RESET ROLE;
BEGIN;
SAVEPOINT s;
SELECT projcache.grant_snapshot('rc', 'regress_rc_other');
ROLLBACK TO SAVEPOINT s;
SET LOCAL ROLE regress_rc_other;
SELECT snap_rc.try_read();
COMMIT;
SET ROLE regress_rc_other;
SELECT snap_rc.try_read();
RESET ROLE;
BEGIN;
SELECT projcache.revoke_snapshot('rc', 'regress_rc_reader');
SET LOCAL ROLE regress_rc_reader;
SELECT snap_rc.try_read();
ROLLBACK;
SET ROLE regress_rc_reader;
SELECT snap_rc.try_read();
RESET ROLE;

-- 7. Dropped: the next read says it does not exist, in the dropping
-- transaction too; a rolled-back drop leaves it readable.
BEGIN;
SELECT projcache.drop_snapshot('rc');
SELECT snap_rc.try_read();
ROLLBACK;
SET ROLE regress_rc_reader;
SELECT snap_rc.try_read();
RESET ROLE;
SELECT projcache.drop_snapshot('rc');
SET ROLE regress_rc_reader;
SELECT snap_rc.try_read();
SELECT * FROM projcache.snapshot('rc') AS t(id int, label text);
RESET ROLE;

-- 8. Created again with other columns: a read checks the new ones.  While
-- the creating transaction runs, the snapshot is not loaded yet.
SET ROLE regress_rc_owner;
BEGIN;
SELECT projcache.create_snapshot('rc', 'SELECT label, id::bigint AS id FROM snap_rc.src', '1h');
SELECT sqlstate_of($$SELECT * FROM projcache.snapshot('rc') AS t(label text, id bigint)$$);
COMMIT;
SELECT projcache.grant_snapshot('rc', 'regress_rc_reader');
SET ROLE regress_rc_reader;
SELECT * FROM projcache.snapshot('rc') AS t(id int, label text);
SELECT * FROM projcache.snapshot('rc', NULL::snap_rc.src);
SELECT * FROM projcache.snapshot('rc') AS t(label text, id bigint) ORDER BY id;
SELECT * FROM projcache.snapshot('rc') AS t(label text, id bigint) ORDER BY id;
RESET ROLE;

-- A name too long to be a snapshot's is still "does not exist".
SELECT sqlstate_of($$SELECT * FROM projcache.snapshot(repeat('x', 70)) AS t(a int)$$);

SELECT projcache.drop_snapshot('rc');
DROP SCHEMA snap_rc CASCADE;
DROP OWNED BY regress_rc_owner, regress_rc_reader, regress_rc_group,
	regress_rc_other;
DROP ROLE regress_rc_owner, regress_rc_reader, regress_rc_group,
	regress_rc_other;
