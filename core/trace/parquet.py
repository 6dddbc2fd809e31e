"""The columnar Parquet form of a trace (for large traces), derived from schema.py.

One Parquet table, one row per record, `rtype` naming the record: request, token, finish,
step, batch (one per (step, request) entry), kv, preempt, other (an event kept verbatim,
as JSON in the `json` column). Each declared column field is one column (the union over
records; `req` holds the request's row position, a request's arrival is in `t_ms`, its
extra fields are JSON in `json`); columns a record does not use are null. The document's
schema, meta and unknown top-level fields are JSON in the file's key-value metadata
under "serving-trace". Lossless with the JSON form.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd

from core.errors import TraceError, loads_json, short
from core.trace.model import BadColumn, Trace, frame
from core.trace.schema import BATCH, KV, REQUEST, SCHEMA, TABLE_EVENTS, TABLES, TOKEN, Field, Record
from core.trace.spans import FREE_COLUMNS, SPAN_COLUMNS, check_frees, check_spans, expand, kv_with_frees
from core.trace.validate import Problems, check_consistency, check_meta, read_events
from core.trace.writer import (
    COLUMNS,
    PARQUET_KEY,
    ROW_GROUP_ROWS,
    RTYPES,
    RowTables,
    TraceWriter,
    dumps_json,
    head_bytes,
)

_NEEDED = {"rtype", "json"} | {f.column for r in TABLES for f in r.columns if f.required}


def is_parquet(data: bytes) -> bool:
    return data[:4] == b"PAR1"


def request_columns(trace_requests: pd.DataFrame, request_extra: list) -> dict:
    """The request rows in the file layout (extra fields as JSON in `json`)."""
    cols = {f.column: trace_requests[f.name] for f in REQUEST.columns}
    extras = [dumps_json(e) if e else None for e in request_extra]
    cols["json"] = extras + [None] * (len(trace_requests) - len(extras))
    return cols


def _trace_rows(trace: Trace):
    """(record type, columns in the file layout) for each record type, requests first."""
    yield "request", request_columns(trace.requests, trace.request_extra)
    for rec in TABLES[1:]:
        df = getattr(trace, rec.table)
        yield rec.type, {f.column: df[f.name] for f in rec.columns}
    if trace.other:
        yield "other", {"t_ms": np.array([float(e.get("t_ms", 0.0)) for e in trace.other]),
                        "json": [dumps_json(e) for e in trace.other]}


def write_trace(trace: Trace, sink, row_group_rows: int = ROW_GROUP_ROWS):
    """The whole trace through a TraceWriter: each record type in its own row groups."""
    w = TraceWriter(sink, row_group_rows, background=False)
    try:
        for rtype, cols in _trace_rows(trace):
            w.add(rtype, cols)
    except BaseException:
        w.abort()
        raise
    w.close(trace.meta, trace.extra)


def to_table(trace: Trace):
    """The whole trace as one Arrow table in the file layout (plain string columns), the
    document head in its metadata."""
    import pyarrow as pa
    tb = RowTables()
    t = pa.concat_tables([tb.table(rtype, [cols]) for rtype, cols in _trace_rows(trace)
                          if rtype == "request" or len(next(iter(cols.values())))])
    plain = pa.schema([(c, getattr(pa, typ)()) for c, typ in COLUMNS.items()],
                      metadata={PARQUET_KEY: head_bytes(trace.meta, trace.extra)})
    return t.cast(plain)


def to_parquet_bytes(trace: Trace) -> bytes:
    """One file; each record type is written as its own row groups, so a reader can fetch a
    record type's rows and only its columns (row-group statistics name the type)."""
    import pyarrow as pa
    buf = pa.BufferOutputStream()
    write_trace(trace, buf)
    return buf.getvalue().to_pybytes()


PART_ROWS = 1_000_000   # rows per part of a partitioned trace


def write_parquet_parts(trace: Trace, directory: str | Path, rows_per_part: int = PART_ROWS) -> list[Path]:
    """The trace as a directory of Parquet parts (part-00000.parquet, ...): the same table as
    one file, cut every `rows_per_part` rows, each part carrying the same head metadata, so a
    dataset reader (pyarrow.dataset, DuckDB's read_parquet('dir/*.parquet')) can scan it
    column by column and `open_trace(directory)` reassembles the trace."""
    import pyarrow.parquet as pq
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    t = to_table(trace)
    paths = []
    for k, start in enumerate(range(0, max(len(t), 1), rows_per_part)):
        part = d / f"part-{k:05d}.parquet"
        pq.write_table(t.slice(start, rows_per_part), part, compression="zstd")
        paths.append(part)
    return paths




