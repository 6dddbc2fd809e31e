"""A measured run as its engine core saw it (core.fit.calibrate fits the step model to this view):
each request arriving at the core and its first and last token there, from the engine's own
per-request phases (its spans) less the front end's way in and out."""
from __future__ import annotations

import numpy as np

from core.errors import InputError
from core.fit.frontfit import samples
from core.fit.runs import Run
from core.sim.frontend import FrontEnd


def has_phases(run: Run) -> bool:
    """Per-request engine phases: spans (vLLM), or a trace with its own steps and batch entries."""
    tr = run.truth
    return (any("engine_inference_ms" in e for e in tr.request_extra[:200])
            or (len(tr.batch) > 0 and len(tr.steps) > 0))


def engine_view(run: Run, fe: FrontEnd):
    """The run as its engine core saw it: each request arriving at the core (the front end's
    arrival plus the way in, with the requests in flight then), its first and last token when the
    core had them (the measured TTFT and E2E less the way out of that token), its tokens spaced
    evenly between. What the core did meanwhile (waiting for the step boundary, queueing, prefill)
    is left for the simulation to reproduce."""
    from core.trace.build import given_trace
    from core.workload import Request, Workload
    s = samples(run.truth).set_index("id")
    reqs, emitted = [], {}
    for r in run.workload.requests:
        if r.id not in s.index:
            continue
        x = s.loc[r.id]
        if not np.isfinite([x.queue_ms, x.prefill_ms, x.inference_ms, x.ttft_ms, x.e2e_ms]).all():
            continue
        n = r.max_output_tokens
        a = r.arrival_ms + float(fe.way_in(r.prompt_tokens, x.in_flight))
        first = max(r.arrival_ms + x.ttft_ms - float(fe.way_out(0)), a + 1e-3)
        last = max(r.arrival_ms + x.e2e_ms - float(fe.way_out(n - 1)), first)
        reqs.append(Request(r.id, a, r.prompt_tokens, r.max_output_tokens, prompt_ids=r.prompt_ids))
        emitted[r.id] = np.linspace(first, last, n).tolist() if n > 1 else [first]
    if len(reqs) < 2:
        raise InputError(f"{run.name}: {len(reqs)} requests with the engine's phases (its spans): too few to fit")
    reqs.sort(key=lambda q: q.arrival_ms)
    return given_trace(Workload(reqs, name=run.name), emitted, {"label": f"{run.name} (engine core's view)"})
