"""The data contracts of the engine core (vLLM v1's seam between scheduling and execution):

    out = scheduler.schedule(now)              # SchedulerOutput: who runs, how many tokens each
    res = executor.execute(out)                # ExecutorOutput: when the step ended, what it emitted
    happened = scheduler.update(out, res)      # EngineOutputs: tokens, finishes with reasons, ...

The executor sees only a SchedulerOutput (request rows, token counts, positions, and, when it
asks for them, token ids and block ids), never the scheduler. Whoever answers clients (the
server) reads only EngineOutputs: every request that entered the engine leaves through one of
them with a reason, so a rejected or aborted request is answered by construction.
"""
from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np


class SchedulerOutput:
    """One step's batch: entry j computes num_tokens[j] tokens of request reqs[j] from position start_pos[j]
    (numpy arrays; a simulator's: lists). A plain class: compiled, a dataclass's __init__ stays Python."""
    step: int
    t_ms: float                 # step start
    reqs: Any     # request rows (core.engine.requests), batch order
    num_tokens: Any   # tokens computed for each this step
    start_pos: Any    # first position written (tokens already cached)
    is_prefill: Any   # False: a one-token decode after at least one emission
    emits: Any  # the step completes everything known (a token is due); None: compute
    # Only for an executor that runs a model (Scheduler(request_data=True)); None otherwise:
    new_token_ids: list[list[int]] | None   # per entry: known ids not sent before (first: the prompt)
    block_updates: list[tuple[int, list[int]]] | None  # per entry: (blocks kept, blocks appended)
    finished: list[int] | tuple   # requests gone since the last output (drop their state)
    kv_copies: list | None      # CPU-tier copies to make (core.kvtier.tier.Job: loads before the forward, stores after)
    idle_ms: float              # how long the engine sat idle before this step (inf: its first step)
    # (prefill tokens, decode seqs, attended positions of prefill tokens and of decodes, prefill
    # pieces, tokens) over every entry, listed or not: what a step-time model prices
    agg: tuple | None
    decoders: int               # decoders in the step beyond the listed entries (a simulator's batch)
    join_no: Any   # ... and each listed entry's join number (running order)

    def __init__(self, step: int, t_ms: float, reqs: Any, num_tokens: Any, start_pos: Any, is_prefill: Any,
                 emits: Any = None, agg: tuple | None = None, decoders: int = 0, join_no: Any = None):
        self.step, self.t_ms, self.reqs, self.num_tokens, self.start_pos = step, t_ms, reqs, num_tokens, start_pos
        self.is_prefill, self.emits, self.agg, self.decoders, self.join_no = is_prefill, emits, agg, decoders, join_no
        self.new_token_ids, self.block_updates, self.finished, self.idle_ms = None, None, (), 0.0
        self.kv_copies = None

    @property
    def prefill_tokens(self) -> int:
        return self.agg[0] if self.agg is not None else int(np.add.reduce(self.num_tokens, where=self.is_prefill))

    @property
    def decode_seqs(self) -> int:
        return self.agg[1] if self.agg is not None else len(self.is_prefill) - int(np.count_nonzero(self.is_prefill))

    @property
    def total_tokens(self) -> int:
        return self.agg[5] if self.agg is not None else int(self.num_tokens.sum())


class ExecutorOutput:
    """What an executor returns for one SchedulerOutput (the scheduler never knows who made it)."""
    t_end_ms: float                              # when the step's tokens are on the host
    dur_ms: float | None                         # step duration (default t_end_ms - the step's start)
    tokens: list[list[int]] | None               # per batch entry: token ids it emits ([] for none);
    #                                              None: one unknown token per entry that completes
    sources: list[list[int]] | None              # per entry: codes into TOKEN_SOURCES (None: sampled)
    events: list[dict] | None                    # verbatim trace events (spec, tiles)
    failed: dict[int, str] | None                # batch entry -> why it failed (its request ends with
    #                                              reason "error"; the rest of the batch goes on)
    copies: list | None                          # per SchedulerOutput.kv_copies job: (start, end) ms, measured

    def __init__(self, t_end_ms: float, dur_ms=None, tokens=None, sources=None, events=None, failed=None,
                 copies=None):
        self.t_end_ms, self.dur_ms, self.tokens = t_end_ms, dur_ms, tokens
        self.sources, self.events, self.failed, self.copies = sources, events, failed, copies


