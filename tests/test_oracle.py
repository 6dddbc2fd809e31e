"""Issue 50's oracle: the scheduler as it was before the decode counter and calendars
(tests/oracle/scheduler_v0.py, stepping one step at a time) must give the same trace, event by event,
as the shipped one: every golden and generated workloads over every policy, chunked prefill,
preemption, prefix caching with both KV managers, cancellations and deadlines."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from core.config import POLICIES, SchedulerConfig
from core.sim.simulate import _run, simulate, simulator
from core.sim.stepmodel import StepModel
from core.trace import to_doc
from core.workload import Request, Workload, make_workload
from tests.oracle.scheduler_v0 import Scheduler as Oracle

AFFINE = StepModel("affine", base_ms=2.0, prefill_ms_per_token=0.01, decode_ms_per_seq=0.05)
MODELS = [StepModel(step_ms=1.0), StepModel("affine", base_ms=0.5, prefill_ms_per_token=0.1, decode_ms_per_seq=0.2),
          StepModel("features", base_ms=0.5, prefill_ms_per_token=0.01, decode_ms_per_seq=0.1,
                    prefill_ms_per_kpos=0.2, decode_ms_per_kpos=0.3, prefill_ms_per_chunk=0.05),
          StepModel("roofline", model="Llama-3-8B", gpu="H100-SXM")]


def oracle(w, config, model, created):
    core = simulator(config, model, w, True, False, scheduler=Oracle)
    return core.trace(w, _run(core, w, None, created))


def same(w, config, model):
    tr = simulate(w, config, model)
    ref = oracle(w, config, model, tr.meta["created"])
    a, b = to_doc(tr), to_doc(ref)
    if a != b:
        for part in ("steps", "batch", "tokens", "finishes", "kv", "preempts"):
            x, y = getattr(tr, part), getattr(ref, part)
            assert x.equals(y), f"{part} differ:\n{x.compare(y) if x.shape == y.shape else (x.shape, y.shape)}"
    assert a == b


def _load(n, seed, policy, kv_blocks, **kw):
    rng = np.random.default_rng(seed)
    w = make_workload([(f"q{i}", float(t), int(p), int(o)) for i, (t, p, o) in enumerate(zip(
        np.cumsum(rng.exponential(2.0, n)), rng.integers(1, 300, n), rng.integers(1, 120, n)))])
    config = SchedulerConfig(policy, max_seqs=32, token_budget=512, block_size=16, kv_blocks=kv_blocks,
                             chunk=256 if policy in ("continuous", "sarathi") else None, **kw)
    return w, config


@pytest.mark.parametrize("policy,kv_blocks", [("continuous", None), ("continuous", 250), ("vllm-v1", 250),
                                               ("vllm-v0", None), ("vllm-v0", 250), ("orca", 250), ("sarathi", 250),
                                               ("static", None), ("serial", None)])
def test_the_same_trace_under_load(policy, kv_blocks):
    w, config = _load(300, 5, policy, kv_blocks)
    same(w, config, AFFINE)


@given(st.lists(st.tuples(st.integers(0, 40), st.integers(1, 24), st.integers(1, 10),
                          st.integers(0, 2), st.sampled_from([None, "x", "y"]),
                          st.one_of(st.none(), st.floats(1, 60)), st.one_of(st.none(), st.floats(5, 80))),
                min_size=1, max_size=12),
       st.fixed_dictionaries({
           "policy": st.sampled_from(POLICIES),
           "max_seqs": st.one_of(st.none(), st.integers(1, 6)),
           "token_budget": st.one_of(st.none(), st.integers(8, 64)),
           "chunk": st.one_of(st.none(), st.integers(1, 16)),
           "block_size": st.integers(1, 8),
           "kv_blocks": st.one_of(st.none(), st.integers(12, 60)),
           "prefix_caching": st.booleans(),
           "kv_manager": st.sampled_from(["keep-cached", "vllm-v1"]),
           "scheduling_policy": st.sampled_from(["fcfs", "priority"]),
           "kv_watermark": st.sampled_from([0.0, 0.1]),
           "queue_limit": st.one_of(st.none(), st.integers(0, 4)),
       }),
       st.sampled_from(MODELS))
@settings(max_examples=300, deadline=None)
def test_the_same_trace_on_generated_workloads(rows, cfg, model):
    cfg = dict(cfg)
    if cfg["policy"] in ("vllm-v0", "orca"):
        cfg["chunk"] = None
    if cfg["chunk"] is None and cfg["token_budget"] is not None and cfg["policy"] not in ("vllm-v1", "sarathi"):
        cfg["token_budget"] = max(cfg["token_budget"], 24)
    worst = max(-(-(p + o - 1) // cfg["block_size"]) for _, p, o, *_ in rows)
    if cfg["kv_blocks"] is not None:
        cfg["kv_blocks"] = max(cfg["kv_blocks"], (2 if cfg["kv_watermark"] else 1) * (worst + 1))
    elif cfg["kv_watermark"]:   # (a pool of exactly what the requests need leaves no room above a watermark)
        cfg["kv_blocks"] = 2 * sum(-(-(p + o - 1) // cfg["block_size"]) for _, p, o, *_ in rows) + 2
    reqs = [Request(f"r{i}", float(a), p, o, prompt_ids=tuple((i * 7 + k) % 5 if fam else k % 3 for k in range(p)),
                    tenant=ten, abort_at_ms=None if ab is None else float(a) + ab, deadline_ms=dl, priority=i % 3)
            for i, (a, p, o, fam, ten, ab, dl) in enumerate(sorted(rows, key=lambda r: r[0]))]
    same(Workload(reqs), SchedulerConfig(**cfg), model)


def test_the_vidur_workload():
    from bench.simulate import poisson_workload
    from bench.step_cost import CONFIG, MODEL
    same(poisson_workload(2000, 50.0), CONFIG, MODEL)
