"""Per-step overhead of the runner (issue 16): a decode step of one sequence on the bundled tiny
model, against the time of that step's matmuls alone.

    python -m bench.step_overhead [--threads 1] [--steps 400] [--context 128]

- step: `gpu_runner` Engine serving one request (a `--context`-token prompt, then `--steps`
  output tokens, greedy); the median measured duration of its decode steps (the trace's step
  events: wall time from the step's start until its tokens are on the host, scheduling
  included);
- matmuls: the same step's linear layers alone (every layer's q/k/v, o, gate, up and down
  projections and the tied output head, for one token, with the model's weights), timed
  back to back in a loop (median of `--steps` repeats), twice: as torch.nn.functional.linear
  calls, and as the engine runs them (`--matmul onednn`, the CPU default: packed, fused
  q|k|v and gate|up, with the rotary embedding and SwiGLU's silu that those calls include);
- forward: the model's forward_paged for that one token with the reference paged attention
  and the engine's linears (no scheduling, no sampling), median of `--steps` repeats.
Goal (issue 16): step <= 1.5 x matmuls. Runs everything in one process, side by side.
"""
import argparse
import platform
import statistics
import time

import torch
import torch.nn.functional as F

from core.config import SchedulerConfig
from core.workload import Request, Workload
from gpu_runner import checkpoint
from gpu_runner.batching import attend_with, forward, pack, slots_of
from gpu_runner.engine import Engine, PagedKVCache
from gpu_runner.kernels.reference import paged_attention
from gpu_runner.options import EngineConfig
from gpu_runner.tokenizer import ByteTokenizer


def linears(model):
    """(weight, bias) of every linear layer one token passes through, in order."""
    out = []
    for layer in model.layers:
        for mod in layer.modules():
            if isinstance(mod, torch.nn.Linear):
                out.append((mod.weight, mod.bias))
    out.append((model.lm_head.weight, None))
    return out


def median_ms(fn, reps: int) -> float:
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t) * 1000)
    return statistics.median(times)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--steps", type=int, default=400)
    ap.add_argument("--context", type=int, default=128)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    model = checkpoint.load_bundled(checkpoint.BUNDLED["tiny"])
    model.eval()
    prompt = list(range(1, a.context + 1))
    w = Workload([Request("r0", 0.0, len(prompt), a.steps, prompt_ids=tuple(x % 250 for x in prompt))])
    eng = Engine(model, ByteTokenizer(), EngineConfig(scheduler=SchedulerConfig("continuous")))
    with torch.inference_mode():
        eng.run(w)                                           # warm-up
        tr, _ = eng.run(w)
        kinds = tr.batch.groupby("step")["kind"].first()
        d = tr.steps.set_index("step")["dur_ms"]
        step = float(d[kinds[kinds == "decode"].index].median())

        x = torch.randn(1, model.cfg.dim)
        lin = linears(model)

        def matmuls():
            for wt, b in lin:
                F.linear(x if wt.shape[1] == x.shape[1] else torch.empty(1, wt.shape[1]), wt, b)
        mm = median_ms(matmuls, a.steps)
        weights = eng.weights                               # the engine's linears (None: torch's)
        mm_engine = mm
        if weights is not None:                             # the same products as the engine runs them
            cos, sin = weights.rope_tables(model.rope_cos[:1], model.rope_sin[:1])

            def packed():
                for li in range(model.cfg.n_layers):
                    weights.qkv(li, x, cos, sin)
                    weights.o(li, x)
                    weights.mlp(li, x)
                weights.logits(x)
            mm_engine = median_ms(packed, a.steps)

        bs, ctx = 16, a.context
        blocks = -(-(ctx + 1) // bs)
        cache = PagedKVCache(model.cfg.n_layers, blocks + 1, bs, model.cfg.n_kv_heads, model.cfg.head_dim,
                             "cpu", torch.float32)
        slots = slots_of(list(range(blocks)), ctx + 1, bs)
        packed = pack([([5], ctx, slots)], "cpu")
        attend = attend_with(paged_attention, cache)
        fwd = median_ms(lambda: model.logits(forward(model, packed, cache, attend, weights), weights), a.steps)
    print(f"tiny model ({model.num_params():,} params, float32), CPU {platform.machine()}, {a.threads} thread(s), "
          f"torch {torch.__version__}; one sequence, context {ctx}, {len(lin)} linear layers per token")
    print(f"  matmuls alone (torch F.linear):  {mm:8.3f} ms")
    print(f"  the engine's linears alone ({eng.matmul_name}; with rope and silu for onednn): {mm_engine:8.3f} ms")
    print(f"  model forward (no scheduling): {fw(fwd)} ms  ({fwd / mm:.1f}x F.linear matmuls)")
    print(f"  engine decode step (median of {int((kinds == 'decode').sum())}): {fw(step)} ms  "
          f"({step / mm:.1f}x F.linear matmuls, {step / mm_engine:.1f}x the engine's linears; goal <= 1.5x)")
    print(f"  so per step: {step - fwd:.3f} ms outside the forward (scheduling, packing, sampling, bookkeeping), "
          f"{fwd - mm_engine:.3f} ms in the forward beyond the engine's linears (attention, norms, cache writes, "
          "dispatch)")


def fw(v: float) -> str:
    return f"{v:8.3f}"


if __name__ == "__main__":
    main()
