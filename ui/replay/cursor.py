"""The replay page's time cursor and the views that follow it: the schedule around the cursor, the
batch (or the engine's counted steps), the KV blocks (or the server's gauges), requests in flight,
and what the engine said about itself (its prefix cache, each request's phases)."""
from __future__ import annotations

import numpy as np
import streamlit as st

from core.analysis.cursor import advance, gauge_coverage, step_cursor
from core.analysis.views import cursor_panels
from core.figures import CURSOR
from core.figures.batch import batch_figure, gauges_figure, in_flight_figure
from core.figures.engine import counted_steps_figure, engine_phases_figure, prefix_cache_figure
from core.figures.memory import occupancy_heatmap
from core.figures.timeline import schedule_timeline
from ui import bound, linked_fragment, show_chart
from ui.replay.opening import Replay

STATIC_CELLS = 20_000                  # a KV grid larger than this is drawn once, without the cursor line
STATIC_STEPS = 1_000                   # a counted-steps chart longer than this is drawn once, without the cursor
TOKEN_TICKS = 4_000                    # the cursor's timeline draws token ticks up to this many (SVG paths)
SPEEDS = {"½×": 0.5, "1×": 1.0, "2×": 2.0, "4×": 4.0}
POSITIONS = 400                        # a step of the buttons without scheduler steps: 1/400 of the trace


def _cursor_controls(r: Replay, t0: float, t1: float, playing: bool) -> float:
    """Step buttons, play speed and the slider; the cursor's time."""
    step = (t1 - t0) / POSITIONS
    here = st.session_state.get("rp_cursor", float(t0 + (t1 - t0) / 2))
    c_back, c_fwd, c_speed = st.columns([1, 1, 3])
    starts = r.tr.steps["t_ms"].to_numpy() if len(r.tr.steps) else np.empty(0)

    def move(direction: int):
        # a callback runs before the fragment reruns: the slider is drawn at the new time with the views
        now = st.session_state.get("rp_cursor", here)
        st.session_state["rp_cursor"] = step_cursor(now, direction, starts, t0, t1, step)
    c_back.button("◀ step", key="rp_back", help="to the previous scheduler step (or 1/400 of the trace)",
                  on_click=move, args=(-1,))
    c_fwd.button("step ▶", key="rp_fwd", help="to the next scheduler step (or 1/400 of the trace)",
                 on_click=move, args=(+1,))
    here = st.session_state.get("rp_cursor", here)
    speed = c_speed.segmented_control("Play speed", list(SPEEDS), default="1×", label_visibility="collapsed",
                                      **bound("rp_speed")) or "1×"
    if playing:
        st.session_state["rp_cursor"] = advance(here, t0, t1, 10 * step * SPEEDS[speed])
    return st.slider("Time cursor (ms)", float(t0), float(t1), float(t0 + (t1 - t0) / 2), step=step,
                     format="%.3f", **bound("rp_cursor"))


def _left_view(r: Replay, p, cursor: float) -> None:
    """The batch at the cursor, or an iteration log's counted steps, or requests in flight."""
    tr, row = r.tr, p.step
    if p.left == "counted_steps":
        # drawn once, without the cursor line, past STATIC_STEPS steps (the caption names the step at the cursor)
        show_chart(counted_steps_figure(tr.steps, None if len(tr.steps) > STATIC_STEPS else cursor)
                   .update_layout(height=280), key="rp_counted_steps")
        st.caption(f"Step {int(row['step'])} at the cursor ({row['dur_ms']:.2f} ms): {int(row['prefill_reqs'])} "
                   f"prefill request(s), {int(row['prefill_tokens'])} uncached prompt tokens, "
                   f"{int(row['decode_reqs'])} decoding. Measured by the engine (its iteration log: counts, no "
                   "requests; start times within each line's one-second timestamp, see the trace's clock).")
    elif p.left == "in_flight":
        show_chart(in_flight_figure(r.views.in_flight(), cursor), key="rp_inflight")
        st.caption("Batch composition needs `step` events (with their `batch` lists).")
    else:
        show_chart(batch_figure(p.batch, row).update_layout(height=280), key="rp_batch")


