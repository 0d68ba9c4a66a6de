#!/usr/bin/env python3
"""bench/working_set_sim.py - eviction policies on the key cache's traces, simulated by count.

Replays four traces against eviction policies and prints, for each trace,
the hit ratio of every round per policy, its steady state (the least of
rounds 4-6) and rounds 8, 9 and 10, beside LRU and Belady's optimum
(which knows the future: the bound no policy can pass).  It asserts
nothing: it tells what a policy allows from what the implementation gives.

Traces (a round is one second: 10 bursts of reads, 100 ms apart):

  spread   bench/working_set.sql's scenario: rounds of 5,000 reads, 80 % on
           a 5,000-key hot set, 20 % over 50,000 keys; the hot set moves
           to 5,000 other keys after round 6.
  zipf     5,000 reads a round over 50,000 keys, Zipf (s = 0.9).
  scan     a hot set of a sixth of the capacity, each key read once a
           round, and in rounds 4-9 a scan that reads twice the capacity
           of cold keys once each (the soak of issue 19: a report or a
           batch job beside steady readers).  Rounds 10-12 are calm.
  moving   the spread trace's shape, but the hot set slides by a fifth of
           itself every round.

Capacity is in keys (memory use is approximated by the count of keys).
A miss creates the key at once, pending: reads of it in the same burst
still miss (the real cache fetches it between bursts), but count as reads
for the policy, as readers mark a pending entry.  Past the high watermark
the cache evicts down to the low one, as keycache_worker.c does.

    python3 bench/working_set_sim.py [capacity] [high] [low] [--sync]

What it showed (capacity 7182): on the scan, LRU and CLOCK lose nine hot
reads in ten while it lasts; SIEVE and S3-FIFO lose none.  After the
spread trace's shift, SIEVE (with or without ghosts) recovers slowest,
LRU fastest; S3-FIFO with a 1-bit mark and a small FIFO of 30 % comes
closest to LRU (0.466 / 0.618 / 0.701 against SIEVE's 0.339 / 0.502 /
0.676), keeps SIEVE's steady state (0.725) and its Zipf hit ratio (above
LRU's), and is second only to LRU on the moving hot set.  So projcache
evicts by it (keycache_policy.c); a 10 % small FIFO, as published, recovers
slower here because hot keys are read about once a round, and the 2-bit
count keeps the old hot set a pass longer.

capacity: keys that fit in max_memory (8 MB / about 1,170 bytes per key of
the scenario, as projcache.stats shows: 7182); high and low: the
watermarks, as shares of it (0.95 and 0.85, as keycache_worker.c); --sync:
a miss is answered at once (no pending keys within a burst).
"""
import heapq
import random
import sys
from collections import OrderedDict, deque


# ----------------------------------------------------------------------
# Policies: read(key) says whether the key is held (and counts the read),
# inserting it if not; evict_to(n) evicts until at most n keys are held.
# ----------------------------------------------------------------------

class Lru:
    name = "LRU"

    def __init__(self, capacity):
        self.keys = OrderedDict()

    def read(self, key, t):
        if key in self.keys:
            self.keys.move_to_end(key)
            return True
        self.keys[key] = True
        return False

    def size(self):
        return len(self.keys)

    def evict_to(self, n, t):
        while len(self.keys) > n:
            self.keys.popitem(last=False)


class Sieve:
    """SIEVE (Zhang et al., NSDI 2024); with ghosts, keys evicted lately
    come back visited (projcache 1.1)."""

    def __init__(self, capacity, ghosts=True):
        self.name = "SIEVE + ghosts (1.1)" if ghosts else "SIEVE"
        self.order = []          # oldest first
        self.visited = {}
        self.hand = 0
        self.ghosts = OrderedDict() if ghosts else None
        self.ghost_max = 2 * capacity

    def read(self, key, t):
        if key in self.visited:
            self.visited[key] = True
            return True
        back = self.ghosts is not None and self.ghosts.pop(key, None) is not None
        self.visited[key] = back
        self.order.append(key)
        return False

    def size(self):
        return len(self.visited)

    def evict_to(self, n, t):
        while len(self.visited) > n:
            if self.hand >= len(self.order):
                self.hand = 0
            key = self.order[self.hand]
            if self.visited[key]:
                self.visited[key] = False
                self.hand += 1
            else:
                del self.visited[key]
                self.order.pop(self.hand)
                if self.ghosts is not None:
                    self.ghosts[key] = True
                    if len(self.ghosts) > self.ghost_max:
                        self.ghosts.popitem(last=False)


