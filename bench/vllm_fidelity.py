"""Fit on one vLLM run, predict another workload's run (issue 15's vLLM CPU target: median
per-request TTFT and E2E error <= 15% with the vllm-v1 policy and vLLM's settings).

    python -m bench.vllm_fidelity RUN_A.json RUN_B.json [--max-seqs 16] [--token-budget 2048]
                                  [--block-size 128]

RUN_A / RUN_B: `vllm bench serve --save-result` files with per-request details and send times
(bench/vllm_cpu.sh writes them as $OUT/vllm_bench.json), of two different workloads on the same
server settings. Each is fitted from its requests (core.reqfit: the file has no step events) and
used to predict the other: the other file's workload (its send times, prompt and output
lengths) simulated with the fitted step model, compared request by request with what vLLM
measured. Prints; asserts nothing. Not run in CI.
"""
import argparse

import numpy as np

from core.config import SchedulerConfig
from core.reqfit import errors, fit_from_requests
from core.simulate import simulate
from core.trace import open_trace


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("runs", nargs=2)
    ap.add_argument("--max-seqs", type=int, default=16)
    ap.add_argument("--token-budget", type=int, default=2048)
    ap.add_argument("--block-size", type=int, default=128)
    a = ap.parse_args()
    cfg = SchedulerConfig("vllm-v1", max_seqs=a.max_seqs, token_budget=a.token_budget, block_size=a.block_size)
    runs = []
    for path in a.runs:
        imp = open_trace(path)
        if imp.trace is None or getattr(imp, "aligned_at_zero", False):
            raise SystemExit(f"{path}: needs per-request details with send times")
        runs.append((path, imp.trace))
    print(f"scheduler: {cfg.to_dict()}")
    print(f"{'fit on':>40} {'predict':>40} {'TTFT med':>9} {'TTFT p90':>9} {'E2E med':>8} {'E2E p90':>8}")
    for (fa, ta), (fb, tb) in (runs, runs[::-1]):
        sm, rep = fit_from_requests(ta, cfg)
        own = rep["error"]
        e = errors(simulate(tb.workload(), cfg, sm, record_kv=False), tb)
        print(f"{fa[-40:]:>40} {'(itself)':>40} {own['ttft_ms']['p50']:>9.1%} {own['ttft_ms']['p90']:>9.1%} "
              f"{own['e2e_ms']['p50']:>8.1%} {own['e2e_ms']['p90']:>8.1%}")
        print(f"{fa[-40:]:>40} {fb[-40:]:>40} {np.median(e['ttft_ms']):>9.1%} {np.percentile(e['ttft_ms'], 90):>9.1%} "
              f"{np.median(e['e2e_ms']):>8.1%} {np.percentile(e['e2e_ms'], 90):>8.1%}")
        print(f"{'':>40} {'':>40} {sm.describe()}")


if __name__ == "__main__":
    main()
