"""Triton kernels vs the torch reference vs scaled_dot_product_attention. On CPU they run
under the Triton interpreter (TRITON_INTERPRET=1), so shapes stay small."""
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

pytest.importorskip("triton")
from gpu_runner.kernels import triton_attention as T
from gpu_runner.kernels.reference import paged_attention
from tests.helpers import scattered_cache

pytestmark = pytest.mark.slow  # Triton kernels under the interpreter on CPU


@pytest.mark.parametrize("H,Hkv,hd,bs,lens,starts", [
    (4, 2, 16, 4, [7, 20, 33], [0, 2, 17]),       # GQA 2:1, prefill and chunks against cached prefixes
    (4, 1, 32, 16, [40, 5], [0, 4]),              # MQA, long chunk over several tiles
    (2, 2, 16, 3, [18], [9]),                     # block size not a power of two
])
def test_flash_kernel_matches_reference_and_sdpa(H, Hkv, hd, bs, lens, starts):
    q, kc, vc, chunks, ref, fq, fk = scattered_cache(lens, starts, H, Hkv, hd, bs)
    out, stats = T.flash_attention_paged(q, kc, vc, chunks)
    assert stats is None
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(paged_attention(q, kc, vc, chunks), ref, rtol=1e-6, atol=1e-6)
    # SDPA with an explicit causal mask on the first chunk, independently of our reference
    L, s = lens[0], starts[0]
    k0 = kc.view(-1, Hkv, hd)[chunks[0].slots].transpose(0, 1)[None]
    v0 = vc.view(-1, Hkv, hd)[chunks[0].slots].transpose(0, 1)[None]
    q0 = fq[0].transpose(0, 1)[None]
    sd = F.scaled_dot_product_attention(q0, k0, v0, is_causal=True, enable_gqa=True)[0].transpose(0, 1)[s:]
    torch.testing.assert_close(out[:L - s], sd, rtol=1e-5, atol=1e-5)


def test_decode_kernel_matches_reference():
    q, kc, vc, chunks, ref, _, _ = scattered_cache([9, 1, 30, 17], [8, 0, 29, 16], 4, 2, 16, 4, seed=3)
    out = T.paged_decode(q, kc, vc, chunks)
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(T.paged_attention_triton(q, kc, vc, chunks), ref, rtol=1e-5, atol=1e-5)


def test_captured_statistics_reconstruct_logsumexp():
    H, Hkv, hd, bs = 4, 2, 16, 4
    lens, starts = [37, 12], [0, 3]
    q, kc, vc, chunks, ref, fq, fk = scattered_cache(lens, starts, H, Hkv, hd, bs, seed=5)
    head = 3
    out, (m, l) = T.flash_attention_paged(q, kc, vc, chunks, capture_head=head)
    plain, _ = T.flash_attention_paged(q, kc, vc, chunks)
    assert torch.equal(out, plain)                       # capturing does not change the result
    scale = 1 / math.sqrt(hd)
    for ci, (L, s) in enumerate(zip(lens, starts)):
        kvh = head // (H // Hkv)
        scores = (fq[ci][:, head] @ fk[ci][:, kvh].T) * scale          # [L, L]
        scores = scores.masked_fill(torch.ones(L, L, dtype=torch.bool).triu(1), float("-inf"))
        want = torch.logsumexp(scores, dim=-1)[s:]                      # rows of this chunk
        for qi in range(L - s):
            qt, r = divmod(qi, T.BLOCK_M)
            row_m, row_l = m[ci, qt, :, r].numpy(), l[ci, qt, :, r].numpy()
            last = np.flatnonzero(~np.isnan(row_m))[-1]                 # the last KV tile this row saw
            got = row_m[last] + math.log(row_l[last])
            assert got == pytest.approx(float(want[qi]), abs=1e-4)
            # the running max never decreases from tile to tile
            seen = row_m[~np.isnan(row_m)]
            assert (np.diff(seen) >= 0).all()


def test_engine_with_triton_attention_matches_torch(tmp_path, bundled):
    from core.config import SchedulerConfig
    from core.workload import load_workload
    from gpu_runner.engine import Engine
    from gpu_runner.options import EngineConfig
    from gpu_runner.tokenizer import ByteTokenizer
    model = bundled("tiny")
    w = load_workload(__import__("tests.conftest", fromlist=["DATA"]).DATA / "workloads" / "chapter31.json")
    outs = {}
    for att in ("torch", "triton"):
        eng = Engine(model, ByteTokenizer(), EngineConfig(scheduler=SchedulerConfig(block_size=2), attention=att,
                                                          capture_tiles=(0, 1) if att == "triton" else None))
        tr, outs[att] = eng.run(w)
    assert outs["triton"] == outs["torch"]
    tiles = [e for e in tr.other if e["type"] == "tiles"]
    assert tiles and all(e["layer"] == 0 and e["head"] == 1 for e in tiles)
    assert tr.meta["engine"]["attention"] == "triton"
