"""Stop conditions behave the same on every path: the scheduler's one completion path cuts
emission at the first stop id (EOS) and at max tokens, for plain and speculative steps.

The model-level test uses the bundled tiny model exported as a Hugging Face checkpoint whose
eos_token_id is the space byte (32), a token greedy decoding emits within a few steps, so
every request stops early; greedy speculative decoding must stop at exactly the same token,
for every gamma."""
import numpy as np
import pytest
import torch

from core.config import SchedulerConfig
from core.engine.outputs import ExecutorOutput
from core.engine.scheduler import Scheduler
from core.workload import Request, Workload
from gpu_runner.engine import Engine
from gpu_runner.hf import export_hf, load_hf
from gpu_runner.options import EngineConfig
from gpu_runner.tokenizer import ByteTokenizer

SPACE = 32
PROMPTS = ['The "while" statement is used', "A list comprehension", "Exceptions are raised",
           "The import system", "Assignment statements"]


def one_request(prompt=4, out=10):
    return Workload([Request("a", 0.0, prompt, out, prompt_ids=tuple(range(prompt)))])


def test_update_cuts_at_the_first_stop_id_and_returns_its_blocks():
    # Prefill of 4 tokens (block size 2) emits token 7; a speculative-style step then
    # computes 1 + 3 tokens and returns 4 ids with the stop id (9) second: the request emits
    # [7, 5, 9], finishes with reason "stop", and its blocks go back to the pool.
    sched = Scheduler(one_request(), SchedulerConfig(block_size=2, spec_gamma=3), stop_token_ids=[9])
    sched.admit_arrivals(0.0)
    b = sched.schedule(0.0)
    assert b.num_tokens.tolist() == [4]
    sched.update(b, ExecutorOutput(1.0, tokens=[[7]]))
    b = sched.schedule(1.0)
    assert b.num_tokens.tolist() == [4] and not b.is_prefill[0]     # last token + 3 draft tokens
    happened = sched.update(b, ExecutorOutput(2.0, tokens=[[5, 9, 4, 4]], sources=[[1, 2, 2, 3]]))
    assert happened.token_reqs.tolist() == [0, 0] and happened.token_ids.tolist() == [5, 9]
    assert [(f.req, f.reason) for f in happened.finished] == [(0, "stop")]
    assert sched.requests.token_ids[0][4:] == [7, 5, 9]
    assert sched.done() and sched.kv.num_free == sched.kv.num_blocks
    sched.kv.check()


def test_update_cuts_at_max_tokens_and_rolls_back_rejected_positions():
    # Output limit 3: after the first token there is room for 2 more, so the scheduler asks
    # for 1 draft (+ the bonus); an executor returning 3 tokens emits only the 2 allowed.
    sched = Scheduler(one_request(out=3), SchedulerConfig(block_size=2, spec_gamma=3))
    sched.admit_arrivals(0.0)
    sched.update(sched.schedule(0.0), ExecutorOutput(1.0, tokens=[[7]]))
    b = sched.schedule(1.0)
    assert b.num_tokens.tolist() == [2]                  # last token + 1 draft
    happened = sched.update(b, ExecutorOutput(2.0, tokens=[[5, 6, 8]]))
    assert sched.requests.token_ids[0][4:] == [7, 5, 6] and [f.reason for f in happened.finished] == ["length"]
    # A rejection keeps KV only for the accepted prefix: prompt + emitted - 1 positions.
    sched = Scheduler(one_request(out=10), SchedulerConfig(block_size=2, spec_gamma=3))
    sched.admit_arrivals(0.0)
    sched.update(sched.schedule(0.0), ExecutorOutput(1.0, tokens=[[7]]))
    sched.update(sched.schedule(1.0), ExecutorOutput(2.0, tokens=[[5, 6]]))   # 1 accepted + 1 recovered
    assert int(sched.requests.computed[0]) == 4 + 3 - 1
    assert len(sched.kv.tables[0]) == 3                  # 6 positions in blocks of 2
    sched.kv.check()


@pytest.fixture(scope="module")
def eos_space_models(tmp_path_factory, bundled):
    d = tmp_path_factory.mktemp("tiny-eos-space")
    export_hf(bundled("tiny"), d, eos_token_id=SPACE, bos_token_id=256)
    for name in ("tokenizer.json", "tokenizer_config.json"):   # EOS from config.json alone
        (d / name).unlink()
    target, tok = load_hf(d, dtype=torch.float64)
    assert tok is None and target.eos_token_id == SPACE
    draft = bundled("tiny-draft").double()
    return target, draft


def test_cli_export_hf_round_trips(tmp_path, bundled):
    from gpu_runner.__main__ import main
    assert main(["export-hf", "--model", "tiny", "--out", str(tmp_path / "x"), "--eos-token-id", "32"]) == 0
    ours = bundled("tiny")
    back, _ = load_hf(tmp_path / "x")
    x = torch.randint(0, 256, (1, 12))
    with torch.no_grad():
        torch.testing.assert_close(back(x), ours(x), rtol=0, atol=0)
    assert back.eos_token_id == SPACE
    assert main(["export-hf", "--model", "tiny", "--out", str(tmp_path / "x")]) == 2   # never overwrites


def serve(target, draft, gamma, **sched):
    reqs = [Request(f"r{i}", 0.0, len(p), 40, prompt_ids=tuple(ByteTokenizer().encode(p)))
            for i, p in enumerate(PROMPTS)]
    eng = Engine(target, None, EngineConfig(scheduler=SchedulerConfig(**sched), gamma=gamma or 1), "cpu",
                 "tiny-eos-space", draft=draft if gamma else None, draft_name="tiny-draft" if gamma else None)
    tr, out = eng.run(Workload(reqs))
    bm = eng.last_core.scheduler.kv
    assert bm.num_free == bm.num_blocks
    bm.check()
    reasons = dict(zip((tr.ids[r] for r in tr.finishes["req"]), tr.finishes["reason"]))
    return out, reasons


@pytest.mark.slow
@pytest.mark.parametrize("sched", [dict(), dict(block_size=4, token_budget=16, chunk=8)], ids=["default", "chunked"])
def test_greedy_speculative_stops_where_greedy_plain_stops(eos_space_models, sched):
    target, draft = eos_space_models
    plain, plain_reasons = serve(target, None, None, **sched)
    stopped = [rid for rid, toks in plain.items() if toks and toks[-1] == SPACE]
    assert len(stopped) >= 3, plain                      # EOS is frequent: most requests stop early
    for rid, toks in plain.items():
        assert SPACE not in toks[:-1]                    # nothing after the stop token
        assert plain_reasons[rid] == ("stop" if rid in stopped else "length")
        assert len(toks) == 40 or rid in stopped
    for gamma in (1, 2, 3, 5):
        out, reasons = serve(target, draft, gamma, **sched)
        assert out == plain, gamma
        assert reasons == plain_reasons, gamma
    assert np.mean([len(t) for t in plain.values()]) < 40
