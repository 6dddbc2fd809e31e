"""The JSON form of a trace: one document (optionally gzip-compressed) with `requests` and
an `events` list sorted by time. Both directions are derived from schema.py.

Encoding writes each table's rows as events with the declared key order (`t_ms`, `type`,
then the fields; fields declared write="present" only when not their default), and sorts
by time, at equal times by the record's declared `order`.

Decoding has one fast path: msgspec decodes the events straight into typed structs
generated from the declarations, several times faster than generic JSON objects, and
`model.frame` checks whole columns. Anything it refuses (unknown event types such as spec
and tiles, wrong types, out-of-range values, broken cross-event rules) goes to the precise
path in validate.py, which parses the document generically and either builds the trace
or names the first problem.

The fast path streams (`decode_fast`, see "streaming" below): gzip is inflated and the
events decoded a slice of about STREAM_CHUNK bytes at a time into growing columns, so the
whole text and all the typed events never coexist; documents in another layout than ours
go to the same decoder run on the whole document (`decode_whole`).
"""
from __future__ import annotations

import functools
import gc
import gzip
import json
import operator
from itertools import chain, repeat
from operator import attrgetter
from typing import Any

import msgspec
import numpy as np
import orjson
import pandas as pd

from core import errors
from core.errors import TraceError, loads_json
from core.trace.model import BadColumn, Trace, frame
from core.trace.schema import BATCH, COLUMN_TYPES, REQUEST, SCHEMA, STEP, TABLE_EVENTS, Field, Record
from core.trace.validate import Problems, read_events, trace_from_doc
from core.workload import decode_bytes

# ---- encoding ------------------------------------------------------------------------------

def _values(f: Field, col: pd.Series, ids: np.ndarray) -> list:
    if f.type != "req":
        return col.tolist()
    codes = col.to_numpy()
    if not f.nullable:
        return ids[codes].tolist()
    if not len(ids):
        return [None] * len(codes)
    return np.where(codes >= 0, ids[np.maximum(codes, 0)], None).tolist()


def _dicts(rec: Record, df: pd.DataFrame, ids: np.ndarray, batch: list | None = None) -> list[dict]:
    """One JSON object per row: the declared keys in order, 'present' fields only when set."""
    always = [f for f in rec.json_fields if f.write == "always" and f.type in COLUMN_TYPES + ("batch",)]
    cols = [batch if f.type == "batch" else _values(f, df[f.name], ids) for f in always]
    keys = [f.name for f in always]
    if rec in TABLE_EVENTS:  # "type" right after t_ms
        keys.insert(1, "type")
        cols.insert(1, repeat(rec.type))
    out = [dict(zip(keys, row)) for row in zip(*cols)]
    for f in rec.json_fields:
        if f.write != "present":
            continue
        col = df[f.name]
        unset = col.isna().to_numpy() if f.fill is None else (col == f.fill).to_numpy()
        if unset.all():
            continue
        for e, v, skip in zip(out, _values(f, col, ids), unset.tolist()):
            if not skip:
                e[f.name] = v
    return out


def to_doc(trace: Trace) -> dict:
    ids = np.array(trace.ids, dtype=object)
    reqs = _dicts(REQUEST, trace.requests, ids)
    for d, x in zip(reqs, trace.request_extra):
        d.update(x)
    parts: list[tuple[np.ndarray, int, list[dict]]] = []  # (times, order at equal times, events)
    for rec in TABLE_EVENTS:
        df = getattr(trace, rec.table)
        if not len(df):
            continue
        batch = None
        if rec is STEP:  # each step event carries its batch entries
            by_step: dict[int, list] = {}
            for s, e in zip(trace.batch["step"].tolist(), _dicts(BATCH, trace.batch, ids)):
                by_step.setdefault(s, []).append(e)
            batch = [by_step.get(s, []) for s in df["step"].tolist()]
        parts.append((df["t_ms"].to_numpy(), rec.order, _dicts(rec, df, ids, batch)))
    if trace.other:
        parts.append((np.array([e.get("t_ms", 0.0) for e in trace.other], dtype=float), 4, list(trace.other)))
    events: list = []
    if parts:
        times = np.concatenate([p[0] for p in parts])
        order_key = np.concatenate([np.full(len(p[2]), p[1]) for p in parts])
        flat = [e for p in parts for e in p[2]]
        events = [flat[i] for i in np.lexsort((order_key, times)).tolist()]  # stable: by time, then order
    doc = {"schema": SCHEMA, "meta": trace.meta, "requests": reqs, "events": events}
    doc.update(trace.extra)
    return doc


