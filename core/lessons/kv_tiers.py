"""The KV page's lesson "When does offloading pay?": a CPU tier under the prefix cache, run with and
without it on a workload whose prefixes come back after the GPU pool has let them go.

A CPU hit saves the prefill of the tokens it loads and costs their copy over the host link (and the
step the request waits for it). Per token, the copy moves the KV of one token (bytes over the link's
bandwidth); the prefill it replaces computes 2 x parameters FLOPs for it on the GPU (compute-bound: the
roofline). So a load beats the recompute when

    kv bytes per token / host bandwidth  <  2 x parameters / GPU FLOP/s,

that is when the link is faster than  kv bytes per token x GPU FLOP/s / (2 x parameters)  (the
break-even bandwidth). Grouped-query attention makes the KV of a token small against the model: an 8B
model with 8 KV heads pays at a few GB/s, one with 32 KV heads (no GQA) needs a link several times
faster. Every number here is computed from the presets (given) and the simulator's runs (simulated,
roofline step model); none is typed in.
"""
from __future__ import annotations

from functools import lru_cache

import numpy as np

from core.analysis.kv_tiers import copy_totals, hit_rates, hits_by_tier
from core.analysis.metrics import summarize
from core.config import SchedulerConfig
from core.engine.outputs import SchedulerOutput
from core.formulas.kv import GPUS, MODELS
from core.sim.simulate import simulate
from core.sim.stepmodel import StepModel
from core.workload import Request, Workload

MODEL, GPU = "Llama-3-8B", "H100-SXM"
BLOCK = 16                  # tokens per KV block
HOST_GBPS = 25.0            # given: the host link's bandwidth per direction (the order of PCIe 4.0 x16's)
HOST_LATENCY_MS = 0.01      # given: per copy
GPU_BLOCKS = 400            # the GPU pool: room for a few conversations' prefixes at once
CPU_BLOCKS = 4000           # the CPU tier: room for all of them
PREFIXES, PREFIX_TOKENS, OWN_TOKENS, OUT_TOKENS = 12, 2048, 64, 32
REQUESTS, RATE_PER_S, SEED = 96, 4.0, 7


def block_bytes(model: str = MODEL, block: int = BLOCK, dtype_bytes: float = 2) -> int:
    """KV bytes of one block: block tokens x the model's KV bytes per token (K and V, all layers)."""
    return int(block * MODELS[model].kv_bytes_per_token(dtype_bytes))


def per_token(model: str = MODEL, gpu: str = GPU, gbps: float = HOST_GBPS, dtype_bytes: float = 2) -> dict:
    """The break-even, per token: the copy's time against the prefill's (compute-bound) time."""
    m, g = MODELS[model], GPUS[gpu]
    kv = m.kv_bytes_per_token(dtype_bytes)
    load_us = kv / (gbps * 1e9) * 1e6
    recompute_us = 2.0 * m.params / g.flops * 1e6
    return {"model": model, "gpu": gpu, "kv_bytes_per_token": kv, "load_us": load_us, "recompute_us": recompute_us,
            "break_even_gbps": kv * g.flops / (2.0 * m.params) / 1e9, "pays": load_us < recompute_us}


def workload() -> Workload:
    """Conversations that come back: each request is one of PREFIXES long shared prefixes (a document, a
    system prompt with history) and a question of its own; Poisson arrivals, the prefix drawn at random,
    so a prefix often returns after the GPU pool has given its blocks to others."""
    rng = np.random.default_rng(SEED)
    gaps = rng.exponential(1000.0 / RATE_PER_S, REQUESTS)
    t = np.cumsum(gaps) - gaps[0]
    which = rng.integers(0, PREFIXES, REQUESTS)
    reqs = []
    for i, (ti, k) in enumerate(zip(t, which)):
        pre = tuple(range(100_000 * (k + 1), 100_000 * (k + 1) + PREFIX_TOKENS))
        own = tuple(range(10 * i + 1, 10 * i + 1 + OWN_TOKENS))
        reqs.append(Request(f"q{i}", float(ti), len(pre) + len(own), OUT_TOKENS, prompt_ids=pre + own,
                            tenant=f"doc{k}"))
    return Workload(reqs, name="returning conversations")


