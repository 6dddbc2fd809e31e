"""Admission control (core.engine.admission), hand-worked on small cases, and the block manager's
invariants with every control on."""
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from core.analysis.metrics import SLO, summarize
from core.config import SchedulerConfig
from core.engine import loop
from core.engine.core import EngineCore
from core.errors import ConfigError, WorkloadError
from core.sim.simulate import StepTimeExecutor, simulate
from core.sim.stepmodel import StepModel
from core.trace import parse_trace, trace_json
from core.trace.parquet import to_parquet_bytes
from core.workload import Request, Workload, request_from_dict

STEP10 = StepModel("constant", step_ms=10.0)   # every step 10 ms, one token per running request


def run(reqs, **cfg):
    tr = simulate(Workload(reqs), SchedulerConfig(**cfg), STEP10)
    ids = tr.requests["id"].tolist()
    tokens = {}
    for r, t in zip(tr.tokens["req"], tr.tokens["t_ms"]):
        tokens.setdefault(ids[r], []).append(t)
    finishes = {ids[r]: (t, why) for r, t, why in zip(tr.finishes["req"], tr.finishes["t_ms"], tr.finishes["reason"])}
    preempted = [ids[r] for r in tr.preempts["req"]]
    return tr, tokens, finishes, preempted


def test_priority_orders_the_queue():
    # three one-token requests at t=0, one at a time: lower priority value first
    _, tokens, _, _ = run([Request("A", 0.0, 1, 1, priority=2), Request("B", 0.0, 1, 1),
                           Request("C", 0.0, 1, 1, priority=1)], policy="serial", scheduling_policy="priority")
    assert tokens == {"B": [10.0], "C": [20.0], "A": [30.0]}
    _, tokens, _, _ = run([Request("A", 0.0, 1, 1, priority=2), Request("B", 0.0, 1, 1),
                           Request("C", 0.0, 1, 1, priority=1)], policy="serial")
    assert tokens == {"A": [10.0], "B": [20.0], "C": [30.0]}   # fcfs ignores priority


def test_preemption_takes_the_lowest_priority_not_the_newest():
    # L (priority 5) from t=0, H (priority 0) from t=5; 2-token blocks, a 5-block pool: at 40 ms
    # the two need a 6th block. fcfs preempts the newest (H); priority preempts L.
    reqs = [Request("L", 0.0, 2, 6, priority=5), Request("H", 5.0, 2, 6)]
    _, _, fin, pre = run(reqs, block_size=2, kv_blocks=5)
    assert pre == ["H"] and fin["L"] == (60.0, "length") and fin["H"] == (90.0, "length")
    _, _, fin, pre = run(reqs, block_size=2, kv_blocks=5, scheduling_policy="priority")
    assert pre == ["L"] and fin["H"] == (70.0, "length") and fin["L"] == (90.0, "length")


def test_kv_watermark_holds_back_an_admission():
    # pool 10 one-token blocks; A (5-token prompt) holds 6 blocks from 10 ms; B (4) arrives at 5.
    # No watermark: B fits the 4 free blocks at 10 ms. Watermark 0.3: 3 blocks must stay free,
    # so B waits until A finishes at 20 ms.
    reqs = [Request("A", 0.0, 5, 2), Request("B", 5.0, 4, 2)]
    assert run(reqs, block_size=1, kv_blocks=10)[1]["B"] == [20.0, 30.0]
    assert run(reqs, block_size=1, kv_blocks=10, kv_watermark=0.3)[1]["B"] == [30.0, 40.0]


@pytest.mark.parametrize("limit, rejected", [(1, ["r3", "r2"]), (0, ["r3", "r2", "r1"]), (3, [])])
def test_queue_limit_rejects_the_newest_waiting(limit, rejected):
    tr, tokens, fin, _ = run([Request(f"r{i}", 0.0, 1, 2) for i in range(4)], policy="serial", queue_limit=limit)
    assert [r for r, (t, why) in fin.items() if why == "rejected"] == rejected
    assert all(fin[r][0] == 0.0 and r not in tokens for r in rejected)     # refused at once, never ran
    assert tr.meta["stats"].get("rejected", 0) == len(rejected)


def test_queue_limit_never_rejects_a_preempted_request():
    # H is preempted at 40 ms and waits with a limit of 0; it must still finish
    reqs = [Request("L", 0.0, 2, 6), Request("H", 5.0, 2, 6)]
    _, _, fin, pre = run(reqs, block_size=2, kv_blocks=5, queue_limit=0)
    assert pre == ["H"] and fin["H"][1] == "length"


