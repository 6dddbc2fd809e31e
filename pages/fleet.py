"""Fleet: several replicas behind a router, simulated on one clock (core.fleet): where each request
went and why, each replica's load, its prefix-cache hits, the routing policies side by side, and two
experiments (router staleness; the prefill:decode split)."""
from pathlib import Path

import pandas as pd
import streamlit as st

from core.analysis.metrics import SLO
from core.analysis.routing import drains_of, fleet_description, routes_after
from core.config import SchedulerConfig
from core.errors import InputError
from core.experiments.fleet import STALENESS_MS, STALENESS_POLICIES, FleetSetup
from core.figures.fleet import pd_split_figure, policy_figure, staleness_figure
from core.figures.timeline import MAX_LANES
from core.fleet.router import GLOSSARY, POLICIES, POLICY_WORDS
from core.formulas.kv import MODELS
from ui import (
    UPLOAD_LIMIT_MB,
    bound,
    cached_scenario,
    choice_param,
    ensure_app_frame,
    fmt_ms,
    linked_fragment,
    md,
    origin_badge,
    scheduler_inputs,
    show_chart,
    show_table,
    step_model_controls,
    theme,
    uploaded_workload,
)
from ui.fleet import (
    cached_fleet,
    cached_lesson,
    cached_measured,
    cached_pd_rows,
    cached_policy_rows,
    cached_staleness_rows,
    cached_workload_file,
    fleet_prediction_panel,
    fleet_view,
    prefetch_lesson,
    uploaded_fleet,
)

ensure_app_frame()

# label -> (bundled file, Mooncake tokens per hash block) or the name of a built-in scenario; None: upload
FLEET_WORKLOADS = {"Shared prefix 200": ("shared_prefix_200.json", None),
                   "Mooncake conversation 500 (block_tokens 16)": ("mooncake_conversation_500.jsonl", 16),
                   "Burst 5": ("burst5.json", None), "Poisson 500 (Vidur CSV)": ("poisson500_vidur.csv", None),
                   "Poisson 2000": "poisson2000", "Poisson 10000": "poisson10000", "Upload": None}
MAX_REPLICAS = 16
AUTO_WORK = 5_000    # a comparison runs by itself when its runs simulate at most this many requests in all
AFFINE = {"base_ms": 5.0, "prefill_ms_per_token": 0.05, "decode_ms_per_seq": 0.2}

st.title("Fleet")
st.caption("Several replicas of one engine behind a router, simulated on one clock (core/fleet): where each request "
           "went and why, what each replica held over time, its prefix-cache hits, and every routing policy on the "
           "same workload.")
with st.expander(":material/school: Router, policies, staleness, P:D split: in words"):
    st.markdown("\n".join(f"- **{md(k)}**: {md(v)}" for k, v in GLOSSARY.items()))
    st.markdown("**The policies** (the sidebar's *Router policy*):\n"
                + "\n".join(f"- **{md(p)}** {md(w)}" for p, w in POLICY_WORDS.items()))
    st.caption("The exact rules, with their parameters and ties: core/fleet/router.py; the measurements behind "
               "them: docs/fleet.md.")

