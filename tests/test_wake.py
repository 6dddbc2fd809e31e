"""The step model's wake-up cost after idle (core.sim.stepmodel) and its fit from a run's requests
(core.fit.wake): values computed here by hand from the workload, and a fit that must recover terms
this test chose."""
import math

import numpy as np
import pytest

from core.config import SchedulerConfig
from core.fit.wake import MIN_IDLE_STARTS, first_step_idle, first_uses, fit_wake
from core.sim.simulate import simulate
from core.sim.stepmodel import StepModel
from core.trace.build import given_trace
from core.workload import Request, Workload

CFG = SchedulerConfig(max_seqs=8, token_budget=512, block_size=16, kv_blocks=256)
BASE = StepModel("affine", base_ms=2.0, prefill_ms_per_token=0.05, decode_ms_per_seq=0.1)


def _steps(tr):
    st = tr.steps.sort_values("step")
    return st["t_ms"].to_numpy(), st["dur_ms"].to_numpy()


def test_a_step_after_idle_costs_its_wake_up_and_the_first_step_the_whole_of_it():
    # request a: 100 prompt tokens, 3 outputs at t=0; request b: 60 tokens, 2 outputs at t=500
    w = Workload([Request("a", 0.0, 100, 3), Request("b", 500.0, 60, 2)])
    sm = StepModel("affine", base_ms=2.0, prefill_ms_per_token=0.05, decode_ms_per_seq=0.1, wake_ms=4.0,
                   wake_tau_ms=50.0)
    t, d = _steps(simulate(w, CFG, sm))
    # a: prefill (2 + 5 + wake 4: the engine's first step), then 2 decodes of 2.1
    assert d[:3] == pytest.approx([11.0, 2.1, 2.1])
    end_a = 11.0 + 2.1 + 2.1
    # b starts at 500 after (500 - end_a) ms idle: 2 + 3 + 4 (1 - exp(-idle / 50)), then one decode
    assert t[3] == pytest.approx(500.0)
    assert d[3] == pytest.approx(5.0 + 4.0 * (1 - math.exp(-(500.0 - end_a) / 50.0)))
    assert d[4] == pytest.approx(2.1)


def test_without_a_wake_term_nothing_changes_and_fast_forward_still_equals_stepping():
    rng = np.random.default_rng(3)
    arr = np.cumsum(rng.exponential(80.0, 40))
    w = Workload([Request(f"r{i}", float(a), int(rng.integers(20, 200)), int(rng.integers(2, 40)))
                  for i, a in enumerate(arr)])
    plain = simulate(w, CFG, BASE)
    zero = simulate(w, CFG, StepModel("affine", base_ms=2.0, prefill_ms_per_token=0.05, decode_ms_per_seq=0.1,
                                      wake_ms=0.0, wake_tau_ms=7.0))
    assert np.array_equal(plain.steps["dur_ms"].to_numpy(), zero.steps["dur_ms"].to_numpy())
    woke = StepModel("affine", base_ms=2.0, prefill_ms_per_token=0.05, decode_ms_per_seq=0.1, wake_ms=3.0,
                     wake_tau_ms=40.0)
    a, b = simulate(w, CFG, woke, fast_forward=True), simulate(w, CFG, woke, fast_forward=False)
    assert np.array_equal(a.steps["dur_ms"].to_numpy(), b.steps["dur_ms"].to_numpy())
    assert np.array_equal(a.steps["t_ms"].to_numpy(), b.steps["t_ms"].to_numpy())
    # every step that follows another without a pause costs what the plain model says
    t, d = _steps(a)
    gap = np.r_[np.inf, t[1:] - (t[:-1] + d[:-1])]
    assert (gap > 0).sum() >= 10


def test_the_idle_before_each_requests_first_step_is_read_from_the_steps():
    w = Workload([Request("a", 0.0, 100, 3), Request("b", 1.0, 50, 3), Request("c", 400.0, 60, 2)])
    tr = simulate(w, CFG, BASE)
    t, d = _steps(tr)
    idle = first_step_idle(tr)
    assert idle["a"] > 1e5                      # the engine's first step
    assert idle["b"] == 0.0                     # joined a busy engine
    last_end = max(t[i] + d[i] for i in range(len(t)) if t[i] < 400.0)
    assert idle["c"] == pytest.approx(400.0 - last_end)


