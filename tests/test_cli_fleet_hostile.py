"""Hostile flags and files on the fleet's command line (issue 48, items 25-37): each gets one line
naming what is wrong and a non-zero exit, and never replaces an input or a file it cannot finish."""
import pytest

from core.__main__ import main
from tests.conftest import DATA
from tests.helpers import peak_mib

SHARED = str(DATA / "workloads" / "shared_prefix_200.json")


def one_line_error(capsys, *needles) -> str:
    err = capsys.readouterr().err.strip()
    assert "Traceback" not in err and len(err.splitlines()) == 1, err
    for n in needles:
        assert n in err, err
    return err


@pytest.mark.parametrize("param", ["balance_abs=inf", "cache_threshold=inf", "balance_rel=nan", "prefix=-1"])
@pytest.mark.parametrize("command", ["simulate", "sweep", "search"])
def test_a_router_parameter_that_is_not_a_finite_number_is_one_line(tmp_path, capsys, command, param):
    """Item 35: `--router-param ...=inf` ended simulate and sweep in a ValueError traceback ("min() arg is
    an empty sequence") and search --json in "Out of range float values are not JSON compliant"."""
    policy = "weighted" if param.startswith("prefix=") else "prefix-aware"
    extra = {"simulate": ["--out", str(tmp_path / "o.json")], "sweep": ["--rates", "5"],
             "search": ["--rate", "5", "--grid", "max_seqs=8,16", "--slo-ttft-ms", "500", "--json"]}[command]
    rc = main([command, SHARED, "--replicas", "2", "--router", policy, "--router-param", param, *extra])
    assert rc == 2
    one_line_error(capsys, f"router parameter {param.split('=')[0]}: expected a finite number >= 0")
    assert not (tmp_path / "o.json").exists()


def test_an_output_that_is_an_input_is_refused_and_the_input_kept(tmp_path, capsys):
    """Item 25: `simulate W --out W` and `fleet-merge R0 R1 --out R0` (also through a symlink to an
    input) exited 0 and replaced the input (a Mooncake .jsonl became a JSON trace)."""
    import shutil
    w = tmp_path / "w.jsonl"
    shutil.copy(DATA / "workloads" / "mooncake_conversation_500.jsonl", w)
    before = w.read_bytes()
    link = tmp_path / "link.jsonl"
    link.symlink_to(w)
    for out in (w, link):
        assert main(["simulate", str(w), "--out", str(out)]) == 2
        one_line_error(capsys, "is ", "an input of this command", str(w))
        assert w.read_bytes() == before and link.is_symlink()
    r0, r1 = tmp_path / "r0.json", tmp_path / "r1.json"
    for r in (r0, r1):
        assert main(["simulate", str(DATA / "workloads" / "burst5.json"), "--out", str(r)]) == 0
    capsys.readouterr()
    kept = r0.read_bytes()
    assert main(["fleet-merge", str(r0), str(r1), "--out", str(r0)]) == 2
    one_line_error(capsys, "an input of this command")
    assert r0.read_bytes() == kept
    assert main(["fleet-merge", str(r0), str(r1), "--out", str(tmp_path / "fleet.json")]) == 0


def test_inputs_are_refused_before_they_are_read_whole(tmp_path):
    """Item 29: a 1 GiB --replicas-file reached 2.1 GB before "over 16 MiB"; a symlink to /dev/zero as the
    replicas file or a fleet-merge input was killed at 3 GB. The size is checked before reading, a
    device is refused unread: each refusal's process stays near an idle interpreter's size."""
    big = tmp_path / "big.json"
    with open(big, "wb") as f:
        f.truncate(1 << 30)                      # sparse: a gigabyte on paper, nothing on disk
    zero = tmp_path / "zero.json"
    zero.symlink_to("/dev/zero")
    out = str(tmp_path / "o.json")
    w = str(DATA / "workloads" / "burst5.json")
    cases = [(["simulate", w, "--replicas-file", str(big), "--out", out], "larger than 16,777,216 bytes"),
             (["simulate", w, "--replicas-file", str(zero), "--out", out], "is a device"),
             (["fleet-merge", str(zero), w, "--out", out], "is a device")]
    for argv, said in cases:
        rc, err, mib = peak_mib(argv)
        assert rc == 2 and said in err and len(err.splitlines()) == 1, err
        assert mib < 400, (argv, mib)


