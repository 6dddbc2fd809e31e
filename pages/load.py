"""Load & SLOs: throughput-latency curves from load sweeps, SLOs as gates, capacity, Little's
law, and Exercise 6 of chapter 31 with numbers."""
import math
import threading

import pandas as pd
import streamlit as st

from core.analysis.metrics import SLO
from core.config import SchedulerConfig
from core.config import describe_options as describe
from core.errors import InputError
from core.experiments.search import check_work, parse_grid, search
from core.figures.load import load_curves, search_figure
from core.lessons.load import (
    SEARCH_BUDGET_S,
    SEARCH_MAX_TOKENS,
    exercise6,
    exercise6_preset,
    measured_point,
    parse_loads,
    schedules_link,
    search_signature,
    search_table,
    searched_workload,
    sweep_policies,
)
from core.lessons.scenarios import DATA
from core.lessons.schedules import POLICY_LABELS, policy_config
from core.workload import load_workload
from ui import (
    HASH_FUNCS,
    bound,
    ensure_app_frame,
    fmt_ms,
    load_trace_file,
    md,
    parse_upload,
    parse_uploaded_trace,
    replay_trace_files,
    scheduler_inputs,
    show_chart,
    show_table,
    step_model_controls,
)

ensure_app_frame()


def open_in_schedules(timed, params):
    """The capacity search's "Open this configuration": the Schedules page's scenario "Upload" shows the
    session's last workload, here the searched one, under the link's parameters (the preset of a changed
    scenario would override them: forgotten, as on opening a link)."""
    st.session_state["sched_last_upload"] = timed
    st.session_state.pop("_prev_sc", None)
    st.session_state["ld_s_open_to"] = params


if (to := st.session_state.pop("ld_s_open_to", None)) is not None:
    st.switch_page("pages/schedules.py", query_params=to)

LOAD_WORKLOADS = {"Poisson 500 (bundled Vidur CSV)": DATA / "workloads" / "poisson500_vidur.csv",
                  "Shared prefix 200": DATA / "workloads" / "shared_prefix_200.json", "Upload": None}


@st.cache_resource(show_spinner="Simulating the sweep…", max_entries=16, hash_funcs=HASH_FUNCS)
def cached_sweeps(workload, policies: tuple, config, step_model, chunk, kind, loads: tuple, seed, slo, att):
    return sweep_policies(workload, list(policies), config, step_model, chunk,
                          rates=list(loads) if kind == "open" else None,
                          concurrency=[int(x) for x in loads] if kind == "closed" else None,
                          seed=seed, slo=slo, attainment=att)


@st.cache_resource(show_spinner="Searching the configurations…", max_entries=8, hash_funcs=HASH_FUNCS)
def cached_search(workload, base_cfg, step_model, grid, rate, slo, att, seed, usd):
    return search(workload, base_cfg, step_model, grid, rate, slo, target=att, seed=seed, usd_per_hour=usd,
                  budget_s=SEARCH_BUDGET_S)


@st.cache_resource(show_spinner=False)
def cached_exercise6():
    return exercise6()


st.title("Load & SLOs")
st.caption("The same requests at several offered loads, simulated per policy. An SLO is a gate: a request meets "
           "it only if it completed and every bound holds; goodput counts only those requests.")

with st.sidebar:
    st.subheader("Load")
    wl_label = st.selectbox("Workload", list(LOAD_WORKLOADS), **bound("ld_wl"))
    kind = st.segmented_control("Loop", ["open", "closed"], default="open", required=True, **bound("ld_kind"),
                                help="open: Poisson arrivals at each rate; closed: N clients, each sending its next "
                                     "request when its last one finishes")
    loads_text = st.text_input("Loads (req/s or clients)", "5,10,15,20,25,30" if kind == "open" else "1,4,16,32,64",
                               **bound("ld_loads"))
    seed = st.number_input("Arrival seed", 0, 2**31 - 1, 0, **bound("ld_seed"))
    st.subheader("Scheduler")
    policies = st.pills("Policies (simulated)", list(POLICY_LABELS), selection_mode="multi",
                        default=["continuous", "chunked"], **bound("ld_pol"))
    opts = scheduler_inputs({"max_seqs": ("ld_ms", 32), "token_budget": ("ld_tb", 8192), "chunk": ("ld_ch", 512),
                             "kv_blocks": ("ld_kb", 0)})
    chunk = opts.pop("chunk")
    st.subheader("Step model (affine)")
    step_model = step_model_controls("ld_", kinds=["affine"],
                                     defaults={"base_ms": 5.0, "prefill_ms_per_token": 0.02, "decode_ms_per_seq": 0.05})
    st.subheader("SLOs (0 = no bound)")
    ttft = st.number_input("TTFT ≤ ms", 0.0, 1e9, 500.0, **bound("ld_ttft"))
    tpot = st.number_input("TPOT ≤ ms", 0.0, 1e9, 50.0, **bound("ld_tpot"))
    e2e = st.number_input("E2E ≤ ms", 0.0, 1e12, 0.0, **bound("ld_e2e"))
    att = st.slider("Capacity: attainment at least", 0.5, 1.0, 0.9, 0.01, **bound("ld_att"))

