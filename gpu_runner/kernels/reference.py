"""Torch attention over a paged KV cache.

The cache holds K and V per layer as [num_blocks, block_size, kv_heads, head_dim]; a
sequence's block table lists its physical blocks in logical order, so position p lives at
slot table[p // block_size] * block_size + p % block_size.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F


@dataclass
class Chunk:
    """One sequence's part of a packed batch."""
    row: int                 # first row of its queries in the packed [N, ...] tensors
    n: int                   # new tokens (queries) this step
    start: int               # positions already in the cache before this step
    slots: torch.Tensor      # [start + n] slot ids of every position, in order (read through the table)


def paged_attention(q, k_cache, v_cache, chunks: list[Chunk], scale: float | None = None):
    """q: [N, H, hd] packed queries; k_cache/v_cache: [num_blocks, block_size, Hkv, hd] of
    one layer. Each chunk's queries (positions start..start+n-1) attend causally to its
    positions 0..start+n-1, read from the cache through its slots. Returns [N, H, hd]."""
    hd = q.shape[2]
    k_flat = k_cache.view(-1, k_cache.shape[2], hd)          # [slots, Hkv, hd]
    v_flat = v_cache.view(-1, v_cache.shape[2], hd)
    out = torch.empty_like(q)
    decodes = [c for c in chunks if c.n == 1]
    others = [c for c in chunks if c.n != 1]
    if decodes:  # all one-token queries in one padded call
        L = max(c.start + 1 for c in decodes)
        idx = torch.zeros(len(decodes), L, dtype=torch.long, device=q.device)
        mask = torch.zeros(len(decodes), 1, 1, L, dtype=torch.bool, device=q.device)
        for i, c in enumerate(decodes):
            idx[i, : c.start + 1] = c.slots
            mask[i, :, :, : c.start + 1] = True
        rows = torch.tensor([c.row for c in decodes], device=q.device)
        k = k_flat[idx].transpose(1, 2)                        # [B, Hkv, L, hd]
        v = v_flat[idx].transpose(1, 2)
        o = F.scaled_dot_product_attention(q[rows][:, :, None], k, v, attn_mask=mask, scale=scale,
                                           enable_gqa=True)   # [B, H, 1, hd]
        out[rows] = o[:, :, 0]
    for c in others:
        ctx = c.start + c.n
        k = k_flat[c.slots].transpose(0, 1)[None]              # [1, Hkv, ctx, hd]
        v = v_flat[c.slots].transpose(0, 1)[None]
        qc = q[c.row:c.row + c.n].transpose(0, 1)[None]        # [1, H, n, hd]
        qpos = torch.arange(c.start, ctx, device=q.device)[:, None]
        mask = torch.arange(ctx, device=q.device)[None, :] <= qpos   # [n, ctx] causal with offset
        o = F.scaled_dot_product_attention(qc, k, v, attn_mask=mask, scale=scale, enable_gqa=True)
        out[c.row:c.row + c.n] = o[0].transpose(0, 1)
    return out


def contiguous_causal_attention(q, k, v, scale: float | None = None):
    """Reference without any cache: q [T, H, hd], k/v [T, Hkv, hd], causal."""
    o = F.scaled_dot_product_attention(q.transpose(0, 1)[None], k.transpose(0, 1)[None], v.transpose(0, 1)[None],
                                       is_causal=True, scale=scale, enable_gqa=True)
    return o[0].transpose(0, 1)
