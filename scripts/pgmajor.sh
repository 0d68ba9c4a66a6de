#!/usr/bin/env bash
# pgmajor.sh - provide a PostgreSQL major version to build and test against.
#
#     bash scripts/pgmajor.sh server  MAJOR   # a full install (server, contrib,
#                                            # PGXS, pg_regress, TAP modules)
#     bash scripts/pgmajor.sh headers MAJOR   # PGXS and server headers only
#
# Prints one line on stdout: the directory holding that major's pg_config
# (and, for "server", initdb, postgres, psql, ...; for unpacked headers
# only a stand-in pg_config).  Progress goes to stderr.
# Runs as root (as any other user it goes through sudo).
#
# Where it comes from, first that applies:
#   1. this machine's apt has postgresql-server-dev-MAJOR (Debian's own for
#      its release's major, or the PostgreSQL project's apt repository): those
#      packages are installed and /usr/lib/postgresql/MAJOR/bin is printed;
#   2. "server": Debian's source package postgresql-MAJOR from the Debian
#      release that ships it (trixie for 17, unstable otherwise) is fetched (apt-get source; PostgreSQL's own source, without Debian's
#      packaging patches) and built with --enable-cassert
#      --enable-debug --enable-tap-tests --with-python, with the contrib
#      modules the suite uses, under $PROJCACHE_PG_CACHE/pg-MAJOR;
#   3. "headers": Debian's postgresql-server-dev-MAJOR .deb (from the Debian
#      release that ships MAJOR) is downloaded and unpacked with dpkg -x under
#      $PROJCACHE_PG_CACHE/pg-MAJOR-dev; it is never installed.
# What 2 and 3 make is kept ($PROJCACHE_PG_CACHE, /var/cache/projcache by
# default): a second call finds the stamp file and returns at once.
#
# The Debian releases other than this machine's are reached through a
# separate apt configuration under $PROJCACHE_PG_CACHE/apt (its own sources
# list, package lists and archive cache), never through /etc/apt: this
# machine's "apt-get install" keeps getting its own release's packages.  The
# mirror is the one this machine's apt sources already use for Debian.
#
# Environment: PROJCACHE_PG_CACHE  where builds and unpacked packages are kept
#              PROJCACHE_PG_JOBS    make -j for the server build (nproc)
#              PROJCACHE_PG_SOURCE  "build" skips step 1 (always build/unpack)
set -euo pipefail

CACHE=${PROJCACHE_PG_CACHE:-/var/cache/projcache}
JOBS=${PROJCACHE_PG_JOBS:-$(nproc)}
# Bump when the configure options or the set of installed parts change, so
# that a kept build made the old way is rebuilt (recipe 2: pgindent and
# pg_bsd_indent kept beside the server).
BUILD_RECIPE=2

# Which Debian release carries each major's packages (source for "server",
# the binary postgresql-server-dev-MAJOR for "headers").
suite_for() {
	case "$1:$2" in
		*:17) echo trixie ;; # unstable has moved on to 18 only
		server:*) echo unstable ;;
		headers:16) echo "" ;; # no Debian release ships 16
		headers:*) echo unstable ;;
	esac
}

say() { printf 'pgmajor.sh: %s\n' "$*" >&2; }
die() { say "$*"; exit 1; }

if [ "$(id -u)" -eq 0 ]; then
	as_root() { "$@"; }
else
	command -v sudo >/dev/null 2>&1 || die "not root and sudo is not available"
	as_root() { sudo "$@"; }
fi

[ $# -eq 2 ] || die "usage: pgmajor.sh server|headers MAJOR"
KIND=$1
MAJOR=$2
case "$KIND" in server | headers) ;; *) die "unknown kind '$KIND'" ;; esac
[[ "$MAJOR" =~ ^[0-9]+$ ]] || die "MAJOR must be a number, not '$MAJOR'"

