"""Load sweeps: the same requests at several offered loads, simulated, summarised per point.

Two kinds of load, which answer different questions:
- open loop (`rates`): the workload's requests, same lengths and order, re-timed as a Poisson
  arrival process at each rate (seeded: every rate scales the same exponential draws).
  Arrivals do not wait for the server, so past capacity the queue and TTFT grow without bound.
- closed loop (`concurrency`): C clients, each sending its next request the moment its last
  one finishes (no think time): at most C requests are ever in the system. A burst of C is
  the start of a closed loop, not an arrival process; latency stays bounded and throughput
  saturates instead.

Each point is one simulation (core.sim.simulate) summarised with core.analysis.metrics.summarize;
points run in parallel processes. `capacity`: the highest swept load whose SLO attainment
is at least the target.

A fleet (`fleet`: a core.fleet.sim.FleetSpec, several replicas behind a router) simulates each
point with core.fleet.sim.simulate_fleet instead, its router seeded with the point's arrival seed
(so a repeat draws new arrivals and new routing). Open loop only: a closed loop's clients are an
inbox of one engine core (ClosedLoop), which the fleet's router does not drive.
"""
from __future__ import annotations

import dataclasses
import math
from collections import deque

import numpy as np

from core.analysis.metrics import COMPLETED, DEFAULT_PERCENTILES, SLO, request_metrics, summarize
from core.config import SchedulerConfig
from core.engine import loop
from core.engine.admission import blocks_needed
from core.engine.core import EngineCore
from core.errors import ConfigError
from core.fleet.router import policy_setup
from core.sim.parallel import run_all
from core.sim.simulate import simulator
from core.sim.stepmodel import StepModel
from core.workload import MAX_TIME_MS, Request, Workload

PERCENTILES = DEFAULT_PERCENTILES   # what summarize computes: p50, p90, p95, p99
MAX_POINTS = 200


def poisson_arrivals(n: int, rate_per_s: float, seed: int) -> np.ndarray:
    """n arrival times (ms) from 0: exponential gaps of mean 1000 / rate, seeded."""
    if not (math.isfinite(rate_per_s) and rate_per_s > 0):
        raise ConfigError(f"rate: expected requests per second > 0, got {rate_per_s!r}")
    gaps = np.random.default_rng(seed).exponential(1.0, n - 1) * (1000.0 / rate_per_s)
    out = np.concatenate([[0.0], np.cumsum(gaps)])
    if not out[-1] <= MAX_TIME_MS:     # (a rate so low that the requests would arrive past what a trace holds)
        raise ConfigError(f"rate {rate_per_s:g} req/s: {n:,} requests would arrive over {out[-1] / 1000:.3g} s, past "
                          f"the {MAX_TIME_MS / 1000:g} s a trace can hold; give a higher rate")
    return out


def retimed(workload: Workload, rate_per_s: float, seed: int) -> Workload:
    """The same requests (lengths, ids, order) arriving as a Poisson process at `rate_per_s`."""
    t = poisson_arrivals(len(workload), rate_per_s, seed)
    reqs = [dataclasses.replace(r, arrival_ms=float(a), abort_at_ms=None) for r, a in zip(workload.requests, t)]
    return Workload(reqs, name=f"{workload.name} @ {rate_per_s:g} req/s")


class ClosedLoop:
    """Inbox for core.engine.loop.run: keeps `concurrency` requests in the system, sending the next
    one (in workload order) at the time one finishes. `first_as_given`: the first `concurrency`
    requests arrive at their own arrival times (a measured run's first sends, staggered by the
    client), not all at the start."""

    def __init__(self, requests: list[Request], concurrency: int, delay_ms=0.0, first_as_given: bool = False):
        self.pending = deque(requests)
        self.first_as_given = first_as_given
        self.concurrency = concurrency
        # from a finish to its replacement reaching the engine: one for all, or the k-th replacement's
        self.delays = [float(delay_ms)] * len(requests) if np.ndim(delay_ms) == 0 else [float(d) for d in delay_ms]
        self.replaced = 0
        self.last_arrival = 0.0
        self.sent: list[Request] = []
        self.max_in_flight = 0

    def drain(self, core: EngineCore, now_ms: float) -> bool:
        while self.pending and len(self.sent) - core.num_done < self.concurrency:
            first = len(self.sent) < self.concurrency and not core.num_done
            at = max(now_ms, self.pending[0].arrival_ms) if self.first_as_given and first else now_ms
            if core.num_done:      # a replacement; the front end hands requests on in order
                at = max(now_ms + self.delays[min(self.replaced, len(self.delays) - 1)], self.last_arrival)
                self.replaced += 1
            self.last_arrival = at
            r = dataclasses.replace(self.pending.popleft(), abort_at_ms=None, arrival_ms=at)
            core.add_request(r)
            self.sent.append(r)
        self.max_in_flight = max(self.max_in_flight, len(self.sent) - core.num_done)
        return bool(self.pending) or core.has_unfinished()

    def wait(self):  # never idle: a finish sends the next request at once
        raise RuntimeError("closed loop: the scheduler went idle with requests in flight")


