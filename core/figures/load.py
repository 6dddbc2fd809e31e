"""Throughput-latency curves of load sweeps (core.experiments.sweep), one color per policy."""
from __future__ import annotations

import math

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from core.config import describe_options as describe
from core.figures import PALETTE, base_layout, log_ticks

# each panel's title says what its line styles mean (dashes are p50 in three panels, goodput in the
# fourth), so the legend needs only the policies' colours
PANELS = (("ttft_ms", "TTFT (ms)<br>solid p99 · dashed p50"), ("tpot_ms", "TPOT (ms)<br>solid p99 · dashed p50"),
          ("e2e_ms", "E2E (ms)<br>solid p99 · dashed p50"), (None, "tokens / s<br>solid output · dashed goodput"))


MEASURED = ("#222222", "#8C564B", "#17BECF", "#7F7F7F")


def _cell(k: int) -> tuple[int, int]:
    """The (row, col) of panel k (PANELS order) in the 2 x 2 grid."""
    return k // 2 + 1, k % 2 + 1


def _panel_series(metric: str | None, pts: list[dict]) -> list[tuple[str, list, str]]:
    """(name, y values, dash) of one policy's lines in one panel."""
    if metric is None:
        series = [("output", [p["output_tok_per_s"] for p in pts], "solid")]
        if pts and "slo" in pts[0]:
            series.append(("goodput", [p["slo"]["goodput_tok_per_s"] for p in pts], "dash"))
        return series
    return [("p99", [p[metric]["p99"] for p in pts], "solid"),
            ("p50", [p[metric]["p50"] for p in pts], "dash")]


def _policy_traces(fig: go.Figure, label: str, res: dict, color: str, key: str) -> None:
    """One policy's lines in every panel, and its capacity as a star."""
    pts = res["points"]
    x = [p[key] for p in pts]
    for k, (metric, _) in enumerate(PANELS):
        row, col = _cell(k)
        for name, y, dash in _panel_series(metric, pts):
            fig.add_trace(go.Scatter(x=x, y=y, mode="lines+markers", name=label,
                                     legendgroup=label, showlegend=k == 0 and name == "p99",
                                     line=dict(color=color, dash=dash), marker=dict(size=5),
                                     hovertemplate=f"{label} {name}<br>{key} %{{x:g}}: %{{y:,.3f}}<extra></extra>"),
                          row=row, col=col)
    cap = res.get("capacity")
    if cap is not None:
        at = next(p for p in pts if p[key] == cap[key])
        fig.add_trace(go.Scatter(x=[cap[key]], y=[at["output_tok_per_s"]], mode="markers", showlegend=False,
                                 marker=dict(symbol="star", size=14, color=color, line=dict(width=1)),
                                 hovertemplate=(f"{label}: capacity {key} %{{x:g}} (SLO attainment "
                                                f"{cap['attainment']:.3f} >= {cap['target']:g})<extra></extra>")),
                      row=2, col=2)


def _measured_traces(fig: go.Figure, j: int, p: dict, key: str) -> None:
    """A measured run (the j-th) as diamonds at its load in every panel."""
    color = MEASURED[j % len(MEASURED)]
    for k, (metric, _) in enumerate(PANELS):
        row, col = _cell(k)
        marks = ([("output", p["output_tok_per_s"], "diamond")] if metric is None else
                 [("p99", p[metric]["p99"], "diamond"), ("p50", p[metric]["p50"], "diamond-open")])
        for name, y, symbol in marks:
            fig.add_trace(go.Scatter(x=[p[key]], y=[y], mode="markers", name=f"{p['origin']}: {p['label']}",
                                     legendgroup=f"m{j}", showlegend=k == 0 and name == "p99",
                                     marker=dict(symbol=symbol, size=11, color=color, line=dict(width=1.5)),
                                     hovertemplate=f"{p['origin']}: {p['label']} {name}<br>{key} %{{x:g}}: "
                                                   f"%{{y:,.3f}}<extra></extra>"),
                          row=row, col=col)


