"""Engine steps inferred from streamed token times, for traces that have none (a vLLM or
SGLang benchmark result with per-token gaps, a load generator's capture).

An engine emits the tokens of one iteration together: every request in the batch gets its
next token at the end of the step, and the server streams them out within a fraction of a
millisecond of each other, while steps last milliseconds. So the client's emission times,
pooled over requests and sorted, come in bursts, one burst per step that emitted tokens
(vLLM 0.32 CPU, the bundled tiny model: gaps inside a burst mostly < 0.3 ms, between bursts
> 1.5 ms). A burst's composition gives the step's batch: a request's first token means its
prompt was computed in that step (prefill of `prompt_tokens`), any later token a decode.
The time from one burst to the next is the duration of the step that produced the second,
when the engine went straight from one to the other.

Only steps whose duration is measured that way and whose batch is fully known are marked
`clean` and used for fitting: the step decodes at least one request that was also in the
previous burst (the engine was busy, not waiting for arrivals), its requests all arrived
before the previous burst, its new prompts fit the token budget and seats, and nothing
suggests a prompt computed in pieces over steps that emitted nothing for it (a request
waiting with seats and budget free, or a new request that was already waiting a step
earlier). Steps that emit nothing (a long prompt's earlier pieces) are invisible here.

Burst boundaries: a gap longer than `gap_ms` (default: a quarter of the median inter-token
gap, within [0.3, 3] ms), and a request's second token always opens a new burst. A clean step
also lasts longer than twice that gap (shorter ones are tokens the client received bunched).
"""
from __future__ import annotations

import dataclasses

import numpy as np
import pandas as pd

from core.config import SchedulerConfig
from core.errors import ConfigError
from core.fit.stepfit import MIN_STEPS, model_of, nnls_coefficients, solve, trace_features
from core.sim.stepmodel import StepModel
from core.trace import Trace

GAP_BOUNDS_MS = (0.3, 3.0)
TRIM_ROUNDS, TRIM_MADS = 3, 3.0    # fits drop steps off by > 3 robust standard deviations (at least 2% of a step)


def burst_gap_ms(t: np.ndarray, req: np.ndarray) -> float:
    """The gap (ms) separating bursts: a quarter of the median gap between a request's
    consecutive tokens (a step's time), kept within GAP_BOUNDS_MS."""
    order = np.lexsort((t, req))
    r, ts = req[order], t[order]
    same = r[1:] == r[:-1]
    itl = (ts[1:] - ts[:-1])[same]
    itl = itl[itl > 0]
    cut = 0.25 * float(np.median(itl)) if len(itl) else 1.0
    lo, hi = GAP_BOUNDS_MS
    return float(min(max(cut, lo), hi))


@dataclasses.dataclass
class InferredSteps:
    trace: Trace            # the input with inferred steps and batch (durations of unclean steps: best guess)
    clean: np.ndarray       # per step (trace.steps order): duration and batch fully measured
    gap_ms: float

    def describe(self) -> str:
        return (f"{len(self.clean)} steps inferred from streamed token times (bursts split at gaps "
                f"> {self.gap_ms:.2f} ms), {int(self.clean.sum())} measured cleanly")


