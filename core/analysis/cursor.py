"""A trace at a time cursor: the span a cursor moves over, the step running at a time, the
requests worth drawing around it, and running/waiting counts over time (for the trace
replay page). Times are ms on the trace's own clock."""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

from core.analysis.metrics import request_metrics
from core.analysis.occupancy import blocks_drawn
from core.order import stable_order
from core.trace import Trace


def time_range(trace: Trace) -> tuple[float, float]:
    return time_range_of(trace.requests, float(trace.tokens["t_ms"].max()) if len(trace.tokens) else None,
                         trace.steps, trace.finishes)


def time_range_of(requests: pd.DataFrame, last_token_ms: float | None, steps: pd.DataFrame,
                  finishes: pd.DataFrame) -> tuple[float, float]:
    """time_range from the request, step and finish tables and the last token's time (None: no tokens)."""
    t0 = float(requests["arrival_ms"].min()) if len(requests) else 0.0
    ends = [t0]
    if last_token_ms is not None:
        ends.append(last_token_ms)
    if len(steps):
        ends.append(float((steps["t_ms"] + steps["dur_ms"]).max()))
    if len(finishes):
        ends.append(float(finishes["t_ms"].max()))
    return t0, max(ends)


REQ_TABLES = ("tokens", "finishes", "batch", "preempts")


@dataclass(frozen=True, slots=True)
class RowIndex:
    """Where each request's rows are in a trace's per-request tables, and where each step's
    batch entries are: built once per trace (O(rows)), so that `subset` and `step_at` cost
    the rows they return, not the trace's size (a 100,000-request trace has ~25 M tokens)."""
    rows: dict[str, tuple[np.ndarray, np.ndarray]]   # table -> (row numbers by request, starts [n + 1])
    batch_steps: np.ndarray | None                    # the batch's step column when sorted (else None)


def row_index(trace: Trace) -> RowIndex:
    n = len(trace.requests)
    rows = {}
    for name in REQ_TABLES:
        req = getattr(trace, name)["req"].to_numpy()
        ok = (req >= 0) & (req < n)
        r = np.where(ok, req, n).astype(np.int32 if n < 2**31 - 1 else np.int64)   # n: rows of no request
        order = stable_order(r).astype(np.int32 if len(r) < 2**31 else np.int64)
        starts = np.r_[0, np.cumsum(np.bincount(r, minlength=n + 1))]
        rows[name] = (order, starts)
    steps = trace.batch["step"].to_numpy()
    return RowIndex(rows, steps if len(steps) < 2 or bool((steps[1:] >= steps[:-1]).all()) else None)


def subset(trace: Trace, req_idx, index: RowIndex | None = None) -> Trace:
    """The same trace restricted to some requests (re-indexed); steps keep only their
    entries for those requests. With the trace's `row_index`, only the requests' own rows
    are read (the same result)."""
    req_idx = np.asarray(sorted(set(int(i) for i in req_idx)), dtype=np.int64)
    remap = np.full(len(trace.requests), -1, dtype=np.int64)
    remap[req_idx] = np.arange(len(req_idx))

    def keep(name):
        df = getattr(trace, name)
        if not len(df):
            return df
        if index is not None:
            order, starts = index.rows[name]
            pick = np.sort(np.concatenate([order[starts[i]:starts[i + 1]] for i in req_idx] or [order[:0]]))
            out = df.iloc[pick].copy()
            out["req"] = remap[out["req"].to_numpy()]
            return out.reset_index(drop=True)
        m = remap[np.maximum(df["req"].to_numpy(), 0)]
        ok = (df["req"].to_numpy() >= 0) & (m >= 0)
        out = df[ok].copy()
        out["req"] = m[ok]
        return out.reset_index(drop=True)

    tr = Trace(meta=trace.meta, requests=trace.requests.iloc[req_idx].reset_index(drop=True),
               tokens=keep("tokens"), finishes=keep("finishes"), steps=trace.steps,
               batch=keep("batch"), kv=trace.kv.iloc[0:0], preempts=keep("preempts"), other=[],
               request_extra=[trace.request_extra[i] for i in req_idx] if trace.request_extra else [])
    return tr


def requests_near(trace: Trace, t_ms: float, limit: int = 150, metrics: pd.DataFrame | None = None) -> np.ndarray:
    """Indices of up to `limit` requests to draw around a cursor: those in flight at t
    first, then those whose activity is closest in time."""
    m = request_metrics(trace) if metrics is None else metrics
    a = m["arrival_ms"].to_numpy()
    e = np.where(np.isnan(m["last_token_ms"].to_numpy()), a, m["last_token_ms"].to_numpy())
    dist = np.where((a <= t_ms) & (t_ms <= e), 0.0, np.minimum(np.abs(a - t_ms), np.abs(e - t_ms)))
    order = np.lexsort((a, dist))
    return np.sort(order[:limit])


