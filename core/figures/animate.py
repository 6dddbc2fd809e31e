"""Client-side animations: Plotly frames with play/pause at several speeds and a slider with one
tick per frame (dragging or clicking a tick steps one frame). Playback runs in the browser:
no server rerun per frame. Frames update only light traces (a curtain over the future, a
line of narration, small heatmaps), so playback stays smooth at 10-20 frames per second."""
from __future__ import annotations

import math

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from core.figures import BLUE, GRAY, ORANGE, PALETTE, SKY, base_layout, wrap_title
from core.formulas.tiles import TileStep, unscaled
from core.lessons.blockframes import PagingFrames
from core.lessons.slots import HELD, PREFILL, SlotGrid, step_story

SPEEDS = ((0.5, "▶ 0.5×"), (1.0, "▶ 1×"), (2.0, "▶ 2×"), (4.0, "▶ 4×"))
BASE_FPS = 5.0          # frames per second at 1×
CURTAIN = {"light": "rgba(250,250,250,0.93)", "dark": "rgba(14,17,23,0.9)"}   # over the steps to come


TABLE_TEXT, TABLE_HEAD, TABLE_CELL = "#1f2937", "#c8d4e3", "#ebf0f8"   # 9.8:1 and 12.8:1 contrast (WCAG AA: 4.5)
# the same in the dark theme (a light table was a bright box on the dark page): 11.4:1 and 13.5:1
TABLE_COLORS = {"light": (TABLE_TEXT, TABLE_HEAD, TABLE_CELL), "dark": ("#e5e7eb", "#374151", "#1f2937")}


CONTROLS_PX = 118      # below the plot: the buttons' row (34 px), then the slider with its ticks


def play_controls(fig: go.Figure, frame_names: list[str], label: str = "step ", base_fps: float = BASE_FPS,
                  below_px: float = 50) -> go.Figure:
    """Play buttons (one per speed) and pause on one row, and under them a slider with one step
    per frame across the figure's width (side by side, the slider ran over the buttons on a
    phone), `below_px` under the plot area (room for the x axis's labels). Grows the bottom margin
    to hold them."""
    height = fig.layout.height or 450
    m = fig.layout.margin
    bottom = max(m.b or 0, below_px + CONTROLS_PX + 24)
    plot_px = max(height - (m.t or 0) - bottom, 50)
    y_buttons = -below_px / plot_px
    y_slider = -(below_px + 34) / plot_px
    fig.update_layout(margin=dict(b=bottom))
    def play(speed):
        ms = 1000.0 / (base_fps * speed)
        return dict(method="animate", args=[None, {"frame": {"duration": ms, "redraw": True}, "fromcurrent": True,
                                                   "transition": {"duration": 0}, "mode": "immediate"}])
    buttons = [dict(label=text, **play(speed)) for speed, text in SPEEDS]
    buttons.append(dict(label="❚❚ pause", method="animate",
                        args=[[None], {"frame": {"duration": 0, "redraw": False}, "mode": "immediate",
                                       "transition": {"duration": 0}}]))
    steps = [dict(method="animate", label=name,
                  args=[[name], {"frame": {"duration": 0, "redraw": True}, "mode": "immediate",
                                 "transition": {"duration": 0}}]) for name in frame_names]
    fig.update_layout(
        # anchored at the right edge: on a phone the row reaches left into the y axis's margin instead
        # of past the canvas's right edge
        updatemenus=[dict(type="buttons", direction="right", showactive=False, x=1, xanchor="right", y=y_buttons,
                          yanchor="top", pad=dict(t=4, r=2), font=dict(size=11), buttons=buttons)],
        sliders=[dict(active=0, steps=steps, x=0, len=1.0, y=y_slider, yanchor="top", pad=dict(t=4, b=4),
                      currentvalue=dict(prefix=label, visible=True, xanchor="right"),
                      transition=dict(duration=0))])
    return fig


def _curtain(x0: float, x1: float, y0: float, y1: float) -> dict:
    return dict(x=[x0, x1, x1, x0, x0], y=[y0, y0, y1, y1, y0])


def _slot_titles(grids: list[tuple[str, SlotGrid, list[str]]]) -> list[str]:
    """Each schedule's panel title: its steps and idle seat-steps (wrapped)."""
    return [wrap_title(f"{label}: {g.total_steps} steps, {g.idle_fraction():.0%} of seat-steps idle"
                       + (f" (first {len(g.steps)} shown)" if g.truncated else ""), 32) for label, g, _ in grids]


