"""Trace format: round trips, JSON Schema conformance, and clear errors for bad input."""
import copy
import gzip
import json

import jsonschema
import pytest

from core.analysis.metrics import summarize
from core.errors import TraceError
from core.trace import load_trace, parse_trace, save_trace, to_doc, trace_from_doc
from tests.conftest import DATA
from tests.helpers import minimal, sim_trace

SCHEMA = json.loads((DATA / "schema" / "serving-trace-1.json").read_text())


@pytest.mark.slow
@pytest.mark.parametrize("path", sorted((DATA / "traces").glob("*.json*")), ids=lambda p: p.name)
def test_bundled_traces_match_schema_and_load(path):
    raw = path.read_bytes()
    doc = json.loads(gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw)
    jsonschema.validate(doc, SCHEMA)
    load_trace(path)


def test_simulated_trace_matches_schema_and_round_trips(tmp_path):
    tr = sim_trace(kv_blocks=70)
    assert {"token", "finish", "step", "kv", "preempt"} <= tr.event_types()
    doc = to_doc(tr)
    jsonschema.validate(doc, SCHEMA)
    for name in ("t.json", "t.json.gz"):
        save_trace(tr, tmp_path / name)
        back = load_trace(tmp_path / name)
        assert to_doc(back) == doc
        assert summarize(back) == summarize(tr)
    assert (tmp_path / "t.json.gz").read_bytes()[:2] == b"\x1f\x8b"


def test_hand_written_minimal_trace_loads():
    tr = trace_from_doc(minimal())
    assert tr.ids == ["A"] and len(tr.tokens) == 2
    jsonschema.validate(minimal(), SCHEMA)


def test_unknown_fields_and_event_types_are_kept():
    doc = minimal()
    doc["meta"]["custom"] = 1
    doc["requests"][0]["note"] = "x"
    doc["events"].append({"t_ms": 5, "type": "my_marker", "payload": [1, 2]})
    doc["extra_top"] = {"k": 1}
    back = to_doc(trace_from_doc(doc))
    assert back["meta"]["custom"] == 1 and back["requests"][0]["note"] == "x"
    assert {"t_ms": 5, "type": "my_marker", "payload": [1, 2]} in back["events"]
    assert back["extra_top"] == {"k": 1}


def mutate(fn):
    doc = minimal()
    fn(doc)
    return doc


BAD = [
    ("not an object", lambda d: d.clear() or d.update({"x": 1}), "schema: missing"),
    ("future version", lambda d: d.update(schema="serving-trace/2"), "unknown version 'serving-trace/2'"),
    ("bad source", lambda d: d["meta"].update(source="guessed"), "meta.source"),
    ("requests not list", lambda d: d.update(requests={}), "requests: expected a list"),
    ("missing arrival", lambda d: d["requests"][0].pop("arrival_ms"), "requests[0].arrival_ms"),
    ("negative arrival", lambda d: d["requests"][0].update(arrival_ms=-1), "requests[0].arrival_ms"),
    ("string tokens", lambda d: d["requests"][0].update(prompt_tokens="4"), "requests[0].prompt_tokens"),
    ("duplicate id", lambda d: d["requests"].append(dict(d["requests"][0])), "duplicate request id 'A'"),
    ("unknown req", lambda d: d["events"][0].update(req="Z"), "events[0] (token): req 'Z' is not in requests"),
    ("bad time", lambda d: d["events"][1].update(t_ms="soon"), "events[1] (token).t_ms"),
    ("negative time", lambda d: d["events"][1].update(t_ms=-3), "events[1] (token).t_ms"),
    ("decreasing", lambda d: d["events"][1].update(t_ms=5), "earlier than token 0"),
    ("before arrival", lambda d: d["requests"][0].update(arrival_ms=15), "before its arrival"),
    ("duplicate index", lambda d: d["events"][1].update(index=0), "appears twice"),
    ("gap in indices", lambda d: d["events"][1].update(index=5), "without gaps"),
    ("too many tokens", lambda d: d["requests"][0].update(max_output_tokens=1), "more than its max_output_tokens 1"),
    ("missing index", lambda d: d["events"][0].pop("index"), "events[0] (token).index"),
    ("event not object", lambda d: d["events"].insert(0, 7), "events[0]: expected an object"),
    ("finish before token", lambda d: d["events"][2].update(t_ms=15), "before its last token"),
    ("bad kv op", lambda d: d["events"].append({"t_ms": 1, "type": "kv", "op": "steal", "block": 0}), "(kv).op"),
]


