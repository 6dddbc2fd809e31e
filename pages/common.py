"""Helpers shared by pages: cached loads, scenario presets, small formatting.
No math here: every number comes from core."""
import math
from pathlib import Path

import pandas as pd
import streamlit as st

from core.errors import InputError
from core.scenarios import Limits, load_scenario, run_policies
from core.simulate import StepModel
from core.trace import Trace, load_trace
from core.workload import Workload, parse_workload

DATA = Path(__file__).resolve().parent.parent / "data"
ORIGIN_COLORS = {"given": "blue", "simulated": "orange", "measured": "green", "imported": "violet"}
UPLOAD_LIMIT_MB = 200

# Short labels (they appear in shareable URLs) for the built-in scenarios.
SCENARIO_LABELS = {"Chapter 31": "chapter31", "Burst 5": "burst5", "Shared prefix": "shared_prefix",
                   "Poisson 2000": "poisson2000", "Custom": "custom", "Upload": "upload"}

# Scenario presets for the schedule controls, applied when the user switches scenario.
# The widgets' declared defaults are the chapter's, so a shared link stays exact.
SCHEDULE_PRESETS = {
    "chapter31": dict(pol=["serial", "static", "continuous", "chunked"], ms=0, tb=0, ch=2, kb=0, s_kind="affine", s_step=10.0, s_base=20.0, s_pp=20.0, s_pd=20.0),
    "burst5": dict(pol=["static", "continuous"], ms=3, tb=0, ch=4, kb=0, s_kind="constant", s_step=1.0, s_base=20.0, s_pp=20.0, s_pd=20.0),
    "shared_prefix": dict(pol=["static", "continuous", "chunked"], ms=32, tb=2048, ch=512, kb=0, s_kind="affine", s_step=10.0, s_base=5.0, s_pp=0.05,
                          s_pd=0.25),
    "poisson2000": dict(pol=["continuous", "chunked"], ms=256, tb=8192, ch=512, kb=0, s_kind="affine", s_step=10.0, s_base=5.0, s_pp=0.02,
                        s_pd=0.05),
    "custom": dict(pol=["serial", "static", "continuous", "chunked"], ms=0, tb=0, ch=2, kb=0, s_kind="affine", s_step=10.0, s_base=20.0, s_pp=20.0, s_pd=20.0),
    "upload": dict(pol=["continuous", "chunked"], ms=64, tb=4096, ch=512, kb=0, s_kind="affine", s_step=10.0, s_base=5.0, s_pp=0.02, s_pd=0.1),
}


def apply_presets_on_change(selector_key: str, presets: dict):
    """When the user changes a scenario selector, load that scenario's control presets.
    Not on the first run: a link's own query parameters must win."""
    prev_key = f"_prev_{selector_key}"
    cur = st.session_state.get(selector_key)
    prev = st.session_state.get(prev_key)
    if prev is not None and cur != prev and cur in presets:
        for k, v in presets[cur].items():
            st.session_state[k] = v
    st.session_state[prev_key] = cur


@st.cache_resource
def chapter_traces() -> dict[str, Trace]:
    return {name: load_trace(DATA / "traces" / f"chapter31_{name}.json") for name in ("serial", "continuous")}


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


def _workload_key(w: Workload) -> str:
    return repr([(r.id, r.arrival_ms, r.prompt_tokens, r.output_tokens, r.prompt_ids, r.tenant, r.abort_at_ms)
                 for r in w.requests])


@st.cache_resource(show_spinner="Simulating…", max_entries=32)  # traces are shared, never mutated
def _policies(_w: Workload, wkey: str, policies: tuple, lim_key: str, sm_key: str, _lim: Limits, _sm: StepModel):
    return run_policies(_w, list(policies), _lim, _sm, created="(app)")


def cached_policies(w: Workload, policies: tuple, lim: Limits, sm: StepModel):
    return _policies(w, _workload_key(w), policies, repr(lim), repr(sm), lim, sm)


