"""The engine core as a component you step: outputs carry everything (a recorder observing them
makes the same trace as the simulator), a simulator's counted decoders report their tokens too, several
cores are driven on one virtual clock by an outside loop, and stats() gives a router's load
signals, checked against independent computations."""
import numpy as np
import pytest

from core.config import SchedulerConfig
from core.engine.core import EngineCore
from core.engine.steplog import StepLog
from core.lessons.scenarios import load_scenario
from core.sim.simulate import StepTimeExecutor, simulate, simulator
from core.sim.stepmodel import StepModel
from core.workload import Request, Workload

MODEL = StepModel("affine", base_ms=5.0, prefill_ms_per_token=0.02, decode_ms_per_seq=0.05)
CFG = SchedulerConfig(max_seqs=8, token_budget=512, chunk=128, kv_blocks=400, block_size=16, prefix_caching=True)


def workload(n=40, seed=3):
    rng = np.random.default_rng(seed)
    arr = np.cumsum(rng.exponential(30.0, n))
    reqs = [Request(f"r{i}", float(a), int(p), int(o), prompt_ids=tuple(int(x) for x in rng.integers(0, 9, int(p))))
            for i, (a, p, o) in enumerate(zip(arr, rng.integers(8, 200, n), rng.integers(1, 60, n)))]
    return Workload(reqs, name="engine-core test")


def drive(core, t0):
    """An outside loop, written here without core.engine.loop: step, or jump to the next event."""
    t, outs = t0, []
    while core.has_unfinished():
        out = core.step(t)
        if out is not None:
            outs.append(out)
        if out is not None and out.step is not None:
            t = out.t_ms
        else:
            nxt = core.next_event_ms()
            assert nxt is not None and nxt > t
            t = nxt
    return outs


@pytest.mark.parametrize("ff", [False, True])
def test_a_recorder_observing_the_outputs_makes_the_simulators_trace(ff):
    w = workload()
    want = simulate(w, CFG, MODEL, fast_forward=ff)
    core = EngineCore(CFG, StepTimeExecutor(MODEL), w, fast_forward=ff, kv_events=True)   # records nothing itself
    log = StepLog()
    core.observe(log.record)
    drive(core, w.requests[0].arrival_ms)
    core.log = log
    got = core.trace(w, want.meta)
    for part in ("tokens", "steps", "batch", "finishes", "kv", "preempts"):
        a, b = getattr(want, part), getattr(got, part)
        assert a.equals(b), part


def tokens_of(outs) -> list[tuple[int, int, float]]:
    """Every token the outputs report, (request, output index, time), sorted: the listed ones, and
    each decoder's from its span (EngineOutputs.entered / left: one a step it decoded in, at that
    step's end; EngineOutputs.decoded says which decode counter value each step ran)."""
    rows, t_of, start = [], {}, {}
    for o in outs:
        rows += [(int(r), int(i), o.t_ms) for r, i in zip(list(o.token_reqs), list(o.token_index))]
        if o.decoded is not None:
            t_of[o.decoded[0]] = o.t_ms
        for r, b, _ in o.left:
            j, a, e0 = start.pop(r)
            rows += [(r, e0 + d - a, t_of[d]) for d in range(a, b)]
        for r, j, a, e0 in o.entered:
            start[r] = (j, a, e0)
    assert not start, "a decoder never reported leaving"
    return sorted(rows)


def test_a_simulators_outputs_report_every_token_it_emits():
    """A simulator's core counts its decoders instead of listing them: the tokens its outputs
    report (listed, and each decoder's span) are exactly those of the same core listing every
    entry, with the same times."""
    w = load_scenario("poisson2000")
    w = Workload(w.requests[:300], name="300")
    cfg = SchedulerConfig(max_seqs=32)

    def tokens(explicit):
        core = EngineCore(cfg, StepTimeExecutor(MODEL), w, explicit_batches=explicit)
        outs = drive(core, w.requests[0].arrival_ms)
        listed = sum(len(o.token_reqs) for o in outs)
        return tokens_of(outs), listed
    listed_all, n_all = tokens(True)
    counted, n_listed = tokens(False)
    assert counted == listed_all
    assert n_all == len(listed_all) == int(w.max_output_tokens.sum())
    assert n_listed < n_all / 10          # (each request's first token; its decodes are counted)


