"""The simulator's fast-forward: a run of identical decode-only steps applied at once.

Once every running request decodes and nothing can join or leave the running set for k
steps (no admission possible, nobody finishes, KV blocks suffice), those k steps differ
only in positions and times, so they are applied as arrays, with exactly the events
stepping them one by one records (tests compare the two). `plan` decides how many steps
and which of them take new blocks (reading the scheduler); Scheduler.fast_forward applies
it; `outputs` gives what it reports (its EngineOutputs' record and tokens).
"""
from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

import numpy as np

from core.engine.outputs import StepRecord

if TYPE_CHECKING:
    from core.engine.outputs import SchedulerOutput
    from tests.oracle.policies_v0 import SchedulerView


class DecodeRun(NamedTuple):
    steps: int                    # K identical steps
    starts: np.ndarray            # [K] step starts
    ends: np.ndarray              # [K] step ends
    durations: np.ndarray         # [K]
    need: np.ndarray              # [K - 1] new blocks taken at steps 1..K-1
    arrivals_by_step: np.ndarray  # [K] requests arrived (queued) by each step's start
    members: dict                 # residue of an allocating step mod block size -> requests crossing a block then
    alloc_steps: list[int]        # steps that take new blocks
    owners: list[int]             # one entry per new block, in order
    times: list[float]            # ... its step's start
    remaining: np.ndarray | None = None   # through finishes: each member's steps left (it decodes in steps
    #                                       0..remaining-1 and leaves at the end of the last); None: all K
    counts: np.ndarray | None = None      # through finishes: [K] members decoding in each step
    owner_steps: list[int] | None = None  # through finishes: the step of each entry of `owners`

    @property
    def t_end_ms(self) -> float:
        return float(self.ends[self.steps - 1])


def plan(view: SchedulerView, batch: SchedulerOutput, durations, min_steps: int = 3) -> tuple[DecodeRun | None, int]:
    """If `batch` (every running request decoding, nobody joined) starts a run of at least
    `min_steps` decode-only steps (nobody can be admitted, KV suffices), how many and what they
    allocate; `durations(k)` gives the k step durations of this batch, `durations(k, counts)`
    those of steps with counts[j] of its requests decoding (None: the step model cannot say).
    Without a waiting queue and with such durations the run goes on through finishes: a request
    leaves at the end of the step of its last token, as `update` frees it, and the batch shrinks
    (the run stops where a freed seat could take an arrival); otherwise it ends with the step
    where its first request finishes. Returns (the run or None, steps before another try can
    succeed: a request that finishes sooner than min_steps blocks every run until it is gone; 0
    when unknown)."""
    cfg, t, run = view.cfg, view.requests, view.running
    rem = t.out_len[run] - t.emitted[run]
    K = int(rem.min())   # without going through finishes, the first to finish ends the run
    counts = d_all = None
    if not view.waiting and len(run) > 1:
        top = int(rem.max())
        if top > K:
            counts = len(run) - np.searchsorted(np.sort(rem), np.arange(top), side="right")
            d_all = durations(top, counts)
            if d_all is None:
                counts = None
            else:
                K = top
    if min_steps > K:
        return None, K
    t0 = batch.t_ms
    nxt = view.next_arrival
    may_join = nxt < t.n and cfg.policy != "static" and len(run) < cfg.seats and not view.waiting
    horizon = view.horizon_ms
    if may_join or horizon is not None:
        # the usual refusal: an arrival that could join (or, in a fleet, a request that could be
        # routed here) within min_steps steps; decided on the first min_steps - 1 durations
        # before all K are priced (a fleet's replicas are refused at most tries)
        limit = min(t.arrival[nxt] if may_join else np.inf, np.inf if horizon is None else horizon)
        if limit <= t0:
            return None, 0
        head = t0
        first = durations(min_steps - 1) if counts is None else d_all[:min_steps - 1]
        if first is None:   # the executor prices these steps one by one
            return None, 0
        for x in np.asarray(first, dtype=np.float64).tolist():
            head += x   # (the same sequential sums as the cumsum below)
        if limit <= head:
            return None, 0
    d = durations(K) if counts is None else d_all
    if d is None:
        return None, 0
    d = np.asarray(d, dtype=np.float64)
    at = np.cumsum(np.concatenate(([t0], d)))   # at[j]: step j's start; sequential sums: bit-identical to t += d
    ends = at[1:]
    starts = at[:-1]
    arrivals_by_step = np.zeros(K, dtype=np.int64)
    if nxt < t.n:
        # Arrivals join the queue at each step start; they can only be admitted if the
        # queue was empty and a seat is free (any policy but static), so the run must stop there.
        pending = t.arrival[nxt:]
        arrivals_by_step = np.searchsorted(pending, starts, side="right")
        if may_join:
            K = min(K, int(np.searchsorted(starts, pending[0], side="left")))
        elif counts is not None and cfg.policy != "static":
            # seats full now: the first arrival joins at the first step start after it where a
            # finish has freed a seat
            seat = int(np.argmax(counts < cfg.seats)) if (counts < cfg.seats).any() else K
            K = min(K, max(seat, int(np.searchsorted(starts, pending[0], side="left"))))
    if horizon is not None:   # a fleet: a request may be routed here at `horizon`; stop before it
        K = min(K, int(np.searchsorted(starts, horizon, side="left")))
    # KV: a request needs a new block at step j >= 1 when its position c + j starts a block
    # (while it still decodes: through finishes, only in its steps 0..remaining-1).
    residue = (-batch.start_pos) % cfg.block_size
    need = _blocks_needed(residue, rem if counts is not None else None, K, cfg.block_size)
    # (frees within the run only add blocks: checking against the blocks free now is safe)
    over = np.flatnonzero(np.cumsum(need) > view.kv.num_free)
    if len(over):
        K = min(K, int(over[0]) + 1)
    if min_steps > K:
        return None, 0
    alloc_steps = (np.flatnonzero(need[:K - 1]) + 1).tolist()
    through = counts is not None and int(rem.min()) < K   # somebody leaves before the run's last step
    members, owners, times, owner_steps = _allocations(run, residue, rem if through else None, alloc_steps,
                                                       starts, cfg.block_size)
    return DecodeRun(K, starts, ends, d, need, arrivals_by_step, members, alloc_steps, owners, times,
                     rem if through else None, counts[:K] if through else None, owner_steps), 0


