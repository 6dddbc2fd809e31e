"""The vllm-v1 KV manager (SchedulerConfig.kv_manager): what vLLM 0.32's V1 block pool caches and
when, checked against counts worked out by hand and against the bundled vLLM run's own KV events."""
import pytest

from core.config import SchedulerConfig
from core.errors import ConfigError
from core.sim.simulate import simulate
from core.sim.stepmodel import StepModel
from core.workload import Request, Workload

STEP = StepModel("constant", step_ms=1.0)


def one_request(prompt: int, out: int, n: int = 1, same_prompt: bool = False) -> Workload:
    reqs = []
    for k in range(n):
        ids = tuple((7 * j + (0 if same_prompt else 1000 * k)) % 250 + 1 for j in range(prompt))
        reqs.append(Request(f"r{k}", 0.0, prompt, out, prompt_ids=ids))
    return Workload(reqs)


def cfg(manager: str, **kw) -> SchedulerConfig:
    return SchedulerConfig(policy="vllm-v1", block_size=32, prefix_caching=True, kv_manager=manager, **kw)


@pytest.mark.parametrize("prompt,out", [(64, 48), (64, 33), (64, 32), (100, 60), (31, 2)])
def test_output_blocks_are_cached_when_full_under_vllm_v1_only(prompt, out):
    # KV exists for prompt + out - 1 positions (the last token is never fed back); vLLM V1 caches
    # every full block of them, ours (keep-cached) the prompt's full blocks only.
    tr_v1 = simulate(one_request(prompt, out), cfg("vllm-v1"), STEP)
    tr_ours = simulate(one_request(prompt, out), cfg("keep-cached"), STEP)
    assert int((tr_v1.kv["op"] == "cache").sum()) == (prompt + out - 1) // 32
    assert int((tr_ours.kv["op"] == "cache").sum()) == prompt // 32


def test_an_output_block_is_cached_when_the_step_filling_it_is_scheduled():
    # 64-token prompt, block 32: the output block holds positions 64..95; position 95 is computed by
    # the step that feeds output token 31 (0-based), the 32nd decode step after the prefill step, which
    # starts at 32 ms with 1 ms steps (prefill step 0 -> 1 ms; decode k starts at k ms).
    tr = simulate(one_request(64, 48), cfg("vllm-v1"), STEP)
    cached = tr.kv[tr.kv["op"] == "cache"]
    assert sorted(cached["t_ms"].tolist()) == [0.0, 0.0, 32.0]


def test_a_request_scheduled_later_in_the_same_step_hits_blocks_cached_in_it():
    # two identical 64-token prompts arriving together: vLLM V1 caches the first one's blocks when it
    # schedules them, so the second (scheduled after it in that step) hits its first block (a hit may
    # cover at most prompt - 1 = 63 tokens: one full block); ours caches at the step's end: no hit.
    w = one_request(64, 4, n=2, same_prompt=True)
    v1 = simulate(w, cfg("vllm-v1"), STEP)
    ours = simulate(w, cfg("keep-cached"), STEP)
    assert int((v1.kv["op"] == "hit").sum()) == 1
    assert int((ours.kv["op"] == "hit").sum()) == 0


def test_vllm_v1_keeps_one_block_of_the_pool_as_its_null_block():
    # 100 + 29 - 1 = 128 positions = 4 blocks of 32: fits a 4-block pool, not vLLM's (3 usable)
    w = one_request(100, 29)
    simulate(w, cfg("keep-cached", kv_blocks=4), STEP)
    with pytest.raises(ConfigError, match="pool has 3"):
        simulate(w, cfg("vllm-v1", kv_blocks=4), STEP)
    with pytest.raises(ConfigError, match="null block"):
        simulate(w, cfg("vllm-v1", kv_blocks=1), STEP)


def test_the_simulated_prefix_cache_matches_vllms_kv_events_on_the_bundled_run():
    # data/imports/vllm_telemetry/run2: vLLM 0.32 stored 177 blocks and evicted 115 (its KV events,
    # counted independently in MADE.md: 48 x 7 full blocks - 159 hit blocks = 177); the simulator, on
    # the same prompts, arrivals and flags, within 5% of each
    from core.lessons.vllm_runs import real_and_simulated_cache
    real, simulated, _, notes = real_and_simulated_cache()
    ops, sim_ops = real["op"].value_counts(), simulated["op"].value_counts()
    assert int(ops["stored"]) == 177 and int(ops["removed"]) == 115
    assert abs(int(sim_ops["cache"]) - 177) <= 0.05 * 177
    assert abs(int(sim_ops["evict"]) - 115) <= 0.05 * 115
    assert int(simulated["cached"].max()) == int(real["cached"].max()) == 63   # 64 blocks, one null
    # the default manager, prompt blocks only: 48 fewer output blocks (and fewer re-stores), far outside 5%
    assert "stores 124 blocks and evicts 62" in notes[1]


# The runs made with vLLM 0.32's CPU build on 2026-12-04 (data/imports/vllm_telemetry, MADE.md): its
# KV events after the cache was reset (AllBlocksCleared) against the simulator on each run's workload
# under the run's own flags (read from its server log), with a step model near those runs' fitted ones
RUNS = ["run4_poisson8_p128_o32", "run5_poisson20_p192_o48", "run7_bs64_poisson6_p256_o32",
        "run8_seqs4_c12_p128_o64", "run9_poisson2_p64_o128"]


@pytest.mark.parametrize("name", RUNS)
def test_the_prefix_cache_matches_vllms_kv_events_on_each_bundled_run(name):
    from pathlib import Path

    from core.analysis.kv_events import cache_over_time
    from core.fit.runs import load_run
    from core.sim.frontend import FrontEnd
    run = load_run(Path(__file__).resolve().parents[1] / "data" / "imports" / "vllm_telemetry" / name)
    assert run.config.kv_manager == "vllm-v1" and run.config.prefix_caching
    real = cache_over_time(run.kv_events.kv_events)
    ops = real["op"].tolist()
    after = real.iloc[len(ops) - ops[::-1].index("cleared"):]    # the measured run: after the reset
    counts = after["op"].value_counts()
    sm = StepModel("affine", base_ms=3.3, prefill_ms_per_token=0.046, decode_ms_per_seq=0.054)
    sim = simulate(run.workload, run.config, sm, front_end=FrontEnd(2.0)).kv["op"].value_counts()
    assert abs(int(sim["cache"]) - int(counts["stored"])) <= 0.05 * int(counts["stored"])
    assert abs(int(sim["evict"]) - int(counts["removed"])) <= 0.05 * int(counts["removed"])
