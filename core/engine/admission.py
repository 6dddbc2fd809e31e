"""Admission control for core.engine.scheduler: the waiting queue's order, rejections, deadlines.

Rules (each off by default; SchedulerConfig holds the switches):
- scheduling_policy "fcfs": the queue is arrival order; a preempted request goes back to its
  front. "priority" (vLLM's semantics): lower `priority` first, then earlier arrival, then
  workload order; a preempted request re-enters by the same key, and the victim of a
  preemption is the running request with the highest (priority, arrival).
- kv_watermark w: a request is admitted only if floor(w x pool) blocks stay free after it
  (running requests may still grow into them), so a burst of admissions cannot leave the
  running ones without room and force preemptions at once.
- queue_limit n: after each step's admissions at most n requests wait; the newest ones
  beyond that which have never run are rejected (finish reason "rejected").
- max_model_len L: a request whose prompt + output tokens exceed L, or that needs more KV
  blocks than the pool has, is rejected on arrival (without it, such a request makes the
  whole simulation a configuration error).
- deadline_ms (per request): a request not finished deadline_ms after its arrival is
  aborted there (finish reason "deadline"), waiting or running; its blocks are freed.
Rejected and aborted requests count as failed in core.analysis.metrics.
"""
from __future__ import annotations

import bisect
import dataclasses
from collections import deque

import numpy as np

from core.errors import ConfigError

REJECTED, DEADLINE = "rejected", "deadline"


class PriorityWaiting:
    """The waiting queue ordered by (priority, arrival, index), with deque's interface."""

    def __init__(self, sched):
        self.sched = sched    # its priority list and arrival array grow with add_request
        self._keys: list[tuple] = []

    def _key(self, i: int) -> tuple:
        return (self.sched.priority[i], float(self.sched.arrival[i]), i)

    def append(self, i: int):
        bisect.insort(self._keys, self._key(i))

    appendleft = append   # a preempted request re-enters by its key

    def popleft(self) -> int:
        return self._keys.pop(0)[2]

    def remove(self, i: int):
        self._keys.remove(self._key(i))

    def __getitem__(self, k: int) -> int:
        return self._keys[k][2]

    def __len__(self) -> int:
        return len(self._keys)

    def __iter__(self):
        return (k[2] for k in self._keys)


def make_waiting(sched):
    return PriorityWaiting(sched) if sched.cfg.scheduling_policy == "priority" else deque()


def abort_entry(r, i: int) -> tuple | None:
    """(time, request index, finish reason) of a request's earliest cancellation: the client's
    abort_at_ms ("abort") or its deadline ("deadline"); None if it has neither."""
    cands = []
    if r is not None and r.abort_at_ms is not None:
        cands.append((float(r.abort_at_ms), i, "abort"))
    if r is not None and r.deadline_ms is not None:
        cands.append((float(r.arrival_ms) + float(r.deadline_ms), i, DEADLINE))
    return min(cands) if cands else None


def watermark_blocks(cfg, num_blocks: int) -> int:
    return int(cfg.kv_watermark * num_blocks)   # rounded down, as vLLM and Vidur do


def too_big(cfg, prompt: int, output: int, num_blocks: int) -> str | None:
    """Why a request is rejected on arrival under max_model_len, or None."""
    if cfg.max_model_len is None:
        return None
    if prompt + output > cfg.max_model_len:
        return f"prompt + output = {prompt + output} tokens, over max_model_len {cfg.max_model_len}"
    need = -(-(prompt + output - 1) // cfg.block_size)
    if need > num_blocks:
        return f"needs {need} KV blocks, the pool has {num_blocks}"
    return None


def victim_position(cfg, run: np.ndarray, priority: list[int], arrival: np.ndarray) -> int:
    """Position in `run` of the request to preempt: the newest (fcfs), or the one with the
    highest (priority, arrival), the later admitted among equals (priority)."""
    if cfg.scheduling_policy != "priority":
        return len(run) - 1
    keys = [(priority[i], float(arrival[i]), k) for k, i in enumerate(run.tolist())]
    return max(keys)[2]


def over_bound(cfg, waiting, ran: set) -> list[int]:
    """Requests to reject after admissions: beyond queue_limit, newest never-run ones first."""
    if cfg.queue_limit is None or len(waiting) <= cfg.queue_limit:
        return []
    excess = len(waiting) - cfg.queue_limit
    out = []
    for i in reversed(list(waiting)):
        if len(out) == excess:
            break
        if i not in ran:
            out.append(i)
    return out


_PER_REQUEST = ("prompt_len", "out_len", "arrival", "abort_at", "computed", "emitted", "nblocks", "state")


def add_request(sched, r, stop_ids=None) -> int:
    """Scheduler.add_request: per-request arrays grow by doubling; the request's deadline
    (not its abort_at_ms: a server cancels by itself) joins the cancellations."""
    bs, cfg, i = sched.cfg.block_size, sched.cfg, sched.n
    need = -(-(r.prompt_tokens + r.max_output_tokens - 1) // bs)
    if need > sched.bm.num_blocks:
        raise ConfigError(f"prompt + output = {r.prompt_tokens + r.max_output_tokens:,} tokens need {need:,} "
                          f"KV blocks of {bs}; the pool has {sched.bm.num_blocks:,}")
    if cfg.chunk is None and cfg.token_budget is not None and r.prompt_tokens > cfg.token_budget:
        raise ConfigError(f"a {r.prompt_tokens:,}-token prompt is over the per-step token budget of "
                          f"{cfg.token_budget:,} (serve with chunked prefill to split it)")
    if i and r.arrival_ms < sched.arrival[i - 1]:
        raise ValueError(f"arrival {r.arrival_ms} ms is before the previous request's")
    cap = getattr(sched, "_capacity", {})
    if not cap or len(cap["state"]) <= i:
        cap = {k: np.resize(getattr(sched, k), max(16, 2 * i)) for k in _PER_REQUEST}
        sched._capacity = cap
    for k, v in zip(_PER_REQUEST, (r.prompt_tokens, r.max_output_tokens, r.arrival_ms, np.inf, 0, 0, 0, 0)):
        # (state 0: not arrived)
        cap[k][i] = v
        setattr(sched, k, cap[k][:i + 1])
    sched.ids.append(r.id)
    sched.salt.append(r.tenant)
    sched.priority.append(r.priority)
    e = abort_entry(dataclasses.replace(r, abort_at_ms=None), i)
    if e is not None:
        bisect.insort(sched.aborts, e)
        sched.abort_at[i], sched.abort_reason[i] = e[0], e[2]
        sched.aborts_pending = True
    sched.token_ids.append(list(r.prompt_ids) if r.prompt_ids is not None else None)
    if stop_ids is not None:
        sched.stop_of[i] = frozenset(stop_ids)
    sched.n += 1
    return i