# ------------------------------------------------------------ 1. this apt
# apt_has PKG: this machine's apt offers PKG (a candidate version).
apt_has() {
	local cand
	cand=$(apt-cache policy "$1" 2>/dev/null | awk '/Candidate:/ { print $2 }')
	[ -n "$cand" ] && [ "$cand" != "(none)" ]
}

installed() {
	[ "$(dpkg-query -W -f='${Status}' "$1" 2>/dev/null || true)" = "install ok installed" ]
}

if [ "${PROJCACHE_PG_SOURCE:-}" != build ]; then
	pkgs=("postgresql-server-dev-$MAJOR")
	[ "$KIND" = server ] && pkgs+=("postgresql-$MAJOR" "postgresql-client-$MAJOR" "postgresql-plpython3-$MAJOR")
	missing=()
	for p in "${pkgs[@]}"; do installed "$p" || missing+=("$p"); done
	if [ "${#missing[@]}" -eq 0 ]; then
		echo "/usr/lib/postgresql/$MAJOR/bin"
		exit 0
	fi
	if apt_has "postgresql-server-dev-$MAJOR"; then
		say "installing ${missing[*]} from this machine's apt"
		as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -q \
			--no-install-recommends "${missing[@]}" >&2
		echo "/usr/lib/postgresql/$MAJOR/bin"
		exit 0
	fi
fi