with st.sidebar:
    st.subheader("Workload")
    wl_label = st.selectbox("Workload", list(FLEET_WORKLOADS), **bound("fl_wl"))
    load = st.slider("Load multiplier", 0.25, 20.0, 4.0, 0.25, **bound("fl_load"),
                     help="arrivals compressed by this factor: ×4 = the same requests arriving four times as fast")
    st.subheader("Fleet")
    disagg = st.toggle("Disaggregated prefill/decode", False, **bound("fl_dis"),
                       help="prompts computed on prefill replicas, their KV cache moved over a link to a decode "
                            "replica, which emits every token")
    if disagg:
        c1, c2 = st.columns(2)
        n_p = c1.number_input("Prefill replicas", 1, MAX_REPLICAS - 1, 1, **bound("fl_p"))
        n_d = c2.number_input("Decode replicas", 1, MAX_REPLICAS - 1, 3, **bound("fl_d"))
        n = 0
    else:
        n = st.slider("Replicas", 1, MAX_REPLICAS, 4, **bound("fl_n"))
        n_p = n_d = 0
    policy = st.selectbox("Router policy", list(POLICIES), index=POLICIES.index("prefix-aware"), **bound("fl_pol"),
                          help="\n\n".join(f"**{p}** {w}" for p, w in POLICY_WORDS.items()))
    load_check = True
    if policy == "prefix-aware":
        load_check = st.toggle("Load check", True, **bound("fl_bal"),
                               help="prefix-aware sends a request where most of its prompt is cached unless that "
                                    "replica holds over balance_abs (4) requests more than the least loaded and "
                                    "balance_rel (1.5) times as many; off, it follows the cache whatever the load "
                                    "(balance_abs 10^9, as the routing lesson's second scenario)")
    stale = st.number_input("Router staleness (ms)", 0.0, 1e6, 0.0, **bound("fl_stale"),
                            help="the router sees each replica's load (and, for weighted, its cache) as of this long "
                                 "ago")
    opts = scheduler_inputs({"prefix_caching": ("fl_pc", True), "kv_blocks": ("fl_kb", 0)})
    link = {}
    if disagg:
        st.subheader("KV link")
        c1, c2 = st.columns(2)
        link = dict(link_gbps=c1.number_input("GB/s", 0.001, 1e5, 25.0, **bound("fl_gbps")),
                    link_latency_ms=c2.number_input("latency ms", 0.0, 1e4, 0.05, format="%.3f", **bound("fl_lat")),
                    pd_min_prompt=int(st.number_input("Prompts under this many tokens run whole", 0, 10_000_000, 0,
                                                      **bound("fl_min"))),
                    model=st.selectbox("KV bytes per token of", list(MODELS), index=list(MODELS).index("Llama-2-7B"),
                                       **bound("fl_model")))
    st.subheader("Drain")
    drain_on = st.toggle("Take a replica out of rotation", False, **bound("fl_drain"))
    drain = {}
    if drain_on:
        c1, c2 = st.columns(2)
        drain = dict(drain_replica=int(c1.number_input("replica", 0, MAX_REPLICAS - 1, 1, **bound("fl_dr"))),
                     drain_ms=c2.number_input("at ms", 0.0, 1e12, 1000.0, **bound("fl_dt")))
    st.subheader("Step model (affine, each replica)")
    step_model = step_model_controls("fl_", kinds=["affine"], defaults=AFFINE)

spec = FLEET_WORKLOADS[wl_label]
if spec is None:
    workload = uploaded_workload("fl", "our JSON, Vidur CSV, LLMServingSim JSONL, Mooncake JSONL, or a trace",
                                 "Upload a workload file to serve it with the fleet.")
else:
    workload = cached_scenario(spec) if isinstance(spec, str) else cached_workload_file(*spec)

try:
    if n_p + n_d > MAX_REPLICAS:
        raise InputError(f"prefill + decode replicas: {n_p} + {n_d} is over this page's {MAX_REPLICAS}")
    setup = FleetSetup(SchedulerConfig(**opts), step_model, replicas=n or 1, policy=policy, staleness_ms=stale,
                       load_check=load_check,
                       prefill=int(n_p), decode=int(n_d), **link, **drain)
    simulated, tr = cached_fleet(workload, float(load), setup)
except InputError as e:
    st.error(f"Fleet settings: {md(e)}")
    st.stop()

HIT_RATE_WORDS = ("Prefix hit rate = hit blocks on each request's first admission / full prompt blocks routed (a "
                  "disaggregated request's at its prefill and its decode replica); hits of a request re-admitted "
                  "after a preemption are left out, since counting them would reward preemption")


def hit_rate_help(nums: dict) -> str:
    if nums["hit_rate"] is None:
        return HIT_RATE_WORDS + ". This run does not say enough to give it."
    again = (nums["hit_blocks_all"] or 0) - nums["hit_blocks"]
    return (f"{nums['hit_blocks']:,} hit blocks on first admission of {nums['prompt_blocks']:,} full prompt blocks "
            f"routed" + (f" ({again:,} more hit blocks after preemptions are left out)" if again else "") + ". "
            + HIT_RATE_WORDS + ".")


