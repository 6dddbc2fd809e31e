"""Record of KV block events (the KVCacheManager's events, taken from the engine's outputs):
one row per block touched, kept as one tuple per call and turned into typed columns, vectorised,
when read.
"""
from __future__ import annotations

from itertools import chain

import numpy as np

from core.trace.schema import KV_OPS


class KVLog:
    """Record of block events, one row per block touched. Recording keeps the events as the
    KVCacheManager handed them on (one tuple per call, a list extend per step); they become typed
    columns together, vectorised, when read. Sequence ids are the scheduler's integer request
    indices; other ids (direct users name sequences anything) make the `req` column Python objects."""

    _NUM = (("t_ms", np.float64), ("op", np.int8), ("req", np.int64), ("block", np.int64), ("logical", np.int64),
            ("ref", np.int64), ("src", np.int64))
    _OPS = {op: i for i, op in enumerate(KV_OPS)}

    def __init__(self):
        self.listed0 = 0                     # rows taken before the last clear (whole_frees counts from there)
        self._calls: list[tuple] = []
        self._done: list[dict] = []
        self.clear()

    def clear(self):
        """Forget what was recorded (a streaming writer has taken it)."""
        self.listed0 += len(self)
        self._calls = []                     # (t, op, seq, blocks, logical0, step, refs, hashes, src)
        self._done = []                      # calls already turned into columns
        self._obj_req = False                # a non-integer sequence id was seen

    def whole_frees(self) -> dict | None:
        """Take out the frees of a whole block table that a reader rebuilds from the same sequence's
        allocations (no reference counts kept, no hashes: core.trace.spans.kv_with_frees): columns
        t_ms, req, logical (the table's last index) and index (the KV rows recorded before it, from
        the run's first, these left out), or None when there is none."""
        keep, rows = [], []
        n = self.listed0 + sum(len(p["block"]) for p in self._done)
        for c in self._calls:
            k = len(c[3])   # (t, op, seq, blocks, logical0, step, refs, hashes, src)
            if (c[1] == "free" and c[5] == -1 and c[7] is None and c[4] == k - 1 and k and type(c[6]) is int
                    and c[6] == 0 and type(c[2]) is int and type(c[0]) is float):
                rows.append((c[0], c[2], c[4], n))
            else:
                keep.append(c)
                n += k
        if not rows:
            return None
        self._calls = keep
        t, req, top, at = zip(*rows)
        return {"t_ms": np.array(t, dtype=np.float64), "req": np.array(req, dtype=np.int64),
                "logical": np.array(top, dtype=np.int64), "index": np.array(at, dtype=np.int64)}

    def extend(self, calls):
        """Add the events a KVCacheManager handed on (take_events), each (t, op, seq, blocks, logical0,
        step, refs, hashes, src). t: one time or one per block; seq: one id (None: no owner) or one per
        block; logical0: the first logical index (then + step per block), or one per block (step 0);
        refs: one count or one per block; hashes: one per block (bytes or None) or None."""
        self._calls += calls

    def _parts(self) -> list[dict]:
        if self._calls:
            self._done.append(self._columns_of(self._calls))
            self._calls = []
        return self._done

    def _columns_of(self, calls) -> dict:
        t, op, owner, blocks, logical0, step, refs, hashes, src = zip(*calls)
        lens = np.fromiter(map(len, blocks), np.int64, len(calls))
        n = int(lens.sum())
        block = np.fromiter(chain.from_iterable(blocks), np.int64, n)
        steps = np.array(step, dtype=np.int64)
        logical = spread(logical0, lens, np.int64)
        if steps.any():  # runs of consecutive logical indices (+1 or -1 per block)
            first = np.cumsum(lens) - lens
            logical += (np.arange(n) - np.repeat(first, lens)) * np.repeat(steps, lens)
        owners = [-1 if o is None else o for o in owner]
        if not self._obj_req and any(isinstance(o, bool) or not isinstance(o, (int, np.integer, list, np.ndarray))
                                     for o in owners if type(o) is not int):
            self._obj_req = True   # (lists and arrays of ids are checked by spread)
        req = None
        if not self._obj_req:
            try:
                req = spread(owners, lens, np.int64)
            except (TypeError, ValueError, OverflowError):   # a sequence named by something else
                self._obj_req = True
        if self._obj_req:
            req = np.empty(n, dtype=object)
            req[:] = [x for o, k in zip(owners, lens.tolist())
                      for x in (o.tolist() if isinstance(o, np.ndarray) else o if isinstance(o, list) else [o] * k)]
        hash_col = None
        if hashes.count(None) != len(hashes):
            hash_col = [x for h, k in zip(hashes, lens.tolist())
                        for x in ([None] * k if h is None else [b.hex()[:16] if b else None for b in h])]
        codes = np.array([self._OPS[o] for o in op], np.int8)
        return {"t_ms": spread(t, lens, np.float64), "op": np.repeat(codes, lens),
                "req": req, "block": block, "logical": logical, "ref": spread(refs, lens, np.int64),
                "src": (np.repeat(np.array(src, dtype=np.int64), lens) if src.count(-1) != len(src)
                        else np.full(n, -1, dtype=np.int64)), "hash": hash_col}

    def empty(self) -> bool:
        return not self._calls and not self._done

    def __len__(self):
        return sum(len(p["block"]) for p in self._done) + sum(len(c[3]) for c in self._calls)

    def columns(self) -> dict:
        """Columns t_ms, op (codes into KV_OPS), req (-1: none), block, logical, ref,
        hash (16 hex chars or None; None for the whole column when no call has hashes), src."""
        parts = self._parts()
        out = {}
        for c, dt in self._NUM:
            if c == "req" and self._obj_req:
                dt = object  # type: ignore[assignment]
            cols = [p[c].astype(dt, copy=False) for p in parts]
            out[c] = cols[0] if len(cols) == 1 else np.concatenate(cols) if cols else np.empty(0, dt)
        out["hash"] = None
        if any(p["hash"] is not None for p in parts):
            out["hash"] = [x for p in parts for x in (p["hash"] if p["hash"] is not None else [None] * len(p["block"]))]
        return out


_SEQUENCES = {np.ndarray, list, tuple}


def spread(values, lens: np.ndarray, dtype) -> np.ndarray:
    """One column from per-part values (the step log's parts, the KV log's calls), each a
    scalar (repeated over its part's `lens` rows) or an array or list of exactly that many
    rows. Arrays are concatenated; lists of Python numbers are read in one pass. (One Python
    pass over the values finds the sequences; the scalars go to numpy as they are.)"""
    seq = [i for i, v in enumerate(values) if type(v) in _SEQUENCES]
    if not seq:
        return np.repeat(np.array(values, dtype=dtype), lens)
    parts = values if len(seq) == len(values) else [values[i] for i in seq]
    if all(type(v) is np.ndarray for v in parts):
        flat = np.concatenate(parts).astype(dtype, copy=False)
    else:
        n = int(lens.sum()) if parts is values else int(lens[seq].sum())
        flat = np.fromiter(chain.from_iterable(parts), dtype, n)
    if parts is values:
        return flat
    scalars = list(values)
    for i in seq:
        scalars[i] = 0
    out = np.repeat(np.array(scalars, dtype=dtype), lens)
    mask = np.zeros(len(values), dtype=bool)
    mask[seq] = True
    out[np.repeat(mask, lens)] = flat
    return out
