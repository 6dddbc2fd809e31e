"""A CPU engine's wake-up cost, measured from a run: the first step after the engine sat idle takes
longer than the same step in a busy stretch, the more so the longer the pause (vLLM's CPU build on
this machine: a 96-token prefill logged at 5.4 ms between decodes and 8.1-8.6 ms after the engine
sat idle; its requests' prefill span rises from 6.3 ms after a 3-10 ms pause to 9.0-9.3 ms after
300 ms and more, docs/fidelity.md). The step model carries it as
wake_ms x (1 - exp(-idle / wake_tau_ms)) added to a step that starts after `idle` ms without one
(core.sim.stepmodel).

`fit_wake` finds it from what the fit runs' own requests show: each run (its engine core's view)
is simulated with the step model fitted so far; every request's measured TTFT less its simulated
TTFT is one residual, and the residuals are fitted as c + wake_ms x (1 - exp(-idle / tau)), where
idle is how long the simulated engine had sat idle before the request's first step (0 for a
request that joined a busy engine) and c what the cycle's other terms still owe (left to them:
core.fit.reqfit.fit_added_terms fits them next). Soft-L1 loss (a few stalled requests weigh as their
error, not its square); tau from a grid, then refined between the grid's neighbours. A run with
fewer than MIN_IDLE_STARTS requests that found the engine idle (a closed loop) cannot tell: no
wake term, and the report says so.
"""
from __future__ import annotations

import dataclasses

import numpy as np

from core.sim.stepmodel import StepModel

MIN_IDLE_STARTS = 8
TAUS = np.geomspace(1.0, 3000.0, 49)     # ms: the grid the time constant is searched on first
IDLE_CAP_MS = 1e6                       # an engine's first step (idle inf) counts as idle this long
SCALE_MS = 1.0                          # soft-L1 scale of a residual (ms)


def idle_before(steps) -> np.ndarray:
    """Per step of one engine (its steps table, in time order): how long the engine had sat idle
    since its previous step ended (0 if none; IDLE_CAP_MS for its first step)."""
    t = steps["t_ms"].to_numpy(dtype=float)
    end = t + steps["dur_ms"].to_numpy(dtype=float)
    idle = np.empty(len(t))
    if len(t):
        idle[0] = IDLE_CAP_MS
        idle[1:] = np.maximum(t[1:] - end[:-1], 0.0)
    return idle


MIN_FIRST_USES = 8   # steps of a size run for the first time needed to price a first use


def first_uses(sizes) -> np.ndarray:
    """Per step of one engine (in time order), whether its batch size (`sizes`: tokens per step)
    is one the engine had not run before: the steps that pay StepModel.shape_ms."""
    sizes = np.asarray(sizes)
    out = np.zeros(len(sizes), dtype=bool)
    if len(sizes):
        _, first = np.unique(sizes, return_index=True)
        out[first] = True
    return out


def first_step_idle(sim) -> dict:
    """Request id -> how long the engine had sat idle before the step that first ran it (0: it
    joined a running engine; IDLE_CAP_MS: the engine's first step), from a simulated trace."""
    st, b = sim.steps, sim.batch
    if not len(st) or not len(b):
        return {}
    idle = idle_before(st)
    at = {int(s): i for i, s in enumerate(st["step"].to_numpy())}
    first = b.groupby("req")["step"].min()
    ids = sim.requests["id"].to_numpy()
    return {ids[int(r)]: float(idle[at[int(s)]]) for r, s in first.items() if int(s) in at}


def _shape(idle: np.ndarray, tau: float) -> np.ndarray:
    return -np.expm1(-idle / tau)


