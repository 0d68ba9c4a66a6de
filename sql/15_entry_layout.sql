--
-- Entries' layout: each key is one chunk sized to what it holds (a 44-byte
-- header, the key's bytes, then only the parts it has: retry time, last
-- error, own periods, revision, config), cut in two when its allocator
-- size class would waste much, and built anew when a part comes or a value
-- changes.  Every value must come back exactly as the source gave it:
-- across the size classes and the cut, for keys of 1 to 1024 bytes, for
-- revisions of every length, and through the rebuilds that pending
-- answers, failed fetches, periods and new values cause.  The table-driven
-- checks print counts of mismatches only (all 0).
--
SELECT current_setting('projcache.fetch_function') AS saved_fetch_function \gset

-- Text of n bytes, different for every seed and never repeating itself, so
-- that a byte out of place shows.
CREATE FUNCTION layout_text(seed text, n int) RETURNS text
LANGUAGE sql IMMUTABLE AS $$
	SELECT left(string_agg(md5(seed || ':' || i), '' ORDER BY i), n)
	  FROM generate_series(0, n / 32) AS i
$$;

-- A jsonb whose size (pg_column_size in memory, what the cache stores and
-- entries.value_bytes shows) is exactly n bytes: '{}' is 8, a string of k
-- bytes 12 + k, so 9 to 11 cannot be had (NULL).  Larger ones are objects
-- with an array of every scalar type, the text last so that its length
-- moves the size byte for byte.
CREATE FUNCTION layout_json(seed text, n int) RETURNS jsonb
LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
	base jsonb := jsonb_build_object('k', md5(seed),
									 'n', jsonb_build_array(1, 2.5, true, null, 'x'),
									 'z', '');
	v jsonb;
BEGIN
	IF n IS NULL THEN
		RETURN NULL;
	ELSIF n = 8 THEN
		v := '{}';
	ELSIF n < 12 THEN
		RETURN NULL;
	ELSIF n < pg_column_size(base) + 16 THEN
		v := to_jsonb(layout_text(seed, n - 12));
	ELSE
		v := jsonb_set(base, '{z}',
					   to_jsonb(layout_text(seed, n - pg_column_size(base))));
	END IF;
	IF pg_column_size(v) <> n THEN
		RAISE EXCEPTION 'layout_json(%, %) made % bytes', seed, n, pg_column_size(v);
	END IF;
	RETURN v;
END $$;

-- The source.  state and the value columns are what the cache must hold
-- once it has the source's answer; 'answer' says how the source answers
-- meanwhile: with its row ('value'), 'pending', or 'fail' (an ERROR for
-- that key alone).  nbytes is the config's size.
CREATE TABLE layout_src (
	key text PRIMARY KEY,
	grp text NOT NULL,
	state text NOT NULL DEFAULT 'enabled',
	revision text,
	config jsonb,
	nbytes int,
	max_age interval,
	stale_for interval,
	answer text NOT NULL DEFAULT 'value'
);
-- down: every call fails with a connection error (the whole batch at once).
CREATE TABLE layout_mode (down boolean NOT NULL);
INSERT INTO layout_mode VALUES (false);
-- The revision the worker last passed for each key, in calls that succeeded.
CREATE TABLE layout_seen (key text PRIMARY KEY, calls int NOT NULL, rev text);

CREATE FUNCTION layout_fetch(keys text[], revisions text[])
RETURNS TABLE(key text, state text, revision text, config jsonb,
			  max_age interval, stale_for interval)
