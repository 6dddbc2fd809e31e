"""Request timelines: one row per request, schedules stacked on one shared time axis."""
from __future__ import annotations

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from core.figures import ORIGIN_COLORS, base_layout
from core.metrics import first_scheduled_ms, token_spans

QUEUE_COLOR = "#D9D9D9"
PREFILL_COLOR = "#F2B701"
DECODE_COLOR = "#80B1D3"


def request_spans(trace) -> dict[str, np.ndarray]:
    """Per request: arrival, first scheduled step start (NaN without step events), first and
    last token times, tokens emitted."""
    arrival = trace.requests["arrival_ms"].to_numpy(dtype=float)
    first, last, num_emitted = token_spans(trace)
    return {"arrival": arrival, "scheduled": first_scheduled_ms(trace), "first": first, "last": last,
            "num_emitted": num_emitted}


def schedule_timeline(schedules: list[tuple[str, object]], max_token_markers: int = 20_000,
                      height_per_row: int = 22) -> go.Figure:
    """Stacked timelines (one subplot per schedule, shared x in ms). Bars: queue wait
    (arrival -> first scheduled step; for traces without step events, arrival -> first token
    is drawn as 'waiting for first token'), prefill (first step -> first token), decode
    (first -> last token). Markers: every token emission, hover gives time and gap."""
    rows = len(schedules)
    heights = [max(len(tr.requests), 1) for _, tr in schedules]
    fig = make_subplots(rows=rows, cols=1, shared_xaxes=True, vertical_spacing=0.06 if rows > 1 else 0.0,
                        row_heights=heights, subplot_titles=[f"{label} [{tr.source}]" for label, tr in schedules])
    total_tokens = sum(len(tr.tokens) for _, tr in schedules)
    # Ticks help while they are sparse; dense ones would only hide the bars.
    draw_markers = total_tokens <= max_token_markers and total_tokens <= 25 * sum(heights)
    shown = set()
    for k, (_, tr) in enumerate(schedules, start=1):
        ids = np.array(tr.ids, dtype=object)
        sp = request_spans(tr)
        has_steps = not np.all(np.isnan(sp["scheduled"]))
        queue_end = sp["scheduled"] if has_steps else sp["first"]
        legend = lambda name: (name not in shown, shown.add(name))[0]
        qname = "queue wait" if has_steps else "waiting for first token"
        fig.add_trace(go.Bar(base=sp["arrival"], x=queue_end - sp["arrival"], y=ids, orientation="h",
                             marker_color=QUEUE_COLOR, name=qname, legendgroup=qname, showlegend=legend(qname),
                             hovertemplate="%{y}: waiting %{x:.3f} ms from %{base:.3f} ms<extra></extra>"),
                      row=k, col=1)
        if has_steps:
            fig.add_trace(go.Bar(base=sp["scheduled"], x=sp["first"] - sp["scheduled"], y=ids, orientation="h",
                                 marker_color=PREFILL_COLOR, name="prefill", legendgroup="prefill",
                                 showlegend=legend("prefill"),
                                 hovertemplate="%{y}: prefill %{x:.3f} ms from %{base:.3f} ms<extra></extra>"),
                          row=k, col=1)
        fig.add_trace(go.Bar(base=sp["first"], x=sp["last"] - sp["first"], y=ids, orientation="h",
                             marker_color=DECODE_COLOR, name="decode", legendgroup="decode",
                             showlegend=legend("decode"),
                             hovertemplate="%{y}: first to last token %{x:.3f} ms<extra></extra>"),
                      row=k, col=1)
        if draw_markers and len(tr.tokens):
            tk = tr.tokens.sort_values(["req", "index"])
            r = tk["req"].to_numpy()
            t = tk["t_ms"].to_numpy()
            gap = np.r_[np.nan, np.diff(t)]
            gap[np.r_[True, r[1:] != r[:-1]]] = np.nan
            custom = np.column_stack([tk["index"].to_numpy(), gap])
            color = ORIGIN_COLORS.get(tr.source, "#333")
            fig.add_trace(go.Scatter(x=t, y=ids[r], mode="markers", name=f"token ({tr.source})",
                                     legendgroup=f"tok-{tr.source}", showlegend=legend(f"tok-{tr.source}"),
                                     marker=dict(symbol="line-ns-open", size=12, color=color, line_width=2),
                                     customdata=custom,
                                     hovertemplate="%{y} token %{customdata[0]} at %{x:.3f} ms"
                                                   "<br>gap %{customdata[1]:.3f} ms<extra></extra>"),
                          row=k, col=1)
        fig.update_yaxes(autorange="reversed", type="category", row=k, col=1)
    fig.update_layout(barmode="overlay", bargap=0.35)
    fig.update_xaxes(title_text="time (ms)", row=rows, col=1)
    title = "Request timelines" + ("" if draw_markers else
                                   f" (token ticks hidden: {total_tokens:,} tokens are too dense to show)")
    return base_layout(fig, title, height=max(260, sum(heights) * height_per_row + 110 * rows))
