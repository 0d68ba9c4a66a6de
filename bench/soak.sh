#!/usr/bin/env bash
# bench/soak.sh - readers of hot keys and of a snapshot through each fault
# in turn (issue 29): the source down, the source slower than
# fetch_timeout, the scheduler killed, a scan of cold keys, fast restarts
# of the cache with the source down; reads, NULLs, errors and latency per
# window.
#
#     sudo bash bench/soak.sh                       # about 10 minutes of windows
#     sudo bash bench/soak.sh --minutes 30          # the 30-minute soak
#     sudo bash bench/soak.sh --expiry 30s --grace 5min --hot 2000 --clients 4 --max-memory 64MB
#     sudo bash bench/soak.sh --minutes 3 --faults kill,restart
#
# Options (the issue's scenario by default):
#   --expiry D (5s)  --grace D (1h)  --fetch-timeout D (3s)
#                           projcache.expiry, grace_period, fetch_timeout
#                           (the snapshot's TTL is the expiry)
#   --max-memory M (32MB)   projcache.max_memory
#   --hot N (10000)         hot keys, configs of about 300 bytes
#   --clients N (8)         readers, each of its share of the hot keys
#   --cold N (200000)       keys of the scan, read once each
#   --scan-rate N (0)       the scan's keys a second; 0: as fast as one
#                           connection can (unthrottled; 3300 was 1.3's pace)
#   --scan-loop             the scan loops over its keys until its window
#                           ends (else one pass)
#   --minutes M (10)        the windows' total; they scale to it
#   --faults LIST           a comma-separated subset, in that order, of
#                           down,slow,kill,scan,restart (all by default)
#   --out PATH              the report (bench/results/soak-latest.txt)
#   --keep                  leave the temp dir (the servers' logs, the
#                           readers' records) in place, the servers stopped
#
# Builds and installs this tree (into PostgreSQL 15's directories, as the
# other bench scripts do), then starts two throwaway clusters, run by the
# unprivileged "postgres" OS user, unix sockets only, in a temp dir: the
# source (port 54347, bench/soak_source.sql: the configs and the 500-row
# grants table) and the cache (port 54348, projcache preloaded,
# bench/soak_cache.sql: a fetch function and a snapshot reading the source
# through dblink).  bench/soak.py then reads and applies the faults (see
# bench/README.md), and the report is printed and written to --out,
# beginning with the command that made it.  It asserts nothing about
# speed or NULLs; it exits 1 when a measurement could not be made, 2 on a
# bad option.  The servers are stopped and the temp dir removed on exit,
# error or Ctrl-C.  PROJCACHE_PGBIN picks another PostgreSQL 15 install.
set -euo pipefail

# shellcheck source=SCRIPTDIR/../scripts/lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/../scripts/lib.sh"
# shellcheck source=SCRIPTDIR/lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
NAME=soak
SOURCE_PORT=54347
CACHE_PORT=54348
GRANT_ROWS=500
MAX_RETRY_BACKOFF=2s

COMMAND="${SUDO_USER:+sudo }bash bench/soak.sh"
for a in "$@"; do
	if [[ $a =~ ^[A-Za-z0-9_./=,:+-]+$ ]]; then COMMAND+=" $a"; else COMMAND+=" $(printf '%q' "$a")"; fi
done

EXPIRY=5s
GRACE=1h
FETCH_TIMEOUT=3s
MAX_MEMORY=32MB
HOT=10000
CLIENTS=8
COLD=200000
MINUTES=10
FAULTS=down,slow,kill,scan,restart
OUT=$REPO/bench/results/soak-latest.txt
KEEP=0
SCAN_RATE=0
SCAN_LOOP=0

usage() {
	sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d' | sed 's/^# \{0,1\}//'
	exit "${1:-2}"
}
while [ $# -gt 0 ]; do
	opt=${1%%=*}
	case $opt in
	-h | --help) usage 0 ;;
	--keep) KEEP=1 && shift && continue ;;
	--scan-loop) SCAN_LOOP=1 && shift && continue ;;
	--expiry | --grace | --fetch-timeout | --max-memory | --hot | --clients | --cold | --minutes | --faults | --out | --scan-rate) ;;
	*) echo "$NAME: unknown argument '$1' (--help lists the options)" >&2; exit 2 ;;
	esac
	if [ "$opt" != "$1" ]; then
		val=${1#*=}
	elif [ $# -ge 2 ]; then
		val=$2
		shift
	else
		echo "$NAME: $opt needs a value" >&2
		exit 2
	fi
	shift
	case $opt in
	--expiry) EXPIRY=$val ;;
	--grace) GRACE=$val ;;
	--fetch-timeout) FETCH_TIMEOUT=$val ;;
	--max-memory) MAX_MEMORY=$val ;;
	--hot) HOT=$val ;;
	--clients) CLIENTS=$val ;;
	--cold) COLD=$val ;;
	--minutes) MINUTES=$val ;;
	--faults) FAULTS=$val ;;
	--out) OUT=$val ;;
	--scan-rate) SCAN_RATE=$val ;;
	esac
