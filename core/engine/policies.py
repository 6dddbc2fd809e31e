"""Batching policies: which requests run in the next step, and how many tokens each.

All of them share core.engine.scheduler's step (running requests keep their KV blocks; when the
running requests need more blocks than are free, the newest is preempted and recomputed
later; no request is admitted in a step that preempted) and its limits (`max_seqs` seats,
`token_budget` tokens per step, KV blocks, admission control from core.engine.admission). They
differ in who may join and what a step may mix:

- serial: one request at a time, start to finish.
- static: fixed cohorts: waiting requests join only when the running set is empty, and a
  cohort holds its seats until its last member finishes.
- continuous: iteration-level batching (Orca's idea, vLLM's scheduler): every step, the
  running requests first, oldest first (a decode, or the next piece of a prompt), then
  waiting requests join first come, first served while seats, budget and blocks allow.
  `chunk` set: a prompt is computed in pieces of at most `chunk` tokens (chunked prefill);
  unset: a prompt is computed in one step and must fit the step's remaining budget.
- vllm-v1: vLLM's V1 scheduler: continuous with chunked prefill always on, a piece being
  whatever the step's token budget has left (`chunk` defaults to the budget).
- vllm-v0: vLLM's V0 scheduler (and Vidur's "vllm"): a step is either prefills or decodes.
  Whenever a waiting request can join (its whole prompt fits the budget left, a seat, and
  blocks with the free-block watermark, 1% of the pool unless `kv_watermark` says other),
  the step admits waiting requests first come, first served and computes only their whole
  prompts; only a step that admits nobody runs the decodes of every running request.
- orca: Orca's iteration-level scheduling: continuous with whole prompts (no chunking), so a
  long prompt shares its step with the running decodes.
- sarathi: Sarathi-Serve's stall-free batching: the step's token budget is the chunk size
  (`chunk`, default 512); every decode is scheduled first, then running prompts continue,
  oldest first, then new prompts join, each piece taking what the budget has left, so a
  long prompt never stalls a decode.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from core.engine.outputs import RUNNING, Batch

if TYPE_CHECKING:
    from core.engine.scheduler import Scheduler


def budget_shares(want: np.ndarray, budget: int, is_decode: np.ndarray, decodes_first: bool) -> np.ndarray:
    """Tokens each running request computes when together they want more than `budget`:
    in batch order (oldest first) each takes what those before it left; `decodes_first`
    (sarathi): the decodes take theirs before any prompt piece."""
    if not decodes_first:
        before = np.cumsum(want) - want
        return np.minimum(np.maximum(budget - before, 0), want)
    order = np.argsort(~is_decode, kind="stable")
    w = want[order]
    n = np.empty_like(want)
    n[order] = np.minimum(np.maximum(budget - (np.cumsum(w) - w), 0), w)
    return n


def admit_waiting(sched: Scheduler, budget: int, used: int, running: int):
    """Admit waiting requests, head of the queue first, while a seat, the budget left and KV
    blocks (with the watermark) allow, `running` seats being taken; never skips past a head
    that does not fit. Returns
    (requests, tokens each computes, tokens each has to compute, cached tokens each starts
    from, budget used)."""
    cfg, bm, bs = sched.cfg, sched.bm, sched.cfg.block_size
    new_reqs, new_n, new_pending, new_start = [], [], [], []
    seats = cfg.seats - running
    while sched.waiting and seats > 0 and budget - used > 0:
        r = sched.waiting[0]
        total = int(sched.prompt_len[r] + sched.emitted[r])  # tokens to (re)compute
        known = sched.token_ids[r]
        hits = bm.match_prefix(known, sched.salt[r], max_tokens=total - 1) if known else []
        cached = len(hits) * bs
        todo = total - cached
        take = min(todo, cfg.chunk or todo, budget - used)
        if cfg.chunk is None and take < todo:
            break  # the whole prompt must fit in this step's budget
        cost = bm.admission_cost(hits, cached + take) if hits else -(-(cached + take) // bs)
        if cost > bm.num_free - sched._wm:
            break
        sched.waiting.popleft()
        bm.admit(r, hits, sched.salt[r])
        bm.grow(r, cached + take)
        sched.computed[r] = cached
        sched.nblocks[r] = len(bm.tables[r])
        sched.state[r] = RUNNING
        sched._ran.add(r)
        new_reqs.append(r)
        new_n.append(take)
        new_pending.append(todo)
        new_start.append(cached)
        used += take
        seats -= 1
    return new_reqs, new_n, new_pending, new_start, used


def prefill_only_batch(sched: Scheduler, now_ms: float, budget: int):
    """vllm-v0: admit what can join and return a batch of just their prompts, or None when
    nobody can join (then the step decodes the running requests)."""
    new_reqs, new_n, new_pending, new_start, _ = admit_waiting(sched, budget, 0, len(sched.run))
    sched.reject_over_bound(now_ms)
    if not new_reqs:
        return None
    reqs = np.array(new_reqs, dtype=np.int64)
    n = np.array(new_n, dtype=np.int64)
    sched.run = np.concatenate([sched.run, reqs])
    return Batch(sched.step, now_ms, reqs, n, np.array(new_start, dtype=np.int64), np.ones(len(reqs), dtype=bool),
                 n >= np.array(new_pending, dtype=np.int64))
