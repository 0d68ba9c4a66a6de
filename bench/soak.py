#!/usr/bin/env python3
"""bench/soak.py - the readers, the faults and the report of bench/soak.sh.

Run by bench/soak.sh, which builds and installs projcache, starts the two
servers (the source and the cache, bench/soak_source.sql and
bench/soak_cache.sql loaded) and passes their whereabouts and the settings
in the environment (SOAK_*, below).  Python 3, standard library only: it
speaks PostgreSQL's protocol over the unix socket itself, so that each
read's latency and outcome (a value, NULL, an ERROR and its SQLSTATE, a
connection lost) is recorded.

- Readers: SOAK_CLIENTS processes, each with its share of the hot keys,
  reading each of them about once a second, one get() per statement (a
  prepared `SELECT projcache.get($1)`); one read in eight is instead
  `SELECT count(*) FROM public.grants` (the snapshot's foreign table).  A
  reader that falls behind reads as fast as it can.  A reader whose
  connection breaks reconnects at once, then every 50 ms: the attempts
  that fail are counted apart, not as reads.
- A sampler of projcache.stats and projcache.snapshots, once a second.
- The windows, one after the other: quiet, then each fault followed by
  another quiet window: source down, source slow, scheduler killed, a scan
  of cold keys, fast restarts of the cache with the source down.

Every record carries CLOCK_MONOTONIC times, so the report cuts them by the
windows afterwards.  Exit status 1 when a measurement could not be made (a
fault could not be applied, a reader died, a window had no reads); the
report says which.
"""
import array
import bisect
import json
import multiprocessing as mp
import os
import random
import re
import signal
import socket
import struct
import subprocess
import sys
import time

ENV = os.environ
PGBIN = ENV["SOAK_PGBIN"]
SOCK = ENV["SOAK_SOCK"]
CACHE_PORT = int(ENV["SOAK_CACHE_PORT"])
SOURCE_PORT = int(ENV["SOAK_SOURCE_PORT"])
CACHE_DATA = ENV["SOAK_CACHE_DATA"]
SOURCE_DATA = ENV["SOAK_SOURCE_DATA"]
WORK = ENV["SOAK_WORK"]
HOT = int(ENV["SOAK_HOT"])
COLD = int(ENV["SOAK_COLD"])
CHUNK = 500
CLIENTS = int(ENV["SOAK_CLIENTS"])
TOTAL = float(ENV["SOAK_MINUTES"]) * 60
SLOW = float(ENV["SOAK_SLOW_SECONDS"])
GRANT_ROWS = int(ENV.get("SOAK_GRANT_ROWS", "500"))
FAULTS = ENV.get("SOAK_FAULTS", "down,slow,kill,scan,restart").split(",")
REPORT = ENV["SOAK_REPORT"]
# The scan: keys a second (0: as fast as one connection can), and whether
# it loops over the cold keys until its window ends.
SCAN_RATE = float(ENV.get("SOAK_SCAN_RATE", "0"))
SCAN_LOOP = ENV.get("SOAK_SCAN_LOOP", "0") == "1"

# A record: start (monotonic s), latency (s), kind, result, error kind id,
# warning kind id (0: none), the hot key's number (0: none).
REC = struct.Struct("<dfBBHHI")
HOT_READ, SNAP_READ, SCAN_READ, CONNECT = 0, 1, 2, 3
OK, EMPTY, ERROR, LOST = 0, 1, 2, 3

FAULT_NAMES = {
    "down": "source down",
    "slow": "source slow",
    "kill": "scheduler killed",
    "scan": "cold scan",
    "restart": "restarts, source down",
}


def out(line=""):
    print(line, flush=True)


# ------------------------------------------------------------ PostgreSQL

class PgError(Exception):
    """An ErrorResponse: its SQLSTATE, severity and message."""

    def __init__(self, fields):
        self.code = fields.get(b"C", "?????")
        self.severity = fields.get(b"V", fields.get(b"S", "ERROR"))
        self.message = fields.get(b"M", "")
        super().__init__(f"{self.code} {self.message}")


class ConnLost(Exception):
    """The connection broke: EOF, a socket error, or a FATAL."""


def kind_of(code, message):
    """An error's kind: its SQLSTATE and message, numbers made N."""
    msg = re.sub(r"\d+(\.\d+)?", "N", message)
    return f"{code} {msg}"[:110]


