"""Trace replay: load a trace (bundled, uploaded, or an engine's result file), move a time
cursor through it, compare it with another trace or with the simulator's prediction."""
import gzip

import numpy as np
import pandas as pd
import streamlit as st

from core.analysis.compare import compare_table, distinct_labels, workload_differences
from core.analysis.cursor import advance, gauge_coverage, requests_near, step_cursor, subset, time_range
from core.analysis.export import USER_META_LIMITS, chrome_trace_json, metrics_csv, metrics_frame_csv, with_run_metadata
from core.analysis.metrics import BURST_FRACTION, delivery_bursts, engine_side
from core.analysis.routing import fleet_description, has_replicas
from core.analysis.tools import headline, itl_note, tool_comparison
from core.analysis.views import cursor_panels, missing_views
from core.config import POLICIES, SchedulerConfig
from core.errors import InputError
from core.figures import CURSOR
from core.figures.attention import captured_tiles_figure
from core.figures.batch import batch_figure, gauges_figure, in_flight_figure
from core.figures.engine import counted_steps_figure, engine_phases_figure, prefix_cache_figure
from core.figures.latency import cdf_figure
from core.figures.memory import occupancy_heatmap
from core.figures.spec import acceptance_by_position_figure
from core.figures.timeline import MAX_LANES, schedule_timeline
from core.fit.predict import describe_request_prediction, prediction_methods
from core.fit.stepfit import MIN_STEPS, describe_identifiability, describe_outside
from core.formulas.speculative import acceptance_by_position
from core.lessons.scenarios import DATA as DATA_DIR
from core.trace import file_summary_comparison, file_window_comparison, trace_json
from ui import (
    UPLOAD_LIMIT_MB,
    add_aiperf_summary,
    bound,
    cached_block_states,
    cached_fidelity,
    cached_prediction,
    cached_request_prediction,
    count_metric,
    derived,
    ensure_app_frame,
    fmt_ms,
    large_trace,
    linked_fragment,
    load_trace_file,
    md,
    ms_metric,
    open_large_trace,
    origin_badge,
    parse_uploaded_run,
    parse_uploaded_trace,
    replay_trace_files,
    show_chart,
    show_table,
    trace_details,
    trace_view,
)
from ui.fleet import cached_fleet_as_one, cached_one_replica, fleet_view

ensure_app_frame()

st.title("Trace replay")
st.caption("Open a trace (bundled, captured, or another tool's file: docs/imports.md) and move the time cursor: "
           "every view follows it.")

files = replay_trace_files()
UPLOAD = "Upload a file…"
MERGE = "Upload several files of one run (merge)…"
FIRST_HALF = "this run's first half (forward in time)"
NO_PEER = "(choose another run)"
FIDELITY_AUTO_REQUESTS = 2000   # above: "How good is the simulator?" runs when asked
choice = st.selectbox("Trace", list(files) + [UPLOAD, MERGE], **bound("tr"))


def get_trace(choice, slot):
    """(trace, imported, label) for a choice, keeping the last good upload on errors."""
    if choice == MERGE:
        ups = st.file_uploader("Several files of one run: a client's result, the server's iteration log, its spans, "
                               "KV events, /metrics scrapes (joined on one clock: docs/imports.md)",
                               accept_multiple_files=True, key=f"{slot}_merge_upload",
                               type=["json", "gz", "jsonl", "yaml", "yml", "log", "txt"])
        if len(ups or []) == 1:
            st.info("Add at least one more file of the same run to merge.")
        if len(ups or []) >= 2:
            tr, _, err = parse_uploaded_run(ups, slot)
            if err:
                st.error(f"Could not merge: {md(err)}")
            else:
                st.session_state[f"{slot}_last"] = (tr, None, f"{len(ups)} files merged")
        last = st.session_state.get(f"{slot}_last")
        return last if last is not None else (None, None, None)
    if choice == UPLOAD:
        up = st.file_uploader(f"serving-trace/1 (.json, .json.gz, .parquet) or another tool's file (vLLM/SGLang, "
                              f"AIPerf .jsonl, guidellm .json/.yaml, inference-perf, vLLM's log, OTLP spans, KV "
                              f"events; docs/imports.md), up to {UPLOAD_LIMIT_MB} MB",
                              type=["json", "gz", "parquet", "jsonl", "yaml", "yml", "log", "txt"],
                              key=f"{slot}_upload")
        if up is not None:
            tr, imp, err = parse_uploaded_trace(up, slot)
            if err:
                st.error(f"Could not load {md(up.name)}: {md(err)}")
            else:
                st.session_state[f"{slot}_last"] = (tr, imp, up.name)
        last = st.session_state.get(f"{slot}_last")
        if last is None:
            return None, None, None
        if up is not None and last[1] is not None and last[1].kind == "aiperf-records" and not last[1].stats:
            extra = st.file_uploader("Add AIPerf's summary of this run (profile_export_aiperf.json) to see its own "
                                     "statistics beside ours", type=["json", "gz"], key=f"{slot}_aiperf_summary")
            if extra is not None:
                tr, imp, err = add_aiperf_summary(up, extra, slot)
                if err:
                    st.error(f"Could not add {md(extra.name)}: {md(err)}")
                else:
                    last = (tr, imp, up.name)
                    st.session_state[f"{slot}_last"] = last
        if up is None or st.session_state.get(f"{slot}_last")[2] != up.name:
            st.caption(f"Showing the last file that loaded: {md(last[2])}")
        return last
    tr, imp, err = load_trace_file(files[choice])
    if err:
        st.error(f"Could not load {md(choice)}: {md(err)}")
        return None, None, None
    return tr, imp, choice


