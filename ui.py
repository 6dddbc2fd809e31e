"""Streamlit glue shared by the pages (pages/ holds only pages): the URL-key table, caches
around core, the widgets several pages share, and display formatting. Nothing here computes
a result; every number comes from core.

URL keys: every widget bound to the URL (`bind="query-params"`) takes its key from
`bound(key)`, which accepts only keys declared in URL_KEYS. A key that sets an option names
it ("SchedulerConfig.max_seqs", "StepModel.step_ms"), so a scenario preset, which states
option values, reaches the widgets through this one table.

Caches: arguments are hashed through HASH_FUNCS. A trace is keyed by identity: every trace
the pages pass comes out of another cache and is never mutated, and each cached value here
also holds the trace it was computed from, so the trace outlives its entry and its id
cannot be reused by another trace while the entry exists.
"""
import gc
import math
import os
import re
import threading
import weakref
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import streamlit as st

from core.analysis.cursor import in_flight_series, row_index, time_range
from core.analysis.metrics import request_metrics, summarize
from core.analysis.occupancy import block_states
from core.config import SchedulerConfig
from core.errors import InputError
from core.figures.latency import metric_comparison_bars
from core.figures.timeline import schedule_timeline
from core.fit.predict import predicted_trace
from core.formulas.kv import GPUS, MODELS
from core.formulas.speculative import acceptance_by_position
from core.lessons.scenarios import (
    DATA,
    SchedulePreset,
    bundled_trace_files,
    given_schedules,
    load_scenario,
    trace_files,
)
from core.lessons.schedules import (
    per_request_table,
    run_policies,
    steps_taken,
    summary_table,
    thin_sample_notes,
    tradeoff,
)
from core.sim.stepmodel import STEP_MODELS, StepModel
from core.trace import Trace, load_trace
from core.workload import Workload, parse_workload

UPLOAD_LIMIT_MB = 200


def freeze_startup_heap() -> None:
    """Move everything the imports built (streamlit, pandas, plotly, core) out of the cyclic
    garbage collector's reach, once per process. Streamlit runs a full collection after every
    script run (runner.postScriptGC); over the startup heap that cost ~100 ms per rerun, a
    stop-the-world pause for every other user's script thread too. Later garbage is
    collected as before. Also turns off numpy's huge-page advice (core.cli.no_hugepage_advice)
    and starts the worker processes that simulate large workloads (core.sim.parallel.warm)."""
    global _HEAP_FROZEN
    if not _HEAP_FROZEN:
        from core.cli import no_hugepage_advice
        from core.sim.parallel import warm
        no_hugepage_advice()
        warm()
        import core.figures  # noqa: F401  (plotly's figure classes: the largest import the pages share)
        gc.collect()
        gc.freeze()
        _HEAP_FROZEN = True


_HEAP_FROZEN = False


# ---- URL keys -----------------------------------------------------------------------------------

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
            fk_prompt="fork demo: prompt tokens", fk_samples="fork demo: samples", fk_bs="fork demo: block size"),
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
            sp_gamma="draft tokens γ", sp_verify="verify cost in decode steps"),
    **_keys("roofline",
            rf_gpu="GPU preset", rf_model="model preset", rf_dtype="bytes per weight",
            rf_batch="decode batch (sequences)", rf_prompt="prefill length (tokens)"),
    **_keys("replay", tr="trace file name (or the upload choice)", rp_cmp="trace to compare with",
            rp_cursor="the time cursor, ms", rp_play="play: the cursor advances by itself",
            rp_speed="play speed (½×, 1×, 2×, 4×)"),
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
            ld_pt="inspected point: policy", ld_px="inspected point: load"),
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


def view_link() -> str | None:
    """The address of this view with every bound widget's value (what a shared link restores)."""
    from urllib.parse import urlencode
    base = st.context.url
    if not base:
        return None
    base = base.split("?", 1)[0]
    query = urlencode([(k, v) for k in st.query_params for v in st.query_params.get_all(k)])
    return base + ("?" + query if query else "")


def link_box() -> None:
    """The sidebar's "link to this view": a code box with a copy button."""
    url = view_link()
    if url:
        with st.sidebar.expander(":material/link: Link to this view"):
            st.code(url, language=None, wrap_lines=True)
            st.caption("Opens this page with the same scenario, settings and cursor.")


