#!/usr/bin/env bash
# bench/dump.sh - the key map's dump and load (issue 22) at a million keys:
# how long a periodic dump, the dump at shutdown and the load at the next
# start take, and what a periodic dump costs get() hits meanwhile.
#
#     sudo bash bench/dump.sh                     # about 10 minutes
#     sudo BENCH_SECONDS=5 DUMP_PAIRS=5 bash bench/dump.sh
#     sudo DUMP_KEYS=100000 bash bench/dump.sh    # a smaller map
#
# Builds and installs this tree, starts a throwaway cluster (port 54345,
# unix socket only, run by the unprivileged "postgres" OS user, fsync off
# for the server but not for the dump, which fsyncs its file itself) with
# projcache.max_memory = 2GB, expiry and grace_period 4h (nothing expires
# or is refetched during the run), batch_size 5000, batch_interval the
# default 100ms (a periodic dump writes a slice of at most that long per
# turn of the worker's loop) and dump_interval 0 (at shutdown only), and
# loads bench/dump.sql, whose fetch function makes each key's ~1 kB
# config on the fly.  Then, in one run:
#
# 1. Fill: projcache.fetch() of key-1 .. key-N (DUMP_KEYS, 1,000,000),
#    50,000 a statement, then until all N are enabled.  Timed, reported,
#    not the point.
# 2. One periodic dump: dump_interval set to 1s (ALTER SYSTEM, reload), so
#    that the worker starts one at once (its next dump was due at start),
#    and to 0 as soon as it started, so that it is the only one; timed from the reload to projcache.stats.last_dump_at, and by the
#    worker's own DEBUG1 line (log_min_messages = debug1 for that phase
#    only).  The file's size and mode (and its temporary file's, while
#    written); the worker's CPU time over it.
# 3. get() hits during dumps beside without: pgbench -n -M prepared of
#    bench/dump_get.sql (a random key of the N) at -c 1 and at -c 8 (-j at
#    most the CPUs), BENCH_SECONDS (5) a run, in DUMP_PAIRS (5) pairs of
#    runs side by side, the order alternating.  A dump of N keys may be
#    shorter than a run, so a "dump" run has dump_interval = 1s: dumps
#    follow each other back to back for the whole run; it starts once the
#    worker took the setting (projcache.stats.config_generation) and the
#    dump's temporary file exists.  A "no dump" run has dump_interval = 0
#    and starts once the worker took that and the dump in progress ended.
#    Each run reports its TPS, the dumps completed in it and the worker's
#    CPU seconds (from /proc), which say whether it ran as labelled; each
#    pair its ratio (dump TPS / no-dump TPS); each client count the median
#    and the range of the ratios.
# 4. The dump at shutdown: pg_ctl stop -m fast, timed (the worker writes
#    the whole map as it exits).  The file's size and mode.
# 5. The load: pg_ctl start, timed until the worker's "projcache loaded N
#    keys" LOG line (its timestamp) and until projcache.stats.loaded_keys
#    says so; loaded_keys against N, and key-1's value against the source.
#
# It asserts nothing about speed: it reports what it measured, and exits
# non-zero only when a measurement could not be made.  The report is
# printed and written to bench/results/dump-latest.txt (DUMP_OUT=path:
# elsewhere) with the command, the date, the machine (nproc, load average
# before and after) and the tree's commit.  The server is stopped and the
# temp dir removed on exit, error or Ctrl-C; this tree stays installed.
# PROJCACHE_PGBIN picks another PostgreSQL 15 install.
set -euo pipefail

# shellcheck source=SCRIPTDIR/../scripts/lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/../scripts/lib.sh"
# shellcheck source=SCRIPTDIR/lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
NAME=dump
PORT=54345
OUT=${DUMP_OUT:-$REPO/bench/results/dump-latest.txt}
COMMAND="$0${*:+ $*}"
WORK=
DATA=
SOCK=

DURATION=${BENCH_SECONDS:-5}
PAIRS=${DUMP_PAIRS:-5}
KEYS=${DUMP_KEYS:-1000000}
MEMORY=${DUMP_MEMORY:-2GB}
CHUNK=50000
for v in "$DURATION" "$PAIRS" "$KEYS"; do
	case $v in '' | 0 | *[!0-9]*)
		echo "$NAME: BENCH_SECONDS, DUMP_PAIRS and DUMP_KEYS must be positive whole numbers" >&2
		exit 2 ;;
	esac
