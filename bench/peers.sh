#!/usr/bin/env bash
# bench/peers.sh - projcache beside Redis and memcached, in one run.
#
#     sudo bash bench/peers.sh                       # about 17 minutes
#     sudo PEERS_SCALES=8 PEERS_TRACES="shift scan" bash bench/peers.sh
#     sudo PEERS_OUT=/tmp/peers.txt bash bench/peers.sh
#
# Installs redis-server and memcached from Debian when they are missing
# (they are for this bench only: neither the build nor the tests need
# them), builds and installs projcache from a copy of this tree, starts a
# throwaway cluster (port 54342, unix socket only, run by the unprivileged
# "postgres" OS user) with bench/peers.sql loaded, and runs bench/peers.py:
# the same read-through traces against projcache, Redis allkeys-lru, Redis
# allkeys-lfu and memcached, each bounded to the same memory (8 MB, then
# 32 MB with four times the keys and reads), the keys each holds once
# full at 8 MB and 64 MB, and the bytes per key, of 100 B, 1 kB and 4 kB
# values.  peers.py starts and stops the Redis and
# memcached servers (unix sockets in the temp dir) and restarts the cluster
# for each bound.  The report is printed and written to
# bench/results/peers-latest.txt (PEERS_OUT=path: elsewhere).  It asserts
# nothing.  The servers are stopped and the temp dir removed on exit, error
# or Ctrl-C.  See bench/README.md.
set -euo pipefail

# shellcheck source=SCRIPTDIR/../scripts/lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/../scripts/lib.sh"
# shellcheck source=SCRIPTDIR/lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
NAME=peers
PORT=54342
OUT=${PEERS_OUT:-$REPO/bench/results/peers-latest.txt}
# No snapshots here: by default all of max_memory but the message reserve
# is the key cache's, as all of maxmemory and -m is the peers'.
# PEERS_SNAPSHOT_MEMORY=-1 keeps projcache's default (a quarter of it).
SNAP_MEM=${PEERS_SNAPSHOT_MEMORY:-0}
WORK=
DATA=
SOCK=

writable_or_exit "$OUT"

cleanup_on_exit
bash "$REPO/scripts/install-deps.sh"
# The peers, for this bench only.  Debian's packages would start their own
# servers where services may start; this bench runs its own instances, so
# it stops none and uses none of those.
peer_pkgs=()
command -v redis-server >/dev/null || peer_pkgs+=(redis-server)
command -v memcached >/dev/null || peer_pkgs+=(memcached)
if [ "${#peer_pkgs[@]}" -gt 0 ]; then
	echo "$NAME: installing ${peer_pkgs[*]}"
	"${AS_ROOT[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update -q
	"${AS_ROOT[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${peer_pkgs[@]}"
fi

START_NS=$(date +%s%N)
GIT=(git -C "$REPO" -c safe.directory='*')
COMMIT=$("${GIT[@]}" log -1 --format='%h %s' 2>/dev/null | cut -c1-72 || echo unknown)
[ -z "$("${GIT[@]}" status --porcelain --untracked-files=no 2>/dev/null)" ] ||
	COMMIT="$COMMIT (+ uncommitted changes)"
LOAD_BEFORE=$(cut -d' ' -f1-3 /proc/loadavg)

setup_work projcache-peers
DATA=$WORK/data
start_cluster <<EOF
listen_addresses = ''
fsync = off
shared_preload_libraries = 'projcache'
projcache.database = 'postgres'
projcache.fetch_function = 'public.fetch'
projcache.batch_interval = '10ms'
projcache.snapshot_memory = '$SNAP_MEM'
# Each trace restarts the cluster and must start cold, like its peers.
projcache.dump_interval = -1
include_if_exists = 'peers.conf'
EOF
echo "loading bench/peers.sql (215,000 keys)"
pgrun -f "$WORK/src/bench/peers.sql"
PGVER=$(pgvalue "SHOW server_version")

{
	echo "projcache beside Redis and memcached (bench/peers.sh), $(date -u '+%Y-%m-%d %H:%M:%S UTC')"
	echo "tree:      $COMMIT"
	echo "machine:   $(nproc) CPUs, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//'); load avg $LOAD_BEFORE before"
	echo "servers:   PostgreSQL $PGVER with projcache: max_memory = the bound, snapshot_memory $SNAP_MEM (keys get max_memory"
	echo "           less snapshot_memory and a reserve of 1/16, at most 64 kB), batch_interval 10ms, other settings default;"
	echo "           $(redis-server --version | cut -d' ' -f1-3) (maxmemory-samples, lfu-log-factor, lfu-decay-time default);"
	echo "           $(memcached -V) (-m MB -U 0, other options default)"
	echo "client:    bench/peers.py, one connection per cache, read-through: Redis/memcached GET, SET on a miss;"
	echo "           projcache get() (NULL = miss; its worker fetches); hit ratio = non-NULL reads / reads"
	echo
} >"$WORK/report.txt"

if ! PEERS_PGBIN=$PGBIN PEERS_DATA=$DATA PEERS_SOCK=$SOCK PEERS_PORT=$PORT PEERS_WORK=$WORK \
	PEERS_RUN_USER=$RUN_USER python3 "$WORK/src/bench/peers.py" | tee -a "$WORK/report.txt"; then
	echo "$NAME: peers.py failed" >&2
	exit 1
fi
# The workers' FATALs at each of peers.py's restarts are not news.
log_lines() {
	grep -E '(ERROR|WARNING|FATAL|PANIC):' "$WORK/server.log" |
		grep -vE 'FATAL:  terminating background worker "projcache [a-z]+" due to administrator command' || true
}
LOG_LINES=$(log_lines | wc -l)
{
	echo "load avg $(cut -d' ' -f1-3 /proc/loadavg) after; server log: $LOG_LINES ERROR/WARNING/FATAL/PANIC lines" \
		"(besides the workers' at each restart); total $(( ($(date +%s%N) - START_NS) / 1000000000 )) s"
	[ "$LOG_LINES" -eq 0 ] || { log_lines | sed 's/^[^]]*] //' | sort | uniq -c | sort -rn | head -n 10; }
} | tee -a "$WORK/report.txt"
stop_cluster
cp "$WORK/report.txt" "$OUT"
[ "$(id -u)" -ne 0 ] || chown --reference="$(dirname "$OUT")" "$OUT" 2>/dev/null || true
echo
echo "report: $OUT"
