#!/usr/bin/env python3
"""bench/peers.py - projcache, Redis and memcached on the same traces.

Run by bench/peers.sh, which builds and installs projcache, starts the
PostgreSQL cluster with bench/peers.sql loaded, and passes its whereabouts
in the environment (PEERS_PGBIN, PEERS_DATA, PEERS_SOCK, PEERS_PORT,
PEERS_WORK, PEERS_RUN_USER).  This script starts and stops every cache
itself: it restarts the cluster with projcache.max_memory set to the bound
(which also empties the cache), and starts a fresh redis-server
(allkeys-lru, then allkeys-lfu) and a fresh memcached for each trace, each
on a unix socket in PEERS_WORK, run by PEERS_RUN_USER, with the same bound.

Every cache is used read-through by one client that replays the same
reads, paced the same way: a round is 10 bursts, one every 100 ms.
Redis and memcached: GET, and on a miss the value from the source (the same
text public.upstream holds, made here) and SET.  projcache: get() in one
backend (public.peers_burst, a burst per statement); a miss is its NULL,
and its worker fetches the value from public.upstream.

It speaks PostgreSQL's, Redis's and memcached's protocols over sockets
itself (standard library only).  It asserts nothing: it prints each round's
hit ratio and keys held per cache, a summary per trace, and the bytes per
key of values of 100 B, 1 kB and 4 kB.

    PEERS_SCALES="8 32" PEERS_TRACES="shift zipf scan moving" bench/peers.py
"""
import bisect
import hashlib
import os
import random
import socket
import struct
import subprocess
import sys
import time

ROUNDS = 10
BURSTS = 10              # bursts a round
BURST_GAP = 0.1          # seconds between burst starts
BASE_KEYS = 50000        # keys of the 8 MB scale; 32 MB has four times
BASE_READS = 5000        # reads a round at 8 MB
BYTES_KEYS = 5000        # keys per value size for the bytes per key
BYTES_MB = 64            # the bound while measuring bytes per key
FILL_MBS = (8, 64)       # the bounds of the keys held
FILL_OVERHEAD = 60       # less than any cache's cost per key beside its value
FILL_SLICE = 5000        # keys projcache reads per statement
FILL_PIPE = 50           # SETs per round trip to Redis and memcached

ENV = os.environ
PGBIN = ENV.get("PEERS_PGBIN", "/usr/lib/postgresql/15/bin")
DATA = ENV.get("PEERS_DATA", "")
SOCK = ENV.get("PEERS_SOCK", "")
PORT = int(ENV.get("PEERS_PORT", "54342"))
WORK = ENV.get("PEERS_WORK", "/tmp")
RUN_USER = ENV.get("PEERS_RUN_USER", "postgres")
AS_USER = ["runuser", "-u", RUN_USER, "--"] if os.geteuid() == 0 else []


def out(line=""):
    print(line, flush=True)


# ------------------------------------------------------------ the source

def md5hex(s):
    return hashlib.md5(s.encode()).hexdigest()


def trace_value(i):
    """The config of key k<i>, as public.upstream prints it."""
    pad = "".join(md5hex(f"{i}-{j}") for j in range(1, 31))
    return f'{{"i": {i}, "pad": "{pad}"}}'.encode()


def fill_value(key):
    """The config of key f<size>-<i>: exactly size bytes of text, its pad
    the key's md5 repeated (public.fill_config)."""
    size, i = key[1:].split("-")
    head = f'{{"i": {int(i)}, "pad": ""}}'
    pad = (md5hex(key) * 130)[:int(size) - len(head)]
    return f'{{"i": {int(i)}, "pad": "{pad}"}}'.encode()


def sized_value(i, size):
    """The config of key b<size>-<i>: exactly size bytes of text."""
    head = f'{{"i": {i}, "pad": ""}}'
    pad = "".join(md5hex(f"{i}-{j}") for j in range(1, 131))[:size - len(head)]
    return f'{{"i": {i}, "pad": "{pad}"}}'.encode()


