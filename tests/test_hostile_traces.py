"""Hostile inputs (GitHub issue 10): every one is refused with one line naming the file and
the field (CLI: exit code 2), or read correctly; never a traceback, never a huge allocation.
Inputs are built at test time from the small bundled chapter31_serial.json."""
import copy
import gzip
import json
import re

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from core import errors
from core.__main__ import main
from core.errors import TraceError, WorkloadError
from core.trace import load_trace, open_trace, parse_trace
from core.trace.parquet import to_parquet_bytes
from core.workload import MAX_TIME_MS, parse_workload
from tests.conftest import DATA

SERIAL = DATA / "traces" / "chapter31_serial.json"
DOC = json.loads(SERIAL.read_text())


def doc(edit=None) -> dict:
    d = copy.deepcopy(DOC)
    if edit:
        edit(d)
    return d


def write(tmp_path, name: str, content) -> str:
    p = tmp_path / name
    if isinstance(content, (dict, list)):
        content = json.dumps(content)
    p.write_bytes(content if isinstance(content, bytes) else content.encode())
    return str(p)


def cli(capsys, *args):
    rc = main([str(a) for a in args])
    out, err = capsys.readouterr()
    return rc, out, err


def refused(capsys, *args, names=()):
    rc, _, err = cli(capsys, *args)
    assert rc == 2, err
    assert err.startswith("error: ") and err.count("\n") == 1, err
    for n in names:
        assert n in err, err
    return err


# ---- 1. integers beyond int64 --------------------------------------------------------------

def _event(typ, **fields):
    return {"t_ms": 50.0, "type": typ} | fields


BIG = 2**63 + 5
HUGE_INTS = [
    ("events[0] (token).index", lambda d: d["events"][0].update(index=BIG)),
    ("events[0] (token).token_id", lambda d: d["events"][0].update(token_id=BIG)),
    ("requests[0].max_output_tokens", lambda d: d["requests"][0].update(max_output_tokens=BIG)),
    ("requests[1].prompt_tokens", lambda d: d["requests"][1].update(prompt_tokens=2**70)),
    ("events[0] (kv).block", lambda d: d["events"].insert(0, _event("kv", op="alloc", block=BIG, ref=1))),
    ("events[0] (kv).ref", lambda d: d["events"].insert(0, _event("kv", op="alloc", block=1, ref=BIG))),
    ("events[0] (step).step", lambda d: d["events"].insert(0, _event("step", step=BIG))),
    ("events[0] (step).running", lambda d: d["events"].insert(0, _event("step", step=0, running=BIG))),
]


@pytest.mark.parametrize("where,edit", HUGE_INTS, ids=[w for w, _ in HUGE_INTS])
def test_integer_beyond_int64_is_a_trace_error_naming_the_field(tmp_path, capsys, where, edit):
    path = write(tmp_path, "big.json", doc(edit))
    err = refused(capsys, "metrics", path, "--json", names=("big.json", where))
    assert "2**63" in err
    with pytest.raises(TraceError, match=re.escape(f"big.json: {where}")):
        load_trace(path)


def test_integer_beyond_int64_in_parquet_is_a_trace_error(tmp_path, capsys):
    t = pq.read_table(pa.BufferReader(to_parquet_bytes(load_trace(SERIAL))))
    i = t.column_names.index("index")
    t = t.set_column(i, "index", pa.array([2**64 - 1] * len(t), pa.uint64()))  # no int64 column holds it
    buf = pa.BufferOutputStream()
    pq.write_table(t, buf)
    path = write(tmp_path, "big.parquet", buf.getvalue().to_pybytes())
    refused(capsys, "metrics", path, names=("big.parquet", "index"))


@pytest.mark.parametrize("column", [
    lambda n: pa.array([f"x{k}" for k in range(n)], pa.string()),          # text, not numbers
    lambda n: pa.array([[k] for k in range(n)], pa.list_(pa.int64())),     # lists: no cast at all
])
def test_a_parquet_column_of_the_wrong_type_is_named(tmp_path, capsys, column):
    edit = lambda t: t.set_column(t.column_names.index("index"), "index", column(len(t)))
    refused(capsys, "metrics", _parquet_with(tmp_path, "w.parquet", edit), names=("w.parquet", "column index"))


