"""Caches around core, shared by every session of the app process (and per-session state for
uploads). Arguments are hashed through HASH_FUNCS. A trace is keyed by identity: every trace
the pages pass comes out of another cache and is never mutated, and each cached value here
also holds the trace it was computed from, so the trace outlives its entry and its id
cannot be reused by another trace while the entry exists."""
import os
import threading
import weakref
from pathlib import Path

import streamlit as st

from core.analysis import views
from core.analysis.metrics import summarize
from core.analysis.occupancy import block_states
from core.config import SchedulerConfig
from core.errors import InputError
from core.figures.latency import metric_comparison_bars
from core.figures.timeline import schedule_timeline
from core.fit.predict import predicted_trace
from core.formulas.speculative import acceptance_by_position
from core.lessons.scenarios import (
    DATA,
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
from core.sim.stepmodel import StepModel
from core.trace import Trace, load_trace
from core.workload import Workload, parse_workload

UPLOAD_LIMIT_MB = 200


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


# prompt token ids an uploaded workload may expand to (a Mooncake trace's hash ids): ~70 MB, on a server
# a class shares; the command line reads up to core.workload.mooncake.MAX_PROMPT_TOKENS
UPLOAD_PROMPT_TOKENS = 2_000_000


@st.cache_data(show_spinner=False, max_entries=16)
def _parse_upload(data: bytes, name: str):
    try:
        return parse_workload(data, name, max_prompt_tokens=UPLOAD_PROMPT_TOKENS,
                              limit_why=f"; an upload to the app holds at most {UPLOAD_PROMPT_TOKENS:,}: "
                                        f"`python -m core simulate {name}` reads up to 20,000,000"), None
    except InputError as e:
        return None, str(e)


def parse_upload(data: bytes, name: str):
    """(workload, None) or (None, message). Parsed once per distinct file (cached)."""
    if len(data) > UPLOAD_LIMIT_MB * 2**20:
        return None, f"{name}: {len(data) / 2**20:.1f} MiB is over the {UPLOAD_LIMIT_MB} MiB limit"
    return _parse_upload(data, name)


def uploaded_workload(slot: str, formats: str, waiting: str) -> Workload:
    """A page's uploaded workload: the file picked in `slot`'s uploader (its key `SLOT_upload`), or,
    when none is picked or the new one is bad (its error shown), this session's last valid one
    (`SLOT_last_upload`); with neither, `waiting` is shown and the page stops."""
    from ui.fmt import md
    up = st.file_uploader(f"Workload file ({formats})", type=["json", "csv", "jsonl", "gz"], key=f"{slot}_upload")
    workload = None
    if up is not None:
        workload, err = parse_upload(up.getvalue(), up.name)
        if err:
            st.error(err)
    last = f"{slot}_last_upload"
    if workload is None:
        workload = st.session_state.get(last)
        if workload is None:
            st.info(waiting)
            st.stop()
        st.caption(f"Showing the last valid upload: {md(workload.name)}")
    else:
        st.session_state[last] = workload
    return workload


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
def _paging_animation(trace: Trace, block_size: int, theme: str = "light"):
    from core.figures.animate import paging_animation
    from core.lessons.blockframes import paging_frames
    pf = paging_frames(trace, block_size)
    return trace, (None if pf is None else (pf, paging_animation(pf, trace.ids, theme)))


def paging_animation_view(trace: Trace, block_size: int):
    """(core.lessons.blockframes.PagingFrames, figure) of a trace's paging animation, once per trace
    and theme; None without kv or step events. Shared: never mutate."""
    return _paging_animation(trace, block_size, theme())[1]


@st.cache_resource(show_spinner=False, max_entries=16, hash_funcs=HASH_FUNCS)
def _block_states(trace: Trace, max_snapshots: int):
    return trace, block_states(trace, max_snapshots=max_snapshots)


def cached_block_states(trace: Trace, max_snapshots: int = 160):
    return _block_states(trace, max_snapshots)[1]


_DERIVED = {**views.DERIVED, "summary": _summary,   # a summary made in a worker process is taken as it is
            "occupancy": lambda tr: cached_block_states(tr)}


@st.cache_resource(show_spinner=False, max_entries=16, hash_funcs=HASH_FUNCS)
def _derived(trace: Trace, what: str):
    return trace, _DERIVED[what](trace)


def derived(trace: Trace, what: str):
    """Per-trace results that do not depend on the cursor ("summary", "requests", "in_flight",
    "span": the cursor's range, "rows": where each request's rows and each step's batch
    entries are, for `subset`/`step_at`; "prefix_cache": the engine's own prefix cache over time
    from its KV events)."""
    return _derived(trace, what)[1]


@st.cache_resource(show_spinner="Simulating the same workload…", max_entries=8, hash_funcs=HASH_FUNCS)
def _predicted(trace: Trace):
    return trace, predicted_trace(trace, created="(app)")


def cached_prediction(trace: Trace) -> Trace:
    """core.fit.predict.predicted_trace, once per trace."""
    return _predicted(trace)[1]


@st.cache_resource(show_spinner="Fitting a step model and predicting…", max_entries=8, hash_funcs=HASH_FUNCS)
def _request_predicted(trace: Trace, config: SchedulerConfig, send_times_known: bool, method: str):
    from core.fit.predict import predict_without_steps
    return (trace, *predict_without_steps(trace, config, send_times_known, method, max_requests=2000,
                                          created="(app)"))


def cached_request_prediction(trace: Trace, config: SchedulerConfig, send_times_known: bool,
                              method: str = "requests") -> tuple[Trace, dict]:
    """A prediction for a trace without step events, once per trace, settings and method:
    "token times" (core.fit.stepinfer: steps inferred from the streamed tokens) or "requests"
    (core.fit.reqfit: the requests' TTFT and E2E). A closed-loop benchmark run is predicted as that
    closed loop. Returns (predicted trace, fit report with the prediction's median errors)."""
    return _request_predicted(trace, config, send_times_known, method)[1:]


@st.cache_resource(show_spinner="Fitting and predicting…", max_entries=8, hash_funcs=HASH_FUNCS)
def _fidelity(trace: Trace, model: str, fit_on: Trace | None, config: SchedulerConfig | None, method: str):
    from core.fit.fidelity import how_good
    return trace, fit_on, how_good(trace, model, fit_on, config=config, method=method)


@st.cache_resource(show_spinner="Reading vLLM's KV events and simulating the same workload…", max_entries=1)
def cached_vllm_cache():
    """core.lessons.vllm_runs.real_and_simulated_cache, once per process."""
    from core.lessons.vllm_runs import real_and_simulated_cache
    return real_and_simulated_cache()


@st.cache_resource(show_spinner="Predicting…", max_entries=8)
def cached_calibration(run: str, fit_on: tuple[str, ...], method: str, speed_from_log: bool = False):
    """core.fit.calibrate over the bundled real vLLM runs (data/imports/vllm_telemetry): fitted on
    `fit_on`, `run` predicted, as `python -m core fidelity` reports it (core.fit.calibrate.evaluate;
    `speed_from_log`: at the run's own machine speed, its --speed-from-log). Returns (calibration,
    evaluation: held_out, rows, summary, outside, outside_note, speed_factor, speed; steps or None,
    notes)."""
    from core.fit.calibrate import evaluate, step_comparison
    from core.lessons.vllm_runs import bundled_run
    runs = {n: bundled_run(n) for n in {run, *fit_on}}   # (a bundled vLLM run's folder, or a runner capture)
    cal = _calibration(fit_on, method)
    ev = evaluate(cal, runs[run], {runs[n].name for n in fit_on}, "affine", speed_from_log)
    notes = [n for r in runs.values() for n in r.notes]
    return cal, ev, step_comparison(cal, runs[run]), notes


@st.cache_resource(show_spinner="Fitting on the chosen runs…", max_entries=8)
def _calibration(fit_on: tuple[str, ...], method: str):
    """The fit alone, once per (runs, method): predicting another run, or the same at its own speed,
    does not fit again (a fit on the calibration run takes about 2 minutes)."""
    from core.fit.calibrate import calibrate
    from core.lessons.vllm_runs import bundled_run
    return calibrate([bundled_run(n) for n in fit_on], "affine", method)


def cached_fidelity(trace: Trace, model: str, fit_on: Trace | None, config: SchedulerConfig | None = None,
                    method: str = "token times"):
    """core.fit.fidelity.how_good, once per (trace, model, fit-on trace, settings for a trace
    without steps, fit method)."""
    return _fidelity(trace, model, fit_on, config, method)[2]


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
def _load_file(path: str, version: int):
    from core.trace import Imported, open_trace
    try:
        got = open_trace(path)
    except InputError as e:
        return None, None, str(e)
    if isinstance(got, Imported):
        return got.trace, got, None
    return got, None, None


def file_version(files: list[Path]) -> tuple:
    """What tells one version of these files from another: each one's name, size, modification
    time and a hash of its first and last 64 KiB (core.analysis.overview's identity). A file
    replaced by another of the same name, size and time (cp -p, a restored backup) is another
    version: caches keyed by this never serve the old one's results."""
    from core.analysis.overview import files_identity
    return tuple(tuple(x) for x in files_identity(files))


def load_trace_file(path: Path):
    """(trace or None, Imported or None, error or None), parsed once per file version.
    Only a regular file is opened (it may have changed since it was listed)."""
    import stat
    try:
        st_ = path.stat()
        if stat.S_ISDIR(st_.st_mode):   # Parquet parts, or a tool's output directory: keyed by its files
            parts = sorted(path.glob("*.parquet")) or sorted(path.glob("*/run=*.json"))[:2000] or sorted(path.glob("*"))
            return _load_file(str(path), hash(file_version([q for q in parts if q.is_file()])))
        if not stat.S_ISREG(st_.st_mode):
            return None, None, f"{path.name}: not a regular file"
        return _load_file(str(path), hash(file_version([path])))
    except OSError as e:
        return None, None, f"{path.name}: cannot open ({e.strerror})"


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


def add_aiperf_summary(records, summary, slot: str):
    """An uploaded AIPerf profile_export.jsonl read again with its uploaded profile_export_aiperf.json, so
    that AIPerf's own statistics sit beside ours. (trace, Imported, error), kept in this session."""
    total = records.size + summary.size
    if total > UPLOAD_LIMIT_MB * 2**20:
        return None, None, f"{total / 2**20:.1f} MiB in all is over the {UPLOAD_LIMIT_MB} MiB limit"
    key = f"_{slot}_aiperf_summary"
    ids = (records.file_id, summary.file_id)
    held = st.session_state.get(key)
    if held is not None and held[0] == ids:
        return held[1]
    from core.errors import TraceError, gunzip
    from core.trace.imports import aiperf
    from core.trace.imports.sniff import json_doc, json_lines
    try:
        doc = json_doc(gunzip(summary.getvalue(), summary.name, TraceError), summary.name)
        if not aiperf.looks_like_summary(doc):
            raise TraceError(f"{summary.name}: expected AIPerf's summary (profile_export_aiperf.json: "
                             "aiperf_version and its metrics), got something else")
        lines = json_lines(gunzip(records.getvalue(), records.name, TraceError), records.name)
        imp = aiperf.import_records(lines, records.name, doc)
        result = (imp.trace, imp, None)
    except InputError as e:
        result = (None, None, str(e))
    st.session_state[key] = (ids, result)
    return result


def parse_uploaded_run(ups: list, slot: str):
    """Several uploaded files of one run (a client's file, the server's log, spans, KV events)
    merged into one trace (core.trace.imports.merge), once per set of uploads, kept in this
    session only. Returns (trace, None, error); the merge's report is in the trace's
    meta.merged_from."""
    total = sum(u.size for u in ups)
    if total > UPLOAD_LIMIT_MB * 2**20:
        return None, None, f"{total / 2**20:.1f} MiB in all is over the {UPLOAD_LIMIT_MB} MiB limit"
    key = f"_{slot}_merged"
    ids = tuple(u.file_id for u in ups)
    held = st.session_state.get(key)
    if held is not None and held[0] == ids:
        return held[1]
    from core.trace import open_trace
    from core.trace.imports.merge import merge
    st.session_state.pop(key, None)
    with st.spinner(f"Reading and merging {len(ups)} files…"):
        try:
            parts = [open_trace(u.getvalue(), u.name) for u in ups]
            tr, _ = merge(parts, [u.name for u in ups])
            result = (tr, None, None)
        except InputError as e:
            result = (None, None, str(e))
    st.session_state[key] = (ids, result)
    return result


def trace_view(trace: Trace, big: bool):
    """The replay page's core.analysis.views.InMemoryView of a trace in memory, its per-trace results
    cached across sessions (`derived`)."""
    from core.analysis.views import InMemoryView
    return InMemoryView(trace, big, cache=derived)


@st.cache_resource(show_spinner=False, max_entries=4)
def _overview(path: str, identity: tuple):
    from core.analysis.overview import open_overview
    try:
        with st.spinner("A trace too large to load: building its overview once (summary, per-request spans, steps, "
                        "KV block states, rows re-sorted by request; ~30 s at 100,000 requests)…"):
            ov, built = open_overview(path)
    except InputError as e:
        return None, None, str(e)
    return ov, built, None


def large_trace(path: Path) -> bool:
    """A Parquet trace too large to load (core.analysis.overview.LARGE_TRACE_ROWS): the replay page
    opens it from its overview."""
    from core.analysis import overview
    try:
        files = sorted(path.glob("*.parquet")) if path.is_dir() else [path]
        key = (str(path), file_version(files), overview.LARGE_TRACE_ROWS)
    except OSError:
        return False
    return _large(key)


@st.cache_data(show_spinner=False, max_entries=64)
def _large(key: tuple) -> bool:
    from core.analysis.overview import is_large
    return is_large(key[0])


def open_large_trace(path: Path):
    """(Overview or None, seconds its overview took to build in this process (None: it was there), error or
    None): once per file version."""
    try:
        files = sorted(path.glob("*.parquet")) if path.is_dir() else [path]
        identity = file_version(files)
    except OSError as e:
        return None, None, f"{path.name}: cannot open ({e.strerror})"
    return _overview(str(path), identity)
