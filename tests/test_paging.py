"""Block manager: unit tests and property tests of its invariants."""
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from core.engine.kv_cache import KVCacheManager, OutOfBlocks
from core.engine.kvlog import KVLog
from core.errors import ConfigError


def fill(bm, seq, ids, salt=None):
    hits = bm.match_prefix(ids, salt, max_tokens=len(ids) - 1)
    bm.admit(seq, hits, salt)
    bm.grow(seq, len(ids))
    bm.commit(seq, ids, len(ids))
    return hits


def test_alloc_and_free_roundtrip():
    bm = KVCacheManager(8, 4)
    bm.admit("a")
    assert bm.grow("a", 9) == [0, 1, 2]  # ceil(9/4) = 3 blocks, lowest ids first
    assert bm.num_free == 5
    bm.check()
    assert bm.free_seq("a") == 3
    assert bm.num_free == 8
    bm.check()


def test_out_of_blocks():
    bm = KVCacheManager(2, 4)
    bm.admit("a")
    with pytest.raises(OutOfBlocks):
        bm.grow("a", 9)
    bm.check()


def test_bad_config():
    with pytest.raises(ConfigError, match="kv_blocks"):
        KVCacheManager(0, 4)
    with pytest.raises(ConfigError, match="block_size"):
        KVCacheManager(4, 0)


def test_prefix_hit_only_full_blocks_and_exact_tokens():
    bm = KVCacheManager(16, 4, prefix_caching=True)
    a = list(range(10))            # blocks [0-3] [4-7] full, [8,9] partial
    fill(bm, "a", a)
    assert bm.counts["cache"] == 2   # only full blocks are cached
    assert len(bm.match_prefix(a[:8] + [99])) == 2
    assert len(bm.match_prefix(a[:4] + [99] * 5)) == 1
    assert bm.match_prefix([1] + a[1:]) == []          # first token differs
    assert len(bm.match_prefix(a, max_tokens=7)) == 1  # capped: keep one token to compute


def test_tenant_salt_and_model_id_isolate():
    bm = KVCacheManager(16, 4, prefix_caching=True, model_id="m1")
    ids = list(range(8))
    fill(bm, "a", ids, salt="acme")
    assert len(bm.match_prefix(ids + [0], "acme")) == 2
    assert bm.match_prefix(ids + [0], "globex") == []
    assert bm.match_prefix(ids + [0], None) == []
    other = KVCacheManager(16, 4, prefix_caching=True, model_id="m2")
    fill(other, "a", ids, salt="acme")
    # Same tokens and tenant under another model id hash differently.
    assert bm.tables["a"] and other.chain["a"][0] != bm.chain["a"][0]


def test_hit_revives_cached_free_block_and_lru_eviction():
    bm = KVCacheManager(4, 2, prefix_caching=True)
    fill(bm, "a", [1, 2, 3, 4])        # 2 blocks cached
    bm.free_seq("a")
    assert bm.num_free == 4 and bm.num_cached_free() == 2
    hits = fill(bm, "b", [1, 2, 3, 4, 5])
    assert len(hits) == 2 and bm.counts["hit"] == 2
    bm.free_seq("b")
    bm.check()
    # Fill the pool with unrelated blocks: uncached ones go first, then LRU cached evict.
    bm.admit("c")
    bm.grow("c", 8)
    assert bm.counts["evict"] == 2
    assert bm.match_prefix([1, 2, 3, 4, 5]) == []
    bm.check()


