#!/usr/bin/env bash
# bench/wal_invalidations.sh - how long an invalidation committed on a
# primary takes to reach a streaming standby's cache.
#
#     sudo bash bench/wal_invalidations.sh          # 100 trials
#     sudo TRIALS=300 bash bench/wal_invalidations.sh
#
# Builds and installs this tree, starts a primary (port 54350,
# projcache.wal_invalidations = on) and a streaming hot standby made from
# its base backup (port 54351, projcache.expiry = 1h, batch_interval = 10ms),
# both on this machine, unix sockets only, run by the unprivileged
# "postgres" OS user.  The standby caches key-1 .. key-TRIALS.  Then each
# trial:
#   1. starts, on the standby, a session that reads get(key-i) every
#      millisecond until it returns the new config, and records
#      clock_timestamp() then (t1), or gives up after 10 s;
#   2. on the primary: BEGIN; UPDATE the key's row; invalidate(key-i);
#      COMMIT; then records clock_timestamp() (t0, just after the commit
#      returned);
#   3. latency = t1 - t0 (one machine, one clock).
# It reports p50, p99, max and how many trials saw the new value.  The
# expiry of 1 h means only the invalidation can make the standby refetch.
#
# It asserts nothing about speed: it reports what it measured.  Servers are
# stopped and the temp dir removed on exit, error or Ctrl-C.
set -euo pipefail

# shellcheck source=SCRIPTDIR/../scripts/lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/../scripts/lib.sh"
NAME=wal_invalidations
TRIALS=${TRIALS:-100}
PORT=54350
STANDBY_PORT=54351
WORK=
DATA=
SOCK=
STANDBY=

case $TRIALS in '' | *[!0-9]*) echo "TRIALS must be a whole number" >&2; exit 2 ;; esac

# The standby is stopped too, whatever happens.
stop_standby() {
	[ -n "$STANDBY" ] && [ -f "$STANDBY/postmaster.pid" ] &&
		"${AS_PG[@]}" "$PGBIN/pg_ctl" stop -D "$STANDBY" -m immediate -w -t 30 >/dev/null 2>&1
	return 0
}
trap 'stop_standby; _cleanup' EXIT
trap 'exit 130' INT
trap 'exit 143' TERM HUP

bash "$REPO/scripts/install-deps.sh"
setup_work projcache-walinv
DATA=$WORK/primary
STANDBY=$WORK/standby

start_cluster <<EOF
listen_addresses = ''
fsync = off
wal_level = replica
max_wal_senders = 4
shared_preload_libraries = 'projcache'
projcache.database = 'postgres'
projcache.fetch_function = 'public.fetch'
projcache.wal_invalidations = on
EOF
echo "local replication all trust" >>"$DATA/pg_hba.conf"
"${AS_PG[@]}" "$PGBIN/pg_ctl" reload -D "$DATA" >/dev/null

pgrun <<EOF
CREATE EXTENSION projcache;
CREATE TABLE public.upstream (key text PRIMARY KEY, revision text, config jsonb);
INSERT INTO public.upstream
SELECT 'key-' || g, 'r0', jsonb_build_object('v', 0) FROM generate_series(1, $TRIALS) g;
CREATE FUNCTION public.fetch(p_keys text[], p_revisions text[])
RETURNS TABLE(key text, state text, revision text, config jsonb)
LANGUAGE sql STABLE AS \$\$
    SELECT u.key, 'enabled', u.revision, u.config FROM public.upstream u WHERE u.key = ANY (p_keys)
\$\$;
-- Runs on the standby: the time get(k) first returns want (NULL after 10 s).
CREATE FUNCTION public.wait_for_value(k text, want jsonb) RETURNS timestamptz
LANGUAGE plpgsql AS \$\$
DECLARE
    deadline timestamptz := clock_timestamp() + interval '10 s';
BEGIN
    LOOP
        IF projcache.get(k) = want THEN
            RETURN clock_timestamp();
        END IF;
        IF clock_timestamp() > deadline THEN
            RETURN NULL;
        END IF;
        PERFORM pg_sleep(0.001);
    END LOOP;
END
\$\$;
CREATE TABLE public.trials (i int, t0 timestamptz, t1 timestamptz);
EOF

"${AS_PG[@]}" "$PGBIN/pg_basebackup" -h "$SOCK" -p "$PORT" -U postgres -D "$STANDBY" -R -X stream >/dev/null
cat >>"$STANDBY/postgresql.conf" <<EOF

projcache.expiry = '1h'
projcache.batch_interval = '10ms'
EOF
"${AS_PG[@]}" "$PGBIN/pg_ctl" start -D "$STANDBY" -l "$WORK/standby.log" -w -t 30 \
	-o "-p $STANDBY_PORT -k $SOCK" >/dev/null
echo "standby running: psql -p $STANDBY_PORT -h $SOCK -d postgres"

standby_value() {
	"${AS_PG[@]}" "$PGBIN/psql" -X -q -At -v ON_ERROR_STOP=1 -p "$STANDBY_PORT" -h "$SOCK" -d postgres -c "$1"
}

until [ "$(standby_value "SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'projcache scheduler'")" = 1 ]; do
	sleep 0.1
done
cached=$(standby_value "SELECT count(projcache.get('key-' || g, '10s')) FROM generate_series(1, $TRIALS) g")
echo "standby cached $cached of $TRIALS keys"

T1=()
for i in $(seq 1 "$TRIALS"); do
	out=$WORK/t1.$i
	standby_value "SELECT public.wait_for_value('key-$i', '{\"v\": 1}')" >"$out" &
	poller=$!
	# the poller is reading the old value before the change is made
	until [ "$(standby_value "SELECT count(*) FROM pg_stat_activity WHERE query LIKE 'SELECT public.wait_for_value(''key-$i''%'")" = 1 ]; do
		sleep 0.01
	done
	pgrun >/dev/null <<EOF
BEGIN;
UPDATE public.upstream SET revision = 'r1', config = '{"v": 1}' WHERE key = 'key-$i';
SELECT projcache.invalidate('key-$i');
COMMIT;
INSERT INTO public.trials VALUES ($i, clock_timestamp(), NULL);
EOF
	wait "$poller"
	T1+=("$i $(cat "$out")")
done

# the pollers' times, gathered on the primary beside t0
for line in "${T1[@]}"; do
	i=${line%% *}
	t1=${line#* }
	if [ -n "$t1" ]; then
		pgrun -c "UPDATE public.trials SET t1 = '$t1' WHERE i = $i"
	fi
done

echo
echo "projcache WAL invalidations, $(date -u '+%Y-%m-%d %H:%M:%S UTC'), $(nproc) CPUs, load $(cut -d' ' -f1-3 /proc/loadavg)"
echo "primary -> streaming standby on this machine; standby expiry 1h, batch_interval 10ms"
echo "latency = the standby's get() first returning the new value - the primary's COMMIT returning"
pgvalue "SELECT count(t1) || ' of ' || count(*) || ' trials saw the new value; '
              || 'p50 ' || round(percentile_cont(0.5) WITHIN GROUP (ORDER BY ms)::numeric, 1) || ' ms, '
              || 'p99 ' || round(percentile_cont(0.99) WITHIN GROUP (ORDER BY ms)::numeric, 1) || ' ms, '
              || 'max ' || round(max(ms)::numeric, 1) || ' ms, '
              || 'min ' || round(min(ms)::numeric, 1) || ' ms'
         FROM (SELECT t1, extract(epoch FROM t1 - t0) * 1000 AS ms FROM public.trials) s"
