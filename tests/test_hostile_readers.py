"""Hostile input to the readers (issue 36, items 10, 13, 17, 18, 19, 24): each refusal is one line
naming the file and what was wrong (exit 2), never a traceback, a hang or unbounded memory; the
numbers a refusal states (a byte offset, a nesting depth, a token count) are computed here from
the bytes the test wrote."""
import base64
import gzip
import json

import pytest

from core.__main__ import main
from tests.conftest import ROOT
from tests.helpers import metrics_refused, minimal

refused = metrics_refused


# ---- item 13: a byte that is not UTF-8 ------------------------------------------------------------

LATIN1 = {"request id": (b'"id": "A"', b'"id": "A\xe9"'),
          "meta value": (b'"source": "given"', b'"source": "given", "note": "caf\xe9"'),
          "meta key": (b'"source": "given"', b'"source": "given", "caf\xe9": 1'),
          "event req": (b'"type": "token", "req": "A"', b'"type": "token", "req": "A\xe9"'),
          "key after the events": (b'"reason": "length"}]', b'"reason": "length"}], "caf\xe9": 1')}


@pytest.mark.parametrize("where", sorted(LATIN1))
@pytest.mark.parametrize("gz", [False, True])
def test_a_latin1_byte_is_named_with_its_offset(tmp_path, capsys, where, gz):
    old, new = LATIN1[where]
    text = json.dumps(minimal()).encode()
    assert old in text
    data = text.replace(old, new, 1)
    offset = data.index(b"\xe9")                   # where the byte is, in the (inflated) text
    p = tmp_path / ("t.json.gz" if gz else "t.json")
    p.write_bytes(gzip.compress(data) if gz else data)
    refused(capsys, p, p.name, "not UTF-8", f"byte {offset})")


# ---- item 17: JSON nested past what the parsers read ---------------------------------------------

def test_json_nested_too_deep_names_the_file_and_the_depth(tmp_path, capsys):
    n = 100_000
    deep = "[" * n + "]" * n
    doc = json.dumps(minimal())
    cases = {"trace.json": (doc.replace('"source": "given"', f'"source": "given", "x": {deep}'), n + 2),
             "events.json": (doc.replace('"events": [', f'"events": [{deep}, '), n + 2),
             "lines.jsonl": ('{"a": 1}\n{"b": ' + deep + "}\n", n + 1)}
    for name, (text, depth) in cases.items():
        p = tmp_path / name
        p.write_text(text)
        refused(capsys, p, name, f"nested too deeply ({depth:,} levels", "1,024")
    # a recorded OTLP/HTTP export whose JSON body nests 100,000 deep (what `observe --otlp-port` keeps)
    body = ('{"a":' * n + "1" + "}" * n).encode()
    p = tmp_path / "otlp_bodies.jsonl"
    p.write_text(json.dumps({"recv_ns": 1, "content_type": "application/json",
                             "body_b64": base64.b64encode(body).decode()}) + "\n")
    refused(capsys, p, "otlp_bodies.jsonl: line 1", f"nested too deeply ({n:,} levels")


# ---- item 24: messages that name the field -------------------------------------------------------

def test_a_token_id_past_int64_is_refused_before_the_prefix_cache_hashes_it(tmp_path, capsys):
    from core.errors import WorkloadError
    from core.workload import Request
    for bad, at in ((2**63, 3), (2**64 + 5, 3), (-1, 3), (1.5, 3)):
        with pytest.raises(WorkloadError, match=rf"request 'a': prompt_ids\[{at}\]: expected a token id"):
            Request("a", 0.0, 4, 1, prompt_ids=[1, 2, 3, bad])
    Request("a", 0.0, 2, 1, prompt_ids=[0, 2**63 - 1])                # the largest int64 is a token id
    w = {"requests": [{"id": r, "arrival_ms": k, "prompt_tokens": 4, "output_tokens": 2,
                       "prompt_ids": [1, 2, 3, 2**63]} for k, r in enumerate("ab")]}
    p = tmp_path / "w.json"
    p.write_text(json.dumps(w))
    rc = main(["simulate", str(p), "--prefix-caching", "--block-size", "2", "--out", str(tmp_path / "o.json")])
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1 and "w.json: requests[0].prompt_ids[3]" in err, err
    assert not (tmp_path / "o.json").exists()


