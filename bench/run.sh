#!/usr/bin/env bash
# bench/run.sh - measure projcache's key cache and snapshot cache.
#
#     sudo bash bench/run.sh              # each pgbench run 10 s
#     sudo BENCH_SECONDS=5 bash bench/run.sh
#     sudo BENCH_PNG=/tmp/b.png bash bench/run.sh   # the plot elsewhere
#     sudo PG_MAJOR=18 bash bench/run.sh  # on 18: results/latest-pg18.*
#
# Installs the dependencies, builds and installs the extension from a copy of
# this tree, starts a throwaway cluster (port 54339, socket and data in a temp
# dir, unix socket only, run by the unprivileged "postgres" OS user) with
# projcache preloaded, measures, and prints a report.  It asserts nothing
# about speed: it reports what it measured.  The server is always stopped and
# the temp dir removed on exit, error or Ctrl-C.  Section 4's ratios to
# SELECT 1 at -c 1 and -c 8 are also drawn (gnuplot) into
# bench/results/latest.png, with the numbers in latest.dat beside it, in the
# source tree: the only thing a run keeps.  See bench/README.md.
set -euo pipefail

# shellcheck source=SCRIPTDIR/../scripts/lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/../scripts/lib.sh"
NAME=bench
BENCH=$REPO/bench
PORT=54339
DURATION=${BENCH_SECONDS:-10}     # seconds per pgbench run
CLIENTS=2                         # pgbench -c of sections 1 and 3
RATIO_CLIENTS=(1 8)               # pgbench -c of section 4 and the plot
LOOP_CALLS=100000                 # in-server loop iterations
HOT_KEYS=1000
COLD_KEYS=10000
WORK=
DATA=
SOCK=
ERRORS=0                          # measurements that could not be made

case $DURATION in
'' | *[!0-9]*) echo "BENCH_SECONDS must be a whole number of seconds" >&2; exit 2 ;;
esac

# The plot and its data go to the source tree (the temp copy is removed at
# exit), or to BENCH_PNG with the data beside it (.png -> .dat).  A relative
# BENCH_PNG is the caller's: resolved now, before the script changes
# directory.  Checked before the build, not after minutes of measuring.
# On another major than 15 (PG_MAJOR), latest-pgN.png and .dat.
if [ "${PG_MAJOR:-15}" = 15 ]; then
	PNG=${BENCH_PNG:-$BENCH/results/latest.png}
else
	PNG=${BENCH_PNG:-$BENCH/results/latest-pg$PG_MAJOR.png}
