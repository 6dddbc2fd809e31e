"""Built-in scenarios and the comparisons the pages show (pages stay thin: they call these)."""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from core.errors import ConfigError, WorkloadError
from core.metrics import cost_usd, request_metrics, summarize, throughput
from core.paging import BlockManager
from core.scheduler import SchedulerConfig
from core.simulate import StepModel, simulate
from core.trace import Trace, load_trace
from core.workload import Request, Workload, load_workload, request_from_dict

DATA = Path(__file__).resolve().parent.parent / "data"

SCENARIOS = {
    "chapter31": "Chapter 31: three requests (A, B, C)",
    "burst5": "Burst of five, outputs [5, 20, 10, 15, 10]",
    "shared_prefix": "Chat with shared system prompts (200 requests)",
    "poisson2000": "Poisson traffic, 2,000 requests",
    "custom": "Edit my own",
    "upload": "Upload a workload file",
}


def load_scenario(name: str) -> Workload:
    if name == "chapter31":
        return load_workload(DATA / "workloads" / "chapter31.json")
    if name == "burst5":
        return load_workload(DATA / "workloads" / "burst5.json")
    if name == "shared_prefix":
        return load_workload(DATA / "workloads" / "shared_prefix_200.json")
    if name == "poisson2000":
        return poisson_workload(2000, rate_per_s=20.0, seed=2000)
    raise ConfigError(f"scenario: unknown built-in {name!r}")


def given_schedules(name: str) -> list[tuple[str, Trace]]:
    if name != "chapter31":
        return []
    return [(f"given {k}", load_trace(DATA / "traces" / f"chapter31_{k}.json")) for k in ("serial", "continuous")]


def poisson_workload(n: int, rate_per_s: float, seed: int = 0, max_prompt: int = 2048,
                     max_output: int = 512) -> Workload:
    rng = np.random.default_rng(seed)
    arrivals = np.concatenate([[0.0], np.cumsum(rng.exponential(1000.0 / rate_per_s, n - 1))])
    prompts = rng.integers(1, max_prompt + 1, n)
    outputs = rng.integers(1, max_output + 1, n)
    return Workload([Request(f"r{i}", round(float(a), 3), int(p), int(o))
                     for i, (a, p, o) in enumerate(zip(arrivals, prompts, outputs))], name=f"poisson{n}")


def workload_from_rows(rows: list[dict]) -> Workload:
    """From an edited table (id, arrival_ms, prompt_tokens, output_tokens); errors name the row."""
    reqs = []
    for i, row in enumerate(rows):
        d = {k: v for k, v in row.items() if v is not None and not (isinstance(v, float) and math.isnan(v))}
        if not d:
            continue
        d.setdefault("id", f"R{i + 1}")
        for k in ("prompt_tokens", "output_tokens"):
            if isinstance(d.get(k), float) and d[k].is_integer():
                d[k] = int(d[k])
        try:
            reqs.append(request_from_dict(d, f"row {i + 1}"))
        except WorkloadError as e:
            msg = str(e)
            raise WorkloadError(msg if msg.startswith("row ") else f"row {i + 1}: {msg}") from None
    return Workload(reqs, name="custom")


# ---- policies side by side -------------------------------------------------------------

POLICY_LABELS = {"serial": "serial", "static": "static", "continuous": "continuous",
                 "chunked": "continuous + chunked prefill"}


@dataclass(slots=True)
class Limits:
    max_seqs: int | None = None
    token_budget: int | None = None
    chunk: int = 64
    kv_blocks: int | None = None
    block_size: int = 16
    prefix_caching: bool = False


def policy_config(policy: str, lim: Limits) -> SchedulerConfig:
    if policy not in POLICY_LABELS:
        raise ConfigError(f"policy: expected one of {', '.join(POLICY_LABELS)}, got {policy!r}")
    return SchedulerConfig(policy="continuous" if policy == "chunked" else policy, max_seqs=lim.max_seqs,
                           token_budget=lim.token_budget, chunk=lim.chunk if policy == "chunked" else None,
                           block_size=lim.block_size, kv_blocks=lim.kv_blocks, prefix_caching=lim.prefix_caching)


def run_policies(workload: Workload, policies: list[str], lim: Limits, step_model: StepModel,
                 created: str = "") -> list[tuple[str, Trace]]:
    out = []
    for p in policies:
        cfg = policy_config(p, lim)
        out.append((f"simulated {POLICY_LABELS[p]}",
                    simulate(workload, cfg, step_model, label=POLICY_LABELS[p], created=created or None)))
    return out


def per_request_table(schedules: list[tuple[str, Trace]]) -> pd.DataFrame:
    """Long table: schedule, request, arrival, TTFT, TPOT (NaN = missing), E2E, finish,
    waiting (first step start - arrival, when step events exist)."""
    frames = []
    for label, tr in schedules:
        m = request_metrics(tr)
        wait = np.full(len(m), np.nan)
        if len(tr.batch):
            step_t = tr.steps.set_index("step")["t_ms"]
            fb = tr.batch.groupby("req")["step"].min()
            wait[fb.index] = step_t.reindex(fb.to_numpy()).to_numpy() - m["arrival_ms"].to_numpy()[fb.index]
        frames.append(pd.DataFrame({"schedule": label, "request": m["id"], "arrival_ms": m["arrival_ms"],
                                    "ttft_ms": m["ttft_ms"], "tpot_ms": m["tpot_ms"], "e2e_ms": m["e2e_ms"],
                                    "finish_ms": m["last_token_ms"], "waiting_ms": wait,
                                    "tokens": m["output_tokens"]}))
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