done
for v in "$EXPIRY" "$GRACE" "$FETCH_TIMEOUT"; do
	[[ $v =~ ^[0-9]+(ms|s|min|h|d)$ ]] || {
		echo "$NAME: '$v' is not a duration such as 500ms, 5s, 2min, 1h or 1d" >&2
		exit 2
	}
done
[[ $MAX_MEMORY =~ ^[0-9]+(kB|MB|GB)$ ]] || { echo "$NAME: --max-memory takes a size such as 32MB" >&2; exit 2; }
for v in "$HOT" "$CLIENTS" "$COLD"; do
	[[ $v =~ ^[1-9][0-9]*$ ]] || { echo "$NAME: --hot, --clients and --cold take positive whole numbers" >&2; exit 2; }
done
[[ $SCAN_RATE =~ ^[0-9]+$ ]] || { echo "$NAME: --scan-rate takes keys a second (0: unthrottled)" >&2; exit 2; }
[ "$CLIENTS" -le 250 ] || { echo "$NAME: at most 250 clients" >&2; exit 2; }
[ "$HOT" -ge "$CLIENTS" ] || { echo "$NAME: --hot must be at least --clients" >&2; exit 2; }
if ! [[ $MINUTES =~ ^[0-9]+(\.[0-9]+)?$ ]] || ! LC_ALL=C awk -v m="$MINUTES" 'BEGIN{exit !(m >= 2)}'; then
	echo "$NAME: --minutes takes a number of minutes, at least 2" >&2
	exit 2
fi
IFS=, read -ra fault_list <<<"$FAULTS"
[ "${#fault_list[@]}" -gt 0 ] || { echo "$NAME: --faults is empty" >&2; exit 2; }
for f in "${fault_list[@]}"; do
	case $f in down | slow | kill | scan | restart) ;;
	*) echo "$NAME: no fault '$f' (down, slow, kill, scan, restart)" >&2; exit 2 ;;
	esac
