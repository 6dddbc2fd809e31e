"""The request table: every per-request value the engine keeps, one row per request in the
order requests were added (a workload's order, or a server's arrival order).

Every column is a Python list: the engine reads and writes one row at a time (a request
joining, becoming a decoder, leaving), where a numpy scalar costs more than the work. What
varies in length (known token ids) or is rare (per-request stop ids) lives in lists and dicts.
A server appends rows while the loop runs (`add`). `np.asarray(table.prompt_len)` where a
vector is wanted.

A request passes through the states NOT_ARRIVED -> WAITING -> RUNNING (-> WAITING again when
preempted) -> DONE (finished, aborted or rejected).
"""
from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, Final

import numpy as np

from core.workload import Request, Workload

NOT_ARRIVED, WAITING, RUNNING, DONE = range(4)   # a request's state (DONE: finished, aborted or rejected)

INF: Final = float("inf")


def cancellation(r: Request | None) -> tuple[float, str] | None:
    """(time, finish reason) of a request's earliest cancellation: the client's abort_at_ms
    ("abort") or its deadline ("deadline"); None if it has neither."""
    cands = []
    if r is not None and r.abort_at_ms is not None:
        cands.append((float(r.abort_at_ms), "abort"))
    if r is not None and r.deadline_ms is not None:
        cands.append((float(r.arrival_ms) + float(r.deadline_ms), "deadline"))
    return min(cands) if cands else None


class RequestTable:
    """Rows: `ids`; `prompt_len`, `out_len` (max output tokens), `arrival` (ms), `abort_at` (ms,
    inf: never), `computed` (tokens with KV in the cache), `emitted` (output tokens so far),
    `nblocks` (KV blocks held), `state` (NOT_ARRIVED .. DONE); `salt` (tenant cache salt), `priority`,
    `token_ids` (known ids: prompt then outputs, None when the workload gives only counts);
    `stop_of` (request -> its own stop ids, replacing the engine's)."""
    prompt_len: list[int]
    out_len: list[int]
    arrival: list[float]
    abort_at: list[float]
    computed: list[int]
    emitted: list[int]
    nblocks: list[int]
    state: list[int]

    def __init__(self, workload: Workload | None = None):
        w = workload
        n = len(w.ids) if w is not None else 0
        self.n = n
        self.ids: list[str] = list(w.ids) if w is not None else []
        if w is not None and n:
            self.prompt_len = np.asarray(w.prompt_tokens, dtype=np.int64).tolist()
            self.out_len = np.asarray(w.max_output_tokens, dtype=np.int64).tolist()
            self.arrival = np.asarray(w.arrival_ms, dtype=np.float64).tolist()
        else:
            self.prompt_len, self.out_len, self.arrival = [], [], []
        self.abort_at, self.computed, self.emitted, self.nblocks = [INF] * n, [0] * n, [0] * n, [0] * n
        self.state = [NOT_ARRIVED] * n
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
        cols: list[list] = [self.prompt_len, self.out_len, self.arrival, self.abort_at, self.computed, self.emitted,
                            self.nblocks, self.state]
        vals: list[Any] = [int(r.prompt_tokens), int(r.max_output_tokens), float(r.arrival_ms), INF, 0, 0, 0,
                           NOT_ARRIVED]   # (a list: a tuple of ints and floats would be read as floats, compiled)
        for col, v in zip(cols, vals):
            col.append(v)
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
        return [] if ids is None else ids[self.prompt_len[i]:]

    def workload(self, name: str) -> Workload:
        """The rows as a workload (prompt ids included where known): what a server was sent."""
        rows = []
        for i in range(self.n):
            p, ids = self.prompt_len[i], self.token_ids[i]
            rows.append(Request(self.ids[i], self.arrival[i], p, self.out_len[i],
                                None if ids is None else tuple(ids[:p])))
        return Workload(rows, name=name)
