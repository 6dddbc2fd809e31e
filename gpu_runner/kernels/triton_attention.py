"""Triton attention kernels over the paged KV cache.

- `flash_attention_paged`: FlashAttention-style forward for packed variable-length query
  chunks (prefill chunks against their cached prefixes). One program = one query tile of one
  chunk and one head; it walks the chunk's keys tile by tile through the block table,
  keeping the running max m, running sum l and accumulator per query row (online softmax),
  causal with the chunk's position offset, GQA by mapping query head h to KV head h // group.
  With CAPTURE (a compile-time flag) it also stores (m, l) of every row after every KV tile
  for one chosen head; without it that code is not even compiled.
- `paged_decode`: one query token per sequence against its KV read through the block table,
  no gather copy.

On CUDA they compile natively; on CPU they run under the Triton interpreter
(TRITON_INTERPRET=1, set here when no GPU is present and the variable is not already set):
slow, for tests and small demos. The interpreter is a process-wide choice made when triton is
first imported (its own library functions are built for one mode), so a process that compiles
the kernels for a GPU target on a CPU-only machine sets TRITON_INTERPRET=0 before importing
this module (tests/test_triton_compile.py does, in a subprocess).
"""
from __future__ import annotations

import math
import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import triton
import triton.language as tl

BLOCK_M = 16
BLOCK_N = 16


@triton.jit
def _flash_fwd(Q, K, V, O, BT, QROW, QLEN, QSTART, STATS_M, STATS_L, scale,
               stride_qn, stride_qh, stride_on, stride_oh, stride_kb, stride_ks, stride_kh, stride_bt,
               capture_head, stats_stride_c, stats_stride_mt, stats_stride_kt,
               KV_GROUP: tl.constexpr, BS: tl.constexpr, HD: tl.constexpr,
               BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, CAPTURE: tl.constexpr):
    c = tl.program_id(0)
    h = tl.program_id(1)
    mt = tl.program_id(2)
    n = tl.load(QLEN + c)
    if mt * BLOCK_M < n:
        row0 = tl.load(QROW + c)
        start = tl.load(QSTART + c)
        offs_m = mt * BLOCK_M + tl.arange(0, BLOCK_M)            # query index within the chunk
        valid_m = offs_m < n
        qpos = start + offs_m                                     # absolute positions
        offs_d = tl.arange(0, HD)
        q = tl.load(Q + (row0 + offs_m)[:, None] * stride_qn + h * stride_qh + offs_d[None, :],
                    mask=valid_m[:, None], other=0.0)
        kvh = h // KV_GROUP
        m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
        l_i = tl.zeros([BLOCK_M], tl.float32)
        acc = tl.zeros([BLOCK_M, HD], tl.float32)
        ctx_end = start + tl.minimum(n, (mt + 1) * BLOCK_M)      # causal: no key after the tile's last query
        for kt in range(0, tl.cdiv(ctx_end, BLOCK_N)):
            offs_n = kt * BLOCK_N + tl.arange(0, BLOCK_N)
            in_ctx = offs_n < ctx_end
            blk = tl.load(BT + c * stride_bt + offs_n // BS, mask=in_ctx, other=0).to(tl.int64)
            base = blk * stride_kb + (offs_n % BS) * stride_ks + kvh * stride_kh
            k = tl.load(K + base[:, None] + offs_d[None, :], mask=in_ctx[:, None], other=0.0)
            s = tl.dot(q, tl.trans(k)).to(tl.float32) * scale    # [BLOCK_M, BLOCK_N]
            keep = (offs_n[None, :] <= qpos[:, None]) & in_ctx[None, :] & valid_m[:, None]
            keep = keep | ((~valid_m[:, None]) & (offs_n[None, :] == 0))  # padding rows: keep finite
            s = tl.where(keep, s, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(s, 1))
            alpha = tl.exp(m_i - m_new)
            p = tl.exp(s - m_new[:, None])
            l_i = l_i * alpha + tl.sum(p, 1)
            v = tl.load(V + base[:, None] + offs_d[None, :], mask=in_ctx[:, None], other=0.0)
            acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v).to(tl.float32)
            m_i = m_new
            if CAPTURE:
                if h == capture_head:
                    so = c * stats_stride_c + mt * stats_stride_mt + kt * stats_stride_kt + tl.arange(0, BLOCK_M)
                    tl.store(STATS_M + so, m_i, mask=valid_m)
                    tl.store(STATS_L + so, l_i, mask=valid_m)
        out = acc / l_i[:, None]
        tl.store(O + (row0 + offs_m)[:, None] * stride_on + h * stride_oh + offs_d[None, :],
                 out.to(O.dtype.element_ty), mask=valid_m[:, None])


