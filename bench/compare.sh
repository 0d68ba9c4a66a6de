#!/usr/bin/env bash
# bench/compare.sh - projcache beside what a user would pick instead, in one
# run and one picture.
#
#     sudo bash bench/compare.sh                  # about 7 minutes
#     sudo BENCH_SECONDS=10 BENCH_ROUNDS=5 bash bench/compare.sh
#     sudo BENCH_PNG=/tmp/c.png bash bench/compare.sh   # picture elsewhere
#
# It installs the dependencies (scripts/install-deps.sh, and for this bench
# only redis-server, redis-tools, memcached and postgresql-15-pgmemcache when
# they are missing), builds and installs projcache from a copy of this tree,
# starts a throwaway cluster (port 54344, unix socket only, run by the
# unprivileged "postgres" OS user) with projcache and pgmemcache preloaded,
# and its own memcached and redis-server (unix sockets in the temp dir, as
# "postgres" too).  With PROJCACHE_PGBIN naming another copy of PostgreSQL
# 15, Debian's pgmemcache files are copied into that copy.  Then, at -c 1
# and at -c 8, in BENCH_ROUNDS rounds (default 3) of runs of BENCH_SECONDS
# each (default 5), it measures two things:
#
#   One 1 kB value by a random key of 1,000, as throughput over SELECT 1's
#   (pgbench -n -M prepared, unix socket): SELECT 1; a constant query
#   returning the same 1 kB jsonb (the cost of carrying the value, with no
#   lookup); projcache.get() hits; the table by its primary key;
#   pgmemcache's memcache_get() (a SQL statement whose backend asks
#   memcached); and Redis GET.
#
#   Cached tables, as throughput over the table's (bench/snapshots/): the
#   count(*) of 10,000 rows (text, text) from the table, its foreign table
#   and snapshot(); a lookup by a random key of the table's primary key and
#   of the foreign table's key index.
#
# Each ratio is taken within one round (the reads run forward in odd
# rounds, backward in even ones); a bar is the median of the rounds'
# ratios, its whisker the lowest and highest, so that a burst of other work
# on the machine shows as a long whisker rather than as a wrong bar.
#
# Redis GET is measured with redis-benchmark, not pgbench: what a user
# weighs is an application asking Redis itself against one asking
# PostgreSQL.  Both are C clients on the same machine, one request in
# flight per connection (redis-benchmark -P 1), the same number of
# connections and client threads (--threads = pgbench -j), each request one
# round trip over a unix socket returning the same 1,024 bytes.  What
# differs is what a round trip costs the server: a RESP GET against a SQL
# statement (Bind/Execute/Sync, a transaction, the executor), which is the
# point of the comparison.  Redis serves from one thread, PostgreSQL from a
# backend per connection.  pgmemcache pays both: the SQL round trip and a
# memcached round trip from the backend.  The counters say whether every
# read was a hit (projcache's stats, memcached's get_misses, Redis's
# keyspace_misses).
#
# It draws both panels into one picture, bench/results/compare.png, with
# the numbers in compare.dat beside it, the machine, the date, the tree and
# this command in the picture: the only things a run keeps.  It asserts
# nothing about speed.  The servers are stopped and the temp dir removed on
# exit, error or Ctrl-C.  See bench/README.md.
set -euo pipefail

# shellcheck source=SCRIPTDIR/../scripts/lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/../scripts/lib.sh"
# shellcheck source=SCRIPTDIR/lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
NAME=compare
PORT=54344
CLIENTS=(1 8)
WORK=
DATA=
SOCK=
ERRORS=0

BENCH_SECONDS=${BENCH_SECONDS:-5}
bench_settings      # DURATION (BENCH_SECONDS, here 5 by default)
ROUNDS=${BENCH_ROUNDS:-3}
case $ROUNDS in '' | *[!0-9]* | 0) echo "BENCH_ROUNDS must be a whole number above 0" >&2; exit 2 ;; esac

