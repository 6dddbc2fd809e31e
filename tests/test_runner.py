"""The runner on CPU: paged attention, cache equivalence, scheduling invariance of greedy
outputs, KV hygiene, prefix caching, traces, the Hugging Face loader, the CLI."""
import json
import subprocess
import sys

import numpy as np
import pytest
import torch

from core.analysis.metrics import conservation
from core.config import SamplingParams, SchedulerConfig
from core.errors import ConfigError
from core.trace import to_doc, trace_from_doc
from core.workload import Request, Workload
from gpu_runner.engine import Engine, PagedKVCache
from gpu_runner.kernels.reference import Chunk, StepChunks, contiguous_causal_attention, paged_attention
from gpu_runner.model import ModelConfig, Transformer, init_weights
from gpu_runner.options import EngineConfig
from gpu_runner.tokenizer import ByteTokenizer
from tests.conftest import DATA, ROOT
from tests.helpers import scattered_cache

pytestmark = pytest.mark.slow  # loads the bundled torch models, runs the runner CLI in subprocesses

SCHEMA = json.loads((DATA / "schema" / "serving-trace-1.json").read_text())


@pytest.fixture(scope="module")
def model():
    """A small random model in float64, so scheduling (not rounding) decides the outputs."""
    torch.manual_seed(0)
    m = Transformer(ModelConfig(dim=64, n_layers=2, n_heads=4, n_kv_heads=2, hidden_dim=160, max_seq_len=512))
    init_weights(m, seed=3)
    with torch.no_grad():  # larger weights than the training init: sharper, more varied predictions
        for p in m.parameters():
            if p.dim() >= 2:
                p.mul_(12)
    return m.double().eval()


def run(model, workload, **sched):
    eng = Engine(model, ByteTokenizer(), EngineConfig(scheduler=SchedulerConfig(**sched)))
    tr, out = eng.run(workload)
    bm = eng.last_core.scheduler.kv
    assert bm.num_free == bm.num_blocks, "blocks leaked"
    bm.check()
    return tr, out


def text_workload(n=6, seed=0):
    rng = np.random.default_rng(seed)
    corpus = ByteTokenizer().encode((DATA / "corpus" / "pydoc_topics.txt").read_text()[:20000])
    reqs = []
    for i in range(n):
        start = int(rng.integers(0, len(corpus) - 100))
        p = int(rng.integers(3, 40))
        reqs.append(Request(f"r{i}", float(i) * 0.5, p, int(rng.integers(2, 20)),
                            prompt_ids=tuple(corpus[start:start + p])))
    return Workload(reqs, name="text")


# ---- attention and cache equivalence ---------------------------------------------------------

