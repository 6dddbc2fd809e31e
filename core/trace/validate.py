"""The precise path: a decoded JSON document checked field by field against schema.py,
every problem recorded with where it is, then one TraceError naming the first problem
(in file order) and counting the rest. It also builds the trace when the document is
valid, so it is the reader of last resort for anything the fast decoder refuses.

Cross-event rules, checked on every path (also the fast decoder and Parquet):
- every event's req is a listed request (the `req` type);
- a request's tokens are not before its arrival;
- token indices run 0..n-1 without repeats or gaps, with non-decreasing times;
- at most max_output_tokens tokens; at most one finish, not before the last token.
"""
from __future__ import annotations

import math
import numbers
from collections.abc import Callable

import numpy as np
import pandas as pd

from core.errors import TraceError, short
from core.trace.model import BadColumn, Trace, frame
from core.trace.schema import (
    BATCH,
    INT_MAX,
    MAX_TIME_MS,
    META,
    REQUEST,
    SCHEMA,
    STEP,
    TABLE_EVENTS,
    VERBATIM_EVENTS,
    Field,
    Record,
)

_TOP_FIELDS = ("schema", "meta", "requests", "events")
_REQUEST_COLUMNS = {f.name for f in REQUEST.columns}


class Problems:
    """Collects validation problems; raises one TraceError naming the first."""

    def __init__(self, name: str):
        self.name = name
        self.items: list[tuple[float, str]] = []  # (position in the file, message)

    def add(self, order: float, msg: str):
        self.items.append((order, msg))

    def raise_if_any(self):
        if not self.items:
            return
        self.items.sort(key=lambda x: x[0])
        first = self.items[0][1]
        more = len(self.items) - 1
        tail = f" (and {more} more problem{'s' if more != 1 else ''})" if more else ""
        raise TraceError(f"{self.name}: {first}{tail}")


class _Bad(Exception):
    """A field's problem: the message's tail after the record's location."""


