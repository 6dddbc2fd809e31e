"""A fleet whose replicas run apart (core.fleet.sim.FleetSim.apart: routes decided ahead, nothing
shared): each replica one engine over the requests routed to it, stepped to its end on its own
clock; then the route events, with what the router had heard of each candidate by each arrival,
read back from what each replica told as it ran (Reported). The same trace as the fleet's own
loop (tests/test_fleet_apart.py)."""
from __future__ import annotations

import math

import numpy as np

from core.engine import loop
from core.fleet.front import rejected_event, route_event
from core.fleet.router import recorded, signals_dict
from core.fleet.spec import reaching


class Reported:
    """What a replica run apart (FleetSim.apart) told the router, kept as it ran and read back at
    each routing as the router would have heard it by then: when each routed request reached it
    (in routing order), when requests finished, and its gauges (running, waiting, KV used) at each
    step's end (a run of steps: each step's, as `_outputs` tells them)."""

    def __init__(self):
        self.adds: list[float] = []
        self.fins: list[float] = []
        self.own: list[float] = []   # finishes stamped at the time of the step call that told them
        self.times: list[float] = []
        self.running: list[int] = []
        self.waiting: list[int] = []
        self.used: list[int] = []

    def observe(self, out) -> None:
        if out.finished:
            self.fins += [f.t_ms for f in out.finished]
            called = out.t_ms if out.step is None else out.step.t_ms
            self.own += [f.t_ms for f in out.finished if f.t_ms == called]
        if out.step is not None:
            rec = out.record
            if type(rec.step) is range and len(rec.step) > 1:
                self.times += rec.t_ms[1:]   # (each step's end but the last's, and what it left behind)
                a = out.after
                self.running += a[0]
                self.waiting += a[1]
                self.used += a[2]
            g = out.gauges
            self.times.append(out.t_ms)
            self.running.append(g[0])
            self.waiting.append(g[1])
            self.used.append(g[2])

    def as_of(self, asked: list[int], routed: list[int], arrivals: np.ndarray, staleness_ms: float) -> tuple:
        """What the router had heard of this replica when requests `asked` (rows, in order)
        arrived (`routed`: the rows routed here, in order), as of their arrival less the staleness,
        as five lists (requests, running, waiting, KV used blocks, as_of_ms): the requests routed
        here before it that had reached it minus those finished; the gauges of the last step ended;
        the time of the latest of these. Without staleness, a step starting at an arrival runs
        after it is routed: what it tells at its own start is not heard yet."""
        if not asked:
            return [], [], [], [], []
        rows = np.asarray(asked, dtype=np.int64)
        now = arrivals[rows]
        when = now - staleness_ms
        adds = np.asarray(self.adds, dtype=np.float64)
        fins = np.sort(np.asarray(self.fins, dtype=np.float64))
        times = np.asarray(self.times, dtype=np.float64)
        order = np.argsort(times, kind="stable")   # (ties: as told)
        times = times[order]
        before = np.searchsorted(np.asarray(routed, dtype=np.int64), rows)   # routed here before it
        a = np.minimum(np.searchsorted(adds, when, side="right"), before)
        f = np.searchsorted(fins, when, side="right")
        if staleness_ms == 0 and self.own:
            own = np.sort(np.asarray(self.own, dtype=np.float64))
            f -= np.searchsorted(own, now, side="right") - np.searchsorted(own, now, side="left")
        g = np.searchsorted(times, when, side="right")
        last = np.zeros(len(when))
        for at, k in ((adds, a), (fins, f), (times, g)):
            if len(at):
                last = np.maximum(last, np.where(k > 0, at[np.maximum(k - 1, 0)], 0.0))
        gauges = []
        for col in (self.running, self.waiting, self.used):   # (of the step ended last by then; none: zeros)
            v = np.zeros(len(g), np.int64)
            if len(order):
                v = np.asarray(col, dtype=np.int64)[order[np.maximum(g - 1, 0)]]
                v[g == 0] = 0
            gauges.append(v.tolist())
        return (a - f).tolist(), gauges[0], gauges[1], gauges[2], last.tolist()