# a bundled example (data/): what it leaves out is explained in a caption, not a warning box (boxes
# are for the user's own files, where they are news)
BUNDLED = choice in files and DATA_DIR in files[choice].resolve().parents


def notice(text: str, icon: str, share: float = 1.0):
    """A warning box on the user's own file when it matters (`share`: the part of the run it concerns,
    boxed from 1%); a caption with the icon otherwise."""
    if BUNDLED or share < 0.01:
        st.caption(f"{icon} {text}")
    else:
        st.warning(text, icon=icon)


large = choice in files and large_trace(files[choice])
if large:   # too large to load: opened from its overview (core/analysis/overview.py)
    ov, built_s, err = open_large_trace(files[choice])
    if err:
        st.error(f"Could not open {md(choice)}: {md(err)}")
        st.stop()
    tr, imp, label = ov.skeleton, None, choice
    rows = ov.rows()
    st.info(f"{rows['requests']:,} requests, {rows['tokens']:,} tokens, {rows['batch entries']:,} batch entries: too "
            "large to load, so this page reads the trace's overview — its summary computed out of core (DuckDB), "
            "each request's spans, the steps and KV block states, and the token and batch rows sorted by request, so "
            "a cursor move reads only the rows it draws. "
            + (f"Built on this first open in {built_s:.1f} s (`python -m core overview {md(choice)}` builds it ahead)."
               if built_s is not None else f"Overview built in {ov.doc['built']['seconds']:.1f} s, read from "
                                           f"{md(ov.folder.name)}."))
else:
    tr, imp, label = get_trace(choice, "rp")
if imp is not None and len(imp.runs) > 1:
    # a file of several runs (a guidellm report of several benchmarks, a vllm bench sweep): pick one
    labels = [r.run_label or f"run {k + 1}" for k, r in enumerate(imp.runs)]
    labels = [lab if labels.count(lab) == 1 else f"{lab} (#{k + 1})" for k, lab in enumerate(labels)]
    pick = st.selectbox(f"Run within this file ({len(labels)} in it)", labels, **bound("rp_run"),
                        help="each benchmark (or sweep point) of the file is its own run, with its own numbers")
    imp = imp.runs[labels.index(pick)]
    tr, label = imp.trace, f"{label} — {pick}"
if imp is not None:
    for note in imp.notes:
        st.info(md(note))
    if imp.failed:
        st.warning(f"{len(imp.failed)} failed request(s) in the file (kept, excluded from latency statistics):")
        show_table(pd.DataFrame(imp.failed), hide_index=True, key="rp_failed")
if tr is None:
    if imp is not None:
        st.subheader("The file's own summary")
        show_table(pd.DataFrame([imp.file_summary]).T.rename(columns={0: "value"}), key="rp_filesummary")
    else:
        st.info("Pick a trace or upload one.")
    st.stop()

fleet_tr = None   # the whole fleet's trace when one replica is shown
cursor_tr = tr    # what the cursor's views read (the whole fleet: its replicas numbered apart, totals summed)
if not large and has_replicas(tr):
    from core.analysis.routing import replica_roles
    roles = replica_roles(tr)
    whole = "the whole fleet"
    pick = st.selectbox("Replica", [whole] + [f"replica {i} ({role})" for i, role in enumerate(roles)],
                        **bound("rp_replica"), help="a fleet trace: the views below for every replica together, or for "
                                               "one replica as a trace of its own (its steps, KV blocks, requests)")
    if pick != whole:
        fleet_tr, tr = tr, cached_one_replica(tr, int(pick.split()[1]))
        cursor_tr = tr
    else:
        cursor_tr = cached_fleet_as_one(tr)
        st.caption("The whole fleet: running, waiting and KV blocks are every replica's added up, and the KV grid "
                   "shows each replica's pool after the one before (replica 1's blocks numbered after replica 0's); "
                   "the batch at the cursor is the step of whichever replica stepped last. Pick a replica to see "
                   "one engine.")

