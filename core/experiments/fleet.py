"""Experiments over simulated fleets: the same workload on a fleet stated as the Fleet page states
it (FleetSetup), once per router policy (compare_policies), per policy and staleness
(staleness_sweep), per split of a number of replicas into prefill and decode ones (pd_splits);
each run's numbers as core.analysis.routing.fleet_numbers gives them, in worker processes when
the runs are large enough to gain from it."""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from core.analysis.metrics import SLO
from core.analysis.routing import fleet_numbers
from core.config import SchedulerConfig
from core.errors import ConfigError
from core.fleet.options import LINK_DEFAULTS
from core.fleet.router import NO_LOAD_CHECK, POLICIES, RouterConfig, policy_setup
from core.fleet.sim import FleetSpec, ReplicaSpec, simulate_fleet
from core.formulas.kv import MODELS
from core.sim.parallel import PARALLEL_MIN_REQUESTS, run_all
from core.sim.stepmodel import StepModel
from core.workload import Workload

STALENESS_MS = (0, 5, 10, 20, 50, 100, 200, 500, 1000)   # the grid; the page runs it up to a chosen value
STALENESS_POLICIES = ("prefix-aware", "round-robin", "least-requests")


def compressed(workload: Workload, factor: float) -> Workload:
    """The same requests arriving `factor` times as fast (arrival / factor); a client's patience
    (abort_at_ms - arrival) kept. factor 1: the workload itself."""
    if not (isinstance(factor, (int, float)) and math.isfinite(factor) and factor > 0):
        raise ConfigError(f"load multiplier: expected a number > 0, got {factor!r}")
    if factor == 1:
        return workload
    reqs = [dataclasses.replace(r, arrival_ms=r.arrival_ms / factor,
                                abort_at_ms=None if r.abort_at_ms is None
                                else r.arrival_ms / factor + (r.abort_at_ms - r.arrival_ms))
            for r in workload.requests]
    return Workload(reqs, name=f"{workload.name} (arrivals x{factor:g})")


@dataclass(frozen=True)
class FleetSetup:
    """A fleet as the page states it; `spec()` builds the core.fleet FleetSpec."""
    config: SchedulerConfig
    step_model: StepModel
    replicas: int = 4                    # whole replicas (when prefill = decode = 0)
    policy: str = "prefix-aware"
    staleness_ms: float = 0.0
    prefill: int = 0                     # disaggregated: prefill replicas (0: whole replicas)
    decode: int = 0                      # disaggregated: decode replicas
    link_gbps: float = LINK_DEFAULTS["kv_link_gbps"]               # KV link, GB/s (the flags' defaults)
    link_latency_ms: float = LINK_DEFAULTS["kv_link_latency_ms"]
    pd_min_prompt: int = LINK_DEFAULTS["pd_min_prompt"]            # shorter prompts run whole on a decode replica
    model: str = "Llama-2-7B"            # whose KV bytes per token the link moves
    drain_replica: int | None = None     # this replica leaves rotation at drain_ms
    drain_ms: float = 0.0
    seed: int = 0
    load_check: bool = True              # prefix-aware: its load check (off: balance_abs 1e9, as the lesson)

    def __post_init__(self):
        if self.policy not in POLICIES:
            raise ConfigError(f"router policy: expected one of {', '.join(POLICIES)}, got {self.policy!r}")
        if self.model not in MODELS:
            raise ConfigError(f"model: expected one of {', '.join(MODELS)}, got {self.model!r}")
        if (self.prefill > 0) != (self.decode > 0):
            raise ConfigError("disaggregated serving needs at least one prefill and one decode replica")
        n = self.size
        if n < 1:
            raise ConfigError(f"replicas: expected at least 1, got {n}")
        if self.drain_replica is not None and not 0 <= self.drain_replica < n:
            raise ConfigError(f"drain: replica {self.drain_replica} is not in this fleet of {n} "
                              f"(replicas 0..{n - 1})")

    @property
    def disaggregated(self) -> bool:
        return self.prefill > 0

    @property
    def size(self) -> int:
        return self.prefill + self.decode if self.disaggregated else self.replicas

    def describe(self) -> str:
        shape = (f"{self.prefill} prefill + {self.decode} decode replicas (KV over a {self.link_gbps:g} GB/s link, "
                 f"{self.link_latency_ms:g} ms latency, {self.model}"
                 + (f"; prompts under {self.pd_min_prompt} tokens run whole" if self.pd_min_prompt else "") + ")"
                 if self.disaggregated else f"{self.replicas} replica{'s' if self.replicas > 1 else ''}")
        drain = (f"; replica {self.drain_replica} drained at {self.drain_ms:g} ms"
                 if self.drain_replica is not None else "")
        check = " without its load check" if self.policy == "prefix-aware" and not self.load_check else ""
        return f"{shape}, router {self.policy}{check}, staleness {self.staleness_ms:g} ms{drain}"

    def router_params(self) -> dict:
        """The policy's parameters where the page changes them (prefix-aware without its load check)."""
        return {"balance_abs": NO_LOAD_CHECK} if self.policy == "prefix-aware" and not self.load_check else {}

    def spec(self) -> FleetSpec:
        router = RouterConfig(policy=self.policy, staleness_ms=float(self.staleness_ms), seed=int(self.seed),
                              params=self.router_params())
        if self.disaggregated:
            reps = ([ReplicaSpec(self.config, self.step_model, "prefill") for _ in range(self.prefill)]
                    + [ReplicaSpec(self.config, self.step_model, "decode") for _ in range(self.decode)])
        else:
            reps = [ReplicaSpec(self.config, self.step_model) for _ in range(self.replicas)]
        if self.drain_replica is not None:
            reps[self.drain_replica] = dataclasses.replace(reps[self.drain_replica], drain_ms=float(self.drain_ms))
        kv = MODELS[self.model].kv_bytes_per_token(2) if self.disaggregated else None
        return FleetSpec(reps, router, float(self.link_gbps), float(self.link_latency_ms), int(self.pd_min_prompt),
                         kv, self.model if self.disaggregated else None)