def _is_num(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _is_int(v) -> bool:
    return (isinstance(v, int) and not isinstance(v, bool)) or (isinstance(v, float) and v.is_integer())


def _ok_time(v) -> bool:
    try:
        return _is_num(v) and math.isfinite(v) and 0 <= v <= MAX_TIME_MS
    except OverflowError:  # an integer too large for a float
        return False


def _req_code(v, index_of: dict, nullable: bool) -> int:
    if v is None and nullable:
        return -1
    key = str(int(v)) if _is_int(v) and not isinstance(v, str) else v
    j = index_of.get(key) if isinstance(key, str) else None
    if j is None:
        raise _Bad(f": req {v!r} is not in requests")
    return j


def _checker(f: Field, index_of: dict) -> Callable:
    """value -> its in-memory form, or _Bad."""
    def bad(v):
        raise _Bad(f".{f.name}: expected {f.expect}, got {short(v)}")

    t = f.type
    if t == "time":
        return lambda v: float(v) if _ok_time(v) else bad(v)
    if t == "int":
        lo, hi, dflt = f.lo, f.hi, f.default if isinstance(f.default, int) else None

        def check_int(v):
            if not (_is_int(v) and (lo is None or v >= lo or v == dflt)):
                bad(v)
            if not -INT_MAX - 1 <= v <= INT_MAX:
                raise _Bad(f".{f.name}: {short(v)} is too large (an int64: at most 2**63 - 1)")
            if v > hi:
                bad(v)
            return int(v)
        return check_int
    if t == "enum":
        allowed = set(f.values)
        return lambda v: v if isinstance(v, str) and v in allowed else bad(v)
    if t == "str":
        return lambda v: v if isinstance(v, str) else bad(v)
    if t == "str?":
        return lambda v: v if v is None or isinstance(v, str) else bad(v)
    if t == "req":
        return lambda v: _req_code(v, index_of, f.nullable)
    raise AssertionError(t)


class _Table:
    """Rows of one table record, checked one by one."""

    def __init__(self, rec: Record, index_of: dict):
        self.rec = rec
        # (name, value when absent, check); an absent required field reads as None
        self.fields = [(f.name, None if f.required else f.default, _checker(f, index_of))
                       for f in rec.json_fields if f.type != "batch"]
        self.rows: list[list] = []
        self.pos: list[int] = []  # event index of each row

    def row(self, e: dict) -> list:
        return [chk(e.get(name, dflt)) for name, dflt, chk in self.fields]  # raises _Bad

    def frame(self, n_requests: int, extra: dict | None = None) -> pd.DataFrame:
        names = [name for name, _, _ in self.fields]
        cols = dict(zip(names, map(list, zip(*self.rows)))) if self.rows else {n: [] for n in names}
        return frame(self.rec, cols | (extra or {}), n_requests)


def _check_verbatim(e: dict, check_t: Callable, checks) -> None:
    """A verbatim event's t_ms and the fields the loader relies on; _Bad when one is wrong."""
    check_t(e.get("t_ms"))
    for name, chk in checks:
        if e.get(name) is not None:
            chk(e[name])


def _batch_rows(e: dict, batch: _Table) -> list:
    """A step event's batch entries as rows of the batch table; _Bad located within the step."""
    b = e.get("batch", [])
    if not isinstance(b, list):
        raise _Bad(".batch: expected a list")
    entries = []
    for k, item in enumerate(b):
        try:
            if not isinstance(item, dict):
                raise _Bad(": expected an object")
            entries.append(batch.row(item))
        except _Bad as bad:
            raise _Bad(f".batch[{k}]{bad}") from None
    return entries


def _event_type(e, i: int, where: str, pb: Problems) -> str | None:
    """The event's type, or None (the problem recorded) when it is not an object with a string type."""
    if not isinstance(e, dict):
        pb.add(i, f"{where}[{i}]: expected an object")
        return None
    typ = e.get("type")
    if not isinstance(typ, str):
        pb.add(i, f"{where}[{i}].type: expected a string, got {short(typ)}")
        return None
    return typ


def read_events(events: list, index_of: dict, pb: Problems, where: str = "events") -> tuple[dict, list, dict]:
    """(tables, verbatim events, event index per row of tokens and finishes); problems go to pb,
    each located as `where[i]`."""
    tables = {rec.type: _Table(rec, index_of) for rec in TABLE_EVENTS}
    batch = _Table(BATCH, index_of)
    batch_steps: list[int] = []
    # Verbatim events: only what the loader relies on is checked (t_ms, req, enums).
    verbatim = {typ: [(f.name, _checker(f, index_of)) for f in rec.fields
                      if f.type in ("time", "req", "enum") and f.name != "t_ms"]
                for typ, rec in VERBATIM_EVENTS.items()}
    check_t = _checker(STEP.field("t_ms"), index_of)
    step_at = [name for name, _, _ in tables["step"].fields].index("step")
    other = []
    for i, e in enumerate(events):
        typ = _event_type(e, i, where, pb)
        if typ is None:
            continue
        tab = tables.get(typ)
        try:
            if tab is None:  # kept verbatim: check what the loader relies on
                _check_verbatim(e, check_t, verbatim.get(typ, ()))
                other.append(e)
                continue
            row = tab.row(e)
            if tab.rec is STEP:
                entries = _batch_rows(e, batch)
                batch.rows += entries
                batch_steps += [row[step_at]] * len(entries)
        except _Bad as bad:
            pb.add(i, f"{where}[{i}] ({typ}){bad}")
            continue
        tab.rows.append(row)
        tab.pos.append(i)
    n = len(index_of)
    try:
        out = {rec.table: tables[rec.type].frame(n) for rec in TABLE_EVENTS}
        out["batch"] = batch.frame(n, {"step": batch_steps})
    except BadColumn as e:  # the row checks should have caught it
        raise TraceError(f"{pb.name}: events: {e}") from None
    pos = {name: np.array(tables[typ].pos, dtype=np.int64) for name, typ in (("tokens", "token"),
                                                                          ("finishes", "finish"))}
    return out, other, pos


def _requests(reqs: list, pb: Problems) -> tuple[pd.DataFrame, list, dict]:
    cols = [f for f in REQUEST.columns if f.name != "id"]
    checks = [(f.name, None if f.required else f.default, _checker(f, {})) for f in cols]
    ids, rows, extras = [], [], []
    index_of: dict[str, int] = {}
    for i, r in enumerate(reqs):
        at = f"requests[{i}]"
        if not isinstance(r, dict):
            pb.add(-1e18 + i, f"{at}: expected an object")
            continue
        rid = r.get("id")
        if _is_int(rid):
            rid = str(int(rid))
        if not isinstance(rid, str) or not rid:
            pb.add(-1e18 + i, f"{at}.id: expected a non-empty string, got {short(rid)}")
            continue
        if rid in index_of:
            pb.add(-1e18 + i, f"{at}.id: duplicate request id {rid!r}")
            continue
        try:
            rows.append([chk(r.get(name, dflt)) for name, dflt, chk in checks])
        except _Bad as bad:
            pb.add(-1e18 + i, f"{at}{bad}")
            continue
        index_of[rid] = len(ids)
        ids.append(rid)
        extras.append({k: v for k, v in r.items() if k not in _REQUEST_COLUMNS})
    data = {"id": ids} | {f.name: [row[k] for row in rows] for k, f in enumerate(cols)}
    return frame(REQUEST, data), extras, index_of



def trace_from_doc(doc, name: str = "trace", fast_events: Callable | None = None) -> Trace:
    """Validate a decoded document and build the Trace. `fast_events(index_of)` (the fast
    decoder's tables and verbatim events) replaces reading doc["events"] when given."""
    if not isinstance(doc, dict):
        raise TraceError(f"{name}: expected a JSON object at the top level, got {type(doc).__name__}")
    schema = doc.get("schema")
    if schema is None:
        raise TraceError(f"{name}: schema: missing (expected {SCHEMA!r})")
    if schema != SCHEMA:
        raise TraceError(f"{name}: schema: unknown version {schema!r}; this build reads {SCHEMA!r}")
    meta = doc.get("meta")
    if not isinstance(meta, dict):
        raise TraceError(f"{name}: meta: expected an object with at least 'source'")
    check_meta(meta, name)
    reqs, events = doc.get("requests"), doc.get("events")
    if not isinstance(reqs, list):
        raise TraceError(f"{name}: requests: expected a list")
    if not isinstance(events, list):
        raise TraceError(f"{name}: events: expected a list")
    pb = Problems(name)
    requests, extras, index_of = _requests(reqs, pb)
    pb.raise_if_any()
    if fast_events is not None:
        tables, other = fast_events(index_of)
        pos = {k: np.arange(len(tables[k])) for k in ("tokens", "finishes")}
    else:
        tables, other, pos = read_events(events, index_of, pb)
        pb.raise_if_any()
    check_consistency(pb, requests, tables["tokens"], pos["tokens"], tables["finishes"], pos["finishes"])
    pb.raise_if_any()
    extra = {k: v for k, v in doc.items() if k not in _TOP_FIELDS}
    return Trace(meta=meta, requests=requests, **tables, other=other, request_extra=extras, extra=extra)


# meta.stats entries the app reads as counts (and every kv_<op>: the KV pool's block events by kind)
COUNT_STATS = frozenset({"steps", "preemptions", "kv_blocks", "rejected", "deadline", "requests",
                         "prefix_hit_blocks", "prefix_hit_blocks_first"})


def check_meta(meta: dict, name: str):
    for f in META.fields:
        if f.type == "enum" and (f.required or f.name in meta) and meta.get(f.name) not in f.values:
            raise TraceError(f"{name}: meta.{f.name}: expected one of {', '.join(f.values)}, "
                             f"got {short(meta.get(f.name))}")
    stats = meta.get("stats")     # counts the summaries read as numbers (kv_blocks: the pool's size)
    if stats is not None:
        if not isinstance(stats, dict):
            raise TraceError(f"{name}: meta.stats: expected an object of counts, got {short(stats)}")
        for k, v in stats.items():
            if not (k in COUNT_STATS or k.startswith("kv_")):
                continue          # (another tool's own entries: kept as they are, never read as counts)
            if not (isinstance(v, numbers.Integral) and not isinstance(v, bool) and v >= 0):
                raise TraceError(f"{name}: meta.stats.{k}: expected a count (an integer >= 0), got {short(v)}")
    engine = meta.get("engine")    # (its block size is read as a number: the fits and the KV views)
    if isinstance(engine, dict) and engine.get("block_size") is not None:
        v = engine["block_size"]
        if not (isinstance(v, numbers.Integral) and not isinstance(v, bool) and 1 <= v <= 1 << 20):
            raise TraceError(f"{name}: meta.engine.block_size: expected tokens per KV block (an integer >= 1), got "
                             f"{short(v)}")


def check_consistency(pb: Problems, requests, tokens, tok_pos, finishes, fin_pos):
    """Cross-event rules, vectorised: tokens after arrival, indices 0..n-1 without repeats,
    emission times non-decreasing in index order, counts within max_output_tokens, one
    finish per request, not before its last token. *_pos: each row's event index."""
    ids = requests["id"].to_numpy()
    if len(tokens):
        req = tokens["req"].to_numpy()
        idx = tokens["index"].to_numpy()
        t = tokens["t_ms"].to_numpy()
        arr = requests["arrival_ms"].to_numpy()[req]
        for k in np.flatnonzero(t < arr):
            pb.add(tok_pos[k], f"events[{tok_pos[k]}] (token): request {ids[req[k]]!r} token {idx[k]} at "
                               f"{t[k]} ms is before its arrival at {arr[k]} ms")
        order = np.lexsort((idx, req))
        r_s, i_s, t_s, p_s = req[order], idx[order], t[order], tok_pos[order]
        same = r_s[1:] == r_s[:-1]
        for k in np.flatnonzero(same & (i_s[1:] == i_s[:-1])):
            pb.add(p_s[k + 1], f"events[{p_s[k + 1]}] (token): request {ids[r_s[k]]!r} token index "
                               f"{i_s[k]} appears twice")
        for k in np.flatnonzero(same & (t_s[1:] < t_s[:-1])):
            pb.add(p_s[k + 1], f"events[{p_s[k + 1]}] (token): request {ids[r_s[k]]!r} token {i_s[k + 1]} at "
                               f"{t_s[k + 1]} ms is earlier than token {i_s[k]} at {t_s[k]} ms "
                               "(times must not decrease)")
        counts = np.bincount(req, minlength=len(requests))
        maxo = requests["max_output_tokens"].to_numpy()
        for j in np.flatnonzero(counts > maxo):
            pb.add(1e18, f"request {ids[j]!r}: {counts[j]} tokens, more than its max_output_tokens {maxo[j]}")
        # Indices 0..n-1: after sorting, the k-th token of a request must have index k.
        start = np.r_[0, np.flatnonzero(~same) + 1]
        rank = np.arange(len(r_s)) - np.repeat(start, np.diff(np.r_[start, len(r_s)]))
        for k in np.flatnonzero(i_s != rank)[:1]:
            pb.add(p_s[k], f"events[{p_s[k]}] (token): request {ids[r_s[k]]!r} token indices must run "
                           f"0..n-1 without gaps; found index {i_s[k]} where {rank[k]} was expected")
    if len(finishes):
        req = finishes["req"].to_numpy()
        t = finishes["t_ms"].to_numpy()
        dup = pd.Series(req).duplicated().to_numpy()
        for k in np.flatnonzero(dup):
            pb.add(fin_pos[k], f"events[{fin_pos[k]}] (finish): request {ids[req[k]]!r} finishes twice")
        if len(tokens):
            last = tokens.groupby("req")["t_ms"].max()
            lt = last.reindex(req).to_numpy()
            for k in np.flatnonzero(t < lt):
                pb.add(fin_pos[k], f"events[{fin_pos[k]}] (finish): request {ids[req[k]]!r} finishes at {t[k]} ms, "
                                   f"before its last token at {lt[k]} ms")

