"""The engine core: a component you step (vLLM v1's `EngineCore.step()`, nano-vllm's
`LLMEngine.step()`), the same for the simulator, the runner and a server.

    core = EngineCore(config, executor, workload, record=True)
    core.add_request(r); core.abort(i, now_ms)          # between steps
    out = core.step(now_ms)      # EngineOutputs: one step (or a fast-forwarded run of identical
                                 # steps), with what happened since the last outputs; None: nothing
    core.next_event_ms(); core.has_unfinished(); core.stats()   # when to step next, load signals
    trace = core.trace(workload, meta)                   # what the recorder observed

Inside a step: arrivals due are admitted, the scheduler plans a batch (SchedulerOutput), the
executor runs it (ExecutorOutput), the scheduler applies the result (EngineOutputs). The core
never reads a clock: the caller says when the step starts, and the outputs say when it ended
(the executor's t_end_ms). So one loop can drive one core on the wall clock (the runner, a
server: core.engine.loop.run) or several cores on one virtual clock (a fleet), stepping
whichever is due first.

Whatever records a run observes the outputs (`observe`): the trace recorder (`record=True`,
a core.engine.steplog.StepLog) is one observer among others (a server's answers, a streaming
writer); the scheduler writes nothing itself.
"""
from __future__ import annotations

import datetime as _dt
from collections.abc import Callable, Iterable
from typing import Any

from core.config import SchedulerConfig
from core.engine.outputs import EngineOutputs, ExecutorOutput, SchedulerStats
from core.engine.requests import INF
from core.engine.scheduler import Scheduler
from core.engine.steplog import StepLog, log_records
from core.workload import Request, Workload

Observer = Callable[[EngineOutputs], None]


