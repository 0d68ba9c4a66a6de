#!/usr/bin/env bash
# bench/hit_path.sh - what a key cache hit costs, this tree beside a baseline,
# and the working-set scenario of eviction under memory pressure.
#
#     sudo bash bench/hit_path.sh             # baseline d02c6b5
#     sudo bash bench/hit_path.sh <commit>    # another baseline
#     sudo BENCH_SECONDS=5 BENCH_PASSES=3 bash bench/hit_path.sh
#
# d02c6b5 is the tree just before eviction under memory pressure (SIEVE)
# came in: the comparison says what the visited bit costs a hit.
#
# Part 1 builds both trees.  Then, for each pass, for the baseline and then
# this tree: installs it, starts a throwaway cluster (port 54340, unix
# socket only, run by the unprivileged "postgres" OS user), caches 1,000
# keys, and measures with pgbench -M prepared, at -c 1 and -c 8, SELECT 1,
# a get() hit of a random key and an invalidate() of one (its own
# transaction, so each asks for a refetch at commit), and in one backend
# the ns a get() hit costs.  The ratios (get() TPS / SELECT 1 TPS) are taken within one
# cluster, minutes apart at most, so that the machine's drift cancels out.
#
# Part 2 measures the two trees again with 100,000 keys of 1 kB
# (bench/hit_1kb.sql, 120 MB read at random, far more than a CPU cache):
# a get() hit of a random key beside a constant query returning a 1 kB
# jsonb, at -c 1 and -c 8, and in one backend the ns a hit costs with the
# keys read spread over all 100,000, under each way the key map's memory
# can be paged, when run as root on a machine that allows it:
#   4k    huge_pages = off, and no transparent huge pages for shared memory
#         (/sys/kernel/mm/transparent_hugepage/shmem_enabled = never);
#   thp   huge_pages = off, shmem_enabled = advise: the areas a process
#         asks for (madvise) get transparent huge pages;
#   huge  huge_pages = on (vm.nr_hugepages reserved for the cluster).
# The machine's settings are put back on exit.  Without root, only the
# machine's own setting is measured ("asis").  BENCH_PAGES="4k thp" picks
# some.  In the first pass, this tree's cluster is also profiled under each
# paging (perf record -a during a -c 8 run of each query; BENCH_PROFILE=0
# skips it): where a hit's samples go beyond the constant query's.
#
# Part 3 runs the working-set scenario (bench/working_set.sql) on this tree
# with projcache.max_memory = 8MB: 8 rounds of 5,000 reads, 80 % on 5,000
# hot keys, then 5 rounds after the hot set moved; it reports each round's
# hit ratio, failed reads and most memory_used.
#
# It asserts nothing about speed or hit ratios: it reports what it
# measured.  Servers are stopped and the temp dir removed on exit, error or
# Ctrl-C; this tree is installed last, so it stays installed.
# BENCH_PARTS="1 2" (default "1 2 3") runs some parts only.
set -euo pipefail

# shellcheck source=SCRIPTDIR/../scripts/lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/../scripts/lib.sh"
# shellcheck source=SCRIPTDIR/lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
NAME=hit_path
BASELINE=${1:-d02c6b5}
PORT=54340
LOOP_CALLS=200000
WORK=
DATA=
SOCK=

bench_settings

cleanup_on_exit
bash "$REPO/scripts/install-deps.sh"
use_major

WORK=$(mktemp -d "${TMPDIR:-/tmp}/projcache-hitpath.XXXXXX")
SOCK=$WORK/sock
mkdir -p "$WORK/head" "$WORK/base" "$SOCK"
copy_tree "$WORK/head"
GIT=(git -C "$REPO" -c safe.directory='*')
"${GIT[@]}" archive "$BASELINE" | tar -C "$WORK/base" -xf -
BASE_DESC=$("${GIT[@]}" log -1 --format='%h %s' "$BASELINE" | cut -c1-70)
HEAD_DESC=$("${GIT[@]}" log -1 --format='%h %s' HEAD | cut -c1-70)
[ -z "$("${GIT[@]}" status --porcelain --untracked-files=no 2>/dev/null)" ] ||
	HEAD_DESC="$HEAD_DESC (+ uncommitted changes)"
own_work

for tree in base head; do
	if ! (cd "$WORK/$tree" && "${AS_PG[@]}" make -s -j"$(nproc)" PG_CONFIG="$PG_CONFIG") \
		>"$WORK/build-$tree.log" 2>&1; then
		cat "$WORK/build-$tree.log"
		echo "$NAME: $tree does not build" >&2
		exit 1
	fi
