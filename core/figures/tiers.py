"""KV tiers: occupancy of the GPU pool and the CPU tier over time, the copies between them, and an
animation of blocks leaving for the CPU tier and coming back on a hit."""
from __future__ import annotations

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from core.analysis.kv_tiers import copies
from core.figures import PALETTE, base_layout, wrap_title
from core.figures.animate import CONTROLS_PX, play_controls

STORE_COLOR, LOAD_COLOR, EVICT_COLOR = "#0072B2", "#D55E00", "#999999"   # Okabe-Ito


def cpu_resident(trace) -> tuple[np.ndarray, np.ndarray]:
    """CPU-tier blocks held over time: each store adds its blocks when decided, each eviction drops
    its blocks (times ms, blocks after each event)."""
    t = copies(trace)
    t = t[t["op"].isin(["store", "evict"])]
    if not len(t):
        return np.zeros(0), np.zeros(0)
    when = np.where(t["op"] == "store", t["offered_ms"], t["t_ms"]).astype(float)
    delta = np.where(t["op"] == "store", t["blocks"], -t["blocks"]).astype(np.int64)
    order = np.argsort(when, kind="stable")
    return when[order], np.cumsum(delta[order])


def tier_occupancy_figure(trace, cpu_capacity: int | None = None, title: str | None = None) -> go.Figure:
    """Top: GPU KV blocks in use (the steps' gauge) and CPU-tier blocks held; bottom: blocks copied per
    copy, stores up (GPU to CPU) and loads down (back to the GPU before a prefill)."""
    fig = make_subplots(rows=2, cols=1, shared_xaxes=True, row_heights=[0.62, 0.38], vertical_spacing=0.08)
    st = trace.steps
    if len(st):
        fig.add_trace(go.Scatter(x=st["t_ms"] / 1e3, y=st["kv_used_blocks"], mode="lines", line_shape="hv",
                                 name="GPU pool: blocks in use", line_color=PALETTE[0],
                                 hovertemplate="%{x:.3f} s: %{y:,} GPU blocks in use<extra></extra>"), 1, 1)
    t, held = cpu_resident(trace)
    if len(t):
        fig.add_trace(go.Scatter(x=t / 1e3, y=held, mode="lines", line_shape="hv", name="CPU tier: blocks held",
                                 line_color=PALETTE[2],
                                 hovertemplate="%{x:.3f} s: %{y:,} CPU blocks held<extra></extra>"), 1, 1)
    if cpu_capacity:
        fig.add_hline(y=cpu_capacity, line_dash="dot", line_color=PALETTE[2], row=1, col=1,
                      annotation_text=f"CPU tier capacity {cpu_capacity:,}", annotation_position="top left")
    c = copies(trace)
    for op, sign, color, name in (("store", 1, STORE_COLOR, "stored (GPU → CPU)"),
                                  ("load", -1, LOAD_COLOR, "loaded (CPU → GPU)")):
        s = c[c["op"] == op]
        if len(s):   # a stem from 0 to the copy's blocks (None breaks the line between copies)
            x = np.repeat(s["t_ms"].to_numpy(float) / 1e3, 3)
            y = np.c_[np.zeros(len(s)), sign * s["blocks"].to_numpy(float), np.full(len(s), np.nan)].ravel()
            fig.add_trace(go.Scatter(x=x, y=y, mode="lines", line=dict(color=color, width=2), name=name,
                                     hoverinfo="skip"), 2, 1)
            fig.add_trace(go.Scatter(x=s["t_ms"] / 1e3, y=sign * s["blocks"], mode="markers", marker_color=color,
                                     showlegend=False, customdata=np.c_[s["req"].astype(str), s["blocks"],
                                                                        s["dur_ms"]],
                                     hovertemplate="%{x:.3f} s: %{customdata[0]} " + op + "s %{customdata[1]} "
                                     "blocks in %{customdata[2]:.3f} ms<extra></extra>"), 2, 1)
    fig.update_yaxes(title_text="KV blocks", row=1, col=1)
    fig.update_yaxes(title_text="blocks copied", row=2, col=1)
    fig.update_xaxes(title_text="time (s)", row=2, col=1)
    return base_layout(fig, title or "KV blocks by tier over time, and the copies between them", height=480)


