"""The step loop: a thin driver over one engine core (core.engine.core.EngineCore) on a clock.

    out = core.step(clock.now())     # schedule -> execute -> update: EngineOutputs
    clock.step_done(out.t_ms)        # a virtual clock moves to the step's end; a wall clock is there

The core never reads a clock: this loop says when each step starts, waits while nothing can
run (a virtual clock jumps to the next arrival, the wall clock sleeps until it, a server's
inbox blocks until a client sends something) and hands every EngineOutputs to `on_output`
(a server answers its clients from them). Clocks:
- `VirtualClock`: the simulator (the executor prices each batch with a step-time model);
- `WallClock`: the runner and the server (the executor runs the model and reads the clock
  when the tokens reach the host).
Several cores on one virtual clock are driven by a loop of their own (a fleet: whichever core
is due steps next); this one drives one.
"""
from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

from core.engine.outputs import EngineOutputs

if TYPE_CHECKING:
    from core.engine.core import EngineCore


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
    """Requests from outside the loop (a server's clients, a closed loop): applied between steps."""

    def drain(self, core: EngineCore, now_ms: float) -> bool:
        """Add new requests and apply cancellations (core.add_request, core.abort); False: stop
        the loop now."""

    def wait(self) -> None:
        """Block until something arrives (the loop is idle)."""


def run(core: EngineCore, clock, on_output: OutputCallback | None = None, inbox: Inbox | None = None) -> None:
    """Step `core` until every request has finished, or with an `inbox` (a server) until the
    inbox says stop. `on_output` gets every EngineOutputs (a step's, with what happened since
    the last one; or, while idle, arrivals queued or rejected and cancellations). An inbox may
    answer a finish with a request (a closed loop): a run of decode steps then stops at each."""
    if inbox is not None:
        core.scheduler.finishes_end_runs = True
    while True:
        if inbox is not None:
            if not inbox.drain(core, clock.now()):
                break
        elif not core.has_unfinished():
            break
        t = clock.now()
        out = core.step(t)
        if out is not None:
            if on_output is not None:
                on_output(out)
            if out.step is not None:
                clock.step_done(out.t_ms)
                continue
        nxt = core.next_event_ms()
        if nxt is not None and nxt > t:
            clock.wait_until(nxt)
        elif inbox is not None:
            inbox.wait()
        elif core.has_unfinished():
            sched = core.scheduler
            raise RuntimeError(f"scheduler made no progress at t={t} ms "
                               f"({len(sched.waiting)} waiting, {len(sched.running)} running)")
    out = core.flush(clock.now())   # the inbox's last cancellations
    if out is not None and on_output is not None:
        on_output(out)
