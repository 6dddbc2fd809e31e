"""The fleet simulator (core.fleet): a router in front of several engine cores on one clock,
and disaggregated prefill/decode with the KV cache moved over a shared link. Expectations are
computed independently (the i-th arrival's replica under round-robin, the link's arithmetic by
hand, the single engine's own trace)."""
import math

import numpy as np
import pandas as pd
import pytest

from core.config import SchedulerConfig
from core.errors import ConfigError
from core.fleet.link import Link
from core.fleet.router import POLICIES, RouterConfig
from core.fleet.sim import FleetSim, FleetSpec, ReplicaSpec, simulate_fleet
from core.formulas.kv import MODELS
from core.sim.simulate import simulate
from core.sim.stepmodel import StepModel
from core.trace import to_doc, to_parquet_bytes, trace_from_doc, trace_from_parquet
from core.workload import Request, Workload, load_workload

SHARED = "data/workloads/shared_prefix_200.json"
AFFINE = StepModel(kind="affine", base_ms=5.0, prefill_ms_per_token=0.05, decode_ms_per_seq=0.2)
TABLES = ("tokens", "finishes", "steps", "batch", "kv", "preempts")


@pytest.fixture(scope="module")
def shared():
    return load_workload(SHARED)


def check_trace(tr):
    """The trace passes the loader's checks (JSON and Parquet) and comes back equal."""
    for back in (trace_from_doc(to_doc(tr), "fleet"), trace_from_parquet(to_parquet_bytes(tr), "fleet")):
        for t in TABLES:
            pd.testing.assert_frame_equal(getattr(tr, t).reset_index(drop=True),
                                          getattr(back, t).reset_index(drop=True), check_categorical=False)
        assert [e["type"] for e in back.other] == [e["type"] for e in tr.other]
        assert back.meta["fleet"] == tr.meta["fleet"]


def _run(w, spec, **kw):
    sim = FleetSim(w, spec, **kw)
    sim.run()
    return sim, sim.trace()


@pytest.mark.parametrize("policy", POLICIES)
def test_one_replica_is_the_single_engine_trace(shared, policy):
    cfg = SchedulerConfig(prefix_caching=True, kv_blocks=600)
    one = simulate(shared, cfg, AFFINE)
    fleet = simulate_fleet(shared, FleetSpec.uniform(1, cfg, AFFINE, router=RouterConfig(policy, seed=3)))
    for t in TABLES:
        pd.testing.assert_frame_equal(getattr(one, t).reset_index(drop=True), getattr(fleet, t).reset_index(drop=True))
    assert len(fleet.events_of("route")) == len(shared)


def test_round_robin_sends_the_ith_arrival_to_replica_i_mod_n(shared):
    sim, tr = _run(shared, FleetSpec.uniform(3, SchedulerConfig(), AFFINE, router=RouterConfig("round-robin")))
    routes = tr.events_of("route")
    order = {rid: k for k, rid in enumerate(shared.ids)}           # arrival order
    assert sorted(order[e["req"]] for e in routes) == list(range(len(shared)))
    for e in routes:
        assert e["replica"] == order[e["req"]] % 3
    # the replica every token and finish of a request carries is the one it was routed to
    want = np.array([order[e["req"]] % 3 for e in sorted(routes, key=lambda e: order[e["req"]])])
    assert (tr.finishes.set_index("req").sort_index()["replica"].to_numpy() == want).all()
    assert (tr.tokens["replica"].to_numpy() == want[tr.tokens["req"].to_numpy()]).all()


