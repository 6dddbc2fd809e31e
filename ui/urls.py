"""Shareable views: every widget bound to the URL (`bind="query-params"`) takes its key from
`bound(key)`, which accepts only keys declared in URL_KEYS. A key that sets an option names
it ("SchedulerConfig.max_seqs", "StepModel.step_ms"), so a scenario preset, which states
option values, reaches the widgets through this one table. Also: the link box, links with
over-long or unknown values (dropped with a notice), presets applied when their selector changes."""
from dataclasses import dataclass

import streamlit as st

from core.lessons.scenarios import (
    SchedulePreset,
)
from ui.fmt import md


@dataclass(frozen=True, slots=True)
class UrlKey:
    page: str                   # url_path of the page with the widget ("" = home, "*" = every page)
    meaning: str
    option: str = ""            # the option it sets: "SchedulerConfig.<field>", "StepModel.<field>", "policies"
    zero_is_none: bool = False  # the widget's 0 stands for the option's None ("no limit")


def _keys(page: str, **keys) -> dict[str, UrlKey]:
    return {k: UrlKey(page, *v) if isinstance(v, tuple) else UrlKey(page, v) for k, v in keys.items()}


URL_KEYS: dict[str, UrlKey] = {
    **_keys("*", present="presentation mode: projector-sized fonts in figures, sidebar collapsed on opening"),
    **_keys("schedules",
            sc="scenario (a label of SCENARIO_LABELS)",
            pol=("policies to simulate (core.lessons.schedules.POLICY_LABELS)", "policies"),
            ms=("running sequences at most, 0 = no limit", "SchedulerConfig.max_seqs", True),
            tb=("tokens per step at most, 0 = no limit", "SchedulerConfig.token_budget", True),
            ch=("chunk size of the 'chunked' policy (prompt tokens per request per step)", "SchedulerConfig.chunk"),
            kb=("KV pool in blocks, 0 = enough for all", "SchedulerConfig.kv_blocks", True),
            bs=("tokens per KV block", "SchedulerConfig.block_size"),
            s_kind=("step-time model", "StepModel.kind"),
            s_step=("constant model: ms per step", "StepModel.step_ms"),
            s_base=("affine/roofline model: base ms per step", "StepModel.base_ms"),
            s_pp=("affine model: ms per prefill token", "StepModel.prefill_ms_per_token"),
            s_pd=("affine model: ms per decoding sequence", "StepModel.decode_ms_per_seq"),
            s_ppk=("features model: ms per 1,000 attended prefill positions", "StepModel.prefill_ms_per_kpos"),
            s_pdk=("features model: ms per 1,000 attended decode positions", "StepModel.decode_ms_per_kpos"),
            s_pch=("features model: ms per prefill piece", "StepModel.prefill_ms_per_chunk"),
            s_model=("roofline model: model preset", "StepModel.model"),
            s_gpu=("roofline model: GPU preset", "StepModel.gpu"),
            usd="tariff, USD per hour",
            sched_pick="the schedule whose requests the per-request table lists",
            sched_from="who wins and who loses: the schedule compared from",
            sched_to="who wins and who loses: the schedule compared to",
            w0="fixed throughput window start, ms",
            w1="fixed throughput window end, ms (0 = latest emission)"),
    **_keys("kv",
            kv_model="calculator: model preset or Custom", kv_dtype="calculator: KV dtype",
            kv_gpu="calculator: GPU preset", kv_layers="calculator: layers (Custom)",
            kv_heads="calculator: KV heads (Custom)", kv_hd="calculator: head dim (Custom)",
            kv_tokens="calculator: tokens per sequence", kv_seqs="calculator: sequences",
            pg_wl="paging: workload",
            pg_bs=("paging: tokens per KV block", "SchedulerConfig.block_size"),
            pg_pool=("paging: KV pool in blocks", "SchedulerConfig.kv_blocks"),
            pg_ms=("paging: running sequences at most", "SchedulerConfig.max_seqs"),
            pg_pc=("paging: prefix caching", "SchedulerConfig.prefix_caching"),
            pg_salt="paging: a cache salt per tenant",
            pg_cursor="paging: the time cursor (snapshot index)",
            px_a="prefix identity: cached request's token ids", px_b="prefix identity: new request's token ids",
            fk_prompt="fork demo: prompt tokens", fk_samples="fork demo: samples", fk_bs="fork demo: block size",
            kt_model="CPU tier lesson: model preset (its KV bytes and the roofline step model)",
            kt_gbps=("CPU tier lesson: host link GB/s", "SchedulerConfig.host_gbps"),
            kt_cpu=("CPU tier lesson: CPU tier in blocks", "SchedulerConfig.cpu_kv_blocks"),
            kt_pool=("CPU tier lesson: GPU pool in blocks", "SchedulerConfig.kv_blocks"),
            kt_pol=("CPU tier lesson: CPU tier eviction", "SchedulerConfig.cpu_kv_policy")),
    **_keys("tiles",
            at_preset="example: chapter or random", at_tile="chapter example: tile size (keys)",
            at_n="random example: keys", at_tile_r="random example: tile size (keys)",
            at_seed="random example: seed", at_scale="random example: logit scale",
            at_upto="tiles visited so far",
            at_T="tile grid: sequence length", at_bq="tile grid: query tile", at_bk="tile grid: key tile",
            at_causal="causal mask", at_hd="HBM traffic: head dim", at_dt="HBM traffic: bytes per element",
            at_bq2="HBM traffic: query tile"),
    **_keys("speculative",
            sp_preset="p/q preset", sp_draws="Monte Carlo draws", sp_seed="Monte Carlo seed",
            sp_gamma="draft tokens γ", sp_verify="verify cost in decode steps",
            sp_alpha="acceptance rate α of the tokens-per-verification charts (default: the table's)"),
    **_keys("roofline",
            rf_gpu="GPU preset", rf_model="model preset", rf_dtype="bytes per weight",
            rf_batch="decode batch (sequences)", rf_prompt="prefill length (tokens)"),
    **_keys("replay", tr="trace file name (or the upload choice)", rp_cmp="trace to compare with",
            rp_run="the run within a file of several (a guidellm report's benchmark, a sweep's point)",
            rp_cursor="the time cursor, ms", rp_play="play: the cursor advances by itself",
            rp_speed="play speed (½×, 1×, 2×, 4×)",
            rp_replica="a fleet trace: the replica shown (\"replica K (role)\"), or the whole fleet"),
    **_keys("calibration", cal_run="the measured run predicted (a bundled vLLM run's folder name)",
            cal_fit="the runs fitted on", cal_method="what the step model is fitted to: iteration log or spans",
            cal_speed="the predicted run at its own machine speed over the run (read from its iteration log)"),
    **_keys("load",
            ld_wl="workload (a label of LOAD_WORKLOADS)",
            ld_kind="load: open (Poisson rates) or closed (clients in a loop)",
            ld_loads="the loads to sweep: rates (req/s) or client counts, comma-separated",
            ld_seed="seed of the Poisson arrivals",
            ld_pol=("policies to sweep (core.lessons.schedules.POLICY_LABELS)", "policies"),
            ld_ms=("running sequences at most, 0 = no limit", "SchedulerConfig.max_seqs", True),
            ld_tb=("tokens per step at most, 0 = no limit", "SchedulerConfig.token_budget", True),
            ld_ch=("chunk size of the 'chunked' policy", "SchedulerConfig.chunk"),
            ld_kb=("KV pool in blocks, 0 = enough for all", "SchedulerConfig.kv_blocks", True),
            ld_base=("affine step model: base ms per step", "StepModel.base_ms"),
            ld_pp=("affine step model: ms per prefill token", "StepModel.prefill_ms_per_token"),
            ld_pd=("affine step model: ms per decoding sequence", "StepModel.decode_ms_per_seq"),
            ld_ttft="SLO: TTFT bound in ms, 0 = none", ld_tpot="SLO: TPOT bound in ms, 0 = none",
            ld_e2e="SLO: E2E bound in ms, 0 = none", ld_att="SLO attainment the capacity point must reach",
            ld_pt="inspected point: policy", ld_px="inspected point: load",
            ld_s_rate="capacity search: offered load, req/s", ld_s_pol="capacity search: policy",
            ld_s_usd="capacity search: USD per hour, 0 = no price",
            ld_s_ms="capacity search: max running sequences to try (comma-separated)",
            ld_s_tb="capacity search: token budgets to try (comma-separated; none = no limit)",
            ld_s_kb="capacity search: KV pools to try, in blocks (comma-separated; none = enough for all)"),
    # (no key runs the capacity search: a link restores its inputs; it runs on the page's button only)
    **_keys("fleet",
            fl_wl="workload (a label of the Fleet page's workloads)",
            fl_load="load multiplier: arrivals compressed by this factor",
            fl_n="whole replicas behind the router (1..16)",
            fl_pol="router policy (core.fleet.router.POLICIES)",
            fl_stale="router staleness, ms: the router sees each replica as of this long ago",
            fl_bal="prefix-aware: its load check on or off (off: balance_abs 10^9)",
            fl_pc=("prefix caching on every replica", "SchedulerConfig.prefix_caching"),
            fl_kb=("KV pool per replica in blocks, 0 = enough for all", "SchedulerConfig.kv_blocks", True),
            fl_base=("affine step model: base ms per step", "StepModel.base_ms"),
            fl_pp=("affine step model: ms per prefill token", "StepModel.prefill_ms_per_token"),
            fl_pd=("affine step model: ms per decoding sequence", "StepModel.decode_ms_per_seq"),
            fl_dis="disaggregated prefill/decode on or off",
            fl_p="disaggregated: prefill replicas", fl_d="disaggregated: decode replicas",
            fl_gbps="disaggregated: KV link bandwidth, GB/s", fl_lat="disaggregated: KV link latency, ms",
            fl_min="disaggregated: prompts shorter than this many tokens run whole on a decode replica",
            fl_model="disaggregated: the model whose KV bytes per token the link moves",
            fl_drain="drain a replica on or off", fl_dr="drain: the replica taken out of rotation",
            fl_dt="drain: when it leaves rotation, ms",
            fl_tab="the open tab: policies side by side, an experiment, the animation, the lesson, CPU tiers, measured "
                   "fleets",
            fl_s_max="staleness experiment: the largest staleness of its grid, ms",
            fl_s_pol="staleness experiment: the policies compared",
            fl_t="P:D experiment: total replicas split into prefill and decode ones",
            fl_ttft="P:D experiment: SLO on TTFT, ms", fl_tpot="P:D experiment: SLO on TPOT, ms",
            fl_measured="measured fleets tab: the bundled measured fleet trace shown"),
}

