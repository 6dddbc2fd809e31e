"""A fleet whose routes are decided ahead (round-robin, random) runs each replica apart, as one
engine over its requests (core.fleet.apart.run_apart), and reads back what the router
heard of each replica at each arrival. The oracle is the fleet's own loop, which steps all
replicas on one clock and tells the router as each step ends (`sim.apart = False`): every
table, every route event (signals, as-of times) and the metadata must be equal."""
import numpy as np
import pandas as pd
import pytest

from core.config import SchedulerConfig
from core.fleet.router import RouterConfig
from core.fleet.sim import FleetSim, FleetSpec, ReplicaSpec
from core.sim.stepmodel import StepModel
from core.workload import Request, Workload, load_workload

AFFINE = StepModel(kind="affine", base_ms=5.0, prefill_ms_per_token=0.02, decode_ms_per_seq=0.05)
TABLES = ("tokens", "finishes", "steps", "batch", "kv", "preempts")


def _both(w: Workload, spec: FleetSpec):
    out = []
    for apart in (True, False):
        sim = FleetSim(w, spec)
        assert sim.apart, "routes decided ahead: the fleet runs its replicas apart"
        sim.apart = apart
        sim.run()
        out.append(sim.trace(created="2026-01-01T00:00:00+00:00"))
    return out


def _equal(a, b):
    for t in TABLES:
        pd.testing.assert_frame_equal(getattr(a, t), getattr(b, t))
    assert a.other == b.other
    assert a.meta == b.meta


def _workload(n: int = 300, seed: int = 3, gap_ms: float = 9.0, extras: bool = False) -> Workload:
    rng = np.random.default_rng(seed)
    t = np.cumsum(rng.exponential(gap_ms, n))
    t[5:9] = t[5]          # simultaneous arrivals
    reqs = []
    for k in range(n):
        extra = {}
        if extras and k % 7 == 3:
            extra = {"abort_at_ms": float(t[k]) + 40.0}
        elif extras and k % 5 == 1:
            extra = {"deadline_ms": 80.0}
        p = int(rng.integers(1, 300))
        ids = tuple(int(x) for x in rng.integers(0, 50, p)) if k % 3 else tuple(range(p))   # some shared prefixes
        reqs.append(Request(f"r{k}", float(t[k]), p, int(rng.integers(1, 90)), prompt_ids=ids, **extra))
    return Workload(reqs, name="apart")


@pytest.mark.parametrize("n", [1, 2, 4])
@pytest.mark.parametrize("policy", ["round-robin", "random"])
@pytest.mark.parametrize("staleness,hop", [(0.0, 0.0), (7.0, 0.0), (0.0, 2.5), (12.0, 3.0)])
def test_apart_equals_the_fleet_loop(n, policy, staleness, hop):
    cfg = SchedulerConfig(policy="continuous", max_seqs=16, token_budget=512, chunk=128, kv_blocks=120)
    spec = FleetSpec.uniform(n, cfg, AFFINE, router=RouterConfig(policy, staleness_ms=staleness, seed=5),
                             dispatch_ms=hop)
    a, b = _both(_workload(), spec)
    assert len(a.events_of("route")) == 300
    _equal(a, b)


def test_apart_with_cancellations_deadlines_preemption_prefix_cache_and_queue_limit():
    # a small pool (preemptions), prefix caching (shared blocks, evictions), an engine queue limit
    # (rejections stamped at a step's start), cancellations and deadlines: all told back the same
    cfg = SchedulerConfig(policy="continuous", max_seqs=8, token_budget=256, chunk=64, kv_blocks=40,
                          prefix_caching=True, queue_limit=6)
    w = _workload(240, seed=11, gap_ms=4.0, extras=True)
    for staleness in (0.0, 5.0):
        a, b = _both(w, FleetSpec.uniform(3, cfg, AFFINE, router=RouterConfig("round-robin", staleness_ms=staleness)))
        reasons = set(a.finishes["reason"])
        assert {"abort", "deadline", "rejected"} <= reasons, reasons
        assert a.meta["stats"]["preemptions"] > 0
        _equal(a, b)


def test_apart_with_drained_replicas_rejects_as_the_loop_does():
    cfg = SchedulerConfig(policy="continuous", max_seqs=16, token_budget=512, chunk=128, kv_blocks=200)
    w = _workload(120)
    last = float(w.arrival_ms[60])
    spec = FleetSpec([ReplicaSpec(cfg, AFFINE, drain_ms=last), ReplicaSpec(cfg, AFFINE, drain_ms=last / 2)])
    a, b = _both(w, spec)
    rejected = [e for e in a.events_of("route") if e["stage"] == "rejected"]
    assert len(rejected) == int((w.arrival_ms >= last).sum())   # nothing in rotation after the last drain
    _equal(a, b)


def test_apart_on_a_bundled_workload_with_shared_prefixes():
    w = load_workload("data/workloads/shared_prefix_200.json")
    cfg = SchedulerConfig(prefix_caching=True, kv_blocks=300)
    a, b = _both(w, FleetSpec.uniform(4, cfg, AFFINE, router=RouterConfig("random", staleness_ms=20.0)))
    _equal(a, b)


def test_signals_read_back_are_what_each_replica_reported():
    # independent of both paths: one replica, staleness 0, requests one at a time far apart: each
    # arrival sees the replica idle with everything before it finished
    reqs = [Request(f"q{k}", 1000.0 * k, 32, 4) for k in range(5)]
    sim = FleetSim(Workload(reqs, name="far"), FleetSpec.uniform(1, SchedulerConfig(), StepModel(step_ms=1.0)))
    sim.run()
    for e in sim.trace().events_of("route"):
        s = e["signals"]["0"]
        assert (s["requests"], s["running"], s["waiting"], s["kv_usage"]) == (0, 0, 0, 0.0)
        if e["t_ms"] > 0:   # the last news: the previous request's last step's end (4 steps of 1 ms)
            assert s["as_of_ms"] == e["t_ms"] - 1000.0 + 4.0
