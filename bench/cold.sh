#!/usr/bin/env bash
# bench/cold.sh - a cold start (issue 29): a service warming its cache
# after a deploy reads N new keys once each, in one statement, then waits
# for each with get(key, '30s'), in one statement too.
#
#     sudo bash bench/cold.sh                          # about 2 minutes
#     sudo COLD_KEYS="2000 20000" COLD_MEMORY="6MB 64MB" bash bench/cold.sh
#     sudo COLD_READERS=app bash bench/cold.sh         # a non-superuser only
#
# Builds and installs this tree, then for each max_memory of COLD_MEMORY
# ("64MB 256MB") starts a throwaway cluster (port 54346, unix socket only,
# run by the unprivileged "postgres" OS user, fsync off, every projcache
# setting at its default but max_memory) whose fetch function is the
# issue's: local, one SQL statement, no delay, a config of about 30 bytes
# a key.  For each reader of COLD_READERS ("postgres app": a superuser,
# whose keys count for no role, and a role without privileges but EXECUTE
# on get(), whose keys count against projcache.max_keys_per_role) and each
# N of COLD_KEYS ("2000 20000 100000"), on new keys each time (the keys
# of the cases before stay cached):
#
#     SELECT count(projcache.get('<prefix>' || i)) FROM generate_series(1, N) i;
#     SELECT count(projcache.get('<prefix>' || i, '30s')) FROM generate_series(1, N) i;
#
# and reports the seconds of each statement and of both, the keys the
# waits returned (N if every one came), and what projcache.stats says
# grew over the case: fetch_calls, fetched_keys, dropped_fetches,
# refused_reads, evictions_memory; then entries and memory_used at the
# end of the case, and the load average (1 min) before and after it.
# The role's bound on keys (max_keys_per_role, -1: half of the keys that
# fit) is printed for each max_memory.
#
# It asserts nothing: it reports what it measured.  The report is printed
# and written to bench/results/cold-latest.txt (COLD_OUT=path: elsewhere)
# with the command, the date, the machine (nproc, load average before and
# after) and the tree's commit.  The server is stopped and the temp dir
# removed on exit, error or Ctrl-C; this tree stays installed.
# PROJCACHE_PGBIN picks another PostgreSQL 15 install.
set -euo pipefail

# shellcheck source=SCRIPTDIR/../scripts/lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/../scripts/lib.sh"
# shellcheck source=SCRIPTDIR/lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
NAME=cold
PORT=54346
OUT=${COLD_OUT:-$REPO/bench/results/cold-latest.txt}
COMMAND="$0${*:+ $*}"
WORK=
DATA=
SOCK=

MEMORIES=${COLD_MEMORY:-64MB 256MB}
READERS=${COLD_READERS:-postgres app}
KEYS=${COLD_KEYS:-2000 20000 100000}
TIMEOUT=${COLD_TIMEOUT:-600}
for v in $KEYS $TIMEOUT; do
	case $v in 0 | *[!0-9]*)
		echo "$NAME: COLD_KEYS and COLD_TIMEOUT are positive whole numbers, not '$v'" >&2
		exit 2 ;;
	esac
done
for v in $MEMORIES; do
	[[ $v =~ ^[0-9]+(kB|MB|GB)$ ]] || {
		echo "$NAME: COLD_MEMORY takes sizes such as 64MB, not '$v'" >&2
		exit 2
	}
done
for v in $READERS; do
	case $v in postgres | app) ;;
	*)
		echo "$NAME: COLD_READERS takes postgres and app, not '$v'" >&2
		exit 2 ;;
	esac
done
writable_or_exit "$OUT"

cleanup_on_exit
bash "$REPO/scripts/install-deps.sh"

START_NS=$(date +%s%N)
LOAD_BEFORE=$(cut -d' ' -f1-3 /proc/loadavg)
setup_work projcache-cold
GIT=(git -C "$REPO" -c safe.directory='*')
HEAD_DESC=$("${GIT[@]}" log -1 --format='%h %s' HEAD 2>/dev/null | cut -c1-72 || echo unknown)
[ -z "$("${GIT[@]}" status --porcelain --untracked-files=no 2>/dev/null)" ] ||
	HEAD_DESC="$HEAD_DESC (+ uncommitted changes)"
DATA=$WORK/data

now_ns() { date +%s%N; }
secs() { LC_ALL=C awk -v ns="$1" 'BEGIN{printf "%.2f", ns / 1e9}'; }
load1() { cut -d' ' -f1 /proc/loadavg; }

# The stats columns a case reports the growth of, in this order.
GROWN="fetch_calls, fetched_keys, dropped_fetches, refused_reads, evictions_memory"

LINES=()
BOUNDS=()
for memory in $MEMORIES; do
	echo "=== max_memory $memory"
	rm -rf "$DATA"
	start_cluster <<EOF
listen_addresses = ''
fsync = off
shared_preload_libraries = 'projcache'
projcache.database = 'postgres'
projcache.max_memory = '$memory'
EOF
	pgrun >/dev/null <<'EOF'
CREATE EXTENSION projcache;
CREATE FUNCTION public.fetch(p_keys text[], p_revisions text[])
RETURNS TABLE(key text, state text, revision text, config jsonb)
LANGUAGE sql AS $$
	SELECT k, 'enabled', 'r1', jsonb_build_object('key', k)
	  FROM unnest(p_keys) AS k