@pytest.mark.parametrize("policy", POLICIES)
def test_every_request_routed_once_finishes_once_and_each_pool_is_conserved(shared, policy):
    cfg = SchedulerConfig(prefix_caching=True, kv_blocks=120)   # tight: preemptions and evictions happen
    sim, tr = _run(shared, FleetSpec.uniform(4, cfg, AFFINE, router=RouterConfig(policy, seed=7)))
    routes = tr.events_of("route")
    assert sorted(e["req"] for e in routes) == sorted(shared.ids)
    assert tr.finishes["req"].value_counts().max() == 1 and len(tr.finishes) == len(shared)
    for rep in sim.replicas:
        rep.core.scheduler.kv.check()                                   # refcounts, free list, prefix cache
        assert rep.core.scheduler.kv.num_free == rep.core.scheduler.kv.num_blocks   # everything returned at the end
        # the trace's own block ledger per replica: every allocation freed
        kv = tr.kv[tr.kv["replica"] == rep.index]
        assert int((kv.op == "alloc").sum()) + int((kv.op == "hit").sum()) == int((kv.op == "free").sum())
    check_trace(tr)
    # each replica's steps are its own: a request's batch entries all on the replica it was routed to
    step_rep = tr.steps.set_index("step")["replica"]
    routed = {order: e["replica"] for order, e in ((shared.ids.index(e["req"]), e) for e in routes)}
    b = tr.batch
    assert (step_rep.loc[b["step"]].to_numpy() == np.array([routed[r] for r in b["req"].tolist()])).all()


def test_steps_numbered_fleet_wide_in_time_order(shared):
    _, tr = _run(shared, FleetSpec.uniform(2, SchedulerConfig(), AFFINE))
    s = tr.steps
    assert s["step"].tolist() == list(range(len(s)))
    assert (np.diff(s["t_ms"].to_numpy()) >= 0).all()


def test_link_alone_is_latency_plus_bytes_over_bandwidth():
    link = Link(25.0, 0.05)                       # 25 GB/s = 25e6 bytes per ms
    link.add("a", 50_000_000, 10.0)
    done = link.pop_done(math.inf)
    assert len(done) == 1
    key, start, end, nbytes = done[0]
    assert end - start == pytest.approx(0.05 + 50_000_000 / 25e6, abs=1e-9)   # 2.05 ms


def test_link_shares_fairly_between_overlapping_transfers():
    link = Link(1.0, 0.0)                         # 1e6 bytes per ms
    link.add("a", 4_000_000, 0.0)                 # alone for 1 ms: 1e6 sent, 3e6 left
    link.add("b", 2_000_000, 1.0)                 # then both at 0.5e6/ms
    done = {k: (s, e) for k, s, e, _ in link.pop_done(math.inf)}
    # b: 2e6 at 0.5e6/ms -> ends at 5 ms; a: 3e6 - 2e6 = 1e6 left at 5 ms, alone -> ends at 6 ms
    assert done["b"] == (1.0, pytest.approx(5.0))
    assert done["a"] == (0.0, pytest.approx(6.0))
    # each took longer than alone (a: 4 ms alone, b: 2 ms alone)
    assert done["a"][1] - 0.0 > 4.0 and done["b"][1] - 1.0 > 2.0


def _pd_workload():
    # two prompts of 64 tokens (4 blocks of 16) arriving together, distinct ids: nothing shared
    reqs = [Request(f"r{i}", 0.0, 64, 4, prompt_ids=tuple(range(1000 * i, 1000 * i + 64))) for i in range(2)]
    return Workload(reqs, name="pd2")


def test_pd_transfer_bytes_and_fair_share_and_decode_waits_for_it():
    bpt = MODELS["Llama-2-7B"].kv_bytes_per_token()   # 2 x 32 layers x 32 heads x 128 x 2 bytes = 524,288
    assert bpt == 2 * 32 * 32 * 128 * 2
    cfg = SchedulerConfig(prefix_caching=True)
    spec = FleetSpec.disagg(1, 1, cfg, StepModel(step_ms=1.0), router=RouterConfig("round-robin"),
                            kv_bytes_per_token=bpt, model="Llama-2-7B", link_gbps=1.0, link_latency_ms=0.5)
    sim, tr = _run(_pd_workload(), spec)
    xs = tr.events_of("transfer")
    assert len(xs) == 2
    nbytes = 4 * 16 * bpt                               # 4 blocks of 16 tokens each
    for e in xs:
        assert (e["src"], e["dst"], e["blocks"], e["bytes"]) == (0, 1, 4, nbytes)
        assert e["t_ms"] == 1.0                          # both prompts prefilled in the first 1-ms step
    # started together, equal sizes: each gets half the link: 0.5 + 2 * bytes / 1e6 per ms
    for e in xs:
        assert e["dur_ms"] == pytest.approx(0.5 + 2 * nbytes / 1e6)
    # no decode step of a request starts before its transfer ended; its tokens all on the decode replica
    steps = tr.steps.set_index("step")
    for e in xs:
        row = tr.ids.index(e["req"])
        mine = tr.batch[tr.batch["req"] == row]
        on_dst = steps.loc[mine["step"]]
        decode_steps = on_dst[on_dst["replica"] == 1]
        assert len(decode_steps) and (decode_steps["t_ms"] >= e["t_ms"] + e["dur_ms"] - 1e-9).all()
        toks = tr.tokens[tr.tokens["req"] == row]
        assert (toks["replica"] == 1).all() and toks["index"].tolist() == [0, 1, 2, 3]
        # the first token comes from the decode replica's first step (it recomputes the last prompt token)
        first = decode_steps.iloc[0]
        assert toks["t_ms"].iloc[0] == pytest.approx(first["t_ms"] + first["dur_ms"])
    # the prefill replica's token (discarded) and finish never reach the trace
    assert (tr.finishes["replica"] == 1).all() and len(tr.finishes) == 2
    check_trace(tr)
    for rep in sim.replicas:
        rep.core.scheduler.kv.check()


