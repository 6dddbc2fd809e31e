"""The CPU tier under the prefix cache (core.kvtier), simulated with vLLM 0.32's offloading rules
(docs/kv-tiers.md). Expected values are worked out here from the rules and the configuration (copy
time = latency + blocks x bytes / bandwidth), not read back from the code. Four tests each fail on a
simulator that makes one of the public mistakes the issue names (inference-sim #511, #1586, #1699,
#1726)."""
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from core.analysis.kv_tiers import copy_totals, hit_rates, hits_by_tier
from core.config import SchedulerConfig
from core.errors import ConfigError
from core.kvtier.policy import ARC, LRU
from core.sim.simulate import _run, simulate, simulator
from core.sim.stepmodel import StepModel
from core.workload import Request, Workload

BS = 16
MB = 1 << 20
STEP = StepModel("affine", base_ms=1.0, prefill_ms_per_token=0.05, decode_ms_per_seq=0.1)


def prefix(k: int) -> tuple:
    return tuple(range(1000 * (k + 1), 1000 * (k + 1) + 4 * BS))   # 4 full blocks


def req(name: str, t: float, k: int, suffix: int, out: int = 8) -> Request:
    ids = prefix(k) + tuple(range(100 * suffix + 1, 100 * suffix + 1 + BS))   # + one block of its own
    return Request(name, t, len(ids), out, prompt_ids=ids)


def cfg(cpu: int = 0, kv_blocks: int = 12, **kw) -> SchedulerConfig:
    tier = dict(cpu_kv_blocks=cpu, kv_block_bytes=MB, host_gbps=1.0) if cpu else {}
    return SchedulerConfig(policy="vllm-v1", token_budget=256, block_size=BS, kv_blocks=kv_blocks,
                           prefix_caching=True, kv_manager="vllm-v1", **tier, **kw)


# r0 (prefix A), r1 (B) and r2 (C) one after another: each holds 6 blocks of the 11 usable, so r2's
# allocation evicts A's cached blocks from the GPU; r3 (A again) finds A only in the CPU tier.
EVICTED_A = Workload([req("r0", 0.0, 0, 1), req("r1", 50.0, 1, 2), req("r2", 100.0, 2, 3), req("r3", 150.0, 0, 4)])
LOAD_MS = 4 * MB / 1e6   # 4 blocks of 1 MiB at 1 GB/s (10**6 bytes per ms), no latency


def first_entry(tr, rid: str):
    b = tr.batch.merge(tr.steps[["step", "t_ms"]], on="step")
    rows = b[b["req"] == tr.ids.index(rid)]
    return rows.iloc[0]


def test_a_cpu_hit_loads_before_the_prefill_and_skips_the_loaded_tokens():
    off = simulate(EVICTED_A, cfg(), STEP)
    on = simulate(EVICTED_A, cfg(cpu=64), STEP)
    a, b = first_entry(off, "r3"), first_entry(on, "r3")
    assert (a["t_ms"], a["tokens"]) == (150.0, 80)          # no tier: A is gone, the whole prompt computed
    assert b["tokens"] == 16 and b["t_ms"] == pytest.approx(150.0 + LOAD_MS)   # the engine idles while it loads
    load = [e for e in on.events_of("tier") if e["op"] == "load"]
    assert [(e["req"], e["blocks"], e["bytes"], e["first"]) for e in load] == [("r3", 4, 4 * MB, True)]
    assert load[0]["t_ms"] == 150.0 and load[0]["dur_ms"] == pytest.approx(LOAD_MS)
    h = hits_by_tier(on).set_index("id")
    assert h.loc["r3", "cpu_hit_tokens"] == 64 and h.loc["r3", "gpu_hit_tokens"] == 0


def test_stores_are_prompt_blocks_offered_as_they_are_computed_and_queue_on_one_stream():
    on = simulate(EVICTED_A, cfg(cpu=64), STEP)
    stores = [e for e in on.events_of("tier") if e["op"] == "store"]
    # every prompt's 5 full blocks once (r3's 4 loaded ones are not offered again: its own block only)
    assert [(e["req"], e["blocks"]) for e in stores] == [("r0", 5), ("r1", 5), ("r2", 5), ("r3", 1)]
    r0_prefill = first_entry(on, "r0")
    step_end = r0_prefill["t_ms"] + on.steps.set_index("step").loc[r0_prefill["step"], "dur_ms"]
    assert stores[0]["t_ms"] == pytest.approx(step_end)      # starts when the step that computed it ends
    assert stores[0]["dur_ms"] == pytest.approx(5 * MB / 1e6)
    assert copy_totals(on)["store"]["bytes"] == 16 * MB


