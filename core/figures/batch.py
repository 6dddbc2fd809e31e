"""What runs when: running and waiting requests over time with a cursor line, and the batch of
one step (tokens per request, prefill vs decode)."""
from __future__ import annotations

import plotly.graph_objects as go

from core.figures import CURSOR, PALETTE, base_layout


def in_flight_figure(df, cursor_ms: float | None = None) -> go.Figure:
    fig = go.Figure()
    fig.add_trace(go.Scatter(x=df["t_ms"], y=df["running"], mode="lines", name="running",
                               line=dict(shape="hv", color=PALETTE[0])))
    if (df["waiting"] >= 0).any():
        fig.add_trace(go.Scatter(x=df["t_ms"], y=df["waiting"], mode="lines", name="waiting",
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
    # (SVG, not WebGL: a few thousand points are one path, and a WebGL context redrawn at each cursor move
    # was most of a 3.9 s step on the bundled vLLM run in headless Chromium)
    """The server's own load as a capture client sampled it (`gauge` events from /metrics):
    running and waiting requests (left axis) and KV-cache usage in percent (right axis). Each sample is
    a marker; a series is joined (as steps) only when it has enough samples to stand for a curve
    (DENSE_GAUGES): a line between two scrapes seconds apart would claim what nobody saw. Each series
    is drawn from the samples that carry it (an iteration log's KV usage has no running count)."""
    fig = go.Figure()
    reps = sorted({int(g.get("replica", 0)) for g in gauges})
    apart = len(reps) > 1          # a fleet's: each replica's own series (a sum of samples taken apart is no one's)

    def series(key, r, scale=1.0):
        got = [(g["t_ms"], g[key] * scale) for g in gauges if isinstance(g.get(key), (int, float))
               and (not apart or g.get("replica", 0) == r)]
        return [t for t, _ in got], [v for _, v in got]

    counts = []
    for k, r in enumerate(reps):
        who, dash = (f" r{r}", ("solid", "dash", "dashdot", "longdash")[k % 4]) if apart else ("", "solid")
        for i, key in enumerate(("running", "waiting")):
            x, y = series(key, r)
            if x:
                counts.append(len(x))
                fig.add_trace(go.Scatter(x=x, y=y, mode="lines+markers" if len(x) >= DENSE_GAUGES else "markers",
                                         name=f"{key} (server{who})", marker=dict(size=7, symbol=i),
                                         line=dict(shape="hv", color=PALETTE[i], dash=dash)))
        x, y = series("kv_usage", r, 100.0)
        if x:
            counts.append(len(x))
            dense = len(x) >= DENSE_GAUGES
            fig.add_trace(go.Scatter(x=x, y=y, mode="lines" if dense else "markers", name=f"KV usage % (server{who})",
                                     yaxis="y2", line=dict(shape="hv", color=PALETTE[3], dash="dot" if not apart
                                                           else dash), marker=dict(size=7, symbol="diamond-open")))
    if cursor_ms is not None:
        fig.add_vline(x=cursor_ms, line_color=CURSOR, line_width=2)
    fig.update_layout(xaxis_title="time (ms)", yaxis=dict(title="requests", rangemode="nonnegative"),
                      yaxis2=dict(title="KV usage (%)", overlaying="y", side="right", range=[0, 100], showgrid=False))
    sparse = min(counts, default=0)
    if apart:
        few = f": {sparse} samples of the sparsest series" if sparse < DENSE_GAUGES else ""
        return base_layout(fig, f"Each replica's gauges ({len(reps)} replicas), sampled from its own /metrics{few}",
                           height=280)
    if sparse < DENSE_GAUGES:
        return base_layout(fig, f"Server gauges (measured): {sparse} samples of the sparsest series", height=280)
    return base_layout(fig, "Server gauges, sampled from its /metrics (measured by the client)", height=280)
