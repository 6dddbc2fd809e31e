"""Requests and workloads: a Request per request, a Workload as columns (Request objects made
on demand), and the checks every loader applies to times and token counts."""
from __future__ import annotations

import math
from array import array
from collections.abc import Iterable
from dataclasses import dataclass, field, fields

import numpy as np

from core.errors import WorkloadError, short

MAX_TOKENS = 10_000_000  # per request; larger counts are certainly a unit mistake
MAX_TOKEN_ID = 2**63 - 1  # token ids are hashed as int64 (core.engine.prefix_cache.block_hash)
# Latest time (ms) anywhere: ~31.7 years. A float64 near 1e12 still resolves ~1e-4 ms, so every
# time stays exact to the microsecond (Chrome export) and sums of times stay finite.
MAX_TIME_MS = 1e12


def _check_token_ids(ids: tuple, where: str):
    """Token ids as the prefix cache hashes them (int64, >= 0), else one line naming the first bad one."""
    try:
        ok = not ids or min(array("q", ids)) >= 0
    except (OverflowError, TypeError):
        ok = False
    if not ok:
        k, bad = next((k, x) for k, x in enumerate(ids)
                      if not isinstance(x, (int, np.integer)) or not 0 <= x <= MAX_TOKEN_ID)
        raise WorkloadError(f"{where}[{k}]: expected a token id, an integer in 0..2**63-1, got {short(bad)}")


@dataclass(slots=True)
class Request:
    id: str
    arrival_ms: float
    prompt_tokens: int
    max_output_tokens: int                 # tokens the request asks for (max_tokens; JSON key output_tokens)
    prompt_ids: tuple[int, ...] | None = None  # exact token ids, needed for prefix caching
    tenant: str | None = None              # cache salt: blocks are never shared across tenants
    abort_at_ms: float | None = None       # client cancels at this time (runner/simulator)
    extra: dict = field(default_factory=dict)  # unknown fields, kept verbatim
    deadline_ms: float | None = None       # must finish within this long after arrival, or is aborted
    priority: int = 0                      # scheduling_policy "priority": lower runs first

    def __post_init__(self):
        where = f"request {self.id!r}"
        if not isinstance(self.id, str) or not self.id:
            raise WorkloadError(f"{where}: id must be a non-empty string")
        check_time(self.arrival_ms, f"{where}: arrival_ms")
        checkcount_value(self.prompt_tokens, f"{where}: prompt_tokens")
        checkcount_value(self.max_output_tokens, f"{where}: output_tokens")
        if self.prompt_ids is not None:
            self.prompt_ids = tuple(self.prompt_ids)
            _check_token_ids(self.prompt_ids, f"{where}: prompt_ids")
            if len(self.prompt_ids) != self.prompt_tokens:
                raise WorkloadError(f"{where}: prompt_ids has {len(self.prompt_ids)} ids "
                                    f"but prompt_tokens is {self.prompt_tokens}")
        if self.abort_at_ms is not None:
            check_time(self.abort_at_ms, f"{where}: abort_at_ms")
        if self.deadline_ms is not None:
            check_time(self.deadline_ms, f"{where}: deadline_ms")
            if self.deadline_ms <= 0:
                raise WorkloadError(f"{where}: deadline_ms: expected a number of milliseconds > 0, got "
                                    f"{short(self.deadline_ms)}")
        p = self.priority
        if isinstance(p, bool) or not isinstance(p, int) or not -2**31 <= p < 2**31:
            raise WorkloadError(f"{where}: priority: expected an integer (lower runs first), got {short(p)}")

    def options(self, skip: tuple = ()) -> dict:
        """The optional fields (OPTIONAL) that are set, JSON-ready, in declaration order: what a
        workload file and a trace's request record carry beside the four columns."""
        out = {}
        for name in OPTIONAL:
            v = getattr(self, name)
            if name not in skip and v != _DEFAULTS[name]:
                out[name] = list(v) if name == "prompt_ids" else v
        return out

    @classmethod
    def from_record(cls, rid: str, arrival_ms: float, prompt_tokens: int, max_output_tokens: int,
                    fields: dict) -> Request:
        """A request from its four columns and its optional fields as a trace records them (a
        prompt_ids list of the wrong length, or absent fields, give the defaults)."""
        ids = fields.get("prompt_ids")
        opts = {k: fields.get(k) for k in OPTIONAL if k != "prompt_ids" and fields.get(k) is not None}
        return cls(rid, arrival_ms, prompt_tokens, max_output_tokens,
                   prompt_ids=tuple(ids) if isinstance(ids, list) and len(ids) == prompt_tokens else None, **opts)

    def to_dict(self) -> dict:
        d = {"id": self.id, "arrival_ms": self.arrival_ms, "prompt_tokens": self.prompt_tokens,
             "output_tokens": self.max_output_tokens, **self.options()}
        d.update(self.extra)
        return d


