"""The five serving pathologies as presets: each a broken schedule beside a fixed one, the
metric that reveals the difference and the control that makes it.

1. long-context out-of-memory: one request needs most of the KV pool; admitted, it keeps
   preempting the others (recompute thrash); the context budget (max_model_len) rejects it
   on arrival with a reason instead.
2. head-of-line blocking: one long prefill computed in a single step stalls every running
   decode (an inter-token gap the length of the prefill); chunked prefill bounds the gap.
3. preemption / recompute thrash: a pool too small for the admitted concurrency; the KV
   watermark admits fewer at once, so preemptions fall and throughput rises.
4. streaming / cancellation leak: clients abort mid-stream; the engine must free their blocks.
   Beside it, a DELIBERATELY BROKEN simulated variant (LeakyScheduler) that forgets to, so
   aborted requests' blocks stay in use after every request has ended.
5. cold start: time to the first token of a fresh server includes loading the model and a
   first step that pays for lazy initialisation; measured by the runner (meta.startup).
Every number comes from the simulator (step model stated) or, for 5, a measured trace.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from core.analysis.metrics import COMPLETED, itl_gaps_of, request_metrics, summarize
from core.config import SchedulerConfig
from core.engine import loop
from core.engine.scheduler import Scheduler
from core.sim.simulate import simulate, simulator
from core.sim.stepmodel import StepModel
from core.workload import Request, Workload


@dataclass(frozen=True)
class Pathology:
    key: str
    title: str
    symptom: str
    reveals: str      # the metric that shows it
    control: str      # what fixes it
    columns: tuple[str, ...] = ()   # the columns of the run's table that show it (they differ between the rows)


PATHOLOGIES = [
    Pathology("oom", "1. Long-context out-of-memory",
              "one request needs most of the KV pool; while it runs the others are preempted and recomputed",
              "preemptions, recomputed prefill tokens, E2E p99",
              "a context budget (max_model_len): the request is rejected on arrival, with a reason",
              ("preemptions", "recomputed prefill tokens", "E2E p99 ms")),
    Pathology("hol", "2. Head-of-line blocking",
              "a 6,000-token prompt prefilled in one step stalls eight running decodes",
              "the largest inter-token gap of the running requests (decode ITL max). Not their TPOT: a mean over "
              "each request's 200 tokens, it counts the same prefill work whether it arrives as one long stall "
              "or as many slightly longer steps, so it is the same in both rows",
              "chunked prefill: the prompt is computed 256 tokens per step beside the decodes",
              ("decode ITL max ms",)),
    Pathology("thrash", "3. Preemption / recompute thrash",
              "a KV pool too small for the admitted concurrency: requests are admitted, then preempted",
              "preemptions, recomputed prefill tokens, output tokens/s",
              "a KV watermark (admit only while 30% of the pool stays free) or fewer seats",
              ("preemptions", "recomputed prefill tokens", "output tok/s")),
    Pathology("leak", "4. Streaming / cancellation leak",
              "half of the clients abort mid-stream; a broken engine never frees their KV blocks",
              "KV blocks still in use after every request has ended",
              "free an aborted request's blocks at once (what core.engine.scheduler does)",
              ("KV blocks in use at the end",)),
    Pathology("cold", "5. Cold start",
              "a fresh server's first token waits for the model to load and for a slow first step",
              "model load time and the first step's duration against a warm step (measured)",
              "load and warm up before taking traffic (readiness check), keep replicas warm"),
]


def _recomputed(tr) -> int:
    """Prefill tokens computed beyond each request's prompt (recompute after preemption)."""
    b = tr.batch
    pre = int(b["tokens"].to_numpy()[(b["kind"] == "prefill").to_numpy()].sum())
    ran = np.unique(b["req"].to_numpy())
    return pre - int(tr.requests["prompt_tokens"].to_numpy()[ran].sum())


def _row(label: str, tr, **extra) -> dict:
    s = summarize(tr, per_request=False)["summary"]
    m = request_metrics(tr)
    done = m["finish_reason"].isin(COMPLETED).to_numpy()
    # the preset's own metric first, so a narrow screen shows it
    return {"schedule": label, **extra, "trace": tr, "completed": int(done.sum()), "requests": len(m),
            "preemptions": int(tr.meta["stats"]["preemptions"]), "recomputed prefill tokens": _recomputed(tr),
            "output tok/s": s["output_tok_per_s"], "TTFT p99 ms": s["ttft_ms"]["p99"],
            "TPOT p99 ms": s["tpot_ms"]["p99"], "E2E p99 ms": s["e2e_ms"]["p99"]}


AFFINE = StepModel("affine", base_ms=5.0, prefill_ms_per_token=0.02, decode_ms_per_seq=0.05)