def _arrow(data: bytes, name: str):
    import pyarrow as pa
    import pyarrow.parquet as pq
    try:
        return pq.read_table(pa.BufferReader(data))
    except Exception as e:  # pyarrow raises many types for corrupt files
        raise TraceError(f"{name}: not a readable Parquet file ({type(e).__name__}: {str(e)[:120]})") from None


def _checked(t, name: str, head: dict | None = None):
    """The Arrow table with every column of the layout, and the document head (checked here unless given)."""
    import pyarrow as pa
    head = _head(t.schema, name) if head is None else head
    missing = [c for c in COLUMNS if c not in t.column_names]
    if set(missing) & _NEEDED:
        raise TraceError(f"{name}: Parquet table lacks column(s) {', '.join(sorted(set(missing) & _NEEDED))}")
    check_column_types(t.schema, name)
    for c in missing:  # an optional field newer than the file: all absent
        t = t.append_column(c, pa.nulls(len(t), getattr(pa, COLUMNS[c])()))
    # one by one, to name the column (e.g. a uint64 beyond int64)
    return pa.table([_cast(t.column(c), c, name) for c in COLUMNS], names=list(COLUMNS)), head


def _stored_as(t) -> str | None:
    """What an Arrow type stores, as the layout's types go: "string", "number", "null" (all null), or None."""
    import pyarrow as pa
    if pa.types.is_dictionary(t):
        t = t.value_type
    if pa.types.is_null(t):
        return "null"
    string_view = getattr(pa.types, "is_string_view", lambda _: False)     # (pyarrow >= 16)
    if pa.types.is_string(t) or pa.types.is_large_string(t) or string_view(t):
        return "string"
    if pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_decimal(t):
        return "number"
    return None


_HINTS = {"rtype": " (each row's record type by name: request, token, ...)", "json": " (JSON text)"}


def check_column_types(schema, name: str):
    """The declared type of every layout column the file has (its schema: the footer, no row read) holds
    what the layout's type does: text for a string column, numbers (any integer, floating or decimal
    type; the values are checked when cast) for a numeric one, or only nulls. Anything else (rtype as
    integers, a list, a struct, booleans, numbers as text) is refused naming the column, by both readers,
    before a row is read (out of core: before DuckDB compares a value)."""
    for field in schema:
        want = COLUMNS.get(field.name)
        if want is None:
            continue
        got = _stored_as(field.type)
        if got != "null" and got != ("string" if want == "string" else "number"):
            raise TraceError(f"{name}: column {field.name}: stored as {field.type}, expected {want}"
                             f"{_HINTS.get(field.name, '')}")


def _cast(col, c: str, name: str):
    """Column `c` in the layout's Arrow type, or a TraceError naming it."""
    import pyarrow as pa
    try:
        return col.cast(getattr(pa, COLUMNS[c])())
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError) as e:
        raise TraceError(f"{name}: column {c}: does not hold {COLUMNS[c]} ({str(e)[:120]})") from None


def _head(schema, name: str) -> dict:
    """The document head in the file's metadata, checked."""
    md = schema.metadata or {}
    if PARQUET_KEY not in md:
        raise TraceError(f"{name}: Parquet file without serving-trace metadata (not written by this tool?)")
    from core.trace.jsoncodec import parse_json_text
    try:   # (nested past MAX_JSON_DEPTH: refused in one line naming how deep, before any recursive parser sees it)
        head = parse_json_text(md[PARQUET_KEY], f"{name}: serving-trace metadata", TraceError)
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise TraceError(f"{name}: broken serving-trace metadata in the Parquet file") from None
    if not isinstance(head, dict) or head.get("schema") != SCHEMA:
        got = head.get("schema") if isinstance(head, dict) else None
        raise TraceError(f"{name}: schema: unknown version {got!r}; this build reads {SCHEMA!r}")
    if not isinstance(head.get("meta"), dict):
        raise TraceError(f"{name}: meta: expected an object with at least 'source'")
    check_meta(head["meta"], name)
    return head


