"""Paged KV block manager (PagedAttention-style), shared by the simulator and the runner.

A sequence's KV lives in fixed-size physical blocks; its block table maps logical block i
(token positions [i*bs, (i+1)*bs)) to a physical block id. Blocks are reference counted
so several sequences can share one (prefix caching, forks).

Prefix caching: once a block is full, it gets a chained hash
    h_i = sha256(h_{i-1} || extra keys || token ids of block i)
where the extra keys are the model/adapter id and the tenant's cache salt, so the same
tokens under another model or tenant never match. A lookup also compares the stored
token ids (a hash is a hint, the tokens are the proof).

Free blocks wait in an LRU queue. A free block that still holds a cached prefix
("cached-free") can be revived by a later hit; when a fresh block is needed the least
recently freed block is taken and, if cached, evicted. Uncached blocks are reused first.

Copy-on-write: writing into a block that another sequence also references (a fork
sharing a partially filled tail block) first copies it to a private block.
"""
from __future__ import annotations

import functools
import hashlib
from array import array
from collections import OrderedDict

import numpy as np

from core.engine.kvlog import KV_OPS, KVLog
from core.errors import ConfigError


class OutOfBlocks(RuntimeError):
    """Asked for more blocks than are free; callers check `num_free` first."""


def block_hash(parent: bytes | None, tokens, extra: bytes) -> bytes:
    h = hashlib.sha256(parent or b"\x00" * 32)
    h.update(extra)
    h.update(array("q", tokens).tobytes())
    return h.digest()


@functools.lru_cache(maxsize=4096)
def extra_key(model_id: str | None, salt: str | None) -> bytes:
    # Length-prefixed so ("ab", "c") and ("a", "bc") differ.
    parts = [(model_id or "").encode(), (salt or "").encode()]
    return b"".join(len(p).to_bytes(4, "little") + p for p in parts)