done
echo "built $BASE_DESC and $HEAD_DESC"

# use_tree TREE [CONF]: install TREE, start a fresh cluster with projcache
# preloaded (and CONF appended), create the bench schema.
use_tree() {
	local tree=$1 conf=${2:-}
	(cd "$WORK/$tree" && "${AS_ROOT[@]}" make -s install PG_CONFIG="$PG_CONFIG" >/dev/null)
	DATA=$WORK/data
	rm -rf "$DATA"
	start_cluster <<EOF
listen_addresses = ''
fsync = off
shared_preload_libraries = 'projcache'
projcache.database = 'postgres'
projcache.fetch_function = 'public.fetch_project_configs'
$conf
EOF
	pgrun -f "$WORK/head/bench/setup.sql"
}

# tps SCRIPT CLIENTS: pgbench -M prepared TPS (over the unix socket).
tps() { prepared_tps "$WORK/head/bench/$1" "$2"; }

# set_pages MODE / restore_pages: this machine's paging of shared memory
# for one cluster (vm.nr_hugepages raised by 400, about 700 MB with
# max_memory 512MB, for "huge"), and put back as it was (also at exit).
THP_SHMEM=/sys/kernel/mm/transparent_hugepage/shmem_enabled
THP_BEFORE=$(sed -n 's/.*\[\(.*\)\].*/\1/p' "$THP_SHMEM" 2>/dev/null || true)
HUGE_PAGES_BEFORE=$(cat /proc/sys/vm/nr_hugepages 2>/dev/null || echo 0)
PAGES_CHANGED=0
set_pages() {
	PAGES_CHANGED=1
	case $1 in
		4k) echo never >"$THP_SHMEM" ;;
		thp) echo advise >"$THP_SHMEM" ;;
		huge)
			echo never >"$THP_SHMEM"
			echo $((HUGE_PAGES_BEFORE + 400)) >/proc/sys/vm/nr_hugepages
			local got
			got=$(cat /proc/sys/vm/nr_hugepages)
			[ "$got" -ge $((HUGE_PAGES_BEFORE + 400)) ] ||
				{ echo "$NAME: could reserve $got huge pages only" >&2; exit 1; }
			;;
	esac
}
restore_pages() {
	[ "$PAGES_CHANGED" = 1 ] || return 0
	echo "$HUGE_PAGES_BEFORE" >/proc/sys/vm/nr_hugepages
	[ -z "$THP_BEFORE" ] || echo "$THP_BEFORE" >"$THP_SHMEM"
	PAGES_CHANGED=0
}
trap 'rc=$?; restore_pages; (exit $rc); _cleanup' EXIT


REPORT=()
wanted() { [[ " ${BENCH_PARTS:-1 2 3} " == *" $1 "* ]]; }