def _solve(resid: np.ndarray, idle: np.ndarray, tau: float,
           extra: np.ndarray | None = None) -> tuple[float, float, float, float]:
    """(c, wake_ms >= 0, soft-L1 cost, extra's coefficient >= 0) for one tau, by iteratively
    reweighted least squares; `extra`: a 0/1 column priced beside the wake-up (first uses)."""
    cols = [np.ones_like(resid), _shape(idle, tau)] + ([extra.astype(float)] if extra is not None else [])
    A = np.column_stack(cols)
    w = np.ones_like(resid)
    coef = np.zeros(A.shape[1])
    coef[0] = float(np.median(resid))
    for _ in range(20):
        sw = np.sqrt(w)
        keep = list(range(A.shape[1]))
        while True:   # non-negative terms: a negative one is dropped and the rest solved again
            sol = np.linalg.lstsq(A[:, keep] * sw[:, None], resid * sw, rcond=None)[0]
            neg = [j for j, v in zip(keep[1:], sol[1:]) if v < 0]
            if not neg:
                break
            keep = [j for j in keep if j not in neg]
        coef = np.zeros(A.shape[1])
        coef[keep] = sol
        r = resid - A @ coef
        w = (1 + (r / SCALE_MS) ** 2) ** -0.5
    r = resid - A @ coef
    cost = float(np.sum(2 * SCALE_MS ** 2 * (np.sqrt(1 + (r / SCALE_MS) ** 2) - 1)))
    return float(coef[0]), float(coef[1]), cost, float(coef[2]) if extra is not None else 0.0


def fit_curve(resid: np.ndarray, idle: np.ndarray, extra: np.ndarray | None = None):
    """(c, wake_ms >= 0, tau) of resid ~ c + wake_ms x (1 - exp(-idle / tau)), soft-L1: tau on the
    TAUS grid, then refined between the best one's neighbours. With `extra` (a 0/1 column per
    residual: the steps that ran a batch size for the first time), its cost is fitted beside the
    wake-up and returned fourth: (c, wake_ms, tau, extra_ms >= 0)."""
    resid, idle = np.asarray(resid, dtype=float), np.asarray(idle, dtype=float)
    best = min((_solve(resid, idle, float(tau), extra) + (float(tau),) for tau in TAUS), key=lambda s: s[2])
    j = int(np.searchsorted(TAUS, best[4]))
    for t in np.geomspace(TAUS[max(j - 1, 0)], TAUS[min(j + 1, len(TAUS) - 1)], 17):
        got = _solve(resid, idle, float(t), extra)
        if got[2] < best[2]:
            best = got + (float(t),)
    return (best[0], best[1], best[4]) if extra is None else (best[0], best[1], best[4], best[3])


def fit_wake(views, configs, sm: StepModel) -> tuple[StepModel, dict]:
    """`sm` with the wake-up terms the runs (each its engine core's view: core.fit.calibrate.
    engine_view, simulated under its config) show, and a report: the terms, how many requests found
    the engine idle and the pauses seen (the range the term was fitted on), or why none was fitted."""
    from core.analysis.metrics import request_metrics
    from core.sim.simulate import simulate
    resid, idle = [], []
    base = dataclasses.replace(sm, wake_ms=0.0)
    for view, cfg in zip(views, configs):
        sim = simulate(view.workload(), cfg, base, record_kv=False)
        gap = first_step_idle(sim)
        got = request_metrics(sim).set_index("id")["ttft_ms"]
        want = request_metrics(view).set_index("id")["ttft_ms"]
        for i, v in want.items():
            if i in gap and i in got.index and np.isfinite(v) and np.isfinite(got[i]):
                resid.append(float(v) - float(got[i]))
                idle.append(gap[i])
    resid, idle = np.asarray(resid), np.asarray(idle)
    starts = idle > 0
    seen = idle[starts & (idle < IDLE_CAP_MS)]
    report = {"idle_starts": int(starts.sum()), "requests": int(len(idle)),
              "idle_range_ms": [float(seen.min()), float(seen.max())] if len(seen) else None}
    if starts.sum() < MIN_IDLE_STARTS:
        return base, {**report, "wake_ms": 0.0,
                      "why": f"{int(starts.sum())} requests found the engine idle (fewer than {MIN_IDLE_STARTS}): "
                             "the wake-up cost is not separable, 0"}
    c, k, tau = fit_curve(resid, idle)
    if k <= 0:
        return base, {**report, "wake_ms": 0.0, "why": "the requests that found the engine idle were not slower"}
    return (dataclasses.replace(sm, wake_ms=k, wake_tau_ms=tau),
            {**report, "wake_ms": k, "wake_tau_ms": tau, "offset_ms": c})