workload = None
if LOAD_WORKLOADS[wl_label] is None:
    up = st.file_uploader("Workload file (our JSON, Vidur CSV, LLMServingSim JSONL, or a trace)",
                          type=["json", "csv", "jsonl", "gz"], key="ld_upload")
    if up is not None:
        workload, err = parse_upload(up.getvalue(), up.name)
        if err:
            st.error(err)
    if workload is None:
        st.info("Upload a workload file: its requests (lengths, order) are re-timed at each load.")
        st.stop()
else:
    workload = load_workload(LOAD_WORKLOADS[wl_label])

try:
    loads = parse_loads(loads_text, kind)
    slo = SLO(ttft or None, tpot or None, e2e or None)
    config = SchedulerConfig(**opts)
    if not policies:
        raise InputError("policies: pick at least one")
    results = cached_sweeps(workload, tuple(policies), config, step_model, int(chunk), kind, tuple(loads), int(seed),
                            slo, float(att))
except InputError as e:   # ConfigError and WorkloadError too
    st.error(str(e))
    st.stop()

key = "rate" if kind == "open" else "concurrency"
files = replay_trace_files()
picked = st.multiselect("Measured runs on the same axes (traces, or other tools' results that state their load: "
                        "a vllm bench sweep or a guidellm file brings every run it holds)",
                        list(files), key="ld_meas", default=[f for f in ("vllm_cpu_tiny_loadgen.json.gz",
                                                                          "runner_served_tiny_loadgen.json.gz")
                                                              if f in files and kind == "closed"])
up = st.file_uploader("…or upload one", type=["json", "gz", "parquet"], key="ld_meas_upload")
measured, skipped = [], []
sources = [(name, *load_trace_file(files[name])) for name in picked]
if up is not None:
    sources.append((up.name, *parse_uploaded_trace(up, "load")))
runs = []
for name, tr, imp, err in sources:
    if err:
        st.error(err)
        continue
    if imp is not None and imp.runs:       # a sweep in one file or directory: every run is a point
        runs += [(f"{name} [{r.run_label}]", r.trace, r) for r in imp.runs]
    else:
        runs.append((name, tr, imp))
for name, tr, imp in runs:
    p = measured_point(name, tr, slo if slo.given() else None, imp.file_summary if imp else None)
    if p is None:
        skipped.append(f"{md(name)} (no load stated)")
    elif p["kind"] != kind:
        skipped.append(f"{md(name)} ({p['kind']} loop)")
    else:
        measured.append(p)
if skipped:
    st.caption("Not drawn (a different kind of load than this sweep, or none stated): " + ", ".join(skipped))
st.markdown(f":orange-badge[simulated] {len(workload)} requests of *{md(workload.name)}*, "
            f"{'Poisson arrivals, seed ' + str(seed) if kind == 'open' else 'closed loop, no think time'}; "
            f"step model {md(step_model.describe())}.")
show_chart(load_curves(results, slo if slo.given() else None, measured=measured), key="ld_curves",
                width="stretch")
if measured:
    st.caption("Diamonds: measured or imported runs at the load they state (filled p99, open p50). They ran "
               "their own workload on their own hardware; the curves are the simulator's on this page's "
               "workload and step model — compare shapes, or fit a step model to a run before comparing values.")

caps = {label: r["capacity"] for label, r in results.items()}
if slo.given():
    st.markdown(" · ".join(
        f"**{md(label)}**: capacity " + (f"{c[key]:g} {'req/s' if key == 'rate' else 'clients'} "
                                         f"(attainment {c['attainment']:.3f})" if c else
                                         f"none — no swept load reaches attainment {att:g}")
        for label, c in caps.items()))

rows = []
for label, r in results.items():
    for p in r["points"]:
        rows.append({"policy": label, key: p[key], "offered req/s": p["offered_req_per_s"],
                     "done req/s": p["achieved_req_per_s"], "output tok/s": p["output_tok_per_s"],
                     "TTFT p50 ms": p["ttft_ms"]["p50"], "TTFT p99 ms": p["ttft_ms"]["p99"],
                     "TPOT p99 ms": p["tpot_ms"]["p99"], "E2E p99 ms": p["e2e_ms"]["p99"], "failed": p["failed"],
                     **({"SLO met": p["slo"]["attainment"], "goodput req/s": p["slo"]["goodput_req_per_s"],
                         "goodput tok/s": p["slo"]["goodput_tok_per_s"]} if "slo" in p else {})})