def _slo_lines(fig: go.Figure, slo, xs: list) -> None:
    """The SLO's latency bounds as gray lines across the loads `xs` (sorted, not empty)."""
    for k, (metric, _) in enumerate(PANELS[:3]):
        bound = getattr(slo, metric)
        if bound is not None:   # a line trace, not a shape: shape labels on log axes are in log units
            row, col = _cell(k)
            fig.add_trace(go.Scatter(x=[xs[0], xs[-1]], y=[bound, bound], mode="lines", showlegend=False,
                                     name=f"SLO {metric.split('_')[0].upper()} <= {bound:g} ms",
                                     line=dict(color="#666", dash="dot", width=1.5),
                                     hovertemplate=f"SLO: {metric.split('_')[0].upper()} <= {bound:g} ms"
                                                   "<extra></extra>"),
                          row=row, col=col)


def _load_axes(fig: go.Figure, xlabel: str, log_y: bool) -> None:
    """The bottom panels' x titles; the latency panels' log y axes, ticked from their own values."""
    for k in range(4):
        row, col = _cell(k)
        fig.update_xaxes(title_text=xlabel if k >= 2 else None, row=row, col=col)
        if log_y and k < 3:   # ticks from the panel's own values, every label at full size
            axis = "y" if k == 0 else f"y{k + 1}"
            ys = [v for tr in fig.data if (tr.yaxis or "y") == axis for v in (tr.y if tr.y is not None else ())]
            fig.update_yaxes(type="log", row=row, col=col, **log_ticks(ys))


def load_curves(results: dict[str, dict], slo=None, log_y: bool = True, measured: list[dict] = ()) -> go.Figure:
    """results: {policy label: sweep result}. p50 dashed, p99 solid; output tokens/s solid and
    goodput dashed; SLO bounds as gray lines; each policy's capacity marked with a star.
    `measured`: runs as points (core.lessons.load.measured_point) drawn as diamonds at their load:
    p99 (filled) and p50 (open) latencies, output tokens/s."""
    first = next(iter(results.values()), None)
    key = "rate" if first and first["kind"] == "open" else "concurrency"
    # at most ~24 characters a line: the two bottom panels' axis titles side by side fit a phone's width
    xlabel = "offered load<br>(requests / s, Poisson)" if key == "rate" else "clients in a closed loop"
    fig = make_subplots(rows=2, cols=2, subplot_titles=[t for _, t in PANELS], vertical_spacing=0.2,
                        horizontal_spacing=0.08)
    for i, (label, res) in enumerate(results.items()):
        _policy_traces(fig, label, res, PALETTE[i % len(PALETTE)], key)
    for j, p in enumerate(measured):
        _measured_traces(fig, j, p, key)
    xs = sorted({p[key] for r in results.values() for p in r["points"]} | {p[key] for p in measured})
    if slo is not None and xs:
        _slo_lines(fig, slo, xs)
    _load_axes(fig, xlabel, log_y)
    base_layout(fig, None, height=620)
    # one entry per policy (and measured run), at the top: above the fold at 1280x800, beside the
    # panels' titles that say what solid and dashed mean
    fig.update_layout(legend=dict(orientation="h", xref="paper", x=0, xanchor="left", yref="container", y=1,
                                  yanchor="top"), margin=dict(t=100))    # room for a legend of two rows
    fig.update_annotations(font_size=12)
    return fig


def _search_y(p: dict, priced: bool):
    """A search point's y: its cost per 1,000 good tokens when priced, else its TTFT p99."""
    return p["cost_per_1k_good_tokens_usd"] if priced else p["ttft_ms"]["p99"]


def _same_results(done: list[dict], meets: bool, priced: bool) -> list[list[dict]]:
    """The points that meet the SLOs (or miss them) with a y, grouped by equal (goodput, y), in first-seen order."""
    groups: dict[tuple, list[dict]] = {}
    for p in done:
        if p["meets"] == meets and _search_y(p, priced) is not None:
            groups.setdefault((f"{p['slo']['goodput_tok_per_s']:.9g}", f"{_search_y(p, priced):.9g}"), []).append(p)
    return list(groups.values())


