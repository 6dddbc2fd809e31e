"""Load sweeps: re-timed open loops, closed loops, capacity, and the CLI contract."""
import json

import numpy as np
import pytest

from core.__main__ import main
from core.analysis.metrics import SLO
from core.config import SchedulerConfig
from core.errors import ConfigError
from core.experiments.sweep import retimed, simulate_closed, sweep
from core.sim.stepmodel import StepModel
from core.workload import Request, Workload

STEP10 = StepModel("constant", step_ms=10.0)


def small(n=40, seed=3):
    rng = np.random.default_rng(seed)
    return Workload([Request(f"q{i}", float(i), int(p), int(o))
                     for i, (p, o) in enumerate(zip(rng.integers(1, 64, n), rng.integers(1, 20, n)))], name="small")


def test_retimed_keeps_lengths_and_order_with_seeded_poisson_arrivals():
    w = small()
    r = retimed(w, 4.0, seed=7)
    gaps = np.random.default_rng(7).exponential(1.0, len(w) - 1) * 250.0   # mean 1000 / 4 ms
    assert [x.arrival_ms for x in r.requests] == pytest.approx(np.concatenate([[0.0], np.cumsum(gaps)]).tolist())
    assert [(x.id, x.prompt_tokens, x.max_output_tokens) for x in r.requests] == \
        [(x.id, x.prompt_tokens, x.max_output_tokens) for x in w.requests]


def test_closed_loop_by_hand():
    # one token per 10 ms step; each request: prompt 1, 2 output tokens (2 steps)
    w = Workload([Request(f"r{i}", 0.0, 1, 2) for i in range(3)])
    tr, most = simulate_closed(w, SchedulerConfig("continuous"), STEP10, concurrency=1)
    assert tr.requests["arrival_ms"].tolist() == [0, 20, 40] and most == 1
    assert tr.tokens["t_ms"].tolist() == [10, 20, 30, 40, 50, 60]
    tr, most = simulate_closed(w, SchedulerConfig("continuous"), STEP10, concurrency=2)
    assert tr.requests["arrival_ms"].tolist() == [0, 0, 20] and most == 2
    assert sorted(tr.tokens["t_ms"].tolist()) == [10, 10, 20, 20, 30, 40]


@pytest.mark.parametrize("c", [1, 3, 8])
def test_closed_loop_never_exceeds_its_concurrency(c):
    w = small()
    tr, most = simulate_closed(w, SchedulerConfig("continuous", max_seqs=4, token_budget=64, chunk=16), STEP10, c)
    # in system at any instant: arrived (at or before t) minus finished (at or before t)
    arr = np.sort(tr.requests["arrival_ms"].to_numpy())
    fin = np.sort(tr.finishes["t_ms"].to_numpy())
    for t in np.union1d(arr, fin):
        assert np.searchsorted(arr, t, "right") - np.searchsorted(fin, t, "right") <= c
    assert most <= c and len(tr.requests) == len(w)
    assert tr.requests["prompt_tokens"].tolist() == [r.prompt_tokens for r in w.requests]
    assert tr.requests["max_output_tokens"].tolist() == [r.max_output_tokens for r in w.requests]


def test_sweep_points_parallel_equal_serial_and_capacity_is_monotone():
    w = small(60)
    cfg = SchedulerConfig("continuous", max_seqs=4, token_budget=64, chunk=16)
    rates = [5.0, 20.0, 80.0, 320.0]
    loose, tight = SLO(ttft_ms=400.0), SLO(ttft_ms=60.0)
    one = sweep(w, cfg, STEP10, rates=rates, slo=loose, workers=1)
    two = sweep(w, cfg, STEP10, rates=rates, slo=loose, workers=2)
    assert one == two
    assert [p["rate"] for p in one["points"]] == rates
    assert all(p["requests"] == len(w) for p in one["points"])
    att = [p["slo"]["attainment"] for p in one["points"]]
    assert att == sorted(att, reverse=True) and att[0] == 1.0 and att[-1] < 0.9   # more load, fewer met
    t = sweep(w, cfg, STEP10, rates=rates, slo=tight, workers=1)
    cap_loose, cap_tight = one["capacity"], t["capacity"]
    assert cap_loose["rate"] == max(r for r, a in zip(rates, att) if a >= 0.9)
    assert cap_tight is None or cap_tight["rate"] <= cap_loose["rate"]
    assert sweep(w, cfg, STEP10, rates=rates, workers=1)["capacity"] is None   # no SLOs, no capacity


def test_sweep_refuses_bad_requests():
    w = small()
    with pytest.raises(ConfigError, match="either rates or concurrency"):
        sweep(w, SchedulerConfig(), STEP10)
    with pytest.raises(ConfigError, match="attainment"):
        sweep(w, SchedulerConfig(), STEP10, rates=[1.0], attainment=1.5)