# ---- figures and tables of a view: presentation mode, slides and handouts ------------------------

def presenting() -> bool:
    """Presentation mode (the sidebar switch, `present` in the URL)."""
    return bool(st.session_state.get("present"))


def start_view() -> None:
    """app.py, before the page runs: this view's figures and tables are collected afresh."""
    st.session_state["_view_figures"] = {}
    st.session_state["_view_tables"] = {}


def show_chart(fig, key: str, where=None, **kwargs):
    """How pages draw a figure: it joins this view's exports, and in presentation mode a copy
    with projector-sized fonts is drawn (the figure itself may be shared by caches)."""
    from core.figures.slides import for_presentation
    st.session_state.setdefault("_view_figures", {})[key] = fig
    return (where or st).plotly_chart(for_presentation(fig) if presenting() else fig, key=key, **kwargs)


def show_table(df, key: str, where=None, **kwargs):
    """How pages show a table of numbers: it joins this view's CSV export."""
    st.session_state.setdefault("_view_tables", {})[key] = df
    return (where or st).dataframe(df, key=key, **kwargs)


def presentation_switch() -> None:
    """The sidebar's presentation switch (before the page runs: its figures read it)."""
    st.sidebar.toggle(":material/slideshow: Presentation mode", help="Fonts of at least 16 px in figures; "
                      "the sidebar starts collapsed when the link is opened", **bound("present"))


def export_tools(view: str) -> None:
    """After the page ran: the sidebar's exports of what it showed: its figures as SVG or PNG
    (rendered by kaleido with the system Chromium) and its tables as CSV, each set in a zip."""
    from core.errors import InputError
    from core.figures.slides import figures_zip, for_presentation, tables_zip
    figs = st.session_state.get("_view_figures", {})
    tables = st.session_state.get("_view_tables", {})
    if not figs and not tables:
        return
    with st.sidebar.expander(":material/download: Slides and handouts"):
        st.caption(f"This view: {len(figs)} figure(s), {len(tables)} table(s). Animations are drawn at their "
                   "last frame; presentation mode gives larger fonts.")
        c1, c2, c3 = st.columns(3)
        asked = [(fmt, label) for fmt, label, col in (("svg", "SVG", c1), ("png", "PNG", c2), ("csv", "CSV", c3))
                 if col.button(label, key=f"export_{fmt}", disabled=not (tables if fmt == "csv" else figs))]
        for fmt, label in asked:
            try:
                with st.spinner(f"Rendering {label}…"):
                    data = tables_zip(tables) if fmt == "csv" else figures_zip(
                        {k: for_presentation(f) if presenting() else f for k, f in figs.items()}, fmt)
                st.session_state["_export"] = (view, fmt, data)
            except InputError as e:
                st.error(str(e))
        ready = st.session_state.get("_export")
        if ready and ready[0] == view:
            _, fmt, data = ready
            what = "tables as CSV" if fmt == "csv" else f"figures as {fmt.upper()}"
            st.download_button(f"Download {what} (zip, {len(data) / 1024:,.0f} KiB)", data,
                               file_name=f"serving-explorer-{view}-{fmt}.zip", mime="application/zip",
                               key="export_download", on_click="ignore")


def compact_header() -> None:
    """Start the page content near the top: Streamlit's default leaves ~6 rem of empty space
    above every title, a tenth of a projector screen. A fixed style sheet, no user input."""
    st.html("<style>.stMainBlockContainer, .block-container {padding-top: 2.25rem;}</style>")


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
    for n in notes:
        st.warning(n, icon=":material/link_off:")
    return notes


def notices(notes: list[str], what: str = "these numbers") -> None:
    """At most one notice area: one note as a caption with a warning icon, several folded into
    one expander whose title counts them (a lecture screen is not a wall of yellow boxes)."""
    if len(notes) == 1:
        st.caption(f":material/warning: {notes[0]}")
    elif notes:
        with st.expander(f":material/warning: {len(notes)} notes on {what}"):
            for n in notes:
                st.markdown(f"- {n}")


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


# ---- caches -------------------------------------------------------------------------------------

