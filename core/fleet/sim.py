"""The fleet simulator: several engine cores on one virtual clock, driven by a router.

Each replica is a simulating EngineCore (core.sim.simulate.simulator) whose requests arrive
only when routed to it. One loop advances time to the earliest of: the next arrival (the
router chooses a replica: core.fleet.router), the next fleet event (a prefill's end starts
a KV transfer), the next transfer's end (the decode replica receives the request) and the
replicas' next steps; at equal times, arrivals first, then transfers, then steps (lowest
replica first) — so a request arriving as a step ends joins the next step, as in one engine.
A replica fast-forwards runs of identical decode steps only up to the next time something
could be routed to it (EngineCore.step's `until_ms`). The fleet talks to its engines through
EngineCore's front only: requests in, steps out (their outputs carry the prefix cache's changes:
`cache_news`, the news the real fleet's engine processes send), and read-only questions.

A closed loop of clients (`concurrency`: a measured closed loop predicted as one) sends the first
`concurrency` requests at their workload times and each later one (in workload order) a delay after
a request finishes at the client (its finish, or its rejection at the router): the k-th replacement
`delay_ms[k]` after the k-th finish in time (the client's round trip), never before the one sent
before it. Replicas then step one step at a time (a run of steps could not stop where a finish on
another replica sends a request it should take).

Routes decided ahead (a signal_free policy: round-robin, random; no router queue limit) and nothing
shared: each replica runs apart (core.fleet.apart), the same trace as this loop at the cost of the
replicas' own steps.

What the router sees of replica r at time t is what r had reported by t - staleness: its
running, waiting and KV gauges as of its last step ended by then, the requests routed to it
minus those finished by then, and (precise prefix knowledge) its prefix cache as its block
events (cache, evict) published at each step's end.

Disaggregated prefill/decode (prefill and decode replicas): a prompt of at least
`pd_min_prompt` tokens is routed to a prefill replica *and* a decode replica (both chosen at
arrival, as llm-d does). The prefill replica computes the prompt (the request as a copy asking
one token, which is discarded); its end starts a transfer of the KV blocks the decode replica
does not already hold (bytes = blocks x block size x the model's KV bytes per token) over the
shared link (core.fleet.link); at its end the decode replica queues the request with its
prompt's KV preloaded and admits it when its blocks fit. First token: vLLM's convention for
disaggregated serving (its NixlConnector with a proxy): the decode replica recomputes the
prompt's last token and emits token 0, so TTFT includes the prefill, the transfer, the wait for
blocks on the decode side and that first decode step. Shorter prompts run whole on a decode
replica. Left out: the prefill side keeps no blocks while the transfer runs (vLLM holds them
until the decode side has read them); the decode side's blocks are taken when it admits the
request, not before the transfer.
"""
from __future__ import annotations

import dataclasses
import heapq
import math

import numpy as np

from core.engine.core import EngineCore
from core.engine.prefix_cache import extra_key
from core.errors import ConfigError
from core.fleet.apart import Reported, run_apart
from core.fleet.board import Board
from core.fleet.front import decide, prompt_hashes, rejected_event, route_event, signals_of
from core.fleet.link import Link
from core.fleet.records import fleet_records
from core.fleet.router import REGISTRY, ROLES, Router, Signals, recorded
from core.fleet.spec import FIRST_TOKEN, FleetSpec, ReplicaSpec, reaching, sized
from core.sim.simulate import no_cyclic_gc, simulator
from core.workload import MAX_TIME_MS, Request, Workload


