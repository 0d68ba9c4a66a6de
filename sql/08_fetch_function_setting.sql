--
-- projcache.fetch_function unset, or naming a missing function.
--
ALTER SYSTEM SET projcache.fetch_function = '';
SELECT reload_and_wait();
SELECT projcache.fetch('nofn-1');
SELECT wait_for($$(SELECT last_error IS NOT NULL FROM projcache.entries WHERE key = 'nofn-1')$$);
SELECT state, last_error FROM projcache.entries WHERE key = 'nofn-1';

ALTER SYSTEM SET projcache.fetch_function = 'public.no_such_function';
SELECT reload_and_wait();
SELECT projcache.invalidate('nofn-1');
SELECT wait_for($$(SELECT last_error LIKE '%does not exist%' FROM projcache.entries WHERE key = 'nofn-1')$$);
SELECT state, last_error FROM projcache.entries WHERE key = 'nofn-1';

-- A name that is not even a name.
ALTER SYSTEM SET projcache.fetch_function = 'a.b.c.d';
SELECT reload_and_wait();
SELECT projcache.invalidate('nofn-1');
SELECT wait_for($$(SELECT last_error NOT LIKE '%does not exist%' FROM projcache.entries WHERE key = 'nofn-1')$$);
SELECT state, last_error FROM projcache.entries WHERE key = 'nofn-1';

-- Set it back: the key is fetched (the upstream does not know it).
ALTER SYSTEM SET projcache.fetch_function = 'public.test_fetch';
SELECT reload_and_wait();
SELECT projcache.invalidate('nofn-1');
SELECT state, last_error FROM projcache.lookup('nofn-1', '10s');

-- projcache.fetch_role: the fetch function runs as that role.
CREATE ROLE pc_fetcher;
CREATE FUNCTION public.whoami_fetch(keys text[], revisions text[])
RETURNS TABLE(key text, state text, revision text, config jsonb)
LANGUAGE sql AS $$
	SELECT k, 'enabled', 'r1', jsonb_build_object('user', current_user::text)
	  FROM unnest(keys) AS k
$$;
ALTER SYSTEM SET projcache.fetch_function = 'public.whoami_fetch';
ALTER SYSTEM SET projcache.fetch_role = 'pc_fetcher';
SELECT reload_and_wait();
SELECT projcache.get('who-1', '10s');

-- A role that does not exist is a failed fetch, recorded.
ALTER SYSTEM SET projcache.fetch_role = 'no_such_role';
SELECT reload_and_wait();
SELECT projcache.fetch('who-2');
SELECT wait_for($$(SELECT last_error IS NOT NULL FROM projcache.entries WHERE key = 'who-2')$$);
SELECT state, last_error FROM projcache.entries WHERE key = 'who-2';

ALTER SYSTEM RESET projcache.fetch_role;
ALTER SYSTEM SET projcache.fetch_function = 'public.test_fetch';
SELECT reload_and_wait();
SELECT projcache.evict('who-1'), projcache.evict('who-2');
DROP FUNCTION public.whoami_fetch(text[], text[]);
DROP ROLE pc_fetcher;