def test_cli_sweep_json_contract(tmp_path, capsys):
    p = tmp_path / "w.json"
    p.write_text(json.dumps({"requests": [{"id": f"q{i}", "arrival_ms": i, "prompt_tokens": 8, "output_tokens": 4}
                                          for i in range(30)]}))
    assert main(["sweep", str(p), "--concurrency", "1,4", "--step-model", "constant", "--step-ms", "10",
                 "--slo-ttft-ms", "25", "--workers", "1", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    keys = {"concurrency", "offered_req_per_s", "achieved_req_per_s", "output_tok_per_s", "ttft_ms", "tpot_ms",
            "e2e_ms", "failed", "slo"}
    assert all(keys <= set(pt) for pt in out["points"])
    assert set(out["points"][0]["ttft_ms"]) == {"p50", "p90", "p95", "p99", "mean"}
    # one at a time: every request's first token comes one 10 ms step after it is sent
    assert out["points"][0]["ttft_ms"]["p99"] == 10 and out["points"][0]["slo"]["attainment"] == 1
    assert out["capacity"]["concurrency"] in (1, 4)
    assert main(["sweep", str(p), "--rates", "0"]) == 2
    assert "--rates: expected a finite number > 0" in capsys.readouterr().err


def test_repeats_report_the_spread_and_capacity_needs_every_run():
    w = small(60)
    cfg = SchedulerConfig("continuous", max_seqs=4, token_budget=64, chunk=16)
    slo = SLO(ttft_ms=200.0)
    one = sweep(w, cfg, STEP10, rates=[20.0, 80.0], slo=slo, seed=4, workers=1)
    rep = sweep(w, cfg, STEP10, rates=[20.0, 80.0], slo=slo, seed=4, repeats=3, workers=1)
    for a, b in zip(one["points"], [dict(p) for p in rep["points"]]):
        r = b.pop("repeats")
        assert b.pop("seed") == 4 and a == b                       # the first repeat is the seed-4 run
        assert r["seeds"] == [4, 5, 6]
        alone = [sweep(w, cfg, STEP10, rates=[a["rate"]], slo=slo, seed=s, workers=1)["points"][0] for s in (4, 5, 6)]
        got = [p["slo"]["attainment"] for p in alone]
        assert r["attainment"] == {"min": min(got), "mean": pytest.approx(sum(got) / 3), "max": max(got)}
        toks = [p["output_tok_per_s"] for p in alone]
        assert r["output_tok_per_s"]["min"] == min(toks) and r["output_tok_per_s"]["max"] == max(toks)
    worst = {p["rate"]: p["repeats"]["attainment"]["min"] for p in rep["points"]}
    cap = rep["capacity"]
    assert cap is None or worst[cap["rate"]] >= 0.9 and cap["attainment"] == worst[cap["rate"]]
    with pytest.raises(ConfigError, match="closed loop is deterministic"):
        sweep(w, cfg, STEP10, concurrency=[2], repeats=2)


def test_a_closed_loops_replacement_reaches_the_engine_after_the_round_trip():
    # one client, two requests of 2 output tokens, 10 ms steps: the first runs [0, 10] (prefill,
    # token 1) and [10, 20] (token 2); its replacement is sent at 20 and arrives 5 ms later
    w = Workload([Request("a", 0.0, 4, 2), Request("b", 0.0, 4, 2)])
    tr, _ = simulate_closed(w, SchedulerConfig("continuous"), STEP10, 1, delay_ms=5.0)
    assert tr.requests.set_index("id")["arrival_ms"].to_dict() == {"a": 0.0, "b": 25.0}
    t = tr.tokens.groupby("req")["t_ms"].apply(list).tolist()
    assert t == [[10.0, 20.0], [35.0, 45.0]]
    no_delay, _ = simulate_closed(w, SchedulerConfig("continuous"), STEP10, 1)
    assert no_delay.requests["arrival_ms"].tolist() == [0.0, 20.0]
    with pytest.raises(ConfigError, match="delay_ms"):
        simulate_closed(w, SchedulerConfig("continuous"), STEP10, 1, delay_ms=-1.0)


def test_each_replacement_can_have_its_own_round_trip_and_keeps_its_place_in_line():
    # two clients, four requests of one token, 10 ms steps: a and b finish at 10 together;
    # c is delayed 30 ms, d 5 ms but not before c (the front end hands them on in order)
    w = Workload([Request(x, 0.0, 4, 1) for x in "abcd"])
    tr, _ = simulate_closed(w, SchedulerConfig("continuous"), STEP10, 2, delay_ms=[30.0, 5.0])
    assert tr.requests.set_index("id")["arrival_ms"].to_dict() == {"a": 0.0, "b": 0.0, "c": 40.0, "d": 40.0}
    with pytest.raises(ConfigError, match="delay_ms"):
        simulate_closed(w, SchedulerConfig("continuous"), STEP10, 2, delay_ms=[1.0, float("nan")])
