"""What an engine says about itself: its prefix cache over time (vLLM's KV events), each
request's phases inside the engine (its spans: queue, prefill, decode), and the steps of its
iteration log (counts and durations, no requests)."""
from __future__ import annotations

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from core.figures import CURSOR, GRAY, PALETTE, base_layout

PHASES = (("engine_queue_ms", "queued", PALETTE[7]), ("engine_prefill_ms", "prefill", "#F2B701"),
          ("engine_decode_ms", "decode", "#80B1D3"))


def prefix_cache_figure(over_time, cursor_ms: float | None = None, title: str | None = None,
                        simulated=None) -> go.Figure:
    """Top: cached blocks over time, stacked by prefix chain (core.analysis.kv_events.cache_over_time),
    clears as dashed lines; bottom: blocks stored (up) and removed (down) per time bin. With
    `simulated` (simulated_cache_over_time of the same workload) its cached-block count is drawn
    over the top panel for comparison."""
    fig = make_subplots(rows=2, cols=1, shared_xaxes=True, row_heights=[0.62, 0.38], vertical_spacing=0.08)
    t = over_time["t_ms"].to_numpy(dtype=float)
    chains = over_time.attrs.get("chains", []) + ["other chains"]
    for k, c in enumerate(chains):
        if not over_time[c].any():
            continue
        fig.add_trace(go.Scatter(x=t, y=over_time[c], mode="lines", stackgroup="cached", name=c,
                                 line=dict(shape="hv", width=0.5, color=GRAY if c == "other chains" else
                                           PALETTE[k % len(PALETTE)]),
                                 hovertemplate=f"{c}: %{{y}} blocks at %{{x:.1f}} ms<extra></extra>"), row=1, col=1)
    if simulated is not None and len(simulated):
        fig.add_trace(go.Scatter(x=simulated["t_ms"], y=simulated["cached"], mode="lines", name="simulator (same "
                                 "workload)", line=dict(shape="hv", color="#000000", dash="dash", width=1.5)),
                      row=1, col=1)
    for x in t[over_time["op"].to_numpy() == "cleared"]:
        fig.add_vline(x=float(x), line_dash="dash", line_color=PALETTE[5], row=1, col=1)
    if len(t):
        span = max(float(t.max() - t.min()), 1.0)
        width = span / 60
        bins = np.floor((t - t.min()) / width)
        ops = over_time["op"].to_numpy()
        centers = np.arange(int(bins.max()) + 1) * width + t.min() + width / 2
        stored = np.bincount(bins.astype(int), weights=(ops == "stored").astype(float), minlength=len(centers))
        removed = np.bincount(bins.astype(int), weights=(ops == "removed").astype(float), minlength=len(centers))
        fig.add_trace(go.Bar(x=centers, y=stored, width=width, name="stored", marker_color=PALETTE[2],
                             hovertemplate="%{y} blocks stored<extra></extra>"), row=2, col=1)
        fig.add_trace(go.Bar(x=centers, y=-removed, width=width, name="removed (evicted)", marker_color=PALETTE[5],
                             hovertemplate="%{y} blocks removed<extra></extra>"), row=2, col=1)
    if cursor_ms is not None:
        fig.add_vline(x=cursor_ms, line_color=CURSOR, line_width=2)
    fig.update_yaxes(title_text="cached", row=1, col=1)
    fig.update_yaxes(title_text="per bin", row=2, col=1)
    fig.update_xaxes(title_text="time (ms)", row=2, col=1)
    fig.update_layout(barmode="relative", bargap=0)
    n = over_time.attrs.get("chain_count", 0)
    reps = over_time.attrs.get("replicas", 1)
    if title is None and reps > 1:
        title = f"The fleet's prefix caches ({reps} replicas' own KV events, their sum; chains by replica): {n} chains"
    # 500 px: on a phone the legend takes a row per entry below the plot, which kept ~60 px for both panels
    return base_layout(fig, title or f"The engine's prefix cache (its KV events): {n} prefix chains", height=500)


