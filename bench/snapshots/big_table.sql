SELECT count(*) FROM public.big;
