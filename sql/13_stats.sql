--
-- Counters.
--
INSERT INTO upstream VALUES ('stats-1', 'enabled', 'r1', '{"s": 1}');
SELECT projcache.get('stats-1', '10s');
SELECT projcache.reset_stats();
SELECT hits, misses, pending_reads, fetch_calls, fetch_errors
  FROM projcache.stats;
SELECT projcache.get('stats-1') IS NOT NULL AS hit;
SELECT projcache.get('stats-new') IS NULL AS miss;
SELECT hits, misses, fetch_requests >= 1 AS requested FROM projcache.stats;
SELECT projcache.get('stats-new', '10s') IS NULL AS disabled;
SELECT entries = (SELECT count(*) FROM projcache.entries) AS entries_match,
	   memory_used > 0 AS uses_memory,
	   memory_limit = 64 * 1024 * 1024 AS limit_is_setting,
	   fetch_calls >= 1 AS called,
	   stats_reset > now() - interval '1 minute' AS recently_reset
  FROM projcache.stats;

-- A fresh hit touches neither the request ring nor the worker.
SELECT projcache.reset_stats();
SELECT count(projcache.get('stats-1')) AS hits_served FROM generate_series(1, 100);
SELECT hits, fetch_requests, request_overflows FROM projcache.stats;

-- Evictions by cause and the hit ratio (since 1.1); a read marks the key
-- visited for the eviction FIFOs.
SELECT projcache.reset_stats();
SELECT hit_ratio IS NULL AS no_reads_yet, evictions_requested, refused_reads
  FROM projcache.stats;
SELECT projcache.get('stats-1') IS NOT NULL AS hit;
SELECT visited FROM projcache.entries WHERE key = 'stats-1';
SELECT projcache.get('stats-gone', '10s') IS NULL AS disabled;
SELECT projcache.evict('stats-gone');
SELECT evictions, evictions_requested, evictions_memory, evictions_expired,
	   round(hit_ratio::numeric, 2) AS hit_ratio
  FROM projcache.stats;

-- The delay histogram in bucket order.
SELECT jsonb_path_query_array(fetch_delay_buckets, '$[*].bucket') AS buckets,
       (SELECT sum((b->>'count')::bigint) FROM jsonb_array_elements(fetch_delay_buckets) b)
         = (SELECT sum(value::bigint) FROM jsonb_each_text(fetch_delay_histogram)) AS same_counts
  FROM projcache.stats;