done
case $OUT in /*) ;; *) OUT=$PWD/$OUT ;; esac
writable_or_exit "$OUT"

WORK=
SOCK=
PY_PID=
# At exit, whatever happened: the load driver and both servers stopped,
# the temp dir removed.
# shellcheck disable=SC2317  # invoked by the EXIT trap
soak_cleanup() {
	local rc=$? d
	trap - EXIT INT TERM HUP
	cd /
	[ -z "$PY_PID" ] || kill "$PY_PID" 2>/dev/null || true
	[ -z "$PY_PID" ] || wait "$PY_PID" 2>/dev/null || true
	for d in cache source; do
		if [ -z "$WORK" ] || [ ! -f "$WORK/$d/postmaster.pid" ]; then continue; fi
		if [ "$rc" -ne 0 ] && [ -f "$WORK/$d.log" ]; then
			echo "--- last lines of the $d server's log ---"
			tail -n 20 "$WORK/$d.log"
		fi
		"${AS_PG[@]}" "$PGBIN/pg_ctl" stop -D "$WORK/$d" -m fast -w -t 30 >/dev/null 2>&1 ||
			"${AS_PG[@]}" "$PGBIN/pg_ctl" stop -D "$WORK/$d" -m immediate -w -t 30 >/dev/null 2>&1 || true
	done
	if [ -n "$WORK" ] && [ "$KEEP" = 1 ]; then
		echo "$NAME: kept $WORK (remove it when done)"
	elif [ -n "$WORK" ]; then
		rm -rf "$WORK"
	fi
	[ "$rc" -eq 0 ] || echo "$NAME FAILED (exit $rc); servers stopped" >&2
	exit "$rc"
}
trap soak_cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM HUP

bash "$REPO/scripts/install-deps.sh"
[ -f "$("$PG_CONFIG" --pkglibdir)/dblink.so" ] || {
	echo "$NAME: dblink is not installed in $("$PG_CONFIG" --pkglibdir) (Debian's postgresql-15 has it)" >&2
	exit 1
}

START_NS=$(date +%s%N)
LOAD_BEFORE=$(cut -d' ' -f1-3 /proc/loadavg)
GIT=(git -C "$REPO" -c safe.directory='*')
HEAD_DESC=$("${GIT[@]}" log -1 --format='%H %s' 2>/dev/null | cut -c1-100 || echo unknown)
[ -z "$("${GIT[@]}" status --porcelain --untracked-files=no 2>/dev/null)" ] ||
	HEAD_DESC="$HEAD_DESC (+ uncommitted changes)"

setup_work projcache-soak
# The install is shared: another build installed meanwhile would be what
# the restarts load.  The report says whether the library stayed this one.
LIB=$("$PG_CONFIG" --pkglibdir)/projcache.so
LIB_SUM=$(sha256sum "$LIB" | cut -c1-16)

# start_node NAME PORT <CONF: initdb $WORK/NAME, append CONF, start it.
start_node() {
	local name=$1 port=$2
	"${AS_PG[@]}" "$PGBIN/initdb" -D "$WORK/$name" -A trust -U postgres --no-sync \
		</dev/null >"$WORK/initdb-$name.log" 2>&1 ||
		{ cat "$WORK/initdb-$name.log"; exit 1; }
	{
		echo
		echo "port = $port"
		echo "listen_addresses = ''"
		echo "unix_socket_directories = '$SOCK'"
		echo "fsync = off"
		cat
	} >>"$WORK/$name/postgresql.conf"
	"${AS_PG[@]}" "$PGBIN/pg_ctl" start -D "$WORK/$name" -l "$WORK/$name.log" -w -t 60 >/dev/null
	echo "$name server running: psql -h $SOCK -p $port -d postgres"
}
psql_on() {
	local port=$1
	shift
	"${AS_PG[@]}" "$PGBIN/psql" -X -q -v ON_ERROR_STOP=1 -h "$SOCK" -p "$port" -d postgres "$@"
}

start_node source "$SOURCE_PORT" </dev/null
echo "loading bench/soak_source.sql ($HOT hot keys, $COLD cold ones, $GRANT_ROWS grants)"
psql_on "$SOURCE_PORT" -v hot_keys="$HOT" -v cold_keys="$COLD" -v grant_rows="$GRANT_ROWS" \
	-f "$WORK/src/bench/soak_source.sql"

start_node cache "$CACHE_PORT" <<EOF
shared_preload_libraries = 'projcache'
projcache.database = 'postgres'
projcache.fetch_function = 'public.fetch_remote'
projcache.max_memory = '$MAX_MEMORY'
projcache.expiry = '$EXPIRY'
projcache.grace_period = '$GRACE'
projcache.fetch_timeout = '$FETCH_TIMEOUT'
projcache.max_retry_backoff = '$MAX_RETRY_BACKOFF'
EOF
psql_on "$CACHE_PORT" -v connstr="host=$SOCK port=$SOURCE_PORT dbname=postgres user=postgres connect_timeout=2" \
	-v ttl="$EXPIRY" -f "$WORK/src/bench/soak_cache.sql"
PGVER=$(psql_on "$CACHE_PORT" -At -c "SHOW server_version")
# The source's functions sleep this long while slow: past fetch_timeout
# (or 10 s with no timeout).
SLOW=$(psql_on "$CACHE_PORT" -At -c "SELECT (CASE WHEN t = 0 THEN 10 ELSE t + 2 END)::float8
	FROM extract(epoch FROM interval '$FETCH_TIMEOUT') AS t")
SETTINGS=$(psql_on "$CACHE_PORT" -At -c "SELECT string_agg(name || ' ' || setting || coalesce(unit, ''), ', ' ORDER BY name)
	FROM pg_settings WHERE name LIKE 'projcache.%' AND setting IS DISTINCT FROM boot_val")

echo "running bench/soak.py"
"${AS_PG[@]}" SOAK_PGBIN="$PGBIN" SOAK_SOCK="$SOCK" SOAK_CACHE_PORT="$CACHE_PORT" \
	SOAK_SOURCE_PORT="$SOURCE_PORT" SOAK_CACHE_DATA="$WORK/cache" SOAK_SOURCE_DATA="$WORK/source" \
	SOAK_WORK="$WORK" SOAK_HOT="$HOT" SOAK_COLD="$COLD" SOAK_CLIENTS="$CLIENTS" \
	SOAK_MINUTES="$MINUTES" SOAK_SLOW_SECONDS="$SLOW" SOAK_GRANT_ROWS="$GRANT_ROWS" \
	SOAK_FAULTS="$FAULTS" SOAK_REPORT="$WORK/soak-report.txt" \
	SOAK_SCAN_RATE="$SCAN_RATE" SOAK_SCAN_LOOP="$SCAN_LOOP" \
	python3 "$WORK/src/bench/soak.py" &
PY_PID=$!
PY_RC=0
wait "$PY_PID" || PY_RC=$?
PY_PID=
[ -f "$WORK/soak-report.txt" ] || { echo "$NAME: bench/soak.py wrote no report (exit $PY_RC)" >&2; exit 1; }
LOAD_AFTER=$(cut -d' ' -f1-3 /proc/loadavg)
LIB_NOW=$(sha256sum "$LIB" 2>/dev/null | cut -c1-16 || true)
if [ "$LIB_NOW" = "$LIB_SUM" ]; then
	LIB_LINE="$LIB, sha256 $LIB_SUM..., built from this tree and unchanged through the run"
else
	LIB_LINE="$LIB CHANGED during the run (sha256 $LIB_SUM... installed, ${LIB_NOW:-none}... at the end): another install; the restarts may have loaded another build"
	PY_RC=1
fi

# log_lines SERVER: its log's ERROR/WARNING/FATAL/PANIC lines and their
# DETAILs, less what a fast shutdown says to every session and worker.
log_lines() {
	grep -E '(ERROR|WARNING|FATAL|PANIC|DETAIL):' "$WORK/$1.log" |
		grep -vE 'FATAL:  terminating (background worker ".*"|connection) due to administrator command' || true
}
{
	echo "command:   $COMMAND"
	echo "date:      $(date -u '+%Y-%m-%d %H:%M:%S UTC')"
	echo "head:      $HEAD_DESC"
	echo "machine:   $(nproc) CPUs, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//'); load avg $LOAD_BEFORE before, $LOAD_AFTER after"
	echo "servers:   PostgreSQL $PGVER; the source on port $SOURCE_PORT, the cache on $CACHE_PORT; unix sockets, fsync off"
	echo "library:   $LIB_LINE"
	echo "settings:  --expiry $EXPIRY --grace $GRACE --fetch-timeout $FETCH_TIMEOUT --max-memory $MAX_MEMORY --hot $HOT --clients $CLIENTS --cold $COLD --scan-rate $SCAN_RATE$([ "$SCAN_LOOP" = 1 ] && echo ' --scan-loop') --minutes $MINUTES --faults $FAULTS"
	echo "cache:     $SETTINGS; other projcache settings default"
	echo "source:    fetch through dblink, not_modified for an unchanged revision; snapshot \"grants\" ($GRANT_ROWS rows"
	echo "           through dblink, key user_id, TTL $EXPIRY) read as the foreign table public.grants; slow: ${SLOW} s a call"
	echo "readers:   $CLIENTS clients, each key about once a second, one get() a statement (prepared); one read in eight"
	echo "           a count(*) of public.grants instead; scan: one more client, $COLD cold keys, 500 a statement, $([ "$SCAN_RATE" = 0 ] && echo unthrottled || echo "$SCAN_RATE keys/s")$([ "$SCAN_LOOP" = 1 ] && echo ', looping' || echo ', once each')"
	echo "windows:   quiet, then each fault followed by a quiet window; a fault's window is twice a quiet one"
	echo
	cat "$WORK/soak-report.txt"
	echo
	for d in cache source; do
		n=$(log_lines "$d" | wc -l)
		echo "$d server log: $n ERROR/WARNING/FATAL/PANIC/DETAIL lines (besides the FATALs of fast shutdowns), the most frequent"
		[ "$n" -eq 0 ] || log_lines "$d" | sed 's/^[^]]*] //' | sed -E 's/[0-9]+(\.[0-9]+)?/N/g' |
			sort | uniq -c | sort -rn | head -n 12
	done
	echo "cache server log, its dump loads and writes at exit:"
	grep -E 'LOG:  projcache (loaded|dumped|wrote)|projcache.*dump' "$WORK/cache.log" | sed 's/^/  /' | head -n 40 || echo "  none"
	echo
	echo "total $(( ($(date +%s%N) - START_NS) / 1000000000 )) s"
} >"$WORK/report.txt"
cat "$WORK/report.txt"
mkdir -p "$(dirname "$OUT")"
cp "$WORK/report.txt" "$OUT"
[ "$(id -u)" -ne 0 ] || chown --reference="$(dirname "$OUT")" "$OUT" 2>/dev/null || true
echo
echo "report: $OUT"
if [ "$PY_RC" -ne 0 ]; then
	echo "$NAME: a measurement could not be made (see MEASUREMENT FAILED or library in the report)" >&2
	exit 1
fi
