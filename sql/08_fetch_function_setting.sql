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
