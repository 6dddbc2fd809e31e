"""The bundled real vLLM runs (data/imports/vllm_telemetry: vLLM 0.32.0's CPU build serving the
tiny byte model, its own iteration log, spans, KV events and /metrics) as workloads and engine
settings the simulator can replay: the same prompts (dataset.jsonl, sent in file order:
`vllm bench serve --disable-shuffle`), arriving when vLLM's front-end received them (the
spans' start), under the server's flags (scripts/serve.sh)."""
from __future__ import annotations

import dataclasses
import re
from functools import lru_cache
from pathlib import Path

from core.config import SchedulerConfig
from core.errors import InputError
from core.trace import open_trace
from core.workload import Workload

ROOT = Path(__file__).resolve().parents[2] / "data" / "imports" / "vllm_telemetry"
RUNS = {"run1_c4_p128_o32": "run 1: 48 requests, 4 at a time, 128-token prompts (96 shared), 32 out",
        "run2_poisson4_p192_o48": "run 2: 48 requests, Poisson 4/s, 192-token prompts (128 shared), 48 out"}
# vllm serve ... --max-num-seqs 16 --max-num-batched-tokens 2048 --block-size 32 --enable-prefix-caching
#   --num-gpu-blocks-override 64   (scripts/serve.sh)
VLLM_CONFIG = SchedulerConfig(policy="vllm-v1", max_seqs=16, token_budget=2048, block_size=32, kv_blocks=64,
                              prefix_caching=True, kv_manager="vllm-v1")


def bundled_runs() -> list[str]:
    """The bundled real runs' folder names, in order (run1 ... run9)."""
    return sorted((p.name for p in ROOT.iterdir() if p.is_dir() and p.name.startswith("run")),
                  key=lambda n: int(re.match(r"run(\d+)", n).group(1)))


# runs of bench/vllm_repeats.sh: each workload repeated on one server start (data/imports/vllm_repeats),
# named "<session>/<workload>_r<round>"; their flags are in the session's server_start.log
REPEATS = ROOT.parent / "vllm_repeats"


def repeat_runs() -> list[str]:
    """The bundled repeated runs, by session then name."""
    if not REPEATS.is_dir():
        return []
    return [f"{s.name}/{r.name}" for s in sorted(REPEATS.iterdir()) if s.is_dir()
            for r in sorted(s.iterdir()) if r.is_dir()]


def session_date(session: str) -> str | None:
    """The UTC date a bundled repeat session's server started (its session.json's first mark), as
    YYYY-MM-DD; None when the file says nothing readable."""
    import datetime
    import json
    try:
        marks = json.loads((REPEATS / session / "session.json").read_text())["marks_ns"]
        first = min(int(v) for v in marks.values())
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return datetime.datetime.fromtimestamp(first / 1e9, datetime.UTC).strftime("%Y-%m-%d")


def _workload_of(name: str) -> str:
    return re.sub(r"_r\d+$", "", name)


def repeats_of(name: str) -> list[str]:
    """The repeated runs of `name`'s workload on its server start (itself included); [] for a run
    that has none."""
    if name not in repeat_runs():
        return []
    return [n for n in repeat_runs() if n.split("/")[0] == name.split("/")[0] and _workload_of(n) == _workload_of(name)]


@lru_cache(maxsize=32)
def run_floor(name: str):
    """The repeat floor (core.fit.noise.repeat_floor) of `name`'s workload on its server start, or
    None for a run without repeats."""
    from core.fit.noise import repeat_floor
    runs = repeats_of(name)
    return repeat_floor([bundled_run(n) for n in runs]) if len(runs) >= 2 else None


@lru_cache(maxsize=1)
def floor_range() -> dict | None:
    """Over every bundled repeated workload (each session's): the lowest and highest repeat floor,
    {metric: (lo, hi)} of the per-request medians; None without repeats. For a run made once."""
    names = {repeats_of(n)[0] for n in repeat_runs()}
    floors = [f for f in (run_floor(n) for n in sorted(names)) if f is not None]
    if not floors:
        return None
    return {m: (min(f[m]["p50"] for f in floors), max(f[m]["p50"] for f in floors)) for m in ("ttft_ms", "e2e_ms")}


@lru_cache(maxsize=32)
def request_floor(name: str) -> dict:
    """Per request of the repeated run `name`: the median over its other repeats of |theirs - its| /
    its (TTFT and E2E): how far a repeat came from this very request. {id: {metric: ratio}}."""
    from core.fit.noise import request_floor as per_request
    others = [bundled_run(n) for n in repeats_of(name) if n != name]
    return per_request(bundled_run(name), others) if others else {}


# the runner's own bundled capture with enough requests and steps to fit and predict (data/traces)
RUNNER_CAPTURES = {"runner: shared_prefix_measured_cpu": "shared_prefix_measured_cpu.json.gz"}


