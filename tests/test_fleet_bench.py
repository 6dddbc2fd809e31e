"""bench.fleet_routing on tiny inputs: its numbers against ones worked out by hand (the KV bytes of
Llama-2-7B from its shape, the link's latency + bytes / bandwidth, prefix hits of a repeated prompt)."""
import math

import pytest

from bench import fleet_routing as fr
from core.workload import Request, Workload

LLAMA2_7B_KV_BYTES_PER_TOKEN = 2 * 32 * 32 * 128 * 2   # K and V x 32 layers x 32 KV heads x head dim 128 x fp16


def test_one_transfer_takes_latency_plus_bytes_over_bandwidth():
    w = Workload([Request("r0", 0.0, 627, 4)])          # 627 tokens: 40 blocks of 16, none held by the decode side
    row, = fr.pd_rows(w, splits=((1, 1),), links=((25.0, 0.05),), whole=False)
    nbytes = 40 * 16 * LLAMA2_7B_KV_BYTES_PER_TOKEN
    assert row["transfers"] == 1 and row["bytes_mean"] == nbytes
    assert row["dur_mean"] == pytest.approx(0.05 + nbytes / 25e9 * 1e3)       # alone on the link
    assert row["per_kb_ms"] == pytest.approx(0.05 + 1024 / 25e9 * 1e3)
    assert "| 0.050041 |" in fr.pd_table([row])


@pytest.mark.parametrize("policy, hits, imbalance", [("prefix-aware", 2, 4.0), ("round-robin", 0, 2.0)])
def test_a_repeated_prompt_hits_where_the_router_sends_it_back(policy, hits, imbalance):
    ids = tuple(range(48))                               # 3 full blocks; a hit leaves the last token: 2 blocks
    w = Workload([Request("a", 0.0, 48, 2, ids), Request("b", 100.0, 48, 2, ids)])
    got = fr.run_numbers(w, fr.simulate(w, 2000, policy))
    assert got["hits"] == got["hits_first"] == hits and got["preemptions"] == 0
    assert got["hit_rate"] == pytest.approx(hits / 6)
    assert got["imbalance"] == pytest.approx(imbalance)      # 2 requests over 4 replicas: mean 0.5
    assert math.isfinite(got["ttft_mean"])