BIG_TRACE = len(tr.requests) > 150     # the cursor views show a subset and draw large charts once
STATIC_CELLS = 20_000                  # a KV grid larger than this is drawn once, without the cursor line
STATIC_STEPS = 1_000                   # a counted-steps chart longer than this is drawn once, without the cursor
TOKEN_TICKS = 4_000                    # the cursor's timeline draws token ticks up to this many (SVG paths)
views = ov if large else trace_view(cursor_tr, BIG_TRACE)   # a core.analysis.views.TraceView: one interface

# ---- metrics panel ---------------------------------------------------------------------
# Its place is here, at the top; it is filled after the cursor views, so that on a large trace
# the first charts do not wait for the whole-trace summary (~0.4 s at 10,000 requests, ~5 s at 100,000).
panel = st.container()


def metrics_panel():
    with panel:
        details = trace_details(tr, notes=False)
        st.markdown(f"**{md(tr.label)}** {origin_badge(tr)} "
                    + (f":small[:gray[{details}]]" if details else "")
                    + (" :small[:gray[· its notes: under *Where these numbers come from*]]"
                       if tr.meta.get("notes") else ""))
        summary = views.summary()
        s = summary["summary"]
        cols = st.columns(6)
        cols[0].metric("requests", count_metric(s["requests"]), help=f"{s['requests']:,}")
        cols[1].metric("output tokens", count_metric(s["output_tokens"]),   # emitted (the summary's output_tokens)
                       help=f"{s['output_tokens']:,} emitted")
        tok_s = s["output_tok_per_s"]
        cols[2].metric("output tok/s", "—" if tok_s is None else f"{tok_s:,.1f}",
                       help=f"output tokens over the drain window, {s['window_ms'][0]:g}–{s['window_ms'][1]:g} ms "
                            "(first arrival to last finish; core/analysis/metrics.py)")
        heads = headline(s, imp)
        for col, h in zip(cols[3:], heads):
            label, value = ms_metric(h["label"], h["value"])
            col.metric(label + ("" if h["by"] == "ours" else " ·file"), value,
                       help=(f"{h['by']}'s own figure, from its file ({h['estimator']}); ours, computed from the "
                             f"requests: {fmt_ms(h['ours'])} ms" if h["by"] != "ours" else None))
        tools = sorted({h["by"] for h in heads if h["by"] != "ours"})
        st.caption((f"TTFT and TPOT marked ·file: {md(', '.join(tools))}'s own figures, as its users saw them "
                    f"(its percentiles: {md(heads[0]['estimator'])}); ours beside them: "
                    + ", ".join(f"{h['label']} {fmt_ms(h['ours'])} ms" for h in heads if h["by"] != "ours")
                    + f" ({s['percentile_estimator']}). " if tools else f"Percentiles: {s['percentile_estimator']}. ")
                   + md(" ".join(s["notes"][:2])))
        note = itl_note(imp) if imp is not None else None
        if note:
            st.caption(md(note))
        if not large:
            two_clocks(s)
        if isinstance(tr.meta.get("engine"), dict):
            with st.expander("Engine configuration"):
                st.json(tr.meta["engine"])
        if imp is not None and (imp.file_summary or imp.stats):
            with st.expander("Our metrics vs the file's own summary"):
                agree = file_summary_comparison(imp, summary)
                if not len(agree) and imp.stats:     # another tool than vllm bench: its statistics, computed its way
                    st.caption(f"{md(imp.tool)}'s own statistics; ours computed its way (its percentile estimator: "
                               f"{md(imp.estimator)}; *relative_difference* = (ours − file) / file).")
                    agree = tool_comparison(imp)
                show_table(agree, hide_index=True, key="rp_agree")
                windows = file_window_comparison(imp, summary)
                if len(windows):
                    st.caption("Throughput and duration: the same counts over different windows (see *how*). "
                               "The benchmark's duration starts before the first send and includes client overhead.")
                    show_table(windows, hide_index=True, key="rp_windows")


def two_clocks(s):
    """Where the engine's spans give its own per-request times, its numbers beside the client's, and the
    requests whose tokens reached the client in a burst (core.analysis.metrics.delivery_bursts)."""
    eng = engine_side(tr)
    if eng is None:
        return
    bursts = delivery_bursts(tr, views.request_metrics())
    client_ttft = s["ttft_ms"]["median"]
    said = ", ".join(f"{name} **{fmt_ms(eng[key][stat])} ms**" for name, key, stat in (
        ("TTFT p50", "ttft_ms", "median"), ("TTFT p99", "ttft_ms", "p99"), ("E2E p50", "e2e_ms", "median"))
        if key in eng)
    st.caption(f"**Two clocks.** The numbers above are the **client's** (send → first streamed chunk, → last "
               f"chunk). The **engine's** own spans (arrival at its front-end → first token, → finish; measured, "
               f"n = {eng.get('ttft_ms', {}).get('n', 0):,}): {said}. "
               + (f"The TTFT medians differ by {client_ttft - eng['ttft_ms']['median']:,.1f} ms: HTTP, "
                  "detokenisation and streaming between the two. " if client_ttft is not None and "ttft_ms" in eng
                  else "")
               + (f"**{len(bursts):,} of {len(tr.requests):,}** requests were delivered in a burst (first to last "
                  f"token in under {BURST_FRACTION:.0%} of the engine's decode time; listed below the charts)."
                  if len(bursts) else ""))


