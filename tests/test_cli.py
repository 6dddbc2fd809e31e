"""`python -m core` as a user runs it: reference numbers through the CLI, exit codes."""
import json
import subprocess
import sys

import pytest

from tests.conftest import DATA, ROOT


def run(*args):
    p = subprocess.run([sys.executable, "-m", "core", *map(str, args)], cwd=ROOT, capture_output=True, text=True,
                       timeout=120)
    return p.returncode, p.stdout, p.stderr


def metrics_json(path, *extra):
    rc, out, err = run("metrics", path, "--json", *extra)
    assert rc == 0, err
    return json.loads(out)


def test_metrics_reference_numbers_serial():
    m = metrics_json(DATA / "traces" / "chapter31_serial.json", "--usd-per-hour", "2")
    req = {r["id"]: r for r in m["requests"]}
    assert {k: r["ttft_ms"] for k, r in req.items()} == {"A": 100, "B": 240, "C": 320}
    assert req["A"]["tpot_ms"] == 40 and req["C"]["tpot_ms"] is None
    assert (req["A"]["e2e_ms"], req["B"]["e2e_ms"]) == (180, 280)
    s = m["summary"]
    assert s["window_ms"] == [0, 360] and s["output_tokens"] == 6
    assert s["output_tok_per_s"] == pytest.approx(16.667, abs=1e-3)
    assert s["cost_usd"] == pytest.approx(0.0002)
    assert s["cost_per_1k_output_usd"] == pytest.approx(0.033333, abs=1e-6)
    assert set(req["A"]) >= {"id", "arrival_ms", "first_token_ms", "last_token_ms", "output_tokens",
                             "ttft_ms", "tpot_ms", "e2e_ms"}


def test_metrics_reference_numbers_continuous():
    m = metrics_json(DATA / "traces" / "chapter31_continuous.json", "--usd-per-hour", "2")
    req = {r["id"]: r for r in m["requests"]}
    assert {k: r["ttft_ms"] for k, r in req.items()} == {"A": 100, "B": 130, "C": 140}
    assert req["B"]["tpot_ms"] == 50 and req["C"]["tpot_ms"] is None
    assert m["summary"]["output_tok_per_s"] == pytest.approx(30.0)
    assert m["summary"]["cost_usd"] == pytest.approx(0.000111111, abs=1e-9)
    assert m["summary"]["cost_per_1k_output_usd"] == pytest.approx(0.018519, abs=1e-6)


@pytest.mark.parametrize("name", ["serial", "continuous"])
@pytest.mark.parametrize("window,rate", [((0, 400), 15.0), ((0, 500), 12.0)])
def test_fixed_windows(name, window, rate):
    m = metrics_json(DATA / "traces" / f"chapter31_{name}.json", "--window", *window)
    assert m["summary"]["output_tok_per_s"] == pytest.approx(rate)
    assert m["summary"]["window_ms"] == list(window)
    assert m["summary"]["cost_usd"] is None and m["summary"]["cost_per_1k_output_usd"] is None


@pytest.mark.slow
def test_simulate_then_metrics(tmp_path):
    out = tmp_path / "static.json"
    rc, stdout, err = run("simulate", DATA / "workloads" / "burst5.json", "--policy", "static", "--max-seqs", "3",
                          "--out", out)
    assert rc == 0, err
    m = metrics_json(out)
    assert m["summary"]["window_ms"] == [0, 35]            # 35 unit steps
    assert m["source"] == "simulated"
    rc, _, err = run("simulate", DATA / "workloads" / "burst5.json", "--policy", "continuous", "--max-seqs", "3",
                     "--out", out)
    assert metrics_json(out)["summary"]["window_ms"] == [0, 20]
    rc, stdout, err = run("simulate", DATA / "workloads" / "chapter31.json", "--step-model", "affine",
                          "--base-ms", "5", "--prefill-ms-per-token", "1", "--decode-ms-per-seq", "2",
                          "--kv-blocks", "4", "--block-size", "2", "--out", tmp_path / "a.json.gz")
    assert rc == 0, err
    doc = metrics_json(tmp_path / "a.json.gz")
    # A alone at t=0: prefill 4 tokens = 5 + 4 = 9 ms -> first token at 9.
    assert doc["requests"][0]["first_token_ms"] == 9


