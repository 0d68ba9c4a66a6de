SELECT count(*) FROM projcache.snapshot('big') AS t(k text, v text);