nums = fleet_view("numbers", tr)
SIMULATED = f"{origin_badge(tr)} step model {md(step_model.describe())}"    # what every comparison below is
st.markdown(f"{origin_badge(tr)} {len(simulated):,} requests of *{md(workload.name)}*"
            + (f", arrivals ×{load:g} as fast" if load != 1 else "") + f"; {md(setup.describe())}; step model "
            f"{md(step_model.describe())}.")
# (a row that wraps: each number at its own width, none cut short beside the sidebar at 1024 px)
row = st.container(horizontal=True, wrap=True, gap="large")
m = [row] * 5
m[0].metric("TTFT p50 ms", fmt_ms(nums["ttft_p50_ms"]), width="content")
m[1].metric("TTFT p99 ms", fmt_ms(nums["ttft_p99_ms"]), width="content")
m[2].metric("prefix hit rate", "—" if nums["hit_rate"] is None else f"{nums['hit_rate']:.1%}",
            help=hit_rate_help(nums), width="content")
m[3].metric("imbalance", "—" if nums["imbalance"] is None else f"{nums['imbalance']:.2f}",
            help="max / mean requests per replica (prefill and decode replicas apart): 1 = even. Requests per "
                 "replica: " + ", ".join(f"r{k} {c}" for k, c in enumerate(nums["per_replica"])), width="content")
m[4].metric("rejected", f"{nums['rejected']:,}", help="requests the router rejected (no replica took them)",
            width="content")
st.caption("All simulated (core/fleet). Percentiles: numpy 'linear' estimator.")

st.subheader("Where each request went")
show_chart(fleet_view("lanes", tr), key="fl_lanes_fig", width="stretch")
if len(tr.requests) > MAX_LANES:
    st.caption(f"Over {MAX_LANES} requests, too many for a lane each: each replica's running requests over time (bin "
               "averages; the hover adds its waiting ones and the requests routed to it in the bin).")
else:
    st.caption("Each lane a request, grouped by replica; ▶ when the router sent it there — hover for the router's "
               "reason, its scores and what it saw of each replica. "
               + ("Yellow: prefill on the prefill replica; reddish purple: the KV transfer; blue: decode on the decode "
                  "replica (green: a short prompt run whole there); gray: waiting." if setup.disaggregated else
                  "Gray: waiting; colour: served on that replica."))
for r, t in drains_of(tr):
    st.caption(f":material/block: Replica {r} left rotation at {t:g} ms (dashed line): the router sent it "
               f"**{routes_after(tr, r, t)}** requests after that; it finished what it held.")

st.subheader("Each replica over time")
show_chart(fleet_view("signals", tr), key="fl_signals_fig", width="stretch")
left, right = st.columns(2)
show_chart(fleet_view("hits", tr), key="fl_hits_fig", where=left, width="stretch")
if tr.events_of("transfer"):
    show_chart(fleet_view("transfers", tr), key="fl_transfers_fig", where=right, width="stretch")
else:
    right.caption("Prefix-cache hits: blocks of a prompt a replica found already cached (its kv rows with op "
                  "`hit`). Requests that share a prompt's beginning hit only where an earlier one went: a "
                  "prefix-aware router sends them there, round-robin spreads them.")


def runs_allowed(runs: int, key: str, what: str) -> bool:
    """A comparison runs by itself when it is small; else on its switch (the page's first draw stays quick)."""
    work = runs * len(simulated)
    if work <= AUTO_WORK:
        return True
    if st.toggle(f"Run {what} ({runs} simulations of {len(simulated):,} requests)", False, key=key):
        return True
    st.caption(f"{runs} runs of {len(simulated):,} requests: switched off by default at this size.")
    return False