def _slot_heatmap(label: str, g: SlotGrid, ids: list[str], ncol: int, scale: list, labelled: bool) -> go.Heatmap:
    """Seats x steps of one schedule, coloured by request (`ncol` colours), each cell named by its request
    when `labelled`."""
    z = np.where(g.req >= 0, g.req % ncol, np.nan).astype(float)
    name = np.array([[ids[r] if r >= 0 else "" for r in seat] for seat in g.req], dtype=object)
    kind = np.array(["", "prefill", "decode", "held (not computed this step)"], dtype=object)[g.kind]
    custom = np.dstack([name, kind, g.tokens.astype(object),
                        np.broadcast_to(g.t_ms, g.req.shape).astype(object)])
    return go.Heatmap(
        z=z, x=np.arange(len(g.steps)), y=np.arange(g.seats), zmin=0, zmax=ncol, colorscale=scale, showscale=False,
        xgap=1, ygap=2, text=name if labelled else None, texttemplate="%{text}" if labelled else None,
        textfont=dict(size=9),
        customdata=custom, name=label,
        hovertemplate="seat %{y}, step %{x}<br>%{customdata[0]} %{customdata[1]}<br>"
                      "tokens %{customdata[2]}, t %{customdata[3]} ms<extra></extra>")


def _slot_frames(dynamic: list[tuple[int, str, SlotGrid, list[str]]], longest: int) -> list[go.Frame]:
    """One frame per step: each schedule's curtain drawn back past the step, its line telling the step
    (past a schedule's last step: its curtain stays, its line says it is done)."""
    frames = []
    for k in range(longest):
        data = []
        for _, what, g, ids in dynamic:
            j = min(k, len(g.steps) - 1)
            if what == "curtain":
                data.append(go.Scatter(**_curtain(j + 0.5, longest - 0.5, -0.5, g.seats - 0.5)))
            else:
                done = k >= len(g.steps)
                data.append(go.Scatter(text=[f"done after {g.total_steps} steps" if done and not g.truncated
                                             else step_story(g, ids, j)]))
        frames.append(go.Frame(name=str(k), data=data, traces=[i for i, *_ in dynamic]))
    return frames