def test_fork_then_copy_on_write():
    bm = KVCacheManager(8, 4, record_events=True)
    bm.admit("p")
    bm.grow("p", 6)                    # blocks 0 (full), 1 (2 of 4 used)
    bm.fork("p", "c")
    assert bm.ref[0] == 2 and bm.ref[1] == 2
    new, copies = bm.prepare_write("c", 6, 1)  # child appends into the shared partial block
    assert new == [] and len(copies) == 1
    src, dst = copies[0]
    assert src == 1 and bm.tables["c"] == [0, dst] and bm.tables["p"] == [0, 1]
    assert bm.ref[1] == 1 and bm.ref[dst] == 1 and bm.ref[0] == 2
    assert bm.counts["cow"] == 1
    bm.check()
    # Parent appending now owns its block alone: no copy.
    assert bm.prepare_write("p", 6, 3)[1] == []
    bm.free_seq("p"); bm.free_seq("c")
    assert bm.num_free == 8
    bm.check()
    log = KVLog()
    log.extend(bm.take_events())
    cols = log.columns()
    assert "cow" in [("alloc", "free", "hit", "cache", "evict", "cow")[o] for o in cols["op"]]


def test_truncate_returns_blocks():
    bm = KVCacheManager(8, 4)
    bm.admit("a")
    bm.grow("a", 13)                   # 4 blocks
    bm.truncate("a", 5)                # keep 2
    assert len(bm.tables["a"]) == 2 and bm.num_free == 6
    bm.check()


def test_log_columns_expand_per_block():
    bm = KVCacheManager(8, 2, record_events=True)
    bm.now_ms = 5.0
    bm.admit(7)
    bm.grow(7, 5)
    bm.free_seq(7)
    log = KVLog()
    log.extend(bm.take_events())
    assert bm.take_events() == []          # taken once
    c = log.columns()
    assert c["block"].tolist() == [0, 1, 2, 2, 1, 0]
    assert c["logical"].tolist() == [0, 1, 2, 2, 1, 0]
    assert c["req"].tolist() == [7] * 6
    assert c["ref"].tolist() == [1, 1, 1, 0, 0, 0]
    assert c["t_ms"].tolist() == [5.0] * 6


# ---- property tests -----------------------------------------------------------------

