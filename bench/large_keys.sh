#!/usr/bin/env bash
# bench/large_keys.sh - a worker restart at 17 million keys (issue 40, item
# 11): above about 16.8 million keys, each new worker exited about 4.8 s
# after it started, forever, and no key was fetched again.
#
#     sudo bash bench/large_keys.sh                       # about 5 minutes, 17 GB
#     sudo LARGE_KEYS=2000000 bash bench/large_keys.sh    # a smaller map
#     sudo LARGE_DUMP_INTERVAL=-1 bash bench/large_keys.sh   # no dump at exit
#
# Builds and installs this tree, starts a throwaway cluster (port 54371,
# unix socket only, run by the unprivileged "postgres" OS user, fsync off)
# with projcache.max_memory = LARGE_MEMORY (3GB), expiry and grace_period
# 4h (nothing expires or is fetched again on its own during the run),
# batch_size 5000 and dump_interval LARGE_DUMP_INTERVAL (0: the worker
# dumps the map when it exits, and only then), and a fetch function that
# answers every key with the one-byte config 1, with no table behind it.
# Then:
#
# 1. Load: projcache.fetch() of k1 .. kK (LARGE_KEYS, 17,000,000), 50,000
#    a statement, then until projcache.stats says K keys were fetched and
#    the map holds them.  Timed; the map's memory_used; the worker's RSS.
# 2. Restart: pg_terminate_backend() of the worker.  Timed until it is
#    gone (with dump_interval 0 or more it writes the dump as it exits),
#    until a new worker runs, until it logs that it is ready, and until
#    get() of a new key returns its value (a read each 0.2 s, at most
#    LARGE_TIMEOUT, 600 s): "fetches again".  The new worker's RSS and
#    peak RSS (VmHWM: its rebuild), and the workers that exited meanwhile
#    (the postmaster's "exited with exit code" lines).
# 3. entries(): SELECT count(*) FROM projcache.entries, timed, with its
#    answer or its error (LARGE_ENTRIES=0 skips it).
#
# RSS is /proc/PID/status: VmRSS (anon: the process's own memory; shmem:
# the pages of shared memory, the key map, that it touched) and VmHWM.
# It asserts nothing: it reports what it measured (a worker that does not
# fetch again within LARGE_TIMEOUT is a result, not a failure), and exits
# non-zero only when a measurement could not be made.  The report is
# printed and written to bench/results/large_keys-latest.txt
# (LARGE_OUT=path: elsewhere) with the command, the date, the machine and
# the tree's commit, and the server log's ERROR/FATAL lines.  The server
# is stopped and the temp dir removed on exit, error or Ctrl-C; this tree
# stays installed.  PROJCACHE_PGBIN picks another PostgreSQL 15 install.
set -euo pipefail

# shellcheck source=SCRIPTDIR/../scripts/lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/../scripts/lib.sh"
# shellcheck source=SCRIPTDIR/lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
NAME=large_keys
PORT=54371
OUT=${LARGE_OUT:-$REPO/bench/results/large_keys-latest.txt}
COMMAND="$0${*:+ $*}"
WORK=
DATA=
SOCK=

KEYS=${LARGE_KEYS:-17000000}
MEMORY=${LARGE_MEMORY:-3GB}
DUMP_INTERVAL=${LARGE_DUMP_INTERVAL:-0}
TIMEOUT=${LARGE_TIMEOUT:-600}
ENTRIES=${LARGE_ENTRIES:-1}
CHUNK=50000
for v in "$KEYS" "$TIMEOUT"; do
	case $v in '' | 0 | *[!0-9]*)
		echo "$NAME: LARGE_KEYS and LARGE_TIMEOUT must be positive whole numbers" >&2
		exit 2 ;;
	esac
done
[[ $MEMORY =~ ^[0-9]+(MB|GB)$ ]] || {
	echo "$NAME: LARGE_MEMORY takes sizes such as 3GB, not '$MEMORY'" >&2
	exit 2
}
[[ $DUMP_INTERVAL =~ ^-?[0-9]+$ ]] || {
	echo "$NAME: LARGE_DUMP_INTERVAL takes seconds (-1: no dump), not '$DUMP_INTERVAL'" >&2
	exit 2
}
writable_or_exit "$OUT"

cleanup_on_exit
bash "$REPO/scripts/install-deps.sh"

START_NS=$(date +%s%N)
LOAD_BEFORE=$(cut -d' ' -f1-3 /proc/loadavg)
MEM_BEFORE=$(awk '/^MemAvailable:/{printf "%.1f GB", $2 / 1048576}' /proc/meminfo)
setup_work projcache-large
GIT=(git -C "$REPO" -c safe.directory='*')
HEAD_DESC=$("${GIT[@]}" log -1 --format='%h %s' HEAD 2>/dev/null | cut -c1-72 || echo unknown)
[ -z "$("${GIT[@]}" status --porcelain --untracked-files=no 2>/dev/null)" ] ||
	HEAD_DESC="$HEAD_DESC (+ uncommitted changes)"