# ------------------------------------------------------------ the other apt
APTDIR=$CACHE/apt
# debian_mirror: the URI this machine's apt uses for the Debian archive
# (not its security archive), from deb822 .sources files or one-line lists.
debian_mirror() {
	{
		cat /etc/apt/sources.list.d/*.sources 2>/dev/null || true
		echo
	} | awk '
		BEGIN { RS = ""; FS = "\n" }
		{
			uri = ""; suites = 0; key = 0
			for (i = 1; i <= NF; i++) {
				if ($i ~ /^URIs:/) { split($i, a, /[ \t]+/); uri = a[2] }
				if ($i ~ /^Suites:/ && $i !~ /-security/) suites = 1
				if ($i ~ /^Signed-By:.*debian-archive/) key = 1
			}
			if (suites && key && uri != "") print uri
		}'
	{ cat /etc/apt/sources.list /etc/apt/sources.list.d/*.list 2>/dev/null || true; } |
		awk '$1 == "deb" && $0 !~ /-security/ && $0 ~ /[ \t]main([ \t]|$)/ {
			for (i = 2; i <= NF; i++) if ($i ~ /^[a-z]+:\/\//) { print $i; next }
		}'
}

# other_apt SUITE ARGS...: apt-get with a private configuration whose only
# source is SUITE of the Debian mirror (deb and deb-src).
other_apt() {
	local suite=$1 mirror
	shift
	mirror=$(debian_mirror | head -n 1 || true)
	[ -n "$mirror" ] || die "cannot tell this machine's Debian mirror from /etc/apt"
	mkdir -p "$APTDIR/$suite/lists/partial" "$APTDIR/$suite/archives/partial" "$APTDIR/$suite/parts.d"
	cat >"$APTDIR/$suite/sources.list" <<-EOF
		deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] $mirror $suite main
		deb-src [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] $mirror $suite main
	EOF
	apt-get -q \
		-o Dir::Etc::SourceList="$APTDIR/$suite/sources.list" \
		-o Dir::Etc::SourceParts="$APTDIR/$suite/parts.d" \
		-o Dir::Etc::Preferences=/dev/null \
		-o Dir::Etc::PreferencesParts="$APTDIR/$suite/parts.d" \
		-o Dir::State::Lists="$APTDIR/$suite/lists" \
		-o Dir::Cache="$APTDIR/$suite" \
		-o Dir::Cache::Archives="$APTDIR/$suite/archives" \
		-o APT::Get::List-Cleanup=0 \
		-o Acquire::Languages=none \
		-o APT::Sandbox::User=root \
		"$@"
}

# other_apt_update SUITE: refresh its lists, at most once in six hours.
other_apt_update() {
	local stamp=$APTDIR/$1/updated
	if [ -z "$(find "$stamp" -mmin -360 2>/dev/null)" ]; then
		say "apt-get update for Debian $1 (private apt configuration)"
		other_apt "$1" update >&2
		touch "$stamp"
	fi
}

# ------------------------------------------------------------ 3. headers
# write_pg_config DEST MAJOR: a pg_config script for Debian's layout of
# MAJOR's client and -dev packages unpacked under DEST; it answers what
# PGXS asks (one option per call, as PGXS calls it).
write_pg_config() {
	local d=$1 m=$2 multiarch version
	multiarch=$(gcc -print-multiarch 2>/dev/null || dpkg-architecture -qDEB_HOST_MULTIARCH)
	version=$(sed -n 's/^VERSION = //p' "$d/usr/lib/postgresql/$m/lib/pgxs/src/Makefile.global")
	cat <<-EOF
		#!/bin/sh
		# pg_config for PostgreSQL $m's packages unpacked by scripts/pgmajor.sh
		case "\$1" in
		--bindir) echo "$d/usr/lib/postgresql/$m/bin" ;;
		--includedir | --pkgincludedir) echo "$d/usr/include/postgresql" ;;
		--includedir-server) echo "$d/usr/include/postgresql/$m/server" ;;
		--libdir) echo "$d/usr/lib/$multiarch" ;;
		--pkglibdir) echo "$d/usr/lib/postgresql/$m/lib" ;;
		--sharedir) echo "$d/usr/share/postgresql/$m" ;;
		--localedir) echo "$d/usr/share/locale" ;;
		--mandir) echo "$d/usr/share/postgresql/$m/man" ;;
		--docdir | --htmldir) echo "$d/usr/share/doc/postgresql-doc-$m" ;;
		--sysconfdir) echo "$d/etc/postgresql-common" ;;
		--pgxs) echo "$d/usr/lib/postgresql/$m/lib/pgxs/src/makefiles/pgxs.mk" ;;
		--version) echo "PostgreSQL $version" ;;
		*) echo "pg_config.projcache: option \$1 is not known here" >&2; exit 1 ;;
		esac
	EOF
}

# host_libc_config PG_CONFIG_H: the headers were configured for their own
# release's C library; what this machine's lacks is marked missing, so that
# port.h declares PostgreSQL's own (bookworm's glibc has no strlcpy, which
# trixie's has).  Only the compile check uses these headers.
host_libc_config() {
	local f
	for f in strlcpy strlcat; do
		if ! printf '#include <string.h>\nvoid *f(void) { return (void *) %s; }\n' "$f" |
			gcc -x c -Werror=implicit-function-declaration -c -o /dev/null - 2>/dev/null; then
			sed -i -e "s/^#define HAVE_DECL_${f^^} 1\$/#define HAVE_DECL_${f^^} 0/" \
				-e "s/^#define HAVE_${f^^} 1\$/\/* #undef HAVE_${f^^} *\//" "$1"
		fi
	done
}

if [ "$KIND" = headers ]; then
	dest=$CACHE/pg-$MAJOR-dev
	bindir=$dest/bin # the stand-in pg_config's only
	if [ -f "$dest/.projcache-unpacked" ] && [ -x "$bindir/pg_config" ]; then
		echo "$bindir"
		exit 0
	fi
	suite=$(suite_for headers "$MAJOR")
	[ -n "$suite" ] || die "no Debian release ships postgresql-server-dev-$MAJOR"
	as_root mkdir -p "$CACHE"
	other_apt_update "$suite"
	tmp=$(mktemp -d "$CACHE/.dl.XXXXXX")
	chmod 755 "$tmp" # apt's download user writes there
	# Debian puts pg_config and PGXS in the client package, the server's
	# headers in the -dev one.
	(cd "$tmp" && other_apt "$suite" download "postgresql-server-dev-$MAJOR" \
		"postgresql-client-$MAJOR" >&2)
	rm -rf "$dest"
	mkdir -p "$dest"
	for deb in "$tmp"/*.deb; do dpkg -x "$deb" "$dest"; done
	debs=$(cd "$tmp" && ls -- *.deb)
	mkdir -p "$bindir"
	rm -rf "$tmp"
	# The packaged pg_config may need a newer C library than this machine's
	# (it does for trixie's on bookworm), and would report the paths it was
	# built for: a stand-in answers PGXS's questions with the unpacked tree.
	host_libc_config "$dest/usr/include/postgresql/$MAJOR/server/pg_config.h"
	write_pg_config "$dest" "$MAJOR" >"$bindir/pg_config"
	chmod 755 "$bindir/pg_config"
	printf '%s\n' "$debs" >"$dest/.projcache-unpacked"
	say "unpacked $(tr '\n' ' ' <"$dest/.projcache-unpacked")in $dest"
	echo "$bindir"
	exit 0
fi

# ------------------------------------------------------------ 2. server
prefix=$CACHE/pg-$MAJOR
stamp=$prefix/.projcache-built
# A build by a later recipe serves too: a recipe only adds, and an older
# tree (a branch, a worktree) sharing the cache must not rebuild it.
built_recipe=$(sed -n 's/^recipe \([0-9][0-9]*\)$/\1/p' "$stamp" 2>/dev/null || true)
if [ -n "$built_recipe" ] && [ "$built_recipe" -ge "$BUILD_RECIPE" ] && [ -x "$prefix/bin/postgres" ]; then
	echo "$prefix/bin"
	exit 0
fi

# What building needs, from this machine's own apt.
BUILD_DEPS=(build-essential bison flex libreadline-dev zlib1g-dev libicu-dev
	libssl-dev python3-dev pkg-config libipc-run-perl perl dpkg-dev)
missing=()
for p in "${BUILD_DEPS[@]}"; do installed "$p" || missing+=("$p"); done
if [ "${#missing[@]}" -gt 0 ]; then
	say "installing build dependencies: ${missing[*]}"
	as_root env DEBIAN_FRONTEND=noninteractive apt-get update -q >&2
	as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -q \
		--no-install-recommends "${missing[@]}" >&2
fi

suite=$(suite_for server "$MAJOR")
as_root mkdir -p "$CACHE"
other_apt_update "$suite"
srcroot=$CACHE/src-$MAJOR
rm -rf "$srcroot"
mkdir -p "$srcroot"
say "apt-get source postgresql-$MAJOR (Debian $suite)"
# Unpacked without Debian's patches: they lay files out for Debian's
# packages (the library directory is /usr/lib/postgresql/MAJOR/lib whatever
# the prefix), which a build under its own prefix must not.
#
# The mirror can lag behind its own index: the source package's files may be
# missing (404) for the version the index names while the point releases
# before it are there (seen for trixie's 17.12).  Then the newest of the
# three point releases below it that the mirror has is taken, straight from
# the pool, its files checked against the checksums of its .dsc by
# dpkg-source.
# pool_source VERSION: download that version's .dsc and files from the pool.
pool_source() {
	local v=$1 mirror pool f
	mirror=$(debian_mirror | head -n 1 || true)
	pool=${mirror%/}/pool/main/p/postgresql-$MAJOR
	curl -fsS -o "postgresql-${MAJOR}_$v.dsc" "$pool/postgresql-${MAJOR}_$v.dsc" 2>/dev/null || return 1
	for f in $(awk '/^Files:/ { on = 1; next } /^[^ ]/ { on = 0 } on { print $3 }' \
		"postgresql-${MAJOR}_$v.dsc"); do
		curl -fsS -o "$f" "$pool/$f" || return 1
	done
}
fetch_source() {
	local want minor v i
	other_apt "$suite" source --download-only "postgresql-$MAJOR" >&2 && return 0
	want=$(other_apt "$suite" source --print-uris "postgresql-$MAJOR" 2>/dev/null |
		sed -n "s/^'[^']*' postgresql-${MAJOR}_\\(.*\\)\\.dsc .*/\\1/p")
	[[ "$want" =~ ^$MAJOR\.([0-9]+)(-.*)$ ]] || return 1
	minor=${BASH_REMATCH[1]}
	for i in 1 2 3; do
		[ "$minor" -gt "$i" ] || break
		v=$MAJOR.$((minor - i))${BASH_REMATCH[2]}
		rm -f ./*.dsc ./*.tar.*
		if pool_source "$v"; then
			say "the mirror has no files for $want; took $v from its pool"
			return 0
		fi
	done
	return 1
}
(cd "$srcroot" && fetch_source && dpkg-source --skip-patches -x ./*.dsc >&2)
srcdir=$(find "$srcroot" -mindepth 1 -maxdepth 1 -type d -name "postgresql-$MAJOR-*" | head -n 1)
[ -n "$srcdir" ] || die "apt-get source left no postgresql-$MAJOR-* directory in $srcroot"
version=$(basename "$srcdir")

# Built by an unprivileged user when root: the regression machinery that
# some configure checks and make steps run refuse root, and a build tree
# owned by root is what installs go wrong with.
if [ "$(id -u)" -eq 0 ]; then
	getent passwd postgres >/dev/null || die "OS user postgres missing (scripts/install-deps.sh makes it)"
	chown -R postgres:postgres "$srcroot"
	as_builder() { runuser -u postgres -- "$@"; }
else
	as_builder() { "$@"; }
fi

# install_pgindent SRCDIR: the major's own pgindent, its typedefs list and
# pg_bsd_indent (in the source tree since 16), for scripts/pgindent.sh.
install_pgindent() {
	[ -d "$1/src/tools/pg_bsd_indent" ] || return 0
	as_builder make -s -C "$1/src/tools/pg_bsd_indent" install &&
		as_builder mkdir -p "$prefix/share/pgindent" &&
		as_builder cp "$1/src/tools/pgindent/pgindent" \
			"$1/src/tools/pgindent/typedefs.list" "$prefix/share/pgindent/"
}

# The stamp is written last: a build cut short is redone from scratch.
rm -rf "$prefix"
mkdir -p "$prefix"
[ "$(id -u)" -eq 0 ] && chown postgres:postgres "$prefix"
log=$srcroot/build.log
say "building $version into $prefix (log: $log); this takes a while"
t0=$SECONDS
# The contrib modules the suite creates (dblink, postgres_fdw, pg_walinspect,
# plpython3u) and what PGXS installcheck runs: pg_regress, the isolation
# tester and the TAP modules (installed by --enable-tap-tests).
if ! (
	cd "$srcdir" &&
		as_builder ./configure --prefix="$prefix" \
			--enable-cassert --enable-debug --enable-tap-tests \
			--with-python PYTHON=python3 --with-openssl --with-icu \
			CFLAGS="-O2 -g" &&
		as_builder make -j"$JOBS" -s &&
		as_builder make -j"$JOBS" -s -C contrib/dblink &&
		as_builder make -j"$JOBS" -s -C contrib/postgres_fdw &&
		as_builder make -j"$JOBS" -s -C contrib/pg_walinspect &&
		as_builder make -j"$JOBS" -s -C src/test/isolation &&
		as_builder make -s install &&
		as_builder make -s -C contrib/dblink install &&
		as_builder make -s -C contrib/postgres_fdw install &&
		as_builder make -s -C contrib/pg_walinspect install &&
		as_builder make -s -C src/pl/plpython install &&
		as_builder make -s -C src/test/regress install &&
		as_builder make -s -C src/test/isolation install &&
		install_pgindent "$srcdir"
) >"$log" 2>&1; then
	tail -n 40 "$log" >&2
	die "building $version failed (log: $log)"
fi
printf 'recipe %s\n%s\nbuilt in %ds\n' "$BUILD_RECIPE" "$version" $((SECONDS - t0)) >"$stamp"
# The build tree is not needed any more; its source package is kept.
rm -rf "$srcdir"
say "built $version in $((SECONDS - t0))s"
echo "$prefix/bin"
