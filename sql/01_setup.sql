--
-- Setup shared by the key cache tests: the extension, an upstream table the
-- tests control, and a fetch function over it.
--
CREATE EXTENSION projcache;

-- Poll a condition (a boolean SQL expression) for up to timeout seconds.
CREATE FUNCTION wait_for(cond text, timeout float8 DEFAULT 10)
RETURNS boolean LANGUAGE plpgsql AS $$
DECLARE
	deadline timestamptz := clock_timestamp() + make_interval(secs => timeout);
	ok boolean;
BEGIN
	LOOP
		EXECUTE 'SELECT ' || cond INTO ok;
		IF ok THEN
			RETURN true;
		END IF;
		IF clock_timestamp() > deadline THEN
			RAISE WARNING 'timed out waiting for: %', cond;
			RETURN false;
		END IF;
		PERFORM pg_sleep(0.01);
	END LOOP;
END $$;

-- Reload the configuration and wait until the worker has applied it.
CREATE FUNCTION reload_and_wait() RETURNS boolean LANGUAGE plpgsql AS $$
DECLARE
	gen bigint := (SELECT config_generation FROM projcache.stats);
BEGIN
	PERFORM pg_reload_conf();
	RETURN wait_for(format('(SELECT config_generation > %s FROM projcache.stats)', gen));
END $$;

-- The SQLSTATE and message of a statement's error, or 'ok'.
CREATE FUNCTION sqlstate_of(query text) RETURNS text LANGUAGE plpgsql AS $$
BEGIN
	EXECUTE query;
	RETURN 'ok';
EXCEPTION WHEN OTHERS THEN
	RETURN SQLSTATE || ': ' || SQLERRM;
END $$;

-- The source of truth.
CREATE TABLE upstream (
	key text PRIMARY KEY,
	state text NOT NULL DEFAULT 'enabled',
	revision text,
	config jsonb
);

-- How the fetch function misbehaves: 'normal' or one failure mode.
CREATE TABLE behaviour (mode text NOT NULL);
INSERT INTO behaviour VALUES ('normal');

-- Every call of the fetch function.
CREATE TABLE calls (
	id serial PRIMARY KEY,
	keys text[],
	revisions text[]
);

CREATE FUNCTION test_fetch(keys text[], revisions text[])
RETURNS TABLE(key text, state text, revision text, config jsonb)
LANGUAGE plpgsql AS $$
DECLARE
	mode text := (SELECT b.mode FROM behaviour b);
BEGIN
	INSERT INTO calls(keys, revisions) VALUES (keys, revisions);
	IF mode = 'error' THEN
		RAISE EXCEPTION 'upstream exploded';
	ELSIF mode = 'sleep' THEN
		PERFORM pg_sleep(30);
	ELSIF mode = 'null_key' THEN
		RETURN QUERY SELECT NULL::text, 'enabled'::text, 'x'::text, '{}'::jsonb;
		RETURN;
	ELSIF mode = 'extra_key' THEN
		RETURN QUERY SELECT 'never-asked'::text, 'enabled'::text, 'x'::text, '{}'::jsonb;
		RETURN;
	END IF;

	RETURN QUERY
		SELECT u.key,
			   CASE
				   WHEN mode = 'unknown_state' THEN 'bogus'
				   WHEN u.state = 'enabled' AND r.rev IS NOT NULL
						AND u.revision = r.rev THEN 'not_modified'
				   ELSE u.state
			   END,
			   u.revision,
			   u.config
		  FROM unnest(keys, revisions) AS r(key, rev)
		  JOIN upstream u ON u.key = r.key;
	IF mode = 'duplicate' THEN
		RETURN QUERY
			SELECT u.key, u.state, u.revision, u.config
			  FROM upstream u WHERE u.key = ANY (keys);
	END IF;
END $$;

-- The worker starts in this database once it exists: wait for it.
SELECT wait_for('(SELECT worker_pid IS NOT NULL FROM projcache.stats)', 30);

ALTER SYSTEM SET projcache.fetch_function = 'public.test_fetch';
SELECT reload_and_wait();
