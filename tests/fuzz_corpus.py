"""Hostile mutations of real traces for the fuzz tests in test_traces_io.py.

Starts from small shipped traces (data/traces/chapter31_serial.json, spec_measured_cpu.json)
and mutates them at the JSON level (huge/negative integers, ±1e308, ±Infinity, NaN, deep
nesting, wrong record shapes) and at the Parquet level (a column replaced by out-of-range or
wrongly typed values, the `json` column or the serving-trace metadata mutated). `check` is the
invariant: open_trace, summarize, a strict JSON dump of the summary and the Chrome export
either succeed or raise an InputError, nothing else, within a time limit.
"""
from __future__ import annotations

import io
import json
import math
import signal
from contextlib import contextmanager

from hypothesis import strategies as st

from core.analysis.export import chrome_trace_json
from core.analysis.metrics import summarize
from core.errors import InputError
from core.trace import Imported, open_trace
from tests.conftest import DATA

BASES = ["chapter31_serial.json", "spec_measured_cpu.json"]
_DOCS: dict[str, dict] = {}
_PARQUET: dict[str, bytes] = {}

BIG_INTS = st.integers(2**63, 2**70) | st.just(-2**63 - 1)
HOSTILE_FLOATS = st.sampled_from([1e308, -1e308, math.inf, -math.inf, math.nan])
# Metadata floats include NaN/Infinity: the Parquet reader refuses them as the JSON form does
# (found by this fuzzer: test_traces_io.py::test_parquet_metadata_nan_is_a_clean_error).
METADATA_FLOATS = HOSTILE_FLOATS
MAX_DEPTH = 5000
HANG_SECONDS = 20          # one example (load + summary + export) never takes this long


def base_doc(name: str) -> dict:
    if name not in _DOCS:
        _DOCS[name] = json.loads((DATA / "traces" / name).read_bytes())
    return json.loads(json.dumps(_DOCS[name]))      # a fresh deep copy


def base_parquet(name: str) -> bytes:
    if name not in _PARQUET:
        from core.trace import parse_trace, to_parquet_bytes
        _PARQUET[name] = to_parquet_bytes(parse_trace((DATA / "traces" / name).read_bytes(), name))
    return _PARQUET[name]


# ---- the invariant -----------------------------------------------------------------------

@contextmanager
def no_hang(seconds: int = HANG_SECONDS):
    """Fail (TimeoutError) instead of hanging, where SIGALRM exists (main thread, POSIX)."""
    try:
        old = signal.signal(signal.SIGALRM, _alarm)
    except (AttributeError, ValueError):
        yield
        return
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def _alarm(*_):
    raise TimeoutError(f"one fuzz example ran over {HANG_SECONDS} s (a hang)")


def check(data: bytes, name: str) -> None:
    """Load, summarize, dump the summary strictly, export: each succeeds or raises an InputError."""
    with no_hang():
        try:
            tr = open_trace(data, name)
        except InputError:
            return
        if isinstance(tr, Imported):
            tr = tr.trace
            if tr is None:   # a result file with summary fields only: nothing per request
                return
        try:
            summary = summarize(tr)
        except InputError:
            summary = None
        if summary is not None:
            json.dumps(summary, allow_nan=False)
        try:
            chrome_trace_json(tr)
        except InputError:
            pass


# ---- JSON-level mutations ----------------------------------------------------------------

def paths(node, at=()):
    """Every (path, value) in a JSON document, containers included."""
    yield at, node
    if isinstance(node, dict):
        for k, v in node.items():
            yield from paths(v, at + (k,))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from paths(v, at + (i,))


def get(doc, path):
    for p in path:
        doc = doc[p]
    return doc


def put(doc, path, value):
    """doc with the value at path replaced (the root itself when path is empty)."""
    if not path:
        return value
    get(doc, path[:-1])[path[-1]] = value
    return doc


_HOLE = "\x00fuzz-hole\x00"


def dumps(doc, deep: tuple | None = None) -> bytes:
    """JSON with NaN/Infinity literals allowed; `deep` = (path, depth, kind) wraps the value at
    path in that many lists ("list") or objects ("dict"), spliced in as text (json.dumps
    itself would recurse too deeply)."""
    if deep is None:
        return json.dumps(doc, allow_nan=True).encode()
    path, depth, kind = deep
    inner = json.dumps(get(doc, path), allow_nan=True)
    if kind == "list":
        wrapped = "[" * depth + inner + "]" * depth
    else:
        wrapped = '{"k":' * depth + inner + "}" * depth
    text = json.dumps(put(doc, path, _HOLE), allow_nan=True)
    return text.replace(json.dumps(_HOLE), wrapped, 1).encode()