def _workload_key(w: Workload) -> str:
    return repr([(r.id, r.arrival_ms, r.prompt_tokens, r.max_output_tokens, r.prompt_ids, r.tenant, r.abort_at_ms,
                  r.deadline_ms, r.priority) for r in w.requests])


HASH_FUNCS = {Workload: _workload_key, SchedulerConfig: repr, StepModel: repr, Trace: id}


@st.cache_resource
def chapter_traces() -> dict[str, Trace]:
    return {name: load_trace(DATA / "traces" / f"chapter31_{name}.json") for name in ("serial", "continuous")}


@st.cache_resource(show_spinner=False)
def cached_given(name: str) -> list[tuple[str, Trace]]:
    """core.lessons.scenarios.given_schedules, read from disk once per process."""
    return given_schedules(name)


def _summaries(schedules):
    return [derived(tr, "summary") for _, tr in schedules]


def _slots(schedules, theme="light"):
    from core.figures.animate import slot_animation
    from core.lessons.slots import slot_grid
    grids = [(label, slot_grid(tr), tr.ids) for label, tr in schedules if len(tr.steps)]
    grids = [x for x in grids if x[1] is not None]
    return slot_animation(grids, theme) if grids else None


def theme() -> str:
    """The app's colour scheme as the browser reports it ("light" or "dark")."""
    t = getattr(getattr(st.context, "theme", None), "type", None)
    return t if t in ("light", "dark") else "light"


_SCHEDULE_VIEWS = {"timeline": schedule_timeline, "slots": _slots,
                   "summary": lambda s, window, usd: summary_table(s, window, usd, _summaries(s)),
                   "requests": per_request_table,
                   "tradeoff": lambda s, a, b: tradeoff(s, a, b, schedule_view("requests", s)),
                   "steps": steps_taken, "thin": lambda s: thin_sample_notes(s, _summaries(s)),
                   "e2e_bars": lambda s: metric_comparison_bars(per_request_table(s), "e2e_ms")}


@st.cache_resource(show_spinner=False, max_entries=64, hash_funcs=HASH_FUNCS)
def _schedule_view(what: str, schedules: tuple, args: tuple):
    return schedules, _SCHEDULE_VIEWS[what](list(schedules), *args)


def schedule_view(what: str, schedules: list[tuple[str, Trace]], *args):
    """A view over (label, trace) schedules ("timeline", "slots", "summary", "requests", "tradeoff",
    "steps", "thin", "e2e_bars"), computed once per process for the same traces and arguments and shared by
    every session: a class opening the same scenario builds it once. The result (a figure, a
    data frame, a list) is shared: never mutate it."""
    return _schedule_view(what, tuple(schedules), args)[1]


@st.cache_resource(show_spinner=False)
def cached_scenario(name: str) -> Workload:
    return load_scenario(name)


@st.cache_data(show_spinner=False, max_entries=16)
def _parse_upload(data: bytes, name: str):
    try:
        return parse_workload(data, name), None
    except InputError as e:
        return None, str(e)


def parse_upload(data: bytes, name: str):
    """(workload, None) or (None, message). Parsed once per distinct file (cached)."""
    if len(data) > UPLOAD_LIMIT_MB * 2**20:
        return None, f"{name}: {len(data) / 2**20:.1f} MiB is over the {UPLOAD_LIMIT_MB} MiB limit"
    return _parse_upload(data, name)


# The traces returned are shared between reruns and sessions: never mutate them.
@st.cache_resource(show_spinner="Simulating…", max_entries=32, hash_funcs=HASH_FUNCS)
def cached_policies(workload: Workload, policies: tuple, config: SchedulerConfig, step_model: StepModel,
                    chunk: int | None = None, record_kv: bool = True) -> list[tuple[str, Trace]]:
    """record_kv False (the schedules page, which shows no block-level paging): no KV events,
    which are most of a large run's rows."""
    runs = run_policies(workload, list(policies), config, step_model, chunk, created="(app)", record_kv=record_kv,
                        summaries=True)
    with _PREMADE_LOCK:     # sessions run in threads of one process
        for key in [k for k, (ref, _) in list(_PREMADE_SUMMARIES.items()) if ref() is None]:
            _PREMADE_SUMMARIES.pop(key, None)
        for _, tr, summary in runs:    # computed beside the trace (in its worker process on a large workload)
            _PREMADE_SUMMARIES[id(tr)] = (weakref.ref(tr), summary)
    return [(label, tr) for label, tr, _ in runs]