def test_pd_sends_only_blocks_the_decode_side_lacks():
    bpt = 1000
    shared_ids = tuple(range(32))                      # two blocks of 16 shared by both prompts
    reqs = [Request("a", 0.0, 48, 2, prompt_ids=shared_ids + tuple(range(100, 116))),
            Request("b", 50.0, 48, 2, prompt_ids=shared_ids + tuple(range(200, 216)))]
    spec = FleetSpec.disagg(1, 1, SchedulerConfig(prefix_caching=True), StepModel(step_ms=1.0),
                            kv_bytes_per_token=bpt, link_gbps=1.0, link_latency_ms=0.0)
    _, tr = _run(Workload(reqs, name="w"), spec)
    got = {e["req"]: (e["blocks"], e["bytes"]) for e in tr.events_of("transfer")}
    assert got == {"a": (3, 3 * 16 * bpt), "b": (1, 16 * bpt)}   # b: the decode replica holds the shared two


def test_conditional_disaggregation_runs_short_prompts_whole_on_a_decode_replica():
    reqs = [Request("short", 0.0, 20, 3, prompt_ids=tuple(range(20))),
            Request("long", 0.0, 80, 3, prompt_ids=tuple(range(500, 580)))]
    spec = FleetSpec.disagg(1, 1, SchedulerConfig(), StepModel(step_ms=1.0), kv_bytes_per_token=10,
                            pd_min_prompt=50)
    _, tr = _run(Workload(reqs, name="w"), spec)
    routes = {e["req"]: e for e in tr.events_of("route")}
    assert routes["short"]["stage"] == "whole" and routes["short"]["replica"] == 1
    assert routes["long"]["stage"] == "prefill" and (routes["long"]["replica"], routes["long"]["decode"]) == (0, 1)
    assert [e["req"] for e in tr.events_of("transfer")] == ["long"]


def test_a_drained_replica_gets_no_route_after_its_drain(shared):
    cfg = SchedulerConfig()
    drain = float(shared.arrival_ms[60])
    spec = FleetSpec([ReplicaSpec(cfg, AFFINE), ReplicaSpec(cfg, AFFINE, drain_ms=drain), ReplicaSpec(cfg, AFFINE)],
                     router=RouterConfig("round-robin"))
    _, tr = _run(shared, spec)
    routes = tr.events_of("route")
    assert any(e["replica"] == 1 for e in routes if e["t_ms"] < drain)
    assert not any(e["replica"] == 1 for e in routes if e["t_ms"] >= drain)
    # what it held, it finished
    assert len(tr.finishes) == len(shared) and (tr.finishes["reason"] == "length").all()


def test_every_replica_drained_rejects_at_the_router():
    reqs = [Request("a", 0.0, 8, 2), Request("b", 10.0, 8, 2)]
    spec = FleetSpec([ReplicaSpec(SchedulerConfig(), drain_ms=5.0)])
    _, tr = _run(Workload(reqs, name="w"), spec)
    f = tr.finishes.set_index("req")
    assert f.loc[1, "reason"] == "rejected" and f.loc[1, "replica"] == -1
    assert "drained" in tr.events_of("route")[1]["reason"]
    check_trace(tr)


