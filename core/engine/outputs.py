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

from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np


@dataclass(slots=True)
class SchedulerOutput:
    """One step's batch: entry j computes num_tokens[j] tokens of request reqs[j] from position
    start_pos[j]."""
    step: int
    t_ms: float                 # step start
    reqs: np.ndarray            # request rows (core.engine.requests), batch order
    num_tokens: np.ndarray      # tokens computed for each this step
    start_pos: np.ndarray       # first position written (tokens already cached)
    is_prefill: np.ndarray      # False: a one-token decode after at least one emission
    emits: np.ndarray | None = None  # the step completes everything known (a token is due); None: compute
    counts: tuple[int, int] | None = None  # (prefill tokens, decode seqs) when the scheduler knows them
    # Only for an executor that runs a model (Scheduler(request_data=True)); None otherwise:
    new_token_ids: list[list[int]] | None = None   # per entry: known ids not sent before (first: the prompt)
    block_updates: list[tuple[int, list[int]]] | None = None  # per entry: (blocks kept, blocks appended)
    finished: list[int] = field(default_factory=list)  # requests gone since the last output (drop their state)

    @property
    def prefill_tokens(self) -> int:
        if self.counts is not None:
            return self.counts[0]
        return int(np.add.reduce(self.num_tokens, where=self.is_prefill))

    @property
    def decode_seqs(self) -> int:
        if self.counts is not None:
            return self.counts[1]
        return len(self.is_prefill) - int(np.count_nonzero(self.is_prefill))

    @property
    def total_tokens(self) -> int:
        return int(self.num_tokens.sum())


@dataclass(slots=True)
class ExecutorOutput:
    """What an executor returns for one SchedulerOutput (the scheduler never knows who made it)."""
    t_end_ms: float                              # when the step's tokens are on the host
    dur_ms: float | None = None                  # step duration (default t_end_ms - the step's start)
    tokens: list[list[int]] | None = None        # per batch entry: token ids it emits ([] for none);
    #                                              None: one unknown token per entry that completes
    sources: list[list[int]] | None = None       # per entry: codes into TOKEN_SOURCES (None: sampled)
    events: list[dict] | None = None             # verbatim trace events (spec, tiles)
    failed: dict[int, str] | None = None         # batch entry -> why it failed (its request ends with
    #                                              reason "error"; the rest of the batch goes on)


class Finish(NamedTuple):
    req: int
    t_ms: float
    reason: str                  # length | stop | abort | deadline | rejected | error
    detail: str | None = None    # why, in words (a rejection's rule and numbers)
    limit: str | None = None     # the option that rejected it: max_model_len | queue_limit


class SchedulerStats(NamedTuple):
    """The engine's gauges after a step (or between steps)."""
    running: int
    waiting: int
    kv_used_blocks: int
    kv_blocks: int
    preemptions: int             # since the start
    prefix_hit_blocks: int       # since the start

    @property
    def kv_usage(self) -> float:
        return self.kv_used_blocks / max(1, self.kv_blocks)


EMPTY = np.empty(0, dtype=np.int64)
EMPTY.flags.writeable = False


class EngineOutputs(NamedTuple):
    """What happened since the last EngineOutputs: one step's result (`step` set) or what
    happened between steps (arrivals queued or rejected, cancellations, deadlines). A tuple:
    read-only, and made by the scheduler once per step at the cost of a tuple."""
    t_ms: float                               # when (a step's end)
    gauges: tuple                             # SchedulerStats' fields, in order (see `stats`)
    step: SchedulerOutput | None = None       # the step these outputs complete
    dur_ms: float | None = None               # its duration
    finished: list[Finish] | tuple = ()       # every request that left, with its reason
    queued: list[int] | tuple = ()            # entered the waiting queue (arrival checks passed)
    started: list[int] | tuple = ()           # scheduled for the first time in this step
    preempted: list[int] | tuple = ()         # sent back to the waiting queue (recompute)
    token_reqs: np.ndarray = EMPTY            # one entry per emitted token: its request row
    token_index: np.ndarray = EMPTY           # ... its output position
    token_ids: np.ndarray | None = None       # ... its id (None: unknown, simulated)

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
