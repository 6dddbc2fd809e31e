"""The fleet simulator as a measured fleet ran it: sent by a closed loop of clients (a closed loop
predicted as one), and replicas sharing a host's cores (FleetSpec.contention), with the
contention measured on a fleet's own steps (core.fit.fleet.contention)."""
import numpy as np
import pandas as pd
import pytest

from core.config import SchedulerConfig
from core.errors import ConfigError
from core.experiments.sweep import simulate_closed
from core.fit.fleet import fit_fleet, others_busy
from core.fleet.router import RouterConfig
from core.fleet.sim import FleetSpec, simulate_fleet
from core.sim.stepmodel import StepModel
from core.workload import Request, Workload

CFG = SchedulerConfig(policy="continuous", max_seqs=16, token_budget=2048, chunk=2048, kv_blocks=4096)
FLAT = StepModel("affine", base_ms=10.0, prefill_ms_per_token=0.0, decode_ms_per_seq=0.0)


def one_token(n: int, at=0.0) -> Workload:
    return Workload([Request(f"r{i}", float(at if np.ndim(at) == 0 else at[i]), 4, 1) for i in range(n)])


def poisson(n: int, gap_ms: float, seed: int) -> Workload:
    rng = np.random.default_rng(seed)
    t = np.cumsum(rng.exponential(gap_ms, n))
    return Workload([Request(f"r{i}", float(t[i]), int(rng.integers(16, 200)), int(rng.integers(4, 40)))
                     for i in range(n)])


def test_a_closed_loop_sends_each_later_request_a_delay_after_a_finish_by_hand():
    # 2 replicas, round-robin, every step 10 ms, one token each: r0, r1 at 0 finish at 10 on either
    # replica; the first finish sends r2 5 ms later (15), the second r3 0 ms later but not before r2
    tr = simulate_fleet(one_token(4), FleetSpec.uniform(2, CFG, FLAT, router=RouterConfig("round-robin")),
                        concurrency=2, delay_ms=[5.0, 0.0])
    assert tr.requests["arrival_ms"].tolist() == [0.0, 0.0, 15.0, 15.0]
    fin = tr.finishes.sort_values("req")
    assert fin["t_ms"].tolist() == [10.0, 10.0, 25.0, 25.0]
    assert [e["replica"] for e in tr.events_of("route")] == [0, 1, 0, 1]
    assert tr.meta["load"] == {"kind": "closed", "concurrency": 2, "first_sends": "as given"}


def test_a_closed_loop_on_one_replica_is_the_single_engines_closed_loop():
    """Another code path for the same thing: core.experiments.sweep's ClosedLoop inbox on one engine."""
    w = poisson(60, 20.0, 3)
    sm = StepModel("affine", base_ms=2.0, prefill_ms_per_token=0.02, decode_ms_per_seq=0.3)
    delays = np.linspace(0.5, 3.0, 56)
    one, _ = simulate_closed(w, CFG, sm, 4, delay_ms=delays, first_as_given=True)
    fleet = simulate_fleet(w, FleetSpec.uniform(1, CFG, sm), concurrency=4, delay_ms=delays)
    assert fleet.requests["arrival_ms"].tolist() == one.requests["arrival_ms"].tolist()
    for name in ("tokens", "finishes"):
        a, b = getattr(one, name), getattr(fleet, name)
        pd.testing.assert_frame_equal(a[["t_ms", "req"]].reset_index(drop=True),
                                      b[["t_ms", "req"]].reset_index(drop=True))


def test_closed_loop_settings_are_checked():
    spec = FleetSpec.uniform(2, CFG, FLAT)
    with pytest.raises(ConfigError, match="concurrency"):
        simulate_fleet(one_token(3), spec, concurrency=0)
    with pytest.raises(ConfigError, match="delay_ms"):
        simulate_fleet(one_token(3), spec, concurrency=1, delay_ms=-1.0)
    with pytest.raises(ConfigError, match="contention"):
        FleetSpec.uniform(2, CFG, FLAT, contention=-0.1)


def test_a_step_is_slower_by_the_contention_for_each_other_replica_mid_step_by_hand():
    # r0 at 0 on replica 0: alone, 10 ms; r1 at 5 on replica 1 while replica 0 is mid-step: 10 x 1.5
    tr = simulate_fleet(one_token(2, [0.0, 5.0]),
                        FleetSpec.uniform(2, CFG, FLAT, router=RouterConfig("round-robin"), contention=0.5))
    assert tr.finishes.sort_values("req")["t_ms"].tolist() == [10.0, 20.0]
    assert tr.meta["fleet"]["contention"] == 0.5
    # r1 at 10, when replica 0's step has just ended: alone again
    tr = simulate_fleet(one_token(2, [0.0, 10.0]),
                        FleetSpec.uniform(2, CFG, FLAT, router=RouterConfig("round-robin"), contention=0.5))
    assert tr.finishes.sort_values("req")["t_ms"].tolist() == [10.0, 20.0]


def test_two_steps_starting_together_do_not_slow_each_other():
    # r0 and r1 at 0 on replicas 0 and 1: neither was mid-step when the other started (either order)
    tr = simulate_fleet(one_token(2, [0.0, 0.0]),
                        FleetSpec.uniform(2, CFG, FLAT, router=RouterConfig("round-robin"), contention=1.0))
    assert tr.finishes.sort_values("req")["t_ms"].tolist() == [10.0, 10.0]
    assert others_busy(tr, 0).tolist() == [0] and others_busy(tr, 1).tolist() == [0]


def test_others_busy_counts_the_other_replicas_mid_step_at_each_start():
    tr = simulate_fleet(one_token(3, [0.0, 5.0, 12.0]),
                        FleetSpec.uniform(2, CFG, FLAT, router=RouterConfig("round-robin")))
    st = tr.steps.sort_values("t_ms")
    assert st["t_ms"].tolist() == [0.0, 5.0, 12.0] and st["replica"].tolist() == [0, 1, 0]
    assert others_busy(tr, 0).tolist() == [0, 1]    # (at 12, replica 1's step 5..15 runs)
    assert others_busy(tr, 1).tolist() == [1]


def test_the_contention_planted_in_a_simulated_fleet_is_found_and_none_where_there_is_none():
    w = poisson(400, 40.0, 1)
    sm = StepModel("affine", base_ms=2.0, prefill_ms_per_token=0.02, decode_ms_per_seq=0.3)
    shared = simulate_fleet(w, FleetSpec.uniform(2, CFG, sm, router=RouterConfig("round-robin"), contention=0.3))
    sm_fit, rep = fit_fleet(shared)["both"]
    assert rep["contention"] == pytest.approx(0.3, abs=0.01)
    assert sm_fit.decode_ms_per_seq == pytest.approx(0.3, rel=0.02)
    alone = simulate_fleet(w, FleetSpec.uniform(2, CFG, sm, router=RouterConfig("round-robin")))
    assert fit_fleet(alone)["both"][1]["contention"] == 0.0
    assert fit_fleet(shared, shared=False)["both"][1]["contention"] == 0.0