@pytest.mark.parametrize("model", [MODEL, StepModel(step_ms=4.0)])
def test_decode_steps_touch_no_request(model):
    """Five requests at t = 0, all admitted in one prefill step, outputs 3, 5, 8, 13 and 21
    tokens: after the prefill, 20 decode steps list no entry; each counts its decoders (5, 4,
    4, 3, ... requests) and each request leaves at the end of its last token's step, as listing
    every entry reports."""
    outs_len = [3, 5, 8, 13, 21]
    w = Workload([Request(f"r{i}", 0.0, 10, o) for i, o in enumerate(outs_len)], name="five")
    cfg = SchedulerConfig(max_seqs=8, token_budget=512, kv_blocks=64, block_size=16)
    listed = EngineCore(cfg, StepTimeExecutor(model), w, record=True)
    drive(listed, 0.0)
    stepped = listed.trace(w, {})
    core = EngineCore(cfg, StepTimeExecutor(model), w, explicit_batches=False)
    outs = [o for o in drive(core, 0.0) if o.step is not None]
    assert len(outs) == 21 and len(outs[0].step.reqs) == 5
    assert all(len(o.step.reqs) == 0 for o in outs[1:])
    # decode step j (1..20) runs the requests with more than j tokens
    assert [o.step.decoders for o in outs[1:]] == [sum(o > j for o in outs_len) for j in range(1, 21)]
    ends = stepped.steps["t_ms"] + stepped.steps["dur_ms"]
    assert [f.t_ms for o in outs for f in o.finished] == [float(ends[o - 1]) for o in outs_len]


def test_every_request_leaves_through_the_outputs_with_its_reason():
    reqs = [Request("a", 0.0, 10, 5), Request("b", 1.0, 10, 50, abort_at_ms=30.0), Request("big", 2.0, 900, 2)]
    cfg = SchedulerConfig(max_seqs=4, kv_blocks=40, block_size=16, max_model_len=512)
    core = simulator(cfg, StepModel(step_ms=5.0), Workload(reqs))
    outs = drive(core, 0.0)
    fin = {f.req: f.reason for o in outs for f in o.finished}
    assert fin == {0: "length", 1: "abort", 2: "rejected"}
    # a: 5 tokens; b: tokens at 10, 15, 20, 25 ms, and the step ending at its abort (30 ms) emits none
    toks = tokens_of(outs)
    assert len(toks) == 5 + 4
    assert [t for r, _, t in toks if r == 1] == [10.0, 15.0, 20.0, 25.0]


def test_two_cores_on_one_virtual_clock_driven_from_outside():
    """A fleet's loop: two cores, requests split between them, stepped in time order on one
    clock (whichever is free first); each core's trace equals simulating its share alone, and
    the outputs reach the loop in time order."""
    w = workload(60, seed=9)
    shares = [Workload([r for k, r in enumerate(w.requests) if k % 2 == j], name=f"half {j}") for j in (0, 1)]
    cores = [simulator(CFG, MODEL) for _ in shares]
    pending = [list(sh.requests) for sh in shares]
    free_at = [0.0, 0.0]
    seen = []

    def due(j):   # when core j next has something to do
        c = cores[j]
        st = c.stats()
        if st.running or st.waiting:
            return free_at[j]
        return max(free_at[j], pending[j][0].arrival_ms) if pending[j] else np.inf

    while True:
        j = min((0, 1), key=due)
        t = due(j)
        if t == np.inf:
            break
        while pending[j] and pending[j][0].arrival_ms <= t:      # the router hands on what has arrived
            cores[j].add_request(pending[j].pop(0))
        out = cores[j].step(t)
        free_at[j] = out.t_ms if out is not None and out.step is not None else t
        if out is not None and out.step is not None:
            seen.append(out.step.t_ms)
    assert not any(c.has_unfinished() for c in cores)
    assert seen == sorted(seen)       # steps started in time order across the two cores
    for c, s in zip(cores, shares):
        want = simulate(s, CFG, MODEL, fast_forward=False)
        got = c.trace(s, want.meta)
        for part in ("tokens", "steps", "finishes"):
            assert getattr(want, part).equals(getattr(got, part)), part


def test_stats_are_a_routers_load_signals():
    """Five 100-token prompts at once, one seat: after the first step one runs and four wait,
    each with its 100 prompt tokens still to compute; KV blocks used + free = the pool."""
    reqs = [Request(f"q{i}", 0.0, 100, 3) for i in range(5)]
    core = simulator(SchedulerConfig(max_seqs=1, kv_blocks=64, block_size=16), StepModel(step_ms=1.0), Workload(reqs))
    assert core.stats().queued_prompt_tokens == 0            # nothing has arrived yet
    out = core.step(0.0)
    st = core.stats()
    assert (st.running, st.waiting, st.queued_prompt_tokens) == (1, 4, 400)
    assert st.kv_used_blocks == 7 and st.kv_free_blocks == 64 - 7    # 100 prompt + 1 emitted -> 7 of 16
    assert out.stats.running == 1 and out.stats.waiting == 4