class Pg:
    """The frontend/backend protocol over the unix socket, trust auth."""

    def __init__(self, port, app):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            self.sock.connect(f"{SOCK}/.s.PGSQL.{port}")
        except OSError:
            self.sock.close()
            raise
        self.rf = self.sock.makefile("rb", buffering=65536)
        body = struct.pack("!i", 196608)
        for k, v in (("user", "postgres"), ("database", "postgres"),
                     ("application_name", app)):
            body += k.encode() + b"\0" + v.encode() + b"\0"
        body += b"\0"
        try:
            self.sock.sendall(struct.pack("!i", len(body) + 4) + body)
            self._until_ready()
        except (PgError, ConnLost, OSError):
            self.close()
            raise

    def _msg(self):
        head = self.rf.read(5)
        if len(head) < 5:
            raise ConnLost("server closed the connection")
        kind, length = head[:1], struct.unpack("!i", head[1:])[0]
        body = self.rf.read(length - 4)
        if len(body) < length - 4:
            raise ConnLost("server closed the connection")
        return kind, body

    @staticmethod
    def _fields(body):
        return dict((f[:1], f[1:].decode(errors="replace"))
                    for f in body.split(b"\0") if f)

    def _until_ready(self):
        """Messages until ReadyForQuery: (rows, notices); raises the error."""
        rows, error, notices = [], None, []
        while True:
            try:
                kind, body = self._msg()
            except OSError as e:
                raise ConnLost(f"socket: {e.strerror or type(e).__name__}")
            if kind == b"D":
                n = struct.unpack("!h", body[:2])[0]
                pos, row = 2, []
                for _ in range(n):
                    ln = struct.unpack("!i", body[pos:pos + 4])[0]
                    pos += 4
                    if ln < 0:
                        row.append(None)
                    else:
                        row.append(body[pos:pos + ln].decode())
                        pos += ln
                rows.append(row)
            elif kind == b"E":
                error = PgError(self._fields(body))
                if error.severity in ("FATAL", "PANIC"):
                    raise ConnLost(kind_of(error.code, error.message))
            elif kind == b"N":
                f = self._fields(body)
                notices.append(kind_of(f.get(b"C", "?????"), f.get(b"M", "")))
            elif kind == b"R":
                if struct.unpack("!i", body[:4])[0] != 0:
                    raise RuntimeError("the server asks for a password: it must trust")
            elif kind == b"Z":
                if error:
                    raise error
                return rows, notices

    def query(self, sql):
        body = sql.encode() + b"\0"
        try:
            self.sock.sendall(b"Q" + struct.pack("!i", len(body) + 4) + body)
        except OSError as e:
            raise ConnLost(f"socket: {e.strerror or type(e).__name__}")
        return self._until_ready()[0]

    def value(self, sql):
        return self.query(sql)[0][0]

    def prepare(self, name, sql, ntext):
        """A named statement of ntext text parameters."""
        body = (name.encode() + b"\0" + sql.encode() + b"\0"
                + struct.pack("!h", ntext) + struct.pack("!i", 25) * ntext)
        msg = b"P" + struct.pack("!i", len(body) + 4) + body + b"S\0\0\0\4"
        self.sock.sendall(msg)
        self._until_ready()

    def execute(self, name, params):
        """Bind, Execute, Sync: (rows, notices)."""
        body = b"\0" + name.encode() + b"\0" + struct.pack("!hh", 0, len(params))
        for p in params:
            p = p.encode()
            body += struct.pack("!i", len(p)) + p
        body += struct.pack("!h", 0)
        msg = (b"B" + struct.pack("!i", len(body) + 4) + body
               + b"E\0\0\0\x09\0\0\0\0\0" + b"S\0\0\0\4")
        try:
            self.sock.sendall(msg)
        except OSError as e:
            raise ConnLost(f"socket: {e.strerror or type(e).__name__}")
        return self._until_ready()

    def close(self):
        try:
            self.sock.sendall(b"X" + struct.pack("!i", 4))
        except OSError:
            pass
        try:
            self.sock.close()
        except OSError:
            pass


def cache(app="soak control"):
    return Pg(CACHE_PORT, app)


def source(app="soak control"):
    return Pg(SOURCE_PORT, app)


def pg_ctl(data, *args, log):
    """pg_ctl ARGS on DATA, waiting; its time in seconds, or an exception."""
    t0 = time.monotonic()
    r = subprocess.run([f"{PGBIN}/pg_ctl", *args, "-D", data, "-w", "-t", "120", "-l", log],
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"pg_ctl {' '.join(args)} -D {data} failed: {r.stdout.strip()[-300:]}")
    return time.monotonic() - t0


def wait_until(what, cond, timeout):
    """Poll cond (exceptions count as not yet) every 50 ms: the seconds it took."""
    t0 = time.monotonic()
    last = None
    while True:
        try:
            if cond():
                return time.monotonic() - t0
        except (OSError, PgError, ConnLost) as e:
            last = e
        if time.monotonic() - t0 > timeout:
            raise RuntimeError(f"gave up waiting for {what} after {timeout:.0f} s"
                               + (f" (last error: {last})" if last else ""))
        time.sleep(0.05)


# ------------------------------------------------------------ the processes

class Recorder:
    """A process's records, written to its own file, and its kinds."""

    def __init__(self, path):
        self.path = path
        self.f = open(path + ".rec", "wb")
        self.buf = bytearray()
        self.kinds = {}

    def kind(self, text):
        if text is None:
            return 0
        k = self.kinds.get(text)
        if k is None:
            k = self.kinds[text] = len(self.kinds) + 1
        return k

    def add(self, t0, lat, kind, result, err=None, warn=None, key=0):
        self.buf += REC.pack(t0, lat, kind, result, self.kind(err), self.kind(warn), key)
        if len(self.buf) >= 65536:
            self.f.write(self.buf)
            self.buf = bytearray()

    def close(self):
        self.f.write(self.buf)
        self.f.close()
        with open(self.path + ".kinds", "w") as f:
            json.dump({v: k for k, v in self.kinds.items()}, f)


def on_term(signum, frame):
    raise SystemExit(0)


def connect_loop(rec, stop, app, prepare):
    """A connection, retried every 50 ms, each failure recorded; None if stopped."""
    while not stop.value:
        t0 = time.monotonic()
        try:
            conn = cache(app)
            for name, sql, n in prepare:
                conn.prepare(name, sql, n)
            return conn
        except (OSError, PgError, ConnLost) as e:
            if isinstance(e, PgError):
                what = kind_of(e.code, e.message)
            elif isinstance(e, ConnLost):
                what = str(e)
            else:
                what = f"socket: {e.strerror or type(e).__name__}"
            rec.add(t0, time.monotonic() - t0, CONNECT, LOST, what)
            time.sleep(0.05)
    return None


