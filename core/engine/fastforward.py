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
    from core.engine.policies import SchedulerView


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

    @property
    def t_end_ms(self) -> float:
        return float(self.ends[self.steps - 1])


def plan(view: SchedulerView, batch: SchedulerOutput, durations, min_steps: int = 3) -> tuple[DecodeRun | None, int]:
    """If `batch` (every running request decoding, nobody joined) starts a run of at least
    `min_steps` identical decode-only steps (nobody can be admitted, nobody finishes before the
    last of them, KV suffices), how many and what they allocate; `durations(k)` gives the k
    step durations. Requests whose last token comes in the run's last step finish at its end
    (Scheduler.fast_forward). Returns (the run or None, steps before another try can succeed:
    a request that finishes sooner than min_steps blocks every run until it is gone; 0 when
    unknown)."""
    cfg, t, run = view.cfg, view.requests, view.running
    K = int((t.out_len[run] - t.emitted[run]).min())   # the first to finish ends the run
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
        for x in np.asarray(durations(min_steps - 1), dtype=np.float64).tolist():
            head += x   # (the same sequential sums as the cumsum below)
        if limit <= head:
            return None, 0
    d = np.asarray(durations(K), dtype=np.float64)
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
    if horizon is not None:   # a fleet: a request may be routed here at `horizon`; stop before it
        K = min(K, int(np.searchsorted(starts, horizon, side="left")))
    # KV: a request needs a new block at step j >= 1 when its position c + j starts a block.
    bs = cfg.block_size
    residue = (-batch.start_pos) % bs
    by_residue = np.bincount(residue, minlength=bs)
    need = by_residue[np.arange(1, K) % bs]
    over = np.flatnonzero(np.cumsum(need) > view.kv.num_free)
    if len(over):
        K = min(K, int(over[0]) + 1)
    if min_steps > K:
        return None, 0
    alloc_steps = (np.flatnonzero(need[:K - 1]) + 1).tolist()
    members, owners, times = {}, [], []
    for k in alloc_steps:
        res = k % bs
        m = members.get(res)
        if m is None:   # the run's members crossing a block at this residue, in run order
            m = members[res] = run[residue == res].tolist()
        owners += m
        times += [float(starts[k])] * len(m)
    return DecodeRun(K, starts, ends, d, need, arrivals_by_step, members, alloc_steps, owners, times), 0


def outputs(run: DecodeRun, step0: int, members: np.ndarray, emitted: np.ndarray, used0: int, waiting0: int,
            num_blocks: int) -> tuple[StepRecord, np.ndarray, np.ndarray, np.ndarray]:
    """What the run reports: its step record (one array per field: K steps), and one token per
    member per step (request rows, output positions, times)."""
    K, n = run.steps, len(members)
    used = np.empty(K, dtype=np.int64)
    used[0] = 0
    np.cumsum(run.need[:K - 1], out=used[1:])
    used += used0
    rec = StepRecord(np.arange(step0, step0 + K), run.starts[:K], run.durations[:K], np.full(K, n),
                     waiting0 + run.arrivals_by_step[:K], used, num_blocks - used)
    return (rec, np.broadcast_to(members, (K, n)).reshape(-1), (emitted[None, :] + np.arange(K)[:, None]).reshape(-1),
            np.repeat(run.ends[:K], n))