def tier_animation_figure(trace, gpu_blocks: int, cpu_blocks: int, max_frames: int = 80) -> go.Figure:
    """One frame per copy (the first `max_frames`): the GPU pool (left) and the CPU tier (right) as grids
    of blocks; CPU blocks held are coloured by the request that stored them, and the copy's blocks are
    outlined on both sides (store: blue, leaving the GPU; load: orange, coming back for a hit; evict: grey),
    with a line saying what the copy is. Played in the browser (core.figures.animate.play_controls)."""
    ev = trace.events_of("tier")[:max_frames]
    cols_g = max(8, int(np.ceil(np.sqrt(max(gpu_blocks, 1)))))
    cols_c = max(8, int(np.ceil(np.sqrt(max(cpu_blocks, 1)))))
    cx0 = cols_g + 3

    def xy(ids, cols, x0):
        ids = np.asarray(list(ids), dtype=np.int64)
        return x0 + (ids % cols), -(ids // cols)

    held: dict[int, str] = {}   # CPU chunk -> the request that stored it
    colour: dict[str, str] = {}
    frames = []
    for k, e in enumerate(ev):
        if e["op"] == "store":
            colour.setdefault(e["req"], PALETTE[len(colour) % len(PALETTE)])
            held.update((ch, e["req"]) for ch in e["chunks"])
        elif e["op"] == "evict":
            for ch in e["chunks"]:
                held.pop(ch, None)
        line = {"store": STORE_COLOR, "load": LOAD_COLOR, "evict": EVICT_COLOR}[e["op"]]
        hx, hy = xy(held, cols_c, cx0)
        gx, gy = xy(e["gpu_blocks"], cols_g, 0)
        mx, my = xy(e["chunks"], cols_c, cx0)
        n = f"{e['blocks']} block{'s' if e['blocks'] != 1 else ''}"
        verb = {"store": f"{e['req']} stores {n} in the CPU tier",
                "load": f"{e['req']} loads {n} back (a CPU hit) before its prefill",
                "evict": f"{n} evicted from the CPU tier to make room"}[e["op"]]
        outline = dict(symbol="square-open", size=11, color=line, line=dict(width=2))
        frames.append(go.Frame(name=str(k), traces=[2, 3, 4, 5], data=[
            go.Scatter(x=hx, y=hy, mode="markers", text=[f"stored by {r}" for r in held.values()],
                       marker=dict(symbol="square", size=9, color=[colour[r] for r in held.values()]),
                       hovertemplate="CPU chunk %{text}<extra></extra>"),
            go.Scatter(x=gx, y=gy, mode="markers", marker=outline, hovertemplate="GPU block<extra></extra>"),
            go.Scatter(x=mx, y=my, mode="markers", marker=outline, hovertemplate="CPU chunk<extra></extra>"),
            go.Scatter(text=[wrap_title(f"{e['t_ms'] / 1e3:.3f} s: {verb}", 44)])]))
    ax, ay = xy(range(gpu_blocks), cols_g, 0)
    bx, by = xy(range(cpu_blocks), cols_c, cx0)
    low = float(min(ay.min(initial=0), by.min(initial=0)))
    first = frames[0].data if frames else [go.Scatter(x=[], y=[]) for _ in range(3)] + \
        [go.Scatter(text=["no copies between the tiers in this run"])]
    pools = [go.Scatter(x=ax, y=ay, mode="markers", hoverinfo="skip",
                        marker=dict(symbol="square", size=9, color="rgba(128,128,128,0.18)")),
             go.Scatter(x=bx, y=by, mode="markers", hoverinfo="skip",
                        marker=dict(symbol="square", size=9, color="rgba(128,128,128,0.10)"))]
    fig = go.Figure(data=pools + [go.Scatter(x=d.x, y=d.y, mode="markers", marker=d.marker, text=d.text,
                                             hovertemplate=d.hovertemplate) for d in first[:3]]
                    + [go.Scatter(x=[-0.5], y=[0.6], mode="text", text=first[3].text, textposition="top right",
                                  hoverinfo="skip", textfont=dict(size=13), cliponaxis=False)], frames=frames)
    fig.update_xaxes(visible=False, range=[-1, cx0 + cols_c])
    fig.update_yaxes(visible=False, range=[low - 0.8, 2.2])
    base_layout(fig, height=int(min(760, 200 + CONTROLS_PX + 28 * (2.2 - low))))   # (the page says what it shows)
    fig.update_layout(showlegend=False, margin=dict(l=10, r=10, t=20))
    return play_controls(fig, [str(k) for k in range(len(frames))], label="copy ", base_fps=1.5, below_px=10)