LANGUAGE plpgsql AS $$
BEGIN
	INSERT INTO layout_seen AS s
		SELECT r.key, 1, r.rev FROM unnest(keys, revisions) AS r(key, rev)
	ON CONFLICT ON CONSTRAINT layout_seen_pkey
		DO UPDATE SET calls = s.calls + 1, rev = excluded.rev;
	IF (SELECT m.down FROM layout_mode m) THEN
		RAISE EXCEPTION 'layout source is down' USING ERRCODE = 'connection_failure';
	END IF;
	IF EXISTS (SELECT FROM layout_src s WHERE s.key = ANY (keys) AND s.answer = 'fail') THEN
		RAISE EXCEPTION 'layout source failed';
	END IF;
	RETURN QUERY
		SELECT s.key,
			   CASE
				   WHEN s.answer = 'pending' THEN 'pending'
				   WHEN s.state = 'enabled' AND r.rev IS NOT NULL
						AND s.revision = r.rev THEN 'not_modified'
				   ELSE s.state
			   END,
			   s.revision, s.config, s.max_age, s.stale_for
		  FROM unnest(keys, revisions) AS r(key, rev)
		  JOIN layout_src s ON s.key = r.key;
END $$;

ALTER SYSTEM SET projcache.fetch_function = 'public.layout_fetch';
SELECT reload_and_wait();

-- A key of exactly n bytes: prefix, then two-byte characters, then an
-- ASCII one if need be.
CREATE FUNCTION layout_key(prefix text, n int) RETURNS text
LANGUAGE sql IMMUTABLE AS $$
	SELECT prefix || repeat('é', (n - octet_length(prefix)) / 2) ||
		   repeat('x', (n - octet_length(prefix)) % 2)
$$;

-- s: configs of every size from 8 to 300 bytes, short revisions, no periods.
INSERT INTO layout_src (key, grp, revision, config, nbytes)
	SELECT 'lay-s-' || lpad(n::text, 4, '0'), 's', 'rs' || n,
		   layout_json('s' || n, n), n
	  FROM generate_series(8, 300) AS n WHERE n = 8 OR n >= 12;

-- p: the same sizes with a revision of 300 bytes (its length in 4 bytes)
-- and periods of their own, different for every key.
INSERT INTO layout_src (key, grp, revision, config, nbytes, max_age, stale_for)
	SELECT 'lay-p-' || lpad(n::text, 4, '0') || '-abcd', 'p',
		   layout_text('prev' || n, 300), layout_json('p' || n, n), n,
		   make_interval(secs => 1000 + n), make_interval(secs => 2000 + n)
	  FROM generate_series(8, 300) AS n WHERE n = 8 OR n >= 12;

-- b: 90 to 30 bytes under each size class from 512 bytes up, and under 3
-- and 4 pages, so that header and body cross each class's end, whole or
-- cut in two; and an uneven spread up to 50000 bytes.
INSERT INTO layout_src (key, grp, revision, config, nbytes)
	SELECT 'lay-b-' || lpad(n::text, 5, '0'), 'b', 'rb' || n,
		   layout_json('b' || n, n), n
	  FROM (SELECT DISTINCT c + d AS n
			  FROM unnest(ARRAY[512, 640, 768, 896, 1024, 1280, 1560, 1816, 2048,
								2616, 3120, 3640, 4096, 5456, 6552, 7280, 8192,
								12288, 16384]) AS c,
				   generate_series(-90, -30) AS d
			UNION
			SELECT unnest(ARRAY[500, 777, 1000, 1023, 1024, 1025, 1111, 1279,
								1280, 1281, 1500, 2222, 3000, 4095, 4096, 4097,
								4444, 5000, 6000, 7777, 8191, 8192, 8193, 8500,
								9000, 10001, 20000, 50000])) AS sizes;

-- r: revisions of 0 (empty), NULL, 1, 254, 255, 256, 1000 and 5000 bytes,
-- each with small and large configs.
INSERT INTO layout_src (key, grp, revision, config, nbytes)
	SELECT format('lay-r-%s-%s', coalesce(rl::text, 'null'), n), 'r',
		   CASE WHEN rl IS NOT NULL
				THEN layout_text(format('rrev-%s-%s', rl, n), rl) END,
		   layout_json(format('r-%s-%s', rl, n), n), n
	  FROM unnest(ARRAY[0, NULL, 1, 254, 255, 256, 1000, 5000]) AS rl,
		   unnest(ARRAY[8, 13, 100, 300, 1000, 4000, 8200, 9000]) AS n;

