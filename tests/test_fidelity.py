"""How good is the simulator: request-level fitting (core.fit.reqfit) and held-out prediction
(core.fit.fidelity), checked against traces simulated with known step models, so the truth is known
independently of the fitting code; the command line and the replay page's sections."""
import json

import numpy as np
import pytest

from core.__main__ import main
from core.analysis.metrics import request_metrics
from core.config import SchedulerConfig
from core.errors import ConfigError
from core.fit.fidelity import how_good
from core.fit.reqfit import errors, fit_from_requests
from core.fit.stepfit import load
from core.sim.simulate import simulate
from core.sim.stepmodel import StepModel
from core.trace import open_trace
from core.workload import Request, Workload
from tests.conftest import ROOT

TRUE_AFFINE = StepModel("affine", base_ms=4.0, prefill_ms_per_token=0.05, decode_ms_per_seq=0.3)
TRUE_FEATURES = StepModel("features", base_ms=2.0, prefill_ms_per_token=0.01, decode_ms_per_seq=0.3,
                          prefill_ms_per_kpos=0.002, decode_ms_per_kpos=0.05, prefill_ms_per_chunk=0.7)
CFG = SchedulerConfig("vllm-v1", max_seqs=16, token_budget=512, block_size=16)
VLLM_FILE = ROOT / "data" / "imports" / "vllm_cpu_tiny_burst64.json"


def poisson(n, gap_ms, seed, prompt=(16, 400), output=(2, 60)):
    rng = np.random.default_rng(seed)
    t = np.cumsum(rng.exponential(gap_ms, n))
    return Workload([Request(f"r{i}", float(t[i]), int(rng.integers(*prompt)), int(rng.integers(*output)))
                     for i in range(n)])


@pytest.mark.slow   # seconds: out of the fast loop
def test_a_request_level_fit_predicts_another_workload_of_the_same_engine():
    # The "engine" is the simulator with a known step time; only the requests' TTFT and E2E are
    # given to the fit. The fitted model must reproduce them and predict a different workload.
    measured = simulate(poisson(40, 200.0, 3), CFG, TRUE_AFFINE)
    sm, report = fit_from_requests(measured, CFG)
    assert report["error"]["ttft_ms"]["p50"] < 0.03 and report["error"]["e2e_ms"]["p50"] < 0.03
    other = poisson(40, 120.0, 4, prompt=(100, 600), output=(10, 80))
    e = errors(simulate(other, CFG, sm), simulate(other, CFG, TRUE_AFFINE))
    assert np.median(e["ttft_ms"]) < 0.05 and np.median(e["e2e_ms"]) < 0.05
    assert report["range"]["decode_seqs"][1] >= 1          # the batches it was fitted on


def test_request_level_fit_refuses_what_it_cannot_fit():
    tr = simulate(poisson(40, 200.0, 3), CFG, TRUE_AFFINE)
    with pytest.raises(ConfigError, match="no send times"):
        fit_from_requests(tr, CFG, send_times_known=False)
    with pytest.raises(ConfigError, match="at least 4 completed requests"):
        fit_from_requests(simulate(poisson(3, 200.0, 3), CFG, TRUE_AFFINE), CFG)
    with pytest.raises(ConfigError, match="model: expected one of"):
        fit_from_requests(tr, CFG, model="cubic")
    with pytest.raises(ConfigError, match="40 requests; .* at most 10 here"):
        fit_from_requests(tr, CFG, max_requests=10)


def test_held_out_prediction_is_exact_when_the_model_is_right():
    # a run simulated with a features model: fitting on its first half recovers that model, so
    # the held-out requests are predicted exactly; fitting on another run of the same engine too
    cfg = SchedulerConfig("continuous", max_seqs=8, token_budget=256, chunk=64)
    run = simulate(poisson(120, 30.0, 5), cfg, TRUE_FEATURES)
    fid = how_good(run, "features")
    held = fid.requests[fid.requests["held_out"]]
    assert 0 < len(held) < len(fid.requests)
    assert held[["ttft_ms_error", "e2e_ms_error"]].to_numpy().max() < 1e-6
    other = simulate(poisson(80, 50.0, 6, prompt=(20, 200)), cfg, TRUE_FEATURES)
    fid = how_good(run, "features", fit_on=other)
    assert fid.requests["held_out"].all()
    s = fid.summary()
    assert set(s["requests"]) == {"held out"} and (s["median error"] < 1e-6).all()
    # the affine model cannot express the attention terms: errors show, and they are reported
    fid = how_good(run, "affine")
    assert fid.summary()["p90 error"].max() > 1e-3
    assert list(fid.worst(3)["e2e_ms_error"]) == sorted(fid.worst(3)["e2e_ms_error"], reverse=True)


def test_how_good_needs_step_events():
    imp = open_trace(VLLM_FILE)
    with pytest.raises(ConfigError, match="needs step events"):
        how_good(imp.trace)