def _shape_changes(value):
    """A record in the wrong shape: what a field that should be an object (or list) becomes."""
    if isinstance(value, dict):
        return [list(value.values()), list(value.items()), json.dumps(value), None, [value], 0]
    if isinstance(value, list):
        return [{str(i): v for i, v in enumerate(value)}, json.dumps(value), None, value[:1] or [[]]]
    return [[value], {"v": value}, None]


@st.composite
def mutated_docs(draw, max_mutations: int = 3):
    """(bytes, description) of one base trace with 1..max_mutations hostile JSON changes."""
    base = draw(st.sampled_from(BASES))
    doc = base_doc(base)
    done = []
    deep = None
    for _ in range(draw(st.integers(1, max_mutations))):
        every = list(paths(doc))
        kind = draw(st.sampled_from(["int", "float", "shape", "record", "any"]))
        if kind == "int":
            cands = [p for p, v in every if isinstance(v, int) and not isinstance(v, bool)] or [p for p, _ in every]
            p = draw(st.sampled_from(cands))
            doc = put(doc, p, draw(BIG_INTS))
        elif kind == "float":
            cands = [p for p, v in every if isinstance(v, (int, float)) and not isinstance(v, bool)] \
                or [p for p, _ in every]
            p = draw(st.sampled_from(cands))
            doc = put(doc, p, draw(HOSTILE_FLOATS))
        elif kind == "shape":
            cands = [p for p, v in every if isinstance(v, (dict, list))] or [()]
            p = draw(st.sampled_from(cands))
            doc = put(doc, p, draw(st.sampled_from(_shape_changes(get(doc, p)))))
        elif kind == "record":       # the named record-level shape errors
            what = draw(st.sampled_from(["event->list", "requests->object", "events->object", "meta->list",
                                         "request->list", "doc->list"]))
            p = ()
            if not isinstance(doc, dict):
                doc = [doc]
            elif what == "event->list" and isinstance(doc.get("events"), list) and doc["events"]:
                p = ("events", draw(st.integers(0, len(doc["events"]) - 1)))
                ev = get(doc, p)
                doc = put(doc, p, list(ev.values()) if isinstance(ev, dict) else [ev])
            elif what == "request->list" and isinstance(doc.get("requests"), list) and doc["requests"]:
                p = ("requests", draw(st.integers(0, len(doc["requests"]) - 1)))
                r = get(doc, p)
                doc = put(doc, p, list(r.values()) if isinstance(r, dict) else [r])
            elif what in ("requests->object", "events->object") and isinstance(doc, dict):
                key = what.split("-")[0]
                v = doc.get(key)
                doc[key] = ({(r.get("id") if isinstance(r, dict) else str(i)) or str(i): r for i, r in enumerate(v)}
                            if isinstance(v, list) else {"0": v})
            elif what == "meta->list" and isinstance(doc, dict):
                m = doc.get("meta")
                doc["meta"] = list(m.items()) if isinstance(m, dict) else [m]
            elif what == "doc->list":
                doc = [doc]
        else:                       # any node, any hostile value
            p = draw(st.sampled_from([p for p, _ in every]))
            doc = put(doc, p, draw(BIG_INTS | HOSTILE_FLOATS | st.sampled_from([None, [], {}, "", True])))
        done.append(f"{kind}@{p!r}"[:120])
    if draw(st.booleans()):        # deep nesting, the last (textual) change
        every = [p for p, _ in paths(doc)]
        p = draw(st.sampled_from(every))
        depth = draw(st.integers(1, 20) | st.integers(1, MAX_DEPTH))
        deep = (p, depth, draw(st.sampled_from(["list", "dict"])))
        done.append(f"deep{deep!r}"[:120])
    return dumps(doc, deep), f"{base}: " + "; ".join(done)


# ---- Parquet-level mutations -------------------------------------------------------------

def _table(base: str):
    import pyarrow as pa
    import pyarrow.parquet as pq
    return pq.read_table(pa.BufferReader(base_parquet(base)))


def write_parquet(table) -> bytes:
    import pyarrow.parquet as pq
    buf = io.BytesIO()
    pq.write_table(table, buf)
    return buf.getvalue()


def _replace(table, name, array):
    i = table.column_names.index(name)
    return table.set_column(i, name, array)


