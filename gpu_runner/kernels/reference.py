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


class StepChunks(list):
    """The chunks of one step (a list of Chunk) with a memo for what every layer's attention
    derives from them alone (gather indices, masks, block tables): built once per step, not
    once per layer. A plain list works too (then nothing is memoised)."""
    __slots__ = ("memo",)

    def __init__(self, chunks=()):
        super().__init__(chunks)
        self.memo = {}


def per_step(chunks, key: str, build):
    """build() once per step for `chunks` (a StepChunks); every call on a plain list."""
    memo = getattr(chunks, "memo", None)
    if memo is None:
        return build()
    out = memo.get(key)
    if out is None:
        out = memo[key] = build()
    return out


@dataclass
class _Plan:
    dec_rows: torch.Tensor | None   # [B] query rows of the one-token chunks (None: no decodes)
    all_decodes: bool               # they are every row, in order (a decode-only step)
    dec_idx: torch.Tensor | None    # [B * L] slots of their positions, padded with slot 0
    dec_mask: torch.Tensor | None   # [B, 1, 1, L] True where a position is in the context
    others: list                    # (chunk, causal mask [n, ctx], or None: no cached prefix, is_causal)
    prompts: list                   # (first row, B, n, slots [B * n]): B whole prompts of n tokens, rows in a run


def _plan(chunks, device) -> _Plan:
    decodes = [c for c in chunks if c.n == 1]
    rows = idx = mask = None
    if decodes:   # all one-token queries in one padded call
        lens = torch.tensor([c.start + 1 for c in decodes], device=device)
        L = int(lens.max())
        flat = torch.cat([c.slots[:c.start + 1] for c in decodes])
        col = torch.arange(L, device=device)
        mask = col[None, :] < lens[:, None]                                   # [B, L]
        idx = torch.zeros(len(decodes), L, dtype=torch.long, device=device)
        idx[mask] = flat
        idx, mask = idx.reshape(-1), mask[:, None, None, :]
        rows = torch.tensor([c.row for c in decodes], device=device)
    others, runs = [], []
    for c in chunks:
        if c.n != 1 and c.start == 0:   # no cached prefix: plain causal (same values, upper tiles skipped)
            last = runs[-1] if runs else None
            if last is not None and last[-1].n == c.n and last[-1].row + c.n == c.row:
                last.append(c)           # (prompts of one length, packed one after another: one call for all)
            else:
                runs.append([c])
        elif c.n != 1:
            ctx = c.start + c.n
            qpos = torch.arange(c.start, ctx, device=device)[:, None]
            others.append((c, torch.arange(ctx, device=device)[None, :] <= qpos))   # causal with offset
    prompts = [(r[0].row, len(r), r[0].n, torch.cat([c.slots for c in r]) if len(r) > 1 else r[0].slots)
               for r in runs]
    return _Plan(rows, not others and not prompts and [c.row for c in decodes] == list(range(len(decodes))), idx,
                 mask, others, prompts)


def paged_attention(q, k_cache, v_cache, chunks: list[Chunk], scale: float | None = None):
    """q: [N, H, hd] packed queries; k_cache/v_cache: [num_blocks, block_size, Hkv, hd] of
    one layer. Each chunk's queries (positions start..start+n-1) attend causally to its
    positions 0..start+n-1, read from the cache through its slots (index_select: whole
    [Hkv, hd] rows copied, ~5x faster than advanced indexing). Returns [N, H, hd]."""
    hd, hkv = q.shape[2], k_cache.shape[2]
    k_flat = k_cache.view(-1, hkv, hd)          # [slots, Hkv, hd]
    v_flat = v_cache.view(-1, hkv, hd)
    plan = per_step(chunks, "reference", lambda: _plan(chunks, q.device))
    out = torch.empty_like(q)
    if plan.dec_rows is not None:
        B = len(plan.dec_rows)
        k = k_flat.index_select(0, plan.dec_idx).view(B, -1, hkv, hd).transpose(1, 2)   # [B, Hkv, L, hd]
        v = v_flat.index_select(0, plan.dec_idx).view(B, -1, hkv, hd).transpose(1, 2)
        # The query heads that share a K/V head become that head's queries (one position each,
        # so no causal mask): [B, Hkv, H/Hkv, hd] against [B, Hkv, L, hd], no K/V repeated for
        # grouped-query attention (half the time of enable_gqa at 16 sequences)
        H = q.shape[1]
        qd = q.reshape(B, hkv, H // hkv, hd) if plan.all_decodes else q[plan.dec_rows].view(B, hkv, H // hkv, hd)
        o = F.scaled_dot_product_attention(qd, k, v, attn_mask=plan.dec_mask, scale=scale).reshape(B, H, hd)
        if plan.all_decodes:
            return o
        out[plan.dec_rows] = o
    for row, B, n, slots in plan.prompts:   # whole prompts of one length: one causal call over all of them
        k = k_flat.index_select(0, slots).view(B, n, hkv, hd).transpose(1, 2)   # [B, Hkv, n, hd]
        v = v_flat.index_select(0, slots).view(B, n, hkv, hd).transpose(1, 2)
        qc = q[row:row + B * n].view(B, n, -1, hd).transpose(1, 2)             # [B, H, n, hd]
        o = F.scaled_dot_product_attention(qc, k, v, is_causal=True, scale=scale, enable_gqa=True)
        out[row:row + B * n] = o.transpose(1, 2).reshape(B * n, -1, hd)
    for c, mask in plan.others:
        k = k_flat.index_select(0, c.slots).transpose(0, 1)[None]   # [1, Hkv, ctx, hd]
        v = v_flat.index_select(0, c.slots).transpose(0, 1)[None]
        qc = q[c.row:c.row + c.n].transpose(0, 1)[None]             # [1, H, n, hd]
        o = F.scaled_dot_product_attention(qc, k, v, attn_mask=mask, is_causal=mask is None, scale=scale,
                                           enable_gqa=True)
        out[c.row:c.row + c.n] = o[0].transpose(0, 1)
    return out


def contiguous_causal_attention(q, k, v, scale: float | None = None):
    """Reference without any cache: q [T, H, hd], k/v [T, Hkv, hd], causal."""
    o = F.scaled_dot_product_attention(q.transpose(0, 1)[None], k.transpose(0, 1)[None], v.transpose(0, 1)[None],
                                       is_causal=True, scale=scale, enable_gqa=True)
    return o[0].transpose(0, 1)
