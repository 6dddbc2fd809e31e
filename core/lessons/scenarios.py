"""What the app ships with: built-in workloads and their scheduler presets, bundled and
configured trace files, and the small worked examples of the KV and attention pages.

A preset states option values (`SchedulerConfig` and `StepModel` fields, the policies to
run); the app maps them onto its widgets through its URL-key table (ui/urls.py).
"""
from __future__ import annotations

import dataclasses
import json
import math
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from core.config import SchedulerConfig, from_dict
from core.engine.kv_cache import KVCacheManager
from core.errors import ConfigError, InputError, WorkloadError
from core.lessons.schedules import GENERIC_POLICIES, POLICY_LABELS
from core.sim.stepmodel import StepModel
from core.trace import Trace, load_trace
from core.workload import Request, Workload, load_workload, request_from_dict

DATA = Path(__file__).resolve().parents[2] / "data"

SCENARIOS = {
    "chapter31": "Chapter 31: three requests (A, B, C)",
    "burst5": "Burst of five, outputs [5, 20, 10, 15, 10]",
    "shared_prefix": "Chat with shared system prompts (200 requests)",
    "poisson2000": "Poisson traffic, 2,000 requests",
    "poisson10000": "Poisson traffic, 10,000 requests (production-sized: aggregated views)",
    "custom": "Edit my own",
    "upload": "Upload a workload file",
}


# ---- scheduler presets ------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class SchedulePreset:
    """Settings a scenario starts from: policies to run, `SchedulerConfig` fields (`chunk` is the
    'chunked' policy's chunk size) and `StepModel` fields. Only the fields named are set."""
    policies: tuple[str, ...]
    scheduler: dict
    step_model: dict

    def __post_init__(self):
        bad = [p for p in self.policies if p not in POLICY_LABELS]
        if bad:
            raise ConfigError(f"preset policies: unknown {bad[0]!r} (known: {', '.join(POLICY_LABELS)})")
        from_dict(SchedulerConfig, self.scheduler, "preset scheduler")   # names and values checked
        from_dict(StepModel, self.step_model, "preset step_model")

    def options(self) -> dict[str, object]:
        """Option values by qualified name ("SchedulerConfig.max_seqs", "StepModel.step_ms",
        "policies"), typed as the option groups type them."""
        cfg = from_dict(SchedulerConfig, self.scheduler)
        sm = from_dict(StepModel, self.step_model)
        return {"policies": list(self.policies),
                **{f"SchedulerConfig.{k}": getattr(cfg, k) for k in self.scheduler},
                **{f"StepModel.{k}": getattr(sm, k) for k in self.step_model}}


ALL_POLICIES = GENERIC_POLICIES
_NO_LIMITS = dict(max_seqs=None, token_budget=None, kv_blocks=None)
# The chapter's affine model: 20 ms a step + 20 ms per prefill token + 20 ms per decoding sequence.
_CHAPTER_STEPS = dict(kind="affine", step_ms=10.0, base_ms=20.0, prefill_ms_per_token=20.0, decode_ms_per_seq=20.0)


def _affine(base_ms: float, prefill_ms_per_token: float, decode_ms_per_seq: float) -> dict:
    return dict(kind="affine", step_ms=10.0, base_ms=base_ms, prefill_ms_per_token=prefill_ms_per_token,
                decode_ms_per_seq=decode_ms_per_seq)


SCHEDULE_PRESETS = {
    "chapter31": SchedulePreset(ALL_POLICIES, {**_NO_LIMITS, "chunk": 2}, _CHAPTER_STEPS),
    "burst5": SchedulePreset(("static", "continuous"), {**_NO_LIMITS, "max_seqs": 3, "chunk": 4},
                             {**_CHAPTER_STEPS, "kind": "constant", "step_ms": 1.0}),
    "shared_prefix": SchedulePreset(("static", "continuous", "chunked"),
                                    {**_NO_LIMITS, "max_seqs": 32, "token_budget": 2048, "chunk": 512},
                                    _affine(5.0, 0.05, 0.25)),
    "poisson2000": SchedulePreset(("continuous", "chunked"),
                                  {**_NO_LIMITS, "max_seqs": 256, "token_budget": 8192, "chunk": 512},
                                  _affine(5.0, 0.02, 0.05)),
    "poisson10000": SchedulePreset(("continuous", "chunked"),
                                   {**_NO_LIMITS, "max_seqs": 256, "token_budget": 8192, "chunk": 512},
                                   _affine(5.0, 0.02, 0.05)),
    "custom": SchedulePreset(ALL_POLICIES, {**_NO_LIMITS, "chunk": 2}, _CHAPTER_STEPS),
    "upload": SchedulePreset(("continuous", "chunked"),
                             {**_NO_LIMITS, "max_seqs": 64, "token_budget": 4096, "chunk": 512},
                             _affine(5.0, 0.02, 0.1)),
}


