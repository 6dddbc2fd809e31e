"""Fit a step model to request-level measurements: for traces without step events (a vLLM or
SGLang benchmark result with send times, a load generator's capture), find the step time
under which the simulator, replaying the measured workload (send times, prompt and output
lengths) through the engine's stated scheduler settings, reproduces each request's measured
TTFT and E2E best: the loss is the mean squared log ratio predicted / measured of each (a
relative error, so a long request does not outweigh a short one, and symmetric: twice too
slow costs what half too fast does).

Method: first a global search (scipy.optimize.differential_evolution) over the affine
coefficients, since the loss is rough (a small change of step time reorders who is batched
with whom, and each request's latency jumps), refined by Nelder-Mead; then a polish by linear
fits, which also sets the features model's other coefficients: for a given
schedule, every step's end is the
start of its busy period (an arrival the engine was idle for) plus the sum of the durations
of the steps before it in that period, and a duration is linear in the step model's
coefficients (core.sim.stepmodel.FEATURES). So each request's predicted TTFT and E2E are linear
in the coefficients, and non-negative least squares (scipy.optimize.nnls) of the relative errors (to first order the
log ratios) gives the best coefficients for that schedule. Simulating with them may change the schedule (who is batched
with whom, where the engine idles), so the step towards them is damped (Gauss-Newton with a
backtracking line search): it is taken only as far as the actual simulation's loss falls, and
the iteration stops when no step helps or the coefficients stop moving. Each try is one
simulation of the whole workload.
"""
from __future__ import annotations

import dataclasses

import numpy as np

from core.analysis.metrics import request_metrics
from core.config import SchedulerConfig
from core.errors import ConfigError
from core.fit.stepfit import MODELS, feature_range, identifiability, model_of, nnls_coefficients, trace_features
from core.sim.simulate import simulate, token_span_ms
from core.sim.stepmodel import FEATURE_COEFFICIENTS, FEATURES, StepModel

MIN_REQUESTS = 4
MAX_REQUESTS = 20_000     # each evaluation simulates them all
FLOOR_MS = 1e-6           # coefficients are searched in log space; this is "zero"


def _measured(trace):
    m = request_metrics(trace)
    ok = np.isfinite(m["ttft_ms"].to_numpy()) & np.isfinite(m["e2e_ms"].to_numpy()) & (m["ttft_ms"].to_numpy() > 0)
    return m, ok


def _linearised(sim, ids, arrival):
    """Rows A (requests x FEATURES) and offsets d with TTFT = A_t c + d_t and E2E = A_e c + d_e
    for the schedule of `sim`, as long as that schedule stays."""
    _, X, _ = trace_features(sim)
    t = sim.steps["t_ms"].to_numpy(dtype=float)
    end = t + sim.steps["dur_ms"].to_numpy(dtype=float)
    new = np.r_[True, t[1:] > end[:-1] + 1e-6]            # a step after an idle wait opens a period
    period = np.cumsum(new) - 1
    start = t[new][period]
    cum = np.cumsum(X, axis=0)
    base = np.vstack([np.zeros(X.shape[1]), cum])[np.flatnonzero(new)][period]
    cum_in_period = cum - base
    tok = sim.tokens
    by_req = tok.groupby("req")["t_ms"]
    first, last = by_req.min(), by_req.max()
    pos = {rid: k for k, rid in enumerate(sim.requests["id"].tolist())}
    rows = np.array([pos[i] for i in ids])
    k_first = np.searchsorted(end, first.reindex(rows).to_numpy(dtype=float) - 1e-9)
    k_last = np.searchsorted(end, last.reindex(rows).to_numpy(dtype=float) - 1e-9)
    return (cum_in_period[k_first], start[k_first] - arrival, cum_in_period[k_last], start[k_last] - arrival)


def errors(predicted, measured) -> dict:
    """Per-request relative errors |predicted - measured| / measured of TTFT and E2E, matched by
    request id; {metric: array} over the requests both have."""
    p, m = request_metrics(predicted).set_index("id"), request_metrics(measured).set_index("id")
    both = p.merge(m, left_index=True, right_index=True, suffixes=("", "_m"))
    out = {}
    for k in ("ttft_ms", "e2e_ms"):
        a, b = both[k].to_numpy(float), both[f"{k}_m"].to_numpy(float)
        ok = np.isfinite(a) & np.isfinite(b) & (b > 0)
        out[k] = np.abs(a[ok] - b[ok]) / b[ok]
    return out


