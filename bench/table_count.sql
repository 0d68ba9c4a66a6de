SELECT count(*) FROM public.snap_src;