class _Replica:
    """One replica: its engine core, what the router has been told of it, and its request rows."""

    def __init__(self, index: int, spec: ReplicaSpec, record_kv: bool, fast_forward: bool, listen: bool):
        self.index = index
        self.spec = spec
        self.role = spec.role
        self.core: EngineCore = simulator(spec.config, spec.step_model, None, record_kv, fast_forward,
                                          cache_news=listen)
        self.kv_blocks = self.core.num_kv_blocks   # (the pool's size: read at every routing)
        self.rows: list[int] = []            # local request row -> the fleet's
        self.is_copy: list[bool] = []        # local row: a prefill copy (its token and finish are not the client's)
        self._ready = math.inf               # when it next steps (inf: idle until something arrives)
        self.queue: list | None = None       # the fleet's heap of (ready, replica), told of every change
        self.busy = False                    # a step runs until `ready`
        self.started = -math.inf             # when its last step started
        self.drain_ms = math.inf if spec.drain_ms is None else float(spec.drain_ms)
        self.board = Board()                 # what the router has been told, applied when it is old enough
        self.routed = 0
        self.reported: Reported | None = None   # a run made apart (FleetSim.apart): what it told, read back

    @property
    def ready(self) -> float:
        return self._ready

    @ready.setter
    def ready(self, t: float):
        if t != self._ready:
            self._ready = t
            if t != math.inf and self.queue is not None:
                heapq.heappush(self.queue, (t, self.index))


class _Seen(list):
    """Signals recorded for a decision made ahead, with how many candidates were left out."""

    def __init__(self, sigs, left_out: int):
        super().__init__(sigs)
        self.left_out = left_out


class _Idle:
    ready = math.inf


