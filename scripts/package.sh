#!/usr/bin/env bash
# package.sh - build the Debian package postgresql-15-projcache and check it
# as a user would install it.
#
#     sudo bash scripts/package.sh
#
# Runs as root (it installs and removes a package); Debian bookworm.
#
#  1. Installs what it needs if missing: scripts/install-deps.sh's packages,
#     and the build dependencies of debian/control (debhelper,
#     postgresql-server-dev-all for pg_buildext, dpkg-dev).
#  2. Copies this tree into a temp dir (tracked and untracked, not ignored
#     files, as scripts/lib.sh's copy_tree does) and builds the binary
#     package there as the unprivileged "postgres" OS user:
#     dpkg-buildpackage -us -uc -b.  The tests are not run at build time
#     (they need a server with shared_preload_libraries, see debian/rules).
#  3. Removes the source copy, so that nothing can come from it, then, holding
#     /tmp/pcinstall.lock for the whole check (take it with flock around
#     any concurrent "make install" into the same PostgreSQL):
#     - moves aside the projcache files a "make install" put into
#       PostgreSQL 15's pkglibdir (projcache.so, bitcode) and
#       sharedir/extension (projcache*), keeping them in the temp dir;
#     - dpkg -i the .deb, and checks with dpkg -S that projcache.so and
#       projcache.control now belong to postgresql-15-projcache;
#     - starts a throwaway cluster as "postgres" (initdb in the temp dir,
#       shared_preload_libraries = 'projcache', port 54360, socket in the
#       temp dir), CREATE EXTENSION projcache, a one-row upstream table and
#       its fetch function as projcache.fetch_function, and reads the key
#       'acme' with projcache.get('acme', '5s');
#     - prints the package's name and version (dpkg-query -W), the
#       extension's version and the value read; stops the cluster;
#     - removes the package again (dpkg --purge) and puts the files of the
#       previous "make install" back, so the machine is as before.
#
# The test suites (scripts/test.sh, make installcheck) use the extension
# installed with "make install", not this package: the package is removed at
# the end, and the make-install files it replaced are put back byte for byte
# (no rebuild; to install the current tree instead, run "flock
# /tmp/pcinstall.lock make -s install" in it afterwards).  While the check
# runs (about 10 s, under the lock), PostgreSQL 15's projcache is the
# package's build of this tree, for every server started meanwhile.
#
# On exit, error or Ctrl-C, the cluster is stopped, the package removed if
# this script installed it, the make-install files restored and the temp
# dir removed.  The built .deb is deleted with the temp dir; set
# PROJCACHE_DEB_DIR=/some/dir to keep a copy of the .deb files there.
set -euo pipefail

# shellcheck source=SCRIPTDIR/lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
NAME=package.sh
PORT=54360
PKG=postgresql-15-projcache
LOCK=/tmp/pcinstall.lock
BUILD_DEPS=(debhelper postgresql-server-dev-all dpkg-dev)
WORK=
DATA=
SOCK=
INSTALLED=        # set once this script ran dpkg -i
SAVED=            # the tar of the make-install files, once moved aside

if [ "$(id -u)" -ne 0 ]; then
	echo "$NAME: run it as root: sudo bash scripts/package.sh" >&2
	exit 1
fi

# ------------------------------------------------------------ cleanup
# Like lib.sh's _cleanup (stop the cluster, remove $WORK, say FAILED), plus
# the package: remove it if this script installed it, and put the
# make-install files back.  The lock is still held here (fd 9) and goes with
# the process.
# shellcheck disable=SC2317  # invoked by the EXIT trap
cleanup() {
	local rc=$?
	set +e
	trap - EXIT INT TERM HUP
	cd /
	stop_cluster_at_exit "$rc"
	if [ -n "$INSTALLED" ]; then
		dpkg --purge "$PKG" >/dev/null 2>&1 ||
			echo "$NAME: could not remove $PKG; remove it with: dpkg -r $PKG" >&2
	fi
	if [ -n "$SAVED" ] && [ -f "$SAVED" ]; then
		tar -C / -xpf "$SAVED" ||
			echo "$NAME: could not restore the make-install files; run make install" >&2
	fi
	[ -n "$WORK" ] && rm -rf "$WORK"
	if [ "$rc" -ne 0 ]; then
		echo "$NAME FAILED (exit $rc); server stopped, package removed, temp dir removed" >&2
	fi
	exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM HUP

step() { printf '\n=== %s\n' "$*"; }

# ------------------------------------------------------------ dependencies
step "dependencies"
bash "$REPO/scripts/install-deps.sh"
missing=()
for p in "${BUILD_DEPS[@]}"; do
	[ "$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null || true)" = "install ok installed" ] ||
		missing+=("$p")
done
if [ "${#missing[@]}" -gt 0 ]; then
	echo "installing ${missing[*]}"
	DEBIAN_FRONTEND=noninteractive apt-get update -q
	DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}"
fi
echo "build dependencies present: ${BUILD_DEPS[*]}"

# An installed package would be removed at the end: refuse instead.
case $(dpkg-query -W -f='${db:Status-Status}' "$PKG" 2>/dev/null || true) in
'' | not-installed | config-files) ;;
*)
	echo "$NAME: $PKG is already installed; remove it first (dpkg -r $PKG)" >&2
	exit 1
	;;
esac

# ------------------------------------------------------------ build
step "build: dpkg-buildpackage -us -uc -b in a copy of the tree, as $RUN_USER"
WORK=$(mktemp -d "${TMPDIR:-/tmp}/projcache-package.XXXXXX")
DATA=$WORK/data
SOCK=$WORK/sock
mkdir -p "$WORK/projcache" "$SOCK"
copy_tree "$WORK/projcache"
own_work
if ! (cd "$WORK/projcache" && "${AS_PG[@]}" dpkg-buildpackage -us -uc -b) \
	>"$WORK/build.log" 2>&1; then
	tail -n 60 "$WORK/build.log"
	echo "$NAME: dpkg-buildpackage failed (last lines above)" >&2
	exit 1