done
writable_or_exit "$OUT"

cleanup_on_exit
bash "$REPO/scripts/install-deps.sh"

START_NS=$(date +%s%N)
LOAD_BEFORE=$(cut -d' ' -f1-3 /proc/loadavg)
setup_work projcache-dump
GIT=(git -C "$REPO" -c safe.directory='*')
HEAD_DESC=$("${GIT[@]}" log -1 --format='%h %s' HEAD 2>/dev/null | cut -c1-72 || echo unknown)
[ -z "$("${GIT[@]}" status --porcelain --untracked-files=no 2>/dev/null)" ] ||
	HEAD_DESC="$HEAD_DESC (+ uncommitted changes)"
DATA=$WORK/data
FILE=$DATA/projcache_keys.dump
TICKS=$(getconf CLK_TCK)

now_ms() { date +%s%3N; }
secs() { LC_ALL=C awk -v ms="$1" 'BEGIN{printf "%.2f", ms / 1000}'; }

# wait_for SQL TIMEOUT WHAT: poll until SQL returns t, every 0.1 s.
wait_for() {
	local t0
	t0=$(now_ms)
	until [ "$(pgvalue "$1")" = t ]; do
		if [ $(($(now_ms) - t0)) -gt $(($2 * 1000)) ]; then
			echo "$NAME: $3 not within $2 s" >&2
			exit 1
		fi
		sleep 0.1
	done
}

# set_interval VALUE: dump_interval = VALUE, and wait until the worker
# took it (its config_generation moved).
set_interval() {
	local gen
	gen=$(pgvalue "SELECT config_generation FROM projcache.stats")
	pgvalue "ALTER SYSTEM SET projcache.dump_interval = '$1'" >/dev/null
	pgvalue "SELECT pg_reload_conf()" >/dev/null
	wait_for "SELECT config_generation > $gen FROM projcache.stats" 60 "the worker taking dump_interval = $1"
}

# worker_cpu: the scheduler's CPU time so far, in ms.
worker_cpu() {
	awk -v t="$TICKS" '{ sub(/^.*\) /, ""); print int(($12 + $13) * 1000 / t) }' "/proc/$WORKER_PID/stat"
}

# file_info PATH: size in bytes and MB, and mode.
file_info() {
	stat -c '%s %a' "$1" | LC_ALL=C awk '{printf "%d bytes (%.1f MB), mode %s", $1, $1 / 1048576, $2}'
}

start_cluster <<EOF
listen_addresses = ''
fsync = off
log_line_prefix = '%m [%p] '
shared_preload_libraries = 'projcache'
projcache.database = 'postgres'
projcache.fetch_function = 'public.dump_fetch'
projcache.max_memory = '$MEMORY'
projcache.expiry = '4h'
projcache.grace_period = '4h'
projcache.batch_size = 5000
projcache.dump_interval = 0
EOF
pgrun -f "$WORK/src/bench/dump.sql"
WORKER_PID=$(pgvalue "SELECT worker_pid FROM projcache.stats")

# ------------------------------------------------------------------ 1. fill
echo "=== 1. filling $KEYS keys"
t0=$(now_ms)
for ((from = 1; from <= KEYS; from += CHUNK)); do
	to=$((from + CHUNK - 1 < KEYS ? from + CHUNK - 1 : KEYS))
	pgvalue "SELECT public.fill($from, $to)" >/dev/null
done
t_asked=$(now_ms)
wait_for "SELECT fetched_keys >= $KEYS FROM projcache.stats" 1800 "$KEYS keys fetched"
wait_for "SELECT count(*) = $KEYS FROM projcache.entries WHERE state = 'enabled'" 600 "$KEYS keys enabled"
t1=$(now_ms)
FILL="$KEYS keys in $(secs $((t1 - t0))) s ($(secs $((t_asked - t0))) s asking, 50,000 fetch() a statement)"
FILL_STATS=$(pgvalue "SELECT format('entries %s, memory_used %s MB of %s MB, fetch_calls %s, fetched_keys %s, request_overflows %s, fetch_errors %s',
                              entries, round(memory_used / 1048576.0), round(memory_limit / 1048576.0),
                              fetch_calls, fetched_keys, request_overflows, fetch_errors) FROM projcache.stats")