def reader(cid, stop, progress):
    """A reader: its share of the hot keys, each about once a second, and a
    snapshot count instead of one read in eight."""
    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    rec = Recorder(f"{WORK}/reader{cid}")
    keys = list(range(1 + cid, HOT + 1, CLIENTS))
    rng = random.Random(cid)
    per_second = len(keys) * 8 / 7
    gap = 1.0 / per_second
    order, pos, n = [], 0, 0
    conn = None
    prepare = [("g", "SELECT projcache.get($1)", 1),
               ("s", "SELECT count(*) FROM public.grants", 0)]
    try:
        due = time.monotonic()
        while not stop.value:
            if conn is None:
                conn = connect_loop(rec, stop, f"soak reader {cid}", prepare)
                if conn is None:
                    break
                due = time.monotonic()
            now = time.monotonic()
            if due > now:
                time.sleep(due - now)
            elif now - due > 1.0:
                due = now           # behind by more than a second: no backlog
            due += gap
            n += 1
            if n % 8 == 0:
                kind, name, params, key = SNAP_READ, "s", [], 0
            else:
                if pos == len(order):
                    order = keys[:]
                    rng.shuffle(order)
                    pos = 0
                key = order[pos]
                kind, name, params = HOT_READ, "g", [f"hot{key}"]
                pos += 1
            t0 = time.monotonic()
            try:
                rows, notices = conn.execute(name, params)
                lat = time.monotonic() - t0
                v = rows[0][0] if rows else None
                if kind == HOT_READ:
                    result = EMPTY if v is None else OK
                else:
                    result = OK if v == str(GRANT_ROWS) else EMPTY
                rec.add(t0, lat, kind, result, None, notices[0] if notices else None, key)
            except PgError as e:
                rec.add(t0, time.monotonic() - t0, kind, ERROR, kind_of(e.code, e.message), None, key)
            except ConnLost as e:
                rec.add(t0, time.monotonic() - t0, kind, LOST, str(e), None, key)
                conn.close()
                conn = None
            progress[cid] += 1
    finally:
        if conn is not None:
            conn.close()
        rec.close()


def scanner(stop, spread, progress):
    """Reads cold1 .. coldN, CHUNK a statement, at SCAN_RATE keys a second
    (0: as fast as it can); once each, or with SCAN_LOOP over and over
    until `spread` seconds have passed."""
    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    rec = Recorder(f"{WORK}/scanner")
    prepare = [("c", "SELECT count(projcache.get('cold' || i)) "
                     "FROM generate_series($1::int, $2::int) AS i", 2)]
    nstmt = (COLD + CHUNK - 1) // CHUNK
    gap = CHUNK / SCAN_RATE if SCAN_RATE > 0 else 0.0
    conn = None
    try:
        start = time.monotonic()
        i = 0
        while (i < nstmt or SCAN_LOOP) and not stop.value:
            if SCAN_LOOP and time.monotonic() - start >= spread:
                break
            if conn is None:
                conn = connect_loop(rec, stop, "soak scanner", prepare)
                if conn is None:
                    break
            due = start + i * gap
            now = time.monotonic()
            if due > now:
                time.sleep(due - now)
            lo = 1 + (i % nstmt) * CHUNK
            hi = min(COLD, lo + CHUNK - 1)
            t0 = time.monotonic()
            try:
                conn.execute("c", [str(lo), str(hi)])
                rec.add(t0, time.monotonic() - t0, SCAN_READ, OK)
                i += 1
            except PgError as e:
                rec.add(t0, time.monotonic() - t0, SCAN_READ, ERROR, kind_of(e.code, e.message))
                i += 1
            except ConnLost as e:
                rec.add(t0, time.monotonic() - t0, SCAN_READ, LOST, str(e))
                conn.close()
                conn = None
            progress[0] = i
    finally:
        if conn is not None:
            conn.close()
        rec.close()


STATS_SQL = """
SELECT s.entries, s.memory_used, s.fetch_calls, s.fetched_keys, s.not_modified,
       s.fetch_errors, s.evictions_memory, s.evictions_expired, s.refused_reads,
       s.dropped_fetches, s.worker_pid, s.loaded_keys,
       (SELECT n.status || ' ' || n.rows FROM projcache.snapshots AS n WHERE n.name = 'grants')
  FROM projcache.stats AS s"""
STATS_COLS = ["entries", "memory_used", "fetch_calls", "fetched_keys", "not_modified",
              "fetch_errors", "evictions_memory", "evictions_expired", "refused_reads",
              "dropped_fetches", "worker_pid", "loaded_keys", "snapshot", "load1"]


def sampler(stop):
    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    conn = None
    with open(f"{WORK}/samples.jsonl", "w") as f:
        nxt = time.monotonic()
        while not stop.value:
            t = time.monotonic()
            try:
                if conn is None:
                    conn = cache("soak sampler")
                row = conn.query(STATS_SQL)[0]
                f.write(json.dumps([t] + row + [os.getloadavg()[0]]) + "\n")
                f.flush()
            except (OSError, PgError, ConnLost):
                if conn is not None:
                    conn.close()
                conn = None
            nxt += 1.0
            time.sleep(max(0.0, nxt - time.monotonic()))
    if conn is not None:
        conn.close()


# ------------------------------------------------------------ the faults

class Failed(Exception):
    """A measurement that could not be made."""


