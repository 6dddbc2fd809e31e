"""A machine's speed over a run (core.sim.stepmodel.Speed): every simulated step's duration times
the factor in force when it starts, and read back from a run's own iteration log
(core.fit.calibrate.at_speed_over_time); and how a client's file says whether it was a closed loop."""
import dataclasses
import shutil

import numpy as np
import pytest

from core.config import SchedulerConfig
from core.errors import ConfigError
from core.experiments.sweep import simulate_closed
from core.fit.calibrate import Calibration, at_speed_over_time
from core.fit.runs import load_run
from core.sim.frontend import FrontEnd
from core.sim.simulate import simulate
from core.sim.stepmodel import Speed, StepModel
from core.workload import Request, Workload
from tests.conftest import DATA

CFG = SchedulerConfig(policy="vllm-v1", max_seqs=8, token_budget=512)
ONE_MS = StepModel("constant", step_ms=1.0)


def test_each_step_is_priced_at_the_speed_in_force_when_it_starts():
    # one request, a 4-token prompt and 10 output tokens, 1 ms a step: the prefill step (its first
    # token) starts at 0, decode steps at 1, 2, ... Speed x1 until 5 ms, x3 from then: the steps
    # starting at 0-4 take 1 ms, the five after 3 ms each: tokens at 1..5, then 8, 11, 14, 17, 20
    w = Workload([Request("a", 0.0, 4, 10)])
    tr = simulate(w, CFG, ONE_MS, speed=Speed((0.0, 5.0), (1.0, 3.0)))
    t = np.sort(tr.tokens["t_ms"].to_numpy())
    assert np.allclose(t, [1, 2, 3, 4, 5, 8, 11, 14, 17, 20])
    assert tr.meta["speed"]["factor_max"] == 3.0
    # the same speed everywhere is the step model scaled, fast-forward or not
    slow = simulate(w, CFG, StepModel("constant", step_ms=2.5))
    same = simulate(w, CFG, ONE_MS, speed=Speed((0.0,), (2.5,)))
    assert np.allclose(np.sort(same.tokens["t_ms"]), np.sort(slow.tokens["t_ms"]))


def test_a_closed_loop_and_the_front_end_run_at_the_speed_too():
    w = Workload([Request(f"r{i}", 0.0, 16, 6) for i in range(6)])
    sm = StepModel("affine", base_ms=1.0, decode_ms_per_seq=0.5)
    fast, _ = simulate_closed(w, CFG, sm, 2)
    slow, _ = simulate_closed(w, CFG, sm, 2, speed=Speed((0.0,), (2.0,)))
    doubled, _ = simulate_closed(w, CFG, StepModel("affine", base_ms=2.0, decode_ms_per_seq=1.0), 2)
    assert np.allclose(np.sort(slow.tokens["t_ms"]), np.sort(doubled.tokens["t_ms"]))
    assert slow.tokens["t_ms"].max() > 1.9 * fast.tokens["t_ms"].max()
    fe = FrontEnd(in_ms=2.0, out_ms=1.0)
    a = simulate(w, CFG, sm, front_end=fe, speed=Speed((0.0,), (2.0,)))
    b = simulate(w, CFG, StepModel("affine", base_ms=2.0, decode_ms_per_seq=1.0), front_end=fe)
    assert np.allclose(np.sort(a.tokens["t_ms"]), np.sort(b.tokens["t_ms"]))


@pytest.mark.parametrize("t, f", [((), ()), ((0.0, 1.0), (1.0,)), ((1.0, 0.0), (1.0, 1.0)), ((0.0,), (0.0,)),
                                  ((0.0,), (float("nan"),))])
def test_a_speed_that_is_not_one_is_refused(t, f):
    with pytest.raises(ConfigError, match="speed"):
        Speed(t, f)


RUN = DATA / "imports/vllm_repeats/s4/wK_ramp1to24_mixed_r1"


def test_the_speed_over_a_run_follows_its_logged_steps():
    """Against a forward pass of a fixed 1 ms, each window's factor is its logged steps' median
    duration; the same log with every step twice as long gives factors exactly twice as large."""
    from core.fit.runs import server_log_flags
    run = load_run(RUN, server_log_flags(RUN.parent / "server_start.log"))
    cal = Calibration(StepModel("affine", base_ms=1.0), FrontEnd(in_ms=1.0), ["x"], {})
    use, sp = at_speed_over_time(cal, run)
    dur = run.steps.steps["dur_ms"].to_numpy()
    assert sp.describe()["factor_median"] == pytest.approx(np.median(dur), rel=0.15)
    assert use.front_end.in_ms == pytest.approx(np.median(dur))       # (the front end: the whole run's median)
    assert use.step_model == cal.step_model and use.speed is sp
    slow = dataclasses.replace(run, steps=_scaled(run.steps, 2.0))
    _, sp2 = at_speed_over_time(cal, slow)
    assert np.allclose(np.asarray(sp2.factor), 2.0 * np.asarray(sp.factor))
    # against fit runs whose own steps ran twice the forward pass's price, the same log is at half that
    _, sp3 = at_speed_over_time(dataclasses.replace(cal, report={"reference_ratio": 2.0}), run)
    assert np.allclose(np.asarray(sp3.factor), 0.5 * np.asarray(sp.factor))


