"""The front end's way in and out (core.sim.frontend) and its fit (core.fit.frontfit): a trace
simulated with known terms is fitted back to them; the clock each number is on."""
import numpy as np
import pytest

from core.analysis.metrics import request_metrics
from core.config import SchedulerConfig
from core.errors import ConfigError
from core.fit.frontfit import fit_front_end
from core.sim.frontend import FrontEnd
from core.sim.simulate import simulate
from core.sim.stepmodel import StepModel
from core.trace import load_trace, save_trace
from core.workload import Request, Workload

CFG = SchedulerConfig(policy="vllm-v1", max_seqs=8, token_budget=1024)
STEP = StepModel("affine", base_ms=2.0, prefill_ms_per_token=0.01, decode_ms_per_seq=0.1)


def workload(n=40, seed=3) -> Workload:
    rng = np.random.default_rng(seed)
    t = np.cumsum(rng.exponential(40.0, n))
    return Workload([Request(f"q{i}", float(t[i]), int(rng.integers(16, 600)), int(rng.integers(2, 80)))
                     for i in range(n)])


def test_a_trace_simulated_with_known_front_end_terms_is_fitted_back_to_them():
    fe = FrontEnd(in_ms=1.7, in_ms_per_prompt_token=0.004, out_ms=0.6, out_ms_per_output_token=0.02)
    tr = simulate(workload(), CFG, STEP, front_end=fe)
    got, report = fit_front_end(tr)
    for k, v in fe.to_dict().items():
        assert getattr(got, k) == pytest.approx(v, abs=1e-6), k
    assert report["residual_ms_p90"] < 1e-6 and "queued 40 of 40" in report["split"]


def test_without_core_queue_times_the_fixed_part_goes_on_the_way_in():
    fe = FrontEnd(in_ms=1.0, in_ms_per_prompt_token=0.002, out_ms=0.5, out_ms_per_output_token=0.0)
    tr = simulate(workload(), CFG, STEP, front_end=fe)
    tr.request_extra = [{k: v for k, v in e.items() if k != "queued_ms"} for e in tr.request_extra]
    got, report = fit_front_end(tr)
    assert got.in_ms == pytest.approx(1.5, abs=1e-6) and got.out_ms == pytest.approx(0.0, abs=1e-6)
    assert got.in_ms_per_prompt_token == pytest.approx(0.002, abs=1e-9)
    assert "unknown" in report["split"]


def test_the_front_end_moves_ttft_and_e2e_by_its_terms_on_an_idle_engine():
    # one request at a time (arrivals far apart): the engine's part is the same with and without a front
    # end, so TTFT grows by in + out(0) and E2E by in + out(n - 1), computed here from the terms
    w = Workload([Request(f"r{i}", 1000.0 * i, 100 + 50 * i, 5 + i) for i in range(4)])
    fe = FrontEnd(in_ms=2.0, in_ms_per_prompt_token=0.01, out_ms=0.5, out_ms_per_output_token=0.1)
    base = request_metrics(simulate(w, CFG, STEP)).set_index("id")
    with_fe = request_metrics(simulate(w, CFG, STEP, front_end=fe)).set_index("id")
    for r in w.requests:
        way_in = 2.0 + 0.01 * r.prompt_tokens
        assert with_fe.loc[r.id, "ttft_ms"] == pytest.approx(base.loc[r.id, "ttft_ms"] + way_in + 0.5)
        assert with_fe.loc[r.id, "e2e_ms"] == pytest.approx(base.loc[r.id, "e2e_ms"] + way_in + 0.5
                                                            + 0.1 * (r.max_output_tokens - 1))
        assert with_fe.loc[r.id, "arrival_ms"] == r.arrival_ms      # the front end's clock


def test_a_front_end_trace_keeps_its_terms_and_phases_through_a_file(tmp_path):
    fe = FrontEnd(1.0, 0.0, 0.25, 0.0)
    tr = simulate(workload(8), CFG, STEP, front_end=fe)
    save_trace(tr, tmp_path / "t.json")
    back = load_trace(tmp_path / "t.json")
    assert back.meta["front_end"] == fe.to_dict() and "front end" in back.meta["clock_note"]
    e = back.request_extra[0]
    assert e["queued_ms"] == pytest.approx(float(back.requests["arrival_ms"].iloc[0]) + 1.0)
    assert e["engine_inference_ms"] == pytest.approx(e["engine_prefill_ms"] + e["engine_decode_ms"])


@pytest.mark.parametrize("bad", [{"in_ms": -1.0}, {"out_ms": float("nan")}, {"in_ms_per_prompt_token": "2"},
                                 {"out_ms_per_output_token": True}])