_PREMADE_SUMMARIES: dict[int, tuple] = {}   # id(trace) -> (weak reference to it, its summary)
_PREMADE_LOCK = threading.Lock()


def _summary(tr: Trace) -> dict:
    with _PREMADE_LOCK:
        ref, summary = _PREMADE_SUMMARIES.pop(id(tr), (None, None))
    return summary if ref is not None and ref() is tr else summarize(tr, per_request=False)


@st.cache_resource(show_spinner=False, max_entries=16, hash_funcs=HASH_FUNCS)
def _paging_animation(trace: Trace, block_size: int):
    from core.figures.animate import paging_animation
    from core.lessons.blockframes import paging_frames
    pf = paging_frames(trace, block_size)
    return trace, (None if pf is None else (pf, paging_animation(pf, trace.ids)))


def paging_animation_view(trace: Trace, block_size: int):
    """(core.lessons.blockframes.PagingFrames, figure) of a trace's paging animation, once per trace;
    None without kv or step events. Shared: never mutate."""
    return _paging_animation(trace, block_size)[1]


@st.cache_resource(show_spinner=False, max_entries=16, hash_funcs=HASH_FUNCS)
def _block_states(trace: Trace, max_snapshots: int):
    return trace, block_states(trace, max_snapshots=max_snapshots)


def cached_block_states(trace: Trace, max_snapshots: int = 160):
    return _block_states(trace, max_snapshots)[1]


_DERIVED = {"summary": _summary,   # pages read the summary only
            "requests": request_metrics, "in_flight": in_flight_series, "rows": row_index,
            "span": time_range}


@st.cache_resource(show_spinner=False, max_entries=16, hash_funcs=HASH_FUNCS)
def _derived(trace: Trace, what: str):
    return trace, _DERIVED[what](trace)


def derived(trace: Trace, what: str):
    """Per-trace results that do not depend on the cursor ("summary", "requests", "in_flight",
    "span": the cursor's range, "rows": where each request's rows and each step's batch
    entries are, for `subset`/`step_at`)."""
    return _derived(trace, what)[1]


@st.cache_resource(show_spinner="Simulating the same workload…", max_entries=8, hash_funcs=HASH_FUNCS)
def _predicted(trace: Trace):
    return trace, predicted_trace(trace, created="(app)")


def cached_prediction(trace: Trace) -> Trace:
    """core.fit.predict.predicted_trace, once per trace."""
    return _predicted(trace)[1]


MAX_PAGE_FIT_TOKENS = 2_000_000   # inferring steps walks every token in Python (~1.6 s per million)


@st.cache_resource(show_spinner="Fitting a step model and predicting…", max_entries=8, hash_funcs=HASH_FUNCS)
def _request_predicted(trace: Trace, config: SchedulerConfig, send_times_known: bool, method: str):
    from core.fit.predict import replayed_run
    from core.fit.reqfit import errors, fit_from_requests
    from core.fit.stepinfer import fit_inferred
    if method == "token times":
        if len(trace.tokens) > MAX_PAGE_FIT_TOKENS:
            raise InputError(f"{len(trace.tokens):,} tokens: the page fits up to {MAX_PAGE_FIT_TOKENS:,}; use "
                             "python -m core fit FILE --from-token-times --out MODEL.json")
        sm, report = fit_inferred(trace, config, "affine")
    else:   # (a page waits for it: ~0.1 s per simulation at 2,000 requests; larger files: python -m core fit)
        sm, report = fit_from_requests(trace, config, send_times_known=send_times_known, max_requests=2000)
    pred, clients = replayed_run(trace, config, sm, closed_loop=send_times_known, created="(app)")
    e = errors(pred, trace)
    report = {**report, "method": method, "clients": clients,
              "prediction_error": {k: float(np.median(v)) if len(v) else None for k, v in e.items()}}
    return trace, pred, report