class Rows:
    """The rows of one record type, column by column, straight from Arrow."""

    def __init__(self, t, rt: np.ndarray, rtype: str, name: str):
        import pyarrow as pa
        self.pa, self.name, self.rtype = pa, name, rtype
        sel = np.flatnonzero(rt == RTYPES.index(rtype))
        self.n = len(sel)
        names = set(t.column_names)   # (a column absent from `t`: all null)
        # Our writer keeps each record type contiguous: slice (zero-copy) instead of take.
        if self.n and sel[-1] - sel[0] + 1 == self.n:
            pick = lambda col: col.slice(int(sel[0]), self.n)
        else:
            pick = lambda col: col.take(pa.array(sel))
        self.col = lambda c: pick(t.column(c)) if c in names else pa.nulls(self.n, getattr(pa, COLUMNS[c])())

    @classmethod
    def of_table(cls, t, rtype: str, name: str) -> Rows:
        """The rows of one record type read on their own (only its columns): a column absent
        from the file is all null; each is cast to the layout's type, naming it if it cannot be."""
        import pyarrow as pa
        self = cls.__new__(cls)
        self.pa, self.name, self.rtype = pa, name, rtype
        self.n = 0 if t is None else len(t)

        def col(c):
            if t is None or c not in t.column_names:
                return pa.nulls(self.n, getattr(pa, COLUMNS[c])())
            return _cast(t.column(c), c, name)
        self.col = col
        return self

    def field(self, f: Field):
        """The field's values as numpy (or a Categorical); nulls become its fill value."""
        pa = self.pa
        col = self.col(f.column)
        if col.null_count:
            if f.required:
                raise TraceError(f"{self.name}: {self.rtype} records: {f.name} missing")
            if f.fill is not None:
                col = col.fill_null(pa.scalar(f.fill, col.type))
        if f.type == "enum":
            if not self.n:
                return pd.Categorical([], categories=list(f.values))
            d = col.combine_chunks().dictionary_encode()
            values = d.dictionary.to_pylist()
            if not set(values) <= set(f.values):
                raise TraceError(f"{self.name}: {self.rtype} records: {f.name}: expected {f.expect}")
            remap = np.array([f.values.index(v) for v in values], dtype=np.int64)
            return pd.Categorical.from_codes(remap[d.indices.to_numpy(zero_copy_only=False)],
                                             categories=list(f.values))
        return col.to_numpy(zero_copy_only=False)

    def frame(self, rec: Record, n_requests: int) -> pd.DataFrame:
        try:
            return frame(rec, {f.name: self.field(f) for f in rec.columns}, n_requests)
        except BadColumn as e:
            raise TraceError(f"{self.name}: {self.rtype} records: {e}") from None

    def json(self, null_ok: bool = False, first: int = 0) -> list[dict]:
        """The `json` column parsed: objects (null_ok: {} for a null); else a TraceError naming
        the record (its position among the records of its type; these rows start at `first`)."""
        out = []
        for k, x in enumerate(self.col("json").to_pylist(), first):
            at = f"{self.name}: {self.rtype} record {k}: json"
            if x is None and null_ok:
                out.append({})
                continue
            try:
                v = loads_json(x, at, TraceError)
            except (TypeError, json.JSONDecodeError):
                raise TraceError(f"{at}: not valid JSON") from None
            if not isinstance(v, dict):
                raise TraceError(f"{at}: expected an object, got {short(v)}")
            out.append(v)
        return out


def _record_columns(rtype: str) -> list[str]:
    if rtype == "other":
        return ["t_ms", "json"]
    if rtype == "span":
        return list(SPAN_COLUMNS)
    if rtype == "kv_free":
        return list(FREE_COLUMNS)
    rec = next(r for r in TABLES if r.type == rtype)
    keyed = {"token": ["step", "join"], "batch": ["join"]}.get(rtype, [])   # (among decode spans)
    return list(dict.fromkeys([f.column for f in rec.columns] + (["json"] if rec is REQUEST else []) + keyed))


def _row_groups_by_type(pf) -> dict[str, list[int]] | None:
    """Row groups per record type when every row group holds one type (our writer's layout,
    told by the rtype column's statistics); None otherwise (then the whole table is read)."""
    md = pf.metadata
    names = pf.schema_arrow.names
    if "rtype" not in names:
        return None
    col = names.index("rtype")
    groups: dict[str, list[int]] = {}
    for i in range(md.num_row_groups):
        st = md.row_group(i).column(col).statistics
        if st is None or not st.has_min_max or st.null_count or st.min != st.max or st.min not in RTYPES:
            return None
        groups.setdefault(st.min, []).append(i)
    return groups


