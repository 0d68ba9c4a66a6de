#!/usr/bin/env bash
# bench/scan.sh - one client's scan of cold keys beside steady readers of
# hot ones (issue 19, the scenario of TAP test 027), this tree beside a
# baseline, in one run.
#
#     sudo bash bench/scan.sh                 # baseline 4fafa6a; about 7 minutes
#     sudo bash bench/scan.sh <commit>        # another baseline
#     sudo bash bench/scan.sh none            # this tree only
#     sudo SCAN_SECONDS=90 SCAN_CLIENTS=4 SCAN_DELAY=0.5 bash bench/scan.sh
#
# 4fafa6a is the tree just before fair fetching came in: the comparison says
# what the two due queues and the bound on keys read once change.
#
# Builds both trees.  Then, for the baseline and then this tree: installs
# it, starts a throwaway cluster (port 54343, unix socket only, run by the
# unprivileged "postgres" OS user) with projcache.max_memory = 32MB,
# expiry 15s, grace_period 10s and batch_interval 10ms, and loads
# bench/scan.sql: 10,000 hot keys and 200,000 cold ones with configs of
# about 300 bytes, behind a fetch function that sleeps 0.25 s a call.  Once
# every hot key reads non-NULL, it starts, each on its own connection:
# 8 hot clients, each reading 125 random hot keys every 0.1 s (so each key
# is read about once a second); the scanner, which after 10 s reads the
# 200,000 cold keys once each, 500 a statement, 0.1 s apart (as TAP test
# 027 does); a sampler of projcache.stats once a second; and a refresher
# that, 10 s into the scan, changes the source of a snapshot and times
# refresh_snapshot().
# The hot clients and the sampler stop 20 s after the scan ended.
#
# It reports, for both trees side by side, per phase (before the scan,
# during it, the 10 s after, after that) and per second: hot-key reads and
# the NULLs among them, the scan's progress, entries, memory_used and the
# growth of evictions_memory, evictions, refused_reads and fetch_calls;
# whether the refresh completed and how long it took.  It asserts nothing.
# The report is printed and written to bench/results/scan-latest.txt
# (SCAN_OUT=path: elsewhere).  The server is stopped and the temp dir
# removed on exit, error or Ctrl-C; this tree is installed last, so it
# stays installed.  PROJCACHE_PGBIN picks another PostgreSQL 15 install.
#
# Parameters (environment, the issue's values by default):
#   SCAN_MEMORY (32MB)  SCAN_EXPIRY (15s)  SCAN_GRACE (10s)
#   SCAN_BATCH_INTERVAL (10ms, the TAP tests')
#   SCAN_HOT_KEYS (10000)  SCAN_CLIENTS (8)  SCAN_READER_PAUSE (0.1 s)
#   SCAN_READER_BATCH (hot keys / clients / 10: each key read once a second)
#   SCAN_COLD_KEYS (200000)  SCAN_CHUNK (500)  SCAN_PAUSE (0.1 s after each
#   statement of the scan)  SCAN_SECONDS (0; if set, the scan's statements
#   are spread over that many seconds instead)
#   SCAN_DELAY (0.25 s a fetch call)  SCAN_BEFORE (10 s)  SCAN_AFTER (20 s)
#   SCAN_SETTLE (10 s: "the 10 s after")  SCAN_REFRESH_AT (10 s into the scan)
#   SCAN_REFRESH_TIMEOUT (120 s)
set -euo pipefail

# shellcheck source=SCRIPTDIR/../scripts/lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/../scripts/lib.sh"
# shellcheck source=SCRIPTDIR/lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
NAME=scan
BASELINE=${1:-4fafa6a}
PORT=54343
OUT=${SCAN_OUT:-$REPO/bench/results/scan-latest.txt}
WORK=
DATA=
SOCK=