class Soak:
    def __init__(self):
        self.events = []        # (t, window index, text)
        self.windows = []       # [name, fault, start, end]
        self.restarts = []      # (t_begin, t_up) of the cache server
        self.kills = []         # (t_kill, t_back or None, old pid, new pid)
        self.failures = []
        self.stop = mp.Value("b", 0, lock=False)
        self.progress = mp.Array("q", CLIENTS, lock=False)
        self.scan_stop = mp.Value("b", 0, lock=False)
        self.scan_progress = mp.Array("q", 1, lock=False)
        self.procs = []
        self.scan_proc = None
        self.scan_span = None

    def event(self, text):
        t = time.monotonic()
        self.events.append((t, len(self.windows) - 1, text))
        out(f"    {t - self.t0:7.1f} s  {text}")

    # -- setting up

    def warm_up(self):
        t0 = time.monotonic()
        c = cache()
        wait_until("the key-cache worker",
                   lambda: c.value("SELECT worker_pid IS NOT NULL FROM projcache.stats") == "t", 60)
        c.query(f"SELECT count(projcache.get('hot' || i)) FROM generate_series(1, {HOT}) AS i")

        def all_cached():
            n = int(c.value(f"SELECT count(projcache.get('hot' || i)) "
                            f"FROM generate_series(1, {HOT}) AS i"))
            return n == HOT
        wait_until(f"the {HOT} hot keys to be cached", all_cached, 300)
        wait_until("the snapshot to load",
                   lambda: c.value("SELECT count(*) FROM public.grants") == str(GRANT_ROWS), 60)
        c.close()
        out(f"warm: {HOT} hot keys cached and the snapshot loaded in {time.monotonic() - t0:.1f} s")

    def start_readers(self):
        ctx = mp.get_context("fork")
        for cid in range(CLIENTS):
            p = ctx.Process(target=reader, args=(cid, self.stop, self.progress), daemon=True)
            p.start()
            self.procs.append((f"reader {cid}", p))
        p = ctx.Process(target=sampler, args=(self.stop,), daemon=True)
        p.start()
        self.procs.append(("sampler", p))
        wait_until("every reader's first read",
                   lambda: all(self.progress[i] > 0 for i in range(CLIENTS)), 60)

    def check_procs(self):
        for name, p in self.procs:
            if not p.is_alive():
                raise Failed(f"{name} died (exit {p.exitcode})")

    def sleep_until(self, t):
        while True:
            self.check_procs()
            now = time.monotonic()
            if now >= t:
                return
            time.sleep(min(1.0, t - now))

    # -- the faults: each runs from its window's start; returns when the
    # fault is over (its window then ends at the later of that and its
    # planned end)

    def source_stop(self):
        self.event(f"source stopped (pg_ctl stop -m fast, {pg_ctl(SOURCE_DATA, 'stop', '-m', 'fast', log=f'{WORK}/source.log'):.1f} s)")

    def source_start(self):
        self.event(f"source started (pg_ctl start, {pg_ctl(SOURCE_DATA, 'start', log=f'{WORK}/source.log'):.1f} s)")

    def fault_down(self, end):
        self.source_stop()
        self.sleep_until(end)
        self.source_start()

    def set_slow(self, seconds):
        c = source()
        c.query(f"UPDATE public.fault SET slow_seconds = {seconds}")
        c.close()

    def fault_slow(self, end):
        self.set_slow(SLOW)
        self.event(f"source slow: its functions sleep {SLOW:g} s a call")
        self.sleep_until(end)
        self.set_slow(0)
        self.event("source fast again")

    def worker_pid(self, c):
        return c.value("SELECT pid FROM pg_stat_activity WHERE backend_type = 'projcache scheduler'")

    def fault_kill(self, end):
        start = time.monotonic()
        span = end - start
        for k in range(3):
            self.sleep_until(start + k * span / 3)
            c = cache()
            old = self.worker_pid(c)
            if old is None:
                raise Failed("no projcache scheduler in pg_stat_activity to terminate")
            t = time.monotonic()
            c.query(f"SELECT pg_terminate_backend({old})")
            self.event(f"scheduler pid {old} terminated (pg_terminate_backend)")
            new = [None]

            def back():
                p = c.value("SELECT worker_pid FROM projcache.stats")
                new[0] = p
                return p is not None and p != old
            try:
                took = wait_until("the scheduler to come back", back, 60)
            except RuntimeError as e:
                self.kills.append((t, None, old, None))
                raise Failed(str(e))
            self.kills.append((t, t + took, old, new[0]))
            self.event(f"scheduler back as pid {new[0]} after {took:.1f} s")
            c.close()
        self.sleep_until(end)

    def fault_scan(self, end):
        ctx = mp.get_context("fork")
        spread = max(1.0, end - time.monotonic())
        p = ctx.Process(target=scanner, args=(self.scan_stop, spread, self.scan_progress), daemon=True)
        t = time.monotonic()
        p.start()
        self.scan_proc = p
        self.event(f"scan of {COLD} cold keys started, {CHUNK} a statement, "
                   + (f"{SCAN_RATE:g} keys/s" if SCAN_RATE > 0 else "unthrottled")
                   + (f", looping for {spread:.0f} s" if SCAN_LOOP else ", one pass"))
        # The scan ends the window, if it takes longer than planned (within
        # four times that and 5 minutes).
        limit = t + max(4 * spread, spread + 300)
        while p.is_alive() and time.monotonic() < limit:
            self.check_procs()
            p.join(0.5)
        if p.is_alive():
            self.scan_stop.value = 1    # it is not waited for longer
            p.join(30)
            raise Failed(f"the scan did not end within {limit - t:.0f} s "
                         f"({self.scan_progress[0]} of {(COLD + CHUNK - 1) // CHUNK} statements)")
        if p.exitcode != 0:
            raise Failed(f"the scanner died (exit {p.exitcode})")
        self.scan_span = (t, time.monotonic())
        self.event(f"scan ended after {time.monotonic() - t:.1f} s")
        self.sleep_until(end)

    def fault_restart(self, end):
        self.source_stop()
        start = time.monotonic()
        span = end - start
        for k in range(3):
            self.sleep_until(start + k * span / 3)
            t = time.monotonic()
            took = pg_ctl(CACHE_DATA, "restart", "-m", "fast", log=f"{WORK}/cache.log")
            self.restarts.append((t, t + took))
            self.event(f"cache restarted (pg_ctl restart -m fast, {took:.1f} s)")
            c = None

            def worker():
                nonlocal c
                try:
                    c = c or cache()
                    return c.value("SELECT worker_pid IS NOT NULL FROM projcache.stats") == "t"
                except (OSError, PgError, ConnLost):
                    if c is not None:
                        c.close()
                    c = None
                    raise
            try:
                w = wait_until("the restarted cache's worker", worker, 60)
            except RuntimeError as e:
                raise Failed(str(e))
            c.close()
            self.event(f"cache's worker up {w:.1f} s later")
        self.sleep_until(end)
        self.source_start()

    # -- the run

    def plan(self):
        quiet = TOTAL / (1 + 3 * len(FAULTS))
        plan = [("quiet", None, quiet)]
        for f in FAULTS:
            plan.append((FAULT_NAMES[f], f, 2 * quiet))
            plan.append(("quiet", None, quiet))
        return plan

    def run(self):
        self.warm_up()
        self.start_readers()
        self.t0 = time.monotonic()
        out(f"readers running; {TOTAL:.0f} s of windows (times from now)")
        try:
            for name, fault, length in self.plan():
                start = time.monotonic()
                self.windows.append([name, fault, start, None])
                out(f"  window {len(self.windows)}: {name} ({length:.0f} s planned)")
                if fault is None:
                    self.sleep_until(start + length)
                else:
                    getattr(self, f"fault_{fault}")(start + length)
                self.windows[-1][3] = time.monotonic()
        except (Failed, RuntimeError, OSError, PgError, ConnLost) as e:
            self.failures.append(f"window {len(self.windows)} ({self.windows[-1][0]}): {e}")
            out(f"MEASUREMENT FAILED: {self.failures[-1]}")
            if self.windows and self.windows[-1][3] is None:
                self.windows[-1][3] = time.monotonic()
        finally:
            self.shut_down()

    def shut_down(self):
        self.stop.value = 1
        self.scan_stop.value = 1
        for name, p in self.procs + ([("scanner", self.scan_proc)] if self.scan_proc else []):
            p.join(30)
            if p.is_alive():
                self.failures.append(f"{name} still in a read 30 s after the end: terminated")
                p.terminate()
                p.join(10)
            elif p.exitcode != 0:
                self.failures.append(f"{name} exited with {p.exitcode}")
        # Whatever failed, the source is left running and fast.
        try:
            if not os.path.exists(f"{SOURCE_DATA}/postmaster.pid"):
                self.source_start()
            self.set_slow(0)
        except (RuntimeError, OSError, PgError, ConnLost) as e:
            self.failures.append(f"the source could not be made normal again: {e}")


