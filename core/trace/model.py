"""The in-memory trace: one pandas table per record type of schema.py, requests referenced
by row position (int64 codes, -1: none) instead of ids, so that million-event traces load
and aggregate quickly. spec, tiles and unknown events stay verbatim in `other`; unknown
request and top-level fields stay verbatim in `request_extra` and `extra`.

`frame` builds a table from columns in the declared order and dtypes, checking every
value against its declaration; every decoder (fast JSON, precise JSON, Parquet) and every
builder goes through it.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from core.trace.schema import BATCH, FINISH, KV, KV_EVENT, PREEMPT, STEP, TABLE_EVENTS, TOKEN, Field, Record, dtype
from core.workload import MAX_TIME_MS, Request, Workload


class BadColumn(ValueError):
    """A column value outside its declaration (the decoders word it for their input)."""

    def __init__(self, f: Field, detail: str = ""):
        super().__init__(f"{f.name}: {detail or 'expected ' + f.expect}")
        self.field = f


def empty(rec: Record) -> pd.DataFrame:
    return pd.DataFrame(copy=False, data={f.name: pd.Series(dtype=dtype(f)) for f in rec.columns})


def _absent(f: Field, n: int):
    """An absent column: its fill value n times (a list when the type's own path makes the column)."""
    if f.required:
        raise BadColumn(f, "missing")
    if f.type in ("time", "int", "req"):         # (an array at once: a list of n values costs 30 ns each)
        return np.full(n, f.fill, dtype=np.float64 if f.type == "time" else np.int64)
    if f.type in ("str", "str?", "id"):
        return pd.Series(np.full(n, f.fill, dtype=object), dtype=object, copy=False)
    return [f.fill] * n


def _enum_column(f: Field, v, check: bool) -> pd.Categorical:
    if not (isinstance(v, pd.Categorical) and list(v.categories) == list(f.values)):
        code = {x: k for k, x in enumerate(f.values)}
        try:
            codes = np.fromiter(map(code.__getitem__, v), np.int8, len(v))
        except (KeyError, TypeError):  # a value outside `values`: NaN
            codes = np.fromiter((code.get(x, -1) if isinstance(x, str) else -1 for x in v), np.int8, len(v))
        v = pd.Categorical.from_codes(codes, categories=list(f.values))
    if check and (v.codes < 0).any():
        raise BadColumn(f)
    return v


def _str_column(f: Field, v, check: bool) -> pd.Series:
    a = np.asarray(v, dtype=object) if not isinstance(v, np.ndarray) or v.dtype != object else v
    if check and f.type == "id" and len(a) and (not all(type(x) is str and x for x in a.tolist())
                                                or pd.Index(a, dtype=object).has_duplicates):
        raise BadColumn(f)
    return pd.Series(a, dtype=object, copy=False)  # a bare array would become pandas' str dtype (None -> NaN)


def _numbers_ok(f: Field, a: np.ndarray, n_requests: int) -> bool:
    """Whether every value of a (non-empty) numeric column is within its declaration."""
    t = f.type
    if t == "time":
        return ((a >= 0) & (a <= MAX_TIME_MS)).all()  # NaN fails both
    if t == "req":
        return ((a >= (-1 if f.nullable else 0)) & (a < n_requests)).all()
    if f.lo is not None:
        ok = ((a >= f.lo) | (a == f.default)).all() if isinstance(f.default, int) else (a >= f.lo).all()
        return ok and bool((a <= f.hi).all())
    return bool((a <= f.hi).all())


def _number_column(f: Field, v, n_requests: int | None) -> np.ndarray:
    try:
        a = np.asarray(v, dtype=np.float64 if f.type == "time" else np.int64)
    except (OverflowError, TypeError, ValueError):
        raise BadColumn(f) from None
    if n_requests is not None and len(a) and not _numbers_ok(f, a, n_requests):
        raise BadColumn(f)
    return a


def _column(f: Field, v, n: int, n_requests: int | None):
    """One column as numpy (or a Categorical); checked when n_requests is given."""
    check = n_requests is not None
    if v is None:                                  # absent: the fill value
        v = _absent(f, n)
        if not isinstance(v, list):
            return v
    if isinstance(v, pd.Series):
        v = v.array if isinstance(v.dtype, pd.CategoricalDtype) else v.to_numpy()
    if f.type == "enum":
        return _enum_column(f, v, check)
    if f.type in ("str", "str?", "id"):
        return _str_column(f, v, check)
    return _number_column(f, v, n_requests)


def frame(rec: Record, data: dict, n_requests: int | None = None) -> pd.DataFrame:
    """rec's table from `data` (column name -> list, array, Series or Categorical; absent
    optional columns get their fill value). With n_requests every value is checked and the
    first column outside its declaration raises BadColumn."""
    n = len(next(iter(data.values()))) if data else 0
    return pd.DataFrame(copy=False, data={f.name: _column(f, data.get(f.name), n, n_requests)
                                          for f in rec.columns})


@dataclass
class Trace:
    meta: dict
    requests: pd.DataFrame                # id, arrival_ms, prompt_tokens, max_output_tokens, tenant
    tokens: pd.DataFrame = field(default_factory=lambda: empty(TOKEN))
    finishes: pd.DataFrame = field(default_factory=lambda: empty(FINISH))
    steps: pd.DataFrame = field(default_factory=lambda: empty(STEP))
    batch: pd.DataFrame = field(default_factory=lambda: empty(BATCH))  # one row per (step, req)
    kv: pd.DataFrame = field(default_factory=lambda: empty(KV))
    kv_events: pd.DataFrame = field(default_factory=lambda: empty(KV_EVENT))  # the engine's prefix cache
    preempts: pd.DataFrame = field(default_factory=lambda: empty(PREEMPT))
    other: list = field(default_factory=list)          # spec, tiles, unknown events, verbatim
    request_extra: list = field(default_factory=list)  # per request: other fields, verbatim
    extra: dict = field(default_factory=dict)          # unknown top-level fields, verbatim

    @property
    def ids(self) -> list[str]:
        return self.requests["id"].tolist()

    @property
    def source(self) -> str:
        return self.meta.get("source", "")

    @property
    def label(self) -> str:
        return self.meta.get("label") or self.source

    def event_types(self) -> set[str]:
        present = {r.type for r in TABLE_EVENTS if len(getattr(self, r.table))}
        return present | {e.get("type") for e in self.other}

    def events_of(self, type: str) -> list[dict]:
        """The verbatim events of one type (spec, tiles, ...), in trace order."""
        return [e for e in self.other if e.get("type") == type]

    def workload(self) -> Workload:
        reqs = []
        for i, row in enumerate(self.requests.itertuples(index=False)):
            extra = self.request_extra[i] if i < len(self.request_extra) else {}
            tenant = {"tenant": row.tenant} if isinstance(row.tenant, str) else {}
            reqs.append(Request.from_record(row.id, float(row.arrival_ms), int(row.prompt_tokens),
                                            int(row.max_output_tokens), {**extra, **tenant}))
        return Workload(reqs, name=self.meta.get("label") or "trace workload")


def counted_steps_of(steps: pd.DataFrame, has_batch: bool) -> bool:
    """Steps that carry counts instead of batch entries (an engine's iteration log), from the step
    table and whether the trace has batch entries (core.fit.stepfit.counted_steps)."""
    return (bool(len(steps)) and not has_batch and "prefill_tokens" in steps
            and bool((steps["prefill_tokens"] >= 0).all()))
