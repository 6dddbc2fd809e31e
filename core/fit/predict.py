"""Predict a trace with the simulator: the trace's own workload through the core scheduler,
under the scheduler options its metadata records (`meta.engine`, options not recorded take
their defaults, other engine fields are ignored) and an affine step model fitted by least
squares to its step durations (`core.sim.stepmodel.fit_affine`).

The prediction is of plain decoding: a speculative engine's `spec_gamma` is dropped, since
the simulator does not model acceptance.
"""
from __future__ import annotations

import dataclasses

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


def replayed_run(trace: Trace, config: SchedulerConfig, step_model, closed_loop: bool = True,
                 created: str | None = None) -> tuple[Trace, int | None]:
    """A measured run's workload simulated as its clients sent it: a closed-loop benchmark run
    (core.fit.stepinfer.closed_loop_clients) as that closed loop (each request sent when one
    finishes in the simulation), any other run (or with `closed_loop` False) at its send times.
    Returns (predicted trace, the closed loop's clients or None)."""
    from core.fit.stepinfer import closed_loop_clients
    from core.sim.sweep import simulate_closed
    clients = closed_loop_clients(trace) if closed_loop else None
    label = f"predicted for {trace.label}"
    if clients:
        pred = simulate_closed(trace.workload(), config, step_model, clients, created=created)[0]
        pred.meta["label"] = label
        return pred, clients
    return simulate(trace.workload(), config, step_model, label=label, created=created, record_kv=False), None
