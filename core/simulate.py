"""The simulator: the core step loop with a step-time model as its executor.

Clock: starts at the first arrival. Each step starts when the previous one ends (or at
the next arrival when idle); the tokens a step emits are stamped at the step's end.
Step-time models are in core.stepmodel.
"""
from __future__ import annotations

import gc

import numpy as np

from core import loop
from core.config import SchedulerConfig
from core.errors import ConfigError
from core.scheduler import Batch, Scheduler
from core.steplog import StepLog, StepOutput
from core.stepmodel import StepModel, fit_affine  # noqa: F401  (StepModel, fit_affine: re-exported)
from core.trace import Trace
from core.workload import Workload


class StepTimeExecutor:
    """Prices each batch with a step-time model; emits one (unknown) token per completing entry."""

    def __init__(self, step_model: StepModel):
        self.step_model = step_model

    def execute(self, sched: Scheduler, batch: Batch) -> StepOutput:
        dur = self.step_model.duration_ms(batch)
        if not dur > 0:
            raise ConfigError(f"step model gave a non-positive step duration ({dur} ms)")
        return StepOutput(batch.t_ms + dur, dur)

    def run_durations(self, batch: Batch, k: int) -> np.ndarray:
        return self.step_model.decode_run_ms(batch, k)


def simulate(workload: Workload, config: SchedulerConfig, step_model: StepModel | None = None,
             label: str | None = None, created: str | None = None, record_kv: bool = True,
             fast_forward: bool = True) -> Trace:
    """`fast_forward` applies runs of identical decode-only steps in one go (same trace as
    stepping one by one, which tests check); turn it off to step strictly."""
    step_model = step_model or StepModel()
    if config.spec_gamma:
        raise ConfigError("spec_gamma: the simulator does not model speculative acceptance; "
                          "capture speculative runs with gpu_runner")
    gc_was_enabled = gc.isenabled()
    gc.disable()  # the run allocates many small acyclic records; cyclic GC passes only cost time
    try:
        log = StepLog()
        sched = Scheduler(workload, config, log)
        if not record_kv:
            sched.bm.log = None
        clock = loop.VirtualClock(float(workload.requests[0].arrival_ms))
        loop.run(sched, StepTimeExecutor(step_model), clock, fast_forward=fast_forward)
        meta = loop.trace_meta(sched, workload, "simulated", label or f"{config.policy} (simulated)",
                               {"name": "core.simulate"}, created, step_model=step_model.to_dict())
        return loop.to_trace(sched, log, workload, meta)
    finally:
        if gc_was_enabled:
            gc.enable()