@st.composite
def mutated_parquet(draw):
    """(bytes, description) of a base trace's Parquet file with one hostile change to a
    column, the `json` column or the serving-trace metadata."""
    import pyarrow as pa

    base = draw(st.sampled_from(BASES))
    t = _table(base)
    n = len(t)
    kind = draw(st.sampled_from(["int-column", "float-column", "type-column", "json-column", "metadata",
                                 "rtype", "drop-column"]))
    rows = draw(st.lists(st.integers(0, n - 1), min_size=1, max_size=4, unique=True))
    ints = [c for c in t.column_names if pa.types.is_int64(t.schema.field(c).type)]
    floats = [c for c in t.column_names if pa.types.is_float64(t.schema.field(c).type)]
    col = draw(st.sampled_from(t.column_names))
    if kind == "int-column":
        col = draw(st.sampled_from(ints))
        v = t.column(col).to_pylist()
        how = draw(st.sampled_from(["uint64", "float64", "int64-extremes", "decimal"]))
        if how == "uint64":      # 2**63.. beyond int64: only an unsigned column holds them
            big = draw(st.integers(2**63, 2**64 - 1))
            arr = pa.array([big if i in rows else (x if x is None or x >= 0 else 0) for i, x in enumerate(v)],
                           pa.uint64())
        elif how == "float64":
            f = draw(HOSTILE_FLOATS)
            arr = pa.array([f if i in rows else (None if x is None else float(x)) for i, x in enumerate(v)],
                           pa.float64())
        elif how == "int64-extremes":
            e = draw(st.sampled_from([-2**63, 2**63 - 1, -1, 2**31, -2**31 - 1]))
            arr = pa.array([e if i in rows else x for i, x in enumerate(v)], pa.int64())
        else:                     # 2**63..2**70 and -2**63-1 as decimals (exact)
            big = draw(BIG_INTS)
            arr = pa.array([__import__("decimal").Decimal(big if i in rows else (x or 0)) for i, x in enumerate(v)],
                           pa.decimal128(38, 0))
        t = _replace(t, col, arr)
    elif kind == "float-column":
        col = draw(st.sampled_from(floats))
        f = draw(HOSTILE_FLOATS)
        v = t.column(col).to_pylist()
        t = _replace(t, col, pa.array([f if i in rows else x for i, x in enumerate(v)], pa.float64()))
    elif kind == "type-column":   # a column of the wrong type or shape
        v = t.column(col).to_pylist()
        how = draw(st.sampled_from(["string", "list", "struct", "bool", "null"]))
        if how == "string":
            arr = pa.array([None if x is None else str(x) for x in v], pa.string())
        elif how == "list":
            arr = pa.array([None if x is None else [x] for x in v])
        elif how == "struct":
            arr = pa.array([None if x is None else {"v": str(x)} for x in v])
        elif how == "bool":
            arr = pa.array([None if x is None else bool(x) for x in v], pa.bool_())
        else:
            arr = pa.nulls(n)
        t = _replace(t, col, arr)
    elif kind == "json-column":   # the request extras / other events: hostile JSON text
        v = t.column("json").to_pylist()
        text = draw(st.sampled_from([
            '{"x": NaN}', '{"x": Infinity}', '{"x": -Infinity}', '{"x": 1e309}', "[1, 2]", "null", "3",
            '{"x": 9223372036854775808}', '{"x": ' + str(-2**63 - 1) + "}", '"a"', "{",
            '{"x":' + "[" * MAX_DEPTH + "]" * MAX_DEPTH + "}",
            '{"t_ms": NaN, "type": "mark"}', '{"t_ms": 1e308, "type": "mark", "req": "' + "A" + '"}',
            '{"type": "token"}', '{"x": {"k": ' * 3000 + "1" + "}" * 3001,
        ]))
        t = _replace(t, "json", pa.array([text if i in rows else x for i, x in enumerate(v)], pa.string()))
    elif kind == "metadata":      # the document head: the JSON mutator on {"schema","meta","extra"}
        head = json.loads(t.schema.metadata[b"serving-trace"])
        every = list(paths(head))
        p = draw(st.sampled_from([p for p, _ in every]))
        how = draw(st.sampled_from(["int", "float", "shape", "deep", "garbage"]))
        if how == "int":
            raw = dumps(put(head, p, draw(BIG_INTS)))
        elif how == "float":
            raw = dumps(put(head, p, draw(METADATA_FLOATS)))
        elif how == "shape":
            raw = dumps(put(head, p, draw(st.sampled_from(_shape_changes(get(head, p))))))
        elif how == "deep":
            raw = dumps(head, (p, draw(st.integers(1, MAX_DEPTH)), draw(st.sampled_from(["list", "dict"]))))
        else:
            raw = draw(st.sampled_from([b"", b"\xff\xfe", b"null", b"[]", b"NaN", b"{" * 3000]))
        col = "metadata"
        t = t.replace_schema_metadata({b"serving-trace": raw})
    elif kind == "rtype":
        v = t.column("rtype").to_pylist()
        r = draw(st.sampled_from(["request", "token", "finish", "step", "batch", "kv", "preempt", "other", None, ""]))
        t = _replace(t, "rtype", pa.array([r if i in rows else x for i, x in enumerate(v)], pa.string()))
        col = f"rtype={r!r}"
    else:
        t = t.drop_columns([col]).replace_schema_metadata(t.schema.metadata)
    if kind != "metadata" and t.schema.metadata is None:
        t = t.replace_schema_metadata(_table(base).schema.metadata)
    return write_parquet(t), f"{base}: {kind} {col} rows {rows}"