VALUE_BYTES=$(pgvalue "SELECT round(avg(value_bytes)) FROM projcache.entries")
echo "$FILL"

# ------------------------------------------------------- 2. a periodic dump
echo "=== 2. one periodic dump"
pgvalue "ALTER SYSTEM SET log_min_messages = debug1" >/dev/null
cpu0=$(worker_cpu)
t0=$(now_ms)
# 1s, then 0 as soon as it started: one dump, and the next is due at once
# when section 3 sets 1s again (a reload does not move the time it is due).
set_interval 1s
wait_for "SELECT (pg_stat_file('projcache_keys.dump.tmp', true)).size IS NOT NULL OR last_dump_at IS NOT NULL FROM projcache.stats" 600 "a dump under way"
TMP_MODE=$(stat -c %a "$FILE.tmp" 2>/dev/null || echo "gone before it was seen")
set_interval 0
wait_for "SELECT last_dump_at IS NOT NULL FROM projcache.stats" 1800 "the periodic dump"
cpu1=$(worker_cpu)
pgvalue "ALTER SYSTEM RESET log_min_messages" >/dev/null
pgvalue "SELECT pg_reload_conf()" >/dev/null
PERIODIC_END=$(pgvalue "SELECT round(extract(epoch FROM last_dump_at) * 1000)::bigint FROM projcache.stats")
PERIODIC_KEYS=$(pgvalue "SELECT last_dump_keys FROM projcache.stats")
PERIODIC_LOG=$(grep -o 'projcache dumped [0-9]* keys in [0-9]* ms' "$WORK/server.log" | tail -n 1 || true)
PERIODIC="${PERIODIC_LOG:-no DEBUG1 line} (the worker's DEBUG1 line: from listing the keys to the rename); last_dump_keys $PERIODIC_KEYS; worker CPU $(secs $((cpu1 - cpu0))) s"
PERIODIC_WALL="$(secs $((PERIODIC_END - t0))) s from the first ALTER SYSTEM to last_dump_at (with the script's psql round trips)"
PERIODIC_FILE=$(file_info "$FILE")
echo "$PERIODIC"
echo "file: $PERIODIC_FILE"

# ------------------------------------------- 3. get() hits during dumps or not
echo "=== 3. get() hits during dumps and without, $PAIRS pairs of ${DURATION} s runs"
# run_window MODE CLIENTS: one pgbench run with dumps (MODE dump) or
# without (MODE none); prints "TPS DUMPS CPU_S".
run_window() {
	local mode=$1 c=$2 jobs dumps0 dumps1 cpu0 cpu1 tps
	jobs=$((c < $(nproc) ? c : $(nproc)))
	if [ "$mode" = dump ]; then
		set_interval 1s
		wait_for "SELECT (pg_stat_file('projcache_keys.dump.tmp', true)).size IS NOT NULL" 120 "a dump under way"
	else
		set_interval 0
		wait_for "SELECT (pg_stat_file('projcache_keys.dump.tmp', true)).size IS NULL" 600 "the dump under way to end"
	fi
	dumps0=$(pgvalue "SELECT extract(epoch FROM last_dump_at) FROM projcache.stats")
	cpu0=$(worker_cpu)
	tps=$("${AS_PG[@]}" "$PGBIN/pgbench" -n -M prepared -f "$WORK/src/bench/dump_get.sql" -D keys="$KEYS" \
		-c "$c" -j "$jobs" -T "$DURATION" -h "$SOCK" -p "$PORT" postgres 2>"$WORK/pgbench.err" |
		awk '/^tps = /{print $3; exit}')
	cpu1=$(worker_cpu)
	dumps1=$(pgvalue "SELECT extract(epoch FROM last_dump_at) FROM projcache.stats")
	if [ -z "$tps" ]; then
		cat "$WORK/pgbench.err" >&2
		echo "$NAME: pgbench failed" >&2
		exit 1
	fi
	# dumps completed in the run: at least one if last_dump_at moved
	# (the DEBUG1 lines are off here); the CPU says how busy the worker was.
	echo "$tps $([ "$dumps0" = "$dumps1" ] && echo no || echo yes) $(secs $((cpu1 - cpu0)))"
}