def _right_view(r: Replay, p, cursor: float) -> None:
    """The KV blocks at the cursor, or the server's gauges."""
    big = r.big
    if p.right == "kv":
        ids = r.tr.requests["id"].to_numpy()      # names for the hover of a small grid only
        # a large trace's heatmap is drawn without the cursor line: unchanged, it is not sent again at
        # each move (re-sending and redrawing the two large charts was 0.6 s of a 0.8 s move on a
        # 500-request, 49,560-step run); the state at the cursor is in the caption
        # ... and so is any heatmap of more than STATIC_CELLS cells (a 286 KB grid redrawn at each step was
        # most of a 2 s step on a 2-core machine)
        static = big or p.occupancy.state.size > STATIC_CELLS
        show_chart(occupancy_heatmap(p.occupancy, ids, None if static else p.kv_index)
                   .update_layout(height=280), key="rp_kv")
        st.caption("At the cursor: " + ", ".join(f"{v} {k}" for k, v in p.kv_counts.items()) + " blocks"
                   + (" (the grid is drawn once, without the cursor line: its size would make every move "
                      "slow)." if static and not big else "."))
    elif p.right == "gauges":
        gauges_view(r, p.gauges, cursor)
    else:
        st.caption("KV block occupancy needs `kv` events (alloc/free/hit/...).")


def cursor_views(r: Replay, playing: bool) -> None:
    """The cursor and every view that follows it, in one fragment (a move reruns only this)."""
    t0, t1 = r.views.span()
    if t1 <= t0:
        t1 = t0 + 1.0
    big = r.big

    @linked_fragment(run_every=0.8 if playing else None)
    def views_at_cursor():
        cursor = _cursor_controls(r, t0, t1, playing)
        p = cursor_panels(r.views, cursor, big)     # which panels, for which requests (core.analysis.views)
        if p.shown_note:
            st.caption(f"Timeline: {p.shown_note}.")
        # one 1280x800 screen: the cursor, a compact timeline, then batch and KV side by side
        fig = schedule_timeline([(r.label, p.shown)], max_token_markers=TOKEN_TICKS, max_height=300)
        fig.add_vline(x=cursor, line_color=CURSOR, line_width=2)
        show_chart(fig, key="rp_timeline")
        left, right = st.columns(2)
        with left:
            _left_view(r, p, cursor)
        with right:
            _right_view(r, p, cursor)
        if p.in_flight_below:
            show_chart(in_flight_figure(r.views.in_flight(), None if big else cursor), key="rp_inflight")
            if p.flight_at is not None:
                running, waiting = p.flight_at
                st.caption(f"At the cursor: {running:,} running" + (f", {waiting:,} waiting" if waiting >= 0 else "")
                           + " (the chart is drawn once for a trace this large: the timeline above carries the "
                             "cursor).")
        if p.gauges_below:
            gauges_view(r, p.gauges, cursor)
        engine_views(r.tr, p)

    views_at_cursor()


def gauges_view(r: Replay, gauges, cursor: float) -> None:
    """The server's sampled gauges, and whether the samples could see the run at all."""
    show_chart(gauges_figure(gauges, cursor), key="rp_gauges")
    cov = gauge_coverage(r.tr, gauges, r.views.request_metrics())
    if cov is None:
        return
    said = (f"{cov['samples']:,} scrapes, a median {cov['median_gap_ms']:,.0f} ms apart; "
            f"{cov['during_requests']:,} fell while a request was in flight (the requests' own times), "
            f"{cov['reading_running']:,} read running > 0.")
    if cov["missed"]:
        r.notice(f"The server's gauges miss this run's activity: {said} A request lasts a median "
                 f"{cov['median_e2e_ms']:,.0f} ms, so the scrapes mostly land between requests; the "
                 "in-flight chart, from the requests' own times, shows the load.", ":material/visibility_off:")
    else:
        st.caption(said)


def engine_views(tr, p) -> None:
    """What the engine said about itself, when the trace has it: its prefix cache (KV events), each
    request's phases inside it (spans)."""
    cursor = p.cursor_ms
    if p.prefix_cache is not None:
        show_chart(prefix_cache_figure(p.prefix_cache, cursor), key="rp_prefix_cache")
        at = p.prefix_at
        st.caption(f"At the cursor: {at['cached']} blocks cached; {at['stored']} stored, {at['removed']} removed, "
                   f"{at['cleared']} clear(s) so far. Measured by the engine (its KV events: content hashes of full "
                   "blocks, no request ids; a cache hit publishes nothing).")
    if p.phase_requests:
        idx, ex = p.phase_requests, tr.request_extra
        show_chart(engine_phases_figure([tr.ids[i] for i in idx], tr.requests["arrival_ms"].to_numpy()[idx],
                                        [ex[i] for i in idx], cursor), key="rp_phases")
        st.caption("Measured by the engine: each request's span (gen_ai.latency.time_in_queue, "
                   "time_in_model_prefill, time_in_model_decode), from its arrival at the engine's front-end.")