table = pd.DataFrame(rows)
with st.expander("Every point (simulated; latencies in ms)"):
    show_table(table, hide_index=True, key="ld_table")

st.subheader("One point: Little's law and utilisation")
c1, c2 = st.columns(2)
pol = c1.selectbox("Policy", list(results), **bound("ld_pt"))
pts = results[pol]["points"]
choice = c2.selectbox(f"{'Rate (req/s)' if key == 'rate' else 'Clients'}", [p[key] for p in pts],
                      index=len(pts) // 2, **bound("ld_px"))
p = next(q for q in pts if q[key] == choice)
ll, u = p["littles_law"], p["utilisation"]
m = st.columns(2)      # (two a row: "1,137 / 2,000" fits beside the sidebar at 1024 px)
m[0].metric("L: mean requests in system", fmt_ms(ll["L"]), help="time-average of requests between arrival and "
            "last token over the drain window")
m[1].metric("λ·W", fmt_ms(ll["lambda_W"]), help=f"λ = {fmt_ms(ll['arrival_rate_per_s'])} req/s, "
            f"W = mean E2E {fmt_ms(ll['W_ms'])} ms; equal to L over the drain window of a finished workload")
if u is not None:
    m = st.columns(2)
    m[0].metric("Running sequences: mean / peak", f"{u['running_mean']:,.1f} / {u['running_peak']}")
    pool = f" of a pool of {u['kv_blocks']:,}" if "kv_blocks" in u else ""
    m[1].metric("KV blocks: mean / peak", f"{u['kv_used_blocks_mean']:,.0f} / {u['kv_used_blocks_peak']:,}",
                help=f"blocks in use over the drain window: mean {fmt_ms(u['kv_used_blocks_mean'])}, peak "
                     f"{u['kv_used_blocks_peak']:,}{pool}")
st.caption("Open loop: arrivals do not wait for the server, so past capacity the queue, TTFT and E2E grow "
           "without bound while throughput flattens. Closed loop: at most N requests are in the system, so "
           "latency stays bounded and throughput saturates; a burst of N requests is the start of a closed "
           "loop, not an arrival process. Compare sweeps of the same kind.")

st.subheader("Capacity search: the cheapest configuration that meets the SLOs")
st.caption("Every combination of the values below, on this page's workload arriving as one Poisson process at the "
           "load given (arrival seed above), under the SLOs and attainment of the sidebar; each point's goodput "
           "and cost per 1,000 good tokens, and the cheapest configuration that meets the SLOs "
           "(core/experiments/search.py; `python -m core search` runs the same from the command line). A configuration "
           "whose first quarter of requests already misses the SLOs too often is stopped early.")
s1, s2, s3 = st.columns(3)
s_rate = s1.number_input("Offered load (req/s)", 0.1, 100_000.0, 20.0, **bound("ld_s_rate"))
s_pol = s2.selectbox("Policy", list(POLICY_LABELS), index=list(POLICY_LABELS).index("chunked"), **bound("ld_s_pol"))
usd = s3.number_input("USD per hour (0 = no price)", 0.0, 1e6, 4.0, **bound("ld_s_usd"))
g1, g2, g3 = st.columns(3)
g_ms = g1.text_input("max running sequences", "8,16,32,64", **bound("ld_s_ms"))
g_tb = g2.text_input("token budgets per step", "2048,8192", **bound("ld_s_tb"))
g_kb = g3.text_input("KV blocks (none = enough)", "none", **bound("ld_s_kb"))
found = None
try:
    if not slo.given():
        raise InputError("the search needs at least one SLO bound (sidebar)")
    grid = parse_grid([f"max_seqs={g_ms}", f"token_budget={g_tb}", f"kv_blocks={g_kb}"])
    base_cfg = policy_config(s_pol, SchedulerConfig(block_size=config.block_size), int(chunk))
    work = check_work(workload, grid, SEARCH_MAX_TOKENS, " on this page")
except InputError as e:
    st.error(f"Capacity search: {md(e)}")
else:
    args = (workload, base_cfg, step_model, grid, float(s_rate), slo, float(att), int(seed), float(usd) or None)
    signature = search_signature(*args)
    n_configs = math.prod(len(v) for v in grid.values())
    # a link restores the inputs, never the run: the search starts on this click only, one at a time per session
    st.button(f"Run the search ({n_configs:,} configurations)", key="ld_s_go", type="primary",
              on_click=lambda: st.session_state.update(ld_search_asked=signature),
              help=f"{work / 1e6:,.1f} M simulated tokens (at most {SEARCH_MAX_TOKENS / 1e6:,.0f} M here); no "
                   f"configuration is started after {SEARCH_BUDGET_S:g} s")
    if st.session_state.pop("ld_search_asked", None) == signature:
        lock = st.session_state.setdefault("ld_search_lock", threading.Lock())
        if not lock.acquire(blocking=False):
            st.warning("A search of this session is still running; its result shows here when it ends (one search "
                       "at a time per session).")
        else:
            try:
                st.session_state["ld_search_done"] = (signature, cached_search(*args))
            except InputError as e:
                st.error(f"Capacity search: {md(e)}")
            finally:
                lock.release()
    done = st.session_state.get("ld_search_done")
    if done is not None and done[0] == signature:
        found = done[1]
    elif done is not None:
        st.info("The inputs changed since the last search: press the button to search these.")
if found is not None:
    show_chart(search_figure(found["points"], priced=bool(usd), best=found["best"]), key="ld_search")
    b = found["best"]
    if b is None:
        st.warning(f"No configuration reaches SLO attainment {att:g} at {s_rate:g} req/s.")
    else:
        cfg = b["config"]
        price = b["cost_per_1k_good_tokens_usd"]
        st.success(f"{'Cheapest' if usd else 'Most goodput'} meeting the SLOs: **{md(describe(cfg))}** — SLO met "
                   f"{b['slo']['attainment']:.3f}, goodput {b['slo']['goodput_tok_per_s']:,.1f} tok/s"
                   + (f", USD {price:.4g} per 1,000 good tokens" if price else "") + ".")
        st.button("Open this configuration on the Schedules page", key="ld_s_open", on_click=open_in_schedules,
                  args=(searched_workload(workload, float(s_rate), int(seed)),
                        schedules_link(cfg, s_pol, int(chunk), config.block_size, step_model, float(usd) or None)),
                  help="the searched workload (these requests at this load and seed), with its policy, limits, "
                       "chunk and step model")
    st.caption(f":orange-badge[simulated] {found['simulated']} configurations simulated in full, "
               f"{found['pruned']} stopped early, {sum('invalid' in p for p in found['points'])} invalid"
               + (f", {found['not_run']} not simulated (the {SEARCH_BUDGET_S:g} s budget was spent)"
                  if found.get("not_run") else "") + " — each listed with the reason.")
    shown, exported, reasons = search_table(found)
    with st.expander("Every configuration"):
        show_table(pd.DataFrame(shown), hide_index=True, key="ld_search_table", export=pd.DataFrame(exported),
                   column_config={"configuration": st.column_config.TextColumn(width="medium"),
                                  "note": st.column_config.TextColumn(width="large")})
        for k, why in enumerate(reasons, 1):
            st.markdown(f"Invalid, reason {k}: {md(why)}")

st.subheader("Exercise 6: a hard TTFT bound is a gate")
ex = exercise6_preset()
rows6 = cached_exercise6()
st.markdown(
    f":orange-badge[simulated] {len(ex.workload)} requests: {md(ex.workload.name)}; step model "
    f"{md(ex.step_model.describe())}. Contract: TTFT ≤ {ex.slo.ttft_ms:g} ms for every request; throughput "
    f"counted in the fixed window [{ex.window_ms[0]:g}, {ex.window_ms[1]:g}] ms.")
show_table(pd.DataFrame([{
    "schedule": r["schedule"], "tokens in window": r["window_tokens"], "tok/s in window": r["window_tok_per_s"],
    "TTFT median ms": r["ttft_median_ms"], "TTFT max ms": r["ttft_max_ms"],
    f"requests over {ex.slo.ttft_ms:g} ms": r["over_bound"],
    "contract": "holds" if r["contract_holds"] else "FAILED"} for r in rows6]), hide_index=True, key="ld_ex6",
    column_config={"tok/s in window": st.column_config.NumberColumn(format="%.1f"),
                   "TTFT max ms": st.column_config.NumberColumn(format="%.1f")})
better = max(rows6, key=lambda r: r["window_tok_per_s"])
other = min(rows6, key=lambda r: r["window_tok_per_s"])
if not better["contract_holds"] and other["contract_holds"]:
    st.markdown(
        f"**{md(better['schedule'])}** emits {better['window_tokens']} tokens in the window against "
        f"{other['window_tokens']} ({better['window_tok_per_s'] / other['window_tok_per_s']:.1f}× the throughput), "
        f"but {better['over_bound']} of {better['requests']} requests get their first token after "
        f"{ex.slo.ttft_ms:g} ms (worst {better['ttft_max_ms']:.0f} ms). Under a contract with a hard TTFT bound "
        f"it has **not** improved: report the throughput gain and the violated bound, then look for another "
        f"schedule or change the contract explicitly — the extra tokens do not buy off the gate.")
