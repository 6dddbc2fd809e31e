"""The replay page's panels around the cursor: the metrics at the top, the engine's own clock beside
the client's, where every number comes from, the fleet, a file followed live, what else the trace
holds, and the downloads."""
from __future__ import annotations

import gzip

import numpy as np
import pandas as pd
import streamlit as st

from core.analysis.cursor import requests_near, subset, time_range
from core.analysis.export import USER_META_LIMITS, chrome_trace_json, metrics_csv, metrics_frame_csv, with_run_metadata
from core.analysis.metrics import BURST_FRACTION, delivery_bursts, engine_side
from core.analysis.routing import fleet_description, has_replicas
from core.analysis.tools import headline, itl_note, tool_comparison
from core.analysis.views import missing_views
from core.errors import InputError
from core.figures import CURSOR
from core.figures.attention import captured_tiles_figure
from core.figures.batch import gauges_figure, in_flight_figure
from core.figures.memory import occupancy_heatmap
from core.figures.spec import acceptance_by_position_figure
from core.figures.timeline import MAX_LANES, schedule_timeline
from core.formulas.speculative import acceptance_by_position
from core.trace import file_summary_comparison, file_window_comparison, trace_json
from ui import (
    cached_block_states,
    count_metric,
    derived,
    fmt_ms,
    load_trace_file,
    md,
    ms_metric,
    origin_badge,
    show_chart,
    show_table,
    trace_details,
)
from ui.fleet import fleet_view
from ui.replay.opening import UPLOAD, Replay

REQUEST_ROWS = 2000     # the per-request table shows this many (its CSV has all)


def _headline_metrics(r: Replay, s: dict) -> None:
    """Requests, tokens, tok/s and the latency headline (another tool's own figures where its file has them)."""
    cols = st.columns(6)
    cols[0].metric("requests", count_metric(s["requests"]), help=f"{s['requests']:,}")
    cols[1].metric("output tokens", count_metric(s["output_tokens"]),   # emitted (the summary's output_tokens)
                   help=f"{s['output_tokens']:,} emitted")
    tok_s = s["output_tok_per_s"]
    cols[2].metric("output tok/s", "—" if tok_s is None else f"{tok_s:,.1f}",
                   help=f"output tokens over the drain window, {s['window_ms'][0]:g}–{s['window_ms'][1]:g} ms "
                        "(first arrival to last finish; core/analysis/metrics.py)")
    heads = headline(s, r.imp)
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


def _file_summary_comparison(imp, summary: dict) -> None:
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


def metrics_panel(r: Replay, panel) -> None:
    """The trace's numbers, in `panel` (a container at the top of the page, filled after the cursor
    views so that on a large trace the first charts do not wait for the whole-trace summary)."""
    tr, imp = r.tr, r.imp
    with panel:
        details = trace_details(tr, notes=False)
        st.markdown(f"**{md(tr.label)}** {origin_badge(tr)} "
                    + (f":small[:gray[{details}]]" if details else "")
                    + (" :small[:gray[· its notes: under *Where these numbers come from*]]"
                       if tr.meta.get("notes") else ""))
        summary = r.views.summary()
        s = summary["summary"]
        _headline_metrics(r, s)
        note = itl_note(imp) if imp is not None else None
        if note:
            st.caption(md(note))
        if not r.large:
            two_clocks(r, s)
        if isinstance(tr.meta.get("engine"), dict):
            with st.expander("Engine configuration"):
                st.json(tr.meta["engine"])
        if imp is not None and (imp.file_summary or imp.stats):
            _file_summary_comparison(imp, summary)


def two_clocks(r: Replay, s: dict) -> None:
    """Where the engine's spans give its own per-request times, its numbers beside the client's, and the
    requests whose tokens reached the client in a burst (core.analysis.metrics.delivery_bursts)."""
    tr = r.tr
    eng = engine_side(tr)
    if eng is None or not ({"ttft_ms", "e2e_ms"} & set(eng)):    # (only the engine's phases: no client to set beside)
        return
    bursts = delivery_bursts(tr, r.views.request_metrics())
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


