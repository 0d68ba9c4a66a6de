#!/usr/bin/env bash
# install-deps.sh - install what projcache needs to build, test and demo.
#
# Debian/Ubuntu only.  Idempotent and fast: when every package is already
# installed (checked with dpkg -s) it touches neither the network nor apt.
# Otherwise it runs apt-get update + apt-get install for the missing ones.
# Runs as root; as any other user it goes through sudo.
#
# It also makes sure the unprivileged "postgres" OS user exists: PostgreSQL
# refuses to run as root, so the test and demo scripts run servers as it.
set -euo pipefail

PACKAGES=(
	postgresql-15             # server binaries: initdb, postgres, pg_ctl
	postgresql-server-dev-15  # pg_config, PGXS, pg_regress, pg_isolation_regress
	postgresql-client-15      # psql, PostgreSQL::Test::Cluster for TAP
	libcmocka-dev             # unit tests of the key cache's policy
	libipc-run-perl           # IPC::Run, needed by the TAP framework
	build-essential           # gcc, make
	perl                      # prove, TAP tests
	postgresql-plpython3-15   # the HTTP upstream's fetch function (plpython3u)
	prometheus-postgres-exporter  # the Prometheus TAP test scrapes it
	gnuplot-nox               # bench/run.sh draws its result
	curl                      # TAP tests talk HTTP to fixtures and the exporter
)

if [ "$(id -u)" -eq 0 ]; then
	as_root() { "$@"; }
else
	command -v sudo >/dev/null 2>&1 || {
		echo "install-deps.sh: not root and sudo is not available" >&2
		exit 1
	}
	as_root() { sudo "$@"; }
fi

missing=()
for pkg in "${PACKAGES[@]}"; do
	# "install ok installed" is the only state that counts as present.
	status=$(dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null || true)
	[ "$status" = "install ok installed" ] || missing+=("$pkg")
done

if [ "${#missing[@]}" -gt 0 ]; then
	echo "install-deps.sh: installing ${missing[*]}"
	as_root env DEBIAN_FRONTEND=noninteractive apt-get update -q
	as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}"
fi

# The Debian postgresql package creates this user; make sure it exists anyway.
if ! getent passwd postgres >/dev/null; then
	echo "install-deps.sh: creating OS user postgres"
	as_root useradd --system --user-group --create-home \
		--home-dir /var/lib/postgresql --shell /bin/bash postgres
fi

exit 0