def _regular(n: int, rate_per_s: float, prompt: int, output: int, seed: int) -> list[Request]:
    t = np.cumsum(np.random.default_rng(seed).exponential(1000.0 / rate_per_s, n))
    return [Request(f"r{i}", float(a), prompt, output) for i, a in enumerate(t)]


def run_oom() -> list[dict]:
    reqs = _regular(40, 20.0, 300, 120, 1) + [Request("long", 400.0, 3000, 200)]
    w = Workload(reqs, name="40 regular requests and one 3,000-token prompt")
    base = dict(max_seqs=16, token_budget=4096, chunk=512, block_size=16, kv_blocks=260)
    rows = []
    for label, cfg in (("no context budget", SchedulerConfig(**base)),
                       ("max_model_len 2,048", SchedulerConfig(**base, max_model_len=2048))):
        tr = simulate(w, cfg, AFFINE, label=label)
        rows.append(_row(label, tr, rejected=int(tr.meta["stats"].get("rejected", 0))))
    return rows


def run_hol() -> list[dict]:
    reqs = [Request(f"d{i}", 0.0, 32, 200) for i in range(8)] + [Request("long", 100.0, 6000, 20)]
    w = Workload(reqs, name="8 decoding requests and a 6,000-token prompt at 100 ms")
    model = StepModel("affine", base_ms=5.0, prefill_ms_per_token=0.05, decode_ms_per_seq=0.1)
    rows = []
    for label, cfg in (("whole prompts", SchedulerConfig(token_budget=8192)),
                       ("chunked prefill, 256 tokens", SchedulerConfig(token_budget=264, chunk=256))):
        tr = simulate(w, cfg, model, label=label)
        short = tr.tokens[tr.tokens["req"] < 8]
        gaps = itl_gaps_of(short["req"].to_numpy(), short["t_ms"].to_numpy())
        rows.append(_row(label, tr, **{"decode ITL max ms": float(gaps.max())}))
    return rows


def run_thrash() -> list[dict]:
    w = Workload(_regular(200, 20.0, 600, 300, 2), name="200 requests at 20 req/s")
    base = dict(max_seqs=64, token_budget=4096, chunk=512, block_size=16, kv_blocks=400)
    return [_row(label, simulate(w, cfg, AFFINE, label=label)) for label, cfg in (
        ("64 seats, no watermark", SchedulerConfig(**base)),
        ("64 seats, watermark 0.3", SchedulerConfig(**base, kv_watermark=0.3)))]


class LeakyScheduler(Scheduler):
    """DELIBERATELY BROKEN (pathology 4): an aborted request leaves the running set but its
    KV blocks are never freed."""

    def leave_running(self, i, now_ms, free_blocks=True):
        super().leave_running(i, now_ms, free_blocks=False)   # its blocks stay allocated


def run_leak() -> list[dict]:
    reqs = [Request(f"c{i}", 25.0 * i, 200, 300, abort_at_ms=25.0 * i + 400.0 if i % 2 else None)
            for i in range(40)]
    w = Workload(reqs, name="40 streams, every other one cancelled 400 ms in")
    cfg = SchedulerConfig(max_seqs=16, token_budget=2048, chunk=512)
    rows = []
    for label, cls in (("frees aborted requests' blocks", Scheduler),
                       ("BROKEN variant: never frees them", LeakyScheduler)):
        core = simulator(cfg, AFFINE, w, fast_forward=True, scheduler=cls)
        loop.run(core, loop.VirtualClock(0.0))
        tr = core.trace(w, core.trace_meta(w, "simulated", label, {"name": "core.pathologies"},
                                           step_model=AFFINE.to_dict()))
        rows.append(_row(label, tr, **{"KV blocks in use at the end": core.stats().kv_used_blocks,
                                       "KV blocks in use, peak": int(tr.steps["kv_used_blocks"].max())}))
    return rows


def cold_start(trace) -> dict:
    """Cold-start numbers of a measured trace: model load, first step, median step, TTFT of
    the first request, and load + that TTFT (the first token of a fresh server)."""
    st = trace.meta.get("startup") or {}
    d = trace.steps["dur_ms"].to_numpy()
    m = request_metrics(trace)
    first = float(m["ttft_ms"].iloc[int(np.argmin(m["arrival_ms"].to_numpy()))])
    return {"model_load_ms": st.get("model_load_ms"), "first_step_ms": st.get("first_step_ms", float(d[0])),
            "median_step_ms": float(np.median(d[1:])) if len(d) > 1 else None, "first_ttft_ms": first,
            "first_token_from_start_ms": (st["model_load_ms"] + first) if st.get("model_load_ms") is not None
            else None, "device": trace.meta.get("device"), "created": trace.meta.get("created")}


RUNS = {"oom": run_oom, "hol": run_hol, "thrash": run_thrash, "leak": run_leak}