@pytest.mark.parametrize("name,fn,msg", BAD, ids=[b[0] for b in BAD])
def test_bad_traces_get_one_clear_error(name, fn, msg):
    with pytest.raises(TraceError) as e:
        trace_from_doc(mutate(fn), "upload.json")
    assert msg in str(e.value)
    assert str(e.value).startswith("upload.json: ")


def test_error_counts_further_problems():
    doc = minimal()
    doc["events"][0]["req"] = "Z"
    doc["events"][1]["req"] = "Y"
    doc["events"][2]["req"] = "X"
    with pytest.raises(TraceError, match=r"events\[0\].*\(and 2 more problems\)"):
        trace_from_doc(doc, "t")


@pytest.mark.parametrize("data,msg", [
    (b"", "empty"), (b"{not json", "not valid JSON"), (b"\x1f\x8b\x08\x00garbage", "broken gzip"),
    (b'{"schema": "serving-trace/1", "meta": {"source": "given"}, "requests": [], "events": [], "x": NaN}',
     "NaN is not allowed"),
    (b"\xff\xfe\x00", "not UTF-8"), (b"[1, 2]", "expected a JSON object"),
])
def test_bad_bytes(data, msg):
    with pytest.raises(TraceError, match=msg):
        parse_trace(data, "f.json")


def test_truncated_gzip():
    raw = gzip.compress(json.dumps(minimal()).encode())
    with pytest.raises(TraceError, match="gzip"):
        parse_trace(raw[: len(raw) // 2], "t.json.gz")


def test_missing_file():
    with pytest.raises(TraceError, match="no such file"):
        load_trace(DATA / "nope.json")


def test_workload_of_a_trace_roundtrips_prompt_ids():
    tr = load_trace(DATA / "traces" / "chapter31_continuous.json")
    w = tr.workload()
    assert [r.prompt_ids for r in w.requests] == [(10, 11, 12, 13), (10, 11, 12, 14), (20, 21)]
    assert [r.max_output_tokens for r in w.requests] == [3, 2, 1]


def test_steps_batch_and_kv_survive_json():
    tr = sim_trace()
    back = trace_from_doc(copy.deepcopy(to_doc(tr)))
    assert back.batch.groupby("step")["tokens"].sum().tolist() == tr.batch.groupby("step")["tokens"].sum().tolist()
    assert sorted(back.kv["op"].tolist()) == sorted(tr.kv["op"].tolist())
    counts = {k: v for k, v in back.kv["op"].value_counts().to_dict().items() if v}
    assert counts == {k.removeprefix("kv_"): v for k, v in tr.meta["stats"].items()
                      if k.startswith("kv_") and k != "kv_blocks" and v}


# ---- one declaration: everything derived from core/trace/schema.py is up to date -------------

def test_committed_json_schema_is_the_generated_one():
    from core.trace.schema import json_schema_text
    assert (DATA / "schema" / "serving-trace-1.json").read_text() == json_schema_text(), \
        "run: python -m core.trace --write"


def test_docs_field_tables_are_up_to_date():
    from core.trace.schema import DOC_FILE, docs_with_tables
    text = DOC_FILE.read_text()
    assert docs_with_tables(text) == text, "run: python -m core.trace --write"


def test_written_fields_are_declared():
    from core.trace.schema import BATCH, EVENTS
    declared = {r.type: {"t_ms", "type"} | {f.name for f in r.json_fields} for r in EVENTS}
    tr = sim_trace(kv_blocks=70)
    for e in to_doc(tr)["events"]:
        assert set(e) <= declared[e["type"]], e
        for item in e.get("batch", []):
            assert set(item) == {f.name for f in BATCH.json_fields}


def test_workload_does_not_import_trace():
    import subprocess
    import sys
    code = "import sys, core.workload; assert not [m for m in sys.modules if m.startswith('core.trace')]"
    assert subprocess.run([sys.executable, "-c", code], cwd=DATA.parent).returncode == 0


@pytest.mark.parametrize("path", sorted((DATA / "traces").glob("*.json*")), ids=lambda p: p.name)
def test_a_trace_read_as_a_workload_is_its_workload(path):
    from core.workload import parse_workload
    row = lambda r: (r.id, r.arrival_ms, r.prompt_tokens, r.max_output_tokens, r.prompt_ids, r.tenant, r.abort_at_ms)
    w = load_trace(path).workload()
    assert list(map(row, parse_workload(path.read_bytes(), path.name).requests)) == list(map(row, w.requests))