def simulate_closed(workload: Workload, config: SchedulerConfig, step_model: StepModel, concurrency: int,
                    created: str | None = None, delay_ms=0.0, first_as_given: bool = False, speed=None):
    """The workload's requests in order as a closed loop of `concurrency` clients; returns
    (trace, most requests ever in flight). `delay_ms`: from a request's finish until the one
    that replaces it reaches the engine (the client's and the server front-end's round trip),
    one number or one per replacement in order (the last repeats); a replacement never reaches
    the engine before the one sent before it. `first_as_given`: the first `concurrency` requests
    arrive at their workload arrival times (a measured run's staggered first sends) instead of
    all at time 0. `speed`: the machine's speed over the run (core.sim.stepmodel.Speed).
    A pool left unsized (kv_blocks None) gets the blocks every request would need at once, as an
    open-loop simulation does."""
    if concurrency < 1:
        raise ConfigError(f"concurrency: expected an integer >= 1, got {concurrency!r}")
    d = np.atleast_1d(np.asarray(delay_ms, dtype=float))
    if not (len(d) and np.isfinite(d).all() and (d >= 0).all()):
        raise ConfigError(f"delay_ms: expected numbers >= 0, got {delay_ms!r}")
    if config.kv_blocks is None:
        need = blocks_needed(workload.prompt_tokens, workload.max_output_tokens, config.block_size)
        config = dataclasses.replace(config, kv_blocks=int(need.sum()))
    core = simulator(config, step_model, speed=speed)
    inbox = ClosedLoop(workload.requests, concurrency, delay_ms, first_as_given)
    loop.run(core, loop.VirtualClock(0.0), inbox=inbox)
    sent = Workload(inbox.sent, name=f"{workload.name}, closed loop of {concurrency}")
    meta = core.trace_meta(sent, "simulated", f"{config.policy}, {concurrency} in flight (simulated)",
                           {"name": "core.sweep"}, created, step_model=step_model.to_dict(),
                           load={"kind": "closed", "concurrency": concurrency},
                           **({"speed": speed.describe()} if speed is not None else {}))
    return core.trace(sent, meta), inbox.max_in_flight


def point_summary(trace, slo: SLO | None) -> dict:
    """One sweep point's numbers (see core.analysis.metrics for each definition)."""
    s = summarize(trace, slo=slo, per_request=False)["summary"]
    m = request_metrics(trace)
    a = m["arrival_ms"].to_numpy()
    span = (a.max() - a.min()) / 1000.0
    done = m["finish_reason"].isin(COMPLETED).to_numpy()
    w0, w1 = s["window_ms"]
    out = {"requests": len(m),
           "offered_req_per_s": (len(a) - 1) / span if span > 0 else None,   # arrivals over their span
           "achieved_req_per_s": int(done.sum()) / ((w1 - w0) / 1000.0) if w1 > w0 else None,
           "output_tok_per_s": s["output_tok_per_s"],
           **{k: {f"p{q}": s[k][f"p{q}"] for q in PERCENTILES} | {"mean": s[k]["mean"]}   # summarize's own
              for k in ("ttft_ms", "tpot_ms", "e2e_ms")},
           "failed": int((~done).sum()),
           "littles_law": s["littles_law"], "utilisation": s["utilisation"]}
    if "slo" in s:
        out["slo"] = s["slo"]
    return out


def run_point(workload: Workload, config: SchedulerConfig, step_model: StepModel, slo: SLO | None,
              rate: float | None = None, concurrency: int | None = None, seed: int = 0, fleet=None) -> dict:
    """Simulate and summarise one point (a module-level function: it runs in worker processes).
    `fleet` (a FleetSpec; open loop only): that fleet serves the point, its router seeded by `seed`."""
    if rate is not None and fleet is not None:
        from core.fleet.options import seeded
        from core.fleet.sim import simulate_fleet
        tr = simulate_fleet(retimed(workload, rate, seed), seeded(fleet, seed), created="(sweep)", record_kv=False)
        return {"rate": rate} | point_summary(tr, slo)
    if rate is not None:
        from core.sim.simulate import simulate
        tr = simulate(retimed(workload, rate, seed), config, step_model, created="(sweep)", record_kv=False)
        return {"rate": rate} | point_summary(tr, slo)
    tr, most = simulate_closed(workload, config, step_model, concurrency, created="(sweep)")
    return {"concurrency": concurrency, "max_in_flight": most} | point_summary(tr, slo)


SPREAD = {"output_tok_per_s": lambda p: p["output_tok_per_s"], "achieved_req_per_s": lambda p: p["achieved_req_per_s"],
          "ttft_p99_ms": lambda p: p["ttft_ms"]["p99"], "tpot_p99_ms": lambda p: p["tpot_ms"]["p99"],
          "e2e_p99_ms": lambda p: p["e2e_ms"]["p99"], "failed": lambda p: p["failed"],
          "attainment": lambda p: p["slo"]["attainment"] if "slo" in p else None,
          "goodput_req_per_s": lambda p: p["slo"]["goodput_req_per_s"] if "slo" in p else None}