def slot_animation(grids: list[tuple[str, SlotGrid, list[str]]], theme: str = "light") -> go.Figure:
    """Seats (rows) x steps (columns) of each schedule, one subplot each, coloured by request;
    a triangle marks a prefill step, a pale cell a seat held but not computed in the step.
    Playing reveals one step per frame on every subplot at once, with a line saying who was
    computed, seated and freed. `theme` ("light" or "dark"): the app's, for the curtain over
    the steps to come."""
    rows = len(grids)
    longest = max(len(g.steps) for _, g, _ in grids)
    heights = [g.seats + 1.6 for _, g, _ in grids]
    titles = _slot_titles(grids)
    lines = max(t.count("<br>") + 1 for t in titles)
    # a title line is ~21 px (Streamlit draws subplot titles at 16 px); the tick labels above it ~24 px
    height = int(min(1100, 250 + sum(34 * g.seats + 40 for _, g, _ in grids) + (rows - 1) * (34 + 22 * lines)))
    plot_px = height - 52 - (50 + CONTROLS_PX + 24)
    # between panels: the panel above's tick labels (~22 px) and this panel's title lines, in pixels
    gap = (34 + 22 * lines) / plot_px if rows > 1 else 0.0
    fig = make_subplots(rows=rows, cols=1, vertical_spacing=min(gap, 0.8 / max(rows - 1, 1)),
                        row_heights=[h / sum(heights) for h in heights], subplot_titles=titles)
    labelled = longest <= 60            # the same for every panel: cells narrower than a label go without
    ncol = len(PALETTE) - 2          # no gray or black: those mean idle
    scale = [x for i in range(ncol) for x in ([i / ncol, PALETTE[i]], [(i + 1) / ncol, PALETTE[i]])]
    dynamic = []        # (trace index, kind, grid, row) of the traces the frames update
    for row, (label, g, ids) in enumerate(grids, start=1):
        fig.add_trace(_slot_heatmap(label, g, ids, ncol, scale, labelled), row=row, col=1)
        held = np.argwhere(g.kind == HELD)
        fig.add_trace(go.Scatter(x=held[:, 1], y=held[:, 0], mode="markers", hoverinfo="skip",
                                 marker=dict(symbol="square", size=9, color="rgba(255,255,255,0.6)"),
                                 showlegend=False), row=row, col=1)
        pre = np.argwhere(g.kind == PREFILL)
        # at the cell's left edge, clear of the request's label in its middle
        fig.add_trace(go.Scatter(x=pre[:, 1] - 0.36, y=pre[:, 0], mode="markers", hoverinfo="skip",
                                 marker=dict(symbol="triangle-right", size=6, color="black"),
                                 name="prefill step", legendgroup="prefill", showlegend=row == 1), row=row, col=1)
        fig.add_trace(go.Scatter(**_curtain(0.5, longest - 0.5, -0.5, g.seats - 0.5), fill="toself", mode="lines",
                                 line=dict(width=0), fillcolor=CURTAIN.get(theme, CURTAIN["light"]), hoverinfo="skip",
                                 showlegend=False),
                      row=row, col=1)
        dynamic.append((len(fig.data) - 1, "curtain", g, ids))
        fig.add_trace(go.Scatter(x=[-0.5], y=[g.seats - 0.35], mode="text", text=[step_story(g, ids, 0)],
                                 textposition="top right", hoverinfo="skip", showlegend=False,
                                 textfont=dict(size=13)), row=row, col=1)
        dynamic.append((len(fig.data) - 1, "story", g, ids))
        fig.update_yaxes(range=[-0.5, g.seats + 0.6], title_text="seat", tickmode="array",
                         tickvals=list(range(g.seats)), row=row, col=1, autorange=False)
        fig.update_xaxes(range=[-0.5, longest - 0.5], row=row, col=1)
    fig.update_xaxes(title_text="forward step (iteration)", row=rows, col=1)
    fig.frames = _slot_frames(dynamic, longest)
    base_layout(fig, height=height)
    fig.update_layout(margin=dict(l=10, r=10, t=52, b=50 + CONTROLS_PX + 24), plot_bgcolor=GRAY + "22")
    return play_controls(fig, [str(k) for k in range(longest)])


STATE_COLORS = ("rgba(128,128,128,0.14)", SKY, BLUE, ORANGE)   # free (translucent: both themes), cached-free,
#                                                                 owned, shared (core.analysis.occupancy order)


# the pool's free blocks, opaque so that their numbers take a contrasting colour in either theme (a
# translucent grey read as mid-grey: its numbers were drawn dark on the dark page)
POOL_FREE = {"light": "#ECECEC", "dark": "#3A3E47"}