# Values of `sc`: label (as it appears in links) -> built-in scenario name.
SCENARIO_LABELS = {"Chapter 31": "chapter31", "Burst 5": "burst5", "Shared prefix": "shared_prefix",
                   "Poisson 2000": "poisson2000",
                   "Poisson 10000": "poisson10000", "Custom": "custom", "Upload": "upload"}


def bound(key: str) -> dict:
    """Widget arguments that bind it to the URL under `key` (declared in URL_KEYS)."""
    if key not in URL_KEYS:
        raise KeyError(f"URL key {key!r} is not declared in ui.URL_KEYS")
    return {"key": key, "bind": "query-params"}


def ensure_app_frame() -> None:
    """Every page calls this first. With a pages/ directory next to app.py, Streamlit runs a
    deep-linked page file on its own (its pre-st.navigation multipage mode) until some session
    of the process has called st.navigation: on a fresh server the first link to /schedules
    ran without app.py (no page config, link checks or navigation), and AppTest does the same
    after switch_page. Leave that mode and rerun, now through app.py."""
    from streamlit.runtime.pages_manager import PagesManager
    if PagesManager.uses_pages_directory:
        PagesManager.uses_pages_directory = False
        st.rerun()


def bound_values(page: str) -> dict[str, list[str]]:
    """Every widget bound to the URL that this run drew on `page` (a url_path; "*" keys too), with
    its value as Streamlit writes it into an address. The address bar holds a widget's value only
    after a user changed it, and never a default: a value set by code (a preset, a scenario's own
    default) or a default that depends on another widget (the fixed window's end follows the
    scenario) reopens as something else. A link built from these reopens as it was."""
    try:
        from streamlit.runtime.scriptrunner_utils.script_run_context import get_script_run_ctx
        from streamlit.runtime.state.query_params import _coerce_value_for_query_url
        from streamlit.runtime.state.session_state_proxy import get_session_state
        ctx = get_script_run_ctx()
        state = get_session_state()._state
        bindings = dict(state.query_params._bindings_by_param)
        drawn = ctx.shared.widget_ids_this_run.snapshot() if ctx is not None else frozenset()
        widgets = state._new_widget_state
    except (ImportError, AttributeError, RuntimeError):
        return {}                       # another Streamlit: the address bar's parameters only
    out: dict[str, list[str]] = {}
    for key, b in bindings.items():
        u = URL_KEYS.get(key)
        if u is None or u.page not in (page, "*") or b.widget_id not in drawn or key not in st.session_state:
            continue
        meta = widgets.widget_metadata.get(b.widget_id)
        if meta is None:
            continue
        # this run's value (a preset or the code may have set it), serialized as the widget sends it
        v = meta.serializer(st.session_state[key])
        if v is None:
            continue                    # a cleared widget (no value): the default is what it shows
        coerced = _coerce_value_for_query_url(list(v) if isinstance(v, (list, tuple)) else v, b.value_type)
        out[key] = coerced if isinstance(coerced, list) else [coerced]
    return out


