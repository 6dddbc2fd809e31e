"""Trace replay: load a trace (bundled, uploaded, or an engine's result file), move a time
cursor through it, compare it with another trace or with the simulator's prediction.

The page is the sequence of its sections (ui/replay/): open the trace, the metrics panel at the top
(filled after the cursor's views, so that on a large trace the first charts do not wait for the
whole-trace summary: ~0.4 s at 10,000 requests, ~5 s at 100,000), the time cursor and its views,
where the numbers come from, what else the trace holds, downloads, compare, how good the simulator is."""
import streamlit as st

from ui import bound, ensure_app_frame, replay_trace_files
from ui.replay.compare import compare_section, fidelity_section
from ui.replay.cursor import cursor_views
from ui.replay.opening import MERGE, UPLOAD, open_replay
from ui.replay.panels import bursts_table, downloads, follow_live, metrics_panel, provenance_panel, trace_extras

ensure_app_frame()

st.title("Trace replay")
st.caption("Open a trace (bundled, captured, or another tool's file: docs/imports.md) and move the time cursor: "
           "every view follows it.")

files = replay_trace_files()
choice = st.selectbox("Trace", list(files) + [UPLOAD, MERGE], **bound("tr"))
r = open_replay(files, choice)      # (the page stops there when there is nothing to show)

panel = st.container()              # the metrics panel's place: here, at the top
toggles = st.columns(4)
live = choice not in (UPLOAD, MERGE) and not r.large and toggles[1].toggle(
    "Live: follow the file", False, key="rp_live",
    help="for a trace being written by `gpu_runner serve --trace-out` or `gpu_runner loadgen --out`: re-read about "
         "once a second")
if live:
    follow_live(r, panel)           # (stops the page)
playing = toggles[0].toggle("Play", False, help="advance the cursor automatically", **bound("rp_play"))

cursor_views(r, playing)
provenance_panel(r)
metrics_panel(r, panel)
bursts_table(r)
trace_extras(r)
downloads(r)                        # (a trace too large to load stops here)
prediction = compare_section(r)
fidelity_section(r, prediction)
