"""The simulator's fast-forward: a run of identical decode-only steps applied at once.

Once every running request decodes and nothing can join or leave the running set for k
steps (no admission possible, nobody finishes, KV blocks suffice), those k steps differ
only in positions and times, so they are applied as arrays, with exactly the events
stepping them one by one records (tests compare the two).
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from core.engine.steplog import BatchPart, StepRun, TokenPart

if TYPE_CHECKING:
    from core.engine.scheduler import Batch, Scheduler


def fast_forward(sched: Scheduler, batch: Batch, durations, min_steps: int = 3) -> float | None:
    """Simulator shortcut. If `batch` starts a run of identical decode-only steps (every
    running request decodes, nobody can be admitted, nobody finishes, KV suffices),
    apply as many of them as possible at once, with exactly the events step-by-step
    scheduling would record. `durations(k)` gives the k step durations. Returns the time
    the last applied step ends, or None (then use complete() as usual)."""
    cfg, bm, run = sched.cfg, sched.bm, sched.run
    if (sched.aborts_pending or not sched._quiet or len(batch.reqs) != len(run) or cfg.queue_limit is not None
            or batch.prefill_tokens or cfg.spec_gamma):
        return None
    K = int((sched.out_len[run] - sched.emitted[run]).min()) - 1  # the finishing step runs normally
    if min_steps > K:
        return None
    t0 = batch.t_ms
    d = np.asarray(durations(K), dtype=np.float64)
    ends = np.cumsum(np.r_[t0, d])[1:]          # sequential sums: bit-identical to t += d
    starts = np.r_[t0, ends[:-1]]
    nxt = sched.next_arrival
    arrivals_by_step = np.zeros(K, dtype=np.int64)
    if nxt < sched.n:
        # Arrivals join the queue at each step start; they can only be admitted if the
        # queue was empty and a seat is free (any policy but static), so the run must stop there.
        pending = sched.arrival[nxt:]
        arrivals_by_step = np.searchsorted(pending, starts, side="right")
        if cfg.policy != "static" and len(run) < cfg.seats and not sched.waiting:
            K = min(K, int(np.searchsorted(starts, pending[0], side="left")))
    # KV: a request needs a new block at step j >= 1 when its position c + j starts a block.
    bs = cfg.block_size
    c = batch.start_pos
    residue = (-c) % bs
    by_residue = np.bincount(residue, minlength=bs)
    j = np.arange(1, K)
    need = by_residue[j % bs]
    over = np.flatnonzero(np.cumsum(need) > bm.num_free)
    if len(over):
        K = min(K, int(over[0]) + 1)
    if min_steps > K:
        return None
    n = len(run)
    log = sched.log
    members = {res: run[residue == res].tolist() for res in np.flatnonzero(by_residue)}
    step0, waiting0 = sched.step, len(sched.waiting)
    alloc_steps = (np.flatnonzero(need[:K - 1]) + 1).tolist()  # steps that take new blocks
    owners, times = [], []
    for k in alloc_steps:
        m = members[k % bs]
        owners += m
        times += [float(starts[k])] * len(m)
    if owners and not bm.append_blocks(owners, times):
        for k in alloc_steps:  # some block must be evicted: replay step by step, exactly
            bm.now_ms = float(starts[k])
            bm.grow_many(members[k % bs], [1] * len(members[k % bs]))
    used = sched._pending_step[2] + np.r_[0, np.cumsum(need[:K - 1])]
    if log is not None:
        steps = np.arange(step0, step0 + K)
        log.steps.append(StepRun(steps, starts[:K], d[:K], np.full(K, n), waiting0 + arrivals_by_step[:K],
                                 used, bm.num_blocks - used))
        log.batch_parts.append(BatchPart(steps, run, batch.num_tokens, batch.is_prefill))
        em = sched.emitted[run]
        log.token_parts.append(TokenPart(np.tile(run, K), (em[None, :] + np.arange(K)[:, None]).ravel(),
                                np.repeat(ends[:K], n), None))
        log.token_sources.append(None)
    sched.computed[run] += K
    sched.emitted[run] += K
    sched.nblocks[run] = -(-sched.computed[run] // bs)
    sched.step += K
    sched._pending_step = None
    return float(ends[K - 1])



def plan_steady(sched: Scheduler, run: np.ndarray, budget: int):
    """The running requests' share of the next step when the last step ran all of them and
    every one either emitted (so now decodes one token) or is mid-prefill (`sched._prefilling`,
    a mask over `run`, None: nobody): the same tokens and KV blocks as the scheduler's full
    plan, without its per-request work. Returns (tokens, start positions, None or
    (prefill positions, is-prefill, emits) for the mid-prefill ones), or None where the full
    plan is needed (over the token budget, or someone must be preempted)."""
    cfg, bm, bs = sched.cfg, sched.bm, sched.cfg.block_size
    start = sched.computed[run]
    mask = sched._prefilling
    if mask is None:   # decodes only: a block each where a position starts one
        if len(run) > budget:
            return None
        grow = np.flatnonzero((start & (bs - 1) if bs & (bs - 1) == 0 else start % bs) == 0)
        if len(grow) > bm.num_free:
            return None
        if len(grow):
            who = run[grow]
            bm.grow_one_each(who, sched.nblocks[who])
            sched.nblocks[who] += 1
        return sched._const("ones", len(run)), start, None
    pos = np.flatnonzero(mask)
    pr = run[pos]
    emitted = sched.emitted[pr]
    pending = sched.prompt_len[pr] + emitted - start[pos]
    want = np.minimum(pending, cfg.chunk) if cfg.chunk else pending
    if len(run) - len(pos) + int(want.sum()) > budget:
        return None
    n = np.ones(len(run), dtype=np.int64)
    n[pos] = want
    need = (start + n + (bs - 1)) // bs - sched.nblocks[run]
    if int(need.sum()) > bm.num_free:
        return None
    grow = np.flatnonzero(need > 0)
    if len(grow):
        who, more = run[grow], need[grow]
        if int(more.sum()) == len(grow):
            bm.grow_one_each(who, sched.nblocks[who])
        else:
            bm.grow_many(who.tolist(), more.tolist())
        sched.nblocks[who] += more
    # (a recomputed request whose last missing position is its last token counts as a decode)
    return n, start, (pos, ~((pending == 1) & (emitted > 0)), want >= pending)
