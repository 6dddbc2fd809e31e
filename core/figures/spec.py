"""Speculative decoding figures: mass flow, Monte Carlo check, expected tokens, break-even."""
from __future__ import annotations

import numpy as np
import plotly.graph_objects as go

from core.figures import BLUE, GRAY, PALETTE, VERMILLION, base_layout
from core.formulas import speculative as spec

SANKEY_TEXT = {"light": "#111111", "dark": "#F2F2F2"}   # node labels: the page's strongest text colour


def mass_sankey(p, q, names: list[str], wrong: bool = False, theme: str = "light") -> go.Figure:
    """Probability mass: draft proposes q -> accepted (min(p, q)) or rejected -> resampled
    (from the residual, or from p under the wrong rule) -> final distribution."""
    p, q = np.asarray(p, float), np.asarray(q, float)
    n = len(p)
    acc = np.minimum(p, q)
    rej = q - acc
    rej_total = float(rej.sum())
    resample = np.asarray(spec.wrong_final_distribution(p, q)) - acc if wrong else \
        rej_total * np.asarray(spec.residual(p, q))
    final = acc + resample
    labels = ([f"draft {x}" for x in names] + ["rejected"]
              + [f"final {x} {f:.3f}" for x, f in zip(names, final)])
    rejected_node = n
    final_node = lambda i: n + 1 + i
    src, dst, val, col, hover = [], [], [], [], []
    for i in range(n):
        if acc[i] > 1e-12:
            src.append(i); dst.append(final_node(i)); val.append(acc[i]); col.append("rgba(0,114,178,0.45)")
            hover.append(f"accepted {names[i]}: {acc[i]:.4f}")
        if rej[i] > 1e-12:
            src.append(i); dst.append(rejected_node); val.append(rej[i]); col.append("rgba(213,94,0,0.45)")
            hover.append(f"rejected {names[i]}: {rej[i]:.4f}")
    for i in range(n):
        if resample[i] > 1e-12:
            src.append(rejected_node); dst.append(final_node(i)); val.append(resample[i])
            col.append("rgba(204,121,167,0.5)")
            hover.append(f"{'resampled from p' if wrong else 'residual'} -> {names[i]}: {resample[i]:.4f}")
    node_colors = [PALETTE[i % len(PALETTE)] for i in range(n)] + [VERMILLION] + \
                  [PALETTE[i % len(PALETTE)] for i in range(n)]
    fig = go.Figure(go.Sankey(
        arrangement="snap",
        node=dict(label=labels, color=node_colors, pad=18, thickness=16),
        # labels in the page's strongest text colour at 14 px (plotly's default grey 12 px with a halo
        # read faintly over the links in the light theme)
        textfont=dict(size=14, color=SANKEY_TEXT.get(theme, SANKEY_TEXT["light"])),
        link=dict(source=src, target=dst, value=val, color=col, customdata=hover,
                  hovertemplate="%{customdata}<extra></extra>")))
    title = ("WRONG rule: on rejection resample from p" if wrong
             else "Exact rule: on rejection resample from the residual")
    return base_layout(fig, title, height=360)


def monte_carlo_figure(mc: dict, target, names: list[str], wrong_mc: dict | None = None) -> go.Figure:
    fig = go.Figure()
    target = np.asarray(target, float)
    lo, hi = np.asarray(mc["band_lo"]), np.asarray(mc["band_hi"])
    fig.add_trace(go.Bar(x=names, y=target, name="target p", marker_color=GRAY))
    fig.add_trace(go.Bar(x=names, y=mc["freq"], name=f"exact algorithm ({mc['draws']:,} draws)",
                         marker_color=BLUE,
                         error_y=dict(type="data", symmetric=False, array=np.maximum(hi - np.asarray(mc["freq"]), 0),
                                      arrayminus=np.maximum(np.asarray(mc["freq"]) - lo, 0), visible=False)))
    if wrong_mc is not None:
        fig.add_trace(go.Bar(x=names, y=wrong_mc["freq"], name="wrong rule (resample from p)", marker_color=VERMILLION))
    fig.add_trace(go.Scatter(x=names, y=hi, mode="markers", marker=dict(symbol="line-ew-open", size=26, color="#333"),
                             name="99% band around p", hoverinfo="skip"))
    fig.add_trace(go.Scatter(x=names, y=lo, mode="markers", marker=dict(symbol="line-ew-open", size=26, color="#333"),
                             showlegend=False, hoverinfo="skip"))
    fig.update_layout(barmode="group", yaxis_title="probability")
    return base_layout(fig, "Monte Carlo: emitted-token frequencies", height=340)


def expected_tokens_chart(alphas, max_gamma: int = 10, mark: tuple[float, int] | None = None) -> go.Figure:
    g = np.arange(0, max_gamma + 1)
    fig = go.Figure()
    seen, unique = set(), []
    for a in alphas:              # one curve per α: the selected α may equal a reference one (0.8 twice)
        key = round(float(a), 9)
        if key not in seen:
            seen.add(key)
            unique.append(a)
    for i, a in enumerate(unique):
        fig.add_trace(go.Scatter(x=g, y=[spec.expected_tokens(float(a), int(k)) for k in g], mode="lines+markers",
                                 name=f"α = {a:g}", line_color=PALETTE[i % len(PALETTE)],
                                 hovertemplate="γ=%{x}: %{y:.3f} tokens<extra>α=" + f"{a:g}" + "</extra>"))
    if mark:
        a, k = mark
        fig.add_trace(go.Scatter(x=[k], y=[spec.expected_tokens(a, k)], mode="markers", name="current",
                                 marker=dict(size=14, symbol="star", color="#000")))
    fig.update_layout(xaxis_title="γ (draft tokens per verification)",
                      yaxis_title="expected tokens")   # short: the title says per what; fits a phone
    return base_layout(fig, "Expected tokens per target verification: (1 − α^(γ+1)) / (1 − α)", height=340)


def break_even_chart(alpha: float, gamma: int, verify_cost: float, max_draft_cost: float = 1.0) -> go.Figure:
    c = np.linspace(0, max_draft_cost, 101)
    s = [spec.speedup(alpha, gamma, float(x), verify_cost) for x in c]
    be = spec.break_even_draft_cost(alpha, gamma, verify_cost)
    fig = go.Figure(go.Scatter(x=c, y=s, mode="lines", name="speedup",
                               hovertemplate="draft cost %{x:.2f}: %{y:.3f}x<extra></extra>"))
    fig.add_hline(y=1.0, line_dash="dash", line_color="#888", annotation_text="no gain")
    if 0 <= be <= max_draft_cost:
        fig.add_vline(x=be, line_dash="dot", line_color=VERMILLION, annotation_text=f"break-even {be:.3f}")
    fig.update_layout(xaxis_title="draft step cost (fraction of a target step)",
                      yaxis_title="speedup vs plain decoding")
    return base_layout(fig, f"Break-even: α = {alpha:.3f}, γ = {gamma}, verify = {verify_cost:g}x a decode step",
                       height=340)


def acceptance_by_position_figure(positions: list[int], rates: list[float], counts: list[int]) -> go.Figure:
    fig = go.Figure(go.Bar(x=positions, y=rates, customdata=counts,
                           hovertemplate="position %{x}: %{y:.3f} (n=%{customdata})<extra></extra>"))
    fig.update_layout(xaxis_title="draft position", yaxis_title="acceptance rate", yaxis_range=[0, 1],
                      xaxis=dict(tickmode="array", tickvals=list(positions)))   # whole positions, not -0.5, 0.5
    return base_layout(fig, "Measured acceptance per draft position", height=300)
