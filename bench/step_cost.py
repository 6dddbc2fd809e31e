"""What one simulated step costs in Python (issue 50's "<= 15 us per simulated step"), counted.

    python -m bench.step_cost [--requests 10000] [--rate 50] [--repeat 3] [--both ROUNDS]

--both: the engine compiled (setup.py) and from source, alternately, each in its own process
(calls per step count only the Python functions cProfile sees: compiled ones are not among them).

Workload and engine as bench.vs_vidur runs them: N requests, Poisson `--rate`/s, prompts uniform
1..2,048, outputs 1..512 (bench.simulate.poisson_workload, seed 0); continuous batching, 256
seats, 8,192-token budget, chunk 8,192; affine step model 5 ms + 0.02 ms/prefill token + 0.05
ms/decode sequence. In one process, side by side:

- the engine core's loop as `simulate` runs it (the run recorded: its step log and KV events),
  best of --repeat, with fast-forward (the default) and without;
- the same loop recording nothing (what a fit's search runs: core.sim.simulate.token_span_ms);
- building the trace's columns from the log (core.engine.steplog.log_records), once.

For each: wall seconds, microseconds per simulated step (the run's step count, fast-forwarded
steps included), and, from one run under cProfile (its own time not counted in the above),
Python function calls per simulated step and the events per step that are the scheduler's real
work (requests joining, finishing, KV blocks taken). Nothing is asserted.
"""
import argparse
import cProfile
import os
import pstats
import subprocess
import sys
import time

from bench.simulate import poisson_workload
from core import compiled
from core.config import SchedulerConfig
from core.engine import loop
from core.engine.steplog import log_records
from core.sim.simulate import no_cyclic_gc, reuse_freed_memory, simulator
from core.sim.stepmodel import StepModel
from core.trace.schema import KV_OPS

MODEL = StepModel("affine", base_ms=5.0, prefill_ms_per_token=0.02, decode_ms_per_seq=0.05)
CONFIG = SchedulerConfig("continuous", max_seqs=256, token_budget=8192, chunk=8192)


def run_once(w, record: bool, ff: bool):
    """One run of the loop; returns (seconds, the core)."""
    core = simulator(CONFIG, MODEL, w, record_kv=record, fast_forward=ff)
    if not record:
        core.log = None
        core.observers = []
    with no_cyclic_gc():
        t = time.perf_counter()
        loop.run(core, loop.VirtualClock(float(w.arrival_ms[0])))
        dt = time.perf_counter() - t
    # (timed inside: the first allocation after the block starts a collection of every object the
    # run made that is still alive, here the whole log the core still holds; a run that lets go of
    # its core first, as simulate and the command line do, leaves little for it to walk)
    return dt, core


def calls(w, record: bool, ff: bool) -> int:
    prof = cProfile.Profile()
    prof.enable()
    run_once(w, record, ff)
    prof.disable()
    return sum(v[1] for v in pstats.Stats(prof).stats.values())   # primitive calls


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--requests", type=int, default=10_000)
    ap.add_argument("--rate", type=float, default=50.0)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--both", type=int, default=0, metavar="ROUNDS",
                    help="run compiled and from source alternately, ROUNDS times each, in their own processes")
    a = ap.parse_args()
    if a.both:
        return both([f"--requests={a.requests}", f"--rate={a.rate}", f"--repeat={a.repeat}"], a.both)
    reuse_freed_memory()   # (as the command line and the app server: freed memory reused, not page-faulted anew)
    w = poisson_workload(a.requests, a.rate)
    run_once(w, True, True)   # warm (imports, caches)
    rows = []
    build = blocks = steps = None
    for name, record, ff in (("recorded, fast-forward on", True, True), ("recorded, fast-forward off", True, False),
                             ("nothing recorded (a fit's search)", False, True)):
        best, core = float("inf"), None
        for _ in range(a.repeat):   # (a run never starts beside an earlier run's log: each freed first)
            core = None
            dt, core = run_once(w, record, ff)
            best = min(best, dt)
        n_steps = core.scheduler.step
        if build is None:   # the trace's columns from the first recorded run's log, once
            with no_cyclic_gc():   # (as simulate builds its trace)
                t = time.perf_counter()
                recs = log_records(core.log)
                build, steps = time.perf_counter() - t, n_steps
            kv = recs.get("kv") or {}
            blocks = int((kv["op"] == KV_OPS.index("alloc")).sum()) if kv.get("op") is not None else None
            recs = kv = None
        core = None
        n_calls = calls(w, record, ff)
        rows.append((name, best, n_steps, 1e6 * best / n_steps, n_calls / n_steps))
    print(f"{a.requests:,} requests (Poisson {a.rate:g}/s), {steps:,} simulated steps; best of {a.repeat}; "
          f"engine {compiled.STATE}")
    print(f"{'loop':<36} {'s':>7} {'steps':>8} {'us/step':>8} {'calls/step':>10}")
    for name, s, n, us, c in rows:
        print(f"{name:<36} {s:7.3f} {n:8,} {us:8.1f} {c:10.1f}")
    print(f"{'trace columns from the log':<36} {build:7.3f} {steps:8,} {1e6 * build / steps:8.1f}")
    print(f"events per step: {a.requests / steps:.2f} joins, {a.requests / steps:.2f} finishes"
          + (f", {blocks / steps:.2f} KV blocks taken" if blocks is not None else ""))
    print("issue 50's target: <= 15 us per simulated step on this workload")


def both(argv: list[str], rounds: int):
    """The bench run alternately compiled and from source (SERVING_EXPLORER_PURE), each in its own
    process, `rounds` times each; prints each run and the recorded loop's ratio per round."""
    if not compiled.STATE.startswith("compiled"):
        raise SystemExit(f"--both needs the compiled engine (python setup.py build_ext --inplace): {compiled.STATE}")
    env_src = {**os.environ, "SERVING_EXPLORER_PURE": "1"}
    for r in range(rounds):
        us = {}
        for name, env in (("compiled", None), ("source", env_src)):
            out = subprocess.run([sys.executable, "-m", "bench.step_cost", *argv], env=env, capture_output=True,
                                 text=True, check=True).stdout
            print(f"--- round {r + 1}, {name}\n{out}", end="")
            row = next(ln for ln in out.splitlines() if ln.startswith("recorded, fast-forward on"))
            us[name] = float(row.split()[5])
        print(f"round {r + 1}: recorded loop, source / compiled = {us['source'] / us['compiled']:.2f}x\n")


if __name__ == "__main__":
    main()
