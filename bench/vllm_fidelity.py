"""Fit on one vLLM run, predict another workload's run (issue 15's vLLM CPU target: median
per-request TTFT and E2E error <= 15% with the vllm-v1 policy and vLLM's settings).

    python -m bench.vllm_fidelity RUN_A.json RUN_B.json [RUN_C.json ...] [--max-seqs 16]
                                  [--token-budget 2048] [--block-size 128]

RUN_A / RUN_B: `vllm bench serve --save-result` files with per-request details and send times
(bench/vllm_cpu.sh writes them as $OUT/vllm_bench.json), of two different workloads on the same
server settings. Each is fitted from its requests (core.reqfit: the file has no step events) and
used to predict the others: another file's workload (its send times, prompt and output
lengths) simulated with the fitted step model, compared request by request with what vLLM
measured. With three or more runs, also each run predicted by a joint fit of all the others.
Prints; asserts nothing. Not run in CI.
"""
import argparse
from pathlib import Path

import numpy as np

from core.config import SchedulerConfig
from core.reqfit import errors, fit_from_requests
from core.simulate import simulate
from core.trace import open_trace


def row(fit_names, pred_name, e):
    print(f"{' + '.join(fit_names):>44} {pred_name:>28} {np.median(e['ttft_ms']):>9.1%} "
          f"{np.percentile(e['ttft_ms'], 90):>9.1%} {np.median(e['e2e_ms']):>8.1%} "
          f"{np.percentile(e['e2e_ms'], 90):>8.1%}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("runs", nargs="+", help="two or more vLLM result files of different workloads")
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
        runs.append((Path(path).stem, imp.trace))
    print(f"scheduler: {cfg.to_dict()}")
    print(f"{'fit on':>44} {'predict':>28} {'TTFT med':>9} {'TTFT p90':>9} {'E2E med':>8} {'E2E p90':>8}")
    # each run alone, predicting every other run
    for name, tr in runs:
        sm, _ = fit_from_requests(tr, cfg)
        for other, tb in runs:
            row([name], "(itself)" if other == name else other, errors(simulate(tb.workload(), cfg, sm), tb))
        print(f"{'':>44} {sm.describe()}")
    # all the others together, predicting the one left out
    if len(runs) > 2:
        for name, tr in runs:
            rest = [(n, t) for n, t in runs if n != name]
            sm, _ = fit_from_requests([t for _, t in rest], cfg)
            row([n for n, _ in rest], name, errors(simulate(tr.workload(), cfg, sm), tr))
            print(f"{'':>44} {sm.describe()}")


if __name__ == "__main__":
    main()
