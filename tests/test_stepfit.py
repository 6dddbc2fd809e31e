"""Step models as data (core.fit.stepfit, StepModel kind "features"): hand-worked features and
start positions, exact recovery of known coefficients from simulated traces (with chunked
prefill, preemption and prefix-cache hits), the model file, range warnings and the CLI."""
import json

import numpy as np
import pytest

from core.__main__ import main
from core.config import SchedulerConfig
from core.errors import ConfigError
from core.fit.stepfit import entry_start_positions, fit, load, outside_range, save, trace_features
from core.lessons.scenarios import shared_prefix_demo
from core.sim.simulate import simulate
from core.sim.stepmodel import FEATURES, StepModel, step_features
from core.workload import make_workload

TRUE = StepModel("features", base_ms=2.0, prefill_ms_per_token=0.01, decode_ms_per_seq=0.3,
                 prefill_ms_per_kpos=0.002, decode_ms_per_kpos=0.05, prefill_ms_per_chunk=0.7)


def workload(n=120, seed=3, max_prompt=300, max_out=60, span=400.0):
    rng = np.random.default_rng(seed)
    return make_workload([(f"q{i}", float(rng.uniform(0, span)), int(rng.integers(1, max_prompt)),
                           int(rng.integers(1, max_out))) for i in range(n)])


def test_step_features_by_hand():
    # a 4-token prompt piece after 0 cached tokens attends 1+2+3+4 = 10 positions; a decode
    # after 10 cached tokens attends 11; two pieces of prefill, one decode
    f = step_features(np.array([4, 3, 1]), np.array([0, 5, 10]), np.array([True, True, False]))
    # the 3-token piece after 5 cached: 6+7+8 = 21
    assert dict(zip(FEATURES, f.tolist())) == {"step": 1.0, "prefill_tokens": 7.0, "decode_seqs": 1.0,
                                               "prefill_kpos": 0.031, "decode_kpos": 0.011, "prefill_chunks": 2.0}
    # the model's duration is the dot product
    assert TRUE.coefficients() @ f == pytest.approx(2 + 0.07 + 0.3 + 0.002 * 0.031 + 0.05 * 0.011 + 1.4)


def test_start_positions_follow_chunks_and_decodes():
    # A: prompt 5 in chunks of 2 (0, 2, 4), then decodes at 5, 6; B: prompt 1, decode at 1
    tr = simulate(make_workload([("A", 0, 5, 3), ("B", 0, 1, 2)]),
                  SchedulerConfig("continuous", chunk=2), StepModel())
    got = {(int(r), int(s)): int(p) for r, s, p in zip(tr.batch["req"], tr.batch["step"], entry_start_positions(tr))}
    a = [got[k] for k in sorted(k for k in got if k[0] == 0)]
    b = [got[k] for k in sorted(k for k in got if k[0] == 1)]
    assert a == [0, 2, 4, 5, 6] and b == [0, 1]


@pytest.mark.parametrize("cfg", [
    SchedulerConfig("continuous", max_seqs=16, token_budget=256, chunk=64),
    SchedulerConfig("continuous", max_seqs=16, token_budget=512, chunk=128, kv_blocks=60),    # preempts
])
def test_a_features_fit_recovers_the_coefficients_that_made_the_trace(cfg):
    tr = simulate(workload(), cfg, TRUE)
    if cfg.kv_blocks:
        assert len(tr.preempts)
    sm, rep = fit(tr, "features")
    assert sm.coefficients() == pytest.approx(TRUE.coefficients(), rel=1e-6, abs=1e-9)
    assert rep["r2"] == pytest.approx(1.0) and rep["residual_ms"]["p99"] < 1e-9
    affine, rep_a = fit(tr, "affine")                      # the affine model cannot: it misses attention
    assert affine.kind == "affine" and rep_a["r2"] < 0.999


def test_prefix_cache_hits_count_as_cached_positions():
    w = shared_prefix_demo(n=16, tenants=1, system_tokens=32, block_size=16)
    tr = simulate(w, SchedulerConfig("continuous", max_seqs=4, prefix_caching=True), TRUE)
    assert (tr.kv["op"] == "hit").any()
    sm, _ = fit(tr, "features")
    assert sm.coefficients() == pytest.approx(TRUE.coefficients(), rel=1e-6, abs=1e-9)


def test_fast_forwarded_runs_price_steps_like_single_steps():
    w = workload(n=40, max_out=200)
    cfg = SchedulerConfig("continuous", max_seqs=8)
    a, b = simulate(w, cfg, TRUE, fast_forward=True), simulate(w, cfg, TRUE, fast_forward=False)
    assert a.tokens["t_ms"].tolist() == b.tokens["t_ms"].tolist()
    assert a.steps["dur_ms"].tolist() == b.steps["dur_ms"].tolist()