def test_bad_front_end_terms_are_refused_by_name(bad):
    with pytest.raises(ConfigError, match=next(iter(bad))):
        FrontEnd(**bad)
    with pytest.raises(ConfigError, match="unknown field"):
        FrontEnd.from_dict({"in_ms": 1, "latency": 2})


def test_contention_at_the_front_end_is_fitted_back():
    # a busy front end: each request in flight when one arrives delays it 0.8 ms more (the counts the
    # simulator used come from its first run; the fit reads them from the trace's own finishes)
    fe = FrontEnd(in_ms=1.0, in_ms_per_prompt_token=0.002, out_ms=0.3, in_ms_per_in_flight=0.8)
    tr = simulate(workload(60, seed=5), CFG, STEP, front_end=fe)
    got, report = fit_front_end(tr)
    assert got.in_ms_per_in_flight == pytest.approx(0.8, rel=0.05)
    assert got.in_ms + got.out_ms == pytest.approx(1.3, abs=0.15)
    assert "in flight" in got.describe()


def test_a_request_arriving_mid_step_waits_for_the_step_boundary_in_the_front_ends_share():
    """The engine core takes new requests in between steps (vLLM's span starts its queue there): a request
    reaching the core 5 ms into a 21 ms prefill step waits 16 ms for the boundary, then 0 in the queue."""
    from core.config import SchedulerConfig
    from core.sim.frontend import FrontEnd
    from core.sim.simulate import simulate
    from core.sim.stepmodel import StepModel
    from core.workload import Request, Workload
    w = Workload([Request("a", 0.0, 1000, 3), Request("b", 5.0, 10, 3)])
    sm = StepModel("affine", base_ms=1.0, prefill_ms_per_token=0.02, decode_ms_per_seq=0.0)
    tr = simulate(w, SchedulerConfig(policy="vllm-v1", max_seqs=8, token_budget=4096), sm,
                  front_end=FrontEnd(in_ms=2.0))
    e = dict(zip(tr.ids, tr.request_extra))
    # a reaches the core at 2 and runs at once (1 + 1000 x 0.02 = 21 ms, to 23); b reaches it at 7
    assert e["a"]["engine_wait_ms"] == pytest.approx(0.0) and e["a"]["engine_queue_ms"] == pytest.approx(0.0)
    assert e["b"]["engine_wait_ms"] == pytest.approx(23.0 - 7.0)
    assert e["b"]["engine_queue_ms"] == pytest.approx(0.0)
    # its TTFT: 2 in + 16 waiting + its prefill step (with a's first decode: 1 + 10 x 0.02 = 1.2 ms)
    from core.analysis.metrics import request_metrics
    m = request_metrics(tr).set_index("id")
    assert m.loc["b", "ttft_ms"] == pytest.approx(2.0 + 16.0 + 1.2)


def test_the_cycle_beyond_a_logged_forward_pass_is_fitted_back():
    """core.fit.reqfit.fit_added_terms: runs simulated with 1.0 ms + 0.08 ms per decoding sequence on top of a
    'logged' 0.6 ms + 0.03 ms give back the 0.4 and the 0.05."""
    import numpy as np

    from core.config import SchedulerConfig
    from core.fit.reqfit import fit_added_terms
    from core.sim.simulate import simulate
    from core.sim.stepmodel import StepModel
    from core.workload import Request, Workload
    rng = np.random.default_rng(3)
    cfg = SchedulerConfig(policy="vllm-v1", max_seqs=8, token_budget=1024)
    true = StepModel("affine", base_ms=1.0, prefill_ms_per_token=0.02, decode_ms_per_seq=0.08)
    runs = []
    for seed, rate in ((1, 200.0), (2, 600.0)):
        t = np.cumsum(rng.exponential(1000.0 / rate, 40))
        w = Workload([Request(f"r{seed}-{i}", float(t[i]), int(rng.integers(16, 200)), int(rng.integers(4, 40)))
                      for i in range(40)])
        runs.append(simulate(w, cfg, true))
    logged = StepModel("affine", base_ms=0.6, prefill_ms_per_token=0.02, decode_ms_per_seq=0.03)
    sm, rep = fit_added_terms(runs, [cfg, cfg], logged, ("base_ms", "decode_ms_per_seq"), {"base_ms": 0.2})
    assert sm.base_ms == pytest.approx(1.0, rel=1e-3) and sm.decode_ms_per_seq == pytest.approx(0.08, rel=1e-2)
    assert rep["loss"] < 1e-8 < rep["loss_start"]