def bursts_table():
    """The requests delivered in a burst (two_clocks counts them), below the cursor's views."""
    if large or engine_side(tr) is None:
        return
    bursts = delivery_bursts(tr, views.request_metrics())
    if len(bursts):
        with st.expander(f"{len(bursts):,} requests received their tokens in a burst"):
            st.caption("For these, the client's TPOT and inter-token gaps measure how the server delivered the "
                       "stream (many tokens in one chunk or back to back), not how fast the engine decoded: "
                       "read the engine's decode time instead.")
            show_table(bursts, hide_index=True, key="rp_bursts")


# ---- live: follow a file that is still being written --------------------------------------
def show_live(now_tr, name):
    """The growing trace at "now" (its last event): counts, the requests nearest now, in flight,
    and the server's own gauges when a capture client sampled them."""
    m = derived(now_tr, "summary")["summary"]
    a, b = time_range(now_tr)
    finished = len(now_tr.finishes)
    c = st.columns(4)
    c[0].metric("requests so far", f"{len(now_tr.requests):,}")
    c[1].metric("finished", f"{finished:,}")
    c[2].metric("tokens", f"{m['output_tokens']:,}")
    c[3].metric("now (ms)", f"{b:,.0f}")
    idx = requests_near(now_tr, b, limit=60, metrics=derived(now_tr, "requests"))
    fig = schedule_timeline([(name, subset(now_tr, idx))], max_token_markers=5_000)
    fig.add_vline(x=b, line_color=CURSOR, line_width=2)
    show_chart(fig, key="rp_live_timeline")
    show_chart(in_flight_figure(derived(now_tr, "in_flight"), b), key="rp_live_inflight")
    gauges = now_tr.events_of("gauge")
    if gauges:
        show_chart(gauges_figure(gauges, b), key="rp_live_gauges")
    if len(now_tr.kv):
        occ = cached_block_states(now_tr)
        show_chart(occupancy_heatmap(occ, now_tr.ids, occ.index_at(b)), key="rp_live_kv")


toggles = st.columns(4)
live = choice not in (UPLOAD, MERGE) and not large and toggles[1].toggle("Live: follow the file", False, key="rp_live",
                                              help="for a trace being written by `gpu_runner serve --trace-out` or "
                                                   "`gpu_runner loadgen --out`: re-read about once a second")
if live:
    metrics_panel()

    @st.fragment(run_every=1.0)
    def live_views():
        now_tr, _, err = load_trace_file(files[choice])
        if err or now_tr is None:
            st.warning(f"Waiting for a readable {md(choice)}: {md(err)}")
            return
        show_live(now_tr, label)

    live_views()
    st.caption("Turn live off to move the time cursor and compare.")
    st.stop()

# ---- the time cursor ---------------------------------------------------------------------
t0, t1 = views.span()
if t1 <= t0:
    t1 = t0 + 1.0
playing = toggles[0].toggle("Play", False, help="advance the cursor automatically", **bound("rp_play"))
SPEEDS = {"½×": 0.5, "1×": 1.0, "2×": 2.0, "4×": 4.0}


