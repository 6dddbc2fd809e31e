"""Scheduler and simulator: hand-worked schedules, an independent reference simulator, and
property tests (conservation, limits, monotone times, determinism)."""
import io

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from core.analysis.metrics import conservation
from core.config import POLICIES, SchedulerConfig
from core.engine import loop
from core.engine.core import EngineCore
from core.engine.scheduler import Scheduler
from core.errors import ConfigError
from core.sim.simulate import StepTimeExecutor, simulate, simulate_to_parquet
from core.sim.stepmodel import StepModel, fit_affine
from core.trace import parse_trace, to_doc
from core.workload import Request, Workload, make_workload
from tests.helpers import emissions

# ---- hand-worked schedules -------------------------------------------------------------

STAGGERED = [("A", 0, 4, 3), ("B", 5, 4, 2), ("C", 12, 4, 2)]


def test_staggered_continuous():
    # t=0 A prefill -> 10. t=10 A decode + B prefill -> 20. C (arrived 12) waits: 2 seats.
    # t=20 A, B decode -> 30 (both done). t=30 C -> 40, 50.
    tr = simulate(make_workload(STAGGERED), SchedulerConfig("continuous", max_seqs=2), StepModel(step_ms=10))
    assert emissions(tr) == {"A": [10, 20, 30], "B": [20, 30], "C": [40, 50]}


def test_staggered_serial():
    tr = simulate(make_workload(STAGGERED), SchedulerConfig("serial"), StepModel(step_ms=10))
    assert emissions(tr) == {"A": [10, 20, 30], "B": [40, 50], "C": [60, 70]}


def test_staggered_static():
    # Cohort 1 = {A} (only arrival at t=0); cohort 2 = {B, C} at t=30.
    tr = simulate(make_workload(STAGGERED), SchedulerConfig("static", max_seqs=2), StepModel(step_ms=10))
    assert emissions(tr) == {"A": [10, 20, 30], "B": [40, 50], "C": [40, 50]}


def test_idle_gap_jumps_to_next_arrival():
    # Nothing runs between A's finish (t=2) and B's arrival (t=7.5): no empty steps.
    w = make_workload([("A", 0, 3, 2), ("B", 7.5, 3, 2)])
    tr = simulate(w, SchedulerConfig("continuous"), StepModel(step_ms=1.0))
    assert emissions(tr) == {"A": [1, 2], "B": [8.5, 9.5]}
    assert len(tr.steps) == 4 and tr.batch.groupby("step").size().min() >= 1


def test_chunked_prefill_with_budget():
    # Budget 4/step, chunk 4: A's 10-token prompt takes 3 steps (4+4+2); B (2 tokens)
    # fits beside A's last chunk; both emit at t=3; A decodes at t=4.
    w = make_workload([("A", 0, 10, 2), ("B", 0, 2, 1)])
    tr = simulate(w, SchedulerConfig("continuous", token_budget=4, chunk=4))
    assert emissions(tr) == {"A": [3, 4], "B": [3]}
    steps = tr.batch.groupby("step")["tokens"].sum().tolist()
    assert steps == [4, 4, 4, 1]


def test_budget_without_chunking_keeps_prompts_whole():
    # Budget 8: A's 6-token prefill leaves 2; B's 4-token prompt waits a step.
    w = make_workload([("A", 0, 6, 2), ("B", 0, 4, 1)])
    tr = simulate(w, SchedulerConfig("continuous", token_budget=8))
    assert emissions(tr) == {"A": [1, 2], "B": [2]}


def test_prompt_over_budget_without_chunking_is_a_clear_error():
    w = make_workload([("A", 0, 100, 2)])
    with pytest.raises(ConfigError, match="chunked prefill"):
        simulate(w, SchedulerConfig("continuous", token_budget=64))


