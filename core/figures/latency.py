"""Per-request latency across schedules or traces: grouped bars per request, and empirical CDFs."""
from __future__ import annotations

import plotly.graph_objects as go

from core.analysis.compare import cdf_points
from core.figures import PALETTE, base_layout

METRIC_NAMES = {"e2e_ms": "E2E", "ttft_ms": "TTFT", "tpot_ms": "TPOT", "waiting_ms": "Queue wait"}


def metric_comparison_bars(table, metric: str, unit: str = "ms") -> go.Figure:
    """Grouped bars of one per-request metric across schedules. `table`: DataFrame with
    columns request, schedule, and the metric (NaN = missing, drawn as a gap)."""
    name = METRIC_NAMES.get(metric, metric)
    fig = go.Figure()
    for sched, g in table.groupby("schedule", sort=False):
        fig.add_trace(go.Bar(x=g["request"], y=g[metric], name=str(sched),
                             hovertemplate=f"%{{x}}: %{{y:.3f}} {unit}<extra>{sched}</extra>"))
    fig.update_layout(barmode="group", yaxis_title=f"{name} ({unit})")
    return base_layout(fig, f"{name} per request ({unit})", height=320)


SVG_POINTS = 5_000


def cdf_figure(series: dict[str, object], metric: str, unit: str = "ms") -> go.Figure:
    fig = go.Figure()
    for i, (label, values) in enumerate(series.items()):
        x, y = cdf_points(values)
        # SVG up to SVG_POINTS: one path is cheap, and a WebGL context per chart costs ~0.1-0.3 s to (re)draw
        trace = go.Scatter if len(x) <= SVG_POINTS else go.Scattergl
        fig.add_trace(trace(x=x, y=y, mode="lines", name=label, line=dict(shape="hv", color=PALETTE[i])))
    fig.update_layout(xaxis_title=f"{metric} ({unit})", yaxis_title="fraction of requests", yaxis_range=[0, 1.02])
    return base_layout(fig, f"{metric} CDF", height=300)