def in_flight_series(trace: Trace, max_points: int = 4000, metrics: pd.DataFrame | None = None) -> pd.DataFrame:
    """Running and waiting counts over time: from step events when they record them; otherwise
    requests in flight (arrival <= t < last token) from the token events (or the trace's
    `request_metrics`, given)."""
    st = trace.steps
    if len(st) and (st["running"].to_numpy() >= 0).any():
        df = pd.DataFrame({"t_ms": st["t_ms"].to_numpy(), "running": st["running"].to_numpy(),
                           "waiting": st["waiting"].to_numpy()})
        source = "step events"
    else:
        m = request_metrics(trace) if metrics is None else metrics
        a = m["arrival_ms"].to_numpy()
        e = m["last_token_ms"].to_numpy()
        e = np.where(np.isnan(e), a, e)
        t = np.unique(np.concatenate([a, e]))
        running = np.searchsorted(np.sort(a), t, side="right") - np.searchsorted(np.sort(e), t, side="right")
        df = pd.DataFrame({"t_ms": t, "running": running, "waiting": np.full(len(t), -1)})
        source = ("requests in flight, from their own times (the engine's steps record no running/waiting counts)"
                  if len(st) else "requests in flight, from their own times (no step events)")
    if len(df) > max_points:
        df = df.iloc[np.linspace(0, len(df) - 1, max_points).round().astype(int)]
    df.attrs["source"] = source
    return df.reset_index(drop=True)


def step_at(trace: Trace, t_ms: float, index: RowIndex | None = None) -> tuple[dict | None, pd.DataFrame]:
    """The step running at (or last started before) the cursor, and its batch entries
    (found by binary search with the trace's `row_index` when its batch is in step order)."""
    st = trace.steps
    if not len(st):
        return None, pd.DataFrame()
    t = st["t_ms"].to_numpy()
    k = int(np.searchsorted(t, t_ms, side="right") - 1)
    if k < 0:
        return None, pd.DataFrame()
    row = st.iloc[k].to_dict()
    if index is not None and index.batch_steps is not None:
        s = index.batch_steps
        want = s.dtype.type(row["step"])     # the row's step is a float here: searching with one would convert `s`
        b = trace.batch.iloc[np.searchsorted(s, want, "left"):np.searchsorted(s, want, "right")].copy()
    else:
        b = trace.batch[trace.batch["step"] == row["step"]].copy()
    b["request"] = trace.requests["id"].to_numpy()[b["req"].to_numpy()].tolist()
    return row, b.reset_index(drop=True)


def advance(cursor_ms: float, start_ms: float, end_ms: float, step_ms: float) -> float:
    """The next cursor position when playing: `step_ms` on, back to the start past the end."""
    return start_ms if cursor_ms + step_ms > end_ms else min(end_ms, cursor_ms + step_ms)


def step_cursor(cursor_ms: float, direction: int, step_starts: np.ndarray, start_ms: float, end_ms: float,
                fallback_ms: float) -> float:
    """The cursor one step back (-1) or forward (+1): to the previous / next scheduler step's
    start when the trace has steps (`step_starts` sorted), else by `fallback_ms`; clamped to
    [start_ms, end_ms]."""
    if len(step_starts):
        if direction > 0:
            j = int(np.searchsorted(step_starts, cursor_ms, side="right"))
            t = float(step_starts[j]) if j < len(step_starts) else end_ms
        else:
            j = int(np.searchsorted(step_starts, cursor_ms, side="left")) - 1
            t = float(step_starts[j]) if j >= 0 else start_ms
    else:
        t = cursor_ms + direction * fallback_ms
    return min(max(t, start_ms), end_ms)