def test_router_queue_limit_rejects_over_it():
    reqs = [Request(f"r{i}", 0.0, 64, 50) for i in range(10)]
    cfg = SchedulerConfig(max_seqs=1)
    spec = FleetSpec.uniform(2, cfg, StepModel(step_ms=1.0), router=RouterConfig("least-requests", queue_limit=3))
    _, tr = _run(Workload(reqs, name="w"), spec)
    # at t=0 nothing has been admitted yet: each routed request waits; the 4th finds 3 waiting
    rejected = tr.finishes[tr.finishes["reason"] == "rejected"]
    assert len(rejected) == 10 - 3 and (rejected["replica"] == -1).all()


def test_staleness_makes_least_requests_herd():
    # a long request at t=0, then a burst of six at t=50 ms
    reqs = [Request("long", 0.0, 32, 500)] + [Request(f"b{i}", 50.0, 32, 8) for i in range(6)]
    w = Workload(reqs, name="burst")
    def routed(staleness):
        spec = FleetSpec.uniform(2, SchedulerConfig(), StepModel(step_ms=1.0),
                                 router=RouterConfig("least-requests", staleness_ms=staleness))
        return [e["replica"] for e in _run(w, spec)[1].events_of("route")]
    fresh, stale = routed(0.0), routed(30.0)
    assert fresh[0] == stale[0] == 0
    # fresh: replica 1 takes one, then both hold one each and they alternate: 3 + 1 and 3
    assert sorted(np.bincount(fresh[1:], minlength=2).tolist()) == [3, 3]
    # 30 ms stale, the router sees replica 0 busy and 1 empty (as at t=20) for the whole burst: it herds
    assert stale[1:] == [1] * 6


def test_prefix_aware_follows_the_cached_prefix():
    sys_a, sys_b = tuple(range(64)), tuple(range(1000, 1064))
    reqs = [Request(f"r{i}", 10.0 * i, 80, 2,
                    prompt_ids=(sys_a if i % 2 == 0 else sys_b) + tuple(range(5000 + 16 * i, 5016 + 16 * i)))
            for i in range(8)]
    for mode in ("approximate", "precise"):
        spec = FleetSpec.uniform(3, SchedulerConfig(prefix_caching=True), StepModel(step_ms=1.0),
                                 router=RouterConfig("prefix-aware", prefix=mode))
        _, tr = _run(Workload(reqs, name="w"), spec)
        got = [e["replica"] for e in tr.events_of("route")]
        # first two go to empty caches (0, then 1); then each system prompt follows its replica
        assert got == [0, 1] * 4, (mode, got)


def test_bad_fleet_settings_are_refused():
    with pytest.raises(ConfigError, match="router"):
        RouterConfig("nearest")
    with pytest.raises(ConfigError, match="replicas"):
        FleetSpec.uniform(0, SchedulerConfig())
    with pytest.raises(ConfigError, match="KV bytes per token"):
        FleetSpec.disagg(1, 1, SchedulerConfig())
    with pytest.raises(ConfigError, match="bandwidth"):
        Link(0, 1)
    with pytest.raises(ConfigError, match="balance_abs"):
        RouterConfig("round-robin", params={"balance_abs": 3})


def test_pd_keeps_the_clients_cancellation_and_deadline():
    # a: cancelled by its client at 3 ms, while its KV is still on the link; b: a 4 ms deadline from its arrival
    reqs = [Request("a", 0.0, 64, 20, prompt_ids=tuple(range(64)), abort_at_ms=3.0),
            Request("b", 0.0, 64, 20, prompt_ids=tuple(range(100, 164)), deadline_ms=4.0),
            Request("c", 0.0, 64, 5, prompt_ids=tuple(range(200, 264)))]
    spec = FleetSpec.disagg(1, 1, SchedulerConfig(), StepModel(step_ms=1.0), kv_bytes_per_token=1000,
                            link_gbps=1.0, link_latency_ms=1.0)
    _, tr = _run(Workload(reqs, name="w"), spec)
    f = tr.finishes.set_index("req")
    assert f.loc[0, "reason"] == "abort" and f.loc[1, "reason"] == "deadline" and f.loc[2, "reason"] == "length"
    # b's deadline counts from its arrival (0 ms), not from when its KV reached the decode replica
    assert f.loc[1, "t_ms"] <= 4.0 + 1.0 + 1e-9