def _blocks_needed(residue: np.ndarray, rem: np.ndarray | None, K: int, bs: int) -> np.ndarray:
    """[K - 1]: the new blocks taken at steps 1..K-1 (members whose position then starts a block;
    `rem`: each member's steps left, it takes none after them; None: all stay)."""
    need = np.bincount(residue, minlength=bs)[np.arange(1, K) % bs]
    if rem is not None and K > 1:
        gone = rem < K    # members that leave within the run stop taking blocks after their last step
        if gone.any():
            j = np.arange(1, K)
            for r in np.unique(residue[gone]).tolist():
                left = np.sort(rem[gone & (residue == r)])
                hit = (j % bs) == r
                need[hit] -= np.searchsorted(left, j[hit], side="right")
    return need


def _allocations(run: np.ndarray, residue: np.ndarray, rem: np.ndarray | None, alloc_steps: list[int],
                 starts: np.ndarray, bs: int) -> tuple[dict, list, list, list | None]:
    """(members crossing a block per residue, in run order; one owner per new block in order; its
    step's start; through finishes (`rem` given): its step, only members still decoding then)."""
    members, owners, times = {}, [], []
    if rem is None:
        for k in alloc_steps:
            res = k % bs
            m = members.get(res)
            if m is None:   # the run's members crossing a block at this residue, in run order
                m = members[res] = run[residue == res].tolist()
            owners += m
            times += [float(starts[k])] * len(m)
        return members, owners, times, None
    owner_steps = []
    for k in alloc_steps:
        res = k % bs
        m = members.get(res)
        if m is None:   # (request, its steps left), in run order
            sel = residue == res
            m = members[res] = list(zip(run[sel].tolist(), rem[sel].tolist()))
        mine = [i for i, left in m if left > k]
        owners += mine
        times += [float(starts[k])] * len(mine)
        owner_steps += [k] * len(mine)
    return {res: [i for i, _ in m] for res, m in members.items()}, owners, times, owner_steps


def outputs(run: DecodeRun, step0: int, members: np.ndarray, emitted: np.ndarray, used0: int, waiting0: int,
            num_blocks: int, freed: np.ndarray | None = None) -> tuple[StepRecord, np.ndarray, np.ndarray, np.ndarray]:
    """What the run reports: its step record (one array per field: K steps), and one token per
    member per step in which it decodes (request rows, output positions, times), step by step
    in run order. `freed`: through finishes, the blocks released at the end of each step."""
    K, n = run.steps, len(members)
    used = np.empty(K, dtype=np.int64)
    used[0] = 0
    np.cumsum(run.need[:K - 1], out=used[1:])
    used += used0
    if run.remaining is None:
        rec = StepRecord(np.arange(step0, step0 + K), run.starts[:K], run.durations[:K], np.full(K, n),
                         waiting0 + run.arrivals_by_step[:K], used, num_blocks - used)
        return (rec, np.broadcast_to(members, (K, n)).reshape(-1),
                (emitted[None, :] + np.arange(K)[:, None]).reshape(-1), np.repeat(run.ends[:K], n))
    if freed is not None:
        used[1:] -= np.cumsum(freed[:K - 1])
    active = run.remaining[None, :] > np.arange(K)[:, None]          # [K, n]: who decodes in each step
    rec = StepRecord(np.arange(step0, step0 + K), run.starts[:K], run.durations[:K], run.counts.astype(np.int64),
                     waiting0 + run.arrivals_by_step[:K], used, num_blocks - used)
    return (rec, np.broadcast_to(members, (K, n))[active], (emitted[None, :] + np.arange(K)[:, None])[active],
            np.repeat(run.ends[:K], run.counts))