def with_repeats(runs: list[dict], seeds: list[int]) -> dict:
    """One open-loop point from runs of the same rate with different arrival seeds: the first
    run's numbers, and "repeats" = {seeds, metric: {min, mean, max}} over all of them."""
    spread = {}
    for name, get in SPREAD.items():
        v = [get(r) for r in runs]
        if all(x is not None for x in v):
            spread[name] = {"min": min(v), "mean": sum(v) / len(v), "max": max(v)}
    return runs[0] | {"seed": seeds[0], "repeats": {"seeds": seeds, **spread}}


def attainment_of(p: dict) -> float | None:
    """A point's SLO attainment; with repeats the worst one (a gate holds in every run)."""
    if "repeats" in p and "attainment" in p["repeats"]:
        return p["repeats"]["attainment"]["min"]
    return p["slo"]["attainment"] if p.get("slo") else None


def capacity(points: list[dict], target: float) -> dict | None:
    """The highest swept load (rate or concurrency) whose SLO attainment is >= target (in every
    repeat, when a point has repeats)."""
    ok = [p for p in points if attainment_of(p) is not None and attainment_of(p) >= target]
    if not ok:
        return None
    key = "rate" if "rate" in ok[0] else "concurrency"
    best = max(ok, key=lambda p: p[key])
    return {key: best[key], "attainment": attainment_of(best), "target": target}


def _check_sweep_args(rates, concurrency, attainment: float, repeats: int, fleet) -> tuple[str, list]:
    """(kind: "rate" or "concurrency", the loads) of a sweep's arguments, or ConfigError saying what is wrong."""
    if (rates is None) == (concurrency is None):
        raise ConfigError("sweep: give either rates or concurrency levels")
    loads = list(rates if rates is not None else concurrency)
    if not 1 <= len(loads) <= MAX_POINTS:
        raise ConfigError(f"sweep: expected 1 to {MAX_POINTS} points, got {len(loads)}")
    if not 0 < attainment <= 1:
        raise ConfigError(f"attainment: expected a fraction in (0, 1], got {attainment!r}")
    kind = "rate" if rates is not None else "concurrency"
    if isinstance(repeats, bool) or not isinstance(repeats, int) or not 1 <= repeats <= 100:
        raise ConfigError(f"repeats: expected an integer in 1..100, got {repeats!r}")
    if repeats > 1 and kind == "concurrency":
        raise ConfigError("repeats: a simulated closed loop is deterministic (every repeat would be the same run); "
                          "repeat open-loop rates, whose arrivals change with the seed")
    if fleet is not None and kind == "concurrency":
        raise ConfigError("sweep: a closed loop (--concurrency) runs on one engine; a fleet (--replicas, "
                          "--prefill-replicas/--decode-replicas, --replicas-file) takes open-loop --rates")
    return kind, loads


def sweep(workload: Workload, config: SchedulerConfig, step_model: StepModel, rates=None, concurrency=None,
          seed: int = 0, slo: SLO | None = None, attainment: float = 0.9, workers: int | None = None,
          repeats: int = 1, ray: str | None = None, results: str | None = None, fleet=None) -> dict:
    """{"kind", "points": [...] (in the order given), "capacity"} over `rates` (req/s, open
    loop) or `concurrency` levels (closed loop). Open-loop points can be repeated with arrival
    seeds seed, seed+1, ... (`repeats`; see with_repeats). Runs go to up to `workers`
    processes (default: one per CPU); 1 runs them here; `ray`: Ray tasks; `results`: each point's row
    written to that directory or URI and read back as a dataset (core.sim.shared). `fleet` (a
    core.fleet.sim.FleetSpec, open loop only): every point served by that fleet (its replicas carry
    their own scheduler and step model; `config` and `step_model` are then only reported), the
    result's "fleet" says which (core.fleet.options.fleet_summary)."""
    kind, loads = _check_sweep_args(rates, concurrency, attainment, repeats, fleet)
    seeds = list(range(seed, seed + repeats))
    jobs = ([dict(rate=x, seed=s) for x in loads for s in seeds] if kind == "rate"
            else [dict(concurrency=int(x)) for x in loads])
    if fleet is not None:
        jobs = [j | {"fleet": fleet} for j in jobs]
    runs = run_all(run_point, [dict(workload=workload, config=config, step_model=step_model, slo=slo, **j)
                               for j in jobs], workers, ray, results, setup=policy_setup())
    points = ([with_repeats(runs[i:i + repeats], seeds) for i in range(0, len(runs), repeats)] if repeats > 1
              else runs)
    out = {"kind": "open" if kind == "rate" else "closed", "workload": workload.name, "requests": len(workload),
           "seed": seed if kind == "rate" else None, "scheduler": config.to_dict(), "step_model": step_model.to_dict(),
           "points": points, "capacity": None}
    if fleet is not None:
        from core.fleet.options import fleet_summary, seeded
        out["fleet"] = fleet_summary(seeded(fleet, seed))
    if slo is not None and slo.given():
        out["capacity"] = capacity(points, attainment)
    return out
