"""A fleet's records as one trace's columns: the replicas' step logs (core.engine.steplog) joined
into the columns a trace is built from (core.trace.build.trace_from_records).

Request rows map to the fleet's; every table but batch gains a `replica` column; steps are
numbered fleet-wide in order of start (ties: the lower replica first); tokens, finishes, KV block
events and preemptions are in order of time (ties: the lower replica first, then as recorded),
batch entries in step then running order; a disaggregated prefill replica's copies leave out
their tokens and finishes (the client never sees them).
"""
from __future__ import annotations

import numpy as np

from core.engine.steplog import log_records


def fleet_records(logs: list, rows: list[np.ndarray], copies: list[np.ndarray]) -> dict:
    """{rtype: {field: values}} of the replicas' StepLogs (logs[k]: replica k's; rows[k]: its
    request rows -> the fleet's; copies[k]: per request row, a prefill copy)."""
    recs = [log_records(lg) for lg in logs]
    new_of = fleet_step_numbers(recs) if len(recs) > 1 else [None]
    merged: dict = {}
    for k, lg in enumerate(recs):
        for rtype, cols in lg.items():
            cols = dict(cols)
            keep = None
            if rtype in ("token", "finish") and copies[k].any():
                keep = ~copies[k][np.asarray(cols["req"], dtype=np.int64)]
            if "req" in cols:
                cols["req"] = _map_rows(cols["req"], rows[k])
            if "step" in cols and new_of[k] is not None:
                cols["step"] = new_of[k][np.asarray(cols["step"], dtype=np.int64)]
            if rtype != "batch":
                cols["replica"] = np.full(len(next(iter(cols.values()))), k, dtype=np.int64)
            if keep is not None:
                cols = {c: _take(v, keep) for c, v in cols.items()}
            merged.setdefault(rtype, []).append(cols)
    if len(recs) == 1:
        return {rtype: parts[0] for rtype, parts in merged.items()}
    return {rtype: _sorted(_concat(parts), "step" if rtype in ("step", "batch") else "t_ms")
            for rtype, parts in merged.items()}


def fleet_step_numbers(logs: list[dict]) -> list:
    """Per replica: its step number -> the fleet's (every step in order of start, ties by replica)."""
    t, rep, old = [], [], []
    for k, lg in enumerate(logs):
        st = lg.get("step")
        if st is not None:
            t.append(np.asarray(st["t_ms"], dtype=np.float64))
            rep.append(np.full(len(st["t_ms"]), k, dtype=np.int64))
            old.append(np.asarray(st["step"], dtype=np.int64))
    new_of = [None] * len(logs)
    if not t:
        return new_of
    t, rep, old = np.concatenate(t), np.concatenate(rep), np.concatenate(old)
    number = np.empty(len(t), dtype=np.int64)
    number[np.lexsort((rep, t))] = np.arange(len(t))
    for k in np.unique(rep).tolist():
        mine = rep == k
        m = np.full(int(old[mine].max()) + 1, -1, dtype=np.int64)
        m[old[mine]] = number[mine]
        new_of[k] = m
    return new_of


def _concat(parts: list[dict]) -> dict:
    """Columns of several replicas' parts, one after the other (a column absent or None in some
    parts: None where absent). Columns given as lists become object arrays (concatenated and,
    by _sorted, reordered without a Python loop over their values)."""
    lens = [len(next(iter(p.values()))) for p in parts]
    out = {}
    for c in [c for c in parts[0] if all(c in p for p in parts)]:
        vals = [p[c] for p in parts]
        if all(v is None for v in vals):
            out[c] = None
        elif all(isinstance(v, np.ndarray) for v in vals):
            out[c] = np.concatenate(vals)
        else:
            out[c] = np.concatenate([_objects(v, n) for v, n in zip(vals, lens)])
    return out


def _objects(v, n: int) -> np.ndarray:
    """A column as an object array of its values (None: n Nones)."""
    if v is None:
        return np.full(n, None, dtype=object)
    if isinstance(v, np.ndarray):
        return v.astype(object) if v.dtype != object else v
    return np.fromiter(v, dtype=object, count=n)


def _sorted(cols: dict, key: str) -> dict:
    if key not in cols:
        return cols
    order = np.argsort(np.asarray(cols[key]), kind="stable")
    return {c: (v[order] if isinstance(v, np.ndarray) else None if v is None else [v[j] for j in order.tolist()])
            for c, v in cols.items()}


def _map_rows(req, rows: np.ndarray) -> np.ndarray:
    """Local request rows as the fleet's (-1, no request, stays -1: the last of `rows` + [-1])."""
    req = np.asarray(req, dtype=np.int64)
    if not len(rows):
        return req
    return np.append(rows, -1)[req]


def _take(v, keep: np.ndarray):
    if v is None:
        return None
    if isinstance(v, np.ndarray):
        return v[keep]
    return [x for x, k in zip(v, keep.tolist()) if k]