MEMORY=${SCAN_MEMORY:-32MB}
EXPIRY=${SCAN_EXPIRY:-15s}
GRACE=${SCAN_GRACE:-10s}
BATCH_INTERVAL=${SCAN_BATCH_INTERVAL:-10ms}
HOT=${SCAN_HOT_KEYS:-10000}
CLIENTS=${SCAN_CLIENTS:-8}
READER_PAUSE=${SCAN_READER_PAUSE:-0.1}
COLD=${SCAN_COLD_KEYS:-200000}
CHUNK=${SCAN_CHUNK:-500}
PAUSE=${SCAN_PAUSE:-0.1}
SECONDS_=${SCAN_SECONDS:-0}
DELAY=${SCAN_DELAY:-0.25}
BEFORE=${SCAN_BEFORE:-10}
AFTER=${SCAN_AFTER:-20}
SETTLE=${SCAN_SETTLE:-10}
REFRESH_AT=${SCAN_REFRESH_AT:-10}
REFRESH_TIMEOUT=${SCAN_REFRESH_TIMEOUT:-120}
for v in "$HOT" "$CLIENTS" "$COLD" "$CHUNK"; do
	case $v in '' | 0 | *[!0-9]*)
		echo "$NAME: SCAN_HOT_KEYS, SCAN_CLIENTS, SCAN_COLD_KEYS and SCAN_CHUNK must be positive whole numbers" >&2
		exit 2 ;;
	esac
done
for v in "$READER_PAUSE" "$PAUSE" "$SECONDS_" "$DELAY" "$BEFORE" "$AFTER" "$SETTLE" "$REFRESH_AT" "$REFRESH_TIMEOUT"; do
	[[ $v =~ ^[0-9]+(\.[0-9]+)?$ ]] || {
		echo "$NAME: the SCAN_ durations are numbers of seconds, not '$v'" >&2
		exit 2
	}
done
READER_BATCH=${SCAN_READER_BATCH:-$(( (HOT + CLIENTS * 10 - 1) / (CLIENTS * 10) ))}
# The hot clients and the sampler stop on their own past this, whatever
# happened to the scan.
MAX_SECONDS=$(LC_ALL=C awk -v b="$BEFORE" -v s="$SECONDS_" -v a="$AFTER" 'BEGIN{print int(b + 4 * s + a + 300)}')
REFRESH_LIMIT=$(LC_ALL=C awk -v b="$BEFORE" -v r="$REFRESH_AT" -v t="$REFRESH_TIMEOUT" 'BEGIN{print int(b + r + t)}')

writable_or_exit "$OUT"

cleanup_on_exit
bash "$REPO/scripts/install-deps.sh"

START_NS=$(date +%s%N)
LOAD_BEFORE=$(cut -d' ' -f1-3 /proc/loadavg)
WORK=$(mktemp -d "${TMPDIR:-/tmp}/projcache-scan.XXXXXX")
SOCK=$WORK/sock
mkdir -p "$WORK/head" "$SOCK"
copy_tree "$WORK/head"
GIT=(git -C "$REPO" -c safe.directory='*')
HEAD_DESC=$("${GIT[@]}" log -1 --format='%h %s' HEAD 2>/dev/null | cut -c1-72 || echo unknown)
[ -z "$("${GIT[@]}" status --porcelain --untracked-files=no 2>/dev/null)" ] ||
	HEAD_DESC="$HEAD_DESC (+ uncommitted changes)"
TREES=(head)
if [ "$BASELINE" != none ]; then
	mkdir -p "$WORK/base"
	"${GIT[@]}" archive "$BASELINE" | tar -C "$WORK/base" -xf -
	BASE_DESC=$("${GIT[@]}" log -1 --format='%h %s' "$BASELINE" | cut -c1-72)
	TREES=(base head)
fi
own_work

for tree in "${TREES[@]}"; do
	if ! (cd "$WORK/$tree" && "${AS_PG[@]}" make -s -j"$(nproc)" PG_CONFIG="$PG_CONFIG") \
		>"$WORK/build-$tree.log" 2>&1; then
		cat "$WORK/build-$tree.log"
		echo "$NAME: $tree does not build" >&2
		exit 1
	fi
done
echo "built ${BASE_DESC:+$BASE_DESC and }$HEAD_DESC"