def policies_view():
    st.caption(f"{SIMULATED}. Every policy on the same workload and fleet ({md(setup.describe())}), only the "
               "policy changed.")
    if not runs_allowed(len(POLICIES), "fl_run_policies", "every policy"):
        return
    rows = cached_policy_rows(workload, float(load), setup)
    show_chart(policy_figure(rows, policy), key="fl_policies_fig", width="stretch")
    table = pd.DataFrame([{"policy": r["policy"], "TTFT p50 ms": r["ttft_p50_ms"], "TTFT p99 ms": r["ttft_p99_ms"],
                           "prefix hit rate %": None if r["hit_rate"] is None else round(100 * r["hit_rate"], 1),
                           "imbalance": r["imbalance"],
                           "requests per replica": " ".join(map(str, r["per_replica"])), "rejected": r["rejected"]}
                          for r in rows])
    show_table(table, hide_index=True, key="fl_policy_table")
    st.caption(f"Latencies in ms. {HIT_RATE_WORDS}; imbalance = max / mean requests per replica. The sidebar's "
               "policy is outlined in orange and named in bold in every panel.")


@linked_fragment
def staleness_experiment():
    st.markdown("The router reads each replica's load as of *staleness* ms ago. "
                "Load-based policies then send bursts to a replica that already got them; round-robin never looks.")
    c1, _ = st.columns(2)
    upto = c1.select_slider("Staleness grid up to (ms)", [s for s in STALENESS_MS if s > 0], 200, **bound("fl_s_max"))
    pols = st.pills("Policies", list(POLICIES), selection_mode="multi", default=list(STALENESS_POLICIES),
                    **bound("fl_s_pol"))   # (full width)
    grid = tuple(s for s in STALENESS_MS if s <= upto)
    if not pols:
        st.info("Pick at least one policy.")
        return
    if not runs_allowed(len(grid) * len(pols), "fl_run_stale", "the staleness grid"):
        return
    rows = cached_staleness_rows(workload, float(load), setup, grid, tuple(pols))
    show_chart(staleness_figure(rows, policy), key="fl_stale_fig", width="stretch")
    st.caption(f"{SIMULATED}. The sidebar's fleet ({md(setup.describe())}) with only the policy and the staleness "
               "changed; the sidebar's policy is the thick line"
               + ("." if policy in pols else f" (**{md(policy)}** is not among those picked above)."))


@linked_fragment
def pd_experiment():
    st.markdown("How to split a fleet: the same number of replicas split into prefill and decode "
                "ones every way, and as whole replicas; goodput counts the requests per second that met both SLOs.")
    c1, c2, c3 = st.columns(3)
    total = c1.slider("Total replicas", 2, 8, 4, **bound("fl_t"))
    ttft = c2.slider("SLO: TTFT ≤ ms", 10, 2000, 200, 10, **bound("fl_ttft"))
    tpot = c3.slider("SLO: TPOT ≤ ms", 1, 200, 20, 1, **bound("fl_tpot"))
    if not runs_allowed(total, "fl_run_pd", "every split"):
        return
    try:
        rows = cached_pd_rows(workload, float(load), setup, int(total), SLO(float(ttft), float(tpot)))
    except InputError as e:
        st.error(f"P:D experiment: {md(e)}")
        return
    show_chart(pd_split_figure(rows), key="fl_pd_fig", width="stretch")
    show_table(pd.DataFrame([{"split": r["split"], "goodput req/s": r["goodput_req_per_s"], "SLO met": r["attainment"],
                              "TTFT p99 ms": r["ttft_p99_ms"], "TPOT p99 ms": r["tpot_p99_ms"]} for r in rows]),
               hide_index=True, key="fl_pd_table")
    model = setup.model
    st.caption(f"{SIMULATED}. KV over a {setup.link_gbps:g} GB/s link ({md(model)}), router {md(setup.policy)}, "
               "goodput over the drain window (core/analysis/metrics.py). A disaggregated request's first token "
               "comes from its decode replica (vLLM's convention), after the prefill and the transfer.")


def animation_view():
    st.caption(f"{SIMULATED}. This run played back in the browser: each request leaves the router for the "
               "replica it was routed to, stays while it runs and leaves when it finishes"
               + ("; with disaggregated serving it moves from its prefill replica to its decode replica while its "
                  "KV cache crosses the link" if setup.disaggregated else "")
               + ". Past a few hundred requests each replica shows how many it holds instead.")
    show_chart(fleet_view("animation", tr, theme()), key="fl_anim_fig", width="stretch")


