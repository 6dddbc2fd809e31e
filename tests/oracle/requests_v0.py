"""The request table as the oracle scheduler (tests/oracle/scheduler_v0.py) keeps it: numpy columns,
as core/engine/requests.py kept them before its numbers moved to Python lists (the engine reads
and writes one row at a time, where numpy scalars cost more than the work). The states and the
cancellation rule are core's own.
"""
from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np

from core.engine.requests import DONE, NOT_ARRIVED, RUNNING, WAITING, cancellation
from core.workload import Request, Workload

__all__ = ["DONE", "NOT_ARRIVED", "RUNNING", "WAITING", "RequestTable"]

# name -> (dtype, value of a new row)
ARRAYS = {"prompt_len": (np.int64, 0), "out_len": (np.int64, 0), "arrival": (np.float64, 0.0),
          "abort_at": (np.float64, np.inf), "computed": (np.int64, 0), "emitted": (np.int64, 0),
          "nblocks": (np.int64, 0), "state": (np.int8, NOT_ARRIVED)}


class RequestTable:
    """Rows: `ids`; `prompt_len`, `out_len` (max output tokens), `arrival` (ms), `abort_at` (ms,
    inf: never), `computed` (tokens with KV in the cache), `emitted` (output tokens so far),
    `nblocks` (KV blocks held), `state` (RequestState); `salt` (tenant cache salt), `priority`,
    `token_ids` (known ids: prompt then outputs, None when the workload gives only counts);
    `stop_of` (request -> its own stop ids, replacing the engine's)."""
    prompt_len: np.ndarray
    out_len: np.ndarray
    arrival: np.ndarray
    abort_at: np.ndarray
    computed: np.ndarray
    emitted: np.ndarray
    nblocks: np.ndarray
    state: np.ndarray

    def __init__(self, workload: Workload | None = None):
        w = workload
        n = len(w.ids) if w is not None else 0
        self.n = n
        self.ids: list[str] = list(w.ids) if w is not None else []
        self._cap: dict[str, np.ndarray] = {}
        if w is not None and n:
            self.prompt_len = w.prompt_tokens.astype(np.int64)
            self.out_len = w.max_output_tokens.astype(np.int64)
            self.arrival = w.arrival_ms.astype(np.float64)
            for name in ("abort_at", "computed", "emitted", "nblocks", "state"):
                dtype, fill = ARRAYS[name]
                setattr(self, name, np.full(n, fill, dtype=dtype))
        else:
            for name, (dtype, _) in ARRAYS.items():
                setattr(self, name, np.empty(0, dtype=dtype))
        reqs: Sequence[Request | None] = w.requests if w is not None and n and not w.plain else [None] * n
        self.salt: list[str | None] = [r.tenant if r else None for r in reqs]   # (per-request fields beyond columns)
        self.token_ids: list[list[int] | None] = [list(r.prompt_ids) if r and r.prompt_ids is not None else None
                                                  for r in reqs]
        self.priority: list[int] = [r.priority if r else 0 for r in reqs]
        self.stop_of: dict[int, frozenset] = {}
        self.preloaded: dict[int, int] = {}       # request -> prompt tokens whose KV came with it
        self.abort_reason: dict[int, str] = {}    # request -> "abort" or "deadline", where abort_at is set
        for i, r in enumerate(reqs):
            e = cancellation(r)
            if e is not None:
                self.abort_at[i], self.abort_reason[i] = e

    def __len__(self) -> int:
        return self.n

    def add(self, r: Request, stop_ids: Iterable[int] | None = None, client_abort: bool = False) -> int:
        """Append request `r` as a new row (state NOT_ARRIVED) and return its index. `client_abort`:
        its abort_at_ms is a cancellation the engine applies (a simulated client, a fleet's
        replica); otherwise only its deadline is (a server's client cancels by itself)."""
        i = self.n
        cap = self._cap
        if not cap or len(cap["state"]) <= i:
            cap = self._cap = {k: np.resize(getattr(self, k), max(16, 2 * i)) for k in ARRAYS}
        for k, v in zip(ARRAYS, (r.prompt_tokens, r.max_output_tokens, r.arrival_ms, np.inf, 0, 0, 0,
                                 NOT_ARRIVED)):
            cap[k][i] = v
            setattr(self, k, cap[k][:i + 1])
        self.ids.append(r.id)
        self.salt.append(r.tenant)
        self.priority.append(r.priority)
        self.token_ids.append(list(r.prompt_ids) if r.prompt_ids is not None else None)
        if stop_ids is not None:
            self.stop_of[i] = frozenset(stop_ids)
        if client_abort:                # a simulated client: abort_at_ms too, as a workload's rows have it
            e = cancellation(r)
            if e is not None:
                self.abort_at[i], self.abort_reason[i] = e
        elif r.deadline_ms is not None:   # (not abort_at_ms: a server's client cancels by itself)
            self.abort_at[i], self.abort_reason[i] = float(r.arrival_ms) + float(r.deadline_ms), "deadline"
        self.n = i + 1
        return i

    def outputs(self, i: int) -> list[int]:
        """The output token ids request i has emitted (ids known: a real engine)."""
        ids = self.token_ids[i]
        return [] if ids is None else ids[int(self.prompt_len[i]):]

    def workload(self, name: str) -> Workload:
        """The rows as a workload (prompt ids included where known): what a server was sent."""
        rows = []
        for i in range(self.n):
            p, ids = int(self.prompt_len[i]), self.token_ids[i]
            rows.append(Request(self.ids[i], float(self.arrival[i]), p, int(self.out_len[i]),
                                None if ids is None else tuple(ids[:p])))
        return Workload(rows, name=name)