@pytest.mark.slow
def test_simulate_other_formats(tmp_path):
    for name in ("poisson500_vidur.csv", "llmservingsim64.jsonl"):
        rc, _, err = run("simulate", DATA / "workloads" / name, "--max-seqs", "32", "--out", tmp_path / "t.json")
        assert rc == 0, err


def bad_file(tmp_path, name, content):
    p = tmp_path / name
    p.write_text(content)
    return p


@pytest.mark.slow
@pytest.mark.parametrize("args_fn,msg", [
    (lambda t: ["metrics", t / "missing.json"], "no such file"),
    (lambda t: ["metrics", bad_file(t, "x.json", "{not json")], "not valid JSON"),
    (lambda t: ["metrics", bad_file(t, "x.json",
                                    '{"schema": "serving-trace/9", "meta": {}, "requests": [], "events": []}')],
     "unknown version"),
    (lambda t: ["metrics", bad_file(t, "x.json", json.dumps({
        "schema": "serving-trace/1", "meta": {"source": "given"},
        "requests": [{"id": "A", "arrival_ms": 50, "prompt_tokens": 1, "max_output_tokens": 1}],
        "events": [{"t_ms": 10, "type": "token", "req": "A", "index": 0}]}))], "before its arrival"),
    (lambda t: ["simulate", bad_file(t, "w.json", '{"requests": [{"id": "a", "arrival_ms": 0, "prompt_tokens": 3, '
                                                  '"output_tokens": -1}]}'), "--out", t / "o.json"],
     "output_tokens"),
    (lambda t: ["simulate", DATA / "workloads" / "burst5.json", "--max-seqs", "zero", "--out", t / "o.json"],
     "--max-seqs"),
    (lambda t: ["simulate", DATA / "workloads" / "burst5.json", "--policy", "fastest", "--out", t / "o.json"],
     "--policy"),
    (lambda t: ["simulate", DATA / "workloads" / "chapter31.json", "--step-model", "affine", "--out", t / "o.json"],
     "at least one of base_ms"),
    (lambda t: ["simulate", DATA / "workloads" / "burst5.json", "--kv-blocks", "1", "--out", t / "o.json"],
     "kv_blocks"),
    (lambda t: ["metrics", DATA / "traces" / "chapter31_serial.json", "--window", "10", "5"], "window"),
    (lambda t: ["metrics", DATA / "traces" / "chapter31_serial.json", "--usd-per-hour", "-1"], "--usd-per-hour"),
    (lambda t: ["simulate", DATA / "workloads" / "burst5.json", "--out", t / "no" / "dir" / "o.json"],
     "does not exist"),   # refused before simulating (tests/test_outputs.py)
    (lambda t: [], "required"),
])
def test_bad_input_exit_2_one_line(tmp_path, args_fn, msg):
    rc, out, err = run(*args_fn(tmp_path))
    assert rc == 2
    assert "Traceback" not in err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and msg in lines[0], err


def test_a_closed_pipe_is_not_a_traceback():
    """`python -m core metrics T | head -1`: the reader leaves early; no BrokenPipeError traceback."""
    p = subprocess.run(f"{sys.executable} -m core metrics {DATA / 'traces' / 'shared_prefix_measured_cpu.json.gz'}"
                       " | head -1", shell=True, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert p.stdout.count("\n") == 1 and "Traceback" not in p.stderr and "Error" not in p.stderr, p.stderr


def test_simulate_to_parquet_from_the_command_line_never_imports_pandas(tmp_path):
    """Issue 29 part 4: the CLI imported the JSON trace codec (and pandas with it) at start-up, a
    sixth of a 10,000-request simulate to Parquet (1.00 -> 0.84 s); the streamed path needs neither."""
    import subprocess
    import sys

    from tests.conftest import ROOT
    w = ROOT / "data" / "workloads" / "poisson500_vidur.csv"
    code = ("import sys; from core.__main__ import main; "
            f"rc = main(['simulate', {str(w)!r}, '--out', {str(tmp_path / 't.parquet')!r}]); "
            "print(rc, 'pandas' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.stdout.strip().splitlines()[-1] == "0 False", out.stderr[-2000:]
    assert (tmp_path / "t.parquet").stat().st_size > 0