def test_deadlines_abort_waiting_and_running_requests():
    # serial: r1 waits behind r0 past its 30 ms deadline; r2 finishes inside its 100 ms
    _, tokens, fin, _ = run([Request("r0", 0.0, 1, 5), Request("r1", 0.0, 1, 2, deadline_ms=30.0),
                             Request("r2", 0.0, 1, 2, deadline_ms=100.0)], policy="serial")
    assert fin["r1"] == (30.0, "deadline") and "r1" not in tokens
    assert tokens["r2"] == [60.0, 70.0] and fin["r2"] == (70.0, "length")
    # running: tokens at 10, 20, 30; the step ending at 40 overruns the 35 ms deadline
    tr, tokens, fin, _ = run([Request("long", 0.0, 1, 10, deadline_ms=35.0)], policy="serial")
    assert tokens["long"] == [10.0, 20.0, 30.0] and fin["long"] == (35.0, "deadline")
    assert tr.meta["stats"]["deadline"] == 1 and tr.meta["stats"]["kv_free"] == tr.meta["stats"]["kv_alloc"]


def test_max_model_len_rejects_on_arrival_instead_of_refusing_the_run():
    reqs = [Request("ok", 0.0, 4, 4), Request("big", 1.0, 30, 5), Request("huge", 2.0, 60, 10)]
    with pytest.raises(ConfigError, match="request 'huge' needs 18 blocks"):
        run(reqs, block_size=4, kv_blocks=10)
    _, tokens, fin, _ = run(reqs, block_size=4, kv_blocks=10, max_model_len=40)
    assert fin["huge"] == (2.0, "rejected") and fin["ok"][1] == fin["big"][1] == "length"
    _, _, fin, _ = run(reqs, block_size=4, kv_blocks=10, max_model_len=1000)   # over the pool, not the length
    assert fin["huge"] == (2.0, "rejected")


def test_failed_requests_count_against_slos():
    tr, *_ = run([Request(f"r{i}", 0.0, 1, 2) for i in range(4)], policy="serial", queue_limit=1)
    slo = summarize(tr, slo=SLO(e2e_ms=1000))["summary"]["slo"]
    assert (slo["met"], slo["violations"]["failed"]) == (2, 2)


def test_options_are_checked_and_fields_survive_a_round_trip():
    for bad in (dict(kv_watermark=1.0), dict(kv_watermark=-0.1), dict(queue_limit=-1),
                dict(scheduling_policy="lifo"), dict(max_model_len=0)):
        with pytest.raises(ConfigError, match=next(iter(bad))):
            SchedulerConfig(**bad)
    with pytest.raises(WorkloadError, match="deadline_ms"):
        Request("x", 0.0, 1, 1, deadline_ms=0.0)
    with pytest.raises(WorkloadError, match="priority"):
        request_from_dict({"id": "x", "arrival_ms": 0, "prompt_tokens": 1, "output_tokens": 1, "priority": 1.5}, "r")
    w = Workload([Request("a", 0.0, 1, 2, deadline_ms=50.0, priority=-3), Request("b", 1.0, 1, 2)])
    tr = simulate(w, SchedulerConfig(scheduling_policy="priority"), STEP10)
    for name, data in (("t.json", trace_json(tr).encode()), ("t.parquet", to_parquet_bytes(tr))):
        back = parse_trace(data, name).workload()
        assert [(r.deadline_ms, r.priority) for r in back.requests] == [(50.0, -3), (None, 0)]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 60), st.integers(1, 24), st.integers(1, 10), st.integers(-2, 2),
                          st.one_of(st.none(), st.integers(5, 80))), min_size=1, max_size=14),
       st.integers(0, 4), st.sampled_from([0.0, 0.1, 0.3]), st.sampled_from(["fcfs", "priority"]),
       st.booleans())
def test_block_manager_invariants_with_every_control_on(rows, limit, wm, sp, chunked):
    reqs = [Request(f"q{i}", float(a), p, o, priority=pr, deadline_ms=None if d is None else float(d))
            for i, (a, p, o, pr, d) in enumerate(rows)]
    w = Workload(reqs)
    cfg = SchedulerConfig("continuous", max_seqs=3, token_budget=32, chunk=8 if chunked else None, block_size=4,
                          kv_blocks=12, kv_watermark=wm, queue_limit=limit, scheduling_policy=sp, max_model_len=40)
    core = EngineCore(cfg, StepTimeExecutor(StepModel("affine", base_ms=1.0, prefill_ms_per_token=0.1,
                                                      decode_ms_per_seq=0.5)), w, record=True)
    sched = core.scheduler
    loop.run(core, loop.VirtualClock(w.requests[0].arrival_ms), on_output=lambda out: sched.kv.check())
    assert sched.kv.num_free == sched.kv.num_blocks and sched.done()
    sched.kv.check()
    fin = core.log.finishes
    assert sorted(f.req for f in fin) == list(range(len(reqs)))           # every request ends once
    for f in fin:
        r = w.requests[f.req]
        assert f.reason in ("length", "rejected", "deadline")
        if f.reason == "rejected":
            assert r.prompt_tokens + r.max_output_tokens > 40 or f.req not in sched.ran
        if f.reason == "deadline":
            assert f.t_ms >= r.arrival_ms + r.deadline_ms