def test_no_tier_changes_nothing_when_nothing_is_found_there():
    # one prefix, reused while still on the GPU: the tier stores but is never read; the run is the same
    w = Workload([req("a", 0.0, 0, 1), req("b", 30.0, 0, 2), req("c", 60.0, 0, 3)])
    off, on = simulate(w, cfg(kv_blocks=64), STEP), simulate(w, cfg(cpu=64, kv_blocks=64), STEP)
    for part in ("steps", "batch", "tokens", "finishes", "kv"):
        assert getattr(off, part).equals(getattr(on, part)), part
    assert not [e for e in on.events_of("tier") if e["op"] == "load"]


# ---- the four public failure modes ------------------------------------------------------------

def test_the_prefix_cache_stays_on_the_gpu_and_the_tier_is_a_copy():
    """inference-sim #511 moved the prefix cache itself to the CPU. Here a prefix still on the GPU is a
    GPU hit with no copy, while the tier holds copies of the same blocks (both tiers at once)."""
    w = Workload([req("a", 0.0, 0, 1), req("b", 30.0, 0, 2)])
    tr = simulate(w, cfg(cpu=64, kv_blocks=64), STEP)
    h = hits_by_tier(tr).set_index("id")
    assert (h.loc["b", "gpu_hit_tokens"], h.loc["b", "cpu_hit_tokens"]) == (64, 0)
    stored = {x for e in tr.events_of("tier") if e["op"] == "store" for x in e["hashes"]}
    gpu_hit = set(tr.kv[(tr.kv["op"] == "hit") & (tr.kv["req"] == 1)]["hash"])
    assert gpu_hit and gpu_hit <= stored     # the blocks b found on the GPU are in the CPU tier too


def test_the_tier_is_filled_and_read_without_any_gpu_allocation_failing():
    """#1586 consulted the CPU tier only when a GPU allocation failed. Here no allocation ever fails
    (r3 finds free blocks: nothing runs when it arrives), yet the tier was filled eagerly and r3 hits it."""
    on = simulate(EVICTED_A, cfg(cpu=64), STEP)
    assert on.meta["stats"]["preemptions"] == 0
    assert on.steps[on.steps["t_ms"] < 150.0]["running"].max() == 1   # one request at a time: no pressure
    assert hit_rates(on)["cpu_hit_tokens"] == 64


def test_a_cpu_hit_changes_latency_not_only_the_hit_rate():
    """#1699 counted CPU hits after the prefill's work was fixed: hit rate up, latency unchanged. Here the
    hit takes the loaded tokens off the prefill (fewer tokens, a shorter step), and the load's time is
    paid before it: a slower link makes the first token later."""
    def ttft(tr, rid):
        i = tr.ids.index(rid)
        return float(tr.tokens[tr.tokens["req"] == i]["t_ms"].min()) - 150.0
    off = simulate(EVICTED_A, cfg(), STEP)
    fast = simulate(EVICTED_A, cfg(cpu=64), STEP)
    slow = simulate(EVICTED_A, cfg(cpu=64, host_latency_ms=20.0), STEP)
    full, part = STEP.base_ms + 80 * 0.05, STEP.base_ms + 16 * 0.05     # the prefill step, whole and after the hit
    assert ttft(off, "r3") == pytest.approx(full)
    assert ttft(fast, "r3") == pytest.approx(LOAD_MS + part)
    assert ttft(slow, "r3") == pytest.approx(20.0 + LOAD_MS + part)


def test_one_hit_definition_with_and_without_the_tier():
    """#1726 defined the hit rate differently with and without offload. Here the GPU hit rate of a run
    whose tier is never read equals the run without a tier, by the one definition (core.analysis.kv_tiers)."""
    w = Workload([req("a", 0.0, 0, 1), req("b", 30.0, 0, 2), req("c", 60.0, 1, 3), req("d", 90.0, 1, 4)])
    off, on = hit_rates(simulate(w, cfg(kv_blocks=64), STEP)), hit_rates(simulate(w, cfg(cpu=64, kv_blocks=64), STEP))
    assert off == on
    assert off["gpu_hit_tokens"] == 2 * 64 and off["prompt_tokens"] == 4 * 80   # b and d hit their prefix


# ---- capacity, eviction, stores that find no room ---------------------------------------------