class EngineCore:
    """One engine: a scheduler (its KV cache, its request table) and an executor.

    `executor` has `execute(SchedulerOutput) -> ExecutorOutput` (and, for `fast_forward`,
    `run_durations(batch, k)`: the simulator's step-time model); it may be set after the
    core is built (`core.executor = ...`: the runner sizes its KV cache from `core.num_kv_blocks`).
    `workload` None: requests come with add_request (a server, a closed loop, a router).
    `record`: a StepLog observes every output; `trace` builds the trace from it. `kv_events`:
    the outputs carry the KV block events (default: when recording; an observer of its own may
    ask for them). `scheduler`: the Scheduler class (a lesson's broken variant). `cache_news`: the
    outputs carry the prefix cache's changes (EngineOutputs.cache_news: a fleet router's news).
    `fast_forward` (a virtual clock only): runs of identical decode-only steps come back as one
    EngineOutputs with one row per step (the same trace as stepping them one by one)."""

    def __init__(self, config: SchedulerConfig, executor=None, workload: Workload | None = None, *,
                 record: bool = False, kv_events: bool | None = None, fast_forward: bool = False,
                 stop_token_ids: Iterable[int] = (), request_data: bool = False,
                 scheduler: Callable[..., Any] = Scheduler, explicit_batches: bool = True, cache_news: bool = False):
        kv_events = record if kv_events is None else kv_events
        self.log = StepLog(kv_events) if record else None
        news = {"cache_news": True} if cache_news else {}    # (a scheduler class of its own need not know it)
        self.scheduler: Any = scheduler(workload, config, stop_token_ids=stop_token_ids, request_data=request_data,
                                        kv_events=kv_events, explicit_batches=explicit_batches, **news)
        self.executor = executor
        self.fast_forward = fast_forward
        self.free_at_ms = float("inf")   # when the last step ended (inf: none yet; its first step's idle is inf)
        self.observers: list[Observer] = [self.log.record] if self.log is not None else []

    @property
    def config(self) -> SchedulerConfig:
        return self.scheduler.cfg

    @property
    def num_kv_blocks(self) -> int:
        return self.scheduler.kv.num_blocks

    def observe(self, fn: Observer):
        """Call `fn` with every EngineOutputs from now on (after the observers before it)."""
        self.observers.append(fn)

    # ---- inputs (between steps) ---------------------------------------------------------------
    def add_request(self, r: Request, stop_ids: Iterable[int] | None = None, preloaded: int = 0,
                    client_abort: bool = False) -> int:
        """Add a request (arrival times must not decrease); returns its row. ConfigError: it
        could never run (over the KV pool, or over the token budget without chunked prefill).
        `preloaded`: prompt tokens whose KV was computed elsewhere and came with it (a
        disaggregated decode replica; at most all but the last, which it computes itself).
        `client_abort`: apply its abort_at_ms (a simulated client; a server's clients cancel with
        `abort`)."""
        return self.scheduler.add_request(r, stop_ids, preloaded, client_abort)

    def abort(self, i: int, now_ms: float, reason: str = "abort"):
        """Cancel request i; its finish comes in the next outputs."""
        self.scheduler.abort(i, now_ms, reason)

    # ---- stepping -----------------------------------------------------------------------------
    def step(self, now_ms: float, until_ms: float | None = None) -> EngineOutputs | None:
        """Run one step starting at `now_ms` (or, fast-forwarding, a run of identical steps, none
        starting at or after `until_ms`: a fleet's next routing here) and return its outputs, with
        everything that happened since the last outputs; when there is nothing to run now, what
        happened meanwhile (step None), or None if nothing did."""
        sched = self.scheduler
        sched.horizon_ms = until_ms
        sched.admit_arrivals(now_ms)
        batch = sched.schedule(now_ms)
        if batch is None:
            if sched.copies:   # CPU-tier loads planned with nothing to run: made now (vLLM's step without a forward)
                jobs, sched.copies = sched.copies, None
                sched.tier.measured(jobs, self.executor.copy_kv(jobs))
            return self._emit(sched.take_outputs(now_ms)) if sched.has_outputs() else None
        batch.idle_ms = now_ms - self.free_at_ms if self.free_at_ms != INF else INF
        out = None
        if self.fast_forward:
            ex = self.executor
            out = sched.advance(batch, ex.run_durations)
        if out is None:   # (a step advance priced (run_durations equals execute) is not priced again)
            d = sched.priced_ms if self.fast_forward else None
            out = sched.update(batch, ExecutorOutput(batch.t_ms + d, d) if d is not None and d > 0
                               else self.executor.execute(batch))
        self.free_at_ms = out.t_ms
        return self._emit(out)

    def flush(self, now_ms: float) -> EngineOutputs | None:
        """What happened since the last outputs without a step (cancellations applied between
        steps), or None."""
        sched = self.scheduler
        return self._emit(sched.take_outputs(now_ms)) if sched.has_outputs() else None

    def _emit(self, out: EngineOutputs) -> EngineOutputs:
        for fn in self.observers:
            fn(out)
        return out

    # ---- state --------------------------------------------------------------------------------
    def next_event_ms(self) -> float | None:
        """When something can next happen while nothing runs: an arrival or a cancellation."""
        return self.scheduler.next_event_ms()

    def has_unfinished(self) -> bool:
        return not self.scheduler.done()

    @property
    def num_requests(self) -> int:
        return self.scheduler.requests.n

    @property
    def num_done(self) -> int:
        return self.scheduler.num_done

    @property
    def num_steps(self) -> int:
        return self.scheduler.step

    def cached_prefix_blocks(self, prompt_ids, salt: str | None, max_tokens: int) -> int:
        """Blocks of the longest cached prefix of a prompt (at most `max_tokens` tokens); changes nothing."""
        return len(self.scheduler.kv.match_prefix(prompt_ids, salt, max_tokens))

    @property
    def prefix_hits_first(self) -> int:
        """Prefix-cache hit blocks on requests' first admissions."""
        return self.scheduler.kv.hits_first

    def run_stats(self) -> dict:
        """What the engine did (a trace's meta.stats): steps, preemptions, KV pool size, KV operations
        (kv_<op>), rejected / deadline finishes when any, and with a CPU tier its counts (tier_<name>,
        core.kvtier.tier.CPUTier.stats)."""
        sched = self.scheduler
        tier = {f"tier_{k}": v for k, v in sched.tier.stats.items()} if sched.tier is not None else {}
        return {"steps": sched.step, "preemptions": sched.num_preemptions, "kv_blocks": sched.kv.num_blocks,
                **{f"kv_{k}": v for k, v in sched.kv.counts.items()}, **{k: v for k, v in sched.failed.items() if v},
                **tier}

    def stats(self) -> SchedulerStats:
        """Load signals now: running, waiting, KV blocks used / free, preemptions, prefix hits,
        prompt tokens waiting to be computed."""
        return self.scheduler.stats()

    # ---- the record ---------------------------------------------------------------------------
    def trace_meta(self, workload: Workload, source: str, label: str, engine: dict, created: str | None = None,
                   device: str | None = None, **fields) -> dict:
        """The metadata every trace of a run carries: origin, label, when, where (measured
        runs), the engine (its `name`, the scheduler options, then the rest of `engine`),
        `fields` (step_model, model, versions, ...), the workload, and what the engine did."""
        sched = self.scheduler
        engine = {"name": engine.get("name"), **sched.cfg.to_dict(), **{k: v for k, v in engine.items() if k != "name"}}
        where = {"device": device} if device is not None else {}
        return {"source": source, "label": label, "created": created or now_iso(), **where, "engine": engine,
                **fields, "workload": workload.name, "stats": self.run_stats()}

    def trace(self, workload: Workload, meta: dict):
        """The trace of what the recorder observed (record=True)."""
        if self.log is None:
            raise ValueError("this engine core records nothing (record=False)")
        from core.trace.build import trace_from_records
        return trace_from_records(workload, log_records(self.log), meta, self.log.other + self.tier_events())

    def tier_events(self) -> list:
        """The CPU tier's copies as trace events (core.kvtier.tier.CPUTier.events), [] without a tier."""
        tier = self.scheduler.tier
        return tier.events(self.scheduler.requests.ids) if tier is not None else []


def now_iso() -> str:
    return _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds")