def trace_from_parquet(data: bytes, name: str = "trace.parquet") -> Trace:
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq
    try:
        pf = pq.ParquetFile(pa.BufferReader(data), read_dictionary=["rtype"])
        groups = _row_groups_by_type(pf)
    except Exception as e:  # pyarrow raises many types for corrupt files
        raise TraceError(f"{name}: not a readable Parquet file ({type(e).__name__}: {str(e)[:120]})") from None
    # the head and the declared columns, from the footer, before a row is read (a hostile head never reaches
    # pyarrow's readers and their thread pool)
    head = _head(pf.schema_arrow, name)
    present = set(pf.schema_arrow.names)
    missing = sorted(_NEEDED - present)
    if missing:
        raise TraceError(f"{name}: Parquet table lacks column(s) {', '.join(missing)}")
    check_column_types(pf.schema_arrow, name)
    if groups is None:
        return _trace_from_table(*_checked(_arrow(data, name), name, head), name)
    rows = {}
    for r in RTYPES:
        try:
            t = pf.read_row_groups(groups[r], columns=["rtype"] + [c for c in _record_columns(r) if c in present]) \
                if r in groups else None
        except Exception as e:
            raise TraceError(f"{name}: not a readable Parquet file ({type(e).__name__}: {str(e)[:120]})") from None
        # statistics are what the file claims; the rows must agree (rtype is read as a dictionary: cheap)
        if t is not None and pc.unique(t.column("rtype")).to_pylist() != [r]:
            raise TraceError(f"{name}: row groups claim {r} records but hold other record types")
        rows[r] = Rows.of_table(t, r, name)
    return trace_from_rows(rows, head, name)


def trace_from_parquet_dir(directory: str | Path) -> Trace:
    """A directory of Parquet parts written by write_parquet_parts, as one trace. Every part
    must carry the same head (schema, meta); parts are read in name order, each bounded like
    any input file."""
    import pyarrow as pa

    from core.errors import read_input_file
    d = Path(directory)
    parts = sorted(p for p in d.glob("*.parquet") if p.is_file())
    if not parts:
        raise TraceError(f"{d.name}: a directory without .parquet parts")
    tables, head, checked = [], None, None
    for p in parts:
        data = read_input_file(p, "trace part", TraceError)
        if checked is None:      # the head from the first part's footer, before a row is read
            checked = _head(_footer_schema(data, f"{d.name}/{p.name}"), d.name)
        t = _arrow(data, f"{d.name}/{p.name}")
        h = (t.schema.metadata or {}).get(PARQUET_KEY)
        if head is None:
            head = h
        elif h != head:
            raise TraceError(f"{d.name}/{p.name}: a part of a different trace (its metadata differs from "
                             f"{parts[0].name}'s)")
        tables.append(t)
    try:
        t = pa.concat_tables(tables)
    except pa.ArrowInvalid as e:
        raise TraceError(f"{d.name}: parts with different columns ({str(e)[:120]})") from None
    return _trace_from_table(*_checked(t, d.name, checked), d.name)


def _footer_schema(data: bytes, name: str):
    """The Arrow schema (with the head in its metadata) from a Parquet file's footer, no row read."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    try:
        return pq.ParquetFile(pa.BufferReader(data)).schema_arrow
    except Exception as e:  # pyarrow raises many types for corrupt files
        raise TraceError(f"{name}: not a readable Parquet file ({type(e).__name__}: {str(e)[:120]})") from None


def _trace_from_table(t, head: dict, name: str) -> Trace:
    import pyarrow as pa
    import pyarrow.compute as pc
    rtype = t.column("rtype")
    if rtype.null_count:
        raise TraceError(f"{name}: a row has no record type (rtype)")
    idx = pc.index_in(rtype, value_set=pa.array(RTYPES))
    if idx.null_count:
        raise TraceError(f"{name}: unknown record type in column rtype")
    rt = idx.to_numpy(zero_copy_only=False).astype(np.int64)
    return trace_from_rows({r: Rows(t, rt, r, name) for r in RTYPES}, head, name)


def _request_extras(rows: Rows, name: str, first: int = 0) -> list[dict]:
    """The request records' extra fields; extras never shadow a column (the JSON form would let them)."""
    if rows.col("json").null_count == rows.n:
        return [{} for _ in range(rows.n)]
    extras = rows.json(null_ok=True, first=first)
    columns = {f.name for f in REQUEST.columns}
    for k, x in enumerate(extras, first):
        clash = sorted(set(x) & columns) if x else ()
        if clash:
            raise TraceError(f"{name}: request record {k}: json: {clash[0]!r} is a request column, "
                             "not an extra field")
    return extras


