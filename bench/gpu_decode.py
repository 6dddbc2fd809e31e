"""Decode step time against the weight-read bound, on whatever device is present.

    python -m bench.gpu_decode [--model random-0.5b|tiny] [--batches 1,8,32,64] [--ctx 512] [--out DIR]

For each batch size: a prefill of `ctx` tokens per sequence, then timed decode steps through
the same paged engine path the runner uses. Reports step time, tokens/s, and the roofline
lower bound weight bytes / memory bandwidth (device preset from core.formulas.kv.GPUS when the GPU
name matches, else --bandwidth-gbps). Writes results.json into --out when given.
"""
import argparse
import json
import os
import time

import torch

from core.formulas.kv import GPUS
from gpu_runner.engine import PagedKVCache, device_name
from gpu_runner.kernels.reference import Chunk, paged_attention
from gpu_runner.launch import load_model


def sync(dev):
    if dev.type == "cuda":
        torch.cuda.synchronize()


@torch.inference_mode()
def measure(model, dev, batch, ctx, steps, attention):
    cfg = model.cfg
    bs = 16
    per_seq = -(-(ctx + steps + 1) // bs)
    dtype = next(model.parameters()).dtype
    cache = PagedKVCache(cfg.n_layers, batch * per_seq, bs, cfg.n_kv_heads, cfg.head_dim, dev, dtype)
    tables = [list(range(i * per_seq, (i + 1) * per_seq)) for i in range(batch)]
    slot = lambda b, p: tables[b][p // bs] * bs + p % bs
    att = lambda q, li, ch: attention(q, cache.k[li], cache.v[li], ch)
    g = torch.Generator(device="cpu").manual_seed(0)
    toks = torch.randint(0, min(cfg.vocab_size, 256), (batch, ctx), generator=g)
    for b in range(batch):  # prefill each sequence
        slots = torch.tensor([slot(b, p) for p in range(ctx)], device=dev)
        model.forward_paged(toks[b].to(dev), torch.arange(ctx, device=dev), slots, [Chunk(0, ctx, 0, slots)],
                            cache, att)
    times = []
    pos = ctx
    nxt = torch.zeros(batch, dtype=torch.long, device=dev)
    for _ in range(steps):
        chunks = [Chunk(b, 1, pos, torch.tensor([slot(b, p) for p in range(pos + 1)], device=dev))
                  for b in range(batch)]
        new = torch.tensor([slot(b, pos) for b in range(batch)], device=dev)
        sync(dev)
        t0 = time.perf_counter()
        h = model.forward_paged(nxt, torch.full((batch,), pos, device=dev), new, chunks, cache, att)
        nxt = model.logits(h).argmax(-1)
        nxt.tolist()  # tokens reach the host
        times.append(time.perf_counter() - t0)
        pos += 1
    times = sorted(times[2:]) if len(times) > 4 else sorted(times)
    return times[len(times) // 2]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="random-0.5b")
    ap.add_argument("--batches", default="1,8,32,64")
    ap.add_argument("--ctx", type=int, default=512)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--attention", choices=["torch", "triton"], default="torch")
    ap.add_argument("--bandwidth-gbps", type=float, help="memory bandwidth when the GPU is not a known preset")
    ap.add_argument("--out", help="directory for results.json")
    a = ap.parse_args()
    model, _, device, name = load_model(a.model, "auto", a.dtype)
    dev = torch.device(device)
    attention = paged_attention
    if a.attention == "triton":
        from gpu_runner.kernels.triton_attention import paged_attention_triton as attention
    dname = device_name(dev)
    bw = a.bandwidth_gbps
    for key, g in GPUS.items():
        if key.split("-")[0] in dname.replace(" ", "-"):
            bw = bw or g.bandwidth_gbps
    dtype = next(model.parameters()).dtype
    wbytes = sum(p.numel() * p.element_size() for p in model.parameters())
    bound_ms = wbytes / (bw * 1e9) * 1000 if bw else None
    rows = []
    print(f"{name}: {model.num_params():,} params, {wbytes / 1e9:.3f} GB weights ({dtype}), device {dname}, "
          f"bandwidth {bw or '?'} GB/s -> weight-read bound {bound_ms if bound_ms is None else round(bound_ms, 4)} ms")
    for b in [int(x) for x in a.batches.split(",")]:
        ms = measure(model, dev, b, a.ctx, a.steps, attention) * 1000
        rows.append({"batch": b, "step_ms": ms, "tok_per_s": b / ms * 1000,
                     "bound_ms": bound_ms, "ratio_to_bound": ms / bound_ms if bound_ms else None})
        print(f"batch {b:4}: decode step {ms:8.3f} ms, {b / ms * 1000:10.1f} tok/s"
              + (f", {ms / bound_ms:6.2f}x the weight-read bound" if bound_ms else ""))
    if a.out:
        os.makedirs(a.out, exist_ok=True)
        with open(os.path.join(a.out, "decode_vs_bound.json"), "w") as f:
            json.dump({"model": name, "params": model.num_params(), "dtype": str(dtype), "device": dname,
                       "bandwidth_gbps": bw, "weight_bytes": wbytes, "ctx": a.ctx, "attention": a.attention,
                       "torch": torch.__version__, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