PNG=${BENCH_PNG:-$REPO/bench/results/compare.png}
case $PNG in /*) ;; *) PNG=$PWD/$PNG ;; esac
DAT=${PNG%.png}.dat
if ! mkdir -p "$(dirname "$PNG")" || ! [ -w "$(dirname "$PNG")" ]; then
	echo "$NAME: cannot write into $(dirname "$PNG") (set BENCH_PNG to put the picture elsewhere)" >&2
	exit 2
fi

# The peers' servers write pid files into $WORK; they are stopped before
# lib.sh's cleanup stops the cluster and removes $WORK.
stop_peers() {
	local f
	for f in "$WORK/redis.pid" "$WORK/memcached.pid"; do
		if [ -n "$WORK" ] && [ -s "$f" ]; then
			kill "$(cat "$f")" 2>/dev/null || true
			rm -f "$f"
		fi
	done
}
cleanup_on_exit
trap 'rc=$?; stop_peers; (exit $rc); _cleanup' EXIT

# ------------------------------------------------------------ dependencies
bash "$REPO/scripts/install-deps.sh"
peer_pkgs=()
for pkg in redis-server redis-tools memcached postgresql-15-pgmemcache; do
	[ "$(dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null || true)" = "install ok installed" ] ||
		peer_pkgs+=("$pkg")
done
if [ "${#peer_pkgs[@]}" -gt 0 ]; then
	echo "$NAME: installing ${peer_pkgs[*]}"
	"${AS_ROOT[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update -q
	"${AS_ROOT[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${peer_pkgs[@]}"
fi
# Debian's package installs into Debian's PostgreSQL 15; another copy
# (PROJCACHE_PGBIN) gets the same files in its own directories.
PKGLIB=$("$PG_CONFIG" --pkglibdir)
EXTDIR=$("$PG_CONFIG" --sharedir)/extension
if [ ! -e "$PKGLIB/pgmemcache.so" ] || [ ! -e "$EXTDIR/pgmemcache.control" ]; then
	echo "$NAME: copying pgmemcache into $PKGLIB and $EXTDIR"
	dpkg -L postgresql-15-pgmemcache | grep -E '/lib/pgmemcache\.so$' |
		xargs -r "${AS_ROOT[@]}" cp -t "$PKGLIB"
	dpkg -L postgresql-15-pgmemcache | grep -E '/extension/pgmemcache[^/]*$' |
		xargs -r "${AS_ROOT[@]}" cp -t "$EXTDIR"
fi

START_NS=$(date +%s%N)
GIT=(git -C "$REPO" -c safe.directory='*')
COMMIT=$("${GIT[@]}" rev-parse --short HEAD 2>/dev/null || echo unknown)
[ -z "$("${GIT[@]}" status --porcelain --untracked-files=no -- . ':!bench' 2>/dev/null)" ] ||
	COMMIT="$COMMIT + uncommitted changes"
CPU=$(awk -F': *' '/^model name/{print $2; exit}' /proc/cpuinfo)
CPU=${CPU:-unknown CPU}
LOAD_BEFORE=$(cut -d' ' -f1-3 /proc/loadavg)

# ------------------------------------------------------------ servers
setup_work projcache-compare
DATA=$WORK/data
mkdir -p "$WORK/bench"
chown "$RUN_USER" "$WORK/bench"

# wait_for WHAT CMD...: poll CMD every 0.1 s, 30 s at most.
wait_for() {
	local what=$1 i
	shift
	for i in $(seq 1 300); do
		"$@" >/dev/null 2>&1 && return 0
		sleep 0.1
	done
	echo "$NAME: $what did not start within 30 s" >&2
	exit 1
}
"${AS_PG[@]}" memcached -d -s "$WORK/memcached.sock" -a 0700 -m 64 -U 0 -P "$WORK/memcached.pid"
wait_for memcached test -S "$WORK/memcached.sock"
"${AS_PG[@]}" redis-server --port 0 --unixsocket "$WORK/redis.sock" --unixsocketperm 700 \
	--save '' --appendonly no --daemonize yes --pidfile "$WORK/redis.pid" \
	--logfile "$WORK/redis.log" --dir "$WORK"
REDIS_CLI=("${AS_PG[@]}" redis-cli -s "$WORK/redis.sock")
wait_for redis-server "${REDIS_CLI[@]}" ping

start_cluster <<EOF
listen_addresses = ''
fsync = off
shared_preload_libraries = 'projcache, pgmemcache'
projcache.database = 'postgres'
projcache.fetch_function = 'public.fetch_configs'
pgmemcache.default_servers = '$WORK/memcached.sock'
EOF
pgrun -f "$WORK/src/bench/snapshots/setup.sql" >/dev/null
pgrun -f "$WORK/src/bench/compare/setup.sql"
PGVER=$(pgvalue "SHOW server_version")

# The values everywhere: projcache's cache (fetch all, then wait for each),
# memcached (through pgmemcache), Redis (key-000000000000 .. -000000000999,
# as redis-benchmark's -r 1000 names them, holding key-1 .. key-1000), and
# the constant query (key-1's value as a literal).
WARM=$(pgvalue "SELECT count(projcache.fetch(key)) FROM public.configs;
                SELECT count(projcache.get(key, '5s')) FROM public.configs" | tail -n 1)
MC_SET=$(pgvalue "SELECT count(*) FILTER (WHERE memcache_set(key, config::text)) FROM public.configs")
pgvalue "SELECT string_agg(format(E'*3\r\n\$3\r\nSET\r\n\$%s\r\n%s\r\n\$%s\r\n%s\r\n',
                                  16, 'key-' || lpad((substr(key, 5)::int - 1)::text, 12, '0'),
                                  octet_length(config::text), config::text), '' ORDER BY key)
           FROM public.configs" | "${REDIS_CLI[@]}" --pipe >"$WORK/redis-load.log"
REDIS_KEYS=$("${REDIS_CLI[@]}" dbsize)
REDIS_LEN=$("${REDIS_CLI[@]}" strlen key-000000000000)
pgvalue "SELECT format('SELECT %L::jsonb;', config::text) FROM public.configs WHERE key = 'key-1'" \
	>"$WORK/bench/constant_1kb.sql"
echo "values: get() gave $WARM of 1000, memcached set $MC_SET, Redis holds $REDIS_KEYS ($REDIS_LEN bytes each)"
if [ "$WARM" != 1000 ] || [ "$MC_SET" != 1000 ] || [ "$REDIS_KEYS" != 1000 ] || [ "$REDIS_LEN" != 1024 ]; then
	echo "$NAME: the values are not all in place" >&2
	exit 1
fi

# ------------------------------------------------------------ measuring
# Each ratio is taken within one round, from runs seconds apart, so that the
# machine's drift mostly cancels out of it; the rounds run the reads forward
# and backward in turn, and the picture shows the median round with the
# lowest and highest as an error bar.
declare -A RATIOS TPSES NOTE RN
CUR_TPS=
XACTS=0

# pg_run ID FILE C: pgbench -n -M prepared TPS of FILE with C clients into
# CUR_TPS (and its transactions into XACTS); "missing" when pgbench failed,
# printed no TPS or counted failed transactions (its output is printed).
pg_run() {
	local id=$1 file=$2 c=$3 j out
	j=$(($3 < $(nproc) ? $3 : $(nproc)))
	out=$WORK/pgbench.$id.c$c.log
	printf '  %-14s -c %s: ' "$id" "$c"
	if "${AS_PG[@]}" "$PGBIN/pgbench" -n -M prepared -f "$file" -c "$c" -j "$j" \
		-T "$DURATION" -h "$SOCK" -p "$PORT" postgres >"$out" 2>&1 &&
		grep -q '^tps = ' "$out" &&
		! grep -Eq '^number of failed transactions: [1-9]' "$out"; then
		CUR_TPS=$(awk '/^tps = /{print $3; exit}' "$out")
		XACTS=$(awk -F': *' '/^number of transactions actually processed/{print $2; exit}' "$out")
		echo "$CUR_TPS TPS"
	else
		CUR_TPS=missing
		XACTS=0
		echo "failed"
		cat "$out"
		ERRORS=$((ERRORS + 1))
	fi
}

# redis_bench C N: redis-benchmark GET of a random key of 1,000 with C
# connections, as many threads as pgbench would have, one request in
# flight each, N requests; prints the GETs per second.
redis_bench() {
	local j=$(($1 < $(nproc) ? $1 : $(nproc))) out=$WORK/redis.c$1.log
	if ! "${AS_PG[@]}" redis-benchmark -s "$WORK/redis.sock" -c "$1" --threads "$j" -P 1 \
		-r 1000 -n "$2" --csv GET key-__rand_int__ >"$out" 2>&1 ||
		! awk -F'"' 'NR == 2 && $4 + 0 > 0 {print $4; ok = 1} END {exit !ok}' "$out"; then
		cat "$out" >&2
		return 1
	fi
}

# redis_run C: redis_bench for about $DURATION s (RN[C] requests, sized
# by a first run of 20,000) into CUR_TPS.
redis_run() {
	local c=$1 rps
	if [ -z "${RN[$c]:-}" ]; then
		rps=$(redis_bench "$c" 20000) || rps=0
		RN[$c]=$(awk -v r="$rps" -v d="$DURATION" 'BEGIN{n = int(r * d); print (n > 1000 ? n : 1000)}')
	fi
	printf '  %-14s -c %s: ' redis "$c"
	if CUR_TPS=$(redis_bench "$c" "${RN[$c]}"); then
		echo "$CUR_TPS GET/s (-n ${RN[$c]})"
	else
		CUR_TPS=missing
		echo "failed"
		ERRORS=$((ERRORS + 1))
	fi
}

B=$WORK/src/bench
KV=(select_1 constant get lookup pgmemcache redis)
TABLES=(big_table big_ft big_fn lookup_table lookup_ft)
declare -A FILE=(
	[select_1]=$B/select_1.sql [constant]=$WORK/bench/constant_1kb.sql [get]=$B/get_hit.sql
	[lookup]=$B/compare/lookup.sql [pgmemcache]=$B/compare/pgmemcache.sql
	[big_table]=$B/snapshots/big_table.sql [big_ft]=$B/snapshots/big_ft.sql
	[big_fn]=$B/snapshots/big_fn.sql [lookup_table]=$B/snapshots/lookup_table.sql
	[lookup_ft]=$B/snapshots/lookup_ft.sql)
declare -A REF=(      # what each read's ratio is taken to
	[select_1]=select_1 [constant]=select_1 [get]=select_1 [lookup]=select_1
	[pgmemcache]=select_1 [redis]=select_1
	[big_table]=big_table [big_ft]=big_table [big_fn]=big_table
	[lookup_table]=lookup_table [lookup_ft]=lookup_table)

mc_misses() { pgvalue "SELECT substring(memcache_stats() FROM 'get_misses: ([0-9]+)')"; }
redis_misses() { "${REDIS_CLI[@]}" info stats | tr -d '\r' | awk -F: '$1 == "keyspace_misses" {print $2}'; }

# round C R IDS...: run IDS (reversed in even rounds R) once each, then add
# each one's TPS and ratio to its reference's TPS of this round.
round() {
	local c=$1 r=$2 id ref
	shift 2
	local ids=("$@")
	local -A cur=()
	[ $((r % 2)) -eq 1 ] || mapfile -t ids < <(printf '%s\n' "$@" | tac)
	for id in "${ids[@]}"; do
		if [ "$id" = redis ]; then redis_run "$c"
		else pg_run "$id" "${FILE[$id]}" "$c"; fi
		cur[$id]=$CUR_TPS
		[ "$id" != get ] || GET_XACTS=$((GET_XACTS + XACTS))
		[ "$id" != pgmemcache ] || MC_XACTS=$((MC_XACTS + XACTS))
	done
	for id in "$@"; do
		ref=${REF[$id]}
		TPSES[$id,$c]="${TPSES[$id,$c]:-}${cur[$id]} "
		if [ "${cur[$id]}" = missing ] || [ "${cur[$ref]}" = missing ]; then
			RATIOS[$id,$c]="${RATIOS[$id,$c]:-}missing "
		else
			RATIOS[$id,$c]="${RATIOS[$id,$c]:-}$(awk -v a="${cur[$id]}" -v b="${cur[$ref]}" \
				'BEGIN{ if (b > 0) printf "%.3f", a / b; else printf "missing" }') "
		fi
	done
}

for c in "${CLIENTS[@]}"; do
	pgvalue "SELECT projcache.reset_stats()" >/dev/null
	GET_XACTS=0 MC_XACTS=0
	mc0=$(mc_misses) rd0=$(redis_misses)
	for r in $(seq 1 "$ROUNDS"); do
		echo "=== -c $c, round $r of $ROUNDS: one 1 kB value by key, ${DURATION}s each"
		round "$c" "$r" "${KV[@]}"
		echo "=== -c $c, round $r of $ROUNDS: cached tables, ${DURATION}s each"
		round "$c" "$r" "${TABLES[@]}"
	done
	NOTE[$c]="get() $(pgvalue "SELECT 'hits ' || hits || ', misses ' || misses || ', pending_reads ' || pending_reads FROM projcache.stats") over $GET_XACTS reads;"
	NOTE[$c]="${NOTE[$c]} memcached get_misses +$(( $(mc_misses) - mc0 )) over $MC_XACTS memcache_get();"
	NOTE[$c]="${NOTE[$c]} Redis keyspace_misses +$(( $(redis_misses) - rd0 ))"
done

SNAPS=$(pgvalue "SELECT string_agg(name || ' ' || rows || ' rows ' || status, ', ' ORDER BY name) FROM projcache.snapshots")
LOAD_AFTER=$(cut -d' ' -f1-3 /proc/loadavg)
LOG_LINES=$(grep -cE '(ERROR|WARNING|FATAL|PANIC):' "$WORK/server.log" || true)
RUN_DATE=$(date -u '+%Y-%m-%d %H:%M UTC')
REDIS_VER=$(redis-server --version | awk '{print $3}' | sed 's/^v=//')
MC_VER=$(memcached -V | awk '{print $2}')
stop_cluster
stop_peers

# ------------------------------------------------------------ data
# stats LIST: "median lowest highest" of LIST's numbers ("missing" when
# any of them is: a failed run must not pass for a measurement).
stats() {
	case " $1 " in *' missing '*) echo "missing missing missing"; return ;; esac
	# shellcheck disable=SC2086  # the list is split on purpose
	printf '%s\n' $1 | sort -g | awk '{v[NR] = $1}
		END {m = NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2
		     printf "%.3f %.3f %.3f\n", m, v[1], v[NR]}'
}
declare -A LABEL=(
	[select_1]="SELECT 1" [constant]="1 kB constant" [get]="projcache get() hit"
	[lookup]="table, primary key" [pgmemcache]="pgmemcache memcache_get()"
	[redis]="Redis GET (redis-benchmark)"
	[big_table]="table count(*)" [big_ft]="foreign table count(*)"
	[big_fn]="snapshot() count(*)" [lookup_table]="table WHERE k = \$1"
	[lookup_ft]="foreign table WHERE k = \$1")
C1=${CLIENTS[0]} C8=${CLIENTS[1]}
J8=$((C8 < $(nproc) ? C8 : $(nproc)))
HOW="sudo bash bench/compare.sh (BENCH_SECONDS=$DURATION BENCH_ROUNDS=$ROUNDS)"
MACHINE="$CPU, nproc $(nproc); load avg $LOAD_BEFORE before, $LOAD_AFTER after"
# data_row ID: label, id, then per client count the median TPS and the
# median, lowest and highest ratio of the rounds.
data_row() {
	local c t r
	printf '"%s" %s' "${LABEL[$1]}" "$1"
	for c in "${CLIENTS[@]}"; do
		t=$(stats "${TPSES[$1,$c]}")
		r=$(stats "${RATIOS[$1,$c]}")
		printf ' %s %s' "${t%% *}" "$r"
	done
	echo
}
{
	echo "# projcache bench/compare.sh, $RUN_DATE, tree $COMMIT"
	echo "# made by: $HOW"
	echo "# machine: $MACHINE"
	echo "# PostgreSQL $PGVER, Redis $REDIS_VER, memcached $MC_VER; pgbench -n -M prepared -T $DURATION, unix sockets"
	echo "# $ROUNDS rounds; a ratio is a TPS over its reference's TPS in the same round; median, lowest, highest"
	echo "# over the rounds; tps = the median of the rounds' TPS; missing = a run failed"
	for c in "${CLIENTS[@]}"; do
		echo "#   -c $c: ${NOTE[$c]}"
	done
	echo "# snapshots at the end: $SNAPS"
	echo "# every round (-c: TPS ... | ratios ...):"
	for id in "${KV[@]}" "${TABLES[@]}"; do
		for c in "${CLIENTS[@]}"; do
			echo "#   $id -c $c: ${TPSES[$id,$c]}| ${RATIOS[$id,$c]}"
		done
	done
	echo "#"
	echo "# index 0: one 1 kB value by a random key of 1,000; reference SELECT 1 at the same -c"
	echo "# label id tps_c$C1 ratio_c$C1 low_c$C1 high_c$C1 tps_c$C8 ratio_c$C8 low_c$C8 high_c$C8"
	for id in "${KV[@]}"; do data_row "$id"; done
	printf '\n\n'
	echo "# index 1: cached tables (10,000 rows of text, text); reference the same read of the table at the same -c"
	echo "# label id tps_c$C1 ratio_c$C1 low_c$C1 high_c$C1 tps_c$C8 ratio_c$C8 low_c$C8 high_c$C8"
	for id in "${TABLES[@]}"; do data_row "$id"; done
} >"$WORK/compare.dat"
cp "$WORK/compare.dat" "$DAT"

# ------------------------------------------------------------ picture
# gpq S: S as a single-quoted gnuplot string.
gpq() { printf "'%s'" "${1//\'/\'\'}"; }
# The x axis's labels, \n a line break (gnuplot's double-quoted strings).
# shellcheck disable=SC2016  # $1 is text
declare -A XLABEL=(
	[select_1]='SELECT 1' [constant]='1 kB\nconstant' [get]='projcache\nget() hit'
	[lookup]='table by\nprimary key' [pgmemcache]='pgmemcache\nmemcache_get()'
	[redis]='Redis\nGET'
	[big_table]='table\ncount(*)' [big_ft]='foreign\ntable\ncount(*)'
	[big_fn]='snapshot()\ncount(*)' [lookup_table]='table\nWHERE k = $1'
	[lookup_ft]='foreign\ntable\nWHERE k = $1')
# xtics ID...: gnuplot xtics for histogram rows 0, 1, ... from XLABEL.
xtics() {
	local i=0 id out=
	for id in "$@"; do
		out="$out${out:+, }\"${XLABEL[$id]}\" $i"
		i=$((i + 1))
	done
	printf '(%s)' "$out"
}
PLOT=$PNG
if ! command -v gnuplot >/dev/null; then
	PLOT="not drawn: gnuplot is not installed"
else
	cat >"$WORK/plot.gp" <<GNUPLOT
set terminal pngcairo noenhanced size 1500,760 font "Sans,11"
set output '$WORK/plot.png'
m(col) = strcol(col) eq "missing"
k(x) = x >= 10000 ? sprintf("%.0fk", x / 1000) : x >= 1000 ? sprintf("%.1fk", x / 1000) : sprintf("%.0f", x)
lab(r, t) = sprintf("%.2f\n%s", r, k(t))
set multiplot title $(gpq "projcache beside its alternatives: throughput at 1 and 8 clients (pgbench -M prepared; Redis: redis-benchmark)") font "Sans,14"
set style data histograms
set style histogram errorbars gap 1 lw 1
set style fill solid 0.85 border -1
set boxwidth 1
set yrange [0:*]
set offsets 0, 0, graph 0.12, 0
set grid ytics
set xtics nomirror font "Sans,10"
set key top left
set label 1 $(gpq "$RUN_DATE, tree $COMMIT; $MACHINE") at screen 0.01, 0.040 font "Sans,10"
set label 2 $(gpq "made by: $HOW; data: bench/results/$(basename "$DAT"); bar: median of $ROUNDS rounds' ratios (label: ratio, TPS), whisker: lowest to highest") at screen 0.01, 0.015 font "Sans,10"
set arrow 1 from graph 0, first 1 to graph 1, first 1 nohead dashtype 2 linecolor rgb "#555555"

set origin 0, 0.09
set size 0.57, 0.85
set title 'One 1 kB value by a random key of 1,000: TPS / SELECT 1 TPS'
set ylabel 'TPS / SELECT 1 TPS at the same client count'
set xtics $(xtics "${KV[@]}")
plot '$WORK/compare.dat' index 0 using (m(4) ? NaN : \$4):5:6 title 'pgbench -c $C1 (Redis: -c $C1)' linecolor rgb "#4C72B0", \
     '' index 0 using (m(8) ? NaN : \$8):9:10 title 'pgbench -c $C8 -j $J8 (Redis: -c $C8 --threads $J8)' linecolor rgb "#DD8452", \
     '' index 0 using (\$0 - 1./6):(m(4) ? 0 : \$6):(m(4) ? "missing" : lab(\$4, \$3)) with labels offset 0, 1.2 font "Sans,9" notitle, \
     '' index 0 using (\$0 + 1./6):(m(8) ? 0 : \$10):(m(8) ? "missing" : lab(\$8, \$7)) with labels offset 0, 1.2 font "Sans,9" notitle

unset label 1
unset label 2
set origin 0.57, 0.09
set size 0.43, 0.85
set title 'Cached tables (10,000 rows): TPS / the table''s TPS'
set ylabel 'TPS / TPS of the same read of the table'
set xtics $(xtics "${TABLES[@]}") font "Sans,9"
plot '$WORK/compare.dat' index 1 using (m(4) ? NaN : \$4):5:6 title '-c $C1' linecolor rgb "#4C72B0", \
     '' index 1 using (m(8) ? NaN : \$8):9:10 title '-c $C8' linecolor rgb "#DD8452", \
     '' index 1 using (\$0 - 1./6):(m(4) ? 0 : \$6):(m(4) ? "missing" : lab(\$4, \$3)) with labels offset 0, 1.2 font "Sans,8" notitle, \
     '' index 1 using (\$0 + 1./6):(m(8) ? 0 : \$10):(m(8) ? "missing" : lab(\$8, \$7)) with labels offset 0, 1.2 font "Sans,8" notitle
unset multiplot
GNUPLOT
	if gnuplot "$WORK/plot.gp" >"$WORK/gnuplot.log" 2>&1 && [ -s "$WORK/plot.png" ]; then
		cp "$WORK/plot.png" "$PNG"
	else
		cat "$WORK/gnuplot.log"
		PLOT="not drawn: gnuplot failed (its output is above)"
	fi
fi
if [ "$(id -u)" -eq 0 ]; then
	chown --reference="$(dirname "$PNG")" "$DAT" 2>/dev/null || true
	[ "$PLOT" != "$PNG" ] || chown --reference="$(dirname "$PNG")" "$PNG" 2>/dev/null || true
fi
[ "$PLOT" = "$PNG" ] || [ ! -e "$PNG" ] || PLOT="$PLOT; $PNG is an earlier run's"

echo
cat "$DAT"
echo
echo "server log: $LOG_LINES ERROR/WARNING/FATAL/PANIC lines; measurements that failed: $ERRORS;" \
	"total $(( ($(date +%s%N) - START_NS) / 1000000000 )) s"
[ "$LOG_LINES" -eq 0 ] || grep -E '(ERROR|WARNING|FATAL|PANIC):' "$WORK/server.log" | head -n 20
echo "picture: $PLOT"
echo "data:    $DAT"
[ "$ERRORS" -eq 0 ]