def test_deeply_nested_json_in_a_flag_or_a_file_is_one_line(tmp_path, capsys):
    """Item 36: deeply nested JSON in --replicas-file, fidelity --flags and a run's dataset.jsonl ended in
    a RecursionError traceback."""
    import shutil
    deep = "[" * 100_000 + "]" * 100_000
    (tmp_path / "deep.json").write_text(deep)
    assert main(["simulate", str(DATA / "workloads" / "burst5.json"), "--replicas-file", str(tmp_path / "deep.json"),
                 "--out", str(tmp_path / "o.json")]) == 2
    one_line_error(capsys, "--replicas-file", "nested too deeply")
    runs = DATA / "imports" / "vllm_telemetry"
    assert main(["fidelity", "--fit", str(runs / "run1_c4_p128_o32"), "--predict", str(runs / "run1_c4_p128_o32"),
                 "--method", "log", "--flags", deep]) == 2
    one_line_error(capsys, "--flags", "nested too deeply")
    run = tmp_path / "run"
    shutil.copytree(runs / "run1_c4_p128_o32", run)
    (run / "dataset.jsonl").write_text(deep + "\n")
    assert main(["fidelity", "--fit", str(run), "--predict", str(run), "--method", "log"]) == 0
    said = capsys.readouterr().out
    assert "dataset.jsonl: not read" in said and "nested too deeply" in said


@pytest.mark.parametrize("args, said", [
    (["--prefill-replicas", "1", "--decode-replicas", "1", "--dtype-bytes", "0"],
     "dtype_bytes: expected a number in (0, 16]"),
    (["--prefill-replicas", "1", "--decode-replicas", "1", "--dtype-bytes", "1e300"], "dtype_bytes"),
    (["--prefill-replicas", "1", "--decode-replicas", "1", "--kv-link-gbps", "1e-300"], "--kv-link-gbps"),
    (["--drain", "1@100"], "--drain: a fleet's flags, but no fleet"),
    (["--router", "least-kv"], "--router: a fleet's flags, but no fleet"),
    (["--replicas", "2", "--pd-min-prompt", "10"], "--pd-min-prompt: disaggregated serving's flags"),
    (["--replicas", "2", "--kv-link-gbps", "5", "--kv-link-latency-ms", "1"],
     "--kv-link-gbps, --kv-link-latency-ms: disaggregated serving's flags"),
    (["--replicas", "2", "--router-prefix", "precise"], "round-robin does not look at prefixes"),
    (["--replicas", "2", "--drain", "1@100", "--drain", "1@200"], "replica 1 is already drained at 100 ms"),
], ids=["dtype-0", "dtype-huge", "link-tiny", "drain-no-fleet", "router-no-fleet", "pd-min-whole", "link-whole",
        "prefix-round-robin", "drain-twice"])
def test_flags_that_cannot_apply_are_refused_not_ignored(tmp_path, capsys, args, said):
    """Items 33 and 37: --dtype-bytes 0 was priced as 2 bytes, a 1e-300 GB/s link ended in "arrival_ms
    ... beyond the latest time" naming a request, and flags that do not apply to the fleet given were
    silently ignored."""
    assert main(["simulate", SHARED, *args, "--out", str(tmp_path / "o.json")]) == 2
    one_line_error(capsys, said)


def test_a_rate_too_low_for_any_trace_names_the_rate(capsys):
    assert main(["sweep", SHARED, "--rates", "1e-300"]) == 2
    one_line_error(capsys, "rate 1e-300 req/s", "give a higher rate")


def test_empty_fidelity_flags_are_refused(capsys):
    runs = DATA / "imports" / "vllm_telemetry"
    assert main(["fidelity", "--fit", str(runs / "run1_c4_p128_o32"), "--predict", str(runs / "run1_c4_p128_o32"),
                 "--flags", ""]) == 2
    one_line_error(capsys, "--flags: expected a JSON object")


@pytest.fixture()
def two_replicas(tmp_path, capsys):
    out = []
    for k in range(2):
        p = tmp_path / f"r{k}.json"
        assert main(["simulate", str(DATA / "workloads" / "burst5.json"), "--out", str(p)]) == 0
        out.append(str(p))
    capsys.readouterr()
    return out