SOURCE = {}


def source(key):
    """What the source holds for key; made once per key (a fetch from the
    source is not what is measured)."""
    v = SOURCE.get(key)
    if v is None:
        if key[0] == "k":
            v = trace_value(int(key[1:]))
        elif key[0] == "f":
            return fill_value(key)          # many, each written once
        else:
            size, i = key[1:].split("-")
            v = sized_value(int(i), int(size))
        SOURCE[key] = v
    return v


# ------------------------------------------------------------ PostgreSQL

class Pg:
    """The frontend/backend protocol, simple queries, trust authentication."""

    def __init__(self, sockdir, port, user="postgres", db="postgres"):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.connect(f"{sockdir}/.s.PGSQL.{port}")
        self.rf = self.sock.makefile("rb")
        body = struct.pack("!i", 196608)
        for k, v in (("user", user), ("database", db), ("application_name", "peers")):
            body += k.encode() + b"\0" + v.encode() + b"\0"
        body += b"\0"
        self.sock.sendall(struct.pack("!i", len(body) + 4) + body)
        self._until_ready()

    def _msg(self):
        head = self.rf.read(5)
        if len(head) < 5:
            raise RuntimeError("PostgreSQL closed the connection")
        kind, length = head[:1], struct.unpack("!i", head[1:])[0]
        return kind, self.rf.read(length - 4)

    def _until_ready(self):
        rows, error = [], None
        while True:
            kind, body = self._msg()
            if kind == b"R":
                if struct.unpack("!i", body[:4])[0] != 0:
                    raise RuntimeError("PostgreSQL asks for a password: the cluster must trust")
            elif kind == b"D":
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
                fields = dict((f[:1], f[1:].decode()) for f in body.split(b"\0") if f)
                error = f"{fields.get(b'S', '')}: {fields.get(b'M', '')} ({fields.get(b'C', '')})"
            elif kind == b"Z":
                if error:
                    raise RuntimeError(error)
                return rows

    def query(self, sql):
        body = sql.encode() + b"\0"
        self.sock.sendall(b"Q" + struct.pack("!i", len(body) + 4) + body)
        return self._until_ready()

    def value(self, sql):
        return self.query(sql)[0][0]

    def close(self):
        try:
            self.sock.sendall(b"X" + struct.pack("!i", 4))
        except OSError:
            pass
        self.sock.close()


def pg_ctl(*args):
    subprocess.run(AS_USER + [f"{PGBIN}/pg_ctl", *args, "-D", DATA, "-w", "-t", "60"],
                   check=True, stdout=subprocess.DEVNULL)


def wait_until(what, cond, timeout=60.0):
    deadline = time.monotonic() + timeout
    while True:
        try:
            if cond():
                return
        except (OSError, RuntimeError):
            pass
        if time.monotonic() > deadline:
            raise RuntimeError(f"gave up waiting for {what} after {timeout:.0f} s")
        time.sleep(0.05)


# ------------------------------------------------------------ the caches

