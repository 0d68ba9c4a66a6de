SELECT count(*) FROM public.small;