-- k: keys of 1, 13, 14, 40, 100 and 1024 bytes (the longest allowed), each
-- disabled (no config) or with configs of many sizes.
INSERT INTO layout_src (key, grp, state, revision, config, nbytes)
	SELECT CASE WHEN kl = 1 THEN chr(ascii('!') + i)
				ELSE layout_key(format('lay-k%s-%s-', kl, i), kl) END,
		   'k', CASE WHEN n IS NULL THEN 'disabled' ELSE 'enabled' END,
		   CASE WHEN i % 3 = 0 THEN layout_text(format('krev%s-%s', kl, i), 255 + i)
				ELSE 'rk' || i END,
		   layout_json(format('k%s-%s', kl, i), n), n
	  FROM unnest(ARRAY[1, 13, 14, 40, 100, 1024]) AS kl,
		   (SELECT n, i::int AS i
			  FROM unnest(ARRAY[NULL, 8, 12, 13, 20, 27, 28, 29, 100, 500, 1000,
								2000, 4096, 9000]) WITH ORDINALITY AS sizes(n, i)) AS sizes;

SELECT grp, count(*) AS keys, min(octet_length(key)) AS min_key_bytes,
	   max(octet_length(key)) AS max_key_bytes, min(nbytes) AS min_config,
	   max(nbytes) AS max_config, count(DISTINCT nbytes) AS config_sizes,
	   count(DISTINCT octet_length(revision)) AS revision_lengths
  FROM layout_src GROUP BY grp ORDER BY grp;

