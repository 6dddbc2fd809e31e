"""Trace formats, engine import, export, and fuzzing of the loaders."""
import gzip
import json
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from core.analysis.export import chrome_trace, metrics_csv
from core.analysis.metrics import summarize
from core.errors import TraceError
from core.trace import (
    Imported,
    import_vllm,
    load_trace,
    open_trace,
    parse_trace,
    save_trace,
    to_doc,
    to_parquet_bytes,
    trace_from_doc,
    trace_json,
)
from tests import fuzz_corpus
from tests.conftest import DATA, ROOT
from tests.helpers import minimal, sim_trace

VLLM_FILE = DATA / "imports" / "vllm_example_result.json"


# ---- round trips ---------------------------------------------------------------------------

@pytest.mark.parametrize("path", sorted((DATA / "traces").glob("*.json*")), ids=lambda p: p.name)
def test_every_bundled_trace_round_trips_through_every_format(path, tmp_path):
    tr = load_trace(path)
    doc = to_doc(tr)
    for name in ("t.json", "t.json.gz", "t.parquet"):
        save_trace(tr, tmp_path / name)
        assert to_doc(load_trace(tmp_path / name)) == doc, name


def test_parquet_is_lossless_for_a_rich_trace(tmp_path):
    tr = sim_trace(kv_blocks=70)                          # steps, batch, kv with hashes, preemptions
    tr.other.append({"t_ms": 1.0, "type": "spec", "req": tr.ids[0], "step": 3, "proposed": [1, 2],
                     "positions": [{"p": 0.5, "q": 0.4, "u": 0.1, "accepted": True}], "accepted": 1, "bonus": False})
    tr.extra["custom_top"] = {"x": 1}
    data = to_parquet_bytes(tr)
    assert data[:4] == b"PAR1"
    back = parse_trace(data, "t.parquet")
    assert to_doc(back) == to_doc(tr)
    assert summarize(back) == summarize(tr)


def test_typed_fast_path_and_generic_path_agree():
    tr = sim_trace()
    raw = trace_json(tr).encode()
    fast = parse_trace(raw, "t.json")
    generic = trace_from_doc(json.loads(raw), "t.json")
    assert to_doc(fast) == to_doc(generic) == to_doc(tr)


@pytest.mark.parametrize("name", ["spec_measured_cpu.json", "tiles_measured_cpu_triton.json"])
def test_fast_path_keeps_verbatim_events(name):
    from core.trace.jsonstream import decode_fast
    raw = (DATA / "traces" / name).read_bytes()
    fast = decode_fast(raw, name)                       # None would mean: refused, left to the precise path
    assert fast is not None and to_doc(fast) == to_doc(trace_from_doc(json.loads(raw), name))
    kind = name.split("_")[0]
    assert fast.events_of(kind) == [e for e in json.loads(raw)["events"] if e["type"] == kind]


def test_open_trace_sniffs_the_content_not_the_name(tmp_path):
    tr = sim_trace()
    for name in ("a.json", "b.json.gz", "c.parquet"):
        save_trace(tr, tmp_path / name)
        data = (tmp_path / name).read_bytes()
        (tmp_path / "misnamed.txt").write_bytes(data)
        for got in (open_trace(tmp_path / name), open_trace(str(tmp_path / "misnamed.txt")), open_trace(data, name)):
            assert isinstance(got, type(tr)) and to_doc(got) == to_doc(tr), name
    imp = open_trace(VLLM_FILE)
    assert isinstance(imp, Imported) and imp.trace is not None and imp.failed and imp.file_summary
    with pytest.raises(TraceError, match="schema: missing"):
        load_trace(VLLM_FILE)                           # a native trace only
    with pytest.raises(TraceError, match="nope.json: no such file"):
        open_trace(tmp_path / "nope.json")


# ---- vLLM import ---------------------------------------------------------------------------