@pytest.mark.slow   # seconds: out of the fast loop
def test_the_command_line_fits_an_engines_result_file_from_its_requests(tmp_path, capsys):
    out = tmp_path / "m.json"
    assert main(["fit", str(VLLM_FILE)]) != 0
    assert "--from-requests" in capsys.readouterr().err
    assert main(["fit", str(VLLM_FILE), "--from-requests", "--max-seqs", "16", "--token-budget", "2048",
                 "--block-size", "128", "--out", str(out), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["fit"]["fitted_on"] == "requests" and doc["fit"]["scheduler"]["policy"] == "vllm-v1"
    assert doc["fit"]["scheduler"]["chunk"] == 2048            # vllm-v1 chunks by the budget
    sm, report = load(out)
    assert sm.kind == "affine" and report["requests"] == 64
    # the file's own engine measured these; the fit must be in the right range (a decode step of
    # this tiny model on CPU is milliseconds, not microseconds or seconds)
    assert 0.5 < sm.base_ms + 16 * sm.decode_ms_per_seq < 50
    no_send_times = ROOT / "data" / "imports" / "vllm_example_result.json"
    assert main(["fit", str(no_send_times), "--from-requests"]) != 0
    assert "no send times" in capsys.readouterr().err


def test_the_steps_outside_the_fitted_range_are_listed():
    # fitted on light traffic (one short prompt at a time), priced on a burst of long prompts
    rng = np.random.default_rng(1)
    light = Workload([Request(f"a{i}", i * 50.0, int(rng.integers(1, 50)), 5) for i in range(30)])
    burst = Workload([Request(f"b{i}", 0.0, int(rng.integers(100, 400)), 5) for i in range(30)])
    cfg = SchedulerConfig("continuous", max_seqs=8, token_budget=512, chunk=128)
    from core.fit.stepfit import fit, outside_range, outside_steps
    sm, report = fit(simulate(light, cfg, TRUE_AFFINE), "affine")
    pred = simulate(burst, cfg, sm)
    listed = outside_steps(pred, report)
    assert len(listed) == outside_range(pred, report)["steps"] > 0
    for _, row in listed.iterrows():
        for f in row["outside"].split(", "):
            lo, hi = report["range"][f]
            assert not lo <= row[f] <= hi, (row["step"], f)
    # and every step not listed is inside the range on every feature
    from core.fit.stepfit import trace_features
    from core.sim.stepmodel import FEATURES
    steps, X, _ = trace_features(pred)
    affine = ("prefill_tokens", "decode_seqs")      # what an affine model reads; attended positions it does not
    for s, x in zip(steps, X):
        if s not in set(listed["step"]):
            assert all(report["range"][f][0] <= x[i] <= report["range"][f][1] for i, f in enumerate(FEATURES)
                       if f in affine)
    assert not any(f in row for row in listed["outside"] for f in ("prefill_kpos", "decode_kpos", "prefill_chunks"))


def test_vllms_own_request_spans_match_the_benchmark_files_requests():
    """bench.vllm_fidelity --engine-side reads the OpenTelemetry spans bench/vllm_cpu.sh collects:
    one per request inside the run's window, in send order, with the token counts the result
    file has; a closed loop's round trips are never negative."""
    from pathlib import Path

    from bench.vllm_fidelity import engine_side, round_trips_ms
    from core.fit.stepinfer import closed_loop_clients
    for name, n in (("c8_p256_o32", 64), ("c16_p128_o64", 64), ("poisson20_p192_o48", 96)):
        path = ROOT / "data" / "imports" / "vllm_cpu_spans" / name / "vllm_bench_vllm_r1.json"
        tr = open_trace(path).trace
        w, ttft, e2e = engine_side(Path(path), tr)
        assert len(w) == n and w.requests[0].arrival_ms == 0.0
        assert sorted(r.id for r in w.requests) == sorted(r.id for r in tr.workload().requests)
        assert all(0 < ttft[r.id] < e2e[r.id] for r in w.requests)
        # matched by vLLM's request ids: what vLLM measured is inside what the client measured
        client = request_metrics(tr).set_index("id")
        assert all(ttft[i] <= client.at[i, "ttft_ms"] and e2e[i] <= client.at[i, "e2e_ms"] for i in ttft)
        clients = closed_loop_clients(tr)
        if clients:
            rt = round_trips_ms(w, e2e, clients)
            assert len(rt) == n - clients and (rt >= 0).all()
    assert engine_side(ROOT / "data" / "imports" / "vllm_cpu_tiny_burst64.json", tr) is None   # no spans beside it


def test_a_closed_loop_run_is_replayed_with_its_measured_first_sends_and_round_trips():
    """Issue 28 item 2: a closed-loop benchmark run replayed with every client starting at time 0
    ran in lockstep (every request the same TTFT, a vertical CDF). Its first sends are replayed
    as measured, and each later send follows the k-th simulated finish by the k-th measured round
    trip (send of request 16 + k minus the k-th finish, from the file's own numbers)."""
    from core.fit.predict import replayed_run
    raw = json.loads(VLLM_FILE.read_text())
    start = np.array(raw["start_times"], dtype=float)
    send = np.sort(1000 * (start - start.min()))
    finish = np.sort(1000 * (start - start.min() + np.array(raw["latencies"], dtype=float)))
    clients = raw["max_concurrency"]
    trips = np.maximum(send[clients:] - finish[:-clients], 0.0)
    pred, got_clients = replayed_run(open_trace(VLLM_FILE).trace, CFG, TRUE_AFFINE)
    assert got_clients == clients == 16
    m = request_metrics(pred)
    arrival = np.sort(m["arrival_ms"].to_numpy(dtype=float))
    assert arrival[:clients] == pytest.approx(send[:clients], abs=1e-9)
    sim_finish = np.sort((m["arrival_ms"] + m["e2e_ms"]).to_numpy(dtype=float))
    expect = np.maximum.accumulate(sim_finish[:-clients] + trips)   # the front end hands them on in order
    assert arrival[clients:] == pytest.approx(expect, abs=1e-6)
    assert pred.meta["load"]["round_trip_ms_median"] == pytest.approx(float(np.median(trips)))
    # not in lockstep: the first request of the first wave is prefilled alone, before the others arrive
    ttft = m["ttft_ms"].to_numpy(dtype=float)
    assert np.ptp(ttft) > 10.0


def test_a_prediction_in_lockstep_says_so():
    from core.fit.predict import degenerate
    same = Workload([Request(f"r{i}", 0.0, 64, 8) for i in range(8)])
    varied = Workload([Request(f"r{i}", 0.0, 64 * (i + 1), 4 * (i + 2)) for i in range(8)])
    cfg = SchedulerConfig("vllm-v1", max_seqs=16, token_budget=512, block_size=16)
    lockstep, spread = simulate(same, cfg, TRUE_AFFINE), simulate(varied, cfg, TRUE_AFFINE)
    said = degenerate(lockstep, spread)
    assert [s.split(" (")[0] for s in said] == [f"the prediction gives every request the same {k}"
                                                for k in ("TTFT", "TPOT", "E2E")]
    assert degenerate(spread, spread) == []


def test_a_run_whose_steps_name_no_requests_holds_out_those_arriving_after_the_split():
    """Issue 36, item 2: vLLM's iteration log names no requests, so no request has a 'first scheduled'
    step; the split held out nothing. A request arriving after the split cannot be in a fitted step."""
    from core.fit.fidelity import how_good
    from core.trace import load_trace
    from tests.conftest import DATA
    tr = load_trace(DATA / "traces" / "vllm_cpu_run2_merged.json.gz")
    t = tr.steps["t_ms"].to_numpy(dtype=float)
    until = t.min() + 0.5 * (t.max() - t.min())
    expected = int((tr.requests["arrival_ms"].to_numpy(dtype=float) >= until).sum())
    f = how_good(tr, "affine", split=0.5)
    assert 0 < expected < len(tr.requests)
    assert int(f.requests["held_out"].sum()) == expected
    assert f"held out: the {expected:,} requests arriving" in f.fit_on
    # a split after the last arrival holds nothing out, and says so
    assert t.min() + 0.999 * (t.max() - t.min()) > tr.requests["arrival_ms"].max()
    late = how_good(tr, "affine", split=0.999)
    assert not late.requests["held_out"].any() and "holds nothing out" in late.fit_on


def test_token_spans_without_recording_equal_the_simulated_traces():
    """core.sim.simulate.token_span_ms (what the request-level fit's search compares, without
    recording the run) gives each request's first and last token time exactly as simulate's trace."""
    import numpy as np

    from core.analysis.metrics import request_metrics
    from core.config import SchedulerConfig
    from core.sim.simulate import simulate, token_span_ms
    from core.sim.stepmodel import StepModel
    from core.workload import load_workload
    from tests.conftest import DATA
    w = load_workload(DATA / "workloads" / "shared_prefix_200.json")
    for cfg in (SchedulerConfig(prefix_caching=True, kv_blocks=300), SchedulerConfig(chunk=64, token_budget=256)):
        sm = StepModel(kind="affine", base_ms=3.0, prefill_ms_per_token=0.04, decode_ms_per_seq=0.3)
        first, last = token_span_ms(w, cfg, sm)
        m = request_metrics(simulate(w, cfg, sm, record_kv=False)).set_index("id").loc[list(w.ids)]
        assert np.array_equal(first, m["first_token_ms"].to_numpy(dtype=float), equal_nan=True)
        assert np.array_equal(last, m["last_token_ms"].to_numpy(dtype=float), equal_nan=True)