class Projcache:
    label = "projcache"

    def start(self, mb):
        # max_memory is a postmaster setting: a restart sets it and empties
        # the cache.
        with open(f"{DATA}/peers.conf", "w") as f:
            f.write(f"projcache.max_memory = '{mb}MB'\n")
        pg_ctl("stop", "-m", "fast")
        pg_ctl("start", "-l", f"{WORK}/server.log", "-o", f"-p {PORT} -k {SOCK}")
        self.pg = None

        def up():
            self.pg = Pg(SOCK, PORT)
            return self.pg.value("SELECT worker_pid IS NOT NULL FROM projcache.stats") == "t"
        wait_until("projcache's worker", up)
        limit = int(self.pg.value("SELECT memory_limit FROM projcache.stats"))
        assert limit == mb << 20, f"memory_limit {limit}, not {mb} MB"

    def burst(self, reads):
        keys = ",".join(k for k, _ in reads)
        counted = ",".join("t" if c else "f" for _, c in reads)
        h, n, f = self.pg.query(
            f"SELECT * FROM public.peers_burst('{{{keys}}}'::text[], '{{{counted}}}'::bool[])")[0]
        return int(h), int(n), int(f)

    def held(self):
        e, m = self.pg.query("SELECT entries, memory_used FROM projcache.stats")[0]
        return int(e), int(m)

    def load(self, keys):
        ks = ",".join(keys)
        self.pg.query(f"SELECT count(projcache.get(k)) FROM unnest('{{{ks}}}'::text[]) k")
        got = int(self.pg.value(
            f"SELECT count(projcache.get(k, '30s')) FROM unnest('{{{ks}}}'::text[]) k"))
        vb = self.pg.value(f"SELECT round(avg(value_bytes)) FROM projcache.entries "
                           f"WHERE key = ANY ('{{{ks}}}'::text[])")
        return got, f"value_bytes {vb}"

    def fill(self, keys):
        """Read every key once, a slice at a time, each slice fetched (or
        dropped) before the next; then wait for the worker to settle."""
        for i in range(0, len(keys), FILL_SLICE):
            ks = ",".join(keys[i:i + FILL_SLICE])
            self.pg.query(f"SELECT count(projcache.get(k)) FROM unnest('{{{ks}}}'::text[]) k")
            wait_until("projcache's fetches", lambda: self.pg.value(
                "SELECT count(*) FROM projcache.entries WHERE state = 'pending'") == "0", 300)
        return self.pg.value("SELECT 'fetch_errors ' || fetch_errors || ', refused_reads ' "
                             "|| refused_reads || ', dropped_fetches ' || dropped_fetches "
                             "FROM projcache.stats")

    def extra(self):
        return self.pg.value("SELECT 'evictions_memory ' || evictions_memory || ', refused_reads ' "
                             "|| refused_reads || ', fetch_errors ' || fetch_errors FROM projcache.stats")

    def stop(self):
        if self.pg:
            self.pg.close()
            self.pg = None


class Server:
    """A cache server of our own on a unix socket, run by RUN_USER."""

    proc = None
    conn = None

    def spawn(self, argv, path):
        if os.path.exists(path):
            os.unlink(path)
        kw = {"user": RUN_USER} if os.geteuid() == 0 else {}
        self.log = open(f"{WORK}/{self.tag}.log", "ab")
        self.proc = subprocess.Popen(argv, stdout=self.log, stderr=subprocess.STDOUT, **kw)

        def up():
            if self.proc.poll() is not None:
                raise SystemExit(f"{argv[0]} exited with {self.proc.returncode}; see {WORK}/{self.tag}.log")
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.connect(path)
            self.conn = s
            self.rf = s.makefile("rb")
            return True
        wait_until(argv[0], up, 20)

    def stop(self):
        if self.conn:
            self.conn.close()
            self.conn = None
        if self.proc:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
            self.proc = None
            self.log.close()

    def burst(self, reads):
        hits = n = 0
        for key, counted in reads:
            hit = self.get(key) is not None
            if not hit:
                self.set(key, source(key))
            if counted:
                n += 1
                hits += hit
        return hits, n, 0


class Pipelined:
    """Writes of many keys, FILL_PIPE commands a round trip: few enough
    that the server's replies never fill the socket while it waits for us
    to read them, and we for it to read our commands."""

    def fill(self, keys):
        for i in range(0, len(keys), FILL_PIPE):
            part = keys[i:i + FILL_PIPE]
            self.conn.sendall(b"".join(self.set_command(k, source(k)) for k in part))
            for _ in part:
                if not self.set_ok():
                    self.set_errors += 1
        return f"SET errors {self.set_errors}"


