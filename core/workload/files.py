"""Workload files in other simulators' formats, read column-wise (pyarrow) into
`Workload.from_columns`, with the row-by-row readers as the reference reading and the one
that words the error for a bad file:
- Vidur-style CSV: arrived_at (seconds), num_prefill_tokens, num_decode_tokens;
- LLMServingSim-style JSONL: input_toks, output_toks, arrival_time_ns.
`core.workload.parse_workload` chooses the format.
"""
from __future__ import annotations

import csv
import io
import json

import numpy as np

from core.errors import WorkloadError, loads_json, short
from core.workload.model import Request, Workload, count_value, first_bad_row, located


def _vidur_csv_rows(text: str, name: str) -> Workload:
    # Row by row: the reference reading, and the one that words the error for a bad file.
    reader = csv.DictReader(io.StringIO(text))
    _vidur_header(reader.fieldnames, name)
    out = []
    for i, row in enumerate(reader):
        where = f"{name} row {i + 2}"  # +1 header, +1 one-based
        try:
            arrived_s = _as_float(row["arrived_at"], f"{where}.arrived_at")
            out.append(Request(
                id=str(row.get("id") or row.get("request_id") or i),
                arrival_ms=arrived_s * 1000.0 if isinstance(arrived_s, (int, float)) else arrived_s,
                prompt_tokens=count_value(row["num_prefill_tokens"], f"{where}.num_prefill_tokens"),
                max_output_tokens=count_value(row["num_decode_tokens"], f"{where}.num_decode_tokens")))
        except WorkloadError as e:
            raise located(where, e) from None
    return Workload(out, name=name)


def _llmservingsim_jsonl_rows(text: str, name: str) -> Workload:
    # Line by line: the reference reading, and the one that words the error for a bad file.
    out = []
    for i, line in enumerate(text.splitlines()):
        if not line.strip():
            continue
        where = f"{name} line {i + 1}"
        try:
            d = loads_json(line, where, WorkloadError)
        except json.JSONDecodeError as e:
            raise WorkloadError(f"{where}: not JSON ({e.msg})") from None
        if not isinstance(d, dict):
            raise WorkloadError(f"{where}: expected an object")
        for k in ("input_toks", "output_toks", "arrival_time_ns"):
            if k not in d:
                raise WorkloadError(f"{where}: missing {k}")
        try:
            t_ns = _as_float(d["arrival_time_ns"], f"{where}.arrival_time_ns")
            out.append(Request(
                id=str(d.get("id", len(out))),
                arrival_ms=t_ns / 1e6 if isinstance(t_ns, (int, float)) and not isinstance(t_ns, bool) else t_ns,
                prompt_tokens=count_value(d["input_toks"], f"{where}.input_toks"),
                max_output_tokens=count_value(d["output_toks"], f"{where}.output_toks")))
        except WorkloadError as e:
            raise located(where, e) from None
    return Workload(out, name=name)


VIDUR_COLUMNS = ("arrived_at", "num_prefill_tokens", "num_decode_tokens")
LLMSERVINGSIM_KEYS = ("input_toks", "output_toks", "arrival_time_ns")


def _vidur_header(fields, name):
    missing = [c for c in VIDUR_COLUMNS if c not in (fields or [])]
    if missing:
        raise WorkloadError(f"{name}: CSV is missing column(s) {', '.join(missing)} "
                            f"(expected Vidur-style {','.join(VIDUR_COLUMNS)})")


def _lines(text: str):
    # Lines with their ends, split on "\n" only (as io.StringIO does), without copying the text.
    start, n = 0, len(text)
    while start < n:
        end = text.find("\n", start)
        end = n if end < 0 else end + 1
        yield text[start:end]
        start = end


def _f64(col) -> np.ndarray:
    # A null-free float64 pyarrow column as numpy, chunk by chunk: ChunkedArray.to_numpy and
    # Array.to_numpy import pandas (~0.4 s) just to look for it.
    parts = [np.frombuffer(ch.buffers()[1], dtype=np.float64, count=len(ch), offset=ch.offset * 8)
             for ch in col.chunks]
    return parts[0] if len(parts) == 1 else np.concatenate(parts)


def _strs(col) -> list[str]:
    return [v for ch in col.chunks for v in ch.to_pylist()]


def from_vidur_csv(text: str, name: str) -> Workload:
    """Column-wise (pyarrow.csv, numpy checks); any file the fast path does not take whole (a
    bad value, odd quoting or row shape) is read row by row, which words the error."""
    fields = csv.DictReader(_lines(text)).fieldnames
    _vidur_header(fields, name)
    w = _vidur_csv_columns(text, name, fields)
    return w if w is not None else _vidur_csv_rows(text, name)