-- Whether every key of the table-driven groups has its source's answer
-- (by projcache.entries, with no read's side effects).
CREATE FUNCTION layout_unsettled() RETURNS bigint LANGUAGE sql AS $$
	SELECT count(*)
	  FROM layout_src s LEFT JOIN projcache.entries e ON e.key = s.key
	 WHERE s.grp <> 'x'
	   AND (e.key IS NULL OR e.state IS DISTINCT FROM s.state
			OR e.revision IS DISTINCT FROM s.revision
			OR e.value_bytes IS DISTINCT FROM
				CASE WHEN s.state = 'enabled' THEN s.nbytes ELSE 0 END
			OR e.max_age IS DISTINCT FROM
				coalesce(s.max_age, current_setting('projcache.expiry')::interval)
			OR e.stale_for IS DISTINCT FROM
				coalesce(s.stale_for, current_setting('projcache.grace_period')::interval)
			OR e.freshness IS DISTINCT FROM 'fresh'
			OR e.last_error IS NOT NULL OR e.attempts <> 0)
$$;

-- What the cache holds against the source, per group: each count is of
-- keys that differ (get()'s and lookup()'s config, as jsonb and as text;
-- lookup()'s state and revision; entries' value_bytes and periods); errors
-- counts the keys with a last_error.
CREATE FUNCTION layout_check()
RETURNS TABLE(grp text, keys bigint, bad_state bigint, bad_get bigint,
			  bad_lookup bigint, bad_revision bigint, bad_bytes bigint,
			  bad_periods bigint, errors bigint)
LANGUAGE sql AS $$
	WITH k AS (
		SELECT s.grp, s.state, s.revision,
			   CASE WHEN s.state = 'enabled' THEN s.config END AS config,
			   CASE WHEN s.state = 'enabled' THEN s.nbytes ELSE 0 END AS nbytes,
			   coalesce(s.max_age,
						current_setting('projcache.expiry')::interval) AS max_age,
			   coalesce(s.stale_for,
						current_setting('projcache.grace_period')::interval) AS stale_for,
			   projcache.get(s.key) AS got,
			   l.state AS l_state, l.revision AS l_revision, l.config AS l_config,
			   e.value_bytes, e.max_age AS e_max_age, e.stale_for AS e_stale_for,
			   e.last_error
		  FROM layout_src s
		 CROSS JOIN LATERAL projcache.lookup(s.key) AS l
		  LEFT JOIN projcache.entries e ON e.key = s.key
		 WHERE s.grp <> 'x'
	)
	SELECT grp, count(*),
		   count(*) FILTER (WHERE l_state IS DISTINCT FROM state),
		   count(*) FILTER (WHERE got IS DISTINCT FROM config
							   OR got::text IS DISTINCT FROM config::text),
		   count(*) FILTER (WHERE l_config IS DISTINCT FROM config
							   OR l_config::text IS DISTINCT FROM config::text),
		   count(*) FILTER (WHERE l_revision IS DISTINCT FROM revision),
		   count(*) FILTER (WHERE value_bytes IS DISTINCT FROM nbytes),
		   count(*) FILTER (WHERE e_max_age IS DISTINCT FROM max_age
							   OR e_stale_for IS DISTINCT FROM stale_for),
		   count(*) FILTER (WHERE last_error IS NOT NULL)
	  FROM k GROUP BY grp ORDER BY grp
$$;

-- Keys whose revision, as last passed to the fetch function, is not the
-- one the cache should hold.
CREATE FUNCTION layout_bad_revisions_passed() RETURNS bigint LANGUAGE sql AS $$
	SELECT count(*) FROM layout_src s LEFT JOIN layout_seen v ON v.key = s.key
	 WHERE s.grp <> 'x' AND (v.key IS NULL OR v.rev IS DISTINCT FROM s.revision)
$$;

-- Invalidate every key of the table-driven groups (refetched at commit).
CREATE FUNCTION layout_invalidate_all() RETURNS bigint LANGUAGE sql AS $$
	SELECT count(*) FILTER (WHERE projcache.invalidate(key))
	  FROM layout_src WHERE grp <> 'x'
$$;

-- Keys too long: 1025 bytes, in ASCII or not.
SELECT sqlstate_of($$SELECT projcache.get(repeat('x', 1025))$$);
SELECT sqlstate_of($$SELECT projcache.get(repeat('é', 512) || 'x')$$);
SELECT sqlstate_of($$SELECT * FROM projcache.lookup('x' || repeat('é', 512))$$);
SELECT sqlstate_of($$SELECT projcache.invalidate(repeat('y', 1025))$$);

-- 1. First answers: every key read cold, then fetched.
SELECT count(*) AS cold_reads FROM layout_src
 WHERE grp <> 'x' AND projcache.get(key) IS NULL;
SELECT wait_for('(SELECT layout_unsettled() = 0)', 30);
SELECT * FROM layout_check();
-- every size from 8 to 300 is held (9 to 11 no jsonb has)
SELECT count(DISTINCT e.value_bytes) AS sizes_8_to_300,
	   min(e.value_bytes), max(e.value_bytes)
  FROM projcache.entries e JOIN layout_src s ON s.key = e.key WHERE s.grp = 's';

-- 2. Pending answers for keys that have a value: a message and a retry
-- time come (a new chunk), the value stays.
UPDATE layout_src SET answer = 'pending' WHERE grp <> 'x';
SELECT layout_invalidate_all() AS invalidated;
SELECT wait_for($$(SELECT count(*) = 0 FROM layout_src s
					 LEFT JOIN projcache.entries e ON e.key = s.key
					WHERE s.grp <> 'x' AND (e.last_error IS NULL OR
						  e.last_error NOT LIKE 'upstream answered "pending"%'))$$, 30);
SELECT * FROM layout_check();

-- 3. Answered again: not_modified for the keys that pass their revision
-- (all but those without one); the message goes.  Half the keys of s gain
-- periods of their own; p keeps its own.
UPDATE layout_src SET answer = 'value' WHERE grp <> 'x';
UPDATE layout_src SET max_age = make_interval(secs => 3000 + nbytes),
					  stale_for = make_interval(secs => 60)
 WHERE grp = 's' AND nbytes % 2 = 0;
SELECT not_modified AS not_modified_before FROM projcache.stats \gset
SELECT layout_invalidate_all() AS invalidated;
SELECT wait_for('(SELECT layout_unsettled() = 0)', 30);
SELECT * FROM layout_check();
SELECT layout_bad_revisions_passed() AS bad_revisions_passed;
SELECT not_modified - :not_modified_before >=
	   (SELECT count(*) FROM layout_src
		 WHERE grp <> 'x' AND state = 'enabled' AND revision IS NOT NULL)
	   AS answered_not_modified
  FROM projcache.stats;

-- 4. The source down: every fetch fails; values, revisions and periods
-- stay, with the error.
UPDATE layout_mode SET down = true;
SELECT layout_invalidate_all() AS invalidated;
SELECT wait_for($$(SELECT count(*) = 0 FROM layout_src s
					 LEFT JOIN projcache.entries e ON e.key = s.key
					WHERE s.grp <> 'x' AND
						  e.last_error IS DISTINCT FROM 'layout source is down')$$, 30);
SELECT * FROM layout_check();

-- 5. Back, with new values: every key takes the config size and revision
-- length of another of its group (new chunks of other classes, whole or
-- cut), keeping its periods; the error goes.  (Not the keys whose empty
-- revision would stay empty: the source would answer not_modified.)
UPDATE layout_mode SET down = false;
UPDATE layout_src s
   SET config = layout_json(s.key || '/v2', o.nbytes), nbytes = o.nbytes,
	   revision = CASE WHEN o.revision IS NULL THEN NULL
					   ELSE layout_text(s.key || '/r2', octet_length(o.revision)) END,
	   state = o.state
  FROM (SELECT key, lead(nbytes, 7) OVER w AS nbytes,
			   lead(revision, 7) OVER w AS revision, lead(state, 7) OVER w AS state
		  FROM layout_src WHERE grp <> 'x'
		WINDOW w AS (PARTITION BY grp ORDER BY key)) AS o
 WHERE o.key = s.key AND o.nbytes IS NOT NULL
   AND NOT (s.revision = '' AND o.revision = '');
SELECT layout_invalidate_all() AS invalidated;
SELECT wait_for('(SELECT layout_unsettled() = 0)', 30);
SELECT * FROM layout_check();

-- 6. Disabled: the keys of k lose their config (but keep a revision),
-- then come back enabled with configs of yet other sizes.
UPDATE layout_src SET state = 'disabled', config = NULL, nbytes = NULL,
					  revision = 'off-' || md5(key)
 WHERE grp = 'k';
SELECT layout_invalidate_all() AS invalidated;
SELECT wait_for('(SELECT layout_unsettled() = 0)', 30);
SELECT * FROM layout_check();
SELECT count(*) AS disabled_reads_not_null FROM layout_src
 WHERE grp = 'k' AND projcache.get(key) IS NOT NULL;
UPDATE layout_src s
   SET state = 'enabled', config = layout_json(s.key || '/v3', o.n), nbytes = o.n,
	   revision = 'on-' || o.i
  FROM (SELECT key, (ARRAY[8, 14, 31, 300, 1030, 4100, 8150, 12000])[1 + row_number() OVER (ORDER BY key) % 8] AS n,
			   row_number() OVER (ORDER BY key) AS i
		  FROM layout_src WHERE grp = 'k') AS o
 WHERE o.key = s.key;
SELECT layout_invalidate_all() AS invalidated;
SELECT wait_for('(SELECT layout_unsettled() = 0)', 30);
SELECT * FROM layout_check();

-- 7. Periods dropped (the settings apply) with a not_modified answer, then
-- given again with new values.
UPDATE layout_src SET max_age = NULL, stale_for = NULL WHERE grp IN ('p', 's');
SELECT layout_invalidate_all() AS invalidated;
SELECT wait_for('(SELECT layout_unsettled() = 0)', 30);
SELECT * FROM layout_check();
SELECT layout_bad_revisions_passed() AS bad_revisions_passed;
UPDATE layout_src
   SET max_age = make_interval(secs => 500 + nbytes % 97),
	   stale_for = make_interval(secs => nbytes % 89),
	   config = layout_json(key || '/v4', nbytes), revision = revision || '+'
 WHERE grp IN ('p', 'b');
SELECT layout_invalidate_all() AS invalidated;
SELECT wait_for('(SELECT layout_unsettled() = 0)', 30);
SELECT * FROM layout_check();

-- 8. A restarted scheduler rebuilds its state from the entries: values,
-- periods and times stay, and the revisions it passes are those held.
SELECT worker_pid AS old_pid FROM projcache.stats \gset
SELECT pg_terminate_backend(:old_pid);
SELECT wait_for($$(SELECT worker_pid IS NOT NULL AND worker_pid <> $$ || :old_pid || $$ FROM projcache.stats)$$, 30);
SELECT * FROM layout_check();
SELECT layout_invalidate_all() AS invalidated;
SELECT wait_for('(SELECT layout_unsettled() = 0)', 30);
SELECT * FROM layout_check();
SELECT layout_bad_revisions_passed() AS bad_revisions_passed;

--
-- One key at a time, shown whole.
--
-- Each of config (lookup()'s), get and revision is 'source' when it is the
-- source's, 'null' when NULL, else 'WRONG'.
CREATE FUNCTION layout_same(got anyelement, src anyelement) RETURNS text
LANGUAGE sql AS $$
	SELECT CASE WHEN got IS NOT DISTINCT FROM src THEN 'source'
				WHEN got IS NULL THEN 'null' ELSE 'WRONG' END
$$;
CREATE FUNCTION layout_show(k text)
RETURNS TABLE(state text, config text, get text, revision text,
			  value_bytes bigint, max_age interval, last_error text)
LANGUAGE sql AS $$
	SELECT e.state, layout_same(l.config, s.config),
		   layout_same(projcache.get(k), s.config),
		   layout_same(l.revision, s.revision), e.value_bytes, e.max_age,
		   regexp_replace(e.last_error, '[0-9]+(\.[0-9]+)?', 'N', 'g')
	  FROM projcache.entries e, projcache.lookup(k) l, layout_src s
	 WHERE e.key = k AND s.key = k
$$;

-- A cold key whose fetch fails: pending, with the error; then answered.
INSERT INTO layout_src (key, grp, revision, config, nbytes, answer)
	VALUES ('lay-x-err', 'x', 'e1', layout_json('x-err', 2000), 2000, 'fail');
SELECT projcache.get('lay-x-err') IS NULL AS cold;
SELECT wait_for($$(SELECT last_error IS NOT NULL FROM projcache.entries WHERE key = 'lay-x-err')$$);
SELECT * FROM layout_show('lay-x-err');
UPDATE layout_src SET answer = 'value' WHERE key = 'lay-x-err';
SELECT projcache.invalidate('lay-x-err');
SELECT wait_for($$(SELECT last_error IS NULL FROM projcache.entries WHERE key = 'lay-x-err')$$);
SELECT * FROM layout_show('lay-x-err');

-- A key with a value (cut in two) whose refresh fails: the value stays,
-- with the error; then a new value clears it.
INSERT INTO layout_src (key, grp, revision, config, nbytes)
	VALUES ('lay-x-errv', 'x', repeat('v', 255), layout_json('x-errv', 5000), 5000);
SELECT projcache.get('lay-x-errv', '10s') = layout_json('x-errv', 5000) AS fetched;
UPDATE layout_src SET answer = 'fail' WHERE key = 'lay-x-errv';
SELECT projcache.invalidate('lay-x-errv');
SELECT wait_for($$(SELECT last_error IS NOT NULL FROM projcache.entries WHERE key = 'lay-x-errv')$$);
SELECT * FROM layout_show('lay-x-errv');
UPDATE layout_src SET answer = 'value', revision = repeat('w', 256),
					  config = layout_json('x-errv2', 1013), nbytes = 1013
 WHERE key = 'lay-x-errv';
SELECT projcache.invalidate('lay-x-errv');
SELECT wait_for($$(SELECT last_error IS NULL FROM projcache.entries WHERE key = 'lay-x-errv')$$);
SELECT * FROM layout_show('lay-x-errv');

-- A cold key answered pending: it backs off, showing when it retries and
-- why; then enabled.
INSERT INTO layout_src (key, grp, revision, config, nbytes, answer)
	VALUES ('lay-x-pend', 'x', 'p1', layout_json('x-pend', 1500), 1500, 'pending');
SELECT projcache.get('lay-x-pend') IS NULL AS cold;
SELECT wait_for($$(SELECT fetch_state = 'backoff' AND next_attempt_at IS NOT NULL
						  AND last_error LIKE '%next attempt in%'
					 FROM projcache.entries WHERE key = 'lay-x-pend')$$);
SELECT state, config IS NULL AS no_config,
	   regexp_replace(last_error, '[0-9]+(\.[0-9]+)?', 'N', 'g') AS last_error
  FROM projcache.lookup('lay-x-pend');
UPDATE layout_src SET answer = 'value' WHERE key = 'lay-x-pend';
SELECT projcache.invalidate('lay-x-pend');
SELECT wait_for($$(SELECT state = 'enabled' FROM projcache.entries WHERE key = 'lay-x-pend')$$);
SELECT * FROM layout_show('lay-x-pend');

-- A key with a value answered pending: the value stays while it backs off
-- (retry time shown); then a new value.
INSERT INTO layout_src (key, grp, revision, config, nbytes, max_age, stale_for)
	VALUES ('lay-x-pendv', 'x', 'pv1', layout_json('x-pendv', 8144), 8144, '1h', '2h');
SELECT projcache.get('lay-x-pendv', '10s') = layout_json('x-pendv', 8144) AS fetched;
UPDATE layout_src SET answer = 'pending' WHERE key = 'lay-x-pendv';
SELECT projcache.invalidate('lay-x-pendv');
SELECT wait_for($$(SELECT fetch_state = 'backoff' AND next_attempt_at IS NOT NULL
						  AND last_error LIKE '%next attempt in%'
					 FROM projcache.entries WHERE key = 'lay-x-pendv')$$);
SELECT * FROM layout_show('lay-x-pendv');
UPDATE layout_src SET answer = 'value', revision = 'pv2',
					  config = layout_json('x-pendv2', 77), nbytes = 77
 WHERE key = 'lay-x-pendv';
SELECT projcache.invalidate('lay-x-pendv');
SELECT wait_for($$(SELECT revision = 'pv2' AND last_error IS NULL
					 FROM projcache.entries WHERE key = 'lay-x-pendv')$$);
SELECT * FROM layout_show('lay-x-pendv');

-- A disabled key (no config), then enabled; and a key the source does not
-- know (disabled), then known.
INSERT INTO layout_src (key, grp, state, revision)
	VALUES ('lay-x-dis', 'x', 'disabled', NULL);
SELECT state, config, revision FROM projcache.lookup('lay-x-dis', '10s');
SELECT state, config FROM projcache.lookup('lay-x-unknown', '10s');
UPDATE layout_src SET state = 'enabled', revision = 'd2',
					  config = layout_json('x-dis', 3121), nbytes = 3121
 WHERE key = 'lay-x-dis';
INSERT INTO layout_src (key, grp, revision, config, nbytes)
	VALUES ('lay-x-unknown', 'x', NULL, layout_json('x-unknown', 40), 40);
SELECT projcache.invalidate('lay-x-dis'), projcache.invalidate('lay-x-unknown');
SELECT wait_for($$(SELECT count(*) FILTER (WHERE state = 'enabled') = 2 FROM projcache.entries
					WHERE key IN ('lay-x-dis', 'lay-x-unknown'))$$);
SELECT * FROM layout_show('lay-x-dis');
SELECT * FROM layout_show('lay-x-unknown');

-- Everything still as the source says, after all that.
SELECT * FROM layout_check();

ALTER SYSTEM SET projcache.fetch_function = :'saved_fetch_function';
SELECT reload_and_wait();
