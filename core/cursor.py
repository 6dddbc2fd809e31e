"""A trace at a time cursor: the span a cursor moves over, the step running at a time, the
requests worth drawing around it, and running/waiting counts over time (for the trace
replay page). Times are ms on the trace's own clock."""
from __future__ import annotations

import numpy as np
import pandas as pd

from core.metrics import request_metrics
from core.trace import Trace


def time_range(trace: Trace) -> tuple[float, float]:
    t0 = float(trace.requests["arrival_ms"].min()) if len(trace.requests) else 0.0
    ends = [t0]
    if len(trace.tokens):
        ends.append(float(trace.tokens["t_ms"].max()))
    if len(trace.steps):
        ends.append(float((trace.steps["t_ms"] + trace.steps["dur_ms"]).max()))
    if len(trace.finishes):
        ends.append(float(trace.finishes["t_ms"].max()))
    return t0, max(ends)


def subset(trace: Trace, req_idx) -> Trace:
    """The same trace restricted to some requests (re-indexed); steps keep only their
    entries for those requests."""
    req_idx = np.asarray(sorted(set(int(i) for i in req_idx)), dtype=np.int64)
    remap = np.full(len(trace.requests), -1, dtype=np.int64)
    remap[req_idx] = np.arange(len(req_idx))

    def keep(df):
        if not len(df):
            return df
        m = remap[np.maximum(df["req"].to_numpy(), 0)]
        ok = (df["req"].to_numpy() >= 0) & (m >= 0)
        out = df[ok].copy()
        out["req"] = m[ok]
        return out.reset_index(drop=True)

    tr = Trace(meta=trace.meta, requests=trace.requests.iloc[req_idx].reset_index(drop=True),
               tokens=keep(trace.tokens), finishes=keep(trace.finishes), steps=trace.steps,
               batch=keep(trace.batch), kv=trace.kv.iloc[0:0], preempts=keep(trace.preempts), other=[],
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


def in_flight_series(trace: Trace, max_points: int = 4000) -> pd.DataFrame:
    """Running and waiting counts over time: from step events when present; otherwise
    requests in flight (arrival <= t < last token) from the token events."""
    st = trace.steps
    if len(st):
        df = pd.DataFrame({"t_ms": st["t_ms"].to_numpy(), "running": st["running"].to_numpy(),
                           "waiting": st["waiting"].to_numpy()})
        source = "step events"
    else:
        m = request_metrics(trace)
        a = m["arrival_ms"].to_numpy()
        e = m["last_token_ms"].to_numpy()
        e = np.where(np.isnan(e), a, e)
        t = np.unique(np.concatenate([a, e]))
        running = np.searchsorted(np.sort(a), t, side="right") - np.searchsorted(np.sort(e), t, side="right")
        df = pd.DataFrame({"t_ms": t, "running": running, "waiting": np.full(len(t), -1)})
        source = "requests in flight (no step events)"
    if len(df) > max_points:
        df = df.iloc[np.linspace(0, len(df) - 1, max_points).round().astype(int)]
    df.attrs["source"] = source
    return df.reset_index(drop=True)


def step_at(trace: Trace, t_ms: float) -> tuple[dict | None, pd.DataFrame]:
    """The step running at (or last started before) the cursor, and its batch entries."""
    st = trace.steps
    if not len(st):
        return None, pd.DataFrame()
    t = st["t_ms"].to_numpy()
    k = int(np.searchsorted(t, t_ms, side="right") - 1)
    if k < 0:
        return None, pd.DataFrame()
    row = st.iloc[k].to_dict()
    b = trace.batch[trace.batch["step"] == row["step"]].copy()
    b["request"] = [trace.ids[r] for r in b["req"]]
    return row, b.reset_index(drop=True)


def advance(cursor_ms: float, start_ms: float, end_ms: float, step_ms: float) -> float:
    """The next cursor position when playing: `step_ms` on, back to the start past the end."""
    return start_ms if cursor_ms + step_ms > end_ms else min(end_ms, cursor_ms + step_ms)
