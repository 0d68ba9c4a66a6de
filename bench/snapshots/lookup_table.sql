\set n random(1, 10000)
SELECT v FROM public.big WHERE k = 'k' || :n;