# ------------------------------------------------------------ the report

def pct(v, q):
    return v[min(len(v) - 1, int(q * (len(v) - 1) + 0.5))]


def ms(x):
    if x >= 10:
        return f"{x * 1000:.0f}"
    return f"{x * 1000:.1f}" if x >= 0.1 else f"{x * 1000:.2f}"


class Tally:
    """Reads of one kind in one window (or one bucket)."""

    def __init__(self):
        self.reads = self.empty = self.errors = self.lost = 0
        self.lat = array.array("f")
        self.err_kinds = {}
        self.warn_kinds = {}
        self.lost_kinds = {}
        self.empty_keys = set()
        self.empty_first = self.empty_last = None

    def add(self, lat, result, err, warn, t=0.0, key=0):
        if result == LOST:
            self.lost += 1
            self.lost_kinds[err] = self.lost_kinds.get(err, 0) + 1
            return
        self.reads += 1
        self.lat.append(lat)
        if result == EMPTY:
            self.empty += 1
            if key:
                self.empty_keys.add(key)
            if self.empty_first is None or t < self.empty_first:
                self.empty_first = t
            if self.empty_last is None or t > self.empty_last:
                self.empty_last = t
        elif result == ERROR:
            self.errors += 1
            self.err_kinds[err] = self.err_kinds.get(err, 0) + 1
        if warn:
            self.warn_kinds[warn] = self.warn_kinds.get(warn, 0) + 1

    def lat_cols(self):
        if not self.lat:
            return f"{'-':>7} {'-':>7} {'-':>7}"
        v = sorted(self.lat)
        return f"{ms(pct(v, 0.5)):>7} {ms(pct(v, 0.99)):>7} {ms(v[-1]):>7}"


