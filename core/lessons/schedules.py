"""The Schedules page's computations: the same workload under several scheduling policies, side
by side (timelines, per-request table, throughput windows, cost, who wins and who loses).

Policies: "serial", "static" and "continuous" are `SchedulerConfig.policy`; "chunked" is
continuous batching with chunked prefill, so its chunk size is passed explicitly and the
other policies compute each prompt in one step, except the named ones (core.engine.policies):
"sarathi" takes the same chunk size as its step budget, "vllm-v1" chunks by the budget.
Token counts named `emitted` are tokens a run produced; `max_output_tokens` is what a request asked for.
"""
from __future__ import annotations

import dataclasses

import numpy as np
import pandas as pd

from core.analysis.metrics import cost_usd, first_scheduled_ms, request_metrics, summarize, throughput
from core.config import SchedulerConfig
from core.errors import ConfigError
from core.sim.parallel import PARALLEL_MIN_REQUESTS, run_all
from core.sim.simulate import simulate
from core.sim.stepmodel import StepModel
from core.trace import Trace

POLICY_LABELS = {"serial": "serial", "static": "static", "continuous": "continuous",
                 "chunked": "continuous + chunked prefill",
                 "vllm-v1": "vLLM V1 (chunked by the budget)", "vllm-v0": "vLLM V0 (prefill-first)",
                 "orca": "Orca (whole prompts)", "sarathi": "Sarathi-Serve (stall-free chunks)"}
GENERIC_POLICIES = ("serial", "static", "continuous", "chunked")
TAKES_CHUNK = ("chunked", "sarathi")    # the policies the `chunk` argument applies to


def policy_config(policy: str, config: SchedulerConfig, chunk: int | None = None) -> SchedulerConfig:
    """`config` under one policy. `config.chunk` must be unset: only "chunked" chunks, by `chunk`
    prompt tokens per request per step."""
    if policy not in POLICY_LABELS:
        raise ConfigError(f"policy: expected one of {', '.join(POLICY_LABELS)}, got {policy!r}")
    if config.chunk is not None:
        raise ConfigError("chunk: pass the chunk size as the 'chunked' policy's own argument, "
                          "not in the shared scheduler options")
    if policy == "chunked" and chunk is None:
        raise ConfigError("chunk: the 'chunked' policy needs a chunk size")
    return dataclasses.replace(config, policy="continuous" if policy == "chunked" else policy,
                               chunk=chunk if policy in TAKES_CHUNK else None)


def run_policies(workload, policies: list[str], config: SchedulerConfig, step_model: StepModel,
                 chunk: int | None = None, created: str = "", record_kv: bool = True,
                 summaries: bool = False) -> list[tuple]:
    """One simulated trace per policy, labelled "simulated <policy>". `record_kv` False: no
    per-block KV events (schedules, latencies, preemptions and KV counts are the same).
    `summaries`: (label, trace, summarize(trace, per_request=False)) instead of pairs. With
    several policies and at least PARALLEL_MIN_REQUESTS requests, each policy runs in its own
    worker process (core.sim.parallel.run_all; the same traces as one after another)."""
    jobs = []
    for p in policies:
        jobs.append(dict(workload=workload, config=policy_config(p, config, chunk), step_model=step_model,
                         label=POLICY_LABELS[p], created=created or None, record_kv=record_kv, summary=summaries))
    if len(jobs) > 1 and len(workload.requests) >= PARALLEL_MIN_REQUESTS:
        runs = run_all(_policy_run, jobs)
    else:
        runs = [_policy_run(**j) for j in jobs]
    return [(f"simulated {j['label']}", *r) if summaries else (f"simulated {j['label']}", r[0])
            for j, r in zip(jobs, runs)]


def _policy_run(workload, config, step_model, label, created, record_kv, summary) -> tuple:
    tr = simulate(workload, config, step_model, label=label, created=created, record_kv=record_kv)
    return (tr, summarize(tr, per_request=False)) if summary else (tr,)


def fixed_window(schedules: list[tuple[str, Trace]], start_ms: float, end_ms: float = 0.0) -> tuple[float, float]:
    """[start, end] ms of the fixed throughput window; end 0 = the latest emission of any schedule."""
    if end_ms <= 0:
        ends = [float(tr.tokens["t_ms"].max()) for _, tr in schedules if len(tr.tokens)]
        end_ms = max(ends, default=start_ms)
    if end_ms <= start_ms:
        raise ConfigError(f"window: end ({end_ms:g} ms) must be after start ({start_ms:g} ms)")
    return start_ms, end_ms