# A request's optional fields, declared once (the dataclass above: name, type, default; the trace
# schema's REQUEST record declares the same names with their meanings): every reader and writer
# of requests iterates these.
OPTIONAL = ("prompt_ids", "tenant", "abort_at_ms", "deadline_ms", "priority")
_DEFAULTS = {f.name: f.default for f in fields(Request) if f.name in OPTIONAL}


def _as_list(col) -> list:
    """A column (numpy array or any iterable) as a list of Python values."""
    return col.tolist() if isinstance(col, np.ndarray) else list(col)


def _check_id_column(ids: list, name: str) -> None:
    """Refuse the first id that is not a non-empty string, naming its row."""
    for i, v in enumerate(ids):
        if not isinstance(v, str) or not v:
            raise WorkloadError(f"{name}: row {i} (request {short(v)}): id must be a non-empty string")


def _refuse_row(bad: int, a: np.ndarray, p: np.ndarray, o: np.ndarray, where) -> None:
    """Raise the error Request would for row `bad` (the first with a bad time or count)."""
    check_time(float(a[bad]), f"{where(bad)}: arrival_ms")
    checkcount_value(int(p[bad]), f"{where(bad)}: prompt_tokens")
    checkcount_value(int(o[bad]), f"{where(bad)}: output_tokens")


def _tenant_column(tenants: list, where) -> list | None:
    """The tenants (None when every one is None), or WorkloadError at the first that is neither a string nor None."""
    for i, t in enumerate(tenants):
        if t is not None and not isinstance(t, str):
            raise WorkloadError(f"{where(i)}: tenant: expected a string or null, got {short(t)}")
    return None if all(t is None for t in tenants) else tenants


