"""Schedules: the same workload under serial, static, continuous and chunked-prefill policies."""
import pandas as pd
import streamlit as st

from core.config import SchedulerConfig
from core.errors import InputError
from core.figures.timeline import bar_legend
from core.lessons.scenarios import (
    CUSTOM_COLUMNS,
    MAX_LINK_REQUESTS,
    SCENARIOS,
    SCHEDULE_PRESETS,
    custom_from_link,
    custom_to_link,
    max_output_tokens,
    workload_from_rows,
)
from core.lessons.schedules import GENERIC_POLICIES, POLICY_LABELS, fixed_window
from ui import (
    SCENARIO_LABELS,
    apply_presets_on_change,
    bound,
    cached_given,
    cached_policies,
    cached_scenario,
    choice_param,
    ensure_app_frame,
    fmt_ms,
    notices,
    origin_badge,
    schedule_view,
    scheduler_inputs,
    show_chart,
    show_table,
    step_model_controls,
    theme,
    uploaded_workload,
)

ensure_app_frame()

st.title("Schedules")
st.caption("One workload, several schedulers, one time axis.")

choice_param("sc", SCENARIO_LABELS, "scenario")
label = st.selectbox("Scenario", list(SCENARIO_LABELS), **bound("sc"))
scenario = SCENARIO_LABELS[label]
st.caption(SCENARIOS[scenario])
apply_presets_on_change("sc", "schedules", {lab: SCHEDULE_PRESETS[key] for lab, key in SCENARIO_LABELS.items()})

workload = None
if scenario == "custom":
    rows = [{"id": i, "arrival_ms": a, "prompt_tokens": p, "max_output_tokens": o}
            for i, a, p, o in (("A", 0.0, 4, 3), ("B", 20.0, 4, 2), ("C", 40.0, 2, 1))]
    if "wl" in st.query_params:   # a shared link carries its edited table
        try:
            rows = custom_from_link(st.query_params["wl"])
        except InputError as e:
            st.warning(f"{e}; showing the example table.", icon=":material/link_off:")
            del st.query_params["wl"]
    # the editor starts from the table in the link; its key follows that table, so an edit that
    # went into the link becomes the next run's starting table rather than being applied twice
    edited = st.data_editor(pd.DataFrame(rows, columns=list(CUSTOM_COLUMNS)), num_rows="dynamic", hide_index=True,
                            key=f"sched_editor_{abs(hash(str(rows)))}")
    try:
        workload = workload_from_rows(edited.to_dict("records"))
        if len(workload) <= MAX_LINK_REQUESTS:
            st.query_params["wl"] = custom_to_link(workload)
    except InputError as e:
        st.error(f"Workload table: {e}")
elif scenario == "upload":
    workload = uploaded_workload("sched", "our JSON, Vidur CSV, LLMServingSim JSONL, Mooncake JSONL, or a trace",
                                 "Upload a workload file to simulate it.")
else:
    workload = cached_scenario(scenario)
if workload is None:
    st.stop()

with st.sidebar:
    st.subheader("Scheduler")
    # Chapter 31 opens on its two given schedules; the simulated ones are one click away
    policies = st.pills("Policies (simulated)", list(POLICY_LABELS), selection_mode="multi",
                        default=[] if scenario == "chapter31" else list(GENERIC_POLICIES),
                        help="chunked = continuous batching with chunked prefill; vllm-v1, vllm-v0, orca, "
                             "sarathi follow those systems' batching rules (docs/configuration.md)", **bound("pol"))
    opts = scheduler_inputs({"max_seqs": ("ms", 0), "token_budget": ("tb", 0), "chunk": ("ch", 2),
                             "kv_blocks": ("kb", 0), "block_size": ("bs", 16)})
    chunk = opts.pop("chunk")
    step_model = step_model_controls()
    st.subheader("Throughput and cost")
    usd = st.number_input("Tariff (USD per hour)", 0.0, 1e6, 2.0, step=0.5, **bound("usd"))

try:
    config = SchedulerConfig(**opts)
    schedules = cached_given(scenario) + cached_policies(workload, tuple(policies or ()), config, step_model,
                                                            int(chunk), record_kv=False)
except InputError as e:
    st.error(f"Scheduler settings: {e}")
    st.stop()
if not schedules:
    st.info("Pick at least one policy.")
    st.stop()

st.markdown(" ".join(f"**{label}** {origin_badge(tr)}  " for label, tr in schedules))
if policies:
    st.caption(f"Simulated step model — {step_model.describe()}. "
               f"Workload: {len(workload)} requests asking for {max_output_tokens(workload):,} output tokens.")
if scenario == "chapter31":
    st.caption("The given schedules are the chapter's Table 31.1 (its assigned emission times). Pick simulated "
               "policies in the sidebar to run the same three requests through the core scheduler; their times "
               "follow the stated step model, so they need not match the table.")
