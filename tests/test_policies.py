"""Batching policies named after real systems (core/engine/policies.py), worked by hand on small cases
with 10 ms steps (one token per running request per step), and their defining rules checked
on random workloads."""
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from core.config import POLICIES, SchedulerConfig
from core.engine.admission import watermark_blocks
from core.engine.policies import budget_shares
from core.errors import ConfigError
from core.sim.simulate import simulate
from core.sim.stepmodel import StepModel
from core.workload import Request, Workload

STEP10 = StepModel("constant", step_ms=10.0)


def run(reqs, **cfg):
    """(token times by request id, the steps as {request id: (kind, tokens)})."""
    tr = simulate(Workload(reqs), SchedulerConfig(**cfg), STEP10)
    ids = tr.requests["id"].tolist()
    tokens = {}
    for r, t in zip(tr.tokens["req"], tr.tokens["t_ms"]):
        tokens.setdefault(ids[r], []).append(float(t))
    steps = [{ids[r]: (k, int(n)) for r, k, n in zip(g["req"], g["kind"], g["tokens"])}
             for _, g in tr.batch.groupby("step", sort=True)]
    return tokens, steps


# A (4-token prompt, 3 outputs) at 0 ms; B (2, 2) at 15 ms.
TWO = [Request("A", 0.0, 4, 3), Request("B", 15.0, 2, 2)]


def test_vllm_v0_runs_prefill_only_steps_and_decodes_only_when_nobody_joins():
    # 0: A's prompt. 10: B has not arrived: A decodes. 20: B waits and fits, so the step is B's
    # prompt alone (A's decode waits). 30: both decode.
    tokens, steps = run(TWO, policy="vllm-v0")
    assert steps == [{"A": ("prefill", 4)}, {"A": ("decode", 1)}, {"B": ("prefill", 2)},
                     {"A": ("decode", 1), "B": ("decode", 1)}]
    assert tokens == {"A": [10.0, 20.0, 40.0], "B": [30.0, 40.0]}
    # continuous (and vllm-v1) mix them: at 20 B's prompt runs beside A's decode
    for policy in ("continuous", "vllm-v1", "orca", "sarathi"):
        tokens, steps = run(TWO, policy=policy)
        assert steps[2] == {"A": ("decode", 1), "B": ("prefill", 2)}, policy
        assert tokens == {"A": [10.0, 20.0, 30.0], "B": [30.0, 40.0]}, policy


def test_vllm_v0_admits_whole_prompts_within_the_budget():
    # budget 5, A (3, 3) and B (3, 1) at 0: A's prompt fills 3, B's 3 more would pass 5, so B
    # joins at 10 in a step of its own while A's decode stalls.
    reqs = [Request("A", 0.0, 3, 3), Request("B", 0.0, 3, 1)]
    tokens, steps = run(reqs, policy="vllm-v0", token_budget=5)
    assert steps == [{"A": ("prefill", 3)}, {"B": ("prefill", 3)}, {"A": ("decode", 1)}, {"A": ("decode", 1)}]
    assert tokens == {"A": [10.0, 30.0, 40.0], "B": [20.0]}
    # orca: at 10, B's whole prompt (3) joins A's decode (1) within the budget of 5
    tokens, steps = run(reqs, policy="orca", token_budget=5)
    assert steps[1] == {"A": ("decode", 1), "B": ("prefill", 3)}
    assert tokens == {"A": [10.0, 20.0, 30.0], "B": [20.0]}


# A (2, 4) at 0 ms; B with an 8-token prompt and 1 output at 15 ms.
LONG = [Request("A", 0.0, 2, 4), Request("B", 15.0, 8, 1)]


def test_orca_computes_a_long_prompt_whole_beside_the_decodes():
    tokens, steps = run(LONG, policy="orca")
    assert steps[2] == {"A": ("decode", 1), "B": ("prefill", 8)}
    assert tokens == {"A": [10.0, 20.0, 30.0, 40.0], "B": [30.0]}
    with pytest.raises(ConfigError, match="chunk: the orca policy computes each prompt in one step"):
        SchedulerConfig("orca", chunk=4)
    with pytest.raises(ConfigError, match="chunk: the vllm-v0 policy"):
        SchedulerConfig("vllm-v0", chunk=4)


def test_sarathi_splits_a_long_prompt_so_the_decode_never_stalls():
    # chunk 4 = the step's budget. 20: A's decode (1) first, B's first piece takes the 3 left.
    # 30: A's last decode, B's next piece 3. 40: B's last 2 tokens, its only output at 50.
    tokens, steps = run(LONG, policy="sarathi", chunk=4)
    assert steps == [{"A": ("prefill", 2)}, {"A": ("decode", 1)}, {"A": ("decode", 1), "B": ("prefill", 3)},
                     {"A": ("decode", 1), "B": ("prefill", 3)}, {"B": ("prefill", 2)}]
    assert tokens == {"A": [10.0, 20.0, 30.0, 40.0], "B": [50.0]}
    # vllm-v1 with a 4-token budget chunks the same way; vllm-v0 runs B's whole prompt alone at 20
    assert run(LONG, policy="vllm-v1", token_budget=4) == (tokens, steps)
    tokens, steps = run(LONG, policy="vllm-v0")
    assert steps[2] == {"B": ("prefill", 8)}
    assert tokens == {"A": [10.0, 20.0, 40.0, 50.0], "B": [30.0]}


