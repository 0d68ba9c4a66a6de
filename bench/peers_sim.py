#!/usr/bin/env python3
"""bench/peers_sim.py - eviction policies on bench/peers.py's traces, simulated by count.

Replays the four traces of bench/peers.py (shift, zipf, scan, moving, at
its 8 MB and 32 MB scales) against policies of equal capacity in keys, and
prints each round's hit ratio and, per policy, how far it falls short of
LRU in rounds 4-10 at worst.  It asserts nothing: it is how the small
FIFO's adaptation in keycache_policy.c was chosen.

Two models of a miss:
  sync   the client stores the value before its next read (Redis and
         memcached read-through: GET, then SET), so a key read twice in a
         burst hits the second time;
  async  projcache: a miss creates the key, pending, and the worker fetches
         it between bursts; reads of it in the same burst miss too, but
         mark it read, as readers mark a pending entry.

Policies:
  LRU            exact LRU (Redis samples; memcached segments its LRU)
  S3-FIFO 30 %   projcache 1.2: a small FIFO of a fixed 30 % share, 1-bit
                 marks, a ghost of the small FIFO's victims
  S3-FIFO adapt  projcache 1.3: the ghost remembers both FIFOs' victims;
                 a key back from the small FIFO's grows the small share by
                 GROW keys' worth of the keys held, one back from main's
                 shrinks it by SHRINK keys' worth, within 10 % and 90 %
                 (starting at 10 %)

    python3 bench/peers_sim.py [capacity at 8 MB, default 7080]
    python3 bench/peers_sim.py --scan      # try GROW and SHRINK values

The capacity scales by four at 32 MB; 7,080 is what memcached holds of the
traces' 1 kB values at 8 MB (bench/results/peers-latest.txt).
"""
import os
import sys
from collections import OrderedDict

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import peers  # noqa: E402  (its traces; it does nothing on import)


class Lru:
    def __init__(self, cap, sync=True):
        self.cap, self.sync = cap, sync
        self.keys = OrderedDict()
        self.pending = set()
        self.name = "LRU" + ("" if sync else " (async)")

    def read(self, key):
        if key in self.keys:
            self.keys.move_to_end(key)
            return key not in self.pending
        self.keys[key] = True
        if not self.sync:
            self.pending.add(key)
        return False

    def settle(self):
        self.pending.clear()
        while len(self.keys) > self.cap:
            self.keys.popitem(last=False)


class S3Fifo:
    """As keycache_policy.c: shares counted in keys (the traces' values are
    of one size, so bytes and keys agree)."""

    MIN, MAX = 0.10, 0.90

    def __init__(self, cap, share=0.30, grow=None, shrink=None, sync=False):
        self.cap, self.sync = cap, sync
        self.share, self.grow_keys, self.shrink_keys = share, grow, shrink
        if grow is None:
            self.name = f"S3-FIFO {share * 100:.0f} %"
        else:
            self.share = self.MIN
            self.name = f"S3-FIFO adapt +{grow}/-{shrink}"
        self.fifo = (OrderedDict(), OrderedDict())    # small, main
        self.visited = {}
        self.pending = set()
        self.ghost = (OrderedDict(), OrderedDict())   # victims of each

    def read(self, key):
        if key in self.visited:
            self.visited[key] = True
            return key not in self.pending
        self.visited[key] = False
        if not self.sync:
            self.pending.add(key)
        back = next((f for f in (0, 1) if key in self.ghost[f]), None)
        if back is not None:
            del self.ghost[back][key]
            self._adapt(back == 0)
        self.fifo[0 if back is None else 1][key] = True
        return False

    def _adapt(self, grow):
        if self.grow_keys is None:
            return
        n = len(self.visited)
        if grow:
            self.share = min(self.MAX, self.share + self.grow_keys / n)
        else:
            self.share = max(self.MIN, self.share - self.shrink_keys / n)

    def _remember(self, f, key):
        if f == 1 and self.grow_keys is None:
            return                      # 1.2 remembers the small FIFO's only
        ghost = self.ghost[f]
        ghost[key] = True
        while len(ghost) > max(len(self.fifo[1]), 1):
            ghost.popitem(last=False)

    def _evict_one(self):
        small, main = self.fifo
        while True:
            f = 0 if small and (len(small) >= self.share * len(self.visited)
                                or not main) else 1
            key, _ = self.fifo[f].popitem(last=False)
            if self.visited[key]:
                self.visited[key] = False
                main[key] = True        # promoted, or reinserted
                continue
            del self.visited[key]
            self.pending.discard(key)
            self._remember(f, key)
            return

    def settle(self):
        self.pending.clear()
        while len(self.visited) > self.cap:
            self._evict_one()


def run(trace, scale, cache):
    """Hit ratio per round; the cache settles (fetches, evicts) after each
    burst, and after each read if it is sync."""
    rounds, _ = peers.TRACES[trace](scale)
    ratios = []
    for bursts in rounds:
        hits = reads = 0
        for burst in bursts:
            for key, counted in burst:
                hit = cache.read(key)
                if cache.sync:
                    cache.settle()
                if counted:
                    reads += 1
                    hits += hit
            cache.settle()
        ratios.append(hits / reads)
    return ratios


CELLS = [(t, scale, mb) for scale, mb in ((1, 8), (4, 32))
         for t in ("shift", "zipf", "scan", "moving")]


def shortfall(cap8, make):
    """Worst of (policy - LRU) over rounds 4-10 of every cell, and each cell's."""
    worst, cells = 1.0, []
    for trace, scale, mb in CELLS:
        cap = cap8 * mb // 8
        lru = run(trace, scale, Lru(cap))
        mine = run(trace, scale, make(cap))
        d = min(m - b for m, b in zip(mine[3:], lru[3:]))
        worst = min(worst, d)
        cells.append(f"{trace}@{mb}:{d:+.3f}")
    return worst, cells


def main():
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    cap8 = int(args[0]) if args else 7080
    if "--scan" in sys.argv:
        for grow in (4, 8, 16, 24, 32):
            for shrink in (grow, grow * 3 // 2, grow * 2, grow * 3):
                worst, cells = shortfall(
                    cap8, lambda c, g=grow, s=shrink: S3Fifo(c, grow=g, shrink=s))
                print(f"grow {grow:3} shrink {shrink:3}: worst {worst:+.3f}  "
                      + " ".join(cells), flush=True)
        return
    makers = [lambda c: Lru(c), lambda c: Lru(c, sync=False),
              lambda c: S3Fifo(c), lambda c: S3Fifo(c, grow=16, shrink=24)]
    for trace, scale, mb in CELLS:
        cap = cap8 * mb // 8
        print(f"--- {trace}, {mb} MB scale, capacity {cap:,} keys")
        print(f"    {'':28}" + " ".join(f"{'r' + str(i + 1):>6}" for i in range(10)))
        lru = None
        for make in makers:
            cache = make(cap)
            r = run(trace, scale, cache)
            lru = lru or r
            worst = min(m - b for m, b in zip(r[3:], lru[3:]))
            print(f"    {cache.name:28}" + " ".join(f"{x:6.3f}" for x in r)
                  + f"   vs LRU r4-10 at worst {worst:+.3f}")
        print()


if __name__ == "__main__":
    main()
