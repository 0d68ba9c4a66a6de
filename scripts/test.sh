#!/usr/bin/env bash
# test.sh - run every projcache test: unit, pg_regress, isolation and TAP,
# on each PostgreSQL major CI covers.
#
#     sudo bash scripts/test.sh              # 18, 17 and 15
#     sudo PG_MAJOR=18 bash scripts/test.sh  # one major only
#
# The source tree (tracked files plus uncommitted working files) is copied to
# a fresh /tmp/projcache-test.XXXXXX (one copy per major), built there as the
# unprivileged "postgres" OS user (PostgreSQL refuses to run as root) with
# PROJCACHE_WERROR=1 (a warning fails the build), installed as root ("make
# installcheck" temp instances load the *installed* library), and then each
# suite is run in turn, continuing after a failure:
#
#   unit        make unittest                          (cmocka, no server)
#
# then, on each major (labelled "@18", "@17", "@15"), the majors side by
# side:
#
#   pg_regress  make installcheck ISOLATION= TAP_TESTS=
#   isolation   make installcheck REGRESS= TAP_TESTS=  (if the Makefile has specs)
#   TAP         make installcheck REGRESS= ISOLATION=  (if test/t/*.pl exist)
#
# and last, when 18 is in the plan, the layout check (scripts/pgindent.sh),
# each file one test, and the check that tools/typedefs.list names every
# typedef.  (A compile check against a major's headers alone, without its
# server, is still here for a major in COMPILE_MAJORS; none is now.)
#
# Which major runs how: 18 and 17 are servers built from Debian's source
# packages with --enable-cassert (scripts/pgmajor.sh, built once per
# machine and kept), so the server's assertions and projcache's own
# (USE_ASSERT_CHECKING comes with the server's headers) run there; 15 is
# Debian's release build, with projcache built as released.  All are
# installed before any suite runs, as the pg_upgrade test on 18 and on 17
# upgrades from 15 (PROJCACHE_UPGRADE_FROM).
#
# Each suite's output is shown as it runs and kept in <tmpdir>/logs/.  The
# last line printed is always "N passed, M failed" (totals over all suites);
# the exit status is 0 only when M is 0 and at least one test ran.  A build
# failure, a crash, a timeout or anything unexpected counts as a failure.
# The temp dir is removed on success and kept (path printed) on failure.
# No server is left running.
#
# Environment: PG_MAJOR               run on this major only (no compile check)
#              PROJCACHE_PGBIN        15's binaries (or PG_MAJOR's), instead
#                                     of Debian's package
#              PROJCACHE_TEST_BUDGET  overall time limit in seconds (3600),
#                                     building PostgreSQL 18 included
#              PROJCACHE_KEEP=1       keep the temp dir even on success
set -uo pipefail

# lib.sh: REPO, PGBIN, PG_CONFIG, RUN_USER, AS_PG, AS_ROOT, copy_tree and
# own_work; it also unsets the libpq variables (PGHOST, ...) of the caller's
# environment, so that they cannot leak into test instances.
# shellcheck source=SCRIPTDIR/lib.sh
PG_MAJOR_SET=${PG_MAJOR:-}
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
BUDGET=${PROJCACHE_TEST_BUDGET:-3600}
# The plan: majors whose suites run, and the headers-only one.
if [ -n "${PG_MAJOR_SET:-}" ]; then
	SUITE_MAJORS=("$PG_MAJOR")
	COMPILE_MAJORS=()
else
	SUITE_MAJORS=(18 17 15)
	COMPILE_MAJORS=()
fi
START=$SECONDS

PASSED=0
FAILED=0
SUMMARY=()
WORK=
LOGS=
STEP_PID=
MAJOR_PIDS=()

# Settings from the caller's environment must not leak into the unit tests
# (lib.sh has unset the libpq ones).
unset CMOCKA_MESSAGE_OUTPUT CMOCKA_XML_FILE