def _configs(config, n: int) -> list:
    configs = list(config) if isinstance(config, (list, tuple)) else [config] * n
    if len(configs) != n:
        raise ConfigError(f"fit: {len(configs)} scheduler settings for {n} runs")
    return configs


def _start(runs, ttft: np.ndarray, e2e: np.ndarray) -> np.ndarray:
    """A start from the data: a decode step ~ the median gap between tokens, split between the
    step's base and its sequences; a prompt token ~ what the median TTFT leaves over a step."""
    out_tokens = np.concatenate([r.out_tokens for r in runs])
    many = out_tokens > 1
    step = float(np.median((e2e - ttft)[many] / (out_tokens[many] - 1))) if many.any() else float(np.median(ttft)) / 4
    coef = np.zeros(len(FEATURES))
    prompt = max(float(np.median(np.concatenate([r.workload.prompt_tokens for r in runs]))), 1.0)
    coef[0], coef[1], coef[2] = step / 2, float(np.median(ttft)) / prompt / 2, step / 16
    return coef


class _Run:
    """One measured run: its workload and the requests' measured TTFT and E2E."""

    def __init__(self, trace, max_requests: int):
        self.trace = trace
        self.workload = trace.workload()
        if len(self.workload) > max_requests:
            raise ConfigError(f"fit: {len(self.workload):,} requests; a request-level fit simulates the whole workload "
                              f"~700 times and takes at most {max_requests:,} here")
        m, ok = _measured(trace)
        self.m, self.ok = m, ok
        self.ids = m["id"].to_numpy()[ok]
        self.arrival = m["arrival_ms"].to_numpy(dtype=float)[ok]
        self.ttft, self.e2e = m["ttft_ms"].to_numpy(dtype=float)[ok], m["e2e_ms"].to_numpy(dtype=float)[ok]
        self.out_tokens = m["output_tokens"].to_numpy()[ok]
        at = {rid: k for k, rid in enumerate(self.workload.ids)}
        self.rows = np.array([at[i] for i in self.ids], dtype=np.int64)   # each fitted request's workload row


def _cost(r, scale):
    """Each request's cost of its log ratio r: r^2, or (`scale`) soft L1."""
    return r ** 2 if scale is None else 2 * scale ** 2 * (np.sqrt(1 + (r / scale) ** 2) - 1)


def _span_loss(runs, configs, sm: StepModel, ttft, e2e, scale) -> float:
    """fit_from_requests' loss without recording the runs (core.sim.simulate.token_span_ms: the
    same token times as the recorded trace): what the global search, Nelder-Mead and the polish's
    trial steps compare."""
    pt, pe = [], []
    for r, cfg in zip(runs, configs):
        first, last = token_span_ms(r.workload, cfg, sm)
        pt.append(first[r.rows] - r.arrival)
        pe.append(last[r.rows] - r.arrival)
    pt, pe = np.concatenate(pt), np.concatenate(pe)
    if not (np.all(pt > 0) and np.all(pe > 0)):
        return np.inf
    return float(np.mean(_cost(np.log(pt / ttft), scale)) + np.mean(_cost(np.log(pe / e2e), scale)))