def _truth(w, sm):
    """A 'measured' run: the workload simulated with `sm`, given as its requests' token times only."""
    tr = simulate(w, CFG, sm)
    tok = tr.tokens.sort_values(["req", "t_ms"])
    ids = tr.requests["id"].to_numpy()
    emitted = {ids[int(r)]: g["t_ms"].tolist() for r, g in tok.groupby("req")}
    return given_trace(w, emitted, {"label": "truth"})


def test_the_fit_recovers_a_wake_up_it_was_not_told():
    rng = np.random.default_rng(11)
    arr = np.cumsum(rng.exponential(60.0, 80))      # Poisson, mean gap 60 ms: idle pauses of all lengths
    w = Workload([Request(f"r{i}", float(a), int(rng.integers(40, 160)), int(rng.integers(2, 12)))
                  for i, a in enumerate(arr)])
    true = StepModel("affine", base_ms=2.0, prefill_ms_per_token=0.05, decode_ms_per_seq=0.1, wake_ms=3.5,
                     wake_tau_ms=45.0)
    got, report = fit_wake([_truth(w, true)], [CFG], BASE)
    assert report["idle_starts"] >= MIN_IDLE_STARTS
    assert got.wake_ms == pytest.approx(3.5, rel=0.1)
    assert got.wake_tau_ms == pytest.approx(45.0, rel=0.25)
    assert abs(report["offset_ms"]) < 0.2


def test_a_closed_loop_without_pauses_fits_no_wake_and_says_why():
    # every request arrives while another runs: the engine never sits idle after its first step
    w = Workload([Request(f"r{i}", 5.0 * i, 64, 30) for i in range(20)])
    got, report = fit_wake([_truth(w, BASE)], [CFG], BASE)
    assert got.wake_ms == 0.0
    assert "not separable" in report["why"]


def test_a_real_vllm_run_shows_a_wake_up_as_large_as_its_spans_say():
    """s3 wC (vLLM 0.32 CPU, Poisson 3/s): the fitted wake-up against what the spans show without
    any model: the prefill span (scheduled to first token) of requests that found the engine idle
    after a pause of 300 ms or more, less that of those after 3-30 ms."""
    from core.fit.calibrate import calibrate
    from core.fit.frontfit import samples
    from core.fit.runs import load_run, server_log_flags
    from tests.conftest import ROOT
    d = ROOT / "data" / "imports" / "vllm_repeats" / "s3"
    run = load_run(d / "wC_poisson3_p96_o96_r1", server_log_flags(d / "server_start.log"))
    s = samples(run.truth)
    arrival = dict(zip(run.truth.ids, run.truth.requests["arrival_ms"].to_numpy(dtype=float)))
    a = np.array([arrival[i] for i in s["id"]])
    sched = a + s["ttft_ms"].to_numpy() - s["prefill_ms"].to_numpy()
    fin = a + s["e2e_ms"].to_numpy()
    order = np.argsort(sched)
    gap = np.full(len(s), np.nan)
    gap[order[1:]] = sched[order[1:]] - np.maximum.accumulate(fin[order])[:-1]
    pre = s["prefill_ms"].to_numpy()
    long, short = np.median(pre[gap >= 300]), np.median(pre[(gap >= 3) & (gap < 30)])
    assert long - short > 2.0          # (the effect itself, before any model)
    cal = calibrate([run], "affine", "log")
    assert 0.8 * (long - short) <= cal.step_model.wake_ms <= 2.0 * (long - short)
    assert "wake-up after a pause" in cal.wake_note()


# ---- the first use of a batch size (StepModel.shape_ms) ---------------------------------------

def test_a_batch_size_run_for_the_first_time_costs_its_first_use_once():
    # a: 100 prompt tokens, 3 outputs at t=0; b: 100 tokens, 2 outputs at t=500 (the same sizes again)
    w = Workload([Request("a", 0.0, 100, 3), Request("b", 500.0, 100, 2)])
    sm = StepModel("affine", base_ms=2.0, prefill_ms_per_token=0.05, decode_ms_per_seq=0.1, shape_ms=1.5)
    _, d = _steps(simulate(w, CFG, sm))
    # a: prefill of 100 tokens (size 100, new: 2 + 5 + 1.5), decode (size 1, new: 2.1 + 1.5), decode (2.1);
    # b: the same sizes again: 7.0, then 2.1
    assert d == pytest.approx([8.5, 3.6, 2.1, 7.0, 2.1])