class Workload:
    """Requests sorted by arrival (stable: equal arrivals keep their given order).

    Two ways in: `Workload(requests, name)` from Request objects, or `Workload.from_columns(...)`
    from whole columns (the CSV/JSONL loaders), which keeps the workload columnar and builds the
    Request objects only when `requests` is first read. Either way `ids`, `arrival_ms`,
    `prompt_tokens`, `max_output_tokens` and `plain` are there, computed once. Assigning
    `requests` replaces the workload's requests (no re-validation, no re-sort, as before) and drops
    the cached columns; mutating the list or its requests in place does not refresh them."""
    __slots__ = ("name", "_requests", "_ids", "_auto_ids", "_arrival", "_prompt", "_output", "_tenant", "_plain")

    def __init__(self, requests: list[Request], name: str = "workload"):
        self.name = name
        requests = list(requests)
        if not requests:
            raise WorkloadError(f"{name}: the workload has no requests")
        seen = set()
        for r in requests:
            if r.id in seen:
                raise WorkloadError(f"{name}: duplicate request id {r.id!r}")
            seen.add(r.id)
        # Stable sort: equal arrivals keep file order (FCFS tie-break).
        self.requests = sorted(requests, key=lambda r: r.arrival_ms)

    @classmethod
    def from_columns(cls, ids, arrival_ms, prompt_tokens, max_output_tokens, name: str = "workload",
                     tenant=None) -> Workload:
        """A workload from whole columns, validated column-wise with Request's rules.

        ids: strings (None: "0", "1", ... by row); arrival_ms: numbers (ms, finite, >= 0, at most
        MAX_TIME_MS); prompt_tokens, max_output_tokens: integers in 1..MAX_TOKENS (integer dtype:
        4.0 is refused, as Request refuses it); tenant: None, one string for every request, or one
        string-or-None per row. Rows are stable-sorted by arrival; a bad value raises
        WorkloadError naming the workload, the row (0-based, given order), the request and field."""
        n = len(arrival_ms)
        cols = {"arrival_ms": n, "prompt_tokens": len(prompt_tokens), "output_tokens": len(max_output_tokens)}
        if ids is not None:
            ids = _as_list(ids)
            cols = {"ids": len(ids)} | cols
        if isinstance(tenant, str) or tenant is None:
            tenants = None if tenant is None else [tenant] * n
        else:
            tenants = _as_list(tenant)
            cols["tenant"] = len(tenants)
        if len(set(cols.values())) > 1:
            raise WorkloadError(f"{name}: columns differ in length ("
                                + ", ".join(f"{k} {v}" for k, v in cols.items()) + ")")
        rid = (lambda i: ids[i]) if ids is not None else str
        if ids is not None:
            _check_id_column(ids, name)
        where = lambda i: f"{name}: row {i} (request {rid(i)!r})"
        a = time_column(arrival_ms, where, "arrival_ms")
        p = count_column(prompt_tokens, where, "prompt_tokens")
        o = count_column(max_output_tokens, where, "output_tokens")
        bad = first_bad_row(a, p, o)
        if bad is not None:
            _refuse_row(bad, a, p, o, where)
        if tenants is not None:
            tenants = _tenant_column(tenants, where)
        return cls._checked(ids, a, p, o, name, tenants)

    @classmethod
    def _checked(cls, ids: list[str] | None, a: np.ndarray, p: np.ndarray, o: np.ndarray, name: str,
                 tenants: list | None = None) -> Workload:
        # Columns already valid row by row (float64, int64, int64); the workload-level checks and
        # the stable sort by arrival remain.
        n = len(a)
        if n == 0:
            raise WorkloadError(f"{name}: the workload has no requests")
        if ids is not None and len(set(ids)) != n:
            seen = set()
            for r in ids:
                if r in seen:
                    raise WorkloadError(f"{name}: duplicate request id {r!r}")
                seen.add(r)
        w = cls.__new__(cls)
        w._set_columns(name, ids, a, p, o, tenants)
        return w

    def _set_columns(self, name, ids, a, p, o, tenants):
        n = len(a)
        self.name = name
        self._requests = None
        if bool((a[1:] >= a[:-1]).all()):  # already in arrival order: the stable sort keeps it
            self._arrival, self._prompt, self._output = a, p, o
            self._auto_ids = None if ids is not None else np.arange(n)
            self._ids = ids
            self._tenant = tenants
        else:
            order = np.argsort(a, kind="stable")
            self._arrival, self._prompt, self._output = a[order], p[order], o[order]
            self._auto_ids = None if ids is not None else order
            self._ids = None if ids is None else [ids[i] for i in order.tolist()]
            self._tenant = None if tenants is None else [tenants[i] for i in order.tolist()]
        self._plain = tenants is None

    def _drop_columns(self):
        self._ids = self._auto_ids = self._arrival = self._prompt = self._output = self._tenant = self._plain = None

    @property
    def requests(self) -> list[Request]:
        """The requests in arrival order, built on first use for a columnar workload (then kept)."""
        if self._requests is None:
            new, req = object.__new__, Request
            ts = self._tenant or [None] * len(self)

            def make(i, a, p, o, t):
                # Fields were validated column-wise: skip Request.__post_init__.
                r = new(req)
                r.id, r.arrival_ms, r.prompt_tokens, r.max_output_tokens = i, a, p, o
                r.prompt_ids = r.abort_at_ms = r.deadline_ms = None
                r.tenant, r.extra, r.priority = t, {}, 0
                return r
            self._requests = list(map(make, self.ids, self._arrival.tolist(), self._prompt.tolist(),
                                      self._output.tolist(), ts))
        return self._requests

    @requests.setter
    def requests(self, value: list[Request]):
        self._requests = value
        self._drop_columns()

    @property
    def ids(self) -> list[str]:
        if self._ids is None:
            if self._requests is None:
                self._ids = [str(i) for i in self._auto_ids.tolist()]
            else:
                self._ids = [r.id for r in self._requests]
        return self._ids

    def _from_requests(self, slot: str, field: str, dtype) -> np.ndarray:
        # a column of a workload made of Request objects, gathered once
        if getattr(self, slot) is None:
            setattr(self, slot, np.fromiter((getattr(r, field) for r in self._requests), dtype=dtype,
                                            count=len(self._requests)))
        return getattr(self, slot)

    @property
    def arrival_ms(self) -> np.ndarray:
        return self._from_requests("_arrival", "arrival_ms", np.float64)

    @property
    def prompt_tokens(self) -> np.ndarray:
        return self._from_requests("_prompt", "prompt_tokens", np.int64)

    @property
    def max_output_tokens(self) -> np.ndarray:
        return self._from_requests("_output", "max_output_tokens", np.int64)

    @property
    def plain(self) -> bool:
        """True when the columns alone describe the workload: no request has prompt_ids, a
        tenant, abort_at_ms or extra fields."""
        if self._plain is None:
            self._plain = all(r.prompt_ids is None and r.tenant is None and r.abort_at_ms is None and not r.extra
                              and r.deadline_ms is None and not r.priority for r in self._requests)
        return self._plain

    def __len__(self):
        return len(self._requests) if self._requests is not None else len(self._arrival)

    def __eq__(self, other):
        if other.__class__ is not self.__class__:
            return NotImplemented
        if self.name != other.name or len(self) != len(other):
            return False
        if self._requests is None and other._requests is None:  # both columnar: compare columns
            return (self.ids == other.ids and self._tenant == other._tenant
                    and all(np.array_equal(getattr(self, k), getattr(other, k))
                            for k in ("arrival_ms", "prompt_tokens", "max_output_tokens")))
        return self.requests == other.requests

    __hash__ = None  # as the dataclass had: mutable, compared by value

    def __repr__(self):
        return f"Workload(name={self.name!r}, {len(self)} requests)"

    def __getstate__(self):
        return {k: getattr(self, k) for k in self.__slots__}

    def __setstate__(self, state):
        for k, v in state.items():
            object.__setattr__(self, k, v)

    def to_dict(self) -> dict:
        if self._requests is None and self._tenant is None:
            return {"name": self.name, "requests": [
                {"id": i, "arrival_ms": a, "prompt_tokens": p, "output_tokens": o} for i, a, p, o in
                zip(self.ids, self._arrival.tolist(), self._prompt.tolist(), self._output.tolist())]}
        return {"name": self.name, "requests": [r.to_dict() for r in self.requests]}