say() { printf '==> %s\n' "$*"; }

# summary_add SUITE PASS FAIL NOTE: add one suite's result to the totals.
summary_add() {
	PASSED=$((PASSED + $2))
	FAILED=$((FAILED + $3))
	SUMMARY+=("$(printf '  %-18s %4d passed, %4d failed%s' "$1" "$2" "$3" "${4:+   ($4)}")")
}
summary_skip() {
	SUMMARY+=("$(printf '  %-18s skipped (%s)' "$1" "$2")")
}

# stop_instances: stop every server started from the temp dir and kill any
# leftover process of ours still working in it (only those: matched by data
# directory or by working directory under $WORK).
stop_instances() {
	[ -n "$WORK" ] && [ -d "$WORK" ] || return 0
	local pidfile pid cwd pids=()
	cd / || return 0 # so that this script itself is not "working in it"
	while IFS= read -r pidfile; do
		"${AS_PG[@]}" "$PGBIN/pg_ctl" stop -m immediate -w -t 20 \
			-D "$(dirname "$pidfile")" >/dev/null 2>&1 || true
	done < <(find "$WORK" -name postmaster.pid 2>/dev/null)
	for pid in $(pgrep -u "$RUN_USER" 2>/dev/null); do
		[ "$pid" = $$ ] && continue
		cwd=$(readlink "/proc/$pid/cwd" 2>/dev/null) || continue
		case "$cwd/" in "$WORK"/*) pids+=("$pid") ;; esac
	done
	if [ "${#pids[@]}" -gt 0 ]; then
		say "killing leftover test processes: ${pids[*]}"
		kill -TERM "${pids[@]}" 2>/dev/null
		sleep 2
		kill -KILL "${pids[@]}" 2>/dev/null
	fi
	return 0
}

# finish: print the summary and the final count line, then exit.
finish() {
	local rc=0 t=$((SECONDS - START))
	trap - INT TERM HUP
	stop_instances
	if [ $((PASSED + FAILED)) -eq 0 ]; then
		summary_add "(none)" 0 1 "no test ran at all: that is a failure"
	fi
	[ "$FAILED" -gt 0 ] && rc=1
	echo
	echo "==================== projcache test summary ===================="
	printf '%s\n' "${SUMMARY[@]}"
	printf 'elapsed: %dm%02ds\n' $((t / 60)) $((t % 60))
	if [ -n "$WORK" ] && [ -d "$WORK" ]; then
		if [ "$rc" -eq 0 ] && [ "${PROJCACHE_KEEP:-0}" != 1 ]; then
			rm -rf "$WORK"
		else
			echo "kept build and logs: $WORK (logs in $WORK/logs)"
		fi
	fi
	echo "$PASSED passed, $FAILED failed"
	exit "$rc"
}

# shellcheck disable=SC2317  # invoked by the trap below
on_signal() {
	echo
	say "interrupted: stopping test processes"
	[ -n "$STEP_PID" ] && pkill -TERM -P "$STEP_PID" 2>/dev/null
	for pid in "${MAJOR_PIDS[@]}"; do pkill -TERM -P "$pid" 2>/dev/null; done
	summary_add "(aborted)" 0 1 "interrupted by a signal"
	finish
}
trap on_signal INT TERM HUP

timed_out() { [ "$1" -eq 124 ] || [ "$1" -eq 137 ]; }

# run_step LOG LIMIT CMD...: run CMD with a time limit, output shown and
# copied to LOG; returns CMD's status (124 or 137 on timeout).  The limit is
# capped by what is left of the overall budget.
run_step() {
	local log=$1 limit=$2 left rc
	shift 2
	left=$((BUDGET - (SECONDS - START)))
	[ "$left" -lt "$limit" ] && limit=$left
	if [ "$limit" -le 0 ]; then
		echo "time budget of ${BUDGET}s exhausted, not started: $*" | tee "$log"
		return 124
	fi
	# In the background so that a signal reaches our trap at once; timeout
	# puts the command in its own process group and kills it all on expiry.
	(
		timeout -k 15 "$limit" "$@" 2>&1 | tee "$log"
		exit "${PIPESTATUS[0]}"
	) &
	STEP_PID=$!
	wait "$STEP_PID"
	rc=$?
	STEP_PID=
	if timed_out "$rc"; then
		echo "*** timed out after ${limit}s: $*" | tee -a "$log"
	fi
	return "$rc"
}

# make_var NAME: the value of a variable of the project's Makefile.
make_var() {
	# shellcheck disable=SC2016  # $(NAME) is for make, not the shell
	make --no-print-directory -s -f Makefile \
		-f <(printf 'projcache-print-var:\n\t@echo $(%s)\n' "$1") \
		PG_CONFIG="$PG_CONFIG" projcache-print-var 2>/dev/null
}

# count_pg_regress LOG: "ok failed ignored" from pg_regress' per-test lines
# (15: "test foo    ... ok    25 ms", "     foo ... FAILED", ...; 16 and
# later print TAP: "ok 1         - foo   25 ms", "not ok 2     + bar ...").
count_pg_regress() {
	awk '
		/^(test +| +)[^ ]+ +\.\.\. ok( |$)/             { ok++ }
		/^(test +| +)[^ ]+ +\.\.\. FAILED( |$)/         { bad++ }
		/^(test +| +)[^ ]+ +\.\.\. failed \(ignored\)/ { ign++ }
		/^ok [0-9]+ +[-+] [^ ]/                        { ok++ }
		/^not ok [0-9]+ +[-+] [^ ]/                    { bad++ }
		END { print ok + 0, bad + 0, ign + 0 }' "$1"
}

# settle RC [CRASH_NOTE [NONE_NOTE]]: correct the caller's "bad" and "note"
# (a suite's failure count and remark, read from its output) by how its
# command ended: a timeout is one more failure; a failed status without a
# failed test, or success without any test, is one failure with CRASH_NOTE
# or NONE_NOTE.  The caller's "ok" is the suite's pass count.
settle() {
	local rc=$1
	if timed_out "$rc"; then
		bad=$((bad + 1)); note="timed out"
	elif [ "$rc" -ne 0 ] && [ "$bad" -eq 0 ]; then
		bad=1; note=${2:-"exit status $rc without a failed test: see the log above"}
	elif [ "$rc" -eq 0 ] && [ $((ok + bad)) -eq 0 ]; then
		bad=1; note=${3:-"ran no test"}
	fi
}

# show_tail FILE...: the end of each existing file, for post-mortems.
show_tail() {
	local f
	for f in "$@"; do
		[ -f "$f" ] || continue
		echo "----- tail -80 $f -----"
		tail -n 80 "$f"
	done
}

# run_regress_suite NAME LOG DIFFS INSTLOG MAKEARGS...: one pg_regress-style
# suite (pg_regress or isolation tester), counted from its per-test lines.
run_regress_suite() {
	local name=$1 log=$2 diffs=$3 instlog=$4 rc ok bad ign note=
	shift 4
	say "$name: make installcheck $*"
	run_step "$log" 420 "${AS_PG[@]}" make installcheck PG_CONFIG="$PG_CONFIG" "$@"
	rc=$?
	read -r ok bad ign < <(count_pg_regress "$log")
	[ "$ign" -gt 0 ] && { ok=$((ok + ign)); note="$ign failure(s) ignored by the schedule"; }
	settle "$rc"
	if [ "$bad" -gt 0 ]; then
		if [ -f "$diffs" ]; then
			echo "----- head -200 $diffs -----"
			head -n 200 "$diffs"
		fi
		show_tail "$instlog"
	fi
	summary_add "$name" "$ok" "$bad" "$note"
}

# ------------------------------------------------------------------ setup
say "projcache tests: source $REPO"
if ! bash "$REPO/scripts/install-deps.sh"; then
	summary_add "deps" 0 1 "scripts/install-deps.sh failed"
	finish
fi

WORK=$(mktemp -d "${TMPDIR:-/tmp}/projcache-test.XXXXXX") || {
	summary_add "setup" 0 1 "mktemp failed"
	finish
}
LOGS=$WORK/logs
mkdir -p "$LOGS" "$WORK/tmp"
# Temp files of the suites (TAP socket dirs, ...) go in here too, so that
# even a killed test leaves nothing behind outside $WORK.
export TMPDIR=$WORK/tmp
for m in "${SUITE_MAJORS[@]}" "${COMPILE_MAJORS[@]}"; do
	mkdir -p "$WORK/src-$m"
	if ! copy_tree "$WORK/src-$m"; then
		summary_add "setup" 0 1 "copying the source tree to $WORK/src-$m failed"
		finish
	fi
done
own_work
say "testing copies in $WORK/src-* (as OS user $RUN_USER)"

# ------------------------------------------------------------------ majors
# get_major MAJOR KIND: PGBIN_<MAJOR> (the directory of its pg_config) from
# scripts/pgmajor.sh KIND MAJOR, which may build it (kept for the next run);
# its time is a step of its own.  15 is Debian's package (install-deps.sh),
# or $PROJCACHE_PGBIN.
get_major() {
	local m=$1 kind=$2 rc dir
	if [ "$kind" = server ] && [ -n "${PROJCACHE_PGBIN:-}" ] &&
		"$PROJCACHE_PGBIN/pg_config" --version | grep -q "^PostgreSQL $m\."; then
		printf -v "PGBIN_$m" '%s' "$PROJCACHE_PGBIN"
		return 0
	fi
	if [ "$kind" = server ] && [ "$m" = 15 ]; then
		printf -v "PGBIN_$m" '%s' /usr/lib/postgresql/15/bin
		return 0
	fi
	say "postgresql-$m: scripts/pgmajor.sh $kind $m"
	local t0=$SECONDS
	run_step "$LOGS/pg$m.log" 2700 bash "$REPO/scripts/pgmajor.sh" "$kind" "$m"
	rc=$?
	dir=$(tail -n 1 "$LOGS/pg$m.log")
	if [ "$rc" -eq 0 ] && [ -x "$dir/pg_config" ]; then
		printf -v "PGBIN_$m" '%s' "$dir"
		summary_add "postgresql-$m" 0 0 "$kind in $dir, $((SECONDS - t0))s"
	else
		printf -v "PGBIN_$m" '%s' ""
		summary_add "postgresql-$m" 0 1 "scripts/pgmajor.sh $kind $m failed (exit $rc)"
	fi
}

# set_major MAJOR: PGBIN and PG_CONFIG for MAJOR, and cd to its copy.
set_major() {
	local var=PGBIN_$1
	PGBIN=${!var}
	PG_CONFIG=$PGBIN/pg_config
	cd "$WORK/src-$1" || finish
}

# ------------------------------------------------------------------ build
# build LABEL MAKEARGS...: make clean, build and install with MAKEARGS, in
# the current major's copy; sets "built".
build() {
	local label=$1 rc warnings
	shift
	built=0
	say "$label: make clean; make $*"
	"${AS_PG[@]}" make -s clean PG_CONFIG="$PG_CONFIG" >/dev/null 2>&1
	run_step "$LOGS/$label.log" 300 "${AS_PG[@]}" make -j"$(nproc)" PG_CONFIG="$PG_CONFIG" \
		PROJCACHE_WERROR=1 "$@"
	rc=$?
	if [ "$rc" -eq 0 ]; then
		say "$label: make install"
		run_step "$LOGS/$label-install.log" 120 "${AS_ROOT[@]}" make install PG_CONFIG="$PG_CONFIG"
		rc=$?
		if [ "$rc" -eq 0 ]; then
			built=1
			warnings=$(grep -c 'warning:' "$LOGS/$label.log")
			summary_add "$label" 0 0 "built and installed; $warnings compiler warning(s)"
		else
			summary_add "$label" 0 1 "make install failed (exit $rc)"
		fi
		# make install may have left root-owned files behind
		[ "$RUN_USER" = postgres ] && chown -R postgres:postgres "$PWD"
	else
		summary_add "$label" 0 1 "make failed (exit $rc); server suites skipped"
	fi
}

# ------------------------------------------------------------------ server suites
# server_suites SUFFIX: pg_regress, isolation and TAP against the installed
# build; SUFFIX tells the passes apart in the summary.
server_suites() {
	local sfx=$1 rc ok bad ign note tap_result failing_files f base
	if [ "$built" -ne 1 ]; then
		summary_skip "pg_regress$sfx" "no build"
		summary_skip "isolation$sfx" "no build"
		summary_skip "TAP$sfx" "no build"
		return
	fi
	# -------------------------------------------------------------- b. pg_regress
	if [ -n "$(make_var REGRESS)" ]; then
		run_regress_suite "pg_regress$sfx" "$LOGS/regress$sfx.log" regression.diffs \
			tmp_check/log/postmaster.log ISOLATION= TAP_TESTS=
	else
		summary_skip "pg_regress$sfx" "REGRESS is empty: no sql/*.sql"
	fi

	# -------------------------------------------------------------- c. isolation
	if [ -n "$(make_var ISOLATION)" ]; then
		run_regress_suite "isolation$sfx" "$LOGS/isolation$sfx.log" output_iso/regression.diffs \
			tmp_check_iso/log/postmaster.log REGRESS= TAP_TESTS=
	else
		summary_skip "isolation$sfx" "the Makefile defines no ISOLATION specs"
	fi

	# -------------------------------------------------------------- d. TAP
	if compgen -G "test/t/*.pl" >/dev/null; then
		say "TAP: make installcheck REGRESS= ISOLATION= PROVE_FLAGS=-v"
		run_step "$LOGS/tap$sfx.log" 2700 "${AS_PG[@]}" make installcheck \
			PG_CONFIG="$PG_CONFIG" REGRESS= ISOLATION= PROVE_FLAGS=-v
		rc=$?
		# Count top-level "ok N" / "not ok N" lines (subtests are indented;
		# "# TODO" and "# skip" count as passes).  A file that died or had a
		# bad plan without a "not ok" of its own adds one failure; its name
		# is listed after the counts for the post-mortem.
		tap_result=$(awk '
			/^test\/t\/[^ ]+\.pl \.+ *$/ { file = $1; next }
			/^not ok [0-9]+/ {
				if (tolower($0) ~ /# *todo/) ok++
				else { bad++; notok[file]++; failing[file] = 1 }
				next
			}
			/^ok [0-9]+/ { ok++; next }
			/^test\/t\/[^ ]+\.pl +\(Wstat: / {
				sfile = $1
				if ($0 !~ /Wstat: 0 /) broken[sfile] = 1
				next
			}
			/^  Parse errors:/ && sfile != "" { broken[sfile] = 1; next }
			/^[^ ]/ { sfile = "" }
			END {
				for (f in broken) if (!(f in notok)) { bad++; failing[f] = 1 }
				printf "%d %d", ok + 0, bad + 0
				for (f in failing) printf " %s", f
				print ""
			}' "$LOGS/tap$sfx.log")
		read -r ok bad failing_files <<<"$tap_result"
		note=
		settle "$rc"
		if [ "$bad" -gt 0 ]; then
			names=
			for f in $failing_files; do
				base=$(basename "$f" .pl)
				names="$names${names:+ }$base"
				show_tail "tmp_check/log/regress_log_$base" tmp_check/log/"${base}"_*.log
			done
			# The summary names the failing files: the last lines of a
			# long log are often all that is kept of it.
			[ -z "$names" ] || note="${note:+$note; }failed: $names"
			[ -n "$failing_files" ] || show_tail tmp_check/log/*
		fi
		summary_add "TAP$sfx" "$ok" "$bad" "$note"
	else
		summary_skip "TAP$sfx" "no test/t/*.pl"
	fi
}

# ------------------------------------------------------------------ passes
# Build and install on every major first (the pg_upgrade test on one reads
# another's install), then the suites of each.
BUILT=()
UNIT_MAJOR=
for m in "${SUITE_MAJORS[@]}"; do
	get_major "$m" server
	built=0
	v=PGBIN_$m
	if [ -n "${!v}" ]; then
		set_major "$m"
		UNIT_MAJOR=${UNIT_MAJOR:-$m}
		build "build@$m"
	else
		summary_skip "build@$m" "no PostgreSQL $m"
	fi
	BUILT+=("$built")
done
# ------------------------------------------------------------------ a. unit
# cmocka prints "[  PASSED  ] N test(s)." and "[  FAILED  ] N test(s),
# listed below:" per group.  They need no server, so they run even when the
# extension does not build (in the first major's copy: the Makefile reads
# PGXS).
say "unit: make unittest"
if [ -n "$UNIT_MAJOR" ]; then
	set_major "$UNIT_MAJOR"
	run_step "$LOGS/unit.log" 180 "${AS_PG[@]}" make unittest PG_CONFIG="$PG_CONFIG"
	rc=$?
else
	echo "no PostgreSQL major to read PGXS from" | tee "$LOGS/unit.log"
	rc=1
fi
read -r ok bad < <(awk '
	/^\[  PASSED  \] [0-9]+ test\(s\)\./                 { p += $4 }
	/^\[  FAILED  \] [0-9]+ test\(s\), listed below:/     { f += $4 }
	END { print p + 0, f + 0 }' "$LOGS/unit.log")
note=
settle "$rc" "did not build or crashed (exit $rc)" "no cmocka result line in the output"
summary_add "unit" "$ok" "$bad" "$note"

# The majors' server suites run side by side, each in its own copy, with
# its own temp instances and logs: they mostly wait on servers, so two cores
# run three majors' suites in little more than the longest one's time.
# Each records its results in a file, which is added to the summary, and
# its output, which is shown once it ends (in the plan's order).  The TAP
# clusters of all of them take their ports under one lock directory.
export PG_TEST_PORT_DIR=$WORK/tmp/portlock
mkdir -p "$PG_TEST_PORT_DIR"
chown "$RUN_USER" "$PG_TEST_PORT_DIR" 2>/dev/null
MAJOR_PIDS=()
i=0
for m in "${SUITE_MAJORS[@]}"; do
	built=${BUILT[$i]}
	i=$((i + 1))
	(
		# Results go to a file: this runs in a subshell of its own.
		summary_add() { printf 'add\t%s\t%s\t%s\t%s\n' "$1" "$2" "$3" "${4:-}" >>"$LOGS/results@$m"; }
		summary_skip() { printf 'skip\t%s\t%s\n' "$1" "$2" >>"$LOGS/results@$m"; }
		: >"$LOGS/results@$m"
		# The pg_upgrade test upgrades from an older major of this run.
		unset PROJCACHE_UPGRADE_FROM
		for o in "${SUITE_MAJORS[@]}"; do
			v=PGBIN_$o
			if [ "$o" -lt "$m" ] && [ -n "${!v}" ]; then
				export PROJCACHE_UPGRADE_FROM=${!v}
			fi
		done
		if [ "$built" -eq 1 ]; then set_major "$m"; fi
		server_suites "@$m"
	) >"$LOGS/suites@$m.out" 2>&1 &
	MAJOR_PIDS+=("$!")
	say "server suites on $m started (output: $LOGS/suites@$m.out)"
done
i=0
for m in "${SUITE_MAJORS[@]}"; do
	wait "${MAJOR_PIDS[$i]}"
	i=$((i + 1))
done
MAJOR_PIDS=()
for m in "${SUITE_MAJORS[@]}"; do
	say "server suites on $m:"
	cat "$LOGS/suites@$m.out"
	if [ ! -s "$LOGS/results@$m" ]; then
		summary_add "suites@$m" 0 1 "no result recorded"
		continue
	fi
	while IFS=$'\t' read -r kind a b c d; do
		case "$kind" in
			add) summary_add "$a" "$b" "$c" "$d" ;;
			skip) summary_skip "$a" "$b" ;;
		esac
	done <"$LOGS/results@$m"
done

# ------------------------------------------------------------------ compile check
# Every src/*.c compiled against MAJOR's headers, warnings as errors; one
# test per file.  The headers need not match this machine's server, so
# only objects are made (no link, no bitcode).
for m in "${COMPILE_MAJORS[@]}"; do
	get_major "$m" headers
	v=PGBIN_$m
	if [ -z "${!v}" ]; then
		summary_skip "compile@$m" "no PostgreSQL $m headers"
		continue
	fi
	set_major "$m"
	ok=0 bad=0 note=
	failed_files=()
	say "compile@$m: every src/*.c against $("$PG_CONFIG" --version)'s headers, -Werror"
	for f in src/*.c; do
		o=${f%.c}.o
		if run_step "$LOGS/compile$m-$(basename "$f" .c).log" 120 "${AS_PG[@]}" \
			make -s PG_CONFIG="$PG_CONFIG" with_llvm=no PROJCACHE_WERROR=1 "$o" >/dev/null; then
			ok=$((ok + 1))
		else
			bad=$((bad + 1))
			failed_files+=("$f")
			cat "$LOGS/compile$m-$(basename "$f" .c).log"
		fi
	done
	[ "$bad" -gt 0 ] && note="failed: ${failed_files[*]}"
	summary_add "compile@$m" "$ok" "$bad" "$note"
done

# ------------------------------------------------------------------ layout check
# scripts/pgindent.sh with PostgreSQL 18's pgindent: one test per file, a
# file failing when pgindent would change it.  Runs when 18 is part of the
# plan (its build carries the tools).
if [ -n "${PGBIN_18:-}" ]; then
	say "pgindent: src/ and test/unit/ laid out as PostgreSQL 18's pgindent does"
	run_step "$LOGS/pgindent.log" 300 bash scripts/pgindent.sh --diff >/dev/null
	rc=$?
	mapfile -t all_files < <(bash scripts/pgindent.sh --list)
	mapfile -t changed < <(sed -n 's/^--- \([^[:space:]]*\).*/\1/p' "$LOGS/pgindent.log" | sort -u)
	bad=${#changed[@]}
	ok=$((${#all_files[@]} - bad))
	note=
	if [ "$bad" -gt 0 ]; then
		note="would change: ${changed[*]}"
	elif [ "$rc" -ne 0 ]; then
		ok=0 bad=1 note="pgindent.sh failed (exit $rc)"
	fi
	summary_add "pgindent" "$ok" "$bad" "$note"
fi
# Every typedef of those files is in tools/typedefs.list (else pgindent
# lays its declarations out as expressions and the check above passes them).
say "typedefs: every typedef name of src/ and test/unit/ in tools/typedefs.list"
if out=$(bash scripts/pgindent.sh --typedefs 2>&1); then
	summary_add "typedefs" 1 0 ""
else
	printf '%s\n' "$out"
	summary_add "typedefs" 0 1 "$(printf '%s' "$out" | sed -n 's/^not in tools\/typedefs.list: //p' | tr '\n' ' ')"
fi

finish