# ---- 2. a request without its finish event -------------------------------------------------

def test_request_without_finish_is_reported_unfinished(tmp_path, capsys):
    d = doc(lambda d: d.update(events=[e for e in d["events"] if (e["type"], e["req"]) != ("finish", "C")]))
    rc, out, err = cli(capsys, "metrics", write(tmp_path, "cut.json", d), "--json")
    assert rc == 0, err
    m = json.loads(out)
    reasons = {r["id"]: r["finish_reason"] for r in m["requests"]}
    assert reasons == {"A": "length", "B": "length", "C": None}
    assert m["summary"]["unfinished"] == 1
    assert any("no finish event" in n for n in m["summary"]["notes"])
    assert json.loads(cli(capsys, "metrics", SERIAL, "--json")[1])["summary"]["unfinished"] == 0


# ---- 3. times beyond MAX_TIME_MS -------------------------------------------------------------

@pytest.mark.parametrize("cmd", [("metrics", "--json"), ("export", "--chrome", "OUT")])
def test_time_beyond_bound_is_refused(tmp_path, capsys, cmd):
    def edit(d):
        for e in d["events"][-2:]:
            e["t_ms"] = 1.5e308
    path = write(tmp_path, "late.json", doc(edit))
    args = [str(tmp_path / "o.json") if a == "OUT" else a for a in cmd]
    err = refused(capsys, args[0], path, *args[1:], names=("late.json", "events[7] (token).t_ms", "1e+12"))
    assert not (tmp_path / "o.json").exists(), err


def test_time_bound_is_inclusive_and_the_same_everywhere(tmp_path):
    ok = doc(lambda d: [e.update(t_ms=MAX_TIME_MS) for e in d["events"][-2:]])
    assert load_trace(write(tmp_path, "edge.json", ok)).tokens["t_ms"].max() == MAX_TIME_MS
    arrival = doc(lambda d: d["requests"][2].update(arrival_ms=MAX_TIME_MS * 2))
    with pytest.raises(TraceError, match=r"requests\[2\].arrival_ms.*1e\+12"):
        load_trace(write(tmp_path, "arr.json", arrival))
    with pytest.raises(WorkloadError, match=r"w.json: requests\[0\].*arrival_ms.*1e\+12"):
        parse_workload(json.dumps({"requests": [{"id": "a", "arrival_ms": 2e12, "prompt_tokens": 1,
                                                  "output_tokens": 1}]}), "w.json")


def test_vllm_itls_beyond_bound_are_refused(tmp_path, capsys):
    res = {"ttfts": [0.1, 0.1], "itls": [[1e308, 1e308], [0.1]], "output_lens": [3, 2], "input_lens": [1, 1]}
    path = write(tmp_path, "vllm.json", res)
    refused(capsys, "metrics", path, "--json", names=("vllm.json", "request 0", "itls", "1e+12"))
    refused(capsys, "export", path, "--chrome", tmp_path / "o.json", names=("vllm.json", "itls"))


# ---- 4. vLLM output lengths ------------------------------------------------------------------

@pytest.mark.parametrize("n", [2**62, 2**70, 10**8])
def test_vllm_output_lens_bounded_before_allocating(tmp_path, capsys, n):
    res = {"ttfts": [0.1], "itls": [[0.1]], "output_lens": [n], "input_lens": [1]}
    refused(capsys, "metrics", write(tmp_path, "v.json", res), names=("v.json", "request 0", "output_lens",
                                                                         "10000000"))


def test_vllm_total_output_tokens_bounded(tmp_path, monkeypatch):
    from core.trace.imports import vllm_bench
    monkeypatch.setattr(vllm_bench, "MAX_IMPORT_TOKENS", 4)
    res = {"ttfts": [0.1, 0.1], "itls": [[0.1], [0.1]], "output_lens": [3, 2], "input_lens": [1, 1]}
    with pytest.raises(TraceError, match="v.json: output_lens: 5 output tokens in all"):
        open_trace(write(tmp_path, "v.json", res))


# ---- 5. deeply nested JSON -------------------------------------------------------------------

DEEP = "[" * 100_000 + "]" * 100_000


