"""A fleet as the simulator (core.fleet.sim) is given it: its replicas (engine options, step model,
role, drain time), the router, the KV link of disaggregated serving, the dispatch hop and the
replicas' contention for a shared host; and a routed request as it reaches its replica."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from core.config import SchedulerConfig
from core.engine.admission import blocks_needed
from core.errors import ConfigError
from core.fleet.router import ROLES, RouterConfig, check_roles
from core.sim.stepmodel import StepModel
from core.workload import Request, Workload

FIRST_TOKEN = ("decode replica (vLLM's disaggregated convention: it recomputes the prompt's last token and "
               "emits token 0; the prefill replica's token is discarded)")


@dataclass
class ReplicaSpec:
    config: SchedulerConfig
    step_model: StepModel | None = None
    role: str = "both"
    drain_ms: float | None = None       # taken out of rotation at this time: nothing routed after it

    def __post_init__(self):
        if self.role not in ROLES:
            raise ConfigError(f"replica role: expected one of {', '.join(ROLES)}, got {self.role!r}")


@dataclass
class FleetSpec:
    replicas: list[ReplicaSpec]
    router: RouterConfig = field(default_factory=RouterConfig)
    link_gbps: float = 25.0              # GB/s (BLIS's default 25 GB/s)
    link_latency_ms: float = 0.05        # BLIS's 0.05 ms
    pd_min_prompt: int = 0               # disaggregated: shorter prompts run whole on a decode replica
    kv_bytes_per_token: int | None = None   # disaggregated: the model's KV bytes per token
    model: str | None = None             # where kv_bytes_per_token came from
    dispatch_ms: float = 0.0             # router to replica: a routed request reaches its engine this much later
    contention: float = 0.0              # replicas sharing a host's cores: a step takes 1 + contention x (other
    #                                      replicas mid-step at its start) times its priced duration

    def __post_init__(self):
        if not self.replicas:
            raise ConfigError("a fleet needs at least one replica")
        check_roles([r.role for r in self.replicas], "replica roles")
        if self.disaggregated:
            if not self.kv_bytes_per_token or self.kv_bytes_per_token < 1:
                raise ConfigError("disaggregated serving needs the model's KV bytes per token (--model PRESET)")
        if isinstance(self.pd_min_prompt, bool) or not isinstance(self.pd_min_prompt, int) or self.pd_min_prompt < 0:
            raise ConfigError(f"pd_min_prompt: expected an integer >= 0, got {self.pd_min_prompt!r}")
        if not (isinstance(self.dispatch_ms, (int, float)) and 0 <= self.dispatch_ms < 1e6):
            raise ConfigError(f"dispatch_ms: expected a number of ms from 0 to 1e6, got {self.dispatch_ms!r}")
        if isinstance(self.contention, bool) or not (isinstance(self.contention, (int, float))
                                                     and 0 <= self.contention <= 100):
            raise ConfigError(f"contention: expected a number from 0 to 100, got {self.contention!r}")

    @property
    def disaggregated(self) -> bool:
        return any(r.role != "both" for r in self.replicas)

    @classmethod
    def uniform(cls, n: int, config: SchedulerConfig, step_model: StepModel | None = None, **kw) -> FleetSpec:
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ConfigError(f"replicas: expected an integer >= 1, got {n!r}")
        return cls([ReplicaSpec(config, step_model) for _ in range(n)], **kw)

    @classmethod
    def disagg(cls, p: int, d: int, config: SchedulerConfig, step_model: StepModel | None = None, **kw) -> FleetSpec:
        for name, v in (("prefill replicas", p), ("decode replicas", d)):
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ConfigError(f"{name}: expected an integer >= 1, got {v!r}")
        return cls([ReplicaSpec(config, step_model, "prefill") for _ in range(p)]
                   + [ReplicaSpec(config, step_model, "decode") for _ in range(d)], **kw)


def sized(fleet: FleetSpec, w: Workload) -> FleetSpec:
    """Replicas whose KV pool is unset get what one engine would for the whole workload
    (enough for every request at once), as core.engine.admission.pool_blocks gives it."""
    if all(r.config.kv_blocks is not None for r in fleet.replicas):
        return fleet
    out = []
    for r in fleet.replicas:
        if r.config.kv_blocks is None:
            need = blocks_needed(w.prompt_tokens, w.max_output_tokens, r.config.block_size)
            r = dataclasses.replace(r, config=dataclasses.replace(r.config, kv_blocks=max(1, int(need.sum()))))
        out.append(r)
    return dataclasses.replace(fleet, replicas=out)


def reaching(r: Request, now: float, at: float | None) -> tuple[Request, float]:
    """Request r, routed at `now`, as it reaches its replica's engine at `at` (None: now): its
    arrival then, its deadline still counted from the client's arrival."""
    if at is not None and at != now:
        r = Request(r.id, at, r.prompt_tokens, r.max_output_tokens, r.prompt_ids, r.tenant,
                    abort_at_ms=r.abort_at_ms,
                    deadline_ms=None if r.deadline_ms is None else max(1e-6, r.arrival_ms + r.deadline_ms - at),
                    priority=r.priority)
        now = at
    if r.arrival_ms != now:   # (a decode replica's copy: the client's deadline still counts from its arrival)
        left = None if r.deadline_ms is None else max(1e-6, r.arrival_ms + r.deadline_ms - now)
        r = Request(r.id, now, r.prompt_tokens, r.max_output_tokens, r.prompt_ids, r.tenant,
                    abort_at_ms=r.abort_at_ms, deadline_ms=left, priority=r.priority)
    return r, now
