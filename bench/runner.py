"""Runner benchmarks with the bundled target model, measured side by side in one run.

    python -m bench.runner [--threads 2] [--quick]

1. continuous batching vs serial on a 64-request burst: output tokens/s ratio (target >= 4x)
2. recording on vs off: wall-time overhead (target <= 10%)
3. prefix caching on vs off with a long shared system prompt: prefill tokens computed and
   mean TTFT ratio; negative control with distinct prompts (no gain expected)
4. simulator prediction vs measurement: fit the affine step model on one captured run,
   simulate another workload, report TTFT/E2E errors against its measured run
Prints numbers; never asserts timings.
"""
import argparse
import os
import platform
import statistics
import time

import numpy as np
import torch

from core.analysis.metrics import request_metrics, throughput
from core.config import SchedulerConfig
from core.sim.simulate import simulate
from core.sim.stepmodel import fit_affine
from core.workload import Request, Workload
from gpu_runner import checkpoint
from gpu_runner.engine import Engine
from gpu_runner.options import EngineConfig
from gpu_runner.tokenizer import ByteTokenizer

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TOK = ByteTokenizer()
with open(os.path.join(ROOT, "data", "corpus", "pydoc_topics.txt")) as _f:
    CORPUS = TOK.encode(_f.read())


def burst(n, prompt, output, seed=0, gap_ms=0.0):
    rng = np.random.default_rng(seed)
    reqs = []
    for i in range(n):
        s = int(rng.integers(0, len(CORPUS) - prompt))
        reqs.append(Request(f"r{i}", i * gap_ms, prompt, output, prompt_ids=tuple(CORPUS[s:s + prompt])))
    return Workload(reqs, name=f"burst{n}")


def shared(n, system_len, user_len, output, distinct=False, seed=1, gap_ms=15.0):
    rng = np.random.default_rng(seed)
    s0 = int(rng.integers(0, len(CORPUS) - system_len))
    reqs = []
    for i in range(n):
        if distinct:
            s0 = int(rng.integers(0, len(CORPUS) - system_len))
        u = int(rng.integers(0, len(CORPUS) - user_len))
        ids = tuple(CORPUS[s0:s0 + system_len] + CORPUS[u:u + user_len])
        reqs.append(Request(f"q{i}", i * gap_ms, len(ids), output, prompt_ids=ids))
    return Workload(reqs, name="distinct" if distinct else "shared")


def serve(model, w, record=True, **sched):
    eng = Engine(model, TOK, EngineConfig(scheduler=SchedulerConfig(**sched), record=record))
    t0 = time.perf_counter()
    tr, out = eng.run(w)
    return tr, out, time.perf_counter() - t0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--quick", action="store_true", help="smaller workloads (smoke run)")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    model = checkpoint.load_bundled(checkpoint.BUNDLED["tiny"])
    print(f"model: tiny ({model.num_params():,} params, float32), CPU {platform.machine()}, {a.threads} threads, "
          f"torch {torch.__version__}")
    n = 16 if a.quick else 64

    # 1. continuous vs serial
    w = burst(n, 64, 64)
    _, _, warm = serve(model, burst(2, 16, 4), policy="continuous")
    tr_s, out_s, sec_s = serve(model, w, policy="serial")
    tr_c, out_c, sec_c = serve(model, w, policy="continuous", max_seqs=64)
    tok = sum(len(v) for v in out_c.values())
    print(f"\n1. {n}-request burst (64 prompt + 64 output tokens each), greedy")
    print(f"   serial:     {sec_s:7.2f} s  {tok / sec_s:8.1f} output tok/s")
    print(f"   continuous: {sec_c:7.2f} s  {tok / sec_c:8.1f} output tok/s   ratio {sec_s / sec_c:.2f}x "
          f"(target >= 4x); same tokens: {out_s == out_c}")

    # 2. recording overhead (median of 3 alternating runs)
    w2 = burst(n // 2, 48, 48, seed=5)
    on, off = [], []
    for _ in range(3):
        on.append(serve(model, w2, record=True, policy="continuous")[2])
        off.append(serve(model, w2, record=False, policy="continuous")[2])
    m_on, m_off = statistics.median(on), statistics.median(off)
    print(f"\n2. recording on vs off ({n // 2} requests, median of 3): on {m_on:.3f} s, off {m_off:.3f} s, "
          f"overhead {100 * (m_on / m_off - 1):+.1f}% (target <= 10%)")

    # 3. prefix caching
    print("\n3. prefix caching (16 requests arriving 15 ms apart, 512-token shared system prompt + 32-token question,"
          " 16 output tokens)")
    for distinct in (False, True):
        ws = shared(16 if not a.quick else 8, 512, 32, 16, distinct=distinct)
        res = {}
        for pc in (True, False):
            tr, out, sec = serve(model, ws, policy="continuous", prefix_caching=pc, block_size=16)
            pre = int(tr.batch[tr.batch["kind"] == "prefill"]["tokens"].sum())
            ttft = float(request_metrics(tr)["ttft_ms"].mean())
            res[pc] = (pre, ttft, out)
        label = "distinct prompts (negative control)" if distinct else "shared system prompt"
        print(f"   {label:36} prefill tokens on/off {res[True][0]:>6}/{res[False][0]:<6} "
              f"mean TTFT on/off {res[True][1]:7.1f}/{res[False][1]:7.1f} ms "
              f"(ratio {res[True][1] / res[False][1]:.2f}); same tokens: {res[True][2] == res[False][2]}")

    # 4. prediction vs measurement
    fit_w = burst(n // 2, 96, 32, seed=7, gap_ms=10.0)
    test_w = burst(n // 2, 160, 48, seed=8, gap_ms=25.0)
    cfg = dict(policy="continuous", max_seqs=16, token_budget=512, chunk=128)
    fit_tr, _, _ = serve(model, fit_w, **cfg)
    sm = fit_affine(fit_tr)
    meas, _, _ = serve(model, test_w, **cfg)
    pred = simulate(test_w, SchedulerConfig(**cfg), sm)
    mm, mp = request_metrics(meas).set_index("id"), request_metrics(pred).set_index("id")
    print(f"\n4. simulator vs measurement: fitted {sm.describe()}")
    for k in ("ttft_ms", "e2e_ms"):
        err = (mp[k] - mm[k]).abs() / mm[k]
        print(f"   {k}: mean measured {mm[k].mean():.1f} ms, predicted {mp[k].mean():.1f} ms; "
              f"per-request relative error median {100 * err.median():.1f}%, p90 {100 * err.quantile(0.9):.1f}%")
    print(f"   throughput measured {throughput(meas).tok_per_s:.1f} tok/s, predicted {throughput(pred).tok_per_s:.1f}")


if __name__ == "__main__":
    main()
