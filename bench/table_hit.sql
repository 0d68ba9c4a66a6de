\set k random(1, 1000)
SELECT config FROM public.project_configs WHERE key = 'key-' || :k;