def test_first_uses_fast_forward_equals_stepping_and_the_fit_recovers_them():
    from core.fit.fleet import fit_replica
    rng = np.random.default_rng(4)
    arr = np.cumsum(rng.exponential(60.0, 60))
    w = Workload([Request(f"r{i}", float(a), int(rng.integers(20, 90)), int(rng.integers(2, 30)))
                  for i, a in enumerate(arr)])
    sm = StepModel("affine", base_ms=2.0, prefill_ms_per_token=0.05, decode_ms_per_seq=0.1, shape_ms=2.0)
    a, b = simulate(w, CFG, sm, fast_forward=True), simulate(w, CFG, sm, fast_forward=False)
    assert np.array_equal(a.steps["dur_ms"].to_numpy(), b.steps["dur_ms"].to_numpy())
    sizes = a.batch.groupby("step")["tokens"].sum().to_numpy()
    new = first_uses(sizes)
    assert new.sum() == len(set(sizes.tolist()))    # one first use per distinct size
    bt = a.batch
    steps = a.steps["step"].to_numpy()
    pre = bt[bt["kind"] == "prefill"].groupby("step")["tokens"].sum().reindex(steps, fill_value=0).to_numpy()
    dec = bt[bt["kind"] == "decode"].groupby("step")["req"].count().reindex(steps, fill_value=0).to_numpy()
    extra = a.steps["dur_ms"].to_numpy() - (2.0 + 0.05 * pre + 0.1 * dec)
    assert extra[new] == pytest.approx(2.0) and extra[~new] == pytest.approx(0.0)
    # a one-replica fleet trace of this run: the fit finds the first-use cost it was not told
    a.steps["replica"] = 0
    a.meta["fleet"] = {"replicas": [{"role": "both"}]}
    got, report = fit_replica(a, 0, model="affine", gap=False)
    assert got.shape_ms == pytest.approx(2.0, abs=0.2)
    assert report["first_use"]["first_uses"] == int(new.sum())


# ---- the cycle's cost per decoding sequence (core.fit.calibrate: a calibration run) -------------

def _span_slope(run):
    """Without any model: each request's time per output token (first to last token, vLLM's spans)
    against the mean number of requests decoding during its decode, itself included (their spans
    overlapping), Theil-Sen."""
    from scipy.stats import theilslopes

    from core.fit.frontfit import samples
    x = samples(run.truth)
    arrival = dict(zip(run.truth.ids, run.truth.requests["arrival_ms"].to_numpy(dtype=float)))
    a = np.array([arrival[i] for i in x["id"]])
    first, last = a + x["ttft_ms"].to_numpy(), a + x["e2e_ms"].to_numpy()
    n = x["output_tokens"].to_numpy()
    ok = np.where(n > 8)[0]
    width = np.array([np.clip(np.minimum(last, last[i]) - np.maximum(first, first[i]), 0, None).sum()
                      / (last[i] - first[i]) for i in ok])
    return theilslopes(((last - first) / (n - 1))[ok], width)[0]


def test_a_calibration_run_prices_the_cycle_per_decoding_sequence_as_its_spans_show():
    """s4's calibration run (vLLM 0.32 CPU, a Poisson stream ramped from 1/s to 24/s: decode-only
    steps at widths 1-11): the log method adds a cost per decoding sequence beyond the logged forward
    pass, and the step's total cost per sequence agrees with the slope the spans show without any
    model; a closed loop (one width) gets the fixed part only, and the report says why."""
    from core.fit.calibrate import calibrate
    from core.fit.runs import load_run, server_log_flags
    from tests.conftest import ROOT
    d = ROOT / "data" / "imports" / "vllm_repeats" / "s4"
    flags = server_log_flags(d / "server_start.log")
    run = load_run(d / "wK_ramp1to24_mixed_r1", flags)
    slope = _span_slope(run)
    assert 0.1 < slope < 0.3          # (the effect itself, before any model: 0.19 ms per sequence)
    cal = calibrate([run], "affine", "log")
    sm, q = cal.step_model, cal.report["step_model"]
    assert "per decoding sequence" in q["cycle_terms"]
    assert q["overhead"]["added"]["decode_ms_per_seq"] > 0
    assert 0.6 * slope <= sm.decode_ms_per_seq <= 1.4 * slope
    closed = calibrate([load_run(d / "wB_c4_p128_o32_r1", flags)], "affine", "log")
    assert closed.report["step_model"]["cycle_terms"].startswith("fixed only")
    assert "per decoding sequence" in cal.cycle_note() and "fixed only" in closed.cycle_note()