def gauge_coverage(trace: Trace, gauges: list[dict], metrics: pd.DataFrame | None = None) -> dict | None:
    """How well a server's sampled gauges (`gauge` events that count running requests: /metrics scrapes)
    saw the run: the samples,
    the median gap between them, the requests' median E2E, how many samples fell while the requests' own
    times say at least one was in flight (arrival <= t < last token), and how many read running > 0.
    `missed`: the scrapes cannot show the activity (sampled less often than a request lasts, or no
    sample inside a request). None without gauges or requests."""
    gauges = [g for g in gauges if isinstance(g.get("running"), (int, float))]    # the scrapes that count requests
    t = np.sort(np.array([g["t_ms"] for g in gauges if isinstance(g.get("t_ms"), (int, float))], dtype=float))
    if not len(t) or not len(trace.requests):
        return None
    m = request_metrics(trace) if metrics is None else metrics
    a = m["arrival_ms"].to_numpy(dtype=float)
    e = m["last_token_ms"].to_numpy(dtype=float)
    ok = np.isfinite(a) & np.isfinite(e)
    a, e = np.sort(a[ok]), np.sort(e[ok])
    inside = np.searchsorted(a, t, side="right") - np.searchsorted(e, t, side="right")
    during = int((inside > 0).sum())
    busy = sum(1 for g in gauges if isinstance(g.get("running"), (int, float)) and g["running"] > 0)
    gap = float(np.median(np.diff(t))) if len(t) > 1 else math.nan
    e2e = m["e2e_ms"].to_numpy(dtype=float)
    e2e = float(np.median(e2e[np.isfinite(e2e)])) if np.isfinite(e2e).any() else math.nan
    missed = during == 0 or (math.isfinite(gap) and math.isfinite(e2e) and gap > e2e)
    return {"samples": int(len(t)), "median_gap_ms": gap, "median_e2e_ms": e2e, "during_requests": during,
            "reading_running": busy, "missed": bool(missed)}


def _replica_pools(kv: pd.DataFrame, reps: list | None, n: int) -> tuple[np.ndarray, np.ndarray]:
    """(each of the n replicas' pool: its recorded kv_blocks, or the blocks its events touch when that is
    missing or smaller; the blocks its own view draws of it: occupancy.blocks_drawn)."""
    pools = np.zeros(n, dtype=np.int64)
    drawn = np.zeros(n, dtype=np.int64)
    for k in range(n):
        given = reps[k].get("kv_blocks") if reps and k < len(reps) and isinstance(reps[k], dict) else None
        mine = kv["block"].to_numpy()[kv["replica"].to_numpy() == k] if len(kv) else np.empty(0, np.int64)
        touched = int(mine.max()) + 1 if len(mine) else 0
        pools[k] = given if isinstance(given, int) and not isinstance(given, bool) and given >= touched else touched
        drawn[k] = blocks_drawn(touched, {"engine": {"kv_blocks": int(pools[k])}})
    return pools, drawn


def _fleet_step_totals(st: pd.DataFrame, n: int) -> pd.DataFrame:
    """A copy of the steps whose running, waiting and KV blocks used (where recorded) are the n replicas'
    total at each step's start: every replica's last reported value, summed."""
    steps = st.copy()
    if not len(st):
        return steps
    order = np.argsort(st["t_ms"].to_numpy(), kind="stable")
    rep = st["replica"].to_numpy()[order]
    for col in ("running", "waiting", "kv_used_blocks"):
        v = st[col].to_numpy()
        if not (v >= 0).any():
            continue                 # (not recorded)
        now, total = np.zeros(n, dtype=np.int64), 0
        out = np.empty(len(v), dtype=v.dtype)
        for j, k in zip(order.tolist(), rep.tolist()):
            x = max(int(v[j]), 0)
            total += x - now[k]
            now[k] = x
            out[j] = total
        steps[col] = out
    return steps


def fleet_as_one(trace: Trace) -> Trace:
    """A fleet trace's replicas as one engine's views read them (the replay page's whole-fleet
    cursor): each replica's KV blocks numbered after the ones before it (replica k's block b is
    b + the blocks drawn of replicas 0..k-1: every replica has its own pool, so the same number on
    two replicas is two blocks), the fleet's pool their sum; each step's running, waiting and KV blocks
    used the fleet's total at its start (every replica's last reported value, summed), so the
    whole-fleet numbers are the per-replica views' added up. Tokens, finishes, batch entries and
    events are the trace's own."""
    t = trace
    reps = (t.meta.get("fleet") or {}).get("replicas") if isinstance(t.meta.get("fleet"), dict) else None
    kv, st = t.kv, t.steps
    n = 1 + max([int(df["replica"].max()) for df in (kv, st) if len(df)] + [len(reps or []) - 1, 0])
    pools, drawn = _replica_pools(kv, reps, n)
    offset = np.concatenate([[0], np.cumsum(drawn)[:-1]])
    kv = kv.copy()
    if len(kv):
        kv["block"] = kv["block"].to_numpy() + offset[kv["replica"].to_numpy()]
    steps = _fleet_step_totals(st, n)
    meta = dict(t.meta)
    meta["engine"] = {**(t.meta.get("engine") or {}), "kv_blocks": int(pools.sum())}
    meta["kv_blocks_drawn"] = int(drawn.sum())   # (the replicas' drawn blocks side by side: their free ones add up)
    return Trace(meta=meta, requests=t.requests, tokens=t.tokens, finishes=t.finishes, steps=steps, batch=t.batch,
                 kv=kv, kv_events=t.kv_events, preempts=t.preempts, other=t.other, request_extra=t.request_extra,
                 extra=t.extra)
