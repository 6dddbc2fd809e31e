"""The step loop, the same for simulating and serving: schedule -> execute -> update.

    batch = scheduler.schedule(now)          # who runs this step, and how many tokens each
    out = executor.execute(scheduler, batch) # a StepOutput: when it ended, what it emitted
    scheduler.update(batch, out)             # emissions, stops, KV rollback, finishes, log

The scheduler never knows who executed the step (vLLM v1's schedule/update_from_output
split). Executors:
- the simulator's `core.sim.simulate.StepTimeExecutor`: prices the batch with a step-time
  model on a virtual clock (and can price a run of identical decode steps at once);
- the runner's `gpu_runner.engine.ModelExecutor`: runs the model, samples, and reads the
  wall clock when the tokens reach the host.
Everything else happens here once: arrivals, aborts, idle time (a virtual clock jumps to
the next arrival, the wall clock sleeps until it), fast-forward, per-step callbacks, and
the trace metadata both sides write.
"""
from __future__ import annotations

import datetime as _dt
import time
from collections.abc import Callable
from typing import Protocol

from core.engine.scheduler import Batch, Scheduler
from core.engine.steplog import StepLog, StepOutput
from core.workload import Workload


class Executor(Protocol):
    def execute(self, sched: Scheduler, batch: Batch) -> StepOutput: ...


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


StepCallback = Callable[[Scheduler, Batch, StepOutput], None]


class Inbox(Protocol):
    """Requests from outside the loop (a server's clients): applied between steps."""

    def drain(self, sched: Scheduler, now_ms: float) -> bool:
        """Add new requests and apply cancellations; False: stop the loop now."""

    def wait(self) -> None:
        """Block until something arrives (the loop is idle)."""


def run(sched: Scheduler, executor: Executor, clock, on_step: StepCallback | None = None,
        fast_forward: bool = False, inbox: Inbox | None = None) -> None:
    """Drive `sched` until every request has finished, or with an `inbox` (a server) until the
    inbox says stop. `fast_forward` (simulator only: the executor must have
    `run_durations(batch, k)`) applies runs of identical decode steps at once, with the same
    trace as stepping them one by one."""
    while True:
        if inbox is not None:
            if not inbox.drain(sched, clock.now()):
                break
        elif sched.done():
            break
        t = clock.now()
        sched.admit_arrivals(t)
        batch = sched.schedule(t)
        if batch is None:
            nxt = sched.next_event_ms()
            if nxt is not None and nxt > t:
                clock.wait_until(nxt)
            elif inbox is not None:
                inbox.wait()
            elif not sched.done():
                raise RuntimeError(f"scheduler made no progress at t={t} ms "
                                   f"({len(sched.waiting)} waiting, {len(sched.run)} running)")
            continue
        if fast_forward:
            t_end = sched.fast_forward(batch, lambda k: executor.run_durations(batch, k))
            if t_end is not None:
                clock.step_done(t_end)
                continue
        out = executor.execute(sched, batch)
        sched.update(batch, out)
        clock.step_done(out.t_end_ms)
        if on_step is not None:
            on_step(sched, batch, out)


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
            "stats": {"steps": sched.step, "preemptions": sched.num_preemptions, "kv_blocks": sched.bm.num_blocks,
                      **{f"kv_{k}": v for k, v in sched.bm.counts.items()},
                      **{k: v for k, v in sched.failed.items() if v}}}   # rejected, deadline (when any)


def to_trace(sched: Scheduler, log: StepLog, workload: Workload, meta: dict):
    from core.trace import trace_from_log
    return trace_from_log(workload, log, meta)
