"""The Fleet page's simulation (what a router change waits for before its charts), this checkout
against an older revision, side by side (the engine compiled in both: `python setup.py build_ext
--inplace` is run in the older revision's worktree first).

    python -m bench.fleet_page_speed [--base REV] [--rounds 3] [--repeat 3] [--routers least-requests,...]

The page's defaults: the bundled Poisson 10000 scenario, arrivals compressed x4 (the page's load
multiplier), 4 replicas, each an engine with the page's scheduler defaults (continuous batching, no seat
or token limit, prefix caching on: the scenario has no token ids, so nothing is ever hit) and its
affine steps (5 ms + 0.05 ms/prefill token + 0.2 ms/decode sequence), every trace table built in
memory (core.fleet.sim.simulate_fleet). Each round runs the older revision and then this checkout,
each in its own process, best of --repeat runs per router in process; prints seconds per router and
the steps and KV rows, which must be equal (the same trace). Nothing is asserted. The machine must be
idle. bench.interactions times the same change in a browser, charts included.
"""
import argparse

from bench.revisions import REPO, built_worktree, run_worker

WORKER = r"""
import dataclasses, json, sys, time
from core.config import SchedulerConfig
from core.fleet.router import RouterConfig
from core.fleet.sim import FleetSpec, simulate_fleet
from core.lessons.scenarios import load_scenario
from core.sim.simulate import reuse_freed_memory
from core.sim.stepmodel import StepModel
from core.workload import Workload
import core.compiled as compiled
a = json.loads(sys.argv[1])
reuse_freed_memory()
w0 = load_scenario("poisson10000")
w = Workload([dataclasses.replace(r, arrival_ms=r.arrival_ms / 4.0) for r in w0.requests], name=w0.name)
sm = StepModel("affine", base_ms=5.0, prefill_ms_per_token=0.05, decode_ms_per_seq=0.2)
cfg = SchedulerConfig(prefix_caching=True)
out = {"state": compiled.STATE}
for pol in a["routers"]:
    best = float("inf")
    for _ in range(a["repeat"]):
        t0 = time.perf_counter()
        tr = simulate_fleet(w, FleetSpec.uniform(4, cfg, sm, router=RouterConfig(pol)))
        best = min(best, time.perf_counter() - t0)
        shape = [len(tr.steps), len(tr.kv)]
        del tr
    out[pol] = [best] + shape
print(json.dumps(out))
"""


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--base", default="HEAD~1", help="the older revision (default HEAD~1)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--routers", default="least-requests,prefix-aware,round-robin")
    a = ap.parse_args(argv)
    args = {"routers": a.routers.split(","), "repeat": a.repeat}
    with built_worktree(a.base) as base:
        print(f"{'round':>5} {'router':>16} {a.base + ' s':>14} {'this s':>8}  ratio  steps / KV rows")
        for k in range(a.rounds):
            old, new = run_worker(base, WORKER, args), run_worker(REPO, WORKER, args)
            for pol in args["routers"]:
                (s0, *shape0), (s1, *shape1) = old[pol], new[pol]
                same = "the same" if shape0 == shape1 else f"DIFFERENT: {shape0} vs {shape1}"
                print(f"{k + 1:>5} {pol:>16} {s0:14.3f} {s1:8.3f}  {s0 / s1:.2f}x  {shape1[0]:,} / {shape1[1]:,}: "
                      f"{same}  ({old['state'][:8]}; {new['state'][:8]})")


if __name__ == "__main__":
    main()
