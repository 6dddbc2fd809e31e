"""KV memory and paging figures."""
from __future__ import annotations

import numpy as np
import plotly.graph_objects as go

from core.analysis.occupancy import CACHED, FREE, OWNED, SHARED, STATE_NAMES, Occupancy
from core.figures import CURSOR, PALETTE, base_layout
from core.formulas.kv import GIB, ModelSpec

# free: a translucent grey over the page (light grey on white, dark grey in the dark theme: never glaring)
FREE_COLOR = "rgba(128,128,128,0.14)"
STATE_COLORS = {FREE: FREE_COLOR, CACHED: "#BFE3F5", OWNED: "#0072B2", SHARED: "#E69F00"}   # Okabe-Ito


def kv_growth_chart(models: list[ModelSpec], dtype_bytes: float, max_tokens: int = 32768,
                    marker_tokens: int | None = None) -> go.Figure:
    """KV GiB per sequence vs context length, one line per model (GQA shows as a flatter line).
    Models with the same bytes per token share one line, named after all of them (one drawn
    over the other would hide it)."""
    x = np.unique(np.r_[np.linspace(0, max_tokens, 65).astype(int), marker_tokens or 0])
    fig = go.Figure()
    groups: dict[int, list[ModelSpec]] = {}
    for m in models:
        groups.setdefault(m.kv_bytes_per_token(dtype_bytes), []).append(m)
    for i, (per_token, ms) in enumerate(groups.items()):
        y = per_token * x / GIB
        names = " = ".join(m.name for m in ms)
        fig.add_trace(go.Scatter(x=x, y=y, mode="lines", name=f"{names} ({ms[0].kv_heads} KV heads)",
                                 line_color=PALETTE[i % len(PALETTE)],
                                 hovertemplate="%{x:,} tokens: %{y:.3f} GiB<extra>" + names + "</extra>"))
    if marker_tokens:
        fig.add_vline(x=marker_tokens, line_dash="dot", line_color="#888")
    fig.update_layout(xaxis_title="cached tokens per sequence", yaxis_title="KV cache (GiB)")
    return base_layout(fig, f"KV cache per sequence ({dtype_bytes:g}-byte elements)", height=340)


