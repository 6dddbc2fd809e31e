"""Request timelines: one row per request, schedules stacked on one shared time axis."""
from __future__ import annotations

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from core.analysis.metrics import request_spans
from core.figures import ORIGIN_COLORS, base_layout

QUEUE_COLOR = "#D9D9D9"
PREFILL_COLOR = "#F2B701"
DECODE_COLOR = "#80B1D3"
PREEMPT_COLOR = "#D55E00"   # Okabe-Ito vermillion
COLOR_WORDS = {QUEUE_COLOR: "gray", PREFILL_COLOR: "yellow", DECODE_COLOR: "blue"}
BAR_WORDS = {"decode": "first-to-last token"}


def bar_legend(fig) -> str:
    """What the figure's bars are, in words, for those it draws ("queue wait (gray), decode (blue)"): a
    caption written from the figure never names a colour that is not on it."""
    seen = []
    for t in fig.data:
        if t.type == "bar" and t.name and t.name not in [n for n, _ in seen]:
            seen.append((t.name, COLOR_WORDS.get(t.marker.color, "")))
    return ", ".join(f"{BAR_WORDS.get(n, n)} ({w})" if w else BAR_WORDS.get(n, n) for n, w in seen)


MAX_LANES = 300        # requests drawn one row each (all schedules together); more: the aggregate view
GROUPS, TIME_BINS = 100, 300
MAX_HEIGHT = 900       # px: a timeline never needs more than one screen


def state_counts(spans: dict[str, np.ndarray], groups: np.ndarray, n_groups: int, centers: np.ndarray):
    """Requests of each group waiting / in prefill / decoding at each time (bin centers):
    arrays [n_groups, len(centers)]. A request waits from arrival to its first scheduled step
    (to its first token without step events), is in prefill until its first token, and decodes
    until its last token (inclusive)."""
    arrival, first, last = spans["arrival"], spans["first"], spans["last"]
    sched = spans["scheduled"]
    queue_end = np.where(np.isnan(sched), first, sched)
    out = np.zeros((3, n_groups, len(centers)), dtype=np.int64)
    for g in range(n_groups):
        m = groups == g
        a, q, f, last_g = (np.sort(x[m & ~np.isnan(x)]) for x in (arrival, queue_end, first, last))
        arrived = np.searchsorted(a, centers, side="right")
        scheduled = np.searchsorted(q, centers, side="right")
        started = np.searchsorted(f, centers, side="right")
        ended = np.searchsorted(last_g, centers, side="left")      # still decoding at its last token
        out[0, g] = arrived - scheduled
        out[1, g] = scheduled - started
        out[2, g] = started - ended
    return out