def step_model_controls(prefix: str = "s") -> StepModel:
    """Sidebar widgets for the step-time model (bound to the URL)."""
    kind = st.segmented_control("Step-time model", ["constant", "affine", "roofline"], default="affine",
                                required=True, key=f"{prefix}_kind", bind="query-params")
    if kind == "constant":
        step = st.number_input("ms per step", 0.001, 1e6, 10.0, key=f"{prefix}_step", bind="query-params")
        return StepModel("constant", step_ms=step)
    base = st.number_input("base ms per step", 0.0, 1e6, 20.0, key=f"{prefix}_base", bind="query-params")
    if kind == "affine":
        pp = st.number_input("ms per prefill token", 0.0, 1e6, 20.0, key=f"{prefix}_pp", bind="query-params",
                             format="%.4f")
        pd_ = st.number_input("ms per decoding sequence", 0.0, 1e6, 20.0, key=f"{prefix}_pd", bind="query-params",
                              format="%.4f")
        try:
            return StepModel("affine", base_ms=base, prefill_ms_per_token=pp, decode_ms_per_seq=pd_)
        except InputError as e:
            st.error(f"Step model: {e}")
            st.stop()
    from core.kv import GPUS, MODELS
    model = st.selectbox("Model preset", list(MODELS), key=f"{prefix}_model", bind="query-params")
    gpu = st.selectbox("GPU preset", list(GPUS), index=list(GPUS).index("A100-80GB"), key=f"{prefix}_gpu",
                       bind="query-params")
    return StepModel("roofline", base_ms=base, model=model, gpu=gpu)


def origin_badge(trace: Trace) -> str:
    src = trace.meta.get("source", "?")
    extra = ""
    if src in ("measured", "imported"):
        engine = trace.meta.get("engine", {})
        name = engine.get("name", "?") if isinstance(engine, dict) else str(engine)
        extra = f" {trace.meta.get('device', '?')}, {name}, {trace.meta.get('created', '?')}"
    return f":{ORIGIN_COLORS.get(src, 'gray')}-badge[{src}{extra}]"


def fmt_ms(x) -> str:
    return "—" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:,.3f}".rstrip("0").rstrip(".")


def request_table(summary: dict) -> pd.DataFrame:
    """Per-request metrics for display; a missing TPOT shows as an em dash, never 0."""
    rows = [{"request": r["id"], "arrival ms": r["arrival_ms"], "TTFT ms": r["ttft_ms"],
             "TPOT ms": "—" if r["tpot_ms"] is None else f"{r['tpot_ms']:g}",
             "E2E ms": r["e2e_ms"], "tokens": r["output_tokens"]} for r in summary["requests"]]
    return pd.DataFrame(rows)


@st.cache_resource(show_spinner=False)
def _bundled_traces() -> dict:
    out = {}
    for p in sorted((DATA / "traces").glob("*.json*")):
        try:
            out[p.name] = load_trace(p)
        except InputError:
            continue
    return out


def tile_traces() -> dict:
    """Bundled traces with `tiles` events: name -> (trace, tile event dicts)."""
    return {n: (tr, [e for e in tr.other if e.get("type") == "tiles"])
            for n, tr in _bundled_traces().items() if any(e.get("type") == "tiles" for e in tr.other)}


def spec_traces() -> dict:
    """Bundled traces with `spec` events: name -> (positions, acceptance rates, counts)."""
    from core.speculative import acceptance_by_position
    return {n: acceptance_by_position([e for e in tr.other if e.get("type") == "spec"])
            for n, tr in _bundled_traces().items() if any(e.get("type") == "spec" for e in tr.other)}


@st.cache_resource(show_spinner=False, max_entries=16)
def _occupancy(_tr: Trace, key: str, max_snapshots: int):
    from core.occupancy import replay
    return replay(_tr, max_snapshots=max_snapshots)


def cached_occupancy(w: Workload, lim: Limits, sm: StepModel, trace: Trace, max_snapshots: int = 160):
    return _occupancy(trace, _workload_key(w) + repr(lim) + repr(sm), max_snapshots)