def trace_json(trace: Trace, pretty: bool = False) -> str:
    doc = to_doc(trace)
    if not pretty:
        return json.dumps(doc, separators=(",", ":"), allow_nan=False)
    # Readable and diff-friendly: one request / one event per line.
    head = {k: v for k, v in doc.items() if k not in ("requests", "events")}
    lines = ["{"]
    for k, v in head.items():
        lines.append(f" {json.dumps(k)}: {json.dumps(v, allow_nan=False)},")
    for key in ("requests", "events"):
        items = doc[key]
        lines.append(f' "{key}": [')
        lines += [f"  {json.dumps(x, allow_nan=False)}{',' if i < len(items) - 1 else ''}"
                  for i, x in enumerate(items)]
        lines.append(" ]," if key == "requests" else " ]")
    lines.append("}")
    return "\n".join(lines) + "\n"


def json_bytes(trace: Trace, pretty: bool = False, gz: bool = False) -> bytes:
    data = trace_json(trace, pretty and not gz).encode()
    return gzip.compress(data, compresslevel=6, mtime=0) if gz else data  # mtime=0: reproducible bytes


# ---- generic parsing -------------------------------------------------------------------------

def gunzip(data: bytes, name: str, error=TraceError) -> bytes:
    return errors.gunzip(data, name, error)  # streaming, capped at errors.MAX_DECOMPRESSED_BYTES


def parse_json_bytes(data: bytes | str, name: str, error=TraceError) -> Any:
    """Parse JSON (gzip-compressed or not). orjson first (several times faster); any failure
    is re-parsed by the standard library to word the error precisely."""
    if isinstance(data, bytes):
        data = gunzip(data, name, error)
        try:
            return orjson.loads(data)
        except orjson.JSONDecodeError as e:
            if "depth limit" in str(e):      # Python's parser would end in a RecursionError: say how deep
                raise error(too_deep(data, name)) from None
    text = decode_bytes(data, name, error) if isinstance(data, bytes) else data
    if not text.strip():
        raise error(f"{name}: the file is empty")
    try:
        return loads_json(text, name, error, parse_constant=lambda c: _bad_constant(c, name, error))
    except json.JSONDecodeError as e:
        raise error(f"{name}: not valid JSON (line {e.lineno}, column {e.colno}: {e.msg})") from None


MAX_JSON_DEPTH = 1024    # nesting the JSON parsers read (orjson's limit; Python's json recurses about as deep)
# Objects and arrays an imported JSON file (another tool's, or JSON lines) may hold: each becomes a
# Python dict or list of ~100-250 bytes once parsed and read, so a few kB of gzip holding 30 million
# empty spans ("{}," repeated) would cost gigabytes before any reader could refuse it. Counted on the
# raw bytes before parsing (brackets inside strings count too: the bound errs on the safe side);
# our own trace format is streamed (core.trace.jsonstream) and not held to it.
MAX_JSON_CONTAINERS = 5_000_000


def check_containers(raw: bytes, name: str, error=TraceError) -> None:
    """Refuse, before parsing, JSON text with more than MAX_JSON_CONTAINERS objects and arrays."""
    n = raw.count(b"{")
    if n <= MAX_JSON_CONTAINERS:
        n += raw.count(b"[")
    if n > MAX_JSON_CONTAINERS:
        raise error(f"{name}: {n:,} JSON objects and arrays or more (at most {MAX_JSON_CONTAINERS:,} are read from "
                    "an imported file; split it, or import fewer records)")


def too_deep(raw, name: str) -> str:
    """The one line for JSON nested past what the parsers read, with how deep it goes."""
    from core.trace.jsonscan import json_depth
    return f"{name}: JSON nested too deeply ({json_depth(raw):,} levels; at most {MAX_JSON_DEPTH:,} are read)"


def parse_json_text(raw: bytes, name: str, error=TraceError) -> Any:
    """JSON text held inside another format (a Parquet trace's head): nested past MAX_JSON_DEPTH, refused
    as `error` in too_deep's line (how deep, and the limit) from a scan of the bytes, before any parser
    sees it; else parsed by the standard library (loads_json: exact integers of any size, as the JSON
    form's head is read; non-finite numbers refused). Never inflated or decoded from another encoding
    here: json.JSONDecodeError and UnicodeDecodeError are left to the caller."""
    from core.trace.jsonscan import json_depth
    if json_depth(raw) > MAX_JSON_DEPTH:
        raise error(too_deep(raw, name))
    return loads_json(raw.decode(), name, error)


def _bad_constant(c, name, error):
    raise error(f"{name}: {c} is not allowed (JSON numbers must be finite)")


