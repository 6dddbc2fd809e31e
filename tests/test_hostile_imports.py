"""Other tools' files, damaged or hostile: each refusal is one line naming the file and what was
wrong (exit 2), never a traceback, a hang or unbounded memory. Built from the real bundled
files (data/imports), changed in one place."""
import base64
import json

import msgspec
import pytest

from tests.conftest import DATA
from tests.helpers import metrics_refused

IMPORTS = DATA / "imports"
RUN = IMPORTS / "vllm_telemetry" / "run2_poisson4_p192_o48"


refused = metrics_refused


def aiperf_lines():
    return (IMPORTS / "aiperf" / "aiperf_c4_p64_o32" / "profile_export.jsonl").read_text().splitlines()


def mutate_aiperf(k, fn):
    lines = aiperf_lines()
    rec = json.loads(lines[k])
    fn(rec)
    lines[k] = json.dumps(rec)
    return "\n".join(lines) + "\n"


AIPERF = {
    "negative ttft": (lambda r: r["metrics"]["time_to_first_token"].update(value=-3), "time_to_first_token"),
    "unit unknown": (lambda r: r["metrics"]["time_to_first_token"].update(unit="fortnights"), "unit"),
    "gaps not numbers": (lambda r: r["metrics"]["inter_chunk_latency"].update(value=["x"]), "inter_chunk_latency"),
    "start not ns": (lambda r: r["metadata"].update(request_start_ns="soon"), "request_start_ns"),
    "tokens huge": (lambda r: r["metrics"]["output_sequence_length"].update(value=10**12), "output_sequence_length"),
    "Infinity ttft": (lambda r: r["metrics"]["time_to_first_token"].update(value=1e400), "line 4"),
}


@pytest.mark.parametrize("case", sorted(AIPERF))
def test_damaged_aiperf_records(tmp_path, capsys, case):
    fn, field = AIPERF[case]
    p = tmp_path / "profile_export.jsonl"
    p.write_text(mutate_aiperf(3, fn))
    refused(capsys, p, "profile_export.jsonl", field)


def test_a_broken_json_line_is_named(tmp_path, capsys):
    lines = aiperf_lines()
    lines[5] = lines[5][:40]
    p = tmp_path / "profile_export.jsonl"
    p.write_text("\n".join(lines))
    refused(capsys, p, "line 6", "not valid JSON")


def test_damaged_guidellm_reports(tmp_path, capsys):
    doc = json.loads((IMPORTS / "guidellm" / "concurrent4_p64_o32_n48" / "benchmarks.json").read_text())
    doc["benchmarks"][0]["requests"]["successful"][2]["info"]["timings"]["first_token_iteration"] = -1
    p = tmp_path / "benchmarks.json"
    p.write_text(json.dumps(doc))
    refused(capsys, p, "benchmarks.json", "first_token_iteration")
    doc["benchmarks"] = []
    p.write_text(json.dumps(doc))
    refused(capsys, p, "no benchmarks")


def test_yaml_alias_bombs_are_refused(tmp_path, capsys):
    bomb = "metadata: {guidellm_version: x}\na: &a [x, x, x, x, x, x, x, x, x]\n" + "".join(
        f"{c}: &{c} [*{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}]\n"
        for p, c in zip("abcdefghijklmnop", "bcdefghijklmnopq"))
    p = tmp_path / "benchmarks.yaml"
    p.write_text(bomb)
    refused(capsys, p, "aliases")
    p.write_text("benchmarks: [unclosed\n")
    refused(capsys, p, "not valid YAML")


def test_damaged_inference_perf_reports(tmp_path, capsys):
    doc = json.loads((IMPORTS / "inference_perf" / "ip_conc2_n12_p128_o16" /
                      "per_request_lifecycle_metrics.json").read_text())
    doc[1]["info"]["response_metrics"]["output_token_times"] = ["later"]
    p = tmp_path / "per_request_lifecycle_metrics.json"
    p.write_text(json.dumps(doc))
    refused(capsys, p, "request 1", "output_token_times")
    doc[1]["start_time"] = None
    p.write_text(json.dumps(doc))
    refused(capsys, p, "start_time")


def kv_lines():
    return (RUN / "kv_events.jsonl").read_text().splitlines()


def with_frame(k, frame_no, data: bytes):
    lines = kv_lines()
    rec = json.loads(lines[k])
    rec["frames"][frame_no] = base64.b64encode(data).decode()
    lines[k] = json.dumps(rec)
    return "\n".join(lines)