def _other_records(rows: Rows, name: str, first: int = 0) -> list[dict]:
    """The verbatim events (the `other` records), none of a type that has its own records."""
    other = rows.json(first=first)
    tabled = {rec.type for rec in TABLE_EVENTS}
    for k, e in enumerate(other, first):
        if e.get("type") in tabled:
            raise TraceError(f"{name}: other record {k}: a {e['type']} event belongs in its own records")
    return other


def _checked_other(other: list, index_of: dict, name: str) -> list:
    """The verbatim events checked as the JSON form's are (their times, requests and enums)."""
    pb = Problems(name)
    other = read_events(other, index_of, pb, "other record")[1]
    pb.raise_if_any()
    return other


def trace_from_rows(rows: dict, head: dict, name: str) -> Trace:
    requests = rows["request"].frame(REQUEST, 0)
    extras = _request_extras(rows["request"], name)
    tables = {rec.table: rows[rec.type].frame(rec, len(requests)) for rec in TABLES if rec is not REQUEST}
    if "span" in rows and rows["span"].n:
        tables["tokens"], tables["batch"] = _with_spans(rows, tables, requests, name)
    if "kv_free" in rows and rows["kv_free"].n:
        tables["kv"] = _with_frees(rows, tables["kv"], len(requests), name)
    other = _checked_other(_other_records(rows["other"], name), {rid: j for j, rid in
                                                                 enumerate(requests["id"].tolist())}, name)
    pb = Problems(name)
    check_consistency(pb, requests, tables["tokens"], np.arange(len(tables["tokens"])),
                      tables["finishes"], np.arange(len(tables["finishes"])))
    pb.raise_if_any()
    extra = head.get("extra") if isinstance(head.get("extra"), dict) else {}
    return Trace(meta=head["meta"], requests=requests, **tables, other=other, request_extra=extras, extra=extra)


def _listed(rows: Rows, df: pd.DataFrame, keys: tuple, name: str) -> dict:
    """A file with decode spans: its listed token or batch rows as columns (enum codes), with the
    step and join numbers that place them among the spans."""
    cols = {c: (np.asarray(df[c].array.codes, dtype=np.int8) if isinstance(df[c].dtype, pd.CategoricalDtype)
                else df[c].to_numpy()) for c in df.columns}
    for c in keys:
        col = rows.col(c)
        if col.null_count:
            raise TraceError(f"{name}: {rows.rtype} records of a file with decode spans: {c} missing")
        cols[c] = col.to_numpy(zero_copy_only=False).astype(np.int64)
    return cols


def _with_spans(rows: dict, tables: dict, requests: pd.DataFrame, name: str):
    """The token and batch tables of a file with decode spans (core.trace.spans), expanded."""
    sp = rows["span"]
    span = {c: sp.col(c) for c in SPAN_COLUMNS}
    check_spans(span, len(requests), requests["max_output_tokens"].to_numpy(), name)
    span = {c: v.to_numpy(zero_copy_only=False).astype(np.int64) for c, v in span.items()}
    tok = _listed(rows["token"], tables["tokens"], ("step", "join"), name)
    if (tok.pop("replica") != 0).any():
        raise TraceError(f"{name}: decode spans in a fleet trace (a replica other than 0): not supported")
    st = tables["steps"]
    tokens, batch = expand(span, {c: st[c].to_numpy() for c in ("step", "t_ms", "dur_ms")}, tok,
                           _listed(rows["batch"], tables["batch"], ("join",), name), name)
    return (_expanded_frame(TOKEN, tokens, len(requests), f"{name}: decode spans"),
            _expanded_frame(BATCH, batch, len(requests), f"{name}: decode spans"))


def _with_frees(rows: dict, kv: pd.DataFrame, n_requests: int, name: str) -> pd.DataFrame:
    """The KV table of a file whose frees of whole tables are kv_free rows (core.trace.spans), expanded."""
    free = {c: rows["kv_free"].col(c) for c in FREE_COLUMNS}
    check_frees(free, n_requests, name)
    cols = _listed(rows["kv"], kv, (), name)
    if (cols.pop("replica") != 0).any():
        raise TraceError(f"{name}: kv_free records in a fleet trace (a replica other than 0): not supported")
    out = kv_with_frees(cols, {c: v.to_numpy(zero_copy_only=False) for c, v in free.items()},
                        tuple(KV.field("op").values), name)
    return _expanded_frame(KV, out, n_requests, f"{name}: kv_free records")


