"""Speculative decoding in the runner: greedy equality, distribution preservation (and a
wrong variant that fails the same check), consistent acceptance statistics, no KV leaks."""
import numpy as np
import pytest
import torch

from core.config import SamplingParams, SchedulerConfig
from core.formulas import speculative as spec_math
from core.workload import Request, Workload
from gpu_runner.engine import Engine
from gpu_runner.options import EngineConfig
from gpu_runner.sampling import filtered_probs
from gpu_runner.spec_decode import verify
from gpu_runner.tokenizer import ByteTokenizer

pytestmark = pytest.mark.slow  # loads the bundled target and draft models

TOK = ByteTokenizer()
PROMPTS = ['The "while" statement is used', "A list comprehension", "Exceptions are raised",
           "The import system", "Assignment statements"]


@pytest.fixture(scope="module")
def models(bundled):
    t = bundled("tiny").double()
    d = bundled("tiny-draft").double()
    return t, d


def workload(n=4, out=30, gap=0.0, abort=None):
    reqs = []
    for i, p in enumerate(PROMPTS[:n]):
        ids = tuple(TOK.encode(p))
        reqs.append(Request(f"r{i}", i * gap, len(ids), out + 7 * i, prompt_ids=ids,
                            abort_at_ms=abort if (abort is not None and i == 1) else None))
    return Workload(reqs)


def serve(models, w, gamma=None, sampling=None, **sched):
    t, d = models
    cfg = EngineConfig(scheduler=SchedulerConfig(**sched), sampling=sampling or SamplingParams(),
                       gamma=gamma or 1)
    eng = Engine(t, TOK, cfg, draft=d if gamma else None, draft_name="tiny-draft" if gamma else None)
    tr, out = eng.run(w)
    bm = eng.last_core.scheduler.kv
    assert bm.num_free == bm.num_blocks, "KV blocks leaked"
    bm.check()
    return tr, out


@pytest.mark.parametrize("sched", [dict(policy="serial"), dict(policy="continuous"),
                                   dict(policy="continuous", token_budget=12, chunk=6),
                                   dict(policy="continuous", block_size=4, kv_blocks=24),
                                   dict(policy="static", max_seqs=2, block_size=1)],
                         ids=["serial", "continuous", "chunked-budget", "tiny-pool", "static-bs1"])
def test_greedy_speculative_equals_greedy(models, sched):
    w = workload()
    _, plain = serve(models, w, policy="continuous")
    for gamma in (1, 3, 5):
        tr, out = serve(models, w, gamma=gamma, **sched)
        assert out == plain, (sched, gamma)
        assert tr.meta["draft"]["gamma"] == gamma


def test_acceptance_statistics_are_consistent(models):
    tr, out = serve(models, workload(), gamma=4, sampling=SamplingParams(1.0, seed=5))
    spec = [e for e in tr.other if e["type"] == "spec"]
    assert spec
    ids = tr.ids
    src = tr.tokens.assign(rid=[ids[r] for r in tr.tokens["req"]])
    for rid in ids:
        mine = [e for e in spec if e["req"] == rid]
        toks = src[src["rid"] == rid]["source"].astype(str).value_counts()
        assert toks.get("accepted", 0) == sum(e["accepted"] for e in mine)
        assert toks.get("bonus", 0) == sum(e["bonus"] for e in mine)
        assert toks.get("recovered", 0) == sum(not e["bonus"] for e in mine)
        assert len(out[rid]) == toks.sum()
    for e in spec:  # acceptance happens position by position: a rejection ends the run
        flags = [p["accepted"] for p in e["positions"]]
        assert flags == [True] * e["accepted"] + ([False] if not e["bonus"] else [])
        assert all(0 <= p["u"] < 1 and p["q"] > 0 for p in e["positions"])
    # A verified step's tokens are released together (one emission time).
    t = tr.tokens
    per_step = t.groupby(["req", "t_ms"]).size()
    assert per_step.max() >= 2


def test_no_kv_leak_with_aborts_and_preemptions(models):
    w = workload(out=60, gap=1.0, abort=25.0)
    tr, out = serve(models, w, gamma=3, sampling=SamplingParams(0.9, top_k=40, seed=2),
                    policy="continuous", block_size=4, kv_blocks=30)
    reasons = dict(zip([tr.ids[r] for r in tr.finishes["req"]], tr.finishes["reason"]))
    assert reasons["r1"] == "abort"


def next_token_dists(models, prefix: str):
    t, d = models
    ids = torch.tensor([TOK.encode(prefix)])
    sp = SamplingParams(1.0)
    with torch.no_grad():
        p = filtered_probs(t(ids)[0, -1:], sp)[0]
        q = filtered_probs(d(ids)[0, -1:], sp)[0]
    return p, q


def empirical_first_token(p, q, n, seed, wrong=False):
    g = torch.Generator().manual_seed(seed)
    counts = np.zeros(len(p))
    P = torch.stack([p, p])                    # gamma = 1: the position verified, then the bonus position
    for _ in range(n):
        x = int(torch.multinomial(q, 1, generator=g))
        out, _, _ = verify(P, q[None], [x], g, greedy=False, wrong=wrong)
        counts[out[0]] += 1
    return counts / n


def test_speculative_sampling_preserves_the_target_distribution(models):
    # Of a few fixed prefixes, take the one where resampling from p would be most wrong
    # (computed exactly), so the wrong variant is clearly detectable.
    cands = ["The ", "In the ", "def f(x):\n    return ", "A ", "print("]
    best = max(cands, key=lambda c: 0.5 * np.abs(np.array(spec_math.wrong_final_distribution(
        *[x.numpy().astype(float) / x.numpy().sum() for x in next_token_dists(models, c)]))
        - next_token_dists(models, c)[0].numpy()).sum())
    p, q = next_token_dists(models, best)
    pn = p.numpy()
    wrong_exact = np.array(spec_math.wrong_final_distribution(pn / pn.sum(), q.numpy() / q.numpy().sum()))
    gap = 0.5 * np.abs(wrong_exact - pn).sum()
    assert gap > 0.04, f"prefix {best!r}: the wrong rule differs from p by only {gap:.3f}"
    n = 20_000
    ok = empirical_first_token(p, q, n, seed=1)
    bad = empirical_first_token(p, q, n, seed=1, wrong=True)
    tv_ok = 0.5 * np.abs(ok - pn).sum()
    tv_bad = 0.5 * np.abs(bad - pn).sum()
    # Sampling noise of a 20,000-draw histogram is ~0.01 in total variation here; the
    # threshold sits halfway to the wrong rule's exact deviation.
    assert tv_ok < gap / 2 < tv_bad, (tv_ok, gap, tv_bad)