$$;
CREATE ROLE app;
GRANT USAGE ON SCHEMA projcache TO app;
GRANT EXECUTE ON FUNCTION projcache.get(text), projcache.get(text, interval) TO app;
ALTER SYSTEM SET projcache.fetch_function = 'public.fetch';
SELECT pg_reload_conf();
EOF
	# The worker took the fetch function once a read of a key gets it.
	t0=$(date +%s)
	until [ "$(pgvalue "SELECT projcache.get('warm', '1s') IS NOT NULL")" = t ]; do
		if [ $(($(date +%s) - t0)) -gt 60 ]; then
			echo "$NAME: the worker fetched nothing within 60 s" >&2
			exit 1
		fi
	done
	# -1: half of the keys that fit in what max_memory leaves for keys
	# (a quarter goes to snapshots, 1/16 up to 64 kB to messages), at 136
	# bytes a key (doc/settings.md).
	bound=$(pgvalue 'SHOW projcache.max_keys_per_role')
	limit=$(pgvalue 'SELECT memory_limit FROM projcache.stats')
	[ "$bound" != -1 ] || bound="-1 (about $(LC_ALL=C awk -v m="$limit" 'BEGIN{
		r = m / 16; if (r > 65536) r = 65536; printf "%d", (m - m / 4 - r) / 136 / 2 }') keys a role)"
	BOUNDS+=("$memory: memory_limit $limit bytes, max_keys_per_role $bound")
	case_no=0
	for reader in $READERS; do
		for n in $KEYS; do
			case_no=$((case_no + 1))
			prefix="c${case_no}_"
			as="SET ROLE $reader"
			before=$(pgvalue "SELECT $GROWN FROM projcache.stats")
			l0=$(load1)
			t0=$(now_ns)
			pgrun -c "$as" -c "SELECT count(projcache.get('$prefix' || i)) FROM generate_series(1, $n) AS i" >/dev/null
			t1=$(now_ns)
			got=$(pgrun -At -c "$as" -c "SET statement_timeout = '${TIMEOUT}s'" \
				-c "SELECT count(projcache.get('$prefix' || i, '30s')) FROM generate_series(1, $n) AS i" 2>&1 | tail -n 1) ||
				got="failed: $got"
			t2=$(now_ns)
			after=$(pgvalue "SELECT $GROWN FROM projcache.stats")
			at_end=$(pgvalue "SELECT entries, round(memory_used / 1048576.0, 1) FROM projcache.stats")
			grown=$(LC_ALL=C awk -v a="$after" -v b="$before" 'BEGIN{
				na = split(a, x, "|"); split(b, y, "|");
				for (i = 1; i <= na; i++) printf "%s%d", (i > 1 ? " " : ""), x[i] - y[i] }')
			read -r calls fetched dropped refused evicted <<<"$grown"
			IFS='|' read -r entries mem <<<"$at_end"
			line=$(printf '%-7s %-8s %7s %8s %8s %8s %8s %7s %8s %7s %7s %8s %8s %7s %5s %5s' \
				"$memory" "$reader" "$n" "$(secs $((t1 - t0)))" "$(secs $((t2 - t1)))" \
				"$(secs $((t2 - t0)))" "$got" "$calls" "$fetched" "$dropped" "$refused" \
				"$evicted" "$entries" "$mem" "$l0" "$(load1)")
			echo "$line"
			LINES+=("$line")
		done
	done
	stop_cluster
	mv "$WORK/server.log" "$WORK/server-$memory.log"
done

log_lines() {
	cat "$WORK"/server-*.log | grep -E '(ERROR|WARNING|FATAL|PANIC):' |
		grep -vE 'FATAL:  terminating background worker "projcache [a-z]+" due to administrator command' || true
}
PGVER=$("${AS_PG[@]}" "$PGBIN/postgres" --version | sed 's/^postgres (PostgreSQL) //')
NLOG=$(log_lines | wc -l)

{
	echo "projcache: a cold start (bench/cold.sh), $(date -u '+%Y-%m-%d %H:%M:%S UTC')"
	echo "command:   $COMMAND (COLD_MEMORY='$MEMORIES' COLD_READERS='$READERS' COLD_KEYS='$KEYS')"
	echo "tree:      $HEAD_DESC"
	echo "machine:   $(nproc) CPUs, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//'); load avg $LOAD_BEFORE before, $(cut -d' ' -f1-3 /proc/loadavg) after"
	echo "server:    PostgreSQL $PGVER; fsync off; projcache defaults but max_memory (batch_size 500, batch_interval 100ms)"
	echo "fetch:     local, one SQL statement, no delay; configs of about 30 bytes"
	printf '           %s\n' "${BOUNDS[@]}"
	echo
	echo "Each case: N new keys read once (one statement, 'once' s), then each waited for with get(k, '30s') (one"
	echo "statement, 'waits' s); 'got' = keys the waits returned; calls .. evicted = growth of projcache.stats over"
	echo "the case (fetch_calls, fetched_keys, dropped_fetches, refused_reads, evictions_memory); entries and MB"
	echo "(memory_used) at its end; load = 1-minute load average before and after it."
	echo
	printf '%-7s %-8s %7s %8s %8s %8s %8s %7s %8s %7s %7s %8s %8s %7s %5s %5s\n' \
		memory reader N once waits total got calls fetched dropped refused evicted entries MB load0 load1
	printf '%s\n' "${LINES[@]}"
	echo
	echo "server log: $NLOG ERROR/WARNING/FATAL/PANIC lines (besides the workers' at shutdown)"
	[ "$NLOG" -eq 0 ] || log_lines | sed 's/^[^]]*] //' | sort | uniq -c | sort -rn | head -n 5
	echo "total $(( ($(date +%s%N) - START_NS) / 1000000000 )) s"
} >"$WORK/report.txt"
echo
cat "$WORK/report.txt"
cp "$WORK/report.txt" "$OUT"
[ "$(id -u)" -ne 0 ] || chown --reference="$(dirname "$OUT")" "$OUT" 2>/dev/null || true
echo
echo "report: $OUT"
