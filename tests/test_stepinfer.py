"""core.fit.stepinfer: engine steps recovered from the times tokens reach the client. A run is
simulated with a known step time, everything but the requests and their token times is
dropped (what a vLLM result file holds), the tokens of each step are spread by a client-side
jitter, and the inferred steps and the fitted step time must match the simulation's."""
import dataclasses
import json

import numpy as np
import pytest

from core.config import SchedulerConfig
from core.errors import ConfigError
from core.fit.stepinfer import burst_gap_ms, closed_loop_clients, fit_inferred, infer_steps
from core.lessons.scenarios import poisson_workload
from core.sim.simulate import simulate
from core.sim.stepmodel import StepModel
from core.trace.model import BATCH, STEP, empty

TRUE = StepModel("affine", base_ms=3.0, prefill_ms_per_token=0.07, decode_ms_per_seq=0.15)
CFG = SchedulerConfig("vllm-v1", max_seqs=16, token_budget=2048, block_size=128)


def client_view(tr, jitter_ms=0.04):
    """The trace as a client sees it: no steps or batch; the k-th token of a step arrives k x
    jitter after the step ends (the server streams them one after another)."""
    tk = tr.tokens.sort_values(["t_ms", "req"], kind="stable").copy()
    rank = tk.groupby("t_ms").cumcount().to_numpy()
    tk["t_ms"] = tk["t_ms"].to_numpy() + rank * jitter_ms
    return dataclasses.replace(tr, tokens=tk.reset_index(drop=True), steps=empty(STEP), batch=empty(BATCH),
                               kv=tr.kv.iloc[:0], preempts=tr.preempts.iloc[:0])


@pytest.fixture(scope="module")
def run():
    w = poisson_workload(120, rate_per_s=40.0, seed=3, max_prompt=256, max_output=40)
    return simulate(w, CFG, TRUE, record_kv=False)


def test_bursts_are_the_steps_that_emitted_tokens(run):
    inf = infer_steps(client_view(run), CFG)
    emitting = run.batch.groupby("step")["req"].count()
    tok_steps = sorted(set(run.tokens["t_ms"].round(9)))
    assert len(inf.trace.steps) == len(tok_steps)
    # each inferred step holds the tokens one simulated step emitted: compare the sets of requests
    sim_end = (run.steps["t_ms"] + run.steps["dur_ms"]).round(9).to_numpy()
    by_end = {e: set(run.tokens.loc[run.tokens["t_ms"].round(9) == e, "req"]) for e in tok_steps}
    got = inf.trace.batch.groupby("step")["req"].apply(set).tolist()
    assert got == [by_end[e] for e in tok_steps]
    assert len(emitting) >= len(tok_steps) and sim_end.size == len(run.steps)
    # clean steps: their inferred duration is the simulated step's (within the first token's jitter: 0)
    clean = np.flatnonzero(inf.clean)
    assert len(clean) > 0.5 * len(tok_steps)
    durations = dict(zip(sim_end, run.steps["dur_ms"].to_numpy()))
    for k in clean:
        assert inf.trace.steps["dur_ms"].iloc[k] == pytest.approx(durations[tok_steps[k]], abs=1e-6)


def test_the_fit_recovers_the_step_time(run):
    sm, report = fit_inferred(client_view(run), CFG, "affine")
    assert sm.base_ms == pytest.approx(TRUE.base_ms, rel=1e-3)
    assert sm.prefill_ms_per_token == pytest.approx(TRUE.prefill_ms_per_token, rel=1e-3)
    assert sm.decode_ms_per_seq == pytest.approx(TRUE.decode_ms_per_seq, rel=1e-3)
    assert report["r2"] == pytest.approx(1.0, abs=1e-6) and report["steps"] >= 50


def test_slow_outliers_do_not_move_the_fit(run):
    view = client_view(run)
    # 10% of the steps delayed by 4 ms (the OS, the server's other work): every token after it too
    t = view.tokens["t_ms"].to_numpy().copy()
    ends = np.unique(np.round(run.tokens["t_ms"].to_numpy(), 9))
    for e in ends[5::10]:
        t[t >= e - 1e-9] += 4.0
    view = dataclasses.replace(view, tokens=view.tokens.assign(t_ms=t))
    sm, _ = fit_inferred(view, CFG, "affine")
    assert sm.decode_ms_per_seq == pytest.approx(TRUE.decode_ms_per_seq, rel=0.02)
    assert sm.base_ms == pytest.approx(TRUE.base_ms, rel=0.02)


def test_gap_threshold_and_bunched_tokens():
    # a quarter of the median inter-token gap, within [0.3, 3] ms
    t = np.array([0.0, 4.0, 8.0, 12.0, 0.1, 4.1, 8.1, 12.1])
    req = np.array([0, 0, 0, 0, 1, 1, 1, 1])
    assert burst_gap_ms(t, req) == pytest.approx(1.0)
    assert burst_gap_ms(t * 100, req) == 3.0 and burst_gap_ms(t / 100, req) == 0.3


def test_no_token_times_is_refused(run):
    with pytest.raises(ConfigError, match="needs streamed token times"):
        infer_steps(dataclasses.replace(run, tokens=run.tokens.iloc[:1]), CFG)


def test_closed_loop_clients_read_from_the_run_settings(run):
    assert closed_loop_clients(run) is None
    closed = dataclasses.replace(run, meta={**run.meta, "engine": {"request_rate": "inf", "max_concurrency": 8}})
    assert closed_loop_clients(closed) == 8
    poisson = dataclasses.replace(run, meta={**run.meta, "engine": {"request_rate": 20.0, "max_concurrency": 16}})
    assert closed_loop_clients(poisson) is None


def test_the_command_line_fits_a_vllm_result_from_its_token_times(tmp_path, capsys):
    from core.__main__ import main
    from core.fit.stepfit import load
    from tests.conftest import ROOT
    run = ROOT / "data" / "imports" / "vllm_cpu_tiny_poisson20_p192_o48.json"
    out = tmp_path / "m.json"
    assert main(["fit", str(run), "--from-token-times", "--max-seqs", "16", "--token-budget", "2048",
                 "--block-size", "128", "--out", str(out), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["fit"]["method"] == "steps inferred from token times" and doc["fit"]["steps"] >= 100
    sm, _ = load(out)
    # vLLM's own /metrics for this run: mean inter-token latency 7.27 ms with up to 16 decoding
    assert 3.0 < sm.base_ms + 16 * sm.decode_ms_per_seq < 10.0 and sm.prefill_ms_per_token > 0
    no_send_times = ROOT / "data" / "imports" / "vllm_example_result.json"
    assert main(["fit", str(no_send_times), "--from-token-times"]) == 2
    assert "needs each request's send time" in capsys.readouterr().err
    assert main(["fit", str(run), "--from-token-times", "--from-requests"]) == 2