@pytest.mark.parametrize("case,data,frame,field", [
    ("payload not msgpack", b"\xc1\xc1\xc1", 2, "not msgpack"),
    ("payload not a batch", msgspec.msgpack.encode({"hello": 1}), 2, "KVEventBatch"),
    ("unknown event", msgspec.msgpack.encode([1.0, [{"type": "BlockExploded"}], 0]), 2, "unknown event"),
    ("hash not a number", msgspec.msgpack.encode([1.0, [{"type": "BlockRemoved", "block_hashes": ["x"]}], 0]), 2,
     "block hash"),
    ("hash a boolean", msgspec.msgpack.encode([1.0, [{"type": "BlockRemoved", "block_hashes": [True]}], 0]), 2,
     "block hash"),
    ("seq not 8 bytes", b"\x01", 1, "seq"),
])
def test_damaged_kv_event_captures(tmp_path, capsys, case, data, frame, field):
    p = tmp_path / "kv_events.jsonl"
    p.write_text(with_frame(4, frame, data))
    refused(capsys, p, "kv_events.jsonl", "line 5", field)


def test_damaged_spans(tmp_path, capsys):
    lines = (RUN / "spans.otlp.jsonl").read_text().splitlines()
    doc = json.loads(lines[0])
    sp = doc["resourceSpans"][0]["scopeSpans"][0]["spans"][0]
    sp["name"] = "llm_request"
    sp["startTimeUnixNano"] = "yesterday"
    p = tmp_path / "spans.otlp.jsonl"
    p.write_text(json.dumps(doc) + "\n" + "\n".join(lines[1:]))
    refused(capsys, p, "startTimeUnixNano")
    bodies = (RUN / "otlp_bodies.jsonl").read_text().splitlines()
    rec = json.loads(bodies[0])
    rec["body_b64"] = base64.b64encode(b"\x0a\xff\xff\xff\xff\x0f garbage").decode()
    p = tmp_path / "otlp_bodies.jsonl"
    p.write_text(json.dumps(rec) + "\n")
    refused(capsys, p, "OTLP protobuf body")


def test_an_iteration_log_that_only_mentions_iterations(tmp_path, capsys):
    p = tmp_path / "server.log"
    p.write_text("INFO 12-01 10:00:00 [x.py:1] vllm started\nIteration(3) of nothing\n")
    refused(capsys, p, "server.log", "without iteration lines", "--enable-logging-iteration-details")


@pytest.mark.slow    # seconds: inflating 2 GiB to refuse it
def test_a_gzip_bomb_is_refused_holding_nothing(tmp_path):
    """2.5 GiB of zeros in 2.4 MB of gzip (its size field, mod 2**32, says 512 MiB): refused in one
    line while the process may hold at most 1.5 GiB of address space beyond Python's own."""
    import subprocess
    import sys
    import zlib
    c = zlib.compressobj(1, zlib.DEFLATED, 31)
    zero = b"\0" * (1 << 26)
    with open(tmp_path / "bomb.json.gz", "wb") as f:
        for _ in range(40):
            f.write(c.compress(zero))
        f.write(c.flush())
    code = ("import resource, sys; resource.setrlimit(resource.RLIMIT_AS, (3 << 30, 3 << 30)); "
            "from core.__main__ import main; sys.exit(main(['metrics', sys.argv[1]]))")
    r = subprocess.run([sys.executable, "-c", code, str(tmp_path / "bomb.json.gz")], capture_output=True,
                       text=True, timeout=120, cwd=str(DATA.parent))
    assert r.returncode == 2, r.stderr[-2000:]
    assert "inflates to more than 2 GiB" in r.stderr and r.stderr.count("\n") == 1


@pytest.mark.parametrize("spans", [8_000_000, 30_000_000])
def test_a_small_gzip_of_millions_of_empty_spans_is_refused_before_it_is_parsed(spans):
    """Issue 48 item 19: a 78 KB OTLP JSON-lines file of 30,000,000 spans cost 7.5 GB and 61 s before
    its refusal (20 KB / 8 M spans: 2.1 GB, 14 s). The objects are counted on the raw bytes first;
    the refusal holds no parsed value (peak traced memory stays near the inflated text's size)."""
    import gzip
    import tracemalloc

    from core.errors import TraceError
    from core.trace import open_trace
    body = b'{"resourceSpans":[{"scopeSpans":[{"spans":[' + b"{}," * spans + b'{}]}]}]}\n'
    data = gzip.compress(body, 9)
    del body
    tracemalloc.start()
    try:
        with pytest.raises(TraceError, match=r"spans\.jsonl\.gz: [\d,]+ JSON objects and arrays or more"):
            open_trace(data, "spans.jsonl.gz")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 4 * (3 * spans + 64)       # the inflated text (and its pieces), never the parsed spans