def lesson_view():
    from core.lessons.fleet import DEFINITIONS
    st.caption("Why prefix-aware routing wins on shared prefixes and loses when its signals are stale or its "
               "load check is off, and why replicas are drained before they stop. Every number below comes from "
               "the runs it describes (core/lessons/fleet.py), not from this page's settings.")
    for sec in cached_lesson():
        st.markdown(f"#### {md(sec['title'])}")
        st.markdown(f"*{md(sec['question'])}*")
        st.markdown(sec["text"])
        st.caption(md(sec["origin"]))
        if sec["rows"]:
            table = pd.DataFrame(sec["rows"])
            show_table(table, hide_index=True, key=f"fl_lesson_{sec['key']}",
                       column_config={c: st.column_config.Column(help=DEFINITIONS[c])
                                      for c in table.columns if c in DEFINITIONS})


def tiers_view():
    from core.lessons import kv_tiers as tiers
    st.caption(f"{tiers.FLEET_REPLICAS} replicas, each with a GPU pool of {tiers.FLEET_GPU_BLOCKS} blocks (one "
               f"{tiers.PREFIX_TOKENS:,}-token prefix at a time) and a CPU tier of {tiers.CPU_BLOCKS:,} blocks under "
               "its prefix cache (vLLM's offloading rules, docs/kv-tiers.md), serve the KV page's lesson workload "
               f"({len(tiers.workload())} requests over {tiers.PREFIXES} long prefixes). Both routers hear the "
               "replicas' own cache news (precise). prefix-aware sees only the GPU prefix caches: once a prefix has "
               "left its replica's GPU, no replica looks better than another and the request goes to the least "
               "loaded, where the whole prefix is computed again. tier-aware also hears each CPU tier (as llm-d's "
               "index by tier): a prefix held there counts half a GPU block a block, so the request goes back to "
               "the replica that can load it. These runs do not follow this page's settings.")
    with st.spinner("Simulating the fleet with each router..."):
        cmp = tiers.fleet_compare()
    rows = [{"router": pol, "mean TTFT (ms)": round(v["ttft_mean_ms"], 2), "p90 TTFT (ms)": round(v["ttft_p90_ms"], 2),
             "prefill tokens computed": v["prefill_tokens"], "GPU hit rate": f"{v['gpu_hit_rate']:.1%}",
             "CPU hit rate": f"{v['cpu_hit_rate']:.1%}"} for pol, v in cmp.items()]
    show_table(pd.DataFrame(rows), hide_index=True, key="fl_tiers_cmp")
    per = [{"router": pol, "replica": r["replica"], "GPU hit tokens": r["gpu_hit_tokens"],
            "CPU hit tokens": r["cpu_hit_tokens"]} for pol, v in cmp.items() for r in v["per_replica"]]
    st.markdown("**Hits by tier, per replica** (first admissions; core.analysis.kv_tiers)")
    show_table(pd.DataFrame(per), hide_index=True, key="fl_tiers_per")
    st.caption(f"{origin_badge(tiers.fleet_run('tier-aware'))} {md(tiers.step_model().describe())}")


def measured_files() -> dict:
    """label -> path of the bundled measured fleet traces: gpu_runner fleet runs (data/traces/fleet_*),
    our replicas behind sglang-router, merged (data/imports/sglang_router/*/fleet.json.gz), and two
    vLLM servers behind it, merged from their own files (data/imports/vllm_fleet/fleet.json.gz)."""
    from core.lessons.scenarios import DATA
    out = {f"gpu_runner fleet: {p.name.removeprefix('fleet_').split('.')[0].replace('_', ' ')}": str(p)
           for p in sorted((DATA / "traces").glob("fleet_*.json.gz"))}
    out |= {f"sglang-router in front of serve replicas: {p.parent.name.replace('_', ' ')}": str(p)
            for p in sorted((DATA / "imports" / "sglang_router").glob("*/fleet.json.gz"))}
    out |= {f"gpu_runner fleet, repeated: {p.name.split('.')[0].replace('_', ' ')}": str(p)
            for p in sorted((DATA / "imports" / "fleet_repeats").glob("*_r*.json.gz"))}
    vllm = DATA / "imports" / "vllm_fleet" / "fleet.json.gz"
    if vllm.exists():
        out["vLLM 0.32 CPU x2 behind sglang-router (cache_aware), its servers' own files"] = str(vllm)
    return out