@linked_fragment(run_every=0.8 if playing else None)
def cursor_views():
    step = (t1 - t0) / 400
    here = st.session_state.get("rp_cursor", float(t0 + (t1 - t0) / 2))
    c_back, c_fwd, c_speed = st.columns([1, 1, 3])
    starts = tr.steps["t_ms"].to_numpy() if len(tr.steps) else np.empty(0)

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
    cursor = st.slider("Time cursor (ms)", float(t0), float(t1), float(t0 + (t1 - t0) / 2), step=step,
                       format="%.3f", **bound("rp_cursor"))
    p = cursor_panels(views, cursor, BIG_TRACE)     # which panels, for which requests (core.analysis.views)
    if p.shown_note:
        st.caption(f"Timeline: {p.shown_note}.")
    # one 1280x800 screen: the cursor, a compact timeline, then batch and KV side by side
    fig = schedule_timeline([(label, p.shown)], max_token_markers=TOKEN_TICKS, max_height=300)
    fig.add_vline(x=cursor, line_color=CURSOR, line_width=2)
    show_chart(fig, key="rp_timeline")
    left, right = st.columns(2)
    row = p.step
    with left:
        if p.left == "counted_steps":
            # drawn once, without the cursor line, past STATIC_STEPS steps (the caption names the step at the cursor)
            show_chart(counted_steps_figure(tr.steps, None if len(tr.steps) > STATIC_STEPS else cursor)
                       .update_layout(height=280), key="rp_counted_steps")
            st.caption(f"Step {int(row['step'])} at the cursor ({row['dur_ms']:.2f} ms): {int(row['prefill_reqs'])} "
                       f"prefill request(s), {int(row['prefill_tokens'])} uncached prompt tokens, "
                       f"{int(row['decode_reqs'])} decoding. Measured by the engine (its iteration log: counts, no "
                       "requests; start times within each line's one-second timestamp, see the trace's clock).")
        elif p.left == "in_flight":
            show_chart(in_flight_figure(views.in_flight(), cursor), key="rp_inflight")
            st.caption("Batch composition needs `step` events (with their `batch` lists).")
        else:
            show_chart(batch_figure(p.batch, row).update_layout(height=280), key="rp_batch")
    with right:
        if p.right == "kv":
            ids = tr.requests["id"].to_numpy()      # names for the hover of a small grid only
            # a large trace's heatmap is drawn without the cursor line: unchanged, it is not sent again at
            # each move (re-sending and redrawing the two large charts was 0.6 s of a 0.8 s move on a
            # 500-request, 49,560-step run); the state at the cursor is in the caption
            # ... and so is any heatmap of more than STATIC_CELLS cells (a 286 KB grid redrawn at each step was
            # most of a 2 s step on a 2-core machine)
            static = BIG_TRACE or p.occupancy.state.size > STATIC_CELLS
            show_chart(occupancy_heatmap(p.occupancy, ids, None if static else p.kv_index)
                       .update_layout(height=280), key="rp_kv")
            st.caption("At the cursor: " + ", ".join(f"{v} {k}" for k, v in p.kv_counts.items()) + " blocks"
                       + (" (the grid is drawn once, without the cursor line: its size would make every move "
                          "slow)." if static and not BIG_TRACE else "."))
        elif p.right == "gauges":
            gauges_view(p.gauges, cursor)
        else:
            st.caption("KV block occupancy needs `kv` events (alloc/free/hit/...).")
    if p.in_flight_below:
        show_chart(in_flight_figure(views.in_flight(), None if BIG_TRACE else cursor), key="rp_inflight")
        if p.flight_at is not None:
            running, waiting = p.flight_at
            st.caption(f"At the cursor: {running:,} running" + (f", {waiting:,} waiting" if waiting >= 0 else "")
                       + " (the chart is drawn once for a trace this large: the timeline above carries the cursor).")
    if p.gauges_below:
        gauges_view(p.gauges, cursor)
    engine_views(p)


def gauges_view(gauges, cursor):
    """The server's sampled gauges, and whether the samples could see the run at all."""
    show_chart(gauges_figure(gauges, cursor), key="rp_gauges")
    cov = gauge_coverage(tr, gauges, views.request_metrics())
    if cov is None:
        return
    said = (f"{cov['samples']:,} scrapes, a median {cov['median_gap_ms']:,.0f} ms apart; "
            f"{cov['during_requests']:,} fell while a request was in flight (the requests' own times), "
            f"{cov['reading_running']:,} read running > 0.")
    if cov["missed"]:
        notice(f"The server's gauges miss this run's activity: {said} A request lasts a median "
               f"{cov['median_e2e_ms']:,.0f} ms, so the scrapes mostly land between requests; the "
               "in-flight chart, from the requests' own times, shows the load.", ":material/visibility_off:")
    else:
        st.caption(said)


def engine_views(p):
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


def provenance_panel():
    """Where every number on this page comes from: the trace's origin, its clock and, per quantity,
    who measured it and how (imported and merged files)."""
    prov, clock, merged = tr.meta.get("provenance"), tr.meta.get("clock"), tr.meta.get("merged_from")
    notes = tr.meta.get("notes")
    if not (prov or clock or merged or notes):
        return
    with st.expander("Where these numbers come from"):
        if notes:
            st.markdown(f"**The trace's own notes**: {md(str(notes))}")
        if clock:
            st.markdown(f"**Clock**: {md(clock.get('kind', '?'))}; {md(clock.get('how', ''))} "
                        f"(resolution {clock.get('resolution_ms', 0):g} ms).")
        if prov:
            show_table(pd.DataFrame([{"quantity": k, "measured by, and how": v} for k, v in prov.items()]),
                       hide_index=True, key="rp_provenance")
        if merged:
            show_table(pd.DataFrame(merged), hide_index=True, key="rp_merged")
        if imp is not None and imp.stats:
            st.markdown(f"**{md(imp.tool)}'s own statistics beside ours**, computed its way (its percentile "
                        f"estimator: {md(imp.estimator)}):")
            show_table(tool_comparison(imp), hide_index=True, key="rp_tool_cmp")