class Clock:
    """CLOCK with a 2-bit usage count: a read raises it (up to 3), the hand
    lowers it, a key at 0 is evicted (PostgreSQL's buffer sweep)."""

    def __init__(self, capacity, bits=2):
        self.name = f"CLOCK, {bits}-bit count"
        self.max = (1 << bits) - 1
        self.order = deque()
        self.count = {}

    def read(self, key, t):
        if key in self.count:
            if self.count[key] < self.max:
                self.count[key] += 1
            return True
        self.count[key] = 0
        self.order.append(key)
        return False

    def size(self):
        return len(self.count)

    def evict_to(self, n, t):
        while len(self.count) > n:
            key = self.order.popleft()
            if self.count[key] > 0:
                self.count[key] -= 1
                self.order.append(key)
            else:
                del self.count[key]


class S3Fifo:
    """S3-FIFO (Yang et al., SOSP 2023): new keys enter a small FIFO (a
    tenth of the cache); read again there, they move to the main FIFO
    when the small one evicts, else they leave, remembered in a ghost FIFO
    (as many keys as the main one holds).  A key created again while
    remembered goes to main.  Main is a CLOCK on a 2-bit count."""

    def __init__(self, capacity, small=0.10, bits=2, threshold=1):
        self.name = f"S3-FIFO ({int(small * 100)} %, {bits}-bit)"
        self.capacity = capacity
        self.small_share = small
        self.max = (1 << bits) - 1
        self.threshold = threshold
        self.small = deque()
        self.main = deque()
        self.count = {}
        self.where = {}          # key -> 's' or 'm'
        self.ghosts = OrderedDict()

    def read(self, key, t):
        if key in self.count:
            if self.count[key] < self.max:
                self.count[key] += 1
            return True
        self.count[key] = 0
        if self.ghosts.pop(key, None) is not None:
            self.where[key] = 'm'
            self.main.append(key)
        else:
            self.where[key] = 's'
            self.small.append(key)
        return False

    def size(self):
        return len(self.count)

    def _evict_one(self):
        while True:
            if self.small and (len(self.small) >= self.small_share * len(self.count)
                               or not self.main):
                key = self.small.popleft()
                if self.count[key] >= self.threshold:
                    self.count[key] = 0
                    self.where[key] = 'm'
                    self.main.append(key)
                    continue
                del self.count[key]
                del self.where[key]
                self.ghosts[key] = True
                if len(self.ghosts) > max(len(self.main), 1):
                    self.ghosts.popitem(last=False)
                return
            key = self.main.popleft()
            if self.count[key] > 0:
                self.count[key] -= 1
                self.main.append(key)
                continue
            del self.count[key]
            del self.where[key]
            return

    def evict_to(self, n, t):
        while len(self.count) > n:
            self._evict_one()


class Belady:
    """Belady's MIN: evict the key read again farthest in the future."""

    name = "Belady (optimum)"

    def __init__(self, capacity, next_use):
        self.next_use = next_use     # position -> next position of its key
        self.held = {}               # key -> its next use
        self.heap = []

    def read(self, key, t):
        nxt = self.next_use[t]
        hit = key in self.held
        self.held[key] = nxt
        heapq.heappush(self.heap, (-nxt, key))
        return hit

    def size(self):
        return len(self.held)

    def evict_to(self, n, t):
        while len(self.held) > n:
            nxt, key = heapq.heappop(self.heap)
            if self.held.get(key) == -nxt:
                del self.held[key]


# ----------------------------------------------------------------------
# Traces: a list of rounds, each a list of 10 bursts, each a list of keys.
# ----------------------------------------------------------------------