def step_model(model: str = MODEL) -> StepModel:
    return StepModel("roofline", model=model, gpu=GPU)


def config(cpu_blocks: int = CPU_BLOCKS, policy: str = "lru", gbps: float = HOST_GBPS,
           gpu_blocks: int = GPU_BLOCKS, model: str = MODEL) -> SchedulerConfig:
    return SchedulerConfig(policy="vllm-v1", token_budget=8192, max_seqs=64, block_size=BLOCK, kv_blocks=gpu_blocks,
                           prefix_caching=True, kv_manager="vllm-v1", cpu_kv_blocks=cpu_blocks, cpu_kv_policy=policy,
                           kv_block_bytes=block_bytes(model) if cpu_blocks else None, host_gbps=gbps,
                           host_latency_ms=HOST_LATENCY_MS)


@lru_cache(maxsize=16)
def run(cpu_blocks: int = CPU_BLOCKS, policy: str = "lru", gbps: float = HOST_GBPS, gpu_blocks: int = GPU_BLOCKS,
        model: str = MODEL):
    """The lesson's workload simulated (roofline step model of `model` on the GPU preset)."""
    w = workload()
    tier = f"CPU tier {cpu_blocks:,} blocks ({policy}, {gbps:g} GB/s)" if cpu_blocks else "no CPU tier"
    return simulate(w, config(cpu_blocks, policy, gbps, gpu_blocks, model), step_model(model),
                    label=f"{model}, {tier}", created="2026-12-07T00:00:00+00:00")


def compare(cpu_blocks: int = CPU_BLOCKS, policy: str = "lru", gbps: float = HOST_GBPS,
            gpu_blocks: int = GPU_BLOCKS, model: str = MODEL) -> dict:
    """The run without a tier beside the run with one: TTFT, prefill tokens computed, hits by tier,
    copies (core.analysis's definitions)."""
    out = {}
    for name, tr in (("without", run(0, policy, gbps, gpu_blocks, model)),
                     ("with", run(cpu_blocks, policy, gbps, gpu_blocks, model))):
        s = summarize(tr, per_request=False)["summary"]
        pre = tr.batch[tr.batch["kind"] == "prefill"]["tokens"].sum()
        out[name] = {"ttft_mean_ms": s["ttft_ms"]["mean"], "ttft_p90_ms": s["ttft_ms"]["p90"],
                     "e2e_mean_ms": s["e2e_ms"]["mean"], "prefill_tokens": int(pre), **hit_rates(tr),
                     "copies": copy_totals(tr)}
    return out


def prefill_ms(model: str, tokens: int) -> float:
    """The step model's time for one prefill of `tokens` tokens from position 0, alone in its step."""
    pos = tokens * (tokens + 1) // 2
    batch = SchedulerOutput(0, 0.0, np.array([0]), np.array([tokens]), np.array([0]), np.array([True]),
                            agg=(tokens, 0, pos, 0, 1, tokens))
    return step_model(model).duration_ms(batch)