DATA=$WORK/data

now_ms() { date +%s%3N; }
secs() { LC_ALL=C awk -v ms="$1" 'BEGIN{printf "%.1f", ms / 1000}'; }

# wait_for SQL TIMEOUT: poll until SQL returns t, every 0.2 s; false after
# TIMEOUT seconds.  A failed query (no worker yet) counts as not yet.
wait_for() {
	local t0
	t0=$(now_ms)
	until [ "$(pgvalue "$1" 2>/dev/null)" = t ]; do
		[ $(($(now_ms) - t0)) -le $(($2 * 1000)) ] || return 1
		sleep 0.2
	done
}

# rss PID: the process's RSS and peak from /proc, in MB.
rss() {
	awk '/^(VmRSS|VmHWM|RssAnon|RssShmem):/{v[$1] = $2}
		END{printf "RSS %.0f MB (anon %.0f, shmem %.0f), peak %.0f MB",
			v["VmRSS:"] / 1024, v["RssAnon:"] / 1024, v["RssShmem:"] / 1024,
			v["VmHWM:"] / 1024}' "/proc/$1/status" 2>/dev/null || echo "gone"
}

worker_pid() {
	pgvalue "SELECT pid FROM pg_stat_activity WHERE backend_type = 'projcache scheduler'"
}

# exits: the workers the postmaster saw exit so far.
exits() {
	grep -c 'background worker "projcache scheduler" (PID [0-9]*) exited with exit code' \
		"$WORK/server.log" || true
}

start_cluster <<EOF
listen_addresses = ''
fsync = off
log_line_prefix = '%m [%p] '
shared_preload_libraries = 'projcache'
projcache.database = 'postgres'
projcache.max_memory = '$MEMORY'
projcache.expiry = '4h'
projcache.grace_period = '4h'
projcache.batch_size = 5000
projcache.dump_interval = $DUMP_INTERVAL
EOF
pgrun >/dev/null <<'EOF'
CREATE EXTENSION projcache;
CREATE FUNCTION public.one_byte(p_keys text[], p_revisions text[])
RETURNS TABLE(key text, state text, revision text, config jsonb)
LANGUAGE sql STABLE AS $$
	SELECT k, 'enabled', 'r1', '1'::jsonb FROM unnest(p_keys) AS k
$$;
ALTER SYSTEM SET projcache.fetch_function = 'public.one_byte';
SELECT pg_reload_conf();
EOF
wait_for "SELECT projcache.get('warm', '1s') IS NOT NULL" 60 ||
	{ echo "$NAME: the worker fetched nothing within 60 s" >&2; exit 1; }

# ------------------------------------------------------------------ 1. load
echo "=== 1. loading $KEYS keys"
t0=$(now_ms)
for ((from = 1; from <= KEYS; from += CHUNK)); do
	to=$((from + CHUNK - 1 < KEYS ? from + CHUNK - 1 : KEYS))
	pgvalue "SELECT count(projcache.fetch('k' || i)) FROM generate_series($from, $to) AS i" >/dev/null
done
t_asked=$(now_ms)
wait_for "SELECT fetched_keys > $KEYS AND entries > $KEYS FROM projcache.stats" 3600 ||
	{ echo "$NAME: $KEYS keys not fetched within an hour" >&2; exit 1; }
t1=$(now_ms)
LOAD="$KEYS keys in $(secs $((t1 - t0))) s ($(secs $((t_asked - t0))) s asking, $CHUNK fetch() a statement)"
LOAD_STATS=$(pgvalue "SELECT format('entries %s, memory_used %s MB of %s MB, fetch_calls %s, fetched_keys %s, fetch_errors %s',
                              entries, round(memory_used / 1048576.0), round(memory_limit / 1048576.0),
                              fetch_calls, fetched_keys, fetch_errors) FROM projcache.stats")
OLD_PID=$(worker_pid)
OLD_RSS=$(rss "$OLD_PID")
echo "$LOAD"
echo "$LOAD_STATS"
echo "worker $OLD_PID: $OLD_RSS"