def occupancy_heatmap(occ: Occupancy, ids: list[str], cursor_index: int | None = None,
                      max_blocks: int = 1024) -> go.Figure:
    """Physical blocks (rows) x time (columns), colored by state; hover names the owner
    and reference count; shared blocks show their ref count as text."""
    state, ref, owner = occ.state, occ.ref, occ.owner
    B = state.shape[0]
    step = max(1, -(-B // max_blocks))
    rows = np.arange(0, B, step)
    state, ref, owner = state[rows], ref[rows], owner[rows]
    # shared blocks' ref counts as cell text; no text array at all when nothing is shared (a
    # large grid's 10^5 empty strings cost more to build and send than the rest of the figure)
    shared = state == SHARED
    text = np.where(shared, ref.astype(str), "") if shared.any() else None
    colorscale = []
    for k in (FREE, CACHED, OWNED, SHARED):
        colorscale += [[k / 4, STATE_COLORS[k]], [(k + 1) / 4, STATE_COLORS[k]]]
    detailed = state.size <= 40_000  # owner names in hover only while the grid is small
    extra = {}
    if detailed:
        ids_arr = np.array(list(ids) + ["—"], dtype=object)
        owner_name = ids_arr[np.where(owner >= 0, owner, len(ids))]
        extra = dict(customdata=np.dstack([owner_name, ref.astype(object),
                                           np.array(STATE_NAMES, dtype=object)[state]]),
                     hovertemplate="block %{y} at %{x:.3f} ms<br>%{customdata[2]}, owner %{customdata[0]}, "
                                   "ref %{customdata[1]}<extra></extra>")
    else:
        extra = dict(hovertemplate="block %{y} at %{x:.3f} ms<br>state %{z} "
                                   "(0 free, 1 cached-free, 2 owned, 3 shared)<extra></extra>")
    if text is not None:
        extra.update(text=text, texttemplate="%{text}")
    fig = go.Figure(go.Heatmap(
        z=state.astype(np.int8), x=occ.times_ms, y=rows, zmin=0, zmax=4, colorscale=colorscale,
        xgap=0.5 if detailed else 0, ygap=0.5 if detailed else 0,
        colorbar=dict(tickvals=[0.5, 1.5, 2.5, 3.5], ticktext=list(STATE_NAMES), title="block"), **extra))
    if cursor_index is not None and 0 <= cursor_index < len(occ.times_ms):
        fig.add_vline(x=float(occ.times_ms[cursor_index]), line_color=CURSOR, line_width=2)
    suffix = "th" if step % 100 in (11, 12, 13) else {1: "st", 2: "nd", 3: "rd"}.get(step % 10, "th")
    fig.update_yaxes(title_text="physical block" + (f" (every {step}{suffix})" if step > 1 else ""),
                     autorange="reversed")
    fig.update_xaxes(title_text="time (ms)")
    return base_layout(fig, "KV block occupancy over time", height=min(700, 200 + 6 * len(rows)))


def block_table_figure(tables: dict[str, list[int]], ref_of_block: dict[int, int] | None = None,
                       title: str | None = None) -> go.Figure:
    """Block tables as a grid: one row per sequence, one cell per logical block, labeled
    with the physical block id; cells of shared blocks (ref > 1) are highlighted."""
    names = list(tables)
    width = max((len(t) for t in tables.values()), default=0)
    z = np.full((len(names), max(width, 1)), np.nan)
    text = np.full(z.shape, "", dtype=object)
    for i, n in enumerate(names):
        for j, b in enumerate(tables[n]):
            shared = ref_of_block is not None and ref_of_block.get(b, 1) > 1
            z[i, j] = 1.0 if shared else 0.0
            text[i, j] = str(b)
    fig = go.Figure(go.Heatmap(z=z, x=[f"L{j}" for j in range(z.shape[1])], y=names, text=text,
                               texttemplate="%{text}", zmin=0, zmax=1, showscale=False, xgap=2, ygap=2,
                               colorscale=[[0, STATE_COLORS[OWNED]], [1, STATE_COLORS[SHARED]]],
                               hovertemplate="%{y} logical %{x} -> physical %{text}<extra></extra>"))
    fig.update_yaxes(autorange="reversed", type="category")
    fig.update_xaxes(title_text="logical block", type="category")
    return base_layout(fig, title or "Block tables (logical -> physical; orange = shared)",
                       height=120 + 30 * len(names))


def waste_chart(labels: list[str], tokens: list[int], paged_slots: list[int], contiguous_slots: list[int],
                from_cache: list[int] | None = None, writing: list[int] | None = None) -> go.Figure:
    """Slots held per sequence (core.analysis.occupancy.SlotsHeld): tokens stored (those in blocks taken
    from the prefix cache, then those computed), slots the running step is writing, the last block's
    empty tail; behind them, a contiguous max-length reservation."""
    z = [0] * len(labels)
    from_cache, writing = from_cache or z, writing or z
    tok, cache, wr, paged = (np.asarray(v, dtype=np.int64) for v in (tokens, from_cache, writing, paged_slots))
    fig = go.Figure()
    fig.add_trace(go.Bar(x=labels, y=contiguous_slots, name="contiguous: reserved max length",
                         marker_color="rgba(150,150,150,0.35)", offsetgroup="c"))
    parts = (("stored: from the prefix cache", cache, 0 * cache, "#2171B5"),
             ("stored: computed", tok - cache, cache, "#6BAED6"),
             ("being written by the running step", wr, tok, "#74C476"),
             ("paged: empty slots in the last block", paged - tok - wr, tok + wr, "#FDAE6B"))
    for name, y, base, color in parts:
        if name.startswith("stored") or y.any():
            fig.add_trace(go.Bar(x=labels, y=y, base=base, name=name, marker_color=color, offsetgroup="p",
                                 width=0.5))
    fig.update_layout(barmode="overlay", yaxis_title="KV slots (tokens)")
    return base_layout(fig, "Reserved KV slots per sequence", height=340)
