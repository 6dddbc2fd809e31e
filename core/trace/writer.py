"""Writing the columnar Parquet form of a trace (core/trace/parquet.py reads it): the file
layout, derived from schema.py, and the streaming TraceWriter. Free of pandas, so a
simulation streamed into Parquet never imports it.
"""
from __future__ import annotations

import json

import numpy as np

from core.trace.schema import SCHEMA, TABLES

PARQUET_KEY = b"serving-trace"
_ARROW = {"time": "float64", "int": "int64", "req": "int64", "str": "string", "str?": "string", "enum": "string",
          "id": "string"}


def _layout() -> dict[str, str]:
    cols = {"rtype": "string"}
    for rec in TABLES:
        for f in rec.columns:
            assert cols.setdefault(f.column, _ARROW[f.type]) == _ARROW[f.type], f"two types for column {f.column}"
    return cols | {"join": "int64", "json": "string"}   # (join: a file with decode spans, core.trace.spans)


COLUMNS = _layout()                           # column -> Arrow type, in file order
RTYPES = [r.type for r in TABLES] + ["other", "span", "kv_free"]


def dumps_json(x) -> str:
    return json.dumps(x, separators=(",", ":"), allow_nan=False)


ROW_GROUP_ROWS = 1 << 20     # rows per row group (each holds one record type)
_ENUMS = {f.column: f.values for rec in TABLES for f in rec.columns if f.type == "enum"}


class RowTables:
    """Arrow tables in the file layout from rows of one record type (columns named by
    `COLUMNS`; absent ones are null). Values: numpy arrays or lists; an enum column is a
    pandas Categorical or integer codes into the field's values; string columns may hold
    None. Enum columns (and rtype) are dictionary arrays (codes + values): no string per row
    is ever made; Parquet stores them dictionary-encoded either way, and without a stored
    Arrow schema every reader sees plain strings."""

    def __init__(self, null_rows: int = ROW_GROUP_ROWS):
        import pyarrow as pa
        self._pa = pa
        self.types = {c: pa.dictionary(pa.int8(), pa.string()) if c in _ENUMS or c == "rtype" else getattr(pa, t)()
                      for c, t in COLUMNS.items()}
        self.schema = pa.schema(list(self.types.items()))
        self._null_rows = null_rows
        self._null_arrays: dict = {}
        self._zeros = None

    def _array(self, c: str, v) -> list:
        pa, t = self._pa, self.types[c]
        if isinstance(v, pa.ChunkedArray):
            return v.chunks
        if isinstance(v, pa.Array):
            return [v]
        if c in _ENUMS:   # a pandas Categorical (or categorical Series), or integer codes
            if hasattr(v, "cat"):
                v = v.cat.codes
            codes = np.asarray(v.codes if hasattr(v, "codes") else v, dtype=np.int8)
            return [pa.DictionaryArray.from_arrays(_arrow_numbers(pa, codes, pa.int8(), codes < 0),
                                                   _arrow_strings(pa, _ENUMS[c]))]
        if hasattr(v, "to_numpy"):   # a pandas Series
            v = v.to_numpy()
        if COLUMNS[c] == "string":
            return [_arrow_strings(pa, v)]
        a = np.asarray(v, dtype=np.float64 if COLUMNS[c] == "float64" else np.int64)
        return [_arrow_numbers(pa, a, t, np.isnan(a) if a.dtype == np.float64 else None)]

    def _nulls(self, c: str, n: int):
        # Slices of one all-null array per column, all of them over one shared zeroed buffer
        # (calloc'ed by numpy: pages are mapped only when read). Fresh zeroed Arrow buffers
        # per row group, or even per column, cost page faults that dominated writing.
        have = self._null_arrays.get(c)
        if have is None or len(have) < n:
            pa, t = self._pa, self.types[c]
            size = max(n, 2 * self._null_rows)
            if self._zeros is None or len(self._zeros) < 8 * (size + 1):
                self._zeros = np.zeros(8 * (size + 1), dtype=np.uint8)
                self._null_arrays = {}
            z = pa.py_buffer(self._zeros)
            if pa.types.is_dictionary(t):
                idx = pa.Array.from_buffers(pa.int8(), size, [z, z], null_count=size)
                have = pa.DictionaryArray.from_arrays(idx, _arrow_strings(pa, []))
            elif pa.types.is_string(t):
                have = pa.Array.from_buffers(t, size, [z, z, z], null_count=size)
            else:
                have = pa.Array.from_buffers(t, size, [z, z], null_count=size)
            self._null_arrays[c] = have
        return have.slice(0, n)

    def table(self, rtype: str, parts: list[dict]):
        """One table of `rtype` rows from parts (dicts of columns), in order."""
        pa = self._pa
        lens = [len(next(iter(p.values()))) if p else 0 for p in parts]
        n = sum(lens)
        arrays = [pa.chunked_array([pa.DictionaryArray.from_arrays(
            _arrow_numbers(pa, np.zeros(n, np.int8), pa.int8()), _arrow_strings(pa, [rtype]))])]
        for c in list(COLUMNS)[1:]:
            t = self.types[c]
            if not any(c in p for p in parts):
                arrays.append(self._nulls(c, n))
            else:
                arrays.append(pa.chunked_array([a for p, k in zip(parts, lens)
                                                for a in (self._array(c, p[c]) if c in p else [self._nulls(c, k)])], t))
        return pa.Table.from_arrays(arrays, schema=self.schema)


def head_bytes(meta: dict, extra: dict | None = None) -> bytes:
    """The document head a Parquet trace carries under PARQUET_KEY."""
    return json.dumps({"schema": SCHEMA, "meta": meta, "extra": extra or {}}, allow_nan=False).encode()


