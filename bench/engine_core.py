"""The engine core's speed (issue 25), side by side in one run: an older revision beside this
checkout, alternating, on the simulator's workloads; then this checkout's fast paths each
turned off.

    python -m bench.engine_core [--old-rev REV] [--rounds 3] [--repeat 3]

Workloads: bench.simulate's 10,000 requests (continuous, 256 seats, 8,192-token budget,
chunk 8,192, KV events recorded), and the Schedules page's Poisson 2000 under serial, static
(32 seats), continuous (32), continuous with chunked prefill (512 of a 2,048 budget), vllm-v0
and sarathi (KV events off, as that page runs them); affine step model 5 ms + 0.02 ms/prefill
token + 0.05 ms/decode sequence. Each (revision, round) runs in its own Python process and
prints the best of --repeat per workload; the table shows the mean over rounds, old / new and
their ratio. Fast paths: `Scheduler.decode_fast_path` (the steady-state plan) and
`fast_forward` (runs of identical decode steps) each off, this checkout only.
Not a test: nothing is asserted.
"""
import argparse
import contextlib
import os
import sys
import tempfile
from pathlib import Path

from bench.revisions import REPO, run_worker, worktree

OLD_REV = "72f5486"

WORKER = r"""
import json, sys, time
from core.config import SchedulerConfig
try:
    from core.sim.simulate import simulate
    from core.sim.stepmodel import StepModel
    from core.lessons.scenarios import load_scenario
    from core.engine.scheduler import Scheduler
except ImportError:   # a revision before core's packages
    from core.simulate import simulate, StepModel
    from core.scenarios import load_scenario
    from core.scheduler import Scheduler
from bench.simulate import poisson_workload
a = json.loads(sys.argv[1])
model = StepModel("affine", base_ms=5.0, prefill_ms_per_token=0.02, decode_ms_per_seq=0.05)
w10, w2 = poisson_workload(10000, 50.0), load_scenario("poisson2000")
cases = {"10k continuous": (w10, dict(policy="continuous", max_seqs=256, token_budget=8192, chunk=8192), True),
         "2k serial": (w2, dict(policy="serial"), False),
         "2k static 32": (w2, dict(policy="static", max_seqs=32), False),
         "2k continuous 32": (w2, dict(policy="continuous", max_seqs=32), False),
         "2k chunked 512": (w2, dict(policy="continuous", max_seqs=32, chunk=512, token_budget=2048), False),
         "2k vllm-v0": (w2, dict(policy="vllm-v0", max_seqs=32, token_budget=8192), False),
         "2k sarathi": (w2, dict(policy="sarathi", max_seqs=32), False)}
if a.get("fast_paths"):
    cases = {k: cases[k] for k in ("10k continuous", "2k static 32", "2k serial")}
out = {}
for name, (w, cfg, kv) in cases.items():
    cfg = SchedulerConfig(**cfg)
    for variant in (["both on", "steady plan off", "fast-forward off"] if a.get("fast_paths") else ["as is"]):
        Scheduler.decode_fast_path = variant != "steady plan off"
        ff = variant != "fast-forward off"
        n = 1 if (not ff and "serial" in name) else a["repeat"]
        simulate(w, cfg, model, record_kv=kv, fast_forward=ff)   # warm
        best = 1e9
        for _ in range(n):
            t = time.perf_counter(); simulate(w, cfg, model, record_kv=kv, fast_forward=ff)
            best = min(best, time.perf_counter() - t)
        out[f"{name}|{variant}"] = best
print(json.dumps(out))
"""


def run(tree: Path, args: dict) -> dict:
    return run_worker(tree, WORKER, args, 3600)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--old-rev", default=OLD_REV, help="git revision to compare against ('none': skip)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--repeat", type=int, default=3)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        trees = [("new", REPO)]
        stack = contextlib.ExitStack()
        if a.old_rev != "none":
            old = stack.enter_context(worktree(a.old_rev, Path(tmp) / "old"))
            trees.insert(0, (f"old {a.old_rev}", old))
        try:
            results = {name: [] for name, _ in trees}
            for r in range(a.rounds):
                for name, tree in trees:
                    results[name].append(run(tree, {"repeat": a.repeat}))
                    print(f"round {r + 1}: {name} done", file=sys.stderr, flush=True)
            fast = run(REPO, {"repeat": a.repeat, "fast_paths": True})
        finally:
            stack.close()
    print(f"\nbest of {a.repeat} per process, mean over {a.rounds} alternating rounds; load average now "
          f"{os.getloadavg()[0]:.2f}\n")
    names = [n for n, _ in trees]
    print("| workload | " + " | ".join(names) + (" | new / old |" if len(names) > 1 else " |"))
    print("|---" * (len(names) + 1 + (len(names) > 1)) + "|")
    for key in results[names[-1]][0]:
        means = [sum(x[key] for x in results[n]) / len(results[n]) for n in names]
        ratio = f" | {means[-1] / means[0]:.3f}" if len(names) > 1 else ""
        print(f"| {key.split('|')[0]} | " + " | ".join(f"{m * 1000:.0f} ms" for m in means) + ratio + " |")
    print("\nfast paths (this checkout):\n")
    print("| workload | both on | steady plan off | fast-forward off |\n|---|---|---|---|")
    for w in dict.fromkeys(k.split("|")[0] for k in fast):
        on = fast[f"{w}|both on"]
        cells = [f"{on * 1000:.0f} ms"] + [f"{fast[f'{w}|{v}'] * 1000:.0f} ms ({fast[f'{w}|{v}'] / on:.2f}x)"
                                           for v in ("steady plan off", "fast-forward off")]
        print(f"| {w} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