def fleet_panel():
    """A trace served by several replicas (meta.fleet, or replica columns): where each request went
    and why, each replica over time, its prefix-cache hits, the KV transfers (core.figures.fleet)."""
    st.header("Fleet")
    st.markdown(f"{origin_badge(tr)} {md(fleet_description(tr))}"
                + (f" :small[:gray[{trace_details(tr, notes=False)}]]" if trace_details(tr, notes=False) else ""))
    show_chart(fleet_view("lanes", tr), key="rp_fleet_lanes")
    st.caption("Requests grouped by the replica the router sent them to (▶; hover for its reason), or past "
               f"{MAX_LANES} requests each replica's running requests over time.")
    show_chart(fleet_view("signals", tr), key="rp_fleet_signals")
    left, right = st.columns(2)
    show_chart(fleet_view("hits", tr), key="rp_fleet_hits", where=left)
    if tr.events_of("transfer"):
        show_chart(fleet_view("transfers", tr), key="rp_fleet_transfers", where=right)


cursor_views()
provenance_panel()
metrics_panel()
bursts_table()
if not large and has_replicas(tr) and fleet_tr is None:
    fleet_panel()
spec = tr.events_of("spec")
if spec:
    pos, rates, counts = acceptance_by_position(spec)
    show_chart(acceptance_by_position_figure(pos, rates, counts), key="rp_spec")
tiles = tr.events_of("tiles")
if tiles:
    show_chart(captured_tiles_figure(tiles[:64]), key="rp_tiles")
missing = missing_views(tr)
if missing:
    st.caption("Not in this trace: " + "; ".join(missing) + ".")

with st.expander("Per-request metrics"):
    m = views.request_metrics()
    shown = m.head(2000)
    if "latency_ms" in shown and np.allclose(shown["latency_ms"], shown["e2e_ms"], equal_nan=True):
        shown = shown.drop(columns="latency_ms")     # equal to E2E for every request: one column on screen
    show_table(shown, hide_index=True, key="rp_requests", export=m.head(2000))
    if len(m) > 2000:
        st.caption(f"First 2,000 of {len(m):,} requests; the CSV export has all.")

# ---- export ----------------------------------------------------------------------------
if large:
    st.download_button("Per-request metrics (CSV)", data=lambda: metrics_frame_csv(views.request_metrics()),
                       file_name=f"{label}.metrics.csv", mime="text/csv", key="rp_dl_csv")
    st.caption("Compare, predict and the Chrome trace need the whole trace in memory. For a trace this size, "
               "from the command line, out of core: `python -m core compare A.parquet B.parquet`, "
               "`python -m core fit T.parquet`, `python -m core export T.parquet --csv OUT.csv` (docs/scale.md).")
    st.stop()
if choice == UPLOAD:
    with st.expander("Run details for this upload (kept in the trace you download)"):
        device = st.text_input("Device", tr.meta.get("device") or "", max_chars=USER_META_LIMITS["device"],
                               key="rp_meta_device", help="e.g. 1x H100-SXM, driver 550, CUDA 12.4")
        engine = st.text_input("Engine and version", "", max_chars=USER_META_LIMITS["engine"],
                               key="rp_meta_engine", help="e.g. vLLM 0.11.0, --max-num-seqs 256")
        notes = st.text_area("Notes", tr.meta.get("notes") or "", max_chars=USER_META_LIMITS["notes"],
                             key="rp_meta_notes")
        try:
            described = with_run_metadata(tr, device, engine, notes)
        except InputError as e:
            st.error(str(e))
            described = tr
        given = [f"{k} “{v}”" for k, v in (("device", device), ("engine", engine)) if v.strip()]
        st.caption("The download below carries " + (", ".join(given) if given else "no run details yet")
                   + (" and your notes." if notes.strip() and notes != (tr.meta.get("notes") or "") else "."))
        st.download_button("Trace with these details (JSON, gzip)",
                           data=lambda: gzip.compress(trace_json(described).encode()),
                           file_name=f"{label}.described.json.gz", mime="application/gzip", key="rp_dl_described")
c1, c2 = st.columns(2)
c1.download_button("Chrome / Perfetto trace (JSON)", data=lambda: chrome_trace_json(tr),
                   file_name=f"{label}.chrome.json", mime="application/json", key="rp_dl_chrome",
                   help="open in ui.perfetto.dev or chrome://tracing")
c2.download_button("Per-request metrics (CSV)", data=lambda: metrics_csv(tr), file_name=f"{label}.metrics.csv",
                   mime="text/csv", key="rp_dl_csv")

# ---- compare -----------------------------------------------------------------------------
if not len(tr.requests):
    st.caption("This file holds engine-side records only (steps, KV events, gauges), no requests: to compare and "
               "predict, merge it with the run's client file and spans (`python -m core merge FILE... --out T`, "
               "docs/imports.md).")
    st.stop()
st.header("Compare")
PREDICT = "Predicted by the simulator"