# log_lines: the server log's ERROR/WARNING/FATAL/PANIC lines, less the
# workers' FATALs when the cluster stops.
log_lines() {
	grep -E '(ERROR|WARNING|FATAL|PANIC):' "$WORK/server.log" |
		grep -vE 'FATAL:  terminating background worker "projcache [a-z]+" due to administrator command' || true
}

# run_tree TREE: install TREE, run the scenario on a fresh cluster, leave
# its numbers in $WORK/TREE.*.
run_tree() {
	local tree=$1 t0 n pids=() names=() logs=() i rc
	echo "=== $tree"
	(cd "$WORK/$tree" && "${AS_ROOT[@]}" make -s install PG_CONFIG="$PG_CONFIG" >/dev/null)
	DATA=$WORK/data
	rm -rf "$DATA"
	start_cluster <<EOF
listen_addresses = ''
fsync = off
shared_preload_libraries = 'projcache'
projcache.database = 'postgres'
projcache.fetch_function = 'public.slow_fetch'
projcache.max_memory = '$MEMORY'
projcache.expiry = '$EXPIRY'
projcache.grace_period = '$GRACE'
projcache.batch_interval = '$BATCH_INTERVAL'
EOF
	echo "loading bench/scan.sql ($HOT hot keys, $COLD cold ones)"
	pgrun -v hot_keys="$HOT" -v cold_keys="$COLD" -v delay="$DELAY" -f "$WORK/head/bench/scan.sql"

	# The hot set is cached before the hot clients start.
	t0=$(date +%s)
	while :; do
		n=$(pgvalue "SELECT count(*) FROM generate_series(1, $HOT) AS i
		              WHERE projcache.get('hot' || i) IS NOT NULL")
		[ "$n" -eq "$HOT" ] && break
		if [ $(($(date +%s) - t0)) -gt 300 ]; then
			echo "$NAME: $tree: only $n of $HOT hot keys cached after 300 s" >&2
			exit 1
		fi
		sleep 1
	done
	echo "$HOT hot keys cached in $(($(date +%s) - t0)) s; the scan starts in $BEFORE s"

	for i in $(seq 1 "$CLIENTS"); do
		pgrun -c "CALL public.hot_reader($HOT, $READER_BATCH, $READER_PAUSE, $AFTER, $MAX_SECONDS)" \
			>"$WORK/$tree.reader$i.log" 2>&1 &
		pids+=($!) names+=("hot client $i") logs+=("$WORK/$tree.reader$i.log")
	done
	pgrun -c "CALL public.sampler($AFTER, $MAX_SECONDS)" >"$WORK/$tree.sampler.log" 2>&1 &
	pids+=($!) names+=(sampler) logs+=("$WORK/$tree.sampler.log")
	pgrun -c "SET statement_timeout = '${REFRESH_LIMIT}s'" -c "CALL public.refresher($REFRESH_AT)" \
		>"$WORK/$tree.refresher.log" 2>&1 &
	pids+=($!) names+=(refresher) logs+=("$WORK/$tree.refresher.log")
	# A scanner that failed still ends the scan, so that the others stop.
	(pgrun -c "CALL public.scan($BEFORE, $COLD, $CHUNK, $PAUSE, $SECONDS_)" || {
		rc=$?
		pgrun -c "INSERT INTO public.phase VALUES ('scan_ended', clock_timestamp()) ON CONFLICT DO NOTHING" || true
		exit "$rc"
	}) >"$WORK/$tree.scanner.log" 2>&1 &
	pids+=($!) names+=(scanner) logs+=("$WORK/$tree.scanner.log")
	: >"$WORK/$tree.failed"
	for i in "${!pids[@]}"; do
		rc=0
		wait "${pids[$i]}" || rc=$?
		if [ "$rc" -ne 0 ]; then
			echo "${names[$i]} failed (exit $rc): $(grep -m1 -E 'ERROR|FATAL' "${logs[$i]}" | cut -c1-200)" >>"$WORK/$tree.failed"
		fi
	done
	cat "$WORK/$tree.failed"

	pgvalue "SELECT * FROM public.per_phase($SETTLE)" >"$WORK/$tree.phases"
	pgvalue "SELECT * FROM public.per_second($SETTLE)" >"$WORK/$tree.seconds"
	pgvalue "
	SELECT format('scan: %s keys in %s s (%s a statement), %s of its reads non-NULL',
	              p.scanned, round(extract(epoch FROM e.at - s.at), 1), $CHUNK, p.nonnull)
	  FROM public.progress AS p, public.phase AS s LEFT JOIN public.phase AS e ON e.name = 'scan_ended'
	 WHERE s.name = 'scan_started'" >"$WORK/$tree.lines"
	pgvalue "
	SELECT coalesce((SELECT CASE WHEN done_at IS NULL
	            THEN format('snapshot refresh asked %s s into the scan: NOT completed within %s s',
	                        round(extract(epoch FROM asked_at - s.at), 1),
	                        round($REFRESH_LIMIT - extract(epoch FROM asked_at - s.at)))
	            ELSE format('snapshot refresh asked %s s into the scan: completed in %s s, returned %s, new value read back %s, scan still running then %s',
	                        round(extract(epoch FROM asked_at - s.at), 1),
	                        round(extract(epoch FROM done_at - asked_at), 3), result,
	                        coalesce(new_value::text, '?'), scanning) END
	          FROM public.refresh), 'snapshot refresh never asked')
	  FROM public.phase AS s WHERE s.name = 'scan_started'" >>"$WORK/$tree.lines"
	pgvalue "
	SELECT format('cached at the end: %s hot keys, %s cold; memory_used %s of memory_limit %s',
	              count(*) FILTER (WHERE e.key LIKE 'hot%'), count(*) FILTER (WHERE e.key LIKE 'cold%'),
	              (SELECT memory_used FROM projcache.stats), (SELECT memory_limit FROM projcache.stats))
	  FROM projcache.entries AS e" >>"$WORK/$tree.lines"
	stop_cluster
	n=$(log_lines | wc -l)
	echo "server log: $n ERROR/WARNING/FATAL/PANIC lines (besides the workers' at shutdown)" >>"$WORK/$tree.lines"
	[ "$n" -eq 0 ] || log_lines | sed 's/^[^]]*] //' | sort | uniq -c | sort -rn | head -n 5 >>"$WORK/$tree.lines"
	cat "$WORK/$tree.failed" >>"$WORK/$tree.lines"
	mv "$WORK/server.log" "$WORK/$tree.server.log"
	cd "$WORK"
}

for tree in "${TREES[@]}"; do
	run_tree "$tree"
done
PGVER=$("${AS_PG[@]}" "$PGBIN/postgres" --version | sed 's/^postgres (PostgreSQL) //')

# The tables below read, for each tree, a one-line file with its name, then
# its numbers.
for t in "${TREES[@]}"; do echo "$t" >"$WORK/$t.name"; done

# phases_table TREE...: one row per measure and tree, one column per phase.
phases_table() {
	local args=() t
	for t in "$@"; do args+=("$WORK/$t.name" "$WORK/$t.phases"); done
	LC_ALL=C awk -F'|' -v ntrees=$# -v settle="$SETTLE" '
	BEGIN { split("seconds|hot-key reads|hot-key reads NULL|NULL %|scan: keys read|entries at the end|memory_used, most (MB)|evictions_memory|evictions|evictions_expired|refused_reads|fetch_calls", label, "|") }
	FNR == 1 { file++ }
	file % 2 == 1 { name[(file + 1) / 2] = $0; next }
	{ tr = file / 2; p = $1
	  v[tr, p, 1] = $2; v[tr, p, 2] = $3; v[tr, p, 3] = $4
	  v[tr, p, 4] = ($3 > 0) ? sprintf("%.3f", 100 * $4 / $3) : ""
	  v[tr, p, 5] = $5; v[tr, p, 6] = $6
	  v[tr, p, 7] = ($7 == "") ? "" : sprintf("%.1f", $7 / 1048576)
	  for (i = 8; i <= 12; i++) v[tr, p, i] = $i }
	END {
	  printf "%-24s %-5s %13s %13s %13s %13s\n", "per phase", "tree", "before scan", "during scan", "0-" settle " s after", settle "+ s after"
	  for (m = 1; m <= 12; m++)
	    for (tr = 1; tr <= ntrees; tr++) {
	      printf "%-24s %-5s", (tr == 1 ? label[m] : ""), name[tr]
	      for (p = 1; p <= 4; p++) printf " %13s", (v[tr, p, m] == "" ? "-" : v[tr, p, m])
	      printf "\n" } }' "${args[@]}"
}

# seconds_table TREE...: one row per second, the trees side by side.
seconds_table() {
	local args=() t
	for t in "$@"; do args+=("$WORK/$t.name" "$WORK/$t.seconds"); done
	LC_ALL=C awk -F'|' -v ntrees=$# '
	function d(x) { return x == "" ? "-" : x }
	BEGIN { split("before|scan|settle|after", ph, "|"); n = 0 }
	FNR == 1 { file++ }
	file % 2 == 1 { name[(file + 1) / 2] = $0; next }
	{ tr = file / 2; s = $1 + 0
	  if (n == 0 || s < lo) lo = s
	  if (n == 0 || s > hi) hi = s
	  n++
	  row[tr, s] = sprintf("%-6s %6s %5s %7s %7s %5s %6s %6s %6s %5s", ph[$2], d($3), d($4), d($5), d($6),
	                       ($7 == "" ? "-" : sprintf("%.1f", $7 / 1048576)), d($8), d($9), d($10), d($11)) }
	END {
	  printf "%4s", "sec"
	  for (tr = 1; tr <= ntrees; tr++)
	    printf " | %-6s %6s %5s %7s %7s %5s %6s %6s %6s %5s", name[tr], "reads", "NULL", "scanned", "entries", "MB", "ev_mem", "evict", "refusd", "fetch"
	  printf "\n"
	  for (s = lo; s <= hi; s++) {
	    printf "%4d", s
	    for (tr = 1; tr <= ntrees; tr++) printf " | %s", ((tr, s) in row ? row[tr, s] : sprintf("%-6s", "-"))
	    printf "\n" } }' "${args[@]}"
}

{
	echo "projcache: a scan beside steady readers (bench/scan.sh), $(date -u '+%Y-%m-%d %H:%M:%S UTC')"
	echo "head:      $HEAD_DESC"
	[ -z "${BASE_DESC:-}" ] || echo "base:      $BASE_DESC"
	echo "machine:   $(nproc) CPUs, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//'); load avg $LOAD_BEFORE before, $(cut -d' ' -f1-3 /proc/loadavg) after"
	echo "server:    PostgreSQL $PGVER; projcache.max_memory $MEMORY, expiry $EXPIRY, grace_period $GRACE, batch_interval $BATCH_INTERVAL,"
	echo "           other settings default; the fetch function sleeps $DELAY s a call"
	echo "scenario:  $HOT hot keys (configs of ~300 B), $CLIENTS hot clients each reading $READER_BATCH random ones every $READER_PAUSE s;"
	if [ "$SECONDS_" = 0 ]; then pacing="$PAUSE s apart"; else pacing="spread over $SECONDS_ s"; fi
	echo "           $BEFORE s later one more client reads $COLD cold keys once each, $CHUNK a statement, $pacing;"
	echo "           a snapshot refresh $REFRESH_AT s into the scan; the hot clients read until $AFTER s after the scan ended"
	echo
	phases_table "${TREES[@]}"
	echo "(counters: growth over the phase, from projcache.stats sampled once a second; entries: the phase's last sample)"
	echo
	for t in "${TREES[@]}"; do
		sed "s/^/$t: /" "$WORK/$t.lines"
	done
	echo
	echo "per second (sec 0: the second the scan started in; settle: the $SETTLE s after it; NULL: hot-key reads that returned NULL; counters: growth since the previous second)"
	seconds_table "${TREES[@]}"
	echo
	echo "total $(( ($(date +%s%N) - START_NS) / 1000000000 )) s"
} >"$WORK/report.txt"
cat "$WORK/report.txt"
cp "$WORK/report.txt" "$OUT"
[ "$(id -u)" -ne 0 ] || chown --reference="$(dirname "$OUT")" "$OUT" 2>/dev/null || true
echo
echo "report: $OUT"
