# shellcheck shell=bash
# bench/lib.sh - what the scripts of bench/ share, on top of scripts/lib.sh
# (sourced first).  Sourced, never run.
#
#   bench_settings          BENCH_SECONDS (default 10) and BENCH_PASSES
#                           (default 2) into DURATION and PASSES, checked
#   prepared_tps FILE N     pgbench -M prepared TPS of FILE with N clients
#                           over the cluster's unix socket ($SOCK, $PORT)
#   ratio A B [FORMAT]      A / B, printed with FORMAT (default %.2f)
#   writable_or_exit FILE   exit 2 (before anything is built) unless FILE
#                           can be written where the results go

bench_settings() {
	DURATION=${BENCH_SECONDS:-10}
	PASSES=${BENCH_PASSES:-2}
	case $DURATION$PASSES in
	'' | *[!0-9]*) echo "BENCH_SECONDS and BENCH_PASSES must be whole numbers" >&2; exit 2 ;;
	esac
}

prepared_tps() {
	local jobs=$(($2 < $(nproc) ? $2 : $(nproc)))
	"${AS_PG[@]}" "$PGBIN/pgbench" -n -M prepared -f "$1" -c "$2" -j "$jobs" \
		-T "$DURATION" -h "$SOCK" -p "$PORT" postgres 2>&1 |
		awk '/^tps = /{print $3; exit}'
}

ratio() {
	LC_ALL=C awk -v a="$1" -v b="$2" -v f="${3:-%.2f}" \
		'BEGIN{ if (b > 0) printf f, a / b; else print "?" }'
}

writable_or_exit() {
	if [ ! -w "$(dirname "$1")" ] || { [ -e "$1" ] && [ ! -w "$1" ]; }; then
		echo "$NAME: cannot write $1" >&2
		exit 2
	fi
}