def _expanded_frame(rec: Record, cols: dict, n_requests: int, what: str) -> pd.DataFrame:
    """A table from expanded columns (enum fields as codes), checked as every table is."""
    cols = cols | {f.name: pd.Categorical.from_codes(cols[f.name], categories=list(f.values))
                   for f in rec.columns if f.type == "enum"}
    try:
        return frame(rec, cols, n_requests)
    except BadColumn as e:
        raise TraceError(f"{what}: {e}") from None


# ---- the same checks, a batch of rows at a time (out of core: core.analysis.outofcore) --------------

def parquet_head(schema, name: str) -> dict:
    """The document head in a Parquet file's metadata, checked as trace_from_parquet checks it."""
    return _head(schema, name)


def row_group_reads(pf) -> list[tuple[list[int] | None, list[str], str | None]]:
    """(row groups, columns, the record type they claim) to read a Parquet trace's records by: each
    record type's row groups and only its columns when every row group holds one type (our writer's
    layout), else every row group and every column of the layout the file has (claiming none)."""
    present = set(pf.schema_arrow.names)
    groups = _row_groups_by_type(pf)
    if groups is None:
        return [(None, [c for c in COLUMNS if c in present], None)]
    return [(g, [c for c in dict.fromkeys(["rtype", *_record_columns(r)]) if c in present], r)
            for r, g in groups.items()]


class RowChecker:
    """trace_from_parquet's checks of each record, made on batches of rows in file order (a trace
    too large to load: core.analysis.outofcore), with the same functions: each column cast to the
    layout's type, each record type's values against their declarations (`Rows.frame`), the
    request extras and the verbatim events (`_request_extras`, `_other_records`). What needs every
    row at once is left to the caller: request ids unique across batches, `finish(index_of)` for the
    verbatim events' requests, validate.check_consistency on slices of requests."""

    def __init__(self, name: str, n_requests: int):
        self.name, self.n_requests = name, n_requests
        self.seen = dict.fromkeys(RTYPES, 0)     # records of each type checked so far
        self.other: list[dict] = []

    def check_columns(self, names):
        """The columns every trace needs are in the file (its schema's column names)."""
        missing = sorted(_NEEDED - set(names))
        if missing:
            raise TraceError(f"{self.name}: Parquet table lacks column(s) {', '.join(missing)}")

    def add(self, t, claimed: str | None = None):
        """One batch: a pyarrow Table with (some of) the layout's columns (the file has every column
        it needs: `check_columns`), read from row groups whose statistics claim one record type."""
        import pyarrow as pa
        import pyarrow.compute as pc
        if claimed is not None and pc.unique(t.column("rtype")).to_pylist() != [claimed]:
            raise TraceError(f"{self.name}: row groups claim {claimed} records but hold other record types")
        present = [c for c in COLUMNS if c in t.column_names]
        t = pa.table([_cast(t.column(c), c, self.name) for c in present], names=present)
        rtype = t.column("rtype")
        if rtype.null_count:
            raise TraceError(f"{self.name}: a row has no record type (rtype)")
        idx = pc.index_in(rtype, value_set=pa.array(RTYPES))
        if idx.null_count:
            raise TraceError(f"{self.name}: unknown record type in column rtype")
        rt = idx.to_numpy(zero_copy_only=False).astype(np.int64)
        for r in RTYPES:
            rows = Rows(t, rt, r, self.name)
            if not rows.n:
                continue
            if r == "request":
                rows.frame(REQUEST, 0)
                _request_extras(rows, self.name, self.seen[r])
            elif r == "other":
                self.other += _other_records(rows, self.name, self.seen[r])
            elif r == "span":
                check_spans({c: rows.col(c) for c in SPAN_COLUMNS}, self.n_requests, None, self.name)
            elif r == "kv_free":
                check_frees({c: rows.col(c) for c in FREE_COLUMNS}, self.n_requests, self.name)
            else:
                rows.frame(next(rec for rec in TABLES if rec.type == r), self.n_requests)
            self.seen[r] += rows.n

    def finish(self, index_of: dict):
        """The verbatim events' checks (index_of: request id -> position, for the ids they name)."""
        _checked_other(self.other, index_of, self.name)
