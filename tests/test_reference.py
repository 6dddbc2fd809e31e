"""Every reference number of the source chapters (DESIGN.md, "Reference checks"), checked
through the public core functions. Expected values are the chapters' own numbers, or
arithmetic written out here, never output of the code under test."""
import math

import numpy as np
import pytest

from core.analysis.metrics import cost_usd, request_metrics, throughput
from core.config import SchedulerConfig
from core.engine.kv_cache import KVCacheManager
from core.formulas import kv, roofline, speculative, tiles
from core.sim.simulate import simulate
from core.trace import load_trace
from core.workload import load_workload, make_workload
from tests.conftest import DATA
from tests.helpers import emissions

# ---- Three-request scenario (Table 31.1) ------------------------------------------------


@pytest.fixture(scope="module")
def serial():
    return load_trace(DATA / "traces" / "chapter31_serial.json")


@pytest.fixture(scope="module")
def continuous():
    return load_trace(DATA / "traces" / "chapter31_continuous.json")


def by_id(trace):
    return request_metrics(trace).set_index("id")


def test_given_emissions(serial, continuous):
    assert emissions(serial) == {"A": [100, 140, 180], "B": [260, 300], "C": [360]}
    assert emissions(continuous) == {"A": [100, 150, 200], "B": [150, 200], "C": [180]}
    assert serial.meta["source"] == continuous.meta["source"] == "given"
    arrivals = dict(zip(serial.ids, serial.requests["arrival_ms"]))
    assert arrivals == {"A": 0, "B": 20, "C": 40}
    lens = {r: (p, o) for r, p, o in zip(serial.ids, serial.requests["prompt_tokens"],
                                         serial.requests["max_output_tokens"])}
    assert lens == {"A": (4, 3), "B": (4, 2), "C": (2, 1)}


def test_ttft(serial, continuous):
    assert by_id(serial)["ttft_ms"].to_dict() == {"A": 100, "B": 240, "C": 320}
    assert by_id(continuous)["ttft_ms"].to_dict() == {"A": 100, "B": 130, "C": 140}


def test_tpot_missing_for_single_token(serial, continuous):
    s, c = by_id(serial), by_id(continuous)
    assert s.loc["A", "tpot_ms"] == 40 and s.loc["B", "tpot_ms"] == 40
    assert c.loc["A", "tpot_ms"] == 50 and c.loc["B", "tpot_ms"] == 50
    assert math.isnan(s.loc["C", "tpot_ms"]) and math.isnan(c.loc["C", "tpot_ms"])  # missing, not 0


def test_durations_exercise_1(serial, continuous):
    s, c = by_id(serial), by_id(continuous)
    assert (s.loc["A", "e2e_ms"], s.loc["B", "e2e_ms"]) == (180, 280)
    assert (c.loc["A", "e2e_ms"], c.loc["B", "e2e_ms"]) == (200, 180)
    # B finishes 100 ms sooner in duration, A 20 ms later.
    assert s.loc["B", "e2e_ms"] - c.loc["B", "e2e_ms"] == 100
    assert c.loc["A", "e2e_ms"] - s.loc["A", "e2e_ms"] == 20


def test_throughput_windows(serial, continuous):
    assert throughput(serial).tok_per_s == pytest.approx(6 / 0.360)
    assert round(throughput(serial).tok_per_s, 3) == 16.667
    assert throughput(continuous).tok_per_s == pytest.approx(30.0)
    assert (throughput(serial).start_ms, throughput(serial).end_ms) == (0, 360)
    for tr in (serial, continuous):
        assert throughput(tr, (0, 400)).tok_per_s == pytest.approx(15.0)
        assert throughput(tr, (0, 500)).tok_per_s == pytest.approx(12.0)