class StepRecord(NamedTuple):
    """A step as the trace records it: its start, duration and the engine's gauges when planned.
    A run of decode steps (Scheduler.advance): steps a range; lists of starts, durations, running
    and KV used; one waiting count; in kv_free_blocks the pool's size (free: size - used)."""
    step: int | range
    t_ms: float | list        # step start
    dur_ms: float | list
    running: int | list
    waiting: int
    kv_used_blocks: int | list
    kv_free_blocks: int       # free blocks; a run's: the pool's size (each step's free: size - used)


class Preemption(NamedTuple):
    req: int
    t_ms: float
    reason: str                  # kv_full
    freed_blocks: int


class Finish(NamedTuple):
    req: int
    t_ms: float
    reason: str                  # length | stop | abort | deadline | rejected | error
    detail: str | None = None    # why, in words (a rejection's rule and numbers)
    limit: str | None = None     # the option that rejected it: max_model_len | queue_limit


class SchedulerStats(NamedTuple):
    """The engine's gauges after a step (or between steps): what a server's /metrics and a
    router read."""
    running: int
    waiting: int
    kv_used_blocks: int
    kv_blocks: int
    preemptions: int             # since the start
    prefix_hit_blocks: int       # since the start
    queued_prompt_tokens: int = 0   # tokens the waiting requests must (re)compute before they emit

    @property
    def kv_usage(self) -> float:
        return self.kv_used_blocks / max(1, self.kv_blocks)

    @property
    def kv_free_blocks(self) -> int:
        return self.kv_blocks - self.kv_used_blocks


EMPTY = np.empty(0, dtype=np.int64)
EMPTY.flags.writeable = False


class EngineOutputs(NamedTuple):
    """What happened since the last EngineOutputs: a step's result (`step` set; a fast-forwarded
    run, K decode steps at once: `record` holds them as StepRecord says, `after` each one's gauges
    but the last's) with what happened before it since the last outputs (arrivals queued or
    rejected, cancellations, deadlines), or, between steps, only the latter. Everything a
    server answers clients from and everything a trace records is here: whoever records a run
    observes these, the scheduler writes nothing else. A tuple: read-only, and made once per
    step at the cost of a tuple."""
    t_ms: float                               # when (a step's end; a run's last end)
    gauges: tuple                             # SchedulerStats' fields, in order (see `stats`)
    step: SchedulerOutput | None = None       # the step these outputs complete (a run: its first)
    dur_ms: float | None = None               # its duration
    finished: list[Finish] | tuple = ()       # every request that left, with its reason
    queued: list[int] | tuple = ()            # entered the waiting queue (arrival checks passed)
    started: list[int] | tuple = ()           # scheduled for the first time in this step
    preempted: list[Preemption] | tuple = ()  # sent back to the waiting queue (recompute)
    token_reqs: Any = EMPTY           # one entry per emitted token: its request row
    token_index: Any = EMPTY          # ... its output position
    token_ids: np.ndarray | None = None       # ... its id (None: unknown, simulated)
    record: StepRecord | None = None          # the step (or run) as a trace records it
    token_t_ms: np.ndarray | None = None      # ... each token's time (a run); None: all at t_ms
    token_sources: np.ndarray | None = None   # ... codes into TOKEN_SOURCES (None: sampled)
    kv_events: list | tuple = ()              # KV block events since the last outputs (KVLog calls)
    events: list[dict] | None = None          # the executor's verbatim trace events (spec, tiles)
    # a simulator's decoders (counted, not listed: core.engine.scheduler): (decode counter before the
    # step, decoders) when they decoded in this step; those that started decoding (req, join number,
    # first counter value, first output index); those that stopped (req, counter value after their
    # last decode, that step's end or None)
    decoded: tuple | None = None
    entered: list | tuple = ()
    left: list | tuple = ()
    # a run of steps: (running, waiting, KV blocks used) after each step but the last (the last's: gauges)
    after: tuple | None = None
    cache_news: list | tuple = ()   # asked (cache_news): prefix-cache changes (+1 stored | -1 evicted, hash, t_ms;
    #                                 the CPU tier's: +2 | -2)

    @property
    def stats(self) -> SchedulerStats:
        """The engine's gauges when these outputs were taken."""
        return SchedulerStats(*self.gauges)

    def new_tokens(self) -> dict[int, list[int]]:
        """Emitted token ids per request, in order (ids known: a real engine)."""
        out: dict[int, list[int]] = {}
        if self.token_ids is None:
            return out
        for i, t in zip(self.token_reqs.tolist(), self.token_ids.tolist()):
            out.setdefault(i, []).append(t)
        return out