class Records:
    """Every record of every process, in arrays (millions of them); each
    pass over them yields (t, lat, kind, result, err, warn, who), with err
    and warn as text (or None) and who the process's number."""

    def __init__(self):
        self.t, self.lat = array.array("d"), array.array("f")
        self.kind, self.result, self.who = array.array("B"), array.array("B"), array.array("B")
        self.err, self.warn, self.key = array.array("I"), array.array("I"), array.array("I")
        self.texts = [None]
        self.ranges = {}
        for who, name in enumerate([f"reader{i}" for i in range(CLIENTS)] + ["scanner"]):
            path = f"{WORK}/{name}"
            if not os.path.exists(path + ".rec"):
                continue
            try:
                with open(path + ".kinds") as f:
                    kinds = {int(k): v for k, v in json.load(f).items()}
            except (OSError, ValueError):
                kinds = {}
            ids = {0: 0}
            for k, v in kinds.items():
                ids[k] = len(self.texts)
                self.texts.append(v)
            with open(path + ".rec", "rb") as f:
                data = f.read()
            lo = len(self.t)
            for t, lat, kind, result, err, warn, key in REC.iter_unpack(data[:len(data) - len(data) % REC.size]):
                self.t.append(t)
                self.lat.append(lat)
                self.kind.append(kind)
                self.result.append(result)
                self.err.append(ids.get(err, 0))
                self.warn.append(ids.get(warn, 0))
                self.who.append(who)
                self.key.append(key)
            self.ranges[who] = (lo, len(self.t))

    def between(self, s, e):
        """The records of [s, e): each process's are in time order."""
        tx = self.texts
        for lo, hi in self.ranges.values():
            j = bisect.bisect_left(self.t, s, lo, hi)
            while j < hi and self.t[j] < e:
                yield (self.t[j], self.lat[j], self.kind[j], self.result[j], tx[self.err[j]],
                       tx[self.warn[j]], self.who[j], self.key[j])
                j += 1

    def first_after_break(self, who, s, e):
        """For reader who, in [s, e): once its connection broke (a read lost
        or a connection attempt failed), when its first read returned (NULL
        or a value), its first non-NULL hot read, its first full snapshot
        read; and 1 if it broke at all."""
        if who not in self.ranges:
            return None, None, None, 0
        lo, hi = self.ranges[who]
        j = bisect.bisect_left(self.t, s, lo, hi)
        broke = False
        first = hot = snap = None
        while j < hi and self.t[j] < e:
            kind, res = self.kind[j], self.result[j]
            if not broke:
                broke = kind == CONNECT or res == LOST
            elif kind in (HOT_READ, SNAP_READ) and res in (OK, EMPTY):
                done = self.t[j] + self.lat[j]
                first = first or done
                if kind == HOT_READ and res == OK and hot is None:
                    hot = done
                if kind == SNAP_READ and res == OK and snap is None:
                    snap = done
                if hot is not None and snap is not None:
                    break
            j += 1
        return first, hot, snap, int(broke)

    def __iter__(self):
        tx = self.texts
        for t, lat, kind, result, err, warn, who, key in zip(self.t, self.lat, self.kind, self.result,
                                                              self.err, self.warn, self.who, self.key):
            yield t, lat, kind, result, tx[err], tx[warn], who, key


def load_samples():
    rows = []
    try:
        with open(f"{WORK}/samples.jsonl") as f:
            for line in f:
                rows.append(json.loads(line))
    except OSError:
        pass
    return rows


def counter_growth(samples, col, s, e):
    """Growth of a counter over [s, e), across server restarts (a counter
    that went down started again from 0)."""
    i = STATS_COLS.index(col) + 1
    prev, total = None, 0
    for row in samples:
        if row[0] >= e or row[i] is None:
            continue
        v = int(row[i])
        if prev is not None and row[0] >= s:
            total += v - prev if v >= prev else v
        prev = v
    return total