@lru_cache(maxsize=16)
def bundled_run(name: str):
    """A bundled run read as `python -m core fidelity` reads a run directory (core.fit.runs); run2's
    log starts mid-server (cut from run1's), so it takes run1's flags (the same server). Or one of
    RUNNER_CAPTURES (a trace of our runner: its flags in its metadata)."""
    from core.fit.runs import load_run, server_log_flags
    if name in RUNNER_CAPTURES:
        return load_run(ROOT.parents[1] / "traces" / RUNNER_CAPTURES[name])
    if name in repeat_runs():          # (its log is cut into runs: the flags from its server's start-up lines)
        session = REPEATS / name.split("/")[0]
        run = load_run(REPEATS / name, server_log_flags(session / "server_start.log"))
        run.name = name
        run.notes = [n for n in run.notes if "no engine flags" not in n and not n.startswith("not read: client_")]
        return run
    if name not in bundled_runs():
        raise InputError(f"run: expected one of {', '.join(bundled_runs())}, got {name!r}")
    return load_run(ROOT / name, VLLM_CONFIG if name in RUNS else None)


def run_dir(run: str) -> Path:
    if run not in RUNS:
        raise InputError(f"run: expected one of {', '.join(RUNS)}, got {run!r}")
    return ROOT / run


def run_workload(run: str) -> Workload:
    """The run's requests as vLLM's engine saw them: prompt ids (the byte model's tokens of the
    dataset's prompts), output lengths and arrivals at its front-end (span starts, ms from the
    first); read as every run directory is (core.fit.runs: the warm-up's requests left out)."""
    run_dir(run)
    w = bundled_run(run).workload
    return Workload(w.requests, name=RUNS[run])


def engine_view(run: str):
    """vLLM's own per-request TTFT and E2E of the run (its spans), indexed by request id."""
    from core.analysis.metrics import request_metrics
    m = request_metrics(open_trace(run_dir(run) / "spans.otlp.jsonl").trace).set_index("id")
    return m.loc[[r.id for r in run_workload(run).requests]]


def calibrated_step_model(run: str):
    """An affine step model fitted to the run's own iteration log, plus the time per step the
    log leaves out: its "iteration elapsed time" covers the forward pass; the engine's cycle
    (scheduling, sampling, output processing) is longer. The missing part is the median decode
    time per output token in the run's spans minus the median logged decode-only step."""
    import numpy as np

    from core.analysis.metrics import request_metrics
    from core.fit.stepfit import fit
    d = run_dir(run)
    log = open_trace(d / "server.log").trace
    sm, report = fit(log, "affine")
    spans = open_trace(d / "spans.otlp.jsonl").trace
    ids = {r.id for r in run_workload(run).requests}
    n = request_metrics(spans)["output_tokens"].to_numpy()
    per = [e["engine_decode_ms"] / (k - 1) for rid, e, k in zip(spans.ids, spans.request_extra, n)
           if rid in ids and k > 1 and "engine_decode_ms" in e]
    st = log.steps
    logged = float(st[(st["prefill_reqs"] == 0) & (st["decode_reqs"] > 0)]["dur_ms"].median())
    extra = max(float(np.median(per)) - logged, 0.0)
    return dataclasses.replace(sm, base_ms=sm.base_ms + extra), {**report, "overhead_ms": extra,
                                                                 "logged_decode_step_ms": logged}


@lru_cache(maxsize=2)
def real_and_simulated_cache(run: str = "run2_poisson4_p192_o48", fit_run: str = "run1_c4_p128_o32"):
    """The engine's own prefix cache over the run (its KV events) and the simulator's block cache
    of the same workload under the same flags (VLLM_CONFIG; step model: calibrated_step_model of
    `fit_run`), both on the workload's clock (ms from the first request's arrival at the engine).
    Returns (real, simulated, notes)."""
    from core.analysis.kv_events import cache_over_time, simulated_cache_over_time
    from core.sim.simulate import simulate
    d = run_dir(run)
    kv = open_trace(d / "kv_events.jsonl").trace
    spans = open_trace(d / "spans.otlp.jsonl").trace
    w = run_workload(run)
    first = min(r.id for r in w.requests[:1])
    k = spans.ids.index(first)
    t0_epoch = spans.meta["clock"]["t0_s"] + float(spans.requests["arrival_ms"].iloc[k]) / 1000.0
    real = cache_over_time(kv.kv_events)
    real["t_ms"] = real["t_ms"] + (kv.meta["clock"]["t0_s"] - t0_epoch) * 1000.0
    sm, report = calibrated_step_model(fit_run)
    sim = simulate(w, VLLM_CONFIG, sm, label=f"{RUNS[run]} (simulated)")
    notes = [f"simulated with vLLM's flags ({VLLM_CONFIG.max_seqs} sequences, {VLLM_CONFIG.token_budget}-token "
             f"steps, {VLLM_CONFIG.block_size}-token blocks, a pool of {VLLM_CONFIG.kv_blocks}, prefix caching) and a "
             f"step model fitted to {fit_run}'s own iteration log ({sm.describe()}; {report['overhead_ms']:.3f} ms per "
             "step added for what the log's elapsed time leaves out, from that run's spans), the vllm-v1 KV "
             "manager"]
    plain = simulate(w, dataclasses.replace(VLLM_CONFIG, kv_manager="keep-cached"), sm).kv["op"].value_counts()
    notes.append(f"with the simulator's default KV manager (keep-cached: prompt blocks only, cached when computed, "
                 f"no null block) the same run stores {int(plain.get('cache', 0))} blocks and evicts "
                 f"{int(plain.get('evict', 0))}")
    return real, simulated_cache_over_time(sim.kv), sim, notes
