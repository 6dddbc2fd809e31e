"""Workload loaders and metric definitions (independent hand computations)."""
import math

import numpy as np
import pytest

from core.analysis.metrics import distribution, itl_gaps, littles_law, min_samples_for, summarize, throughput
from core.errors import ConfigError, InputError, WorkloadError
from core.formulas import kv, speculative, tiles
from core.trace import trace_from_doc
from core.workload import load_workload, parse_workload
from tests.conftest import DATA


def test_chapter_workload_file():
    w = load_workload(DATA / "workloads" / "chapter31.json")
    assert [(r.id, r.arrival_ms, r.prompt_tokens, r.max_output_tokens) for r in w.requests] == \
        [("A", 0, 4, 3), ("B", 20, 4, 2), ("C", 40, 2, 1)]
    assert w.requests[0].prompt_ids == (10, 11, 12, 13)


def test_vidur_csv():
    w = parse_workload(b"arrived_at,num_prefill_tokens,num_decode_tokens\n0.5,100,20\n0.25,8,1.0\n", "t.csv")
    got = [(r.arrival_ms, r.prompt_tokens, r.max_output_tokens) for r in w.requests]
    assert got == [(250.0, 8, 1), (500.0, 100, 20)]


def test_llmservingsim_jsonl():
    data = (b'{"input_toks": 5, "output_toks": 2, "arrival_time_ns": 3000000}\n\n'
            b'{"input_toks": 1, "output_toks": 9, "arrival_time_ns": 0}\n')
    w = parse_workload(data, "t.jsonl")
    assert [(r.arrival_ms, r.prompt_tokens, r.max_output_tokens) for r in w.requests] == [(0.0, 1, 9), (3.0, 5, 2)]


def test_bundled_workloads_load():
    sizes = {p.name: len(load_workload(p)) for p in (DATA / "workloads").iterdir()}
    assert sizes["shared_prefix_200.json"] == 200 and sizes["poisson500_vidur.csv"] == 500
    assert sizes["llmservingsim64.jsonl"] == 64 and sizes["burst5.json"] == 5


@pytest.mark.parametrize("data,name,msg", [
    (b'{"requests": [{"id": "a", "arrival_ms": 0, "prompt_tokens": 4, "output_tokens": -2}]}', "w.json",
     "requests[0]: request 'a': output_tokens: expected an integer in 1..10000000, got -2"),
    (b'{"requests": [{"id": "a", "arrival_ms": 0, "output_tokens": 2}]}', "w.json", "give prompt_tokens or prompt_ids"),
    (b'{"requests": [{"id": "a", "arrival_ms": "soon", "prompt_tokens": 1, "output_tokens": 2}]}', "w.json",
     "arrival_ms: expected a number"),
    (b'{"requests": []}', "w.json", "no requests"),
    (b'{"requests": [{"id": "a", "arrival_ms": 0, "prompt_tokens": 2, "output_tokens": 1, "prompt_ids": [1]}]}',
     "w.json", "prompt_ids has 1 ids but prompt_tokens is 2"),
    (b'{"requests": [{"id": "a", "arrival_ms": 0, "prompt_tokens": 1, "output_tokens": 1},'
     b' {"id": "a", "arrival_ms": 1, "prompt_tokens": 1, "output_tokens": 1}]}', "w.json", "duplicate request id 'a'"),
    (b"arrived_at,num_prefill_tokens\n0,1\n", "w.csv", "missing column(s) num_decode_tokens"),
    (b"arrived_at,num_prefill_tokens,num_decode_tokens\n0,1,x\n", "w.csv", "row 2"),
    (b'{"input_toks": 1}\n', "w.jsonl", "line 1: missing output_toks"),
    (b"{oops", "w.json", "not valid JSON"),
])
def test_bad_workloads(data, name, msg):
    with pytest.raises(WorkloadError) as e:
        parse_workload(data, name)
    assert msg in str(e.value)


def test_metrics_hand_computed():
    # A: arrival 10, tokens at 30, 30, 45, 70 (two released together): TTFT 20, E2E 60,
    # TPOT (70-30)/3 = 13.333, ITL gaps over distinct times: 15, 25.
    doc = {"schema": "serving-trace/1", "meta": {"source": "given"},
           "requests": [{"id": "A", "arrival_ms": 10, "prompt_tokens": 1, "max_output_tokens": 4},
                        {"id": "B", "arrival_ms": 0, "prompt_tokens": 1, "max_output_tokens": 1}],
           "events": [{"t_ms": t, "type": "token", "req": "A", "index": i} for i, t in enumerate([30, 30, 45, 70])]
           + [{"t_ms": 50, "type": "token", "req": "B", "index": 0}]}
    tr = trace_from_doc(doc)
    s = summarize(tr)
    a, b = s["requests"]
    assert (a["ttft_ms"], a["e2e_ms"], a["output_tokens"]) == (20, 60, 4)
    assert a["tpot_ms"] == pytest.approx(40 / 3)
    assert b["tpot_ms"] is None and b["ttft_ms"] == 50
    assert sorted(itl_gaps(tr).tolist()) == [15, 25]
    tp = throughput(tr)
    assert (tp.start_ms, tp.end_ms, tp.emitted_tokens) == (0, 70, 5)
    assert s["summary"]["output_tok_per_s"] == pytest.approx(5 / 0.070)
    assert throughput(tr, (40, 60)).emitted_tokens == 2   # 45 and 50 inside, inclusive ends
    with pytest.raises(InputError, match="window"):
        throughput(tr, (60, 60))