def test_paged_attention_equals_contiguous():
    torch.manual_seed(1)
    H, Hkv, hd, bs = 4, 2, 8, 4
    lens = [7, 1, 12, 5]
    nb = 16
    kc = torch.zeros(nb, bs, Hkv, hd, dtype=torch.float64)
    vc = torch.zeros_like(kc)
    perm = torch.randperm(nb).tolist()           # scattered physical blocks
    chunks, qs, refs, row, used = [], [], [], 0, 0
    for L in lens:
        k, v, q = (torch.randn(L, Hkv, hd, dtype=torch.float64), torch.randn(L, Hkv, hd, dtype=torch.float64),
                   torch.randn(L, H, hd, dtype=torch.float64))
        table = perm[used:used + -(-L // bs)]
        used += len(table)
        slots = torch.tensor([table[p // bs] * bs + p % bs for p in range(L)])
        kc.view(-1, Hkv, hd)[slots] = k
        vc.view(-1, Hkv, hd)[slots] = v
        start = L - 1 if L == 1 else 0 if L == 5 else 2   # a decode, chunks with a cached prefix, one without
        chunks.append(Chunk(row, L - start, start, slots))
        qs.append(q[start:])
        refs.append(contiguous_causal_attention(q, k, v)[start:])
        row += L - start
    out = paged_attention(torch.cat(qs), kc, vc, chunks)
    torch.testing.assert_close(out, torch.cat(refs), rtol=0, atol=1e-12)


def test_whole_prompts_of_one_length_attend_in_one_call_as_each_alone():
    """Issue 53: whole prompts of one length, packed one after another, go through one causal call
    ([B, H, n, hd]); each row equals its prompt's contiguous attention, beside a prompt of another
    length, a decode and a chunk with a cached prefix in the same step."""
    plan = [(6, 0), (6, 0), (6, 0), (9, 0), (7, 3), (6, 0), (6, 0), (3, 2)]   # (length, cached prefix)
    q, kc, vc, chunks, refs, _, _ = scattered_cache([L for L, _ in plan], [s for _, s in plan], 4, 2, 8, 4, seed=2,
                                                    dtype=torch.float64)
    out = paged_attention(q, kc, vc, StepChunks(chunks))
    torch.testing.assert_close(out, refs, rtol=0, atol=1e-12)


def incremental_logits(model, ids, corrupt_at=None, chunk=3, block_size=4):
    """Prefill `chunk` tokens, then decode one by one through the paged cache; logits for
    every position. Optionally corrupt the cached K of one position after it is written."""
    cfg = model.cfg
    cache = PagedKVCache(cfg.n_layers, 8, block_size, cfg.n_kv_heads, cfg.head_dim, "cpu", torch.float64)
    table = [5, 2, 7, 0, 3, 1, 6, 4]
    out = []
    pos = 0
    while pos < len(ids):
        n = chunk if pos == 0 else 1
        slots = torch.tensor([table[p // block_size] * block_size + p % block_size for p in range(pos + n)])
        ch = [Chunk(0, n, pos, slots)]
        h = model.forward_paged(torch.tensor(ids[pos:pos + n]), torch.arange(pos, pos + n), slots[pos:], ch, cache,
                                lambda q, li, c: paged_attention(q, cache.k[li], cache.v[li], c))
        out.append(model.logits(h))
        if corrupt_at is not None and pos <= corrupt_at < pos + n:
            s = table[corrupt_at // block_size] * block_size + corrupt_at % block_size
            cache.k[0].view(-1, cfg.n_kv_heads, cfg.head_dim)[s] += 0.5
        pos += n
    return torch.cat(out)


def test_incremental_decode_equals_full_recompute_and_detects_corruption(model):
    ids = ByteTokenizer().encode("The assert statement checks")
    with torch.no_grad():
        full = model(torch.tensor([ids]))[0]
        inc = incremental_logits(model, ids)
        torch.testing.assert_close(inc, full, rtol=0, atol=1e-9)
        bad = incremental_logits(model, ids, corrupt_at=4)
    assert torch.allclose(bad[:5], full[:5], atol=1e-9)         # positions before the change are fine
    assert not torch.allclose(bad[5:], full[5:], atol=1e-6)     # a wrong cached value breaks the rest


# ---- greedy outputs do not depend on how the work is scheduled --------------------------------

CONFIGS = {
    "serial": dict(policy="serial"),
    "static": dict(policy="static", max_seqs=3),
    "continuous": dict(policy="continuous"),
    "chunked": dict(policy="continuous", token_budget=16, chunk=5),
    "prefix-caching": dict(policy="continuous", prefix_caching=True, block_size=4),
    "tiny-pool": dict(policy="continuous", block_size=4, kv_blocks=14),
    "block-size-1": dict(policy="continuous", block_size=1),
    "block-size-32": dict(policy="continuous", block_size=32),
}


def test_greedy_outputs_identical_across_scheduling(model):
    w = text_workload()
    base_tr, base = run(model, w, policy="serial")
    assert any(len(set(v)) > 1 for v in base.values())          # outputs are not trivially constant
    preempted = 0
    for name, cfg in CONFIGS.items():
        tr, out = run(model, w, **cfg)
        assert out == base, name
        assert conservation(tr) == []
        preempted += len(tr.preempts)
    assert preempted > 0, "the tiny pool should force preemptions"


def test_sampling_is_reproducible_across_batching(model):
    w = text_workload(5, seed=4)
    outs = []
    for cfg in (dict(policy="serial"), dict(policy="continuous"), dict(policy="continuous", chunk=3, token_budget=8)):
        eng = Engine(model, ByteTokenizer(), EngineConfig(scheduler=SchedulerConfig(**cfg),
                                                          sampling=SamplingParams(1.0, 20, 0.95, seed=11)))
        outs.append(eng.run(w)[1])
    assert outs[0] == outs[1] == outs[2]
    other = Engine(model, ByteTokenizer(), EngineConfig(sampling=SamplingParams(1.0, 20, 0.95, seed=12))).run(w)[1]
    assert other != outs[0]


# ---- prefix caching, tenants, aborts, traces -----------------------------------------------

def shared_prefix_workload(tenants):
    system = ByteTokenizer().encode("You are a helpful assistant for Python documentation. " * 2)
    reqs = []
    for i, t in enumerate(tenants):
        user = ByteTokenizer().encode(f"Question {i}: what does 'with' do?")
        reqs.append(Request(f"q{i}", 5.0 * i, len(system) + len(user), 6, prompt_ids=tuple(system + user), tenant=t))
    return Workload(reqs, name="shared")


def test_prefix_caching_hits_same_outputs_and_tenant_isolation(model):
    w = shared_prefix_workload(["a", "a", "a", "b"])
    on, out_on = run(model, w, policy="serial", prefix_caching=True, block_size=8)
    off, out_off = run(model, w, policy="serial", prefix_caching=False, block_size=8)
    assert out_on == out_off
    hits = on.kv[on.kv["op"] == "hit"]
    assert set(hits["req"].map(lambda r: on.ids[r])) == {"q1", "q2"}   # tenant b never hits tenant a's blocks
    pre_on = on.batch[on.batch["kind"] == "prefill"]["tokens"].sum()
    pre_off = off.batch[off.batch["kind"] == "prefill"]["tokens"].sum()
    assert pre_on < pre_off


def test_abort_returns_blocks(model):
    w = text_workload(4, seed=2)
    reqs = [Request(r.id, r.arrival_ms, r.prompt_tokens, 200 if i == 1 else r.max_output_tokens, r.prompt_ids,
                    abort_at_ms=30.0 if i == 1 else None) for i, r in enumerate(w.requests)]
    tr, out = run(model, Workload(reqs), policy="continuous", block_size=4)
    reasons = dict(zip([tr.ids[r] for r in tr.finishes["req"]], tr.finishes["reason"]))
    assert reasons["r1"] == "abort" and len(out["r1"]) < 200


def test_measured_trace_is_valid_and_monotone(model):
    import jsonschema
    tr, _ = run(model, text_workload(), policy="continuous", chunk=8, token_budget=24, block_size=4)
    doc = to_doc(tr)
    jsonschema.validate(doc, SCHEMA)
    back = trace_from_doc(doc)
    assert back.meta["source"] == "measured" and back.meta["device"].startswith("CPU")
    assert back.meta["engine"]["name"] == "gpu_runner" and back.meta["versions"]["torch"] == torch.__version__
    for _, g in back.tokens.sort_values(["req", "index"]).groupby("req"):
        assert (np.diff(g["t_ms"].to_numpy()) >= 0).all()
    assert (back.steps["dur_ms"] > 0).all()
    assert {"alloc", "free"} <= set(back.kv["op"])


def test_recording_off_gives_the_same_tokens(model):
    w = text_workload(3)
    _, a = run(model, w)
    eng = Engine(model, ByteTokenizer(), EngineConfig(record=False))
    tr, b = eng.run(w)
    assert tr is None and a == b


# ---- oneDNN linears (--matmul onednn, the CPU float32 default) -------------------------------

def fp32_model():
    torch.manual_seed(0)
    m = Transformer(ModelConfig(dim=64, n_layers=2, n_heads=4, n_kv_heads=2, hidden_dim=160, max_seq_len=256,
                                qkv_bias=True))
    init_weights(m, seed=5)
    with torch.no_grad():
        for name, p in m.named_parameters():
            if name.endswith("bias"):
                p.normal_(0, 0.1)
    return m.eval()


def packed_fp32_model():
    """(fp32 model, its OneDNNWeights), or skip where torch has no oneDNN."""
    from gpu_runner import onednn
    m = fp32_model()
    if not onednn.available(m):
        pytest.skip("torch built without oneDNN")
    return m, onednn.OneDNNWeights(m)


def test_onednn_linears_match_the_modules_and_follow_weight_changes():
    m, w = packed_fp32_model()
    x = torch.randn(7, 64)
    pos = torch.arange(3, 10)
    cos, sin = m.rope_cos[pos], m.rope_sin[pos]
    close = dict(rtol=1e-5, atol=1e-6)
    with torch.inference_mode():
        for li, layer in enumerate(m.layers):
            for got, want in zip(w.qkv(li, x, *w.rope_tables(cos, sin)), layer.self_attn.qkv(x, cos, sin)):
                torch.testing.assert_close(got, want, **close)
            torch.testing.assert_close(w.mlp(li, x), layer.mlp(x), **close)
            torch.testing.assert_close(w.o(li, x), layer.self_attn.o_proj(x), **close)
        torch.testing.assert_close(w.logits(x), m.lm_head(x), **close)
        before = w.mlp(1, x)
    with torch.no_grad():
        m.layers[1].mlp.down_proj.weight.mul_(2)          # an in-place change (an optimiser step)
    with torch.inference_mode():
        after = w.fresh().mlp(1, x)
        torch.testing.assert_close(after, m.layers[1].mlp(x), **close)
        torch.testing.assert_close(after, 2 * before, **close)


def test_onednn_linear_rows_do_not_depend_on_the_rest_of_the_batch():
    """A token's projections are the same bits alone or beside others, so a request's greedy
    tokens do not depend on who else is in its batch through the linears."""
    _, w = packed_fp32_model()
    x = torch.randn(65, 64)
    with torch.inference_mode():
        alone = torch.cat([w.mlp(0, x[i:i + 1]) for i in range(len(x))])
        for n in (2, 5, 16, 65):
            assert torch.equal(w.mlp(0, x[:n]), alone[:n]), n


def _paged_step(m, weights, rows=None):
    """One packed step of three prompts (lengths 5, 9, 3) through a fresh paged cache: (hidden, cache)."""
    from gpu_runner.batching import attend_with, forward, pack
    from gpu_runner.kernels.reference import paged_attention
    cfg = m.cfg
    cache = PagedKVCache(cfg.n_layers, 12, 4, cfg.n_kv_heads, cfg.head_dim, "cpu", next(m.parameters()).dtype)
    g = torch.Generator().manual_seed(9)
    entries, block = [], 0
    for n in (5, 9, 3):
        nb = -(-n // 4)
        table = list(range(block, block + nb))[::-1]                  # (scattered: last block first)
        block += nb
        slots = [table[p // 4] * 4 + p % 4 for p in range(n)]
        entries.append((torch.randint(0, cfg.vocab_size, (n,), generator=g).tolist(), 0, slots))
    packed = pack(entries, "cpu")
    with torch.inference_mode():
        hidden = forward(m, packed, cache, attend_with(paged_attention, cache), weights,
                         rows=None if rows is None else torch.tensor(rows, dtype=torch.long))
    return hidden, cache


@pytest.mark.parametrize("packed_weights", [False, True])
def test_the_last_layer_on_the_wanted_rows_only_gives_their_hidden_states_bit_for_bit(packed_weights):
    """forward_paged with rows (each prompt's last token, then a run of rows as a speculative
    entry's) equals the same rows of the whole step's hidden states, bit for bit, and leaves the
    same K/V in the cache; with no row wanted it still writes every layer's K/V."""
    m, w = packed_fp32_model() if packed_weights else (fp32_model(), None)
    full, cache = _paged_step(m, w)
    rows = [4, 13, 16, 6, 7, 8]
    some, cache2 = _paged_step(m, w, rows)
    assert torch.equal(some, full[rows])
    none, cache3 = _paged_step(m, w, [])
    assert none.shape == (0, m.cfg.dim)
    for li in range(m.cfg.n_layers):
        assert torch.equal(cache2.k[li], cache.k[li]) and torch.equal(cache3.v[li], cache.v[li])


def test_matmul_option_is_recorded_and_checked(model):
    from gpu_runner import onednn
    with pytest.raises(ConfigError, match="matmul onednn"):
        Engine(model, ByteTokenizer(), EngineConfig(matmul="onednn"))      # a float64 model
    m = fp32_model()
    tr, _ = Engine(m, ByteTokenizer(), EngineConfig()).run(text_workload(2))
    assert tr.meta["engine"]["matmul"] == ("onednn" if onednn.available(m) else "torch")
    tr, _ = Engine(m, ByteTokenizer(), EngineConfig(matmul="torch")).run(text_workload(2))
    assert tr.meta["engine"]["matmul"] == "torch"


# ---- Hugging Face checkpoints -----------------------------------------------------------------

@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_hf_checkpoint_matches_transformers(arch, tmp_path):
    transformers = pytest.importorskip("transformers")
    from gpu_runner.hf import load_hf
    torch.manual_seed(0)
    C, M = {"llama": (transformers.LlamaConfig, transformers.LlamaForCausalLM),
            "qwen2": (transformers.Qwen2Config, transformers.Qwen2ForCausalLM)}[arch]
    cfg = C(vocab_size=97, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=256, tie_word_embeddings=False)
    hf = M(cfg).eval()
    hf.save_pretrained(tmp_path)
    ours, _ = load_hf(tmp_path)
    ids = torch.randint(0, 97, (1, 16))
    with torch.no_grad():
        torch.testing.assert_close(ours(ids), hf(ids).logits, rtol=1e-4, atol=1e-5)
        want = hf.generate(ids, max_new_tokens=12, do_sample=False)[0, 16:].tolist()
    w = Workload([Request("x", 0.0, 16, 12, prompt_ids=tuple(ids[0].tolist()))])
    _, out = Engine(ours, None, EngineConfig(scheduler=SchedulerConfig(block_size=4))).run(w)
    assert out["x"] == want


def test_exported_tiny_model_loads_in_transformers_with_its_tokenizer(tmp_path, bundled):
    """`export-hf` (issue 11): transformers reads the directory, its logits and greedy tokens
    equal ours, and its tokenizer encodes text to the same byte ids as ours."""
    transformers = pytest.importorskip("transformers")
    from gpu_runner.__main__ import main
    assert main(["export-hf", "--model", "tiny", "--out", str(tmp_path / "hf")]) == 0
    d = tmp_path / "hf"
    assert {p.name for p in d.iterdir()} == {"config.json", "model.safetensors", "tokenizer.json",
                                             "tokenizer_config.json"}
    text = 'The "for" statement — naïve'
    tok = transformers.AutoTokenizer.from_pretrained(str(d))
    assert tok(text, add_special_tokens=False)["input_ids"] == list(text.encode()) == ByteTokenizer().encode(text)
    assert tok.decode(list(text.encode())) == text and (tok.bos_token_id, tok.eos_token_id) == (256, 257)
    hf = transformers.LlamaForCausalLM.from_pretrained(str(d)).eval()
    ours = bundled("tiny")
    ids = torch.tensor([list(text.encode())])
    with torch.no_grad():
        torch.testing.assert_close(ours(ids), hf(ids).logits, rtol=1e-4, atol=1e-4)
        want = hf.generate(ids, max_new_tokens=16, do_sample=False, eos_token_id=None)[0, ids.shape[1]:].tolist()
    w = Workload([Request("x", 0.0, ids.shape[1], 16, prompt_ids=tuple(ids[0].tolist()))])
    _, out = Engine(ours, ByteTokenizer(), EngineConfig()).run(w)
    assert out["x"] == want[:len(out["x"])] and len(out["x"]) >= 1


# ---- command line -------------------------------------------------------------------------

def cli(*args):
    p = subprocess.run([sys.executable, "-m", "gpu_runner", *map(str, args)], cwd=ROOT, capture_output=True,
                       text=True, timeout=600)
    return p.returncode, p.stdout, p.stderr


@pytest.mark.parametrize("args,msg", [
    (["capture", "--workload", "nope.json", "--out", "x.json"], "no such file"),
    (["capture", "--workload", "data/workloads/burst5.json", "--out", "x.json", "--max-seqs", "0"], "--max-seqs"),
    (["generate", "--prompt-ids", "1,x", "--max-tokens", "3"], "not an integer"),
    (["generate", "--prompt", "hi", "--model", "/nonexistent/dir"], "not a directory"),
    (["generate", "--prompt-ids", "999", "--max-tokens", "2"], "outside the vocabulary"),
])
def test_cli_bad_input_exit_2(args, msg):
    rc, out, err = cli(*args)
    assert rc == 2 and "Traceback" not in err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and msg in lines[0], err


# ---- the bundled models ------------------------------------------------------------------

def corpus_words():
    import re
    return set(re.findall(r"[A-Za-z]{2,}", (DATA / "corpus" / "pydoc_topics.txt").read_text()))


def test_bundled_target_writes_corpus_like_text():
    import re
    rc, out, err = cli("generate", "--prompt", 'The "while" statement is used', "--max-tokens", "160", "--json")
    assert rc == 0, err
    doc = json.loads(out)
    assert len(doc["ids"]) == 160 and all(0 <= i < 258 for i in doc["ids"])
    words = re.findall(r"[A-Za-z]{2,}", doc["text"])
    known = corpus_words()
    assert len(words) >= 15
    assert sum(w in known for w in words) / len(words) > 0.8, doc["text"]   # real words of the corpus


def test_bundled_models_load_and_match_their_configs():
    from gpu_runner import checkpoint
    tiny = checkpoint.load_bundled(checkpoint.BUNDLED["tiny"])
    draft = checkpoint.load_bundled(checkpoint.BUNDLED["tiny-draft"])
    assert 2_000_000 <= tiny.num_params() <= 5_000_000
    assert tiny.cfg.n_kv_heads < tiny.cfg.n_heads                      # grouped-query attention
    assert draft.num_params() < tiny.num_params() / 5
    notes = json.loads((checkpoint.BUNDLED["tiny"] / "config.json").read_text())["notes"]
    assert notes["final_val_loss"] < 1.6                                # nats/byte: far below uniform ln 258 = 5.55


def test_cli_capture_writes_a_measured_trace(tmp_path):
    rc, out, err = cli("capture", "--workload", DATA / "workloads" / "chapter31.json", "--out", tmp_path / "t.json",
                       "--block-size", "2", "--kv-blocks", "6")
    assert rc == 0, err
    from core.trace import load_trace
    tr = load_trace(tmp_path / "t.json")
    assert tr.meta["source"] == "measured" and tr.meta["model"]["name"] == "tiny"
    assert sorted(tr.tokens.groupby("req").size().tolist()) == [1, 2, 3]