def run_apart(sim) -> None:
    """Each replica one engine over the requests routed to it, all added ahead, stepped to its
    end on its own clock (core.engine.loop.run, as one engine's simulation), what it tells kept
    (Reported); then every routing in arrival order, with what the router heard of each
    replica by then read back. The same trace as FleetSim.run's loop (tests/test_fleet_apart.py):
    nothing a replica does depends on another's, nor on the router, whose decisions were
    made ahead."""
    hop = sim.fleet.dispatch_ms
    for rep in sim.replicas:
        rep.reported = Reported()
    for row, now in enumerate(sim.w.arrival_ms.tolist()):
        d = sim.planned["decisions"].get((row, "whole"))
        if d is None:
            continue
        rep = sim.replicas[d.replica]
        r, at = reaching(sim.requests[row], now, now + hop)
        rep.core.add_request(r, client_abort=True)
        rep.rows.append(row)
        rep.is_copy.append(False)
        rep.reported.adds.append(at)
        rep.routed += 1
    for rep in sim.replicas:
        if rep.rows:
            rep.core.observe(rep.reported.observe)
            loop.run(rep.core, loop.VirtualClock(rep.reported.adds[0]))
            rep.core.observers.pop()
    routes_apart(sim)


def routes_apart(sim) -> None:
    """The route events of a run made apart, as `_route` records them: what the router had
    heard of each recorded candidate by each arrival (staleness before it), read back per
    replica at once from what the replica told as it ran (Reported)."""
    arr = sim.w.arrival_ms.tolist()
    decisions, policy = sim.planned["decisions"], sim.router_cfg.policy
    reps = sim.replicas
    block = [rep.spec.config.block_size for rep in reps]
    drains = [(rep.index, rep.drain_ms) for rep in reps]
    never = all(dr == math.inf for _, dr in drains)
    plan: list = [None] * len(arr)   # (decision, recorded candidates, how many left out)
    asked: list[list[int]] = [[] for _ in reps]   # per replica: the rows it is recorded in
    kept: dict = {}
    for row, now in enumerate(arr):
        d = decisions.get((row, "whole"))
        if d is not None:
            alive = None if never else tuple(k for k, dr in drains if dr > now)
            rec = kept.get((alive, d.replica))
            if rec is None:   # (the same candidates and choice: the same record)
                keep, _, more = recorded([k for k, _ in drains] if never else list(alive), (d.replica,), None)
                rec = kept[alive, d.replica] = ([(str(k), k) for k in keep], more)   # (its key in the event, index)
            plan[row] = (d, *rec)
            for _, k in rec[0]:
                asked[k].append(row)
    stale = sim.router_cfg.staleness_ms
    told = []
    for rep in reps:   # per replica: the next of its signals dicts, in routing order
        q, run, wait, used, last = rep.reported.as_of(asked[rep.index], rep.rows, sim.w.arrival_ms, stale)
        kb = rep.kv_blocks
        told.append(iter([signals_dict(a, r, w, u, kb, 0, 0, t)
                          for a, r, w, u, t in zip(q, run, wait, used, last)]).__next__)
    ids, prompts = sim.w.ids, sim.w.prompt_tokens.tolist()
    routes = sim.routes
    for row, now in enumerate(arr):
        planned = plan[row]
        if planned is None:
            why = "no replica in rotation (every one drained)"
            routes[row] = rejected_event(now, ids[row], policy, why)
            sim.router_finishes.append((row, now, "rejected", why))
            continue
        d, keep, more = planned
        routes[row] = route_event(now, ids[row], policy, d, (), prompts[row] // block[d.replica], None, more,
                                  {name: told[k]() for name, k in keep})