@triton.jit
def _paged_decode(Q, K, V, O, BT, CTX, scale,
                  stride_qb, stride_qh, stride_ob, stride_oh, stride_kb, stride_ks, stride_kh, stride_bt,
                  KV_GROUP: tl.constexpr, BS: tl.constexpr, HD: tl.constexpr, BLOCK_N: tl.constexpr):
    b = tl.program_id(0)
    h = tl.program_id(1)
    ctx = tl.load(CTX + b)
    offs_d = tl.arange(0, HD)
    q = tl.load(Q + b * stride_qb + h * stride_qh + offs_d).to(tl.float32)[None, :]   # [1, HD]
    kvh = h // KV_GROUP
    # Loop-carried statistics keep one shape and dtype throughout (required when compiled).
    m_i = tl.full([1], float("-inf"), tl.float32)
    l_i = tl.zeros([1], tl.float32)
    acc = tl.zeros([1, HD], tl.float32)
    for kt in range(0, tl.cdiv(ctx, BLOCK_N)):
        offs_n = kt * BLOCK_N + tl.arange(0, BLOCK_N)
        in_ctx = offs_n < ctx
        blk = tl.load(BT + b * stride_bt + offs_n // BS, mask=in_ctx, other=0).to(tl.int64)
        base = blk * stride_kb + (offs_n % BS) * stride_ks + kvh * stride_kh
        k = tl.load(K + base[:, None] + offs_d[None, :], mask=in_ctx[:, None], other=0.0).to(tl.float32)
        s = tl.sum(k[None, :, :] * q[:, None, :], 2) * scale        # [1, BLOCK_N]
        s = tl.where(in_ctx[None, :], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        alpha = tl.exp(m_i - m_new)
        p = tl.exp(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(V + base[:, None] + offs_d[None, :], mask=in_ctx[:, None], other=0.0).to(tl.float32)
        acc = acc * alpha[:, None] + tl.sum(p[:, :, None] * v[None, :, :], 1)
        m_i = m_new
    out = acc / l_i[:, None]
    tl.store(O + b * stride_ob + h * stride_oh + offs_d[None, :], out.to(O.dtype.element_ty))


def _tables(chunks, block_size, device):
    width = max(-(-(c.start + c.n) // block_size) for c in chunks)
    bt = torch.zeros(len(chunks), width, dtype=torch.int32)
    for i, c in enumerate(chunks):
        blocks = (c.slots[::block_size] // block_size).to(torch.int32).cpu()
        bt[i, :len(blocks)] = blocks
    return bt.to(device)


def flash_attention_paged(q, k_cache, v_cache, chunks, capture_head: int | None = None, scale=None):
    """q [N, H, hd] packed; k/v_cache [num_blocks, bs, Hkv, hd]; chunks as in
    kernels.reference. Returns (out [N, H, hd], stats) where stats is None, or with
    capture_head set, (m, l) tensors [chunks, q_tiles, kv_tiles, BLOCK_M] (NaN = not written)."""
    N, H, hd = q.shape
    bs, hkv = k_cache.shape[1], k_cache.shape[2]
    scale = scale if scale is not None else 1.0 / math.sqrt(hd)
    dev = q.device
    out = torch.empty_like(q)
    bt = _tables(chunks, bs, dev)
    qrow = torch.tensor([c.row for c in chunks], dtype=torch.int32, device=dev)
    qlen = torch.tensor([c.n for c in chunks], dtype=torch.int32, device=dev)
    qstart = torch.tensor([c.start for c in chunks], dtype=torch.int32, device=dev)
    m_tiles = max(-(-c.n // BLOCK_M) for c in chunks)
    capture = capture_head is not None
    if capture:
        kv_tiles = max(-(-(c.start + c.n) // BLOCK_N) for c in chunks)
        sm = torch.full((len(chunks), m_tiles, kv_tiles, BLOCK_M), float("nan"), dtype=torch.float32, device=dev)
        sl = torch.full_like(sm, float("nan"))
        strides = (sm.stride(0), sm.stride(1), sm.stride(2))
    else:
        sm = sl = torch.empty(1, dtype=torch.float32, device=dev)
        strides = (0, 0, 0)
    _flash_fwd[(len(chunks), H, m_tiles)](
        q, k_cache, v_cache, out, bt, qrow, qlen, qstart, sm, sl, scale,
        q.stride(0), q.stride(1), out.stride(0), out.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), bt.stride(0),
        capture_head if capture else 0, *strides,
        KV_GROUP=H // hkv, BS=bs, HD=hd, BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, CAPTURE=capture)
    return out, ((sm, sl) if capture else None)


def paged_decode(q, k_cache, v_cache, chunks, scale=None):
    """One query per chunk (q [B, H, hd]) attending to positions 0..start of each."""
    B, H, hd = q.shape
    bs, hkv = k_cache.shape[1], k_cache.shape[2]
    scale = scale if scale is not None else 1.0 / math.sqrt(hd)
    dev = q.device
    out = torch.empty_like(q)
    bt = _tables(chunks, bs, dev)
    ctx = torch.tensor([c.start + 1 for c in chunks], dtype=torch.int32, device=dev)
    _paged_decode[(B, H)](q, k_cache, v_cache, out, bt, ctx, scale,
                          q.stride(0), q.stride(1), out.stride(0), out.stride(1),
                          k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), bt.stride(0),
                          KV_GROUP=H // hkv, BS=bs, HD=hd, BLOCK_N=BLOCK_N)
    return out


def paged_attention_triton(q, k_cache, v_cache, chunks, capture_head: int | None = None, stats_out=None):
    """Drop-in for kernels.reference.paged_attention: decodes through paged_decode, the rest
    through flash_attention_paged. With capture_head, per-tile (m, l) of the non-decode
    chunks are appended to stats_out as (chunk index, m, l)."""
    out = torch.empty_like(q)
    dec = [i for i, c in enumerate(chunks) if c.n == 1 and capture_head is None]
    rest = [i for i in range(len(chunks)) if i not in set(dec)]
    if dec:
        rows = torch.tensor([chunks[i].row for i in dec], device=q.device)
        out[rows] = paged_decode(q[rows].contiguous(), k_cache, v_cache, [chunks[i] for i in dec])
    if rest:
        o, stats = flash_attention_paged(q, k_cache, v_cache, [chunks[i] for i in rest], capture_head)
        for i in rest:
            c = chunks[i]
            out[c.row:c.row + c.n] = o[c.row:c.row + c.n]
        if stats is not None and stats_out is not None:
            stats_out.append(([chunks[i] for i in rest], stats))
    return out