def test_model_files_round_trip_and_out_of_range_steps_are_named(tmp_path):
    tr = simulate(workload(), SchedulerConfig("continuous", max_seqs=8, token_budget=256, chunk=64), TRUE)
    sm, rep = fit(tr)
    save(tmp_path / "m.json", sm, rep)
    sm2, rep2 = load(tmp_path / "m.json")
    assert sm2 == sm and rep2 == json.loads(json.dumps(rep))
    assert outside_range(tr, rep) is None                  # the fitted trace is inside its own range
    bigger = simulate(workload(max_prompt=1200, max_out=200), SchedulerConfig("continuous", max_seqs=16,
                                                                               token_budget=512, chunk=512), sm)
    o = outside_range(bigger, rep)
    _, X, _ = trace_features(bigger)
    hi = rep["range"]["decode_seqs"][1]
    assert o["features"]["decode_seqs"][1] == X[:, 2].max() > hi
    assert o["steps"] >= int((X[:, 2] > hi).sum())
    (tmp_path / "bad.json").write_text('{"format": "nope"}')
    with pytest.raises(ConfigError, match="expected a step model file"):
        load(tmp_path / "bad.json")
    with pytest.raises(ConfigError, match="at least 8 steps"):
        fit(simulate(make_workload([("A", 0, 1, 2)]), SchedulerConfig("continuous"), StepModel()))


def test_the_command_line_fits_and_simulates_from_a_model_file(tmp_path, capsys):
    w = tmp_path / "w.json"
    rng = np.random.default_rng(1)
    w.write_text(json.dumps({"requests": [{"id": f"r{i}", "arrival_ms": float(i * 40), "prompt_tokens":
                                           int(rng.integers(1, 300)), "max_output_tokens": int(rng.integers(1, 60))}
                                          for i in range(60)]}))
    flags = ["--max-seqs", "8", "--token-budget", "512", "--chunk", "512"]
    coef = ["--step-model", "features", "--base-ms", "2", "--decode-ms-per-seq", "0.3", "--decode-ms-per-kpos", "0.05",
            "--prefill-ms-per-token", "0.01"]
    assert main(["simulate", str(w), *flags, *coef, "--out", str(tmp_path / "t.parquet")]) == 0
    assert main(["fit", str(tmp_path / "t.parquet"), "--out", str(tmp_path / "m.json"), "--json"]) == 0
    out = json.loads(capsys.readouterr().out.splitlines()[-1])
    assert out["step_model"]["decode_ms_per_kpos"] == pytest.approx(0.05) and out["fit"]["r2"] == pytest.approx(1)
    assert main(["simulate", str(w), *flags, "--step-model-file", str(tmp_path / "m.json"),
                 "--out", str(tmp_path / "again.json")]) == 0
    from core.trace import load_trace
    again, first = load_trace(tmp_path / "again.json"), load_trace(tmp_path / "t.parquet")
    assert again.tokens["t_ms"].to_numpy() == pytest.approx(first.tokens["t_ms"].to_numpy())
    assert main(["simulate", str(w), "--step-model", "affine", "--step-model-file", str(tmp_path / "m.json"),
                 "--out", str(tmp_path / "x.json")]) == 2
    assert "drop --step-model" in capsys.readouterr().err


def test_what_the_data_cannot_say_about_a_term_is_said():
    """Issue 28 item 2: a fit names the terms its data could not determine (instead of drawing a
    prediction from an arbitrary split) and the ones the non-negativity bound held at 0."""
    from core.fit.stepfit import describe_identifiability, identifiability, nnls_coefficients
    rng = np.random.default_rng(0)
    n = 50
    prefill = rng.integers(0, 500, n).astype(float)
    X = np.zeros((n, len(FEATURES)))
    X[:, 0] = 1.0
    X[:, 1] = prefill
    # every step decodes 4 sequences: base and per-sequence cost move together
    X[:, 2] = 4.0
    y = 5.0 + 0.1 * prefill + 0.3 * 4
    d = identifiability(X, y, "affine", nnls_coefficients(X, y, "affine"))
    assert set(d["inseparable"]) == {"base_ms", "decode_ms_per_seq"} and d["unseen"] == []
    assert any("cannot separate" in s for s in describe_identifiability(d))
    # the batch varies but the time falls with it: the bound holds the cost at 0; exact data, so
    # unconstrained least squares gives the slope the data was made with
    X[:, 2] = rng.integers(1, 16, n)
    y = 5.0 + 0.1 * prefill - 0.05 * X[:, 2]
    coef = nnls_coefficients(X, y, "affine")
    d = identifiability(X, y, "affine", coef)
    assert coef[2] == 0.0 and d["inseparable"] == []
    assert d["held_at_zero"]["decode_ms_per_seq"] == pytest.approx(-0.05, rel=1e-9)
    # no step prefilled anything: the per-token cost is unseen
    X[:, 1] = 0.0
    d = identifiability(X, 5.0 + 0.3 * X[:, 2], "affine", nnls_coefficients(X, 5.0 + 0.3 * X[:, 2], "affine"))
    assert d["unseen"] == ["prefill_ms_per_token"] and d["held_at_zero"] == {}
