#!/usr/bin/env bash
# pgindent.sh - lay out projcache's C code as PostgreSQL's pgindent does.
#
#     sudo bash scripts/pgindent.sh            # prints the diff pgindent
#                                              # would make; exit 1 if any
#     sudo bash scripts/pgindent.sh --write    # makes it
#     sudo bash scripts/pgindent.sh --list     # the files it covers
#     bash scripts/pgindent.sh --typedefs      # the typedef names of those
#                                              # files missing from
#                                              # tools/typedefs.list; exit 1
#                                              # if any
#
# The files are src/*.c, src/*.h and test/unit/*.c.  The tools are
# PostgreSQL 18's own (pgindent, its typedefs list and pg_bsd_indent, which
# scripts/pgmajor.sh builds beside the server and keeps), so that every
# machine lays the code out the same way.  The typedefs list is
# PostgreSQL's with tools/typedefs.list, projcache's own type names, added:
# without a type's name, pgindent takes a declaration of it for an
# expression and spaces it as one, and the check passes code laid out wrong.
# A new typedef in src/ goes into tools/typedefs.list; --typedefs (which
# needs no PostgreSQL) finds those that did not (tools/typedef-names.pl).
#
# scripts/test.sh runs the check as one test per file ("pgindent" in its
# summary), and --typedefs as one more ("typedefs").  Runs as root (as any other user, pgmajor.sh goes through sudo).
set -euo pipefail

# shellcheck source=SCRIPTDIR/lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

MODE=${1:---diff}
case "$MODE" in
	--diff | --write | --list | --typedefs) ;;
	*)
		echo "usage: $0 [--diff | --write | --list | --typedefs]" >&2
		exit 2
		;;
esac

cd "$REPO"
FILES=(src/*.c src/*.h test/unit/*.c)
if [ "$MODE" = --list ]; then
	printf '%s\n' "${FILES[@]}"
	exit 0
fi
if [ "$MODE" = --typedefs ]; then
	missing=$(LC_ALL=C comm -23 <(perl tools/typedef-names.pl "${FILES[@]}" | LC_ALL=C sort -u) \
		<(grep -v '^#' tools/typedefs.list | LC_ALL=C sort -u))
	if [ -n "$missing" ]; then
		printf 'not in tools/typedefs.list: %s\n' $missing
		exit 1
	fi
	exit 0
fi

bin=$(bash "$REPO/scripts/pgmajor.sh" server 18)
tools=$bin/../share/pgindent
for f in "$tools/pgindent" "$tools/typedefs.list" "$bin/pg_bsd_indent"; do
	[ -e "$f" ] || {
		echo "pgindent.sh: $f missing (a build made by an older pgmajor.sh?)" >&2
		exit 1
	}
done

typedefs=$(mktemp "${TMPDIR:-/tmp}/projcache-typedefs.XXXXXX")
trap 'rm -f "$typedefs"' EXIT
grep -hv '^#' "$tools/typedefs.list" tools/typedefs.list | sort -u >"$typedefs"

run() {
	perl "$tools/pgindent" --indent="$bin/pg_bsd_indent" \
		--typedefs="$typedefs" "$@" "${FILES[@]}"
}

if [ "$MODE" = --write ]; then
	run
	exit 0
fi
out=$(run --diff)
if [ -n "$out" ]; then
	printf '%s\n' "$out"
	exit 1
fi
