"""KV-cache tiers in a trace: hits by tier and the copies between them (defined once, here).

**Hit, by tier.** A request's hits are counted on its first admission only (a re-admission after a
preemption finds its own blocks again): the GPU hit is the prefix-cache blocks it shared when it was
first given blocks (kv rows `hit` at the time of its first kv row), the CPU hit the blocks its first
admission loaded from the CPU tier (tier events `load` with `first`). Both in tokens (blocks x block
size); a tier's hit rate is its hit tokens over the prompt tokens of the requests admitted. The same
definition holds with and without a CPU tier: the GPU rate of a run without a tier is computed the
same way, from the same rows.

**Copies.** Tier events (core.trace.schema.TIER): `store` (GPU to CPU), `load` (CPU to GPU), `evict`
(CPU blocks dropped to make room); bytes and busy time per direction.
"""
from __future__ import annotations

import numpy as np
import pandas as pd


def _block_size(trace) -> int:
    return int((trace.meta.get("engine") or {}).get("block_size") or 16)


def hits_by_tier(trace) -> pd.DataFrame:
    """Per request of the trace that was admitted: prompt tokens, GPU and CPU hit tokens on its
    first admission."""
    bs = _block_size(trace)
    n = len(trace.requests)
    gpu = np.zeros(n, dtype=np.int64)
    admitted = np.zeros(n, dtype=bool)
    kv = trace.kv
    if len(kv):
        reqs = kv["req"].to_numpy()
        ok = pd.notna(reqs)
        rows = kv[ok]
        r = rows["req"].to_numpy().astype(np.int64)
        first_t = pd.Series(rows["t_ms"].to_numpy()).groupby(r).transform("min").to_numpy()
        hit = (rows["op"].astype(str).to_numpy() == "hit") & (rows["t_ms"].to_numpy() == first_t)
        np.add.at(gpu, r[hit], 1)
        admitted[np.unique(r)] = True
    cpu = np.zeros(n, dtype=np.int64)
    pos = {rid: i for i, rid in enumerate(trace.ids)}
    for e in trace.events_of("tier"):
        if e.get("op") == "load" and e.get("first") and e.get("req") in pos:
            cpu[pos[e["req"]]] += int(e.get("blocks") or 0)
            admitted[pos[e["req"]]] = True
    prompt = trace.requests["prompt_tokens"].to_numpy(dtype=np.int64)
    out = pd.DataFrame({"id": list(trace.ids), "prompt_tokens": prompt, "gpu_hit_tokens": gpu * bs,
                        "cpu_hit_tokens": cpu * bs})
    return out[admitted].reset_index(drop=True)


def hit_rates(trace) -> dict:
    """Hit tokens and rates by tier over the admitted requests (hits_by_tier)."""
    t = hits_by_tier(trace)
    prompt = int(t["prompt_tokens"].sum())
    g, c = int(t["gpu_hit_tokens"].sum()), int(t["cpu_hit_tokens"].sum())
    return {"requests": len(t), "prompt_tokens": prompt, "gpu_hit_tokens": g, "cpu_hit_tokens": c,
            "gpu_hit_rate": g / prompt if prompt else 0.0, "cpu_hit_rate": c / prompt if prompt else 0.0}


def copies(trace) -> pd.DataFrame:
    """The tier events as a table: t_ms, op, req, blocks, bytes, dur_ms, offered_ms (empty: no tier)."""
    cols = ["t_ms", "op", "req", "blocks", "bytes", "dur_ms", "offered_ms"]
    ev = trace.events_of("tier")
    return pd.DataFrame([{k: e.get(k) for k in cols} for e in ev], columns=cols)


def copy_totals(trace) -> dict:
    """Blocks, bytes and busy time per direction; blocks evicted from the CPU tier."""
    t = copies(trace)
    out = {}
    for op in ("store", "load", "evict"):
        s = t[t["op"] == op]
        out[op] = {"jobs": len(s), "blocks": int(s["blocks"].sum()), "bytes": int(s["bytes"].sum()),
                   "busy_ms": float(s["dur_ms"].sum())}
    return out
