# shellcheck shell=bash
# lib.sh - what scripts/test.sh, scripts/demo.sh and bench/run.sh share.
# Sourced, never run:   . "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
#
# Sourcing it sets
#   REPO, PGBIN, PG_CONFIG  the source tree (this file's parent's parent) and
#                           the binaries and pg_config of PostgreSQL
#                           $PG_MAJOR: 15 (the default) is Debian's package
#                           ($PROJCACHE_PGBIN, if set, instead); for another
#                           major PGBIN is empty until use_major has run
#   PG_MAJOR                the major (15 unless the caller set it)
#   RUN_USER, AS_PG,        the OS user that builds and runs servers, and
#   AS_ROOT                 command prefixes running as it and as root: when
#                           root, "postgres" (PostgreSQL refuses to run as
#                           root) and plain env; otherwise oneself and sudo
# and unsets the libpq variables (PGHOST, PGPORT, ...) of the caller's
# environment, so that they cannot redirect a client or leak into a test
# instance.  It sets no shell options and installs no trap.
#
# use_major: make sure $PG_MAJOR is there (scripts/pgmajor.sh: installed
# from this machine's apt, or built from source once and kept) and set
# PGBIN and PG_CONFIG to it; call it after scripts/install-deps.sh.  Exits
# 1 when that major cannot be had.
#
# Functions for the temp dir (used by all three scripts):
#   copy_tree DEST        copy the tree as a developer sees it into DEST
#   own_work              make $WORK usable by RUN_USER
#
# Functions for a throwaway cluster (demo.sh and bench/run.sh), which work on
# the globals WORK (temp dir, $WORK/src the copy), DATA (data directory),
# SOCK (socket directory), PORT and NAME (the script's name in messages):
#   build_install         build $WORK/src quietly and install it
#   setup_work PREFIX     a temp dir $WORK (with $SOCK), a copy of the tree
#                         in $WORK/src, built and installed; cd's there
#   start_cluster         initdb $DATA, append stdin to postgresql.conf, start
#   pgrun ARGS...         psql on the cluster, quiet, stopping at an error
#   pgvalue SQL           psql's bare values (-At) for one command
#   restart_cluster       restart the cluster (a fast, clean shutdown, then
#                         a start as start_cluster's); fails if it cannot
#   stop_cluster          stop the cluster (fast); fails if it cannot
#   cleanup_on_exit       install the EXIT/signal traps that always stop the
#                         cluster and remove $WORK, with the server log's
#                         last lines and "NAME FAILED (exit N)" on failure

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
# PG_MAJOR picks the PostgreSQL major to build and run against.
# PROJCACHE_PGBIN runs everything against another copy of that major's
# binaries (a relocated copy of the install, so that one machine can build
# and test two trees at once without one install replacing the other's).
PG_MAJOR=${PG_MAJOR:-15}
if [ -n "${PROJCACHE_PGBIN:-}" ]; then
	PGBIN=$PROJCACHE_PGBIN
elif [ "$PG_MAJOR" = 15 ]; then
	PGBIN=/usr/lib/postgresql/15/bin
else
	PGBIN=
fi
PG_CONFIG=${PGBIN:+$PGBIN/pg_config}

use_major() {
	if [ -z "$PGBIN" ]; then
		PGBIN=$(bash "$REPO/scripts/pgmajor.sh" server "$PG_MAJOR") || {
			echo "${NAME:-projcache}: PostgreSQL $PG_MAJOR cannot be had (scripts/pgmajor.sh)" >&2
			exit 1
		}
	fi
	PG_CONFIG=$PGBIN/pg_config
}

unset PGDATA PGHOST PGHOSTADDR PGPORT PGUSER PGDATABASE PGSERVICE PGOPTIONS \
	PGPASSWORD PGSSLMODE

# The postgres user may not exist yet (scripts/install-deps.sh creates it):
# then its HOME is empty, and that is not an error.
if [ "$(id -u)" -eq 0 ]; then
	RUN_USER=postgres
	AS_PG=(runuser -u postgres -- env HOME="$(getent passwd postgres | cut -d: -f6 || true)")
	AS_ROOT=(env)
else
	RUN_USER=$(id -un)
	AS_PG=(env)
	AS_ROOT=(sudo)
fi

# copy_tree DEST: tracked files plus untracked, not ignored ones (so no .git,
# objects or old test output), as they are in the working tree.
copy_tree() {
	local dest=$1 git=(git -C "$REPO" -c safe.directory='*')
	if "${git[@]}" rev-parse --is-inside-work-tree >/dev/null 2>&1; then
		"${git[@]}" ls-files -z --cached --others --exclude-standard |
			while IFS= read -r -d '' f; do
				# a tracked file deleted in the working tree is not copied
				if [ -e "$REPO/$f" ] || [ -L "$REPO/$f" ]; then printf '%s\0' "$f"; fi
			done |
			tar -C "$REPO" --null --no-recursion -T - -cf - | tar -C "$dest" -xf -
	else
		tar -C "$REPO" --exclude=./.git --exclude='*.o' --exclude='*.so' \
			--exclude='*.bc' --exclude=./tmp_check --exclude=./tmp_check_iso \
			--exclude=./results --exclude=./output_iso --exclude=./log \
			-cf - . | tar -C "$dest" -xf -
	fi
}

