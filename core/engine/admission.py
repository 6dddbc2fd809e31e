"""Admission control: the waiting queue's order, the pool a workload needs, rejections.

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
from collections import deque
from typing import Any

import numpy as np

from core.config import SchedulerConfig
from core.errors import ConfigError

Table = Any   # a core.engine.requests.RequestTable, or tests/oracle's (numpy columns): not checked when compiled

REJECTED, DEADLINE = "rejected", "deadline"


def blocks_for(num_tokens, block_size: int):
    """KV blocks that hold `num_tokens` positions (ceiling division; numbers or arrays)."""
    return -(-num_tokens // block_size)


def blocks_needed(prompt_tokens, output_tokens, block_size: int):
    """KV blocks a request ever holds: the last output token is never fed back."""
    return blocks_for(prompt_tokens + output_tokens - 1, block_size)


class PriorityWaiting:
    """The waiting queue ordered by (priority, arrival, index), with deque's interface."""

    def __init__(self, table: Table):
        self.table = table    # its priority list and arrival array grow with add_request
        self._keys: list[tuple] = []

    def _key(self, i: int) -> tuple:
        return (self.table.priority[i], float(self.table.arrival[i]), i)

    def append(self, i: int):
        bisect.insort(self._keys, self._key(i))

    def appendleft(self, i: int):   # a preempted request re-enters by its key
        self.append(i)

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


def make_waiting(cfg: SchedulerConfig, table: Table):
    return PriorityWaiting(table) if cfg.scheduling_policy == "priority" else deque()


def watermark_blocks(cfg: SchedulerConfig, num_blocks: int) -> int:
    return int((cfg.kv_watermark or 0.0) * num_blocks)   # rounded down, as vLLM and Vidur do


def pool_blocks(cfg: SchedulerConfig, table: Table) -> int:
    """The KV pool: kv_blocks, or (unset) enough for every request at once. Refuses a workload
    with a request that could never run (more blocks than the pool without a context budget
    to reject it; a whole prompt over the token budget without chunked prefill)."""
    prompt = np.asarray(table.prompt_len, dtype=np.int64)
    need = blocks_needed(prompt, np.asarray(table.out_len, dtype=np.int64), cfg.block_size)
    if cfg.kv_blocks is None:
        num_blocks = int(need.sum())
    else:
        num_blocks = cfg.kv_blocks - (cfg.kv_manager == "vllm-v1")   # (vLLM V1 keeps one as its null block)
        if num_blocks < 1:
            raise ConfigError("kv_blocks: the vllm-v1 KV manager keeps one block as its null block; give at least 2")
        worst = int(need.argmax()) if table.n else 0
        if table.n and need[worst] > num_blocks and cfg.max_model_len is None:
            raise ConfigError(
                f"kv_blocks: request {table.ids[worst]!r} needs {int(need[worst])} blocks of {cfg.block_size} "
                f"tokens (prompt + output - 1 = {int(table.prompt_len[worst] + table.out_len[worst] - 1)} tokens) "
                f"but the pool has {num_blocks}")
    if cfg.chunk is None and cfg.token_budget is not None and table.n:
        worst = int(prompt.argmax())
        if table.prompt_len[worst] > cfg.token_budget:
            raise ConfigError(
                f"token_budget: request {table.ids[worst]!r} has a {int(table.prompt_len[worst])}-token prompt, more "
                f"than the per-step budget of {cfg.token_budget}; enable chunked prefill (chunk) or raise the budget")
    return num_blocks


def refusal(cfg: SchedulerConfig, prompt: int, output: int, num_blocks: int) -> str | None:
    """Why a request added while the engine runs could never run (so add_request refuses it
    at once), or None."""
    need = blocks_needed(prompt, output, cfg.block_size)
    if need > num_blocks and cfg.max_model_len is None:
        return (f"prompt + output = {prompt + output:,} tokens need {need:,} KV blocks of {cfg.block_size}; "
                f"the pool has {num_blocks:,}")
    if cfg.chunk is None and cfg.token_budget is not None and prompt > cfg.token_budget:
        return (f"a {prompt:,}-token prompt is over the per-step token budget of {cfg.token_budget:,} "
                f"(serve with chunked prefill to split it)")
    return None


def too_big(cfg: SchedulerConfig, prompt: int, output: int, num_blocks: int) -> str | None:
    """Why a request is rejected on arrival under max_model_len, or None."""
    if cfg.max_model_len is None:
        return None
    if prompt + output > cfg.max_model_len:
        return f"prompt + output = {prompt + output} tokens, over max_model_len {cfg.max_model_len}"
    need = blocks_needed(prompt, output, cfg.block_size)
    if need > num_blocks:
        return f"needs {need} KV blocks, the pool has {num_blocks}"
    return None


def victim_position(cfg: SchedulerConfig, run: np.ndarray, table: Table) -> int:
    """Position in `run` of the request to preempt: the newest (fcfs), or the one with the
    highest (priority, arrival), the later admitted among equals (priority)."""
    if cfg.scheduling_policy != "priority":
        return len(run) - 1
    keys = [(table.priority[i], float(table.arrival[i]), k) for k, i in enumerate(run.tolist())]
    return max(keys)[2]


def over_bound(cfg: SchedulerConfig, waiting, ran: set) -> list[int]:
    """Requests to reject after admissions: beyond queue_limit, newest never-run ones first."""
    if cfg.queue_limit is None or len(waiting) <= cfg.queue_limit:
        return []
    excess = len(waiting) - cfg.queue_limit
    out: list[int] = []
    queue: list[int] = list(waiting)
    for i in reversed(queue):
        if len(out) == excess:
            break
        if i not in ran:
            out.append(i)
    return out
