"""The runner's speed levers (issue 16), side by side in one run: an older revision of the
runner beside this checkout with each `--matmul` choice, alternating, on the same workload.

    python -m bench.runner_speed [--old-rev REV] [--repeat 3] [--threads 1] [--n 64]
                                 [--prompt 128] [--output 64] [--seats 16] [--budget 2048]

Workload: the issue's burst, N requests of PROMPT corpus tokens (the bundled tiny model's byte
tokenizer) asking for OUTPUT tokens each, all at t = 0, `continuous` with SEATS sequences and a
BUDGET-token step. Each variant runs in its own Python process (torch threads = --threads),
serves a 4-request warm-up, then the workload in-process (Engine.run: no HTTP server or
client), recording on; this checkout's variants with glibc keeping freed memory for reuse, as
`serve` and `capture` run (one variant without, beside them). Printed per variant: the best
of --repeat runs by output tokens/s (tokens / wall time of Engine.run), its mean TTFT, the
median decode-only and prefill step durations from its trace, and a hash of the greedy outputs
(equal hashes: the same tokens).
The old revision runs from a git worktree (default 17aa769, before issue 16's changes).
Not a test: nothing is asserted.
"""
import argparse
import contextlib
import os
import sys
import tempfile
from pathlib import Path

from bench.revisions import REPO, run_worker, worktree

OLD_REV = "17aa769"

WORKER = r"""
import hashlib, json, sys, time
import numpy as np, torch
from core.config import SchedulerConfig
try:
    from core.analysis.metrics import request_metrics
except ImportError:   # a revision before core's packages (issue 25)
    from core.metrics import request_metrics
from core.workload import Request, Workload
from gpu_runner import checkpoint
from gpu_runner.engine import Engine
from gpu_runner.options import EngineConfig
from gpu_runner.tokenizer import ByteTokenizer
a = json.loads(sys.argv[1])
if a.get("reuse"):        # (as serve and capture build their engine: gpu_runner.launch.build_engine)
    from core.sim.simulate import reuse_freed_memory
    reuse_freed_memory()
torch.set_num_threads(a["threads"])
tok = ByteTokenizer()
corpus = tok.encode(open("data/corpus/pydoc_topics.txt").read())
rng = np.random.default_rng(0)
reqs = []
for i in range(a["n"]):
    s = int(rng.integers(0, len(corpus) - a["prompt"]))
    reqs.append(Request(f"r{i}", 0.0, a["prompt"], a["output"], prompt_ids=tuple(corpus[s:s + a["prompt"]])))
model = checkpoint.load_bundled(checkpoint.BUNDLED["tiny"]).eval()
extra = {"matmul": a["matmul"]} if a["matmul"] else {}
cfg = EngineConfig(scheduler=SchedulerConfig("continuous", max_seqs=a["seats"], token_budget=a["budget"]), **extra)
eng = Engine(model, tok, cfg)
eng.run(Workload(reqs[:4]))
t0 = time.perf_counter()
tr, out = eng.run(Workload(reqs))
secs = time.perf_counter() - t0
n = sum(len(v) for v in out.values())
ttft = float(request_metrics(tr)["ttft_ms"].mean())
kinds = tr.batch.groupby("step")["kind"].agg(lambda k: "prefill" if (k == "prefill").any() else "decode")
d = tr.steps.set_index("step")["dur_ms"]
print(json.dumps({"tok_s": n / secs, "secs": secs, "ttft_ms": ttft,
                  "decode_ms": float(d[kinds[kinds == "decode"].index].median()),
                  "prefill_ms": float(d[kinds[kinds == "prefill"].index].median()),
                  "matmul": tr.meta["engine"].get("matmul", "torch"),
                  "outputs": hashlib.sha1(repr(sorted(out.items())).encode()).hexdigest()[:12]}))
"""


# this checkout runs as serve and capture build its engine (glibc keeping freed memory for reuse,
# core.sim.simulate.reuse_freed_memory), the old revision as it ran; one variant shows the difference
PLAIN_MALLOC = "freed memory returned (glibc's default)"


def run(tree: Path, args: dict) -> dict:
    return run_worker(tree, WORKER, args, 1800)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--old-rev", default=OLD_REV, help="git revision to compare against ('none': skip)")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--n", type=int, default=64)
    ap.add_argument("--prompt", type=int, default=128)
    ap.add_argument("--output", type=int, default=64)
    ap.add_argument("--seats", type=int, default=16)
    ap.add_argument("--budget", type=int, default=2048)
    a = ap.parse_args()
    base = {k: getattr(a, k) for k in ("threads", "n", "prompt", "output", "seats", "budget")}
    with tempfile.TemporaryDirectory() as tmp:
        variants = [("this checkout, --matmul torch", REPO, "torch"),
                    ("this checkout, --matmul onednn", REPO, "onednn"),
                    (f"this checkout, --matmul onednn, {PLAIN_MALLOC}", REPO, "onednn")]
        stack = contextlib.ExitStack()
        if a.old_rev != "none":
            old = stack.enter_context(worktree(a.old_rev, Path(tmp) / "old"))
            variants.insert(0, (f"old {a.old_rev}", old, None))
        try:
            results = {name: [] for name, _, _ in variants}
            for r in range(a.repeat):
                for name, tree, matmul in variants:
                    res = run(tree, {**base, "matmul": matmul, "reuse": tree == REPO and PLAIN_MALLOC not in name})
                    results[name].append(res)
                    print(f"round {r + 1}: {name:50s} {res['tok_s']:7.0f} tok/s", file=sys.stderr, flush=True)
        finally:
            stack.close()
    print(f"\nburst: {a.n} x ({a.prompt} prompt + {a.output} output) tokens, {a.seats} seats, "
          f"{a.budget}-token budget, {a.threads} thread(s), in-process, best of {a.repeat} by tok/s; "
          f"load average before: {os.getloadavg()[0]:.2f}\n")
    print("| variant | output tok/s | mean TTFT ms | decode step ms (median) | prefill step ms (median) | outputs |")
    print("|---|---|---|---|---|---|")
    first = None
    for name, _, _ in variants:
        b = max(results[name], key=lambda x: x["tok_s"])
        first = first or b["tok_s"]
        print(f"| {name} | {b['tok_s']:.0f} ({b['tok_s'] / first:.2f}x) | {b['ttft_ms']:.0f} | "
              f"{b['decode_ms']:.2f} | {b['prefill_ms']:.1f} | {b['outputs']} |")


if __name__ == "__main__":
    main()
