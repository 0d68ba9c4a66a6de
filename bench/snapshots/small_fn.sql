SELECT count(*) FROM projcache.snapshot('small') AS t(k text, config jsonb, tag text);