# ---- trace files for the replay page ------------------------------------------------------
TRACE_SUFFIXES = (".json", ".json.gz", ".parquet")


def trace_files() -> dict[str, Path]:
    """Bundled traces (data/traces), engine result files (data/imports), and any files or
    directories listed in SERVING_EXPLORER_TRACES (os.pathsep-separated)."""
    import os
    roots = [DATA / "traces", DATA / "imports"]
    extra = os.environ.get("SERVING_EXPLORER_TRACES", "")
    roots += [Path(p) for p in extra.split(os.pathsep) if p]
    out: dict[str, Path] = {}
    for root in roots:
        files = [root] if root.is_file() else sorted(root.glob("*")) if root.is_dir() else []
        for f in files:
            if f.name.endswith(TRACE_SUFFIXES):
                out.setdefault(f.name, f)
    return out


@st.cache_resource(show_spinner="Loading trace…", max_entries=8)
def _load_file(path: str, mtime: float):
    from core.importers import Imported, load_any
    from core.trace import is_parquet, trace_from_parquet
    data = Path(path).read_bytes()
    try:
        got = trace_from_parquet(data, Path(path).name) if is_parquet(data) else load_any(data, Path(path).name)
    except InputError as e:
        return None, None, str(e)
    if isinstance(got, Imported):
        return got.trace, got, None
    return got, None, None


def load_trace_file(path: Path):
    """(trace or None, Imported or None, error or None), parsed once per file version."""
    return _load_file(str(path), path.stat().st_mtime)


@st.cache_resource(show_spinner="Parsing upload…", max_entries=4)
def _parse_upload_trace(file_id: str, name: str, _data: bytes):
    from core.importers import Imported, load_any
    from core.trace import is_parquet, trace_from_parquet
    try:
        got = trace_from_parquet(_data, name) if is_parquet(_data) else load_any(_data, name)
    except InputError as e:
        return None, None, str(e)
    if isinstance(got, Imported):
        return got.trace, got, None
    return got, None, None


def parse_uploaded_trace(up):
    """Parse an uploaded trace once per upload (keyed by the upload's id)."""
    if up.size > UPLOAD_LIMIT_MB * 2**20:
        return None, None, f"{up.name}: {up.size / 2**20:.1f} MiB is over the {UPLOAD_LIMIT_MB} MiB limit"
    return _parse_upload_trace(up.file_id, up.name, up.getvalue())


@st.cache_resource(show_spinner="Simulating the same workload…", max_entries=8)
def predicted_trace(_trace: Trace, key: str):
    """The trace's workload through the core simulator with an affine step model fitted to
    the trace's own step durations, under the trace's engine limits when recorded."""
    from core.scheduler import SchedulerConfig
    from core.simulate import fit_affine, simulate
    sm = fit_affine(_trace)
    eng = _trace.meta.get("engine") if isinstance(_trace.meta.get("engine"), dict) else {}
    fields = {k: eng.get(k) for k in ("max_seqs", "token_budget", "chunk", "kv_blocks") if eng.get(k)}
    cfg = SchedulerConfig(policy=eng.get("policy") if eng.get("policy") in ("serial", "static", "continuous")
                          else "continuous", block_size=int(eng.get("block_size") or 16),
                          prefix_caching=bool(eng.get("prefix_caching")), **fields)
    return simulate(_trace.workload(), cfg, sm, label=f"predicted for {_trace.label}", created="(app)")


@st.cache_resource(show_spinner=False, max_entries=16)
def _derived(_tr: Trace, key: str, what: str):
    from core.metrics import request_metrics, summarize
    from core.replay import in_flight_series
    return {"summary": lambda: summarize(_tr), "requests": lambda: request_metrics(_tr),
            "in_flight": lambda: in_flight_series(_tr)}[what]()


def derived(tr: Trace, key: str, what: str):
    """Per-trace results that do not depend on the cursor, computed once per trace."""
    return _derived(tr, key, what)