class FleetSim:
    """A fleet run over one workload (`run()` returns the trace)."""

    def __init__(self, workload: Workload, fleet: FleetSpec, record_kv: bool = True, fast_forward: bool = True,
                 concurrency: int | None = None, delay_ms=0.0):
        self.w = workload
        self.clients = None if concurrency is None else _Clients(workload, concurrency, delay_ms)
        fast_forward = fast_forward and self.clients is None
        self.fleet = fleet
        rc = fleet.router
        self.router_cfg = rc
        listen = rc.prefix_mode == "precise"
        fleet = sized(fleet, workload)
        self.replicas = [_Replica(i, s, record_kv, fast_forward, listen) for i, s in enumerate(fleet.replicas)]
        self.router = Router(rc, len(self.replicas), [r.core.num_kv_blocks for r in self.replicas])
        self.pd = fleet.disaggregated           # (asked at every routing: a walk over the replicas)
        self.link = Link(fleet.link_gbps, fleet.link_latency_ms) if self.pd else None
        self.requests = list(workload.requests) if self.clients is not None else workload.requests
        n = len(workload)
        self.routes: list[dict | None] = [None] * n
        self.transfers: list[dict] = []
        self.router_finishes: list[tuple] = []   # (row, t_ms, reason, detail): rejected at the router
        self.decode_of: dict[int, int] = {}      # disaggregated: row -> its decode replica
        self.pending: list = []                  # fleet events: (t, seq, kind, payload)
        self._seq = [0]
        self._hashes: dict = {}                  # (row, extra) -> the prompt's block hashes
        self.roles = {role: [r for r in self.replicas if r.role == role] for role in ROLES}
        self.planned = self._plan_routes() if self.clients is None else None
        # routes decided ahead (a policy that reads no signals) and no disaggregation: the replicas
        # never wait on each other, and each runs apart (see `run`)
        self.apart = self.planned is not None and not self.pd and not fleet.contention
        if fleet.contention:   # (each step priced at its start by who else is mid-step: stepped one by one)
            for rep in self.replicas:
                rep.core.executor.speed = _Shared(rep, self.replicas, fleet.contention)

    # ---- routing -----------------------------------------------------------------------------
    def _prompt_hashes(self, row: int, rep: _Replica) -> list:
        r = self.requests[row]
        ids = r.prompt_ids
        if ids is None:
            return []
        cfg = rep.spec.config
        extra = extra_key(cfg.model_id, r.tenant)
        key = (row, cfg.block_size, extra)
        got = self._hashes.get(key)
        if got is None:
            got = prompt_hashes(ids, cfg.block_size, extra)
            self._hashes = {key: got}   # (one request's at a time: routing asks twice at most)
        return got

    def _signals(self, rep: _Replica, row: int, now: float) -> Signals:
        return signals_of(self.router, rep.index, rep.board, rep.kv_blocks, lambda: self._prompt_hashes(row, rep), now)

    def _plan_routes(self) -> dict | None:
        """A policy that reads no signals (signal_free: round-robin, random) and no router queue limit: every
        decision made ahead, in arrival order (the same draws as made one by one), so each
        replica knows when its next request comes and fast-forwards up to it, not to every
        arrival's. None otherwise. {(row, stage): Decision}, and per replica its arrival times."""
        rc = self.router_cfg
        if not getattr(REGISTRY.get(rc.policy), "signal_free", False) or rc.queue_limit is not None:
            return None
        router = Router(rc, len(self.replicas))
        plan, times = {}, [[] for _ in self.replicas]
        pd, arrivals, hop = self.pd, self.w.arrival_ms.tolist(), self.fleet.dispatch_ms
        # the candidates of a role change only when a replica drains: built once per role and drain epoch
        drains = sorted({rep.drain_ms for rep in self.replicas if rep.drain_ms != math.inf})
        cands_of: dict[tuple, list] = {}
        epoch, whole = 0, [("whole", "decode" if pd else "both")]
        for row, now in enumerate(arrivals):
            while epoch < len(drains) and drains[epoch] <= now:
                epoch += 1
            stages = (whole if not pd or self.requests[row].prompt_tokens < self.fleet.pd_min_prompt
                      else [("prefill", "prefill"), ("decode", "decode")])
            for stage, role in stages:
                sigs = cands_of.get((role, epoch))
                if sigs is None:   # (their signals are blank: the policy reads none)
                    sigs = cands_of[role, epoch] = [Signals(rep.index, 0, 0, 0, 0, 1) for rep in self.roles[role]
                                                    if rep.drain_ms > now]
                if not sigs:
                    break
                d = router.choose(sigs, 0)
                plan[row, stage] = d
                if stage != "decode":
                    times[d.replica].append(now + hop)
        return {"decisions": plan, "times": times, "next": [0] * len(self.replicas)}

    def _choose(self, group: list[_Replica], row: int, now: float, stage: str = "whole"):
        cands = [rep for rep in group if rep.drain_ms > now]
        if not cands:
            return None, None, "no replica in rotation (every one drained)"
        if self.planned is not None:     # (decided ahead: the signals only for the route event's record)
            d = self.planned["decisions"][row, stage]
            if stage != "decode":
                self.planned["next"][d.replica] += 1
            keep, _, _ = recorded([rep.index for rep in cands], (d.replica,), None)
            sigs = [self._signals(self.replicas[k], row, now) for k in keep]
            return d, _Seen(sigs, len(cands) - len(keep)), None
        sigs = [self._signals(rep, row, now) for rep in cands]
        blocks = self.requests[row].prompt_tokens // cands[0].spec.config.block_size
        d, why = decide(self.router, sigs, blocks, lambda k: self._prompt_hashes(row, self.replicas[k]))
        return d, sigs, why

    def _route(self, row: int, now: float):
        r = self.requests[row]
        pd = self.pd
        whole = not pd or r.prompt_tokens < self.fleet.pd_min_prompt
        group = self.roles["both"] if not pd else self.roles["decode" if whole else "prefill"]
        d, sigs, why = self._choose(group, row, now, "whole" if whole else "prefill")
        policy = self.router_cfg.policy
        if d is None:
            self._rejected(row, now, why)
            return
        dd = None
        if not whole:
            dd, dsigs, dwhy = self._choose(self.roles["decode"], row, now, "decode")
            if dd is None:
                self._rejected(row, now, dwhy)
                return
            sigs = _Seen(list(sigs) + list(dsigs), getattr(sigs, "left_out", 0) + getattr(dsigs, "left_out", 0))
        dec = None if dd is None else dd.replica
        self.routes[row] = route_event(now, r.id, policy, d, sigs,
                                       r.prompt_tokens // self.replicas[d.replica].spec.config.block_size, dd,
                                       getattr(sigs, "left_out", 0))
        hop = self.fleet.dispatch_ms
        if whole:
            self._add(self.replicas[d.replica], row, r, now, at=now + hop)
        else:
            self.decode_of[row] = dec
            self.replicas[dec].board.tell(now, "requests", 1)   # it will hold this request
            copy = Request(r.id, now, r.prompt_tokens, 1, r.prompt_ids, r.tenant, abort_at_ms=r.abort_at_ms,
                           deadline_ms=r.deadline_ms, priority=r.priority)
            self._add(self.replicas[d.replica], row, copy, now, is_copy=True, at=now + hop)

    def _rejected(self, row: int, now: float, why: str):
        self.routes[row] = rejected_event(now, self.requests[row].id, self.router_cfg.policy, why)
        self.router_finishes.append((row, now, "rejected", why))
        self._client_done(now)

    def _add(self, rep: _Replica, row: int, r: Request, now: float, is_copy: bool = False, preloaded: int = 0,
             at: float | None = None):
        """`at`: when the request reaches the replica's engine (default now; a dispatch hop later)."""
        r, now = reaching(r, now, at)
        rep.core.add_request(r, preloaded=preloaded, client_abort=True)
        rep.rows.append(row)
        rep.is_copy.append(is_copy)
        if not (preloaded and rep.role == "decode"):   # (a decode replica was told at routing)
            rep.board.tell(now, "requests", 1)
        rep.routed += 1
        if not rep.busy:   # idle: it steps now (a busy one takes it at its step's end)
            rep.ready = min(rep.ready, now)

    # ---- the loop ------------------------------------------------------------------------------


    def _horizon(self, rep: _Replica, next_arrival: float) -> float | None:
        h = next_arrival
        if self.planned is not None:   # only its own next request can stop it
            times, k = self.planned["times"][rep.index], self.planned["next"][rep.index]
            h = times[k] if k < len(times) else math.inf
        if rep.role == "decode":
            if self.link is not None:
                h = min(h, self.link.next_done_ms())
            if self.pending:
                h = min(h, self.pending[0][0])
            for p in self.roles["prefill"]:
                h = min(h, p.ready)
                if self.planned is not None:   # an idle prefill replica starts at its next request's arrival
                    times, k = self.planned["times"][p.index], self.planned["next"][p.index]
                    if k < len(times):
                        h = min(h, times[k])
        return None if h == math.inf else h

    def _step(self, rep: _Replica, now: float, next_arrival: float):
        core = rep.core
        out = core.step(now, self._horizon(rep, next_arrival))
        if out is not None:
            self._outputs(rep, out)
        if out is not None and out.step is not None:
            rep.ready = out.t_ms
            rep.busy = True
            rep.started = now
            return
        rep.busy = False
        nxt = core.next_event_ms()
        if nxt is not None and nxt <= now and core.has_unfinished():
            raise RuntimeError(f"replica {rep.index} made no progress at t={now} ms")
        rep.ready = math.inf if nxt is None else nxt

    def _outputs(self, rep: _Replica, out):
        t_end = out.t_ms
        for f in out.finished:
            row = rep.rows[f.req]
            if rep.is_copy[f.req] and f.reason == "length":
                self._push(f.t_ms, "prefilled", (row, rep.index))
            else:
                self._client_done(f.t_ms)
            rep.board.tell(f.t_ms, "requests", -1)
            if rep.is_copy[f.req] and f.reason != "length":   # it never reaches its decode replica
                self.replicas[self.decode_of[row]].board.tell(f.t_ms, "requests", -1)
        if out.step is not None:
            rec = out.record
            if type(rec.step) is range and len(rec.step) > 1:
                # a run of steps: the router hears each step's end, as when stepping them one by
                # one, told once for the run: what each step but the last left behind (`after`);
                # the last's, the gauges below
                a = out.after
                rep.board.tell(rec.t_ms[1], "run", (rec.t_ms[1:], a[0], a[1], a[2], 0))
            g = out.gauges
            rep.board.tell(t_end, "gauges", (g[0], g[1], g[2]))
        if out.cache_news:
            news = out.cache_news
            rec = out.record
            if rec is not None and type(rec.step) is range and len(rec.step) > 1:
                # a run: each event told at the end of the step it happened in, as when stepping
                # (an eviction at a step's start belongs to that step; a store at its end too)
                ends = np.r_[rec.t_ms[1:], t_end]
                last = len(ends) - 1
                group, at = [], None
                for sign, h, now in news:
                    j = min(last, int(np.searchsorted(ends, now, side="right" if sign < 0 else "left")))
                    if at is not None and j != at:
                        rep.board.tell(float(ends[at]), "kv", group)
                        group = []
                    group.append((sign, h))
                    at = j
                rep.board.tell(float(ends[at]), "kv", group)
            else:
                rep.board.tell(t_end, "kv", [(sign, h) for sign, h, _ in news])

    def _client_done(self, t: float):
        """A request finished at the client at t: a closed loop sends the next when the loop reaches t."""
        if self.clients is not None:
            self._push(t, "done", None)

    def _push(self, t: float, kind: str, payload):
        self._seq[0] += 1
        heapq.heappush(self.pending, (t, self._seq[0], kind, payload))

    def _start_transfer(self, row: int, src: int, now: float):
        r = self.requests[row]
        dst = self.replicas[self.decode_of[row]]
        bs = dst.spec.config.block_size
        held = dst.core.cached_prefix_blocks(r.prompt_ids, r.tenant, r.prompt_tokens - 1) if r.prompt_ids else 0
        blocks = max(0, -(-r.prompt_tokens // bs) - held)
        nbytes = blocks * bs * self.fleet.kv_bytes_per_token
        self.link.add(row, nbytes, now)
        self.transfers.append({"type": "transfer", "t_ms": now, "req": r.id, "src": src, "dst": dst.index,
                               "bytes": nbytes, "blocks": blocks, "dur_ms": None, "_row": row})

    def _transfer_done(self, row: int, end: float):
        r = self.requests[row]
        if not end <= MAX_TIME_MS:   # (a link so slow, or a KV so large, that the run would outlast any trace)
            lk = self.link
            raise ConfigError(f"KV link: request {r.id!r}'s transfer would end at {end:.3g} ms, past the "
                              f"{MAX_TIME_MS:g} ms a trace holds: a {lk.gbps:g} GB/s link with {lk.latency_ms:g} ms "
                              f"latency moving {self.fleet.kv_bytes_per_token:,} bytes a token is too slow "
                              "(--kv-link-gbps, --kv-link-latency-ms, --model / --dtype-bytes)")
        dst = self.replicas[self.decode_of[row]]
        self._add(dst, row, r, end, preloaded=r.prompt_tokens - 1)

    def run(self):
        if self.apart:
            return run_apart(self)
        clients = self.clients
        arrivals = clients.at if clients is not None else self.w.arrival_ms.tolist()
        n = len(arrivals)
        reps = self.replicas
        due: list = []              # (ready, replica), stale entries skipped: the earliest first, ties by index
        for rep in reps:
            rep.queue = due
        i = 0
        xfer_index = {}
        idle = _Idle()
        while True:
            t_arr = arrivals[i] if i < n else math.inf
            t_ev = self.pending[0][0] if self.pending else math.inf
            t_link = self.link.next_done_ms() if self.link is not None and len(self.link) else math.inf
            while due and reps[due[0][1]].ready != due[0][0]:
                heapq.heappop(due)
            rep = reps[due[0][1]] if due else idle
            now = min(t_arr, t_ev, t_link, rep.ready)
            if now == math.inf:
                break
            if t_arr <= now:
                if clients is not None:   # (sent now: its arrival, and no client abort at the workload's time)
                    self.requests[i] = dataclasses.replace(self.requests[i], arrival_ms=t_arr, abort_at_ms=None)
                self._route(i, t_arr)
                i += 1
            elif t_ev <= now:
                t, _, kind, payload = heapq.heappop(self.pending)
                if kind == "done":
                    clients.finished(t)
                    continue
                row, src = payload
                xfer_index[row] = len(self.transfers)
                self._start_transfer(row, src, t)
            elif t_link <= now:
                for row, start, end, _ in self.link.pop_done(now):
                    self.transfers[xfer_index.pop(row)]["dur_ms"] = end - start
                    self._transfer_done(row, end)
            else:
                heapq.heappop(due)
                self._step(rep, now, t_arr)
        self._check_finished()

    def _check_finished(self) -> None:
        for rep in self.replicas:
            if rep.core.has_unfinished():
                raise RuntimeError(f"replica {rep.index}: requests left unfinished")

    # ---- the trace -----------------------------------------------------------------------------
    def trace(self, label: str | None = None, created: str | None = None):
        from core.trace.build import trace_from_records
        w = self.w
        if self.clients is not None:   # (as sent)
            w = Workload(self.requests, name=f"{w.name}, closed loop of {self.clients.concurrency}")
        reps = self.replicas
        first = reps[0]
        meta = first.core.trace_meta(w, "simulated", label or self._label(), {"name": "core.fleet"}, created,
                                     step_model=first.core.executor.step_model.to_dict())
        meta["stats"] = self._stats()
        meta["fleet"] = self.meta_fleet()
        if self.clients is not None:
            meta["load"] = {"kind": "closed", "concurrency": self.clients.concurrency, "first_sends": "as given"}
        records = fleet_records([r.core.log for r in reps], [np.asarray(r.rows, dtype=np.int64) for r in reps],
                                [np.asarray(r.is_copy, dtype=bool) for r in reps])
        if self.router_finishes:
            rows, t, reasons, _ = zip(*self.router_finishes)
            fin = records.setdefault("finish", {"t_ms": np.empty(0), "req": np.empty(0, np.int64), "reason": [],
                                                "replica": np.empty(0, np.int64)})
            fin["t_ms"] = np.concatenate([fin["t_ms"], np.asarray(t, dtype=np.float64)])
            fin["req"] = np.concatenate([fin["req"], np.asarray(rows, dtype=np.int64)])
            fin["reason"] = list(fin["reason"]) + list(reasons)
            fin["replica"] = np.concatenate([fin["replica"], np.full(len(rows), -1, dtype=np.int64)])
            order = np.argsort(fin["t_ms"], kind="stable")
            fin["t_ms"], fin["req"], fin["replica"] = fin["t_ms"][order], fin["req"][order], fin["replica"][order]
            fin["reason"] = [fin["reason"][k] for k in order.tolist()]
        other = [e for e in self.routes if e is not None]
        other += [{k: v for k, v in e.items() if k != "_row"} for e in self.transfers]
        for k, r in enumerate(reps):   # (and each replica's CPU tier's copies, named by the fleet's request ids)
            other += r.core.log.other + [{**e, "replica": k} for e in r.core.tier_events()]
        other.sort(key=lambda e: e["t_ms"])
        return trace_from_records(w, records, meta, other)

    def _label(self) -> str:
        f = self.fleet
        if f.disaggregated:
            p, d = len(self.roles["prefill"]), len(self.roles["decode"])
            shape = f"{p}P:{d}D"
        else:
            shape = f"{len(self.replicas)} replicas"
        return f"{shape}, {self.router_cfg.policy} (simulated)"

    def _stats(self) -> dict:
        out: dict = {}
        for r in self.replicas:
            for k, v in r.core.run_stats().items():
                out[k] = out.get(k, 0) + v
        if self.router_finishes:
            out["rejected"] = out.get("rejected", 0) + len(self.router_finishes)
        return out

    def meta_fleet(self) -> dict:
        f = self.fleet
        reps = []
        for r in self.replicas:
            c, st = r.core, r.core.run_stats()
            reps.append({"replica": r.index, "role": r.role, "engine": c.config.to_dict(),
                         "step_model": c.executor.step_model.to_dict(), "kv_blocks": c.num_kv_blocks,
                         "drain_ms": None if r.drain_ms == math.inf else r.drain_ms,
                         "stats": {"steps": c.num_steps, "requests": c.num_requests, "preemptions": st["preemptions"],
                                   "prefix_hit_blocks": int(st.get("kv_hit", 0)),
                                   "prefix_hit_blocks_first": int(c.prefix_hits_first),
                                   **{k: v for k, v in st.items() if k.startswith("kv_") and k != "kv_blocks"}}})
        out = {"replicas": reps, "router": self.router_cfg.to_dict()}
        if f.contention:
            out["contention"] = f.contention
        if f.disaggregated:
            out["link"] = self.link.to_dict() | {"kv_bytes_per_token": f.kv_bytes_per_token, "model": f.model}
            out["pd_min_prompt"] = f.pd_min_prompt
            out["first_token"] = FIRST_TOKEN
        return out


class _Shared:
    """Replicas sharing a host's cores (FleetSpec.contention): a step starting at t takes 1 + c x
    (the other replicas mid-step at t: started before t, ending after it; two steps starting together
    do not slow each other, in either order) times its price (the executor's speed factor)."""

    def __init__(self, rep: _Replica, replicas: list[_Replica], c: float):
        self.others = [o for o in replicas if o is not rep]
        self.c = c

    def at(self, t_ms: float) -> float:
        return 1.0 + self.c * sum(1 for o in self.others if o.busy and o.started < t_ms < o.ready)


class _Clients:
    """A closed loop's clients (FleetSim's `concurrency`): the send time of each request, in
    workload order (inf: not sent yet)."""

    def __init__(self, w: Workload, concurrency: int, delay_ms):
        if not (isinstance(concurrency, (int, np.integer)) and concurrency >= 1):
            raise ConfigError(f"fleet closed loop: concurrency: expected an integer >= 1, got {concurrency!r}")
        d = np.atleast_1d(np.asarray(delay_ms, dtype=float))
        if not (len(d) and np.isfinite(d).all() and (d >= 0).all()):
            raise ConfigError(f"fleet closed loop: delay_ms: expected numbers >= 0, got {delay_ms!r}")
        self.concurrency = int(concurrency)
        self.delays = d.tolist()
        c = min(self.concurrency, len(w))
        self.at = w.arrival_ms[:c].tolist() + [math.inf] * (len(w) - c)
        self.next, self.replaced = c, 0

    def finished(self, t: float):
        """The k-th finish (in time) sends the next request delays[k] ms later."""
        if self.next < len(self.at):
            d = self.delays[min(self.replaced, len(self.delays) - 1)]
            self.at[self.next] = max(t + d, self.at[self.next - 1] if self.next else 0.0)
            self.next += 1
            self.replaced += 1


def simulate_fleet(workload: Workload, fleet: FleetSpec, label: str | None = None, created: str | None = None,
                   record_kv: bool = True, fast_forward: bool = True, concurrency: int | None = None,
                   delay_ms=0.0):
    """The trace of `workload` served by `fleet` (see the module's docstring); `concurrency`: sent
    by a closed loop of that many clients, each replacement `delay_ms` after a finish (one number,
    or one per replacement in order: the last repeats)."""
    with no_cyclic_gc():
        sim = FleetSim(workload, fleet, record_kv, fast_forward, concurrency, delay_ms)
        sim.run()
        tr = sim.trace(label, created)
        del sim   # (freed before collection is back on: else its first pass walks every object of the run)
        return tr
