"""Speculative decoding on vs off with the bundled pair (tiny target, tiny-draft), CPU.

    python -m bench.speculative [--threads 2] [--temperature 0.8]

For gamma in {1, 2, 4, 8}: output tokens/s with and without speculation (same workload,
measured in one run), acceptance rate per draft position, the measured per-proposal
acceptance alpha, mean tokens emitted per verification, and the i.i.d. formula
(1 - alpha^(gamma+1)) / (1 - alpha) at that alpha. Prints numbers; asserts nothing.
"""
import argparse
import time

import torch

from core.config import SamplingParams, SchedulerConfig
from core.formulas.speculative import acceptance_by_position, expected_tokens
from core.workload import Request, Workload
from gpu_runner import checkpoint
from gpu_runner.engine import Engine
from gpu_runner.options import EngineConfig
from gpu_runner.tokenizer import ByteTokenizer

PROMPTS = ['The "while" statement is used', "A list comprehension", "Exceptions are raised", "The import system",
           "Assignment statements", "Function definitions", "The standard type hierarchy", "Comparisons"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--temperature", type=float, default=0.8)
    ap.add_argument("--requests", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=96)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    tok = ByteTokenizer()
    target = checkpoint.load_bundled(checkpoint.BUNDLED["tiny"])
    draft = checkpoint.load_bundled(checkpoint.BUNDLED["tiny-draft"])
    w = Workload([Request(f"r{i}", 0.0, len(tok.encode(p)), a.tokens, prompt_ids=tuple(tok.encode(p)))
                  for i, p in enumerate((PROMPTS * 4)[:a.requests])])
    sp = SamplingParams(a.temperature, seed=0)
    print(f"target tiny ({target.num_params():,} params) + draft tiny-draft ({draft.num_params():,}), CPU "
          f"{a.threads} threads, float32, temperature {a.temperature}, {a.requests} requests x {a.tokens} tokens, "
          f"continuous batching")

    def serve(gamma=None):
        eng = Engine(target, tok, EngineConfig(scheduler=SchedulerConfig(), sampling=sp, gamma=gamma or 1),
                     draft=draft if gamma else None, draft_name="tiny-draft" if gamma else None)
        t0 = time.perf_counter()
        tr, out = eng.run(w)
        return tr, sum(len(v) for v in out.values()) / (time.perf_counter() - t0)

    serve()  # warm-up
    _, base = serve()
    print(f"\nno speculation: {base:8.1f} output tok/s")
    print(f"{'gamma':>5} {'tok/s':>8} {'vs off':>7} {'alpha':>6} {'tokens/verify':>13} {'formula':>8}  "
          "acceptance by position")
    for gamma in (1, 2, 4, 8):
        tr, rate = serve(gamma)
        ev = [e for e in tr.other if e["type"] == "spec" and len(e["proposed"]) == gamma]
        evaluated = sum(len(e["positions"]) for e in ev)
        alpha = sum(e["accepted"] for e in ev) / max(evaluated, 1)
        per_verify = sum(e["accepted"] + 1 for e in ev) / max(len(ev), 1)
        pos, rates, counts = acceptance_by_position(ev)
        by_pos = " ".join(f"{r:.2f}" for r in rates)
        print(f"{gamma:>5} {rate:8.1f} {rate / base:6.2f}x {alpha:6.3f} {per_verify:13.3f} "
              f"{expected_tokens(alpha, gamma):8.3f}  [{by_pos}]")


if __name__ == "__main__":
    main()