@pytest.mark.parametrize("flags, said", [
    (["--roles", "prefill,both"], "replicas are either all whole (role both) or prefill and decode ones"),
    (["--roles", "prefill,prefill"], "needs at least one prefill and one decode replica"),
    (["--offsets-ms=-1e9,0"], "outside the 0..1e+12 ms a trace holds"),
    (["--offsets-ms=1e300,0"], "outside the 0..1e+12 ms a trace holds"),
], ids=["prefill-both", "prefill-prefill", "offset-negative", "offset-huge"])
def test_fleet_merge_refuses_role_mixes_and_offsets_no_fleet_can_have(tmp_path, capsys, two_replicas, flags, said):
    """Item 34: --roles prefill,both turned replica 0's finished requests unfinished, prefill,prefill left
    none finished (role mixes the simulator refuses); offsets -1e9 or 1e300 exited 0 and `metrics` then
    refused the file."""
    out = tmp_path / "fleet.json"
    assert main(["fleet-merge", *two_replicas, *flags, "--out", str(out)]) == 2
    one_line_error(capsys, said)
    assert not out.exists()


def test_fleet_merge_writes_parquet_and_keeps_the_origin(tmp_path, capsys, two_replicas):
    """Item 36: fleet-merge of two bundled measured traces to .parquet or DIR/ ended in "AttributeError:
    'float' object has no attribute 'encode'" (a text field missing on one side came back NaN); item 37:
    a merge of a given and a measured trace was labelled "(measured)" while meta.source said "given"."""
    from core.trace import load_trace
    a = str(DATA / "traces" / "chapter31_measured_cpu.json")
    b = str(DATA / "traces" / "shared_prefix_measured_cpu.json.gz")
    # (two runs with no clock recorded: placed only by offsets given; issue 52: never at 0 by assumption)
    assert main(["fleet-merge", a, b, "--out", str(tmp_path / "f.parquet")]) == 2
    one_line_error(capsys, "chapter31_measured_cpu.json records no clock (meta.clock): its times cannot be placed")
    for out in (tmp_path / "f.parquet", tmp_path / "parts/"):
        assert main(["fleet-merge", a, b, "--out", str(out), "--offsets-ms", "0,0"]) == 0
        tr = load_trace(str(out).rstrip("/") if str(out).endswith("parts/") else out)
        assert tr.meta["source"] == "measured" and tr.meta["label"] == "2 replicas (measured)"
        assert all(x is None or isinstance(x, str) for x in tr.requests["tenant"])
    capsys.readouterr()
    assert main(["fleet-merge", a, two_replicas[0], "--out", str(tmp_path / "mixed.json")]) == 2
    one_line_error(capsys, "come from different sources", "measured", "simulated")