def measured_break_even(cpu_blocks: int = CPU_BLOCKS, policy: str = "lru", gbps: float = HOST_GBPS,
                        gpu_blocks: int = GPU_BLOCKS, model: str = MODEL) -> dict:
    """From the run: its loads' time per block, beside what computing a block of the shared prefix costs
    in the same step model (the prefix's prefill alone, per block) and at the compute roof alone (2 x
    parameters FLOPs a token: the formula's recompute). The step model also charges the K/V that
    attention reads, so its recompute is dearer than the FLOPs alone."""
    tr = run(cpu_blocks, policy, gbps, gpu_blocks, model)
    loads = [e for e in tr.events_of("tier") if e["op"] == "load"]
    blocks = sum(e["blocks"] for e in loads)
    m, g = MODELS[model], GPUS[GPU]
    return {"loads": len(loads), "blocks_loaded": blocks,
            "load_ms_per_block": sum(e["dur_ms"] for e in loads) / blocks if blocks else float("nan"),
            "prefill_ms_per_block": prefill_ms(model, PREFIX_TOKENS) / (PREFIX_TOKENS // BLOCK),
            "flops_ms_per_block": 2.0 * m.params * BLOCK / g.flops * 1e3}


# ---- a small run to watch block by block (the page's animation) ------------------------------------
SMALL_GPU, SMALL_CPU = 12, 16


@lru_cache(maxsize=2)
def small_run(policy: str = "lru"):
    """Eight requests over three 4-block prefixes, one block of their own each, served one at a time: the
    GPU pool (11 usable blocks) keeps about one prefix, the CPU tier (16 blocks) three of them; the last
    requests find their prefix on the CPU and load it back, and the tier evicts when a fourth prefix comes."""
    reqs = []
    for i, k in enumerate((0, 1, 2, 0, 3, 1, 0, 2)):
        pre = tuple(range(1000 * (k + 1), 1000 * (k + 1) + 4 * BLOCK))
        own = tuple(range(10 * i + 1, 10 * i + 1 + BLOCK))
        reqs.append(Request(f"r{i}", 100.0 * i, len(pre) + len(own), 8, prompt_ids=pre + own))
    cfg = SchedulerConfig(policy="serial", token_budget=512, block_size=BLOCK, kv_blocks=SMALL_GPU, prefix_caching=True,
                          kv_manager="vllm-v1", cpu_kv_blocks=SMALL_CPU, cpu_kv_policy=policy,
                          kv_block_bytes=block_bytes(), host_gbps=HOST_GBPS, host_latency_ms=HOST_LATENCY_MS)
    return simulate(Workload(reqs, name="three prefixes"), cfg, step_model(), label=f"small tier run ({policy})",
                    created="2026-12-07T00:00:00+00:00")


# ---- a fleet of replicas, each with its tier: routing that knows which tier holds a prefix ----------
FLEET_REPLICAS = 4
FLEET_POLICIES = ("prefix-aware", "tier-aware")   # both with the replicas' own cache news (precise)
FLEET_GPU_BLOCKS = 200      # each replica's GPU pool: one prefix at a time; the rest stay in its CPU tier


@lru_cache(maxsize=8)
def fleet_run(policy: str, cpu_blocks: int = CPU_BLOCKS, gpu_blocks: int = FLEET_GPU_BLOCKS):
    """The lesson's workload on FLEET_REPLICAS replicas, each with a GPU pool of GPU_BLOCKS and a CPU tier,
    routed by `policy` with precise prefix knowledge: prefix-aware sees the GPU prefix caches only,
    tier-aware the CPU tiers too (a CPU block counts half)."""
    from core.fleet.router import RouterConfig
    from core.fleet.sim import simulate_fleet
    from core.fleet.spec import FleetSpec
    spec = FleetSpec.uniform(FLEET_REPLICAS, config(cpu_blocks, gpu_blocks=gpu_blocks), step_model(),
                             router=RouterConfig(policy, prefix="precise"))
    return simulate_fleet(workload(), spec, label=f"{FLEET_REPLICAS} replicas with CPU tiers, {policy}",
                          created="2026-12-07T00:00:00+00:00")


def fleet_compare(cpu_blocks: int = CPU_BLOCKS, gpu_blocks: int = FLEET_GPU_BLOCKS) -> dict:
    """Per routing policy: mean TTFT, prefill tokens computed, hits by tier; per replica, hits by tier."""
    out = {}
    for pol in FLEET_POLICIES:
        tr = fleet_run(pol, cpu_blocks, gpu_blocks)
        s = summarize(tr, per_request=False)["summary"]
        per = hits_by_tier(tr).merge(_replica_of(tr), on="id")
        out[pol] = {"ttft_mean_ms": s["ttft_ms"]["mean"], "ttft_p90_ms": s["ttft_ms"]["p90"],
                    "prefill_tokens": int(tr.batch[tr.batch["kind"] == "prefill"]["tokens"].sum()),
                    **hit_rates(tr),
                    "per_replica": per.groupby("replica")[["gpu_hit_tokens", "cpu_hit_tokens"]].sum()
                    .reset_index().to_dict("records")}
    return out


def _replica_of(trace):
    import pandas as pd
    routes = [(e["req"], e["replica"]) for e in trace.events_of("route") if e.get("replica", -1) >= 0]
    return pd.DataFrame(routes, columns=["id", "replica"])