def report(soak):
    recs = Records()
    samples = load_samples()
    lines = []
    w = soak.windows
    starts = [x[2] for x in w]
    hot = [Tally() for _ in w]
    snap = [Tally() for _ in w]
    scan = [Tally() for _ in w]
    conn_fail = [dict() for _ in w]
    BUCKET = 5.0
    buckets = {}                        # (window, bucket) -> [hot, snap, connfail]
    for t, lat, kind, result, err, warn, who, key in recs:
        i = bisect.bisect_right(starts, t) - 1
        if i < 0 or t >= w[i][3]:
            continue
        if kind == CONNECT:
            conn_fail[i][err] = conn_fail[i].get(err, 0) + 1
        else:
            (hot if kind == HOT_READ else snap if kind == SNAP_READ else scan)[i].add(lat, result, err, warn, t, key)
        if w[i][1] is not None:
            b = buckets.setdefault((i, int((t - w[i][2]) // BUCKET)), [Tally(), Tally(), 0])
            if kind == HOT_READ:
                b[0].add(lat, result, err, warn, t, key)
            elif kind == SNAP_READ:
                b[1].add(lat, result, err, warn, t, key)
            elif kind == CONNECT:
                b[2] += 1

    def head():
        return (f"{'':3} {'window':22} {'secs':>5} | {'hot reads':>9} {'/s':>6} {'NULL':>7} {'NULL %':>6} "
                f"{'errors':>6} {'lost':>4} {'p50 ms':>7} {'p99 ms':>7} {'max ms':>7} | "
                f"{'snapshot':>8} {'!=' + str(GRANT_ROWS):>5} {'errors':>6} {'lost':>4} "
                f"{'p50 ms':>7} {'p99 ms':>7} {'max ms':>7} | {'conn fail':>9}")
    lines.append("Per window (reads: statements that returned; NULL: get() gave NULL; for the snapshot,")
    lines.append(f"  '!={GRANT_ROWS}': count(*) other than {GRANT_ROWS}; errors: ERRORs returned; lost: reads in flight when")
    lines.append("  the connection broke, not counted as reads; conn fail: failed connection attempts, not")
    lines.append("  counted as reads; latency over the reads, errors included)")
    lines.append(head())
    for i, (name, fault, s, e) in enumerate(w):
        h, sn = hot[i], snap[i]
        secs = e - s
        nullpct = f"{100 * h.empty / h.reads:.3f}" if h.reads else "-"
        lines.append(
            f"{i + 1:>2}. {name:22} {secs:5.0f} | {h.reads:9d} {h.reads / secs if secs else 0:6.0f} {h.empty:7d} {nullpct:>6} "
            f"{h.errors:6d} {h.lost:4d} {h.lat_cols()} | "
            f"{sn.reads:8d} {sn.empty:5d} {sn.errors:6d} {sn.lost:4d} {sn.lat_cols()} | "
            f"{sum(conn_fail[i].values()):9d}")
    lines.append("")
    lines.append(f"target: {HOT} hot reads a second (each key about once a second) and {HOT / 7:.0f} snapshot reads")

    lines.append("")
    lines.append("NULLs, errors, warnings, lost reads and failed connections, per window (count × SQLSTATE message):")
    anything = False
    for i, (name, fault, s, e) in enumerate(w):
        items = []
        if hot[i].empty:
            items.append(f"hot NULL       {hot[i].empty:7d} reads of {len(hot[i].empty_keys)} distinct keys, "
                         f"from {hot[i].empty_first - s:.1f} s to {hot[i].empty_last - s:.1f} s into the window")
        if snap[i].empty:
            items.append(f"snapshot !={GRANT_ROWS}  {snap[i].empty:7d} reads, "
                         f"from {snap[i].empty_first - s:.1f} s to {snap[i].empty_last - s:.1f} s into the window")
        for label, tal in (("hot", hot[i]), ("snapshot", snap[i]), ("scan", scan[i])):
            for k, n in sorted(tal.err_kinds.items(), key=lambda x: -x[1]):
                items.append(f"{label} error    {n:7d} × {k}")
            for k, n in sorted(tal.warn_kinds.items(), key=lambda x: -x[1]):
                items.append(f"{label} warning  {n:7d} × {k}")
            for k, n in sorted(tal.lost_kinds.items(), key=lambda x: -x[1]):
                items.append(f"{label} lost     {n:7d} × {k}")
        for k, n in sorted(conn_fail[i].items(), key=lambda x: -x[1]):
            items.append(f"conn fail      {n:7d} × {k}")
        if items:
            anything = True
            lines.append(f"{i + 1:>2}. {name}")
            lines.extend("      " + x for x in items)
    if not anything:
        lines.append("    none")

    lines.append("")
    lines.append("projcache.stats over each window (growth of the counters; entries, memory and the 1-minute")
    lines.append("load average as sampled at the window's end; the snapshot's statuses, each one sampled in it):")
    cols = ["fetch_calls", "fetched_keys", "not_modified", "fetch_errors", "evictions_memory",
            "evictions_expired", "refused_reads", "dropped_fetches"]
    short = ["calls", "keys", "not_mod", "errors", "ev_mem", "ev_exp", "refused", "dropped"]
    lines.append(f"{'':3} {'window':22} " + " ".join(f"{c:>8}" for c in short)
                 + f" {'entries':>8} {'MB':>6} {'load':>5}  snapshot statuses seen")
    for i, (name, fault, s, e) in enumerate(w):
        inside = [r for r in samples if s <= r[0] < e]
        last = inside[-1] if inside else None
        snaps = []
        for r in inside:
            st = (r[13] or "none").split(" ")[0]
            if st not in snaps:
                snaps.append(st)
        lines.append(
            f"{i + 1:>2}. {name:22} " + " ".join(f"{counter_growth(samples, c, s, e):8d}" for c in cols)
            + f" {last[1] if last else '-':>8} {(int(last[2]) / 1048576 if last else 0):6.1f} "
            + f"{(f'{last[-1]:.1f}' if last else '-'):>5}  "
            + (", ".join(snaps) if snaps else "-"))

    # Restarts and kills: how long until reads came back.
    if soak.restarts:
        lines.append("")
        lines.append("Cache restarts: pg_ctl restart -m fast, with the source down.  'up': until pg_ctl returned")
        lines.append("(the server accepts connections).  The next times are from the restart's start to each")
        lines.append("reader's first read that returned (NULL included) once its connection broke: the")
        lines.append("earliest reader's and the last one's; then the first non-NULL hot read and the first")
        lines.append("snapshot read of all its rows.  Then what the readers saw until the next restart (or 30 s),")
        lines.append("and the most stats.loaded_keys sampled meanwhile.")
        for k, (tb, tu) in enumerate(soak.restarts):
            nxt = soak.restarts[k + 1][0] if k + 1 < len(soak.restarts) else tb + 30
            firsts, first_hot, first_snap, broken = [], None, None, 0
            for who in range(CLIENTS):
                f, h, sn, b = recs.first_after_break(who, tb, nxt)
                broken += b
                if f is not None:
                    firsts.append(f)
                if h is not None and (first_hot is None or h < first_hot):
                    first_hot = h
                if sn is not None and (first_snap is None or sn < first_snap):
                    first_snap = sn
            after = [Tally(), Tally()]
            fails = lost = 0
            for t, lat, kind, result, err, warn, who, key in recs.between(tb, nxt):
                if kind == CONNECT:
                    fails += 1
                elif kind in (HOT_READ, SNAP_READ):
                    after[kind].add(lat, result, err, warn, t, key)
                    lost += result == LOST
            loaded = [int(r[STATS_COLS.index("loaded_keys") + 1]) for r in samples
                      if tb <= r[0] < nxt and r[STATS_COLS.index("loaded_keys") + 1] is not None]

            def rel(x):
                return f"{x - tb:.2f} s" if x is not None else "never"
            every = max(firsts) if len(firsts) == CLIENTS else None
            lines.append(
                f"  restart {k + 1}: up {tu - tb:.2f} s; first read {rel(min(firsts) if firsts else None)}, "
                f"every reader's {rel(every)} ({broken} of {CLIENTS} readers saw their connection break); "
                f"first non-NULL hot read {rel(first_hot)}; first full snapshot read {rel(first_snap)}")
            lines.append(
                f"             in {nxt - tb:.0f} s: {after[0].reads} hot reads, {after[0].empty} NULL, "
                f"{after[0].errors} errors; {after[1].reads} snapshot reads, {after[1].empty} not {GRANT_ROWS} rows, "
                f"{after[1].errors} errors; {lost} reads lost in flight; {fails} failed connection attempts; "
                f"loaded_keys {max(loaded) if loaded else '-'}")
            if after[0].empty:
                nk = sorted(after[0].empty_keys)
                lines.append(
                    f"             NULL reads from {after[0].empty_first - tb:.2f} s to {after[0].empty_last - tb:.2f} s, "
                    f"{len(nk)} distinct keys: " + ", ".join(f"hot{x}" for x in nk[:8]) + (" ..." if len(nk) > 8 else ""))
    if soak.kills:
        lines.append("")
        lines.append("Worker kills (until the next kill or 20 s after):")
        for k, (tk, tback, old, new) in enumerate(soak.kills):
            nxt = soak.kills[k + 1][0] if k + 1 < len(soak.kills) else tk + 20
            after = [Tally(), Tally()]
            for t, lat, kind, result, err, warn, who, key in recs.between(tk, nxt):
                if kind in (HOT_READ, SNAP_READ):
                    after[kind].add(lat, result, err, warn, t, key)
            back = f"back as pid {new} after {tback - tk:.1f} s" if tback else "NOT back"
            lines.append(
                f"  kill {k + 1}: pid {old}, {back}; {after[0].reads} hot reads, {after[0].empty} NULL, "
                f"{after[0].errors} errors; {after[1].reads} snapshot reads, {after[1].errors} errors")
    if soak.scan_span:
        tal = Tally()
        for t, lat, kind, result, err, warn, who, key in recs:
            if kind == SCAN_READ:
                tal.add(lat, result, err, warn, t, key)
        lines.append("")
        lines.append(f"Scan: {tal.reads} statements of {CHUNK} cold keys in "
                     f"{soak.scan_span[1] - soak.scan_span[0]:.1f} s, {tal.errors} errors, {tal.lost} lost; "
                     f"latency p50/p99/max {tal.lat_cols().split()[0]}/{tal.lat_cols().split()[1]}/"
                     f"{tal.lat_cols().split()[2]} ms")

    lines.append("")
    lines.append(f"Per {BUCKET:.0f} s in the fault windows (s: from the window's start; stats: growth of fetch_calls,")
    lines.append("fetch_errors and dropped_fetches, and entries at its end; load: the 1-minute load average):")
    lines.append(f"{'window':22} {'s':>4} | {'hot':>7} {'NULL':>6} {'errors':>6} {'lost':>4} {'p99 ms':>7} {'max ms':>7} | "
                 f"{'snap':>5} {'!=' + str(GRANT_ROWS):>5} {'errors':>6} {'max ms':>7} | {'conn fail':>9} | "
                 f"{'calls':>5} {'f_err':>5} {'dropped':>7} {'entries':>7} {'load':>5}")
    for i, (name, fault, s, e) in enumerate(w):
        if fault is None:
            continue
        for b in range(int((e - s) // BUCKET) + 1):
            if (i, b) not in buckets:
                continue
            h, sn, cf = buckets[(i, b)]
            hl = h.lat_cols().split()
            sl = sn.lat_cols().split()
            bs, be = s + b * BUCKET, min(e, s + (b + 1) * BUCKET)
            last = [r for r in samples if bs <= r[0] < be][-1:]
            ent = last[0][1] if last else "-"
            load = f"{last[0][-1]:.1f}" if last else "-"
            lines.append(f"{(name if b == 0 else ''):22} {b * BUCKET:4.0f} | {h.reads:7d} {h.empty:6d} {h.errors:6d} "
                         f"{h.lost:4d} {hl[1]:>7} {hl[2]:>7} | {sn.reads:5d} {sn.empty:5d} {sn.errors:6d} {sl[2]:>7} | {cf:9d} | "
                         + " ".join(f"{counter_growth(samples, c, bs, be):{wd}d}" for c, wd in
                                    (("fetch_calls", 5), ("fetch_errors", 5), ("dropped_fetches", 7)))
                         + f" {ent:>7} {load:>5}")

    lines.append("")
    lines.append("Events (s from the first window's start):")
    for t, wi, text in soak.events:
        lines.append(f"  {t - soak.t0:7.1f}  [{wi + 1}] {text}")
    for i, (name, fault, s, e) in enumerate(w):
        if fault is not None and hot[i].reads == 0:
            soak.failures.append(f"window {i + 1} ({name}): no hot read returned")
        if fault is not None and snap[i].reads == 0:
            soak.failures.append(f"window {i + 1} ({name}): no snapshot read returned")
    if len(w) < 1 + 2 * len(FAULTS):
        soak.failures.append(f"only {len(w)} of {1 + 2 * len(FAULTS)} windows ran")
    return lines


def main():
    for f in FAULTS:
        if f not in FAULT_NAMES:
            raise SystemExit(f"soak.py: no fault {f!r} (known: {' '.join(FAULT_NAMES)})")
    soak = Soak()
    soak.t0 = time.monotonic()
    signal.signal(signal.SIGTERM, on_term)
    try:
        soak.run()
    except KeyboardInterrupt:
        soak.stop.value = 1
        raise
    except (Failed, RuntimeError, OSError, PgError, ConnLost) as e:
        soak.failures.append(f"before the windows: {e}")
        soak.shut_down()
    lines = report(soak) if soak.windows else []
    if soak.failures:
        lines = ["MEASUREMENT FAILED:"] + ["  " + f for f in soak.failures] + [""] + lines
    with open(REPORT, "w") as f:
        f.write("\n".join(lines) + "\n")
    sys.exit(1 if soak.failures else 0)


if __name__ == "__main__":
    main()
