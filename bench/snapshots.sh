#!/usr/bin/env bash
# bench/snapshots.sh - snapshot reads beside the tables they cache.
#
#     sudo bash bench/snapshots.sh
#     sudo BENCH_SECONDS=5 BENCH_PASSES=3 bash bench/snapshots.sh
#
# Builds and installs this tree, starts a throwaway cluster (port 54341, unix
# socket only, run by the unprivileged "postgres" OS user) with projcache
# preloaded, and creates bench/snapshots/setup.sql: a 10,000-row table
# (text, text) with a primary key, a 100-row table (text, jsonb of about
# 1 kB, text), their snapshots (the large one with a key index) and foreign
# tables over them.  Then, for each pass, at -c 1 and -c 8, it runs each
# read with pgbench -M prepared, in this order: the table, the foreign
# table, snapshot() (side by side, so that the machine's drift mostly
# cancels out of the ratios), and reports TPS and each read's ratio to the
# table's TPS.  It prints the EXPLAIN of the lookup and of the join.
#
# Then the paired rounds: a ratio taken from one table run and one run of
# the cached form just before or after it still swings with whatever else
# the machine does in those seconds.  So, for each read with a target, at
# -c 1 and -c 8, BENCH_ROUNDS (default 5) rounds each run the table and the
# cached form for BENCH_PAIR_SECONDS (default 3) each, alternating which
# goes first, and the report gives the median of the rounds' ratios with
# their lowest and highest.  BENCH_PASSES=0 runs the paired rounds alone.
#
# It asserts nothing about speed: it reports what it measured.
set -euo pipefail

# shellcheck source=SCRIPTDIR/../scripts/lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/../scripts/lib.sh"
# shellcheck source=SCRIPTDIR/lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
NAME=snapshots
PORT=54341
WORK=
DATA=
SOCK=

bench_settings
ROUNDS=${BENCH_ROUNDS:-5}
PAIR_SECONDS=${BENCH_PAIR_SECONDS:-3}
case $ROUNDS$PAIR_SECONDS in
'' | *[!0-9]*) echo "BENCH_ROUNDS and BENCH_PAIR_SECONDS must be whole numbers" >&2; exit 2 ;;
esac

cleanup_on_exit
bash "$REPO/scripts/install-deps.sh"
use_major

setup_work projcache-snapbench
DATA=$WORK/data
start_cluster <<EOF
listen_addresses = ''
fsync = off
shared_preload_libraries = 'projcache'
projcache.database = 'postgres'
EOF
pgrun -f "$WORK/src/bench/snapshots/setup.sql" >/dev/null

# tps SCRIPT CLIENTS: pgbench -M prepared TPS over the unix socket.
tps() { prepared_tps "$WORK/src/bench/snapshots/$1" "$2"; }

REPORT=()
# row LABEL TABLE_SCRIPT OTHER_SCRIPTS...: one line per client count.
row() {
	local label=$1 table=$2 c line t other v
	shift 2
	for c in 1 8; do
		t=$(tps "$table" $c)
		line=$(printf '%-34s -c%-2s table %8.0f' "$label" "$c" "$t")
		for other in "$@"; do
			v=$(tps "$other" $c)
			line="$line | ${other%.sql} $(printf '%8.0f' "$v") ($(ratio "$v" "$t")x)"
		done
		REPORT+=("$line")
	done
}

# paired LABEL TABLE FORM: the median, lowest and highest of ROUNDS ratios
# FORM TPS / TABLE TPS, each from two runs of PAIR_SECONDS back to back,
# the table first in odd rounds and second in even ones.
paired() {
	local label=$1 table=$2 form=$3 c r t v ratios sorted
	for c in 1 8; do
		ratios=()
		for r in $(seq 1 "$ROUNDS"); do
			if [ $((r % 2)) -eq 1 ]; then
				t=$(DURATION=$PAIR_SECONDS tps "$table" $c)
				v=$(DURATION=$PAIR_SECONDS tps "$form" $c)
			else
				v=$(DURATION=$PAIR_SECONDS tps "$form" $c)
				t=$(DURATION=$PAIR_SECONDS tps "$table" $c)
			fi
			ratios+=("$(ratio "$v" "$t" %.3f)")
		done
		sorted=$(printf '%s\n' "${ratios[@]}" | sort -g | tr '\n' ' ')
		REPORT+=("$(printf '%-34s -c%-2s %-10s median %s (lowest %s, highest %s; rounds: %s)' \
			"$label" "$c" "${form%.sql}" \
			"$(echo "$sorted" | awk '{print $(int((NF+1)/2))}')" \
			"$(echo "$sorted" | awk '{print $1}')" \
			"$(echo "$sorted" | awk '{print $NF}')" \
			"${ratios[*]}")")
	done
}

for pass in $(seq 1 "$PASSES"); do
	echo "=== pass $pass"
	REPORT+=("pass $pass")
	row "count(*), 10,000 rows (text, text)" big_table.sql big_ft.sql big_fn.sql
	row "count(*), 100 rows (1 kB jsonb)" small_table.sql small_ft.sql small_fn.sql
	row "key lookup, 10,000 rows" lookup_table.sql lookup_ft.sql
	row "join projects -> owner by key" join_table.sql join_ft.sql
done

if [ "$ROUNDS" -gt 0 ]; then
	echo "=== paired rounds"
	REPORT+=("paired rounds: $ROUNDS rounds of ${PAIR_SECONDS}s + ${PAIR_SECONDS}s; ratio = cached form TPS / table TPS")
	paired "count(*), 10,000 rows (text, text)" big_table.sql big_ft.sql
	paired "count(*), 100 rows (1 kB jsonb)" small_table.sql small_ft.sql
	paired "count(*), 100 rows (1 kB jsonb)" small_table.sql small_fn.sql
	paired "key lookup, 10,000 rows" lookup_table.sql lookup_ft.sql
fi

LOOKUP_PLAN=$(pgvalue "EXPLAIN (COSTS OFF) SELECT v FROM snapbench.big WHERE k = 'k42'")
JOIN_PLAN=$(pgvalue "EXPLAIN (COSTS OFF) SELECT g.v FROM public.projects p JOIN snapbench.big g ON g.k = p.owner_id WHERE p.key = 'p42'")
SNAPS=$(pgvalue "SELECT name || ': ' || rows || ' rows, ' || bytes || ' bytes' FROM projcache.snapshots ORDER BY name")
stop_cluster

echo
echo "projcache snapshot reads, $(date -u '+%Y-%m-%d %H:%M:%S UTC'), $(nproc) CPUs, load $(cut -d' ' -f1-3 /proc/loadavg)"
echo "tree: $(git -C "$REPO" -c safe.directory='*' log -1 --format='%h %s' | cut -c1-70)"
echo "pgbench -n -M prepared -T $DURATION; (Nx) = TPS / the table's TPS, measured just before"
printf '%s\n' "${REPORT[@]}"
echo "snapshots: $SNAPS" | tr '\n' ';'
echo
echo "EXPLAIN of the lookup:"
printf '  %s\n' "$LOOKUP_PLAN"
echo "EXPLAIN of the join:"
printf '  %s\n' "$JOIN_PLAN"