def test_one_stray_byte_in_a_server_log_does_not_lose_its_flags(tmp_path, capsys):
    """Item 37: one byte that is not UTF-8 in a 310 KB server.log made the whole log unreadable, and the
    fit then said only "no engine flags ... give them with --flags"."""
    import shutil

    from core.trace import open_trace
    run = tmp_path / "run1"
    shutil.copytree(DATA / "imports" / "vllm_telemetry" / "run1_c4_p128_o32", run)
    raw = (run / "server.log").read_bytes()
    (run / "server.log").write_bytes(raw[:len(raw) // 2] + b"\xff" + raw[len(raw) // 2:])
    imp = open_trace(run / "server.log")
    assert any("1 byte(s) that are not UTF-8" in n for n in imp.notes)
    assert main(["fidelity", "--fit", str(run), "--predict", str(run), "--method", "log"]) == 0
    # a log past repair: the refusal names the file that was not read and why
    (run / "server.log").write_bytes(bytes(range(128, 256)) * 4000)
    capsys.readouterr()
    assert main(["fidelity", "--fit", str(run), "--predict", str(run), "--method", "log"]) == 2
    one_line_error(capsys, "no engine flags", "not read: server.log")


def test_a_fleet_trace_is_not_fitted_as_one_engine(capsys):
    """Item 31: `fidelity` on fleet_two.json.gz fitted and predicted it as one engine, with no note
    (in-sample TTFT p50 212% off)."""
    f = str(DATA / "traces" / "fleet_two.json.gz")
    assert main(["fidelity", "--fit", f, "--predict", f, "--method", "log"]) == 2
    one_line_error(capsys, "a fleet trace (2 replicas)", "one replica's trace")


def test_spans_received_twice_count_once(tmp_path, capsys):
    """Item 32: every span twice was accepted as 112 requests instead of 48 (the warm-up note gone, the
    fit moved from 0.0805 to 0.0296 ms a prefill token)."""
    import json
    import shutil
    runs = DATA / "imports" / "vllm_telemetry"
    run = tmp_path / "run4"
    shutil.copytree(runs / "run4_poisson8_p128_o32", run)
    lines = (run / "spans.otlp.jsonl").read_text().splitlines()
    (run / "spans.otlp.jsonl").write_text("\n".join(lines + lines) + "\n")
    got = []
    for r in (runs / "run4_poisson8_p128_o32", run):
        assert main(["fidelity", "--fit", str(r), "--predict", str(r), "--method", "log", "--json"]) == 0
        got.append(json.loads(capsys.readouterr().out))
    a, b = got
    assert b["calibration"]["step_model"] == a["calibration"]["step_model"]
    assert b["predicted"][0]["requests"] == a["predicted"][0]["requests"]
    from core.trace import open_trace
    assert any("appeared more than once" in n for n in open_trace(run / "spans.otlp.jsonl").notes)


@pytest.mark.slow
def test_a_fleet_of_thousands_of_replicas_records_a_bounded_route_per_request(tmp_path):
    """Item 28: 2,000 one-block requests on 4,096 replicas took 4.96 GB (each route event recorded what the
    router saw of every replica). A route records at most core.fleet.router.RECORDED_SIGNALS replicas
    (the chosen ones first) and how many it left out."""
    import json

    from core.fleet.router import RECORDED_SIGNALS
    from core.trace import load_trace
    w = tmp_path / "w.json"
    w.write_text(json.dumps({"name": "tiny", "requests": [
        {"id": f"q{i}", "arrival_ms": float(i), "prompt_tokens": 16, "output_tokens": 2} for i in range(2000)]}))
    out = tmp_path / "t.parquet"
    rc, err, mib = peak_mib(["simulate", str(w), "--replicas", "2048", "--out", str(out)])
    assert rc == 0, err
    assert mib < 800, mib                     # (the recorded signals alone took ~2.5 GB at 2,048 replicas)
    routes = load_trace(out).events_of("route")
    assert len(routes) == 2000
    for e in routes:
        assert len(e["signals"]) == RECORDED_SIGNALS and str(e["replica"]) in e["signals"]
        assert e["signals_left_out"] == 2048 - RECORDED_SIGNALS


def test_running_out_of_memory_under_a_process_limit_is_one_line(tmp_path):
    """Item 36: `simulate` under `ulimit -v` ended in numpy's MemoryError traceback."""
    import json
    import resource
    import subprocess
    import sys
    w = tmp_path / "big.json"
    w.write_text(json.dumps({"name": "big", "requests": [
        {"id": f"q{i}", "arrival_ms": float(i), "prompt_tokens": 2000, "output_tokens": 2000} for i in range(2000)]}))
    limit = 700 << 20      # (the interpreter and its imports fit in ~450 MB; 4 M tokens' trace does not)

    def cap():
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    r = subprocess.run([sys.executable, "-m", "core", "simulate", str(w), "--out", str(tmp_path / "t.json")],
                       capture_output=True, text=True, timeout=300, cwd=str(DATA.parent), preexec_fn=cap)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr[-2000:]
    assert r.stderr.strip().startswith("error: out of memory") and len(r.stderr.strip().splitlines()) == 1


def test_an_engine_block_size_that_is_not_a_number_is_one_line(tmp_path, capsys):
    """Left open by items 22-24's pass: meta.engine.block_size "sixteen" ended `fit` in an int() traceback."""
    import gzip
    import json
    doc = json.loads(gzip.decompress((DATA / "traces" / "shared_prefix_measured_cpu.json.gz").read_bytes()))
    doc["meta"]["engine"]["block_size"] = "sixteen"
    p = tmp_path / "bs.json"
    p.write_text(json.dumps(doc))
    assert main(["fit", str(p), "--out", str(tmp_path / "m.json")]) == 2
    one_line_error(capsys, "meta.engine.block_size: expected tokens per KV block")


@pytest.mark.parametrize("grid, flags, said", [
    ("replicas=2,4", ["--replicas", "3"], "grid: replicas: the fleet is already given by --replicas"),
    ("router=round-robin,least-kv", ["--replicas", "3", "--router", "least-kv"], "grid: router: --router least-kv"),
])
def test_a_search_axis_that_would_override_its_flag_is_refused(capsys, grid, flags, said):
    """Item 37: `search --replicas 3` with a `replicas=` grid silently ran the grid's counts."""
    assert main(["search", SHARED, "--rate", "5", "--grid", grid, *flags, "--slo-ttft-ms", "500"]) == 2
    one_line_error(capsys, said)
