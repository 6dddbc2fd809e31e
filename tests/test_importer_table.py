"""Importers are one declared table: every import result says its kind, merge joins files by
their kinds (never by their labels), a JSON document is parsed once, and text we do not read is
named as such (a log that is not vLLM's is not called a vLLM log)."""
import orjson
import pytest

from core.errors import TraceError
from core.trace import open_trace
from core.trace.imports import sniff
from core.trace.imports.imported import Imported
from core.trace.imports.merge import merge, role
from tests.conftest import DATA

RUN = DATA / "imports" / "vllm_telemetry" / "run2_poisson4_p192_o48"
KNOWN_KINDS = {(RUN / "vllm_bench_run2.json", "vllm-bench"), (RUN / "spans.otlp.jsonl", "otlp-spans"),
               (RUN / "otlp_bodies.jsonl", "otlp-spans"), (RUN / "server.log", "vllm-log"),
               (RUN / "kv_events.jsonl", "kv-events"), (RUN / "metrics_scrapes.jsonl", "metrics-scrapes")}


@pytest.mark.parametrize("path, kind", sorted(KNOWN_KINDS))
def test_every_import_result_says_its_kind(path, kind):
    imp = open_trace(path)
    assert isinstance(imp, Imported) and imp.kind == kind
    assert sniff.role_of(kind) in ("requests", "spans", "steps", "telemetry")


def test_every_bundled_tool_file_is_read_by_an_entry_of_the_table():
    kinds = set()
    for p in sorted((DATA / "imports").rglob("*")):
        if p.is_file() and p.suffix in (".json", ".jsonl", ".log", ".yaml"):
            try:
                imp = open_trace(p)
            except TraceError:
                continue
            if isinstance(imp, Imported):
                assert imp.kind in sniff.KINDS, p
                kinds.add(imp.kind)
    assert {"vllm-bench", "aiperf-records", "aiperf-raw", "aiperf-summary", "guidellm", "inference-perf-requests",
            "inference-perf-summary", "otlp-spans", "vllm-log", "kv-events", "metrics-scrapes"} <= kinds


def test_merge_joins_by_kind_not_by_label(tmp_path):
    """The spans file relabelled as anything still joins as spans (its kind says so), and a
    client file labelled "spans" still is the base."""
    names = ["vllm_bench_run2.json", "spans.otlp.jsonl", "server.log", "kv_events.jsonl"]
    parts = [open_trace(RUN / n) for n in names]
    want, report = merge(parts, names)
    parts[1].trace.meta["label"] = "client requests"
    parts[0].trace.meta["label"] = "engine spans"
    assert [role(p) for p in parts] == ["requests", "spans", "steps", "telemetry"]
    got, report2 = merge(parts, names)
    assert [r["role"] for r in report2] == [r["role"] for r in report]
    assert report2[0]["file"] == "vllm_bench_run2.json"
    assert got.request_extra == want.request_extra and got.steps.equals(want.steps)


def test_a_json_document_is_parsed_once(tmp_path, monkeypatch):
    """A foreign JSON document (guidellm's report, 1 MB+) goes through one full parse: the fast
    trace decoder refuses it before parsing (it has no schema key), and the importer gets the
    parsed document."""
    f = DATA / "imports" / "guidellm" / "concurrent4_p64_o32_n48" / "benchmarks.json"
    raw = f.read_bytes()
    whole = []
    real = orjson.loads

    def counting(b, *a):
        if isinstance(b, (bytes, bytearray, memoryview, str)) and len(b) >= len(raw) - 64:
            whole.append(len(b))
        return real(b, *a)
    monkeypatch.setattr(orjson, "loads", counting)
    from core.trace import jsoncodec, jsonstream

    class Top:      # the fast decoder's whole-document scan
        def decode(self, b):
            whole.append(("msgspec", len(b)))
            return jsoncodec.TOP_DECODER.__class__.decode(jsoncodec.TOP_DECODER, b)
    monkeypatch.setattr(jsonstream, "TOP_DECODER", Top())
    imp = open_trace(f)
    assert imp.kind == "guidellm" and len(whole) == 1, whole


def test_text_we_do_not_read_is_not_called_a_vllm_log(tmp_path):
    """Any log with INFO in it used to be reported as a vLLM log: now only vLLM's logger format
    is (without iteration lines, it is named as such); other text is named as not read."""
    other = tmp_path / "app.log"
    other.write_text("2026-12-01 10:00:00 INFO starting\n2026-12-01 10:00:01 INFO ready\n")
    with pytest.raises(TraceError) as e:
        open_trace(other)
    assert "not a format we read" in str(e.value) and "vLLM" not in str(e.value).split(";")[0]
    lines = [ln for ln in (RUN / "server.log").read_text().splitlines() if "Iteration(" not in ln]
    vllm = tmp_path / "vllm_no_steps.log"
    vllm.write_text("\n".join(lines) + "\n")
    with pytest.raises(TraceError, match="looks like a vLLM server log without iteration lines"):
        open_trace(vllm)