def aggregate_timeline(schedules: list[tuple[str, object]], groups: int = GROUPS, bins: int = TIME_BINS) -> go.Figure:
    """Timelines of many requests on one screen: per schedule a heatmap with requests in
    arrival order grouped into at most `groups` rows and time into `bins` columns; the color is
    how many of the row's requests are in the system (waiting + prefill + decode) at the
    column's center, the hover splits it by state. Totals are the detailed view's: every
    request is in exactly one row, and a column sums to the requests in flight then."""
    rows = len(schedules)
    spans = [request_spans(tr) for _, tr in schedules]
    lo = min(float(np.nanmin(sp["arrival"])) for sp in spans if len(sp["arrival"]))
    hi = max(float(np.nanmax(np.r_[sp["last"], sp["arrival"]])) for sp in spans if len(sp["arrival"]))
    hi = hi if hi > lo else lo + 1.0
    edges = np.linspace(lo, hi, bins + 1)
    centers = (edges[:-1] + edges[1:]) / 2
    titles = []
    for label, tr in schedules:
        n = len(tr.requests)
        g = min(groups, max(n, 1))
        titles.append(f"{label} [{tr.source}]: {n:,} requests in {g} rows of ~{-(-n // g):,} (arrival order)")
    fig = make_subplots(rows=rows, cols=1, shared_xaxes=True, vertical_spacing=0.08 if rows > 1 else 0.0,
                        subplot_titles=titles)
    for k, ((_, tr), sp) in enumerate(zip(schedules, spans), start=1):
        n = len(tr.requests)
        g = min(groups, max(n, 1))
        order = np.argsort(sp["arrival"], kind="stable")
        group_of = np.empty(n, dtype=np.int64)
        group_of[order] = np.arange(n) * g // max(n, 1)
        counts = state_counts(sp, group_of, g, centers)
        ids = tr.requests["id"].to_numpy()
        first_ids = [ids[order[i * n // g]] for i in range(g)]
        sizes = np.bincount(group_of, minlength=g)
        custom = np.stack([counts[0], counts[1], counts[2], np.broadcast_to(sizes[:, None], counts[0].shape)], -1)
        fig.add_trace(go.Heatmap(
            z=counts.sum(0), x=centers, y=[f"{i}: from {rid}" for i, rid in enumerate(first_ids)],
            customdata=custom, colorscale="Blues", zmin=0, showscale=k == 1,
            colorbar=dict(title="in system", len=0.5),
            hovertemplate="%{y} (%{customdata[3]} requests)<br>at %{x:.1f} ms: %{customdata[0]} waiting, "
                          "%{customdata[1]} in prefill, %{customdata[2]} decoding<extra></extra>"), row=k, col=1)
        fig.update_yaxes(autorange="reversed", showticklabels=False, title_text="requests →", row=k, col=1)
    fig.update_xaxes(title_text="time (ms)", row=rows, col=1)
    total = sum(len(tr.requests) for _, tr in schedules)
    width = (hi - lo) / bins
    title = (f"Request timelines, aggregated: {total:,} requests, time bins of "
             f"{f'{width:,.0f}' if width >= 100 else f'{width:.3g}'} ms")
    return base_layout(fig, title, height=min(MAX_HEIGHT, 140 + 260 * rows))


def _first_use(shown: set, name: str) -> bool:
    """Whether `name` is not yet in `shown` (it is now): one legend entry per name over all subplots."""
    new = name not in shown
    shown.add(name)
    return new


def _phase_bars(fig: go.Figure, k: int, sp: dict, ids: np.ndarray, shown: set) -> None:
    """Subplot k's bars: queue wait (or waiting for first token, without step events), prefill, decode."""
    has_steps = not np.all(np.isnan(sp["scheduled"]))
    queue_end = sp["scheduled"] if has_steps else sp["first"]
    qname = "queue wait" if has_steps else "waiting for first token"
    fig.add_trace(go.Bar(base=sp["arrival"], x=queue_end - sp["arrival"], y=ids, orientation="h",
                         marker_color=QUEUE_COLOR, name=qname, legendgroup=qname, showlegend=_first_use(shown, qname),
                         hovertemplate="%{y}: waiting %{x:.3f} ms from %{base:.3f} ms<extra></extra>"),
                  row=k, col=1)
    if has_steps:
        fig.add_trace(go.Bar(base=sp["scheduled"], x=sp["first"] - sp["scheduled"], y=ids, orientation="h",
                             marker_color=PREFILL_COLOR, name="prefill", legendgroup="prefill",
                             showlegend=_first_use(shown, "prefill"),
                             hovertemplate="%{y}: prefill %{x:.3f} ms from %{base:.3f} ms<extra></extra>"),
                      row=k, col=1)
    fig.add_trace(go.Bar(base=sp["first"], x=sp["last"] - sp["first"], y=ids, orientation="h",
                         marker_color=DECODE_COLOR, name="decode", legendgroup="decode",
                         showlegend=_first_use(shown, "decode"),
                         hovertemplate="%{y}: first to last token %{x:.3f} ms<extra></extra>"),
                  row=k, col=1)


def _token_ticks(tr, ids: np.ndarray, dense: bool, shown: set) -> go.Scatter:
    """Every token emission of a trace with tokens as a tick (small dots when `dense`), its gap in the hover."""
    tk = tr.tokens.sort_values(["req", "index"])
    r = tk["req"].to_numpy()
    t = tk["t_ms"].to_numpy()
    gap = np.r_[np.nan, np.diff(t)]
    gap[np.r_[True, r[1:] != r[:-1]]] = np.nan
    custom = np.column_stack([tk["index"].to_numpy(), gap])
    color = ORIGIN_COLORS.get(tr.source, "#333")
    return go.Scatter(x=t, y=ids[r], mode="markers", name=f"token ({tr.source})",
                      legendgroup=f"tok-{tr.source}", showlegend=_first_use(shown, f"tok-{tr.source}"),
                      marker=dict(symbol="line-ns-open", size=5 if dense else 12, color=color,
                                  line_width=1 if dense else 2, opacity=0.55 if dense else 1.0),
                      customdata=custom,
                      hovertemplate="%{y} token %{customdata[0]} at %{x:.3f} ms"
                                    "<br>gap %{customdata[1]:.3f} ms<extra></extra>")


def _preempt_marks(pre, ids: np.ndarray, shown: set) -> go.Scatter:
    """Each preemption (blocks freed here, the request recomputed later) as a cross."""
    return go.Scatter(x=pre["t_ms"], y=ids[pre["req"].to_numpy()], mode="markers", name="preempted",
                      legendgroup="preempted", showlegend=_first_use(shown, "preempted"),
                      marker=dict(symbol="x-thin-open", size=11, color=PREEMPT_COLOR, line_width=2.5),
                      customdata=pre["freed_blocks"],
                      hovertemplate="%{y} preempted at %{x:.3f} ms: %{customdata} KV blocks freed, "
                                    "recomputed later<extra></extra>")


def _timeline_title(draw_markers: bool, dense: bool, total_tokens: int, max_token_markers: int) -> str:
    """The figure's title, saying when token ticks are drawn small or hidden."""
    return "Request timelines" + ("" if draw_markers and not dense else
                                  f" (token ticks drawn small: {total_tokens:,} tokens; zoom in to separate them)"
                                  if draw_markers else
                                  f" (token ticks hidden: {total_tokens:,} tokens, more than {max_token_markers:,})")


def schedule_timeline(schedules: list[tuple[str, object]], max_token_markers: int = 20_000,
                      height_per_row: int = 22, max_lanes: int = MAX_LANES, max_height: int = MAX_HEIGHT) -> go.Figure:
    """Stacked timelines (one subplot per schedule, shared x in ms). Bars: queue wait
    (arrival -> first scheduled step; for traces without step events, arrival -> first token
    is drawn as 'waiting for first token'), prefill (first step -> first token), decode
    (first -> last token). Markers: every token emission, hover gives time and gap.
    More than `max_lanes` requests in all: `aggregate_timeline` (one screen at any size)."""
    if sum(len(tr.requests) for _, tr in schedules) > max_lanes:
        return aggregate_timeline(schedules)
    rows = len(schedules)
    heights = [max(len(tr.requests), 1) for _, tr in schedules]
    # one screen: rows shrink (down to 2 px, labels hidden below 12 px) rather than the figure growing
    per_row = max(2.0, min(height_per_row, (max_height - 110 * rows) / sum(heights)))
    height = int(min(max_height, max(260, sum(heights) * per_row + 110 * rows)))
    # ~36 px between one schedule's last row and the next one's title, of a plot area ~170 px
    # shorter than the figure (title, axis, legend)
    spacing = min(36 / max(height - 170, 90), 0.5 / max(rows - 1, 1)) if rows > 1 else 0.0
    fig = make_subplots(rows=rows, cols=1, shared_xaxes=True, vertical_spacing=spacing,
                        row_heights=heights, subplot_titles=[f"{label} [{tr.source}]" for label, tr in schedules])
    total_tokens = sum(len(tr.tokens) for _, tr in schedules)
    # Ticks help while they are sparse; dense ones would hide the bars, so past 25 a row they are
    # drawn as small dots: a density at full view, separate ticks when zoomed in
    draw_markers = total_tokens <= max_token_markers
    dense = total_tokens > 25 * sum(heights)
    shown = set()
    for k, (_, tr) in enumerate(schedules, start=1):
        ids = np.array(tr.ids, dtype=object)
        _phase_bars(fig, k, request_spans(tr), ids, shown)
        if draw_markers and len(tr.tokens):
            fig.add_trace(_token_ticks(tr, ids, dense, shown), row=k, col=1)
        pre = getattr(tr, "preempts", None)
        if pre is not None and len(pre):   # blocks freed here, the request recomputed later
            fig.add_trace(_preempt_marks(pre, ids, shown), row=k, col=1)
        fig.update_yaxes(autorange="reversed", type="category", row=k, col=1)
    fig.update_layout(barmode="overlay", bargap=0.35)
    fig.update_xaxes(title_text="time (ms)", row=rows, col=1)
    if per_row < 12:
        fig.update_yaxes(showticklabels=False)
    return base_layout(fig, _timeline_title(draw_markers, dense, total_tokens, max_token_markers), height=height)