def view_query(page: str) -> list[tuple[str, str]]:
    """The query of a link to this view: the address's parameters (those no widget holds, such as a
    custom workload, stay as they are) with every drawn bound widget's current value. In a
    fragment's rerun (only its own widgets drawn), the others keep the values of the last full run."""
    values = bound_values(page)
    if _fragment_run():
        values = {**st.session_state.get("_view_values", {}), **values}
    st.session_state["_view_values"] = values
    pairs = [(k, v) for k in st.query_params if k not in values for v in st.query_params.get_all(k)]
    return pairs + [(k, v) for k, vs in values.items() for v in vs]


def _fragment_run() -> bool:
    """This script run reruns fragments only (the rest of the page stays as the last full run drew it)."""
    try:
        from streamlit.runtime.scriptrunner_utils.script_run_context import get_script_run_ctx
        ctx = get_script_run_ctx()
        return bool(ctx is not None and ctx.fragment_ids_this_run)
    except (ImportError, AttributeError):
        return False


def view_link(page: str) -> str | None:
    """The address of this view with every bound widget's value (what a shared link restores)."""
    from urllib.parse import urlencode
    base = st.context.url
    if not base:
        return None
    query = urlencode(view_query(page))
    return base.split("?", 1)[0] + ("?" + query if query else "")


