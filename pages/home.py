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

st.page_link("pages/schedules.py", label="Open the chapter's three-request scenario in Schedules",
             icon=":material/play_arrow:", query_params={"sc": "chapter31"})
c1, c2 = st.columns(2)
with c1:
    st.page_link("pages/schedules.py", label="**Schedules** — serial, static, continuous and chunked prefill on "
                 "one time axis; TTFT, TPOT, throughput windows and cost.", icon=":material/view_timeline:")
    st.page_link("pages/kv.py", label="**KV memory & paging** — cache sizing with GQA, paged blocks over "
                 "time, prefix sharing with tenant salts, copy-on-write, eviction and preemption.",
                 icon=":material/memory:")
    st.page_link("pages/tiles.py", label="**Attention tiles** — online softmax tile by tile, exact "
                 "merging vs the wrong average, tile visit order, HBM traffic.", icon=":material/grid_on:")
with c2:
    st.page_link("pages/speculative.py", label="**Speculative decoding** — acceptance and residual as mass "
                 "flows, Monte Carlo check, expected tokens and break-even.", icon=":material/call_split:")
    st.page_link("pages/roofline.py", label="**Roofline** — arithmetic intensity of prefill vs decode, "
                 "bandwidth-bound step rate, batch size.", icon=":material/show_chart:")
    st.page_link("pages/replay.py", label="**Trace replay** — your runs: measured traces from the runner, "
                 "vLLM/SGLang results, uploads; a time cursor, comparisons, predictions.",
                 icon=":material/slow_motion_video:")

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
