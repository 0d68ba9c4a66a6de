SELECT count(*) FROM projcache.snapshot('s') AS t(a int, b text, c int);
