"""Loading a large Parquet trace: the earlier one-table layout vs per-record-type row groups.

    python -m bench.parquet_load [--requests 20000] [--rounds 2]

Simulates the bench.simulate distribution (prompt 1-2,048, output 1-512, Poisson 50/s,
continuous, 256 seats, 8,192-token budget) with KV events, writes the trace twice (one mixed
table, as earlier writers did; per-type row groups, as `save_trace` does now), then loads
each in a fresh process (load + validate, then summarize), alternating, and prints the time
and the child's peak RSS. Printed, never asserted.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from core.trace import save_trace

ROOT = Path(__file__).resolve().parent.parent
CHILD = ("import time; t=time.perf_counter(); from core.trace import load_trace; "
         "from core.analysis.metrics import summarize; "
         "tr=load_trace({path!r}); t1=time.perf_counter(); summarize(tr); t2=time.perf_counter(); "
         "hwm=[l for l in open('/proc/self/status') if l.startswith('VmHWM')][0].split()[1]; "
         "print(f'{{t1-t:.2f}} {{t2-t1:.2f}} {{hwm}}')")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=20_000)
    ap.add_argument("--rounds", type=int, default=2)
    a = ap.parse_args()
    import pyarrow.parquet as pq

    from bench.simulate import poisson_workload
    from core.config import SchedulerConfig
    from core.sim.simulate import simulate
    from core.sim.stepmodel import StepModel
    from core.trace.parquet import to_table
    tr = simulate(poisson_workload(a.requests, 50.0), SchedulerConfig(max_seqs=256, token_budget=8192, chunk=8192),
                  StepModel("affine", base_ms=5.0, prefill_ms_per_token=0.02, decode_ms_per_seq=0.05))
    events = sum(len(getattr(tr, t)) for t in ("tokens", "finishes", "steps", "batch", "kv", "preempts"))
    with tempfile.TemporaryDirectory() as d:
        files = {"one mixed table": Path(d) / "old.parquet", "per-type row groups": Path(d) / "new.parquet"}
        pq.write_table(to_table(tr), files["one mixed table"], compression="zstd")
        save_trace(tr, files["per-type row groups"])
        print(f"{a.requests:,} requests, {events:,} events; files "
              + ", ".join(f"{k} {p.stat().st_size / 2**20:.1f} MiB" for k, p in files.items()))
        del tr
        for r in range(1, a.rounds + 1):
            for label, path in files.items():
                p = subprocess.Popen([sys.executable, "-c", CHILD.format(path=str(path))], cwd=ROOT,
                                     env={**os.environ, "PYTHONPATH": str(ROOT)}, stdout=subprocess.PIPE, text=True)
                out = p.communicate()[0]
                # VmHWM: the child's own peak (a forked child's rusage would count this process's pages)
                load_s, summ_s, hwm_kb = out.split()
                print(f"round {r}, {label:20s}: load + validate {load_s} s, summarize {summ_s} s, "
                      f"peak RSS {int(hwm_kb) / 2**20:.2f} GB   [target 10 M events <= 3 s, <= 2 GB]")
    return 0


if __name__ == "__main__":
    sys.exit(main())
