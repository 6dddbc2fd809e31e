"""`python -m core fidelity`: fit on measured runs, predict others (core.fit.calibrate). Runs made
here with known terms are predicted exactly; bad runs get errors naming the file and the field."""
import json

import numpy as np
import pytest

from core.__main__ import main
from core.config import SchedulerConfig
from core.fit.calibrate import PARTS, compare, summary
from core.fit.runs import load_run
from core.sim.frontend import FrontEnd
from core.sim.simulate import simulate
from core.sim.stepmodel import StepModel
from core.trace import save_trace
from core.workload import Request, Workload

FE = FrontEnd(in_ms=1.5, in_ms_per_prompt_token=0.002, out_ms=0.4, out_ms_per_output_token=0.01)
STEP = StepModel("affine", base_ms=1.0, prefill_ms_per_token=0.02, decode_ms_per_seq=0.08)


def poisson(n, rate_per_s, seed, prompt=(32, 400), out=(4, 40)) -> Workload:
    rng = np.random.default_rng(seed)
    t = np.cumsum(rng.exponential(1000.0 / rate_per_s, n))
    return Workload([Request(f"s{seed}-{i}", float(t[i]), int(rng.integers(*prompt)), int(rng.integers(*out)))
                     for i in range(n)])


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    d = tmp_path_factory.mktemp("runs")
    paths = []
    for k, (rate, seqs) in enumerate([(40, 8), (150, 4), (90, 16)]):
        cfg = SchedulerConfig(policy="vllm-v1", max_seqs=seqs, token_budget=1024)
        tr = simulate(poisson(36, rate, k), cfg, STEP, front_end=FE)
        save_trace(tr, d / f"run{k}.json")
        paths.append(str(d / f"run{k}.json"))
    return paths


def test_runs_made_with_known_terms_are_predicted_exactly(runs, capsys):
    assert main(["fidelity", "--fit", runs[0], runs[1], "--predict", runs[2], "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    cal = out["calibration"]
    for k, v in FE.to_dict().items():
        assert cal["front_end"][k] == pytest.approx(v, abs=1e-6)
    (p,) = out["predicted"]
    assert p["held_out"] and p["requests"] == 36 and p["flags"]["max_seqs"] == 16   # its own flags
    assert p["ttft_ms"]["p90"] < 0.02 and p["e2e_ms"]["p90"] < 0.02
    assert "front end" in p["clock"] or "trace" in p["clock"]


def test_the_error_splits_exactly_into_its_parts(runs):
    run = load_run(runs[2])
    other = simulate(run.workload, run.config, StepModel("affine", base_ms=2.0, decode_ms_per_seq=0.2),
                     front_end=FrontEnd(in_ms=3.0))
    rows = compare(other, run)
    err = rows["e2e_ms_predicted"] - rows["e2e_ms_measured"]
    parts = sum(rows[f"{p}_predicted"] - rows[f"{p}_measured"] for p in PARTS)
    assert np.allclose(err, parts)
    s = summary(rows)
    assert s["largest_part"] == "decode"   # 0.2 ms per sequence against 0.08: decode is where it goes wrong
    assert s["e2e_error_by_part"]["front end"]["mean_ms"] == pytest.approx(
        float((3.0 - (1.5 + 0.002 * rows["prompt_tokens"] + 0.4 + 0.01 * (rows["output_tokens"] - 1))).mean()))


def test_a_directory_without_per_request_times_is_refused_by_name(tmp_path, capsys):
    (tmp_path / "notes.txt").write_text("nothing here")
    assert main(["fidelity", "--fit", str(tmp_path), "--predict", str(tmp_path)]) != 0
    err = capsys.readouterr().err
    assert str(tmp_path) in err and "per-request times" in err


def test_a_missing_run_is_named(tmp_path, capsys):
    assert main(["fidelity", "--fit", str(tmp_path / "nope"), "--predict", str(tmp_path / "nope")]) != 0
    assert "nope: no such file or directory" in capsys.readouterr().err


def test_a_run_whose_files_cannot_be_read_says_which_and_why(tmp_path, capsys):
    from core.lessons.vllm_runs import ROOT
    spans = (ROOT / "run4_poisson8_p128_o32" / "spans.otlp.jsonl").read_bytes()
    (tmp_path / "spans.otlp.jsonl").write_bytes(spans[:300])            # cut mid-line
    assert main(["fidelity", "--fit", str(tmp_path), "--predict", str(tmp_path)]) != 0
    err = capsys.readouterr().err
    assert "not read: spans.otlp.jsonl" in err and "not valid JSON" in err


def test_engine_flags_missing_from_a_runs_files_are_asked_for_and_checked(tmp_path, capsys):
    from core.lessons.vllm_runs import ROOT
    client = next((ROOT / "run4_poisson8_p128_o32").glob("vllm_bench_*.json"))
    (tmp_path / client.name).write_bytes(client.read_bytes())           # a client's file alone: no server log
    assert main(["fidelity", "--fit", str(tmp_path), "--predict", str(tmp_path)]) != 0
    assert "--flags" in capsys.readouterr().err
    assert main(["fidelity", "--fit", str(tmp_path), "--predict", str(tmp_path), "--flags", "[1]"]) != 0
    assert "--flags: expected a JSON object" in capsys.readouterr().err
    assert main(["fidelity", "--fit", str(tmp_path), "--predict", str(tmp_path), "--flags", '{"max_seqs": 0}']) != 0
    assert "--flags: max_seqs" in capsys.readouterr().err
    # with flags it gets as far as the fit, which names what the client's file lacks (the engine's phases)
    assert main(["fidelity", "--fit", str(tmp_path), "--predict", str(tmp_path), "--flags", '{"max_seqs": 16}']) != 0
    assert "no engine phases" in capsys.readouterr().err