def link_slot(page: str) -> None:
    """Before the page runs (app.py): the sidebar's place for the link to this view. A fragment
    (`linked_fragment`) that runs in this full run claims it, so that its own reruns can redraw the
    link (Streamlit lets a fragment rerun write outside itself only where it wrote in the full run)."""
    st.session_state["_link_slot"] = (page, st.sidebar.container())
    st.session_state.pop("_link_claim", None)


def link_box(page: str) -> None:
    """After the page ran (app.py): the sidebar's "link to this view", a code box with a copy
    button. (The query is also kept in the session state, `_view_query`, where a headless test
    reads it.)"""
    got = st.session_state.get("_link_slot")
    claim = st.session_state.get("_link_claim")
    if claim is not None:
        target = claim[1]
    elif got is not None and got[0] == page:
        target = got[1].empty()
    else:                      # (no slot made before the page: the sidebar's end)
        target = st.sidebar.empty()
    _draw_link(page, target)


def _draw_link(page: str, target) -> None:
    st.session_state["_view_query"] = view_query(page)
    url = view_link(page)
    if url:
        with target.container(), st.expander(":material/link: Link to this view"):
            st.code(url, language=None, wrap_lines=True)
            st.caption("Opens this page with the same scenario, settings and cursor.")


def linked_fragment(fn=None, **kwargs):
    """st.fragment whose reruns also redraw the sidebar's link to this view: a widget bound to the
    URL inside a fragment changes the view without a full run, and the full run is what draws the
    link. The first such fragment of a full run owns the link (another one's reruns leave it)."""
    import functools

    def wrap(f):
        name = f"{f.__module__}.{f.__qualname__}"

        @functools.wraps(f)
        def run(*a, **kw):
            out = f(*a, **kw)
            got = st.session_state.get("_link_slot")
            if got is None:
                return out
            claim = st.session_state.get("_link_claim")
            if not _fragment_run():
                if claim is None:       # reserve the place this fragment's reruns write to
                    st.session_state["_link_claim"] = (name, got[1].empty())
            elif claim is not None and claim[0] == name:
                _draw_link(got[0], got[1])
            return out
        return st.fragment(run, **kwargs)
    return wrap(fn) if fn is not None else wrap


MAX_PARAM_CHARS = 4096    # one query parameter's name or value; URL_KEYS values are far shorter