def vllm_reference_summary(doc):
    """vLLM's calculate_metrics, written out independently: successful requests only; TPOT
    only for n > 1; ITLs pooled; latency = TTFT + sum(ITL); numpy's default percentile."""
    ok = [i for i, e in enumerate(doc["errors"]) if not e]
    ttft = np.array([doc["ttfts"][i] for i in ok])
    lat = np.array([doc["ttfts"][i] + sum(doc["itls"][i]) for i in ok])
    tpot = np.array([(lat[k] - ttft[k]) / (doc["output_lens"][i] - 1) for k, i in enumerate(ok)
                     if doc["output_lens"][i] > 1])
    itl = np.array([g for i in ok for g in doc["itls"][i]])
    out = {}
    for m, v in (("ttft", ttft), ("tpot", tpot), ("itl", itl), ("e2el", lat)):
        if not len(v):
            continue  # vLLM prints 0 for an empty metric; ours reports it as missing
        out[f"mean_{m}_ms"] = np.mean(v) * 1000
        out[f"median_{m}_ms"] = np.median(v) * 1000
        out[f"p99_{m}_ms"] = np.percentile(v, 99) * 1000
        out[f"std_{m}_ms"] = np.std(v) * 1000
    return out


OURS = {"ttft": "ttft_ms", "tpot": "tpot_ms", "itl": "itl_ms", "e2el": "e2e_ms"}
STATS = {"mean": "mean", "median": "median", "p99": "p99", "std": "std"}


def assert_agrees(ours, ref):
    for k, v in ref.items():
        stat, m = k.split("_")[0], k.split("_")[1]
        assert ours["summary"][OURS[m]][STATS[stat]] == pytest.approx(v, rel=1e-9, abs=1e-6), k


def test_bundled_vllm_file_agrees_with_its_own_summary():
    doc = json.loads(VLLM_FILE.read_text())
    imp = open_trace(VLLM_FILE.read_bytes(), VLLM_FILE.name)
    assert isinstance(imp, Imported) and imp.aligned_at_zero
    ours = summarize(imp.trace)
    for m in OURS:
        for stat in ("mean", "median", "p99", "std"):
            key = f"{stat}_{m}_ms"
            assert ours["summary"][OURS[m]][STATS[stat]] == pytest.approx(doc[key], rel=1e-9, abs=1e-6), key
    assert [f["index"] for f in imp.failed] == [7] and "ClientPayloadError" in imp.failed[0]["error"]
    assert dict(zip(imp.trace.finishes["req"], imp.trace.finishes["reason"]))[
        imp.trace.ids.index("req7")] == "error"


@st.composite
def vllm_docs(draw):
    n = draw(st.integers(2, 12))
    out_lens = draw(st.lists(st.integers(1, 8), min_size=n, max_size=n))
    gaps = st.floats(0.0005, 0.2, allow_nan=False)
    itls = [draw(st.lists(gaps, min_size=k - 1, max_size=k - 1)) for k in out_lens]
    ttfts = draw(st.lists(st.floats(0.001, 3.0), min_size=n, max_size=n))
    errors = [""] * n
    failed = draw(st.sets(st.integers(0, n - 1), max_size=n - 1))
    for i in failed:
        errors[i] = "Timeout"
        out_lens[i], itls[i], ttfts[i] = 0, [], 0.0
    return {"ttfts": ttfts, "itls": itls, "output_lens": out_lens, "input_lens": [5] * n, "errors": errors,
            "duration": 10.0, "completed": n - len(failed)}


@given(vllm_docs())
@settings(max_examples=60, deadline=None)
def test_import_agrees_with_vllm_definitions(doc):
    imp = import_vllm(doc, "r.json")
    ours = summarize(imp.trace)
    assert len(imp.failed) == sum(1 for e in doc["errors"] if e)
    assert_agrees(ours, vllm_reference_summary(doc))


def test_import_with_send_times_and_summary_only():
    doc = {"ttfts": [0.1, 0.2], "itls": [[0.05], [0.05, 0.05]], "output_lens": [2, 3], "input_lens": [4, 4],
           "errors": ["", ""], "start_times": [100.0, 100.5]}
    imp = import_vllm(doc)
    assert not imp.aligned_at_zero
    m = summarize(imp.trace)["requests"]
    assert [r["arrival_ms"] for r in m] == [0.0, 500.0]
    assert [r["first_token_ms"] for r in m] == pytest.approx([100.0, 700.0])
    only = import_vllm({"mean_ttft_ms": 12.0, "p99_tpot_ms": 3.0, "completed": 5})
    assert only.trace is None and "summary fields" in only.notes[0]
    with pytest.raises(TraceError, match="itls has 1 entries but ttfts has 2"):
        import_vllm({"ttfts": [0.1, 0.2], "itls": [[]], "output_lens": [1, 1]})


