\set k random(1, 1000)
SELECT config FROM public.configs WHERE key = 'key-' || :k;