def test_one_replica_equals_the_single_engine_with_cancellations_and_deadlines(shared):
    reqs = []
    for k, r in enumerate(shared.requests[:80]):
        extra = {"abort_at_ms": r.arrival_ms + 30.0} if k % 7 == 3 else {"deadline_ms": 60.0} if k % 5 == 1 else {}
        reqs.append(Request(r.id, r.arrival_ms / 4, r.prompt_tokens, r.max_output_tokens, r.prompt_ids, r.tenant,
                            **extra))
    w = Workload(reqs, name="cancel")
    cfg = SchedulerConfig(prefix_caching=True, kv_blocks=300)
    one = simulate(w, cfg, AFFINE)
    assert {"abort", "deadline"} <= set(one.finishes["reason"])
    fleet = simulate_fleet(w, FleetSpec.uniform(1, cfg, AFFINE))
    for t in TABLES:
        pd.testing.assert_frame_equal(getattr(one, t).reset_index(drop=True), getattr(fleet, t).reset_index(drop=True))


def test_precise_prefix_aware_spreads_a_burst_of_unrelated_prompts():
    # three long requests at t = 0, 1, 2, then six at t = 100, all prompts distinct: no cache helps
    reqs = [Request(f"a{i}", float(i), 32, 500, prompt_ids=tuple(range(100 * i, 100 * i + 32))) for i in range(3)]
    reqs += [Request(f"b{i}", 100.0, 32, 500, prompt_ids=tuple(range(10_000 + 100 * i, 10_032 + 100 * i)))
             for i in range(6)]
    for mode in ("approximate", "precise"):
        spec = FleetSpec.uniform(4, SchedulerConfig(prefix_caching=True), StepModel(step_ms=1.0),
                                 router=RouterConfig("prefix-aware", prefix=mode))
        got = [e["replica"] for e in _run(Workload(reqs, name="w"), spec)[1].events_of("route")]
        # loads at t=100: 1, 1, 1, 0 -> replica 3 first, then the burst spreads over all four
        assert got[3] == 3 and max(np.bincount(got, minlength=4)) <= 3, (mode, got)


def test_one_replica_of_a_fleet_trace_is_that_replicas_run(shared):
    from core.trace import one_replica
    sim, tr = _run(shared, FleetSpec.uniform(3, SchedulerConfig(prefix_caching=True), AFFINE))
    order = {rid: k for k, rid in enumerate(shared.ids)}
    for r in range(3):
        one = one_replica(tr, r)
        mine = [rid for rid in shared.ids if order[rid] % 3 == r]            # round-robin: i mod 3
        assert one.ids == mine
        assert len(one.steps) == sim.replicas[r].core.scheduler.step                 # the replica's own step count
        assert len(one.tokens) == int(shared.max_output_tokens[[order[i] for i in mine]].sum())
        assert int((one.kv["op"] == "hit").sum()) == sim.replicas[r].core.scheduler.kv.counts["hit"]
        check_trace(one)      # a valid trace on its own (its tokens, finishes, batch entries are its requests')


@pytest.mark.parametrize("policy", ["round-robin", "prefix-aware"])
def test_cli_replicas_1_writes_the_single_engine_events(tmp_path, policy):
    """`simulate --replicas 1` writes the same events as `simulate` (the fleet adds one route event per
    request and meta.fleet, nothing else)."""
    import gzip
    import json

    from core.__main__ import main
    flags = ["--prefix-caching", "--kv-blocks", "600", "--step-model", "affine", "--base-ms", "5",
             "--prefill-ms-per-token", "0.05", "--decode-ms-per-seq", "0.2"]
    assert main(["simulate", SHARED, *flags, "--out", str(tmp_path / "one.json.gz")]) == 0
    assert main(["simulate", SHARED, *flags, "--replicas", "1", "--router", policy,
                 "--out", str(tmp_path / "fleet.json.gz")]) == 0
    one, fleet = (json.loads(gzip.decompress((tmp_path / f).read_bytes())) for f in ("one.json.gz", "fleet.json.gz"))
    assert [e for e in fleet["events"] if e["type"] != "route"] == one["events"]
    assert sum(e["type"] == "route" for e in fleet["events"]) == len(one["requests"])
    assert fleet["requests"] == one["requests"]