def fit_added_terms(traces, configs, base: StepModel, terms: tuple[str, ...], start: dict | None = None,
                    robust: float | None = None, max_requests: int = MAX_REQUESTS,
                    max_iter: int = 30) -> tuple[StepModel, dict]:
    """`base` (a step model fitted elsewhere: an iteration log's forward passes) plus non-negative
    amounts added to its coefficients `terms` (e.g. base_ms and decode_ms_per_seq: what an engine's
    cycle holds beyond the logged forward pass), chosen so that simulating the runs (`traces`, one
    config each) best reproduces their per-request TTFT and E2E (fit_from_requests' loss, `robust`
    as there). From `start`: Gauss-Newton on the linearised schedule (for a fixed schedule every
    request's TTFT and E2E are linear in the amounts: non-negative least squares), damped so that
    the actual loss falls, as fit_from_requests polishes. Returns (the step model, report: the
    amounts, the loss before and after, simulations, iterations)."""
    from scipy.optimize import nnls
    runs = [_Run(t, max_requests) for t in traces]
    ttft, e2e = np.concatenate([r.ttft for r in runs]), np.concatenate([r.e2e for r in runs])
    idx = [FEATURE_COEFFICIENTS.index(t) for t in terms]
    fixed = np.array([getattr(base, k) for k in FEATURE_COEFFICIENTS], dtype=float)

    def model(x):
        return dataclasses.replace(base, **{t: getattr(base, t) + float(v) for t, v in zip(terms, x)})

    def loss(x):
        return _span_loss(runs, configs, model(x), ttft, e2e, robust)

    def target(x):
        sims = [simulate(r.workload, cfg, model(x), record_kv=False) for r, cfg in zip(runs, configs)]
        # (a wake-up after a pause, StepModel.wake_ms, is not among the terms and is left out of the
        # linearised schedule: it only steers the search, each step of which the true loss accepts;
        # adding it to the offsets was measured: 153 of 189 within targets against 155, docs/fidelity.md)
        parts = [_linearised(sim, r.ids, r.arrival) for sim, r in zip(sims, runs)]
        a_t, d_t, a_e, d_e = (np.concatenate([p[k] for p in parts]) for k in range(4))
        A = np.vstack([a_t[:, idx] / ttft[:, None], a_e[:, idx] / e2e[:, None]])
        b = np.r_[(ttft - d_t - a_t @ fixed) / ttft, (e2e - d_e - a_e @ fixed) / e2e]
        if robust is not None:      # rows reweighted by the soft-L1 weight of their current error
            p = [request_metrics(sim).set_index("id").loc[r.ids] for sim, r in zip(sims, runs)]
            r = np.r_[np.log(np.concatenate([q["ttft_ms"].to_numpy(dtype=float) for q in p]) / ttft),
                      np.log(np.concatenate([q["e2e_ms"].to_numpy(dtype=float) for q in p]) / e2e)]
            w = (1 + (r / robust) ** 2) ** -0.25
            A, b = A * w[:, None], b * w
        scale = np.maximum(np.abs(A).max(axis=0), 1e-12)
        return nnls(A / scale, b)[0] / scale

    x = np.maximum([float((start or {}).get(t, 0.0)) for t in terms], 0.0)
    before = cur = loss(x)
    # a global search first (the loss is rough: a small change of step time reorders batches, and
    # Gauss-Newton alone stops at the schedule it starts on): each amount between 0 and three times
    # its start or the base's fixed cost, whichever is larger
    from scipy.optimize import differential_evolution
    hi = np.maximum(3 * x, max(float(base.base_ms), 0.1))
    found = differential_evolution(loss, list(zip(np.zeros(len(x)), hi)), popsize=6, maxiter=12, tol=1e-10, seed=0,
                                   polish=False, init="sobol", x0=np.minimum(x, hi))
    evaluations, iterations = 1 + int(found.nfev), 0
    if found.fun < cur:
        x, cur = np.asarray(found.x, dtype=float), float(found.fun)
    while iterations < max_iter:
        iterations += 1
        goal = target(x)
        evaluations += 1
        for alpha in 0.5 ** np.arange(11):
            cand = np.maximum(x + alpha * (goal - x), 0.0)
            c_loss = loss(cand)
            evaluations += 1
            if c_loss < cur:
                break
        else:
            break
        moved = float(np.max(np.abs(cand - x)))
        x, cur = cand, c_loss
        if moved < 1e-7:
            break
    return model(x), {"added": {t: float(v) for t, v in zip(terms, x)}, "loss_start": before, "loss": cur,
                      "simulations": evaluations * len(runs), "iterations": iterations}


def _fit_runs(trace, config, model: str, send_times_known: bool, max_requests: int) -> tuple[list, list, int]:
    """(the runs of `trace` (one or a list), one config per run, their completed requests) for
    fit_from_requests; ConfigError when they cannot be fitted."""
    if model not in MODELS:
        raise ConfigError(f"model: expected one of {', '.join(MODELS)}, got {model!r}")
    if not send_times_known:
        raise ConfigError("fit: the file has no send times (every request starts at its own 0), so the load the "
                          "engine saw is unknown; a request-level fit needs start_times")
    runs = [_Run(t, max_requests) for t in (trace if isinstance(trace, (list, tuple)) else [trace])]
    if not runs:
        raise ConfigError("fit: no runs given")
    configs = _configs(config, len(runs))
    n_ok = sum(int(r.ok.sum()) for r in runs)
    if n_ok < MIN_REQUESTS:
        raise ConfigError(f"fit: needs at least {MIN_REQUESTS} completed requests with TTFT and E2E, has {n_ok}")
    return runs, configs, n_ok