def test_lru_keeps_the_prefix_used_last():
    # a tier of 10 blocks: A (r0) and B (r1) fill it; C's store (r2) evicts 5 blocks, the least recently
    # used: A's, whose request ended first, tail first (a request's end refreshes its keys tail to head).
    # r3 (prefix A) then misses the tier, and its store evicts B's.
    tr = simulate(EVICTED_A, cfg(cpu=10), STEP)
    ev = [e for e in tr.events_of("tier") if e["op"] == "evict"]
    stores = {e["req"]: e["hashes"] for e in tr.events_of("tier") if e["op"] == "store"}
    assert [e["hashes"] for e in ev] == [stores["r0"][::-1], stores["r1"][::-1]]
    assert [e["chunks"] for e in ev] == [[4, 3, 2, 1, 0], [9, 8, 7, 6, 5]]
    assert hit_rates(tr)["cpu_hit_tokens"] == 0


def test_a_store_without_room_stores_nothing_and_is_offered_again():
    # 4 blocks of tier: r0's 5-block prompt can never fit whole (all or nothing), so nothing is stored
    tr = simulate(Workload([req("r0", 0.0, 0, 1)]), cfg(cpu=4), STEP)
    assert not tr.events_of("tier")
    assert tr.meta["stats"]["tier_store_failures"] >= 2   # offered again in the steps after


def test_the_tier_needs_the_vllm_v1_prefix_cache_and_the_block_bytes():
    with pytest.raises(ConfigError, match="prefix_caching"):
        SchedulerConfig(cpu_kv_blocks=8, kv_block_bytes=MB)
    with pytest.raises(ConfigError, match="kv_block_bytes"):
        simulate(EVICTED_A, SchedulerConfig(cpu_kv_blocks=8, prefix_caching=True, kv_manager="vllm-v1"), STEP)


# ---- the policies, against sequences worked out by hand ----------------------------------------

def _ready(p, keys):
    for k in keys:
        p.insert(k)
        p.evictable(k, True)


def test_lru_order_refresh_protection_and_all_or_nothing():
    p = LRU(4)
    _ready(p, [b"a", b"b", b"c"])
    p.finished([b"a", b"b"], set(), {b"a", b"b"})   # head a newest: ranks c < b < a
    assert p.evict(1, set()) == [b"c"]
    assert p.evict(1, {b"b"}) == [b"a"]              # b protected: the next oldest
    p.evictable(b"b", False)
    assert p.evict(1, set()) is None                 # nothing evictable: nothing changes
    p.evictable(b"b", True)
    assert p.evict(2, set()) is None and p.evict(1, set()) == [b"b"]


def test_lru_heap_keeps_only_live_entries_and_the_same_order():
    """Each refresh and each unpin pushes a heap entry and leaves the old one stale; the heap is rebuilt
    from the live entries when stale ones dominate, so it stays bounded, and the victims are still the
    evictable chunks of lowest rank (computed here from the ranks), pins and protection respected."""
    import random
    rng = random.Random(5)
    keys = [i.to_bytes(4, "little") for i in range(3000)]
    p = LRU(3000)
    _ready(p, keys)
    pinned = set()
    for _ in range(400):
        p.finished(rng.sample(keys, 40), set(), set())
        k = rng.choice(keys)
        if k in p and k not in pinned:
            p.evictable(k, False)
            pinned.add(k)
        elif k in pinned:
            p.evictable(k, True)
            pinned.discard(k)
        assert len(p._heap) <= 2 * len(p._evictable) + 1024 + 1
        if rng.random() < 0.2:
            protected = set(rng.sample(keys, 50))
            want = sorted((k for k in p._evictable if k not in protected), key=p.rank.__getitem__)[:3]
            assert p.evict(3, protected) == want
    assert len(p._heap) < 16_000     # (without the rebuild: over 18,000 entries, most of them stale)


def test_arc_moves_reused_chunks_to_t2_and_adapts_to_ghost_hits():
    p = ARC(2)
    _ready(p, [b"a", b"b"])
    p.finished([b"a"], set(), {b"a"})                # a reused: T2; b only inserted: T1
    assert (list(p.t1), list(p.t2)) == ([b"b"], [b"a"])
    assert p.evict(1, set()) == [b"b"] and list(p.b1) == [b"b"]   # |T1| >= target 0: from T1
    p.store_miss([b"b"])                             # b offered again while a ghost of B1
    assert p.target == 1.0
    _ready(p, [b"b"])
    assert list(p.b1) == []                          # re-inserted: no longer a ghost
    assert p.evict(1, set()) == [b"b"]               # |T1| = 1 >= int(target) = 1: still from T1