fi
version=$(cd "$WORK/projcache" && dpkg-parsechangelog -S Version)
DEB=$WORK/${PKG}_${version}_$(dpkg --print-architecture).deb
[ -f "$DEB" ] || { ls -l "$WORK"; echo "$NAME: $DEB was not built" >&2; exit 1; }
echo "built $(basename "$DEB")"
dpkg-deb -f "$DEB" Package Version Depends
if [ -n "${PROJCACHE_DEB_DIR:-}" ]; then
	mkdir -p "$PROJCACHE_DEB_DIR"
	cp "$WORK"/*.deb "$PROJCACHE_DEB_DIR"/
	echo "copied the .deb files to $PROJCACHE_DEB_DIR"
fi

# The source copy goes: the check must find everything in the package.
rm -rf "$WORK/projcache"
cd /

# ------------------------------------------------------------ install
step "install: replace the make-install files with the package (holding $LOCK)"
exec 9>>"$LOCK"
if ! flock -n 9; then
	echo "waiting for $LOCK (a make install is running)"
	flock -w 600 9 || { echo "$NAME: $LOCK still taken after 600 s" >&2; exit 1; }
fi

PKGLIBDIR=$("$PG_CONFIG" --pkglibdir)
EXTDIR=$("$PG_CONFIG" --sharedir)/extension
old=()
for f in "$PKGLIBDIR/projcache.so" "$PKGLIBDIR/bitcode/projcache" \
	"$PKGLIBDIR/bitcode/projcache.index.bc" "$EXTDIR"/projcache*; do
	if [ -e "$f" ]; then old+=("${f#/}"); fi
done
if [ "${#old[@]}" -gt 0 ]; then
	echo "moving aside the files of a previous make install:"
	printf '  /%s\n' "${old[@]}"
	tar -C / -cpf "$WORK/make-install.tar" "${old[@]}"
	SAVED=$WORK/make-install.tar
	for f in "${old[@]}"; do rm -rf "/${f:?}"; done
else
	echo "no projcache files from a make install"
fi

INSTALLED=1
dpkg -i "$DEB" >"$WORK/dpkg.log" 2>&1 || { cat "$WORK/dpkg.log"; exit 1; }
echo "dpkg -i $(basename "$DEB")"
for f in "$PKGLIBDIR/projcache.so" "$EXTDIR/projcache.control"; do
	owner=$(dpkg -S "$f" 2>/dev/null | cut -d: -f1 || true)
	if [ "$owner" != "$PKG" ]; then
		echo "$NAME: dpkg -S $f gives '${owner:-no package}', expected $PKG" >&2
		exit 1
	fi
	echo "dpkg -S: $f belongs to $owner"
done

# ------------------------------------------------------------ check
step "check: throwaway cluster on port $PORT with the packaged projcache preloaded"
# fd 9 (the lock) is not handed to the server.
start_cluster 9>&- <<EOF
# projcache package check
listen_addresses = ''
shared_preload_libraries = 'projcache'
projcache.database = 'postgres'
projcache.fetch_function = 'public.fetch_configs'
EOF
pgrun <<'SQL'
CREATE EXTENSION projcache;

-- The upstream: one config per project key.
CREATE TABLE public.project_configs (
    key      text PRIMARY KEY,
    config   jsonb NOT NULL,
    revision text NOT NULL
);
INSERT INTO public.project_configs
    VALUES ('acme', '{"plan": "pro", "rate_limit": 100}', 'r1');

-- The fetch function projcache.fetch_function names (README: The fetch function).
CREATE FUNCTION public.fetch_configs(keys text[], revisions text[])
RETURNS TABLE(key text, state text, revision text, config jsonb)
LANGUAGE sql STABLE AS $$
    SELECT c.key,
           CASE WHEN c.revision = r.rev THEN 'not_modified' ELSE 'enabled' END,
           c.revision,
           c.config
      FROM unnest(keys, revisions) AS r(key, rev)
      JOIN public.project_configs c USING (key)
$$;
SQL
echo "CREATE EXTENSION projcache; upstream table and public.fetch_configs created"
extversion=$(pgvalue "SELECT extversion FROM pg_extension WHERE extname = 'projcache'")
value=$(pgvalue "SELECT projcache.get('acme', '5s')")
echo "projcache.fetch_function = $(pgvalue "SHOW projcache.fetch_function")"
echo "SELECT projcache.get('acme', '5s') -> ${value:-NULL}"
if [ -z "$value" ]; then
	echo "$NAME: projcache.get('acme', '5s') returned NULL; expected acme's config" >&2
	exit 1
fi
stop_cluster

# ------------------------------------------------------------ remove
step "remove: dpkg --purge $PKG, restore the make-install files"
pkg_line=$(dpkg-query -W "$PKG")
dpkg --purge "$PKG" >"$WORK/dpkg.log" 2>&1 || { cat "$WORK/dpkg.log"; exit 1; }
INSTALLED=
if [ -n "$SAVED" ]; then
	tar -C / -xpf "$SAVED"
	SAVED=
	echo "package removed; the previous make-install files are back"
else
	echo "package removed"
fi
flock -u 9

step "result"
printf 'package:   %s\n' "$(printf '%s' "$pkg_line" | tr '\t' ' ')"
printf 'extension: projcache %s\n' "$extversion"
printf "get:       projcache.get('acme', '5s') = %s\n" "$value"
echo "$NAME: OK"