def run_fleet(workload: Workload, setup: FleetSetup, record_kv: bool = True, created: str | None = None):
    """The simulated trace of `workload` on the fleet `setup` describes."""
    return simulate_fleet(workload, setup.spec(), created=created, record_kv=record_kv)


def _numbers_job(workload: Workload, setup: FleetSetup, slo: SLO | None) -> dict:
    # a worker process's job: the run's numbers only (no kv rows recorded: the hits come from meta.fleet)
    return fleet_numbers(run_fleet(workload, setup, record_kv=False), slo)


def _run_jobs(jobs: list[dict]) -> list[dict]:
    """_numbers_job over `jobs`: in worker processes when each run is large enough to gain from it (as
    the Schedules page's policies: a run of a few hundred requests takes less than shipping it)."""
    if len(jobs) > 1 and len(jobs[0]["workload"]) >= PARALLEL_MIN_REQUESTS:
        return run_all(_numbers_job, jobs, setup=policy_setup())
    return [_numbers_job(**j) for j in jobs]


def compare_policies(workload: Workload, setup: FleetSetup, policies=POLICIES) -> list[dict]:
    """One run per router policy, everything else as `setup`: [{policy, **fleet_numbers}]."""
    jobs = [dict(workload=workload, setup=dataclasses.replace(setup, policy=p), slo=None) for p in policies]
    return [{"policy": p, **r} for p, r in zip(policies, _run_jobs(jobs))]


def staleness_sweep(workload: Workload, setup: FleetSetup, staleness_ms=STALENESS_MS[:7],
                    policies=STALENESS_POLICIES) -> list[dict]:
    """One run per (policy, staleness): [{policy, staleness_ms, **fleet_numbers}]."""
    grid = [(p, float(s)) for p in policies for s in staleness_ms]
    jobs = [dict(workload=workload, setup=dataclasses.replace(setup, policy=p, staleness_ms=s), slo=None)
            for p, s in grid]
    return [{"policy": p, "staleness_ms": s, **r} for (p, s), r in zip(grid, _run_jobs(jobs))]


def pd_splits(workload: Workload, setup: FleetSetup, total: int, slo: SLO) -> list[dict]:
    """A fixed number of replicas split every way into prefill and decode ones (1:total-1 ...
    total-1:1), and as `total` whole replicas for reference: [{split, prefill, decode, **fleet_numbers}]
    with the SLO's attainment and goodput. The drain of `setup` is left out (its replica may not
    exist in every split)."""
    if not (isinstance(total, int) and 1 <= total <= 64):
        raise ConfigError(f"total replicas: expected an integer in 1..64, got {total!r}")
    base = dataclasses.replace(setup, drain_replica=None)
    shapes = [(f"{p}P:{total - p}D", p, total - p) for p in range(1, total)] + [(f"{total} whole", 0, 0)]
    jobs = [dict(workload=workload, setup=dataclasses.replace(base, prefill=p, decode=d, replicas=total), slo=slo)
            for _, p, d in shapes]
    return [{"split": name, "prefill": p, "decode": d, **r} for (name, p, d), r in zip(shapes, _run_jobs(jobs))]