def cached_request_prediction(trace: Trace, config: SchedulerConfig, send_times_known: bool,
                              method: str = "requests") -> tuple[Trace, dict]:
    """A prediction for a trace without step events, once per trace, settings and method:
    "token times" (core.fit.stepinfer: steps inferred from the streamed tokens) or "requests"
    (core.fit.reqfit: the requests' TTFT and E2E). A closed-loop benchmark run is predicted as that
    closed loop. Returns (predicted trace, fit report with the prediction's median errors)."""
    return _request_predicted(trace, config, send_times_known, method)[1:]


@st.cache_resource(show_spinner="Fitting and predicting…", max_entries=8, hash_funcs=HASH_FUNCS)
def _fidelity(trace: Trace, model: str, fit_on: Trace | None):
    from core.fit.fidelity import how_good
    return trace, fit_on, how_good(trace, model, fit_on)


def cached_fidelity(trace: Trace, model: str, fit_on: Trace | None):
    """core.fit.fidelity.how_good, once per (trace, model, fit-on trace)."""
    return _fidelity(trace, model, fit_on)[2]


@st.cache_resource(show_spinner=False)
def _bundled_traces() -> dict[str, Trace]:
    out = {}
    for p in bundled_trace_files():
        try:
            out[p.name] = load_trace(p)
        except InputError:
            continue
    return out


def tile_traces() -> dict[str, tuple[Trace, list[dict]]]:
    """Bundled traces with `tiles` events: name -> (trace, tile events)."""
    return {n: (tr, tr.events_of("tiles")) for n, tr in _bundled_traces().items() if tr.events_of("tiles")}


def spec_traces() -> dict[str, tuple[list[int], list[float], list[int]]]:
    """Bundled traces with `spec` events: name -> (positions, acceptance rates, counts)."""
    return {n: acceptance_by_position(tr.events_of("spec")) for n, tr in _bundled_traces().items()
            if tr.events_of("spec")}


def replay_trace_files() -> dict[str, Path]:
    """Trace files for the replay page: bundled, imported, and SERVING_EXPLORER_TRACES."""
    return trace_files(os.environ.get("SERVING_EXPLORER_TRACES", ""))


@st.cache_resource(show_spinner="Loading trace…", max_entries=8)
def _load_file(path: str, mtime: float):
    from core.trace import Imported, open_trace
    try:
        got = open_trace(path)
    except InputError as e:
        return None, None, str(e)
    if isinstance(got, Imported):
        return got.trace, got, None
    return got, None, None


def load_trace_file(path: Path):
    """(trace or None, Imported or None, error or None), parsed once per file version.
    Only a regular file is opened (it may have changed since it was listed)."""
    import stat
    try:
        st_ = path.stat()
        if stat.S_ISDIR(st_.st_mode):   # a partitioned trace: keyed by its parts' names, sizes and times
            parts = sorted(path.glob("*.parquet"))
            return _load_file(str(path), hash(tuple((q.name, q.stat().st_size, q.stat().st_mtime) for q in parts)))
    except OSError as e:
        return None, None, f"{path.name}: cannot open ({e.strerror})"
    if not stat.S_ISREG(st_.st_mode):
        return None, None, f"{path.name}: not a regular file"
    return _load_file(str(path), st_.st_mtime)


def parse_uploaded_trace(up, slot: str):
    """Parse an uploaded trace once per upload. The result is kept in this session only (one per
    page slot, replaced by the next upload, freed when the session ends): an upload is one
    user's data, and a cache shared by every session would keep the largest files of a whole
    class alive at once."""
    if up.size > UPLOAD_LIMIT_MB * 2**20:
        return None, None, f"{up.name}: {up.size / 2**20:.1f} MiB is over the {UPLOAD_LIMIT_MB} MiB limit"
    key = f"_{slot}_parsed"
    held = st.session_state.get(key)
    if held is not None and held[0] == up.file_id:
        return held[1]
    from core.trace import Imported, open_trace
    st.session_state.pop(key, None)   # the previous upload's trace can go before this one is parsed
    with st.spinner("Parsing upload…"):
        try:
            got = open_trace(up.getvalue(), up.name)
            result = (got.trace, got, None) if isinstance(got, Imported) else (got, None, None)
        except InputError as e:
            result = (None, None, str(e))
    st.session_state[key] = (up.file_id, result)
    return result


# ---- shared widgets -----------------------------------------------------------------------------

