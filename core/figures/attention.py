"""Attention-tile figures: online softmax steps, tile visit grid, HBM traffic."""
from __future__ import annotations

import math

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from core.figures import BLUE, VERMILLION, base_layout, log_ticks
from core.formulas.tiles import TileStep, hbm_traffic_bytes


def online_softmax_figure(steps: list[TileStep], upto: int, full_value: float, wrong_value: float) -> go.Figure:
    """Left: each tile's probability mass at the final scale (what the tile contributes).
    Right: the running output after each tile, the full-softmax answer and the wrong
    average of tile averages."""
    final_m = steps[-1].m
    mass = [s.tile_sum * math.exp(s.m - final_m) / steps[-1].l for s in steps]
    outs = [float(s.output) for s in steps[: upto + 1]]
    fig = make_subplots(rows=1, cols=2, subplot_titles=("share of softmax mass per tile", "output so far"))
    colors = [BLUE if i <= upto else "#D9D9D9" for i in range(len(steps))]
    fig.add_trace(go.Bar(x=[f"tile {s.tile}" for s in steps], y=mass, marker_color=colors, name="mass",
                         hovertemplate="%{x}: %{y:.4f} of the total<extra></extra>"), row=1, col=1)
    fig.add_trace(go.Scatter(x=list(range(len(outs))), y=outs, mode="lines+markers", name="running output",
                             hovertemplate="after tile %{x}: %{y:.6f}<extra></extra>"), row=1, col=2)
    # each label on the far side of its line from the other line; the long one in two lines, so
    # that both fit the right half of a phone-width chart
    above = full_value >= wrong_value
    fig.add_hline(y=full_value, line_dash="dash", line_color=BLUE, row=1, col=2,
                  annotation_text=f"full softmax {full_value:.6g}",
                  annotation_position="top left" if above else "bottom left")
    fig.add_hline(y=wrong_value, line_dash="dot", line_color=VERMILLION, row=1, col=2,
                  annotation_text=f"average of tile averages<br>{wrong_value:.6g} (wrong)",
                  annotation_position="bottom left" if above else "top left")
    fig.update_xaxes(title_text="tiles visited", row=1, col=2, range=[-0.5, len(steps) - 0.5], dtick=1)
    fig.update_layout(showlegend=False)
    return base_layout(fig, None, height=340)


def tile_grid(seq_len: int, block_q: int, block_k: int, causal: bool = True) -> go.Figure:
    """Query tiles (rows) x key tiles (columns): visit order within each query tile, tiles
    skipped by the causal mask in gray, diagonal tiles (partly masked) marked."""
    nq, nk = math.ceil(seq_len / block_q), math.ceil(seq_len / block_k)
    z = np.full((nq, nk), np.nan)
    text = np.full((nq, nk), "", dtype=object)
    for i in range(nq):
        q0, q1 = i * block_q, min((i + 1) * block_q, seq_len) - 1
        order = 0
        for j in range(nk):
            k0, k1 = j * block_k, min((j + 1) * block_k, seq_len) - 1
            if causal and k0 > q1:
                z[i, j] = -1
                text[i, j] = "skip"
                continue
            partial = causal and k1 > q0
            z[i, j] = order
            text[i, j] = f"{order + 1}" + ("*" if partial else "")
            order += 1
    fig = go.Figure(go.Heatmap(z=z, text=text, texttemplate="%{text}", x=[f"K{j}" for j in range(nk)],
                               y=[f"Q{i}" for i in range(nq)], colorscale="Blues", zmin=-1, showscale=False,
                               xgap=2, ygap=2,
                               hovertemplate="query tile %{y}, key tile %{x}: %{text}<extra></extra>"))
    fig.update_yaxes(autorange="reversed")
    return base_layout(fig, f"Tile visits: {seq_len} positions, {block_q} x {block_k} tiles"
                            + (" (causal; * = partly masked)" if causal else ""), height=160 + 28 * nq)