fi
case $PNG in /*) ;; *) PNG=$PWD/$PNG ;; esac
DAT=${PNG%.png}.dat
if ! mkdir -p "$(dirname "$PNG")" || ! [ -w "$(dirname "$PNG")" ]; then
	echo "bench: cannot write into $(dirname "$PNG") (set BENCH_PNG to put the plot elsewhere)" >&2
	exit 2
fi

cleanup_on_exit

START_NS=$(date +%s%N)
step() { printf '\n=== [%ss] %s\n' "$(awk -v ns="$(( $(date +%s%N) - START_NS ))" 'BEGIN{printf "%5.1f", ns / 1e9}')" "$*"; }

# pb_jobs C: pgbench -j for C clients, at most one thread per CPU (like
# bench/lib.sh's prepared_tps): more threads than CPUs only add switching.
pb_jobs() { echo $(($1 < $(nproc) ? $1 : $(nproc))); }

# run_pgbench SCRIPT [CLIENTS [PROTOCOL]]: pgbench -n -M PROTOCOL (default
# simple) -f SCRIPT -c CLIENTS (default $CLIENTS) -j $(pb_jobs CLIENTS)
# -T $DURATION over the unix socket.  Sets PB_TPS, PB_LAT (ms), PB_XACTS,
# PB_FAILED; "error" when pgbench itself failed or printed no tps (its
# output is printed then).
run_pgbench() {
	local c=${2:-$CLIENTS} mode=${3:-simple}
	local script=$WORK/bench/$1 out=$WORK/pgbench.$1.c$c.$mode.log j
	j=$(pb_jobs "$c")
	PB_TPS=error PB_LAT=error PB_XACTS=error PB_FAILED=error
	echo "pgbench -n -M $mode -f $1 -c $c -j $j -T $DURATION"
	if ! "${AS_PG[@]}" "$PGBIN/pgbench" -n -M "$mode" -f "$script" -c "$c" -j "$j" \
		-T "$DURATION" -h "$SOCK" -p "$PORT" postgres >"$out" 2>&1; then
		cat "$out"
		echo "bench: pgbench -f $1 -c $c failed" >&2
		ERRORS=$((ERRORS + 1))
		return 0
	fi
	PB_TPS=$(awk '/^tps = /{print $3; exit}' "$out")
	if ! num "$PB_TPS"; then
		cat "$out"
		echo "bench: pgbench -f $1 -c $c printed no tps" >&2
		PB_TPS=error
		ERRORS=$((ERRORS + 1))
		return 0
	fi
	PB_LAT=$(awk '/^latency average = /{print $4; exit}' "$out")
	PB_XACTS=$(awk -F': *' '/^number of transactions actually processed/{print $2; exit}' "$out")
	PB_FAILED=$(awk -F': *' '/^number of failed transactions/{print $2; exit}' "$out")
	PB_FAILED=${PB_FAILED:-0}
	PB_FAILED=${PB_FAILED%% *}          # "0 (0.000%)" -> "0"
	echo "  tps $PB_TPS, latency average $PB_LAT ms, transactions $PB_XACTS, failed $PB_FAILED"
}

# Number formatting for the report; "error" and empty stay as they are.
# shellcheck disable=SC2059  # the format is the caller's
fmt() { # fmt PRINTF_FORMAT VALUE
	case $2 in '' | error | *[!0-9.e+-]*) printf '%s' "${2:-?}" ;; *) LC_ALL=C printf "$1" "$2" ;; esac
}
num() { case $1 in '' | error | *[!0-9.e+-]*) return 1 ;; esac; }
# us_minus A_MS B_MS: (A - B) in microseconds, or "-".
us_minus() { if num "$1" && num "$2"; then LC_ALL=C awk -v a="$1" -v b="$2" 'BEGIN{printf "%+.1f", (a-b)*1000}'; else printf -- -; fi; }
# tps_ratio A B: A / B to 3 places, or "missing" when either was not
# measured: a failed run must not read as a ratio of 0.
tps_ratio() {
	if num "$1" && num "$2" && LC_ALL=C awk -v b="$2" 'BEGIN{exit !(b > 0)}'; then
		LC_ALL=C awk -v a="$1" -v b="$2" 'BEGIN{printf "%.3f", a / b}'
	else printf missing; fi
}
# or_missing V: V, or "missing" when it is not a number.
or_missing() { if num "$1"; then printf '%s' "$1"; else printf missing; fi; }
# gpq S: S as a single-quoted gnuplot string (a ' is written '').
gpq() { printf "'%s'" "${1//\'/\'\'}"; }

REPORT=()
say() { REPORT+=("$*"); }
row() { # row FORMAT ARGS...: a formatted report line
	local line
	# shellcheck disable=SC2059
	line=$(LC_ALL=C printf "$@")
	REPORT+=("$line")
}

# ------------------------------------------------------------ setup
step "setup: dependencies, build, install, throwaway cluster on port $PORT"
bash "$REPO/scripts/install-deps.sh"
use_major

WORK=$(mktemp -d "${TMPDIR:-/tmp}/projcache-bench.XXXXXX")
DATA=$WORK/data
SOCK=$WORK/sock
mkdir -p "$WORK/src" "$WORK/bench" "$SOCK"
copy_tree "$WORK/src"
cp "$BENCH"/*.sql "$WORK/bench/"
own_work
cd "$WORK/src"
build_install
BUILT_SUM=$(md5sum <"$WORK/src/projcache.so" | cut -d' ' -f1)

start_cluster <<EOF
# projcache benchmark
listen_addresses = ''
fsync = off
shared_preload_libraries = 'projcache'
projcache.database = 'postgres'
projcache.fetch_function = 'public.fetch_project_configs'
EOF
LOADED_SUM=$(md5sum <"$($PG_CONFIG --pkglibdir)/projcache.so" | cut -d' ' -f1)

pgrun -f "$WORK/bench/setup.sql"
echo "schema, 11,000 upstream rows, 10,000-row snapshot source and helpers created"

# ------------------------------------------------------------ context
GIT=(git -C "$REPO" -c safe.directory='*')
COMMIT=$("${GIT[@]}" rev-parse --short HEAD 2>/dev/null || echo unknown)
if [ -n "$("${GIT[@]}" status --porcelain --untracked-files=no -- . ':!bench' 2>/dev/null)" ]; then
	COMMIT="$COMMIT + uncommitted changes"
fi
CPU=$(awk -F': *' '/^model name/{print $2; exit}' /proc/cpuinfo)
[ -n "$CPU" ] || CPU=$(awk -F': *' '/^(Hardware|cpu model|Model)/{print $2; exit}' /proc/cpuinfo)
PGVER=$(pgvalue "SELECT version()")
# A server built with --enable-cassert runs its assertions on every call:
# its numbers are not a release build's.
PGASSERT=
[ "$(pgvalue "SHOW debug_assertions")" = on ] && PGASSERT=" (assertions on: --enable-cassert)"
SETTINGS=$(pgvalue "SELECT string_agg(name || '=' || current_setting(name), ', ' ORDER BY name)
                      FROM pg_settings
                     WHERE name IN ('projcache.batch_size', 'projcache.batch_interval',
                                    'projcache.expiry', 'projcache.max_memory', 'shared_buffers')")
BATCH=$(pgvalue "SELECT current_setting('projcache.batch_size') || ', batch_interval ' || current_setting('projcache.batch_interval')")

LOAD_BEFORE=$(cut -d' ' -f1-3 /proc/loadavg)

# ------------------------------------------------------------ 1. hit path
step "1. key cache hit path: warm $HOT_KEYS keys"
# Ask for all of them at once, then wait for each with get(k, '5s').
WARM=$(pgvalue "SELECT count(projcache.fetch('key-' || g)) FROM generate_series(1, $HOT_KEYS) g;
                SELECT count(projcache.get('key-' || g, '5s')) FROM generate_series(1, $HOT_KEYS) g;" | tail -n 1)
FRESH=$(pgvalue "SELECT count(*) FROM projcache.entries
                  WHERE key LIKE 'key-%' AND state = 'enabled' AND freshness = 'fresh'")
echo "get(k, '5s') returned a value for $WARM of $HOT_KEYS keys; $FRESH are enabled and fresh"

step "1. client round trips (pgbench, $CLIENTS clients, ${DURATION}s each)"
run_pgbench select_1.sql
S1_TPS=$PB_TPS S1_LAT=$PB_LAT S1_FAILED=$PB_FAILED
pgvalue "SELECT projcache.reset_stats()" >/dev/null
run_pgbench get_hit.sql
GET_TPS=$PB_TPS GET_LAT=$PB_LAT GET_XACTS=$PB_XACTS GET_FAILED=$PB_FAILED
GET_STATS=$(pgvalue "SELECT hits, misses, pending_reads, fetch_requests FROM projcache.stats")
IFS='|' read -r GET_HITS GET_MISSES GET_PENDING GET_REQS <<<"$GET_STATS"
run_pgbench table_hit.sql
TAB_TPS=$PB_TPS TAB_LAT=$PB_LAT TAB_FAILED=$PB_FAILED

step "1. in-server loops, one backend, $LOOP_CALLS calls each (after a 10,000-call warm-up)"
LOOPS=$(pgvalue "SELECT bench.loop_baseline(10000), bench.loop_get(10000), bench.loop_table(10000);
                 SELECT b.us_per_call, b.nonnull, g.us_per_call, g.nonnull, t.us_per_call, t.nonnull
                   FROM bench.loop_baseline($LOOP_CALLS) b, bench.loop_get($LOOP_CALLS) g,
                        bench.loop_table($LOOP_CALLS) t" | tail -n 1)
IFS='|' read -r LOOP_US _ LGET_US LGET_NN LTAB_US LTAB_NN <<<"$LOOPS"
echo "loop alone $LOOP_US us, projcache.get $LGET_US us ($LGET_NN non-NULL), table $LTAB_US us ($LTAB_NN non-NULL)"

# ------------------------------------------------------------ 2. cold path
step "2. key cache cold path: $COLD_KEYS unknown keys requested at once"
UPSTREAM=$(pgvalue "SELECT ms, rows FROM bench.time_upstream($COLD_KEYS)")
IFS='|' read -r UP_MS UP_ROWS <<<"$UPSTREAM"
COLD=$(pgvalue "SELECT * FROM bench.cold_fetch($COLD_KEYS, 60)")
IFS='|' read -r C_REQ_MS C_TOTAL_MS C_ENABLED C_CALLS C_FETCHED C_OVERFLOWS C_ERRORS C_PENDING <<<"$COLD"
C_KPS=$(LC_ALL=C awk -v n="$C_ENABLED" -v ms="$C_TOTAL_MS" 'BEGIN{ if (ms > 0) printf "%.0f", n / (ms / 1000); else print "?" }')
echo "$C_ENABLED of $COLD_KEYS enabled after $C_TOTAL_MS ms; fetch_calls $C_CALLS"
[ "$C_ENABLED" = "$COLD_KEYS" ] || { echo "bench: only $C_ENABLED of $COLD_KEYS cold keys were enabled within 60 s" >&2; ERRORS=$((ERRORS + 1)); }

# ------------------------------------------------------------ 3. snapshots
step "3. snapshot cache: 10,000 rows x (int, text, int)"
pgvalue "SELECT projcache.create_snapshot('s', 'SELECT a, b, c FROM public.snap_src', ttl => '10min')" >/dev/null
COLDSNAP=$(pgvalue "SELECT ms, rows FROM bench.time_snapshot_read()")
IFS='|' read -r SN_COLD_MS SN_ROWS <<<"$COLDSNAP"
SNAPINFO=$(pgvalue "SELECT rows, bytes, status,
                           pg_table_size('public.snap_src'),
                           (SELECT sum(pg_column_size(t.*)) FROM public.snap_src t)
                      FROM projcache.snapshots WHERE name = 's'")
IFS='|' read -r SN_VROWS SN_BYTES SN_STATUS TBL_BYTES TUPLE_BYTES <<<"$SNAPINFO"
REFRESH=$(pgvalue "SELECT ms, ok FROM bench.time_refresh(5)")
IFS='|' read -r SN_REFRESH_MS SN_REFRESH_OK <<<"$REFRESH"
# A fresh session, like pgbench's: 20 reads of each to warm up, then 200.
INSERVER=$(pgvalue "SELECT bench.time_reads('snapshot', 20), bench.time_reads('table', 20);
                    SELECT s.ms, s.faults, t.ms, t.faults
                      FROM bench.time_reads('snapshot', 200) s, bench.time_reads('table', 200) t" | tail -n 1)
IFS='|' read -r SN_READ_MS SN_FAULTS TBL_READ_MS TBL_FAULTS <<<"$INSERVER"
echo "cold load $SN_COLD_MS ms for $SN_ROWS rows; $SN_BYTES bytes; status $SN_STATUS"
LOADED_AT=$(pgvalue "SELECT loaded_at FROM projcache.snapshots WHERE name = 's'")
run_pgbench snapshot_read.sql
SN_TPS=$PB_TPS SN_LAT=$PB_LAT SN_FAILED=$PB_FAILED
# loaded_at is derived from a monotonic clock, so it may move by a millisecond.
SNAPAFTER=$(pgvalue "SELECT CASE WHEN abs(extract(epoch FROM loaded_at - '$LOADED_AT'::timestamptz)) < 1
                                 THEN 'no' ELSE 'yes' END, status, refresh_errors
                       FROM projcache.snapshots WHERE name = 's'")
IFS='|' read -r SN_SAME SN_STATUS2 SN_REFERR <<<"$SNAPAFTER"
run_pgbench table_count.sql
TC_TPS=$PB_TPS TC_LAT=$PB_LAT TC_FAILED=$PB_FAILED

# ------------------------------------------------------------ 4. ratios
# Every pgbench case above again, with the extended protocol and prepared
# statements (as bench/hit_path.sh and bench/snapshots.sh measure, so the
# ratios compare), at one client and at eight.  A ratio's two TPS come from
# the same cluster a few runs apart, so the machine's drift mostly cancels
# out; the TPS alone say more about the machine than about projcache.  The
# SELECT 1 of each client count runs first, right before the others.
RATIO_CASES=(select_1.sql get_hit.sql table_hit.sql snapshot_read.sql table_count.sql)
declare -A CASE_LABEL=(        # the plot's x axis
	[select_1.sql]="SELECT 1" [get_hit.sql]="get() hit" [table_hit.sql]="table, by key"
	[snapshot_read.sql]="snapshot() count(*)" [table_count.sql]="table count(*)")
declare -A CASE_TEXT=(         # the report's lines
	[select_1.sql]="SELECT 1"
	[get_hit.sql]="SELECT projcache.get('key-' || :k)"
	[table_hit.sql]="SELECT config FROM project_configs WHERE key = 'key-' || :k"
	[snapshot_read.sql]="count(*) FROM projcache.snapshot('s') AS t(a int, b text, c int)"
	[table_count.sql]="count(*) FROM public.snap_src")
declare -A RTPS RHITS          # [script,clients]: TPS; [clients]: get()'s counters
step "4. throughput relative to SELECT 1: pgbench -M prepared at -c ${RATIO_CLIENTS[*]}, ${DURATION}s each"
for c in "${RATIO_CLIENTS[@]}"; do
	for s in "${RATIO_CASES[@]}"; do
		# get()'s counters over its own run say whether its reads were
		# hits (the keys were cached in section 1; expiry is 5 min).
		[ "$s" != get_hit.sql ] || pgvalue "SELECT projcache.reset_stats()" >/dev/null
		run_pgbench "$s" "$c" prepared
		RTPS[$s,$c]=$PB_TPS
		if [ "$s" = get_hit.sql ]; then
			RHITS[$c]="$(pgvalue "SELECT 'hits=' || hits || ' misses=' || misses || ' pending_reads=' || pending_reads FROM projcache.stats") over $PB_XACTS transactions"
		fi
	done
done

# ------------------------------------------------------------ server log
LOAD_AFTER=$(cut -d' ' -f1-3 /proc/loadavg)
LOG_LINES=$(grep -cE '(ERROR|WARNING|FATAL|PANIC):' "$WORK/server.log" || true)
TOTAL_S=$(( ($(date +%s%N) - START_NS) / 1000000000 ))

RUN_DATE=$(date -u '+%Y-%m-%d %H:%M:%S UTC')

# ------------------------------------------------------------ the plot
# The data file first: it is written even when no plot can be drawn, and it
# holds the numbers the plot shows ("missing" where a run failed).
step "plot: $PNG"
C1=${RATIO_CLIENTS[0]} C8=${RATIO_CLIENTS[1]}
{
	echo "# projcache bench/run.sh, $RUN_DATE, tree $COMMIT"
	echo "# machine: $(nproc) CPUs (nproc), ${CPU:-unknown CPU}; load avg $LOAD_BEFORE before, $LOAD_AFTER after"
	echo "# server: $PGVER$PGASSERT"
	echo "# pgbench -n -M prepared -T $DURATION, unix socket; ratio = TPS / SELECT 1 TPS at the same -c; missing = not measured"
	echo "# label script ratio_c$C1 ratio_c$C8 tps_c$C1 tps_c$C8"
	for s in "${RATIO_CASES[@]}"; do
		printf '"%s" %s %s %s %s %s\n' "${CASE_LABEL[$s]}" "$s" \
			"$(tps_ratio "${RTPS[$s,$C1]-}" "${RTPS[select_1.sql,$C1]-}")" \
			"$(tps_ratio "${RTPS[$s,$C8]-}" "${RTPS[select_1.sql,$C8]-}")" \
			"$(or_missing "${RTPS[$s,$C1]-}")" "$(or_missing "${RTPS[$s,$C8]-}")"
	done
} >"$WORK/plot.dat"
cp "$WORK/plot.dat" "$DAT"
PLOT=$PNG
if ! command -v gnuplot >/dev/null; then
	PLOT="not drawn: gnuplot is not installed (apt-get install gnuplot-nox); the numbers are above and in $DAT"
else
	# Columns 3 and 4 are the ratios.  A "missing" one draws no bar but the
	# word "missing" where the bar would stand.  noenhanced: a CPU name's
	# "@" or "_" is text, not markup.
	cat >"$WORK/plot.gp" <<GNUPLOT
set terminal pngcairo noenhanced size 1100,650 font "Sans,11"
set output '$WORK/plot.png'
set title $(gpq "projcache bench/run.sh, $RUN_DATE, commit $COMMIT") . "\n" . \
          $(gpq "${CPU:-unknown CPU}, nproc $(nproc); load avg $LOAD_BEFORE before, $LOAD_AFTER after") . "\n" . \
          $(gpq "pgbench -n -M prepared -T $DURATION per bar, unix socket")
set style data histograms
set style histogram clustered gap 1
set style fill solid 0.85 border -1
set boxwidth 1
set yrange [0:*]
set offsets 0, 0, graph 0.1, 0
set ylabel 'TPS / SELECT 1 TPS at the same client count'
set grid ytics
set xtics nomirror
set key below horizontal
set arrow from graph 0, first 1 to graph 1, first 1 nohead dashtype 2 linecolor rgb "#555555"
m(col) = strcol(col) eq "missing"
plot '$WORK/plot.dat' using (m(3) ? NaN : \$3):xtic(1) title $(gpq "pgbench -c $C1 -j $(pb_jobs "$C1") ($C1 client$([ "$C1" -eq 1 ] || echo s))") linecolor rgb "#4C72B0", \
     '' using (m(4) ? NaN : \$4) title $(gpq "pgbench -c $C8 -j $(pb_jobs "$C8") ($C8 client$([ "$C8" -eq 1 ] || echo s))") linecolor rgb "#DD8452", \
     '' using (\$0 - 1./6):(m(3) ? 0 : \$3):(m(3) ? "missing" : sprintf("%.3f", \$3)) with labels offset 0, 0.8 notitle, \
     '' using (\$0 + 1./6):(m(4) ? 0 : \$4):(m(4) ? "missing" : sprintf("%.3f", \$4)) with labels offset 0, 0.8 notitle
GNUPLOT
	if gnuplot "$WORK/plot.gp" >"$WORK/gnuplot.log" 2>&1 && [ -s "$WORK/plot.png" ]; then
		cp "$WORK/plot.png" "$PNG"
	else
		cat "$WORK/gnuplot.log"
		PLOT="not drawn: gnuplot failed (its output is above); the numbers are above and in $DAT"
	fi
fi
# Root writes into a tree someone else may own: the files go to the
# directory's owner.
if [ "$(id -u)" -eq 0 ]; then
	chown --reference="$(dirname "$PNG")" "$DAT" 2>/dev/null || true
	[ "$PLOT" != "$PNG" ] || chown --reference="$(dirname "$PNG")" "$PNG" 2>/dev/null || true
fi
# An old PNG left beside the new data must not pass for this run's.
[ "$PLOT" = "$PNG" ] || [ ! -e "$PNG" ] || PLOT="$PLOT; $PNG is an earlier run's"

# ------------------------------------------------------------ report
say "projcache benchmark report"
say "=========================="
row '%-12s %s' "date" "$RUN_DATE"
row '%-12s %s' "tree" "$COMMIT"
row '%-12s %s CPUs (nproc), %s' "machine" "$(nproc)" "${CPU:-unknown CPU}"
row '%-12s %s' "load avg" "$LOAD_BEFORE before, $LOAD_AFTER after (other work on the machine skews every number)"
row '%-12s %s' "PostgreSQL" "$PGVER$PGASSERT"
row '%-12s %s' "settings" "$SETTINGS (defaults), fsync=off"
row '%-12s %s' "pgbench" "-n -c $CLIENTS -j $(pb_jobs "$CLIENTS") -T $DURATION, unix socket, simple protocol (sections 1 and 3); client and server share the $(nproc) CPUs"
row '%-12s %s' "" "-n -M prepared -c $C1 and -c $C8, -j at most $(nproc), -T $DURATION (section 4)"
if [ "$BUILT_SUM" != "$LOADED_SUM" ]; then
	say "WARNING: the installed projcache.so differs from the one built here (another install ran meanwhile?)"
fi
say ""
say "1. Key cache, hit path ($HOT_KEYS keys cached: $FRESH enabled+fresh; get(k,'5s') gave $WARM values)"
row '   %-62s %10s %10s %12s %7s' "client round trip, random key of 1000" "TPS" "avg ms" "vs SELECT 1" "failed"
row '   %-62s %10s %10s %12s %7s' "SELECT 1" "$(fmt %.0f "$S1_TPS")" "$(fmt %.3f "$S1_LAT")" "" "$S1_FAILED"
row '   %-62s %10s %10s %12s %7s' "SELECT projcache.get('key-' || :k)" "$(fmt %.0f "$GET_TPS")" "$(fmt %.3f "$GET_LAT")" "$(us_minus "$GET_LAT" "$S1_LAT") us" "$GET_FAILED"
row '   %-62s %10s %10s %12s %7s' "SELECT config FROM project_configs WHERE key = 'key-' || :k" "$(fmt %.0f "$TAB_TPS")" "$(fmt %.3f "$TAB_LAT")" "$(us_minus "$TAB_LAT" "$S1_LAT") us" "$TAB_FAILED"
row '   %s' "during the get run: $GET_XACTS transactions; stats hits=$GET_HITS misses=$GET_MISSES pending_reads=$GET_PENDING fetch_requests=$GET_REQS"
row '   %-62s %10s %10s' "in-server, one backend, $LOOP_CALLS calls (plpgsql)" "us/call" "net us"
row '   %-62s %10s %10s' "loop alone (array subscript + assignment + NULL test)" "$(fmt %.3f "$LOOP_US")" ""
row '   %-62s %10s %10s' "v := projcache.get(keys[i])          ($LGET_NN non-NULL)" "$(fmt %.3f "$LGET_US")" "$(LC_ALL=C awk -v a="$LGET_US" -v b="$LOOP_US" 'BEGIN{printf "%.3f", a-b}')"
row '   %-62s %10s %10s' "SELECT config INTO v ... WHERE key = keys[i]  ($LTAB_NN non-NULL)" "$(fmt %.3f "$LTAB_US")" "$(LC_ALL=C awk -v a="$LTAB_US" -v b="$LOOP_US" 'BEGIN{printf "%.3f", a-b}')"
say ""
say "2. Key cache, cold path ($COLD_KEYS unknown keys, batch_size $BATCH)"
row '   %-62s %s' "request all: SELECT count(projcache.fetch(k))" "$(fmt %.1f "$C_REQ_MS") ms"
row '   %-62s %s' "from first request until all $COLD_KEYS enabled" "$(fmt %.1f "$C_TOTAL_MS") ms  ($C_ENABLED enabled)"
row '   %-62s %s' "throughput" "$C_KPS keys/s"
row '   %-62s %s' "stats" "fetch_calls=$C_CALLS fetched_keys=$C_FETCHED request_overflows=$C_OVERFLOWS fetch_errors=$C_ERRORS pending_results=$C_PENDING"
row '   %-62s %s' "upstream alone: fetch function on all $COLD_KEYS keys, one call" "$(fmt %.1f "$UP_MS") ms  ($UP_ROWS rows)"
say ""
say "3. Snapshot cache (10,000 rows: int, text of 10 chars, int)"
row '   %-62s %s' "snapshot memory (projcache.snapshots.bytes)" "$SN_BYTES bytes  ($(LC_ALL=C awk -v b="$SN_BYTES" -v r="$SN_VROWS" 'BEGIN{ if (r > 0) printf "%.1f", b / r; else print "?" }') per row, $SN_VROWS rows, status $SN_STATUS)"
row '   %-62s %s' "for comparison: table on disk / sum of pg_column_size(row)" "$TBL_BYTES / $TUPLE_BYTES bytes"
row '   %-62s %s' "cold load (first snapshot() read, in-server)" "$(fmt %.2f "$SN_COLD_MS") ms  ($SN_ROWS rows)"
row '   %-62s %s' "forced reload, refresh_snapshot() (avg of 5)" "$(fmt %.2f "$SN_REFRESH_MS") ms  ($SN_REFRESH_OK of 5 succeeded)"
row '   %-62s %10s %10s' "one backend, in-server count(*), avg of 200" "ms/read" "faults/read"
row '   %-62s %10s %10s' "projcache.snapshot('s') (fast path)" "$(fmt %.3f "$SN_READ_MS")" "$(fmt %.0f "$SN_FAULTS")"
row '   %-62s %10s %10s' "public.snap_src" "$(fmt %.3f "$TBL_READ_MS")" "$(fmt %.0f "$TBL_FAULTS")"
row '   %-62s %10s %10s %12s %7s' "client round trip, count(*) of 10,000 rows" "TPS" "avg ms" "vs SELECT 1" "failed"
row '   %-62s %10s %10s %12s %7s' "FROM projcache.snapshot('s') AS t(a int, b text, c int)" "$(fmt %.0f "$SN_TPS")" "$(fmt %.3f "$SN_LAT")" "$(us_minus "$SN_LAT" "$S1_LAT") us" "$SN_FAILED"
row '   %-62s %10s %10s %12s %7s' "FROM public.snap_src" "$(fmt %.0f "$TC_TPS")" "$(fmt %.3f "$TC_LAT")" "$(us_minus "$TC_LAT" "$S1_LAT") us" "$TC_FAILED"
row '   %s' "snapshot during the run: reloaded=$SN_SAME, status $SN_STATUS2, refresh_errors $SN_REFERR"
say ""
say "4. Throughput relative to SELECT 1 (pgbench -M prepared; ratio = TPS / SELECT 1 TPS at the same -c)"
row '   %-66s %9s %7s %9s %7s' "" "-c$C1 TPS" "ratio" "-c$C8 TPS" "ratio"
for s in "${RATIO_CASES[@]}"; do
	row '   %-66s %9s %7s %9s %7s' "${CASE_TEXT[$s]}" \
		"$(fmt %.0f "$(or_missing "${RTPS[$s,$C1]-}")")" "$(tps_ratio "${RTPS[$s,$C1]-}" "${RTPS[select_1.sql,$C1]-}")" \
		"$(fmt %.0f "$(or_missing "${RTPS[$s,$C8]-}")")" "$(tps_ratio "${RTPS[$s,$C8]-}" "${RTPS[select_1.sql,$C8]-}")"
done
for c in "${RATIO_CLIENTS[@]}"; do
	row '   %s' "get() counters over its -c$c run: ${RHITS[$c]:-not read}"
done
row '   %s' "plot: $PLOT"
say ""
row '%s' "server log: $LOG_LINES ERROR/WARNING/FATAL/PANIC lines; measurements that failed: $ERRORS; total run time ${TOTAL_S}s"

step "report"
echo
printf '%s\n' "${REPORT[@]}"
if [ "$LOG_LINES" -gt 0 ]; then
	echo
	echo "--- server log ERROR/WARNING/FATAL/PANIC lines (first 20) ---"
	grep -E '(ERROR|WARNING|FATAL|PANIC):' "$WORK/server.log" | head -n 20
fi

stop_cluster
# The path last, where it is seen.
echo
echo "plot: $PLOT"
echo "data: $DAT"
[ "$ERRORS" -eq 0 ] || exit 1
exit 0