def infer_steps(trace: Trace, config: SchedulerConfig, gap_ms: float | None = None) -> InferredSteps:
    """Steps and batch entries inferred from the trace's token times (see the module docstring);
    `config`: the engine's token budget and seats (None: unlimited)."""
    tk = trace.tokens
    if len(tk) < 2:
        raise ConfigError(f"{trace.label}: inferring steps needs streamed token times (has {len(tk)} tokens)")
    order = np.lexsort((tk["req"].to_numpy(), tk["t_ms"].to_numpy()))
    t = tk["t_ms"].to_numpy(dtype=float)[order]
    req = tk["req"].to_numpy()[order]
    idx = tk["index"].to_numpy()[order]
    gap = burst_gap_ms(t, req) if gap_ms is None else float(gap_ms)
    burst = _bursts(t, req, gap)
    nb = int(burst[-1]) + 1
    starts = np.flatnonzero(np.r_[True, burst[1:] != burst[:-1]])
    t_first = t[starts]
    prompt = trace.requests["prompt_tokens"].to_numpy(dtype=np.int64)
    arrival = trace.requests["arrival_ms"].to_numpy(dtype=float)
    first = idx == 0
    n_new = np.bincount(burst, weights=first, minlength=nb)
    n_dec = np.bincount(burst, weights=~first, minlength=nb)
    new_tokens = np.bincount(burst, weights=np.where(first, prompt[req], 0), minlength=nb)
    # the burst of each request's previous token (-1: none)
    prev = np.full(len(t), -1)
    by_req = np.lexsort((idx, req))
    same = np.r_[False, req[by_req][1:] == req[by_req][:-1]]
    prev[by_req[same]] = burst[by_req][np.flatnonzero(same) - 1]
    continued = np.bincount(burst, weights=(~first) & (prev == burst - 1), minlength=nb)
    late_arrival = np.zeros(nb, dtype=bool)      # a new request sent after the previous burst
    early_new = np.zeros(nb, dtype=bool)         # a new request already waiting a burst earlier
    k_new = burst[first]
    a_new = arrival[req[first]]
    late_arrival[k_new[(k_new == 0) | (a_new > t_first[np.maximum(k_new - 1, 0)])]] = True
    early_new[k_new[(k_new >= 2) & (a_new <= t_first[np.maximum(k_new - 2, 0)])]] = True
    # a request waiting during burst k's step (sent before burst k-1) whose first token comes later
    first_burst = np.full(len(prompt), nb)
    first_burst[req[first]] = burst[first]
    sent_burst = np.searchsorted(t_first, arrival, side="left")      # first burst after its send
    budget = config.token_budget or np.inf
    seats = config.max_seqs or np.inf
    full = (n_dec + n_new >= seats) | (n_dec + new_tokens >= budget)
    waiting_free = np.zeros(nb, dtype=bool)
    for r in range(len(prompt)):        # requests: few (a benchmark run), so a loop is fine
        if first_burst[r] == nb:        # never emitted (failed, or no output): it tells nothing
            continue
        lo, hi = sent_burst[r] + 1, first_burst[r]
        if hi > lo:
            ks = np.arange(lo, hi)
            waiting_free[ks[~full[ks]]] = True
    clean = np.zeros(nb, dtype=bool)
    clean[1:] = ((n_dec[1:] > 0) & (continued[1:] == n_dec[1:]) & ~late_arrival[1:] & ~early_new[1:]
                 & ~waiting_free[1:] & (n_dec[1:] + new_tokens[1:] <= budget) & (n_dec[1:] + n_new[1:] <= seats))
    dur = np.r_[np.nan, np.diff(t_first)]
    clean[1:] &= dur[1:] > 2 * gap
    start = t_first - np.nan_to_num(dur, nan=0.0)
    steps = pd.DataFrame({"t_ms": start, "step": np.arange(nb, dtype=np.int64), "dur_ms": np.nan_to_num(dur, nan=0.0),
                          "running": (n_dec + n_new).astype(np.int64), "waiting": -1, "kv_used_blocks": -1,
                          "kv_free_blocks": -1})
    batch = pd.DataFrame({"step": burst.astype(np.int64), "req": req.astype(np.int64),
                          "kind": pd.Categorical(np.where(first, "prefill", "decode"),
                                                 categories=["decode", "prefill"]),
                          "tokens": np.where(first, prompt[req], 1).astype(np.int64)})
    out = dataclasses.replace(trace, steps=steps, batch=batch.sort_values(["step", "req"], kind="stable")
                              .reset_index(drop=True), kv=trace.kv.iloc[:0], preempts=trace.preempts.iloc[:0],
                              meta={**trace.meta, "steps_inferred": True})
    return InferredSteps(out, clean, gap)


def _bursts(t: np.ndarray, req: np.ndarray, gap: float) -> np.ndarray:
    """Burst number of each emission (sorted by time): a new burst after a gap > `gap`, or when
    a request already in the current burst emits again."""
    b = np.empty(len(t), dtype=np.int64)
    k = 0
    seen: set = set()
    for i in range(len(t)):
        if i and (t[i] - t[i - 1] > gap or int(req[i]) in seen):
            k += 1
            seen = set()
        seen.add(int(req[i]))
        b[i] = k
    return b


def fit_inferred(traces, config: SchedulerConfig, model: str = "features",
                 gap_ms: float | None = None) -> tuple[StepModel, dict]:
    """A step model fitted by non-negative least squares to the clean inferred steps of one or
    more traces of the same engine and settings, and its report."""
    traces = traces if isinstance(traces, list) else [traces]
    Xs, ys, notes = [], [], []
    for tr in traces:
        inf = infer_steps(tr, config, gap_ms)
        steps, X, y = trace_features(inf.trace)
        keep = inf.clean[steps]
        Xs.append(X[keep])
        ys.append(y[keep])
        notes.append(f"{tr.label}: {inf.describe()}")
    X, y = np.vstack(Xs), np.concatenate(ys)
    if len(y) < MIN_STEPS:
        raise ConfigError(f"fit: {len(y)} steps could be measured from the token times (need {MIN_STEPS}); "
                          + "; ".join(notes))
    keep = np.ones(len(y), dtype=bool)
    for _ in range(TRIM_ROUNDS):     # steps slowed by something else (the OS, the server's other work)
        full = nnls_coefficients(X[keep], y[keep], model)
        res = y - X @ full
        spread = max(1.4826 * float(np.median(np.abs(res[keep] - np.median(res[keep])))), 0.02 * float(np.median(y)))
        nxt = np.abs(res) <= TRIM_MADS * spread
        if nxt.sum() < MIN_STEPS:
            break
        keep = nxt
    full, quality = solve(X[keep], y[keep], model)
    return model_of(model, full), {"model": model, "method": "steps inferred from token times", **quality,
                                   "notes": notes}


def closed_loop_clients(trace: Trace) -> int | None:
    """The number of clients of a closed-loop benchmark run (vLLM's `bench serve` with request
    rate inf and a max concurrency: a request is sent whenever one finishes), from the
    imported file's settings, or from its `load` (AIPerf's concurrency phase, a vllm bench sweep's
    point: {"kind": "closed", "concurrency": C}); None for any other run."""
    load = trace.meta.get("load") or {}
    if load.get("kind") == "closed" and isinstance(load.get("concurrency"), int) and load["concurrency"] > 0:
        return int(load["concurrency"])
    engine = trace.meta.get("engine") or {}
    rate, clients = engine.get("request_rate"), engine.get("max_concurrency")
    closed = rate in ("inf", float("inf")) or (isinstance(rate, float) and np.isinf(rate))
    return int(clients) if closed and isinstance(clients, int) and clients > 0 else None