if wanted 1; then
	for pass in $(seq 1 "$PASSES"); do
		for tree in base head; do
			echo "=== pass $pass: $tree"
			use_tree $tree
			pgvalue "SELECT count(projcache.fetch('key-' || g)) FROM generate_series(1, 1000) g" >/dev/null
			pgvalue "SELECT count(projcache.get('key-' || g, '5s')) FROM generate_series(1, 1000) g" >/dev/null
			line="pass $pass $(printf '%-4s' $tree)"
			for c in 1 8; do
				s1=$(tps select_1.sql $c)
				get=$(tps get_hit.sql $c)
				inv=$(tps invalidate.sql $c)
				line="$line | -c$c: SELECT 1 $(printf '%7.0f' "$s1") get $(printf '%7.0f' "$get") ratio $(ratio "$get" "$s1" %.3f) invalidate $(printf '%7.0f' "$inv") ratio $(ratio "$inv" "$s1" %.3f)"
			done
			ns=$(pgvalue "SELECT bench.loop_get_built_key(20000), bench.loop_built_key(20000);
			              SELECT round(((g.us_per_call - b.us_per_call) * 1000)::numeric), g.nonnull
			                FROM bench.loop_get_built_key($LOOP_CALLS) g, bench.loop_built_key($LOOP_CALLS) b" | tail -n 1)
			line="$line | in-backend ns/hit ${ns%|*} (${ns#*|} of $LOOP_CALLS non-NULL)"
			hits=$(pgvalue "SELECT hits || ' hits, ' || misses + pending_reads || ' other reads' FROM projcache.stats")
			REPORT+=("$line | $hits")
			stop_cluster
		done
	done
fi

# profile_hit PAGES: on the running cluster, perf record -a (999 Hz) over
# a pgbench -c 8 run of the constant query and one of get(); prints the
# samples per 1,000 transactions of each, and the symbols where get()'s
# run spent the most samples beyond the constant's.  Machine-wide, so other
# work on the machine shows as noise in processes other than postgres.
profile_hit() {
	local w tx
	for w in constant get; do
		local script=$WORK/constant_1kb.sql
		[ "$w" = get ] && script=$WORK/head/bench/get_1kb.sql
		perf record -q -F 999 -a -o "$WORK/$w.perf" -- \
			"${AS_PG[@]}" "$PGBIN/pgbench" -n -M prepared -f "$script" -c 8 -j 2 \
			-T "$DURATION" -h "$SOCK" -p "$PORT" postgres >"$WORK/$w.pgbench" 2>&1
		tx=$(awk '/^number of transactions actually processed:/ { print $6 }' "$WORK/$w.pgbench")
		perf report -i "$WORK/$w.perf" -n --sort comm,dso,sym -g none 2>/dev/null |
			awk -v tx="$tx" '/^#/ || NF < 5 { next }
				{ n = $2; $1 = ""; $2 = ""; sub(/^ +/, ""); printf "%.3f\t%s\n", n * 1000 / tx, $0 }' \
			>"$WORK/$w.samples"
	done
	awk -F'\t' -v pages="$1" '
		FILENAME ~ /constant/ { c[$2] += $1; tc += $1; next }
		{ g[$2] += $1; tg += $1 }
		END {
			printf "profile, pages %s, -c 8: samples per 1,000 transactions: constant %.1f, get() %.1f, get() less constant %.1f; most of the difference:\n", pages, tc, tg, tg - tc
			for (k in g) d[k] = g[k] - c[k]
			for (i = 0; i < 8; i++) {
				best = ""
				for (k in d) if (best == "" || d[k] > d[best]) best = k
				if (best == "") break
				printf "    %+6.2f  %s\n", d[best], best
				delete d[best]
			}
		}' "$WORK/constant.samples" "$WORK/get.samples"
}

# ------------------------------------------------------------ 1 kB values
# The same two trees with 100,000 keys of 1 kB (bench/hit_1kb.sql), under
# each paging mode: a get() hit of a random key beside the 1 kB constant
# query, at -c 1 and -c 8.  The ratio's two numbers come from the same
# cluster.
if [ "$(id -u)" -eq 0 ] && [ -w "$THP_SHMEM" ] && [ -w /proc/sys/vm/nr_hugepages ]; then
	read -r -a PAGE_MODES <<<"${BENCH_PAGES:-4k thp huge}"
else
	PAGE_MODES=(asis)
fi
ONE_KB=()
PROFILES=()
# BENCH_PROFILE=0 skips the profiles (they need perf, and root for -a).
PROFILE=0
if [ "${BENCH_PROFILE:-1}" = 1 ] && [ "$(id -u)" -eq 0 ] && command -v perf >/dev/null; then
	PROFILE=1
fi
if wanted 2; then
	for pass in $(seq 1 "$PASSES"); do
		for pages in "${PAGE_MODES[@]}"; do
			for tree in base head; do
				echo "=== 1 kB values, pass $pass: $tree, pages $pages"
				set_pages "$pages"
				huge=off
				if [ "$pages" = huge ]; then huge=on; fi
				if [ "$pages" = asis ]; then huge=try; fi
				use_tree $tree "projcache.fetch_function = 'public.fetch_configs'
	projcache.max_memory = '512MB'
	projcache.expiry = '1h'
	huge_pages = $huge"
				pgrun -f "$WORK/head/bench/hit_1kb.sql"
				n=$(pgvalue "SELECT count(projcache.fetch(key)) FROM public.configs;
				             SELECT count(projcache.get(key, '30s')) FROM public.configs" | tail -n 1)
				[ "$n" = 100000 ] || { echo "$NAME: only $n of 100000 keys cached" >&2; exit 1; }
				pgvalue "SELECT format('SELECT %L::jsonb;', config::text) FROM public.configs WHERE key = 'key-1'" \
					>"$WORK/constant_1kb.sql"
				read -r h0 o0 < <(pgvalue "SELECT hits, misses + pending_reads FROM projcache.stats" | tr '|' ' ')
				line="pass $pass $(printf '%-4s' $tree) pages $(printf '%-4s' $pages)"
				for c in 1 8; do
					k=$(prepared_tps "$WORK/constant_1kb.sql" $c)
					get=$(tps get_1kb.sql $c)
					line="$line | -c$c: constant $(printf '%7.0f' "$k") get $(printf '%7.0f' "$get") ratio $(ratio "$get" "$k" %.3f)"
				done
				if [ "$tree" = head ] && [ "$pass" = 1 ] && [ "$PROFILE" = 1 ]; then
					PROFILES+=("$(profile_hit "$pages")")
				fi
				hits=$(pgvalue "SELECT hits - $h0 || ' hits, ' || misses + pending_reads - $o0 || ' other reads' FROM projcache.stats")
				# In one backend, as in part 1, with the keys read spread out.
				ns=$(pgvalue "SELECT bench.loop_get_spread_key(20000, 100000), bench.loop_spread_key(20000, 100000);
				              SELECT round(((g.us_per_call - b.us_per_call) * 1000)::numeric), g.nonnull
				                FROM bench.loop_get_spread_key($LOOP_CALLS, 100000) g,
				                     bench.loop_spread_key($LOOP_CALLS, 100000) b" | tail -n 1)
				line="$line | in-backend ns/hit ${ns%|*} (${ns#*|} of $LOOP_CALLS non-NULL)"
				# What the kernel gave: shared memory mapped in transparent
				# huge pages, and reserved huge pages in use.
				mem=$(awk '/^ShmemPmdMapped:/ { t = $2 } /^HugePages_Total:/ { a = $2 }
				           /^HugePages_Free:/ { f = $2 } /^Hugepagesize:/ { z = $2 }
				           END { printf "thp %d MB, huge_pages %d MB", t / 1024, (a - f) * z / 1024 }' /proc/meminfo)
				ONE_KB+=("$line | measured reads: $hits | $mem")
				stop_cluster
				restore_pages
			done
		done
	done
fi

WS=()
if wanted 3; then
	echo "=== working set: this tree, max_memory 8MB"
	use_tree head "projcache.max_memory = '8MB'
	projcache.batch_interval = '10ms'
	projcache.fetch_function = 'public.fetch'"
	pgrun <<-'EOF'
	CREATE TABLE public.upstream (key text PRIMARY KEY, state text NOT NULL DEFAULT 'enabled',
	                              revision text, config jsonb);
	CREATE FUNCTION public.fetch(p_keys text[], p_revisions text[])
	RETURNS TABLE(key text, state text, revision text, config jsonb)
	LANGUAGE sql STABLE AS $$
	    SELECT u.key, u.state, u.revision, u.config FROM public.upstream u WHERE u.key = ANY (p_keys)
	$$;
	EOF
	pgrun -f "$WORK/head/bench/working_set.sql"
	for round in $(seq 1 13); do
		if [ "$round" -le 8 ]; then hot=1; seed=$(ratio "$round" 100 %.2f); label="round $round"
		else hot=25001; seed=$(ratio $((round + 42)) 100 %.2f); label="shift $((round - 8))"; fi
		WS+=("$label: $(pgvalue "SELECT 'hit ratio ' || round(hit_ratio::numeric, 3) || ', failed ' || failed || ', most memory_used ' || max_used FROM public.round($hot, $seed)")")
		sleep 1
	done
	LIMIT=$(pgvalue "SELECT memory_limit FROM projcache.stats")
	EVICT=$(pgvalue "SELECT evictions_memory || ' memory evictions, ' || refused_reads || ' refused reads (last round)' FROM projcache.stats")
	stop_cluster
fi

echo
echo "projcache hit path and working set, $(date -u '+%Y-%m-%d %H:%M:%S UTC'), $(nproc) CPUs, load $(cut -d' ' -f1-3 /proc/loadavg)"
echo "base: $BASE_DESC"
echo "head: $HEAD_DESC"
echo "pgbench -n -M prepared -T $DURATION; ratio = get() hit TPS / SELECT 1 TPS in the same cluster"
if [ "${#REPORT[@]}" -gt 0 ]; then printf '%s\n' "${REPORT[@]}"; fi
if [ "${#ONE_KB[@]}" -gt 0 ]; then
	echo "100,000 keys of 1 kB, max_memory 512MB; ratio = get() hit TPS / 1 kB constant query TPS in the same cluster"
	printf '%s\n' "${ONE_KB[@]}"
	if [ "${#PROFILES[@]}" -gt 0 ]; then printf '%s\n' "${PROFILES[@]}"; fi
fi
if [ "${#WS[@]}" -gt 0 ]; then
	echo "working set (head, memory_limit $LIMIT; 5,000 reads a round, 80 % on 5,000 hot keys of 50,000):"
	printf '  %s\n' "${WS[@]}"
	echo "  $EVICT"
fi
