"""SLO attainment, goodput, Little's law and utilisation against hand computations."""
import json

import pytest

from core.__main__ import main
from core.analysis.metrics import SLO, summarize
from core.config import SchedulerConfig
from core.errors import InputError
from core.sim.simulate import simulate
from core.sim.stepmodel import StepModel
from core.trace import trace_from_doc
from core.workload import Request, Workload

# A: 3 tokens, TTFT 100, TPOT 50, E2E 200, finished.   B: TTFT 100, TPOT 180, E2E 280, finished.
# C: one token, TTFT 50 (no TPOT), stopped.            D: aborted after one token.
# E: failed with an error, no token.                   F: two tokens, never finished (capture ended).
TOKENS = {"A": [100, 150, 200], "B": [120, 300], "C": [90], "D": [400], "E": [], "F": [110, 500]}
ARRIVAL = {"A": 0, "B": 20, "C": 40, "D": 50, "E": 60, "F": 70}
FINISH = {"A": "length", "B": "length", "C": "stop", "D": "abort", "E": "error"}


def hand_trace():
    events = [{"t_ms": t, "type": "token", "req": r, "index": i} for r, ts in TOKENS.items() for i, t in enumerate(ts)]
    events += [{"t_ms": (TOKENS[r] or [ARRIVAL[r]])[-1], "type": "finish", "req": r, "reason": why}
               for r, why in FINISH.items()]
    return {"schema": "serving-trace/1", "meta": {"source": "given"},
            "requests": [{"id": r, "arrival_ms": a, "prompt_tokens": 4, "max_output_tokens": 3}
                         for r, a in ARRIVAL.items()],
            "events": sorted(events, key=lambda e: e["t_ms"])}


def test_slo_gate_and_goodput_over_the_drain_window():
    s = summarize(trace_from_doc(hand_trace()), slo=SLO(ttft_ms=100, tpot_ms=60))
    slo = s["summary"]["slo"]
    # met: A (100 <= 100, 50 <= 60) and C (one token: no TPOT to violate); B breaks TPOT;
    # D, E, F did not complete. Window [0, 500] ms = 0.5 s; A's 3 tokens + C's 1.
    assert {r["id"]: r["slo_met"] for r in s["requests"]} == {
        "A": True, "B": False, "C": True, "D": False, "E": False, "F": False}
    assert (slo["requests"], slo["met"], slo["attainment"]) == (6, 2, 2 / 6)
    assert slo["violations"] == {"ttft": 0, "tpot": 1, "e2e": None, "failed": 3}
    assert slo["goodput_req_per_s"] == pytest.approx(2 / 0.5)
    assert slo["goodput_tok_per_s"] == pytest.approx(4 / 0.5)
    assert (slo["ttft_ms"], slo["tpot_ms"], slo["e2e_ms"]) == (100, 60, None)


def test_slo_bounds_are_inclusive_gates_and_a_fixed_window_counts_what_is_inside():
    tr = trace_from_doc(hand_trace())
    slo = summarize(tr, slo=SLO(ttft_ms=99))["summary"]["slo"]
    assert slo["met"] == 1 and slo["violations"]["ttft"] == 2          # only C is under 99 ms
    slo = summarize(tr, slo=SLO(e2e_ms=200))["summary"]["slo"]
    assert slo["met"] == 2 and slo["violations"] == {"ttft": None, "tpot": None, "e2e": 1, "failed": 3}
    # [0, 160] ms: of the met A and C only C finished inside; tokens inside: A's 100, 150 and C's 90.
    slo = summarize(tr, window=(0, 160), slo=SLO(ttft_ms=100, tpot_ms=60))["summary"]["slo"]
    assert slo["goodput_req_per_s"] == pytest.approx(1 / 0.16)
    assert slo["goodput_tok_per_s"] == pytest.approx(3 / 0.16)


def test_no_bounds_no_slo_section_and_bad_bounds_refused():
    s = summarize(trace_from_doc(hand_trace()))
    assert "slo" not in s["summary"] and "slo_met" not in s["requests"][0]
    with pytest.raises(InputError, match="slo ttft_ms"):
        SLO(ttft_ms=0)


def test_littles_law_and_utilisation_with_an_idle_gap():
    # Two requests one at a time, 10 ms steps: busy [0, 20] and [60, 80] of the drain window
    # [0, 80]: 0.5 running sequences and 0.5 of one block in use on average.
    w = Workload([Request("a", 0.0, 1, 2), Request("b", 60.0, 1, 2)])
    s = summarize(simulate(w, SchedulerConfig("serial"), StepModel("constant", step_ms=10.0)))["summary"]
    u = s["utilisation"]
    assert (u["running_mean"], u["running_peak"]) == (0.5, 1)
    assert (u["kv_used_blocks_mean"], u["kv_used_blocks_peak"]) == (0.5, 1)
    assert u["kv_blocks"] == 2 and u["kv_used_fraction_mean"] == 0.25
    ll = s["littles_law"]   # in system: a 0-20, b 60-80 -> 40 ms over 80 ms; 2 arrivals in 0.08 s, W = 20 ms
    assert ll["L"] == pytest.approx(0.5) and ll["arrival_rate_per_s"] == pytest.approx(25.0)
    assert ll["W_ms"] == pytest.approx(20.0) and ll["lambda_W"] == pytest.approx(ll["L"])


def test_cli_metrics_slo_json(tmp_path, capsys):
    p = tmp_path / "t.json"
    p.write_text(json.dumps(hand_trace()))
    assert main(["metrics", str(p), "--slo-ttft-ms", "100", "--slo-tpot-ms", "60", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["summary"]["slo"]["met"] == 2 and [r["slo_met"] for r in out["requests"]].count(True) == 2
    assert main(["metrics", str(p), "--slo-e2e-ms", "250"]) == 0
    assert "SLOs (E2E <= 250 ms): 2 of 6 requests met them" in capsys.readouterr().out
    assert main(["metrics", str(p), "--slo-ttft-ms", "-1"]) == 2
    assert "--slo-ttft-ms: expected a finite number > 0" in capsys.readouterr().err
