"""Fit on one vLLM run, predict another workload's run (issue 15's vLLM CPU target: median
per-request TTFT and E2E error <= 15% with the vllm-v1 policy and vLLM's settings).

    python -m bench.vllm_fidelity RUN_A.json RUN_B.json [RUN_C.json ...] [--max-seqs 16]
        [--token-budget 2048] [--block-size 128] [--method steps|requests] [--replay auto|send-times]

RUN_A / RUN_B: `vllm bench serve --save-result` files with per-request details and send times
(bench/vllm_cpu.sh writes them as $OUT/vllm_bench_vllm.json), of different workloads on the
same server settings. Each is fitted (`--method steps`, the default: to the engine steps
inferred from the streamed token times, core.stepinfer; `requests`: to the per-request TTFT
and E2E, core.reqfit) and used to predict the others: the other file's requests (prompt and
output lengths) simulated with the fitted step model and compared request by request with
what vLLM measured. How the requests arrive (`--replay auto`): a run whose client kept a fixed
number of requests in flight (request rate inf, max concurrency C) is simulated as that
closed loop, each request sent when one finishes in the simulation; any other run at its
measured send times (`--replay send-times` forces that for all: a closed loop's send times
then carry the measured engine's speed into the prediction). With three or more runs, also
each run predicted by a joint fit of all the others. Prints; asserts nothing. Not run in CI.
"""
import argparse
from pathlib import Path

import numpy as np

from core.config import SchedulerConfig
from core.reqfit import errors, fit_from_requests
from core.simulate import simulate
from core.stepinfer import closed_loop_clients, fit_inferred
from core.sweep import simulate_closed
from core.trace import open_trace


def row(fit_names, pred_name, how, e):
    print(f"{' + '.join(fit_names):>60} {pred_name:>40} {how:>11} {np.median(e['ttft_ms']):>9.1%} "
          f"{np.percentile(e['ttft_ms'], 90):>9.1%} {np.median(e['e2e_ms']):>8.1%} "
          f"{np.percentile(e['e2e_ms'], 90):>8.1%}", flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("runs", nargs="+", help="two or more vLLM result files of different workloads")
    ap.add_argument("--max-seqs", type=int, default=16)
    ap.add_argument("--token-budget", type=int, default=2048)
    ap.add_argument("--block-size", type=int, default=128)
    ap.add_argument("--method", choices=("steps", "requests"), default="steps")
    ap.add_argument("--model", choices=("affine", "features"), default="affine")
    ap.add_argument("--replay", choices=("auto", "send-times"), default="auto")
    a = ap.parse_args()
    cfg = SchedulerConfig("vllm-v1", max_seqs=a.max_seqs, token_budget=a.token_budget, block_size=a.block_size)
    runs = []
    for path in a.runs:
        imp = open_trace(path)
        if imp.trace is None or getattr(imp, "aligned_at_zero", False):
            raise SystemExit(f"{path}: needs per-request details with send times")
        runs.append((Path(path).stem, imp.trace))

    def fit(traces):
        if a.method == "steps":
            return fit_inferred(traces, cfg, a.model)[0]
        return fit_from_requests(traces, cfg, a.model)[0]

    def predict(sm, tr):
        clients = closed_loop_clients(tr) if a.replay == "auto" else None
        if clients:
            return f"closed {clients}", errors(simulate_closed(tr.workload(), cfg, sm, clients)[0], tr)
        return "send times", errors(simulate(tr.workload(), cfg, sm), tr)

    print(f"scheduler: {cfg.to_dict()}; fitted to {a.method}, {a.model} model")
    print(f"{'fit on':>60} {'predict':>40} {'arrivals':>11} {'TTFT med':>9} {'TTFT p90':>9} {'E2E med':>8} "
          f"{'E2E p90':>8}")
    for name, tr in runs:               # each run alone, predicting every run
        sm = fit(tr)
        for other, tb in runs:
            row([name], "(itself)" if other == name else other, *predict(sm, tb))
        print(f"{'':>60} {sm.describe()}")
    if len(runs) > 2:                   # all the others together, predicting the one left out
        for name, tr in runs:
            rest = [(n, t) for n, t in runs if n != name]
            sm = fit([t for _, t in rest])
            row([n for n, _ in rest], name, *predict(sm, tr))
            print(f"{'':>60} {sm.describe()}")


if __name__ == "__main__":
    main()
