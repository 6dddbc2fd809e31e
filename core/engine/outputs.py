"""A step's batch, and the states a request passes through (core.engine.scheduler)."""
from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum

import numpy as np


@dataclass(slots=True)
class Batch:
    step: int
    t_ms: float                 # step start
    reqs: np.ndarray            # request indices, batch order
    num_tokens: np.ndarray      # tokens computed for each this step
    start_pos: np.ndarray       # first position written (tokens already cached)
    is_prefill: np.ndarray      # False: a one-token decode after at least one emission
    emits: np.ndarray | None = None  # the step completes everything known (a token is due); None: compute
    counts: tuple[int, int] | None = None  # (prefill tokens, decode seqs) when the scheduler knows them

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


class RequestState(IntEnum):
    NOT_ARRIVED = 0
    WAITING = 1
    RUNNING = 2
    DONE = 3      # finished, aborted or rejected


NOT_ARRIVED, WAITING, RUNNING, DONE = (int(s) for s in RequestState)  # plain ints for the int8 state array
