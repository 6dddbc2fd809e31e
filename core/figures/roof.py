"""Roofline figure."""
from __future__ import annotations

import numpy as np
import plotly.graph_objects as go

from core.figures import PALETTE, base_layout, log_ticks
from core.formulas.kv import GPUSpec
from core.formulas.roofline import attainable_flops


def roofline_chart(gpus: list[GPUSpec], points: list[tuple[str, float]]) -> go.Figure:
    """Attainable TFLOP/s vs arithmetic intensity (log-log) for each GPU, with the ridge
    point, and workload points (label, intensity) placed on the first GPU's roof."""
    x = np.logspace(-1, 4.5, 200)
    fig = go.Figure()
    for i, g in enumerate(gpus):
        y = [attainable_flops(v, g) / 1e12 for v in x]
        fig.add_trace(go.Scatter(x=x, y=y, mode="lines", name=g.name, line_color=PALETTE[i % len(PALETTE)],
                                 hovertemplate="%{x:.2f} FLOP/B: %{y:.1f} TFLOP/s<extra>" + g.name + "</extra>"))
        fig.add_trace(go.Scatter(x=[g.ridge_flop_per_byte], y=[g.tflops_16], mode="markers",
                                 marker=dict(color=PALETTE[i % len(PALETTE)], size=9, symbol="diamond"),
                                 name=f"{g.name} ridge {g.ridge_flop_per_byte:.0f} FLOP/B", showlegend=False,
                                 hovertemplate=f"{g.name} ridge: %{{x:.1f}} FLOP/B<extra></extra>"))
    if gpus and points:
        g = gpus[0]
        px = [v for _, v in points]
        py = [attainable_flops(v, g) / 1e12 for v in px]
        fig.add_trace(go.Scatter(x=px, y=py, mode="markers+text", text=[l for l, _ in points],
                                 textposition="top center", name=f"workloads on {g.name}",
                                 marker=dict(size=11, color="#000"),
                                 hovertemplate="%{text}: intensity %{x:,.0f} FLOP/B, roof %{y:.1f} TFLOP/s"
                                               "<extra></extra>"))
    fig.update_xaxes(type="log", title_text="arithmetic intensity (FLOP per byte of weights)", **log_ticks())
    fig.update_yaxes(type="log", title_text="attainable TFLOP/s", **log_ticks())
    return base_layout(fig, "Roofline", height=420)
