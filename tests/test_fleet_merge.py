"""core.fleet.merge: replicas' own traces joined into one fleet trace. The reference is the
fleet simulator's own merged trace: split into per-replica traces (core.trace.one_replica,
with the fleet marks removed as a replica's own trace would have them) and merged back, every
table must come back row for row."""
from __future__ import annotations

import pandas as pd
import pytest

from core.config import SchedulerConfig
from core.errors import TraceError
from core.fleet.merge import merge_replicas
from core.fleet.router import RouterConfig
from core.fleet.sim import FleetSpec, simulate_fleet
from core.sim.stepmodel import StepModel
from core.trace import one_replica, save_trace
from core.trace.jsoncodec import to_doc
from core.trace.validate import trace_from_doc
from core.workload import load_workload

SM = StepModel(kind="affine", base_ms=5.0, prefill_ms_per_token=0.05, decode_ms_per_seq=0.2)


@pytest.fixture(scope="module")
def workload():
    return load_workload("data/workloads/shared_prefix_200.json")


def _own(tr, k, rename=False):
    """Replica k of a fleet trace as that replica would have recorded it alone."""
    p = one_replica(tr, k)
    for name in ("tokens", "finishes", "steps", "kv", "preempts"):
        getattr(p, name)["replica"] = 0
    p.other = [e for e in p.other if e["type"] not in ("route", "transfer")]
    if rename:
        p.requests["id"] = [f"req-{i}" for i in range(len(p.requests))]
    return p


def _same(a, b, key):
    a = a.sort_values(key, kind="stable").reset_index(drop=True)
    b = b.sort_values(key, kind="stable").reset_index(drop=True)
    pd.testing.assert_frame_equal(a[sorted(a.columns)], b[sorted(b.columns)], check_dtype=False,
                                  check_categorical=False)


@pytest.mark.parametrize("shape", ["uniform", "disagg"])
def test_split_and_merged_back_is_the_fleet_trace(workload, shape):
    cfg = SchedulerConfig(policy="vllm-v1", kv_blocks=400, prefix_caching=True)
    spec = (FleetSpec.uniform(3, cfg, SM, router=RouterConfig("least-requests")) if shape == "uniform" else
            FleetSpec.disagg(1, 2, cfg, SM, router=RouterConfig("round-robin"), kv_bytes_per_token=1000, model="x"))
    tr = simulate_fleet(workload, spec)
    roles = [r.role for r in spec.replicas]
    parts = [_own(tr, k) for k in range(len(roles))]
    front = [e for e in tr.other if e["type"] in ("route", "transfer")]
    m = merge_replicas(parts, roles=roles, requests=tr.requests, other=front)
    for name, key in (("tokens", ["t_ms", "replica", "req"]), ("finishes", ["t_ms", "replica", "req"]),
                      ("steps", ["step"]), ("batch", ["step", "req"]), ("kv", ["t_ms", "replica", "block", "op"]),
                      ("preempts", ["t_ms", "replica", "req"])):
        _same(getattr(tr, name), getattr(m, name), key)
    assert len(m.events_of("route")) == len(workload)
    assert [r["role"] for r in m.meta["fleet"]["replicas"]] == roles
    trace_from_doc(to_doc(m), "merged")          # a valid serving-trace/1 document


def test_without_the_front_end_the_requests_are_the_replicas_union(workload):
    """Replicas started on their own (another router in front) number requests alike: the clash
    is resolved per replica, and each request is on the replica that served it."""
    cfg = SchedulerConfig(policy="vllm-v1", kv_blocks=400, prefix_caching=True)
    tr = simulate_fleet(workload, FleetSpec.uniform(2, cfg, SM, router=RouterConfig("round-robin")))
    parts = [_own(tr, k, rename=True) for k in range(2)]
    m = merge_replicas(parts)
    assert len(m.requests) == len(workload)
    ids = m.requests["id"].tolist()
    assert ids[:4] == ["r0/req-0", "r1/req-0", "r0/req-1", "r1/req-1"]    # round-robin, in arrival order
    fin = m.finishes.sort_values("req")
    assert fin["replica"].tolist() == [0, 1] * (len(workload) // 2)
    assert (m.requests["arrival_ms"].to_numpy() == tr.requests["arrival_ms"].to_numpy()).all()


def test_refusals(workload, tmp_path):
    cfg = SchedulerConfig(policy="vllm-v1", kv_blocks=400)
    tr = simulate_fleet(workload, FleetSpec.uniform(2, cfg, SM))
    with pytest.raises(TraceError, match="already a fleet trace"):
        merge_replicas([tr, _own(tr, 1)])
    with pytest.raises(TraceError, match="roles"):
        merge_replicas([_own(tr, 0), _own(tr, 1)], roles=["both"])
    with pytest.raises(TraceError, match="not one the front end accepted"):
        merge_replicas([_own(tr, 0)], requests=tr.requests.iloc[:3])


def test_cli(workload, tmp_path, capsys):
    from core.__main__ import main
    cfg = SchedulerConfig(policy="vllm-v1", kv_blocks=400)
    tr = simulate_fleet(workload, FleetSpec.uniform(2, cfg, SM))
    files = []
    for k in range(2):
        files.append(str(tmp_path / f"r{k}.json"))
        save_trace(_own(tr, k, rename=True), files[-1])
    out = str(tmp_path / "m.json")
    assert main(["fleet-merge", *files, "--out", out, "--offsets-ms", "0,1.5"]) == 0
    assert "finished per replica: 0: 100, 1: 100" in capsys.readouterr().out
    from core.trace import load_trace
    m = load_trace(out)
    one = m.finishes[m.finishes["replica"] == 1]["t_ms"].sort_values().to_numpy()
    ref = tr.finishes[tr.finishes["replica"] == 1]["t_ms"].sort_values().to_numpy()
    assert one == pytest.approx(ref + 1.5)
    assert main(["fleet-merge", *files, "--out", out, "--roles", "both"]) == 2
    assert "expected 2 of both, prefill, decode" in capsys.readouterr().err
    assert main(["fleet-merge", files[0], files[0], "--out", out]) == 2
    assert "is given twice (as replica 0 and 1)" in capsys.readouterr().err


def test_disaggregated_replicas_merged_without_the_front_end(workload):
    """Prefill and decode replicas' own traces alone: each request once, its output count from
    its decode replica (the prefill copy asked one token), its arrival the prefill copy's."""
    cfg = SchedulerConfig(policy="vllm-v1", kv_blocks=400)
    tr = simulate_fleet(workload, FleetSpec.disagg(1, 2, cfg, SM, kv_bytes_per_token=1000, model="x"))
    parts = [_own(tr, k) for k in range(3)]
    m = merge_replicas(parts, roles=["prefill", "decode", "decode"])
    assert sorted(m.requests["id"]) == sorted(tr.requests["id"])
    ref = tr.requests.set_index("id")
    got = m.requests.set_index("id").loc[ref.index]
    assert (got["max_output_tokens"] == ref["max_output_tokens"]).all()
    assert (got["arrival_ms"] == ref["arrival_ms"]).all()
    assert set(m.tokens["replica"]) <= {1, 2} and len(m.finishes) == len(workload)
    trace_from_doc(to_doc(m), "merged")          # loads: no request has more tokens than it asked