# ---- export ----------------------------------------------------------------------------------

def test_chrome_trace_structure():
    tr = sim_trace(kv_blocks=70)
    ct = chrome_trace(tr)
    json.dumps(ct, allow_nan=False)
    ev = ct["traceEvents"]
    names = {(e["pid"], e["args"]["name"]) for e in ev if e["ph"] == "M" and e["name"] == "process_name"}
    assert names == {(1, "scheduler"), (2, "requests")}
    steps = [e for e in ev if e["ph"] == "X" and e["pid"] == 1]
    assert len(steps) == len(tr.steps)
    assert steps[0]["ts"] == pytest.approx(tr.steps["t_ms"].iloc[0] * 1000)
    assert {e["name"] for e in ev if e["ph"] == "C"} == {"sequences", "kv_used_blocks"}
    threads = [e for e in ev if e["ph"] == "M" and e["name"] == "thread_name" and e["pid"] == 2]
    assert len(threads) == len(tr.requests)
    instants = [e for e in ev if e["ph"] == "i" and e["name"].startswith("token")]
    assert len(instants) == len(tr.tokens)
    slices = {e["name"] for e in ev if e["ph"] == "X" and e["pid"] == 2}
    assert slices == {"queued", "prefill", "decode"}
    assert sum(1 for e in ev if e["ph"] == "i" and e["name"].startswith("preempted")) == len(tr.preempts)


@pytest.mark.parametrize("name", ["vllm_cpu_tiny_loadgen.json.gz", "runner_served_tiny_loadgen.json.gz"])
def test_chrome_trace_draws_the_servers_sampled_metrics_as_counter_tracks(name):
    """A capture client's /metrics samples (gauge events) become counter tracks of their own
    process: one value per sample and series, equal to the file's (read here with the standard
    library), KV usage in percent."""
    import gzip
    path = DATA / "traces" / name
    samples = [e for e in json.loads(gzip.decompress(path.read_bytes()))["events"] if e["type"] == "gauge"]
    assert samples
    ev = chrome_trace(load_trace(path))["traceEvents"]
    json.dumps(ev, allow_nan=False)
    assert {"ph": "M", "pid": 3, "name": "process_name", "args": {"name": "server (sampled /metrics)"}} in ev
    counters = [e for e in ev if e["ph"] == "C" and e["pid"] == 3]
    by = {(e["name"], e["ts"]): e["args"] for e in counters}
    for s in samples:
        ts = s["t_ms"] * 1000.0
        assert by[("requests", ts)] == {"running": s["running"], "waiting": s["waiting"]}
        assert by[("kv_cache_usage_%", ts)]["kv_cache_usage_%"] == pytest.approx(100.0 * s["kv_usage"])
        assert by[("prefix_cache_tokens_total", ts)] == {"queries": s["prefix_cache_queries"],
                                                         "hits": s["prefix_cache_hits"]}
    assert len(counters) == 4 * len(samples)
    # a trace without samples gets no such process
    assert not [e for e in chrome_trace(sim_trace())["traceEvents"] if e.get("pid") == 3]


def test_chrome_trace_draws_a_real_vllm_run_from_inside():
    """The merged vLLM run: its prefix cache as a counter track (cached blocks, counted here from
    the raw KV events with a set), clears as instants, each request's engine-side phases, and the
    iteration log's steps named by their counts."""
    import base64

    import msgspec
    tr = load_trace(DATA / "traces" / "vllm_cpu_run2_merged.json.gz")
    ev = chrome_trace(tr)["traceEvents"]
    json.dumps(ev, allow_nan=False)
    cache = [e["args"]["cached_blocks"] for e in ev if e["ph"] == "C" and e["pid"] == 4]
    cached, peak = set(), 0
    raw = DATA / "imports" / "vllm_telemetry" / "run2_poisson4_p192_o48" / "kv_events.jsonl"
    for ln in raw.read_text().splitlines():
        payload = base64.b64decode(json.loads(ln)["frames"][2])
        for e in msgspec.msgpack.decode(payload)[1]:
            if e["type"] == "BlockStored":
                cached.update(e["block_hashes"])
            elif e["type"] == "BlockRemoved":
                cached.difference_update(e["block_hashes"])
            else:
                cached.clear()
        peak = max(peak, len(cached))
    assert max(cache) == peak and cache[-1] == len(cached)
    assert sum(1 for e in ev if e["ph"] == "i" and e["pid"] == 4 and e["name"] == "all blocks cleared") == 1
    phases = [e for e in ev if e["ph"] == "X" and e["pid"] == 5]
    assert {e["name"] for e in phases} == {"queued", "prefill", "decode"}
    assert len({e["tid"] for e in phases}) == len(tr.requests) == 48
    steps = [e for e in ev if e["ph"] == "X" and e["pid"] == 1]
    assert len(steps) == len(tr.steps) and all("prefill tok" in e["name"] for e in steps)
    assert sum(e["args"]["prefill_tokens"] for e in steps) == int(tr.steps["prefill_tokens"].sum())
    assert not [e for e in ev if e["ph"] == "C" and e["name"] == "sequences"]   # not recorded: not drawn


