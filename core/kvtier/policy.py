"""Which CPU-tier chunk leaves first: LRU and ARC, as vLLM 0.32's CPU offloading manager decides.

Read from vllm/v1/kv_offload/cpu/policies/lru.py and arc.py (docs/kv-tiers.md, section 3). A chunk is
evictable only while ready and unpinned (its store done, no load reading it); the manager tells the
policy when that changes (`evictable`). Recency is set when a chunk is inserted and refreshed when a
request that observed it finishes (`finished`, keys head to tail: the head ends newest); lookups never
touch it. `evict(n, protected)` picks exactly n victims outside `protected` or none at all.
"""
from __future__ import annotations

import heapq
from collections import OrderedDict


class LRU:
    """Each chunk has a rank from one counter (insert, and each refresh at a request's end); the
    evictable chunk with the lowest rank leaves first."""

    name = "lru"

    def __init__(self, capacity: int):
        self.capacity = capacity
        self.rank: dict[bytes, int] = {}
        self._evictable: set[bytes] = set()
        self._heap: list[tuple[int, bytes]] = []   # (rank, key); stale entries skipped when popped
        self._next = 0

    def __contains__(self, key: bytes) -> bool:
        return key in self.rank

    def insert(self, key: bytes):
        self._next += 1
        self.rank[key] = self._next

    def store_miss(self, keys: list[bytes]):
        """A store offered keys absent from the tier (ARC adapts to ghosts; LRU ignores it)."""

    def finished(self, keys: list[bytes], inserted: set[bytes], reused: set[bytes]):
        for key in reversed(keys):     # (tail first: the head gets the newest rank)
            if key in self.rank:
                self._next += 1
                self.rank[key] = self._next
                if key in self._evictable:
                    heapq.heappush(self._heap, (self._next, key))
        self._compact()

    def evictable(self, key: bytes, yes: bool):
        if yes:
            self._evictable.add(key)
            heapq.heappush(self._heap, (self.rank[key], key))
            self._compact()
        else:
            self._evictable.discard(key)

    def _compact(self):
        """Mostly stale entries (refreshed, pinned or gone since pushed): the heap rebuilt from the live
        ones, which pop in the same (rank, key) order."""
        if len(self._heap) > 2 * len(self._evictable) + 1024:
            self._heap = [(self.rank[k], k) for k in self._evictable]
            heapq.heapify(self._heap)

    def evict(self, n: int, protected: set[bytes]) -> list[bytes] | None:
        picked: list[bytes] = []
        popped: list[tuple[int, bytes]] = []
        heap = self._heap
        while heap and len(picked) < n:
            entry = heapq.heappop(heap)
            rank, key = entry
            if key not in self._evictable or self.rank.get(key) != rank or key in picked:
                continue   # (stale: refreshed, pinned or gone since pushed)
            popped.append(entry)
            if key not in protected:
                picked.append(key)
        if len(picked) < n:   # all or nothing: the heap as it was
            for entry in popped:
                heapq.heappush(heap, entry)
            return None
        for entry in popped:
            if entry[1] not in picked:
                heapq.heappush(heap, entry)
        for key in picked:
            self._evictable.discard(key)
            del self.rank[key]
        return picked


class ARC:
    """Adaptive replacement: T1 holds chunks not reused since insertion, T2 chunks reused at least
    once (promoted when a request that loaded or found them finishes); B1 and B2 remember evicted
    keys (each at most `capacity`), and a store offered a remembered key moves the T1 target."""

    name = "arc"

    def __init__(self, capacity: int):
        self.capacity = capacity
        self.target = 0.0
        self.t1: OrderedDict[bytes, None] = OrderedDict()
        self.t2: OrderedDict[bytes, None] = OrderedDict()
        self.b1: OrderedDict[bytes, None] = OrderedDict()
        self.b2: OrderedDict[bytes, None] = OrderedDict()
        self._evictable: set[bytes] = set()

    def __contains__(self, key: bytes) -> bool:
        return key in self.t1 or key in self.t2

    def insert(self, key: bytes):
        self.t1[key] = None
        self.b1.pop(key, None)
        self.b2.pop(key, None)

    def store_miss(self, keys: list[bytes]):
        for key in reversed(keys):
            if key in self.b1:
                self.target = min(self.target + max(1, len(self.b2) / len(self.b1)), self.capacity)
                self.b1.move_to_end(key)
            elif key in self.b2:
                self.target = max(self.target - max(1, len(self.b1) / len(self.b2)), 0)
                self.b2.move_to_end(key)

    def finished(self, keys: list[bytes], inserted: set[bytes], reused: set[bytes]):
        for key in reversed(keys):
            if key in inserted:
                if key in self.t1:
                    self.t1.move_to_end(key)
                elif key in self.t2:
                    self.t2.move_to_end(key)
            elif key in reused:
                if key in self.t1:
                    del self.t1[key]
                    self.t2[key] = None
                elif key in self.t2:
                    self.t2.move_to_end(key)

    def evictable(self, key: bytes, yes: bool):
        if yes:
            self._evictable.add(key)
        else:
            self._evictable.discard(key)

    def evict(self, n: int, protected: set[bytes]) -> list[bytes] | None:
        ok = self._evictable
        t1 = (k for k in self.t1 if k in ok and k not in protected)   # (one pass each, as vLLM's iterators)
        t2 = (k for k in self.t2 if k in ok and k not in protected)
        size1 = len(self.t1)
        picked: list[tuple[bytes, bool]] = []
        for _ in range(n):
            key = None
            if size1 >= int(self.target):
                key = next(t1, None)
                if key is not None:
                    picked.append((key, True))
                    size1 -= 1
                    continue
            key = next(t2, None)
            if key is not None:
                picked.append((key, False))
                continue
            key = next(t1, None)
            if key is None:
                return None
            picked.append((key, True))
            size1 -= 1
        for key, from_t1 in picked:
            ok.discard(key)
            if from_t1:
                del self.t1[key]
                self.b1[key] = None
            else:
                del self.t2[key]
                self.b2[key] = None
        for ghost in (self.b1, self.b2):
            for _ in range(len(ghost) - self.capacity):
                ghost.popitem(last=False)
        return [k for k, _ in picked]


POLICIES = {"lru": LRU, "arc": ARC}