def _affine_search(affine_loss, coef: np.ndarray, search_size: int, search_rounds: int) -> tuple[np.ndarray, int]:
    """(the model's coefficients, the losses evaluated) from a global search over the three affine
    coefficients (log scale, a factor of 30 either way of `coef`), then Nelder-Mead from its best
    point; the other coefficients 0."""
    from scipy.optimize import differential_evolution, minimize
    x0 = np.log(np.maximum(coef[:3], FLOOR_MS))
    found = differential_evolution(affine_loss, [(v - np.log(30.0), v + np.log(30.0)) for v in x0],
                                   popsize=search_size, maxiter=search_rounds, tol=1e-10, seed=0, polish=False,
                                   init="sobol")
    local = minimize(affine_loss, found.x, method="Nelder-Mead",
                     options={"maxfev": 150, "xatol": 1e-4, "fatol": 1e-9,
                              "initial_simplex": np.vstack([found.x] + [found.x + 0.2 * np.eye(3)[i]
                                                                          for i in range(3)])})
    return np.r_[np.exp(local.x), np.zeros(len(FEATURES) - 3)], int(found.nfev) + int(local.nfev)


def _scheduler(configs: list):
    """The runs' scheduler settings for a report: one dict when they share them, else one per run."""
    return configs[0].to_dict() if len(set(map(repr, configs))) == 1 else [c.to_dict() for c in configs]


def _error_percentiles(sims, runs) -> dict:
    """p50 and p90 of the per-request relative errors of TTFT and E2E over all the runs."""
    errs = [errors(sim, r.trace) for sim, r in zip(sims, runs)]
    e = {k: np.concatenate([x[k] for x in errs]) for k in ("ttft_ms", "e2e_ms")}
    return {k: {f"p{q}": float(np.percentile(v, q)) for q in (50, 90)} for k, v in e.items() if len(v)}