def test_csv_export_leaves_missing_tpot_empty():
    tr = load_trace(DATA / "traces" / "chapter31_continuous.json")
    lines = metrics_csv(tr).strip().splitlines()
    assert lines[0].startswith("id,arrival_ms,first_token_ms")
    c = lines[3].split(",")
    assert c[0] == "C" and c[6] == ""                      # TPOT of a one-token request: empty


def run_cli(*args):
    p = subprocess.run([sys.executable, "-m", "core", *map(str, args)], cwd=ROOT, capture_output=True, text=True,
                       timeout=120)
    return p.returncode, p.stdout, p.stderr


def test_cli_metrics_on_vllm_file_lists_failures():
    rc, out, err = run_cli("metrics", VLLM_FILE, "--json")
    assert rc == 0, err
    doc = json.loads(out)
    assert doc["summary"]["failed"] == 1
    assert doc["failed"][0]["id"] == "req7" and doc["failed"][0]["error"]
    assert doc["file_summary"]["completed"] == 39


def test_cli_export(tmp_path):
    rc, out, err = run_cli("export", DATA / "traces" / "shared_prefix_caching_on.json.gz",
                           "--chrome", tmp_path / "c.json", "--csv", tmp_path / "m.csv",
                           "--trace-out", tmp_path / "t.parquet")
    assert rc == 0, err
    assert json.loads((tmp_path / "c.json").read_text())["traceEvents"]
    assert len((tmp_path / "m.csv").read_text().splitlines()) == 61
    assert to_doc(load_trace(tmp_path / "t.parquet")) == to_doc(load_trace(
        DATA / "traces" / "shared_prefix_caching_on.json.gz"))
    rc, _, err = run_cli("export", DATA / "traces" / "chapter31_serial.json")
    assert rc == 2 and "at least one of" in err


# ---- fuzzing: only our own error type, never another exception -------------------------------

def only_trace_errors(data, name="f.json"):
    try:
        parse_trace(data, name)
    except TraceError:
        pass
    try:
        open_trace(data, name)
    except TraceError:
        pass


@given(st.binary(max_size=400))
@settings(max_examples=300, deadline=None)
def test_fuzz_random_bytes(data):
    only_trace_errors(data)
    only_trace_errors(b"PAR1" + data + b"PAR1", "f.parquet")
    only_trace_errors(gzip.compress(data))


json_values = st.recursive(st.none() | st.booleans() | st.integers(-2**70, 2**70) | fuzz_corpus.BIG_INTS
                           | st.floats() | fuzz_corpus.HOSTILE_FLOATS | st.text(max_size=8),
                           lambda c: st.lists(c, max_size=4) | st.dictionaries(st.text(max_size=8), c, max_size=4),
                           max_leaves=20)


@pytest.mark.slow
@given(json_values)
@settings(max_examples=300, deadline=None)
def test_fuzz_random_json(value):
    raw = json.dumps(value, allow_nan=True).encode()     # NaN / Infinity literals included
    only_trace_errors(raw)
    fuzz_corpus.check(raw, "r.json")


KEYS = ["schema", "meta", "source", "requests", "events", "id", "arrival_ms", "prompt_tokens", "max_output_tokens",
        "t_ms", "type", "req", "index", "reason", "step", "batch", "op", "block", "ttfts", "itls", "output_lens"]