# ---- workloads --------------------------------------------------------------------------------

def load_scenario(name: str) -> Workload:
    if name == "chapter31":
        return load_workload(DATA / "workloads" / "chapter31.json")
    if name == "burst5":
        return load_workload(DATA / "workloads" / "burst5.json")
    if name == "shared_prefix":
        return load_workload(DATA / "workloads" / "shared_prefix_200.json")
    if name == "poisson2000":
        return poisson_workload(2000, rate_per_s=20.0, seed=2000)
    if name == "poisson10000":
        return poisson_workload(10_000, rate_per_s=50.0, seed=10_000)
    raise ConfigError(f"scenario: unknown built-in {name!r}")


def given_schedules(name: str) -> list[tuple[str, Trace]]:
    if name != "chapter31":
        return []
    return [(f"given {k}", load_trace(DATA / "traces" / f"chapter31_{k}.json")) for k in ("serial", "continuous")]


def max_output_tokens(workload: Workload) -> int:
    """Output tokens the workload's requests ask for (each request's `output_tokens`)."""
    return sum(r.max_output_tokens for r in workload.requests)


def without_tenants(workload: Workload) -> Workload:
    """The same requests with no tenant cache salt, so every request may share every prefix."""
    return Workload([dataclasses.replace(r, tenant=None) for r in workload.requests], name=workload.name)


# ---- trace files --------------------------------------------------------------------------------

TRACE_SUFFIXES = (".json", ".json.gz", ".parquet")


def bundled_trace_files() -> list[Path]:
    """The serving-trace files in data/traces."""
    return sorted(p for p in (DATA / "traces").glob("*") if p.name.endswith(TRACE_SUFFIXES))


# Real files of other tools, bundled with how they were made (data/imports/*/MADE.md), listed on
# the replay page by what they are.
TOOL_FILES = {
    "vLLM 0.32 (CPU) run 2: client + iteration log + spans + KV events, merged":
        "traces/vllm_cpu_run2_merged.json.gz",
    "vLLM 0.32 (CPU) run 2: its prefix cache (KV events)":
        "imports/vllm_telemetry/run2_poisson4_p192_o48/kv_events.jsonl",
    "vLLM 0.32 (CPU) run 2: its request spans (OTLP/JSON)":
        "imports/vllm_telemetry/run2_poisson4_p192_o48/spans.otlp.jsonl",
    "vLLM 0.32 (CPU) run 2: its iteration log": "imports/vllm_telemetry/run2_poisson4_p192_o48/server.log",
    "AIPerf 0.13 against our server (profile_export.jsonl)":
        "imports/aiperf/aiperf_n24_c2_p128_o16/profile_export.jsonl",
    "guidellm 0.8.1 against our server: concurrency 1, 2, 4":
        "imports/guidellm/concurrent1-2-4_p64_o32_n12/benchmarks.json",
    "vllm bench sweep against our server: max_seqs 2 and 16 x concurrency 1, 2, 4 (12 runs)":
        "imports/vllm_sweep/maxseqs_x_concurrency",
    "inference-perf 0.7 against our server (per request)":
        "imports/inference_perf/ip_rate4_p64_o32/per_request_lifecycle_metrics.json",
    "vLLM 0.32 (CPU) x2 behind sglang-router: a fleet from its servers' own files + vllm bench serve":
        "imports/vllm_fleet/fleet.json.gz",
}


def trace_files(extra: str = "") -> dict[str, Path]:
    """File name -> path for the bundled traces (data/traces), engine result files
    (data/imports), and the files or directories in `extra`, an os.pathsep-separated list
    (the SERVING_EXPLORER_TRACES environment variable). The first file of a name wins. A
    directory of Parquet parts (a partitioned trace) is listed as "name/".
    Only regular files are listed: FIFOs, devices, directories named *.json and broken or
    looping symlinks are skipped (reading a FIFO would block the page forever)."""
    roots = [DATA / "traces", DATA / "imports"] + [Path(p) for p in extra.split(os.pathsep) if p]
    out: dict[str, Path] = {name: DATA / rel for name, rel in TOOL_FILES.items() if (DATA / rel).exists()}
    seen = {p.resolve() for p in out.values()}      # a file listed under its description is not listed again
    for root in roots:
        files = [root] if root.is_file() else sorted(root.glob("*")) if root.is_dir() else []
        for f in files:
            if f.name.endswith(TRACE_SUFFIXES) and f.is_file() and f.resolve() not in seen:   # regular, links followed
                out.setdefault(f.name, f)
                seen.add(f.resolve())
            elif f.is_dir() and (f / "part-00000.parquet").is_file() and f.resolve() not in seen:   # partitioned
                out.setdefault(f"{f.name}/", f)
                seen.add(f.resolve())
    return out