def hbm_traffic_chart(seq_lens, head_dim: int, dtype_bytes: float, block_q: int, causal: bool = True) -> go.Figure:
    naive, tiled = [], []
    for T in seq_lens:
        r = hbm_traffic_bytes(int(T), head_dim, dtype_bytes, block_q, causal)
        naive.append(r["naive_bytes"] / 2**20)
        tiled.append(r["tiled_bytes"] / 2**20)
    fig = go.Figure()
    fig.add_trace(go.Scatter(x=list(seq_lens), y=naive, mode="lines+markers", name="naive (scores in HBM)",
                             hovertemplate="T=%{x}: %{y:,.1f} MiB<extra>naive</extra>"))
    fig.add_trace(go.Scatter(x=list(seq_lens), y=tiled, mode="lines+markers", name="tiled (scores on chip)",
                             hovertemplate="T=%{x}: %{y:,.1f} MiB<extra>tiled</extra>"))
    fig.update_xaxes(type="log", title_text="sequence length", **log_ticks(seq_lens))
    fig.update_yaxes(type="log", title_text="HBM traffic per head (MiB)", **log_ticks(naive + tiled))
    return base_layout(fig, f"HBM traffic estimate, head dim {head_dim}, {dtype_bytes:g}-byte elements",
                       height=340)


def tile_event_groups(rows: list[dict]) -> dict[tuple, list[dict]]:
    """Captured `tiles` events by (layer, head, query tile), in key order; one group is one
    captured_tiles_figure."""
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        groups.setdefault((r.get("layer"), r.get("head"), r.get("q_tile")), []).append(r)
    return dict(sorted(groups.items()))


def captured_tiles_figure(rows: list[dict]) -> go.Figure:
    """Per-tile running max m and log-sum-exp (m + ln l) of captured kernel statistics,
    one line per query row, x = key tile. Rows from several kernel calls (request, step,
    layer, head, query tile) are not mixed: the first call's are drawn and the title says
    which (mixing them drew each row as a zig-zag between calls)."""
    key = lambda r: tuple(r.get(k) for k in ("req", "step", "layer", "head", "q_tile"))
    first = key(rows[0]) if rows else None
    calls = len({key(r) for r in rows})
    rows = [r for r in rows if key(r) == first]
    fig = make_subplots(rows=1, cols=2, subplot_titles=("running max m", "log-sum-exp m + ln l"))
    by_row: dict[int, list] = {}
    for r in rows:
        for i, (m, l) in enumerate(zip(r["m"], r["l"])):
            by_row.setdefault(i, []).append((r["kv_tile"], m, m + math.log(l) if l > 0 else float("nan")))
    drawn = sorted(by_row.items())[:16]
    # one colour per query row, the same in both panels and the legend (the default colour cycle
    # gave a row's two traces different colours and repeated every 5 rows), ordered like the rows
    from plotly.colors import sample_colorscale
    colors = sample_colorscale("Viridis", [k / max(len(drawn) - 1, 1) * 0.9 for k in range(len(drawn))])
    for (i, pts), color in zip(drawn, colors):
        pts.sort()
        x = [p[0] for p in pts]
        style = dict(mode="lines+markers", name=f"row {i}", legendgroup=str(i), line=dict(color=color),
                     marker=dict(color=color))
        fig.add_trace(go.Scatter(x=x, y=[p[1] for p in pts], **style), row=1, col=1)
        fig.add_trace(go.Scatter(x=x, y=[p[2] for p in pts], showlegend=False, **style), row=1, col=2)
    fig.update_xaxes(title_text="key tile", dtick=1)
    title = None
    if first is not None:
        req, step, layer, head, q_tile = first
        title = (f"request {req}, step {step}, layer {layer}, head {head}, query tile {q_tile}"
                 + (f" (1 of {calls} kernel calls captured)" if calls > 1 else ""))
    # the legend below the panels, clear of their titles (up to 16 rows: four lines on a phone)
    return base_layout(fig, title, height=400)
