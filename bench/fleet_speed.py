"""The fleet simulator's cost: the same workload on one engine and on a fleet, side by side.

    python -m bench.fleet_speed [--requests 10000] [--rate 50] [--repeat 3] [--replicas 4]

Workload: bench.simulate.poisson_workload (prompt uniform 1..2,048, output uniform 1..512,
Poisson arrivals at --rate req/s, seeded); scheduler and step model as bench.vs_vidur
(continuous batching, 256 sequences, 8,192-token budget and chunk, affine 5 ms + 0.02 ms per
prefill token + 0.05 ms per decoding sequence). Runs, interleaved, best of --repeat, each
building the whole trace in memory:
  single  core.sim.simulate.simulate (one engine, fast-forward on)
  fleet1  core.fleet.sim.simulate_fleet with one replica (the same trace: checked)
  fleetN  --replicas replicas, round-robin (each replica steps on its own: several times the steps)
Prints seconds, steps and the ratios fleetN/single and fleet1/single. Machine must be idle.
--reuse keeps freed memory for reuse first (core.sim.simulate.reuse_freed_memory), as the command
line and the app server do; by default glibc's settings (each large array page-faults fresh memory:
the fleet's merge of 2.5M-row columns took 0.2-0.7 s, with --reuse 0.10 s, one process, 2026-12-06).
"""
import argparse
import time

import pandas as pd

from bench.simulate import poisson_workload
from core.config import SchedulerConfig
from core.fleet.router import RouterConfig
from core.fleet.sim import FleetSpec, simulate_fleet
from core.sim.simulate import reuse_freed_memory, simulate
from core.sim.stepmodel import StepModel

CFG = SchedulerConfig(policy="continuous", max_seqs=256, token_budget=8192, chunk=8192)
STEP = StepModel("affine", base_ms=5.0, prefill_ms_per_token=0.02, decode_ms_per_seq=0.05)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--requests", type=int, default=10_000)
    ap.add_argument("--rate", type=float, default=50.0)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--replicas", type=int, default=4)
    ap.add_argument("--reuse", action="store_true", help="keep freed memory for reuse, as the CLI and app do")
    a = ap.parse_args(argv)
    if a.reuse:
        reuse_freed_memory()
    w = poisson_workload(a.requests, a.rate)
    runs = {
        "single": lambda: simulate(w, CFG, STEP),
        "fleet1": lambda: simulate_fleet(w, FleetSpec.uniform(1, CFG, STEP)),
        f"fleet{a.replicas}": lambda: simulate_fleet(w, FleetSpec.uniform(a.replicas, CFG, STEP,
                                                                          router=RouterConfig("round-robin"))),
    }
    best = {k: float("inf") for k in runs}
    traces = {}
    for _ in range(a.repeat):
        for k, fn in runs.items():
            t0 = time.perf_counter()
            traces[k] = fn()
            best[k] = min(best[k], time.perf_counter() - t0)
    for t in ("tokens", "finishes", "steps", "batch"):
        pd.testing.assert_frame_equal(getattr(traces["single"], t), getattr(traces["fleet1"], t))
    print(f"{a.requests:,} requests at {a.rate:g} req/s (Poisson); continuous, 256 seqs, 8,192 tokens; "
          f"affine 5 ms + 0.02 ms/prefill token + 0.05 ms/decode seq; best of {a.repeat}, interleaved; "
          f"{'freed memory reused (as the CLI and app)' if a.reuse else 'glibc malloc defaults'}")
    print(f"{'run':>8} {'seconds':>8} {'steps':>8} {'tokens':>9}  vs single")
    for k in runs:
        tr = traces[k]
        print(f"{k:>8} {best[k]:8.2f} {len(tr.steps):8,} {len(tr.tokens):9,}  {best[k] / best['single']:.2f}x")


if __name__ == "__main__":
    main()