def first_bad_row(a: np.ndarray, p: np.ndarray, o: np.ndarray) -> int | None:
    """First row whose arrival (ms) or counts break Request's rules, or None; a may be float64,
    p and o int64 or float64 (then they must hold integers)."""
    with np.errstate(invalid="ignore", over="ignore"):
        ok = np.isfinite(a) & (a >= 0) & (a <= MAX_TIME_MS)
        for c in (p, o):
            ok &= (c >= 1) & (c <= MAX_TOKENS)
            if c.dtype.kind == "f":
                ok &= np.floor(c) == c  # NaN and inf fail the range test already
    if ok.all():
        return None
    return int(np.argmin(ok))


def time_column(values, where, what) -> np.ndarray:
    """values as float64, or the first one that is not a number refused as check_time would."""
    if isinstance(values, np.ndarray) and values.dtype.kind in "iuf":
        return values.astype(np.float64, copy=False)
    items = values.tolist() if isinstance(values, np.ndarray) else list(values)
    for i, v in enumerate(items):
        if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, float, np.integer, np.floating)):
            check_time(v, f"{where(i)}: {what}")
        elif isinstance(v, int) and not -MAX_TIME_MS <= v <= MAX_TIME_MS:
            check_time(v, f"{where(i)}: {what}")  # refused (and maybe beyond float range)
    return np.array(items, dtype=np.float64)


def count_column(values, where, what) -> np.ndarray:
    """values as int64 (integers only, as check_count), or the first bad one refused."""
    if isinstance(values, np.ndarray) and values.dtype.kind in "iu":
        if values.dtype.kind == "u" and len(values) and values.max() > MAX_TOKENS:
            i = int(np.argmax(values > MAX_TOKENS))
            checkcount_value(int(values[i]), f"{where(i)}: {what}")
        return values.astype(np.int64, copy=False)
    items = values.tolist() if isinstance(values, np.ndarray) else list(values)
    for i, v in enumerate(items):
        if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, np.integer)):
            checkcount_value(v, f"{where(i)}: {what}")
        elif not -(2**63) <= v < 2**63:
            checkcount_value(int(v), f"{where(i)}: {what}")
    return np.array(items, dtype=np.int64)


def check_time(v, what):
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise WorkloadError(f"{what}: expected a number of milliseconds, got {short(v)}")
    try:
        finite = math.isfinite(v)
    except OverflowError:
        finite = False
    if not finite or v < 0:
        raise WorkloadError(f"{what}: expected a finite number >= 0, got {short(v)}")
    if v > MAX_TIME_MS:
        raise WorkloadError(f"{what}: {short(v)} ms is beyond the latest time {MAX_TIME_MS:g} ms")


def checkcount_value(v, what):
    if isinstance(v, bool) or not isinstance(v, int):
        raise WorkloadError(f"{what}: expected a positive integer, got {short(v)}")
    if v < 1 or v > MAX_TOKENS:
        raise WorkloadError(f"{what}: expected an integer in 1..{MAX_TOKENS}, got {v}")


def as_int(v, what):
    # Accept 4 and 4.0 (CSV/JSON writers differ), refuse 4.5 and "4".
    if isinstance(v, float) and v.is_integer():
        return int(v)
    if isinstance(v, str):
        try:
            f = float(v)
        except ValueError:
            raise WorkloadError(f"{what}: expected an integer, got {short(v)}") from None
        if f.is_integer():
            return int(f)
        raise WorkloadError(f"{what}: expected an integer, got {short(v)}")
    return v


def located(where, e):
    # Re-raise a Request validation error with the row location in front (once).
    msg = str(e)
    return WorkloadError(msg if msg.startswith(where) else f"{where}: {msg}")


def count_value(v, what):
    n = as_int(v, what)
    checkcount_value(n, what)
    return n


def make_workload(rows: Iterable[tuple], name="workload") -> Workload:
    """Build from (id, arrival_ms, prompt_tokens, output_tokens) tuples (tests, pages)."""
    return Workload([Request(str(i), float(a), int(p), int(o)) for i, a, p, o in rows], name=name)
