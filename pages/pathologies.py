"""Serving pathologies: five ways serving goes wrong, each beside its fix, with the metric
that reveals it (core/lessons/pathologies.py)."""
import pandas as pd
import plotly.graph_objects as go
import streamlit as st

from core.figures import PALETTE, base_layout
from core.lessons.pathologies import PATHOLOGIES, RUNS, cold_start
from core.lessons.scenarios import DATA
from core.trace import load_trace
from ui import ensure_app_frame, fmt_ms, md, show_chart, show_table

ensure_app_frame()

COLD_TRACE = DATA / "traces" / "cold_start_measured_cpu.json"


@st.cache_resource(show_spinner="Simulating…")
def cached_run(key: str):
    return RUNS[key]()


@st.cache_resource(show_spinner=False)
def cached_cold():
    tr = load_trace(COLD_TRACE)
    return tr, cold_start(tr)


def table(rows: list[dict], key: str, first: tuple[str, ...] = ()):
    """The rows; `first`: the columns that reveal the pathology, right after the schedule's name."""
    df = pd.DataFrame([{k: v for k, v in r.items() if k != "trace"} for r in rows])
    df = df[["schedule", *first, *(c for c in df.columns if c != "schedule" and c not in first)]]
    shown = df
    if {"completed", "requests"} <= set(df.columns):     # one narrow column on screen; both in the CSV
        shown = df.drop(columns=["completed", "requests"])
        shown.insert(1, "completed", [f"{c:,} of {n:,}" for c, n in zip(df["completed"], df["requests"])])
    # on screen a metric a row and a schedule a column: two runs side by side fit any width (a row a
    # run ran past the right edge at 1024 px); the CSV export keeps a row a run, every digit
    side = pd.DataFrame({"metric": [c for c in shown.columns if c != "schedule"]})
    for _, r in shown.iterrows():
        side[str(r["schedule"])] = [_cell(r[c]) for c in side["metric"]]
    show_table(side, hide_index=True, key=key, export=df)


def _cell(v) -> str:
    """A table value as text: integers with thousands separators, other numbers to 4 significant
    digits (from 1,000 on: whole), missing as a dash."""
    if v is None or (isinstance(v, float) and v != v):
        return "—"
    if isinstance(v, (bool, str)):
        return str(v)
    if float(v).is_integer() and abs(v) < 1e15:
        return f"{int(v):,}"
    return f"{v:,.0f}" if abs(v) >= 1000 else f"{v:.4g}"


def over_time(rows: list[dict], column: str, title: str, ytitle: str) -> go.Figure:
    fig = go.Figure()
    for i, r in enumerate(rows):
        st_ = r["trace"].steps
        fig.add_trace(go.Scatter(x=st_["t_ms"], y=st_[column], mode="lines", name=r["schedule"],
                                 line=dict(shape="hv", color=PALETTE[i])))
    fig.update_layout(xaxis_title="time (ms)", yaxis_title=ytitle)
    return base_layout(fig, title, height=300)


def decode_gaps(rows: list[dict]) -> go.Figure:
    fig = go.Figure()
    for i, r in enumerate(rows):
        tk = r["trace"].tokens
        tk = tk[tk["req"] < 8].sort_values(["req", "t_ms"])
        same = tk["req"].to_numpy()[1:] == tk["req"].to_numpy()[:-1]
        t = tk["t_ms"].to_numpy()
        fig.add_trace(go.Scatter(x=t[1:][same], y=(t[1:] - t[:-1])[same], mode="markers", name=r["schedule"],
                                 marker=dict(size=4, color=PALETTE[i])))
    fig.update_layout(xaxis_title="time of the token (ms)", yaxis_title="gap since the request's last token (ms)")
    return base_layout(fig, "Inter-token gaps of the eight running requests", height=300)


st.title("Serving pathologies")
st.caption("Each preset runs the same workload twice — as it goes wrong, and with the control that fixes it — "
           "and names the metric that tells them apart. :orange-badge[simulated] numbers come from the core "
           "simulator (step model stated); :green-badge[measured] ones from a runner capture.")

for p in PATHOLOGIES:
    st.subheader(p.title)
    st.markdown(f"**What goes wrong:** {md(p.symptom)}.  \n**Revealed by:** {md(p.reveals)}.  \n"
                f"**Control:** {md(p.control)}.")
    if p.key == "cold":
        tr, c = cached_cold()
        st.markdown(f":green-badge[measured] {md(c['device'])}, gpu_runner, {md(c['created'])}, "
                    f"`{COLD_TRACE.name}`")
        m = st.columns(4)
        m[0].metric("Model load", f"{fmt_ms(c['model_load_ms'])} ms")
        m[1].metric("First step", f"{fmt_ms(c['first_step_ms'])} ms",
                    help="lazy initialisation, allocator and kernel warm-up land in it")
        m[2].metric("Median later step", f"{fmt_ms(c['median_step_ms'])} ms")
        m[3].metric("First token from process start", f"{fmt_ms(c['first_token_from_start_ms'])} ms",
                    help="model load + the first request's TTFT")
        continue
    rows = cached_run(p.key)
    st.markdown(f":orange-badge[simulated] {md(rows[0]['trace'].meta['workload'])}; step model "
                f"{md(rows[0]['trace'].meta['step_model'].get('description', ''))}")
    table(rows, f"pt_{p.key}", p.columns)
    if p.key == "hol":
        show_chart(decode_gaps(rows), key="pt_hol_fig", width="stretch")
    elif p.key in ("leak", "thrash", "oom"):
        show_chart(over_time(rows, "kv_used_blocks", "KV blocks in use", "blocks"), key=f"pt_{p.key}_fig",
                        width="stretch")
    if p.key == "leak":
        st.caption("The second row is a deliberately broken simulated variant "
                   "(core.lessons.pathologies.LeakyScheduler), "
                   "shown only to make the leak visible; the project's scheduler frees aborted requests' blocks.")