def test_preemption_by_recompute():
    # Blocks of 2 tokens, pool of 4. A and B (2 prompt, 4 out) each fit alone (3 blocks).
    # t=3 both need a 3rd block, none free: B (newest) is preempted, A finishes at 4,
    # B recomputes prompt + 3 emitted tokens in one step and emits its last token at 5.
    w = make_workload([("A", 0, 2, 4), ("B", 0, 2, 4)])
    tr = simulate(w, SchedulerConfig("continuous", block_size=2, kv_blocks=4))
    assert emissions(tr) == {"A": [1, 2, 3, 4], "B": [1, 2, 3, 5]}
    assert tr.preempts[["t_ms", "req", "freed_blocks"]].values.tolist() == [[3.0, 1, 2]]
    recompute = tr.batch[(tr.batch["step"] == 4)]
    assert recompute[["req", "kind", "tokens"]].values.tolist() == [[1, "prefill", 5]]
    assert tr.steps["kv_used_blocks"].max() <= 4


def test_request_too_big_for_pool_is_a_clear_error():
    w = make_workload([("A", 0, 10, 10)])
    with pytest.raises(ConfigError, match="needs 5 blocks"):
        simulate(w, SchedulerConfig("continuous", block_size=4, kv_blocks=4))


def test_prefix_caching_hits_and_tenant_salt():
    ids = tuple(range(100, 109))          # 9 tokens, block size 4: 2 full blocks shareable
    def run(tenant_b):
        w = Workload([Request("A", 0, 9, 2, prompt_ids=ids, tenant="t1"),
                      Request("B", 10, 9, 2, prompt_ids=ids, tenant=tenant_b)])
        return simulate(w, SchedulerConfig("continuous", block_size=4, prefix_caching=True))
    same = run("t1")
    hits = same.kv[same.kv["op"] == "hit"]
    assert hits["req"].tolist() == [1, 1]
    b_first = same.batch[same.batch["req"] == 1].iloc[0]
    assert b_first["tokens"] == 1          # 8 of 9 prompt tokens came from the cache
    other = run("t2")
    assert (other.kv["op"] == "hit").sum() == 0
    assert other.batch[other.batch["req"] == 1].iloc[0]["tokens"] == 9
    assert emissions(same) == emissions(other)  # caching changes work, not the schedule here


def test_abort_frees_blocks():
    w = Workload([Request("A", 0, 4, 50, abort_at_ms=5.5), Request("B", 0, 4, 3)])
    tr = simulate(w, SchedulerConfig("continuous", block_size=4))
    em = emissions(tr)
    assert len(em["A"]) == 5 and em["B"] == [1, 2, 3]
    assert dict(zip(tr.finishes["req"], tr.finishes["reason"]))[0] == "abort"
    assert conservation(tr) == []


def test_fit_affine_recovers_coefficients():
    w = make_workload([(i, i * 3.0, 20 + 7 * i, 5 + i) for i in range(12)])
    truth = StepModel("affine", base_ms=2.0, prefill_ms_per_token=0.1, decode_ms_per_seq=0.5)
    tr = simulate(w, SchedulerConfig("continuous", max_seqs=4), truth)
    fit = fit_affine(tr)
    assert fit.base_ms == pytest.approx(2.0, abs=1e-6)
    assert fit.prefill_ms_per_token == pytest.approx(0.1, abs=1e-6)
    assert fit.decode_ms_per_seq == pytest.approx(0.5, abs=1e-6)


def test_roofline_step_model_bandwidth_bound_decode():
    # Batch-1 decode of Llama-2-7B on the chapter's 2 TB/s GPU: ~weights / bandwidth.
    w = make_workload([("A", 0, 1, 3)])
    sm = StepModel("roofline", model="Llama-2-7B", gpu="Chapter 2 TB/s")
    tr = simulate(w, SchedulerConfig("continuous"), sm)
    from core.formulas.kv import MODELS
    weights_ms = MODELS["Llama-2-7B"].weight_bytes(2) / 2e12 * 1000
    d = tr.steps["dur_ms"].to_numpy()
    assert d[1] == pytest.approx(weights_ms, rel=1e-3)  # KV of 2 positions is negligible
    assert d[1] > weights_ms


# ---- an independent reference simulator --------------------------------------------------

