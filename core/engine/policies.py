"""Batching policies: which requests run in the next step, and how many tokens each.

All of them share the scheduler's step (core.engine.scheduler: running requests keep their KV
blocks; when the running requests need more blocks than are free, the newest is preempted and
recomputed later; no request is admitted in a step that preempted) and its limits (`max_seqs`
seats, `token_budget` tokens per step, KV blocks, admission control from core.engine.admission).
They differ in who may join and what a step may mix:

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

Each policy is a `Rules` record; the functions here read the scheduler's state (its config,
request table, KV manager, queue and watermark; never written) and return plans, and the
scheduler applies them (core.engine.scheduler).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from core.engine.prefix_cache import extra_key

if TYPE_CHECKING:
    from core.engine.scheduler import Scheduler



@dataclass(frozen=True, slots=True)
class Rules:
    cohorts: bool = False        # waiting requests join only an empty batch (static)
    prefill_steps: bool = False  # a step of new whole prompts whenever any can join, else decodes (vllm-v0)
    decodes_first: bool = False  # over the budget, decodes take their tokens before prompt pieces (sarathi)


RULES = {"serial": Rules(), "static": Rules(cohorts=True), "continuous": Rules(), "vllm-v1": Rules(),
         "vllm-v0": Rules(prefill_steps=True), "orca": Rules(), "sarathi": Rules(decodes_first=True)}
# serial is continuous with one seat (SchedulerConfig.seats); vllm-v1, orca and sarathi differ from
# continuous in their chunking defaults and budget (SchedulerConfig.__post_init__).


def budget_shares(want: list[int], budget: int, is_decode: list[bool], decodes_first: bool) -> list[int]:
    """Tokens each running request computes when together they want more than `budget`:
    in batch order (oldest first) each takes what those before it left; `decodes_first`
    (sarathi): the decodes take theirs before any prompt piece."""
    order = list(range(len(want)))
    if decodes_first:
        order = [k for k in order if is_decode[k]] + [k for k in order if not is_decode[k]]
    out, left = [0] * len(want), budget
    for k in order:
        out[k] = min(want[k], max(left, 0))
        left -= out[k]
    return out


class Join:
    """A waiting request joining this step: `req`, `hits` (cached blocks of its prefix), `cached`
    (tokens they hold), `take` (tokens it computes this step), `todo` (tokens it has to compute
    before its next token is due); `load`: the CPU tier's keys it loads first (it joins after the
    load, core.kvtier). (A plain class: compiled, it is made natively.)"""
    __slots__ = ("req", "hits", "cached", "take", "todo", "load")

    def __init__(self, req: int, hits: list[int], cached: int, take: int, todo: int, load: list | None = None):
        self.req, self.hits, self.cached, self.take, self.todo, self.load = req, hits, cached, take, todo, load


SKIP = Join(-1, [], 0, 0, 0)   # the head waits a step (its CPU-tier lookup must be asked again); others may pass


def next_join(view: Scheduler, budget_left: int) -> Join | None:
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
    tier = view.tier
    if tier is not None and known and pre is None:   # the CPU tier, after the GPU hit (vLLM's connector lookup)
        keys = tier.keys(r, known, total // cfg.block_size, extra_key(kv.model_id, t.salt[r]))
        n = tier.lookup(r, keys, len(hits))
        if n is None:
            return SKIP
        if n:
            cost = kv.admission_cost(hits, cached + n * cfg.block_size)
            if cost > kv.num_free - view.watermark_blocks:
                return None
            return Join(r, hits, cached, 0, todo, keys[len(hits):len(hits) + n])
    return _fits(view, r, hits, cached, todo, budget_left, 0)


def held_join(view: Scheduler, r: int, budget_left: int) -> Join | None:
    """Whether request r, holding KV blocks loaded from the CPU tier, can join now (as next_join;
    its computed tokens were set when its load was planned)."""
    t = view.requests
    cached = int(t.computed[r])
    return _fits(view, r, [], cached, int(t.prompt_len[r] + t.emitted[r]) - cached, budget_left,
                 len(view.kv.tables[r]))


def _fits(view: Scheduler, r: int, hits: list[int], cached: int, todo: int, budget_left: int,
          held: int) -> Join | None:
    """The join of request r if its tokens fit the budget left and its new blocks the free ones above
    the watermark (`held`: blocks it already holds)."""
    cfg, kv = view.cfg, view.kv
    take = min(todo, cfg.chunk or todo, budget_left)
    if cfg.chunk is None and take < todo:
        return None  # the whole prompt must fit in this step's budget
    cost = kv.admission_cost(hits, cached + take) if hits else -(-(cached + take) // cfg.block_size) - held
    if cost > kv.num_free - view.watermark_blocks:
        return None
    return Join(r, hits, cached, take, todo)