def test_deep_json_trace_and_workload(tmp_path, capsys):
    refused(capsys, "metrics", write(tmp_path, "deep.json", DEEP), names=("deep.json", "nested too deeply"))
    refused(capsys, "simulate", write(tmp_path, "deep_w.json", DEEP), "--out", tmp_path / "o.json",
            names=("deep_w.json", "nested too deeply"))
    with pytest.raises(WorkloadError, match="w.json: JSON nested too deeply"):
        parse_workload(DEEP, "w.json")
    deep_obj = '{"a":' * 100_000 + "1" + "}" * 100_000
    with pytest.raises(WorkloadError, match="w.jsonl line 2: JSON nested too deeply"):
        parse_workload('{"input_toks": 1, "output_toks": 1, "arrival_time_ns": 0}\n' + deep_obj, "w.jsonl")


def _parquet_with(tmp_path, name, table_edit=None, head=None) -> str:
    t = pq.read_table(pa.BufferReader(to_parquet_bytes(load_trace(SERIAL))))
    if table_edit:
        t = table_edit(t)
    if head is not None:
        t = t.replace_schema_metadata({b"serving-trace": head.encode()})
    buf = pa.BufferOutputStream()
    pq.write_table(t, buf)
    return write(tmp_path, name, buf.getvalue().to_pybytes())


def _set_json(rtype, k, value):
    def edit(t):
        rt = t.column("rtype").to_pylist()
        js = t.column("json").to_pylist()
        js[[i for i, r in enumerate(rt) if r == rtype][k]] = value
        return t.set_column(t.column_names.index("json"), "json", pa.array(js, pa.string()))
    return edit


def _add_other(value):
    def edit(t):
        row = {c: [None] for c in t.column_names} | {"rtype": ["other"], "t_ms": [1.0], "json": [value]}
        return pa.concat_tables([t, pa.table(row, schema=t.schema)])
    return edit


def test_deep_json_in_parquet(tmp_path, capsys):
    refused(capsys, "metrics", _parquet_with(tmp_path, "m.parquet", head=DEEP), names=("m.parquet", "nested"))
    refused(capsys, "metrics", _parquet_with(tmp_path, "r.parquet", _set_json("request", 0, DEEP)),
            names=("r.parquet", "request record 0", "nested"))


# ---- 6. Parquet records of the wrong JSON shape ------------------------------------------------

@pytest.mark.parametrize("edit,names", [
    (_set_json("request", 0, "[1]"), ("request record 0: json: expected an object",)),
    (_set_json("request", 1, '{"id": "Z"}'), ("request record 1: json", "'id'")),
    (_add_other("[1,2]"), ("other record 0: json: expected an object",)),
    (_add_other('{"t_ms": 1.0, "type": "spec", "req": "nobody"}'), ("other record[0] (spec)", "nobody")),
    (_add_other('{"t_ms": 1.0, "type": "token", "req": "A"}'), ("other record 0", "token")),
], ids=["request-list", "request-shadows-id", "other-list", "other-bad-req", "other-table-type"])
def test_parquet_json_shapes_refused_at_load(tmp_path, capsys, edit, names):
    path = _parquet_with(tmp_path, "s.parquet", edit)
    refused(capsys, "metrics", path, names=("s.parquet", *names))
    refused(capsys, "export", path, "--trace-out", tmp_path / "o.json", names=("s.parquet",))


# ---- 7. gzip bombs -----------------------------------------------------------------------------

def test_gzip_twice_is_refused(tmp_path, capsys):
    path = write(tmp_path, "twice.json.gz", gzip.compress(gzip.compress(SERIAL.read_bytes())))
    refused(capsys, "metrics", path, names=("twice.json.gz", "gzip data inside gzip"))
    with pytest.raises(WorkloadError, match="twice.json.gz: gzip data inside gzip"):
        parse_workload(gzip.compress(gzip.compress(b'{"requests": []}')), "twice.json.gz")