def step_model_controls() -> StepModel:
    """Sidebar widgets for the step-time model (bound to the URL)."""
    kind = st.segmented_control("Step-time model", list(STEP_MODELS), default="affine", required=True,
                                **bound("s_kind"))
    if kind == "constant":
        step_ms = st.number_input("ms per step", 0.001, 1e6, 10.0, **bound("s_step"))
        return StepModel("constant", step_ms=step_ms)
    base_ms = st.number_input("base ms per step", 0.0, 1e6, 20.0, **bound("s_base"))
    if kind in ("affine", "features"):
        pp = st.number_input("ms per prefill token", 0.0, 1e6, 20.0, format="%.4f", **bound("s_pp"))
        pd_ = st.number_input("ms per decoding sequence", 0.0, 1e6, 20.0, format="%.4f", **bound("s_pd"))
        more = {}
        if kind == "features":   # python -m core fit prints these for a measured trace
            more = dict(prefill_ms_per_kpos=st.number_input("ms per 1,000 attended prefill positions", 0.0, 1e6,
                                                            0.0, format="%.5f", **bound("s_ppk")),
                        decode_ms_per_kpos=st.number_input("ms per 1,000 attended decode positions", 0.0, 1e6,
                                                           0.0, format="%.5f", **bound("s_pdk")),
                        prefill_ms_per_chunk=st.number_input("ms per prefill piece", 0.0, 1e6, 0.0, format="%.4f",
                                                             **bound("s_pch")))
        try:
            return StepModel(kind, base_ms=base_ms, prefill_ms_per_token=pp, decode_ms_per_seq=pd_, **more)
        except InputError as e:
            st.error(f"Step model: {e}")
            st.stop()
    model = st.selectbox("Model preset", list(MODELS), **bound("s_model"))
    gpu = st.selectbox("GPU preset", list(GPUS), index=list(GPUS).index("A100-80GB"), **bound("s_gpu"))
    return StepModel("roofline", base_ms=base_ms, model=model, gpu=gpu)


# ---- formatting ---------------------------------------------------------------------------------

ORIGIN_COLORS = {"given": "blue", "simulated": "orange", "measured": "green", "imported": "violet"}


_MD_SPECIAL = re.compile(r"([\\`*_\[\]<>:~$|#&])")  # links/images, HTML, emphasis, colors, emoji, math


def md(text) -> str:
    """User-supplied text (labels, file names, notes, error excerpts) made inert in
    Streamlit markdown: no links, images, HTML, emphasis, colors or emoji shortcodes."""
    return _MD_SPECIAL.sub(r"\\\1", str(text))


def origin_badge(trace: Trace) -> str:
    src = trace.meta.get("source", "?")
    extra = ""
    if src in ("measured", "imported"):
        engine = trace.meta.get("engine", {})
        name = engine.get("name", "?") if isinstance(engine, dict) else str(engine)
        extra = f" {trace.meta.get('device', '?')}, {name}, {trace.meta.get('created', '?')}"
    color = ORIGIN_COLORS.get(src, "gray")
    return f":{color}-badge[{md(src + extra)}]"


def trace_details(trace: Trace) -> str:
    """Created, device, step model and notes from the trace's metadata, those present."""
    meta = trace.meta
    step_model = meta.get("step_model")
    details = {"created": meta.get("created"), "device": meta.get("device"),
               "step model": step_model.get("description") if isinstance(step_model, dict) else None,
               "notes": meta.get("notes")}
    return " · ".join(f"{k}: {md(v)}" for k, v in details.items() if v)


def fmt_ms(x) -> str:
    return "—" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:,.3f}".rstrip("0").rstrip(".")


def request_table(summary: dict) -> pd.DataFrame:
    """Per-request metrics for display; a missing TPOT shows as an em dash, never 0.
    `output_tokens` in a summary is the count emitted."""
    rows = [{"request": r["id"], "arrival ms": r["arrival_ms"], "TTFT ms": r["ttft_ms"],
             "TPOT ms": "—" if r["tpot_ms"] is None else f"{r['tpot_ms']:g}",
             "E2E ms": r["e2e_ms"], "tokens": r["output_tokens"]} for r in summary["requests"]]
    return pd.DataFrame(rows)