class Redis(Pipelined, Server):
    def __init__(self, policy):
        self.policy = policy
        self.label = f"redis {policy}"
        self.tag = f"redis-{policy}"
        self.set_errors = 0

    def start(self, mb):
        path = f"{WORK}/{self.tag}.sock"
        self.spawn(["redis-server", "--port", "0", "--unixsocket", path, "--unixsocketperm", "700",
                    "--save", "", "--appendonly", "no", "--daemonize", "no",
                    "--maxmemory", f"{mb}mb", "--maxmemory-policy", self.policy], path)
        wait_until("redis PING", lambda: self.cmd("PING") == "PONG", 20)
        self.set_errors = 0

    def cmd(self, *args):
        msg = [b"*%d\r\n" % len(args)]
        for a in args:
            a = a if isinstance(a, bytes) else str(a).encode()
            msg.append(b"$%d\r\n%s\r\n" % (len(a), a))
        self.conn.sendall(b"".join(msg))
        return self._reply()

    def _reply(self):
        line = self.rf.readline()
        kind, rest = line[:1], line[1:-2]
        if kind == b"+":
            return rest.decode()
        if kind == b"-":
            return RuntimeError(rest.decode())
        if kind == b":":
            return int(rest)
        if kind == b"$":
            n = int(rest)
            if n < 0:
                return None
            data = self.rf.read(n + 2)
            return data[:-2]
        if kind == b"*":
            n = int(rest)
            return None if n < 0 else [self._reply() for _ in range(n)]
        raise RuntimeError(f"redis: unexpected reply {line!r}")

    def get(self, key):
        r = self.cmd("GET", key)
        if isinstance(r, Exception):
            raise r
        return r

    def set(self, key, val):
        if isinstance(self.cmd("SET", key, val), Exception):
            self.set_errors += 1

    def set_command(self, key, val):
        return b"*3\r\n$3\r\nSET\r\n$%d\r\n%s\r\n$%d\r\n%s\r\n" % (
            len(key), key.encode(), len(val), val)

    def set_ok(self):
        return not isinstance(self._reply(), Exception)

    def info(self):
        text = self.cmd("INFO", "memory").decode()
        return dict(line.split(":", 1) for line in text.splitlines() if ":" in line)

    def held(self):
        return self.cmd("DBSIZE"), int(self.info()["used_memory"])

    def load(self, keys):
        for k in keys:
            self.set(k, source(k))
        return self.cmd("DBSIZE"), f"STRLEN {len(self.get(keys[0]))}"

    def extra(self):
        stats = self.cmd("INFO", "stats").decode()
        ev = [line for line in stats.splitlines() if line.startswith("evicted_keys:")]
        return f"{ev[0].replace(':', ' ') if ev else 'evicted_keys ?'}, SET errors {self.set_errors}"


class Memcached(Pipelined, Server):
    label = "memcached"
    tag = "memcached"

    def start(self, mb):
        path = f"{WORK}/memcached.sock"
        self.spawn(["memcached", "-s", path, "-a", "0700", "-m", str(mb), "-U", "0"], path)
        self.set_errors = 0

    def get(self, key):
        self.conn.sendall(b"get %s\r\n" % key.encode())
        line = self.rf.readline()
        if line == b"END\r\n":
            return None
        if not line.startswith(b"VALUE "):
            raise RuntimeError(f"memcached: get {key}: {line!r}")
        n = int(line.split()[3])
        data = self.rf.read(n + 2)[:-2]
        if self.rf.readline() != b"END\r\n":
            raise RuntimeError("memcached: no END after VALUE")
        return data

    def set(self, key, val):
        self.conn.sendall(self.set_command(key, val))
        if not self.set_ok():
            self.set_errors += 1

    def set_command(self, key, val):
        return b"set %s 0 0 %d\r\n%s\r\n" % (key.encode(), len(val), val)

    def set_ok(self):
        return self.rf.readline() == b"STORED\r\n"

    def stats(self, what=""):
        self.conn.sendall(f"stats {what}".strip().encode() + b"\r\n")
        st = {}
        while True:
            line = self.rf.readline().decode().rstrip("\r\n")
            if line == "END":
                return st
            _, name, val = line.split(" ", 2)
            st[name] = val

    def held(self):
        st = self.stats()
        return int(st["curr_items"]), int(st["bytes"])

    def load(self, keys):
        for k in keys:
            self.set(k, source(k))
        slabs = self.stats("slabs")
        chunks = sum(int(v) * int(slabs[c.split(":")[0] + ":chunk_size"])
                     for c, v in slabs.items() if c.endswith(":used_chunks"))
        items = int(self.stats()["curr_items"])
        return items, f"slab chunks {chunks / items:.0f} B/item" if items else "no items"

    def extra(self):
        st = self.stats()
        return f"evictions {st['evictions']}, SET errors {self.set_errors}"


