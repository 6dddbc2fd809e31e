"""Test oracle (issue 50): the policies' planner as it was before the calendars (tests/oracle).
Not shipped code."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, NamedTuple, Protocol

import numpy as np

from core.config import SchedulerConfig
from core.engine.admission import blocks_for
from tests.oracle.requests_v0 import RequestTable

if TYPE_CHECKING:
    from core.engine.kv_cache import KVCacheManager


@dataclass(frozen=True, slots=True)
class Rules:
    cohorts: bool = False        # waiting requests join only an empty batch (static)
    prefill_steps: bool = False  # a step of new whole prompts whenever any can join, else decodes (vllm-v0)
    decodes_first: bool = False  # over the budget, decodes take their tokens before prompt pieces (sarathi)


RULES = {"serial": Rules(), "static": Rules(cohorts=True), "continuous": Rules(), "vllm-v1": Rules(),
         "vllm-v0": Rules(prefill_steps=True), "orca": Rules(), "sarathi": Rules(decodes_first=True)}
# serial is continuous with one seat (SchedulerConfig.seats); vllm-v1, orca and sarathi differ from
# continuous in their chunking defaults and budget (SchedulerConfig.__post_init__).


class SchedulerView(Protocol):
    """What the policies read of the scheduler (and never write)."""
    cfg: SchedulerConfig
    requests: RequestTable
    horizon_ms: float | None
    kv: KVCacheManager
    running: np.ndarray
    waiting: object
    watermark_blocks: int


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


class RunningPlan(NamedTuple):
    """The running requests' share of the next step."""
    num_tokens: np.ndarray | None  # per running request (0: idle this step; None: one each, all decode)
    need: np.ndarray | None      # new KV blocks each needs for it (None: one each at `grow`)
    start: np.ndarray            # its first position (tokens cached)
    is_prefill: np.ndarray | None  # it (re)computes its prompt (None: every one decodes)
    emits: np.ndarray | None     # its computed tokens reach everything known: a token is due (None: all)
    steady: bool                 # planned by the steady-state shortcut (every entry takes part; blocks suffice)
    grow: np.ndarray | None = None  # decodes only: positions in `run` that start a new block


def plan_running(view: SchedulerView, run: np.ndarray, budget: int, prefilling: np.ndarray | None = None,
                 steady: bool = False) -> RunningPlan:
    """Tokens and new KV blocks of each running request this step. `steady` (the last step ran
    every one of them and each either emitted, so now decodes, or is mid-prefill: `prefilling`,
    a mask over `run`, None for nobody): the same plan without the per-request work, when it
    fits the budget and the free blocks; otherwise (or not steady) the full plan, which may
    need more blocks than are free (then the scheduler preempts and plans again)."""
    cfg, t = view.cfg, view.requests
    if steady:
        if prefilling is None:   # decodes only: a block each where a position starts one
            start, bs = t.computed[run], cfg.block_size
            grow = np.flatnonzero((start & (bs - 1) if bs & (bs - 1) == 0 else start % bs) == 0)
            if len(run) <= budget and len(grow) <= view.kv.num_free:
                return RunningPlan(None, None, start, None, None, True, grow)
        else:
            plan = _steady_prefill_plan(view, run, budget, prefilling)
            if plan is not None:
                return plan
    computed, emitted = t.computed[run], t.emitted[run]
    pending = t.prompt_len[run] + emitted - computed
    want = np.minimum(pending, cfg.chunk) if cfg.chunk else pending
    # A decode computes the one token emitted last; anything else is (re)prefill.
    is_decode = (pending == 1) & (emitted > 0)   # (with spec: decode + draft tokens)
    if cfg.spec_gamma:
        # A speculative decode verifies the last token plus up to gamma draft tokens, never
        # proposing past the request's output length.
        room = t.out_len[run] - emitted - 1
        want = want + np.where(is_decode, np.minimum(cfg.spec_gamma, room), 0)
    n = want if int(want.sum()) <= budget else budget_shares(want, budget, is_decode,
                                                              RULES[cfg.policy].decodes_first)
    need = blocks_for(computed + n, cfg.block_size) - t.nblocks[run]
    return RunningPlan(n, need, computed, ~is_decode, n >= pending, False)


def _steady_prefill_plan(view: SchedulerView, run: np.ndarray, budget: int, prefilling) -> RunningPlan | None:
    """The steady plan when some running requests are mid-prefill (a mask over `run`)."""
    t, bs = view.requests, view.cfg.block_size
    start = t.computed[run]
    free = view.kv.num_free
    pos = np.flatnonzero(prefilling)
    emitted = t.emitted[run[pos]]
    pending = t.prompt_len[run[pos]] + emitted - start[pos]
    want = np.minimum(pending, view.cfg.chunk) if view.cfg.chunk else pending
    if len(run) - len(pos) + int(want.sum()) > budget:
        return None
    n = np.ones(len(run), dtype=np.int64)
    n[pos] = want
    need = blocks_for(start + n, bs) - t.nblocks[run]
    if int(need.sum()) > free:
        return None
    # (a recomputed request whose last missing position is its last token counts as a decode)
    is_prefill = np.zeros(len(run), dtype=bool)
    is_prefill[pos] = ~((pending == 1) & (emitted > 0))
    emits = np.ones(len(run), dtype=bool)
    emits[pos] = want >= pending
    return RunningPlan(n, need, start, is_prefill, emits, True)


class Join(NamedTuple):
    """A waiting request joining this step."""
    req: int
    hits: list[int]              # cached blocks of its prefix
    cached: int                  # tokens they hold
    take: int                    # tokens it computes this step
    todo: int                    # tokens it has to compute before its next token is due


def next_join(view: SchedulerView, budget_left: int) -> Join | None:
    """Whether the head of the waiting queue can join now (a seat is the caller's to check):
    the budget left, chunking (a whole prompt must fit without it) and free KV blocks above
    the watermark. None: it cannot, and nobody behind it may pass it."""
    cfg, t, kv = view.cfg, view.requests, view.kv
    r = view.waiting[0]
    total = int(t.prompt_len[r] + t.emitted[r])  # tokens to (re)compute
    known = t.token_ids[r]
    if known and len(known) < total and cfg.kv_manager == "vllm-v1":   # recomputed: its outputs' stand-ins
        known = known + [-(r + 1)] * (total - len(known))             # (core.engine.kv_cache.commit)
    hits = kv.match_prefix(known, t.salt[r], max_tokens=total - 1) if known else []
    cached = len(hits) * cfg.block_size
    pre = t.preloaded.get(r) if t.preloaded else None
    if pre is not None and pre > cached and not t.emitted[r]:   # KV that came with it (disaggregated decode)
        cached = pre
    todo = total - cached
    take = min(todo, cfg.chunk or todo, budget_left)
    if cfg.chunk is None and take < todo:
        return None  # the whole prompt must fit in this step's budget
    cost = kv.admission_cost(hits, cached + take) if hits else -(-(cached + take) // cfg.block_size)
    if cost > kv.num_free - view.watermark_blocks:
        return None
    return Join(r, hits, cached, take, todo)