def engine_phases_figure(ids: list[str], arrival_ms, extras: list[dict], cursor_ms: float | None = None,
                         limit: int = 80) -> go.Figure:
    """Per request, the engine's own account of it (vLLM's span): queued, prefill, decode, from
    its arrival at the engine."""
    rows = [(i, rid) for i, rid in enumerate(ids) if any(k in extras[i] for k, _, _ in PHASES)][:limit]
    fig = go.Figure()
    for key, name, color in PHASES:
        base, length, ys = [], [], []
        for i, rid in rows:
            ex = extras[i]
            start = float(ex.get("engine_arrival_ms", arrival_ms[i]))
            for k2, _, _ in PHASES:
                if k2 == key:
                    break
                start += float(ex.get(k2, 0.0))
            base.append(start)
            length.append(float(ex.get(key, 0.0)))
            ys.append(str(rid)[-14:])
        fig.add_trace(go.Bar(y=ys, x=length, base=base, orientation="h", name=name, marker_color=color,
                             hovertemplate="%{y}: " + name + " %{x:.3f} ms<extra></extra>"))
    lo = [float(extras[i].get("engine_arrival_ms", arrival_ms[i])) for i, _ in rows]
    hi = [a + sum(float(extras[i].get(k, 0.0)) for k, _, _ in PHASES) for a, (i, _) in zip(lo, rows)]
    if cursor_ms is not None:
        fig.add_vline(x=cursor_ms, line_color=CURSOR, line_width=2)
        lo, hi = lo + [cursor_ms], hi + [cursor_ms]
    if lo:
        pad = 0.03 * max(max(hi) - min(lo), 1.0)
        fig.update_xaxes(range=[min(lo) - pad, max(hi) + pad])
    fig.update_layout(barmode="overlay", xaxis_title="time (ms)", yaxis=dict(type="category", autorange="reversed"))
    return base_layout(fig, "Inside the engine, per request (its spans: queue, prefill, decode)",
                       height=min(120 + 14 * max(len(rows), 1), 600))


def counted_steps_figure(steps, cursor_ms: float | None = None) -> go.Figure:
    """An engine's logged steps (no requests): duration over time, prefill steps and decode-only
    steps apart, the marker's size by the tokens computed. A fleet's (a replica column naming
    several): each replica's steps apart, prefill steps filled and decode-only ones open."""
    fig = go.Figure()
    pre = steps["prefill_reqs"].to_numpy() > 0
    tokens = steps["prefill_tokens"].to_numpy() + steps["decode_tokens"].to_numpy()
    reps = sorted(set(steps["replica"].tolist())) if "replica" in steps else [0]
    rep = steps["replica"].to_numpy() if len(reps) > 1 else np.zeros(len(steps), dtype=int)
    groups = [(pre, "with prefill", "#F2B701", "circle"), (~pre, "decode only", "#80B1D3", "circle")]
    if len(reps) > 1:
        from core.figures.fleet import color_of
        groups = [(pre & (rep == k), f"r{k} with prefill", color_of(k), "circle") for k in reps] + \
                 [(~pre & (rep == k), f"r{k} decode only", color_of(k), "circle-open") for k in reps]
    for mask, name, color, symbol in groups:
        s = steps[mask]
        fig.add_trace(go.Scattergl(
            x=s["t_ms"], y=s["dur_ms"], mode="markers", name=name,
            marker=dict(color=color, size=np.clip(4 + np.sqrt(tokens[mask]) / 2, 4, 16), symbol=symbol,
                        line=dict(width=1 if symbol.endswith("open") else 0, color=color)),
            customdata=np.stack([s["prefill_reqs"], s["prefill_tokens"], s["decode_reqs"]], axis=1),
            hovertemplate="%{x:.1f} ms: %{y:.2f} ms; prefill %{customdata[0]} req / %{customdata[1]} tok, "
                          "decode %{customdata[2]} req<extra></extra>"))
    if cursor_ms is not None:
        fig.add_vline(x=cursor_ms, line_color=CURSOR, line_width=2)
    fig.update_layout(xaxis_title="time (ms)", yaxis_title="step duration (ms)")
    title = (f"Each replica's steps ({len(reps)} replicas), from their iteration logs" if len(reps) > 1
             else "The engine's steps, from its iteration log")
    return base_layout(fig, title, height=300)