class no_gc:
    """Pause the cyclic garbage collector: parsing a million small acyclic objects would
    otherwise trigger many full collections (seconds) for nothing."""

    def __enter__(self):
        self.was = gc.isenabled()
        gc.disable()

    def __exit__(self, *exc):
        if self.was:
            gc.enable()


# ---- the fast decoder: typed structs from the declarations --------------------------------------

_PY = {"time": float, "int": int, "str": str, "str?": str | None, "enum": str, "req": str}


def _struct(rec: Record, tagged: bool = True) -> type:
    fields = []
    for f in rec.json_fields:
        if f.type == "batch":
            fields.append((f.name, list[_BATCH], msgspec.field(default_factory=list)))
            continue
        typ = _PY[f.type] | None if f.nullable else _PY[f.type]
        fields.append((f.name, typ) if f.required else (f.name, typ, f.default))
    tag = {"tag": rec.type, "tag_field": "type"} if tagged else {}
    return msgspec.defstruct(f"{rec.type.title()}Event", fields, kw_only=True, **tag)


_BATCH = _struct(BATCH, tagged=False)
EVENT_STRUCTS = {_struct(rec): rec for rec in TABLE_EVENTS}
TOP_DECODER = msgspec.json.Decoder(dict[str, msgspec.Raw])
_EVENTS = msgspec.json.Decoder(list[functools.reduce(operator.or_, EVENT_STRUCTS)])  # a tagged union
_KNOWN = {rec.type for rec in TABLE_EVENTS}


def _column(f: Field, evs: list, index_of: dict):
    vals = map(attrgetter(f.name), evs)
    try:
        if f.type == "req":  # ids -> row positions
            lookup = {**index_of, None: -1} if f.nullable else index_of
            return np.fromiter(map(lookup.__getitem__, vals), np.int64, len(evs))
        if f.type in ("time", "int"):
            return np.fromiter(vals, np.float64 if f.type == "time" else np.int64, len(evs))
    except (KeyError, OverflowError):
        raise BadColumn(f) from None
    return list(vals)


def _columns(rec: Record, evs: list, index_of: dict) -> dict:
    return {f.name: _column(f, evs, index_of) for f in rec.json_fields if f.type != "batch"}


def _tables(events: list, other: list, index_of: dict) -> tuple[dict, list]:
    by: dict[type, list] = {cls: [] for cls in EVENT_STRUCTS}
    for e in events:
        by[type(e)].append(e)
    out, n = {}, len(index_of)
    for cls, rec in EVENT_STRUCTS.items():
        out[rec.table] = frame(rec, _columns(rec, by[cls], index_of), n)
        if rec is STEP:
            batches = list(map(attrgetter("batch"), by[cls]))
            cols = _columns(BATCH, list(chain.from_iterable(batches)), index_of)
            cols["step"] = np.repeat(out["steps"]["step"].to_numpy(), list(map(len, batches)))
            out["batch"] = frame(BATCH, cols, n)
    if other:  # verbatim events: the precise checks (they are few, or cheap to check)
        pb = Problems("")
        other = read_events(other, index_of, pb)[1]
        pb.raise_if_any()
    return out, other


class _Type(msgspec.Struct):
    type: str


_TYPES = msgspec.json.Decoder(list[_Type])
_RAWS = msgspec.json.Decoder(list[msgspec.Raw])


def decode_events(raw: bytes) -> tuple[list, list]:
    """(typed table events, verbatim events as dicts) from the raw `events` list."""
    try:
        return _EVENTS.decode(raw), []
    except msgspec.ValidationError:  # e.g. spec or tiles events: set them aside, then decode the rest
        kinds = [e.type in _KNOWN for e in _TYPES.decode(raw)]
        raws = _RAWS.decode(raw)
        events = _EVENTS.decode(b"[" + b",".join(r for r, k in zip(raws, kinds) if k) + b"]")
        return events, [msgspec.json.decode(r) for r, k in zip(raws, kinds) if not k]


def decode_whole(raw, name: str) -> Trace | None:
    """The whole-document fast decoder: the trace in `raw` (all of the uncompressed JSON), or
    None when refused. The streaming decoder's fallback for documents not in its layout."""
    try:
        top = TOP_DECODER.decode(raw)
        events, other = decode_events(top["events"])
        doc = {k: msgspec.json.decode(v) for k, v in top.items() if k != "events"}
    except (msgspec.DecodeError, KeyError, RecursionError, UnicodeDecodeError):
        return None
    doc["events"] = []
    try:
        return trace_from_doc(doc, name, fast_events=lambda index_of: _tables(events, other, index_of))
    except (TraceError, BadColumn, OverflowError):
        return None  # the precise path words the problem (it sees the original events)