# ------------------------------------------------------------ traces

def spread(reads):
    """A round's reads as BURSTS bursts."""
    per = len(reads) // BURSTS
    return [reads[b * per:(b + 1) * per] for b in range(BURSTS)]


def trace_shift(f):
    """The issue's trace: 80 % on 5,000 f hot keys, 20 % on all; the hot
    set moves to other keys after round 6."""
    n, hot, r = BASE_KEYS * f, 5000 * f, BASE_READS * f
    rounds = []
    for rnd in range(ROUNDS):
        rng = random.Random(1000 + rnd)
        base = 1 if rnd < 6 else n // 2 + 1
        reads = [(base + rng.randrange(hot)) if rng.random() < 0.8 else 1 + rng.randrange(n)
                 for _ in range(r)]
        rounds.append(spread([(f"k{k}", True) for k in reads]))
    return rounds, (f"{n:,} keys; {r:,} reads a round, 80 % on {hot:,} hot keys (k1 ..), 20 % on all; "
                    f"from round 7 the hot set is k{n // 2 + 1:,} ..")


def trace_zipf(f):
    """Zipf(0.9) over all keys (rank i is key k<i>)."""
    n, r = BASE_KEYS * f, BASE_READS * f
    cum, t = [], 0.0
    for i in range(1, n + 1):
        t += 1.0 / i ** 0.9
        cum.append(t)
    rounds = []
    for rnd in range(ROUNDS):
        rng = random.Random(2000 + rnd)
        reads = [1 + bisect.bisect_left(cum, rng.random() * t) for _ in range(r)]
        rounds.append(spread([(f"k{min(k, n)}", True) for k in reads]))
    return rounds, f"{n:,} keys; {r:,} reads a round, key rank Zipf(0.9)"


