"""Predict a trace with the simulator: the trace's own workload through the core scheduler,
under the scheduler options its metadata records (`meta.engine`, options not recorded take
their defaults, other engine fields are ignored) and an affine step model fitted by least
squares to its step durations (`core.sim.stepmodel.fit_affine`).

The prediction is of plain decoding: a speculative engine's `spec_gamma` is dropped, since
the simulator does not model acceptance.
"""
from __future__ import annotations

import dataclasses

import numpy as np

from core.config import SchedulerConfig, from_dict
from core.sim.simulate import simulate
from core.sim.stepmodel import fit_affine
from core.trace import Trace


def scheduler_options(trace: Trace) -> SchedulerConfig:
    """The scheduler options recorded in `meta.engine` (defaults when there is none)."""
    engine = trace.meta.get("engine")
    cfg = from_dict(SchedulerConfig, engine if isinstance(engine, dict) else {}, "meta.engine", strict=False)
    return dataclasses.replace(cfg, spec_gamma=0)


def predicted_trace(trace: Trace, created: str | None = None) -> Trace:
    """Raises ConfigError (naming the option) when the trace has too few steps to fit or its
    recorded options are invalid."""
    step_model = fit_affine(trace)
    return simulate(trace.workload(), scheduler_options(trace), step_model,
                    label=f"predicted for {trace.label}", created=created)


def round_trips_ms(arrival_ms, e2e_ms, clients: int) -> np.ndarray:
    """A closed loop's measured round trips: from the k-th finish (arrival + E2E, in time order)
    to the send of the request it let a client send (the (clients + k)-th send): the client's and
    the server front-end's part, which no step model carries (clipped at 0)."""
    arrival = np.sort(np.asarray(arrival_ms, dtype=float))
    finish = np.sort(np.asarray(arrival_ms, dtype=float) + np.asarray(e2e_ms, dtype=float))
    return np.maximum(arrival[clients:] - finish[:len(arrival) - clients], 0.0)


def replayed_run(trace: Trace, config: SchedulerConfig, step_model, closed_loop: bool = True,
                 created: str | None = None) -> tuple[Trace, int | None]:
    """A measured run's workload simulated as its clients sent it: a closed-loop benchmark run
    (core.fit.stepinfer.closed_loop_clients) as that closed loop, its first requests sent when
    they were measured to be (a client's sends are staggered by a few ms, and that decides who
    is batched with whom) and each later one when one finishes in the simulation plus that
    replacement's measured round trip (round_trips_ms); any other run (or with `closed_loop`
    False) at its send times. Returns (predicted trace, the closed loop's clients or None)."""
    from core.analysis.metrics import request_metrics
    from core.experiments.sweep import simulate_closed
    from core.fit.stepinfer import closed_loop_clients
    clients = closed_loop_clients(trace) if closed_loop else None
    label = f"predicted for {trace.label}"
    if clients:
        m = request_metrics(trace)
        ok = np.isfinite(m["e2e_ms"].to_numpy(dtype=float))
        delays = round_trips_ms(m["arrival_ms"].to_numpy(dtype=float)[ok], m["e2e_ms"].to_numpy(dtype=float)[ok],
                                clients)
        pred = simulate_closed(trace.workload(), config, step_model, clients, created=created,
                               delay_ms=delays if len(delays) else 0.0, first_as_given=True)[0]
        pred.meta["load"] = {**pred.meta.get("load", {}), "first_sends": "as measured",
                             "round_trip_ms_median": float(np.median(delays)) if len(delays) else 0.0}
        pred.meta["label"] = label
        return pred, clients
    return simulate(trace.workload(), config, step_model, label=label, created=created, record_kv=False), None


MAX_PAGE_FIT_TOKENS = 2_000_000   # inferring steps walks every token in Python (~1.6 s per million)