def steps_taken(schedules: list[tuple[str, Trace]]) -> list[tuple[str, int]]:
    """Forward steps of each schedule that has step events."""
    return [(label, len(tr.steps)) for label, tr in schedules if len(tr.steps)]


def per_request_table(schedules: list[tuple[str, Trace]]) -> pd.DataFrame:
    """Long table: schedule, request, arrival, TTFT, TPOT (NaN = missing), E2E, finish,
    waiting (first step start - arrival, when step events exist), tokens emitted."""
    frames = []
    for label, tr in schedules:
        m = request_metrics(tr)
        wait = first_scheduled_ms(tr) - m["arrival_ms"].to_numpy()
        frames.append(pd.DataFrame({"schedule": label, "request": m["id"], "arrival_ms": m["arrival_ms"],
                                    "ttft_ms": m["ttft_ms"], "tpot_ms": m["tpot_ms"], "e2e_ms": m["e2e_ms"],
                                    "finish_ms": m["last_token_ms"], "waiting_ms": wait,
                                    "emitted_tokens": m["output_tokens"]}))
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


def tradeoff(schedules: list[tuple[str, Trace]], base: str, other: str,
             table: pd.DataFrame | None = None) -> pd.DataFrame:
    """Per request: E2E under `base` and `other` and the change (negative = finishes sooner).
    `table`: the schedules' per_request_table, when the caller has it."""
    t = per_request_table([s for s in schedules if s[0] in (base, other)]) if table is None else table
    a = t[t["schedule"] == base].set_index("request")["e2e_ms"]
    b = t[t["schedule"] == other].set_index("request")["e2e_ms"]
    d = pd.DataFrame({"request": a.index, f"E2E {base}": a.to_numpy(), f"E2E {other}": b.reindex(a.index).to_numpy()})
    d["change_ms"] = d[f"E2E {other}"] - d[f"E2E {base}"]
    d["verdict"] = np.where(d["change_ms"] < 0, "sooner", np.where(d["change_ms"] > 0, "later", "same"))
    return d


def summary_table(schedules: list[tuple[str, Trace]], window: tuple[float, float] | None,
                  usd_per_hour: float, summaries: list[dict] | None = None) -> pd.DataFrame:
    """`summaries`: summarize(trace) of each schedule, when the caller has them."""
    rows = []
    for i, (label, tr) in enumerate(schedules):
        drain = throughput(tr)
        cost, per_1k = cost_usd(drain, usd_per_hour)
        s = (summarize(tr, per_request=False) if summaries is None else summaries[i])["summary"]
        row = {"schedule": label, "origin": tr.source, "steps": len(tr.steps) if len(tr.steps) else None,
               "output tokens": drain.emitted_tokens,
               "drain window ms": f"[{drain.start_ms:g}, {drain.end_ms:g}]",
               "tok/s (drain)": drain.tok_per_s}
        if window is not None:
            fixed = throughput(tr, window)
            row[f"tok/s fixed [{window[0]:g}, {window[1]:g}] ms"] = fixed.tok_per_s
        row.update({"cost USD (drain)": cost, "USD per 1k tokens": per_1k,
                    "TTFT p50 ms": s["ttft_ms"]["p50"], "TTFT p99 ms": s["ttft_ms"]["p99"],
                    "TPOT mean ms": s["tpot_ms"]["mean"], "E2E p99 ms": s["e2e_ms"]["p99"]})
        rows.append(row)
    df = pd.DataFrame(rows)
    if len(df):   # a given schedule has no steps: an empty cell, not "None"
        df["steps"] = df["steps"].astype("Int64")
    return df


def thin_sample_notes(schedules: list[tuple[str, Trace]], summaries: list[dict] | None = None) -> list[str]:
    """The first schedule's notes on samples too few for a percentile (the workload decides them)."""
    if not schedules:
        return []
    return (summarize(schedules[0][1], per_request=False) if summaries is None else summaries[0])["summary"]["notes"]


# ---- two traces of the same workload -------------------------------------------------------

