"""Simulator throughput: 10,000 requests (prompt 1-2,048, output 1-512 tokens, Poisson
arrivals), continuous policy, 256 max sequences, 8,192-token budget, chunked prefill.

    python -m bench.simulate [--requests N] [--rate PER_S] [--repeat K]

Prints simulated requests/s and token emissions/s (wall clock of the simulation), and the
time to compute the trace's metrics. Targets on the 2-core dev machine: simulation < 2 s,
metrics < 1 s. Not a test: timings are printed, never asserted.
"""
import argparse
import time

import numpy as np

from core.analysis.metrics import summarize
from core.config import SchedulerConfig
from core.sim.simulate import simulate
from core.sim.stepmodel import StepModel
from core.workload import Request, Workload


def poisson_workload(n, rate_per_s, seed=0):
    rng = np.random.default_rng(seed)
    arrivals = np.cumsum(rng.exponential(1000.0 / rate_per_s, n))
    arrivals -= arrivals[0]
    prompts = rng.integers(1, 2049, n)
    outputs = rng.integers(1, 513, n)
    return Workload([Request(f"r{i}", float(a), int(p), int(o))
                     for i, (a, p, o) in enumerate(zip(arrivals, prompts, outputs))], name=f"poisson{n}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=10_000)
    ap.add_argument("--rate", type=float, default=50.0, help="arrivals per simulated second")
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    w = poisson_workload(args.requests, args.rate)
    cfg = SchedulerConfig(policy="continuous", max_seqs=256, token_budget=8192, chunk=8192)
    model = StepModel("affine", base_ms=5.0, prefill_ms_per_token=0.02, decode_ms_per_seq=0.05)
    sims, mets = [], []
    for _ in range(args.repeat):
        t0 = time.perf_counter()
        tr = simulate(w, cfg, model)
        t1 = time.perf_counter()
        summarize(tr)
        t2 = time.perf_counter()
        sims.append(t1 - t0)
        mets.append(t2 - t1)
    sim, met = min(sims), min(mets)
    n_tok = len(tr.tokens)
    print(f"workload: {len(w)} requests, {int(sum(r.prompt_tokens for r in w.requests))} prompt tokens, "
          f"{n_tok} output tokens, {len(tr.steps)} steps, {len(tr.kv)} kv events")
    print(f"simulate: {sim:.3f} s (best of {args.repeat})  -> {len(w) / sim:,.0f} requests/s, "
          f"{n_tok / sim:,.0f} token emissions/s   [target < 2 s: {'met' if sim < 2 else 'MISSED'}]")
    print(f"metrics:  {met:.3f} s (best of {args.repeat})   [target < 1 s: {'met' if met < 1 else 'MISSED'}]")


if __name__ == "__main__":
    main()