def test_percentile_estimator_and_thin_tail_note():
    d = distribution([1, 2, 3, 4], "X", (50, 99))
    assert d["estimator"] == "linear"
    assert d["p50"] == 2.5 and d["p99"] == pytest.approx(3.97)   # linear: 1 + 0.99*3 = 3.97 -> between 3 and 4
    assert d["notes"] and "p99" in d["notes"][0]
    assert min_samples_for(99) == 100 and min_samples_for(90) == 10
    assert distribution(np.arange(200.0), "Y", (50, 99))["notes"] == []
    assert distribution([math.nan], "Z")["n"] == 0


def test_littles_law_identity_on_drain_window():
    from core.trace import load_trace
    tr = load_trace(DATA / "traces" / "chapter31_continuous.json")
    ll = littles_law(tr)
    # Requests in system: A 0-200, B 20-200, C 40-180 -> sum 200+180+140 = 520 ms over 200 ms.
    assert ll["L"] == pytest.approx(520 / 200)
    assert ll["lambda_W"] == pytest.approx(ll["L"])


def test_kv_capacity_and_reservation():
    m = kv.MODELS["Llama-2-7B"]
    assert m.params == pytest.approx(6.738e9, rel=1e-3)
    per_seq = m.kv_bytes_per_token(2) * 2048            # 1 GiB
    n = kv.capacity(80 * kv.GB, m.weight_bytes(2), per_seq)
    assert n == (80 * 10**9 - m.weight_bytes(2)) // 2**30
    r = kv.reservation([5, 16, 17], block_size=16, max_len=64)
    assert (r.tokens, r.paged_slots, r.contiguous_slots) == (38, 16 + 16 + 32, 192)
    assert r.paged_waste == 26 and r.contiguous_waste == 154
    assert "GiB" in kv.fmt_bytes(2**30) and "1.074 GB" in kv.fmt_bytes(2**30)
    with pytest.raises(ConfigError, match="tokens"):
        kv.kv_bytes(32, 32, 128, 2, -1)


def test_hf_config_reader():
    cfg = {"hidden_size": 3584, "num_attention_heads": 28, "num_key_value_heads": 4, "num_hidden_layers": 28,
           "intermediate_size": 18944, "vocab_size": 152064, "model_type": "qwen2", "tie_word_embeddings": False}
    spec = kv.model_from_hf_config(cfg, "q")
    assert spec == kv.ModelSpec("q", 28, 3584, 28, 4, 128, 18944, 152064, False, True, "config.json")
    assert spec.params == pytest.approx(7.6e9, rel=0.01)   # Qwen2.5-7B: 7.61 B parameters
    with pytest.raises(ConfigError, match="hidden_size"):
        kv.model_from_hf_config({})


def test_expected_tokens_and_break_even():
    assert speculative.expected_tokens(0.0, 4) == 1.0
    assert speculative.expected_tokens(1.0, 4) == 5.0
    assert speculative.expected_tokens(0.5, 2) == pytest.approx(1 + 0.5 + 0.25)
    assert speculative.alpha([0.6, 0.4], [0.8, 0.2]) == pytest.approx(0.8)
    # alpha 0.8, gamma 4: E = (1 - 0.8^5)/0.2 = 3.3616; cost 4*0.1 + 1 = 1.4 -> 2.4011x
    assert speculative.speedup(0.8, 4, 0.1) == pytest.approx(3.3616 / 1.4)
    c = speculative.break_even_draft_cost(0.8, 4)
    assert speculative.speedup(0.8, 4, c) == pytest.approx(1.0)


def test_monte_carlo_matches_target_and_wrong_rule_does_not():
    p, q = [0.6, 0.4], [0.8, 0.2]
    ok = speculative.monte_carlo(p, q, 200_000, seed=1)
    bad = speculative.monte_carlo(p, q, 200_000, seed=1, wrong=True)
    assert abs(ok["freq"][0] - 0.6) < 0.005
    assert abs(bad["freq"][0] - 0.72) < 0.005
    assert ok["accept_rate"] == pytest.approx(0.8, abs=0.005)


def test_hbm_traffic_naive_exceeds_tiled_for_long_sequences():
    r = tiles.hbm_traffic_bytes(4096, 128, 2, block_q=128)
    # naive: 4*T*d*b + 4*T^2*b ; tiled: 2*T*d*b + (T/128)*2*T*d*b
    T, d, b = 4096, 128, 2
    assert r["naive_bytes"] == 4 * T * d * b + 4 * T * T * b
    assert r["tiled_bytes"] == 2 * T * d * b + 32 * 2 * T * d * b
    assert r["ratio"] > 1


def test_online_softmax_stable_with_huge_logits():
    logits = [1000.0, 1001.0, 999.0, -1000.0]
    v = [1.0, 2.0, 3.0, 4.0]
    w = np.exp(np.array(logits) - 1001.0)
    assert tiles.online_softmax(logits, v, 1) == pytest.approx(float(w @ v / w.sum()))
    with pytest.raises(ConfigError, match="values"):
        tiles.online_softmax([1, 2], [1], 1)


def test_edited_table_rows_become_a_workload_with_row_errors():
    from core.lessons.scenarios import workload_from_rows
    w = workload_from_rows([{"id": "A", "arrival_ms": 0.0, "prompt_tokens": 4.0, "output_tokens": 3.0},
                            {"id": None, "arrival_ms": None, "prompt_tokens": None, "output_tokens": None},
                            {"id": "B", "arrival_ms": 20.0, "prompt_tokens": 4, "output_tokens": 2}])
    assert [(r.id, r.prompt_tokens, r.max_output_tokens) for r in w.requests] == [("A", 4, 3), ("B", 4, 2)]
    with pytest.raises(WorkloadError, match="row 2"):
        workload_from_rows([{"id": "A", "arrival_ms": 0.0, "prompt_tokens": 4, "output_tokens": 3},
                            {"id": "B", "arrival_ms": 5.0, "prompt_tokens": 0, "output_tokens": 3}])
