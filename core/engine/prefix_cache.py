"""The prefix cache: which physical blocks hold which full blocks of tokens.

Once a block is full, it gets a chained hash
    h_i = sha256(h_{i-1} || extra keys || token ids of block i)
where the extra keys are the model/adapter id and the tenant's cache salt, so the same
tokens under another model or tenant never match. A lookup also compares the stored
token ids (a hash is a hint, the tokens are the proof).

A cached block whose last owner released it is "cached-free": it waits in LRU order and can
be revived by a later hit until the block pool needs a fresh block and evicts the least
recently released one (core.engine.block_pool).
"""
from __future__ import annotations

import functools
import hashlib
from array import array
from collections import OrderedDict
from collections.abc import Callable

from mypy_extensions import mypyc_attr


def block_hash(parent: bytes | None, tokens: tuple, extra: bytes) -> bytes:
    """A full block's chained hash (sha256 over the parent's hash, the extra keys and the token ids as
    int64), remembered: the waiting queue's heads are matched against the cache at every step they
    wait, and each match hashes the prompt's blocks from the first (vLLM keeps each request's block
    hashes instead). Forgotten all at once every _MEMO_MAX blocks."""
    key = (parent, tokens, extra)
    got = _memo.get(key)
    if got is not None:
        return got
    h = hashlib.sha256(parent or b"\x00" * 32)
    h.update(extra)
    h.update(array("q", tokens).tobytes())
    out = h.digest()
    if len(_memo) >= _MEMO_MAX:
        _memo.clear()
    _memo[key] = out
    return out


_memo: dict[tuple, bytes] = {}
_MEMO_MAX = 1 << 16


@functools.lru_cache(maxsize=4096)
def extra_key(model_id: str | None, salt: str | None) -> bytes:
    # Length-prefixed so ("ab", "c") and ("a", "bc") differ.
    parts = [(model_id or "").encode(), (salt or "").encode()]
    return b"".join(len(p).to_bytes(4, "little") + p for p in parts)


@mypyc_attr(native_class=False)
class Sparse(dict):
    """Per-block values kept only where set; absent blocks read as None."""

    def __missing__(self, key):
        return None


class PrefixCache:
    def __init__(self, block_size: int, model_id: str | None = None):
        self.block_size = block_size
        self.model_id = model_id
        # hashes and token ids exist only for cached blocks
        self.hash: dict[int, bytes | None] = Sparse()      # block -> hash of its cached prefix (None: uncached)
        self.tokens: dict[int, tuple | None] = Sparse()    # block -> token ids of a cached block
        self.cache: dict[bytes, int] = {}              # full-block hash -> physical block
        self.free_cached: OrderedDict[int, None] = OrderedDict()   # cached-free blocks, oldest release first
        # Who hears of every block entering (+1) and leaving (-1) the cache: fn(sign, hash), as an
        # engine publishes KV events (a fleet's router with precise prefix knowledge); None: nobody.
        self.listener: Callable | None = None

    def match(self, token_ids, salt: str | None = None, max_tokens: int | None = None) -> list[int]:
        """Physical blocks holding the longest cached exact prefix of `token_ids` (full
        blocks only, at most `max_tokens` tokens). Pure: changes nothing."""
        if token_ids is None or not self.cache:
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

    def insert(self, block: int, h: bytes, chunk: tuple) -> bool:
        """Cache `block` as holding `chunk` under hash `h`; False (nothing changes) when an
        identical block is already cached or the block already holds a prefix."""
        if h in self.cache or self.hash[block] is not None:
            return False
        self.hash[block] = h
        self.tokens[block] = chunk
        self.cache[h] = block
        if self.listener is not None:
            self.listener(1, h)
        return True

    def park(self, block: int):
        """A cached block lost its last owner: it waits, revivable, in LRU order."""
        self.free_cached[block] = None

    def revive(self, block: int):
        """A hit on a cached-free block: it has an owner again."""
        del self.free_cached[block]

    def evict_oldest(self) -> tuple[int, bytes]:
        """Forget the least recently released cached-free block; returns (block, its hash)."""
        b, _ = self.free_cached.popitem(last=False)
        h: bytes = self.hash.pop(b)  # type: ignore[assignment]  # (a cached block has one)
        del self.cache[h]
        del self.tokens[b]
        if self.listener is not None:
            self.listener(-1, h)
        return b, h

    def check(self, block_size: int):
        for b in self.free_cached:
            assert self.hash[b] is not None, f"block {b}: uncached but in the cached free list"
        for b, h in self.hash.items():
            assert h is not None, f"block {b}: a None hash stored"
            assert self.cache.get(h) == b, f"block {b}: hash not mapped back to it"
            assert len(self.tokens[b] or ()) == block_size
        for h, b in self.cache.items():
            assert self.hash[b] == h, f"cache entry for block {b} is stale"
