"""The step loop, the same for simulating and serving: schedule -> execute -> update.

    batch = scheduler.schedule(now)           # SchedulerOutput: who runs, how many tokens each
    res = executor.execute(batch)             # ExecutorOutput: when it ended, what it emitted
    happened = scheduler.update(batch, res)   # EngineOutputs: tokens, finishes + reasons, ...

The executor sees only the SchedulerOutput, never the scheduler (vLLM v1's schedule /
update_from_output split); `on_output` (a server) sees every EngineOutputs, including what
happens between steps (an arrival queued or rejected, a cancellation), so every request that
entered is answered. Executors:
- the simulator's `core.sim.simulate.StepTimeExecutor`: prices the batch with a step-time
  model on a virtual clock (and can price a run of identical decode steps at once);
- the runner's `gpu_runner.engine.ModelExecutor`: runs the model, samples, and reads the
  wall clock when the tokens reach the host.
Everything else happens here once: arrivals, aborts, idle time (a virtual clock jumps to
the next arrival, the wall clock sleeps until it), fast-forward, the output callback, and
the trace metadata both sides write.
"""
from __future__ import annotations

import datetime as _dt
import time
from collections.abc import Callable
from typing import Protocol

from core.engine.outputs import EngineOutputs, ExecutorOutput, SchedulerOutput
from core.engine.scheduler import Scheduler
from core.engine.steplog import StepLog, log_records
from core.workload import Workload


class Executor(Protocol):
    def execute(self, batch: SchedulerOutput) -> ExecutorOutput: ...


class VirtualClock:
    """Simulated time: idle waits jump, a step ends when its executor says."""

    def __init__(self, t0_ms: float):
        self.t = t0_ms

    def now(self) -> float:
        return self.t

    def wait_until(self, t_ms: float):
        self.t = t_ms

    def step_done(self, t_end_ms: float):
        self.t = t_end_ms


class WallClock:
    """Real time in ms on one clock (perf_counter_ns), zero at `t0_ms` (the first arrival)."""

    def __init__(self, t0_ms: float = 0.0):
        self.t0 = t0_ms
        self.origin_ns = time.perf_counter_ns()

    def now(self) -> float:
        return self.t0 + (time.perf_counter_ns() - self.origin_ns) / 1e6

    def wait_until(self, t_ms: float):
        time.sleep(max(0.0, (t_ms - self.now()) / 1000.0))

    def step_done(self, t_end_ms: float):
        pass


OutputCallback = Callable[[EngineOutputs], None]


class Inbox(Protocol):
    """Requests from outside the loop (a server's clients): applied between steps."""

    def drain(self, sched: Scheduler, now_ms: float) -> bool:
        """Add new requests and apply cancellations; False: stop the loop now."""

    def wait(self) -> None:
        """Block until something arrives (the loop is idle)."""


def run(sched: Scheduler, executor: Executor, clock, on_output: OutputCallback | None = None,
        fast_forward: bool = False, inbox: Inbox | None = None) -> None:
    """Drive `sched` until every request has finished, or with an `inbox` (a server) until the
    inbox says stop. `on_output` gets every step's EngineOutputs, and, before a step is run,
    what happened since the last one (arrivals queued or rejected, cancellations).
    `fast_forward` (simulator only: the executor must have `run_durations(batch, k)`) applies
    runs of identical decode steps at once, with the same trace as stepping them one by one;
    such a run reports no outputs (its tokens are in the step log)."""
    while True:
        if inbox is not None:
            if not inbox.drain(sched, clock.now()):
                break
        elif sched.done():
            break
        t = clock.now()
        sched.admit_arrivals(t)
        batch = sched.schedule(t)
        if on_output is not None and sched.has_outputs():
            on_output(sched.take_outputs(t))
        if batch is None:
            nxt = sched.next_event_ms()
            if nxt is not None and nxt > t:
                clock.wait_until(nxt)
            elif inbox is not None:
                inbox.wait()
            elif not sched.done():
                raise RuntimeError(f"scheduler made no progress at t={t} ms "
                                   f"({len(sched.waiting)} waiting, {len(sched.running)} running)")
            continue
        if fast_forward:
            t_end = sched.fast_forward(batch, lambda k: executor.run_durations(batch, k))
            if t_end is not None:
                clock.step_done(t_end)
                continue
        res = executor.execute(batch)
        happened = sched.update(batch, res)
        clock.step_done(res.t_end_ms)
        if on_output is not None:
            on_output(happened)
    if on_output is not None and sched.has_outputs():   # the inbox's last cancellations
        on_output(sched.take_outputs(clock.now()))


def now_iso() -> str:
    return _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds")


def trace_meta(sched: Scheduler, workload: Workload, source: str, label: str, engine: dict,
               created: str | None = None, device: str | None = None, **fields) -> dict:
    """The metadata every trace of a run carries: origin, label, when, where (measured runs),
    the engine (its `name`, the scheduler options, then the rest of `engine`), `fields`
    (step_model, model, versions, ...), the workload, and what the scheduler did."""
    engine = {"name": engine.get("name"), **sched.cfg.to_dict(),
              **{k: v for k, v in engine.items() if k != "name"}}
    where = {"device": device} if device is not None else {}
    return {"source": source, "label": label, "created": created or now_iso(), **where, "engine": engine, **fields,
            "workload": workload.name,
            "stats": {"steps": sched.step, "preemptions": sched.num_preemptions, "kv_blocks": sched.kv.num_blocks,
                      **{f"kv_{k}": v for k, v in sched.kv.counts.items()},
                      **{k: v for k, v in sched.failed.items() if v}}}   # rejected, deadline (when any)


def to_trace(log: StepLog, workload: Workload, meta: dict):
    from core.trace.build import trace_from_records
    return trace_from_records(workload, log_records(log), meta, log.other)