# ---- anything goes: random prefixes, capacities, policies ---------------------------------------

@settings(max_examples=25, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 3), st.integers(1, 40), st.integers(1, 12)), min_size=1, max_size=14),
       st.integers(1, 40), st.sampled_from(["lru", "arc"]), st.integers(8, 40), st.sampled_from([None, 32]))
def test_runs_finish_and_the_pools_stay_consistent(specs, cpu, policy, kv_blocks, budget):
    reqs = [req(f"q{i}", 7.0 * i, k, s, out) for i, (k, s, out) in enumerate(specs)]
    c = SchedulerConfig(policy="vllm-v1", token_budget=budget or 256, block_size=BS, kv_blocks=kv_blocks,
                        prefix_caching=True, kv_manager="vllm-v1", cpu_kv_blocks=cpu, cpu_kv_policy=policy,
                        kv_block_bytes=MB, host_gbps=2.0, host_latency_ms=0.5)
    w = Workload(reqs)
    core = simulator(c, STEP, w, True, True)
    tr = core.trace(w, _run(core, w, None, None))
    sched = core.scheduler
    assert sched.done() and not sched.holding and not sched.kv.tables
    sched.kv.check()
    sched.tier.check()
    assert len(tr.finishes) == len(reqs)
    loads = [e for e in tr.events_of("tier") if e["op"] == "load"]
    assert sum(e["blocks"] for e in loads) == sched.tier.stats["loaded"]
    for e in loads:   # a request's prefill never starts before its load has ended
        i = tr.ids.index(e["req"])
        b = tr.batch.merge(tr.steps[["step", "t_ms"]], on="step")
        later = b[(b["req"] == i) & (b["t_ms"] >= e["offered_ms"])]
        assert later["t_ms"].min() >= e["t_ms"] + e["dur_ms"] - 1e-9


# ---- the KV page's lesson ------------------------------------------------------------------------

def test_the_kv_page_shows_the_tier_lesson_with_the_core_numbers():
    from core.lessons import kv_tiers as L
    from tests.helpers import charts, open_page
    at = open_page("kv", {"kt_gbps": "4", "kt_model": "Llama-2-7B"})
    c = L.compare(L.CPU_BLOCKS, "lru", 4.0, L.GPU_BLOCKS, "Llama-2-7B")
    shown = {m.label: m.value for m in at.metric}
    assert shown["mean TTFT with the tier"] == f"{c['with']['ttft_mean_ms']:.1f} ms"
    assert shown["prefill tokens computed"] == f"{c['with']['prefill_tokens']:,}"
    assert shown["hits: GPU · CPU"] == f"{c['with']['gpu_hit_rate']:.1%} · {c['with']['cpu_hit_rate']:.1%}"
    # the break-even worked out here: 524,288 KV bytes a token x 989e12 FLOP/s / (2 x 6,738,415,616 parameters)
    pays = next(m.value for m in at.markdown if "loading pays above" in m.value)
    assert f"**{524_288 * 989e12 / (2 * 6_738_415_616) / 1e9:.1f} GB/s**" in pays and "does not pay" in pays
    figs = charts(at)
    titles = [(f.get("layout", {}).get("title") or {}).get("text", "") for f in figs]
    assert any("by tier over time" in t.replace("<br>", " ") for t in titles)
    anim = next(f for f in figs if f.get("frames") and "copy" in f["layout"]["sliders"][0]["currentvalue"]["prefix"])
    story = [d.get("text") for d in anim["data"] if d.get("mode") == "text"][0][0]
    assert story.replace("<br>", " ").endswith("r0 stores 5 blocks in the CPU tier")
    ops = [fr["data"][3]["text"][0].replace("<br>", " ") for fr in anim["frames"]]
    assert any("loads 4 blocks back (a CPU hit)" in t for t in ops) and any("evicted" in t for t in ops)


# ---- a fleet: each replica's tier, and routing that knows which tier holds a prefix ---------------