def test_gzip_bomb_is_refused_at_the_cap(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(errors, "MAX_DECOMPRESSED_BYTES", 1_000_000)
    bomb = gzip.compress(b" " * 5_000_000)  # ~5 kB inflating to 5 MB
    refused(capsys, "metrics", write(tmp_path, "bomb.json.gz", bomb),
            names=("bomb.json.gz", "more than 1,000,000 bytes"))
    with pytest.raises(WorkloadError, match="bomb.csv.gz: gzip data inflates to more than"):
        parse_workload(bomb, "bomb.csv.gz")
    ok = gzip.compress(SERIAL.read_bytes())  # under the cap: read as usual
    assert len(open_trace(ok, "ok.json.gz").tokens) == 6


def test_gzip_cap_stated_in_help(capsys):
    for cmd in ("metrics", "export"):
        assert main([cmd, "-h"]) == 0
        assert "2 GiB" in " ".join(capsys.readouterr().out.split())


# ---- 8. messages: file and field once ----------------------------------------------------------

def test_vidur_csv_huge_integer_names_file_and_column_once(tmp_path, capsys):
    for value in ("1e400", str(2**70)):
        path = write(tmp_path, "big_int.csv", f"arrived_at,num_prefill_tokens,num_decode_tokens\n0,{value},4\n")
        err = refused(capsys, "simulate", path, "--out", tmp_path / "o.json",
                      names=("big_int.csv row 2.num_prefill_tokens",))
        assert err.count("big_int.csv") == 1, err


def test_json_workload_errors_name_the_file(tmp_path, capsys):
    w = {"requests": [{"id": "a", "arrival_ms": 0, "prompt_tokens": 1, "output_tokens": 2**70}]}
    err = refused(capsys, "simulate", write(tmp_path, "w.json", w), "--out", tmp_path / "o.json",
                  names=("w.json: requests[0]", "output_tokens"))
    assert err.count("w.json") == 1 and err.count("requests[0]") == 1, err
    dup = {"name": "my run", "requests": [{"id": "a", "arrival_ms": 0, "prompt_tokens": 1, "output_tokens": 1}] * 2}
    with pytest.raises(WorkloadError, match="w.json: .*duplicate request id 'a'"):
        parse_workload(json.dumps(dup), "w.json")


def test_kv_block_id_beyond_any_pool_is_refused(tmp_path):
    # Issue 10 item 7: a kv event with block 2**40 would make the block view allocate terabytes.
    from core.trace.schema import MAX_KV_BLOCKS
    doc = json.loads((DATA / "traces" / "chapter31_serial.json").read_text())
    doc["events"].insert(0, {"t_ms": 0.0, "type": "kv", "op": "alloc", "req": "A", "block": 2**40,
                             "logical": 0, "ref": 1})
    with pytest.raises(TraceError, match=r"events\[0\] \(kv\)\.block: expected an integer in 0\.\.4,194,303"):
        parse_trace(json.dumps(doc), "big_block.json")
    doc["events"][0]["block"] = MAX_KV_BLOCKS - 1          # the largest allowed id loads
    assert parse_trace(json.dumps(doc), "ok.json").kv["block"].max() == MAX_KV_BLOCKS - 1


def test_block_view_memory_is_bounded():
    # The largest allowed block id with the default 200 snapshots would be 838M cells; the view
    # thins its snapshots to stay within MAX_CELLS instead.
    from core.analysis.occupancy import MAX_CELLS, block_states
    from core.trace.schema import MAX_KV_BLOCKS
    doc = json.loads((DATA / "traces" / "chapter31_serial.json").read_text())
    doc["events"].insert(0, {"t_ms": 0.0, "type": "kv", "op": "alloc", "req": "A", "block": MAX_KV_BLOCKS - 1,
                             "logical": 0, "ref": 1})
    occ = block_states(parse_trace(json.dumps(doc), "t.json"))
    assert occ.state.size <= MAX_CELLS and occ.state.shape[0] == MAX_KV_BLOCKS
    assert occ.state[MAX_KV_BLOCKS - 1, -1] == 2           # that block is owned at the end (OWNED)


def test_predict_with_a_bad_recorded_option_names_it():
    # Issue 10 item 8: meta.engine.block_size "abc" -> a ConfigError naming the option, no traceback.
    from core.errors import ConfigError
    from core.fit.predict import predicted_trace
    tr = load_trace(DATA / "traces" / "shared_prefix_caching_on.json.gz")
    tr.meta["engine"]["block_size"] = "abc"
    with pytest.raises(ConfigError, match=r"meta\.engine: block_size: expected an integer in 1\.\.1048576, got 'abc'"):
        predicted_trace(tr)
