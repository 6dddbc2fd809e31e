"""A measured run beside its prediction (core.fit.calibrate): each request's TTFT and E2E,
predicted against measured, coloured by the signed error; where the error arises, by part; and
each logged step against the step model."""
from __future__ import annotations

import numpy as np
import plotly.graph_objects as go

from core.figures import GRAY, PALETTE, base_layout

PART_COLORS = {"front end": PALETTE[4], "queue": PALETTE[7], "prefill": "#F2B701", "decode": "#80B1D3"}


def predicted_vs_measured(rows, metric: str, name: str) -> go.Figure:
    """One point per request: measured (x) and predicted (y) `metric` ("ttft_ms" or "e2e_ms"), the
    diagonal where they agree, coloured by (predicted - measured) / measured."""
    x = rows[f"{metric}_measured"].to_numpy(dtype=float)
    y = rows[f"{metric}_predicted"].to_numpy(dtype=float)
    err = 100 * rows[f"{metric}_error"].to_numpy(dtype=float)
    lim = float(np.nanmax(np.abs(err))) if len(err) else 1.0
    fig = go.Figure(go.Scatter(
        x=x, y=y, mode="markers", customdata=np.column_stack([rows["id"].to_numpy(), err]),
        marker=dict(size=8, color=err, colorscale="RdBu_r", cmin=-lim, cmax=lim,
                    colorbar=dict(title="error %", thickness=12), line=dict(width=0.5, color=GRAY)),
        hovertemplate="%{customdata[0]}<br>measured %{x:.2f} ms<br>predicted %{y:.2f} ms<br>"
                      "error %{customdata[1]:+.1f}%<extra></extra>", name="requests"))
    hi = float(np.nanmax(np.r_[x, y, 1.0]))
    fig.add_trace(go.Scatter(x=[0, hi], y=[0, hi], mode="lines", line=dict(color=GRAY, dash="dash"),
                             name="predicted = measured", hoverinfo="skip"))
    base_layout(fig, f"{name}: predicted vs measured (ms)", height=380)
    fig.update_layout(showlegend=False)
    fig.update_xaxes(title=f"measured {name} (ms)")
    fig.update_yaxes(title=f"predicted {name} (ms)")
    return fig


def error_by_part(parts: dict) -> go.Figure:
    """Mean (predicted - measured) per part of E2E (bars) and mean |predicted - measured| (markers),
    in ms: the parts add up to the E2E error."""
    names = [p for p in parts if parts[p]["mean_ms"] is not None]
    fig = go.Figure(go.Bar(x=names, y=[parts[p]["mean_ms"] for p in names], name="mean (predicted − measured)",
                           marker_color=[PART_COLORS.get(p, GRAY) for p in names],
                           hovertemplate="%{x}: %{y:+.2f} ms<extra>mean signed error</extra>"))
    fig.add_trace(go.Scatter(x=names, y=[parts[p]["mean_abs_ms"] for p in names], mode="markers",
                             # white with a black rim: seen on the light theme and on the dark one
                             marker=dict(symbol="diamond", size=11, color="#FFFFFF",
                                         line=dict(width=2, color="#000000")),
                             name="mean |predicted − measured|",
                             hovertemplate="%{x}: %{y:.2f} ms<extra>mean absolute error</extra>"))
    base_layout(fig, "Where the E2E error arises (ms per request)", height=340)
    fig.update_yaxes(title="ms", zeroline=True)
    return fig


def _broken_at_idle(t: np.ndarray, dur: np.ndarray, y: np.ndarray) -> tuple[list, list]:
    """x, y of a line through (t, y) with a gap (None) wherever the engine sat idle between two
    steps (the next began more than a step's duration after the last one ended): no ramp drawn
    across an idle stretch as if steps had happened there."""
    if not len(t):
        return [], []
    idle = t[1:] - (t[:-1] + dur[:-1]) > np.maximum(dur[:-1], dur[1:])
    xs, ys = [float(t[0])], [float(y[0])]
    for k in range(1, len(t)):
        if idle[k - 1]:
            xs.append(None)
            ys.append(None)
        xs.append(float(t[k]))
        ys.append(float(y[k]))
    return xs, ys


def steps_vs_model(steps) -> go.Figure:
    """Each logged step's duration over time (points) and the step model's for its counts (a line,
    broken where the engine was idle between steps)."""
    fig = go.Figure(go.Scatter(x=steps["t_ms"], y=steps["logged_ms"], mode="markers", name="logged (forward pass)",
                               marker=dict(size=4, color=PALETTE[0]),
                               customdata=np.column_stack([steps["prefill_tokens"], steps["decode_reqs"]]),
                               hovertemplate="logged %{y:.2f} ms<br>%{customdata[0]} prefill tokens, "
                                             "%{customdata[1]} decoding<extra></extra>"))
    order = np.argsort(steps["t_ms"].to_numpy(dtype=float), kind="stable")
    x, y = _broken_at_idle(steps["t_ms"].to_numpy(dtype=float)[order], steps["logged_ms"].to_numpy(dtype=float)[order],
                           steps["predicted_ms"].to_numpy(dtype=float)[order])
    fig.add_trace(go.Scatter(x=x, y=y, mode="lines", name="step model (its cycle)", connectgaps=False,
                             line=dict(color=PALETTE[1], width=1.5),
                             hovertemplate="model %{y:.2f} ms<extra></extra>"))
    base_layout(fig, "Each logged step against the step model", height=340)
    fig.update_xaxes(title="time (ms, the log's clock)")
    fig.update_yaxes(title="step duration (ms)")
    return fig