def test_a_kv_batch_number_past_int64_is_named(tmp_path, capsys):
    import msgspec
    payload = msgspec.msgpack.encode([1.0, [{"type": "BlockRemoved", "block_hashes": [5]}], 0])
    line = {"recv_ns": 1, "frames": [base64.b64encode(x).decode() for x in
                                     (b"kv", (2**63).to_bytes(8, "big"), payload)]}
    p = tmp_path / "kv_events.jsonl"
    p.write_text(json.dumps(line) + "\n")
    refused(capsys, p, "kv_events.jsonl: line 1: seq", str(2**63))
    assert "unexpected shape" not in capsys.readouterr().err


def test_aiperf_scrapes_with_string_timestamps_and_duplicate_request_ids(tmp_path, capsys):
    from tests.conftest import DATA
    run = DATA / "imports" / "aiperf" / "aiperf_n24_c2_p128_o16"
    lines = [json.loads(x) for x in (run / "server_metrics_export.jsonl").read_text().splitlines()]
    for x in lines:
        x["timestamp_ns"] = str(x["timestamp_ns"])
    p = tmp_path / "server_metrics_export.jsonl"
    p.write_text("\n".join(map(json.dumps, lines)) + "\n")
    err = refused(capsys, p, "server_metrics_export.jsonl: line 1: timestamp_ns", repr(lines[0]["timestamp_ns"]))
    assert "min()" not in err and "unexpected shape" not in err
    recs = [json.loads(x) for x in (run / "profile_export.jsonl").read_text().splitlines()]
    recs[3]["metadata"]["x_request_id"] = rid = recs[0]["metadata"]["x_request_id"]
    p = tmp_path / "profile_export.jsonl"
    p.write_text("\n".join(map(json.dumps, recs)) + "\n")
    err = refused(capsys, p, "profile_export.jsonl: metadata.x_request_id", rid, "record 1 and record 4")
    assert "unexpected shape" not in err


# ---- item 18: small files that cost gigabytes ----------------------------------------------------

def test_a_small_vllm_result_claiming_a_billion_token_rows_is_refused_before_allocating(tmp_path, capsys):
    """490 bytes claiming 10 x 10,000,000 output tokens (each a 41-byte row of the token table:
    3.8 GiB) used to be built at ~6.5 GB: the cap counts the bytes of the rows."""
    res = {"ttfts": [0.1] * 10, "itls": [[]] * 10, "output_lens": [10_000_000] * 10, "input_lens": [1] * 10,
           "start_times": list(range(10)), "duration": 10, "completed": 10}
    p = tmp_path / "v.json"
    p.write_text(json.dumps(res))
    assert p.stat().st_size < 500
    rows_gib = 100_000_000 * (8 + 8 + 8 + 8 + 8 + 1) / 2**30      # t_ms, req, index, token_id, replica, source
    refused(capsys, p, "v.json: output_lens: 100,000,000 output tokens", f"{rows_gib:.1f} GiB of token rows", "1 GiB")


def test_imported_token_rows_are_built_within_a_third_more_than_they_keep(tmp_path):
    import tracemalloc

    from core.trace import open_trace
    n = 2_000_000
    res = {"ttfts": [0.1] * 4, "itls": [[0.001] * 9] * 4, "output_lens": [n] * 4, "input_lens": [1] * 4,
           "start_times": [0, 1, 2, 3], "duration": 10, "completed": 4}
    p = tmp_path / "v.json"
    p.write_text(json.dumps(res))
    tracemalloc.start()
    try:
        imp = open_trace(p)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    kept = int(imp.trace.tokens.memory_usage(index=False, deep=True).sum())
    assert len(imp.trace.tokens) == 4 * n and kept >= 4 * n * 33
    assert peak < 1.35 * kept, (peak, kept)