def test_cost(serial, continuous):
    cs, ps = cost_usd(throughput(serial), 2.0)
    cc, pc = cost_usd(throughput(continuous), 2.0)
    assert cs == pytest.approx(0.0002)
    assert cc == pytest.approx(0.000111111, abs=1e-9)
    assert ps == pytest.approx(0.033333, abs=1e-6)
    assert pc == pytest.approx(0.018519, abs=1e-6)


# ---- Prefix identity -------------------------------------------------------------------

def shared_prefix_len(a, b):
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


@pytest.mark.parametrize("other,expected", [([10, 11, 12, 14], 3), ([20, 21], 0)])
def test_prefix_identity_block_size_1(other, expected):
    # With one-token blocks the cache reuses exactly the longest shared token prefix.
    bm = KVCacheManager(16, 1, prefix_caching=True)
    a = [10, 11, 12, 13]
    bm.admit("A")
    bm.grow("A", len(a))
    bm.commit("A", a, len(a))
    hits = bm.match_prefix(other)
    assert len(hits) == expected == shared_prefix_len(a, other)


def test_same_words_different_order_is_a_miss():
    bm = KVCacheManager(16, 1, prefix_caching=True)
    a = [10, 11, 12, 13]
    bm.admit("A"); bm.grow("A", 4); bm.commit("A", a, 4)
    assert bm.match_prefix([11, 10, 12, 13]) == []


# ---- Tile merge (Example 31.2) ----------------------------------------------------------

def test_tile_merge():
    weights, values = [4, 2, 1, 1], [1, 3, 0, 2]
    logits = np.log(weights)
    assert tiles.online_softmax(logits, values, tile_size=2) == pytest.approx(1.5)
    assert tiles.online_softmax(logits, values, tile_size=4) == pytest.approx(12 / 8)
    assert tiles.merge_partials([(10, 6), (2, 2)]) == 1.5
    assert tiles.mean_of_ratios([(10, 6), (2, 2)]) == pytest.approx(4 / 3)
    assert tiles.average_of_tile_averages(logits, values, 2) == pytest.approx(4 / 3)
    steps = tiles.online_softmax_steps(logits, values, 2)
    # Tile 1 alone: numerator 10, denominator 6 at scale e^0 -> output 10/6.
    assert float(steps[0].output) == pytest.approx(10 / 6)
    assert float(steps[1].tile_output) == pytest.approx(1.0)


# ---- Speculative (Example 31.3, exercise 3, the three-candidate check) ------------------

def test_paris_lyon():
    p, q = [0.6, 0.4], [0.8, 0.2]
    assert speculative.acceptance(p, q) == pytest.approx([0.75, 1.0])
    assert speculative.accepted_mass(p, q) == pytest.approx([0.6, 0.2])
    assert speculative.rejection_mass(p, q) == pytest.approx(0.2)
    assert speculative.residual(p, q) == pytest.approx([0.0, 1.0])
    assert speculative.final_distribution(p, q) == pytest.approx([0.6, 0.4])
    assert speculative.wrong_final_distribution(p, q)[0] == pytest.approx(0.72)


def test_exercise_3():
    p, q = [0.3, 0.7], [0.6, 0.4]
    assert speculative.acceptance(p, q) == pytest.approx([0.5, 1.0])
    assert speculative.accepted_mass(p, q) == pytest.approx([0.3, 0.4])
    assert speculative.rejection_mass(p, q) == pytest.approx(0.3)
    assert speculative.residual(p, q) == pytest.approx([0.0, 1.0])
    assert speculative.final_distribution(p, q) == pytest.approx([0.3, 0.7])


def test_three_candidates_mass_adds_up():
    p, q = np.array([0.2, 0.5, 0.3]), np.array([0.6, 0.3, 0.1])
    accepted = np.array(speculative.accepted_mass(p, q))
    positive_part = np.maximum(p - q, 0)
    np.testing.assert_allclose(accepted + positive_part, p)
    assert accepted.sum() + positive_part.sum() == pytest.approx(1.0)
    np.testing.assert_allclose(speculative.final_distribution(p, q), p)
    assert not np.allclose(q, p)  # blindly accepting the draft would be wrong