# --------------------------------------------------------------- 2. restart
echo "=== 2. pg_terminate_backend() of the worker"
exits0=$(exits)
LOG_OFFSET=$(($(stat -c %s "$WORK/server.log") + 1))
t0=$(now_ms)
pgvalue "SELECT pg_terminate_backend($OLD_PID)" >/dev/null
wait_for "SELECT NOT EXISTS (SELECT FROM pg_stat_activity WHERE pid = $OLD_PID)" "$TIMEOUT" || true
t_gone=$(now_ms)
GONE="$(secs $((t_gone - t0))) s"
t_new=
NEW_PID=
t_ready=
t_fetch=
NEW_RSS=
deadline=$((t0 + TIMEOUT * 1000))
while [ "$(now_ms)" -le "$deadline" ]; do
	pid=$(worker_pid 2>/dev/null || true)
	if [ -n "$pid" ] && [ "$pid" != "$OLD_PID" ] && [ -z "$t_new" ]; then
		t_new=$(now_ms)
	fi
	if [ -z "$t_ready" ] && grep -q 'projcache scheduler ready in database' \
		<(tail -c +"$LOG_OFFSET" "$WORK/server.log" 2>/dev/null || true); then
		t_ready=$(now_ms)
	fi
	if [ "$(pgvalue "SELECT projcache.get('after-restart', '0.2s') IS NOT NULL" 2>/dev/null || true)" = t ]; then
		t_fetch=$(now_ms)
		NEW_PID=$(worker_pid)
		NEW_RSS=$(rss "$NEW_PID")
		break
	fi
	sleep 0.2
done 2>/dev/null
at() { if [ -n "$1" ]; then echo "$(secs $(($1 - t0))) s"; else echo "not within $TIMEOUT s"; fi; }
RESTART="old worker gone $GONE; a new worker $(at "$t_new"); ready $(at "$t_ready"); fetches again $(at "$t_fetch")"
EXITS="$(($(exits) - exits0)) workers exited (the terminated one included)"
echo "$RESTART"
echo "$EXITS"
[ -z "$NEW_PID" ] || echo "new worker $NEW_PID: $NEW_RSS"

# --------------------------------------------------------------- 3. entries
ENTRIES_LINE="skipped (LARGE_ENTRIES=0)"
if [ "$ENTRIES" != 0 ]; then
	echo "=== 3. entries()"
	t0=$(now_ms)
	got=$(pgvalue "SELECT count(*) FROM projcache.entries" 2>&1 | tail -n 1) || true
	t1=$(now_ms)
	ENTRIES_LINE="$got, in $(secs $((t1 - t0))) s"
	echo "$ENTRIES_LINE"
fi

log_lines() {
	grep -E '(ERROR|FATAL|PANIC):' "$WORK/server.log" |
		grep -vE 'FATAL:  terminating background worker "projcache [a-z]+" due to administrator command' || true
}
PGVER=$("${AS_PG[@]}" "$PGBIN/postgres" --version | sed 's/^postgres (PostgreSQL) //')
NLOG=$(log_lines | wc -l)

{
	echo "projcache: a worker restart at $KEYS keys (bench/large_keys.sh), $(date -u '+%Y-%m-%d %H:%M:%S UTC')"
	echo "command:   $COMMAND (LARGE_KEYS=$KEYS LARGE_MEMORY=$MEMORY LARGE_DUMP_INTERVAL=$DUMP_INTERVAL LARGE_TIMEOUT=$TIMEOUT)"
	echo "tree:      $HEAD_DESC"
	echo "machine:   $(nproc) CPUs, $MEM_BEFORE available before; load avg $LOAD_BEFORE before, $(cut -d' ' -f1-3 /proc/loadavg) after"
	echo "server:    PostgreSQL $PGVER; fsync off; max_memory $MEMORY, batch_size 5000, dump_interval $DUMP_INTERVAL"
	echo "fetch:     local, one SQL statement, no table; config 1 (one byte)"
	echo
	echo "load:      $LOAD"
	echo "           $LOAD_STATS"
	echo "           worker $OLD_PID: $OLD_RSS"
	echo "restart:   $RESTART"
	echo "           $EXITS"
	[ -z "$NEW_PID" ] || echo "           new worker $NEW_PID: $NEW_RSS"
	echo "entries(): $ENTRIES_LINE"
	echo
	echo "server log: $NLOG ERROR/FATAL/PANIC lines (besides the terminated worker's)"
	[ "$NLOG" -eq 0 ] || log_lines | sed 's/^[^]]*] //' | sort | uniq -c | sort -rn | head -n 5
	echo "total $(( ($(date +%s%N) - START_NS) / 1000000000 )) s"
} >"$WORK/report.txt"
echo
cat "$WORK/report.txt"
cp "$WORK/report.txt" "$OUT"
[ "$(id -u)" -ne 0 ] || chown --reference="$(dirname "$OUT")" "$OUT" 2>/dev/null || true
echo
echo "report: $OUT"
