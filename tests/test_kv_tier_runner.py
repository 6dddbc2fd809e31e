"""The CPU tier for real (issue 54 item 3): the runner copies KV blocks between its GPU pool and a second
pool in host memory, greedy outputs are the same with and without the tier, and the simulator, given the
same workload and capacities, stores, loads and hits the same blocks, request by request."""
import pytest
import torch

from core.analysis.kv_tiers import hits_by_tier
from core.config import SchedulerConfig
from core.sim.simulate import simulate
from core.sim.stepmodel import StepModel
from core.workload import Request, Workload
from gpu_runner.engine import Engine
from gpu_runner.model import ModelConfig, Transformer, init_weights
from gpu_runner.options import EngineConfig
from gpu_runner.tokenizer import ByteTokenizer

pytestmark = pytest.mark.slow   # runs the runner's model

BS = 8


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    m = Transformer(ModelConfig(dim=64, n_layers=2, n_heads=4, n_kv_heads=2, hidden_dim=160, max_seq_len=512))
    init_weights(m, seed=3)
    return m.double().eval()


def workload(gap_ms: float = 1.0) -> Workload:
    """Prefixes A, B, C, then A again, served one at a time (policy serial: the same order whatever the
    steps take): with 11 usable GPU blocks B and C push A's cached blocks out of the GPU pool, so the
    fourth request finds A in the CPU tier only."""
    def p(k):
        return tuple((97 + 7 * k + 3 * j) % 250 + 1 for j in range(4 * BS))
    rows = [(0, 1), (1, 2), (2, 3), (0, 4)]
    reqs = [Request(f"r{i}", gap_ms * i, 5 * BS, 6, prompt_ids=p(k) + tuple(range(10 * s, 10 * s + BS)))
            for i, (k, s) in enumerate(rows)]
    return Workload(reqs, name="tiers")


def config(cpu: int) -> SchedulerConfig:
    return SchedulerConfig(policy="serial", token_budget=256, block_size=BS, kv_blocks=12, prefix_caching=True,
                           kv_manager="vllm-v1", cpu_kv_blocks=cpu)


def run(model, cpu: int):
    eng = Engine(model, ByteTokenizer(), EngineConfig(scheduler=config(cpu)))
    tr, out = eng.run(workload())
    kv = eng.last_core.scheduler.kv
    assert kv.num_free == kv.num_blocks
    kv.check()
    return eng, tr, out


def copies(tr, op):
    return [(e["req"], e["blocks"], e["hashes"]) for e in tr.events_of("tier") if e["op"] == op]


def test_runner_tier_same_outputs_real_copies_and_the_simulator_agrees(model):
    _, off, out_off = run(model, 0)
    eng, on, out_on = run(model, 64)
    assert out_on == out_off                                  # greedy outputs equal with and without the tier
    loads = [e for e in on.events_of("tier") if e["op"] == "load"]
    assert [(e["req"], e["blocks"], e["first"]) for e in loads] == [("r3", 4, True)]
    assert all(e["dur_ms"] > 0 and e["bytes"] == 4 * eng.scheduler_config().kv_block_bytes for e in loads)
    first = on.batch[on.batch["req"] == 3].iloc[0]
    assert first["tokens"] == BS                               # only r3's own block is computed
    # the loaded blocks hold exactly what r0 computed: the copy went out and back bit for bit
    tier_pool = eng.last_core.executor.cpu_tier
    assert tier_pool is not None and tier_pool.k.abs().sum() > 0
    # the simulator with the same workload and capacities (and the runner's block bytes, model id)
    sim = simulate(workload(), eng.scheduler_config(), StepModel("constant", step_ms=1.0))
    for op in ("store", "load", "evict"):
        assert copies(sim, op) == copies(on, op), op
    assert hits_by_tier(sim).equals(hits_by_tier(on))


def test_the_server_exports_vllms_offloading_metrics_and_the_reader_takes_them(bundled):
    """`gpu_runner serve` with a CPU tier: vLLM's kv_offload_* and external prefix-cache series on /metrics
    (names from vLLM's source, docs/kv-tiers.md section 4), read back into gauge samples (core.trace.gauges)."""
    import httpx
    from prometheus_client.parser import text_string_to_metric_families

    from core.trace.gauges import gauge_event
    from gpu_runner.engine import PagedKVCache
    from tests.helpers import Running, reference
    tiny = bundled("tiny")
    prefix = {k: ch * 64 for k, ch in zip("ABC", "abc")}
    prompts = [prefix["A"] + "one more thing.", prefix["B"] + "two more things", prefix["C"] + "three more th",
               prefix["A"] + "four more thing"]
    with Running(tiny, policy="serial", block_size=16, kv_blocks=12, prefix_caching=True, kv_manager="vllm-v1",
                 cpu_kv_blocks=64) as srv, httpx.Client(timeout=60) as c:
        got = [c.post(f"{srv.url}/v1/completions", json={"prompt": p, "max_tokens": 8, "temperature": 0})
               .json()["choices"][0]["token_ids"] for p in prompts]
        text = c.get(f"{srv.url}/metrics").text
        per_block = PagedKVCache.bytes_per_block(tiny.cfg, 16, next(tiny.parameters()).dtype)
        assert srv.metric("vllm:kv_offload_load_bytes_total", model_name="tiny") == 4 * per_block   # A's 4 blocks
        assert srv.metric("vllm:external_prefix_cache_hits_total", model_name="tiny") == 64
        assert srv.metric("vllm:kv_offload_load_time_total", model_name="tiny") > 0
    assert got == reference(tiny, prompts, 8)       # the loaded KV gives the tokens the full prefill gives
    samples = [(s.name, s.value) for fam in text_string_to_metric_families(text) for s in fam.samples]
    g = gauge_event(0.0, samples)
    # 77-79-token prompts hold 4 full blocks each: A, B and C stored once (12 blocks); the fourth loads A's 4
    assert g["offload_load_bytes"] == 4 * per_block and g["external_prefix_cache_hits"] == 64
    assert g["offload_store_bytes"] == 12 * per_block
    # looked up past the GPU hit (none): every prompt token, on the requests' first admissions
    assert g["external_prefix_cache_queries"] == sum(len(p) for p in prompts)