@pytest.mark.slow
@given(st.data())
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_fuzz_mutated_valid_traces(data):
    # Small bases keep each example fast; the simulated trace (1.2 MB: batch and preempt
    # records) is one choice in six.
    base = data.draw(st.sampled_from(["minimal", "sim", *fuzz_corpus.BASES, "chapter31_measured_cpu.json",
                                      "tiles_measured_cpu_triton.json"]))
    doc = (minimal() if base == "minimal" else to_doc(sim_trace()) if base == "sim"
           else fuzz_corpus.base_doc(base))
    doc = json.loads(json.dumps(doc))
    for _ in range(data.draw(st.integers(1, 4))):
        # Pick a random container inside the document and change, drop or add a key/item.
        node = doc
        for _ in range(data.draw(st.integers(0, 3))):
            if isinstance(node, dict) and node:
                node = node[data.draw(st.sampled_from(sorted(node)))]
            elif isinstance(node, list) and node:
                node = node[data.draw(st.integers(0, len(node) - 1))]
        if isinstance(node, dict):
            key = data.draw(st.sampled_from(sorted(node) + KEYS))
            action = data.draw(st.sampled_from(["set", "drop"]))
            if action == "drop":
                node.pop(key, None)
            else:
                node[key] = data.draw(json_values)
        elif isinstance(node, list):
            if node and data.draw(st.booleans()):
                node.pop(data.draw(st.integers(0, len(node) - 1)))
            else:
                node.append(data.draw(json_values))
    raw = json.dumps(doc, allow_nan=True).encode()
    fuzz_corpus.check(raw, "m.json")
    try:
        tr = parse_trace(raw, "m.json")
    except TraceError:
        return
    summarize(tr)                                   # whatever loads is usable
    assert to_doc(parse_trace(raw, "m.json")) == to_doc(trace_from_doc(json.loads(raw), "m.json"))


# Hostile values in real traces (tests/fuzz_corpus.py): integers 2**63..2**70 and -2**63-1,
# ±1e308, ±Infinity, NaN, 1..5000 levels of nesting, records in the wrong shape; each mutated
# trace as JSON and (when it loads) as Parquet, plus mutations of the Parquet file itself
# (columns with out-of-range / wrongly typed values, the json column, the metadata JSON).
# Invariant (fuzz_corpus.check): open_trace, summarize, json.dumps(summary, allow_nan=False)
# and chrome_trace_json succeed or raise an InputError; never another exception, never a hang.

def _deep_doc(depth, kind):
    return fuzz_corpus.dumps(fuzz_corpus.base_doc("chapter31_serial.json"),
                             (("events", 0, "t_ms"), depth, kind)), f"deep {kind} {depth}"


@pytest.mark.slow
@given(fuzz_corpus.mutated_docs())
@example(_deep_doc(fuzz_corpus.MAX_DEPTH, "list"))
@example(_deep_doc(fuzz_corpus.MAX_DEPTH, "dict"))
@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
def test_fuzz_hostile_values_json_and_parquet(case):
    raw, what = case
    fuzz_corpus.check(raw, "m.json")
    fuzz_corpus.check(gzip.compress(raw, mtime=0), "m.json.gz")
    try:
        tr = parse_trace(raw, "m.json")
    except TraceError:
        return
    pq_bytes = to_parquet_bytes(tr)                 # what loads from JSON also writes and reads as Parquet
    fuzz_corpus.check(pq_bytes, "m.parquet")
    assert to_doc(parse_trace(pq_bytes, "m.parquet")) == to_doc(tr), what


@pytest.mark.slow
@given(fuzz_corpus.mutated_parquet())
@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
def test_fuzz_hostile_parquet(case):
    raw, what = case
    fuzz_corpus.check(raw, "m.parquet")


