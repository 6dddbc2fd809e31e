"""Replicas merged into one fleet trace are placed on one clock from what each trace records of
its clock (core.fleet.clocks), never at offset 0 by assumption (issue 52: two replicas' merged
traces 5,044 ms apart were laid over each other, and the fleet's tok/s came out 160 against the
client's 254). The expected offsets are the differences of the origins written into each trace."""
from __future__ import annotations

import pytest

from core.config import SchedulerConfig
from core.errors import TraceError
from core.fleet.merge import merge_replicas
from core.fleet.sim import FleetSpec, simulate_fleet
from core.sim.stepmodel import StepModel
from core.trace import one_replica
from core.workload import Request, Workload

SM = StepModel(kind="affine", base_ms=5.0, prefill_ms_per_token=0.05, decode_ms_per_seq=0.2)
BOOT = "3f9e5370-80e2-461d-b6fb-0304c0276fde"


@pytest.fixture(scope="module")
def fleet():
    w = Workload([Request(f"r{i}", 10.0 * i, 32, 8) for i in range(12)])
    return simulate_fleet(w, FleetSpec.uniform(2, SchedulerConfig(max_seqs=4), SM))


def _measured(tr, k: int, shift_ms: float, clock: dict | None):
    """Replica k as it would have recorded itself: its times from its own origin, `shift_ms` after
    the fleet's (so the true offset of its origin is shift_ms), its clock as given."""
    p = one_replica(tr, k)
    for name in ("tokens", "finishes", "steps", "kv", "preempts"):
        getattr(p, name)["replica"] = 0
        getattr(p, name)["t_ms"] = getattr(p, name)["t_ms"] - shift_ms
    p.requests["arrival_ms"] = p.requests["arrival_ms"] - shift_ms
    p.other = [e for e in p.other if e["type"] not in ("route", "transfer")]
    p.requests["id"] = [f"req-{i}" for i in range(len(p.requests))]
    p.meta = {**p.meta, "source": "measured"}
    p.meta.pop("clock", None)
    if clock is not None:
        p.meta["clock"] = clock
    return p


def _finish_times(tr, k):
    return sorted(tr.finishes[tr.finishes["replica"] == k]["t_ms"].tolist())


def test_one_hosts_monotonic_clock_places_them_exactly(fleet):
    t0 = 1000.0     # replica 0's origin, seconds since boot; replica 1's: when its first request arrived
    a = _measured(fleet, 0, 0.0, {"kind": "perf_counter", "t0_s": t0, "resolution_ms": 1e-6, "boot_id": BOOT})
    first_arrival = float(one_replica(fleet, 1).requests["arrival_ms"].min())
    assert first_arrival > 0
    b = _measured(fleet, 1, first_arrival, {"kind": "perf_counter", "t0_s": t0 + first_arrival / 1000.0,
                                           "resolution_ms": 1e-6, "boot_id": BOOT})
    m = merge_replicas([a, b], names=["a.json", "b.json"])
    for k in (0, 1):
        assert _finish_times(m, k) == pytest.approx(_finish_times(fleet, k))
    rows = m.meta["fleet"]["alignment"]
    assert [r["offset_ms"] for r in rows] == pytest.approx([0.0, first_arrival])
    assert "monotonic" in rows[1]["how"] and m.meta["clock"]["t0_s"] == t0


def test_epoch_origins_place_them_across_clock_kinds(fleet):
    a = _measured(fleet, 0, 0.0, {"kind": "perf_counter", "t0_s": 5.0, "boot_id": "other-boot",
                                  "epoch_t0_s": 1_765_000_000.25, "resolution_ms": 1e-6})
    b = _measured(fleet, 1, 20.0, {"kind": "epoch", "t0_s": 1_765_000_000.27, "resolution_ms": 0.001})
    m = merge_replicas([a, b])
    assert [r["offset_ms"] for r in m.meta["fleet"]["alignment"]] == pytest.approx([0.0, 20.0], abs=1e-4)
    assert _finish_times(m, 1) == pytest.approx(_finish_times(fleet, 1), abs=1e-4)
    assert m.meta["clock"]["kind"] == "epoch" and m.meta["clock"]["t0_s"] == 1_765_000_000.25


def test_a_replica_whose_clock_cannot_be_placed_is_refused(fleet):
    placed = {"kind": "perf_counter", "t0_s": 1.0, "boot_id": BOOT}
    with pytest.raises(TraceError, match=r"b\.json records no clock \(meta\.clock\): its times cannot be placed"):
        merge_replicas([_measured(fleet, 0, 0.0, placed), _measured(fleet, 1, 0.0, None)], names=["a.json", "b.json"])
    # two hosts' monotonic clocks and no epoch origin: nothing relates them
    with pytest.raises(TraceError, match="without its host's boot id or an epoch origin|cannot be set against"):
        merge_replicas([_measured(fleet, 0, 0.0, placed),
                        _measured(fleet, 1, 0.0, {"kind": "perf_counter", "t0_s": 2.0, "boot_id": "another"})])
    # the offsets given by hand are taken (and said to be given)
    m = merge_replicas([_measured(fleet, 0, 0.0, placed), _measured(fleet, 1, 7.5, None)], offsets_ms=[0.0, 7.5])
    assert _finish_times(m, 1) == pytest.approx(_finish_times(fleet, 1))
    assert m.meta["fleet"]["alignment"][1]["how"].startswith("given")


def test_simulated_replicas_share_the_workloads_clock(fleet):
    parts = [one_replica(fleet, k) for k in (0, 1)]
    for p in parts:
        for name in ("tokens", "finishes", "steps", "kv", "preempts"):
            getattr(p, name)["replica"] = 0
        p.other = [e for e in p.other if e["type"] not in ("route", "transfer")]
        p.requests["id"] = [f"{p.meta['label']}-{i}" for i in range(len(p.requests))]
    m = merge_replicas(parts)
    assert [r["offset_ms"] for r in m.meta["fleet"]["alignment"]] == [0.0, 0.0]
    assert "virtual" in m.meta["fleet"]["alignment"][0]["how"]