def _alias_bomb(levels: int, where: str) -> str:
    """A guidellm-looking report whose `where` is an alias standing for 3**levels leaves
    (3 * levels - 2 aliases: under the alias cap)."""
    lines = ["metadata: {guidellm_version: x}", "a0: &a0 [x, x, x]"]
    lines += [f"a{i}: &a{i} [*a{i - 1}, *a{i - 1}, *a{i - 1}]" for i in range(1, levels)]
    lines.append("benchmarks: [{requests: {successful: [{" + f"{where}: *a{levels - 1}"
                 + ", info: {timings: {request_start: 1}}}]}}]")
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize("where", ["prompt_tokens", "request_id"])
def test_a_kilobyte_of_yaml_describing_3_to_the_30_leaves_is_refused_by_its_expanded_size(tmp_path, capsys, where):
    p = tmp_path / "benchmarks.yaml"
    p.write_text(_alias_bomb(30, where))
    assert p.stat().st_size < 1000 and p.read_text().count("*") == 88
    # values once expanded, line by line: the top mapping, line 1's 4, then each a_i's key, list and items
    total, size, line = 1 + 4, 4, 2
    total += 1 + size
    while total <= 10_000_000:
        line += 1
        size = 1 + 3 * size
        total += 1 + size
    err = refused(capsys, p, "benchmarks.yaml: YAML whose aliases expand it past 10,000,000 values", f"(line {line})")
    assert len(err) < 200
    if where == "prompt_tokens":
        p.write_text(_alias_bomb(8, where))               # 3**8 leaves: read, and the field's problem named
        err = refused(capsys, p, "benchmarks.yaml", where, "[[[[[[[")
        assert len(err) < 300, err                       # the value is not written out whole


def test_yaml_nested_deeper_than_a_thousand_levels_is_refused_at_the_thousand_and_first(tmp_path):
    """Flow YAML nested 100,000 deep crashed the process (libyaml's composer recursing: a segfault);
    1,001 deep is refused at its event, before any value is built. Run in a subprocess: the old code
    took the test runner down with it."""
    import subprocess
    import sys
    for depth, want in ((100_000, "nested more than 1,000 levels deep (line 1)"),
                        (1_001, "nested more than 1,000 levels deep (line 1)"),
                        (999, "not a format we read")):        # 1,000 levels with the top mapping: read
        p = tmp_path / f"d{depth}.yaml"
        p.write_text("a: " + "[" * depth + "]" * depth + "\n")
        r = subprocess.run([sys.executable, "-m", "core", "metrics", str(p)], capture_output=True, text=True,
                           timeout=120, cwd=str(ROOT))
        assert r.returncode == 2 and r.stderr.count("\n") == 1 and want in r.stderr, (depth, r.returncode, r.stderr)
    p = tmp_path / "self.yaml"
    p.write_text("benchmarks: &a [*a]\n")
    r = subprocess.run([sys.executable, "-m", "core", "metrics", str(p)], capture_output=True, text=True, timeout=120,
                       cwd=str(ROOT))
    assert r.returncode == 2 and "alias *a inside its own anchor (line 1)" in r.stderr, r.stderr


def test_a_value_in_a_message_is_written_only_as_far_as_shown():
    from core.errors import short
    values = [1, -5, 2**70, 1.5, None, True, "abc", "x" * 100, "it's", 'say "hi"', [1, 2, 3], [], (), (1,), (1, 2),
              {}, {"a": [1, {"b": (2,)}]}, set(), {1, 2}, frozenset(), frozenset({3}), [[[]]], b"raw",
              list(range(100)), {f"k{i}": i for i in range(50)}, [["x" * 60]], {1: "x" * 100}]
    for v in values:
        for limit in (5, 10, 40, 80):
            r = repr(v)
            assert short(v, limit) == (r if len(r) <= limit else r[:limit - 3] + "..."), (v, limit)
    shared = [1, 1, 1]
    for _ in range(40):                                  # 3**40 leaves, 41 list objects
        shared = [shared, shared, shared]
    assert short(shared) == "[" * 37 + "..."
    assert short(10**5000) == "<an integer of 16,610 bits>"


