"""Fit a front end's way in and out (core.sim.frontend.FrontEnd) from what a run reports per
request: TTFT and E2E on the front end's clock, and the engine core's own phases (vLLM's spans:
time in queue, in prefill, in inference; the same fields in a trace simulated with a front end).

What the core does not account for is the front end's:

    TTFT - queue - prefill   = in + out(first token)  = A + B x prompt tokens + C x in flight
    E2E  - queue - inference = in + out(last token)   = A + B x prompt tokens + C x in flight
                                                        + D x (output tokens - 1)

with A = in_ms + out_ms, B = in_ms_per_prompt_token, C = in_ms_per_in_flight (the requests in flight
at the front end when it arrived: contention), D = out_ms_per_output_token, fitted by
non-negative least squares over both equations of every request. The split of A between the way in
and the way out needs one more clock reading: when the core queued the request (`queued_ms`: a
simulated trace records it; for vLLM, core.fit.runs derives it from its KV events' step times).
Without it, A is put on the way in (the report says so): TTFT and E2E come out the same either
way; only queueing behind other requests can tell them apart.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from core.errors import InputError
from core.sim.frontend import FrontEnd, in_flight_at

MIN_REQUESTS = 3


def samples(trace) -> pd.DataFrame:
    """Per request with the engine's phases: prompt and output tokens, TTFT, E2E, queue, prefill,
    inference, and the way in where `queued_ms` is known (NaN elsewhere). The phases are the
    spans' (vLLM), a simulated trace's, or (a measured trace of our runner) its own steps'."""
    from core.analysis.metrics import request_metrics
    m = request_metrics(trace).reset_index(drop=True)
    extra = list(trace.request_extra) + [{}] * (len(trace.requests) - len(trace.request_extra))
    by_id = dict(zip(trace.ids, extra))
    prompt = dict(zip(trace.ids, trace.requests["prompt_tokens"].to_numpy().tolist()))

    own = None
    if not any("engine_inference_ms" in e for e in extra[:200]) and len(trace.batch) and len(trace.steps):
        # a trace of our own engine (the runner's capture): its phases from its steps, batch entries and
        # tokens, all on the engine's clock (nothing between a front end and the core: 0)
        from core.sim.frontend import engine_phases
        ph = engine_phases(trace)
        own = {name: dict(zip(trace.ids, col.tolist())) for name, col in ph.items()}

    def col(name):
        if own is not None and name in own:
            return np.array([own[name].get(i, np.nan) for i in m["id"]], dtype=np.float64)
        return np.array([by_id.get(i, {}).get(name, np.nan) for i in m["id"]], dtype=np.float64)

    out = pd.DataFrame({"id": m["id"], "prompt_tokens": [prompt[i] for i in m["id"]],
                        "output_tokens": m["output_tokens"].to_numpy(dtype=np.float64),
                        "ttft_ms": m["ttft_ms"].to_numpy(dtype=np.float64),
                        "e2e_ms": m["e2e_ms"].to_numpy(dtype=np.float64),
                        "queue_ms": col("engine_queue_ms"), "prefill_ms": col("engine_prefill_ms"),
                        "inference_ms": col("engine_inference_ms"), "wait_ms": col("engine_wait_ms")})
    out["in_ms"] = col("queued_ms") - m["arrival_ms"].to_numpy(dtype=np.float64)
    arrival = m["arrival_ms"].to_numpy(dtype=np.float64)
    out["in_flight"] = in_flight_at(arrival, arrival + out["e2e_ms"].to_numpy())
    out["front_first_ms"] = out["ttft_ms"] - out["queue_ms"] - out["prefill_ms"]
    out["front_last_ms"] = out["e2e_ms"] - out["queue_ms"] - out["inference_ms"]
    return out


def fit_front_end(traces, name: str = "fit run", waits: dict | None = None) -> tuple[FrontEnd, dict]:
    """The front end's terms from one or more runs (each a trace with the engine's phases per
    request); returns (FrontEnd, report: terms, requests used, residuals, how A was split).

    What lies between TTFT and the core's phases also holds each request's wait for the step
    boundary (core.sim.frontend.engine_phases), which is the engine's, not the front end's: it is
    taken out where known — a simulated trace records it (`engine_wait_ms`); for a measured run,
    `waits` gives it per request id, from a simulation of that run (core.fit.calibrate) — else it
    stays in the fitted terms (the report says which)."""
    from scipy.optimize import nnls
    traces = traces if isinstance(traces, (list, tuple)) else [traces]
    s = pd.concat([samples(t) for t in traces], ignore_index=True)
    if waits:
        given = s["id"].map(waits).to_numpy(dtype=np.float64)
        s["wait_ms"] = np.where(np.isnan(s["wait_ms"].to_numpy()), given, s["wait_ms"].to_numpy())
    wait = np.nan_to_num(s["wait_ms"].to_numpy(dtype=np.float64))
    waited = int(np.isfinite(s["wait_ms"].to_numpy(dtype=np.float64)).sum())
    s["front_first_ms"] = s["front_first_ms"] - wait
    s["front_last_ms"] = s["front_last_ms"] - wait
    ok = s[["front_first_ms", "front_last_ms", "prompt_tokens", "output_tokens"]].notna().all(axis=1)
    s = s[ok & (s["output_tokens"] >= 1)]
    if len(s) < MIN_REQUESTS:
        raise InputError(f"{name}: {len(s)} requests with the engine's own phases (queue, prefill, inference: "
                         f"vLLM's OTLP spans), at least {MIN_REQUESTS} needed to fit a front end")
    p = s["prompt_tokens"].to_numpy(dtype=np.float64)
    k = s["output_tokens"].to_numpy(dtype=np.float64) - 1
    busy = s["in_flight"].to_numpy(dtype=np.float64)
    ones = np.ones(len(s))
    X = np.vstack([np.column_stack([ones, p, busy, np.zeros(len(s))]), np.column_stack([ones, p, busy, k])])
    y = np.concatenate([s["front_first_ms"].to_numpy(), s["front_last_ms"].to_numpy()])
    scale = np.maximum(np.abs(X).max(axis=0), 1e-12)
    coef, _ = nnls(X / scale, y)
    a, b, c, d = (coef / scale).tolist()
    resid = y - X @ (coef / scale)
    known = s["in_ms"].notna().to_numpy()
    if known.any():
        in_fixed = float(np.median(s["in_ms"].to_numpy()[known] - b * p[known] - c * busy[known]))
        in_fixed = min(max(in_fixed, 0.0), a)
        split = f"from when the core queued {int(known.sum())} of {len(s)} requests"
    else:
        in_fixed = a
        split = "unknown (no core queue times): the fixed part is put on the way in"
    fe = FrontEnd(in_fixed, b, a - in_fixed, d, c)
    return fe, {"front_end": fe.to_dict(), "requests": int(len(s)), "fixed_ms": a, "split": split,
                "in_flight_range": [int(busy.min()), int(busy.max())],
                "step_boundary_wait": (f"taken out for {waited} of {len(s)} requests" if waited else
                                       "not known: left in the terms"),
                "wait_ms_mean": float(wait.mean()) if len(wait) else 0.0,
                "residual_ms_p50": float(np.median(np.abs(resid))),
                "residual_ms_p90": float(np.percentile(np.abs(resid), 90)),
                "front_first_ms_median": float(s["front_first_ms"].median()),
                "front_last_ms_median": float(s["front_last_ms"].median())}
