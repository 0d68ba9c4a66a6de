#!/usr/bin/env python3
"""bench/working_set_sim.py - the working-set scenario, simulated by count.

The scenario of bench/working_set.sql (8 rounds of 5,000 reads, 80 % on
5,000 hot keys of 50,000, then 5 rounds after the hot set moved), run
against eviction policies with the same random draws as the SQL rounds'
shape (not the same numbers: Python's generator is not PostgreSQL's).
Capacity is in keys; memory use is approximated by the count of keys.  A
miss inserts the key at once (the real cache answers NULL, then fetches it
within milliseconds).  It asserts nothing: it prints the hit ratio of each
round for each policy, to tell what the policy allows from what the
implementation gives.

    python3 bench/working_set_sim.py [capacity] [high] [low]

capacity: keys that fit in max_memory (8 MB / about 1,170 bytes per key of
the scenario, as projcache.stats shows: 7182); high and low: the
watermarks, as shares of it (0.95 and 0.85, as keycache_worker.c).
"""
import random
import sys
from collections import OrderedDict


class Sieve:
    """SIEVE; with remember, keys evicted lately come back visited."""

    def __init__(self, remember):
        self.order = []          # oldest first
        self.visited = {}
        self.hand = 0
        self.remember = remember
        self.evicted = OrderedDict()

    def read(self, key):
        if key in self.visited:
            self.visited[key] = True
            return True
        back = key in self.evicted
        if back:
            del self.evicted[key]
        self.visited[key] = back and self.remember > 0
        self.order.append(key)
        return False

    def size(self):
        return len(self.visited)

    def evict_to(self, n):
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
                if self.remember:
                    self.evicted[key] = True
                    if len(self.evicted) > self.remember:
                        self.evicted.popitem(last=False)


class Lru:
    def __init__(self):
        self.keys = OrderedDict()

    def read(self, key):
        if key in self.keys:
            self.keys.move_to_end(key)
            return True
        self.keys[key] = True
        return False

    def size(self):
        return len(self.keys)

    def evict_to(self, n):
        while len(self.keys) > n:
            self.keys.popitem(last=False)


def run(cache, high, low):
    ratios = []
    for rnd in range(13):
        rng = random.Random(rnd)
        hot = 1 if rnd < 8 else 25001
        hits = 0
        for _ in range(5000):
            if rng.random() < 0.8:
                key = hot + rng.randrange(5000)
            else:
                key = 1 + rng.randrange(50000)
            if cache.read(key):
                hits += 1
            elif cache.size() > high:
                cache.evict_to(low)
        ratios.append(hits / 5000)
    return ratios


def main():
    capacity = int(sys.argv[1]) if len(sys.argv) > 1 else 7182
    high = int(capacity * (float(sys.argv[2]) if len(sys.argv) > 2 else 0.95))
    low = int(capacity * (float(sys.argv[3]) if len(sys.argv) > 3 else 0.85))
    policies = [
        ("SIEVE", Sieve(0), high, low),
        ("SIEVE, evicted keys remembered", Sieve(2 * capacity), high, low),
        ("LRU", Lru(), high, low),
        ("no eviction (unbounded)", Lru(), 10 ** 9, 10 ** 9),
    ]
    print(f"capacity {capacity} keys, watermarks {high} / {low}")
    print(f"{'policy':32} rounds 1-8 | after the shift 1-5")
    for name, cache, hi, lo in policies:
        r = run(cache, hi, lo)
        print(f"{name:32} {' '.join(f'{x:.2f}' for x in r[:8])} | "
              f"{' '.join(f'{x:.2f}' for x in r[8:])}")


if __name__ == "__main__":
    main()