def bursts(keys):
    n = len(keys)
    return [keys[i * n // 10:(i + 1) * n // 10] for i in range(10)]


def trace_spread(capacity, rounds=10):
    out = []
    for rnd in range(1, rounds + 1):
        rng = random.Random(rnd)
        hot = 1 if rnd <= 6 else 25001
        keys = [hot + rng.randrange(5000) if rng.random() < 0.8
                else 1 + rng.randrange(50000) for _ in range(5000)]
        out.append(bursts(keys))
    return out


def trace_zipf(capacity, rounds=10, n=50000, s=0.9):
    weights = [1.0 / (i ** s) for i in range(1, n + 1)]
    rng = random.Random(42)
    perm = list(range(1, n + 1))
    rng.shuffle(perm)            # popular keys are not the low numbers
    out = []
    for rnd in range(1, rounds + 1):
        keys = [perm[i - 1] for i in rng.choices(range(1, n + 1), weights, k=5000)]
        out.append(bursts(keys))
    return out


def trace_scan(capacity, rounds=12):
    hot_n = capacity // 6
    rng = random.Random(7)
    cold = 10 ** 6
    out = []
    for rnd in range(1, rounds + 1):
        hot = list(range(1, hot_n + 1))
        rng.shuffle(hot)
        keys = [("h", k) for k in hot]
        if 4 <= rnd <= 9:
            scan = [("c", cold + i) for i in range(2 * capacity)]
            cold += 2 * capacity
            merged = []
            # interleave: the scan and the readers run side by side
            hi, si = 0, 0
            total = len(keys) + len(scan)
            for i in range(total):
                if si < len(scan) and (hi >= len(keys) or
                                       si * len(keys) < hi * len(scan)):
                    merged.append(scan[si])
                    si += 1
                else:
                    merged.append(keys[hi])
                    hi += 1
            keys = merged
        out.append(bursts(keys))
    return out


def trace_moving(capacity, rounds=10):
    out = []
    for rnd in range(1, rounds + 1):
        rng = random.Random(100 + rnd)
        hot = 1 + (rnd - 1) * 1000
        keys = [hot + rng.randrange(5000) if rng.random() < 0.8
                else 1 + rng.randrange(50000) for _ in range(5000)]
        out.append(bursts(keys))
    return out


def is_hot(key):
    return isinstance(key, tuple) and key[0] == "h"


# ----------------------------------------------------------------------

def run(trace, cache, high, low, sync):
    """Hit ratio per round; for the scan trace, of the hot keys' reads."""
    ratios = []
    t = 0
    for rnd in trace:
        hits = reads = 0
        for burst in rnd:
            pending = set()
            for key in burst:
                held = cache.read(key, t)
                t += 1
                hit = held and key not in pending
                if not held and not sync:
                    pending.add(key)
                if not isinstance(key, tuple) or is_hot(key):
                    reads += 1
                    hits += hit
                if not held and cache.size() > high:
                    cache.evict_to(low, t)
        ratios.append(hits / reads if reads else 0.0)
    return ratios


def next_uses(trace):
    flat = [k for rnd in trace for b in rnd for k in b]
    nxt = [0] * len(flat)
    last = {}
    for i in range(len(flat) - 1, -1, -1):
        nxt[i] = last.get(flat[i], 10 ** 12)
        last[flat[i]] = i
    return nxt


def main():
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    sync = "--sync" in sys.argv
    capacity = int(args[0]) if len(args) > 0 else 7182
    high = int(capacity * (float(args[1]) if len(args) > 1 else 0.95))
    low = int(capacity * (float(args[2]) if len(args) > 2 else 0.85))
    policies = [
        lambda c: Sieve(c, ghosts=False),
        lambda c: Sieve(c, ghosts=True),
        lambda c: Clock(c, bits=2),
        lambda c: S3Fifo(c, small=0.10, bits=2),   # as published
        lambda c: S3Fifo(c, small=0.10, bits=1),
        lambda c: S3Fifo(c, small=0.30, bits=1),   # projcache 1.2
        lambda c: Lru(c),
    ]
    traces = [("spread", trace_spread), ("zipf", trace_zipf),
              ("scan", trace_scan), ("moving", trace_moving)]
    print(f"capacity {capacity} keys, watermarks {high} / {low}, "
          f"{'misses answered at once' if sync else 'misses pending until the burst ends'}")
    for tname, make in traces:
        trace = make(capacity)
        nxt = next_uses(trace)
        caches = [p(capacity) for p in policies] + [Belady(capacity, nxt)]
        print()
        what = "hot-key reads that hit" if tname == "scan" else "hit ratio"
        print(f"trace {tname} ({what} per round)")
        print(f"{'policy':26} {'steady':>6} {'r8':>5} {'r9':>5} {'r10':>5} | every round")
        for cache in caches:
            r = run(trace, cache, high, low, sync)
            steady = min(r[3:6])
            print(f"{cache.name:26} {steady:6.3f} {r[7]:5.3f} {r[8]:5.3f} {r[9]:5.3f} | "
                  f"{' '.join(f'{x:.2f}' for x in r)}")


if __name__ == "__main__":
    main()
