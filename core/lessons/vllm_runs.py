"""The bundled real vLLM runs (data/imports/vllm_telemetry: vLLM 0.32.0's CPU build serving the
tiny byte model, its own iteration log, spans, KV events and /metrics) as workloads and engine
settings the simulator can replay: the same prompts (dataset.jsonl, sent in file order:
`vllm bench serve --disable-shuffle`), arriving when vLLM's front-end received them (the
spans' start), under the server's flags (scripts/serve.sh)."""
from __future__ import annotations

import json
import re
from functools import lru_cache
from pathlib import Path

from core.config import SchedulerConfig
from core.errors import InputError
from core.trace import open_trace
from core.workload import Request, Workload

ROOT = Path(__file__).resolve().parents[2] / "data" / "imports" / "vllm_telemetry"
RUNS = {"run1_c4_p128_o32": "run 1: 48 requests, 4 at a time, 128-token prompts (96 shared), 32 out",
        "run2_poisson4_p192_o48": "run 2: 48 requests, Poisson 4/s, 192-token prompts (128 shared), 48 out"}
# vllm serve ... --max-num-seqs 16 --max-num-batched-tokens 2048 --block-size 32 --enable-prefix-caching
#   --num-gpu-blocks-override 64   (scripts/serve.sh)
VLLM_CONFIG = SchedulerConfig(policy="vllm-v1", max_seqs=16, token_budget=2048, block_size=32, kv_blocks=64,
                              prefix_caching=True)
_BENCH_ID = re.compile(r"-(\d+)-0$")     # vLLM names the i-th request of `vllm bench serve` ...-i-0


def run_dir(run: str) -> Path:
    if run not in RUNS:
        raise InputError(f"run: expected one of {', '.join(RUNS)}, got {run!r}")
    return ROOT / run


@lru_cache(maxsize=4)
def run_workload(run: str) -> Workload:
    """The run's requests as vLLM's engine saw them: prompt ids (the byte model's tokens of the
    dataset's prompts), output lengths and arrivals at its front-end (span starts, ms from the
    first)."""
    d = run_dir(run)
    rows = [json.loads(ln) for ln in (d / "dataset.jsonl").read_text().splitlines() if ln.strip()]
    spans = open_trace(d / "spans.otlp.jsonl").trace
    reqs = []
    for k, rid in enumerate(spans.ids):
        m = _BENCH_ID.search(rid)
        if m is None:
            continue            # the warm-up's requests (run 1's folder holds them too)
        i = int(m.group(1))
        if not rid.startswith("cmpl-bench-") or i >= len(rows):
            continue
        reqs.append((rid, float(spans.requests["arrival_ms"].iloc[k]), rows[i]))
    bench = [r for r in reqs if r[0].rsplit("-", 2)[0] == _last_bench_prefix(reqs)]
    t0 = min(a for _, a, _ in bench)
    return Workload([Request(rid, a - t0, len(row["prompt"].encode()), int(row["output_tokens"]),
                             prompt_ids=tuple(row["prompt"].encode()))
                     for rid, a, row in sorted(bench, key=lambda r: r[1])], name=RUNS[run])


def _last_bench_prefix(reqs) -> str:
    """The measured run's id prefix (cmpl-bench-<uuid>): the warm-up before it used another."""
    return max(((rid.rsplit("-", 2)[0], a) for rid, a, _ in reqs), key=lambda x: x[1])[0]


def engine_view(run: str):
    """vLLM's own per-request TTFT and E2E of the run (its spans), indexed by request id."""
    from core.analysis.metrics import request_metrics
    m = request_metrics(open_trace(run_dir(run) / "spans.otlp.jsonl").trace).set_index("id")
    return m.loc[[r.id for r in run_workload(run).requests]]