def _vidur_csv_columns(text: str, name: str, fields: list[str]) -> Workload | None:
    import pyarrow as pa
    import pyarrow.csv as pa_csv
    if len(set(fields)) != len(fields):
        return None  # a repeated column name: csv.DictReader's last-one-wins is the rule
    ids_from = [c for c in ("id", "request_id") if c in fields]
    types = {c: pa.float64() for c in VIDUR_COLUMNS} | {c: pa.string() for c in ids_from}
    try:
        t = pa_csv.read_csv(pa.py_buffer(text.encode()), convert_options=pa_csv.ConvertOptions(
            column_types=types, include_columns=list(types), strings_can_be_null=False))
    except (pa.ArrowException, ValueError):
        return None
    if t.num_rows == 0 or any(t.column(c).null_count for c in types):
        return None
    with np.errstate(over="ignore", invalid="ignore"):
        a = _f64(t.column("arrived_at")) * 1000.0
    p, o = _f64(t.column("num_prefill_tokens")), _f64(t.column("num_decode_tokens"))
    if first_bad_row(a, p, o) is not None:
        return None
    ids = None
    if ids_from:  # id, else request_id, else the row number (as `row.get("id") or ...` reads)
        cols = [_strs(t.column(c)) for c in ids_from]
        ids = [x or (y if len(cols) > 1 else "") or str(i)
               for i, (x, y) in enumerate(zip(cols[0], cols[-1]))]
    return Workload._checked(ids, a, p.astype(np.int64), o.astype(np.int64), name)


# Characters that str.splitlines() also breaks lines at and that may stand in a JSON string
# (ASCII ones, \x0b \x0c \x1c-\x1e, are refused by pyarrow as by json).
_UNICODE_LINE_BREAKS = ("\x85", "\u2028", "\u2029")
_JSONL_WHITESPACE = bytes.maketrans(b"\r", b"\n")  # a lone \r ends a line for splitlines()


def from_llmservingsim_jsonl(text: str, name: str) -> Workload:
    """Column-wise (pyarrow.json, numpy checks) for flat one-object-a-line files; anything else
    (a bad value, a nested or odd line) is read line by line, which words the error."""
    w = _llmservingsim_jsonl_columns(text, name)
    return w if w is not None else _llmservingsim_jsonl_rows(text, name)


def _flat_object_lines(data: bytes) -> int | None:
    """The number of non-blank lines when each is one flat JSON object (see below), else None."""
    # The line-by-line reading needs exactly one object on each non-blank line; pyarrow reads any
    # whitespace-separated run of objects. Take only files whose lines, JSON whitespace dropped
    # and blank lines merged, are each "{...}" with that one "{" (flat objects, no arrays): an
    # object over two lines would then hold "}" then "{", which pyarrow refuses, so pyarrow's
    # rows are the file's lines. json refuses NaN and Infinity, pyarrow does not.
    c = data.translate(_JSONL_WHITESPACE, b" \t")
    while b"\n\n" in c:
        c = c.replace(b"\n\n", b"\n")
    c = c.strip(b"\n")
    n = c.count(b"\n") + 1
    if not (c[:1] == b"{" and c[-1:] == b"}" and c.count(b"{") == n and c.count(b"\n{") == n - 1
            and c.count(b"}\n") == n - 1 and b"[" not in c and b"NaN" not in c and b"Inf" not in c):
        return None
    return n


def _jsonl_ids(t, n: int, text: str) -> tuple[bool, list[str] | None]:
    """(whether the column-wise reading decides the ids, the ids: None for row numbers)."""
    id_nulls = t.column("id").null_count
    if id_nulls == 0:
        return True, _strs(t.column("id"))
    if id_nulls == n and '"id"' not in text and "\\u" not in text:  # (no key spelled "\\u0069d")
        return True, None  # str(len(out)): the row number among non-blank lines
    return False, None  # some ids missing or null (str(None) is "None"): the line-by-line rule decides


def _llmservingsim_jsonl_columns(text: str, name: str) -> Workload | None:
    import pyarrow as pa
    import pyarrow.json as pa_json
    data = text.encode()
    if not data.isascii() and any(c in text for c in _UNICODE_LINE_BREAKS):
        return None
    n = _flat_object_lines(data)
    if n is None:
        return None
    f64 = pa.float64()
    schema = pa.schema([(k, f64) for k in LLMSERVINGSIM_KEYS] + [("id", pa.string())])
    try:
        t = pa_json.read_json(pa.py_buffer(data), parse_options=pa_json.ParseOptions(
            explicit_schema=schema, unexpected_field_behavior="ignore"))
    except (pa.ArrowException, ValueError):
        return None
    if t.num_rows != n or any(t.column(k).null_count for k in LLMSERVINGSIM_KEYS):
        return None
    with np.errstate(over="ignore", invalid="ignore"):
        a = _f64(t.column("arrival_time_ns")) / 1e6
    p, o = _f64(t.column("input_toks")), _f64(t.column("output_toks"))
    if first_bad_row(a, p, o) is not None:
        return None
    decided, ids = _jsonl_ids(t, n, text)
    if not decided:
        return None
    return Workload._checked(ids, a, p.astype(np.int64), o.astype(np.int64), name)


def _as_float(v, what):
    if isinstance(v, str):
        try:
            return float(v)
        except ValueError:
            raise WorkloadError(f"{what}: expected a number, got {short(v)}") from None
    return v


def parse_token_ids(text: str, what: str = "token ids") -> list[int]:
    """'10, 11,12 13' -> [10, 11, 12, 13]; a clear error names the bad item."""
    items = [x for x in text.replace(",", " ").split() if x]
    if not items:
        raise WorkloadError(f"{what}: expected token ids like 10,11,12")
    out = []
    for x in items:
        try:
            v = int(x)
        except ValueError:
            raise WorkloadError(f"{what}: {x!r} is not an integer token id") from None
        if not 0 <= v < 2**31:
            raise WorkloadError(f"{what}: token ids must be in 0..{2**31 - 1:,}, got {short(x)}")
        out.append(v)
    return out