def trace_scan(f):
    """2,500 f hot keys read steadily (each about once a round) while, in
    rounds 4-6, one more client reads 5,000 f cold keys a round, each once.
    The hit ratio counts the hot keys' reads only."""
    n, hot, r, scan = BASE_KEYS * f, 2500 * f, BASE_READS * f // 2, 5000 * f
    nxt = n // 10 + 1
    rounds = []
    for rnd in range(ROUNDS):
        rng = random.Random(3000 + rnd)
        hot_reads = [(f"k{1 + rng.randrange(hot)}", True) for _ in range(r)]
        per = r // BURSTS
        bursts = []
        for b in range(BURSTS):
            burst = hot_reads[b * per:(b + 1) * per]
            if 3 <= rnd <= 5:
                cold = [(f"k{nxt + j}", False) for j in range(scan // BURSTS)]
                nxt += scan // BURSTS
                # the two clients' reads interleaved
                merged, ci = [], 0
                for read in burst:
                    merged.append(read)
                    for _ in range(len(cold) // len(burst)):
                        merged.append(cold[ci])
                        ci += 1
                burst = merged + cold[ci:]
            bursts.append(burst)
        rounds.append(bursts)
    return rounds, (f"{hot:,} hot keys, {r:,} hot reads a round; in rounds 4-6 one more client reads "
                    f"{scan:,} cold keys a round once each (k{n // 10 + 1:,} ..); "
                    f"hit ratio of the hot reads only")


def trace_moving(f):
    """80 % on a 5,000 f-key window that slides by 500 f keys every round."""
    n, hot, r, step = BASE_KEYS * f, 5000 * f, BASE_READS * f, 500 * f
    rounds = []
    for rnd in range(ROUNDS):
        rng = random.Random(4000 + rnd)
        base = 1 + rnd * step
        reads = [(base + rng.randrange(hot)) if rng.random() < 0.8 else 1 + rng.randrange(n)
                 for _ in range(r)]
        rounds.append(spread([(f"k{k}", True) for k in reads]))
    return rounds, (f"{n:,} keys; {r:,} reads a round, 80 % on a {hot:,}-key window that moves by "
                    f"{step:,} keys every round, 20 % on all")


TRACES = {"shift": trace_shift, "zipf": trace_zipf, "scan": trace_scan, "moving": trace_moving}


# ------------------------------------------------------------ replay

def replay(cache, rounds):
    res = []
    worst_late = 0.0
    start = time.monotonic()
    for rnd, bursts in enumerate(rounds):
        # A round starts a second after the last one did, or when the last
        # one ended if it took longer.
        t0 = max(start + rnd, time.monotonic())
        start = t0 - rnd
        hits = reads = failed = 0
        for b, burst in enumerate(bursts):
            due = t0 + b * BURST_GAP
            now = time.monotonic()
            if now < due:
                time.sleep(due - now)
            else:
                worst_late = max(worst_late, now - due)
            h, n, fl = cache.burst(burst)
            hits, reads, failed = hits + h, reads + n, failed + fl
        keys, mem = cache.held()
        res.append({"ratio": hits / reads if reads else 0.0, "keys": keys, "mem": mem,
                    "failed": failed, "reads": reads})
    return res, worst_late


def caches():
    return [Projcache(), Redis("allkeys-lru"), Redis("allkeys-lfu"), Memcached()]


def run_trace(name, f, mb):
    rounds, desc = TRACES[name](f)
    total = sum(len(b) for r in rounds for b in r)
    out(f"--- trace {name}, {mb} MB: {desc}")
    out(f"    {ROUNDS} rounds of {BURSTS} bursts, {BURST_GAP * 1000:.0f} ms apart; "
        f"{total:,} reads in all")
    results = []
    for c in caches():
        c.start(mb)
        try:
            res, late = replay(c, rounds)
            extra = c.extra()
        finally:
            c.stop()
        results.append((c.label, res, late, extra))
    hdr = " ".join(f"{'r' + str(i + 1):>6}" for i in range(ROUNDS))
    out(f"    {'hit ratio':24} {hdr}")
    for label, res, _, _ in results:
        out(f"    {label:24} " + " ".join(f"{x['ratio']:6.3f}" for x in res))
    out(f"    {'keys held (end of round)':24} {hdr}")
    for label, res, _, _ in results:
        out(f"    {label:24} " + " ".join(f"{x['keys']:6d}" for x in res))
    out(f"    {'memory (MB, end of round)':24} {hdr}")
    for label, res, _, _ in results:
        out(f"    {label:24} " + " ".join(f"{x['mem'] / 1048576:6.2f}" for x in res))
    out("    summary                  keys r6  min r4-6     r7     r8     r9    r10  mean r4-10  failed reads")
    for label, res, _, _ in results:
        rs = [x["ratio"] for x in res]
        out(f"    {label:24} {res[5]['keys']:8d}  {min(rs[3:6]):8.3f} "
            + " ".join(f"{x:6.3f}" for x in rs[6:10])
            + f"  {sum(rs[3:]) / len(rs[3:]):10.3f}  {sum(x['failed'] for x in res):12d}")
    for label, _, late, extra in results:
        out(f"    {label}: {extra}; a burst started at most {late * 1000:.0f} ms late")
    out()


def bytes_per_key():
    out(f"--- bytes per key: {BYTES_KEYS:,} keys of each value size into an empty cache "
        f"bounded to {BYTES_MB} MB (nothing evicted)")
    out("    memory is projcache memory_used, Redis used_memory, memcached `stats` bytes; "
        "'empty' is the same before the keys went in")
    out(f"    {'value text':>10}  {'cache':16} {'keys':>6} {'memory':>10} {'empty':>9} "
        f"{'B/key':>7} {'(mem-empty)/key':>16}  note")
    for size in (100, 1024, 4096):
        keys = [f"b{size}-{i}" for i in range(1, BYTES_KEYS + 1)]
        for c in caches()[:2] + caches()[3:]:
            c.start(BYTES_MB)
            try:
                _, empty = c.held()
                got, note = c.load(keys)
                held, mem = c.held()
            finally:
                c.stop()
            out(f"    {size:>8} B  {c.label.split()[0]:16} {held:6d} {mem:10d} {empty:9d} "
                f"{mem / held if held else 0:7.0f} {(mem - empty) / held if held else 0:16.0f}  "
                f"{note}" + ("" if got == len(keys) else f"; only {got} of {len(keys)} loaded"))
    out()


def keys_held():
    """Distinct keys of one value size written into each cache, well past
    what its bound holds; the keys it holds at the end."""
    out(f"--- keys held: distinct keys of one value size written into an empty cache, twice what "
        f"the bound holds at the value's size + {FILL_OVERHEAD} B a key")
    out("    memory is projcache memory_used, Redis used_memory, memcached `stats` bytes; "
        "B/key is the bound over the keys held")
    labels = [c.label for c in caches()]
    out(f"    {'bound':>6} {'value':>7} {'written':>8}  "
        + "  ".join(f"{lb:>18}" for lb in labels) + "  projcache ÷ best peer")
    notes = []
    for mb in FILL_MBS:
        for size in (100, 1024, 4096):
            n = 2 * (mb << 20) // (size + FILL_OVERHEAD)
            keys = [f"f{size}-{i}" for i in range(1, n + 1)]
            held = []
            for c in caches():
                c.start(mb)
                try:
                    note = c.fill(keys)
                    k, mem = c.held()
                finally:
                    c.stop()
                held.append(k)
                notes.append(f"{mb} MB, {size} B, {c.label}: {k:,} keys, memory {mem:,}; {note}")
            best = max(held[1:])
            out(f"    {mb:>3} MB {size:>5} B {n:8d}  "
                + "  ".join(f"{k:8d} ({(mb << 20) / k:5.0f} B)" for k in held)
                + f"  {held[0] / best:8.3f}")
    for line in notes:
        out(f"    {line}")
    out()


def check_source():
    """The values made here are the ones public.upstream holds."""
    pg = Pg(SOCK, PORT)
    try:
        for key in ("k1", "k54321", "k200000", "b100-7", "b1024-4999", "b4096-5000"):
            db = pg.value(f"SELECT config::text FROM public.upstream WHERE key = '{key}'").encode()
            if db != source(key):
                raise SystemExit(f"peers.py: the value of {key} made here is not public.upstream's")
        for key in ("f100-7", "f1024-654321", "f4096-3"):
            db = pg.value(f"SELECT public.fill_config('{key}')::text").encode()
            if db != fill_value(key):
                raise SystemExit(f"peers.py: the value of {key} made here is not public.fill_config's")
    finally:
        pg.close()


def main():
    scales = [int(s) for s in ENV.get("PEERS_SCALES", "8 32").split()]
    traces = ENV.get("PEERS_TRACES", "shift zipf scan moving").split()
    for t in traces:
        if t not in TRACES:
            raise SystemExit(f"peers.py: no trace {t!r} (known: {' '.join(TRACES)})")
    for s in scales:
        if s % 8:
            raise SystemExit("peers.py: a scale is a multiple of 8 MB")
    check_source()
    t0 = time.monotonic()
    for mb in scales:
        for t in traces:
            run_trace(t, mb // 8, mb)
    if ENV.get("PEERS_BYTES", "1") != "0":
        keys_held()
        bytes_per_key()
    out(f"peers.py: {time.monotonic() - t0:.0f} s")


if __name__ == "__main__":
    main()