def reference(reqs, policy, slots, step=1.0):
    """Unit-step scheduling with free prefill and no KV/budget limits, written plainly:
    every running request emits one token per step."""
    pending = sorted(reqs, key=lambda r: r[1])
    waiting, running, out = [], [], {r[0]: [] for r in reqs}
    t = pending[0][1]
    while pending or waiting or running:
        while pending and pending[0][1] <= t:
            waiting.append(list(pending.pop(0)))
        if not running and not waiting:
            t = pending[0][1]
            continue
        if policy == "continuous" or not running:
            while waiting and len(running) < (1 if policy == "serial" else slots):
                running.append(waiting.pop(0))
        t = t + step
        for r in running:
            out[r[0]].append(t)
            r[3] -= 1
        running = [r for r in running if r[3] > 0]
    return out


workloads = st.lists(st.tuples(st.integers(0, 30), st.integers(1, 20), st.integers(1, 12)),
                     min_size=1, max_size=12)


@given(workloads, st.sampled_from(["serial", "static", "continuous"]), st.integers(1, 5))
@settings(max_examples=120, deadline=None)
def test_matches_reference_simulator(rows, policy, slots):
    reqs = [(f"r{i}", float(a), p, o) for i, (a, p, o) in enumerate(rows)]
    w = make_workload(reqs)
    tr = simulate(w, SchedulerConfig(policy, max_seqs=slots))
    assert emissions(tr) == reference(reqs, policy, slots)


# ---- properties of any simulated run -----------------------------------------------------

configs = st.fixed_dictionaries({
    "policy": st.sampled_from(POLICIES),
    "max_seqs": st.one_of(st.none(), st.integers(1, 6)),
    "token_budget": st.one_of(st.none(), st.integers(8, 64)),
    "chunk": st.one_of(st.none(), st.integers(1, 16)),
    "block_size": st.integers(1, 8),
    "kv_blocks": st.one_of(st.none(), st.integers(12, 60)),
    "prefix_caching": st.booleans(),
})


@pytest.mark.slow
@given(st.lists(st.tuples(st.integers(0, 40), st.integers(1, 24), st.integers(1, 10),
                          st.integers(0, 2), st.sampled_from([None, "x", "y"])), min_size=1, max_size=10),
       configs, st.sampled_from([StepModel(step_ms=1.0),
                                 StepModel("affine", base_ms=0.5, prefill_ms_per_token=0.1, decode_ms_per_seq=0.2),
                                 StepModel("roofline", model="Llama-3-8B", gpu="H100-SXM")]))
