"""Production-sized runs (issue 12): a simulation streamed into Parquet while it runs gives
exactly the trace the in-memory path gives; the trace writer keeps each row group to one
record type and any row-group size reads back the same; the KV block pool hands out blocks
in the order of a plain free stack without materialising it (a pool "big enough for every
request" of a huge workload costs nothing until used)."""
import io

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from core.config import SchedulerConfig
from core.engine.kv_cache import KVCacheManager
from core.sim.simulate import simulate, simulate_to_parquet
from core.sim.stepmodel import StepModel
from core.trace import load_trace, parse_trace, to_doc
from core.trace.parquet import TraceWriter, to_parquet_bytes
from core.workload import Request, Workload
from tests.conftest import DATA

MODEL = StepModel("affine", base_ms=5.0, prefill_ms_per_token=0.02, decode_ms_per_seq=0.05)


def poisson(n, seed, rate_per_s=50.0):
    rng = np.random.default_rng(seed)
    arrivals = np.cumsum(rng.exponential(1000.0 / rate_per_s, n))
    return Workload.from_columns(None, arrivals - arrivals[0], rng.integers(1, 300, n), rng.integers(1, 80, n),
                                 name=f"poisson{n}")


@pytest.mark.parametrize("cfg", [
    SchedulerConfig(max_seqs=32, token_budget=512, chunk=512),
    SchedulerConfig(max_seqs=16, token_budget=256, chunk=64, kv_blocks=160),   # preemptions
    SchedulerConfig(policy="static", max_seqs=8),
])
@pytest.mark.slow   # seconds: out of the fast loop
@pytest.mark.parametrize("flush_steps,row_group_rows", [(1, 5), (7, 1000), (2048, 1 << 20)])
def test_streamed_parquet_equals_the_in_memory_trace(cfg, flush_steps, row_group_rows):
    w = poisson(300, 1)
    mem = simulate(w, cfg, MODEL, created="2026-11-29T00:00:00+00:00")
    buf = io.BytesIO()
    meta, counts = simulate_to_parquet(w, cfg, buf, MODEL, created=mem.meta["created"], flush_steps=flush_steps,
                                       row_group_rows=row_group_rows)
    back = parse_trace(buf.getvalue(), "s.parquet")
    assert to_doc(back) == to_doc(mem)
    assert meta == mem.meta
    assert counts["token"] == len(mem.tokens) == int(w.max_output_tokens.sum())
    assert counts["kv"] == len(mem.kv) and counts["batch"] == len(mem.batch)
    if cfg.kv_blocks:
        assert len(mem.preempts) > 0  # the case exercises preemption
    # the same trace written whole is the same file content, row group by row group
    assert to_doc(parse_trace(to_parquet_bytes(mem), "m.parquet")) == to_doc(back)


def test_every_row_group_holds_one_record_type():
    w = poisson(200, 2)
    buf = io.BytesIO()
    simulate_to_parquet(w, SchedulerConfig(max_seqs=16, token_budget=256, chunk=256), buf, MODEL,
                        flush_steps=3, row_group_rows=500)
    pf = pq.ParquetFile(pa.BufferReader(buf.getvalue()))
    col = pf.schema_arrow.names.index("rtype")
    seen = {}
    for i in range(pf.metadata.num_row_groups):
        rg = pf.metadata.row_group(i)
        st = rg.column(col).statistics
        assert st.min == st.max
        assert rg.num_rows <= 500
        seen[st.min] = seen.get(st.min, 0) + rg.num_rows
    t = pf.read()
    assert seen == {k: v for k, v in zip(*np.unique(t.column("rtype").to_numpy(zero_copy_only=False),
                                                       return_counts=True))}
    # the decoders' tokens as decode spans (core.trace.spans): listed tokens + the spans' = every token
    span = t.filter(pa.compute.equal(t.column("rtype"), "span"))
    assert seen["span"] == len(span) > 0
    assert seen["token"] + pa.compute.sum(span.column("tokens")).as_py() == int(w.max_output_tokens.sum())
    assert seen["token"] < int(w.max_output_tokens.sum()) / 4


def test_writer_round_trips_bundled_traces():
    for name in ("shared_prefix_caching_on.json.gz", "spec_measured_cpu.json", "runner_served_tiny_loadgen.json.gz"):
        tr = load_trace(DATA / "traces" / name)
        assert to_doc(parse_trace(to_parquet_bytes(tr), name + ".parquet")) == to_doc(tr)


def test_writer_error_leaves_no_usable_file(tmp_path):
    w = TraceWriter(str(tmp_path / "x.parquet"))
    with pytest.raises((pa.ArrowInvalid, pa.ArrowTypeError, TypeError, ValueError)):
        w.add("token", {"t_ms": np.array(["not a time"], dtype=object)})
        w.close({"source": "simulated"})
    w.abort()


def test_block_pool_order_equals_a_plain_free_stack():
    # Reference: the free list as an explicit stack [n-1, ..., 1, 0]; take pops from the end,
    # release pushes the table back tail first (free_seq releases tail blocks first).
    rng = np.random.default_rng(3)
    n = 200
    bm = KVCacheManager(n, 4)
    stack = list(range(n - 1, -1, -1))
    tables = {}
    for step in range(2000):
        if tables and (rng.random() < 0.4 or len(stack) < 10):
            seq = list(tables)[int(rng.integers(len(tables)))]
            bm.free_seq(seq)
            stack.extend(tables.pop(seq)[::-1])
        else:
            k = int(rng.integers(1, 8))
            seq = ("s", step)
            bm.admit(seq)
            got = bm.grow(seq, 4 * k)
            want = [stack.pop() for _ in range(k)]
            assert got == want
            tables[seq] = want
        assert bm.num_free == len(stack)
        bm.check()


def test_a_huge_pool_costs_nothing_until_used():
    bm = KVCacheManager(10 ** 9, 16)   # a pool "big enough for every request" of a huge workload
    bm.admit("a")
    assert bm.grow("a", 16 * 3) == [0, 1, 2]
    assert bm.num_free == 10 ** 9 - 3 and bm.pool.free_plain == [] and len(bm.hash) == 0
    bm.free_seq("a")
    bm.admit("b")
    assert bm.grow("b", 16 * 4) == [0, 1, 2, 3]    # released blocks first (most recent first), then fresh


def test_columnar_workload_simulates_like_request_objects():
    w = poisson(150, 4)
    objs = Workload([Request(r.id, r.arrival_ms, r.prompt_tokens, r.max_output_tokens) for r in w.requests],
                    name=w.name)
    cfg = SchedulerConfig(max_seqs=8, token_budget=128, chunk=32)
    a = simulate(w, cfg, MODEL, created="t")
    b = simulate(objs, cfg, MODEL, created="t")
    assert to_doc(a) == to_doc(b)
