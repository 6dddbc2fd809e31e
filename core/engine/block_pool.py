"""The block pool: the physical KV blocks, their reference counts, and the one allocator.

Free blocks: released uncached ones on a stack (the most recently released is reused first),
then never-used ones from `fresh` upwards (lowest ids first), then cached-free ones (the
prefix cache's, oldest release first), evicted from the cache when taken. Per-block state is
sized by use, not by the pool: a pool "big enough for every request" of a million-request
workload has ~10^8 blocks, of which a few thousand are ever in use at once; `ref` is
calloc'ed (untouched pages cost nothing).
"""
from __future__ import annotations

import numpy as np
from mypy_extensions import mypyc_attr

from core.engine.prefix_cache import PrefixCache
from core.errors import ConfigError


@mypyc_attr(native_class=False)   # (compiled by setup.py: a builtin's subclass stays a Python class)
class OutOfBlocks(RuntimeError):
    """Asked for more blocks than are free; callers check `num_free` first."""


class BlockPool:
    def __init__(self, num_blocks: int, prefix: PrefixCache | None = None):
        if isinstance(num_blocks, bool) or not isinstance(num_blocks, int) or num_blocks < 1:
            raise ConfigError(f"kv_blocks: expected a positive integer, got {num_blocks!r}")
        self.num_blocks = num_blocks
        self.prefix = prefix
        self.refcount = np.zeros(num_blocks, dtype=np.int64)   # per block; kept only while `live` (refs_from)
        self.free_plain: list[int] = []
        self.fresh = 0                         # blocks fresh..num_blocks-1 have never been used
        self.free_cached = prefix.free_cached if prefix is not None else ()   # the prefix cache's cached-free
        self.ever_shared = False               # no block has had two owners (no hit, no fork) yet

    @property
    def live(self) -> bool:
        # Reference counts matter once a block has had two owners (a prefix hit, a fork: the
        # caller calls start_sharing first); until then every block in a table has exactly one
        # and counting costs per step (a prefix cache that never hits counts nothing).
        return self.ever_shared

    def refs_from(self, tables) -> np.ndarray:
        """References per block: the counts (live), or counted from the block tables."""
        if self.live:
            return self.refcount
        ref = np.zeros(self.num_blocks, dtype=np.int64)
        for table in tables:
            ref[table] += 1
        return ref

    @property
    def num_uncached_free(self) -> int:
        return len(self.free_plain) + (self.num_blocks - self.fresh)

    def take(self, n: int) -> tuple[list[int], list[tuple[int, bytes]]]:
        """n free blocks, owned once each: uncached first, then the least recently released
        cached ones (evicting the prefix they held). Returns (blocks, [(evicted block, hash)])."""
        evicted = []
        plain = len(self.free_plain) + (self.num_blocks - self.fresh)
        if n > plain:
            if n > plain + len(self.free_cached):
                raise OutOfBlocks(f"need {n} blocks, {plain + len(self.free_cached)} free")
            new = self._uncached(plain)
            for _ in range(n - plain):
                b, h = self.prefix.evict_oldest()  # type: ignore[union-attr]  # (cached blocks: a prefix cache)
                evicted.append((b, h))
                new.append(b)
        else:
            new = self._uncached(n)
        if self.ever_shared:   # (live)
            self.refcount[new] = 1
        return new, evicted

    def take_uncached(self, n: int) -> list[int]:
        """Up to n uncached free blocks (released ones, most recent first, then fresh ones),
        owned once each."""
        new = self._uncached(n)
        if self.live and new:
            self.refcount[new] = 1
        return new

    def _uncached(self, n: int) -> list[int]:
        plain = self.free_plain
        k = min(n, len(plain))
        if k:
            new = plain[-1:-k - 1:-1]   # (the last k, most recent first)
            del plain[len(plain) - k:]
        else:
            new = []
        m = min(n - k, self.num_blocks - self.fresh)
        if m:
            new += range(self.fresh, self.fresh + m)
            self.fresh += m
        return new

    def share(self, blocks: list[int]):
        """Another owner for each of `blocks` (prefix hits; a cached-free one is revived); counts
        kept (start_sharing) first."""
        for b in blocks:
            if self.refcount[b] == 0:
                self.prefix.revive(b)  # type: ignore[union-attr]
            self.refcount[b] += 1
        self.ever_shared |= bool(blocks)

    def start_sharing(self, tables):
        """From now on a block can have two owners (a fork, a prefix hit): keep reference counts."""
        if not self.live:
            self.refcount = self.refs_from(tables)
        self.ever_shared = True

    def release(self, blocks: list[int]):
        """One owner fewer for each of `blocks`; those left without one become free (a cached
        one waits in the prefix cache's LRU). Returns (the blocks, references left per block or
        0 when none was shared, their hashes or None without a prefix cache)."""
        if not self.live:   # every block had one owner: all are free now (a cached one to the prefix cache's LRU)
            if self.prefix is None:
                self.free_plain.extend(blocks)
                return blocks, 0, None
            hashes = list(map(self.prefix.hash.get, blocks))
            self._park(blocks, hashes, None)
            return blocks, 0, hashes
        arr = np.array(blocks, dtype=np.int64)
        ref = self.refcount
        ref[arr] -= 1
        refs = ref[arr]
        if self.prefix is None:
            self.free_plain.extend(blocks if not refs.any() else arr[refs == 0].tolist())
            return arr, refs, None
        hashes = list(map(self.prefix.hash.get, blocks))   # (get: no __missing__ call per uncached block)
        self._park(blocks, hashes, refs if refs.any() else None)
        return arr, refs, hashes

    def _park(self, blocks: list[int], hashes: list, refs):
        """Released blocks left without an owner (refs None: all) become free: an uncached one on
        the stack, a cached one in the prefix cache's LRU."""
        plain = self.free_plain
        if refs is None and hashes.count(None) == len(hashes):   # (the common case: none shared or cached)
            plain.extend(blocks)
            return
        park = self.prefix.park  # type: ignore[union-attr]
        for b, h, r in zip(blocks, hashes, refs.tolist() if refs is not None else [0] * len(blocks)):
            if r == 0:
                if h is None:
                    plain.append(b)
                else:
                    park(b)

    def check(self, ref: np.ndarray):
        free = self.free_plain + list(range(self.fresh, self.num_blocks)) + \
            (list(self.prefix.free_cached) if self.prefix is not None else [])
        assert len(set(free)) == len(free), "a block is listed free twice"
        assert all(b < self.fresh for b in self.free_plain), "a never-used block is on the released stack"
        is_free = np.zeros(self.num_blocks, dtype=bool)
        is_free[free] = True
        broken = np.flatnonzero(is_free == (ref > 0))
        assert not len(broken), f"block {broken[0]}: free xor referenced broken (ref {ref[broken[0]]})"
        if self.prefix is not None:
            for b in self.free_plain:
                assert self.prefix.hash[b] is None, f"block {b}: cached but on the uncached free stack"