def _pareto_front(done: list[dict], priced: bool) -> list[dict]:
    """The points that meet the SLOs with no other one both cheaper and of more goodput, most goodput first."""
    ok = sorted((p for p in done if p["meets"] and _search_y(p, priced) is not None),
                key=lambda p: (-p["slo"]["goodput_tok_per_s"], _search_y(p, priced)))
    front, best_y = [], math.inf
    for p in ok:                          # most goodput first: keep each that is cheaper than all before it
        if _search_y(p, priced) < best_y:
            front.append(p)
            best_y = _search_y(p, priced)
    return front


def _results_trace(same: list[list[dict]], name: str, color: str, symbol: str, priced: bool,
                   y_hover: str) -> go.Scatter:
    """One marker per group of points with the same result, sized by and labelled with their number."""
    return go.Scatter(
        x=[g[0]["slo"]["goodput_tok_per_s"] for g in same], y=[_search_y(g[0], priced) for g in same],
        mode="markers+text", name=name, text=[f"×{len(g)}" if len(g) > 1 else "" for g in same],
        textposition="middle right",
        marker=dict(color=color, symbol=symbol, size=[10 + 4 * math.sqrt(len(g) - 1) for g in same],
                    line=dict(width=1)),
        customdata=[["<br>".join(describe(p["config"]) for p in g), g[0]["slo"]["attainment"], len(g)]
                    for g in same],
        hovertemplate="%{customdata[2]} configuration(s):<br>%{customdata[0]}<br>goodput %{x:,.1f} tok/s<br>"
                      + y_hover + "<br>SLO met %{customdata[1]:.3f}<extra></extra>")


def search_figure(points: list[dict], priced: bool, best: dict | None = None) -> go.Figure:
    """A capacity search (core.experiments.search) as a scatter: goodput (x) against cost per 1,000 good
    tokens (y, on a log axis labelled in plain USD, never SI prefixes such as "µ"; without a price,
    TTFT p99), SLO met or not by colour and symbol, the Pareto front of the configurations that
    meet the SLOs (no other one both cheaper and of more goodput) as a line, and `best` (the search's
    answer) as a star. Configurations with the same result share one marker, sized by how many they
    are, labelled "×N" and each named in its hover. Configurations stopped early, invalid, not
    simulated, or without goodput (no cost) are not drawn (the table lists them with the reason)."""
    done = [p for p in points if "meets" in p and p["slo"]["goodput_tok_per_s"] is not None]
    fig = go.Figure()

    def y_of(p):
        return _search_y(p, priced)

    y_hover = "USD %{y:.3~r} per 1,000 good tokens" if priced else "TTFT p99 %{y:,.1f} ms"
    for meets, name, color, symbol in ((True, "meets the SLOs", PALETTE[2], "circle"),
                                       (False, "misses them", PALETTE[5], "x")):
        fig.add_trace(_results_trace(_same_results(done, meets, priced), name, color, symbol, priced, y_hover))
    front = _pareto_front(done, priced)
    if len(front) > 1:
        fig.add_trace(go.Scatter(x=[p["slo"]["goodput_tok_per_s"] for p in front], y=[y_of(p) for p in front],
                                 mode="lines", name="Pareto front", line=dict(color=PALETTE[2], dash="dot"),
                                 hoverinfo="skip"))
    if best is not None and y_of(best) is not None:
        fig.add_trace(go.Scatter(
            x=[best["slo"]["goodput_tok_per_s"]], y=[y_of(best)], mode="markers+text",
            name="cheapest meeting the SLOs" if priced else "the answer (most goodput)", text=["best"],
            textposition="top center", marker=dict(symbol="star", size=20, color=PALETTE[6], line=dict(width=1.5)),
            customdata=[[describe(best["config"])]],
            hovertemplate="the search's answer: %{customdata[0]}<br>goodput %{x:,.1f} tok/s<br>" + y_hover
                          + "<extra></extra>"))
    ys = [y_of(p) for p in done if y_of(p) is not None]
    if priced:
        fig.update_yaxes(type="log", tickformat=".2~r", exponentformat="none", **log_ticks(ys))
    fig.update_layout(xaxis_title="goodput (tok/s of requests that met every SLO)",
                      yaxis_title="USD per 1,000 good tokens" if priced else "TTFT p99 (ms)")
    return base_layout(fig, "Capacity search: every configuration at this load", height=420)
