"""What one step produced and what the scheduler recorded.

`StepOutput` is the executor's answer for one batch (core.loop). `StepLog` is the
scheduler's columnar record of a run: typed rows (or, for a fast-forwarded run of steps,
rows whose fields are arrays) that core.trace turns into a trace.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from core.paging import KVLog


# Step-log records. Each is a row, or (StepRun and parts built from arrays) a run of rows.
class StepRecord(NamedTuple):
    step: int | np.ndarray
    t_ms: float | np.ndarray        # step start
    dur_ms: float | np.ndarray
    running: int | np.ndarray
    waiting: int | np.ndarray
    kv_used_blocks: int | np.ndarray
    kv_free_blocks: int | np.ndarray


StepRun = StepRecord  # a fast-forwarded run: the same fields, one array each


class BatchPart(NamedTuple):
    step: int | np.ndarray          # one step, or (fast-forward) the steps the same batch repeats in
    reqs: np.ndarray
    num_tokens: np.ndarray
    is_prefill: np.ndarray


class TokenPart(NamedTuple):
    reqs: np.ndarray
    index: np.ndarray               # output position of each token
    t_ms: float | np.ndarray
    token_ids: np.ndarray | None    # None: ids unknown (simulated)


class FinishRecord(NamedTuple):
    req: int
    t_ms: float
    reason: str                     # length | stop | abort


class PreemptRecord(NamedTuple):
    req: int
    t_ms: float
    reason: str
    freed_blocks: int


@dataclass(slots=True)
class StepOutput:
    """What an executor returns for one batch (the scheduler never knows who made it)."""
    t_end_ms: float                              # when the step's tokens are on the host
    dur_ms: float | None = None                  # step duration (default t_end_ms - batch.t_ms)
    tokens: list[list[int]] | None = None        # per batch entry: token ids it emits ([] for none);
    #                                              None: one unknown token per entry that completes
    sources: list[list[int]] | None = None       # per entry: codes into TOKEN_SOURCES (None: sampled)
    events: list[dict] | None = None             # verbatim trace events (spec, tiles)


class StepLog:
    """Columnar record of what the scheduler did (turned into a trace by core.trace)."""

    def __init__(self):
        self.steps: list[StepRecord] = []
        self.batch_parts: list[BatchPart] = []
        self.token_parts: list[TokenPart] = []
        self.finishes: list[FinishRecord] = []
        self.preempts: list[PreemptRecord] = []
        self.kv = KVLog()
        self.token_sources: list = []            # per token part: codes into TOKEN_SOURCES, or None (sampled)
        self.other: list[dict] = []              # verbatim events (spec, tiles)

    def clear(self):
        """Forget every record (a streaming writer has taken them); the run continues."""
        self.steps, self.batch_parts, self.token_parts = [], [], []
        self.finishes, self.preempts, self.token_sources, self.other = [], [], [], []
        self.kv.clear()
