"""What runs when: running and waiting requests over time with a cursor line, and the batch of
one step (tokens per request, prefill vs decode)."""
from __future__ import annotations

import plotly.graph_objects as go

from core.figures import CURSOR, PALETTE, base_layout


def in_flight_figure(df, cursor_ms: float | None = None) -> go.Figure:
    fig = go.Figure()
    fig.add_trace(go.Scattergl(x=df["t_ms"], y=df["running"], mode="lines", name="running",
                               line=dict(shape="hv", color=PALETTE[0])))
    if (df["waiting"] >= 0).any():
        fig.add_trace(go.Scattergl(x=df["t_ms"], y=df["waiting"], mode="lines", name="waiting",
                                   line=dict(shape="hv", color=PALETTE[1])))
    if cursor_ms is not None:
        fig.add_vline(x=cursor_ms, line_color=CURSOR, line_width=2)
    fig.update_layout(xaxis_title="time (ms)", yaxis_title="requests")
    return base_layout(fig, f"Running and waiting ({df.attrs.get('source', '')})", height=280)


def batch_figure(batch, step: dict) -> go.Figure:
    """Tokens computed per request in one step, prefill vs decode."""
    fig = go.Figure()
    for kind, color in (("prefill", "#F2B701"), ("decode", "#80B1D3")):
        part = batch[batch["kind"] == kind]
        fig.add_trace(go.Bar(x=part["request"], y=part["tokens"], name=kind, marker_color=color,
                             hovertemplate="%{x}: %{y} " + kind + " token(s)<extra></extra>"))
    fig.update_layout(barmode="stack", xaxis_title="request", yaxis_title="tokens this step",
                      xaxis_type="category")
    # two short lines: the whole title fits a half-width column at 1280 px
    title = (f"Step {int(step['step'])} at {step['t_ms']:,.3f} ms ({step['dur_ms']:.3f} ms)<br>"
             f"{int(batch['tokens'].sum()):,} tokens, {len(batch):,} requests")
    return base_layout(fig, title, height=300)


DENSE_GAUGES = 50     # samples from which a gauge is drawn as a curve


def gauges_figure(gauges: list[dict], cursor_ms: float | None = None) -> go.Figure:
    """The server's own load as a capture client sampled it (`gauge` events from /metrics):
    running and waiting requests (left axis) and KV-cache usage in percent (right axis). Each sample is
    a marker; they are joined (as steps) only when there are enough of them to stand for a curve
    (DENSE_GAUGES): a line between two scrapes seconds apart would claim what nobody saw."""
    fig = go.Figure()
    t = [g["t_ms"] for g in gauges]
    mode = "lines+markers" if len(gauges) >= DENSE_GAUGES else "markers"
    for i, key in enumerate(("running", "waiting")):
        if any(key in g for g in gauges):
            fig.add_trace(go.Scattergl(x=t, y=[g.get(key) for g in gauges], mode=mode, name=f"{key} (server)",
                                       line=dict(shape="hv", color=PALETTE[i]), marker=dict(size=7, symbol=i)))
    if any("kv_usage" in g for g in gauges):
        fig.add_trace(go.Scattergl(x=t, y=[None if g.get("kv_usage") is None else 100 * g["kv_usage"] for g in gauges],
                                   mode=mode, name="KV usage % (server)", yaxis="y2",
                                   line=dict(shape="hv", color=PALETTE[3], dash="dot"),
                                   marker=dict(size=7, symbol="diamond-open")))
    if cursor_ms is not None:
        fig.add_vline(x=cursor_ms, line_color=CURSOR, line_width=2)
    fig.update_layout(xaxis_title="time (ms)", yaxis=dict(title="requests", rangemode="nonnegative"),
                      yaxis2=dict(title="KV usage (%)", overlaying="y", side="right", range=[0, 100], showgrid=False))
    if len(gauges) < DENSE_GAUGES:
        return base_layout(fig, f"Server gauges: {len(gauges)} samples of its /metrics (measured by the client)",
                           height=280)
    return base_layout(fig, "Server gauges, sampled from its /metrics (measured by the client)", height=280)
