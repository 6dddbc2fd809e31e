"""PagedAttention frames (core.lessons.blockframes) and their animation: hand-worked block filling, and
every frame against core.analysis.occupancy's independent per-time queries."""
import numpy as np
import pytest

from core.analysis.occupancy import block_tables_at, tokens_in_cache_at
from core.config import SchedulerConfig
from core.figures.animate import paging_animation
from core.lessons.blockframes import paging_frames
from core.lessons.scenarios import shared_prefix_demo
from core.sim.simulate import simulate
from core.sim.stepmodel import StepModel
from core.workload import Request, Workload, make_workload

UNIT = StepModel("constant", step_ms=1.0)


def test_two_requests_fill_their_blocks_token_by_token():
    # block size 2; A: prompt 4, output 3; B: prompt 3, output 2; both prefilled in step 0
    tr = simulate(make_workload([("A", 0, 4, 3), ("B", 0, 3, 2)]), SchedulerConfig("continuous", block_size=2), UNIT)
    pf = paging_frames(tr, 2)
    assert pf.steps == [0, 1, 2, None]
    # step 0 scheduled: A gets blocks 0, 1 and B 2, 3, all still empty (nothing computed yet)
    assert pf.block[0].tolist() == [[0, 1, -1], [2, 3, -1]] and not pf.fill[0].any()
    # step 1 scheduled: the prompts are stored (A 2+2, B 2+1); A's decode at position 4 needs a
    # third block; B's at position 3 fits the free slot of its second block
    assert pf.block[1].tolist() == [[0, 1, 4], [2, 3, -1]]
    assert pf.fill[1].tolist() == [[2, 2, 0], [2, 1, 0]]
    # B (2 output tokens) is done after step 1: its blocks are freed; A's decode token is stored
    assert pf.block[2].tolist() == [[0, 1, 4], [-1, -1, -1]] and pf.fill[2, 0].tolist() == [2, 2, 1]
    assert "freed: B 2" in pf.stories[2] and "new blocks: A 1" in pf.stories[1]
    assert not (pf.block[3] >= 0).any()                     # the end: everything freed


def burst_with_shared_prompts(bs):
    """The shared-prompt demo's requests, all arriving at once (so they compete for blocks)."""
    w = shared_prefix_demo(n=10, tenants=2, system_tokens=12, block_size=bs)
    return Workload([Request(r.id, 0.0, r.prompt_tokens, r.max_output_tokens, prompt_ids=r.prompt_ids,
                             tenant=r.tenant) for r in w.requests])


@pytest.mark.parametrize("caching,pool", [(True, 64), (True, 20), (False, 17)])
def test_every_frame_agrees_with_the_per_time_queries(caching, pool):
    """Tables equal block_tables_at(t); tokens stored = full blocks hit in the prefix cache
    since the last preemption + tokens_in_cache_at(t), capped by the blocks held."""
    bs = 4
    w = burst_with_shared_prompts(bs)
    tr = simulate(w, SchedulerConfig("continuous", max_seqs=4, block_size=bs, kv_blocks=pool,
                                     prefix_caching=caching), UNIT)
    pf = paging_frames(tr, bs)
    assert pf is not None and pf.more_requests == 0
    kv, pre = tr.kv, tr.preempts
    for f, t in enumerate(pf.times_ms):
        tables, computed = block_tables_at(tr, t), tokens_in_cache_at(tr, t)
        for k, r in enumerate(pf.reqs):
            assert [b for b in pf.block[f, k] if b >= 0] == tables.get(r, [])
            if r not in tables:
                assert not pf.fill[f, k].any()
                continue
            since = pre.loc[(pre["req"] == r) & (pre["t_ms"] <= t), "t_ms"].max()
            hits = int(((kv["req"] == r) & (kv["op"] == "hit") & (kv["t_ms"] <= t)
                        & (kv["t_ms"] >= (since if since == since else -1))).sum())
            want = min(computed.get(r, 0) + bs * hits, len(tables[r]) * bs)
            assert int(pf.fill[f, k].sum()) == want
    if caching:
        assert (kv["op"] == "hit").any()                    # the demo shares its system prompts
    if pool < 64:
        assert len(tr.preempts)                              # the small pools preempt


def test_the_paging_animation_updates_both_panels_per_frame():
    w = shared_prefix_demo(n=6, tenants=1, system_tokens=8, block_size=4)
    tr = simulate(w, SchedulerConfig("continuous", max_seqs=3, block_size=4, kv_blocks=32, prefix_caching=True), UNIT)
    pf = paging_frames(tr, 4)
    fig = paging_animation(pf, tr.ids)
    assert len(fig.frames) == len(pf.steps) == len(fig.layout.sliders[0].steps)
    f = len(pf.steps) // 2
    logical, physical, story = fig.frames[f].data
    z = np.array(logical.z, dtype=float)
    want = np.where(pf.block[f] >= 0, pf.fill[f] / 4, np.nan)
    assert np.allclose(z, want, equal_nan=True)
    assert np.array(physical.z, dtype=float).ravel()[: pf.occupancy.num_blocks].tolist() == \
        pf.occupancy.state[:, f].astype(float).tolist()
    assert story.text[0].replace("<br>", " ") == pf.stories[f]     # wrapped to the left panel's width
    # the pool drawn whole, used or not: a pool of 64 where this run touches 32 blocks
    tr64 = simulate(w, SchedulerConfig("continuous", max_seqs=3, block_size=4, kv_blocks=64, prefix_caching=True),
                    UNIT)
    assert int(tr64.kv["block"].max()) + 1 < 64 and paging_frames(tr64, 4).occupancy.num_blocks == 64
    shared = [t for row in fig.frames[-2].data[0].text for t in row if "×" in t] + \
        [t for fr in fig.frames for row in fr.data[0].text for t in row if "×" in t]
    assert shared                                            # some frame shows a shared block (×n)