class TraceWriter:
    """Writes a trace into one Parquet file as its rows arrive, holding at most about one
    row group per record type in memory: `add(rtype, columns)` any number of times, in any
    order of record types (rows of one type in trace order), then `close(meta)`. The head
    (schema, meta, extra) goes into the file's key-value metadata at close, so a run's
    statistics known only at its end are in it. Row groups are encoded and compressed on a
    background thread (pyarrow releases the GIL), so a simulation keeps stepping meanwhile.
    Columns and values: as RowTables."""

    def __init__(self, sink, row_group_rows: int = ROW_GROUP_ROWS, background: bool = True):
        import pyarrow.parquet as pq
        self._tables = RowTables(row_group_rows)
        # rtype statistics let a reader fetch one record type's row groups; other statistics
        # are not read and cost time
        self._w = pq.ParquetWriter(sink, self._tables.schema, compression="lz4",
                                   write_statistics=["rtype"], store_schema=False)
        self.row_group_rows = row_group_rows
        self._buf: dict[str, list[dict]] = {}
        self._rows: dict[str, int] = {}
        self.rows = 0                           # rows added so far
        self.counts: dict[str, int] = {}        # ... per record type
        self._pool = None
        if background:
            from concurrent.futures import ThreadPoolExecutor
            self._pool = ThreadPoolExecutor(1, thread_name_prefix="trace-writer")
        self._pending = []

    def add(self, rtype: str, cols: dict):
        n = len(next(iter(cols.values()))) if cols else 0
        if not n:
            return
        self._buf.setdefault(rtype, []).append(cols)
        self._rows[rtype] = self._rows.get(rtype, 0) + n
        self.rows += n
        self.counts[rtype] = self.counts.get(rtype, 0) + n
        if self._rows[rtype] >= self.row_group_rows:
            self._flush(rtype, whole_groups=True)

    def _flush(self, rtype: str, whole_groups: bool = False):
        parts = self._buf.pop(rtype, [])
        n = self._rows.pop(rtype, 0)
        if not n:
            return
        t = self._tables.table(rtype, parts)
        rg = self.row_group_rows
        cut = n - n % rg if whole_groups else n
        if cut < n:  # keep the remainder for the next row group
            rest = t.slice(cut)
            self._buf[rtype] = [{c: rest.column(c) for c in COLUMNS
                                 if c != "rtype" and rest.column(c).null_count < len(rest)}]
            self._rows[rtype] = n - cut
            t = t.slice(0, cut)
        self._submit(t)

    def _submit(self, t):
        if self._pool is None:
            self._w.write_table(t, row_group_size=self.row_group_rows)
            return
        while self._pending and (self._pending[0].done() or len(self._pending) >= 2):
            self._pending.pop(0).result()   # bounded memory; re-raises a write error here
        self._pending.append(self._pool.submit(self._w.write_table, t, row_group_size=self.row_group_rows))

    def abort(self):
        """Stop without a usable file (the caller removes it)."""
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
        self._w.close()

    def close(self, meta: dict, extra: dict | None = None):
        try:
            for rtype in [r for r in RTYPES if r in self._buf]:
                self._flush(rtype)
            if not self.rows:  # a file needs at least one row group to carry the layout
                self._submit(self._tables.table("request", [{}]).slice(0, 0))
            for f in self._pending:
                f.result()
            self._w.add_key_value_metadata({PARQUET_KEY: head_bytes(meta, extra)})
        finally:
            if self._pool is not None:
                self._pool.shutdown(wait=True, cancel_futures=True)
            self._w.close()


def request_extras(workload) -> list[dict]:
    """Per request, the fields a trace keeps beside its columns: unknown fields (verbatim), then
    the optional fields that are set (Request.options; the tenant is a column)."""
    extras = []
    for r in workload.requests:
        e = dict(r.extra) if r.extra else {}
        e.update(r.options(skip=("tenant",)))
        extras.append(e)
    return extras


def workload_request_rows(workload) -> dict:
    """A workload's request rows in the file layout, straight from its columns."""
    cols = {"id": workload.ids, "t_ms": workload.arrival_ms, "prompt_tokens": workload.prompt_tokens,
            "max_output_tokens": workload.max_output_tokens}
    if not workload.plain:
        cols["tenant"] = [r.tenant for r in workload.requests]
        cols["json"] = [dumps_json(e) if e else None for e in request_extras(workload)]
    return cols


# Arrow arrays built from buffers: pa.array() imports pandas to inspect its argument (about
# 0.4 s, a third of a 10k-request simulation run from the command line).
def _validity(pa, missing):
    if missing is None or not missing.any():
        return None
    return pa.py_buffer(np.packbits(~missing, bitorder="little"))


def _arrow_numbers(pa, a: np.ndarray, t, missing=None):
    a = np.ascontiguousarray(a)
    return pa.Array.from_buffers(t, len(a), [_validity(pa, missing), pa.py_buffer(a)])


def _arrow_strings(pa, values):
    """UTF-8 strings (None: null), from one joined buffer and its offsets."""
    values = values.tolist() if isinstance(values, np.ndarray) else list(values)
    missing = np.fromiter((x is None for x in values), dtype=bool, count=len(values))
    data = [x.encode() if x is not None else b"" for x in values]
    offsets = np.zeros(len(data) + 1, dtype=np.int64)
    np.cumsum(np.fromiter(map(len, data), dtype=np.int64, count=len(data)), out=offsets[1:])
    t = pa.string() if offsets[-1] < 2 ** 31 else pa.large_string()
    arr = pa.Array.from_buffers(t, len(data), [_validity(pa, missing),
                                               pa.py_buffer(offsets.astype(np.int32 if t == pa.string() else np.int64)),
                                               pa.py_buffer(b"".join(data))])
    return arr if t == pa.string() else arr.cast(pa.string())