UPLOAD_FLEET = "Upload a fleet trace…"


def _measured_choice(files: dict):
    """(trace, bundled path or None, upload or None) of the tab's choice; None where nothing to show."""
    names = [Path(p).name for p in files.values()]      # a link names a file by its name (its folder's too
    short = {label: Path(p).name if names.count(Path(p).name) == 1 else f"{Path(p).parent.name}/{Path(p).name}"
             for label, p in files.items()}             # where two bundled files share a name)
    choice_param("fl_measured", short | {UPLOAD_FLEET: "upload"}, "measured fleet")
    label = st.selectbox("Measured fleet", [*files, UPLOAD_FLEET], **bound("fl_measured"))
    if label != UPLOAD_FLEET:
        return cached_measured(files[label]), files[label], None
    up = st.file_uploader(f"A fleet trace (serving-trace/1 .json, .json.gz, .parquet: `gpu_runner fleet "
                          f"--trace-out`, `python -m core fleet-merge`, a simulated fleet), up to {UPLOAD_LIMIT_MB} MB",
                          type=["json", "gz", "parquet"], key="fl_meas_upload")
    if up is None:
        st.info("Upload a fleet trace to see it here, beside the fleet simulator's prediction of it.")
        return None, None, None
    tr, why = uploaded_fleet(up)
    if why:
        st.error(why)
        return None, None, None
    return tr, None, up


def measured_view():
    files = measured_files()
    st.markdown("Fleets that really ran on this project's 2-core VM (the bundled tiny model): `python -m gpu_runner "
                "fleet` (engine processes behind this router, disaggregated prefill/decode with the KV moved), or "
                "`gpu_runner serve` replicas behind sglang-router, their own traces merged by `python -m core "
                "fleet-merge` (data/traces/README.md and data/imports/sglang_router/SOURCE.md say how each was "
                "made). Upload your own fleet's trace below; any other trace opens on the Replay page.")
    tr, path, up = _measured_choice(files)
    if tr is None:
        return
    st.markdown(f"{origin_badge(tr)} {md(fleet_description(tr))}")
    show_chart(fleet_view("lanes", tr), key="fl_meas_lanes", width="stretch")
    show_chart(fleet_view("signals", tr), key="fl_meas_signals", width="stretch")
    show_chart(fleet_view("hits", tr), key="fl_meas_hits", width="stretch")
    if tr.events_of("transfer"):
        show_chart(fleet_view("transfers", tr), key="fl_meas_transfers", width="stretch")
    fleet_prediction_panel(tr, path, "fl_meas")


# Each tab runs only while it is open (the experiments simulate many runs each). Short labels: all seven
# fit beside the sidebar at 1024 px; a link may still name a tab by its earlier, longer label.
TABS = {"Policies": "Router policies side by side", "Stale router": "Experiment: a stale router",
        "P:D split": "Experiment: the P:D split", "Animation": "Animation",
        "Lesson": "Lesson: how routing wins and loses", "Tiers": "Experiment: CPU tiers per replica",
        "Measured": "Measured fleets"}
if "fl_measured" in st.query_params and "fl_tab" not in st.query_params:
    st.query_params["fl_tab"] = st.session_state["fl_tab"] = TABS["Measured"]   # (a link to one opens its tab)
choice_param("fl_tab", TABS, "tab")
tabs = st.tabs(list(TABS), **bound("fl_tab"))
for tab, title, view in zip(tabs, TABS.values(), (policies_view, staleness_experiment, pd_experiment, animation_view,
                                                   lesson_view, tiers_view, measured_view)):
    with tab:
        if tab.open:
            st.markdown(f"##### {title}")
            view()
prefetch_lesson()   # (after the page is drawn: the lesson's runs, for its tab)