def test_named_policies_write_their_settings_into_the_configuration():
    assert (SchedulerConfig("vllm-v1", token_budget=2048).chunk, SchedulerConfig("vllm-v1").chunk) == (2048, None)
    s = SchedulerConfig("sarathi")
    assert (s.chunk, s.token_budget) == (512, 512)
    s = SchedulerConfig("sarathi", chunk=256, token_budget=8192)
    assert (s.chunk, s.token_budget) == (256, 256)
    assert SchedulerConfig("vllm-v0").kv_watermark == 0.01
    assert SchedulerConfig("vllm-v0", kv_watermark=0.0).kv_watermark == 0.0
    assert SchedulerConfig("continuous").kv_watermark == 0.0
    assert SchedulerConfig("continuous").chunk is None
    # built again from its own record, a configuration is the same
    from core.config import from_dict, to_dict
    for p in POLICIES:
        cfg = SchedulerConfig(p, token_budget=64)
        assert from_dict(SchedulerConfig, to_dict(cfg)) == cfg


def test_vllm_v0_watermark_keeps_one_percent_of_the_pool_free():
    # floor(0.01 x 150) = 1 block, as vLLM and Vidur round
    assert watermark_blocks(SchedulerConfig("vllm-v0"), 150) == 1
    assert watermark_blocks(SchedulerConfig("vllm-v0"), 99) == 0
    # 100 one-token blocks: A (99-token prompt, 2 outputs) leaves exactly the watermark's block
    # free; B (1, 1) at 5 ms may not take it, so it waits for A to finish at 20.
    reqs = [Request("A", 0.0, 99, 2), Request("B", 5.0, 1, 1)]
    tokens, _ = run(reqs, policy="vllm-v0", block_size=1, kv_blocks=100)
    assert tokens == {"A": [10.0, 20.0], "B": [30.0]}
    tokens, _ = run(reqs, policy="vllm-v0", block_size=1, kv_blocks=100, kv_watermark=0.0)
    assert tokens == {"A": [10.0, 30.0], "B": [20.0]}


def test_budget_shares_decodes_first():
    want, dec = [4, 1, 1], [False, True, True]   # (the scheduler's lists)
    assert budget_shares(want, 4, dec, False) == [4, 0, 0]   # oldest first
    assert budget_shares(want, 4, dec, True) == [2, 1, 1]    # stall-free


# ---- each policy's defining rule on random workloads ---------------------------------------------

rows = st.lists(st.tuples(st.integers(0, 60), st.integers(1, 40), st.integers(1, 12)), min_size=1, max_size=14)


@given(rows, st.sampled_from(["vllm-v0", "orca", "sarathi", "vllm-v1"]), st.integers(2, 6),
       st.sampled_from([None, 30]))
@settings(max_examples=80, deadline=None)
def test_each_policy_keeps_its_rule(rows, policy, seats, kv_blocks):
    reqs = [Request(f"r{i}", float(a), p, o) for i, (a, p, o) in enumerate(rows)]
    extra = {"chunk": 8} if policy == "sarathi" else {"token_budget": 48}
    if kv_blocks is not None:
        extra.update(block_size=4, kv_blocks=kv_blocks)
    cfg = SchedulerConfig(policy, max_seqs=seats, **extra)
    tr = simulate(Workload(reqs), cfg, STEP10)
    prompt = tr.requests["prompt_tokens"].to_numpy()   # (trace order: by arrival)
    for _, g in tr.batch.groupby("step"):
        kinds = set(g["kind"])
        assert int(g["tokens"].sum()) <= cfg.token_budget
        if policy == "vllm-v0":
            assert len(kinds) == 1                    # prompts only or decodes only
        if policy in ("vllm-v0", "orca"):              # whole prompts (a recomputation: prompt + outputs)
            pre = g[g["kind"] == "prefill"]
            assert (pre["tokens"].to_numpy() >= [prompt[r] for r in pre["req"]]).all()
    if kv_blocks is None:
        # no preemption: a request decodes from its first token to its last; stall-free
        # policies (sarathi, vllm-v1) run every such request in every step until it finishes
        first = tr.tokens.groupby("req")["t_ms"].min()
        last = tr.tokens.groupby("req")["t_ms"].max()
        for step, g in tr.batch.groupby("step"):
            t = float(tr.steps.loc[tr.steps["step"] == step, "t_ms"].iloc[0])
            decoding = set(first.index[(first <= t) & (last > t)])
            if policy in ("sarathi", "vllm-v1", "orca"):
                assert decoding <= set(g["req"]), step
