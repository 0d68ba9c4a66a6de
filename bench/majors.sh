#!/usr/bin/env bash
# bench/majors.sh - bench/run.sh on each PostgreSQL major, ratios side by side.
#
#     sudo bash bench/majors.sh            # 15 and 18, one run.sh each
#     sudo bash bench/majors.sh 15 18 17   # the majors to run, in order
#     sudo BENCH_ONLY_TABLE=1 bash bench/majors.sh   # no runs: the table
#                                                    # of the kept results
#
# Each major gets a run of its own (PG_MAJOR=N bash bench/run.sh: its own
# build, server and pgbench), one after the other, never at once.  Each run
# keeps its numbers in bench/results/latest.dat (15) or latest-pgN.dat; this
# script then prints section 4's ratios (TPS / SELECT 1 TPS on the same
# server, at -c 1 and -c 8) of every major beside each other, and writes
# that table to bench/results/majors-latest.txt.  A ratio compares a call
# with the round trip on the same server, so majors can be set beside each
# other even when their servers differ in speed; the header of each .dat
# says which server it was (an --enable-cassert build runs its assertions
# on every call, which a ratio does not cancel out).
set -euo pipefail

BENCH=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
OUT=$BENCH/results/majors-latest.txt
MAJORS=("$@")
[ "${#MAJORS[@]}" -gt 0 ] || MAJORS=(15 18)

dat_of() {
	if [ "$1" = 15 ]; then echo "$BENCH/results/latest.dat"; else echo "$BENCH/results/latest-pg$1.dat"; fi
}

if [ "${BENCH_ONLY_TABLE:-0}" != 1 ]; then
	for m in "${MAJORS[@]}"; do
		echo "=== bench/run.sh on PostgreSQL $m"
		PG_MAJOR=$m bash "$BENCH/run.sh"
	done
fi

{
	echo "# projcache bench/majors.sh: section 4 of bench/run.sh on each major, one run each"
	echo "# ratio = TPS / SELECT 1 TPS on the same server at the same -c (pgbench -M prepared)"
	for m in "${MAJORS[@]}"; do
		f=$(dat_of "$m")
		[ -f "$f" ] || { echo "# $m: no $f"; continue; }
		sed -n 's/^# projcache bench\/run.sh, /# '"$m"': /p; s/^# server: /#     server: /p; s/^# machine: /#     machine: /p' "$f"
	done
	printf '%-22s' "case"
	for m in "${MAJORS[@]}"; do printf ' %9s %9s' "$m -c1" "$m -c8"; done
	echo
	# The cases, in the order of the first major's file.
	first=$(dat_of "${MAJORS[0]}")
	grep -v '^#' "$first" | while IFS= read -r line; do
		label=${line%\"*}
		label=${label#\"}
		printf '%-22s' "$label"
		for m in "${MAJORS[@]}"; do
			f=$(dat_of "$m")
			read -r r1 r8 < <(awk -v l="\"$label\"" 'index($0, l) == 1 {
				n = split(substr($0, length(l) + 2), a, " "); print a[2], a[3] }' "$f" 2>/dev/null || true)
			printf ' %9s %9s' "${r1:-missing}" "${r8:-missing}"
		done
		echo
	done
} | tee "$OUT"
echo "written: $OUT"