@pytest.mark.parametrize("base", fuzz_corpus.BASES)
@pytest.mark.parametrize("path,value", [
    (("requests", 0, "prompt_tokens"), 2**63), (("requests", 0, "prompt_tokens"), 2**70),
    (("requests", 0, "max_output_tokens"), -2**63 - 1), (("events", 0, "t_ms"), 1e308),
    (("events", 0, "t_ms"), -1e308), (("events", 0, "t_ms"), float("inf")), (("events", 0, "t_ms"), float("nan")),
    (("requests", 0, "arrival_ms"), float("-inf")), (("meta",), []), (("meta",), None), (("events", 0), [1, 2]),
    (("requests",), {"A": {}}), (("requests", 0), "A"), (("meta", "source"), {"x": 1}),
])
def test_hostile_values_are_clean_errors(base, path, value):
    doc = fuzz_corpus.base_doc(base)
    raw = fuzz_corpus.dumps(fuzz_corpus.put(doc, path, value))
    with pytest.raises(TraceError):
        parse_trace(raw, "h.json")
    fuzz_corpus.check(raw, "h.json")


def _parquet_with_head(change):
    t = fuzz_corpus._table("chapter31_serial.json")
    head = json.loads(t.schema.metadata[b"serving-trace"])
    change(head)
    return fuzz_corpus.write_parquet(t.replace_schema_metadata({b"serving-trace": fuzz_corpus.dumps(head)}))


@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf")])
def test_parquet_metadata_nan_is_a_clean_error(value):
    # Found by the fuzzer: NaN/Infinity in the Parquet metadata JSON loaded (the JSON form refuses
    # them) and broke json.dumps(summary) later. Now refused at load.
    raw = _parquet_with_head(lambda h: h["meta"].__setitem__("label", value))
    with pytest.raises(TraceError, match="not a JSON number"):
        parse_trace(raw, "m.parquet")
    fuzz_corpus.check(raw, "m.parquet")


@pytest.mark.parametrize("where", ["meta", "json-column"])
def test_parquet_nan_in_json_texts_does_not_load(where):
    if where == "meta":
        raw = _parquet_with_head(lambda h: h["meta"].__setitem__("engine", {"temperature": float("nan")}))
    else:
        import pyarrow as pa
        t = fuzz_corpus._table("chapter31_serial.json")
        v = t.column("json").to_pylist()
        v[0] = '{"x": NaN}'                            # row 0 is request A: its extra fields
        raw = fuzz_corpus.write_parquet(fuzz_corpus._replace(t, "json", pa.array(v, pa.string())))
    with pytest.raises(TraceError, match="not a JSON number"):
        parse_trace(raw, "m.parquet")


def test_deep_nesting_and_huge_numbers_are_clean_errors():
    with pytest.raises(TraceError):
        parse_trace(b"[" * 100_000 + b"]" * 100_000, "deep.json")
    doc = minimal()
    doc["events"][0]["t_ms"] = 10 ** 400                   # not a finite float
    with pytest.raises(TraceError):
        parse_trace(json.dumps(doc).encode(), "huge.json")


def test_errors_count_all_problems_in_a_large_bad_file():
    doc = minimal()
    doc["events"] = [{"t_ms": 1, "type": "token", "req": "nobody", "index": 0} for _ in range(5000)]
    with pytest.raises(TraceError, match=r"events\[0\].*and 4999 more problems"):
        parse_trace(json.dumps(doc).encode(), "bad.json")


def test_user_run_details_go_into_a_copy_of_the_trace():
    from core.analysis.export import with_run_metadata
    from core.errors import InputError
    from core.trace import load_trace, parse_trace
    tr = load_trace(DATA / "traces" / "vllm_cpu_tiny_loadgen.json.gz")
    engine_before = dict(tr.meta["engine"])
    got = with_run_metadata(tr, device="1x H100-SXM", engine="vLLM 0.11.0", notes="warm server, 3 repeats")
    assert got.meta["device"] == "1x H100-SXM" and got.meta["notes"] == "warm server, 3 repeats"
    assert got.meta["engine"] == {**engine_before, "described_by_user": "vLLM 0.11.0"}
    assert tr.meta["engine"] == engine_before and tr.meta["device"] != "1x H100-SXM"   # the shared trace untouched
    back = parse_trace(trace_json(got).encode(), "t.json")           # valid, and the details survive the file
    assert back.meta["device"] == "1x H100-SXM" and back.meta["engine"]["described_by_user"] == "vLLM 0.11.0"
    assert with_run_metadata(tr).meta == tr.meta                 # nothing entered: the file's own
    with pytest.raises(InputError, match="notes: at most 2000"):
        with_run_metadata(tr, notes="x" * 2001)