pgvalue "SELECT projcache.reset_stats()" >/dev/null
PAIR_LINES=()
SUMMARY=()
declare -A TPS MOVED CPU
for c in 1 8; do
	ratios=()
	for p in $(seq 1 "$PAIRS"); do
		if [ $((p % 2)) -eq 1 ]; then order=(none dump); else order=(dump none); fi
		for mode in "${order[@]}"; do
			run_window "$mode" "$c" >"$WORK/window"
			read -r "TPS[$mode]" "MOVED[$mode]" "CPU[$mode]" <"$WORK/window"
		done
		r=$(ratio "${TPS[dump]}" "${TPS[none]}" %.3f)
		ratios+=("$r")
		PAIR_LINES+=("$(printf -- '-c %d pair %d (%-10s): no dump %8.0f TPS (worker CPU %5s s, a dump ended in it: %-3s) | dump %8.0f TPS (worker CPU %5s s, a dump ended in it: %-3s) | ratio %s' \
			"$c" "$p" "${order[0]} first" "${TPS[none]}" "${CPU[none]}" "${MOVED[none]}" "${TPS[dump]}" "${CPU[dump]}" "${MOVED[dump]}" "$r")")
		echo "${PAIR_LINES[-1]}"
	done
	SUMMARY+=("$(printf '%s\n' "${ratios[@]}" | sort -n |
		LC_ALL=C awk -v c="$c" '{ v[NR] = $1 } END {
			m = (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2
			printf "-c %d: median ratio %.3f, lowest %.3f, highest %.3f (%d pairs)", c, m, v[1], v[NR], NR }')")
done
HITS=$(pgvalue "SELECT format('%s hits, %s other reads (misses + pending_reads), %s fetch_calls, %s refused_reads', hits, misses + pending_reads, fetch_calls, refused_reads) FROM projcache.stats")
DUMPS_WRITTEN=$(pgvalue "SELECT last_dump_keys FROM projcache.stats")

# ------------------------------------------------------ 4. the exit dump
echo "=== 4. the dump at shutdown (pg_ctl stop -m fast)"
set_interval 0
wait_for "SELECT (pg_stat_file('projcache_keys.dump.tmp', true)).size IS NULL" 600 "the dump under way to end"
# The worker's DEBUG1 line times the exit dump too.
pgvalue "ALTER SYSTEM SET log_min_messages = debug1" >/dev/null
set_interval 0
cd /
t0=$(now_ms)
stop_cluster
t1=$(now_ms)
STOP_MS=$((t1 - t0))
EXIT_FILE=$(file_info "$FILE")
EXIT_LOG=$(grep -o 'projcache dumped [0-9]* keys in [0-9]* ms' "$WORK/server.log" | tail -n 1 || true)
EXIT_LINE="pg_ctl stop -m fast: $(secs $STOP_MS) s, its last write $(secs $(($(date -r "$FILE" +%s%3N) - t0))) s after the stop began (then fsync and rename)"
echo "$EXIT_LINE; file: $EXIT_FILE"

# ------------------------------------------------------------- 5. the load
echo "=== 5. the load at the next start"
mv "$WORK/server.log" "$WORK/server-1.log"
t0=$(now_ms)
"${AS_PG[@]}" "$PGBIN/pg_ctl" start -D "$DATA" -l "$WORK/server.log" -w -t 600 \
	-o "-p $PORT -k $SOCK" >/dev/null
t_ready=$(now_ms)
# The worker says it is ready once it loaded the dump (or found none).
until grep -q 'projcache scheduler ready' "$WORK/server.log"; do
	if [ $(($(now_ms) - t0)) -gt 1800000 ]; then
		echo "$NAME: the worker not ready within 1800 s" >&2
		exit 1
	fi
	sleep 0.1
done
wait_for "SELECT loaded_keys > 0 FROM projcache.stats" 60 "loaded_keys"
t1=$(now_ms)
LOADED_LINE=$(grep -m1 'projcache loaded [0-9]* keys' "$WORK/server.log" || true)
LOADED_AT=$(printf '%s' "$LOADED_LINE" | awk '{print $1 " " $2}')
if [ -n "$LOADED_AT" ]; then
	LOADED_MS=$(date -d "$LOADED_AT" +%s%3N)
	LOAD_LINE="$(secs $((LOADED_MS - t0))) s from pg_ctl start to the LOG line"
else
	LOAD_LINE="no LOG line"
fi
LOAD_LINE="$LOAD_LINE; pg_ctl start -w returned after $(secs $((t_ready - t0))) s, loaded_keys seen after $(secs $((t1 - t0))) s"
pgvalue "ALTER SYSTEM RESET log_min_messages" >/dev/null
pgvalue "SELECT pg_reload_conf()" >/dev/null
LOADED=$(pgvalue "SELECT format('loaded_keys %s of %s, loaded_dump_age %s, entries %s, memory_used %s MB', loaded_keys, $KEYS, loaded_dump_age, entries, round(memory_used / 1048576.0)) FROM projcache.stats")
SAME=$(pgvalue "SELECT projcache.get('key-1') = (SELECT config FROM public.dump_fetch(ARRAY['key-1'], ARRAY[NULL::text]))")
echo "$LOAD_LINE"
echo "$LOADED"
# The same stop with dumps off: what pg_ctl stop takes without the dump.
set_interval -1
cd /
t0=$(now_ms)
stop_cluster
t1=$(now_ms)
EXIT_LINE="$EXIT_LINE; with dump_interval -1 (no exit dump) the same stop takes $(secs $((t1 - t0))) s"

log_lines() {
	cat "$WORK/server-1.log" "$WORK/server.log" | grep -E '(ERROR|WARNING|FATAL|PANIC):' |
		grep -vE 'FATAL:  terminating background worker "projcache [a-z]+" due to administrator command' || true
}
PGVER=$("${AS_PG[@]}" "$PGBIN/postgres" --version | sed 's/^postgres (PostgreSQL) //')
NLOG=$(log_lines | wc -l)

{
	echo "projcache: the key map's dump and load (bench/dump.sh), $(date -u '+%Y-%m-%d %H:%M:%S UTC')"
	echo "command:   $COMMAND (BENCH_SECONDS=$DURATION DUMP_PAIRS=$PAIRS DUMP_KEYS=$KEYS)"
	echo "tree:      $HEAD_DESC"
	echo "machine:   $(nproc) CPUs, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//'); load avg $LOAD_BEFORE before, $(cut -d' ' -f1-3 /proc/loadavg) after"
	echo "server:    PostgreSQL $PGVER; fsync off (the dump fsyncs its file); projcache.max_memory $MEMORY, expiry 4h, grace_period 4h,"
	echo "           batch_size 5000, batch_interval 100ms (default), dump_interval 0 unless said"
	echo
	echo "1. fill:           $FILL"
	echo "                   average value_bytes $VALUE_BYTES; $FILL_STATS"
	echo "2. periodic dump:  $PERIODIC"
	echo "                   $PERIODIC_WALL"
	echo "                   file: $PERIODIC_FILE; the temporary file while it was written: mode $TMP_MODE"
	echo "3. get() hits, pgbench -n -M prepared -T $DURATION, a random key of $KEYS; ratio = TPS during dumps / TPS without, runs side by side"
	echo "   (dump runs: dump_interval 1s, dumps back to back over the whole run; no-dump runs: dump_interval 0, no dump under way)"
	printf '   %s\n' "${PAIR_LINES[@]}"
	printf '   %s\n' "${SUMMARY[@]}"
	echo "   counters over section 3: $HITS; last_dump_keys $DUMPS_WRITTEN"
	echo "4. exit dump:      $EXIT_LINE (the worker writes all $KEYS keys as it exits)"
	echo "                   the worker's DEBUG1 line: ${EXIT_LOG:-none}"
	echo "                   file: $EXIT_FILE"
	echo "5. load:           $LOAD_LINE"
	echo "                   $LOADED; key-1's value as the source's: ${SAME:-?}"
	echo "                   ${LOADED_LINE#* \[*\] }"
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