def predict():
    st.session_state["rp_cmp"] = PREDICT


methods = prediction_methods(tr, not (imp is not None and imp.aligned_at_zero))
if not methods:
    st.button("Predict this trace with the simulator (step model fitted to its step durations)",
              on_click=predict, key="rp_predict")
    engine_settings = None
else:   # no step events: fit to the requests' TTFT and E2E under the engine's settings as stated
    with st.expander("Predict with the simulator (no step events): the engine's scheduler settings"):
        method = st.segmented_control(
            "Fit the step time to", methods, default=methods[0], key="rp_rf_method",
            help="token times: the engine's steps read off the streamed tokens (a step's tokens reach the "
                 "client together; core/fit/stepinfer.py); requests: each request's TTFT and E2E, by simulating "
                 "the workload under these settings (core/fit/reqfit.py)") or methods[0]
        st.caption("The simulator replays this workload (send times, or the closed loop of a benchmark run with a "
                   "fixed number of clients; prompt and output lengths) under these settings with an affine step "
                   "time fitted as chosen.")
        e1, e2, e3, e4, e5 = st.columns(5)
        engine_settings = dict(
            policy=e1.selectbox("Policy", POLICIES, index=POLICIES.index("vllm-v1"), key="rp_rf_policy"),
            max_seqs=e2.number_input("max_num_seqs", 1, 1_000_000, 256, key="rp_rf_ms"),
            token_budget=e3.number_input("max_num_batched_tokens", 1, 10_000_000, 2048, key="rp_rf_tb"),
            block_size=e4.number_input("block_size", 1, 4096, 16, key="rp_rf_bs"),
            kv_blocks=e5.number_input("KV blocks (0 = enough)", 0, 100_000_000, 0, key="rp_rf_kb") or None)
        st.button("Fit and predict", on_click=predict, key="rp_predict_requests")
prev_main = st.session_state.get("_rp_main")     # a new main trace: the comparison picked for the old one goes
if prev_main is not None and prev_main != choice and st.session_state.get("rp_cmp") not in (None, "(none)", PREDICT):
    st.session_state["rp_cmp"] = "(none)"
st.session_state["_rp_main"] = choice
other_choice = st.selectbox("Compare with", ["(none)", PREDICT] + list(files) + [UPLOAD], **bound("rp_cmp"))
if other_choice != "(none)":
    if other_choice == PREDICT:
        try:
            if engine_settings is None:
                other = cached_prediction(tr)
                st.caption(f"Prediction: core simulator, {other.meta['step_model']['description']}.")
            else:
                cfg = SchedulerConfig(**engine_settings)
                other, rep = cached_request_prediction(tr, cfg, not (imp is not None and imp.aligned_at_zero),
                                                       method)
                st.caption(describe_request_prediction(rep, cfg.policy, other))
                for line in describe_identifiability(rep.get("identifiability") or {},
                                                     "inferred steps" if rep["method"] == "token times" else
                                                     "requests"):
                    st.info(md(line))
                for line in rep.get("degenerate") or []:
                    st.warning(md(line[0].upper() + line[1:] + "."))
            other_label = "predicted (simulated)"
        except InputError as e:
            st.error(f"Cannot predict: {md(e)}")
            st.stop()
    else:
        other, _, other_label = get_trace(other_choice, "rp_cmp")
        if other is None:
            st.stop()
        other_label = f"{other_label} ({other.source})"
    # (a trace compared with itself, or two of one label: told apart in the table, the CDFs, the timeline)
    this_label, other_label = distinct_labels(f"{label} ({tr.source})", other_label)
    # a closed loop's prediction sends each request when one finishes in the simulation: its
    # arrival times are predicted, not the workload's (the caption above says so)
    closed_prediction = other_choice == PREDICT and engine_settings is not None and bool(rep.get("clients"))
    for d in workload_differences(tr, other, arrivals=not closed_prediction):
        st.warning(f"The two workloads differ: {md(d)}. Differences in metrics mix scheduling with workload.")
    show_table(compare_table(tr, other, this_label, other_label), hide_index=True, key="rp_compare",
                 column_config={c: st.column_config.NumberColumn(format="%.6g")
                                for c in (this_label, other_label, "difference", "ratio")})
    ma, mb = derived(tr, "requests"), derived(other, "requests")
    c1, c2, c3 = st.columns(3)
    for col, metric, key in ((c1, "TTFT", "ttft_ms"), (c2, "TPOT", "tpot_ms"), (c3, "E2E", "e2e_ms")):
        show_chart(cdf_figure({this_label: ma[key], other_label: mb[key]}, metric), key=f"rp_cdf_{key}", where=col)
    if len(tr.requests) <= 60 and len(other.requests) <= 60:
        show_chart(schedule_timeline([(this_label, tr), (other_label, other)]), key="rp_both")