def paging_animation(pf: PagingFrames, ids: list[str], theme: str = "light") -> go.Figure:
    """Left: each request's logical blocks (columns) shaded by the tokens they store, labelled
    with the physical block they map to (×n: shared by n sequences). Right: the pool of physical
    blocks by state, labelled with the block id and owner. One frame per scheduled step."""
    F, rows, cols = pf.block.shape
    nb = pf.occupancy.num_blocks
    colors = (POOL_FREE.get(theme, POOL_FREE["light"]),) + STATE_COLORS[1:]
    width = 8 if nb <= 64 else 16
    prow = -(-nb // width)
    fig = make_subplots(rows=1, cols=2, column_widths=[0.56, 0.44], horizontal_spacing=0.08,
                        # three short lines each: side by side they must fit half a phone's width
                        subplot_titles=["Logical blocks<br>per request (shade:<br>tokens stored)",
                                        "Pool: " + "<br>".join(" ".join(
                                            f'<span style="color:{c}">■</span> {n}' for n, c in pair) for pair in
                                            ((("free", colors[0]),), (("cached", colors[1]),
                                                                      ("owned", colors[2])),
                                             (("shared", colors[3]),)))])

    def logical(f):
        b, n = pf.block[f], pf.fill[f]
        ref = pf.occupancy.ref[:, f]
        z = np.where(b >= 0, n / pf.block_size, np.nan)
        text = [[("" if p < 0 else f"P{p}" + (f" ×{ref[p]}" if p < nb and ref[p] > 1 else ""))
                 for p in row] for row in b]
        return z, text

    def physical(f):
        s = np.full(prow * width, np.nan)
        s[:nb] = pf.occupancy.state[:, f]
        own, ref = pf.occupancy.owner[:, f], pf.occupancy.ref[:, f]
        text = [f"{p}<br>{ids[own[p]] if own[p] >= 0 and s[p] >= 2 else ''}{' ×' + str(ref[p]) if ref[p] > 1 else ''}"
                for p in range(nb)] + [""] * (prow * width - nb)
        return s.reshape(prow, width), np.array(text, dtype=object).reshape(prow, width)

    lz, lt = logical(0)
    fig.add_trace(go.Heatmap(z=lz, text=lt, texttemplate="%{text}", zmin=0, zmax=1, x=np.arange(cols),
                             y=np.arange(rows), colorscale=[[0, "#DCEBF7"], [1, BLUE]], showscale=False,
                             xgap=2, ygap=2, hovertemplate="logical block %{x}: %{text}, %{z:.0%} full<extra></extra>"),
                  row=1, col=1)
    pz, ptx = physical(0)
    scale = [x for i, c in enumerate(colors) for x in ([i / 4, c], [(i + 1) / 4, c])]
    fig.add_trace(go.Heatmap(z=pz, text=ptx, texttemplate="%{text}", zmin=0, zmax=4, colorscale=scale,
                             showscale=False, xgap=2, ygap=2, hovertemplate="block %{text}<extra></extra>"),
                  row=1, col=2)
    stories = [wrap_title(t, 34) for t in pf.stories]     # within the left panel, not under the pool
    fig.add_trace(go.Scatter(x=[-0.5], y=[rows - 0.45], mode="text", text=[stories[0]], textposition="bottom right",
                             hoverinfo="skip", showlegend=False, textfont=dict(size=13), cliponaxis=False),
                  row=1, col=1)
    fig.update_yaxes(tickmode="array", tickvals=list(range(rows)), ticktext=[ids[r] for r in pf.reqs],
                     autorange=False, range=[rows - 0.5 + 2.8, -0.5], row=1, col=1)
    fig.update_xaxes(title_text="logical block", range=[-0.5, cols - 0.5], dtick=1, row=1, col=1)
    fig.update_yaxes(autorange="reversed", showticklabels=False, showgrid=False, row=1, col=2)
    fig.update_xaxes(showticklabels=False, showgrid=False, row=1, col=2)
    frames = []
    for f in range(F):
        lz, lt = logical(f)
        pz, ptx = physical(f)
        frames.append(go.Frame(name=str(f), traces=[0, 1, 2], data=[
            go.Heatmap(z=lz, text=lt), go.Heatmap(z=pz, text=ptx), go.Scatter(text=[stories[f]])]))
    fig.frames = frames
    height = int(min(1000, 220 + CONTROLS_PX + 30 * max(rows + 3, prow)))
    base_layout(fig, height=height)
    fig.update_layout(margin=dict(l=10, r=10, t=110, b=60 + CONTROLS_PX + 24))
    fig.update_annotations(yshift=8)          # subplot titles (three lines) clear of the top row
    return play_controls(fig, [str(f) for f in range(F)], label="frame ", below_px=60)


MAX_KEY_BARS = 64       # keys drawn one bar each; more: one bar per tile
MAX_TILE_FRAMES = 128   # tiles animated; a longer walk shows its first MAX_TILE_FRAMES tiles


def tile_walk_animation(steps: list[TileStep], logits, values, full_value: float, theme: str = "light") -> go.Figure:
    """The online softmax one tile per frame. Top: the keys' weights e^logit (bars, with each
    key's value), the tiles already read shaded blue and the tile being read orange. Bottom: the
    running statistics after the tile in both conventions: stored (scaled by e^-m, numerically
    stable) and the chapter's (plain sums of e^logit); the output so far is the same in both."""
    s = np.asarray(logits, dtype=float)
    v = np.asarray(values, dtype=float)
    per_key = len(s) <= MAX_KEY_BARS
    scaled = bool(s.max() > 30) or not per_key
    if per_key:
        edges = [(st.start - 0.5, st.stop - 0.5) for st in steps]
        heights = np.exp(s - s.max()) if scaled else np.exp(s)
        x, text = np.arange(len(s)), [f"v={x:g}" for x in v]
    else:
        edges = [(st.tile - 0.5, st.tile + 0.5) for st in steps]
        heights = np.array([float(np.exp(s[st.start:st.stop] - s.max()).sum()) for st in steps])
        x, text = np.arange(len(steps)), None
    shown = steps[:MAX_TILE_FRAMES]
    top = float(max(heights)) * 1.45
    fig = make_subplots(rows=2, cols=1, row_heights=[0.5, 0.5], vertical_spacing=0.14,
                        specs=[[{"type": "xy"}], [{"type": "table"}]],
                        subplot_titles=[("weights e^(logit − max logit)" if scaled else "weights e^logit")
                                        + (" per key (label: its value v)" if per_key else " per tile")
                                        + (f"; first {len(shown)} of {len(steps)} tiles animated"
                                           if len(shown) < len(steps) else ""), ""])

    def band(lo, hi):
        return dict(x=[lo, hi, hi, lo, lo], y=[0, 0, top, top, 0])

    def read(k):     # tiles 0..k-2 read, tile k-1 being read (k tiles read after the frame)
        return band(-0.5, edges[k - 2][1]) if k >= 2 else band(-0.5, -0.5)

    def current(k):
        return band(*edges[k - 1]) if k >= 1 else band(-0.5, -0.5)

    def rows(k):
        names = ["m, max", "l, sum", "acc", "acc / l"]     # short: each row one line at a phone's width
        if k == 0:
            return [names, ["−∞", "0", "0", "—"], ["−∞", "0", "0", "—"]]
        st = steps[k - 1]
        big_l, big_acc = unscaled(st)
        return [names, [f"{st.m:.6g}", f"{st.l:.6g}", f"{float(st.acc):.6g}", f"{float(st.output):.6g}"],
                [f"{st.m:.6g}", f"{big_l:.6g}", f"{float(big_acc):.6g}", f"{float(st.output):.6g}"]]

    def story(k):
        if k == 0:
            return f"before any tile · the full softmax answer is {full_value:.6g}"
        st = steps[k - 1]
        m_old = steps[k - 2].m if k > 1 else -math.inf
        return (f"tile {st.tile} (keys {st.start}–{st.stop - 1}): tile max {st.tile_max:.4g}, "
                f"m {m_old:.4g} → {st.m:.4g}; old l and acc × e^(m_old − m_new) = {st.rescale:.4g}")

    for f, color in ((read, BLUE), (current, ORANGE)):      # bands behind the bars
        fig.add_trace(go.Scatter(**f(0), fill="toself", mode="lines", line=dict(width=0), fillcolor=color,
                                 opacity=0.3, hoverinfo="skip", showlegend=False), row=1, col=1)
    fig.add_trace(go.Bar(x=x, y=heights, marker_color="#555555", text=text, textposition="outside",
                         hovertemplate="%{x}: %{y:.4g}<extra></extra>", showlegend=False), row=1, col=1)
    fig.add_trace(go.Scatter(x=[-0.5], y=[top * 0.93], mode="text", text=[story(0)], textposition="middle right",
                             cliponaxis=False, hoverinfo="skip", showlegend=False, textfont=dict(size=13)),
                  row=1, col=1)
    header = ["running", "stored (× e^−m)", "chapter (Σ e^logit)"]
    # the table's own colours in every theme: plotly's light fills under a dark theme's light text
    # were unreadable (rgb(230,234,241) on rgb(235,240,248))
    text, head, cell = TABLE_COLORS.get(theme, TABLE_COLORS["light"])
    fig.add_trace(go.Table(header=dict(values=header, align="left", font=dict(size=14, color=text),
                                       fill_color=head),
                           cells=dict(values=rows(0), align="left", font=dict(size=14, color=text),
                                      fill_color=cell, height=26), columnwidth=[0.8, 1, 1]), row=2, col=1)
    fig.update_yaxes(range=[0, top], row=1, col=1)
    fig.update_xaxes(range=[-0.5, len(x) - 0.5], dtick=1 if len(x) <= 32 else None, row=1, col=1)
    fig.frames = [go.Frame(name=str(k), traces=[0, 1, 3, 4], data=[
        go.Scatter(**read(k)), go.Scatter(**current(k)), go.Scatter(text=[story(k)]),
        go.Table(cells=dict(values=rows(k)))]) for k in range(len(shown) + 1)]
    base_layout(fig, height=520 + CONTROLS_PX)
    fig.update_layout(margin=dict(l=10, r=10, t=40, b=20 + CONTROLS_PX + 24))
    return play_controls(fig, [str(k) for k in range(len(shown) + 1)], label="tiles read: ", base_fps=1.0,
                         below_px=20)