def predict_without_steps(trace: Trace, config: SchedulerConfig, send_times_known: bool, method: str = "requests",
                          max_requests: int | None = None, max_tokens: int = MAX_PAGE_FIT_TOKENS,
                          created: str | None = None) -> tuple[Trace, dict]:
    """A prediction for a trace without step events: a step model fitted to the steps inferred
    from its streamed token times (method "token times", core.fit.stepinfer) or to its requests'
    TTFT and E2E ("requests", core.fit.reqfit, on at most `max_requests` of them), then the run
    replayed as its clients sent it (a closed loop when the send times are known). Returns
    (predicted trace, fit report with the prediction's median errors per metric)."""
    from core.errors import InputError
    from core.fit.reqfit import errors, fit_from_requests
    from core.fit.stepinfer import fit_inferred
    if method == "token times":
        if len(trace.tokens) > max_tokens:
            raise InputError(f"{len(trace.tokens):,} tokens: the page fits up to {max_tokens:,}; use "
                             "python -m core fit FILE --from-token-times --out MODEL.json")
        sm, report = fit_inferred(trace, config, "affine")
    else:   # (~0.1 s per simulation at 2,000 requests; larger files: python -m core fit)
        cap = {} if max_requests is None else {"max_requests": max_requests}
        sm, report = fit_from_requests(trace, config, send_times_known=send_times_known, **cap)
    pred, clients = replayed_run(trace, config, sm, closed_loop=send_times_known, created=created)
    e = errors(pred, trace)
    report = {**report, "method": method, "clients": clients,
              "prediction_error": {k: float(np.median(v)) if len(v) else None for k, v in e.items()},
              "degenerate": degenerate(pred, trace)}
    return pred, report


def degenerate(predicted: Trace, measured: Trace) -> list[str]:
    """Metrics that the prediction gives every request the same value of while the measured
    requests differ (a prediction drawn as vertical CDF lines is no prediction of the spread):
    one sentence each, [] when none."""
    from core.analysis.metrics import request_metrics
    p, m = request_metrics(predicted), request_metrics(measured)
    out = []
    for key, name in (("ttft_ms", "TTFT"), ("tpot_ms", "TPOT"), ("e2e_ms", "E2E")):
        a, b = p[key].to_numpy(dtype=float), m[key].to_numpy(dtype=float)
        a, b = a[np.isfinite(a)], b[np.isfinite(b)]
        if len(a) > 1 and len(b) > 1 and np.ptp(a) <= 1e-9 * max(abs(float(a[0])), 1.0) \
                and np.ptp(b) > 0.01 * abs(float(np.median(b))):
            out.append(f"the prediction gives every request the same {name} ({float(a[0]):.6g} ms) while the "
                       f"measured ones range {float(b.min()):.6g}–{float(b.max()):.6g} ms: the simulated schedule "
                       "runs in lockstep, so only the mean is predicted, not the spread")
    return out


PREDICT_FROM_STEPS = 3     # a trace with at least this many steps is predicted by fitting its step durations


def prediction_methods(trace: Trace, send_times_known: bool) -> list[str]:
    """How a trace without step events can be predicted: "token times" (steps read off the streamed
    tokens: needs send times and a request with more than one token), then "requests" (its
    requests' TTFT and E2E). A trace with steps: [] (its steps are fitted)."""
    if len(trace.steps) >= PREDICT_FROM_STEPS:
        return []
    tk = trace.tokens
    per_token = send_times_known and bool(len(tk)) and int(tk.groupby("req").size().max()) > 1
    return ["token times", "requests"] if per_token else ["requests"]


def describe_request_prediction(rep: dict, policy: str, predicted: Trace) -> str:
    """One line on a prediction of a trace without steps (predict_without_steps' report): the step
    model, what it was fitted to, the arrivals replayed, the per-request errors in sample."""
    e = rep["prediction_error"]
    how = (f"fitted to {rep['steps']} steps inferred from the streamed token times"
           if rep["method"] == "token times" else
           f"fitted to {rep['requests']} requests' TTFT and E2E in {rep['simulations']} simulations")
    trip = (predicted.meta.get("load") or {}).get("round_trip_ms_median")
    arrivals = (f"a closed loop of {rep['clients']} clients, the first sends as measured and each later one a "
                f"measured round trip (median {trip:.3g} ms) after a finish" if rep["clients"] else "the send times")
    errors = ", ".join(f"{k} {'—' if e[c] is None else f'{e[c]:.1%}'}" for k, c in (("TTFT", "ttft_ms"),
                                                                                     ("E2E", "e2e_ms")))
    return (f"Prediction: core simulator ({policy}), {predicted.meta['step_model']['description']}, {how}; "
            f"arrivals: {arrivals}. Per-request error (median, in sample) {errors}.")