# ---- how good is the simulator? ------------------------------------------------------------------
fid_config = fid_method = None
if len(tr.steps) < MIN_STEPS and engine_settings is not None and not (imp is not None and imp.aligned_at_zero):
    # an engine's result file: held out against a model fitted on another run of the same engine
    st.header("How good is the simulator?")
    st.caption("Fit a step model on another run of this engine (a result file of another workload or load), "
               "replay this run with the core scheduler under the settings above as its clients sent it, and "
               "compare request by request: error = |predicted − measured| / measured (core/fit/fidelity.py). "
               "Every request is held out.")
    peers = [f for f, path in files.items() if f != choice and "imports" in path.parts]
    fit_choice = st.selectbox("Fit on", [NO_PEER] + peers + [UPLOAD], key="rp_fid_peer",
                              help="a result file of the same engine with send times (and per-token times to fit "
                                   "by token times)")
    if fit_choice == NO_PEER:
        st.stop()
    fit_tr, _, _ = get_trace(fit_choice, "rp_fid")
    if fit_tr is None:
        st.stop()
    fid_config, fid_method = SchedulerConfig(**engine_settings), method
if len(tr.steps) >= MIN_STEPS or fid_config is not None:
    if fid_config is None:
        st.header("How good is the simulator?")
        st.caption("Fit a step model on part of this run (or on another run), predict the whole run with the core "
                   "scheduler under this trace's own settings, and compare request by request: error = |predicted "
                   "− measured| / measured (core/fit/fidelity.py).")
        # engines' result files (data/imports) never have step events to fit
        others = [f for f, path in files.items() if f != choice and path.parent.name != "imports"]
        f1, f2 = st.columns(2)
        fit_choice = f1.selectbox("Fit on", [FIRST_HALF] + others, key="rp_fid_on",
                                  help="another run needs step events (a runner capture or a simulation)")
        counted_only = views.counted_steps()    # an engine's iteration log: counts, no attended positions
        fid_model = f2.segmented_control("Step model", ["affine"] if counted_only else ["affine", "features"],
                                         default="affine" if counted_only else "features", required=True,
                                         key="rp_fid_model",
                                         help="an iteration log has counts per step, not attended positions: "
                                              "affine" if counted_only else None)
        fit_tr = None
        if fit_choice != FIRST_HALF:
            fit_tr, _, _ = get_trace(fit_choice, "rp_fid")
    else:
        fid_model = "affine"
    fid_big = len(tr.requests) > FIDELITY_AUTO_REQUESTS   # not BIG_TRACE (the cursor fragment reads it)
    if fid_big and not st.toggle("Fit and predict", value=False, key="rp_fid_run"):
        st.caption(f"{len(tr.requests):,} requests: the check fits the run's steps and simulates the whole run "
                   f"(seconds at this size), so it runs when you switch it on.")
        st.stop()
    try:
        fid = cached_fidelity(tr, fid_model, fit_tr, fid_config, fid_method or "token times")
    except InputError as e:
        st.error(f"Cannot test the simulator on this: {md(e)}")
        st.stop()
    r2 = fid.fit_report.get("r2")
    st.caption(f"Fitted on {md(fid.fit_on)}: {fid.step_model.describe()}"
               + ("" if r2 is None else f" (R² {r2:.3f} on the fitted steps)") + ". Predicted numbers: simulated.")
    for line in describe_identifiability(fid.fit_report.get("identifiability") or {},
                                         "requests" if fid.fit_report.get("fitted_on") == "requests" else "steps"):
        st.info(md(line))
    summ = fid.summary()
    show_table(summ, hide_index=True, key="rp_fid_summary",
               column_config={c: st.column_config.NumberColumn(format="percent")
                              for c in ("median error", "p90 error", "max error")})
    held = fid.requests[fid.requests["held_out"]] if fid.requests["held_out"].any() else fid.requests
    which = "held-out" if fid.requests["held_out"].any() else "all"
    c1, c2 = st.columns(2)
    for col, key, name in ((c1, "ttft_ms", "TTFT"), (c2, "e2e_ms", "E2E")):
        show_chart(cdf_figure({f"{which} requests": 100 * held[f"{key}_error"]}, f"{name} error", unit="%"),
                   key=f"rp_fid_cdf_{key}", where=col)
    if fid.outside:
        notice(f"{md(describe_outside(fid.outside))}: the prediction extrapolates there.", ":material/warning:",
               fid.outside["steps"] / max(1, fid.outside["of"]))
        with st.expander("The predicted steps outside the fitted range"):
            show_table(fid.outside_table, hide_index=True, key="rp_fid_outside")
    else:
        st.caption("Every predicted step lies inside the range the model was fitted on.")
    st.subheader("The requests it misses most")
    show_table(fid.worst(10), hide_index=True, key="rp_fid_worst",
               column_config={c: st.column_config.NumberColumn(format="percent")
                              for c in ("ttft_ms_error", "e2e_ms_error")})