def test_residual_zero_when_equal():
    assert speculative.residual([0.5, 0.5], [0.5, 0.5]) == [0.0, 0.0]


# ---- Static vs continuous (3 slots) -----------------------------------------------------

@pytest.mark.parametrize("outputs,static_steps,continuous_steps",
                         [([5, 20, 10, 15, 10], 35, 20), ([5] * 6, 10, 10)])
def test_static_vs_continuous(outputs, static_steps, continuous_steps):
    w = make_workload([(i, 0, 4, o) for i, o in enumerate(outputs)])
    st = simulate(w, SchedulerConfig(policy="static", max_seqs=3))
    co = simulate(w, SchedulerConfig(policy="continuous", max_seqs=3))
    assert len(st.steps) == static_steps and st.tokens["t_ms"].max() == static_steps
    assert len(co.steps) == continuous_steps and co.tokens["t_ms"].max() == continuous_steps


def test_burst5_file():
    w = load_workload(DATA / "workloads" / "burst5.json")
    assert [r.max_output_tokens for r in w.requests] == [5, 20, 10, 15, 10]
    assert all(r.arrival_ms == 0 for r in w.requests)


# ---- KV sizing ---------------------------------------------------------------------------

def test_kv_bytes():
    per_token = kv.kv_bytes(32, 32, 128, 2, 1)
    assert per_token == 2 * 32 * 32 * 128 * 2 == 524_288 == 512 * 1024
    assert kv.kv_bytes(32, 32, 128, 2, 2048) == 2 ** 30
    assert kv.kv_bytes(32, 32, 128, 2, 2048, seqs=40) == 40 * 2 ** 30
    assert kv.kv_bytes(32, 32, 128, 2, 32768) == 16 * 2 ** 30
    assert kv.MODELS["Llama-2-7B"].kv_bytes_per_token(2) == 524_288
    # GQA: Llama-3-8B keeps 8 KV heads of 32 query heads -> a quarter of the bytes.
    assert kv.MODELS["Llama-3-8B"].kv_bytes_per_token(2) == 2 * 32 * 8 * 128 * 2


# ---- Roofline ----------------------------------------------------------------------------

def test_roofline():
    assert roofline.arithmetic_intensity(1, 2) == 1
    assert roofline.arithmetic_intensity(32, 2) == 32
    assert roofline.arithmetic_intensity(2048, 2) == 2048
    steps = roofline.bandwidth_bound_steps_per_s(2e12, 7e9 * 2)
    assert steps == pytest.approx(142.857, abs=1e-3)
    assert math.isclose(steps, 142.85714285714286)


# ---- Cached attention equals full causal attention --------------------------------------

def test_cached_attention_equals_full():
    rng = np.random.default_rng(124)
    x = rng.standard_normal((7, 4))
    Wq, Wk, Wv = (rng.standard_normal((4, 4)) for _ in range(3))
    q, k, v = x @ Wq, x @ Wk, x @ Wv
    full = tiles.causal_attention(q, k, v)
    cached = tiles.cached_attention(q, k, v)
    np.testing.assert_allclose(cached, full, atol=1e-12)
    # Independent check of the last row, straight from the definition.
    s = k @ q[-1] / 2.0
    w = np.exp(s) / np.exp(s).sum()
    np.testing.assert_allclose(full[-1], w @ v, atol=1e-12)
    # A wrong cached value breaks the identity.
    v_bad = v.copy()
    v_bad[3] += 1.0
    wrong = tiles.cached_attention(q, k, v_bad)
    np.testing.assert_allclose(wrong[:3], full[:3], atol=1e-12)  # earlier positions never see it
    assert not np.allclose(wrong[-1], full[-1])
    tiled, _ = tiles.tiled_causal_attention(q, k, v, 3, 2)
    np.testing.assert_allclose(tiled, full, atol=1e-12)