# own_work: $WORK readable by all and, when servers run as postgres, owned
# by it and reachable through its parent directory.
own_work() {
	local parent
	chmod 755 "$WORK"
	if [ "$RUN_USER" = postgres ]; then
		chown -R postgres:postgres "$WORK"
		parent=$(dirname "$WORK")
		"${AS_PG[@]}" test -x "$parent" || chmod o+x "$parent"
	fi
}

# build_install: make (output in $WORK/build.log, shown only on failure,
# then exit 1) and make install in $WORK/src, the current directory.
build_install() {
	if ! "${AS_PG[@]}" make -s -j"$(nproc)" PG_CONFIG="$PG_CONFIG" >"$WORK/build.log" 2>&1; then
		cat "$WORK/build.log"
		echo "$NAME: the extension does not build" >&2
		exit 1
	fi
	"${AS_ROOT[@]}" make -s install PG_CONFIG="$PG_CONFIG" >/dev/null
	echo "built and installed projcache"
}

# setup_work PREFIX: make $WORK (mktemp, named PREFIX.XXXXXX) with the
# socket directory $SOCK, copy the tree to $WORK/src, build and install it
# there (build_install), and leave the current directory there.
setup_work() {
	WORK=$(mktemp -d "${TMPDIR:-/tmp}/$1.XXXXXX")
	SOCK=$WORK/sock
	mkdir -p "$WORK/src" "$SOCK"
	copy_tree "$WORK/src"
	own_work
	cd "$WORK/src" || exit 1
	build_install
}

# start_cluster <CONF: initdb $DATA (its output shown only on failure, then
# exit 1), append a blank line and stdin to its postgresql.conf, and start it
# on $PORT with its socket in $SOCK and its log in $WORK/server.log.
start_cluster() {
	"${AS_PG[@]}" "$PGBIN/initdb" -D "$DATA" -A trust -U postgres --no-sync \
		</dev/null >"$WORK/initdb.log" 2>&1 ||
		{ cat "$WORK/initdb.log"; exit 1; }
	{ echo; cat; } >>"$DATA/postgresql.conf"
	"${AS_PG[@]}" "$PGBIN/pg_ctl" start -D "$DATA" -l "$WORK/server.log" -w -t 30 \
		-o "-p $PORT -k $SOCK" >/dev/null
	echo "server running: psql -p $PORT -h $SOCK -d postgres"
}

# pgrun ARGS...: psql on the cluster's database postgres, running a
# file, stdin or -c, quietly, stopping at the first error.
pgrun() {
	"${AS_PG[@]}" "$PGBIN/psql" -X -q -v ON_ERROR_STOP=1 \
		-p "$PORT" -h "$SOCK" -d postgres "$@"
}

# pgvalue SQL: the bare values SQL returns, fields separated by '|'.
pgvalue() {
	pgrun -At -c "$1"
}

# restart_cluster: stop the cluster (fast: a clean shutdown) and start it
# again on $PORT, its socket in $SOCK, appending to $WORK/server.log;
# waiting for both, its status is pg_ctl's.
restart_cluster() {
	"${AS_PG[@]}" "$PGBIN/pg_ctl" restart -D "$DATA" -m fast -l "$WORK/server.log" \
		-w -t 30 -o "-p $PORT -k $SOCK" >/dev/null
}

# stop_cluster: stop the cluster, waiting for it; its status is pg_ctl's.
stop_cluster() {
	cd / || return
	"${AS_PG[@]}" "$PGBIN/pg_ctl" stop -D "$DATA" -m fast -w -t 30 >/dev/null
}

# stop_cluster_at_exit RC: at exit, stop the cluster if it runs, after
# showing the end of its log if RC says the script failed.
# shellcheck disable=SC2317  # invoked from EXIT traps
stop_cluster_at_exit() {
	local rc=$1
	if [ -n "$DATA" ] && [ -f "$DATA/postmaster.pid" ]; then
		if [ "$rc" -ne 0 ] && [ -f "$WORK/server.log" ]; then
			echo "--- last lines of the server log ---"
			tail -n 30 "$WORK/server.log"
		fi
		"${AS_PG[@]}" "$PGBIN/pg_ctl" stop -D "$DATA" -m fast -w -t 30 >/dev/null 2>&1 ||
			"${AS_PG[@]}" "$PGBIN/pg_ctl" stop -D "$DATA" -m immediate -w -t 30 >/dev/null 2>&1 ||
			true
	fi
}

# shellcheck disable=SC2317  # invoked by the EXIT trap of cleanup_on_exit
_cleanup() {
	local rc=$?
	trap - EXIT INT TERM HUP
	cd /
	stop_cluster_at_exit "$rc"
	[ -n "$WORK" ] && rm -rf "$WORK"
	if [ "$rc" -ne 0 ]; then
		echo "$NAME FAILED (exit $rc); server stopped, temp dir removed" >&2
	fi
	exit "$rc"
}

# cleanup_on_exit: on any exit, error or signal, stop the cluster (if it
# runs) and remove $WORK; INT exits with status 130, TERM and HUP with 143.
cleanup_on_exit() {
	trap _cleanup EXIT
	trap 'exit 130' INT
	trap 'exit 143' TERM HUP
}