def poisson_workload(n: int, rate_per_s: float, seed: int = 0, max_prompt: int = 2048,
                     max_output: int = 512) -> Workload:
    rng = np.random.default_rng(seed)
    arrivals = np.concatenate([[0.0], np.cumsum(rng.exponential(1000.0 / rate_per_s, n - 1))])
    prompts = rng.integers(1, max_prompt + 1, n)
    outputs = rng.integers(1, max_output + 1, n)
    return Workload([Request(f"r{i}", round(float(a), 3), int(p), int(o))
                     for i, (a, p, o) in enumerate(zip(arrivals, prompts, outputs))], name=f"poisson{n}")


def workload_from_rows(rows: list[dict]) -> Workload:
    """From an edited table (id, arrival_ms, prompt_tokens, max_output_tokens or output_tokens);
    errors name the row."""
    reqs = []
    for i, row in enumerate(rows):
        d = {k: v for k, v in row.items() if v is not None and not (isinstance(v, float) and math.isnan(v))}
        if not d:
            continue
        d.setdefault("id", f"R{i + 1}")
        for k in ("prompt_tokens", "max_output_tokens", "output_tokens"):
            if isinstance(d.get(k), float) and d[k].is_integer():
                d[k] = int(d[k])
        try:
            reqs.append(request_from_dict(d, f"row {i + 1}"))
        except WorkloadError as e:
            msg = str(e)
            raise WorkloadError(msg if msg.startswith("row ") else f"row {i + 1}: {msg}") from None
    return Workload(reqs, name="custom")


MAX_LINK_REQUESTS = 200     # rows of a custom workload a link carries (a URL stays well under 8 KB)
CUSTOM_COLUMNS = ("id", "arrival_ms", "prompt_tokens", "max_output_tokens")


def custom_to_link(workload: Workload) -> str:
    """A custom workload as one compact URL parameter value: JSON rows [id, arrival ms, prompt
    tokens, max output tokens]."""
    return json.dumps([[r.id, float(r.arrival_ms) if not float(r.arrival_ms).is_integer() else int(r.arrival_ms),
                        int(r.prompt_tokens), int(r.max_output_tokens)] for r in workload.requests],
                      separators=(",", ":"))


def custom_from_link(text: str) -> list[dict]:
    """The table rows of custom_to_link's value, checked (the workload itself is built and
    checked by workload_from_rows); InputError says what is wrong."""
    try:
        rows = json.loads(text)
    except ValueError:
        raise InputError("the link's workload table: not valid JSON") from None
    if (not isinstance(rows, list) or not 1 <= len(rows) <= MAX_LINK_REQUESTS
            or not all(isinstance(r, list) and len(r) == 4 for r in rows)):
        raise InputError(f"the link's workload table: expected 1 to {MAX_LINK_REQUESTS} rows "
                         "[id, arrival_ms, prompt_tokens, max_output_tokens]")
    out = [dict(zip(CUSTOM_COLUMNS, r)) for r in rows]
    workload_from_rows(out)     # raises WorkloadError (an InputError) naming the row
    return out


# ---- worked examples: KV paging -----------------------------------------------------------------------

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
    bm = KVCacheManager(max(4, len(a) // block_size + 2), block_size, prefix_caching=True)
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
    bm = KVCacheManager(need + 2, block_size)
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


def word_prefix_match(words_a: str, words_b: str) -> int:
    """Positions of `words_b` served from `words_a`'s cache when each distinct word is one token
    id: the same words in another order share only their common leading run."""
    vocab = {w: i + 100 for i, w in enumerate(dict.fromkeys(words_a.split() + words_b.split()))}
    return prefix_match([vocab[w] for w in words_a.split()], [vocab[w] for w in words_b.split()])


# ---- worked examples: attention tiles -------------------------------------------------------------

# The chapter's one query: unnormalised weights [4, 2, 1, 1] (logits = ln w) over values [1, 3, 0, 2].
CHAPTER_TILE_WEIGHTS = (4.0, 2.0, 1.0, 1.0)
CHAPTER_TILE_VALUES = (1.0, 3.0, 0.0, 2.0)


def chapter_tile_example() -> tuple[np.ndarray, np.ndarray]:
    """(logits [n], values [n]) of the chapter's example."""
    return np.log(CHAPTER_TILE_WEIGHTS), np.array(CHAPTER_TILE_VALUES)


def random_tile_example(num_keys: int, seed: int, logit_scale: float) -> tuple[np.ndarray, np.ndarray]:
    """(logits [n], values [n]): standard normal logits x `logit_scale` and values, seeded."""
    if isinstance(num_keys, bool) or not isinstance(num_keys, int) or num_keys < 1:
        raise ConfigError(f"num_keys: expected a positive integer, got {num_keys!r}")
    rng = np.random.default_rng(seed)
    return rng.standard_normal(num_keys) * logit_scale, rng.standard_normal(num_keys)