def tradeoff(schedules: list[tuple[str, Trace]], base: str, other: str) -> pd.DataFrame:
    """Per request: E2E under `base` and `other` and the change (negative = finishes sooner)."""
    t = per_request_table([s for s in schedules if s[0] in (base, other)])
    a = t[t["schedule"] == base].set_index("request")["e2e_ms"]
    b = t[t["schedule"] == other].set_index("request")["e2e_ms"]
    d = pd.DataFrame({"request": a.index, f"E2E {base}": a.to_numpy(), f"E2E {other}": b.reindex(a.index).to_numpy()})
    d["change_ms"] = d[f"E2E {other}"] - d[f"E2E {base}"]
    d["verdict"] = np.where(d["change_ms"] < 0, "sooner", np.where(d["change_ms"] > 0, "later", "same"))
    return d


def summary_table(schedules: list[tuple[str, Trace]], window: tuple[float, float] | None,
                  usd_per_hour: float) -> pd.DataFrame:
    rows = []
    for label, tr in schedules:
        drain = throughput(tr)
        cost, per_1k = cost_usd(drain, usd_per_hour)
        s = summarize(tr)["summary"]
        row = {"schedule": label, "origin": tr.source, "steps": len(tr.steps) if len(tr.steps) else None,
               "output tokens": drain.output_tokens,
               "drain window ms": f"[{drain.start_ms:g}, {drain.end_ms:g}]",
               "tok/s (drain)": drain.tok_per_s}
        if window is not None:
            fixed = throughput(tr, window)
            row[f"tok/s fixed [{window[0]:g}, {window[1]:g}] ms"] = fixed.tok_per_s
        row.update({"cost USD (drain)": cost, "USD per 1k tokens": per_1k,
                    "TTFT p50": s["ttft_ms"]["p50"], "TTFT p99": s["ttft_ms"]["p99"],
                    "TPOT mean": s["tpot_ms"]["mean"], "E2E p99": s["e2e_ms"]["p99"]})
        rows.append(row)
    return pd.DataFrame(rows)


def thin_sample_notes(schedules: list[tuple[str, Trace]]) -> list[str]:
    notes = []
    for label, tr in schedules[:1]:
        notes += summarize(tr)["summary"]["notes"]
    return notes


# ---- KV page demos -----------------------------------------------------------------------

def shared_prefix_demo(n: int = 24, tenants: int = 2, system_tokens: int = 64, block_size: int = 16,
                       salt_by_tenant: bool = True, seed: int = 5) -> Workload:
    """Requests from several tenants that all start with the SAME system prompt tokens, then
    a private user turn. With tenant salts their caches are separate; without, they share."""
    rng = np.random.default_rng(seed)
    system = rng.integers(100, 32000, system_tokens).tolist()
    reqs = []
    t = 0.0
    for i in range(n):
        t += float(rng.exponential(40.0))
        user = rng.integers(100, 32000, int(rng.integers(8, 40))).tolist()
        ids = system + user
        tenant = f"tenant{i % tenants}"
        reqs.append(Request(f"q{i:02d}", round(t, 3), len(ids), int(rng.integers(4, 24)), prompt_ids=tuple(ids),
                            tenant=tenant if salt_by_tenant else None,
                            extra={"tenant_name": tenant}))
    return Workload(reqs, name="shared system prompt")


def prefix_match(a: list[int], b: list[int], block_size: int = 1, salt_a: str | None = None,
                 salt_b: str | None = None) -> int:
    """Tokens of b served from a's cached blocks (exact ids, same tenant, full blocks)."""
    bm = BlockManager(max(4, len(a) // block_size + 2), block_size, prefix_caching=True)
    bm.admit("a", (), salt_a)
    bm.grow("a", len(a))
    bm.commit("a", a, len(a))
    return len(bm.match_prefix(b, salt_b)) * block_size


def fork_demo(prompt_tokens: int, samples: int, block_size: int, append_tokens: int = 1) -> dict:
    """Parallel sampling: one prompt's blocks shared by `samples` forks; each fork then
    appends its own tokens, copying the shared partially filled block (copy-on-write)."""
    if samples < 1 or prompt_tokens < 1 or block_size < 1:
        raise ConfigError("prompt_tokens, samples and block_size must be positive")
    need = -(-prompt_tokens // block_size) + samples * (1 + -(-append_tokens // block_size))
    bm = BlockManager(need + 2, block_size)
    bm.admit("prompt")
    bm.grow("prompt", prompt_tokens)
    for s in range(samples):
        bm.fork("prompt", f"sample {s + 1}")
    before = {k: list(v) for k, v in bm.tables.items()}
    refs_before = {b: int(bm.ref[b]) for t in before.values() for b in t}
    copies = []
    for s in range(samples):
        _, c = bm.prepare_write(f"sample {s + 1}", prompt_tokens, append_tokens)
        copies += [(f"sample {s + 1}", src, dst) for src, dst in c]
    after = {k: list(v) for k, v in bm.tables.items()}
    refs_after = {b: int(bm.ref[b]) for t in after.values() for b in t}
    bm.check()
    return {"before": before, "after": after, "refs_before": refs_before, "refs_after": refs_after,
            "copies": copies, "partial_tail": prompt_tokens % block_size != 0}