def test_the_tier_aware_router_counts_cpu_blocks_at_their_weight_and_prefix_aware_ignores_them():
    from core.fleet.router import Router, RouterConfig, Signals
    # replica 0 holds nothing; replica 1 holds the prompt's first 16 of 20 blocks in its CPU tier only
    cands = [Signals(0, 1, 1, 0, 10, 100, 0, 0, 0.0, 0), Signals(1, 2, 2, 0, 10, 100, 5, 0, 0.0, 16)]
    blind = Router(RouterConfig("prefix-aware", prefix="precise"), 2).choose(cands, 20)
    aware = Router(RouterConfig("tier-aware"), 2).choose(cands, 20)
    assert blind.replica == 0 and "least loaded" in blind.reason            # no GPU cache: the least loaded
    assert aware.replica == 1 and "16 in its CPU tier" in aware.reason      # 0.5 x 16 = 8 of 20: 40% > 30%
    assert aware.scores == {0: 0.0, 1: 0.4}
    half = Router(RouterConfig("tier-aware", params={"cpu_weight": 0.0}), 2).choose(cands, 20)
    assert half.replica == blind.replica and half.reason == blind.reason    # weight 0: prefix-aware's choice


def test_the_board_keeps_the_cpu_tiers_news_apart_from_the_gpu_caches():
    from core.fleet.board import Board
    b = Board()
    b.tell(1.0, "kv", [(1, b"g"), (2, b"c"), (2, b"d")])
    b.tell(2.0, "kv", [(-2, b"d"), (-1, b"x")])
    b.as_of(5.0)
    assert b.cached == {b"g"} and b.cpu == {b"c"}


def test_a_fleet_of_tiers_routed_by_tier_computes_fewer_prefill_tokens():
    from core.lessons import kv_tiers as L
    c = L.fleet_compare()
    blind, aware = c["prefix-aware"], c["tier-aware"]
    for v in (blind, aware):   # every prompt token is computed or hit on one tier (no preemption in these runs)
        assert v["prefill_tokens"] == v["prompt_tokens"] - v["gpu_hit_tokens"] - v["cpu_hit_tokens"]
        assert sum(r["cpu_hit_tokens"] for r in v["per_replica"]) == v["cpu_hit_tokens"]
    assert aware["cpu_hit_tokens"] > blind["cpu_hit_tokens"] and aware["prefill_tokens"] < blind["prefill_tokens"]
    assert aware["ttft_mean_ms"] < blind["ttft_mean_ms"]
    tr = L.fleet_run("tier-aware")
    assert {e["replica"] for e in tr.events_of("tier")} == set(range(L.FLEET_REPLICAS))
    assert any("in its CPU tier" in e["reason"] for e in tr.events_of("route"))


def test_vllm_kv_events_of_the_cpu_tier_are_counted_apart_from_the_gpu_prefix_cache():
    """vLLM publishes its CPU offloading tier's stores and evictions as KV events with medium CPU
    (docs/kv-tiers.md section 4): the GPU prefix cache over time counts only the GPU's."""
    import pandas as pd

    from core.analysis.kv_events import cache_over_time, kv_event_summary
    t = pd.DataFrame({"t_ms": [1.0, 2.0, 3.0, 4.0, 5.0], "op": ["stored", "stored", "stored", "removed", "removed"],
                      "hash": ["a", "b", "a", "a", "b"], "parent": [None, "a", None, None, None],
                      "tokens": [16, 16, 0, 0, 0], "seq": [0, 0, 1, 2, 2],
                      "medium": ["GPU", "GPU", "CPU", "GPU", "CPU"]})
    s = kv_event_summary(t)
    assert (s["stored_blocks"], s["removed_blocks"], s["peak_cached_blocks"]) == (2, 1, 2)
    assert (s["cpu_stored_blocks"], s["cpu_removed_blocks"]) == (1, 1)
    assert cache_over_time(t)["cached"].tolist() == [1, 2, 1]


@settings(max_examples=15, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 3), st.integers(1, 40), st.integers(1, 40)), min_size=1, max_size=10),
       st.integers(1, 40), st.integers(10, 40))
def test_runs_of_decode_steps_give_the_trace_of_stepping_one_by_one(specs, cpu, kv_blocks):
    from core.trace import to_doc
    w = Workload([req(f"q{i}", 7.0 * i, k, s, out) for i, (k, s, out) in enumerate(specs)])
    c = SchedulerConfig(policy="vllm-v1", token_budget=64, block_size=BS, kv_blocks=kv_blocks, prefix_caching=True,
                        kv_manager="vllm-v1", cpu_kv_blocks=cpu, kv_block_bytes=MB, host_gbps=2.0, host_latency_ms=0.5)
    assert to_doc(simulate(w, c, STEP, fast_forward=True, created="x")) == \
        to_doc(simulate(w, c, STEP, fast_forward=False, created="x"))