timeline = schedule_view("timeline", schedules)
bars = bar_legend(timeline)
st.caption((f"Bars: {bars}" if bars else "Each row a request") + "; ticks: token emissions (hover for time and gap).")
show_chart(timeline, key="sched_timeline", width="stretch")

with st.expander("Seats, step by step (animation)", expanded=scenario in ("chapter31", "burst5")):
    # the simulated schedules shown; on the given-only default, static vs continuous of the same workload
    animated = [s for s in schedules if len(s[1].steps)]
    if not animated:
        try:
            animated = cached_policies(workload, ("static", "continuous"), config, step_model, int(chunk),
                                       record_kv=False)
        except InputError as e:
            st.error(f"Scheduler settings: {e}")
    fig = schedule_view("slots", animated, theme()) if animated else None
    if fig is None:
        st.info("The seat view draws batches of at most 64 running sequences; lower 'Max running sequences' "
                "to animate this workload.")
    else:
        st.caption("Each row is a seat of the running batch, each column a forward step, each colour a request "
                   "(▶: its prefill step). Press play or drag the slider: a request that finishes frees its seat, "
                   "and under continuous batching the next request takes it at the next step, while a static "
                   "batch leaves it empty until its longest request is done. "
                   + ("" if policies else "Simulated with the sidebar's step model (the given schedules have no "
                      "steps). ") + step_model.describe())
        show_chart(fig, key="sched_slots", width="stretch")

c1, c2 = st.columns(2)
w0 = c1.number_input("Fixed window start (ms)", 0.0, 1e12, 0.0, **bound("w0"))
w1 = c2.number_input("Fixed window end (ms, 0 = latest emission)", 0.0, 1e12,
                     400.0 if scenario == "chapter31" else 0.0, **bound("w1"))   # the chapter's 400 ms window
try:
    window = fixed_window(schedules, w0, w1)
except InputError as e:
    st.error(f"Fixed throughput {e}")
    window = None

st.subheader("Throughput, cost and latency summary")
summ = schedule_view("summary", schedules, window, usd)
if "steps" in summ and summ["steps"].isna().all():   # given schedules only: they have no steps
    summ = summ.drop(columns="steps")
# On screen, columns that add nothing to a row are left out (the CSV export has every column): the origin
# when each schedule's name starts with it, the output tokens when every schedule emits the same number
# (said below), the steps (listed below the table)
shown = summ.drop(columns=[c for c in ("steps",) if c in summ])
if "origin" in shown and all(str(a).startswith(str(o)) for a, o in zip(shown["schedule"], shown["origin"])):
    shown = shown.drop(columns="origin")
same_tokens = "output tokens" in shown and len(shown) > 1 and shown["output tokens"].nunique() == 1
if same_tokens:
    shown = shown.drop(columns="output tokens")
show_table(shown, hide_index=True, key="sched_summary", export=summ)
st.caption((f"Every schedule emits the same {int(summ['output tokens'].iloc[0]):,} output tokens. "
            if same_tokens else "")
           + "Drain window = [first arrival, last emission] of each schedule; the fixed window is the same "
           f"for all. Cost = USD {usd:g}/h × drain-window hours. Latencies in ms; percentiles: numpy 'linear' "
           "estimator.")
taken = schedule_view("steps", schedules)
if taken:
    st.markdown("Forward steps taken: " + ", ".join(f"**{label}** {n:,}" for label, n in taken) + ".")
notices(schedule_view("thin", schedules), "these percentiles")

st.subheader("Per request")
table = schedule_view("requests", schedules)
names = [label for label, _ in schedules]
show = st.selectbox("Schedule", names, **bound("sched_pick"))
one = table[table["schedule"] == show]
show_table(pd.DataFrame({"request": one["request"], "arrival ms": one["arrival_ms"],
                           "waiting ms": one["waiting_ms"].map(fmt_ms), "TTFT ms": one["ttft_ms"].map(fmt_ms),
                           "TPOT ms": one["tpot_ms"].map(fmt_ms), "E2E ms (duration)": one["e2e_ms"].map(fmt_ms),
                           "tokens": one["emitted_tokens"]}),
             hide_index=True, key="sched_requests")
st.caption("TPOT = (E2E − TTFT)/(tokens − 1); a one-token request has none (—), never 0.")
if len(table["request"].unique()) <= 60:
    show_chart(schedule_view("e2e_bars", schedules), key="sched_e2e_bars", width="stretch")

if len(names) >= 2:
    st.subheader("Who wins, who loses")
    c1, c2 = st.columns(2)
    base = c1.selectbox("From", names, index=0, **bound("sched_from"))
    other = c2.selectbox("To", names, index=len(names) - 1, **bound("sched_to"))
    tr_df = schedule_view("tradeoff", schedules, base, other)
    sooner, later = (tr_df["verdict"] == "sooner").sum(), (tr_df["verdict"] == "later").sum()
    st.markdown(f"Switching from **{base}** to **{other}**: {sooner} request(s) finish sooner, "
                f"{later} later (E2E change, negative = sooner).")
    show_table(tr_df, hide_index=True, key="sched_tradeoff")
