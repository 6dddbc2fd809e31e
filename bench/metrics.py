"""The in-memory metrics' speed (issue 35: every metric written once, in core/analysis/definitions.py,
and evaluated by numpy here), side by side in one run: an older revision beside this checkout,
alternating, each (revision, round) in its own Python process.

    python -m bench.metrics [--old-rev REV] [--rounds 3] [--repeat 5]

Traces: the chapter's three requests (data/traces/chapter31_continuous.json), and simulated
traces of the Schedules page's Poisson 2000 and of bench.simulate's 10,000 requests (continuous,
256 seats, KV events recorded), simulated once per process (not timed). Timed, best of --repeat:
`summarize(trace, per_request=False)` (the replay page's panel, sweeps), `summarize(trace)` with
an SLO (the CLI's --json), and `request_metrics(trace)`. Prints mean over rounds, old / new and the
ratio. Not a test: nothing is asserted.
"""
import argparse
import contextlib
import os
import sys
import tempfile
from pathlib import Path

from bench.revisions import REPO, run_worker, worktree

OLD_REV = "bbc8653"

WORKER = r"""
import json, sys, time
from core.config import SchedulerConfig
from core.sim.simulate import simulate
from core.sim.stepmodel import StepModel
from core.lessons.scenarios import load_scenario
from core.analysis.metrics import SLO, request_metrics, summarize
from core.trace import load_trace
from bench.simulate import poisson_workload
a = json.loads(sys.argv[1])
model = StepModel("affine", base_ms=5.0, prefill_ms_per_token=0.02, decode_ms_per_seq=0.05)
traces = {"chapter 31 (3 requests)": load_trace("data/traces/chapter31_continuous.json"),
          "Poisson 2000, continuous 32": simulate(load_scenario("poisson2000"), SchedulerConfig(max_seqs=32), model),
          "10k continuous 256": simulate(poisson_workload(10000, 50.0),
                                         SchedulerConfig(max_seqs=256, token_budget=8192, chunk=8192), model)}
slo = SLO(ttft_ms=500.0, tpot_ms=50.0)
cases = {"summary": lambda tr: summarize(tr, per_request=False),
         "summary + SLO + rows": lambda tr: summarize(tr, slo=slo),
         "request_metrics": request_metrics}
out = {}
for tname, tr in traces.items():
    for cname, fn in cases.items():
        fn(tr)
        best = 1e9
        for _ in range(a["repeat"]):
            t = time.perf_counter(); fn(tr); best = min(best, time.perf_counter() - t)
        out[f"{tname}|{cname}"] = best
print(json.dumps(out))
"""


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--old-rev", default=OLD_REV)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--repeat", type=int, default=5)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp, contextlib.ExitStack() as stack:
        old = stack.enter_context(worktree(a.old_rev, Path(tmp) / "old"))
        trees = [(f"old {a.old_rev}", old), ("new", REPO)]
        results = {name: [] for name, _ in trees}
        for r in range(a.rounds):
            for name, tree in trees:
                results[name].append(run_worker(tree, WORKER, {"repeat": a.repeat}, 3600))
                print(f"round {r + 1}: {name} done", file=sys.stderr, flush=True)
    print(f"\nbest of {a.repeat} per process, mean over {a.rounds} alternating rounds; load average now "
          f"{os.getloadavg()[0]:.2f}\n")
    names = [n for n, _ in trees]
    print("| trace | call | " + " | ".join(names) + " | new / old |\n|---|---|---|---|---|")
    for key in results[names[-1]][0]:
        means = [sum(x[key] for x in results[n]) / len(results[n]) for n in names]
        trace, call = key.split("|")
        print(f"| {trace} | {call} | " + " | ".join(f"{m * 1000:.2f} ms" for m in means)
              + f" | {means[-1] / means[0]:.3f} |")


if __name__ == "__main__":
    main()