def test_fast_forward_tells_a_precise_router_each_eviction_at_its_steps_end():
    """A router with precise prefix knowledge hears each replica's cache changes: in a run of
    fast-forwarded steps (through finishes too) an eviction is told at the end of the step it
    happened in, as when stepping (told at the run's end, 26 route events' cached_blocks were
    off by a few blocks on this workload)."""
    w = load_workload(SHARED)
    cfg = SchedulerConfig("continuous", max_seqs=32, token_budget=4096, chunk=4096, prefix_caching=True, kv_blocks=600)
    model = StepModel("affine", base_ms=5, prefill_ms_per_token=0.05, decode_ms_per_seq=0.2)
    spec = FleetSpec.uniform(2, cfg, model, router=RouterConfig("prefix-aware", prefix="precise"))
    fast = simulate_fleet(w, spec, created="x", fast_forward=True)
    slow = simulate_fleet(w, spec, created="x", fast_forward=False)
    assert fast.other == slow.other
    for t in TABLES:
        pd.testing.assert_frame_equal(getattr(fast, t).reset_index(drop=True), getattr(slow, t).reset_index(drop=True))


def test_round_robin_turns_the_prefill_and_decode_choices_apart():
    """2P:2D round-robin: each side alternates over its own replicas (one counter for both sides
    sent every request to prefill 0 and decode 3)."""
    from core.fleet.router import Router, RouterConfig, Signals
    r = Router(RouterConfig("round-robin"), 4)
    pre = [Signals(0, 0, 0, 0, 0, 1), Signals(1, 0, 0, 0, 0, 1)]
    dec = [Signals(2, 0, 0, 0, 0, 1), Signals(3, 0, 0, 0, 0, 1)]
    got = [(r.choose(pre, 0).replica, r.choose(dec, 0).replica) for _ in range(4)]
    assert got == [(0, 2), (1, 3), (0, 2), (1, 3)]


@pytest.mark.parametrize("shape,policy,staleness", [("uniform", "least-kv", 0.0), ("uniform", "least-requests", 30.0),
                                                     ("uniform", "power-of-two", 0.0), ("uniform", "round-robin", 0.0),
                                                     ("uniform", "random", 25.0), ("pd", "round-robin", 0.0),
                                                     ("pd", "least-kv", 0.0)])
def test_fast_forward_changes_nothing_in_a_fleet(shape, policy, staleness):
    """Runs of identical decode steps applied at once (the simulator's fast-forward) must give
    the trace of stepping them one by one: the router hears every step's gauges, and a decode
    replica's run stops where a transfer could land (an idle prefill replica's next request)."""
    rng = np.random.default_rng(11)
    n = 500 if shape == "uniform" else 300
    w = Workload([Request(f"q{i}", float(t), int(p), int(o)) for i, (t, p, o) in enumerate(zip(
        np.cumsum(rng.exponential(20.0, n)), rng.integers(1, 2048, n), rng.integers(1, 400, n)))], name="poisson")
    cfg = SchedulerConfig("continuous", max_seqs=64, token_budget=4096, chunk=4096)
    model = StepModel("affine", base_ms=5.0, prefill_ms_per_token=0.02, decode_ms_per_seq=0.05)
    rc = RouterConfig(policy, staleness_ms=staleness)
    bpt = 131072   # KV bytes per token: a quarter of Llama-2-7B's, so transfers are short enough to land mid-run
    spec = (FleetSpec.uniform(4, cfg, model, router=rc) if shape == "uniform"
            else FleetSpec.disagg(1, 3, cfg, model, router=rc, kv_bytes_per_token=bpt))
    fast = simulate_fleet(w, spec, created="x", fast_forward=True)
    slow = simulate_fleet(w, spec, created="x", fast_forward=False)
    assert len(fast.steps) == len(slow.steps) and len(fast.tokens) == sum(r.max_output_tokens for r in w.requests)
    for t in TABLES:
        pd.testing.assert_frame_equal(getattr(fast, t).reset_index(drop=True), getattr(slow, t).reset_index(drop=True))
    # the route events too: each decision's signals as the router saw them, and as of when
    assert fast.events_of("route") == slow.events_of("route")