# ---- item 19: non-finite numbers never reach JSON output ------------------------------------------

def test_an_iteration_log_with_an_infinite_step_is_refused(tmp_path, capsys):
    """'iteration elapsed time: 1e400 ms' parsed to inf: 784 steps over nan s, and `metrics --json`
    failed with "Out of range float values are not JSON compliant" (a traceback)."""
    import re

    from tests.conftest import DATA
    log = (DATA / "imports" / "vllm_telemetry" / "run1_c4_p128_o32" / "server.log").read_text()
    bad, n = re.subn(r"iteration elapsed time: [0-9.]+ ms", "iteration elapsed time: 1e400 ms", log, count=1)
    assert n == 1
    p = tmp_path / "server.log"
    p.write_text(bad)
    import warnings
    with warnings.catch_warnings(record=True) as warned:   # a warning would be more lines on stderr
        warnings.simplefilter("always")
        refused(capsys, p, "server.log: step records", argv=("--json",))
    assert not warned, [str(w.message) for w in warned]


def test_a_result_with_an_unbounded_request_rate_keeps_it_as_text_in_json(capsys):
    """SGLang's bench_serving writes an unbounded request rate as Infinity (a bundled real file):
    `metrics --json` failed on it; the file's own numbers now keep it by its name."""
    from tests.conftest import DATA
    f = DATA / "imports" / "sglang" / "sglang_c4_p64_o32_n24" / "sglang_bench.jsonl"
    assert "Infinity" in f.read_text()
    assert main(["metrics", str(f), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)          # strict JSON: no bare Infinity
    assert out["file_summary"]["request_rate"] == "inf"
    assert out["summary"]["requests"] == 24


# ---- item 19: out of core, the in-memory reader's checks -----------------------------------------

def _serial_table():
    import pyarrow as pa
    import pyarrow.parquet as pq

    from core.trace import load_trace
    from core.trace.parquet import to_parquet_bytes
    from tests.conftest import DATA
    return pq.read_table(pa.BufferReader(to_parquet_bytes(load_trace(DATA / "traces" / "chapter31_serial.json"))))


def _with_column(t, column, fn):
    """`t` with `column`'s values changed by fn(rtypes, values) (a list of the same length)."""
    import pyarrow as pa
    values = fn(t.column("rtype").to_pylist(), t.column(column).to_pylist())
    return t.set_column(t.column_names.index(column), column, pa.array(values, t.schema.field(column).type))


def _first(kind, value, nth=0):
    def fn(rt, v):
        v = list(v)
        v[[i for i, r in enumerate(rt) if r == kind][nth]] = value
        return v
    return fn


def _head_of(t, edit):
    head = json.loads(t.schema.metadata[b"serving-trace"])
    return t.replace_schema_metadata({b"serving-trace": json.dumps(edit(head)).encode()})


def _add_other(t, value):
    import pyarrow as pa
    row = {c: [None] for c in t.column_names} | {"rtype": ["other"], "t_ms": [1.0], "json": [value]}
    return pa.concat_tables([t, pa.table(row, schema=t.schema)])


OUT_OF_CORE = {
    "head a list": lambda t: t.replace_schema_metadata({b"serving-trace": b"[1, 2]"}),
    "meta a string": lambda t: _head_of(t, lambda h: {**h, "meta": "a string"}),
    "meta source unknown": lambda t: _head_of(t, lambda h: {**h, "meta": {"source": "dreamed"}}),
    "arrivals at -1e9": lambda t: _with_column(t, "t_ms", lambda rt, v: [-1e9 if r == "request" else x
                                                                          for r, x in zip(rt, v)]),
    "a token at NaN": lambda t: _with_column(t, "t_ms", _first("token", float("nan"))),
    "a req past the requests": lambda t: _with_column(t, "req", _first("token", 7)),
    "a negative token index": lambda t: _with_column(t, "index", _first("token", -3)),
    "a token index out of order": lambda t: _with_column(t, "index", _first("token", 5)),
    "a token before its arrival": lambda t: _with_column(t, "t_ms", _first("token", 0.5, 2)),
    "two finishes": lambda t: _with_column(t, "req", _first("finish", 0, 1)),
    "a duplicate request id": lambda t: _with_column(t, "id", _first("request", "A", 2)),
    "an unknown record type": lambda t: _with_column(t, "rtype", _first("finish", "mystery")),
    "request json a list": lambda t: _with_column(t, "json", _first("request", "[1]")),
    "request json shadows a column": lambda t: _with_column(t, "json", _first("request", '{"id": "Z"}', 1)),
    "a spec event for nobody": lambda t: _add_other(t, '{"t_ms": 1.0, "type": "spec", "req": "nobody"}'),
    "a token event among the others": lambda t: _add_other(t, '{"t_ms": 1.0, "type": "token", "req": "A"}'),
}


@pytest.mark.parametrize("case", sorted(OUT_OF_CORE))
def test_out_of_core_refuses_what_the_in_memory_reader_refuses_in_its_words(tmp_path, capsys, case):
    """Crafted Parquet traces the in-memory reader refuses in one line ended out of core in a traceback
    (a head that is a list, a meta that is a string) or in numbers (arrivals at -1e9: a TTFT mean of
    1,000,004,601 ms): out of core, the same line."""
    import pyarrow.parquet as pq
    p = tmp_path / "t.parquet"
    pq.write_table(OUT_OF_CORE[case](_serial_table()), p)
    want = refused(capsys, p)                                    # the in-memory reader's line
    assert refused(capsys, p, argv=("--out-of-core",)) == want
    assert refused(capsys, p, argv=("--out-of-core", "--json")) == want


def test_out_of_core_checks_parts_of_one_trace_across_parts(tmp_path, capsys):
    """A directory of parts: a request id repeated in another part, and a part of another trace."""
    import pyarrow.parquet as pq
    t = _serial_table()
    d = tmp_path / "parts"
    d.mkdir()
    pq.write_table(t.slice(0, 2), d / "part-00000.parquet")       # requests A, B
    bad = _with_column(t, "id", _first("request", "A", 2))         # ... and C renamed A
    pq.write_table(bad.slice(2), d / "part-00001.parquet")
    want = refused(capsys, d)
    assert "request records: id" in want
    assert refused(capsys, d, argv=("--out-of-core",)) == want
    pq.write_table(_head_of(t, lambda h: {**h, "meta": {"source": "given", "label": "other"}}).slice(2),
                   d / "part-00001.parquet")
    want = refused(capsys, d, "a part of a different trace")
    assert refused(capsys, d, argv=("--out-of-core",)) == want


def test_a_result_with_a_value_nested_as_deep_as_json_allows_is_read(tmp_path, capsys):
    """The non-finite check walks a file's values without recursing: a model_id nested 900 deep (as deep
    as Python's json, which reads a file with 1e400 in it, recurses), holding 1e400 at the bottom, is read
    and its number kept by name (the walk recursed past Python's limit: a traceback)."""
    from tests.conftest import DATA
    text = (DATA / "imports" / "vllm_example_result.json").read_text().rstrip()
    assert text.endswith("}")
    p = tmp_path / "r.json"
    p.write_text(text[:-1] + ', "model_id": ' + "[" * 900 + "1e400" + "]" * 900 + "}")
    assert main(["metrics", str(p), "--json"]) == 0, capsys.readouterr().err
    out = json.loads(capsys.readouterr().out)
    assert out["summary"]["requests"] > 0