def bursts_table(r: Replay) -> None:
    """The requests delivered in a burst (two_clocks counts them), below the cursor's views."""
    if r.large or engine_side(r.tr) is None:
        return
    bursts = delivery_bursts(r.tr, r.views.request_metrics())
    if len(bursts):
        with st.expander(f"{len(bursts):,} requests received their tokens in a burst"):
            st.caption("For these, the client's TPOT and inter-token gaps measure how the server delivered the "
                       "stream (many tokens in one chunk or back to back), not how fast the engine decoded: "
                       "read the engine's decode time instead.")
            show_table(bursts, hide_index=True, key="rp_bursts")


def show_live(now_tr, name: str) -> None:
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


def follow_live(r: Replay, panel) -> None:
    """Live: follow a file that is still being written (re-read about once a second); the page stops here."""
    metrics_panel(r, panel)

    @st.fragment(run_every=1.0)
    def live_views():
        now_tr, _, err = load_trace_file(r.files[r.choice])
        if err or now_tr is None:
            st.warning(f"Waiting for a readable {md(r.choice)}: {md(err)}")
            return
        show_live(now_tr, r.label)

    live_views()
    st.caption("Turn live off to move the time cursor and compare.")
    st.stop()


def provenance_panel(r: Replay) -> None:
    """Where every number on this page comes from: the trace's origin, its clock and, per quantity,
    who measured it and how (imported and merged files)."""
    tr, imp = r.tr, r.imp
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


def fleet_panel(tr) -> None:
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


def trace_extras(r: Replay) -> None:
    """What else the trace holds: the fleet (a whole fleet shown), speculative decoding's acceptance,
    captured attention tiles, what it lacks, and the per-request metrics."""
    tr = r.tr
    if not r.large and has_replicas(tr) and r.fleet_tr is None:
        fleet_panel(tr)
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
        m = r.views.request_metrics()
        shown = m.head(REQUEST_ROWS)
        if "latency_ms" in shown and np.allclose(shown["latency_ms"], shown["e2e_ms"], equal_nan=True):
            shown = shown.drop(columns="latency_ms")     # equal to E2E for every request: one column on screen
        show_table(shown, hide_index=True, key="rp_requests", export=m.head(REQUEST_ROWS))
        if len(m) > REQUEST_ROWS:
            st.caption(f"First 2,000 of {len(m):,} requests; the CSV export has all.")


def _described_upload(r: Replay) -> None:
    """An upload's run details (device, engine, notes), kept in the trace downloaded from here."""
    tr = r.tr
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
                           file_name=f"{r.label}.described.json.gz", mime="application/gzip",
                           key="rp_dl_described")


def downloads(r: Replay) -> None:
    """The trace's exports; a trace too large to load has its metrics only, and the page stops there."""
    tr, label = r.tr, r.label
    if r.large:
        st.download_button("Per-request metrics (CSV)", data=lambda: metrics_frame_csv(r.views.request_metrics()),
                           file_name=f"{label}.metrics.csv", mime="text/csv", key="rp_dl_csv")
        st.caption("Compare, predict and the Chrome trace need the whole trace in memory. For a trace this size, "
                   "from the command line, out of core: `python -m core compare A.parquet B.parquet`, "
                   "`python -m core fit T.parquet`, `python -m core export T.parquet --csv OUT.csv` (docs/scale.md).")
        st.stop()
    if r.choice == UPLOAD:
        _described_upload(r)
    c1, c2 = st.columns(2)
    c1.download_button("Chrome / Perfetto trace (JSON)", data=lambda: chrome_trace_json(tr),
                       file_name=f"{label}.chrome.json", mime="application/json", key="rp_dl_chrome",
                       help="open in ui.perfetto.dev or chrome://tracing")
    c2.download_button("Per-request metrics (CSV)", data=lambda: metrics_csv(tr), file_name=f"{label}.metrics.csv",
                       mime="text/csv", key="rp_dl_csv")