def fit_from_requests(trace, config: SchedulerConfig, model: str = "affine", max_iter: int = 30,
                      search_size: int = 6, search_rounds: int = 15,
                      send_times_known: bool = True, max_requests: int = MAX_REQUESTS,
                      robust: float | None = None) -> tuple[StepModel, dict]:
    """A step model (`model`: "affine" or "features") under which simulating `trace`'s workload
    with `config` (or one config per run) best reproduces its per-request TTFT and E2E, and a report (iterations,
    error percentiles, the fitted batches' range). `trace` may be a list of runs of the same
    engine (different workloads or loads): they are fitted together, every request counting
    once, which separates costs that one run alone cannot (a run that always decodes at the
    same batch size cannot tell a step's base cost from its per-sequence cost). `search_size`
    x 3 candidates for up to `search_rounds` rounds of the global search. `send_times_known`
    False: an imported file without send times (refused). Runs of more than `max_requests`
    requests are refused (each simulation runs them all). `robust` (a relative error, e.g. 0.1):
    each request's log ratio r costs 2 d^2 (sqrt(1 + (r/d)^2) - 1) instead of r^2 (soft L1: a few
    requests slowed by something the step model does not carry, a stalled machine, weigh as
    much as their error, not its square; the linear polish is reweighted to match). Raises
    ConfigError when the runs cannot be fitted this way."""
    runs, configs, n_ok = _fit_runs(trace, config, model, send_times_known, max_requests)
    ttft, e2e = np.concatenate([r.ttft for r in runs]), np.concatenate([r.e2e for r in runs])

    coef = _start(runs, ttft, e2e)

    def evaluate(c, scale=robust):
        sims = [simulate(r.workload, cfg, model_of(model, c), record_kv=False) for r, cfg in zip(runs, configs)]
        p = [request_metrics(sim).set_index("id").loc[r.ids] for sim, r in zip(sims, runs)]
        pt = np.concatenate([q["ttft_ms"].to_numpy(dtype=float) for q in p])
        pe = np.concatenate([q["e2e_ms"].to_numpy(dtype=float) for q in p])
        if not (np.all(pt > 0) and np.all(pe > 0)):
            return sims, np.inf
        return sims, float(np.mean(cost(np.log(pt / ttft), scale)) + np.mean(cost(np.log(pe / e2e), scale)))

    def loss_only(c, scale=robust):
        return _span_loss(runs, configs, model_of(model, c), ttft, e2e, scale)

    cost = _cost

    def linearised(sims):
        parts = [_linearised(sim, r.ids, r.arrival) for sim, r in zip(sims, runs)]
        a_t, d_t, a_e, d_e = (np.concatenate([p[i] for p in parts]) for i in range(4))
        return (np.vstack([a_t / ttft[:, None], a_e / e2e[:, None]]),
                np.r_[(ttft - d_t) / ttft, (e2e - d_e) / e2e])

    def linear_fit(sims, scale):
        """Where the linear fit on this schedule points: least squares, or (`scale`) reweighted:
        rows scaled by the square root of the soft-L1 weight."""
        A, b = linearised(sims)
        if scale is not None:
            p = [request_metrics(sim).set_index("id").loc[r.ids] for sim, r in zip(sims, runs)]
            r = np.r_[np.log(np.concatenate([q["ttft_ms"].to_numpy(dtype=float) for q in p]) / ttft),
                      np.log(np.concatenate([q["e2e_ms"].to_numpy(dtype=float) for q in p]) / e2e)]
            w = (1 + (r / scale) ** 2) ** -0.25
            A, b = A * w[:, None], b * w
        return nnls_coefficients(A, b, model)

    def polish(coef, sims, loss, scale):
        """Gauss-Newton from `coef`, damped so that the actual loss (with `scale`) falls; returns
        (coef, sims, loss, simulations, iterations)."""
        n_eval = iterations = 0
        while iterations < max_iter:
            iterations += 1
            target = linear_fit(sims, scale)
            for alpha in 0.5 ** np.arange(11):          # damped: the actual loss must fall
                cand = coef + alpha * (target - coef)
                if cand[0] <= 0 and cand[2] <= 0 and cand[4] <= 0:  # a decode step must take time
                    cand[0] = FLOOR_MS
                cand_loss = loss_only(cand, scale)
                n_eval += 1
                if cand_loss < loss:
                    cand_sims = evaluate(cand, scale)[0]        # (recorded: the next linear fit reads them)
                    break
            else:
                break                                           # no step along the fit helps: done
            moved = float(np.max(np.abs(cand - coef) / np.maximum(np.abs(coef), 1e-9)))
            coef, sims, loss = cand, cand_sims, cand_loss
            if moved < 1e-6 or loss < 1e-20:
                break
        return coef, sims, loss, n_eval, iterations

    # 1. a global search over the three affine coefficients (log scale, a factor of 30 either way
    # of the start): the loss is rough, since a small change of step time reorders who is batched
    # with whom; then Nelder-Mead from its best point; 2. Gauss-Newton from there, over all of
    # the model's coefficients
    def affine_loss(x):
        return loss_only(np.r_[np.exp(x), np.zeros(len(FEATURES) - 3)])
    evaluate(coef)    # settings the workload cannot run under (a pool too small) say so here, not inside scipy
    coef, searched = _affine_search(affine_loss, coef, search_size, search_rounds)
    sims, loss = evaluate(coef)
    coef, sims, loss, n_eval, iterations = polish(coef, sims, loss, robust)
    evaluations = searched + 1 + n_eval
    if robust is not None:
        # the robust search can settle on a schedule short of the best one (the requests that
        # schedule misplaces look like outliers); the least-squares fit is kept when its robust loss is lower
        plain, plain_report = fit_from_requests(trace, config, model, max_iter, search_size, search_rounds,
                                                send_times_known, max_requests)
        c2 = np.array([getattr(plain, name) for name in FEATURE_COEFFICIENTS])
        s2, loss2 = evaluate(c2)
        evaluations += plain_report["simulations"] // len(runs) + 1
        if loss2 < loss:
            coef, sims, loss, iterations = c2, s2, loss2, plain_report["iterations"]
    sm = model_of(model, coef)
    X = np.vstack([trace_features(sim)[1] for sim in sims])
    report = {"trace": " + ".join(r.trace.label for r in runs), "model": model, "fitted_on": "requests",
              "runs": len(runs), "requests": n_ok, "robust": robust, "iterations": iterations,
              "simulations": evaluations * len(runs), "loss": loss,
              "scheduler": _scheduler(configs),
              "error": _error_percentiles(sims, runs),
              # the batches of the best fit's simulated schedules: what the coefficients were fitted on
              "range": feature_range(X) if len(X) else {},
              # what the requests could say about each term, on the best fit's schedule
              "identifiability": identifiability(*linearised(sims), model, coef)}
    return sm, report