@settings(max_examples=150, deadline=None)
def test_simulation_invariants(rows, cfg, model):
    cfg = dict(cfg)
    if cfg["policy"] in ("vllm-v0", "orca"):
        cfg["chunk"] = None          # these compute whole prompts
    if cfg["chunk"] is None and cfg["token_budget"] is not None and cfg["policy"] not in ("vllm-v1", "sarathi"):
        # every prompt, and a preempted request's prompt + outputs, must fit unchunked (else: test below)
        cfg["token_budget"] = max(cfg["token_budget"], 24 + 10 - 1)
    if cfg["kv_blocks"] is not None:
        worst = max(-(-(p + o - 1) // cfg["block_size"]) for _, p, o, _, _ in rows)
        cfg["kv_blocks"] = max(cfg["kv_blocks"], worst)
    reqs = [Request(f"r{i}", float(a), p, o, prompt_ids=tuple((i * 7 + k) % 5 if fam else k % 3 for k in range(p)),
                    tenant=ten)
            for i, (a, p, o, fam, ten) in enumerate(rows)]
    w = Workload(reqs)
    config = SchedulerConfig(**cfg)
    core = EngineCore(config, None, w, record=True)
    sched = core.scheduler

    class Checked(StepTimeExecutor):  # the simulator's executor, checking limits before each step
        def execute(self, b):
            assert len(sched.running) <= config.seats
            if config.token_budget:
                assert b.total_tokens <= config.token_budget
            if config.chunk:
                assert (b.num_tokens <= config.chunk).all()
            assert sched.kv.num_used <= sched.kv.num_blocks
            assert len(b.reqs) >= 1 and (b.num_tokens >= 1).all()
            return super().execute(b)

    core.executor = Checked(model)
    loop.run(core, loop.VirtualClock(w.requests[0].arrival_ms), on_output=lambda out: sched.kv.check())
    assert sched.kv.num_free == sched.kv.num_blocks  # every block returned
    sched.kv.check()
    tr = simulate(w, config, model)
    assert conservation(tr) == []                    # each request emits its output count
    m = tr.tokens.sort_values(["req", "index"])
    for r, g in m.groupby("req"):
        ts = g["t_ms"].to_numpy()
        assert (np.diff(ts) >= 0).all()
        assert ts[0] > w.requests[r].arrival_ms
    if config.max_seqs:
        assert tr.steps["running"].max() <= config.seats
    # Hits never cross tenants or differ in tokens: compare hit blocks' cached content.
    hits = tr.kv[tr.kv["op"] == "hit"]
    for r in hits["req"].unique():
        assert all(w.requests[j].tenant == w.requests[r].tenant
                   for j in tr.kv[(tr.kv["op"] == "cache") & tr.kv["hash"].isin(hits[hits["req"] == r]["hash"])]["req"])
    again = simulate(w, config, model, created=tr.meta["created"])
    assert to_doc(again) == to_doc(tr)              # deterministic given its inputs
    stepwise = simulate(w, config, model, created=tr.meta["created"], fast_forward=False)
    assert to_doc(stepwise) == to_doc(tr)           # the fast-forward shortcut changes nothing
    assert to_doc(fully_planned(w, config, model, tr.meta["created"])) == to_doc(tr)  # nor the decode fast path
    buf = io.BytesIO()                                # written while simulated, in tiny pieces
    simulate_to_parquet(w, config, buf, model, created=tr.meta["created"], flush_steps=2, row_group_rows=7)
    assert to_doc(parse_trace(buf.getvalue(), "streamed.parquet")) == to_doc(tr)


def fully_planned(w, config, model, created):
    """The trace with every shortcut off: no fast-forward, each step planned in full."""
    Scheduler.decode_fast_path = False
    try:
        return simulate(w, config, model, created=created, fast_forward=False)
    finally:
        Scheduler.decode_fast_path = True


@pytest.mark.parametrize("policy,kv_blocks", [("continuous", None), ("continuous", 250), ("vllm-v1", 250),
                                               ("vllm-v0", None), ("vllm-v0", 250), ("orca", 250), ("sarathi", 250)])
def test_shortcuts_change_nothing_under_load(policy, kv_blocks):
    # Overloaded: seats stay full, a request finishes and another is admitted nearly every
    # step, so the decode fast path carries most steps; with 250 blocks requests are also
    # preempted and recomputed.
    rng = np.random.default_rng(5)
    n = 400
    w = make_workload([(f"q{i}", float(t), int(p), int(o)) for i, (t, p, o) in enumerate(zip(
        np.cumsum(rng.exponential(2.0, n)), rng.integers(1, 300, n), rng.integers(1, 120, n)))])
    config = SchedulerConfig(policy, max_seqs=32, token_budget=512, block_size=16, kv_blocks=kv_blocks,
                             chunk=256 if policy in ("continuous", "sarathi") else None)
    model = StepModel("affine", base_ms=2.0, prefill_ms_per_token=0.01, decode_ms_per_seq=0.05)
    tr = simulate(w, config, model)
    assert (tr.meta["stats"]["preemptions"] > 0) == (kv_blocks is not None)
    assert to_doc(fully_planned(w, config, model, tr.meta["created"])) == to_doc(tr)


class _ArrivalInbox:
    """Hands the scheduler each request only once the clock has reached its arrival, as a server
    does; while idle, the virtual clock jumps to the next arrival."""

    def __init__(self, requests, clock):
        self.pending, self.clock = list(requests), clock

    def drain(self, core, now_ms):
        while self.pending and self.pending[0].arrival_ms <= now_ms:
            core.add_request(self.pending.pop(0))
        return bool(self.pending) or core.has_unfinished()

    def wait(self):
        self.clock.wait_until(self.pending[0].arrival_ms)


@pytest.mark.parametrize("cfg", [
    SchedulerConfig(max_seqs=4, kv_blocks=64, block_size=8),
    SchedulerConfig(max_seqs=8, token_budget=64, chunk=16, kv_blocks=40, block_size=4, prefix_caching=True),
])
def test_requests_added_while_running_schedule_like_a_known_workload(cfg):
    """A server's scheduler learns of each request when it arrives (add_request between steps);
    the schedule must be the one computed with the whole workload known up front."""
    rng = np.random.default_rng(5)
    arrivals = np.cumsum(rng.exponential(25.0, 60))
    ids = [tuple(int(t) for t in rng.integers(0, 50, int(p))) for p in rng.integers(4, 60, 60)]
    wl = Workload([Request(f"q{k}", float(a), len(ids[k]), int(o), ids[k])
                   for k, (a, o) in enumerate(zip(arrivals, rng.integers(1, 30, 60)))], name="online")
    model = StepModel("affine", base_ms=2.0, prefill_ms_per_token=0.05, decode_ms_per_seq=0.3)
    known = simulate(wl, cfg, model, fast_forward=False)
    core = EngineCore(cfg, StepTimeExecutor(model), record=True)
    clock = loop.VirtualClock(wl.requests[0].arrival_ms)
    loop.run(core, clock, inbox=_ArrivalInbox(wl.requests, clock))
    online = core.trace(wl, known.meta)
    assert core.num_requests == 60 and core.num_done == 60
    for part in ("tokens", "steps", "finishes"):
        a, b = getattr(known, part), getattr(online, part)
        assert a.equals(b), part


def test_add_request_refuses_what_could_never_run():
    sched = Scheduler(None, SchedulerConfig(kv_blocks=4, block_size=8, token_budget=16))
    with pytest.raises(ConfigError, match="need 5 KV blocks of 8; the pool has 4"):
        sched.add_request(Request("big", 0.0, 10, 31))
    with pytest.raises(ConfigError, match="over the per-step token budget of 16"):
        sched.add_request(Request("long", 0.0, 17, 1))
    assert sched.requests.n == 0
    for k in range(40):   # growth past the initial capacity keeps every value
        assert sched.add_request(Request(f"r{k}", float(k), 1 + k % 5, 1 + k % 3)) == k
    assert list(sched.requests.prompt_len) == [1 + k % 5 for k in range(40)]
    assert list(sched.requests.arrival) == [float(k) for k in range(40)] and len(sched.requests.state) == 40


def test_a_request_that_cannot_run_even_alone_is_answered_not_left_waiting():
    """vLLM V0 without chunking, KV for a few blocks of 1 token: the long request is preempted after
    emitting, and its prompt + outputs (25 tokens) no longer fit the 24-token budget in one step.
    It is rejected with the numbers (the loop used to stop with "no progress"); the others finish."""
    rows = [(0, 1, 1), (0, 1, 1), (0, 1, 1), (17, 1, 6), (18, 20, 6)]
    w = Workload([Request(f"r{i}", float(a), p, o) for i, (a, p, o) in enumerate(rows)])
    cfg = SchedulerConfig(policy="vllm-v0", token_budget=24, block_size=1, kv_blocks=29)
    core = EngineCore(cfg, StepTimeExecutor(StepModel(step_ms=1.0)), w)
    finishes = []
    loop.run(core, loop.VirtualClock(0.0), on_output=lambda out: finishes.extend(out.finished))
    why = {f.req: f for f in finishes}
    assert [why[i].reason for i in range(5)] == ["length"] * 4 + ["rejected"]
    assert core.scheduler.num_preemptions >= 1
    assert "25 tokens to compute" in why[4].detail and "token budget 24" in why[4].detail
    assert core.scheduler.kv.num_free == 29


def test_many_heads_that_cannot_run_are_each_answered_in_one_step_call():
    """A KV watermark that leaves too few blocks for any request: every one is rejected on the idle
    engine, one after another in a single schedule call (a loop: 3,000 of them, no recursion)."""
    n = 3000
    w = Workload([Request(f"r{i}", 0.0, 100, 1) for i in range(n)])   # 7 blocks of 16 each
    cfg = SchedulerConfig(policy="continuous", kv_blocks=10, kv_watermark=0.5)   # 5 kept free
    core = EngineCore(cfg, StepTimeExecutor(StepModel(step_ms=1.0)), w)
    finishes = []
    loop.run(core, loop.VirtualClock(0.0), on_output=lambda out: finishes.extend(out.finished))
    assert len(finishes) == n and {f.reason for f in finishes} == {"rejected"}
    assert all("cannot run even with the engine idle" in f.detail for f in finishes)
    assert core.scheduler.kv.num_free == 10
