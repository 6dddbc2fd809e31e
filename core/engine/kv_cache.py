"""The KV cache manager (PagedAttention-style), shared by the simulator and the runner: each
sequence's block table over the block pool (core.engine.block_pool: storage, reference
counts, the one allocator) and the prefix cache (core.engine.prefix_cache: chained hashes,
exact-token matches, LRU eviction of cached-free blocks).

A sequence's KV lives in fixed-size physical blocks; its block table maps logical block i
(token positions [i*bs, (i+1)*bs)) to a physical block id. Blocks are reference counted
so several sequences can share one (prefix caching, forks).

Copy-on-write: writing into a block that another sequence also references (a fork
sharing a partially filled tail block) first copies it to a private block.

With `record_events`, every block touched is kept as an event (t, op, owner, blocks, logical
index, step, refs, hashes, src) until `take_events` hands them on (as vLLM's block pool queues
its KV events): the engine core puts them in its EngineOutputs, and a recorder's KVLog
(core.engine.kvlog) turns them into columns. The manager writes no log itself.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from core.engine.admission import blocks_for
from core.engine.block_pool import BlockPool, OutOfBlocks
from core.engine.prefix_cache import PrefixCache, Sparse, block_hash, extra_key
from core.errors import ConfigError
from core.trace.schema import KV_OPS


class KVCacheManager:
    def __init__(self, num_blocks: int, block_size: int, prefix_caching: bool = False,
                 model_id: str | None = None, record_events: bool = False):
        if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size < 1:
            raise ConfigError(f"block_size: expected a positive integer, got {block_size!r}")
        self.block_size = block_size
        self.prefix = PrefixCache(block_size, model_id) if prefix_caching else None
        self.pool = BlockPool(num_blocks, self.prefix)
        self.num_blocks = num_blocks
        self.prefix_caching = prefix_caching
        self.model_id = model_id
        self.events: list | None = [] if record_events else None   # block events not yet taken
        self.now_ms = 0.0                      # set by the caller; stamps events
        self.tables: dict[Any, list[int]] = {}   # seq id -> [physical block per logical block]
        self.chain: dict[Any, list] = {}       # seq id -> hashes of its full blocks so far
        self.extra: dict[Any, Any] = {}        # seq id -> extra-key bytes (model + salt)
        self.counts = {op: 0 for op in KV_OPS}
        # hit blocks on each sequence's first admission (a re-admission after a preemption hits
        # its own blocks again: core.analysis.fleet's hit rate leaves those out)
        self.hits_first = 0
        self._admitted: set = set()

    # ---- queries -------------------------------------------------------------------
    @property
    def num_free(self) -> int:
        p = self.pool   # (inlined: asked several times per step)
        return len(p.free_plain) + (p.num_blocks - p.fresh) + len(p.free_cached)

    @property
    def num_used(self) -> int:
        return self.num_blocks - self.num_free

    @property
    def ref(self) -> np.ndarray:
        """References per block (tables holding it). Before any sharing, computed from the
        tables on each access (a copy: writing into it changes nothing)."""
        return self.pool.refs_from(self.tables.values())

    @property
    def hash(self) -> dict:
        """Block -> hash of the cached prefix it holds (None: uncached)."""
        return self.prefix.hash if self.prefix is not None else _NONE

    def num_cached_free(self) -> int:
        return len(self.prefix.free_cached) if self.prefix is not None else 0

    def match_prefix(self, token_ids, salt: str | None = None, max_tokens: int | None = None) -> list[int]:
        """Physical blocks holding the longest cached exact prefix of `token_ids` (full
        blocks only, at most `max_tokens` tokens). Pure: changes nothing."""
        if self.prefix is None:
            return []
        return self.prefix.match(token_ids, salt, max_tokens)

    def admission_cost(self, hits: list[int], num_tokens: int) -> int:
        """Free blocks consumed by admitting a new sequence with these hits and
        `num_tokens` slots: fresh blocks plus hit blocks that are currently free."""
        free = self.prefix.free_cached if hits else ()  # type: ignore[union-attr]  # (hits: a prefix cache; a free hit is cached-free)
        revived = sum(1 for b in hits if b in free)
        return revived + max(0, blocks_for(num_tokens, self.block_size) - len(hits))

    # ---- mutations -----------------------------------------------------------------
    def take_events(self) -> list:
        """The block events recorded since the last call (KVLog.extend reads them), forgotten
        here; [] when events are not recorded."""
        ev = self.events
        if not ev:
            return []
        self.events = []
        return ev

    def _rec(self, op, seq, blocks, logical0, step, refs, hashes=None, src=-1):
        self.counts[op] += len(blocks)
        if self.events is not None:
            self.events.append((self.now_ms, op, seq, blocks, logical0, step, refs, hashes, src))

    def _take(self, n: int) -> list[int]:
        """n free blocks from the pool (evictions from the prefix cache logged)."""
        new, evicted = self.pool.take(n)
        for b, h in evicted:
            self._rec("evict", None, [b], -1, 0, 0, [h])
        return new

    def admit(self, seq, hits: list[int] | tuple = (), salt: str | None = None) -> int:
        """Start a sequence's table with cache hits; returns the number of cached tokens."""
        if seq in self.tables:
            raise ValueError(f"sequence {seq!r} already has a block table")
        self.extra[seq] = extra_key(self.model_id, salt)
        first = seq not in self._admitted
        if first:
            self._admitted.add(seq)
        if not hits:
            self.tables[seq], self.chain[seq] = [], []
            return 0
        hits = list(hits)
        self.pool.start_sharing(self.tables.values())   # (counts kept from the first hit on)
        self.pool.share(hits)
        self.tables[seq] = list(hits)  # the table grows; the logged hit list must not
        self.chain[seq] = [self.prefix.hash[b] for b in hits]  # type: ignore[union-attr]  # (hits: a prefix cache)
        self._rec("hit", seq, hits, 0, 1, self.pool.refcount[hits].tolist(), list(self.chain[seq]))
        if first:
            self.hits_first += len(hits)
        return len(hits) * self.block_size

    def grow(self, seq, num_tokens: int) -> list[int]:
        """Make the table cover `num_tokens` positions; returns the new blocks."""
        table = self.tables[seq]
        need = blocks_for(num_tokens, self.block_size) - len(table)
        if need <= 0:
            return []
        new = self._take(need)
        self._rec("alloc", seq, new, len(table), 1, 1)
        table.extend(new)
        return new

    def grow_many(self, seqs, needs):
        """Append needs[i] fresh blocks to seqs[i]'s table, for many sequences at once (one log
        call: per-block owners and logical indices)."""
        new, tables, rec = self._take(sum(needs)), self.tables, self.events is not None
        owners: list = []
        logical: list[int] = []
        pos = 0
        for seq, k in zip(seqs, needs):
            table = tables[seq]
            if rec:
                owners += [seq] * k
                logical += range(len(table), len(table) + k)
            table += new[pos:pos + k]
            pos += k
        self._rec("alloc", owners, new, logical, 0, 1)

    def grow_one_each(self, seqs: list):
        """One fresh block for each of `seqs` (a list, each once), in order: decoders whose
        position starts a block. The same blocks and log as grow_many with needs of 1."""
        new: list[Any] = self._take(len(seqs))   # (Any: the ids go from list to list unconverted)
        tables, logical = self.tables, []
        for s, b in zip(seqs, new):
            table = tables[s]
            logical.append(len(table))
            table.append(b)
        self._rec("alloc", seqs, new, logical if self.events is not None else None, 0, 1)

    def append_blocks(self, owners: list, times_ms) -> bool:
        """One fresh block for each entry of `owners` (a sequence may appear many times), in
        order, logged at the matching `times_ms` (a fast-forwarded run of steps). Only when no
        eviction is needed (returns False and does nothing otherwise), so the result equals
        one-by-one growth."""
        n = len(owners)
        if n > self.pool.num_uncached_free:
            return False
        new = self.pool.take_uncached(n)
        tables = self.tables
        logical = []
        for seq, b in zip(owners, new):
            t = tables[seq]
            logical.append(len(t))
            t.append(b)
        self.counts["alloc"] += n
        if self.events is not None:
            self.events.append((list(times_ms), "alloc", list(owners), new, logical, 0, 1, None, -1))
        return True

    def prepare_write(self, seq, start_pos: int, num_tokens: int) -> tuple[list[int], list[tuple[int, int]]]:
        """Before writing positions [start_pos, start_pos+num_tokens): copy any block in
        that range that another sequence also references (copy-on-write), then allocate
        blocks to cover the end. Returns (new blocks, [(src, dst) copies]) so a real
        engine can copy the KV data."""
        table = self.tables[seq]
        first = start_pos // self.block_size
        end_blocks = blocks_for(start_pos + num_tokens, self.block_size)
        ref = self.pool.refcount
        cows = [i for i in range(first, min(len(table), end_blocks)) if ref[table[i]] > 1] if self.pool.live else []
        need = len(cows) + max(0, end_blocks - len(table))
        if need > self.num_free:
            raise OutOfBlocks(f"need {need} blocks, {self.num_free} free")
        copies = []
        for i in cows:
            src = table[i]
            dst = self._take(1)[0]
            self.pool.refcount[src] -= 1   # (it keeps its other owners)
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
        self.pool.start_sharing(self.tables.values())
        self.pool.share(table)
        self.tables[child] = table
        self.chain[child] = list(self.chain[parent])
        self.extra[child] = self.extra[parent]

    def commit(self, seq, token_ids, num_computed: int, known: int = 0, pad_id: int = 0):
        """Register the sequence's full, computed blocks in the prefix cache.
        `token_ids` are all known ids of the sequence (prompt + outputs). `known` over
        len(token_ids): tokens whose ids were not given (a simulated request's outputs) count as
        `pad_id` each up to `known` (a value no tokenizer makes: such blocks match only the same
        sequence's, recomputed after a preemption)."""
        if self.prefix is None or token_ids is None:
            return
        bs = self.block_size
        table, chain = self.tables[seq], self.chain[seq]
        full = min(num_computed, max(len(token_ids), known)) // bs
        extra = self.extra[seq]
        for i in range(len(chain), min(full, len(table))):
            chunk = tuple(token_ids[i * bs:(i + 1) * bs])
            if len(chunk) < bs:
                chunk += (pad_id,) * (bs - len(chunk))
            h = block_hash(chain[-1] if chain else None, chunk, extra)
            chain.append(h)
            b = table[i]
            if self.prefix.insert(b, h, chunk):   # (else an identical block is already cached)
                self._rec("cache", seq, [b], i, 1, int(self.pool.refcount[b]) if self.pool.live else 1, [h])

    def _release(self, seq, blocks: list[int], logical0: int, step: int):
        logged, refs, hashes = self.pool.release(blocks)
        self._rec("free", seq, logged, logical0, step, refs, hashes)

    def truncate(self, seq, num_tokens: int):
        """Drop blocks past `num_tokens` positions (speculative rollback)."""
        table = self.tables[seq]
        keep = blocks_for(num_tokens, self.block_size)
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
        """Raise AssertionError if an invariant is broken: every block free xor referenced,
        reference counts equal to table references, the prefix cache consistent."""
        refs = np.zeros(self.num_blocks, dtype=np.int64)
        for seq, table in self.tables.items():
            assert len(set(table)) == len(table), f"{seq}: a block appears twice in its table"
            np.add.at(refs, table, 1)
        ref = self.ref
        bad = np.flatnonzero(refs != ref)
        assert not len(bad), f"block {bad[0]}: ref {ref[bad[0]]} but {refs[bad[0]]} table refs"
        self.pool.check(ref)
        if self.prefix is not None:
            self.prefix.check(self.block_size)


_NONE = Sparse()   # (no prefix cache: every block uncached)
