"""Home: what the explorer is, and the chapter's three-request scenario computed by core."""
import streamlit as st

from core.analysis.metrics import summarize
from ui import chapter_traces, ensure_app_frame, origin_badge, request_table, show_table

ensure_app_frame()

st.title("Serving Explorer")
st.markdown(
    "See how an LLM server turns requests into tokens: schedules, KV-cache memory, attention "
    "tiles and speculative decoding, all computed by one shared library (`core/`) from "
    "given scenarios, the core simulator, or traces captured from real runs.")

st.page_link("pages/schedules.py", label="Chapter 31's three requests in Schedules",
             icon=":material/play_arrow:", query_params={"sc": "chapter31"})
# Every page, a short link and its description below it (a long link label is cut mid-word in one line)
PAGES = [
    ("pages/schedules.py", "Schedules", ":material/view_timeline:",
     "serial, static, continuous and chunked prefill on one time axis; TTFT, TPOT, throughput windows and cost."),
    ("pages/kv.py", "KV memory & paging", ":material/memory:",
     "cache sizing with GQA, paged blocks over time, prefix sharing with tenant salts, copy-on-write, eviction, "
     "and a real vLLM's prefix cache."),
    ("pages/tiles.py", "Attention tiles", ":material/grid_on:",
     "online softmax tile by tile, exact merging vs the wrong average, tile visit order, HBM traffic."),
    ("pages/speculative.py", "Speculative decoding", ":material/call_split:",
     "acceptance and residual as mass flows, Monte Carlo check, expected tokens and break-even."),
    ("pages/roofline.py", "Roofline", ":material/show_chart:",
     "arithmetic intensity of prefill vs decode, bandwidth-bound step rate, batch size."),
    ("pages/load.py", "Load & SLOs", ":material/speed:",
     "throughput-latency curves from load sweeps, SLOs as gates, goodput, the capacity point, measured runs."),
    ("pages/fleet.py", "Fleet", ":material/hub:",
     "replicas behind a router: where each request went and why, per-replica load and prefix hits, routing "
     "policies side by side, a stale router, disaggregated prefill/decode, draining a replica."),
    ("pages/pathologies.py", "Serving pathologies", ":material/healing:",
     "out-of-memory, head-of-line blocking, recompute thrash, a cancellation leak and cold start, each beside "
     "its control."),
    ("pages/exercises.py", "Exercises", ":material/school:",
     "the chapter's exercises with checked numeric answers and reference solutions."),
    ("pages/replay.py", "Trace replay", ":material/slow_motion_video:",
     "your runs: measured traces, other tools' files (vLLM, SGLang, AIPerf, guidellm, inference-perf, vLLM's own "
     "telemetry); a time cursor, comparisons, predictions."),
    ("pages/calibration.py", "Prediction vs measurement", ":material/rule:",
     "real vLLM runs beside the simulator's prediction of them, request by request: fit on some runs, predict "
     "another, see which term (front end, queueing, prefill, decode) the error comes from."),
]
cols = st.columns(2)
for k, (path, label, icon, desc) in enumerate(PAGES):
    with cols[k % 2]:
        st.page_link(path, label=f"**{label}**", icon=icon)
        st.caption(desc)

st.subheader("Three users arrive before the first answer finishes")
st.markdown(
    "Request A arrives at 0 ms (4 prompt / 3 output tokens), B at 20 ms (4 / 2), C at 40 ms (2 / 1). "
    "The same workload under two assigned schedules:")
cols = st.columns(2)
for col, (name, tr) in zip(cols, chapter_traces().items()):
    s = summarize(tr, usd_per_hour=2.0)
    with col:
        st.markdown(f"**{name.title()}** {origin_badge(tr)}")
        show_table(request_table(s), hide_index=True, key=f"home_table_{name}")
        sm = s["summary"]
        w0, w1 = sm["window_ms"]
        st.metric("Output throughput (drain window)", f"{sm['output_tok_per_s']:.3f} tok/s",
                  help=f"{sm['output_tokens']} tokens over [{w0:g}, {w1:g}] ms")
        st.caption(f"Cost at USD 2/h over that window: {sm['cost_usd']:.9f} USD "
                   f"({sm['cost_per_1k_output_usd']:.6f} USD per 1,000 output tokens).")
