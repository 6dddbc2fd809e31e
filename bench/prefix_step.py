"""A shared-prefix workload simulated with prefix caching, this checkout against an older revision,
side by side (the engine compiled in both: `python setup.py build_ext --inplace` is run in the older
revision's worktree first).

    python -m bench.prefix_step [--base REV] [--rounds 3] [--repeat 3] [--requests 3000] [--cpu-kv-blocks 0]

Workload (seeded): --requests requests, Poisson 1/3 ms, each behind one of 12 shared 256-token
prefixes plus 1..300 tokens of its own, 1..90 output tokens. Engine: vllm-v1, 16 seats, 512-token
budget, chunk 256, 200 GPU blocks of 16 tokens, prefix caching with vLLM V1's KV manager (with
--cpu-kv-blocks N, a CPU tier of N blocks at 10 GB/s); affine steps 2 ms + 0.01 ms/prefill token +
0.05 ms/decode sequence. Each round runs the older revision and then this checkout, each in its own
process, best of --repeat `simulate` calls in process; prints seconds per round and the steps and
KV events, which must be equal (the same trace). Nothing is asserted. The machine must be idle.
"""
import argparse

from bench.revisions import REPO, built_worktree, run_worker

WORKER = r"""
import json, sys, time
import numpy as np
from core.config import SchedulerConfig
from core.sim.simulate import reuse_freed_memory, simulate
from core.sim.stepmodel import StepModel
from core.workload import Request, Workload
import core.compiled as compiled
a = json.loads(sys.argv[1])
reuse_freed_memory()
rng = np.random.default_rng(7)
t = np.cumsum(rng.exponential(3.0, a["requests"]))
rows = []
for i in range(a["requests"]):
    p, o, k = int(rng.integers(1, 300)), int(rng.integers(1, 90)), int(rng.integers(0, 12))
    ids = tuple(range(1000 * k, 1000 * k + 256)) + tuple(int(x) for x in rng.integers(20000, 50000, p))
    rows.append(Request(f"q{i}", float(t[i]), p + 256, o, prompt_ids=ids))
w = Workload(rows, name="shared prefixes")
tier = {"cpu_kv_blocks": a["cpu"], "kv_block_bytes": 1 << 16, "host_gbps": 10.0} if a["cpu"] else {}
cfg = SchedulerConfig("vllm-v1", max_seqs=16, token_budget=512, chunk=256, kv_blocks=200, prefix_caching=True,
                      kv_manager="vllm-v1", **tier)
sm = StepModel("affine", base_ms=2.0, prefill_ms_per_token=0.01, decode_ms_per_seq=0.05)
best = float("inf")
for _ in range(a["repeat"]):
    t0 = time.perf_counter()
    tr = simulate(w, cfg, sm)
    best = min(best, time.perf_counter() - t0)
print(json.dumps({"s": best, "steps": len(tr.steps), "kv": len(tr.kv), "tier": len(tr.events_of("tier")),
                  "state": compiled.STATE}))
"""


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--base", default="HEAD~1", help="the older revision (default HEAD~1)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--requests", type=int, default=3000)
    ap.add_argument("--cpu-kv-blocks", type=int, default=0)
    a = ap.parse_args(argv)
    args = {"requests": a.requests, "repeat": a.repeat, "cpu": a.cpu_kv_blocks}
    with built_worktree(a.base) as base:
        print(f"{'round':>5} {a.base + ' s':>14} {'this s':>8}  ratio  steps / KV rows / tier events (base; this)")
        for k in range(a.rounds):
            old, new = run_worker(base, WORKER, args), run_worker(REPO, WORKER, args)
            same = (old["steps"], old["kv"], old["tier"]) == (new["steps"], new["kv"], new["tier"])
            print(f"{k + 1:>5} {old['s']:14.3f} {new['s']:8.3f}  {old['s'] / new['s']:.2f}x  "
                  f"{old['steps']:,} / {old['kv']:,} / {old['tier']:,}; "
                  f"{'the same' if same else 'DIFFERENT: ' + str((new['steps'], new['kv'], new['tier']))}"
                  f"  ({old['state'][:8]}; {new['state'][:8]})")


if __name__ == "__main__":
    main()
