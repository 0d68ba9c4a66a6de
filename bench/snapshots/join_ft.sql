\set n random(1, 10000)
SELECT g.v FROM public.projects p JOIN snapbench.big g ON g.k = p.owner_id WHERE p.key = 'p' || :n;