class KVCacheMachine(RuleBasedStateMachine):
    """Random allocate / append / fork / commit / free sequences. A shadow model records
    what each cached block holds, to check that hits are exact and tenant-isolated."""

    def __init__(self):
        super().__init__()
        self.bm = KVCacheManager(24, 4, prefix_caching=True)
        self.tokens = {}       # seq -> its token ids
        self.salt = {}
        self.content = {}      # block -> (salt, token prefix through this block)
        self.next_id = 0

    def _commit_shadow(self, seq):
        # Always (re)record: within one rule a cached-free block can be evicted, reallocated to
        # this sequence and committed with new content, so an older record may be stale. Hits
        # were checked against the old record before this point.
        bm = self.bm
        for i, b in enumerate(bm.tables[seq][: len(self.tokens[seq]) // 4]):
            if bm.hash[b] is not None:
                self.content[b] = (self.salt[seq], tuple(self.tokens[seq][: (i + 1) * 4]))

    @rule(ids=st.lists(st.integers(0, 3), min_size=1, max_size=14), salt=st.sampled_from([None, "x", "y"]))
    def allocate(self, ids, salt):
        bm = self.bm
        hits = bm.match_prefix(ids, salt, max_tokens=len(ids) - 1)
        for i, b in enumerate(hits):  # every hit is exact and from the same tenant
            assert self.content[b] == (salt, tuple(ids[: (i + 1) * 4]))
        if bm.admission_cost(hits, len(ids)) > bm.num_free:
            return
        seq = self.next_id
        self.next_id += 1
        bm.admit(seq, hits, salt)
        bm.grow(seq, len(ids))
        self.tokens[seq], self.salt[seq] = list(ids), salt
        bm.commit(seq, ids, len(ids))
        self._commit_shadow(seq)

    @precondition(lambda self: self.tokens)
    @rule(data=st.data(), n=st.integers(1, 6))
    def append(self, data, n):
        seq = data.draw(st.sampled_from(sorted(self.tokens)))
        bm = self.bm
        start = len(self.tokens[seq])
        try:
            bm.prepare_write(seq, start, n)
        except OutOfBlocks:
            return
        self.tokens[seq] += data.draw(st.lists(st.integers(0, 3), min_size=n, max_size=n))
        bm.commit(seq, self.tokens[seq], len(self.tokens[seq]))
        self._commit_shadow(seq)

    @precondition(lambda self: self.tokens)
    @rule(data=st.data())
    def fork(self, data):
        parent = data.draw(st.sampled_from(sorted(self.tokens)))
        child = self.next_id
        self.next_id += 1
        self.bm.fork(parent, child)
        self.tokens[child] = list(self.tokens[parent])
        self.salt[child] = self.salt[parent]

    @precondition(lambda self: self.tokens)
    @rule(data=st.data())
    def free(self, data):
        seq = data.draw(st.sampled_from(sorted(self.tokens)))
        self.bm.free_seq(seq)
        del self.tokens[seq]

    @rule()
    def evict_pressure(self):
        # Take every free block (forcing LRU eviction of cached-free ones), then give back.
        bm = self.bm
        n = bm.num_free
        if n == 0:
            return
        seq = ("hog", self.next_id)
        self.next_id += 1
        bm.admit(seq)
        bm.grow(seq, n * 4)
        assert bm.num_free == 0 and bm.num_cached_free() == 0
        assert all(bm.ref[b] > 0 for b in bm.prefix.cache.values())  # cached-free blocks were evicted
        bm.free_seq(seq)
        for b in list(self.content):
            if bm.hash[b] is None:
                del self.content[b]

    @invariant()
    def invariants_hold(self):
        self.bm.check()
        for b in list(self.content):     # forget evicted contents
            if self.bm.hash[b] is None:
                del self.content[b]

    def teardown(self):
        for seq in list(self.tokens):
            self.bm.free_seq(seq)
        assert self.bm.num_free == self.bm.num_blocks  # after everything finishes, all free
        self.bm.check()


TestKVCacheMachine = KVCacheMachine.TestCase
TestKVCacheMachine.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)


@given(st.lists(st.integers(1, 40), min_size=1, max_size=20), st.integers(1, 8))
@settings(max_examples=100, deadline=None)
def test_grow_many_equals_individual_grows(lengths, bs):
    a = KVCacheManager(800, bs)   # room for the largest draw: 20 sequences x 40 one-token blocks
    b = KVCacheManager(800, bs)
    for i in range(len(lengths)):
        a.admit(i); b.admit(i)
    a.grow_many(list(range(len(lengths))), [-(-n // bs) for n in lengths])
    for i, n in enumerate(lengths):
        b.grow(i, n)
    assert a.tables == b.tables
    a.check(); b.check()


def test_admission_cost_counts_cached_free_hits_before_and_after_sharing():
    """A hit consumes a free block only when it is cached-free (in the prefix cache's LRU); the
    pool keeps reference counts only from the first shared block on, and the cost is the same
    before and after (hand counts: 2-token blocks, 5-token prompts need 3 blocks)."""
    bm = KVCacheManager(16, 2, prefix_caching=True)
    fill(bm, "a", [1, 2, 3, 4, 5])          # a's 2 full blocks cached, in use
    fill(bm, "b", [7, 8, 9, 10, 11])
    bm.free_seq("b")                         # b's 2 full blocks cached-free
    assert not bm.pool.live                  # no block has had two owners yet
    in_use, cached_free = [1, 2, 3, 4, 0], [7, 8, 9, 10, 0]
    costs = []
    for _ in range(2):
        costs.append([bm.admission_cost(bm.match_prefix(p, max_tokens=4), 5) for p in (in_use, cached_free)])
        fill(bm, f"c{len(costs)}", [1, 2, 3, 4, 6])   # hits a's blocks: shared from here on
    assert bm.pool.live
    assert costs == [[1, 3], [1, 3]]         # in use: 1 fresh block; cached-free: 2 revived + 1 fresh
    bm.check()
