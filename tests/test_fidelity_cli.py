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
    # the front end's part: the way in and out, and the wait for the step boundary each trace records
    wait = {}
    for tr in (other, run.truth):
        wait[id(tr)] = np.array([dict(zip(tr.ids, tr.request_extra))[i]["engine_wait_ms"] for i in rows["id"]])
    assert s["e2e_error_by_part"]["front end"]["mean_ms"] == pytest.approx(
        float((3.0 + wait[id(other)] - (1.5 + 0.002 * rows["prompt_tokens"] + 0.4 + 0.01 * (rows["output_tokens"] - 1))
               - wait[id(run.truth)]).mean()))


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


def _cut_log(src, dst):
    """A run's folder as a server log cut into runs leaves it: every file, the log without its start-up lines."""
    dst.mkdir()
    for f in src.iterdir():
        if f.name == "server.log":
            lines = f.read_text().splitlines(keepends=True)
            first = next(i for i, ln in enumerate(lines) if "Iteration(" in ln)
            (dst / f.name).write_text("".join(lines[first:]))
        elif f.is_file():
            (dst / f.name).write_bytes(f.read_bytes())


def test_a_predicted_run_is_never_given_the_fit_runs_flags(tmp_path, capsys):
    """run7 (block size 64, 32 blocks) with its log cut into runs (no start-up lines), predicted from run4 (block
    size 32, 64 blocks): refused as a fit run would be; with the server's whole log beside it, its own flags."""
    from core.lessons.vllm_runs import ROOT
    cut = tmp_path / "run7_cut"
    _cut_log(ROOT / "run7_bs64_poisson6_p256_o32", cut)
    fit = str(ROOT / "run4_poisson8_p128_o32")
    assert main(["fidelity", "--fit", fit, "--predict", str(cut), "--method", "log"]) != 0
    err = capsys.readouterr().err
    assert "run7_cut" in err and "no engine flags" in err and "--server-log" in err
    whole = ROOT / "run7_bs64_poisson6_p256_o32" / "server.log"
    assert main(["fidelity", "--fit", fit, "--predict", str(cut), "--method", "log", "--server-log", str(whole),
                 "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    (p,) = out["predicted"]
    assert p["flags"]["block_size"] == 64 and p["flags"]["kv_blocks"] == 32      # run7's own (its start-up line)
    assert any("--server-log" in n for n in out["notes"])
    # a log that states no flags is refused by name; so are two ways of giving them
    assert main(["fidelity", "--fit", fit, "--predict", str(cut), "--server-log", str(cut / "server.log")]) != 0
    assert "no engine flags in it" in capsys.readouterr().err
    assert main(["fidelity", "--fit", fit, "--predict", str(cut), "--server-log", str(whole),
                 "--flags", '{"max_seqs": 16}']) != 0
    assert "not both" in capsys.readouterr().err


def test_the_flags_line_is_read_wherever_it_stands_in_the_log():
    from core.lessons.vllm_runs import ROOT
    from core.trace.imports.vllm_log import engine_options
    text = (ROOT / "run7_bs64_poisson6_p256_o32" / "server.log").read_text()
    line = next(ln for ln in text.splitlines() if "non-default args:" in ln)
    late = "INFO padding line\n" * 60_000 + line + "\n"          # past the first MiB
    assert engine_options(late)["block_size"] == 64 and engine_options(text)["block_size"] == 64


def test_a_front_end_term_priced_beyond_what_the_fit_runs_saw_is_named(runs):
    """A front end's cost per request in flight, fitted where at most one other was in flight, is
    extrapolated for a run with more: evaluate says how many requests and which range."""
    import dataclasses

    from core.fit.calibrate import calibrate, evaluate
    from core.fit.frontfit import samples
    run = load_run(runs[1])                      # Poisson 150/s at 4 sequences: several in flight at once
    cal = calibrate([load_run(runs[0])], "affine", "log")
    fe_report = {**cal.report["front_end"], "in_flight_range": [0, 1]}
    cal = dataclasses.replace(cal, front_end=dataclasses.replace(cal.front_end, in_ms_per_in_flight=0.5),
                              report={**cal.report, "front_end": fe_report})
    busy = samples(run.truth)["in_flight"].to_numpy()
    beyond = int((busy > 1).sum())
    assert beyond > 0
    note = evaluate(cal, run, set())["outside_note"]
    span = f"{int(busy.min())}–{int(busy.max())}"
    assert f"{beyond:,} of {len(busy):,} requests arrived with {span} others in flight" in note
    assert "(fitted 0–1)" in note


def test_a_closed_loop_is_predicted_as_one_whatever_the_model_s_speed():
    """s6 wB r1 (vLLM 0.32 CPU, `vllm bench serve --max-concurrency 4 --request-rate inf`): its
    client's file says a closed loop of 4, and its prediction keeps 4 in flight even under a step
    model twice as slow as the run (replaying the measured send times would pile them up); the
    first 4 sends are the measured ones, and every later request leaves the front end after one
    finished there, by at least its measured round trip's floor of 0."""
    from core.analysis.metrics import request_metrics
    from core.fit.calibrate import Calibration, predict
    from core.fit.runs import server_log_flags
    from core.sim.frontend import in_flight_at
    from tests.conftest import ROOT
    d = ROOT / "data" / "imports" / "vllm_repeats" / "s6"
    run = load_run(d / "wB_c4_p128_o32_r1", server_log_flags(d / "server_start.log"))
    assert run.clients == 4
    slow = StepModel("affine", base_ms=4.0, prefill_ms_per_token=0.1, decode_ms_per_seq=0.4)
    cal = Calibration(slow, FrontEnd(in_ms=2.0, out_ms=0.5), [], {})
    m = request_metrics(predict(cal, run))
    arrival, finish = m["arrival_ms"].to_numpy(), (m["arrival_ms"] + m["e2e_ms"]).to_numpy()
    assert in_flight_at(arrival, finish).max() <= 3            # (others in flight when one arrives)
    first = np.sort(run.workload.arrival_ms)[:4]
    assert np.sort(arrival)[:4] == pytest.approx(first)
    later = np.sort(arrival)[4:]
    assert (later >= np.sort(finish)[:len(later)] - 1e-6).all()
    # the open-loop replay of the same send times, for contrast: more than 4 in flight
    opened = request_metrics(simulate(run.workload, run.config, slow, front_end=cal.front_end))
    assert in_flight_at(opened["arrival_ms"].to_numpy(), (opened["arrival_ms"] + opened["e2e_ms"]).to_numpy()).max() > 3