def drop_overlong_params() -> list[str]:
    """Remove query parameters whose name or value is over MAX_PARAM_CHARS, before any widget
    reads them, and say so on the page. A link that long is a mistake or an attack, and left in
    the address bar it breaks the next navigation: the browser sends the address twice (the
    request line and the Referer header) and the HTTP server refuses the request (400), so the
    page never finishes loading. Returns the notices shown."""
    notes = []
    for key in list(st.query_params):
        longest = max((len(v) for v in st.query_params.get_all(key)), default=0)
        if len(key) > MAX_PARAM_CHARS or longest > MAX_PARAM_CHARS:
            shown = key if len(key) <= 40 else key[:40] + "…"
            notes.append(f"Ignored the link's parameter **{md(shown)}**: "
                         f"{max(len(key), longest):,} characters, at most {MAX_PARAM_CHARS:,}.")
            del st.query_params[key]
    if notes:
        _forget_dropped_params()
    for n in notes:
        st.warning(n, icon=":material/link_off:")
    return notes


def _forget_dropped_params():
    """Widgets bound to the URL seed themselves from the address the session opened with, not from
    st.query_params: make that address the current parameters, so a parameter just dropped seeds
    nothing (Streamlit's own MPA hook for the same, QueryParams.set_initial_query_params_from_current)."""
    try:
        from streamlit.runtime.state.session_state_proxy import get_session_state
        with get_session_state().query_params() as qp:
            qp.set_initial_query_params_from_current()
    except (ImportError, AttributeError, RuntimeError):
        pass     # another Streamlit: the drop still keeps the address bar clean


_NONFINITE = ("inf", "+inf", "-inf", "infinity", "+infinity", "-infinity", "nan", "+nan", "-nan")


def drop_nonfinite_params() -> list[str]:
    """Remove query parameters that spell a number no widget can hold (inf, -Infinity, nan),
    before any widget reads them, and say so on the page: a number input would turn them into
    int(float('inf')) and the page would end in an error. Returns the notices shown."""
    notes = []
    for key in list(st.query_params):
        bad = [v for v in st.query_params.get_all(key) if v.strip().lower() in _NONFINITE]
        if bad:
            notes.append(f"Ignored the link's parameter **{md(key[:40])}={md(bad[0][:20])}**: not a finite number; "
                         "showing the default.")
            del st.query_params[key]
    if notes:
        _forget_dropped_params()
    for n in notes:
        st.warning(n, icon=":material/link_off:")
    return notes


def choice_param(key: str, choices: dict[str, str], what: str) -> str | None:
    """Call before the widget bound to `key`: a link may name a choice by its label or by its
    short name, in any case ("sc=burst5" = "sc=Burst 5"); a short name is rewritten to the
    label. A value that is neither is dropped with a visible notice (the widget then shows its
    default) instead of being ignored silently. Returns the notice shown, if any."""
    if key not in st.query_params:
        return None
    value = st.query_params[key]
    if value in choices:
        return None
    known = {label.lower(): label for label in choices} | {short.lower(): label for label, short in choices.items()}
    label = known.get(value.strip().lower())
    if label is not None:
        st.query_params[key] = label
        st.session_state[key] = label   # the bound widget reads its value from here on this run
        return None
    del st.query_params[key]
    note = (f"The link's {md(what)} **{md(value[:60])}** is not one of: "
            f"{', '.join(md(f'{lab} ({short})') for lab, short in choices.items())}; showing the default.")
    st.warning(note, icon=":material/link_off:")
    return note


def preset_widget_values(page: str, preset: SchedulePreset) -> dict[str, object]:
    """Widget key -> value for the options a preset sets, on one page."""
    options = preset.options()
    out = {}
    for key, u in URL_KEYS.items():
        if u.page == page and u.option in options:
            v = options[u.option]
            out[key] = 0 if v is None and u.zero_is_none else v
    return out


def apply_presets_on_change(selector_key: str, page: str, presets: dict[str, SchedulePreset]):
    """When the user changes the selector, set the widgets from its preset. Not on the first run:
    a link's own query parameters must win. (Writes widget keys, never st.query_params.)"""
    prev_key = f"_prev_{selector_key}"
    cur = st.session_state.get(selector_key)
    prev = st.session_state.get(prev_key)
    if prev is not None and cur != prev and cur in presets:
        values = preset_widget_values(page, presets[cur])
        st.session_state.update(values)
        # A widget not on the page before this run (e.g. the constant model's ms per step
        # after switching from affine) takes the value but never writes it to the URL: write
        # the preset's values there too, so the link reproduces the view.
        from streamlit.errors import StreamlitAPIException
        for k, v in values.items():
            if k not in st.query_params and not isinstance(v, (list, tuple)):
                try:
                    st.query_params[k] = str(v).lower() if isinstance(v, bool) else str(v)
                except StreamlitAPIException:   # bound to a widget on the page: it writes its own value
                    pass
    st.session_state[prev_key] = cur
