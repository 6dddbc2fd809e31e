"""The scheduler's side of the CPU tier (vLLM's OffloadingConnectorScheduler, with the scheduler's
handling of requests waiting for their KV: WAITING_FOR_REMOTE_KVS): what core.engine's scheduler
(`s`, its state and transitions) does with the tier (core.kvtier.tier.CPUTier) at four points of a
step, reading and writing the scheduler's state as its own methods did before they moved here (its
running set `_run` and its `_free` included). Called only when the scheduler has a tier; nothing here
runs without one. The rest of the tier's part in a step stays in the scheduler: the holding queue
served first at admission, the CPU lookup (core.engine.policies.next_join), the copies an executor
made (`update`).

- `start_load`: a waiting request's CPU-tier hit (policies.next_join) takes its GPU blocks and
  starts the load; it then holds them, out of the waiting queue, until the load is done.
- `loads_done`: at each scheduling, the loads done by now put their blocks into the prefix cache;
  their requests may join.
- `offer`: after each scheduling, the full prompt blocks the step's tokens complete are offered
  to the tier (stores), and finished requests' recency is settled (vLLM's build_connector_meta).
- `release_held`: nothing runs or loads and the holders cannot join: the newest lets go.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from core.engine.outputs import SchedulerOutput
    from core.engine.policies import Join
    from core.engine.scheduler import Scheduler


def start_load(s: Scheduler, j: Join) -> None:
    """A CPU-tier hit (`j`, a policies.Join with `load`): the request's GPU blocks are taken now (its
    GPU hits and one per block to load) and the load starts; it holds them while it waits."""
    t, kv, r, bs = s.requests, s.kv, j.req, s.cfg.block_size
    load = j.load or []
    kv.admit(r, j.hits, t.salt[r])
    kv.grow(r, j.cached + len(load) * bs)
    table = kv.tables[r]
    t.nblocks[r] = len(table)
    t.computed[r] = j.cached + len(load) * bs
    first = r not in s.ran
    s.tier.admitted(r, len(j.hits), len(load), first, int(t.prompt_len[r] + t.emitted[r]))
    s.tier.load(r, load, table[len(j.hits):], len(j.hits), kv.now_ms, first)


def loads_done(s: Scheduler, now_ms: float) -> None:
    """The CPU-tier loads done by now: their blocks enter the prefix cache and their requests may
    join (all prompt + emitted tokens loaded: the last one is computed again, for its logits)."""
    t, kv = s.requests, s.kv
    for r in s.tier.due(now_ms):
        total, c = int(t.prompt_len[r] + t.emitted[r]), int(t.computed[r])
        ids = t.token_ids[r]
        if ids is not None:
            kv.commit(r, ids, c, total, -(r + 1))
        if c >= total:
            t.computed[r] = total - 1


def offer(s: Scheduler, batch: SchedulerOutput) -> None:
    """The CPU tier is offered the full prompt blocks this step's tokens complete (each listed
    entry's, then those of running requests whose last offer found no room, in running order), then
    settles the finished requests' recency; an executor that copies gets the step's copies."""
    t, kv, bs, tier, run = s.requests, s.kv, s.cfg.block_size, s.tier, s._run
    reqs = batch.reqs if type(batch.reqs) is list else batch.reqs.tolist()
    rows = [(i, int(a) + int(n)) for i, a, n in zip(reqs, batch.start_pos, batch.num_tokens)]
    if tier.owed:
        listed = set(reqs)
        owed = [i for i in tier.owed if i in run and i not in listed]
        rows += [(i, int(t.prompt_len[i])) for i in sorted(owed, key=run.__getitem__)]
    for i, end in rows:
        chain = kv.chain.get(i)
        if chain:
            upto = min(min(end, int(t.prompt_len[i])) // bs, len(chain))
            tier.offer(i, chain, kv.tables[i], upto, kv.now_ms)
    jobs = tier.settle(True)
    if s.request_data:
        batch.kv_copies = jobs


def release_held(s: Scheduler, now_ms: float) -> None:
    """Nothing runs or loads, and the requests holding KV blocks after their CPU-tier loads cannot join
    (their blocks and the rest leave too few): the newest gives its blocks back and waits again, to look
    its prefix up anew. (vLLM avoids this by reserving room for in-flight loads: docs/kv-tiers.md.)"""
    i = s.holding.pop()
    s.kv.now_ms = now_ms
    s._free(i)
    s.requests.computed[i] = 0
    s.tier.loaded.pop(i, None)
    s.waiting.appendleft(i)