def test_a_closed_loop_reads_its_speed_from_its_prefill_steps():
    """A closed loop keeps the engine busy and its decode steps share the two cores with the API server
    and the client streaming every token: their logged forward pass stretches (s5's wB r2: 4-wide decode
    steps logged 2.38 ms, 1.62 in its repeat r1, while its E2E median moved 1.15x). Its speed is read from
    the steps that compute prompt tokens, over the fit runs' own such steps (reference_ratio_prefill);
    a calibration without that reference (older) and a run that is not a closed loop read every step."""
    from core.fit.runs import server_log_flags
    d = DATA / "imports/vllm_repeats/s5/wB_c4_p128_o32_r2"
    run = load_run(d, server_log_flags(d.parent / "server_start.log"))
    assert run.clients == 4
    st = run.steps.steps
    pre = st[st["prefill_tokens"] > 0]["dur_ms"].to_numpy()
    dec = st[(st["prefill_tokens"] == 0) & (st["decode_reqs"] == 4)]["dur_ms"].to_numpy()
    assert len(pre) >= 5 and len(dec) > 5 * len(pre)
    one = Calibration(StepModel("affine", base_ms=1.0), FrontEnd(in_ms=1.0), ["x"], {})
    cal = dataclasses.replace(one, report={"reference_ratio": 1.0, "reference_ratio_prefill": 2.0})
    use, _ = at_speed_over_time(cal, run)
    assert use.report["speed_factor"] == pytest.approx(np.median(pre) / 2.0)
    assert "prompt tokens" in use.report["speed_from"] and "prompt tokens" in use.speed.describe()["how"]
    older, _ = at_speed_over_time(one, run)
    assert older.report["speed_factor"] == pytest.approx(np.median(st["dur_ms"].to_numpy()), rel=0.05)
    assert older.report["speed_from"] == "its logged steps"
    k = load_run(RUN, server_log_flags(RUN.parent / "server_start.log"))
    assert k.clients is None
    a, _ = at_speed_over_time(cal, k)
    b, _ = at_speed_over_time(one, k)
    assert a.report["speed_factor"] == b.report["speed_factor"]


def test_a_sweep_s_phases_run_at_their_own_speeds():
    """guidellm's sweep beside a 2-core vLLM: its synchronous phase decodes one sequence at a time
    (logged steps about 2.6 ms), its throughput phase 16 at once (6+ ms): the factors against a
    fixed 1 ms forward pass follow the logged steps' medians, phase by phase."""
    from core.fit.runs import server_log_flags
    d = DATA / "imports/vllm_repeats/s7/wE_guidellm_sweep_p96_o48_r1"
    run = load_run(d, server_log_flags(d.parent / "server_start.log"))
    cal = Calibration(StepModel("affine", base_ms=1.0), FrontEnd(in_ms=1.0), ["x"], {})
    _, sp = at_speed_over_time(cal, run)
    st = run.steps.steps
    one = st[(st["decode_reqs"] == 1) & (st["prefill_reqs"] == 0)]["dur_ms"]
    assert sp.factor[0] == pytest.approx(float(one.median()), rel=0.1)    # (the synchronous phase comes first)
    assert max(sp.factor) > 2.0 * min(sp.factor)


def _scaled(log, k):
    import copy
    out = copy.copy(log)
    out.steps = log.steps.copy()
    out.steps["dur_ms"] = out.steps["dur_ms"] * k
    return out


def test_a_run_without_spans_has_no_speed_over_time(tmp_path):
    for f in ("server.log.gz", "vllm_bench_wK_ramp1to24_mixed_r1.json", "dataset.jsonl"):
        shutil.copy(RUN / f, tmp_path / f)
    from core.errors import InputError
    from core.fit.runs import server_log_flags
    run = load_run(tmp_path, server_log_flags(RUN.parent / "server_start.log"))
    cal = Calibration(StepModel("affine", base_ms=1.0), FrontEnd(), ["x"], {})
    with pytest.raises(InputError, match="iteration log and its request spans"):
        at_speed_over_time(cal, run)


def test_a_client_s_file_says_whether_its_run_was_one_closed_loop(tmp_path):
    """AIPerf's concurrency phase is a closed loop of its concurrency; a guidellm sweep of
    concurrent 1, 2 and 4 is not one closed loop (predicted at its send times), one concurrent
    benchmark of 4 streams is."""
    cases = {"aiperf/aiperf_c4_p64_o32": 4, "guidellm/concurrent1-2-4_p64_o32_n12": None,
             "guidellm/concurrent4_p64_o32_n48": 4}
    for src, clients in cases.items():
        d = tmp_path / src.replace("/", "_")
        d.mkdir()
        for f in (DATA / "imports" / src).iterdir():
            if f.name in ("profile_export.jsonl", "profile_export_aiperf.json", "benchmarks.json"):
                shutil.copy(f, d / f.name)
        run = load_run(d, CFG)
        assert run.clients == clients, src
        if "1-2-4" in src:
            assert any("3 runs of one client (a sweep): not one closed loop" in n for n in run.notes)