class _Sparse(dict):
    """Per-block values kept only where set; absent blocks read as None."""

    def __missing__(self, key):
        return None


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int, prefix_caching: bool = False,
                 model_id: str | None = None, log: KVLog | None = None):
        if isinstance(num_blocks, bool) or not isinstance(num_blocks, int) or num_blocks < 1:
            raise ConfigError(f"kv_blocks: expected a positive integer, got {num_blocks!r}")
        if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size < 1:
            raise ConfigError(f"block_size: expected a positive integer, got {block_size!r}")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.prefix_caching = prefix_caching
        self.model_id = model_id
        self.log = log
        self.now_ms = 0.0                      # set by the caller; stamps log rows
        # Per-block state is sized by use, not by the pool: a pool "big enough for every
        # request" of a million-request workload has ~10^8 blocks, of which a few thousand are
        # ever in use at once. `ref` is calloc'ed (untouched pages cost nothing); hashes and
        # token ids exist only for cached blocks.
        self._ref = np.zeros(num_blocks, dtype=np.int64)   # kept only while `_live` (see ref)
        self.hash: dict[int, bytes] = _Sparse()        # block -> hash of its cached prefix (None: uncached)
        self.tokens: dict[int, tuple] = _Sparse()      # block -> token ids of a cached block
        self.cache: dict[bytes, int] = {}      # full-block hash -> physical block
        # Free blocks: released uncached ones on a stack (the most recently released is reused
        # first), then never-used ones from `fresh` upwards (lowest ids first), then cached ones
        # in LRU order (oldest release first) so a hit can still revive them.
        self.free_plain: list[int] = []
        self.fresh = 0                         # blocks fresh..num_blocks-1 have never been used
        self.free_cached: OrderedDict[int, None] = OrderedDict()
        self.tables: dict = {}                 # seq id -> [physical block per logical block]
        self.chain: dict = {}                  # seq id -> hashes of its full blocks so far
        self.extra: dict = {}                  # seq id -> extra-key bytes (model + salt)
        self.counts = {op: 0 for op in KV_OPS}
        self.ever_shared = False               # no block has had two owners (no hit, no fork) yet

    # ---- queries -------------------------------------------------------------------
    @property
    def num_free(self) -> int:
        return len(self.free_plain) + (self.num_blocks - self.fresh) + len(self.free_cached)

    @property
    def _live(self) -> bool:
        # Reference counts matter once a block can have two owners (prefix caching, forks);
        # until then every block in a table has exactly one and counting costs per step.
        return self.prefix_caching or self.ever_shared

    @property
    def ref(self) -> np.ndarray:
        """References per block (tables holding it). Before any sharing, computed from the
        tables on each access (a copy: writing into it changes nothing)."""
        if self._live:
            return self._ref
        ref = np.zeros(self.num_blocks, dtype=np.int64)
        for table in self.tables.values():
            ref[table] += 1
        return ref

    @property
    def num_used(self) -> int:
        return self.num_blocks - self.num_free

    def num_cached_free(self) -> int:
        return len(self.free_cached)

    def is_free(self, b: int) -> bool:
        return self.ref[b] == 0

    def blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def match_prefix(self, token_ids, salt: str | None = None, max_tokens: int | None = None) -> list[int]:
        """Physical blocks holding the longest cached exact prefix of `token_ids` (full
        blocks only, at most `max_tokens` tokens). Pure: changes nothing."""
        if not self.prefix_caching or token_ids is None or not self.cache:
            return []
        bs = self.block_size
        limit = len(token_ids) if max_tokens is None else min(max_tokens, len(token_ids))
        extra = extra_key(self.model_id, salt)
        hits, parent = [], None
        for i in range(limit // bs):
            chunk = tuple(token_ids[i * bs:(i + 1) * bs])
            parent = block_hash(parent, chunk, extra)
            b = self.cache.get(parent)
            if b is None or self.tokens[b] != chunk:
                break
            hits.append(b)
        return hits

    def admission_cost(self, hits: list[int], num_tokens: int) -> int:
        """Free blocks consumed by admitting a new sequence with these hits and
        `num_tokens` slots: fresh blocks plus hit blocks that are currently free."""
        revived = sum(1 for b in hits if self._ref[b] == 0)
        return revived + max(0, self.blocks_for(num_tokens) - len(hits))

    # ---- mutations -----------------------------------------------------------------
    def _rec(self, op, seq, blocks, logical0, step, refs, hashes=None, src=-1):
        self.counts[op] += len(blocks)
        if self.log is not None:
            self.log.add(self.now_ms, op, seq, blocks, logical0, step, refs, hashes, src)

    def _take(self, n: int) -> list[int]:
        """n free blocks: uncached first, then the least recently released cached ones
        (evicting the prefix they held)."""
        if n > self.num_free:
            raise OutOfBlocks(f"need {n} blocks, {self.num_free} free")
        new = self._take_uncached(n)
        for _ in range(n - len(new)):
            b, _ = self.free_cached.popitem(last=False)
            h = self.hash.pop(b)
            del self.cache[h]
            del self.tokens[b]
            self._rec("evict", None, [b], -1, 0, 0, [h])
            new.append(b)
        return new

    def _take_uncached(self, n: int) -> list[int]:
        """Up to n uncached free blocks: released ones (most recent first), then fresh ones."""
        plain = self.free_plain
        k = min(n, len(plain))
        if k:
            new = plain[len(plain) - k:][::-1]
            del plain[len(plain) - k:]
        else:
            new = []
        m = min(n - k, self.num_blocks - self.fresh)
        if m:
            new += range(self.fresh, self.fresh + m)
            self.fresh += m
        return new

    def admit(self, seq, hits: list[int] = (), salt: str | None = None) -> int:
        """Start a sequence's table with cache hits; returns the number of cached tokens."""
        if seq in self.tables:
            raise ValueError(f"sequence {seq!r} already has a block table")
        hits = list(hits)
        for b in hits:
            if self._ref[b] == 0:
                del self.free_cached[b]
            self._ref[b] += 1
        self.ever_shared |= bool(hits)
        self.tables[seq] = list(hits)  # the table grows; the logged hit list must not
        self.chain[seq] = [self.hash[b] for b in hits]
        self.extra[seq] = extra_key(self.model_id, salt)
        if hits:
            self._rec("hit", seq, hits, 0, 1, self._ref[hits].tolist(), list(self.chain[seq]))
        return len(hits) * self.block_size

    def grow(self, seq, num_tokens: int) -> list[int]:
        """Make the table cover `num_tokens` positions; returns the new blocks."""
        table = self.tables[seq]
        need = -(-num_tokens // self.block_size) - len(table)
        if need <= 0:
            return []
        new = self._take(need)
        if self._live:
            self._ref[new] = 1
        self._rec("alloc", seq, new, len(table), 1, 1)
        table.extend(new)
        return new

    def append_blocks(self, owners: list, times_ms) -> bool:
        """One fresh block for each entry of `owners` (a sequence may appear many times), in
        order, logged at the matching `times_ms`. Only when no eviction is needed (returns
        False and does nothing otherwise), so the result equals one-by-one growth."""
        n = len(owners)
        if n > len(self.free_plain) + self.num_blocks - self.fresh:
            return False
        new = self._take_uncached(n)
        if self._live:
            self._ref[new] = 1
        tables = self.tables
        logical = []
        for seq, b in zip(owners, new):
            t = tables[seq]
            logical.append(len(t))
            t.append(b)
        if self.log is not None:
            self.counts["alloc"] += n
            self.log.add(list(times_ms), "alloc", list(owners), new, logical, 0, 1)
        else:
            self.counts["alloc"] += n
        return True

    def grow_one_each(self, seqs: np.ndarray, starts: np.ndarray):
        """One fresh block for each of `seqs` (distinct sequences whose tables hold `starts`
        blocks): decodes crossing a block boundary, the common case of every step. Same blocks
        and log as grow_many(seqs, [1, ...])."""
        new = self._take(len(seqs))
        tables = self.tables
        owners = seqs.tolist()
        for seq, b in zip(owners, new):
            tables[seq].append(b)
        if self._live:
            self._ref[new] = 1
        if self.log is not None:   # lists: the log reads Python ints fastest
            self._rec("alloc", owners, new, np.asarray(starts).tolist(), 0, 1)
        else:
            self.counts["alloc"] += len(new)

    def grow_many(self, seqs: list, needs: list[int]):
        """Append needs[i] fresh blocks to seqs[i]'s table, for many sequences at once (one
        log call: per-block owners and logical indices)."""
        total = sum(needs)
        new = self._take(total)
        tables = self.tables
        pos = 0
        if self.log is None:          # no per-block owners and logical indices to record
            for seq, k in zip(seqs, needs):
                tables[seq] += new[pos:pos + k]
                pos += k
        else:
            owners, logical = [], []
            for seq, k in zip(seqs, needs):
                table = tables[seq]
                owners += [seq] * k
                logical += range(len(table), len(table) + k)
                table += new[pos:pos + k]
                pos += k
        if self._live:
            self._ref[new] = 1
        if self.log is not None:
            self._rec("alloc", owners, new, logical, 0, 1)
        else:
            self.counts["alloc"] += total

    def prepare_write(self, seq, start_pos: int, num_tokens: int) -> tuple[list[int], list[tuple[int, int]]]:
        """Before writing positions [start_pos, start_pos+num_tokens): copy any block in
        that range that another sequence also references (copy-on-write), then allocate
        blocks to cover the end. Returns (new blocks, [(src, dst) copies]) so a real
        engine can copy the KV data."""
        table = self.tables[seq]
        first = start_pos // self.block_size
        end_blocks = self.blocks_for(start_pos + num_tokens)
        ref = self._ref
        cows = [i for i in range(first, min(len(table), end_blocks)) if ref[table[i]] > 1] if self._live else []
        need = len(cows) + max(0, end_blocks - len(table))
        if need > self.num_free:
            raise OutOfBlocks(f"need {need} blocks, {self.num_free} free")
        copies = []
        for i in cows:
            src = table[i]
            dst = self._take(1)[0]
            ref[src] -= 1
            ref[dst] = 1
            table[i] = dst
            copies.append((src, dst))
            self._rec("cow", seq, [dst], i, 1, 1, None, src)
        if cows:  # hashes of the copied blocks onward are no longer this table's
            del self.chain[seq][cows[0]:]
        return self.grow(seq, start_pos + num_tokens), copies

    def fork(self, parent, child):
        """The child shares every block of the parent (parallel sampling, beam search)."""
        if child in self.tables:
            raise ValueError(f"sequence {child!r} already has a block table")
        table = list(self.tables[parent])
        if not self._live:
            self._ref = self.ref   # start counting: from now on a block can have two owners
        self.ever_shared = True
        self._ref[table] += 1
        self.tables[child] = table
        self.chain[child] = list(self.chain[parent])
        self.extra[child] = self.extra[parent]

    def commit(self, seq, token_ids, num_computed: int):
        """Register the sequence's full, computed blocks in the prefix cache.
        `token_ids` are all known ids of the sequence (prompt + outputs)."""
        if not self.prefix_caching or token_ids is None:
            return
        bs = self.block_size
        table, chain = self.tables[seq], self.chain[seq]
        full = min(num_computed, len(token_ids)) // bs
        extra = self.extra[seq]
        for i in range(len(chain), min(full, len(table))):
            chunk = tuple(token_ids[i * bs:(i + 1) * bs])
            h = block_hash(chain[-1] if chain else None, chunk, extra)
            chain.append(h)
            b = table[i]
            if h in self.cache or self.hash[b] is not None:
                continue  # an identical block is already cached (computed twice concurrently)
            self.hash[b] = h
            self.tokens[b] = chunk
            self.cache[h] = b
            self._rec("cache", seq, [b], i, 1, int(self._ref[b]), [h])

    def _release(self, seq, blocks: list[int], logical0: int, step: int):
        hashes = None
        if not self._live:   # every block had one owner: all are free now
            self.free_plain.extend(blocks)
            self._rec("free", seq, blocks, logical0, step, 0)
            return
        arr = np.array(blocks, dtype=np.int64)
        ref = self._ref
        ref[arr] -= 1
        refs = ref[arr]
        if not self.prefix_caching and not refs.any():   # no block shared: all of them are free now
            self.free_plain.extend(blocks)
        elif self.prefix_caching:
            hashes = [self.hash[b] for b in blocks]
            for b, h, r in zip(blocks, hashes, refs.tolist()):
                if r == 0:
                    if h is None:
                        self.free_plain.append(b)
                    else:
                        self.free_cached[b] = None
        else:
            self.free_plain.extend(arr[refs == 0].tolist())
        self._rec("free", seq, arr, logical0, step, refs, hashes)

    def truncate(self, seq, num_tokens: int):
        """Drop blocks past `num_tokens` positions (speculative rollback)."""
        table = self.tables[seq]
        keep = self.blocks_for(num_tokens)
        if len(table) > keep:
            dropped = table[keep:][::-1]
            del table[keep:]
            self._release(seq, dropped, len(table) + len(dropped) - 1, -1)
        del self.chain[seq][num_tokens // self.block_size:]

    def free_seq(self, seq) -> int:
        """Release all of a sequence's blocks (finish, abort, preemption). Tail blocks are
        released first so they are evicted before the shared prefix they extend."""
        table = self.tables.pop(seq)
        if table:
            self._release(seq, table[::-1], len(table) - 1, -1)
        self.chain.pop(seq, None)
        self.extra.pop(seq, None)
        return len(table)

    def check(self):
        """Raise AssertionError if an invariant is broken."""
        refs = np.zeros(self.num_blocks, dtype=np.int64)
        for seq, table in self.tables.items():
            assert len(set(table)) == len(table), f"{seq}: a block appears twice in its table"
            np.add.at(refs, table, 1)
        ref = self.ref
        bad = np.flatnonzero(refs != ref)
        assert not len(bad), f"block {bad[0]}: ref {ref[bad[0]]} but {refs[bad[0]]} table refs"
        free = self.free_plain + list(range(self.fresh, self.num_blocks)) + list(self.free_cached)
        assert len(set(free)) == len(free), "a block is listed free twice"
        assert all(b < self.fresh for b in self.free_plain), "a never-used block is on the released stack"
        is_free = np.zeros(self.num_blocks, dtype=bool)
        is_free[free] = True
        broken = np.flatnonzero(is_free == (ref > 0))
        assert not len(broken), f"block {broken[0]}: free xor referenced broken (ref {ref[broken[0]]})"
        for b in self.free_plain:
            assert self.hash[b] is None, f"block {b}: cached but on the uncached free stack"
        for b in self.free_cached:
            assert self.hash[b] is not None, f"block {b}: uncached but in the cached free list"
        for b, h in self.hash.items():
            assert h is not None, f"block {b}: a None hash stored"
            assert self.cache.get(h) == b, f"block {b}: hash not mapped back to it"
            assert self.tokens[b] is not None and len(self.tokens[b]) == self.block_size
        for h, b in self.cache.items():
            assert self.hash[b] == h, f"cache entry for block {b} is stale"


KVCacheManager = BlockManager
